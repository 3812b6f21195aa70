"""What a callable is, for host_launch: compiled code, a ctypes CUhostFn, or Python.

``classify_function`` decides; the native ``host_launch`` (``native/host_launch.c``)
decides only the common cases, the same way, and hands every other call here.
``KINDS`` is the native table of launch kinds (``native/kinds.c``), which both paths
read: each kind's run and replay trampolines, and what its launch owns.  A
Python callable is checked each time (what it needs is its own, and a class's
``__call__`` can be replaced); what it needs is read off its code or signature, and a
generator or coroutine function (whose body a call never runs) or a callable that needs
arguments is refused, saying what was meant.
"""

from __future__ import annotations

import ctypes
import functools
import inspect
import types
import weakref
from typing import Any, NamedTuple

from . import _core
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
    pointer_prototype,
    text_signature,
)
from ._hostfunction import SUSPENDING_FLAGS, CUhostFn, HostFunction

__all__ = [
    "KINDS",
    "KindsByType",
    "LaunchKind",
    "classify_function",
    "compiled_layout",
    "refuse_coroutine_function",
]


class LaunchKind(NamedTuple):
    """One row of the native table of launch kinds (``_core.launch_kinds()``)."""

    number: int  # nhf.h's enum nhf_kind (a CompiledBase's ``_kind``)
    name: str  # what classify_function returns
    run: int  # the trampoline of a launch on a stream (its number, _core.RUN_*)
    replay: int  # a graph node's call at each replay, given the record
    owns: str  # "fn": the callable, also the argument; "fn, user_data"


KINDS: dict[str, LaunchKind] = {row[1]: LaunchKind(*row) for row in _core.launch_kinds()}

_CDECL = FUNCFLAG_CDECL


class KindsByType:
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

    def forget(self, cls: type) -> None:
        """Drop what was remembered of ``cls`` (a verdict that no longer holds)."""
        entry = self._kinds.get(id(cls))
        if entry is not None and entry[1]() is cls:
            del self._kinds[id(cls)]


def _forget(kinds: dict, key: int, ref: weakref.ref) -> None:
    entry = kinds.get(key)
    if entry is not None and entry[1] is ref:  # not since replaced by a newer type
        del kinds[key]


_COMPILED = KINDS["compiled"]
# A CompiledBase's own fields, read past any subclass attribute of the same name.
_COMPILED_ADDRESS = vars(_core.CompiledBase)["address"].__get__
_COMPILED_KIND = vars(_core.CompiledBase)["_kind"].__get__
_COMPILED_DTYPE = vars(_core.CompiledBase)["dtype"].__get__
_COMPILED_READS = vars(_core.CompiledBase)["reads_user_data"].__get__


def compiled_layout(fn: Any) -> tuple[Any, bool]:
    """A CompiledBase's declared (dtype, reads_user_data), as bound (its own fields)."""
    return _COMPILED_DTYPE(fn), _COMPILED_READS(fn)


def _prototype_error(detail: str) -> TypeError:
    return TypeError(
        f"host_launch() got a ctypes function pointer {detail}; CUDA calls a CUhostFn, "
        "void (*)(void *), declared as ctypes.CFUNCTYPE(None, ctypes.c_void_p) "
        "(numba_hostfn.CUhostFn). Alternatively pass a Python callable or a HostFunction."
    )


def _configure_cfunc() -> None:
    """Hand the native ``host_launch`` numba's ``CFunc`` and the types of
    ``void(voidptr)``, with which it launches a numba cfunc itself: at each cfunc that
    this path launches (numba is imported then; not before, at start-up)."""
    signature = numba_hooks().signature
    _core.configure_launch(
        cfunc=(numba_cfunc_type(), type(signature), signature.args[0], signature.return_type)
    )


