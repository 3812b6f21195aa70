"""Test helpers: the package's device stand-ins, and the environment for child processes."""

from __future__ import annotations

import os

from numba_hostfn._devicework import Device

__all__ = ["Device", "child_env", "rerun_on_simulator"]


def child_env(**extra: str) -> dict:
    """The environment for a child Python: this backend, and this checkout importable."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [root, os.path.dirname(os.path.abspath(__file__))]
        + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    env.update(extra)
    return env


def rerun_on_simulator(request) -> bool:
    """On the CUDA backend, run this test in a child pytest on the simulator.

    Returns True when it did (the caller then returns: the child's pass is the
    test's result), False when this process already uses the simulator.  This
    way simulator behaviour is checked on GPU machines too, with no skip.
    """
    import subprocess
    import sys

    import numba_hostfn

    if numba_hostfn.backend_name() == "simulator":
        return False
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", request.node.nodeid],
        cwd=root,
        env=child_env(NUMBA_HOSTFN_SIMULATOR="1"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0 and "1 passed" in run.stdout, run.stdout + run.stderr
    return True
