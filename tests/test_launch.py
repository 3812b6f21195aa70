"""host_launch semantics, the same on the CUDA driver and the simulator."""

import array
import ctypes
import gc
import os
import struct
import subprocess
import sys
import threading
import time
import weakref
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
from _device import Hold, child_env, rerun_on_simulator, resizable, run_child, thread_state_count
from numba import carray

import numba_hostfn as nh
from numba_hostfn import _core

# Every test runs through host_launch's native fast path and through Python.
pytestmark = pytest.mark.usefixtures("launch_path")

OUT = np.dtype([("out", np.uint64), ("value", np.int64)])


@nh.host_callback
def observe(p):
    """cell[1] = 10 * cell[0] + cell[2]: what the host saw between two device writes."""
    cell = carray(p, (3,), np.int32)
    cell[1] = 10 * cell[0] + cell[2]


@nh.host_callback
def increment(p):
    carray(p, (1,), np.int64)[0] += 1


@nh.host_callback(dtype=OUT)
def write_value(d):
    """*(int64 *)d.out = d.value, then d.value is overwritten (it is the launch's copy)."""
    carray(nh.as_voidptr(d.out), (1,), np.int64)[0] = d.value
    d.value = -1


@nh.host_callback
def nothing(p):
    pass


@nh.host_callback
def append_value(p):
    """p -> [count, values...]: append 1 + the count so far."""
    a = carray(p, (1001,), np.int64)
    n = a[0]
    a[n + 1] = n + 1
    a[0] = n + 1


def test_host_function_runs_between_prior_and_later_stream_work(stream, device):
    cell = device.host_array(3)
    device.store(stream, cell, 0, 1, delay=0.05)  # device work before
    nh.host_launch(stream, observe, user_data=nh.by_ref(cell))
    device.store(stream, cell, 2, 7)  # device work after
    stream.sync()
    assert list(cell) == [1, 10, 7]


def test_python_callable_runs_between_prior_and_later_stream_work(stream, device):
    cell = device.host_array(3)
    seen = []
    device.store(stream, cell, 0, 1, delay=0.05)
    nh.host_launch(stream, lambda: seen.append((int(cell[0]), int(cell[2]))))
    device.store(stream, cell, 2, 7)
    stream.sync()
    assert seen == [(1, 0)]
    assert cell[2] == 7


def test_fifo_order_of_many_host_functions(stream, device):
    data = np.zeros(1001, np.int64)
    device.delay(stream, 0.02)
    for _ in range(1000):
        nh.host_launch(stream, append_value, user_data=nh.by_ref(data))
    stream.sync()
    assert data[0] == 1000
    assert (data[1:] == np.arange(1, 1001)).all()


def test_python_callables_run_in_order(stream):
    order = []
    for i in range(200):
        nh.host_launch(stream, lambda i=i: order.append(i))
    stream.sync()
    assert order == list(range(200))


def test_callable_released_after_it_ran(stream, device):
    class Probe:
        calls = 0

        def __call__(self):
            Probe.calls += 1

    probe = Probe()
    alive = weakref.ref(probe)
    with Hold(stream):  # not a delay: gc.collect() with large libraries loaded is slow
        nh.host_launch(stream, probe)
        del probe
        gc.collect()
        assert alive() is not None, "the launch must own the callable until it ran"
        assert nh.pending() == 2  # the hold's launch and this one
    stream.sync()
    nh.drain()
    gc.collect()
    assert Probe.calls == 1
    assert alive() is None
    assert nh.pending() == 0


def test_release_happens_on_the_main_thread_without_explicit_drain(stream):
    released_on = []

    class Probe:
        def __call__(self):
            pass

        def __del__(self):
            released_on.append(threading.current_thread())

    nh.host_launch(stream, Probe())
    stream.sync()
    deadline = time.monotonic() + 10
    while not released_on and time.monotonic() < deadline:
        time.sleep(0.001)  # pending calls run between bytecodes of the main thread
    assert released_on == [threading.main_thread()]


def test_a_python_callables_return_value_is_released_on_the_main_thread(stream):
    """What a Python callable returns is kept by its record and released with it, on
    the main thread, as the callable is: its finalizer may take locks that the
    driver's thread must never wait for (invariants 2 and 5)."""
    released_on = []

    class Result:
        def __del__(self):
            released_on.append(threading.current_thread())

    nh.host_launch(stream, lambda: Result())
    stream.sync()
    deadline = time.monotonic() + 10
    while not released_on and time.monotonic() < deadline:
        time.sleep(0.001)  # pending calls run between bytecodes of the main thread
    assert released_on == [threading.main_thread()]


def test_finalizer_run_by_the_drain_may_launch_again(stream):
    """The drain unlinks a record before dropping its owner (invariant 11)."""
    ran = []

    class Relauncher:
        def __call__(self):
            ran.append("first")

        def __del__(self):
            nh.host_launch(stream, lambda: ran.append("second"))

    nh.host_launch(stream, Relauncher())
    stream.sync()
    nh.drain()  # drops the Relauncher (unless a pending call did already)
    stream.sync()
    nh.drain()
    assert ran == ["first", "second"]
    assert nh.pending() == 0


def test_a_record_is_released_before_its_owners_finalizer_runs(stream):
    """Invariant 11: the record is unlinked (no longer held, its owner no longer read
    from it) before its owner is dropped: a finalizer sees neither."""
    seen = []

    class Probe:
        def __call__(self):
            pass

        def __del__(self):
            owners = [o for o in _core._testing.held_owners() if type(o) is Probe]
            seen.append((_core.held(), owners))

    nh.host_launch(stream, Probe())
    stream.sync()
    nh.drain()
    deadline = time.monotonic() + 30  # a hang guard: the drain above released it
    while not seen and time.monotonic() < deadline:
        time.sleep(0.001)
    assert seen == [(0, [])]


def test_by_ref_buffer_kept_alive_until_run_then_released(stream, device):
    counter = np.zeros(1, np.int64)
    alive = weakref.ref(counter)
    with Hold(stream):  # not a delay: gc.collect() with large libraries loaded is slow
        nh.host_launch(stream, increment, user_data=nh.by_ref(counter))
        view = counter.view()  # to read the result; does not own the launch
        del counter
        gc.collect()
        assert alive() is not None
    stream.sync()
    nh.drain()
    assert view[0] == 1
    del view
    gc.collect()
    assert alive() is None


def test_read_only_user_data_is_copied_at_launch(stream, device):
    result = np.zeros(1, np.int64)
    source = bytearray(struct.pack("=Qq", result.ctypes.data, 1234))
    device.delay(stream, 0.05)
    nh.host_launch(stream, write_value, user_data=memoryview(source).toreadonly())
    source[8:16] = struct.pack("=q", 999)  # changing the source after the launch...
    stream.sync()
    assert result[0] == 1234  # ...does not change what the function saw
    assert struct.unpack("=q", source[8:16])[0] == 999  # and it wrote only its own copy


@pytest.mark.parametrize("kind", ["bytearray", "numpy", "memoryview", "ctypes"])
def test_writable_user_data_is_shared_not_copied(stream, device, kind):
    """A writable buffer is shared, as by_ref shares it: the body's writes land in it
    (a copy would have taken them and dropped them), and the launch owns it until run."""
    result = np.zeros(1, np.int64)
    packed = struct.pack("=Qq", result.ctypes.data, 1234)
    data = {
        "bytearray": lambda: bytearray(packed),
        "numpy": lambda: np.frombuffer(bytearray(packed), OUT).copy(),
        "memoryview": lambda: memoryview(bytearray(packed)),
        "ctypes": lambda: (ctypes.c_char * 16).from_buffer_copy(packed),
    }[kind]()
    with Hold(stream):  # the launch is still held when pending() is read
        before = nh.pending()
        nh.host_launch(stream, write_value, user_data=data)
        assert nh.pending() == before + 1
    stream.sync()
    nh.drain()
    assert result[0] == 1234
    assert struct.unpack("=q", bytes(memoryview(data).cast("B"))[8:16])[0] == -1  # its write


def test_writable_user_data_that_cannot_be_shared_is_refused(stream):
    """A strided writable buffer cannot be shared, and is not copied either."""
    strided = np.zeros((4, 4), np.int64)[:, :2]
    before = nh.pending()
    with pytest.raises(ValueError, match=r"C-contiguous.*bytes\(a\) for a copy"):
        nh.host_launch(stream, increment, user_data=strided)
    assert nh.pending() == before


def test_numpy_user_data_is_shared_and_checked_against_layout(stream):
    result = np.zeros(1, np.int64)
    record = np.array([(result.ctypes.data, 55)], OUT)
    nh.host_launch(stream, write_value, user_data=record)
    stream.sync()
    assert result[0] == 55
    assert record[0]["value"] == -1  # the body's write, in the caller's array
    frozen = record.copy()
    frozen[0]["value"] = 56
    frozen.flags.writeable = False  # read-only: a copy
    nh.host_launch(stream, write_value, user_data=frozen)
    stream.sync()
    assert result[0] == 56 and frozen[0]["value"] == 56


