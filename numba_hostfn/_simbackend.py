"""The simulator's backend: enqueue on simulated streams (``_simulator``, ``simulator.c``)."""

from __future__ import annotations

import weakref
from typing import Any

from . import _core
from ._backend import Backend, in_host_function_error, not_building_error

__all__ = ["SimulatorBackend"]


class SimulatorBackend(Backend):
    """Enqueue on simulated streams: native queues, and one host-function thread."""

    name = "simulator"
    names_driver_calls = False  # its enqueue functions are no driver calls

    def __init__(
        self, chosen_because: str = "", requested: str = "the program selected the simulator"
    ) -> None:
        super().__init__()
        #: Why the simulator is in use when the program did not ask (no driver found).
        self.chosen_because = chosen_because
        #: Why it is in use when the program asked, as errors say it (``_process``,
        #: which owns the switch, names it).
        self.requested = requested
        _core.sim_context_start()  # RuntimeError if its thread cannot be started
        # Device faults: the watchdog queries the simulated streams (native/watchdog.c).
        _core.watchdog_configure(_core.ROUTE_SIM)
        self.route = _core.ROUTE_SIM
        self.device_route = _core.ROUTE_SIM_DEVICE
        self.executor_route = _core.ROUTE_SIM_LANE
        self.streams: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()

    @classmethod
    def register_stream_type(cls, stream_type: type) -> None:
        """The simulator's own stream type, whose launches the native host_launch takes:
        ``_simulator.Stream``, a layer above, registers itself at import."""
        cls.stream_type = stream_type

    def stream_handle(self, stream: Any, handle: int) -> int:
        if self.streams.get(handle) is None:
            if self.stream_type is not None and isinstance(stream, self.stream_type):
                stream._live()  # one that never opened (a subclass's): its RuntimeError
            if self.chosen_because:
                why = (
                    f"The simulator was chosen because {self.chosen_because}: real "
                    "CUDA streams need a machine with a usable CUDA driver and device"
                )
            else:
                why = self.requested
            raise TypeError(
                "the simulator backend runs host functions only on numba_hostfn.simulator."
                "Stream objects (or objects whose __cuda_stream__ gives an open one's "
                f"handle); got {_describe(stream)}. {why}"
            )
        return handle

    def capture_graph(self, handle: int, builder: Any = None, caller: str = "host_launch") -> Any:
        if _core.sim_in_host_function():  # a GraphBuilder's capture enqueues nothing first
            raise in_host_function_error()
        # The capture under way, which the stream itself holds (_capture_begin).
        stream = self.streams.get(handle)
        capture = None if stream is None else stream._capture
        # A builder's own capture (the one its begin_building() began), read in the
        # same step as the stream's: never another's on its stream (a begin_capture(),
        # another builder), which took the node of one not begun, ended or closed.
        if builder is not None and (capture is None or capture is not builder._capture):
            raise not_building_error(caller)
        return capture

    def check_open(self, handle: int, builder: Any = None, caller: str = "host_launch") -> None:
        super().check_open(handle, builder, caller)
        if builder is None and _core.sim_stopped(handle):  # what its enqueue answers
            self.raise_refusal(_core.QUEUE_STOPPED, stream=handle)

    def signal_refusal(self, handle: int) -> int:
        # The simulated stream's own refusal (native/simulator.c, refusal_locked), read
        # without enqueuing: a host function's call, its context's fault (noted or
        # not), a closed stream, a capture.
        return _core.sim_refusal(handle)

    def graph_record(self, graph: Any, fn: int, arg: int, owner: Any) -> int:
        return _core.sim_graph_record(graph, fn, arg, owner)

    def add_captured_node(
        self, graph: Any, handle: int, fn: int, arg: int, device: bool = False
    ) -> bool:
        return _core.sim_graph_add_node(graph, device, fn, arg)

    def add_slot_nodes(self, graph: Any, handle: int, slot: Any, record: int) -> bool:
        # The three operations in one native call, all of them or none: a part of them
        # (an interrupt between two) would run the slot's work at every replay with no
        # wait for it, after the graph may have released what it uses (invariant 21).
        ops = (_core.EXEC_SIM_SET, _core.EXEC_SIM_AWAIT, _core.EXEC_SIM_SET)
        pairs = [x for i, fn in enumerate(ops) for x in (fn, _core.exec_slot_op(slot.address, i))]
        return _core.sim_graph_add_node(graph, True, *pairs)

    def in_host_function(self) -> bool:
        return _core.sim_in_host_function()

    def executor_memory(self, nbytes: int) -> int:
        return _core.host_words(nbytes)  # never freed: a stream may still wait on it


def _describe(target: Any) -> str:
    """``repr(target)`` for an error message, or its type's name where that repr
    raises (an object half made): the message, not the repr's error, is raised."""
    try:
        return repr(target)
    except Exception:
        return f"a {type(target).__module__}.{type(target).__qualname__} object"
