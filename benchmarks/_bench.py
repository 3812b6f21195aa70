"""The machinery the benchmark sections share: rows, targets, the report and the plots.

A section (``bench_*.py``) times its rows with :func:`record` (or builds :class:`Row`
objects and appends them to :data:`ROWS`); ``run.py`` then writes the report from
:data:`ROWS`, each section's baseline rows and its targets.  Also here: the compiled
host functions, the no-op callbacks and the :class:`Gate` (device work that holds a
stream) that several sections use.
"""

from __future__ import annotations

import ctypes
import faulthandler
import json
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


@dataclass
class Row:
    group: str
    name: str
    unit: str
    samples: list[float] = field(default_factory=list)
    note: str = ""

    @property
    def median(self) -> float | None:
        return statistics.median(self.samples) if self.samples else None

    def fail(self, exc: Exception) -> None:
        """The row's measurement failed: no samples, and the error as its note."""
        self.samples.clear()
        first = (str(exc).splitlines() or [""])[0][:90]
        self.note = f"{type(exc).__name__}: {first}" if first else type(exc).__name__

    def cell(self) -> str:
        if not self.samples:
            return f"-- ({self.note})" if self.note else "--"
        note = f" [{self.note}]" if self.note else ""
        return f"{self.median:.2f} ({min(self.samples):.2f}-{max(self.samples):.2f}){note}"


ROWS: list[Row] = []
ROW_WATCHDOG_S = float(os.environ.get("BENCH_WATCHDOG_S", "120"))


def record(group: str, name: str, unit: str, fn, repeats: int) -> Row:
    """Run ``fn()`` (returns one sample) ``repeats`` times; a failure becomes the row's note."""
    row = Row(group, name, unit)
    print(f"[{group}] {name} ...", file=sys.stderr, flush=True)  # where a hang happens
    # A row that takes over two minutes prints every thread's stack (and goes on).
    faulthandler.dump_traceback_later(ROW_WATCHDOG_S, exit=False)
    try:
        for _ in range(repeats):
            row.samples.append(fn())
    except Exception as exc:  # a failing peer is a finding, reported in the table
        row.fail(exc)
    finally:
        faulthandler.cancel_dump_traceback_later()
    ROWS.append(row)
    return row


def interleaved(label: str, rows: list[Row], sample: Callable[[Row], float], repeats: int) -> None:
    """One sample of each row per round: drift over seconds (a shared machine) hits
    every row alike, the baseline included.  A failing row becomes its note."""
    print(f"[{label}] {len(rows)} conditions interleaved ...", file=sys.stderr, flush=True)
    faulthandler.dump_traceback_later(ROW_WATCHDOG_S, exit=False)
    try:
        for _ in range(repeats):
            for row in rows:
                if row.note:
                    continue
                try:
                    row.samples.append(sample(row))
                except Exception as exc:  # a failing peer is a finding, reported in the table
                    row.fail(exc)
    finally:
        faulthandler.cancel_dump_traceback_later()
    ROWS.extend(rows)


def find(group: str, name: str) -> Row | None:
    for row in ROWS:
        if row.group == group and row.name == name:
            return row
    return None


def ratio(a: Row | None, b: Row | None) -> float | None:
    if a and b and a.median is not None and b.median:
        return a.median / b.median
    return None


class Target(NamedTuple):
    """A line of the targets table; ``value`` and ``limit`` are kept for ``--json`` (ab.py)."""

    text: str
    shown: str  # the measured value as the table prints it
    met: bool | None  # None: informational, or not measured
    value: float | None = None
    limit: float | None = None


def target(text: str, value: float | None, limit: float | None, fmt: str = "{:.2f}x") -> Target:
    """A line of the targets table: ``value <= limit``; no limit: informational (met n/a)."""
    met = None if value is None or limit is None else value <= limit
    return Target(text, "n/a" if value is None else fmt.format(value), met, value, limit)


