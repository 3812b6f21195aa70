; The HostExecutor: stream-ordered host work on a pool of native threads,
; through stream memory operations instead of the driver's host-function thread.
;
; Each stream served by a pool has a *lane*: two 32-bit words in pinned,
; device-mapped host memory, "reached" and "done", and a FIFO of *tasks*
; numbered 1, 2, 3, ...  Enqueueing task k puts on the stream a write of k to
; "reached", then a wait until "done" >= k (a cyclic comparison: wrap-around is
; harmless).  A pool thread that sees reached != done claims the lane's first
; task, runs trampoline(record) and writes k to "done"; the stream goes on.
; Tasks of different lanes run on different threads at once; a lane's tasks
; run one after another, as the stream orders them.
;
; Waiting: a thread spins while tasks are outstanding (enqueued, not done) for
; up to spin_ns since its last task, then polls every poll_ns; with nothing
; outstanding it parks on a condition variable, and an enqueue wakes it.
;
; The invariant above all (LIFETIME.md, invariant 15): every "reached" gets its
; "done".  A task's trampoline always returns (a Python callable is skipped
; once the interpreter guard is closed, an exception is reported), and the
; pool's threads end only when nothing is outstanding.

%nhf.exec.task = type {
  ptr,  ; next
  i64,  ; seq: the number written to "reached" for it
  ptr,  ; trampoline
  ptr   ; record
}

