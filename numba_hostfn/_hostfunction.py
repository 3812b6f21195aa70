"""``@host_callback``: compile ``fn(user_data)`` with numba into a GIL-free ``CUhostFn``.

The body is compiled with :func:`numba.cfunc` to ``void(void*)`` in nopython
mode, by default with ``error_model='numpy'``.  Two things differ from a plain cfunc:

* numba reports an exception raised inside a cfunc as coming from
  ``'<numba.core.cpu.CPUContext ...>'``; a host function is compiled with a
  copy of numba's CPU context whose ``repr`` is the function's name, so the
  report names the host function instead (``_compat.numba_hooks``);
* with ``dtype=``, the body receives a typed view of the user data (a record
  for a structured dtype, a one-element array otherwise) through a small
  wrapper, ``carray(p, (1,), dtype)``.

numba is imported when the first host function is made, not with this module.
"""

from __future__ import annotations

import builtins
import ctypes
import dis
import enum
import functools
import inspect
import pickle
import sys
import types as pytypes
from collections.abc import Callable
from typing import Any

import numpy as np

from . import _core
from ._compat import numba_cfunc_type, numba_hooks
from ._errors import HostCallbackCompileError, keeps_nothing_on_refusal
from ._userdata import resolve_user_data

__all__ = ["SUSPENDING_FLAGS", "CUhostFn", "HostFunction", "host_callback"]

#: The driver's host-function type, ``void (*)(void *)``, as a ctypes prototype.
CUhostFn = ctypes.CFUNCTYPE(None, ctypes.c_void_p)

_MISSING = object()  # HostFunction.__call__ without user_data


def _numba() -> Any:
    """numba's hooks (importing numba), and the package's own numba helpers made
    now: a body's ``nh.as_voidptr`` is typed from the package's namespace, which
    numba reads directly (the package makes it lazily, so that importing it does
    not import numba)."""
    hooks = numba_hooks()
    sys.modules[__package__].as_voidptr  # noqa: B018 - the module's __getattr__ sets it
    return hooks


def _direct_caller(target: Callable, options: dict) -> Callable[[int], None]:
    """``target(p)`` as a jitted function of an address that raises in its caller."""
    from ._intrinsics import as_voidptr

    njit = numba_hooks().njit
    # Only the entry point releases the GIL: nogil on the body too made numba warn,
    # for a body with an objmode block, that object mode "won't allow parallel
    # execution despite nogil=True" (a failure under warnings-as-errors).
    body = njit(target, **options)

    @njit(nogil=True, **options)
    def direct(address):
        body(as_voidptr(address))

    return direct


# The views return what the body returns, so that a body returning a value fails
# to compile as void(void*) as it does without dtype= (then _refuse_a_result says why).
def _record_view(p):
    return body(carray(p, (1,), layout)[0])  # noqa: F821 - globals supplied by _view_wrapper


def _array_view(p):
    return body(carray(p, (1,), layout))  # noqa: F821 - globals supplied by _view_wrapper


def _stable(value: Any) -> str:
    """``value`` (a code object's constant, an option's value) as a string that is the
    same in every process: a set's order is not (it follows the string hash,
    randomized per process), nor is a code object's repr (its address)."""
    if isinstance(value, pytypes.CodeType):
        return repr((value.co_code, _stable(value.co_consts), value.co_names, value.co_varnames))
    if isinstance(value, (set, frozenset)):
        return f"{type(value).__name__}({sorted(_stable(v) for v in value)})"
    if isinstance(value, dict):
        return repr(sorted((_stable(k), _stable(v)) for k, v in value.items()))
    if isinstance(value, (tuple, list)):
        return f"{type(value).__name__}({[_stable(v) for v in value]})"
    return repr(value)


def _cache_key(py_func: Callable, options: dict) -> str:
    """What a cached host function's machine code depends on that numba's cache key
    leaves out: numba keys an entry by its function's bytecode (``co_code`` alone) and
    closure, so two host functions of one name and line (one factory, or lambdas on
    one line) with other numba options, constants or global names would share one
    entry, and the second load the first's machine code, in the same process too."""
    import hashlib  # here, not at import: OpenSSL's load is 3 ms of a 2-core start-up

    code = py_func.__code__
    parts = (
        _stable(options),
        _stable(code.co_consts),
        _stable(code.co_names),
        _frozen_globals(py_func, hashlib),
    )
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


#: Values numba compiles into the machine code as constants when a body reads them
#: from a global (their repr is the same in every process).
_PLAIN = (bool, int, float, complex, str, bytes, type(None), np.generic, np.dtype)


