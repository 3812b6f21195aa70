"""``host_launch``: enqueue a host function in stream order and own what it needs.

``numba_hostfn.host_launch`` is a native builtin (``native/host_launch.c``) that
launches the common cases itself and hands every other call, unchanged, to
:func:`host_launch_python` here, which alone raises errors.  Everything is
checked before anything is enqueued: a call that raises an error of its own has
enqueued nothing and keeps no reference to its arguments.
"""

from __future__ import annotations

import contextlib
import ctypes
import inspect
from collections.abc import Iterator
from typing import Any

from . import _core
from ._classify import classify_function, compiled_layout
from ._compat import FUNCFLAG_CDECL, POINTER_PROTOTYPE, CFuncPtr
from ._enqueue import check_target, enqueue, raise_refused, user_data_with_callable
from ._errors import keeps_nothing_on_refusal
from ._executor import check_executor
from ._hostfunction import CUhostFn
from ._notify import launch_nonblocking
from ._process import on_backend
from ._userdata import ByRef, resolve_user_data

__all__ = [
    "host_launch",
    "host_launch_answered",
    "host_launch_python",
    "launch_counts",
    "python_path",
]


@keeps_nothing_on_refusal
def host_launch_python(
    stream: Any, fn: Any, *, user_data: Any = None, executor: Any = None, blocking: bool = True
) -> Any:
    """Enqueue ``fn`` on ``stream``: it runs on the host when the stream reaches this point.

    A :class:`HostFunction` or ctypes ``CUhostFn`` runs on the driver's thread
    without the GIL; a Python callable is called with no arguments through a
    trampoline that takes the GIL.  The launch keeps ``fn`` and its user data
    alive until it has run, then releases them on the main thread.  A host
    function must not call CUDA; all rules: docs/threading.md.

    On a stream that is capturing a CUDA graph (whoever began the capture:
    cuda.core's ``GraphBuilder``, ``torch.cuda.graph``, CuPy, cuda.bindings),
    ``fn`` becomes a host node of that graph, which runs at every replay; the
    graph owns what the node needs until the graph and all its executable
    instances are gone (docs/streams.md).

    Parameters
    ----------
    stream : stream, GraphBuilder, GraphDefinition or GraphNode
        Where to enqueue: a cuda.core ``Stream`` or any object with
        ``__cuda_stream__`` (CuPy, PyTorch, numba-cuda).  A ``GraphBuilder`` must be building.  A
        ``GraphDefinition`` or ``GraphNode`` (an explicit graph) gets a new
        host node, after the given node, that the graph owns.  With the
        simulator, a ``numba_hostfn.simulator.Stream`` or its ``GraphBuilder``.
        What the stream's ``__cuda_stream__`` raises propagates as itself.
    fn : HostFunction, ctypes CUhostFn, numba cfunc or callable
        What to run.  A ctypes pointer must be declared exactly as
        ``ctypes.CFUNCTYPE(None, ctypes.c_void_p)``; a numba cfunc must have
        the signature ``void(voidptr)``.
    user_data : None, int, bytes-like, ByRef or Record, optional
        Only for compiled functions and pointers.  ``None`` passes NULL (refused
        for a HostFunction whose body reads its argument), an ``int`` a raw
        address you keep valid, a read-only bytes-like object (``bytes``) a copy
        taken now (in a graph: taken once, and every replay sees that copy).  A
        writable buffer (numpy array, ``bytearray``, ...) is never copied, since
        the host function's writes would be lost: it is shared, as
        :func:`by_ref` shares it (every replay sees it live), and so is a
        :func:`record`; pass ``bytes(a)`` for a copy (docs/user_data.md).
    executor : HostExecutor, optional
        Run ``fn`` on the executor's threads instead of the driver's
        host-function thread: the stream writes a word when it reaches this
        point and waits for the executor to answer (docs/executor.md).  In a
        graph (captured or explicit) the node is three stream memory
        operations that every replay re-arms; the executor's pool polls for
        replays while such a graph is alive.
    blocking : bool, optional
        For a Python callable only.  True (the default): the stream waits
        while the callable runs, on the thread that reaches the point, which
        takes the GIL.  False: the stream only signals that it got here, with
        no GIL, and goes on; Python runs the callable soon after, in stream
        order among that stream's non-blocking callbacks, on the main thread
        (a pending call) or on numba_hostfn's helper thread, whichever comes
        first (docs/asyncio.md).  Not in a graph.

    Returns
    -------
    cuda.core.graph.HostCallbackNode, ChildGraphNode or None
        The new node for an explicit graph (so calls chain as in cuda.core;
        a ``ChildGraphNode`` of three memory operations with ``executor=``),
        else None.

    Raises
    ------
    TypeError
        If more than two arguments are positional (``user_data``, ``executor``
        and ``blocking`` are keyword-only), or ``stream``, ``fn`` or
        ``user_data`` has the wrong type (None, a bare int stream, a ctypes
        prototype other than CUhostFn, a buffer of Python objects, an array
        of datetimes, which numpy exports no buffer of, ...),
        checked in that order, or ``fn`` is a coroutine or generator function
        (its call only makes a coroutine or generator, whose body never runs;
        ``unittest.mock.AsyncMock`` too) or a callable that needs arguments
        (a builtin such as ``len`` included, where its signature says so; a
        ``staticmethod`` is checked as its function), or ``executor`` is not
        a HostExecutor, or ``blocking`` is not True or False.
    ValueError
        If ``fn`` is a NULL function pointer or a HostFunction never compiled
        (made with ``__new__``: its address is 0), or user_data is given with
        a Python callable, or does not match the HostFunction's declared
        ``dtype`` (``0``, a NULL pointer to it, included), is NULL (``None``
        or ``0``) for a body that reads it, is a writable buffer that cannot
        be shared (not C-contiguous), a closed ``mmap`` or a released
        ``memoryview``, is an int outside [0, 2**64), or
        ``blocking=False`` is given with
        compiled code (it never takes the GIL: it needs no such option).
    RuntimeError
        If a capture cannot take a node (it is invalidated), a GraphBuilder is
        not building, a simulated stream is closed, the executor is closed,
        ``blocking=False`` is used in a graph or capture, or a driver call
        fails (:class:`CudaDriverError`).  Nothing was enqueued,
        and a capture is as it was.
    BackendUnavailableError
        If there is no CUDA driver and the simulator is not selected.
    """
    if blocking is not True:
        # In argument order, as enqueue checks: the stream, fn, user_data, then the
        # keywords (a Python callable takes no user_data, whatever blocking is).
        # The stream's handle, read once: the signal goes on the stream this answer
        # named (a __cuda_stream__ asked again may name another, or count its calls).
        _, handle = check_target(stream)
        kind, _, callable_ = classify_function(fn)
        if kind == "python" and user_data is not None:
            raise user_data_with_callable(fn)
        if kind != "python" and user_data is not None:
            # Compiled code's user_data, checked as a launch checks it (and dropped): a
            # wrong one given is reported before a wrong blocking=, as errors.md
            # promises.  None, given or not, leaves the error to blocking=, the mistake.
            layout, reads = compiled_layout(fn) if kind == "compiled" else (None, False)
            resolve_user_data(user_data, layout, fn, reads)
        if executor is not None:
            # The keywords in signature order: executor= before blocking= (a wrong
            # executor was reported as a blocking= error, or not at all).
            check_executor(executor)
        if blocking is not False:
            raise TypeError(f"host_launch(blocking=...) expected True or False, got {blocking!r}")
        if kind != "python":
            raise ValueError(
                "host_launch(blocking=False) is for Python callables; "
                f"{getattr(fn, '__qualname__', type(fn).__name__)!r} is compiled code, which "
                "never takes the GIL and needs no such option: leave blocking=True"
            )
        launch_nonblocking(stream, callable_, executor, handle)
        return None
    return enqueue(stream, fn, user_data, None, executor=executor)


