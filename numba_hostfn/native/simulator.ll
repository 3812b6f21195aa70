; The simulator: simulated streams, the simulated context's one host-function
; thread, and the keepers that stand in for CUDA user objects.
;
; A simulated stream is a FIFO of items that the stream's own native thread
; (its "device engine") takes in order.  A *device* item (simulated device
; work: a delay, a compiled "kernel") runs on that thread.  A *host* item (a
; host function, as cuLaunchHostFunc enqueues it) is handed to the context's
; host-function thread, and the stream waits until it has run.  So, as on the
; driver, the host functions of all streams run one at a time on one thread,
; and each stream waits for its own.  Every thread here is native, foreign to
; Python; none touches CPython except through the trampolines.

%nhf.pthread.mutex = type { [8 x i64] }  ; room for pthread_mutex_t (40 bytes on x86-64 glibc)
%nhf.pthread.cond = type { [8 x i64] }   ; room for pthread_cond_t (48 bytes)

@nhf.sim.lane.device = internal constant i64 0
@nhf.sim.lane.host = internal constant i64 1

%nhf.sim.item = type {
  ptr,  ; next
  ptr,  ; fn
  ptr,  ; arg
  i64   ; lane: @nhf.sim.lane.*
}

%nhf.sim.stream = type {
  %nhf.pthread.mutex,  ; mutex: guards every field below
  %nhf.pthread.cond,   ; wake: an item arrived, the host function ran, or stop
  %nhf.pthread.cond,   ; idle: nothing pending
  ptr,                 ; head of the FIFO
  ptr,                 ; tail
  i64,                 ; pending: items enqueued and not yet finished
  i32,                 ; stopping
  i32,                 ; capturing: enqueues refuse, the capture path records
  i64,                 ; thread (pthread_t)
  ptr,                 ; host_next: link in the context's host queue
  ptr,                 ; host_fn
  ptr,                 ; host_arg
  i32                  ; host_done
}

%nhf.sim.context = type {
  %nhf.pthread.mutex,  ; mutex
  %nhf.pthread.cond,   ; work: a stream handed over a host function
  ptr,                 ; head of the streams waiting for their host function
  ptr,                 ; tail
  i64                  ; thread (pthread_t)
}

@nhf.sim.context = internal global %nhf.sim.context zeroinitializer
@nhf.sim.item.bytes = internal constant i64 ptrtoint (ptr getelementptr (%nhf.sim.item, ptr null, i32 1) to i64)
@nhf.sim.stream.bytes = internal constant i64 ptrtoint (ptr getelementptr (%nhf.sim.stream, ptr null, i32 1) to i64)

; ---- field accessors ----

define internal ptr @nhf.sim.item.next(ptr %i) alwaysinline {
  %f = getelementptr inbounds %nhf.sim.item, ptr %i, i32 0, i32 0
  ret ptr %f
}
define internal ptr @nhf.sim.item.fn(ptr %i) alwaysinline {
  %f = getelementptr inbounds %nhf.sim.item, ptr %i, i32 0, i32 1
  ret ptr %f
}
define internal ptr @nhf.sim.item.arg(ptr %i) alwaysinline {
  %f = getelementptr inbounds %nhf.sim.item, ptr %i, i32 0, i32 2
  ret ptr %f
}
define internal ptr @nhf.sim.item.lane(ptr %i) alwaysinline {
  %f = getelementptr inbounds %nhf.sim.item, ptr %i, i32 0, i32 3
  ret ptr %f
}

