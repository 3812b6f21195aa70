# What this shows: why compiled host functions exist. With the main thread busy in
# Python, a host function that needs the GIL waits for it (about one switch
# interval, 5 ms by default, each time); a compiled one does not.
#
# For each kind it enqueues 2 ms of device work and one host function behind it,
# spins in Python until the host function has run, and reports the median delay
# from the end of the device work (which writes a flag the spin watches: on a GPU
# shared with other processes the work can take longer than 2 ms) to the host
# function's start. Runs on a GPU, or on the simulator with NUMBA_HOSTFN_SIMULATOR=1.

import ctypes
import statistics
import sys
import time

import numpy as np
from numba import carray

import numba_hostfn as nh


@nh.host_callback
def count(p):
    carray(p, (1,), np.int64)[0] += 1


HOLD = 0.002  # seconds of device work in front of each host function


SPIN = r"""
extern "C" __global__ void spin_then_mark(unsigned long long ns, volatile long long *done)
{
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); } while (now - start < ns);
    *done += 1;
    __threadfence_system();
}
"""


def new_stream():
    """A stream, a flag in host memory, and a function that enqueues HOLD seconds of
    device work on the stream which then adds 1 to the flag."""
    if nh.backend_name() == "simulator":
        stream = nh.simulator.Stream()
        done = np.zeros(1, np.int64)

        def device_work():
            stream.sleep(HOLD)
            nh.host_launch(stream, count, user_data=nh.by_ref(done))  # compiled: no GIL

        return stream, done, device_work
    from cuda.core import (
        Device,
        LaunchConfig,
        LegacyPinnedMemoryResource,
        Program,
        ProgramOptions,
        launch,
    )

    device = Device()
    device.set_current()
    stream = device.create_stream()
    arch = "sm_" + "".join(str(v) for v in device.compute_capability)
    kernel = Program(SPIN, code_type="c++", options=ProgramOptions(arch=arch))
    kernel = kernel.compile("cubin").get_kernel("spin_then_mark")
    config = LaunchConfig(grid=1, block=1)
    buffer = LegacyPinnedMemoryResource().allocate(8)  # host memory the device can write
    done = np.ndarray((1,), np.int64, buffer=(ctypes.c_char * 8).from_address(int(buffer.handle)))
    done[0] = 0
    ns = np.uint64(int(HOLD * 1e9))

    def device_work():  # uses buffer: the allocation lives as long as this function
        launch(stream, config, kernel, ns, np.uint64(int(buffer.handle)))

    return stream, done, device_work


def delay_us(stream, done, device_work, launch, progress, repeats=20):
    """Median µs from the end of the device work to the host function's start, while
    the main thread spins in Python."""
    samples = []
    for _ in range(repeats):
        stream.sync()
        nh.drain()  # start settled
        before, marks = progress(), int(done[0])
        device_work()
        launch()  # becomes runnable only when the device work ends, during the spin
        while int(done[0]) == marks:  # busy in Python: holds the GIL between switches
            pass
        ended = time.perf_counter()  # the device work has just ended
        while progress() == before:
            pass
        samples.append((time.perf_counter() - ended) * 1e6)
    stream.sync()
    nh.drain()
    return statistics.median(samples)


def main() -> int:
    stream, done, device_work = new_stream()
    try:
        counter = np.zeros(1, np.int64)
        calls = [0]

        def python_callable():
            calls[0] += 1

        compiled = delay_us(
            stream,
            done,
            device_work,
            lambda: nh.host_launch(stream, count, user_data=nh.by_ref(counter)),
            lambda: int(counter[0]),
        )
        python = delay_us(
            stream,
            done,
            device_work,
            lambda: nh.host_launch(stream, python_callable),
            lambda: calls[0],
        )
        interval = sys.getswitchinterval() * 1e3
        print(f"main thread busy in Python, switch interval {interval:.0f} ms:")
        print(f"  compiled HostFunction starts {compiled:8.1f} µs after the device work")
        print(f"  Python callable starts       {python:8.1f} µs after the device work")
        ok = python > compiled and counter[0] == 20 and calls[0] == 20
        print("OK" if ok else "UNEXPECTED")
        return 0 if ok else 1
    finally:
        stream.sync()
        stream.close()


if __name__ == "__main__":
    sys.exit(main())