def _jitted(value: Any) -> bool:
    """Whether ``value`` is a jitted function (its ``py_func`` a Python function),
    asking so that an object whose ``__getattr__`` raises is just not one."""
    try:
        return inspect.isfunction(getattr(value, "py_func", None))
    except Exception:  # a proxy's __getattr__ may raise anything
        return False


#: How deep _frozen_globals follows the modules and classes the code names
#: (``pkg.sub.CONST``: 2).
_KEYED_DEPTH = 3


def _frozen_globals(py_func: Callable, hashlib: Any) -> str:
    """The values of the globals ``py_func`` reads, as numba freezes them into its
    machine code, as a string that is the same in every process for the same values.

    numba reads a global's value once, when it compiles, and keys its cache by the
    bytecode alone: a host function made again (in this process, or the next) after a
    global it reads changed would load the old value's code.  So the key holds, for
    each name the code (and code nested in it) names: a number, string, numpy scalar
    or dtype, enum member, tuple of those, or array (by its bytes), a class's or
    function's name, and for a jitted function it calls, its own code, options and
    globals, so that a callee edited in another file (which numba's cache does not
    notice) is compiled anew too.  Other objects count by their type's name only.
    The same for what a module or class it names holds under a name the code
    names, and so on down (``helpers.f()``, ``E.A``, ``pkg.sub.CONST``), a few
    levels deep (``_KEYED_DEPTH``).
    """
    seen: set[int] = set()
    walked: set[tuple[int, tuple[str, ...]]] = set()
    parts: list[str] = []

    def names_of(code: pytypes.CodeType) -> set[str]:
        names = set(code.co_names)
        for const in code.co_consts:
            if isinstance(const, pytypes.CodeType):
                names |= names_of(const)
        return names

    def describe(value: Any) -> str:
        if isinstance(value, _PLAIN):
            return f"{type(value).__qualname__}:{value!r}"
        if isinstance(value, enum.Enum):
            return f"{type(value).__module__}.{type(value).__qualname__}:{value.value!r}"
        if isinstance(value, tuple):
            return f"tuple({', '.join(map(describe, value))})"
        if isinstance(value, np.ndarray) and not value.dtype.hasobject:
            digest = hashlib.sha256(np.ascontiguousarray(value).tobytes()).hexdigest()
            return f"ndarray:{value.dtype!r}{value.shape}:{digest}"
        if isinstance(value, pytypes.ModuleType):
            return f"module:{value.__name__}"
        if _jitted(value):  # a numba dispatcher
            visit(value.py_func)
            options = _stable(getattr(value, "targetoptions", None))
            return f"jitted:{_stable(value.py_func.__code__)}:{options}"
        kind = type(value)
        if isinstance(value, (type, pytypes.FunctionType, pytypes.BuiltinFunctionType)):
            return f"{kind.__qualname__}:{value.__module__}.{value.__qualname__}"
        return f"object:{kind.__module__}.{kind.__qualname__}"

    def members(path: str, holder: Any, names: list[str], depth: int) -> None:
        # What a module or class holds under the names the code names, read with
        # vars(): no module __getattr__ or descriptor runs.
        if depth > _KEYED_DEPTH or not isinstance(holder, (pytypes.ModuleType, type)):
            return
        key = (id(holder), tuple(names))  # a callee may name other members of it
        if key in walked:
            return
        walked.add(key)
        attributes = vars(holder)
        for attribute in names:
            found = attributes.get(attribute, _MISSING)
            if found is not _MISSING:
                parts.append(f"{path}.{attribute}={describe(found)}")
                members(f"{path}.{attribute}", found, names, depth + 1)

    def visit(func: Callable) -> None:
        if id(func) in seen:
            return
        seen.add(id(func))
        scope = func.__globals__
        names = sorted(names_of(func.__code__))
        for name in names:
            if name not in scope:
                continue  # a builtin, or an attribute's name
            value = scope[name]
            parts.append(f"{name}={describe(value)}")
            members(name, value, names, 1)
        for cell in func.__closure__ or ():
            try:
                contents = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if _jitted(contents):
                describe(contents)  # a jitted callee's globals (numba keys the closure)

    visit(py_func)
    return "\n".join(parts)


def _keyed_cache(dispatcher: Any, target: Callable, key: str) -> None:
    """Cache ``dispatcher`` (a jitted function or cfunc of ``target``) on disk, its
    entries keyed by ``key`` (:func:`_cache_key`) as well as numba's own key."""
    hooks = numba_hooks()
    hooks.cache_keyed(dispatcher, hooks.keyed_cache(target, key))


