"""HostExecutor: stream-ordered host work on native threads, through stream memory operations.

Every test runs on the simulator too, which models the operations as device
work (a write of "reached", a wait on "done").
"""

import contextlib
import ctypes
import gc
import sys
import textwrap
import threading
import time
import weakref

import numpy as np
import pytest
from _device import (
    CHILD_PREAMBLE,
    TAKE_GIL_AND_KEEP_IT,
    Capture,
    Hold,
    _wait_for_flag,
    child_env,
    driver_stand_ins,
    handle_of_a_new_stream,
    held_work,
    released_eventually,
    rerun_on_simulator,
    run_at_line,
    run_child,
    thread_state_count,
    threads_but_watchdog,
)
from numba import carray

import numba_hostfn as nh
import numba_hostfn._graphs
from numba_hostfn import _core

_libc = ctypes.CDLL(None)
_usleep = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint)(("usleep", _libc))
_clock_gettime = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_void_p)(
    ("clock_gettime", _libc)
)


@nh.host_callback
def increment(p):
    carray(p, (1,), np.int64)[0] += 1


@nh.host_callback
def observe(p):
    """cell[1] = 10 * cell[0] + cell[2]: what the host saw between two device writes."""
    cell = carray(p, (3,), np.int32)
    cell[1] = 10 * cell[0] + cell[2]


ADD = np.dtype([("out", np.uint64), ("value", np.int64)])


@nh.host_callback(dtype=ADD)
def add_value(d):
    carray(nh.as_voidptr(d.out), (1,), np.int64)[0] += d.value


MEET = np.dtype([("flags", np.uint64), ("met", np.uint64), ("n", np.int64), ("me", np.int64)])


@nh.host_callback(dtype=MEET)
def meet(d):
    """Raise my flag, then wait (up to about 2 s) until all n flags are up."""
    flags = carray(nh.as_voidptr(d.flags), (d.n,), np.int64)
    flags[d.me] = 1
    for _ in range(20_000):
        total = 0
        for i in range(d.n):
            total += flags[i]
        if total == d.n:
            carray(nh.as_voidptr(d.met), (d.n,), np.int64)[d.me] = 1
            return
        _usleep(100)


@pytest.fixture
def executor():
    ex = nh.HostExecutor(threads=4)
    yield ex
    ex.close()


def test_runs_between_prior_and_later_stream_work(executor, stream, device):
    cell = device.host_array(3)
    device.store(stream, cell, 0, 1, delay=0.05)  # device work before
    nh.host_launch(stream, observe, user_data=nh.by_ref(cell), executor=executor)
    device.store(stream, cell, 2, 7)  # device work after
    stream.sync()
    assert list(cell) == [1, 10, 7]


def _task_on(how, stream, executor):
    """One task on ``stream``'s lane of ``executor``, launched as ``how`` says."""
    from numba_hostfn import _launch

    if how == "compiled":  # host_launch's native path: a direct task
        nh.host_launch(
            stream, increment, user_data=nh.by_ref(np.zeros(1, np.int64)), executor=executor
        )
    elif how == "compiled, Python path":
        with _launch.python_path():
            nh.host_launch(
                stream, increment, user_data=nh.by_ref(np.zeros(1, np.int64)), executor=executor
            )
    elif how == "Python callable":  # a record's task
        nh.host_launch(stream, lambda: None, executor=executor)
    elif how == "host_copy":
        nh.host_copy(stream, np.zeros(64, np.uint8), np.ones(64, np.uint8), executor=executor)
    else:  # a signal
        return nh.done_future(stream, executor=executor)
    return None


LAUNCHES = ["compiled", "compiled, Python path", "Python callable", "host_copy", "done_future"]


@pytest.mark.parametrize("how", LAUNCHES)
def test_a_new_stream_with_a_destroyed_streams_handle_gets_a_lane_of_its_own(
    executor, stream, device, how
):
    """CUDA gives a destroyed stream's handle to a later stream, even while the
    destroyed one's work is pending, and a lane is found by its stream's handle.  A
    task comes after held work and a store; then the handle names a new stream
    (``handle_of_a_new_stream``), whose task gets a lane of its own (before: the old
    stream's lane, whose "reached" word the new stream wrote first, so a pool thread
    ran the old task before its stream got there).  The old task still sees the
    store, and both run."""
    cell = device.host_array(3)
    with held_work(device, stream) as release:
        device.store(stream, cell, 0, 1)
        nh.host_launch(stream, observe, user_data=nh.by_ref(cell), executor=executor)
        handle = stream.__cuda_stream__()[1]
        old = executor._lane(handle)
        with handle_of_a_new_stream(stream):
            future = _task_on(how, stream, executor)
            new = executor._lane(handle)
        release()
        if future is not None:
            future.result(timeout=30)
        stream.sync()
    assert new != old
    assert cell[1] == 10  # 10 * cell[0] + cell[2]: the old task ran after the store
    assert executor.outstanding() == 0


@pytest.mark.parametrize("how", LAUNCHES)
def test_a_lane_whose_tasks_have_all_run_is_handed_to_the_next_stream_of_its_handle(
    executor, stream, how
):
    """Once every task of a destroyed stream has run, its lane serves the next stream
    with the handle: a program that makes a stream per request, with handles coming
    back, does not add a lane per stream (the pool's threads look at every lane)."""
    nh.host_launch(stream, lambda: None, executor=executor)
    stream.sync()
    handle = stream.__cuda_stream__()[1]
    lane = executor._lane(handle)
    with handle_of_a_new_stream(stream):
        future = _task_on(how, stream, executor)
        if future is not None:
            future.result(timeout=30)
        stream.sync()
    assert executor._lane(handle) == lane
    assert executor.outstanding() == 0


@pytest.mark.parametrize("how", LAUNCHES)
def test_a_handle_given_again_and_again_reuses_the_lanes_whose_tasks_have_run(
    executor, stream, device, how
):
    """A stream destroyed with tasks pending keeps its lane, and the next stream with its
    handle gets another; once the destroyed stream's tasks have run, its lane serves a
    later renewal of that handle.  So a program that makes a stream per request and
    destroys it with work still queued (the driver giving the handles back) has as
    many lanes per handle as streams of it with tasks outstanding at once, here two,
    not one more for every stream (before: 7 after 6 rounds, each walked by the pool's
    threads at every turn for ever)."""
    from numba_hostfn import _launch

    handle = stream.__cuda_stream__()[1]
    futures, lanes = [], set()
    for _ in range(6):
        with held_work(device, stream) as release:
            futures.append(_task_on(how, stream, executor))  # its lane: the stream's now
            lanes.add(executor._lane(handle))
            with handle_of_a_new_stream(stream):  # destroyed, with that task pending
                futures.append(_task_on(how, stream, executor))
                lanes.add(executor._lane(handle))
                # The native path finds the lane that serves now, not the one passed
                # by (the newest in the pool's list at every second round).
                before = _launch.launch_counts()["fell_through"]
                _task_on("compiled", stream, executor)
                assert _launch.launch_counts()["fell_through"] == before
            release()
            for future in futures:
                if future is not None:
                    future.result(timeout=30)
            stream.sync()
    assert len(lanes) == 2 and executor._lane_count() == 2, (lanes, executor._lane_count())
    assert executor.outstanding() == 0


def test_the_default_lane_leaves_a_destroyed_streams_lane_to_its_pending_waits(stream, device):
    """done_future with no executor waits on the package's default lane: a new stream
    with a destroyed stream's handle, whose wait on that lane is still to come, waits
    on the driver's thread instead (the lane refuses it: LANE_STALE), and the old
    wait resolves once its stream got there, after the store."""
    cell = device.host_array(1)
    with held_work(device, stream) as release:
        device.store(stream, cell, 0, 1)
        waited = nh.done_future(stream)
        with handle_of_a_new_stream(stream):
            other = nh.done_future(stream)
        release()
        waited.result(timeout=30)
        assert cell[0] == 1
        other.result(timeout=30)
    assert waited._watch[0] != 0  # (lane, task): on the default lane
    assert other._watch == (0, 0)  # on the driver's thread


#: A child's setup for the CUDA route's lane enqueue on this CPU (the tests below): a
#: driver table of Python stand-ins, where "reached" is written only when the test says
#: the streams got there (``streams_get_there``), and a compiled task that notes its
#: argument.  The script defines ``stream_id(handle)`` first (what cuStreamGetId answers).
LANE_STAND_INS = textwrap.dedent("""
    import ctypes, os, time
    import numba_hostfn as nh
    from numba_hostfn import _core

    executor = nh.HostExecutor(threads=1)
    vp, c_int, u32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32
    keep, held, ran = [], [], []
    context, pushed, faulted = [0xC0], [], set()  # the streams' context; the watchdog's

    def entry(proto, fn):
        keep.append(proto(fn))
        return ctypes.cast(keep[-1], vp).value

    def put(out, value):
        out[0] = value
        return 0

    def write(stream, address, value, flags):  # the stream is not there yet
        held.append((address, value))
        return 0

    ptr = ctypes.POINTER
    calls = {
        "cuStreamIsCapturing": entry(
            ctypes.CFUNCTYPE(c_int, vp, ptr(c_int)), lambda s, out: put(out, 0)
        ),
        "cuStreamGetId": entry(
            ctypes.CFUNCTYPE(c_int, vp, ptr(ctypes.c_ulonglong)),
            lambda s, out: put(out, stream_id(s)),
        ),
        "cuCtxGetCurrent": entry(ctypes.CFUNCTYPE(c_int, ptr(vp)), lambda out: put(out, 0xC0)),
        "cuStreamGetCtx": entry(
            ctypes.CFUNCTYPE(c_int, vp, ptr(vp)), lambda s, out: put(out, context[0])
        ),
        # The watchdog's query of a context: the one pushed answers 700 if faulted.
        "cuCtxPushCurrent": entry(ctypes.CFUNCTYPE(c_int, vp), lambda c: pushed.append(c) or 0),
        "cuCtxPopCurrent": entry(
            ctypes.CFUNCTYPE(c_int, ptr(vp)), lambda out: put(out, pushed.pop())
        ),
        "cuStreamQuery": entry(
            ctypes.CFUNCTYPE(c_int, vp), lambda s: 700 if pushed[-1] in faulted else 0
        ),
        "cuThreadExchangeStreamCaptureMode": entry(
            ctypes.CFUNCTYPE(c_int, ptr(c_int)), lambda out: put(out, 0)
        ),
        "cuStreamWriteValue32": entry(
            ctypes.CFUNCTYPE(c_int, vp, ctypes.c_uint64, u32, ctypes.c_uint), write
        ),
        "cuStreamBatchMemOp": 0,  # none: the two single calls
    }
    zero = entry(ctypes.CFUNCTYPE(c_int), lambda: 0)
    _core.driver_load(tuple(calls.get(n, zero) for n, _ in _core.driver_entry_points()))
    _core.watchdog_configure(_core.ROUTE_CUDA)
    task = ctypes.CFUNCTYPE(None, vp)(lambda arg: ran.append(arg))
    owner = _core.launch_owner(task, None, None, executor)
    address = ctypes.cast(task, vp).value

    def enqueue(lane):
        return _core.enqueue(_core.ROUTE_CUDA_LANE, lane, _core.RUN_COMPILED, address, 7, owner)

    def streams_get_there():  # "reached" written; then each task's "done", its last step
        for where, value in held:
            u32.from_address(where).value = value
        done = list(held)
        held.clear()
        for _ in range(5000):
            if all(u32.from_address(where + 4).value >= value for where, value in done):
                return
            time.sleep(0.001)
        raise AssertionError("the tasks did not run")
""")


def test_the_cuda_lane_enqueue_refuses_a_stream_it_does_not_serve_until_its_tasks_ran():
    """The CUDA route's lane enqueue (``nhf_exec_cuda_enqueue``), run on this CPU in a
    child whose driver table is Python stand-ins: the stream's id comes from
    ``cuStreamGetId`` and "reached" is written only when the test says the stream got
    there.  With a task of stream 100 still to be reached, an enqueue for stream 200
    on that handle is refused, with nothing put on the stream (``LANE_STALE``); once
    the task has run, the lane is handed to stream 200.  (The tests above check the
    same through ``host_launch`` on the simulator's route; this one, the CUDA route's
    C, which only the GPU suite runs otherwise.)"""
    script = (
        textwrap.dedent("""
        now = [100]

        def stream_id(handle):
            return now[0]
    """)
        + LANE_STAND_INS
        + textwrap.dedent("""
        import numpy as np

        words = np.zeros(2, np.uint32)
        lane = executor._lane_new(0x7000, words.ctypes.data)
        assert enqueue(lane) == 0 and len(held) == 1  # stream 100's task
        now[0] = 200  # the handle names another stream
        assert enqueue(lane) == _core.LANE_STALE, "a lane with a task pending was handed on"
        assert len(held) == 1 and executor.outstanding() == 1  # nothing enqueued
        streams_get_there()
        assert ran == [7]
        assert enqueue(lane) == 0 and len(held) == 1  # every task ran: stream 200's lane now
        streams_get_there()
        assert ran == [7, 7]
        now[0] = 300
        assert enqueue(lane) == 0  # idle again: handed on again
        streams_get_there()
        print("ok", ran)
        os._exit(0)  # the backend was rewired: no exit hooks against it
    """)
    )
    out = run_child(script, env=child_env(NUMBA_HOSTFN_SIMULATOR="1"))
    assert out.strip() == "ok [7, 7, 7]"


