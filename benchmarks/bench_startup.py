"""Section startup: what a program pays before its first launch has run.

Fresh processes, timed from the parent (start to exit), interleaved, ``repeats`` rounds:

- ``import numpy``, the baseline of the simulator's job;
- ``import numba_hostfn``, a simulated stream, one Python callable launched and run
  (``NUMBA_HOSTFN_SIMULATOR=1``);
- on a GPU: ``import cuda.core`` and a stream of device 0, the baseline of the CUDA job;
  and ``import numba_hostfn``, ``create_stream()`` (a cuda.core stream), one Python
  callable launched and run.

Neither job imports numba (``import numba_hostfn`` does not, and a Python callable needs
none); each row also says whether numba was imported.  Ratios are to the job's baseline.

Every module is imported from bytecode, as after ``pip install`` (which compiles what
it installs): the children share a bytecode cache of their own (``PYTHONPYCACHEPREFIX``,
a temporary folder that the untimed first round fills, ``PYTHONDONTWRITEBYTECODE``
unset), the baseline's modules and the package's alike.  Without it, a checkout run
under ``PYTHONDONTWRITEBYTECODE=1`` (as on the CI machines) compiled the package's
27 modules from source at every start, against numpy's compiled ones: 1.41x
``import numpy`` there, against 1.20-1.21x from bytecode (2-core VM, 2026-12-02).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

from _bench import ROOT, ROWS, Row, Target, find, ratio, target

GROUP = "start-up"
PLOTS: list = []
NUMPY = "python -c 'import numpy'"
SIMULATED = "import numba_hostfn, a simulated stream, one Python callable run"
CUDA_CORE = "python -c: import cuda.core, make a stream of device 0"
CUDA = "import numba_hostfn, create_stream() (cuda.core), one Python callable run"

_JOB = (
    "import sys; import numba_hostfn as nh; s = nh.create_stream(); ran = []; "
    "nh.host_launch(s, lambda: ran.append(1)); s.sync(); assert ran == [1]; "
    "print('numba' in sys.modules)"
)
_CORE = (
    "import sys; from cuda.core import Device; d = Device(); d.set_current(); "
    "s = d.create_stream(); s.sync(); print('numba' in sys.modules)"
)


def _time(code: str, env: dict) -> tuple[float, str]:
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    return (time.perf_counter() - start) * 1e3, out


def run(repeats: int, gpu: bool) -> None:
    with tempfile.TemporaryDirectory(prefix="nhf-startup-pycache-") as cache:
        _run(repeats, gpu, cache)


def _run(repeats: int, gpu: bool, cache: str) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = cache  # filled by the first, untimed round
    simulated = dict(env, NUMBA_HOSTFN_SIMULATOR="1")
    cuda = {k: v for k, v in env.items() if k != "NUMBA_HOSTFN_SIMULATOR"}
    jobs = [(NUMPY, "import numpy", env), (SIMULATED, _JOB, simulated)]
    if gpu:
        jobs += [(CUDA_CORE, _CORE, cuda), (CUDA, _JOB, cuda)]
    times: dict[str, list[float]] = {name: [] for name, _, _ in jobs}
    numba: dict[str, str] = {}
    for _name, code, job_env in jobs:  # the page cache and the bytecode cache, once
        _time(code, job_env)
    for _ in range(repeats):
        for name, code, job_env in jobs:
            elapsed, out = _time(code, job_env)
            times[name].append(elapsed)
            numba[name] = out
    for name, _, _ in jobs:
        imported = {"True": ", numba imported", "False": ", numba not imported"}.get(
            numba[name], ""
        )
        ROWS.append(Row(GROUP, name + imported, "ms", times[name]))


def baseline(group: str):
    if group != GROUP:
        return None
    return find(GROUP, NUMPY)


def _row(prefix: str):
    return next((r for r in ROWS if r.group == GROUP and r.name.startswith(prefix)), None)


def targets() -> list[Target]:
    return [
        target(
            "start-up, simulated stream and one Python callable <= 1.3x import numpy",
            ratio(_row(SIMULATED), _row(NUMPY)),
            1.3,
        ),
        target(
            "start-up, cuda.core stream and one Python callable <= 1.5x cuda.core and its stream",
            ratio(_row(CUDA), _row(CUDA_CORE)),
            1.5,
        ),
    ]
