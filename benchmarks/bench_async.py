"""Section asyncio: signalling Python from a stream, with and without the GIL.

- await latency: device work ends (the Gate is opened at a host clock time) ->
  the awaiting coroutine runs again, with the loop idle and with the loop busy
  (100 coroutines doing CPU work in 20 µs or 200 µs slices), for ``nh.async_done``
  with no argument (a GIL-free eventfd write from the package's default lane, a
  parked HostExecutor thread), the same on the driver's thread (the lane's
  fallback), ``asyncio.to_thread(stream.sync)`` (a thread per wait), the same
  with ``executor=`` (an executor of the program's own), a Python host callback
  that calls ``loop.call_soon_threadsafe`` (the GIL on the driver's thread) and
  numba-cuda's ``Stream.async_done`` (its error, where it fails).  Conditions
  interleaved, one sample each per round.
- done_future resolve: device work ends -> ``done_future(stream).result()``
  returns on the waiting thread, with no argument, with ``executor=``, and on the
  driver's thread, against a thread that calls ``stream.sync()`` then sets a
  ``concurrent.futures.Future`` (what a program writes without this package);
  and from the same samples, device work ends -> the resolving thread has set the
  result (a done-callback it runs right after, so that part is if anything
  overstated), which leaves out the waiting thread's wake-up.
- the default lane's CPU time: process CPU seconds per wall second over 1 s once
  its waits have resolved (its thread parked), and with one ``done_future``
  outstanding on a held stream (its thread polls), against a thread blocked in
  ``stream.sync()`` on that stream instead.
- 10k waits: 10,000 ``async_done`` on one stream, all resolved; per wait, and
  the descriptors and threads the process gained.
- non-blocking callback delay: device work ends -> the callable runs, with the
  main thread idle in ``sync()``, busy in Python, or holding the GIL in a C call;
  ``host_launch(..., blocking=False)`` against a blocking Python callable and
  CuPy's ``launch_host_func``.
- other streams while the main thread holds the GIL: a HostFunction's dispatch
  delay on a second stream, with 3,000 non-blocking callbacks queued on the first.
Ratios are to ``async_done`` (await groups), ``done_future`` (its group), and to
the blocking Python callable (callback groups).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import os
import sys
import threading
import time

import numpy as np
from _bench import (
    ROWS,
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

GROUP = "asyncio"
PLOTS = [("await", "asyncio.png"), ("callback", "asyncio_callbacks.png")]
# 100 coroutines doing CPU work in slices: 20 µs slices make a loop turn (~3 ms)
# shorter than the 5 ms switch interval, 200 µs slices (~20 ms) longer.
WORKERS, SLICE_S, SLICE_LONG_S = 100, 20e-6, 200e-6
TIMEOUT_S = 1.0
QUEUED = 3000


def _numba_cuda_stream(stream):
    from numba import cuda

    return cuda.external_stream(int(stream.handle))


def run(nh, device, repeats: int, waits: int) -> None:
    stream = device.create_stream()
    gate = Gate(device)
    _await_latency(nh, device, stream, gate, repeats)
    _future_latency(nh, stream, gate, repeats)
    _lane_cpu_time(nh, stream, gate)
    _many_waits(nh, stream, gate, waits)
    _callback_delay(nh, device, stream, gate, repeats)
    _other_streams(nh, device, stream, gate, repeats)
    stream.close()


def _settle(future: asyncio.Future) -> None:
    """Set a host callback's result, unless the wait has timed out (cancelled it)."""
    if not future.done():
        future.set_result(None)


def _interleaved(rows: list[Row], sample, repeats: int) -> None:
    interleaved(GROUP, rows, sample, repeats)


DRIVER = "driver's thread (no default lane)"


@contextlib.contextmanager
def _driver_thread(nh):
    """Signals enqueued inside take the driver's thread, as before the default lane
    (its fallback): the lane off for the call, as at exit."""
    lanes = nh._executor
    was = lanes._default_off
    lanes._default_off = True
    try:
        yield
    finally:
        lanes._default_off = was


