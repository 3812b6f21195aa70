"""Every private API numba_hostfn relies on, in one place: why, and where it was checked.

The rest of the package reaches these only through this module, so a release of
Python, numba or ctypes that moves one breaks here, by name, and nowhere else.
``tests/test_compat.py`` checks that each is still there and that no other
module imports a private name.  Checked on Python 3.11 (CI) and 3.12 (GPU
image), with numba 0.62.0, llvmlite 0.45.0, numpy 1.24.4, cuda-bindings 13.0.0
and cuda-core 1.2.0 (the oldest that pyproject declares: CI runs the suite
against them, ``.ci/oldest.txt``), numba 0.68.0 (GPU image) and 0.68.1 (CI,
newest).  numba 0.61 cannot work: its llvmlite 0.44 (LLVM 15) does not parse
the opaque pointers (``ptr``) of the native layer's IR.
docs/compatibility.md has the table.

================================  ==========================================================
hook                              why
================================  ==========================================================
``threading._register_atexit``    close the launch records before any ``atexit`` handler,
                                  which may block in a driver call holding the GIL while the
                                  driver's thread waits for the GIL (LIFETIME.md, inv. 6);
                                  ``atexit`` is the fallback if it is missing
``ctypes._CFuncPtr``,             recognise any ctypes function pointer (a ``CUhostFn``, or
``ctypes._Pointer``               one of another prototype to refuse), and refuse pointers
                                  as ``user_data``; ctypes has no public base classes
``ctypes._FUNCFLAG_CDECL``,       check a pointer's calling convention: a ``CUhostFn`` is
``_FUNCFLAG_PYTHONAPI``           ``cdecl`` and not a ``PYFUNCTYPE``
numba ``CFunc._sig``              refuse a ``numba.cfunc`` whose signature is not
                                  ``void(voidptr)``
numba ``CFunc`` internals         ``_targetdescr``, ``_cache``, ``_compile_uncached``,
                                  ``_library``, ``_wrapper_name``, ``_wrapper_address``: a
                                  host function is a ``CFunc`` compiled with a named CPU
                                  context, whose Environment is registered (inv. 13)
numba ``_CFuncCompiler``          its ``_customize_flags``: compile a lifted ``objmode`` block
``compiler.Flags._values``        read ``no_compile`` and ``force_pyobject`` of the flags
``BaseContext.subtarget``, a      a copy of numba's CPU context whose ``repr`` names the host
``__class__`` swap                function in numba's exception reports
``codegen.set_env``               register a cfunc's Environment (numba does it only for
                                  functions with a CPython wrapper)
``cpu_target`` codegen            compile the native layer (LLVM IR) with numba's own JIT
``PyCFunction_NewEx``             the enqueue builtin and ``host_launch`` itself: a
                                  ``METH_FASTCALL`` function over a ctypes ``PyMethodDef``
                                  (CPython's stable C API, reached through ctypes)
``PyObject.ob_type`` offset       ``host_launch``'s fast path reads ``Py_TYPE`` there
                                  (``native/host_launch.ll``); ``_fastpath`` checks it at
                                  first use and leaves the fast path off if it does not hold
``_PyThreadState_UncheckedGet``   the pre-3.13 name of ``PyThreadState_GetUnchecked``
``threading._DummyThread``        what ``current_thread()`` is on a thread Python did not
                                  start (the driver's, a pool's): 3.12 runs a pending call on
                                  any thread, and non-blocking callbacks never run on those
``_PyEval_AddPendingCall``        3.12 only: a pending call that any thread runs, with the
                                  eval breaker set at once; 3.12's ``Py_AddPendingCall``
                                  from a thread foreign to Python is seen only at the next
                                  GIL switch (non-blocking callbacks, ``native/notify.ll``)
``asyncio._get_running_loop``     in a pending call, the loop running on this thread, if any,
                                  whose ``async_done`` waits it resolves (the public
                                  ``get_running_loop`` raises without a loop; inv. 19)
================================  ==========================================================
"""

from __future__ import annotations

import asyncio
import ctypes
import sys
import threading
from collections.abc import Callable
from typing import Any

from numba.core import cgutils, compiler
from numba.core.ccallback import CFunc, _CFuncCompiler
from numba.core.compiler_lock import global_compiler_lock
from numba.core.cpu import CPUContext
from numba.core.registry import cpu_target