def test_a_record_is_shared_with_the_body(stream):
    """A record is shared, as a writable buffer is: what the body writes into its
    fields is in the record's own data once the stream has passed the launch."""
    result = np.zeros(1, np.int64)
    rec = nh.record(OUT, out=result, value=21)
    nh.host_launch(stream, write_value, user_data=rec)
    stream.sync()
    assert result[0] == 21
    assert rec.data[0]["value"] == -1  # the body's write, not lost in a copy
    write_value(rec)  # a direct call shares it too
    assert result[0] == -1


def test_a_body_that_reads_its_argument_is_never_given_null_by_accident(stream):
    """user_data=None would give NULL to a body that follows the pointer: refused at
    launch (and in a direct call); a direct call without user_data is a TypeError.
    A body that never reads its argument launches with None, and user_data=0 is an
    NULL as an int address, 0, is refused for it too."""
    assert increment.reads_user_data and not nothing.reads_user_data
    _refused_none = "reads its argument, and user_data=None would give it NULL"
    before = nh.pending()
    with pytest.raises(ValueError, match=_refused_none):
        nh.host_launch(stream, increment)
    with pytest.raises(ValueError, match=_refused_none):
        nh.host_launch(stream, increment, user_data=None)
    with pytest.raises(ValueError, match=_refused_none):
        increment(None)
    with pytest.raises(ValueError, match="user_data=0 would give it NULL"):
        nh.host_launch(stream, increment, user_data=0)
    with pytest.raises(TypeError, match="takes one argument, user_data"):
        increment()
    with pytest.raises(TypeError, match="takes one argument, user_data"):
        nothing()
    assert nh.pending() == before
    nh.host_launch(stream, nothing)
    nh.host_launch(stream, nothing, user_data=None)
    nh.host_launch(stream, nothing, user_data=0)
    nothing(None)
    stream.sync()
    nh.drain()
    assert nh.pending() == before


def test_int_user_data_is_passed_through(stream):
    counter = np.zeros(1, np.int64)
    nh.host_launch(stream, increment, user_data=counter.ctypes.data)
    nh.host_launch(stream, increment, user_data=counter.ctypes.data)
    stream.sync()
    assert counter[0] == 2


def test_by_ref_buffer_written_by_compiled_function(stream):
    record = np.zeros(1, OUT)
    result = np.zeros(1, np.int64)
    record[0]["out"] = result.ctypes.data
    record[0]["value"] = 77
    nh.host_launch(stream, write_value, user_data=nh.by_ref(record))
    stream.sync()
    assert result[0] == 77
    assert record[0]["value"] == -1  # by reference: the function wrote the caller's buffer


def test_ctypes_pointer_and_numba_cfunc_are_accepted(stream):
    counter = np.zeros(1, np.int64)
    nh.host_launch(stream, increment.ctypes, user_data=nh.by_ref(counter))
    nh.host_launch(stream, nh.CUhostFn(increment.address), user_data=nh.by_ref(counter))
    nh.host_launch(stream, increment._cfunc, user_data=nh.by_ref(counter))
    stream.sync()
    assert counter[0] == 3


def test_two_streams_keep_their_own_data(device):
    a, b = device.create_stream(), device.create_stream()
    try:
        out_a, out_b = np.zeros(1, np.int64), np.zeros(1, np.int64)
        device.delay(a, 0.02)
        device.delay(b, 0.02)
        for i in range(200):
            nh.host_launch(a, write_value, user_data=struct.pack("=Qq", out_a.ctypes.data, 2 * i))
            nh.host_launch(
                b, write_value, user_data=struct.pack("=Qq", out_b.ctypes.data, 2 * i + 1)
            )
        a.sync()
        b.sync()
        assert out_a[0] == 398 and out_b[0] == 399
    finally:
        a.sync(), b.sync()
        nh.drain()
        device.close_stream(a)
        device.close_stream(b)


def test_python_callable_exception_is_unraisable_and_stream_goes_on(stream, unraisables):
    def broken():
        raise KeyError("inside a Python host function")

    ran_after = []
    nh.host_launch(stream, broken)
    nh.host_launch(stream, lambda: ran_after.append(True))
    stream.sync()
    assert ran_after == [True]
    assert len(unraisables) == 1
    assert unraisables[0].exc_type is KeyError
    assert unraisables[0].object is broken


def test_compiled_exception_is_unraisable_naming_it_and_stream_goes_on(stream, unraisables):
    @nh.host_callback
    def failing(p):
        raise ValueError("inside a compiled host function")

    counter = np.zeros(1, np.int64)
    nh.host_launch(stream, failing)
    nh.host_launch(stream, increment, user_data=nh.by_ref(counter))
    stream.sync()
    assert counter[0] == 1
    assert len(unraisables) == 1
    assert unraisables[0].exc_type is ValueError
    assert "failing" in str(unraisables[0].object)


# ---- GIL freedom -----------------------------------------------------------------------

_libc = ctypes.CDLL(None)
_clock_gettime = _libc.clock_gettime
_clock_gettime.argtypes = (ctypes.c_int, ctypes.c_size_t)
_clock_gettime.restype = ctypes.c_int
_CLOCK_MONOTONIC = 1  # what time.monotonic() reads on Linux
N_STAMPS = 100


@nh.host_callback
def stamp(p):
    """p -> int64[3 + N]: [count, tv_sec, tv_nsec, t_0 .. t_N-1 in ns]."""
    a = carray(p, (3 + N_STAMPS,), np.int64)
    _clock_gettime(_CLOCK_MONOTONIC, a[1:3].ctypes.data)
    a[3 + a[0]] = a[1] * 1_000_000_000 + a[2]
    a[0] += 1


def _hold_gil(seconds):
    """Keep the GIL for ``seconds`` in one C call (PyDLL does not release it)."""
    ctypes.PyDLL(None).usleep(int(seconds * 1e6))


def test_compiled_host_functions_run_while_main_thread_holds_gil(stream, device):
    # A round in which the stream got there after the GIL was taken and every host
    # function ran before it was given back.  On a slow or loaded machine the device
    # delay can end first, or the host-function thread get no CPU until the hold has
    # ended: such a round is run again.  A host function that waits for the GIL never
    # runs inside the hold, in any round.
    rounds = []
    for _ in range(5):
        stamps = np.zeros(3 + N_STAMPS, np.int64)
        device.delay(stream, 0.2)
        for _ in range(N_STAMPS):
            nh.host_launch(stream, stamp, user_data=nh.by_ref(stamps))
        start = time.monotonic_ns()
        _hold_gil(0.5)
        window_end = start + 500_000_000
        stream.sync()
        assert stamps[0] == N_STAMPS
        times = stamps[3:]
        rounds.append((int(times.min()) - start, int(times.max()) - start))
        if (times > start).all() and (times < window_end).all():
            break
    else:
        pytest.fail(
            "no round in 5 ran every compiled host function while the main thread held "
            f"the GIL (first and last, ns after it was taken, the hold 5e8: {rounds}): "
            "they waited for the GIL"
        )


_libc_write = _libc.write
_libc_write.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t)
_libc_write.restype = ctypes.c_ssize_t
_libc_read = _libc.read
_libc_read.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t)
_libc_read.restype = ctypes.c_ssize_t


_libc_poll = _libc.poll
_libc_poll.argtypes = (ctypes.c_void_p, ctypes.c_ulong, ctypes.c_int)
_libc_poll.restype = ctypes.c_int


def _gate(fd):
    """read_a_byte's data: [fd, byte, a struct pollfd {fd, POLLIN, 0}]."""
    return np.array([fd, 0, fd | (1 << 32)], np.int64)


@nh.host_callback
def read_a_byte(p):
    """p -> _gate(fd): wait until a byte can be read from fd (at most 30 s, a hang
    guard: a host function that held the GIL while it waited would stop the main
    thread, which writes the byte), then read it."""
    a = carray(p, (3,), np.int64)
    if _libc_poll(a[2:].ctypes.data, 1, 30_000) == 1:
        _libc_read(a[0], a[1:].ctypes.data, 1)


@nh.host_callback
def write_a_byte(p):
    """p -> int64[2]: [fd, byte]: write one byte to fd."""
    a = carray(p, (2,), np.int64)
    _libc_write(a[0], a[1:].ctypes.data, 1)


class _PollFd(ctypes.Structure):
    _fields_ = [("fd", ctypes.c_int), ("events", ctypes.c_short), ("revents", ctypes.c_short)]


