"""The simulator's own surface: what it models, and the clear errors for what it does not."""

import functools
import gc
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from _device import (
    assert_no_ignored_errors,
    child_env,
    rerun_on_simulator,
    resizable,
    run_at_line,
    run_child,
    threads_but_watchdog,
)
from numba import carray

import numba_hostfn as nh
import numba_hostfn._graphs
import numba_hostfn._simulator
from numba_hostfn import _core


@nh.host_callback
def increment(p):
    carray(p, (1,), np.int64)[0] += 1


def _settled(count, seconds=10):
    """True once this process has ``count`` native threads or fewer (a detached or
    joined thread can stay listed for a moment after it ends)."""
    deadline = time.monotonic() + seconds
    while threads_but_watchdog() > count and time.monotonic() < deadline:
        time.sleep(0.01)
    return threads_but_watchdog() <= count


def test_streams_run_independently(request):
    if rerun_on_simulator(request):
        return
    with nh.simulator.Stream() as slow, nh.simulator.Stream() as fast:
        counter = np.zeros(1, np.int64)
        slow.sleep(5)
        nh.host_launch(fast, increment, user_data=nh.by_ref(counter))
        fast.sync()  # does not wait for the other stream's five seconds
        assert counter[0] == 1
        assert not slow.is_done()
        slow.close()  # runs what is queued, then stops
        assert fast.is_done()


def test_stream_surface(request):
    if rerun_on_simulator(request):
        return
    s = nh.simulator.Stream()
    version, handle = s.__cuda_stream__()
    assert version == 0 and handle == s.handle
    assert "open" in repr(s)
    s.sync()
    assert s.is_done()
    s.close()
    s.close()  # idempotent
    assert "closed" in repr(s)
    with pytest.raises(RuntimeError, match="closed"):
        nh.host_launch(s, increment, user_data=np.zeros(1, np.int64))
    with pytest.raises(RuntimeError, match="closed"):
        s.sync()
    assert nh.pending() == 0


def test_a_host_function_that_waits_for_a_stream_is_refused(request, unraisables):
    """A Python callable on the simulated host-function thread that syncs or
    closes a stream gets RuntimeError, as CUDA forbids a host function any CUDA
    call (it waited for itself: main hung for ever)."""
    if rerun_on_simulator(request):
        return
    seen = []

    def waits(s):
        for wait in (s.sync, s.close):
            try:
                wait()
            except RuntimeError as exc:
                seen.append("host function" in str(exc))

    with nh.simulator.Stream() as s, nh.simulator.Stream() as other:
        nh.host_launch(s, lambda: waits(s))
        nh.host_launch(s, lambda: waits(other))
        s.sync()
        nh.drain()
        assert seen == [True] * 4 and not unraisables
        other.sync()  # both streams still work
        nh.host_launch(other, increment, user_data=np.zeros(1, np.int64))
        other.sync()


def test_a_host_function_that_queries_a_stream_or_makes_one_or_a_context_is_refused(
    request, unraisables
):
    """A host function that asks a stream is_done() (cuStreamQuery), makes a stream
    (cuStreamCreate: simulator.Stream(), create_stream()) or a new context gets
    RuntimeError, with no stream made and the context as it was: CUDA forbids a
    host function any CUDA call.  The simulator answered all three, so a program
    that passed here could fail or deadlock on a GPU."""
    if rerun_on_simulator(request):
        return
    seen = []
    threads = threads_but_watchdog()
    try:
        with nh.simulator.Stream() as s, nh.simulator.Stream() as other:
            calls = {
                "is_done": other.is_done,
                "Stream()": nh.simulator.Stream,
                "create_stream()": nh.create_stream,
                "new_context()": nh.simulator.new_context,
            }

            def asks():
                for name, call in calls.items():
                    try:
                        call()
                        seen.append((name, "answered"))
                    except RuntimeError as exc:
                        message = str(exc)
                        seen.append((name, "CUDA forbids a host function any CUDA call" in message))

            nh.host_launch(s, asks)
            s.sync()
            nh.drain()
            assert seen == [(name, True) for name in calls] and not unraisables
            # The context is the one it was: a stream made now shares other's fault.
            with nh.simulator.Stream() as third:
                other.fault()
                with pytest.raises(nh.DeviceFaultError):
                    other.sync()  # the fault has run
                with pytest.raises(nh.DeviceFaultError):
                    third.sync()
    finally:
        nh.simulator.new_context()  # the next test's streams: a healthy context
    assert _settled(threads), threads_but_watchdog() - threads


