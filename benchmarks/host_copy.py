"""Host copy bandwidth: host_copy (compiled, stream-ordered) against np.copyto.

What is measured, per size (one stream, one thread):
- np.copyto(dst, src) on the calling thread: the single-thread baseline;
- host_copy(stream, dst, src) then stream.sync(): enqueue, the compiled copy on
  the driver's thread, and the wait;
- host_copy(stream, dst, src, executor=HostExecutor(threads=4)) then
  stream.sync(): the copy on the executor's threads, split among the four from
  1 MiB on (--executor-threads sets how many);
- for small sizes, an empty compiled host function launched and waited for the
  same way: what one host-function launch costs, for comparison.
Both copies write into the same pre-faulted destination from a non-zero source,
alternating repeat by repeat (each timing after one untimed warm-up).
Each figure is the median of the repeats, with min and max; the ratio is
host_copy's bandwidth over np.copyto's, measured in the same run.

    python benchmarks/host_copy.py            # 4 KiB .. 1 GiB (needs ~2.5 GiB RAM)
    python benchmarks/host_copy.py --smoke    # tiny sizes: checks it runs (CI)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
FULL_SIZES = [4 * KiB, 64 * KiB, 1 * MiB, 16 * MiB, 64 * MiB, 256 * MiB, 1 * GiB]
SMOKE_SIZES = [4 * KiB, 1 * MiB]
TARGET_SIZE, TARGET_RATIO = 256 * MiB, 0.9
EXECUTOR_TARGET_SIZE, EXECUTOR_TARGET_RATIO = 1 * GiB, 3.0


def _label(n: int) -> str:
    for unit, name in ((GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB")):
        if n >= unit:
            return f"{n // unit} {name}"
    return f"{n} B"


def _times(fn, repeats: int) -> list[float]:
    fn()  # warm up
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def _measure(nh, stream, noop, executor, n: int, repeats: int):
    """Bandwidths (GB/s) of np.copyto, host_copy and host_copy on an executor, and one
    empty launch (µs, small n)."""
    src = np.arange(n, dtype=np.uint8)  # a non-zero pattern
    dst = np.ones(n, np.uint8)  # pre-faulted

    def copyto():
        np.copyto(dst, src)

    def hostcopy():
        nh.host_copy(stream, dst, src)
        stream.sync()

    def on_executor():
        nh.host_copy(stream, dst, src, executor=executor)
        stream.sync()

    def empty():
        nh.host_launch(stream, noop)
        stream.sync()

    # Interleaved, repeat by repeat: a shared machine's bandwidth drifts, and
    # timing all of one method before the other turns that drift into a ratio.
    # Each copy starts from a cleared destination and its data is checked (untimed):
    # np.copyto's leaves dst equal to src, which no copy after it would change.
    base, ours, pool = [], [], []
    for _ in range(repeats):
        base += [n / t / 1e9 for t in _times(copyto, 1)]
        dst[:] = 0
        ours += [n / t / 1e9 for t in _times(hostcopy, 1)]
        if not np.array_equal(dst, src):
            raise SystemExit(f"host_copy produced wrong data at {_label(n)}")
        dst[:] = 0
        pool += [n / t / 1e9 for t in _times(on_executor, 1)]
        if not np.array_equal(dst, src):
            raise SystemExit(f"host_copy(executor=) produced wrong data at {_label(n)}")
    launch_us = f"{statistics.median(_times(empty, repeats)) * 1e6:.1f}" if n <= MiB else ""
    return base, ours, pool, launch_us


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, few repeats")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--executor-threads", type=int, default=4)
    args = parser.parse_args(argv)

    from numba_hostfn._process import simulator_unless_driver

    simulator_unless_driver()
    import numba_hostfn as nh
    from numba_hostfn._demodevice import Device

    device = Device()
    stream = device.create_stream()
    noop = nh.host_callback(lambda p: None)
    executor = nh.HostExecutor(threads=args.executor_threads)
    sizes = SMOKE_SIZES if args.smoke else FULL_SIZES
    print(f"# host_copy vs np.copyto -- backend {nh.backend_name()} ({device.name})\n")
    print(
        "| size | np.copyto GB/s (min-max) | host_copy GB/s (min-max) | ratio | "
        f"host_copy on {executor.threads} executor threads GB/s (min-max) | ratio | "
        "empty host fn µs |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    verdict = executor_verdict = None
    try:
        for n in sizes:
            repeats = args.repeats or (3 if args.smoke else (9 if n >= 64 * MiB else 50))
            base, ours, pool, launch_us = _measure(nh, stream, noop, executor, n, repeats)
            ratio = statistics.median(ours) / statistics.median(base)
            pool_ratio = statistics.median(pool) / statistics.median(base)
            print(
                f"| {_label(n)} | {statistics.median(base):.2f} ({min(base):.2f}-"
                f"{max(base):.2f}) | {statistics.median(ours):.2f} ({min(ours):.2f}-"
                f"{max(ours):.2f}) | {ratio:.2f} | {statistics.median(pool):.2f} "
                f"({min(pool):.2f}-{max(pool):.2f}) | {pool_ratio:.2f} | {launch_us} |"
            )
            if n == TARGET_SIZE:
                verdict = ratio >= TARGET_RATIO
            if n == EXECUTOR_TARGET_SIZE:
                executor_verdict = pool_ratio >= EXECUTOR_TARGET_RATIO
            nh.drain()
    finally:
        stream.sync()
        executor.close()
        device.close_stream(stream)
        device.close()
    if verdict is not None:
        print(
            f"\ntarget: host_copy >= {TARGET_RATIO}x np.copyto at {_label(TARGET_SIZE)}: "
            f"{'met' if verdict else 'MISSED'}"
        )
    if executor_verdict is not None:
        print(
            f"target: host_copy on {executor.threads} executor threads >= "
            f"{EXECUTOR_TARGET_RATIO}x np.copyto at {_label(EXECUTOR_TARGET_SIZE)}: "
            f"{'met' if executor_verdict else 'MISSED'}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
