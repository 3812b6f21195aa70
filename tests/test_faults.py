"""Faults inside compiled bodies: none may leave the GIL held or a stream stuck.

These run in a child process: a thread that keeps the GIL stops every Python
thread, pytest's own timeout included, so only a parent can see the hang.
"""

import ctypes
import gc
import textwrap
import time
import weakref

import numba
import numpy as np
import pytest
from _device import (
    CHILD_PREAMBLE,
    TAKE_GIL_AND_KEEP_IT,
    child_env,
    rerun_on_simulator,
    run_child,
)
from numba import carray

import numba_hostfn as nh

FAULTS_SCRIPT = textwrap.dedent("""
    import faulthandler
    faulthandler.enable()  # SIGABRT from the test prints every thread's stack
    import sys
    import threading

    import numba
    import numpy as np
    from numba import carray

    import numba_hostfn as nh
    from _device import Device

    reports = []
    sys.unraisablehook = lambda u: reports.append(f"{u.object}: {u.exc_value}")
""")
FAULTS_SCRIPT += TAKE_GIL_AND_KEEP_IT + textwrap.dedent("""
    @nh.host_callback
    def show(p):
        print("value", carray(p, (1,), np.int64)[0], 2.5)

    @nh.host_callback
    def thread_of_objmode(p):
        a = carray(p, (1,), np.int64)
        with numba.objmode(ident="int64"):
            ident = threading.get_ident() % 2**62
        a[0] = ident

    @nh.host_callback
    def keeps_gil(p):
        take_gil_and_keep_it()
        carray(p, (1,), np.int64)[0] = 1

    @numba.cfunc("void(voidptr)")
    def plain_cfunc_print(p):
        print(carray(p, (1,), np.int64)[0])

    device = Device()
    stream = device.create_stream()
    x = np.array([41], np.int64)
    show.ctypes(x.ctypes.data)  # the machine code the driver calls, on this thread
    nh.host_launch(stream, show, user_data=nh.by_ref(x))
    ident = np.zeros(1, np.int64)
    nh.host_launch(stream, thread_of_objmode, user_data=nh.by_ref(ident))
    kept = np.zeros(1, np.int64)
    nh.host_launch(stream, keeps_gil, user_data=nh.by_ref(kept))
    nh.host_launch(stream, plain_cfunc_print, user_data=x.ctypes.data)
    after = []
    nh.host_launch(stream, lambda: after.append(threading.get_ident() % 2**62))
    stream.sync()
    nh.drain()
    print("objmode on the host-function thread:", after == [ident[0]] and ident[0] != 0)
    print("objmode not on the main thread:", ident[0] != threading.get_ident() % 2**62)
    print("body after the kept GIL ran:", kept[0] == 1)
    print("reports:", reports)
    print("pending:", nh.pending())
""")


def test_print_objmode_and_a_kept_gil_on_the_host_function_thread():
    out = run_child(FAULTS_SCRIPT)
    lines = out.splitlines()
    # print of values, from the calling thread and from the host-function thread
    assert lines[:2] == ["value 41 2.5", "value 41 2.5"], out
    assert "objmode on the host-function thread: True" in lines, out
    assert "objmode not on the main thread: True" in lines, out
    # a body that returned holding the GIL: the trampoline gave it back
    assert "body after the kept GIL ran: True" in lines, out
    # numba's own cfunc has no Environment registered: reported, and the stream went on
    (reports,) = [line for line in lines if line.startswith("reports:")]
    assert lines[2] == "objmode on the host-function thread: True", out  # plain printed nothing
    assert reports.count("missing Environment") == 1, out
    assert "pending: 0" in lines, out


_add_pending_call = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)(
    ctypes.cast(ctypes.pythonapi.Py_AddPendingCall, ctypes.c_void_p).value
)
_usleep = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint)(("usleep", ctypes.CDLL(None)))


@numba.cfunc("int32(voidptr)")
def _noop_pending_call(p):
    return 0


_NOOP_PENDING_CALL = _noop_pending_call.address


