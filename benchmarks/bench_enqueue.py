"""Section enqueue: the cost of one enqueue call.

From a loop of N calls timed on the host (the stream is held by device work so that
nothing runs meanwhile), the rows interleaved, one loop of each per round:
host_launch with a HostFunction, a ctypes CUhostFn and a Python callable; the same
loop calling a builtin that does nothing (the floor of any call from Python); the
core's enqueue alone, given what host_launch finds, and stream.__cuda_stream__() alone
(where host_launch's time goes); a C loop
over cuLaunchHostFunc (built with nvcc if present), and the same C loop doing what any
enqueue from Python must also do (check that the stream is not capturing, release the
GIL around the driver's calls, as host_launch does: invariants 8 and 10); cuda.bindings.driver's
cuLaunchHostFunc; ctypes straight to libcuda; CuPy's Stream.launch_host_func;
numba-cuda's Stream.add_callback (once; a failure is reported as a row).  Ratios
are to the raw C loop.
"""

from __future__ import annotations

import ctypes
import operator
import time

from _bench import (
    ROWS,
    Gate,
    Row,
    Target,
    build_with_nvcc,
    call_loop,
    check_enqueue,
    compiled_functions,
    cupy_stream,
    find,
    interleaved,
    noop,
    noop_arg,
    noop_cb,
    ratio,
    record,
    target,
)

GROUP = "enqueue"
RAW_C_LOOP = "raw C loop over cuLaunchHostFunc"
SAFE_C_LOOP = "C loop with the capture check and the GIL released"
# The safe loop plus the one driver call every watched enqueue adds (invariant 23):
# the stream's context, asked at the enqueue, for the watchdog that fails the
# launch's waits when that context faults.
WATCHED_C_LOOP = "the safe C loop with the fault watch's cuStreamGetCtx"
NUMBA_CUDA = "numba-cuda add_callback"
CALL_FLOOR = "a Python loop calling a builtin that does nothing (operator.is_)"
# Where host_launch's time goes (each a row, interleaved with the rest): the core's
# enqueue that host_launch calls, given what host_launch finds (the route, the
# stream's handle, the trampoline, the address, no user data, the owner), and the
# stream protocol call that host_launch makes to find the handle.
CORE_ENQUEUE = (
    "the core's enqueue alone: _core.enqueue(route, handle, RUN_COMPILED, address, 0, fn)"
)
STREAM_PROTOCOL = "stream.__cuda_stream__() alone"
PLOTS = [(GROUP, "enqueue.png")]