def _await_latency(nh, device, stream, gate, repeats: int) -> None:
    kinds = [
        "async_done",
        f"async_done, {DRIVER}",
        "async_done(executor=)",
        "to_thread(stream.sync)",
        "Python callback + call_soon_threadsafe",
    ]
    executor = nh.HostExecutor(threads=1)
    if not device.simulator:
        kinds.append("numba-cuda Stream.async_done")
    loops = (
        "idle",
        f"busy, {SLICE_S * 1e6:g} µs slices",
        f"busy, {SLICE_LONG_S * 1e6:g} µs slices",
    )
    rows = [Row(f"await (loop {loop})", k, "µs") for loop in loops for k in kinds]

    async def one(kind: str, loop_state: str) -> float:
        busy = "busy" in loop_state
        slice_s = SLICE_S if f" {SLICE_S * 1e6:g} µs" in loop_state else SLICE_LONG_S
        loop = asyncio.get_running_loop()
        stop = False

        async def worker():
            while not stop:
                end = time.perf_counter() + slice_s
                while time.perf_counter() < end:
                    pass
                await asyncio.sleep(0)

        workers = [asyncio.ensure_future(worker()) for _ in range(WORKERS if busy else 0)]
        gate.close_on(stream)
        t0 = None
        try:
            if kind == "async_done":
                waiter = nh.async_done(stream)
            elif kind.endswith(DRIVER):
                with _driver_thread(nh):
                    waiter = nh.async_done(stream)
            elif kind == "async_done(executor=)":
                waiter = nh.async_done(stream, executor=executor)
            elif kind.startswith("to_thread"):
                waiter = asyncio.ensure_future(asyncio.to_thread(stream.sync))
            elif kind.startswith("Python callback"):
                waiter = loop.create_future()
                nh.host_launch(stream, lambda: loop.call_soon_threadsafe(_settle, waiter))
            else:
                waiter = _numba_cuda_stream(stream).async_done()
            await asyncio.sleep(0.002)  # the waiters park
            t0 = gate.open()
            # numba-cuda 0.30.4's future never resolves: its callback fails on the
            # driver's thread (CUstream has no .value); the timeout is its row's note
            try:
                await asyncio.wait_for(waiter, TIMEOUT_S)
                t1 = time.monotonic_ns()
            except asyncio.TimeoutError:  # TimeoutError from 3.11
                if kind.startswith("numba-cuda"):
                    raise RuntimeError(f"its future never resolved ({TIMEOUT_S:g} s)") from None
                t1 = t0 + int(TIMEOUT_S * 1e9)  # starved: counted as the timeout, a lower bound
                starved[kind, loop_state] = starved.get((kind, loop_state), 0) + 1
        finally:
            if t0 is None:
                gate.open()
            stop = True
            await asyncio.gather(*workers)
            stream.sync()
            nh.drain()
        return (t1 - t0) / 1e3

    starved: dict = {}
    with executor:
        _interleaved(rows, lambda row: asyncio.run(one(row.name, row.group)), repeats)
    for row in rows:
        n = starved.get((row.name, row.group))
        if n:
            row.note = f"{n} of {len(row.samples)} starved past {TIMEOUT_S:g} s, counted as that"


FUTURE_GROUP = "done_future resolve (waiting thread idle)"
#: The same samples, up to the moment the resolving thread has set the result (a
#: done-callback it runs right after): what is left of the whole is the waiting
#: thread's wake-up, which no way of resolving changes.
FUTURE_SET_GROUP = "done_future, device end to the result set (waiting thread idle)"
SYNC_THREAD = "a thread: stream.sync(), then Future.set_result"


def _future_latency(nh, stream, gate, repeats: int) -> None:
    kinds = ["done_future", f"done_future, {DRIVER}", "done_future(executor=)", SYNC_THREAD]
    rows = [Row(FUTURE_GROUP, k, "µs") for k in kinds]
    set_rows = {k: Row(FUTURE_SET_GROUP, k, "µs") for k in kinds}
    executor = nh.HostExecutor(threads=1)

    def sync_then_set(future: concurrent.futures.Future) -> None:
        stream.sync()
        future.set_result(stream)

    def sample(row: Row) -> float:
        gate.close_on(stream)
        t0 = None
        thread = None
        set_at: list[int] = []
        was_set = threading.Event()

        def on_set(_: concurrent.futures.Future) -> None:  # on the resolving thread
            set_at.append(time.monotonic_ns())
            was_set.set()

        try:
            if row.name == "done_future":
                future = nh.done_future(stream)
            elif row.name.endswith(DRIVER):
                with _driver_thread(nh):
                    future = nh.done_future(stream)
            elif row.name.endswith("(executor=)"):
                future = nh.done_future(stream, executor=executor)
            else:
                future = concurrent.futures.Future()
                thread = threading.Thread(target=sync_then_set, args=(future,))
                thread.start()
            future.add_done_callback(on_set)
            time.sleep(0.002)  # the waiters park
            t0 = gate.open()
            future.result(timeout=TIMEOUT_S * 10)
            t1 = time.monotonic_ns()
        finally:
            if t0 is None:
                gate.open()
            if thread is not None:
                thread.join()
            stream.sync()
            nh.drain()
        # The resolving thread runs its done-callbacks after it has woken the waiter:
        # wait for this one (the part up to the set is, if anything, overstated).
        if not was_set.wait(TIMEOUT_S):
            raise RuntimeError("the future's done-callback did not run")
        set_rows[row.name].samples.append((set_at[0] - t0) / 1e3)
        return (t1 - t0) / 1e3

    with executor:
        _interleaved(rows, sample, repeats)
    for row in rows:  # a kind that failed failed in both groups
        if row.note:
            set_rows[row.name].samples.clear()
            set_rows[row.name].note = row.note
    ROWS.extend(set_rows.values())


