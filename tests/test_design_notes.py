"""The design note beside the code stays true: every test it names exists."""

import pathlib
import re

import pytest

pytestmark = pytest.mark.checkout  # reads numba_hostfn/LIFETIME.md of the repository

ROOT = pathlib.Path(__file__).parent.parent


def test_every_test_named_in_lifetime_md_exists():
    note = (ROOT / "numba_hostfn" / "LIFETIME.md").read_text()
    named = set(re.findall(r"`(test_\w+\.py)::(test_\w+)`", note))
    assert len(named) >= 11, "each invariant names at least one test"
    missing = [
        f"{module}::{test}"
        for module, test in sorted(named)
        if f"def {test}(" not in (ROOT / "tests" / module).read_text()
    ]
    assert missing == []


def test_invariants_are_numbered_in_order():
    note = (ROOT / "numba_hostfn" / "LIFETIME.md").read_text()
    numbers = [int(n) for n in re.findall(r"^(\d+)\. \*\*", note, flags=re.M)]
    assert numbers == list(range(1, len(numbers) + 1))
