"""The native driver table (native/driver.h) and the CUDA backend's driver calls
(native/cuda.c), with stand-in entry points (``_core._testing.driver_swap``): what each call
passes the driver, in which order, what it does when one fails, and how it answers
(``(value, CUresult, call)``).  On either backend: the stand-ins replace the table's
entries for one test and are put back; nothing here enqueues real work.  The real
driver's side of the same calls is the GPU suite's (test_graphs, test_executor)."""

import ctypes
import gc
import weakref

import pytest
from _device import child_env, run_child
from _device import driver_stand_ins as stand_ins

import numba_hostfn as nh
from numba_hostfn import _core

vp = ctypes.c_void_p


def test_capture_info_reads_status_and_graph_and_names_a_refusal():
    calls = []

    def info(stream, status, id_, graph, deps, edges, count):
        calls.append((stream, bool(id_), deps, edges, count))
        if stream == 0xBAD:
            return 901  # CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
        status[0] = 1
        graph[0] = 0x6A
        return 0

    with stand_ins(cuStreamGetCaptureInfo=info):
        assert _core.cuda_capture_info(0xABC) == ((1, 0x6A), 0, None)
        assert _core.cuda_capture_info(0xBAD) == ((0, 0), 901, "cuStreamGetCaptureInfo")
    # The optional outs are NULL, the id too: only status and graph are asked for.
    assert calls == [(0xABC, False, None, None, None), (0xBAD, False, None, None, None)]
    assert _core.CU_STREAM_CAPTURE_STATUS_ACTIVE == 1
    assert _core.CU_STREAM_CAPTURE_STATUS_INVALIDATED == 2


CUDA_REFUSAL_SCRIPT = """
from _device import driver_stand_ins as stand_ins
from numba_hostfn import _core

capturing = {0xC0: 1, 0xF1: 0}
launched = []


def is_capturing(stream, out):
    if stream not in capturing:
        return 400  # CUDA_ERROR_INVALID_HANDLE
    out[0] = capturing[stream]
    return 0


def launch(*args):
    launched.append(args)
    return 0


assert _core.fault_info() == []  # no fault noted: the stand-ins' handles are not read
with stand_ins(cuStreamIsCapturing=is_capturing, cuLaunchHostFunc=launch):
    assert _core.cuda_refusal(0xC0) == _core.CAPTURING
    assert _core.cuda_refusal(0xF1) == 0
    assert _core.cuda_refusal(0xBAD) == _core.CAPTURE_CHECK_FAILED | 400
assert launched == []
print("ok")
"""


def test_cuda_refusal_reads_the_enqueues_own_refusal_without_enqueuing():
    """_core.cuda_refusal(stream), a signal's check before it makes anything
    (CudaBackend.signal_refusal), answers what both CUDA enqueues refuse with before
    they launch (native/cuda.c, nhf_cuda_refusal): CAPTURING for a capturing stream,
    the capture-read flag with the driver's CUresult where the read fails, else 0;
    and it launches nothing.  In a child on the simulator, where no fault is noted:
    with one, the fault's check asks the backend for the stand-in handles' context."""
    out = run_child(CUDA_REFUSAL_SCRIPT, env=child_env(NUMBA_HOSTFN_SIMULATOR="1"))
    assert out.strip() == "ok", out


def _owned_record(owner):
    """A real record owning ``owner``, owned by the stand-in graph 0x6A through a
    stand-in user object: (record, destroy), ``destroy()`` what the driver calls when
    the graph is gone (the user object's destructor)."""
    made = {}

    def create(out, record, destroy, refcount, flags):
        made["destroy"] = (destroy, record)
        out[0] = 0x0B
        return 0

    fakes = dict(
        cuUserObjectCreate=create,
        cuGraphRetainUserObject=lambda *a: 0,
        cuUserObjectRelease=lambda *a: 0,
    )
    with stand_ins(**fakes):
        record, rc, _ = _core.cuda_graph_record(0x6A, 0xF0, 0xA0, owner)
    assert rc == 0 and record
    destroy, arg = made["destroy"]
    return record, lambda: ctypes.CFUNCTYPE(None, vp)(destroy)(arg)


