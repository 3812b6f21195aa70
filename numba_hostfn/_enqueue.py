"""The one Python path under host_launch, host_copy, release_after and the signals.

``enqueue`` resolves a launch (its kind, user data, target and what it owns) and puts
it on the stream through the native enqueue (``_core.enqueue``), on an executor's
lane, or into the graph being captured or an explicit graph (``_graphs``).
``signal_route`` says where a signal goes, for the native dispatcher (``_notify``).
"""

from __future__ import annotations

from typing import Any

from . import _core
from ._backend import Backend, Launch, StaleLane
from ._classify import KINDS, classify_function, compiled_layout
from ._executor import (
    check_executor,
    copy_context_of,
    default_lane_makes,
    default_lane_of,
    has_lane,
    lane_of,
    renew_lane,
)
from ._graphs import add_captured_node, add_graph_node, explicit_graph
from ._process import get_backend
from ._streams import UNASKED, stream_handle, target_kind
from ._userdata import resolve_user_data

__all__ = [
    "RENEWALS",
    "check_empty",
    "check_signal",
    "check_target",
    "enqueue",
    "raise_refused",
    "refuse_signal",
    "renewed_route",
    "signal_route",
    "signal_stream",
    "user_data_with_callable",
]


def signal_stream(
    target: Any, refusal: str, caller: str = "host_launch", handle: int | None = None
) -> int:
    """The handle of a signal's ``target``, which must be a stream: a graph (a
    GraphBuilder, an explicit graph's node) raises ``RuntimeError(refusal)``.  Called
    by :func:`signal_route`, and first by a caller that must check the target before
    it makes anything (``async_done``'s loop channel).  ``handle``: the stream's,
    where the caller read it already (``check_target``, whose kinds include graphs:
    an explicit graph's handle is 0); the kind is checked whatever it is."""
    # done_future and async_done take streams only: their errors name no graph
    # (host_launch(blocking=False) shares host_launch's, which takes graphs).
    graphs = caller == "host_launch"
    if target_kind(target, caller, graphs) != "stream":  # cached per type: a lookup
        raise RuntimeError(refusal)
    if handle is not None:
        return handle
    return get_backend().stream_handle(target, stream_handle(target, caller, graphs))


def check_signal(
    target: Any,
    executor: Any,
    refusal: str,
    caller: str = "host_launch",
    handle: int | None = None,
    *,
    making: bool = False,
    default_lane: bool = True,
) -> int:
    """The handle of a signal's ``target``, with everything that can refuse the signal
    checked before anything is made for it (LIFETIME.md, invariant 3): the target (a
    stream, not a graph: :func:`signal_stream`), then ``executor`` (its type, closed or
    stopped: ``check_executor``), then, where this call would make something that is
    kept (``making``: the caller's thread or loop channel; a lane of ``executor`` for
    this stream, or the default lane or its lane, given no executor and
    ``default_lane``), what the enqueue itself would refuse, read without enqueuing
    (``Backend.signal_refusal``: a fault, a closed simulated stream, a capture), raised
    as the enqueue's refusal is.  So a refused first signal starts no thread, opens no
    descriptor and leaves no lane (before, they were made first, and kept).  Those
    reads are made only then: a signal whose thread, channel and lane exist pays
    nothing more, and a stream closed between the check and the enqueue (another
    thread's) is refused by the enqueue, as before.  Called by each signal's entry
    point before it makes its batches (``_notify``)."""
    handle = signal_stream(target, refusal, caller, handle)
    if executor is not None:
        check_executor(executor)
        making = making or not has_lane(executor, handle)
    elif default_lane:
        making = making or default_lane_makes(handle)
    if making:
        status = get_backend().signal_refusal(handle)
        if status:
            refuse_signal(status, executor, refusal, handle)
    return handle