def test_a_host_function_that_enqueues_is_refused(request, unraisables):
    """A host function that launches, copies, replays a graph, sleeps a stream,
    signals or uses an executor gets RuntimeError with nothing enqueued: CUDA
    forbids a host function any CUDA call (the simulator ran them all)."""
    if rerun_on_simulator(request):
        return
    counter = np.zeros(1, np.int64)
    src, dst = bytearray(b"abcd"), bytearray(4)
    seen = []

    with nh.simulator.Stream() as s, nh.simulator.Stream() as other, nh.simulator.Stream() as third:
        other.begin_capture()
        nh.host_launch(other, increment, user_data=nh.by_ref(counter))
        graph = other.end_capture()
        builder = third.create_graph_builder().begin_building()
        executor = nh.HostExecutor(threads=1)
        calls = {
            "native host_launch": lambda: nh.host_launch(other, increment, user_data=counter),
            "python host_launch": lambda: nh.host_launch(other, functools.partial(seen.append, 0)),
            "host_copy": lambda: nh.host_copy(other, dst, src),
            "release_after": lambda: nh.release_after(other, src),
            "blocking=False": lambda: nh.host_launch(other, print, blocking=False),
            "executor": lambda: nh.host_launch(other, print, executor=executor),
            "sleep": lambda: other.sleep(0),
            "graph launch": lambda: graph.launch(other),
            "builder": lambda: nh.host_launch(builder, increment, user_data=counter),
        }

        def enqueues():
            for name, call in calls.items():
                try:
                    call()
                    seen.append((name, "enqueued"))
                except RuntimeError as exc:
                    seen.append((name, "host function" in str(exc)))

        nh.host_launch(s, enqueues)
        s.sync()
        nh.drain()
        assert seen == [(name, True) for name in calls] and not unraisables
        assert other.is_done()
        assert counter[0] == 0 and dst == bytearray(4)
        # Nothing was captured either, and the stream, graph and executor still work.
        builder.end_building()
        assert third.is_done()  # asked once the capture ended: CUDA forbids it before
        built = builder.complete()
        built.launch(other)
        graph.launch(other)
        nh.host_launch(other, increment, user_data=nh.by_ref(counter))
        nh.host_copy(other, dst, src, executor=executor)
        other.sync()
        assert counter[0] == 2 and dst == src
        for closing in (built, builder, graph, executor):
            closing.close()


def test_a_second_close_waits_until_the_queued_work_has_run(request):
    """Two closes at once: the one that comes second returns only once the queued
    work has run, like the first (it returned at once, before the work had run)."""
    if rerun_on_simulator(request):
        return
    gate, seen = threading.Event(), []
    s = nh.simulator.Stream()
    nh.host_launch(s, lambda: gate.wait(60))
    nh.host_launch(s, lambda: seen.append("ran"))
    first = threading.Thread(target=s.close)
    first.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # until the first close has stopped the stream
        try:
            nh.host_launch(s, lambda: None)
        except RuntimeError:
            break
        time.sleep(0.001)
    threading.Timer(0.3, gate.set).start()  # the first close still joins meanwhile
    s.close()  # the second
    assert seen == ["ran"]
    first.join(60)
    assert not first.is_alive() and _core._testing.sim_pending(s.handle) == 0


def test_a_stream_collected_after_its_modules_globals_are_cleared_still_closes(
    request, monkeypatch, unraisables
):
    """At interpreter exit a stream may be collected after the modules' globals
    were set to None: its __del__ still stops its thread (it raised TypeError)."""
    if rerun_on_simulator(request):
        return
    s = nh.simulator.Stream()
    handle = s.handle
    monkeypatch.setattr(numba_hostfn._simulator, "_core", None)
    monkeypatch.setattr(numba_hostfn._simulator, "forked", None)
    del s
    gc.collect()
    monkeypatch.undo()
    assert not unraisables
    assert _core.sim_enqueue(handle, _core.SIM_DELAY, 0, True) == _core.QUEUE_STOPPED


_MODULE_LEVEL_STREAM = """
import numpy as np
import numba_hostfn as nh

nh.simulate_without_gpu()
stream = nh.create_stream()
STATS = np.dtype([("count", np.int64)])


@nh.host_callback(dtype=STATS)
def count(s):
    s.count += 1


stats = np.zeros(1, STATS)
nh.host_launch(stream, count, user_data=stats)
stream.sync()
assert stats[0]["count"] == 1
print("OK")
"""