def classify_function(fn: Any) -> tuple[str, int, Any]:
    """Return ``(kind, address, owner)``: kind is "compiled", "pointer" or "python"."""
    if type(fn) in _PER_INSTANCE:  # a plain function: not async (checked each time)
        _refuse_unlaunchable(fn)
        return "python", 0, fn
    if issubclass(type(fn), _core.CompiledBase):
        # Its own fields, as bound (and as the native path reads them): a subclass's
        # property of the same name changes neither what is launched nor its checks.
        address, declared_kind = _COMPILED_ADDRESS(fn), _COMPILED_KIND(fn)
        if issubclass(type(fn), HostFunction) and not address:
            # Made with __new__ alone: the driver's thread would call NULL.
            raise ValueError(
                "host_launch() got a HostFunction with no machine code (its address is "
                "NULL: made with HostFunction.__new__, never compiled); make it with "
                "@numba_hostfn.host_callback"
            )
        if declared_kind != _COMPILED.number or not address:  # as the native path reads it
            declared = next(
                (k.name for k in KINDS.values() if k.number == declared_kind), declared_kind
            )
            raise TypeError(
                f"host_launch() got a {type(fn).__name__!r} object, a _core.CompiledBase "
                f"that declares launch kind {declared!r} (address {address:#x}); only a "
                "bound one-argument compiled function, of kind 'compiled', is launched as "
                "compiled code: make it with @numba_hostfn.host_callback, or bind it with "
                "_bind(address, dtype, layout_bytes, reads_user_data, _core.KIND_COMPILED)"
            )
        return "compiled", address, fn
    if issubclass(type(fn), CFuncPtr):
        # CUhostFn is CFUNCTYPE's cdecl type, whatever its _flags_ attribute says now
        # (ctypes calls it by its type's own flags; the native path takes it so).
        flags = _CDECL if type(fn) is CUhostFn else pointer_flags(fn)
        if flags != _CDECL:
            if not isinstance(flags, int):  # a class attribute set to anything
                kind = f"_flags_ {flags!r}"
            else:
                kind = "PYFUNCTYPE" if flags & FUNCFLAG_PYTHONAPI else f"flags {flags:#x}"
            raise _prototype_error(f"declared with {kind}")
        restype, argtypes = pointer_prototype(fn)  # as host_launch.c reads it
        if restype is not None or tuple(argtypes or ()) != (ctypes.c_void_p,):
            raise _prototype_error(f"with restype={restype!r}, argtypes={argtypes!r}")
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
        address = fn.address
        if type(address) is not int or address <= 0:  # as the native path takes it
            # Made with CFunc(...) and never compiled: the driver's thread would call
            # NULL (numba.cfunc compiles as it decorates).
            raise ValueError(
                f"host_launch() got a numba cfunc with no machine code (its address is "
                f"{address!r}: never compiled); compile it first (numba.cfunc("
                "'void(voidptr)') compiles as it decorates), or use @host_callback"
            )
        _configure_cfunc()
        return "pointer", address, fn
    if is_jitted(fn):
        raise TypeError(
            f"host_launch() got a numba.njit function ({fn.py_func.__qualname__!r}), which "
            "the driver cannot call: decorate the Python function with "
            "@numba_hostfn.host_callback instead (or pass host_callback(fn.py_func))"
        )
    if fn is None or not callable(fn) or _call_is_none(fn):
        if inspect.isawaitable(fn):
            _refuse_awaitable(fn)
        raise TypeError(
            "host_launch() expected a HostFunction, a CUhostFn ctypes pointer or a "
            f"Python callable, got {type(fn).__name__}"
        )
    inner = fn.__func__ if issubclass(type(fn), staticmethod) else fn
    _refuse_unlaunchable(inner)
    return "python", 0, fn


# SUSPENDING_FLAGS (_hostfunction's, which @host_callback refuses): a call of a function
# with them makes a generator, a coroutine or an async generator instead of running its
# body, so it is refused as fn; native/host_launch.c falls through here for the same flags.
# Those of them whose call makes something to await; and a @types.coroutine generator's
# (CO_ITERABLE_COROUTINE with CO_GENERATOR: on a plain function that flag changes
# nothing, its call runs the body, as the native path launches it).
_AWAITABLE_FLAGS = inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR
_ITERABLE_COROUTINE = inspect.CO_GENERATOR | inspect.CO_ITERABLE_COROUTINE
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


def _call_is_none(fn: Any) -> bool:
    """An instance whose class sets ``__call__ = None`` (as ``__hash__ = None`` says
    "not hashable"): ``callable()`` says yes, but calling it raises TypeError."""
    if issubclass(type(fn), type):
        return False
    return next((vars(c)["__call__"] for c in type(fn).__mro__ if "__call__" in vars(c)), 0) is None


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


