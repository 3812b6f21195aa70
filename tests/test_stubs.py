"""numba_hostfn/_core.pyi against the built extension module.

mypy.stubtest imports ``numba_hostfn._core`` (the one this suite imports: the
checkout's in-place build, or an installed wheel's) and checks every name of the
stub against it, and every public runtime name against the stub: a missing or
extra function, class, attribute or constant, a class that can or cannot be
subclassed, and a signature the C side spells in its ``__text_signature__`` that
the stub spells otherwise.  Stubtest skips the runtime's private names (``_bind``,
``_pool``, ...) that the stub leaves out; ``test_stub_names_every_runtime_name``
covers those.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from numba_hostfn import _core

STUB = Path(_core.__file__).with_name("_core.pyi")


def test_stub_is_beside_the_module():
    # A wheel without the stub (package-data) fails here, in .ci/run's wheel stage.
    assert STUB.is_file(), f"no _core.pyi beside {_core.__file__}"


def test_stubtest(tmp_path):
    config = tmp_path / "mypy.ini"
    # follow_imports=silent: the package's own modules (imported as the stub's
    # parent package) are type-checked, but their errors are not stubtest's.
    config.write_text(f"[mypy]\nfollow_imports = silent\ncache_dir = {tmp_path / 'cache'}\n")
    command = [sys.executable, "-m", "mypy.stubtest", "--mypy-config-file", str(config)]
    # mypy finds the package in the folder above it (a checkout), or as an installed,
    # py.typed package (site-packages): either way the one imported here.  Not run
    # from site-packages itself: mypy refuses its top-level modules that shadow
    # library ones (typing_extensions.py), as the wheel stage of .ci/run showed.
    root = STUB.parent.parent
    checkout = (root / "pyproject.toml").is_file()
    done = subprocess.run(
        [*command, "numba_hostfn._core"],
        cwd=root if checkout else tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, f"stubtest failed:\n{done.stdout}{done.stderr}"


def _stub_names():
    """The stub's top-level names, and each class's own names."""
    tree = ast.parse(STUB.read_text(), str(STUB))
    names, members = set(), {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            names.add(node.name)
            members[node.name] = {
                item.name
                for item in node.body
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
            } | {
                item.target.id
                for item in node.body
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
            }
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names, members


def _dunder(name):
    return name.startswith("__") and name.endswith("__")


def test_stub_names_every_runtime_name():
    names, members = _stub_names()
    runtime = {name for name in dir(_core) if not _dunder(name)}
    assert runtime - names == set(), "in _core, not in _core.pyi"
    for name in sorted(names & runtime):
        cls = getattr(_core, name)
        if isinstance(cls, type):
            own = {member for member in vars(cls) if not _dunder(member)}
            assert own - members[name] == set(), f"in _core.{name}, not in the stub's class"


def test_the_stub_names_every_testing_hook():
    """The stub types _core._testing as a module and names its hooks in a comment;
    the comment is all a reader has (driver_address was missing from it)."""
    text = STUB.read_text()
    start = text.index("# ---- the hooks for tests only")
    start = text.index(":\n", start) + 2
    comment = text[start : text.index(".  Not an API", start)].replace("#", "")
    listed = {name.strip() for name in comment.split(",")}
    runtime = {name for name in dir(_core._testing) if not _dunder(name)}
    assert runtime - listed == set(), "in _core._testing, not in _core.pyi's comment"
    assert listed - runtime == set(), "in _core.pyi's comment, not in _core._testing"


def test_dispatcher_run_refuses_more_arguments_than_its_signature():
    """Dispatcher.run($self, block=True, read_first=False, nested=False, /) ignored a
    surplus argument (and any after it) where every other entry point refuses a wrong
    count."""
    from numba_hostfn import _notify

    channel = _notify._Channel(wake_main=False, nonblocking=True)
    assert channel.dispatcher.run(False, False) == 0
    assert channel.dispatcher.run(False, False, True) == 0  # nested, outside a batch: one
    with pytest.raises(TypeError, match="at most 3"):
        channel.dispatcher.run(False, False, False, "extra")
