"""numba_hostfn benchmarks: GIL and GIL-free host functions, the raw driver and the peers.

    python benchmarks/run.py --out bench-out        # on a GPU: table + PNG plots
    python benchmarks/run.py --smoke                # a tiny run (the simulator in CI)
    python benchmarks/run.py --only dispatch        # one section (repeatable)

Progress goes to stderr, one line per row; a row running over two minutes
(BENCH_WATCHDOG_S) prints every thread's stack there and goes on.

What is measured (each figure: median with min-max over repeats, and its ratio to
the baseline measured in the same run):

1. enqueue: the cost of one enqueue call, from a loop of N calls timed on the host
   (the stream is held by device work so that nothing runs meanwhile): host_launch
   with a HostFunction, a ctypes CUhostFn and a Python callable; a C loop over
   cuLaunchHostFunc (built with nvcc if present); cuda.bindings.driver.
   cuLaunchHostFunc; ctypes straight to libcuda; CuPy's Stream.launch_host_func;
   numba-cuda's Stream.add_callback (a failure is reported as a row).
2. throughput: N host functions enqueued and run, per host function, on one stream
   and spread over 4 streams.
3. dispatch delay: device work ends (a kernel spinning on a host-written flag is
   released at a host clock time) -> the host function starts (its own clock
   read), with the main thread idle, busy in a Python loop, or holding the GIL in
   a long C call; HostFunction vs Python callable vs CuPy (these conditions
   interleaved, 25 rounds); and Python callables busy over
   sys.setswitchinterval values.
4. host copy bandwidth: benchmarks/host_copy.py (run separately).
5. @host_callback compile time, first and cached (fresh processes), against
   numba.cfunc(cache=True) of the same body, and the time to import
   numba_hostfn against importing numba.
"""

from __future__ import annotations

import argparse
import ctypes
import faulthandler
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field

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
        self.note = f"{type(exc).__name__}: {str(exc).splitlines()[0][:90]}"

    def cell(self) -> str:
        if not self.samples:
            return f"-- ({self.note})" if self.note else "--"
        return f"{self.median:.2f} ({min(self.samples):.2f}-{max(self.samples):.2f})"


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


# ---- setup ----------------------------------------------------------------------------


_libc = ctypes.CDLL(None)
_clock_gettime = _libc.clock_gettime
_clock_gettime.argtypes = (ctypes.c_int, ctypes.c_size_t)
_clock_gettime.restype = ctypes.c_int
_usleep = _libc.usleep
_usleep.argtypes = (ctypes.c_uint,)
_usleep.restype = ctypes.c_int


def compiled_functions(nh):
    from numba import carray

    @nh.host_callback
    def empty(p):
        pass

    @nh.host_callback
    def stamp(p):
        """p -> int64[3]: [ns, scratch sec, scratch nsec]: CLOCK_MONOTONIC now."""
        a = carray(p, (3,), np.int64)
        _clock_gettime(1, a[1:3].ctypes.data)
        a[0] = a[1] * 1_000_000_000 + a[2]

    return empty, stamp


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
        else:
            from numba import carray

            import numba_hostfn as nh

            @nh.host_callback
            def spin_until_set(p):
                flag = carray(p, (1,), np.int32)
                while flag[0] == 0:
                    _usleep(20)  # an opaque call: the flag is read again each time

            self.spin = spin_until_set

    def close_on(self, stream) -> None:
        self.flag[0] = 0
        if self.simulator:
            import numba_hostfn as nh

            stream.launch(self.spin, user_data=nh.by_ref(self.flag))
        else:
            from cuda.core import launch

            launch(stream, self.config, self.kernel, np.uint64(self.flag.ctypes.data))

    def open(self) -> int:
        t0 = time.monotonic_ns()
        self.flag[0] = 1
        return t0


# ---- 1. enqueue --------------------------------------------------------------------------