%nhf.exec.lane = type {
  ptr,                 ; next lane of the pool (appended under the pool's mutex)
  ptr,                 ; stream: the handle the stream operations go to
  ptr,                 ; words: i32 reached, then i32 done
  ptr,                 ; pool
  [32 x i8],           ; to 64 bytes: the fields above, which spinning threads
                       ; read, do not share a cache line with those below,
                       ; which the producer writes at each enqueue
  %nhf.pthread.mutex,  ; fifo_mutex: guards head, tail
  ptr,                 ; head
  ptr,                 ; tail
  i32,                 ; claimed: a thread runs the head task (set by compare-and-swap)
  i32,                 ; seq: the last number given (under enqueue_mutex)
  %nhf.pthread.mutex   ; enqueue_mutex: one producer at a time per lane
}

%nhf.exec.pool = type {
  ptr,                 ; lanes
  ptr,                 ; slots: graph slots (appended under mutex, never removed)
  ptr,                 ; job: the parallel copy being shared out, or null
  i64,                 ; spin_ns
  i64,                 ; poll_ns
  ptr,                 ; threads: pthread_t[nthreads]
  i64,                 ; nthreads
  [8 x i8],            ; to 64 bytes: the fields above, which spinning threads
                       ; read at every turn, do not share a cache line with
                       ; those below, which the producer writes at each enqueue
  i64,                 ; outstanding: tasks enqueued and not done
  i32,                 ; stopping
  i32,                 ; parked: threads waiting on wake
  i64,                 ; live_slots: slots armed (their graphs are alive)
  i32,                 ; poller: a thread polls the slots for a replay (the others park)
  %nhf.pthread.mutex,  ; mutex: guards lanes (append), parking, job
  %nhf.pthread.cond    ; wake: parked threads
}

; A simulated stream memory operation: its word and value.
%nhf.exec.word_op = type { ptr, i64 }

; A graph slot: the words of one executor node in a CUDA graph.  The graph
; holds three stream memory operations on them, replayed as they are: write
; reached := 1, wait until done >= 1, write done := 0.  A pool thread that
; sees reached == 1 swaps it back to 0, runs fn(arg) and writes done := 1.
; Armed while the graph lives (its record releases the slot: LIFETIME.md,
; invariant 16); a disarmed slot is reused for a later node.
%nhf.exec.slot = type {
  ptr,                        ; next slot of the pool
  ptr,                        ; words: i32 reached, then i32 done
  ptr,                        ; fn
  ptr,                        ; arg
  i32,                        ; live: armed
  i32,                        ; copy: run the pool's parallel copy of arg, not fn(arg)
  ptr,                        ; pool
  [3 x %nhf.exec.word_op]     ; the simulator's node arguments, in graph order
}

; A large copy shared among the pool's threads, chunk by chunk.
%nhf.exec.job = type {
  ptr,  ; dst
  ptr,  ; src
  i64,  ; nbytes
  i64,  ; chunk: bytes per chunk
  i64,  ; nchunks
  i64,  ; next: the next chunk to take (atomic)
  i64,  ; finished: chunks copied (atomic)
  i64   ; helpers: threads other than the owner inside the job (atomic)
}

%nhf.timespec = type { i64, i64 }

@nhf.exec.task.bytes = internal constant i64 ptrtoint (ptr getelementptr (%nhf.exec.task, ptr null, i32 1) to i64)
@nhf.exec.lane.bytes = internal constant i64 ptrtoint (ptr getelementptr (%nhf.exec.lane, ptr null, i32 1) to i64)
@nhf.exec.job.bytes = internal constant i64 ptrtoint (ptr getelementptr (%nhf.exec.job, ptr null, i32 1) to i64)
@nhf.exec.slot.bytes = internal constant i64 ptrtoint (ptr getelementptr (%nhf.exec.slot, ptr null, i32 1) to i64)
@nhf.exec.pool.bytes = internal constant i64 ptrtoint (ptr getelementptr (%nhf.exec.pool, ptr null, i32 1) to i64)
@nhf.exec.parallel_copy_min = internal constant i64 1048576  ; below 1 MiB, one thread copies
@nhf.cu.write_value32 = internal global ptr null
@nhf.cu.wait_value32 = internal global ptr null
@nhf.cu.batch_mem_op = internal global ptr null  ; null: two calls, never a batch
@nhf.cu.wait_geq = internal constant i32 0     ; CU_STREAM_WAIT_VALUE_GEQ
@nhf.cu.write_default = internal constant i32 0 ; CU_STREAM_WRITE_VALUE_DEFAULT: after prior work
@nhf.cu.op_wait_value32 = internal constant i32 1   ; CU_STREAM_MEM_OP_WAIT_VALUE_32
@nhf.cu.op_write_value32 = internal constant i32 2  ; CU_STREAM_MEM_OP_WRITE_VALUE_32
@nhf.cu.error_not_supported = internal constant i32 801  ; CUDA_ERROR_NOT_SUPPORTED

; One entry of cuStreamBatchMemOp's array (CUstreamBatchMemOpParams, a 48-byte
; union), as its writeValue and waitValue members lay it out.
%nhf.cu.mem_op = type {
  i32,      ; operation: CU_STREAM_MEM_OP_*
  i64,      ; address (CUdeviceptr)
  i64,      ; value: a 32-bit value in the low half (the union's value member)
  i32,      ; flags
  i64,      ; alias: unused, 0
  [8 x i8]  ; to the union's 48 bytes
}

define void @nhf_set_cuda_memops(ptr %write_value32, ptr %wait_value32, ptr %batch_mem_op) {
  store atomic ptr %write_value32, ptr @nhf.cu.write_value32 seq_cst, align 8
  store atomic ptr %wait_value32, ptr @nhf.cu.wait_value32 seq_cst, align 8
  store atomic ptr %batch_mem_op, ptr @nhf.cu.batch_mem_op seq_cst, align 8
  ret void
}

; Fill one entry of a cuStreamBatchMemOp array (zeroed by the caller).
define internal void @nhf.cu.mem_op.set(ptr %op, i32 %operation, ptr %address, i32 %value, i32 %flags) alwaysinline {
  %opp = getelementptr inbounds %nhf.cu.mem_op, ptr %op, i32 0, i32 0
  store i32 %operation, ptr %opp
  %addressp = getelementptr inbounds %nhf.cu.mem_op, ptr %op, i32 0, i32 1
  %address64 = ptrtoint ptr %address to i64
  store i64 %address64, ptr %addressp
  %valuep = getelementptr inbounds %nhf.cu.mem_op, ptr %op, i32 0, i32 2
  %value64 = zext i32 %value to i64
  store i64 %value64, ptr %valuep
  %flagsp = getelementptr inbounds %nhf.cu.mem_op, ptr %op, i32 0, i32 3
  store i32 %flags, ptr %flagsp
  ret void
}

; ---- field accessors ----

define internal ptr @nhf.exec.task.next(ptr %t) alwaysinline {
  %f = getelementptr inbounds %nhf.exec.task, ptr %t, i32 0, i32 0
  ret ptr %f
}
define internal ptr @nhf.exec.task.seq(ptr %t) alwaysinline {
  %f = getelementptr inbounds %nhf.exec.task, ptr %t, i32 0, i32 1
  ret ptr %f
}
define internal ptr @nhf.exec.task.trampoline(ptr %t) alwaysinline {
  %f = getelementptr inbounds %nhf.exec.task, ptr %t, i32 0, i32 2
  ret ptr %f
}
define internal ptr @nhf.exec.task.record(ptr %t) alwaysinline {
  %f = getelementptr inbounds %nhf.exec.task, ptr %t, i32 0, i32 3
  ret ptr %f
}

define internal ptr @nhf.exec.lane.next(ptr %l) alwaysinline {
  %f = getelementptr inbounds %nhf.exec.lane, ptr %l, i32 0, i32 0
  ret ptr %f
}
define internal ptr @nhf.exec.lane.stream(ptr %l) alwaysinline {
  %f = getelementptr inbounds %nhf.exec.lane, ptr %l, i32 0, i32 1
  ret ptr %f
}
define internal ptr @nhf.exec.lane.reached(ptr %l) alwaysinline {
  %wordsp = getelementptr inbounds %nhf.exec.lane, ptr %l, i32 0, i32 2
  %words = load ptr, ptr %wordsp
  ret ptr %words
}
define internal ptr @nhf.exec.lane.done(ptr %l) alwaysinline {
  %wordsp = getelementptr inbounds %nhf.exec.lane, ptr %l, i32 0, i32 2
  %words = load ptr, ptr %wordsp
  %f = getelementptr inbounds i32, ptr %words, i64 1
  ret ptr %f
}
define internal ptr @nhf.exec.lane.fifo_mutex(ptr %l) alwaysinline {
  %f = getelementptr inbounds %nhf.exec.lane, ptr %l, i32 0, i32 5
  ret ptr %f
}
define internal ptr @nhf.exec.lane.head(ptr %l) alwaysinline {
  %f = getelementptr inbounds %nhf.exec.lane, ptr %l, i32 0, i32 6
  ret ptr %f
}
define internal ptr @nhf.exec.lane.tail(ptr %l) alwaysinline {
  %f = getelementptr inbounds %nhf.exec.lane, ptr %l, i32 0, i32 7
  ret ptr %f
}
define internal ptr @nhf.exec.lane.claimed(ptr %l) alwaysinline {
  %f = getelementptr inbounds %nhf.exec.lane, ptr %l, i32 0, i32 8
  ret ptr %f
}
define internal ptr @nhf.exec.lane.seq(ptr %l) alwaysinline {
  %f = getelementptr inbounds %nhf.exec.lane, ptr %l, i32 0, i32 9
  ret ptr %f
}
define internal ptr @nhf.exec.lane.enqueue_mutex(ptr %l) alwaysinline {
  %f = getelementptr inbounds %nhf.exec.lane, ptr %l, i32 0, i32 10
  ret ptr %f
}
define internal ptr @nhf.exec.lane.pool(ptr %l) alwaysinline {
  %f = getelementptr inbounds %nhf.exec.lane, ptr %l, i32 0, i32 3
  ret ptr %f
}

define internal ptr @nhf.exec.pool.mutex(ptr %p) alwaysinline {
  %f = getelementptr inbounds %nhf.exec.pool, ptr %p, i32 0, i32 13
  ret ptr %f
}
define internal ptr @nhf.exec.pool.wake(ptr %p) alwaysinline {
  %f = getelementptr inbounds %nhf.exec.pool, ptr %p, i32 0, i32 14
  ret ptr %f
}
define internal ptr @nhf.exec.pool.lanes(ptr %p) alwaysinline {
  %f = getelementptr inbounds %nhf.exec.pool, ptr %p, i32 0, i32 0
  ret ptr %f
}
define internal ptr @nhf.exec.pool.outstanding(ptr %p) alwaysinline {
  %f = getelementptr inbounds %nhf.exec.pool, ptr %p, i32 0, i32 8
  ret ptr %f
}
define internal ptr @nhf.exec.pool.stopping(ptr %p) alwaysinline {
  %f = getelementptr inbounds %nhf.exec.pool, ptr %p, i32 0, i32 9
  ret ptr %f
}
define internal ptr @nhf.exec.pool.parked(ptr %p) alwaysinline {
  %f = getelementptr inbounds %nhf.exec.pool, ptr %p, i32 0, i32 10
  ret ptr %f
}
define internal ptr @nhf.exec.pool.spin_ns(ptr %p) alwaysinline {
  %f = getelementptr inbounds %nhf.exec.pool, ptr %p, i32 0, i32 3
  ret ptr %f
}
define internal ptr @nhf.exec.pool.poll_ns(ptr %p) alwaysinline {
  %f = getelementptr inbounds %nhf.exec.pool, ptr %p, i32 0, i32 4
  ret ptr %f
}
define internal ptr @nhf.exec.pool.threads(ptr %p) alwaysinline {
  %f = getelementptr inbounds %nhf.exec.pool, ptr %p, i32 0, i32 5
  ret ptr %f
}
define internal ptr @nhf.exec.pool.nthreads(ptr %p) alwaysinline {
  %f = getelementptr inbounds %nhf.exec.pool, ptr %p, i32 0, i32 6
  ret ptr %f
}
define internal ptr @nhf.exec.pool.job(ptr %p) alwaysinline {
  %f = getelementptr inbounds %nhf.exec.pool, ptr %p, i32 0, i32 2
  ret ptr %f
}
define internal ptr @nhf.exec.pool.slots(ptr %p) alwaysinline {
  %f = getelementptr inbounds %nhf.exec.pool, ptr %p, i32 0, i32 1
  ret ptr %f
}
define internal ptr @nhf.exec.pool.live_slots(ptr %p) alwaysinline {
  %f = getelementptr inbounds %nhf.exec.pool, ptr %p, i32 0, i32 11
  ret ptr %f
}
define internal ptr @nhf.exec.pool.poller(ptr %p) alwaysinline {
  %f = getelementptr inbounds %nhf.exec.pool, ptr %p, i32 0, i32 12
  ret ptr %f
}

define internal ptr @nhf.exec.slot.next(ptr %s) alwaysinline {
  %f = getelementptr inbounds %nhf.exec.slot, ptr %s, i32 0, i32 0
  ret ptr %f
}
define internal ptr @nhf.exec.slot.reached(ptr %s) alwaysinline {
  %wordsp = getelementptr inbounds %nhf.exec.slot, ptr %s, i32 0, i32 1
  %words = load ptr, ptr %wordsp
  ret ptr %words
}
define internal ptr @nhf.exec.slot.done(ptr %s) alwaysinline {
  %wordsp = getelementptr inbounds %nhf.exec.slot, ptr %s, i32 0, i32 1
  %words = load ptr, ptr %wordsp
  %f = getelementptr inbounds i32, ptr %words, i64 1
  ret ptr %f
}
define internal ptr @nhf.exec.slot.fn(ptr %s) alwaysinline {
  %f = getelementptr inbounds %nhf.exec.slot, ptr %s, i32 0, i32 2
  ret ptr %f
}
define internal ptr @nhf.exec.slot.arg(ptr %s) alwaysinline {
  %f = getelementptr inbounds %nhf.exec.slot, ptr %s, i32 0, i32 3
  ret ptr %f
}
define internal ptr @nhf.exec.slot.live(ptr %s) alwaysinline {
  %f = getelementptr inbounds %nhf.exec.slot, ptr %s, i32 0, i32 4
  ret ptr %f
}
define internal ptr @nhf.exec.slot.copy(ptr %s) alwaysinline {
  %f = getelementptr inbounds %nhf.exec.slot, ptr %s, i32 0, i32 5
  ret ptr %f
}
define internal ptr @nhf.exec.slot.pool(ptr %s) alwaysinline {
  %f = getelementptr inbounds %nhf.exec.slot, ptr %s, i32 0, i32 6
  ret ptr %f
}
define internal ptr @nhf.exec.slot.op(ptr %s, i32 %i) alwaysinline {
  %f = getelementptr inbounds %nhf.exec.slot, ptr %s, i32 0, i32 7, i32 %i
  ret ptr %f
}

; The job's fields are all eight bytes wide: field %i of %nhf.exec.job.
define internal ptr @nhf.exec.job.field(ptr %j, i32 %i) alwaysinline {
  %f = getelementptr inbounds i64, ptr %j, i32 %i
  ret ptr %f
}

; ---- time ----

define internal i64 @nhf.now_ns() {
  %ts = alloca %nhf.timespec, align 8
  %rc = call i32 @clock_gettime(i32 1, ptr %ts)  ; CLOCK_MONOTONIC
  %secp = getelementptr inbounds %nhf.timespec, ptr %ts, i32 0, i32 0
  %nsecp = getelementptr inbounds %nhf.timespec, ptr %ts, i32 0, i32 1
  %sec = load i64, ptr %secp
  %nsec = load i64, ptr %nsecp
  %ns = mul i64 %sec, 1000000000
  %total = add i64 %ns, %nsec
  ret i64 %total
}

define internal void @nhf.sleep_ns(i64 %ns) {
  %ts = alloca %nhf.timespec, align 8
  %secp = getelementptr inbounds %nhf.timespec, ptr %ts, i32 0, i32 0
  %nsecp = getelementptr inbounds %nhf.timespec, ptr %ts, i32 0, i32 1
  %sec = udiv i64 %ns, 1000000000
  %nsec = urem i64 %ns, 1000000000
  store i64 %sec, ptr %secp
  store i64 %nsec, ptr %nsecp
  %rc = call i32 @nanosleep(ptr %ts, ptr null)
  ret void
}

; ---- the pool's threads ----

; Wake parked threads (after outstanding was raised).
define internal void @nhf.exec.wake(ptr %pool) {
entry:
  %parkedp = call ptr @nhf.exec.pool.parked(ptr %pool)
  %parked = load atomic i32, ptr %parkedp seq_cst, align 4
  %any = icmp ne i32 %parked, 0
  br i1 %any, label %wake, label %done
wake:
  %mutex = call ptr @nhf.exec.pool.mutex(ptr %pool)
  %wakep = call ptr @nhf.exec.pool.wake(ptr %pool)
  %l = call i32 @pthread_mutex_lock(ptr %mutex)
  %b = call i32 @pthread_cond_broadcast(ptr %wakep)
  %u = call i32 @pthread_mutex_unlock(ptr %mutex)
  br label %done
done:
  ret void
}

; Claim the first task of a lane whose stream has reached it; null if none.
define internal ptr @nhf.exec.claim(ptr %pool, ptr %lane_out) {
entry:
  %lanesp = call ptr @nhf.exec.pool.lanes(ptr %pool)
  %first = load atomic ptr, ptr %lanesp seq_cst, align 8
  br label %scan
scan:
  %lane = phi ptr [ %first, %entry ], [ %following, %next_lane ]
  %end = icmp eq ptr %lane, null
  br i1 %end, label %none, label %look
look:
  ; Fast path without a lock: reached == done means nothing is waiting here.
  %reachedp = call ptr @nhf.exec.lane.reached(ptr %lane)
  %donep = call ptr @nhf.exec.lane.done(ptr %lane)
  %reached = load atomic volatile i32, ptr %reachedp seq_cst, align 4
  %done = load atomic volatile i32, ptr %donep seq_cst, align 4
  %idle = icmp eq i32 %reached, %done
  br i1 %idle, label %next_lane, label %busy_hint
busy_hint:
  ; One thread claims a lane, the others move on: a compare-and-swap of the
  ; claimed flag, so that spinning threads do not all rush the lane's lock
  ; (or the producer appending under it) when the stream reaches a task.
  %claimedp = call ptr @nhf.exec.lane.claimed(ptr %lane)
  %claimed_hint = load atomic i32, ptr %claimedp monotonic, align 4
  %running = icmp ne i32 %claimed_hint, 0
  br i1 %running, label %next_lane, label %try_claim
try_claim:
  %swap = cmpxchg ptr %claimedp, i32 0, i32 1 acquire monotonic
  %won = extractvalue { i32, i1 } %swap, 1
  br i1 %won, label %lock, label %next_lane
lock:
  %mutex = call ptr @nhf.exec.lane.fifo_mutex(ptr %lane)
  %l = call i32 @pthread_mutex_lock(ptr %mutex)
  %headp = call ptr @nhf.exec.lane.head(ptr %lane)
  %head = load ptr, ptr %headp
  %empty = icmp eq ptr %head, null
  br i1 %empty, label %unclaim, label %check_reached
check_reached:
  %seqp = call ptr @nhf.exec.task.seq(ptr %head)
  %seq = load i64, ptr %seqp
  %seq32 = trunc i64 %seq to i32
  %ahead = sub i32 %reached, %seq32
  %is_reached = icmp sge i32 %ahead, 0  ; cyclic: (int32)(reached - seq) >= 0
  br i1 %is_reached, label %take, label %unclaim
take:
  %u1 = call i32 @pthread_mutex_unlock(ptr %mutex)
  store ptr %lane, ptr %lane_out
  ret ptr %head
unclaim:
  store atomic i32 0, ptr %claimedp release, align 4
  %u2 = call i32 @pthread_mutex_unlock(ptr %mutex)
  br label %next_lane
next_lane:
  %nextp = call ptr @nhf.exec.lane.next(ptr %lane)
  %following = load atomic ptr, ptr %nextp seq_cst, align 8
  br label %scan
none:
  ret ptr null
}

; Run a claimed task, write its "done", and retire it.
define internal void @nhf.exec.run(ptr %pool, ptr %lane, ptr %task) {
entry:
  %trampolinep = call ptr @nhf.exec.task.trampoline(ptr %task)
  %trampoline = load ptr, ptr %trampolinep
  %recordp = call ptr @nhf.exec.task.record(ptr %task)
  %record = load ptr, ptr %recordp
  call void %trampoline(ptr %record)
  %seqp = call ptr @nhf.exec.task.seq(ptr %task)
  %seq = load i64, ptr %seqp
  %seq32 = trunc i64 %seq to i32
  %donep = call ptr @nhf.exec.lane.done(ptr %lane)
  fence seq_cst  ; the task's writes before "done"
  store atomic volatile i32 %seq32, ptr %donep seq_cst, align 4
  %mutex = call ptr @nhf.exec.lane.fifo_mutex(ptr %lane)
  %l = call i32 @pthread_mutex_lock(ptr %mutex)
  %headp = call ptr @nhf.exec.lane.head(ptr %lane)
  %nextp = call ptr @nhf.exec.task.next(ptr %task)
  %next = load ptr, ptr %nextp
  store ptr %next, ptr %headp
  %last = icmp eq ptr %next, null
  br i1 %last, label %clear_tail, label %unclaim
clear_tail:
  %tailp = call ptr @nhf.exec.lane.tail(ptr %lane)
  store ptr null, ptr %tailp
  br label %unclaim
unclaim:
  %claimedp = call ptr @nhf.exec.lane.claimed(ptr %lane)
  store atomic i32 0, ptr %claimedp release, align 4
  %u = call i32 @pthread_mutex_unlock(ptr %mutex)
  call void @free(ptr %task)
  %outstandingp = call ptr @nhf.exec.pool.outstanding(ptr %pool)
  %before = atomicrmw sub ptr %outstandingp, i64 1 seq_cst
  ret void
}

; Copy chunks of %job until none is left; returns when this thread's share is done.
define internal void @nhf.exec.copy_chunks(ptr %job) {
entry:
  %dstp = call ptr @nhf.exec.job.field(ptr %job, i32 0)
  %srcp = call ptr @nhf.exec.job.field(ptr %job, i32 1)
  %nbytesp = call ptr @nhf.exec.job.field(ptr %job, i32 2)
  %chunkp = call ptr @nhf.exec.job.field(ptr %job, i32 3)
  %nchunksp = call ptr @nhf.exec.job.field(ptr %job, i32 4)
  %nextp = call ptr @nhf.exec.job.field(ptr %job, i32 5)
  %finishedp = call ptr @nhf.exec.job.field(ptr %job, i32 6)
  %dst = load ptr, ptr %dstp
  %src = load ptr, ptr %srcp
  %nbytes = load i64, ptr %nbytesp
  %chunk = load i64, ptr %chunkp
  %nchunks = load i64, ptr %nchunksp
  br label %take
take:
  %i = atomicrmw add ptr %nextp, i64 1 seq_cst
  %more = icmp ult i64 %i, %nchunks
  br i1 %more, label %copy, label %done
copy:
  %offset = mul i64 %i, %chunk
  %left = sub i64 %nbytes, %offset
  %short = icmp ult i64 %left, %chunk
  %size = select i1 %short, i64 %left, i64 %chunk
  %d = getelementptr i8, ptr %dst, i64 %offset
  %s = getelementptr i8, ptr %src, i64 %offset
  call void @nhf.exec.stream_copy(ptr %d, ptr %s, i64 %size)
  %f = atomicrmw add ptr %finishedp, i64 1 seq_cst
  br label %take
done:
  ret void
}

; A chunk of a shared-out copy, with streaming (non-temporal) stores, which do
; not read the destination into the cache first.  libc's memcpy streams only
; above its own size threshold (glibc's x86_non_temporal_threshold: 240 MiB on
; a 2-core EPYC VM), and a copy shared out in chunks below it wrote through the
; cache: about 1.5x the memory traffic, so a second thread added almost nothing
; (measured on that VM; the H200 machine's figures fit a threshold between 128
; and 256 MiB).  The head up to 64-byte alignment of %d and the tail go through
; memcpy; the fence orders the streaming stores before "finished".
define internal void @nhf.exec.stream_copy(ptr %d, ptr %s, i64 %n) {
entry:
  %small = icmp ult i64 %n, 4096
  br i1 %small, label %plain, label %align
plain:
  %r0 = call ptr @memcpy(ptr %d, ptr %s, i64 %n)
  ret void
align:
  %da = ptrtoint ptr %d to i64
  %mis = and i64 %da, 63
  %gap = sub i64 64, %mis
  %head = and i64 %gap, 63
  %r1 = call ptr @memcpy(ptr %d, ptr %s, i64 %head)
  %d1 = getelementptr i8, ptr %d, i64 %head
  %s1 = getelementptr i8, ptr %s, i64 %head
  %rest = sub i64 %n, %head
  %steps = lshr i64 %rest, 7  ; 128 bytes a step
  br label %loop
loop:
  %k = phi i64 [ 0, %align ], [ %k1, %body ]
  %more = icmp ult i64 %k, %steps
  br i1 %more, label %body, label %tail
body:
  %off = shl i64 %k, 7
  %sp = getelementptr i8, ptr %s1, i64 %off
  %dp = getelementptr i8, ptr %d1, i64 %off
  %sp1 = getelementptr i8, ptr %sp, i64 64
  %dp1 = getelementptr i8, ptr %dp, i64 64
  %v0 = load <8 x i64>, ptr %sp, align 1
  %v1 = load <8 x i64>, ptr %sp1, align 1
  store <8 x i64> %v0, ptr %dp, align 64, !nontemporal !{i32 1}
  store <8 x i64> %v1, ptr %dp1, align 64, !nontemporal !{i32 1}
  %k1 = add i64 %k, 1
  br label %loop
tail:
  %body_bytes = shl i64 %steps, 7
  %left = sub i64 %rest, %body_bytes
  %dt = getelementptr i8, ptr %d1, i64 %body_bytes
  %st = getelementptr i8, ptr %s1, i64 %body_bytes
  %r2 = call ptr @memcpy(ptr %dt, ptr %st, i64 %left)
  fence seq_cst
  ret void
}

; A helper thread joins the pool's current job, if it has chunks left to take
; (true if it helped).  A job whose chunks are all taken stays posted until its
; owner has seen them finished: joining it again would only contend for the
; mutex that the owner needs to withdraw it.
define internal i1 @nhf.exec.help(ptr %pool) {
entry:
  %jobp = call ptr @nhf.exec.pool.job(ptr %pool)
  %hint = load atomic ptr, ptr %jobp seq_cst, align 8
  %none = icmp eq ptr %hint, null
  br i1 %none, label %no, label %lock
lock:
  %mutex = call ptr @nhf.exec.pool.mutex(ptr %pool)
  %l = call i32 @pthread_mutex_lock(ptr %mutex)
  %job = load atomic ptr, ptr %jobp seq_cst, align 8
  %gone = icmp eq ptr %job, null
  br i1 %gone, label %unlock_no, label %look
look:
  %nextp = call ptr @nhf.exec.job.field(ptr %job, i32 5)
  %next = load atomic i64, ptr %nextp seq_cst, align 8
  %nchunksp = call ptr @nhf.exec.job.field(ptr %job, i32 4)
  %nchunks = load i64, ptr %nchunksp
  %left = icmp ult i64 %next, %nchunks
  br i1 %left, label %join, label %unlock_no
unlock_no:
  %u0 = call i32 @pthread_mutex_unlock(ptr %mutex)
  br label %no
join:
  %helpersp = call ptr @nhf.exec.job.field(ptr %job, i32 7)
  %h = atomicrmw add ptr %helpersp, i64 1 seq_cst
  %u1 = call i32 @pthread_mutex_unlock(ptr %mutex)
  call void @nhf.exec.copy_chunks(ptr %job)
  %h2 = atomicrmw sub ptr %helpersp, i64 1 seq_cst
  ret i1 true
no:
  ret i1 false
}

; A copy task's trampoline: record.arg is MEMCPY_LAYOUT {dst, src, nbytes},
; record.fn the pool.
define void @nhf_exec_copy(ptr %record) {
  %poolp = call ptr @nhf.record.fn(ptr %record)
  %pool = load ptr, ptr %poolp
  %argp = call ptr @nhf.record.arg(ptr %record)
  %desc = load ptr, ptr %argp
  call void @nhf.exec.copy_run(ptr %pool, ptr %desc)
  call void @nhf.complete(ptr %record)
  ret void
}

; The copy of MEMCPY_LAYOUT %desc {dst, src, nbytes}: a large one is shared
; out to the pool's threads.
define internal void @nhf.exec.copy_run(ptr %pool, ptr %desc) {
entry:
  %dst = load ptr, ptr %desc
  %srcf = getelementptr inbounds i64, ptr %desc, i64 1
  %src = load ptr, ptr %srcf
  %nbf = getelementptr inbounds i64, ptr %desc, i64 2
  %nbytes = load i64, ptr %nbf
  %nthreadsp = call ptr @nhf.exec.pool.nthreads(ptr %pool)
  %nthreads = load i64, ptr %nthreadsp
  %min = load i64, ptr @nhf.exec.parallel_copy_min
  %small = icmp ult i64 %nbytes, %min
  %alone = icmp ule i64 %nthreads, 1
  %serial = or i1 %small, %alone
  br i1 %serial, label %copy_alone, label %share
share:
  %job = alloca %nhf.exec.job, align 8
  %job_bytes = load i64, ptr @nhf.exec.job.bytes
  call void @llvm.memset.p0.i64(ptr %job, i8 0, i64 %job_bytes, i1 false)
  %nchunks = mul i64 %nthreads, 4
  %per = udiv i64 %nbytes, %nchunks
  %per_up = add i64 %per, 4095
  %chunk = and i64 %per_up, -4096  ; whole pages, at least one
  %chunks_up = add i64 %nbytes, %chunk
  %chunks_up1 = sub i64 %chunks_up, 1
  %count = udiv i64 %chunks_up1, %chunk
  %f0 = call ptr @nhf.exec.job.field(ptr %job, i32 0)
  store ptr %dst, ptr %f0
  %f1 = call ptr @nhf.exec.job.field(ptr %job, i32 1)
  store ptr %src, ptr %f1
  %f2 = call ptr @nhf.exec.job.field(ptr %job, i32 2)
  store i64 %nbytes, ptr %f2
  %f3 = call ptr @nhf.exec.job.field(ptr %job, i32 3)
  store i64 %chunk, ptr %f3
  %f4 = call ptr @nhf.exec.job.field(ptr %job, i32 4)
  store i64 %count, ptr %f4
  %jobp = call ptr @nhf.exec.pool.job(ptr %pool)
  %mutex = call ptr @nhf.exec.pool.mutex(ptr %pool)
  %l = call i32 @pthread_mutex_lock(ptr %mutex)
  %swap = cmpxchg ptr %jobp, ptr null, ptr %job seq_cst seq_cst
  %posted = extractvalue { ptr, i1 } %swap, 1
  %u = call i32 @pthread_mutex_unlock(ptr %mutex)
  br i1 %posted, label %work, label %copy_alone
work:
  call void @nhf.exec.copy_chunks(ptr %job)
  %finishedp = call ptr @nhf.exec.job.field(ptr %job, i32 6)
  br label %wait_chunks
wait_chunks:
  %finished = load atomic i64, ptr %finishedp seq_cst, align 8
  %all = icmp eq i64 %finished, %count
  br i1 %all, label %withdraw, label %relax
relax:
  call void @nhf.cpu_relax()
  br label %wait_chunks
withdraw:
  %l2 = call i32 @pthread_mutex_lock(ptr %mutex)
  store atomic ptr null, ptr %jobp seq_cst, align 8
  %u2 = call i32 @pthread_mutex_unlock(ptr %mutex)
  %helpersp = call ptr @nhf.exec.job.field(ptr %job, i32 7)
  br label %wait_helpers
wait_helpers:
  %helpers = load atomic i64, ptr %helpersp seq_cst, align 8
  %left = icmp ne i64 %helpers, 0
  br i1 %left, label %relax2, label %finish
relax2:
  call void @nhf.cpu_relax()
  br label %wait_helpers
copy_alone:
  %r = call ptr @memcpy(ptr %dst, ptr %src, i64 %nbytes)
  br label %finish
finish:
  ret void
}

declare void @llvm.memset.p0.i64(ptr, i8, i64, i1)

; A graph slot whose replay has reached it (reached swapped back to 0); null if none.
define internal ptr @nhf.exec.claim_slot(ptr %pool) {
entry:
  %slotsp = call ptr @nhf.exec.pool.slots(ptr %pool)
  %first = load atomic ptr, ptr %slotsp seq_cst, align 8
  br label %scan
scan:
  %slot = phi ptr [ %first, %entry ], [ %following, %next_slot ]
  %end = icmp eq ptr %slot, null
  br i1 %end, label %none, label %look
look:
  %livep = call ptr @nhf.exec.slot.live(ptr %slot)
  %live = load atomic i32, ptr %livep acquire, align 4
  %armed = icmp ne i32 %live, 0
  br i1 %armed, label %check, label %next_slot
check:
  %reachedp = call ptr @nhf.exec.slot.reached(ptr %slot)
  %reached = load atomic volatile i32, ptr %reachedp seq_cst, align 4
  %is_reached = icmp eq i32 %reached, 1
  br i1 %is_reached, label %try_claim, label %next_slot
try_claim:
  %swap = cmpxchg volatile ptr %reachedp, i32 1, i32 0 seq_cst seq_cst
  %won = extractvalue { i32, i1 } %swap, 1
  br i1 %won, label %found, label %next_slot
found:
  ret ptr %slot
next_slot:
  %nextp = call ptr @nhf.exec.slot.next(ptr %slot)
  %following = load atomic ptr, ptr %nextp seq_cst, align 8
  br label %scan
none:
  ret ptr null
}

; Run a claimed slot's work, then write its "done" (the graph's wait goes on).
define internal void @nhf.exec.run_slot(ptr %pool, ptr %slot) {
entry:
  %copyp = call ptr @nhf.exec.slot.copy(ptr %slot)
  %copy = load i32, ptr %copyp
  %argp = call ptr @nhf.exec.slot.arg(ptr %slot)
  %arg = load ptr, ptr %argp
  %is_copy = icmp ne i32 %copy, 0
  br i1 %is_copy, label %copy_run, label %call
copy_run:
  call void @nhf.exec.copy_run(ptr %pool, ptr %arg)
  br label %answer
call:
  %fnp = call ptr @nhf.exec.slot.fn(ptr %slot)
  %fn = load ptr, ptr %fnp
  call void %fn(ptr %arg)
  br label %answer
answer:
  %donep = call ptr @nhf.exec.slot.done(ptr %slot)
  fence seq_cst  ; the work's writes before "done"
  store atomic volatile i32 1, ptr %donep seq_cst, align 4
  ret void
}

