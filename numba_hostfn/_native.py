"""The native layer: the only code of this package that runs on a driver's thread.

Its source is LLVM IR in ``native/``, one file per concern:

=====================  ===============================================================
``interpreter.ll``     the interpreter guard, the GIL on threads Python did not create
``records.ll``         launch records: layout, take, complete, drain (LIFETIME.md)
``trampolines.ll``     what the driver calls: compiled functions, Python callables
``enqueue.ll``         the enqueue every launch goes through, and the CUDA enqueue function
``host_launch.ll``     ``host_launch`` itself: its common cases native, the rest to Python
``simulator.ll``       simulated streams, their host-function thread, graph keepers
``executor.ll``        the HostExecutor: lanes of stream memory operations, its pool
``notify.ll``          signals to Python through an eventfd: awaitables, non-blocking callbacks
=====================  ===============================================================

This module compiles them once per process with numba's own JIT (the engine
that compiles ``@host_callback`` bodies), so the package needs no C compiler
at install time.  It prepends a *prelude*: the status words shared with
Python, and the declarations of the C library and CPython functions the IR
calls, each bound by name to its address in this process.
"""

from __future__ import annotations

import builtins
import ctypes
import ctypes.util
import platform
import sysconfig
import threading
from pathlib import Path
from typing import Any

import llvmlite.binding as llvm

from ._compat import PYTHON_ALIASES

__all__ = ["Fast", "Native", "Status", "calloc", "native"]

_PARTS = (
    "interpreter",
    "records",
    "trampolines",
    "enqueue",
    "host_launch",
    "simulator",
    "executor",
    "notify",
)


class Status:
    """Status words of the enqueue functions (a CUresult, if any, in the low 32 bits)."""

    CAPTURE_CHECK_FAILED = 1 << 32  #: cuStreamIsCapturing failed with the low bits
    CAPTURING = 1 << 33  #: the stream is capturing: nothing was enqueued
    QUEUE_STOPPED = 1 << 34  #: the simulated stream is closed: nothing was enqueued
    NO_RECORD = 1 << 35  #: no free launch record: nothing was taken or enqueued
    OUT_OF_MEMORY = 1 << 36  #: no memory for a queue entry or a task
    KEPT = 1 << 37  #: enqueued after all (a later step failed): the record will run


class Fast:
    """The layout of host_launch's fast path (``native/host_launch.ll``), in one place.

    The prelude turns each name into an ``@nhf.fast.<group>.<name>`` constant
    and the sizes into the IR's types; ``_fastpath.py`` indexes the same words
    through :meth:`index`.
    """

    #: The config words: a flag, addresses, and PyObject* (kept alive by _fastpath).
    SLOTS = (
        "enabled",
        "fallback",
        "raise_status",
        "enqueue_fn",
        "executor_enqueue_fn",
        "run_compiled",
        "run_python",
        "executor_type",
        "sim_streams",
        "by_ref_type",
        "c_void_p",
        "name_user_data",
        "name_executor",
        "name_blocking",
        "name_cuda_stream",
        "name_address",
        "name_dtype",
        "name_itemsize",
        "name_nbytes",
        "name_restype",
        "name_argtypes",
        "name_closed",
        "name_lanes",
    )
    #: Identity tables, key -> value: a stream type -> how it gives its handle
    #: (STREAM_METHOD, STREAM_ATTRIBUTE), a function type -> a kind, a code
    #: object -> its co_argcount, a HostFunction without a dtype -> its
    #: address, a numba cfunc -> its address.
    TABLES = ("stream_types", "function_types", "codes", "host_functions", "instances")
    STREAM_METHOD, STREAM_ATTRIBUTE = 1, 2  #: __cuda_stream__() or __cuda_stream__
    TABLE_ENTRIES = 32
    #: What a function is (0: not known here, fall through).
    KINDS = ("compiled", "pointer", "python")
    #: Counters, read by tests: launches that fell through, and fast launches by kind.
    COUNTS = ("fell_through", "compiled", "pointer", "python", "executor")

    @classmethod
    def index(cls, group: tuple[str, ...], name: str) -> int:
        """The word of ``name`` in ``group`` (kinds count from 1)."""
        return group.index(name) + (group is cls.KINDS)

    @classmethod
    def prelude(cls) -> list[str]:
        lines = [
            f"%nhf.fast.config_words = type [{len(cls.SLOTS)} x i64]",
            "%nhf.fast.entry = type { ptr, i64, ptr }  ; key (an address), value, its weakref",
            f"%nhf.fast.table_set = type [{len(cls.TABLES)} x [{cls.TABLE_ENTRIES} x "
            "%nhf.fast.entry]]",
            f"%nhf.fast.count_words = type [{len(cls.COUNTS)} x i64]",
            f"@nhf.fast.table_entries = internal constant i64 {cls.TABLE_ENTRIES}",
            f"@nhf.fast.table_count = internal constant i64 {len(cls.TABLES)}",
            f"@nhf.fast.ob_type_offset = internal constant i64 {OB_TYPE_OFFSET}",
            f"@nhf.fast.tuple_items_offset = internal constant i64 {TUPLE_ITEMS_OFFSET}",
            f"@nhf.fast.stream_method = internal constant i64 {cls.STREAM_METHOD}",
        ]
        for prefix, group in (
            ("slot", cls.SLOTS),
            ("table", cls.TABLES),
            ("kind", cls.KINDS),
            ("count", cls.COUNTS),
        ):
            for name in group:
                value = cls.index(group, name)
                lines.append(f"@nhf.fast.{prefix}.{name} = internal constant i64 {value}")
        return lines