def write_json(path: str, targets: Iterable[Target]) -> None:
    """Every row's samples and every target's value, for benchmarks/ab.py to compare."""
    data = {
        "rows": [
            {"group": r.group, "name": r.name, "unit": r.unit, "samples": r.samples, "note": r.note}
            for r in ROWS
        ],
        "targets": [t._asdict() for t in targets],
    }
    with open(path, "w") as f:  # numpy scalars (a numpy bool: a met target) as Python's
        json.dump(data, f, default=lambda o: o.item() if hasattr(o, "item") else str(o))


# ---- shared setup ----------------------------------------------------------------------


_libc = ctypes.CDLL(None)
clock_gettime = _libc.clock_gettime
clock_gettime.argtypes = (ctypes.c_int, ctypes.c_size_t)
clock_gettime.restype = ctypes.c_int
usleep = _libc.usleep
usleep.argtypes = (ctypes.c_uint,)
usleep.restype = ctypes.c_int


def compiled_functions(nh):
    from numba import carray

    @nh.host_callback
    def empty(p):
        pass

    @nh.host_callback
    def stamp(p):
        """p -> int64[3]: [ns, scratch sec, scratch nsec]: CLOCK_MONOTONIC now."""
        a = carray(p, (3,), np.int64)
        clock_gettime(1, a[1:3].ctypes.data)
        a[0] = a[1] * 1_000_000_000 + a[2]

    return empty, stamp


def call_loop(fn, args: tuple, n: int) -> None:
    """``n`` calls of ``fn(*args)`` from a plain loop, without a wrapper per call (a
    lambda around each call would add its own frame to every Python row)."""
    if not args:
        for _ in range(n):
            fn()
    elif len(args) == 2:
        a, b = args
        for _ in range(n):
            fn(a, b)
    elif len(args) == 3:
        a, b, c = args
        for _ in range(n):
            fn(a, b, c)
    else:
        a, b, c, d, e, f = args
        for _ in range(n):
            fn(a, b, c, d, e, f)


def check_enqueue(nh, stream, args: tuple, what: str) -> None:
    """One ``_core.enqueue(*args)``, then ``stream.sync()`` and a drain: a row whose
    loop drops the status word it returns would time a refused enqueue (a status,
    not an exception) as a launch, so the target is checked once before it."""
    from numba_hostfn import _core

    status = _core.enqueue(*args)
    if status:
        raise RuntimeError(f"_core.enqueue refused {what}: status {status:#x}")
    stream.sync()
    nh.drain()


def noop() -> None:
    pass


def noop_arg(arg) -> None:
    pass


def noop_cb(stream, status, arg) -> None:
    pass


def cupy_stream(stream):
    """CuPy's view of a cuda.core stream (Stream.from_external where CuPy has it)."""
    import cupy

    if hasattr(cupy.cuda.Stream, "from_external"):
        return cupy.cuda.Stream.from_external(stream)
    return cupy.cuda.ExternalStream(int(stream.handle))


def build_with_nvcc(source: str, name: str) -> ctypes.CDLL:
    """Compile CUDA C++ ``source`` with nvcc into a shared library linked to libcuda."""
    nvcc = shutil.which("nvcc")
    if not nvcc:
        raise RuntimeError("nvcc not found: row skipped")
    build = tempfile.mkdtemp()
    src, out = os.path.join(build, f"{name}.cu"), os.path.join(build, f"lib{name}.so")
    with open(src, "w") as f:
        f.write(source)
    cuda_home = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
    stubs = [
        f"-L{d}"
        for d in (
            os.path.join(cuda_home, "lib64", "stubs"),
            os.path.join(cuda_home, "targets", "x86_64-linux", "lib", "stubs"),
        )
        if os.path.isdir(d)
    ]
    subprocess.run(
        [nvcc, "-O2", "-shared", "-Xcompiler", "-fPIC", src, "-o", out, *stubs, "-lcuda"],
        check=True,
        capture_output=True,
    )
    return ctypes.CDLL(out)


