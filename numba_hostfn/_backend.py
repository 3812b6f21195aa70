"""What a backend is: what host_launch needs to enqueue on streams and graphs.

Two backends implement it, chosen once per process (``_process``): the CUDA driver
(``_cuda``) and the stream simulator (``_simbackend``, beside the simulator itself).
Both enqueue the same native trampolines (``_core``, the C extension), share one set
of launch records, and let a graph own its nodes' records the same way, so a launch
means the same thing on both.
"""

from __future__ import annotations

import contextlib
from typing import Any

from . import _core
from ._errors import FAULT_NAMES, DeviceFaultError
from ._records import LaunchRecords

__all__ = ["Backend"]


class Backend:
    """What host_launch needs from a backend: an enqueue function, stream checks,
    and a way to make the graph being captured own a record.
    """

    name = ""
    #: Address of the native enqueue function, u64 (*)(handle, trampoline, record).
    enqueue_fn = 0
    #: The same for simulated device work (the simulator's own; else enqueue_fn).
    device_enqueue_fn = 0
    #: The backend's own stream type, whose launches the native host_launch takes.
    stream_type: Any = None

    def __init__(self) -> None:
        self.records = LaunchRecords()

    def stream_handle(self, stream: Any, handle: int) -> int:
        """Vet ``stream`` (whose ``__cuda_stream__`` gave ``handle``); return the handle."""
        return handle

    def raise_refusal(self, status: int, call: str) -> None:  # pragma: no cover
        """Raise the error for an enqueue function's nonzero status."""
        raise NotImplementedError

    def error_name(self, code: int) -> str:
        """The name of a ``CUresult``."""
        return FAULT_NAMES.get(code, f"CUresult {code}")

    def fault_error(self, code: int, outcome: str, stream: int = 0) -> DeviceFaultError:
        """The error of a device fault ``code``, saying what became of the call (``outcome``).

        ``stream`` is the handle of the stream the call was about, if known: the
        context's fault is looked up by it, else by the code (the latest fault).
        """
        found = 0
        faults = _core.fault_info()
        by_stream = stream and _core.stream_fault(stream)
        for _ctx, fault_code, on in reversed(faults):
            if fault_code == code or (by_stream and fault_code == by_stream):
                found = on
                break
        name = self.error_name(code)
        where = f"found on stream {found:#x}" if found else "reported by the driver"
        return DeviceFaultError(
            f"{name} ({code}): a device fault (a kernel trapped or touched an illegal "
            f"address) in this stream's CUDA context, {where}; {outcome}. CUDA runs nothing "
            "more of that context: end the process (a job scheduler can restart it)",
            code,
            name,
            found,
        )

    def enqueue(
        self,
        handle: int,
        trampoline: int,
        fn: int,
        arg: int,
        owned: Any,
        enqueue_fn: int = 0,
        call: str = "cuLaunchHostFunc",
        context: tuple = (),
    ) -> bool:
        """Enqueue ``trampoline`` for ``fn(arg)`` with a record that owns ``owned``.

        Returns False, having enqueued nothing, if the stream is capturing.
        ``enqueue_fn`` replaces the backend's own (simulated device work, an
        executor's lane); ``call`` names the driver call in errors; ``context`` is
        the record's context (an executor's copy: its pool).
        """
        enqueue_fn = enqueue_fn or self.enqueue_fn
        status = _core.enqueue(enqueue_fn, handle, trampoline, fn, arg, owned, *context)
        if status == _core.CAPTURING:
            return False
        if status:
            self.raise_refusal(status, call)
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

    def relaxed_capture_mode(self) -> contextlib.AbstractContextManager:
        """Around a call that a capture in global mode on any thread would refuse
        (and be invalidated by): this thread in relaxed capture mode (the default
        lane's first pinned words).  Nothing to do on the simulator."""
        return contextlib.nullcontext()

    def add_slot_nodes(self, graph: Any, handle: int, slot: Any) -> None:
        """Capture a graph slot's three operations on stream ``handle`` (``_graphs``)."""
        raise NotImplementedError  # pragma: no cover
