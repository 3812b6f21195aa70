"""Signals to Python without the GIL: async_done, done_future, non-blocking callbacks.

A signal is a compiled host function that pushes a key and writes an eventfd;
Python reacts on the loop's thread, the main thread or numba_hostfn's helper
thread.  Every test runs on the simulator too.
"""

import asyncio
import concurrent.futures
import contextlib
import ctypes
import functools
import gc
import os
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
from _device import (
    CHILD_PREAMBLE,
    Capture,
    Hold,
    _wait_for_flag,
    child_env,
    held_work,
    run_child,
)
from numba import carray

import numba_hostfn as nh
from numba_hostfn import _notify

_libc = ctypes.CDLL(None)
_clock_gettime = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_void_p)(
    ("clock_gettime", _libc)
)
_CLOCK_MONOTONIC = 1
HELPER = "numba_hostfn-callbacks"


@nh.host_callback
def increment(p):
    carray(p, (1,), np.int64)[0] += 1


@nh.host_callback
def stamp(p):
    """p -> int64[3]: [tv_sec, tv_nsec, t in ns]: when the stream got here."""
    a = carray(p, (3,), np.int64)
    _clock_gettime(_CLOCK_MONOTONIC, a[0:2].ctypes.data)
    a[2] = a[0] * 1_000_000_000 + a[1]


def _hold_gil(seconds):
    """Keep the GIL for ``seconds`` in one C call (PyDLL does not release it)."""
    ctypes.PyDLL(None).usleep(int(seconds * 1e6))


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _wait_for(predicate, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.001)
    return predicate()


# ---- non-blocking callbacks ---------------------------------------------------------------


def test_nonblocking_callbacks_run_in_stream_order_off_the_driver_thread(stream, device):
    """The driver's thread only signals; Python runs the callables in stream order."""
    counter = np.zeros(1, np.int64)
    seen = []
    device.delay(stream, 0.02)
    for i in range(300):
        nh.host_launch(stream, increment, user_data=nh.by_ref(counter))
        nh.host_launch(
            stream,
            lambda i=i: seen.append((i, threading.current_thread().name)),
            blocking=False,
        )
    stream.sync()
    nh.drain()  # runs what the helper has not yet run, here, in order
    assert [i for i, _ in seen] == list(range(300))
    assert {name for _, name in seen} <= {"MainThread", HELPER}
    assert counter[0] == 300


def test_the_stream_does_not_wait_for_a_nonblocking_callback(stream):
    """A callback still running does not hold the stream: the host function after it
    runs meanwhile.  The callback itself waits, at most 5 s, until it sees that one
    done, which it never would if the stream waited for it (blocking=True: the test
    then fails after 5 s).  The callback may run on the main thread (a pending call)
    or the helper thread: either way it waits with the GIL released."""
    counter = np.zeros(1, np.int64)
    saw, returned = [], threading.Event()

    def slow():
        saw.append(bool(_wait_for(lambda: counter[0] == 1, 5.0)))
        returned.set()

    with Hold(stream):  # both enqueued before the signal runs
        nh.host_launch(stream, slow, blocking=False)
        nh.host_launch(stream, increment, user_data=nh.by_ref(counter))
    stream.sync()
    assert returned.wait(30)
    nh.drain()
    assert saw == [True], "the stream waited for the non-blocking callback"
    assert counter[0] == 1


def test_nonblocking_callbacks_run_on_the_main_thread_while_it_runs_python(stream):
    """The main thread busy in Python runs them itself, through a pending call, while
    the helper thread would wait a whole switch interval for the GIL (made long here).
    Python 3.10 and 3.11 only look at such a pending call at a GIL switch: there the
    helper runs it, after one switch interval (docs/asyncio.md)."""
    ran = []
    prompt = sys.version_info >= (3, 12)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(5.0 if prompt else interval)
    try:
        # Held: the signal cannot run while host_launch drops the GIL around its
        # enqueue (the helper then took the free GIL and ran it: 1 run in 33 on 3.13).
        with Hold(stream):  # released by a numpy write: this thread keeps the GIL
            nh.host_launch(
                stream, lambda: ran.append(threading.current_thread().name), blocking=False
            )
        deadline = time.monotonic() + 4.0
        while not ran and time.monotonic() < deadline:
            sum(range(100))  # Python code, the GIL kept
    finally:
        sys.setswitchinterval(interval)
    if prompt:
        assert ran == ["MainThread"]
    else:
        assert len(ran) == 1


def test_nonblocking_callbacks_run_while_the_main_thread_is_blocked_in_sync(stream):
    """The main thread blocked in C (here a lock's wait, as in sync()): the helper
    thread runs the callback (the stream is let go once the main thread waits)."""
    names = []
    ran = threading.Event()

    def note():
        names.append(threading.current_thread().name)
        ran.set()

    hold = Hold(stream)
    nh.host_launch(stream, note, blocking=False)
    threading.Timer(0.2, hold.release).start()
    assert ran.wait(30)  # blocked in C with the GIL released: no pending call runs here
    stream.sync()
    assert names == [HELPER]


def test_nonblocking_callbacks_never_run_on_another_python_thread(stream, device):
    """From 3.12 the pending call that asks for the batch may run on any Python thread
    that runs Python code: a thread of the program's own, busy in Python while the main
    thread is blocked in C, takes it, and runs no batch there (docs/asyncio.md: the
    main thread, the helper thread or drain()'s caller; the call may have interrupted
    code that holds a lock a callback needs)."""
    names = []
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            sum(range(100))

    worker = threading.Thread(target=spin, name="busy-worker")
    worker.start()
    try:
        for _ in range(50):
            device.delay(stream, 0.001)  # each signal comes while the worker spins
            nh.host_launch(
                stream, lambda: names.append(threading.current_thread().name), blocking=False
            )
        stream.sync()
        deadline = time.monotonic() + 30
        while len(names) < 50 and time.monotonic() < deadline:
            time.sleep(0.01)  # blocked in C: the helper thread runs them
    finally:
        stop.set()
        worker.join()
    nh.drain()
    assert len(names) == 50 and set(names) <= {"MainThread", HELPER}, names


def test_nonblocking_callbacks_never_run_on_a_host_function_thread(device):
    """A blocking Python callable runs Python on the driver's thread; from 3.12 a
    pending call may run on any thread, but the batch never runs there."""
    busy, other = device.create_stream(), device.create_stream()
    names = []
    done = threading.Event()

    def spin():  # Python code on the host-function thread, until the callback ran
        deadline = time.monotonic() + 10
        while not done.is_set() and time.monotonic() < deadline:
            sum(range(100))

    def note():
        names.append(threading.current_thread().name)
        done.set()

    with nh.HostExecutor(threads=1) as executor:
        nh.host_launch(busy, spin)
        time.sleep(0.05)  # spin() has started
        nh.host_launch(other, note, blocking=False, executor=executor)
        other.sync()
        busy.sync()
    nh.drain()
    assert len(names) == 1 and names[0] in ("MainThread", HELPER), names
    device.close_stream(busy)
    device.close_stream(other)


def test_a_pending_call_on_an_executor_thread_leaves_no_dummy_thread_behind(device):
    """From 3.12 the notify pending call may run on any thread that runs Python: an
    executor's thread inside a blocking Python callable too.  It must not register
    that thread with ``threading`` (``current_thread()`` there makes a
    ``_DummyThread``, which stays in ``threading.enumerate()`` and ``active_count()``
    after the executor closed and the thread ended).  Before: every such thread was
    left behind, one per executor thread (on 3.10, 3.11 and 3.13 the call runs on
    the main thread only, and nothing changes)."""
    busy, signalled = device.create_stream(), device.create_stream()
    nh.host_launch(signalled, lambda: None, blocking=False)  # the helper thread exists
    signalled.sync()
    nh.drain()
    before = threading.active_count()
    executors = [nh.HostExecutor(threads=2) for _ in range(4)]
    try:
        for _ in range(200):
            for executor in executors:
                nh.host_launch(busy, lambda: sum(range(300)), executor=executor)
                nh.host_launch(signalled, lambda: None, blocking=False, executor=executor)
        busy.sync()
        signalled.sync()
    finally:
        for executor in executors:
            executor.close()
    nh.drain()
    left = [t.name for t in threading.enumerate()]
    assert threading.active_count() <= before, left  # <=: an earlier test's may end
    device.close_stream(busy)
    device.close_stream(signalled)


def test_compiled_functions_run_while_main_holds_the_gil_with_callbacks_queued(device):
    """Thousands of non-blocking callbacks queued on one stream, and the main thread
    holding the GIL: host functions of another stream still run, on time."""
    busy, quiet = device.create_stream(), device.create_stream()
    calls = []
    device.delay(busy, 0.02)
    for _ in range(3000):
        nh.host_launch(busy, lambda: calls.append(1), blocking=False)
    # A round in which the stream got there after the GIL was taken and the host
    # function ran before it was given back.  On a slow or loaded machine the device
    # delay can end first, or the host-function thread get no CPU until the hold has
    # ended: such a round is run again.  A host function that waits for the GIL never
    # runs inside the hold, in any round.
    rounds = []
    for _ in range(5):
        stamps = np.zeros(3, np.int64)
        device.delay(quiet, 0.2)
        nh.host_launch(quiet, stamp, user_data=nh.by_ref(stamps))
        start = time.monotonic_ns()
        _hold_gil(0.5)
        window_end = start + 500_000_000
        quiet.sync()
        rounds.append(int(stamps[2]) - start)
        if start < stamps[2] < window_end:
            break
    busy.sync()
    nh.drain()
    inside = [ns for ns in rounds if 0 < ns < 500_000_000]
    assert inside, (
        "no round in 5 ran the compiled host function while the main thread held the "
        f"GIL (ns after the GIL was taken, the hold 5e8: {rounds}): it waited for the GIL"
    )
    assert len(calls) == 3000
    device.close_stream(busy)
    device.close_stream(quiet)


def test_a_failing_nonblocking_callback_is_reported_and_the_rest_run(stream, unraisables):
    seen = []

    def boom():
        raise KeyError("boom")

    nh.host_launch(stream, lambda: seen.append(1), blocking=False)
    nh.host_launch(stream, boom, blocking=False)
    nh.host_launch(stream, lambda: seen.append(3), blocking=False)
    stream.sync()
    nh.drain()
    assert seen == [1, 3]
    assert len(unraisables) == 1
    assert isinstance(unraisables[0].exc_value, KeyError) and unraisables[0].object is boom


INTERRUPT_SCRIPT = CHILD_PREAMBLE + textwrap.dedent("""
    import time

    def interrupt():
        raise KeyboardInterrupt

    try:  # Ctrl-C may come at any bytecode: inside host_launch too, once enqueued
        nh.host_launch(stream, interrupt, blocking=False)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            time.sleep(0.001)
        print("NOT DELIVERED")
    except KeyboardInterrupt:
        print("DELIVERED")
""")


def test_a_keyboard_interrupt_in_a_callback_reaches_the_main_thread():
    """Ctrl-C inside a non-blocking callback (run from a pending call, or on the helper
    thread) is not swallowed as an unraisable error: the main thread gets it again."""
    out = run_child(INTERRUPT_SCRIPT)
    assert "DELIVERED" in out and "NOT DELIVERED" not in out, out


