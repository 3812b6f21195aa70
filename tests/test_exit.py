"""Interpreter exit with launches pending neither crashes nor hangs."""

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
