"""Signal Python from a stream without the GIL: awaitables, futures, non-blocking callbacks.

Each of these enqueues a *signal* (``native/notify.c``): a CUhostFn that
runs on the driver's thread or an executor's (for async_done and done_future
given no executor, the default lane's: ``_executor.default_lane``), pushes a
key on a *channel* and writes the channel's eventfd.  It never takes the GIL, so it never waits
for the main thread and never holds up another stream's host functions.
Python reacts to the descriptor:

- :func:`async_done`: one channel per asyncio loop, watched with
  ``loop.add_reader``; the loop resolves the futures whose keys it reads, in
  the order their streams got there.  One descriptor per loop, no thread per wait.
- ``host_launch(stream, callable, blocking=False)`` and :func:`done_future`:
  one channel for the process.  The signal also asks the main thread, with
  ``Py_AddPendingCall``, to run the callables; a helper thread blocked on the
  descriptor runs them when the main thread is blocked in C (``sync()``).
  Whichever comes first runs the batch, under one lock, oldest first.

A channel's descriptor is closed by the last of its references: Python's
and each signal not yet run (LIFETIME.md, invariant 17).  Launch records are
those of every launch: ``pending()`` counts a signal until it has run and
been drained.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

from . import _core
from ._compat import any_thread_pending_call, register_first_atexit, running_loop
from ._enqueue import RENEWALS, check_signal, refuse_signal, renewed_route, signal_route
from ._errors import keeps_nothing_on_refusal
from ._process import forked, get_backend

if TYPE_CHECKING:  # imported where used: a first launch needs neither (start-up time)
    import asyncio
    import concurrent.futures
    from collections.abc import Callable

__all__ = [
    "async_done",
    "done_future",
    "dropped_callbacks",
    "launch_nonblocking",
    "run_callbacks",
]


class _Channel:
    """A native channel over a new eventfd, and its dispatcher (``native/notify.c``):
    the entries its signals act on, registered with their signal's enqueue and acted
    on in batches, natively.  The Dispatcher owns the channel: its reference is
    dropped when the Dispatcher dies."""

    def __init__(
        self, *, wake_main: bool, nonblocking: bool, resolve: bool = False, on_fault: Any = None
    ) -> None:
        get_backend()  # in a forked child: RuntimeError, naming spawn
        invalid = None
        if resolve:  # a loop's channel: asyncio is imported already
            import asyncio

            invalid = asyncio.InvalidStateError
        # The eventfd and its native channel, made and owned by the Dispatcher in one
        # native call: an interrupt after it drops the Dispatcher, which releases the
        # channel (invariant 21). The last release closes the descriptor, after the
        # last signal has written it (invariant 17); not at exit, where a reader on a
        # daemon thread may still be taking from it (invariant 6: leak rather than
        # dangle). on_fault(entry, code): a device fault failed the entry's launch
        # (invariant 23).
        self.dispatcher = _core.Dispatcher(wake_main, nonblocking, resolve, invalid, on_fault)
        self.fd = self.dispatcher.fd

    def launch(
        self,
        target: Any,
        executor: Any,
        refusal: str,
        entry: Any,
        default_lane: bool = True,
        caller: str = "host_launch",
        handle: int | None = None,
    ) -> tuple[int, int]:
        """Register ``entry`` and enqueue its signal on ``target``, as one native step:
        an exception after it (a Ctrl-C) leaves the launch enqueued, and its entry
        acted on when the signal comes; a refused launch keeps nothing.  With no
        executor, on the default lane where it can serve (``default_lane``), else,
        or if the lane refuses, on the driver's thread (``_enqueue.signal_route``).
        ``handle``: ``target``'s stream handle, where the caller has read it already
        (its ``__cuda_stream__`` is called once per call).

        Returns ``(lane, task)``: for a signal on an executor's lane (the default
        lane's too), the lane's address and the number its stream writes to the
        lane's "reached" word when it gets there (``_core.lane_reached``); else
        ``(0, 0)``."""
        route, fallback, handle = signal_route(
            target, executor, refusal, default_lane, caller, handle
        )
        status, task = self.dispatcher.launch(*route, entry)
        for _ in range(RENEWALS):
            if status != _core.LANE_STALE or fallback is not None:
                break
            # The executor's lane serves an earlier stream with this handle.
            route = renewed_route(handle, route)
            status, task = self.dispatcher.launch(*route, entry)
        if status and fallback is not None:
            if status & _core.KEPT:  # the lane's write is on the stream: it will signal
                return route[1], task
            # The default lane refused (capturing, closed, faulted): enqueued nothing.
            route = fallback
            status, task = self.dispatcher.launch(*route, entry)
        if status:
            refuse_signal(status, executor, refusal, handle)
        return (route[1], task) if task else (0, 0)


# ---- non-blocking callbacks and done_future: one channel for the process ----


#: How long a helper thread whose batch raised waits before it runs the batch again.
_RETRY_S = 0.01


class _Callbacks:
    """The process's non-blocking callbacks: run by the main thread or a helper thread.

    Their batches run natively (``_core.Dispatcher``), one at a time, oldest first:
    a callable is owned by the table of waiting callbacks from its launch until it
    has been called, with no Python-level step between (LIFETIME.md, 17 and 21).
    """

    def __init__(
        self,
        record: Callable[[_Callbacks], bool],
        *,
        wake_main: bool = True,
        name: str = "numba_hostfn-callbacks",
        on_fault: Any = None,
    ) -> None:
        self._channel = _Channel(wake_main=wake_main, nonblocking=False, on_fault=on_fault)
        self._batch = self._channel.dispatcher
        if wake_main:
            _route_pending_calls()
        # Started now, before the first signal's enqueue, not lazily after it succeeds:
        # the eventfd counts its writes, so a thread started later would still see the
        # signal, in order, but an interrupt (a Ctrl-C) between the enqueue and the
        # start would leave the signal enqueued with nothing to act on it (a
        # done_future on the driver's thread: never set) until some later call started
        # the thread (LIFETIME.md, invariant 21).  So each caller checks first all that
        # can refuse it (_enqueue.check_signal), and a refusal only the enqueue can see
        # (a CUDA stream destroyed, or another thread's close or capture in between)
        # leaves this process-wide thread to the next signal, which would start it.
        # The thread records its own object as the process's (record(self): one
        # dict.setdefault), not the caller: no Ctrl-C reaches it (Python runs signal
        # handlers on the main thread only), so once it runs, its object is recorded,
        # or it finds another recorded first and ends, its channel with it.  Before,
        # an interrupt between this start and the caller's record left this thread
        # for good, and the next call made another.  ``decided`` is set then.
        self.decided = threading.Event()
        self._helper = threading.Thread(target=self._serve, args=(record,), name=name, daemon=True)
        self._helper.start()

    def launch(
        self,
        target: Any,
        fn: Any,
        executor: Any,
        refusal: str,
        default_lane: bool = True,
        caller: str = "host_launch",
        handle: int | None = None,
    ) -> tuple[int, int]:
        """``_Channel.launch`` of ``fn``: ``(lane, task)``, or ``(0, 0)``."""
        return self._channel.launch(target, executor, refusal, fn, default_lane, caller, handle)

    def run(self, block: bool = True) -> int:
        """Run the callables whose signals have run, oldest first; return how many.

        Re-entrant calls (a callback that drains) return 0 at once.
        """
        return self._batch.run(block)

    def _serve(self, record: Callable[[_Callbacks], bool]) -> None:
        try:
            recorded = record(self)
        finally:  # a failed record (no memory) ends this thread: its caller is told
            self.decided.set()
        if not recorded:
            return  # another is the process's: this one, and its channel, go
        fd = self._channel.fd
        while True:
            os.read(fd, 8)  # blocks without the GIL until a signal writes
            while True:
                try:
                    self.run()
                    break
                except Exception:
                    # A batch that raised (no memory for a key, or for the ring of due
                    # keys): reported as the thread's own error, and run again, for
                    # what it left due.  Ended here, the thread would leave every later
                    # future (and callback) to a drain() that may never come.
                    args = (*sys.exc_info(), threading.current_thread())
                    threading.excepthook(threading.ExceptHookArgs(args))
                    time.sleep(_RETRY_S)

    def run_nested(self) -> int:
        """From inside this thread's own batch (a wait there: in a done callback, or a
        signal handler or finalizer run in one): act on the entries due now, within it.
        Only this batch can act on them while this thread holds it."""
        return self._batch.run(True, False, True)

    def outstanding(self) -> int:
        return self._batch.outstanding()

    def running_here(self) -> bool:
        """Whether this thread is inside this batch (a callback that drains)."""
        return self._batch.running_here()

    def faulted(self) -> int:
        """Entries whose launch a device fault failed."""
        return self._batch.faulted()


# ---- the pending call that signals of channels made with wake_main ask for ----

_routed = False  # the native pending call runs _pending_call
# Re-entrant: a pending call between two of its bytecodes may run a callback that
# makes a loop's first wait, which routes again.
_route_lock = threading.RLock()


def _route_pending_calls() -> None:
    """Have the native pending call run :func:`_pending_call` (once)."""
    global _routed
    if _routed:
        return
    with _route_lock:
        if not _routed:
            _core.set_notify_callable(_pending_call)
            any_thread = any_thread_pending_call()
            if any_thread is not None:
                _core.set_any_thread_pending(*any_thread)
            _routed = True


def _pending_call() -> None:
    """Run what is due on this thread, between two of its bytecodes (GIL held).

    The main thread (from 3.12 any thread) runs it soon after a signal, even
    while busy in Python.  Non-blocking callbacks: on the main thread only, and
    unless another thread runs their batch (never wait for it here); on another
    thread the pending call may have interrupted anything, numba_hostfn's own
    futures thread inside a done-callback included, whose locks a callback could
    then wait for, on its own thread, for ever; the helper thread, woken by the
    descriptor, runs them instead.
    async_done: the waits of the loop running on this thread, resolved now
    rather than at the loop's next poll of its descriptor (resolving runs no
    user code).  From 3.12 a Python callable's pending call may also run on
    the driver's or an executor's thread: nothing there (no loop runs there; the
    descriptor was written).  The thread is told by its ident, never by
    ``threading.current_thread()``, which on a thread Python did not start
    registers a ``_DummyThread`` that stays in ``threading.enumerate()`` and
    ``active_count()`` after the thread has ended.
    """
    # Also while this thread makes the process's futures (_callbacks_lock, reentrant):
    # a callback that makes the first done_future there makes it itself.
    if _callbacks is not None and threading.get_ident() == threading.main_thread().ident:
        _callbacks.run(block=False)
    loop = running_loop()
    ref = None if loop is None else _loops.get(loop)
    waits = None if ref is None else ref()
    if waits is not None:
        waits.resolve()


_callbacks: _Callbacks | None = None
# done_future's results are set on a thread of their own, never from a pending
# call: one could run inside concurrent.futures.wait() or as_completed() on the
# thread that holds the futures' locks, and their waiter would miss the result.
_futures: _Callbacks | None = None
# Reentrant, as HostExecutor._lock (LIFETIME.md, invariant 11): making the batches
# runs Python, and a finalizer, a signal handler or a pending call's callback run
# meanwhile on this thread may launch blocking=False or make a done_future itself.
# Whichever object's thread records it first is the process's; the other's thread
# ends (_Callbacks._serve).
_callbacks_lock = threading.RLock()
# The objects recorded, by kind: set once, by dict.setdefault (one native step, no
# lock), on the helper thread of the object that is recorded (_Callbacks._serve).
# A finalizer run on a helper thread while it records may make a first use of
# either kind, and waits for another helper's record: a lock held here would be
# waited for by that helper, for ever.
_recorded: dict[str, _Callbacks] = {}


def _record_callbacks(made: _Callbacks) -> bool:
    """On ``made``'s helper thread: record it as the process's non-blocking callbacks,
    unless another is; whether it is the process's."""
    global _callbacks
    _callbacks = winner = _recorded.setdefault("callbacks", made)
    return winner is made


