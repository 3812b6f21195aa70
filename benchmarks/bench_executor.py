"""Section executor: the HostExecutor against the driver's host-function thread.

- round trip: one stream, N iterations of "tiny kernel -> host work (an empty
  compiled function) -> next kernel", synchronized at the end, per iteration: the
  kernel alone, host_launch, host_launch(executor=), the core's enqueue on the
  executor's lane alone (``_core.enqueue``, given what host_launch(executor=) finds,
  its owner made once: where its time goes), and five raw C baselines
  built with nvcc (the kernel alone; kernel + cuLaunchHostFunc; kernel + cuStreamWriteValue32
  "reached" + a host thread spinning on it + cuStreamWaitValue32 "done"; the same
  write and wait in one cuStreamBatchMemOp, as the executor enqueues them; and that
  batch as any safe enqueue from Python must make it, the GIL released around a
  capture check and the call, as the enqueue section's safe C loop), all
  interleaved, one sample of each per round.  The Python rows
  launch the kernel with the C baselines' own ``tiny<<<1, 1, 0, stream>>>()``,
  called through ctypes (PyDLL, no argument: the cheapest call ctypes makes, since
  the launch is the loop's overhead, not what it compares), each row with its own
  loop (no lambda per call), so that the rows differ only in the host work: a
  cuda.core launch alone costs more than a whole C iteration (the "cuda.core
  launch" row shows it).
- enqueue host time: a loop of 300 ``host_launch(executor=)`` calls with no kernel,
  timed before the synchronize (what a launch costs the enqueuing thread: the round
  trip is host-bound), beside 300 of ``host_launch`` to the driver's thread.
- parallel host work: 4 streams x 50 tasks x 2 ms of compiled work; the makespan
  with host_launch (the driver's one thread) and with a 4-thread executor, against
  the ideal parallel time (50 x 2 ms); per task start and end times give the
  timeline plot (executor_timeline.png).
- the pool's CPU time (process CPU seconds per wall second) over 1 s with nothing
  outstanding, over 1 s with a task outstanding that the stream has not reached
  (spinning, then polling), and over 1 s with a graph holding an executor node
  alive (one thread polls for its replays).
- graph replay: a graph of one node, a host node (the driver's thread) or an
  executor node, replayed back to back, and replayed once after 20 ms idle
  (launch to synchronize): what the executor's answer to "a replay cannot wake a
  parked pool" (poll while such a graph lives) costs in latency.
The dispatch section has the executor's dispatch delay; benchmarks/host_copy.py its
copies.
"""

from __future__ import annotations

import ctypes
import os
import statistics
import subprocess
import sys
import time

import numpy as np
from _bench import (
    ROWS,
    Gate,
    Row,
    Target,
    build_with_nvcc,
    check_enqueue,
    compiled_functions,
    find,
    interleaved,
    ratio,
    record,
    target,
)

ROUND_TRIP = "executor: round trip kernel -> host work -> kernel"
PARALLEL = "executor: 4 streams x 50 tasks x 2 ms"
CPU = "executor: pool CPU time"
GRAPH = "executor: graph replay of one node"
PLOTS = [(ROUND_TRIP, "executor.png")]
C_KERNEL = "raw C: kernel alone"
C_MEMOP = "raw C: kernel + stream memory operations + spinning thread"
C_HOSTFN = "raw C: kernel + cuLaunchHostFunc"
C_BATCH = "raw C: kernel + the same two in one cuStreamBatchMemOp + spinning thread"
# The batched operation as any safe enqueue from Python must make it (the GIL released
# around a capture check and the call, as the enqueue section's safe C loop does): what
# the executor's enqueue cannot do without.
C_SAFE_BATCH = (
    "raw C: kernel + the batched operation with the capture check and the GIL released "
    "+ spinning thread"
)
EXECUTOR = "kernel + host_launch(executor=)"
# Where host_launch(executor=)'s time goes: the core's enqueue on the executor's lane,
# given what host_launch finds (the lane, the trampoline, the address, an owner made
# once), without host_launch's own checks, its stream protocol call or its owner.
CORE = "kernel + the core's enqueue on the executor's lane (_core.enqueue)"
HOSTFN = "kernel + host_launch"
TIMELINE: dict[str, list[tuple[int, float, float]]] = {}

BUSY = np.dtype([("out", np.uint64), ("index", np.int64), ("ns", np.int64)])
_clock_gettime = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_void_p)(
    ("clock_gettime", ctypes.CDLL(None))
)


