"""The main job, ``python -m numba_hostfn``, runs on whichever backend this suite uses."""

import os
import shutil
import subprocess
import sys

from _device import assert_no_ignored_errors, child_env

import numba_hostfn


def test_main_job_runs_and_reports_order_and_costs():
    run = subprocess.run(
        [sys.executable, "-m", "numba_hostfn", "-n", "5"],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert_no_ignored_errors(run.stderr, "python -m numba_hostfn")
    out = run.stdout
    assert "cells [1, 10, 10, 2]: in order" in out
    assert "compiled HostFunction (no GIL)" in out and "Python callable" in out
    assert "main thread busy" in out


def test_main_job_says_plainly_when_it_uses_the_simulator():
    env = child_env(CUDA_VISIBLE_DEVICES="")
    env.pop("NUMBA_HOSTFN_SIMULATOR", None)
    run = subprocess.run(
        [sys.executable, "-m", "numba_hostfn", "-n", "5"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert_no_ignored_errors(run.stderr, "python -m numba_hostfn")
    assert "backend: simulator (no usable CUDA driver found" in run.stdout


def test_main_job_rejects_bad_arguments():
    run = subprocess.run(
        [sys.executable, "-m", "numba_hostfn", "-n", "1"],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 2
    assert "-n must be at least 5" in run.stderr


def test_main_job_says_what_to_set_for_a_switch_it_cannot_read():
    """NUMBA_HOSTFN_SIMULATOR set to neither on nor off: a usage error naming it, not
    a traceback (and not the simulator, which "off" selected)."""
    run = subprocess.run(
        [sys.executable, "-m", "numba_hostfn", "-n", "5"],
        env=child_env(NUMBA_HOSTFN_SIMULATOR="maybe"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 2 and not run.stdout, run.stdout + run.stderr
    assert run.stderr.startswith(
        "python -m numba_hostfn: error: NUMBA_HOSTFN_SIMULATOR='maybe' is neither on nor off"
    ), run.stderr


def test_main_job_says_what_to_set_for_a_watchdog_switch_it_cannot_read():
    """NUMBA_HOSTFN_CUDA_WATCHDOG set to neither on nor off, where the job runs on
    CUDA: a usage error naming it too (it was a ValueError traceback from Device()).
    A machine with a driver is stood in for: the job stops before CUDA is touched."""
    env = child_env(NUMBA_HOSTFN_CUDA_WATCHDOG="maybe")
    env.pop("NUMBA_HOSTFN_SIMULATOR", None)
    script = (
        "import sys\n"
        "from numba_hostfn import _process\n"
        "_process.cuda_driver_usable = lambda: True  # a machine with a driver\n"
        "from numba_hostfn.__main__ import main\n"
        "sys.exit(main(['-n', '5']))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 2 and not run.stdout, run.stdout + run.stderr
    assert run.stderr.startswith(
        "python -m numba_hostfn: error: NUMBA_HOSTFN_CUDA_WATCHDOG='maybe' is neither on nor off"
    ), run.stderr


def test_a_package_without_its_built_core_says_so(tmp_path):
    """A checkout whose native core is not built for this Python (no install yet, or a
    wheel installed and Python started in the checkout) names the missing extension
    and how to build it; Python's own message blames a circular import."""
    source = os.path.dirname(os.path.abspath(numba_hostfn.__file__))
    shutil.copytree(
        source,
        tmp_path / "numba_hostfn",
        ignore=lambda _, names: [n for n in names if n.startswith("_core.") and n != "_core.pyi"],
    )
    env = child_env()
    env["PYTHONPATH"] = os.pathsep.join(  # no other copy of the package on the path
        p
        for p in env["PYTHONPATH"].split(os.pathsep)
        if not os.path.isdir(os.path.join(p, "numba_hostfn"))
    )
    # Only the copy is importable: not an editable install's finder, which maps
    # numba_hostfn's submodules to its own tree.
    only_the_copy = (
        "import sys; sys.meta_path[:] = "
        "[f for f in sys.meta_path if '__editable__' not in getattr(f, '__module__', '')]; "
        "import numba_hostfn"
    )
    run = subprocess.run(
        [sys.executable, "-c", only_the_copy],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError:"), run.stderr
    assert "circular import" not in last, last
    assert "native core" in last and "not built" in last and "pip install" in last, last
