"""The CUDA backend: the driver's own entry points, reached without cuda.bindings' wrapper."""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterator
from typing import Any

from . import _core
from ._backend import Backend
from ._errors import FAULT_NAMES, BackendUnavailableError, CudaDriverError

#: Turns the device-fault watchdog on for the CUDA backend (off until an H200 run
#: has validated it; docs/errors.md).
WATCHDOG_ENV = "NUMBA_HOSTFN_CUDA_WATCHDOG"

__all__ = ["CudaBackend", "cuda_driver_usable"]

_CAPTURE_ACTIVE, _CAPTURE_INVALIDATED = 1, 2  # CUstreamCaptureStatus
_CAPTURE_MODE_RELAXED = 2  # CUstreamCaptureMode
_HOSTALLOC_PORTABLE_DEVICEMAP = 0x01 | 0x02  # CU_MEMHOSTALLOC_PORTABLE | _DEVICEMAP


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


class CudaBackend(Backend):
    """Enqueue with the driver's own cuLaunchHostFunc, reached without cuda.bindings' wrapper."""

    name = "cuda"

    def __init__(self, use_simulator: str = "or run on the simulator") -> None:
        """``use_simulator`` says how to select the simulator instead (``_process``,
        which owns that switch), in a BackendUnavailableError."""
        try:
            from cuda.bindings import driver
        except ImportError as exc:  # pragma: no cover - cuda-bindings is a dependency
            raise BackendUnavailableError(
                f"numba_hostfn needs cuda-bindings for the CUDA backend ({exc}); {use_simulator}"
            ) from exc
        if not cuda_driver_usable():
            raise BackendUnavailableError(
                f"numba_hostfn found no usable CUDA driver or device; {use_simulator}"
            )
        super().__init__()
        from cuda.core import Stream

        self.stream_type = Stream
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
                "cuStreamGetCaptureInfo",
                "cuStreamWriteValue32",
                "cuStreamWaitValue32",
                "cuMemHostAlloc",
                "cuStreamCreate",
                "cuStreamDestroy",
                "cuStreamEndCapture",
            )
        }
        # Optional entry points (0 where the driver lacks one):
        # CUDA 12.3+: an explicit graph's executor node is captured into a child graph;
        # the executor's write and wait go in one cuStreamBatchMemOp (two calls without it).
        # The watchdog's queries (device faults, native/watchdog.c).
        for name in (
            "cuStreamBeginCaptureToGraph",
            "cuStreamBatchMemOp",
            "cuStreamQuery",
            "cuStreamGetCtx",
            "cuThreadExchangeStreamCaptureMode",
            "cuCtxPushCurrent",
            "cuCtxPopCurrent",
        ):
            try:
                proc[name] = self._proc(name)
            except (BackendUnavailableError, CudaDriverError):
                proc[name] = 0
        self._memops = (
            proc["cuStreamWriteValue32"],
            proc["cuStreamWaitValue32"],
            proc["cuStreamBatchMemOp"],
        )
        self._enqueue_entry_points = (proc["cuStreamIsCapturing"], proc["cuLaunchHostFunc"])
        self.set_memops(*self._memops)
        # The watchdog (device faults): on unless NUMBA_HOSTFN_CUDA_WATCHDOG=0.  It
        # queries contexts, through its own per-thread stream, never a user's handle.
        watch = os.environ.get(WATCHDOG_ENV, "").strip().lower() not in ("0", "false", "no")
        watch_entry_points = [
            proc[name]
            for name in (
                "cuStreamQuery",
                "cuStreamGetCtx",
                "cuThreadExchangeStreamCaptureMode",
                "cuCtxPushCurrent",
                "cuCtxPopCurrent",
            )
        ]
        if watch and all(watch_entry_points):
            _core.set_cuda_watch(*watch_entry_points)
            _core.watchdog_configure(_core.CUDA_QUERY, _core.CUDA_CONTEXT_OF)
        self.enqueue_fn = _core.CUDA_ENQUEUE
        self.device_enqueue_fn = _core.CUDA_ENQUEUE
        # The capture path calls these through ctypes on the raw driver
        # pointers (foreign calls: the GIL is released), because cuda.bindings
        # wraps any CUhostFn argument in a trampoline that takes the GIL.
        c_int, c_uint, vp = ctypes.c_int, ctypes.c_uint, ctypes.c_void_p
        self._launch_host_func = ctypes.CFUNCTYPE(c_int, vp, vp, vp)(proc["cuLaunchHostFunc"])
        _core.set_cuda_user_objects(
            proc["cuUserObjectCreate"], proc["cuUserObjectRelease"], proc["cuGraphRetainUserObject"]
        )
        # (stream, status*, id*, graph*, then optional outs): the CUDA 12 form has
        # two optional outs after graph, the CUDA 13 form three; both take NULL
        # for each, and passing one NULL too many is harmless in the C calling
        # conventions of x86-64 and AArch64.
        self._capture_info = ctypes.CFUNCTYPE(
            c_int, vp, ctypes.POINTER(c_int), vp, ctypes.POINTER(vp), vp, vp, vp
        )(proc["cuStreamGetCaptureInfo"])
        self.executor_enqueue_fn = _core.EXEC_CUDA_ENQUEUE
        self._host_alloc = ctypes.CFUNCTYPE(c_int, ctypes.POINTER(vp), ctypes.c_size_t, c_uint)(
            proc["cuMemHostAlloc"]
        )
        self._executor_checked = False
        u64 = ctypes.c_uint64
        self._write_value32 = ctypes.CFUNCTYPE(c_int, vp, u64, c_uint, c_uint)(
            proc["cuStreamWriteValue32"]
        )
        self._wait_value32 = ctypes.CFUNCTYPE(c_int, vp, u64, c_uint, c_uint)(
            proc["cuStreamWaitValue32"]
        )
        self._stream_create = ctypes.CFUNCTYPE(c_int, ctypes.POINTER(vp), c_uint)(
            proc["cuStreamCreate"]
        )
        self._stream_destroy = ctypes.CFUNCTYPE(c_int, vp)(proc["cuStreamDestroy"])
        self._end_capture = ctypes.CFUNCTYPE(c_int, vp, ctypes.POINTER(vp))(
            proc["cuStreamEndCapture"]
        )
        exchange = proc["cuThreadExchangeStreamCaptureMode"]
        self._exchange_capture_mode = (
            ctypes.CFUNCTYPE(c_int, ctypes.POINTER(c_int))(exchange) if exchange else None
        )
        self._begin_capture_to_graph = (
            ctypes.CFUNCTYPE(c_int, vp, vp, vp, vp, ctypes.c_size_t, c_int)(
                proc["cuStreamBeginCaptureToGraph"]
            )
            if proc["cuStreamBeginCaptureToGraph"]
            else None
        )

    def set_memops(self, write_value32: int, wait_value32: int, batch_mem_op: int) -> None:
        """The stream memory operations the executor's enqueue calls (tests stand in)."""
        _core.set_cuda(*self._enqueue_entry_points, write_value32, wait_value32, batch_mem_op or 0)

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

    def error_name(self, code: int) -> str:
        d = self._driver
        try:
            err, name = d.cuGetErrorName(d.CUresult(code))
            if err == d.CUresult.CUDA_SUCCESS:
                return name.decode()
        except ValueError:
            pass
        return super().error_name(code)

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

    def capture_graph(self, handle: int, builder: bool) -> Any:
        status, graph = ctypes.c_int(), ctypes.c_void_p()
        rc = self._capture_info(
            handle, ctypes.byref(status), None, ctypes.byref(graph), None, None, None
        )
        self._check(rc, "cuStreamGetCaptureInfo")
        if status.value == _CAPTURE_ACTIVE:
            if not graph.value:
                raise RuntimeError(
                    "host_launch() could not read the graph being captured on this stream; "
                    "nothing was enqueued, and the capture is as it was"
                )
            return graph.value
        if status.value == _CAPTURE_INVALIDATED:
            raise RuntimeError(
                "host_launch() was given a stream whose graph capture is invalidated (an "
                "earlier call broke it; ending the capture will fail); nothing was enqueued. "
                "End the capture and capture again"
            )
        if builder:
            raise RuntimeError(
                "host_launch() was given a GraphBuilder that is not building; call "
                "builder.begin_building() first"
            )
        return None  # the capture ended since the enqueue saw it

    def graph_record(self, graph: Any, fn: int, arg: int, owner: Any) -> int:
        record, rc, call = _core.cuda_graph_record(graph, fn, arg, owner)
        if rc:
            self._check(rc, ("cuUserObjectCreate", "cuGraphRetainUserObject")[call - 1])
        return record

    def add_captured_node(
        self, graph: Any, handle: int, fn: int, arg: int, device: bool = False
    ) -> None:
        rc = self._launch_host_func(handle, fn, arg)
        self._check(rc, "cuLaunchHostFunc")

    def check_executor(self) -> None:
        if self._executor_checked:
            return
        d = self._driver
        attribute = d.CUdevice_attribute
        err, count = d.cuDeviceGetCount()
        self._check(err, "cuDeviceGetCount")
        for ordinal in range(count):
            err, device = d.cuDeviceGet(ordinal)
            self._check(err, "cuDeviceGet")
            values = {}
            for name in (
                "CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING",
                "CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1",
                "CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR",
            ):
                if hasattr(attribute, name):
                    err, value = d.cuDeviceGetAttribute(getattr(attribute, name), device)
                    values[name] = value if int(err) == 0 else 0
            memops = values.get("CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1", 0) or values.get(
                "CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR", 0
            )
            if not values.get("CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING") or not memops:
                raise RuntimeError(
                    f"HostExecutor needs stream memory operations on host memory, which CUDA "
                    f"device {ordinal} does not offer ({values}); run host functions with "
                    "host_launch without executor= there"
                )
        self._executor_checked = True

    def executor_memory(self, nbytes: int) -> int:
        pointer = ctypes.c_void_p()
        rc = self._host_alloc(ctypes.byref(pointer), nbytes, _HOSTALLOC_PORTABLE_DEVICEMAP)
        if rc in FAULT_NAMES:
            raise self.fault_error(rc, "a HostExecutor could not allocate its words")
        if rc:
            raise CudaDriverError(
                f"cuMemHostAlloc failed: {self.error_text(rc)}; a HostExecutor allocates its "
                "pinned words in the current context: make the stream's device current first "
                "(cuda.core: Device(n).set_current())",
                rc,
            )
        ctypes.memset(pointer.value, 0, nbytes)
        return pointer.value

    @contextlib.contextmanager
    def relaxed_capture_mode(self) -> Iterator[None]:
        exchange = self._exchange_capture_mode
        if exchange is None:  # an old driver: as a HostExecutor made there
            yield
            return
        mode = ctypes.c_int(_CAPTURE_MODE_RELAXED)
        self._check(exchange(ctypes.byref(mode)), "cuThreadExchangeStreamCaptureMode")
        try:
            yield
        finally:
            exchange(ctypes.byref(mode))  # the thread's mode as it was

    def add_slot_nodes(self, graph: Any, handle: int, slot: Any) -> None:
        reached, done = slot.words, slot.words + 4
        for call, name, word, value, flags in (
            (self._write_value32, "cuStreamWriteValue32", reached, 1, 0),
            (self._wait_value32, "cuStreamWaitValue32", done, 1, 0),  # GEQ
            (self._write_value32, "cuStreamWriteValue32", done, 0, 0),
        ):
            rc = call(handle, word, value, flags)
            if rc:
                raise CudaDriverError(
                    f"{name} failed while capturing a HostExecutor node: {self.error_text(rc)}; "
                    "nothing of it is kept, but the capture may now be invalidated (the driver "
                    "decides): end it and capture again",
                    rc,
                )

    def slot_graph(self, slot: Any) -> Any:
        """A cuda.core GraphDefinition holding a graph slot's three operations."""
        from cuda.core.graph import GraphDefinition

        if self._begin_capture_to_graph is None:
            raise RuntimeError(
                f"executor= on an explicit graph needs cuStreamBeginCaptureToGraph (CUDA "
                f"12.3+); this driver is {self.driver_version}. Capture a stream instead"
            )
        child = GraphDefinition()
        stream = ctypes.c_void_p()
        self._check(self._stream_create(ctypes.byref(stream), 1), "cuStreamCreate")
        try:
            relaxed = 2  # CU_STREAM_CAPTURE_MODE_RELAXED: no other stream is affected
            rc = self._begin_capture_to_graph(stream, int(child.handle), None, None, 0, relaxed)
            self._check(rc, "cuStreamBeginCaptureToGraph")
            try:
                self.add_slot_nodes(None, stream.value, slot)
            finally:
                graph = ctypes.c_void_p()
                rc = self._end_capture(stream, ctypes.byref(graph))
            self._check(rc, "cuStreamEndCapture")
        finally:
            self._stream_destroy(stream)
        return child
