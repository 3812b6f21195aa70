"""user_data: what a launch passes as the host function's ``void *``, and what it owns.

==========================  =========================================  ==============
``user_data``               the host function receives                 owned until run
==========================  =========================================  ==============
``None``                    NULL (refused if the body reads it)        nothing
``int``                     that address, as is                        nothing (yours)
read-only bytes-like        a private copy taken at launch             the copy
writable buffer             the buffer itself (as ``by_ref``)          the buffer
``by_ref(buffer)``          the buffer itself (writable, contiguous)   the buffer
``record(...)``             the record itself                          it, and what its
                                                                       fields point to
==========================  =========================================  ==============

A writable buffer is never copied: a copy would take the host function's writes
and drop them.  It is shared, as ``by_ref`` shares it; pass ``bytes(a)`` (or
``a.tobytes()``) for a copy.  A record of a writable structured array, ``a[i]``,
is shared too: numpy writes through it, although it exports its buffer read-only.
"""

from __future__ import annotations

import array
import ctypes
import functools
import mmap
import numbers
import os
import sys
from typing import Any

import numpy as np

from . import _core
from ._compat import CFuncPtr, PointerBase
from ._errors import keeps_nothing_on_refusal

__all__ = [
    "ByRef",
    "Record",
    "buffer_dtype",
    "by_ref",
    "no_buffer_error",
    "record",
    "resolve_user_data",
]

_MAX_ADDRESS = 2**64
_ARRAY_BASE = np.ndarray.base.__get__
_VOID_BASE = np.void.base.__get__
# What np.lib.stride_tricks.as_strided (and sliding_window_view) leaves as its array's
# base: numpy's DummyArray, an __array_interface__ with the array it was made from as
# its own ``base`` (numpy.lib.stride_tricks or numpy.lib._stride_tricks_impl).
_STRIDED_BASE = type(np.lib.stride_tricks.as_strided(np.zeros(1)).base)


def _shared_record(value: Any, writable: bool = True) -> Any:
    """``value``, or for a record ``a[i]`` of a writable structured array (a
    ``numpy.void``, which numpy writes through but exports read-only) its 0-d array
    view: the same memory, shared as ``a[i:i + 1]`` is (``base_pins`` follows it to
    what ``a``'s memory belongs to); with ``writable`` false, of a read-only array
    too.  A void that owns no such memory (one ``np.asarray`` would copy) is
    ``value`` itself."""
    if isinstance(value, np.void) and (value.flags.writeable or not writable):
        view = np.asarray(value)
        if _ARRAY_BASE(view) is value:  # a view of the record's memory, not a copy
            return view
    return value


def base_pins(obj: Any) -> tuple:
    """Exports of the object a numpy array's memory belongs to, where numpy holds none.

    ``np.ndarray(shape, dtype, buffer=b)`` (and ``np.memmap``, on its ``mmap``) keeps
    ``b`` as its ``base`` without a buffer export of it: an export of the array alone
    leaves a ``bytearray`` resizable, an ``array.array`` too, a ``memoryview``
    releasable and an ``mmap`` closable, which frees the memory under a launch that
    uses its address.  So the memory's owner is found (:func:`_memory_owner`) and,
    where the way to it passes a link that holds no export and it is no numpy array
    (one that owns its memory has no owner to pin), pinned too where it can be
    exported.
    """
    owner, loose = _memory_owner(obj)
    if not loose or owner is None or isinstance(owner, (np.ndarray, np.void)):
        return ()
    try:
        return (_core.BufferRef(owner, pin_only=True),)
    except (BufferError, TypeError, ValueError):  # no buffer (an __array_interface__)
        return ()


# ctypes' common base class, and the key of the memoryview that ``from_buffer`` keeps
# in its result's ``_objects`` (CPython's _ctypes: ``KeepRef(result, -1, mv)``; a
# simple type's ``_objects`` is that memoryview itself).
_CDATA = ctypes.c_char.__mro__[-2]
_FROM_BUFFER_KEY = "ffffffff"


def _memory_owner(obj: Any) -> tuple[Any, bool]:
    """``(owner, loose)``: the last object on the way from ``obj`` to what its memory
    belongs to, and whether a link on that way holds no buffer export.

    Links that hold none (the memory's owner can be resized or closed under them): a
    numpy array's (or a record ``a[i]``'s, a ``numpy.void`` whose buffer is ``a``'s)
    ``base``, the ``DummyArray`` that ``as_strided`` leaves as its array's base, and a
    ctypes object's ``_b_base_`` (a field, or ``from_buffer`` of another ctypes
    object's ``_objects``).  Links that hold one, followed to the memory behind them
    (which they do not pin where it is a numpy array's own base): a
    ``memoryview``'s ``obj`` (``np.asarray(memoryview(a))``, ``np.frombuffer`` of a
    ``pickle.PickleBuffer``, ``np.ctypeslib.as_array``), and the memoryview a ctypes
    object made by ``from_buffer`` keeps.  ``np.ctypeslib.as_ctypes``'s result keeps
    its array in an attribute, ``__keep`` (no export).  A released memoryview ends
    the way, and so does a DLPack capsule (``np.from_dlpack``'s base), whose owner
    no Python object reaches."""
    base, loose = obj, False
    while True:
        if isinstance(base, np.ndarray):
            link, holds = _ARRAY_BASE(base), False  # ndarray's own, past a subclass's
        elif isinstance(base, np.void):  # a record a[i] (_shared_record): base a
            link, holds = _VOID_BASE(base), False
        elif type(base) is _STRIDED_BASE:
            link, holds = base.base, False
        elif isinstance(base, memoryview):
            try:
                link, holds = base.obj, True
            except ValueError:  # released: the caller's own export of it fails first
                return None, loose
        elif isinstance(base, _CDATA):
            link, holds = base._b_base_, False
            if link is None:
                kept = base._objects  # the memoryview itself for a simple type's
                link = kept.get(_FROM_BUFFER_KEY) if isinstance(kept, dict) else kept
                if not isinstance(link, memoryview):
                    link = None
                holds = True
            if link is None:
                # np.ctypeslib.as_ctypes(a): from_address, with a kept in an
                # attribute of the result, which holds no export of it.
                link, holds = getattr(base, "__keep", None), False
        else:
            return base, loose
        if link is None:
            return base, loose
        loose = loose or not holds
        base = link


