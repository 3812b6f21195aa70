"""host_copy, host_memcpy(_2d) and release_after, on both backends."""

import array
import ctypes
import functools
import gc
import mmap
import struct
import sys
import weakref

import numpy as np
import pytest
from _device import Hold, released_eventually, rerun_on_simulator, resizable

import numba_hostfn as nh

rng = np.random.default_rng(20261129)


def _random_bytes(n, offset=0):
    """n random bytes starting ``offset`` bytes into a fresh buffer (unaligned when odd)."""
    base = rng.integers(0, 256, n + offset + 8, dtype=np.uint8)
    return base[offset : offset + n]


@pytest.mark.parametrize("nbytes", [1, 3, 7, 64, 1023, 4097, (1 << 20) + 13])
@pytest.mark.parametrize("src_offset, dst_offset", [(0, 0), (1, 3), (5, 0)])
def test_contiguous_copies_of_awkward_sizes_and_offsets(stream, nbytes, src_offset, dst_offset):
    src = _random_bytes(nbytes, src_offset)
    dst_base = np.zeros(nbytes + dst_offset + 8, np.uint8)
    dst = dst_base[dst_offset : dst_offset + nbytes]
    nh.host_copy(stream, dst, src)
    stream.sync()
    assert np.array_equal(dst, src)
    assert not dst_base[:dst_offset].any() and not dst_base[dst_offset + nbytes :].any()


def test_copy_between_typed_arrays_and_buffer_kinds(stream):
    src = rng.random(1001)
    dst = np.empty_like(src)
    nh.host_copy(stream, dst, src)
    raw = bytearray(src.nbytes)
    nh.host_copy(stream, raw, memoryview(src))
    back = np.zeros(1001)
    nh.host_copy(stream, back, raw)  # stream order: raw is filled by then
    from_bytes = np.zeros(1001)
    nh.host_copy(stream, from_bytes, src.tobytes())  # a read-only source is fine
    stream.sync()
    assert np.array_equal(dst, src)
    assert np.array_equal(back, src)
    assert np.array_equal(from_bytes, src)


@pytest.mark.parametrize(
    "make_src, make_dst",
    [
        (lambda: rng.random((13, 21))[:, 3:17], lambda: np.zeros((13, 14))),  # padded src
        (lambda: rng.random((13, 14)), lambda: np.zeros((13, 40))[:, 5:19]),  # padded dst
        (lambda: rng.random((26, 15))[::2, 1:8], lambda: np.zeros((13, 9))[:, :7]),  # both
        (lambda: rng.random((6, 5, 4))[:, :3], lambda: np.zeros((6, 3, 4))),  # 3D, rows
    ],
    ids=["padded-src", "padded-dst", "both-padded", "3d-rows"],
)
def test_pitched_2d_copies(stream, make_src, make_dst):
    src, dst = make_src(), make_dst()
    whole = dst.base if dst.base is not None else dst
    whole[...] = -1.0  # poison, padding included
    expected = whole.copy()
    offset = dst.__array_interface__["data"][0] - whole.__array_interface__["data"][0]
    np.ndarray(dst.shape, dst.dtype, expected, offset, dst.strides)[...] = src
    nh.host_copy(stream, dst, src)
    stream.sync()
    assert np.array_equal(dst, src)
    assert np.array_equal(whole, expected)  # the padding of a pitched dst is left alone


def test_copy_is_stream_ordered_after_device_work(stream, device):
    src = device.host_array(4)
    dst = np.zeros(4, np.int32)
    device.store(stream, src, 0, 42, delay=0.05)  # device work writes src[0] later
    nh.host_copy(stream, dst, src)
    device.store(stream, src, 1, 7)  # and src[1] only after the copy
    stream.sync()
    assert list(dst) == [42, 0, 0, 0]
    assert list(src[:2]) == [42, 7]


@pytest.mark.parametrize(
    "dst, src, exc, match",
    [
        (b"12345678", np.zeros(8, np.uint8), ValueError, "read-only"),
        (np.zeros(8, np.uint8), np.zeros(9, np.uint8), ValueError, "sizes differ"),
        ([0] * 8, np.zeros(8, np.uint8), TypeError, "buffer protocol"),
        (np.zeros(8, np.uint8), "abcdefgh", TypeError, "buffer protocol"),
        (np.zeros(16)[::2], np.zeros(8), ValueError, "layout"),
        (np.zeros((4, 4))[::-1], np.zeros((4, 4)), ValueError, "layout"),
        (np.zeros((10, 20))[:, :7], np.zeros((7, 20))[:, :10], ValueError, "row shapes"),
        (np.zeros(4, np.int64), np.zeros(4, np.float64), ValueError, "view\\(np.uint8\\)"),
        (np.zeros(4, object), np.zeros(4, object), TypeError, "Python objects"),
    ],
    ids=[
        "readonly-dst",
        "sizes",
        "list",
        "str",
        "strided-1d",
        "negative",
        "rows",
        "dtypes",
        "objects",
    ],
)
def test_bad_input_rejected_with_nothing_enqueued(stream, dst, src, exc, match):
    with pytest.raises(exc, match=match):
        nh.host_copy(stream, dst, src)
    assert nh.pending() == 0


