"""The two backends behind host_launch: the CUDA driver, and the stream simulator.

The backend is chosen once per process, from ``NUMBA_HOSTFN_SIMULATOR`` as it
is at the first call that needs one (import does not touch the driver).  Both
backends enqueue the same native trampolines (``_core``, the C extension),
share one set of launch records, and let a graph being captured own its nodes'
records the same way, so a launch means the same thing on both.
"""

from __future__ import annotations

import ctypes
import os
import threading
import weakref
from typing import Any

from . import _core
from ._errors import SIMULATOR_ENV, BackendUnavailableError, CudaDriverError
from ._records import LaunchRecords

__all__ = [
    "Backend",
    "cuda_driver_usable",
    "forked",
    "get_backend",
    "on_backend",
    "on_fork",
    "simulator_requested",
    "simulator_unless_driver",
    "use_simulator",
]

_lock = threading.Lock()
_backend: Backend | None = None
#: Called with the backend once it is made (``_launch`` points the native
#: host_launch at it): the layers above register here instead of being imported.
_on_backend: list = []
#: Called in a child forked from a process that had used numba_hostfn.
_on_fork: list = []


def on_backend(callback: Any) -> None:
    """Call ``callback(backend)`` when the process's backend is made."""
    _on_backend.append(callback)


def on_fork(callback: Any) -> None:
    """Call ``callback()`` in a child forked from a process that had used numba_hostfn."""
    _on_fork.append(callback)


_CAPTURE_ACTIVE, _CAPTURE_INVALIDATED = 1, 2  # CUstreamCaptureStatus
_HOSTALLOC_PORTABLE_DEVICEMAP = 0x01 | 0x02  # CU_MEMHOSTALLOC_PORTABLE | _DEVICEMAP


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
    """What host_launch needs from a backend: an enqueue function, stream checks,
    and a way to make the graph being captured own a record.
    """

    name = ""
    #: Address of the native enqueue function, u64 (*)(handle, trampoline, record).
    enqueue_fn = 0
    #: The same for simulated device work (the simulator's own; else enqueue_fn).
    device_enqueue_fn = 0
    #: Whether ``stream_handle`` must vet each stream (the simulator's registry).
    checks_streams = False
    #: The backend's own stream type, whose launches the native host_launch takes.
    stream_type: Any = None

    def __init__(self) -> None:
        self.records = LaunchRecords()

    def stream_handle(self, stream: Any, handle: int) -> int:
        """Vet ``stream`` (whose ``__cuda_stream__`` gave ``handle``); return the handle."""
        return handle

    def refused(self, status: int, call: str) -> None:  # pragma: no cover
        """Raise the error for an enqueue function's nonzero status."""
        raise NotImplementedError

    def enqueue(
        self,
        handle: int,
        trampoline: int,
        fn: int,
        arg: int,
        owner: Any,
        enqueue_fn: int = 0,
        call: str = "cuLaunchHostFunc",
        builtin: Any = None,
        context: tuple = (),
    ) -> bool:
        """Enqueue ``trampoline`` for ``fn(arg)`` with a record that owns ``owner``.

        Returns False, having enqueued nothing, if the stream is capturing.
        ``enqueue_fn`` replaces the backend's own (simulated device work, an
        executor's lane); ``call`` names the driver call in errors; ``builtin``
        replaces the enqueue builtin (``enqueue_signal``: ``fn`` and ``arg`` are
        then a channel and a key); ``context`` is the record's context (an
        executor's copy: its pool).
        """
        enqueue = builtin or _core.enqueue
        enqueue_fn = enqueue_fn or self.enqueue_fn
        status = enqueue(enqueue_fn, handle, trampoline, fn, arg, owner, *context)
        if status == _core.CAPTURING:
            return False
        if status:
            self.refused(status, call)
        return True

    # ---- graphs: the capture path and explicit graphs (``_graphs``) ----

    def capture_graph(self, handle: int, builder: bool) -> Any:
        """The graph being captured on stream ``handle``, or None if it is not capturing.

        Raises RuntimeError if the capture cannot own a node (invalidated), or
        if ``builder`` is true and the stream is not capturing.
        """
        raise NotImplementedError  # pragma: no cover

    def graph_record(self, graph: Any, fn: int, arg: int, owner: Any) -> int:
        """A record for ``fn(arg)`` owning ``owner``, owned by ``graph`` from the start.

        One native call: the record is completed once the graph and every instance
        and replay of it are gone, and never before, whatever follows (a node that
        cannot be added leaves it with the graph, released with it).
        """
        raise NotImplementedError  # pragma: no cover

    def add_captured_node(
        self, graph: Any, handle: int, fn: int, arg: int, device: bool = False
    ) -> None:
        """Add the host node ``fn(arg)`` to the capture on stream ``handle``."""
        raise NotImplementedError  # pragma: no cover

    # ---- the HostExecutor (``_executor``) ----

    #: The native enqueue function of executor tasks, u64 (*)(lane, trampoline, record).
    executor_enqueue_fn = 0

    def check_executor(self) -> None:
        """Raise RuntimeError if a HostExecutor cannot work here."""

    def executor_memory(self, nbytes: int) -> int:
        """``nbytes`` zeroed bytes that the streams can write and wait on."""
        raise NotImplementedError  # pragma: no cover

    def add_slot_nodes(self, graph: Any, handle: int, slot: Any) -> None:
        """Capture a graph slot's three operations on stream ``handle`` (``_graphs``)."""
        raise NotImplementedError  # pragma: no cover