def test_a_module_level_stream_exits_quietly(request, tmp_path):
    """A module-level stream in __main__ beside a HostFunction with a dtype: the exit
    prints nothing ("Exception ignored in Stream.__del__" at every exit)."""
    if rerun_on_simulator(request):
        return
    script = tmp_path / "main.py"
    script.write_text(_MODULE_LEVEL_STREAM)
    run = subprocess.run(
        [sys.executable, str(script)], env=child_env(), capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0 and run.stdout == "OK\n", run.stdout + run.stderr
    assert_no_ignored_errors(run.stderr, "the module-level stream's script")


_INTERRUPTED_SYNC = """
import signal, threading
import numba_hostfn as nh
from _device import ctrl_c_inside

signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's, whatever we inherited
gate, order = threading.Event(), []


def interrupt_the_sync():
    # Ctrl-C inside Stream.sync's native wait; if the sync does not give way, let the
    # work end after all (a hang guard, not a timing).
    ctrl_c_inside("sync")
    if not interrupted.wait(30):
        order.append("work released")
        gate.set()


interrupted = threading.Event()
s = nh.simulator.Stream()
nh.host_launch(s, lambda: gate.wait(120))  # the work: until gate is set
nh.host_launch(s, lambda: order.append("after"))
threading.Thread(target=interrupt_the_sync, daemon=True).start()
try:
    s.sync()
    order.append("sync returned")
except KeyboardInterrupt:
    order.append("interrupted")
interrupted.set()
assert order == ["interrupted"], order
assert not s.is_done()
gate.set()
s.sync()  # the stream is as it was: its work runs, and it can be waited for again
assert order == ["interrupted", "after"], order
s.close()
nh.drain()
assert nh.pending() == 0
print("OK")
"""


def test_ctrl_c_interrupts_a_simulated_sync(request):
    """SIGINT during a simulated sync raises KeyboardInterrupt while the work is still
    running (it waited until the work ended), and leaves the stream usable."""
    if rerun_on_simulator(request):
        return
    assert run_child(_INTERRUPTED_SYNC, timeout=120).strip().endswith("OK")


def test_sleep_and_launch_validate(request, stream):
    if rerun_on_simulator(request):
        return
    with pytest.raises(TypeError, match="seconds"):
        stream.sleep("1")
    with pytest.raises(ValueError, match="seconds"):
        stream.sleep(-1)
    with pytest.raises(TypeError, match="compiled"):
        stream.launch(lambda: None)
    # Its own name, not host_launch()'s (it said "host_launch() expected ..."), and
    # what device work takes (no Python callable).
    for fn in (None, 3):
        with pytest.raises(TypeError, match=r"^simulator.Stream.launch\(\) expected a Host"):
            stream.launch(fn)


def test_a_refused_device_launch_keeps_no_view_of_user_data_while_its_error_lives(request):
    """Invariant 3 for simulator.Stream.launch: its frame stayed in a caught error's
    traceback, uncleared (enqueue cleared only its own), so a memoryview given as
    user_data kept its bytearray exported."""
    if rerun_on_simulator(request):
        return

    @nh.host_callback(dtype=np.int64)
    def bump(n):
        n[0] += 1

    buf = bytearray(4)  # bump declares 8 bytes
    with nh.simulator.Stream() as s:
        with pytest.raises(ValueError, match="holds 4 bytes") as info:
            s.launch(bump, user_data=memoryview(buf))
        assert resizable(buf), info.value  # False while its traceback kept the memoryview
    assert nh.pending() == 0


def test_foreign_stream_objects_are_refused(request):
    if rerun_on_simulator(request):
        return

    class Foreign:
        def __cuda_stream__(self):
            return (0, 0xDEAD0000)

    with pytest.raises(TypeError, match="simulator.Stream"):
        nh.host_launch(Foreign(), increment, user_data=np.zeros(1, np.int64))
    assert nh.pending() == 0


def test_a_stream_whose_repr_raises_is_refused_with_the_packages_error(request):
    """The refusal names a foreign stream by its repr, or by its type where that
    repr raises: before, the repr's own error (here ValueError) was raised instead."""
    if rerun_on_simulator(request):
        return

    class HalfMade:
        def __cuda_stream__(self):
            return (0, 0xDEAD0000)

        def __repr__(self):
            raise ValueError("not made yet")

    with pytest.raises(TypeError, match="simulator.Stream.*test_simulator.*HalfMade object"):
        nh.host_launch(HalfMade(), increment, user_data=np.zeros(1, np.int64))
    assert nh.pending() == 0


def test_a_subclass_that_skips_stream_init_is_refused_as_never_opened(request, launch_path):
    """A simulator.Stream subclass whose __init__ does not call super().__init__() has
    no stream: host_launch, done_future, host_copy, sync, is_done and
    create_graph_builder say so (RuntimeError), repr and close work.  Before, each
    raised AttributeError ('_closed'), repr and close too."""
    if rerun_on_simulator(request):
        return

    class NoInit(nh.simulator.Stream):
        def __init__(self):
            pass

    stream = NoInit()
    assert "closed" in repr(stream) and not stream.is_capturing
    calls = [
        lambda: nh.host_launch(stream, increment, user_data=np.zeros(1, np.int64)),
        lambda: nh.host_launch(stream, lambda: None),
        lambda: nh.done_future(stream),
        lambda: nh.host_copy(stream, bytearray(2), b"ab"),
        stream.sync,
        stream.is_done,
        stream.create_graph_builder,
    ]
    for call in calls:
        with pytest.raises(RuntimeError, match="NoInit was never opened.*super"):
            call()
    stream.close()
    assert nh.pending() == 0


def test_a_second_init_of_an_open_stream_is_refused_and_leaves_it_open(request):
    """Stream.__init__ called again on an open stream (a subclass that calls
    super().__init__() twice) is refused, and the stream stays open: close() stops
    its thread.  Before, the refused __init__ had marked it closed first, so close()
    and the collector left its thread running for good."""
    if rerun_on_simulator(request):
        return
    nh.simulator.Stream().close()
    threads = threads_but_watchdog()
    stream = nh.simulator.Stream()
    with pytest.raises(RuntimeError, match="open already"):
        stream.__init__()
    assert "open" in repr(stream) and "closed" not in repr(stream)
    counter = np.zeros(1, np.int64)
    nh.host_launch(stream, increment, user_data=nh.by_ref(counter))
    stream.close()
    assert counter[0] == 1
    assert _settled(threads), threads_but_watchdog() - threads


def test_two_threads_opening_one_stream_make_one_native_stream(request):
    """_open() on one unopened simulator.Stream from two threads at once: one opens
    it, the other is refused, and no thread is left when it closes.  Both read the
    stream unopened, then made one each with the GIL released, and the second
    overwrote the first, whose thread nothing stopped."""
    if rerun_on_simulator(request):
        return
    nh.simulator.Stream().close()
    threads = threads_but_watchdog()
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    opened = []
    try:
        for _ in range(100):
            stream = nh.simulator.Stream.__new__(nh.simulator.Stream)
            barrier, ok = threading.Barrier(2), []

            def open_it(stream=stream, barrier=barrier, ok=ok):
                barrier.wait()
                try:
                    stream._open()
                    ok.append(True)
                except RuntimeError:
                    pass

            both = [threading.Thread(target=open_it) for _ in range(2)]
            for thread in both:
                thread.start()
            for thread in both:
                thread.join()
            opened.append(len(ok))
            _core.sim_close(stream._handle, True)
    finally:
        sys.setswitchinterval(interval)
    assert set(opened) == {1}, opened
    assert _settled(threads), threads_but_watchdog() - threads


_FOREIGN_STREAM = """
import numpy as np
import numba_hostfn as nh

class Foreign:
    def __cuda_stream__(self):
        return (0, 0xDEAD0000)

@nh.host_callback
def body(p):
    pass

{choose}
try:
    nh.host_launch(Foreign(), body, user_data=np.zeros(1, np.int64))
except TypeError as e:
    print(e)
"""


@pytest.mark.parametrize(
    "how, says, never",
    [
        ("NUMBA_HOSTFN_SIMULATOR=1", "NUMBA_HOSTFN_SIMULATOR is set: unset it", "driver"),
        ("simulate_without_gpu(), no GPU", "chosen because no usable CUDA driver", "is set"),
    ],
)
def test_a_refused_stream_is_told_why_the_simulator_is_in_use(how, says, never):
    """The refusal of a foreign stream says why the simulator runs: the variable, or
    simulate_without_gpu() finding no driver (then unsetting anything would not help)."""
    env = child_env(CUDA_VISIBLE_DEVICES="")  # hides every GPU from the driver
    env.pop("NUMBA_HOSTFN_SIMULATOR", None)
    if how.startswith("NUMBA_HOSTFN_SIMULATOR"):
        env["NUMBA_HOSTFN_SIMULATOR"] = "1"
        script = _FOREIGN_STREAM.format(choose="")
    else:
        script = _FOREIGN_STREAM.format(choose="assert nh.simulate_without_gpu()")
    run = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert "simulator.Stream" in run.stdout and says in run.stdout, run.stdout
    assert never not in run.stdout, run.stdout


def test_simulator_stream_refused_without_simulator_backend(request):
    if rerun_on_simulator(request):
        return
    script = (
        "import numba_hostfn as nh\n"
        "try:\n    nh.simulator.Stream()\n"
        "except (RuntimeError, nh.BackendUnavailableError) as e:\n    print(e)\n"
    )
    env = child_env(CUDA_VISIBLE_DEVICES="")
    env.pop("NUMBA_HOSTFN_SIMULATOR")
    run = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert "NUMBA_HOSTFN_SIMULATOR" in run.stdout


_NO_DRIVER = """
import os
import numba_hostfn as nh
try:
    nh.host_launch(object(), print)
except TypeError:
    pass
for use in (nh.pending, nh.backend_name):
    try:
        use()
    except nh.BackendUnavailableError as e:
        print('unavailable:', e)
{choose}
print('then:', nh.backend_name())
"""


@pytest.mark.parametrize(
    "choose", ["nh.simulate_without_gpu()", "os.environ['NUMBA_HOSTFN_SIMULATOR'] = '1'"]
)
def test_no_driver_and_no_simulator_raises_naming_both_ways(choose):
    """No driver, no simulator: pending() and backend_name() raise, naming
    simulate_without_gpu() and the variable; and what the message says is true:
    either, done after the error (long after the import), selects the simulator."""
    env = child_env(CUDA_VISIBLE_DEVICES="")  # hides every GPU from the driver
    env.pop("NUMBA_HOSTFN_SIMULATOR", None)
    run = subprocess.run(
        [sys.executable, "-c", _NO_DRIVER.format(choose=choose)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    errors = [line for line in run.stdout.splitlines() if line.startswith("unavailable:")]
    assert len(errors) == 2, run.stdout
    for line in errors:
        assert "simulate_without_gpu()" in line and "NUMBA_HOSTFN_SIMULATOR=1" in line, line
        assert "before importing" not in line, line
    assert "then: simulator" in run.stdout, run.stdout


def test_simulated_stream_has_the_cuda_core_stream_surface_it_models():
    """The simulator must not drift from cuda.core's Stream (numba-cuda's simulator did)."""
    import inspect

    from cuda.core import Stream as CudaStream

    for name in ("sync", "close", "handle", "__cuda_stream__", "create_graph_builder"):
        assert hasattr(CudaStream, name), f"cuda.core.Stream no longer has {name}"
        assert hasattr(nh.simulator.Stream, name), f"simulator.Stream lacks {name}"
    for name in ("sync", "close", "__cuda_stream__", "create_graph_builder"):
        params = inspect.signature(getattr(nh.simulator.Stream, name)).parameters
        assert list(params) == ["self"], f"simulator.Stream.{name} takes {list(params)}"


def test_sync_returns_once_the_work_enqueued_before_it_has_run(request):
    """cuStreamSynchronize waits for the work enqueued before it: another thread that
    keeps enqueuing once kept sync() waiting for ever (it waited for an empty queue)."""
    if rerun_on_simulator(request):
        return
    with nh.simulator.Stream() as s:
        stop = threading.Event()

        def producer():
            while not stop.is_set():
                s.sleep(0.002)
                time.sleep(0.0005)

        feeder = threading.Thread(target=producer)
        feeder.start()
        try:
            time.sleep(0.05)  # the stream is never empty from now on
            returned = threading.Event()
            threading.Thread(target=lambda: (s.sync(), returned.set()), daemon=True).start()
            assert returned.wait(5), "sync() waited for work enqueued after it"
        finally:
            stop.set()
            feeder.join(60)


def test_a_fault_ends_the_device_work_running_on_the_contexts_other_streams(request):
    """After a sticky fault no work of the context runs: a sync of another stream of
    it answers the fault at once, not after that stream's sleep has run out."""
    if rerun_on_simulator(request):
        return
    nh.simulator.new_context()
    busy, faulting = nh.simulator.Stream(), nh.simulator.Stream()
    try:
        busy.sleep(30)
        time.sleep(0.05)  # the sleep is running
        faulting.fault()
        start = time.monotonic()
        with pytest.raises(nh.DeviceFaultError):
            busy.sync()
        assert time.monotonic() - start < 5
    finally:
        nh.simulator.new_context()
        busy.close()
        faulting.close()


def test_a_refused_close_from_a_host_function_leaves_the_capture_alone(request, unraisables):
    """close() from a host function is refused (RuntimeError) and changes nothing: it
    once ended the stream's capture first, so what was launched next ran at once."""
    if rerun_on_simulator(request):
        return
    seen, ran = [], []
    s, other = nh.simulator.Stream(), nh.simulator.Stream()
    try:
        s.begin_capture()

        def closes():
            try:
                s.close()
            except RuntimeError as exc:
                seen.append("host function" in str(exc))

        nh.host_launch(other, closes)
        other.sync()
        assert seen == [True]
        assert s.is_capturing
        nh.host_launch(s, lambda: ran.append("ran"))
        graph = s.end_capture()
        assert ran == []  # captured, not run
        graph.launch(other)
        other.sync()
        assert ran == ["ran"]
        graph.close()
    finally:
        s.close()
        other.close()
        nh.drain()


def test_a_sleep_whose_capture_another_thread_ends_goes_to_the_stream(request):
    """sleep() on a capturing stream read the capture after the enqueue said
    "capturing": a capture ended in between (by another thread) raised KeyError.
    The work now goes to the stream, as CUDA's would once the capture ended."""
    if rerun_on_simulator(request):
        return
    s = nh.simulator.Stream()
    try:
        s.begin_capture()
        _, graph = run_at_line(
            nh.simulator.Stream.sleep,
            "capture = self._capture",
            lambda: s.sleep(2),
            s.end_capture,
        )
        assert not s.is_capturing
        assert not s.is_done()  # the 2 s run on the stream, not in the graph
        s.sync()
        graph.close()
    finally:
        s.close()


def test_work_whose_capture_another_thread_ends_before_its_node_is_added_goes_to_the_stream(
    request,
):
    """A launch (or sleep) on a capturing stream read the capture, then added its node
    to it: a capture another thread ended in between (end_capture(), end_building())
    still took the node, after the graph was made, so it ran at every later replay and
    never on the stream (on a GPU, cuLaunchHostFunc after the capture's end enqueues on
    the stream; a GraphBuilder refuses it).  An ended capture takes no node now: the
    work goes to the stream, as CUDA's would, or a builder's launch is refused."""
    if rerun_on_simulator(request):
        return
    counter = np.zeros(1, np.int64)
    s = nh.simulator.Stream()
    try:
        s.begin_capture()
        _, graph = run_at_line(
            numba_hostfn._graphs.add_captured_node,
            "node_fn, node_arg, _ = _graph_record(backend, graph, launch)",
            lambda: nh.host_launch(s, increment, user_data=nh.by_ref(counter)),
            s.end_capture,
        )
        assert not s.is_capturing
        s.sync()
        assert counter[0] == 1, "the launch runs once on the stream"
        graph.launch(s)
        s.sync()
        assert counter[0] == 1, "and is no node of the graph made before it"
        graph.close()
        s.begin_capture()
        _, graph = run_at_line(
            nh.simulator.Stream.sleep,
            "if capture is not None:",
            lambda: s.sleep(2),
            s.end_capture,
        )
        # sleep() adds its work to the capture or to the stream, not both: on the
        # stream, it is no node of the graph (which takes none now that it ended).
        assert not s.is_done()  # the 2 s run on the stream, not in the graph
        assert not _core.sim_graph_add_node(graph._native, True, _core.SIM_DELAY, 1)
        s.sync()
        graph.launch(s)
        s.sync()
        graph.close()
        builder = s.create_graph_builder().begin_building()
        with pytest.raises(RuntimeError, match="not building"):
            run_at_line(
                numba_hostfn._graphs.add_captured_node,
                "node_fn, node_arg, _ = _graph_record(backend, graph, launch)",
                lambda: nh.host_launch(builder, increment, user_data=nh.by_ref(counter)),
                builder.end_building,
            )
        graph = builder.complete()
        builder.close()
        graph.launch(s)
        s.sync()
        graph.close()
        assert counter[0] == 1
    finally:
        s.close()
    nh.drain()
    assert nh.pending() == 0


def test_a_capture_begun_as_another_thread_closes_the_stream_is_not_left_behind(request):
    """begin_capture() racing close() on another thread (after its closed check,
    before it records the capture) left a capture of a closed stream that nothing
    would release.  It now raises the closed stream's error and keeps nothing."""
    if rerun_on_simulator(request):
        return
    s = nh.simulator.Stream()
    with pytest.raises(RuntimeError, match="closed"):
        run_at_line(
            nh.simulator.Stream._begin_capture,
            "if not self._capture_begin(capture):",
            s.begin_capture,
            s.close,
        )
    assert s._capture is None
    assert not s.is_capturing


def test_a_capture_begun_as_another_thread_finishes_closing_the_stream_is_not_left_behind(
    request,
):
    """close() took the stream's capture, then marked the stream closed: a
    begin_building() (or begin_capture()) on another thread in between passed every
    check and returned, leaving a capture of the closed stream.  Its builder took
    launches on the closed stream, and a begin_capture()'s capture could never be
    ended (end_capture() on a closed stream raises).  The begin now raises the closed
    stream's error and keeps nothing."""
    if rerun_on_simulator(request):
        return
    s = nh.simulator.Stream()
    builder = s.create_graph_builder()
    held = _core.held()

    def begin():  # on this thread, inside close(): where another thread could run it
        try:
            builder.begin_building()
        except RuntimeError as exc:
            return exc
        return None

    _, began = run_at_line(nh.simulator.Stream.close, "if capture is not None:", s.close, begin)
    assert isinstance(began, RuntimeError) and "closed" in str(began)
    assert s._capture is None
    assert not s.is_capturing and not builder.is_building
    with pytest.raises(RuntimeError, match="not building"):
        nh.host_launch(builder, increment, user_data=nh.by_ref(np.zeros(1, np.int64)))
    builder.close()
    nh.drain()
    assert _core.held() == held


def test_two_threads_beginning_a_capture_on_one_stream_do_not_both_succeed(request, monkeypatch):
    """begin_capture() checked "already capturing", then made its graph and recorded
    it: a second thread's begin in between passed the same check, and both returned
    (CUDA refuses the second cuStreamBeginCapture); the later record replaced the
    other's capture, whose builder then was not building and lost what it captured.
    Now one begins and the other gets "already capturing"."""
    if rerun_on_simulator(request):
        return
    made = _core.SimGraph
    others = []

    def another_thread_begins_first():  # as this thread makes its graph
        if not others:
            others.append(second)
            second.begin_building()
        return made()

    counter = np.zeros(1, np.int64)
    with nh.simulator.Stream() as s:
        first, second = s.create_graph_builder(), s.create_graph_builder()
        monkeypatch.setattr(_core, "SimGraph", another_thread_begins_first)
        with pytest.raises(RuntimeError, match="already capturing"):
            first.begin_building()
        monkeypatch.undo()
        assert others and second.is_building and not first.is_building
        nh.host_launch(second, increment, user_data=nh.by_ref(counter))
        graph = second.end_building().complete()
        assert not s.is_capturing
        graph.launch(s)
        s.sync()
        graph.close()
        first.close()
        second.close()
    assert counter[0] == 1


def test_closing_an_unused_graph_builder_leaves_another_capture_alone(request):
    """A GraphBuilder that never began building ended (and released) whatever
    capture its stream had on close(): another builder's, or begin_capture()'s, with
    its nodes.  It now ends only its own, as cuda.core's builder does."""
    if rerun_on_simulator(request):
        return
    counter = np.zeros(1, np.int64)
    with nh.simulator.Stream() as s:
        s.begin_capture()
        nh.host_launch(s, increment, user_data=nh.by_ref(counter))
        unused = s.create_graph_builder()
        assert not unused.is_building
        with pytest.raises(RuntimeError, match="not building"):
            unused.end_building()
        unused.close()
        with pytest.raises(RuntimeError, match="closed GraphBuilder"):
            unused.complete()
        assert s.is_capturing
        graph = s.end_capture()
        graph.launch(s)
        s.sync()
        graph.close()
    assert counter[0] == 1


def test_a_host_function_that_begins_or_ends_a_capture_is_refused(request, unraisables):
    """A capture's begin and end are CUDA calls, which CUDA forbids a host function:
    the simulator took them (docs/threading.md says it refuses a host function's
    CUDA calls).  They raise RuntimeError now, and the capture is as it was."""
    if rerun_on_simulator(request):
        return
    seen = []

    def captures(target):
        calls = (
            target.begin_capture,
            target.end_capture,
            target.create_graph_builder().begin_building,
        )
        for call in calls:
            try:
                call()
            except RuntimeError as exc:
                seen.append("host function" in str(exc))

    with nh.simulator.Stream() as s, nh.simulator.Stream() as idle, nh.simulator.Stream() as busy:
        busy.begin_capture()
        nh.host_launch(s, lambda: captures(idle))
        nh.host_launch(s, lambda: captures(busy))
        s.sync()
        assert seen == [True] * 6 and not unraisables
        assert not idle.is_capturing and busy.is_capturing
        busy.end_capture().close()  # from the program's thread: taken


def test_a_host_functions_refused_building_names_the_builder_call(request, unraisables):
    """A host function's begin_building() or end_building() was refused as "called
    begin_capture() (end_capture()) on a simulated stream", calls the program never
    made, on an object it never named: the refusal names the GraphBuilder's own call
    now, and the builder is as it was."""
    if rerun_on_simulator(request):
        return
    seen = []
    with nh.simulator.Stream() as s, nh.simulator.Stream() as work:
        idle = work.create_graph_builder()
        building = nh.simulator.Stream().create_graph_builder().begin_building()

        def builds():
            for call in (idle.begin_building, building.end_building):
                try:
                    call()
                    seen.append(f"{call.__qualname__} taken")
                except RuntimeError as exc:
                    seen.append(str(exc).split(":")[0])

        nh.host_launch(s, builds)
        s.sync()
        assert not unraisables
        assert seen == [
            "a host function called begin_building() on a simulated GraphBuilder",
            "a host function called end_building() on a simulated GraphBuilder",
        ], seen
        assert not idle.is_building and building.is_building
        building.end_building().close()
        building.stream.close()


def test_a_graph_builder_says_whether_it_is_closed_as_cuda_cores_does(request):
    """cuda.core 1.2's GraphBuilder has is_closed, as its Graph does: the simulator's
    builder had none, so code that asked it (before closing one twice, say) passed on
    a GPU and raised AttributeError here."""
    if rerun_on_simulator(request):
        return
    with nh.simulator.Stream() as s:
        builder = s.create_graph_builder()
        assert builder.is_closed is False
        builder.begin_building().end_building()
        graph = builder.complete()
        assert builder.is_closed is False
        builder.close()
        assert builder.is_closed is True and graph.is_closed is False
        graph.close()
        unused = s.create_graph_builder()
        unused.close()
        assert unused.is_closed is True


def test_a_host_function_that_instantiates_or_destroys_a_graph_is_refused(request, unraisables):
    """A graph's instantiation and destruction are CUDA calls too (cuGraphInstantiate,
    cuGraphDestroy, cuGraphExecDestroy), which CUDA forbids a host function (the driver
    may refuse them or deadlock): the simulator took them, so code that closed a graph
    in a host function passed here.  They raise RuntimeError now, with the graph and the
    builder as they were; the program's thread then completes, replays and closes them."""
    if rerun_on_simulator(request):
        return
    seen = []
    with nh.simulator.Stream() as s, nh.simulator.Stream() as work:
        builder = work.create_graph_builder().begin_building()
        counter = np.zeros(1, np.int64)
        nh.host_launch(builder, lambda: counter.__setitem__(0, counter[0] + 1))
        builder.end_building()
        graph = builder.complete()

        def in_host_function():
            for call in (builder.complete, builder.close, graph.close):
                try:
                    call()
                    seen.append(f"{call.__qualname__} taken")
                except RuntimeError as exc:
                    seen.append("CUDA forbids a host function" in str(exc))

        nh.host_launch(s, in_host_function)
        s.sync()
        assert seen == [True] * 3 and not unraisables, seen
        assert not graph.is_closed
        graph.launch(work)
        builder.complete().close()  # from the program's thread: taken
        builder.close()
        graph.close()
        work.sync()
        assert counter[0] == 1 and graph.is_closed


def test_a_host_function_that_makes_a_host_executor_is_refused(request, monkeypatch, unraisables):
    """HostExecutor() allocates its words in pinned memory (cuMemHostAlloc on CUDA), a
    CUDA call, which CUDA forbids a host function: the simulator started the pool's
    threads and took the words.  It raises RuntimeError now, as a host function's other
    CUDA calls do, having started nothing.  A done_future there (refused, as an enqueue)
    no longer starts the default lane from the host function either, nor keeps it from
    serving the program's later waits."""
    if rerun_on_simulator(request):
        return
    from numba_hostfn import _executor

    # A process whose default lane was never started (restored after the test).
    monkeypatch.setattr(_executor, "_default", None)
    monkeypatch.setattr(_executor, "_default_off", False)
    monkeypatch.setattr(_executor, "_default_retry_at", 0.0)
    seen = []

    def call(what):
        try:
            seen.append(repr(what()))
        except RuntimeError as exc:
            seen.append(str(exc))

    with nh.simulator.Stream() as s, nh.simulator.Stream() as other:
        nh.host_launch(s, lambda: None)  # the stream's thread is started
        s.sync()
        threads = threads_but_watchdog()
        nh.host_launch(s, lambda: call(lambda: nh.HostExecutor(threads=2)))
        s.sync()
        assert threads_but_watchdog() <= threads  # no pool's threads were started
        nh.host_launch(s, lambda: call(lambda: nh.done_future(other)))
        s.sync()
        nh.drain()
        lane = _executor._default
        try:
            assert len(seen) == 2 and not unraisables, seen
            assert seen[0].startswith("a host function made a HostExecutor"), seen[0]
            assert seen[1].startswith("a host function enqueued work"), seen[1]
            assert all("CUDA forbids a host function any CUDA call" in m for m in seen)
            assert lane is None  # nor the default lane, which was not put off either
            assert not _executor._default_off and _executor._default_retry_at == 0.0
            assert nh.done_future(other).result(timeout=60) is other
            lane = _executor._default
            assert lane is not None  # the program's own wait started it
        finally:
            if lane is not None:
                lane.close()


@pytest.mark.parametrize("seconds", [np.int64(0), np.float32(0.001), np.float64(0.001)])
def test_sleep_takes_any_real_number(request, seconds):
    """sleep() refused a numpy integer or float32 (and a Fraction) with "expected a
    number of seconds, got 0": a number; HostExecutor's times take any real number."""
    if rerun_on_simulator(request):
        return
    with nh.simulator.Stream() as s:
        s.sleep(seconds)
        s.sync()
        with pytest.raises(TypeError, match="seconds"):
            s.sleep(np.bool_(True))


@pytest.mark.parametrize("given", [None, 0, "stream", object()])
def test_graph_builder_and_graph_refuse_what_they_cannot_use(request, given):
    """simulator.GraphBuilder(x) and simulator.Graph(x) took anything, and failed at
    first use with an AttributeError ('NoneType' object has no attribute
    'begin_capture', 'int' object has no attribute 'held')."""
    if rerun_on_simulator(request):
        return
    with pytest.raises(TypeError, match="simulator.Stream"):
        nh.simulator.GraphBuilder(given)
    with pytest.raises(TypeError, match="end_capture"):
        nh.simulator.Graph(given)
    with nh.simulator.Stream() as s:  # the ways that make them still do
        builder = s.create_graph_builder().begin_building()
        builder.end_building().complete().close()
        builder.close()
        s.begin_capture()
        s.end_capture().close()


def test_a_handle_of_no_open_simulated_stream_is_refused_by_every_call(request):
    """An object whose __cuda_stream__ gives CUDA's legacy (0) or per-thread (2)
    default stream, or the handle of a simulated stream since collected, is refused
    by every call that takes a stream with the TypeError that says why the
    simulator is in use; one naming a stream closed but alive, with the closed
    stream's RuntimeError. Nothing enqueued, and no crash on the stale handle."""
    import asyncio

    if rerun_on_simulator(request):
        return

    class Answering:
        def __init__(self, handle):
            self.handle = handle

        def __cuda_stream__(self):
            return (0, self.handle)

    async def await_done(stream):
        await nh.async_done(stream)

    closed = nh.simulator.Stream()
    closed.close()
    collected = nh.simulator.Stream()
    gone = collected.handle
    collected.close()
    del collected
    gc.collect()
    calls = [
        lambda s: nh.host_launch(s, increment, user_data=nh.by_ref(np.zeros(1, np.int64))),
        lambda s: nh.host_launch(s, lambda: None),
        lambda s: nh.host_launch(s, lambda: None, blocking=False),
        lambda s: nh.host_copy(s, np.zeros(1), np.ones(1)),
        lambda s: nh.host_copy(s, np.zeros(0), np.zeros(0)),
        lambda s: nh.release_after(s, object()),
        lambda s: nh.release_after(s),
        lambda s: nh.done_future(s),
        lambda s: asyncio.run(await_done(s)),
        lambda s: nh.add_callback(s, lambda stream, status, arg: None),
    ]
    with nh.HostExecutor(threads=1) as executor:
        calls.append(lambda s: nh.host_launch(s, increment, user_data=5, executor=executor))
        for handle, error, match in [
            (0, TypeError, "only on numba_hostfn.simulator.Stream"),
            (2, TypeError, "only on numba_hostfn.simulator.Stream"),
            (gone, TypeError, "only on numba_hostfn.simulator.Stream"),
            (closed.handle, RuntimeError, "closed"),
        ]:
            for call in calls:
                with pytest.raises(error, match=match):
                    call(Answering(handle))
    assert nh.pending() == 0


def test_sim_graph_add_node_reads_the_graph_after_the_argument_that_runs_python(request):
    """sim_graph_add_node read the graph's native part, then its ``device`` argument's
    truth, whose ``__bool__`` may run Python that releases the graph: the native part
    was then used after it was freed (ASan: heap-use-after-free in py_graph_add_node,
    in review).  The graph is read last now, and one released meanwhile is refused as
    closed."""
    if rerun_on_simulator(request):
        return
    graph = _core.SimGraph()

    class Releases:
        def __bool__(self):
            graph.release()
            return True

    with pytest.raises(RuntimeError, match="the simulated graph is closed"):
        _core.sim_graph_add_node(graph, Releases(), _core.SIM_DELAY, 1)
    assert nh.pending() == 0
