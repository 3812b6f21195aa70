"""Every private API numba_hostfn relies on, in one place: why, and where it was checked.

The rest of the package reaches these only through this module, so a release of
Python, numba or ctypes that moves one breaks here, by name, and nowhere else.
``tests/test_compat.py`` checks that each is still there, that no other module
reaches a private name of another package, and that the native core (C, in
``native/``) uses no private CPython API but the ones listed here.  numba is
imported only when a compiled function is made (:func:`numba_hooks`).
Checked on Python 3.10-3.13 (CI) and 3.12 (GPU image), with numba 0.62.0,
llvmlite 0.45.0, numpy 1.24.4, cuda-bindings 13.0.0 and cuda-core 1.2.0 (the
oldest that pyproject declares: CI runs the suite against them,
``.ci/oldest.txt``), numba 0.68.0 (GPU image) and 0.68.1 (CI, newest).
docs/compatibility.md has the table.

=====================================  =====================================================
hook                                   why
=====================================  =====================================================
**Python**
``threading._register_atexit``         a hook when exit begins (before non-daemon threads
                                       are joined) that moves the close of the launch records
                                       to the front of the ``atexit`` handlers: it then runs
                                       after those threads end and before any other library's
                                       handler, which may block in a driver call holding the
                                       GIL while the driver's thread waits for the GIL
                                       (LIFETIME.md, inv. 6); a plain ``atexit`` is the fallback.
                                       Also the run of the non-blocking callbacks that are due,
                                       just before the close (inv. 18)
``__text_signature__``                 what a builtin needs, read as ``inspect.signature``
                                       reads it (:func:`text_signature`)
``asyncio._get_running_loop``          in a pending call, the loop running on this thread,
                                       if any, whose ``async_done`` waits it resolves (the
                                       public ``get_running_loop`` raises without a loop)
``_PyEval_AddPendingCall``,            3.12 only: a pending call that any thread runs, with
``PyInterpreterState_Main``            the eval breaker set at once (non-blocking callbacks,
                                       ``native/notify.c``); both through ``ctypes.pythonapi``
**CPython's C API, in native/**
``_PyThreadState_UncheckedGet``        3.10-3.12 (public from 3.13 as
                                       ``PyThreadState_GetUnchecked``): whether a host
                                       function's thread still holds the GIL after a
                                       compiled body (``guard.c``, inv. 13)
``PyCodeObject`` fields                ``co_flags``, ``co_argcount``, ``co_kwonlyargcount``
                                       of a plain function (``host_launch.c``): the
                                       non-limited API's named fields, not offsets
the GILState counter                   a foreign thread keeps the thread state its first
                                       ``PyGILState_Ensure`` made: ``Ensure`` then
                                       ``PyEval_SaveThread`` (``guard.c``, inv. 12), and
                                       ``Ensure``, ``Release(LOCKED)``, ``Release(UNLOCKED)``
                                       to give it back; documented behaviour of the counter,
                                       relied on as a pattern
**ctypes**
``ctypes._CFuncPtr``,                  recognise any ctypes function pointer (a
``ctypes._Pointer``                    ``CUhostFn``, or one of another prototype to refuse),
                                       and refuse pointers as ``user_data``; ctypes has no
                                       public base classes
``ctypes._FUNCFLAG_CDECL``,            check a pointer's calling convention: a
``_FUNCFLAG_PYTHONAPI``, ``_flags_``   ``CUhostFn`` is ``cdecl`` and not a ``PYFUNCTYPE``
                                       (the prototype class's ``_flags_``, which
                                       ``host_launch.c`` reads for any class but
                                       ``CUhostFn``)
a function pointer's buffer            a ctypes function pointer's buffer is the pointer
                                       itself: its address is read there
                                       (:func:`pointer_address`; ``host_launch.c`` the same)
``_CFuncPtr``'s ``restype`` and        read a pointer's prototype as its calls use it
``argtypes`` descriptors               (:func:`pointer_prototype`; ``host_launch.c``
                                       calls the same two descriptors)
``CFUNCTYPE`` caching                  ctypes returns one class for one prototype, so
                                       ``host_launch.c`` knows a ``CUhostFn`` by its type
**numba** (:func:`numba_hooks`)
``CFunc._sig``, ``Signature``'s       refuse a ``numba.cfunc`` whose signature is not
slots, interned types                  ``void(voidptr)``; ``host_launch.c`` reads the
                                       slots (``_args``, ``_return_type``, ``_recvr``,
                                       ``_pysig``) and compares numba's types by
                                       identity (numba interns them); anything else
                                       falls through to the Python path
``CFunc`` internals                    ``_targetdescr``, ``_cache``, ``_cache_hits``,
                                       ``_compile_uncached``, ``_library``,
                                       ``_wrapper_name``, ``_wrapper_address``: a host
                                       function is a ``CFunc`` compiled with a named CPU
                                       context, whose Environment is registered (inv. 13)
``_CFuncCompiler._customize_flags``    compile a lifted ``objmode`` block
``compiler.Flags._values``, the        read ``no_compile`` and ``force_pyobject`` of the
``TargetConfig`` override              flags, and override ``no_compile`` with a property
                                       set after the class is made (numba's
                                       ``TargetConfig`` metaclass makes one per option)
``BaseContext.subtarget``, a           a copy of numba's CPU context whose ``repr`` names
``__class__`` swap                     the host function in numba's exception reports
``numba.core.serialize.dumps``        key a dtype= wrapper's cache entry by ``py_func``'s
                                       closure, as numba keys ``py_func``'s own
``Cache._index_key``, ``_cache`` of   key a host function's cache entry by its numba
a ``CFunc`` and a ``Dispatcher``       options too (numba keys bytecode and closure only)
``codegen.set_env``, ``env_name``      register a cfunc's Environment under its
                                       ``fndesc.env_name`` (numba does it only for functions
                                       with a CPython wrapper)
**the CUDA driver** (``native/driver.h``)
``cuStreamGetCaptureInfo``'s outs,     each called with one NULL more than its older form
``cuStreamGetCtx``'s                   takes (cuStreamGetCaptureInfo: CUDA 12.3+ has three
                                       optional outs after the graph, 12.0-12.2 two;
                                       cuStreamGetCtx's _v2, CUDA 12.5+, a green context):
                                       harmless in the C calling conventions of x86-64 and
                                       AArch64; only a driver older than the version the
                                       entry points are asked at (DRIVER_ABI_VERSION)
                                       gives the older forms
=====================================  =====================================================
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import sys
import threading
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

__all__ = [
    "CFuncPtr",
    "FUNCFLAG_CDECL",
    "FUNCFLAG_PYTHONAPI",
    "POINTER_PROTOTYPE",
    "PointerBase",
    "any_thread_pending_call",
    "cfunc_signature",
    "hooks",
    "is_jitted",
    "numba_cfunc_type",
    "numba_hooks",
    "pointer_address",
    "pointer_flags",
    "pointer_prototype",
    "register_first_atexit",
    "running_loop",
    "text_signature",
]

#: Base class of every ctypes function pointer.
CFuncPtr: type = ctypes._CFuncPtr
#: Base class of ctypes' ``POINTER(T)`` types.
PointerBase: type = ctypes._Pointer
#: The calling-convention flags of a ``CFUNCTYPE`` and a ``PYFUNCTYPE`` pointer.
FUNCFLAG_CDECL: int = ctypes._FUNCFLAG_CDECL
FUNCFLAG_PYTHONAPI: int = ctypes._FUNCFLAG_PYTHONAPI

_c_void_p = ctypes.c_void_p


#: ctypes' own reads of a function pointer's prototype, the one its calls use: the
#: ``restype`` and ``argtypes`` data descriptors of ``_CFuncPtr``.  An attribute of that
#: name set on a prototype class hides them from ``fn.restype``, not from ctypes' calls.
POINTER_PROTOTYPE: tuple[Any, Any] = (vars(CFuncPtr)["restype"], vars(CFuncPtr)["argtypes"])


def pointer_prototype(fn: Any) -> tuple[Any, Any]:
    """A ctypes function pointer's ``(restype, argtypes)``, as its calls use them (the
    instance's own, where it set them, else its prototype class's)."""
    restype, argtypes = POINTER_PROTOTYPE
    cls = type(fn)
    return restype.__get__(fn, cls), argtypes.__get__(fn, cls)


def pointer_flags(fn: Any) -> int:
    """A ctypes function pointer's calling-convention flags (its prototype's ``_flags_``)."""
    return type(fn)._flags_


def text_signature(fn: Any) -> str | None:
    """A builtin's ``__text_signature__`` (what ``inspect.signature`` parses), or None."""
    return getattr(fn, "__text_signature__", None)


