"""How much work can be enqueued behind work that has not finished, before the
enqueuing thread blocks in the driver?  A GPU probe (it runs on the simulator too,
where nothing blocks).

For each kind of hold and each kind of work, a fresh stream is held (by a compiled
host function, or a kernel, spinning on a flag in host memory); a thread enqueues up
to N items of that work behind it and counts; once all N are in, or after --wait
seconds, the main thread reads the count, releases the hold, and joins.  "blocked
at K" means the K+1-th enqueue had not returned by then.

    python benchmarks/queue_depth.py [--n 30000] [--wait 2]

Seen on an H200 (driver 580.159.04, 2026-12-02), behind a held host function and
behind a held kernel alike: 30,000 compiled host functions, and 30,000 done_future
waits (the default lane holds at most ``_executor.DEFAULT_LANE_DEPTH`` = 64 of them),
enqueued with no block; executor tasks and kernels each blocked at 1,021; rounds of
3 host functions + 1 executor task blocked at 56 rounds (55 behind the kernel).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

from _device import Device, Hold  # noqa: E402

import numba_hostfn as nh  # noqa: E402

_SPIN = r"""
extern "C" __global__ void spin_until_set(const volatile int *flag)
{
    while (*flag == 0) {
    }
}
"""


class KernelHold:
    """A kernel that spins until the host sets a flag (CUDA; a Hold on the simulator)."""

    kernel = None

    def __init__(self, device, stream):
        if device.simulator:
            self._hold = Hold(stream)
            return
        from cuda.core import LaunchConfig, Program, ProgramOptions, launch

        if KernelHold.kernel is None:
            arch = "sm_" + "".join(str(x) for x in device.cuda.compute_capability)
            program = Program(_SPIN, code_type="c++", options=ProgramOptions(arch=arch))
            KernelHold.kernel = program.compile("cubin").get_kernel("spin_until_set")
        self._flag = device.host_array(1, np.int32)
        config = LaunchConfig(grid=1, block=1)
        launch(stream, config, KernelHold.kernel, np.uint64(self._flag.ctypes.data))

    def release(self):
        if hasattr(self, "_hold"):
            self._hold.release()
        else:
            self._flag[0] = 1


def probe(hold_name, hold_kind, name, device, enqueue, n, wait):
    stream = device.create_stream()
    enqueue(stream)  # modules loaded, lanes made: not what is measured
    stream.sync()
    nh.drain()
    hold = hold_kind(device, stream)
    count = [0]

    def work():
        for _ in range(n):
            enqueue(stream)
            count[0] += 1

    t = threading.Thread(target=work, daemon=True)
    start = time.perf_counter()
    t.start()
    # Until all are in or --wait has passed: a thread that blocks stays where it is,
    # and one that is merely slow (a loaded machine, a sanitizer build) is not called
    # blocked at the count it had reached after a fixed sleep.
    while count[0] < n and time.perf_counter() < start + wait:
        time.sleep(0.005)
    seen = count[0]
    hold.release()
    t.join(60)
    stream.sync()
    total = time.perf_counter() - start
    what = "all enqueued" if seen >= n else f"blocked at {seen}"
    print(
        f"behind a {hold_name:14s} {name:36s} {what:18s} (done {count[0]} in {total:.2f} s)",
        flush=True,
    )
    nh.drain()
    device.close_stream(stream)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=30000)
    p.add_argument("--wait", type=float, default=2.0)
    a = p.parse_args()
    device = Device()
    noop = nh.host_callback(lambda p: None)
    ex = nh.HostExecutor(threads=1)
    futures = []

    def host_function(stream):
        nh.host_launch(stream, noop)

    def executor_task(stream):
        nh.host_launch(stream, noop, executor=ex)

    def done_future(stream):
        futures.append(nh.done_future(stream))

    def kernel(stream):
        device.delay(stream, 0.0)

    def mixed(stream):  # tests/test_device_faults.py's exit script, before it was grouped
        host_function(stream)
        host_function(stream)
        host_function(stream)
        executor_task(stream)

    works = [
        ("compiled host function", host_function),
        ("executor task (one batch of 2 ops)", executor_task),
        ("done_future (default route)", done_future),
        ("kernel (module loaded)", kernel),
        ("3 host functions + 1 executor task", mixed),
    ]
    for hold_name, hold_kind in [("host function", lambda d, s: Hold(s)), ("kernel", KernelHold)]:
        for name, fn in works:
            probe(hold_name, hold_kind, name, device, fn, a.n, a.wait)
            futures.clear()
    ex.close()
    device.close()


if __name__ == "__main__":
    main()
