"""host_launch's native path: which launches take it, and that it means what Python means.

``numba_hostfn.host_launch`` is a native builtin (``native/host_launch.c``) that
decides the common launches with direct type checks and hands the rest to the
Python implementation.  Every test of test_launch.py and test_launch_args.py also
runs through both paths (the ``launch_path`` fixture); these tests show, with the
native path's counters, that each common kind really is launched natively, that
the rest falls through to Python, and that the native path accepts nothing the
Python path would refuse.
"""

import contextlib
import ctypes
import functools
import gc
import inspect
import sys
import types

import numpy as np
import pytest
from _device import CHILD_PREAMBLE, Capture, Hold, rerun_on_simulator, run_child
from numba import carray, cfunc
from test_launch_args import REC, _rejects, touch, typed  # the same host functions, compiled once

import numba_hostfn as nh
from numba_hostfn import _core, _launch

_CFUNC = cfunc("void(voidptr)")(lambda p: None)


def plain():
    pass


def with_default(x=1):
    pass


class Callable:
    def __call__(self):
        pass

    def method(self):
        pass


def _library_function():
    """libc's ``free`` as ``void (*)(void *)``: a ctypes ``CDLL`` function, of its
    library's own prototype class (not CUhostFn), declared on the instance."""
    free = ctypes.CDLL(None).free
    free.restype, free.argtypes = None, [ctypes.c_void_p]  # argtypes gives back the list
    return free


def _sub_cfunc():
    class SubCFunc(type(_CFUNC)):
        pass

    made = cfunc("void(voidptr)")(lambda p: None)
    made.__class__ = SubCFunc
    return made


class _SubHostFn(nh.CUhostFn):
    # ctypes reads a prototype class's own, at its creation: a subclass declares them
    _flags_, _restype_, _argtypes_ = ctypes._FUNCFLAG_CDECL, None, (ctypes.c_void_p,)


def _counts_of(launch):
    """The native path's counters changed by ``launch()``, called once after a first call."""
    launch()  # the first launch may choose the backend (it falls through, to Python)
    before = _launch.launch_counts()
    launch()
    after = _launch.launch_counts()
    return {name: after[name] - before[name] for name in after if after[name] != before[name]}


@contextlib.contextmanager
def _settled(stream):
    """Yield ``nh.pending()`` at a point where it can change only by a new launch.

    A launch's record is released by the main thread's pending-call drain at any
    bytecode boundary once it has run: on 3.13 at the next one, since its
    Py_AddPendingCall sets the main thread's eval breaker from any thread (3.11
    notices only at a later GIL switch).  So a count read while an earlier
    launch is in flight may drop before the next read.  Everything launched so
    far is synchronized and drained first, and ``stream`` is held: a record
    launched inside the block (the defect a test looks for) can neither run nor
    be released before the block ends.
    """
    stream.sync()
    nh.drain()
    with Hold(stream):
        yield nh.pending()
    stream.sync()
    nh.drain()


def _record():
    return np.zeros(1, REC)


FAST_CASES = {
    "HostFunction, None (its body never reads it)": (lambda: touch, {}, "compiled"),
    "HostFunction, int": (lambda: touch, {"user_data": 12345}, "compiled"),
    "HostFunction, bytes": (lambda: touch, {"user_data": b"abc"}, "compiled"),
    "HostFunction, by_ref": (lambda: touch, {"user_data": nh.by_ref(bytearray(4))}, "compiled"),
    "HostFunction dtype=, bytes": (lambda: typed, {"user_data": _record().tobytes()}, "compiled"),
    "HostFunction dtype=, by_ref": (lambda: typed, {"user_data": nh.by_ref(_record())}, "compiled"),
    "HostFunction, blocking=True": (lambda: touch, {"blocking": True, "user_data": 5}, "compiled"),
    "ctypes CUhostFn": (lambda: touch.ctypes, {"user_data": 7}, "pointer"),
    "ctypes CUhostFn, None": (lambda: touch.ctypes, {}, "pointer"),
    # A C library's function, declared on the instance as ctypes' docs declare one
    # (free(NULL) does nothing), and a subclass of CUhostFn.
    "a C library's function": (lambda: _library_function(), {}, "pointer"),
    "a subclass of CUhostFn": (lambda: _SubHostFn(touch.address), {"user_data": 7}, "pointer"),
    # The first launch of a cfunc (Python's) hands the native path numba's types.
    "a numba cfunc": (lambda: _CFUNC, {"user_data": 5}, "pointer"),
    "a numba cfunc, None": (lambda: _CFUNC, {}, "pointer"),
    "plain function": (lambda: plain, {}, "python"),
    "function with a default": (lambda: with_default, {}, "python"),
    "bound method": (lambda: Callable().method, {}, "python"),
}


@pytest.mark.parametrize("case", list(FAST_CASES))
def test_each_common_kind_takes_the_fast_path(stream, case):
    make_fn, kwargs, kind = FAST_CASES[case]
    fn = make_fn()
    changed = _counts_of(lambda: nh.host_launch(stream, fn, **kwargs))
    assert changed == {kind: 1}, changed


def test_an_executor_launch_takes_the_fast_path_once_its_lane_exists(stream):
    with nh.HostExecutor(threads=1) as executor:
        changed = _counts_of(lambda: nh.host_launch(stream, touch, user_data=5, executor=executor))
        stream.sync()
    assert changed == {"compiled": 1, "executor": 1}, changed


def _partial():
    return functools.partial(plain)


class _NoArguments:
    pass


@functools.lru_cache
def _cached():
    return None