; A pool thread: claim and run reached tasks and slots; spin, poll or park in
; between.  It spins for spin_ns after its last work (or wake-up); then, with
; tasks outstanding, it polls every poll_ns.  With none outstanding but graph slots armed, a
; replay may reach a slot at any time and no enqueue announces it: one thread,
; the poller, polls every poll_ns (spinning first for spin_ns after work) and
; the others park; when the poller finds work it hands the role on and wakes
; the others, which spin for a while, so the rest of the replay finds them
; awake.  With neither, every thread parks until an enqueue or an armed slot
; wakes it.
define internal ptr @nhf.exec.thread_main(ptr %pool) {
entry:
  %lane_out = alloca ptr, align 8
  %me_poller = alloca i32, align 4
  store i32 0, ptr %me_poller
  %outstandingp = call ptr @nhf.exec.pool.outstanding(ptr %pool)
  %live_slotsp = call ptr @nhf.exec.pool.live_slots(ptr %pool)
  %pollerp = call ptr @nhf.exec.pool.poller(ptr %pool)
  %stoppingp = call ptr @nhf.exec.pool.stopping(ptr %pool)
  %spinp = call ptr @nhf.exec.pool.spin_ns(ptr %pool)
  %pollp = call ptr @nhf.exec.pool.poll_ns(ptr %pool)
  %spin_ns = load i64, ptr %spinp
  %poll_ns = load i64, ptr %pollp
  ; Sleep as long as asked, not the default 50 us longer (PR_SET_TIMERSLACK).
  %slack = call i32 (i32, ...) @prctl(i32 29, i64 1000, i64 0, i64 0, i64 0)
  %start = call i64 @nhf.now_ns()
  br label %loop
loop:
  %last_work = phi i64 [ %start, %entry ], [ %t_ran, %ran ], [ %last_work, %relaxed ], [ %last_work, %slept ], [ %t_woke, %woke ], [ %t_helped, %helped ]
  %helping = call i1 @nhf.exec.help(ptr %pool)
  br i1 %helping, label %helped, label %claim
helped:
  %t_helped = call i64 @nhf.now_ns()
  br label %loop
claim:
  %task = call ptr @nhf.exec.claim(ptr %pool, ptr %lane_out)
  %found = icmp ne ptr %task, null
  br i1 %found, label %run, label %claim_slot
run:
  call void @nhf.exec.hand_on(ptr %pool, ptr %me_poller)
  %lane = load ptr, ptr %lane_out
  call void @nhf.exec.run(ptr %pool, ptr %lane, ptr %task)
  br label %ran
claim_slot:
  %slot = call ptr @nhf.exec.claim_slot(ptr %pool)
  %found_slot = icmp ne ptr %slot, null
  br i1 %found_slot, label %run_slot, label %idle
run_slot:
  call void @nhf.exec.hand_on(ptr %pool, ptr %me_poller)
  call void @nhf.exec.run_slot(ptr %pool, ptr %slot)
  br label %ran
ran:
  %t_ran = call i64 @nhf.now_ns()
  br label %loop
idle:
  ; Spinning reads nothing that the producer writes (not even the count of
  ; outstanding tasks): only the words and the lanes' read-mostly fields.
  %now = call i64 @nhf.now_ns()
  %since = sub i64 %now, %last_work
  %spinning = icmp slt i64 %since, %spin_ns
  br i1 %spinning, label %relax, label %after_spin
after_spin:
  %outstanding = load atomic i64, ptr %outstandingp seq_cst, align 8
  %waiting = icmp sgt i64 %outstanding, 0
  br i1 %waiting, label %poll, label %graphs
graphs:
  %live = load atomic i64, ptr %live_slotsp seq_cst, align 8
  %armed = icmp sgt i64 %live, 0
  br i1 %armed, label %poll_or_park, label %nothing
poll_or_park:
  %am_poller = load i32, ptr %me_poller
  %is_poller = icmp ne i32 %am_poller, 0
  br i1 %is_poller, label %poll, label %become_poller
become_poller:
  %swap = cmpxchg ptr %pollerp, i32 0, i32 1 seq_cst seq_cst
  %won = extractvalue { i32, i1 } %swap, 1
  br i1 %won, label %now_poller, label %park
now_poller:
  store i32 1, ptr %me_poller
  br label %poll
relax:
  call void @nhf.cpu_relax()
  br label %relaxed
relaxed:
  br label %loop
poll:
  call void @nhf.sleep_ns(i64 %poll_ns)
  br label %slept
slept:
  br label %loop
nothing:
  call void @nhf.exec.hand_on(ptr %pool, ptr %me_poller)
  %stopping = load atomic i32, ptr %stoppingp seq_cst, align 4
  %stop = icmp ne i32 %stopping, 0
  br i1 %stop, label %quit, label %park
park:
  call void @nhf.exec.park(ptr %pool)
  br label %woke
woke:
  %t_woke = call i64 @nhf.now_ns()
  br label %loop
quit:
  call void @nhf.gil.forget()
  ret ptr null
}