def _slot_nodes(stream, words):
    """cuda_slot_nodes(stream, graph, words, record) while the stream captures the
    graph that owns the record (stand-ins), which is then destroyed."""
    owner = _Owner()
    alive = weakref.ref(owner)
    record, destroy = _owned_record(owner)
    del owner

    def info(stream, status, id_, graph_out, deps, edges, count):
        status[0] = _core.CU_STREAM_CAPTURE_STATUS_ACTIVE
        if id_:
            id_[0] = 7
        if graph_out:
            graph_out[0] = 0x6A
        return 0

    with stand_ins(cuStreamGetCaptureInfo=info):
        answer = _core.cuda_slot_nodes(stream, 0x6A, words, record)
    destroy()
    nh.drain()
    assert alive() is None
    return answer


def test_a_captured_host_node_is_launched_only_into_the_capture_of_its_graph():
    """cuda_captured_host_node(stream, graph, replay, record): cuLaunchHostFunc on the
    stream while it captures the graph that owns the record, read just before the
    launch (another graph, or none: CAPTURE_ENDED, nothing launched, for the caller to
    enqueue on the stream) and just after (the same capture id, still active:
    CAPTURE_NODE).  A capture that ended during the launch (CAPTURE_UNSURE) may have
    left it on the stream, where it runs once with the graph's record: that record is
    kept for good, whatever the graph does.  A graph destroyed during the launch
    (another thread) has its record's release wait for the answer."""
    ACTIVE, NONE = _core.CU_STREAM_CAPTURE_STATUS_ACTIVE, 0
    replay = _core.USER_OBJECT_RELEASE  # any non-NULL address: the stand-in never calls it

    def run(states, launch_rc=0, during=None, graph=0x6A):
        """One call with the capture read as ``states`` (before, after: (status, id,
        graph)); returns (answer, calls, the owner's weakref, record, destroy)."""
        owner = _Owner()
        alive = weakref.ref(owner)
        record, destroy = _owned_record(owner)
        del owner
        reads, calls = list(states), []

        def info(stream, status, id_, graph_out, deps, edges, count):
            status[0], ident, made = reads.pop(0)
            if id_:
                id_[0] = ident
            if graph_out:
                graph_out[0] = made
            calls.append(("info", stream))
            return 0

        def launch(stream, fn, arg):
            calls.append(("launch", stream, fn, arg))
            if during:
                during(destroy, alive)
            return launch_rc

        with stand_ins(cuStreamGetCaptureInfo=info, cuLaunchHostFunc=launch):
            answer = _core.cuda_captured_host_node(0x5, graph, replay, record)
        return answer, calls, alive, record, destroy

    # The capture of the graph, before and after: a node of it.
    answer, calls, alive, record, destroy = run([(ACTIVE, 7, 0x6A), (ACTIVE, 7, 0x6A)])
    assert answer == (_core.CAPTURE_NODE, 0, None)
    assert calls == [("info", 5), ("launch", 5, replay, record), ("info", 5)]
    destroy()
    nh.drain()
    assert alive() is None, "the graph's record is released with the graph"

    # Ended before the launch, or another graph's capture now: nothing launched.
    for before in ((NONE, 0, None), (ACTIVE, 8, 0x6B)):
        answer, calls, alive, record, destroy = run([before])
        assert answer == (_core.CAPTURE_ENDED, 0, None), before
        assert calls == [("info", 5)], before
        assert alive() is not None  # the graph still owns it
        destroy()
        nh.drain()
        assert alive() is None, before

    # Ended during the launch (a new capture, or none): kept, whatever the graph does.
    for after in ((NONE, 0, None), (ACTIVE, 8, 0x6B)):
        answer, calls, alive, record, destroy = run([(ACTIVE, 7, 0x6A), after])
        assert answer == (_core.CAPTURE_UNSURE, 0, None), after
        destroy()
        nh.drain()
        gc.collect()
        assert alive() is not None, "a launch on the stream may still read the record"
        with pytest.raises(ValueError, match="not a record kept"):
            _core._testing.release_kept(0)
        _core._testing.release_kept(record)  # the test knows nothing runs it
        assert alive() is None

    # The graph destroyed during the launch: released once the launch is known a node
    # (not before: the release waits), or kept if it is not known.
    seen = []

    def destroyed_meanwhile(destroy, alive):
        destroy()
        nh.drain()
        seen.append(alive() is not None)

    answer, _, alive, _, _ = run([(ACTIVE, 7, 0x6A), (ACTIVE, 7, 0x6A)], during=destroyed_meanwhile)
    assert answer[0] == _core.CAPTURE_NODE and seen == [True]
    nh.drain()
    assert alive() is None
    answer, _, alive, record, _ = run(
        [(ACTIVE, 7, 0x6A), (NONE, 0, None)], during=destroyed_meanwhile
    )
    assert answer[0] == _core.CAPTURE_UNSURE and seen == [True, True]
    nh.drain()
    assert alive() is not None
    _core._testing.release_kept(record)
    assert alive() is None

    # Refusals: named; nothing launched, the record the graph's.
    answer, calls, alive, record, destroy = run([(ACTIVE, 7, 0x6A)], launch_rc=999)
    assert answer == (_core.CAPTURE_ENDED, 999, "cuLaunchHostFunc")
    destroy()
    nh.drain()
    assert alive() is None
    with pytest.raises(ValueError, match="NULL replay trampoline or record"):
        _core.cuda_captured_host_node(1, 0x6A, 0, 0xA0)
    with pytest.raises(ValueError, match="NULL replay trampoline or record"):
        _core.cuda_captured_host_node(1, 0x6A, 0xF0, 0)