#: Where PyObject's ob_type is (Py_TYPE): after ob_refcnt, in every build with the GIL.
OB_TYPE_OFFSET = ctypes.sizeof(ctypes.c_ssize_t)
#: Where a tuple's items start (PyTuple_GET_ITEM): its basic size, as for every
#: variable-size type (3.14 put a cached hash before them).
TUPLE_ITEMS_OFFSET = tuple.__basicsize__

# name -> LLVM declaration; each is bound to this process's address.
_LIBC = {
    "malloc": "declare ptr @malloc(i64)",
    "calloc": "declare ptr @calloc(i64, i64)",
    "aligned_alloc": "declare ptr @aligned_alloc(i64, i64)",
    "free": "declare void @free(ptr)",
    "usleep": "declare i32 @usleep(i32)",
    "nanosleep": "declare i32 @nanosleep(ptr, ptr)",
    "clock_gettime": "declare i32 @clock_gettime(i32, ptr)",
    "memcpy": "declare ptr @memcpy(ptr, ptr, i64)",
    "write": "declare i64 @write(i32, ptr, i64)",
    "close": "declare i32 @close(i32)",
    "prctl": "declare i32 @prctl(i32, ...)",
    "pthread_mutex_init": "declare i32 @pthread_mutex_init(ptr, ptr)",
    "pthread_mutex_lock": "declare i32 @pthread_mutex_lock(ptr)",
    "pthread_mutex_unlock": "declare i32 @pthread_mutex_unlock(ptr)",
    "pthread_cond_init": "declare i32 @pthread_cond_init(ptr, ptr)",
    "pthread_cond_wait": "declare i32 @pthread_cond_wait(ptr, ptr)",
    "pthread_cond_signal": "declare i32 @pthread_cond_signal(ptr)",
    "pthread_cond_broadcast": "declare i32 @pthread_cond_broadcast(ptr)",
    "pthread_create": "declare i32 @pthread_create(ptr, ptr, ptr, ptr)",
    "pthread_join": "declare i32 @pthread_join(i64, ptr)",
    "pthread_detach": "declare i32 @pthread_detach(i64)",
}
_PYTHON = {
    "PyGILState_Ensure": "declare i32 @PyGILState_Ensure()",
    "PyGILState_Release": "declare void @PyGILState_Release(i32)",
    "PyGILState_GetThisThreadState": "declare ptr @PyGILState_GetThisThreadState()",
    "PyThreadState_GetUnchecked": "declare ptr @PyThreadState_GetUnchecked()",
    "PyEval_SaveThread": "declare ptr @PyEval_SaveThread()",
    "PyEval_RestoreThread": "declare void @PyEval_RestoreThread(ptr)",
    "PyObject_CallNoArgs": "declare ptr @PyObject_CallNoArgs(ptr)",
    "PyErr_WriteUnraisable": "declare void @PyErr_WriteUnraisable(ptr)",
    "PyErr_SetString": "declare void @PyErr_SetString(ptr, ptr)",
    "PyErr_Occurred": "declare ptr @PyErr_Occurred()",
    "PyErr_ExceptionMatches": "declare i32 @PyErr_ExceptionMatches(ptr)",
    "PyErr_Clear": "declare void @PyErr_Clear()",
    "PyErr_SetInterrupt": "declare void @PyErr_SetInterrupt()",
    "Py_AddPendingCall": "declare i32 @Py_AddPendingCall(ptr, ptr)",
    "Py_IncRef": "declare void @Py_IncRef(ptr)",
    "Py_DecRef": "declare void @Py_DecRef(ptr)",
    "PyLong_AsUnsignedLongLongMask": "declare i64 @PyLong_AsUnsignedLongLongMask(ptr)",
    "PyLong_FromUnsignedLongLong": "declare ptr @PyLong_FromUnsignedLongLong(i64)",
    "PyLong_AsUnsignedLongLong": "declare i64 @PyLong_AsUnsignedLongLong(ptr)",
    "PyObject_GetAttr": "declare ptr @PyObject_GetAttr(ptr, ptr)",
    "PyCallable_Check": "declare i32 @PyCallable_Check(ptr)",
    "PyObject_Call": "declare ptr @PyObject_Call(ptr, ptr, ptr)",
    "PyObject_VectorcallMethod": "declare ptr @PyObject_VectorcallMethod(ptr, ptr, i64, ptr)",
    "PyObject_CallFunctionObjArgs": "declare ptr @PyObject_CallFunctionObjArgs(ptr, ...)",
    "PyObject_GetBuffer": "declare i32 @PyObject_GetBuffer(ptr, ptr, i32)",
    "PyBuffer_Release": "declare void @PyBuffer_Release(ptr)",
    "PyTuple_New": "declare ptr @PyTuple_New(i64)",
    "PyTuple_Pack": "declare ptr @PyTuple_Pack(i64, ...)",
    "PyTuple_Size": "declare i64 @PyTuple_Size(ptr)",
    "PyTuple_GetItem": "declare ptr @PyTuple_GetItem(ptr, i64)",
    "PyTuple_SetItem": "declare i32 @PyTuple_SetItem(ptr, i64, ptr)",
    "PyDict_New": "declare ptr @PyDict_New()",
    "PyDict_SetItem": "declare i32 @PyDict_SetItem(ptr, ptr, ptr)",
    "PyDict_GetItemWithError": "declare ptr @PyDict_GetItemWithError(ptr, ptr)",
    "PyFunction_GetCode": "declare ptr @PyFunction_GetCode(ptr)",
    "PyFunction_GetDefaults": "declare ptr @PyFunction_GetDefaults(ptr)",
    "PyMethod_Function": "declare ptr @PyMethod_Function(ptr)",
    "PyBytes_Size": "declare i64 @PyBytes_Size(ptr)",
    "PyBytes_AsString": "declare ptr @PyBytes_AsString(ptr)",
    "PyByteArray_Size": "declare i64 @PyByteArray_Size(ptr)",
    "PyByteArray_AsString": "declare ptr @PyByteArray_AsString(ptr)",
    "PyByteArray_FromStringAndSize": "declare ptr @PyByteArray_FromStringAndSize(ptr, i64)",
    # Exception types, as numba declares them: the symbol is the type object itself
    # (bound to id(type) in _bind_symbols, as numba binds every PyExc_* name when its
    # CPU target starts), not CPython's PyObject* variable of that name.
    "PyExc_TypeError": "@PyExc_TypeError = external global i8",
    "PyExc_Exception": "@PyExc_Exception = external global i8",
    "PyExc_KeyboardInterrupt": "@PyExc_KeyboardInterrupt = external global i8",
    "_Py_NoneStruct": "@_Py_NoneStruct = external global i8",
    "_Py_TrueStruct": "@_Py_TrueStruct = external global i8",
    "_Py_FalseStruct": "@_Py_FalseStruct = external global i8",
    "PyLong_Type": "@PyLong_Type = external global i8",
    "PyTuple_Type": "@PyTuple_Type = external global i8",
    "PyDict_Type": "@PyDict_Type = external global i8",
    "PyBytes_Type": "@PyBytes_Type = external global i8",
    "PyByteArray_Type": "@PyByteArray_Type = external global i8",
    "PyFunction_Type": "@PyFunction_Type = external global i8",
    "PyMethod_Type": "@PyMethod_Type = external global i8",
}
# Public from 3.13 as PyThreadState_GetUnchecked; the same function was private before.
_GILSTATE_LOCKED, _GILSTATE_UNLOCKED = 0, 1  # PyGILState_STATE
# A spin-wait hint for the CPU, by architecture (nothing elsewhere): an LLVM
# intrinsic, since numba's JIT parses no inline assembly.
_PAUSE = ("declare void @llvm.x86.sse2.pause()", "call void @llvm.x86.sse2.pause()")
_YIELD = ("declare void @llvm.aarch64.hint(i32)", "call void @llvm.aarch64.hint(i32 1)")
_CPU_RELAX = {"x86_64": _PAUSE, "amd64": _PAUSE, "aarch64": _YIELD, "arm64": _YIELD}
_METH_FASTCALL = 0x0080
_METH_KEYWORDS = 0x0002
_METH_O = 0x0008