def _check_cacheable(py_func: Callable) -> None:
    """Refuse ``cache=True`` for a function that numba finds no place to cache (made
    by ``exec`` or ``python -c``, or in a notebook cell without IPython): numba
    raised only when the cache was set up, and its "no locator available", "No module
    named 'IPython'" or "could not get source code" came as a compile error of a
    body that compiles."""
    try:
        numba_hooks().keyed_cache(py_func, "")
    except Exception as exc:  # numba's RuntimeError, a locator's ImportError or OSError
        code = py_func.__code__
        raise ValueError(
            f"host_callback(cache=True) cannot cache host function "
            f"{py_func.__qualname__!r}, defined in {code.co_filename!r}: numba caches "
            "the machine code of a function defined in a file (a module or script; an "
            f"IPython cell, with IPython) beside it, and found no place for this one "
            f"({type(exc).__name__}: {exc}). Make it without cache=True, or define it in "
            "a module"
        ) from None


def _view_key(py_func: Callable, layout: np.dtype) -> str:
    """What a cached wrapper's machine code depends on beyond its (template)
    bytecode: the layout and the contents of ``py_func``'s closure, as a short digest.

    numba keys a cached function by its bytecode and its own closure only (not by
    the functions it calls); the wrapper's are the template's, the same for every
    host function, so without this two host functions of one name and line (made
    by one factory, with another dtype or closure) would share one cache entry, and
    the second would load the first's machine code.  The closure is pickled as
    numba pickles ``py_func``'s own for its cache (``cache=True`` needs that anyway).
    """
    import hashlib

    parts = [pickle.dumps(layout, protocol=4)]
    if py_func.__closure__ is not None:
        cells = tuple(cell.cell_contents for cell in py_func.__closure__)
        parts.append(numba_hooks().cache_dumps(cells))  # as numba keys py_func's own
    return hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]


def _view_wrapper(py_func: Callable, body: Callable, layout: np.dtype, cache: bool) -> Callable:
    """Return ``wrapper(p)`` that calls ``body`` on a typed view of ``p``.

    The wrapper is a template re-homed to ``py_func``'s file, line and name,
    with ``body`` and ``layout`` as globals rather than a closure: numba's
    on-disk cache then stores it beside ``py_func`` and invalidates it when
    that file changes (a closure would be keyed by a pickle of the dispatcher,
    which differs from one process to the next).  Cached, its qualname carries
    :func:`_view_key`, so that the cache keeps one entry per layout and closure.
    """
    template = _record_view if layout.names is not None else _array_view
    origin = py_func.__code__
    qualname = f"{py_func.__qualname__}.host_view"
    if cache:
        qualname += f"_{_view_key(py_func, layout)}"
    # The template's call of the body is on its second line: placed one line up, so
    # that the call is on py_func's first line (its def, or its first decorator),
    # numba's "typing of call at" ends a compile error there, not on the body's first
    # line, which it quoted under a caret as if the error were there.
    code = template.__code__.replace(
        co_filename=origin.co_filename,
        co_firstlineno=origin.co_firstlineno - 1,
        co_name=py_func.__name__,
    )
    if sys.version_info >= (3, 11):
        code = code.replace(co_qualname=qualname)
    carray = numba_hooks().carray
    scope = {"body": body, "carray": carray, "layout": layout, "__builtins__": builtins}
    wrapper = pytypes.FunctionType(code, scope, py_func.__name__)
    wrapper.__qualname__ = qualname
    wrapper.__module__ = py_func.__module__
    return wrapper


#: Code flags of a function whose call makes a generator or coroutine, never runs its
#: body: refused by @host_callback here, and as fn by host_launch and add_callback
#: (``_classify``, and ``native/host_launch.c``, which hands such a function to it).
SUSPENDING_FLAGS = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR

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


def _result_refusal(py_func: Callable, target: Callable, options: dict) -> str | None:
    """Why ``target``, which failed to compile as ``void(void*)``, is refused, if
    the reason is that it returns a value (else None): numba's own message ("No
    conversion from Literal[int](0) to none") does not say that a host function
    returns nothing.

    Run only after the compile failed, so that a healthy compile pays nothing:
    ``target`` is typed once more, with its return type left to numba, and the
    failure is the result's if that compiles to anything but ``none``.  Any other
    failure leaves numba's message to be reported.
    """
    hooks = numba_hooks()
    try:
        typed = hooks.njit(target, nogil=True, **options)
        typed.compile((hooks.types.voidptr,))
        (signature,) = typed.nopython_signatures
    except Exception:  # numba's first message says what else is wrong
        return None
    result = signature.return_type
    if result == hooks.types.none:
        return None
    return (
        f"host function {py_func.__qualname__!r} "
        f"({py_func.__code__.co_filename}:{py_func.__code__.co_firstlineno}) returns a "
        f"value ({result}); a host function returns nothing, since the driver that calls "
        "it discards any result. Write results into user_data instead (a field of the "
        "record with dtype=, or an element of numba.carray(user_data, ...)) and drop the "
        "return value"
    )


