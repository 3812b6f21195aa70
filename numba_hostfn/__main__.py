"""``python -m numba_hostfn``: a short demonstration, on the GPU or on the simulator.

It enqueues a compiled host function and a Python callable between two stages
of stream work, shows the order they ran in, then prints the per-callback cost
of both kinds with the main thread idle and with it busy in Python.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from numba import carray

from . import _process
from ._cuda import watchdog_requested
from ._process import SIMULATOR_ENV


def _choose_backend() -> str:
    requested = _process.simulator_requested()
    if not _process.simulator_unless_driver():
        watchdog_requested()  # read here: a value neither on nor off is a usage error too
        return "cuda"
    if requested:
        return f"simulator ({SIMULATOR_ENV}=1)"
    return f"simulator (no usable CUDA driver found, so {SIMULATOR_ENV}=1)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m numba_hostfn", description=__doc__)
    parser.add_argument("-n", type=int, default=40, help="repeats per idle measurement")
    args = parser.parse_args(argv)
    if args.n < 5:
        parser.error("-n must be at least 5")

    try:
        chosen = _choose_backend()
    except ValueError as e:  # a switch set to neither on nor off (env_switch)
        parser.exit(2, f"python -m numba_hostfn: error: {e}\n")
    import numba_hostfn as nh
    from numba_hostfn._demodevice import Device

    device = Device()
    where = f"GPU: {device.name}" if not device.simulator else "no GPU needed"
    print(f"numba_hostfn {nh.__version__} -- backend: {chosen} [{where}]")

    @nh.host_callback
    def record_stage(p):
        """cells -> [stage1, seen_by_compiled, seen_by_python, stage2]."""
        cells = carray(p, (4,), np.int32)
        cells[1] = cells[0] * 10 + cells[3]

    @nh.host_callback
    def count(p):
        carray(p, (1,), np.int64)[0] += 1

    stream = device.create_stream()
    try:
        # 1. Order: stage 1 -> compiled host fn -> Python callable -> stage 2.
        cells = device.host_array(4)
        device.store(stream, cells, 0, 1, delay=0.02)
        nh.host_launch(stream, record_stage, user_data=nh.by_ref(cells))
        nh.host_launch(stream, lambda: cells.__setitem__(2, cells[0] * 10 + cells[3]))
        device.store(stream, cells, 3, 2)
        stream.sync()
        ok = list(cells) == [1, 10, 10, 2]
        print(
            "\nStream order: stage 1 wrote 1; the host functions each saw 1 and no stage-2 "
            f"write (value 10); stage 2 wrote 2 -> cells {[int(c) for c in cells]}: "
            f"{'in order' if ok else 'OUT OF ORDER'}"
        )

        # 2. Cost per callback: 2 ms of device work, then one host function behind
        #    it; the main thread waits for it idle (in sync, GIL released) or busy
        #    (spinning in Python, GIL held between switch intervals).  Reported:
        #    the median time from the end of the device work until it had run.
        counter = np.zeros(1, np.int64)
        calls = [0]
        hold = 0.002

        def python_callable() -> None:
            calls[0] += 1

        def latency(kind: str, busy: bool, reps: int) -> float:
            if kind == "compiled":

                def progress() -> int:
                    return int(counter[0])

                def launch() -> None:
                    nh.host_launch(stream, count, user_data=nh.by_ref(counter))
            else:

                def progress() -> int:
                    return calls[0]

                def launch() -> None:
                    nh.host_launch(stream, python_callable)

            samples = []
            for _ in range(reps):
                stream.sync()
                nh.drain()  # start settled
                before = progress()
                start = time.perf_counter()
                device.delay(stream, hold)
                launch()  # runnable only once the device work ends
                if busy:
                    while progress() == before:  # Python bytecode: holds the GIL
                        pass
                else:
                    stream.sync()
                samples.append(time.perf_counter() - start - hold)
            stream.sync()
            nh.drain()
            return max(float(np.median(samples)), 0.0) * 1e6

        latency("compiled", False, 10)  # warm up both paths
        latency("python", False, 10)
        rows = [
            (label, latency(kind, False, args.n), latency(kind, True, min(args.n, 40)))
            for kind, label in (
                ("compiled", "compiled HostFunction (no GIL)"),
                ("python", "Python callable (takes the GIL)"),
            )
        ]
        print(
            "\nPer callback, end of device work until it has run, median microseconds "
            f"(switch interval {sys.getswitchinterval() * 1e3:.0f} ms):"
        )
        print(f"| {'host function':<32} | {'main thread idle':>17} | {'main thread busy':>17} |")
        print(f"| {'-' * 32} | {'-' * 17}:| {'-' * 17}:|")
        for label, idle, busy in rows:
            print(f"| {label:<32} | {idle:17.1f} | {busy:17.1f} |")
        print(
            "\nIdle: the main thread waits in stream.sync(), without the GIL. Busy: it spins "
            "in\nPython; a Python callable then waits for the GIL, about one switch "
            "interval, and\na compiled host function does not."
        )
        return 0 if ok else 1
    finally:
        stream.sync()
        device.close_stream(stream)
        nh.drain()
        device.close()


if __name__ == "__main__":
    sys.exit(main())