def test_slot_nodes_go_only_into_the_capture_of_their_graph():
    """cuda_slot_nodes reads the capture around its batch as cuda_captured_host_node
    does: ended (or another graph's), no operation is launched; ended during the
    batch, the graph's record (which owns the slot) is kept for good."""
    ACTIVE = _core.CU_STREAM_CAPTURE_STATUS_ACTIVE
    for reads, where in (
        ([(0, 0, None)], _core.CAPTURE_ENDED),
        ([(ACTIVE, 8, 0x6B)], _core.CAPTURE_ENDED),
        ([(ACTIVE, 7, 0x6A), (0, 0, None)], _core.CAPTURE_UNSURE),
    ):
        owner = _Owner()
        alive = weakref.ref(owner)
        record, destroy = _owned_record(owner)
        del owner
        batches = []

        def info(stream, status, id_, graph_out, deps, edges, count, reads=reads):
            status[0], ident, made = reads.pop(0)
            if id_:
                id_[0] = ident
            if graph_out:
                graph_out[0] = made
            return 0

        with stand_ins(
            **_slot_fakes([]),
            cuStreamGetCaptureInfo=info,
            cuStreamBatchMemOp=lambda *a, batches=batches: batches.append(a) or 0,
        ):
            assert _core.cuda_slot_nodes(0x5, 0x6A, 0x10000, record) == (where, 0, None)
        assert len(batches) == (where == _core.CAPTURE_UNSURE)
        destroy()
        nh.drain()
        if where == _core.CAPTURE_UNSURE:
            assert alive() is not None, "the slot may still be reached from the stream"
            _core._testing.release_kept(record)
        assert alive() is None


def test_a_refused_capture_read_before_a_captured_node_is_named():
    owner = _Owner()
    alive = weakref.ref(owner)
    record, destroy = _owned_record(owner)
    del owner
    with stand_ins(cuStreamGetCaptureInfo=lambda *a: 901, cuLaunchHostFunc=lambda *a: 0):
        answer = _core.cuda_captured_host_node(0x5, 0x6A, 0xF0, record)
    assert answer == (_core.CAPTURE_ENDED, 901, "cuStreamGetCaptureInfo")
    destroy()
    nh.drain()
    assert alive() is None


def _slot_fakes(log, refuse=None):
    """Stand-ins for a slot's three operations, logging (name, stream, address,
    value, flags); ``refuse``: (name, n) refuses that entry point's n-th call with
    CUDA_ERROR_INVALID_VALUE."""
    counts = {}

    def fake(name):
        def call(stream, address, value, flags):
            counts[name] = counts.get(name, 0) + 1
            log.append((name, stream, address, value, flags))
            return 1 if refuse == (name, counts[name]) else 0

        return call

    return {
        "cuStreamWriteValue32": fake("cuStreamWriteValue32"),
        "cuStreamWaitValue32": fake("cuStreamWaitValue32"),
    }