def test_a_per_thread_stream_takes_an_idle_lane_of_its_handle_and_never_a_busy_one():
    """Each thread's per-thread default stream (handle 0x2) is another stream, so a lane
    per stream would add a lane for every thread a program ever starts, for the pool to
    walk for ever.  On the CUDA route's C, in a child whose driver table is Python
    stand-ins (cuStreamGetId gives each thread's stream its own id, and "reached" is
    written only when the test says the streams got there): a thread whose stream has
    no lane takes one whose tasks have all run, never one with a task pending; the
    thread that had it, enqueueing on it later, is refused (``LANE_STALE``, nothing
    enqueued) and takes another idle one; three threads use two lanes."""
    script = (
        textwrap.dedent("""
        import itertools, queue, threading

        streams, ids = threading.local(), itertools.count(101)

        def stream_id(handle):  # 0x2: the calling thread's own stream
            if not hasattr(streams, "id"):
                streams.id = next(ids)
            return streams.id if handle == 2 else 1
    """)
        + LANE_STAND_INS
        + textwrap.dedent("""
        class Thread:  # a thread that lives on, with its per-thread stream
            def __init__(self):
                self.calls, self.answers = queue.Queue(), queue.Queue()
                threading.Thread(target=self.serve, daemon=True).start()

            def serve(self):
                while True:
                    call = self.calls.get()
                    try:
                        self.answers.put((True, call()))
                    except BaseException as exc:
                        self.answers.put((False, exc))

            def __call__(self, call):
                self.calls.put(call)
                ok, value = self.answers.get(timeout=60)
                if not ok:
                    raise value
                return value

        one, two, three = Thread(), Thread(), Thread()
        a = one(lambda: executor._lane(2))
        assert one(lambda: enqueue(a)) == 0  # its stream is not there yet
        b = two(lambda: executor._lane(2))
        assert b != a, "a lane with a task pending was handed to another thread's stream"
        assert two(lambda: enqueue(b)) == 0
        streams_get_there()
        c = three(lambda: executor._lane(2))
        assert c in (a, b), "a new lane where an idle one was there"
        assert three(lambda: enqueue(c)) == 0 and len(held) == 1
        had = one if c == a else two  # the thread whose lane c was
        assert had(lambda: enqueue(c)) == _core.LANE_STALE
        assert len(held) == 1 and executor.outstanding() == 1  # nothing enqueued
        other = had(lambda: executor._lane(2))
        assert other in (a, b) and other != c  # the idle one
        assert had(lambda: enqueue(other)) == 0
        streams_get_there()
        assert len(executor._lanes) == 2
        print("ok", ran)
        os._exit(0)  # the backend was rewired: no exit hooks against it
    """)
    )
    out = run_child(script, env=child_env(NUMBA_HOSTFN_SIMULATOR="1"))
    assert out.strip() == "ok [7, 7, 7, 7]"


def _two_contexts_child(how: str) -> str:
    """A child's start for the fault tests of a handle given across contexts: the
    stand-ins (stream id ``now[0]``), and ``enqueue(lane)`` launching a compiled task
    (a direct one, no record) or, for ``how == "Python callable"``, a Python callable
    as _enqueue does (a record)."""
    return (
        textwrap.dedent(f"""
        now, how = [100], {how!r}

        def stream_id(handle):
            return now[0]
    """)
        + LANE_STAND_INS
        + textwrap.dedent("""
        import numpy as np

        if how == "Python callable":
            python = next(row for row in _core.launch_kinds() if row[1] == "python")
            callable_ = lambda: ran.append(7)
            callable_owner = _core.launch_owner(callable_, None, None, executor)

            def enqueue(lane):  # as _enqueue does for a Python callable: a record
                route, run, fn = _core.ROUTE_CUDA_LANE, python[2], python[3]
                return _core.enqueue(route, lane, run, fn, id(callable_), callable_owner)
    """)
    )


@pytest.mark.parametrize("how", ["compiled", "Python callable"])
def test_a_device_fault_fails_the_lanes_of_its_context_not_a_destroyed_streams_of_another(how):
    """The driver gives a destroyed stream's handle to a new stream, and nothing keeps
    that one in the destroyed one's context.  A fault of the new stream's context fails
    the tasks of that stream's lane, and not those of the destroyed stream's lane on the
    same handle, whose context is healthy: its stream still reaches them, and they run.
    (Before: a fault was matched to lanes by the handle alone, and the destroyed
    stream's tasks were failed, never run, though its stream got there.)  On the CUDA
    route's C, in a child whose driver table is Python stand-ins: the watchdog's query
    answers 700 for context 0xA0.  A compiled task is a direct one (no record); a
    Python callable's has a record, which the watchdog fails by its own context, and
    the lane's mark by the lane's."""
    script = _two_contexts_child(how) + textwrap.dedent("""
        words = np.zeros(4, np.uint32)
        destroyed = executor._lane_new(0x7000, words.ctypes.data)
        context[0] = 0xB0
        assert enqueue(destroyed) == 0  # stream 100's task, in context 0xB0
        now[0], context[0] = 200, 0xA0  # the handle now names a stream of context 0xA0
        assert enqueue(destroyed) == _core.LANE_STALE
        new = executor._lane_new(0x7000, words.ctypes.data + 8)
        assert enqueue(new) == 0 and len(held) == 2 and executor.outstanding() == 2
        faulted.add(0xA0)
        for _ in range(5000):  # the watchdog finds it, and the pool fails 0xA0's task
            if executor.outstanding() < 2:
                break
            time.sleep(0.001)
        assert [f[:2] for f in _core.fault_info()] == [(0xA0, 700)], _core.fault_info()
        time.sleep(0.05)  # where the destroyed stream's lane was failed too: failed by now
        assert executor.outstanding() == 1 and ran == [], (executor.outstanding(), ran)
        held[:] = held[:1]  # stream 100 gets there; the faulted stream never does
        streams_get_there()
        assert ran == [7] and executor.outstanding() == 0
        print("ok", ran)
        os._exit(0)  # the backend was rewired: no exit hooks against it
    """)
    out = run_child(script, env=child_env(NUMBA_HOSTFN_SIMULATOR="1"))
    assert out.strip() == "ok [7]"


def test_a_fault_answers_the_lane_of_a_record_that_went_in_flight_after_the_survey():
    """The watchdog surveys what is in flight, asks each context, and fails every
    in-flight record of a faulted one, those that went in flight after the survey
    too; but it answered the executor lanes of the survey's streams only.  A lane
    whose record went in flight on another stream of that context in between was
    never answered: its record failed, no later survey saw its stream, and its
    task stayed outstanding for ever (close() hung; found by a review's stress run).
    Here the record goes in flight inside the query (the stand-in driver's, on the
    CUDA route's C, in a child): the lane of each failed record's stream is answered."""
    script = _two_contexts_child("Python callable") + textwrap.dedent("""
        import numpy as np

        words = np.zeros(4, np.uint32)
        context[0] = 0xA0
        first = executor._lane_new(0x7000, words.ctypes.data)
        later = executor._lane_new(0x8000, words.ctypes.data + 8)
        late = []

        class Faulted(set):  # the query's "is this context faulted?"
            def __contains__(self, ctx):
                if ctx == 0xA0 and not late:  # after the survey, before the answer
                    now[0] = 200
                    late.append(enqueue(later))
                return set.__contains__(self, ctx)

        faulted = Faulted({0xA0})
        assert enqueue(first) == 0  # wakes the watchdog: its survey has stream 0x7000
        for _ in range(5000):
            if late and executor.outstanding() == 0:
                break
            time.sleep(0.001)
        assert late == [0], late
        assert [f[:2] for f in _core.fault_info()] == [(0xA0, 700)], _core.fault_info()
        print("outstanding", executor.outstanding(), "ran", ran)
        os._exit(0)  # the backend was rewired: no exit hooks against it
    """)
    out = run_child(script, env=child_env(NUMBA_HOSTFN_SIMULATOR="1"))
    assert out.strip() == "outstanding 0 ran []", out


@pytest.mark.parametrize("how", ["compiled", "Python callable"])
def test_a_fault_of_a_destroyed_streams_context_leaves_a_new_lane_of_its_handle_alone(how):
    """A stream that got a destroyed stream's handle has a new lane (a renewal); the
    destroyed stream's context faults before that lane's first enqueue has noted the
    new stream's context.  The new lane is not marked: it has no task, and its stream,
    of a healthy context, runs what it enqueues next.  (Before: a lane with no context
    noted matched every fault on its handle, so it was marked, and each launch of the
    healthy stream on it was refused with the fault, for ever: a lane is renewed only
    when it answers LANE_STALE.)  On the CUDA route's C with Python stand-ins, as the
    test above; the watchdog's query answers 700 for context 0xB0."""
    script = _two_contexts_child(how) + textwrap.dedent("""
        words = np.zeros(4, np.uint32)
        destroyed = executor._lane_new(0x7000, words.ctypes.data)
        context[0] = 0xB0
        assert enqueue(destroyed) == 0  # stream 100's task, in context 0xB0
        now[0], context[0] = 200, 0xA0  # the handle now names a stream of context 0xA0
        assert enqueue(destroyed) == _core.LANE_STALE
        new = executor._lane_new(0x7000, words.ctypes.data + 8)  # no enqueue on it yet
        faulted.add(0xB0)  # the destroyed stream's context faults
        for _ in range(5000):  # the watchdog finds it, and the pool fails 0xB0's task
            if executor.outstanding() == 0:
                break
            time.sleep(0.001)
        assert [f[:2] for f in _core.fault_info()] == [(0xB0, 700)], _core.fault_info()
        statuses = [enqueue(new) for _ in range(2)]  # the healthy stream 200's launches
        assert statuses == [0, 0], [hex(s) for s in statuses]
        held[:] = held[1:]  # stream 200 gets there; the faulted stream 100 never does
        streams_get_there()
        print("ok", ran)
        os._exit(0)  # the backend was rewired: no exit hooks against it
    """)
    out = run_child(script, env=child_env(NUMBA_HOSTFN_SIMULATOR="1"))
    assert out.strip() == "ok [7, 7]"


@pytest.mark.parametrize("how", ["compiled", "Python callable", "host_copy", "done_future"])
def test_a_launch_whose_renewed_lanes_stay_stale_is_refused_after_renewals(
    executor, stream, device, monkeypatch, how
):
    """A lane made for a stream notes that stream at its first enqueue, so one renewal
    is enough but where another thread renewed the lane meanwhile.  Should each lane
    renewed for a launch answer LANE_STALE again (here the stale lane, handed back),
    the launch is refused after ``RENEWALS`` of them, a RuntimeError (StaleLane) that
    says why, with nothing enqueued and nothing kept, where it would loop for ever."""
    from numba_hostfn import _enqueue

    renewed = []

    def stale_again(executor_, handle, stale):
        renewed.append(stale)
        assert len(renewed) <= 2 * _enqueue.RENEWALS, "the lane renewed without a bound"
        return stale

    monkeypatch.setattr(_enqueue, "renew_lane", stale_again)
    cell, out = device.host_array(3), np.zeros(64, np.uint8)
    count, called, kept = np.zeros(1, np.int64), [], []

    def launch():
        if how == "compiled":
            nh.host_launch(stream, increment, user_data=nh.by_ref(count), executor=executor)
        elif how == "Python callable":

            def callback():
                called.append(1)

            kept.append(weakref.ref(callback))
            nh.host_launch(stream, callback, executor=executor)
        elif how == "host_copy":
            nh.host_copy(stream, out, np.ones(64, np.uint8), executor=executor)
        else:
            nh.done_future(stream, executor=executor)

    with held_work(device, stream) as release:
        nh.host_launch(stream, observe, user_data=nh.by_ref(cell), executor=executor)
        handle = stream.__cuda_stream__()[1]
        old = executor._lane(handle)
        with handle_of_a_new_stream(stream):
            with pytest.raises(RuntimeError, match="still serves an earlier stream"):
                launch()
        assert executor.outstanding() == 1  # the held task alone
        release()
        stream.sync()
    assert renewed == [old] * _enqueue.RENEWALS
    assert executor.outstanding() == 0
    assert count[0] == 0 and called == [] and not out.any()  # none of it ran
    gc.collect()
    assert all(ref() is None for ref in kept)  # the refused launch kept no owner


def test_a_default_stream_handle_has_a_lane_per_stream_it_names(executor):
    """A CUDA default-stream handle names another stream in each context (0, 0x1), and
    in each thread too (0x2): the core keys its lanes by the stream's unique id
    (cuStreamGetId) and context (before: one lane per handle, whose "reached" word
    two streams then wrote, releasing each other's tasks).  Any other handle names one
    stream everywhere: one lane.  A lane with no task outstanding is handed to the next
    stream of its handle and context (a thread's per-thread stream after another
    thread's; the child test below checks that a lane with a task pending is not),
    never to another context's.  The driver's two answers are stand-ins here, so this
    runs on either backend; the lanes are made, never enqueued on."""
    context = [0xC0]
    ids = {}
    each_thread = threading.local()  # the driver makes each thread a new per-thread stream
    threads_seen = []

    def this_thread():
        if not hasattr(each_thread, "token"):
            threads_seen.append(1)
            each_thread.token = len(threads_seen)
        return each_thread.token

    def get_current(out):
        out[0] = context[0]
        return 0

    def get_id(stream, out):  # as the driver: one stream per context (and thread, for 0x2)
        which = (stream, context[0], this_thread() if stream == 2 else 0)
        out[0] = ids.setdefault(which, len(ids) + 1)
        return 0

    def lanes_on_threads(handle):
        out = []
        for _ in range(2):  # one after the other: the second may reuse the first's id
            t = threading.Thread(target=lambda: out.append(executor._lane(handle)))
            t.start()
            t.join()
        return out

    with driver_stand_ins(cuCtxGetCurrent=get_current, cuStreamGetId=get_id):
        created = 0x7FFF0000  # a created stream's handle: not one of the default three
        a, b = lanes_on_threads(created)
        assert a == b
        a, b = lanes_on_threads(2)  # CU_STREAM_PER_THREAD: each thread's own stream
        assert a == b == executor._lane(2)  # idle: each stream takes it in turn
        context[0] = 0xC1
        other = executor._lane(2)  # another context's stream: a lane of its own
        assert other != a and lanes_on_threads(2) == [other, other]
        context[0] = 0xC0
        for handle in (0, 1):  # the legacy default stream: one per context
            a, b = lanes_on_threads(handle)
            assert a == b == executor._lane(handle)
            context[0] = 0xC1
            assert executor._lane(handle) != a
            context[0] = 0xC0
            assert executor._lane(handle) == a