def _missing_field(exc: BaseException) -> str | None:
    """What numba's bare ``KeyError: 'name'`` means, if it comes from typing a record's
    field that the record lacks (a misspelled ``user_data.name``): the field, the
    line, and the fields the record has; else None."""
    if not isinstance(exc, KeyError) or len(exc.args) != 1 or not isinstance(exc.args[0], str):
        return None
    record_type = numba_hooks().types.Record
    record = where = None
    traceback = exc.__traceback__
    while traceback is not None and record is None:
        owner = traceback.tb_frame.f_locals.get("self")
        if isinstance(owner, record_type):
            record = owner
        elif all(hasattr(getattr(owner, "loc", None), n) for n in ("filename", "line")):
            where = owner.loc  # the innermost typing constraint: the field's line
        traceback = traceback.tb_next
    if record is None:
        return None
    at = "" if where is None else f" ({where.filename}:{where.line})"
    fields = ", ".join(map(repr, record.fields))
    return (
        f"a record has no field {exc.args[0]!r}{at}: its fields are {fields} "
        f"(numba said only KeyError: {exc.args[0]!r})"
    )


def _calls_a_host_function(exc: BaseException) -> str:
    """A hint for numba's "Cannot determine Numba type of <class '...HostFunction'>":
    a body that calls another host function (numba cannot type one)."""
    if f"{HostFunction.__module__}.HostFunction'>" not in str(exc):
        return ""
    return (
        "\nA host function cannot call another host function: put the code they share "
        "in a @numba.njit function, and call that from both"
    )


def _native_byte_order(layout: np.dtype) -> bool:
    """Whether every part of ``layout`` is in the machine's byte order: numpy's
    ``isnative`` looks into fields but not into a subarray's base
    (``np.dtype([("a", ">i4", (2,))]).isnative`` is True)."""
    if layout.subdtype is not None:
        return _native_byte_order(layout.subdtype[0])
    if layout.names is not None:
        return all(_native_byte_order(layout.fields[name][0]) for name in layout.names)
    return layout.isnative


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
    if not _native_byte_order(layout):
        raise ValueError(
            f"host_callback(dtype=...) must be in the machine's byte order, got {layout}: "
            "numba cannot compile a non-native byte order; use "
            "dtype.newbyteorder('=') and convert the data with .astype() of it"
        )
    if layout.subdtype is not None:
        base, shape = layout.subdtype
        raise ValueError(
            f"host_callback(dtype=...) cannot be a subarray dtype, got {layout!r}: numba "
            "cannot view one (it fails with an LLVM 'Invalid store'). Make the array a field "
            f"of a structured dtype, np.dtype([('a', np.{base!r}, {shape})]), and index "
            "user_data.a in the body; or give no dtype= and view the pointer with "
            f"numba.carray(user_data, {shape}, np.{base!r})"
        )
    if layout.names is None and layout.kind == "V":
        raise ValueError(
            f"host_callback(dtype=...) cannot be raw bytes without fields, got {layout!r}: "
            "numba cannot type an unstructured void dtype. Give it fields, "
            f"np.dtype([('raw', 'u1', {layout.itemsize})]), or give no dtype= and view the "
            "pointer with numba.carray"
        )
    _check_subarray_fields(layout, "")
    _check_number_types(layout, "")
    try:  # what a launch or by_ref() of an array of it would do
        memoryview(np.empty(0, layout))
    except (ValueError, TypeError, NotImplementedError) as exc:
        raise ValueError(
            f"host_callback(dtype=...) cannot be {layout!r}: numpy cannot share an array "
            f"of it as a buffer ({exc}), so none could be passed to the host function. "
            "Declare the fields in the order of their offsets, none overlapping"
        ) from None
    return layout


