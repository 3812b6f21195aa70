"""``HostExecutor``: stream-ordered host work on a pool of native threads.

``host_launch(stream, fn, executor=ex)`` puts two stream memory operations on
the stream instead of a driver host function: a write of a task number to a
"reached" word in pinned, device-mapped host memory, then a wait until a "done"
word holds it (one ``cuStreamBatchMemOp``).  One of the pool's threads, which
never hold the GIL, sees the stream reach the task, runs it and writes "done"
(``native/executor.c``, whose ``ExecutorBase`` this class extends; its pool in
``native/pool.c``).  The driver's single host-function thread is not involved:
tasks of different streams run in parallel, and the start latency is a spinning
thread's, not the driver thread's wake-up.  Launch records and lifetimes are those of
``host_launch`` (LIFETIME.md, invariant 15 for the words).
"""

from __future__ import annotations

import numbers
import threading
import time
from typing import Any

from . import _core
from ._backend import executor_refused_error, in_host_function_error
from ._compat import register_first_atexit
from ._errors import CudaDriverError
from ._process import SIMULATOR_ENV, forked, get_backend

__all__ = [
    "HostExecutor",
    "check_executor",
    "copy_context_of",
    "default_lane",
    "default_lane_makes",
    "default_lane_of",
    "graph_slot_of",
    "has_lane",
    "lane_of",
    "renew_lane",
]

_WORDS_PER_BLOCK = 512  # lanes per block of pinned memory (8 bytes each: a page)


def _positive_number(name: str, value: Any, minimum: float, maximum: float) -> float:
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise TypeError(f"HostExecutor({name}=...) expected a number, got {value!r}")
    if not minimum <= value <= maximum:
        raise ValueError(f"HostExecutor({name}=...) expected {minimum} to {maximum}, got {value!r}")
    return float(value)


#: CUDA's default-stream handles, 0 to 2 (0 and CU_STREAM_LEGACY name a stream in
#: each context, CU_STREAM_PER_THREAD one in each context and thread): see
#: HostExecutor._lane and default_lane_of.
_DEFAULT_STREAM_HANDLES = 2


