"""``pending`` and ``drain``: launches not yet released, and their release at a known point."""

from __future__ import annotations

from ._notify import run_callbacks
from ._process import get_backend

__all__ = ["drain", "pending"]


def pending() -> int:
    """Return how many launches are not yet released (not run, or run and not drained).

    Returns
    -------
    int

    Raises
    ------
    BackendUnavailableError
        If no backend can be chosen (no CUDA driver, and the simulator not
        selected).
    RuntimeError
        In a forked child (use the ``spawn`` start method).
    """
    return get_backend().records.pending()


def drain() -> int:
    """Release the owners of launches that have run, on the calling thread.

    The main thread does this on its own shortly after each host function
    (through ``Py_AddPendingCall``); call it to release at a known point, e.g.
    after synchronizing a stream and before checking a weak reference.  It
    also runs the non-blocking callbacks (``host_launch(..., blocking=False)``)
    and sets the ``done_future`` results whose streams got there and that are
    not done yet, in stream order; where another thread is running a batch of
    those, it waits for that batch first (a Ctrl-C interrupts that wait).  It
    never waits for a host function, blocking Python callable included, that is
    still running: that launch is released by a later drain.

    Returns
    -------
    int
        How many launches were released.

    Raises
    ------
    BackendUnavailableError
        If no backend can be chosen (no CUDA driver, and the simulator not
        selected).
    RuntimeError
        In a forked child (use the ``spawn`` start method).
    """
    # First, so that a forked child is refused (RuntimeError, naming 'spawn')
    # before a batch waits for a lock that a thread of the parent held at fork.
    records = get_backend().records
    run_callbacks()
    return records.drain()