@pytest.mark.gpu
def test_per_thread_default_streams_of_two_threads_do_not_release_each_others_tasks(
    executor, device
):
    """Two threads, each on its own per-thread default stream (handle 0x2), one
    executor: thread A's task comes after a kernel that stores a value half a second
    later; thread B's stream reaches its own task at once.  A's task sees the value
    (before: both shared one lane, B's arrival ran A's task before A's kernel had
    stored it)."""
    from cuda.core import Stream

    cell = device.host_array(3)
    enqueued = threading.Event()
    errors = []

    def thread_a():
        try:
            device.cuda.set_current()  # a new thread has no current context
            s = Stream.from_handle(0x2)
            device.store(s, cell, 0, 1, delay=0.5)
            nh.host_launch(s, observe, user_data=nh.by_ref(cell), executor=executor)
            enqueued.set()
            s.sync()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
            enqueued.set()

    def thread_b():
        try:
            enqueued.wait(30)
            device.cuda.set_current()
            s = Stream.from_handle(0x2)
            counter = np.zeros(1, np.int64)
            nh.host_launch(s, increment, user_data=nh.by_ref(counter), executor=executor)
            s.sync()
            assert counter[0] == 1
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=thread_a), threading.Thread(target=thread_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    nh.drain()
    assert cell[1] == 10, list(cell)  # A's task saw its kernel's store


def test_every_function_kind_and_user_data_form(executor, stream, device):
    counter = np.zeros(1, np.int64)
    by_address = np.zeros(1, np.int64)
    out = np.zeros(1, np.int64)
    calls = []
    device.delay(stream, 0.02)
    for _ in range(10):
        nh.host_launch(stream, increment, user_data=nh.by_ref(counter), executor=executor)
        nh.host_launch(stream, increment, user_data=by_address.ctypes.data, executor=executor)
        nh.host_launch(
            stream, add_value, user_data=np.array([(out.ctypes.data, 3)], ADD), executor=executor
        )
        nh.host_launch(
            stream, increment.ctypes, user_data=by_address.ctypes.data, executor=executor
        )
        nh.host_launch(stream, increment._cfunc, user_data=counter.ctypes.data, executor=executor)
        nh.host_launch(stream, lambda: calls.append(threading.get_ident()), executor=executor)
    stream.sync()
    assert counter[0] == 20 and by_address[0] == 20 and out[0] == 30
    assert len(calls) == 10
    assert threading.get_ident() not in calls, "a Python callable runs on a pool thread"
    assert executor.outstanding() == 0


def test_streams_run_their_host_work_in_parallel(device):
    """Four tasks on four streams meet: each waits until all four have started. On one
    host-function thread (the driver's, or the simulator's) they could only run one
    after another, and none would meet the others."""
    flags, met = np.zeros(4, np.int64), np.zeros(4, np.int64)
    streams = [device.create_stream() for _ in range(4)]
    try:
        with nh.HostExecutor(threads=4) as ex:
            for i, s in enumerate(streams):
                data = np.array([(flags.ctypes.data, met.ctypes.data, 4, i)], MEET)
                nh.host_launch(s, meet, user_data=data, executor=ex)
            for s in streams:
                s.sync()
    finally:
        for s in streams:
            device.close_stream(s)
    assert met.tolist() == [1, 1, 1, 1]


def test_compiled_tasks_run_while_the_main_thread_holds_the_gil(executor, stream, device):
    # A round in which the stream got there only after the GIL was taken: on a slow
    # machine the device delay can end first.
    for _ in range(5):
        stamps = np.zeros(4, np.int64)
        device.delay(stream, 0.2)
        nh.host_launch(stream, _stamp, user_data=nh.by_ref(stamps), executor=executor)
        start = time.monotonic_ns()
        ctypes.PyDLL(None).usleep(500_000)  # one C call that keeps the GIL
        stream.sync()
        assert stamps[0] == 1
        if stamps[3] > start:
            break
    else:
        pytest.fail("no round in 5 in which the task came after the GIL was taken")
    assert stamps[3] < start + 500_000_000, "an executor task waited for the GIL"


@nh.host_callback
def _stamp(p):
    a = carray(p, (4,), np.int64)
    _clock_gettime(1, a[1:3].ctypes.data)
    a[3] = a[1] * 1_000_000_000 + a[2]
    a[0] += 1


def test_tasks_that_raise_are_reported_and_the_stream_goes_on(executor, stream, unraisables):
    @nh.host_callback
    def raises(p):
        raise ValueError("raised inside an executor task")

    def bad_callable():
        raise KeyError("raised by a Python callable on the pool")

    counter = np.zeros(1, np.int64)
    nh.host_launch(stream, raises, user_data=nh.by_ref(counter), executor=executor)
    nh.host_launch(stream, bad_callable, executor=executor)
    nh.host_launch(stream, increment, user_data=nh.by_ref(counter), executor=executor)
    stream.sync()
    assert counter[0] == 1
    kinds = sorted(type(u.exc_value).__name__ for u in unraisables)
    assert kinds == ["KeyError", "ValueError"]


def test_repr_counts_lanes_and_says_closed(device):
    """The repr counts lanes, which a stream may have more than one of over its life
    (a reused handle, a default handle's stream in each thread): it never says
    streams.  (Before: "1 streams".)"""
    ex = nh.HostExecutor(threads=2)
    try:
        assert repr(ex) == "<numba_hostfn.HostExecutor threads=2 0 lanes>"
        counter = np.zeros(1, np.int64)
        first, second = device.create_stream(), device.create_stream()
        for stream, lanes in ((first, "1 lane"), (first, "1 lane"), (second, "2 lanes")):
            nh.host_launch(stream, increment, user_data=nh.by_ref(counter), executor=ex)
            stream.sync()
            assert repr(ex).endswith(f" {lanes}>"), repr(ex)
        assert counter[0] == 3
    finally:
        ex.close()
    assert repr(ex) == "<numba_hostfn.HostExecutor threads=2 closed>"


def test_repr_of_an_executor_whose_close_was_interrupted_says_it_is_stopped(stream):
    """repr() of an executor whose close() was interrupted (a signal handler raised out
    of its wait, a task still running) says it is stopped, and how many tasks its
    threads still run: it refuses launches, and is not :attr:`closed`.  Before: "1 lane",
    the repr of an open executor, the same as before close()."""
    import signal

    class Interrupted(Exception):
        pass

    def handler(signum, frame):  # only inside close(): a signal elsewhere does nothing
        if frame is not None and frame.f_code is nh.HostExecutor.close.__code__:
            raise Interrupted

    gate, stop = threading.Event(), threading.Event()

    def interrupt():  # until close() has raised: its wait checks for signals every 50 ms
        while not stop.wait(0.01):
            signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)

    previous = signal.signal(signal.SIGUSR1, handler)
    ex = nh.HostExecutor(threads=2)
    interrupter = threading.Thread(target=interrupt)
    try:
        nh.host_launch(stream, lambda: gate.wait(60), executor=ex)
        interrupter.start()
        with pytest.raises(Interrupted):
            ex.close()
        stop.set()
        interrupter.join()
        assert not ex.closed and ex.outstanding() == 1
        assert repr(ex) == "<numba_hostfn.HostExecutor threads=2 stopped, 1 task outstanding>"
    finally:
        stop.set()
        signal.signal(signal.SIGUSR1, previous)
        gate.set()
        ex.close()
    assert repr(ex) == "<numba_hostfn.HostExecutor threads=2 closed>"


def test_a_new_executor_with_nothing_outstanding_uses_no_cpu():
    """A HostExecutor's threads park from their start until a launch wakes them: one
    with nothing outstanding uses no CPU, as the docstring says.  Before, each thread
    spun for ``spin_us`` after it started, as after a task: here, four threads kept the
    cores busy throughout (about 2 CPU seconds per second on two cores)."""
    ex = nh.HostExecutor(threads=4, spin_us=10_000_000)  # a spin longer than the window
    try:
        cpu, wall = time.process_time(), time.perf_counter()
        time.sleep(0.2)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    finally:
        ex.close()
    # Parked: about nothing.  Spinning: a core per thread, as many as there are.
    assert cpu < 0.5 * wall, f"{cpu:.3f} CPU seconds in {wall:.3f} s with nothing outstanding"


def test_repr_of_an_executor_whose_init_never_ran_says_so():
    """repr() of a HostExecutor whose __init__ never ran (a subclass's that skips
    super().__init__(), as test_an_executor_whose_init_never_ran_is_refused_clearly_...
    makes) says it was not started.  Before: AttributeError ('threads'), from repr itself,
    so a debugger, a log line or pytest's own report of the object failed."""

    class Forgetful(nh.HostExecutor):
        def __init__(self) -> None:  # no super().__init__(): no pool, no threads
            self.name = "mine"

    executor = Forgetful()
    assert repr(executor) == "<numba_hostfn.HostExecutor threads=? not started>"
    executor.close()  # nothing to stop
    assert repr(executor) == "<numba_hostfn.HostExecutor threads=? not started>"


def test_a_second_init_is_refused_and_changes_nothing(executor, stream):
    """HostExecutor.__init__ again reset its lanes, words and closed flag before the
    native start refused: a closed executor then said it was open."""
    counter = np.zeros(1, np.int64)
    nh.host_launch(stream, increment, user_data=nh.by_ref(counter), executor=executor)
    stream.sync()
    lanes = dict(executor._lanes)
    with pytest.raises(RuntimeError, match="started already"):
        nh.HostExecutor.__init__(executor, threads=1)
    assert executor._lanes == lanes and executor.threads != 1
    nh.host_launch(stream, increment, user_data=nh.by_ref(counter), executor=executor)
    stream.sync()
    assert counter[0] == 2
    executor.close()
    with pytest.raises(RuntimeError, match="started already"):
        nh.HostExecutor.__init__(executor)
    assert executor.closed


def test_a_concurrent_second_init_is_refused_and_changes_nothing(device, stream, monkeypatch):
    """Two threads in HostExecutor.__init__ of one object at once, both past its
    started check before either started the pool: the native start lets one pool in
    (no thread is left running), but the other reset the executor's threads, lanes,
    words and closed flag before its start was refused, so an executor that had
    launched and closed meanwhile said it was open, with another count of threads."""
    from numba_hostfn import _executor

    executor = nh.HostExecutor.__new__(nh.HostExecutor)
    nh.host_launch(stream, increment, user_data=nh.by_ref(np.zeros(1, np.int64)))
    stream.sync()  # the backend's own threads are started: only the pool's come and go
    threads = threads_but_watchdog()
    both_checked = threading.Barrier(2, timeout=30)
    first_done = threading.Event()
    waited = set()
    real = _executor.get_backend

    def get_backend():
        # __init__ asks for the backend after its started check: both are past it here.
        me = threading.current_thread().name
        if me in ("first", "second") and me not in waited:
            waited.add(me)
            both_checked.wait()
            if me == "second":  # until the first has started, launched and closed
                first_done.wait(30)
        return real()

    monkeypatch.setattr(_executor, "get_backend", get_backend)
    counter = np.zeros(1, np.int64)
    errors = {}

    def first():
        try:
            if not device.simulator:  # a new thread has no current context: the words'
                device.cuda.set_current()
            nh.HostExecutor.__init__(executor, threads=2)
            nh.host_launch(stream, increment, user_data=nh.by_ref(counter), executor=executor)
            stream.sync()
            executor.close()
        finally:
            first_done.set()

    def second():
        try:
            nh.HostExecutor.__init__(executor, threads=3)
        except RuntimeError as exc:
            errors["second"] = exc

    runners = [threading.Thread(target=f, name=f.__name__) for f in (first, second)]
    for runner in runners:
        runner.start()
    for runner in runners:
        runner.join(60)
    assert "started already" in str(errors.get("second")), errors
    assert counter[0] == 1
    assert executor.closed and executor.threads == 2, (executor.closed, executor.threads)
    assert repr(executor) == "<numba_hostfn.HostExecutor threads=2 closed>"
    with pytest.raises(RuntimeError, match="closed"):
        nh.host_launch(stream, increment, user_data=nh.by_ref(counter), executor=executor)
    for _ in range(1000):  # the two threads above end, and close() joined the pool's
        if threads_but_watchdog() <= threads:
            break
        time.sleep(0.01)
    assert threads_but_watchdog() <= threads


def test_an_init_interrupted_at_any_line_leaves_no_thread_running():
    """A Ctrl-C at any line of HostExecutor.__init__ (a trace function raises it there):
    an executor whose pool had started is closed when collected, its threads joined,
    whatever it had set by then (the pool starts before anything is written, so that a
    concurrent second __init__ is refused having changed nothing)."""
    from numba_hostfn import _executor

    nh.HostExecutor(threads=1).close()  # the backend's own threads are started
    threads = threads_but_watchdog()
    code = _executor.HostExecutor.__init__.__code__
    left = {}
    for line in sorted({line for _, _, line in code.co_lines() if line is not None}):
        fired = []

        def local(frame, event, arg, line=line, fired=fired):
            if event == "line" and frame.f_lineno == line and not fired:
                fired.append(line)
                raise KeyboardInterrupt
            return local

        sys.settrace(lambda frame, event, arg: local if frame.f_code is code else None)
        try:
            nh.HostExecutor(threads=3).close()
        except KeyboardInterrupt:
            pass
        finally:
            sys.settrace(None)
        gc.collect()
        for _ in range(1000):
            if threads_but_watchdog() <= threads:
                break
            time.sleep(0.01)
        if threads_but_watchdog() > threads:
            left[line] = threads_but_watchdog() - threads
            threads = threads_but_watchdog()
    assert left == {}, left


