; The interpreter guard, and the GIL on threads that Python did not create.
;
; Host functions run on threads foreign to Python: the CUDA driver's, the
; simulator's.  Such a thread may call into CPython only between @nhf.enter and
; @nhf.leave.  At interpreter exit, @nhf_close shuts the guard and waits for the
; threads inside: from then on no thread of ours touches CPython
; (LIFETIME.md, invariant 6).

@nhf.closing = internal global i32 0
@nhf.inside = internal global i64 0

; Count this thread in before touching CPython; false if the guard is closed.
define internal i1 @nhf.enter() {
entry:
  %before = atomicrmw add ptr @nhf.inside, i64 1 seq_cst
  %closing = load atomic i32, ptr @nhf.closing seq_cst, align 4
  %open = icmp eq i32 %closing, 0
  br i1 %open, label %in, label %out
in:
  ret i1 true
out:
  %after = atomicrmw sub ptr @nhf.inside, i64 1 seq_cst
  ret i1 false
}

define internal void @nhf.leave() {
  %before = atomicrmw sub ptr @nhf.inside, i64 1 seq_cst
  ret void
}

define internal i1 @nhf.guard_open() {
  %closing = load atomic i32, ptr @nhf.closing seq_cst, align 4
  %open = icmp eq i32 %closing, 0
  ret i1 %open
}

; Close the guard, then wait (at most %ms milliseconds) for the threads
; already inside CPython to leave.  Returns how many are left.
define i64 @nhf_close(i64 %ms) {
entry:
  store atomic i32 1, ptr @nhf.closing seq_cst, align 4
  br label %check
check:
  %waited = phi i64 [ 0, %entry ], [ %next, %wait ]
  %inside = load atomic i64, ptr @nhf.inside seq_cst, align 8
  %none = icmp eq i64 %inside, 0
  br i1 %none, label %done, label %late
late:
  %over = icmp sge i64 %waited, %ms
  br i1 %over, label %done, label %wait
wait:
  %rc = call i32 @usleep(i32 1000)
  %next = add i64 %waited, 1
  br label %check
done:
  ret i64 %inside
}

; Take the GIL on this thread (inside the guard); returns the state to give
; back with @nhf.gil.give.  The first time, a thread foreign to Python gets a
; thread state that it keeps (the GILState counter stays at one), so later
; calls only take and drop the GIL instead of creating and destroying a state
; each (invariant 12).
define internal i32 @nhf.gil.take() {
entry:
  %own = call ptr @PyGILState_GetThisThreadState()
  %fresh = icmp eq ptr %own, null
  br i1 %fresh, label %adopt, label %take
adopt:
  %first = call i32 @PyGILState_Ensure()
  %detached = call ptr @PyEval_SaveThread()
  br label %take
take:
  %state = call i32 @PyGILState_Ensure()
  ret i32 %state
}

; Give back the thread state that @nhf.gil.take kept for this thread, before
; the thread ends (an executor's threads, at close).  Skipped once the guard
; is closed: at exit it is leaked instead.
define internal void @nhf.gil.forget() {
entry:
  %in = call i1 @nhf.enter()
  br i1 %in, label %check, label %out
check:
  %own = call ptr @PyGILState_GetThisThreadState()
  %none = icmp eq ptr %own, null
  br i1 %none, label %leave, label %dispose
dispose:
  ; Ensure (counter 1 -> 2, the GIL taken); Release(LOCKED) (2 -> 1, GIL kept);
  ; Release(UNLOCKED) (1 -> 0): the thread state is cleared and deleted, and
  ; the GIL released with it.
  %taken = call i32 @PyGILState_Ensure()
  %locked = load i32, ptr @nhf.gilstate.locked
  call void @PyGILState_Release(i32 %locked)
  %unlocked = load i32, ptr @nhf.gilstate.unlocked
  call void @PyGILState_Release(i32 %unlocked)
  br label %leave
leave:
  call void @nhf.leave()
  br label %out
out:
  ret void
}

define internal void @nhf.gil.give(i32 %state) {
  call void @PyGILState_Release(i32 %state)
  ret void
}

; A compiled body is entered without the GIL and must return without it.
; Some of numba's error paths return from inside a GIL-taking block (a cfunc
; whose Environment was never registered: print's check returns with the GIL
; held); a host-function thread that kept the GIL would stop every Python
; thread for ever.  Undo that one PyGILState_Ensure: PyGILState_Release with
; UNLOCKED drops the GIL, and the thread state too if the body created it
; (invariant 13).  The thread holds the GIL if its own thread state is the
; attached one (attached is per thread from 3.12, the GIL holder's before).
; Skipped once the guard is closed: no CPython call from then on.
define internal void @nhf.gil.give_back_leaked() {
entry:
  %open = call i1 @nhf.guard_open()
  br i1 %open, label %mine, label %done
mine:
  %own = call ptr @PyGILState_GetThisThreadState()
  %none = icmp eq ptr %own, null
  br i1 %none, label %done, label %attached
attached:
  %current = call ptr @PyThreadState_GetUnchecked()
  %held = icmp eq ptr %current, %own
  br i1 %held, label %leaked, label %done
leaked:
  %unlocked = load i32, ptr @nhf.gilstate.unlocked
  call void @PyGILState_Release(i32 %unlocked)
  br label %done
done:
  ret void
}
