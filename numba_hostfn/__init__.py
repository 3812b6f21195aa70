"""numba_hostfn: run compiled, GIL-free host functions in CUDA stream order.

``@host_callback`` compiles ``fn(user_data)`` with numba into a ``CUhostFn``
that runs on the driver's thread without the GIL; ``host_launch(stream, fn)``
enqueues it (or a ctypes ``CUhostFn``, or a Python callable) and owns what the
launch needs until it has run.  Set ``NUMBA_HOSTFN_SIMULATOR=1`` to run on the
stream simulator instead of a GPU.  Rules for threads and the GIL:
docs/threading.md.
"""

from . import simulator
from ._backend import get_backend as _get_backend
from ._decorator import CUhostFn, HostFunction, host_callback
from ._errors import (
    SIMULATOR_ENV,
    BackendUnavailableError,
    CudaDriverError,
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
from ._intrinsics import as_voidptr
from ._launch import drain, host_launch, pending
from ._userdata import ByRef, by_ref

__version__ = "0.1.0"

__all__ = [
    "MEMCPY_2D_LAYOUT",
    "MEMCPY_LAYOUT",
    "SIMULATOR_ENV",
    "BackendUnavailableError",
    "ByRef",
    "CUhostFn",
    "CudaDriverError",
    "HostCallbackCompileError",
    "HostExecutor",
    "HostFunction",
    "SimulatorUnsupportedError",
    "as_voidptr",
    "backend_name",
    "by_ref",
    "drain",
    "host_callback",
    "host_copy",
    "host_launch",
    "host_memcpy",
    "host_memcpy_2d",
    "pending",
    "release_after",
    "simulator",
]


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
