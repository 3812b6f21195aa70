# What this shows: GIL-free numeric post-processing of a device result, in stream
# order. The device produces N values; a device-to-host copy lands them in pinned
# memory; a compiled host function computes their mean, standard deviation, range
# and a histogram into a result record -- all while the main thread keeps running
# Python. The host reads the record after one synchronize and checks it with numpy.
# The kernel and the copy are numba-cuda's, on the numba-cuda stream that host_launch
# gets. Runs on a GPU with numba-cuda (pip install -e ".[cuda]"), or on the
# simulator with NUMBA_HOSTFN_SIMULATOR=1.

import math
import sys

import numpy as np
from numba import carray

import numba_hostfn as nh

N, BINS = 1 << 20, 16

STATS = np.dtype(
    [
        ("data", np.uint64),
        ("n", np.int64),
        ("mean", np.float64),
        ("std", np.float64),
        ("min", np.float64),
        ("max", np.float64),
        ("hist", np.int64, (BINS,)),
    ]
)


@nh.host_callback(dtype=STATS)
def summarize(s):
    x = carray(nh.as_voidptr(s.data), (s.n,), np.float32)
    total, squares = 0.0, 0.0
    lo, hi = np.inf, -np.inf
    for v in x:
        total += v
        squares += v * v
        lo = min(lo, v)
        hi = max(hi, v)
    s.mean = total / s.n
    s.std = np.sqrt(squares / s.n - s.mean * s.mean)
    s.min, s.max = lo, hi
    for v in x:  # BINS equal bins over [-10, 10]
        b = int((v + 10.0) / 20.0 * BINS)
        s.hist[min(max(b, 0), BINS - 1)] += 1


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
    def produce(x):
        i = cuda.grid(1)
        if i < x.size:  # values in [-10, 10]
            x[i] = math.sin(np.float32(0.001) * np.float32(i)) * np.float32(10.0)

    stream = cuda.stream()  # a numba-cuda stream: host_launch takes it as it is
    on_device = cuda.device_array(N, np.float32, stream=stream)
    values = cuda.pinned_array(N, np.float32)
    produce[N // 256, 256, stream](on_device)
    on_device.copy_to_host(values, stream=stream)  # device -> pinned host memory
    return stream, values, stream.synchronize, lambda: None


def simulator_setup():
    @nh.host_callback
    def produce(p):  # the simulated kernel writes host memory directly
        x = carray(p, (N,), np.float32)
        for i in range(N):
            x[i] = np.float32(np.sin(np.float32(0.001) * np.float32(i)) * np.float32(10.0))

    stream = nh.simulator.Stream()
    values = np.zeros(N, np.float32)
    stream.launch(produce, user_data=nh.by_ref(values))
    return stream, values, stream.sync, stream.close


def main() -> int:
    setup = simulator_setup if nh.backend_name() == "simulator" else gpu_setup
    stream, values, sync, cleanup = setup()
    try:
        stats = np.zeros(1, STATS)
        stats[0]["data"], stats[0]["n"] = values.ctypes.data, N
        nh.host_launch(stream, summarize, user_data=nh.by_ref(stats))
        busy = sum(i * i for i in range(200_000))  # the main thread keeps running Python
        sync()
        s = stats[0]
        expect_hist = np.histogram(values, bins=BINS, range=(-10, 10))[0]
        ok = (
            np.isclose(s["mean"], values.mean(dtype=np.float64), atol=1e-6)
            and np.isclose(s["std"], values.std(dtype=np.float64), rtol=1e-6)
            and s["min"] == values.min()
            and s["max"] == values.max()
            and np.abs(s["hist"] - expect_hist).sum() <= 2  # values exactly on bin edges
        )
        print(
            f"mean {s['mean']:.4f}, std {s['std']:.4f}, range [{s['min']:.2f}, {s['max']:.2f}], "
            f"histogram {[int(h) for h in s['hist'][:4]]}...; "
            f"main thread did {busy > 0} work meanwhile -> {'OK' if ok else 'WRONG'}"
        )
        return 0 if ok else 1
    finally:
        cleanup()


if __name__ == "__main__":
    sys.exit(main())
