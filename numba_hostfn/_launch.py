"""``host_launch``: enqueue a host function in stream order and own what it needs.

Everything is checked before anything is enqueued: a call that raises has
enqueued nothing and keeps no reference to its arguments.
"""

from __future__ import annotations

import ctypes
from typing import Any

from numba.core.ccallback import CFunc

from ._backend import get_backend
from ._decorator import _SIGNATURE, CUhostFn, HostFunction
from ._userdata import resolve_user_data

__all__ = ["classify_function", "drain", "host_launch", "launch", "pending"]

_CFuncPtr = ctypes._CFuncPtr  # the base of every ctypes function pointer type
_CDECL = ctypes._FUNCFLAG_CDECL
_c_void_p = ctypes.c_void_p
_STREAM_KINDS: dict[type, str] = {}  # type -> "graph" | "stream", filled on first sight
# type -> "compiled" | "python", filled on first sight.  Exact: both depend on the
# type alone (isinstance, and callable(), which reads the type's tp_call).  ctypes
# pointers are never cached: their restype and argtypes can be set per instance.
_FN_KINDS: dict[type, str] = {}


def _prototype_error(detail: str) -> TypeError:
    return TypeError(
        f"host_launch() got a ctypes function pointer {detail}; CUDA calls a CUhostFn, "
        "void (*)(void *), declared as ctypes.CFUNCTYPE(None, ctypes.c_void_p) "
        "(numba_hostfn.CUhostFn). Alternatively pass a Python callable or a HostFunction."
    )


def classify_function(fn: Any) -> tuple[str, int, Any]:
    """Return ``(kind, address, owner)``: kind is "compiled", "pointer" or "python"."""
    kind = _FN_KINDS.get(type(fn))
    if kind == "python":
        return kind, 0, fn
    if kind == "compiled" or isinstance(fn, HostFunction):
        _FN_KINDS[type(fn)] = "compiled"
        return "compiled", fn.address, fn
    if isinstance(fn, _CFuncPtr):
        flags = type(fn)._flags_
        if flags != _CDECL:
            kind = "PYFUNCTYPE" if flags & ctypes._FUNCFLAG_PYTHONAPI else f"flags {flags:#x}"
            raise _prototype_error(f"declared with {kind}")
        if fn.restype is not None or tuple(fn.argtypes or ()) != (ctypes.c_void_p,):
            raise _prototype_error(f"with restype={fn.restype!r}, argtypes={fn.argtypes!r}")
        address = _c_void_p.from_buffer(fn).value  # what cast() gives, in a third of the time
        if not address:
            raise ValueError("host_launch() got a NULL ctypes function pointer")
        return "pointer", address, fn
    if isinstance(fn, CFunc):
        if fn._sig != _SIGNATURE:
            raise TypeError(
                f"host_launch() got a numba cfunc with signature {fn._sig}; a CUhostFn "
                "needs void(voidptr): use @host_callback, or numba.cfunc('void(voidptr)')"
            )
        return "pointer", fn.address, fn
    if fn is None or not callable(fn):
        raise TypeError(
            "host_launch() expected a HostFunction, a CUhostFn ctypes pointer or a "
            f"Python callable, got {type(fn).__name__}"
        )
    _FN_KINDS[type(fn)] = "python"
    return "python", 0, fn


def _stream_kind(stream: Any) -> str:
    kind = _STREAM_KINDS.get(type(stream))
    if kind is not None:
        return kind
    if stream is None:
        raise TypeError(
            "host_launch() needs a stream, got None; pass a cuda.core Stream or "
            "GraphBuilder, or a stream object with __cuda_stream__ (CuPy, PyTorch, numba-cuda)"
        )
    if isinstance(stream, int):
        raise TypeError(
            f"host_launch() got a bare int ({stream!r}) as stream; wrap a raw CUstream "
            "handle with cuda.core.Stream.from_handle(handle) (and keep the stream alive)"
        )
    kind = None
    module = type(stream).__module__ or ""
    if type(stream).__name__ == "GraphBuilder" and module.startswith("cuda.core"):
        kind = "graph"
    elif hasattr(stream, "__cuda_stream__"):
        kind = "stream"
    if kind is None:
        raise TypeError(
            "host_launch() expected a cuda.core Stream or GraphBuilder, or an object with "
            f"the __cuda_stream__ protocol, got {type(stream).__name__}"
        )
    _STREAM_KINDS[type(stream)] = kind
    return kind


def _stream_handle(stream: Any) -> int:
    protocol = stream.__cuda_stream__
    value = protocol() if callable(protocol) else protocol
    if (
        not isinstance(value, tuple)
        or len(value) != 2
        or value[0] != 0
        or not isinstance(value[1], int)
    ):
        raise TypeError(
            f"{type(stream).__name__}.__cuda_stream__ returned {value!r}; expected "
            "(0, handle) as in version 0 of the protocol"
        )
    return value[1]