class _MethodDef(ctypes.Structure):
    _fields_ = (
        ("ml_name", ctypes.c_char_p),
        ("ml_meth", ctypes.c_void_p),
        ("ml_flags", ctypes.c_int),
        ("ml_doc", ctypes.c_char_p),
    )


_u64 = ctypes.c_uint64
_i64 = ctypes.c_int64
_vp = ctypes.c_void_p
#: libc's calloc, for memory that native code owns (record slabs).
calloc = ctypes.CFUNCTYPE(_vp, ctypes.c_size_t, ctypes.c_size_t)(("calloc", ctypes.CDLL(None)))
_incref = ctypes.PYFUNCTYPE(None, ctypes.py_object)(("Py_IncRef", ctypes.pythonapi))


def _address_in(libraries: list, names: tuple[str, ...]) -> int:
    for name in names:
        for library in libraries:
            try:
                return ctypes.cast(getattr(library, name), _vp).value
            except AttributeError:
                continue
    raise RuntimeError(
        f"numba_hostfn needs {names[0]!r}, which this process does not export; "
        "numba_hostfn supports CPython 3.10+ on Linux with glibc or musl"
    )


def _libc() -> list:
    libraries = [ctypes.CDLL(None)]
    for extra in ("pthread", "c"):
        found = ctypes.util.find_library(extra)
        if found:
            libraries.append(ctypes.CDLL(found))
    return libraries