def _busy_function(nh):
    from numba import carray

    @nh.host_callback(dtype=BUSY)
    def busy(d):
        """Spin for d.ns nanoseconds; out[2*index], out[2*index+1] = start, end (ns)."""
        out = carray(nh.as_voidptr(d.out), (2 * (d.index + 1),), np.int64)
        ts = np.zeros(2, np.int64)
        _clock_gettime(1, ts.ctypes.data)
        start = ts[0] * 1_000_000_000 + ts[1]
        now = start
        while now - start < d.ns:
            _clock_gettime(1, ts.ctypes.data)
            now = ts[0] * 1_000_000_000 + ts[1]
        out[2 * d.index] = start
        out[2 * d.index + 1] = now

    return busy


def run(nh, device, n: int, repeats: int, tasks: int) -> None:
    empty, _ = compiled_functions(nh)
    stream = device.create_stream()
    executor = nh.HostExecutor(threads=4)

    tiny = None
    if not device.simulator:
        try:  # the C loops' own launch; without nvcc, cuda.core's (the C rows: notes)
            tiny = _TinyKernel(stream)
        except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
            print(f"[{ROUND_TRIP}] no C kernel launch ({exc}): cuda.core's", file=sys.stderr)
    host_launch = nh.host_launch
    core_args = _core_lane_args(nh, device, stream, executor, empty)

    def round_trip(work: str, kernel=None) -> float:
        """µs per iteration of kernel -> work, n iterations then one synchronize.  Each
        work has its own loop, with the calls written out (no lambda around them,
        whose frame would count in every iteration, as the C loops have none)."""
        if kernel is None:
            kernel = tiny.launch if tiny is not None else lambda: device.delay(stream, 0)
        if tiny is not None:
            tiny.on()

        def loop(count: int) -> None:
            if work == "none":
                for _ in range(count):
                    kernel()  # a tiny kernel
            elif work == "host_launch":
                for _ in range(count):
                    kernel()
                    host_launch(stream, empty)
            elif work == "core":
                enqueue = nh._core.enqueue
                route, lane, run, address, arg, owner = core_args
                for _ in range(count):
                    kernel()
                    enqueue(route, lane, run, address, arg, owner)
            else:
                for _ in range(count):
                    kernel()
                    host_launch(stream, empty, executor=executor)

        loop(1)  # warm (an executor's lane for the stream is made at its first launch)
        stream.sync()
        nh.drain()
        start = time.perf_counter()
        loop(n)
        stream.sync()
        elapsed = time.perf_counter() - start
        nh.drain()
        if tiny is not None:
            tiny.check()
        return elapsed / n * 1e6

    rows = {
        "kernel alone": lambda: round_trip("none"),
        HOSTFN: lambda: round_trip("host_launch"),
        EXECUTOR: lambda: round_trip("executor"),
    }
    if not isinstance(core_args, str):
        rows[CORE] = lambda: round_trip("core")
    if not device.simulator:
        rows["kernel alone, cuda.core launch (for scale)"] = lambda: round_trip(
            "none", lambda: device.delay(stream, 0)
        )
        rows[C_KERNEL] = lambda: _c_round_trip(stream, n, 0)
        rows[C_HOSTFN] = lambda: _c_round_trip(stream, n, 1)
        rows[C_MEMOP] = lambda: _c_round_trip(stream, n, 2)
        rows[C_BATCH] = lambda: _c_round_trip(stream, n, 3)
        rows[C_SAFE_BATCH] = lambda: _c_round_trip(stream, n, 4)
    # One sample of every row per round: the host drifts over seconds (a shared
    # machine), and the targets divide rows of the same rounds.
    table = [Row(ROUND_TRIP, name, "µs/iter") for name in rows]
    if isinstance(core_args, str):
        table.append(Row(ROUND_TRIP, CORE, "µs/iter", note=core_args))
    if device.simulator:
        table += [
            Row(ROUND_TRIP, name, "µs/iter", note="needs a GPU")
            for name in (C_KERNEL, C_HOSTFN, C_MEMOP, C_BATCH, C_SAFE_BATCH)
        ]
    interleaved(ROUND_TRIP, table, lambda row: rows[row.name](), repeats)
    _enqueue_host_time(nh, stream, empty, executor, repeats)
    _parallel(nh, device, tasks, repeats)
    _cpu_time(nh, device, executor, stream)
    _graph_replay(nh, stream, executor, empty, n, repeats)
    executor.close()
    device.close_stream(stream)