GIL_FLOOR = r"""
#include <Python.h>
/* A CUhostFn that takes the GIL as numba_hostfn's trampoline does (a thread state
   kept for the thread after its first call, nhf_gil_take) and calls the Python
   callable whose address is its argument; nothing else: no record, no guard.  What
   any callback through cuLaunchHostFunc that runs Python pays at least. */
void gil_floor(void *callable)
{
    if (PyGILState_GetThisThreadState() == NULL) {
        (void)PyGILState_Ensure();
        (void)PyEval_SaveThread();
    }
    PyGILState_STATE state = PyGILState_Ensure();
    PyObject *result = PyObject_CallNoArgs((PyObject *)callable);
    if (result == NULL)
        PyErr_WriteUnraisable((PyObject *)callable);
    Py_XDECREF(result);
    PyGILState_Release(state);
}
"""
_GIL_FLOOR: list = []  # the ctypes CUhostFn and its library, built once


def gil_floor():
    """``gil_floor``, a ctypes ``CUhostFn`` built from :data:`GIL_FLOOR` with the C
    compiler that builds extensions for this Python; launch it with
    ``user_data=id(callable)`` while the callable is kept alive."""
    if not _GIL_FLOOR:
        # As setuptools picks it: $CC, else the compiler this Python was built with.
        cc = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()
        if shutil.which(cc[0]) is None:
            raise RuntimeError(f"the GIL floor did not build: no C compiler ({cc[0]})")
        build = tempfile.mkdtemp()
        src, out = os.path.join(build, "gil_floor.c"), os.path.join(build, "libgil_floor.so")
        with open(src, "w") as f:
            f.write(GIL_FLOOR)
        include = sysconfig.get_paths()["include"]
        built = subprocess.run(
            [*cc, "-O2", "-shared", "-fPIC", f"-I{include}", src, "-o", out],
            capture_output=True,
            text=True,
        )
        if built.returncode:
            raise RuntimeError(
                f"the GIL floor did not build ({' '.join(cc)}, exit {built.returncode}): "
                f"{built.stderr.strip()[-200:]}"
            )
        lib = ctypes.CDLL(out)  # its Python symbols are the process's own
        # Exactly CUhostFn, as every run since 35b launched it: the native path's first
        # pointer check, the one a ctypes CUhostFn row takes too.
        address = ctypes.cast(lib.gil_floor, ctypes.c_void_p).value
        _GIL_FLOOR.extend((ctypes.CFUNCTYPE(None, ctypes.c_void_p)(address), lib))
    return _GIL_FLOOR[0]


class Gate:
    """Device work that holds a stream until the host opens it (sets a flag)."""

    SOURCE = r"""
    extern "C" __global__ void wait_flag(volatile int *flag)
    {
        while (*flag == 0) { __nanosleep(100); }
    }
    """

    def __init__(self, device):
        self.device = device
        self.simulator = device.simulator
        self.flag = device.host_array(1)
        if not self.simulator:
            from cuda.core import LaunchConfig, Program, ProgramOptions

            arch = "sm_" + "".join(str(v) for v in device.cuda.compute_capability)
            prog = Program(self.SOURCE, code_type="c++", options=ProgramOptions(arch=arch))
            self.kernel = prog.compile("cubin").get_kernel("wait_flag")
            self.config = LaunchConfig(grid=1, block=1)
            # Load the module now, with the flag set: CUDA loads a module at its
            # kernel's first launch (lazy loading), and on the H200 that launch
            # blocked, inside cuLaunchKernel, while another Gate's kernel spun.
            warm = device.create_stream()
            self.flag[0] = 1
            self._launch(warm)
            warm.sync()
            warm.close()
        else:
            from numba import carray

            import numba_hostfn as nh

            @nh.host_callback
            def spin_until_set(p):
                flag = carray(p, (1,), np.int32)
                while flag[0] == 0:
                    usleep(20)  # an opaque call: the flag is read again each time

            self.spin = spin_until_set

    def close_on(self, stream) -> None:
        self.flag[0] = 0
        if self.simulator:
            import numba_hostfn as nh

            stream.launch(self.spin, user_data=nh.by_ref(self.flag))
        else:
            self._launch(stream)

    def _launch(self, stream) -> None:
        from cuda.core import launch

        launch(stream, self.config, self.kernel, np.uint64(self.flag.ctypes.data))

    def open(self) -> int:
        t0 = time.monotonic_ns()
        self.flag[0] = 1
        return t0