define internal ptr @nhf.sim.stream.mutex(ptr %s) alwaysinline {
  %f = getelementptr inbounds %nhf.sim.stream, ptr %s, i32 0, i32 0
  ret ptr %f
}
define internal ptr @nhf.sim.stream.wake(ptr %s) alwaysinline {
  %f = getelementptr inbounds %nhf.sim.stream, ptr %s, i32 0, i32 1
  ret ptr %f
}
define internal ptr @nhf.sim.stream.idle(ptr %s) alwaysinline {
  %f = getelementptr inbounds %nhf.sim.stream, ptr %s, i32 0, i32 2
  ret ptr %f
}
define internal ptr @nhf.sim.stream.head(ptr %s) alwaysinline {
  %f = getelementptr inbounds %nhf.sim.stream, ptr %s, i32 0, i32 3
  ret ptr %f
}
define internal ptr @nhf.sim.stream.tail(ptr %s) alwaysinline {
  %f = getelementptr inbounds %nhf.sim.stream, ptr %s, i32 0, i32 4
  ret ptr %f
}
define internal ptr @nhf.sim.stream.pending(ptr %s) alwaysinline {
  %f = getelementptr inbounds %nhf.sim.stream, ptr %s, i32 0, i32 5
  ret ptr %f
}
define internal ptr @nhf.sim.stream.stopping(ptr %s) alwaysinline {
  %f = getelementptr inbounds %nhf.sim.stream, ptr %s, i32 0, i32 6
  ret ptr %f
}
define internal ptr @nhf.sim.stream.capturing(ptr %s) alwaysinline {
  %f = getelementptr inbounds %nhf.sim.stream, ptr %s, i32 0, i32 7
  ret ptr %f
}
define internal ptr @nhf.sim.stream.thread(ptr %s) alwaysinline {
  %f = getelementptr inbounds %nhf.sim.stream, ptr %s, i32 0, i32 8
  ret ptr %f
}
define internal ptr @nhf.sim.stream.host_next(ptr %s) alwaysinline {
  %f = getelementptr inbounds %nhf.sim.stream, ptr %s, i32 0, i32 9
  ret ptr %f
}
define internal ptr @nhf.sim.stream.host_fn(ptr %s) alwaysinline {
  %f = getelementptr inbounds %nhf.sim.stream, ptr %s, i32 0, i32 10
  ret ptr %f
}
define internal ptr @nhf.sim.stream.host_arg(ptr %s) alwaysinline {
  %f = getelementptr inbounds %nhf.sim.stream, ptr %s, i32 0, i32 11
  ret ptr %f
}
define internal ptr @nhf.sim.stream.host_done(ptr %s) alwaysinline {
  %f = getelementptr inbounds %nhf.sim.stream, ptr %s, i32 0, i32 12
  ret ptr %f
}

define internal ptr @nhf.sim.context.mutex() alwaysinline {
  %f = getelementptr inbounds %nhf.sim.context, ptr @nhf.sim.context, i32 0, i32 0
  ret ptr %f
}
define internal ptr @nhf.sim.context.work() alwaysinline {
  %f = getelementptr inbounds %nhf.sim.context, ptr @nhf.sim.context, i32 0, i32 1
  ret ptr %f
}
define internal ptr @nhf.sim.context.head() alwaysinline {
  %f = getelementptr inbounds %nhf.sim.context, ptr @nhf.sim.context, i32 0, i32 2
  ret ptr %f
}
define internal ptr @nhf.sim.context.tail() alwaysinline {
  %f = getelementptr inbounds %nhf.sim.context, ptr @nhf.sim.context, i32 0, i32 3
  ret ptr %f
}
define internal ptr @nhf.sim.context.thread() alwaysinline {
  %f = getelementptr inbounds %nhf.sim.context, ptr @nhf.sim.context, i32 0, i32 4
  ret ptr %f
}

; ---- enqueue (called without the GIL) ----