# ctypes objects whose bytes are an address: copying them is never what was meant.
_POINTER_TYPES = (
    PointerBase,
    ctypes.c_void_p,
    ctypes.c_char_p,
    ctypes.c_wchar_p,
    CFuncPtr,
)


# Formats of plain bytes, whatever the byte order: what bytes, bytearray, mmap and
# memoryview.cast("B") export, and a ctypes c_char array.  A buffer of them has no
# dtype of its own.  Not "b", signed char: an int8 array's and array.array("b")'s,
# a number type (its memoryview was taken for bytes, where the array was typed).
_BYTE_FORMATS = frozenset(order + code for order in ("", "@", "=", "<", ">", "!") for code in "Bc")


# ByRef's dtype when its caller has not read the buffer's (a sentinel: None is an answer).
_UNKNOWN = object()


def buffer_dtype(obj: Any, view: memoryview) -> np.dtype | None:
    """The dtype of ``obj``'s buffer ``view``, to compare with a declared layout.

    An array's (or a numpy scalar's) own; for any other buffer, the numpy dtype its
    format names (``array.array("d")``, ``memoryview(a)``, a ctypes number: float64).
    None where there is none to compare: plain bytes (``B``, ``c``), a format
    numpy cannot read, and a ctypes structure's, which ctypes writes without its
    padding (numpy can only guess its fields): their size alone is checked.
    """
    if isinstance(obj, (np.ndarray, np.generic)):
        return obj.dtype
    fmt = view.format
    if fmt in _BYTE_FORMATS or ("{" in fmt and not isinstance(view.obj, np.ndarray)):
        return None
    if _core.format_holds_objects(fmt):
        return None  # refused as objects, with its own error
    try:
        return np.asarray(view).dtype
    except (ValueError, TypeError, NotImplementedError, BufferError, Warning):
        return None


def _has_dates(dtype: np.dtype) -> bool:
    """Whether ``dtype`` holds a datetime64 or timedelta64 anywhere (a field, a subarray)."""
    base = dtype.base
    if base.names is not None:
        return any(_has_dates(base.fields[name][0]) for name in base.names)
    return base.kind in "mM"


def no_buffer_error(obj: Any, what: str, use: str, instead: str) -> Exception | None:
    """The error for ``obj``, whose ``memoryview(obj)`` raised a ValueError, where it
    is one of these (None for any other): a closed ``mmap`` or a released
    ``memoryview`` (mmap's "closed or invalid", memoryview's "operation forbidden on
    released memoryview object"), a ValueError; an array of datetimes, which numpy
    exports no buffer of ("cannot include dtype 'M' in a buffer"), or of references
    (``StringDType``, a structured dtype with an object field beside a datetime), a
    TypeError.
    ``what`` begins the message ("by_ref() got"), ``use`` is what the memory was
    for ("share"), ``instead`` what else to pass ("another writable buffer")."""
    if isinstance(obj, mmap.mmap) and obj.closed:  # mmap's own: "closed or invalid"
        return ValueError(
            f"{what} a closed mmap, which has no memory to {use}: pass an open one (or {instead})"
        )
    if isinstance(obj, memoryview):
        try:
            _ = obj.nbytes  # a ValueError once released
        except ValueError:
            return ValueError(
                f"{what} a released memoryview, which has no memory to {use}: pass one "
                f"that is not released (or {instead})"
            )
    if isinstance(obj, np.ndarray) and obj.dtype.hasobject:  # StringDType, an object field
        return TypeError(
            f"{what} an array of dtype {obj.dtype}, whose elements are references to "
            "Python objects, which numpy exports no buffer of (their pointers' bytes are "
            f"no data to {use}): pass numeric data, or fixed-width strings (dtype 'S' or "
            "'U')"
        )
    if isinstance(obj, np.ndarray) and _has_dates(obj.dtype):
        return TypeError(
            f"{what} an array of dtype {obj.dtype}, which numpy exports no buffer of: pass "
            "the same memory as integers, its .view(np.int64) (a structured dtype: one "
            "with np.int64 in place of each datetime64 or timedelta64)"
        )
    return None


