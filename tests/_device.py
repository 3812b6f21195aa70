"""Test helpers: the package's device stand-ins, and the environment for child processes."""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import textwrap

from numba_hostfn._demodevice import Device

__all__ = [
    "CHILD_PREAMBLE",
    "TAKE_GIL_AND_KEEP_IT",
    "Capture",
    "Hold",
    "armed_fault",
    "handle_of_a_new_stream",
    "held_work",
    "watchdog_polled",
    "threads_but_watchdog",
    "watchdog_threads",
    "held_records",
    "assert_no_ignored_errors",
    "run_child",
    "Device",
    "child_env",
    "ctrl_c_inside",
    "released_eventually",
    "rerun_on_simulator",
    "thread_state_count",
]


#: The start of a child test script (run with :func:`child_env`): imports, an
#: ``increment`` host function, and ``device`` and ``stream`` on this backend.
def refusing_sim_streams() -> tuple:
    """Three simulated streams that refuse what is enqueued on them, each its own way:
    ``(closed, capturing, faulted)``; ``faulted``'s context is made for it (the fault is
    that context's only, and the simulator's current context from here on), and its
    fault has run: the context refuses, though no wait has noted the fault yet.  For a
    child on the simulator."""
    import time

    import numba_hostfn as nh

    closed = nh.simulator.Stream()
    closed.close()
    capturing = nh.simulator.Stream()
    capturing.begin_capture()
    nh.simulator.new_context()
    faulted = nh.simulator.Stream()
    faulted.fault("CUDA_ERROR_ILLEGAL_ADDRESS")
    while nh._core.sim_query(faulted.handle) != 700:
        time.sleep(0.001)
    return closed, capturing, faulted


CHILD_PREAMBLE = textwrap.dedent("""
    import faulthandler
    faulthandler.enable()  # SIGABRT from the test prints every thread's stack
    import numpy as np
    from numba import carray
    import numba_hostfn as nh
    from _device import Device

    @nh.host_callback
    def increment(p):
        carray(p, (1,), np.int64)[0] += 1

    device = Device()
    stream = device.create_stream()
""")


#: Child-script source of ``take_gil_and_keep_it()``: a numba intrinsic whose call
#: takes the GIL (``PyGILState_Ensure``) and never gives it back, as a body that boxes
#: a value without a registered Environment does (LIFETIME.md, invariant 13).
TAKE_GIL_AND_KEEP_IT = textwrap.dedent("""
    from numba import types
    from numba.extending import intrinsic

    @intrinsic
    def take_gil_and_keep_it(typingctx):
        def codegen(context, builder, signature, args):
            context.get_python_api(builder).gil_ensure()  # never released
            return context.get_dummy_value()
        return types.void(), codegen
""")


def ctrl_c_inside(name: str) -> None:
    """For a child script's helper thread: once the main thread runs a function called
    ``name`` (a wait in native code: ``close``, ``sync``), send it SIGINT (Ctrl-C).

    Waits for it 60 s at most, then 0.2 s more, well inside the native wait; the
    SIGINT goes out either way, so a test whose wait never began still ends."""
    import signal
    import threading
    import time

    main = threading.main_thread().ident
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        frame = sys._current_frames().get(main)
        if frame is not None and frame.f_code.co_name == name:
            break
        time.sleep(0.01)
    time.sleep(0.2)
    signal.pthread_kill(main, signal.SIGINT)


def stopped_executor(nh, stream):
    """For a child script: a one-thread HostExecutor stopped, not closed, by a Ctrl-C
    inside its ``close()``, with one task on ``stream`` outstanding until the returned
    event is set.  Python's SIGINT handler is installed first, whatever the child
    inherited.  Returns ``(executor, gate)``."""
    import signal
    import threading

    signal.signal(signal.SIGINT, signal.default_int_handler)
    gate = threading.Event()
    executor = nh.HostExecutor(threads=1)
    nh.host_launch(stream, lambda: gate.wait(120), executor=executor)  # until gate is set
    threading.Thread(target=ctrl_c_inside, args=("close",), daemon=True).start()
    try:
        executor.close()
    except KeyboardInterrupt:
        pass
    return executor, gate


