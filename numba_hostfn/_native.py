"""The native trampolines: the only code of this package that runs on a driver's thread.

Written as LLVM IR and compiled once per process by numba's own JIT (the same
engine that compiles ``@host_callback`` bodies), so the package needs no C
compiler at install time and no ctypes callback on any hot path.  Every
function here is entered without the GIL and takes it only where the comment
says so.  LIFETIME.md beside this file states the invariants this code keeps.

A *launch record* is four 64-bit words, allocated and owned by ``_records``::

    [0] fn      CUhostFn to call (0 for a Python callable)
    [1] arg     its user_data, or the PyObject* of the Python callable
    [2] next    link in the completed stack
    [3] result  PyObject* a Python callable returned, released on the main thread

The simulator's queues live here too: a simulated stream is a FIFO of
(fn, arg) pairs drained by a native loop that a daemon thread enters once
through ctypes (which drops the GIL for the whole call).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

import llvmlite.binding as llvm

__all__ = ["Native", "native"]

# Offsets of the simulator queue (bytes); pthread objects get generous room.
_Q_MUTEX, _Q_WORK, _Q_IDLE = 0, 128, 256
_Q_HEAD, _Q_TAIL, _Q_PENDING, _Q_STOP = 384, 392, 400, 408
QUEUE_BYTES = 512

# Status words returned by the enqueue functions (CUresult in the low 32 bits).
CAPTURE_CHECK_FAILED = 1 << 32  # cuStreamIsCapturing returned the low bits
STREAM_CAPTURING = 1 << 33  # the stream is capturing: nothing was enqueued
QUEUE_STOPPED = 1 << 34  # simulated stream closed: nothing was enqueued

_IR = r"""
@nhf_completed = global i64 0
@nhf_closing = global i32 0
@nhf_inside = global i64 0
@nhf_drain_cb = global i64 0
@nhf_sched_failed = global i64 0
@nhf_cu_is_capturing = global i64 0
@nhf_cu_launch_host_func = global i64 0

; ---- the interpreter guard: count ourselves in before touching CPython ----
define internal i1 @nhf_enter() {
  %1 = atomicrmw add ptr @nhf_inside, i64 1 seq_cst
  %c = load atomic i32, ptr @nhf_closing seq_cst, align 4
  %open = icmp eq i32 %c, 0
  br i1 %open, label %yes, label %no
yes:
  ret i1 true
no:
  %2 = atomicrmw sub ptr @nhf_inside, i64 1 seq_cst
  ret i1 false
}

define internal void @nhf_leave() {
  %1 = atomicrmw sub ptr @nhf_inside, i64 1 seq_cst
  ret void
}

; ---- completion: push the record, wake the main thread once per batch ----
define internal void @nhf_complete(ptr %rec) {
entry:
  %nextp = getelementptr i64, ptr %rec, i64 2
  %self = ptrtoint ptr %rec to i64
  br label %retry
retry:
  %old = load atomic i64, ptr @nhf_completed seq_cst, align 8
  store i64 %old, ptr %nextp
  %pair = cmpxchg ptr @nhf_completed, i64 %old, i64 %self seq_cst seq_cst
  %ok = extractvalue { i64, i1 } %pair, 1
  br i1 %ok, label %pushed, label %retry
pushed:
  %first = icmp eq i64 %old, 0
  br i1 %first, label %schedule, label %done
schedule:
  %in = call i1 @nhf_enter()
  br i1 %in, label %call, label %done
call:
  %cb = load atomic i64, ptr @nhf_drain_cb seq_cst, align 8
  %cbp = inttoptr i64 %cb to ptr
  %rc = call i32 inttoptr (i64 {Py_AddPendingCall} to ptr)(ptr %cbp, ptr null)
  call void @nhf_leave()
  %failed = icmp ne i32 %rc, 0
  br i1 %failed, label %note, label %done
note:
  %3 = atomicrmw add ptr @nhf_sched_failed, i64 1 seq_cst
  br label %done
done:
  ret void
}

; ---- trampolines handed to cuLaunchHostFunc: void (*)(void *record) ----
define void @nhf_run_compiled(ptr %rec) {
  %fn = load ptr, ptr %rec
  %argp = getelementptr i64, ptr %rec, i64 1
  %arg = load ptr, ptr %argp
  call void %fn(ptr %arg)
  call void @nhf_complete(ptr %rec)
  ret void
}