def _record_futures(made: _Callbacks) -> bool:
    """On ``made``'s helper thread: record it as the process's futures, unless another
    is; whether it is the process's."""
    global _futures
    _futures = winner = _recorded.setdefault("futures", made)
    return winner is made


def _the_callbacks() -> _Callbacks:
    if _callbacks is None:
        _wait_for_record(_make_callbacks(), "callbacks")
    assert _callbacks is not None  # recorded (_wait_for_record raises if not)
    return _callbacks


def _the_futures() -> _Callbacks:
    if _futures is None:
        _wait_for_record(_make_futures(), "futures")
    assert _futures is not None  # recorded (_wait_for_record raises if not)
    return _futures


def _make_callbacks() -> _Callbacks | None:
    with _callbacks_lock:  # one thread makes it at a time (a loser would end)
        return _Callbacks(_record_callbacks) if _callbacks is None else None


def _make_futures() -> _Callbacks | None:
    with _callbacks_lock:
        if _futures is not None:
            return None
        return _Callbacks(
            _record_futures,
            wake_main=False,
            name="numba_hostfn-futures",
            on_fault=_FutureEntry.fail,
        )


def _wait_for_record(made: _Callbacks | None, kind: str) -> None:
    """Wait, outside ``_callbacks_lock``, until ``made``'s helper thread has recorded
    the process's ``kind`` (its own object, or found another's): a finalizer run on
    that thread before it records may make a first use itself, which takes the lock."""
    if made is not None:
        made.decided.wait()
    if kind not in _recorded:
        raise RuntimeError(
            f"numba_hostfn's {kind} thread ended before it recorded itself (its error "
            "went to threading.excepthook); call again to start another"
        )