@pytest.mark.parametrize(
    "make_dst, make_src",
    [
        (lambda: np.zeros(2), lambda: array.array("q", [1, 2])),
        (lambda: array.array("d", [0, 0]), lambda: array.array("q", [1, 2])),
        (lambda: np.zeros(2), lambda: memoryview(np.array([1, 2]))),
        (lambda: (ctypes.c_double * 2)(), lambda: np.array([1, 2], np.int64)),
    ],
    ids=["array-from-array.array", "array.arrays", "array-from-memoryview", "ctypes-from-array"],
)
def test_typed_buffers_of_other_number_types_are_refused_as_numpy_arrays_are(
    stream, make_dst, make_src
):
    """host_copy refuses two numpy arrays of different dtypes (it copies bytes, where
    np.copyto would convert), but copied an int64 array.array, memoryview or ctypes
    array into float64 memory without a word: 1 became 5e-324.  Plain bytes
    (bytearray, bytes) still go with any dtype."""
    dst, src = make_dst(), make_src()
    with pytest.raises(ValueError, match="dtype float64 and src int64"):
        nh.host_copy(stream, dst, src)
    assert nh.pending() == 0
    assert list(memoryview(dst).cast("B")) == [0] * 16  # nothing was copied
    raw = bytearray(16)
    nh.host_copy(stream, raw, src)  # bytes take any dtype, either way round
    back = make_dst()
    nh.host_copy(stream, back, raw)
    stream.sync()
    assert bytes(raw) == bytes(memoryview(src).cast("B"))


@pytest.mark.parametrize(
    "make_src",
    [
        lambda: memoryview(np.arange(16, dtype=np.int8)),
        lambda: array.array("b", range(16)),
        lambda: np.arange(16, dtype=np.int8),
    ],
    ids=["memoryview", "array.array", "ndarray"],
)
def test_int8_buffers_are_typed_as_an_int8_array_is(stream, make_src):
    """A memoryview of an int8 array and an array.array("b") export format "b"
    (signed char), which was taken for plain bytes: copied into float64 memory
    without a word, where the int8 array itself is refused.  All three are int8."""
    with pytest.raises(ValueError, match="dst has dtype float64 and src int8"):
        nh.host_copy(stream, np.zeros(2), make_src())
    assert nh.pending() == 0
    dst = np.zeros(16, np.int8)
    nh.host_copy(stream, dst, make_src())
    stream.sync()
    assert dst.tolist() == list(range(16))


@pytest.mark.parametrize(
    "make_dst, make_src",
    [
        (lambda: np.zeros(16)[::2], lambda: memoryview(np.arange(8))),
        (lambda: np.zeros(4), lambda: memoryview(np.arange(8))[::2]),
        (lambda: array.array("d", [0] * 8), lambda: np.zeros(16, np.int64)[::2]),
    ],
    ids=[
        "strided-array-from-memoryview",
        "array-from-strided-memoryview",
        "array.array-from-strided",
    ],
)
def test_typed_buffers_dtypes_are_compared_before_their_layouts(stream, make_dst, make_src):
    """Two numpy arrays of other dtypes are refused for their dtypes whatever their
    layouts; a typed buffer that is no array (a memoryview, array.array) was checked
    only after both layouts, so the same mismatch said "layout" instead (and a
    np.ascontiguousarray(...) as it advised then hit the dtype error)."""
    with pytest.raises(ValueError, match="dst has dtype float64 and src int64"):
        nh.host_copy(stream, make_dst(), make_src())
    assert nh.pending() == 0


@pytest.mark.parametrize("dtype", ["M8[s]", "m8[ns]"])
def test_arrays_numpy_exports_no_buffer_of_are_refused_by_host_copy(stream, dtype):
    """A datetime64 or timedelta64 array raised numpy's own "cannot include dtype 'M'
    in a buffer", naming neither host_copy nor the way out; its integer view copies."""
    src = np.arange(4).astype(dtype)
    dst = np.zeros(4, dtype)
    with pytest.raises(TypeError, match=r"host_copy\(\) dst has dtype .*view\(np.int64\)"):
        nh.host_copy(stream, dst, src)
    with pytest.raises(TypeError, match=r"host_copy\(\) src has dtype"):
        nh.host_copy(stream, bytearray(32), src)  # plain bytes: no dtype to compare
    assert nh.pending() == 0
    with pytest.raises(ValueError, match="dtype int64 and src"):  # dtypes first, as ever
        nh.host_copy(stream, np.zeros(4, np.int64), src)
    nh.host_copy(stream, dst.view(np.int64), src.view(np.int64))
    stream.sync()
    assert (dst == src).all()


_REFERENCES = [
    pytest.param(lambda: np.zeros(4, [("t", "M8[s]"), ("o", object)]), id="object-and-date"),
    pytest.param(
        lambda: np.array(["x" * 60] * 4, dtype=np.dtypes.StringDType()),
        id="StringDType",
        marks=pytest.mark.skipif(
            not hasattr(getattr(np, "dtypes", None), "StringDType"), reason="numpy < 2"
        ),
    ),
]


@pytest.mark.parametrize("make", _REFERENCES)
def test_arrays_of_references_numpy_exports_no_buffer_of_are_refused_as_objects(stream, make):
    """An array whose elements are references numpy exports no buffer of (numpy 2's
    StringDType; an object field beside a datetime) was told to pass .view(np.uint8)
    of both arrays, which numpy refuses ("Cannot change data-type for array of
    references"), and which would copy pointers.  It is refused as what it holds:
    Python objects, as an object array is."""
    for dst, src, role in ((make(), make(), "dst"), (bytearray(64 * 8), make(), "src")):
        with pytest.raises(TypeError, match=rf"host_copy\(\) {role} holds Python objects"):
            nh.host_copy(stream, dst, src)
    assert nh.pending() == 0


@pytest.mark.parametrize("role", ["dst", "src"])
def test_a_released_memoryview_is_refused_as_released(stream, role):
    """numpy takes a released memoryview for an object (a 0-d array of dtype object),
    so host_copy said the buffer "holds Python objects": the wrong error, and type."""
    released = memoryview(bytearray(8))
    released.release()
    buffers = {"dst": np.zeros(1), "src": np.zeros(1), role: released}
    with pytest.raises(ValueError, match=rf"host_copy\(\) {role} is a released memoryview"):
        nh.host_copy(stream, buffers["dst"], buffers["src"])
    assert nh.pending() == 0