def _prelude() -> str:
    """Status words, named constants and external declarations, as LLVM IR."""
    lines = ["; the prelude, generated by numba_hostfn/_native.py"]
    for name, value in vars(Status).items():
        if name.isupper():
            lines.append(f"@nhf.status.{name.lower()} = internal constant i64 {value}")
    lines.append(f"@nhf.gilstate.locked = internal constant i32 {_GILSTATE_LOCKED}")
    lines.append(f"@nhf.gilstate.unlocked = internal constant i32 {_GILSTATE_UNLOCKED}")
    declaration, call = _CPU_RELAX.get(platform.machine().lower(), ("", ""))
    lines.append(declaration)
    lines.append(f"define internal void @nhf.cpu_relax() {{\n  {call}\n  ret void\n}}")
    lines.extend(Fast.prelude())
    lines.extend(_LIBC.values())
    lines.extend(_PYTHON.values())
    # CPython's Py_buffer (public, stable layout): buf, obj, len, itemsize,
    # readonly, ndim, format, shape, strides, suboffsets, internal.
    lines.append("%nhf.py_buffer = type { ptr, ptr, i64, i64, i32, i32, ptr, ptr, ptr, ptr, ptr }")
    return "\n".join(lines) + "\n"


def _bind_symbols() -> None:
    """Give the JIT the address of every external the IR declares."""
    libc = _libc()
    for name in _LIBC:
        llvm.add_symbol(name, _address_in(libc, (name,)))
    python = [ctypes.pythonapi]
    for name in _PYTHON:
        if name.startswith("PyExc_"):
            # The symbol table is the process's: numba binds these names to the type
            # objects, whichever of us binds first; binding the same keeps both right.
            llvm.add_symbol(name, id(getattr(builtins, name[len("PyExc_") :])))
            continue
        names = (name, *PYTHON_ALIASES.get(name, ()))
        llvm.add_symbol(name, _address_in(python, names))


def source() -> str:
    """The whole native layer as one LLVM module: the prelude, then every part."""
    folder = Path(__file__).with_name("native")
    parts = [_prelude()]
    for part in _PARTS:
        parts.append(f"; ---- native/{part}.ll ----\n" + (folder / f"{part}.ll").read_text())
    return "\n".join(parts)


