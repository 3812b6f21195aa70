"""Every bad argument raises the documented error, with nothing enqueued or kept."""

import array
import asyncio
import ctypes
import dataclasses
import functools
import gc
import mmap
import sys
import textwrap
import weakref

import numba
import numpy as np
import pytest
from _device import CHILD_PREAMBLE, Hold, child_env, resizable, run_child
from numba import cfunc

import numba_hostfn as nh
from numba_hostfn import _core

# Every test runs through host_launch's native fast path and through Python.
pytestmark = pytest.mark.usefixtures("launch_path")

REC = np.dtype([("a", np.int64), ("b", np.float64)])


@nh.host_callback
def touch(p):
    pass


@nh.host_callback(dtype=REC)
def typed(d):
    d.a += 1


class Callable:
    def __call__(self):
        pass


def _rejects(stream, exc, match, fn, **kwargs):
    """Assert host_launch raises, enqueued nothing, and kept no reference to its arguments."""
    before = nh.pending()
    refs = {name: sys.getrefcount(v) for name, v in kwargs.items() if v is not None}
    fn_refs = sys.getrefcount(fn)
    with pytest.raises(exc, match=match):
        nh.host_launch(stream, fn, **kwargs)
    stream.sync()
    nh.drain()
    assert nh.pending() == before
    gc.collect()
    assert sys.getrefcount(fn) == fn_refs
    for name, v in kwargs.items():
        if v is not None:
            assert sys.getrefcount(v) == refs[name], name


def test_none_stream_rejected():
    with pytest.raises(TypeError, match="needs a stream, got None"):
        nh.host_launch(None, touch)


@pytest.mark.parametrize("handle", [0, 12345, True])
def test_bare_int_stream_rejected_with_how_to_wrap(handle):
    with pytest.raises(TypeError, match="Stream.from_handle"):
        nh.host_launch(handle, touch)


def test_object_without_stream_protocol_rejected():
    with pytest.raises(TypeError, match="__cuda_stream__"):
        nh.host_launch(object(), touch)


def test_a_stream_class_instead_of_a_stream_is_refused_and_remembered_for_no_class(stream):
    """host_launch(Stream, fn), the class where a stream was meant (``Stream`` for
    ``Stream()``): its unbound ``__cuda_stream__`` was called with no argument, a
    TypeError about a missing ``self``, and the verdict "stream" was remembered for
    the type of every class (``type``), so any class passed after it, one with no
    ``__cuda_stream__`` at all, met an AttributeError instead of the TypeError."""
    held, pending = _core.held(), nh.pending()
    for cls in (type(stream), nh.simulator.Stream):
        for call, args in (
            (nh.host_launch, (touch,)),
            (nh.host_copy, (bytearray(8), bytes(8))),
            (nh.done_future, ()),
        ):
            with pytest.raises(TypeError, match=r"got the class \w*Stream as stream; .*not a"):
                call(cls, *args)
    for not_a_stream in (int, dict, Callable):
        with pytest.raises(TypeError, match=r"got the class .*__cuda_stream__"):
            nh.host_launch(not_a_stream, touch)
    assert (_core.held(), nh.pending()) == (held, pending)


def test_a_proxy_is_judged_by_what_it_proxies_not_by_its_type(stream):
    """A weakref.proxy takes its attributes from its referent, so whether it is a stream
    is not its type's: the verdict "stream" of a proxy of a stream was remembered for
    every proxy, and a proxy of a plain object then met an AttributeError from the
    protocol's read instead of the TypeError that names the protocol."""
    ran = []
    nh.host_launch(weakref.proxy(stream), lambda: ran.append(1))
    stream.sync()
    nh.drain()
    assert ran == [1]

    class NotAStream:
        pass

    held, pending = _core.held(), nh.pending()
    keep = NotAStream()
    with pytest.raises(TypeError, match="__cuda_stream__"):
        nh.host_launch(weakref.proxy(keep), touch)
    assert (_core.held(), nh.pending()) == (held, pending)


def test_bad_cuda_stream_protocol_value_rejected():
    class Weird:
        def __cuda_stream__(self):
            return (1, 2, 3)

    with pytest.raises(TypeError, match=r"expected\s+\(0, handle\)"):
        nh.host_launch(Weird(), touch)


class _Version(int):
    pass


@pytest.mark.parametrize(
    "version, named",
    [(0.0, "float"), (False, "bool"), (None, None), ("0", "str"), (_Version(0), "_Version")],
)
def test_only_the_int_zero_is_protocol_version_zero(stream, version, named):
    """(0.0, h), (False, h) and an int subclass's (0, h) compare equal to 0 but are not
    version 0 of the protocol; the error names the version's type where its repr
    reads as 0 (it printed "returned (0, h); expected (0, handle)")."""
    handle = stream.__cuda_stream__()[1]

    class Versioned:
        def __cuda_stream__(self):
            return (version, handle)

    before = nh.pending()
    with pytest.raises(TypeError, match=r"expected\s+\(0, handle\)") as info:
        nh.host_launch(Versioned(), touch)
    assert nh.pending() == before
    if named is not None:
        assert f"(its version a {named})" in str(info.value)


class Alarm(Exception):
    pass


@pytest.mark.parametrize(
    "error", [KeyError("k"), ZeroDivisionError(), StopIteration(), OSError(), Alarm()]
)
def test_an_exception_from_cuda_stream_propagates_as_itself(stream, error):
    """What a stream's own __cuda_stream__ raises propagates as itself, as len()
    lets what __len__ raises (main wrapped it in a TypeError, so a signal
    handler's Alarm raised in it missed `except Alarm`), with nothing enqueued."""

    class Raising:
        def __cuda_stream__(self):
            raise error

    before = nh.pending()
    with pytest.raises(type(error)) as info:
        nh.host_launch(Raising(), touch)
    assert info.value is error and nh.pending() == before


def test_a_class_whose_call_is_replaced_is_checked_again(stream):
    """A callable object's type is not remembered: after its first launch, a __call__
    that needs an argument is refused (it was accepted, and failed on the stream)."""

    class Replaced:
        def __call__(self):
            pass

    nh.host_launch(stream, Replaced())
    stream.sync()
    nh.drain()
    Replaced.__call__ = lambda self, needed: None
    _rejects(stream, TypeError, "takes 1 argument", Replaced())


def test_read_only_user_data_too_large_to_copy_says_so(stream):
    huge = np.broadcast_to(np.zeros(1), (1 << 47,))  # 1 PiB, read-only: it would be copied
    _rejects(stream, MemoryError, r"could not be copied: not enough memory", touch, user_data=huge)


@pytest.mark.parametrize("fn", [None, 42, "callable", b"bytes"])
def test_non_callable_fn_rejected(stream, fn):
    with pytest.raises(TypeError, match="expected a HostFunction"):
        nh.host_launch(stream, fn)
    assert nh.pending() == 0


@pytest.mark.parametrize(
    "prototype",
    [
        ctypes.PYFUNCTYPE(None, ctypes.c_void_p),
        ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p),
        ctypes.CFUNCTYPE(None, ctypes.c_int),
        ctypes.CFUNCTYPE(None),
        ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p),
    ],
)
def test_wrong_ctypes_prototype_rejected_naming_cuhostfn(stream, prototype):
    pointer = prototype(touch.address)
    _rejects(stream, TypeError, "CUhostFn", pointer)


def test_pointer_prototype_checked_per_instance(stream):
    """A CUhostFn accepted once does not vouch for another with edited argtypes."""
    good = nh.CUhostFn(touch.address)
    nh.host_launch(stream, good)
    stream.sync()
    nh.drain()
    edited = nh.CUhostFn(touch.address)
    edited.argtypes = (ctypes.c_int,)  # ctypes allows this on an instance
    _rejects(stream, TypeError, "CUhostFn", edited)