def test_compiled_host_functions_complete_while_the_gil_is_held_scheduling_one_drain(stream):
    """Compiled host functions run, and complete, while the main thread holds the GIL
    in one C call; their completions schedule one pending-call drain between them,
    not one each (invariant 4: once per batch; Py_AddPendingCall's queue is small, and
    a completion per pending call overflows it).  Deterministic: the stream is gated
    on a pipe, and the main thread holds the GIL until the last host function has
    written to another (a 30 s poll as the hang guard)."""
    n = 1000
    gate_r, gate_w = os.pipe()
    done_r, done_w = os.pipe()
    try:
        gate = _gate(gate_r)
        done = np.array([done_w, 0], np.int64)
        counter = np.zeros(1, np.int64)
        nh.host_launch(stream, read_a_byte, user_data=nh.by_ref(gate))
        for _ in range(n):
            nh.host_launch(stream, increment, user_data=nh.by_ref(counter))
        nh.host_launch(stream, write_a_byte, user_data=nh.by_ref(done))
        before = _core._testing.schedule_failures()
        pollfd = _PollFd(done_r, 1, 0)  # POLLIN
        os.write(gate_w, b"x")
        ready = ctypes.PyDLL(None).poll(ctypes.byref(pollfd), 1, 30_000)  # the GIL held
        failures = _core._testing.schedule_failures() - before
        stream.sync()
        nh.drain()
        assert ready == 1, "the compiled host functions did not run while the GIL was held"
        assert counter[0] == n
        assert failures == 0, f"{failures} drains refused: a pending call per completion"
    finally:
        for fd in (gate_r, gate_w, done_r, done_w):
            os.close(fd)


def test_an_executors_compiled_tasks_run_while_the_gil_is_held(stream):
    """A HostExecutor's direct task (a compiled host function on a lane) runs its
    body on a pool thread without the GIL, as nhf_run_compiled does (invariant 4).
    Deterministic: the lane is gated on a pipe, and the main thread holds the GIL in
    one C call until the last task has written to another (a 30 s poll as the hang
    guard: a task that waited for the GIL never writes)."""
    n = 20
    gate_r, gate_w = os.pipe()
    done_r, done_w = os.pipe()
    executor = nh.HostExecutor(threads=1)
    try:
        gate = _gate(gate_r)
        done = np.array([done_w, 0], np.int64)
        counter = np.zeros(1, np.int64)
        nh.host_launch(stream, read_a_byte, user_data=nh.by_ref(gate), executor=executor)
        for _ in range(n):
            nh.host_launch(stream, increment, user_data=nh.by_ref(counter), executor=executor)
        nh.host_launch(stream, write_a_byte, user_data=nh.by_ref(done), executor=executor)
        pollfd = _PollFd(done_r, 1, 0)  # POLLIN
        os.write(gate_w, b"x")
        ready = ctypes.PyDLL(None).poll(ctypes.byref(pollfd), 1, 30_000)  # the GIL held
        stream.sync()
        assert ready == 1, "the executor's compiled tasks did not run while the GIL was held"
        assert counter[0] == n
    finally:
        executor.close()
        nh.drain()
        for fd in (gate_r, gate_w, done_r, done_w):
            os.close(fd)


def test_python_callables_wait_for_the_gil(stream, device):
    # A round in which the stream got there only after the GIL was taken: on a slow
    # machine the device delay can end first.
    times: list[int] = []
    for _ in range(5):
        times.clear()
        device.delay(stream, 0.2)
        for _ in range(5):
            nh.host_launch(stream, lambda: times.append(time.monotonic_ns()))
        start = time.monotonic_ns()
        _hold_gil(0.5)
        window_end = start + 500_000_000
        stream.sync()
        assert len(times) == 5
        if min(times) > start:
            break
    else:
        pytest.fail("no round in 5 in which the callables came after the GIL was taken")
    assert min(times) >= window_end - 1_000_000, "a Python callable ran without the GIL"


# ---- deadlock and threads ----------------------------------------------------------------


def test_no_deadlock_python_callbacks_while_main_thread_launches_and_syncs(stream):
    calls = []
    deadline = time.monotonic() + 3.0
    launched = 0
    while time.monotonic() < deadline:
        for _ in range(20):
            nh.host_launch(stream, lambda: calls.append(1))
            launched += 1
        stream.sync()  # must not hold the GIL while Python callbacks need it
    stream.sync()
    assert len(calls) == launched