; If this thread is the poller, give the role up and wake the parked threads
; (one of them becomes the poller; all of them spin for a while first).
define internal void @nhf.exec.hand_on(ptr %pool, ptr %me_poller) {
entry:
  %am_poller = load i32, ptr %me_poller
  %is_poller = icmp ne i32 %am_poller, 0
  br i1 %is_poller, label %hand, label %done
hand:
  store i32 0, ptr %me_poller
  %pollerp = call ptr @nhf.exec.pool.poller(ptr %pool)
  store atomic i32 0, ptr %pollerp seq_cst, align 4
  call void @nhf.exec.wake(ptr %pool)
  br label %done
done:
  ret void
}

; Wait on the pool's condition variable while there is nothing to do: no task
; outstanding, and no armed slot without a poller (when stopping: no slot armed).
define internal void @nhf.exec.park(ptr %pool) {
entry:
  %mutex = call ptr @nhf.exec.pool.mutex(ptr %pool)
  %wakep = call ptr @nhf.exec.pool.wake(ptr %pool)
  %parkedp = call ptr @nhf.exec.pool.parked(ptr %pool)
  %outstandingp = call ptr @nhf.exec.pool.outstanding(ptr %pool)
  %live_slotsp = call ptr @nhf.exec.pool.live_slots(ptr %pool)
  %pollerp = call ptr @nhf.exec.pool.poller(ptr %pool)
  %stoppingp = call ptr @nhf.exec.pool.stopping(ptr %pool)
  %l = call i32 @pthread_mutex_lock(ptr %mutex)
  %p0 = atomicrmw add ptr %parkedp, i32 1 seq_cst
  br label %check
check:
  %outstanding = load atomic i64, ptr %outstandingp seq_cst, align 8
  %work = icmp sgt i64 %outstanding, 0
  %live = load atomic i64, ptr %live_slotsp seq_cst, align 8
  %armed = icmp sgt i64 %live, 0
  %poller = load atomic i32, ptr %pollerp seq_cst, align 4
  %unpolled = icmp eq i32 %poller, 0
  %need_poller = and i1 %armed, %unpolled
  %stopping = load atomic i32, ptr %stoppingp seq_cst, align 4
  %stop = icmp ne i32 %stopping, 0
  %disarmed = xor i1 %armed, true
  %may_quit = and i1 %stop, %disarmed
  %either = or i1 %work, %need_poller
  %leave = or i1 %either, %may_quit
  br i1 %leave, label %done, label %wait
wait:
  %w = call i32 @pthread_cond_wait(ptr %wakep, ptr %mutex)
  br label %check
done:
  %p1 = atomicrmw sub ptr %parkedp, i32 1 seq_cst
  %u = call i32 @pthread_mutex_unlock(ptr %mutex)
  ret void
}

