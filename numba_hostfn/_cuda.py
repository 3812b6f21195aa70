"""The CUDA backend: the driver's own entry points, reached without cuda.bindings' wrapper.

The entry points are one table in the native core (``native/driver.h``): this module
resolves the names it lists through cuGetProcAddress, once, and the core calls them,
with the GIL released; no driver call goes through ctypes."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from . import _core
from ._backend import Backend, env_switch, not_building_error
from ._errors import FAULT_NAMES, BackendUnavailableError, CudaDriverError

#: Turns the device-fault watchdog off for the CUDA backend when 0, false, no or off
#: (it is on by default: docs/errors.md); a value that is neither on nor off is refused.
WATCHDOG_ENV = "NUMBA_HOSTFN_CUDA_WATCHDOG"

__all__ = ["CudaBackend", "cuda_driver_usable", "watchdog_requested"]

#: The entry points the watchdog calls (native/watchdog.c): it runs only with all of them.
_WATCHDOG_ENTRY_POINTS = frozenset(
    {
        "cuStreamQuery",
        "cuStreamGetCtx",
        "cuThreadExchangeStreamCaptureMode",
        "cuCtxPushCurrent",
        "cuCtxPopCurrent",
    }
)


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


def watchdog_requested() -> bool:
    """True unless ``NUMBA_HOSTFN_CUDA_WATCHDOG`` turns the watchdog off; ``ValueError``
    if it says neither on nor off (``env_switch``)."""
    return env_switch(WATCHDOG_ENV, True, "watch for device faults")


class CudaBackend(Backend):
    """Enqueue with the driver's own cuLaunchHostFunc, reached without cuda.bindings' wrapper."""

    name = "cuda"

    def __init__(self, use_simulator: str = "or run on the simulator") -> None:
        """``use_simulator`` says how to select the simulator instead (``_process``,
        which owns that switch), in a BackendUnavailableError."""
        # The watchdog (device faults): on unless NUMBA_HOSTFN_CUDA_WATCHDOG=0.  It
        # queries contexts, through its own per-thread stream, never a user's handle.
        # Read first: a value that is neither on nor off is refused before anything loads.
        watch = watchdog_requested()
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
        # The driver table (native/driver.h): each of its entry points resolved once;
        # a required one the driver lacks is a BackendUnavailableError, an optional
        # one 0 (the core does without it, or says what needs it).
        addresses = []
        for name, required in _core.driver_entry_points():
            try:
                addresses.append(self._proc(name))
            except (BackendUnavailableError, CudaDriverError):
                if required:
                    raise
                addresses.append(0)
        #: The optional entry points this driver lacks.
        self.missing = frozenset(_core.driver_load(tuple(addresses)))
        if watch and not _WATCHDOG_ENTRY_POINTS & self.missing:
            _core.watchdog_configure(_core.ROUTE_CUDA)
        self.route = _core.ROUTE_CUDA
        self.device_route = _core.ROUTE_CUDA
        self.executor_route = _core.ROUTE_CUDA_LANE
        self._executor_checked = False

    def _proc(self, name: str) -> int:
        d = self._driver
        # The version whose signatures native/driver.h declares, or the driver's own
        # if older: a newer driver that changes an entry point still gives that one.
        result = d.cuGetProcAddress(
            name.encode(),
            min(self.driver_version, _core.DRIVER_ABI_VERSION),
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

    def _answer(self, answer: tuple[Any, int, str | None]) -> Any:
        """A native driver call's (value, CUresult, call): the value, or the error
        naming the call."""
        value, rc, call = answer
        if rc:
            self._check(rc, call or "a CUDA driver call")
        return value

    def capture_graph(self, handle: int, builder: Any = None, caller: str = "host_launch") -> Any:
        if builder is not None and _builder_not_building(builder):
            raise not_building_error(caller)
        status, graph = self._answer(_core.cuda_capture_info(handle))
        if status == _core.CU_STREAM_CAPTURE_STATUS_ACTIVE:
            if not graph:
                raise RuntimeError(
                    f"{caller}() could not read the graph being captured on this stream; "
                    "nothing was enqueued, and the capture is as it was"
                )
            return graph
        if status == _core.CU_STREAM_CAPTURE_STATUS_INVALIDATED:
            raise RuntimeError(
                f"{caller}() was given a stream whose graph capture is invalidated (an "
                "earlier call broke it; ending the capture will fail); nothing was enqueued. "
                "End the capture and capture again"
            )
        if builder is not None:
            raise not_building_error(caller)
        return None  # the capture ended since the enqueue saw it

    def signal_refusal(self, handle: int) -> int:
        # The enqueue's own refusal (native/cuda.c, nhf_cuda_refusal), read without
        # enqueuing: a noted fault, a failed capture read, a capture.
        return _core.cuda_refusal(handle)

    def graph_record(self, graph: Any, fn: int, arg: int, owner: Any) -> int:
        return self._answer(_core.cuda_graph_record(graph, fn, arg, owner))

    def add_captured_node(
        self, graph: Any, handle: int, fn: int, arg: int, device: bool = False
    ) -> bool:
        # arg is the record: pinned by the call, and kept for good where the capture
        # ended during the launch (CAPTURE_UNSURE: it may run on the stream).
        where = self._answer(_core.cuda_captured_host_node(handle, graph, fn, arg))
        return where != _core.CAPTURE_ENDED

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
        address, rc, _ = _core.cuda_pinned_words(nbytes)
        if rc in FAULT_NAMES:
            raise self.fault_error(rc, "a HostExecutor could not allocate its words")
        if rc:
            raise CudaDriverError(
                f"cuMemHostAlloc failed: {self.error_text(rc)}; a HostExecutor allocates its "
                "pinned words in the current context: make the stream's device current first "
                "(cuda.core: Device(n).set_current())",
                rc,
            )
        return address

    @contextlib.contextmanager
    def relaxed_capture_mode(self) -> Iterator[None]:
        # An old driver without cuThreadExchangeStreamCaptureMode: unchanged, as a
        # HostExecutor made there.
        before = self._answer(
            _core.cuda_exchange_capture_mode(_core.CU_STREAM_CAPTURE_MODE_RELAXED)
        )
        try:
            yield
        finally:
            _core.cuda_exchange_capture_mode(before)  # the thread's mode as it was

    def add_slot_nodes(self, graph: Any, handle: int, slot: Any, record: int) -> bool:
        # As add_captured_node: the capture read around the launch, the record pinned.
        where, rc, call = _core.cuda_slot_nodes(handle, graph, slot.words, record)
        if rc:
            raise CudaDriverError(
                f"{call} failed while capturing a HostExecutor node: {self.error_text(rc)}; "
                "nothing of it is kept, but the capture may now be invalidated (the driver "
                "decides): end it and capture again",
                rc,
            )
        return where != _core.CAPTURE_ENDED

    def slot_graph(self, slot: Any) -> Any:
        """A cuda.core GraphDefinition holding a graph slot's three operations."""
        from cuda.core.graph import GraphDefinition

        if "cuStreamBeginCaptureToGraph" in self.missing:
            raise RuntimeError(
                f"executor= on an explicit graph needs cuStreamBeginCaptureToGraph (CUDA "
                f"12.3+); this driver is {self.driver_version}. Capture a stream instead"
            )
        child = GraphDefinition()
        self._answer(_core.cuda_slot_graph(int(child.handle), slot.words))
        return child


def _builder_not_building(builder: Any) -> bool:
    """Whether cuda.core's GraphBuilder ``builder`` is known not to be building itself,
    whatever captures its stream.

    cuda.core (1.2.0 to 1.2.2) keeps a builder's capture state in a private C field
    (``_state``), and its ``is_building`` reads only whether the builder's stream is
    capturing: True while another capture (another builder on the same stream, a
    ``cuStreamBeginCapture``) holds a stream whose builder was never begun, has
    ended or is closed, and the node would join that capture.  What it shows
    publicly: ``is_closed``, and ``graph_definition`` (1.1.0+), which a builder gives
    only when it is not building (a primary builder after ``end_building()``, a
    conditional body before ``begin_building()`` and after ``end_building()``) and
    refuses with RuntimeError while it builds, as for a forked builder (always
    building) and a primary builder not begun.  That last one alone is not told
    apart here: it is refused only where its stream is not capturing.  A builder
    that builds pays one RuntimeError raised inside cuda.core per launch.
    """
    try:
        if getattr(builder, "is_closed", False):
            return True
        definition = builder.graph_definition
    except Exception:  # building, or not known (an older cuda.core has neither)
        return False
    return definition is not None