def dropped_callbacks() -> int:
    """How many non-blocking callbacks a device fault dropped.

    ``host_launch(stream, fn, blocking=False)`` has no caller to raise to: when
    a device fault means that its stream will never get there (docs/errors.md,
    "A device fault"), the callback is dropped, never called, and counted here.
    A blocking callable or compiled host function that will never run is
    released as well (``pending()`` goes back to 0), and ``done_future`` and
    ``async_done`` raise :class:`DeviceFaultError`.

    Returns
    -------
    int
        Non-blocking callbacks dropped since the process started.
    """
    return 0 if _callbacks is None else _callbacks.faulted()


def run_callbacks() -> int:
    """Run the non-blocking callbacks and done_future results that are due (for
    ``drain()``); return how many.

    Called from inside a batch (a callback or a done-callback that drains), it
    never waits for the other batch's lock: the thread running that batch may be
    draining too, and waiting for this one.
    """
    runners = [c for c in (_callbacks, _futures) if c is not None]
    inside = any(c.running_here() for c in runners)
    return sum(c.run(block=not inside) for c in runners)


def _run_due_at_exit() -> None:
    """At exit, once the non-daemon threads have ended, and before the interpreter
    guard closes: run the non-blocking callbacks and ``done_future`` results that are
    due (their signals have run: the streams got there), with their done callbacks,
    waiting first for a batch under way on a helper thread.  Those threads are
    daemons: the interpreter's finalization stopped a batch there in the middle, and
    what was due after it never ran, though the program had synchronized its streams
    (docs/asyncio.md, "Interpreter exit").  Exit still waits for no stream: a signal
    that runs after this is not waited for.  The wait, GIL released, checks for
    signals: a Ctrl-C ends it.  In a forked child nothing is due (invariant 22)."""
    if forked():
        return
    for batches in (_callbacks, _futures):
        if batches is not None:
            batches.run()