; ---- enqueue functions: i64 (lane, trampoline, record), without the GIL ----

; Give the task the next number of its lane; the caller holds the enqueue mutex.
define internal i32 @nhf.exec.next_seq(ptr %lane) {
  %seqp = call ptr @nhf.exec.lane.seq(ptr %lane)
  %seq = load i32, ptr %seqp
  %next = add i32 %seq, 1
  ret i32 %next
}

; Append a task numbered %seq, before its "reached" write goes on the stream:
; a thread that sees the write then finds the task in place, rather than
; retrying the lane's lock against the producer.  Returns the task, or null
; if there was no memory for it.
define internal ptr @nhf.exec.append(ptr %lane, i32 %seq, ptr %trampoline, ptr %record) {
entry:
  %size = load i64, ptr @nhf.exec.task.bytes
  %task = call ptr @malloc(i64 %size)
  %nomem = icmp eq ptr %task, null
  br i1 %nomem, label %fail, label %fill
fail:
  ret ptr null
fill:
  %nextp = call ptr @nhf.exec.task.next(ptr %task)
  store ptr null, ptr %nextp
  %seqp = call ptr @nhf.exec.task.seq(ptr %task)
  %seq64 = zext i32 %seq to i64
  store i64 %seq64, ptr %seqp
  %tp = call ptr @nhf.exec.task.trampoline(ptr %task)
  store ptr %trampoline, ptr %tp
  %rp = call ptr @nhf.exec.task.record(ptr %task)
  store ptr %record, ptr %rp
  %lane_seqp = call ptr @nhf.exec.lane.seq(ptr %lane)
  store i32 %seq, ptr %lane_seqp
  %mutex = call ptr @nhf.exec.lane.fifo_mutex(ptr %lane)
  %l = call i32 @pthread_mutex_lock(ptr %mutex)
  %tailp = call ptr @nhf.exec.lane.tail(ptr %lane)
  %tail = load ptr, ptr %tailp
  %empty = icmp eq ptr %tail, null
  br i1 %empty, label %first, label %link
first:
  %headp = call ptr @nhf.exec.lane.head(ptr %lane)
  store ptr %task, ptr %headp
  br label %linked
link:
  %tail_next = call ptr @nhf.exec.task.next(ptr %tail)
  store ptr %task, ptr %tail_next
  br label %linked
linked:
  store ptr %task, ptr %tailp
  %u = call i32 @pthread_mutex_unlock(ptr %mutex)
  %poolp = call ptr @nhf.exec.lane.pool(ptr %lane)
  %pool = load ptr, ptr %poolp
  %outstandingp = call ptr @nhf.exec.pool.outstanding(ptr %pool)
  %before = atomicrmw add ptr %outstandingp, i64 1 seq_cst
  call void @nhf.exec.wake(ptr %pool)
  ret ptr %task
}

