"""Launch records: what each launch owns, and its release on the main thread.

Every launch takes one *record* in native memory (``native/records.c``).  The
record holds a strong reference to the launch's *owner*, the object that keeps
the callable or HostFunction, ctypes wrapper and copied or shared user data
alive.  A record is *taken*, handed to the driver with a trampoline, *run*,
*completed* on the driver's thread (pushed on a lock-free stack, and a drain
scheduled with ``Py_AddPendingCall``), and *released* by the drain on the main
thread, which drops the owner.  A record whose enqueue failed is released at
once; a record kept by a graph is completed when the graph is gone.
LIFETIME.md states the invariants.
"""

from __future__ import annotations

import functools

from . import _core
from ._compat import register_first_atexit

__all__ = ["LaunchRecords"]

_CLOSE_WAIT_MS = 2000


class LaunchRecords:
    """The launch records of this process (one set, shared by both backends)."""

    def __init__(self) -> None:
        # Invariant 6.  Close after the non-daemon threads have ended: until then
        # their blocking Python callables and executor tasks must run (threading's
        # own exit hooks run before those threads are joined: closing there
        # skipped them).  And close before any other library's atexit handler:
        # one may block in a driver call with the GIL held (releasing a context,
        # say) while the driver's thread waits for the GIL in a Python trampoline.
        # So the close is the first atexit handler (_compat.register_first_atexit).
        # The handler is the native close itself (close_guard bound to its wait): no
        # line of Python runs before the guard is closed, so a Ctrl-C that lands as
        # the handlers begin cannot skip it (it skipped a Python method here whole,
        # leaving the guard open for good).  It closes the guard so that no
        # trampoline takes the GIL or schedules a drain from then on, and waits
        # (GIL released) for those inside; records still pending keep their owners'
        # references for ever: leaked, never released under a driver thread that
        # may yet run them.  In a forked child it waits for nothing (invariant 22).
        self._at_exit = functools.partial(_core.close_guard, _CLOSE_WAIT_MS)
        register_first_atexit(self._at_exit, _core.to_front_of_atexit)

    def drain(self) -> int:
        """Release the records that have run; return how many."""
        return _core.drain()

    def pending(self) -> int:
        """How many records are held (not yet run, or run and not released)."""
        return _core.held()