def test_classification_follows_the_type(stream):
    """Each kind is recognised after another kind's type was seen (a per-type cache)."""

    class Callable:
        def __call__(self):
            pass

    class NotCallable:
        pass

    for _ in range(2):
        nh.host_launch(stream, Callable())
        nh.host_launch(stream, touch, user_data=nh.by_ref(np.zeros(1, np.int64)))
        stream.sync()
        nh.drain()
        _rejects(stream, TypeError, "expected a HostFunction", NotCallable())


def test_undeclared_library_function_rejected(stream):
    libc = ctypes.CDLL(None)
    with pytest.raises(TypeError, match="CUhostFn"):
        nh.host_launch(stream, libc.free)


def test_null_ctypes_pointer_rejected(stream):
    with pytest.raises(ValueError, match="NULL"):
        nh.host_launch(stream, nh.CUhostFn())


def test_numba_cfunc_with_wrong_signature_rejected(stream):
    wrong = cfunc("int32(int32)")(lambda x: x)
    with pytest.raises(TypeError, match="void\\(voidptr\\)"):
        nh.host_launch(stream, wrong)


def test_user_data_with_python_callable_rejected(stream):
    cb = Callable()
    data = bytearray(b"abc")
    _rejects(stream, ValueError, "only supported with compiled", cb, user_data=data)
    with pytest.raises(ValueError, match="host_callback.*functools.partial"):
        nh.host_launch(stream, cb, user_data=0)


@pytest.mark.parametrize(
    "user_data, exc, match",
    [
        ("text", TypeError, "encode"),
        (1.5, TypeError, "bytes-like"),
        (object(), TypeError, "bytes-like"),
        (True, TypeError, "bool"),
        (-1, ValueError, "2\\*\\*64"),
        (2**64, ValueError, "2\\*\\*64"),
        (np.zeros(3, object), TypeError, "Python objects"),
        (memoryview(b""), ValueError, "empty"),
        (bytearray(), ValueError, "empty"),
        (ctypes.c_void_p(0x1234), TypeError, "ctypes pointer"),
        (ctypes.pointer(ctypes.c_int(1)), TypeError, "ctypes pointer"),
        (ctypes.c_char_p(b"text"), TypeError, "ctypes pointer"),
        (np.int64(0x1234), TypeError, r"int\(x\) for the address"),
        (np.uint64(0x1234), TypeError, r"x\.tobytes\(\) for a copy"),
    ],
    ids=[
        "str",
        "float",
        "object",
        "bool",
        "negative",
        "too-big",
        "object-array",
        "empty-memoryview",
        "empty-bytearray",
        "c_void_p",
        "ctypes-pointer",
        "c_char_p",
        "np-int64",
        "np-uint64",
    ],
)
def test_bad_user_data_rejected(stream, user_data, exc, match):
    _rejects(stream, exc, match, touch, user_data=user_data)


def test_numpy_scalar_of_the_declared_dtype_is_copied(stream):
    @nh.host_callback(dtype=np.int64)
    def double(a):
        a[0] *= 2

    value = np.int64(21)
    nh.host_launch(stream, double, user_data=value)  # the declared layout: a copy
    stream.sync()
    assert value == 21


@pytest.mark.parametrize("call", ["launch", "direct"])
def test_a_record_of_a_writable_array_is_shared_not_copied(stream, call):
    """``stats[i]`` of a structured array is a numpy.void that numpy writes through
    (``stats[i]["a"] = 1`` changes ``stats``), but whose buffer is read-only: it was
    copied, so the body's writes went to the copy and were lost, silently. It is
    shared as ``stats[i:i + 1]`` would be; a record of a read-only array is copied."""
    stats = np.zeros(3, REC)
    if call == "launch":
        nh.host_launch(stream, typed, user_data=stats[1])
        stream.sync()
    else:
        typed(stats[1])
    assert stats["a"].tolist() == [0, 1, 0]
    frozen = np.zeros(3, REC)
    frozen.setflags(write=False)
    nh.host_launch(stream, typed, user_data=frozen[1])  # read-only: a copy, as its array's
    stream.sync()
    assert frozen["a"].tolist() == [0, 0, 0]


def test_a_shared_record_pins_the_memory_behind_its_array(stream):
    """A record ``a[i]`` shared as user_data keeps what ``a``'s memory belongs to in
    place, as ``a[i:i + 1]`` does: the pins stopped at the numpy.void, so a bytearray
    behind ``a`` could be resized (its memory freed) under the pending launch."""
    memory = bytearray(REC.itemsize * 3)
    stats = np.ndarray((3,), REC, buffer=memory)
    with Hold(stream):
        nh.host_launch(stream, typed, user_data=stats[1])
        with pytest.raises(BufferError):
            memory.extend(bytes(1 << 20))
    stream.sync()
    nh.drain()
    assert stats["a"].tolist() == [0, 1, 0]
    del stats
    memory.extend(b"x")  # released with the launch


def test_by_ref_shares_a_record_of_a_writable_array(stream):
    """``by_ref(a[i])`` shares the record, as ``user_data=a[i]`` does: it said the
    buffer was read-only and to pass it as user_data "to copy it", which shares it."""
    stats = np.zeros(3, REC)
    nh.host_launch(stream, typed, user_data=nh.by_ref(stats[1]))
    stream.sync()
    assert stats["a"].tolist() == [0, 1, 0]
    frozen = np.zeros(3, REC)
    frozen.setflags(write=False)
    with pytest.raises(ValueError, match="needs a writable buffer"):
        nh.by_ref(frozen[1])


async def _coroutine():
    pass


async def _async_generator():
    yield 1


class _AsyncCall:
    async def __call__(self):
        pass


def test_a_coroutine_object_is_refused_pointing_to_async_done_and_closed(stream):
    """host_launch(s, coro()) (the coroutine, not the function): the native path falls
    through to Python, which refuses it saying how to await the stream, and closes the
    coroutine it will never run, so that it does not warn "never awaited" later."""
    import inspect
    import warnings

    from numba_hostfn import _launch

    coroutine = _coroutine()
    before = _launch.launch_counts()["fell_through"]
    _rejects(stream, TypeError, r"await nh\.async_done\(stream\)", coroutine)
    assert _launch.launch_counts()["fell_through"] == before + 1  # the native path fell through
    assert inspect.getcoroutinestate(coroutine) == inspect.CORO_CLOSED
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del coroutine
        gc.collect()
    assert [w for w in caught if issubclass(w.category, RuntimeWarning)] == []


def test_a_started_coroutine_is_refused_and_left_running(stream):
    """A coroutine that has started belongs to whoever drives it: refused, not closed."""
    import inspect
    import types

    @types.coroutine
    def suspend():
        yield

    async def started():
        await suspend()

    coroutine = started()
    coroutine.send(None)  # now suspended at its await
    with pytest.raises(TypeError, match=r"async_done") as info:
        nh.host_launch(stream, coroutine)
    assert "closed" not in str(info.value)
    assert inspect.getcoroutinestate(coroutine) == inspect.CORO_SUSPENDED
    coroutine.close()


@pytest.mark.parametrize(
    "fn",
    [_coroutine, _async_generator, functools.partial(_coroutine), _AsyncCall()],
    ids=["coroutine-function", "async-generator", "partial", "async-call-method"],
)
def test_coroutine_functions_rejected(stream, fn):
    _rejects(stream, TypeError, "coroutine function", fn)
    # and a plain function of the same type right after is still accepted
    calls = []
    nh.host_launch(stream, lambda: calls.append(1))
    stream.sync()
    assert calls == [1]


def _generator():
    yield


class _GeneratorCall:
    def __call__(self):
        yield

    def method(self):
        yield


@pytest.mark.parametrize(
    "fn",
    [
        _generator,
        _GeneratorCall().method,
        functools.partial(_generator),
        _GeneratorCall(),
        functools.lru_cache(None)(_generator),
        staticmethod(_generator),
    ],
    ids=["function", "bound-method", "partial", "call-method", "lru-cache", "staticmethod"],
)
def test_generator_functions_are_refused(stream, fn):
    """A generator function was launched, on the native path and the Python one: its
    call only made a generator, and its body never ran (as @host_callback refuses it
    at decoration).  Both paths refuse it now, saying what to pass instead."""
    _rejects(stream, TypeError, r"generator function.*lambda: list\(gen\(\)\)", fn)


