"""host_launch's fast path: the native builtin that is ``numba_hostfn.host_launch``.

The builtin (``native/host_launch.ll``) handles the common launches in native
code: a known stream type, a HostFunction, ctypes ``CUhostFn``, numba cfunc or
Python callable, user data ``None``, an int, ``by_ref(...)``, ``bytes`` or
``bytearray``, and ``executor=`` once the executor has a lane for the stream.
Every other call goes, unchanged, to the Python implementation
(``_launch.host_launch``): graphs and capturing streams, ``blocking=False``,
numpy user data, a type seen for the first time, and every error, which only
the Python path raises.  So both paths mean the same: the builtin does nothing
the Python path would not, and says nothing of its own.

The builtin knows only what this module has told it, in four identity tables
(``Fast.TABLES``): the stream types, function types, code objects and numba
cfuncs that the Python path has accepted.  ``_launch`` teaches it as it
classifies (``learn_*``), so the first launch of a kind falls through and the
next is fast.  Each entry holds its key weakly: a weak reference whose
callback clears the entry when the key dies, before its address can be reused.
A table that is full forgets its oldest entry.
"""

from __future__ import annotations

import contextlib
import ctypes
import inspect
import sys
import threading
import types
import weakref
from collections.abc import Iterator
from typing import Any

from ._backend import get_backend
from ._decorator import HostFunction
from ._executor import HostExecutor
from ._native import OB_TYPE_OFFSET, TUPLE_ITEMS_OFFSET, Fast, native
from ._simulator import Stream as SimulatedStream
from ._userdata import ByRef

__all__ = [
    "FastPath",
    "after_fork",
    "counts",
    "fast_path",
    "learn_cfunc",
    "learn_code",
    "learn_host_function",
    "learn_stream",
    "learn_type",
    "python_path",
    "teach",
]


class _Entry(ctypes.Structure):
    _fields_ = (("key", ctypes.c_void_p), ("value", ctypes.c_int64), ("ref", ctypes.c_void_p))


class _Table:
    """One identity table in native memory.

    Written here, under a lock (a launch on another thread may learn at the same
    time), and cleared natively: each key's weak reference has the native
    ``forget`` as its callback, which clears the entry holding that reference
    when the key dies, before the key's memory can be reused, and which no
    signal handler can interrupt.  ``_known`` mirrors what the native entries
    hold, so that teaching a key the table already has costs a dict lookup: a
    key whose weak reference still gives it is still in its entry (only its
    death, or this class, clears one).
    """

    def __init__(self, address: int, forget: Any) -> None:
        self._entries = (_Entry * Fast.TABLE_ENTRIES).from_address(address)
        self._forget = forget
        self._refs: list[weakref.ref | None] = [None] * Fast.TABLE_ENTRIES
        self._addresses = [0] * Fast.TABLE_ENTRIES  # the key address each entry was given
        # key address -> (its weak reference, value, entry)
        self._known: dict[int, tuple[weakref.ref, int, int]] = {}
        # When each entry was given its key: a full table reuses its oldest entry.
        self._ages = [0] * Fast.TABLE_ENTRIES
        self._clock = 0
        self._lock = threading.RLock()

    def remember(self, key: Any, value: int) -> None:
        known = self._known.get(id(key))
        if known is not None and known[0]() is key and known[1] == value:
            return  # the common case: taught before
        with self._lock:
            address = id(key)
            known = self._known.get(address)
            if known is not None and known[0]() is key:
                slot = known[2]
                self._entries[slot].value = value
                self._known[address] = (known[0], value, slot)
                return
            slot = self._free_slot()
            self._clear(slot)
            try:
                ref = weakref.ref(key, self._forget)
            except TypeError:  # not weakly referenceable: never cached
                return
            entry = self._entries[slot]
            entry.value = value
            entry.ref = id(ref)
            entry.key = address  # last: the entry is valid from here
            self._refs[slot] = ref
            self._addresses[slot] = address
            self._clock += 1
            self._ages[slot] = self._clock
            self._known[address] = (ref, value, slot)

    def _free_slot(self) -> int:
        """An entry that holds nothing (never used, or its key died), else the oldest."""
        for slot, ref in enumerate(self._refs):
            if ref is None or ref() is None:
                return slot
        return min(range(Fast.TABLE_ENTRIES), key=self._ages.__getitem__)

    def _clear(self, slot: int) -> None:
        entry = self._entries[slot]
        entry.key = None  # first: the builtin no longer matches it
        entry.ref = None
        entry.value = 0
        address = self._addresses[slot]
        known = self._known.get(address)
        if known is not None and known[2] == slot:
            del self._known[address]
        self._refs[slot] = None
        self._addresses[slot] = 0

    def knows(self, key: Any) -> bool:
        """Whether the builtin would find ``key`` (for tests)."""
        return any(entry.key == id(key) for entry in self._entries)

    def __len__(self) -> int:
        return sum(1 for entry in self._entries if entry.key)


