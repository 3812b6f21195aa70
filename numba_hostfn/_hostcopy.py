"""Stream-ordered host copies and stream-ordered release of host objects.

``host_memcpy`` and ``host_memcpy_2d`` are ready ``HostFunction`` s that copy
between host buffers described by their user data; ``host_copy`` checks two
buffers and enqueues the right one, owning both until the copy has run;
``release_after`` keeps objects alive until the stream reaches a point.

The copy is LLVM's ``memcpy`` intrinsic (numba's ``cgutils.raw_memcpy``), which
the JIT lowers to the C library's ``memcpy``: as fast as ``np.copyto`` on large
buffers, and cacheable on disk, unlike a body that calls a ctypes pointer.
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _core
from ._compat import numba_hooks
from ._enqueue import check_empty, check_target, enqueue
from ._errors import keeps_nothing_on_refusal
from ._executor import check_executor
from ._hostfunction import HostFunction, host_callback
from ._userdata import base_pins, buffer_dtype, no_buffer_error

__all__ = [
    "MEMCPY_2D_LAYOUT",
    "MEMCPY_LAYOUT",
    "host_copy",
    "host_memcpy",
    "host_memcpy_2d",
    "release_after",
]

#: user_data of :func:`host_memcpy`: copy ``nbytes`` from ``src`` to ``dst``.
MEMCPY_LAYOUT = np.dtype([("dst", np.uint64), ("src", np.uint64), ("nbytes", np.uint64)])

#: user_data of :func:`host_memcpy_2d`: copy ``rows`` rows of ``row_bytes``,
#: row ``i`` from ``src + i * src_pitch`` to ``dst + i * dst_pitch``.
MEMCPY_2D_LAYOUT = np.dtype(
    [
        ("dst", np.uint64),
        ("src", np.uint64),
        ("rows", np.uint64),
        ("row_bytes", np.uint64),
        ("dst_pitch", np.uint64),
        ("src_pitch", np.uint64),
    ]
)

_PACK = struct.Struct("=QQQ")
_PACK_2D = struct.Struct("=QQQQQQ")


def _define_memcpy() -> None:
    """The globals the copy bodies call, made on first use (they import numba)."""
    from ._intrinsics import as_voidptr

    numba = numba_hooks()
    types = numba.types

    @numba.intrinsic
    def memcpy(typingctx, dst, src, nbytes):
        if dst != types.voidptr or src != types.voidptr or not isinstance(nbytes, types.Integer):
            return None

        def codegen(context, builder, signature, args):
            numba.cgutils.raw_memcpy(builder, args[0], args[1], args[2], 1)
            return context.get_dummy_value()

        return types.void(types.voidptr, types.voidptr, nbytes), codegen

    globals().update(_memcpy=memcpy, as_voidptr=as_voidptr)


def _copy(d):
    _memcpy(as_voidptr(d.dst), as_voidptr(d.src), d.nbytes)  # noqa: F821 - _define_memcpy


def _copy_2d(d):
    for row in range(d.rows):
        dst = as_voidptr(d.dst + row * d.dst_pitch)  # noqa: F821 - _define_memcpy
        src = as_voidptr(d.src + row * d.src_pitch)  # noqa: F821
        _memcpy(dst, src, d.row_bytes)  # noqa: F821


def _release_point(p):
    pass


@functools.cache
def _compiled(name: str) -> HostFunction:
    _define_memcpy()
    if name == "host_memcpy":
        return host_callback(_copy, dtype=MEMCPY_LAYOUT, cache=True)
    if name == "host_memcpy_2d":
        return host_callback(_copy_2d, dtype=MEMCPY_2D_LAYOUT, cache=True)
    return host_callback(_release_point, cache=True)


def host_memcpy() -> HostFunction:
    """The compiled copy function: user_data laid out as :data:`MEMCPY_LAYOUT`.

    Runs without the GIL.  ``dst`` and ``src`` must not overlap and must stay
    valid until it has run: :func:`host_copy` checks and ensures both.

    Returns
    -------
    HostFunction
        Usable with :func:`host_launch`, and through ``.ctypes`` with cuda.core's
        ``GraphBuilder.callback`` and graph host nodes.
    """
    return _compiled("host_memcpy")


def host_memcpy_2d() -> HostFunction:
    """The compiled pitched copy: user_data laid out as :data:`MEMCPY_2D_LAYOUT`.

    Returns
    -------
    HostFunction
    """
    return _compiled("host_memcpy_2d")


@dataclass(frozen=True)
class _Region:
    """Host memory as rows: ``rows`` rows of ``row_bytes``, ``pitch`` bytes apart.

    ``owner`` is what a launch that uses ``address`` must own: a buffer export of the
    object (``_core.BufferRef``), which keeps its memory in place (a ``bytearray``
    cannot be resized, a ``memoryview`` released, while it lives), or a cuda.core
    ``Buffer`` itself.
    """

    owner: Any
    address: int
    rows: int
    row_bytes: int
    pitch: int
    writable: bool
    #: The number type the buffer holds (``_userdata.buffer_dtype``: an array's, or the
    #: one a typed buffer's format names), None for plain bytes and a cuda.core Buffer.
    dtype: Any = None

    @property
    def nbytes(self) -> int:
        return self.rows * self.row_bytes

    @property
    def contiguous(self) -> bool:
        return self.rows <= 1 or self.pitch == self.row_bytes

    @property
    def end(self) -> int:
        return self.address + (self.rows - 1) * self.pitch + self.row_bytes if self.rows else 0


def _open(obj: Any, role: str) -> Any:
    """``obj`` as host_copy reads it: a ``_Region`` for a cuda.core ``Buffer``, else a
    memoryview of it (``obj`` itself if it is one, so that its own export pins it:
    ``release()`` raises).  None for a numpy array whose dtype numpy exports no buffer
    of (datetime64, timedelta64): ``_region`` refuses it, after the dtypes are compared."""
    kind = type(obj)
    if kind.__name__ == "Buffer" and (kind.__module__ or "").startswith("cuda.core"):
        if not obj.is_host_accessible:
            raise ValueError(
                f"host_copy() {role} is device memory ({obj!r}); host_copy copies between "
                "host buffers: copy device memory with cuda.core's Buffer.copy_to"
            )
        size = int(obj.size)
        return _Region(obj, int(obj.handle), 1, size, size, True)
    if isinstance(obj, memoryview):
        # Released: numpy took it for an object (an array of "Python objects").
        error = no_buffer_error(obj, f"host_copy() {role} is", "copy", "another host buffer")
        if error is not None:
            raise error
        return obj
    try:
        return memoryview(obj)
    except TypeError:
        raise TypeError(
            f"host_copy() {role} must be host memory with the buffer protocol (a numpy "
            f"array, bytearray, memoryview) or a host-accessible cuda.core Buffer; got "
            f"{kind.__name__}. Device arrays (CuPy, torch CUDA tensors) are not host memory"
        ) from None
    except ValueError:  # numpy's "cannot include dtype 'M' in a buffer"; a closed mmap
        if isinstance(obj, np.ndarray):
            return None
        error = no_buffer_error(obj, f"host_copy() {role} is", "copy", "another host buffer")
        if error is None:
            raise
        raise error from None


def _dtype(obj: Any, opened: Any) -> Any:
    """The number type of what ``_open`` made of ``obj`` (``_userdata.buffer_dtype``),
    None for plain bytes and a cuda.core ``Buffer``."""
    if isinstance(opened, _Region):
        return None
    if opened is None:  # an array numpy exports no buffer of: its own dtype
        return obj.dtype
    return buffer_dtype(obj, opened)


def _region(obj: Any, view: memoryview | None, role: str, dtype: Any) -> _Region:
    """``obj``'s memory as rows, from its ``view`` (``_open``'s)."""
    if view is None and obj.dtype.hasobject:  # StringDType; an object field and a date
        raise TypeError(
            f"host_copy() {role} holds Python objects (dtype {obj.dtype}); copying their "
            "pointers without their reference counts would corrupt them: copy with "
            "np.copyto, or host_copy numeric data"
        )
    if view is None:
        size = obj.dtype.itemsize
        same = f"np.int{8 * size}" if size in (1, 2, 4, 8) else "np.uint8"
        raise TypeError(
            f"host_copy() {role} has dtype {obj.dtype}, which numpy exports no buffer of: "
            f"host_copy copies bytes, so pass .view({same}) of both arrays (the same "
            "memory, as integers)"
        )
    # Its dtype first: numpy cannot read back its own export of a packed structured
    # dtype with an object field (a RuntimeError).
    arr = None if dtype is not None and dtype.hasobject else _as_array(view, role)
    if arr is None or arr.dtype.hasobject:
        raise TypeError(
            f"host_copy() {role} holds Python objects (dtype "
            f"{dtype if arr is None else arr.dtype}); copying their pointers without their "
            "reference counts would corrupt them: copy with np.copyto, or host_copy "
            "numeric data"
        )
    # The export the address is read from, pinned: a second export of ``obj`` need
    # not be the same memory (a ``__buffer__`` that makes a buffer per call).
    # And the memory of an ndarray's base, which numpy may hold no export of
    # (np.ndarray(buffer=bytearray)): its bytearray could be resized under the copy.
    owner = (_core.BufferRef(view, pin_only=True), *base_pins(view)) if arr.nbytes else obj
    address = arr.__array_interface__["data"][0]
    writable = not view.readonly
    if arr.flags.c_contiguous:
        return _Region(owner, address, 1, arr.nbytes, arr.nbytes, writable, dtype)
    if arr.ndim >= 2 and arr.shape[0] > 0 and arr.strides[0] > 0 and arr[0].flags.c_contiguous:
        row_bytes = arr[0].nbytes
        if arr.strides[0] >= row_bytes:
            return _Region(owner, address, arr.shape[0], row_bytes, arr.strides[0], writable, dtype)
    # Not np.ascontiguousarray(dst): a copy, which the copy would fill instead of dst.
    how = (
        "copy into a contiguous array (np.empty(shape, dtype)) and read the result from it"
        if role == "dst"
        else "pass np.ascontiguousarray(src) where src holds its data already (it is "
        "copied now, not in stream order)"
    )
    raise ValueError(
        f"host_copy() {role} has a layout it cannot copy (shape {arr.shape}, strides "
        f"{arr.strides}): it needs C-contiguous memory, or rows that are each contiguous "
        f"and evenly spaced; {how}, or copy with numpy in stream order: "
        "host_launch(stream, functools.partial(np.copyto, dst, src))"
    )


def _as_array(view: memoryview, role: str) -> np.ndarray:
    """``view``'s memory as a numpy array, without a copy.  A format numpy cannot
    read (ctypes pointers, ``c_longdouble``, ``c_wchar``: valid buffers) is taken as
    its bytes, which is all host_copy copies; such a buffer must be C-contiguous.
    So is a structure that numpy did not export (a ctypes ``Structure``, as
    ``buffer_dtype`` reads it): before Python 3.12 its format leaves out the
    padding, which numpy reads with a RuntimeWarning (an error where warnings are)."""
    if "{" not in view.format or isinstance(view.obj, np.ndarray):
        try:
            return np.asarray(view)
        except (ValueError, TypeError, NotImplementedError):
            pass
    if _core.format_holds_objects(view.format):
        raise TypeError(
            f"host_copy() {role} holds Python objects (format {view.format!r}); copying "
            "their pointers without their reference counts would corrupt them"
        )
    if not view.c_contiguous:
        raise ValueError(
            f"host_copy() {role} has the buffer format {view.format!r}, which numpy cannot "
            "read, and is not C-contiguous: host_copy can copy it only as contiguous bytes"
        )
    return np.frombuffer(view, np.uint8) if view.nbytes else np.zeros(0, np.uint8)


def _rows_meeting(start: int, end: int, r: _Region) -> tuple[int, int]:
    """The first and last row ``j`` of ``r`` whose bytes ``[r.address + j * r.pitch,
    + r.row_bytes)`` meet ``[start, end)`` (first > last: none)."""
    first = max(0, (start - r.address - r.row_bytes) // r.pitch + 1)
    last = min(r.rows - 1, -((r.address - end) // r.pitch) - 1)  # ceil((end - addr) / pitch) - 1
    return first, last


def _overlap(d: _Region, s: _Region) -> bool:
    """Whether a byte of ``d`` is a byte of ``s``: their rows, not only their spans
    (two column slices of one array interleave without overlapping)."""
    if not (d.address < s.end and s.address < d.end):
        return False
    if d.contiguous or s.contiguous:  # one interval against the other's rows
        whole, rows = (d, s) if d.contiguous else (s, d)
        first, last = _rows_meeting(whole.address, whole.end, rows)
        return first <= last
    if d.pitch == s.pitch:
        # Row i of d meets row j of s when m = i - j, -s.rows < m < d.rows, has
        # t - d.row_bytes < m * pitch < t + s.row_bytes, t = s.address - d.address.
        t, pitch = s.address - d.address, d.pitch
        low = max(1 - s.rows, (t - d.row_bytes) // pitch + 1)
        high = min(d.rows - 1, -(-(t + s.row_bytes) // pitch) - 1)  # ceil(...) - 1
        return low <= high
    # Each region's own rows are disjoint (pitch >= row_bytes): sorted by start, a
    # row that begins before an earlier row has ended is the other region's.
    starts = np.concatenate(
        [r.address + np.arange(r.rows, dtype=np.uint64) * np.uint64(r.pitch) for r in (d, s)]
    )
    ends = starts + np.repeat(np.array([d.row_bytes, s.row_bytes], np.uint64), [d.rows, s.rows])
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    return bool((starts[1:] < np.maximum.accumulate(ends)[:-1]).any())


def _check_same_dtype(dst: np.dtype, src: np.dtype) -> None:
    if dst != src and dst.itemsize > 0 and src.itemsize > 0:
        raise ValueError(
            f"host_copy() dst has dtype {dst} and src {src}: host_copy copies "
            "bytes and would not convert (np.copyto would); convert first, or copy the raw "
            "bytes with host_copy(stream, dst.view(np.uint8), src.view(np.uint8)) (of a "
            "buffer that is no numpy array: memoryview(x).cast('B'))"
        )


@keeps_nothing_on_refusal
def host_copy(stream: Any, dst: Any, src: Any, *, executor: Any = None) -> Any:
    """Copy ``src`` into ``dst`` on the host, in stream order and without the GIL.

    Typical use: after a device-to-host copy into pinned staging memory, move the
    data on into a pageable numpy array without synchronizing. Both buffers are
    owned by the launch until the copy has run, as buffer exports: a
    ``bytearray`` or ``array.array`` cannot be resized, nor a ``memoryview``
    released, meanwhile (``BufferError``).  Copies of zero bytes enqueue
    nothing, but are refused where a copy would be: a closed simulated
    stream, a ``GraphBuilder`` that is not building (``RuntimeError``).

    Parameters
    ----------
    stream : stream, GraphBuilder or explicit graph node
        As for :func:`host_launch`.  In a graph (a capturing stream, a
        ``GraphBuilder``, a ``GraphDefinition`` or ``GraphNode``) the copy runs
        at every replay and the buffers live as long as the graph.
    dst : writable host buffer
        A numpy array, ``bytearray``, writable ``memoryview`` or host-accessible
        cuda.core ``Buffer`` (pinned memory).
    src : host buffer
        Same kinds; may be read-only.
    executor : HostExecutor, optional
        Copy on the executor's threads (a copy of 1 MiB or more, contiguous,
        is split among them) instead of the driver's host-function thread.

    Returns
    -------
    cuda.core.graph.HostCallbackNode or None
        For an explicit graph, the new node (``stream`` itself if nothing was
        added); else None.

    Raises
    ------
    TypeError
        If ``stream`` is not a stream, GraphBuilder or explicit graph (as for
        :func:`host_launch`), ``executor`` is not a HostExecutor, or a buffer is
        not host memory with the buffer protocol, holds Python objects, or is a
        numpy array of a dtype numpy exports no buffer of (datetime64,
        timedelta64: pass ``.view(np.int64)`` of both).  Checked in that order:
        the stream (its ``__cuda_stream__`` asked once), ``executor``, the
        buffers.
    ValueError
        If two typed buffers have different dtypes (numpy arrays, or the number
        types a buffer's format names: ``array.array("q")``, ``memoryview(a)``, a
        ctypes number; ``host_copy`` copies bytes, so pass ``.view(np.uint8)`` of
        both to copy them raw; plain bytes, ``bytearray``, go with any dtype), ``dst`` is
        read-only (a record ``a[i]``, which numpy exports read-only: pass
        ``a[i:i + 1]``), the sizes or row shapes differ, a layout is
        neither C-contiguous nor evenly spaced contiguous rows, the two share a byte,
        a buffer is a released ``memoryview`` or a closed ``mmap``, or a cuda.core
        ``Buffer`` is device memory.  Nothing was enqueued.
    RuntimeError
        If the executor is closed, or the target refuses a launch (a closed
        simulated stream, a capture that cannot take a node, a GraphBuilder
        that is not building; a failing driver call: :class:`CudaDriverError`),
        as for :func:`host_launch`.  Nothing was enqueued.
    """
    # The stream first (its type, then its handle, read once), then executor=, then
    # the buffers, as host_launch, done_future and async_done check theirs: the
    # executor before the buffers, so that a zero-byte copy refuses a closed one.
    checked = check_target(stream, "host_copy")
    if executor is not None:
        check_executor(executor)
    d_view, s_view = _open(dst, "dst"), _open(src, "src")
    # One check of the number types, before either layout's: two numpy arrays, and
    # any typed buffer (array.array("q"), memoryview(a), a ctypes number), as user_data
    # is checked against a dtype; plain bytes alone have none to compare.
    d_dtype, s_dtype = _dtype(dst, d_view), _dtype(src, s_view)
    if d_dtype is not None and s_dtype is not None:
        _check_same_dtype(d_dtype, s_dtype)
    d = d_view if isinstance(d_view, _Region) else _region(dst, d_view, "dst", d_dtype)
    s = s_view if isinstance(s_view, _Region) else _region(src, s_view, "src", s_dtype)
    if not d.writable:
        if isinstance(dst, np.void) and dst.flags.writeable:
            # numpy writes through a[i] (a[i]["f"] = x), but exports it read-only, and
            # np.copyto refuses it too: the writable view of the same memory is a[i:i+1].
            raise ValueError(
                "host_copy() dst is a numpy.void (a record such as a[i]), whose buffer "
                "numpy exports read-only; pass a writable array: a[i:i + 1] for a record "
                "of a, the same memory"
            )
        raise ValueError("host_copy() dst is read-only; pass a writable buffer")
    if d.nbytes != s.nbytes:
        raise ValueError(f"host_copy() sizes differ: dst holds {d.nbytes} bytes, src {s.nbytes}")
    if d.nbytes == 0:
        return check_empty(stream, "host_copy", checked)
    if _overlap(d, s):
        raise ValueError("host_copy() dst and src overlap; copy through a temporary")
    keep = (d.owner, s.owner)  # the memory, not only the objects (LIFETIME.md, invariant 1)
    if d.contiguous and s.contiguous:
        data = _PACK.pack(d.address, s.address, d.nbytes)
        return enqueue(
            stream,
            host_memcpy(),
            data,
            keep,
            executor=executor,
            parallel_copy=True,
            caller="host_copy",
            checked=checked,
        )
    rows = d.rows if not d.contiguous else s.rows
    row_bytes = d.nbytes // rows
    for r in (d, s):
        if not r.contiguous and (r.rows, r.row_bytes) != (rows, row_bytes):
            raise ValueError(
                f"host_copy() row shapes differ: dst is {d.rows} rows of {d.row_bytes} bytes, "
                f"src {s.rows} rows of {s.row_bytes}"
            )
    d_pitch = d.pitch if not d.contiguous else row_bytes
    s_pitch = s.pitch if not s.contiguous else row_bytes
    data = _PACK_2D.pack(d.address, s.address, rows, row_bytes, d_pitch, s_pitch)
    return enqueue(
        stream,
        host_memcpy_2d(),
        data,
        keep,
        executor=executor,
        caller="host_copy",
        checked=checked,
    )


@keeps_nothing_on_refusal
def release_after(stream: Any, *objs: Any, executor: Any = None) -> Any:
    """Keep ``objs`` alive until ``stream`` reaches this point, then release them.

    They are released on the main thread (never on the driver's thread), so
    freeing a host buffer that in-flight GPU work still reads needs no
    synchronize.  In a graph (a capturing stream, a ``GraphBuilder``, an
    explicit graph) a node cannot release anything, since it runs at every
    replay: the objects live as long as the graph does.

    Parameters
    ----------
    stream : stream, GraphBuilder or explicit graph node
        As for :func:`host_launch`.
    *objs : object
        Anything; nothing is enqueued when none is given, but a target that
        refuses a launch (a closed simulated stream, a ``GraphBuilder`` that is
        not building) is refused all the same.
    executor : HostExecutor, optional
        Release from the executor's stream point instead of a host function
        on the driver's thread.

    Returns
    -------
    cuda.core.graph.HostCallbackNode or None
        For an explicit graph, the new node (``stream`` itself if nothing was
        added); else None.

    Raises
    ------
    TypeError
        If ``stream`` is not a stream, GraphBuilder or explicit graph (as for
        :func:`host_launch`), or ``executor`` is not a HostExecutor, checked in
        that order (the stream's ``__cuda_stream__`` asked once).
    RuntimeError
        If the executor is closed, or the target refuses a launch.  Nothing was
        enqueued.
    """
    # The stream first (its handle read once), then executor=, as host_copy checks.
    checked = check_target(stream, "release_after")
    if executor is not None:
        check_executor(executor)
    if not objs:
        return check_empty(stream, "release_after", checked)
    return enqueue(
        stream,
        _compiled("release_point"),
        None,
        objs,
        executor=executor,
        caller="release_after",
        checked=checked,
    )