def test_a_types_coroutine_generator_is_refused_as_a_coroutine_function(stream):
    """A @types.coroutine generator is awaitable when called: refused as a coroutine
    function, pointing to async_done, on both paths."""
    import types

    @types.coroutine
    def suspend():
        yield

    _rejects(stream, TypeError, "coroutine function.*async_done", suspend)


def test_a_plain_function_with_the_iterable_coroutine_flag_runs(stream):
    """CO_ITERABLE_COROUTINE on a function that is no generator changes nothing (its
    call runs the body): it is launched on both paths.  The Python path refused it as
    a coroutine function, where the native path launched it."""
    import inspect

    ran = []

    def fn():
        ran.append(1)

    fn.__code__ = fn.__code__.replace(co_flags=fn.__code__.co_flags | inspect.CO_ITERABLE_COROUTINE)
    nh.host_launch(stream, fn)
    stream.sync()
    nh.drain()
    assert ran == [1]


def test_an_async_mock_is_refused_as_a_coroutine_function(stream):
    """unittest.mock.AsyncMock() was launched: what it calls was read off its class's
    __call__ (plain), not the CO_COROUTINE code object it sets on the instance, so a
    coroutine was made and never awaited.  It is refused now; a Mock still runs."""
    from unittest import mock

    _rejects(stream, TypeError, "coroutine function.*async_done", mock.AsyncMock())
    plain = mock.Mock()
    nh.host_launch(stream, plain)
    stream.sync()
    nh.drain()
    assert plain.call_count == 1


def _needs_keyword(*, x):
    pass


def _has_keyword(*, x=1):
    pass


class _CallNeedsArgument:
    def __call__(self, x):
        pass


@pytest.mark.parametrize(
    "fn", [_needs_keyword, _CallNeedsArgument()], ids=["keyword-only", "call-method"]
)
def test_callables_that_need_arguments_rejected(stream, fn):
    """Keyword-only parameters without a default, and a __call__ that needs more than
    self, count as required arguments: refused at launch, not failed when run."""
    _rejects(stream, TypeError, "takes 1 argument", fn)
    nh.host_launch(stream, _has_keyword)  # with a default: called with none
    stream.sync()


def _takes_two(a, b):
    pass


async def _coroutine_function():
    pass


class _Static(staticmethod):
    pass


def test_what_a_builtin_or_staticmethod_needs_is_checked_per_object(stream):
    """Instances of one type (builtins, staticmethods) need different arguments: one
    accepted must not let the next through.  Each is checked on its own, on both
    paths (a type-level cache once accepted len after time.time, and let every
    staticmethod through after one that needed nothing)."""
    calls = []
    nh.host_launch(stream, calls.clear)  # a builtin method that needs nothing
    nh.host_launch(stream, staticmethod(lambda: calls.append(1)))
    nh.host_launch(stream, _Static(lambda: calls.append(2)))
    stream.sync()
    nh.drain()
    assert calls == [1, 2]
    _rejects(stream, TypeError, "'_takes_two', which takes 2 argument", _Static(_takes_two))
    _rejects(stream, TypeError, "'len', which takes 1 argument", len)
    _rejects(stream, TypeError, "'list.append', which takes 1 argument", calls.append)
    _rejects(stream, TypeError, "'str.join', which takes 2 argument", str.join)
    _rejects(stream, TypeError, "'_takes_two', which takes 2 argument", staticmethod(_takes_two))
    _rejects(stream, TypeError, "'len', which takes 1 argument", staticmethod(len))
    _rejects(stream, TypeError, "coroutine function", staticmethod(_coroutine_function))
    nh.host_launch(stream, print)  # *args, every keyword has a default: needs none
    stream.sync()
    nh.drain()
    # One text, "($self, /)": list.clear needs the list; [].clear and None.__sizeof__
    # are bound (inspect counts the self of a method bound to None), and need nothing.
    _rejects(stream, TypeError, "'list.clear', which takes 1 argument", list.clear)
    nh.host_launch(stream, None.__sizeof__)
    nh.host_launch(stream, calls.clear)
    stream.sync()


class _NeedsOne:
    def __init__(self, a):
        pass

    def method(self, a, b=2):
        pass

    def method_needing_none(self):
        pass

    @functools.lru_cache  # noqa: B019 - the instance is the test's
    def cached_method(self, a):
        pass


class _NewNeedsOne:
    def __new__(cls, a):
        return object.__new__(cls)


class _PassingNew:
    def __new__(cls, *args, **kwargs):
        return super().__new__(cls)


class _InitAfterPassingNew(_PassingNew):
    """A base's __new__ that takes anything does not hide this __init__."""

    def __init__(self, a):
        pass


class _Forwarding:
    """Forwards every attribute, __code__ included, to what it wraps."""

    def __init__(self, wrapped):
        self._wrapped = wrapped

    def __getattr__(self, name):
        return getattr(self._wrapped, name)

    def __call__(self, *args):
        return self._wrapped(*args)


class _RaisingAttributes:
    def __getattr__(self, name):
        raise RuntimeError(name)

    def __call__(self):
        pass


class _HoldsAFunction:
    """A callable object with an attribute named __func__ (not a method)."""

    def __init__(self, function):
        self.__func__ = function

    def __call__(self):
        pass


class _CodeAttribute:
    __code__ = 5  # not a code object

    def __call__(self):
        pass


class _CodeAttributeNeedsOne:
    __code__ = 5

    def __call__(self, a):
        pass


@dataclasses.dataclass
class _Field:
    x: int


@dataclasses.dataclass
class _FieldWithDefault:
    x: int = 1


def _keyword_only(a, *, k):
    pass


def _positional_only(a, /, b=1):
    pass


@functools.lru_cache
def _cached_needs_one(a):
    pass


@functools.lru_cache
def _cached_needs_none():
    return None


def _returns_none():
    return None


@functools.lru_cache
async def _cached_coroutine():
    pass


def test_what_a_partial_class_or_cached_function_needs_is_checked(stream):
    """A partial needs what its function needs less what it binds; a class, what its
    __init__ and __new__ need; an lru_cache function, what the function it wraps
    needs. Each is refused when that is not nothing, with nothing enqueued, and is
    never learned by type (a class accepted once let every class through)."""
    calls = []
    instance = _NeedsOne(1)
    accepted = [
        functools.partial(_takes_two, 1, 2),
        functools.partial(_takes_two, 1, b=2),
        functools.partial(_keyword_only, 1, k=2),
        functools.partial(_positional_only, 1),
        functools.partial(instance.method, 1),
        functools.partial(len, "ab"),
        functools.partial(_NeedsOne, 1),
        _FieldWithDefault,
        _cached_needs_none,
        functools.partial(calls.append, 1),
        # What these need is found, not guessed (reviews found each refused or
        # crashing): a cached bound method needs no self; a partial of a builtin bound
        # to None, neither; an object's own __func__ or __code__ attribute, or one it
        # forwards, is not what calling it runs; attributes that raise are unknown.
        functools.cache(instance.method_needing_none),
        functools.partial(None.__sizeof__),
        _HoldsAFunction(_cached_needs_one),
        _CodeAttribute(),
        _Forwarding(instance.method_needing_none),
        _RaisingAttributes(),
        functools.partial(_RaisingAttributes()),
        functools.lru_cache(numba.njit(_returns_none)),
        functools.partial(np.random.randint, 5),  # a Cython method
        functools.partial(enumerate, [1]),
    ]
    for fn in accepted:
        nh.host_launch(stream, fn)
    stream.sync()
    nh.drain()
    assert calls == [1]
    one = "which takes 1 argument"
    _rejects(stream, TypeError, f"'_takes_two', {one}", functools.partial(_takes_two, 1))
    _rejects(stream, TypeError, f"'_takes_two', {one}", functools.partial(_takes_two, b=2))
    _rejects(stream, TypeError, f"'_keyword_only', {one}", functools.partial(_keyword_only, 1))
    # a positional-only parameter cannot be given as a keyword
    _rejects(
        stream, TypeError, f"'_positional_only', {one}", functools.partial(_positional_only, a=1)
    )
    _rejects(stream, TypeError, f"'_NeedsOne.method', {one}", functools.partial(instance.method))
    _rejects(stream, TypeError, f"'len', {one}", functools.partial(len))
    _rejects(stream, TypeError, f"'_NeedsOne', {one}", functools.partial(_NeedsOne))
    _rejects(stream, TypeError, f"'_NeedsOne', {one}", _NeedsOne)
    _rejects(stream, TypeError, f"'_NewNeedsOne', {one}", _NewNeedsOne)
    _rejects(stream, TypeError, f"'_Field', {one}", _Field)
    _rejects(stream, TypeError, f"'_cached_needs_one', {one}", _cached_needs_one)
    _rejects(stream, TypeError, f"'_NeedsOne.cached_method', {one}", instance.cached_method)
    _rejects(stream, TypeError, "coroutine function", _cached_coroutine)
    _rejects(stream, TypeError, f"'_InitAfterPassingNew', {one}", _InitAfterPassingNew)
    _rejects(
        stream,
        TypeError,
        "'_CodeAttributeNeedsOne.__call__', which takes 1",
        _CodeAttributeNeedsOne(),
    )
    # What inspect knows of a builtin type, and what a Cython function's code says
    # (numpy 2's random methods are Cython functions; older numpys' are builtins
    # without a signature, which are accepted as unknown)
    _rejects(stream, TypeError, f"'enumerate', {one}", enumerate)
    _rejects(stream, TypeError, f"'enumerate', {one}", functools.partial(enumerate))
    if hasattr(type(getattr(np.random.randint, "__func__", None)), "__code__"):
        _rejects(stream, TypeError, "'RandomState.randint', which takes 1", np.random.randint)


