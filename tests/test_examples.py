"""Every example runs: on the simulator in CI, and all of them on a GPU.

An example whose banner says "# Needs a GPU" is marked gpu (skipped only on the
simulator).
"""

import pathlib
import subprocess
import sys

import pytest
from _device import assert_no_ignored_errors, child_env

EXAMPLES = sorted((pathlib.Path(__file__).parent.parent / "examples").glob("*.py"))


def _param(path):
    needs_gpu = "# Needs a GPU" in path.read_text()
    return pytest.param(path, id=path.stem, marks=[pytest.mark.gpu] if needs_gpu else [])


def test_every_example_has_a_banner_and_a_main():
    assert len(EXAMPLES) >= 6
    for path in EXAMPLES:
        text = path.read_text()
        assert text.startswith("# What this shows:"), path.name
        assert "def main()" in text and 'if __name__ == "__main__":' in text, path.name


@pytest.mark.parametrize("path", [_param(p) for p in EXAMPLES])
def test_example_runs(path):
    run = subprocess.run(
        [sys.executable, str(path)], env=child_env(), capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert_no_ignored_errors(run.stderr, path.name)
    assert "OK" in run.stdout
