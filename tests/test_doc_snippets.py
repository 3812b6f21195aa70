"""Every Python snippet in the README and the docs pages runs as written, and so do the
docstring examples.

Each snippet is written to a file of its own and run by a fresh ``python``, exactly
as a reader who pastes it would run it: nothing is injected, so a snippet makes its
own stream (``nh.simulate_without_gpu()`` first, where it runs without a GPU). A
snippet whose first line is "# Needs a GPU" is marked gpu: the GPU suite runs it,
the simulator run skips it.
"""

import doctest
import pathlib
import re
import subprocess
import sys

import pytest
from _device import assert_no_ignored_errors, child_env, rerun_on_simulator

import numba_hostfn
import numba_hostfn._hostfunction
import numba_hostfn._process
import numba_hostfn._simulator
from numba_hostfn._process import SIMULATOR_ENV

ROOT = pathlib.Path(__file__).parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
GPU_MARKER = "# Needs a GPU"
#: How many snippets the pages hold (raise these as snippets are added): a snippet
#: that the pattern stops finding (a changed fence, say) must fail, not vanish.
MIN_SNIPPETS, MIN_GPU_SNIPPETS = 16, 4


def _snippets():
    for page in PAGES:
        for i, code in enumerate(BLOCK.findall(page.read_text())):
            marks = [pytest.mark.gpu] if code.startswith(GPU_MARKER) else []
            yield pytest.param(page.name, code, id=f"{page.stem}-{i}", marks=marks)


SNIPPETS = list(_snippets())


def test_every_snippet_is_found():
    gpu_only = [p for p in SNIPPETS if p.values[1].startswith(GPU_MARKER)]
    assert len(SNIPPETS) >= MIN_SNIPPETS, [p.id for p in SNIPPETS]
    assert len(gpu_only) >= MIN_GPU_SNIPPETS, [p.id for p in gpu_only]
    assert len(SNIPPETS) - len(gpu_only) >= MIN_SNIPPETS - MIN_GPU_SNIPPETS


def _reader_env() -> dict:
    """The environment a reader's ``python`` has: this checkout importable, and the
    simulator variable only if the user set it.  Where the test run chose the
    simulator because no driver was found, the variable is dropped, so that the
    snippet's own ``simulate_without_gpu()`` must choose it, as it would for a reader.
    """
    env = child_env()
    if getattr(numba_hostfn._process.get_backend(), "chosen_because", ""):
        env.pop(SIMULATOR_ENV, None)
    return env


@pytest.mark.parametrize("page, code", SNIPPETS)
def test_snippet_runs(page, code, tmp_path):
    script = tmp_path / f"{pathlib.Path(page).stem}_snippet.py"
    script.write_text(code)
    try:
        run = subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,
            env=_reader_env(),
            capture_output=True,
            text=True,
            timeout=240,
        )
    except subprocess.TimeoutExpired as hung:
        pytest.fail(f"the {page} snippet hung:\n{code}\nstderr:\n{hung.stderr}")
    assert run.returncode == 0, (
        f"the {page} snippet failed (rc {run.returncode}):\n{code}\n"
        f"stderr:\n{run.stderr}\nstdout:\n{run.stdout}"
    )
    # A reader sees stderr too: an error printed at exit is a failure, though the
    # return code is 0 (two snippets printed one at every exit, unseen).
    assert_no_ignored_errors(run.stderr, f"the {page} snippet\n{code}\n")


def test_docstring_examples_of_the_compiler():
    result = doctest.testmod(numba_hostfn._hostfunction, extraglobs=vars(numba_hostfn))
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
