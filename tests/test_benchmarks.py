"""Benchmarks run in smoke mode, on the simulator on every machine; timings are never asserted.

(The GPU runs of the benchmarks are separate, documented commands: benchmarks/README.md.)"""

import ast
import json
import os
import pathlib
import platform
import re
import shutil
import subprocess
import sys
import textwrap

import pytest
from _device import SOURCES, child_env

ROOT = pathlib.Path(__file__).parent.parent


def _benchmark(script, *args, timeout=300, env=None, root=ROOT):
    """<root>/benchmarks/<script> run with args on the simulator; it must succeed."""
    run = subprocess.run(
        [sys.executable, str(root / "benchmarks" / script), *map(str, args)],
        env=env if env is not None else child_env(NUMBA_HOSTFN_SIMULATOR="1"),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return run


def test_host_copy_benchmark_smoke():
    run = _benchmark("host_copy.py", "--smoke")
    assert "| 4 KiB |" in run.stdout and "| 1 MiB |" in run.stdout


def test_queue_depth_probe_smoke():
    """The probe runs every hold and every kind of work; the simulator blocks none."""
    run = _benchmark("queue_depth.py", "--n", 200, "--wait", 30)  # --wait: a deadline
    lines = run.stdout.splitlines()
    assert len(lines) == 10 and all("all enqueued" in line for line in lines), run.stdout


@pytest.mark.checkout  # the stand-ins are built against the core's driver.h
@pytest.mark.skipif(
    not (shutil.which("cc") or shutil.which("gcc")), reason="needs a C compiler (cc)"
)
def test_stand_in_driver_probe_smoke():
    """Every row runs on the CUDA route of the native core (the stand-in driver), none
    falling through to Python: each fast launch is counted by its kind."""
    run = _benchmark("stand_in.py", "--rounds", 2, "--n", 200, "--threads", 2)
    rows = [line for line in run.stdout.splitlines() if line.startswith("| ") and "µs" not in line]
    assert len(rows) == 8, run.stdout  # the header's separator and seven rows
    counts = ast.literal_eval(run.stdout.split("fast launches by kind: ")[1].strip())
    # 2 rounds x 200 calls: host_launch of a HostFunction on the driver's route and on
    # the executor's, of a Python callable on the driver's; nothing fell through.
    assert counts == {
        "fell_through": 0,
        "compiled": 800,
        "pointer": 0,
        "python": 400,
        "executor": 400,
    }, counts


def test_fault_storm_tells_each_childs_outcome(monkeypatch, capsys):
    """fault_storm.py (GPU only) tallies each child by its stream's last answer, and
    one that hangs as hung, saying where: here with a stand-in child, one that
    answers and one that hangs in Python until its faulthandler ends it."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import fault_storm
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    stand_in = textwrap.dedent("""
        import faulthandler, sys, time
        faulthandler.dump_traceback_later(2, exit=True)
        which = sys.argv[1]
        if which == "default":
            time.sleep(30)
        print(which, "CUDA_ERROR_LAUNCH_FAILED", "0.40", 2, "-")
    """)
    monkeypatch.setattr(fault_storm, "CHILD", stand_in)
    assert fault_storm.main(["--procs", "2", "--rounds", "1", "--wait", "1"]) == 0
    out = capsys.readouterr().out
    assert "driver: {'hung, no answer': 1, 'CUDA_ERROR_LAUNCH_FAILED': 1} of 2" in out, out
    assert "created CUDA_ERROR_LAUNCH_FAILED 0.40 2 - (exited after" in out, out
    assert re.search(r"default - \(exited after [0-9.]+ s, rc=1\): File", out), out


def test_fault_storm_tells_a_child_that_failed_from_one_that_hung(monkeypatch, capsys):
    """A child that exits with a Python error (rc 1, as faulthandler's exit) failed;
    it did not hang: it was tallied "hung, no answer", and its error went unsaid."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import fault_storm
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    stand_in = textwrap.dedent("""
        import sys
        if sys.argv[1] == "default":
            raise RuntimeError("no kernel image for this device")
        print(sys.argv[1], "CUDA_ERROR_LAUNCH_FAILED", "0.40", 2, "-")
    """)
    monkeypatch.setattr(fault_storm, "CHILD", stand_in)
    assert fault_storm.main(["--procs", "2", "--rounds", "1", "--wait", "1"]) == 0
    out = capsys.readouterr().out
    assert "driver: {'failed, no answer': 1, 'CUDA_ERROR_LAUNCH_FAILED': 1} of 2" in out, out
    assert "RuntimeError: no kernel image for this device" in out, out


@pytest.mark.checkout  # the probes are put into the core's sources
def test_enqueue_probes_still_fit_the_core(tmp_path):
    """Each probe of probe_enqueue.py finds its place in the sources once: a change of
    the launch path that moves one fails here, not on the GPU machine."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import probe_enqueue
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    native = tmp_path / "native"
    shutil.copytree(pathlib.Path(SOURCES) / "numba_hostfn" / "native", native)
    probe_enqueue.apply_probes(str(native))
    code = {path.name: path.read_text() for path in native.iterdir()}
    for segment in range(20):
        assert sum(text.count(f"PROBE({segment});") for text in code.values()) == 1, segment
    assert "py_probe_take" in code["host_launch.c"] and "#define PROBE" in code["nhf.h"]


@pytest.mark.checkout
@pytest.mark.skipif(
    not (shutil.which("cc") or shutil.which("gcc")), reason="needs a C compiler (cc)"
)
@pytest.mark.skipif(platform.machine() != "x86_64", reason="rdtsc: x86-64 only")
def test_enqueue_probe_smoke():
    """The probed copy builds and every segment of host_launch's own path is timed (the
    driver's are not reached on the simulator)."""
    run = _benchmark("probe_enqueue.py", "--n", 200, "--rounds", 1, timeout=600)
    rows = [line for line in run.stdout.splitlines() if re.match(r"\| \d+: ", line)]
    assert len(rows) == 20, run.stdout
    unreached = [row.split(":")[0] for row in rows if "not reached" in row]
    assert unreached == ["| 10", "| 11", "| 12"], run.stdout
    assert "without probes:" in run.stdout


def test_benchmark_suite_smoke(tmp_path):
    _benchmark("run.py", "--smoke", "--out", tmp_path, timeout=600)
    report = (tmp_path / "benchmarks.md").read_text()
    for section in (
        "### enqueue",
        "### throughput",
        "### dispatch (idle)",
        "### graph replay",
        "### targets",
    ):
        assert section in report
    assert "host_launch(HostFunction)" in report
    assert "| captured HostFunction node | -- " not in report  # it measured, did not fail
    assert "| captured Python callable node | -- " not in report
    assert "| captured Python node / captured compiled node |" in report
    # ab.py keys the targets by their text: no two lines may share one
    texts = [line.split(" | ")[0] for line in report.split("### targets")[1].splitlines()[3:]]
    assert len(texts) == len(set(texts)), texts
    # done_future's samples split at the result set: every kind measured both parts
    resolve = report.split("### done_future resolve")[1].split("### default lane")[0]
    assert "### done_future, device end to the result set" in resolve
    assert resolve.count("| µs |") == 8 and "| -- " not in resolve, resolve
    # Throughput on the simulator: 1 stream (also run behind held work) and 4 streams,
    # every row measured, and the held rows' ratio among the targets.
    throughput = report.split("### throughput")[1].split("###")[0]
    assert throughput.count("| µs/fn |") == 8, throughput
    floor = [line for line in throughput.splitlines() if line.startswith("| GIL floor")]
    others = [line for line in throughput.splitlines() if line not in floor]
    assert len(floor) == 2 and "| -- " not in "\n".join(others), throughput
    if shutil.which("cc") or shutil.which("gcc"):  # the floor is built and measured
        assert all("| -- " not in line for line in floor), throughput
    else:  # the installed wheel's stage of CI: no compiler, and the rows say so
        assert all("the GIL floor did not build" in line for line in floor), throughput
    held = "Python callable / HostFunction, 1 stream, run behind held work, enqueue not timed"
    assert f"| {held} | n/a |" not in report, report
    # The executor's enqueue, timed on the enqueuing thread: both launches measured.
    enqueue = report.split("### executor: enqueue, host time")[1].split("###")[0]
    assert enqueue.count("| µs/call |") == 2 and "| -- " not in enqueue, enqueue
    # The default lane's CPU: parked, polling for one wait, and a thread in sync().
    cpu = report.split("### default lane: process CPU time")[1].split("###")[0]
    assert cpu.count("| CPU s/s |") == 3 and "| -- " not in cpu, cpu
    for plot in ("enqueue.png", "throughput.png", "dispatch.png", "compile.png", "graphs.png"):
        assert (tmp_path / plot).read_bytes().startswith(b"\x89PNG"), plot


def test_benchmark_one_section(tmp_path):
    """--only runs that section alone: its table, the targets table, and its plot only."""
    _benchmark("run.py", "--smoke", "--only", "graphs", "--out", tmp_path)
    report = (tmp_path / "benchmarks.md").read_text()
    assert "### graph replay" in report and "### targets" in report
    assert "### enqueue" not in report and "### compile and import" not in report
    assert sorted(p.name for p in tmp_path.glob("*.png")) == ["graphs.png"]


@pytest.mark.skipif(
    not (pathlib.Path(SOURCES) / ".git").exists() or shutil.which("git") is None,
    reason="benchmarks/ab.py builds a git ref: it needs a git checkout of the source",
)
def test_ab_runner_smoke(tmp_path):
    """ab.py builds HEAD and the working tree apart and reports both sides of each figure."""
    env = child_env(NUMBA_HOSTFN_SIMULATOR="1")
    env.pop("LD_PRELOAD", None)  # its two builds are plain: a sanitizer runtime would not fit
    out, keep = tmp_path / "ab.md", tmp_path / "runs"
    args = ("HEAD", "--smoke", "--only", "graphs", "--rounds", 1, "--out", out, "--keep", keep)
    run = _benchmark("ab.py", *args, timeout=600, env=env, root=pathlib.Path(SOURCES))
    report = out.read_text()
    assert report == run.stdout.rstrip("\n") + "\n"
    assert "A = HEAD (" in report and "1 round(s)" in report
    # Each side ran in its own tree, A then B, and measured the section's rows.
    assert run.stderr.index("round 1/1, A:") < run.stderr.index("round 1/1, B:")
    rows = [line for line in report.splitlines() if line.startswith("| graph replay | captured")]
    compiled = next(line for line in rows if "captured HostFunction node" in line)
    cells = [c.strip() for c in compiled.split("|")]
    assert cells[4] != "--" and cells[5] != "--", compiled  # A and B both measured
    assert "| captured Python node / captured compiled node |" in report
    assert "executor round trip" not in report  # a section not run lists no target
    # --keep: each run's own report (run.py --out) and rows, by side and round.
    assert sorted(p.name for p in keep.iterdir()) == ["A-1", "A-1.json", "B-1", "B-1.json"]
    for side in ("A", "B"):
        own = (keep / f"{side}-1" / "benchmarks.md").read_text()
        assert "### graph replay" in own and "### targets" in own
        assert json.loads((keep / f"{side}-1.json").read_text())["rows"]


def test_ab_copies_a_tree_without_built_files_or_a_virtual_environment(tmp_path):
    """A side copied from a folder (a machine without the repository) leaves out what
    was built or installed there, a virtual environment included: it is no source,
    and a copied one is slow and would shadow the side's own build."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import ab
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    ref = tmp_path / "ref"
    for name in ("pkg/mod.py", ".venv/lib/site.py", "build/x.o", "pkg/_core.so"):
        (ref / name).parent.mkdir(parents=True, exist_ok=True)
        (ref / name).write_text("x")
    (ref / ".ab-commit").write_text("0123abc\n")
    dest = tmp_path / "dest"
    assert ab._tree_at(str(ref), str(dest)) == "0123abc"
    copied = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert copied == ["pkg/mod.py"], copied


def _section_script(code, *, timeout=60):
    """``code`` run in a child on the simulator with benchmarks/ importable (a
    section's own functions, driven with a package that misbehaves on purpose);
    its stdout.  A child that hangs fails the test (it is killed)."""
    env = child_env(NUMBA_HOSTFN_SIMULATOR="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "benchmarks"), env["PYTHONPATH"]])
    try:
        run = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the section hung:\n{exc.stdout}{exc.stderr}")
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


# A package as an A/B's older side may be: host_launch without blocking= or executor=.
_OLDER_PACKAGE = """
    import types
    import numba_hostfn as nh

    def host_launch(stream, fn, *, user_data=None, **kwargs):
        if kwargs:
            raise TypeError(f"host_launch() got an unexpected keyword {next(iter(kwargs))!r}")
        return nh.host_launch(stream, fn, user_data=user_data)

    older = types.SimpleNamespace(**{k: getattr(nh, k) for k in dir(nh) if k[:2] != "__"})
    older.host_launch = host_launch
"""


@pytest.mark.parametrize("section", ["asyncio", "executor"])
def test_a_failing_row_leaves_no_stream_held(section):
    """A row that fails between closing a gate and opening it (here: an older package
    refusing host_launch's blocking= or executor=) is its note, and the section goes
    on: its streams are not left held by the gate (which hung the next sync)."""
    call = {
        "asyncio": "bench_async._other_streams(older, device, stream, _bench.Gate(device), 2)",
        "executor": "bench_executor._cpu_time(older, device, nh.HostExecutor(threads=1), stream)",
    }[section]
    out = _section_script(
        _OLDER_PACKAGE
        + f"""
    import _bench, bench_async, bench_executor
    from numba_hostfn._demodevice import Device

    device = Device()
    stream = device.create_stream()
    {call}
    stream.sync()  # the section's streams were released
    print([row.note for row in _bench.ROWS if "TypeError" in row.note])
    """
    )
    assert "unexpected keyword" in out, out


def test_many_waits_counts_native_threads():
    """The 10k-waits target ("threads added == 0") counts the process's threads: the
    package's own (the default lane, a pool) are native, which threading's count
    leaves out.  Here each wait also starts a 1-thread pool: the row must see them."""
    out = _section_script(
        """
    import numba_hostfn as nh
    import _bench, bench_async
    from numba_hostfn._demodevice import Device

    pools = []

    class Spawning:
        def __getattr__(self, name):
            return getattr(nh, name)

        def async_done(self, stream):
            pools.append(nh.HostExecutor(threads=1))  # one native thread more
            return nh.async_done(stream)

    device = Device()
    stream = device.create_stream()
    bench_async._many_waits(Spawning(), stream, _bench.Gate(device), 3)
    print(_bench.find("3 concurrent waits", "threads added").samples[0])
    for pool in pools:
        pool.close()
    """
    )
    assert int(out.split()[-1]) >= 3, out


def test_host_copy_benchmark_checks_both_copies():
    """host_copy.py checks the data of each copy it times: a host_copy (the driver's
    thread) that copied nothing must not pass because np.copyto filled dst before it."""
    out = _section_script(
        """
    import numpy as np
    import numba_hostfn as nh
    import host_copy
    from numba_hostfn._demodevice import Device

    class NoCopy:
        def __getattr__(self, name):
            return getattr(nh, name)

        def host_copy(self, stream, dst, src, *, executor=None):
            if executor is not None:
                return nh.host_copy(stream, dst, src, executor=executor)
            return nh.host_launch(stream, lambda: None)  # enqueued, copies nothing

    device = Device()
    stream = device.create_stream()
    with nh.HostExecutor(threads=2) as executor:
        try:
            host_copy._measure(NoCopy(), stream, lambda: None, executor, 4096, 2)
        except SystemExit as exc:
            print("caught:", exc)
    stream.sync()
    """
    )
    assert "caught: host_copy produced wrong data" in out, out
