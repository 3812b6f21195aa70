"""numba_hostfn: run compiled, GIL-free host functions in CUDA stream order.

``@host_callback`` compiles ``fn(user_data)`` with numba into a ``CUhostFn``
that runs on the driver's thread without the GIL; ``host_launch(stream, fn)``
enqueues it (or a ctypes ``CUhostFn``, or a Python callable) and owns what the
launch needs until it has run.  Set ``NUMBA_HOSTFN_SIMULATOR=1`` to run on the
stream simulator instead of a GPU.  Rules for threads and the GIL:
docs/threading.md.
"""

# numpy first, before anything of the package: imported midway through (from
# _hostfunction, after _core, ctypes, inspect and the package's first modules), the
# whole start (import, a simulated stream, one Python callable run) took 1.39-1.40x
# `import numpy` on a 2-core VM, against 1.22-1.23x this way (bench_startup). With
# OPENBLAS_NUM_THREADS=1 the two orders take alike: the difference is in how the
# OpenBLAS worker thread that numpy's import starts runs beside the rest.
import numpy  # noqa: F401

try:
    from . import _core
except ImportError as _missing:  # Python's own message blames a circular import
    import importlib.machinery as _machinery
    import os as _os
    import sys as _sys

    _here = _os.path.dirname(_os.path.abspath(__file__))
    _suffixes = tuple(_machinery.EXTENSION_SUFFIXES)
    if any(_os.path.isfile(_os.path.join(_here, "_core" + s)) for s in _suffixes):
        raise  # built for this Python, and failed to load: its own error says why
    _other = sorted(n for n in _os.listdir(_here) if n.startswith("_core.") and n.endswith(".so"))
    raise ImportError(
        f"numba_hostfn's native core (numba_hostfn._core, a C extension) is not built "
        f"for this Python ({_sys.implementation.cache_tag}) in {_here}"
        + (f" (found only {', '.join(_other)})" if _other else "")
        + ": install the package (in a checkout: python -m pip install -e ., which needs "
        "a C compiler and Python's headers), or, with it installed, start Python "
        "outside the checkout"
    ) from _missing

if not _core.main_interpreter():  # LIFETIME.md, Scope: one interpreter
    raise ImportError("numba_hostfn runs in the main interpreter only, not in a sub-interpreter")

from . import simulator  # noqa: E402
from ._drain import drain, pending
from ._errors import (
    BackendUnavailableError,
    CudaDriverError,
    DeviceFaultError,
    HostCallbackCompileError,
    SimulatorUnsupportedError,
)
from ._executor import HostExecutor
from ._hostcopy import (
    MEMCPY_2D_LAYOUT,
    MEMCPY_LAYOUT,
    host_copy,
    host_memcpy,
    host_memcpy_2d,
    release_after,
)
from ._hostfunction import CUhostFn, HostFunction, host_callback
from ._launch import host_launch
from ._notify import async_done, done_future, dropped_callbacks
from ._numba_cuda import add_callback
from ._process import SIMULATOR_ENV
from ._process import get_backend as _get_backend
from ._process import simulator_unless_driver as _simulator_unless_driver
from ._userdata import ByRef, Record, by_ref, record

__version__ = "0.1.0"

__all__ = [
    "MEMCPY_2D_LAYOUT",
    "MEMCPY_LAYOUT",
    "Record",
    "SIMULATOR_ENV",
    "BackendUnavailableError",
    "ByRef",
    "CUhostFn",
    "CudaDriverError",
    "DeviceFaultError",
    "HostCallbackCompileError",
    "HostExecutor",
    "HostFunction",
    "SimulatorUnsupportedError",
    "add_callback",
    "as_voidptr",
    "async_done",
    "backend_name",
    "by_ref",
    "create_stream",
    "done_future",
    "drain",
    "dropped_callbacks",
    "host_callback",
    "host_copy",
    "host_launch",
    "host_memcpy",
    "host_memcpy_2d",
    "pending",
    "record",
    "release_after",
    "simulate_without_gpu",
    "simulator",
]


def __getattr__(name: str):
    # as_voidptr is a numba intrinsic: importing it imports numba, which importing
    # the package does not (numba comes with the first compiled function).
    if name != "as_voidptr":
        raise AttributeError(f"module 'numba_hostfn' has no attribute {name!r}")
    from ._intrinsics import as_voidptr

    globals()["as_voidptr"] = as_voidptr
    return as_voidptr


def __dir__() -> list[str]:
    return sorted(set(globals()) | {"as_voidptr"})


def backend_name() -> str:
    """Return the backend in use, ``"cuda"`` or ``"simulator"`` (choosing it if needed).

    Returns
    -------
    str

    Raises
    ------
    BackendUnavailableError
        If there is no usable CUDA driver and the simulator is not selected.
    """
    return _get_backend().name


def simulate_without_gpu() -> bool:
    """Run on the simulator if this machine has no usable CUDA driver; say which.

    numba_hostfn never falls back to the simulator on its own: without a GPU
    and without ``NUMBA_HOSTFN_SIMULATOR=1``, the first launch raises
    :class:`BackendUnavailableError`.  Call this first in a script that should
    run anywhere (with :func:`create_stream` for its streams).

    Returns
    -------
    bool
        True if the simulator is in use (requested, or no driver was found).

    Raises
    ------
    RuntimeError
        If this process already uses the CUDA backend and has no driver now
        (it cannot change backends).
    ValueError
        If no backend is chosen yet and ``NUMBA_HOSTFN_SIMULATOR`` is set to
        neither on (``1``, ``true``, ``yes``, ``on``) nor off (``0``, ``false``,
        ``no``, ``off``).
    """
    return _simulator_unless_driver()


def create_stream():
    """A new stream of the backend in use: CUDA (cuda.core) or the simulator.

    On a GPU, a cuda.core ``Stream`` of the current device (device 0, made
    current, if none is); on the simulator, a :class:`simulator.Stream`.  Both
    have ``sync()`` and ``close()``, and any other stream with
    ``__cuda_stream__`` works with :func:`host_launch` as well.

    Returns
    -------
    cuda.core.Stream or numba_hostfn.simulator.Stream

    Raises
    ------
    BackendUnavailableError
        If there is no usable CUDA driver and the simulator is not selected
        (see :func:`simulate_without_gpu`).

    Examples
    --------
    >>> import numba_hostfn as nh
    >>> nh.simulate_without_gpu()  # doctest: +SKIP
    >>> stream = nh.create_stream()  # doctest: +SKIP
    """
    if _get_backend().name == "simulator":
        return simulator.Stream()
    from cuda.core import Device

    device = Device()
    device.set_current()
    return device.create_stream()