define void @nhf_run_python(ptr %rec) {
entry:
  %argp = getelementptr i64, ptr %rec, i64 1
  %callable = load ptr, ptr %argp
  %in = call i1 @nhf_enter()
  br i1 %in, label %go, label %out
go:
  %gil = call i32 inttoptr (i64 {PyGILState_Ensure} to ptr)()
  %res = call ptr inttoptr (i64 {PyObject_CallNoArgs} to ptr)(ptr %callable)
  %isnull = icmp eq ptr %res, null
  br i1 %isnull, label %raised, label %returned
raised:
  call void inttoptr (i64 {PyErr_WriteUnraisable} to ptr)(ptr %callable)
  br label %release
returned:
  %resp = getelementptr i64, ptr %rec, i64 3
  store ptr %res, ptr %resp
  br label %release
release:
  call void inttoptr (i64 {PyGILState_Release} to ptr)(i32 %gil)
  call void @nhf_leave()
  br label %out
out:
  call void @nhf_complete(ptr %rec)
  ret void
}

; The destructor of a CUDA user object that owns a graph's record.
define void @nhf_graph_release(ptr %rec) {
  call void @nhf_complete(ptr %rec)
  ret void
}

; ---- called from Python (through ctypes, so without the GIL) ----
define i64 @nhf_take_completed() {
  %old = atomicrmw xchg ptr @nhf_completed, i64 0 seq_cst
  ret i64 %old
}

define i64 @nhf_completed_addr() {
  ret i64 ptrtoint (ptr @nhf_completed to i64)
}

define i64 @nhf_sched_failed_addr() {
  ret i64 ptrtoint (ptr @nhf_sched_failed to i64)
}

define void @nhf_set_cuda(i64 %is_capturing, i64 %launch_host_func) {
  store atomic i64 %is_capturing, ptr @nhf_cu_is_capturing seq_cst, align 8
  store atomic i64 %launch_host_func, ptr @nhf_cu_launch_host_func seq_cst, align 8
  ret void
}

define void @nhf_set_drain(i64 %cb) {
  store atomic i64 %cb, ptr @nhf_drain_cb seq_cst, align 8
  ret void
}

; Close the interpreter guard, then wait (at most %ms milliseconds) for the
; trampolines already inside CPython to leave.  Returns how many are left.
define i64 @nhf_close(i64 %ms) {
entry:
  store atomic i32 1, ptr @nhf_closing seq_cst, align 4
  br label %check
check:
  %i = phi i64 [ 0, %entry ], [ %next, %wait ]
  %n = load atomic i64, ptr @nhf_inside seq_cst, align 8
  %zero = icmp eq i64 %n, 0
  br i1 %zero, label %done, label %more
more:
  %late = icmp sge i64 %i, %ms
  br i1 %late, label %done, label %wait
wait:
  %r = call i32 inttoptr (i64 {usleep} to ptr)(i32 1000)
  %next = add i64 %i, 1
  br label %check
done:
  ret i64 %n
}

; Enqueue on a real CUDA stream: refuse a capturing stream, else cuLaunchHostFunc.
define i64 @nhf_cuda_launch(ptr %stream, ptr %fn, ptr %arg) {
entry:
  %st = alloca i32, align 4
  store i32 0, ptr %st
  %isc = load atomic i64, ptr @nhf_cu_is_capturing seq_cst, align 8
  %iscp = inttoptr i64 %isc to ptr
  %r0 = call i32 %iscp(ptr %stream, ptr %st)
  %bad = icmp ne i32 %r0, 0
  br i1 %bad, label %checkfail, label %checked
checkfail:
  %r0w = zext i32 %r0 to i64
  %r0f = or i64 %r0w, {CAPTURE_CHECK_FAILED}
  ret i64 %r0f
checked:
  %s = load i32, ptr %st
  %cap = icmp ne i32 %s, 0
  br i1 %cap, label %capturing, label %launch
capturing:
  ret i64 {STREAM_CAPTURING}
launch:
  %lhf = load atomic i64, ptr @nhf_cu_launch_host_func seq_cst, align 8
  %lhfp = inttoptr i64 %lhf to ptr
  %r1 = call i32 %lhfp(ptr %stream, ptr %fn, ptr %arg)
  %r1w = zext i32 %r1 to i64
  ret i64 %r1w
}