FALLING_CASES = {
    # A writable buffer is shared, as by_ref: the Python path makes the export.
    "a bytearray": lambda s: nh.host_launch(s, touch, user_data=bytearray(b"abc")),
    # Kinds the native path does not decide: a callable object, a numba cfunc of a
    # subclass of numba's CFunc (its address may be a property of its own).
    "a callable object": lambda s: nh.host_launch(s, Callable()),
    "a numba cfunc of a subclass": lambda s: nh.host_launch(s, _sub_cfunc(), user_data=5),
    "numpy user data": lambda s: nh.host_launch(s, typed, user_data=_record()),
    "a record": lambda s: nh.host_launch(s, typed, user_data=nh.record(REC, a=1, b=2.0)),
    "functools.partial": lambda s: nh.host_launch(s, _partial()),
    # What a builtin or a staticmethod needs is its own, not its type's: checked each time.
    "a builtin": lambda s: nh.host_launch(s, gc.collect),
    "a staticmethod": lambda s: nh.host_launch(s, staticmethod(plain)),
    # So is what a class or an lru_cache function needs.
    "a class": lambda s: nh.host_launch(s, _NoArguments),
    "an lru_cache function": lambda s: nh.host_launch(s, _cached),
    "blocking=False": lambda s: nh.host_launch(s, plain, blocking=False),
    "stream by keyword": lambda s: nh.host_launch(stream=s, fn=touch),
    "a keyword that is not interned": lambda s: nh.host_launch(
        s, touch, **{"".join(["user", "_data"]): 5}
    ),
}


@pytest.mark.parametrize("case", list(FALLING_CASES))
def test_other_launches_fall_through_to_python_and_still_work(stream, case):
    launch = FALLING_CASES[case]
    changed = _counts_of(lambda: launch(stream))
    assert changed == {"fell_through": 1}, changed
    stream.sync()
    nh.drain()


def test_a_capturing_stream_falls_through_and_gets_a_graph_node(device, stream):
    counter = np.zeros(1, np.int64)

    @nh.host_callback
    def bump(p):
        carray(p, (1,), np.int64)[0] += 1

    nh.host_launch(stream, bump, user_data=nh.by_ref(counter))
    stream.sync()
    capture = Capture(stream)
    before = _launch.launch_counts()
    nh.host_launch(stream, bump, user_data=nh.by_ref(counter))
    after = _launch.launch_counts()
    graph = capture.end()
    assert after["fell_through"] == before["fell_through"] + 1
    assert after["compiled"] == before["compiled"]
    graph.launch()
    graph.launch()
    stream.sync()
    assert counter[0] == 3  # once directly, twice replayed
    graph.close()


def test_errors_are_raised_by_the_python_path_with_nothing_enqueued(stream):
    for fn, kwargs, error in (
        (touch, {"user_data": -1}, ValueError),
        (touch, {"user_data": b""}, ValueError),
        (typed, {}, ValueError),
        (typed, {"user_data": b"too short"}, ValueError),
        (plain, {"user_data": 5}, ValueError),
        (touch, {"user_data": "text"}, TypeError),
        (touch, {"blocking": False}, ValueError),
    ):
        before = _launch.launch_counts()
        pending = nh.pending()
        with pytest.raises(error):
            nh.host_launch(stream, fn, **kwargs)
        after = _launch.launch_counts()
        assert after["fell_through"] == before["fell_through"] + 1, (fn, kwargs)
        stream.sync()
        nh.drain()
        assert nh.pending() <= pending


def test_a_buffer_ref_no_launch_could_use_is_refused_where_it_is_made(stream):
    """The native path takes a ByRef (by_ref's type, a _core.BufferRef) as user
    data: an empty buffer or one of object pointers is refused when the BufferRef is
    made, and a ByRef made without its buffer is refused by the launch (main launched
    the empty bytearray's shared buffer, and a NULL)."""
    from numba_hostfn import _core, _userdata

    with pytest.raises(ValueError, match="at least one byte"):
        _core.BufferRef(bytearray())
    with pytest.raises(TypeError, match="Python objects"):
        _core.BufferRef(np.empty(2, object))
    unmade = _userdata.ByRef.__new__(_userdata.ByRef)
    pending = nh.pending()
    with pytest.raises(ValueError, match="holds no buffer"):
        nh.host_launch(stream, touch, user_data=unmade)
    stream.sync()
    nh.drain()
    assert nh.pending() <= pending


def test_host_launch_looks_like_the_python_implementation():
    assert isinstance(nh.host_launch, types.BuiltinFunctionType)
    python = inspect.signature(_launch.host_launch_python)
    unannotated = python.replace(
        parameters=[p.replace(annotation=p.empty) for p in python.parameters.values()],
        return_annotation=python.empty,
    )
    assert inspect.signature(nh.host_launch) == unannotated  # a builtin has no annotations
    assert nh.host_launch.__doc__ == inspect.getdoc(_launch.host_launch_python)
    assert nh.host_launch.__name__ == "host_launch"
    assert nh.host_launch.__module__ == "numba_hostfn"
    assert "host_launch" in dir(nh)


@pytest.mark.parametrize(
    "case",
    [
        "HostFunction, None (its body never reads it)",
        "HostFunction, bytes",
        "HostFunction, by_ref",
        "plain function",
        "bound method",
        "ctypes CUhostFn",
        "a C library's function",
        "a numba cfunc, None",
    ],
)
def test_both_paths_take_and_give_back_the_same_references(stream, case):
    make_fn, kwargs, _ = FAST_CASES[case]
    fn = make_fn()
    data = kwargs.get("user_data")

    def counts():
        return sys.getrefcount(fn), 0 if data is None else sys.getrefcount(data)

    def references(path):
        with path:
            nh.host_launch(stream, fn, **kwargs)  # warm up
            stream.sync()
            nh.drain()
            gc.collect()
            with Hold(stream):  # nothing runs (and is released) before `held` is read
                start = counts()
                nh.host_launch(stream, fn, **kwargs)
                held = counts()
            stream.sync()
            nh.drain()
            gc.collect()
            end = counts()
        return held[0] - start[0], held[1] - start[1], end[0] - start[0], end[1] - start[1]

    fast = references(contextlib.nullcontext())
    python = references(_launch.python_path())
    assert fast == python
    assert fast[0] >= 1 and fast[2:] == (0, 0)  # held while pending, given back after