; Take back the task just appended, whose "reached" write could not be
; enqueued (the caller holds the enqueue mutex, so it is the lane's last task;
; no thread claims it, since the stream never reaches it).
define internal void @nhf.exec.unlink(ptr %lane, ptr %task) {
entry:
  %mutex = call ptr @nhf.exec.lane.fifo_mutex(ptr %lane)
  %l = call i32 @pthread_mutex_lock(ptr %mutex)
  %headp = call ptr @nhf.exec.lane.head(ptr %lane)
  %tailp = call ptr @nhf.exec.lane.tail(ptr %lane)
  %head = load ptr, ptr %headp
  %alone = icmp eq ptr %head, %task
  br i1 %alone, label %empty, label %find
empty:
  store ptr null, ptr %headp
  store ptr null, ptr %tailp
  br label %unlinked
find:
  %before = phi ptr [ %head, %entry ], [ %after, %step ]
  %nextp = call ptr @nhf.exec.task.next(ptr %before)
  %after = load ptr, ptr %nextp
  %is_pred = icmp eq ptr %after, %task
  br i1 %is_pred, label %cut, label %step
step:
  br label %find
cut:
  store ptr null, ptr %nextp
  store ptr %before, ptr %tailp
  br label %unlinked
unlinked:
  %u = call i32 @pthread_mutex_unlock(ptr %mutex)
  %seqp = call ptr @nhf.exec.task.seq(ptr %task)
  %seq = load i64, ptr %seqp
  %seq32 = trunc i64 %seq to i32
  %previous = sub i32 %seq32, 1
  %lane_seqp = call ptr @nhf.exec.lane.seq(ptr %lane)
  store i32 %previous, ptr %lane_seqp
  call void @free(ptr %task)
  %poolp = call ptr @nhf.exec.lane.pool(ptr %lane)
  %pool = load ptr, ptr %poolp
  %outstandingp = call ptr @nhf.exec.pool.outstanding(ptr %pool)
  %o = atomicrmw sub ptr %outstandingp, i64 1 seq_cst
  ret void
}

; On a CUDA stream: refuse a capturing stream, append the task, write
; "reached", wait for "done" (one cuStreamBatchMemOp, or two calls if the batch
; is refused).  If the write fails the task is taken back; if the wait fails
; after the write was enqueued, the task still runs (the stream reaches the
; write): status kept | CUresult.
define i64 @nhf_exec_cuda_enqueue(ptr %lane, ptr %trampoline, ptr %record) {
entry:
  %streamp = call ptr @nhf.exec.lane.stream(ptr %lane)
  %stream = load ptr, ptr %streamp
  %capture_status = alloca i32, align 4
  %ops = alloca [2 x %nhf.cu.mem_op], align 8
  store i32 0, ptr %capture_status
  %is_capturing = load atomic ptr, ptr @nhf.cu.is_capturing seq_cst, align 8
  %rc0 = call i32 %is_capturing(ptr %stream, ptr %capture_status)
  %check_failed = icmp ne i32 %rc0, 0
  br i1 %check_failed, label %capture_check_failed, label %checked
capture_check_failed:
  %code0 = zext i32 %rc0 to i64
  %flag0 = load i64, ptr @nhf.status.capture_check_failed
  %status0 = or i64 %code0, %flag0
  ret i64 %status0
checked:
  %capture = load i32, ptr %capture_status
  %capturing = icmp ne i32 %capture, 0
  br i1 %capturing, label %refuse, label %lock
refuse:
  %refused = load i64, ptr @nhf.status.capturing
  ret i64 %refused
lock:
  %emutex = call ptr @nhf.exec.lane.enqueue_mutex(ptr %lane)
  %l = call i32 @pthread_mutex_lock(ptr %emutex)
  %seq = call i32 @nhf.exec.next_seq(ptr %lane)
  %task = call ptr @nhf.exec.append(ptr %lane, i32 %seq, ptr %trampoline, ptr %record)
  %nomem = icmp eq ptr %task, null
  br i1 %nomem, label %out_of_memory, label %batch
out_of_memory:
  %u0 = call i32 @pthread_mutex_unlock(ptr %emutex)
  %oom = load i64, ptr @nhf.status.out_of_memory
  ret i64 %oom
batch:
  ; Both operations in one driver call: cheaper to enqueue (1.1-1.6 us against
  ; 1.7-1.9 for the two calls, in two C probes on the H200) and, as the
  ; driver's documentation of cuStreamBatchMemOp says, to run.  A call the
  ; driver refuses enqueues nothing (the rule every step here relies on: a
  ; refused write is taken back); the two single calls then follow, so a
  ; driver without the batch still works and an error names its operation.
  %reached = call ptr @nhf.exec.lane.reached(ptr %lane)
  %done = call ptr @nhf.exec.lane.done(ptr %lane)
  %write_flags = load i32, ptr @nhf.cu.write_default
  %geq = load i32, ptr @nhf.cu.wait_geq
  %batchf = load atomic ptr, ptr @nhf.cu.batch_mem_op seq_cst, align 8
  %no_batch = icmp eq ptr %batchf, null
  br i1 %no_batch, label %write, label %batch_call
batch_call:
  store [2 x %nhf.cu.mem_op] zeroinitializer, ptr %ops
  %write_op = getelementptr inbounds [2 x %nhf.cu.mem_op], ptr %ops, i32 0, i32 0
  %wait_op = getelementptr inbounds [2 x %nhf.cu.mem_op], ptr %ops, i32 0, i32 1
  %op_write = load i32, ptr @nhf.cu.op_write_value32
  %op_wait = load i32, ptr @nhf.cu.op_wait_value32
  call void @nhf.cu.mem_op.set(ptr %write_op, i32 %op_write, ptr %reached, i32 %seq, i32 %write_flags)
  call void @nhf.cu.mem_op.set(ptr %wait_op, i32 %op_wait, ptr %done, i32 %seq, i32 %geq)
  %rcb = call i32 %batchf(ptr %stream, i32 2, ptr %ops, i32 0)
  %batched = icmp eq i32 %rcb, 0
  br i1 %batched, label %batch_ok, label %batch_refused
batch_ok:
  %ub = call i32 @pthread_mutex_unlock(ptr %emutex)
  ret i64 0
batch_refused:
  ; A driver without the batch says so once: later enqueues make two calls.
  %unsupported = load i32, ptr @nhf.cu.error_not_supported
  %lacks_batch = icmp eq i32 %rcb, %unsupported
  br i1 %lacks_batch, label %forget_batch, label %write
forget_batch:
  store atomic ptr null, ptr @nhf.cu.batch_mem_op seq_cst, align 8
  br label %write
write:
  %writef = load atomic ptr, ptr @nhf.cu.write_value32 seq_cst, align 8
  %rc1 = call i32 %writef(ptr %stream, ptr %reached, i32 %seq, i32 %write_flags)
  %write_failed = icmp ne i32 %rc1, 0
  br i1 %write_failed, label %fail_write, label %wait
fail_write:
  call void @nhf.exec.unlink(ptr %lane, ptr %task)
  %u1 = call i32 @pthread_mutex_unlock(ptr %emutex)
  %code1 = zext i32 %rc1 to i64
  ret i64 %code1
wait:
  %waitf = load atomic ptr, ptr @nhf.cu.wait_value32 seq_cst, align 8
  %rc2 = call i32 %waitf(ptr %stream, ptr %done, i32 %seq, i32 %geq)
  %u3 = call i32 @pthread_mutex_unlock(ptr %emutex)
  %wait_failed = icmp ne i32 %rc2, 0
  br i1 %wait_failed, label %fail_wait, label %ok
fail_wait:
  %code2 = zext i32 %rc2 to i64
  %kept = load i64, ptr @nhf.status.kept
  %status2 = or i64 %code2, %kept
  ret i64 %status2
ok:
  ret i64 0
}