def bench_enqueue(nh, device, n: int, repeats: int) -> None:
    empty, _ = compiled_functions(nh)
    stream = device.create_stream()
    gate = Gate(device)

    def per_call(enqueue_one) -> float:
        gate.close_on(stream)
        try:
            start = time.perf_counter()
            for _ in range(n):
                enqueue_one()
            elapsed = time.perf_counter() - start
        finally:  # a failing row must not leave the stream held (and the device busy)
            gate.open()
            stream.sync()
            nh.drain()
        return elapsed / n * 1e6

    pointer = empty.ctypes
    record(
        "enqueue",
        "host_launch(HostFunction)",
        "µs/call",
        lambda: per_call(lambda: nh.host_launch(stream, empty)),
        repeats,
    )
    record(
        "enqueue",
        "host_launch(ctypes CUhostFn)",
        "µs/call",
        lambda: per_call(lambda: nh.host_launch(stream, pointer)),
        repeats,
    )
    record(
        "enqueue",
        "host_launch(Python callable)",
        "µs/call",
        lambda: per_call(lambda: nh.host_launch(stream, _noop)),
        repeats,
    )
    if device.simulator:
        for name in (
            "raw C loop over cuLaunchHostFunc",
            "cuda.bindings cuLaunchHostFunc",
            "ctypes -> libcuda cuLaunchHostFunc",
            "CuPy launch_host_func",
            "numba-cuda add_callback",
        ):
            ROWS.append(Row("enqueue", name, "µs/call", note="needs a GPU"))
        stream.close()
        return
    handle = int(stream.handle)
    from cuda.bindings import driver

    record(
        "enqueue",
        "raw C loop over cuLaunchHostFunc",
        "µs/call",
        lambda: raw_c_loop(gate, stream, n),
        repeats,
    )
    fn_obj = driver.CUhostFn(empty.address)
    cu_stream = driver.CUstream(handle)
    record(
        "enqueue",
        "cuda.bindings cuLaunchHostFunc",
        "µs/call",
        lambda: per_call(lambda: driver.cuLaunchHostFunc(cu_stream, fn_obj, 0)),
        repeats,
    )
    libcuda = ctypes.CDLL("libcuda.so.1")
    launch = libcuda.cuLaunchHostFunc
    launch.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
    launch.restype = ctypes.c_int
    address = empty.address
    record(
        "enqueue",
        "ctypes -> libcuda cuLaunchHostFunc",
        "µs/call",
        lambda: per_call(lambda: launch(handle, address, None)),
        repeats,
    )

    def cupy_row():

        cs = _cupy_stream(stream)
        return per_call(lambda: cs.launch_host_func(_noop_arg, None))

    record("enqueue", "CuPy launch_host_func", "µs/call", cupy_row, repeats)

    def numba_cuda_row():
        from numba import cuda

        ns = cuda.external_stream(handle)
        return per_call(lambda: ns.add_callback(_noop_cb, None))

    record("enqueue", "numba-cuda add_callback", "µs/call", numba_cuda_row, 1)
    stream.close()


def _noop() -> None:
    pass


def _cupy_stream(stream):
    """CuPy's view of a cuda.core stream (Stream.from_external where CuPy has it)."""
    import cupy

    if hasattr(cupy.cuda.Stream, "from_external"):
        return cupy.cuda.Stream.from_external(stream)
    return cupy.cuda.ExternalStream(int(stream.handle))


def _noop_arg(arg) -> None:
    pass


def _noop_cb(stream, status, arg) -> None:
    pass


C_LOOP = r"""
#include <cuda.h>
#include <time.h>
static void CUDA_CB empty(void *p) { (void)p; }
/* n enqueues of an empty host function; returns microseconds per call (-1 on error). */
extern "C" double loop(unsigned long long stream, int n)
{
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int i = 0; i < n; ++i)
        if (cuLaunchHostFunc((CUstream)stream, empty, 0) != CUDA_SUCCESS) return -1.0;
    clock_gettime(CLOCK_MONOTONIC, &b);
    return ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n / 1e3;
}
"""
_C_LOOP_LIB = None


def raw_c_loop(gate, stream, n: int) -> float:
    """The C loop, built with nvcc as a shared library and called once through ctypes."""
    global _C_LOOP_LIB
    if _C_LOOP_LIB is None:
        nvcc = shutil.which("nvcc")
        if not nvcc:
            raise RuntimeError("nvcc not found: row skipped")
        build = tempfile.mkdtemp()
        src, out = os.path.join(build, "loop.c"), os.path.join(build, "libloop.so")
        with open(src, "w") as f:
            f.write(C_LOOP)
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
            [
                nvcc,
                "-O2",
                "-shared",
                "-Xcompiler",
                "-fPIC",
                "-x",
                "cu",
                src,
                "-o",
                out,
                *stubs,
                "-lcuda",
            ],
            check=True,
            capture_output=True,
        )
        lib = ctypes.CDLL(out)
        lib.loop.argtypes = (ctypes.c_ulonglong, ctypes.c_int)
        lib.loop.restype = ctypes.c_double
        _C_LOOP_LIB = lib
    gate.close_on(stream)
    try:
        per_call = _C_LOOP_LIB.loop(int(stream.handle), n)
    finally:
        gate.open()
        stream.sync()
    if per_call < 0:
        raise RuntimeError("cuLaunchHostFunc failed in the C loop")
    return per_call


