"""Host functions in CUDA graphs: captured by anyone, or added to explicit graphs.

A graph node runs at every replay of every executable instance of its graph,
so no launch record can follow one run.  Instead the graph owns a record that
holds the node's owners (the callable or compiled code, copied user data, the
``by_ref`` buffer, what ``host_copy`` and ``release_after`` keep): a CUDA
*user object* whose destructor completes the record, retained by the graph
with ``cuGraphRetainUserObject``.  The driver destroys it once the graph and
all its instances are gone, after their queued replays have run; the record is
then released on the main thread like any other (LIFETIME.md, invariant 8).

The node itself is ``fn(arg)`` for compiled code (the record only owns), and
``nhf_replay_python(record)`` for a Python callable.  On a capturing stream the
node is added with ``cuLaunchHostFunc`` on that stream, so the capture's
dependencies are the driver's own; to an explicit graph with cuda.core's
``callback`` after the given node.  The simulator provides the same three
steps for its own graphs.
"""

from __future__ import annotations

from typing import Any

from ._decorator import CUhostFn
from ._errors import SimulatorUnsupportedError

__all__ = ["add_captured_node", "add_graph_node"]


def _graph_record(backend: Any, kind: str, fn: int, arg: int, owner: Any) -> tuple[int, int, int]:
    """Take the record a graph will own; return ``(node_fn, node_arg, record)``."""
    record = backend.records.take(fn, arg, owner)
    if kind == "python":
        return backend.native.replay_python, record, record
    return fn, arg, record


def add_captured_node(
    backend: Any,
    handle: int,
    kind: str,
    fn: int,
    arg: int,
    owner: Any,
    builder: bool,
    device: bool = False,
) -> bool:
    """Add ``fn(arg)`` to the graph being captured on stream ``handle``, owned by it.

    Returns False, having done nothing, if the stream is not capturing (and
    ``builder`` is false).  Raises RuntimeError, with nothing added and
    nothing kept, if the capture cannot own a node.
    """
    graph = backend.capture_graph(handle, builder)
    if graph is None:
        return False
    node_fn, node_arg, record = _graph_record(backend, kind, fn, arg, owner)
    token = backend.own_by_graph(graph, record)
    try:
        backend.add_captured_node(graph, handle, node_fn, node_arg, device)
    except BaseException:
        backend.disown(graph, token)
        raise
    return True


def add_graph_node(backend: Any, after: Any, kind: str, fn: int, arg: int, owner: Any) -> Any:
    """Add ``fn(arg)`` to an explicit cuda.core graph after ``after``; return the new node."""
    if backend.name != "cuda":
        raise SimulatorUnsupportedError(
            "the simulator does not model explicit graphs (cuda.core GraphDefinition and "
            "GraphNode); capture a simulated stream or GraphBuilder instead, or run on a GPU"
        )
    # cuda.core's own builder method, from the base class: HostCallbackNode
    # shadows ``callback`` with a property (the Python callable of that node).
    base = next(c for c in type(after).__mro__ if c.__name__ in ("GraphDefinition", "GraphNode"))
    definition = after if base.__name__ == "GraphDefinition" else after.graph
    graph = int(definition.handle)
    node_fn, node_arg, record = _graph_record(backend, kind, fn, arg, owner)
    token = backend.own_by_graph(graph, record)
    try:
        # A fresh CUhostFn: cuda.core would take a numba CFunc (callable) for a
        # Python callable.  The record owns the code it points to.
        return base.callback(after, CUhostFn(node_fn), user_data=node_arg)
    except BaseException:
        backend.disown(graph, token)
        raise