def test_a_layout_it_cannot_copy_is_refused_with_advice_that_copies(stream):
    """The refusal of a layout advised "pass np.ascontiguousarray(...)" for either
    buffer.  For dst that is a copy of dst: host_copy then filled the copy, and dst
    kept its old contents without a word.  (For src it is a copy taken at the call,
    not in stream order.)  The advice now fits the role, and names a copy numpy
    makes in stream order, which works."""
    dst, src = np.zeros(16)[::2], np.arange(8.0)
    with pytest.raises(ValueError, match=r"host_copy\(\) dst has a layout") as caught:
        nh.host_copy(stream, dst, src)
    assert "ascontiguousarray" not in str(caught.value)
    assert "read the result from it" in str(caught.value)
    assert "host_launch(stream, functools.partial(np.copyto, dst, src))" in str(caught.value)
    with pytest.raises(ValueError, match=r"src .*np.ascontiguousarray\(src\) where src holds"):
        nh.host_copy(stream, src.copy(), np.arange(16.0)[::2])
    assert nh.pending() == 0
    nh.host_launch(stream, functools.partial(np.copyto, dst, src))  # as advised
    stream.sync()
    assert (dst == src).all()


def test_overlapping_buffers_rejected(stream):
    a = np.zeros(100, np.uint8)
    with pytest.raises(ValueError, match="overlap"):
        nh.host_copy(stream, a[10:60], a[30:80])
    with pytest.raises(ValueError, match="overlap"):
        nh.host_copy(stream, a, a)
    assert nh.pending() == 0
    nh.host_copy(stream, a[:50], a[50:])  # adjacent is fine
    stream.sync()


def test_host_copy_copies_between_interleaved_columns(stream):
    """Column slices of one array share a span but no byte: copied, not refused as
    overlapping (the spans alone were once compared)."""
    a = np.arange(32.0).reshape(4, 8)
    expected = a[:, 4:].copy()
    nh.host_copy(stream, a[:, :4], a[:, 4:])
    stream.sync()
    assert (a[:, :4] == expected).all()
    b = np.arange(32.0).reshape(4, 8)
    nh.host_copy(stream, b[:, :2], b.reshape(8, 4)[:4, 2:])  # another pitch, no byte shared
    stream.sync()
    assert (b[:, :2] == np.arange(32.0).reshape(8, 4)[:4, 2:]).all()


def test_host_copy_still_refuses_rows_that_overlap(stream):
    a = np.arange(40.0).reshape(5, 8)
    with pytest.raises(ValueError, match="overlap"):
        nh.host_copy(stream, a[:, :6], a[:, 2:])
    with pytest.raises(ValueError, match="overlap"):
        nh.host_copy(stream, a[1:, :4], a[:4, :4])  # rows 1 to 3 in both
    with pytest.raises(ValueError, match="overlap"):
        nh.host_copy(stream, a[:4, :2], a.reshape(10, 4)[:4, :2])  # another pitch, row 0
    with pytest.raises(ValueError, match="overlap"):
        nh.host_copy(stream, a[:2, :4], a.ravel()[6:14])  # contiguous src across a row
    assert nh.pending() == 0


def test_the_overlap_check_agrees_with_the_bytes_of_random_row_layouts():
    """host_copy's check against the byte sets themselves: rows of every pitch, a
    contiguous region against rows, one pitch and two."""
    from numba_hostfn._hostcopy import _overlap, _Region

    choose = np.random.default_rng(20261204)
    for _ in range(5000):
        regions = []
        for _ in range(2):
            rows, row_bytes = (int(v) for v in choose.integers(1, 7, 2))
            pitch = row_bytes + int(choose.integers(0, 6)) * int(choose.random() < 0.7)
            regions.append(_Region(None, int(choose.integers(0, 40)), rows, row_bytes, pitch, True))
        if choose.random() < 0.5 and regions[0].pitch >= regions[1].row_bytes:
            d, s = regions
            regions[1] = _Region(None, s.address, s.rows, s.row_bytes, d.pitch, True)
        d, s = regions
        bytes_of = [
            {r.address + j * r.pitch + k for j in range(r.rows) for k in range(r.row_bytes)}
            for r in (d, s)
        ]
        assert _overlap(d, s) == bool(bytes_of[0] & bytes_of[1]), (d, s)


class _Protocol:
    """A stream whose __cuda_stream__ returns value, or raises it."""

    def __init__(self, value):
        self.value = value

    def __cuda_stream__(self):
        if isinstance(self.value, BaseException):
            raise self.value
        return self.value


@pytest.mark.parametrize(
    "call",
    [lambda s: nh.host_copy(s, np.zeros(0), np.zeros(0)), lambda s: nh.release_after(s)],
    ids=["host_copy of 0 bytes", "release_after of nothing"],
)
def test_a_call_with_nothing_to_enqueue_still_checks_its_stream(call):
    """As host_launch checks it: the value __cuda_stream__ returns, and what it raises."""
    with pytest.raises(TypeError, match="expected \\(0, handle\\)"):
        call(_Protocol((0, "x")))
    with pytest.raises(KeyError, match="raised by __cuda_stream__"):
        call(_Protocol(KeyError("raised by __cuda_stream__")))
    assert nh.pending() == 0


def test_zero_bytes_enqueue_nothing(stream):
    nh.host_copy(stream, np.zeros(0), np.zeros(0))
    assert nh.pending() == 0


#: Each call with something to enqueue, and the same call with nothing: a zero-byte
#: copy (numpy arrays, bytearrays) and release_after with no objects.
_FULL_AND_EMPTY = {
    "host_copy": (
        lambda t: nh.host_copy(t, np.zeros(4), np.ones(4)),
        [
            lambda t: nh.host_copy(t, np.zeros(0), np.zeros(0)),
            lambda t: nh.host_copy(t, bytearray(), bytearray()),
        ],
    ),
    "release_after": (
        lambda t: nh.release_after(t, object()),
        [lambda t: nh.release_after(t)],
    ),
}