def _core_lane_args(nh, device, stream, executor, empty) -> tuple | str:
    """The core's enqueue on the executor's lane for stream, as host_launch(executor=)
    finds it (an owner made once), checked once; or, for a package from before the
    core's routes (an A/B's older side), why that row is not measured."""
    from numba_hostfn import _core

    try:
        route = _core.ROUTE_SIM_LANE if device.simulator else _core.ROUTE_CUDA_LANE
        lane = executor._lane(stream.__cuda_stream__()[1])
        owner = _core.launch_owner(empty, None, None, executor)
        args = (route, lane, _core.RUN_COMPILED, empty.address, 0, owner)
    except AttributeError as exc:
        return f"this package has no core enqueue on a lane ({exc})"
    check_enqueue(nh, stream, args, "the executor's lane")
    return args


ENQUEUE = "executor: enqueue, host time a call (no kernel, 300 calls)"
ENQUEUE_CALLS = 300  # 600 items of device work: below the ~1,021 at which the driver blocks


def _enqueue_host_time(nh, stream, empty, executor, repeats: int) -> None:
    """What one launch costs the enqueuing thread: a loop of 300 launches on an idle
    stream, timed before the synchronize (the round trip above is host-bound, so
    this is most of what ``host_launch(executor=)`` adds to it), beside a
    HostFunction's ``host_launch`` to the driver's thread."""
    work = {
        "host_launch(executor=)": lambda: nh.host_launch(stream, empty, executor=executor),
        "host_launch (the driver's thread)": lambda: nh.host_launch(stream, empty),
    }

    def sample(row: Row) -> float:
        launch = work[row.name]
        launch()
        stream.sync()
        nh.drain()
        start = time.perf_counter()
        for _ in range(ENQUEUE_CALLS):
            launch()
        elapsed = time.perf_counter() - start
        stream.sync()
        nh.drain()
        return elapsed / ENQUEUE_CALLS * 1e6

    table = [Row(ENQUEUE, name, "µs/call") for name in work]
    interleaved(ENQUEUE, table, sample, repeats)