class ByRef(_core.BufferRef):
    """A writable buffer passed to a host function by reference (see :func:`by_ref`).

    It holds a buffer export of ``obj`` (``address``, ``nbytes``, ``dtype``) for as
    long as it lives: a launch that owns it keeps ``obj`` alive, and a
    ``bytearray`` unresizable (``native/buffer_ref.c``).
    """

    # The exports of the memory a numpy array's base holds (base_pins).
    __slots__ = ("_base_pins",)

    def __init__(
        self,
        obj: Any,
        view: memoryview | None = None,
        what: str = "by_ref()",
        dtype: np.dtype | None | object = _UNKNOWN,
    ) -> None:
        error: Exception | None = None
        if view is None:
            obj = _shared_record(obj)  # a[i] of a writable array: shared, as user_data is
            try:
                view = memoryview(obj)
            except TypeError:
                error = TypeError(
                    "by_ref() expected an object with the buffer protocol (a numpy "
                    f"array, bytearray, ...), got {type(obj).__name__}"
                )
            except ValueError:  # a closed mmap, a released memoryview, datetimes
                error = no_buffer_error(obj, f"{what} got", "share", "another writable buffer")
                if error is None:
                    raise
        if error is not None or view is None:
            pass
        elif view.readonly and what == "record()":  # a Record's data made read-only
            error = ValueError(
                "the record's data is read-only; a record is shared with the host "
                "function, which may write it: make it writable again "
                "(record.data.flags.writeable = True), or make a new record"
            )
        elif view.readonly:
            error = ValueError(
                "by_ref() needs a writable buffer, because the host function may write "
                "it; pass the data as user_data to copy it instead, or make it writable"
            )
        elif not view.c_contiguous:
            error = ValueError(
                f"{what} needs a C-contiguous buffer to share with the host function (a "
                "writable buffer is shared, never copied); pass np.ascontiguousarray(a) "
                "and read the result from that array, or bytes(a) for a copy"
            )
        elif view.nbytes == 0:
            error = ValueError(f"{what} needs a buffer of at least one byte")
        elif isinstance(obj, np.ndarray) and obj.dtype.hasobject:
            error = TypeError(
                f"{what} got an array of Python objects (dtype {obj.dtype}); a host "
                "function cannot use object pointers without the GIL: pass numeric data"
            )
        if error is not None:
            # A refusal keeps nothing (invariant 3): this frame stays in the error's
            # traceback, so it drops the buffer and its view itself (raised outside the
            # except above, the error has no context to keep them either).
            del obj, view
            raise error
        try:  # the native checks (a buffer of objects that is no ndarray: its format)
            # dtype: what the caller read of this view already (resolve_user_data).
            super().__init__(obj, buffer_dtype(obj, view) if dtype is _UNKNOWN else dtype)
        except BaseException:
            del obj, view  # as above: nothing is kept while its error lives
            raise
        self._base_pins = base_pins(obj)

    def __repr__(self) -> str:
        return f"by_ref({self.obj!r})"


def by_ref(obj: Any) -> ByRef:
    """Pass a writable buffer to a host function by reference instead of copying it.

    The launch keeps ``obj`` alive, and a ``bytearray`` unresizable, until the
    host function has run and the launch was released (:func:`drain`).  Read
    the results only after synchronizing the stream.

    Parameters
    ----------
    obj : buffer
        A writable, C-contiguous object with the buffer protocol, at least one
        byte long: a numpy array, ``bytearray``, ctypes array, ``memoryview``; or
        a record ``a[i]`` of a writable structured array (its memory in ``a``).

    Returns
    -------
    ByRef
        A marker to pass as ``user_data`` to :func:`host_launch` or to a
        :class:`HostFunction` call.

    Raises
    ------
    TypeError
        If ``obj`` has no buffer protocol, or is a numpy array of Python objects
        or of datetimes (``datetime64``, ``timedelta64``: numpy exports no
        buffer of them; pass ``.view(np.int64)``).
    ValueError
        If the buffer is read-only, not C-contiguous or empty, or is a closed
        ``mmap`` or a released ``memoryview``.
    """
    try:
        return ByRef(obj)
    except BaseException:
        # Inline, not keeps_nothing_on_refusal: by_ref is called for a launch, and
        # a wrapper's frame would cost it more than the check (invariant 3).
        del obj
        raise


class Record:
    """User data of a structured dtype whose address fields point at buffers it owns.

    Made by :func:`record`.  Passed as ``user_data``, the record is shared with
    the host function, as :func:`by_ref` shares a buffer: the body reads and
    writes the record's own memory (``data``), and the launch keeps the record
    and every buffer a field points to alive until the host function has run.
    ``keep`` holds a buffer export of each of those buffers, so their memory
    stays in place while the record lives: a ``bytearray`` behind a field
    cannot be resized (``BufferError``) until the record and its launches are gone.
    """

    __slots__ = ("data", "keep")

    def __init__(self, data: np.ndarray, keep: tuple) -> None:
        # What a launch and repr read: checked here, where a mistake is made, not at
        # the launch, whose error would name by_ref(), which the caller never called.
        if not (isinstance(data, np.ndarray) and data.dtype.names is not None):
            raise TypeError(
                "Record(data, keep) expected a numpy array of a structured dtype as data, "
                f"got {type(data).__name__}; make records with numba_hostfn.record(dtype, "
                "**fields)"
            )
        if data.shape != (1,):
            raise ValueError(
                f"Record(data, keep) expected a one-element array as data, got shape "
                f"{data.shape}; make records with numba_hostfn.record(dtype, **fields)"
            )
        if not isinstance(keep, tuple):
            raise TypeError(
                "Record(data, keep) expected a tuple of what the record keeps alive as "
                f"keep, got {type(keep).__name__}"
            )
        if not data.flags.writeable:
            raise ValueError(
                "Record(data, keep) expected writable data: a record is shared with the "
                "host function, which may write it; pass a writable array (data.copy())"
            )
        self.data = data
        self.keep = keep

    @property
    def dtype(self) -> np.dtype:
        return self.data.dtype

    def __repr__(self) -> str:
        return f"record({self.data[0]!r}, keeps {len(self.keep)} buffer(s))"


