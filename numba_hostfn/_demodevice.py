"""Stream-ordered device work for the demo and the tests, on a GPU or on the simulator.

``Device`` gives the demo and the tests what real device work gives: a stream,
host memory the "device" can write, a delay that occupies the stream, and a
store done in stream order.  On a GPU these are cuda.core streams, pinned
memory and an NVRTC kernel; on the simulator, simulated streams, numpy memory,
``Stream.sleep`` and a compiled host function run as a kernel.
"""

from __future__ import annotations

import ctypes
import struct
from typing import Any

import numpy as np
from numba import carray

from ._hostfunction import host_callback
from ._intrinsics import as_voidptr
from ._process import get_backend
from ._simulator import Stream as SimulatedStream

__all__ = ["Device"]

_STORE = np.dtype([("addr", np.uint64), ("value", np.int64)])


@host_callback(dtype=_STORE)
def _sim_store(d):
    carray(as_voidptr(d.addr), (1,), np.int32)[0] = d.value


_KERNELS = r"""
extern "C" __global__ void spin_then_store(int *target, int value, unsigned long long ns)
{
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
    if (target) {
        *(volatile int *)target = value;
        __threadfence_system();
    }
}

extern "C" __global__ void spin_then_trap(unsigned long long ns)
{
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
    __trap();
}

extern "C" __global__ void trap_when_set(volatile int *flag, unsigned long long ns)
{
    unsigned long long start, now;
    flag[1] = 1; /* the stage, for a host that waits on the fault: started */
    __threadfence_system();
    while (flag[0] == 0) {
    }
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
    flag[1] = 2; /* trapping */
    __threadfence_system();
    __trap();
}
"""


class _ArmedFault:
    """``Device.armed_fault``'s trigger: call it to set the fault off."""

    def __init__(self, flag: np.ndarray) -> None:
        self._flag = flag

    def __call__(self) -> None:
        self._flag[0] = 1

    def stage(self) -> int:
        """How far the kernel got: 0 not started, 1 started, 2 trapping."""
        return int(self._flag[1])


class Device:
    """Streams, device-writable host memory and stream-ordered work on either backend."""

    def __init__(self) -> None:
        self.simulator = get_backend().name == "simulator"
        self._buffers: list[Any] = []
        if self.simulator:
            self.name = "simulator"
            return
        from cuda.core import Device as CudaDevice
        from cuda.core import LaunchConfig, Program, ProgramOptions

        self.cuda = CudaDevice()
        self.cuda.set_current()
        self.name = self.cuda.name
        arch = "sm_" + "".join(str(x) for x in self.cuda.compute_capability)
        program = Program(_KERNELS, code_type="c++", options=ProgramOptions(arch=arch))
        module = program.compile("cubin")
        self._kernel = module.get_kernel("spin_then_store")
        self._trap = module.get_kernel("spin_then_trap")
        self._trap_when_set = module.get_kernel("trap_when_set")
        self._config = LaunchConfig(grid=1, block=1)

    def create_stream(self) -> Any:
        if self.simulator:
            return SimulatedStream()
        return self.cuda.create_stream()

    def synchronize(self) -> None:
        """Wait for all work of the device (context), or of every simulated stream."""
        if not self.simulator:
            self.cuda.sync()

    def close_stream(self, stream: Any) -> None:
        stream.close()

    def host_array(self, n: int, dtype: Any = np.int32) -> np.ndarray:
        """Zeroed host memory that device work (and host functions) can write."""
        dtype = np.dtype(dtype)
        nbytes = max(n * dtype.itemsize, 1)
        if self.simulator:
            return np.zeros(n, dtype)
        from cuda.core import LegacyPinnedMemoryResource

        buf = LegacyPinnedMemoryResource().allocate(nbytes)
        self._buffers.append(buf)
        raw = (ctypes.c_char * nbytes).from_address(int(buf.handle))
        ctypes.memset(raw, 0, nbytes)
        return np.frombuffer(raw, dtype=dtype, count=n)

    def _launch(self, stream: Any, target: int, value: int, seconds: float) -> None:
        from cuda.core import launch

        launch(
            stream,
            self._config,
            self._kernel,
            np.uint64(target),
            np.int32(value),
            np.uint64(int(seconds * 1e9)),
        )

    def delay(self, stream: Any, seconds: float) -> None:
        """Occupy ``stream`` for ``seconds`` (device work)."""
        if self.simulator:
            stream.sleep(seconds)
        else:
            self._launch(stream, 0, 0, seconds)

    def store(
        self, stream: Any, array: np.ndarray, index: int, value: int, delay: float = 0.0
    ) -> None:
        """Device work: after ``delay`` seconds, ``array[index] = value`` (int32), in order."""
        if array.dtype != np.int32:
            raise TypeError(f"store() writes int32, got an array of {array.dtype}")
        target = array.ctypes.data + index * 4
        if self.simulator:
            if delay:
                stream.sleep(delay)
            stream.launch(_sim_store, user_data=struct.pack("=Qq", target, value))
        else:
            self._launch(stream, target, value, delay)

    def fault(self, stream: Any, delay: float = 0.0) -> None:
        """Device work that faults after ``delay`` seconds (a kernel that traps):
        the stream's context then has CUDA_ERROR_LAUNCH_FAILED for good."""
        if self.simulator:
            if delay:
                stream.sleep(delay)
            stream.fault()
            return
        from cuda.core import launch

        launch(stream, self._config, self._trap, np.uint64(int(delay * 1e9)))

    def armed_fault(self, stream: Any, delay: float = 0.0) -> Any:
        """Device work that faults ``delay`` seconds after the returned function is
        called (CUDA only; tests/_device.py's ``armed_fault`` does it on either backend).

        The kernel spins on a flag in host memory, then for ``delay`` seconds, then
        traps: whatever is enqueued before the call comes behind the fault, and the
        host knows when the fault was set off on its own clock.  (A host function
        in front of a kernel cannot be used to hold it: on the H200 the kernel's
        launch blocks until that host function returns.)  The function's ``stage()``
        tells how far the kernel got: 0 not started, 1 started, 2 trapping.
        """
        if self.simulator:
            raise RuntimeError("armed_fault() needs a CUDA device; use fault(stream, delay)")
        from cuda.core import launch

        flag = self.host_array(2, np.int32)  # [0]: set off; [1]: the kernel's stage
        launch(
            stream,
            self._config,
            self._trap_when_set,
            np.uint64(flag.ctypes.data),
            np.uint64(int(delay * 1e9)),
        )
        return _ArmedFault(flag)

    def close(self) -> None:
        for buf in self._buffers:
            buf.close()
        self._buffers.clear()