NOT_PYTHONS_SIGINT_SCRIPT = CHILD_PREAMBLE + textwrap.dedent("""
    import signal, sys, time

    # As under nohup or in a background job (SIG_IGN), or in a CLI tool (SIG_DFL):
    # Python's SIGINT handler is not installed, and PyErr_SetInterrupt does nothing.
    signal.signal(signal.SIGINT, getattr(signal, sys.argv[1]))
    reported = []
    sys.unraisablehook = lambda u: reported.append((u.exc_type.__name__, u.object is interrupt))

    def interrupt():
        raise KeyboardInterrupt

    delivered = False
    try:
        nh.host_launch(stream, interrupt, blocking=False)
        stream.sync()
        deadline = time.monotonic() + 10
        while not reported and time.monotonic() < deadline:
            nh.drain()
            time.sleep(0.001)
    except KeyboardInterrupt:
        delivered = True
    print("delivered", delivered, "reported", reported)
""")


@pytest.mark.parametrize("handler", ["SIG_IGN", "SIG_DFL"])
def test_a_keyboard_interrupt_in_a_callback_is_reported_when_sigint_is_not_pythons(handler):
    """With SIGINT ignored (nohup, a background job) or at its default (a CLI tool),
    a callback's KeyboardInterrupt cannot be delivered again: it goes to
    sys.unraisablehook with the callable, never vanishes (main re-delivered it with
    PyErr_SetInterrupt, which does nothing then: neither delivered nor reported)."""
    out = run_child(NOT_PYTHONS_SIGINT_SCRIPT.replace("sys.argv[1]", repr(handler)))
    assert out.split("\n")[-2] == "delivered False reported [('KeyboardInterrupt', True)]", out


AFTER_ENQUEUE_SCRIPT = CHILD_PREAMBLE + textwrap.dedent("""
    import sys
    import threading
    import time

    errors = []
    sys.unraisablehook = lambda u: errors.append(f"{u.exc_type.__name__}: {u.exc_value}")
    threading.excepthook = lambda a: errors.append(f"{a.exc_type.__name__}: {a.exc_value}")
    from numba_hostfn import _notify

    real = _notify._Channel.launch

    def interrupted(self, *args):
        real(self, *args)  # registered and enqueued: the signal is the stream's now
        raise KeyboardInterrupt  # as a Ctrl-C would at the next bytecode

    ran = []
    interrupts = 0
    for i in range(200):
        _notify._Channel.launch = interrupted
        try:
            if i % 2:
                nh.host_launch(stream, lambda: ran.append(1), blocking=False)
            else:
                nh.done_future(stream)
        except KeyboardInterrupt:
            interrupts += 1
        finally:
            _notify._Channel.launch = real
    last = nh.done_future(stream)
    nh.host_launch(stream, lambda: ran.append("last"), blocking=False)
    stream.sync()
    deadline = time.monotonic() + 10
    while "last" not in ran and time.monotonic() < deadline:
        nh.drain()
        time.sleep(0.01)
    last.result(timeout=10)
    print("interrupts", interrupts, "last ran", "last" in ran, "ran", len(ran),
          "pending", nh.pending(), "errors", errors)
""")


def test_a_dispatcher_owns_its_channels_descriptor(stream):
    """A Dispatcher makes its channel's eventfd (non-blocking where asked), reads its
    signals, and closes it once it is gone and no signal is left to write it."""
    import fcntl

    channel = _notify._Channel(wake_main=False, nonblocking=True)
    fd = channel.fd
    assert os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[eventfd]"
    assert fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_NONBLOCK
    blocking = _notify._Channel(wake_main=False, nonblocking=False)
    assert not fcntl.fcntl(blocking.fd, fcntl.F_GETFL) & os.O_NONBLOCK
    del blocking
    ran = []
    channel.launch(stream, None, "no graphs", lambda: ran.append(True), default_lane=False)
    stream.sync()
    os.read(fd, 8)
    assert channel.dispatcher.run(True) == 1
    assert ran == [True]
    del channel
    gc.collect()
    with pytest.raises(OSError):  # closed (no other eventfd is made meanwhile)
        os.readlink(f"/proc/self/fd/{fd}")


class _Stop(Exception):
    pass


def _stop(signum, frame):
    raise _Stop


def test_a_batch_a_handlers_exception_stopped_wakes_its_reader_again(stream):
    """Invariant 21: a signal handler's exception between two entries stops the batch
    with the rest due, and the batch writes its channel's descriptor again, so that
    the reader runs them then, not at an unrelated signal or a ``drain()``.

    The first entry raises SIGUSR1 natively (libc's ``raise`` through ctypes: no
    bytecode, so its handler runs at the batch's own check after it).  The wake-up
    of the signals is read first, so the descriptor is readable after the batch only
    if the batch wrote it."""
    import select
    import signal

    channel = _notify._Channel(wake_main=False, nonblocking=True)
    raise_ = ctypes.CDLL(None)["raise"]
    raise_.argtypes, raise_.restype = [ctypes.c_int], ctypes.c_int
    ran = []
    previous = signal.signal(signal.SIGUSR1, _stop)
    try:
        with Hold(stream):  # all four signals come in one wake-up
            for entry in [functools.partial(raise_, signal.SIGUSR1)] + [
                functools.partial(ran.append, i) for i in range(3)
            ]:
                channel.launch(stream, None, "no graphs", entry, default_lane=False)
        stream.sync()
        os.read(channel.fd, 8)  # the signals' wake-up, taken as a reader takes it
        with pytest.raises(_Stop):
            channel.dispatcher.run(True)
        assert ran == []  # stopped after the first entry: three are due
        assert select.select([channel.fd], [], [], 0)[0] == [channel.fd], "no wake-up"
        os.read(channel.fd, 8)
        assert channel.dispatcher.run(True) == 3
        assert ran == [0, 1, 2]
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_a_dispatcher_never_made_refuses_instead_of_crashing():
    """``Dispatcher.__new__`` without ``__init__`` has no channel and no table: each
    method raises RuntimeError.  Before: run() and launch() read through NULL (a
    segmentation fault), outstanding() a SystemError."""
    code = textwrap.dedent("""
        from numba_hostfn import _core

        blank = _core.Dispatcher.__new__(_core.Dispatcher)
        calls = [
            lambda: blank.run(),
            lambda: blank.run(False, True),
            lambda: blank.launch(_core.ROUTE_SIM, 1, None, None),
            lambda: blank.outstanding(),
        ]
        for call in calls:
            try:
                call()
            except RuntimeError as error:
                assert "never made" in str(error), error
            else:
                raise AssertionError("accepted")
        print("refused", blank.due(), blank.faulted(), blank.running_here())
    """)
    out = run_child(code)
    assert "refused 0 0 False" in out, out


def test_an_exception_just_after_a_signal_is_enqueued_frees_nothing_twice():
    """A Ctrl-C (or an exception a pending call raises) that reaches host_launch(
    blocking=False) or done_future after its signal was enqueued: the signal stays
    the stream's (made and, if refused, freed natively, never from the exception
    path: freeing it there crashed the process), the launch runs although its call
    raised (registered with its enqueue in one native step), and later launches run.
    Each time, 200 times."""
    out = run_child(AFTER_ENQUEUE_SCRIPT)
    assert out.split() == [
        "interrupts",
        "200",
        "last",
        "ran",
        "True",
        "ran",
        "101",  # the 100 interrupted non-blocking callbacks, and the last
        "pending",
        "0",
        "errors",
        "[]",
    ], out


INTERRUPTED_BATCH_SCRIPT = CHILD_PREAMBLE + textwrap.dedent("""
    import sys
    import time

    from _device import Hold
    from numba_hostfn import _notify

    ran, ran_before_interrupt = [], []
    counter = np.zeros(1, np.int64)

    def ctrl_c():
        raise KeyboardInterrupt

    hold = Hold(stream)
    nh.host_launch(stream, ctrl_c, blocking=False)
    for i in range(5):
        nh.host_launch(stream, lambda i=i: ran.append(i), blocking=False)
    nh.host_launch(stream, increment, user_data=nh.by_ref(counter))  # all six have signalled
    # The main thread, not the helper, runs the batch: it keeps the GIL (a switch is
    # only forced after 5 s) until it has run the batch, which the KeyboardInterrupt
    # stops after ctrl_c.
    sys.setswitchinterval(5.0)
    interrupted = 0
    released = False
    deadline = time.monotonic() + 10

    def wait_for_the_rest():
        # The KeyboardInterrupt (ctrl_c's, delivered again by the batch or the pending
        # call it stopped) reaches the main thread at its next check: a call, a loop's
        # backward jump, a function's entry.  Every such point until all is over is in
        # here, and this is called inside the try that counts it.
        global released
        if not released:
            released = True
            hold.release()
            while counter[0] == 0 and time.monotonic() < deadline:
                pass  # the GIL kept (on 3.13 the pending call runs the batch here)
        while time.monotonic() < deadline:
            nh.drain()
            if len(ran) == 5 and interrupted:
                time.sleep(0.5)  # a second interrupt, if one came, would be counted
                nh.drain()
                return
            time.sleep(0.01)

    finished = False
    while not finished:
        try:
            wait_for_the_rest()
            finished = True
        except KeyboardInterrupt:
            interrupted += 1
            ran_before_interrupt.append(len(ran))
    sys.setswitchinterval(0.005)
    print("ran", ran, "interrupted", interrupted, "ran before it", ran_before_interrupt,
          "waiting", _notify._callbacks.outstanding(), "pending", nh.pending())
""")


def test_a_ctrl_c_in_the_middle_of_a_batch_loses_none_of_the_rest():
    """A callback's Ctrl-C stops its batch: the callbacks after it, whose keys the
    batch had already taken from the channel, still run (they were dropped, and kept in
    the table of waiting callbacks for ever), at the next drain or from the pending
    call that the main thread may run while the KeyboardInterrupt propagates, and the
    interrupt is delivered exactly once."""
    out = run_child(INTERRUPTED_BATCH_SCRIPT)
    ran_before = out.split()[11]
    assert ran_before in ("[0]", "[5]"), out  # stopped, or the rest run by the pending call
    assert out.split() == [
        "ran",
        "[0,",
        "1,",
        "2,",
        "3,",
        "4]",
        "interrupted",
        "1",
        "ran",
        "before",
        "it",
        ran_before,
        "waiting",
        "0",
        "pending",
        "0",
    ], out


BOTH_BATCHES_DRAIN_SCRIPT = CHILD_PREAMBLE + textwrap.dedent("""
    import threading
    import time

    in_future, in_callback = threading.Event(), threading.Event()
    drained = []  # printed by the main thread: two threads' prints interleave

    def on_done(future):  # on the futures' thread, inside their batch
        in_future.set()
        in_callback.wait(5)
        nh.drain()
        drained.append("done-callback drained")

    def callback():  # a non-blocking callback, inside the callbacks' batch
        in_callback.set()
        in_future.wait(5)
        nh.drain()
        drained.append("callback drained")

    nh.done_future(stream).add_done_callback(on_done)
    nh.host_launch(stream, callback, blocking=False)
    stream.sync()
    deadline = time.monotonic() + 10
    while not (in_future.is_set() and in_callback.is_set()) and time.monotonic() < deadline:
        nh.drain()
        time.sleep(0.01)
    time.sleep(0.5)
    nh.drain()
    drained.append("main drained")
    print(" | ".join(drained))
""")