def test_slot_nodes_write_reached_wait_for_done_then_reset_it():
    """A graph slot's nodes, in order, in one cuStreamBatchMemOp (all or none):
    "reached" (the first word) = 1, wait until "done" (the second) >= 1
    (CU_STREAM_WAIT_VALUE_GEQ, 0), "done" = 0.  A refused batch is named and no
    single call follows; without the batch nothing is captured
    (CUDA_ERROR_NOT_SUPPORTED, naming it)."""
    words, stream = 0x10000, 0x5
    log, batches = [], []

    def batch(refuse):
        def call(s, count, params, flags):
            batches.append((s, count, flags, _captured_ops(count, params)))
            return 1 if refuse else 0

        return call

    with stand_ins(**_slot_fakes(log), cuStreamBatchMemOp=batch(False)):
        assert _slot_nodes(stream, words) == (_core.CAPTURE_NODE, 0, None)
    assert log == []
    assert batches == [
        (stream, 3, 0, [(2, words, 1, 0), (1, words + 4, 1, 0), (2, words + 4, 0, 0)])
    ]
    batches.clear()
    with stand_ins(**_slot_fakes(log), cuStreamBatchMemOp=batch(True)):
        assert _slot_nodes(stream, words) == (_core.CAPTURE_ENDED, 1, "cuStreamBatchMemOp")
    assert log == [] and len(batches) == 1
    with stand_ins(**_slot_fakes(log), cuStreamBatchMemOp=0):
        assert _slot_nodes(stream, words) == (_core.CAPTURE_ENDED, 801, "cuStreamBatchMemOp")
    assert log == []


def test_a_slot_graph_is_captured_by_a_stream_of_its_own_that_is_always_destroyed():
    """cuda_slot_graph: a non-blocking stream made, captured into the given graph in
    relaxed mode, the slot's three nodes, the capture ended, the stream destroyed.
    Whatever fails, the capture that began is ended and the stream destroyed, and
    the answer names the first call that failed."""
    graph, words, made = 0x7000, 0x20000, 0x99

    def run(refuse=None, begin_rc=0, end_rc=0, create_rc=0):
        log = []

        def create(out, flags):
            log.append(("cuStreamCreate", flags))
            out[0] = made
            return create_rc

        def begin(stream, g, deps, data, count, mode):
            log.append(("cuStreamBeginCaptureToGraph", stream, g, deps, data, count, mode))
            return begin_rc

        def end(stream, out):
            log.append(("cuStreamEndCapture", stream))
            out[0] = graph
            return end_rc

        fakes = dict(
            _slot_fakes(log, refuse),
            cuStreamCreate=create,
            cuStreamBeginCaptureToGraph=begin,
            cuStreamEndCapture=end,
            cuStreamDestroy=lambda s: log.append(("cuStreamDestroy", s)) or 0,
        )
        with stand_ins(**fakes):
            answer = _core.cuda_slot_graph(graph, words)
        return answer, [entry[0] for entry in log], log

    answer, names, log = run()
    assert answer == (None, 0, None)
    assert names == [
        "cuStreamCreate",
        "cuStreamBeginCaptureToGraph",
        "cuStreamWriteValue32",
        "cuStreamWaitValue32",
        "cuStreamWriteValue32",
        "cuStreamEndCapture",
        "cuStreamDestroy",
    ]
    assert log[0] == ("cuStreamCreate", 1)  # CU_STREAM_NON_BLOCKING
    assert log[1] == ("cuStreamBeginCaptureToGraph", made, graph, None, None, 0, 2)  # relaxed
    assert all(entry[1] == made for entry in log[2:])
    answer, names, _ = run(refuse=("cuStreamWaitValue32", 1))
    assert answer == (None, 1, "cuStreamWaitValue32")
    assert names[-2:] == ["cuStreamEndCapture", "cuStreamDestroy"] and len(names) == 6
    answer, names, _ = run(end_rc=1)
    assert answer == (None, 1, "cuStreamEndCapture") and names[-1] == "cuStreamDestroy"
    answer, names, _ = run(begin_rc=1)
    assert answer == (None, 1, "cuStreamBeginCaptureToGraph")
    assert names == ["cuStreamCreate", "cuStreamBeginCaptureToGraph", "cuStreamDestroy"]
    answer, names, _ = run(create_rc=2)
    assert answer == (None, 2, "cuStreamCreate") and names == ["cuStreamCreate"]
    with stand_ins(cuStreamBeginCaptureToGraph=0):  # a driver before CUDA 12.3
        assert _core.cuda_slot_graph(graph, words) == (None, 801, "cuStreamBeginCaptureToGraph")


