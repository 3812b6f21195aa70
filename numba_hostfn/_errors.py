"""The exceptions numba_hostfn raises, shared by the CUDA and simulator backends.

Wrong types raise :class:`TypeError`, wrong values :class:`ValueError` and wrong
states :class:`RuntimeError` (or the subclasses below).  A call that raises has
enqueued nothing and holds no reference to its arguments.  Failures *inside* a
host function cannot be raised to the caller: they are reported through
:func:`sys.unraisablehook`, naming the host function (docs/errors.md).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = [
    "BackendUnavailableError",
    "CudaDriverError",
    "DeviceFaultError",
    "HostCallbackCompileError",
    "SimulatorUnsupportedError",
]


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


#: The CUresults of a device fault (sticky: the context runs nothing more), by name.
FAULT_NAMES = {
    214: "CUDA_ERROR_ECC_UNCORRECTABLE",
    700: "CUDA_ERROR_ILLEGAL_ADDRESS",
    702: "CUDA_ERROR_LAUNCH_TIMEOUT",
    710: "CUDA_ERROR_ASSERT",
    714: "CUDA_ERROR_HARDWARE_STACK_ERROR",
    715: "CUDA_ERROR_ILLEGAL_INSTRUCTION",
    716: "CUDA_ERROR_MISALIGNED_ADDRESS",
    717: "CUDA_ERROR_INVALID_ADDRESS_SPACE",
    718: "CUDA_ERROR_INVALID_PC",
    719: "CUDA_ERROR_LAUNCH_FAILED",
}


class DeviceFaultError(CudaDriverError):
    """Raised for work that a device fault ended: a kernel trapped or touched an illegal address.

    CUDA runs nothing more of a context after such a fault: no host function,
    no stream memory operation.  numba_hostfn finds the fault (docs/errors.md,
    "A device fault") and fails every wait that would never resolve with this
    error (``done_future``'s future, ``async_done``'s awaitable), and refuses
    new work on the context's streams with it.  ``code`` is the ``CUresult``,
    ``error_name`` its name (``"CUDA_ERROR_LAUNCH_FAILED"``, ...), ``stream``
    the handle of the stream the fault was found on (0 if not known).  The
    context stays unusable: end the process (a scheduler restarts it).
    """

    def __init__(self, message: str, code: int = 0, error_name: str = "", stream: int = 0) -> None:
        super().__init__(message, code)
        self.error_name = error_name
        self.stream = stream


class BackendUnavailableError(RuntimeError):
    """Raised on first use if no CUDA driver is usable and the simulator is not selected.

    To run on the simulator instead, call
    :func:`~numba_hostfn.simulate_without_gpu` or set ``NUMBA_HOSTFN_SIMULATOR=1``
    (in the environment or ``os.environ``).  The backend is chosen at first use,
    not at import, and this error chooses none: either way works until a
    backend is in use, also after this error.
    """


class SimulatorUnsupportedError(NotImplementedError):
    """Raised by the simulator for what it does not model.

    Explicit cuda.core graphs (``GraphDefinition``, ``GraphNode``), and a graph
    launched or a fault enqueued on a simulated stream that is capturing.  Graph
    capture itself is modelled; a stream that is not a simulated one is refused
    with :class:`TypeError`.
    """


#: This package's folder: the frames whose locals a refused call drops (forget_locals).
_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def forget_locals(error: BaseException) -> None:
    """Drop the locals of this package's returned frames in ``error``'s traceback.

    A call that raises keeps nothing (LIFETIME.md, invariant 3), not even through
    its error: a caught one (or the REPL's ``sys.last_exc``) keeps its traceback's
    frames, whose locals would keep user data exported (a ``bytearray`` that cannot
    be resized) and copies alive.  The program's own frames keep theirs (a
    ``__buffer__`` that raised, for a debugger); a frame still running is left to
    its function: :func:`keeps_nothing_on_refusal`'s wrapper drops what it holds.
    """
    tb = error.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_filename.startswith(_PACKAGE):
            try:
                frame.clear()
            except RuntimeError:  # still running (the caller's own frame)
                pass
        tb = tb.tb_next


_F = TypeVar("_F", bound=Callable[..., Any])


def keeps_nothing_on_refusal(func: _F) -> _F:
    """``func``, keeping nothing if it raises (LIFETIME.md, invariant 3).

    For the package's public entry points (``host_launch``'s Python path,
    ``host_copy``, ``release_after``, ``record``, a ``HostFunction``'s direct
    call, ...), whose bodies are then the plain work.  When ``func`` raises, its
    frame (and those under it) has returned, so :func:`forget_locals` clears
    them; the wrapper's own frame, the one still running, drops the arguments
    itself: a ``by_ref(...)`` or a ``memoryview`` made in the call would keep a
    buffer exported for as long as the caught error (or ``sys.last_exc``) lives.
    Put it on the outermost function of the package a call enters: a caller in
    the package would still be running, and keep its own locals.
    """

    @functools.wraps(func)
    def refusal_keeps_nothing(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except BaseException as error:
            del args, kwargs  # this frame runs on: forget_locals cannot clear it
            forget_locals(error)
            raise

    return refusal_keeps_nothing  # type: ignore[return-value]