; ---- the simulator: one FIFO queue and one native worker loop per stream ----
define i64 @nhf_sim_launch(ptr %q, ptr %fn, ptr %arg) {
entry:
  %node = call ptr inttoptr (i64 {malloc} to ptr)(i64 24)
  %oom = icmp eq ptr %node, null
  br i1 %oom, label %nomem, label %fill
nomem:
  ret i64 2
fill:
  store ptr null, ptr %node
  %fnp = getelementptr i64, ptr %node, i64 1
  store ptr %fn, ptr %fnp
  %argp = getelementptr i64, ptr %node, i64 2
  store ptr %arg, ptr %argp
  %mutex = getelementptr i8, ptr %q, i64 {Q_MUTEX}
  %work = getelementptr i8, ptr %q, i64 {Q_WORK}
  %headp = getelementptr i8, ptr %q, i64 {Q_HEAD}
  %tailp = getelementptr i8, ptr %q, i64 {Q_TAIL}
  %pendp = getelementptr i8, ptr %q, i64 {Q_PENDING}
  %stopp = getelementptr i8, ptr %q, i64 {Q_STOP}
  %l = call i32 inttoptr (i64 {pthread_mutex_lock} to ptr)(ptr %mutex)
  %stop = load i64, ptr %stopp
  %stopped = icmp ne i64 %stop, 0
  br i1 %stopped, label %refuse, label %append
refuse:
  %u0 = call i32 inttoptr (i64 {pthread_mutex_unlock} to ptr)(ptr %mutex)
  call void inttoptr (i64 {free} to ptr)(ptr %node)
  ret i64 {QUEUE_STOPPED}
append:
  %tail = load ptr, ptr %tailp
  %empty = icmp eq ptr %tail, null
  br i1 %empty, label %sethead, label %link
sethead:
  store ptr %node, ptr %headp
  br label %settail
link:
  store ptr %node, ptr %tail
  br label %settail
settail:
  store ptr %node, ptr %tailp
  %p = load i64, ptr %pendp
  %p1 = add i64 %p, 1
  store i64 %p1, ptr %pendp
  %s = call i32 inttoptr (i64 {pthread_cond_signal} to ptr)(ptr %work)
  %u = call i32 inttoptr (i64 {pthread_mutex_unlock} to ptr)(ptr %mutex)
  ret i64 0
}

define void @nhf_sim_worker(ptr %q) {
entry:
  %mutex = getelementptr i8, ptr %q, i64 {Q_MUTEX}
  %work = getelementptr i8, ptr %q, i64 {Q_WORK}
  %idle = getelementptr i8, ptr %q, i64 {Q_IDLE}
  %headp = getelementptr i8, ptr %q, i64 {Q_HEAD}
  %tailp = getelementptr i8, ptr %q, i64 {Q_TAIL}
  %pendp = getelementptr i8, ptr %q, i64 {Q_PENDING}
  %stopp = getelementptr i8, ptr %q, i64 {Q_STOP}
  %l = call i32 inttoptr (i64 {pthread_mutex_lock} to ptr)(ptr %mutex)
  br label %look
look:
  %head = load ptr, ptr %headp
  %none = icmp eq ptr %head, null
  br i1 %none, label %nothing, label %pop
nothing:
  %stop = load i64, ptr %stopp
  %stopped = icmp ne i64 %stop, 0
  br i1 %stopped, label %quit, label %sleep
sleep:
  %w = call i32 inttoptr (i64 {pthread_cond_wait} to ptr)(ptr %work, ptr %mutex)
  br label %look
quit:
  %u0 = call i32 inttoptr (i64 {pthread_mutex_unlock} to ptr)(ptr %mutex)
  ret void
pop:
  %next = load ptr, ptr %head
  store ptr %next, ptr %headp
  %last = icmp eq ptr %next, null
  br i1 %last, label %cleartail, label %run
cleartail:
  store ptr null, ptr %tailp
  br label %run
run:
  %u1 = call i32 inttoptr (i64 {pthread_mutex_unlock} to ptr)(ptr %mutex)
  %fnp = getelementptr i64, ptr %head, i64 1
  %fn = load ptr, ptr %fnp
  %argp = getelementptr i64, ptr %head, i64 2
  %arg = load ptr, ptr %argp
  call void %fn(ptr %arg)
  call void inttoptr (i64 {free} to ptr)(ptr %head)
  %l2 = call i32 inttoptr (i64 {pthread_mutex_lock} to ptr)(ptr %mutex)
  %p = load i64, ptr %pendp
  %p1 = sub i64 %p, 1
  store i64 %p1, ptr %pendp
  %idlenow = icmp eq i64 %p1, 0
  br i1 %idlenow, label %wake, label %look
wake:
  %b = call i32 inttoptr (i64 {pthread_cond_broadcast} to ptr)(ptr %idle)
  br label %look
}