#: Attribute names the builtin reads, where the slot's name is not the attribute's.
_NAMES = {
    "name_cuda_stream": "__cuda_stream__",
    "name_closed": "_closed",
    "name_lanes": "_lanes",
}


def _raise_status(status: int, executor: Any) -> None:
    """Raise what the Python path raises for an enqueue function's status."""
    call = "cuLaunchHostFunc" if executor is None else "cuStreamWriteValue32"
    get_backend().refused(status, call)


def _layout_holds() -> bool:
    """Py_TYPE, and a tuple's size and items, are where the native code reads them
    (not so in a Py_TRACE_REFS build)."""
    read = ctypes.c_void_p.from_address
    if not all(read(id(x) + OB_TYPE_OFFSET).value == id(type(x)) for x in (1, (), None, _Entry)):
        return False
    pair = (_Entry, _NAMES)
    size = ctypes.c_ssize_t.from_address(id(pair) + OB_TYPE_OFFSET + 8).value
    items = [read(id(pair) + TUPLE_ITEMS_OFFSET + 8 * i).value for i in range(2)]
    return size == 2 and items == [id(_Entry), id(_NAMES)]


class FastPath:
    """The builtin, its config words, its tables and its counters."""

    def __init__(self) -> None:
        from . import _launch

        self._native = nat = native()
        self._config = (ctypes.c_uint64 * len(Fast.SLOTS)).from_address(nat.fast_config)
        self._counts = (ctypes.c_int64 * len(Fast.COUNTS)).from_address(nat.fast_counts)
        size = Fast.TABLE_ENTRIES * ctypes.sizeof(_Entry)
        self.tables = {
            name: _Table(nat.fast_tables + i * size, nat.fast_forget)
            for i, name in enumerate(Fast.TABLES)
        }
        self._objects: dict[str, Any] = {}  # what the config's PyObject* words point to
        self._configured = False
        self._ready = False  # configured, and the native code's assumptions hold
        self._wanted = True
        self._set("fallback", _launch.host_launch)
        signature = "host_launch(stream, fn, *, user_data=None, executor=None, blocking=True)"
        doc = f"{signature}\n--\n\n{inspect.getdoc(_launch.host_launch)}"
        self.builtin = nat.builtin(
            "host_launch", nat.host_launch, keywords=True, doc=doc, module="numba_hostfn"
        )

    def _set(self, slot: str, obj: Any) -> None:
        self._objects[slot] = obj
        self._config[Fast.index(Fast.SLOTS, slot)] = id(obj)

    def _word(self, slot: str, value: int) -> None:
        self._config[Fast.index(Fast.SLOTS, slot)] = value

    def configure(self, backend: Any) -> None:
        """Point the builtin at ``backend`` and switch it on (once, at the first launch)."""
        if self._configured:
            return
        self._configured = True
        native_layer = backend.native
        if native_layer is not self._native or not _layout_holds():  # pragma: no cover
            return  # another native layer (cannot happen: one per process), a Py_TRACE_REFS build
        self._set("raise_status", _raise_status)
        self._word("enqueue_fn", backend.enqueue_fn)
        self._word("executor_enqueue_fn", backend.executor_enqueue_fn)
        self._word("run_compiled", native_layer.run_compiled)
        self._word("run_python", native_layer.run_python)
        self._set("executor_type", HostExecutor)
        if backend.checks_streams:  # the simulator: its registry, handle -> weakref to Stream
            self._set("sim_streams", backend.stream_refs)
        self._set("by_ref_type", ByRef)
        self._set("c_void_p", ctypes.c_void_p)
        for slot in Fast.SLOTS:
            if slot.startswith("name_"):
                self._set(slot, sys.intern(_NAMES.get(slot, slot[len("name_") :])))
        self._ready = True
        self._switch()

    def _switch(self) -> None:
        self._word("enabled", int(self._ready and self._wanted))

    def set_wanted(self, wanted: bool) -> None:
        """Let the builtin take the fast path (True) or send every call to Python."""
        self._wanted = wanted
        self._switch()

    def disable(self) -> None:
        """Never again take the fast path in this process (a forked child)."""
        self._ready = False
        self._switch()

    def counts(self) -> dict[str, int]:
        return {name: self._counts[i] for i, name in enumerate(Fast.COUNTS)}