def test_reuse_lane_refuses_a_stale_lane_that_is_not_the_executors(executor, stream, device):
    """``_reuse_lane`` marks the stale lane it is given: an address that is no lane of
    this executor (another executor's, or none) is refused, never written to."""
    handle = stream.__cuda_stream__()[1]
    nh.host_launch(stream, lambda: None, executor=executor)
    stream.sync()
    with nh.HostExecutor(threads=1) as other:
        nh.host_launch(stream, lambda: None, executor=other)
        stream.sync()
        for stale in (other._lane(handle), np.zeros(8, np.uint64).ctypes.data):
            with pytest.raises(ValueError, match="no lane of this executor"):
                executor._reuse_lane(handle, stale)
    assert executor._reuse_lane(handle, 0) == 0  # no renewal: none to reuse
    # A lane of another handle is no renewal of this one's: it is not passed by.
    second = device.create_stream()
    nh.host_launch(second, lambda: None, executor=executor)
    second.sync()
    lane = executor._find_lane(second.__cuda_stream__()[1])
    assert lane != 0 and executor._reuse_lane(handle, lane) == 0
    assert executor._find_lane(second.__cuda_stream__()[1]) == lane


def test_close_finishes_outstanding_work_first(stream, device):
    counter = np.zeros(1, np.int64)
    ex = nh.HostExecutor(threads=2)
    device.delay(stream, 0.3)
    for _ in range(50):
        nh.host_launch(stream, increment, user_data=nh.by_ref(counter), executor=ex)
    ex.close()  # waits for the stream to reach and the pool to run all 50
    assert counter[0] == 50
    assert ex.outstanding() == 0 and ex.closed
    ex.close()  # idempotent
    stream.sync()


def test_close_with_nothing_outstanding_does_not_wait_out_the_spin(stream):
    """close() returns once the outstanding tasks have run, whatever ``spin_us`` is.
    Before, each pool thread spun out its ``spin_us`` after its last task (or its
    start, or the wake-up that close itself sent) before it looked at close's quit
    flag, so close() of an idle executor blocked in the join, a core busy per thread
    and deaf to Ctrl-C, for up to ``spin_us``: 10 s at the largest allowed."""
    for launch in (False, True):
        ex = nh.HostExecutor(threads=2, spin_us=10_000_000)
        if launch:
            nh.host_launch(stream, lambda: None, executor=ex)
            stream.sync()
        start = time.monotonic()
        ex.close()
        assert time.monotonic() - start < 5.0, "close() waited for the threads' spin"
        assert ex.closed and ex.outstanding() == 0


def test_close_after_the_last_task_does_not_wait_out_the_other_threads_poll(stream, device):
    """close() returns once the outstanding tasks have run, whatever ``poll_us`` is.
    Before, threads that had gone to sleep for ``poll_us`` while a task was
    outstanding (here: three of four, while the fourth ran it) slept it out before
    they saw close's quit flag: close() after stream.sync() waited up to ``poll_us``
    (a second at the largest allowed) in the join, deaf to Ctrl-C."""
    # Three rounds: a round before the fix waited out the last of three sleeps' ends,
    # each anywhere in the second, so passed (< 0.5 s) one time in eight.
    for _ in range(3):
        ex = nh.HostExecutor(threads=4, spin_us=0, poll_us=1_000_000)
        with held_work(device, stream) as release:
            nh.host_launch(stream, lambda: time.sleep(0.05), executor=ex)
            time.sleep(0.1)  # every thread sleeps its poll_us, the task outstanding
            release()
            stream.sync()  # one thread ran the task; the other three went back to sleep
        start = time.monotonic()
        ex.close()
        assert time.monotonic() - start < 0.5, "close() waited for the threads' poll"
        assert ex.closed and ex.outstanding() == 0


def test_a_close_after_the_threads_were_joined_is_not_taken_for_one_of_its_own_tasks():
    """close()'s native step (``_close``) from a thread started after another close
    joined the pool's threads returns, as a close of a closed pool does.  Before, it
    compared the caller with the joined threads' ids, which glibc gives to the next
    threads started: a second close() racing the first (past ``closed`` before the
    first set it, in a thread started meanwhile) raised "called from one of its own
    tasks"."""
    ex = nh.HostExecutor(threads=4)
    ex.close()  # joins the four threads: their ids are free for the next ones
    refused = []

    def close_again():
        try:
            ex._close()  # what close() runs, for a caller that saw ``closed`` False
        except RuntimeError as exc:
            refused.append(str(exc))

    for _ in range(8):
        t = threading.Thread(target=close_again)
        t.start()
        t.join()
    assert refused == [], refused[0]


def test_close_from_one_of_its_own_tasks_is_refused_and_the_pool_goes_on(stream):
    """A task that closes its own executor gets RuntimeError (close() would wait
    for that task, and join its own thread: main hung for ever)."""
    counter = np.zeros(1, np.int64)
    ex = nh.HostExecutor(threads=2)
    seen = []

    def close_own():
        try:
            ex.close()
        except RuntimeError as exc:
            seen.append(str(exc))

    nh.host_launch(stream, close_own, executor=ex)
    nh.host_launch(stream, increment, user_data=nh.by_ref(counter), executor=ex)
    stream.sync()
    assert len(seen) == 1 and "own tasks" in seen[0], seen
    assert counter[0] == 1 and not ex.closed
    ex.close()
    assert ex.closed


CLOSE_FROM_A_HOST_FUNCTION_SCRIPT = CHILD_PREAMBLE + textwrap.dedent("""
    from _device import Hold

    counter = np.zeros(1, np.int64)
    ex = nh.HostExecutor(threads=2)
    other = nh.HostExecutor(threads=1)
    seen = []

    def close_it():
        try:
            ex.close()
            seen.append("closed")
        except RuntimeError as exc:
            seen.append(str(exc))

    # From a driver host function, then from a task of another executor: each with a
    # task of ex queued behind it on its stream, which close() would wait for.
    for launch_on in ({}, {"executor": other}):
        with Hold(stream):  # both launches are enqueued before the stream gets there
            nh.host_launch(stream, close_it, **launch_on)
            nh.host_launch(stream, increment, user_data=nh.by_ref(counter), executor=ex)
        stream.sync()
    nh.host_launch(stream, increment, user_data=nh.by_ref(counter), executor=ex)
    stream.sync()  # ex goes on
    ex.close()
    other.close()
    nh.drain()
    print(int(counter[0]), ex.closed, nh.pending(),
          [("from a host function" in m, "another thread" in m) for m in seen])
""")


def test_close_from_a_host_function_with_its_tasks_queued_behind_is_refused():
    """close() from a host function, or from another executor's task, while a task of
    the executor is queued behind it on its stream gets RuntimeError (close() waited
    for that task, which waited for the host function: main hung for ever)."""
    out = run_child(CLOSE_FROM_A_HOST_FUNCTION_SCRIPT, timeout=60)
    assert out.split("\n")[-2] == "3 True 0 [(True, True), (True, True)]", out


CLOSE_FROM_A_CTYPES_HOST_FUNCTION_SCRIPT = CHILD_PREAMBLE + textwrap.dedent("""
    import ctypes
    from _device import Hold

    counter = np.zeros(1, np.int64)
    ex = nh.HostExecutor(threads=2)
    other = nh.HostExecutor(threads=1)
    seen = []

    def close_it(_):
        try:
            ex.close()
            seen.append("closed")
        except RuntimeError as exc:
            seen.append(str(exc))

    close_it = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(close_it)  # a CUhostFn
    launch_on = {"executor": other} if ON == "executor" else {}  # else the driver's thread
    with Hold(stream):  # both launches are enqueued before the stream gets there
        nh.host_launch(stream, close_it, **launch_on)
        nh.host_launch(stream, increment, user_data=nh.by_ref(counter), executor=ex)
    stream.sync()
    ex.close()
    other.close()
    nh.drain()
    print(int(counter[0]), ex.closed, nh.pending(), ["from a host function" in m for m in seen])
""")


@pytest.mark.parametrize("launch_on", ["executor", "driver"])
def test_close_from_a_ctypes_host_function_with_its_tasks_queued_behind_is_refused(
    request, launch_on
):
    """A ctypes CUhostFn that calls Python runs through no Python callable's
    trampoline, so nothing marked its thread as a host function's: its close(), with a
    task of the executor queued behind it on its stream, waited for that task, which
    waited for it (the child hung, on another executor's thread as on the simulator's
    host-function thread).  Every thread that only runs host functions (a pool's, the
    simulator's) counts as in a host function now.  The driver's own thread on CUDA is
    not the package's to mark: that case runs on the simulator."""
    if launch_on == "driver" and rerun_on_simulator(request):
        return
    script = f"ON = {launch_on!r}\n" + CLOSE_FROM_A_CTYPES_HOST_FUNCTION_SCRIPT
    out = run_child(script, timeout=60)
    assert out.split("\n")[-2] == "1 True 0 [True]", out


CLOSE_RACING_A_LAUNCH_SCRIPT = CHILD_PREAMBLE + textwrap.dedent("""
    import threading, time
    from _device import Hold
    from numba_hostfn import _core

    counter = np.zeros(1, np.int64)
    ex = nh.HostExecutor(threads=2)
    nh.host_launch(stream, increment, user_data=nh.by_ref(counter), executor=ex)
    stream.sync()  # the lane exists
    seen = []

    def close_it():
        try:
            ex.close()
            seen.append("closed")
        except RuntimeError as exc:
            seen.append(str(exc))

    hold = Hold(stream)
    nh.host_launch(stream, close_it)
    # 5 s between a launch's open check and its count: wide, so that on a loaded
    # machine (TSan, 2 cores) close_it runs inside the pause once the launch is in it.
    _core._testing.exec_test_pause(5_000_000_000)
    entered = threading.Event()

    def launch():  # a task behind close_it, still uncounted when close_it checks
        entered.set()
        nh.host_launch(stream, increment, user_data=nh.by_ref(counter), executor=ex)

    t = threading.Thread(target=launch)
    t.start()
    entered.wait()
    deadline = time.monotonic() + 30
    while _core._testing.exec_test_paused() == 0 and time.monotonic() < deadline:
        time.sleep(0.001)  # till the launch has seen the pool open, and not counted its task
    assert _core._testing.exec_test_paused(), "the launch never reached its pause"
    hold.release()
    t.join()
    _core._testing.exec_test_pause(0)
    stream.sync()
    ex.close()  # again, from here: it joins the threads
    nh.drain()
    print(int(counter[0]), ex.closed, nh.pending(), ["a launch raced" in m for m in seen])
""")


def test_close_from_a_host_function_racing_a_launch_behind_it_stops_without_waiting():
    """close() from a host function whose check found nothing outstanding, raced by a
    launch behind it that the stopping pool had to count: close() raises instead of
    waiting for it (the executor refuses launches; the task still runs), and a close()
    from another thread finishes the job (without it, close() waited for a task queued
    behind the host function that called it: for ever)."""
    out = run_child(CLOSE_RACING_A_LAUNCH_SCRIPT, timeout=60)
    assert out.split("\n")[-2] == "2 True 0 [True]", out


SYNC_FROM_A_TASK_SCRIPT = CHILD_PREAMBLE + textwrap.dedent("""
    counter = np.zeros(1, np.int64)
    ex = nh.HostExecutor(threads=2)
    seen = []

    def waits(s):
        for wait in (s.sync, s.close):
            try:
                wait()
                seen.append("returned")
            except RuntimeError as exc:
                seen.append("host function" in str(exc))

    other = nh.create_stream()
    nh.host_launch(stream, lambda: waits(stream), executor=ex)  # its own stream
    nh.host_launch(stream, lambda: waits(other), executor=ex)
    stream.sync()
    nh.host_launch(stream, increment, user_data=nh.by_ref(counter), executor=ex)
    nh.host_launch(other, increment, user_data=nh.by_ref(counter), executor=ex)
    stream.sync()
    other.sync()  # both streams go on
    ex.close()
    nh.drain()
    print(seen, int(counter[0]), nh.pending())
""")


def test_a_simulated_sync_or_close_from_an_executor_task_is_refused(request):
    """A task that syncs or closes a simulated stream (its own, or another) gets
    RuntimeError, as a host function on the host-function thread does (main hung
    for ever on its own stream: the stream waited for the task, the task for the
    stream).  On CUDA the sync is cuda.core's call, which cannot tell; the rule is
    the host function's: no CUDA call (docs/threading.md)."""
    if rerun_on_simulator(request):
        return
    out = run_child(SYNC_FROM_A_TASK_SCRIPT, timeout=60)
    assert out.split("\n")[-2] == "[True, True, True, True] 2 0", out


SYNC_FROM_A_CTYPES_TASK_SCRIPT = CHILD_PREAMBLE + textwrap.dedent("""
    import ctypes

    ex = nh.HostExecutor(threads=2)
    seen = []

    def waits(_):
        for wait in (stream.sync, stream.close):
            try:
                wait()
                seen.append("returned")
            except RuntimeError as exc:
                seen.append("host function" in str(exc))

    waits = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(waits)  # a CUhostFn, not a callable
    nh.host_launch(stream, waits, executor=ex)
    stream.sync()
    ex.close()
    nh.drain()
    print(seen, nh.pending())
""")


def test_a_simulated_sync_or_close_from_a_ctypes_executor_task_is_refused(request):
    """As test_a_simulated_sync_or_close_from_an_executor_task_is_refused, for a task
    that is a ctypes CUhostFn calling Python: no trampoline marked the pool thread as
    in a host function, and its sync of its own stream waited for itself (the child
    hung)."""
    if rerun_on_simulator(request):
        return
    out = run_child(SYNC_FROM_A_CTYPES_TASK_SCRIPT, timeout=60)
    assert out.split("\n")[-2] == "[True, True] 0", out


def test_owners_kept_until_run_then_released_on_the_main_thread(executor, stream, device):
    counter = np.zeros(1, np.int64)
    alive = weakref.ref(counter)
    released = []
    weakref.finalize(counter, lambda: released.append(threading.current_thread().name))
    with Hold(stream):
        nh.host_launch(stream, increment, user_data=nh.by_ref(counter), executor=executor)
        del counter
        gc.collect()
        assert alive() is not None
    stream.sync()
    for _ in range(200):
        nh.drain()
        if alive() is None:
            break
        time.sleep(0.005)
    assert alive() is None and released == ["MainThread"]