def _check_number_types(layout: np.dtype, prefix: str) -> None:
    """Refuse the numbers numba's CPU target cannot compile, in any field, and the
    datetimes numpy cannot share (no buffer export: no array of them can be passed).

    ``float16`` has a numba type but no CPU data model: the compile failed with
    numba's bare ``NotImplementedError: float16`` (0.60-0.68; only numba-cuda's
    device code has half floats).  ``longdouble`` and ``clongdouble`` have no numba
    type at all ("Untyped global name 'layout': float128").
    """
    base = layout if layout.subdtype is None else layout.subdtype[0]
    if base.names is not None:
        for name in base.names:
            _check_number_types(base.fields[name][0], f"{prefix}{name}.")
        return
    where = f": field {prefix[:-1]!r} is" if prefix else " is"
    if base.kind == "f" and base.itemsize == 2:
        raise ValueError(
            f"host_callback(dtype=...){where} float16, which numba cannot compile in a "
            "host function (its CPU target has no float16; only CUDA device code has). "
            "Use np.float32 (convert the data with .astype(np.float32)), or declare it "
            "np.uint16, pass the data's .view(np.uint16), and decode the bits in the body"
        )
    if base.kind in "mM":
        raise ValueError(
            f"host_callback(dtype=...){where} {base}, which no array can be passed as: "
            "numpy cannot export datetime64 or timedelta64 through the buffer protocol, "
            "so a launch or by_ref() of the array fails. Declare np.int64 in its place "
            "and pass the data's .view(np.int64) (the same bytes: the count of units)"
        )
    if base.kind in "fc" and base.itemsize > (8 if base.kind == "f" else 16):
        instead = "np.float64" if base.kind == "f" else "np.complex128"
        raise ValueError(
            f"host_callback(dtype=...){where} {base} (C long double), which numba "
            f"cannot compile; use {instead} (convert the data with .astype({instead}))"
        )


def _check_subarray_fields(layout: np.dtype, prefix: str) -> None:
    """Refuse a subarray field (nested records included) of what numba cannot nest.

    numba types a record's subarray field as a ``NestedArray``, whose elements must
    be numbers or records: one of bools, datetimes, timedeltas, bytes or str fails
    deep in numba ("'Boolean' object has no attribute 'bitwidth'") on 0.62-0.68.
    """
    for name in layout.names or ():
        field = layout.fields[name][0]
        path = f"{prefix}{name}"
        base = field if field.subdtype is None else field.subdtype[0]
        if base.names is not None:
            _check_subarray_fields(base, f"{path}.")
        elif base.kind == "V":
            raise ValueError(
                f"host_callback(dtype=...): field {path!r} is raw bytes without fields "
                f"({base!r}), which numba cannot type. Store them as numbers instead "
                f"(('{name}', 'u1', {base.itemsize})), or give the field fields of its own"
            )
        elif field.subdtype is not None and base.kind not in "iufc":
            raise ValueError(
                f"host_callback(dtype=...): field {path!r} is a subarray of {base!r} "
                f"(shape {field.shape}), which numba cannot compile: a record's subarray "
                "fields hold numbers or records only. Store the elements as numbers "
                "instead (np.uint8 for bool or bytes, np.uint32 for str, np.int64 for "
                "datetime64 or timedelta64), or give each element a field of its own"
            )


def _not_a_function(given: Any) -> TypeError:
    """The error for ``host_callback(given)`` of anything but a Python function, saying
    what was probably meant where that is plain: numba.cfunc takes its signature
    positionally, so ``@host_callback(REC)`` is an easy slip for ``dtype=REC``."""
    kind = type(given).__name__
    hint = ""
    if isinstance(given, np.dtype) or (isinstance(given, type) and issubclass(given, np.generic)):
        hint = ": dtype is keyword-only: @host_callback(dtype=...)"
    elif isinstance(given, str):
        hint = (
            ": a host function takes no signature (it is always void(void*)): write "
            "@host_callback, or @host_callback(dtype=...) for a typed view of user_data"
        )
    elif isinstance(given, HostFunction):
        hint = f": {given!r} is compiled already; launch it as it is"
    elif inspect.isfunction(getattr(given, "py_func", None)):
        hint = ": decorate the plain Python function instead (this one's .py_func)"
    elif isinstance(given, numba_cfunc_type()):
        hint = (
            ": a numba cfunc is compiled already; host_launch launches a void(voidptr) one "
            "as it is, or decorate the plain Python function (its __wrapped__) instead"
        )
    elif isinstance(given, (staticmethod, classmethod)):
        hint = (
            ": decorate the function under it, and drop it (a HostFunction in a class "
            "binds no self: call it as cls.fn or self.fn all the same)"
        )
    elif inspect.ismethod(given):
        hint = (
            ": a method takes self, and a host function only user_data: decorate a "
            "plain function of one parameter, and pass what it needs as user_data"
        )
    elif isinstance(given, functools.partial):
        hint = (
            ": a host function binds no arguments; pass what it needs as user_data "
            "(a record with dtype=, or nh.record(...))"
        )
    return TypeError(f"host_callback expected a Python function, got {kind}{hint}")


