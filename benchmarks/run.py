"""numba_hostfn benchmarks: GIL and GIL-free host functions, the raw driver and the peers.

    python benchmarks/run.py --out bench-out        # on a GPU: table + PNG plots
    python benchmarks/run.py --smoke                # a tiny run (the simulator in CI)
    python benchmarks/run.py --only dispatch        # one section (repeatable)
    python benchmarks/ab.py REF --only enqueue      # a git REF against the working tree

Progress goes to stderr, one line per row; a row running over two minutes
(BENCH_WATCHDOG_S) prints every thread's stack there and goes on.

What is measured (each figure: median with min-max over repeats, and its ratio to
the baseline measured in the same run); each section's module docstring says it in
full:

1. enqueue (bench_enqueue.py): the cost of one enqueue call, from a loop of N calls
   timed on the host while device work holds the stream: host_launch with a
   HostFunction, a ctypes CUhostFn and a Python callable; a C loop over
   cuLaunchHostFunc (built with nvcc if present), and the same loop with the capture
   check and the GIL released, as any safe enqueue from Python; cuda.bindings; ctypes straight to
   libcuda; CuPy's Stream.launch_host_func; numba-cuda's Stream.add_callback.
2. throughput (bench_throughput.py): N host functions enqueued and run, per host
   function, on one stream and spread over 4 streams.
3. dispatch delay (bench_dispatch.py): device work ends -> the host function starts,
   with the main thread idle, busy in a Python loop, or holding the GIL in a long C
   call; HostFunction vs Python callable vs CuPy (interleaved, 25 rounds); and Python
   callables busy over sys.setswitchinterval values.
4. host copy bandwidth: benchmarks/host_copy.py (run separately).
5. compile (bench_compile.py): @host_callback compile time, first and cached (fresh
   processes), against numba.cfunc(cache=True) of the same body, and the time to
   import numba_hostfn against importing numba.
6. graphs (bench_graphs.py): the replay cost per host node of a captured graph of K
   nodes replayed R times: a HostFunction and a Python callable through host_launch,
   and on a GPU cuda.core's own GraphBuilder.callback.
7. executor (bench_executor.py): the HostExecutor: round trip kernel -> host work ->
   kernel against raw C baselines, 4 streams x 50 x 2 ms of host work in parallel
   (with a timeline plot), and the pool's CPU time; its dispatch delay is a row of
   the dispatch section.
8. startup (bench_startup.py): fresh processes, start to exit: import numba_hostfn, a
   stream and one Python callable run, against import numpy (simulator) and against
   importing cuda.core and making its stream (GPU).
9. asyncio (bench_async.py): stream done -> coroutine resumed for async_done,
   to_thread(sync), a call_soon_threadsafe host callback and numba-cuda's
   async_done, with the loop idle and busy; 10k waits; the non-blocking
   callback's delay against a blocking callable and CuPy (plots asyncio*.png).

_bench.py holds what the sections share: the rows and record(), the report with
its targets table, the plots, the compiled host functions and the Gate.  A section
module has a run() (its arguments are set here), PLOTS, and where it has them a
baseline(group) for its tables' ratios and targets() for the targets table.
"""

from __future__ import annotations

import argparse
import sys
import time

import bench_async
import bench_compile
import bench_dispatch
import bench_enqueue
import bench_executor
import bench_graphs
import bench_startup
import bench_throughput
from _bench import Row, report, write_json

# --only names, in the order the sections run (and their tables and targets appear).
SECTIONS = {
    "enqueue": bench_enqueue,
    "throughput": bench_throughput,
    "dispatch": bench_dispatch,
    "compile": bench_compile,
    "graphs": bench_graphs,
    "executor": bench_executor,
    "startup": bench_startup,
    "asyncio": bench_async,
}


def baseline(group: str) -> Row | None:
    """The row a group's ratios are to: its section's choice, else None (its first row)."""
    for section in SECTIONS.values():
        if hasattr(section, "baseline") and (row := section.baseline(group)):
            return row
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (CI, simulator)")
    parser.add_argument("--out", help="folder for benchmarks.md and the PNG plots")
    parser.add_argument("--json", help="also write every row and target here (benchmarks/ab.py)")
    parser.add_argument(
        "--only",
        choices=tuple(SECTIONS),
        action="append",
        help="run only these sections (repeatable)",
    )
    args = parser.parse_args(argv)
    from numba_hostfn._process import simulator_unless_driver

    simulator_unless_driver()
    import numba_hostfn as nh
    from numba_hostfn._demodevice import Device

    device = Device()
    n, repeats, window = (200, 2, 0.02) if args.smoke else (20000, 7, 0.02)
    dispatch_repeats = 2 if args.smoke else 25
    nodes, replays = (10, 20) if args.smoke else (100, 200)
    import importlib.metadata as md

    versions = ", ".join(
        f"{p} {md.version(p)}" for p in ("numba", "cuda-core", "cuda-bindings") if _has(md, p)
    )
    header = (
        f"## numba_hostfn benchmarks -- {time.strftime('%Y-%m-%d')}, backend "
        f"{nh.backend_name()} ({device.name}), Python {sys.version.split()[0]}, "
        f"{versions}; N={n}, repeats={repeats}; graphs: K={nodes} nodes, R={replays} replays"
    )
    steps = {
        "enqueue": lambda: bench_enqueue.run(nh, device, n, repeats),
        "throughput": lambda: bench_throughput.run(nh, device, n, repeats),
        "dispatch": lambda: bench_dispatch.run(nh, device, dispatch_repeats, window),
        "compile": lambda: bench_compile.run(1 if args.smoke else 3),
        "graphs": lambda: bench_graphs.run(nh, device, nodes, replays, repeats),
        "executor": lambda: bench_executor.run(
            nh, device, 50 if args.smoke else 2000, repeats, 3 if args.smoke else 50
        ),
        "startup": lambda: bench_startup.run(2 if args.smoke else 15, nh.backend_name() == "cuda"),
        "asyncio": lambda: bench_async.run(
            nh, device, 2 if args.smoke else 15, 200 if args.smoke else 10_000
        ),
    }
    for name in SECTIONS:
        if not args.only or name in args.only:
            steps[name]()
            sys.stdout.flush()
    targets = [t for s in SECTIONS.values() if hasattr(s, "targets") for t in s.targets()]
    plots = [p for s in SECTIONS.values() for p in s.PLOTS]
    print(report(args.out, header, targets, baseline, plots))
    if args.json:
        write_json(args.json, targets)
    if args.out:
        bench_executor.plot_timeline(args.out)
    device.close()
    return 0


def _has(md, name: str) -> bool:
    try:
        md.version(name)
        return True
    except md.PackageNotFoundError:
        return False


if __name__ == "__main__":
    sys.exit(main())