def test_pinned_words_are_portable_mapped_and_zeroed():
    block = (ctypes.c_ubyte * 64)(*([0xFF] * 64))
    calls = []

    def alloc(out, nbytes, flags):
        calls.append((nbytes, flags))
        if nbytes > 64:
            return 2  # CUDA_ERROR_OUT_OF_MEMORY
        out[0] = ctypes.addressof(block)
        return 0

    with stand_ins(cuMemHostAlloc=alloc):
        assert _core.cuda_pinned_words(64) == (ctypes.addressof(block), 0, None)
        assert _core.cuda_pinned_words(128) == (0, 2, "cuMemHostAlloc")
    assert bytes(block) == bytes(64)
    assert calls == [(64, 0x3), (128, 0x3)]  # CU_MEMHOSTALLOC_PORTABLE | _DEVICEMAP


def test_the_capture_mode_is_exchanged_and_given_back():
    """Real on CUDA (this thread's mode: global, then relaxed back); on the
    simulator the table has no entry, and the mode comes back unchanged."""
    relaxed = _core.CU_STREAM_CAPTURE_MODE_RELAXED
    before, rc, call = _core.cuda_exchange_capture_mode(relaxed)
    assert rc == 0 and call is None
    assert _core.cuda_exchange_capture_mode(before) == (relaxed, 0, None)
    assert before == (relaxed if nh.backend_name() == "simulator" else 0)
    with pytest.raises(ValueError, match="not a CUstreamCaptureMode"):
        _core.cuda_exchange_capture_mode(7)


class _Owner:
    pass


def test_a_graph_record_is_owned_by_a_user_object_or_released_at_once():
    """cuda_graph_record: the record is given to cuUserObjectCreate with the release
    trampoline as its destructor (no destructor sync), moved to the graph
    (cuGraphRetainUserObject, CU_GRAPH_USER_OBJECT_MOVE); a refused create releases
    the record at once, a refused retain drops the user object, whose destructor
    (called by the driver) releases it.  Either way nothing is leaked."""
    objects = {}

    def create(out, record, destroy, refcount, flags):
        if record is None or objects.get("refuse") == "create":
            return 2
        objects["made"] = (record, destroy, refcount, flags)
        out[0] = 0x0B
        return 0

    def retain(graph, obj, count, flags):
        objects["retained"] = (graph, obj, count, flags)
        return 3 if objects.get("refuse") == "retain" else 0

    def release(obj, count):
        record, destroy, _, _ = objects["made"]
        ctypes.CFUNCTYPE(None, vp)(destroy)(record)  # the last reference: the destructor
        return 0

    fakes = dict(
        cuUserObjectCreate=create, cuGraphRetainUserObject=retain, cuUserObjectRelease=release
    )
    for refuse, answer_rc, answer_call in (
        (None, 0, None),
        ("create", 2, "cuUserObjectCreate"),
        ("retain", 3, "cuGraphRetainUserObject"),
    ):
        objects.clear()
        objects["refuse"] = refuse
        owner = _Owner()
        alive = weakref.ref(owner)
        with stand_ins(**fakes):
            record, rc, call = _core.cuda_graph_record(0x6A, 0xF0, 0xA0, owner)
        assert (rc, call) == (answer_rc, answer_call), refuse
        del owner
        nh.drain()
        gc.collect()
        if refuse is None:
            assert record and alive() is not None  # the graph owns it now
            made_record, destroy, refcount, flags = objects["made"]
            assert made_record == record and destroy == _core.USER_OBJECT_RELEASE
            assert (refcount, flags) == (1, 1)  # one reference; NO_DESTRUCTOR_SYNC
            assert objects["retained"] == (0x6A, 0x0B, 1, 1)  # MOVE
            ctypes.CFUNCTYPE(None, vp)(destroy)(record)  # the graph is destroyed
            nh.drain()
            gc.collect()
        else:
            assert record == 0
        assert alive() is None, refuse


