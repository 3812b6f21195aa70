"""Section throughput: N host functions enqueued and run, per host function.

On one stream and spread round-robin over 4 streams, from the first enqueue to the
last stream's sync: a HostFunction and a Python callable; on a GPU also CuPy's
Stream.launch_host_func on one stream.  On one stream also the same two enqueued
behind device work that holds the stream, timed from its release to the sync: the
driver's thread running them with the main thread idle in sync(), where the first
rows also have it enqueueing (a Python callable's trampoline then waits for the GIL
that the enqueueing thread holds between its launches).  The rows of each stream
count are interleaved, one loop of each per round, so that drift over seconds (a
shared machine) hits the HostFunction's, the end-to-end target's baseline, alike.
Ratios are to the first row.
"""

from __future__ import annotations

import time

from _bench import (
    Gate,
    Row,
    Target,
    compiled_functions,
    cupy_stream,
    find,
    gil_floor,
    interleaved,
    noop,
    noop_arg,
    ratio,
    target,
)

GROUP = "throughput"
HELD = "run behind held work, enqueue not timed"
FLOOR = "GIL floor: a C CUhostFn taking the GIL to call the callable"
#: The rows the floor's ratios compare, by the short name their targets use.
ROW = {"GIL floor": FLOOR, "HostFunction": "HostFunction", "Python callable": "Python callable"}
PLOTS = [(GROUP, "throughput.png")]


def run(nh, device, n: int, repeats: int) -> None:
    empty, _ = compiled_functions(nh)
    for n_streams in (1, 4):
        streams = [device.create_stream() for _ in range(n_streams)]
        try:
            _interleave(nh, device, streams, empty, n, repeats)
        finally:
            for s in streams:
                s.close()


def _interleave(nh, device, streams: list, empty, n: int, repeats: int) -> None:
    """The rows of one stream count, one loop of each per round."""

    def run_one(fn, user_data=None) -> float:
        start = time.perf_counter()
        if user_data is None:  # as before the floor's rows: no keyword in the loop
            for i in range(n):
                nh.host_launch(streams[i % len(streams)], fn)
        else:
            for i in range(n):
                nh.host_launch(streams[i % len(streams)], fn, user_data=user_data)
        for s in streams:
            s.sync()
        elapsed = time.perf_counter() - start
        nh.drain()
        return elapsed / n * 1e6

    label = "1 stream" if len(streams) == 1 else f"{len(streams)} streams"
    rows = {
        f"HostFunction, {label}": lambda: run_one(empty),
        f"Python callable, {label}": lambda: run_one(noop),
    }
    if len(streams) == 1:
        gate = Gate(device)

        def run_held(fn, user_data=None) -> float:
            gate.close_on(streams[0])
            try:
                for _ in range(n):  # not timed: the keyword may be passed
                    nh.host_launch(streams[0], fn, user_data=user_data)
                start = time.perf_counter()
            finally:  # a failing row must leave the stream neither held nor busy
                gate.open()
                streams[0].sync()
            elapsed = time.perf_counter() - start
            nh.drain()
            return elapsed / n * 1e6

        rows[f"HostFunction, 1 stream, {HELD}"] = lambda: run_held(empty)
        rows[f"Python callable, 1 stream, {HELD}"] = lambda: run_held(noop)
        # The floor under the end-to-end target: the same callable called by a C
        # CUhostFn that only takes the GIL (a failure to build it is the rows' note).
        rows[f"{FLOOR}, 1 stream"] = lambda: run_one(gil_floor(), id(noop))
        rows[f"{FLOOR}, 1 stream, {HELD}"] = lambda: run_held(gil_floor(), id(noop))
    if not device.simulator and len(streams) == 1:
        cupy = []  # made at its first sample: a failure to import CuPy is the row's note

        def cupy_run() -> float:
            if not cupy:
                cupy.append(cupy_stream(streams[0]))
            start = time.perf_counter()
            for _ in range(n):
                cupy[0].launch_host_func(noop_arg, None)
            streams[0].sync()  # cuda.core's sync releases the GIL the callbacks need
            return (time.perf_counter() - start) / n * 1e6

        rows["CuPy launch_host_func, 1 stream"] = cupy_run
    table = [Row(GROUP, name, "µs/fn") for name in rows]
    interleaved(f"{GROUP}, {label}", table, lambda row: rows[row.name](), repeats)


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
        ),
        # Informational: the same with the main thread idle in sync() throughout.
        target(
            f"Python callable / HostFunction, 1 stream, {HELD}",
            ratio(
                find(GROUP, f"Python callable, 1 stream, {HELD}"),
                find(GROUP, f"HostFunction, 1 stream, {HELD}"),
            ),
            None,
        ),
        # Informational (2026-12-07): what any Python callback through
        # cuLaunchHostFunc pays, whatever wraps it, against the target's baseline;
        # then what the package adds above that floor.
        *(
            target(
                f"{a} / {b}, 1 stream{held}",
                ratio(
                    find(GROUP, f"{ROW[a]}, 1 stream{held}"),
                    find(GROUP, f"{ROW[b]}, 1 stream{held}"),
                ),
                None,
            )
            for held in ("", f", {HELD}")
            for a, b in (("GIL floor", "HostFunction"), ("Python callable", "GIL floor"))
        ),
    ]