; Append fn(arg) on %lane; refused while the stream is stopping or capturing.
define internal i64 @nhf.sim.enqueue(ptr %stream, ptr %fn, ptr %arg, i64 %lane) {
entry:
  %size = load i64, ptr @nhf.sim.item.bytes
  %item = call ptr @malloc(i64 %size)
  %nomem = icmp eq ptr %item, null
  br i1 %nomem, label %out_of_memory, label %fill
out_of_memory:
  %oom = load i64, ptr @nhf.status.out_of_memory
  ret i64 %oom
fill:
  %nextp = call ptr @nhf.sim.item.next(ptr %item)
  store ptr null, ptr %nextp
  %fnp = call ptr @nhf.sim.item.fn(ptr %item)
  store ptr %fn, ptr %fnp
  %argp = call ptr @nhf.sim.item.arg(ptr %item)
  store ptr %arg, ptr %argp
  %lanep = call ptr @nhf.sim.item.lane(ptr %item)
  store i64 %lane, ptr %lanep
  %mutex = call ptr @nhf.sim.stream.mutex(ptr %stream)
  %l = call i32 @pthread_mutex_lock(ptr %mutex)
  %stoppingp = call ptr @nhf.sim.stream.stopping(ptr %stream)
  %stopping = load i32, ptr %stoppingp
  %stopped = icmp ne i32 %stopping, 0
  br i1 %stopped, label %refuse_stopped, label %check_capture
refuse_stopped:
  %u0 = call i32 @pthread_mutex_unlock(ptr %mutex)
  call void @free(ptr %item)
  %stopped_status = load i64, ptr @nhf.status.queue_stopped
  ret i64 %stopped_status
check_capture:
  %capturingp = call ptr @nhf.sim.stream.capturing(ptr %stream)
  %capturing = load i32, ptr %capturingp
  %captures = icmp ne i32 %capturing, 0
  br i1 %captures, label %refuse_capturing, label %append
refuse_capturing:
  %u1 = call i32 @pthread_mutex_unlock(ptr %mutex)
  call void @free(ptr %item)
  %capturing_status = load i64, ptr @nhf.status.capturing
  ret i64 %capturing_status
append:
  %tailp = call ptr @nhf.sim.stream.tail(ptr %stream)
  %tail = load ptr, ptr %tailp
  %empty = icmp eq ptr %tail, null
  br i1 %empty, label %first, label %link
first:
  %headp = call ptr @nhf.sim.stream.head(ptr %stream)
  store ptr %item, ptr %headp
  br label %linked
link:
  %tail_next = call ptr @nhf.sim.item.next(ptr %tail)
  store ptr %item, ptr %tail_next
  br label %linked
linked:
  store ptr %item, ptr %tailp
  %pendingp = call ptr @nhf.sim.stream.pending(ptr %stream)
  %pending = load i64, ptr %pendingp
  %pending1 = add i64 %pending, 1
  store i64 %pending1, ptr %pendingp
  %wake = call ptr @nhf.sim.stream.wake(ptr %stream)
  %s = call i32 @pthread_cond_signal(ptr %wake)
  %u = call i32 @pthread_mutex_unlock(ptr %mutex)
  ret i64 0
}

; A host function, handed to the context's host-function thread when reached.
define i64 @nhf_sim_enqueue(ptr %stream, ptr %fn, ptr %arg) {
  %lane = load i64, ptr @nhf.sim.lane.host
  %status = call i64 @nhf.sim.enqueue(ptr %stream, ptr %fn, ptr %arg, i64 %lane)
  ret i64 %status
}

; Simulated device work, run by the stream's own thread.
define i64 @nhf_sim_enqueue_device(ptr %stream, ptr %fn, ptr %arg) {
  %lane = load i64, ptr @nhf.sim.lane.device
  %status = call i64 @nhf.sim.enqueue(ptr %stream, ptr %fn, ptr %arg, i64 %lane)
  ret i64 %status
}

; ---- the threads ----

