"""Test helpers: the package's device stand-ins, and the environment for child processes."""

from __future__ import annotations

import os

from numba_hostfn._devicework import Device

__all__ = ["Device", "child_env"]


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