def _refusal(call, target):
    with pytest.raises(Exception) as caught:
        call(target)
    return type(caught.value), str(caught.value)


def _refused_alike(target, name):
    """The empty calls of ``name`` on ``target`` raise what the full one raises, and
    enqueue and keep nothing, as it does."""
    full, empties = _FULL_AND_EMPTY[name]
    held = nh._core.held()
    expected = _refusal(full, target)
    for empty in empties:
        assert _refusal(empty, target) == expected
    assert nh.pending() == 0 and nh._core.held() == held
    return expected


@pytest.mark.parametrize("name", sorted(_FULL_AND_EMPTY))
@pytest.mark.parametrize("ended", [False, True], ids=["never began", "ended"])
def test_a_call_with_nothing_to_enqueue_refuses_a_builder_not_building(stream, name, ended):
    """A zero-byte host_copy and an empty release_after returned None on a GraphBuilder
    that is not building, which the same call with something to enqueue refuses."""
    builder = stream.create_graph_builder()
    if ended:
        builder.begin_building()
        builder.end_building()
    error, message = _refused_alike(builder, name)
    assert error is RuntimeError and message.startswith(f"{name}() was given a GraphBuilder")
    builder.close()


@pytest.mark.parametrize("name", sorted(_FULL_AND_EMPTY))
def test_a_call_with_nothing_to_enqueue_refuses_a_closed_simulated_stream(request, name):
    """As the same call with something to enqueue: the simulated stream's refusal."""
    if rerun_on_simulator(request):
        return
    s = nh.simulator.Stream()
    s.close()
    assert _refused_alike(s, name) == (
        RuntimeError,
        "the simulated stream is closed; create a new Stream",
    )


@pytest.mark.parametrize("name", sorted(_FULL_AND_EMPTY))
def test_a_call_with_nothing_to_enqueue_refuses_an_explicit_graph_on_the_simulator(request, name):
    """The simulator does not model explicit graphs: a call with something to enqueue
    on one raises SimulatorUnsupportedError, and the same call with nothing returned
    the graph as if it had been added to.  (A stand-in: a cuda.core GraphDefinition
    needs a driver to make; the target is recognized by its class's name and module.)"""
    if rerun_on_simulator(request):
        return
    definition = type("GraphDefinition", (), {"__module__": "cuda.core.graph"})()
    error, message = _refused_alike(definition, name)
    assert error is nh.SimulatorUnsupportedError, message


def test_a_call_with_nothing_to_enqueue_is_a_no_op_where_it_would_enqueue(stream, device):
    """On a good stream and in a capture the zero-sized calls add nothing, cheaply."""
    held = nh._core.held()
    assert nh.host_copy(stream, bytearray(), bytearray()) is None
    assert nh.release_after(stream) is None
    builder = stream.create_graph_builder().begin_building()
    assert nh.host_copy(builder, np.zeros(0), np.zeros(0)) is None
    assert nh.release_after(builder) is None
    src, dst = np.arange(4.0), np.zeros(4)
    alive = weakref.ref(src)
    nh.host_copy(builder, dst, src)  # a graph of one node: the empty calls added none
    graph = builder.end_building().complete()
    graph.launch(stream)
    stream.sync()
    graph.close()
    builder.close()
    assert (dst == np.arange(4.0)).all()
    del graph, builder, src
    assert released_eventually(alive, device)
    assert nh._core.held() == held


def test_dst_and_src_kept_alive_until_copied_then_released(stream, device):
    src = rng.random(1000)
    memory = bytearray(8000)  # dst's memory, to read the result without keeping dst
    dst = np.frombuffer(memory, np.float64)
    expected = src.copy()
    alive_src, alive_dst = weakref.ref(src), weakref.ref(dst)
    with Hold(stream):  # not a delay: gc.collect() with large libraries loaded is slow
        nh.host_copy(stream, dst, src)
        del src, dst
        gc.collect()
        assert alive_src() is not None and alive_dst() is not None
    stream.sync()
    nh.drain()
    gc.collect()
    assert alive_src() is None and alive_dst() is None
    assert np.array_equal(np.frombuffer(memory, np.float64), expected)


def _moved(buf):
    """Resize ``buf`` for real (it may move), and back."""
    grow = bytes(1 << 16) if isinstance(buf, bytearray) else array.array(buf.typecode, [0]) * 8192
    buf.extend(grow)
    del buf[-len(grow) :]


def _resizable_buffer(kind, value):
    """1 MiB: a contiguous copy that large is shared out among an executor's threads."""
    if kind == "bytearray":
        return bytearray([value]) * (1 << 20)
    return array.array("d", [float(value)]) * (1 << 17)


@pytest.mark.parametrize("executor", [False, True], ids=["driver", "executor"])
@pytest.mark.parametrize("layout", ["contiguous", "rows"])
@pytest.mark.parametrize("kind", ["bytearray", "array"])
def test_a_queued_copy_pins_its_buffers_memory(stream, kind, layout, executor):
    """host_copy holds a buffer export of dst and src until the copy has run (issue 31):
    a bytearray or array.array cannot be resized, and so moved under the copy, while
    it is queued (BufferError), and can once the copy ran and was drained."""
    src = _resizable_buffer(kind, 7)
    dst = _resizable_buffer(kind, 0)
    pool = nh.HostExecutor(threads=2) if executor else None
    try:
        with Hold(stream):
            if layout == "contiguous":
                nh.host_copy(stream, dst, src, executor=pool)
                pinned = (dst, src)
            else:  # a pitched copy: rows of a strided array from the buffer
                rows = np.zeros((1024, 2048), np.uint8)[:, :1024]
                if kind == "array":  # float64 rows: uint8 ones are refused against "d"
                    rows = rows.view(np.float64)
                nh.host_copy(stream, rows, src, executor=pool)
                nh.host_copy(stream, dst, rows, executor=pool)
                pinned = (src, dst)
            for buf in pinned:
                assert not resizable(buf)
                with pytest.raises(BufferError):
                    _moved(buf)
        stream.sync()
        nh.drain()
        assert bytes(dst) == bytes(src)
        for buf in (dst, src):
            _moved(buf)  # released with the launch
    finally:
        if pool is not None:
            pool.close()