def test_a_ctypes_prototype_changed_on_the_instance_is_seen(stream):
    pointer = nh.CUhostFn(touch.address)
    nh.host_launch(stream, pointer)
    pointer.argtypes = (ctypes.c_int,)
    with pytest.raises(TypeError, match="CUhostFn"):
        nh.host_launch(stream, pointer)
    pointer.argtypes = (ctypes.c_void_p,)
    pointer.restype = ctypes.c_int
    with pytest.raises(TypeError, match="CUhostFn"):
        nh.host_launch(stream, pointer)
    pointer.restype = None
    assert _counts_of(lambda: nh.host_launch(stream, pointer)) == {"pointer": 1}


def test_a_class_attribute_named_restype_does_not_change_the_prototype(stream):
    """Both paths read a pointer's prototype through ctypes' own descriptors, as its calls
    use it: an attribute ``restype`` set on the prototype class hides the real one from
    ``fn.restype`` but not from ctypes, and neither path is misled by it."""
    pointer = nh.CUhostFn(touch.address)
    nh.CUhostFn.restype = ctypes.c_int  # the class ctypes.CFUNCTYPE gives everyone
    try:
        assert pointer.restype is ctypes.c_int
        assert _counts_of(lambda: nh.host_launch(stream, pointer)) == {"pointer": 1}
        with _launch.python_path():
            assert _counts_of(lambda: nh.host_launch(stream, pointer)) == {"fell_through": 1}
    finally:
        del nh.CUhostFn.restype
    stream.sync()


def test_the_prototype_descriptors_are_checked_when_configured():
    for bad in ((1, 2), ("restype",), (type.__dict__["__name__"], 3)):
        with pytest.raises(TypeError, match="prototype="):
            _core.configure_launch(prototype=bad)


def test_a_function_is_checked_per_function_not_per_code_object(stream):
    """Two functions of one code object: one has a default for its argument, one has not."""
    nh.host_launch(stream, with_default)
    no_default = types.FunctionType(with_default.__code__, globals(), "no_default")
    with pytest.raises(TypeError, match="takes 1 argument"):
        nh.host_launch(stream, no_default)


@pytest.mark.gpu
@pytest.mark.parametrize("how", ["method", "attribute"])
def test_a_cuda_core_stream_is_native_and_any_other_cuda_stream_object_python(stream, how):
    """A cuda.core Stream takes the native path; another __cuda_stream__ object (CuPy's,
    PyTorch's), called as a method or read as an attribute, the Python path: both run."""
    handle = int(stream.handle)

    class Method:
        def __cuda_stream__(self):
            return (0, handle)

    class Attribute:
        __cuda_stream__ = (0, handle)

    wrapper = Method() if how == "method" else Attribute()
    counter = np.zeros(1, np.int64)

    @nh.host_callback
    def bump(p):
        carray(p, (1,), np.int64)[0] += 1

    changed = _counts_of(lambda: nh.host_launch(wrapper, bump, user_data=nh.by_ref(counter)))
    assert changed == {"fell_through": 1}, changed
    changed = _counts_of(lambda: nh.host_launch(stream, bump, user_data=nh.by_ref(counter)))
    assert changed == {"compiled": 1}, changed
    stream.sync()
    assert counter[0] == 4


@pytest.mark.parametrize("handle", [-1, 1 << 64, (1 << 64) - 1, "7"])
def test_a_handle_that_is_no_stream_of_this_type_falls_through_to_python(
    stream, monkeypatch, handle
):
    """A stream whose __cuda_stream__ gives a negative, too large or non-int handle:
    the native path hands the call, with no error of its own left set, to Python,
    which raises its error, with nothing enqueued. All ones is a valid address; on
    the simulator it is no stream's own, and refused (on CUDA it is not tried: the
    driver would be given a stream that does not exist)."""
    simulator = nh.backend_name() == "simulator"
    if not simulator and handle == (1 << 64) - 1:
        return
    if simulator:  # the simulator's own Stream type: the native path reads it
        target = stream
    else:
        real = int(stream.handle)

        class Switch:
            def __init__(self, value):
                self.value = value

            def __cuda_stream__(self):
                return (0, self.value)

        nh.host_launch(Switch(real), touch)
        target = Switch(handle)
    with _settled(stream) as pending:
        if simulator:
            monkeypatch.setattr(type(stream), "__cuda_stream__", lambda self: (0, handle))
        before = _launch.launch_counts()
        with pytest.raises((TypeError, ValueError)):
            nh.host_launch(target, touch)
        after = _launch.launch_counts()
        assert after["fell_through"] == before["fell_through"] + 1
        assert after["compiled"] == before["compiled"]
        assert nh.pending() == pending
        monkeypatch.undo()


def test_launching_from_many_threads_never_accepts_what_python_refuses():
    """Threads that launch new code objects all the time while they launch functions
    that need arguments: every such launch must raise, as in Python."""
    import threading

    refused, accepted = [0], [0]

    def worker():
        stream = nh.create_stream()
        needs_arguments = [eval("lambda a, b, c: None") for _ in range(8)]
        for i in range(1500):
            nh.host_launch(stream, eval("lambda: None"))  # a fresh code object each time
            try:
                nh.host_launch(stream, needs_arguments[i % 8])
                accepted[0] += 1
            except TypeError:
                refused[0] += 1
        stream.sync()
        stream.close()

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=worker) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(old)
    nh.drain()
    assert (accepted[0], refused[0]) == (0, 4 * 1500)


def test_a_keyboard_interrupt_in_cuda_stream_is_raised_not_swallowed(request, monkeypatch):
    """Code the native path calls (here __cuda_stream__) may be interrupted by a signal
    handler: the KeyboardInterrupt reaches the caller once, with nothing enqueued.
    (On the simulator, whose Stream is a Python class.)"""
    if rerun_on_simulator(request):
        return
    stream = nh.create_stream()
    nh.host_launch(stream, touch)
    calls = []
    protocol = type(stream).__cuda_stream__

    def interrupted(self):
        calls.append(self)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return protocol(self)

    with _settled(stream) as pending:
        monkeypatch.setattr(type(stream), "__cuda_stream__", interrupted)
        before = _launch.launch_counts()
        with pytest.raises(KeyboardInterrupt):
            nh.host_launch(stream, touch)
        assert len(calls) == 1 and nh.pending() == pending
        assert _launch.launch_counts() == before
        monkeypatch.undo()
    stream.close()