def _parallel(nh, device, tasks: int, repeats: int) -> None:
    busy = _busy_function(nh)
    streams = [device.create_stream() for _ in range(4)]
    ideal_ms = tasks * 2.0

    def makespan(executor, label: str) -> float:
        out = np.zeros(2 * 4 * tasks, np.int64)
        for s in streams:
            device.delay(s, 0.02)  # all streams start together, after this
        for t in range(tasks):
            for i, s in enumerate(streams):
                data = np.array([(out.ctypes.data, i * tasks + t, 2_000_000)], BUSY)
                nh.host_launch(s, busy, user_data=data, executor=executor)
        for s in streams:
            s.sync()
        nh.drain()
        spans = out.reshape(4 * tasks, 2)
        first = spans[:, 0].min()
        TIMELINE[label] = [
            (k // tasks, (a - first) / 1e6, (b - a) / 1e6) for k, (a, b) in enumerate(spans)
        ]
        return (spans[:, 1].max() - first) / 1e6

    with nh.HostExecutor(threads=4) as executor:
        record(
            PARALLEL,
            "host_launch (the driver's thread)",
            "ms",
            lambda: makespan(None, "host_launch"),
            repeats,
        )
        record(
            PARALLEL,
            "host_launch(executor=HostExecutor(threads=4))",
            "ms",
            lambda: makespan(executor, "executor"),
            repeats,
        )
    ROWS.append(Row(PARALLEL, "ideal (one task after another per stream)", "ms", [ideal_ms]))
    for s in streams:
        device.close_stream(s)


def _cpu_time(nh, device, executor, stream) -> None:
    def cpu_over(seconds: float, outstanding: bool) -> float:
        gate = Gate(device) if outstanding else None
        try:
            if gate is not None:
                gate.close_on(stream)
                nh.host_launch(stream, compiled_functions(nh)[0], executor=executor)
            time.sleep(0.05)  # past the spin budget that the launch started
            c0, w0 = time.process_time(), time.perf_counter()
            time.sleep(seconds)
            c1, w1 = time.process_time(), time.perf_counter()
        finally:  # a failing row must not leave the stream held
            if gate is not None:
                gate.open()
                stream.sync()
                nh.drain()
        return (c1 - c0) / (w1 - w0)

    record(CPU, "idle (nothing outstanding): parked", "CPU s/s", lambda: cpu_over(1.0, False), 1)
    record(
        CPU,
        f"a task outstanding, not reached: polling every {executor.poll_us:g} µs",
        "CPU s/s",
        lambda: cpu_over(1.0, True),
        1,
    )


def _graph(nh, stream, empty, executor):
    builder = stream.create_graph_builder().begin_building()
    nh.host_launch(builder, empty, executor=executor)
    graph = builder.end_building().complete()
    builder.close()
    return graph


def _graph_replay(nh, stream, executor, empty, n: int, repeats: int) -> None:
    host_graph = _graph(nh, stream, empty, None)
    node_graph = _graph(nh, stream, empty, executor)

    def back_to_back(graph) -> float:
        graph.launch(stream)
        stream.sync()
        start = time.perf_counter()
        for _ in range(n):
            graph.launch(stream)
        stream.sync()
        return (time.perf_counter() - start) / n * 1e6

    def after_idle(graph) -> float:
        times = []
        for _ in range(20):
            time.sleep(0.02)  # the pool is past its spin budget: one thread polls
            start = time.perf_counter()
            graph.launch(stream)
            stream.sync()
            times.append((time.perf_counter() - start) * 1e6)
        return statistics.median(times)

    record(GRAPH, "host node: back to back", "µs/replay", lambda: back_to_back(host_graph), repeats)
    record(
        GRAPH, "executor node: back to back", "µs/replay", lambda: back_to_back(node_graph), repeats
    )
    record(GRAPH, "host node: after 20 ms idle", "µs", lambda: after_idle(host_graph), repeats)
    record(
        GRAPH,
        f"executor node: after 20 ms idle (one thread polls every {executor.poll_us:g} µs)",
        "µs",
        lambda: after_idle(node_graph),
        repeats,
    )

    def cpu_with_graph() -> float:
        time.sleep(0.05)
        c0, w0 = time.process_time(), time.perf_counter()
        time.sleep(1.0)
        return (time.process_time() - c0) / (time.perf_counter() - w0)

    record(
        CPU,
        "idle, a graph with an executor node alive: one thread polls",
        "CPU s/s",
        cpu_with_graph,
        1,
    )
    host_graph.close()
    node_graph.close()


def baseline(group: str) -> Row | None:
    if group == ROUND_TRIP:
        return find(ROUND_TRIP, C_MEMOP)
    if group == PARALLEL:
        return find(PARALLEL, "ideal (one task after another per stream)")
    if group == ENQUEUE:
        return find(ENQUEUE, "host_launch (the driver's thread)")
    return None


def targets() -> list[Target]:
    return [
        target(
            "executor round trip <= 1.2x raw C memory operations",
            ratio(find(ROUND_TRIP, EXECUTOR), find(ROUND_TRIP, C_MEMOP)),
            1.2,
        ),
        target(
            "executor round trip <= 1.15x raw C with the batched operation (the executor's own)",
            ratio(find(ROUND_TRIP, EXECUTOR), find(ROUND_TRIP, C_BATCH)),
            1.15,
        ),
        target(
            "executor round trip / raw C with the batched operation as a safe enqueue makes it",
            ratio(find(ROUND_TRIP, EXECUTOR), find(ROUND_TRIP, C_SAFE_BATCH)),
            None,
        ),
        target(
            "executor's added time / the batched operation's (each over its loop's kernel alone)",
            _added(EXECUTOR, "kernel alone", C_BATCH, C_KERNEL),
            None,
        ),
        target(
            "the core's enqueue on the lane: its added time / the batched operation's",
            _added(CORE, "kernel alone", C_BATCH, C_KERNEL),
            None,
        ),
        target(
            "executor round trip <= 0.35x host_launch",
            ratio(find(ROUND_TRIP, EXECUTOR), find(ROUND_TRIP, HOSTFN)),
            0.35,
        ),
        target(
            "4 x 50 x 2 ms makespan on the executor <= 1.15x ideal",
            ratio(
                find(PARALLEL, "host_launch(executor=HostExecutor(threads=4))"),
                find(PARALLEL, "ideal (one task after another per stream)"),
            ),
            1.15,
        ),
    ]


def _added(row: str, kernel: str, c_row: str, c_kernel: str) -> float | None:
    """(row - kernel) / (c_row - c_kernel) in the round trip: what the executor adds to
    the Python loop's kernel launches, against what the batched operation adds to the C
    loop's.  The two targets above divide whole iterations, so the Python loop's own
    kernel launch (ctypes: 0.4-0.6 µs an iteration above the C loop's on the H200 with
    PyDLL and no argument, 1.3 µs before) counts against the executor there;
    informational."""
    rows = [find(ROUND_TRIP, name) for name in (row, kernel, c_row, c_kernel)]
    if any(r is None or r.median is None for r in rows):
        return None
    added, c_added = rows[0].median - rows[1].median, rows[2].median - rows[3].median
    return added / c_added if c_added > 0 else None


def plot_timeline(out_dir: str) -> None:
    """executor_timeline.png: the 4 streams' tasks, on the driver's thread and on the pool."""
    if not TIMELINE:
        return
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(len(TIMELINE), 1, figsize=(9, 1.6 * len(TIMELINE) + 0.8), sharex=True)
    axes = np.atleast_1d(axes)
    for ax, (label, spans) in zip(axes, TIMELINE.items(), strict=True):
        for stream_index in range(4):
            bars = [(a, w) for s, a, w in spans if s == stream_index]
            ax.broken_barh(bars, (stream_index - 0.4, 0.8), color=f"C{stream_index}")
        ax.set_yticks(range(4), [f"stream {i}" for i in range(4)], fontsize=8)
        title = (
            "host_launch: the driver's one thread"
            if label == "host_launch"
            else "host_launch(executor=HostExecutor(threads=4))"
        )
        ax.set_title(title, fontsize=9)
    axes[-1].set_xlabel("ms since the first task started (each task: 2 ms of compiled work)")
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "executor_timeline.png"), dpi=110)
    plt.close(fig)