@nh.host_callback
def _fill_pending_calls_then_wait(p):
    """Fill CPython's pending-call queue, then keep this thread out of the eval loop."""
    io = carray(p, (2,), np.int64)
    filled = 0
    while (
        filled < 100_000
        and _add_pending_call(nh.as_voidptr(_NOOP_PENDING_CALL), nh.as_voidptr(0)) == 0
    ):
        filled += 1
    io[0] = filled
    _usleep(io[1])


@nh.host_callback
def _increment(p):
    carray(p, (1,), np.int64)[0] += 1


def test_a_refused_drain_is_retried_by_the_next_completion(device, stream):
    """Invariant 14: the first completion finds the pending-call queue full; the next one
    schedules the drain again, with no drain() or launch from the main thread."""
    from numba_hostfn import _core

    schedule_failures = _core._testing.schedule_failures

    before = schedule_failures()
    first, second = np.zeros(1, np.int64), np.zeros(1, np.int64)
    first_alive, second_alive = weakref.ref(first), weakref.ref(second)
    other = device.create_stream()
    try:
        device.delay(stream, 0.3)  # completes while the queue is full
        nh.host_launch(stream, _increment, user_data=nh.by_ref(first))
        device.delay(other, 2.0)  # completes after the queue has emptied
        nh.host_launch(other, _increment, user_data=nh.by_ref(second))
        del first, second
        io = np.array([0, 1_200_000], np.int64)
        # The machine code itself, through ctypes (the GIL is released): a direct
        # call would first compile the body once more, while the delay runs out.
        _fill_pending_calls_then_wait.ctypes(io.ctypes.data)
        assert io[0] > 0, "the pending-call queue was already full"
        assert schedule_failures() > before, "the first completion's drain was not refused"
        for _ in range(600):  # no drain() and no host_launch: only the retry can release
            if first_alive() is None and second_alive() is None:
                break
            time.sleep(0.05)
        assert first_alive() is None and second_alive() is None
    finally:
        other.sync()
        device.close_stream(other)


def test_the_next_enqueue_drains_what_a_refused_drain_left(device, stream):
    """Invariant 14: a completion finds the pending-call queue full, and no completion
    follows (the other stream is held); the next launch's enqueue drains it at once."""
    from numba_hostfn import _core

    before = _core._testing.schedule_failures()
    first = np.zeros(1, np.int64)
    first_alive = weakref.ref(first)
    other = device.create_stream()
    try:
        device.delay(other, 6.0)  # no completion on it until the end
        device.delay(stream, 0.3)  # completes while the queue is full
        nh.host_launch(stream, _increment, user_data=nh.by_ref(first))
        del first
        io = np.array([0, 1_200_000], np.int64)
        _fill_pending_calls_then_wait.ctypes(io.ctypes.data)  # as in the test above
        assert io[0] > 0, "the pending-call queue was already full"
        assert _core._testing.schedule_failures() > before, "the drain was not refused"
        assert first_alive() is not None, "released with no drain: the test proves nothing"
        nh.host_launch(other, _increment, user_data=nh.by_ref(np.zeros(1, np.int64)))
        assert first_alive() is None, "the enqueue did not drain what had run"
    finally:
        other.sync()
        device.close_stream(other)
        nh.drain()


# ---- faults with defined outcomes (docs/errors.md) ----


class _Custom(BaseException):
    pass


@pytest.mark.parametrize("exc", [SystemExit(3), KeyboardInterrupt(), _Custom("x")])
def test_base_exceptions_in_a_callable_are_reported_not_raised(stream, unraisables, exc):
    """SystemExit, KeyboardInterrupt or any BaseException from a callable on the driver's
    thread is reported like any exception: it neither exits nor interrupts the program."""

    def fail():
        raise exc

    counter = np.zeros(1, np.int64)
    nh.host_launch(stream, fail)
    nh.host_launch(stream, _increment, user_data=nh.by_ref(counter))
    stream.sync()
    nh.drain()
    assert counter[0] == 1
    assert [type(u.exc_value) for u in unraisables if u.object is fail] == [type(exc)]


