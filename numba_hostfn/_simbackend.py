"""The simulator's backend: enqueue on simulated streams (``_simulator``, ``simulator.c``)."""

from __future__ import annotations

import weakref
from typing import Any

from . import _core
from ._backend import Backend
from ._errors import SIMULATOR_ENV

__all__ = ["SimulatorBackend"]


class SimulatorBackend(Backend):
    """Enqueue on simulated streams: native queues, and one host-function thread."""

    name = "simulator"

    def __init__(self, chosen_because: str = "") -> None:
        super().__init__()
        #: Why the simulator is in use when the program did not ask (no driver found).
        self.chosen_because = chosen_because
        if _core.sim_context_start():
            raise RuntimeError("the simulator could not start its host-function thread")
        # Device faults: the watchdog queries the simulated streams (native/watchdog.c).
        _core.watchdog_configure(_core.SIM_QUERY, _core.SIM_CONTEXT_OF)
        self.enqueue_fn = _core.SIM_ENQUEUE
        self.device_enqueue_fn = _core.SIM_ENQUEUE_DEVICE
        self.executor_enqueue_fn = _core.EXEC_SIM_ENQUEUE
        self.streams: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
        #: handle -> the simulator's capture object, while that stream captures.
        self.captures: dict[int, Any] = {}

    def stream_handle(self, stream: Any, handle: int) -> int:
        if self.streams.get(handle) is None:
            if self.chosen_because:
                why = (
                    f"The simulator was chosen because {self.chosen_because}: real "
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

    def raise_refusal(self, status: int, call: str = "") -> None:
        if status & _core.IN_HOST_FUNCTION:
            _refuse_in_host_function()
        if status & _core.FAULTED:
            raise self.fault_error(status & 0xFFFFFFFF, "nothing was enqueued")
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
        if _core.sim_in_host_function():  # a GraphBuilder's capture enqueues nothing first
            _refuse_in_host_function()
        capture = self.captures.get(handle)
        if capture is None and builder:
            raise RuntimeError(
                "host_launch() was given a GraphBuilder that is not building; call "
                "builder.begin_building() first"
            )
        return capture

    def graph_record(self, graph: Any, fn: int, arg: int, owner: Any) -> int:
        return _core.sim_graph_record(graph, fn, arg, owner)

    def add_captured_node(
        self, graph: Any, handle: int, fn: int, arg: int, device: bool = False
    ) -> None:
        _core.sim_graph_add_node(graph, device, fn, arg)

    def add_slot_nodes(self, graph: Any, handle: int, slot: Any) -> None:
        sim_graph = graph
        for i, fn in enumerate((_core.EXEC_SIM_SET, _core.EXEC_SIM_AWAIT, _core.EXEC_SIM_SET)):
            _core.sim_graph_add_node(sim_graph, True, fn, _core.exec_slot_op(slot.address, i))

    def executor_memory(self, nbytes: int) -> int:
        return _core.host_words(nbytes)  # never freed: a stream may still wait on it


def _refuse_in_host_function() -> None:
    """Raise for work enqueued by a host function (the simulator's ``IN_HOST_FUNCTION``)."""
    raise RuntimeError(
        "a host function enqueued work on a simulated stream (host_launch, host_copy, "
        "release_after, a signal or a graph launch): CUDA forbids a host function any "
        "CUDA call (the driver may refuse it or deadlock), so the simulator refuses it, "
        "and nothing was enqueued. Enqueue from the program's own threads; to launch "
        "when a stream gets somewhere, use host_launch(stream, fn, blocking=False): fn "
        "then runs on a Python thread, where it may launch (docs/threading.md)"
    )
