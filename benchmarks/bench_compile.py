"""Section compile: @host_callback compile time, first and cached, and import time.

Fresh processes: @host_callback(cache=True) of two small bodies, the first compiled
(and its cache written), then loaded from the cache, the first and the second in the
process, against numba.cfunc(cache=True) of the same bodies; and the time to import
numba_hostfn (with numba) against importing numba, numpy already imported.  Ratios
are to the first row.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap

from _bench import ROOT, ROWS, Row, Target, find, target

GROUP = "compile and import"
PLOTS = [(GROUP, "compile.png")]

COMPILE_SCRIPT = textwrap.dedent("""
    import sys, time, numpy as np
    t = time.perf_counter()
    import numba_hostfn as nh
    import numba
    from numba import carray
    t_import = time.perf_counter() - t

    def scale(p):
        a = carray(p, (16,), np.float64)
        for i in range(16):
            a[i] *= 2.0

    def shift(p):
        a = carray(p, (16,), np.float64)
        for i in range(16):
            a[i] += 1.0

    if sys.argv[1] == "numba":  # the baseline: numba's own cached cfunc
        make = numba.cfunc("void(voidptr)", cache=True)
    else:
        make = nh.host_callback(cache=True)
    t = time.perf_counter()
    first = make(scale)
    t_first = time.perf_counter() - t
    t = time.perf_counter()
    second = make(shift)
    t_second = time.perf_counter() - t
    hits = getattr(first, "cache_hits", 0) + getattr(second, "cache_hits", 0)
    print(t_import, t_first, t_second, hits)
""")


def run(repeats: int) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    times: dict[str, list[float]] = {}

    def run_script(script: str, mode: str) -> list[float]:
        out = subprocess.run(
            [sys.executable, script, mode],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=300,
        ).stdout.split()
        return [float(v) for v in out]

    for _ in range(repeats):
        for mode in ("numba_hostfn", "numba"):
            with tempfile.TemporaryDirectory() as tmp:
                script = os.path.join(tmp, "hostfns.py")
                with open(script, "w") as f:
                    f.write(COMPILE_SCRIPT)
                _, t_first, _, _ = run_script(script, mode)  # compiles and writes the cache
                t_import, t_cached, t_second, hits = run_script(script, mode)  # loads
                if mode == "numba_hostfn" and hits != 2:
                    raise RuntimeError("the second process did not load from the cache")
                for key, value in (
                    (f"{mode} first", t_first),
                    (f"{mode} cached", t_cached),
                    (f"{mode} cached 2nd", t_second),
                    ("import", t_import),
                ):
                    times.setdefault(key, []).append(value * 1e3)
    rows = [
        ("@host_callback, first (compiles)", "numba_hostfn first"),
        ("@host_callback, cached (loads), first in process", "numba_hostfn cached"),
        ("@host_callback, cached (loads), 2nd in process", "numba_hostfn cached 2nd"),
        ("numba.cfunc(cache=True), first (compiles)", "numba first"),
        ("numba.cfunc(cache=True), cached, first in process", "numba cached"),
        ("numba.cfunc(cache=True), cached, 2nd in process", "numba cached 2nd"),
        ("import numba_hostfn (and numba), numpy already imported", "import"),
    ]
    for name, key in rows:
        ROWS.append(Row(GROUP, name, "ms", times[key]))
    numba_import = []
    for _ in range(repeats):
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                # numpy first, as in the compile script: both rows time the import
                # of numba (and numba_hostfn) on top of an imported numpy
                "import time, numpy; t=time.perf_counter(); import numba; "
                "print(time.perf_counter()-t)",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        numba_import.append(float(out) * 1e3)
    ROWS.append(Row(GROUP, "import numba, numpy already imported", "ms", numba_import))


def targets() -> list[Target]:
    out = []
    for when in ("first in process", "2nd in process"):
        cached = find(GROUP, f"@host_callback, cached (loads), {when}")
        out.append(
            target(
                f"cached @host_callback load, {when}, <= 20 ms",
                cached.median if cached else None,
                20.0,
                "{:.1f} ms",
            )
        )
    return out
