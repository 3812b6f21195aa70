"""Interpreter exit with launches pending neither crashes nor hangs."""

import sys
import textwrap

import pytest
from _device import CHILD_PREAMBLE, run_child

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
