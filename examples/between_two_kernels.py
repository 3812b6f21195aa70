# What this shows: a compiled host function runs exactly between two kernels of a
# stream. Kernel 1 writes a value into pinned host memory; the host function reads
# it and writes its answer beside it; kernel 2 writes only afterwards, so the host
# function never sees kernel 2's value. Nothing synchronizes until the end.
# Runs on a GPU, or on the simulator with NUMBA_HOSTFN_SIMULATOR=1 (where the
# "kernels" are compiled functions run as stream work).

import ctypes
import sys

import numpy as np
from numba import carray

import numba_hostfn as nh

KERNEL = r"""
extern "C" __global__ void store(int *cell, int value)
{
    *(volatile int *)cell = value;
    __threadfence_system();
}
"""


@nh.host_callback
def between(p):
    """cells = [kernel 1's value, host function's answer, kernel 2's value]."""
    cells = carray(p, (3,), np.int32)
    cells[1] = cells[0] * 10 + cells[2]  # kernel 2 has not written cells[2] yet


def gpu_setup():
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
    kernel = Program(KERNEL, code_type="c++", options=ProgramOptions(arch=arch))
    kernel = kernel.compile("cubin").get_kernel("store")
    buf = LegacyPinnedMemoryResource().allocate(12)  # pinned: the GPU can write it
    cells = np.frombuffer((ctypes.c_char * 12).from_address(int(buf.handle)), np.int32)
    cells[:] = 0

    def store(index, value):
        launch(
            stream,
            LaunchConfig(grid=1, block=1),
            kernel,
            np.uint64(cells.ctypes.data + 4 * index),
            np.int32(value),
        )

    def cleanup():
        stream.sync()
        buf.close()
        stream.close()

    return stream, cells, store, cleanup


def simulator_setup():
    layout = np.dtype([("cell", np.uint64), ("value", np.int64)])

    @nh.host_callback(dtype=layout)
    def store_kernel(d):
        carray(nh.as_voidptr(d.cell), (1,), np.int32)[0] = d.value

    stream = nh.simulator.Stream()
    cells = np.zeros(3, np.int32)

    def store(index, value):
        args = np.array([(cells.ctypes.data + 4 * index, value)], layout)
        stream.launch(store_kernel, user_data=args)

    return stream, cells, store, stream.close


def main() -> int:
    setup = simulator_setup if nh.backend_name() == "simulator" else gpu_setup
    stream, cells, store, cleanup = setup()
    try:
        store(0, 4)  # kernel 1
        nh.host_launch(stream, between, user_data=nh.by_ref(cells))
        store(2, 7)  # kernel 2
        stream.sync()
        ok = list(cells) == [4, 40, 7]
        print(
            f"cells {list(map(int, cells))}: the host function saw kernel 1 (4) and not "
            f"kernel 2 (7) -> {'OK' if ok else 'WRONG'}"
        )
        return 0 if ok else 1
    finally:
        cleanup()


if __name__ == "__main__":
    sys.exit(main())
