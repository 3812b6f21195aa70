"""A simulated CUDA context: streams, their one host-function thread, and graphs.

Each :class:`Stream` owns a native queue and a native thread (pthread) that
runs its work in order, like a stream's device engine; Python never sees that
thread.  Host functions go, as on the driver, to the context's *one*
host-function thread: the host functions of all streams run one at a time,
each stream waits for its own, and a slow one delays the others.  They run
through the very same trampolines and launch records as on a GPU, on a thread
foreign to Python and without the GIL.  Simulated device work (``sleep``,
``launch``) runs on the stream's own thread.

Graphs: ``Stream.begin_capture``/``end_capture`` (CuPy's shape) and
``Stream.create_graph_builder`` (cuda.core's) record the work enqueued while
capturing; a :class:`Graph` replays it in order.  A graph owns its host nodes'
owners through a native *simulated graph* (``_core.SimGraph``), as a CUDA
user object does: released once
the graph (and every instance) is closed and no replay of it is still queued.
docs/simulator.md lists what is and is not modelled.
"""

from __future__ import annotations

import numbers
from typing import Any

from . import _core
from ._backend import in_host_function_error
from ._classify import classify_function
from ._enqueue import enqueue
from ._errors import SimulatorUnsupportedError, keeps_nothing_on_refusal
from ._process import SIMULATOR_ENV, forked, get_backend
from ._simbackend import SimulatorBackend

__all__ = ["Graph", "GraphBuilder", "Stream", "new_context"]

#: The faults Stream.fault() can raise, by CUresult.
_FAULTS = {
    "CUDA_ERROR_LAUNCH_FAILED": 719,
    "CUDA_ERROR_ILLEGAL_ADDRESS": 700,
    "CUDA_ERROR_MISALIGNED_ADDRESS": 716,
    "CUDA_ERROR_ILLEGAL_INSTRUCTION": 715,
    "CUDA_ERROR_HARDWARE_STACK_ERROR": 714,
}


def _simulator() -> SimulatorBackend:
    backend = get_backend()  # in a forked child: RuntimeError, naming spawn
    if not isinstance(backend, SimulatorBackend):
        raise RuntimeError(
            "numba_hostfn.simulator needs the simulator backend; set "
            f"{SIMULATOR_ENV}=1 before the first use of numba_hostfn"
        )
    return backend


