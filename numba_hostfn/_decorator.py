"""``@host_callback``: compile ``fn(user_data)`` into a GIL-free ``CUhostFn`` with numba.

The body is compiled with :func:`numba.cfunc` to ``void(void*)`` in nopython
mode, by default with ``error_model='numpy'``.  Two things differ from a plain cfunc:

* numba reports an exception raised inside a cfunc as coming from
  ``'<numba.core.cpu.CPUContext ...>'``; a host function is compiled with a
  copy of numba's CPU context whose ``repr`` is the function's name, so the
  report names the host function instead (the copy shares numba's codegen,
  typing and caches: ``BaseContext.subtarget``);
* with ``dtype=``, the body receives a typed view of the user data (a record
  for a structured dtype, a one-element array otherwise) through a small
  wrapper, ``carray(p, (1,), dtype)``.
"""

from __future__ import annotations

import builtins
import ctypes
import dis
import inspect
import sys
import threading
import types as pytypes
from collections.abc import Callable
from typing import Any

import numba
import numpy as np
from numba import carray, types

from ._compat import (
    CFunc,
    CFuncCompiler,
    CPUContext,
    compiler,
    cpu_target,
    flag_value,
    global_compiler_lock,
    set_flag_value,
)
from ._errors import HostCallbackCompileError
from ._userdata import resolve_user_data

__all__ = ["CUhostFn", "HostFunction", "host_callback"]

#: The driver's host-function type, ``void (*)(void *)``, as a ctypes prototype.
CUhostFn = ctypes.CFUNCTYPE(None, ctypes.c_void_p)

_SIGNATURE = types.void(types.voidptr)
_MISSING = object()  # HostFunction.__call__ without user_data


class _NamedCPUContext(CPUContext):
    """numba's CPU context, but its repr (used in exception reports) names a host function."""

    _numba_hostfn_label = "host function"

    def __repr__(self) -> str:
        return self._numba_hostfn_label


class _NamedTarget:
    """A target descriptor that hands numba's compiler a named copy of the CPU context."""

    def __init__(self, label: str) -> None:
        self._label = label
        self._local = threading.local()
        self.options = cpu_target.options

    @property
    def typing_context(self):  # noqa: D401 - mirrors numba's TargetDescriptor
        return cpu_target.typing_context

    @property
    def target_context(self):
        base = cpu_target.target_context  # the nested context, if numba is nesting
        cached = getattr(self._local, "context", None)
        if cached is None or cached[0] is not base:
            named = base.subtarget()
            named.__class__ = _NamedCPUContext
            named._numba_hostfn_label = self._label
            cached = self._local.context = (base, named)
        return cached[1]


class _HostFunctionFlags(compiler.Flags):
    """A cfunc's compiler flags, except that a lifted ``objmode`` block gets compiled.

    numba compiles a cfunc with ``no_compile`` set (it adds the C wrapper before
    the module is finalized).  ``with numba.objmode():`` lifts its block into a
    dispatcher compiled in object mode with a copy of these flags; with
    ``no_compile`` still set, that dispatcher gets no entry point and numba fails
    with "must be builtin_function_or_method".  So an object-mode compile
    (``force_pyobject``) reads ``no_compile`` as false.
    """


def _no_compile(flags: compiler.Flags) -> bool:
    return bool(flag_value(flags, "no_compile")) and not flag_value(flags, "force_pyobject")


def _set_no_compile(flags: compiler.Flags, value: bool) -> None:
    set_flag_value(flags, "no_compile", bool(value))


# Set after the class is made: numba's TargetConfig metaclass makes a plain
# property for every option of a new class.
_HostFunctionFlags.no_compile = property(_no_compile, _set_no_compile)


class _HostFunctionCompiler(CFuncCompiler):
    def _customize_flags(self, flags: compiler.Flags) -> compiler.Flags:
        return _HostFunctionFlags(super()._customize_flags(flags))


