"""The documentation keeps up with the code: every public name has a reference entry."""

import pathlib
import re

import numba_hostfn

API = (pathlib.Path(__file__).parent.parent / "docs" / "api.md").read_text()


def test_every_public_name_has_a_reference_entry():
    documented = set(re.findall(r"numba_hostfn\.([A-Za-z_][\w.]*)", API))
    public = {n for n in numba_hostfn.__all__ if n != "simulator"}
    public |= {f"simulator.{n}" for n in numba_hostfn.simulator.__all__}
    public.discard("simulator.SimulatorUnsupportedError")  # the same class, documented once
    assert sorted(public - documented) == []


def test_every_public_member_of_a_documented_class_is_listed():
    """Each class's ``:members:`` list names all its public members (graph_nodes was missing)."""
    listed = {}
    for cls, members in re.findall(
        r"autoclass:: numba_hostfn\.([\w.]+)\n\s+:members: ((?:.+\n)(?:\s{6,}.+\n)*)", API
    ):
        listed[cls] = {m.strip() for m in members.replace("\n", " ").split(",") if m.strip()}
    classes = {
        "HostFunction": numba_hostfn.HostFunction,
        "HostExecutor": numba_hostfn.HostExecutor,
        "ByRef": numba_hostfn.ByRef,
        "Record": numba_hostfn.Record,
        "simulator.Stream": numba_hostfn.simulator.Stream,
        "simulator.GraphBuilder": numba_hostfn.simulator.GraphBuilder,
        "simulator.Graph": numba_hostfn.simulator.Graph,
    }
    for name, cls in classes.items():
        public = {m for m in dir(cls) if not m.startswith("_")}
        public |= {m for m in ("__call__", "__cuda_stream__") if m in vars(cls)}
        assert sorted(public - listed.get(name, set())) == [], name


def test_no_snippet_names_its_own_function_after_a_public_api_name():
    """A snippet's own function or variable named like the API beside it (a host
    function called ``record`` on the page that documents ``nh.record``) reads as
    the API: every name a snippet defines differs from numba_hostfn's public names."""
    import ast

    docs = pathlib.Path(__file__).parent.parent / "docs"
    pages = [docs.parent / "README.md", *sorted(docs.glob("*.md"))]
    public = set(numba_hostfn.__all__)
    clashes = []
    for page in pages:
        for code in re.findall(r"^```python\n(.*?)^```", page.read_text(), re.S | re.M):
            for node in ast.walk(ast.parse(code)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    names = [node.name]
                elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                    names = [node.id]
                else:
                    continue
                clashes += [f"{page.name}: {n}" for n in names if n in public]
    assert clashes == []


def test_docs_link_only_to_pages_the_site_has_and_hide_no_dead_link():
    """A relative link to a .md outside docs/ (``../numba_hostfn/LIFETIME.md``) is no
    page of the site: Sphinx reports it as myst.xref_missing, which conf.py must not
    suppress (it hid two such links)."""
    docs = pathlib.Path(__file__).parent.parent / "docs"
    conf = (docs / "conf.py").read_text()
    assert "xref_missing" not in conf and "suppress_warnings" not in conf
    dead = []
    for page in sorted(docs.glob("*.md")):
        text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            path = target.split("#")[0]
            if "://" in target or not path.endswith(".md"):
                continue
            if (page.parent / path).resolve().parent != docs.resolve():
                dead.append(f"{page.name}: {target}")
            elif not (page.parent / path).exists():
                dead.append(f"{page.name}: {target}")
    assert dead == []