def test_a_memoryview_given_to_a_queued_copy_cannot_be_released(stream):
    """The copy's export is of the memoryview itself: releasing it while the copy is
    queued raises, instead of dropping the memory under the copy."""
    memory = bytearray(4096)
    dst = memoryview(memory)
    with Hold(stream):
        nh.host_copy(stream, dst, b"x" * 4096)
        with pytest.raises(BufferError):
            dst.release()
        assert not resizable(memory)
    stream.sync()
    nh.drain()
    dst.release()
    assert memory == b"x" * 4096 and resizable(memory)


@pytest.mark.parametrize("role", ["dst", "src"])
@pytest.mark.parametrize("as_view", [False, True], ids=["ndarray", "memoryview"])
def test_a_queued_copy_pins_the_buffer_under_an_ndarray_made_on_it(stream, role, as_view):
    """np.ndarray(shape, dtype, buffer=b) keeps b as its base but holds no buffer
    export of it: pinning the array alone left a bytearray resizable while a copy
    of it was queued, and resized, the copy wrote freed heap memory (glibc aborted:
    "free(): corrupted unsorted chunks").  Its base is pinned too, until the copy ran."""
    n = 1 << 16
    memory = bytearray(b"x") * n
    on_memory = np.ndarray((n,), np.uint8, buffer=memory)
    given = memoryview(on_memory) if as_view else on_memory
    other = bytearray(n)
    dst, src = (given, other) if role == "dst" else (other, given)
    with Hold(stream):
        nh.host_copy(stream, dst, src)
        del dst, src, given
        assert not resizable(memory)
        with pytest.raises(BufferError):
            _moved(memory)
    stream.sync()
    nh.drain()
    assert memory == other
    _moved(memory)  # released with the launch (the ndarray holds no export of it)
    assert nh.pending() == 0


class _Float64s(ctypes.Structure):
    _fields_ = [("values", ctypes.c_double * 64)]


#: Exporters between a copy's buffer and an ndarray made on a bytearray, each as
#: ``wrap(inner)``: a memoryview, a PickleBuffer or a ctypes object holds an export
#: of ``inner``, which holds none of its bytearray.
_WRAPPERS = {
    "asarray_of_memoryview": lambda inner: np.asarray(memoryview(inner)),
    "memoryview_of_that": lambda inner: memoryview(np.asarray(memoryview(inner))),
    "frombuffer_of_picklebuffer": lambda inner: np.frombuffer(
        __import__("pickle").PickleBuffer(inner), np.float64
    ),
    "ctypes_from_buffer": lambda inner: (ctypes.c_double * 64).from_buffer(inner),
    "ctypeslib_as_array": lambda inner: np.ctypeslib.as_array(
        (ctypes.c_double * 64).from_buffer(inner)
    ),
    "ctypes_field": lambda inner: _Float64s.from_buffer(inner).values,
    # from_address, inner kept in an attribute of the result (no export)
    "ctypeslib_as_ctypes": lambda inner: np.ctypeslib.as_ctypes(inner),
    "as_array_of_as_ctypes": lambda inner: np.ctypeslib.as_array(np.ctypeslib.as_ctypes(inner)),
}


@pytest.mark.parametrize("role", ["dst", "src"])
@pytest.mark.parametrize("wrap", list(_WRAPPERS))
def test_a_queued_copy_pins_the_buffer_under_an_ndarray_behind_another_exporter(stream, role, wrap):
    """An ndarray made on a bytearray, reached through a memoryview, a PickleBuffer or
    a ctypes object (``np.asarray(memoryview(inner))``): the walk to the memory's
    owner stopped at the first object that was no ndarray and pinned that, whose
    export pins ``inner`` but not its bytearray.  Resized under the queued copy, the
    bytearray's memory was freed and the copy wrote it (a segfault).  The walk now
    goes on through exporters to the bytearray, which is pinned until the copy ran."""
    memory = bytearray(8 * 64)
    inner = np.ndarray((64,), np.float64, buffer=memory)
    given = _WRAPPERS[wrap](inner)
    other = np.arange(64.0)
    dst, src = (given, other) if role == "dst" else (other, given)
    with Hold(stream):
        nh.host_copy(stream, dst, src)
        del dst, src, given, inner
        gc.collect()
        assert not resizable(memory)
        with pytest.raises(BufferError):
            _moved(memory)
    stream.sync()
    nh.drain()
    gc.collect()
    if role == "dst":
        assert np.frombuffer(memory, np.float64).tolist() == other.tolist()
    _moved(memory)  # released with the launch
    assert nh.pending() == 0


_PAIR = np.dtype([("a", np.float64), ("b", np.int64)])


@pytest.mark.parametrize("writeable", [True, False], ids=["writable", "read-only"])
@pytest.mark.parametrize("as_view", [False, True], ids=["record", "memoryview"])
def test_a_queued_copy_pins_the_buffer_under_a_record_it_copies(stream, writeable, as_view):
    """A record a[i] (a numpy.void) exports the memory of its array a, which numpy
    may hold no export of (np.ndarray(..., buffer=b)): base_pins followed the bases
    of an ndarray only, so a record given as src left its bytearray resizable while
    the copy was queued, and the copy read freed memory."""
    memory = bytearray(b"x") * (4 * _PAIR.itemsize)
    records = np.ndarray((4,), _PAIR, buffer=memory)
    records.flags.writeable = writeable
    src = memoryview(records[1]) if as_view else records[1]
    out = np.zeros(1, _PAIR)
    with Hold(stream):
        nh.host_copy(stream, out, src)
        del src, records
        assert not resizable(memory)
        with pytest.raises(BufferError):
            _moved(memory)
    stream.sync()
    nh.drain()
    assert bytes(out) == bytes(memory[16:32])
    _moved(memory)  # released with the launch
    assert nh.pending() == 0