def test_eight_threads_launching_at_once(device):
    n_threads, per_thread = 8, 500
    streams = [device.create_stream() for _ in range(n_threads)]
    counters = [np.zeros(1, np.int64) for _ in range(n_threads)]
    py_counts = [0] * n_threads
    barrier = threading.Barrier(n_threads)
    errors = []

    def worker(i):
        try:
            barrier.wait()
            for j in range(per_thread):
                nh.host_launch(streams[i], increment, user_data=nh.by_ref(counters[i]))
                if j % 10 == 0:

                    def bump(i=i):
                        py_counts[i] += 1

                    nh.host_launch(streams[i], bump)
            streams[i].sync()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert errors == []
        assert [int(c[0]) for c in counters] == [per_thread] * n_threads
        assert py_counts == [per_thread // 10] * n_threads
        nh.drain()
        assert nh.pending() == 0
    finally:
        for s in streams:
            s.sync()
            device.close_stream(s)


# ---- regressions found on the H200 ---------------------------------------------------------


def test_results_released_correctly_when_another_library_redeclares_py_decref(stream, monkeypatch):
    """numba-cuda sets ctypes.pythonapi.Py_DecRef.argtypes = [py_object] (shared object)."""
    monkeypatch.setattr(ctypes.pythonapi.Py_DecRef, "argtypes", [ctypes.py_object])
    monkeypatch.setattr(ctypes.pythonapi.Py_IncRef, "argtypes", [ctypes.py_object])
    result = object()
    before = sys.getrefcount(result)
    for _ in range(50):
        nh.host_launch(stream, lambda: result)
    stream.sync()
    nh.drain()
    gc.collect()
    assert sys.getrefcount(result) == before


GROW_SCRIPT = """
import threading

import numba_hostfn as nh
from _device import Device

device = Device()
stream = device.create_stream()
stop = threading.Event()


def drain_all_the_time():  # what a pending call may do while records are taken
    while not stop.is_set():
        nh.drain()


drainer = threading.Thread(target=drain_all_the_time)
drainer.start()
for i in range(3000):  # three slabs of records (native/records.c): each growth meets drains
    nh.host_launch(stream, lambda: None)
stream.sync()
stop.set()
drainer.join()
nh.drain()
print("ok", nh.pending())
"""


def test_pending_call_inside_record_growth_does_not_deadlock():
    run = subprocess.run(
        [sys.executable, "-c", GROW_SCRIPT],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["ok", "0"]


# ---- thread states of the driver's thread --------------------------------------------------

_thread_state_get = ctypes.PYFUNCTYPE(ctypes.c_void_p)(("PyThreadState_Get", ctypes.pythonapi))
_thread_state_id = ctypes.PYFUNCTYPE(ctypes.c_uint64, ctypes.c_void_p)(
    ("PyThreadState_GetID", ctypes.pythonapi)
)


def test_driver_thread_keeps_one_thread_state_for_its_python_callables(stream):
    """Not one PyThreadState created and destroyed per callable (invariant 12)."""
    ids = []
    for _ in range(50):
        nh.host_launch(stream, lambda: ids.append(_thread_state_id(_thread_state_get())))
    stream.sync()
    nh.drain()
    assert len(ids) == 50
    assert len(set(ids)) == 1


def test_simulated_streams_take_no_thread_state_of_their_own(request):
    """Python callables of every simulated stream run on the one host-function thread,
    which keeps one thread state: streams made and closed add none (invariant 12)."""
    if rerun_on_simulator(request):
        return
    with nh.simulator.Stream() as first:
        nh.host_launch(first, lambda: None)  # the host-function thread adopts its state
        first.sync()
    before = thread_state_count()
    for _ in range(20):
        s = nh.simulator.Stream()
        nh.host_launch(s, lambda: None)
        s.sync()
        s.close()
    nh.drain()
    assert thread_state_count() == before


def test_types_seen_by_host_launch_are_not_kept_alive(stream):
    """The per-type caches hold types weakly: classes made per call can die."""
    classes = []
    for _ in range(100):

        class Callback:
            def __call__(self):
                pass

        class StreamWrapper:
            def __init__(self, inner):
                self.inner = inner

            def __cuda_stream__(self):
                return self.inner.__cuda_stream__()

        nh.host_launch(StreamWrapper(stream), Callback())
        classes += [weakref.ref(Callback), weakref.ref(StreamWrapper)]
        del Callback, StreamWrapper
    stream.sync()
    nh.drain()
    gc.collect()
    assert [c for c in classes if c() is not None] == []
    # and a new class that reuses a dead one's id is classified afresh
    for _ in range(50):
        kind = type("NotCallable", (), {})
        with pytest.raises(TypeError, match="Python callable"):
            nh.host_launch(stream, kind())
        del kind
        gc.collect()


SUM = np.dtype([("values", np.uint64), ("n", np.int64), ("out", np.uint64)])


def test_a_record_owns_the_buffers_its_fields_point_to(stream, device):
    """nh.record(): the launch keeps the arrays behind its address fields until it ran."""
    from numba import carray

    @nh.host_callback(dtype=SUM)
    def total(d):
        values = carray(nh.as_voidptr(d.values), (d.n,), np.float64)
        carray(nh.as_voidptr(d.out), (1,), np.float64)[0] = values.sum()

    out = np.zeros(1)
    values = np.arange(1000.0)
    alive = weakref.ref(values)
    with Hold(stream):
        nh.host_launch(stream, total, user_data=nh.record(SUM, values=values, n=1000, out=out))
        del values
        gc.collect()
        assert alive() is not None  # the launch owns it
    stream.sync()
    nh.drain()
    gc.collect()
    assert alive() is None and out[0] == sum(range(1000))
    with pytest.raises(TypeError, match="8-byte integer"):
        nh.record(np.dtype([("a", np.float64)]), a=np.zeros(2))
    with pytest.raises(ValueError, match="does not have"):
        nh.record(SUM, values=out, n=1, total=2)
    with pytest.raises(ValueError, match="C-contiguous"):
        nh.record(SUM, values=np.zeros((4, 4))[:, 0], n=4, out=out)
    with pytest.raises(ValueError, match="has dtype"):
        nh.host_launch(stream, total, user_data=nh.record(np.dtype([("x", np.uint64)]), x=out))


@pytest.mark.parametrize("given", ["buffer", "by_ref"])
def test_a_record_pins_the_memory_its_fields_point_to(stream, given):
    """A record holds a buffer export of every buffer its address fields point to,
    given as the buffer or as by_ref(buffer) (issue 31): while the record or a launch
    of it lives, a bytearray or array.array behind a field cannot be resized (and so
    moved under the host function), and can once both are gone."""
    from numba import carray

    @nh.host_callback(dtype=SUM)
    def total(d):
        values = carray(nh.as_voidptr(d.values), (d.n,), np.float64)
        carray(nh.as_voidptr(d.out), (1,), np.float64)[0] = values.sum()

    values = array.array("d", [1.0]) * 8192
    out = bytearray(8)
    with Hold(stream):
        if given == "by_ref":
            fields = {"values": nh.by_ref(values), "out": nh.by_ref(out)}
        else:  # the bytearray itself; record() takes an array.array as a memoryview
            fields = {"values": memoryview(values), "out": out}
        user_data = nh.record(SUM, n=len(values), **fields)
        del fields
        nh.host_launch(stream, total, user_data=user_data)
        del user_data  # the launch alone holds the record now
        gc.collect()
        for buf in (values, out):
            assert not resizable(buf)
            with pytest.raises(BufferError):
                buf.extend(buf[:1] * 8192)  # would move it
    stream.sync()
    nh.drain()
    gc.collect()
    assert struct.unpack("=d", out) == (8192.0,)
    assert resizable(values) and resizable(out)
    values.extend(values[:1] * 8192)
    out.extend(bytes(1 << 16))
    with pytest.raises(TypeError, match="Python objects"):
        nh.record(SUM, values=np.zeros(2, object), n=2, out=out)
    with pytest.raises(ValueError, match="holds no buffer"):
        nh.record(SUM, values=nh.ByRef.__new__(nh.ByRef), n=2, out=out)


#: How a launch's buffer reaches the ndarray made on a bytearray: itself, numpy's
#: DummyArray (as_strided), a memoryview, a ctypes object (from_buffer).
_ON_MEMORY = {
    "ndarray": lambda a: a,
    "as_strided": lambda a: np.lib.stride_tricks.as_strided(a, shape=(1,), strides=(8,)),
    "asarray_of_memoryview": lambda a: np.asarray(memoryview(a)),
    "ctypes_from_buffer": lambda a: (ctypes.c_int64 * 1).from_buffer(a),
    "ctypes_number": lambda a: ctypes.c_int64.from_buffer(a),
}


@pytest.mark.parametrize("way", list(_ON_MEMORY))
@pytest.mark.parametrize("given", ["by_ref", "writable", "record"])
def test_a_launch_pins_the_buffer_under_an_ndarray_made_on_it(stream, launch_path, given, way):
    """np.ndarray(shape, dtype, buffer=b) keeps b as its base but holds no buffer
    export of it: a launch that pinned only the array (shared user data, by_ref, a
    record's field) left a bytearray resizable, and so movable under the host
    function, while the launch was queued.  The base is pinned as well, also through
    the DummyArray that as_strided leaves as its view's base, and through a
    memoryview or a ctypes object that holds an export of the array (the chain
    stopped at the first object that was no ndarray)."""
    ptr = np.dtype([("p", np.uint64)])

    @nh.host_callback
    def bump(p):
        carray(p, (1,), np.int64)[0] += 1

    @nh.host_callback(dtype=ptr)
    def bump_at(d):
        carray(nh.as_voidptr(d.p), (1,), np.int64)[0] += 1

    memory = bytearray(8)
    on_memory = _ON_MEMORY[way](np.ndarray((1,), np.int64, buffer=memory))
    with Hold(stream):
        if given == "record":
            # A ctypes number is a value to a record's field: by_ref(x) for its address.
            number = way == "ctypes_number"
            field = nh.by_ref(on_memory) if number else on_memory
            nh.host_launch(stream, bump_at, user_data=nh.record(ptr, p=field))
            del field
        else:
            data = nh.by_ref(on_memory) if given == "by_ref" else on_memory
            nh.host_launch(stream, bump, user_data=data)
            del data
        gc.collect()
        assert not resizable(memory)
    stream.sync()
    nh.drain()
    gc.collect()
    assert int.from_bytes(memory, sys.byteorder, signed=True) == 1
    assert resizable(memory)


def test_a_record_field_not_given_is_zero(stream):
    """nh.record() fills the fields it is not given with zeros, as numpy.zeros does, so
    an output field the host function writes need not be given (it was a ValueError)."""
    from numba import carray

    STATS = np.dtype([("values", np.uint64), ("n", np.int64), ("sum", np.float64), ("hi", "f8")])

    @nh.host_callback(dtype=STATS)
    def summarize(d):
        values = carray(nh.as_voidptr(d.values), (d.n,), np.float64)
        d.sum = values.sum()
        d.hi = values.max() + d.hi  # hi was not given: zero

    rec = nh.record(STATS, values=np.arange(5.0), n=5)
    assert rec.data["sum"][0] == 0.0 and rec.data["hi"][0] == 0.0
    nh.host_launch(stream, summarize, user_data=rec)
    stream.sync()
    assert rec.data["sum"][0] == 10.0 and rec.data["hi"][0] == 4.0
    empty = nh.record(STATS)  # every field zero, the address field NULL
    assert empty.data.tobytes() == bytes(STATS.itemsize) and empty.keep == ()


@pytest.mark.parametrize(
    "value, error",
    [(-1, ValueError), ("ten", ValueError), (1 << 64, ValueError), (object(), TypeError)],
)
def test_a_record_value_its_field_cannot_hold_is_refused_naming_the_field(value, error):
    """numpy's own error once came through as it was (an OverflowError, not in the
    documented Raises, or "invalid literal for int()"), naming no field."""
    layout = np.dtype([("values", np.uint64), ("n", np.uint32)])
    with pytest.raises(error, match=r"record\(\) field 'n' is uint32 and cannot hold"):
        nh.record(layout, values=np.arange(2.0), n=value)


NATIVE_FIRST_SCRIPT = """
import time

import numba_hostfn as nh
from numba_hostfn import _core

try:  # no numba imported, nothing compiled yet in this process
    _core.enqueue(1, 2, 3)
except TypeError as e:
    print("usage", "takes 6 or 7 arguments" in str(e))
stream = nh.create_stream()


def noop():
    pass


class Raising:
    # A stream type the fast path learns, whose __cuda_stream__ then raises.

    def __init__(self, stream):
        self.stream, self.fail = stream, False

    def __cuda_stream__(self):
        if self.fail:
            raise ValueError("no handle")
        return self.stream.__cuda_stream__()


if nh.backend_name() == "simulator":  # only the simulator's own Stream is learned there
    target = stream
    nh.host_launch(target, noop)
    real = type(stream).__cuda_stream__
    type(stream).__cuda_stream__ = lambda self: (_ for _ in ()).throw(ValueError("no handle"))
else:
    target = Raising(stream)
    nh.host_launch(target, noop)
    target.fail = True
try:
    nh.host_launch(target, noop)
except ValueError as e:  # the stream's own exception, raised as itself
    print("raised", e)
if nh.backend_name() == "simulator":
    type(stream).__cuda_stream__ = real
try:  # an address out of range: the native check's OverflowError is cleared, and
    # the launch falls through to Python, which raises its own
    nh.host_launch(stream, nh.CUhostFn(1), user_data=1 << 64)
except ValueError as e:
    print("fell", "2**64" in str(e))


def interrupt():
    raise KeyboardInterrupt


try:
    nh.host_launch(stream, interrupt, blocking=False)
    time.sleep(10)
    print("NOT DELIVERED")
except KeyboardInterrupt:
    print("delivered")
stream.sync()
"""


def test_native_error_paths_work_when_the_native_layer_is_built_before_numba_compiles():
    """numba binds every PyExc_* symbol to the exception type itself when its CPU target
    starts; the native layer declares and binds them the same way. Before, it read them
    as CPython's PyObject* variables, so in a process whose first numba_hostfn call came
    before any numba compilation each native error path (a usage error, a fall-through
    clearing an ordinary exception, a Ctrl-C re-raised from a callback) segfaulted."""
    out = run_child(NATIVE_FIRST_SCRIPT)
    assert out.split("\n") == ["usage True", "raised no handle", "fell True", "delivered", ""], out


needs_buffer_dunder = pytest.mark.skipif(
    sys.version_info < (3, 12), reason="a Python class's __buffer__ needs 3.12"
)

REC2 = np.dtype([("a", np.int64), ("b", np.int64)])
SUM = np.dtype([("values", np.uint64), ("n", np.int64), ("out", np.uint64)])


@nh.host_callback(dtype=REC2)
def write_b(d):
    d.b = 12345


@needs_buffer_dunder
def test_writable_user_data_layout_is_checked_on_the_export_shared(stream):
    """resolve_user_data checks the declared layout's size on its first export, then
    shares a second one (ByRef's): a 16-byte layout was given an 8-byte buffer."""

    class Shrinks:
        def __init__(self):
            self.exports = []

        def __buffer__(self, flags):
            b = bytearray(16 if not self.exports else 8)
            self.exports.append(b)
            return memoryview(b)

    with pytest.raises(ValueError, match="then one of 8 bytes"):
        nh.host_launch(stream, write_b, user_data=Shrinks())
    stream.sync()
    nh.drain()


@pytest.mark.parametrize("why", ["executor", "closed", "layout"])
def test_a_refused_launch_does_not_pin_writable_user_data_while_its_error_lives(why):
    """Invariant 3: a call that raises keeps nothing.  The exports taken for
    writable user data (resolve_user_data's memoryview, the ByRef) stay in the
    traceback's frames, so a caught error (or the REPL's sys.last_exc) keeps the
    bytearray unresizable."""
    s = nh.create_stream()
    buf = bytearray(16 if why != "layout" else 7)
    kwargs = {"executor": object()} if why == "executor" else {}
    if why == "closed":
        s.close()
    try:
        nh.host_launch(s, write_b, user_data=buf, **kwargs)
    except (TypeError, ValueError, RuntimeError) as caught:
        error = caught
    assert error is not None
    buf.append(0)  # BufferError: Existing exports of data: object cannot be re-sized
    s.close()


@pytest.mark.parametrize("why", ["executor", "closed", "layout"])
def test_a_refused_launch_does_not_pin_a_by_ref_given_inline_while_its_error_lives(why):
    """Invariant 3 with the documented way to share: ``user_data=nh.by_ref(buf)``.
    The program keeps no reference to that ByRef, but the package's frames that
    were still running when their locals were dropped (host_launch's Python path,
    enqueue) kept it as their argument, so a caught error kept buf unresizable."""
    s = nh.create_stream()
    buf = bytearray(16 if why != "layout" else 8)
    kwargs = {"executor": object()} if why == "executor" else {}
    if why == "closed":
        s.close()
    error = None
    try:
        nh.host_launch(s, write_b, user_data=nh.by_ref(buf), **kwargs)
    except (TypeError, ValueError, RuntimeError) as caught:
        error = caught
    assert error is not None
    buf.append(0)  # BufferError while the error kept the ByRef
    s.close()


def test_a_refused_record_keeps_no_buffer_exported_while_its_error_lives():
    """record() pins each buffer an address field points to as it goes; a later
    field it refuses left those pins in its frame, kept by the caught error."""
    values = bytearray(8)
    error = None
    try:
        nh.record(SUM, values=values, out=-1)
    except ValueError as caught:
        error = caught
    assert "'out'" in str(error)
    values.append(0)  # BufferError while the error kept the pin
    try:
        nh.record(SUM, values=memoryview(values), out=-1)  # a view made for the call
    except ValueError as caught:
        error = caught
    assert "'out'" in str(error)
    assert resizable(values)


@pytest.mark.parametrize("why", ["executor", "closed"])
def test_a_refused_launch_keeps_no_view_of_user_data_while_its_error_lives(why, launch_path):
    """Invariant 3 for the user data itself: host_launch's Python path (where the
    native one falls through, too) kept its arguments in its frame, which a caught
    error's traceback keeps, so a memoryview made for the call kept its bytearray
    exported."""
    s = nh.create_stream()
    buf = bytearray(16)
    executor = None
    if why == "executor":
        executor = nh.HostExecutor(threads=1)
        executor.close()
    else:
        s.close()
    try:
        nh.host_launch(s, write_b, user_data=memoryview(buf), executor=executor)
    except RuntimeError as caught:
        error = caught
    assert "closed" in str(error)
    buf.append(0)  # BufferError while the error kept the memoryview
    s.close()


def test_a_refused_add_callback_keeps_no_view_of_its_arg_while_its_error_lives():
    """Invariant 3 for add_callback: its frame (and the call it made of the
    callback and arg) stayed in a caught error's traceback, uncleared, so a
    memoryview given as arg kept its bytearray exported, whether enqueue refused the
    stream or add_callback the callback."""
    buf = bytearray(16)
    s = nh.create_stream()
    with pytest.raises(TypeError, match=r"^add_callback\(\) ") as info:
        nh.add_callback(12345, lambda stream, status, arg: None, memoryview(buf))
    assert resizable(buf), info.value  # False while its traceback kept the memoryview
    with pytest.raises(TypeError, match="callback.stream, status, arg.") as info:
        nh.add_callback(s, lambda: None, memoryview(buf))
    assert resizable(buf), info.value  # nor its context's (inspect's bind, its arguments)
    assert nh.pending() == 0
    s.close()


def test_record_takes_a_field_named_dtype():
    """record()'s dtype was also a keyword, so a field named "dtype" could not be
    given ("got multiple values for argument 'dtype'"): it is positional-only now."""
    layout = np.dtype([("dtype", np.int64), ("n", np.int64)])
    rec = nh.record(layout, dtype=3, n=1)
    assert rec.data["dtype"][0] == 3 and rec.data["n"][0] == 1
    with pytest.raises(TypeError):
        nh.record(dtype=layout)  # the dtype is no keyword: a field of that name


def test_record_takes_an_array_array_as_a_buffer_not_a_number():
    """record() stores a buffer's address in an address field, but an array.array
    (a buffer) of one element is stored as its value, and not kept."""
    values = array.array("Q", [5])
    rec = nh.record(SUM, values=values, n=1)
    assert rec.data["values"][0] != 5
    assert len(rec.keep) == 1
    with pytest.raises(BufferError):
        values.append(6)  # pinned by the record


def test_record_stores_the_address_of_a_record_item_in_an_address_field():
    """A record a[i] (a numpy.void) for an address field is a buffer: its address in
    a's memory is stored, and what a's memory belongs to is pinned, as for
    a[i:i + 1].  numpy stored its value, a number, as the address (a host function
    that followed it crashed), and kept nothing; for a field that holds no address
    it is refused as any buffer is."""
    rec_dtype = np.dtype([("x", np.int64)])
    ptr_dtype = np.dtype([("p", np.uint64)])
    memory = bytearray(16)
    a = np.ndarray(2, rec_dtype, buffer=memory)
    a["x"] = [5, 7]
    rec = nh.record(ptr_dtype, p=a[1])
    assert rec.data["p"][0] == a.ctypes.data + 8
    with pytest.raises(BufferError):
        memory.extend(b"x")  # pinned by the record
    read_only = a.copy()
    read_only.flags.writeable = False
    assert nh.record(ptr_dtype, p=read_only[1]).data["p"][0] == read_only.ctypes.data + 8
    with pytest.raises(TypeError, match="only an 8-byte integer field can hold a buffer"):
        nh.record(np.dtype([("p", np.int32)]), p=a[1])
    # A record field takes it as its value, as before.
    assert nh.record(np.dtype([("inner", rec_dtype)]), inner=a[1]).data["inner"]["x"][0] == 7
    del rec
    gc.collect()
    memory.extend(b"x")  # released with the record


def test_a_record_for_a_nested_record_field_keeps_what_its_fields_point_to():
    """A Record given for a field that is itself a record: its record is stored, and
    the buffers its address fields point to are kept by the outer record too.  It
    was refused, and its ``data[0]`` (a numpy.void), the way left to nest it, stored
    those addresses and kept nothing: the buffer was freed under the outer record."""
    inner_dtype = np.dtype([("src", np.uint64)])
    outer_dtype = np.dtype([("inner", inner_dtype), ("n", np.int64)])
    memory = bytearray(64)
    inner = nh.record(inner_dtype, src=memory)
    outer = nh.record(outer_dtype, inner=inner, n=3)
    address = inner.data["src"][0]
    assert outer.data["inner"]["src"][0] == address
    del inner
    gc.collect()
    with pytest.raises(BufferError):
        memory.extend(b"x")  # pinned by the outer record
    del outer
    gc.collect()
    memory.extend(b"x")  # released with it


@pytest.mark.parametrize(
    "data, keep, error, fragment",
    [
        ("abc", (), TypeError, "structured dtype as data, got str"),
        (np.zeros(1), (), TypeError, "structured dtype as data, got ndarray"),
        (np.zeros(0, SUM), (), ValueError, "one-element array as data, got shape \\(0,\\)"),
        (np.zeros((1, 1), SUM), (), ValueError, "got shape \\(1, 1\\)"),
        (np.zeros(1, SUM), [], TypeError, "tuple .* as keep, got list"),
        (np.broadcast_to(np.zeros(1, SUM), (1,)), (), ValueError, "writable data"),
    ],
)
def test_a_record_made_by_hand_is_checked_when_made(data, keep, error, fragment):
    """Record is public: a Record(data, keep) that a launch cannot use is refused
    when made, saying how to make one.  Before, Record("abc", ()) was taken and its
    launch raised an error naming by_ref(), and repr of an empty one IndexError."""
    with pytest.raises(error, match=fragment):
        nh.Record(data, keep)
    made = nh.Record(np.zeros(1, SUM), ())
    assert repr(made).startswith("record(") and made.dtype == SUM


def test_a_record_made_read_only_after_it_was_made_is_refused_as_a_record(stream, launch_path):
    """A record whose data was made read-only after it was made was refused at its
    launch with by_ref()'s error ("pass the data as user_data to copy it instead"),
    which the caller never called and cannot follow.  The error names the record."""
    rec = nh.record(SUM, n=1)
    rec.data.flags.writeable = False

    @nh.host_callback(dtype=SUM)
    def reads(d):
        pass

    with pytest.raises(ValueError, match="^the record's data is read-only.*writeable = True"):
        nh.host_launch(stream, reads, user_data=rec)
    assert nh.pending() == 0
    rec.data.flags.writeable = True
    nh.host_launch(stream, reads, user_data=rec)
    stream.sync()


def test_record_refuses_a_negative_numpy_integer_in_an_unsigned_field():
    """-1 in an unsigned field is a ValueError (documented), but np.int64(-1) wraps."""
    with pytest.raises(ValueError, match="'out'"):
        nh.record(SUM, out=-1)
    with pytest.raises(ValueError, match="'out'"):
        nh.record(SUM, out=np.int64(-1))


@pytest.mark.parametrize(
    "field, value",
    [("n", 1.5), ("n", float("nan")), ("n", np.float32(2.5)), ("n", 1e30), ("x", 1e300)],
)
def test_record_refuses_a_number_its_field_would_change(field, value):
    """A value that does not fit its field is a ValueError (documented), but numpy
    truncated 1.5 into an integer field and stored 1e300 in a float32 one as inf."""
    layout = np.dtype([("n", np.int64), ("x", np.float32)])
    with pytest.raises(ValueError, match=f"record\\(\\) field '{field}' is"):
        nh.record(layout, **{field: value})
    rec = nh.record(layout, n=2.0, x=float("inf"))  # a whole number; inf is a float32
    assert rec.data["n"][0] == 2 and np.isinf(rec.data["x"][0])


@pytest.mark.parametrize(
    "field, value",
    [
        ("n", Fraction(3, 2)),
        ("n", Decimal("1.5")),
        ("n", Decimal("NaN")),
        ("pair", [1.5, 2]),
        ("pair", np.array([0.5, 2.0])),
        ("upair", [np.int64(-1), 2]),
        ("upair", [1, 1 << 64]),
    ],
    ids=["fraction", "decimal", "decimal-nan", "list", "array", "wrapped", "too-large"],
)
def test_record_refuses_a_number_its_field_would_change_of_any_kind(field, value):
    """The documented ValueError for a value that does not fit its field ("1.5 in an
    integer one") held for floats only: numpy truncated Fraction(3, 2) and
    Decimal("1.5") into an integer field, and any item of a subarray field ([1.5, 2]
    stored as [1, 2], np.int64(-1) in an unsigned one as 2**64 - 1), silently."""
    layout = np.dtype([("n", np.int64), ("pair", np.int64, (2,)), ("upair", np.uint64, (2,))])
    with pytest.raises(ValueError, match=f"record\\(\\) field '{field}' is"):
        nh.record(layout, **{field: value})
    rec = nh.record(layout, n=Fraction(4, 2), pair=np.array([3.0, 4.0]), upair=[5, 2**64 - 1])
    assert rec.data["n"][0] == 2 and rec.data["pair"][0].tolist() == [3, 4]
    assert rec.data["upair"][0].tolist() == [5, 2**64 - 1] and rec.keep == ()


def test_record_refuses_a_decimal_of_any_decimal_module():
    """A Decimal is told without importing decimal: by the modules that define one,
    `_decimal` and `_pydecimal` too, which a program may import without `decimal`
    (numpy truncated their Decimal("1.5") into an integer field silently)."""
    out = run_child(
        "import sys, _decimal, _pydecimal\n"
        "import numpy as np\n"
        "import numba_hostfn as nh\n"
        "print('decimal' in sys.modules)\n"
        "for module in (_decimal, _pydecimal):\n"
        "    try:\n"
        "        nh.record(np.dtype([('n', np.int64)]), n=module.Decimal('1.5'))\n"
        "        print('stored')\n"
        "    except ValueError as e:\n"
        "        print(e)\n"
    )
    refused = "record() field 'n' is int64 and cannot hold Decimal('1.5') (not a whole number)"
    assert out.splitlines() == ["False", refused, refused], out


@pytest.mark.parametrize(
    "value, error",
    [("False", TypeError), ("0", TypeError), (None, TypeError), (0.5, TypeError), (2, ValueError)],
)
def test_record_refuses_a_value_a_bool_field_would_read_as_its_truth(value, error):
    """numpy stores a bool field's value as its truth: "False" and "0" were stored as
    True, None as False, 2 as True, silently, where an integer field refuses "ten" and
    1.5. A bool field takes True or False (numpy's too), or the integer 0 or 1."""
    layout = np.dtype([("flag", np.bool_), ("flags", np.bool_, (2,))])
    with pytest.raises(error, match=r"record\(\) field 'flag' is bool and cannot hold"):
        nh.record(layout, flag=value)
    with pytest.raises(error, match=r"record\(\) field 'flags' is"):
        nh.record(layout, flags=[True, value])
    rec = nh.record(layout, flag=np.True_, flags=[1, False])
    assert rec.data["flag"][0] and rec.data["flags"][0].tolist() == [True, False]
    assert nh.record(layout, flag=0, flags=np.array([True, True])).data["flags"][0].all()


class _Pair(ctypes.Structure):
    _fields_ = (("a", ctypes.c_int32), ("b", ctypes.c_int32))


@pytest.mark.parametrize("field", ["i", "u", "pair"])
@pytest.mark.parametrize(
    "value",
    [ctypes.c_double(2.5), ctypes.c_double(2.0), ctypes.c_int32(3), _Pair(1, 2)],
    ids=["c_double-2.5", "c_double-2.0", "c_int32", "structure"],
)
def test_record_refuses_a_ctypes_value_for_any_integer_field(field, value):
    """An 8-byte integer field refused a ctypes number, which numpy stores as its
    value, but a narrower one took it: c_double(2.5) was stored in an int32 field as
    2, silently. Every integer field refuses it, as the 8-byte one does."""
    layout = np.dtype([("i", np.int32), ("u", np.uint16), ("pair", np.int16, (2,))])
    given = [value, 1] if field == "pair" else value
    with pytest.raises(
        TypeError,
        match=rf"^record\(\) field '{field}' is .* and cannot hold a {type(value).__name__}",
    ):
        nh.record(layout, **{field: given})
    rec = nh.record(layout, i=int(ctypes.c_int32(3).value), u=2, pair=[1, 2])
    assert (
        rec.data[0]["i"] == 3 and rec.data[0]["u"] == 2 and rec.data[0]["pair"].tolist() == [1, 2]
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("out", b"123"),
        ("n", b"123"),
        ("i", b"12"),
        ("x", b"1.5"),
        ("z", b"1"),
        ("out", np.bytes_(b"7")),
        ("pair", [b"1", b"2"]),
        ("pair", b"12"),
        ("pair", np.array([b"1", b"2"])),
        ("xs", [b"1", 2.0]),
    ],
)
def test_record_refuses_bytes_for_a_number_field(field, value):
    """numpy reads bytes as the number they spell: record(p=b"123") stored the
    address 123 (and b"12" in an int32 field 12, in a subarray [12, 12]), where
    bytes are neither a number nor an address."""
    layout = np.dtype(
        [
            ("out", np.uint64),
            ("n", np.int64),
            ("i", np.int32),
            ("x", np.float64),
            ("z", np.complex128),
            ("pair", np.int32, (2,)),
            ("xs", np.float32, (2,)),
        ]
    )
    with pytest.raises(TypeError, match=rf"^record\(\) field '{field}' is .* cannot hold .*bytes"):
        nh.record(layout, **{field: value})


def test_record_says_how_to_store_the_address_of_bytes():
    """The refusal of bytes for an address field says how to store a buffer's address."""
    with pytest.raises(TypeError, match=r"by_ref\(buffer\)") as info:
        nh.record(SUM, values=b"\x00" * 8)
    assert "an int" in str(info.value)
    values = np.frombuffer(b"\x00" * 8, np.float64)  # read-only: pointed to, and kept
    assert nh.record(SUM, values=values, n=1).data["values"][0] == values.ctypes.data


COMPLEX, DATE, SPAN = np.complex128(1 + 2j), np.datetime64("2020-01-01"), np.timedelta64(5, "s")


@pytest.mark.parametrize(
    ("field", "value", "fragment"),
    [
        ("x", COMPLEX, "a complex number"),
        ("i", np.complex64(2 + 0j), "a complex number"),
        ("out", COMPLEX, "a complex number"),
        ("xs", [1.0, COMPLEX], "a complex number"),
        ("x", DATE, "numpy.datetime64"),
        ("n", np.datetime64("2020-01-01T00:00:00.000000000"), "numpy.datetime64"),
        ("z", DATE, "numpy.datetime64"),
        ("n", SPAN, "numpy.timedelta64"),
        ("i", np.timedelta64(5), "numpy.timedelta64"),
        ("x", SPAN, "numpy.timedelta64"),
        ("pair", [SPAN, 1], "numpy.timedelta64"),
        ("x", None, "None"),
        ("z", None, "None"),
        ("out", None, "None"),
        ("xs", [None, 1.0], "None"),
        ("out", [3.0], "a list"),
        ("x", (2.5,), "a tuple"),
    ],
)
def test_record_refuses_a_value_numpy_would_store_as_another_number(field, value, fragment):
    """numpy stored np.complex128(1+2j) in a float or integer field as 1 (dropping the
    imaginary part with a ComplexWarning), a datetime64 as its count of units (a
    float field 18262.0; an int64 one only for some units, else int()'s TypeError
    naming no field), None in a float or complex field as NaN, and [3.0] in an
    address field as the address 3."""
    layout = np.dtype(
        [
            ("out", np.uint64),
            ("n", np.int64),
            ("i", np.int32),
            ("x", np.float64),
            ("z", np.complex64),
            ("pair", np.int32, (2,)),
            ("xs", np.float32, (2,)),
        ]
    )
    with pytest.raises(TypeError, match=rf"^record\(\) field '{field}' is .*{fragment}.*: "):
        nh.record(layout, **{field: value})
    # What each field takes as numpy does: numeric text, a bool where no address
    # goes, a ctypes number in a float field, a whole float, complex in complex.
    rec = nh.record(
        layout,
        out=7,
        n="12",
        i=True,
        x=ctypes.c_double(2.5),
        z=COMPLEX,
        pair=[np.float64(3.0), "4"],
        xs=np.array([0.5, np.nan]),
    )
    assert rec.data[0]["n"] == 12 and rec.data[0]["i"] == 1 and rec.data[0]["x"] == 2.5
    assert rec.data[0]["z"] == COMPLEX and rec.data[0]["pair"].tolist() == [3, 4]
    assert rec.data[0]["xs"][0] == 0.5 and np.isnan(rec.data[0]["xs"][1])


PAIR = [("x", np.int32), ("y", np.float64)]
NESTED = np.dtype(
    [
        ("inner", PAIR),
        ("more", [("u", np.uint16), ("flag", np.bool_), ("xs", np.int16, (2,))]),
        ("pts", PAIR, (2,)),
        ("outer", [("inner", PAIR), ("n", np.int64)]),
        ("single", [("f", np.float32)]),
    ]
)


class _Doubles(ctypes.Structure):
    _fields_ = (("a", ctypes.c_double), ("b", ctypes.c_double))


@pytest.mark.parametrize(
    ("field", "value", "error", "fragment"),
    [
        ("inner", (b"1", None), TypeError, r"'inner\.x' is int32 .*bytes"),
        ("inner", (1, None), TypeError, r"'inner\.y' is float64 .*NaN"),
        ("inner", (1.5, 2.0), ValueError, r"'inner\.x' is int32 .*not a whole number"),
        ("inner", (1, 1 + 2j), TypeError, r"'inner\.y' is float64 .*a complex number"),
        ("inner", (ctypes.c_double(2.5), 0.0), TypeError, r"'inner\.x' is int32 .*c_double"),
        ("inner", (1, DATE), TypeError, r"'inner\.y' is float64 .*numpy\.datetime64"),
        ("inner", (1, [2.0]), TypeError, r"'inner\.y' is float64 .*a list"),
        ("inner", 1.5, ValueError, r"'inner\.x' is int32 .*not a whole number"),
        ("more", (-1, False, [0, 0]), ValueError, r"'more\.u' is uint16 .*0 to 65535"),
        ("more", (1, "False", [0, 0]), TypeError, r"'more\.flag' is bool .*True or"),
        ("more", (1, 2, [0, 0]), ValueError, r"'more\.flag' is bool .*True or"),
        ("more", (1, True, [1.5, 2]), ValueError, r"'more\.xs' is \('<i2', \(2,\)\) "),
        ("more", (1, True, [b"1", 2]), TypeError, r"'more\.xs' is \('<i2', \(2,\)\) .*bytes"),
        ("pts", [(1, 2.0), (1.5, 2.0)], ValueError, r"'pts\[1\]\.x' is int32 .*not a whole"),
        ("pts", [(b"1", 2.0), (1, None)], TypeError, r"'pts\[0\]\.x' is int32 .*bytes"),
        ("pts", (1, None), TypeError, r"'pts\.y' is float64 .*NaN"),
        ("outer", ((1.5, 2.0), 3), ValueError, r"'outer\.inner\.x' is int32 .*not a whole"),
        ("outer", ((1, 2.0), None), TypeError, r"'outer\.n' is int64 .*None"),
        # numpy's own refusals name the nested field too.
        ("inner", ("abc", 1.0), ValueError, r"'inner\.x' is int32 .*'abc' \(invalid literal"),
        ("pts", [(1, 2.0), (2, "y")], ValueError, r"'pts\[1\]\.y' is float64 .*'y' \("),
        ("single", (1e300,), ValueError, r"'single\.f' is float32 .*1e\+300 \(overflow"),
        # Another structured dtype: numpy casts it by position, truncating.
        (
            "inner",
            np.array((1.5, 2.0), [("a", np.float64), ("b", np.float64)])[()],
            ValueError,
            r"'inner\.x' is int32 .*hold (np\.float64\(1\.5\)|1\.5) \(not a whole number",
        ),
        (
            "pts",
            np.array([(1.0, 2.0), (2.5, 3.0)], [("a", np.float64), ("b", np.float64)]),
            ValueError,
            r"'pts\[1\]\.x' is int32 .*hold (np\.float64\(2\.5\)|2\.5) \(not a whole number",
        ),
        (
            "inner",
            _Doubles(3.5, 2.5),
            ValueError,
            r"'inner\.x' is int32 .*hold (np\.float64\(3\.5\)|3\.5) \(not a whole",
        ),
    ],
)
def test_record_checks_each_field_of_a_nested_record(field, value, error, fragment):
    """A field whose dtype is itself structured (a nested record, or a subarray of
    records) was not checked at all: numpy stored (b"1", None) as (1, nan), 1.5 in
    an int32 item as 1, -1 in a uint16 one as 65535, "False" in a bool one as True,
    and a structured value of another dtype, or a ctypes structure, cast by position
    (1.5 as 1).  Each item is checked as a top-level field of its dtype is, and the
    error names it by its path."""
    with pytest.raises(error, match=rf"^record\(\) field {fragment}"):
        nh.record(NESTED, **{field: value})


@pytest.mark.parametrize(
    ("value", "error", "fragment"),
    [
        ({"x": 1, "y": 2.0}, TypeError, r"a dict.*\(x, y\)"),
        ([1, 2.0], TypeError, r"a list of 2 items: .*one record.*\(x, y\)"),
        ((1,), ValueError, r"a tuple of 1 item for the 2 fields \(x, y\)"),
        ((1, 2.0, 3), ValueError, r"a tuple of 3 items for the 2 fields \(x, y\)"),
        (np.zeros(2, PAIR), TypeError, r"an array of 2 records"),
        (
            np.zeros((), [("a", np.int32)]),
            TypeError,
            r"a record of 1 field \(a\), for the 2 fields \(x, y\)",
        ),
        (bytearray(16), TypeError, r"holds a tuple"),
    ],
)
def test_record_says_what_a_nested_record_field_holds(value, error, fragment):
    """numpy refused a dict for a nested record with int()'s "not 'dict'", and a
    tuple of the wrong length, a list or an array of records with messages that
    said neither what the field holds nor how to give it."""
    with pytest.raises(error, match=rf"^record\(\) field 'inner' is .*{fragment}"):
        nh.record(NESTED, inner=value)


class _Padded(ctypes.Structure):  # int32, 4 bytes of padding, double: as PAIR aligned
    _fields_ = (("x", ctypes.c_int32), ("y", ctypes.c_double))


def test_record_stores_a_nested_record_as_numpy_does_where_nothing_changes():
    """What numpy stored right is stored still: a tuple per record, a numpy.void or
    0-d array of the field's dtype as is (a 0-d array was refused, as a buffer for
    an address field), one of another dtype by position, a ctypes structure by
    position (numpy read one with padding with a RuntimeWarning), a list of records
    for a subarray, a list of one record for a record, one value for every field
    (1), numeric text, a whole float."""
    inner = np.array((3, 4.5), PAIR)
    aligned = np.dtype(PAIR, align=True)
    rec = nh.record(
        NESTED,
        inner=inner,
        more=(2.0, 1, np.array([3, 4])),
        pts=[inner[()], ("5", np.float32(6.5))],
        outer=(np.array((7.0, 8), [("a", np.float64), ("b", np.int8)])[()], np.int64(9)),
    )
    got = rec.data[0]
    assert got["inner"].tolist() == (3, 4.5) and got["more"]["xs"].tolist() == [3, 4]
    assert got["more"]["u"] == 2 and got["more"]["flag"]
    assert got["pts"].tolist() == [(3, 4.5), (5, 6.5)] and got["outer"].tolist() == ((7, 8.0), 9)
    rec = nh.record(
        NESTED,
        inner=inner[()],
        more=1,
        pts=np.array([(1, 2.0), (3, 4.0)], aligned),
        outer=(_Padded(5, 6.5), 0),
    )
    got = rec.data[0]
    assert got["inner"].tolist() == (3, 4.5) and got["more"]["xs"].tolist() == [1, 1]
    assert got["more"]["u"] == 1 and got["more"]["flag"]
    assert got["pts"].tolist() == [(1, 2.0), (3, 4.0)] and got["outer"].tolist() == ((5, 6.5), 0)
    rec = nh.record(NESTED, inner=[_Padded(1, 2.5)], pts=np.zeros(2, PAIR), outer=((1, 2), 3))
    assert rec.data[0]["inner"].tolist() == (1, 2.5) and not rec.keep
    rec = nh.record(NESTED, inner=[(1, 2.5)], outer=(np.array([(3, 4.5)], PAIR), 5))
    assert rec.data[0]["inner"].tolist() == (1, 2.5)
    assert rec.data[0]["outer"].tolist() == ((3, 4.5), 5)


NESTED_SUM = np.dtype([("inner", [("values", np.uint64), ("n", np.int64)]), ("out", np.uint64)])


@nh.host_callback(dtype=NESTED_SUM)
def nested_total(d):
    values = carray(nh.as_voidptr(d.inner.values), (d.inner.n,), np.float64)
    carray(nh.as_voidptr(d.out), (1,), np.float64)[0] = values.sum()


def test_record_stores_a_buffers_address_in_an_address_field_of_a_nested_record(stream):
    """An 8-byte integer field of a nested record holds a buffer's address, kept,
    as a top-level one does: numpy refused an array there ("setting an array
    element with a sequence"), a by_ref with int()'s message, and read a
    bytearray of 8 bytes as the number its bytes spell."""
    values, out = np.arange(4.0), np.zeros(1)
    rec = nh.record(NESTED_SUM, inner=(values, 4), out=out)
    assert rec.data[0]["inner"]["values"] == values.ctypes.data and len(rec.keep) == 2
    nh.host_launch(stream, nested_total, user_data=rec)
    stream.sync()
    assert out[0] == 6.0
    pointed, ref = bytearray(8), nh.by_ref(bytearray(16))
    layout = np.dtype([("pts", NESTED_SUM["inner"], (2,))])
    rec = nh.record(layout, pts=[(pointed, 1), (ref, 2)])
    assert rec.data[0]["pts"]["values"].tolist() == [
        np.frombuffer(pointed, np.uint8).ctypes.data,
        ref.address,
    ]
    assert not resizable(pointed)  # pinned by the record
    del rec
    gc.collect()
    assert resizable(pointed)


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ((True, 1), r"'inner\.values' is uint64, which holds an address .*True"),
        ((ctypes.c_double(2.5), 1), r"'inner\.values' is uint64, .*c_double.*by_ref"),
        ((b"\x00" * 8, 1), r"'inner\.values' is uint64 .*bytes.*by_ref\(buffer\)"),
        ((1, np.arange(2)), r"'inner\.n' is int32: only an 8-byte"),
    ],
)
def test_record_refuses_what_a_nested_address_field_cannot_hold(value, fragment):
    """A nested address field refuses what a top-level one does (a bool, a ctypes
    number, bytes), and another integer field a buffer, as a top-level one does."""
    layout = np.dtype([("inner", [("values", np.uint64), ("n", np.int32)])])
    with pytest.raises(TypeError, match=rf"^record\(\) field {fragment}"):
        nh.record(layout, inner=value)


