"""What a backend is: what host_launch needs to enqueue on streams and graphs.

Two backends implement it, chosen once per process (``_process``): the CUDA driver
(``_cuda``) and the stream simulator (``_simbackend``, beside the simulator itself).
Both enqueue the same native trampolines (``_core``, the C extension), share one set
of launch records, and let a graph own its nodes' records the same way, so a launch
means the same thing on both.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, NamedTuple, NoReturn

from . import _core
from ._errors import FAULT_NAMES, CudaDriverError, DeviceFaultError
from ._records import LaunchRecords

__all__ = [
    "Backend",
    "Launch",
    "StaleLane",
    "env_switch",
    "executor_refused_error",
    "in_host_function_error",
    "not_building_error",
]

_CURESULT_MASK = 0xFFFFFFFF  # nhf.h's NHF_CURESULT_MASK: a driver call's CUresult
_CUDA_ERROR_INVALID_VALUE = 1  # an executor's write to words its stream's context lacks
#: How a task that an executor's wait left behind goes on (status KEPT).
_KEPT = "the task runs when the stream reaches it, but the stream does not wait for it"


_SWITCH_ON = ("1", "true", "yes", "on")
_SWITCH_OFF = ("0", "false", "no", "off")


def env_switch(name: str, default: bool, on_means: str) -> bool:
    """The environment variable ``name`` as a switch: on, off, or ``default`` when it
    is unset or empty.  A value that is neither raises ``ValueError`` saying what to
    set (``on_means``: what 1 does).  Before, any value but a few words for no meant
    on: ``off`` too."""
    value = os.environ.get(name, "")
    word = value.strip().lower()
    if word in _SWITCH_ON:
        return True
    if word in _SWITCH_OFF:
        return False
    if not word:
        return default
    raise ValueError(
        f"{name}={value!r} is neither on nor off: set it to 1 to {on_means}, or to 0 "
        f"not to (unset, it is {int(default)})"
    )


#: Each launch kind's trampoline on a stream, from the native table (``_classify.KINDS``
#: is the whole row; this module sits below ``_classify``).
_RUN = {row[1]: row[2] for row in _core.launch_kinds()}


class StaleLane(RuntimeError):
    """An executor's lane refused (status ``LANE_STALE``), having enqueued nothing: it
    serves an earlier stream that had the stream's handle, destroyed with tasks still
    to be reached.  The package's enqueue answers it with a lane of the stream's own
    (``_executor.renew_lane``); it reaches a program only if that keeps failing."""


class Launch(NamedTuple):
    """One launch, decided once (``_enqueue.enqueue``, where ``_classify``'s answer
    meets the user data) and passed whole to the enqueue and the graph paths.

    ``kind`` is ``_classify``'s: "compiled", "pointer" or "python".  The trampoline
    calls ``fn(arg)`` (for a Python callable, the callable at ``arg``); the launch's
    record owns ``owner`` until it has run (in a graph, until the graph is gone).
    ``executor`` runs it on a HostExecutor's lane; ``copy`` (only with an executor)
    says that ``fn`` is the compiled copy with MEMCPY_LAYOUT user data, which the
    executor shares out among its threads.

    A value, immutable: a NamedTuple rather than a frozen dataclass, whose
    construction (object.__setattr__ per field) cost about 1 us more per launch on
    the Python path (timeit on the simulator; a NamedTuple's, about 0.2 us).
    """

    kind: str
    fn: int
    arg: int
    owner: Any
    executor: Any = None
    copy: bool = False

    @property
    def trampoline(self) -> int:
        """The number of the native trampoline that runs it on a stream
        (``_core.RUN_COMPILED``, ...: the core picks the function it names)."""
        if self.copy:
            return _core.EXEC_COPY  # finds the executor's pool in the record's context
        return _RUN[self.kind]  # the native table of launch kinds (native/kinds.c)


class Backend:
    """What host_launch needs from a backend: its routes to a stream, stream checks,
    and a way to make the graph being captured own a record.
    """

    name = ""
    #: The native core's route to a stream of this backend (``_core.ROUTE_*``: the
    #: core picks the enqueue function it names).
    route = 0
    #: The same for simulated device work (the simulator's own; else ``route``).
    device_route = 0
    #: The backend's own stream type, whose launches the native host_launch takes.
    stream_type: Any = None

    def __init__(self) -> None:
        self.records = LaunchRecords()

    def stream_handle(self, stream: Any, handle: int) -> int:
        """Vet ``stream`` (whose ``__cuda_stream__`` gave ``handle``); return the handle."""
        return handle

    #: Whether the enqueue functions are driver calls, named in a refusal's message
    #: (``cuLaunchHostFunc refused``); the simulator's are not.
    names_driver_calls = True
    #: The driver call of an executor's wait, refused after its write (status KEPT).
    executor_wait_call = "cuStreamWaitValue32"

    def raise_refusal(
        self, status: int, call: str = "cuLaunchHostFunc", stream: int = 0, executor: Any = None
    ) -> NoReturn:
        """Raise the error for an enqueue function's nonzero status (``refusal_error``)."""
        raise self.refusal_error(status, call, stream, executor)

    def refusal_error(
        self, status: int, call: str = "cuLaunchHostFunc", stream: int = 0, executor: Any = None
    ) -> Exception:
        """The error of an enqueue function's nonzero status word: the one reading of
        nhf.h's status words, for both backends.

        ``call`` is the driver call that enqueued (``cuLaunchHostFunc``, an executor's
        ``cuStreamWriteValue32``).  The word is a CUresult in the low 32 bits and the
        flags; the combinations each enqueue function of native/ returns, and what each
        raises: tests/test_refusals.py.  A backend supplies only what differs: the
        names of its codes (``error_text``), its driver's error (``driver_error``) and
        whether its calls are named (``names_driver_calls``).  ``executor``: the
        HostExecutor whose lane refused, where known, so that its refusal says whether
        it is closed or stopped (``executor_refused_error``).
        """
        code = status & _CURESULT_MASK
        if status & _core.IN_HOST_FUNCTION:  # the simulator's: before anything else
            return in_host_function_error()
        if status & _core.KEPT:
            return self._kept_error(status, code, stream)
        if status & _core.FAULTED or code in FAULT_NAMES:
            if self.names_driver_calls:
                return self.fault_error(code, f"nothing was enqueued ({call} refused)", stream)
            return self.fault_error(code, "nothing was enqueued", stream)
        if status & _core.EXECUTOR_CLOSED:
            return executor_refused_error(executor)
        if status & _core.LANE_STALE:
            return StaleLane(
                "the HostExecutor's lane for this stream's handle still serves an earlier "
                "stream that had the same handle, destroyed with tasks pending; nothing "
                "was enqueued"
            )
        if status & _core.QUEUE_STOPPED:
            return RuntimeError("the simulated stream is closed; create a new Stream")
        if status & _core.OUT_OF_MEMORY:
            return MemoryError(
                "numba_hostfn could not allocate what the enqueue needs (a queue entry, an "
                "executor task or a signal); nothing was enqueued"
            )
        if status & _core.CAPTURING:  # a simulated stream began capturing meanwhile
            return RuntimeError(
                "the stream began capturing during the enqueue; nothing was enqueued. "
                "Enqueue before the capture begins, or on the capture itself"
            )
        if status & _core.CAPTURE_CHECK_FAILED:
            call = "cuStreamIsCapturing"
        elif call == "cuStreamWriteValue32" and code == _CUDA_ERROR_INVALID_VALUE:
            return self.driver_error(
                f"{call} failed: {self.error_text(code)}; nothing was enqueued. A "
                "HostExecutor's words are pinned memory of the context current when it "
                "took them: after that context is destroyed or reset (cuCtxDestroy, "
                "cuDevicePrimaryCtxReset, numba's cuda.close()), make a new HostExecutor",
                code,
            )
        return self.driver_error(f"{call} failed: {self.error_text(code)}", code)

    def _kept_error(self, status: int, code: int, stream: int = 0) -> Exception:
        """The error of an executor's wait refused after its write (status KEPT): the
        task was enqueued and will run, but the stream does not wait for it."""
        if status & _core.FAULTED or code in FAULT_NAMES:
            return self.fault_error(
                code,
                "the HostExecutor task was enqueued, but not the stream's wait for it",
                stream,
            )
        for flag, what in (
            (_core.QUEUE_STOPPED, "the simulated stream closed"),
            (_core.CAPTURING, "the simulated stream began capturing"),
        ):
            if status & flag:
                return RuntimeError(f"{what} while a HostExecutor task was enqueued: {_KEPT}")
        if status & _core.OUT_OF_MEMORY:
            return MemoryError(
                "numba_hostfn could not allocate the stream's wait for a HostExecutor task, "
                f"which was enqueued: {_KEPT}"
            )
        return self.driver_error(
            f"{self.executor_wait_call} failed: {self.error_text(code)}; the task was "
            "enqueued and runs when the stream reaches it, but the stream does not wait for it",
            code,
        )

    def driver_error(self, message: str, code: int) -> Exception:
        """The error of a failed driver call with CUresult ``code``."""
        return CudaDriverError(message, code)

    def error_name(self, code: int) -> str:
        """The name of a ``CUresult``."""
        return FAULT_NAMES.get(code, f"CUresult {code}")

    def error_text(self, code: int) -> str:
        """A ``CUresult`` for a message: its name and number where known."""
        return f"CUresult {code}"

    def fault_error(self, code: int, outcome: str, stream: int = 0) -> DeviceFaultError:
        """The error of a device fault ``code``, saying what became of the call (``outcome``).

        ``stream`` is the handle of the stream the call was about, if known: the
        context's fault is looked up by it, else by the code (the latest fault).
        """
        # The fault of the stream's own context; else the latest of this code.
        found = _core.stream_fault_found(stream) if stream else 0
        if not found:
            found = next((on for _, c, on in reversed(_core.fault_info()) if c == code), 0)
        name = self.error_name(code)
        where = f"found on stream {found:#x}" if found else "reported by the driver"
        return DeviceFaultError(
            f"{name} ({code}): a device fault (a kernel trapped or touched an illegal "
            f"address) in this stream's CUDA context, {where}; {outcome}. CUDA runs nothing "
            "more of that context: end the process (a job scheduler can restart it)",
            code,
            name,
            found,
        )

    def enqueue(
        self,
        target: int,
        launch: Launch,
        route: int = 0,
        call: str = "cuLaunchHostFunc",
        context: tuple = (),
        stream: int = 0,
    ) -> bool:
        """Enqueue ``launch`` on ``target`` (a stream's handle, an executor's lane).

        Returns False, having enqueued nothing, if the stream is capturing.
        ``route`` replaces the backend's own (simulated device work, an
        executor's lane); ``call`` names the driver call in errors; ``context`` is
        the record's context (an executor's copy: its pool); ``stream``: the
        stream's handle where ``target`` is a lane (a fault's error names the
        fault of that stream's context).
        """
        status = _core.enqueue(
            route or self.route,
            target,
            launch.trampoline,
            launch.fn,
            launch.arg,
            launch.owner,
            *context,
        )
        if status == _core.CAPTURING:
            return False
        if status:  # target is the stream unless the route is an executor's lane
            if route != self.executor_route:
                stream = target
            raise self.refusal_error(status, call, stream, launch.executor)
        return True

    # ---- graphs: the capture path and explicit graphs (``_graphs``) ----

    def capture_graph(self, handle: int, builder: Any = None, caller: str = "host_launch") -> Any:
        """The graph being captured on stream ``handle``, or None if it is not capturing.

        ``builder``: the GraphBuilder the call was given (None for a stream).  Raises
        RuntimeError if the capture cannot own a node (invalidated), or if ``builder``
        is not itself building (:func:`not_building_error`): not begun, ended or
        closed, whether or not another capture holds its stream (another builder on
        the same stream, or a ``begin_capture()``), whose graph would otherwise get
        the node.  The error names ``caller``, the public function called.
        """
        raise NotImplementedError  # pragma: no cover

    def check_open(self, handle: int, builder: Any = None, caller: str = "host_launch") -> None:
        """Refuse a call that has nothing to enqueue on ``handle`` (a zero-byte
        ``host_copy``, ``release_after`` with no objects) where an enqueue would be
        refused for its target, enqueuing nothing.

        A GraphBuilder that is not building: ``capture_graph``, the capture path's
        own check, on both backends.  A stream: nothing on CUDA, where what refuses
        an enqueue is ``cuLaunchHostFunc`` itself, which such a call does not make;
        the simulator refuses a closed stream (``SimulatorBackend``).
        """
        if builder is not None:
            self.capture_graph(handle, builder, caller)

    def signal_refusal(self, handle: int) -> int:
        """The status word a signal's enqueue on stream ``handle`` would be refused
        with, read without enqueuing, or 0 (``_enqueue.check_signal``: a first signal
        checks it before it makes the thread, descriptor or lane that serves it).  The
        enqueue's own checks, in its order, where they can be read: a fault noted on
        the stream's context, a closed simulated stream, a capture.  A refusal it
        cannot read (a stream destroyed on CUDA) is still the enqueue's to raise.  Each
        backend asks the native reading its enqueue makes (``_core.cuda_refusal``,
        ``_core.sim_refusal``)."""
        raise NotImplementedError  # pragma: no cover

    def graph_record(self, graph: Any, fn: int, arg: int, owner: Any) -> int:
        """A record for ``fn(arg)`` owning ``owner``, owned by ``graph`` from the start.

        One native call: the record is completed once the graph and every instance
        and replay of it are gone, and never before, whatever follows (a node that
        cannot be added leaves it with the graph, released with it).
        """
        raise NotImplementedError  # pragma: no cover

    def add_captured_node(
        self, graph: Any, handle: int, fn: int, arg: int, device: bool = False
    ) -> bool:
        """Add the host node ``fn(arg)`` (``arg``: the record ``graph`` owns) to the
        capture on stream ``handle``; False, adding nothing, if that capture
        (``graph``) has ended since it was read, which another thread may do at any
        time.  On CUDA the capture is read again around the launch: a
        cuLaunchHostFunc after the end would enqueue on the stream, with the graph's
        record, which the graph's destruction may release first (LIFETIME.md,
        invariant 8)."""
        raise NotImplementedError  # pragma: no cover

    # ---- the HostExecutor (``_executor``) ----

    #: The native core's route to an executor's lane on a stream of this backend.
    executor_route = 0

    def check_executor(self) -> None:
        """Raise RuntimeError if a HostExecutor cannot work here."""

    def in_host_function(self) -> bool:
        """Whether this thread runs a host function whose CUDA calls the backend
        refuses (:func:`in_host_function_error`): the simulator's host-function
        thread.  False on CUDA, whose driver answers such a call itself."""
        return False

    def executor_memory(self, nbytes: int) -> int:
        """``nbytes`` zeroed bytes that the streams can write and wait on."""
        raise NotImplementedError  # pragma: no cover

    def relaxed_capture_mode(self) -> contextlib.AbstractContextManager:
        """Around a call that a capture in global mode on any thread would refuse
        (and be invalidated by): this thread in relaxed capture mode (the default
        lane's first pinned words).  Nothing to do on the simulator."""
        return contextlib.nullcontext()

    def add_slot_nodes(self, graph: Any, handle: int, slot: Any, record: int) -> bool:
        """Capture a graph slot's three operations on stream ``handle`` (``_graphs``;
        ``record``: the one ``graph`` owns, which owns the slot); False, adding none,
        as ``add_captured_node``."""
        raise NotImplementedError  # pragma: no cover


_ENQUEUED = (
    "enqueued work on a simulated stream (host_launch, host_copy, release_after, a "
    "signal or a graph launch)",
    "nothing was enqueued",
)


def executor_refused_error(executor: Any = None) -> RuntimeError:
    """The error of a launch that a HostExecutor refuses (an enqueue's status
    ``EXECUTOR_CLOSED``, or ``_executor.check_executor`` before any enqueue): the state
    it is in, and what to do.

    Closed: its close() has returned.  Stopped: a close() began and has not returned
    (one interrupted by a Ctrl-C or a signal handler's exception, one refused from a
    host function after a launch raced it, or one still waiting on another thread);
    its threads run the tasks still outstanding, and close() called again waits for
    them (LIFETIME.md, invariant 10).  ``executor`` None (a status read where the
    executor is not known): the text that covers both.  Before, a stopped executor's
    refusal said it was closed.
    """
    if executor is None:
        return RuntimeError(
            "the HostExecutor is closed, or stopped by a close() that has not returned; "
            "it takes no new work: create a new one (a stopped one's close(), called "
            "again, waits for its outstanding tasks)"
        )
    if getattr(executor, "_closed", False):
        return RuntimeError("the HostExecutor is closed; create a new one")
    outstanding = executor._outstanding()
    tasks = f"{outstanding} task{'' if outstanding == 1 else 's'}"
    return RuntimeError(
        f"the HostExecutor is stopped, with {tasks} outstanding: a close() began and has "
        "not returned (it was interrupted, or refused from a host function, or it is "
        "still waiting on another thread), so it takes no new work while its threads run "
        "those tasks. Call close() again to wait for them and end its threads, and "
        "create a new HostExecutor for new work"
    )


def not_building_error(caller: str = "host_launch") -> RuntimeError:
    """The error of a launch on a GraphBuilder that is not building (both backends'
    ``capture_graph``); ``caller`` is the public function called.  It covers a builder
    not begun, one that ended building and a closed one: before, it told each to call
    ``begin_building()`` first, which an ended or closed builder refuses."""
    return RuntimeError(
        f"{caller}() was given a GraphBuilder that is not building; nothing was enqueued. "
        "Enqueue on a builder between builder.begin_building() and end_building(): one "
        "that has ended building or is closed takes no more work (build another)"
    )


def in_host_function_error(did: str = _ENQUEUED[0], left: str = _ENQUEUED[1]) -> RuntimeError:
    """The error of a CUDA call a host function made on the simulator: by default
    work it enqueued (the simulator's ``IN_HOST_FUNCTION``); ``did`` says what it did
    instead, ``left`` what became of it."""
    return RuntimeError(
        f"a host function {did}: CUDA forbids a host function any CUDA call (the driver "
        f"may refuse it or deadlock), so the simulator refuses it, and {left}. Call it "
        "from the program's own threads; to launch when a stream gets somewhere, use "
        "host_launch(stream, fn, blocking=False): fn then runs on a Python thread, where "
        "it may launch (docs/threading.md)"
    )