__all__ = [
    "CFunc",
    "CFuncCompiler",
    "CFuncPtr",
    "CPUContext",
    "FUNCFLAG_CDECL",
    "FUNCFLAG_PYTHONAPI",
    "PYTHON_ALIASES",
    "PointerBase",
    "any_thread_pending_call",
    "cfunc_signature",
    "cgutils",
    "compiler",
    "cpu_target",
    "flag_value",
    "global_compiler_lock",
    "hooks",
    "on_foreign_thread",
    "register_early_atexit",
    "set_flag_value",
]

#: Base class of every ctypes function pointer.
CFuncPtr: type = ctypes._CFuncPtr
#: Base class of ctypes' ``POINTER(T)`` types.
PointerBase: type = ctypes._Pointer
#: The calling-convention flags of a ``CFUNCTYPE`` and a ``PYFUNCTYPE`` pointer.
FUNCFLAG_CDECL: int = ctypes._FUNCFLAG_CDECL
FUNCFLAG_PYTHONAPI: int = ctypes._FUNCFLAG_PYTHONAPI
#: numba's compiler for a cfunc (subclassed: ``_decorator``).
CFuncCompiler = _CFuncCompiler
#: CPython functions the native layer declares, by their older names.
PYTHON_ALIASES = {"PyThreadState_GetUnchecked": ("_PyThreadState_UncheckedGet",)}


def register_early_atexit(fn: Callable[[], None]) -> bool:
    """Run ``fn`` at exit before ``atexit`` handlers; False if this Python cannot."""
    try:
        threading._register_atexit(fn)
    except (AttributeError, RuntimeError):  # no such hook, or already shutting down
        return False
    return True


def cfunc_signature(fn: CFunc) -> Any:
    """A numba cfunc's signature."""
    return fn._sig


def flag_value(flags: compiler.Flags, name: str) -> Any:
    """A compiler flag as set, without the defaults' property (``_decorator``)."""
    return flags._values.get(name, False)


def set_flag_value(flags: compiler.Flags, name: str, value: Any) -> None:
    flags._values[name] = value


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
    since 3.7, for event loop implementations.
    """
    return asyncio._get_running_loop()


def on_foreign_thread() -> bool:
    """True on a thread that Python did not start: a driver's or an executor's."""
    return isinstance(threading.current_thread(), threading._DummyThread)


def hooks() -> dict[str, bool]:
    """Each private hook, and whether this process has it (``tests/test_compat.py``)."""
    context = cpu_target.target_context
    return {
        "threading._register_atexit": hasattr(threading, "_register_atexit"),
        "asyncio._get_running_loop": callable(getattr(asyncio, "_get_running_loop", None)),
        "ctypes._CFuncPtr, _Pointer": all(
            isinstance(getattr(ctypes, n, None), type) for n in ("_CFuncPtr", "_Pointer")
        ),
        "ctypes._FUNCFLAG_CDECL, _FUNCFLAG_PYTHONAPI": all(
            isinstance(getattr(ctypes, n, None), int)
            for n in ("_FUNCFLAG_CDECL", "_FUNCFLAG_PYTHONAPI")
        ),
        "numba CFunc._sig, _targetdescr, _cache, _compile_uncached": all(
            hasattr(CFunc, name) or name in CFunc.__init__.__code__.co_names
            for name in ("_sig", "_targetdescr", "_cache", "_compile_uncached")
        ),
        "numba _CFuncCompiler._customize_flags": hasattr(_CFuncCompiler, "_customize_flags"),
        "numba compiler.Flags._values": hasattr(compiler.Flags(), "_values"),
        "numba BaseContext.subtarget": hasattr(context, "subtarget"),
        "numba codegen.set_env": hasattr(context.codegen(), "set_env"),
        "PyCFunction_NewEx": hasattr(ctypes.pythonapi, "PyCFunction_NewEx"),
        "threading._DummyThread": isinstance(getattr(threading, "_DummyThread", None), type),
        "_PyEval_AddPendingCall (3.12)": sys.version_info[:2] != (3, 12)
        or hasattr(ctypes.pythonapi, "_PyEval_AddPendingCall"),
        "PyThreadState_GetUnchecked or its old name": any(
            hasattr(ctypes.pythonapi, n)
            for n in ("PyThreadState_GetUnchecked", *PYTHON_ALIASES["PyThreadState_GetUnchecked"])
        ),
    }