class Stream(_core.SimStreamBase):
    """A simulated stream, accepted by :func:`~numba_hostfn.host_launch` like a CUDA stream.

    Work runs in the order it was enqueued.  Host functions run on the
    simulated context's one host-function thread, without the GIL; ``sleep``
    and ``launch`` enqueue stand-ins for device work, which runs on the
    stream's own thread, so that host functions have something before and
    after them.

    Examples
    --------
    >>> import numba_hostfn as nh
    >>> seen = []
    >>> with nh.simulator.Stream() as s:
    ...     s.sleep(0.01)  # device work first
    ...     nh.host_launch(s, lambda: seen.append("ran"))
    ...     s.sync()
    >>> seen
    ['ran']
    """

    # A subclass whose __init__ skips this one's has a closed stream that never
    # opened: each method refuses it as such (_live) rather than failing on a
    # missing attribute.
    _backend: Any = None
    _closed = True

    def __init__(self) -> None:
        backend = _simulator()
        if _core.sim_in_host_function():  # cuStreamCreate, which CUDA forbids there
            raise in_host_function_error("made a simulated stream", "no stream was made")
        # Its native stream (_handle) first: on a stream open already it raises and
        # changes nothing (marked closed first, a second __init__ left the stream
        # running with nothing to stop it).  An exception between here and the
        # marks below (a Ctrl-C) leaves a stream that its native dealloc stops.
        self._open()
        self._backend = backend
        self._closed = False
        backend.streams[self._handle] = self

    @property
    def handle(self) -> int:
        """The stream's handle: the address of its native queue."""
        return self._handle

    def __cuda_stream__(self) -> tuple[int, int]:
        """Return ``(0, handle)``, as CUDA streams do (version 0 of the protocol)."""
        return (0, self._handle)

    def _live(self) -> int:
        _simulator()  # a forked child has none of the stream's threads: refused
        if self._backend is None:
            raise RuntimeError(
                f"this {type(self).__name__} was never opened: a subclass's __init__ must "
                "call super().__init__()"
            )
        if self._closed:
            raise RuntimeError("the simulated stream is closed; create a new Stream")
        return self._handle

    @property
    def is_capturing(self) -> bool:
        """True between :meth:`begin_capture` and :meth:`end_capture`."""
        return self._capture is not None

    def sync(self) -> None:
        """Wait, without holding the GIL, until all work enqueued so far has run.

        Ctrl-C interrupts the wait (``KeyboardInterrupt``; the stream's work still
        runs, and ``sync()`` may be called again), which CUDA's does not:
        docs/simulator.md.  A host function must not call it (``RuntimeError``).
        Raises :class:`~numba_hostfn.DeviceFaultError` if the stream's context has
        a device fault (:meth:`fault`), as ``cuStreamSynchronize`` does.
        """
        handle = self._live()
        if self.is_capturing:
            raise RuntimeError(
                "sync() on a simulated stream that is capturing: nothing it captured runs "
                "until the graph is launched; end the capture first"
            )
        fault = _core.sim_sync(handle)
        if fault:
            raise self._backend.fault_error(fault, "sync() found it", handle)

    def is_done(self) -> bool:
        """True if all work enqueued so far has run (a device fault raises, as in ``sync``).

        Raises ``RuntimeError`` on a stream that is capturing, as ``sync()`` does: CUDA
        forbids querying a capturing stream (before, it answered True while the host
        functions captured since had not run); and in a host function, which CUDA
        forbids any CUDA call (``cuStreamQuery``).
        """
        handle = self._live()
        _refuse_in_host_function("is_done", left="nothing was asked")  # cuStreamQuery
        if self.is_capturing:
            raise RuntimeError(
                "is_done() on a simulated stream that is capturing: nothing it captured "
                "runs until the graph is launched, and CUDA forbids querying a capturing "
                "stream; end the capture first"
            )
        answer = _core.sim_query(handle)
        if answer not in (0, 600):
            raise self._backend.fault_error(answer, "the stream's query found it", handle)
        return answer == 0

    def fault(self, error: str = "CUDA_ERROR_LAUNCH_FAILED") -> None:
        """Enqueue simulated device work that faults, as a kernel that traps does.

        From the moment it runs the stream's simulated context behaves as CUDA's
        after a kernel fault: no work of its streams runs any more (host
        functions included), every stream of it answers the error (``sync()``
        raises :class:`~numba_hostfn.DeviceFaultError` naming ``error``), and
        enqueues are refused with it.  Streams made after :func:`new_context`
        belong to a new, healthy context.  ``error`` is one of
        ``CUDA_ERROR_LAUNCH_FAILED``, ``CUDA_ERROR_ILLEGAL_ADDRESS``,
        ``CUDA_ERROR_MISALIGNED_ADDRESS``, ``CUDA_ERROR_ILLEGAL_INSTRUCTION``,
        ``CUDA_ERROR_HARDWARE_STACK_ERROR``.
        """
        code = _FAULTS.get(error) if isinstance(error, str) else None
        if code is None:
            raise ValueError(f"fault() expected one of {sorted(_FAULTS)}, got {error!r}")
        handle = self._live()
        if self.is_capturing:
            raise SimulatorUnsupportedError(
                "the simulator does not model a fault captured into a graph; end the capture"
            )
        status = _core.sim_enqueue(handle, _core.SIM_FAULT, code, True)
        if status:
            self._backend.raise_refusal(status, stream=handle)

    def sleep(self, seconds: float) -> None:
        """Enqueue simulated device work that occupies the stream for ``seconds``."""
        # Any real number (a numpy scalar, a Fraction), as HostExecutor's times.
        if not isinstance(seconds, numbers.Real) or isinstance(seconds, bool):
            raise TypeError(f"sleep() expected a number of seconds, got {seconds!r}")
        if not 0 <= seconds <= 3600:
            raise ValueError(f"sleep() expected 0 to 3600 seconds, got {seconds!r}")
        micros = int(float(seconds) * 1e6)
        handle = self._live()
        while True:
            status = _core.sim_enqueue(handle, _core.SIM_DELAY, micros, True)
            if status != _core.CAPTURING:
                break
            capture = self._capture
            if capture is not None:
                # False: another thread ended the capture since it was read (end()).
                if _core.sim_graph_add_node(capture, True, _core.SIM_DELAY, micros):
                    return
            # Another thread ended the capture since: the work goes to the stream.
        if status:
            self._backend.raise_refusal(status, stream=handle)

    @keeps_nothing_on_refusal
    def launch(self, fn: Any, *, user_data: Any = None) -> None:
        """Enqueue a compiled host function as simulated device work (a "kernel").

        ``fn`` must be a :class:`~numba_hostfn.HostFunction` or a ``CUhostFn``
        ctypes pointer: device work cannot run Python.  It runs on the
        stream's own thread, with the lifetimes of
        :func:`~numba_hostfn.host_launch` (a graph owns it when captured).
        """
        self._live()
        if not callable(fn):  # classify_function would name host_launch()
            raise TypeError(
                "simulator.Stream.launch() expected a HostFunction or a CUhostFn ctypes "
                f"pointer, got {type(fn).__name__}"
            )
        kind = classify_function(fn)[0]
        if kind == "python":
            raise TypeError(
                "simulated device work must be compiled: pass a HostFunction or a "
                f"CUhostFn ctypes pointer, got {fn!r}; use host_launch() for Python callables"
            )
        enqueue(self, fn, user_data, None, as_device_work=True)

    # ---- graphs ----

    def begin_capture(self) -> None:
        """Start capturing: work enqueued from now on is recorded, not run (CuPy's shape)."""
        self._begin_capture()

    def _begin_capture(self, *called: str) -> Any:
        """Start capturing; the capture this call began (a SimGraph), the stream's.
        ``called``: the call a host function's refusal names (_refuse_in_host_function),
        where it is not begin_capture() on the stream."""
        self._live()
        _refuse_in_host_function(*(called or ("begin_capture",)))
        capture = _core.SimGraph()
        # The check, the record and the native flag in one native step (the stream
        # holds the capture): a begin on another thread in between passed the same
        # check, and both began (the later record replaced the other).
        if not self._capture_begin(capture):
            capture.release()
            raise RuntimeError("the simulated stream is already capturing")
        if self._closed:  # closed by another thread since _live(): the close took none
            taken = self._capture_take(capture)
            if taken is not None:
                taken.release()
            self._live()  # its error
        return capture

    def end_capture(self) -> Graph:
        """Stop capturing; return the captured work as an executable :class:`Graph`."""
        self._live()
        return Graph(self._end_capture())

    def _end_capture(self, *called: str) -> Any:
        """Stop capturing; the capture's reference to its graph, now the caller's.
        ``called``: as ``_begin_capture``'s."""
        _simulator()  # a forked child: the stream's mutex may be held
        _refuse_in_host_function(*(called or ("end_capture",)))
        # One end takes it, ended: a node whose launch read the capture before this
        # takes no place in it now: it goes to the stream, as after cuStreamEndCapture.
        capture = self._capture_take()
        if capture is None:
            raise RuntimeError("end_capture() on a simulated stream that is not capturing")
        return capture

    def create_graph_builder(self) -> GraphBuilder:
        """A :class:`GraphBuilder` that captures on this stream (cuda.core's shape)."""
        self._live()
        return GraphBuilder(self)

    def close(self) -> None:
        """Run what is queued, then stop the stream's thread.

        A capture still open is abandoned: what it owned is released.  The
        queue's few hundred bytes are kept, not freed: any later launch on
        this stream (through a stale handle too) finds it stopped and raises.
        An interrupted close can be called again: it finishes the job.  A close
        on another thread while this one runs waits until the same point.
        """
        if forked() or self._backend is None:  # no threads here, or never opened
            self._closed = True
            return
        if not self._closed:
            # First: a close a host function makes is refused here, before anything
            # changed (the capture below was abandoned by a close that then raised).
            _core.sim_close(self._handle, True)  # idempotent; joins without the GIL
            # Closed before the capture is taken: a begin_capture() on another thread
            # that records its capture after the take below then sees the stream
            # closed and gives its capture back (_begin_capture); one that recorded
            # it before is taken here.  (Marked closed after the take, a begin in
            # between returned a capture of the closed stream that nothing could end.)
            self._closed = True
        # Also for a stream already closed: a close interrupted here finishes the job
        # (and one dropped after such an interrupt gives it back when collected).
        capture = self._capture_take()  # one close takes it
        if capture is not None:
            capture.release()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # What __del__ calls is bound here, once: a stream collected at interpreter
    # exit may be collected after the modules' globals were cleared (None), and the
    # close must still stop its thread (issue 31: "Exception ignored in
    # Stream.__del__ ... 'NoneType' object is not callable" at every exit).
    def __del__(self, _forked: Any = forked, _close: Any = _core.sim_close) -> None:
        # The native dealloc after it gives back a capture this did not (stopped by an
        # exception first), and stops the thread of a stream never marked open.
        if not self.__dict__.get("_closed", True) and not _forked():
            self._closed = True
            capture = self._capture_take()
            if capture is not None:
                capture.release()
            _close(self._handle, False)  # the thread ends on its own

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<numba_hostfn.simulator.Stream handle={self._handle:#x} {state}>"


class Graph:
    """An executable simulated graph: :meth:`launch` replays the captured work in order.

    It owns the captured host nodes' owners with the graph definition: they
    are released once both are closed and no replay is still queued.
    """

    def __init__(self, native: Any) -> None:
        if type(native) is not _core.SimGraph:
            raise TypeError(
                "simulator.Graph is made by Stream.end_capture() or GraphBuilder.complete(), "
                f"not directly; got {type(native).__name__}"
            )
        self._native = native  # a SimGraph: this executable graph's reference

    @property
    def is_closed(self) -> bool:
        """True once :meth:`close` has run."""
        return not self._native.held

    def launch(self, stream: Stream) -> None:
        """Enqueue one replay of the graph's work on ``stream``.

        All of it or nothing: the replay holds the graph's owners until its last
        node has run, and a refused replay enqueues nothing and holds nothing.
        """
        if not isinstance(stream, Stream):
            raise TypeError(f"Graph.launch() expected a simulator.Stream, got {stream!r}")
        handle = stream._live()
        if not self._native.held:
            raise RuntimeError("the simulated graph is closed")
        if stream.is_capturing:
            raise SimulatorUnsupportedError(
                "the simulator does not model launching a graph inside a capture"
            )
        status = _core.sim_replay(handle, self._native)
        if status:
            stream._backend.raise_refusal(status, stream=handle)

    def close(self) -> None:
        """Destroy the executable graph (its queued replays still run)."""
        _simulator()  # a forked child: refused, as every entry point is
        if self._native.held:  # cuGraphExecDestroy: refused to a host function
            _refuse_in_host_function("close", "a simulated Graph", "the graph is as it was")
        self._native.release()


SimulatorBackend.register_stream_type(Stream)


def new_context() -> None:
    """Streams made from now on belong to a new, healthy simulated context.

    A device fault (:meth:`Stream.fault`) is sticky for its context, as on a
    GPU, where a process must make a new context (or end) to run work again;
    streams made before keep the faulted context.

    Raises ``RuntimeError`` in a host function, as a new context (``cuCtxCreate``,
    ``cuCtxSetCurrent``) is a CUDA call, which CUDA forbids there.
    """
    _simulator()
    if _core.sim_in_host_function():
        raise in_host_function_error("called simulator.new_context()", "the context is as it was")
    _core.sim_new_context()


def _refuse_in_host_function(
    call: str, on: str = "a simulated stream", left: str = "the stream's capture is as it was"
) -> None:
    """RuntimeError where a host function calls ``call`` on ``on``: a stream capture's
    begin or end is a CUDA call (cuStreamBeginCapture, cuStreamEndCapture), as a
    graph's instantiation and destruction are (cuGraphInstantiate, cuGraphDestroy,
    cuGraphExecDestroy), which CUDA forbids a host function, as the simulator's sync
    and enqueues refuse it.  ``left``: what became of the object."""
    if _core.sim_in_host_function():
        raise in_host_function_error(f"called {call}() on {on}", left)


#: What a host function's refused begin_building() or end_building() names: the
#: builder, as it was (not the stream's begin_capture() or end_capture()).
_BUILDER_AS_IT_WAS = ("a simulated GraphBuilder", "the builder is as it was")

# cuda.core's GraphBuilder.begin_building modes (CUstreamCaptureMode's three).
_BUILD_MODES = ("global", "thread_local", "relaxed")


class GraphBuilder:
    """Builds a simulated graph by capturing a stream, with cuda.core's ``GraphBuilder`` surface.

    ``begin_building()``, then enqueue work on the builder (``host_launch``,
    ``host_copy``, ...), then ``end_building()`` and ``complete()`` for a
    :class:`Graph`.  ``close()`` destroys the definition.  Closed or collected while
    building, it ends its own capture (as cuda.core's does), and what that capture
    owned is released.
    """

    def __init__(self, stream: Stream) -> None:
        if not isinstance(stream, Stream):
            raise TypeError(
                "simulator.GraphBuilder expected a simulator.Stream (or use "
                f"stream.create_graph_builder()), got {type(stream).__name__}"
            )
        self._stream = stream
        self._definition: Any = None  # a SimGraph, once built
        self._capture: Any = None  # the capture it began (a SimGraph), while building
        self._closed = False

    @property
    def stream(self) -> Stream:
        """The stream the builder captures."""
        return self._stream

    @property
    def is_closed(self) -> bool:
        """True once :meth:`close` has run (cuda.core's ``GraphBuilder.is_closed``)."""
        return self._closed

    @property
    def is_building(self) -> bool:
        """True between :meth:`begin_building` and :meth:`end_building`."""
        stream = self._stream  # its own capture: not one begun on the stream otherwise
        return (
            self._capture is not None
            and stream._capture is self._capture
            and self._definition is None
            and not self._closed
        )

    def __cuda_stream__(self) -> tuple[int, int]:
        """The builder's stream's ``(0, handle)``: work enqueued on the builder is captured."""
        return self._stream.__cuda_stream__()

    def begin_building(self, mode: str = "relaxed") -> GraphBuilder:
        """Start capturing on the builder's stream.

        ``mode`` is one of cuda.core's ("global", "thread_local", "relaxed"), checked
        as cuda.core checks it (a str, else TypeError; None or another str,
        ValueError), and not modelled.
        """
        if mode is not None and not isinstance(mode, str):
            raise TypeError(
                f"Argument 'mode' has incorrect type (expected str, got {type(mode).__name__})"
            )
        if mode not in _BUILD_MODES:
            raise ValueError(
                f"Unsupported build mode: {mode!r}; begin_building() takes one of "
                f"{', '.join(map(repr, _BUILD_MODES))}, as cuda.core's GraphBuilder does"
            )
        if self._closed or self._definition is not None:
            raise RuntimeError("this GraphBuilder has already built its graph or is closed")
        # Its own capture, read in the same step; a host function's refusal names this call.
        self._capture = self._stream._begin_capture("begin_building", *_BUILDER_AS_IT_WAS)
        return self

    def end_building(self) -> GraphBuilder:
        """Stop capturing: what was enqueued since :meth:`begin_building` is the graph."""
        _simulator()  # a forked child: the stream's mutex may be held
        if not self.is_building:
            raise RuntimeError("end_building() on a GraphBuilder that is not building")
        self._definition = self._stream._end_capture("end_building", *_BUILDER_AS_IT_WAS)
        self._capture = None
        return self

    def complete(self) -> Graph:
        """An executable :class:`Graph` of what was built (one more owner of the nodes)."""
        _simulator()  # a forked child: refused, as every entry point is
        if self._closed:
            raise RuntimeError("complete() on a closed GraphBuilder; build the graph again")
        if self._definition is None or not self._definition.held:
            raise RuntimeError("complete() needs a GraphBuilder that has ended building")
        _refuse_in_host_function("complete", "a simulated GraphBuilder", "no graph was made")
        return Graph(self._definition.share())

    def close(self) -> None:
        """Destroy the graph definition (executable graphs keep what they need)."""
        _simulator()  # a forked child: the stream's mutex may be held
        if self._closed:
            return
        _refuse_in_host_function("close", "a simulated GraphBuilder", "the builder is as it was")
        if self._definition is not None:
            self._definition.release()
        elif self.is_building:  # its own capture only, never another's on the stream
            self._stream._end_capture().release()
        self._capture = None
        self._closed = True

    # Collected while building, it ends its capture, as cuda.core's builder does in its
    # __dealloc__: before, the stream stayed capturing for its life, keeping the partial
    # graph's owners, and each later launch on it became a node nothing could replay.
    # Not refused on the host-function thread (a finalizer the collector runs there):
    # nothing is enqueued, and nothing can be raised.  Its own capture only, never one
    # begun since, taken and the stream's flag cleared in one native step (an
    # exception between the two left the stream refusing every enqueue with no capture
    # to take them: a launch there spun for ever).  One stopped before the take leaves
    # the capture to the stream's close, or its collection.
    def __del__(self, _forked: Any = forked) -> None:
        capture = self.__dict__.get("_capture")
        if capture is None or _forked():  # a forked child: the stream's mutex may be held
            return
        taken = self._stream._capture_take(capture)
        if taken is not None:
            taken.release()