def test_a_tasks_owner_is_released_with_no_drain_and_nothing_launched_after(executor, stream):
    """A pool thread leaves the drain of what its tasks completed owed, for the
    launching thread's next enqueue to do, and schedules it itself once it has been
    owed 50 µs, or before it sleeps (invariant 14): with no launch after the task and
    no drain() called, the owner is still released, on the main thread.  The first
    task holds the second until both launches returned (a launch drains what ran
    during it)."""
    counter, flag = np.zeros(1, np.int64), np.zeros(1, np.int64)
    released = []
    weakref.finalize(counter, lambda: released.append(threading.current_thread().name))
    before = nh.pending()
    nh.host_launch(stream, _wait_for_flag(), user_data=nh.by_ref(flag), executor=executor)
    try:
        nh.host_launch(stream, increment, user_data=nh.by_ref(counter), executor=executor)
        del counter
        assert nh.pending() == before + 2
    finally:
        flag[0] = 1  # a failure above must not leave the stream held
    stream.sync()
    deadline = time.monotonic() + 10
    while not released and time.monotonic() < deadline:
        time.sleep(0.001)  # pending calls run between the main thread's bytecodes
    assert released == ["MainThread"]


def test_a_tasks_owner_is_released_where_a_record_waits_at_the_pools_last_settle(request):
    """A pool thread's last settle found the lane's producer active (it had taken out
    an owner since the last look: look again later) and a completed record waiting:
    it scheduled the record's drain only, and owed nothing more, so the owner of the
    task that ran last stayed held until some later launch or drain() (invariant 14).
    It owes the lanes' look again now, for its settle before it parks."""
    if rerun_on_simulator(request):
        return
    s1, s2 = nh.simulator.Stream(), nh.simulator.Stream()
    ex = nh.HostExecutor(threads=1)
    counter = np.zeros(1, np.int64)

    def held():
        _, ran, filled, drained = _core._testing.lane_owners()
        return ran - filled - drained

    try:
        for _ in range(3):
            # A task that ran, and whose owner a drain took out.
            nh.host_launch(s1, increment, user_data=nh.by_ref(counter), executor=ex)
            s1.sync()
            for _ in range(50):
                time.sleep(0.001)  # pending calls run between the main thread's bytecodes
            # A record that completes at about 2 ms; the next task, run at about 5 ms
            # (its launch takes the first task's owner out: the producer is active).
            s2.sleep(0.002)
            nh.host_launch(s2, lambda: None)
            s1.sleep(0.005)
            nh.host_launch(s1, increment, user_data=nh.by_ref(counter), executor=ex)
            time.sleep(0.2)  # one call: no pending call runs, the record waits
            deadline = time.monotonic() + 5
            while held() and time.monotonic() < deadline:
                time.sleep(0.002)
            assert held() == 0, "the last task's owner is still held"
    finally:
        ex.close()
        s1.close()
        s2.close()
        nh.drain()


def test_a_refused_launch_on_a_lane_a_drain_skipped_takes_its_owners_out(request):
    """A drain skips a lane whose producer is inside an enqueue (its mutex is never
    waited for with the GIL held) and owes the lanes another look; where that enqueue
    is refused, no task follows for a pool thread to settle after, and the owners of
    the tasks that ran before, past the two the enqueue took out itself, stayed held
    until some later launch or drain() (invariant 14).  The refused enqueue drains
    now, the lanes owed."""
    if rerun_on_simulator(request):
        return
    s = nh.simulator.Stream()
    ex = nh.HostExecutor(threads=1)
    counter = np.zeros(1, np.int64)
    refused = []

    def held():
        _, ran, filled, drained = _core._testing.lane_owners()
        return ran - filled - drained

    def launch():  # paused under the lane's mutex, then refused: the stream closed
        try:
            nh.host_launch(s, increment, user_data=nh.by_ref(counter), executor=ex)
        except RuntimeError as e:
            refused.append(str(e))

    nh.drain()
    try:
        # More tasks than a launch takes the owners of out of its lane (two): held
        # until all four are launched, so that none is taken out meanwhile.
        s.sleep(0.05)
        for _ in range(4):
            nh.host_launch(s, increment, user_data=nh.by_ref(counter), executor=ex)
        _core._testing.exec_test_pause(1_000_000_000)
        t = threading.Thread(target=launch)
        t.start()
        # One call: the tasks run, the pool thread settles and schedules the drain,
        # and the other thread's launch reaches its pause, all before a pending call
        # can run here; the drain then runs, and skips the lane.
        time.sleep(0.3)
        assert _core._testing.exec_test_paused() == 1 and held() == 4
        s.close()
        t.join()
        assert refused and "closed" in refused[0], refused
        deadline = time.monotonic() + 2
        while held() and time.monotonic() < deadline:
            time.sleep(0.002)  # pending calls run between the main thread's bytecodes
        assert held() == 0, "the owner of the task that ran is still held"
    finally:
        _core._testing.exec_test_pause(0)
        ex.close()
        s.close()
        nh.drain()


def test_a_compiled_tasks_owner_is_held_by_its_lane_task_with_no_record(executor, stream):
    """Compiled code on a lane is a direct task (invariant 15): no launch record is
    taken, completed or drained for it; the lane holds the owner, which pending()
    counts, until the task has run, and the launching thread's next enqueues take the
    owners of the tasks that ran out of the lane; a drain takes out the rest.
    (Before: a record a task, pushed on the completed stack by the pool thread and
    drained by the launching thread.)"""
    counter = np.zeros(1, np.int64)
    ref = nh.by_ref(counter)
    nh.drain()
    before, stats = nh.pending(), _core._testing.lane_owners()

    def since():
        now = _core._testing.lane_owners()
        names = ("enqueued", "ran", "filled", "drained")
        return dict(zip(names, np.subtract(now, stats), strict=True))

    owner = (increment, ref, None, executor)  # what the launch keeps (kinds.c)
    flag = np.zeros(1, np.int64)
    nh.host_launch(stream, _wait_for_flag(), user_data=nh.by_ref(flag), executor=executor)
    try:
        nh.host_launch(stream, increment, user_data=ref, executor=executor)
        assert nh.pending() == before + 2  # held by their tasks, not yet run
        assert owner in _core._testing.held_owners()
        assert since()["enqueued"] == 2 and since()["ran"] == 0, since()
    finally:
        flag[0] = 1  # a failure above must not leave the stream held
    stream.sync()
    nh.drain()
    assert since()["filled"] + since()["drained"] == 2, since()

    # The launching thread takes the owners of tasks that ran out as it launches: on
    # a thread of its own, so that its second launch finds the first task run ("done"
    # written) and its owner still held, unless the pool thread's owed drain, a
    # pending call, ran on this thread first, in the few bytecodes before join()
    # blocks (seen on a loaded CI machine): tried until once it was not.  Each try
    # starts with a drain: a try whose first owner went to that drain leaves its
    # second task's owner held, and the next try's first launch would take it out
    # too (seen on CI: filled == [2]).
    def launch_twice(filled):
        nh.drain()
        first = since()["filled"]
        for _ in range(2):
            nh.host_launch(stream, increment, user_data=ref, executor=executor)
            stream.sync()
        filled.append(since()["filled"] - first)

    n = 2
    for _ in range(20):
        filled = []
        thread = threading.Thread(target=launch_twice, args=(filled,))
        thread.start()
        thread.join()
        n += 2
        if filled != [0]:
            break
    assert filled == [1], since()  # the first task's owner, taken out by the second launch

    for _ in range(500):  # volume: taken out by either
        nh.host_launch(stream, increment, user_data=ref, executor=executor)
    n += 500
    stream.sync()
    nh.drain()
    counts = since()
    assert counts["enqueued"] == counts["ran"] == n, counts
    assert counts["filled"] + counts["drained"] == n, counts
    assert nh.pending() == before and int(counter[0]) == n - 1
    assert owner not in _core._testing.held_owners()


