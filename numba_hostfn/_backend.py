"""The two backends behind host_launch: the CUDA driver, and the stream simulator.

The backend is chosen once per process, from ``NUMBA_HOSTFN_SIMULATOR`` as it
is at the first call that needs one (import does not touch the driver).  Both
backends enqueue the same native trampolines from ``_native`` and share one
set of launch records, so a launch means the same thing on both.
"""

from __future__ import annotations

import ctypes
import os
import threading
import weakref
from typing import Any

from ._errors import SIMULATOR_ENV, BackendUnavailableError, CudaDriverError
from ._native import (
    CAPTURE_CHECK_FAILED,
    NO_RECORD,
    QUEUE_STOPPED,
    STREAM_CAPTURING,
    Native,
    native,
)
from ._records import LaunchRecords

__all__ = [
    "Backend",
    "cuda_driver_usable",
    "get_backend",
    "simulator_requested",
    "simulator_unless_driver",
    "use_simulator",
]

_lock = threading.Lock()
_backend: Backend | None = None


def simulator_requested() -> bool:
    """True if ``NUMBA_HOSTFN_SIMULATOR`` asks for the simulator."""
    return os.environ.get(SIMULATOR_ENV, "").strip().lower() not in ("", "0", "false", "no")


def cuda_driver_usable() -> bool:
    """True if a CUDA driver with at least one device can be initialised."""
    try:
        from cuda.bindings import driver

        (err,) = driver.cuInit(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            return False
        err, count = driver.cuDeviceGetCount()
        return err == driver.CUresult.CUDA_SUCCESS and count > 0
    except Exception:  # no cuda-bindings, no libcuda, no device: all mean "no"
        return False


class Backend:
    """What host_launch needs from a backend: a native launcher and stream checks."""

    name = ""
    #: Address of the native launcher, u64 (*)(handle, trampoline, record).
    launcher = 0
    #: Whether ``stream_handle`` must vet each stream (the simulator's registry).
    checks_streams = False

    def __init__(self, native: Native) -> None:
        self.native = native
        self.records = LaunchRecords(native)

    def stream_handle(self, stream: Any, handle: int) -> int:
        """Vet ``stream`` (whose ``__cuda_stream__`` gave ``handle``); return the handle."""
        return handle

    def refused(self, status: int) -> None:  # pragma: no cover
        """Raise the error for a launcher's nonzero status."""
        raise NotImplementedError

    def launch(self, handle: int, trampoline: int, fn: int, arg: int, owner: Any) -> None:
        """Enqueue ``trampoline`` for ``fn(arg)`` with a record that owns ``owner``."""
        native = self.native
        status = native.launch(self.launcher, handle, trampoline, fn, arg, owner)
        while status == NO_RECORD:
            self.records.grow()
            status = native.launch(self.launcher, handle, trampoline, fn, arg, owner)
        if status:
            self.refused(status)


class CudaBackend(Backend):
    """Enqueue with the driver's own cuLaunchHostFunc, reached without cuda.bindings' wrapper."""

    name = "cuda"

    def __init__(self, native: Native) -> None:
        try:
            from cuda.bindings import driver
        except ImportError as exc:  # pragma: no cover - cuda-bindings is a dependency
            raise BackendUnavailableError(
                f"numba_hostfn needs cuda-bindings for the CUDA backend ({exc}); "
                f"set {SIMULATOR_ENV}=1 to use the simulator instead"
            ) from exc
        if not cuda_driver_usable():
            raise BackendUnavailableError(
                "numba_hostfn found no usable CUDA driver or device; set "
                f"{SIMULATOR_ENV}=1 before importing numba_hostfn to run on the simulator"
            )
        super().__init__(native)
        self._driver = driver
        err, version = driver.cuDriverGetVersion()
        self._check(err, "cuDriverGetVersion")
        self.driver_version = version
        proc = {
            name: self._proc(name)
            for name in (
                "cuStreamIsCapturing",
                "cuLaunchHostFunc",
                "cuUserObjectCreate",
                "cuUserObjectRelease",
                "cuGraphRetainUserObject",
            )
        }
        native.set_cuda(proc["cuStreamIsCapturing"], proc["cuLaunchHostFunc"])
        self.launcher = native.cuda_launcher
        # Graph attachments: called through ctypes on the raw driver pointers,
        # because cuda.bindings wraps any CUhostFn argument in a GIL trampoline.
        c_uint, vp = ctypes.c_uint, ctypes.c_void_p
        self._user_object_create = ctypes.CFUNCTYPE(
            ctypes.c_int, ctypes.POINTER(vp), vp, vp, c_uint, c_uint
        )(proc["cuUserObjectCreate"])
        self._user_object_release = ctypes.CFUNCTYPE(ctypes.c_int, vp, c_uint)(
            proc["cuUserObjectRelease"]
        )
        self._graph_retain = ctypes.CFUNCTYPE(ctypes.c_int, vp, vp, c_uint, c_uint)(
            proc["cuGraphRetainUserObject"]
        )

    def _proc(self, name: str) -> int:
        d = self._driver
        result = d.cuGetProcAddress(
            name.encode(),
            self.driver_version,
            d.CUdriverProcAddress_flags.CU_GET_PROC_ADDRESS_DEFAULT,
        )
        self._check(result[0], f"cuGetProcAddress({name!r})")
        address = int(result[1])
        if not address:
            raise BackendUnavailableError(
                f"the CUDA driver (version {self.driver_version}) does not provide {name}"
            )
        return address

    def error_text(self, code: int) -> str:
        d = self._driver
        try:
            err, name = d.cuGetErrorName(d.CUresult(code))
            if err == d.CUresult.CUDA_SUCCESS:
                return f"{name.decode()} ({code})"
        except ValueError:
            pass
        return f"CUresult {code}"

    def _check(self, err: Any, call: str) -> None:
        if int(err) != 0:
            raise CudaDriverError(f"{call} failed: {self.error_text(int(err))}", int(err))

    def refused(self, status: int) -> None:
        if status == STREAM_CAPTURING:
            raise RuntimeError(
                "host_launch() was given a stream that is capturing a CUDA graph; a "
                "launch record cannot follow a graph that may replay many times. Pass "
                "the cuda.core GraphBuilder itself (host_launch(builder, fn)), or use "
                "GraphBuilder.callback. Nothing was enqueued; the capture is intact."
            )
        code = int(status & 0xFFFFFFFF)
        call = "cuStreamIsCapturing" if status & CAPTURE_CHECK_FAILED else "cuLaunchHostFunc"
        raise CudaDriverError(f"{call} failed: {self.error_text(code)}", code)

    def attach_to_capture(self, stream_handle: int, record: int) -> tuple[int, int]:
        """Make the graph being captured on ``stream_handle`` own ``record``.

        Returns ``(graph, user_object)``; the user object's destructor is the
        native completion push, so the record's owners are released on the main
        thread once the graph and all its executable instances are destroyed.
        """
        d = self._driver
        info = d.cuStreamGetCaptureInfo(d.CUstream(stream_handle))
        self._check(info[0], "cuStreamGetCaptureInfo")
        if info[1] != d.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE:
            raise RuntimeError(
                "host_launch() was given a GraphBuilder that is not building; call "
                "builder.begin_building() first"
            )
        graph = int(info[3])
        obj = ctypes.c_void_p()
        rc = self._user_object_create(
            ctypes.byref(obj),
            record,
            self.native.graph_release,
            1,
            int(d.CUuserObject_flags.CU_USER_OBJECT_NO_DESTRUCTOR_SYNC),
        )
        self._check(rc, "cuUserObjectCreate")
        return graph, obj.value

    def commit_to_graph(self, graph: int, user_object: int) -> None:
        move = int(self._driver.CUuserObjectRetain_flags.CU_GRAPH_USER_OBJECT_MOVE)
        rc = self._graph_retain(graph, user_object, 1, move)
        if rc:
            self.release_user_object(user_object)
            self._check(rc, "cuGraphRetainUserObject")

    def release_user_object(self, user_object: int) -> None:
        self._user_object_release(user_object, 1)


class SimulatorBackend(Backend):
    """Enqueue on simulated streams: native FIFO queues drained by native loops."""

    name = "simulator"
    checks_streams = True

    def __init__(self, native: Native) -> None:
        super().__init__(native)
        self.launcher = native.sim_launcher
        self.streams: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()

    def stream_handle(self, stream: Any, handle: int) -> int:
        if self.streams.get(handle) is None:
            raise TypeError(
                f"the simulator backend ({SIMULATOR_ENV}=1) runs host functions only on "
                f"numba_hostfn.simulator.Stream objects; got {stream!r}. Unset "
                f"{SIMULATOR_ENV} to use real CUDA streams"
            )
        return handle

    def refused(self, status: int) -> None:
        if status == QUEUE_STOPPED:
            raise RuntimeError("the simulated stream is closed; create a new Stream")
        raise MemoryError("the simulator could not allocate a queue entry")


def get_backend() -> Backend:
    """Return the process's backend, choosing it on first use."""
    global _backend
    backend = _backend
    if backend is not None:
        return backend
    with _lock:
        if _backend is None:
            cls = SimulatorBackend if simulator_requested() else CudaBackend
            _backend = cls(native())
        return _backend


def use_simulator() -> None:
    """Select the simulator for this process (before first use), as the env variable does."""
    if _backend is not None and _backend.name != "simulator":
        raise RuntimeError("numba_hostfn already uses the CUDA backend in this process")
    os.environ[SIMULATOR_ENV] = "1"


def simulator_unless_driver() -> bool:
    """For entry points that run anywhere (demo, tests, benchmarks): use the simulator
    when it is requested or no CUDA driver is usable.  Returns True if it is in use.

    The library itself never falls back silently: without this call, no driver and
    no simulator selected is a BackendUnavailableError.
    """
    if simulator_requested():
        return True
    if cuda_driver_usable():
        return False
    use_simulator()
    return True