class Native:
    """The compiled native layer: its trampolines' addresses and its Python entry points."""

    def __init__(self) -> None:
        if sysconfig.get_config_var("Py_GIL_DISABLED"):
            raise RuntimeError(
                "numba_hostfn needs a CPython build with the GIL (the GIL guards its "
                "launch records); this is a free-threaded build"
            )
        from ._compat import cpu_target, global_compiler_lock

        _bind_symbols()
        codegen = cpu_target.target_context.codegen()
        library = codegen.create_library("numba_hostfn_native")
        library.add_llvm_module(llvm.parse_assembly(source()))
        with global_compiler_lock:
            library.finalize()
        # Invariant 6 (LIFETIME.md): the machine code must outlive the
        # interpreter, because a driver thread may still be inside it while
        # the process exits.  Take one reference that is never given back.
        _incref(library)
        self._library = library

        def fn(name: str) -> int:
            address = library.get_pointer_to_function(name)
            if not address:  # llvmlite answers 0, not an error, for a missing symbol
                raise RuntimeError(f"numba_hostfn's native layer has no function {name!r}")
            return address

        def c(restype: Any, *argtypes: Any) -> Any:
            """A ctypes foreign call: it drops the GIL for its duration."""
            return ctypes.CFUNCTYPE(restype, *argtypes)

        def py(restype: Any, *argtypes: Any) -> Any:
            """A ctypes call that keeps the GIL: for the nhf_py_* functions."""
            return ctypes.PYFUNCTYPE(restype, *argtypes)

        # Trampolines: addresses handed to the driver.
        self.run_compiled = fn("nhf_run_compiled")
        self.run_python = fn("nhf_run_python")
        self.replay_python = fn("nhf_replay_python")
        self.user_object_release = fn("nhf_user_object_release")

        # Records (records.ll), with the GIL held throughout.
        self.record_bytes = c(_u64)(fn("nhf_record_bytes"))()
        self.add_slab = py(None, _vp, _u64)(fn("nhf_py_add_slab"))
        self.take = py(_vp, _vp, _vp, ctypes.py_object)(fn("nhf_py_take"))
        self.release = py(None, _vp)(fn("nhf_py_release"))
        self.drain = py(_i64)(fn("nhf_py_drain"))
        #: Records taken and not released, read under the GIL.
        self.held = _i64.from_address(c(_u64)(fn("nhf_held_addr"))())
        #: How many times Py_AddPendingCall refused a drain (each retried later).
        self.schedule_failures = _i64.from_address(c(_u64)(fn("nhf_schedule_failures_addr"))())
        self.close = c(_i64, _i64)(fn("nhf_close"))

        # The enqueue builtin (enqueue.ll) drops the GIL only around the
        # enqueue function; the CUDA backend sets the driver entry points.
        self.enqueue = self.builtin("enqueue", fn("nhf_py_enqueue"))
        # host_launch's fast path (host_launch.ll), wrapped by _fastpath.py.
        self.host_launch = fn("nhf_py_host_launch")
        self.fast_forget = self.builtin("forget", fn("nhf_py_fast_forget"), one_argument=True)
        self.fast_config = c(_u64)(fn("nhf_fast_config_addr"))()
        self.fast_tables = c(_u64)(fn("nhf_fast_tables_addr"))()
        self.fast_counts = c(_u64)(fn("nhf_fast_counts_addr"))()
        self.cuda_enqueue = fn("nhf_cuda_enqueue")
        self.set_cuda = c(None, _vp, _vp)(fn("nhf_set_cuda"))

        # The simulator (simulator.ll): ctypes foreign calls, without the GIL.
        self.sim_enqueue = fn("nhf_sim_enqueue")
        self.sim_enqueue_device = fn("nhf_sim_enqueue_device")
        self.sim_delay = fn("nhf_sim_delay")
        self.sim_keeper_release = fn("nhf_sim_keeper_release")
        self.sim_enqueue_call = c(_u64, _vp, _vp, _vp)(self.sim_enqueue)
        self.sim_enqueue_device_call = c(_u64, _vp, _vp, _vp)(self.sim_enqueue_device)
        self.sim_context_start = c(_i64)(fn("nhf_sim_context_start"))
        self.sim_stream_new = c(_vp)(fn("nhf_sim_stream_new"))
        self.sim_set_capturing = c(None, _vp, ctypes.c_int32)(fn("nhf_sim_set_capturing"))
        self.sim_sync = c(None, _vp)(fn("nhf_sim_sync"))
        self.sim_pending = c(_i64, _vp)(fn("nhf_sim_pending"))
        self.sim_stop = c(None, _vp)(fn("nhf_sim_stop"))
        self.sim_finish = c(None, _vp, _i64)(fn("nhf_sim_finish"))
        self.sim_keeper_new = c(_vp)(fn("nhf_sim_keeper_new"))
        self.sim_keeper_own = py(None, _vp, _vp)(fn("nhf_py_sim_keeper_own"))
        self.sim_keeper_disown = py(None, _vp, _vp)(fn("nhf_py_sim_keeper_disown"))
        self.sim_keeper_acquire = c(None, _vp)(fn("nhf_sim_keeper_acquire"))
        self.sim_keeper_release_call = c(None, _vp)(self.sim_keeper_release)

        # The HostExecutor (executor.ll).
        self.exec_copy = fn("nhf_exec_copy")
        self.exec_cuda_enqueue = fn("nhf_exec_cuda_enqueue")
        self.exec_sim_enqueue = fn("nhf_exec_sim_enqueue")
        self.set_cuda_memops = c(None, _vp, _vp, _vp)(fn("nhf_set_cuda_memops"))
        self.exec_pool_new = c(_vp, _i64, _i64, _i64)(fn("nhf_exec_pool_new"))
        self.exec_lane_new = c(_vp, _vp, _vp, _vp)(fn("nhf_exec_lane_new"))
        self.exec_outstanding = c(_i64, _vp)(fn("nhf_exec_outstanding"))
        self.exec_pool_close = c(None, _vp)(fn("nhf_exec_pool_close"))
        # Graph slots: an executor's nodes in graphs (three per node).
        self.exec_sim_set = fn("nhf_exec_sim_set")
        self.exec_sim_await = fn("nhf_exec_sim_await")
        self.exec_slot_new = c(_vp, _vp, _vp)(fn("nhf_exec_slot_new"))
        self.exec_slot_op = c(_vp, _vp, ctypes.c_int32)(fn("nhf_exec_slot_op"))
        self.exec_slot_arm = c(None, _vp, _vp, _vp, ctypes.c_int32)(fn("nhf_exec_slot_arm"))
        self.exec_slot_disarm = c(None, _vp)(fn("nhf_exec_slot_disarm"))
        self.exec_live_slots = c(_i64, _vp)(fn("nhf_exec_live_slots"))

        # Signals to Python (notify.ll): the CUhostFn, and the reader's calls.
        self.signal = fn("nhf_signal")
        self.channel_new = c(_vp, ctypes.c_int32, ctypes.c_int32)(fn("nhf_channel_new"))
        self.channel_release = c(None, _vp)(fn("nhf_channel_release"))
        self.channel_take = c(_i64, _vp, _vp, _i64)(fn("nhf_channel_take"))
        # The enqueue builtin for signals: it makes the signal, and frees it if refused.
        self.enqueue_signal = self.builtin("enqueue_signal", fn("nhf_py_enqueue_signal"))
        self.set_notify_callable = py(None, ctypes.py_object)(fn("nhf_py_set_notify_callable"))
        self.call_reporting = py(None, ctypes.py_object)(fn("nhf_py_call_reporting"))
        self.set_any_thread_pending = c(None, _vp, _vp)(fn("nhf_set_any_thread_pending"))

    def builtin(
        self,
        name: str,
        address: int,
        *,
        keywords: bool = False,
        one_argument: bool = False,
        doc: str | None = None,
        module: str | None = None,
    ) -> Any:
        """A METH_FASTCALL builtin function for machine code at ``address``.

        ``keywords`` adds METH_KEYWORDS (the function also takes kwnames);
        ``one_argument`` makes it METH_O instead (``f(self, arg)``);
        ``doc`` is its ``__doc__``, which may begin with a ``name(...)\n--\n\n``
        line that becomes its ``__text_signature__``.
        """
        flags = _METH_O if one_argument else _METH_FASTCALL | (_METH_KEYWORDS if keywords else 0)
        # ctypes keeps the name and doc bytes in ``method`` (its _objects).
        method = _MethodDef(name.encode(), address, flags, None if doc is None else doc.encode())
        prototype = ctypes.PYFUNCTYPE(ctypes.py_object, _vp, _vp, ctypes.py_object)
        function = prototype(("PyCFunction_NewEx", ctypes.pythonapi))(
            ctypes.addressof(method), None, module
        )
        # The function points into ``method``: keep that for the process's life.
        _incref(method)
        return function


_native: Native | None = None
_native_lock = threading.Lock()


def native() -> Native:
    """Build the native layer once per process (the first caller builds; others wait)."""
    global _native
    if _native is None:
        with _native_lock:
            if _native is None:
                _native = Native()
    return _native