def test_tasks_launched_from_several_threads_are_all_released_with_no_drain(executor, device):
    """Completions that owe the drain race its settling (a pool thread clears the
    owed flag, then looks for records; a completion pushes its record, then sets
    the flag): none is left unreleased.  Four threads launch 300 tasks each on
    streams of their own; the main thread then only sleeps until all are released."""
    streams = [device.create_stream() for _ in range(4)]
    counters = [np.zeros(1, np.int64) for _ in streams]

    def launch(i):
        for _ in range(300):
            ref = nh.by_ref(counters[i])
            nh.host_launch(streams[i], increment, user_data=ref, executor=executor)

    threads = [threading.Thread(target=launch, args=(i,)) for i in range(len(streams))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in streams:
        s.sync()
    deadline = time.monotonic() + 10
    while nh.pending() and time.monotonic() < deadline:
        time.sleep(0.001)
    assert nh.pending() == 0
    assert [int(c[0]) for c in counters] == [300] * len(streams)
    for s in streams:
        device.close_stream(s)


def test_host_copy_and_release_after_on_the_executor(executor, stream):
    rng = np.random.default_rng(1)
    small_src, small_dst = rng.random(100), np.zeros(100)
    big_src = rng.random(3 << 20)  # 24 MiB: shared among the pool's threads
    big_dst = np.zeros_like(big_src)
    strided_dst = np.zeros((8, 16))
    nh.host_copy(stream, small_dst, small_src, executor=executor)
    nh.host_copy(stream, big_dst, big_src, executor=executor)
    nh.host_copy(stream, strided_dst[:, :8], small_src[:64].reshape(8, 8), executor=executor)
    token = []
    alive = weakref.ref(executor)
    nh.release_after(stream, token, executor=executor)
    stream.sync()
    nh.drain()
    assert np.array_equal(small_dst, small_src)
    assert np.array_equal(big_dst, big_src)
    assert np.array_equal(strided_dst[:, :8], small_src[:64].reshape(8, 8))
    assert not strided_dst[:, 8:].any()
    assert alive() is executor


@pytest.mark.parametrize("n", [1 << 20, (1 << 20) + 1, (3 << 20) + 77, 5_000_003])
def test_shared_out_copies_of_odd_sizes_and_alignments(executor, stream, n):
    """A copy shared among the pool's threads (streaming stores after a head that
    aligns the destination, memcpy for the tail) copies exactly its bytes."""
    rng = np.random.default_rng(n)
    for off_src, off_dst in [(0, 0), (1, 3), (7, 61), (63, 1)]:
        src = rng.integers(0, 256, n + 64, dtype=np.uint8)
        dst = np.zeros(n + 64, np.uint8)
        nh.host_copy(
            stream, dst[off_dst : off_dst + n], src[off_src : off_src + n], executor=executor
        )
        stream.sync()
        assert np.array_equal(dst[off_dst : off_dst + n], src[off_src : off_src + n])
        assert not dst[:off_dst].any() and not dst[off_dst + n :].any(), "wrote outside"
    nh.drain()


def test_bad_arguments_are_refused_with_nothing_enqueued(stream):
    with pytest.raises(ValueError, match="1 to 1024"):
        nh.HostExecutor(threads=0)
    with pytest.raises(TypeError, match="int"):
        nh.HostExecutor(threads=2.5)
    with pytest.raises(TypeError, match="int"):
        nh.HostExecutor(threads=True)
    with pytest.raises(ValueError, match="poll_us"):
        nh.HostExecutor(poll_us=0)
    with pytest.raises(TypeError, match="spin_us"):
        nh.HostExecutor(spin_us="fast")
    counter = np.zeros(1, np.int64)
    refs = sys.getrefcount(counter)
    with pytest.raises(TypeError, match="HostExecutor"):
        nh.host_launch(stream, increment, user_data=nh.by_ref(counter), executor=object())
    closed = nh.HostExecutor(threads=1)
    closed.close()
    with pytest.raises(RuntimeError, match="closed"):
        nh.host_launch(stream, increment, user_data=nh.by_ref(counter), executor=closed)
    with pytest.raises(RuntimeError, match="closed"):
        nh.host_copy(stream, np.zeros(4), np.ones(4), executor=closed)
    assert nh.pending() == 0 and sys.getrefcount(counter) == refs


def test_an_executor_whose_init_never_ran_is_refused_clearly_with_nothing_enqueued(stream):
    """executor= a HostExecutor whose __init__ never ran (a subclass's __init__ that does
    not call super().__init__()) raises RuntimeError saying so, from every entry point,
    with nothing enqueued.  Before: AttributeError ('_closed'), from the argument check."""

    class Forgetful(nh.HostExecutor):
        def __init__(self) -> None:  # no super().__init__(): no pool, no lanes
            self.name = "mine"

    executor = Forgetful()
    counter = np.zeros(1, np.int64)
    refs = sys.getrefcount(counter)
    for launch in (
        lambda: nh.host_launch(stream, increment, user_data=nh.by_ref(counter), executor=executor),
        lambda: nh.host_launch(stream, lambda: None, executor=executor),
        lambda: nh.host_copy(stream, np.zeros(4), np.ones(4), executor=executor),
        lambda: nh.release_after(stream, counter, executor=executor),
        lambda: nh.done_future(stream, executor=executor),
    ):
        with pytest.raises(RuntimeError, match=r"not started.*super\(\).__init__"):
            launch()
    assert nh.pending() == 0 and sys.getrefcount(counter) == refs


def test_the_methods_of_an_executor_whose_init_never_ran_say_how_to_fix_it():
    """outstanding() and graph_nodes() of a HostExecutor whose __init__ never ran say
    what is missing, as executor= does.  Before: "the HostExecutor was not started",
    with no start() to call and no word of super().__init__()."""

    class Forgetful(nh.HostExecutor):
        def __init__(self) -> None:  # no super().__init__(): no pool
            self.name = "mine"

    executor = Forgetful()
    for method in (executor.outstanding, executor.graph_nodes):
        with pytest.raises(RuntimeError, match=r"not started.*super\(\).__init__"):
            method()


def test_a_task_the_stream_has_passed_is_not_outstanding(stream):
    """A pool thread counts a task out before its "done" write, so once stream.sync()
    returned, outstanding() is 0.  Before, it counted it out after the write: a loaded
    H200 run read 1 there (test_a_refused_stream_operation_takes_the_task_back); a
    pause after the write (exec_done_pause) makes that window long."""
    counter = np.zeros(1, np.int64)
    _core._testing.exec_done_pause(300_000_000)  # 0.3 s after each task's "done" write
    try:
        with nh.HostExecutor(threads=1) as executor:
            nh.host_launch(stream, increment, user_data=nh.by_ref(counter), executor=executor)
            stream.sync()
            assert counter[0] == 1 and executor.outstanding() == 0
    finally:
        _core._testing.exec_done_pause(0)


ORDER = np.dtype([("out", np.uint64), ("value", np.int64)])


@nh.host_callback(dtype=ORDER)
def note_order(d):
    """out[0] += 1, then out[out[0]] = value: the order the tasks ran in."""
    out = carray(nh.as_voidptr(d.out), (1024,), np.int64)
    out[0] += 1
    out[out[0]] = d.value


def test_a_lanes_tasks_run_in_order_as_its_task_memory_is_reused(executor, stream):
    """A lane's tasks are one chain whose memory the producer reuses once the pool's
    threads have passed it (pool.c): batches of every size, held and not, some behind
    tasks still queued, run each task once, in the order launched."""
    out = np.zeros(1024, np.int64)
    data = [np.array([(out.ctypes.data, value)], ORDER) for value in range(1, 400)]
    launched = 0

    def launch(count):
        nonlocal launched
        for _ in range(count):
            nh.host_launch(
                stream, note_order, user_data=nh.by_ref(data[launched]), executor=executor
            )
            launched += 1

    for count in (1, 1, 7, 20, 3):
        with Hold(stream):  # the whole batch queued before the stream gets there
            launch(count)
        launch(count)  # and the same count behind it, while it may still run
    stream.sync()
    for count in (1, 2, 30):
        launch(count)
        stream.sync()
    nh.drain()
    assert launched < len(data)
    assert out[0] == launched and list(out[1 : launched + 1]) == list(range(1, launched + 1))
    assert executor.outstanding() == 0


def test_a_refused_stream_operation_takes_the_task_back(request, device):
    """The task is queued before its "reached" write; if the stream refuses the write,
    the task is taken back: nothing outstanding, nothing kept, the lane still works.
    (A closed simulated stream refuses; a CUDA stream cannot be made to on demand.)"""
    if rerun_on_simulator(request):
        return
    counter = np.zeros(1, np.int64)
    refs = sys.getrefcount(counter)
    with nh.HostExecutor(threads=2) as executor:
        stream = device.create_stream()
        nh.host_launch(stream, increment, user_data=nh.by_ref(counter), executor=executor)
        stream.sync()
        lane_stream = stream
        lane_stream.close()  # the lane stays; the stream refuses every later operation
        for _ in range(3):
            with pytest.raises(RuntimeError, match="closed"):
                nh.host_launch(
                    lane_stream, increment, user_data=nh.by_ref(counter), executor=executor
                )
        assert executor.outstanding() == 0
        other = device.create_stream()
        nh.host_launch(other, increment, user_data=nh.by_ref(counter), executor=executor)
        other.sync()
        other.close()
    nh.drain()
    assert counter[0] == 2 and nh.pending() == 0 and sys.getrefcount(counter) == refs


#: A launch with ``executor=`` on a stream the executor has no lane for, which the
#: stream refuses (closed, or its context faulted) or takes as a graph node
#: (capturing): REFUSED_LANE_SCRIPT's cases, each on the simulator.
REFUSED_LANE_SCRIPT = textwrap.dedent("""
    import numba_hostfn as nh
    import numpy as np
    from _device import refusing_sim_streams
    from numba import carray

    @nh.host_callback
    def increment(p):
        carray(p, (1,), np.int64)[0] += 1

    ex = nh.HostExecutor(1)
    counter = np.zeros(1, np.int64)
    closed, capturing, faulted = refusing_sim_streams()
    calls = {
        "host_launch": lambda s: nh.host_launch(
            s, increment, user_data=nh.by_ref(counter), executor=ex
        ),
        "python_callable": lambda s: nh.host_launch(s, print, executor=ex),
        "host_copy": lambda s: nh.host_copy(s, np.zeros(4), np.ones(4), executor=ex),
        "release_after": lambda s: nh.release_after(s, object(), executor=ex),
    }
    for name, call in calls.items():
        for stream, error in ((closed, RuntimeError), (faulted, nh.DeviceFaultError)):
            try:
                call(stream)
            except error:
                pass
            else:
                raise AssertionError(f"{name} on {stream!r} was not refused")
            assert ex._lanes == {}, (name, stream, ex._lanes)
        call(capturing)  # a node of the capture, for the executor's graph slot
        assert ex._lanes == {}, (name, "capturing", ex._lanes)
    graph = capturing.end_capture()
    assert ex.outstanding() == 0
    del graph
    ex.close()
    nh.drain()
    print("ok", counter[0])
""")


def test_a_refused_launch_on_a_stream_with_no_lane_leaves_no_lane():
    """host_launch (compiled and Python callable), host_copy and release_after with
    ``executor=``, on a stream the executor has no lane for: a closed stream and a
    faulted context refuse them with the error the lane's enqueue would raise, and a
    capture takes each as a graph node, and no lane is made for the stream (a lane is
    kept until the executor closes).  Before, the lane was made first, then the
    enqueue refused, and the lane was kept.  On the simulator, in a child (the fault
    is the child's new context's)."""
    out = run_child(REFUSED_LANE_SCRIPT, env=child_env(NUMBA_HOSTFN_SIMULATOR="1"))
    assert out.strip() == "ok 0", out


class Token:
    """Records whether the main thread released it."""

    def __init__(self, released):
        self._released = released

    def __del__(self):
        self._released.append(threading.current_thread() is threading.main_thread())


#: An executor node whose replay a fault gives up on while the node runs (below).
FAULT_DURING_A_NODE_SCRIPT = textwrap.dedent("""
    import functools, threading, time, weakref
    import numba_hostfn as nh
    from numba_hostfn import simulator as sim

    ex = nh.HostExecutor(1)
    events, started = [], threading.Event()

    class Token:
        pass

    def node(token):
        del token  # the launch's owner (the partial) alone holds it now
        started.set()
        time.sleep(0.3)
        events.append("node ran")

    token = Token()
    weakref.finalize(token, events.append, "owner released")
    fn = functools.partial(node, token)
    del token
    sim.new_context()
    x, f = sim.Stream(), sim.Stream()
    x.begin_capture()
    nh.host_launch(x, fn, executor=ex)
    graph = x.end_capture()
    del fn
    graph.launch(x)
    graph.close()  # the queued replay holds the graph's last reference
    assert started.wait(30)
    f.fault("CUDA_ERROR_ILLEGAL_ADDRESS")  # x's context: its replay stops waiting
    deadline = time.monotonic() + 30
    while "owner released" not in events and time.monotonic() < deadline:
        nh.drain()  # releases the replay's record, and so the node's owners
        time.sleep(0.005)
    print(events)
    # The slot goes to the next node made: the old run's "done" is not that node's.
    sim.new_context()
    z = sim.Stream()
    order = []

    def new_node():
        time.sleep(0.1)
        order.append("new node")

    z.begin_capture()
    nh.host_launch(z, new_node, executor=ex)
    graph = z.end_capture()
    graph.launch(z)
    nh.host_launch(z, lambda: order.append("after it"))
    z.sync()
    print(order)
    graph.close()
    ex.close()
""")


def test_a_fault_that_ends_a_replays_wait_for_a_running_node_releases_it_after_the_run(request):
    """A fault of the replay's context ends its wait for an executor node's "done"
    while the node may still run on the pool: the graph then let its record go, and
    the drain released the node's owners under the run (a compiled node's late write
    landed in a freed array), and gave its slot to the next node made, whose stream
    the run's late "done" let past that node before it ran.  The GraphSlot, which
    owns the node's owners, now leaves the slot and them to the run, which gives
    them back when it ends (LIFETIME.md, invariant 16).  On the simulator, in a
    child (its faults)."""
    if rerun_on_simulator(request):
        return
    out = run_child(FAULT_DURING_A_NODE_SCRIPT, env=child_env(NUMBA_HOSTFN_SIMULATOR="1"))
    lines = out.strip().splitlines()
    assert lines[-2:] == [
        "['node ran', 'owner released']",
        "['new node', 'after it']",
    ], out


#: A fault ends a replay's wait while a pool thread that claimed the node waits for
#: the GIL; the graph's record is released and another launch takes it (below).
A_CLAIMED_NODE_WHOSE_RECORD_IS_TAKEN_SCRIPT = textwrap.dedent("""
    import ctypes, sys, time
    import numba_hostfn as nh
    from numba_hostfn import _core, _graphs
    from numba_hostfn import simulator as sim

    slots = []
    _slot_of = _graphs.graph_slot_of

    def graph_slot_of(executor):
        slots.append(_slot_of(executor))
        return slots[-1]

    _graphs.graph_slot_of = graph_slot_of
    ex = nh.HostExecutor(1)
    calls = []

    def node():
        calls.append("node")

    def other():
        calls.append("other")

    sim.new_context()
    y = sim.Stream()  # a healthy context for the later launch
    sim.new_context()
    x, f = sim.Stream(), sim.Stream()
    x.begin_capture()
    nh.host_launch(x, node, executor=ex)
    graph = x.end_capture()
    reached = ctypes.c_uint32.from_address(slots[0].words)
    y.sleep(3)  # the later launch's record stays in flight
    x.sleep(0.3)  # the replay reaches the node 0.3 s on, while this thread holds the GIL
    sys.setswitchinterval(100)
    graph.launch(x)
    graph.close()  # the queued replay holds the graph's last reference
    f.sleep(0.6)
    f.fault("CUDA_ERROR_ILLEGAL_ADDRESS")  # x's context: its replay stops waiting
    held = _core.held()
    deadline = time.monotonic() + 30
    while _core.sim_query(f.handle) != 700 and time.monotonic() < deadline:
        pass  # bytecode only: the GIL stays here, the node's thread waits for it
    while _core.held() >= held and time.monotonic() < deadline:
        _core.drain()  # the graph's record, completed by the fault, back to the free list
    claimed = reached.value == 0 and _core.held() < held
    nh.host_launch(y, other)  # takes that record (the top of the free list)
    sys.setswitchinterval(0.005)
    time.sleep(0.3)  # the node's thread takes the GIL, and runs the node
    y.sync()
    nh.drain()
    print(sorted(calls) if claimed else "not claimed in time")
    ex.close()
""")


def test_a_claimed_node_runs_its_own_callable_after_a_fault_lets_its_record_go(request):
    """A pool thread claims an executor node and waits for the GIL; a fault of the
    replay's context ends the replay's wait, the graph lets its record go, and the
    next launch takes that record.  The slot's run read its callable from the record:
    it ran the other launch's callable (twice in all; a ctypes CUhostFn's user data
    called as a Python object segfaulted).  The slot now runs the launch's own fn
    and arg, which its owners keep (LIFETIME.md, invariant 16).  On the simulator,
    in a child; a child whose node was not claimed in time (a stalled host) runs
    again."""
    if rerun_on_simulator(request):
        return
    for _ in range(3):
        out = run_child(
            A_CLAIMED_NODE_WHOSE_RECORD_IS_TAKEN_SCRIPT,
            env=child_env(NUMBA_HOSTFN_SIMULATOR="1"),
            timeout=90,
        )
        if "not claimed in time" not in out:
            break
    assert out.strip().splitlines()[-1] == "['node', 'other']", out


#: An executor node that drains after a fault ended its replay's wait (below).
A_NODE_DRAINS_ITS_OWN_RELEASE_SCRIPT = textwrap.dedent("""
    import threading, time
    import numba_hostfn as nh
    from numba_hostfn import _core
    from numba_hostfn import simulator as sim

    ex = nh.HostExecutor(1)
    started, faulted, done = threading.Event(), threading.Event(), threading.Event()
    drained = []

    def node():
        started.set()
        assert faulted.wait(30)
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            drained.append(nh.drain())  # may release this node's own graph slot
            time.sleep(0.01)
        done.set()

    sim.new_context()
    x, f = sim.Stream(), sim.Stream()
    x.begin_capture()
    nh.host_launch(x, node, executor=ex)
    graph = x.end_capture()
    graph.launch(x)
    graph.close()
    assert started.wait(30)
    f.fault("CUDA_ERROR_ILLEGAL_ADDRESS")  # x's context: its replay stops waiting
    while _core.sim_query(f.handle) != 700:
        time.sleep(0.001)
    faulted.set()
    assert done.wait(30)  # blocked in C: the node's drains, not this thread's
    nh.drain()
    print("ok", all(n >= 0 for n in drained))
    ex.close()
""")


def test_an_executor_node_that_releases_its_own_slot_does_not_wait_for_itself(request):
    """A slot's give-back while a run of it is in progress is left to that run, and
    waits for nothing: the main thread's drain, while the node waits for the main
    thread, or the node's own drain of its graph's release (a Python callable node,
    after a fault let its graph's record go), whichever comes first, would otherwise
    wait for ever (a give-back that waited for the run hung here).  On the
    simulator, in a child."""
    if rerun_on_simulator(request):
        return
    out = run_child(
        A_NODE_DRAINS_ITS_OWN_RELEASE_SCRIPT, env=child_env(NUMBA_HOSTFN_SIMULATOR="1"), timeout=60
    )
    assert out.strip() == "ok True", out


@pytest.mark.parametrize("how", ["builder", "capture"])
def test_executor_nodes_in_a_graph_run_at_every_replay(executor, stream, device, how):
    """Every kind, in a GraphBuilder or a capture begun by someone else; owned by the graph."""
    counter = np.zeros(1, np.int64)
    src, dst = np.arange(4096, dtype=np.int64), np.zeros(4096, np.int64)
    calls, released = [], []
    token = Token(released)
    alive = weakref.ref(counter)

    def work(target, counter, token):
        nh.host_launch(target, increment, user_data=nh.by_ref(counter), executor=executor)
        nh.host_launch(target, lambda c=counter: calls.append(c[0]), executor=executor)
        nh.host_copy(target, dst, src, executor=executor)
        nh.release_after(target, token, executor=executor)
        nh.host_launch(target, increment, user_data=counter.ctypes.data, executor=executor)

    if how == "builder":
        builder = stream.create_graph_builder().begin_building()
        work(builder, counter, token)
        graph = builder.end_building().complete()
        builder.close()
        launch, close = (lambda: graph.launch(stream)), graph.close
    else:
        capture = Capture(stream, "relaxed")
        work(stream, counter, token)
        capture.end()
        launch, close = capture.launch, capture.close
    del token
    assert executor.graph_nodes() == 5 and executor.outstanding() == 0
    for _ in range(20):
        launch()
    stream.sync()
    assert counter[0] == 40 and calls == list(range(1, 40, 2)) and (dst == src).all()
    time.sleep(0.3)  # past the spin budget: the pool waits for replays as a poller
    launch()
    stream.sync()
    assert counter[0] == 42
    assert released == []
    del counter
    close()
    assert released_eventually(alive, device, pending=0)
    assert released == [True]
    assert executor.graph_nodes() == 0 and nh.pending() == 0


def test_an_executor_node_whose_capture_another_thread_ends_first_runs_on_its_lane(
    executor, stream, device
):
    """An executor's node read the stream's capture, armed a graph slot that the
    graph's record owns, then captured the slot's three operations.  Where another
    thread ended the capture in between, CUDA put the operations on the stream
    instead: they waited for a slot that destroying the graph disarmed (and gave to
    a later node), so the stream never went on.  The capture is read again around
    the operations now: the task goes to the executor's lane on the stream."""
    counter, replayed = np.zeros(1, np.int64), np.zeros(1, np.int64)
    with held_work(device, stream) as release:
        capture = Capture(stream, "relaxed")
        nh.host_launch(stream, increment, user_data=nh.by_ref(replayed), executor=executor)
        run_at_line(
            numba_hostfn._graphs.add_captured_node,
            "return backend.add_slot_nodes(graph, handle, *_slot_record(backend, graph, launch))",
            lambda: nh.host_launch(
                stream, increment, user_data=nh.by_ref(counter), executor=executor
            ),
            capture.end,
        )
        assert executor.graph_nodes() == 2, "the node before, and the slot the graph's own"
        capture.close()
        for _ in range(500):  # CUDA destroys the graph's user objects asynchronously
            gc.collect()
            nh.drain()
            if executor.graph_nodes() == 0:
                break
            time.sleep(0.01)
        assert executor.graph_nodes() == 0, "the graph's slots are disarmed with it"
        release()
        deadline = time.monotonic() + 30
        while counter[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert counter[0] == 1, "the task ran on the stream, on the executor"
    stream.sync()
    assert counter[0] == 1 and replayed[0] == 0


def test_an_executors_new_block_of_words_keeps_a_global_mode_capture(
    executor, stream, device, monkeypatch
):
    """An executor takes a new block of pinned words at its 513th lane or graph node,
    maybe while the program captures: a cuMemHostAlloc while a thread captures in
    global mode (torch's default) invalidates the capture.  Every block is taken
    with this thread in relaxed capture mode, as the default lane's always was."""
    from numba_hostfn import _executor

    backend, relaxed, allocated = executor._backend, [], []
    mode, memory = backend.relaxed_capture_mode, backend.executor_memory

    @contextlib.contextmanager
    def relaxed_mode():
        with mode():
            relaxed.append(True)
            try:
                yield
            finally:
                relaxed.pop()

    def executor_memory(nbytes):
        allocated.append(bool(relaxed))
        return memory(nbytes)

    monkeypatch.setattr(backend, "relaxed_capture_mode", relaxed_mode)
    monkeypatch.setattr(backend, "executor_memory", executor_memory)
    executor._block_used = _executor._WORDS_PER_BLOCK  # this block used up
    counter = np.zeros(1, np.int64)
    capture = Capture(stream, "global")
    nh.host_launch(stream, increment, user_data=nh.by_ref(counter), executor=executor)
    capture.end()  # on a GPU: CUDA_ERROR_STREAM_CAPTURE_INVALIDATED without it
    assert allocated == [True]
    for _ in range(2):
        capture.launch()
    stream.sync()
    capture.close()
    assert counter[0] == 2


KEPT_GIL_IN_AN_EXECUTOR_NODE_SCRIPT = (
    CHILD_PREAMBLE
    + TAKE_GIL_AND_KEEP_IT
    + textwrap.dedent("""
    import threading
    from _device import Capture, graph_records_released

    @nh.host_callback
    def keeps_gil(p):
        take_gil_and_keep_it()
        carray(p, (1,), np.int64)[0] += 1

    kept = np.zeros(1, np.int64)
    with nh.HostExecutor(threads=1) as ex:
        capture = Capture(stream, "relaxed")
        nh.host_launch(stream, keeps_gil, user_data=nh.by_ref(kept), executor=ex)
        capture.end()
        for _ in range(3):
            capture.launch()
        stream.sync()
        ran = []
        other = threading.Thread(target=ran.append, args=(1,))
        other.start()
        other.join()
        capture.close()
    graph_records_released(stream)
    print("replays ran:", kept[0], ran, nh.pending())
""")
)


def test_an_executor_node_whose_body_keeps_the_gil_gives_it_back_at_every_replay():
    """Invariant 13 on a graph's executor node: a compiled body that returns holding
    the GIL (numba's print or objmode in a cfunc whose Environment is not registered
    does) has it given back by the pool thread, after every replay, as after a lane's
    task (``run``).  Before, the pool thread ran the node's code itself
    (``nhf_slot_run``) and kept the GIL: the first replay stopped every Python thread,
    ``stream.sync()`` included, for ever."""
    out = run_child(KEPT_GIL_IN_AN_EXECUTOR_NODE_SCRIPT, timeout=60)
    assert out.split("\n")[-2] == "replays ran: 3 [1] 0", out


def test_executor_graph_nodes_follow_stream_order(executor, stream, device):
    """The node runs after the graph's earlier device work and before its later work."""
    cell = device.host_array(3)
    capture = Capture(stream, "relaxed")
    device.store(stream, cell, 0, 1, delay=0.02)
    nh.host_launch(stream, observe, user_data=nh.by_ref(cell), executor=executor)
    device.store(stream, cell, 2, 7)
    capture.end()
    for _ in range(3):
        cell[:] = 0
        capture.launch()
        stream.sync()
        assert list(cell) == [1, 10, 7]
    capture.close()


def test_closed_executor_answers_its_graphs_until_they_are_gone(stream, device):
    """close() stops new launches; the pool still serves replays of live graphs, then quits."""
    gc.collect()  # pools and streams of earlier tests end their threads now, not during this one
    threads = threads_but_watchdog()
    counter = np.zeros(1, np.int64)
    executor = nh.HostExecutor(threads=2)
    builder = stream.create_graph_builder().begin_building()
    nh.host_launch(builder, increment, user_data=nh.by_ref(counter), executor=executor)
    graph = builder.end_building().complete()
    builder.close()
    executor.close()
    with pytest.raises(RuntimeError, match="closed"):
        nh.host_launch(stream, increment, user_data=nh.by_ref(counter), executor=executor)
    for _ in range(3):
        graph.launch(stream)
    stream.sync()
    assert counter[0] == 3
    alive = weakref.ref(counter)
    del counter, executor
    graph.close()
    assert released_eventually(alive, device)
    for _ in range(200):  # the detached threads quit once the last slot is disarmed
        if threads_but_watchdog() <= threads:
            break
        time.sleep(0.01)
    for _ in range(1000):  # the two threads above end, and close() joined the pool's
        if threads_but_watchdog() <= threads:
            break
        time.sleep(0.01)
    assert threads_but_watchdog() <= threads


def test_graph_slots_are_reused(executor, stream):
    """A node's words serve a later node once its graph is gone: no growth per capture."""
    counter = np.zeros(1, np.int64)
    seen = set()
    for _ in range(5):
        builder = stream.create_graph_builder().begin_building()
        nh.host_launch(builder, increment, user_data=nh.by_ref(counter), executor=executor)
        graph = builder.end_building().complete()
        builder.close()
        graph.launch(stream)
        stream.sync()
        graph.close()
        for _ in range(100):
            nh.drain()
            gc.collect()
            if executor.graph_nodes() == 0:
                break
            time.sleep(0.01)
        assert executor.graph_nodes() == 0
        seen.add(executor._block_used)  # words taken: none after the first node
    assert counter[0] == 5 and len(seen) == 1


def test_pool_threads_give_their_thread_states_back_at_close(stream):
    before = thread_state_count()
    for _ in range(5):
        with nh.HostExecutor(threads=3) as ex:
            for _ in range(6):
                nh.host_launch(stream, lambda: None, executor=ex)
            stream.sync()
    nh.drain()
    assert thread_state_count() <= before  # <=: an earlier test's thread may end meanwhile


EXIT_SCRIPT = CHILD_PREAMBLE + textwrap.dedent("""
    import atexit
    counter = np.zeros(1, np.int64)
    calls = []
    executor = nh.HostExecutor(threads=2)

    def sync_at_exit():
        stream.sync()  # returns only if every "reached" got its "done"
        print("synced at exit", counter[0], len(calls), flush=True)

    atexit.register(sync_at_exit)
    device.delay(stream, 1.0)
    for _ in range(200):
        nh.host_launch(stream, increment, user_data=nh.by_ref(counter), executor=executor)
        nh.host_launch(stream, lambda: calls.append(1), executor=executor)
    print("exiting", flush=True)
""")


def test_exit_with_executor_work_outstanding_writes_every_done():
    """At exit, Python callables are skipped but their "done" is still written."""
    lines = run_child(EXIT_SCRIPT).splitlines()
    assert lines[0] == "exiting"
    words = lines[1].split()
    assert words[:3] == ["synced", "at", "exit"]
    assert int(words[3]) == 200, "compiled tasks run at exit"
    assert int(words[4]) < 200, "Python callables are skipped once the interpreter exits"


# ---- GPU: executor nodes in torch.cuda.graph and in explicit cuda.core graphs ----


@pytest.mark.gpu
def test_executor_nodes_in_torch_cuda_graph(executor, device):
    import torch

    counter = np.zeros(1, np.int64)
    calls = []
    alive = weakref.ref(counter)
    x = torch.zeros(4, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=torch.cuda.Stream()):
        x += 1
        stream = torch.cuda.current_stream()
        nh.host_launch(stream, increment, user_data=nh.by_ref(counter), executor=executor)
        nh.host_launch(stream, lambda: calls.append(1), executor=executor)
        x += 1
    for _ in range(100):
        g.replay()
    torch.cuda.synchronize()
    assert counter[0] == 100 and len(calls) == 100 and float(x[0]) == 200
    del counter
    del g
    assert released_eventually(alive, device, pending=0)
    assert executor.graph_nodes() == 0 and nh.pending() == 0


@pytest.mark.gpu
def test_executor_nodes_in_an_explicit_graph_chain(executor, device, stream):
    from cuda.core.graph import GraphDefinition

    counter = np.zeros(1, np.int64)
    src, dst = np.arange(1 << 18, dtype=np.int64), np.zeros(1 << 18, np.int64)
    alive = weakref.ref(counter)
    definition = GraphDefinition()
    first = nh.host_launch(definition, increment, user_data=nh.by_ref(counter), executor=executor)
    second = nh.host_copy(first, dst, src, executor=executor)
    third = nh.host_launch(second, increment, user_data=nh.by_ref(counter))  # driver's thread
    assert type(first).__name__ == "ChildGraphNode"
    assert set(definition.edges()) == {(first, second), (second, third)}
    graph = definition.instantiate()
    for _ in range(5):
        graph.launch(stream)
    stream.sync()
    assert counter[0] == 10 and (dst == src).all()
    del counter
    graph.close()
    del definition, first, second, third
    assert released_eventually(alive, device, pending=0)
    assert executor.graph_nodes() == 0 and nh.pending() == 0


class _MemOps:
    """Stand-ins for the executor's driver entry points in the native driver table
    (``_core._testing.driver_swap``: ctypes callbacks that log each call and forward it, or
    refuse it with a CUresult); restored on exit."""

    _NAMES = ("cuStreamWriteValue32", "cuStreamWaitValue32", "cuStreamBatchMemOp")

    _BATCH = ctypes.CFUNCTYPE(
        ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_void_p, ctypes.c_uint
    )
    _SINGLE = ctypes.CFUNCTYPE(
        ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint, ctypes.c_uint
    )

    def __init__(self):
        self.real = tuple(_core._testing.driver_address(n) for n in self._NAMES)
        assert self.real[2], "this driver has cuStreamBatchMemOp"
        self.log = []
        self._keep = []

    def _stand_in(self, prototype, real, name, refuse):
        forward = prototype(real)

        def call(*args):
            self.log.append(name)
            if name == "batch":
                count, ops = args[1], args[2]
                raw = (ctypes.c_char * (48 * count)).from_address(ops)
                entries = np.frombuffer(raw, np.uint32).reshape(count, 12)
                self.log.append(entries[:, [0, 4, 6]].tolist())  # operation, value, flags
            return refuse if refuse else forward(*args)

        stand_in = prototype(call)
        self._keep.append(stand_in)
        return ctypes.cast(stand_in, ctypes.c_void_p).value

    def install(self, batch=0, write=0, wait=0, no_batch=False):
        """Each argument: 0 forwards (and logs) the call, else the CUresult to refuse with."""
        write_real, wait_real, batch_real = self.real
        stand_ins = (
            self._stand_in(self._SINGLE, write_real, "write", write),
            self._stand_in(self._SINGLE, wait_real, "wait", wait),
            0 if no_batch else self._stand_in(self._BATCH, batch_real, "batch", batch),
        )
        for name, address in zip(self._NAMES, stand_ins, strict=True):
            _core._testing.driver_swap(name, address)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for name, address in zip(self._NAMES, self.real, strict=True):
            _core._testing.driver_swap(name, address)


@pytest.mark.gpu
def test_write_and_wait_go_in_one_batch_and_a_refused_batch_falls_back(executor, stream):
    """The "reached" write and the "done" wait are one cuStreamBatchMemOp of two
    entries laid out as the driver's union; if the driver refuses the batch, or has
    none, the two single calls enqueue the task instead.  A driver that answers
    CUDA_ERROR_NOT_SUPPORTED is not asked again."""
    counter = np.zeros(1, np.int64)

    def launch():
        nh.host_launch(stream, increment, user_data=nh.by_ref(counter), executor=executor)
        stream.sync()

    with _MemOps() as ops:
        ops.install()
        launch()
        assert len(ops.log) == 2 and ops.log[0] == "batch", ops.log
        (write_entry, wait_entry) = ops.log[1]
        assert write_entry[0] == 2 and wait_entry[0] == 1  # WRITE_VALUE_32, WAIT_VALUE_32
        assert write_entry[1] == wait_entry[1] > 0  # one number
        assert write_entry[2] == 0 and wait_entry[2] == 0  # WRITE_VALUE_DEFAULT; WAIT_VALUE_GEQ
        for refusal, asked_again in ((1, True), (801, False)):  # INVALID_VALUE, NOT_SUPPORTED
            ops.log.clear()
            ops.install(batch=refusal)
            launch()
            launch()
            calls = [c for c in ops.log if isinstance(c, str)]
            second = ["batch", "write", "wait"] if asked_again else ["write", "wait"]
            assert calls == ["batch", "write", "wait", *second], (refusal, calls)
        ops.log.clear()
        ops.install(no_batch=True)
        launch()
        assert ops.log == ["write", "wait"]
    nh.drain()
    assert counter[0] == 6 and executor.outstanding() == 0


@pytest.mark.gpu
def test_a_refused_write_takes_the_task_back_and_a_refused_wait_still_runs_it(executor, stream):
    """Write refused (after a refused batch): the CUresult is raised, the task taken
    back, nothing kept, and the lane goes on.  Wait refused: the write is on the
    stream, so the task runs when the stream reaches it (invariant 15), and the
    error says the stream does not wait for it."""
    counter = np.zeros(1, np.int64)
    refs = sys.getrefcount(counter)
    with _MemOps() as ops:
        ops.install(batch=1, write=1)
        with pytest.raises(nh.CudaDriverError, match="cuStreamWriteValue32 failed"):
            nh.host_launch(stream, increment, user_data=nh.by_ref(counter), executor=executor)
        assert ops.log[0] == "batch" and ops.log[2:] == ["write"], ops.log
        assert executor.outstanding() == 0
        ops.install(no_batch=True, wait=1)
        with pytest.raises(nh.CudaDriverError, match="does not wait for it"):
            nh.host_launch(stream, increment, user_data=nh.by_ref(counter), executor=executor)
    stream.sync()
    deadline = time.monotonic() + 10
    while counter[0] != 1 and time.monotonic() < deadline:
        time.sleep(0.001)  # the stream did not wait: the task may still be running
    assert counter[0] == 1
    nh.host_launch(stream, increment, user_data=nh.by_ref(counter), executor=executor)
    stream.sync()
    nh.drain()
    assert counter[0] == 2 and executor.outstanding() == 0
    assert sys.getrefcount(counter) == refs


def _built_probe(tmp_path, source_text):
    """A shared library built from ``source_text`` with this machine's C compiler (the
    test is skipped without one): C stand-ins for driver calls."""
    import shutil
    import subprocess

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler for the GIL probe")
    source, library = tmp_path / "probe.c", tmp_path / "probe.so"
    source.write_text(source_text)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    return library


GIL_PROBE_C = """
extern int PyGILState_Check(void);
int gil_held = -1, probed = 0;
int get_ctx(void *stream, void **ctx, void **green) {
    (void)stream, (void)green;
    gil_held = PyGILState_Check();  /* a C stand-in: it takes no GIL itself */
    probed++;
    *ctx = (void *)0xC0;
    return 0;
}
"""


def test_stream_fault_asks_the_driver_for_the_streams_context_with_the_gil_released(tmp_path):
    """Invariant 10: no driver call holds the GIL.  _core.stream_fault (which
    Backend.fault_error calls for every DeviceFaultError it raises) looks the
    stream's context up with cuStreamGetCtx once a fault is noted: on the CUDA route
    with Python stand-ins (LANE_STAND_INS: context 0xC0 faults), then cuStreamGetCtx
    swapped for a C stand-in that records PyGILState_Check()."""
    library = _built_probe(tmp_path, GIL_PROBE_C)
    script = (
        textwrap.dedent("""
        def stream_id(handle):
            return 100
    """)
        + LANE_STAND_INS
        + textwrap.dedent(f"""
        import numpy as np

        words = np.zeros(2, np.uint32)
        lane = executor._lane_new(0x7000, words.ctypes.data)
        assert enqueue(lane) == 0
        faulted.add(0xC0)
        for _ in range(5000):  # the watchdog finds the fault of context 0xC0
            if _core.fault_info():
                break
            time.sleep(0.001)
        assert [f[:2] for f in _core.fault_info()] == [(0xC0, 700)], _core.fault_info()
        probe = ctypes.CDLL({str(library)!r})
        _core._testing.driver_swap("cuStreamGetCtx", ctypes.cast(probe.get_ctx, vp).value)
        assert _core.stream_fault(0x7000) == 700
        assert ctypes.c_int.in_dll(probe, "probed").value >= 1
        print("held", ctypes.c_int.in_dll(probe, "gil_held").value)
        os._exit(0)  # the backend was rewired: no exit hooks against it
    """)
    )
    out = run_child(script, env=child_env(NUMBA_HOSTFN_SIMULATOR="1"))
    assert out.strip() == "held 0", "cuStreamGetCtx was called with the GIL held: " + out


ENQUEUE_GIL_PROBE_C = """
extern int PyGILState_Check(void);
int gil_held = 0, probed = 0;
int is_capturing(void *stream, int *capturing) {
    (void)stream;
    gil_held += PyGILState_Check();  /* C stand-ins: they take no GIL themselves */
    probed++;
    *capturing = 0;
    return 0;
}
int launch_host_func(void *stream, void *fn, void *data) {
    (void)stream, (void)fn, (void)data;  /* accepted, never run */
    gil_held += PyGILState_Check();
    probed++;
    return 0;
}
"""


def test_the_cuda_enqueue_calls_the_driver_with_the_gil_released(tmp_path):
    """Invariant 10: nhf_enqueue_record releases the GIL around the enqueue function,
    the CUDA route's capture check (cuStreamIsCapturing) and cuLaunchHostFunc.  Run on
    this CPU in a child whose driver table has C stand-ins for the two that record
    PyGILState_Check() (the rest answer 0); the launch is accepted and never run."""
    library = _built_probe(tmp_path, ENQUEUE_GIL_PROBE_C)
    script = textwrap.dedent(f"""
        import ctypes, os
        import numba_hostfn as nh
        from numba_hostfn import _core

        vp = ctypes.c_void_p
        probe = ctypes.CDLL({str(library)!r})
        zero = ctypes.CFUNCTYPE(ctypes.c_int)(lambda: 0)
        calls = {{
            "cuStreamIsCapturing": ctypes.cast(probe.is_capturing, vp).value,
            "cuLaunchHostFunc": ctypes.cast(probe.launch_host_func, vp).value,
        }}
        fallback = ctypes.cast(zero, vp).value
        _core.driver_load(tuple(calls.get(n, fallback) for n, _ in _core.driver_entry_points()))
        task = ctypes.CFUNCTYPE(None, vp)(lambda arg: None)
        owner = _core.launch_owner(task, None, None, None)
        address = ctypes.cast(task, vp).value
        status = _core.enqueue(_core.ROUTE_CUDA, 0x7000, _core.RUN_COMPILED, address, 7, owner)
        probed = ctypes.c_int.in_dll(probe, "probed").value
        print(status, probed, ctypes.c_int.in_dll(probe, "gil_held").value, flush=True)
        os._exit(0)  # the backend was rewired: no exit hooks against it
    """)
    out = run_child(script, env=child_env(NUMBA_HOSTFN_SIMULATOR="1"))
    status, probed, held = map(int, out.split())
    assert (status, probed) == (0, 2), out
    assert held == 0, f"{held} of the enqueue's 2 driver calls held the GIL"


FINALIZER_INSIDE_A_LANE_LOOKUP_SCRIPT = CHILD_PREAMBLE + textwrap.dedent("""
    import concurrent.futures  # what done_future imports
    import sys
    from numba_hostfn import _executor

    def held(lock):  # by this thread (a Lock, or an RLock)
        return lock._is_owned() if hasattr(lock, "_is_owned") else lock.locked()

    def finalizer_inside(code, lock, launch, finalizer):
        # launch(), with finalizer() run at the first line of code where this thread
        # holds lock(): where a collection, a drain's release or a signal handler may
        # run one (invariant 11), made certain by a trace function (as
        # test_interrupts makes its interrupts).
        ran = []

        def local(frame, event, arg):
            if event == "line" and not ran and held(lock()):
                ran.append(None)
                ran[0] = finalizer()
            return local

        def tracer(frame, event, arg):
            return local if frame.f_code is code else None

        sys.settrace(tracer)
        try:
            future = launch()
        finally:
            sys.settrace(None)
        return future.result(30), [f.result(30) for f in ran]

    s0, s1, s2, s3 = (device.create_stream() for _ in range(4))
    # The default lane, made while a finalizer waits on a stream.
    f0, inner0 = finalizer_inside(
        _executor.default_lane.__code__, lambda: _executor._default_lock,
        lambda: nh.done_future(s0), lambda: nh.done_future(s1))
    # A new lane of it, looked up while a finalizer waits on another stream.
    f2, inner2 = finalizer_inside(
        _executor.HostExecutor._lane.__code__, lambda: _executor._default._lock,
        lambda: nh.done_future(s2), lambda: nh.done_future(s3))
    for s in (s0, s1, s2, s3):
        s.sync()
    nh.drain()
    print(f0 is s0, inner0 == [s1], f2 is s2, inner2 == [s3], nh.pending())
""")


FINALIZER_INSIDE_A_WORD_CLAIM_SCRIPT = CHILD_PREAMBLE + textwrap.dedent("""
    import sys
    from numba_hostfn import _core, _executor

    def lines_of(code):
        return sorted({line for _, _, line in code.co_lines() if line is not None})

    counter = np.zeros(1, np.int64)
    shared = []
    for fn in (_executor.HostExecutor._words, _executor.HostExecutor._reserve):
        code = fn.__code__
        for line in lines_of(code):
            for new_block in (False, True):
                ex = nh.HostExecutor(threads=1)
                if new_block:  # this block used up: the claim takes a new one first
                    ex._block_used = _executor._WORDS_PER_BLOCK
                a, b = device.create_stream(), device.create_stream()
                fired = []

                def local(frame, event, arg):
                    # The finalizer: a launch with the same executor on another stream,
                    # at this line, where a collection or a drain's release may run it.
                    if event == "line" and frame.f_lineno == line and not fired:
                        fired.append(line)
                        nh.host_launch(b, increment, user_data=nh.by_ref(counter),
                                       executor=ex)
                    return local

                def tracer(frame, event, arg):
                    return local if frame.f_code is code and not fired else None

                sys.settrace(tracer)
                try:
                    nh.host_launch(a, increment, user_data=nh.by_ref(counter), executor=ex)
                finally:
                    sys.settrace(None)
                for _ in range(3):
                    nh.host_launch(a, increment, user_data=nh.by_ref(counter), executor=ex)
                a.sync()
                b.sync()
                if fired:
                    # b reached its one task: its "reached" word says 1, unless a's
                    # lane writes it too (a's tasks are at 4).
                    lane = ex._find_lane(b.__cuda_stream__()[1])
                    if _core.lane_reached(lane, 2, 0, False) != 0:
                        shared.append((fn.__name__, line, new_block))
                        continue  # not closed: a task whose "reached" came early never ran
                ex.close()
                device.close_stream(a)
                device.close_stream(b)
    nh.drain()
    print(shared, nh.pending())
""")


def test_a_finalizer_that_launches_inside_a_word_claim_gets_words_of_its_own():
    """A finalizer that launches with the executor on another stream, run at any line
    of the executor's claim of a lane's words (``_words``, ``_reserve``: under its
    reentrant lock, invariant 11), gets words of its own.  Before, one between the read
    of ``_block_used`` and its increment was given the same words as the launch it
    interrupted: two streams wrote one "reached" word, and a task ran when the other
    stream got there (or its stream went past it before it ran)."""
    out = run_child(FINALIZER_INSIDE_A_WORD_CLAIM_SCRIPT, timeout=120)
    assert out.split("\n")[-2] == "[] 0", out


def test_a_finalizer_that_waits_on_a_stream_inside_a_lane_lookup_does_not_deadlock():
    """A finalizer runs wherever the garbage collector (or a drain's release, or a
    signal handler) interrupts the thread, also while default_lane() or
    HostExecutor._lane holds its lock; one that launches there again (done_future on
    the default lane, here) took that lock again on the same thread, and the process
    hung for ever.  A trace function runs it at such a line on every Python (a
    collection at a chosen allocation did not land there on 3.12)."""
    out = run_child(FINALIZER_INSIDE_A_LANE_LOOKUP_SCRIPT, timeout=30)
    assert out.split("\n")[-2] == "True True True True 0", out