def pointer_address(fn: Any) -> int | None:
    """A ctypes function pointer's address: its buffer is the pointer itself (what
    ``ctypes.cast(fn, c_void_p)`` gives, in a third of the time)."""
    return _c_void_p.from_buffer(fn).value


def register_first_atexit(
    fn: Callable[[], None], to_front: Callable[[Callable[[], None]], None]
) -> bool:
    """Run ``fn`` at exit once the non-daemon threads have ended, before every
    ``atexit`` handler registered until exit began; False if this Python can only
    run it as an ordinary ``atexit`` handler.

    ``threading._shutdown`` (3.10-3.13 alike) runs threading's exit hooks first,
    *then* joins the non-daemon threads, and ``Py_FinalizeEx`` runs the ``atexit``
    handlers (last registered, first run) after that.  So ``fn`` is an ``atexit``
    handler, and a threading exit hook moves it to the front of the stack when exit
    begins.  The hook does not join the threads itself: a threading hook registered
    before it (``concurrent.futures``' ``_python_exit``) runs after it and is what
    wakes a ``ThreadPoolExecutor``'s idle workers, so joining first would hang.
    Only an ``atexit`` handler registered after exit began (by a thread still
    running then) runs before ``fn``.  ``to_front(fn)`` is that move:
    ``_core.to_front_of_atexit``, one native call, so that no Ctrl-C lands between
    its unregister and its register (passed in: the core is a layer above this).
    """
    atexit.register(fn)
    try:
        threading._register_atexit(functools.partial(to_front, fn))
    except AttributeError:  # no such hook: an ordinary atexit handler
        return False
    except RuntimeError:  # exit has begun already
        # On the main thread that means the atexit handlers are running (the
        # non-daemon threads have ended): atexit never calls a handler registered
        # while they run, so ``fn`` would never run at all.  Run it now, where it
        # would have run, before the rest of this handler and every later one.  (A
        # non-daemon thread still running after the main thread returned registers
        # before the atexit handlers run, and ``fn`` then runs as an ordinary one.)
        if threading.current_thread() is threading.main_thread():
            fn()
        return False
    return True