# Registered at import, before the backend's records register their close: the
# handler registered first is put in front last (_compat.register_first_atexit), so
# this runs first, while the guard is still open (a callback run here, and what it
# waits for, runs as before exit), then the guard closes, before any other library's
# atexit handler (LIFETIME.md, invariant 6).
register_first_atexit(_run_due_at_exit, _core.to_front_of_atexit)


_IN_GRAPH = (
    "{what} cannot be used in a CUDA graph or on a capturing stream: it signals "
    "once, and a replayed node would signal at every replay. Call it on the stream "
    "that replays the graph, after the replay: {what} then fires when the replay is done"
)
_NONBLOCKING_IN_GRAPH = _IN_GRAPH.format(what="host_launch(blocking=False)")
_FUTURE_IN_GRAPH = _IN_GRAPH.format(what="done_future()")
_ASYNC_IN_GRAPH = _IN_GRAPH.format(what="async_done()")


def launch_nonblocking(
    stream: Any, fn: Any, executor: Any = None, handle: int | None = None
) -> None:
    """``host_launch(stream, fn, blocking=False)`` for a classified Python callable;
    ``handle``: the stream's, as host_launch's argument check read it (its
    ``__cuda_stream__`` is not asked again)."""
    # On the driver's thread unless executor= is given: the default lane serves
    # async_done and done_future only.  Checked before the callbacks' thread is made:
    # a refused call starts nothing (_enqueue.check_signal).
    handle = check_signal(
        stream,
        executor,
        _NONBLOCKING_IN_GRAPH,
        handle=handle,
        making=_callbacks is None,
        default_lane=False,
    )
    _the_callbacks().launch(
        stream, fn, executor, _NONBLOCKING_IN_GRAPH, default_lane=False, handle=handle
    )