@keeps_nothing_on_refusal
def host_launch_answered(
    answer: Any,
    stream: Any,
    fn: Any,
    *,
    user_data: Any = None,
    executor: Any = None,
    blocking: bool = True,
) -> Any:
    """:func:`host_launch_python` for a call the native host_launch hands over after
    asking the stream's ``__cuda_stream__`` (a registered stream type's), which gave
    ``answer``: launched with that answer, the protocol not asked again (a
    protocol asked twice may count its calls, or name another stream the second
    time).  The native path takes only ``blocking=True``, so ``blocking`` is True."""
    checked = check_target(stream, "host_launch", answer)
    return enqueue(stream, fn, user_data, None, executor=executor, checked=checked)


def _configure_native(backend: Any) -> None:
    """Point the native host_launch at ``backend`` (when the backend is made)."""
    _core.configure_launch(
        raise_status=raise_refused,
        route=backend.route,
        executor_route=backend.executor_route,
        sim_stream_type=backend.stream_type if backend.name == "simulator" else None,
        cuda_stream_type=backend.stream_type if backend.name == "cuda" else None,
        cuhostfn_type=CUhostFn,
        pointer_type=CFuncPtr,
        cdecl_flags=FUNCFLAG_CDECL,
        byref_type=ByRef,
        c_void_p=ctypes.c_void_p,
        prototype=POINTER_PROTOTYPE,
    )


def launch_counts() -> dict[str, int]:
    """Launches that fell through to Python, and native launches by kind (for tests)."""
    return _core.launch_counts()


@contextlib.contextmanager
def python_path() -> Iterator[None]:
    """Within it, every ``host_launch`` takes the Python implementation (for tests)."""
    _core.configure_launch(wanted=False)
    try:
        yield
    finally:
        _core.configure_launch(wanted=True)


_core.configure_launch(fallback=host_launch_python, answered=host_launch_answered)
on_backend(_configure_native)
host_launch = _core.make_host_launch(
    "host_launch(stream, fn, *, user_data=None, executor=None, blocking=True)\n--\n\n"
    + inspect.getdoc(host_launch_python)
)
