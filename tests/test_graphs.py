"""cuda.core GraphBuilder forwarding, and refusal of a capturing plain stream."""

import gc
import time
import weakref

import numpy as np
import pytest
from _device import rerun_on_simulator
from numba import carray

import numba_hostfn as nh


@nh.host_callback
def increment(p):
    carray(p, (1,), np.int64)[0] += 1


@pytest.mark.gpu
def test_graph_builder_host_nodes_run_at_every_replay(device, stream):
    counter = np.zeros(1, np.int64)
    alive = weakref.ref(counter)
    calls = []
    builder = stream.create_graph_builder().begin_building()
    nh.host_launch(builder, increment, user_data=nh.by_ref(counter))
    nh.host_launch(builder, lambda: calls.append(1))
    nh.host_launch(builder, increment.ctypes, user_data=counter.ctypes.data)
    nh.host_launch(builder, increment._cfunc, user_data=counter.ctypes.data)  # a numba cfunc
    graph = builder.end_building().complete()
    graph.launch(stream)
    graph.launch(stream)
    stream.sync()
    assert counter[0] == 6
    assert calls == [1, 1]
    result = int(counter[0])
    del counter
    gc.collect()
    assert nh.pending() == 3, "the graph must own its compiled nodes' owners"
    assert alive() is not None, "the graph must own by_ref user data"
    graph.close()
    builder.close()
    del graph, builder
    # CUDA runs user-object destructors asynchronously, once the graph and
    # its executable instances are destroyed; a device synchronize flushes them.
    for _ in range(200):
        device.synchronize()
        nh.drain()
        gc.collect()
        if alive() is None:
            break
        time.sleep(0.01)
    assert alive() is None, "destroying the graph must release what it owned"
    assert nh.pending() == 0
    assert result == 6


@pytest.mark.gpu
def test_copied_user_data_lives_with_the_graph(device, stream):
    out = np.zeros(1, np.int64)
    OUT = np.dtype([("out", np.uint64), ("value", np.int64)])

    @nh.host_callback(dtype=OUT)
    def write(d):
        carray(nh.as_voidptr(d.out), (1,), np.int64)[0] += d.value

    data = np.array([(out.ctypes.data, 5)], OUT)
    builder = stream.create_graph_builder().begin_building()
    nh.host_launch(builder, write, user_data=data.tobytes())
    graph = builder.end_building().complete()
    for _ in range(3):
        graph.launch(stream)
    stream.sync()
    assert out[0] == 15
    graph.close()
    builder.close()


@pytest.mark.gpu
def test_capturing_plain_stream_is_refused_and_capture_stays_valid(device, stream):
    counter = np.zeros(1, np.int64)
    builder = stream.create_graph_builder().begin_building()
    capturing = builder.stream
    with pytest.raises(RuntimeError, match="GraphBuilder"):
        nh.host_launch(capturing, increment, user_data=nh.by_ref(counter))
    with pytest.raises(RuntimeError, match="capturing"):
        nh.host_launch(capturing, lambda: None)
    assert nh.pending() == 0
    nh.host_launch(builder, increment, user_data=nh.by_ref(counter))
    graph = builder.end_building().complete()
    graph.launch(stream)
    stream.sync()
    assert counter[0] == 1
    graph.close()
    builder.close()


@pytest.mark.gpu
def test_cupy_capture_is_refused_and_stays_valid(device):
    import cupy

    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        s.begin_capture()
        with pytest.raises(RuntimeError, match="capturing"):
            nh.host_launch(s, increment, user_data=0)
        graph = s.end_capture()
    graph.launch(s)
    s.synchronize()


def test_simulator_has_no_graphs(request):
    if rerun_on_simulator(request):
        return
    with nh.simulator.Stream() as s:
        with pytest.raises(nh.SimulatorUnsupportedError, match="graph"):
            s.create_graph_builder()
