; The trampolines: what the driver calls, void (*)(void *record).
;
; They run on a thread of the driver's (or the simulator's), which holds no
; GIL.  A compiled host function never takes it; a Python callable takes it
; inside the interpreter guard and is skipped once the guard is closed.

; A compiled host function, once: fn(arg), then complete the record.
define void @nhf_run_compiled(ptr %record) {
  %fnp = call ptr @nhf.record.fn(ptr %record)
  %fn = load ptr, ptr %fnp
  %argp = call ptr @nhf.record.arg(ptr %record)
  %arg = load ptr, ptr %argp
  call void %fn(ptr %arg)
  call void @nhf.gil.give_back_leaked()
  call void @nhf.complete(ptr %record)
  ret void
}

; Call the Python callable of %record (GIL held); returns a new reference to
; its result, or null if it raised (reported through sys.unraisablehook, with
; the callable as the object).
define internal ptr @nhf.call_python(ptr %record) {
entry:
  %argp = call ptr @nhf.record.arg(ptr %record)
  %callable = load ptr, ptr %argp
  %result = call ptr @PyObject_CallNoArgs(ptr %callable)
  %raised = icmp eq ptr %result, null
  br i1 %raised, label %report, label %done
report:
  call void @PyErr_WriteUnraisable(ptr %callable)
  ret ptr null
done:
  ret ptr %result
}

; A Python callable, once: its result stays in the record until the drain.
define void @nhf_run_python(ptr %record) {
entry:
  %in = call i1 @nhf.enter()
  br i1 %in, label %run, label %done
run:
  %state = call i32 @nhf.gil.take()
  %result = call ptr @nhf.call_python(ptr %record)
  %resultp = call ptr @nhf.record.result(ptr %record)
  store ptr %result, ptr %resultp
  call void @nhf.gil.give(i32 %state)
  call void @nhf.leave()
  br label %done
done:
  call void @nhf.complete(ptr %record)
  ret void
}

; A Python callable in a graph, at every replay: the record stays with the
; graph, and the result is released by the next drain, on the main thread.
define void @nhf_replay_python(ptr %record) {
entry:
  %in = call i1 @nhf.enter()
  br i1 %in, label %run, label %done
run:
  %state = call i32 @nhf.gil.take()
  %result = call ptr @nhf.call_python(ptr %record)
  %raised = icmp eq ptr %result, null
  br i1 %raised, label %give, label %defer
defer:
  call void @nhf.defer_release(ptr %result)
  br label %give
give:
  call void @nhf.gil.give(i32 %state)
  call void @nhf.leave()
  br label %done
done:
  ret void
}

; The destructor of the user object that keeps a graph's record: the graph
; and all its executable instances are gone, so the record can be released.
define void @nhf_user_object_release(ptr %record) {
  call void @nhf.complete(ptr %record)
  ret void
}