def signal_route(
    target: Any,
    executor: Any,
    refusal: str,
    default_lane: bool = True,
    caller: str = "host_launch",
    handle: int | None = None,
) -> tuple[tuple[int, int, Any], tuple[int, int, Any] | None, int]:
    """Where a signal of ``target`` goes: ``(route, fallback, handle)``, each route
    ``(route, target, owner)`` for the native dispatcher's launch
    (``native/notify.c``; ``route`` a ``_core.ROUTE_*``), and ``handle`` the
    stream's, for a renewal (:func:`renewed_route`).

    A signal says "the stream got here" once, so it is only for streams: a graph
    target raises ``RuntimeError(refusal)``, having enqueued nothing (a capturing
    stream is refused by the enqueue: :func:`refuse_signal`).  Given no executor
    (and ``default_lane``: async_done and done_future, not a non-blocking
    callback), the route is the default lane's where it can serve (``_executor.default_lane``)
    and the fallback the driver's thread, taken if the lane's enqueue refuses (a
    capturing stream, a closed or faulted lane): the driver's path then refuses or
    accepts as it would without the lane.  Else the fallback is None.  ``caller``
    names the public function in a wrong target's error.  ``handle``: the stream's
    handle where the caller has read it already (``check_target``, for
    ``host_launch(blocking=False)``'s argument order): ``__cuda_stream__`` is called
    once per call, so a protocol with side effects, or one that names another stream
    when asked again, gets the signal on the stream it named first (before, it was
    asked again here).
    """
    backend = get_backend()
    # The stream (and its handle, unless given) before the executor, as a launch checks.
    handle = signal_stream(target, refusal, caller, handle)
    if executor is not None:
        check_executor(executor)
    if executor is None:
        driver = (backend.route, handle, None)
        found = default_lane_of(handle) if default_lane else None
        if found is None:
            return driver, None, handle
        lane, address = found
        return (backend.executor_route, address, lane), driver, handle
    # An executor's task owns the executor: it is collected only with nothing outstanding.
    return (backend.executor_route, lane_of(executor, handle), executor), None, handle


#: Lanes made in turn for one launch whose lane answers LANE_STALE: a new lane's first
#: enqueue never does (it notes its stream then), so one is enough but where another
#: thread renewed the lane meanwhile; past these, the refusal is raised (StaleLane).
RENEWALS = 3


def renewed_route(handle: int, route: tuple[int, int, Any]) -> tuple[int, int, Any]:
    """``route``, an executor's lane whose enqueue answered ``_core.LANE_STALE``, with a
    new lane of that executor for stream ``handle`` (``_executor.renew_lane``): the
    handle ``signal_route`` read, not ``__cuda_stream__`` asked again."""
    return (route[0], renew_lane(route[2], handle, route[1]), route[2])


def refuse_signal(status: int, executor: Any, refusal: str, stream: int = 0) -> None:
    """Raise for a signal's refused enqueue: ``RuntimeError(refusal)`` if the stream is
    capturing, else what a refused launch raises (``stream``: its handle, where known)."""
    if status == _core.CAPTURING:
        raise RuntimeError(refusal)
    raise_refused(status, executor, stream)


def raise_refused(status: int, executor: Any, stream: int = 0) -> None:
    """Raise for an enqueue function's nonzero status (the native host_launch too);
    ``stream``: the stream's handle, where known (a fault is its context's)."""
    call = "cuLaunchHostFunc" if executor is None else "cuStreamWriteValue32"
    get_backend().raise_refusal(status, call, stream, executor)


def check_target(
    target: Any, caller: str = "host_launch", answer: Any = UNASKED
) -> tuple[str, int]:
    """``(kind, handle)`` of a launch's target (handle 0 for an explicit graph),
    checked first: a wrong stream is reported before a wrong fn or user_data, in an
    error that names ``caller``, the public function called.  ``answer``: what the
    target's ``__cuda_stream__`` gave, where the native host_launch asked it before
    handing the call over (``_streams.stream_handle``: it is not asked again)."""
    kind = target_kind(target, caller)
    if kind == "node":
        return kind, 0
    handle = stream_handle(target, caller, answer=answer)
    return kind, get_backend().stream_handle(target, handle)


def check_empty(target: Any, caller: str, checked: tuple[str, int] | None = None) -> Any:
    """What a call that adds nothing returns (an explicit graph's node itself, else
    None), its target checked as a launch's is: its type, its handle, then the
    backend's refusals that need no enqueue (``Backend.check_open``: a closed
    simulated stream, a GraphBuilder that is not building), so that such a target
    is refused whether or not there was anything to enqueue.  A device fault is not
    looked for: on CUDA only a driver call on the stream reports it, and a call that
    adds nothing makes none (a zero-byte ``host_copy`` on a faulted stream returns).
    ``checked``: what :func:`check_target` gave, where the caller checked the target
    first (:func:`enqueue`'s ``checked``)."""
    kind, handle = check_target(target, caller) if checked is None else checked
    if kind == "node":
        # The simulator's refusal of explicit graphs (SimulatorUnsupportedError), as
        # a call that adds a node meets it; on CUDA, the graph the node would join.
        explicit_graph(get_backend(), target)
        return target
    get_backend().check_open(handle, target if kind == "builder" else None, caller)
    return None


