"""Section dispatch: the delay from the end of device work to the start of a host function.

Device work ends (a kernel spinning on a host-written flag is released at a host
clock time) -> the host function starts (its own clock read), with the main thread
idle, busy in a Python loop, or holding the GIL in a long C call; HostFunction vs
Python callable vs CuPy (these conditions interleaved, 25 rounds); and Python
callables busy over sys.setswitchinterval values.  Ratios are to the HostFunction
with the main thread idle.
"""

from __future__ import annotations

import ctypes
import sys
import time

import numpy as np
from _bench import (
    Gate,
    Row,
    Target,
    compiled_functions,
    cupy_stream,
    find,
    interleaved,
    ratio,
    record,
    target,
)

GROUP = "dispatch"
PLOTS = [(GROUP, "dispatch.png")]


EXECUTOR = "HostFunction on a HostExecutor"


def run(nh, device, repeats: int, window: float) -> None:
    _, stamp = compiled_functions(nh)
    stream = device.create_stream()
    gate = Gate(device)
    # A spin budget longer than the 2 ms each sample waits at the gate: the pool's
    # threads spin throughout (the lowest latency; a core busy meanwhile).
    executor = nh.HostExecutor(threads=1, spin_us=10_000)
    hold_gil = ctypes.PyDLL(None).usleep

    def sample(kind: str, main: str) -> float:
        stamps = np.zeros(3, np.int64)
        seen = []
        gate.close_on(stream)
        t0 = None
        try:
            if kind == "HostFunction":
                nh.host_launch(stream, stamp, user_data=nh.by_ref(stamps))
            elif kind == EXECUTOR:
                nh.host_launch(stream, stamp, user_data=nh.by_ref(stamps), executor=executor)
            elif kind == "Python callable":
                nh.host_launch(stream, lambda: seen.append(time.monotonic_ns()))
            else:  # CuPy
                cs = cupy_stream(stream)
                cs.launch_host_func(lambda _: seen.append(time.monotonic_ns()), None)
            time.sleep(0.002)  # the stream waits at the gate; the driver's thread parks
            t0 = gate.open()
            if main == "busy in Python":
                end = time.perf_counter() + window
                while time.perf_counter() < end:
                    pass
            elif main == "holding the GIL":
                hold_gil(int(window * 1e6))
        finally:  # a failing row must not leave the stream held
            if t0 is None:
                gate.open()
            stream.sync()
            nh.drain()
        t1 = int(stamps[0]) if kind in ("HostFunction", EXECUTOR) else seen[0]
        return (t1 - t0) / 1e3

    # The driver thread's wake-up time drifts over seconds: the conditions are
    # interleaved, one sample of each per round, so that drift hits them alike.
    kinds = ["HostFunction", EXECUTOR, "Python callable"] + ([] if device.simulator else ["CuPy"])
    rows = [
        Row(f"dispatch ({main})", kind, "µs")
        for main in ("idle", "busy in Python", "holding the GIL")
        for kind in kinds
    ]
    interleaved(
        GROUP, rows, lambda row: sample(row.name, row.group[len("dispatch (") : -1]), repeats
    )
    old = sys.getswitchinterval()
    try:
        for interval in (0.001, 0.005, 0.02):
            sys.setswitchinterval(interval)
            record(
                "dispatch vs switch interval (busy in Python)",
                f"Python callable, {interval * 1e3:g} ms",
                "µs",
                lambda: sample("Python callable", "busy in Python"),
                repeats,
            )
            record(
                "dispatch vs switch interval (busy in Python)",
                f"HostFunction, {interval * 1e3:g} ms",
                "µs",
                lambda: sample("HostFunction", "busy in Python"),
                repeats,
            )
    finally:
        sys.setswitchinterval(old)
    executor.close()
    stream.close()


def baseline(group: str) -> Row | None:
    return find("dispatch (idle)", "HostFunction") if group.startswith("dispatch (") else None


def targets() -> list[Target]:
    idle = find("dispatch (idle)", "HostFunction")
    executor_idle = find("dispatch (idle)", EXECUTOR)
    return [
        target(
            "HostExecutor dispatch, main idle: median <= 10 µs",
            executor_idle.median if executor_idle else None,
            10.0,
            "{:.1f} µs",
        ),
        target(
            "HostFunction dispatch, main busy in Python <= 1.2x idle",
            ratio(find("dispatch (busy in Python)", "HostFunction"), idle),
            1.2,
        ),
        target(
            "HostFunction dispatch, main holding the GIL <= 1.2x idle",
            ratio(find("dispatch (holding the GIL)", "HostFunction"), idle),
            1.2,
        ),
    ]