def test_stream_closed_with_launches_pending_runs_them(device):
    """Closing (destroying) a stream with launches queued: they still run and are released."""
    stream = device.create_stream()
    counter = np.zeros(1, np.int64)
    alive = weakref.ref(counter)
    calls = []
    device.delay(stream, 0.2)
    for _ in range(100):
        nh.host_launch(stream, _increment, user_data=nh.by_ref(counter))
        nh.host_launch(stream, lambda: calls.append(1))
    device.close_stream(stream)  # CUDA: returns at once; the simulator runs the queue first
    for _ in range(300):
        device.synchronize()
        nh.drain()
        if nh.pending() == 0:
            break
        time.sleep(0.01)
    assert counter[0] == 100 and len(calls) == 100 and nh.pending() == 0
    del counter
    gc.collect()
    assert alive() is None


FORK_SCRIPT = CHILD_PREAMBLE + textwrap.dedent("""
    import atexit, gc, os, sys, time, warnings
    from _device import wait_or_kill

    warnings.simplefilter("ignore", DeprecationWarning)  # fork() with threads: the point
    executor = nh.HostExecutor(threads=2)
    counter = np.zeros(1, np.int64)
    device.delay(stream, 0.3)
    for _ in range(100):
        nh.host_launch(stream, increment, user_data=nh.by_ref(counter))
        nh.host_launch(stream, increment, user_data=nh.by_ref(counter), executor=executor)
    pid = os.fork()
    if pid == 0:
        for call in (lambda: nh.host_launch(stream, increment, user_data=nh.by_ref(counter)),
                     nh.drain, lambda: nh.HostExecutor(threads=1)):
            try:
                call()
                print("child: accepted", flush=True)
            except RuntimeError as exc:
                print("child refused:", str(exc)[:60], flush=True)
        # Our finalizers and at-exit handlers run in the child; then it ends as
        # multiprocessing's forked children do, with os._exit: CUDA's own C exit
        # handlers crash in a forked child whose parent had a context, with no
        # numba_hostfn in the process (SIGSEGV after the last Python frame, 24 of
        # 24 on the H200; 11 of 45 here with a normal exit).
        del executor
        gc.collect()
        atexit._run_exitfuncs()
        print("child: exited cleanly", flush=True)
        os._exit(0)
    status = wait_or_kill(pid)
    if status is None:
        print("parent: the child hung", flush=True)
        sys.exit(1)
    stream.sync()
    nh.drain()
    executor.close()
    print("parent:", os.waitstatus_to_exitcode(status), int(counter[0]), nh.pending(), flush=True)
""")


def test_a_forked_child_is_refused_clearly_and_exits():
    """fork() after launches: the child gets RuntimeError naming 'spawn', and exits at once;
    the parent's launches all run."""
    out = run_child(FORK_SCRIPT)
    assert out.count("child refused: numba_hostfn was used in this process's parent") == 3, out
    assert "child: exited cleanly" in out, out
    assert "parent: 0 200 0" in out, out


SIMULATED_FORK_SCRIPT = CHILD_PREAMBLE + textwrap.dedent("""
    import os, sys, warnings

    warnings.simplefilter("ignore", DeprecationWarning)  # fork() with threads: the point
    executor = nh.HostExecutor(threads=1)
    builder = stream.create_graph_builder()
    builder.begin_building()
    nh.host_launch(builder, increment, user_data=nh.by_ref(np.zeros(1, np.int64)))
    builder.end_building()
    graph = builder.complete()
    other = nh.create_stream()
    other.begin_capture()
    third = nh.create_stream()
    building = third.create_graph_builder().begin_building()
    pid = os.fork()
    if pid == 0:
        calls = {
            # These four took the capture lock and the stream's mutex, which another
            # thread of the parent may hold at the fork: the child hung, or went on.
            "end_building": building.end_building,
            "GraphBuilder.close": building.close,
            "complete": builder.complete,
            "Graph.close": graph.close,
            "sync": stream.sync,
            "sleep": lambda: stream.sleep(0.01),
            "is_done": stream.is_done,
            "launch": lambda: stream.launch(increment, user_data=np.zeros(1, np.int64)),
            "begin_capture": stream.begin_capture,
            "end_capture": other.end_capture,
            "create_graph_builder": stream.create_graph_builder,
            "Stream()": nh.simulator.Stream,
            "Graph.launch": lambda: graph.launch(stream),
            "begin_building": lambda: stream.create_graph_builder().begin_building(),
            "outstanding": executor.outstanding,
            "graph_nodes": executor.graph_nodes,
            "done_future": lambda: nh.done_future(stream),
            "host_copy": lambda: nh.host_copy(stream, bytearray(4), b"abcd"),
            "release_after": lambda: nh.release_after(stream, object()),
            "pending": nh.pending,
        }
        for name, call in calls.items():
            try:
                call()
                print(name, "ACCEPTED", flush=True)
            except RuntimeError as exc:
                print(name, "refused" if "'spawn'" in str(exc) else f"refused: {exc}", flush=True)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    building.close()
    third.close()
    other.end_capture().close()
    graph.close()
    builder.close()
    executor.close()
    print("parent:", os.waitstatus_to_exitcode(status), flush=True)
""")


