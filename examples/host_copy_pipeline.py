# What this shows: a stream-ordered host pipeline with no synchronize in between.
#
#   kernel 1 (device)  ->  device-to-host copy into pinned staging
#   ->  host_copy: pinned staging -> pageable numpy array   (compiled, no GIL)
#   ->  compiled host function: reduce the array             (compiled, no GIL)
#   ->  kernel 2 (device), which runs only after the reduction
#
# The host checks the results once, at the end. On a GPU the device steps are
# cuda.core kernels and copies. Without one, run it with NUMBA_HOSTFN_SIMULATOR=1:
# the device steps are then the simulator's stand-ins for device work.

import ctypes
import sys

import numpy as np
from numba import carray

N = 1 << 20  # float32 values

REDUCE = np.dtype([("data", np.uint64), ("n", np.int64), ("out", np.uint64)])

KERNELS = r"""
extern "C" __global__ void produce(float *x, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = (float)(i % 1000);
}
extern "C" __global__ void mark(int *flag, int value) { *(volatile int *)flag = value; }
"""


def main() -> int:
    import numba_hostfn as nh

    @nh.host_callback(dtype=REDUCE)
    def reduce_sum(d):
        x = carray(nh.as_voidptr(d.data), (d.n,), np.float32)
        total = 0.0
        for i in range(d.n):
            total += x[i]
        carray(nh.as_voidptr(d.out), (1,), np.float64)[0] = total

    pageable = np.zeros(N, np.float32)  # ordinary numpy memory
    total = np.zeros(1, np.float64)
    expected = float(np.sum(np.arange(N) % 1000, dtype=np.float64))
    reduce_args = np.array([(pageable.ctypes.data, N, total.ctypes.data)], REDUCE)

    if nh.backend_name() == "simulator":
        stream, staging, flag, second_kernel, cleanup = _simulated_device_stages(nh)
    else:
        stream, staging, flag, second_kernel, cleanup = _gpu_device_stages(nh)
    try:
        # Everything from kernel 1 to kernel 2 is enqueued; nothing waits until sync().
        nh.host_copy(stream, pageable, staging)
        nh.host_launch(stream, reduce_sum, user_data=reduce_args)
        second_kernel()
        stream.sync()
        ok = total[0] == expected and flag[0] == 1
        print(
            f"backend: {nh.backend_name()}; sum {total[0]:.0f} (expected {expected:.0f}); "
            f"kernel 2 ran: {bool(flag[0])} -> {'OK' if ok else 'WRONG'}"
        )
        return 0 if ok else 1
    finally:
        cleanup()


def _gpu_device_stages(nh):
    """Kernel 1 fills device memory; a device-to-host copy lands in pinned staging."""
    from cuda.core import (
        Device,
        LaunchConfig,
        LegacyPinnedMemoryResource,
        Program,
        ProgramOptions,
        launch,
    )

    dev = Device()
    dev.set_current()
    stream = dev.create_stream()
    arch = "sm_" + "".join(str(v) for v in dev.compute_capability)
    module = Program(KERNELS, code_type="c++", options=ProgramOptions(arch=arch)).compile("cubin")
    nbytes = N * 4
    on_device = dev.allocate(nbytes, stream=stream)
    staging = LegacyPinnedMemoryResource().allocate(nbytes)
    flag_buf = LegacyPinnedMemoryResource().allocate(4)
    flag = np.frombuffer((ctypes.c_char * 4).from_address(int(flag_buf.handle)), np.int32)
    flag[0] = 0
    launch(
        stream,
        LaunchConfig(grid=(N + 255) // 256, block=256),
        module.get_kernel("produce"),
        on_device,
        np.int32(N),
    )
    on_device.copy_to(staging, stream=stream)  # device -> pinned staging

    def second_kernel():
        launch(
            stream,
            LaunchConfig(grid=1, block=1),
            module.get_kernel("mark"),
            np.uint64(flag.ctypes.data),
            np.int32(1),
        )

    def cleanup():
        stream.sync()
        for buf in (on_device, staging, flag_buf):
            buf.close()
        stream.close()

    return stream, staging, flag, second_kernel, cleanup


def _simulated_device_stages(nh):
    """Simulated kernel 1 writes the staging buffer directly (there is no device)."""

    @nh.host_callback
    def produce(p):
        x = carray(p, (N,), np.float32)
        for i in range(N):
            x[i] = i % 1000

    @nh.host_callback
    def mark(p):
        carray(p, (1,), np.int32)[0] = 1

    stream = nh.simulator.Stream()
    staging = np.zeros(N, np.float32)
    flag = np.zeros(1, np.int32)
    stream.sleep(0.01)
    stream.launch(produce, user_data=nh.by_ref(staging))

    def second_kernel():
        stream.launch(mark, user_data=nh.by_ref(flag))

    return stream, staging, flag, second_kernel, stream.close


if __name__ == "__main__":
    sys.exit(main())
