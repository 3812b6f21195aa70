"""How each backend reads an enqueue's status word: the exception and its message,
for every combination of bits that an enqueue function of native/ can return
(cuda.c, executor_cuda.c, simulator.c, executor_sim.c; enqueue.c and notify.c add
only OUT_OF_MEMORY).  One decoder serves both backends (``_backend``); this table
pins what each gives, so that a change to it shows here (issue 32)."""

import pytest

from numba_hostfn import _core
from numba_hostfn._backend import StaleLane
from numba_hostfn._cuda import CudaBackend
from numba_hostfn._errors import CudaDriverError, DeviceFaultError
from numba_hostfn._simbackend import SimulatorBackend

pytestmark = pytest.mark.checkout

ILLEGAL_ADDRESS = 700  # a device fault's CUresult
INVALID_VALUE = 1  # any other CUresult

LAUNCH, WRITE = "cuLaunchHostFunc", "cuStreamWriteValue32"  # as _enqueue.raise_refused names


class _NoErrorNames:
    """A driver whose cuGetErrorName knows no code: messages say "CUresult <n>"."""

    def CUresult(self, code):
        raise ValueError(code)

    def cuGetErrorName(self, code):  # pragma: no cover - CUresult refuses first
        raise AssertionError("not reached")


def _cuda() -> CudaBackend:
    backend = CudaBackend.__new__(CudaBackend)  # no driver here: only what decoding uses
    backend._driver = _NoErrorNames()
    return backend


def _simulator() -> SimulatorBackend:
    return SimulatorBackend.__new__(SimulatorBackend)


FAULTED, KEPT, CHECK_FAILED = _core.FAULTED, _core.KEPT, _core.CAPTURE_CHECK_FAILED

#: (status, call, exception type (exactly), a fragment of its message), for the
#: status words the CUDA enqueue functions return: nhf_cuda_enqueue (with a
#: signal's, OUT_OF_MEMORY) and nhf_exec_cuda_enqueue.
CUDA = [
    # nhf_cuda_enqueue: a faulted context, refused at once (nhf_fault_of_stream)
    (FAULTED | ILLEGAL_ADDRESS, LAUNCH, DeviceFaultError, "nothing was enqueued (cuLaunchHostFunc"),
    # cuStreamIsCapturing failed
    (CHECK_FAILED | INVALID_VALUE, LAUNCH, CudaDriverError, "cuStreamIsCapturing failed"),
    (CHECK_FAILED | ILLEGAL_ADDRESS, LAUNCH, DeviceFaultError, "nothing was enqueued"),
    # cuLaunchHostFunc refused: its CUresult alone
    (INVALID_VALUE, LAUNCH, CudaDriverError, "cuLaunchHostFunc failed: CUresult 1"),
    (ILLEGAL_ADDRESS, LAUNCH, DeviceFaultError, "nothing was enqueued (cuLaunchHostFunc"),
    # a signal's node could not be allocated (notify.c)
    (_core.OUT_OF_MEMORY, LAUNCH, MemoryError, "could not allocate"),
    # nhf_exec_cuda_enqueue: the lane's context or the lane itself faulted
    (FAULTED | ILLEGAL_ADDRESS, WRITE, DeviceFaultError, "nothing was enqueued (cuStreamWrite"),
    (CHECK_FAILED | INVALID_VALUE, WRITE, CudaDriverError, "cuStreamIsCapturing failed"),
    (_core.EXECUTOR_CLOSED, WRITE, RuntimeError, "the HostExecutor is closed"),
    (_core.OUT_OF_MEMORY, WRITE, MemoryError, "could not allocate"),
    # the lane serves an earlier stream with the handle (the package renews it)
    (_core.LANE_STALE, WRITE, StaleLane, "still serves an earlier stream"),
    # the write refused: taken back
    (INVALID_VALUE, WRITE, CudaDriverError, "cuStreamWriteValue32 failed: CUresult 1"),
    # ... where the words' context was destroyed or reset (an H200, 2026-12-06)
    (INVALID_VALUE, WRITE, CudaDriverError, "make a new HostExecutor"),
    (ILLEGAL_ADDRESS, WRITE, DeviceFaultError, "nothing was enqueued (cuStreamWrite"),
    # the wait refused after the write: the task is kept
    (KEPT | INVALID_VALUE, WRITE, CudaDriverError, "cuStreamWaitValue32 failed: CUresult 1"),
    (KEPT | INVALID_VALUE, WRITE, CudaDriverError, "the stream does not wait for it"),
]

