"""The native trampolines: the only code of this package that runs on a driver's thread.

Written as LLVM IR and compiled once per process by numba's own JIT (the same
engine that compiles ``@host_callback`` bodies), so the package needs no C
compiler at install time and no ctypes callback on any hot path.  Every
function here is entered without the GIL and takes it only where the comment
says so.  LIFETIME.md beside this file states the invariants this code keeps.

A *launch record* is five 64-bit words in slabs that ``_records`` allocates::

    [0] fn      CUhostFn to call (0 for a Python callable)
    [1] arg     its user_data, or the PyObject* of the Python callable
    [2] next    link in the completed stack, or in the free list
    [3] result  PyObject* a Python callable returned, released on the main thread
    [4] owner   PyObject* (a strong reference) to what the launch keeps alive

Records are taken, given back and drained only by code that holds the GIL and
does not release it in between (the ``nhf_py_*`` entry points, called as
builtins or through ``ctypes.PYFUNCTYPE``): the GIL is the free list's lock.
The driver's thread only reads a record and pushes it on the lock-free
completed stack.

The simulator's queues live here too: a simulated stream is a FIFO of
(fn, arg) pairs drained by a native loop on a native thread of its own,
foreign to Python as the driver's thread is.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sysconfig
from typing import Any

import llvmlite.binding as llvm

__all__ = ["NO_RECORD", "RECORD_BYTES", "Native", "calloc", "native"]

# Offsets of the simulator queue (bytes); pthread objects get generous room.
_Q_MUTEX, _Q_WORK, _Q_IDLE = 0, 128, 256
_Q_HEAD, _Q_TAIL, _Q_PENDING, _Q_STOP, _Q_THREAD = 384, 392, 400, 408, 416
QUEUE_BYTES = 512

# Status words returned by the enqueue functions (CUresult in the low 32 bits).
CAPTURE_CHECK_FAILED = 1 << 32  # cuStreamIsCapturing returned the low bits
STREAM_CAPTURING = 1 << 33  # the stream is capturing: nothing was enqueued
QUEUE_STOPPED = 1 << 34  # simulated stream closed: nothing was enqueued
NO_RECORD = 1 << 35  # no free launch record: nothing was taken or enqueued
RECORD_BYTES = 40

_IR = r"""
@nhf_completed = global i64 0
@nhf_closing = global i32 0
@nhf_inside = global i64 0
@nhf_drain_cb = global i64 0
@nhf_sched_failed = global i64 0
@nhf_cu_is_capturing = global i64 0
@nhf_cu_launch_host_func = global i64 0
@nhf_free = global i64 0
@nhf_held = global i64 0

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
entry:
  %fn = load ptr, ptr %rec
  %argp = getelementptr i64, ptr %rec, i64 1
  %arg = load ptr, ptr %argp
  call void %fn(ptr %arg)
  call void @nhf_gil_check()
  call void @nhf_complete(ptr %rec)
  ret void
}

