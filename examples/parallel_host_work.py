# What this shows: host work of several streams in parallel, in stream order, on a
# HostExecutor. Four streams each run 20 steps of "device work, then 2 ms of
# compiled host work on its result". On the driver's one host-function thread the
# four streams' host work runs one step at a time (about 4 x 20 x 2 ms); on a
# 4-thread HostExecutor the streams' steps run side by side (about 20 x 2 ms), and
# each step still runs exactly between the device work before and after it.
#
# Runs on a GPU, or on the simulator with NUMBA_HOSTFN_SIMULATOR=1 (which models the
# driver's one host-function thread and the executor's stream memory operations).

import ctypes
import sys
import time

import numpy as np
from numba import carray

import numba_hostfn as nh

STREAMS, STEPS, WORK_NS = 4, 20, 2_000_000
STEP = np.dtype([("log", np.uint64), ("step", np.int64)])


_clock_gettime = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_void_p)(
    ("clock_gettime", ctypes.CDLL(None))
)


@nh.host_callback(dtype=STEP)
def host_step(d):
    """2 ms of host work (a busy loop standing in for real work), then log the step."""
    ts = np.zeros(2, np.int64)
    _clock_gettime(1, ts.ctypes.data)  # CLOCK_MONOTONIC
    start = now = ts[0] * 1_000_000_000 + ts[1]
    while now - start < WORK_NS:
        _clock_gettime(1, ts.ctypes.data)
        now = ts[0] * 1_000_000_000 + ts[1]
    log = carray(nh.as_voidptr(d.log), (STEPS + 1,), np.int64)
    log[1 + log[0]] = d.step
    log[0] += 1


def run(streams, executor, device_work) -> tuple[float, list]:
    logs = [np.zeros(STEPS + 1, np.int64) for _ in streams]
    start = time.perf_counter()
    for step in range(STEPS):
        for stream, log in zip(streams, logs, strict=True):
            device_work(stream)
            data = np.array([(log.ctypes.data, step)], STEP)
            nh.host_launch(stream, host_step, user_data=data, executor=executor)
    for stream in streams:
        stream.sync()
    return time.perf_counter() - start, logs


SPIN = r"""
extern "C" __global__ void spin(unsigned long long ns)
{
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); } while (now - start < ns);
}
"""


def new_streams():
    """The streams, and a function that enqueues 0.1 ms of device work on one."""
    if nh.backend_name() == "simulator":
        return [nh.simulator.Stream() for _ in range(STREAMS)], lambda s: s.sleep(0.0001)
    from cuda.core import Device, LaunchConfig, Program, ProgramOptions, launch

    device = Device()
    device.set_current()
    arch = "sm_" + "".join(str(v) for v in device.compute_capability)
    kernel = Program(SPIN, code_type="c++", options=ProgramOptions(arch=arch))
    kernel = kernel.compile("cubin").get_kernel("spin")
    config = LaunchConfig(grid=1, block=1)
    streams = [device.create_stream() for _ in range(STREAMS)]
    return streams, lambda s: launch(s, config, kernel, np.uint64(100_000))


def main() -> int:
    streams, device_work = new_streams()
    try:
        run(streams, None, device_work)  # compile and warm up
        serial, logs_serial = run(streams, None, device_work)
        with nh.HostExecutor(threads=STREAMS) as executor:
            parallel, logs_parallel = run(streams, executor, device_work)
    finally:
        for stream in streams:
            stream.sync()
            stream.close()
    in_order = all(log.tolist() == [STEPS, *range(STEPS)] for log in logs_serial + logs_parallel)
    print(f"driver's host-function thread: {serial * 1e3:.0f} ms")
    print(f"HostExecutor(threads={STREAMS}):    {parallel * 1e3:.0f} ms")
    print(f"every stream's steps ran in order: {in_order}")
    print("OK" if in_order else "WRONG")
    return 0 if in_order else 1


if __name__ == "__main__":
    sys.exit(main())