def test_layout_mismatch_rejected_with_nothing_enqueued(stream):
    good = np.zeros(1, REC)
    _rejects(stream, ValueError, "declares user_data", typed, user_data=None)
    pending = nh.pending()
    with pytest.raises(ValueError, match="NULL pointer"):  # 0: refcounts too busy to compare
        nh.host_launch(stream, typed, user_data=0)
    assert nh.pending() == pending
    _rejects(stream, ValueError, "holds 8 bytes", typed, user_data=b"12345678")
    _rejects(stream, ValueError, "has dtype", typed, user_data=np.zeros(2, np.int64))
    wrong = np.zeros(2, REC)
    _rejects(stream, ValueError, "holds 32 bytes", typed, user_data=nh.by_ref(wrong))
    nh.host_launch(stream, typed, user_data=nh.by_ref(good))
    stream.sync()
    assert good[0]["a"] == 1


@nh.host_callback(dtype=np.int64)
def count_int64(d):
    d[0] += 1


def test_a_typed_buffer_that_is_no_array_is_checked_against_the_dtype(stream):
    """A buffer of another number type than the declared dtype, given as no numpy
    array (a memoryview of one, array.array, a ctypes number), had only its size
    checked: the body wrote int64 bits into float64 memory (5e-324).  Its format's
    dtype is compared, as an array's is; plain bytes and a ctypes structure (whose
    format ctypes writes without its padding) still have their size checked alone."""
    floats = np.zeros(1, np.float64)
    for shared in (memoryview(floats), array.array("d", [0.0]), ctypes.c_double(0.0)):
        _rejects(stream, ValueError, "has dtype float64", count_int64, user_data=shared)
        by_ref = nh.by_ref(shared)
        _rejects(stream, ValueError, "has dtype float64", count_int64, user_data=by_ref)
    _rejects(stream, ValueError, "has dtype float64", count_int64, user_data=array.array("d", [0]))
    with pytest.raises(ValueError, match="has dtype float64"):
        count_int64(memoryview(floats))  # a direct call checks the same
    assert floats[0] == 0.0
    # The same bytes as the declared type, or as bytes, are taken.
    ints = np.zeros(1, np.int64)
    nh.host_launch(stream, count_int64, user_data=memoryview(ints))
    nh.host_launch(stream, count_int64, user_data=nh.by_ref(array.array("q", [0])))
    nh.host_launch(stream, count_int64, user_data=nh.by_ref(memoryview(ints).cast("B")))
    counter = ctypes.c_int64(0)
    nh.host_launch(stream, count_int64, user_data=nh.by_ref(counter))
    raw = bytearray(8)
    nh.host_launch(stream, count_int64, user_data=raw)

    class Pair(ctypes.Structure):  # format "T{<q:a:<d:b:}": its size alone is checked
        _fields_ = (("a", ctypes.c_int64), ("b", ctypes.c_double))

    pair = Pair(0, 0.0)
    nh.host_launch(stream, typed, user_data=nh.by_ref(pair))
    nh.host_launch(stream, typed, user_data=memoryview(np.zeros(1, REC)))  # numpy's format
    stream.sync()
    nh.drain()
    assert ints[0] == 2 and counter.value == 1 and raw == (1).to_bytes(8, sys.byteorder)
    assert pair.a == 1


def test_by_ref_rejects_unsuitable_buffers():
    with pytest.raises(TypeError, match="buffer protocol"):
        nh.by_ref([1, 2, 3])
    with pytest.raises(ValueError, match="writable"):
        nh.by_ref(b"read-only")
    ro = np.zeros(4)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="writable"):
        nh.by_ref(ro)
    with pytest.raises(ValueError, match="C-contiguous"):
        nh.by_ref(np.zeros((4, 4))[:, 1])
    with pytest.raises(ValueError, match="at least one byte"):
        nh.by_ref(np.zeros(0))
    with pytest.raises(TypeError, match="Python objects"):
        nh.by_ref(np.zeros(3, object))


def _closed_mmap():
    closed = mmap.mmap(-1, 4096)
    closed.close()
    return closed


def _released_view():
    view = memoryview(bytearray(8))
    view.release()
    return view


DEAD_BUFFERS = [
    (_closed_mmap, ValueError, "a closed mmap"),
    (_released_view, ValueError, "a released memoryview"),
    (lambda: np.zeros(2, "M8[D]"), TypeError, r"an array of dtype datetime64\[D\]"),
    (lambda: np.zeros(2, [("t", "m8[s]"), ("n", np.int64)]), TypeError, "an array of dtype"),
    # References numpy exports no buffer of (numpy's bare "cannot include dtype ... in a
    # buffer" before): an object field beside a datetime, numpy 2's StringDType.
    (
        lambda: np.zeros(2, [("t", "M8[s]"), ("o", object)]),
        TypeError,
        "an array of dtype .*whose elements are references to Python objects",
    ),
    pytest.param(
        lambda: np.array(["a"], dtype=np.dtypes.StringDType()),
        TypeError,
        r"an array of dtype StringDType\(\), whose elements are references",
        marks=pytest.mark.skipif(
            not hasattr(getattr(np, "dtypes", None), "StringDType"), reason="numpy < 2"
        ),
    ),
]


@pytest.mark.parametrize(
    ("make", "error", "what"),
    DEAD_BUFFERS,
    ids=["mmap", "view", "datetime", "timedelta-field", "object-and-date", "StringDType"],
)
def test_a_buffer_with_no_memory_to_share_is_refused_as_such(stream, make, error, what):
    """by_ref(), record() and user_data let the raw error through for a closed mmap
    ("mmap closed or invalid"), a released memoryview ("operation forbidden on
    released memoryview object") and an array numpy exports no buffer of ("cannot
    include dtype 'M' in a buffer"), naming neither the call nor what to pass, where
    host_copy says "host_copy() dst is a closed mmap"."""
    with pytest.raises(error, match=rf"^by_ref\(\) got {what}.*: pass "):
        nh.by_ref(make())
    layout = np.dtype([("p", np.uint64)])
    with pytest.raises(error, match=rf"^record\(\) field 'p' got {what}.*: pass "):
        nh.record(layout, p=make())
    _rejects(stream, error, rf"^user_data is {what}.*: pass ", touch, user_data=make())