@keeps_nothing_on_refusal
def done_future(stream: Any, *, executor: Any = None) -> concurrent.futures.Future:
    """A ``concurrent.futures.Future`` that resolves when ``stream`` reaches this point.

    For threads and code without an event loop.  The stream signals without
    the GIL and goes on; the future's result is set, in stream order, by
    numba_hostfn's thread ``numba_hostfn-futures`` (never from a pending call,
    which could run inside ``concurrent.futures.wait`` on the waiting thread).
    Where the signal is on an executor's lane (the default lane's too), a thread
    blocked in the future's ``result()`` or ``exception()`` watches the stream
    itself, with the GIL released, and sets the result as soon as the stream
    gets there (its done callbacks then run on that thread; a ``KeyboardInterrupt``
    in one is raised once the others have run).

    Parameters
    ----------
    stream : stream
        A cuda.core ``Stream`` or any object with ``__cuda_stream__``; with
        the simulator, a ``numba_hostfn.simulator.Stream``.  Not a capturing
        stream or a graph.
    executor : HostExecutor, optional
        Signal from the executor's threads.  Without it the signal comes from
        the package's default lane, a one-thread executor started at the first
        wait, or from the driver's thread where that lane cannot serve
        (docs/asyncio.md, "The default lane").

    Returns
    -------
    concurrent.futures.Future
        Its result is ``stream``.  Cancelling it drops interest only: the GPU
        work goes on, and the signal is released as usual.  (A subclass, whose
        ``result()`` and ``exception()`` watch the stream as above.)

    Raises
    ------
    TypeError
        If ``stream`` is not a stream, or ``executor`` is not a HostExecutor.
    RuntimeError
        If ``stream`` is capturing or is a graph, or the executor is closed.
    """
    # The stream, the executor, and where this call would make the futures thread or
    # a lane, the enqueue's refusals: a refused call starts no thread and keeps no lane.
    handle = check_signal(
        stream, executor, _FUTURE_IN_GRAPH, "done_future", making=_futures is None
    )
    future = _stream_future_type()(stream)
    entry = _FutureEntry(future, handle)
    future._watch = _the_futures().launch(
        stream, entry, executor, _FUTURE_IN_GRAPH, caller="done_future", handle=handle
    )
    return future


#: How long a thread in a done_future's result() or exception() watches its stream
#: with the GIL released before it looks at the future again (a device fault, a
#: cancel, a result set by the futures thread): 1 ms.
WATCH_CHUNK_US = 1000
#: How often a wait on the thread that holds the futures' batch looks for its
#: signal (StreamFuture._run_here): 1 ms.
NESTED_POLL_S = 0.001

_stream_future: Any = None