def host_launch(stream: Any, fn: Any, *, user_data: Any = None) -> None:
    """Enqueue ``fn`` on ``stream``: it runs on the host when the stream reaches this point.

    A :class:`HostFunction` or ctypes ``CUhostFn`` runs on the driver's thread
    without the GIL; a Python callable is called with no arguments through a
    trampoline that takes the GIL.  The launch keeps ``fn`` and its user data
    alive until it has run, then releases them on the main thread.  A host
    function must not call CUDA; all rules: docs/threading.md.

    Parameters
    ----------
    stream : cuda.core Stream, GraphBuilder, or ``__cuda_stream__`` object
        Where to enqueue.  A cuda.core ``GraphBuilder`` that is building gets a
        host node through its ``callback`` (the node runs at every replay, and
        its owners live as long as the graph).  Any other stream must not be
        capturing.  With the simulator, a ``numba_hostfn.simulator.Stream``.
    fn : HostFunction, ctypes CUhostFn, numba cfunc or callable
        What to run.  A ctypes pointer must be declared exactly as
        ``ctypes.CFUNCTYPE(None, ctypes.c_void_p)``; a numba cfunc must have
        the signature ``void(voidptr)``.
    user_data : None, int, bytes-like or ByRef, optional
        Only for compiled functions and pointers.  ``None`` passes NULL, an
        ``int`` a raw address you keep valid, a bytes-like object a copy taken
        now, :func:`by_ref` the buffer itself.

    Raises
    ------
    TypeError
        If ``stream``, ``fn`` or ``user_data`` has the wrong type (None, a bare
        int stream, a ctypes prototype other than CUhostFn, ...).
    ValueError
        If user_data is given with a Python callable, or does not match the
        HostFunction's declared ``dtype``.
    RuntimeError
        If a plain stream is capturing a graph (pass the GraphBuilder instead),
        or a driver call fails (:class:`CudaDriverError`).  Nothing was enqueued.
    BackendUnavailableError
        If there is no CUDA driver and the simulator is not selected.
    """
    launch(stream, fn, user_data, None)


def launch(stream: Any, fn: Any, user_data: Any, keep: Any) -> None:
    """host_launch, plus ``keep``: more objects the launch owns until it has run."""
    kind, target, fn_owner = classify_function(fn)
    if kind == "python":
        if user_data is not None:
            raise ValueError(
                "user_data is only supported with compiled host functions and ctypes "
                "function pointers; a Python callable carries its state itself (a "
                "closure or functools.partial)"
            )
        arg, data_owner = id(fn), None  # the PyObject*, kept alive by fn_owner
    else:
        layout = fn.dtype if kind == "compiled" else None
        arg, data_owner = resolve_user_data(user_data, layout, fn)
    stream_kind = _stream_kind(stream)
    backend = get_backend()
    if stream_kind == "graph":
        _graph_launch(backend, stream, kind, fn, target, arg, (fn_owner, data_owner, keep))
        return
    handle = _stream_handle(stream)
    if backend.checks_streams:
        handle = backend.stream_handle(stream, handle)
    native = backend.native
    trampoline = native.run_python if kind == "python" else native.run_compiled
    # The function alone when it is all the launch owns: no object per launch,
    # so a burst of launches does not feed the cyclic garbage collector.
    owner = fn_owner if data_owner is None and keep is None else (fn_owner, data_owner, keep)
    backend.launch(handle, trampoline, target, arg, owner)


def _graph_launch(
    backend: Any, builder: Any, kind: str, fn: Any, target: int, arg: int, owner: Any
) -> None:
    if kind == "python":
        builder.callback(fn)  # cuda.core owns the callable for the graph's lifetime
        return
    records = backend.records
    record = records.acquire(0, 0, owner)
    try:
        graph, user_object = backend.attach_to_capture(_stream_handle(builder), record)
    except BaseException:
        records.cancel(record)
        raise
    # From here the user object owns the record: releasing it releases them.
    try:
        # A fresh CUhostFn for any compiled kind (a numba CFunc is callable, and
        # cuda.core would take it for a Python callable); the record owns the code.
        builder.callback(CUhostFn(target), user_data=arg)
    except BaseException:
        backend.release_user_object(user_object)
        raise
    backend.commit_to_graph(graph, user_object)


def pending() -> int:
    """Return how many launches are not yet released (not run, or run and not drained).

    Returns
    -------
    int
    """
    return get_backend().records.pending()


def drain() -> int:
    """Release the owners of launches that have run, on the calling thread.

    The main thread does this on its own shortly after each host function
    (through ``Py_AddPendingCall``); call it to release at a known point, e.g.
    after synchronizing a stream and before checking a weak reference.

    Returns
    -------
    int
        How many launches were released.
    """
    return get_backend().records.drain()