class HostFunction(_core.CompiledBase):
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

    Notes
    -----
    Its machine code is fixed for its life: ``copy.copy`` and ``copy.deepcopy``
    give the object itself, as for a function.  One defined at the top level of
    a module pickles by name, as a function does (the process that loads it
    imports the module, which compiles it again); any other cannot be pickled
    (``TypeError``, saying why).
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
            raise _not_a_function(py_func)
        if self.address:  # bound once: the machine code launched is fixed for its life
            raise RuntimeError(f"{self!r} is compiled already; make another with @host_callback")
        if py_func.__code__.co_flags & SUSPENDING_FLAGS:
            raise TypeError(
                f"host function {py_func.__qualname__!r} is a generator or coroutine "
                "function; a host function is called once, on the driver's thread, and "
                "returns nothing: write it as a plain def fn(user_data): ..."
            )
        # One positional parameter and nothing else: numba compiles the function for
        # the one void* argument, and refuses a default, *args, keyword-only or
        # **kwargs parameter beside it only with its own "Signature mismatch".  Read
        # off the code numba compiles, not inspect.signature, which follows a
        # functools.wraps wrapper's __wrapped__ (and a __signature__) elsewhere.
        code = py_func.__code__
        if (
            code.co_argcount != 1
            or code.co_kwonlyargcount
            or code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)
            or py_func.__defaults__
        ):
            raise TypeError(
                f"host function {py_func.__qualname__!r} must take exactly one argument, "
                "user_data, and no other parameter (no default, *args, keyword-only or "
                "**kwargs one): def fn(user_data): ..."
            )
        self.py_func = py_func
        layout = _check_layout(dtype)
        self.__name__ = py_func.__name__
        self.__qualname__ = py_func.__qualname__
        self.__module__ = py_func.__module__
        self.__doc__ = py_func.__doc__
        self.__wrapped__ = py_func
        label = f"host function {py_func.__module__}.{py_func.__qualname__}"
        options = _numba_options(fastmath, boundscheck, debug, error_model, cache)
        cache = bool(cache)
        numba = _numba()
        if numba.config.DISABLE_JIT:
            raise RuntimeError(
                f"cannot make host function {py_func.__qualname__!r}: NUMBA_DISABLE_JIT "
                "is set (numba.config.DISABLE_JIT), so numba compiles nothing, and a host "
                "function is machine code that the driver calls (numba's own cfunc fails "
                "under it too). Unset it to make host functions"
            )
        if cache:
            _check_cacheable(py_func)
            key = _cache_key(py_func, options)
        target = py_func
        try:
            if layout is not None:
                body = numba.njit(py_func, **options)
                if cache:
                    _keyed_cache(body, py_func, key)
                target = _view_wrapper(py_func, body, layout, cache)
            cfunc = numba.NamedCFunc(target, label, {"nopython": True, **options})
            if cache:  # the wrapper's key is py_func's: its own code is the template's
                _keyed_cache(cfunc, target, key)
            cfunc.compile()
        except Exception as exc:  # numba raises more than NumbaError (TypeError, ...)
            refusal = _result_refusal(py_func, target, options)
            if refusal is not None:
                raise TypeError(refusal) from None
            error = HostCallbackCompileError(
                f"cannot compile host function {py_func.__qualname__!r} "
                f"({py_func.__code__.co_filename}:{py_func.__code__.co_firstlineno}) "
                f"with numba:\n{_missing_field(exc) or exc}{_calls_a_host_function(exc)}"
            )
            error.numba_error = exc
            raise error from None
        self._cfunc = cfunc
        # address, dtype and reads_user_data are the native base's, read-only and
        # fixed for the function's life: host_launch reads them there.
        reads = layout is not None or reads_its_argument(py_func)
        size = 0 if layout is None else layout.itemsize
        self._bind(cfunc.address, layout, size, reads, _core.KIND_COMPILED)
        self._ctypes = None
        self._target, self._options, self._direct = target, options, None

    @property
    def ctypes(self) -> Any:
        """A ``CFUNCTYPE(None, c_void_p)`` pointer to the code that keeps it alive.

        cuda.core's ``GraphBuilder.callback`` and ``GraphNode.callback`` accept
        it unchanged.
        """
        if not self.address:
            raise ValueError(
                "a HostFunction with no machine code (made with HostFunction.__new__, never "
                "compiled) has no ctypes pointer; make it with @numba_hostfn.host_callback"
            )
        if self._ctypes is None:
            pointer = CUhostFn(self.address)
            pointer._numba_hostfn_owner = self  # the pointer keeps the code alive
            self._ctypes = pointer
        return self._ctypes

    @property
    def cache_hits(self) -> int:
        """How many times the machine code was loaded from numba's on-disk cache."""
        return self._cfunc.cache_hits if self.address else 0

    def inspect_llvm(self) -> str:
        """Return the LLVM IR of the compiled function and its C wrapper.

        Raises
        ------
        RuntimeError
            If its machine code was loaded from numba's cache (``cache_hits``),
            which keeps no IR (numba returned an invalid text, with a warning).
        """
        if not self.address:
            raise ValueError(
                "a HostFunction with no machine code (made with HostFunction.__new__, never "
                "compiled) has no LLVM IR; make it with @numba_hostfn.host_callback"
            )
        if self.cache_hits:
            raise RuntimeError(
                f"host function {self.__qualname__!r} was loaded from numba's cache, "
                "which keeps machine code but no LLVM IR. To read its IR, make it again "
                "without cache=True: host_callback(fn.py_func, dtype=fn.dtype, ...) "
                "with its other options"
            )
        return self._cfunc.inspect_llvm()

    @keeps_nothing_on_refusal
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
        if not self.address:
            raise ValueError(
                "a HostFunction with no machine code (made with HostFunction.__new__, never "
                "compiled) cannot be called; make it with @numba_hostfn.host_callback"
            )
        # owner keeps what address points to alive while the body runs; a refusal
        # keeps nothing, nor does a body's error (keeps_nothing_on_refusal).
        address, owner = resolve_user_data(user_data, self.dtype, self, self.reads_user_data)
        if self._direct is None:
            self._direct = _direct_caller(self._target, self._options)
        self._direct(address)

    def __copy__(self) -> HostFunction:
        return self  # its machine code is fixed for its life: a copy is itself, as a function's

    def __deepcopy__(self, memo: dict) -> HostFunction:
        return self

    def __reduce__(self) -> str:
        """Pickled by name, as a function is: one defined at the top level of a module
        (the process that loads it imports that module, which compiles it again).
        Any other is refused, saying why: its machine code is this process's."""
        found = sys.modules.get(self.__module__) if self.address else None
        for part in self.__qualname__.split(".") if found is not None else ():
            found = getattr(found, part, None)
        if found is self:
            return self.__qualname__
        raise TypeError(
            f"{self!r} cannot be pickled: it is machine code compiled in this process, "
            "and only a host function defined at the top level of a module pickles, by "
            "name (the process that loads it imports the module, which compiles it "
            "again; cache=True makes that a load from disk). Define it there, or send "
            "what the other process needs to make it with @host_callback itself"
        )

    def __repr__(self) -> str:
        if not self.address:
            return "<HostFunction, never compiled>"
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