# ---- report ------------------------------------------------------------------------------


def report(
    out_dir: str | None,
    header: str,
    targets: Iterable[Target],
    baseline: Callable[[str], Row | None],
    plots: Iterable[tuple[str, str]],
) -> str:
    """The markdown report of :data:`ROWS`: one table per group, then the targets.

    ``baseline(group)`` is the row a group's ratios are to (None: its first row);
    with ``out_dir``, the report is written there as benchmarks.md, with ``plots``
    (group prefix, PNG file name) drawn beside it.
    """
    lines = [header, ""]
    groups: list[str] = []
    for row in ROWS:
        if row.group not in groups:
            groups.append(row.group)
    for group in groups:
        rows = [r for r in ROWS if r.group == group]
        base = baseline(group)
        lines += [
            f"### {group}",
            "",
            f"| | median (min-max) | unit | ratio to {base.name if base else 'first row'} |",
            "| --- | ---: | --- | ---: |",
        ]
        base = base or rows[0]
        for row in rows:
            r = ratio(row, base)
            lines.append(
                f"| {row.name} | {row.cell()} | {row.unit} | {'' if r is None else f'{r:.2f}'} |"
            )
        lines.append("")
    lines += ["### targets", "", "| target | measured | met |", "| --- | ---: | --- |"]
    for t in targets:
        met = "n/a" if t.met is None else ("yes" if t.met else "NO")
        lines.append(f"| {t.text} | {t.shown} | {met} |")
    text = "\n".join(lines) + "\n"
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "benchmarks.md"), "w") as f:
            f.write(text)
        plot(out_dir, plots)
    return text


def plot(out_dir: str, plots: Iterable[tuple[str, str]]) -> None:
    """One horizontal bar chart per (group prefix, file name) with rows that have samples."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plots", file=sys.stderr)
        return
    for group, filename in plots:
        rows = [r for r in ROWS if r.group.startswith(group) and r.samples]
        if not rows:
            continue
        labels = [_plot_label(group, r) for r in rows]
        colors = [_plot_color(r.name) for r in rows]
        med = [r.median for r in rows]
        err = [
            [m - min(r.samples) for m, r in zip(med, rows, strict=True)],
            [max(r.samples) - m for m, r in zip(med, rows, strict=True)],
        ]
        fig, ax = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.2))
        ax.barh(range(len(rows)), med, xerr=err, color=colors)
        ax.set_yticks(range(len(rows)), labels, fontsize=8)
        ax.invert_yaxis()
        log = max(med) > 20 * min(med)
        if log:
            ax.set_xscale("log")
        scale = ", log scale" if log else ""
        ax.set_xlabel(f"{rows[0].unit} (median, min-max){scale}")
        ax.set_title(f"numba_hostfn: {group}")
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, filename), dpi=110)
        plt.close(fig)


def _plot_label(group: str, row: Row) -> str:
    if row.group == group:
        return row.name
    if "switch interval" in row.group:
        return f"busy, switch interval: {row.name}"
    condition = row.group.partition("(")[2].removesuffix(")")  # "idle in sync()" keeps its ()
    return f"{condition}: {row.name}"


def _plot_color(name: str) -> str:
    """One colour per mechanism: ours compiled, ours Python, the raw driver, the peers."""
    if "HostFunction" in name or "ctypes CUhostFn" in name or "@host_callback" in name:
        return "#4c72b0"
    if "Python callable" in name:
        return "#dd8452"
    if "CuPy" in name or "numba-cuda" in name or "cuda.bindings" in name or "cuda.core" in name:
        return "#55a868"
    return "#8c8c8c"  # the raw driver and numba itself