def run(nh, device, n: int, repeats: int) -> None:
    empty, _ = compiled_functions(nh)
    stream = device.create_stream()
    gate = Gate(device)

    def per_call(fn, *args) -> float:
        """µs per ``fn(*args)``, called as a program would: straight from a loop."""
        gate.close_on(stream)
        try:
            start = time.perf_counter()
            call_loop(fn, args, n)
            elapsed = time.perf_counter() - start
        finally:  # a failing row must not leave the stream held (and the device busy)
            gate.open()
            stream.sync()
            nh.drain()
        return elapsed / n * 1e6

    pointer = empty.ctypes
    from numba_hostfn import _core

    # The core's route and target for this stream, as host_launch finds them (a
    # package from before the core's routes, an A/B's older side: the row's note).
    try:
        route, target_handle = (
            (_core.ROUTE_SIM, stream.__cuda_stream__()[1])
            if device.simulator
            else (_core.ROUTE_CUDA, int(stream.handle))
        )
        core = (route, target_handle, _core.RUN_COMPILED, empty.address, 0, empty)
    except AttributeError as exc:
        core = None
        no_core = f"this package has no core enqueue with routes ({exc})"
    else:
        check_enqueue(nh, stream, core, "the benchmark's stream")
    rows = {
        "host_launch(HostFunction)": lambda: per_call(nh.host_launch, stream, empty),
        "host_launch(ctypes CUhostFn)": lambda: per_call(nh.host_launch, stream, pointer),
        "host_launch(Python callable)": lambda: per_call(nh.host_launch, stream, noop),
        # The floor of any enqueue called from Python: the loop and the call alone.
        CALL_FLOOR: lambda: per_call(operator.is_, stream, empty),
        CORE_ENQUEUE: lambda: per_call(_core.enqueue, *core),
        STREAM_PROTOCOL: lambda: per_call(stream.__cuda_stream__),
    }
    if core is None:
        del rows[CORE_ENQUEUE]
        ROWS.append(Row(GROUP, CORE_ENQUEUE, "µs/call", note=no_core))
    # No executor row here: behind the closed gate, executor launches (stream memory
    # operations) block the enqueuing thread, which is the one that opens the gate.
    # On the H200 1,000 of them hung this section (docs/executor.md, Limits).
    peers = (
        RAW_C_LOOP,
        SAFE_C_LOOP,
        WATCHED_C_LOOP,
        "cuda.bindings cuLaunchHostFunc",
        "ctypes -> libcuda cuLaunchHostFunc",
        "CuPy launch_host_func",
    )
    if device.simulator:
        _interleave(rows, repeats)
        for name in (*peers, NUMBA_CUDA):
            ROWS.append(Row(GROUP, name, "µs/call", note="needs a GPU"))
        stream.close()
        return
    handle = int(stream.handle)
    from cuda.bindings import driver

    fn_obj = driver.CUhostFn(empty.address)
    cu_stream = driver.CUstream(handle)
    libcuda = ctypes.CDLL("libcuda.so.1")
    launch = libcuda.cuLaunchHostFunc
    launch.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
    launch.restype = ctypes.c_int
    address = empty.address
    cupy = []  # made at its first sample: a failure to import CuPy is that row's note

    def cupy_row():
        if not cupy:
            cupy.append(cupy_stream(stream))
        return per_call(cupy[0].launch_host_func, noop_arg, None)

    rows.update(
        {
            RAW_C_LOOP: lambda: raw_c_loop(gate, stream, n),
            SAFE_C_LOOP: lambda: raw_c_loop(gate, stream, n, safe=True),
            WATCHED_C_LOOP: lambda: raw_c_loop(gate, stream, n, safe=True, watched=True),
            "cuda.bindings cuLaunchHostFunc": lambda: per_call(
                driver.cuLaunchHostFunc, cu_stream, fn_obj, 0
            ),
            "ctypes -> libcuda cuLaunchHostFunc": lambda: per_call(launch, handle, address, None),
            "CuPy launch_host_func": cupy_row,
        }
    )
    _interleave(rows, repeats)

    def numba_cuda_row():
        from numba import cuda

        ns = cuda.external_stream(handle)
        return per_call(ns.add_callback, noop_cb, None)

    record(GROUP, NUMBA_CUDA, "µs/call", numba_cuda_row, 1)
    stream.close()


def _interleave(rows: dict, repeats: int) -> None:
    """Every row once per round: the C loop's baseline drifts with the rest."""
    table = [Row(GROUP, name, "µs/call") for name in rows]
    interleaved(GROUP, table, lambda row: rows[row.name](), repeats)


def baseline(group: str) -> Row | None:
    return find(GROUP, RAW_C_LOOP) if group == GROUP else None


def targets() -> list[Target]:
    """Issue 35's targets (issue 25's were 1.35x), against the C loop that does what
    any safe enqueue from Python must (issue 15 found the bare C loop below any of
    them); the bare loop's ratios are kept beside them, informational."""
    safe, bare = find(GROUP, SAFE_C_LOOP), find(GROUP, RAW_C_LOOP)
    rows = (
        ("HostFunction", "host_launch(HostFunction)", 1.3),
        ("Python callable", "host_launch(Python callable)", 1.3),
        ("ctypes CUhostFn", "host_launch(ctypes CUhostFn)", 1.5),
    )
    out = [
        target(f"{name} enqueue <= {limit}x safe C loop", ratio(find(GROUP, row), safe), limit)
        for name, row, limit in rows
    ]
    out += [
        target(f"{name} enqueue / bare C loop", ratio(find(GROUP, row), bare), None)
        for name, row, _ in rows
    ]
    # Informational: the split of the HostFunction's enqueue above the safe loop.
    core, watched = find(GROUP, CORE_ENQUEUE), find(GROUP, WATCHED_C_LOOP)
    out += [
        target("the safe C loop with the fault watch / safe C loop", ratio(watched, safe), None),
        target("the core's enqueue / safe C loop", ratio(core, safe), None),
        target(
            "the core's enqueue / the safe C loop with the fault watch", ratio(core, watched), None
        ),
        target(
            "host_launch(HostFunction) / the core's enqueue",
            ratio(find(GROUP, "host_launch(HostFunction)"), core),
            None,
        ),
    ]
    return out