C_ROUND_TRIP = r"""
#include <cuda.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <string.h>
#include <time.h>
extern "C" void *PyEval_SaveThread(void);      /* from the process's Python */
extern "C" void PyEval_RestoreThread(void *);

__global__ void tiny(void) {}
static void CUDA_CB empty(void *p) { (void)p; }

/* The Python rows' kernel: the same launch as the C loops below, on the stream
   set once (tiny_on), called through ctypes.PyDLL with no argument (a Python int
   converted to an argument costs more than the rest of the call); a failure is
   counted, for tiny_failures after the loop. */
static cudaStream_t tiny_stream;
static int tiny_failed;
extern "C" void tiny_on(unsigned long long stream_handle)
{
    tiny_stream = (cudaStream_t)stream_handle;
}
extern "C" void launch_tiny(void)
{
    tiny<<<1, 1, 0, tiny_stream>>>();
    if (cudaGetLastError() != cudaSuccess) ++tiny_failed;
}
extern "C" int tiny_failures(void) { int n = tiny_failed; tiny_failed = 0; return n; }

struct spinner {
    volatile unsigned *reached; volatile unsigned *done; unsigned last; volatile int stop;
};

static void *spin(void *arg)
{
    struct spinner *s = (struct spinner *)arg;
    unsigned seen = 0;
    while (seen != s->last && !s->stop) {
        unsigned r = *s->reached;
        if (r != seen) { seen = r; __sync_synchronize(); *s->done = r; }
    }
    return 0;
}

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

/* n iterations of tiny kernel -> host work -> ...; mode 0: the kernel alone;
   mode 1: cuLaunchHostFunc,
   mode 2: write "reached", a spinning thread answers, wait for "done";
   mode 3: mode 2's write and wait in one cuStreamBatchMemOp;
   mode 4: mode 3 as a safe enqueue from Python makes it: the GIL released around a
   capture check and the batch (the enqueue section's safe loop), so called with the
   GIL held (through the PyDLL handle).
   Returns microseconds per iteration (-1 on error). */
extern "C" double round_trip(unsigned long long stream_handle, int n, int mode)
{
    CUstream stream = (CUstream)stream_handle;
    unsigned *words = 0;
    pthread_t thread;
    struct spinner s;
    CUstreamBatchMemOpParams ops[2];
    memset(ops, 0, sizeof ops);
    if (mode >= 2) {
        unsigned flags = CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP;
        if (cuMemHostAlloc((void **)&words, 8, flags)) return -1.0;
        words[0] = words[1] = 0;
        s.reached = words; s.done = words + 1; s.last = (unsigned)n; s.stop = 0;
        pthread_create(&thread, 0, spin, &s);
    }
    double per = -1.0;
    double start = now_us();
    for (int i = 1; i <= n; ++i) {
        tiny<<<1, 1, 0, (cudaStream_t)stream>>>();
        if (mode == 0) {
            continue;
        } else if (mode == 1) {
            if (cuLaunchHostFunc(stream, empty, 0)) goto out;
        } else if (mode == 2) {
            if (cuStreamWriteValue32(stream, (CUdeviceptr)words, i, 0)) goto out;
            if (cuStreamWaitValue32(stream, (CUdeviceptr)(words + 1), i, CU_STREAM_WAIT_VALUE_GEQ))
                goto out;
        } else {
            ops[0].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
            ops[0].writeValue.address = (CUdeviceptr)words;
            ops[0].writeValue.value = i;
            ops[1].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
            ops[1].waitValue.address = (CUdeviceptr)(words + 1);
            ops[1].waitValue.value = i;
            ops[1].waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
            if (mode == 3) {
                if (cuStreamBatchMemOp(stream, 2, ops, 0)) goto out;
                continue;
            }
            void *thread_state = PyEval_SaveThread();
            CUstreamCaptureStatus capture;
            CUresult rc = cuStreamIsCapturing(stream, &capture);
            if (rc == CUDA_SUCCESS && capture == CU_STREAM_CAPTURE_STATUS_NONE)
                rc = cuStreamBatchMemOp(stream, 2, ops, 0);
            PyEval_RestoreThread(thread_state);
            if (rc != CUDA_SUCCESS || capture != CU_STREAM_CAPTURE_STATUS_NONE) goto out;
        }
    }
    if (cuStreamSynchronize(stream) == CUDA_SUCCESS) per = (now_us() - start) / n;
out:
    if (mode >= 2) {
        if (per < 0) {  /* a call failed: stop the spinner, then answer every wait */
            s.stop = 1;
            pthread_join(thread, 0);
            *s.done = (unsigned)n;
            cuStreamSynchronize(stream);
        } else {
            pthread_join(thread, 0);
        }
        cuMemFreeHost(words);
    }
    return per;
}
"""
_LIB = None


