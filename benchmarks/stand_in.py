"""The native core's host time on a stand-in driver: no GPU, for a profiler.

    python benchmarks/stand_in.py                        # every row, 15 rounds
    perf record -g python benchmarks/stand_in.py --only executor --rounds 200
    python benchmarks/stand_in.py --threads 1 --n 2000

An H200 image has no ``perf``, so where a launch's host time goes is found here: the
CUDA route of the native core (``host_launch``'s fast path, ``_core.enqueue``, an
executor's lane) runs against a driver table of C stand-ins, built with the machine's C
compiler and loaded with ``_core.driver_load``, whose calls return at once:
``cuStreamIsCapturing`` says "not capturing", ``cuStreamGetCtx`` gives one context,
``cuLaunchHostFunc`` queues its host function (run, and the records drained, after each
sample: the stream is "held" while a loop runs, as the enqueue section holds it), and
``cuStreamBatchMemOp`` writes an executor task's "reached" word at once (a stream that
is there already: the pool's threads run the task while the loop goes on, as on an idle
stream).  The watchdog is on, as on CUDA (each launch notes its context).  A stream is a
Python class whose ``__cuda_stream__`` gives one handle (registered as the CUDA stream
type), so its row costs more than cuda.core's.

What it cannot show: the driver's own time (a stand-in costs a few nanoseconds; on the
H200 ``cuStreamIsCapturing`` and ``cuStreamGetCtx`` take about 29 ns each,
``cuLaunchHostFunc`` about 0.4 µs behind a held stream: docs/benchmarks.md), nor the
H200 host's cache latencies.  Each row is the median over rounds of N calls, in µs a
call; the rows are interleaved, one sample each per round.  Linux, with a C compiler
(``cc``, or ``$CC``) and a source checkout (the stand-ins use the core's own
``driver.h`` for cuda.h's layouts: beside this folder, or where
``NUMBA_HOSTFN_SOURCE_TREE`` says); the process runs on the simulator backend, rewired, and leaves
with ``os._exit`` once the report is printed.
"""

from __future__ import annotations

import argparse
import ctypes
import operator
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))

STAND_INS = r"""
#include <stddef.h>
#include <stdint.h>

#include "driver.h" /* the core's own copy of cuda.h's layouts (numba_hostfn/native) */

typedef void (*hostfn)(void *);

int stand_in_zero(void) { return 0; }
int stand_in_is_capturing(void *stream, int *status) { (void)stream; *status = 0; return 0; }
int stand_in_get_ctx(void *stream, void **ctx) { (void)stream; *ctx = (void *)0x1000; return 0; }
int stand_in_get_current(void **ctx) { *ctx = (void *)0x1000; return 0; }
int stand_in_exchange_mode(int *mode) { *mode = 0; return 0; }

/* cuLaunchHostFunc: queued, run by stand_in_run_queued (the stream "held" till then). */
#define QUEUE (1 << 20)
static hostfn queued_fn[QUEUE];
static void *queued_arg[QUEUE];
static size_t queued;

int stand_in_launch(void *stream, hostfn fn, void *arg) {
    (void)stream;
    if (queued == QUEUE)
        return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
    queued_fn[queued] = fn;
    queued_arg[queued++] = arg;
    return 0;
}

size_t stand_in_run_queued(void) {
    size_t n = queued;
    for (size_t i = 0; i < n; i++)
        queued_fn[i](queued_arg[i]);
    queued = 0;
    return n;
}

static void write_word(uint64_t address, uint32_t value) {
    __atomic_store_n((uint32_t *)(uintptr_t)address, value, __ATOMIC_RELEASE);
}

/* The stream is there already: a write of "reached" lands at once, a wait is left to
   the pool's thread (which writes "done"). */
int stand_in_batch(void *stream, unsigned count, nhf_cu_batch_mem_op_params *ops,
                   unsigned flags) {
    (void)stream, (void)flags;
    for (unsigned i = 0; i < count; i++)
        if (ops[i].operation == CU_STREAM_MEM_OP_WRITE_VALUE_32)
            write_word(ops[i].value_op.address, ops[i].value_op.value);
    return 0;
}

int stand_in_write(void *stream, uint64_t address, uint32_t value, unsigned flags) {
    (void)stream, (void)flags;
    write_word(address, value);
    return 0;
}
"""

# The table's entries that have a stand-in of their own; every other one answers 0.
SPECIAL = {
    "cuStreamIsCapturing": "stand_in_is_capturing",
    "cuStreamGetCtx": "stand_in_get_ctx",
    "cuCtxGetCurrent": "stand_in_get_current",
    "cuThreadExchangeStreamCaptureMode": "stand_in_exchange_mode",
    "cuLaunchHostFunc": "stand_in_launch",
    "cuStreamBatchMemOp": "stand_in_batch",
    "cuStreamWriteValue32": "stand_in_write",
}
HANDLE = 0x7F1234567000  # the stand-in stream's handle: a value, never dereferenced