; On the stream's thread: hand fn(arg) to the host-function thread and wait
; until it has run, as a CUDA stream waits for its host function.
define internal void @nhf.sim.run_on_host_thread(ptr %stream, ptr %fn, ptr %arg) {
entry:
  %host_fn = call ptr @nhf.sim.stream.host_fn(ptr %stream)
  store ptr %fn, ptr %host_fn
  %host_arg = call ptr @nhf.sim.stream.host_arg(ptr %stream)
  store ptr %arg, ptr %host_arg
  %host_next = call ptr @nhf.sim.stream.host_next(ptr %stream)
  store ptr null, ptr %host_next
  %cmutex = call ptr @nhf.sim.context.mutex()
  %cl = call i32 @pthread_mutex_lock(ptr %cmutex)
  %ctailp = call ptr @nhf.sim.context.tail()
  %ctail = load ptr, ptr %ctailp
  %cempty = icmp eq ptr %ctail, null
  br i1 %cempty, label %first, label %link
first:
  %cheadp = call ptr @nhf.sim.context.head()
  store ptr %stream, ptr %cheadp
  br label %handed
link:
  %tail_next = call ptr @nhf.sim.stream.host_next(ptr %ctail)
  store ptr %stream, ptr %tail_next
  br label %handed
handed:
  store ptr %stream, ptr %ctailp
  %work = call ptr @nhf.sim.context.work()
  %cs = call i32 @pthread_cond_signal(ptr %work)
  %cu = call i32 @pthread_mutex_unlock(ptr %cmutex)
  %mutex = call ptr @nhf.sim.stream.mutex(ptr %stream)
  %wake = call ptr @nhf.sim.stream.wake(ptr %stream)
  %donep = call ptr @nhf.sim.stream.host_done(ptr %stream)
  %l = call i32 @pthread_mutex_lock(ptr %mutex)
  br label %check
check:
  %done = load i32, ptr %donep
  %ran = icmp ne i32 %done, 0
  br i1 %ran, label %finished, label %wait
wait:
  %w = call i32 @pthread_cond_wait(ptr %wake, ptr %mutex)
  br label %check
finished:
  store i32 0, ptr %donep
  %u = call i32 @pthread_mutex_unlock(ptr %mutex)
  ret void
}

; A stream's thread: run its items in order until it is stopped and empty.
define internal ptr @nhf.sim.stream_main(ptr %stream) {
entry:
  %mutex = call ptr @nhf.sim.stream.mutex(ptr %stream)
  %wake = call ptr @nhf.sim.stream.wake(ptr %stream)
  %idle = call ptr @nhf.sim.stream.idle(ptr %stream)
  %headp = call ptr @nhf.sim.stream.head(ptr %stream)
  %tailp = call ptr @nhf.sim.stream.tail(ptr %stream)
  %pendingp = call ptr @nhf.sim.stream.pending(ptr %stream)
  %stoppingp = call ptr @nhf.sim.stream.stopping(ptr %stream)
  %host_lane = load i64, ptr @nhf.sim.lane.host
  %l = call i32 @pthread_mutex_lock(ptr %mutex)
  br label %look
look:
  %item = load ptr, ptr %headp
  %none = icmp eq ptr %item, null
  br i1 %none, label %nothing, label %pop
nothing:
  %stopping = load i32, ptr %stoppingp
  %stopped = icmp ne i32 %stopping, 0
  br i1 %stopped, label %quit, label %sleep
sleep:
  %w = call i32 @pthread_cond_wait(ptr %wake, ptr %mutex)
  br label %look
quit:
  %u0 = call i32 @pthread_mutex_unlock(ptr %mutex)
  ret ptr null
pop:
  %nextp = call ptr @nhf.sim.item.next(ptr %item)
  %next = load ptr, ptr %nextp
  store ptr %next, ptr %headp
  %last = icmp eq ptr %next, null
  br i1 %last, label %clear_tail, label %run
clear_tail:
  store ptr null, ptr %tailp
  br label %run
run:
  %u1 = call i32 @pthread_mutex_unlock(ptr %mutex)
  %fnp = call ptr @nhf.sim.item.fn(ptr %item)
  %fn = load ptr, ptr %fnp
  %argp = call ptr @nhf.sim.item.arg(ptr %item)
  %arg = load ptr, ptr %argp
  %lanep = call ptr @nhf.sim.item.lane(ptr %item)
  %lane = load i64, ptr %lanep
  %is_host = icmp eq i64 %lane, %host_lane
  br i1 %is_host, label %host, label %device
host:
  call void @nhf.sim.run_on_host_thread(ptr %stream, ptr %fn, ptr %arg)
  br label %finished
device:
  call void %fn(ptr %arg)
  br label %finished
finished:
  call void @free(ptr %item)
  %l2 = call i32 @pthread_mutex_lock(ptr %mutex)
  %pending = load i64, ptr %pendingp
  %pending1 = sub i64 %pending, 1
  store i64 %pending1, ptr %pendingp
  %idle_now = icmp eq i64 %pending1, 0
  br i1 %idle_now, label %signal_idle, label %look
signal_idle:
  %b = call i32 @pthread_cond_broadcast(ptr %idle)
  br label %look
}