@pytest.mark.parametrize("role", ["dst", "src"])
def test_a_queued_copy_pins_the_buffer_under_an_as_strided_view(stream, role):
    """np.lib.stride_tricks.as_strided (and sliding_window_view, made with it) gives
    an array whose base is numpy's DummyArray, no ndarray, which holds the array it
    was made from as its own ``base``: the chain to a bytearray under
    np.ndarray(..., buffer=b) stopped there, unpinned, while a copy wrote it."""
    memory = bytearray(8 * 64)
    on_memory = np.ndarray((64,), np.float64, buffer=memory)
    rows = np.lib.stride_tricks.as_strided(on_memory, shape=(16, 2), strides=(32, 8))
    other = np.arange(32.0).reshape(16, 2)
    dst, src = (rows, other) if role == "dst" else (other, rows)
    with Hold(stream):
        nh.host_copy(stream, dst, src)
        del dst, src, rows, on_memory
        assert not resizable(memory)
        with pytest.raises(BufferError):
            _moved(memory)
    stream.sync()
    nh.drain()
    _moved(memory)  # released with the launch
    assert nh.pending() == 0


def test_a_captured_copy_pins_its_buffers_for_the_graphs_life(device, stream):
    """In a graph the copy runs at every replay: the exports live as long as the graph."""
    src = bytearray(b"a") * 4096
    dst = bytearray(4096)
    builder = stream.create_graph_builder().begin_building()
    nh.host_copy(builder, dst, src)
    graph = builder.end_building().complete()
    graph.launch(stream)
    stream.sync()
    nh.drain()
    assert dst == src and not resizable(src) and not resizable(dst)
    graph.close()
    builder.close()
    assert released_eventually(lambda: None, device, pending=0)  # the graph's record
    _moved(src)
    _moved(dst)


def test_release_after_keeps_objects_until_the_stream_point(stream, device):
    class Payload:
        pass

    a, b = Payload(), np.zeros(10)
    alive = [weakref.ref(a), weakref.ref(b)]
    with Hold(stream):  # not a delay: gc.collect() with large libraries loaded is slow
        nh.release_after(stream, a, b)
        del a, b
        gc.collect()
        assert all(r() is not None for r in alive)
        assert nh.pending() == 2  # the hold's launch and this one
    stream.sync()
    nh.drain()
    gc.collect()
    assert all(r() is None for r in alive)
    nh.release_after(stream)  # nothing to keep: nothing enqueued
    assert nh.pending() == 0


def test_host_memcpy_with_host_launch_and_documented_layout(stream):
    src, dst = rng.random(64), np.zeros(64)
    data = np.array([(dst.ctypes.data, src.ctypes.data, src.nbytes)], nh.MEMCPY_LAYOUT)
    nh.host_launch(stream, nh.host_memcpy(), user_data=data)
    src2, dst2 = rng.random((4, 8)), np.zeros((4, 16))
    data2 = struct.pack("=6Q", dst2.ctypes.data, src2.ctypes.data, 4, 64, 128, 64)
    nh.host_launch(stream, nh.host_memcpy_2d(), user_data=data2)
    stream.sync()
    assert np.array_equal(dst, src)
    assert np.array_equal(dst2[:, :8], src2) and not dst2[:, 8:].any()
    assert nh.host_memcpy().dtype == nh.MEMCPY_LAYOUT
    assert nh.host_memcpy_2d().dtype == nh.MEMCPY_2D_LAYOUT


@pytest.mark.gpu
def test_pinned_cuda_core_buffer_accepted_and_device_buffer_rejected(device, stream):
    from cuda.core import LegacyPinnedMemoryResource

    pinned = LegacyPinnedMemoryResource().allocate(800)
    src = rng.random(100)
    nh.host_copy(stream, pinned, src)  # into pinned memory
    out = np.zeros(100)
    nh.host_copy(stream, out, pinned)  # and out of it
    stream.sync()
    assert np.array_equal(out, src)
    on_device = device.cuda.allocate(800, stream=stream)
    with pytest.raises(ValueError, match="device memory"):
        nh.host_copy(stream, on_device, src)
    stream.sync()
    on_device.close()
    pinned.close()


def test_captured_copy_replayed_copies_each_time(device, stream):
    src, dst = np.zeros(256), np.zeros(256)
    builder = stream.create_graph_builder().begin_building()
    nh.host_copy(builder, dst, src)
    graph = builder.end_building().complete()
    for value in (1.0, 2.0, 3.0):
        src[:] = value
        graph.launch(stream)
        stream.sync()
        assert (dst == value).all()
    graph.close()
    builder.close()


@pytest.mark.gpu
def test_host_memcpy_ctypes_accepted_by_cuda_core_graph_builder(device, stream):
    src, dst = rng.random(32), np.zeros(32)
    data = struct.pack("=3Q", dst.ctypes.data, src.ctypes.data, src.nbytes)
    builder = stream.create_graph_builder().begin_building()
    builder.callback(nh.host_memcpy().ctypes, user_data=data)  # cuda.core's own API
    graph = builder.end_building().complete()
    graph.launch(stream)
    stream.sync()
    assert np.array_equal(dst, src)
    graph.close()
    builder.close()


needs_buffer_dunder = pytest.mark.skipif(
    sys.version_info < (3, 12), reason="a Python class's __buffer__ needs 3.12"
)


