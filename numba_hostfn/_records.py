"""Launch records: what each launch owns, and its release on the main thread.

Every launch takes one *record*, a 32-byte slot in native memory that the
trampoline in ``_native`` reads on the driver's thread, and one entry in
``_owners`` that keeps the launch's Python objects (callable or HostFunction,
ctypes wrapper, copied or referenced user_data) alive.  When the host function
has run, the trampoline pushes the record on a lock-free stack and asks the
interpreter, through ``Py_AddPendingCall``, to run :meth:`LaunchRecords.drain`
on the main thread, which drops the owners.  LIFETIME.md states the invariants.
"""

from __future__ import annotations

import atexit
import ctypes
import struct
import threading
from typing import Any

from ._native import Native

__all__ = ["LaunchRecords"]

_RECORD = struct.Struct("=QQQQ")  # fn, arg, next, result
_SLOTS_PER_SLAB = 1024
_CLOSE_WAIT_MS = 2000

_libc = ctypes.CDLL(None)
_libc.calloc.restype = ctypes.c_void_p
_libc.calloc.argtypes = (ctypes.c_size_t, ctypes.c_size_t)
_PENDING_CALL = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
# Private prototypes: the function objects cached on ctypes.pythonapi are shared
# with every library, and some redeclare them (numba-cuda sets Py_DecRef's
# argtypes to py_object, which would make a decref of an address drop a
# temporary int instead).
_py_decref = ctypes.PYFUNCTYPE(None, ctypes.c_void_p)(("Py_DecRef", ctypes.pythonapi))
py_incref = ctypes.PYFUNCTYPE(None, ctypes.py_object)(("Py_IncRef", ctypes.pythonapi))


class LaunchRecords:
    """The records of launches that have not been released yet (one per process)."""

    def __init__(self, native: Native) -> None:
        self._native = native
        # Re-entrant: the interpreter runs the pending-call drain on the main
        # thread between any two bytecodes, also while this thread holds the lock.
        self._lock = threading.RLock()
        self._free: list[int] = []
        self._where: dict[int, tuple[memoryview, int]] = {}
        self._owners: dict[int, Any] = {}
        self._closed = False
        # The pending call is a ctypes callback: it runs on the main thread,
        # which already holds the GIL there.  Kept alive for the whole process.
        self._pending_call = _PENDING_CALL(self._on_pending_call)
        native.set_drain(ctypes.cast(self._pending_call, ctypes.c_void_p).value)
        # Close before any atexit handler runs: another library's handler may
        # block in a driver call with the GIL held (releasing a context, say),
        # while the driver's thread waits for the GIL in a Python trampoline.
        # threading's exit hooks run first, right after non-daemon threads end.
        try:
            threading._register_atexit(self._at_exit)
        except (AttributeError, RuntimeError):  # no such hook, or already shutting down
            pass
        atexit.register(self._at_exit)

    def _grow(self) -> None:
        # Slabs come from calloc and are never freed (invariant 6): a driver
        # thread may still write a record while the process exits.
        size = _RECORD.size * _SLOTS_PER_SLAB
        base = _libc.calloc(_SLOTS_PER_SLAB, _RECORD.size)
        if not base:
            raise MemoryError("numba_hostfn could not allocate launch records")
        view = memoryview((ctypes.c_char * size).from_address(base)).cast("B")
        for i in reversed(range(_SLOTS_PER_SLAB)):
            address = base + i * _RECORD.size
            self._where[address] = (view, i * _RECORD.size)
            self._free.append(address)

    def acquire(self, fn: int, arg: int, owner: Any) -> int:
        """Take a record for a launch of ``fn(arg)``; ``owner`` lives until release."""
        with self._lock:
            if not self._free:
                self._grow()
            record = self._free.pop()
            self._owners[record] = owner
        view, offset = self._where[record]
        _RECORD.pack_into(view, offset, fn, arg, 0, 0)
        return record

    def cancel(self, record: int) -> None:
        """Give back a record whose enqueue failed: nothing will ever run it."""
        with self._lock:
            owner = self._owners.pop(record)
            self._free.append(record)
        del owner  # dropped outside the lock: a finalizer may launch again

    def drain(self) -> int:
        """Release the owners of every launch that has run; return how many."""
        head = self._native.take_completed()
        if not head:
            return 0
        released = []
        with self._lock:
            while head:
                view, offset = self._where[head]
                _, _, following, result = _RECORD.unpack_from(view, offset)
                released.append((self._owners.pop(head), result))
                self._free.append(head)
                head = following
        count = len(released)
        for _, result in released:
            if result:  # what a Python callable returned (invariant 5)
                _py_decref(result)
        del released  # owners and their finalizers go here, on this thread
        return count

    def maybe_drain(self) -> None:
        """Drain if the native stack is non-empty (one memory read otherwise)."""
        if self._native.completed_head.value:
            self.drain()

    def pending(self) -> int:
        """How many launches hold a record (not yet run, or run and not released)."""
        return len(self._owners)

    def _on_pending_call(self, _arg: int) -> int:
        if not self._closed:
            self.drain()
        return 0

    def _at_exit(self) -> None:
        if self._closed:
            return
        # Invariant 6: close the interpreter guard so that no trampoline
        # takes the GIL from now on, wait (GIL released) for those inside,
        # then leak whatever is still pending instead of freeing it under a
        # driver thread that may yet run it.
        self._closed = True
        self._native.close(_CLOSE_WAIT_MS)
        with self._lock:
            py_incref(self._owners)