def any_thread_pending_call() -> tuple[int, int] | None:
    """On Python 3.12: ``(address of _PyEval_AddPendingCall, main interpreter)``.

    Elsewhere None: 3.13 fixed ``Py_AddPendingCall`` (it wakes the main thread
    from any thread); 3.10 and 3.11 have no call that does.
    """
    if sys.version_info[:2] != (3, 12):
        return None
    api = ctypes.pythonapi
    main = ctypes.CFUNCTYPE(ctypes.c_void_p)(("PyInterpreterState_Main", api))
    return ctypes.cast(api._PyEval_AddPendingCall, ctypes.c_void_p).value, main()


def running_loop() -> Any:
    """The event loop running on this thread, or None (never raises).

    ``asyncio._get_running_loop``: public ``get_running_loop`` raises without a
    loop, and a pending call runs on whatever the thread was doing.  In asyncio
    since 3.7, for event loop implementations.  No loop can run before asyncio is
    imported, so this imports nothing: a first launch does not pay for asyncio.
    """
    # asyncio half imported (a pending call run inside its import) has no
    # _get_running_loop yet, and runs no loop either.
    get = getattr(sys.modules.get("asyncio"), "_get_running_loop", None)
    return None if get is None else get()


# ---- numba: imported only when a compiled function is made or passed in ----


class _NotImported:
    """Stands for a numba type while numba is not imported: nothing is an instance."""


def numba_cfunc_type() -> type:
    """numba's ``CFunc`` (what ``numba.cfunc`` makes), without importing numba: while
    numba is not imported, nothing can be one."""
    module = sys.modules.get("numba.core.ccallback")
    return module.CFunc if module is not None else _NotImported


_jitted = None


def is_jitted(fn: Any) -> bool:
    """Whether ``fn`` is a numba dispatcher (``numba.njit``), without importing numba."""
    global _jitted
    if _jitted is None:
        if "numba" not in sys.modules:
            return False
        from numba.extending import is_jitted as _jitted
    return _jitted(fn)


def cfunc_signature(fn: Any) -> Any:
    """A numba cfunc's signature."""
    return fn._sig


