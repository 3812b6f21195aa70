"""What a launch target is: a stream (and its handle), a GraphBuilder, or an explicit graph.

A stream is any object with the ``__cuda_stream__`` protocol, version 0: ``(0, handle)``
(cuda.core, CuPy, PyTorch, numba-cuda, the simulator).  A cuda.core ``GraphBuilder``
(or the simulator's) captures; a cuda.core ``GraphDefinition`` or ``GraphNode`` is an
explicit graph (``_graphs``).
"""

from __future__ import annotations

import ctypes
import weakref
from typing import Any

from ._classify import KindsByType

__all__ = ["UNASKED", "stream_handle", "target_kind"]

#: ``stream_handle``'s ``answer`` when nothing has asked the stream yet.
UNASKED: Any = object()

# id(type) -> "stream" | "builder" | "node", filled on first sight
_TARGET_KINDS = KindsByType()
#: A weakref.proxy's attributes are its referent's: what it is, is the referent's
#: class's, never remembered for the proxy's type.
_PROXY_TYPES = frozenset(weakref.ProxyTypes)


def _classes(target: Any) -> tuple[type, ...]:
    """The classes ``target`` is an instance of, its own first: a weakref.proxy's are
    its referent's (ReferenceError once that is gone)."""
    of = type(target)
    return (target.__class__ if of in _PROXY_TYPES else of).__mro__


def _is_graph_node(target: Any) -> bool:
    """A cuda.core explicit graph: a GraphDefinition, or any GraphNode (subclasses too)."""
    return any(
        cls.__name__ in ("GraphDefinition", "GraphNode")
        and (cls.__module__ or "").startswith("cuda.core")
        for cls in _classes(target)
    )


def _is_graph_builder(target: Any) -> bool:
    """A cuda.core ``GraphBuilder`` or the simulator's (subclasses too, and a
    weakref.proxy of one: its capture is read through the protocol only)."""
    return any(
        cls.__name__ == "GraphBuilder"
        and (
            (cls.__module__ or "").startswith("cuda.core")
            or cls.__module__ == "numba_hostfn._simulator"
        )
        for cls in _classes(target)
    )


def _has_protocol(target: Any) -> bool:
    """Whether ``target`` has ``__cuda_stream__``, read without running it: a
    property's getter would be the protocol asked once more in the call
    (``stream_handle`` asks it).  Looked up in its classes' and its own ``__dict__``
    (not with ``inspect.getattr_static``, whose cache in Python 3.12 keeps every
    class it is given alive); an attribute only ``__getattr__`` gives is read."""
    if any("__cuda_stream__" in vars(cls) for cls in type(target).__mro__):
        return True
    try:
        own = object.__getattribute__(target, "__dict__")
    except AttributeError:
        own = None
    if isinstance(own, dict) and "__cuda_stream__" in own:
        return True
    return hasattr(target, "__cuda_stream__")


def target_kind(target: Any, caller: str = "host_launch", graphs: bool = True) -> str:
    """ "stream", "builder" (a GraphBuilder) or "node" (an explicit graph), cached per type.

    ``caller`` is the public function the errors name (the one the program called);
    ``graphs`` false: it takes streams only (a wait), so its errors name no graph."""
    kind = _TARGET_KINDS.get(type(target))
    if kind is not None:
        return kind
    if target is None:
        also = " or GraphBuilder," if graphs else ""
        raise TypeError(
            f"{caller}() needs a stream, got None; pass a cuda.core Stream{also} or a "
            "stream object with __cuda_stream__ (CuPy, PyTorch, numba-cuda)"
        )
    if isinstance(target, int) and not _has_protocol(target):
        raise TypeError(
            f"{caller}() got a bare int ({target!r}) as stream; wrap a raw CUstream "
            "handle with cuda.core.Stream.from_handle(handle) (and keep the stream alive)"
        )
    if isinstance(target, type):
        # A class where a stream was meant (``Stream`` for ``Stream()``): its
        # ``__cuda_stream__`` is an unbound function, and a verdict remembered for its
        # type (``type``) would describe every class.
        raise TypeError(
            f"{caller}() got the class {target.__qualname__} as stream; pass a stream "
            "object (an instance with the __cuda_stream__ protocol), not a class"
        )
    if _is_graph_builder(target):
        kind = "builder"
    elif _is_graph_node(target):
        kind = "node"
    elif _has_protocol(target):
        kind = "stream"
    else:
        expected = (
            "a cuda.core Stream, GraphBuilder, GraphDefinition or GraphNode,"
            if graphs
            else "a cuda.core Stream"
        )
        raise TypeError(
            f"{caller}() expected {expected} or an object with the __cuda_stream__ "
            f"protocol, got {type(target).__name__}{_raw_handle_hint(target)}"
        )
    # The verdict of its class, remembered for every object of it: not where the
    # protocol is this object's own (an attribute set on it, a __getattr__'s), which
    # another object of the class lacks.
    if type(target) not in _PROXY_TYPES and (
        kind != "stream" or hasattr(type(target), "__cuda_stream__")
    ):
        _TARGET_KINDS.remember(type(target), kind)
    return kind