def test_every_simulated_entry_point_of_a_forked_child_is_refused(request):
    """A simulated stream's methods, its graphs', an executor's, and the module's
    entry points each raise the RuntimeError that names 'spawn' in a forked child (a
    stream's sync() blocked for ever there, sleep(), is_done(), begin_capture() and
    end_capture() succeeded; a builder's end_building(), complete() and close() and
    a graph's close() too, and the first and last could hang on the capture lock)."""
    if rerun_on_simulator(request):
        return
    out = run_child(SIMULATED_FORK_SCRIPT).split("\n")
    refused = [line for line in out if line.endswith(" refused")]
    assert len(refused) == 20 and "parent: 0" in out, out


FORK_IN_A_BATCH_SCRIPT = CHILD_PREAMBLE + textwrap.dedent("""
    import os, sys, threading, time, warnings
    from _device import Hold, wait_or_kill

    warnings.simplefilter("ignore", DeprecationWarning)  # fork() with threads: the point
    release = threading.Event()
    for attempt in range(20):
        started = threading.Event()
        where = []

        def hold_the_batch(*_):
            where.append(threading.current_thread().name)
            started.set()
            if threading.current_thread() is not threading.main_thread():
                release.wait()  # the batch's lock stays held across the fork

        with Hold(stream):  # the signal comes only once this thread waits
            if "{which}" == "futures":
                nh.done_future(stream).add_done_callback(hold_the_batch)
            else:
                nh.host_launch(stream, hold_the_batch, blocking=False)
        started.wait()
        if where[0] != "MainThread":  # else the main thread's pending call ran it: again
            break
    print("batch held by", where[0], flush=True)
    pid = os.fork()
    if pid == 0:
        try:
            nh.drain()
            print("child: drain accepted", flush=True)
        except RuntimeError as exc:
            print("child: drain refused", "'spawn'" in str(exc), flush=True)
        os._exit(0)
    if wait_or_kill(pid) is None:
        print("parent: the child hung", flush=True)
    release.set()
    stream.sync()
    nh.drain()
    print("parent: done", flush=True)
""")


@pytest.mark.parametrize("which", ["callbacks", "futures"])
def test_a_forked_childs_drain_is_refused_while_the_parent_was_inside_a_batch(which):
    """fork() while numba_hostfn's callbacks (or futures) thread is inside a batch: the
    child's drain() raises the RuntimeError naming 'spawn' at once (it ran the batches
    first, and waited for ever on the batch lock that no thread of the child holds)."""
    out = run_child(FORK_IN_A_BATCH_SCRIPT.format(which=which), timeout=120)
    assert f"batch held by numba_hostfn-{which}" in out, out
    assert "child: drain refused True" in out and "parent: done" in out, out


