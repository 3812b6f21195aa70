# What this shows: a compiled host function runs exactly between two kernels of a
# stream. Kernel 1 writes a value into pinned host memory; the host function reads
# it and writes its answer beside it; kernel 2 writes only afterwards, so the host
# function never sees kernel 2's value. Nothing synchronizes until the end. The
# kernels are numba-cuda's (numba.cuda.jit), on the numba-cuda stream that
# host_launch gets. Runs on a GPU with numba-cuda (pip install -e ".[cuda]"),
# or on the simulator with NUMBA_HOSTFN_SIMULATOR=1 (where the "kernels" are
# compiled functions run as stream work).

import sys

import numpy as np
from numba import carray

import numba_hostfn as nh


@nh.host_callback
def between(p):
    """cells = [kernel 1's value, host function's answer, kernel 2's value]."""
    cells = carray(p, (3,), np.int32)
    cells[1] = cells[0] * 10 + cells[2]  # kernel 2 has not written cells[2] yet


def numba_cuda():
    """numba.cuda, to write the kernels in Python (``pip install -e ".[cuda]"``).

    numba-cuda 0.30.4 registers an overload of ``np.row_stack``, which NumPy 2.5
    removed, when it compiles its first kernel; numba-cuda is in maintenance and
    will not change that (NVIDIA/numba-cuda#907). Give it back the alias it reads.
    """
    if not hasattr(np, "row_stack"):
        np.row_stack = np.vstack
    from numba import cuda

    return cuda


def gpu_setup():
    cuda = numba_cuda()

    @cuda.jit
    def store_kernel(cells, index, value):
        cells[index] = value

    stream = cuda.stream()  # a numba-cuda stream: host_launch takes it as it is
    cells = cuda.mapped_array(3, np.int32)  # pinned host memory that the GPU writes
    cells[:] = 0

    def store(index, value):
        store_kernel[1, 1, stream](cells, index, value)

    return stream, cells, store, stream.synchronize, lambda: None


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

    return stream, cells, store, stream.sync, stream.close


def main() -> int:
    setup = simulator_setup if nh.backend_name() == "simulator" else gpu_setup
    stream, cells, store, sync, cleanup = setup()
    try:
        store(0, 4)  # kernel 1
        nh.host_launch(stream, between, user_data=nh.by_ref(cells))
        store(2, 7)  # kernel 2
        sync()
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