; The context's host-function thread: run the host functions that streams
; hand over, one at a time, in the order they were reached.  It runs until
; the process ends, like the driver's.
define internal ptr @nhf.sim.host_thread_main(ptr %unused) {
entry:
  %cmutex = call ptr @nhf.sim.context.mutex()
  %work = call ptr @nhf.sim.context.work()
  %cheadp = call ptr @nhf.sim.context.head()
  %ctailp = call ptr @nhf.sim.context.tail()
  %l = call i32 @pthread_mutex_lock(ptr %cmutex)
  br label %look
look:
  %stream = load ptr, ptr %cheadp
  %none = icmp eq ptr %stream, null
  br i1 %none, label %sleep, label %pop
sleep:
  %w = call i32 @pthread_cond_wait(ptr %work, ptr %cmutex)
  br label %look
pop:
  %host_next = call ptr @nhf.sim.stream.host_next(ptr %stream)
  %next = load ptr, ptr %host_next
  store ptr %next, ptr %cheadp
  %last = icmp eq ptr %next, null
  br i1 %last, label %clear_tail, label %run
clear_tail:
  store ptr null, ptr %ctailp
  br label %run
run:
  %u = call i32 @pthread_mutex_unlock(ptr %cmutex)
  %fnp = call ptr @nhf.sim.stream.host_fn(ptr %stream)
  %fn = load ptr, ptr %fnp
  %argp = call ptr @nhf.sim.stream.host_arg(ptr %stream)
  %arg = load ptr, ptr %argp
  call void %fn(ptr %arg)
  %mutex = call ptr @nhf.sim.stream.mutex(ptr %stream)
  %wake = call ptr @nhf.sim.stream.wake(ptr %stream)
  %donep = call ptr @nhf.sim.stream.host_done(ptr %stream)
  %sl = call i32 @pthread_mutex_lock(ptr %mutex)
  store i32 1, ptr %donep
  %s = call i32 @pthread_cond_signal(ptr %wake)
  %su = call i32 @pthread_mutex_unlock(ptr %mutex)
  %l2 = call i32 @pthread_mutex_lock(ptr %cmutex)
  br label %look
}

; ---- called from Python through ctypes (without the GIL) ----

; Start the host-function thread; once per process, before the first stream.
define i64 @nhf_sim_context_start() {
entry:
  %cmutex = call ptr @nhf.sim.context.mutex()
  %work = call ptr @nhf.sim.context.work()
  %a = call i32 @pthread_mutex_init(ptr %cmutex, ptr null)
  %b = call i32 @pthread_cond_init(ptr %work, ptr null)
  %ab = or i32 %a, %b
  %failed = icmp ne i32 %ab, 0
  br i1 %failed, label %fail, label %start
start:
  %threadp = call ptr @nhf.sim.context.thread()
  %c = call i32 @pthread_create(ptr %threadp, ptr null, ptr @nhf.sim.host_thread_main, ptr null)
  %cw = zext i32 %c to i64
  ret i64 %cw
fail:
  %abw = zext i32 %ab to i64
  ret i64 %abw
}