@functools.cache
def numba_hooks() -> SimpleNamespace:
    """numba's internals that a host function is compiled with, built once, on
    first use (importing numba): ``NamedCFunc``, ``carray``, ``types``,
    ``intrinsic``, ``cgutils``, ``njit``, ``signature`` (``void(voidptr)``) and
    ``cache_dumps`` (numba's pickling of a closure for its cache keys), ``keyed_cache``
    and ``cache_keyed`` (an on-disk cache keyed by the options too), and ``config``."""
    import numba
    from numba import carray, types
    from numba.core import cgutils, compiler, config, serialize
    from numba.core.caching import FunctionCache
    from numba.core.ccallback import CFunc, _CFuncCompiler
    from numba.core.compiler_lock import global_compiler_lock
    from numba.core.cpu import CPUContext
    from numba.core.registry import cpu_target
    from numba.extending import intrinsic

    signature = types.void(types.voidptr)

    class NamedCPUContext(CPUContext):
        """numba's CPU context, but its repr (in exception reports) names a host function."""

        _numba_hostfn_label = "host function"

        def __repr__(self) -> str:
            return self._numba_hostfn_label

    class NamedTarget:
        """A target descriptor that hands numba's compiler a named copy of the CPU context."""

        def __init__(self, label: str) -> None:
            self._label = label
            self._local = threading.local()
            self.options = cpu_target.options

        @property
        def typing_context(self):
            return cpu_target.typing_context

        @property
        def target_context(self):
            base = cpu_target.target_context  # the nested context, if numba is nesting
            cached = getattr(self._local, "context", None)
            if cached is None or cached[0] is not base:
                named = base.subtarget()
                named.__class__ = NamedCPUContext
                named._numba_hostfn_label = self._label
                cached = self._local.context = (base, named)
            return cached[1]

    class HostFunctionFlags(compiler.Flags):
        """A cfunc's compiler flags, except that a lifted ``objmode`` block gets compiled.

        numba compiles a cfunc with ``no_compile`` set (it adds the C wrapper before
        the module is finalized).  ``with numba.objmode():`` lifts its block into a
        dispatcher compiled in object mode with a copy of these flags; with
        ``no_compile`` still set, that dispatcher gets no entry point and numba
        fails with "must be builtin_function_or_method".  So an object-mode compile
        (``force_pyobject``) reads ``no_compile`` as false.
        """

    def no_compile(flags: compiler.Flags) -> bool:
        values = flags._values
        return bool(values.get("no_compile", False)) and not values.get("force_pyobject", False)

    def set_no_compile(flags: compiler.Flags, value: bool) -> None:
        flags._values["no_compile"] = bool(value)

    # Set after the class is made: numba's TargetConfig metaclass makes a plain
    # property for every option of a new class.
    HostFunctionFlags.no_compile = property(no_compile, set_no_compile)

    class HostFunctionCompiler(_CFuncCompiler):
        def _customize_flags(self, flags: compiler.Flags) -> compiler.Flags:
            return HostFunctionFlags(super()._customize_flags(flags))

    class OptionsKeyedCache(FunctionCache):
        """numba's on-disk cache of a function, keyed by its options too.

        numba keys a cached function by its bytecode and closure only: two host
        functions of one body with other options (``boundscheck``, ``error_model``,
        ``fastmath``, ``debug``) would share one entry, and the second load the first's
        machine code, in the same process too.  ``key`` (a string) tells them apart."""

        def __init__(self, py_func: Callable, key: str) -> None:
            super().__init__(py_func)
            self._numba_hostfn_key = key

        def _index_key(self, sig, codegen):
            return (*super()._index_key(sig, codegen), self._numba_hostfn_key)

    def keyed_cache(py_func: Callable, key: str) -> OptionsKeyedCache:
        """numba's on-disk cache of ``py_func``, keyed by ``key`` too; it raises
        (numba's RuntimeError, or an ImportError or OSError from a locator) where
        numba finds no place to cache a function of ``py_func``'s file."""
        return OptionsKeyedCache(py_func, key)

    def cache_keyed(dispatcher: Any, cache: OptionsKeyedCache) -> None:
        """Cache ``dispatcher`` (a jitted function or cfunc) on disk in ``cache``
        (:func:`keyed_cache` of its function): what ``enable_caching`` sets."""
        dispatcher._cache = cache

    class NamedCFunc(CFunc):
        """numba's cfunc, named after the host function, with its Environment registered.

        A compiled body that boxes a value (``print(x)``, an ``objmode`` block)
        reads its numba *Environment* through a global that numba fills only for
        functions with a CPython wrapper; a cfunc has none, so the global stays
        NULL, and numba's generated check then returns from inside ``print``'s GIL
        block with the GIL still held (LIFETIME.md, invariant 13).  ``compile``
        registers the Environment and keeps it alive with the machine code.
        """

        def __init__(self, pyfunc: Callable, label: str, options: dict) -> None:
            self._targetdescr = NamedTarget(label)
            super().__init__(pyfunc, (signature.args, signature.return_type), {}, options)
            self._compiler = HostFunctionCompiler(
                pyfunc, self._targetdescr, options, {}, pipeline_class=compiler.Compiler
            )
            self._environment = None

        @global_compiler_lock
        def compile(self) -> None:
            # CFunc.compile, keeping the CompileResult's environment.
            cres = self._cache.load_overload(self._sig, self._targetdescr.target_context)
            if cres is None:
                cres = self._compile_uncached()
                self._cache.save_overload(self._sig, cres)
            else:
                self._cache_hits += 1
            self._library = cres.library
            self._wrapper_name = cres.fndesc.llvm_cfunc_wrapper_name
            self._wrapper_address = self._library.get_pointer_to_function(self._wrapper_name)
            self._environment = cres.environment  # set_env stores only its address
            self._library.codegen.set_env(cres.fndesc.env_name, cres.environment)

    return SimpleNamespace(
        NamedCFunc=NamedCFunc,
        carray=carray,
        types=types,
        intrinsic=intrinsic,
        cgutils=cgutils,
        njit=numba.njit,
        signature=signature,
        cache_dumps=serialize.dumps,
        keyed_cache=keyed_cache,
        cache_keyed=cache_keyed,
        config=config,
    )