@keeps_nothing_on_refusal
def record(dtype: Any, /, **fields: Any) -> Record:
    """A record of ``dtype`` whose address fields point at buffers the launch keeps alive.

    A host function that reads an array through an address field
    (``carray(as_voidptr(d.data), ...)``) needs that array to outlive the
    launch; a record copied from ``np.array([(a.ctypes.data, ...)], dtype)``
    holds only the number.  Give the buffer itself for such a field: its
    address goes into the record, and a launch with this record as
    ``user_data`` owns the buffer until the host function has run (in a
    graph: as long as the graph).  The record and its launches hold a buffer
    export of it, not only the object: a ``bytearray`` behind a field cannot
    be resized (and moved) meanwhile.  The record itself is shared, not
    copied: what the host function writes into its fields is in ``data`` once
    the stream has passed the launch.

    Parameters
    ----------
    dtype : numpy dtype
        A structured dtype; address fields are 8-byte integers (``np.uint64``).
        Positional-only, so that a field may be named ``dtype``.
    **fields
        A value per field: a number, or, for an 8-byte integer field, a
        C-contiguous buffer (numpy array, ``bytearray``, ``memoryview``,
        ctypes array; a record ``a[i]``, which points to ``a``'s memory as
        ``a[i:i + 1]`` does) or ``by_ref(buffer)``, whose address is stored.  A field
        not given is zero, as in ``numpy.zeros`` (an address field: NULL), so
        output fields that the host function fills can be left out.  A field
        that is itself a record (a structured dtype) takes a tuple of its
        fields' values in their order, each checked as a field of its own
        (an 8-byte integer one takes a buffer, whose address is stored and
        kept, as above), a ``numpy.void`` or 0-d array of its dtype as it is,
        or a structured value of another dtype (a ctypes structure too),
        whose fields are checked in their order; a subarray of records, a
        list of such records (or an array).  Errors name a nested field by its
        path: ``'inner.x'``, ``'pts[1].x'``.

    Returns
    -------
    Record

    Raises
    ------
    TypeError
        If ``dtype`` is not structured, a buffer is given for a field that
        cannot hold an address, or a value is of a type its field cannot hold
        (a bool field holds ``True`` or ``False``, or the integer 0 or 1: not
        ``"False"``, whose truth numpy would store; an 8-byte integer field,
        which may hold an address, holds no bool; no integer field holds a
        ctypes number or structure, which numpy would store as its value:
        ``c_double()`` as 0, ``c_double(2.5)`` as 2; nor a ctypes
        pointer: pass the address it holds as an int), or one that numpy would
        store as another number than was meant, in a number field or an item of
        a subarray of numbers: bytes (``b"123"`` as 123), None (NaN in a float
        field), a complex number in a real field, a ``datetime64`` or
        ``timedelta64``, a list or tuple for a field of one number (``[3.0]`` as
        the address 3); or a buffer is an array of datetimes, which numpy
        exports no buffer of.  For a record field: a dict (numpy takes none),
        a list of more than one value, an array of more than one record, a
        structured value with another number of fields, a buffer (numpy would
        read it as a number for every field), a ctypes structure numpy has no
        dtype for.
    ValueError
        If a field is unknown, a buffer is not C-contiguous or is empty, is a
        closed ``mmap`` or a released ``memoryview``, or a value does not fit
        its field (``-1`` in an unsigned one, ``1.5`` in an integer one,
        ``1e300`` in a ``float32`` one, text that is no number), or a tuple for
        a record field has another number of items than it has fields; the
        message names the field (a nested one by its path).

    Examples
    --------
    >>> import numpy as np
    >>> from numba import carray
    >>> import numba_hostfn as nh
    >>> SUM = np.dtype([("values", np.uint64), ("n", np.int64), ("out", np.uint64)])
    >>> @nh.host_callback(dtype=SUM)
    ... def total(d):
    ...     values = carray(nh.as_voidptr(d.values), (d.n,), np.float64)
    ...     carray(nh.as_voidptr(d.out), (1,), np.float64)[0] = values.sum()
    >>> out = np.zeros(1)
    >>> total(nh.record(SUM, values=np.arange(4.0), n=4, out=out)); out
    array([6.])
    """
    layout = np.dtype(dtype)
    if layout.names is None:
        raise TypeError(f"record() needs a structured dtype, got {layout}")
    unknown = set(fields) - set(layout.names)
    if unknown:
        raise ValueError(f"record() got fields {sorted(unknown)} that {layout} does not have")
    data = np.zeros(1, layout)  # a field not given stays zero, as in numpy.zeros
    keep: list = []
    for name, value in fields.items():
        field = layout.fields[name][0]
        stored = _field_value(name, field, value, keep)
        try:
            # A number too large for a floating field would be stored as inf.
            with np.errstate(over="raise"):
                data[name] = stored
        except (TypeError, ValueError, OverflowError, FloatingPointError) as exc:
            kind = TypeError if isinstance(exc, TypeError) else ValueError
            raise kind(
                f"record() field {name!r} is {field} and cannot hold {value!r} ({exc})"
            ) from None
    return Record(data, tuple(keep))


def _field_value(name: str, field: np.dtype, value: Any, keep: list) -> Any:
    """``value`` checked for a field of dtype ``field`` (``name``: its path, as
    messages give it: ``inner.x``, ``pts[1].x``), as numpy is to store it: a
    buffer's address for an 8-byte integer field (its export appended to
    ``keep``), a record's fields each checked as a field of its own (recursively),
    else the value that numpy would store as meant, or an error."""
    if isinstance(value, _FIELD_BUFFERS) and not (
        isinstance(value, (np.ndarray, np.void)) and (field.shape or field.names is not None)
    ):  # an array for a subarray field is its value; one for a record, its record
        if field.kind not in "iu" or field.itemsize != 8:
            holds = (
                ": a record field holds a tuple, one value per field, or a numpy.void of its dtype"
                if field.names is not None
                else ""
            )
            raise TypeError(
                f"record() field {name!r} is {field}: only an 8-byte integer field can "
                f"hold a buffer's address{holds}"
            )
        # A record a[i] points to a's memory, as a[i:i + 1] does (numpy would store
        # its value, a number, as the address).
        value = _shared_record(value, writable=False)
        # The export itself, not the object: it keeps the memory in place (a
        # bytearray cannot be resized while the record or a launch of it lives).
        ref = value if isinstance(value, ByRef) else _pointed(value, name)
        if not ref.address:  # a ByRef made with __new__ alone: no buffer exported
            raise ValueError(
                f"record() field {name!r} got a ByRef that holds no buffer; make it "
                "with by_ref(array)"
            )
        keep.append(ref)
        keep.extend(base_pins(value) if not isinstance(value, ByRef) else ())
        return ref.address
    if field.names is not None:
        return _record_value(name, field, value, keep)
    if field.subdtype is not None and field.base.names is not None:
        return _records_value(name, field, value, keep)
    if field.kind in "iufc":
        _check_number(name, field, field, value, scalar=True)
        if field.kind in "iu":
            value = _whole_number(name, field, field, value)
    elif field.kind == "b":
        value = _truth(name, field, value)
    elif field.subdtype is not None and field.base.kind in "iubfc":
        base = field.base
        if isinstance(value, (np.datetime64, np.timedelta64)) or (
            isinstance(value, np.ndarray) and value.dtype.kind in "mM"
        ):  # before its items become datetime.date, or ints for some units
            raise _dates_error(name, field, value)
        # Each item as a scalar field's: numpy truncates [1.5] and wraps
        # [np.int64(-1)] into an unsigned subarray as silently, and reads
        # [b"1", None] into a float one as [1.0, nan].
        try:
            items = np.asarray(value, dtype=object)
        except ValueError:  # ragged: numpy's own error, when it is stored
            items = None
        if items is None:
            pass
        elif base.kind == "b":
            checked = [_truth(name, field, v) for v in items.flat]
            value = np.array(checked, dtype=object).reshape(items.shape)
        elif base.kind in "iu":
            for v in items.flat:
                _check_number(name, field, base, v, scalar=False)
            checked = [_whole_number(name, field, base, v) for v in items.flat]
            value = np.array(checked, dtype=object).reshape(items.shape)
        elif not (isinstance(value, np.ndarray) and value.dtype.kind in "biuf"):
            for v in items.flat:  # checked, and given to numpy as it was
                _check_number(name, field, base, v, scalar=False)
    return value


