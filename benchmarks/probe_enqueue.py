"""Where one ``host_launch(stream, HostFunction)`` spends its time, segment by segment.

    python benchmarks/probe_enqueue.py                 # 9 rounds of 20,000 launches
    python benchmarks/probe_enqueue.py --n 2000 --rounds 3

An H200 image has no ``perf``; this needs none.  A copy of the package's sources is
made in a temporary folder, a probe (a read of the CPU's time-stamp counter, ``rdtsc``)
is put at each point of ``PROBES`` on the native launch path (``host_launch.c``,
``enqueue.c``, ``cuda.c``), and the copy is built in place with this Python.  A child
process then launches a compiled empty host function N times a round on a stream held
by device work (the enqueue section's ``Gate``: nothing runs meanwhile) and reads, for
each segment between two probes, the cycles it took, in ns at the counter's rate
(measured against ``time.perf_counter``).  Segment 0 runs from the last probe of one
call to the first of the next: the return, the Python loop and the call into
``host_launch``.  A second child, on the package as built here (no probes), times the
same loop and, on a GPU, the enqueue section's safe C loops beside it: the probes' own
cost is the difference between the two walls.

Each probe costs a counter read and two adds (an H100 host: about 25 ns, the smallest
segments' figure): the table gives each segment's median over rounds and that less the
smallest median, which is about the probe.  On the simulator the driver's segments
(``cuda.c``) are not reached: segment 13 is then the whole simulated enqueue, and the
stream's ``__cuda_stream__`` a Python method.  x86-64 only (``__rdtsc``); needs a C compiler and a
source checkout (the sources beside this folder).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

#: The probes' storage and macro, added to nhf.h (before its last #endif).
HEADER = r"""
#include <x86intrin.h>
extern unsigned long long nhf_probe_sum[32], nhf_probe_n[32], nhf_probe_last;
#define PROBE(i)                                                                           \
    do {                                                                                   \
        unsigned long long now_ = __rdtsc();                                               \
        nhf_probe_sum[i] += now_ - nhf_probe_last;                                         \
        nhf_probe_n[i]++;                                                                  \
        nhf_probe_last = now_;                                                             \
    } while (0)
"""

#: probe_take() -> (sums, counts), reset; probe_tsc() -> the counter (host_launch.c).
BUILTINS = r"""
unsigned long long nhf_probe_sum[32], nhf_probe_n[32], nhf_probe_last;

static PyObject *py_probe_take(PyObject *m, PyObject *u) {
    (void)m, (void)u;
    PyObject *sums = PyList_New(32), *counts = PyList_New(32);
    if (sums == NULL || counts == NULL)
        return NULL;
    for (int i = 0; i < 32; i++) {
        PyList_SET_ITEM(sums, i, PyLong_FromUnsignedLongLong(nhf_probe_sum[i]));
        PyList_SET_ITEM(counts, i, PyLong_FromUnsignedLongLong(nhf_probe_n[i]));
        nhf_probe_sum[i] = nhf_probe_n[i] = 0;
    }
    nhf_probe_last = __rdtsc();
    return Py_BuildValue("(NN)", sums, counts);
}

static PyObject *py_probe_tsc(PyObject *m, PyObject *u) {
    (void)m, (void)u;
    return PyLong_FromUnsignedLongLong(__rdtsc());
}

