"""The design notes name real code: every backticked name of ours in LIFETIME.md and
docs/design.md exists in the source, every file they name exists, and every test they
name is a test function of that file (issue 32: the map drifted, naming a removed
``py_enqueue_signal``)."""

import re
from pathlib import Path

import pytest
from _device import SOURCES

pytestmark = pytest.mark.checkout  # reads the package's sources and notes in the repository

ROOT = Path(SOURCES)  # the checkout (conftest: CHECKOUT)
NOTES = ("numba_hostfn/LIFETIME.md", "docs/design.md")
#: Names of other projects that the notes quote: asyncio's, concurrent.futures', numba's
#: and numpy's.  Everything else with an underscore is taken as ours.
EXTERNAL = {"call_soon", "as_completed", "add_reader", "set_env", "env_name", "copyto"}


def _source_words() -> set[str]:
    words: set[str] = set()
    for pattern in ("numba_hostfn/**/*.py", "numba_hostfn/native/*.[ch]", "tests/*.py"):
        for path in ROOT.glob(pattern):
            if path.name == Path(__file__).name and path.parent.name == "tests":
                continue  # this file names a removed name on purpose
            words.update(re.findall(r"\w+", path.read_text()))
    return words


def _named(note: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", (ROOT / note).read_text())


def _test_functions(file: str) -> set[str]:
    path = ROOT / "tests" / file
    return set(re.findall(r"^def (test_\w+)", path.read_text(), re.M)) if path.exists() else set()


def _problems(note: str, words: set[str]) -> list[str]:
    problems = []
    for text in _named(note):
        if "::" in text:  # a test: file::function
            file, function = text.split("::", 1)
            if function not in _test_functions(Path(file).name):
                problems.append(f"{text}: no such test")
            continue
        if re.fullmatch(r"[\w./*-]+\.(py|c|h|md)|[\w]+/", text):  # a file or folder
            if "*" in text:
                continue
            candidates = [
                ROOT / text,
                ROOT / "numba_hostfn" / text,
                ROOT / "numba_hostfn" / "native" / text,
                ROOT / "tests" / text,
            ]
            if not any(p.exists() for p in candidates):
                problems.append(f"{text}: no such file")
            continue
        lead = re.match(r"[A-Za-z_][\w.]*", text)
        if not lead:
            continue
        name = lead.group(0).rstrip(".").split(".")[-1]
        ours = "_" in name.strip("_") or lead.group(0).startswith(("_core.", "nhf"))
        if not ours or name in EXTERNAL or re.match(r"(Py|_Py|cu|CU_)", name):
            continue
        if name not in words:
            problems.append(f"{text}: {name} is nowhere in the source")
    return problems


@pytest.mark.parametrize("note", NOTES)
def test_every_name_a_design_note_gives_exists(note):
    assert _problems(note, _source_words()) == []


def test_the_check_finds_a_removed_name(tmp_path):
    words = _source_words() - {"nhf_record_take"}
    assert any("nhf_record_take" in p for p in _problems("numba_hostfn/LIFETIME.md", words))
