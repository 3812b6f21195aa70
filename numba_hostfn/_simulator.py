"""A simulated CUDA stream: FIFO host work on a native thread that never holds the GIL.

Each :class:`Stream` owns a native queue (``_native``) and one native thread
(pthread) running the native worker loop; Python never sees that thread.  Host
functions therefore run as they do under the driver: in FIFO order per
stream, on a thread foreign to Python and without the GIL, through the very
same trampolines and launch records.  Streams run independently of each other (the
real driver runs the host functions of all streams of a context on one thread:
docs/simulator.md lists what is and is not modelled).
"""

from __future__ import annotations

from typing import Any

from ._backend import SimulatorBackend, get_backend
from ._errors import SIMULATOR_ENV, SimulatorUnsupportedError
from ._native import QUEUE_BYTES, calloc

__all__ = ["Stream"]


def _simulator() -> SimulatorBackend:
    backend = get_backend()
    if not isinstance(backend, SimulatorBackend):
        raise RuntimeError(
            "numba_hostfn.simulator.Stream needs the simulator backend; set "
            f"{SIMULATOR_ENV}=1 before the first use of numba_hostfn"
        )
    return backend


class Stream:
    """A simulated stream, accepted by :func:`~numba_hostfn.host_launch` like a CUDA stream.

    Work runs in the order it was enqueued, on the stream's own native thread,
    without the GIL.  ``sleep`` and ``launch`` enqueue stand-ins for device work
    so that host functions have something before and after them.

    Examples
    --------
    >>> import numba_hostfn as nh
    >>> seen = []
    >>> with nh.simulator.Stream() as s:
    ...     s.sleep(0.01)  # device work first
    ...     nh.host_launch(s, lambda: seen.append("ran"))
    ...     s.sync()
    >>> seen
    ['ran']
    """

    def __init__(self) -> None:
        backend = _simulator()
        self._native = backend.native
        queue = calloc(1, QUEUE_BYTES)
        if not queue:
            raise MemoryError("the simulator could not allocate a stream")
        if self._native.sim_init(queue):
            raise RuntimeError("the simulator could not initialise a stream's lock")
        if self._native.sim_start(queue):
            raise RuntimeError("the simulator could not start a stream's thread")
        self._queue = queue
        self._closed = False
        backend.streams[queue] = self

    @property
    def handle(self) -> int:
        """The stream's handle: the address of its native queue."""
        return self._queue

    def __cuda_stream__(self) -> tuple[int, int]:
        """Return ``(0, handle)``, as CUDA streams do (version 0 of the protocol)."""
        return (0, self._queue)

    def _live(self) -> int:
        if self._closed:
            raise RuntimeError("the simulated stream is closed; create a new Stream")
        return self._queue

    def sync(self) -> None:
        """Wait, without holding the GIL, until all work enqueued so far has run."""
        self._native.sim_sync(self._live())

    def is_done(self) -> bool:
        """True if all work enqueued so far has run."""
        return self._native.sim_pending(self._live()) == 0

    def sleep(self, seconds: float) -> None:
        """Enqueue simulated device work that occupies the stream for ``seconds``."""
        if not isinstance(seconds, (int, float)) or isinstance(seconds, bool):
            raise TypeError(f"sleep() expected a number of seconds, got {seconds!r}")
        if not 0 <= seconds <= 3600:
            raise ValueError(f"sleep() expected 0 to 3600 seconds, got {seconds!r}")
        status = self._native.sim_launch(self._live(), self._native.sim_delay, int(seconds * 1e6))
        if status:
            raise RuntimeError("the simulated stream refused the work (closed)")

    def launch(self, fn: Any, *, user_data: Any = None) -> None:
        """Enqueue a compiled host function as simulated device work (a "kernel").

        ``fn`` must be a :class:`~numba_hostfn.HostFunction` or a ``CUhostFn``
        ctypes pointer: device work cannot run Python.  It is launched exactly
        as :func:`~numba_hostfn.host_launch` would, lifetimes included.
        """
        from ._launch import classify_function, host_launch

        kind = classify_function(fn)[0]
        if kind == "python":
            raise TypeError(
                "simulated device work must be compiled: pass a HostFunction or a "
                f"CUhostFn ctypes pointer, got {fn!r}; use host_launch() for Python callables"
            )
        host_launch(self, fn, user_data=user_data)

    def create_graph_builder(self) -> Any:
        """Not modelled: the simulator has no CUDA graphs."""
        raise SimulatorUnsupportedError(
            "the simulator does not model CUDA graph capture; run graph code on a GPU"
        )

    def close(self) -> None:
        """Run what is queued, then stop the stream's thread.

        The queue's few hundred bytes are kept, not freed: any later launch on
        this stream (through a stale handle too) finds it stopped and raises.
        """
        if self._closed:
            return
        self._closed = True
        self._native.sim_stop(self._queue)
        self._native.sim_finish(self._queue, 1)  # join, without the GIL

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            self._closed = True
            self._native.sim_stop(self._queue)
            self._native.sim_finish(self._queue, 0)  # the thread ends on its own

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<numba_hostfn.simulator.Stream handle={self._queue:#x} {state}>"