BATCH_FAILS_SCRIPT = CHILD_PREAMBLE + textwrap.dedent("""
    import concurrent.futures as cf
    import threading
    from numba_hostfn import _core, _notify

    reported = []
    threading.excepthook = lambda a: reported.append((a.thread.name, a.exc_type.__name__))
    assert nh.done_future(stream).result(timeout=60) is stream  # the futures thread runs
    for name, made in (("futures", lambda: _notify._futures),
                       ("callbacks", _notify._the_callbacks)):
        batches = made()
        real = batches._batch

        class FailsOnce:  # a batch that raises on the helper thread once, as its
            failed = False  # native run does when its due ring cannot grow

            def run(self, *args):
                if not FailsOnce.failed and threading.current_thread() is batches._helper:
                    FailsOnce.failed = True
                    raise MemoryError
                return real.run(*args)

            def __getattr__(self, attribute):
                return getattr(real, attribute)

        batches._batch = FailsOnce()
        if name == "futures":  # wait() watches no lane: the futures thread sets them
            first, second = nh.done_future(stream), nh.done_future(stream)
            done = cf.wait([first, second], timeout=20).done
            print(name, FailsOnce.failed, len(done), batches._helper.is_alive(), flush=True)
        else:
            _core.set_notify_callable(lambda: None)  # no batch on the main thread: the helper's
            ran = threading.Event()
            nh.host_launch(stream, ran.set, blocking=False)
            print(name, ran.wait(20) and FailsOnce.failed, batches._helper.is_alive(), flush=True)
        batches._batch = real
    print("reported", reported, flush=True)
""")


def test_the_helper_threads_outlive_a_batch_that_raises():
    """numba_hostfn's futures thread and callbacks thread go on after a batch raised
    there (a MemoryError in the native run: a key or its due ring that could not be
    made): the error is reported, and the futures and callbacks due, and every later
    one, are still set and run.  (Before: the thread ended, and every later
    done_future whose waiter did not watch a lane, and every non-blocking callback
    while the main thread ran no Python, waited for a drain() for ever.)"""
    lines = run_child(BATCH_FAILS_SCRIPT, quiet=False).splitlines()
    assert "futures True 2 True" in lines, lines
    assert "callbacks True True" in lines, lines
    reported = [line for line in lines if line.startswith("reported")]
    assert reported == [
        "reported [('numba_hostfn-futures', 'MemoryError'), "
        "('numba_hostfn-callbacks', 'MemoryError')]"
    ], lines


HANDLER_INSIDE_DRAIN_SCRIPT = CHILD_PREAMBLE + textwrap.dedent("""
    import signal, threading
    from _device import Hold
    from numba_hostfn import _executor, _notify

    # On the driver's thread (as on a CUDA default stream, or past the default lane's
    # depth): no lane to watch, only a batch of the futures can set the result.
    _executor._default_off = True
    seen = []

    def handler(signum, frame):  # waits on a stream, as invariant 11 lets it
        try:
            seen.append(nh.done_future(stream).result(timeout=10) is stream)
        except Exception as e:
            seen.append(type(e).__name__)

    signal.signal(signal.SIGUSR1, handler)
    assert nh.done_future(stream).result(timeout=60) is stream  # the futures thread runs
    batches = _notify._futures
    real, go = batches._batch, threading.Event()

    class HelperLate:  # drain() below runs the batch first, as it may
        def run(self, *args):
            if threading.current_thread() is batches._helper:
                go.wait(60)
            return real.run(*args)

        def __getattr__(self, attribute):
            return getattr(real, attribute)

    batches._batch = HelperLate()
    with Hold(stream):
        future = nh.done_future(stream)
        future.add_done_callback(lambda _: signal.raise_signal(signal.SIGUSR1))
    stream.sync()
    nh.drain()  # sets the future here: its done callback's signal handler runs inside
    go.set()
    batches._batch = real
    print("handler", seen, future.done(), flush=True)
""")


def test_a_signal_handler_waiting_on_a_stream_inside_drain_does_not_deadlock():
    """drain() sets the done_future results due on the calling thread, holding the
    futures' batch; a signal handler (or finalizer) run there that waits on a stream
    (invariant 11) has its future set there too.  (Before: only that batch could set
    it, and the thread holding it waited for it: for ever, or until its timeout.)"""
    lines = run_child(HANDLER_INSIDE_DRAIN_SCRIPT, timeout=120).splitlines()
    assert "handler [True] True" in lines, lines


def test_a_callback_and_a_done_callback_that_both_drain_do_not_deadlock():
    """Each batch holds its own lock while its callback drains; a drain from inside a
    batch does not wait for the other batch's lock (they waited for each other)."""
    out = run_child(BOTH_BATCHES_DRAIN_SCRIPT, timeout=60)
    assert sorted(out.strip().split(" | ")) == [
        "callback drained",
        "done-callback drained",
        "main drained",
    ], out


FIRST_FUTURE_FROM_A_PENDING_CALL_SCRIPT = CHILD_PREAMBLE + textwrap.dedent("""
    import sys
    import time
    from _device import Hold
    from numba_hostfn import _core, _notify

    other = device.create_stream()
    nh.host_launch(other, lambda: None, blocking=False)  # the callbacks' batch exists
    other.sync()
    nh.drain()
    _notify._stream_future_type()  # imported before the window: nothing below drops the GIL
    in_window = []  # pending calls run on this thread while it held _callbacks_lock

    def counted():
        if _notify._callbacks_lock._is_owned():
            in_window.append(1)
        _notify._pending_call()

    _core.set_notify_callable(counted)
    made = []
    flag = np.zeros(1, np.int64)
    hold = Hold(stream)
    # Launching from a non-blocking callback is allowed (docs/asyncio.md); this one
    # makes a done_future, while the main thread makes the process's first.
    nh.host_launch(stream, lambda: made.append(nh.done_future(other)), blocking=False)
    nh.host_launch(stream, increment, user_data=nh.by_ref(flag))
    code = _notify._make_futures.__code__
    fired = []

    def local(frame, event, arg):
        # Inside _make_futures(), _callbacks_lock held: the callback's signal runs now,
        # and its pending call lands in the loops below, on this thread, lock held.
        # The helper thread, woken too, cannot take the GIL (and the callback) first.
        if event == "line" and not fired and _notify._callbacks_lock._is_owned():
            fired.append(1)
            sys.setswitchinterval(60)
            hold.release()
            deadline = time.monotonic() + 20
            while flag[0] == 0 and time.monotonic() < deadline:
                pass
            for _ in range(200_000):
                pass
            sys.setswitchinterval(0.005)
        return local

    def tracer(frame, event, arg):
        return local if frame.f_code is code else None

    sys.settrace(tracer)
    try:
        f = nh.done_future(other)
    finally:
        sys.settrace(None)
        sys.setswitchinterval(0.005)
    print("window", len(fired), len(in_window) > 0, flush=True)
    deadline = time.monotonic() + 10  # the callback runs after the window, on any thread
    while not made and time.monotonic() < deadline:
        time.sleep(0.01)
    print("results", f.result(timeout=10) is other, made[0].result(timeout=10) is other)
""")


def test_a_callback_making_the_first_done_future_in_a_pending_call_does_not_deadlock():
    """The pending call that runs due callbacks on the main thread may interrupt that
    thread while it makes the process's futures, holding _callbacks_lock; a callback
    that made the first done_future then waited there for that lock, on the thread
    that held it, for ever (and the helper thread behind it)."""
    out = run_child(FIRST_FUTURE_FROM_A_PENDING_CALL_SCRIPT, timeout=60)
    assert "window 1 True" in out and "results True True" in out, out


def test_nonblocking_callbacks_own_their_callable_until_run(stream):
    import weakref

    class Callback:
        def __call__(self):
            pass

    callback = Callback()
    alive = weakref.ref(callback)
    with Hold(stream):
        nh.host_launch(stream, callback, blocking=False)
        del callback
        gc.collect()
        assert alive() is not None
    stream.sync()
    nh.drain()
    gc.collect()
    assert alive() is None
    assert nh.pending() == 0


def test_a_callback_may_launch_and_drain(stream):
    """Re-entrant: a non-blocking callback that launches another and drains."""
    seen = []

    def first():
        seen.append("first")
        nh.host_launch(stream, lambda: seen.append("second"), blocking=False)
        nh.drain()

    nh.host_launch(stream, first, blocking=False)
    stream.sync()
    assert _wait_for(lambda: (nh.drain(), len(seen) == 2)[1])
    assert seen == ["first", "second"]


# ---- done_future --------------------------------------------------------------------------


def test_done_future_resolves_with_the_stream(stream, device):
    device.delay(stream, 0.05)
    future = nh.done_future(stream)
    assert future.result(timeout=30) is stream


def test_done_futures_with_wait_and_as_completed(device):
    """Results are set on numba_hostfn's futures thread, never from a pending call in
    the middle of wait()/as_completed() (which hold the futures' locks): none is lost."""
    import concurrent.futures as cf

    streams = [device.create_stream() for _ in range(4)]
    for _ in range(5):
        futures = [nh.done_future(s) for s in streams for _ in range(50)]
        done, not_done = cf.wait(futures, timeout=60)
        assert not not_done
        futures = [nh.done_future(s) for s in streams for _ in range(50)]
        assert len(list(cf.as_completed(futures, timeout=60))) == 200
    for s in streams:
        device.close_stream(s)


def test_done_future_cancelled_drops_interest_only(stream):
    counter = np.zeros(1, np.int64)
    with Hold(stream):
        future = nh.done_future(stream)
        nh.host_launch(stream, increment, user_data=nh.by_ref(counter))
        assert future.cancel()
    stream.sync()
    nh.drain()
    assert future.cancelled() and counter[0] == 1
    assert _wait_for(lambda: _notify._futures.outstanding() == 0)


def test_done_future_result_watches_its_stream_itself(stream):
    """A thread blocked in result() sees its stream get there itself (the lane's word)
    and settles the future there: with numba_hostfn's futures thread held inside
    another future's done callback, the wait still returns, its done callback run on
    the waiting thread (LIFETIME.md, invariant 25).  Before, it waited for that
    thread, here for ever."""
    import concurrent.futures as cf

    release = threading.Event()
    with Hold(stream):  # not done yet: its callback runs where it is settled
        first = nh.done_future(stream)
        first.add_done_callback(lambda _: release.wait(30))
    # Nobody waits in first.result(), and wait() settles nothing itself: the futures
    # thread settles first, and stays in its callback.
    try:
        assert not cf.wait([first], timeout=30).not_done  # the futures thread is held now
        for _ in range(3):
            with Hold(stream) as hold:
                second = nh.done_future(stream)
                ran_on: list[threading.Thread] = []
                second.add_done_callback(
                    lambda _, ran_on=ran_on: ran_on.append(threading.current_thread())
                )
                threading.Timer(0.05, hold.release).start()
                assert second.result(timeout=30) is stream
            assert ran_on == [threading.current_thread()]
            assert second.exception(timeout=0) is None
    finally:
        release.set()
    stream.sync()
    nh.drain()
    assert _wait_for(lambda: _notify._futures.outstanding() == 0)


