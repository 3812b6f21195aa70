"""numba-cuda parity: ``add_callback``, its ``Stream.add_callback`` for any stream.

A blocking Python callback (it takes the GIL on the driver's thread, as numba-cuda's
does), not a signal: for a notification without the GIL, see ``_notify``.
"""

from __future__ import annotations

import inspect
from typing import Any

from . import _core
from ._classify import refuse_coroutine_function
from ._compat import CFuncPtr, numba_cfunc_type
from ._enqueue import check_target, enqueue
from ._errors import keeps_nothing_on_refusal
from ._hostfunction import HostFunction

__all__ = ["add_callback"]


@keeps_nothing_on_refusal
def add_callback(stream: Any, callback: Any, arg: Any = None) -> None:
    """numba-cuda's ``Stream.add_callback``, for any stream: ``callback(stream, 0, arg)``.

    The callback is a Python function called on the driver's thread when the
    stream reaches this point; it takes the GIL, and the stream (and every
    other host function of the context) waits while it runs, exactly as in
    numba-cuda.  The status is always 0: ``cuLaunchHostFunc`` runs a host
    function only when the work before it has succeeded.  For a notification
    that never takes the GIL on the driver's thread, use
    ``host_launch(stream, fn, blocking=False)``, :func:`async_done` or
    :func:`done_future`.

    Parameters
    ----------
    stream : stream
        A cuda.core ``Stream`` or any object with ``__cuda_stream__`` (a
        numba-cuda ``Stream`` too).
    callback : callable
        ``callback(stream, status, arg)``.
    arg : object, optional
        Passed to the callback; kept alive until it has run.

    Raises
    ------
    TypeError
        If ``stream`` is not a stream (checked first), or ``callback`` is not
        callable or cannot be called with the three arguments
        ``(stream, status, arg)`` (as far as its signature says), or is a
        coroutine or generator function (its body would never run).  Nothing
        was enqueued.
    RuntimeError
        If the stream refuses the launch (a closed simulated stream, a capture
        that cannot take a node; a failing driver call: :class:`CudaDriverError`),
        as for :func:`host_launch`.  Nothing was enqueued.
    """
    # The stream first (its type, then its handle, asked once), as host_launch does:
    # a wrong stream is reported before a wrong callback.
    checked = check_target(stream, "add_callback")
    compiled = (HostFunction, CFuncPtr, numba_cfunc_type())
    if not callable(callback) or isinstance(callback, compiled):
        raise TypeError(
            "add_callback() expected a Python callable callback(stream, status, arg), got "
            f"{type(callback).__name__}; compiled host functions go to host_launch()"
        )
    refuse_coroutine_function(callback, "add_callback")
    try:
        signature = inspect.signature(callback)
    except (TypeError, ValueError):  # none to read (some builtins): it fails when it runs
        signature = None
    unbound = None
    if signature is not None:
        try:
            signature.bind(stream, 0, arg)
        except TypeError as exc:
            # Raised below, outside this block: as this one's context, inspect's
            # error would keep its frames, and arg in them (invariant 3).
            unbound = str(exc)
    if unbound is not None:
        raise TypeError(
            f"add_callback() got {getattr(callback, '__qualname__', callback)!r}, which "
            f"cannot be called as callback(stream, status, arg) ({unbound}); give it those "
            "three parameters, or use host_launch(stream, fn) for fn()"
        )
    call = _Callback(callback, stream, arg)
    enqueue(stream, call, None, None, caller="add_callback", checked=checked)


class _Callback:
    """What add_callback launches: ``callback(stream, 0, arg)``, called with no
    arguments as a Python callable is.  Its exception is reported with ``callback``
    as the object, as a Python callable's own is (docs/errors.md), not this
    wrapper (a ``functools.partial`` before, which a hook filtering on the object
    it was given never matched)."""

    __slots__ = ("arg", "callback", "stream")

    def __init__(self, callback: Any, stream: Any, arg: Any) -> None:
        self.callback, self.stream, self.arg = callback, stream, arg

    def __call__(self) -> None:
        try:
            self.callback(self.stream, 0, self.arg)
        except BaseException as exc:  # every one, as a blocking callable's (the stream goes on)
            _core.report_unraisable(self.callback, exc)

    def __repr__(self) -> str:
        return f"add_callback({self.callback!r})"
