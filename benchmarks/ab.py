"""A/B: the package at a git REF against the working tree, on one machine, in one run.

    python benchmarks/ab.py REF                         # every section, 2 rounds
    python benchmarks/ab.py f5a1de3 --only enqueue --only executor --rounds 2
    python benchmarks/ab.py HEAD --smoke --only graphs   # a tiny run (the suite's smoke test)

Machines differ (the same C loop measured 0.44, 1.0 and 1.65 us on three H200 machines), so
a before/after figure means something only when both sides ran on one machine at one time.
This script builds two trees side by side in a temporary folder:

- A: the package as committed at REF (``git archive``);
- B: the working tree as it is (tracked and untracked files that git does not ignore);

each with its own native extension built in place (``build_ext --inplace``), and both with
the *working tree's* ``benchmarks/``: the measuring code is the same on both sides and only
the package differs (a row that REF's package cannot run fails on side A, and says so).
Then it runs ``benchmarks/run.py --only ... --json`` for each side in a fresh process,
alternately (A B, then B A, ...) for ``--rounds`` rounds, so that drift over minutes hits
both sides alike, and prints for every target and every row the median over rounds of each
side's figure, the min-max over rounds, and B/A.  Each child checks that it imported the
package of its own tree.  Progress goes to stderr; the report to stdout (and ``--out``).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _git(*args: str) -> bytes:
    return subprocess.run(["git", "-C", ROOT, *args], check=True, capture_output=True).stdout


# What a copy of a tree without git leaves out: built and installed files, other sides.
_NOT_SOURCE = shutil.ignore_patterns(
    ".git",
    ".venv",
    "build",
    "*.egg-info",
    "__pycache__",
    "*.so",
    ".ab-*",
    ".ci-*",
    ".whl",
    ".out",
    ".probe",
)


def _tree_at(ref: str, dest: str) -> str:
    """The files committed at ``ref`` into ``dest``; returns the full commit id.

    ``ref`` may also be a folder holding such a tree (``git archive REF | tar -x -C
    DIR``, with the commit id in ``DIR/.ab-commit``): on a machine that has the files
    but not the repository (a copy of the working tree), the tree travels that way.
    """
    if os.path.isdir(ref):
        shutil.copytree(ref, dest, ignore=_NOT_SOURCE, dirs_exist_ok=True)
        marker = os.path.join(ref, ".ab-commit")
        if not os.path.exists(marker):
            raise SystemExit(f"{ref} is a folder without .ab-commit: say which commit it holds")
        with open(marker) as f:
            return f.read().strip()
    commit = _git("rev-parse", "--verify", f"{ref}^{{commit}}").decode().strip()
    with tarfile.open(fileobj=io.BytesIO(_git("archive", commit)), mode="r:") as tar:
        # The "data" filter exists from 3.12 and in the security releases of 3.10-3.11.
        kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(dest, **kwargs)
    return commit


def _working_tree(dest: str) -> None:
    """The working tree's tracked and untracked, not ignored, files into ``dest``.

    Without a repository (a copy of the working tree), every file but built ones.
    """
    try:
        _git("rev-parse", "--git-dir")
    except (OSError, subprocess.CalledProcessError):
        shutil.copytree(ROOT, dest, ignore=_NOT_SOURCE, dirs_exist_ok=True)
        return
    names = _git("ls-files", "-z", "--cached", "--others", "--exclude-standard").split(b"\0")
    for name in filter(None, (n.decode() for n in names)):
        src = os.path.join(ROOT, name)
        if os.path.isfile(src):  # a tracked file deleted in the working tree is skipped
            os.makedirs(os.path.dirname(os.path.join(dest, name)), exist_ok=True)
            shutil.copy2(src, os.path.join(dest, name))


def _build(tree: str, label: str) -> None:
    """Build the native extension of ``tree`` in place, with the pyproject's own flags."""
    print(f"[ab] building {label} ...", file=sys.stderr, flush=True)
    run = subprocess.run(
        [sys.executable, "-c", "from setuptools import setup; setup()", "build_ext", "--inplace"],
        cwd=tree,
        capture_output=True,
        text=True,
    )
    if run.returncode:
        raise SystemExit(f"building {label} failed:\n{run.stdout}{run.stderr}")


def _same_benchmarks(tree: str) -> None:
    """The working tree's benchmarks/ replace the tree's own: one measuring code for both."""
    shutil.rmtree(os.path.join(tree, "benchmarks"), ignore_errors=True)
    shutil.copytree(
        HERE, os.path.join(tree, "benchmarks"), ignore=shutil.ignore_patterns("__pycache__")
    )


_CHECK = (
    "import os, sys, numba_hostfn as m; want = os.path.realpath(sys.argv[1]); "
    "got = os.path.realpath(m.__file__); "
    "sys.exit(0 if got.startswith(want + os.sep) else f'imported {got}, not from {want}')"
)