def test_wait_and_as_completed_in_a_done_callback_set_the_results_due_there(stream, device):
    """A done callback runs on the thread that holds the futures' batch, which alone
    sets the results of futures on the driver's thread, or whose waiters do not watch
    a lane: concurrent.futures.wait() and as_completed() there set the results due,
    nested in that batch, as result() does.  Before, they waited for their own thread
    (until their timeout, or for ever)."""
    import concurrent.futures as cf

    other = device.create_stream()
    seen = []
    finished = threading.Event()

    def wait_for_others(_):
        try:
            waited = cf.wait([nh.done_future(other)], timeout=10)
            completed = list(cf.as_completed([nh.done_future(other)], timeout=10))
            seen.append((threading.current_thread().name, len(waited.done), len(completed)))
        except BaseException as exc:
            seen.append(exc)
        finally:
            finished.set()

    try:
        with Hold(stream):  # not done yet: the futures thread runs its callback
            nh.done_future(stream).add_done_callback(wait_for_others)
        assert finished.wait(60)
        assert seen == [("numba_hostfn-futures", 1, 1)], seen
    finally:
        other.sync()
        device.close_stream(other)
        nh.drain()


def test_done_future_is_settled_once_by_whichever_thread_sees_it_first(device, unraisables):
    """Waiting threads and the futures thread race to settle each future: every
    future gets its stream once, and no settle fails (a second set_result, or
    set_running_or_notify_cancel on a finished future, would be reported)."""
    import concurrent.futures as cf

    streams = [device.create_stream() for _ in range(4)]
    try:
        futures = [nh.done_future(s) for _ in range(100) for s in streams]
        with cf.ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda f: f.result(timeout=60), futures))
        assert results == [f._stream for f in futures]
        assert all(f.done() and f.exception(timeout=0) is None for f in futures)
        assert _wait_for(lambda: _notify._futures.outstanding() == 0)
        assert unraisables == []
    finally:
        for s in streams:
            s.sync()
            device.close_stream(s)
        nh.drain()


def test_a_second_settle_of_a_done_future_changes_nothing(stream):
    """Invariant 25: once settled, a later settle (a fault's, or the stream's) neither
    replaces the result nor runs the done callbacks again."""
    calls = []
    future = nh.done_future(stream)
    future.add_done_callback(calls.append)
    assert future.result(timeout=30) is future._stream
    future._settle(RuntimeError("a late fault"))
    future._settle()
    assert calls == [future]
    assert future.exception(timeout=0) is None and future.result(timeout=0) is future._stream


def test_done_future_result_times_out_and_cancels_while_it_watches(stream):
    """The watch honours result(timeout) and exception(timeout), and a cancel
    from another thread ends it (the future is looked at between watches)."""
    import concurrent.futures as cf

    with Hold(stream):
        future = nh.done_future(stream)
        # Held until the end of this block: a watch that ignored its timeout would
        # never return here.
        with pytest.raises(cf.TimeoutError):
            future.result(timeout=0.05)
        with pytest.raises(cf.TimeoutError):
            future.exception(timeout=0)
        threading.Timer(0.05, future.cancel).start()
        with pytest.raises(cf.CancelledError):
            future.result(timeout=30)
    stream.sync()
    nh.drain()
    assert _wait_for(lambda: _notify._futures.outstanding() == 0)


def test_done_future_result_gives_the_thread_its_timer_slack_back(stream):
    """A watch that sleeps between looks lowers the thread's timer slack to 1 µs (it
    sleeps the lane's poll interval, not 50 µs longer) and gives the thread its own
    back as it returns, whether the stream got there or the timeout passed."""
    import concurrent.futures as cf

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.restype = ctypes.c_int
    libc.prctl.argtypes = (ctypes.c_int,) + (ctypes.c_ulong,) * 4
    get_slack, set_slack = 30, 29  # PR_GET_TIMERSLACK, PR_SET_TIMERSLACK
    before = libc.prctl(get_slack, 0, 0, 0, 0)
    assert libc.prctl(set_slack, 77_000, 0, 0, 0) == 0
    try:
        with Hold(stream) as hold:
            future = nh.done_future(stream)
            with pytest.raises(cf.TimeoutError):
                future.result(timeout=0.05)  # past the spin: it slept
            assert libc.prctl(get_slack, 0, 0, 0, 0) == 77_000
            threading.Timer(0.05, hold.release).start()
            assert future.result(timeout=30) is stream
        assert libc.prctl(get_slack, 0, 0, 0, 0) == 77_000
    finally:
        libc.prctl(set_slack, before, 0, 0, 0)
    stream.sync()
    nh.drain()
    assert _wait_for(lambda: _notify._futures.outstanding() == 0)


# ---- async_done ---------------------------------------------------------------------------


def test_async_done_suspends_the_coroutine_not_the_loop(stream, device):
    ticks = []

    async def ticker(stop):
        while not stop.is_set():
            ticks.append(1)
            await asyncio.sleep(0.001)

    async def main():
        stop = asyncio.Event()
        tick = asyncio.ensure_future(ticker(stop))
        device.delay(stream, 1.0)  # > 10 turns of 1 ms even on a slow machine
        result = await nh.async_done(stream)
        stop.set()
        await tick
        return result

    assert asyncio.run(main()) is stream
    assert len(ticks) > 10, "the loop was blocked while the stream worked"


def test_async_done_resolves_in_the_middle_of_a_loop_turn(stream):
    """A pending call on the loop's thread resolves the wait while a coroutine is
    still running, without the loop polling its descriptor (a turn of a busy loop
    is long).  3.12 runs that pending call between two bytecodes; 3.10 and 3.11
    only when the thread next takes the GIL, here after a sleep."""
    prompt = sys.version_info >= (3, 12)

    async def main():
        future = nh.async_done(stream)
        deadline = time.monotonic() + 10.0
        while not future.done() and time.monotonic() < deadline:
            if prompt:
                sum(range(100))  # Python code, the GIL kept, no await
            else:
                time.sleep(1e-4)  # the GIL dropped and taken, no await
        resolved = future.done()
        await future
        return resolved

    assert asyncio.run(main()), "the wait resolved only when the loop polled its descriptor"


def test_a_loops_waits_resolve_on_its_own_thread_only(device):
    """Invariant 19: a loop on a worker thread, busy (blocked, not running its reader),
    keeps its wait pending while the main thread's pending call resolves its own
    loop's: read from the main thread while the worker is still blocked (from 3.12 a
    pending call may run on any thread, the worker's too once it runs Python again)."""
    a, b = device.create_stream(), device.create_stream()
    waiting, blocked, release = [], threading.Event(), threading.Event()

    def worker() -> None:
        async def main() -> None:
            device.delay(a, 0.1)
            waiting.append(nh.async_done(a))
            blocked.set()
            release.wait(60)  # the loop is busy: its reader cannot run
            await waiting[0]

        asyncio.run(main())

    thread = threading.Thread(target=worker)
    thread.start()
    try:
        assert blocked.wait(30)

        async def main_loop() -> None:
            device.delay(b, 0.4)
            await nh.async_done(b)  # its signal's pending call runs on the main thread

        asyncio.run(main_loop())
        for _ in range(20):  # pending calls run here, between the sleeps
            time.sleep(0.01)
        done_while_blocked = waiting[0].done()
    finally:
        release.set()
        thread.join(30)
        for s in (a, b):
            s.sync()
            device.close_stream(s)
        nh.drain()
    assert done_while_blocked is False
    assert waiting[0].done() and not thread.is_alive()


def test_a_burst_of_waits_resolves_in_order(stream):
    """Thousands of waits released at once: the pending call and the loop's reader both
    resolve them (one nested in the other), and still in the order they were made."""
    n = 20_000

    async def main():
        await nh.async_done(stream)  # the loop's channel exists
        for _ in range(2):
            order = []
            hold = Hold(stream)
            futures = [nh.async_done(stream) for _ in range(n)]
            for i, future in enumerate(futures):
                future.add_done_callback(lambda _, i=i, order=order: order.append(i))
            hold.release()
            await asyncio.gather(*futures)
            await asyncio.sleep(0)  # the last done callbacks
            assert order == list(range(n))

    asyncio.run(main())
    for _ in range(1000):  # the default lane's thread retires its last tasks just after
        nh.drain()
        if nh.pending() == 0:
            break
        time.sleep(0.005)
    assert nh.pending() == 0


def test_the_default_lane_never_serves_a_default_stream_handle(stream):
    """CUDA's default-stream handles (0, 0x1, 0x2) name another stream in each context
    (0x2 in each thread too): a lane keyed by the handle would share its words among
    them, and a wait could resolve when another stream got there.  Their waits take the
    driver's thread; a created stream's take the lane (before: any handle did)."""
    from numba_hostfn import _executor

    handle = int(stream.handle)
    assert _executor.default_lane_of(handle) is not None
    for special in (0, 1, 2):
        assert _executor.default_lane_of(special) is None


def test_async_done_resolves_waits_in_the_order_streams_get_there(device):
    """Three streams, done after 1.2, 0.4 and 0.8 s of device work (they run side by
    side): the waits resolve in the order the streams get there.  The gaps are wide:
    a loop or lane stalled past one (a sanitizer build on 2 cores) sees two streams
    done in one pass, and resolves them in its own order."""
    streams = [device.create_stream() for _ in range(3)]
    order = []

    async def wait(k, s):
        await nh.async_done(s)
        order.append(k)

    async def main():
        for s, seconds in zip(streams, (1.2, 0.4, 0.8), strict=True):
            device.delay(s, seconds)
        await asyncio.gather(*(wait(k, s) for k, s in enumerate(streams)))

    asyncio.run(main())
    assert order == [1, 2, 0]
    for s in streams:
        device.close_stream(s)


def test_many_waits_use_one_descriptor_and_no_thread(stream, device):
    n = 2000 if device.simulator else 10_000
    with_threads = threading.active_count()

    async def main():
        await nh.async_done(stream)  # the loop's channel exists from here
        fds = _open_fds()
        with Hold(stream):
            futures = [nh.async_done(stream) for _ in range(n)]
            assert _open_fds() == fds and threading.active_count() <= with_threads
        results = await asyncio.gather(*futures)
        return fds, results

    fds, results = asyncio.run(main())
    assert len(results) == n and all(r is stream for r in results)


def test_async_done_cancelled_drops_interest_only(stream):
    counter = np.zeros(1, np.int64)

    async def main():
        with Hold(stream):
            future = nh.async_done(stream)
            nh.host_launch(stream, increment, user_data=nh.by_ref(counter))
            future.cancel()
        await nh.async_done(stream)  # the loop goes on past the cancelled one
        return future

    future = asyncio.run(main())
    assert future.cancelled() and counter[0] == 1


def test_a_loop_closed_with_waits_outstanding_leaks_nothing(stream):
    """The loop goes first: its descriptor stays open while a signal may still write
    it, and is closed by the last one; pending() goes back to 0."""
    loop = asyncio.new_event_loop()
    with Hold(stream):

        async def start():
            return [nh.async_done(stream) for _ in range(5)]

        futures = loop.run_until_complete(start())
        fd = _notify._loops[loop]().channel.fd
        loop.close()
        del loop, futures
        gc.collect()
        os.fstat(fd)  # still open: five signals will write it
    stream.sync()  # the last signal has closed it
    with pytest.raises(OSError):
        os.fstat(fd)
    nh.drain()
    assert nh.pending() == 0


def test_async_done_needs_a_running_loop(stream):
    with pytest.raises(RuntimeError, match="done_future"):
        nh.async_done(stream)


