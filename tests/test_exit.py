"""Interpreter exit with launches pending neither crashes nor hangs."""

import sys
import textwrap

import pytest
from _device import CHILD_PREAMBLE, run_child

import numba_hostfn as nh
from numba_hostfn import _executor

EXIT_SCRIPT = CHILD_PREAMBLE + textwrap.dedent("""
    counter = np.zeros(1, np.int64)
    calls = []
    device.delay(stream, {delay})
    for i in range({n}):
        nh.host_launch(stream, increment, user_data=nh.by_ref(counter))
        nh.host_launch(stream, lambda: calls.append(1))
        nh.host_launch(stream, increment, user_data=bytes(8))
    print("pending", nh.pending(), flush=True)
""")


@pytest.mark.parametrize(
    "delay, blocked",
    [(0.0, False), (2.0, True)],
    ids=["host-functions-running-at-exit", "stream-blocked-at-exit"],
)
def test_exit_with_thousands_of_launches_pending(delay, blocked):
    n = 3000
    out = run_child(EXIT_SCRIPT.format(n=n, delay=delay), timeout=90)
    assert "pending" in out
    pending = int(out.split()[1])
    assert 0 <= pending <= 3 * n
    if blocked:  # the stream is still in its delay: nothing has run at exit
        assert pending == 3 * n


WORKER_AT_EXIT_SCRIPT = CHILD_PREAMBLE + textwrap.dedent("""
    import atexit, threading, time

    executor = nh.HostExecutor(threads=1)

    def another_librarys_handler():  # registered after numba_hostfn's: runs before it
        nh.host_launch(stream, lambda: print("atexit callable ran", flush=True))
        stream.sync()
        print("atexit handler synced", flush=True)

    atexit.register(another_librarys_handler)

    def work():
        # Start once the main thread has returned and exit has begun: threading's
        # exit hooks have run by the time the main thread is marked stopped.
        while threading.main_thread().is_alive():
            time.sleep(0.01)
        for i in range({n}):
            nh.host_launch(stream, lambda: print("callable ran", flush=True))
        stream.sync()
        nh.host_launch(stream, lambda: print("task ran", flush=True), executor=executor)
        stream.sync()
        print("worker done", flush=True)

    threading.Thread(target=work).start()  # not a daemon: exit waits for it
    print("main returns", flush=True)
""")


def test_a_non_daemon_threads_python_work_runs_after_the_main_thread_returns():
    """Exit closes the interpreter guard only once the non-daemon threads have ended:
    a worker's blocking Python callables and its executor task all run (threading's
    exit hooks run before those threads are joined, and closing there skipped them);
    and still before another library's atexit handler, even one registered later."""
    n = 20
    out = run_child(WORKER_AT_EXIT_SCRIPT.format(n=n), timeout=90).splitlines()
    assert out.count("callable ran") == n and out.count("task ran") == 1, out
    assert out[-2:] == ["worker done", "atexit handler synced"], out
    assert "atexit callable ran" not in out, "the guard closes before other atexit handlers"


DRAIN_SCHEDULED_BEFORE_THE_CLOSE_SCRIPT = CHILD_PREAMBLE + textwrap.dedent("""
    import collections, ctypes, functools, operator, os
    from numba_hostfn import _core

    libc = ctypes.CDLL(None)
    libc_read, libc_write = libc.read, libc.write
    for f in (libc_read, libc_write):
        f.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t)
        f.restype = ctypes.c_ssize_t

    @nh.host_callback
    def read_a_byte(p):  # p -> int64[2]: [fd, byte]
        a = carray(p, (2,), np.int64)
        libc_read(a[0], a[1:].ctypes.data, 1)

    @nh.host_callback
    def write_a_byte(p):
        a = carray(p, (2,), np.int64)
        libc_write(a[0], a[1:].ctypes.data, 1)

    gate_r, gate_w = os.pipe()
    done_r, done_w = os.pipe()
    gate = np.array([gate_r, 0], np.int64)
    done = np.array([done_w, 0], np.int64)
    nh.host_launch(stream, read_a_byte, user_data=nh.by_ref(gate))
    nh.host_launch(stream, write_a_byte, user_data=nh.by_ref(done))
    # Open the gate, wait for the stream, and close the guard as the exit hook does,
    # in native calls only: no bytecode runs between them, so the drain that the
    # first host function's completion scheduled is still pending at the close.
    steps = [
        functools.partial(os.write, gate_w, b"x"),
        functools.partial(os.read, done_r, 1),
        functools.partial(_core.close_guard, 2000),
    ]
    collections.deque(map(operator.methodcaller("__call__"), steps), maxlen=0)
    for _ in range(1000):  # bytecode: the pending call runs here
        pass
    print("held", nh.pending(), flush=True)
""")