; A compiled body is entered without the GIL and must return without it.  Some
; of numba's error paths return from inside a GIL-taking block (a cfunc whose
; Environment was never registered: print's check returns with the GIL held);
; a host-function thread that kept the GIL would stop every Python thread for
; ever.  Undo that one PyGILState_Ensure: PyGILState_Release(UNLOCKED) drops
; the GIL, and the thread state too if the body created it (invariant 13).
; The thread holds the GIL if its own thread state is the attached one (the
; attached state is per thread from 3.12, the GIL holder's before).  Skipped
; once the interpreter guard is closed (exit): no CPython call from then on.
define internal void @nhf_gil_check() {
entry:
  %c = load atomic i32, ptr @nhf_closing seq_cst, align 4
  %open = icmp eq i32 %c, 0
  br i1 %open, label %mine, label %done
mine:
  %own = call ptr inttoptr (i64 {PyGILState_GetThisThreadState} to ptr)()
  %none = icmp eq ptr %own, null
  br i1 %none, label %done, label %attached
attached:
  %cur = call ptr inttoptr (i64 {PyThreadState_GetUnchecked} to ptr)()
  %held = icmp eq ptr %cur, %own
  br i1 %held, label %leaked, label %done
leaked:
  call void inttoptr (i64 {PyGILState_Release} to ptr)(i32 1)
  br label %done
done:
  ret void
}

define void @nhf_run_python(ptr %rec) {
entry:
  %argp = getelementptr i64, ptr %rec, i64 1
  %callable = load ptr, ptr %argp
  %in = call i1 @nhf_enter()
  br i1 %in, label %go, label %out
go:
  ; A thread that has never held the GIL gets a thread state once, kept (the
  ; GILState counter stays at one) until nhf_thread_release: otherwise each
  ; PyGILState_Ensure/Release pair would create and destroy one.
  %ts = call ptr inttoptr (i64 {PyGILState_GetThisThreadState} to ptr)()
  %fresh = icmp eq ptr %ts, null
  br i1 %fresh, label %adopt, label %ensure
adopt:
  %g0 = call i32 inttoptr (i64 {PyGILState_Ensure} to ptr)()
  %saved = call ptr inttoptr (i64 {PyEval_SaveThread} to ptr)()
  br label %ensure
ensure:
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

; A driver's thread keeps its state until the process ends (one per context).
; A simulated stream's thread, which ends when the stream closes, gives its
; state back first (GILState counter 1 -> 0), unless the interpreter guard is
; closed (exit: leak it).  Never from a thread-exit hook: a library may tear a
; context down (joining the driver's thread) while it holds the GIL.
define void @nhf_thread_release() {
entry:
  %in = call i1 @nhf_enter()
  br i1 %in, label %check, label %out
check:
  %ts = call ptr inttoptr (i64 {PyGILState_GetThisThreadState} to ptr)()
  %none = icmp eq ptr %ts, null
  br i1 %none, label %leave, label %dispose
dispose:
  %g = call i32 inttoptr (i64 {PyGILState_Ensure} to ptr)()
  call void inttoptr (i64 {PyGILState_Release} to ptr)(i32 0)
  call void inttoptr (i64 {PyGILState_Release} to ptr)(i32 1)
  br label %leave
leave:
  call void @nhf_leave()
  br label %out
out:
  ret void
}

; The destructor of a CUDA user object that owns a graph's record.
define void @nhf_graph_release(ptr %rec) {
  call void @nhf_complete(ptr %rec)
  ret void
}

; ---- records: every function below runs with the GIL held ----
; Link %count zeroed records of 40 bytes at %base into the free list.
define void @nhf_py_add_slab(i64 %base, i64 %count) {
entry:
  br label %loop
loop:
  %i = phi i64 [ 0, %entry ], [ %i1, %body ]
  %more = icmp ult i64 %i, %count
  br i1 %more, label %body, label %done
body:
  %off = mul i64 %i, 40
  %rec = add i64 %base, %off
  %recp = inttoptr i64 %rec to ptr
  %nextp = getelementptr i64, ptr %recp, i64 2
  %head = load i64, ptr @nhf_free
  store i64 %head, ptr %nextp
  store i64 %rec, ptr @nhf_free
  %i1 = add i64 %i, 1
  br label %loop
done:
  ret void
}

; Take a free record for fn(arg) and a new reference to %owner; 0 if none is free.
define i64 @nhf_py_take(i64 %fn, i64 %arg, ptr %owner) {
entry:
  %rec = load i64, ptr @nhf_free
  %none = icmp eq i64 %rec, 0
  br i1 %none, label %empty, label %take
empty:
  ret i64 0
take:
  %recp = inttoptr i64 %rec to ptr
  %nextp = getelementptr i64, ptr %recp, i64 2
  %following = load i64, ptr %nextp
  store i64 %following, ptr @nhf_free
  store i64 %fn, ptr %recp
  %argp = getelementptr i64, ptr %recp, i64 1
  store i64 %arg, ptr %argp
  store i64 0, ptr %nextp
  %resp = getelementptr i64, ptr %recp, i64 3
  store i64 0, ptr %resp
  %ownp = getelementptr i64, ptr %recp, i64 4
  store ptr %owner, ptr %ownp
  call void inttoptr (i64 {Py_IncRef} to ptr)(ptr %owner)
  %h = load i64, ptr @nhf_held
  %h1 = add i64 %h, 1
  store i64 %h1, ptr @nhf_held
  ret i64 %rec
}

; Release a record's owner and result and put it back on the free list.  The
; record is unlinked first: a finalizer run by the decref may launch or drain.
define void @nhf_py_give_back(i64 %rec) {
  %recp = inttoptr i64 %rec to ptr
  %resp = getelementptr i64, ptr %recp, i64 3
  %result = load ptr, ptr %resp
  %ownp = getelementptr i64, ptr %recp, i64 4
  %owner = load ptr, ptr %ownp
  store i64 0, ptr %resp
  store i64 0, ptr %ownp
  %nextp = getelementptr i64, ptr %recp, i64 2
  %head = load i64, ptr @nhf_free
  store i64 %head, ptr %nextp
  store i64 %rec, ptr @nhf_free
  %h = load i64, ptr @nhf_held
  %h1 = sub i64 %h, 1
  store i64 %h1, ptr @nhf_held
  call void inttoptr (i64 {Py_DecRef} to ptr)(ptr %result)
  call void inttoptr (i64 {Py_DecRef} to ptr)(ptr %owner)
  ret void
}

; Release every record that has run; returns how many.
define i64 @nhf_py_drain() {
entry:
  %head = atomicrmw xchg ptr @nhf_completed, i64 0 seq_cst
  br label %loop
loop:
  %rec = phi i64 [ %head, %entry ], [ %following, %body ]
  %n = phi i64 [ 0, %entry ], [ %n1, %body ]
  %end = icmp eq i64 %rec, 0
  br i1 %end, label %done, label %body
body:
  %recp = inttoptr i64 %rec to ptr
  %nextp = getelementptr i64, ptr %recp, i64 2
  %following = load i64, ptr %nextp
  call void @nhf_py_give_back(i64 %rec)
  %n1 = add i64 %n, 1
  br label %loop
done:
  ret i64 %n
}

; The pending call the trampolines schedule: drain on the main thread, unless
; the interpreter guard is closed (exit: leak rather than release).
define i32 @nhf_pending_drain(ptr %unused) {
  %c = load atomic i32, ptr @nhf_closing seq_cst, align 4
  %open = icmp eq i32 %c, 0
  br i1 %open, label %drain, label %out
drain:
  %n = call i64 @nhf_py_drain()
  br label %out
out:
  ret i32 0
}

; args[%i] of a METH_FASTCALL call, an int, as an unsigned 64-bit value.
define internal i64 @nhf_arg_u64(ptr %args, i64 %i) alwaysinline {
  %p = getelementptr ptr, ptr %args, i64 %i
  %o = load ptr, ptr %p
  %v = call i64 inttoptr (i64 {PyLong_AsUnsignedLongLongMask} to ptr)(ptr %o)
  ret i64 %v
}

; host_launch's native part, a METH_FASTCALL builtin:
;   launch(launcher, handle, trampoline, fn, arg, owner) -> status
; takes a record, drops the GIL only for launcher(handle, trampoline, record)
; (nhf_cuda_launch or nhf_sim_launch), gives the record back if that failed,
; and drains what has run meanwhile.  Status: 0, a launcher's status, or
; NO_RECORD (nothing taken: add a slab and call again).
define ptr @nhf_py_launch(ptr %self, ptr %args, i64 %nargs) {
entry:
  %six = icmp eq i64 %nargs, 6
  br i1 %six, label %unpack, label %badargs
badargs:
  %exc = inttoptr i64 {PyExc_TypeError} to ptr
  call void inttoptr (i64 {PyErr_SetString} to ptr)(ptr %exc, ptr @nhf_launch_usage)
  ret ptr null
unpack:
  %launcher = call i64 @nhf_arg_u64(ptr %args, i64 0)
  %handle = call i64 @nhf_arg_u64(ptr %args, i64 1)
  %trampoline = call i64 @nhf_arg_u64(ptr %args, i64 2)
  %fn = call i64 @nhf_arg_u64(ptr %args, i64 3)
  %arg = call i64 @nhf_arg_u64(ptr %args, i64 4)
  %a5 = getelementptr ptr, ptr %args, i64 5
  %owner = load ptr, ptr %a5
  %err = call ptr inttoptr (i64 {PyErr_Occurred} to ptr)()
  %raised = icmp ne ptr %err, null
  br i1 %raised, label %fail, label %take
fail:
  ret ptr null
take:
  %rec = call i64 @nhf_py_take(i64 %fn, i64 %arg, ptr %owner)
  %none = icmp eq i64 %rec, 0
  br i1 %none, label %norecord, label %launch
norecord:
  %nr = call ptr inttoptr (i64 {PyLong_FromUnsignedLongLong} to ptr)(i64 {NO_RECORD})
  ret ptr %nr
launch:
  %lp = inttoptr i64 %launcher to ptr
  %hp = inttoptr i64 %handle to ptr
  %tp = inttoptr i64 %trampoline to ptr
  %recp = inttoptr i64 %rec to ptr
  %ts = call ptr inttoptr (i64 {PyEval_SaveThread} to ptr)()
  %status = call i64 %lp(ptr %hp, ptr %tp, ptr %recp)
  call void inttoptr (i64 {PyEval_RestoreThread} to ptr)(ptr %ts)
  %ok = icmp eq i64 %status, 0
  br i1 %ok, label %launched, label %refused
refused:
  call void @nhf_py_give_back(i64 %rec)
  br label %out
launched:
  %c = load atomic i64, ptr @nhf_completed seq_cst, align 8
  %any = icmp ne i64 %c, 0
  br i1 %any, label %drain, label %out
drain:
  %n = call i64 @nhf_py_drain()
  br label %out
out:
  %r = call ptr inttoptr (i64 {PyLong_FromUnsignedLongLong} to ptr)(i64 %status)
  ret ptr %r
}

@nhf_launch_usage = internal constant [66 x i8]
  c"launch(launcher, handle, trampoline, fn, arg, owner): 6 arguments\00"

define i64 @nhf_held_addr() {
  ret i64 ptrtoint (ptr @nhf_held to i64)
}

define i64 @nhf_pending_drain_addr() {
  ret i64 ptrtoint (ptr @nhf_pending_drain to i64)
}

; ---- called from Python (through ctypes, so without the GIL) ----
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
  call void @nhf_thread_release()
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

; A simulated stream's thread is a native thread, foreign to Python like the
; driver's: it enters the worker loop and never touches CPython itself.
define ptr @nhf_sim_entry(ptr %q) {
  call void @nhf_sim_worker(ptr %q)
  ret ptr null
}

define i64 @nhf_sim_start(ptr %q) {
  %tidp = getelementptr i8, ptr %q, i64 {Q_THREAD}
  %create = inttoptr i64 {pthread_create} to ptr
  %r = call i32 %create(ptr %tidp, ptr null, ptr @nhf_sim_entry, ptr %q)
  %rw = zext i32 %r to i64
  ret i64 %rw
}

; After nhf_sim_stop: wait for the thread to end (%join != 0) or let it end alone.
define void @nhf_sim_finish(ptr %q, i64 %join) {
  %tidp = getelementptr i8, ptr %q, i64 {Q_THREAD}
  %tid = load i64, ptr %tidp
  %j = icmp ne i64 %join, 0
  br i1 %j, label %joining, label %detaching
joining:
  %r = call i32 inttoptr (i64 {pthread_join} to ptr)(i64 %tid, ptr null)
  ret void
detaching:
  %d = call i32 inttoptr (i64 {pthread_detach} to ptr)(i64 %tid)
  ret void
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
    "pthread_create",
    "pthread_join",
    "pthread_detach",
)
_PYTHON_SYMBOLS = (
    "PyGILState_Ensure",
    "PyGILState_Release",
    "PyGILState_GetThisThreadState",
    "PyEval_SaveThread",
    "PyEval_RestoreThread",
    "PyObject_CallNoArgs",
    "PyErr_WriteUnraisable",
    "PyErr_SetString",
    "PyErr_Occurred",
    "Py_AddPendingCall",
    "Py_IncRef",
    "Py_DecRef",
    "PyLong_AsUnsignedLongLongMask",
    "PyLong_FromUnsignedLongLong",
)
_METH_FASTCALL = 0x0080


class _MethodDef(ctypes.Structure):
    _fields_ = (
        ("ml_name", ctypes.c_char_p),
        ("ml_meth", ctypes.c_void_p),
        ("ml_flags", ctypes.c_int),
        ("ml_doc", ctypes.c_char_p),
    )


_u64 = ctypes.c_uint64
#: libc's calloc, for memory that native code owns (record slabs, simulated queues).
calloc = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t)(
    ("calloc", ctypes.CDLL(None))
)
_incref = ctypes.PYFUNCTYPE(None, ctypes.py_object)(("Py_IncRef", ctypes.pythonapi))
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
        if sysconfig.get_config_var("Py_GIL_DISABLED"):
            raise RuntimeError(
                "numba_hostfn needs a CPython build with the GIL (the GIL guards its "
                "launch records); this is a free-threaded build"
            )
        from numba.core.compiler_lock import global_compiler_lock
        from numba.core.registry import cpu_target

        subs = _libc_addresses()
        subs.update({n: _address_of(ctypes.pythonapi, n) for n in _PYTHON_SYMBOLS})
        # Public from 3.13; the same function was private before.
        unchecked = next(
            name
            for name in ("PyThreadState_GetUnchecked", "_PyThreadState_UncheckedGet")
            if hasattr(ctypes.pythonapi, name)
        )
        subs["PyThreadState_GetUnchecked"] = _address_of(ctypes.pythonapi, unchecked)
        subs.update(
            PyExc_TypeError=ctypes.c_void_p.in_dll(ctypes.pythonapi, "PyExc_TypeError").value,
            CAPTURE_CHECK_FAILED=CAPTURE_CHECK_FAILED,
            STREAM_CAPTURING=STREAM_CAPTURING,
            QUEUE_STOPPED=QUEUE_STOPPED,
            NO_RECORD=NO_RECORD,
            Q_MUTEX=_Q_MUTEX,
            Q_WORK=_Q_WORK,
            Q_IDLE=_Q_IDLE,
            Q_HEAD=_Q_HEAD,
            Q_TAIL=_Q_TAIL,
            Q_PENDING=_Q_PENDING,
            Q_STOP=_Q_STOP,
            Q_THREAD=_Q_THREAD,
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
        _incref(library)
        self._library = library

        def fn(name: str) -> int:
            address = library.get_pointer_to_function(name)
            if not address:  # llvmlite answers 0, not an error, for a missing symbol
                raise RuntimeError(f"numba_hostfn's native layer has no function {name!r}")
            return address

        self.run_compiled = fn("nhf_run_compiled")
        self.run_python = fn("nhf_run_python")
        self.graph_release = fn("nhf_graph_release")
        self.sim_delay = fn("nhf_sim_delay")

        # Records: these keep the GIL for the whole call (it guards the free
        # list); PYFUNCTYPE calls, and the launch builtin, which drops it only
        # around the enqueue.
        self.launch = self._builtin("launch", fn("nhf_py_launch"))
        self.add_slab = ctypes.PYFUNCTYPE(None, _u64, _u64)(fn("nhf_py_add_slab"))
        self.take = ctypes.PYFUNCTYPE(_u64, _u64, _u64, ctypes.py_object)(fn("nhf_py_take"))
        self.give_back = ctypes.PYFUNCTYPE(None, _u64)(fn("nhf_py_give_back"))
        self.drain = ctypes.PYFUNCTYPE(ctypes.c_int64)(fn("nhf_py_drain"))
        #: How many records are held (taken and not given back), read under the GIL.
        self.held = ctypes.c_int64.from_address(ctypes.CFUNCTYPE(_u64)(fn("nhf_held_addr"))())
        set_drain = ctypes.CFUNCTYPE(None, _u64)(fn("nhf_set_drain"))
        set_drain(ctypes.CFUNCTYPE(_u64)(fn("nhf_pending_drain_addr"))())

        # ctypes foreign calls (CFUNCTYPE) drop the GIL for their duration.
        # The driver backend fills in the CUDA entry points (raw driver
        # pointers from cuGetProcAddress) before its first enqueue.
        self.set_cuda = ctypes.CFUNCTYPE(None, _u64, _u64)(fn("nhf_set_cuda"))
        self.close = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(fn("nhf_close"))
        # Launchers, u64 (*)(handle, trampoline, record): what ``launch`` calls.
        self.cuda_launcher = fn("nhf_cuda_launch")
        self.sim_launcher = fn("nhf_sim_launch")
        self.sim_launch = ctypes.CFUNCTYPE(_u64, _vp, _vp, _vp)(self.sim_launcher)
        self.sim_start = ctypes.CFUNCTYPE(ctypes.c_int64, _vp)(fn("nhf_sim_start"))
        self.sim_finish = ctypes.CFUNCTYPE(None, _vp, ctypes.c_int64)(fn("nhf_sim_finish"))
        self.sim_sync = ctypes.CFUNCTYPE(ctypes.c_int64, _vp)(fn("nhf_sim_sync"))
        self.sim_pending = ctypes.CFUNCTYPE(ctypes.c_int64, _vp)(fn("nhf_sim_pending"))
        self.sim_init = ctypes.CFUNCTYPE(ctypes.c_int64, _vp)(fn("nhf_sim_init"))
        self.sim_stop = ctypes.CFUNCTYPE(None, _vp)(fn("nhf_sim_stop"))

        failed = ctypes.CFUNCTYPE(_u64)(fn("nhf_sched_failed_addr"))()
        self.schedule_failures = _u64.from_address(failed)

    def _builtin(self, name: str, address: int) -> Any:
        """A METH_FASTCALL builtin function for machine code at ``address``."""
        method = _MethodDef(name.encode(), address, _METH_FASTCALL, None)
        prototype = ctypes.PYFUNCTYPE(ctypes.py_object, _vp, _vp, _vp)
        function = prototype(("PyCFunction_NewEx", ctypes.pythonapi))(
            ctypes.addressof(method), None, None
        )
        # The function points into ``method``: keep that for the process's life.
        _incref(method)
        return function


@functools.cache
def native() -> Native:
    """Build the native layer once per process."""
    return Native()