def _lib() -> ctypes.CDLL:
    global _LIB
    if _LIB is None:
        _LIB = build_with_nvcc(C_ROUND_TRIP, "round_trip")
        _LIB.round_trip.argtypes = (ctypes.c_ulonglong, ctypes.c_int, ctypes.c_int)
        _LIB.round_trip.restype = ctypes.c_double
        # The Python rows' kernel, called with the GIL held (PyDLL): it is the loop's
        # own overhead, not what the rows compare, so it is made as cheap as ctypes
        # allows (no argument to convert, no GIL to release and take back).
        with_gil = ctypes.PyDLL(_LIB._name)
        for name, restype in (
            ("tiny_on", None),
            ("launch_tiny", None),
            ("tiny_failures", ctypes.c_int),
        ):
            getattr(with_gil, name).restype = restype
        with_gil.tiny_on.argtypes = (ctypes.c_ulonglong,)
        with_gil.launch_tiny.argtypes = with_gil.tiny_failures.argtypes = ()
        # Mode 4 releases and takes back the GIL itself, at each iteration.
        with_gil.round_trip.argtypes = _LIB.round_trip.argtypes
        with_gil.round_trip.restype = ctypes.c_double
        _LIB.with_gil = with_gil
    return _LIB


class _TinyKernel:
    """``tiny<<<1, 1, 0, stream>>>()``, the C loops' own kernel launch, from Python:
    ``launch`` is the ctypes function itself (no Python frame around it), on the
    stream that ``on()`` sets; ``check()`` raises if a launch since failed."""

    def __init__(self, stream) -> None:
        self.lib = _lib().with_gil
        self.handle = int(stream.handle)
        self.launch = self.lib.launch_tiny

    def on(self) -> None:
        self.lib.tiny_on(self.handle)

    def check(self) -> None:
        failed = self.lib.tiny_failures()
        if failed:
            raise RuntimeError(f"{failed} launches of the tiny kernel failed")


def _c_round_trip(stream, n: int, mode: int) -> float:
    stream.sync()
    lib = _lib()
    loop = lib.with_gil.round_trip if mode == 4 else lib.round_trip
    per = loop(int(stream.handle), n, mode)
    if per < 0:
        raise RuntimeError("a driver call failed in the C round trip")
    return per
