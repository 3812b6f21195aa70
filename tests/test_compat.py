"""The private hooks the package relies on: all present, all reached through ``_compat``,
and the oldest versions that pyproject declares are the ones CI runs against."""

import re
from pathlib import Path

from numba_hostfn import _compat

ROOT = Path(__file__).resolve().parents[1]
PRIVATE = re.compile(
    r"ctypes\._[A-Za-z]|threading\._[a-z]|asyncio\._[a-z]|^\s*(from|import) numba\.core", re.M
)


def test_every_private_hook_is_present():
    missing = [name for name, present in _compat.hooks().items() if not present]
    assert not missing, f"private APIs gone in this Python/numba: {missing} (see _compat.py)"


def test_only_the_compat_module_reaches_private_names():
    offenders = [
        f"{path.name}: {match.group(0).strip()}"
        for path in sorted((ROOT / "numba_hostfn").glob("*.py"))
        if path.name != "_compat.py"
        for match in PRIVATE.finditer(path.read_text())
    ]
    assert not offenders, offenders


def test_declared_minimums_are_the_versions_ci_runs_as_oldest():
    """pyproject's lower bounds, and .ci/oldest.txt's pins, name the same versions."""
    pyproject = (ROOT / "pyproject.toml").read_text()
    dependencies = pyproject.split("dependencies = [")[1].split("]")[0]
    declared = dict(re.findall(r'"([a-z-]+)>=([0-9.]+)"', dependencies))
    pinned = dict(re.findall(r"^([a-z-]+)==([0-9.]+)", (ROOT / ".ci/oldest.txt").read_text(), re.M))
    assert {k: _version(v) for k, v in declared.items()} == {
        k: _version(v) for k, v in pinned.items()
    }, (declared, pinned)


def _version(text: str) -> tuple[int, ...]:
    parts = [int(p) for p in text.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))