def _stream_future_type() -> type[concurrent.futures.Future]:
    """done_future's Future subclass (made at first use: concurrent.futures is not
    imported up front, for start-up time)."""
    global _stream_future
    if _stream_future is None:
        import concurrent.futures

        class StreamFuture(concurrent.futures.Future):
            """A ``concurrent.futures.Future`` whose result is its stream, set once:
            by numba_hostfn's futures thread when the stream's signal has run, or by
            a thread blocked in :meth:`result` or :meth:`exception`, which watches
            the stream itself where the signal is on an executor's lane (the default
            lane's too): it sees the stream get there as the lane's thread does, and
            returns without waiting for two other threads to wake up in turn (the
            lane's, then the futures thread).  LIFETIME.md, invariant 25."""

            def __init__(self, stream: Any) -> None:
                super().__init__()
                # concurrent.futures.wait()'s, as_completed()'s; a weak reference: no cycle
                self._waiters = _Waiters(weakref.ref(self))
                self._stream = stream
                self._watch = (0, 0)  # (lane, task) where the signal is on a lane

            def _settle(self, error: BaseException | None = None) -> None:
                """Set the result (the stream), or ``error``, unless already settled
                (or cancelled: interest dropped, and its waiters told, as an executor
                tells them).  In one native call (``settle_future``): the state moved
                under the future's own lock, so two settles never both set it; its
                waiting threads woken and its done callbacks called once it is
                FINISHED, with no bytecode between, so that a Ctrl-C here strands
                none of them (it is raised after).  Interrupted before the state
                moves, the future stays PENDING or RUNNING, for the other thread or a
                retried result() to finish (invariant 21)."""
                outcome = self._stream if error is None else error
                _core.settle_future(self, outcome, error is not None, _callback_failed)

            def _invoke_callbacks(self) -> None:
                """Call the done callbacks, oldest first, as concurrent.futures does
                (an Exception logged, the next called), in one native call: for
                cancel(), on whichever thread cancels (a settle calls them itself,
                in ``settle_future``), where a Ctrl-C lands.  A KeyboardInterrupt (or a
                signal handler's exception) in one is raised once the rest have run:
                nothing calls them later, as the future is settled once, and
                concurrent.futures stopped at it (an ``asyncio.wrap_future`` bridge
                after it never ran, its coroutine waited for ever).  LIFETIME.md,
                invariant 21.  (Overrides concurrent.futures' own, which set_result,
                set_exception and cancel call.)"""
                _core.call_done_callbacks(self._done_callbacks, self, _callback_failed)

            def result(self, timeout: float | None = None) -> Any:
                return super().result(self._watch_stream(timeout))

            def exception(self, timeout: float | None = None) -> BaseException | None:
                return super().exception(self._watch_stream(timeout))

            def _watch_stream(self, timeout: float | None) -> float | None:
                """Until the future is done or ``timeout`` passes: watch the lane's
                word, GIL released, and settle the future here once the stream has
                reached the task.  Returns what is left of ``timeout``.  In a forked
                child, where no thread will ever set it (nor stream write the words),
                a future not done raises RuntimeError, naming 'spawn'."""
                if forked() and not self.done():
                    get_backend()  # raises: before, result() waited for ever
                batches = _futures
                if batches is not None and batches.running_here():
                    return self._run_here(batches, timeout)
                lane, task = self._watch
                if not task:
                    return timeout
                deadline = None if timeout is None else time.monotonic() + timeout
                spin = True
                while not self.done():
                    left = None if deadline is None else max(0.0, deadline - time.monotonic())
                    budget = WATCH_CHUNK_US if left is None else min(WATCH_CHUNK_US, left * 1e6)
                    reached = _core.lane_reached(lane, task, int(budget), spin)
                    if reached > 0:
                        self._settle()
                    if reached or (left is not None and left * 1e6 <= budget):
                        break  # reached; a fault (-1: the futures thread fails it); or time
                    spin = False
                return None if deadline is None else max(0.0, deadline - time.monotonic())

            def _run_here(self, batches: _Callbacks, timeout: float | None) -> float | None:
                """A wait on the thread that runs the futures' batch (drain()'s caller,
                or the futures thread, in a done callback or a signal handler or
                finalizer run there): no other thread can set the result meanwhile, so
                this one acts on the batch's due entries itself, nested in it, oldest
                first, until the future is done or ``timeout`` passes (before: it
                waited for itself, for ever).  Returns what is left of ``timeout``."""
                deadline = None if timeout is None else time.monotonic() + timeout
                lane, task = self._watch
                while not self.done():
                    batches.run_nested()
                    if not self.done() and task:
                        if _core.lane_reached(lane, task, 0, False) > 0:
                            self._settle()
                    if self.done() or (deadline is not None and time.monotonic() >= deadline):
                        break
                    time.sleep(NESTED_POLL_S)  # its signal has not run yet
                return None if deadline is None else max(0.0, deadline - time.monotonic())

        _stream_future = StreamFuture
    return _stream_future


def _callback_failed(future: Any, error: BaseException) -> None:
    """A done callback of a done_future raised ``error`` (an Exception): logged as
    concurrent.futures logs it, with the same logger and message."""
    import logging  # imported already: concurrent.futures imports it

    logging.getLogger("concurrent.futures").error(
        "exception calling callback for %r", future, exc_info=error
    )