def enqueue(
    target: Any,
    fn: Any,
    user_data: Any,
    also_owns: Any,
    *,
    as_device_work: bool = False,
    executor: Any = None,
    parallel_copy: bool = False,
    caller: str = "host_launch",
    checked: tuple[str, int] | None = None,
) -> Any:
    """host_launch, plus ``also_owns``: more objects the launch owns until it has run.

    ``as_device_work`` (simulator only) enqueues simulated device work instead of a
    host function.  ``parallel_copy`` says that ``fn`` is the compiled copy with
    MEMCPY_LAYOUT user data, which an executor shares out among its threads.
    ``caller`` is the public function a wrong target's error names.  ``checked``:
    what :func:`check_target` gave, where the caller checked the target first
    (host_copy and release_after: the stream, then ``executor=``, then the buffers;
    a call the native host_launch handed over with the stream's answer), so that
    ``__cuda_stream__`` is asked once per call.  A refusal
    keeps nothing: every caller, a public entry point, is decorated with
    ``_errors.keeps_nothing_on_refusal``, which clears this frame too.
    """
    # Checked in argument order, so the first wrong one is the one reported: the
    # target (its type, then its handle), fn, user_data, then the executor.
    kind_of_target, handle = check_target(target, caller) if checked is None else checked
    backend = get_backend()
    kind, address, fn_owned = classify_function(fn)
    launch_kind = KINDS[kind]  # the native table: its trampoline, what it owns
    if launch_kind.owns == "fn":
        if user_data is not None:
            raise user_data_with_callable(fn)
        arg, data_owned = id(fn), None  # the PyObject*, kept alive by fn_owned
    else:
        layout, reads = compiled_layout(fn) if kind == "compiled" else (None, False)
        arg, data_owned = resolve_user_data(user_data, layout, fn, reads)
    if executor is not None:
        check_executor(executor)
    # The one owner rule, the native path's (native/kinds.c): the function alone
    # when it is all the launch owns (no object per launch, so a burst of launches
    # does not feed the cyclic garbage collector), else (fn, data, also[, executor]).
    owned = _core.launch_owner(fn_owned, data_owned, also_owns, executor)
    # Only an executor shares a copy out among its threads: else the copy is fn(arg).
    launch = Launch(kind, address, arg, owned, executor, parallel_copy and executor is not None)
    if kind_of_target == "node":
        return add_graph_node(backend, target, launch)
    builder = target if kind_of_target == "builder" else None  # its own state is checked
    route = backend.device_route if as_device_work else 0
    while True:
        if builder is None:
            if executor is None:
                enqueued = backend.enqueue(handle, launch, route)
            else:
                enqueued = _executor_enqueue(backend, handle, launch)
            if enqueued:
                return None
        if add_captured_node(backend, handle, launch, builder, as_device_work, caller):
            return None
        # The capture ended between the two checks: enqueue on the stream.


def user_data_with_callable(fn: Any) -> ValueError:
    return ValueError(
        "user_data is only supported with compiled host functions and ctypes "
        f"function pointers; {getattr(fn, '__qualname__', type(fn).__name__)!r} is a "
        "Python callable, called with no arguments. Decorate it with "
        "@numba_hostfn.host_callback to run fn(user_data) compiled and without the "
        "GIL, or bind the data: functools.partial(fn, data)"
    )


def _executor_enqueue(backend: Backend, handle: int, launch: Launch) -> bool:
    """Enqueue on the executor's lane for stream ``handle``; False if it is capturing.

    A lane that serves an earlier stream with this handle (destroyed with tasks
    pending) refuses, having enqueued nothing: the stream gets a lane of its own.

    Where the executor has no lane for the stream yet, what the enqueue would refuse
    is read first (``Backend.signal_refusal``, as a signal's ``check_signal`` does):
    a closed or faulted stream is refused, and a capturing one takes a graph node,
    with no lane made for it (a lane is kept until the executor closes; before, the
    refused launch made one first).
    """
    executor = launch.executor
    if not has_lane(executor, handle):
        status = backend.signal_refusal(handle)
        if status == _core.CAPTURING:
            return False
        if status:
            raise_refused(status, executor, handle)
    # The executor's copy trampoline finds its pool in the record's context.
    context = copy_context_of(executor) if launch.copy else ()
    lane = lane_of(executor, handle)
    route, call = backend.executor_route, "cuStreamWriteValue32"
    for _ in range(RENEWALS):
        try:
            return backend.enqueue(lane, launch, route, call, context, handle)
        except StaleLane:
            lane = renew_lane(executor, handle, lane)
    return backend.enqueue(lane, launch, route, call, context, handle)