def build() -> ctypes.CDLL:
    """The stand-ins, compiled with ``$CC`` or ``cc`` (-O2 -g) into a shared object,
    against the checkout's ``numba_hostfn/native/driver.h``."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc or not shutil.which(cc.split()[0]):
        raise SystemExit("stand_in.py needs a C compiler (cc, or $CC)")
    # A copy of benchmarks/ beside an installed wheel (.ci/gpu wheel) reads the sources
    # where NUMBA_HOSTFN_SOURCE_TREE says, as the tests marked checkout do.
    tree = os.environ.get("NUMBA_HOSTFN_SOURCE_TREE") or os.path.dirname(HERE)
    native = os.path.join(tree, "numba_hostfn", "native")
    if not os.path.isfile(os.path.join(native, "driver.h")):
        raise SystemExit(
            f"stand_in.py needs a source checkout: no driver.h in {native} (run it from a "
            "checkout, or set NUMBA_HOSTFN_SOURCE_TREE to one)"
        )
    folder = tempfile.mkdtemp(prefix="nhf-stand-in-")
    source, library = os.path.join(folder, "stand_in.c"), os.path.join(folder, "stand_in.so")
    with open(source, "w") as f:
        f.write(STAND_INS)
    subprocess.run(
        [*cc.split(), "-O2", "-g", "-shared", "-fPIC", f"-I{native}", source, "-o", library],
        check=True,
    )
    lib = ctypes.CDLL(library)
    lib.stand_in_run_queued.restype = ctypes.c_size_t
    return lib


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15, help="samples of each row")
    parser.add_argument("--n", type=int, default=20_000, help="calls a sample")
    parser.add_argument("--threads", type=int, default=4, help="the executor's threads")
    parser.add_argument(
        "--only", action="append", choices=("enqueue", "executor"), help="a group of rows"
    )
    args = parser.parse_args(argv)
    groups = set(args.only or ("enqueue", "executor"))

    os.environ["NUMBA_HOSTFN_SIMULATOR"] = "1"  # the backend this process rewires
    sys.path.insert(0, HERE)
    import numpy as np
    from _bench import call_loop, compiled_functions

    import numba_hostfn as nh
    from numba_hostfn import _core

    lib = build()
    empty, _ = compiled_functions(nh)
    # The executor makes the (simulator) backend, which configures the watchdog and
    # host_launch's fast path for its own streams: both are rewired after it.
    executor = nh.HostExecutor(threads=args.threads)
    address = lambda name: ctypes.cast(getattr(lib, name), ctypes.c_void_p).value  # noqa: E731
    table = tuple(
        address(SPECIAL.get(name, "stand_in_zero")) for name, _ in _core.driver_entry_points()
    )
    _core.driver_load(table)
    _core.watchdog_configure(_core.ROUTE_CUDA)  # as on CUDA: each launch notes its context

    class Stream:
        """A CUDA stream as host_launch sees one: its handle through the protocol."""

        def __cuda_stream__(self):
            return (0, HANDLE)

    stream = Stream()
    _core.configure_launch(
        route=_core.ROUTE_CUDA, executor_route=_core.ROUTE_CUDA_LANE, cuda_stream_type=Stream
    )
    words = np.zeros(16, np.uint32)  # the lane's "reached" and "done"
    lane = executor._lane_new(HANDLE, words.ctypes.data)
    n = args.n
    host_launch, enqueue = nh.host_launch, _core.enqueue
    route, lane_route, run = _core.ROUTE_CUDA, _core.ROUTE_CUDA_LANE, _core.RUN_COMPILED
    fn_address = empty.address
    owner = _core.launch_owner(empty, None, None, executor)

    def noop():
        pass

    def executor_launches():  # a keyword: its own loop, as call_loop takes none
        for _ in range(n):
            host_launch(stream, empty, executor=executor)

    # Each a loop of plain calls (call_loop): no lambda's frame in the timed calls.
    launches = (host_launch, (stream, empty))
    callables = (host_launch, (stream, noop))
    core = (enqueue, (route, HANDLE, run, fn_address, 0, empty))
    protocol = (stream.__cuda_stream__, ())
    floor = (operator.is_, (stream, empty))
    lane_core = (enqueue, (lane_route, lane, run, fn_address, 0, owner))

    rows = {}
    if "enqueue" in groups:
        rows.update(
            {
                "host_launch(stream, HostFunction)": launches,
                "host_launch(stream, Python callable)": callables,
                "_core.enqueue(ROUTE_CUDA, handle, RUN_COMPILED, address, 0, fn)": core,
                "stream.__cuda_stream__() (a Python method here)": protocol,
                "the loop's floor (operator.is_)": floor,
            }
        )
    if "executor" in groups:
        rows.update(
            {
                "host_launch(stream, HostFunction, executor=), reached at once": (
                    executor_launches,
                    None,
                ),
                "_core.enqueue(ROUTE_CUDA_LANE, lane, ...), reached at once": lane_core,
            }
        )
    samples: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(args.rounds):
        for name, (fn, fn_args) in rows.items():
            start = time.perf_counter()
            if fn_args is None:
                fn()
            else:
                call_loop(fn, fn_args, n)
            samples[name].append((time.perf_counter() - start) / n * 1e6)
            lib.stand_in_run_queued()  # the "held" stream goes on
            while executor.outstanding():
                time.sleep(0.0005)
            nh.drain()
    counts = _core.launch_counts()
    print(
        f"stand-in driver, the watchdog on, {args.threads} executor threads, "
        f"{args.rounds} rounds of {n} calls"
    )
    print("\n| row | median µs a call | min |\n| --- | ---: | ---: |")
    for name, values in samples.items():
        print(f"| {name} | {statistics.median(values):.3f} | {min(values):.3f} |")
    print(f"\nfast launches by kind: {counts}")
    sys.stdout.flush()
    os._exit(0)  # the process's backend was rewired: no exit hooks to run against it


if __name__ == "__main__":
    main()