def test_a_refused_by_ref_keeps_no_view_it_was_given_while_its_error_lives():
    """Invariant 3 for by_ref: its frame and ByRef.__init__'s (the view it took) stayed
    in a caught error's traceback, so a memoryview made for the call (every other
    byte, or read-only) kept its bytearray exported."""
    buf = bytearray(16)
    for view, match in (
        (lambda: memoryview(buf)[::2], "C-contiguous"),
        (lambda: memoryview(buf).toreadonly(), "writable"),
    ):
        try:
            nh.by_ref(view())
        except ValueError as caught:
            error = caught
        assert match in str(error)
        buf.append(0)  # BufferError while the error kept the memoryview
        del buf[-1]


def test_a_by_ref_the_native_check_refuses_keeps_no_view_while_its_error_lives():
    """The checks only the native BufferRef makes (a buffer of Python objects that is not
    an ndarray: a memoryview of one) raised from ByRef.__init__'s super().__init__,
    past the refusal tail that drops obj and view: its frame, returned, stayed in the
    error's traceback with both, keeping the array referenced (and exported)."""
    a = np.empty(2, object)
    refs = sys.getrefcount(a)
    try:
        nh.by_ref(memoryview(a))
    except TypeError as caught:
        error = caught
    assert "Python objects" in str(error)
    assert sys.getrefcount(a) == refs  # one more while the error kept the view
    a.resize(3)  # ValueError ("referenced by another object") while it did


def test_by_ref_pins_bytearray_size():
    buf = bytearray(16)
    ref = nh.by_ref(buf)
    with pytest.raises(BufferError):
        buf.append(1)
    del ref
    buf.append(1)


def test_a_pin_is_never_user_data(stream):
    """host_copy's and record()'s exports (``BufferRef(..., pin_only=True)``) may be
    read-only or strided: neither path hands one to a body as its user data."""
    from numba_hostfn import _core

    for buffer in (b"12345678", np.zeros((4, 4))[:, :2]):
        pin = _core.BufferRef(buffer, pin_only=True)
        _rejects(stream, TypeError, "user_data must be", touch, user_data=pin)


def test_rejected_arguments_are_not_kept_alive(stream):
    cb = Callable()
    alive = weakref.ref(cb)
    with pytest.raises(ValueError):
        nh.host_launch(stream, cb, user_data=b"x")
    del cb
    gc.collect()
    assert alive() is None


def test_functions_meant_for_host_callback_are_recognised(stream):
    """An njit function, or a plain def that takes user_data, gets told to use host_callback."""
    import numba

    @numba.njit
    def jitted(p):
        pass

    def takes_data(p):
        pass

    _rejects(stream, TypeError, "numba.njit function.*host_callback", jitted)
    _rejects(stream, TypeError, "takes 1 argument.*host_callback", takes_data)
    _rejects(stream, TypeError, "takes 1 argument.*host_callback", takes_data, user_data=b"x")

    class Box:
        def method(self):
            calls.append("method")

    def optional(p=None):
        calls.append("optional")

    calls = []
    nh.host_launch(stream, Box().method)  # self is bound: callable with no arguments
    nh.host_launch(stream, optional)
    stream.sync()
    assert calls == ["method", "optional"]


NAMED = np.dtype([("Open", np.float64), ("Out", np.int64), ("Offset", np.int64)])


@nh.host_callback(dtype=NAMED)
def opened(d):
    d.Out = np.int64(d.Open * 2.0) + d.Offset


class _Named(ctypes.Structure):
    _fields_ = [("Open", ctypes.c_double), ("Out", ctypes.c_int64), ("Offset", ctypes.c_int64)]


@pytest.mark.parametrize("how", ["writable", "by_ref", "record", "ctypes", "read-only"])
def test_fields_named_like_the_object_code_are_numeric_data(stream, how):
    """A structured buffer whose field names hold an O ("Open", "Out", "Offset":
    the format is T{d:Open:q:Out:q:Offset:}) is numeric data, launched; main read
    the O of a name as a Python-object item and refused it."""
    data = np.zeros(1, NAMED)
    data["Open"], data["Offset"] = 1.5, 4
    if how == "record":
        user_data = nh.record(NAMED, Open=1.5, Out=0, Offset=4)
        data = user_data.data
    elif how == "ctypes":
        user_data = _Named(1.5, 0, 4)
    elif how == "read-only":
        data.flags.writeable = False  # copied: the body's write lands in the copy
        user_data = data
    else:
        user_data = data if how == "writable" else nh.by_ref(data)
    nh.host_launch(stream, opened, user_data=user_data)
    stream.sync()
    nh.drain()
    if how == "ctypes":
        assert user_data.Out == 7
    elif how != "read-only":
        assert data["Out"][0] == 7


def test_a_buffer_of_python_objects_is_still_refused(stream):
    """An item of type O is refused, whatever the fields are named, and whichever
    way the buffer would be passed: shared (writable) or copied (read-only), a
    numpy array or a memoryview of one (main copied a read-only memoryview of
    object pointers)."""
    mixed = np.dtype([("Open", np.float64), ("obj", object)])
    writable = np.zeros(1, mixed)
    read_only = np.zeros(1, mixed)
    read_only.flags.writeable = False
    objects = np.array([None, 1], dtype=object)
    objects.flags.writeable = False
    for user_data in (
        writable,
        read_only,
        memoryview(writable),
        memoryview(read_only),
        memoryview(objects),
    ):
        _rejects(stream, TypeError, "Python objects", touch, user_data=user_data)
    with pytest.raises(TypeError, match="Python objects"):
        nh.by_ref(memoryview(writable))


class _WrongProtocol:
    def __cuda_stream__(self):
        return (1, 2, 3)


@pytest.mark.parametrize(
    "bad_stream, match",
    [
        (None, "needs a stream, got None"),
        (12345, "Stream.from_handle"),
        (_WrongProtocol(), r"expected\s+\(0, handle\)"),
    ],
)
def test_a_wrong_stream_is_reported_before_what_follows_it(bad_stream, match):
    """Arguments are checked in order, stream first: with a wrong stream, a wrong
    fn, user_data or keyword is not what is reported (main complained about
    user_data, or blocking, instead)."""

    def plain():
        pass

    for fn, kwargs in (
        (typed, {}),  # it reads a REC: None is refused
        (typed, {"user_data": b"short"}),
        (touch, {"user_data": "text"}),
        ("not callable", {}),
        (plain, {"user_data": 5}),
        (touch, {"executor": "not an executor"}),
        (touch, {"blocking": False}),
        (plain, {"blocking": "yes"}),
    ):
        with pytest.raises(TypeError, match=match):
            nh.host_launch(bad_stream, fn, **kwargs)


@pytest.mark.parametrize(
    "name, call",
    [
        ("host_launch", lambda s: nh.host_launch(s, touch)),
        ("host_launch", lambda s: nh.host_launch(s, lambda: None, blocking=False)),
        ("host_copy", lambda s: nh.host_copy(s, np.zeros(4), np.ones(4))),
        ("host_copy", lambda s: nh.host_copy(s, np.zeros(0), np.zeros(0))),
        ("release_after", lambda s: nh.release_after(s, object())),
        ("release_after", lambda s: nh.release_after(s)),
        ("done_future", lambda s: nh.done_future(s)),
        ("add_callback", lambda s: nh.add_callback(s, lambda stream, status, arg: None)),
    ],
)
@pytest.mark.parametrize("bad_stream", [None, 12345, object()])
def test_a_wrong_stream_is_reported_by_the_function_called(name, call, bad_stream):
    """Each error names the function the program called (host_copy's, release_after's,
    done_future's and add_callback's once said host_launch()); nothing enqueued."""
    with pytest.raises(TypeError, match=rf"^{name}\(\) "):
        call(bad_stream)
    assert nh.pending() == 0


async def _await_done(stream):
    await nh.async_done(stream)


def test_async_done_names_itself_for_a_wrong_stream():
    with pytest.raises(TypeError, match=r"^async_done\(\) needs a stream"):
        asyncio.run(_await_done(None))