def fork_child_waits_over(future) -> None:
    """For a forked child of a child script: ``concurrent.futures.wait`` over
    ``future`` (the parent's) and a future of the child's own, set by a thread of the
    child 50 ms later; prints ``child: wait DONE NOT_DONE``, or ``child: wait raised``
    and the error.  An alarm in 20 s ends a child whose wait hangs."""
    import concurrent.futures
    import signal
    import threading

    signal.alarm(20)  # a wait that hangs ends the child: the parent says so
    mine = concurrent.futures.Future()
    threading.Timer(0.05, mine.set_result, (1,)).start()
    try:
        done, not_done = concurrent.futures.wait([future, mine], timeout=20)
        print("child: wait", len(done), len(not_done), flush=True)
    except RuntimeError as exc:
        print("child: wait raised", exc, flush=True)


#: The folder above tests/: a checkout, or a copy of one without the package.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: The checkout whose files the tests marked ``checkout`` read: :data:`ROOT`, or the
#: one NUMBA_HOSTFN_SOURCE_TREE names, where a copy of the tree without the package
#: runs against an installed wheel beside a checkout (``bash .ci/gpu wheel``).
SOURCES = os.path.abspath(os.environ.get("NUMBA_HOSTFN_SOURCE_TREE") or ROOT)


def imported_from_root() -> bool:
    """Whether numba_hostfn is imported from :data:`ROOT` (a checkout), not installed."""
    import numba_hostfn

    package = os.path.dirname(os.path.dirname(os.path.abspath(numba_hostfn.__file__)))
    return os.path.samefile(package, ROOT)


#: What a child Python prints when it reports an error and goes on: an exception in a
#: ``__del__`` or a thread, an atexit handler's (3.10 says "Error in atexit"), one that
#: reached ``sys.unraisablehook`` at exit.  The return code stays 0 for all of them.
IGNORED_ERRORS = ("Exception ignored", "Traceback (most recent call last)", "Error in atexit")


def resizable(buf) -> bool:
    """Whether ``buf`` (a bytearray or array.array) may be resized now: pop its last
    item and put it back, which moves nothing; False if an export pins it."""
    try:
        last = buf.pop()
    except BufferError:
        return False
    buf.append(last)
    return True


def wait_or_kill(pid: int, seconds: float = 30) -> int | None:
    """In a child script that forked: wait at most ``seconds`` for child ``pid`` to
    exit and return its wait status; kill it and return None if it is still running
    (a child that hung)."""
    import os
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.05)
    os.kill(pid, 9)
    return None


def assert_no_ignored_errors(stderr: str, what: str) -> None:
    """Fail if ``stderr`` of a child that succeeded holds an error it reported and went
    on from (issue 31: "Exception ignored in Stream.__del__" at every exit, unseen)."""
    found = [marker for marker in IGNORED_ERRORS if marker in stderr]
    assert not found, f"{what} printed {found} and still exited 0; stderr:\n{stderr}"