class HostExecutor(_core.ExecutorBase):
    """A pool of native threads that runs host functions in stream order.

    Pass it to :func:`host_launch`, :func:`host_copy` or :func:`release_after`
    as ``executor=``: the function then runs on one of the pool's threads, not
    on the driver's one host-function thread, so host work of different streams
    runs in parallel and starts within microseconds of the stream reaching it.
    The stream waits for it as for a host function.  A large ``host_copy`` is
    shared out among the pool's threads.  Threading rules and costs:
    docs/executor.md.

    Parameters
    ----------
    threads : int, optional
        How many threads (1 to 1024).  Tasks of one stream run one at a time;
        up to ``threads`` streams' tasks run at once.
    spin_us : float, optional
        After its last task, or the launch that woke it, a thread with nothing
        to run spins for this many microseconds (a core busy, the lowest
        latency).
    poll_us : float, optional
        Then, while tasks are outstanding (enqueued, not yet run), it checks
        every ``poll_us`` microseconds (little CPU, up to that much latency).
        With nothing outstanding the threads sleep until the next launch wakes
        them, and use no CPU: a new executor's from their start.

    Raises
    ------
    TypeError, ValueError
        For a wrong type or value of an argument.
    RuntimeError
        If a device cannot run stream memory operations on host memory (no
        unified addressing, no stream wait on memory), naming the device; there
        is no fallback to the driver's host-function thread.  On the simulator,
        from a host function too: its words are a CUDA allocation, and CUDA
        forbids a host function any CUDA call (docs/threading.md).

    Examples
    --------
    >>> with nh.HostExecutor(threads=2) as ex:  # doctest: +SKIP
    ...     nh.host_launch(stream, fn, user_data=nh.by_ref(a), executor=ex)
    ...     stream.sync()
    """

    #: True once close() has returned.  A class default, not only set by __init__: one
    #: stopped after its pool started (an interrupt between two of its lines) still
    #: leaves an executor that __del__ closes, its threads joined.
    _closed = False

    def __init__(self, threads: int = 4, *, spin_us: float = 100.0, poll_us: float = 100.0) -> None:
        if self._pool:  # started: its lanes, words and state are its threads' for its life
            raise RuntimeError(
                "HostExecutor.__init__ on an executor that is started already; make "
                "another HostExecutor"
            )
        if not isinstance(threads, numbers.Integral) or isinstance(threads, bool):
            raise TypeError(f"HostExecutor(threads=...) expected an int, got {threads!r}")
        if not 1 <= threads <= 1024:
            raise ValueError(f"HostExecutor(threads=...) expected 1 to 1024 threads, got {threads}")
        spin = _positive_number("spin_us", spin_us, 0, 10_000_000)
        poll = _positive_number("poll_us", poll_us, 1, 1_000_000)
        backend = get_backend()
        if backend.in_host_function():  # the simulator's: its words are a CUDA allocation
            raise in_host_function_error(
                "made a HostExecutor (its words are pinned memory: cuMemHostAlloc)",
                "no thread was started",
            )
        backend.check_executor()
        # Started before anything is written: the native start lets one pool in (under
        # the GIL), so of two __init__ calls of this object that both passed the check
        # above (two threads), the second is refused there having changed nothing.
        self._start(int(threads), int(spin * 1000), int(poll * 1000))
        self._backend = backend
        self.threads = int(threads)
        self.spin_us = spin
        self.poll_us = poll
        # Stream handle -> lane; (default-stream handle, lane) -> lane (see _lane).
        self._lanes: dict[int | tuple[int, int], int] = {}
        self._block = 0
        self._block_used = _WORDS_PER_BLOCK
        # Reentrant: a finalizer (a drain's release, a garbage collection, a signal
        # handler) may run between any two bytecodes while this thread holds it, and
        # may launch with this executor (LIFETIME.md, invariant 11).
        self._lock = threading.RLock()
        self._closed = False
        # Take the first block of pinned words now, outside the program's
        # captures where it can (with no context current yet, the first launch
        # takes it instead, in relaxed capture mode as every block: _reserve).
        try:
            with self._lock:
                self._reserve()
        except CudaDriverError:
            pass

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has returned (not after an interrupted one)."""
        return self._closed

    def outstanding(self) -> int:
        """How many tasks are enqueued and not yet run."""
        get_backend()  # in a forked child: RuntimeError, naming spawn
        return self._outstanding()

    def _lane(self, handle: int, most: int = 0, stale: int = 0) -> int:
        """The lane (its words and task queue) for stream ``handle``, made on first use
        (``lane_of``); 0 if it has none and already ``most`` lanes (where given).

        A CUDA default-stream handle (0, 0x1, 0x2) names one stream in each context
        (0x2: in each thread too): the native core keys its lanes by the stream's id
        and context as this thread names them, so one lane never serves two streams,
        whose arrivals would release each other's tasks (before: one lane per
        handle).  ``stale``: a lane whose enqueue answered ``_core.LANE_STALE`` (the
        driver gave the handle of a destroyed stream, whose tasks on it are still to be
        reached, to this one: LIFETIME.md, invariant 15) counts as none, so the stream
        gets another lane (``renew_lane``): one of the handle's whose tasks have all run
        (``_reuse_lane``), else a new one; ``stale`` keeps serving the destroyed stream.
        A lane another thread made in its place meanwhile is returned as it is.  A
        default-stream handle's stream with no lane takes an idle one of that handle
        and context (``_reuse_lane``: each thread's per-thread stream is another, so a
        program that starts threads would otherwise add a lane per thread for ever),
        else a new one."""
        if self._closed:
            raise executor_refused_error(self)
        if handle <= _DEFAULT_STREAM_HANDLES:
            lane = self._find_lane(handle)  # this thread's stream of that handle
            if lane and lane != stale:
                return lane
            with self._lock:
                lane = self._find_lane(handle)  # the newest, made last
                if not lane or lane == stale:
                    lane = self._reuse_lane(handle, stale)
                if not lane:
                    lane = self._lane_new(handle, self._words())
                self._lanes[handle, lane] = lane
            return lane
        lane = self._lanes.get(handle)
        if lane is not None and lane != stale:
            return lane
        if most and lane is None and len(self._lanes) >= most:
            return 0
        with self._lock:
            lane = self._lanes.get(handle)
            if lane is None:
                # One an interrupted call made natively and did not record (a Ctrl-C
                # between _lane_new and the store below): the native launch finds it,
                # so it is the stream's lane here too, not a second one.
                lane = self._find_lane(handle) or None
            if lane is None or lane == stale:
                # A renewal: one of its lanes passed by earlier whose tasks have run
                # serves, else a new one (a handle then has as many lanes as its
                # streams with tasks outstanding at once).
                reused = self._reuse_lane(handle, lane) if lane is not None else 0
                lane = reused or self._lane_new(handle, self._words())
            self._lanes[handle] = lane
        return lane

    def _reserve(self) -> None:
        """A new block of pinned words, if the current one is used up (under ``_lock``).

        Allocated with this thread in relaxed capture mode: a later block is taken
        while the program captures (a graph node, a lane made for a stream, the
        513th of them), and a ``cuMemHostAlloc`` while some thread captures in
        global mode (torch's default) would invalidate that capture.
        """
        if self._block_used >= _WORDS_PER_BLOCK:
            with self._backend.relaxed_capture_mode():
                block = self._backend.executor_memory(8 * _WORDS_PER_BLOCK)
            # One statement: a finalizer that ran meanwhile and took words of a block of
            # its own leaves that block's other words unused, never a word taken twice.
            self._block, self._block_used = block, 0

    def _words(self) -> int:
        """Two zeroed 32-bit words of pinned, device-mapped memory (under ``_lock``).

        The lock is reentrant: a finalizer (a collection, a drain's release, a signal
        handler) may run at any line here and launch with this executor on another
        stream (LIFETIME.md, invariant 11).  So the words are read and taken in one
        statement with no call in it, and a finalizer gets words of its own, before or
        after; one that used the block up in between sends this claim to a new block.
        (Before, one between the read and the increment got the same words: two
        streams wrote one "reached" word.)
        """
        while True:
            self._reserve()
            block, used, self._block_used = self._block, self._block_used, self._block_used + 1
            if used < _WORDS_PER_BLOCK:
                return block + 8 * used

    def _graph_slot(self) -> _core.GraphSlot:
        """A disarmed graph slot for one node: a free one, or one on new words.

        A ``_core.GraphSlot``: the node's launch record owns it, so it is
        disarmed when the graph, all its instances and queued replays are gone
        and the record is released on the main thread (LIFETIME.md, invariant
        16), and its words then serve a later node.  The disarm is its native
        dealloc: no Python runs in between, so a Ctrl-C cannot leave it armed.
        """
        if self._closed:
            raise executor_refused_error(self)
        slot = self._slot_take()
        if slot is None:
            with self._lock:
                slot = self._slot_new(self._words())
        return slot

    def graph_nodes(self) -> int:
        """How many of this executor's nodes are in graphs that are still alive.

        While there are any, one of the pool's threads polls for their replays
        every ``poll_us`` (docs/executor.md, "In graphs").
        """
        get_backend()  # in a forked child: RuntimeError, naming spawn
        return self._live_slots()

    def close(self) -> None:
        """Run every task already enqueued, then stop the threads (GIL released).

        It returns once the streams have reached and the threads have run all
        outstanding tasks.  Later launches with this executor raise
        RuntimeError.  The pinned words stay allocated: a stream may still
        have to execute a wait on them.  A launch racing it either raises
        RuntimeError ("stopped", while close() waits; "closed" once it has
        returned), having enqueued nothing, or runs before it returns; an
        interrupted close can be called again and finishes the job.

        The wait checks for signals every 50 ms, as
        ``ThreadPoolExecutor.shutdown(wait=True)`` does: a Ctrl-C (or a signal
        handler's exception) raises out of close() while a task is still
        running.  The executor is then stopped but not :attr:`closed` (its repr
        says "stopped, N tasks outstanding"): new launches raise RuntimeError
        saying it is stopped and how many tasks are outstanding, its threads
        still run those tasks and release their owners, and a later close()
        waits for them again and joins the threads.

        Raises RuntimeError from one of its own tasks, and from any host
        function (a driver's, or another executor's task) while tasks are
        outstanding: one queued behind that host function would wait for it,
        and close() for that task.  Close it from another thread.
        """
        if self._closed:
            return
        if not forked():  # a forked child has none of the pool's threads to wait for
            self._close()  # idempotent, one native call: no half-closed pool
        self._closed = True

    def __enter__(self) -> HostExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # What __del__ calls is bound here, as Stream.__del__'s is: an executor collected
    # at interpreter exit may be collected after the modules' globals were set to None,
    # and it must still stop its threads (close() looks up forked(), which raised
    # TypeError: "Exception ignored in HostExecutor.__del__", the pool left running).
    def __del__(self, _forked: Any = forked) -> None:
        # Launch records own their executor: it is collected only when no task
        # of it is outstanding, so this never waits for a stream.  One stopped by an
        # exception before its close is closed by the native dealloc after it.
        if self._pool and not self._closed:  # a pool started, not closed
            if not _forked():  # a forked child has none of the pool's threads
                self._close()
            self._closed = True

    def __repr__(self) -> str:
        # Lanes, not streams: a stream whose handle the driver gave out again, or a
        # default handle's stream in each thread or context, has a lane of its own.
        lanes = self._lane_count()
        state = "closed" if self._closed else f"{lanes} lane{'' if lanes == 1 else 's'}"
        if not self._pool:  # __init__ never ran (a subclass's skipped it): no threads
            state = "not started"
        elif not self._closed and self._stopping:
            # A close() that was interrupted (or raised): launches are refused, and the
            # threads still run what is outstanding until a close() waits for it.
            # (Before: the open executor's "1 lane", as if it took launches.)
            outstanding = self._outstanding()
            state = f"stopped, {outstanding} task{'' if outstanding == 1 else 's'} outstanding"
        # Not self.threads: __init__ sets it after the pool starts, so an interrupted
        # one, or a subclass's that skipped it, has none (repr raised AttributeError).
        threads = getattr(self, "threads", "?")
        return f"<numba_hostfn.HostExecutor threads={threads} {state}>"


def check_executor(executor: Any) -> HostExecutor:
    """``executor`` as a usable HostExecutor, or the error that says why not."""
    if not isinstance(executor, HostExecutor):
        raise TypeError(
            f"executor= expected a numba_hostfn.HostExecutor, got {type(executor).__name__}"
        )
    if not executor._pool:  # HostExecutor.__init__ never ran (a subclass's skipped it)
        raise RuntimeError(
            f"executor= got a {type(executor).__name__} that was not started: "
            "HostExecutor.__init__ never ran (a subclass's __init__ must call "
            "super().__init__())"
        )
    # _stopping: a close() began, and an interrupted one left the executor stopped but
    # not closed; a call with nothing to enqueue is refused as its launch would be.  The
    # error says which of the two it is (before: "closed" for both).
    if executor._closed or executor._stopping:
        raise executor_refused_error(executor)
    if executor._backend is not get_backend():  # pragma: no cover - one backend per process
        raise RuntimeError(
            f"the HostExecutor belongs to another backend; {SIMULATOR_ENV} changed in between"
        )
    return executor


# ---- the executor's lane API, for the package's enqueue, graph and signal paths ----


def lane_of(executor: HostExecutor, handle: int, most: int = 0) -> int:
    """The address of ``executor``'s lane for stream ``handle`` (the target of its
    enqueue function), made on first use; 0 if it has none yet and already ``most``
    lanes (where given).  RuntimeError if the executor is closed."""
    return executor._lane(handle, most)


def has_lane(executor: HostExecutor, handle: int) -> bool:
    """Whether ``lane_of(executor, handle)`` finds a lane it made before (a signal's
    check, ``_enqueue.check_signal``: where it would make one, the enqueue's refusals
    are read first, so that a refused signal leaves no lane).  A default-stream
    handle counts as found: its lanes are per thread and reused
    (``HostExecutor._lane``), and CUDA never closes those streams."""
    return handle <= _DEFAULT_STREAM_HANDLES or handle in executor._lanes


def renew_lane(executor: HostExecutor, handle: int, stale: int) -> int:
    """The address of a new lane of ``executor`` for stream ``handle``, whose lane
    ``stale`` serves an earlier stream that had the handle (an enqueue's
    ``_core.LANE_STALE``)."""
    return executor._lane(handle, stale=stale)


def graph_slot_of(executor: HostExecutor) -> _core.GraphSlot:
    """A disarmed graph slot of ``executor`` for one graph node (``_graphs``)."""
    return executor._graph_slot()


def copy_context_of(executor: HostExecutor) -> tuple[int]:
    """The record context of ``executor``'s parallel copy: its pool, where the copy
    trampoline (``EXEC_COPY``) finds the threads to share the copy out among."""
    return (executor._pool,)


# ---- the default lane: async_done and done_future without executor= ----

#: Streams the default lane serves at most: its thread walks every lane at each
#: turn (lanes are never removed), so a program that makes a stream per request
#: would make that walk grow for ever; waits on more streams take the driver's
#: thread, as without the lane.  Also half a block of words: it never allocates
#: pinned memory after its first block.
DEFAULT_LANE_STREAMS = 256
#: Waits the default lane holds outstanding at most, on all its streams: more take
#: the driver's thread.  Each is one item of device work on its stream (a batch of
#: two memory operations), and the driver blocks the enqueuing thread once a
#: stream holds about 1,021 items not yet run (an H200, benchmarks/queue_depth.py;
#: host functions: 30,000 and no block).  A loop that makes thousands of waits
#: behind a long host function would block in the driver, and deadlock if that
#: host function waits for the loop (tests/test_notify.py's bursts did); waits on
#: the driver's thread only add host functions, as before the lane.
DEFAULT_LANE_DEPTH = 64
#: How often the default lane's thread checks its words while a wait is
#: outstanding, once its 100 µs spin after the last wait's enqueue is spent.  An
#: await of a stream that gets there after that spin is seen this late at most
#: (half of it on average), so the executor's 100 µs would cost an idle loop's
#: await about 50 µs more than a thread in ``stream.sync()`` (docs/benchmarks.md,
#: "What bounds the missed ones"); the price, paid only while a wait is
#: outstanding, is the lane's CPU row of the asyncio benchmark.
DEFAULT_LANE_POLL_US = 20.0


class _DefaultLane(HostExecutor):
    """The package's own executor of one thread, for the signals of ``async_done``
    and ``done_future`` given no executor (docs/asyncio.md, "The default lane").

    Its pinned words are allocated with this thread in relaxed capture mode, as
    every executor's (``HostExecutor._reserve``), so that a first use while some
    thread captures in global mode (torch's default) invalidates no capture: the
    program did not ask for an executor, so it cannot make one outside its
    captures either.
    """

    def __init__(self) -> None:
        super().__init__(threads=1, poll_us=DEFAULT_LANE_POLL_US)

    def __repr__(self) -> str:
        return "<numba_hostfn default lane " + super().__repr__()[1:]


_default: _DefaultLane | None = None
#: True once the default lane cannot serve: this backend or a device has no stream
#: memory operations (HostExecutor refuses), or the interpreter is exiting.
_default_off = False
#: After a lane that could not start (its thread or its memory: a limit met for a
#: moment, which says nothing of the device), how long waits take the driver's
#: thread before a wait tries to start it again: not at every wait, whose
#: latency a failing thread start would add to.
DEFAULT_LANE_RETRY_S = 1.0
#: time.monotonic() before which no start is tried again (0: try).
_default_retry_at = 0.0
#: Reentrant, as HostExecutor._lock: making the lane runs Python, and a finalizer run
#: meanwhile may wait on a stream itself.
_default_lock = threading.RLock()


def default_lane() -> _DefaultLane | None:
    """The default lane, started on first use; None where it cannot serve.

    The caller has asked for the backend first (a forked child is refused there,
    before this: its lane, if the parent had one, has no thread).
    """
    global _default, _default_off, _default_retry_at
    lane = _default
    if lane is not None or _default_off:
        return None if _default_off else lane
    if _default_retry_at and time.monotonic() < _default_retry_at:
        return None  # it could not start a moment ago: the driver's path meanwhile
    if get_backend().in_host_function():
        # Its words would be a host function's CUDA call (HostExecutor refuses it): the
        # driver's path answers this wait as without the lane, and a later one starts it.
        return None
    with _default_lock:
        if _default is None and not _default_off:
            try:
                get_backend().check_executor()
            except CudaDriverError:  # a driver call failed (from a host function, say)
                return _default_later()
            except Exception:  # HostExecutor cannot work here (no memory operations): for good
                _default_off = True
                return None
            try:
                lane = _DefaultLane()
            except Exception:  # could not start (a thread or memory limit met): try again
                return _default_later()
            _default_retry_at = 0.0
            if _default is None and not _default_off:
                # LIFETIME.md, invariant 24: closed to new waits at exit, once the
                # non-daemon threads have ended; its thread is never joined.
                register_first_atexit(_close_default_lane, _core.to_front_of_atexit)
                _default = lane
            else:  # a finalizer run while it was made made the lane (or turned it off)
                lane.close()  # nothing launched on it: joins its thread
    return None if _default_off else _default


def _default_later() -> None:
    """The lane could not start, for a reason that says nothing of the device: waits
    take the driver's thread for ``DEFAULT_LANE_RETRY_S``, then one tries again."""
    global _default_retry_at
    _default_retry_at = time.monotonic() + DEFAULT_LANE_RETRY_S


def default_lane_of(handle: int) -> tuple[_DefaultLane, int] | None:
    """``(the default lane, its lane for stream handle)``, or None: then the
    signal takes the driver's thread, exactly as without the lane.

    Not for CUDA's default-stream handles (0, ``CU_STREAM_LEGACY`` 0x1,
    ``CU_STREAM_PER_THREAD`` 0x2): each names another stream in each context (0x2
    in each thread too), and one lane keyed by the handle would share its words
    among them, so a wait could resolve when *another* stream got there."""
    if handle <= _DEFAULT_STREAM_HANDLES:
        return None
    lane = default_lane()
    if lane is None or lane._outstanding() >= DEFAULT_LANE_DEPTH:
        return None
    try:
        address = lane_of(lane, handle, DEFAULT_LANE_STREAMS)
    except Exception:  # closed at exit meanwhile, or no pinned memory here: the driver's path
        return None
    return (lane, address) if address else None  # 0: past its streams, the driver's path


def default_lane_makes(handle: int) -> bool:
    """Whether ``default_lane_of(handle)`` could start the default lane or make it a
    lane for stream ``handle`` (``_enqueue.check_signal`` then reads the enqueue's
    refusals first: a closed stream's wait must leave no lane, which is never removed,
    nor start the lane's thread).  Unlocked reads: a lane another thread makes
    meanwhile only costs this call the check."""
    if handle <= _DEFAULT_STREAM_HANDLES or _default_off:
        return False
    lane = _default
    return lane is None or (handle not in lane._lanes and len(lane._lanes) < DEFAULT_LANE_STREAMS)


def _close_default_lane() -> None:
    """At exit (the first atexit handler, after the non-daemon threads have ended):
    later waits take the driver's thread.  The pool is not closed natively: that
    would wait for the streams to reach the waits still outstanding (exit would
    hang behind a stream that never gets there); its thread answers them, then
    parks, and ends with the process (leak rather than wait, invariant 6)."""
    global _default_off
    _default_off = True
    lane = _default
    if lane is not None:
        lane._closed = True  # its __del__ at teardown closes nothing either