@pytest.mark.parametrize("bad_stream", [None, object()])
@pytest.mark.parametrize("name", ["done_future", "async_done"])
def test_a_wait_given_no_stream_is_told_to_pass_a_stream_not_a_graph(name, bad_stream):
    """done_future and async_done take streams only (a GraphBuilder or an explicit graph
    is refused: it would signal at every replay), but their wrong-target errors said
    "pass a cuda.core Stream or GraphBuilder" (and GraphDefinition or GraphNode), as
    host_launch's do: following that advice met the next error."""
    if name == "done_future":
        call = lambda: nh.done_future(bad_stream)  # noqa: E731
    else:
        call = lambda: asyncio.run(_await_done(bad_stream))  # noqa: E731
    with pytest.raises(TypeError, match=rf"^{name}\(\) .*__cuda_stream__") as error:
        call()
    assert "Graph" not in str(error.value)
    assert nh.pending() == 0


def test_then_fn_then_user_data_then_the_keywords(stream):
    """After the stream, fn is checked, then user_data, then the executor."""
    for fn, kwargs, error, match in (
        ("not callable", {"user_data": "text"}, TypeError, "expected a HostFunction"),
        (touch, {"user_data": "text", "executor": "no"}, TypeError, "not str"),
        (touch, {"user_data": -1, "executor": "no"}, ValueError, r"\[0, 2\*\*64\)"),
        (lambda: None, {"user_data": 5, "executor": "no"}, ValueError, "Python callable"),
        (lambda: None, {"user_data": 5, "blocking": "yes"}, ValueError, "Python callable"),
    ):
        _rejects(stream, error, match, fn, **kwargs)


def test_a_compiled_functions_user_data_is_checked_before_blocking(stream):
    """docs/errors.md: stream, fn, user_data, then the keywords, "so the error names
    the first wrong one".  With a compiled function, a wrong blocking= (not a bool,
    or False) was reported instead of the wrong user_data before it."""
    for fn, kwargs, error, match in (
        (touch, {"user_data": "text", "blocking": "yes"}, TypeError, "not str"),
        (touch, {"user_data": 1.5, "blocking": None}, TypeError, "got float"),
        (touch, {"user_data": -1, "blocking": False}, ValueError, r"\[0, 2\*\*64\)"),
        (typed, {"user_data": b"short", "blocking": False}, ValueError, "declares user_data"),
        (touch.ctypes, {"user_data": "text", "blocking": False}, TypeError, "not str"),
    ):
        _rejects(stream, error, match, fn, **kwargs)
    # Right user_data, or none given: blocking= is what is wrong, and says so.
    _rejects(stream, TypeError, "blocking", touch, user_data=b"ok", blocking="yes")
    _rejects(stream, TypeError, "blocking", typed, blocking=1)
    _rejects(stream, ValueError, "blocking=False", typed, user_data=bytes(16), blocking=False)


def test_executor_is_checked_before_blocking(stream, launch_path):
    """docs/errors.md: the keywords in signature order, executor= before blocking=.
    A wrong executor (not a HostExecutor, or closed) given with a wrong blocking= (not a
    bool, or False with compiled code) was reported as the blocking= error, on both
    paths (the native host_launch hands every blocking= but True to Python)."""
    closed = nh.HostExecutor(1)
    closed.close()
    for fn, kwargs, error, match in (
        (lambda: None, {"executor": object(), "blocking": "yes"}, TypeError, "executor= expected"),
        (touch, {"executor": object(), "blocking": False}, TypeError, "executor= expected"),
        (touch, {"executor": closed, "blocking": False}, RuntimeError, "HostExecutor is closed"),
        (lambda: None, {"executor": closed, "blocking": None}, RuntimeError, "is closed"),
        (
            typed,
            {"user_data": bytes(16), "executor": "no", "blocking": "yes"},
            TypeError,
            "got str",
        ),
        (touch, {"executor": object(), "blocking": True}, TypeError, "executor= expected"),
    ):
        _rejects(stream, error, match, fn, **kwargs)
    # user_data before both; a right executor leaves the error to blocking=.
    _rejects(stream, TypeError, "not str", touch, user_data="x", executor=object(), blocking="yes")
    with nh.HostExecutor(1) as executor:
        _rejects(stream, TypeError, "blocking", lambda: None, executor=executor, blocking="yes")
        _rejects(stream, ValueError, "blocking=False", touch, executor=executor, blocking=False)


def test_user_data_passed_positionally_says_it_is_keyword_only(stream):
    """host_launch(stream, fn, buf) names host_launch and says to pass user_data=
    (main: "host_launch_python() takes 2 positional arguments but 3 were given",
    an internal function); other binding errors name host_launch too."""
    buf = bytearray(8)
    before, refs = nh.pending(), sys.getrefcount(buf)
    for call, match in (
        (
            lambda: nh.host_launch(stream, touch, buf),
            r"^host_launch\(\) takes 2 positional arguments \(stream, fn\) but 3 were "
            r"given; .*keyword-only: pass user_data=\.\.\. as a keyword$",
        ),
        (lambda: nh.host_launch(stream, touch, buf, None), "but 4 were given"),
        (lambda: nh.host_launch(stream), r"^host_launch\(\) missing required argument 'fn'"),
        (lambda: nh.host_launch(fn=touch), "missing required argument 'stream'"),
        (
            lambda: nh.host_launch(stream, touch, userdata=buf),
            r"^host_launch\(\) got an unexpected keyword argument 'userdata'",
        ),
        (
            lambda: nh.host_launch(stream, touch, **{"str" + "eam": stream}),
            r"^host_launch\(\) got multiple values for argument 'stream'$",
        ),
    ):
        with pytest.raises(TypeError, match=match) as info:
            call()
        assert "host_launch_python" not in str(info.value)
    stream.sync()
    nh.drain()
    gc.collect()
    assert nh.pending() == before and sys.getrefcount(buf) == refs
    nh.host_launch(fn=touch, stream=stream, user_data=buf)  # by keyword: still launched
    nh.host_launch(**{"str" + "eam": stream, "f" + "n": touch, "user" + "_data": buf})
    stream.sync()
    nh.drain()


class _ColonNamed(ctypes.Structure):
    """ctypes writes a field name as is between colons: "p:" gives "T{<d:p::<O:q:}"."""

    _fields_ = [("p:", ctypes.c_double), ("q", ctypes.py_object)]


class _MidColonNamed(ctypes.Structure):
    _fields_ = [("a:b", ctypes.c_double), ("q", ctypes.py_object)]


@pytest.mark.parametrize("struct", [_ColonNamed, _MidColonNamed], ids=["trailing", "middle"])
def test_a_field_name_with_a_colon_does_not_hide_an_object_pointer(struct):
    """format_holds_objects skips field names from colon to colon, so a name that
    itself holds a colon shifts the parse and the 'O' code after it is skipped as a
    name: by_ref (and a writable ctypes struct as user_data) then shares raw object
    pointers with a host function, which can overwrite them without the GIL (a
    host function that wrote 16 bytes into such a struct made ``s.q`` SEGV)."""
    value = struct(1.0, object())
    assert _core.format_holds_objects(memoryview(value).format)
    with pytest.raises(TypeError, match="Python objects"):
        nh.by_ref(value)
    with pytest.raises(TypeError, match="Python objects"):
        _core.BufferRef(value, pin_only=True)


def test_field_names_with_an_o_are_still_no_object_codes():
    assert not _core.format_holds_objects("T{<d:Open:<d:Other:}")
    assert not _core.format_holds_objects("T{d:Open:}")
    assert _core.format_holds_objects("T{<d:Open:<O:obj:}")


class _ZeroThatDenies(int):
    """An int whose __eq__ says it is never 0 (so, before, never NULL)."""

    def __eq__(self, other):
        return False

    __hash__ = int.__hash__


class _AlwaysInRange(int):
    """An int whose comparisons all say yes (so, before, -1 passed the range check)."""

    def __ge__(self, other):
        return True

    __gt__ = __le__ = __lt__ = __ge__