; Wait until the queue is empty; %ms < 0 waits for ever.  Returns what is left.
define i64 @nhf_sim_sync(ptr %q) {
entry:
  %mutex = getelementptr i8, ptr %q, i64 {Q_MUTEX}
  %idle = getelementptr i8, ptr %q, i64 {Q_IDLE}
  %pendp = getelementptr i8, ptr %q, i64 {Q_PENDING}
  %l = call i32 inttoptr (i64 {pthread_mutex_lock} to ptr)(ptr %mutex)
  br label %check
check:
  %p = load i64, ptr %pendp
  %busy = icmp sgt i64 %p, 0
  br i1 %busy, label %wait, label %done
wait:
  %w = call i32 inttoptr (i64 {pthread_cond_wait} to ptr)(ptr %idle, ptr %mutex)
  br label %check
done:
  %u = call i32 inttoptr (i64 {pthread_mutex_unlock} to ptr)(ptr %mutex)
  ret i64 %p
}

define i64 @nhf_sim_pending(ptr %q) {
  %mutex = getelementptr i8, ptr %q, i64 {Q_MUTEX}
  %pendp = getelementptr i8, ptr %q, i64 {Q_PENDING}
  %l = call i32 inttoptr (i64 {pthread_mutex_lock} to ptr)(ptr %mutex)
  %p = load i64, ptr %pendp
  %u = call i32 inttoptr (i64 {pthread_mutex_unlock} to ptr)(ptr %mutex)
  ret i64 %p
}

define i64 @nhf_sim_init(ptr %q) {
  %mutex = getelementptr i8, ptr %q, i64 {Q_MUTEX}
  %work = getelementptr i8, ptr %q, i64 {Q_WORK}
  %idle = getelementptr i8, ptr %q, i64 {Q_IDLE}
  %a = call i32 inttoptr (i64 {pthread_mutex_init} to ptr)(ptr %mutex, ptr null)
  %b = call i32 inttoptr (i64 {pthread_cond_init} to ptr)(ptr %work, ptr null)
  %c = call i32 inttoptr (i64 {pthread_cond_init} to ptr)(ptr %idle, ptr null)
  %ab = or i32 %a, %b
  %abc = or i32 %ab, %c
  %r = zext i32 %abc to i64
  ret i64 %r
}

define void @nhf_sim_stop(ptr %q) {
  %mutex = getelementptr i8, ptr %q, i64 {Q_MUTEX}
  %work = getelementptr i8, ptr %q, i64 {Q_WORK}
  %stopp = getelementptr i8, ptr %q, i64 {Q_STOP}
  %l = call i32 inttoptr (i64 {pthread_mutex_lock} to ptr)(ptr %mutex)
  store i64 1, ptr %stopp
  %b = call i32 inttoptr (i64 {pthread_cond_broadcast} to ptr)(ptr %work)
  %u = call i32 inttoptr (i64 {pthread_mutex_unlock} to ptr)(ptr %mutex)
  ret void
}