FORK_WITH_A_CALLBACK_DUE_SCRIPT = CHILD_PREAMBLE + textwrap.dedent("""
    import ctypes, os, time, warnings
    import numba

    warnings.simplefilter("ignore", DeprecationWarning)  # fork() with threads: the point
    libc = ctypes.CDLL(None)
    usleep = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint)(("usleep", libc))
    cells = np.zeros(2, np.int64)  # [0]: the stream may go on; [1]: the signal has run
    CELLS = cells.ctypes.data

    @nh.host_callback
    def wait_for_the_fork(p):
        cell = carray(p, (2,), np.int64)
        while cell[0] == 0:
            usleep(100)

    @nh.host_callback
    def signal_has_run(p):
        carray(p, (2,), np.int64)[1] = 1

    # A fork handler of libc's, run inside fork(), after the last bytecode of
    # os.fork(), GIL held: the stream's signal runs, and asks for its pending call,
    # while no thread of the parent can run the callback first; the child
    # inherits the pending call.
    @numba.cfunc("void()")
    def before_fork():
        cell = carray(nh.as_voidptr(CELLS), (2,), np.int64)
        cell[0] = 1
        while cell[1] == 0:
            usleep(100)

    register_atfork = libc.__register_atfork  # pthread_atfork is libc_nonshared's
    register_atfork.argtypes = [ctypes.c_void_p] * 4
    def say(line):  # one write: the two processes share the pipe
        os.write(1, (line + "\\n").encode())

    parent = os.getpid()
    nh.host_launch(stream, wait_for_the_fork, user_data=nh.by_ref(cells))
    nh.host_launch(
        stream,
        lambda: say("callback ran in the " + ("parent" if os.getpid() == parent else "child")),
        blocking=False,
    )
    nh.host_launch(stream, signal_has_run, user_data=nh.by_ref(cells))
    assert register_atfork(before_fork.address, None, None, None) == 0
    pid = os.fork()
    if pid == 0:
        for _ in range(1000):  # Python code: a pending call would run here
            pass
        say("child: exits")
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    stream.sync()
    deadline = time.monotonic() + 30
    while nh.pending() and time.monotonic() < deadline:
        nh.drain()
        time.sleep(0.01)
    print("parent:", os.waitstatus_to_exitcode(status), nh.pending(), flush=True)
""")


def test_a_forked_child_never_runs_the_parents_nonblocking_callbacks():
    """fork() while a non-blocking callback's signal has run and its pending call is
    scheduled: the child inherits the pending call, which must not run the parent's
    due batch there (the callback ran in both processes)."""
    out = run_child(FORK_WITH_A_CALLBACK_DUE_SCRIPT).splitlines()
    assert "child: exits" in out and "parent: 0 0" in out, out
    assert out.count("callback ran in the parent") == 1, out
    assert "callback ran in the child" not in out, out


FORK_WITH_A_FUTURE_PENDING_SCRIPT = CHILD_PREAMBLE + textwrap.dedent("""
    import concurrent.futures, os, warnings

    warnings.simplefilter("ignore", DeprecationWarning)  # fork() with threads: the point
    other = device.create_stream()
    settled = nh.done_future(other)
    settled.result(timeout=30)
    device.delay(stream, 0.5)
    future = nh.done_future(stream)
    on_driver = nh.done_future(stream)
    on_driver._watch = (0, 0)  # as on the driver's thread: nothing to watch
    print("watched:", future._watch[1] != 0, flush=True)
    pid = os.fork()
    if pid == 0:
        import signal

        signal.alarm(20)  # a wait that hangs ends the child: the parent says so
        def watch(*args):
            raise AssertionError("the parent's lane watched in a forked child")

        nh._core.lane_reached = watch
        waits = {
            "result(0.1)": lambda: future.result(timeout=0.1),
            "result()": future.result,
            "exception()": future.exception,
            "driver result()": on_driver.result,
            "wait()": lambda: concurrent.futures.wait([future]),
            "as_completed()": lambda: list(concurrent.futures.as_completed([on_driver])),
            # with a future of the child's own, not done: the wait cannot tell whether
            # that one would end it, and is refused as documented (errors.md)
            "mixed wait()": lambda: concurrent.futures.wait(
                [future, concurrent.futures.Future()],
                return_when=concurrent.futures.FIRST_COMPLETED,
            ),
        }
        for name, wait in waits.items():
            try:
                wait()
                print("child:", name, "returned", flush=True)
            except RuntimeError as exc:
                print("child:", name, "refused" if "'spawn'" in str(exc) else exc, flush=True)
        print("child: settled", settled.result() is other, flush=True)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    print("parent:", os.waitstatus_to_exitcode(status), future.result(timeout=30) is stream,
          on_driver.result(timeout=30) is stream, flush=True)
""")


