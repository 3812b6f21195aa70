"""The main job, ``python -m numba_hostfn``, runs on whichever backend this suite uses."""

import subprocess
import sys

from _device import assert_no_ignored_errors, child_env


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