def test_a_refused_nested_record_keeps_no_buffer_exported():
    """Invariant 3 for a buffer pointed to from a nested record: a later field refused."""
    values = bytearray(8)
    error = None
    try:
        nh.record(NESTED_SUM, inner=(values, 1), out=-1)
    except ValueError as caught:
        error = caught
    assert "'out'" in str(error)
    assert resizable(values)


def test_a_cycle_through_a_by_ref_is_collected_and_unpins_its_buffer():
    """BufferRef holds its object and export without a tp_traverse, so the cyclic
    collector never saw ByRef -> obj: an array (subclass) that keeps its own by_ref
    was leaked, exported for ever (a bytearray in such a cycle stayed unresizable)."""
    import gc
    import weakref

    class Arr(np.ndarray):
        pass

    a = np.zeros(8).view(Arr)
    a.ref = nh.by_ref(a)
    w = weakref.ref(a)
    del a
    gc.collect()
    assert w() is None
    # A launch's copy of read-only user data stays untracked by the collector.
    assert not gc.is_tracked(_core.BufferRef(bytearray(b"x")))


@pytest.mark.parametrize(
    "value",
    [True, False, np.True_, ctypes.c_double(0.0), ctypes.c_uint64(7), ctypes.c_double(2.5)],
    ids=["True", "False", "np.True_", "c_double", "c_uint64", "c_double-2.5"],
)
def test_record_refuses_a_flag_or_a_ctypes_value_for_an_address_field(value):
    """An 8-byte integer field may hold an address, but numpy stored True as the
    address 1 and False as NULL, and a ctypes number (a buffer record() did not take
    as one) as its value: c_double() as NULL, c_double(2.5) as 2, which a host
    function then dereferenced.  Refused, with the way to give either meaning."""
    with pytest.raises(TypeError, match=r"record\(\) field 'out' is uint64, which holds an addr"):
        nh.record(SUM, out=value)
    with pytest.raises(TypeError, match=r"record\(\) field 'n' is int64, which holds an addr"):
        nh.record(SUM, n=value)
    out = ctypes.c_double(0.0)
    rec = nh.record(SUM, out=nh.by_ref(out), n=int(ctypes.c_uint64(7).value))
    assert rec.data["out"][0] == ctypes.addressof(out) and rec.data["n"][0] == 7
    # A field that holds no address takes a bool as numpy does.
    small = nh.record(np.dtype([("i", np.int32), ("x", np.float64)]), i=True, x=np.True_)
    assert small.data["i"][0] == 1 and small.data["x"][0] == 1.0