def test_a_forked_child_does_not_watch_the_parents_done_future():
    """A done_future made in the parent and not done at fork, waited on in a forked
    child: no thread there will ever set it, so result(), exception(),
    concurrent.futures.wait() and as_completed() raise the RuntimeError that names
    'spawn' (before, they waited until their timeout, or for ever), a wait over it and
    a future of the child's own with FIRST_COMPLETED too (as documented), without
    watching the lane's words (no stream of the child writes them, and the parent's
    pinned memory need not be mapped there); one done before fork gives its result,
    and the parent's resolve."""
    out = run_child(FORK_WITH_A_FUTURE_PENDING_SCRIPT, timeout=60).splitlines()
    assert "watched: True" in out, out
    waits = ("result(0.1)", "result()", "exception()", "driver result()", "wait()", "mixed wait()")
    for name in waits:
        assert f"child: {name} refused" in out, out
    assert "child: as_completed() refused" in out, out
    assert "child: settled True" in out and "parent: 0 True True" in out, out


FORK_WITH_A_FUTURE_DONE_SCRIPT = CHILD_PREAMBLE + textwrap.dedent("""
    import concurrent.futures, os, warnings
    from _device import fork_child_waits_over

    warnings.simplefilter("ignore", DeprecationWarning)  # fork() with threads: the point
    settled = nh.done_future(stream)
    settled.result(timeout=30)
    pid = os.fork()
    if pid == 0:
        fork_child_waits_over(settled)
        try:
            list(concurrent.futures.as_completed([settled, concurrent.futures.Future()], 0.1))
        except concurrent.futures.TimeoutError:
            print("child: as_completed timed out", flush=True)
        except RuntimeError as exc:
            print("child: as_completed raised", exc, flush=True)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    print("parent:", os.waitstatus_to_exitcode(status), flush=True)
""")


def test_a_forked_childs_wait_over_a_done_future_done_at_fork_is_not_refused():
    """A done_future done before fork() is only a result in the child:
    concurrent.futures.wait() and as_completed() over it and the child's own futures
    wait for those as they would without it (before, its waiters list gave the wait
    the event that refuses a forked child's wait, so they raised the RuntimeError
    that names 'spawn')."""
    out = run_child(FORK_WITH_A_FUTURE_DONE_SCRIPT, timeout=60).splitlines()
    assert "child: wait 2 0" in out, out
    assert "child: as_completed timed out" in out and "parent: 0" in out, out


FORK_WITH_A_FUTURE_CANCELLED_SCRIPT = CHILD_PREAMBLE + textwrap.dedent("""
    import concurrent.futures, os, warnings

    warnings.simplefilter("ignore", DeprecationWarning)  # fork() with threads: the point
    device.delay(stream, 0.5)
    future = nh.done_future(stream)
    # Cancelled, its waiters not told yet: the futures thread tells them when the
    # stream gets there (concurrent.futures counts it done only then).
    print("cancelled:", future.cancel(), flush=True)
    pid = os.fork()
    if pid == 0:
        import signal

        signal.alarm(20)  # a wait that hangs ends the child: the parent says so
        waits = {
            "wait()": lambda: concurrent.futures.wait([future], timeout=5),
            "as_completed()": lambda: list(concurrent.futures.as_completed([future], 5)),
        }
        for name, wait in waits.items():
            try:
                wait()
                print("child:", name, "returned", flush=True)
            except concurrent.futures.TimeoutError:
                print("child:", name, "timed out", flush=True)
            except RuntimeError as exc:
                print("child:", name, "refused" if "'spawn'" in str(exc) else exc, flush=True)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    done, _ = concurrent.futures.wait([future], timeout=30)
    print("parent:", os.waitstatus_to_exitcode(status), done == {future}, flush=True)
""")