LANE_CPU_GROUP = "default lane: process CPU time"


def _lane_cpu_time(nh, stream, gate) -> None:
    """The process's CPU time over 1 s: with the default lane idle (its waits
    resolved, parked), and with one wait outstanding on a stream held by the gate,
    past the lane's spin (it polls), against a thread blocked in ``stream.sync()``
    on that stream (what the await's baseline costs meanwhile)."""

    def cpu_over(seconds: float) -> float:
        c0, w0 = time.process_time(), time.perf_counter()
        time.sleep(seconds)
        return (time.process_time() - c0) / (time.perf_counter() - w0)

    def idle() -> float:
        nh.done_future(stream).result(timeout=TIMEOUT_S * 10)  # the lane exists, idle
        time.sleep(0.05)  # past the spin budget of its last task
        return cpu_over(1.0)

    def waiting(kind: str) -> float:
        gate.close_on(stream)
        thread = future = None
        try:
            if kind == "lane":
                future = nh.done_future(stream)
            else:
                thread = threading.Thread(target=stream.sync)
                thread.start()
            time.sleep(0.05)  # past the lane's spin: it polls
            return cpu_over(1.0)
        finally:
            gate.open()
            if thread is not None:
                thread.join()
            if future is not None:
                future.result(timeout=TIMEOUT_S * 10)
            stream.sync()

    record(LANE_CPU_GROUP, "idle (its waits resolved): parked", "CPU s/s", idle, 1)
    record(
        LANE_CPU_GROUP,
        "one done_future outstanding: the lane polls",
        "CPU s/s",
        lambda: waiting("lane"),
        1,
    )
    record(
        LANE_CPU_GROUP,
        "a thread in stream.sync() on the same stream instead",
        "CPU s/s",
        lambda: waiting("sync"),
        1,
    )