@nh.host_callback(dtype=REC)
def _ignores_record(d):
    pass  # reads nothing: a NULL it is given (the bug) does not crash the test


@pytest.mark.parametrize(
    "fn, user_data, exc, match",
    [
        (_ignores_record, _ZeroThatDenies(0), ValueError, "NULL pointer"),
        (touch, _AlwaysInRange(-1), ValueError, r"2\*\*64"),
        (touch, _AlwaysInRange(2**64), ValueError, r"2\*\*64"),
    ],
    ids=["eq-denies-zero", "negative", "too-big"],
)
def test_an_int_subclass_user_data_is_checked_by_its_value(stream, fn, user_data, exc, match):
    """The enqueue passes an int subclass's value: the checks read that value too, not
    the subclass's own comparisons (a 0 whose __eq__ denied it reached a body that
    declares a dtype as NULL; -1 passed the range check and failed as OverflowError)."""
    _rejects(stream, exc, match, fn, user_data=user_data)


def test_a_stream_handle_that_is_an_int_subclass_is_checked_by_its_value(stream):
    """__cuda_stream__'s handle is checked by the value the enqueue reads: a -1 whose
    comparisons all say "in range" raised OverflowError from the enqueue, not the
    protocol's ValueError."""

    class Lenient:
        def __cuda_stream__(self):
            return (0, _AlwaysInRange(-1))

    before = nh.pending()
    with pytest.raises(ValueError, match=r"handle -1; a stream handle is an address"):
        nh.host_launch(Lenient(), touch)
    assert nh.pending() == before


ALIAS_STREAM_SCRIPT = CHILD_PREAMBLE + textwrap.dedent("""
    from numba_hostfn import _launch

    real = stream.__cuda_stream__()[1]

    class Alias(int):  # another address that hashes and compares as the real handle
        def __eq__(self, other):
            return True

        def __hash__(self):
            return hash(real)

    class Aliasing:
        def __cuda_stream__(self):
            return (0, Alias(0x1000))

    for python in (False, True):
        with _launch.python_path() if python else contextlib.nullcontext():
            try:
                nh.host_launch(Aliasing(), increment, user_data=nh.by_ref(np.zeros(1, np.int64)))
            except TypeError as error:
                assert "only on numba_hostfn.simulator.Stream" in str(error), error
                print("refused")
    stream.sync()
    assert nh.pending() == 0
""")


def test_a_stream_handle_int_subclass_names_no_other_simulated_stream():
    """The simulator's registry is looked up with the handle's value: an int subclass
    that hashes and compares as a live stream's handle, with another value, passed
    it and the enqueue used its value as a native queue (SIGSEGV)."""
    out = run_child(
        "import contextlib\n" + ALIAS_STREAM_SCRIPT, env=child_env(NUMBA_HOSTFN_SIMULATOR="1")
    )
    assert out.split() == ["refused", "refused"]


class _DisabledCall:
    __call__ = None  # as __hash__ = None: callable() says yes, calling raises TypeError


class _NoSelf:
    def method():  # noqa: N805 - the mistake under test
        pass

    def __call__():  # noqa: N805
        pass


@pytest.mark.parametrize(
    "fn, match",
    [
        (_DisabledCall(), "expected a HostFunction"),
        (_NoSelf().method, "A method needs self"),
        (_NoSelf(), "A method needs self"),
        (functools.partial(_NoSelf.method, 1), "partial's arguments"),
    ],
    ids=["call-is-none", "method-without-self", "call-without-self", "partial-surplus"],
)
def test_a_callable_that_cannot_be_called_is_refused_at_launch(stream, fn, match, unraisables):
    """A class that sets __call__ = None, a method defined without self and a
    partial given more arguments than its function takes cannot be called with no
    arguments: refused at launch (both paths accepted them, and the call failed on
    the stream, reported to sys.unraisablehook)."""
    _rejects(stream, TypeError, match, fn)
    assert unraisables == []


def _wait(name, stream, **kwargs):
    """done_future(stream) or async_done(stream) (called in a running loop), with
    what it raised: its ExceptionInfo, whose traceback holds this frame, which then
    holds neither argument."""

    async def main(target, options):
        with pytest.raises(Exception) as error:
            nh.async_done(target, **options)
        del target, options
        return error

    if name == "done_future":
        with pytest.raises(Exception) as error:
            nh.done_future(stream, **kwargs)
    else:
        error = asyncio.run(main(stream, kwargs))
    del stream, kwargs
    return error


@pytest.mark.parametrize("name", ["done_future", "async_done"])
def test_a_wait_reports_a_wrong_stream_before_a_wrong_executor(name):
    """As host_launch does (stream first), done_future and async_done report a stream
    whose __cuda_stream__ gives a wrong answer before a wrong executor= (main
    complained about the executor, and then the stream)."""
    error = _wait(name, _WrongProtocol(), executor="not an executor")
    assert error.type is TypeError and "expected (0, handle)" in str(error.value)
    assert nh.pending() == 0


class _StreamWrapper:
    def __init__(self, stream):
        self.stream = stream

    def __cuda_stream__(self):
        return self.stream.__cuda_stream__()


@pytest.mark.parametrize("name", ["done_future", "async_done"])
@pytest.mark.parametrize("wrong", ["answer", "executor"])
def test_a_refused_wait_keeps_no_stream_while_its_error_lives(stream, name, wrong):
    """A refused done_future or async_done keeps nothing, as a refused host_launch:
    main's error kept the stream (and a future of it) alive in its frames for as
    long as the error lived (a caught one, sys.last_exc)."""
    target = _WrongProtocol() if wrong == "answer" else _StreamWrapper(stream)
    alive = weakref.ref(target)
    error = _wait(name, target, executor="not an executor" if wrong == "executor" else None)
    del target
    gc.collect()
    assert error.type is TypeError and alive() is None
    assert nh.pending() == 0


class _NotAStream:
    """No __cuda_stream__: not a stream (and, unlike object(), weakly referable)."""


#: Wrong streams, each made by calling its maker: no stream, an int, an object with no
#: ``__cuda_stream__``, and one whose answer is no ``(0, handle)``.
_WRONG_STREAMS = {
    "None": lambda: None,
    "int": lambda: 12345,
    "no protocol": _NotAStream,
    "wrong answer": _WrongProtocol,
}


#: host_copy and release_after, each with what it would enqueue and with nothing to
#: enqueue (a zero-byte copy, no objects): the function and its arguments after the
#: stream, over the bytearray ``buf`` (called from the test itself, so that no frame
#: of the test's but its own is in a refusal's traceback, keeping the stream).
_COPY_CALLS = {
    "host_copy": lambda buf: (nh.host_copy, memoryview(buf)[:4], memoryview(buf)[4:]),
    "host_copy 0 bytes": lambda buf: (nh.host_copy, memoryview(buf)[:0], memoryview(buf)[4:4]),
    "host_copy rows": lambda buf: (
        nh.host_copy,
        np.frombuffer(buf, np.uint8).reshape(2, 4)[:, :2],
        np.frombuffer(buf, np.uint8).reshape(2, 4)[:, 2:],
    ),
    "release_after": lambda buf: (nh.release_after, memoryview(buf)),
    "release_after nothing": lambda buf: (nh.release_after,),
}


@pytest.mark.parametrize("call", list(_COPY_CALLS))
@pytest.mark.parametrize("target", list(_WRONG_STREAMS))
@pytest.mark.parametrize("wrong_executor", ["object", "closed"])
def test_host_copy_and_release_after_report_a_wrong_stream_before_a_wrong_executor(
    call, target, wrong_executor
):
    """As host_launch, done_future and async_done do (the stream first: its type,
    then its answer), host_copy and release_after report a wrong stream before a
    wrong executor=, in host_launch's words with their own name, having enqueued
    and kept nothing (main checked executor= first, and reported the executor)."""
    name = call.split()[0]
    make = _WRONG_STREAMS[target]
    with pytest.raises(TypeError) as launched:
        nh.host_launch(make(), touch)
    expected = str(launched.value).replace("host_launch()", f"{name}()")
    if wrong_executor == "closed":
        executor = nh.HostExecutor(threads=1)
        executor.close()
    else:
        executor = object()
    buf, bad = bytearray(8), make()
    alive = weakref.ref(bad) if target in ("no protocol", "wrong answer") else None
    pending = nh.pending()
    function, *args = _COPY_CALLS[call](buf)
    with pytest.raises(Exception) as error:
        function(bad, *args, executor=executor)
    del bad, args
    gc.collect()
    assert error.type is TypeError and str(error.value) == expected
    assert nh.pending() == pending
    assert resizable(buf)  # no export of it kept, while the error lives
    assert alive is None or alive() is None


