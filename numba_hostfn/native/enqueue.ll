; The enqueue: the core every launch goes through, and the CUDA driver's enqueue function.
;
; An *enqueue function*, i64 (ptr handle, ptr trampoline, ptr record), puts
; trampoline(record) on a stream and returns a status: 0, or one of the
; @nhf.status.* words (a CUresult in the low 32 bits where a driver call
; failed).  @nhf_cuda_enqueue is the driver's; the simulator's are in
; simulator.ll.

; Raw driver entry points (cuGetProcAddress), set once by the CUDA backend.
@nhf.cu.is_capturing = internal global ptr null
@nhf.cu.launch_host_func = internal global ptr null

define void @nhf_set_cuda(ptr %is_capturing, ptr %launch_host_func) {
  store atomic ptr %is_capturing, ptr @nhf.cu.is_capturing seq_cst, align 8
  store atomic ptr %launch_host_func, ptr @nhf.cu.launch_host_func seq_cst, align 8
  ret void
}

; Enqueue on a real CUDA stream: a capturing stream gets nothing here (the
; capture path owns its nodes by the graph), else cuLaunchHostFunc.
define i64 @nhf_cuda_enqueue(ptr %stream, ptr %fn, ptr %arg) {
entry:
  %capture_status = alloca i32, align 4
  store i32 0, ptr %capture_status
  %is_capturing = load atomic ptr, ptr @nhf.cu.is_capturing seq_cst, align 8
  %rc = call i32 %is_capturing(ptr %stream, ptr %capture_status)
  %failed = icmp ne i32 %rc, 0
  br i1 %failed, label %check_failed, label %checked
check_failed:
  %code = zext i32 %rc to i64
  %flag = load i64, ptr @nhf.status.capture_check_failed
  %status = or i64 %code, %flag
  ret i64 %status
checked:
  %capture = load i32, ptr %capture_status
  %capturing = icmp ne i32 %capture, 0
  br i1 %capturing, label %refuse, label %launch
refuse:
  %refused = load i64, ptr @nhf.status.capturing
  ret i64 %refused
launch:
  %launch_host_func = load atomic ptr, ptr @nhf.cu.launch_host_func seq_cst, align 8
  %rc1 = call i32 %launch_host_func(ptr %stream, ptr %fn, ptr %arg)
  %code1 = zext i32 %rc1 to i64
  ret i64 %code1
}

; args[%i] of a METH_FASTCALL call, an int, as an unsigned 64-bit value.
define internal i64 @nhf.arg_u64(ptr %args, i64 %i) alwaysinline {
  %slot = getelementptr ptr, ptr %args, i64 %i
  %object = load ptr, ptr %slot
  %value = call i64 @PyLong_AsUnsignedLongLongMask(ptr %object)
  ret i64 %value
}

@nhf.enqueue.usage = internal constant [74 x i8]
  c"enqueue(enqueue_fn, handle, trampoline, fn, arg, owner) takes 6 arguments\00"

; Enqueue trampoline(record) for fn(arg) owning %owner, with the GIL held
; on entry and exit: take a record, drop the GIL only for
; enqueue_fn(handle, trampoline, record), release the record if that refused,
; and drain what has run meanwhile.  Status: 0, the enqueue function's
; status, or no_record (nothing taken: add a slab and call again).  Shared
; by the enqueue builtin below and host_launch's fast path (host_launch.ll).
define internal i64 @nhf.enqueue_record(ptr %enqueue_fn, ptr %stream, ptr %trampoline, ptr %fn, ptr %arg, ptr %owner) {
entry:
  %record = call ptr @nhf_py_take(ptr %fn, ptr %arg, ptr %owner)
  %none = icmp eq ptr %record, null
  br i1 %none, label %no_record, label %enqueue
no_record:
  %no_record_status = load i64, ptr @nhf.status.no_record
  ret i64 %no_record_status
enqueue:
  %thread = call ptr @PyEval_SaveThread()
  %status = call i64 %enqueue_fn(ptr %stream, ptr %trampoline, ptr %record)
  call void @PyEval_RestoreThread(ptr %thread)
  %ok = icmp eq i64 %status, 0
  br i1 %ok, label %enqueued, label %failed
failed:
  ; "kept": enqueued after all (a later step failed); the record will run.
  %kept_flag = load i64, ptr @nhf.status.kept
  %kept_bits = and i64 %status, %kept_flag
  %kept = icmp ne i64 %kept_bits, 0
  br i1 %kept, label %out, label %refused
refused:
  call void @nhf_py_release(ptr %record)
  br label %out
enqueued:
  %wanted = call i1 @nhf.drain_wanted()
  br i1 %wanted, label %drain, label %out
drain:
  %n = call i64 @nhf_py_drain()
  br label %out
out:
  ret i64 %status
}

; The enqueue builtin, METH_FASTCALL, for the Python implementation of
; host_launch (and host_copy, release_after, the graph paths):
;   enqueue(enqueue_fn, handle, trampoline, fn, arg, owner) -> status
; with the status of @nhf.enqueue_record.
define ptr @nhf_py_enqueue(ptr %self, ptr %args, i64 %nargs) {
entry:
  %six = icmp eq i64 %nargs, 6
  br i1 %six, label %unpack, label %usage
usage:
  %type_error = getelementptr i8, ptr @PyExc_TypeError, i64 0
  call void @PyErr_SetString(ptr %type_error, ptr @nhf.enqueue.usage)
  ret ptr null
unpack:
  %enqueue_fn = call i64 @nhf.arg_u64(ptr %args, i64 0)
  %handle = call i64 @nhf.arg_u64(ptr %args, i64 1)
  %trampoline = call i64 @nhf.arg_u64(ptr %args, i64 2)
  %fn = call i64 @nhf.arg_u64(ptr %args, i64 3)
  %arg = call i64 @nhf.arg_u64(ptr %args, i64 4)
  %owner_slot = getelementptr ptr, ptr %args, i64 5
  %owner = load ptr, ptr %owner_slot
  %error = call ptr @PyErr_Occurred()
  %bad_int = icmp ne ptr %error, null
  br i1 %bad_int, label %fail, label %enqueue
fail:
  ret ptr null
enqueue:
  %enqueue_fnp = inttoptr i64 %enqueue_fn to ptr
  %stream = inttoptr i64 %handle to ptr
  %tramp = inttoptr i64 %trampoline to ptr
  %fnp = inttoptr i64 %fn to ptr
  %argp = inttoptr i64 %arg to ptr
  %status = call i64 @nhf.enqueue_record(ptr %enqueue_fnp, ptr %stream, ptr %tramp, ptr %fnp, ptr %argp, ptr %owner)
  %result = call ptr @PyLong_FromUnsignedLongLong(i64 %status)
  ret ptr %result
}