#: Where a stream object of a library without the protocol (older torch, CuPy and
#: numba-cuda streams) keeps its raw CUstream handle.
_RAW_HANDLES = ("cuda_stream", "ptr", "handle")


def _raw_handle_hint(target: Any) -> str:
    """How to pass ``target`` if it holds a raw stream handle: Stream.from_handle of
    it (an int, a ctypes c_void_p's value, or anything int() reads); else ""."""
    for name in _RAW_HANDLES:
        try:
            value = getattr(target, name, None)
        except Exception:  # what its own property raises: no hint from it
            continue
        if isinstance(value, ctypes.c_void_p):
            expression = f"stream.{name}.value"
        elif isinstance(value, int) and not isinstance(value, bool):
            expression = f"stream.{name}"
        elif hasattr(type(value), "__int__") and not isinstance(value, (bool, float)):
            expression = f"int(stream.{name})"
        else:
            continue
        return (
            f"; if its .{name} is a raw CUstream handle, wrap that: "
            f"cuda.core.Stream.from_handle({expression}), and keep the "
            f"{type(target).__name__} alive while the stream is used"
        )
    return ""


def stream_handle(
    stream: Any, caller: str = "host_launch", graphs: bool = True, answer: Any = UNASKED
) -> int:
    """The handle ``stream.__cuda_stream__()`` gives, checked.

    What ``__cuda_stream__`` raises propagates as itself, as ``len()`` lets what
    ``__len__`` raises (and cuda.core does): a signal handler's exception raised
    inside it (an alarm) reaches the program as that exception.  Only a wrong
    return value is this function's ``TypeError`` (or ``ValueError``).

    ``answer``: what ``__cuda_stream__`` gave, where it was asked already (the native
    host_launch, which then handed the call over): it is not asked again, so each
    call asks once.  ``caller`` and ``graphs`` are :func:`target_kind`'s, for an
    object that turns out to have no protocol after all.
    """
    if answer is UNASKED:
        try:
            protocol = stream.__cuda_stream__
        except AttributeError:
            # Its class was remembered as a stream's, and has since lost its
            # __cuda_stream__: the verdict is dropped, and the object judged anew
            # (target_kind's TypeError, which names the protocol).
            _TARGET_KINDS.forget(type(stream))
            target_kind(stream, caller, graphs)
            raise
        answer = protocol() if callable(protocol) else protocol
    value = answer
    if (
        type(value) is not tuple
        or len(value) != 2
        or type(value[0]) is not int  # not 0.0 or False: version 0 is the int 0
        or value[0] != 0
        or not isinstance(value[1], int)
        or isinstance(value[1], bool)
    ):
        # Its version's type where it prints as a number (0.0, False, an int
        # subclass's 0): the repr alone reads as right.
        version = value[0] if type(value) is tuple and value else None
        named = (
            ""
            if type(version) in (int, type(None))
            else f" (its version a {type(version).__name__})"
        )
        raise TypeError(
            f"{type(stream).__name__}.__cuda_stream__ returned {value!r}{named}; expected "
            "(0, handle) as in version 0 of the protocol, the version the int 0"
        )
    # Its value, as the enqueue reads it: an int subclass's own comparisons and hash
    # decide neither the range check nor which registered stream it names.
    handle = int.__index__(value[1])
    if not 0 <= handle < 1 << 64:
        raise ValueError(
            f"{type(stream).__name__}.__cuda_stream__ returned the handle {handle}; a "
            "stream handle is an address, 0 to 2**64 - 1"
        )
    return handle