def _run_side(
    tree: str, label: str, sections: list[str], smoke: bool, out: str, keep: str | None = None
) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [tree] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    # The package this side must import is its own tree's (not an installed or editable one).
    subprocess.run([sys.executable, "-c", _CHECK, tree], env=env, cwd=tree, check=True)
    cmd = [sys.executable, os.path.join(tree, "benchmarks", "run.py"), "--json", out]
    cmd += [a for s in sections for a in ("--only", s)]
    if keep:  # run.py's own report and plots, for this run alone
        cmd += ["--out", keep]
    if smoke:
        cmd.append("--smoke")
    print(f"[ab] {label}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
    subprocess.run(cmd, env=env, cwd=tree, check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        return json.load(f)


def _cell(values: list[float], note: str = "") -> str:
    if not values:
        return f"-- ({note})" if note else "--"
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def _b_over_a(a: list[float], b: list[float]) -> str:
    if not a or not b or not statistics.median(a):
        return ""
    return f"{statistics.median(b) / statistics.median(a):.2f}"


def _met(values: list[float], limit: float | None) -> str:
    if not values or limit is None:
        return "n/a"
    return "yes" if statistics.median(values) <= limit else "NO"


def compare(ref: str, commit: str, runs: dict[str, list[dict]]) -> str:
    """The report: targets, then rows, each side's median over rounds (min-max) and B/A."""
    a, b = runs["A"], runs["B"]
    lines = [
        f"## A/B: A = {ref} ({commit[:12]}), B = the working tree; {len(a)} round(s), "
        "alternating; each cell: median over rounds (min-max)",
        "",
        "### targets",
        "",
        "| target | limit | A | B | B/A | met (A, B) |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    # A section not run still lists its targets, unmeasured: those are left out.
    texts = list(
        dict.fromkeys(t["text"] for run in a + b for t in run["targets"] if t["value"] is not None)
    )
    for text in texts:
        values = {}
        limit = next(
            (t["limit"] for run in a + b for t in run["targets"] if t["text"] == text), None
        )
        for side, side_runs in (("A", a), ("B", b)):
            vals = [
                t["value"]
                for run in side_runs
                for t in run["targets"]
                if t["text"] == text and t["value"] is not None
            ]
            values[side] = vals

        lines.append(
            f"| {text} | {'' if limit is None else limit} | {_cell(values['A'])} | "
            f"{_cell(values['B'])} | {_b_over_a(values['A'], values['B'])} | "
            f"{_met(values['A'], limit)}, {_met(values['B'], limit)} |"
        )
    lines += [
        "",
        "### rows",
        "",
        "| group | row | unit | A | B | B/A |",
        "| --- | --- | --- | ---: | ---: | ---: |",
    ]
    keys = list(
        dict.fromkeys((r["group"], r["name"], r["unit"]) for run in a + b for r in run["rows"])
    )
    for group, name, unit in keys:
        cells, notes = {}, {}
        for side, side_runs in (("A", a), ("B", b)):
            rows = [
                r
                for run in side_runs
                for r in run["rows"]
                if (r["group"], r["name"]) == (group, name)
            ]
            cells[side] = [statistics.median(r["samples"]) for r in rows if r["samples"]]
            # a row that failed says why (its note), as run.py's own table does
            notes[side] = next((r["note"] for r in rows if not r["samples"] and r["note"]), "")
        lines.append(
            f"| {group} | {name} | {unit} | {_cell(cells['A'], notes['A'])} | "
            f"{_cell(cells['B'], notes['B'])} | "
            f"{_b_over_a(cells['A'], cells['B'])} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, HERE)
    from run import SECTIONS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "ref",
        help="the git commit (branch, tag), or a folder of its files, to compare against: side A",
    )
    parser.add_argument(
        "--only", choices=tuple(SECTIONS), action="append", help="sections (repeatable)"
    )
    parser.add_argument("--rounds", type=int, default=2, help="runs of each side (default 2)")
    parser.add_argument("--smoke", action="store_true", help="run.py's tiny sizes (the suite)")
    parser.add_argument("--out", help="also write the report to this file")
    parser.add_argument(
        "--keep",
        help="keep each run's own report here: DIR/<side>-<round>/benchmarks.md (run.py "
        "--out) and DIR/<side>-<round>.json; with every section, a B run is a full "
        "benchmarks/run.py run of the working tree",
    )
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    sections = args.only or []
    if args.keep:
        args.keep = os.path.abspath(args.keep)
        os.makedirs(args.keep, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="nhf-ab-") as tmp:
        trees = {"A": os.path.join(tmp, "A"), "B": os.path.join(tmp, "B")}
        commit = _tree_at(args.ref, trees["A"])
        _working_tree(trees["B"])
        for side, tree in trees.items():
            _same_benchmarks(tree)
            _build(tree, f"{side} ({args.ref if side == 'A' else 'working tree'})")
        runs: dict[str, list[dict]] = {"A": [], "B": []}
        for i in range(args.rounds):
            for side in ("A", "B") if i % 2 == 0 else ("B", "A"):
                out = os.path.join(args.keep or tmp, f"{side}-{i + 1}.json")
                runs[side].append(
                    _run_side(
                        trees[side],
                        f"round {i + 1}/{args.rounds}, {side}",
                        sections,
                        args.smoke,
                        out,
                        args.keep and os.path.join(args.keep, f"{side}-{i + 1}"),
                    )
                )
            if args.out and i + 1 < args.rounds:  # a run cut short keeps its rounds
                with open(args.out, "w") as f:
                    f.write(compare(args.ref, commit, runs))
    text = compare(args.ref, commit, runs)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