; A new stream with its thread running; null if that failed.  Its memory is
; never freed: a stale handle finds the stream stopped rather than freed.
define ptr @nhf_sim_stream_new() {
entry:
  %size = load i64, ptr @nhf.sim.stream.bytes
  %stream = call ptr @calloc(i64 1, i64 %size)
  %nomem = icmp eq ptr %stream, null
  br i1 %nomem, label %fail, label %init
init:
  %mutex = call ptr @nhf.sim.stream.mutex(ptr %stream)
  %wake = call ptr @nhf.sim.stream.wake(ptr %stream)
  %idle = call ptr @nhf.sim.stream.idle(ptr %stream)
  %a = call i32 @pthread_mutex_init(ptr %mutex, ptr null)
  %b = call i32 @pthread_cond_init(ptr %wake, ptr null)
  %c = call i32 @pthread_cond_init(ptr %idle, ptr null)
  %ab = or i32 %a, %b
  %abc = or i32 %ab, %c
  %init_failed = icmp ne i32 %abc, 0
  br i1 %init_failed, label %release, label %start
start:
  %threadp = call ptr @nhf.sim.stream.thread(ptr %stream)
  %rc = call i32 @pthread_create(ptr %threadp, ptr null, ptr @nhf.sim.stream_main, ptr %stream)
  %start_failed = icmp ne i32 %rc, 0
  br i1 %start_failed, label %release, label %done
release:
  call void @free(ptr %stream)
  br label %fail
fail:
  ret ptr null
done:
  ret ptr %stream
}

define void @nhf_sim_set_capturing(ptr %stream, i32 %capturing) {
  %mutex = call ptr @nhf.sim.stream.mutex(ptr %stream)
  %l = call i32 @pthread_mutex_lock(ptr %mutex)
  %capturingp = call ptr @nhf.sim.stream.capturing(ptr %stream)
  store i32 %capturing, ptr %capturingp
  %u = call i32 @pthread_mutex_unlock(ptr %mutex)
  ret void
}

; Wait until everything enqueued so far has run.
define void @nhf_sim_sync(ptr %stream) {
entry:
  %mutex = call ptr @nhf.sim.stream.mutex(ptr %stream)
  %idle = call ptr @nhf.sim.stream.idle(ptr %stream)
  %pendingp = call ptr @nhf.sim.stream.pending(ptr %stream)
  %l = call i32 @pthread_mutex_lock(ptr %mutex)
  br label %check
check:
  %pending = load i64, ptr %pendingp
  %busy = icmp sgt i64 %pending, 0
  br i1 %busy, label %wait, label %done
wait:
  %w = call i32 @pthread_cond_wait(ptr %idle, ptr %mutex)
  br label %check
done:
  %u = call i32 @pthread_mutex_unlock(ptr %mutex)
  ret void
}

define i64 @nhf_sim_pending(ptr %stream) {
  %mutex = call ptr @nhf.sim.stream.mutex(ptr %stream)
  %pendingp = call ptr @nhf.sim.stream.pending(ptr %stream)
  %l = call i32 @pthread_mutex_lock(ptr %mutex)
  %pending = load i64, ptr %pendingp
  %u = call i32 @pthread_mutex_unlock(ptr %mutex)
  ret i64 %pending
}

; Refuse new work; the thread runs what is queued, then ends.
define void @nhf_sim_stop(ptr %stream) {
  %mutex = call ptr @nhf.sim.stream.mutex(ptr %stream)
  %wake = call ptr @nhf.sim.stream.wake(ptr %stream)
  %l = call i32 @pthread_mutex_lock(ptr %mutex)
  %stoppingp = call ptr @nhf.sim.stream.stopping(ptr %stream)
  store i32 1, ptr %stoppingp
  %b = call i32 @pthread_cond_broadcast(ptr %wake)
  %u = call i32 @pthread_mutex_unlock(ptr %mutex)
  ret void
}