class _CountingProtocol:
    """A stream-like object whose ``__cuda_stream__`` counts its calls (a protocol
    with side effects) and gives ``stream``'s answer the first time, a handle no
    launch could use after that (one that names another stream when asked again)."""

    def __init__(self, stream):
        self.stream, self.calls = stream, 0

    def __cuda_stream__(self):
        self.calls += 1
        return self.stream.__cuda_stream__() if self.calls == 1 else (0, 0x10)


@pytest.mark.parametrize("call", list(_COPY_CALLS))
@pytest.mark.parametrize("with_executor", [False, True], ids=["driver", "executor"])
def test_host_copy_and_release_after_ask_cuda_stream_once(stream, call, with_executor):
    """host_copy and release_after call ``__cuda_stream__`` exactly once, as
    host_launch and the waits do, also now that the stream is checked before
    executor= and the buffers: its handle, read first, is the one the launch (or
    a call with nothing to enqueue) goes to, not the protocol asked again."""
    buf = bytearray(range(8))
    with nh.HostExecutor(threads=1) as executor:
        counting = _CountingProtocol(stream)
        function, *args = _COPY_CALLS[call](buf)
        function(counting, *args, **({"executor": executor} if with_executor else {}))
        del args
        assert counting.calls == 1
        stream.sync()
        nh.drain()
    if call == "host_copy":
        assert buf == bytearray([4, 5, 6, 7, 4, 5, 6, 7])
    elif call == "host_copy rows":
        assert buf == bytearray([2, 3, 2, 3, 6, 7, 6, 7])
    assert nh.pending() == 0


class _InstanceOnly:
    """A class whose instances may have a __cuda_stream__ of their own."""


class _LosesItsProtocol:
    def __cuda_stream__(self):
        return self.answer


_BAD_TARGET_CALLS = {
    "host_launch": lambda s: nh.host_launch(s, touch),
    "host_launch blocking=False": lambda s: nh.host_launch(s, print, blocking=False),
    "host_copy": lambda s: nh.host_copy(s, np.zeros(1), np.ones(1)),
    "release_after": lambda s: nh.release_after(s, object()),
    "done_future": lambda s: nh.done_future(s),
    "add_callback": lambda s: nh.add_callback(s, lambda stream, status, arg: None),
}


@pytest.mark.parametrize("call", list(_BAD_TARGET_CALLS))
def test_a_protocol_that_only_one_object_of_a_class_had_is_not_its_classs(stream, call):
    """The verdict "a stream" is remembered per class: one instance with a
    __cuda_stream__ of its own (or a class that later lost its method) made every
    object of the class a stream, and one without the protocol then met an
    AttributeError from reading it, not the TypeError that names the protocol."""
    launch = _BAD_TARGET_CALLS[call]
    owned = _InstanceOnly()
    owned.__cuda_stream__ = stream.__cuda_stream__
    lost = _LosesItsProtocol()
    lost.answer = stream.__cuda_stream__()
    for target in (owned, lost):
        launch(target)
        stream.sync()
        nh.drain()
    method = _LosesItsProtocol.__cuda_stream__
    del _LosesItsProtocol.__cuda_stream__
    try:
        for target in (_InstanceOnly(), _LosesItsProtocol()):
            with pytest.raises(TypeError, match=r"object with the __cuda_stream__ protocol"):
                launch(target)
    finally:
        _LosesItsProtocol.__cuda_stream__ = method
    assert nh.pending() == 0


class _TorchLike:  # a torch.cuda.Stream before the protocol: its handle as .cuda_stream
    cuda_stream = 0x1000


class _CupyLike:  # a cupy.cuda.Stream before the protocol: .ptr
    ptr = 0x1000


class _NumbaLike:  # a numba.cuda stream before the protocol: .handle, a ctypes c_void_p
    handle = ctypes.c_void_p(0x1000)


@pytest.mark.parametrize(
    "target, how",
    [
        (_TorchLike(), "from_handle(stream.cuda_stream)"),
        (_CupyLike(), "from_handle(stream.ptr)"),
        (_NumbaLike(), "from_handle(stream.handle.value)"),
    ],
)
@pytest.mark.parametrize("call", list(_BAD_TARGET_CALLS))
def test_a_stream_without_the_protocol_is_told_how_to_wrap_its_handle(target, how, call):
    """An object that holds a raw stream handle but has no __cuda_stream__ (a torch,
    CuPy or numba-cuda stream of a version without the protocol) is refused, as
    before, but the message now says how to pass it: Stream.from_handle of its
    handle attribute, as a bare int's does."""
    with pytest.raises(TypeError, match=r"__cuda_stream__") as error:
        _BAD_TARGET_CALLS[call](target)
    assert f"cuda.core.Stream.{how}" in str(error.value), error.value
    assert nh.pending() == 0


@pytest.mark.parametrize("target", list(_WRONG_STREAMS))
@pytest.mark.parametrize("callback", ["not callable", "compiled", "no three parameters"])
def test_add_callback_reports_a_wrong_stream_before_a_wrong_callback(target, callback):
    """As host_launch (and host_copy, release_after) do, add_callback checks the stream
    first: with a wrong stream and a wrong callback, the stream's error is reported,
    in host_launch's words with add_callback's name (main reported the callback)."""
    make = _WRONG_STREAMS[target]
    with pytest.raises(TypeError) as launched:
        nh.host_launch(make(), touch)
    expected = str(launched.value).replace("host_launch()", "add_callback()")
    wrong = {"not callable": 5, "compiled": touch, "no three parameters": lambda: None}[callback]
    pending = nh.pending()
    with pytest.raises(TypeError) as error:
        nh.add_callback(make(), wrong, None)
    assert str(error.value) == expected
    assert nh.pending() == pending


def test_add_callback_asks_cuda_stream_once(stream):
    """add_callback reads the stream's handle once: the launch goes to the handle
    the first answer named (a protocol asked again may name another stream)."""
    seen = []
    counting = _CountingProtocol(stream)
    nh.add_callback(counting, lambda s, status, arg: seen.append((s, status, arg)), 7)
    assert counting.calls == 1
    stream.sync()
    nh.drain()
    assert seen == [(counting, 0, 7)]
    assert nh.pending() == 0


def test_a_protocol_property_is_asked_once_even_by_the_first_call_of_its_type(stream):
    """``__cuda_stream__`` as a property: the first call for an object of a new type
    read it twice (``hasattr`` ran the getter to decide that it is a stream, then the
    launch read it); it is found without running it now."""
    asked = []

    class PropertyStream:
        @property
        def __cuda_stream__(self):
            asked.append(1)
            return stream.__cuda_stream__()

    for _ in range(2):
        asked.clear()
        nh.host_launch(PropertyStream(), touch)
        assert len(asked) == 1
    stream.sync()
    nh.drain()


def test_an_int_subclass_with_the_protocol_is_a_stream(stream):
    """An int subclass with ``__cuda_stream__`` speaks the protocol, which decides:
    it was refused as "a bare int"."""

    class IntStream(int):
        def __cuda_stream__(self):
            return stream.__cuda_stream__()

    ran = []
    nh.host_launch(IntStream(7), lambda: ran.append(1))
    stream.sync()
    nh.drain()
    assert ran == [1]
    with pytest.raises(TypeError, match="bare int"):
        nh.host_launch(7, lambda: ran.append(2))