def _record_value(name: str, field: np.dtype, value: Any, keep: list) -> Any:
    """``value`` for a field that is itself a record (a structured dtype, no
    shape), its fields each checked as a field of its own (``name.x``).  numpy
    stores a tuple field by field, a structured value of another dtype (a
    ``numpy.void``, a one-record array, a ctypes structure) by position, cast as
    silently as a number (1.5 into an int32 field as 1), and one value in every
    field: all are checked item by item.  A ``numpy.void`` or an array of
    ``field`` itself is stored as it is (nothing to convert)."""
    names = field.names
    order = f"({', '.join(names)})"
    start = f"record() field {name!r} is {field} and cannot hold"
    if isinstance(value, list) and len(value) == 1:  # [record]: numpy broadcasts it
        value = value[0]
    if isinstance(value, Record):
        # Its record, and what its address fields point to, kept by this one too
        # (its numpy.void alone would store those addresses and keep nothing).
        keep.extend(value.keep)
        value = value.data[0]
    if isinstance(value, (ctypes.Structure, ctypes.Union)):  # numpy reads its fields
        value = _ctypes_record(name, field, value)
    if isinstance(value, (np.void, np.ndarray)) and value.dtype.names is not None:
        if isinstance(value, np.ndarray) and value.size != 1:
            raise TypeError(
                f"{start} an array of {value.size} records: the field holds one (a "
                "numpy.void, a tuple)"
            )
        if value.dtype == field:
            return value  # the same layout: its bytes, as they are
        given = value.dtype.names
        if len(given) != len(names):
            count = f"{len(given)} field{'s' if len(given) != 1 else ''}"
            raise TypeError(
                f"{start} a record of {count} ({', '.join(given)}), for the {len(names)} "
                f"fields {order}"
            )
        if isinstance(value, np.ndarray):
            value = value.reshape(())[()]
        value = tuple(value[n] for n in value.dtype.names)  # by position, as numpy does
    if isinstance(value, dict):
        raise TypeError(
            f"{start} a dict, which numpy takes no record from: pass a tuple of the "
            f"fields' values in their order, {order}"
        )
    if isinstance(value, list):
        raise TypeError(
            f"{start} a list of {len(value)} items: the field holds one record, a tuple "
            f"of the fields' values in their order, {order}"
        )
    if isinstance(value, tuple):
        if len(value) != len(names):
            count = f"{len(value)} item{'s' if len(value) != 1 else ''}"
            raise ValueError(
                f"{start} {value!r}, a tuple of {count} for the {len(names)} fields {order}"
            )
        return tuple(
            _item_value(f"{name}.{n}", field.fields[n][0], v, keep)
            for n, v in zip(names, value, strict=True)
        )
    # One value, which numpy stores in every field: each checked (not a buffer:
    # its address would go into every 8-byte field).
    if isinstance(value, _FIELD_BUFFERS) or (
        not isinstance(value, (np.generic, str, bytes)) and _is_buffer(value)
    ):
        raise TypeError(
            f"{start} a buffer ({type(value).__name__}), which numpy would read as a "
            f"number for every field: pass a tuple of the fields' values, {order}"
        )
    return tuple(_item_value(f"{name}.{n}", field.fields[n][0], value, keep) for n in names)


def _item_value(name: str, field: np.dtype, value: Any, keep: list) -> Any:
    """``value`` for a field of a nested record, checked as a top-level field's,
    then converted as numpy stores it, so that numpy's own refusal (text that is no
    number, a float too large for a float32 field) names this field, not the
    top-level one."""
    stored = _field_value(name, field, value, keep)
    if field.base.names is not None:  # a record, or records: their fields were
        return stored
    converted = np.zeros(field.shape, field.base)
    try:
        with np.errstate(over="raise"):  # inf, as for a top-level field
            converted[...] = stored
    except (TypeError, ValueError, OverflowError, FloatingPointError) as exc:
        kind = TypeError if isinstance(exc, TypeError) else ValueError
        raise kind(
            f"record() field {name!r} is {field} and cannot hold {value!r} ({exc})"
        ) from None
    return converted if field.shape else converted[()]


