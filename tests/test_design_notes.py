"""The design note beside the code stays true: every test it names exists."""

import pathlib
import re

import pytest
from _device import SOURCES

pytestmark = pytest.mark.checkout  # reads numba_hostfn/LIFETIME.md of the repository

ROOT = pathlib.Path(SOURCES)  # the checkout (conftest: CHECKOUT)


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


def test_the_free_threading_checklist_names_real_sites():
    """docs/compatibility.md's list of what a free-threaded build still needs names
    the state by its module and name: each private name (`_x`), `Class.attribute`
    and native file it names exists, so a rename or a move to C shows here (issue 32:
    it pointed at Python dicts that had moved to C)."""
    page = (ROOT / "docs" / "compatibility.md").read_text()
    checklist = page[page.index("what is left for a free-threaded build") :]
    checklist = checklist[: checklist.index("\n## ")]
    package = ROOT / "numba_hostfn"
    sources = {p.stem: p.read_text() for p in package.glob("*.py")}
    everything = "\n".join(sources.values())
    missing = []
    for name in re.findall(r"`([\w.]+)`", checklist):
        if name.endswith(".h"):
            continue  # CPython's headers
        if name.endswith(".c"):
            ok = (package / "native" / name).exists()
        elif "." in name.strip("."):
            ok = all(re.search(rf"\b{part}\b", everything) for part in name.split("."))
        elif name.startswith("_"):
            ok = name.lstrip(".") in sources or re.search(rf"\b{name}\b", everything) is not None
        else:
            continue  # a public or CPython name
        if not ok:
            missing.append(name)
    assert missing == [], missing