class CudaBackend(Backend):
    """Enqueue with the driver's own cuLaunchHostFunc, reached without cuda.bindings' wrapper."""

    name = "cuda"

    def __init__(self) -> None:
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
        for name in ("cuStreamBeginCaptureToGraph", "cuStreamBatchMemOp"):
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

    def refused(self, status: int, call: str) -> None:
        code = int(status & 0xFFFFFFFF)
        if status & _core.EXECUTOR_CLOSED:
            raise RuntimeError("the HostExecutor is closed; create a new one")
        if status & _core.KEPT:
            raise CudaDriverError(
                f"cuStreamWaitValue32 failed: {self.error_text(code)}; the task was enqueued "
                "and runs when the stream reaches it, but the stream does not wait for it",
                code,
            )
        if status & _core.OUT_OF_MEMORY:
            raise MemoryError("numba_hostfn could not allocate an executor task")
        if status & _core.CAPTURE_CHECK_FAILED:
            call = "cuStreamIsCapturing"
        raise CudaDriverError(f"{call} failed: {self.error_text(code)}", code)

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
        if rc:
            raise CudaDriverError(
                f"cuMemHostAlloc failed: {self.error_text(rc)}; a HostExecutor allocates its "
                "pinned words in the current context: make the stream's device current first "
                "(cuda.core: Device(n).set_current())",
                rc,
            )
        ctypes.memset(pointer.value, 0, nbytes)
        return pointer.value

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


