# What this shows: the same compiled host function enqueued on streams of four
# libraries -- cuda.core, CuPy, PyTorch and numba-cuda -- through the
# __cuda_stream__ protocol, each synchronized by its own library.
#
# Needs a GPU, with CuPy, PyTorch and numba-cuda installed.

import sys

import numpy as np
from numba import carray

import numba_hostfn as nh


@nh.host_callback
def increment(p):
    carray(p, (1,), np.int64)[0] += 1


def streams():
    """(name, stream, synchronize) for each library."""
    import cupy
    import torch
    from cuda.core import Device
    from numba import cuda

    device = Device()
    device.set_current()
    core = device.create_stream()
    yield "cuda.core", core, core.sync
    cp = cupy.cuda.Stream(non_blocking=True)
    yield "CuPy", cp, cp.synchronize
    th = torch.cuda.Stream()
    yield "PyTorch", th, th.synchronize
    nb = cuda.stream()
    yield "numba-cuda", nb, nb.synchronize


def main() -> int:
    if nh.backend_name() == "simulator":
        raise SystemExit("stream_interop.py needs a GPU and the CUDA libraries")
    results = {}
    for name, stream, synchronize in streams():
        counter = np.zeros(1, np.int64)
        for _ in range(3):
            nh.host_launch(stream, increment, user_data=nh.by_ref(counter))
        synchronize()
        results[name] = int(counter[0])
    nh.drain()
    ok = all(count == 3 for count in results.values()) and len(results) == 4
    print(f"host function runs per library: {results} -> {'OK' if ok else 'WRONG'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
