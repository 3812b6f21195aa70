"""The native core's layers: no call cycle among numba_hostfn/native/*.c, every file
listed in pyproject.toml's ext-modules and described in docs/design.md's C map, and
no file using one of a higher layer of that map (issue 32).

A file *uses* another when it names a non-static function or global variable that the
other defines: a call, an address taken (``nhf_add_address``, a comparison), a global
read.  Static names belong to their file.  The parse is a careful regex over the
sources with comments and string literals stripped, enough for this code's C11 (no
function returning a function pointer, no K&R definitions)."""

import re
from pathlib import Path

import pytest
from _device import SOURCES

pytestmark = pytest.mark.checkout  # reads the native sources in the repository

ROOT = Path(SOURCES)  # the checkout (conftest: CHECKOUT)
NATIVE = ROOT / "numba_hostfn" / "native"

_LEXEME = re.compile(
    r"""(?P<comment>/\*.*?\*/|//[^\n]*)"""
    r"""|(?P<string>"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*')"""
    r"""|(?P<directive>^[ \t]*\#(?:\\\n|[^\n])*)""",
    re.S | re.M,
)
_TOKEN = re.compile(r"[A-Za-z_]\w*|[{}()\[\];=]")


def _stripped(text: str) -> str:
    """The code without comments, string or character literals and preprocessor lines
    (newlines kept)."""

    def blank(match: re.Match) -> str:
        return "\n" * match.group(0).count("\n") + (" " if match.group("comment") else '""')

    return _LEXEME.sub(blank, text)


def _definitions(code: str) -> tuple[set[str], set[str]]:
    """(non-static, static) names of the functions and variables defined at file scope."""
    exported, private = set(), set()
    tokens = _TOKEN.findall(code)
    statement: list[str] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token == "{" and statement and statement[-1] == ")" and "=" not in statement:
            name = statement[statement.index("(") - 1]  # a function: the name before "("
            (private if "static" in statement else exported).add(name)
            depth = 0
            while True:  # skip the body
                depth += {"{": 1, "}": -1}.get(tokens[i], 0)
                i += 1
                if depth == 0:
                    break
            statement = []
            continue
        if token == "{":  # a struct's, an enum's or an initializer's braces: one token
            depth = 0
            while True:
                depth += {"{": 1, "}": -1}.get(tokens[i], 0)
                i += 1
                if depth == 0:
                    break
            statement.append("{}")
            continue
        if token == ";":
            if statement and statement[0] not in ("typedef", "extern"):
                _declared(statement, exported, private)
            statement = []
        else:
            statement.append(token)
        i += 1
    return exported, private


def _declared(statement: list[str], exported: set[str], private: set[str]) -> None:
    """A file-scope declaration's variable, if it defines one (not a prototype, not a
    bare struct or enum definition)."""
    head = statement[: statement.index("=")] if "=" in statement else statement
    while "_Atomic" in head and head[head.index("_Atomic") + 1 :][:1] == ["("]:
        at = head.index("_Atomic")  # _Atomic(T): a type, not a prototype's parameters
        head = head[:at] + ["atomic"] + head[head.index(")", at) + 1 :]
    if "(" in head:
        return  # a prototype, a _Static_assert
    while head and head[-1] == "]":  # an array: its name is before the brackets
        head = head[: len(head) - 1 - head[::-1].index("[")]
    if (
        len(head) < 2
        or not re.fullmatch(r"[A-Za-z_]\w*", head[-1])
        or head[-2] in ("struct", "enum", "union")
    ):
        return
    (private if "static" in statement else exported).add(head[-1])


def _sources() -> dict[str, str]:
    return {p.name: _stripped(p.read_text()) for p in sorted(NATIVE.glob("*.c"))}


def _uses(sources: dict[str, str]) -> dict[str, set[str]]:
    """For each file, the files whose non-static names it uses."""
    defined = {name: _definitions(code) for name, code in sources.items()}
    owner: dict[str, str] = {}
    for name, (exported, _) in defined.items():
        for symbol in exported:
            owner[symbol] = name
    edges = {}
    for name, code in sources.items():
        own = defined[name][0] | defined[name][1]
        words = set(re.findall(r"[A-Za-z_]\w*", code)) - own
        edges[name] = {owner[w] for w in words if w in owner and owner[w] != name}
    return edges


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for other in sorted(edges.get(node, ())):
            if state.get(other) == 1:
                return path[path.index(other) :] + [other]
            if not state.get(other) and (found := visit(other, path + [other])):
                return found
        state[node] = 2
        return None

    for node in sorted(edges):
        if not state.get(node) and (found := visit(node, [node])):
            return found
    return None