# ---- refusals: graphs, captures, bad input ------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda s: nh.host_launch(s, lambda: None, blocking=False),
        lambda s: nh.done_future(s),
        lambda s: asyncio.run(_async_done_in_loop(s)),
    ],
    ids=["nonblocking", "done_future", "async_done"],
)
def test_signals_are_refused_under_capture_and_leave_it_valid(stream, device, call):
    before = nh.pending()
    fds = _open_fds()
    capture = Capture(stream, "relaxed")
    with pytest.raises(RuntimeError, match="capturing stream"):
        call(stream)
    counter = np.zeros(1, np.int64)
    nh.host_launch(stream, increment, user_data=nh.by_ref(counter))  # the capture goes on
    capture.end()
    capture.launch()
    stream.sync()
    capture.close()
    assert counter[0] == 1

    def settled():  # CUDA releases what a graph owned asynchronously
        device.synchronize()
        nh.drain()
        return nh.pending() == before

    assert _wait_for(settled)
    if _notify._callbacks is not None:
        assert _notify._callbacks.outstanding() == 0
    assert _open_fds() <= fds + 1  # at most a loop's own channel, not yet collected


async def _async_done_in_loop(stream):
    return nh.async_done(stream)


def test_signals_are_refused_on_an_explicit_graph(stream):
    """host_launch(blocking=False), done_future and async_done on an explicit graph's
    node raise, enqueuing nothing.  host_launch(blocking=False) reads its target first
    (check_target: an explicit graph's handle is 0) and hands the handle on; the
    signal's own check of the target was skipped where a handle was given, so the
    signal went to stream 0 (the simulator's launch crashed on it)."""
    # What tells an explicit graph is its class's name and module (_is_graph_node):
    # a stand-in needs no GPU.
    node = type("GraphNode", (), {"__module__": "cuda.core.graph"})()
    ran, held = [], nh.pending()
    with pytest.raises(RuntimeError, match="CUDA graph"):
        nh.host_launch(node, lambda: ran.append(True), blocking=False)
    with pytest.raises(RuntimeError, match="CUDA graph"):
        nh.done_future(node)
    with pytest.raises(RuntimeError, match="CUDA graph"):
        asyncio.run(_async_done_in_loop(node))
    stream.sync()
    nh.drain()
    assert ran == [] and nh.pending() == held


def test_signals_are_refused_on_a_graph_builder(stream):
    builder = stream.create_graph_builder().begin_building()
    try:
        with pytest.raises(RuntimeError, match="CUDA graph"):
            nh.host_launch(builder, lambda: None, blocking=False)
        with pytest.raises(RuntimeError, match="CUDA graph"):
            nh.done_future(builder)
    finally:
        builder.end_building().close()


@nh.host_callback
def _noop(p):
    pass


class _CountingStream:
    """A stream-like object whose ``__cuda_stream__`` counts its calls and gives
    ``streams[0]``'s handle the first time, ``streams[-1]``'s every later time (a
    protocol with side effects, or one that names another stream when asked again)."""

    def __init__(self, *streams):
        self.streams, self.calls = streams, 0

    def __cuda_stream__(self):
        self.calls += 1
        return self.streams[min(self.calls, len(self.streams)) - 1].__cuda_stream__()


def test_a_nonblocking_launch_asks_the_streams_protocol_once(stream, device):
    """host_launch(stream, fn, blocking=False) calls ``__cuda_stream__`` exactly once,
    as every other launch and wait does, and the callback goes on the stream that one
    answer named.  Before, it asked twice (the argument check, then the signal's
    route), and launched on the second answer's stream: here ``other``, which is
    capturing, so the launch was refused though the stream checked was not."""
    other = device.create_stream()
    try:
        with nh.HostExecutor(threads=1) as executor:
            calls = {
                "blocking": lambda s: nh.host_launch(s, lambda: None),
                "nonblocking": lambda s: nh.host_launch(s, lambda: None, blocking=False),
                "nonblocking, executor": lambda s: nh.host_launch(
                    s, lambda: None, blocking=False, executor=executor
                ),
                "executor": lambda s: nh.host_launch(s, lambda: None, executor=executor),
                "done_future": nh.done_future,
                "done_future, executor": lambda s: nh.done_future(s, executor=executor),
                "release_after": lambda s: nh.release_after(s, np.zeros(1)),
            }
            asked = {}
            for name, call in calls.items():
                counting = _CountingStream(stream)
                call(counting)
                asked[name] = counting.calls
            assert asked == dict.fromkeys(calls, 1)
            capture = Capture(other, "relaxed")
            try:
                for ex in (None, executor):
                    ran = []
                    switching = _CountingStream(stream, other)
                    nh.host_launch(
                        switching, functools.partial(ran.append, 1), blocking=False, executor=ex
                    )
                    stream.sync()
                    nh.drain()
                    assert (ran, switching.calls) == ([1], 1), ex
            finally:
                capture.end()
                capture.close()
    finally:
        other.sync()
        nh.drain()
        device.close_stream(other)


def test_bad_nonblocking_arguments_are_refused(stream):
    with pytest.raises(ValueError, match="leave blocking=True"):
        nh.host_launch(stream, _noop, blocking=False)
    with pytest.raises(TypeError, match="True or False"):
        nh.host_launch(stream, lambda: None, blocking=0)
    with pytest.raises(ValueError, match="user_data"):
        nh.host_launch(stream, lambda: None, user_data=3, blocking=False)
    with pytest.raises(TypeError, match="async_done"):

        async def coroutine():
            pass

        nh.host_launch(stream, coroutine, blocking=False)
    with pytest.raises(TypeError, match="stream"):
        nh.done_future(None)
    assert nh.pending() == 0


# ---- executors ----------------------------------------------------------------------------


def test_signals_from_an_executor(stream, device):
    seen = []
    with nh.HostExecutor(threads=2) as executor:
        device.delay(stream, 0.02)
        nh.host_launch(stream, lambda: seen.append(1), blocking=False, executor=executor)
        future = nh.done_future(stream, executor=executor)

        async def main():
            return await nh.async_done(stream, executor=executor)

        assert asyncio.run(main()) is stream
        assert future.result(timeout=30) is stream
        stream.sync()
    nh.drain()
    assert seen == [1]


# ---- numba-cuda parity --------------------------------------------------------------------


def test_add_callback_has_numba_cudas_semantics(stream):
    """callback(stream, 0, arg) on the driver's thread, and the stream waits for it."""
    seen = []
    counter = np.zeros(1, np.int64)
    arg = object()

    def callback(s, status, a):
        seen.append((s, status, a, threading.current_thread().name, int(counter[0])))

    nh.add_callback(stream, callback, arg)
    nh.host_launch(stream, increment, user_data=nh.by_ref(counter))
    stream.sync()
    assert len(seen) == 1
    s, status, a, thread, count = seen[0]
    assert s is stream and status == 0 and a is arg
    assert thread != "MainThread" and count == 0


def test_add_callback_reports_its_callbacks_exception_with_the_callback_as_object(
    stream, unraisables
):
    """A callback's exception reaches sys.unraisablehook with the callback as the
    object, as a Python callable's own does for host_launch (docs/errors.md), and its
    traceback; the stream goes on.  It came with the functools.partial that wrapped
    the callback as the object, which a hook filtering on its callback never matched."""

    def callback(s, status, arg):
        raise ValueError("boom")

    ran = []
    nh.add_callback(stream, callback, 1)
    nh.host_launch(stream, lambda: ran.append(1))
    stream.sync()
    nh.drain()
    assert ran == [1] and len(unraisables) == 1
    report = unraisables[0]
    assert report.object is callback and isinstance(report.exc_value, ValueError)
    assert report.exc_traceback is not None
    with pytest.raises(TypeError, match="expected an exception"):
        nh._core.report_unraisable(callback, "not an exception")


def test_add_callback_refuses_what_it_cannot_call(stream):
    with pytest.raises(TypeError, match="callable"):
        nh.add_callback(stream, 3)
    with pytest.raises(TypeError, match="host_launch"):
        nh.add_callback(stream, _noop)

    async def coroutine(s, status, arg):
        pass

    with pytest.raises(TypeError, match="async_done"):
        nh.add_callback(stream, coroutine)

    def generator(s, status, arg):  # its body would never run: refused too
        yield

    with pytest.raises(TypeError, match=r"add_callback\(\) got a generator function"):
        nh.add_callback(stream, generator)
    from unittest import mock

    with pytest.raises(TypeError, match=r"add_callback\(\) got a coroutine function"):
        nh.add_callback(stream, mock.AsyncMock())
    assert nh.pending() == 0


def test_add_callback_refuses_a_callback_that_cannot_take_three_arguments(stream, unraisables):
    """Its signature is read before anything is enqueued: it was once enqueued, and
    its TypeError reached sys.unraisablehook on the driver's thread."""
    ran = []
    for callback in (lambda: ran.append(1), lambda s, status, arg, extra: ran.append(1)):
        with pytest.raises(TypeError, match=r"callback\(stream, status, arg\)"):
            nh.add_callback(stream, callback)
    assert nh.pending() == 0
    stream.sync()
    nh.drain()
    assert ran == [] and unraisables == []
    nh.add_callback(stream, lambda *args: ran.append(len(args)))  # still accepted
    stream.sync()
    nh.drain()
    assert ran == [3]


@pytest.mark.gpu
def test_numba_cuda_streams_end_to_end():
    """numba-cuda's stream and copies, then an await, a non-blocking callback and
    add_callback on that stream.  (Kernels of numba-cuda with numba_hostfn: the
    examples, which restore np.row_stack for numba-cuda 0.30.4 on NumPy 2.5.)"""
    from numba import cuda

    stream = cuda.stream()
    host = cuda.pinned_array(256, np.float32)
    host[:] = 2
    data = cuda.to_device(host, stream=stream)
    host[:] = 0
    data.copy_to_host(host, stream=stream)
    seen = []
    nh.host_launch(stream, lambda: seen.append(float(host.sum())), blocking=False)
    nh.add_callback(stream, lambda s, status, arg: seen.append((s is stream, status, arg)), 7)

    async def main():
        return await nh.async_done(stream)

    assert asyncio.run(main()) is stream
    stream.synchronize()
    nh.drain()
    assert sorted(seen, key=str) == sorted([512.0, (True, 0, 7)], key=str)


EXIT_SCRIPT = CHILD_PREAMBLE + textwrap.dedent("""
    import asyncio

    device.delay(stream, 1.0)
    calls = []
    for _ in range(100):
        nh.host_launch(stream, lambda: calls.append(1), blocking=False)
    future = nh.done_future(stream)

    async def main():
        return [nh.async_done(stream) for _ in range(100)]

    loop = asyncio.new_event_loop()
    waits = loop.run_until_complete(main())
    print("exiting with", nh.pending(), "pending", flush=True)
""")


def test_interpreter_exit_with_waits_outstanding():
    """Waits, futures and non-blocking callbacks outstanding at exit: rc 0, no hang."""
    out = run_child(EXIT_SCRIPT)
    assert "exiting with 201 pending" in out, out


# ---- the default lane: async_done and done_future without executor= ----------------------