; After nhf_sim_stop: wait for the thread to end (%join != 0) or let it end alone.
define void @nhf_sim_finish(ptr %stream, i64 %join) {
entry:
  %threadp = call ptr @nhf.sim.stream.thread(ptr %stream)
  %thread = load i64, ptr %threadp
  %joining = icmp ne i64 %join, 0
  br i1 %joining, label %wait, label %detach
wait:
  %r = call i32 @pthread_join(i64 %thread, ptr null)
  ret void
detach:
  %d = call i32 @pthread_detach(i64 %thread)
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
  %chunk32 = trunc i64 %chunk to i32
  %r = call i32 @usleep(i32 %chunk32)
  %rest = sub i64 %left, %chunk
  br label %loop
done:
  ret void
}

; ---- keepers: what a simulated graph owns, like a CUDA user object ----
;
; A keeper holds a graph's records (linked through their next field) and a
; count of references: the graph definition, each executable graph, each
; replay not yet finished.  The last release completes every record.

%nhf.sim.keeper = type {
  i64,  ; refs
  ptr   ; records
}

define ptr @nhf_sim_keeper_new() {
entry:
  %size = load i64, ptr @nhf.sim.keeper.bytes
  %keeper = call ptr @calloc(i64 1, i64 %size)
  %nomem = icmp eq ptr %keeper, null
  br i1 %nomem, label %done, label %init
init:
  %refs = getelementptr inbounds %nhf.sim.keeper, ptr %keeper, i32 0, i32 0
  store i64 1, ptr %refs
  br label %done
done:
  ret ptr %keeper
}

@nhf.sim.keeper.bytes = internal constant i64 ptrtoint (ptr getelementptr (%nhf.sim.keeper, ptr null, i32 1) to i64)

; The keeper owns %record from now on (GIL held; not while a release runs).
define void @nhf_py_sim_keeper_own(ptr %keeper, ptr %record) {
  %records = getelementptr inbounds %nhf.sim.keeper, ptr %keeper, i32 0, i32 1
  %head = load ptr, ptr %records
  %link = call ptr @nhf.record.next(ptr %record)
  store ptr %head, ptr %link
  store ptr %record, ptr %records
  ret void
}

; Undo the last nhf_py_sim_keeper_own of %record (its node could not be added).
define void @nhf_py_sim_keeper_disown(ptr %keeper, ptr %record) {
  %records = getelementptr inbounds %nhf.sim.keeper, ptr %keeper, i32 0, i32 1
  %link = call ptr @nhf.record.next(ptr %record)
  %following = load ptr, ptr %link
  store ptr %following, ptr %records
  store ptr null, ptr %link
  ret void
}

define void @nhf_sim_keeper_acquire(ptr %keeper) {
  %refs = getelementptr inbounds %nhf.sim.keeper, ptr %keeper, i32 0, i32 0
  %before = atomicrmw add ptr %refs, i64 1 seq_cst
  ret void
}

; Drop one reference; the last one completes the records and frees the keeper.
; Also the last item of every replay (a device item, after the graph's work).
define void @nhf_sim_keeper_release(ptr %keeper) {
entry:
  %refs = getelementptr inbounds %nhf.sim.keeper, ptr %keeper, i32 0, i32 0
  %before = atomicrmw sub ptr %refs, i64 1 seq_cst
  %last = icmp eq i64 %before, 1
  br i1 %last, label %release, label %done
release:
  %records = getelementptr inbounds %nhf.sim.keeper, ptr %keeper, i32 0, i32 1
  %head = load ptr, ptr %records
  br label %loop
loop:
  %record = phi ptr [ %head, %release ], [ %following, %complete ]
  %end = icmp eq ptr %record, null
  br i1 %end, label %free, label %complete
complete:
  %link = call ptr @nhf.record.next(ptr %record)
  %following = load ptr, ptr %link
  call void @nhf.complete(ptr %record)
  br label %loop
free:
  call void @free(ptr %keeper)
  br label %done
done:
  ret void
}