class _Waiters(list):
    """A done_future's waiters: ``concurrent.futures.wait()`` and ``as_completed()``
    install theirs here (``append``, on the waiting thread, under the futures' locks).
    Where no other thread will set the future, so that the waiter's event would wait
    for its own thread, for ever (the thread that holds the futures' batch: a done
    callback, or drain()'s caller; or a forked child, where it is not done), its event
    is swapped for a :class:`_BatchEvent`, which does there what ``result()`` does.
    ``future``: a weak reference to the future whose waiters these are."""

    __slots__ = ("_future",)

    def __init__(self, future: Any = None) -> None:
        super().__init__()
        self._future = future

    def append(self, waiter: Any) -> None:
        if type(waiter.event) is threading.Event:  # not swapped yet (a waiter of several)
            if forked():
                # One done at fork is only a result there: a wait over it and the
                # child's own futures waits for those (before: it raised).  So also in
                # a child forked inside the batch, whose copy runs no batch.
                swap = not self._done()
            else:
                batches = _futures
                swap = batches is not None and batches.running_here()
            if swap:
                waiter.event = _BatchEvent()
        super().append(waiter)

    def _done(self) -> bool:
        """Whether the future is done as wait() and as_completed() count it: finished,
        or cancelled with its waiters told (one cancelled whose stream has not got
        there yet is told by the futures thread then, and done() is already true).
        Its lock, an RLock, is this thread's: wait() and as_completed() install under it."""
        from concurrent.futures import _base  # imported already: a future exists

        future = None if self._future is None else self._future()
        return future is None or future._state in (_base.CANCELLED_AND_NOTIFIED, _base.FINISHED)


