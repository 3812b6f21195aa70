"""Two GPUs: each device's context has its own host-function thread; the launch
records, the interpreter guard and a HostExecutor are shared by all of them.

Marked ``multigpu``: skipped with fewer than two CUDA devices (and on the simulator).
"""

from __future__ import annotations

import ctypes
import textwrap
import threading

import numpy as np
import pytest
from _device import run_child
from numba import carray

import numba_hostfn as nh

pytestmark = pytest.mark.multigpu


def _device_count() -> int:
    if nh.backend_name() != "cuda":
        return 0
    from cuda.core import system

    return system.get_num_devices() if hasattr(system, "get_num_devices") else system.num_devices


@pytest.fixture
def devices():
    if _device_count() < 2:
        pytest.skip("needs two CUDA devices")
    from cuda.core import Device

    pair = [Device(0), Device(1)]
    yield pair
    for d in pair:
        d.set_current()
        d.sync()
    pair[0].set_current()


@nh.host_callback
def increment(p):
    carray(p, (1,), np.int64)[0] += 1


def _streams(devices):
    streams = []
    for d in devices:
        d.set_current()
        streams.append(d.create_stream())
    return streams


def test_launches_on_both_devices_run_on_each_context_s_own_thread(devices):
    streams = _streams(devices)
    counters = np.zeros(2, np.int64)
    threads = [set(), set()]
    for _ in range(100):
        for i, s in enumerate(streams):
            nh.host_launch(s, increment, user_data=nh.by_ref(counters[i : i + 1]))
            nh.host_launch(s, lambda i=i: threads[i].add(threading.get_ident()))
    for s in streams:
        s.sync()
    nh.drain()
    assert list(counters) == [100, 100]
    assert len(threads[0]) == len(threads[1]) == 1 and threads[0] != threads[1]
    assert nh.pending() == 0


def test_captured_graphs_on_each_device(devices):
    streams = _streams(devices)
    counters = np.zeros(2, np.int64)
    graphs = []
    for i, (d, s) in enumerate(zip(devices, streams, strict=True)):
        d.set_current()
        builder = s.create_graph_builder().begin_building()
        nh.host_launch(builder, increment, user_data=nh.by_ref(counters[i : i + 1]))
        nh.host_launch(builder, lambda i=i: counters.__setitem__(i, counters[i] + 10))
        graphs.append(builder.end_building().complete())
        builder.close()
    for _ in range(5):
        for g, s in zip(graphs, streams, strict=True):
            g.launch(s)
    for s in streams:
        s.sync()
    assert list(counters) == [55, 55]
    for g in graphs:
        g.close()


def test_host_copy_between_pinned_buffers_of_both_devices(devices):
    from cuda.core import LegacyPinnedMemoryResource

    buffers = []
    for d in devices:
        d.set_current()
        buffers.append(LegacyPinnedMemoryResource().allocate(1 << 20))
    views = [
        np.frombuffer((ctypes.c_char * (1 << 20)).from_address(int(b.handle)), np.uint8)
        for b in buffers
    ]
    views[0][:] = np.arange(1 << 20) % 251
    streams = _streams(devices)
    nh.host_copy(streams[1], views[1], views[0])  # device 1's stream, device 0's buffer
    streams[1].sync()
    assert (views[1] == views[0]).all()
    views[1][:] = 7
    nh.host_copy(streams[0], buffers[0], buffers[1])  # cuda.core Buffers, the other way
    streams[0].sync()
    assert (views[0] == 7).all()
    for b in buffers:
        b.close()


def test_one_executor_serves_streams_of_both_devices(devices):
    streams = _streams(devices)
    counters = np.zeros(2, np.int64)
    with nh.HostExecutor(threads=2) as executor:
        for _ in range(50):
            for i, s in enumerate(streams):
                nh.host_launch(
                    s, increment, user_data=nh.by_ref(counters[i : i + 1]), executor=executor
                )
        for s in streams:
            s.sync()
    nh.drain()
    assert list(counters) == [50, 50] and nh.pending() == 0


EXIT_BOTH = textwrap.dedent("""
    import numpy as np
    from cuda.core import Device
    from numba import carray
    import numba_hostfn as nh

    @nh.host_callback
    def increment(p):
        carray(p, (1,), np.int64)[0] += 1

    counter = np.zeros(2, np.int64)
    for i in (0, 1):
        d = Device(i)
        d.set_current()
        s = d.create_stream()
        for _ in range(2000):
            nh.host_launch(s, increment, user_data=nh.by_ref(counter[i:i + 1]))
            nh.host_launch(s, lambda: None)
    print("pending", nh.pending(), flush=True)
""")


def test_exit_with_launches_pending_on_both_devices(devices):
    out = run_child(EXIT_BOTH)
    assert out.startswith("pending"), out