def test_a_forked_childs_wait_on_a_done_future_cancelled_before_fork_is_refused():
    """A done_future cancelled before fork() whose stream had not got there: its
    waiters are told by the futures thread when the stream gets there, so
    concurrent.futures.wait() and as_completed() count it as not done until then. In
    the child no thread will ever tell them: the waits are refused, as for a future
    not done at fork (before, the waiters list took the cancelled future for a done
    one, and the waits hung until their timeout, or for ever).  The parent's wait
    returns once its stream gets there."""
    out = run_child(FORK_WITH_A_FUTURE_CANCELLED_SCRIPT, timeout=60).splitlines()
    assert "cancelled: True" in out, out
    assert "child: wait() refused" in out, out
    assert "child: as_completed() refused" in out, out
    assert "parent: 0 True" in out, out


FORK_IN_A_DONE_CALLBACK_SCRIPT = CHILD_PREAMBLE + textwrap.dedent("""
    import os, threading, warnings
    from _device import Hold, fork_child_waits_over

    warnings.simplefilter("ignore", DeprecationWarning)  # fork() with threads: the point
    settled = nh.done_future(stream)
    settled.result(timeout=30)
    forked, statuses = threading.Event(), []

    def fork_here(_):  # on the futures thread, inside its batch
        pid = os.fork()
        if pid == 0:
            fork_child_waits_over(settled)
            print("child: result", settled.result() is stream, flush=True)
            os._exit(0)
        statuses.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
        forked.set()

    with Hold(stream):  # not done yet: the futures thread runs the done callback
        nh.done_future(stream).add_done_callback(fork_here)
    forked.wait(60)
    print("parent:", statuses, flush=True)
""")


def test_a_child_forked_in_a_done_callback_waits_over_a_done_future_done_at_fork():
    """A child forked from a done callback (on the futures thread, inside its batch:
    the child's one thread is a copy of it) is a forked child like any other: a wait
    over a done_future done at fork and the child's own futures waits for those, as
    result() there returns.  Before, its waiters list took the copied batch for one
    running there and gave the wait the event that refuses a forked child's wait."""
    out = run_child(FORK_IN_A_DONE_CALLBACK_SCRIPT, timeout=60).splitlines()
    assert "child: wait 2 0" in out and "child: result True" in out, out
    assert "parent: [0]" in out, out


@pytest.mark.gpu
def test_a_cuda_call_from_a_compiled_body_gets_an_error_code(device, stream):
    """CUDA calls are not allowed in a host function; the driver may, but need not, refuse
    them with CUDA_ERROR_NOT_PERMITTED.  What a compiled body sees is the call's error
    code: on the H200, cuStreamQuery of its own stream answers CUDA_ERROR_NOT_READY
    (600), since the stream is inside this very host function.  Nothing hangs, and the
    stream goes on."""
    query = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)(
        ("cuStreamQuery", ctypes.CDLL("libcuda.so.1"))
    )

    @nh.host_callback
    def call_cuda(p):
        cell = carray(p, (2,), np.int64)
        cell[1] = query(nh.as_voidptr(cell[0]))

    cell = np.array([int(stream.handle), -1], np.int64)
    counter = np.zeros(1, np.int64)
    nh.host_launch(stream, call_cuda, user_data=nh.by_ref(cell))
    nh.host_launch(stream, _increment, user_data=nh.by_ref(counter))
    stream.sync()
    assert counter[0] == 1
    assert cell[1] in (600, 800), f"cuStreamQuery from a host function returned {cell[1]}"


CONTEXT_RESET = CHILD_PREAMBLE + textwrap.dedent("""
    import time
    from cuda.bindings import driver

    counter = np.zeros(1, np.int64)
    calls = []
    device.delay(stream, 0.5)
    for _ in range(1000):
        nh.host_launch(stream, increment, user_data=nh.by_ref(counter))
        nh.host_launch(stream, lambda: calls.append(1))
    before = nh.pending()
    err, dev = driver.cuDeviceGet(0)
    (rc,) = driver.cuDevicePrimaryCtxReset(dev)
    time.sleep(1.0)
    nh.drain()
    print("reset", int(rc), "pending", before, nh.pending(), "ran", int(counter[0]), len(calls),
          flush=True)
    # The reset destroyed the context that `stream` was made in.  cuda.core does not
    # support resets (cuda-python#1223): at exit its finalizer would call
    # cuStreamDestroy on the stale handle, which segfaulted inside libcuda in 26 of
    # 36 runs (native backtrace: cuStreamDestroy_v2 <- cuda.core's StreamHandle
    # deleter <- Py_FinalizeEx).  A program that resets keeps such objects, never
    # destroyed: one reference that is never given back.
    import ctypes
    for stale in (stream, device):
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(stale))
""")