def test_a_signal_handlers_exception_in_cuda_stream_is_raised_as_itself(request, monkeypatch):
    """A signal handler that raises (an alarm) while host_launch calls the stream's
    __cuda_stream__: the handler's exception reaches the caller as itself, from the
    native path (which does not fall through and call it again) and from Python,
    with nothing enqueued. main made it a TypeError ("Stream.__cuda_stream__ raised
    Alarm"), which `except Alarm` missed. (On the simulator, whose Stream is a
    Python class.)"""
    import signal

    if rerun_on_simulator(request):
        return

    class Alarm(Exception):
        pass

    def alarm(signum, frame):
        raise Alarm

    stream = nh.create_stream()
    nh.host_launch(stream, touch)
    protocol = type(stream).__cuda_stream__
    calls = []

    def signalled(self):
        calls.append(self)
        signal.raise_signal(signal.SIGUSR1)  # its handler runs here, and raises
        return protocol(self)

    previous = signal.signal(signal.SIGUSR1, alarm)
    try:
        for path in (contextlib.nullcontext(), _launch.python_path()):
            with path, _settled(stream) as pending:
                calls.clear()
                monkeypatch.setattr(type(stream), "__cuda_stream__", signalled)
                before = _launch.launch_counts()
                with pytest.raises(Alarm):
                    nh.host_launch(stream, touch)
                assert len(calls) == 1 and nh.pending() == pending
                after = _launch.launch_counts()
                monkeypatch.undo()
            fell = after["fell_through"] - before["fell_through"]
            assert fell == (0 if isinstance(path, contextlib.nullcontext) else 1)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    stream.close()


def test_a_simulated_stream_launches_only_on_its_own_native_stream(request):
    """A simulated stream whose __cuda_stream__ gives a handle that is not its own (a
    replaced __cuda_stream__) is refused with the Python path's TypeError, never run;
    a simulated stream cannot be copied (a copy would share its native stream)."""
    import copy

    if rerun_on_simulator(request):
        return
    original = nh.create_stream()
    with pytest.raises(TypeError):
        copy.copy(original)
    original.close()
    impostor = nh.create_stream()
    impostor.__cuda_stream__ = lambda: (0, 0x10)
    before = _launch.launch_counts()
    with pytest.raises(TypeError, match="only on numba_hostfn.simulator.Stream"):
        nh.host_launch(impostor, touch)
    assert _launch.launch_counts()["compiled"] == before["compiled"]
    del impostor.__cuda_stream__
    impostor.close()


NEVER_COMPILED_SCRIPT = (
    CHILD_PREAMBLE
    + """
import contextlib
import time
from numba_hostfn import _launch

blank = nh.HostFunction.__new__(nh.HostFunction)  # never compiled: its address is 0
executor = nh.HostExecutor(threads=1)
counter = np.zeros(1, np.int64)
graphs = []


def attempt(where, target, **kwargs):
    try:
        nh.host_launch(target, blank, **kwargs)
    except ValueError as e:
        print(where, "refused" if "no machine code" in str(e) else e)
    else:
        print(where, "ENQUEUED")


for path in ("fast", "python"):
    with _launch.python_path() if path == "python" else contextlib.nullcontext():
        attempt(path + " stream", stream)
        attempt(path + " executor", stream, executor=executor)
        builder = stream.create_graph_builder().begin_building()
        attempt(path + " capture", builder)
        attempt(path + " captured executor", builder, executor=executor)
        nh.host_launch(builder, increment, user_data=nh.by_ref(counter))
        graphs += [builder, builder.end_building().complete()]
        graphs[-1].launch(stream)
        if nh.backend_name() == "simulator":
            try:
                stream.launch(blank)  # simulated device work
            except ValueError as e:
                print(path, "device work refused", "no machine code" in str(e))
        else:
            print(path, "device work refused True")
stream.sync()
for made in graphs:
    made.close()
del graphs
for _ in range(1000):  # a destroyed graph's owners are released soon after (CUDA)
    nh.drain()
    if nh.pending() == 0:
        break
    time.sleep(0.01)
print("ran", counter[0], "pending", nh.pending())
executor.close()
"""
)


def test_a_host_function_never_compiled_is_refused_everywhere():
    """A HostFunction made with __new__ alone has address 0: it is refused with a
    ValueError (as a NULL ctypes pointer is) on a stream, an executor, in a capture,
    through both paths, and as simulated device work. main enqueued it, and the
    host-function thread called NULL (in a child: that killed the process)."""
    lines = run_child(NEVER_COMPILED_SCRIPT).splitlines()
    expected = []
    for path in ("fast", "python"):
        expected += [
            f"{path} {where} refused"
            for where in ("stream", "executor", "capture", "captured executor")
        ]
        expected.append(f"{path} device work refused True")
    assert lines == expected + ["ran 2 pending 0"], lines


@pytest.mark.parametrize("path", ["fast", "python"])
@pytest.mark.parametrize("kind", [None, "pointer", "python"])
def test_a_compiled_base_of_another_kind_is_not_launched_as_compiled_code(stream, kind, path):
    """A CompiledBase says its launch kind (HostFunction's _bind says "compiled"):
    one that declares another, or none, is refused by both paths with a TypeError,
    nothing enqueued. main launched any bound CompiledBase natively as one-argument
    compiled code (host_launch.c's function_kind)."""
    from numba_hostfn._classify import KINDS

    class Other(_core.CompiledBase):
        pass

    other = Other()
    declared = () if kind is None else (KINDS[kind].number,)
    other._bind(touch.address, None, 0, False, *declared)
    assert other._kind == (None if kind is None else KINDS[kind].number)
    nh.host_launch(stream, touch)  # the backend is made: the fast path is on
    stream.sync()
    nh.drain()
    with _launch.python_path() if path == "python" else contextlib.nullcontext():
        before = _launch.launch_counts()
        _rejects(stream, TypeError, "declares launch kind", other)
        after = _launch.launch_counts()
    assert before["compiled"] == after["compiled"]