DEFAULT_LANE_SCRIPT = CHILD_PREAMBLE + textwrap.dedent("""
    import asyncio, os, threading, time
    from numba_hostfn import _executor
    from _device import Capture, Hold

    def settle():  # the pool counts a task done just after its signal ran
        for _ in range(6000):
            if _executor._default.outstanding() == 0:
                return
            time.sleep(0.01)

    # Nothing of the lane exists before the first async_done or done_future.
    counter = np.zeros(1, np.int64)
    nh.host_launch(stream, increment, user_data=nh.by_ref(counter))
    nh.host_launch(stream, lambda: None, blocking=False)
    stream.sync()
    nh.drain()
    print("before first wait", _executor._default)
    # A capturing stream, as the first wait of the process: refused as on the
    # driver's path, nothing enqueued, and the lane not made for it (a refused call
    # starts nothing).  The first wait on another stream meanwhile makes it, the
    # capture still valid (in global mode, a pinned allocation of the lane's would
    # have invalidated it on a GPU).
    capture = Capture(stream, "global")
    try:
        nh.done_future(stream)
    except RuntimeError as e:
        print("capturing refused", "capturing stream" in str(e), _executor._default is None)
    other = device.create_stream()
    print("other stream", nh.done_future(other).result(timeout=60) is other)
    nh.host_launch(stream, increment, user_data=nh.by_ref(counter))
    capture.end()
    capture.launch()
    stream.sync()
    capture.close()
    lane = _executor._default
    if lane is not None:
        settle()  # other's wait: its result() may return before the pool counts it done
    print("under capture", counter[0] == 2, lane is not None and lane.outstanding() == 0)
    with Hold(stream):
        future = nh.done_future(stream)
        print("done_future on the lane", _executor._default.outstanding())
    print("done_future resolved", future.result(timeout=60) is stream)
    settle()

    async def main():
        with Hold(stream):
            waits = [nh.async_done(stream) for _ in range(3)]
            print("async_done on the lane", _executor._default.outstanding())
        return await asyncio.gather(*waits)

    print("async_done resolved", all(r is stream for r in asyncio.run(main())))
    settle()
    print("one lane", _executor._default is lane, lane.threads, lane.outstanding())
    # A forked child refuses as before: the parent's lane has no thread there.
    pid = os.fork()
    if pid == 0:
        for name, call in [("done_future", lambda: nh.done_future(stream)),
                           ("async_done", lambda: asyncio.run(main()))]:
            try:
                call()
                print("child", name, "ACCEPTED", flush=True)
            except RuntimeError as e:
                print("child", name, "refused" if "'spawn'" in str(e) else e, flush=True)
        os._exit(0)
    print("child exit", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
    print("after fork", nh.done_future(stream).result(timeout=60) is stream)
""")


def test_async_done_and_done_future_take_the_default_lane_with_no_argument():
    """With no executor= the signal is a task of the package's one-thread lane, made
    at the first wait (before: every wait was a driver host function, and no lane
    existed); a capturing stream is refused as before and left valid, and makes no
    lane (before: the refused wait made it); a forked child refuses as before."""
    lines = run_child(DEFAULT_LANE_SCRIPT).splitlines()
    assert "before first wait None" in lines, lines
    assert "capturing refused True True" in lines, lines
    assert "other stream True" in lines, lines
    assert "under capture True True" in lines, lines
    assert "done_future on the lane 1" in lines, lines
    assert "done_future resolved True" in lines, lines
    assert "async_done on the lane 3" in lines, lines
    assert "async_done resolved True" in lines, lines
    assert "one lane True 1 0" in lines, lines
    assert "child done_future refused" in lines and "child async_done refused" in lines, lines
    assert "child exit 0" in lines and "after fork True" in lines, lines


def test_the_default_lane_holds_at_most_its_depth_of_waits(stream):
    """Past DEFAULT_LANE_DEPTH outstanding waits, the next take the driver's thread:
    each lane wait is an item of device work, and CUDA blocks the enqueuing thread
    once about 1,021 are queued on a stream (before: 10,000 waits behind a held host
    function deadlocked on the H200).  All resolve, in the order they were made."""
    from numba_hostfn import _executor

    assert nh.done_future(stream).result(timeout=30) is stream
    lane = _executor.default_lane()
    assert lane is not None and _wait_for(lambda: lane.outstanding() == 0)
    n = _executor.DEFAULT_LANE_DEPTH + 40
    order = []
    with Hold(stream):
        futures = [nh.done_future(stream) for _ in range(n)]
        held = lane.outstanding()
        for i, future in enumerate(futures):
            future.add_done_callback(lambda _, i=i: order.append(i))
    assert held == _executor.DEFAULT_LANE_DEPTH, held
    assert all(f.result(timeout=30) is stream for f in futures)
    assert _wait_for(lambda: len(order) == n) and order == list(range(n))


def test_the_default_lane_falls_back_where_it_cannot_serve(stream, device, monkeypatch):
    """Streams past the lane's limit, and a lane closed (at exit), take the driver's
    thread: the waits still resolve, with nothing left outstanding on the lane."""
    from numba_hostfn import _executor

    assert nh.done_future(stream).result(timeout=30) is stream
    lane = _executor.default_lane()
    assert lane is not None and _wait_for(lambda: lane.outstanding() == 0)
    # A stream whose handle has no lane yet: CUDA gives a new stream the handle of one
    # destroyed earlier, and that handle's lane (an earlier test's) would serve it.
    made = [device.create_stream() for _ in range(64)]
    other = next(s for s in made if s.__cuda_stream__()[1] not in lane._lanes)
    for spare in made:
        if spare is not other:
            device.close_stream(spare)
    try:
        monkeypatch.setattr(_executor, "DEFAULT_LANE_STREAMS", len(lane._lanes))
        with Hold(other):
            future = nh.done_future(other)
            assert lane.outstanding() == 0  # past the limit: the driver's thread
        assert future.result(timeout=30) is other
        monkeypatch.setattr(lane, "_closed", True)  # as _close_default_lane leaves it
        monkeypatch.setattr(_executor, "DEFAULT_LANE_STREAMS", 10**6)
        with Hold(other):
            future = nh.done_future(other)
            assert lane.outstanding() == 0
        assert future.result(timeout=30) is other
    finally:
        device.close_stream(other)


def _voluntary_switches() -> int:
    total = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches"):
                        total += int(line.split()[1])
        except FileNotFoundError:  # a thread that ended meanwhile
            pass
    return total


LANE_RETRY_SCRIPT = CHILD_PREAMBLE + textwrap.dedent("""
    import sys
    from numba_hostfn import _executor, _process
    from numba_hostfn._errors import CudaDriverError

    failed = []
    if sys.argv[1] == "thread":  # RLIMIT_NPROC, a cgroup's pids.max, no memory
        owner, name = _executor._DefaultLane, "_start"
        error = RuntimeError("HostExecutor could not start 1 threads (memory or thread limit)")
    else:  # a driver call refused (as CUDA refuses one made from a host function)
        owner, name = _process.get_backend(), "check_executor"
        error = CudaDriverError("cuDeviceGetCount failed: CUDA_ERROR_NOT_PERMITTED", 800)
    original = getattr(owner, name)

    def fails_this_once(*args):
        if not failed:
            failed.append(True)
            raise error
        return original(*args)

    setattr(owner, name, fails_this_once)
    _executor.DEFAULT_LANE_RETRY_S = 0.0  # try again at the next wait
    first = nh.done_future(stream)
    print("first", first.result(timeout=60) is stream, first._watch == (0, 0), failed)
    second = nh.done_future(stream)
    print("second", second.result(timeout=60) is stream, second._watch != (0, 0))
    print("lane", _executor._default is not None, _executor._default_off)
""")


@pytest.mark.parametrize("failure", ["thread", "driver"])
def test_a_default_lane_that_could_not_start_once_is_tried_again(failure):
    """The first wait's lane could not start: its thread (a thread or memory limit met
    for a moment), or a driver call of the check (refused, as from a host function).
    That wait takes the driver's thread, and a later one starts the lane.  (Before:
    any failure turned the lane off for the process, as a device without stream
    memory operations does, and every later wait paid the driver thread's wake-up.)
    Only the backend's own refusal (HostExecutor cannot work here) is for good."""
    try:
        nh.HostExecutor(threads=1).close()
    except RuntimeError:
        pytest.skip("no HostExecutor here: the default lane is off for good")
    script = LANE_RETRY_SCRIPT.replace("sys.argv[1]", repr(failure))
    lines = run_child(script).splitlines()
    assert "first True True [True]" in lines, lines
    assert "second True True" in lines, lines
    assert "lane True False" in lines, lines


def test_the_default_lane_parks_when_nothing_waits(stream):
    """Once its waits have resolved, the lane's thread parks: it wakes no more (a
    polling thread wakes every 100 µs, thousands of times in the window below)."""
    from numba_hostfn import _executor

    for _ in range(3):
        assert nh.done_future(stream).result(timeout=30) is stream
    lane = _executor.default_lane()
    # The pool counts a task done just after its signal ran (which resolved the future).
    assert lane is not None and _wait_for(lambda: lane.outstanding() == 0)
    time.sleep(0.05)  # past the spin budget of the last task
    before = _voluntary_switches()
    time.sleep(0.3)
    woken = _voluntary_switches() - before
    assert woken < 300, f"{woken} wake-ups in 0.3 s with nothing outstanding"


LANE_EXIT_SCRIPT = CHILD_PREAMBLE + textwrap.dedent("""
    import asyncio, threading, time
    from numba_hostfn import _executor

    def worker():  # a non-daemon thread: it waits after the main thread returned
        time.sleep(0.3)
        device.delay(stream, 0.2)
        future = nh.done_future(stream)
        print("worker on the lane", _executor._default.outstanding() >= 1, flush=True)
        print("worker resolved", future.result(timeout=60) is stream, flush=True)
        device.delay(stream, 1.0)
        nh.done_future(stream)  # still outstanding at exit

    device.delay(stream, 1.0)
    future = nh.done_future(stream)

    async def main():
        return [nh.async_done(stream) for _ in range(50)]

    loop = asyncio.new_event_loop()
    waits = loop.run_until_complete(main())
    print("exiting with", _executor._default.outstanding(), "on the lane", flush=True)
    threading.Thread(target=worker).start()
""")


def test_exit_with_default_lane_waits_outstanding():
    """At exit the lane is closed to new waits only once the non-daemon threads have
    ended (a worker's wait after the main thread returned still takes it), and is
    never joined: exit with its waits outstanding returns 0 and reports nothing."""
    lines = run_child(LANE_EXIT_SCRIPT).splitlines()
    assert "exiting with 51 on the lane" in lines, lines
    assert "worker on the lane True" in lines and "worker resolved True" in lines, lines


@contextlib.contextmanager
def _held_by_device_work(device, stream):
    """``stream`` held by device work until the block ends, other streams' host
    functions running meanwhile: on CUDA ``held_work``; on the simulator a compiled
    wait on the stream's own thread (``Stream.launch``), where ``held_work``'s host
    function would hold the simulated driver's thread, every stream's."""
    if nh.backend_name() == "cuda":
        with held_work(device, stream):
            yield
        return
    flag = np.zeros(1, np.int64)
    stream.launch(_wait_for_flag(), user_data=nh.by_ref(flag))
    try:
        yield
    finally:
        flag[0] = 1


