"""Build the sdist and the wheel from it, check both, and install and run each in a fresh venv.

Checks: the build prints no warning about the package layout (setuptools' "Package
would be ignored"); the wheel is a platform wheel with the license
(``*.dist-info/licenses/LICENSE``), the native core (``numba_hostfn/_core*.so``),
``LIFETIME.md``, ``py.typed`` and ``_core.pyi``, no C source, and no package file that is
missing from the source tree (a stale ``build/lib`` copy); the sdist has ``LICENSE``, the
C sources and header of the native core, and no tests (their helpers and conftest are not
shipped, so it ships none); ``twine check --strict`` passes (metadata and the README as long
description).  In a fresh venv, ``pip install`` of the wheel (with its dependencies, from
the registry), then ``import numba_hostfn`` (its ``__version__`` must equal the wheel's) and
``python -m numba_hostfn``; in another fresh venv, ``pip install`` of the sdist, which
builds the native core from source (a C compiler and Python's headers alone), then the
same two commands.  All with NUMBA_HOSTFN_SIMULATOR=1.

Usage: python .ci/check_dist.py   (needs ``build`` and ``twine``: the ``test`` extra)
"""

from __future__ import annotations

import email.parser
import os
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path
from typing import NoReturn, TypeVar

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "numba_hostfn"
TIMEOUT_S = 900  # per command: a hung demo (host-function deadlock) must fail, not hang CI
T = TypeVar("T")


def fail(msg: str) -> NoReturn:
    sys.exit(f"check_dist: FAILED: {msg}")


def ok(msg: str) -> None:
    print(f"ok: {msg}", flush=True)