def test_a_drain_scheduled_before_the_close_releases_nothing_after_it():
    """Once the guard is closed, records not yet drained keep their owners for ever:
    a pending-call drain that a completion scheduled before the close, and that runs
    after it, releases nothing (invariant 6: leak rather than dangle).  The close is
    _core.close_guard itself, as the exit hook calls it."""
    out = run_child(DRAIN_SCHEDULED_BEFORE_THE_CLOSE_SCRIPT, timeout=90).split()
    assert out == ["held", "2"], f"a drain after the close released records: {out}"


KEPT_GIL_AFTER_CLOSE_SCRIPT = CHILD_PREAMBLE + textwrap.dedent("""
    import atexit, ctypes, time
    import numba

    usleep = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint)(("usleep", ctypes.CDLL(None)))

    @nh.host_callback
    def gate(p):
        flag = carray(p, (1,), np.int64)
        while flag[0] == 0:  # until the atexit handler below: the guard is closed by then
            usleep(1000)

    @numba.cfunc("void(voidptr)")
    def plain_cfunc_print(p):  # no Environment: print's check returns holding the GIL
        print(carray(p, (1,), np.int64)[0])

    flag, x = np.zeros(1, np.int64), np.array([41], np.int64)
    executor = nh.HostExecutor(threads=1)
    other = device.create_stream()
    for s, ex in ((stream, None), (other, executor)):
        nh.host_launch(s, gate, user_data=nh.by_ref(flag))
        nh.host_launch(s, plain_cfunc_print, user_data=x.ctypes.data, executor=ex)

    def another_librarys_handler():  # registered before exit: runs after the close
        flag[0] = 1
        time.sleep(0.5)  # the GIL released, as any handler doing I/O
        print("handler done", flush=True)

    atexit.register(another_librarys_handler)
    print("main returns", flush=True)
""")


def test_a_body_that_keeps_the_gil_after_the_guard_closed_does_not_hang_exit():
    """Invariant 13 at exit: a compiled body that returns holding the GIL after the
    guard closed (another atexit handler released the GIL meanwhile) gives it back,
    on the driver's thread and an executor's; else the main thread never gets the
    GIL again and exit hangs."""
    out = run_child(KEPT_GIL_AFTER_CLOSE_SCRIPT, timeout=30, quiet=False).splitlines()
    assert out == ["main returns", "handler done"], out


SUB_INTERPRETER_CODE = textwrap.dedent("""
    import sys
    sys.path[:0] = {path!r}
    try:
        import numba_hostfn as nh
        from numba_hostfn.simulator import Stream
        nh.done_future(Stream()).result(5)  # starts the futures thread, a daemon
        print("sub-interpreter: used the package", flush=True)
    except ImportError as exc:
        print("sub-interpreter: refused:", exc, flush=True)
""")