def test_a_compiled_base_says_its_kind():
    from numba_hostfn._classify import KINDS

    assert touch._kind == KINDS["compiled"].number == _core.KIND_COMPILED
    with pytest.raises(ValueError, match="no launch kind"):
        _core.CompiledBase()._bind(touch.address, None, 0, False, 99)


def _owner_shape(owner, fn, data):
    """What a launch owns, comparable across launches: the given fn and data by
    identity, a copy by its type and content, None, or a tuple of those."""
    if owner is fn:
        return "fn"
    if data is not None and owner is data:
        return "data"
    if owner is None:
        return None
    if type(owner) is tuple:
        return tuple(_owner_shape(o, fn, data) for o in owner)
    if isinstance(owner, _core.BufferRef):
        return ("copy", type(owner).__name__, type(owner.obj).__name__, bytes(owner.obj))
    return type(owner).__name__


OWNER_CASES = {
    "compiled, None": (lambda: touch, lambda: None),
    "compiled, int": (lambda: touch, lambda: 12345),
    "compiled, bytes": (lambda: touch, lambda: b"abc"),
    "compiled, by_ref": (lambda: touch, lambda: nh.by_ref(bytearray(4))),
    "compiled dtype=, bytes": (lambda: typed, lambda: _record().tobytes()),
    "compiled, a bytearray (Python on both)": (lambda: touch, lambda: bytearray(b"xy")),
    "pointer, int": (lambda: touch.ctypes, lambda: 7),
    "pointer, bytes": (lambda: touch.ctypes, lambda: b"\x01\x02"),
    "python": (lambda: plain, lambda: None),
}


@pytest.mark.parametrize("case", list(OWNER_CASES))
def test_both_paths_own_the_same_for_each_user_data(stream, case):
    """What a launch keeps (its record's owner) is the same on the native and the
    Python path: both build it by kinds.c's one rule, and a copy of read-only
    user data is a BufferRef of a bytearray on both.  main's native path owned a
    bare bytearray for bytes, the Python path a BufferRef (issue 32)."""
    make_fn, make_data = OWNER_CASES[case]
    fn = make_fn()

    def owned(path, data):
        kwargs = {} if data is None else {"user_data": data}
        with path:
            nh.host_launch(stream, fn, **kwargs)  # warm up (the first may make the backend)
            stream.sync()
            nh.drain()
            with Hold(stream):  # nothing runs (and is released) before it is read
                before = {id(o) for o in _core._testing.held_owners()}
                nh.host_launch(stream, fn, **kwargs)
                new = [o for o in _core._testing.held_owners() if id(o) not in before]
                assert len(new) == 1, new
                shape = _owner_shape(new[0], fn, data)
                del new
            stream.sync()
            nh.drain()
        return shape

    data = make_data()
    fast = owned(contextlib.nullcontext(), data)
    python = owned(_launch.python_path(), data)
    assert fast == python
    if "bytes" in case:  # the copy, pinned by its export on both paths
        assert fast[1][:3] == ("copy", "BufferRef", "bytearray"), fast


def test_an_executor_launch_owns_the_same_on_both_paths(stream):
    with nh.HostExecutor(threads=1) as executor:

        def owned(path):
            with path:
                nh.host_launch(stream, touch, user_data=b"ab", executor=executor)
                stream.sync()
                nh.drain()
                with Hold(stream):
                    before = {id(o) for o in _core._testing.held_owners()}
                    nh.host_launch(stream, touch, user_data=b"ab", executor=executor)
                    new = [o for o in _core._testing.held_owners() if id(o) not in before]
                    shape = [_owner_shape(o, touch, executor) for o in new]
                    del new
                stream.sync()
                nh.drain()
            return shape

        fast, python = owned(contextlib.nullcontext()), owned(_launch.python_path())
    assert fast == python == [("fn", ("copy", "BufferRef", "bytearray", b"ab"), None, "data")]


# ---- review: inputs on which the two paths disagreed ----------------------------------


def _outcome(stream, path, launch):
    """("ok" | the error's type and message, whether it took the fast path), with
    everything launched drained and nothing left pending by a refusal."""
    with path, _settled(stream) as pending:
        before = _launch.launch_counts()
        try:
            launch()
            result = "ok"
        except Exception as e:  # what each path raises, compared below
            result = (type(e).__name__, str(e))
            assert nh.pending() == pending  # a refusal enqueued nothing
        fast = _launch.launch_counts()["fell_through"] == before["fell_through"]
    return result, fast


def _both_paths(stream, launch):
    return (
        _outcome(stream, contextlib.nullcontext(), launch)[0],
        _outcome(stream, _launch.python_path(), launch)[0],
    )


def test_a_cuda_stream_attribute_on_a_registered_stream_type_means_what_python_means(request):
    """__cuda_stream__ read as an attribute (not a method) is a stream to the Python
    path (_streams.stream_handle: ``protocol() if callable(protocol) else protocol``);
    the native path called it on the registered stream types and raised
    "'tuple' object is not callable" instead of launching."""
    if rerun_on_simulator(request):
        return
    stream = nh.create_stream()
    nh.host_launch(stream, touch)
    stream.sync()
    nh.drain()
    outcomes = []
    for path in (contextlib.nullcontext(), _launch.python_path()):
        stream.__cuda_stream__ = stream.__cuda_stream__()  # its own (0, handle), as a value
        try:
            with path:
                nh.host_launch(stream, touch)
            outcomes.append("ok")
        except Exception as e:
            outcomes.append((type(e).__name__, str(e)))
        finally:
            del stream.__cuda_stream__
        stream.sync()
        nh.drain()
    assert outcomes == ["ok", "ok"], outcomes
    stream.close()


def _takes_an_argument(x):
    pass


_TAKES_AN_ARGUMENT = _takes_an_argument.__code__.replace(co_freevars=("ran",))