static PyMethodDef methods[] = {
    {"probe_take", py_probe_take, METH_NOARGS, NULL},
    {"probe_tsc", py_probe_tsc, METH_NOARGS, NULL},
"""

#: (segment, what it times, file, source text, the text with its probe).  Each source
#: text must occur in its file (tests/test_benchmarks.py checks that they all do), and
#: the segments are listed in the order a launch reaches their probes.
PROBES = [
    (0, "the return, the Python loop and the call into host_launch", "host_launch.c",
     "    (void)self;\n    PyObject *data = Py_None, *executor = Py_None, *answer = NULL;",
     "    (void)self;\n    PROBE(0);\n"
     "    PyObject *data = Py_None, *executor = Py_None, *answer = NULL;"),
    (1, "host_launch's argument checks", "host_launch.c",
     "    switch (fast_launch(args[0], args[1], data, executor, &answer)) {",
     "    PROBE(1);\n    switch (fast_launch(args[0], args[1], data, executor, &answer)) {"),
    (2, "stream.__cuda_stream__() (stream_handle)", "host_launch.c",
     "    if (!stream_handle(stream, &handle, answer))\n        return PyErr_Occurred() ? -1 : 1;",
     "    if (!stream_handle(stream, &handle, answer))\n        return PyErr_Occurred() ? -1 : 1;\n"
     "    PROBE(2);"),
    (3, "function_kind, user_data, the executor", "host_launch.c",
     "    target = handle;",
     "    PROBE(3);\n    target = handle;"),
    (4, "the lane, nhf_launch_owner", "host_launch.c",
     "    nhf_hostfn trampoline = info->run;",
     "    PROBE(4);\n    nhf_hostfn trampoline = info->run;"),
    (5, "into nhf_enqueue_record", "enqueue.c",
     "    nhf_record *record = nhf_record_take(fn, arg, owner);\n"
     "    if (record == NULL)\n        return NHF_NO_RECORD;",
     "    PROBE(5);\n    nhf_record *record = nhf_record_take(fn, arg, owner);\n"
     "    if (record == NULL)\n        return NHF_NO_RECORD;\n    PROBE(6);"),
    (6, "nhf_record_take", "enqueue.c", None, None),
    (7, "the record's context, its state read", "enqueue.c",
     "    Py_BEGIN_ALLOW_THREADS\n    /* The stream a device fault",
     "    PROBE(7);\n    Py_BEGIN_ALLOW_THREADS\n    PROBE(8);\n    /* The stream a device fault"),
    (8, "the GIL released (PyEval_SaveThread)", "enqueue.c", None, None),
    (9, "nhf_watch_prepare (cuStreamGetCtx)", "enqueue.c",
     "    status = lane_fn != NULL ? lane_fn(target, trampoline, record, NULL, released)\n"
     "                             : enqueue_fn(target, trampoline, record);\n"
     "    Py_END_ALLOW_THREADS\n",
     "    PROBE(9);\n"
     "    status = lane_fn != NULL ? lane_fn(target, trampoline, record, NULL, released)\n"
     "                             : enqueue_fn(target, trampoline, record);\n"
     "    PROBE(13);\n    Py_END_ALLOW_THREADS\n    PROBE(14);\n"),
    (10, "nhf_fault_of_stream", "cuda.c",
     "    int capture = 0;\n    int rc = NHF_CU(cuStreamIsCapturing)(stream, &capture);",
     "    int capture = 0;\n    PROBE(10);\n"
     "    int rc = NHF_CU(cuStreamIsCapturing)(stream, &capture);\n    PROBE(11);"),
    (11, "cuStreamIsCapturing", "cuda.c", None, None),
    (12, "cuLaunchHostFunc", "cuda.c",
     "    return (uint32_t)NHF_CU(cuLaunchHostFunc)(stream, trampoline, record);\n}",
     "    uint32_t launched = (uint32_t)NHF_CU(cuLaunchHostFunc)(stream, trampoline, record);\n"
     "    PROBE(12);\n    return launched;\n}"),
    (13, "back from the enqueue function", "enqueue.c", None, None),
    (14, "the GIL taken back (PyEval_RestoreThread)", "enqueue.c", None, None),
    (15, "nhf_watch_enqueued (its compare-and-swap)", "enqueue.c",
     "        nhf_watch_enqueued(record, taken);\n",
     "        nhf_watch_enqueued(record, taken);\n    PROBE(15);\n"),
    (16, "the drain's check, the lane's releases", "enqueue.c",
     "    if (python)\n        nhf_enqueue_note_task(task);\n    return status;",
     "    if (python)\n        nhf_enqueue_note_task(task);\n    PROBE(16);\n    return status;"),
    (17, "back in host_launch", "host_launch.c",
     "    nhf_count_launch(kind);\n    if (pool != NULL)",
     "    PROBE(17);\n    nhf_count_launch(kind);\n    if (pool != NULL)"),
    (18, "the counts, the references dropped", "host_launch.c",
     "    Py_XDECREF(owner);\n    Py_XDECREF(data_owner);\n    return outcome;",
     "    Py_XDECREF(owner);\n    Py_XDECREF(data_owner);\n    PROBE(18);\n    return outcome;"),
    (19, "to host_launch's return", "host_launch.c",
     "    case 0:\n        Py_XDECREF(answer);\n        Py_RETURN_NONE;",
     "    case 0:\n        Py_XDECREF(answer);\n        PROBE(19);\n        Py_RETURN_NONE;"),
    (None, "the builtins", "host_launch.c",
     "static PyMethodDef methods[] = {\n", BUILTINS),
]  # fmt: skip


def apply_probes(native: str) -> None:
    """Insert the probes into the core's sources in the folder ``native`` (a copy)."""
    header = os.path.join(native, "nhf.h")
    with open(header) as f:
        text = f.read()
    end = text.rstrip().rfind("#endif")
    if end < 0:
        raise RuntimeError("nhf.h has no closing #endif: the probes' header has no place")
    with open(header, "w") as f:
        f.write(text[:end] + HEADER + text[end:])
    for segment, _what, name, old, new in PROBES:
        if old is None:
            continue  # probed by the row above it
        path = os.path.join(native, name)
        with open(path) as f:
            text = f.read()
        if text.count(old) != 1:
            raise RuntimeError(
                f"probe {segment} ({name}): its source text occurs {text.count(old)} times, "
                "not once; update PROBES in benchmarks/probe_enqueue.py to the code"
            )
        with open(path, "w") as f:
            f.write(text.replace(old, new))


def build_probed(into: str) -> str:
    """A probed copy of the package's sources in ``into``, built in place; its root."""
    tree = os.path.join(into, "tree")
    ignore = shutil.ignore_patterns("*.so", "__pycache__", "build")
    shutil.copytree(
        os.path.join(ROOT, "numba_hostfn"), os.path.join(tree, "numba_hostfn"), ignore=ignore
    )
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "LICENSE"):
        if os.path.exists(os.path.join(ROOT, name)):
            shutil.copy(os.path.join(ROOT, name), tree)
    apply_probes(os.path.join(tree, "numba_hostfn", "native"))
    build = subprocess.run(
        [sys.executable, "-c", "from setuptools import setup; setup()", "build_ext", "--inplace"],
        cwd=tree,
        capture_output=True,
        text=True,
    )
    if build.returncode != 0:
        raise RuntimeError("the probed copy did not build:\n" + build.stdout + build.stderr)
    return tree


