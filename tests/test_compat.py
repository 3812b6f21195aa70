"""The private hooks the package relies on: all present, all reached through ``_compat``,
and the oldest versions that pyproject declares are the ones CI runs against."""

import re
from pathlib import Path

import pytest
from _device import SOURCES

from numba_hostfn import _compat

ROOT = Path(SOURCES)  # the checkout (conftest: CHECKOUT)
# How a private API of another package shows in Python source: a private name of
# one of its modules, an import of one, numba's internal modules, the CFunc and
# flags internals a host function is compiled with, a ctypes pointer's buffer
# read, the interpreter's own private functions, and a prototype's flags.
PRIVATE = re.compile(
    r"\b(ctypes|threading|asyncio|sys|inspect|numba|cuda|llvmlite)(\.\w+)*\._[A-Za-z]"
    r"|^\s*from (ctypes|threading|asyncio|numba|cuda|llvmlite)[\w.]* import [^\n]*\b_[A-Za-z]"
    r"|^\s*(from|import) numba\.core"
    r"|\._(sig|targetdescr|cache|cache_hits|compile_uncached|library|wrapper_name"
    r"|wrapper_address|values|customize_flags|flags_)\b"
    r"|\.(subtarget|set_env)\(|\.env_name\b|__text_signature__|\.from_buffer\("
    r"|_PyEval_|_PyThreadState|PyInterpreterState_Main|\b_CFuncCompiler\b|\b_customize_flags\b",
    re.M,
)
# In the native core: CPython's private functions (a leading underscore).
PRIVATE_C = re.compile(r"\b_Py[A-Z]\w*")
#: The private CPython functions the native core may use: _compat's table lists them.
ALLOWED_C = {"_PyThreadState_UncheckedGet", "_PyEval_AddPendingCall"}


def test_every_private_hook_is_present():
    missing = [name for name, present in _compat.hooks().items() if not present]
    assert not missing, f"private APIs gone in this Python/numba: {missing} (see _compat.py)"


@pytest.mark.checkout
def test_only_the_compat_module_reaches_private_names():
    offenders = [
        f"{path.name}: {match.group(0).strip()}"
        for path in sorted((ROOT / "numba_hostfn").glob("*.py"))
        if path.name != "_compat.py"
        for match in PRIVATE.finditer(path.read_text())
    ]
    assert not offenders, offenders


@pytest.mark.parametrize(
    "line",
    [
        "threading._register_atexit(fn)",
        "isinstance(t, threading._DummyThread)",
        "asyncio._get_running_loop()",
        "ctypes.pythonapi._PyEval_AddPendingCall",
        "ctypes._CFuncPtr",
        "from ctypes import _Pointer",
        "from numba.core.ccallback import CFunc",
        "cfunc._sig",
        "self._targetdescr = target",
        "self._cache.load_overload(sig)",
        "self._cache_hits += 1",
        "self._compile_uncached()",
        "flags._values['no_compile']",
        "class C(_CFuncCompiler):\n    def _customize_flags(self, flags): ...",
        "context.subtarget()",
        "codegen.set_env(name, env)",
        "cres.fndesc.env_name",
        "type(fn)._flags_",
        "fn.__text_signature__",
        "ctypes.c_void_p.from_buffer(fn).value",
    ],
)
def test_the_scan_finds_each_kind_of_hook(line):
    """Each hook _compat's table lists would be caught outside _compat."""
    assert PRIVATE.search(line), line


@pytest.mark.checkout
def test_the_native_core_uses_no_private_cpython_api_but_the_listed_ones():
    used = {
        match.group(0)
        for path in sorted((ROOT / "numba_hostfn" / "native").glob("*.[ch]"))
        for match in PRIVATE_C.finditer(path.read_text())
    }
    assert used <= ALLOWED_C, used - ALLOWED_C
    table = _compat.__doc__
    assert all(name in table for name in ALLOWED_C)


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


def test_classifiers_name_the_pythons_ci_runs():
    """pyproject's Python classifiers are the versions .ci/run installs and tests."""
    pyproject = (ROOT / "pyproject.toml").read_text()
    classified = set(re.findall(r'"Programming Language :: Python :: (3\.\d+)"', pyproject))
    ci = (ROOT / ".ci/run").read_text()
    first = set(re.findall(r"^MAIN=(3\.\d+)", ci, re.M))
    looped = re.search(r"^for version in ([0-9. ]+); do", ci, re.M)
    assert looped is not None, "the loop over the other Pythons moved: update this test"
    tested = first | set(looped.group(1).split())
    assert classified == tested, (classified, tested)