def _refuse_unlaunchable(fn: Any) -> None:
    found = _function_of(fn)
    refuse_coroutine_function(fn, found=found)
    _refuse_required_arguments(fn, found)


def _suspending_flags(fn: Any, function: Any) -> int:
    """The code flags of what calling ``fn`` runs (``function``, as ``_function_of``
    found it; else whatever code object ``fn`` has), and of ``fn``'s own code object
    where it is an instance that has one besides its class's ``__call__``
    (``unittest.mock.AsyncMock`` sets a CO_COROUTINE one on the instance, and its
    class's ``__call__`` is plain).  A plain function or bound method is read once:
    nothing more on that path."""
    code = _code_of(function if function is not None else fn)
    flags = code.co_flags if code is not None else 0
    if function is not None and function is not fn and type(fn) not in _PER_INSTANCE:
        own = _code_of(fn)  # read only for a callable object, off the common path
        if own is not None:
            flags |= own.co_flags
    return flags


def refuse_coroutine_function(fn: Any, caller: str = "host_launch", found: Any = None) -> None:
    """Refuse a ``fn`` whose call only makes a generator, coroutine or async generator
    (its body would never run): a generator or coroutine function, through a bound
    method, an lru_cache wrapper, a partial, a callable object's ``__call__``, or a
    code object of the instance's own (``unittest.mock.AsyncMock``)."""
    target = fn
    while type(target) is functools.partial:  # what the partial calls
        target, found = target.func, None
    function, _ = found if found is not None else _function_of(target)
    flags = _suspending_flags(target, function)
    iterable_coroutine = flags & _ITERABLE_COROUTINE == _ITERABLE_COROUTINE
    if flags & _AWAITABLE_FLAGS or iterable_coroutine or _is_coroutine_partial(fn):
        name = _attribute(fn, "__qualname__") or fn
        raise TypeError(
            f"{caller}() got a coroutine function ({name!r}): a host function is called, "
            "not awaited, so it would only make a coroutine that never runs. To resume a "
            "coroutine when the stream gets here, await numba_hostfn.async_done(stream) in "
            "it; to call Python there, pass a plain function"
        )
    if flags & SUSPENDING_FLAGS:
        name = _attribute(fn, "__qualname__") or fn
        raise TypeError(
            f"{caller}() got a generator function ({name!r}): a host function is called, "
            "not iterated, so calling it would only make a generator whose body never "
            "runs. Pass a plain function (a def without yield), or one that runs the "
            "generator to its end: lambda: list(gen())"
        )


def _refuse_awaitable(fn: Any) -> None:
    """Refuse a coroutine object (``coro()``) or other awaitable given as ``fn``,
    pointing to async_done; a coroutine never started is closed first, so that it
    does not also warn that it was never awaited."""
    what, closed = f"an awaitable ({type(fn).__name__})", ""
    if inspect.iscoroutine(fn):
        what = f"a coroutine object ({_attribute(fn, '__qualname__')!r})"
        if inspect.getcoroutinestate(fn) == inspect.CORO_CREATED:
            fn.close()
            closed = ", closed since it had not started"
    raise TypeError(
        f"host_launch() got {what}{closed}, not a function: a host "
        "function is called, not awaited. To await the stream, use `await "
        "nh.async_done(stream)` (numba_hostfn.async_done); to run Python when the "
        "stream gets here, pass a plain function"
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
        _refuse_surplus_positional(function, bound + len(fn.args))
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


def _refuse_surplus_positional(function: Any, given: int) -> None:
    """A function with code that is given more positional arguments than it takes (a
    method defined without ``self``, a partial with too many): no call can succeed."""
    code = function.__code__
    if given > code.co_argcount and not code.co_flags & inspect.CO_VARARGS:
        name = getattr(function, "__qualname__", function)
        raise TypeError(
            f"host_launch() got {name!r} with {given} positional argument(s) bound (a "
            f"method's self, a partial's arguments), but it takes {code.co_argcount}: "
            "calling it would fail. A method needs self: def method(self): ..."
        )


def _refuse_required_arguments(fn: Any, found: Any) -> None:
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
        function, bound = found
        if function is None:
            return
        _refuse_surplus_positional(function, bound)
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