def child(n: int, rounds: int) -> None:
    """In the child (cwd: the package to time): the loop, the probes, JSON out."""
    sys.path[:0] = [os.getcwd(), HERE]
    from _bench import Gate, compiled_functions

    import numba_hostfn as nh
    from numba_hostfn import _core
    from numba_hostfn._demodevice import Device

    probed = hasattr(_core, "probe_take")
    device = Device()
    stream = device.create_stream()
    gate = Gate(device)
    empty, _ = compiled_functions(nh)
    launch = nh.host_launch
    raw_c_loop = None
    if not device.simulator:
        from bench_enqueue import raw_c_loop
    ghz = 1.0
    if probed:
        start, count = time.perf_counter(), _core.probe_tsc()
        time.sleep(0.2)
        ghz = (_core.probe_tsc() - count) / (time.perf_counter() - start) / 1e9
    walls, loops, segments = [], [], {}
    for _ in range(rounds):
        gate.close_on(stream)
        if probed:
            _core.probe_take()
        start = time.perf_counter()
        for _ in range(n):
            launch(stream, empty)
        walls.append((time.perf_counter() - start) / n * 1e6)
        sums, counts = _core.probe_take() if probed else ([], [])
        gate.open()
        stream.sync()
        nh.drain()
        for segment, count in enumerate(counts):
            if count:
                segments.setdefault(segment, []).append(sums[segment] / count / ghz)
        if raw_c_loop is not None:
            loops.append(
                (
                    raw_c_loop(gate, stream, n, safe=True),
                    raw_c_loop(gate, stream, n, safe=True, watched=True),
                )
            )
    report = {"probed": probed, "ghz": ghz, "walls": walls, "loops": loops}
    print(json.dumps({**report, "segments": segments, "core": _core.__file__}))


def _run_child(cwd: str, n: int, rounds: int) -> dict:
    run = subprocess.run(
        [
            sys.executable,
            os.path.abspath(__file__),
            "--child",
            "--n",
            str(n),
            "--rounds",
            str(rounds),
        ],
        cwd=cwd,
        capture_output=True,
        text=True,
    )
    if run.returncode != 0:
        raise RuntimeError(f"the child in {cwd} failed:\n{run.stdout}{run.stderr}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20000, help="launches a round")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.n, args.rounds)
        return
    if platform.machine() not in ("x86_64", "AMD64"):
        sys.exit("probe_enqueue.py reads the x86-64 time-stamp counter (rdtsc): x86-64 only")
    with tempfile.TemporaryDirectory(prefix="nhf-probe-") as scratch:
        probed = _run_child(build_probed(scratch), args.n, args.rounds)
    plain = _run_child(ROOT, args.n, args.rounds)
    print(f"## host_launch(stream, HostFunction), probed ({probed['ghz']:.3f} GHz counter)\n")
    print(
        f"- {args.rounds} rounds of {args.n} launches on a held stream; "
        "µs a launch, median (min-max)"
    )
    print(f"- without probes: {_spread(plain['walls'])}; with: {_spread(probed['walls'])}")
    if plain["loops"]:
        safe = [a for a, _ in plain["loops"]]
        watched = [b for _, b in plain["loops"]]
        ratio = statistics.median(plain["walls"]) / statistics.median(safe)
        print(
            f"- the safe C loop {_spread(safe)}, with the fault watch {_spread(watched)}; "
            f"host_launch / safe C loop {ratio:.2f}x"
        )
    medians = {int(k): statistics.median(v) for k, v in probed["segments"].items()}
    floor = min(medians.values()) if medians else 0.0
    print(f"\n| segment | ns, median (min-max) | less the probe ({floor:.1f} ns) |")
    print("| --- | ---: | ---: |")
    total = 0.0
    for segment, what, *_ in PROBES:
        if segment is None:
            continue
        values = probed["segments"].get(str(segment))
        if not values:
            print(f"| {segment}: {what} | not reached | |")
            continue
        total += medians[segment] - floor
        spread = f"{medians[segment]:.1f} ({min(values):.1f}-{max(values):.1f})"
        print(f"| {segment}: {what} | {spread} | {medians[segment] - floor:.1f} |")
    print(f"| the segments, less the probes | | {total:.1f} |")


if __name__ == "__main__":
    main()