SUB_INTERPRETER_SCRIPT = textwrap.dedent("""
    import faulthandler
    import sys
    faulthandler.enable()
    if sys.version_info >= (3, 13):
        import _interpreters as interps
        iid = interps.create("legacy")  # shared GIL, as mod_wsgi's
        interps.exec(iid, {code!r})
    else:
        import _xxsubinterpreters as interps
        iid = interps.create(isolated=False)
        interps.run_string(iid, {code!r})
    interps.destroy(iid)
    print("main: survived", flush=True)
""")


@pytest.mark.skipif(sys.version_info < (3, 12), reason="creating a legacy sub-interpreter")
def test_a_legacy_sub_interpreter_is_refused_at_import_not_aborted_at_its_end():
    """Scope: one interpreter.  A legacy sub-interpreter that imported the package
    ran its daemon threads, and its end aborted the process (Py_EndInterpreter: not
    the last thread); its exit hook would close the guard for the whole process.
    Up to 3.12 the module's init refuses it; from 3.13 CPython runs that init in
    the main interpreter, and the package's __init__ refuses it."""
    code = SUB_INTERPRETER_CODE.format(path=sys.path)
    out = run_child(SUB_INTERPRETER_SCRIPT.format(code=code), timeout=60).splitlines()
    assert out[0].startswith("sub-interpreter: refused: numba_hostfn runs in the main"), out
    assert out[-1] == "main: survived", out


FIRST_USE_AT_EXIT_SCRIPT = CHILD_PREAMBLE.replace(
    "device = Device()\nstream = device.create_stream()\n", ""
) + textwrap.dedent("""
    import atexit

    streams = []

    def another_librarys_handler():  # registered first: runs after first_use_at_exit
        nh.host_launch(streams[0], lambda: print("later handler's callable ran", flush=True))
        streams[0].sync()
        print("later handler synced", flush=True)

    def first_use_at_exit():  # the process's first use of numba_hostfn, once exit began
        device = Device()
        streams.append(device.create_stream())
        nh.host_launch(streams[0], lambda: None)
        streams[0].sync()
        print("first use synced", flush=True)

    atexit.register(another_librarys_handler)
    atexit.register(first_use_at_exit)
    print("main returns", flush=True)
""")


def test_a_first_use_inside_an_atexit_handler_still_closes_the_guard():
    """Invariant 6 when the package is first used inside an atexit handler: its exit
    hook, registered then, was never called (atexit does not call a handler registered
    while the handlers run), so the guard stayed open through every later handler and
    the interpreter's finalization: a later handler's Python callable ran, and a
    trampoline could wait for the GIL behind a handler that holds it."""
    out = run_child(FIRST_USE_AT_EXIT_SCRIPT, timeout=90).splitlines()
    assert out[:2] == ["main returns", "first use synced"], out
    assert out[-1] == "later handler synced", out
    assert "later handler's callable ran" not in out, "the guard was never closed"


DUE_CALLBACKS_AT_EXIT_SCRIPT = CHILD_PREAMBLE + textwrap.dedent("""
    import os, sys, threading, time

    def say(line):  # one write: two threads print here
        os.write(1, (line + "\\n").encode())

    def once_exit_began(what):
        # On numba_hostfn's helper thread, a daemon, still running when exit begins:
        # the interpreter's finalization stopped it in the middle.  (On the main
        # thread, where a pending call may run it, exit has not begun.)
        if threading.current_thread() is not threading.main_thread():
            while threading.main_thread().is_alive():
                time.sleep(0.01)
            time.sleep(0.3)
        say(what + " done")

    device.delay(stream, 0.1)
    nh.host_launch(stream, lambda: once_exit_began("non-blocking callback"), blocking=False)
    for i in range(3):
        nh.host_launch(stream, lambda i=i: say(f"quick callback {{i}}"), blocking=False)
    future = nh.done_future(stream)
    future.add_done_callback(lambda f: once_exit_began("done callback"))
    device.delay(stream, 0.2)  # the helper threads take their batches meanwhile
    stream.sync()  # the stream got there: each of them is due
    say("main returns")
    if {exit!r}:
        sys.exit(0)
""")