def _records_value(name: str, field: np.dtype, value: Any, keep: list) -> Any:
    """``value`` for a subarray field of records: each record checked as a record
    field's (``name[i].x``), in the nested lists that numpy reads as the subarray's
    dimensions; an array of the field's own records is stored as it is."""
    base = field.base
    if isinstance(value, np.ndarray) and value.dtype == base:
        return value

    def walk(item: Any, path: str) -> Any:
        if isinstance(item, list) or (isinstance(item, np.ndarray) and item.ndim):
            return [walk(v, f"{path}[{i}]") for i, v in enumerate(item)]
        if isinstance(item, np.ndarray) and item.dtype.names is None:
            item = item[()]  # one number, in every field of every record
        return _field_value(path, base, item, keep)

    return walk(value, name)


def _ctypes_record(name: str, field: np.dtype, value: Any) -> np.void:
    """A ctypes structure (or union) as the ``numpy.void`` that numpy reads from its
    memory, of the dtype numpy gives its type (with its padding: numpy's own read
    of its buffer guesses a layout with padding, with a RuntimeWarning)."""
    try:
        layout = np.dtype(type(value))
    except (TypeError, ValueError) as exc:  # a bitfield, a c_char_p: no numpy dtype
        raise TypeError(
            f"record() field {name!r} is {field} and cannot hold a {type(value).__name__}, "
            f"a ctypes structure that numpy has no dtype for ({exc}): pass a tuple of its "
            "fields' values"
        ) from None
    return np.frombuffer(value, layout)[0].copy()


def _is_decimal(value: Any) -> bool:
    """Whether ``value`` is a ``decimal.Decimal`` (a number, but no ``numbers.Real``),
    without importing decimal: none exists before a module that defines it is imported,
    ``decimal`` or the ``_decimal`` or ``_pydecimal`` behind it (each importable
    without ``decimal``; ``_pydecimal``'s is another class than ``decimal``'s)."""
    for name in ("_decimal", "_pydecimal"):
        module = sys.modules.get(name)
        if module is not None and isinstance(value, module.Decimal):
            return True
    return False


def _whole_number(name: str, field: np.dtype, kind: np.dtype, value: Any) -> Any:
    """``value`` for an integer field (of dtype ``kind``; ``field`` for the message):
    a number that is whole and within the field's bounds, as a Python int, else a
    ValueError.  numpy truncates any real number (1.5, ``Fraction(3, 2)``,
    ``Decimal("1.5")``) silently; numpy 1 wraps an out-of-range int (with a
    warning), and every numpy casts a numpy integer (np.int64(-1) into uint64)
    silently.  Anything else (text, a bool) is numpy's to convert or refuse."""
    if isinstance(value, (bool, np.bool_)) or not (
        isinstance(value, numbers.Real) or _is_decimal(value)
    ):
        return value
    if not isinstance(value, numbers.Integral):
        try:
            whole = int(value)
        except (ValueError, OverflowError):  # nan, inf
            whole = None
        if whole is None or whole != value:
            raise ValueError(
                f"record() field {name!r} is {field} and cannot hold {value!r} (not a whole number)"
            )
    bounds = np.iinfo(kind)
    if not bounds.min <= int(value) <= bounds.max:
        raise ValueError(
            f"record() field {name!r} is {field} and cannot hold {value!r} "
            f"(it holds {bounds.min} to {bounds.max})"
        )
    return int(value)


def _dates_error(name: str, field: np.dtype, value: Any) -> TypeError:
    what = "an array" if isinstance(value, np.ndarray) else f"a numpy.{type(value).__name__}"
    unit = np.datetime_data(value.dtype)[0]
    return TypeError(
        f"record() field {name!r} is {field} and cannot hold {value!r}, {what}, whose "
        f"number numpy reads in its unit ({unit}), or refuses: pass x.view(np.int64) for "
        "its count of that unit"
    )


def _check_number(name: str, field: np.dtype, kind: np.dtype, value: Any, scalar: bool) -> None:
    """Refuse, for a number field (or an item of a subarray field: ``scalar`` false)
    of dtype ``kind``, a value that numpy would store as another number than was
    meant: None (NaN in a float or complex field), bytes (the number they spell:
    b"123" as the address 123), a datetime64 or timedelta64 (its count of units, or
    refused, depending on the unit), a complex number in a real field (its real
    part, with a ComplexWarning), a list or tuple for a scalar field (its one item:
    [3.0] as the address 3), and in an integer field a ctypes number or structure
    (its value, truncated: ``c_double(2.5)`` as 2), a bool in an 8-byte one."""
    if type(value) is int or type(value) is float:  # the common case: its own number
        return
    address = scalar and kind.kind in "iu" and kind.itemsize == 8
    start = f"record() field {name!r} is {field} and cannot hold {value!r}"
    if value is None:
        if kind.kind in "fc":
            how = ", which numpy would store as NaN: pass a number (float('nan') for NaN)"
        else:
            how = ": pass a number"
        raise TypeError(
            f"{start}{how}, or leave the field out: a field not given is zero"
            + (" (an address: NULL)" if address else "")
        )
    if isinstance(value, bytes):  # np.bytes_ too
        if address:
            how = (
                "pass an int (int(b) of digits), or for the address of a buffer the buffer "
                "itself or by_ref(buffer) (for bytes: np.frombuffer(b, np.uint8))"
            )
        else:
            how = "pass a number (int(b) or float(b) of digits)"
        raise TypeError(
            f"{start}: bytes are no number, but numpy reads the number they spell; {how}"
        )
    if isinstance(value, (np.datetime64, np.timedelta64)):
        raise _dates_error(name, field, value)
    if kind.kind != "c" and isinstance(value, (complex, np.complexfloating)):
        raise TypeError(
            f"{start}, a complex number, whose imaginary part numpy would drop: pass its "
            ".real, or declare the field complex"
        )
    if scalar and isinstance(value, (list, tuple)):
        where = (
            "; for the address of an array, pass the array (np.array(...)) or by_ref(buffer)"
            if address
            else ""
        )
        raise TypeError(f"{start}, a {type(value).__name__}: the field holds one number{where}")
    if kind.kind not in "iu":
        return
    if address:
        _check_address_or_number(name, field, value)
    elif not isinstance(value, (np.generic, str)) and _is_buffer(value):
        raise TypeError(
            f"record() field {name!r} is {field} and cannot hold a {type(value).__name__}, "
            "a buffer that numpy would read as a number, truncating a float "
            "(c_double(2.5) as 2): pass an int (int(x.value) of a ctypes number)"
        )