class _NamedCFunc(CFunc):
    """numba's cfunc, named after the host function, with its Environment registered.

    A compiled body that boxes a value (``print(x)``, an ``objmode`` block)
    reads its numba *Environment* through a global that numba fills only for
    functions with a CPython wrapper (``CPUContext.get_executable``); a cfunc
    has none, so the global stays NULL.  numba's generated check then returns
    from inside ``print``'s GIL block with an exception *and the GIL still
    held*: the host-function thread keeps the GIL for ever and every Python
    thread stops (LIFETIME.md, invariant 13).  ``compile`` registers the
    Environment and keeps it alive with the machine code.
    """

    def __init__(self, pyfunc: Callable, label: str, options: dict) -> None:
        self._targetdescr = _NamedTarget(label)
        super().__init__(pyfunc, (_SIGNATURE.args, _SIGNATURE.return_type), {}, options)
        self._compiler = _HostFunctionCompiler(
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


def _direct_caller(target: Callable, options: dict) -> Callable[[int], None]:
    """``target(p)`` as a jitted function of an address that raises in its caller."""
    from ._intrinsics import as_voidptr

    body = numba.njit(target, nogil=True, **options)

    @numba.njit(nogil=True, **options)
    def direct(address):
        body(as_voidptr(address))

    return direct


def _record_view(p):
    body(carray(p, (1,), layout)[0])  # noqa: F821 - globals supplied by _view_wrapper


def _array_view(p):
    body(carray(p, (1,), layout))  # noqa: F821 - globals supplied by _view_wrapper


def _view_wrapper(py_func: Callable, body: Callable, layout: np.dtype) -> Callable:
    """Return ``wrapper(p)`` that calls ``body`` on a typed view of ``p``.

    The wrapper is a template re-homed to ``py_func``'s file, line and name,
    with ``body`` and ``layout`` as globals rather than a closure: numba's
    on-disk cache then stores it beside ``py_func`` and invalidates it when
    that file changes (a closure would be keyed by a pickle of the dispatcher,
    which differs from one process to the next).
    """
    template = _record_view if layout.names is not None else _array_view
    origin = py_func.__code__
    qualname = f"{py_func.__qualname__}.host_view"
    code = template.__code__.replace(
        co_filename=origin.co_filename,
        co_firstlineno=origin.co_firstlineno,
        co_name=py_func.__name__,
    )
    if sys.version_info >= (3, 11):
        code = code.replace(co_qualname=qualname)
    scope = {"body": body, "carray": carray, "layout": layout, "__builtins__": builtins}
    wrapper = pytypes.FunctionType(code, scope, py_func.__name__)
    wrapper.__qualname__ = qualname
    wrapper.__module__ = py_func.__module__
    return wrapper


# Instructions that name a local without reading it.
_STORES = frozenset({"STORE_FAST", "STORE_FAST_MAYBE_NULL"})


def reads_its_argument(py_func: Callable) -> bool:
    """Whether ``py_func``'s code may read its first parameter (user_data).

    Read off the bytecode, conservatively: any instruction that names the
    parameter, other than a plain store, counts as a read (so does a closure
    over it).  A body that never names it cannot follow the pointer.
    """
    code = py_func.__code__
    name = code.co_varnames[0]
    if name in code.co_cellvars:
        return True
    for instruction in dis.get_instructions(code):
        if instruction.opname in _STORES:
            continue
        named = instruction.argval
        if named == name or (isinstance(named, tuple) and name in named):
            if "FAST" in instruction.opname or "DEREF" in instruction.opname:
                return True
            if "CLOSURE" in instruction.opname:
                return True
    return False


def _check_layout(dtype: Any) -> np.dtype | None:
    if dtype is None:
        return None
    try:
        layout = np.dtype(dtype)
    except TypeError as exc:
        raise TypeError(f"host_callback(dtype=...) expected a numpy dtype, got {dtype!r}") from exc
    if layout.hasobject:
        raise TypeError(f"host_callback(dtype=...) cannot hold Python objects: {layout}")
    if layout.itemsize == 0:
        raise ValueError(f"host_callback(dtype=...) needs a non-empty dtype, got {layout}")
    return layout


class HostFunction:
    """A Python function compiled to a ``CUhostFn`` that runs without the GIL.

    Made by :func:`host_callback`; launched with :func:`host_launch`.  Threading
    rules: docs/threading.md.

    Attributes
    ----------
    address : int
        The ``void (*)(void *)`` machine-code address (read-only).
    py_func : callable
        The original Python function.
    dtype : numpy.dtype or None
        The declared user_data layout, if any (read-only).
    reads_user_data : bool
        Whether the body reads its argument (read-only): then ``user_data=None``,
        which would give it NULL, is refused at launch.
    """

    def __init__(
        self,
        py_func: Callable,
        *,
        dtype: Any = None,
        cache: bool = False,
        fastmath: bool = False,
        boundscheck: bool | None = None,
        debug: bool = False,
        error_model: str = "numpy",
    ) -> None:
        if not inspect.isfunction(py_func):
            raise TypeError(
                f"host_callback expected a Python function, got {type(py_func).__name__}"
            )
        try:
            inspect.signature(py_func).bind(None)
        except TypeError:
            raise TypeError(
                f"host function {py_func.__qualname__!r} must take exactly one argument, "
                "user_data: def fn(user_data): ..."
            ) from None
        self.py_func = py_func
        self._dtype = _check_layout(dtype)
        self._reads_user_data = self._dtype is not None or reads_its_argument(py_func)
        self.__name__ = py_func.__name__
        self.__qualname__ = py_func.__qualname__
        self.__module__ = py_func.__module__
        self.__doc__ = py_func.__doc__
        self.__wrapped__ = py_func
        label = f"host function {py_func.__module__}.{py_func.__qualname__}"
        options = _numba_options(fastmath, boundscheck, debug, error_model)
        try:
            if self._dtype is None:
                target = py_func
            else:
                body = numba.njit(py_func, cache=cache, **options)
                target = _view_wrapper(py_func, body, self._dtype)
            cfunc = _NamedCFunc(target, label, {"nopython": True, **options})
            if cache:
                cfunc.enable_caching()
            cfunc.compile()
        except Exception as exc:  # numba raises more than NumbaError (TypeError, ...)
            error = HostCallbackCompileError(
                f"cannot compile host function {py_func.__qualname__!r} "
                f"({py_func.__code__.co_filename}:{py_func.__code__.co_firstlineno}) "
                f"with numba:\n{exc}"
            )
            error.numba_error = exc
            raise error from None
        self._cfunc = cfunc
        self._address: int = cfunc.address
        self._ctypes = None
        self._target, self._options, self._direct = target, options, None

    # Read-only: both are fixed for the function's life, which lets host_launch's
    # fast path remember them per function (_fastpath.learn_host_function).
    @property
    def address(self) -> int:
        """The ``void (*)(void *)`` machine-code address."""
        return self._address

    @property
    def dtype(self) -> Any:
        """The declared user_data layout (a numpy dtype), or None."""
        return self._dtype

    @property
    def reads_user_data(self) -> bool:
        """Whether the body reads its argument (then ``user_data=None`` is refused)."""
        return self._reads_user_data

    @property
    def ctypes(self) -> Any:
        """A ``CFUNCTYPE(None, c_void_p)`` pointer to the code that keeps it alive.

        cuda.core's ``GraphBuilder.callback`` and ``GraphNode.callback`` accept
        it unchanged.
        """
        if self._ctypes is None:
            pointer = CUhostFn(self.address)
            pointer._numba_hostfn_owner = self  # the pointer keeps the code alive
            self._ctypes = pointer
        return self._ctypes

    @property
    def cache_hits(self) -> int:
        """How many times the machine code was loaded from numba's on-disk cache."""
        return self._cfunc.cache_hits

    def inspect_llvm(self) -> str:
        """Return the LLVM IR of the compiled function and its C wrapper."""
        return self._cfunc.inspect_llvm()

    def __call__(self, user_data: Any = _MISSING) -> None:
        """Run the body now, on the calling thread (GIL released), and raise what it raises.

        ``user_data`` is required, and takes the forms :func:`host_launch`
        accepts, checked the same way: against the declared ``dtype``, and
        ``None`` only for a body that does not read it.  The body is the same
        numba code with the same options, compiled once more (on the first
        direct call) as a jitted function, so that an exception propagates to
        the caller: a host function can be unit-tested with ``pytest.raises``.
        On a stream, where nobody can catch it, the exception is reported to
        ``sys.unraisablehook`` instead.
        """
        if user_data is _MISSING:
            raise TypeError(
                f"host function {self.__qualname__!r} takes one argument, user_data: call "
                "it as fn(user_data) with what a launch would pass (nh.by_ref(array), "
                "bytes, an int address; None only if its body does not read it)"
            )
        address, owner = resolve_user_data(user_data, self.dtype, self, self._reads_user_data)
        if self._direct is None:
            self._direct = _direct_caller(self._target, self._options)
        try:
            self._direct(address)
        finally:
            del owner

    def __repr__(self) -> str:
        layout = "" if self.dtype is None else f", dtype={self.dtype}"
        return f"<HostFunction {self.__module__}.{self.__qualname__} at {self.address:#x}{layout}>"


#: numba options that make no sense for a host function, and why.
_REFUSED_OPTIONS = {
    "nopython": "a host function is always compiled in nopython mode",
    "forceobj": "a host function is always compiled in nopython mode",
    "looplift": "a host function is always compiled in nopython mode",
    "nogil": "a host function never holds the GIL",
    "parallel": "a host function runs on one thread; for parallel host work use a HostExecutor",
    "target": "a host function is CPU code, called by the CUDA driver",
    "device": "a host function is CPU code, called by the CUDA driver",
    "signature": "a host function's signature is always void(void*)",
}


def _numba_options(fastmath: Any, boundscheck: Any, debug: Any, error_model: Any) -> dict:
    """The numba options of a host function, checked."""
    if error_model not in ("numpy", "python"):
        raise ValueError(
            f"host_callback(error_model=...) expected 'numpy' or 'python', got {error_model!r}"
        )
    if boundscheck is not None and not isinstance(boundscheck, bool):
        raise TypeError(
            f"host_callback(boundscheck=...) expected True, False or None, got {boundscheck!r}"
        )
    options = {"error_model": error_model, "fastmath": fastmath, "debug": bool(debug)}
    if boundscheck is not None:  # None: numba's default (NUMBA_BOUNDSCHECK)
        options["boundscheck"] = boundscheck
    return options


def host_callback(
    func: Callable | None = None,
    /,
    *,
    dtype: Any = None,
    cache: bool = False,
    fastmath: bool = False,
    boundscheck: bool | None = None,
    debug: bool = False,
    error_model: str = "numpy",
    **options: Any,
) -> HostFunction | Callable[[Callable], HostFunction]:
    """Compile ``func(user_data)`` into a :class:`HostFunction` that runs without the GIL.

    Use as ``@host_callback`` or ``@host_callback(dtype=..., cache=True)``.  The
    body is compiled by numba in nopython mode, by default with
    ``error_model='numpy'``, so division by zero gives inf/nan instead of
    raising.  The body stays GIL-free unless it raises, prints, enters
    ``objmode``, or an allocation fails: each of those takes the GIL
    (docs/threading.md).  A host function must not call CUDA.

    Parameters
    ----------
    func : callable
        ``def func(user_data): ...``.  Without ``dtype``, ``user_data`` is a raw
        ``void*`` (use ``numba.carray`` to view it); with ``dtype``, see below.
    dtype : numpy dtype, optional
        The layout of the user data.  A structured dtype gives the body a
        record (``user_data.field``); a scalar dtype a one-element array
        (``user_data[0]``).  :func:`host_launch` then checks the user data
        against it and rejects ``None``.
    cache : bool, optional
        Cache the machine code on disk (numba's cache), so a later process
        loads it instead of compiling.
    fastmath : bool or set of str, optional
        Passed to numba: allow floating-point reassociation and the like.
    boundscheck : bool, optional
        Check array indices (an out-of-bounds index raises ``IndexError``,
        reported like any failure in a host function).  ``None``: numba's
        default, the ``NUMBA_BOUNDSCHECK`` environment variable (off).
    debug : bool, optional
        Passed to numba: debug information in the machine code.
    error_model : {'numpy', 'python'}, optional
        ``'numpy'`` (the default): a division by zero gives inf or nan for
        floats and 0 for integers, and raises nothing.  ``'python'``: it
        raises ``ZeroDivisionError``, which takes the GIL to report it.

    Returns
    -------
    HostFunction

    Raises
    ------
    HostCallbackCompileError
        If numba cannot compile the body; the message names the function.
    TypeError
        If ``func`` is not a one-argument Python function, or ``dtype`` is not
        a numpy dtype without objects.

    Examples
    --------
    >>> import numpy as np
    >>> from numba import carray
    >>> @host_callback
    ... def double(p):
    ...     a = carray(p, (4,), np.float64)
    ...     for i in range(4):
    ...         a[i] *= 2
    >>> x = np.arange(4.0)
    >>> double(by_ref(x)); x
    array([0., 2., 4., 6.])
    """
    for name in options:
        why = _REFUSED_OPTIONS.get(name, "numba_hostfn does not pass it to numba")
        raise TypeError(
            f"host_callback() does not take the option {name!r}: {why}. It takes dtype, "
            "cache, fastmath, boundscheck, debug and error_model"
        )
    _numba_options(fastmath, boundscheck, debug, error_model)  # refuse bad values early
    settings = {
        "dtype": dtype,
        "cache": cache,
        "fastmath": fastmath,
        "boundscheck": boundscheck,
        "debug": debug,
        "error_model": error_model,
    }
    if func is None:
        return lambda f: HostFunction(f, **settings)
    return HostFunction(func, **settings)