def test_a_refused_retain_lets_the_owner_go_before_the_destructor_runs():
    """A graph that refuses the record's user object (cuGraphRetainUserObject):
    the error keeps nothing (LIFETIME.md, invariant 3), though the driver runs the
    user object's destructor later, on a thread of its own (no destructor sync):
    the owner is let go before the call returns, and the record, still taken
    until that destructor completes it, comes back empty after it."""
    made = {}

    def create(out, record, destroy, refcount, flags):
        made["destroy"] = (destroy, record)
        out[0] = 0x0B
        return 0

    def release(obj, count):
        made["released"] = (obj, count)  # the destructor is the driver's, later
        return 0

    fakes = dict(
        cuUserObjectCreate=create,
        cuGraphRetainUserObject=lambda *a: 3,
        cuUserObjectRelease=release,
    )
    before = nh.pending()
    owner = _Owner()
    alive = weakref.ref(owner)
    with stand_ins(**fakes):
        answer = _core.cuda_graph_record(0x6A, 0xF0, 0xA0, owner)
    assert answer == (0, 3, "cuGraphRetainUserObject")
    assert made["released"] == (0x0B, 1)
    del owner
    assert alive() is None, "the refused record's owner is kept until the destructor runs"
    assert nh.pending() == before + 1  # the driver still holds the record
    destroy, record = made["destroy"]
    ctypes.CFUNCTYPE(None, vp)(destroy)(record)  # the driver destroys the user object
    nh.drain()
    assert nh.pending() == before


def test_routes_and_trampolines_are_numbers_the_core_checks():
    """Python names where a launch goes and what runs it by number (_core.ROUTE_*,
    _core.RUN_*); the core picks the functions.  A number that names none is a
    ValueError, before any record is taken (before, these were function addresses,
    called as given)."""
    held = _core.held()
    routes = [_core.ROUTE_CUDA, _core.ROUTE_SIM, _core.ROUTE_SIM_DEVICE]
    routes += [_core.ROUTE_CUDA_LANE, _core.ROUTE_SIM_LANE]
    assert sorted(routes) == list(range(1, 6))
    assert {_core.RUN_COMPILED, _core.RUN_PYTHON, _core.EXEC_COPY} == {1, 2, 3}
    for route in (0, 6, -1, 1 << 40):
        with pytest.raises((ValueError, OverflowError)):
            _core.enqueue(route, 1, _core.RUN_COMPILED, 0xF0, 0, None)
    for trampoline in (0, 4, 0x7F0000001000):
        with pytest.raises((ValueError, OverflowError), match="trampoline|too large|convert"):
            _core.enqueue(_core.ROUTE_SIM, 1, trampoline, 0xF0, 0, None)
    with pytest.raises(TypeError, match="takes 6 or 7 arguments"):
        _core.enqueue(_core.ROUTE_SIM, 1, _core.RUN_COMPILED)
    assert _core.held() == held
    # The watchdog queries the backend a route names; a lane's route names none.
    for route in (0, _core.ROUTE_CUDA_LANE, _core.ROUTE_SIM_DEVICE, 99):
        with pytest.raises(ValueError, match="no backend's route"):
            _core.watchdog_configure(route)


NULL_STREAM_SCRIPT = """
import sys
from numba_hostfn import _core

_core.watchdog_configure(_core.ROUTE_SIM)  # the simulator's context lookup runs first
owner = object()
before = sys.getrefcount(owner), _core.held()
for route in (_core.ROUTE_SIM, _core.ROUTE_SIM_DEVICE):
    print(_core.enqueue(route, 0, _core.RUN_COMPILED, 0xF0, 0, owner))
print(before == (sys.getrefcount(owner), _core.held()))
"""


def test_the_simulator_refuses_stream_zero():
    """The simulator has no legacy stream 0: a launch on handle 0 is refused with
    CUDA_ERROR_INVALID_HANDLE (400), nothing enqueued or held, for a host function
    and for device work, with the simulated watchdog's context lookup before it.
    Before, both read through the null pointer (a segfault): the shape 7ce8ddc's
    signal to a graph node's handle 0 took."""
    assert run_child(NULL_STREAM_SCRIPT).split() == ["400", "400", "True"]