# ---- 2. throughput -----------------------------------------------------------------------


def bench_throughput(nh, device, n: int, repeats: int) -> None:
    empty, _ = compiled_functions(nh)
    for n_streams in (1, 4):
        streams = [device.create_stream() for _ in range(n_streams)]

        def run(fn, streams=streams):
            start = time.perf_counter()
            for i in range(n):
                nh.host_launch(streams[i % len(streams)], fn)
            for s in streams:
                s.sync()
            elapsed = time.perf_counter() - start
            nh.drain()
            return elapsed / n * 1e6

        label = "1 stream" if n_streams == 1 else f"{n_streams} streams"
        record("throughput", f"HostFunction, {label}", "µs/fn", lambda: run(empty), repeats)
        record("throughput", f"Python callable, {label}", "µs/fn", lambda: run(_noop), repeats)
        if not device.simulator and n_streams == 1:

            def cupy_run(stream=streams[0]):

                cs = _cupy_stream(stream)
                start = time.perf_counter()
                for _ in range(n):
                    cs.launch_host_func(_noop_arg, None)
                stream.sync()  # cuda.core's sync releases the GIL the callbacks need
                return (time.perf_counter() - start) / n * 1e6

            record("throughput", "CuPy launch_host_func, 1 stream", "µs/fn", cupy_run, repeats)
        for s in streams:
            s.close()


# ---- 3. dispatch delay -------------------------------------------------------------------


def bench_dispatch(nh, device, repeats: int, window: float) -> None:
    _, stamp = compiled_functions(nh)
    stream = device.create_stream()
    gate = Gate(device)
    hold_gil = ctypes.PyDLL(None).usleep

    def sample(kind: str, main: str) -> float:
        stamps = np.zeros(3, np.int64)
        seen = []
        gate.close_on(stream)
        t0 = None
        try:
            if kind == "HostFunction":
                nh.host_launch(stream, stamp, user_data=nh.by_ref(stamps))
            elif kind == "Python callable":
                nh.host_launch(stream, lambda: seen.append(time.monotonic_ns()))
            else:  # CuPy
                cs = _cupy_stream(stream)
                cs.launch_host_func(lambda _: seen.append(time.monotonic_ns()), None)
            time.sleep(0.002)  # the stream waits at the gate; the driver's thread parks
            t0 = gate.open()
            if main == "busy in Python":
                end = time.perf_counter() + window
                while time.perf_counter() < end:
                    pass
            elif main == "holding the GIL":
                hold_gil(int(window * 1e6))
        finally:  # a failing row must not leave the stream held
            if t0 is None:
                gate.open()
            stream.sync()
            nh.drain()
        t1 = int(stamps[0]) if kind == "HostFunction" else seen[0]
        return (t1 - t0) / 1e3

    # The driver thread's wake-up time drifts over seconds: the conditions are
    # interleaved, one sample of each per round, so that drift hits them alike.
    kinds = ["HostFunction", "Python callable"] + ([] if device.simulator else ["CuPy"])
    rows = [
        Row(f"dispatch ({main})", kind, "µs")
        for main in ("idle", "busy in Python", "holding the GIL")
        for kind in kinds
    ]
    print(f"[dispatch] {len(rows)} conditions interleaved ...", file=sys.stderr, flush=True)
    faulthandler.dump_traceback_later(ROW_WATCHDOG_S, exit=False)
    try:
        for _ in range(repeats):
            for row in rows:
                if row.note:
                    continue
                try:
                    row.samples.append(sample(row.name, row.group[len("dispatch (") : -1]))
                except Exception as exc:  # a failing peer is a finding, reported in the table
                    row.fail(exc)
    finally:
        faulthandler.cancel_dump_traceback_later()
    ROWS.extend(rows)
    old = sys.getswitchinterval()
    try:
        for interval in (0.001, 0.005, 0.02):
            sys.setswitchinterval(interval)
            record(
                "dispatch vs switch interval (busy in Python)",
                f"Python callable, {interval * 1e3:g} ms",
                "µs",
                lambda: sample("Python callable", "busy in Python"),
                repeats,
            )
            record(
                "dispatch vs switch interval (busy in Python)",
                f"HostFunction, {interval * 1e3:g} ms",
                "µs",
                lambda: sample("HostFunction", "busy in Python"),
                repeats,
            )
    finally:
        sys.setswitchinterval(old)
    stream.close()


