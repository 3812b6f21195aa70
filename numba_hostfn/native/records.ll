; Launch records: what each launch owns, and its release on the main thread.
;
; A record's life: *taken* from the free list (with a strong reference to its
; owner), handed to the driver with a trampoline, *run* there, *completed*
; (pushed on the lock-free completed stack, and a drain scheduled with
; Py_AddPendingCall), then *released* on the main thread by the drain: owner
; and result decref'd, record back on the free list.  A record whose enqueue
; failed is released at once.  A record kept by a graph is completed by the
; graph's user object when the graph is gone.
;
; Taking, releasing and draining run with the GIL held from start to end (the
; nhf_py_* functions, called as builtins or through ctypes.PYFUNCTYPE): the GIL
; is the free list's lock.  Other threads only complete records.
;
; This file is the only one that knows the record's layout: every other part
; goes through the accessors below.

%nhf.record = type {
  ptr,  ; fn: the CUhostFn a trampoline calls (null for a Python callable)
  ptr,  ; arg: its user_data, or the PyObject* of the Python callable
  ptr,  ; next: link in the free list, the completed stack or a graph's list
  ptr,  ; result: what a Python callable returned, released by the drain
  ptr   ; owner: PyObject*, a strong reference to what the launch keeps alive
}

define internal ptr @nhf.record.fn(ptr %record) alwaysinline {
  %field = getelementptr inbounds %nhf.record, ptr %record, i32 0, i32 0
  ret ptr %field
}

define internal ptr @nhf.record.arg(ptr %record) alwaysinline {
  %field = getelementptr inbounds %nhf.record, ptr %record, i32 0, i32 1
  ret ptr %field
}

define internal ptr @nhf.record.next(ptr %record) alwaysinline {
  %field = getelementptr inbounds %nhf.record, ptr %record, i32 0, i32 2
  ret ptr %field
}

define internal ptr @nhf.record.result(ptr %record) alwaysinline {
  %field = getelementptr inbounds %nhf.record, ptr %record, i32 0, i32 3
  ret ptr %field
}

define internal ptr @nhf.record.owner(ptr %record) alwaysinline {
  %field = getelementptr inbounds %nhf.record, ptr %record, i32 0, i32 4
  ret ptr %field
}

define i64 @nhf_record_bytes() {
  ret i64 ptrtoint (ptr getelementptr (%nhf.record, ptr null, i32 1) to i64)
}