def _launch_changed_by_the_stream(path, change):
    """host_launch on a new stream whose ``__cuda_stream__`` changes ``fn``: the
    outcome ("launched", or the TypeError's message) and whether ``fn`` ran."""
    stream = nh.create_stream()
    ran = []
    if change == "code":

        def fn():
            ran.append(1)

        def change_fn():
            fn.__code__ = _TAKES_AN_ARGUMENT
    else:
        fn = nh.CUhostFn(touch.address)

        def change_fn():
            fn.restype = ctypes.c_int

    def protocol(handle=stream.handle):
        change_fn()
        return (0, handle)

    stream.__cuda_stream__ = protocol
    try:
        with path:
            nh.host_launch(stream, fn)
        outcome = "launched"
    except TypeError as e:
        outcome = str(e)
    finally:
        del stream.__cuda_stream__
    stream.sync()
    stream.close()
    nh.drain()
    return outcome, ran


@pytest.mark.parametrize("change", ["code", "prototype"])
def test_what_cuda_stream_changes_in_fn_is_decided_after_it_on_both_paths(request, change):
    """The stream is asked first on both paths (its ``__cuda_stream__`` runs Python):
    a callable whose code, or a ``CUhostFn`` whose prototype, that call changes is
    decided as it is after it.  The native path decided ``fn`` first and launched the
    old decision: a callable that then takes an argument (its TypeError raised on
    the host, unraisable), a pointer whose prototype is no ``CUhostFn``'s."""
    if rerun_on_simulator(request):
        return
    outcomes = []
    for path in (contextlib.nullcontext(), _launch.python_path()):
        outcome, ran = _launch_changed_by_the_stream(path, change)
        assert ran == []
        outcomes.append(outcome)
    expected = "takes 1 argument(s)" if change == "code" else "a ctypes function pointer"
    assert len(set(outcomes)) == 1 and expected in outcomes[0], outcomes


def test_a_bare_buffer_ref_is_user_data_on_neither_path_or_both(stream):
    """A _core.BufferRef that is no ByRef: the Python path refuses it (TypeError, it
    has no buffer), the native path launched it as a ByRef."""
    launch = lambda: nh.host_launch(stream, touch, user_data=_core.BufferRef(bytearray(4)))  # noqa: E731
    fast, python = _both_paths(stream, launch)
    assert fast == python, (fast, python)


class _ZeroAddress(nh.ByRef):
    __slots__ = ()

    @property
    def address(self):
        return 0


class _OtherDtype(nh.ByRef):
    __slots__ = ()

    @property
    def dtype(self):
        return np.dtype(np.uint8)


class _FewerBytes(nh.ByRef):
    __slots__ = ()

    @property
    def nbytes(self):
        return 3


def _host_function_subclass(name, value):
    cls = type(name, (nh.HostFunction,), {name: property(lambda self: value)})

    def body(p):
        pass

    return cls(body)


SUBCLASS_CASES = {
    "ByRef.address": (lambda: touch, lambda: {"user_data": _ZeroAddress(bytearray(4))}),
    "ByRef.dtype": (lambda: typed, lambda: {"user_data": _OtherDtype(_record())}),
    "ByRef.nbytes": (lambda: typed, lambda: {"user_data": _FewerBytes(_record())}),
    "HostFunction.reads_user_data": (
        lambda: _host_function_subclass("reads_user_data", True),
        lambda: {},
    ),
    "HostFunction.address": (lambda: _host_function_subclass("address", 0), lambda: {}),
    "HostFunction._kind": (lambda: _host_function_subclass("_kind", None), lambda: {}),
    "HostFunction.dtype": (
        lambda: _host_function_subclass("dtype", REC),
        lambda: {"user_data": b"abc"},
    ),
}


@pytest.mark.parametrize("case", list(SUBCLASS_CASES))
def test_a_subclass_property_means_the_same_on_both_paths(stream, case):
    """A ByRef or HostFunction subclass that overrides a field with a property: the
    native path reads the object's own fields (what was exported or bound), the
    Python path read the property, and refused (or would launch another address)."""
    make_fn, make_kwargs = SUBCLASS_CASES[case]
    fn, kwargs = make_fn(), make_kwargs()
    fast, python = _both_paths(stream, lambda: nh.host_launch(stream, fn, **kwargs))
    assert fast == python, (fast, python)


def test_a_flags_class_attribute_does_not_change_a_cuhostfn(stream):
    """ctypes reads a pointer's calling convention from its type's own data, not from
    the ``_flags_`` class attribute, as it reads restype (see above): the native path
    launches CUhostFn, the Python path refused it as PYFUNCTYPE."""
    pointer = nh.CUhostFn(touch.address)
    flags = nh.CUhostFn._flags_
    nh.CUhostFn._flags_ = ctypes.PYFUNCTYPE(None, ctypes.c_void_p)._flags_
    try:
        fast, python = _both_paths(stream, lambda: nh.host_launch(stream, pointer))
    finally:
        nh.CUhostFn._flags_ = flags
    assert fast == python == "ok", (fast, python)


def test_a_pointer_of_another_prototype_class_is_launched_natively_and_runs(stream):
    """A ctypes function pointer whose class is not CUhostFn (a C library's function is
    of its library's class) took the Python path, at about six times a CUhostFn's
    cost.  Its class's ``_flags_`` (cdecl) and the prototype on the instance (argtypes
    given as a list) are what the Python path reads: the native path launches it,
    and the driver's thread calls the address."""
    counter = np.zeros(1, np.int64)
    fn = ctypes.CFUNCTYPE(ctypes.c_int)(_increment.address)
    fn.restype, fn.argtypes = None, [ctypes.c_void_p]
    ref = nh.by_ref(counter)
    assert _counts_of(lambda: nh.host_launch(stream, fn, user_data=ref)) == {"pointer": 1}
    stream.sync()
    assert counter[0] == 2