; Simulated device work: sleep for (uintptr_t)arg microseconds.
define void @nhf_sim_delay(ptr %arg) {
entry:
  %us = ptrtoint ptr %arg to i64
  br label %loop
loop:
  %left = phi i64 [ %us, %entry ], [ %rest, %nap ]
  %more = icmp sgt i64 %left, 0
  br i1 %more, label %nap, label %done
nap:
  %big = icmp sgt i64 %left, 500000
  %chunk = select i1 %big, i64 500000, i64 %left
  %c32 = trunc i64 %chunk to i32
  %r = call i32 inttoptr (i64 {usleep} to ptr)(i32 %c32)
  %rest = sub i64 %left, %chunk
  br label %loop
done:
  ret void
}
"""

_LIBC_SYMBOLS = (
    "malloc",
    "free",
    "usleep",
    "pthread_mutex_init",
    "pthread_mutex_lock",
    "pthread_mutex_unlock",
    "pthread_cond_init",
    "pthread_cond_wait",
    "pthread_cond_signal",
    "pthread_cond_broadcast",
)
_PYTHON_SYMBOLS = (
    "PyGILState_Ensure",
    "PyGILState_Release",
    "PyObject_CallNoArgs",
    "PyErr_WriteUnraisable",
    "Py_AddPendingCall",
)

_u64 = ctypes.c_uint64
_vp = ctypes.c_void_p


def _address_of(library, name: str) -> int:
    return ctypes.cast(getattr(library, name), ctypes.c_void_p).value


def _libc_addresses() -> dict[str, int]:
    out = {}
    candidates = [ctypes.CDLL(None)]
    for extra in ("pthread", "c"):
        found = ctypes.util.find_library(extra)
        if found:
            candidates.append(ctypes.CDLL(found))
    for name in _LIBC_SYMBOLS:
        for lib in candidates:
            try:
                out[name] = _address_of(lib, name)
                break
            except AttributeError:
                continue
        else:
            raise RuntimeError(
                f"numba_hostfn needs the C library function {name!r}, which this "
                "process does not export; numba_hostfn supports Linux with glibc or musl"
            )
    return out


class Native:
    """The compiled native layer: addresses of its trampolines and ctypes entry points."""

    def __init__(self) -> None:
        from numba.core.compiler_lock import global_compiler_lock
        from numba.core.registry import cpu_target

        subs = _libc_addresses()
        subs.update({n: _address_of(ctypes.pythonapi, n) for n in _PYTHON_SYMBOLS})
        subs.update(
            CAPTURE_CHECK_FAILED=CAPTURE_CHECK_FAILED,
            STREAM_CAPTURING=STREAM_CAPTURING,
            QUEUE_STOPPED=QUEUE_STOPPED,
            Q_MUTEX=_Q_MUTEX,
            Q_WORK=_Q_WORK,
            Q_IDLE=_Q_IDLE,
            Q_HEAD=_Q_HEAD,
            Q_TAIL=_Q_TAIL,
            Q_PENDING=_Q_PENDING,
            Q_STOP=_Q_STOP,
        )
        text = _IR
        for key, value in subs.items():
            text = text.replace("{" + key + "}", str(value))
        codegen = cpu_target.target_context.codegen()
        library = codegen.create_library("numba_hostfn_native")
        library.add_llvm_module(llvm.parse_assembly(text))
        with global_compiler_lock:
            library.finalize()
        # Invariant 6 (LIFETIME.md): the machine code must outlive the
        # interpreter, because a driver thread may still be inside it while
        # the process exits.  Take one reference that is never given back.
        ctypes.PYFUNCTYPE(None, ctypes.py_object)(("Py_IncRef", ctypes.pythonapi))(library)
        self._library = library
        fn = library.get_pointer_to_function

        self.run_compiled = fn("nhf_run_compiled")
        self.run_python = fn("nhf_run_python")
        self.graph_release = fn("nhf_graph_release")
        self.sim_worker_addr = fn("nhf_sim_worker")
        self.sim_delay = fn("nhf_sim_delay")

        # ctypes foreign calls drop the GIL for their duration.
        self.take_completed = ctypes.CFUNCTYPE(_u64)(fn("nhf_take_completed"))
        self.set_drain = ctypes.CFUNCTYPE(None, _u64)(fn("nhf_set_drain"))
        # The driver backend fills in the CUDA entry points (raw driver
        # pointers from cuGetProcAddress) before its first enqueue.
        self.set_cuda = ctypes.CFUNCTYPE(None, _u64, _u64)(fn("nhf_set_cuda"))
        self.close = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(fn("nhf_close"))
        launch_t = ctypes.CFUNCTYPE(_u64, _vp, _vp, _vp)
        self.cuda_launch = launch_t(fn("nhf_cuda_launch"))
        self.sim_launch = launch_t(fn("nhf_sim_launch"))
        self.sim_worker = ctypes.CFUNCTYPE(None, _vp)(self.sim_worker_addr)
        self.sim_sync = ctypes.CFUNCTYPE(ctypes.c_int64, _vp)(fn("nhf_sim_sync"))
        self.sim_pending = ctypes.CFUNCTYPE(ctypes.c_int64, _vp)(fn("nhf_sim_pending"))
        self.sim_init = ctypes.CFUNCTYPE(ctypes.c_int64, _vp)(fn("nhf_sim_init"))
        self.sim_stop = ctypes.CFUNCTYPE(None, _vp)(fn("nhf_sim_stop"))

        completed = ctypes.CFUNCTYPE(_u64)(fn("nhf_completed_addr"))()
        failed = ctypes.CFUNCTYPE(_u64)(fn("nhf_sched_failed_addr"))()
        #: Read without a foreign call: nonzero when records wait to be released.
        self.completed_head = _u64.from_address(completed)
        self.schedule_failures = _u64.from_address(failed)


@functools.cache
def native() -> Native:
    """Build the native layer once per process."""
    return Native()