# ---- 5. compile and import -----------------------------------------------------------------

COMPILE_SCRIPT = textwrap.dedent("""
    import sys, time, numpy as np
    t = time.perf_counter()
    import numba_hostfn as nh
    import numba
    from numba import carray
    t_import = time.perf_counter() - t

    def scale(p):
        a = carray(p, (16,), np.float64)
        for i in range(16):
            a[i] *= 2.0

    def shift(p):
        a = carray(p, (16,), np.float64)
        for i in range(16):
            a[i] += 1.0

    if sys.argv[1] == "numba":  # the baseline: numba's own cached cfunc
        make = numba.cfunc("void(voidptr)", cache=True)
    else:
        make = nh.host_callback(cache=True)
    t = time.perf_counter()
    first = make(scale)
    t_first = time.perf_counter() - t
    t = time.perf_counter()
    second = make(shift)
    t_second = time.perf_counter() - t
    hits = getattr(first, "cache_hits", 0) + getattr(second, "cache_hits", 0)
    print(t_import, t_first, t_second, hits)
""")


def bench_compile(repeats: int) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    times: dict[str, list[float]] = {}

    def run(script: str, mode: str) -> list[float]:
        out = subprocess.run(
            [sys.executable, script, mode],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=300,
        ).stdout.split()
        return [float(v) for v in out]

    for _ in range(repeats):
        for mode in ("numba_hostfn", "numba"):
            with tempfile.TemporaryDirectory() as tmp:
                script = os.path.join(tmp, "hostfns.py")
                with open(script, "w") as f:
                    f.write(COMPILE_SCRIPT)
                _, t_first, _, _ = run(script, mode)  # compiles and writes the cache
                t_import, t_cached, t_second, hits = run(script, mode)  # loads
                if mode == "numba_hostfn" and hits != 2:
                    raise RuntimeError("the second process did not load from the cache")
                for key, value in (
                    (f"{mode} first", t_first),
                    (f"{mode} cached", t_cached),
                    (f"{mode} cached 2nd", t_second),
                    ("import", t_import),
                ):
                    times.setdefault(key, []).append(value * 1e3)
    rows = [
        ("@host_callback, first (compiles)", "numba_hostfn first"),
        ("@host_callback, cached (loads), first in process", "numba_hostfn cached"),
        ("@host_callback, cached (loads), 2nd in process", "numba_hostfn cached 2nd"),
        ("numba.cfunc(cache=True), first (compiles)", "numba first"),
        ("numba.cfunc(cache=True), cached, first in process", "numba cached"),
        ("numba.cfunc(cache=True), cached, 2nd in process", "numba cached 2nd"),
        ("import numba_hostfn (and numba), numpy already imported", "import"),
    ]
    for name, key in rows:
        ROWS.append(Row("compile and import", name, "ms", times[key]))
    numba_import = []
    for _ in range(repeats):
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                # numpy first, as in the compile script: both rows time the import
                # of numba (and numba_hostfn) on top of an imported numpy
                "import time, numpy; t=time.perf_counter(); import numba; "
                "print(time.perf_counter()-t)",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        numba_import.append(float(out) * 1e3)
    ROWS.append(
        Row("compile and import", "import numba, numpy already imported", "ms", numba_import)
    )


# ---- report --------------------------------------------------------------------------------


def find(group: str, name: str) -> Row | None:
    for row in ROWS:
        if row.group == group and row.name == name:
            return row
    return None


def ratio(a: Row | None, b: Row | None) -> float | None:
    if a and b and a.median is not None and b.median:
        return a.median / b.median
    return None


