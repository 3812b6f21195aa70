"""Property-based fuzzing of the public API's arguments (hypothesis).

``BAD_INPUTS`` names each kind of bad input; for every kind hypothesis draws
instances (sizes, dtypes, values, layouts), and each call must raise TypeError,
ValueError or RuntimeError with a message that names the argument, leaving
``pending()`` and every argument's reference count as they were.  The mixed
tests draw valid and invalid arguments together: a call either does what it
says (checked after the stream synchronizes) or is refused that way.  All of it
runs on the simulator (CI) and on a GPU.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import numba
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from numba import carray, cfunc

import numba_hostfn as nh

REC = np.dtype([("a", np.int64), ("b", np.float64)])
DTYPES = [np.uint8, np.int16, np.int32, np.int64, np.float32, np.float64, np.complex128]
FUZZ = settings(
    max_examples=int(os.environ.get("NUMBA_HOSTFN_FUZZ_EXAMPLES", "6")),
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@nh.host_callback
def increment(p):
    carray(p, (1,), np.int64)[0] += 1


@nh.host_callback
def ignore(p):  # never reads its argument: launched with None
    pass


@nh.host_callback(dtype=REC)
def typed(d):
    d.a += 1


@cfunc("int32(voidptr)")
def _wrong_signature(p):
    return 0


async def _coroutine():
    pass


async def _async_generator():
    yield 1


@numba.njit
def _jitted(p):
    pass


def _one_argument(user_data):
    pass


def _noop_python():
    pass


def _two_arguments(a, b=1, *, c):
    pass


class _BadProtocol:
    def __init__(self, value):
        self.value = value

    def __cuda_stream__(self):
        return self.value


@dataclass
class Call:
    """One drawn call: what to run, what it must raise, and the arguments to watch."""

    run: Callable[[], object]
    exc: tuple[type[BaseException], ...]
    names: str  # a regex: the argument (or function) the message must name
    watched: list = field(default_factory=list)


def _launch(stream, fn=ignore, **kw):
    return lambda: nh.host_launch(stream, fn, **kw)


def _array(draw, min_size=1):
    dtype = draw(st.sampled_from(DTYPES))
    n = draw(st.integers(min_size, 64))
    return np.zeros(n, dtype)


def _closed_executor():
    ex = nh.HostExecutor(threads=1)
    ex.close()
    return ex


# kind -> draw(draw, stream) -> Call.  Each kind is one distinct way to get an
# argument wrong; the draws vary everything the kind leaves free.
BAD_INPUTS: dict[str, Callable] = {
    # -- the stream --
    "stream is None": lambda d, s: Call(
        lambda: nh.host_launch(None, ignore), (TypeError,), "stream"
    ),
    "stream is a bare int": lambda d, s: Call(
        (lambda h: lambda: nh.host_launch(h, ignore))(d(st.integers(0, 2**63))),
        (TypeError,),
        "stream|Stream",
    ),
    "stream has no __cuda_stream__": lambda d, s: Call(
        (lambda o: lambda: nh.host_launch(o, ignore))(
            d(st.sampled_from(["s", 1.5, [1], {"a": 1}, object(), b"x"]))
        ),
        (TypeError,),
        "stream",
    ),
    "__cuda_stream__ returns a bad value": lambda d, s: Call(
        (lambda v: lambda: nh.host_launch(_BadProtocol(v), ignore))(
            d(st.sampled_from([None, 5, (0,), (1, 2, 3), ("0", 1), (0, "h"), (0, -1), (0, 2**64)]))
        ),
        (TypeError, ValueError),
        "__cuda_stream__|stream",
    ),
    # -- the function --
    "fn is None": lambda d, s: Call(_launch(s, None), (TypeError,), "fn|callable"),
    "fn is a number": lambda d, s: Call(
        _launch(s, d(st.one_of(st.integers(), st.floats(allow_nan=False)))),
        (TypeError,),
        "fn|callable",
    ),
    "fn is a str or bytes": lambda d, s: Call(
        _launch(s, d(st.one_of(st.text(max_size=8), st.binary(max_size=8)))),
        (TypeError,),
        "fn|callable",
    ),
    "fn is a ctypes pointer of another prototype": lambda d, s: Call(
        _launch(
            s,
            ctypes.CFUNCTYPE(
                d(st.sampled_from([ctypes.c_int, ctypes.c_double, None])),
                *d(st.sampled_from([(), (ctypes.c_int,), (ctypes.c_void_p, ctypes.c_void_p)])),
            )(increment.address),
        ),
        (TypeError,),
        "CUhostFn",
    ),
    "fn is a NULL CUhostFn": lambda d, s: Call(
        _launch(s, nh.CUhostFn()), (ValueError, TypeError), "NULL|null"
    ),
    "fn is a numba cfunc of another signature": lambda d, s: Call(
        _launch(s, _wrong_signature), (TypeError,), "signature|void\\(voidptr\\)"
    ),
    "fn is a coroutine function": lambda d, s: Call(
        _launch(s, d(st.sampled_from([_coroutine, functools.partial(_coroutine)]))),
        (TypeError,),
        "coroutine",
    ),
    "fn is a numba.njit function": lambda d, s: Call(
        _launch(s, _jitted), (TypeError,), "njit.*host_callback"
    ),
    "fn is a Python function that needs arguments": lambda d, s: Call(
        _launch(s, d(st.sampled_from([_one_argument, _two_arguments]))),
        (TypeError,),
        "argument.*host_callback",
    ),
    "fn is an async generator function": lambda d, s: Call(
        _launch(s, _async_generator), (TypeError,), "coroutine|async"
    ),
    # -- user_data --
    "user_data with a Python callable": lambda d, s: Call(
        _launch(s, lambda: None, user_data=d(st.binary(min_size=1, max_size=16))),
        (ValueError,),
        "user_data",
    ),
    "user_data address out of range": lambda d, s: Call(
        _launch(s, user_data=d(st.one_of(st.integers(max_value=-1), st.integers(min_value=2**64)))),
        (ValueError,),
        "user_data",
    ),
    "user_data is a float": lambda d, s: Call(
        _launch(s, user_data=d(st.floats())), (TypeError,), "user_data|bytes-like"
    ),
    "user_data is a bool": lambda d, s: Call(
        _launch(s, user_data=d(st.booleans())), (TypeError,), "user_data|bool"
    ),
    "user_data is a str": lambda d, s: Call(
        _launch(s, user_data=d(st.text(min_size=1, max_size=8))),
        (TypeError,),
        "user_data|encode",
    ),
    "user_data is a list or dict": lambda d, s: Call(
        _launch(s, user_data=d(st.sampled_from([[1, 2], {"a": 1}, (1,), {1}]))),
        (TypeError,),
        "user_data|bytes-like",
    ),
    "user_data is an array of Python objects": lambda d, s: Call(
        (lambda a: _launch(s, user_data=a))(np.zeros(d(st.integers(1, 8)), object)),
        (TypeError,),
        "user_data|Python objects",
    ),
    "user_data is an empty buffer": lambda d, s: Call(
        _launch(
            s,
            user_data=d(
                st.sampled_from([b"", bytearray(), memoryview(b""), np.zeros(0, np.int64)])
            ),
        ),
        (ValueError,),
        "user_data|empty",
    ),
    "user_data is a ctypes pointer": lambda d, s: Call(
        _launch(
            s,
            user_data=d(
                st.sampled_from(
                    [
                        ctypes.c_void_p(0x1000),
                        ctypes.pointer(ctypes.c_int(1)),
                        ctypes.c_char_p(b"text"),
                    ]
                )
            ),
        ),
        (TypeError,),
        "user_data|ctypes pointer",
    ),
    "user_data is a numpy integer": lambda d, s: Call(
        _launch(
            s,
            user_data=d(st.sampled_from([np.int64, np.uint64, np.int32, np.uint32]))(
                d(st.integers(0, 2**31 - 1))
            ),
        ),
        (TypeError,),
        "user_data|numpy integer",
    ),
    "user_data missing for a declared dtype": lambda d, s: Call(
        _launch(s, typed), (ValueError,), "user_data"
    ),
    "user_data of the wrong size for a declared dtype": lambda d, s: Call(
        _launch(
            s,
            typed,
            user_data=d(st.binary(min_size=1, max_size=64).filter(lambda b: len(b) != 16)),
        ),
        (ValueError,),
        "user_data",
    ),
    "user_data of the wrong dtype for a declared dtype": lambda d, s: Call(
        _launch(s, typed, user_data=_array(d)), (ValueError,), "user_data"
    ),
    "by_ref of the wrong size for a declared dtype": lambda d, s: Call(
        _launch(s, typed, user_data=nh.by_ref(np.zeros(d(st.integers(2, 9)), REC))),
        (ValueError,),
        "user_data",
    ),
    # -- by_ref --
    "by_ref of a non-buffer": lambda d, s: Call(
        (lambda o: lambda: nh.by_ref(o))(d(st.sampled_from([[1], "s", 3, object(), None]))),
        (TypeError,),
        "by_ref",
    ),
    "by_ref of a read-only buffer": lambda d, s: Call(
        (lambda o: lambda: nh.by_ref(o))(d(st.binary(min_size=1, max_size=16))),
        (ValueError,),
        "by_ref|writable",
    ),
    "by_ref of a non-contiguous array": lambda d, s: Call(
        (lambda a: lambda: nh.by_ref(a))(np.zeros((4, d(st.integers(2, 8))))[:, 1]),
        (ValueError,),
        "by_ref|contiguous",
    ),
    "by_ref of an empty buffer": lambda d, s: Call(
        (lambda a: lambda: nh.by_ref(a))(np.zeros(0, d(st.sampled_from(DTYPES)))),
        (ValueError,),
        "by_ref|byte",
    ),
    "by_ref of an object array": lambda d, s: Call(
        (lambda a: lambda: nh.by_ref(a))(np.zeros(d(st.integers(1, 4)), object)),
        (TypeError,),
        "by_ref|Python objects",
    ),
    # -- host_copy --
    "host_copy dst is not a buffer": lambda d, s: Call(
        (lambda o, a: lambda: nh.host_copy(s, o, a))(
            d(st.sampled_from([[0] * 8, "x" * 8, 8, object()])), _array(d)
        ),
        (TypeError,),
        "dst",
    ),
    "host_copy src is not a buffer": lambda d, s: Call(
        (lambda a, o: lambda: nh.host_copy(s, a, o))(
            _array(d), d(st.sampled_from([[0] * 8, 8, object()]))
        ),
        (TypeError,),
        "src",
    ),
    "host_copy dst is read-only": lambda d, s: Call(
        (lambda n: lambda: nh.host_copy(s, bytes(n), bytearray(n)))(d(st.integers(1, 64))),
        (ValueError,),
        "dst",
    ),
    "host_copy sizes differ": lambda d, s: Call(
        (lambda n, m: lambda: nh.host_copy(s, bytearray(n), bytearray(m)))(
            *d(st.tuples(st.integers(1, 64), st.integers(1, 64)).filter(lambda t: t[0] != t[1]))
        ),
        (ValueError,),
        "dst|src|sizes",
    ),
    "host_copy dst and src overlap": lambda d, s: Call(
        (lambda buf, a, b, n: lambda: nh.host_copy(s, buf[a : a + n], buf[b : b + n]))(
            np.zeros(128, np.uint8), *_overlap(d)
        ),
        (ValueError,),
        "dst|src|overlap",
    ),
    "host_copy dtypes differ": lambda d, s: Call(
        (lambda a, b: lambda: nh.host_copy(s, a, b))(*_two_dtypes(d)),
        (ValueError,),
        "dst|src|dtype",
    ),
    "host_copy of a layout it cannot copy": lambda d, s: Call(
        (lambda a: lambda: nh.host_copy(s, a, np.zeros_like(a)))(
            (lambda k: np.zeros(d(st.integers(k + 1, 64)), np.int64)[::k])(d(st.integers(2, 4)))
        ),
        (ValueError,),
        "dst|src|layout",
    ),
    "host_copy rows of different shapes": lambda d, s: Call(
        (lambda a, b: lambda: nh.host_copy(s, a, b))(
            np.zeros((4, 8), np.int32)[:, :4], np.zeros((2, 16), np.int32)[:, :8]
        ),
        (ValueError,),
        "dst|src|row",
    ),
    "host_copy executor is not a HostExecutor": lambda d, s: Call(
        (lambda e: lambda: nh.host_copy(s, np.zeros(4), np.ones(4), executor=e))(
            d(st.sampled_from([1, "ex", object(), True]))
        ),
        (TypeError,),
        "executor",
    ),
    # -- release_after --
    "release_after on no stream": lambda d, s: Call(
        lambda: nh.release_after(None, object()), (TypeError,), "stream"
    ),
    "release_after executor is closed": lambda d, s: Call(
        (lambda e: lambda: nh.release_after(s, object(), executor=e))(_closed_executor()),
        (RuntimeError,),
        "executor|HostExecutor",
    ),
    # -- HostExecutor and executor= --
    "HostExecutor threads out of range": lambda d, s: Call(
        (lambda n: lambda: nh.HostExecutor(threads=n))(
            d(st.one_of(st.integers(max_value=0), st.integers(min_value=1025)))
        ),
        (ValueError,),
        "threads",
    ),
    "HostExecutor threads not an int": lambda d, s: Call(
        (lambda n: lambda: nh.HostExecutor(threads=n))(
            d(st.sampled_from([2.5, "4", True, None, [4]]))
        ),
        (TypeError,),
        "threads",
    ),
    "HostExecutor spin_us or poll_us out of range": lambda d, s: Call(
        (lambda k, v: lambda: nh.HostExecutor(**{k: v}))(
            d(st.sampled_from(["spin_us", "poll_us"])),
            d(st.one_of(st.floats(max_value=-0.001), st.floats(min_value=1e8, max_value=1e12))),
        ),
        (ValueError,),
        "spin_us|poll_us",
    ),
    "HostExecutor spin_us or poll_us not a number": lambda d, s: Call(
        (lambda k, v: lambda: nh.HostExecutor(**{k: v}))(
            d(st.sampled_from(["spin_us", "poll_us"])), d(st.sampled_from(["1", None, True]))
        ),
        (TypeError,),
        "spin_us|poll_us",
    ),
    "executor= is not a HostExecutor": lambda d, s: Call(
        (lambda e: _launch(s, executor=e))(d(st.sampled_from([1, "ex", object(), False]))),
        (TypeError,),
        "executor",
    ),
    "executor= is closed": lambda d, s: Call(
        (lambda e: _launch(s, executor=e))(_closed_executor()),
        (RuntimeError,),
        "executor|HostExecutor",
    ),
    # -- signals: blocking=False, done_future, async_done, add_callback --
    "blocking= is not a bool": lambda d, s: Call(
        (lambda b: lambda: nh.host_launch(s, _noop_python, blocking=b))(
            d(st.sampled_from([0, 1, "no", None, 2.5]))
        ),
        (TypeError,),
        "blocking",
    ),
    "blocking=False with compiled code": lambda d, s: Call(
        (lambda f: lambda: nh.host_launch(s, f, blocking=False))(
            d(st.sampled_from([increment, increment.ctypes]))
        ),
        (ValueError,),
        "blocking",
    ),
    "blocking=False with user_data": lambda d, s: Call(
        (lambda u: lambda: nh.host_launch(s, _noop_python, user_data=u, blocking=False))(
            d(st.one_of(st.integers(1, 2**62), st.binary(min_size=1, max_size=16)))
        ),
        (ValueError,),
        "user_data",
    ),
    "done_future or async_done of a non-stream": lambda d, s: Call(
        (lambda f, o: lambda: f(o))(
            d(st.sampled_from([nh.done_future, nh.async_done])),
            d(st.sampled_from([None, 3, "s", object()])),
        ),
        (TypeError, RuntimeError),
        "stream|loop",
    ),
    "add_callback of a non-callable or compiled code": lambda d, s: Call(
        (lambda c: lambda: nh.add_callback(s, c, None))(
            d(st.sampled_from([None, 3, "cb", increment, _coroutine]))
        ),
        (TypeError,),
        "callback|callable|coroutine",
    ),
    # -- host_callback --
    "host_callback of a non-function": lambda d, s: Call(
        (lambda o: lambda: nh.host_callback(o))(d(st.sampled_from([1, "f", b"", object()]))),
        (TypeError,),
        "host_callback|function",
    ),
    "host_callback with an unknown option": lambda d, s: Call(
        (lambda k: lambda: nh.host_callback(**{k: 1}))(
            d(st.sampled_from(["nopython", "parallel", "target", "bogus"]))
        ),
        (TypeError,),
        "host_callback|unexpected|option",
    ),
}


def _overlap(draw):
    n = draw(st.integers(2, 32))
    a = draw(st.integers(0, 128 - n))
    b = draw(st.integers(max(0, a - n + 1), min(128 - n, a + n - 1)))
    return a, b, n


def _two_dtypes(draw):
    first, second = draw(
        st.tuples(st.sampled_from(DTYPES), st.sampled_from(DTYPES)).filter(lambda t: t[0] != t[1])
    )
    nbytes = np.dtype(first).itemsize * np.dtype(second).itemsize * draw(st.integers(1, 4))
    return (
        np.zeros(nbytes // np.dtype(first).itemsize, first),
        np.zeros(nbytes // np.dtype(second).itemsize, second),
    )


def test_at_least_forty_kinds_of_bad_input():
    assert len(BAD_INPUTS) >= 40


@pytest.mark.parametrize("kind", list(BAD_INPUTS))
@FUZZ
@given(data=st.data())
def test_bad_input_is_refused_naming_the_argument(stream, kind, data):
    call = BAD_INPUTS[kind](data.draw, stream)
    run, exc, names = call.run, call.exc, call.names
    refs = _refcounts(run)
    before = nh.pending()
    error = None
    try:
        run()
    except (TypeError, ValueError, RuntimeError) as caught:
        error = (type(caught), str(caught))
    assert error is not None, f"{kind}: accepted"
    kind_of_error, message = error
    assert issubclass(kind_of_error, exc), f"{kind}: {kind_of_error.__name__}: {message}"
    assert _names(names, message), f"{kind}: the message does not name it: {message}"
    stream.sync()
    nh.drain()
    assert nh.pending() == before
    after = _refcounts(run)
    assert all(a <= b for a, b in zip(after, refs, strict=True)), f"{kind}: an argument was kept"


_SHARED = (type(None), bool, int, float, str, bytes, tuple, type)


def _refcounts(run) -> list[int]:
    """Reference counts of the objects a drawn call closes over (not the shared ones:
    None, numbers, strings and types are referenced from everywhere)."""
    cells = getattr(run, "__closure__", None) or ()
    return [
        sys.getrefcount(c.cell_contents) for c in cells if not isinstance(c.cell_contents, _SHARED)
    ]


def _names(pattern: str, message: str) -> bool:
    import re

    return re.search(pattern, message) is not None


# ---- valid and invalid together: either it does what it says, or it is refused ----


@dataclass
class _CopyCase:
    """A drawn host_copy: dst, src, and what must happen, worked out as they were drawn.

    ``refusal`` is None when the copy must be made, else the exception type and the
    exact start of its message (the rule it breaks, with its numbers). ``around``
    is the array dst is a part of, ``where`` the index of dst in it: a copy must
    leave the rest of it as it was.
    """

    dst: object
    src: object
    refusal: tuple[type[Exception], str] | None = None
    around: np.ndarray | None = None
    where: object = None


def _layout_refusal(role: str, view: np.ndarray) -> tuple[type[Exception], str]:
    return ValueError, (
        f"host_copy() {role} has a layout it cannot copy (shape {view.shape}, "
        f"strides {view.strides})"
    )


def _sizes_refusal(dst_bytes: int, src_bytes: int) -> tuple[type[Exception], str]:
    return ValueError, f"host_copy() sizes differ: dst holds {dst_bytes} bytes, src {src_bytes}"


_READ_ONLY = (ValueError, "host_copy() dst is read-only; pass a writable buffer")
_OVERLAP = (ValueError, "host_copy() dst and src overlap; copy through a temporary")

_COPY_CHOICES = [
    "contiguous",
    "bytes",
    "rows",
    "into rows",
    "adjacent",
    "sizes differ",
    "dtypes differ",
    "read-only",
    "overlap",
    "layout",
    "row shapes differ",
    "not a buffer",
]


@st.composite
def _copy_case(draw):
    """One host_copy case of each kind: copies (contiguous, bytes-like, rows evenly
    spaced on either side, adjacent parts of one array) and refusals, one rule
    broken at a time."""
    choice = draw(st.sampled_from(_COPY_CHOICES))
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    n = draw(st.integers(0, 16))
    src = np.arange(1, n + 1, dtype=np.int64).astype(dtype)  # no zero: a copy shows
    if choice == "contiguous":
        return _CopyCase(np.zeros(n, dtype), src)
    if choice == "bytes":
        dst = bytearray(src.nbytes)
        how = draw(st.sampled_from(["bytes", "bytearray", "memoryview", "array"]))
        data = src.tobytes()
        other = {"bytes": data, "bytearray": bytearray(data), "memoryview": memoryview(data)}
        return _CopyCase(dst, other.get(how, src))
    if choice in ("rows", "into rows", "row shapes differ"):
        rows, cols = draw(st.integers(2, 4)), draw(st.integers(1, 8))
        wide = np.zeros((rows, 16), dtype)
        dst = wide[:, :cols]  # rows of cols elements, 16 elements apart
        values = np.arange(1, rows * cols + 1).astype(dtype).reshape(rows, cols)
        if choice == "rows":  # from contiguous memory, or from other evenly spaced rows
            if draw(st.booleans()):
                src = values
            else:
                src = np.zeros((rows, 32), dtype)[:, :cols]
                src[...] = values
            return _CopyCase(dst, src, around=wide, where=(slice(None), slice(None, cols)))
        if choice == "into rows":  # rows into contiguous memory
            out = np.zeros(rows * 16, dtype)
            src = np.zeros((rows, 16), dtype)[:, :cols]
            src[...] = values
            return _CopyCase(out[: rows * cols], src, around=out, where=slice(None, rows * cols))
        # As many bytes, in other rows: r rows of c' elements, c' = rows * cols / r.
        other_rows = draw(st.sampled_from([r for r in (2, 3, 4, 6, 8) if r != rows]))
        total = rows * cols * other_rows  # scale both so that it divides
        width = total + 1  # wider than any row: neither is contiguous
        dst = np.zeros((rows, width), dtype)[:, : total // rows]
        src = np.zeros((other_rows, width), dtype)[:, : total // other_rows]
        item = dtype.itemsize
        return _CopyCase(
            dst,
            src,
            (
                ValueError,
                f"host_copy() row shapes differ: dst is {rows} rows of "
                f"{total // rows * item} bytes, src {other_rows} rows of "
                f"{total // other_rows * item}",
            ),
        )
    if choice == "adjacent":  # two parts of one array that touch and do not overlap
        base = np.zeros(2 * max(n, 1), dtype)
        m = max(n, 1)
        first = draw(st.booleans())
        dst, where = (base[:m], slice(None, m)) if first else (base[m:], slice(m, None))
        other = base[m:] if first else base[:m]
        other[...] = np.arange(1, m + 1).astype(dtype)
        return _CopyCase(dst, other, around=base, where=where)
    if choice == "sizes differ":
        extra = draw(st.sampled_from([-1, 1, 2, 3])) if n else draw(st.integers(1, 3))
        if draw(st.booleans()):
            dst = np.zeros(n + extra, dtype)  # one dtype: only the sizes differ
        else:
            dst = bytearray(max(src.nbytes + extra, 0))  # not both arrays: no dtype rule
        return _CopyCase(dst, src, _sizes_refusal(memoryview(dst).nbytes, src.nbytes))
    if choice == "dtypes differ":  # whatever the sizes: the dtype rule comes first
        other = np.dtype(draw(st.sampled_from([d for d in DTYPES if np.dtype(d) != dtype])))
        dst = np.zeros(draw(st.integers(0, 16)), other)
        if draw(st.booleans()):
            dst.flags.writeable = False  # and before the read-only rule
        return _CopyCase(
            dst, src, (ValueError, f"host_copy() dst has dtype {other} and src {dtype}:")
        )
    if choice == "read-only":  # even for zero bytes: checked before the sizes
        if draw(st.booleans()):
            dst = np.zeros(n, dtype)
            dst.flags.writeable = False
            return _CopyCase(dst, src, _READ_ONLY)
        return _CopyCase(bytes(src.nbytes), bytearray(src.tobytes()), _READ_ONLY)
    if choice == "overlap":
        base = np.zeros(128, np.uint8)
        a, b, m = _overlap(draw)
        return _CopyCase(base[a : a + m], base[b : b + m], _OVERLAP)
    if choice == "layout":
        k = draw(st.integers(2, 6))
        views = {
            "every other element": lambda: np.zeros(2 * k, dtype)[::2],
            "reversed": lambda: np.zeros(k, dtype)[::-1],
            "rows not contiguous": lambda: np.zeros((draw(st.integers(1, 3)), 2 * k), dtype)[
                :, ::2
            ],
            "rows reversed": lambda: np.zeros((k, 3), dtype)[::-1],
            "rows overlapping": lambda: np.lib.stride_tricks.as_strided(
                np.zeros(2 * k, dtype), shape=(k, k), strides=(dtype.itemsize, dtype.itemsize)
            ),
        }
        view = views[draw(st.sampled_from(sorted(views)))]()
        plain = np.zeros(view.shape, dtype)  # the same dtype and size: only the layout
        role = draw(st.sampled_from(["dst", "src"]))
        dst, src = (view, plain) if role == "dst" else (plain, view)
        return _CopyCase(dst, src, _layout_refusal(role, view))
    assert choice == "not a buffer"
    thing = draw(st.sampled_from([[0] * 8, 8, object(), "text"]))
    role = draw(st.sampled_from(["dst", "src"]))
    dst, src = (thing, src) if role == "dst" else (np.zeros(n, dtype), thing)
    return _CopyCase(
        dst, src, (TypeError, f"host_copy() {role} must be host memory with the buffer protocol")
    )


def _is_buffer(obj) -> bool:
    try:
        memoryview(obj)
    except TypeError:
        return False
    return True


def _contents(buffer) -> bytes:
    return bytes(np.ascontiguousarray(np.asarray(memoryview(buffer))).tobytes())


@settings(FUZZ, max_examples=20 * FUZZ.max_examples)
@given(case=_copy_case(), on_executor=st.booleans())
def test_host_copy_copies_or_refuses(stream, case, on_executor):
    """Each drawn case does exactly what the rules say: the copy is made (every byte
    of src in dst, nothing around dst touched, nothing enqueued for zero bytes), or
    it is refused with the one exception and reason that the case breaks, with
    nothing enqueued and nothing written."""
    from _device import Hold

    dst, src = case.dst, case.src
    dst_before = _contents(dst) if _is_buffer(dst) else None
    src_before = _contents(src) if _is_buffer(src) else None
    around_before = None if case.around is None else case.around.copy()
    executor = nh.HostExecutor(threads=2) if on_executor else None
    try:
        stream.sync()
        nh.drain()
        error = None
        with Hold(stream):  # nothing enqueued here can run (or be released) yet
            before = nh.pending()
            try:
                nh.host_copy(stream, dst, src, executor=executor)
            except (TypeError, ValueError) as caught:
                error = caught
            held = nh.pending() - before
        stream.sync()
        nh.drain()
        if case.refusal is not None:
            kind, reason = case.refusal
            assert error is not None, f"accepted; must raise {kind.__name__}: {reason}"
            assert type(error) is kind and str(error).startswith(reason), (
                f"{type(error).__name__}: {error}; must be {kind.__name__}: {reason}"
            )
            assert held == 0, "a refused copy enqueued something"
            if dst_before is not None:
                assert _contents(dst) == dst_before, "a refused copy wrote dst"
            return
        assert error is None, f"refused a valid copy: {type(error).__name__}: {error}"
        nbytes = memoryview(src).nbytes
        assert (held > 0) == (nbytes > 0), (held, nbytes)  # zero bytes: nothing enqueued
        assert _contents(dst) == src_before
        assert _contents(src) == src_before
        if case.around is not None:
            expected = around_before.copy()
            expected[case.where] = np.asarray(src).reshape(expected[case.where].shape)
            assert case.around.tobytes() == expected.tobytes(), "the copy wrote around dst"
    finally:
        if executor is not None:
            executor.close()
        nh.drain()


@settings(FUZZ, max_examples=10 * FUZZ.max_examples)
@given(
    data=st.one_of(
        st.none(),
        st.integers(-(2**65), 2**65),
        st.binary(min_size=8, max_size=24),
        st.sampled_from(["by_ref", "by_ref-rec", "rec", "array", "empty"]),
    ),
    fn=st.sampled_from(["increment", "typed"]),
)
def test_user_data_runs_or_is_refused(stream, data, fn):
    """A drawn user_data either reaches the function as documented, or is refused."""
    counter = np.zeros(1, np.int64)
    record = np.zeros(1, REC)
    host_fn = increment if fn == "increment" else typed
    live = False  # the function sees counter (increment) or record (typed) itself
    shared = None  # a writable buffer given as it is: shared, never copied
    if data == "by_ref":
        data, live = nh.by_ref(counter), fn == "increment"
    elif data == "by_ref-rec":
        data, live = nh.by_ref(record), fn == "typed"
    elif data == "rec":
        data = shared = np.zeros(1, REC)
    elif data == "array":
        data = shared = np.zeros(2, np.int64)
    elif data == "empty":
        data = b""
    elif fn == "increment" and (data is None or isinstance(data, int) and 0 <= data < 2**64):
        data, live = counter.ctypes.data, True  # never NULL or a wild address
    elif isinstance(data, int) and 0 <= data < 2**64:
        data = None
    before = nh.pending()
    try:
        nh.host_launch(stream, host_fn, user_data=data)
    except (TypeError, ValueError) as caught:
        assert _names("user_data", str(caught)), str(caught)
        stream.sync()
        nh.drain()
        assert nh.pending() == before
        return
    stream.sync()
    nh.drain()
    if live:
        assert (counter[0] if fn == "increment" else record[0]["a"]) == 1
    if shared is not None:  # both functions add 1 to the first int64: seen in place
        assert (shared[0]["a"] if shared.dtype == REC else shared[0]) == 1