def child_env(**extra: str) -> dict:
    """The environment for a child Python: this backend, the package this process
    imported (the checkout, when it is imported from one; else the installed one)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        ([ROOT] if imported_from_root() else [])
        + [os.path.dirname(os.path.abspath(__file__))]
        + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    env.update(extra)
    return env


def run_child(
    script: str, *, env: dict | None = None, timeout: float = 120, quiet: bool = True
) -> str:
    """Run ``script`` in a child Python (:func:`child_env`); return its stdout.

    A child that hangs is sent SIGABRT, so that faulthandler prints its
    threads' stacks (the preamble enables it), and the test fails with them; a
    child that fails fails the test with its output, and so does one that
    printed an error it went on from (:func:`assert_no_ignored_errors`), unless
    ``quiet`` is false (a child that reports errors on purpose).
    """
    import signal
    import subprocess
    import sys

    import pytest

    child = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env() if env is None else env,
    )
    try:
        out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.send_signal(signal.SIGABRT)
        out, err = child.communicate()
        pytest.fail(f"the child hung; stacks:\n{err}\nstdout:\n{out}")
    assert child.returncode == 0, err + out
    if quiet:
        assert_no_ignored_errors(err, "the child")
    return out


def rerun_on_simulator(request) -> bool:
    """On the CUDA backend, run this test in a child pytest on the simulator.

    Returns True when it did (the caller then returns: the child's pass is the
    test's result), False when this process already uses the simulator.  This
    way simulator behaviour is checked on GPU machines too, with no skip.
    """
    import subprocess
    import sys

    import numba_hostfn

    if numba_hostfn.backend_name() == "simulator":
        return False
    # From ROOT's parent, which `python -m` puts on sys.path instead of ROOT: the child
    # imports the package this process imported (a checkout is on child_env's path).
    test = os.path.join(ROOT, request.node.nodeid)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", ROOT, test],
        cwd=os.path.dirname(ROOT),
        env=child_env(NUMBA_HOSTFN_SIMULATOR="1"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0 and "1 passed" in run.stdout, run.stdout + run.stderr
    return True


def run_at_line(function, line_text, call, action):
    """``call()``, with ``action()`` run once, on this thread, just before the first
    line of ``function`` whose source is ``line_text``: where another thread could
    run it, made certain by a trace function (as test_interrupts makes its
    interrupts).  Returns what ``call()`` and ``action()`` returned."""
    import inspect

    code = function.__code__
    lines, first = inspect.getsourcelines(code)
    target = first + [line.strip() for line in lines].index(line_text)
    ran = []

    def local(frame, event, arg):
        if event == "line" and frame.f_lineno == target and not ran:
            ran.append(action())
        return local

    def tracer(frame, event, arg):
        return local if frame.f_code is code else None

    sys.settrace(tracer)
    try:
        result = call()
    finally:
        sys.settrace(None)
    assert ran, f"{function.__qualname__} did not reach {line_text!r}"
    return result, ran[0]


class Capture:
    """A plain stream captured as another library would capture it.

    On a GPU through cuda.bindings (``cuStreamBeginCapture`` in ``mode``, then
    ``cuStreamEndCapture`` and ``cuGraphInstantiate``); on the simulator with
    ``Stream.begin_capture``/``end_capture``.  ``end()`` gives something to
    ``launch(stream)`` and ``close()``.
    """

    MODES = ("global", "thread_local", "relaxed")

    def __init__(self, stream, mode: str = "global") -> None:
        self.stream = stream
        import numba_hostfn

        self.simulator = isinstance(stream, numba_hostfn.simulator.Stream)
        self._graph = self._exec = None
        if self.simulator:
            stream.begin_capture()
            return
        from cuda.bindings import driver

        self._d = driver
        modes = driver.CUstreamCaptureMode
        flag = {
            "global": modes.CU_STREAM_CAPTURE_MODE_GLOBAL,
            "thread_local": modes.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            "relaxed": modes.CU_STREAM_CAPTURE_MODE_RELAXED,
        }[mode]
        self._check(driver.cuStreamBeginCapture(self._handle(stream), flag))

    def _handle(self, stream):
        return self._d.CUstream(int(stream.handle))

    def _check(self, result):
        err = result[0] if isinstance(result, tuple) else result
        assert int(err) == 0, f"driver call failed: {err!r}"
        return result[1] if isinstance(result, tuple) and len(result) > 1 else None

    def end(self) -> Capture:
        if self.simulator:
            self._graph = self.stream.end_capture()
            return self
        self._graph = self._check(self._d.cuStreamEndCapture(self._handle(self.stream)))
        self._exec = self._check(self._d.cuGraphInstantiate(self._graph, 0))
        return self

    def instantiate_again(self):
        """A second executable instance of the same captured graph (GPU only)."""
        return self._check(self._d.cuGraphInstantiate(self._graph, 0))

    def launch(self, stream=None, instance=None) -> None:
        stream = self.stream if stream is None else stream
        if self.simulator:
            self._graph.launch(stream)
        else:
            exec_ = self._exec if instance is None else instance
            self._check(self._d.cuGraphLaunch(exec_, self._handle(stream)))

    def close(self, *instances) -> None:
        if self.simulator:
            self._graph.close()
            return
        for exec_ in (self._exec, *instances):
            self._check(self._d.cuGraphExecDestroy(exec_))
        self._check(self._d.cuGraphDestroy(self._graph))


def released_eventually(alive, device, rounds: int = 300, *, pending: int | None = None) -> bool:
    """Wait until the weak reference ``alive`` is dead (and, if ``pending`` is
    given, until ``numba_hostfn.pending()`` equals it); True if that happened.

    CUDA runs a graph's user-object destructors asynchronously once the graph
    and its instances are gone, one object at a time: one launch's owner can be
    gone while another launch of the same graph is not yet released (seen on
    the H200).  Each round synchronizes, drains and collects.
    """
    import gc
    import time

    import numba_hostfn

    for _ in range(rounds):
        device.synchronize()
        numba_hostfn.drain()
        gc.collect()
        if alive() is None and (pending is None or numba_hostfn.pending() == pending):
            return True
        time.sleep(0.01)
    return False


def graph_records_released(stream, rounds: int = 2000) -> bool:
    """Wait until no launch is pending (``numba_hostfn.pending() == 0``); True if
    that happened.  For a child script whose graph is closed: CUDA destroys the
    graph's user object, and so the record it owns, later, not at once (seen on
    H100 hosts).  Each round synchronizes ``stream`` and drains."""
    import time

    import numba_hostfn

    for _ in range(rounds):
        stream.sync()
        numba_hostfn.drain()
        if numba_hostfn.pending() == 0:
            return True
        time.sleep(0.005)
    return False


def thread_state_count() -> int:
    """How many Python thread states the main interpreter has."""
    import ctypes

    api = ctypes.pythonapi
    head = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(
        ("PyInterpreterState_ThreadHead", api)
    )
    following = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(("PyThreadState_Next", api))
    main = ctypes.PYFUNCTYPE(ctypes.c_void_p)(("PyInterpreterState_Main", api))
    count, state = 0, head(main())
    while state:
        count, state = count + 1, following(state)
    return count


class Hold:
    """Hold a stream at this point until the test says so: no race with the clock.

    A host function that waits for a flag (``with Hold(stream):`` releases it on
    exit, even when the test fails).  Use it where a test must look at the state
    *before* the stream goes on: a delay races with whatever the test does in
    between (a ``gc.collect()`` with large libraries loaded can take longer).
    Only host work may come behind it: on CUDA a kernel launched behind a held
    host function blocks in its launch until the host function returns (seen on
    the H200: a deadlock, since the test cannot release it); hold device work
    with :func:`armed_fault` or the device's own wait.
    """

    def __init__(self, stream) -> None:
        import numpy as np

        import numba_hostfn

        self.flag = np.zeros(1, np.int64)
        numba_hostfn.host_launch(stream, _wait_for_flag(), user_data=numba_hostfn.by_ref(self.flag))

    def release(self) -> None:
        self.flag[0] = 1

    def __enter__(self) -> Hold:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@contextlib.contextmanager
def held_work(device, stream):
    """Device work that holds ``stream`` until the block ends (or ``release()``, the
    function it yields, is called): on CUDA a wait on a word of host memory
    (``cuStreamWaitValue32``), which a kernel may come behind (a kernel launched
    behind a held host function, :class:`Hold`, blocks in its launch on the H200);
    on the simulator a :class:`Hold`."""
    import numba_hostfn

    if numba_hostfn.backend_name() != "cuda":
        with Hold(stream) as hold:
            yield hold.release
        return
    import numpy as np
    from cuda.bindings import driver

    flag = device.host_array(1, np.uint32)
    (err,) = driver.cuStreamWaitValue32(
        driver.CUstream(int(stream.handle)),
        flag.ctypes.data,
        1,
        driver.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ,
    )
    assert err == driver.CUresult.CUDA_SUCCESS, err

    def release() -> None:
        flag[0] = 1

    try:
        yield release
    finally:
        release()


@contextlib.contextmanager
def handle_of_a_new_stream(stream):
    """In the block, ``stream``'s handle names a new stream as the package sees it:
    the stream's id (``cuStreamGetId``) is another one.

    CUDA gives a destroyed stream's handle to a later stream, even while the
    destroyed one's work is pending (on an H200: streams made and destroyed in turn
    alternated between two handles, and new streams got the handles of streams
    destroyed with a wait pending), but not at a test's will: in the suite on the
    H200, 20,000 new streams did not bring one handle back.  So CUDA's
    ``cuStreamGetId`` is a stand-in for the block that gives this handle a new id
    (the driver's answer for any other), and the simulator gives the stream a new
    serial (``sim_new_identity``, which stays after the block; a later stream never
    gets its handle there).  The
    queue stays the one before, so the tests check the lanes the package chooses;
    the stream order they protect is the driver's.
    """
    import numba_hostfn
    from numba_hostfn import _core

    handle = stream.__cuda_stream__()[1]
    if numba_hostfn.backend_name() != "cuda":
        _core._testing.sim_new_identity(handle)
        yield
        return
    from cuda.bindings import driver

    def get_id(asked, out):
        err, real = driver.cuStreamGetId(driver.CUstream(asked or 0))
        if err != driver.CUresult.CUDA_SUCCESS:
            return int(err)
        out[0] = int(real) + (1 << 48 if (asked or 0) == handle else 0)
        return 0

    with driver_stand_ins(cuStreamGetId=get_id):
        yield


def armed_fault(device, stream, delay: float = 0.0):
    """Device work that faults ``delay`` seconds after the returned ``fire()``: what is
    enqueued before ``fire()`` comes behind the fault, on either backend.

    The simulator: a :class:`Hold` in front of its ``fault(stream, delay)``.  CUDA: a
    kernel that spins on a host flag, then for ``delay`` seconds, then traps
    (``Device.armed_fault``), since a kernel cannot be held behind a host function.
    """
    if device.simulator:
        hold = Hold(stream)
        device.fault(stream, delay)
        return hold.release
    return device.armed_fault(stream, delay)


def _thread_names() -> list[str]:
    """The names of this process's threads, from one listing (a thread that ends
    between the listing and the read of its name is left out)."""
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            pass  # the thread ended meanwhile
    return names


def watchdog_threads() -> int:
    """How many threads of this process are named nhf-watchdog (native/watchdog.c)."""
    return _thread_names().count("nhf-watchdog")


def threads_but_watchdog() -> int:
    """How many threads this process has, the device-fault watchdog's left out: it
    starts at a watched launch and ends only after 10 s idle, so a count before and
    after a test would see it come or go."""
    return sum(name != "nhf-watchdog" for name in _thread_names())


def watchdog_polled(more: int = 3, rounds: int = 5000) -> bool:
    """Wait until the watchdog has polled ``more`` times (a bounded wait)."""
    import time

    from numba_hostfn import _core

    start = _core._testing.watchdog_stats()["polls"]
    for _ in range(rounds):
        if _core._testing.watchdog_stats()["polls"] >= start + more:
            return True
        time.sleep(0.001)
    return False


def held_records(device) -> int:
    """How many of ``pending()`` an :func:`armed_fault` adds: the simulator's hold."""
    return 1 if device.simulator else 0