_fast: FastPath | None = None


_build_lock = threading.Lock()


def fast_path() -> FastPath:
    """The fast path, built (with the native layer) on first use."""
    global _fast
    if _fast is None:
        with _build_lock:
            if _fast is None:
                _fast = FastPath()
    return _fast


# ---- what the Python path teaches the builtin (no-ops until it is built) ----


def learn_stream(backend: Any, stream: Any) -> None:
    """``stream``'s type gave a usable handle: the builtin may read it from now on.

    The simulator checks every stream against its registry, so there only its
    own Stream type is learned, and the builtin checks each handle against the
    registry itself (``sim_streams``: the handle must be this very stream's).
    """
    fast = _fast
    if fast is None:
        return
    fast.configure(backend)
    cls = type(stream)
    if backend.checks_streams and cls is not SimulatedStream:
        return
    # From the type, not the instance (a property or a class attribute: read it).
    protocol = getattr(cls, "__cuda_stream__", None)
    how = Fast.STREAM_METHOD if callable(protocol) else Fast.STREAM_ATTRIBUTE
    fast.tables["stream_types"].remember(cls, how)


def learn_type(cls: type, kind: str) -> None:
    """Every instance of ``cls`` is ``kind``: "compiled" (a HostFunction type),
    "pointer" (a ctypes CUhostFn type; the builtin still checks each instance's
    restype and argtypes, which can be set per instance) or "python" (a callable
    type whose instances are not checked one by one)."""
    if _fast is not None:
        _fast.tables["function_types"].remember(cls, Fast.index(Fast.KINDS, kind))


def learn_code(fn: Any) -> None:
    """``fn``, a plain function or bound method, is not a coroutine function: its
    code object says so for every function made from it (the builtin checks the
    arguments, which depend on each function's defaults, on every call)."""
    if _fast is None:
        return
    function = getattr(fn, "__func__", fn)
    if type(function) is types.FunctionType:
        code = function.__code__
        if not code.co_kwonlyargcount:  # keyword-only defaults: Python checks those
            _fast.tables["codes"].remember(code, code.co_argcount)


def learn_host_function(fn: Any) -> None:
    """``fn`` is a HostFunction: without a dtype, its (read-only) address is all a
    launch needs, remembered per function."""
    if _fast is not None and type(fn) is HostFunction and fn.dtype is None:
        _fast.tables["host_functions"].remember(fn, fn.address)


def learn_cfunc(fn: Any, address: int) -> None:
    """``fn``, a numba cfunc, has the CUhostFn signature (fixed for its life)."""
    if _fast is not None:
        _fast.tables["instances"].remember(fn, address)


def after_fork() -> None:
    """A forked child cannot launch: every call goes to Python, which says so."""
    if _fast is not None:
        _fast.disable()


def teach(stream: Any, fn: Any) -> None:
    """Classify ``stream`` and ``fn`` as a launch would, without launching (for tests).

    Whatever the Python path accepts is learned; what it refuses is ignored
    here (the launch itself then falls through and raises).
    """
    from ._launch import _stream_handle, _target_kind, classify_function

    with contextlib.suppress(Exception):
        classify_function(fn)
    with contextlib.suppress(Exception):
        if _target_kind(stream) == "stream":
            backend = get_backend()
            handle = _stream_handle(stream)
            if backend.checks_streams:
                backend.stream_handle(stream, handle)
            learn_stream(backend, stream)


def counts() -> dict[str, int]:
    """Launches that fell through to Python, and fast launches by kind (for tests)."""
    return fast_path().counts()


@contextlib.contextmanager
def python_path() -> Iterator[None]:
    """Within it, every ``host_launch`` takes the Python implementation (for tests)."""
    fast = fast_path()
    fast.set_wanted(False)
    try:
        yield
    finally:
        fast.set_wanted(True)