def _done_future_whose_enqueue_drains_a_lane_launch(device, signalled):
    """``done_future(signalled)`` from a worker thread whose enqueue, as it drains,
    releases an owner whose finalizer launches on an executor's lane from that
    thread (invariant 11 allows it): a launch that notes its lane task's number as
    the thread's last.  Returns the future.  The owner's record is left to that
    drain: the main thread, blocked in ``join()``, runs no pending call (the worker
    waits until it is there), and a try where the main thread drained it first,
    which tests nothing, is run again."""
    s0, s2 = device.create_stream(), device.create_stream()
    counter = np.zeros(1, np.int64)
    executor = nh.HostExecutor(threads=1)
    where, seen = [], {}

    class Owner:
        def __call__(self):
            pass

        def __del__(self):
            where.append(threading.current_thread().name)
            nh.host_launch(s2, increment, user_data=nh.by_ref(counter), executor=executor)

    def body():
        time.sleep(0.2)  # the main thread is in join() by then
        nh.host_launch(s0, Owner())
        s0.sync()
        seen["future"] = nh.done_future(signalled)

    try:
        for _ in range(5):
            where.clear()
            worker = threading.Thread(target=body, name="enqueuer")
            worker.start()
            worker.join(60)
            if where == ["enqueuer"]:
                return seen["future"]
        raise AssertionError(f"the owner was never released by the enqueue's drain: {where}")
    finally:
        for s in (s0, s2):
            s.sync()
        executor.close()
        nh.drain()
        for s in (s0, s2):
            device.close_stream(s)


def test_a_done_future_watches_its_own_lane_task_when_its_enqueues_drain_launches_on_a_lane(
    device, stream
):
    """The lane task a ``done_future`` on the default lane watches is its own
    signal's, though the drain its enqueue runs launched on another lane meanwhile.
    (Before: that launch's task number, the thread's last, was taken for the
    signal's, so ``result()`` watched the wrong number on the stream's lane and
    returned at once, the stream still held: invariant 25.)"""
    for _ in range(3):  # the stream's default-lane "reached" word is past 1
        assert nh.done_future(stream).result(timeout=30) is stream
    with _held_by_device_work(device, stream):
        future = _done_future_whose_enqueue_drains_a_lane_launch(device, stream)
        assert future._watch[1] >= 4, future._watch  # after the stream's three waits
        with pytest.raises(concurrent.futures.TimeoutError):
            future.result(timeout=0.2)
    assert future.result(timeout=30) is stream


def test_a_done_future_on_the_drivers_thread_never_watches_a_lane(device, stream, monkeypatch):
    """A ``done_future`` whose signal takes the driver's thread (no default lane) has
    no lane task to watch, though the drain its enqueue runs launched on a lane.
    (Before: that launch's task number was taken for the signal's, so the future
    watched (the stream's handle, that number), and ``result()`` read the stream's
    handle as a lane's memory: a crash on the simulator.)"""
    from numba_hostfn import _executor

    monkeypatch.setattr(_executor, "_default_off", True)
    future = _done_future_whose_enqueue_drains_a_lane_launch(device, stream)
    assert future._watch == (0, 0)
    assert future.result(timeout=30) is stream


def _interrupt_settle_at(code, line):
    """A tracer raising KeyboardInterrupt the first time `code` reaches `line`."""
    fired = []

    def local(frame, event, arg):
        if event == "line" and frame.f_lineno == line and not fired:
            fired.append(line)
            raise KeyboardInterrupt
        return local

    def tracer(frame, event, arg):
        return local if frame.f_code is code and not fired else None

    return tracer, fired


@pytest.mark.timeout(120)
def test_a_ctrl_c_at_any_line_of_a_done_futures_settle_leaves_it_settleable(stream):
    """Invariants 21 and 25: main's result() watches the lane, sees the stream get
    there and settles the future itself; a Ctrl-C lands at a line of _settle.  Before
    the fix, one landing just after the token was popped (before set_result) left the
    futures thread's settle with no token: the future stayed pending for ever, and a
    retried result() (what a program does after handling the Ctrl-C) never returned."""
    future_type = _notify._stream_future_type()
    code = future_type._settle.__code__
    lines = sorted({ln for _, _, ln in code.co_lines() if ln is not None} - {code.co_firstlineno})
    release = threading.Event()
    # Keep the futures thread busy inside an earlier future's done callback, so the
    # watching thread (main) is the one that settles.
    with Hold(stream):
        first = nh.done_future(stream)
        first.add_done_callback(lambda _: release.wait(60))
    futures = []
    try:
        # wait() settles nothing itself: the futures thread settles, and stays held.
        assert not concurrent.futures.wait([first], timeout=30).not_done
        for line in lines:
            hold = Hold(stream)
            future = nh.done_future(stream)
            assert future._watch[1], "the wait is on the default lane"
            hold.release()
            tracer, fired = _interrupt_settle_at(code, line)
            sys.settrace(tracer)
            try:
                future.result(timeout=30)
            except KeyboardInterrupt:
                pass
            finally:
                sys.settrace(None)
            futures.append((line, bool(fired), future))
    finally:
        release.set()
    stream.sync()
    nh.drain()
    # Every signal has run and the futures thread is free: each future resolves.
    stuck = []
    for line, _fired, future in futures:
        try:
            assert future.result(timeout=5) is stream
        except concurrent.futures.TimeoutError:  # 3.10: no builtin TimeoutError
            stuck.append(line)
    assert any(f for _, f, _ in futures)
    assert stuck == [], f"futures left pending by a Ctrl-C at lines {stuck} of _settle"


def test_a_ctrl_c_in_a_done_callback_strands_none_of_the_rest(stream, caplog):
    """Invariants 21 and 25: main's result() watches the lane and settles the future
    itself, so the done callbacks run on main, where a Ctrl-C lands (here: raised by
    the first callback, as a Ctrl-C landing in it raises).  The callbacks after it
    still run, an asyncio.wrap_future bridge's included, and the KeyboardInterrupt
    then reaches result()'s caller.  Before, concurrent.futures stopped at it: no
    later callback ever ran (nothing settles a future twice), and the coroutine
    awaiting the bridge hung.  An Exception is logged, as concurrent.futures logs it."""
    release = threading.Event()
    # Keep the futures thread busy inside an earlier future's done callback, so the
    # watching thread (main) is the one that settles.
    with Hold(stream):
        first = nh.done_future(stream)
        first.add_done_callback(lambda _: release.wait(60))
    loop = asyncio.new_event_loop()
    ran = []

    def failed(_):
        ran.append("failed")
        raise ValueError("a done callback's own error")

    def interrupted(_):
        ran.append("interrupted")
        raise KeyboardInterrupt

    try:
        assert not concurrent.futures.wait([first], timeout=30).not_done  # held now
        with Hold(stream):
            future = nh.done_future(stream)
            assert future._watch[1], "the wait is on the default lane"
            future.add_done_callback(failed)
            future.add_done_callback(interrupted)
            future.add_done_callback(lambda _: ran.append("after"))
            bridged = asyncio.wrap_future(future, loop=loop)
        with caplog.at_level("ERROR", logger="concurrent.futures"):
            with pytest.raises(KeyboardInterrupt):
                future.result(timeout=30)
        assert ran == ["failed", "interrupted", "after"]
        [record] = caplog.records
        assert record.getMessage().startswith("exception calling callback for")
        assert isinstance(record.exc_info[1], ValueError)
        assert loop.run_until_complete(asyncio.wait_for(bridged, 30)) is stream
        assert future.result(timeout=0) is stream
    finally:
        release.set()
        loop.close()


NESTED_FIRST_USE = CHILD_PREAMBLE + textwrap.dedent("""
    import signal, sys
    from numba_hostfn import _notify

    seen = []

    def handler(signum, frame):
        # A signal handler (or a finalizer a collection runs) that waits on a stream:
        # it may run at any bytecode, here while this thread makes the futures.
        seen.append(nh.done_future(stream).result(timeout=30) is stream)

    signal.signal(signal.SIGUSR1, handler)
    code = _notify._Callbacks.__init__.__code__
    fired = []

    def local(frame, event, arg):
        if event == "line" and not fired:
            fired.append(1)
            signal.raise_signal(signal.SIGUSR1)  # its handler runs at the next bytecode
        return local

    sys.settrace(lambda frame, event, arg: local if frame.f_code is code else None)
    try:
        outer = nh.done_future(stream)  # the process's first: makes the futures
    finally:
        sys.settrace(None)
    print("ok", outer.result(timeout=30) is stream, seen)
""")


@pytest.mark.timeout(120)
def test_a_handler_waiting_on_a_stream_while_the_first_done_future_is_made_does_not_deadlock():
    """Invariant 11: a finalizer or signal handler may launch or wait between any two
    bytecodes, on the thread that holds the package's lock; the locks held while Python
    runs are reentrant, but _callbacks_lock (held while _the_futures/_the_callbacks
    build the futures' or callbacks' thread and channel) is not: a handler that makes a
    done_future (or a blocking=False launch) there waits for its own thread for ever."""
    out = run_child(NESTED_FIRST_USE, timeout=60)
    assert out.split()[0] == "ok", out


HELPER_FINALIZER_FIRST_USE = CHILD_PREAMBLE + textwrap.dedent("""
    import gc, threading
    from numba_hostfn import _notify

    _notify._stream_future_type()  # imported already, as a first done_future would
    ran = []

    class Garbage:
        # Only the collector frees it; collected on whichever thread allocates next.
        def __init__(self):
            self.me = self

        def __del__(self):
            name = threading.current_thread().name
            if name.startswith("numba_hostfn-"):  # a helper thread, before it records
                ran.append(name)
                nh.done_future(stream)  # the process's first: makes the futures
            elif not ran:
                Garbage()  # garbage again, for the next collection

    Garbage()
    gc.set_threshold(1, 1, 1)
    nh.host_launch(stream, lambda: None, blocking=False)  # makes the callbacks' thread
    gc.set_threshold(700, 10, 10)
    stream.sync()
    nh.drain()
    f = nh.done_future(stream)
    print("ok", f.result(timeout=30) is stream, flush=True)
""")


@pytest.mark.timeout(120)
def test_a_finalizer_on_a_new_helper_thread_may_make_the_first_done_future():
    """A collection on the callbacks' new thread, before it has recorded itself, runs
    a finalizer that makes the process's first done_future, while the main thread
    waits for that record: both finish.  Before, the main thread waited holding
    _callbacks_lock, which the finalizer's first use waited for, for ever."""
    out = run_child(HELPER_FINALIZER_FIRST_USE, timeout=60)
    assert out.split()[:2] == ["ok", "True"], out


def test_a_helper_thread_that_fails_to_record_itself_is_reported_not_waited_for():
    """A helper thread whose record raised (no memory) ends; its caller, which waits
    for the record, raises RuntimeError saying so, instead of waiting for ever, and
    the error went to threading.excepthook."""
    reported = []

    def failing(made):
        raise MemoryError("no memory for the record")

    hook, threading.excepthook = threading.excepthook, reported.append
    try:
        made = _notify._Callbacks(failing, wake_main=False, name="numba_hostfn-test")
        with pytest.raises(RuntimeError, match="test thread ended before it recorded itself"):
            _notify._wait_for_record(made, "test")
        made._helper.join(10)
    finally:
        threading.excepthook = hook
    assert [type(args.exc_value) for args in reported] == [MemoryError]
    assert not made._helper.is_alive()