#: What a bool option takes: a bool, or numpy's (np.True_, as numba.cfunc takes it).
_BOOLS = (bool, np.bool_)

#: The flags numba's ``fastmath=`` takes in a set (or as a dict's keys): LLVM's
#: fast-math flags, and ``'fast'`` for all of them (numba.core.cpu_options).
FASTMATH_FLAGS = frozenset({"fast", "nnan", "ninf", "nsz", "arcp", "contract", "afn", "reassoc"})


def _fastmath(fastmath: Any) -> bool | set | dict:
    """``fastmath=`` as numba takes it, checked here, without numba: numba refuses a
    wrong one only while compiling (a HostCallbackCompileError blaming the body)."""
    if isinstance(fastmath, _BOOLS):
        return bool(fastmath)  # numba reads only True itself as "fast" (not np.True_)
    if isinstance(fastmath, (set, frozenset, dict)):
        flags = fastmath.keys() if isinstance(fastmath, dict) else fastmath
        unknown = [f for f in flags if not isinstance(f, str) or f not in FASTMATH_FLAGS]
        if unknown:
            raise ValueError(
                f"host_callback(fastmath=...) got the unknown flag(s) "
                f"{', '.join(map(repr, unknown))}; expected flags from "
                f"{sorted(FASTMATH_FLAGS)}"
            )
        if isinstance(fastmath, dict):
            # numba enables a flag whose value is truthy: a "no" would turn it on.
            wrong = {f: v for f, v in fastmath.items() if not isinstance(v, _BOOLS)}
            if wrong:
                raise TypeError(
                    "host_callback(fastmath={flag: ...}) expected True or False for each "
                    f"flag, got {wrong!r}"
                )
            return {f: bool(v) for f, v in fastmath.items()}
        return set(fastmath)  # numba takes a set, not a frozenset
    raise TypeError(
        f"host_callback(fastmath=...) expected True, False, or a set of fast-math flags "
        f"from {sorted(FASTMATH_FLAGS)} (e.g. {{'nnan', 'ninf'}}), got {fastmath!r}"
    )