class SimulatorBackend(Backend):
    """Enqueue on simulated streams: native queues, and one host-function thread."""

    name = "simulator"
    checks_streams = True

    def __init__(self) -> None:
        super().__init__()
        if _core.sim_context_start():
            raise RuntimeError("the simulator could not start its host-function thread")
        self.enqueue_fn = _core.SIM_ENQUEUE
        self.device_enqueue_fn = _core.SIM_ENQUEUE_DEVICE
        self.executor_enqueue_fn = _core.EXEC_SIM_ENQUEUE
        self.streams: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
        #: handle -> the simulator's capture object, while that stream captures.
        self.captures: dict[int, Any] = {}

    def stream_handle(self, stream: Any, handle: int) -> int:
        if self.streams.get(handle) is None:
            if _simulator_chosen_because:
                why = (
                    f"The simulator was chosen because {_simulator_chosen_because}: real "
                    "CUDA streams need a machine with a usable CUDA driver and device"
                )
            else:
                why = f"{SIMULATOR_ENV} is set: unset it to use real CUDA streams"
            raise TypeError(
                "the simulator backend runs host functions only on numba_hostfn.simulator."
                "Stream objects (or objects whose __cuda_stream__ gives an open one's "
                f"handle); got {stream!r}. {why}"
            )
        return handle

    def refused(self, status: int, call: str = "") -> None:
        if status & _core.EXECUTOR_CLOSED:
            raise RuntimeError("the HostExecutor is closed; create a new one")
        if status & _core.QUEUE_STOPPED:
            if status & _core.KEPT:
                raise RuntimeError(
                    "the simulated stream closed while a HostExecutor task was enqueued: the "
                    "task runs when the stream reaches it, but the stream does not wait for it"
                )
            raise RuntimeError("the simulated stream is closed; create a new Stream")
        raise MemoryError("the simulator could not allocate a queue entry")

    def capture_graph(self, handle: int, builder: bool) -> Any:
        capture = self.captures.get(handle)
        if capture is None and builder:
            raise RuntimeError(
                "host_launch() was given a GraphBuilder that is not building; call "
                "builder.begin_building() first"
            )
        return capture

    def graph_record(self, graph: Any, fn: int, arg: int, owner: Any) -> int:
        return _core.sim_graph_record(graph.keeper.keeper, fn, arg, owner)

    def add_captured_node(
        self, graph: Any, handle: int, fn: int, arg: int, device: bool = False
    ) -> None:
        _core.sim_keeper_add_node(graph.keeper.keeper, device, fn, arg)

    def add_slot_nodes(self, graph: Any, handle: int, slot: Any) -> None:
        keeper = graph.keeper.keeper
        for i, fn in enumerate((_core.EXEC_SIM_SET, _core.EXEC_SIM_AWAIT, _core.EXEC_SIM_SET)):
            _core.sim_keeper_add_node(keeper, True, fn, _core.exec_slot_op(slot.address, i))

    def executor_memory(self, nbytes: int) -> int:
        return _core.host_words(nbytes)  # never freed: a stream may still wait on it


def get_backend() -> Backend:
    """Return the process's backend, choosing it on first use."""
    global _backend
    backend = _backend
    if backend is not None:
        if _forked:
            raise RuntimeError(
                "numba_hostfn was used in this process's parent before fork(); a forked "
                "child cannot use it (CUDA does not survive fork, and the parent's driver "
                "and pool threads do not exist here). Start worker processes with the "
                "'spawn' or 'forkserver' method: multiprocessing.set_start_method('spawn')"
            )
        return backend
    with _lock:
        if _backend is None:
            cls = SimulatorBackend if simulator_requested() else CudaBackend
            backend = cls()
            for callback in _on_backend:
                callback(backend)
            _backend = backend
        return _backend


_forked = False


def forked() -> bool:
    """True in a child forked from a process that had used numba_hostfn."""
    return _forked


def _after_fork_in_child() -> None:
    # The child has the parent's memory but none of its threads: no driver
    # thread or pool thread will ever run a copied launch.  Refuse every later
    # use, and let the child exit without waiting for them (LIFETIME.md, Scope).
    global _forked
    if _backend is not None:
        _forked = True
        _backend.records.abandon()
        for callback in _on_fork:
            callback()


os.register_at_fork(after_in_child=_after_fork_in_child)


#: Why this process chose the simulator itself ("" if it did not): error messages say it.
_simulator_chosen_because = ""


def use_simulator(because: str = "") -> None:
    """Select the simulator for this process (before first use), as the env variable does.

    ``because`` says why, when it is not the caller's request (no driver found).
    """
    global _simulator_chosen_because
    if _backend is not None and _backend.name != "simulator":
        raise RuntimeError("numba_hostfn already uses the CUDA backend in this process")
    _simulator_chosen_because = because
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
    use_simulator(because="no usable CUDA driver was found")
    return True
