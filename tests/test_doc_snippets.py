"""Every Python snippet in the README and the docs pages runs, and so do the docstring examples.

A snippet gets ``stream`` (a stream of the backend in use); one whose first line is
"# Needs a GPU" is marked gpu.
"""

import doctest
import pathlib
import re

import pytest
from _device import rerun_on_simulator

import numba_hostfn
import numba_hostfn._decorator
import numba_hostfn._simulator

ROOT = pathlib.Path(__file__).parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def _snippets():
    for page in PAGES:
        for i, code in enumerate(BLOCK.findall(page.read_text())):
            marks = [pytest.mark.gpu] if code.startswith("# Needs a GPU") else []
            yield pytest.param(page.name, code, id=f"{page.stem}-{i}", marks=marks)


SNIPPETS = list(_snippets())


def test_the_pages_have_snippets():
    assert len(SNIPPETS) >= 3


@pytest.mark.parametrize("page, code", SNIPPETS)
def test_snippet_runs(stream, page, code):
    namespace = {"stream": stream}
    exec(compile(code, f"{page} snippet", "exec"), namespace)
    stream.sync()
    namespace.clear()  # what the snippet made (graphs too) goes, as at the end of a script
    numba_hostfn.drain()


def test_docstring_examples_of_the_compiler():
    result = doctest.testmod(numba_hostfn._decorator, extraglobs=vars(numba_hostfn))
    assert result.attempted > 0 and result.failed == 0


def test_docstring_examples_of_the_simulator(request):
    if rerun_on_simulator(request):
        return
    result = doctest.testmod(numba_hostfn._simulator, extraglobs=vars(numba_hostfn))
    assert result.attempted > 0 and result.failed == 0


def test_docstring_examples_of_user_data():
    import numba_hostfn._userdata

    result = doctest.testmod(numba_hostfn._userdata, extraglobs=vars(numba_hostfn))
    assert result.attempted > 0 and result.failed == 0