@pytest.mark.parametrize("exit", [False, True], ids=["main-returns", "sys-exit"])
def test_callbacks_whose_stream_got_there_before_exit_all_run(exit):
    """docs/asyncio.md, "Interpreter exit": non-blocking callbacks and done_future
    results whose stream got there (synchronized) before the program ended run, and
    their done callbacks too.  They ran on numba_hostfn's helper threads, daemons, and
    exit did not wait for them: a callback still running was stopped in the middle,
    and those not yet started never ran.  Exit now runs what is due, after the
    non-daemon threads, waiting for a batch under way first."""
    out = run_child(DUE_CALLBACKS_AT_EXIT_SCRIPT.format(exit=exit), timeout=90).splitlines()
    assert sorted(out) == sorted(
        ["main returns", "non-blocking callback done", "done callback done"]
        + [f"quick callback {i}" for i in range(3)]
    ), out
    assert out.index("quick callback 2") > out.index("quick callback 1"), out


CTRL_C_AS_EXIT_BEGINS_SCRIPT = CHILD_PREAMBLE + textwrap.dedent("""
    import atexit, sys, threading

    def another_librarys_handler():  # registered after numba_hostfn's: runs after the close
        nh.host_launch(stream, lambda: print("later handler's callable ran", flush=True))
        stream.sync()
        print("later handler synced", flush=True)

    def first_handler():  # registered last: the first after numba_hostfn's
        print("first handler ran", flush=True)

    atexit.register(another_librarys_handler)
    atexit.register(first_handler)
    calls = []

    def ctrl_c_as_an_atexit_handler_begins(frame, event, arg):
        # A Ctrl-C that lands as a handler begins (a signal that arrived while the
        # interpreter ran C code between two handlers, or between threading's
        # _shutdown and the first): raised where the {nth}th Python function that the
        # interpreter calls itself once exit began, outside threading's _shutdown,
        # starts.
        if (
            event == "call"
            and frame.f_back is None
            and not threading.main_thread().is_alive()
            and frame.f_code.co_filename != threading.__file__
        ):
            calls.append(frame.f_code.co_name)
            if len(calls) == {nth}:
                print("ctrl-c in", frame.f_code.co_name, flush=True)
                raise KeyboardInterrupt
        return None

    sys.settrace(ctrl_c_as_an_atexit_handler_begins)
    print("main returns", flush=True)
""")


def test_a_ctrl_c_as_exit_begins_still_closes_the_guard():
    """Invariant 6 under a Ctrl-C at exit: the exit hook is the native close itself, so
    no line of Python runs before the guard is closed.  A Python method there, raised
    into at its first line, was skipped whole: the guard stayed open through every
    later atexit handler and the interpreter's finalization (a later handler's Python
    callable ran, where a trampoline could wait for the GIL behind a handler holding it).
    A Ctrl-C at the start of each Python function that exit calls, in turn, up to the
    first handler of the program's own, leaves the guard closed."""
    interrupted = []
    for nth in range(1, 6):
        script = CTRL_C_AS_EXIT_BEGINS_SCRIPT.replace("{nth}", str(nth))
        out = run_child(script, timeout=90, quiet=False).splitlines()
        assert "later handler's callable ran" not in out, f"the guard was never closed: {out}"
        assert out[0] == "main returns" and out[-1] == "later handler synced", out
        interrupted += [line for line in out if line.startswith("ctrl-c in")]
        if interrupted[-1:] == ["ctrl-c in first_handler"]:
            break
    assert interrupted[-1:] == ["ctrl-c in first_handler"], interrupted


