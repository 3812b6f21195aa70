"""Section throughput: N host functions enqueued and run, per host function.

On one stream and spread round-robin over 4 streams, from the first enqueue to the
last stream's sync: a HostFunction and a Python callable; on a GPU also CuPy's
Stream.launch_host_func on one stream.  Ratios are to the first row.
"""

from __future__ import annotations

import time

from _bench import (
    Target,
    compiled_functions,
    cupy_stream,
    find,
    noop,
    noop_arg,
    ratio,
    record,
    target,
)

GROUP = "throughput"
PLOTS = [(GROUP, "throughput.png")]


def run(nh, device, n: int, repeats: int) -> None:
    empty, _ = compiled_functions(nh)
    for n_streams in (1, 4):
        streams = [device.create_stream() for _ in range(n_streams)]

        def run_one(fn, streams=streams):
            start = time.perf_counter()
            for i in range(n):
                nh.host_launch(streams[i % len(streams)], fn)
            for s in streams:
                s.sync()
            elapsed = time.perf_counter() - start
            nh.drain()
            return elapsed / n * 1e6

        label = "1 stream" if n_streams == 1 else f"{n_streams} streams"
        record(GROUP, f"HostFunction, {label}", "µs/fn", lambda: run_one(empty), repeats)
        record(GROUP, f"Python callable, {label}", "µs/fn", lambda: run_one(noop), repeats)
        if not device.simulator and n_streams == 1:

            def cupy_run(stream=streams[0]):

                cs = cupy_stream(stream)
                start = time.perf_counter()
                for _ in range(n):
                    cs.launch_host_func(noop_arg, None)
                stream.sync()  # cuda.core's sync releases the GIL the callbacks need
                return (time.perf_counter() - start) / n * 1e6

            record(GROUP, "CuPy launch_host_func, 1 stream", "µs/fn", cupy_run, repeats)
        for s in streams:
            s.close()


def targets() -> list[Target]:
    return [
        target(
            # Issue 35: the driver's own host-function rate bounds any callback
            # (a compiled one is already below 0.5x CuPy's), so against that floor.
            "Python callable end to end <= 1.1x HostFunction end to end, 1 stream",
            ratio(
                find(GROUP, "Python callable, 1 stream"),
                find(GROUP, "HostFunction, 1 stream"),
            ),
            1.1,
        )
    ]