; The simulator's stream operations: device items that write a word, or wait
; for one to reach a value (cyclic >=), polling (%nhf.exec.word_op).

; Write op.word := op.value (a graph node's argument: kept for the next replay).
define void @nhf_exec_sim_set(ptr %op) {
  %wordp = getelementptr inbounds %nhf.exec.word_op, ptr %op, i32 0, i32 0
  %valuep = getelementptr inbounds %nhf.exec.word_op, ptr %op, i32 0, i32 1
  %word = load ptr, ptr %wordp
  %value = load i64, ptr %valuep
  %v32 = trunc i64 %value to i32
  store atomic volatile i32 %v32, ptr %word seq_cst, align 4
  ret void
}

; Wait until op.word >= op.value (cyclic), polling.
define void @nhf_exec_sim_await(ptr %op) {
entry:
  %wordp = getelementptr inbounds %nhf.exec.word_op, ptr %op, i32 0, i32 0
  %valuep = getelementptr inbounds %nhf.exec.word_op, ptr %op, i32 0, i32 1
  %word = load ptr, ptr %wordp
  %value = load i64, ptr %valuep
  %v32 = trunc i64 %value to i32
  br label %check
check:
  %now = load atomic volatile i32, ptr %word seq_cst, align 4
  %ahead = sub i32 %now, %v32
  %there = icmp sge i32 %ahead, 0
  br i1 %there, label %done, label %nap
nap:
  %r = call i32 @usleep(i32 20)
  br label %check
done:
  ret void
}

; A stream's own operations: the same, then free the op.
define internal void @nhf.exec.sim_write(ptr %op) {
  call void @nhf_exec_sim_set(ptr %op)
  call void @free(ptr %op)
  ret void
}

define internal void @nhf.exec.sim_wait(ptr %op) {
  call void @nhf_exec_sim_await(ptr %op)
  call void @free(ptr %op)
  ret void
}

define internal ptr @nhf.exec.word_op(ptr %word, i32 %value) {
entry:
  %op = call ptr @malloc(i64 16)
  %nomem = icmp eq ptr %op, null
  br i1 %nomem, label %done, label %fill
fill:
  %wordp = getelementptr inbounds %nhf.exec.word_op, ptr %op, i32 0, i32 0
  store ptr %word, ptr %wordp
  %valuep = getelementptr inbounds %nhf.exec.word_op, ptr %op, i32 0, i32 1
  %v64 = zext i32 %value to i64
  store i64 %v64, ptr %valuep
  br label %done
done:
  ret ptr %op
}

; On a simulated stream: the same steps, as simulated device work.
define i64 @nhf_exec_sim_enqueue(ptr %lane, ptr %trampoline, ptr %record) {
entry:
  %streamp = call ptr @nhf.exec.lane.stream(ptr %lane)
  %stream = load ptr, ptr %streamp
  %emutex = call ptr @nhf.exec.lane.enqueue_mutex(ptr %lane)
  %oom = load i64, ptr @nhf.status.out_of_memory
  %l = call i32 @pthread_mutex_lock(ptr %emutex)
  %seq = call i32 @nhf.exec.next_seq(ptr %lane)
  %reached = call ptr @nhf.exec.lane.reached(ptr %lane)
  %write_op = call ptr @nhf.exec.word_op(ptr %reached, i32 %seq)
  %no_write_op = icmp eq ptr %write_op, null
  br i1 %no_write_op, label %out_of_memory, label %append
out_of_memory:
  %u0 = call i32 @pthread_mutex_unlock(ptr %emutex)
  ret i64 %oom
append:
  %task = call ptr @nhf.exec.append(ptr %lane, i32 %seq, ptr %trampoline, ptr %record)
  %no_task = icmp eq ptr %task, null
  br i1 %no_task, label %no_memory_for_task, label %write
no_memory_for_task:
  call void @free(ptr %write_op)
  br label %out_of_memory
write:
  %s1 = call i64 @nhf_sim_enqueue_device(ptr %stream, ptr @nhf.exec.sim_write, ptr %write_op)
  %write_failed = icmp ne i64 %s1, 0
  br i1 %write_failed, label %fail_write, label %wait
fail_write:
  call void @nhf.exec.unlink(ptr %lane, ptr %task)
  call void @free(ptr %write_op)
  %u1 = call i32 @pthread_mutex_unlock(ptr %emutex)
  ret i64 %s1
wait:
  %done = call ptr @nhf.exec.lane.done(ptr %lane)
  %wait_op = call ptr @nhf.exec.word_op(ptr %done, i32 %seq)
  %no_wait_op = icmp eq ptr %wait_op, null
  br i1 %no_wait_op, label %fail_wait, label %enqueue_wait
enqueue_wait:
  %s2 = call i64 @nhf_sim_enqueue_device(ptr %stream, ptr @nhf.exec.sim_wait, ptr %wait_op)
  %u3 = call i32 @pthread_mutex_unlock(ptr %emutex)
  %wait_failed = icmp ne i64 %s2, 0
  br i1 %wait_failed, label %fail_wait_enqueued, label %ok
fail_wait_enqueued:
  call void @free(ptr %wait_op)
  %kept1 = load i64, ptr @nhf.status.kept
  %status1 = or i64 %s2, %kept1
  ret i64 %status1
fail_wait:
  %u4 = call i32 @pthread_mutex_unlock(ptr %emutex)
  %kept2 = load i64, ptr @nhf.status.kept
  %status2 = or i64 %oom, %kept2
  ret i64 %status2
ok:
  ret i64 0
}

; ---- the pool's life, from Python through ctypes (without the GIL) ----

; A pool of %nthreads threads, started; null if that failed.
define ptr @nhf_exec_pool_new(i64 %nthreads, i64 %spin_ns, i64 %poll_ns) {
entry:
  ; Cache-line aligned (see the pool's layout), zeroed.
  %size = load i64, ptr @nhf.exec.pool.bytes
  %size63 = add i64 %size, 63
  %lines = and i64 %size63, -64
  %pool = call ptr @aligned_alloc(i64 64, i64 %lines)
  %nomem = icmp eq ptr %pool, null
  br i1 %nomem, label %fail, label %init
init:
  call void @llvm.memset.p0.i64(ptr %pool, i8 0, i64 %lines, i1 false)
  %threads = call ptr @calloc(i64 %nthreads, i64 8)
  %nothreads = icmp eq ptr %threads, null
  br i1 %nothreads, label %fail, label %fill
fill:
  %mutex = call ptr @nhf.exec.pool.mutex(ptr %pool)
  %wakep = call ptr @nhf.exec.pool.wake(ptr %pool)
  %a = call i32 @pthread_mutex_init(ptr %mutex, ptr null)
  %b = call i32 @pthread_cond_init(ptr %wakep, ptr null)
  %spinp = call ptr @nhf.exec.pool.spin_ns(ptr %pool)
  store i64 %spin_ns, ptr %spinp
  %pollp = call ptr @nhf.exec.pool.poll_ns(ptr %pool)
  store i64 %poll_ns, ptr %pollp
  %threadsp = call ptr @nhf.exec.pool.threads(ptr %pool)
  store ptr %threads, ptr %threadsp
  %nthreadsp = call ptr @nhf.exec.pool.nthreads(ptr %pool)
  store i64 %nthreads, ptr %nthreadsp
  br label %start
start:
  %i = phi i64 [ 0, %fill ], [ %i1, %started ]
  %more = icmp ult i64 %i, %nthreads
  br i1 %more, label %create, label %done
create:
  %tid = getelementptr inbounds i64, ptr %threads, i64 %i
  %rc = call i32 @pthread_create(ptr %tid, ptr null, ptr @nhf.exec.thread_main, ptr %pool)
  %failed = icmp ne i32 %rc, 0
  br i1 %failed, label %partial, label %started
started:
  %i1 = add i64 %i, 1
  br label %start
partial:
  ; Keep the threads that started: close them as a pool of %i threads.
  store i64 %i, ptr %nthreadsp
  call void @nhf_exec_pool_close(ptr %pool)
  br label %fail
fail:
  ret ptr null
done:
  ret ptr %pool
}

; A lane for %stream, its words at %words (two zeroed i32); added to the pool.
define ptr @nhf_exec_lane_new(ptr %pool, ptr %stream, ptr %words) {
entry:
  ; On a cache line of its own (see the lane's layout), zeroed.
  %size = load i64, ptr @nhf.exec.lane.bytes
  %size63 = add i64 %size, 63
  %lines = and i64 %size63, -64
  %lane = call ptr @aligned_alloc(i64 64, i64 %lines)
  %nomem = icmp eq ptr %lane, null
  br i1 %nomem, label %done, label %init
init:
  call void @llvm.memset.p0.i64(ptr %lane, i8 0, i64 %lines, i1 false)
  %streamp = call ptr @nhf.exec.lane.stream(ptr %lane)
  store ptr %stream, ptr %streamp
  %wordsp = getelementptr inbounds %nhf.exec.lane, ptr %lane, i32 0, i32 2
  store ptr %words, ptr %wordsp
  %poolp = call ptr @nhf.exec.lane.pool(ptr %lane)
  store ptr %pool, ptr %poolp
  %fm = call ptr @nhf.exec.lane.fifo_mutex(ptr %lane)
  %em = call ptr @nhf.exec.lane.enqueue_mutex(ptr %lane)
  %a = call i32 @pthread_mutex_init(ptr %fm, ptr null)
  %b = call i32 @pthread_mutex_init(ptr %em, ptr null)
  %mutex = call ptr @nhf.exec.pool.mutex(ptr %pool)
  %l = call i32 @pthread_mutex_lock(ptr %mutex)
  %lanesp = call ptr @nhf.exec.pool.lanes(ptr %pool)
  %first = load ptr, ptr %lanesp
  %nextp = call ptr @nhf.exec.lane.next(ptr %lane)
  store ptr %first, ptr %nextp
  store atomic ptr %lane, ptr %lanesp seq_cst, align 8
  %u = call i32 @pthread_mutex_unlock(ptr %mutex)
  br label %done
done:
  ret ptr %lane
}

define i64 @nhf_exec_outstanding(ptr %pool) {
  %outstandingp = call ptr @nhf.exec.pool.outstanding(ptr %pool)
  %n = load atomic i64, ptr %outstandingp seq_cst, align 8
  ret i64 %n
}

; Finish the outstanding tasks (the threads keep running them), then stop the
; threads: joined if no graph slot is armed, else detached, to quit on their
; own once the last graph holding a slot is gone (its replays still need
; them).  The pool's memory, lanes and slots are kept: a stream may still have
; to execute a wait on their words.
define void @nhf_exec_pool_close(ptr %pool) {
entry:
  %mutex = call ptr @nhf.exec.pool.mutex(ptr %pool)
  %wakep = call ptr @nhf.exec.pool.wake(ptr %pool)
  %stoppingp = call ptr @nhf.exec.pool.stopping(ptr %pool)
  %outstandingp = call ptr @nhf.exec.pool.outstanding(ptr %pool)
  %live_slotsp = call ptr @nhf.exec.pool.live_slots(ptr %pool)
  %l = call i32 @pthread_mutex_lock(ptr %mutex)
  store atomic i32 1, ptr %stoppingp seq_cst, align 4
  %b = call i32 @pthread_cond_broadcast(ptr %wakep)
  %u = call i32 @pthread_mutex_unlock(ptr %mutex)
  br label %drain
drain:
  %outstanding = load atomic i64, ptr %outstandingp seq_cst, align 8
  %busy = icmp sgt i64 %outstanding, 0
  br i1 %busy, label %nap, label %drained
nap:
  call void @nhf.sleep_ns(i64 20000)
  br label %drain
drained:
  %threadsp = call ptr @nhf.exec.pool.threads(ptr %pool)
  %threads = load ptr, ptr %threadsp
  %nthreadsp = call ptr @nhf.exec.pool.nthreads(ptr %pool)
  %nthreads = load i64, ptr %nthreadsp
  %live = load atomic i64, ptr %live_slotsp seq_cst, align 8
  %armed = icmp sgt i64 %live, 0
  br label %each
each:
  %i = phi i64 [ 0, %drained ], [ %i1, %next ]
  %more = icmp ult i64 %i, %nthreads
  br i1 %more, label %one, label %done
one:
  %tidp = getelementptr inbounds i64, ptr %threads, i64 %i
  %tid = load i64, ptr %tidp
  br i1 %armed, label %detach, label %join
detach:
  %d = call i32 @pthread_detach(i64 %tid)
  br label %next
join:
  %r = call i32 @pthread_join(i64 %tid, ptr null)
  br label %next
next:
  %i1 = add i64 %i, 1
  br label %each
done:
  ret void
}

; ---- graph slots, from Python through ctypes (without the GIL) ----

; A disarmed slot of %pool on %words (two i32), or null; never freed.
define ptr @nhf_exec_slot_new(ptr %pool, ptr %words) {
entry:
  %size = load i64, ptr @nhf.exec.slot.bytes
  %slot = call ptr @calloc(i64 1, i64 %size)
  %nomem = icmp eq ptr %slot, null
  br i1 %nomem, label %done, label %init
init:
  %wordsp = getelementptr inbounds %nhf.exec.slot, ptr %slot, i32 0, i32 1
  store ptr %words, ptr %wordsp
  %poolp = call ptr @nhf.exec.slot.pool(ptr %slot)
  store ptr %pool, ptr %poolp
  %reached = call ptr @nhf.exec.slot.reached(ptr %slot)
  %done_word = call ptr @nhf.exec.slot.done(ptr %slot)
  call void @nhf.exec.set_op(ptr %slot, i32 0, ptr %reached, i64 1)
  call void @nhf.exec.set_op(ptr %slot, i32 1, ptr %done_word, i64 1)
  call void @nhf.exec.set_op(ptr %slot, i32 2, ptr %done_word, i64 0)
  %mutex = call ptr @nhf.exec.pool.mutex(ptr %pool)
  %l = call i32 @pthread_mutex_lock(ptr %mutex)
  %slotsp = call ptr @nhf.exec.pool.slots(ptr %pool)
  %first = load ptr, ptr %slotsp
  %nextp = call ptr @nhf.exec.slot.next(ptr %slot)
  store ptr %first, ptr %nextp
  store atomic ptr %slot, ptr %slotsp seq_cst, align 8
  %u = call i32 @pthread_mutex_unlock(ptr %mutex)
  br label %done
done:
  ret ptr %slot
}

define internal void @nhf.exec.set_op(ptr %slot, i32 %i, ptr %word, i64 %value) {
  %op = call ptr @nhf.exec.slot.op(ptr %slot, i32 %i)
  %wordp = getelementptr inbounds %nhf.exec.word_op, ptr %op, i32 0, i32 0
  store ptr %word, ptr %wordp
  %valuep = getelementptr inbounds %nhf.exec.word_op, ptr %op, i32 0, i32 1
  store i64 %value, ptr %valuep
  ret void
}

; The simulator's argument for the slot's %i-th graph node (0, 1, 2).
define ptr @nhf_exec_slot_op(ptr %slot, i32 %i) {
  %op = call ptr @nhf.exec.slot.op(ptr %slot, i32 %i)
  ret ptr %op
}

; Arm %slot for fn(arg) (copy: the pool's copy of MEMCPY_LAYOUT arg) and wake
; the pool: from now on a replay that reaches the slot is answered.
define void @nhf_exec_slot_arm(ptr %slot, ptr %fn, ptr %arg, i32 %copy) {
  %reached = call ptr @nhf.exec.slot.reached(ptr %slot)
  store atomic volatile i32 0, ptr %reached seq_cst, align 4
  %done = call ptr @nhf.exec.slot.done(ptr %slot)
  store atomic volatile i32 0, ptr %done seq_cst, align 4
  %fnp = call ptr @nhf.exec.slot.fn(ptr %slot)
  store ptr %fn, ptr %fnp
  %argp = call ptr @nhf.exec.slot.arg(ptr %slot)
  store ptr %arg, ptr %argp
  %copyp = call ptr @nhf.exec.slot.copy(ptr %slot)
  store i32 %copy, ptr %copyp
  %livep = call ptr @nhf.exec.slot.live(ptr %slot)
  store atomic i32 1, ptr %livep seq_cst, align 4
  %poolp = call ptr @nhf.exec.slot.pool(ptr %slot)
  %pool = load ptr, ptr %poolp
  %live_slotsp = call ptr @nhf.exec.pool.live_slots(ptr %pool)
  %before = atomicrmw add ptr %live_slotsp, i64 1 seq_cst
  call void @nhf.exec.wake(ptr %pool)
  ret void
}

; Disarm %slot: its graph and every replay of it are gone.
define void @nhf_exec_slot_disarm(ptr %slot) {
  %livep = call ptr @nhf.exec.slot.live(ptr %slot)
  store atomic i32 0, ptr %livep seq_cst, align 4
  %poolp = call ptr @nhf.exec.slot.pool(ptr %slot)
  %pool = load ptr, ptr %poolp
  %live_slotsp = call ptr @nhf.exec.pool.live_slots(ptr %pool)
  %before = atomicrmw sub ptr %live_slotsp, i64 1 seq_cst
  call void @nhf.exec.wake(ptr %pool)  ; a closing pool's parked threads may now quit
  ret void
}

define i64 @nhf_exec_live_slots(ptr %pool) {
  %live_slotsp = call ptr @nhf.exec.pool.live_slots(ptr %pool)
  %n = load atomic i64, ptr %live_slotsp seq_cst, align 8
  ret i64 %n
}