def run(cmd: list[str], *, cwd: Path, env: dict[str, str] | None = None) -> str:
    """Run cmd; return its stdout and stderr together, or fail showing them."""
    shown = " ".join(str(c) for c in cmd)
    print(f"+ {shown}", flush=True)
    try:
        proc = subprocess.run(
            [str(c) for c in cmd],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout or ""
        out = out.decode(errors="replace") if isinstance(out, bytes) else out
        fail(f"timed out after {TIMEOUT_S} s: {shown}\n{out[-4000:]}")
    if proc.returncode != 0:
        fail(f"exit status {proc.returncode}: {shown}\n{proc.stdout[-4000:]}")
    return proc.stdout


def only(items: list[T], what: str) -> T:
    if len(items) != 1:
        fail(f"expected exactly one {what}, found {[str(i) for i in items]}")
    return items[0]


def check_wheel(wheel: Path) -> str:
    """Check the wheel's contents and metadata; return its version."""
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        metadata_name = only([n for n in names if n.endswith(".dist-info/METADATA")], "METADATA")
        metadata = email.parser.Parser().parsestr(zf.read(metadata_name).decode())
    licenses = sorted(n for n in names if n.endswith(".dist-info/licenses/LICENSE"))
    if not licenses:
        fail(f"{wheel.name} has no *.dist-info/licenses/LICENSE")
    ok(f"wheel carries {licenses[0]}")
    expression, files = metadata["License-Expression"], metadata.get_all("License-File", [])
    if expression != "Apache-2.0" or "LICENSE" not in files:
        fail(f"{wheel.name} METADATA: License-Expression {expression!r}, License-File {files}")
    ok(f"wheel METADATA: License-Expression: {expression}, License-File: LICENSE")

    if wheel.name.endswith("-none-any.whl"):
        fail(f"{wheel.name} is a pure-Python wheel: the native core was not built into it")
    core = sorted(n for n in names if n.startswith(f"{PACKAGE}/_core.") and n.endswith(".so"))
    if not core or f"{PACKAGE}/LIFETIME.md" not in names:
        fail(f"{wheel.name} lacks the native core ({core}) or {PACKAGE}/LIFETIME.md")
    ok(f"platform wheel carries {core[0]} and {PACKAGE}/LIFETIME.md")
    typing = [f"{PACKAGE}/py.typed", f"{PACKAGE}/_core.pyi"]  # PEP 561: the core's types
    if not set(typing) <= names:
        fail(f"{wheel.name} lacks {sorted(set(typing) - names)}")
    ok(f"wheel carries {' and '.join(typing)}")

    sources = sorted(n for n in names if n.endswith((".c", ".h")))
    if sources:
        fail(f"{wheel.name} carries C sources, which only the sdist needs: {sources}")
    ok("wheel carries no C sources")

    # A file removed from the source can survive in build/lib and be packed from there.
    stale = sorted(
        n
        for n in names
        if n.startswith(f"{PACKAGE}/") and n not in core and not (ROOT / n).is_file()
    )
    if stale:
        fail(f"{wheel.name} has files that are not in the source tree (stale build/?): {stale}")
    ok(f"every other {PACKAGE}/ file in the wheel is in the source tree")
    return metadata["Version"]


def check_sdist(sdist: Path) -> None:
    with tarfile.open(sdist) as tf:
        names = set(tf.getnames())
    top = sdist.name.removesuffix(".tar.gz")
    if f"{top}/LICENSE" not in names:
        fail(f"{sdist.name} has no {top}/LICENSE")
    sources = sorted(p.name for p in (ROOT / PACKAGE / "native").glob("*.[ch]"))
    missing = [n for n in sources if f"{top}/{PACKAGE}/native/{n}" not in names]
    if not sources or missing:
        fail(f"{sdist.name} lacks the native core's sources {missing or sources}")
    tests = sorted(n for n in names if n.startswith(f"{top}/tests/"))
    if tests:
        fail(f"{sdist.name} ships tests without what they need to run: {tests[:5]}")
    ok(f"sdist carries {top}/LICENSE and the native sources ({len(sources)} files), no tests")


def check_installed(
    python: Path, venv: Path, version: str, cwd: Path, env: dict[str, str], what: str
) -> None:
    """``import numba_hostfn`` from ``venv`` at ``version``, then the demo, on the simulator."""
    code = f"import {PACKAGE}, sys; print({PACKAGE}.__version__); print({PACKAGE}.__file__)"
    out = run([python, "-c", code], cwd=cwd, env=env).splitlines()
    if len(out) < 2 or out[-2] != version:
        fail(f"{PACKAGE}.__version__ printed {out[-2:]!r}, the {what} is version {version}")
    if not Path(out[-1]).resolve().is_relative_to(venv.resolve()):
        fail(f"imported {PACKAGE} from {out[-1]}, not from the fresh venv")
    ok(f"import {PACKAGE} from the {what} (simulator): __version__ {out[-2]}")
    out = run([python, "-m", PACKAGE], cwd=cwd, env=env)
    print("\n".join(f"    | {line}" for line in out.rstrip().splitlines()[-8:]))
    ok(f"python -m {PACKAGE} from the {what} (simulator) exited 0")


def venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def main() -> None:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="check_dist-") as tmp_name:
        tmp = Path(tmp_name)
        dist = tmp / "dist"
        # No --sdist --wheel: build then makes the wheel from the sdist, as a release
        # does, so a file the sdist lacks fails here, not on a user's machine.
        out = run([sys.executable, "-m", "build", "--outdir", dist, "."], cwd=ROOT)
        layout = [line for line in out.splitlines() if "would be ignored" in line]
        if layout or "absent from the `packages` configuration" in out:
            fail(f"python -m build warns about the package layout: {layout}")
        ok("python -m build printed no warning about the package layout")
        wheel = only(sorted(dist.glob("*.whl")), "wheel")
        sdist = only(sorted(dist.glob("*.tar.gz")), "sdist")
        ok(f"built {sdist.name} and {wheel.name}")

        version = check_wheel(wheel)
        check_sdist(sdist)

        run([sys.executable, "-m", "twine", "check", "--strict", wheel, sdist], cwd=ROOT)
        ok("twine check --strict passed (metadata, README long description)")

        # Outside the repository (cwd=tmp, no PYTHONPATH): the import must find the install.
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env["NUMBA_HOSTFN_SIMULATOR"] = "1"
        env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
        for what, artifact in (("wheel", wheel), ("sdist, built from source", sdist)):
            venv = tmp / f"venv-{artifact.suffix.strip('.')}"
            run([sys.executable, "-m", "venv", venv], cwd=tmp)
            python = venv_python(venv)
            run([python, "-m", "pip", "install", "--quiet", artifact], cwd=tmp, env=env)
            ok(f"installed the {what} ({artifact.name}) and its dependencies into a fresh venv")
            check_installed(python, venv, version, tmp, env, what)
    print(f"check_dist: all checks passed in {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
