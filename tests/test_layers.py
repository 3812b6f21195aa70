"""The package's layers: no import cycle among its modules, counting imports inside
functions, no private name imported from a sibling module, docs/design.md's module
map names every module, and no module imports one of a higher layer of that map
(issues 26, 32)."""

import ast
import collections
import re
from pathlib import Path

import pytest
from _device import SOURCES

pytestmark = pytest.mark.checkout  # reads the package's modules in the repository

ROOT = Path(SOURCES)  # the checkout (conftest: CHECKOUT)
PACKAGE = ROOT / "numba_hostfn"
MODULES = sorted(p.stem for p in PACKAGE.glob("*.py"))


def _imports() -> tuple[dict[str, set[str]], list[str]]:
    """Each module's imports of sibling modules (anywhere in it), and private names
    imported from one (``from ._x import _y``)."""
    edges: dict[str, set[str]] = collections.defaultdict(set)
    private = []
    for path in PACKAGE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or node.level != 1:
                continue
            if node.module:
                edges[path.stem].add(node.module.split(".")[0])
                private += [
                    f"{path.name}: from .{node.module} import {a.name}"
                    for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")
                ]
            else:
                edges[path.stem].update(a.name for a in node.names)
    return edges, private


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}

    def visit(module: str, path: list[str]) -> list[str] | None:
        state[module] = 1
        for other in sorted(edges.get(module, ())):
            if other not in MODULES:
                continue  # _core, the C extension, imports nothing of ours
            if state.get(other) == 1:
                return path[path.index(other) :] + [other]
            if not state.get(other) and (found := visit(other, path + [other])):
                return found
        state[module] = 2
        return None

    for module in MODULES:
        if not state.get(module) and (found := visit(module, [module])):
            return found
    return None


def test_no_import_cycle_counting_imports_inside_functions():
    edges, _ = _imports()
    assert _cycle(edges) is None, " -> ".join(_cycle(edges))


def test_the_cycle_check_finds_a_cycle():
    edges, _ = _imports()
    looped = {k: set(v) for k, v in edges.items()}
    looped["_errors"] = looped.get("_errors", set()) | {"_launch"}  # the lowest, up to the top
    assert _cycle(looped) is not None


def test_no_private_name_is_imported_from_a_sibling_module():
    _, private = _imports()
    assert private == [], private


def test_the_module_map_names_every_module():
    design = (ROOT / "docs" / "design.md").read_text()
    modules = [f"`{m}`" for m in MODULES if m != "__init__"]
    modules += ["`__init__`", "`_core`"]
    missing = [m for m in modules if m not in design]
    assert missing == [], missing
    native = [f"`{p.name}`" for p in (PACKAGE / "native").glob("*.[ch]")]
    assert [n for n in native if n not in design] == []


def _layers() -> dict[str, int]:
    """docs/design.md's layer of each module, from the map's table (``| 5 | `_x` | ...``)."""
    design = (ROOT / "docs" / "design.md").read_text()
    layers = {}
    for row in re.finditer(r"^\| (\d+) \| ([^|]+) \|", design, re.M):
        for name in re.findall(r"`(\w+)`", row.group(2)):
            layers[name] = int(row.group(1))
    return layers


def _upward(edges: dict[str, set[str]], layers: dict[str, int]) -> list[str]:
    return [
        f"{a} (layer {layers[a]}) imports {b} (layer {layers[b]})"
        for a, imported in sorted(edges.items())
        for b in sorted(imported)
        if a in layers and b in layers and layers[b] > layers[a]
    ]


def test_no_module_imports_a_higher_layer_of_the_map():
    """design.md's layer numbers are true: every import, inside functions too, points
    down or sideways (sideways without a cycle: the test above)."""
    edges, _ = _imports()
    layers = _layers()
    assert sorted(m for m in MODULES if m not in layers) == [], "a module the map gives no layer"
    assert _upward(edges, layers) == []


def test_the_layer_check_finds_an_upward_import():
    edges, _ = _imports()
    looped = {k: set(v) for k, v in edges.items()}
    looped["_records"] = looped.get("_records", set()) | {"_notify"}
    assert _upward(looped, _layers()) == ["_records (layer 2) imports _notify (layer 7)"]


def _driver_calls(source: str) -> list[str]:
    """What in a module's source could reach the CUDA driver other than through the
    native driver table: ctypes imported, or a ctypes prototype made."""
    tree = ast.parse(source)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name == "ctypes" for a in node.names):
            found.append("import ctypes")
        if isinstance(node, ast.ImportFrom) and node.module == "ctypes":
            found.append("from ctypes import ...")
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "CFUNCTYPE":
            found.append("ctypes.CFUNCTYPE(...)")
    return found


def test_the_cuda_backend_reaches_the_driver_only_through_the_native_table():
    """Issue 32: one driver table, in C.  The CUDA backend resolves its entry points
    (cuda.bindings' cuGetProcAddress, once) and hands them to ``_core.driver_load``;
    every launch, capture, graph and executor call is native.  Before, _cuda.py made
    ten ctypes ``CFUNCTYPE`` prototypes of driver entry points."""
    for name in ("_cuda", "_graphs", "_executor", "_enqueue", "_backend", "_notify"):
        assert _driver_calls((PACKAGE / f"{name}.py").read_text()) == [], name


def test_the_driver_call_check_finds_a_ctypes_prototype():
    source = "import ctypes\nf = ctypes.CFUNCTYPE(ctypes.c_int)(0)\n"
    assert _driver_calls(source) == ["import ctypes", "ctypes.CFUNCTYPE(...)"]