@pytest.mark.parametrize(
    "flags",
    [
        pytest.param(ctypes._FUNCFLAG_CDECL, id="cdecl"),
        pytest.param(ctypes.PYFUNCTYPE(None, ctypes.c_void_p)._flags_, id="PYFUNCTYPE"),
        pytest.param(ctypes.CFUNCTYPE(None, use_errno=True)._flags_, id="use_errno"),
        pytest.param(float(ctypes._FUNCFLAG_CDECL), id="cdecl as a float"),
        pytest.param(True, id="True"),
        pytest.param(None, id="None"),
    ],
)
def test_a_pointer_classs_flags_mean_the_same_on_both_paths(stream, flags):
    """A pointer of a class other than CUhostFn is cdecl by its class's ``_flags_`` on
    both paths: the native path launches it only for the exact int, and hands any
    other value to the Python path, which launches (``True == 1``, ``1.0 == 1``) or
    refuses it (PYFUNCTYPE, use_errno, None) with nothing enqueued."""

    class Declared(_SubHostFn):
        _flags_, _restype_, _argtypes_ = _SubHostFn._flags_, None, (ctypes.c_void_p,)

    Declared._flags_ = flags  # the attribute alone (ctypes checks it at class creation)
    pointer = Declared(touch.address)
    fast, python = _both_paths(stream, lambda: nh.host_launch(stream, pointer))
    assert fast == python, (fast, python)
    accepted = flags == ctypes._FUNCFLAG_CDECL
    assert (fast == "ok") is accepted, fast
    if not accepted:
        assert fast[0] == "TypeError" and "CUhostFn" in fast[1], fast
    native = _counts_of(lambda: _launched_or_refused(stream, pointer))
    assert native == ({"pointer": 1} if type(flags) is int and accepted else {"fell_through": 1})


def _launched_or_refused(stream, fn):
    with contextlib.suppress(TypeError):
        nh.host_launch(stream, fn)


def test_configure_launch_checks_the_pointer_keywords():
    with pytest.raises(TypeError, match="pointer_type="):
        _core.configure_launch(pointer_type=ctypes.c_void_p(0))
    with pytest.raises(TypeError, match="cdecl_flags="):
        _core.configure_launch(cdecl_flags="1")


def test_without_the_pointer_keywords_only_a_cuhostfn_is_native(stream):
    from numba_hostfn._process import get_backend

    other = _library_function()
    nh.host_launch(stream, other)  # the backend is made and configured
    try:
        _core.configure_launch(pointer_type=None, cdecl_flags=None)
        assert _counts_of(lambda: nh.host_launch(stream, other)) == {"fell_through": 1}
        assert _counts_of(lambda: nh.host_launch(stream, touch.ctypes)) == {"pointer": 1}
    finally:
        _launch._configure_native(get_backend())
    assert _counts_of(lambda: nh.host_launch(stream, other)) == {"pointer": 1}
    stream.sync()
    nh.drain()


def test_a_numba_cfunc_is_native_once_a_first_one_was_launched(stream):
    """A numba cfunc took the Python path at every launch (4 µs against 0.6-0.7 for a
    CUhostFn on an H100 host, 6-13x on the simulator): numba is imported only when
    needed, so the native path learns numba's types from the Python path's first
    cfunc, and launches every later one itself; its body runs."""
    from numba_hostfn._process import get_backend

    counter = np.zeros(1, np.int64)
    bump = cfunc("void(voidptr)")(_bump)
    nh.host_launch(stream, touch)  # the backend is made and configured
    try:
        _core.configure_launch(cfunc=None)  # as at start-up: no cfunc launched yet
        ref = nh.by_ref(counter)
        assert _counts_of(lambda: nh.host_launch(stream, bump, user_data=ref)) == {"pointer": 1}
        stream.sync()
        assert counter[0] == 2
        _core.configure_launch(cfunc=None)
        before = _launch.launch_counts()["fell_through"]
        nh.host_launch(stream, bump, user_data=ref)
        assert _launch.launch_counts()["fell_through"] == before + 1
    finally:
        _launch._configure_native(get_backend())
    stream.sync()
    nh.drain()
    assert counter[0] == 3


def _bump(p):
    carray(p, (1,), np.int64)[0] += 1


@pytest.mark.parametrize(
    "declared",
    [
        pytest.param(lambda: cfunc("void(voidptr)")(lambda p: None), id="a string"),
        pytest.param(lambda: cfunc(_types().void(_types().voidptr))(lambda p: None), id="types"),
        pytest.param(lambda: cfunc("int32(voidptr)")(lambda p: 0), id="another result"),
        pytest.param(lambda: cfunc("void(int64)")(lambda p: None), id="another argument"),
        pytest.param(lambda: cfunc("void(voidptr, voidptr)")(lambda p, q: None), id="two"),
        pytest.param(lambda: cfunc("void(CPointer(int64))")(lambda p: None), id="typed pointer"),
    ],
)
def test_a_numba_cfuncs_signature_means_the_same_on_both_paths(stream, declared):
    """The native path takes a cfunc whose signature is ``void(voidptr)`` by the
    identity of numba's (interned) types, and hands any other to the Python path,
    which compares by value and refuses it with nothing enqueued."""
    made = declared()

    def launch():
        nh.host_launch(stream, made)

    nh.host_launch(stream, _CFUNC)  # numba's types handed over
    fast, python = _both_paths(stream, launch)
    assert fast == python, (fast, python)
    if fast == "ok":
        assert _counts_of(launch) == {"pointer": 1}
    else:
        assert fast[0] == "TypeError" and "void(voidptr)" in fast[1], fast


def _types():
    from numba import types

    return types


@pytest.mark.parametrize("bad", [None, 0])
def test_a_numba_cfuncs_address_is_read_as_python_reads_it(stream, monkeypatch, bad):
    """The address is ``CFunc.address`` on both paths (a property of numba's).  A
    cfunc with no machine code (made with ``CFunc(...)`` and never compiled: None) is
    refused with ValueError, nothing enqueued: the Python path launched NULL for 0
    (the process died when the stream got there)."""
    calls = []
    real = type(_CFUNC).address

    def counted(self):
        calls.append(1)
        return real.fget(self)

    nh.host_launch(stream, _CFUNC)
    monkeypatch.setattr(type(_CFUNC), "address", property(counted))
    assert _counts_of(lambda: nh.host_launch(stream, _CFUNC)) == {"pointer": 1}
    assert len(calls) == 2  # read once a launch
    monkeypatch.setattr(type(_CFUNC), "address", property(lambda self: bad))
    fast, python = _both_paths(stream, lambda: nh.host_launch(stream, _CFUNC))
    assert fast == python, (fast, python)
    assert fast[0] == "ValueError" and "no machine code" in fast[1], fast
    stream.sync()
    nh.drain()