def _threads() -> int:
    """The process's threads, native ones included (the default lane's and a pool's
    are native: threading.active_count() counts only Python's own)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:  # no /proc: Python's threads only
        return threading.active_count()


def _many_waits(nh, stream, gate, waits: int) -> None:
    result = {}

    async def many() -> None:
        await nh.async_done(stream)  # the loop's descriptor exists before counting
        fds, threads = len(os.listdir("/proc/self/fd")), _threads()
        gate.close_on(stream)
        try:
            futures = [nh.async_done(stream) for _ in range(waits)]
            result["fds"] = len(os.listdir("/proc/self/fd")) - fds
            result["threads"] = _threads() - threads
            t0 = gate.open()
            await asyncio.gather(*futures)
            result["us"] = (time.monotonic_ns() - t0) / 1e3 / waits
        finally:
            gate.open()

    print(f"[{GROUP}] {waits} waits ...", file=sys.stderr, flush=True)
    name = "async_done, per wait (stream done -> all resumed)"
    row = Row(f"{waits} concurrent waits", name, "µs")
    try:
        asyncio.run(many())
        row.samples.append(result["us"])
        row.note = f"{result['fds']} descriptors and {result['threads']} threads added"
    except Exception as exc:
        row.fail(exc)
    stream.sync()
    nh.drain()
    ROWS.append(row)
    if "fds" in result:
        group = f"{waits} concurrent waits"
        ROWS.append(Row(group, "descriptors added", "count", [result["fds"]]))
        ROWS.append(Row(group, "threads added", "count", [result["threads"]]))


def _callback_delay(nh, device, stream, gate, repeats: int) -> None:
    kinds = ["Python callable, blocking=False", "Python callable (blocking)"]
    if not device.simulator:
        kinds.append("CuPy launch_host_func")
    mains = ("idle in sync()", "busy in Python", "holding the GIL")
    rows = [Row(f"callback ({main})", k, "µs") for main in mains for k in kinds]
    hold_gil = ctypes.PyDLL(None).usleep
    window = 0.02

    def sample(row: Row) -> float:
        seen = []
        gate.close_on(stream)
        t0 = None
        try:
            if row.name.endswith("blocking=False"):
                nh.host_launch(stream, lambda: seen.append(time.monotonic_ns()), blocking=False)
            elif row.name.startswith("Python"):
                nh.host_launch(stream, lambda: seen.append(time.monotonic_ns()))
            else:
                cupy_stream(stream).launch_host_func(
                    lambda _: seen.append(time.monotonic_ns()), None
                )
            time.sleep(0.002)
            t0 = gate.open()
            if "busy" in row.group:
                end = time.perf_counter() + window
                while time.perf_counter() < end and not seen:
                    pass
            elif "holding" in row.group:
                hold_gil(int(window * 1e6))
            stream.sync()
            deadline = time.perf_counter() + 5
            while not seen and time.perf_counter() < deadline:
                time.sleep(0.0001)
        finally:
            if t0 is None:
                gate.open()
            stream.sync()
            nh.drain()
        return (seen[0] - t0) / 1e3

    _interleaved(rows, sample, repeats)


def _other_streams(nh, device, stream, gate, repeats: int) -> None:
    _, stamp = compiled_functions(nh)
    other = device.create_stream()
    hold_gil = ctypes.PyDLL(None).usleep
    other_gate = Gate(device)
    calls = []

    def sample(row: Row) -> float:
        stamps = np.zeros(3, np.int64)
        t0 = None
        other_gate.close_on(other)
        try:
            nh.host_launch(other, stamp, user_data=nh.by_ref(stamps))
            gate.close_on(stream)
            try:
                for _ in range(QUEUED):
                    nh.host_launch(stream, lambda: calls.append(1), blocking=False)
                time.sleep(0.002)
            finally:  # a failing row must leave neither stream held
                gate.open()
            t0 = other_gate.open()
            hold_gil(100_000)  # the main thread holds the GIL for 100 ms
        finally:
            if t0 is None:
                other_gate.open()
            other.sync()
            stream.sync()
            nh.drain()
        return (int(stamps[0]) - t0) / 1e3

    rows = [
        Row(
            "callback (holding the GIL)",
            f"HostFunction on another stream, {QUEUED} non-blocking callbacks queued",
            "µs",
        )
    ]
    _interleaved(rows, sample, repeats)
    other.close()


def baseline(group: str) -> Row | None:
    if group.startswith("await ("):
        return find(group, "async_done")
    if group in (FUTURE_GROUP, FUTURE_SET_GROUP):
        return find(group, "done_future")
    if group.startswith("callback ("):
        return find(group, "Python callable (blocking)")
    return None


def _worst(group: str, name: str) -> float | None:
    row = find(group, name)
    return max(row.samples) if row and row.samples else None


def targets() -> list[Target]:
    lines = [
        target(
            "async_done, no argument, loop idle <= 0.5x to_thread(stream.sync): median",
            ratio(
                find("await (loop idle)", "async_done"),
                find("await (loop idle)", "to_thread(stream.sync)"),
            ),
            0.5,
        ),
        target(
            "done_future resolve, no argument, idle <= 0.5x a thread calling stream.sync() "
            "then setting a future: median",
            ratio(find(FUTURE_GROUP, "done_future"), find(FUTURE_GROUP, SYNC_THREAD)),
            0.5,
        ),
    ]
    busy = [g for g in dict.fromkeys(r.group for r in ROWS) if g.startswith("await (loop busy")]
    for group in busy:
        ours, theirs = "async_done", "to_thread(stream.sync)"
        worst = (_worst(group, ours), _worst(group, theirs))
        lines += [
            target(
                f"async_done <= 0.5x to_thread(stream.sync), {group[7:-1]}: median",
                ratio(find(group, ours), find(group, theirs)),
                0.5,
            ),
            target(
                # its own text: ab.py keys targets by text, and two equal lines merged
                f"async_done <= 0.5x to_thread(stream.sync), {group[7:-1]}: worst wait "
                f"(a starved wait counts as {TIMEOUT_S:g} s)",
                worst[0] / worst[1] if worst[0] and worst[1] else None,
                0.5,
            ),
        ]
    return lines + _other_targets()


def _other_targets() -> list[Target]:
    rows = [r for r in ROWS if r.group.endswith("concurrent waits")]
    fds = next((r for r in rows if r.name == "descriptors added"), None)
    threads = next((r for r in rows if r.name == "threads added"), None)
    queued = find(
        "callback (holding the GIL)",
        f"HostFunction on another stream, {QUEUED} non-blocking callbacks queued",
    )
    return [
        target(
            "10k waits: descriptors added <= 1",
            fds.median if fds else None,
            1,
            "{:.0f}",
        ),
        target(
            "10k waits: threads added == 0",
            threads.median if threads else None,
            0,
            "{:.0f}",
        ),
        target(
            "non-blocking callback, main busy in Python <= 0.1x CuPy launch_host_func",
            ratio(
                find("callback (busy in Python)", "Python callable, blocking=False"),
                find("callback (busy in Python)", "CuPy launch_host_func"),
            ),
            0.1,
        ),
        target(
            f"HostFunction on another stream while the GIL is held ({QUEUED} callbacks "
            "queued) runs within the 100 ms hold",
            queued.median if queued else None,
            100_000.0,
            "{:.0f} µs",
        ),
    ]
