; Notifications: a host function that signals Python through a file descriptor.
;
; A *channel* is an eventfd and a lock-free stack of *signals*.  A signal is
; what one launch will say when its stream gets there: a key that Python maps
; to a future or a callable.  @nhf_signal is the signal's CUhostFn: it runs on
; the driver's (or a pool's, or the simulator's) thread, pushes the signal, and
; writes the eventfd when the stack was empty; it never touches the GIL.  A
; channel made with wake_main also asks the interpreter, with a pending call,
; to call the callable set with nhf_py_set_notify_callable.
;
; The reader (an asyncio loop's reader callback; the non-blocking callbacks'
; helper thread or pending call) reads the descriptor first, then takes the
; signals, oldest first: a signal pushed after the take finds the stack empty
; and writes again, so no wake-up is lost.  One reader at a time per channel
; (Python's lock, or the loop's single thread).
;
; A channel is reference counted: Python holds one reference while it reads
; it, and each signal not yet run holds one.  The last release frees the
; signals nobody took and closes the descriptor: nothing writes to it after
; that, so a descriptor number the OS hands out again is never written
; (LIFETIME.md, invariant 17).

%nhf.channel = type {
  i64,  ; refs
  i32,  ; fd: an eventfd, closed by the last release
  i32,  ; wake_main: also schedule @nhf_pending_notify on the main thread
  ptr,  ; pushed: signals run, newest first (lock-free)
  ptr   ; taken: signals taken, oldest first (the reader's alone)
}

%nhf.signal = type {
  ptr,  ; next
  ptr,  ; channel
  i64   ; key
}

@nhf.channel.bytes = internal constant i64 ptrtoint (ptr getelementptr (%nhf.channel, ptr null, i32 1) to i64)
@nhf.signal.bytes = internal constant i64 ptrtoint (ptr getelementptr (%nhf.signal, ptr null, i32 1) to i64)
@nhf.eventfd.one = internal constant i64 1

; A channel over the eventfd %fd, with one reference (the caller's); null
; without memory.
define ptr @nhf_channel_new(i32 %fd, i32 %wake_main) {
entry:
  %size = load i64, ptr @nhf.channel.bytes
  %channel = call ptr @calloc(i64 1, i64 %size)
  %nomem = icmp eq ptr %channel, null
  br i1 %nomem, label %out, label %init
init:
  %refs = getelementptr inbounds %nhf.channel, ptr %channel, i32 0, i32 0
  store i64 1, ptr %refs
  %fdp = getelementptr inbounds %nhf.channel, ptr %channel, i32 0, i32 1
  store i32 %fd, ptr %fdp
  %wake = getelementptr inbounds %nhf.channel, ptr %channel, i32 0, i32 2
  store i32 %wake_main, ptr %wake
  fence seq_cst
  ret ptr %channel
out:
  ret ptr null
}

define internal void @nhf.signal.free_all(ptr %first) {
entry:
  br label %loop
loop:
  %node = phi ptr [ %first, %entry ], [ %following, %body ]
  %end = icmp eq ptr %node, null
  br i1 %end, label %done, label %body
body:
  %link = getelementptr inbounds %nhf.signal, ptr %node, i32 0, i32 0
  %following = load ptr, ptr %link
  call void @free(ptr %node)
  br label %loop
done:
  ret void
}

; Drop one reference; the last frees what nobody took and closes the descriptor.
define void @nhf_channel_release(ptr %channel) {
entry:
  %refs = getelementptr inbounds %nhf.channel, ptr %channel, i32 0, i32 0
  %before = atomicrmw sub ptr %refs, i64 1 seq_cst
  %last = icmp eq i64 %before, 1
  br i1 %last, label %free, label %done
free:
  %pushedp = getelementptr inbounds %nhf.channel, ptr %channel, i32 0, i32 3
  %pushed = load atomic ptr, ptr %pushedp seq_cst, align 8
  call void @nhf.signal.free_all(ptr %pushed)
  %takenp = getelementptr inbounds %nhf.channel, ptr %channel, i32 0, i32 4
  %taken = load ptr, ptr %takenp
  call void @nhf.signal.free_all(ptr %taken)
  %fdp = getelementptr inbounds %nhf.channel, ptr %channel, i32 0, i32 1
  %fd = load i32, ptr %fdp
  %rc = call i32 @close(i32 %fd)
  call void @free(ptr %channel)
  br label %done
done:
  ret void
}

; A signal of %channel saying %key, holding a reference to the channel; null
; without memory.
define ptr @nhf_signal_new(ptr %channel, i64 %key) {
entry:
  %size = load i64, ptr @nhf.signal.bytes
  %node = call ptr @malloc(i64 %size)
  %nomem = icmp eq ptr %node, null
  br i1 %nomem, label %out, label %init
init:
  %refs = getelementptr inbounds %nhf.channel, ptr %channel, i32 0, i32 0
  %before = atomicrmw add ptr %refs, i64 1 seq_cst
  %link = getelementptr inbounds %nhf.signal, ptr %node, i32 0, i32 0
  store ptr null, ptr %link
  %chp = getelementptr inbounds %nhf.signal, ptr %node, i32 0, i32 1
  store ptr %channel, ptr %chp
  %keyp = getelementptr inbounds %nhf.signal, ptr %node, i32 0, i32 2
  store i64 %key, ptr %keyp
  ret ptr %node
out:
  ret ptr null
}

; A signal that will never run (its enqueue was refused): free it, and its reference.
define void @nhf_signal_discard(ptr %node) {
  %chp = getelementptr inbounds %nhf.signal, ptr %node, i32 0, i32 1
  %channel = load ptr, ptr %chp
  call void @free(ptr %node)
  call void @nhf_channel_release(ptr %channel)
  ret void
}

@nhf.enqueue_signal.usage = internal constant [86 x i8]
  c"enqueue_signal(enqueue_fn, handle, trampoline, channel, key, owner) takes 6 arguments\00"

; The enqueue builtin for signals, METH_FASTCALL, as the enqueue builtin
; (enqueue.ll) with a signal of (channel, key) in place of fn(arg):
;   enqueue_signal(enqueue_fn, handle, trampoline, channel, key, owner) -> status
; The signal is made here and, if the enqueue refused it, freed here: it never
; reaches Python, so no exception raised in Python around this call (a Ctrl-C, or
; one a pending call raises, after the enqueue) can free a signal that the
; stream, and then the channel's reader, owns.
define ptr @nhf_py_enqueue_signal(ptr %self, ptr %args, i64 %nargs) {
entry:
  %six = icmp eq i64 %nargs, 6
  br i1 %six, label %unpack, label %usage
usage:
  %type_error = getelementptr i8, ptr @PyExc_TypeError, i64 0
  call void @PyErr_SetString(ptr %type_error, ptr @nhf.enqueue_signal.usage)
  ret ptr null
unpack:
  %enqueue_fn = call i64 @nhf.arg_u64(ptr %args, i64 0)
  %handle = call i64 @nhf.arg_u64(ptr %args, i64 1)
  %trampoline = call i64 @nhf.arg_u64(ptr %args, i64 2)
  %channel = call i64 @nhf.arg_u64(ptr %args, i64 3)
  %key = call i64 @nhf.arg_u64(ptr %args, i64 4)
  %owner_slot = getelementptr ptr, ptr %args, i64 5
  %owner = load ptr, ptr %owner_slot
  %error = call ptr @PyErr_Occurred()
  %bad_int = icmp ne ptr %error, null
  br i1 %bad_int, label %fail, label %make
fail:
  ret ptr null
make:
  %channelp = inttoptr i64 %channel to ptr
  %node = call ptr @nhf_signal_new(ptr %channelp, i64 %key)
  %nomem = icmp eq ptr %node, null
  br i1 %nomem, label %no_memory, label %enqueue
no_memory:
  %oom = load i64, ptr @nhf.status.out_of_memory
  br label %answer
enqueue:
  %enqueue_fnp = inttoptr i64 %enqueue_fn to ptr
  %stream = inttoptr i64 %handle to ptr
  %tramp = inttoptr i64 %trampoline to ptr
  %status = call i64 @nhf.enqueue_record(ptr %enqueue_fnp, ptr %stream, ptr %tramp, ptr @nhf_signal, ptr %node, ptr %owner)
  %ok = icmp eq i64 %status, 0
  %kept_flag = load i64, ptr @nhf.status.kept
  %kept_bits = and i64 %status, %kept_flag
  %kept = icmp ne i64 %kept_bits, 0
  %enqueued = or i1 %ok, %kept
  br i1 %enqueued, label %answer, label %discard
discard:
  call void @nhf_signal_discard(ptr %node)
  br label %answer
answer:
  %result_status = phi i64 [ %oom, %no_memory ], [ %status, %enqueue ], [ %status, %discard ]
  %result = call ptr @PyLong_FromUnsignedLongLong(i64 %result_status)
  ret ptr %result
}

; The CUhostFn of a signal: push it, wake the reader if the stack was empty,
; then drop the signal's reference.  The node belongs to the reader once
; pushed: it is not touched again here.
define void @nhf_signal(ptr %node) {
entry:
  %chp = getelementptr inbounds %nhf.signal, ptr %node, i32 0, i32 1
  %channel = load ptr, ptr %chp
  %pushedp = getelementptr inbounds %nhf.channel, ptr %channel, i32 0, i32 3
  %link = getelementptr inbounds %nhf.signal, ptr %node, i32 0, i32 0
  br label %retry
retry:
  %top = load atomic ptr, ptr %pushedp seq_cst, align 8
  store ptr %top, ptr %link
  %swap = cmpxchg ptr %pushedp, ptr %top, ptr %node seq_cst seq_cst
  %done = extractvalue { ptr, i1 } %swap, 1
  br i1 %done, label %pushed, label %retry
pushed:
  %was_empty = icmp eq ptr %top, null
  br i1 %was_empty, label %wake, label %release
wake:
  %fdp = getelementptr inbounds %nhf.channel, ptr %channel, i32 0, i32 1
  %fd = load i32, ptr %fdp
  %written = call i64 @write(i32 %fd, ptr @nhf.eventfd.one, i64 8)
  %wakep = getelementptr inbounds %nhf.channel, ptr %channel, i32 0, i32 2
  %wake_main = load i32, ptr %wakep
  %main = icmp ne i32 %wake_main, 0
  br i1 %main, label %schedule, label %release
schedule:
  call void @nhf.schedule_notify()
  br label %release
release:
  call void @nhf_channel_release(ptr %channel)
  ret void
}

; The reader: up to %cap keys of the signals that have run, oldest first, into
; %out; their nodes are freed.  Returns how many.  Fewer than %cap: none was
; left when the signals were taken.
define i64 @nhf_channel_take(ptr %channel, ptr %out, i64 %cap) {
entry:
  %takenp = getelementptr inbounds %nhf.channel, ptr %channel, i32 0, i32 4
  %taken = load ptr, ptr %takenp
  %empty = icmp eq ptr %taken, null
  br i1 %empty, label %grab, label %copy
grab:
  %pushedp = getelementptr inbounds %nhf.channel, ptr %channel, i32 0, i32 3
  %newest = atomicrmw xchg ptr %pushedp, ptr null seq_cst
  br label %reverse
reverse:  ; newest first -> oldest first
  %node = phi ptr [ %newest, %grab ], [ %following, %flip ]
  %oldest = phi ptr [ null, %grab ], [ %node, %flip ]
  %end = icmp eq ptr %node, null
  br i1 %end, label %copy, label %flip
flip:
  %link = getelementptr inbounds %nhf.signal, ptr %node, i32 0, i32 0
  %following = load ptr, ptr %link
  store ptr %oldest, ptr %link
  br label %reverse
copy:
  %first = phi ptr [ %taken, %entry ], [ %oldest, %reverse ]
  br label %loop
loop:
  %at = phi ptr [ %first, %copy ], [ %next, %body ]
  %n = phi i64 [ 0, %copy ], [ %n1, %body ]
  %none = icmp eq ptr %at, null
  %full = icmp sge i64 %n, %cap
  %stop = or i1 %none, %full
  br i1 %stop, label %done, label %body
body:
  %keyp = getelementptr inbounds %nhf.signal, ptr %at, i32 0, i32 2
  %key = load i64, ptr %keyp
  %slot = getelementptr inbounds i64, ptr %out, i64 %n
  store i64 %key, ptr %slot
  %atlink = getelementptr inbounds %nhf.signal, ptr %at, i32 0, i32 0
  %next = load ptr, ptr %atlink
  call void @free(ptr %at)
  %n1 = add i64 %n, 1
  br label %loop
done:
  store ptr %at, ptr %takenp
  ret i64 %n
}

; ---- the main thread's share: a pending call to a Python callable ----

@nhf.notify_scheduled = internal global i32 0
@nhf.notify_callable = internal global ptr null  ; PyObject*, one reference, set once

; Set the callable that @nhf_pending_notify calls (GIL held); it is kept for
; the process's life.
define void @nhf_py_set_notify_callable(ptr %callable) {
  call void @Py_IncRef(ptr %callable)
  store atomic ptr %callable, ptr @nhf.notify_callable seq_cst, align 8
  ret void
}

; Python 3.10-3.12 see a Py_AddPendingCall made on a thread foreign to Python
; only when the main thread next drops or takes the GIL (their eval breaker is
; recomputed for the calling thread): up to a switch interval while it runs
; Python.  3.12's _PyEval_AddPendingCall(interp, fn, arg, 0) queues a call
; that any thread of the interpreter runs, and sets the eval breaker at once;
; nhf_set_any_thread_pending gives it (see _compat.any_thread_pending_call).
@nhf.any_thread_pending = internal global ptr null  ; i32 (ptr, ptr, ptr, i32)
@nhf.main_interpreter = internal global ptr null

define void @nhf_set_any_thread_pending(ptr %add, ptr %interp) {
  store ptr %interp, ptr @nhf.main_interpreter
  store atomic ptr %add, ptr @nhf.any_thread_pending seq_cst, align 8
  ret void
}

define internal i32 @nhf.add_pending_notify() {
entry:
  %add = load atomic ptr, ptr @nhf.any_thread_pending seq_cst, align 8
  %legacy = icmp eq ptr %add, null
  br i1 %legacy, label %main_only, label %any_thread
main_only:
  %rc = call i32 @Py_AddPendingCall(ptr @nhf_pending_notify, ptr null)
  ret i32 %rc
any_thread:
  %interp = load ptr, ptr @nhf.main_interpreter
  %rc1 = call i32 %add(ptr %interp, ptr @nhf_pending_notify, ptr null, i32 0)
  ret i32 %rc1
}

; As @nhf.schedule_drain: once until the call starts; a refusal clears the flag
; (the eventfd has been written, so the reader's thread still runs the batch).
define internal void @nhf.schedule_notify() {
entry:
  %swap = cmpxchg ptr @nhf.notify_scheduled, i32 0, i32 1 seq_cst seq_cst
  %first = extractvalue { i32, i1 } %swap, 1
  br i1 %first, label %enter, label %done
enter:
  %in = call i1 @nhf.enter()
  br i1 %in, label %schedule, label %unset
schedule:
  %rc = call i32 @nhf.add_pending_notify()
  call void @nhf.leave()
  %refused = icmp ne i32 %rc, 0
  br i1 %refused, label %unset, label %done
unset:
  store atomic i32 0, ptr @nhf.notify_scheduled seq_cst, align 4
  br label %done
done:
  ret void
}

; The pending call: the thread that runs it (the main thread, or from 3.12 any
; thread of the interpreter) calls the notify callable, GIL held.  Its errors
; are reported, never raised into whatever that thread was running.
define i32 @nhf_pending_notify(ptr %unused) {
entry:
  store atomic i32 0, ptr @nhf.notify_scheduled seq_cst, align 4
  %open = call i1 @nhf.guard_open()
  %callable = load atomic ptr, ptr @nhf.notify_callable seq_cst, align 8
  %set = icmp ne ptr %callable, null
  %go = and i1 %open, %set
  br i1 %go, label %call, label %out
call:
  call void @nhf_py_call_reporting(ptr %callable)
  br label %out
out:
  ret i32 0
}

; Call %callable() with the GIL held; an exception goes to sys.unraisablehook
; with the callable as the object, as for a blocking Python callable.  Except
; KeyboardInterrupt (Ctrl-C, whose handler ran inside the call, on the main
; thread): it is not swallowed but delivered again, as a new SIGINT that the
; main thread handles at its next check (PyErr_SetInterrupt).
define void @nhf_py_call_reporting(ptr %callable) {
entry:
  %result = call ptr @PyObject_CallNoArgs(ptr %callable)
  %raised = icmp eq ptr %result, null
  br i1 %raised, label %which, label %release
which:
  %kbi = getelementptr i8, ptr @PyExc_KeyboardInterrupt, i64 0
  %is_kbi = call i32 @PyErr_ExceptionMatches(ptr %kbi)
  %interrupt = icmp ne i32 %is_kbi, 0
  br i1 %interrupt, label %again, label %report
again:
  call void @PyErr_Clear()
  call void @PyErr_SetInterrupt()
  ret void
report:
  call void @PyErr_WriteUnraisable(ptr %callable)
  ret void
release:
  call void @Py_DecRef(ptr %result)
  ret void
}
