"""Host functions in CUDA graphs: captured by anyone, or added to explicit graphs.

A graph node runs at every replay of every executable instance of its graph,
so no launch record can follow one run.  Instead the graph owns a record that
holds the node's owners, from before the node is added and never given back
before the graph is gone (the callable or compiled code, copied user data, the
``by_ref`` buffer, what ``host_copy`` and ``release_after`` keep): a CUDA
*user object* whose destructor completes the record, retained by the graph
with ``cuGraphRetainUserObject``.  The driver destroys it once the graph and
all its instances are gone, after their queued replays have run; the record is
then released on the main thread like any other (LIFETIME.md, invariant 8).

The node calls the kind's replay trampoline with the record:
``nhf_replay_compiled(record)`` (``fn(arg)``, then a GIL the body returned holding
given back: invariant 13) for compiled code, ``nhf_replay_python(record)`` for a
Python callable.  On a capturing stream the
node is added with ``cuLaunchHostFunc`` on that stream, so the capture's
dependencies are the driver's own; to an explicit graph with cuda.core's
``callback`` after the given node.  The simulator provides the same three
steps for its own graphs.

A node on a HostExecutor (``executor=``) is three stream memory operations on
the words of a *graph slot*, replayed as they are: write reached := 1, wait
until done >= 1, write done := 0.  The pool answers a reached slot with
the replay trampoline's call and done := 1, so each replay re-arms the words itself.  The slot
belongs to the node's record, which the graph owns as above: it stays armed
(and the pool keeps polling for replays) until the graph is gone.  On a
capturing stream the operations are captured; for an explicit graph they are
captured into a child graph, embedded after the given node.
"""

from __future__ import annotations

from typing import Any

from ._backend import Backend, Launch
from ._classify import KINDS
from ._errors import SimulatorUnsupportedError
from ._executor import graph_slot_of
from ._hostfunction import CUhostFn

__all__ = ["add_captured_node", "add_graph_node", "explicit_graph"]


def _graph_record(backend: Backend, graph: Any, launch: Launch) -> tuple[int, int, int]:
    """Take the record ``graph`` owns from the start; return ``(node_fn, node_arg, record)``.

    Owned first, in one native call, and never undone: whatever happens after it (a
    node the driver refuses, an exception between two bytecodes), the record is
    released with the graph, never while a node of it may still replay (issue 27:
    undoing after an add that had succeeded freed what the replays used).
    """
    record = backend.graph_record(graph, launch.fn, launch.arg, launch.owner)
    # The native table's replay, never fn(arg) itself: it gives back a GIL the body
    # returned holding (invariant 13).
    return KINDS[launch.kind].replay, record, record


def add_captured_node(
    backend: Backend,
    handle: int,
    launch: Launch,
    builder: Any,
    device: bool = False,
    caller: str = "host_launch",
) -> bool:
    """Add ``launch`` to the graph being captured on stream ``handle``, owned by it
    (on its executor: a graph slot's three operations).  ``builder``: the
    GraphBuilder the launch was given, or None for a stream; a builder that is not
    itself building is refused (``Backend.capture_graph``), whatever else captures
    its stream.

    Returns False, having added nothing, if the stream is not capturing (and
    ``builder`` is None), or if its capture ended (on another thread) after it was
    read: the caller enqueues on the stream then, or a builder's launch is refused.
    Raises RuntimeError, with nothing added and nothing kept, if the capture cannot
    own a node.  A failure after the graph owns the node's record (an ended capture
    too) leaves it there, released with the graph.
    """
    graph = backend.capture_graph(handle, builder, caller)
    if graph is None:
        return False
    if launch.executor is not None:
        return backend.add_slot_nodes(graph, handle, *_slot_record(backend, graph, launch))
    node_fn, node_arg, _ = _graph_record(backend, graph, launch)
    return backend.add_captured_node(graph, handle, node_fn, node_arg, device)


def explicit_graph(backend: Backend, after: Any) -> tuple[type, int]:
    """cuda.core's class whose builder methods to call on ``after``, and its CUgraph."""
    if backend.name != "cuda":
        raise SimulatorUnsupportedError(
            "the simulator does not model explicit graphs (cuda.core GraphDefinition and "
            "GraphNode); capture a simulated stream or GraphBuilder instead, or run on a GPU"
        )
    # The base class's builder methods: HostCallbackNode shadows ``callback``
    # with a property (the Python callable of that node).
    base = next(c for c in type(after).__mro__ if c.__name__ in ("GraphDefinition", "GraphNode"))
    definition = after if base.__name__ == "GraphDefinition" else after.graph
    return base, int(definition.handle)


def add_graph_node(backend: Backend, after: Any, launch: Launch) -> Any:
    """Add ``launch`` to an explicit cuda.core graph after ``after``; return the new node
    (on its executor: a child graph of a graph slot's three operations)."""
    base, graph = explicit_graph(backend, after)
    if launch.executor is not None:
        slot, _ = _slot_record(backend, graph, launch)
        return base.embed(after, backend.slot_graph(slot))
    node_fn, node_arg, _ = _graph_record(backend, graph, launch)
    # A fresh CUhostFn: cuda.core would take a numba CFunc (callable) for a Python
    # callable.  The record owns the code it points to.
    return base.callback(after, CUhostFn(node_fn), user_data=node_arg)


def _slot_record(backend: Backend, graph: Any, launch: Launch) -> tuple[Any, int]:
    """Arm a graph slot of the launch's executor, owned by ``graph``'s record; return
    the slot and that record.  The slot owns what the launch owns (``arm``'s owner):
    when the graph lets the record go, a pool thread's run of the node in progress
    releases those owners after it ends, not before (a device fault ends a replay's
    wait for the node while it may still run; LIFETIME.md, invariant 16)."""
    slot = graph_slot_of(launch.executor)
    _, _, record = _graph_record(backend, graph, launch._replace(owner=slot))
    # The slot runs the launch's fn and arg, never the record's: a fault that ends a
    # replay's wait lets the record go, and a new launch may take it, while a pool
    # thread that claimed the node still waits for the GIL.  With copy, the pool's
    # own (parallel) copy of the MEMCPY_LAYOUT at arg.  RuntimeError if the executor
    # is closing (the record then owns a disarmed slot).
    slot.arm(KINDS[launch.kind].number, launch.fn, launch.arg, launch.copy, launch.owner)
    return slot, record
