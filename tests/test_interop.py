"""Streams from cuda.core, CuPy, PyTorch and numba-cuda, through __cuda_stream__."""

import numpy as np
import pytest
from numba import carray

import numba_hostfn as nh


@nh.host_callback
def increment(p):
    carray(p, (1,), np.int64)[0] += 1


def _exercise(stream, sync):
    counter = np.zeros(1, np.int64)
    calls = []
    nh.host_launch(stream, increment, user_data=nh.by_ref(counter))
    nh.host_launch(stream, lambda: calls.append(1))
    nh.host_launch(stream, increment, user_data=nh.by_ref(counter))
    sync()
    nh.drain()
    assert counter[0] == 2 and calls == [1]


def test_any_cuda_stream_protocol_object(device, stream):
    class Wrapper:  # what any library's stream object looks like to host_launch
        def __init__(self, inner):
            self.inner = inner

        def __cuda_stream__(self):
            return self.inner.__cuda_stream__()

    _exercise(Wrapper(stream), stream.sync)


@pytest.mark.gpu
def test_cuda_core_stream(device, stream):
    _exercise(stream, stream.sync)


@pytest.mark.gpu
def test_cuda_core_legacy_and_per_thread_default_streams(device):
    from cuda.core import LEGACY_DEFAULT_STREAM, PER_THREAD_DEFAULT_STREAM

    for s in (LEGACY_DEFAULT_STREAM, PER_THREAD_DEFAULT_STREAM):
        _exercise(s, s.sync)


@pytest.mark.gpu
def test_a_closed_cuda_core_stream_is_refused_by_every_call(device):
    """A closed cuda.core Stream's ``__cuda_stream__`` raises (cuda-core 1.2.0 on:
    "Stream has been closed"; its handle would be 0, which the driver reads as the
    legacy default stream): every call lets that error through, enqueuing nothing."""
    from numba_hostfn import _core

    stream = device.create_stream()
    stream.close()
    held, pending = _core.held(), nh.pending()
    calls = []
    for call in (
        lambda: nh.host_launch(stream, increment, user_data=nh.by_ref(np.zeros(1, np.int64))),
        lambda: nh.host_launch(stream, lambda: calls.append(1)),
        lambda: nh.host_launch(stream, lambda: calls.append(1), blocking=False),
        lambda: nh.host_copy(stream, bytearray(), bytearray()),
        lambda: nh.host_copy(stream, bytearray(8), bytes(8)),
        lambda: nh.release_after(stream, object()),
        lambda: nh.done_future(stream),
    ):
        with pytest.raises(RuntimeError, match="closed"):
            call()
    device.synchronize()
    nh.drain()
    assert calls == [] and (_core.held(), nh.pending()) == (held, pending)


@pytest.mark.gpu
def test_cuda_core_stream_from_handle_0(device):
    """The NULL stream wrapped by cuda.core (PyTorch's and CuPy's default stream
    handle is 0), open, runs launches: a handle of 0 is not taken for a closed stream."""
    from cuda.core import Stream

    null = Stream.from_handle(0)
    _exercise(null, null.sync)


@pytest.mark.gpu
def test_cupy_stream(device):
    import cupy

    s = cupy.cuda.Stream(non_blocking=True)
    _exercise(s, s.synchronize)


@pytest.mark.gpu
def test_torch_stream(device):
    import torch

    s = torch.cuda.Stream()
    _exercise(s, s.synchronize)


@pytest.mark.gpu
def test_numba_cuda_stream(device):
    # numba-cuda redeclares ctypes.pythonapi.Py_DecRef on import: running it in
    # this process also guards the fix for that (see test_launch.py).
    from numba import cuda

    s = cuda.stream()
    _exercise(s, s.synchronize)