#: The same for the simulator's: nhf_sim_enqueue, nhf_sim_enqueue_device, a replay
#: (sim_replay), nhf_exec_sim_enqueue (whose wait refused gives KEPT | the refusal).
SIMULATOR = [
    (_core.IN_HOST_FUNCTION, LAUNCH, RuntimeError, "a host function enqueued work"),
    (_core.IN_HOST_FUNCTION, "", RuntimeError, "a host function enqueued work"),
    (FAULTED | ILLEGAL_ADDRESS, LAUNCH, DeviceFaultError, "nothing was enqueued"),
    (FAULTED | ILLEGAL_ADDRESS, "", DeviceFaultError, "CUDA_ERROR_ILLEGAL_ADDRESS (700)"),
    (_core.QUEUE_STOPPED, LAUNCH, RuntimeError, "the simulated stream is closed"),
    (_core.QUEUE_STOPPED, "", RuntimeError, "the simulated stream is closed"),
    (_core.OUT_OF_MEMORY, LAUNCH, MemoryError, "could not allocate"),
    (_core.OUT_OF_MEMORY, "", MemoryError, "could not allocate"),
    (_core.EXECUTOR_CLOSED, WRITE, RuntimeError, "the HostExecutor is closed"),
    (_core.LANE_STALE, WRITE, StaleLane, "still serves an earlier stream"),
    (FAULTED | ILLEGAL_ADDRESS, WRITE, DeviceFaultError, "nothing was enqueued"),
    (_core.QUEUE_STOPPED, WRITE, RuntimeError, "the simulated stream is closed"),
    (_core.OUT_OF_MEMORY, WRITE, MemoryError, "could not allocate"),
    (KEPT | _core.QUEUE_STOPPED, WRITE, RuntimeError, "closed while a HostExecutor task was"),
    (KEPT | _core.QUEUE_STOPPED, WRITE, RuntimeError, "the stream does not wait for it"),
    (KEPT | _core.OUT_OF_MEMORY, WRITE, MemoryError, "could not allocate"),
]


def _raised(backend, status: int, call: str) -> BaseException:
    with pytest.raises(BaseException) as info:
        if call:
            backend.raise_refusal(status, call)
        else:
            backend.raise_refusal(status)  # the simulator's own calls name none
    return info.value


@pytest.mark.parametrize(("status", "call", "error", "fragment"), CUDA)
def test_the_cuda_backend_reads_each_status_word_it_can_get(status, call, error, fragment):
    raised = _raised(_cuda(), status, call)
    assert type(raised) is error, (hex(status), raised)
    assert fragment in str(raised), (hex(status), raised)
    if isinstance(raised, CudaDriverError):
        assert raised.code == status & 0xFFFFFFFF


@pytest.mark.parametrize(("status", "call", "error", "fragment"), SIMULATOR)
def test_the_simulator_backend_reads_each_status_word_it_can_get(status, call, error, fragment):
    raised = _raised(_simulator(), status, call)
    assert type(raised) is error, (hex(status), raised)
    assert fragment in str(raised), (hex(status), raised)


#: Words the two backends read differently for no reason before issue 32's one
#: decoder: a device fault found after an executor's write is a DeviceFaultError
#: that says the task was enqueued (the simulator said "nothing was enqueued", CUDA
#: gave a bare CudaDriverError); a stream that began capturing under the enqueue is
#: a RuntimeError that says so, not a MemoryError.
FIXED = [
    (_cuda, KEPT | ILLEGAL_ADDRESS, WRITE, DeviceFaultError, "task was enqueued, but not the"),
    (_simulator, KEPT | FAULTED | ILLEGAL_ADDRESS, WRITE, DeviceFaultError, "was enqueued, but"),
    (_simulator, KEPT | _core.CAPTURING, WRITE, RuntimeError, "began capturing while a HostExec"),
    (_simulator, _core.CAPTURING, "", RuntimeError, "the stream began capturing"),
]


@pytest.mark.parametrize(("backend", "status", "call", "error", "fragment"), FIXED)
def test_both_backends_read_a_kept_fault_and_a_capture_alike(
    backend, status, call, error, fragment
):
    raised = _raised(backend(), status, call)
    assert type(raised) is error, (hex(status), raised)
    assert fragment in str(raised), (hex(status), raised)