def hooks() -> dict[str, bool]:
    """Each private hook, and whether this process has it (``tests/test_compat.py``).

    The numba hooks import numba.
    """
    import asyncio

    from numba.core import compiler
    from numba.core.caching import Cache
    from numba.core.ccallback import CFunc, _CFuncCompiler
    from numba.core.dispatcher import Dispatcher
    from numba.core.registry import cpu_target

    context = cpu_target.target_context
    cfunc_names = ("_sig", "_targetdescr", "_cache", "_compile_uncached", "_cache_hits")
    return {
        "threading._register_atexit": hasattr(threading, "_register_atexit"),
        "asyncio._get_running_loop": callable(getattr(asyncio, "_get_running_loop", None)),
        "_PyEval_AddPendingCall (3.12)": sys.version_info[:2] != (3, 12)
        or hasattr(ctypes.pythonapi, "_PyEval_AddPendingCall"),
        "PyThreadState_GetUnchecked or its old name": any(
            hasattr(ctypes.pythonapi, n)
            for n in ("PyThreadState_GetUnchecked", "_PyThreadState_UncheckedGet")
        ),
        "ctypes._CFuncPtr, _Pointer": all(
            isinstance(getattr(ctypes, n, None), type) for n in ("_CFuncPtr", "_Pointer")
        ),
        "ctypes._FUNCFLAG_CDECL, _FUNCFLAG_PYTHONAPI": all(
            isinstance(getattr(ctypes, n, None), int)
            for n in ("_FUNCFLAG_CDECL", "_FUNCFLAG_PYTHONAPI")
        ),
        "a function pointer's buffer is the pointer": pointer_address(
            ctypes.CFUNCTYPE(None)(0x1234)
        )
        == 0x1234,
        "CFUNCTYPE caching": ctypes.CFUNCTYPE(None, ctypes.c_void_p)
        is ctypes.CFUNCTYPE(None, ctypes.c_void_p),
        "numba CFunc._sig, _targetdescr, _cache, _cache_hits, _compile_uncached": all(
            hasattr(CFunc, name) or name in CFunc.__init__.__code__.co_names for name in cfunc_names
        ),
        "numba _CFuncCompiler._customize_flags": hasattr(_CFuncCompiler, "_customize_flags"),
        "numba compiler.Flags._values": hasattr(compiler.Flags(), "_values"),
        "numba BaseContext.subtarget": hasattr(context, "subtarget"),
        "numba codegen.set_env": hasattr(context.codegen(), "set_env"),
        "numba Cache._index_key, Dispatcher._cache": hasattr(Cache, "_index_key")
        and "_cache" in Dispatcher.enable_caching.__code__.co_names,
    }