def test_a_numba_cfunc_never_compiled_is_refused():
    """``numba.core.ccallback.CFunc(...)`` without ``compile()`` has no address."""
    from numba.core.ccallback import CFunc

    made = CFunc(_bump, ((_types().voidptr,), _types().void), {}, {})
    with pytest.raises(ValueError, match="no machine code"):
        nh.host_launch(nh.create_stream(), made)
    assert nh.pending() == 0


def test_a_refused_configure_launch_leaves_no_half_configured_fast_path(stream):
    """configure_launch(raise_status=None, route=<bad>) set raise_status (to none) and
    then raised for route, leaving the fast path on: its next refused enqueue called
    the missing raise_status (a NULL: the process died).  The fast path is now
    recomputed on every exit, so it is off until raise_status is back."""
    from numba_hostfn._process import get_backend

    nh.host_launch(stream, plain)  # the backend is made and configured
    try:
        with pytest.raises(TypeError):
            _core.configure_launch(raise_status=None, route="not a route")
        assert _counts_of(lambda: nh.host_launch(stream, plain)) == {"fell_through": 1}
    finally:
        _launch._configure_native(get_backend())
    assert _counts_of(lambda: nh.host_launch(stream, plain)) == {"python": 1}
    stream.sync()


@pytest.mark.parametrize("unset", ["answered", "raise_status"])
def test_a_launch_survives_configure_launch_unsetting_what_it_reads_later(request, unset):
    """host_launch reads the configuration again after the stream's __cuda_stream__ ran
    (Python: it may call configure_launch): the Python path that takes over with its
    answer (answered, here: an executor with no lane for the stream yet) and the
    function that raises a refusal (raise_status, here: an executor closed meanwhile).
    Unset in between, each was a NULL taken as a function: the process died.  Now the
    launch raises RuntimeError and nothing is enqueued or held."""
    if rerun_on_simulator(request):
        return
    from numba_hostfn._process import get_backend

    stream = nh.create_stream()
    executor = nh.HostExecutor(threads=1)
    if unset == "raise_status":  # the lane exists: the enqueue is refused, not handed over
        nh.host_launch(stream, _increment, user_data=nh.by_ref(np.zeros(1)), executor=executor)
        stream.sync()
        nh.drain()
    protocol = type(stream).__cuda_stream__

    def unsetting(self):
        if unset == "raise_status":
            executor.close()
        _core.configure_launch(**{unset: None})
        return protocol(self)

    type(stream).__cuda_stream__ = unsetting
    try:
        with pytest.raises(RuntimeError, match="not imported|refused"):
            nh.host_launch(stream, _increment, user_data=nh.by_ref(np.zeros(1)), executor=executor)
    finally:
        type(stream).__cuda_stream__ = protocol
        _core.configure_launch(answered=_launch.host_launch_answered)
        _launch._configure_native(get_backend())
    stream.sync()
    executor.close()
    nh.drain()
    assert _core.held() == 0  # the executor's and the refused launch's owners too
    stream.close()


@pytest.mark.parametrize(
    "keyword, value", [("cuda_stream_type", 42), ("byref_type", bytes), ("byref_type", "x")]
)
def test_configure_launch_refuses_a_type_the_fast_path_cannot_cast_to(keyword, value):
    """The fast path casts a user_data of byref_type to a BufferRef and reads its
    export: any other type (bytes) was taken, and a bytes user_data read as one."""
    with pytest.raises(TypeError, match=keyword):
        _core.configure_launch(**{keyword: value})


class _Handle(int):
    """A handle of an int subclass: the native path leaves it to Python."""


@pytest.mark.parametrize("case", ["int subclass", "executor, no lane yet", "capturing"])
def test_a_call_the_native_path_hands_over_asks_cuda_stream_once(request, monkeypatch, case):
    """Where the native path has read a registered stream's __cuda_stream__ and then
    leaves the launch to Python (a handle of an int subclass, an executor with no
    lane for the stream yet, a stream that is capturing), Python launches with that
    answer: main asked again, so a protocol that counts its calls was called twice,
    and the launch went where the second answer named (here nowhere: refused).
    (On the simulator, whose Stream is a Python class.)"""
    if rerun_on_simulator(request):
        return
    stream = nh.create_stream()
    protocol = type(stream).__cuda_stream__
    asked = []

    def once(self):  # the stream's own handle first; then nothing a launch could use
        asked.append(self)
        if len(asked) > 1:
            return (0, 0x10)
        handle = protocol(self)[1]
        return (0, _Handle(handle) if case == "int subclass" else handle)

    ran = np.zeros(1, np.int64)
    executor = nh.HostExecutor(threads=1) if case == "executor, no lane yet" else None
    builder = stream.create_graph_builder().begin_building() if case == "capturing" else None
    monkeypatch.setattr(type(stream), "__cuda_stream__", once)
    before = _launch.launch_counts()["fell_through"]
    nh.host_launch(stream, _increment, user_data=nh.by_ref(ran), executor=executor)
    monkeypatch.undo()
    assert len(asked) == 1 and _launch.launch_counts()["fell_through"] == before + 1
    if builder is not None:
        graph = builder.end_building().complete()
        graph.launch(stream)
    stream.sync()
    nh.drain()
    assert ran[0] == 1
    if builder is not None:
        graph.close()
        builder.close()
    if executor is not None:
        executor.close()
    stream.close()


@nh.host_callback
def _increment(p):
    carray(p, (1,), np.int64)[0] += 1
