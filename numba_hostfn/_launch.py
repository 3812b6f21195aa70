"""``host_launch``: enqueue a host function in stream order and own what it needs.

``numba_hostfn.host_launch`` is a native builtin (``native/host_launch.c``)
that launches the common cases itself and hands every other call, unchanged,
to :func:`host_launch_python` here, which alone raises errors.  Everything is
checked before anything is enqueued: a call that raises has enqueued nothing
and keeps no reference to its arguments.  A stream that is capturing, and an
explicit graph, go through ``_graphs``.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import inspect
import types
import weakref
from collections.abc import Iterator
from typing import Any

from . import _core
from ._backend import get_backend, on_backend
from ._compat import (
    FUNCFLAG_CDECL,
    FUNCFLAG_PYTHONAPI,
    CFuncPtr,
    cfunc_signature,
    is_jitted,
    numba_cfunc_type,
    numba_hooks,
    pointer_address,
    pointer_flags,
    text_signature,
)
from ._decorator import CUhostFn, HostFunction
from ._executor import check_executor
from ._graphs import (
    add_captured_executor_node,
    add_captured_node,
    add_executor_graph_node,
    add_graph_node,
)
from ._userdata import resolve_user_data

__all__ = [
    "classify_function",
    "drain",
    "enqueue",
    "host_launch",
    "host_launch_python",
    "launch_counts",
    "pending",
    "python_path",
    "refuse_coroutine_function",
    "refuse_signal",
    "signal_route",
]

_CDECL = FUNCFLAG_CDECL


class _KindsByType:
    """What a type is, keyed by ``id(type)``, holding each type weakly.

    A plain dict keyed by the type would keep every type it has seen alive (a
    class defined in a function, once per call).  Each entry keeps a weak
    reference and is used only while that reference still gives the type: an
    entry whose callback never ran (a signal handler raised inside it) cannot
    describe a new type that reuses the dead one's id.
    """

    def __init__(self) -> None:
        self._kinds: dict[int, tuple[str, weakref.ref]] = {}

    def get(self, cls: type) -> str | None:
        entry = self._kinds.get(id(cls))
        if entry is None or entry[1]() is not cls:
            return None
        return entry[0]

    def remember(self, cls: type, kind: str) -> None:
        key = id(cls)
        kinds = self._kinds
        try:
            ref = weakref.ref(cls, lambda ref, key=key: _forget(kinds, key, ref))
        except TypeError:  # not weakly referenceable: not cached
            return
        kinds[key] = (kind, ref)


def _forget(kinds: dict, key: int, ref: weakref.ref) -> None:
    entry = kinds.get(key)
    if entry is not None and entry[1] is ref:  # not since replaced by a newer type
        del kinds[key]


# id(type) -> "stream" | "builder" | "node", filled on first sight
_TARGET_KINDS = _KindsByType()
# id(type) -> "compiled" (a HostFunction subclass), filled on first sight: it depends
# on the type alone.  Python callables are checked each time (a class's __call__ can
# be replaced); ctypes pointers too (their restype and argtypes can be set per instance).
_FN_KINDS = _KindsByType()


def _prototype_error(detail: str) -> TypeError:
    return TypeError(
        f"host_launch() got a ctypes function pointer {detail}; CUDA calls a CUhostFn, "
        "void (*)(void *), declared as ctypes.CFUNCTYPE(None, ctypes.c_void_p) "
        "(numba_hostfn.CUhostFn). Alternatively pass a Python callable or a HostFunction."
    )


def classify_function(fn: Any) -> tuple[str, int, Any]:
    """Return ``(kind, address, owner)``: kind is "compiled", "pointer" or "python"."""
    kind = _FN_KINDS.get(type(fn))
    if type(fn) in _PER_INSTANCE:  # a plain function: not async (checked each time)
        refuse_coroutine_function(fn)
        _refuse_required_arguments(fn)
        return "python", 0, fn
    if kind == "compiled":
        return kind, fn.address, fn
    if issubclass(type(fn), HostFunction):
        _FN_KINDS.remember(type(fn), "compiled")
        return "compiled", fn.address, fn
    if issubclass(type(fn), CFuncPtr):
        flags = pointer_flags(fn)
        if flags != _CDECL:
            kind = "PYFUNCTYPE" if flags & FUNCFLAG_PYTHONAPI else f"flags {flags:#x}"
            raise _prototype_error(f"declared with {kind}")
        if fn.restype is not None or tuple(fn.argtypes or ()) != (ctypes.c_void_p,):
            raise _prototype_error(f"with restype={fn.restype!r}, argtypes={fn.argtypes!r}")
        address = pointer_address(fn)
        if not address:
            raise ValueError("host_launch() got a NULL ctypes function pointer")
        return "pointer", address, fn
    if issubclass(type(fn), numba_cfunc_type()):  # numba is imported: there is one
        if cfunc_signature(fn) != numba_hooks().signature:
            raise TypeError(
                f"host_launch() got a numba cfunc with signature {cfunc_signature(fn)}; a CUhostFn "
                "needs void(voidptr): use @host_callback, or numba.cfunc('void(voidptr)')"
            )
        return "pointer", fn.address, fn
    if is_jitted(fn):
        raise TypeError(
            f"host_launch() got a numba.njit function ({fn.py_func.__qualname__!r}), which "
            "the driver cannot call: decorate the Python function with "
            "@numba_hostfn.host_callback instead (or pass host_callback(fn.py_func))"
        )
    if fn is None or not callable(fn):
        raise TypeError(
            "host_launch() expected a HostFunction, a CUhostFn ctypes pointer or a "
            f"Python callable, got {type(fn).__name__}"
        )
    if (
        type(fn) in _BUILTINS
        or issubclass(type(fn), (staticmethod, type, _CACHED))
        or _function_like(fn)  # a Cython function, say
    ):
        # What it needs is its own, not its type's: checked each time.
        inner = fn.__func__ if issubclass(type(fn), staticmethod) else fn
        refuse_coroutine_function(inner)
        _refuse_required_arguments(inner)
        return "python", 0, fn
    # Checked each time, never remembered by type: a class's __call__ can be replaced.
    refuse_coroutine_function(fn)
    _refuse_required_arguments(fn)
    return "python", 0, fn


_ASYNC_FLAGS = inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR
# Callables whose coroutine-ness differs from one instance to the next: checked each time.
_PER_INSTANCE = (types.FunctionType, types.MethodType, functools.partial)
# Callables of one type whose arguments differ from one instance to the next
# (len needs one, time.time none; a staticmethod is its function's): checked each
# time, never remembered by type (and so never taught to the fast path).
_BUILTINS = (
    types.BuiltinFunctionType,  # builtin functions and bound builtin methods
    types.MethodWrapperType,
    types.MethodDescriptorType,
    types.WrapperDescriptorType,
    types.ClassMethodDescriptorType,
)
_BOUND_BUILTINS = (types.BuiltinFunctionType, types.MethodWrapperType)
# functools.lru_cache and functools.cache wrappers: they call the function they wrap
# with the arguments they get.
_CACHED = type(functools.lru_cache(None)(len))
# (type, its text signature, counts_self) -> the arguments it needs; bounded (see
# _builtin_required).
_BUILTIN_REQUIRED: dict[tuple[type, str, bool], int] = {}
_REQUIRED_KINDS = (
    inspect.Parameter.POSITIONAL_ONLY,
    inspect.Parameter.POSITIONAL_OR_KEYWORD,
    inspect.Parameter.KEYWORD_ONLY,
)


def _attribute(obj: Any, name: str) -> Any:
    """``getattr(obj, name, None)``, and None where reading it raises anything (an
    object's own ``__getattr__`` or property may): classifying never fails on it."""
    try:
        return getattr(obj, name, None)
    except Exception:
        return None


def _code_of(obj: Any) -> Any:
    """The code object ``obj`` has (a function's, a Cython or numba function's), or None."""
    code = _attribute(obj, "__code__")
    return code if isinstance(code, types.CodeType) else None


def _function_like(obj: Any) -> bool:
    """``obj``'s type gives it a code object, as a function's type does (Cython's
    functions): not an object that merely forwards attributes to a function."""
    return _attribute(type(obj), "__code__") is not None and _code_of(obj) is not None


def _call_method(fn: Any) -> Any:
    """The plain function behind calling ``fn``, an instance whose class defines
    ``__call__`` in Python; else None (a function, a class, a builtin)."""
    if issubclass(type(fn), type):  # (a function-like fn: _function_of has taken it)
        return None
    # The class's own attribute (as the call finds it), not one bound to fn.
    call = next((vars(c)["__call__"] for c in type(fn).__mro__ if "__call__" in vars(c)), None)
    return call if type(call) is types.FunctionType else None


def _function_of(fn: Any) -> tuple[Any, int]:
    """The function that calling ``fn`` runs, and how many of its leading parameters
    are bound: ``fn`` itself (a plain function, or one with a code object: Cython's),
    a bound method's function, the function an lru_cache wrapper calls (itself
    perhaps a bound method), or the ``__call__`` of a callable object's class;
    (None, 0) where it is none of these."""
    original, bound = fn, 0
    if type(fn) is types.MethodType:
        fn, bound = fn.__func__, 1
    if type(fn) is _CACHED:
        fn = _attribute(fn, "__wrapped__")
        if type(fn) is types.MethodType:
            fn, bound = fn.__func__, bound + 1
    if type(fn) is types.FunctionType or _function_like(fn):
        return fn, bound
    call = _call_method(fn) if fn is original else None
    return (call, 1) if call is not None else (None, 0)  # its class's __call__, bound


def _is_coroutine_partial(fn: Any) -> bool:
    try:
        return type(fn) is functools.partial and inspect.iscoroutinefunction(fn)
    except Exception:  # what its function's own attributes raise
        return False


def refuse_coroutine_function(fn: Any, caller: str = "host_launch") -> None:
    function, _ = _function_of(fn)
    # Else whatever code object it has (unittest.mock.AsyncMock sets one).
    code = _code_of(function if function is not None else fn)
    is_async = code is not None and code.co_flags & _ASYNC_FLAGS
    if is_async or _is_coroutine_partial(fn):
        raise TypeError(
            f"{caller}() got a coroutine function ({getattr(fn, '__qualname__', fn)!r}): "
            "a host function is called, not awaited, so it would only make a coroutine that "
            "never runs. To resume a coroutine when the stream gets here, await "
            "numba_hostfn.async_done(stream) in it; to call Python there, pass a plain function"
        )


def _builtin_required(fn: Any) -> int:
    """The arguments a builtin needs, from its text signature, the text that
    ``inspect.signature`` reads (0 where it has none: unknown, so not refused)."""
    text = text_signature(fn)
    if not text:
        return 0
    # A builtin function or method-wrapper is always bound to its leading "$"
    # parameter, but inspect drops it only where __self__ is not None (it counts
    # it for None.__sizeof__, which [].clear's text shares): counted, then taken off.
    counts_self = type(fn) in _BOUND_BUILTINS and fn.__self__ is None and text.startswith("($")
    key = (type(fn), text, counts_self)
    required = _BUILTIN_REQUIRED.get(key)
    if required is None:
        required = max(0, _signature_required(fn) - counts_self)
        if len(_BUILTIN_REQUIRED) < 4096:  # distinct signatures, not objects
            _BUILTIN_REQUIRED[key] = required
    return required


def _code_required(function: Any, skipped: int, given: Any = ()) -> int:
    """The arguments a plain function still needs when its first ``skipped``
    positional parameters are filled (bound, or given by a partial) and the keywords
    ``given`` are given: parameters without a default, not filled."""
    code = function.__code__
    names = code.co_varnames
    defaults = _attribute(function, "__defaults__")
    first_default = code.co_argcount - len(defaults if isinstance(defaults, tuple) else ())
    required = sum(  # a positional-only parameter cannot be given as a keyword
        names[i] not in given or i < code.co_posonlyargcount for i in range(skipped, first_default)
    )
    defaults = _attribute(function, "__kwdefaults__")  # numba's functions have none
    defaults = defaults if isinstance(defaults, dict) else {}
    keyword_only = names[code.co_argcount : code.co_argcount + code.co_kwonlyargcount]
    return required + sum(name not in defaults and name not in given for name in keyword_only)


def _signature_required(fn: Any) -> int:
    """The arguments ``inspect.signature`` says ``fn`` needs (0 where it has none)."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except Exception:  # none (ValueError), or what the object's own attributes raise
        return 0
    empty = inspect.Parameter.empty
    return sum(p.kind in _REQUIRED_KINDS and p.default is empty for p in parameters)


def _partial_required(fn: functools.partial) -> tuple[Any, int]:
    """What a partial calls, and the arguments it still needs: exact for a function
    with code however reached (_function_of); for a builtin or a class whose needs
    are known, those less what the partial gives, counted as if every keyword filled
    one (never more than it needs); else what ``inspect.signature`` says of it."""
    target = fn.func
    function, bound = _function_of(target)
    if function is not None:
        return function, _code_required(function, bound + len(fn.args), fn.keywords)
    needs = None
    if type(target) in _BUILTINS:
        needs = _builtin_required(target)
    elif issubclass(type(target), type):
        needs = _class_required(target)
    if needs is None:  # a builtin type, a callable object (a numpy ufunc)
        return target, _signature_required(fn)
    return target, max(0, needs - len(fn.args) - len(fn.keywords))


def _class_required(cls: type) -> int | None:
    """The arguments ``cls()`` needs, from its ``__new__`` and ``__init__`` where they
    are Python code (both are called with the same arguments; a ``__new__`` that
    returns no instance of ``cls``, so that ``__init__`` is skipped, is not seen);
    None where neither is, or a metaclass has its own ``__call__`` (unknown here)."""
    if type(cls).__call__ is not type.__call__:
        return None
    required = None
    for name in ("__new__", "__init__"):
        found = next((vars(c)[name] for c in cls.__mro__ if name in vars(c)), None)
        if type(found) is staticmethod:  # __new__
            found = found.__func__
        if type(found) is types.FunctionType:
            required = max(required or 0, _code_required(found, 1))
    return required


def _refuse_required_arguments(fn: Any) -> None:
    """A plain function, bound method, partial, class, cached function, builtin or
    callable object that cannot be called with no arguments (positional or
    keyword-only ones without a default)."""
    if type(fn) is functools.partial:
        function, required = _partial_required(fn)
    elif issubclass(type(fn), type):  # a builtin type: its text signature, if any
        required = _class_required(fn)
        function, required = fn, _signature_required(fn) if required is None else required
    elif type(fn) in _BUILTINS:
        function, required = fn, _builtin_required(fn)
    else:
        function, bound = _function_of(fn)
        if function is None:
            return
        required = _code_required(function, bound)
    if required > 0:
        name = getattr(function, "__qualname__", function)
        raise TypeError(
            f"host_launch() got {name!r}, which takes {required} "
            "argument(s), but a Python callable is called with none. To run it as "
            "fn(user_data), compiled and without the GIL, decorate it with "
            "@numba_hostfn.host_callback; to call Python with data, bind the data: "
            "functools.partial(fn, data)"
        )


def _is_graph_node(target: Any) -> bool:
    """A cuda.core explicit graph: a GraphDefinition, or any GraphNode (subclasses too)."""
    for cls in type(target).__mro__:
        if cls.__name__ in ("GraphDefinition", "GraphNode") and (cls.__module__ or "").startswith(
            "cuda.core"
        ):
            return True
    return False


def _target_kind(target: Any) -> str:
    """ "stream", "builder" (a GraphBuilder) or "node" (an explicit graph), cached per type."""
    kind = _TARGET_KINDS.get(type(target))
    if kind is not None:
        return kind
    if target is None:
        raise TypeError(
            "host_launch() needs a stream, got None; pass a cuda.core Stream or "
            "GraphBuilder, or a stream object with __cuda_stream__ (CuPy, PyTorch, numba-cuda)"
        )
    if isinstance(target, int):
        raise TypeError(
            f"host_launch() got a bare int ({target!r}) as stream; wrap a raw CUstream "
            "handle with cuda.core.Stream.from_handle(handle) (and keep the stream alive)"
        )
    module = type(target).__module__ or ""
    if type(target).__name__ == "GraphBuilder" and (
        module.startswith("cuda.core") or module == "numba_hostfn._simulator"
    ):
        kind = "builder"
    elif _is_graph_node(target):
        kind = "node"
    elif hasattr(target, "__cuda_stream__"):
        kind = "stream"
    else:
        raise TypeError(
            "host_launch() expected a cuda.core Stream, GraphBuilder, GraphDefinition or "
            "GraphNode, or an object with the __cuda_stream__ protocol, got "
            f"{type(target).__name__}"
        )
    _TARGET_KINDS.remember(type(target), kind)
    return kind


def _stream_handle(stream: Any) -> int:
    try:
        protocol = stream.__cuda_stream__
        value = protocol() if callable(protocol) else protocol
    except Exception as exc:  # the stream's own code: say so (a KeyboardInterrupt passes)
        raise TypeError(
            f"{type(stream).__name__}.__cuda_stream__ raised {type(exc).__name__}: {exc}; a "
            "stream gives (0, handle) as in version 0 of the protocol"
        ) from exc
    if (
        type(value) is not tuple
        or len(value) != 2
        or type(value[0]) is not int  # not 0.0 or False: version 0 is the int 0
        or value[0] != 0
        or not isinstance(value[1], int)
        or isinstance(value[1], bool)
    ):
        raise TypeError(
            f"{type(stream).__name__}.__cuda_stream__ returned {value!r}; expected "
            "(0, handle) as in version 0 of the protocol"
        )
    if not 0 <= value[1] < 1 << 64:
        raise ValueError(
            f"{type(stream).__name__}.__cuda_stream__ returned the handle {value[1]}; a "
            "stream handle is an address, 0 to 2**64 - 1"
        )
    return value[1]


def host_launch_python(
    stream: Any, fn: Any, *, user_data: Any = None, executor: Any = None, blocking: bool = True
) -> Any:
    """Enqueue ``fn`` on ``stream``: it runs on the host when the stream reaches this point.

    A :class:`HostFunction` or ctypes ``CUhostFn`` runs on the driver's thread
    without the GIL; a Python callable is called with no arguments through a
    trampoline that takes the GIL.  The launch keeps ``fn`` and its user data
    alive until it has run, then releases them on the main thread.  A host
    function must not call CUDA; all rules: docs/threading.md.

    On a stream that is capturing a CUDA graph (whoever began the capture:
    cuda.core's ``GraphBuilder``, ``torch.cuda.graph``, CuPy, cuda.bindings),
    ``fn`` becomes a host node of that graph, which runs at every replay; the
    graph owns what the node needs until the graph and all its executable
    instances are gone (docs/streams.md).

    Parameters
    ----------
    stream : stream, GraphBuilder, GraphDefinition or GraphNode
        Where to enqueue: a cuda.core ``Stream`` or any object with
        ``__cuda_stream__`` (CuPy, PyTorch, numba-cuda).  A ``GraphBuilder`` must be building.  A
        ``GraphDefinition`` or ``GraphNode`` (an explicit graph) gets a new
        host node, after the given node, that the graph owns.  With the
        simulator, a ``numba_hostfn.simulator.Stream`` or its ``GraphBuilder``.
    fn : HostFunction, ctypes CUhostFn, numba cfunc or callable
        What to run.  A ctypes pointer must be declared exactly as
        ``ctypes.CFUNCTYPE(None, ctypes.c_void_p)``; a numba cfunc must have
        the signature ``void(voidptr)``.
    user_data : None, int, bytes-like, ByRef or Record, optional
        Only for compiled functions and pointers.  ``None`` passes NULL (refused
        for a HostFunction whose body reads its argument), an ``int`` a raw
        address you keep valid, a read-only bytes-like object (``bytes``) a copy
        taken now (in a graph: taken once, and every replay sees that copy).  A
        writable buffer (numpy array, ``bytearray``, ...) is never copied, since
        the host function's writes would be lost: it is shared, as
        :func:`by_ref` shares it (every replay sees it live), and so is a
        :func:`record`; pass ``bytes(a)`` for a copy (docs/user_data.md).
    executor : HostExecutor, optional
        Run ``fn`` on the executor's threads instead of the driver's
        host-function thread: the stream writes a word when it reaches this
        point and waits for the executor to answer (docs/executor.md).  In a
        graph (captured or explicit) the node is three stream memory
        operations that every replay re-arms; the executor's pool polls for
        replays while such a graph is alive.
    blocking : bool, optional
        For a Python callable only.  True (the default): the stream waits
        while the callable runs, on the thread that reaches the point, which
        takes the GIL.  False: the stream only signals that it got here, with
        no GIL, and goes on; Python runs the callable soon after, in stream
        order among that stream's non-blocking callbacks, on the main thread
        (a pending call) or on numba_hostfn's helper thread, whichever comes
        first (docs/asyncio.md).  Not in a graph.

    Returns
    -------
    cuda.core.graph.HostCallbackNode, ChildGraphNode or None
        The new node for an explicit graph (so calls chain as in cuda.core;
        a ``ChildGraphNode`` of three memory operations with ``executor=``),
        else None.

    Raises
    ------
    TypeError
        If ``stream``, ``fn`` or ``user_data`` has the wrong type (None, a bare
        int stream, a ctypes prototype other than CUhostFn, ...), or ``fn`` is
        a coroutine function or a callable that needs arguments (a builtin
        such as ``len`` included, where its signature says so; a
        ``staticmethod`` is checked as its function).
    ValueError
        If user_data is given with a Python callable, or does not match the
        HostFunction's declared ``dtype`` (``0``, a NULL pointer to it,
        included), is NULL (``None`` or ``0``) for a body that reads it, is a
        writable buffer that cannot be shared (not C-contiguous), or ``blocking=False`` is given
        with compiled code (it never takes the GIL: it needs no such option).
    RuntimeError
        If a capture cannot take a node (it is invalidated), a GraphBuilder is
        not building, the executor is closed, ``blocking=False`` is used in a
        graph or capture, or a
        driver call fails (:class:`CudaDriverError`).  Nothing was enqueued,
        and a capture is as it was.
    BackendUnavailableError
        If there is no CUDA driver and the simulator is not selected.
    """
    if blocking is not True:
        if blocking is not False:
            raise TypeError(f"host_launch(blocking=...) expected True or False, got {blocking!r}")
        kind, _, callable_ = classify_function(fn)
        if kind != "python":
            raise ValueError(
                "host_launch(blocking=False) is for Python callables; "
                f"{getattr(fn, '__qualname__', type(fn).__name__)!r} is compiled code, which "
                "never takes the GIL and needs no such option: leave blocking=True"
            )
        if user_data is not None:
            raise _user_data_with_callable(fn)
        from ._notify import launch_nonblocking

        launch_nonblocking(stream, callable_, executor)
        return None
    return enqueue(stream, fn, user_data, None, executor=executor)


def signal_route(target: Any, executor: Any, refusal: str) -> tuple[int, int, int, Any]:
    """Where a signal of ``target`` goes: ``(enqueue_fn, target, trampoline, owner)``
    for the native dispatcher's launch (``native/notify.c``).

    A signal says "the stream got here" once, so it is only for streams: a graph
    target raises ``RuntimeError(refusal)``, having enqueued nothing (a capturing
    stream is refused by the enqueue: :func:`refuse_signal`).
    """
    if _target_kind(target) != "stream":
        raise RuntimeError(refusal)
    if executor is not None:
        check_executor(executor)
    backend = get_backend()
    handle = _stream_handle(target)
    if backend.checks_streams:
        handle = backend.stream_handle(target, handle)
    if executor is None:
        return backend.enqueue_fn, handle, _core.RUN_COMPILED, None
    # An executor's task owns the executor: it is collected only with nothing outstanding.
    return backend.executor_enqueue_fn, executor._lane(handle), _core.RUN_COMPILED, executor


def refuse_signal(status: int, executor: Any, refusal: str) -> None:
    """Raise for a signal's refused enqueue: ``RuntimeError(refusal)`` if the stream is
    capturing, else what a refused launch raises."""
    if status == _core.CAPTURING:
        raise RuntimeError(refusal)
    call = "cuLaunchHostFunc" if executor is None else "cuStreamWriteValue32"
    get_backend().refused(status, call)


def enqueue(
    target: Any,
    fn: Any,
    user_data: Any,
    keep: Any,
    device: bool = False,
    executor: Any = None,
    copy: bool = False,
) -> Any:
    """host_launch, plus ``keep``: more objects the launch owns until it has run.

    ``device`` (simulator only) enqueues simulated device work instead of a
    host function.  ``copy`` says that ``fn`` is the compiled copy with
    MEMCPY_LAYOUT user data, which an executor shares out among its threads.
    """
    kind, address, fn_owner = classify_function(fn)
    if kind == "python":
        if user_data is not None:
            raise _user_data_with_callable(fn)
        arg, data_owner = id(fn), None  # the PyObject*, kept alive by fn_owner
    else:
        layout = fn.dtype if kind == "compiled" else None
        reads = kind == "compiled" and fn.reads_user_data
        arg, data_owner = resolve_user_data(user_data, layout, fn, reads)
    target_kind = _target_kind(target)
    if executor is not None:
        check_executor(executor)
    backend = get_backend()
    # The function alone when it is all the launch owns: no object per launch,
    # so a burst of launches does not feed the cyclic garbage collector.
    if executor is not None:
        owner = (fn_owner, data_owner, keep, executor)  # an executor outlives its tasks
    elif data_owner is None and keep is None:
        owner = fn_owner
    else:
        owner = (fn_owner, data_owner, keep)
    if target_kind == "node":
        if executor is not None:
            return add_executor_graph_node(
                backend, executor, target, kind, address, arg, owner, copy
            )
        return add_graph_node(backend, target, kind, address, arg, owner)
    handle = _stream_handle(target)
    if backend.checks_streams:
        handle = backend.stream_handle(target, handle)
    trampoline = _core.RUN_PYTHON if kind == "python" else _core.RUN_COMPILED
    builder = target_kind == "builder"
    if executor is not None:
        while True:
            if not builder and _executor_enqueue(
                backend, executor, handle, trampoline, address, arg, owner, copy
            ):
                return None
            if add_captured_executor_node(
                backend, executor, handle, kind, address, arg, owner, copy, builder
            ):
                return None
    enqueue_fn = backend.device_enqueue_fn if device else 0
    while True:
        if not builder and backend.enqueue(handle, trampoline, address, arg, owner, enqueue_fn):
            return None
        if add_captured_node(backend, handle, kind, address, arg, owner, builder, device):
            return None
        # The capture ended between the two checks: enqueue on the stream.


def _user_data_with_callable(fn: Any) -> ValueError:
    return ValueError(
        "user_data is only supported with compiled host functions and ctypes "
        f"function pointers; {getattr(fn, '__qualname__', type(fn).__name__)!r} is a "
        "Python callable, called with no arguments. Decorate it with "
        "@numba_hostfn.host_callback to run fn(user_data) compiled and without the "
        "GIL, or bind the data: functools.partial(fn, data)"
    )


def _executor_enqueue(
    backend: Any,
    executor: Any,
    handle: int,
    trampoline: int,
    fn: int,
    arg: int,
    owner: Any,
    copy: bool,
    builtin: Any = None,
) -> bool:
    """Enqueue on the executor's lane for stream ``handle``; False if it is capturing."""
    lane = executor._lane(handle)
    # The executor's copy trampoline finds its pool in the record's context.
    context = (executor._pool,) if copy else ()
    if copy:
        trampoline = _core.EXEC_COPY
    return backend.enqueue(
        lane,
        trampoline,
        fn,
        arg,
        owner,
        backend.executor_enqueue_fn,
        "cuStreamWriteValue32",
        builtin,
        context,
    )


def pending() -> int:
    """Return how many launches are not yet released (not run, or run and not drained).

    Returns
    -------
    int
    """
    return get_backend().records.pending()


def _raise_status(status: int, executor: Any) -> None:
    """Raise what the Python path raises for an enqueue function's status (the
    native host_launch calls this when the driver or simulator refused)."""
    call = "cuLaunchHostFunc" if executor is None else "cuStreamWriteValue32"
    get_backend().refused(status, call)


def _configure_native(backend: Any) -> None:
    """Point the native host_launch at ``backend`` (when the backend is made)."""
    _core.configure_launch(
        raise_status=_raise_status,
        enqueue_fn=backend.enqueue_fn,
        executor_enqueue_fn=backend.executor_enqueue_fn or 0,
        sim_stream_type=backend.stream_type if backend.name == "simulator" else None,
        cuda_stream_type=backend.stream_type if backend.name == "cuda" else None,
        cuhostfn_type=CUhostFn,
        c_void_p=ctypes.c_void_p,
    )


def launch_counts() -> dict[str, int]:
    """Launches that fell through to Python, and native launches by kind (for tests)."""
    return _core.launch_counts()


@contextlib.contextmanager
def python_path() -> Iterator[None]:
    """Within it, every ``host_launch`` takes the Python implementation (for tests)."""
    _core.configure_launch(wanted=False)
    try:
        yield
    finally:
        _core.configure_launch(wanted=True)


def drain() -> int:
    """Release the owners of launches that have run, on the calling thread.

    The main thread does this on its own shortly after each host function
    (through ``Py_AddPendingCall``); call it to release at a known point, e.g.
    after synchronizing a stream and before checking a weak reference.  It
    also runs the non-blocking callbacks (``host_launch(..., blocking=False)``)
    and sets the ``done_future`` results whose streams got there and that are
    not done yet, in stream order.

    Returns
    -------
    int
        How many launches were released.
    """
    from ._notify import run_callbacks

    run_callbacks()
    return get_backend().records.drain()


_core.configure_launch(fallback=host_launch_python)
on_backend(_configure_native)
host_launch = _core.make_host_launch(
    "host_launch(stream, fn, *, user_data=None, executor=None, blocking=True)\n--\n\n"
    + inspect.getdoc(host_launch_python)
)
