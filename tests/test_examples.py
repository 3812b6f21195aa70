"""Every example runs (on the simulator in CI; on a GPU, with the real driver)."""

import pathlib
import subprocess
import sys

import pytest
from _device import child_env

EXAMPLES = sorted((pathlib.Path(__file__).parent.parent / "examples").glob("*.py"))


def test_there_are_examples():
    assert EXAMPLES


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs(path):
    run = subprocess.run(
        [sys.executable, str(path)], env=child_env(), capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "OK" in run.stdout