_WAIT_FOR_FLAG = []


def _wait_for_flag():
    if not _WAIT_FOR_FLAG:
        import ctypes

        import numpy as np
        from numba import carray

        import numba_hostfn

        usleep = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint)(("usleep", ctypes.CDLL(None)))

        @numba_hostfn.host_callback
        def wait_for_flag(p):
            flag = carray(p, (1,), np.int64)
            while flag[0] == 0:
                usleep(100)  # an opaque call: the flag is read again each time

        _WAIT_FOR_FLAG.append(wait_for_flag)
    return _WAIT_FOR_FLAG[0]


c_int, c_uint, c_uint64, vp = ctypes.c_int, ctypes.c_uint, ctypes.c_uint64, ctypes.c_void_p
#: ctypes prototypes of the driver entry points the tests stand in for (driver.h).
_PROTOTYPES = {
    "cuStreamGetCaptureInfo": ctypes.CFUNCTYPE(
        c_int, vp, ctypes.POINTER(c_int), ctypes.POINTER(c_uint64), ctypes.POINTER(vp), vp, vp, vp
    ),
    "cuLaunchHostFunc": ctypes.CFUNCTYPE(c_int, vp, vp, vp),
    "cuStreamIsCapturing": ctypes.CFUNCTYPE(c_int, vp, ctypes.POINTER(c_int)),
    "cuStreamWriteValue32": ctypes.CFUNCTYPE(c_int, vp, c_uint64, c_uint, c_uint),
    "cuStreamWaitValue32": ctypes.CFUNCTYPE(c_int, vp, c_uint64, c_uint, c_uint),
    "cuStreamCreate": ctypes.CFUNCTYPE(c_int, ctypes.POINTER(vp), c_uint),
    "cuStreamBeginCaptureToGraph": ctypes.CFUNCTYPE(c_int, vp, vp, vp, vp, ctypes.c_size_t, c_int),
    "cuStreamEndCapture": ctypes.CFUNCTYPE(c_int, vp, ctypes.POINTER(vp)),
    "cuStreamDestroy": ctypes.CFUNCTYPE(c_int, vp),
    "cuMemHostAlloc": ctypes.CFUNCTYPE(c_int, ctypes.POINTER(vp), ctypes.c_size_t, c_uint),
    "cuUserObjectCreate": ctypes.CFUNCTYPE(c_int, ctypes.POINTER(vp), vp, vp, c_uint, c_uint),
    "cuUserObjectRelease": ctypes.CFUNCTYPE(c_int, vp, c_uint),
    "cuGraphRetainUserObject": ctypes.CFUNCTYPE(c_int, vp, vp, c_uint, c_uint),
    "cuCtxGetCurrent": ctypes.CFUNCTYPE(c_int, ctypes.POINTER(vp)),
    "cuStreamGetId": ctypes.CFUNCTYPE(c_int, vp, ctypes.POINTER(ctypes.c_ulonglong)),
    "cuStreamBatchMemOp": ctypes.CFUNCTYPE(c_int, vp, c_uint, vp, c_uint),
    "cuStreamGetCtx": ctypes.CFUNCTYPE(c_int, vp, ctypes.POINTER(vp), ctypes.POINTER(vp)),
}


@contextlib.contextmanager
def driver_stand_ins(**fakes):
    """The native driver table's entries named by ``fakes`` (Python functions, or 0
    for none) for the block (``_core._testing.driver_swap``); the real ones back
    after it, whatever happens.  Only while no other thread of the process launches."""
    from numba_hostfn import _core

    keep, before = [], {}
    try:
        for name, fake in fakes.items():
            address = 0
            if fake:
                keep.append(_PROTOTYPES[name](fake))
                address = ctypes.cast(keep[-1], vp).value
            before[name] = _core._testing.driver_swap(name, address)
        yield
    finally:
        for name, address in before.items():
            _core._testing.driver_swap(name, address)