@pytest.mark.gpu
def test_primary_context_reset_with_launches_pending_neither_hangs_nor_crashes():
    """Resetting the primary context under pending launches neither hangs nor crashes.
    On the H200 the reset first ran every pending host function (2,000 of 2,000, all
    released); launches the driver dropped instead would keep their owners (leaked,
    never freed under a thread that might still run them)."""
    out = run_child(CONTEXT_RESET)
    words = out.split()
    assert words[0] == "reset" and words[1] == "0", out
    before, after, ran_compiled, ran_python = map(int, words[3:5] + words[6:8])
    assert before == 2000 and ran_compiled == ran_python
    assert after == 2000 - ran_compiled - ran_python, out
    print(out)  # what the driver did, for docs/errors.md (pytest -s shows it)


IMPORT_ONLY_FORK_SCRIPT = """
import os, threading, time, warnings

warnings.simplefilter("ignore", DeprecationWarning)  # fork() with threads: the point
import numba_hostfn as nh  # imported, never used: no backend in this process

pid = os.fork()
if pid == 0:
    stream = nh.create_stream()
    ran = []
    nh.host_launch(stream, lambda: (time.sleep(0.2), ran.append("blocking")))
    nh.host_launch(stream, lambda: ran.append("non-blocking"), blocking=False)
    stream.close()  # waits for what was queued before it
    print("child: closed after", ran[:1], flush=True)
    nh.drain()
    print("child:", ran, nh.pending(), flush=True)
    os._exit(0)
_, status = os.waitpid(pid, 0)
print("parent: child status", status, flush=True)
"""


def test_a_child_of_a_process_that_only_imported_may_use_the_package():
    """The native fork flag is set only in a child of a process that had used
    numba_hostfn, as Python's is (LIFETIME.md, invariant 22): a child forked after a
    bare import uses the package fully, and a simulated close there still waits for
    the work queued before it (the flag set at import made it return at once)."""
    out = run_child(IMPORT_ONLY_FORK_SCRIPT, env=child_env(NUMBA_HOSTFN_SIMULATOR="1"))
    assert "child: closed after ['blocking']" in out, out
    assert "child: ['blocking', 'non-blocking'] 0" in out, out
    assert "parent: child status 0" in out, out


FORK_WHILE_BACKEND_IS_MADE_SCRIPT = textwrap.dedent("""
    import faulthandler
    faulthandler.enable()
    import os, threading, time, warnings
    import numba_hostfn as nh
    from numba_hostfn import _process
    from _device import wait_or_kill

    warnings.simplefilter("ignore", DeprecationWarning)  # fork() with threads: the point
    making = threading.Event()

    def slow_callback(backend):  # widens the window: backend creation (cuInit) takes time
        making.set()
        time.sleep(1.0)

    _process.on_backend(slow_callback)
    maker = threading.Thread(target=nh.pending)  # the first use, on another thread
    maker.start()
    making.wait()
    pid = os.fork()
    if pid == 0:
        try:
            nh.pending()
            print("child: used the package", flush=True)
        except RuntimeError as exc:
            print("child refused" if "'spawn'" in str(exc) else f"child: {exc}", flush=True)
        os._exit(0)
    status = wait_or_kill(pid, 10)
    maker.join()
    print("parent: child", "hung" if status is None else "exited", flush=True)
""")


def test_a_child_forked_while_another_thread_makes_the_backend_does_not_hang():
    """Invariant 22 (waits for nothing): a fork while another thread is inside
    get_backend() (its _lock held) leaves the child refused, as any child of a
    parent that used the package, not blocked for ever on that lock (before: the
    child's first call hung)."""
    out = run_child(FORK_WHILE_BACKEND_IS_MADE_SCRIPT, env=child_env(NUMBA_HOSTFN_SIMULATOR="1"))
    assert "parent: child exited" in out, out
    assert "child refused" in out, out
