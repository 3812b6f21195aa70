"""The exceptions numba_hostfn raises, shared by the CUDA and simulator backends.

Wrong types raise :class:`TypeError`, wrong values :class:`ValueError` and wrong
states :class:`RuntimeError` (or the subclasses below).  A call that raises has
enqueued nothing and holds no reference to its arguments.  Failures *inside* a
host function cannot be raised to the caller: they are reported through
:func:`sys.unraisablehook`, naming the host function (docs/errors.md).
"""

from __future__ import annotations

__all__ = [
    "BackendUnavailableError",
    "CudaDriverError",
    "HostCallbackCompileError",
    "SimulatorUnsupportedError",
]

#: The environment variable that selects the simulator backend.
SIMULATOR_ENV = "NUMBA_HOSTFN_SIMULATOR"


class HostCallbackCompileError(TypeError):
    """Raised by :func:`~numba_hostfn.host_callback` if numba cannot compile the body.

    The message names the host function and where it is defined first, then
    numba's own message, once.  numba's exception is kept as ``numba_error``
    (not chained, so that a traceback does not print the message twice).
    """

    numba_error: BaseException | None = None


class CudaDriverError(RuntimeError):
    """Raised by :func:`~numba_hostfn.host_launch` if a CUDA driver call fails.

    The message names the driver call and the ``CUresult``; ``code`` holds it.
    """

    def __init__(self, message: str, code: int = 0) -> None:
        super().__init__(message)
        self.code = code


class BackendUnavailableError(RuntimeError):
    """Raised on first use if no CUDA driver is usable and the simulator is not selected.

    To run on the simulator instead, call
    :func:`~numba_hostfn.simulate_without_gpu` or set ``NUMBA_HOSTFN_SIMULATOR=1``
    (in the environment or ``os.environ``).  The backend is chosen at first use,
    not at import, and this error chooses none: either way works until a
    backend is in use, also after this error.
    """


class SimulatorUnsupportedError(NotImplementedError):
    """Raised by the simulator for what it does not model (graph capture, real kernels)."""