def _numba_options(
    fastmath: Any, boundscheck: Any, debug: Any, error_model: Any, cache: Any = False
) -> dict:
    """The numba options of a host function, checked (``cache`` too, which is not
    one of them: it is checked here with them, before numba is imported)."""
    if error_model not in ("numpy", "python"):
        raise ValueError(
            f"host_callback(error_model=...) expected 'numpy' or 'python', got {error_model!r}"
        )
    if boundscheck is not None and not isinstance(boundscheck, _BOOLS):
        raise TypeError(
            f"host_callback(boundscheck=...) expected True, False or None, got {boundscheck!r}"
        )
    for name, value in (("debug", debug), ("cache", cache)):
        if not isinstance(value, _BOOLS):  # a truthy "no" turned it on
            raise TypeError(f"host_callback({name}=...) expected True or False, got {value!r}")
    options = {"error_model": error_model, "fastmath": _fastmath(fastmath), "debug": bool(debug)}
    if boundscheck is not None:  # None: numba's default (NUMBA_BOUNDSCHECK)
        options["boundscheck"] = bool(boundscheck)
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
        It returns nothing (the driver discards any result): it writes its
        results into the user data.
    dtype : numpy dtype, optional
        The layout of the user data.  A structured dtype gives the body a
        record (``user_data.field``); a scalar dtype a one-element array
        (``user_data[0]``).  :func:`host_launch` then checks the user data
        against it and rejects ``None``.  An array goes in a field,
        ``np.dtype([('a', 'i8', 3)])`` (``user_data.a[i]``): a subarray dtype
        itself, ``np.dtype(('i8', 3))``, is refused, and so is a subarray field
        of anything but numbers or records (bools, bytes, str, datetimes), which
        numba cannot compile.
    cache : bool, optional
        Cache the machine code on disk (numba's cache), so a later process
        loads it instead of compiling.  numba compiles the value of each global
        the body reads into the code; the cache entry is keyed by those values
        (numbers, strings, numpy scalars, dtypes and arrays, enum members, tuples
        of them; read through a module or class too, as ``module.NAME``,
        ``Enum.MEMBER``, ``pkg.sub.NAME``, a few levels deep) and by the code,
        options and globals of the jitted functions it calls (``helpers.f()``
        too), so a changed value compiles anew instead of loading the old one's
        code.  An object of any
        other kind counts by its type only: pass what changes as user data.
        The function must be defined in a file (a module or script; an IPython
        cell, with IPython installed).
    fastmath : bool or set of str, optional
        Passed to numba: allow floating-point reassociation and the like.
        ``True`` for all of it, or a set of LLVM's fast-math flags: ``'nnan'``,
        ``'ninf'``, ``'nsz'``, ``'arcp'``, ``'contract'``, ``'afn'``,
        ``'reassoc'`` (``'fast'``: all of them); numba's dict form, flag to
        bool, is taken too.
    boundscheck : bool, optional
        Check array indices against the array's shape as the body declares it
        (``carray``'s shape; an index outside it raises ``IndexError``, reported
        like any failure in a host function).  It cannot check the buffer
        behind a raw pointer: declare ``dtype=`` (whose size a launch checks)
        or pass the length with the data (docs/errors.md).  ``None``: numba's
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
        If numba cannot compile the body; the message names the function (and a
        record field the body names that its record lacks, where numba said only
        ``KeyError``).
    RuntimeError
        If ``NUMBA_DISABLE_JIT`` is set: numba compiles nothing then.
    TypeError
        If ``func`` is not a Python function of exactly one parameter (no
        default, ``*args``, keyword-only or ``**kwargs`` one beside it), is a
        generator or coroutine function, returns a value (on any path: write
        results into the user data instead), or ``dtype`` is not a numpy dtype
        without objects, ``boundscheck`` is not True, False or None, ``cache``
        or ``debug`` is not True or False, ``fastmath`` is not a bool, set or
        dict, or an option other than the ones above is given.
    ValueError
        If ``dtype`` is empty, a subarray dtype, not in the machine's byte
        order, or has a subarray field numba cannot compile, or is or holds a
        ``float16`` or long double, which numba cannot compile on the CPU, or a
        ``datetime64`` or ``timedelta64``, which numpy cannot share as a buffer (the
        message names the field and what to use instead), has fields out of the
        order of their offsets or overlapping (numpy cannot share those either),
        ``fastmath`` names a
        flag numba does not know, or ``error_model`` is neither ``'numpy'``
        nor ``'python'``; or ``cache=True`` for a function numba finds no place
        to cache (one made by ``exec`` or ``python -c``).

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
    _numba_options(fastmath, boundscheck, debug, error_model, cache)  # refuse bad values early
    _check_layout(dtype)
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