class _BatchEvent(threading.Event):
    """The event of a ``concurrent.futures`` waiter that waits on the thread holding
    the futures' batch: its ``wait`` sets the results due there, nested in that batch,
    oldest first (``StreamFuture._run_here``), until it is set or the timeout passes.
    In a forked child, one not set raises the RuntimeError that names 'spawn'."""

    def wait(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.is_set():
            if forked():
                get_backend()  # raises: no thread of this child sets the parent's futures
            batches = _futures
            if batches is not None and batches.running_here():
                batches.run_nested()
            left = None if deadline is None else deadline - time.monotonic()
            if self.is_set() or (left is not None and left <= 0):
                break
            super().wait(NESTED_POLL_S if left is None else min(NESTED_POLL_S, left))
        return self.is_set()


class _FutureEntry:
    """What a done_future's signal acts on: its future, resolved with the stream, or
    failed with the device fault that kept the stream from getting there."""

    __slots__ = ("future", "handle")

    def __init__(self, future: Any, handle: int) -> None:
        self.future = future
        self.handle = handle  # the stream's, as the wait's call read it

    def __call__(self) -> None:
        self.future._settle()

    def fail(self, code: int) -> None:
        self.future._settle(_fault_error(code, self.future._stream, self.handle))


def _fault_error(code: int, stream: Any, handle: int) -> Exception:
    """The DeviceFaultError of a wait on ``stream`` that a device fault ``code`` ended.

    ``handle``: the stream's, as the wait's call read it (its ``__cuda_stream__``
    is not asked again: it could be anyone's code, and failing a wait runs none),
    which names the fault of that stream's context where two contexts faulted
    with one code.  Nor is its repr asked (a cuda.core Stream's asks the driver,
    which after a fault, on this thread, raises): the wait's stream is named by
    its type and that handle."""
    what = f"{type(stream).__name__} {handle:#x}"
    return get_backend().fault_error(
        code, f"this wait's stream ({what}) will never get here", handle
    )


def _fail_loop_wait(entry: Any, code: int) -> None:
    """on_fault of a loop's waits: the future gets the error (it schedules its awaiting
    coroutines with call_soon, as a result does: no user code runs here)."""
    future, stream, handle = entry
    if not future.done():
        future.set_exception(_fault_error(code, stream, handle))


# ---- async_done: one channel per event loop ----


class _LoopWaits:
    """The waits of one event loop: a channel whose descriptor the loop reads.

    Its dispatcher resolves them natively: registered with their signal's enqueue,
    taken and resolved with no Python-level step between, one resolve at a time (a
    nested one, the pending call between two bytecodes of the loop's reader,
    returns at once), so an exception raised in between (a signal handler's) loses
    no wait and leaves none stuck (LIFETIME.md, invariants 19 and 21).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # Also a pending call, where one can run on the loop's thread: it
        # resolves the futures in the middle of a loop turn, a turn before the
        # loop would poll the descriptor (with busy coroutines, turns are long).
        wake = threading.current_thread() is threading.main_thread()
        wake = wake or any_thread_pending_call() is not None
        if wake:
            _route_pending_calls()
        self.channel = _Channel(
            wake_main=wake, nonblocking=True, resolve=True, on_fault=_fail_loop_wait
        )
        self._loop, self.reading = weakref.ref(loop), False  # no cycle with the loop
        # Recorded before the loop holds it (its reader): an interrupt in between
        # leaves it recorded, and read() is called again by the next async_done; an
        # interrupt before this line leaves nothing holding it, and it is collected.
        # (Recorded after, one made and not recorded kept its reader and channel on
        # the loop for good, and the next call made another.)
        _loops[loop] = weakref.ref(self)
        self.read()

    def read(self) -> None:
        """Have the loop read the channel's descriptor (again: add_reader replaces)."""
        loop = self._loop()
        if loop is None:
            return
        try:
            loop.add_reader(self.channel.fd, self._ready)
        except NotImplementedError:  # a loop that watches no descriptor (proactor-style)
            _loops.pop(loop, None)
            raise RuntimeError(
                f"async_done() needs an event loop that supports add_reader; "
                f"{type(loop).__name__} does not. Await "
                "asyncio.wrap_future(numba_hostfn.done_future(stream)) instead"
            ) from None
        self.reading = True

    def _ready(self) -> None:
        # One native step: read the descriptor first (a signal after the take writes
        # again), then take and resolve; a Ctrl-C between a read here and the resolve
        # would leave the keys on the channel with no wake-up for them or any later one.
        self.channel.dispatcher.run(False, True)

    def resolve(self) -> None:
        """Resolve the futures whose signals have run, oldest first (loop's thread)."""
        self.channel.dispatcher.run(False)

    def outstanding(self) -> int:
        return self.channel.dispatcher.outstanding()


# loop -> a weak reference to its waits.  The loop alone keeps its waits alive,
# through the reader it watches (its futures refer to the loop: a strong value
# here would keep every loop alive); a closed or collected loop drops them, and
# their channel goes with the last signal that may still write it.
_loops: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@keeps_nothing_on_refusal
def async_done(stream: Any, *, executor: Any = None) -> asyncio.Future:
    """An awaitable that resolves when ``stream`` reaches this point.

    ``await numba_hostfn.async_done(stream)`` suspends the coroutine, not the
    loop.  When the stream gets here, a compiled host function on the
    driver's thread (or the executor's) writes the loop's eventfd without
    taking the GIL; the loop wakes as for a socket and resolves the futures
    whose streams got there, in that order.  One descriptor per loop, however
    many waits; no thread per wait (the default lane's one thread serves them all).

    Parameters
    ----------
    stream : stream
        A cuda.core ``Stream`` or any object with ``__cuda_stream__`` (CuPy,
        PyTorch, numba-cuda); with the simulator, a
        ``numba_hostfn.simulator.Stream``.  Not a capturing stream or a graph.
    executor : HostExecutor, optional
        Signal from the executor's threads.  Without it the signal comes from
        the package's default lane, a one-thread executor started at the first
        wait, or from the driver's thread where that lane cannot serve
        (docs/asyncio.md, "The default lane").

    Returns
    -------
    asyncio.Future
        A future of the running loop, whose result is ``stream``.  Cancelling
        it drops interest only: the GPU work goes on, and the signal is
        released as usual.  If the loop closes first, the future never
        resolves, and the signal is released all the same.

    Raises
    ------
    RuntimeError
        If no event loop is running in this thread, or it cannot watch a
        descriptor (``add_reader``), ``stream`` is capturing or is a graph, or
        the executor is closed.
    TypeError
        If ``stream`` is not a stream, or ``executor`` is not a HostExecutor.

    Examples
    --------
    >>> async def handle(request):  # doctest: +SKIP
    ...     stream = nh.create_stream()
    ...     kernel[blocks, threads, stream](request)
    ...     await nh.async_done(stream)
    """
    import asyncio

    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        raise RuntimeError(
            "async_done() needs a running asyncio event loop: await it in a coroutine. "
            "Outside a loop, use numba_hostfn.done_future(stream) (a concurrent.futures.Future)"
        ) from None
    ref = _loops.get(loop)
    waits = None if ref is None else ref()
    # The stream, the executor, and where this call would make the loop's channel (a
    # reader on the loop) or a lane, the enqueue's refusals: a refused call makes none.
    handle = check_signal(stream, executor, _ASYNC_IN_GRAPH, "async_done", making=waits is None)
    if waits is None:
        waits = _LoopWaits(loop)  # recorded in _loops
    elif not waits.reading:  # an interrupt came between its record and its reader
        waits.read()
    future = loop.create_future()
    waits.channel.launch(
        stream,
        executor,
        _ASYNC_IN_GRAPH,
        (future, stream, handle),
        caller="async_done",
        handle=handle,
    )
    return future