; An object whose release is deferred to the drain (a replayed callable's result).
%nhf.deferred = type {
  ptr,  ; next
  ptr   ; object: PyObject*, one reference
}

@nhf.free = internal global ptr null        ; free records (GIL)
@nhf.held = internal global i64 0           ; records taken and not released (GIL)
@nhf.completed = internal global ptr null   ; records that have run (lock-free)
@nhf.deferred_objects = internal global ptr null  ; %nhf.deferred (lock-free)
@nhf.drain_scheduled = internal global i32 0 ; a pending-call drain is scheduled
@nhf.schedule_failures = internal global i64 0 ; Py_AddPendingCall refusals

define i64 @nhf_held_addr() {
  ret i64 ptrtoint (ptr @nhf.held to i64)
}

define i64 @nhf_schedule_failures_addr() {
  ret i64 ptrtoint (ptr @nhf.schedule_failures to i64)
}

; ---- any thread: complete, and schedule the drain ----

; Push %node on the lock-free stack at %head; %link is the node's next field.
define internal void @nhf.push(ptr %head, ptr %node, ptr %link) alwaysinline {
entry:
  br label %retry
retry:
  %top = load atomic ptr, ptr %head seq_cst, align 8
  store ptr %top, ptr %link
  %swap = cmpxchg ptr %head, ptr %top, ptr %node seq_cst seq_cst
  %pushed = extractvalue { ptr, i1 } %swap, 1
  br i1 %pushed, label %done, label %retry
done:
  ret void
}

; Ask the interpreter to run the drain on the main thread, once: the flag
; stays set until that drain starts.  If Py_AddPendingCall refuses (its queue
; is small and shared), clear the flag so that the next completion, or the
; next enqueue, tries again; count the refusal.
define internal void @nhf.schedule_drain() {
entry:
  %swap = cmpxchg ptr @nhf.drain_scheduled, i32 0, i32 1 seq_cst seq_cst
  %first = extractvalue { i32, i1 } %swap, 1
  br i1 %first, label %enter, label %done
enter:
  %in = call i1 @nhf.enter()
  br i1 %in, label %schedule, label %done
schedule:
  %rc = call i32 @Py_AddPendingCall(ptr @nhf_pending_drain, ptr null)
  call void @nhf.leave()
  %refused = icmp ne i32 %rc, 0
  br i1 %refused, label %retry_later, label %done
retry_later:
  store atomic i32 0, ptr @nhf.drain_scheduled seq_cst, align 4
  %failures = atomicrmw add ptr @nhf.schedule_failures, i64 1 seq_cst
  br label %done
done:
  ret void
}

; The record has run (or its graph is gone): hand it to the main thread.
define internal void @nhf.complete(ptr %record) {
  %link = call ptr @nhf.record.next(ptr %record)
  call void @nhf.push(ptr @nhf.completed, ptr %record, ptr %link)
  call void @nhf.schedule_drain()
  ret void
}

; Release %object on the main thread instead of here (GIL held by the caller).
; None is released at once: its release never frees anything.
define internal void @nhf.defer_release(ptr %object) {
entry:
  %none = icmp eq ptr %object, @_Py_NoneStruct
  br i1 %none, label %now, label %defer
defer:
  %size = load i64, ptr @nhf.deferred.bytes
  %node = call ptr @malloc(i64 %size)
  %nomem = icmp eq ptr %node, null
  br i1 %nomem, label %now, label %push
push:
  %objp = getelementptr inbounds %nhf.deferred, ptr %node, i32 0, i32 1
  store ptr %object, ptr %objp
  %link = getelementptr inbounds %nhf.deferred, ptr %node, i32 0, i32 0
  call void @nhf.push(ptr @nhf.deferred_objects, ptr %node, ptr %link)
  call void @nhf.schedule_drain()
  ret void
now:
  call void @Py_DecRef(ptr %object)
  ret void
}

@nhf.deferred.bytes = internal constant i64 ptrtoint (ptr getelementptr (%nhf.deferred, ptr null, i32 1) to i64)

; ---- the GIL held throughout ----

; Link %count zeroed records at %base into the free list.
define void @nhf_py_add_slab(ptr %base, i64 %count) {
entry:
  br label %loop
loop:
  %i = phi i64 [ 0, %entry ], [ %i1, %body ]
  %more = icmp ult i64 %i, %count
  br i1 %more, label %body, label %done
body:
  %record = getelementptr inbounds %nhf.record, ptr %base, i64 %i
  %link = call ptr @nhf.record.next(ptr %record)
  %head = load ptr, ptr @nhf.free
  store ptr %head, ptr %link
  store ptr %record, ptr @nhf.free
  %i1 = add i64 %i, 1
  br label %loop
done:
  ret void
}

; Take a free record for fn(arg) with a new reference to %owner; null if none is free.
define ptr @nhf_py_take(ptr %fn, ptr %arg, ptr %owner) {
entry:
  %record = load ptr, ptr @nhf.free
  %none = icmp eq ptr %record, null
  br i1 %none, label %empty, label %take
empty:
  ret ptr null
take:
  %link = call ptr @nhf.record.next(ptr %record)
  %following = load ptr, ptr %link
  store ptr %following, ptr @nhf.free
  store ptr null, ptr %link
  %fnp = call ptr @nhf.record.fn(ptr %record)
  store ptr %fn, ptr %fnp
  %argp = call ptr @nhf.record.arg(ptr %record)
  store ptr %arg, ptr %argp
  %resultp = call ptr @nhf.record.result(ptr %record)
  store ptr null, ptr %resultp
  %ownerp = call ptr @nhf.record.owner(ptr %record)
  store ptr %owner, ptr %ownerp
  call void @Py_IncRef(ptr %owner)
  %held = load i64, ptr @nhf.held
  %held1 = add i64 %held, 1
  store i64 %held1, ptr @nhf.held
  ret ptr %record
}

; Release a record: back on the free list, then its result and owner decref'd.
; The record is unlinked first: a finalizer run by the decref may take or
; drain records itself (invariant 11).
define void @nhf_py_release(ptr %record) {
  %resultp = call ptr @nhf.record.result(ptr %record)
  %result = load ptr, ptr %resultp
  %ownerp = call ptr @nhf.record.owner(ptr %record)
  %owner = load ptr, ptr %ownerp
  store ptr null, ptr %resultp
  store ptr null, ptr %ownerp
  %link = call ptr @nhf.record.next(ptr %record)
  %head = load ptr, ptr @nhf.free
  store ptr %head, ptr %link
  store ptr %record, ptr @nhf.free
  %held = load i64, ptr @nhf.held
  %held1 = sub i64 %held, 1
  store i64 %held1, ptr @nhf.held
  call void @Py_DecRef(ptr %result)
  call void @Py_DecRef(ptr %owner)
  ret void
}

; Release every completed record and every deferred object; returns how many
; records were released.
define i64 @nhf_py_drain() {
entry:
  %objects = atomicrmw xchg ptr @nhf.deferred_objects, ptr null seq_cst
  br label %objects_loop
objects_loop:
  %node = phi ptr [ %objects, %entry ], [ %following_node, %object ]
  %objects_done = icmp eq ptr %node, null
  br i1 %objects_done, label %records, label %object
object:
  %link_node = getelementptr inbounds %nhf.deferred, ptr %node, i32 0, i32 0
  %following_node = load ptr, ptr %link_node
  %objp = getelementptr inbounds %nhf.deferred, ptr %node, i32 0, i32 1
  %obj = load ptr, ptr %objp
  call void @free(ptr %node)
  call void @Py_DecRef(ptr %obj)
  br label %objects_loop
records:
  %head = atomicrmw xchg ptr @nhf.completed, ptr null seq_cst
  br label %loop
loop:
  %record = phi ptr [ %head, %records ], [ %following, %body ]
  %n = phi i64 [ 0, %records ], [ %n1, %body ]
  %end = icmp eq ptr %record, null
  br i1 %end, label %done, label %body
body:
  %link = call ptr @nhf.record.next(ptr %record)
  %following = load ptr, ptr %link
  call void @nhf_py_release(ptr %record)
  %n1 = add i64 %n, 1
  br label %loop
done:
  ret i64 %n
}

; True if a drain would find work (read without the GIL's help: a hint).
define internal i1 @nhf.drain_wanted() {
  %records = load atomic ptr, ptr @nhf.completed seq_cst, align 8
  %objects = load atomic ptr, ptr @nhf.deferred_objects seq_cst, align 8
  %r = icmp ne ptr %records, null
  %o = icmp ne ptr %objects, null
  %either = or i1 %r, %o
  ret i1 %either
}

; The pending call that completions schedule: the main thread drains, unless
; the interpreter guard is closed (exit: leak rather than release).  The flag
; is cleared first, so a completion during this drain schedules another.
define i32 @nhf_pending_drain(ptr %unused) {
entry:
  store atomic i32 0, ptr @nhf.drain_scheduled seq_cst, align 4
  %open = call i1 @nhf.guard_open()
  br i1 %open, label %drain, label %out
drain:
  %n = call i64 @nhf_py_drain()
  br label %out
out:
  ret i32 0
}