@needs_buffer_dunder
def test_host_copy_pins_the_export_it_reads_the_address_from(stream):
    """host_copy reads the address from one export (a memoryview) and pins another
    (BufferRef(obj)): an object whose exports differ (a computed buffer) leaves the
    copy reading freed memory."""

    class Computed:  # each export is a fresh buffer of its bytes
        def __init__(self, n):
            self.n = n

        def __buffer__(self, flags):
            return memoryview(bytes([7]) * self.n)

    n = 1 << 20
    dst = np.zeros(n, np.uint8)
    with Hold(stream):
        nh.host_copy(stream, dst, Computed(n))
        gc.collect()
        junk = [bytes([0x55]) * n for _ in range(4)]  # reuse what was freed
    stream.sync()
    nh.drain()
    del junk
    assert (dst == 7).all()


def test_a_refused_host_copy_keeps_no_buffer_exported_while_its_error_lives(stream):
    """Invariant 3: a call that raises keeps nothing.  host_copy's pins of both
    buffers stayed in its traceback's frames, so a caught error (or the REPL's
    sys.last_exc) kept a bytearray unresizable."""
    dst, src = bytearray(8), bytearray(4)
    try:
        nh.host_copy(stream, dst, src)
    except ValueError as caught:
        error = caught
    assert "sizes differ" in str(error)
    dst.append(0)  # BufferError while the error kept the exports
    src.append(0)


def test_a_refused_host_copy_keeps_no_view_it_was_given_while_its_error_lives(stream):
    """Invariant 3 for the buffers themselves: host_copy's own frame, still running
    when it cleared the others, stayed in the traceback with its arguments, so a
    memoryview (or numpy view) made for the call kept its bytearray exported for as
    long as a caught error lived."""
    dst, src = bytearray(8), bytearray(4)
    try:
        nh.host_copy(stream, memoryview(dst), np.frombuffer(src, np.uint8))
    except ValueError as caught:
        error = caught
    assert "sizes differ" in str(error)
    assert resizable(dst) and resizable(src)
    closed = nh.HostExecutor(threads=1)
    closed.close()
    try:
        nh.host_copy(stream, memoryview(dst)[:4], memoryview(src), executor=closed)
    except RuntimeError as caught:
        error = caught
    assert "closed" in str(error)
    assert resizable(dst) and resizable(src)
    assert nh.pending() == 0


def test_a_refused_release_after_keeps_nothing_while_its_error_lives(stream):
    """Invariant 3 for release_after: its frame kept the objects it refused to keep."""
    buf = bytearray(8)
    closed = nh.HostExecutor(threads=1)
    closed.close()
    try:
        nh.release_after(stream, memoryview(buf), executor=closed)
    except RuntimeError as caught:
        error = caught
    assert "closed" in str(error)
    assert resizable(buf)
    assert nh.pending() == 0


def test_host_copy_takes_buffers_whose_format_numpy_cannot_read(stream):
    """Any buffer is accepted (docs/host_copies.md): host_copy copies bytes.  A ctypes
    array of pointers, long doubles or wide characters has a buffer format numpy
    cannot read ('<P', '<g', '<u'), and host_copy raised numpy's ValueError instead."""
    src = (ctypes.c_void_p * 64)(*range(1, 65))
    dst = (ctypes.c_void_p * 64)()
    nh.host_copy(stream, dst, src)
    wide = (ctypes.c_wchar * 8)()
    nh.host_copy(stream, wide, (ctypes.c_wchar * 8)(*"abcdefgh"))
    out = np.zeros(ctypes.sizeof(ctypes.c_longdouble) * 4, np.uint8)
    nh.host_copy(stream, out, (ctypes.c_longdouble * 4)(1.5, 2.5, 3.5, 4.5))
    stream.sync()
    assert list(dst) == list(range(1, 65)) and wide.value == "abcdefgh"
    assert bytes(out) == bytes((ctypes.c_longdouble * 4)(1.5, 2.5, 3.5, 4.5))
    with pytest.raises(ValueError, match="host_copy\\(\\) src has"):
        nh.host_copy(stream, np.zeros(32 * 8, np.uint8), memoryview(src)[::2])
    with pytest.raises(TypeError, match="Python objects"):
        nh.host_copy(stream, (ctypes.py_object * 2)(), (ctypes.py_object * 2)(1, 2))
    assert nh.pending() == 0


class _Padded(ctypes.Structure):  # 3 bytes of padding after a
    _fields_ = [("a", ctypes.c_uint8), ("b", ctypes.c_int32)]


def test_host_copy_takes_a_padded_ctypes_structure_without_a_warning(stream):
    """Before Python 3.12 ctypes leaves a structure's padding out of its buffer format
    ("T{<B:a:<i:b:}" for 8 bytes), which numpy reads with a RuntimeWarning ("a
    best-guess will be made of the data type"): host_copy warned for a valid buffer,
    and raised the warning where warnings are errors (as in this suite).  It copies
    the structure's bytes, as it copies any buffer's."""
    src = (_Padded * 3)(_Padded(1, 10), _Padded(2, 20), _Padded(3, 30))
    dst = (_Padded * 3)()
    nh.host_copy(stream, dst, src)
    one = _Padded()
    nh.host_copy(stream, one, _Padded(7, 70))
    raw = bytearray(ctypes.sizeof(_Padded))
    nh.host_copy(stream, raw, one)  # stream order: one is filled by then
    stream.sync()
    assert [(p.a, p.b) for p in dst] == [(1, 10), (2, 20), (3, 30)]
    assert (one.a, one.b) == (7, 70) and bytes(raw) == bytes(one)
    with pytest.raises(ValueError, match="sizes differ"):
        nh.host_copy(stream, (_Padded * 2)(), src)
    assert nh.pending() == 0