@pytest.mark.parametrize("kind", ["c_void_p", "c_char_p", "pointer"])
def test_record_refuses_a_ctypes_pointer_with_the_address_it_holds(kind):
    """A ctypes pointer for an address field is refused (numpy stores none of them),
    and the message says how to pass the address it holds.  Before, it said to pass
    by_ref(x), which would store the address of the pointer itself (a pointer to the
    pointer, which the host function would read as its data), and called it a buffer
    that numpy stores as its value."""
    target = ctypes.c_int64(5)
    value = {
        "c_void_p": ctypes.c_void_p(ctypes.addressof(target)),
        "c_char_p": ctypes.c_char_p(b"text"),
        "pointer": ctypes.pointer(target),
    }[kind]
    with pytest.raises(TypeError) as refused:
        nh.record(SUM, out=value)
    message = str(refused.value)
    assert message.startswith("record() field 'out' is uint64, which holds an address"), message
    assert "ctypes.cast(x, ctypes.c_void_p).value" in message, message
    assert "numpy would store as its value" not in message, message
    # As it says: the address it holds, as an int.
    held = ctypes.cast(value, ctypes.c_void_p).value
    assert nh.record(SUM, out=held).data["out"][0] == held
    if kind == "pointer":  # or the buffer it points to, which the launch then keeps
        rec = nh.record(SUM, out=nh.by_ref(value.contents))
        assert rec.data["out"][0] == ctypes.addressof(target)
