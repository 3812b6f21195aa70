# What this shows: GIL-free numeric post-processing of a device result, in stream
# order. The device produces N values; a device-to-host copy lands them in pinned
# memory; a compiled host function computes their mean, standard deviation, range
# and a histogram into a result record -- all while the main thread keeps running
# Python. The host reads the record after one synchronize and checks it with numpy.
# Runs on a GPU, or on the simulator with NUMBA_HOSTFN_SIMULATOR=1.

import ctypes
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

KERNEL = r"""
extern "C" __global__ void produce(float *x, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = sinf(0.001f * i) * 10.0f;  // values in [-10, 10]
}
"""


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
    kernel = kernel.compile("cubin").get_kernel("produce")
    on_device = device.allocate(N * 4, stream=stream)
    pinned = LegacyPinnedMemoryResource().allocate(N * 4)
    values = np.frombuffer((ctypes.c_char * (N * 4)).from_address(int(pinned.handle)), np.float32)
    launch(stream, LaunchConfig(grid=N // 256, block=256), kernel, on_device, np.int32(N))
    on_device.copy_to(pinned, stream=stream)  # device -> pinned host memory

    def cleanup():
        stream.sync()
        on_device.close()
        pinned.close()
        stream.close()

    return stream, values, cleanup


def simulator_setup():
    @nh.host_callback
    def produce(p):  # the simulated kernel writes host memory directly
        x = carray(p, (N,), np.float32)
        for i in range(N):
            x[i] = np.float32(np.sin(np.float32(0.001) * np.float32(i)) * np.float32(10.0))

    stream = nh.simulator.Stream()
    values = np.zeros(N, np.float32)
    stream.launch(produce, user_data=nh.by_ref(values))
    return stream, values, stream.close


def main() -> int:
    setup = simulator_setup if nh.backend_name() == "simulator" else gpu_setup
    stream, values, cleanup = setup()
    try:
        stats = np.zeros(1, STATS)
        stats[0]["data"], stats[0]["n"] = values.ctypes.data, N
        nh.host_launch(stream, summarize, user_data=nh.by_ref(stats))
        busy = sum(i * i for i in range(200_000))  # the main thread keeps running Python
        stream.sync()
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