def test_host_copy_takes_a_record_of_a_packed_structured_array(stream):
    """numpy exports a record a[i] of a packed (align=False) structured dtype with a
    format of native alignment ("T{B:a:i:b:}", 8 bytes for 5), which numpy itself
    then refuses to read: host_copy raised numpy's RuntimeError ("Item size 5 for
    PEP 3118 buffer format string ... does not match") for a valid record."""
    packed = np.dtype([("a", np.uint8), ("b", "<i4")])
    records = np.array([(1, 10), (2, 20)], packed)
    out = np.zeros(1, packed)
    nh.host_copy(stream, out, records[1])
    stream.sync()
    assert out[0] == records[1]


def test_a_packed_structured_array_of_objects_is_refused_as_objects(stream):
    """numpy cannot read back its own export of a packed structured dtype with an
    object field: host_copy raised numpy's RuntimeError, not its "holds Python
    objects" TypeError."""
    packed = np.dtype([("a", np.uint8), ("o", object)])
    with pytest.raises(TypeError, match=r"host_copy\(\) dst holds Python objects"):
        nh.host_copy(stream, np.zeros(2, packed), np.zeros(2, packed))
    with pytest.raises(TypeError, match=r"host_copy\(\) src holds Python objects"):
        nh.host_copy(stream, bytearray(2 * packed.itemsize), np.zeros(2, packed))
    assert nh.pending() == 0


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda b: nh.host_copy(b, np.zeros(4), np.ones(4)), "host_copy"),
        (lambda b: nh.release_after(b, object()), "release_after"),
    ],
    ids=["host_copy", "release_after"],
)
def test_a_builder_not_building_is_refused_in_the_callers_name(stream, call, name):
    """The refusal named host_launch() whichever public function was called."""
    builder = stream.create_graph_builder()
    with pytest.raises(RuntimeError, match=f"^{name}\\(\\) was given a GraphBuilder that is not"):
        call(builder)
    assert nh.pending() == 0
    builder.close()


class _Interface:
    """Memory described by an ``__array_interface__`` with a raw address: an object
    that is no numpy array, whose memory belongs to another object, ``owner``,
    which it references but numpy does not (np.asarray(interface).base is the
    interface itself)."""

    def __init__(self, owner):
        self._owner = owner
        self.__array_interface__ = {
            "data": (owner.ctypes.data, False),
            "shape": owner.shape,
            "typestr": owner.dtype.str,
            "version": 3,
        }


class _Owner(np.ndarray):
    """An array that leaves its bytes in ``last_bytes`` when it is freed."""

    last_bytes: list = []

    def __del__(self):
        _Owner.last_bytes.append(self.tobytes())


@pytest.mark.parametrize("role", ["dst", "src"])
def test_a_queued_copy_keeps_the_owner_behind_an_array_interface_alive(stream, role):
    """An array made from an __array_interface__ object (no ndarray) has that object
    as its base, not the memory's owner: the launch must keep the whole chain (the
    array, the interface, the owner it references), or the copy runs on freed
    memory.  Everything else is dropped and collected while the stream is held."""
    n = 1 << 20
    pattern = (np.arange(n) % 251).astype(np.uint8)
    owner = (pattern if role == "src" else np.zeros(n, np.uint8)).copy().view(_Owner)
    alive = weakref.ref(owner)
    on_interface = np.asarray(_Interface(owner))
    assert type(on_interface.base) is _Interface
    out = np.zeros(n, np.uint8)
    dst, src = (on_interface, pattern) if role == "dst" else (out, on_interface)
    _Owner.last_bytes.clear()
    with Hold(stream):
        nh.host_copy(stream, dst, src)
        del dst, src, on_interface, owner
        gc.collect()
        assert alive() is not None  # owned by the launch, through the interface
        junk = [np.full(n, 0x55, np.uint8) for _ in range(4)]  # reuse what was freed
    stream.sync()
    nh.drain()
    gc.collect()
    del junk
    assert alive() is None  # released with the launch, once it ran
    copied = _Owner.last_bytes.pop() if role == "dst" else out.tobytes()
    assert copied == pattern.tobytes()


@pytest.mark.parametrize("role", ["dst", "src"])
def test_a_closed_mmap_is_refused_as_closed(stream, role):
    """A closed mmap raised mmap's own ValueError ("mmap closed or invalid"), naming
    neither host_copy nor which buffer it was."""
    closed = mmap.mmap(-1, 4096)
    closed.close()
    buffers = {"dst": bytearray(4096), "src": b"x" * 4096, role: closed}
    with pytest.raises(ValueError, match=rf"^host_copy\(\) {role} is a closed mmap"):
        nh.host_copy(stream, buffers["dst"], buffers["src"])
    assert nh.pending() == 0


def test_a_record_as_dst_is_refused_with_the_view_to_pass(stream):
    """A record a[i] of a writable structured array is writable through numpy
    (a[i]["a"] = 1 writes a), but exports its buffer read-only, as every numpy
    scalar does, and np.copyto refuses it as dst too.  host_copy refused it as
    "read-only; pass a writable buffer", which it looks like already: the message
    names a[i:i + 1], the writable view of the same memory, which copies."""
    records = np.zeros(4, _PAIR)
    src = np.array([(1.5, 7)], _PAIR)
    with pytest.raises(ValueError, match=r"dst is a numpy.void .* a\[i:i \+ 1\] for a record"):
        nh.host_copy(stream, records[1], src)
    with pytest.raises(ValueError, match="dst is read-only; pass a writable buffer"):
        nh.host_copy(stream, memoryview(records[1]), src)  # read-only, as it says
    records.flags.writeable = False
    with pytest.raises(ValueError, match="dst is read-only; pass a writable buffer"):
        nh.host_copy(stream, records[1], src)  # a record of a read-only array
    records.flags.writeable = True
    assert nh.pending() == 0
    nh.host_copy(stream, records[1:2], src)
    stream.sync()
    assert records[1] == src[0] and records[0] == records[2]