READER_WINDOW = CHILD_PREAMBLE + textwrap.dedent("""
    import asyncio, sys, time
    from _device import Hold
    from numba_hostfn import _core, _notify

    ran = []

    def counted():  # the notify pending call, counted (it resolves nothing: no loop runs)
        ran.append(1)
        _notify._pending_call()

    loop = asyncio.new_event_loop()

    async def wait_on(s):
        return nh.async_done(s)

    hold = Hold(stream)
    first = loop.run_until_complete(wait_on(stream))  # the loop's channel, one wait
    _core.set_notify_callable(counted)  # after the first wait routed the pending call
    hold.release()
    stream.sync()
    deadline = time.monotonic() + 20
    while not ran and time.monotonic() < deadline:
        time.sleep(0.001)  # 3.10/3.11 run it at a GIL switch: no loop runs, it resolves nothing
    assert ran and not first.done()

    # The loop runs again; its reader runs, and a Ctrl-C lands before its last line
    # (before the fix: after the read of the descriptor, before the resolve).
    code = _notify._LoopWaits._ready.__code__
    line = max(ln for _, _, ln in code.co_lines() if ln is not None)  # its last line
    fired = []

    def local(frame, event, arg):
        if event == "line" and frame.f_lineno == line and not fired:
            fired.append(1)
            raise KeyboardInterrupt
        return local

    sys.settrace(lambda frame, event, arg: local if frame.f_code is code else None)
    try:
        loop.run_until_complete(first)
        how = "returned"
    except KeyboardInterrupt:
        how = "interrupted"
    finally:
        sys.settrace(None)

    # The program handles the Ctrl-C and goes on with its loop.
    async def later():
        second = nh.async_done(stream)
        stream.sync()
        results = []
        for f in (first, second):
            try:
                results.append(await asyncio.wait_for(asyncio.shield(f), 3) is stream)
            except asyncio.TimeoutError:
                results.append("stuck")
        return results

    print(how, loop.run_until_complete(later()))
""")


@pytest.mark.timeout(120)
def test_a_ctrl_c_between_the_loops_read_and_its_resolve_strands_no_wait():
    """Invariants 19 and 21: _ready reads the loop's eventfd, then resolves, in two
    bytecodes of Python.  A Ctrl-C between them consumes the wake-up with the keys
    still on the channel's stack; every later signal pushes onto a non-empty stack and
    writes nothing, so that wait and every later wait of that loop never resolve
    (until something unrelated runs the resolve)."""
    out = run_child(READER_WINDOW, timeout=60)
    assert out.split()[0] == "interrupted", out
    assert "stuck" not in out, out


def test_a_cancelled_done_future_is_told_to_its_waiters(stream):
    """Cancelling a done_future drops interest; when its signal runs, the future's
    waiters (concurrent.futures.as_completed, wait) are told, as an executor tells
    them: a settle that only set the result left a cancelled future untold, and
    as_completed() waited for it until its timeout."""
    with Hold(stream):
        future = nh.done_future(stream)
        assert future.cancel()
        waiting = concurrent.futures.ThreadPoolExecutor(1)
        told = waiting.submit(lambda: list(concurrent.futures.as_completed([future], 30)))
        time.sleep(0.05)  # as_completed has installed its waiter (else it finds it told)
    stream.sync()
    assert told.result(60) == [future]
    waiting.shutdown()


def test_async_done_on_a_loop_without_add_reader_is_a_clear_runtime_error(stream):
    """A loop that watches no descriptor (``add_reader`` not implemented, as in
    asyncio's proactor loop or the abstract loop) is refused with the RuntimeError
    async_done documents, naming add_reader and the way around it, and leaves no
    descriptor open and nothing pending (before: a bare NotImplementedError)."""

    class NoReaderLoop(asyncio.SelectorEventLoop):
        def add_reader(self, fd, callback, *args):
            raise NotImplementedError

    async def wait():
        return nh.async_done(stream)

    fds = _open_fds()
    loop = NoReaderLoop()
    try:
        with pytest.raises(RuntimeError, match="add_reader.*done_future"):
            loop.run_until_complete(wait())
    finally:
        loop.close()
    del loop
    gc.collect()
    assert _open_fds() <= fds
    assert nh.pending() == 0


WRONG_STREAM_FIRST_SCRIPT = CHILD_PREAMBLE + textwrap.dedent("""
    import asyncio
    import threading
    from numba_hostfn import _notify

    s = device.create_stream()
    for bad in (None, 12345, object()):
        try:
            nh.done_future(bad)
        except TypeError as exc:
            assert "done_future()" in str(exc), exc
        else:
            raise AssertionError("done_future took a wrong stream")
    assert _notify._futures is None, "a wrong stream started the futures thread"
    assert "numba_hostfn-futures" not in [t.name for t in threading.enumerate()]

    async def main():
        loop = asyncio.get_running_loop()
        try:
            nh.async_done(12345)
        except TypeError as exc:
            assert "async_done()" in str(exc), exc
        else:
            raise AssertionError("async_done took a wrong stream")
        assert _notify._loops.get(loop) is None, "a wrong stream made the loop a channel"
        await nh.async_done(s)  # a right one then makes it, and resolves
        assert _notify._loops.get(loop) is not None

    asyncio.run(main())
    nh.done_future(s).result(timeout=60)
    s.close()
    print("ok")
""")


def test_done_future_and_async_done_check_the_stream_before_they_make_anything():
    """done_future and async_done check the stream (its type, then its handle) before
    they make what their first call makes: the futures thread, the loop's channel (a
    reader on the loop). A wrong stream made them first, and they were kept."""
    out = run_child(WRONG_STREAM_FIRST_SCRIPT)
    assert out.strip().endswith("ok"), out


#: Each refused signal of REFUSED_SIGNAL_SCRIPT: (case, the exception, the call); the
#: LATE ones after the default lane and the executor have lanes of their own. The
#: cases of SIM_ONLY_SIGNALS are the simulator's (a closed, capturing or faulted
#: stream); the others run on the backend in use.
REFUSED_SIGNAL_SCRIPT = textwrap.dedent("""
    import asyncio
    import os
    import threading
    import time
    from numba_hostfn import _executor, _notify

    def made():
        # What a signal's first call makes and keeps: its helper threads, descriptors,
        # the process's batches, the default lane and its lanes, an executor's lanes.
        lane = _executor._default
        return (sorted(t.name for t in threading.enumerate()),
                len(os.listdir("/proc/self/fd")), _notify._callbacks, _notify._futures,
                lane, None if lane is None else dict(lane._lanes), dict(live._lanes))

    live = nh.HostExecutor(1)
    closed_executor = nh.HostExecutor(1)
    closed_executor.close()
    builder = stream.create_graph_builder()
    if SIMULATOR:
        from _device import refusing_sim_streams

        closed, capturing, faulted = refusing_sim_streams()

    def nonblocking(target, **kw):
        return lambda: nh.host_launch(target, print, blocking=False, **kw)

    def in_loop(target, **kw):
        async def main():
            loop = asyncio.get_running_loop()
            before = made()
            try:
                nh.async_done(target, **kw)
            except Exception as exc:
                error = exc
            else:
                raise AssertionError("async_done was not refused")
            after = made()
            assert before == after, (before, after)
            assert _notify._loops.get(loop) is None, "the loop got a channel"
            raise error
        return lambda: asyncio.run(main())

    def run(case, error, call):
        before = made()
        try:
            call()
        except error:
            pass
        except Exception as exc:
            print(case, "raised", type(exc).__name__, exc)
            return
        else:
            print(case, "was not refused")
            return
        after = made()
        print(case, "ok" if before == after else f"made {before} -> {after}")

    if LATE:
        # The default lane and an executor with lanes of their own (made here): a
        # refused wait on a closed stream gives neither a lane, which is never removed.
        nh.done_future(stream).result(timeout=60)
        nh.done_future(stream, executor=live).result(timeout=60)
    run(CASE, ERROR, eval(CALL))
    nh.done_future(stream).result(timeout=60)  # and what the refusals left works
    live.close()
    stream.close()
""")

REFUSED_SIGNALS = [
    ("nonblocking_wrong_executor", "TypeError", "nonblocking(stream, executor=object())"),
    (
        "nonblocking_closed_executor",
        "RuntimeError",
        "nonblocking(stream, executor=closed_executor)",
    ),
    ("nonblocking_builder", "RuntimeError", "nonblocking(builder)"),
    ("nonblocking_builder_executor", "RuntimeError", "nonblocking(builder, executor=live)"),
    (
        "done_future_wrong_executor",
        "TypeError",
        "lambda: nh.done_future(stream, executor=object())",
    ),
    (
        "done_future_closed_executor",
        "RuntimeError",
        "lambda: nh.done_future(stream, executor=closed_executor)",
    ),
    ("async_done_wrong_executor", "TypeError", "in_loop(stream, executor=object())"),
    ("async_done_closed_executor", "RuntimeError", "in_loop(stream, executor=closed_executor)"),
    ("nonblocking_closed_stream", "RuntimeError", "nonblocking(closed)"),
    ("nonblocking_capturing_stream", "RuntimeError", "nonblocking(capturing)"),
    ("nonblocking_faulted_stream", "nh.DeviceFaultError", "nonblocking(faulted)"),
    ("done_future_closed_stream", "RuntimeError", "lambda: nh.done_future(closed)"),
    ("done_future_capturing_stream", "RuntimeError", "lambda: nh.done_future(capturing)"),
    ("done_future_faulted_stream", "nh.DeviceFaultError", "lambda: nh.done_future(faulted)"),
    ("async_done_closed_stream", "RuntimeError", "in_loop(closed)"),
    ("async_done_faulted_stream", "nh.DeviceFaultError", "in_loop(faulted)"),
]
LATE_REFUSED_SIGNALS = [
    ("done_future_closed_stream_default_lane", "RuntimeError", "lambda: nh.done_future(closed)"),
    (
        "done_future_closed_stream_executor",
        "RuntimeError",
        "lambda: nh.done_future(closed, executor=live)",
    ),
    ("nonblocking_closed_stream_executor", "RuntimeError", "nonblocking(closed, executor=live)"),
]
SIM_ONLY_SIGNALS = ("closed_stream", "capturing_stream", "faulted_stream")


@pytest.mark.parametrize(
    ("case", "error", "call", "late"),
    [(*c, False) for c in REFUSED_SIGNALS] + [(*c, True) for c in LATE_REFUSED_SIGNALS],
    ids=[c[0] for c in REFUSED_SIGNALS + LATE_REFUSED_SIGNALS],
)
def test_a_refused_signal_starts_no_thread_and_keeps_no_channel_or_lane(case, error, call, late):
    """host_launch(blocking=False), done_future and async_done refused (a wrong or
    closed executor, a graph, a closed, capturing or faulted stream) have made
    nothing: no callbacks or futures thread, no descriptor, no loop channel (a
    reader), no default lane or lane of it or of the executor for the stream
    (_enqueue.check_signal: everything that can refuse is checked before they are
    made).  Before, each made them first, and kept them.  Each in a child of its
    own (what a first call makes is the process's); the closed, capturing and
    faulted streams' on the simulator, the others' on the backend in use."""
    simulator = any(k in case for k in SIM_ONLY_SIGNALS)
    script = (
        CHILD_PREAMBLE
        + f"SIMULATOR = {simulator}\nCASE = {case!r}\nERROR = {error}\n"
        + f"CALL = {call!r}\nLATE = {late}\n"
        + REFUSED_SIGNAL_SCRIPT
    )
    out = run_child(script, env=child_env(NUMBA_HOSTFN_SIMULATOR="1") if simulator else None)
    assert out.strip() == f"{case} ok", out