CTRL_C_MOVING_THE_CLOSE_SCRIPT = CHILD_PREAMBLE + textwrap.dedent("""
    import atexit, os, sys, threading

    package = os.path.dirname(nh.__file__)
    nh.host_launch(stream, lambda: None)  # the records made: their close registered
    stream.sync()
    nh.drain()

    def another_librarys_handler():  # registered after the close: runs after it, moved
        nh.host_launch(stream, lambda: print("later handler's callable ran", flush=True))
        stream.sync()
        print("later handler synced", flush=True)

    atexit.register(another_librarys_handler)

    def ctrl_c_in_our_threading_exit_hooks(frame, event, arg):
        # A Ctrl-C lands between two bytecodes: one raised as a Python function of
        # numba_hostfn that threading's _shutdown calls (its exit hooks) begins.
        caller = frame.f_back
        if (
            event == "call"
            and caller is not None
            and caller.f_code.co_name == "_shutdown"
            and caller.f_code.co_filename == threading.__file__
            and frame.f_code.co_filename.startswith(package)
        ):
            print("ctrl-c in", frame.f_code.co_name, flush=True)
            raise KeyboardInterrupt
        return None

    sys.settrace(ctrl_c_in_our_threading_exit_hooks)
    print("main returns", flush=True)
""")


def test_the_move_of_the_close_to_the_front_of_atexit_runs_no_python():
    """Invariant 6 under a Ctrl-C in the threading exit hooks that move the guard's
    close (and the other first handlers) to the front of the atexit handlers: each
    hook is one native call (``_core.to_front_of_atexit``), so no Ctrl-C lands inside
    it, and the close runs before a handler registered after the first use.  The hook
    was a Python function that unregistered the close, then registered it again: a
    Ctrl-C between its two lines lost the close for good, one before them left it
    behind the program's handlers, and a later handler's Python callable ran with the
    guard open."""
    out = run_child(CTRL_C_MOVING_THE_CLOSE_SCRIPT, timeout=90, quiet=False).splitlines()
    assert out == ["main returns", "later handler synced"], out


FORK_WITH_A_CALLABLE_INSIDE_SCRIPT = CHILD_PREAMBLE + textwrap.dedent("""
    import os, threading, warnings
    from numba_hostfn import _process
    from _device import wait_or_kill

    warnings.simplefilter("ignore", DeprecationWarning)  # fork() with threads: the point
    inside, release = threading.Event(), threading.Event()

    def inside_at_fork():  # a trampoline inside CPython when the parent forks
        inside.set()
        release.wait(60)

    nh.host_launch(stream, inside_at_fork)
    inside.wait(60)
    pid = os.fork()
    if pid == 0:
        # The exit hook, as atexit calls it: how many threads it found still inside.
        print("child: exit hook left", _process._backend.records._at_exit(), flush=True)
        os._exit(0)
    status = wait_or_kill(pid)
    release.set()
    stream.sync()
    print("parent:", None if status is None else os.waitstatus_to_exitcode(status), flush=True)
""")


def test_a_forked_childs_exit_hook_waits_for_no_thread_of_the_parent():
    """Invariant 22 through the native exit hook: a child forked while a Python callable
    of the parent was inside CPython copies the count of threads inside, but none of
    those threads; its close finds the fork flag and waits for nothing (else 2 s for a
    thread that does not exist, then reports it still inside)."""
    out = run_child(FORK_WITH_A_CALLABLE_INSIDE_SCRIPT, timeout=90).splitlines()
    assert out == ["child: exit hook left 0", "parent: 0"], out


def test_an_executor_collected_after_its_modules_globals_are_cleared_still_closes(
    monkeypatch,
):
    """At interpreter exit an open HostExecutor may be collected after the modules'
    globals were set to None (one that still holds the executor module is cleared
    first): its __del__ still stops its threads.  It raised TypeError ("Exception
    ignored in HostExecutor.__del__ ... 'NoneType' object is not callable"), as
    Stream.__del__ did (issue 31), and left the pool running."""
    executor = nh.HostExecutor(threads=2)
    monkeypatch.setattr(_executor, "forked", None)
    monkeypatch.setattr(_executor, "get_backend", None)
    executor.__del__()  # as the collector calls it at exit
    monkeypatch.undo()
    assert executor.closed, executor