def targets() -> list[tuple[str, str, bool | None]]:
    out = []

    def add(text, value, limit, fmt="{:.2f}x"):
        met = None if value is None else value <= limit
        out.append((text, "n/a" if value is None else fmt.format(value), met))

    add(
        "HostFunction enqueue <= 1.5x raw C loop",
        ratio(
            find("enqueue", "host_launch(HostFunction)"),
            find("enqueue", "raw C loop over cuLaunchHostFunc"),
        ),
        1.5,
    )
    add(
        "Python callable end to end <= 0.5x CuPy launch_host_func",
        ratio(
            find("throughput", "Python callable, 1 stream"),
            find("throughput", "CuPy launch_host_func, 1 stream"),
        ),
        0.5,
    )
    idle = find("dispatch (idle)", "HostFunction")
    add(
        "HostFunction dispatch, main busy in Python <= 1.2x idle",
        ratio(find("dispatch (busy in Python)", "HostFunction"), idle),
        1.2,
    )
    add(
        "HostFunction dispatch, main holding the GIL <= 1.2x idle",
        ratio(find("dispatch (holding the GIL)", "HostFunction"), idle),
        1.2,
    )
    for when in ("first in process", "2nd in process"):
        cached = find("compile and import", f"@host_callback, cached (loads), {when}")
        add(
            f"cached @host_callback load, {when}, <= 20 ms",
            cached.median if cached else None,
            20.0,
            "{:.1f} ms",
        )
    return out


def report(out_dir: str | None, header: str) -> str:
    lines = [header, ""]
    groups: list[str] = []
    for row in ROWS:
        if row.group not in groups:
            groups.append(row.group)
    for group in groups:
        rows = [r for r in ROWS if r.group == group]
        base = find("enqueue", "raw C loop over cuLaunchHostFunc") if group == "enqueue" else None
        if group.startswith("dispatch ("):
            base = find("dispatch (idle)", "HostFunction")
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
    for text, value, met in targets():
        lines.append(f"| {text} | {value} | {'n/a' if met is None else ('yes' if met else 'NO')} |")
    text = "\n".join(lines) + "\n"
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "benchmarks.md"), "w") as f:
            f.write(text)
        plot(out_dir)
    return text


def plot(out_dir: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plots", file=sys.stderr)
        return
    for group, filename in (
        ("enqueue", "enqueue.png"),
        ("dispatch", "dispatch.png"),
        ("throughput", "throughput.png"),
        ("compile and import", "compile.png"),
    ):
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
    return f"{row.group.split('(')[-1].rstrip(')')}: {row.name}"


def _plot_color(name: str) -> str:
    """One colour per mechanism: ours compiled, ours Python, the raw driver, the peers."""
    if "HostFunction" in name or "ctypes CUhostFn" in name or "@host_callback" in name:
        return "#4c72b0"
    if "Python callable" in name:
        return "#dd8452"
    if "CuPy" in name or "numba-cuda" in name or "cuda.bindings" in name:
        return "#55a868"
    return "#8c8c8c"  # the raw driver and numba itself


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (CI, simulator)")
    parser.add_argument("--out", help="folder for benchmarks.md and the PNG plots")
    parser.add_argument(
        "--only",
        choices=("enqueue", "throughput", "dispatch", "compile"),
        action="append",
        help="run only these sections (repeatable)",
    )
    args = parser.parse_args(argv)
    from numba_hostfn._backend import simulator_unless_driver

    simulator_unless_driver()
    import numba_hostfn as nh
    from numba_hostfn._devicework import Device

    device = Device()
    n, repeats, window = (200, 2, 0.02) if args.smoke else (20000, 7, 0.02)
    dispatch_repeats = 2 if args.smoke else 25
    import importlib.metadata as md

    versions = ", ".join(
        f"{p} {md.version(p)}" for p in ("numba", "cuda-core", "cuda-bindings") if _has(md, p)
    )
    header = (
        f"## numba_hostfn benchmarks -- {time.strftime('%Y-%m-%d')}, backend "
        f"{nh.backend_name()} ({device.name}), Python {sys.version.split()[0]}, "
        f"{versions}; N={n}, repeats={repeats}"
    )
    steps = {
        "enqueue": lambda: bench_enqueue(nh, device, n, repeats),
        "throughput": lambda: bench_throughput(nh, device, n, repeats),
        "dispatch": lambda: bench_dispatch(nh, device, dispatch_repeats, window),
        "compile": lambda: bench_compile(1 if args.smoke else 3),
    }
    for name, step in steps.items():
        if not args.only or name in args.only:
            step()
            sys.stdout.flush()
    print(report(args.out, header))
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