UNLOADED_SCRIPT = """
import pytest
from numba_hostfn import _core
import numba_hostfn as nh

assert nh.backend_name() == "simulator"


class Owner:
    pass


with pytest.raises(ValueError):
    _core.driver_load((0,) * len(_core.driver_entry_points()))
for route in (_core.ROUTE_CUDA, _core.ROUTE_CUDA_LANE):
    with pytest.raises(ValueError, match="before the CUDA backend loaded"):
        _core.enqueue(route, 1, _core.RUN_COMPILED, 0xF0, 0, None)
    with pytest.raises(ValueError, match="before the CUDA backend loaded"):
        _core.configure_launch(route=route)
not_loaded = 3  # CUDA_ERROR_NOT_INITIALIZED
assert _core.cuda_capture_info(1) == ((0, 0), not_loaded, "cuStreamGetCaptureInfo")
assert _core.cuda_refusal(1) == _core.CAPTURE_CHECK_FAILED | not_loaded
assert _core.cuda_captured_host_node(1, 0x6A, 0xF0, 0xA0) == (
    _core.CAPTURE_ENDED, not_loaded, "cuStreamGetCaptureInfo"
)
assert _core.cuda_pinned_words(64) == (0, not_loaded, "cuMemHostAlloc")
assert _core.cuda_slot_nodes(1, 0x6A, 0x1000, 0xA0) == (
    _core.CAPTURE_ENDED, not_loaded, "cuStreamGetCaptureInfo"
)
assert _core.cuda_slot_graph(1, 0x1000) == (None, 801, "cuStreamBeginCaptureToGraph")
held = _core.held()
assert _core.cuda_graph_record(1, 0xF0, 0, Owner()) == (0, not_loaded, "cuUserObjectCreate")
assert _core.held() == held
print("ok")
"""


def test_before_the_table_is_loaded_nothing_of_it_is_called():
    """On the simulator (a child Python on it, whatever this one runs on) the driver
    table stays empty: a CUDA route is refused (before: its enqueue called address
    0), each driver call answers CUDA_ERROR_NOT_INITIALIZED naming its entry point,
    and a refused driver_load leaves it so."""
    out = run_child(UNLOADED_SCRIPT, env=child_env(NUMBA_HOSTFN_SIMULATOR="1"))
    assert out.strip() == "ok", out


def _captured_ops(count, params):
    """The (operation, address, value, flags) of a cuStreamBatchMemOp's params
    (driver.h's nhf_cu_batch_mem_op_params: 48 bytes each)."""
    ops = []
    for i in range(count):
        at = params + 48 * i
        ops.append(
            (
                ctypes.c_uint.from_address(at).value,
                ctypes.c_uint64.from_address(at + 8).value,
                ctypes.c_uint32.from_address(at + 16).value,
                ctypes.c_uint.from_address(at + 24).value,
            )
        )
    return ops


def test_a_refused_slot_operation_leaves_no_part_of_the_node_in_a_capture_that_stays_valid():
    """Invariant 16: a graph slot's three operations are captured all or none.  The
    stand-ins model a capture that stays valid after a refused call (the driver
    documents no invalidation for a failed memory operation): each accepted call
    adds its operations to the graph, a refused one adds nothing.  Whichever
    driver call is refused, the graph holds the whole node or none of it: a lone
    "reached := 1" (or one with no reset of "done") would run the node's work with
    no stream waiting for it, while _cuda.add_slot_nodes says nothing was kept."""
    words, stream = 0x10000, 0x5
    write, wait = 2, 1  # CU_STREAM_MEM_OP_WRITE_VALUE_32, _WAIT_VALUE_32
    whole = [(write, words, 1, 0), (wait, words + 4, 1, 0), (write, words + 4, 0, 0)]
    for with_batch in (True, False):
        for refused_call in (None, 1, 2, 3):
            graph, calls = [], [0]

            def accept(ops, graph=graph, calls=calls, refused_call=refused_call):
                calls[0] += 1
                if calls[0] == refused_call:
                    return 2  # CUDA_ERROR_OUT_OF_MEMORY: nothing added
                graph.extend(ops)
                return 0

            def single(kind):
                return lambda s, address, value, flags: accept([(kind, address, value, flags)])

            fakes = dict(
                cuStreamWriteValue32=single(write),
                cuStreamWaitValue32=single(wait),
                cuStreamBatchMemOp=(
                    (lambda s, count, params, flags: accept(_captured_ops(count, params)))
                    if with_batch
                    else 0
                ),
            )
            with stand_ins(**fakes):
                _, rc, call = _slot_nodes(stream, words)
            where = (with_batch, refused_call, rc, call, graph)
            if rc == 0:
                assert graph == whole, where
            else:
                assert graph == [], f"a part of the node was kept in the capture: {where}"