C_LOOP = r"""
#include <cuda.h>
#include <time.h>
extern "C" void *PyEval_SaveThread(void);      /* from the process's Python */
extern "C" void PyEval_RestoreThread(void *);
static void CUDA_CB empty(void *p) { (void)p; }
static double since(const struct timespec *a, int n)
{
    struct timespec b;
    clock_gettime(CLOCK_MONOTONIC, &b);
    return ((b.tv_sec - a->tv_sec) * 1e9 + (b.tv_nsec - a->tv_nsec)) / n / 1e3;
}
/* n enqueues of an empty host function; returns microseconds per call (-1 on error). */
extern "C" double loop(unsigned long long stream, int n)
{
    struct timespec a;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int i = 0; i < n; ++i)
        if (cuLaunchHostFunc((CUstream)stream, empty, 0) != CUDA_SUCCESS) return -1.0;
    return since(&a, n);
}
/* The same, as an enqueue from Python must do it (called with the GIL held): the
   GIL released around a capture check and the launch, every call. */
extern "C" double safe_loop(unsigned long long stream, int n)
{
    struct timespec a;
    CUstreamCaptureStatus capture;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int i = 0; i < n; ++i) {
        void *thread = PyEval_SaveThread();
        CUresult rc = cuStreamIsCapturing((CUstream)stream, &capture);
        if (rc == CUDA_SUCCESS && capture == CU_STREAM_CAPTURE_STATUS_NONE)
            rc = cuLaunchHostFunc((CUstream)stream, empty, 0);
        PyEval_RestoreThread(thread);
        if (rc != CUDA_SUCCESS || capture != CU_STREAM_CAPTURE_STATUS_NONE) return -1.0;
    }
    return since(&a, n);
}
/* The safe loop with the stream's context asked before each launch, as a watched
   enqueue asks it for the watchdog (nhf_watch_prepare). */
extern "C" double watched_loop(unsigned long long stream, int n)
{
    struct timespec a;
    CUstreamCaptureStatus capture;
    CUcontext ctx;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int i = 0; i < n; ++i) {
        void *thread = PyEval_SaveThread();
        CUresult rc = cuStreamIsCapturing((CUstream)stream, &capture);
        if (rc == CUDA_SUCCESS && capture == CU_STREAM_CAPTURE_STATUS_NONE)
            rc = cuStreamGetCtx((CUstream)stream, &ctx);
        if (rc == CUDA_SUCCESS && capture == CU_STREAM_CAPTURE_STATUS_NONE)
            rc = cuLaunchHostFunc((CUstream)stream, empty, 0);
        PyEval_RestoreThread(thread);
        if (rc != CUDA_SUCCESS || capture != CU_STREAM_CAPTURE_STATUS_NONE) return -1.0;
    }
    return since(&a, n);
}
"""
_C_LOOPS: list = []  # (loop, safe_loop, watched_loop), built once


def raw_c_loop(gate, stream, n: int, safe: bool = False, watched: bool = False) -> float:
    """A C loop, built with nvcc as a shared library and called once through ctypes
    (``safe_loop`` and ``watched_loop`` through ``ctypes.PyDLL``: they are called
    with the GIL held)."""
    if not _C_LOOPS:
        lib = build_with_nvcc(C_LOOP, "loop")
        with_gil = ctypes.PyDLL(lib._name)
        loops = (lib.loop, with_gil.safe_loop, with_gil.watched_loop)
        for fn in loops:
            fn.argtypes = (ctypes.c_ulonglong, ctypes.c_int)
            fn.restype = ctypes.c_double
        _C_LOOPS.extend(loops)
    gate.close_on(stream)
    try:
        per_call = _C_LOOPS[2 if watched else int(safe)](int(stream.handle), n)
    finally:
        gate.open()
        stream.sync()
    if per_call < 0:
        raise RuntimeError("cuLaunchHostFunc failed in the C loop")
    return per_call