def _is_buffer(value: Any) -> bool:
    try:
        memoryview(value).release()
    except (TypeError, ValueError, BufferError):
        return False
    return True


def _check_address_or_number(name: str, field: np.dtype, value: Any) -> None:
    """Refuse, for an 8-byte integer field (one that can hold an address), a value
    that numpy would store as a number where an address may have been meant: a
    bool (``True`` as the address 1, ``False`` as NULL), and a buffer that
    record() does not take as one, which numpy reads as its value (a ctypes
    ``c_double()`` as 0: NULL, ``c_double(2.5)`` as 2; a ctypes structure)."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(
            f"record() field {name!r} is {field}, which holds an address or a number, and "
            f"cannot hold {value!r}: pass a buffer (its address is stored) or an int "
            "address (or number)"
        )
    if isinstance(value, (np.generic, bytes, str)) or not _is_buffer(value):
        return  # numbers, text, no buffer: numpy's to convert or refuse (bytes: above)
    if isinstance(value, _POINTER_TYPES):
        # by_ref(x) would store the address of the pointer itself, not the one it holds.
        raise TypeError(
            f"record() field {name!r} is {field}, which holds an address or a number, and "
            f"cannot hold a {type(value).__name__}, a ctypes pointer: pass the address it "
            "holds as an int, ctypes.cast(x, ctypes.c_void_p).value (what it points to is "
            "then yours to keep alive), or by_ref() of the buffer it points to "
            "(by_ref(x.contents)), which the launch keeps"
        )
    raise TypeError(
        f"record() field {name!r} is {field}, which holds an address or a number, and "
        f"cannot hold a {type(value).__name__}, a buffer that numpy would store as its "
        "value: pass by_ref(x) to store its address, or an int for a number "
        "(int(x.value) of a ctypes number)"
    )


def _truth(name: str, field: np.dtype, value: Any) -> Any:
    """``value`` for a bool field: True or False (numpy's too), or the integer 0 or 1,
    else an error.  numpy stores any other value as its truth, silently: ``"False"``
    and ``"0"`` as True, ``None`` as False, 2 as True."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, numbers.Integral):
        if value in (0, 1):
            return bool(value)
        raise ValueError(
            f"record() field {name!r} is {field} and cannot hold {value!r} (it holds True "
            "or False, or 1 or 0)"
        )
    raise TypeError(
        f"record() field {name!r} is {field} and cannot hold {value!r} (expected True or "
        "False: numpy would store its truth)"
    )


# What record() takes as a buffer whose address a field holds (any other value is
# converted by numpy: a one-item array.array would be stored as its item).
_FIELD_BUFFERS = (
    ByRef,
    np.ndarray,
    np.void,
    bytearray,
    memoryview,
    array.array,
    mmap.mmap,
    ctypes.Array,
)


def _pointed(obj: Any, name: str) -> _core.BufferRef:
    """A buffer a record field points to (any contiguous buffer, even read-only),
    exported for as long as the record and its launches live."""
    try:
        view = memoryview(obj)
    except ValueError:  # a closed mmap, a released memoryview, datetimes
        error = no_buffer_error(obj, f"record() field {name!r} got", "point to", "another buffer")
        if error is None:
            raise
        raise error from None
    if not view.c_contiguous or view.nbytes == 0:
        raise ValueError(
            f"record() field {name!r} needs a C-contiguous buffer of at least one byte"
        )
    if isinstance(obj, np.ndarray) and obj.dtype.hasobject:
        raise TypeError(
            f"record() field {name!r} got an array of Python objects (dtype {obj.dtype}); "
            "a host function cannot use object pointers without the GIL: pass numeric data"
        )
    return _core.BufferRef(obj, pin_only=True)


def _describe(layout: np.dtype) -> str:
    return f"dtype {layout} ({layout.itemsize} bytes)"


def _name(fn: Any) -> str:
    """The host function's name for messages (computed only when raising)."""
    return repr(getattr(fn, "__qualname__", fn))


def _check_layout(nbytes: int, dtype: Any, layout: np.dtype | None, what: str, fn: Any) -> None:
    if layout is None:
        return
    if dtype is not None and np.dtype(dtype) != layout:
        raise ValueError(
            f"host function {_name(fn)} declares user_data {_describe(layout)}, but {what} "
            f"has dtype {dtype}"
        )
    if nbytes != layout.itemsize:
        raise ValueError(
            f"host function {_name(fn)} declares user_data {_describe(layout)}, but {what} "
            f"holds {nbytes} bytes"
        )


@functools.cache
def _physical_memory() -> int:
    """This machine's memory in bytes (a copy larger than it cannot be made: trying
    would rather get the process killed, where memory is overcommitted)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):  # pragma: no cover - not on Linux
        return 1 << 62


def _null_for_a_reader(fn: Any, what: str) -> ValueError:
    return ValueError(
        f"host function {_name(fn)} reads its argument, and {what} would give it NULL; "
        "pass the data: nh.by_ref(array) (or the writable array itself) to share a "
        "buffer, bytes to copy, or the int address of memory you keep valid"
    )


_REF_ADDRESS = vars(_core.BufferRef)["address"].__get__
_REF_NBYTES = vars(_core.BufferRef)["nbytes"].__get__
_REF_DTYPE = vars(_core.BufferRef)["dtype"].__get__


def resolve_user_data(
    user_data: Any, layout: np.dtype | None, fn: Any, reads: bool = False
) -> tuple[int, Any]:
    """Return ``(address, owner)`` for ``user_data`` of ``fn``; ``owner`` must outlive the call.

    ``reads``: the body reads its argument, so None (a NULL it would follow) is refused.
    """
    if user_data is None:
        if layout is not None:
            raise ValueError(
                f"host function {_name(fn)} declares user_data {_describe(layout)}; pass a "
                "value of that layout (bytes-like to copy, or by_ref(array))"
            )
        if reads:
            raise _null_for_a_reader(fn, "user_data=None")
        return 0, None
    if isinstance(user_data, ByRef):
        # Its own export (as the native path reads it), past a subclass's properties.
        address = _REF_ADDRESS(user_data)
        if not address:  # made with __new__ alone: no buffer exported
            raise ValueError(
                "host_launch() got a ByRef that holds no buffer; make it with by_ref(array)"
            )
        _check_layout(_REF_NBYTES(user_data), _REF_DTYPE(user_data), layout, "by_ref(...)", fn)
        return address, user_data
    if isinstance(user_data, Record):
        # Shared, as by_ref shares a buffer: the body's writes land in the record.
        shared = ByRef(user_data.data, what="record()")
        _check_layout(shared.nbytes, shared.dtype, layout, "the record", fn)
        return shared.address, (shared, user_data.keep)
    if isinstance(user_data, bool):
        raise TypeError(
            "user_data must be None, an int address, bytes-like or by_ref(...); got a bool"
        )
    if isinstance(user_data, int):
        # Its value, as the enqueue reads it: an int subclass's own comparisons (an
        # __eq__ that calls 0 nonzero, a __ge__ that calls -1 in range) decide nothing.
        user_data = int.__index__(user_data)
        if not 0 <= user_data < _MAX_ADDRESS:
            raise ValueError(f"user_data address must be in [0, 2**64), got {user_data}")
        if user_data == 0 and layout is None and reads:
            raise _null_for_a_reader(fn, "user_data=0")
        if user_data == 0 and layout is not None:  # the body would read fields at NULL
            raise ValueError(
                f"host function {_name(fn)} declares user_data {_describe(layout)}, and "
                "user_data=0 is a NULL pointer to it; pass a value of that layout "
                "(bytes-like to copy, or by_ref(array)), or the address of one"
            )
        return user_data, None
    if isinstance(user_data, str):
        raise TypeError(
            "user_data must be bytes-like, not str; pass text.encode() to copy its bytes"
        )
    if isinstance(user_data, _POINTER_TYPES):
        raise TypeError(
            f"user_data is a ctypes pointer ({type(user_data).__name__}); its bytes are an "
            "address, which would be copied: pass int(ctypes.cast(x, ctypes.c_void_p).value) "
            "for that address (not owned), or by_ref(buffer) for the memory it points to"
        )
    if layout is None and isinstance(user_data, np.integer):
        raise TypeError(
            f"user_data is a numpy integer ({user_data.dtype}), which is ambiguous: pass "
            "int(x) for the address it holds, or x.tobytes() for a copy of its bytes (or "
            "declare the host function's dtype=)"
        )
    # A record of a writable array, a[i]: numpy writes through it (a[i]["f"] = 1
    # changes a), but exports its buffer read-only, so it would be copied and the
    # body's writes lost.  Its array view (0-d, the same memory) is shared instead.
    user_data = _shared_record(user_data)
    try:
        view = memoryview(user_data)
    except TypeError:
        raise TypeError(
            "user_data must be None, an int (a raw address, not owned), a read-only "
            "bytes-like object (copied), a writable buffer or by_ref(buffer) (shared), or "
            "a record(...) (shared); got "
            f"{type(user_data).__name__}"
        ) from None
    except ValueError:  # a closed mmap, a released memoryview, datetimes
        error = no_buffer_error(user_data, "user_data is", "share or copy", "another buffer")
        if error is None:
            raise
        raise error from None
    dtype = user_data.dtype if isinstance(user_data, (np.ndarray, np.generic)) else None
    # Its type codes, as the native BufferRef reads them (field names are no codes).
    if dtype.hasobject if dtype is not None else _core.format_holds_objects(view.format):
        held = f"dtype {dtype}" if dtype is not None else f"format {view.format!r}"
        raise TypeError(
            f"user_data holds Python objects ({held}): copying it would copy raw "
            "object pointers that the host function cannot use without the GIL; pass "
            "numeric data"
        )
    if view.nbytes == 0:
        raise ValueError(
            "user_data is empty (0 bytes): pass None for a NULL pointer, or data of at "
            "least one byte"
        )
    # The buffer's dtype where read (an array's, or buffer_dtype's answer): ByRef's.
    known: np.dtype | None | object = dtype if dtype is not None else _UNKNOWN
    if layout is not None and dtype is None:  # a typed buffer that is no array
        dtype = known = buffer_dtype(user_data, view)
    _check_layout(view.nbytes, dtype, layout, "user_data", fn)
    if not view.readonly:
        # Never copied: the host function's writes would go to the copy, and be lost.
        shared = ByRef(user_data, view, what="writable user_data", dtype=known)
        if _REF_NBYTES(shared) != view.nbytes:  # a __buffer__ that makes one per call
            raise ValueError(
                f"user_data gave a buffer of {view.nbytes} bytes, then one of "
                f"{_REF_NBYTES(shared)} bytes: it cannot be shared with a host function; "
                "pass by_ref(...) of one buffer"
            )
        return shared.address, shared
    try:
        if view.nbytes > _physical_memory():  # never tried: the copy would not fit
            raise MemoryError
        copy = _core.BufferRef(bytearray(view))  # C-order copy, whatever the source's strides
    except MemoryError:
        raise MemoryError(
            f"user_data of {view.nbytes} bytes (a {type(user_data).__name__} of shape "
            f"{getattr(user_data, 'shape', (view.nbytes,))}) could not be copied: not enough "
            "memory. A read-only buffer is copied at launch; pass a smaller one, or share "
            "writable memory instead (by_ref)"
        ) from None
    return copy.address, copy