def _tangled(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one file (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(edges.get(node, ())):
            if other not in index:
                connect(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            connect(node)
    return groups


def _report(edges: dict[str, set[str]]) -> str:
    lines = [" -> ".join(_cycle(edges) or [])]
    for group in _tangled(edges):
        lines.append(f"files that reach each other: {', '.join(group)}")
        lines += [f"  {a} uses {', '.join(sorted(edges[a] & set(group)))}" for a in group]
    return "\n".join(lines)


def test_no_call_cycle_among_the_native_files():
    edges = _uses(_sources())
    assert _cycle(edges) is None, "a call cycle among native/*.c:\n" + _report(edges)


def test_the_parse_finds_definitions_and_uses():
    sources = _sources()
    exported, private = _definitions(sources["records.c"])
    assert {"nhf_record_take", "nhf_drain"} <= exported
    assert {"schedule_drain", "free_list", "handoff"} <= private
    assert not exported & private
    edges = _uses(sources)
    assert "records.c" in edges["trampolines.c"]  # nhf_record_complete
    assert "guard.c" in edges["records.c"]  # nhf_guard_enter
    assert not edges["guard.c"] - {"util.c"}


def test_the_cycle_check_finds_a_cycle():
    sources = _sources()
    # guard.c, the lowest but util.c, calls the module root.
    sources["guard.c"] += "\nstatic void up(void) { PyInit__core(); }\n"
    edges = _uses(sources)
    assert "module.c" in edges["guard.c"]
    assert _cycle(edges) is not None


def _c_map() -> dict[str, int]:
    """docs/design.md's C map: each native file's layer (``| 3 | `records.c` | ...``)."""
    design = (ROOT / "docs" / "design.md").read_text()
    section = design[design.index("The native core") :]
    layers = {}
    for row in re.finditer(r"^\| (\d+) \| `([\w.]+\.[ch])` \| [^|\n]*\S[^|\n]* \|", section, re.M):
        layers[row.group(2)] = int(row.group(1))
    return layers


def _upward(edges: dict[str, set[str]], layers: dict[str, int]) -> list[str]:
    return [
        f"{a} (layer {layers[a]}) uses {b} (layer {layers[b]})"
        for a in sorted(edges)
        for b in sorted(edges[a])
        if a in layers and b in layers and layers[b] > layers[a]
    ]


def test_the_c_map_describes_every_native_file_with_a_layer():
    layers = _c_map()
    files = sorted(p.name for p in NATIVE.glob("*.[ch]"))
    assert [f for f in files if f not in layers] == [], "described in no row of the C map"
    assert [f for f in layers if f not in files] == [], "the C map names a file that is gone"


def test_no_native_file_uses_a_higher_layer_of_the_map():
    layers = _c_map()
    assert _upward(_uses(_sources()), layers) == []
    root = max(layers.values())
    assert [f for f, n in layers.items() if n == root] == ["module.c"], "module.c alone on top"


def test_the_layer_check_finds_an_upward_use():
    edges = {k: set(v) for k, v in _uses(_sources()).items()}
    edges["records.c"].add("module.c")
    layers = _c_map()
    assert _upward(edges, layers) == [
        f"records.c (layer {layers['records.c']}) uses module.c (layer {layers['module.c']})"
    ]


def _ext_module_files(key: str) -> set[str]:
    """The file names of pyproject.toml's ext-modules list ``key`` (sources, depends)."""
    config = (ROOT / "pyproject.toml").read_text()
    section = config[config.index("[[tool.setuptools.ext-modules]]") :]
    listed = re.search(rf"^{key} = \[(.*?)\]", section, re.S | re.M).group(1)
    return {Path(s).name for s in re.findall(r'"([^"]+)"', listed)}


def test_pyproject_builds_every_native_file():
    assert _ext_module_files("sources") == {p.name for p in NATIVE.glob("*.c")}
    assert _ext_module_files("depends") == {p.name for p in NATIVE.glob("*.h")}
