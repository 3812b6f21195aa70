; host_launch's fast path: the METH_FASTCALL | METH_KEYWORDS builtin that is
; numba_hostfn.host_launch.
;
; It handles the common launches here, with the GIL held, and hands every
; other call, unchanged, to the Python implementation (_launch.host_launch),
; which raises every error.  Handled: two positional arguments, keywords
; user_data=, executor= and blocking=True; a stream whose type Python has
; accepted before (any __cuda_stream__ type on CUDA, the simulator's Stream);
; a HostFunction, a ctypes CUhostFn, a numba cfunc or a Python callable that
; Python has classified before; user_data None, an int, by_ref(...), bytes or
; bytearray (copied); an executor whose lane for that stream exists.  A
; stream that is capturing, no free record, and anything else fall through.
;
; What Python has classified is in four identity tables (type, code object
; or instance -> value), filled and emptied only by _fastpath.py, which
; holds a weak reference to each key and clears its entry when the key dies,
; before its address can be reused.  The config words, the tables' shape and
; the kinds are generated from _native.py's Fast* classes (the prelude).

@nhf.fast.config = internal global %nhf.fast.config_words zeroinitializer
@nhf.fast.tables = internal global %nhf.fast.table_set zeroinitializer
@nhf.fast.counts = internal global %nhf.fast.count_words zeroinitializer

define i64 @nhf_fast_config_addr() {
  ret i64 ptrtoint (ptr @nhf.fast.config to i64)
}

define i64 @nhf_fast_tables_addr() {
  ret i64 ptrtoint (ptr @nhf.fast.tables to i64)
}

define i64 @nhf_fast_counts_addr() {
  ret i64 ptrtoint (ptr @nhf.fast.counts to i64)
}

; The callback of every table entry's weak reference (METH_O), run when its
; key dies and before the key's memory can be reused: clear the entry whose
; reference it is.  Native, so no signal handler can interrupt it.
define ptr @nhf_py_fast_forget(ptr %self, ptr %ref) {
entry:
  %entries = load i64, ptr @nhf.fast.table_entries
  %tables = load i64, ptr @nhf.fast.table_count
  br label %table_loop
table_loop:
  %t = phi i64 [ 0, %entry ], [ %t1, %next_table ]
  %more_tables = icmp ult i64 %t, %tables
  br i1 %more_tables, label %entry_loop, label %done
entry_loop:
  %i = phi i64 [ 0, %table_loop ], [ %i1, %next_entry ]
  %more = icmp ult i64 %i, %entries
  br i1 %more, label %check, label %next_table
check:
  %refp = getelementptr inbounds %nhf.fast.table_set, ptr @nhf.fast.tables, i64 0, i64 %t, i64 %i, i32 2
  %r = load ptr, ptr %refp
  %hit = icmp eq ptr %r, %ref
  br i1 %hit, label %forget, label %next_entry
forget:
  %keyp = getelementptr inbounds %nhf.fast.table_set, ptr @nhf.fast.tables, i64 0, i64 %t, i64 %i, i32 0
  store ptr null, ptr %keyp
  store ptr null, ptr %refp
  br label %next_entry
next_entry:
  %i1 = add i64 %i, 1
  br label %entry_loop
next_table:
  %t1 = add i64 %t, 1
  br label %table_loop
done:
  call void @Py_IncRef(ptr @_Py_NoneStruct)
  ret ptr @_Py_NoneStruct
}

; ---- reading the config, the tables and objects ----

define internal i64 @nhf.fast.word(ptr %slot_constant) alwaysinline {
  %slot = load i64, ptr %slot_constant
  %word = getelementptr inbounds %nhf.fast.config_words, ptr @nhf.fast.config, i64 0, i64 %slot
  %value = load i64, ptr %word
  ret i64 %value
}

define internal ptr @nhf.fast.object(ptr %slot_constant) alwaysinline {
  %value = call i64 @nhf.fast.word(ptr %slot_constant)
  %object = inttoptr i64 %value to ptr
  ret ptr %object
}

define internal void @nhf.fast.count(ptr %index_constant) alwaysinline {
  %index = load i64, ptr %index_constant
  %word = getelementptr inbounds %nhf.fast.count_words, ptr @nhf.fast.counts, i64 0, i64 %index
  %n = load i64, ptr %word
  %n1 = add i64 %n, 1
  store i64 %n1, ptr %word
  ret void
}

; Py_TYPE(object): the ob_type field (its offset is checked by _fastpath.py
; before the fast path is enabled).
define internal ptr @nhf.fast.type_of(ptr %object) alwaysinline {
  %offset = load i64, ptr @nhf.fast.ob_type_offset
  %field = getelementptr inbounds i8, ptr %object, i64 %offset
  %type = load ptr, ptr %field
  ret ptr %type
}

; A tuple's size and items, read as PyTuple_GET_SIZE and PyTuple_GET_ITEM read
; them (ob_size follows ob_type; the items start at the tuple type's basic size:
; _fastpath.py checks both before the fast path is enabled).  Only for an object
; known to be a tuple.
define internal i64 @nhf.fast.tuple_size(ptr %tuple) alwaysinline {
  %offset = load i64, ptr @nhf.fast.ob_type_offset
  %at = add i64 %offset, 8
  %field = getelementptr inbounds i8, ptr %tuple, i64 %at
  %size = load i64, ptr %field
  ret i64 %size
}

define internal ptr @nhf.fast.tuple_item(ptr %tuple, i64 %i) alwaysinline {
  %items = load i64, ptr @nhf.fast.tuple_items_offset
  %skip = mul i64 %i, 8
  %at = add i64 %items, %skip
  %field = getelementptr inbounds i8, ptr %tuple, i64 %at
  %item = load ptr, ptr %field
  ret ptr %item
}

; After a failed call: an ordinary error (an Exception) is cleared, and the
; launch falls through to the Python path, which raises its own; anything else
; (KeyboardInterrupt from a signal handler, SystemExit) stays set, and
; host_launch raises it (nhf.fast.launch's outcome 2).
define internal void @nhf.fast.clear_error() {
entry:
  %exception = getelementptr i8, ptr @PyExc_Exception, i64 0
  %ordinary = call i32 @PyErr_ExceptionMatches(ptr %exception)
  %is_ordinary = icmp ne i32 %ordinary, 0
  br i1 %is_ordinary, label %clear, label %keep
clear:
  call void @PyErr_Clear()
  br label %keep
keep:
  ret void
}

; The value for %key in table %table_constant, or -1 if it has none.
define internal i64 @nhf.fast.lookup(ptr %table_constant, ptr %key) {
entry:
  %table = load i64, ptr %table_constant
  %entries = load i64, ptr @nhf.fast.table_entries
  br label %loop
loop:
  %i = phi i64 [ 0, %entry ], [ %i1, %next ]
  %more = icmp ult i64 %i, %entries
  br i1 %more, label %body, label %absent
body:
  %keyp = getelementptr inbounds %nhf.fast.table_set, ptr @nhf.fast.tables, i64 0, i64 %table, i64 %i, i32 0
  %k = load ptr, ptr %keyp
  %hit = icmp eq ptr %k, %key
  br i1 %hit, label %found, label %next
next:
  %i1 = add i64 %i, 1
  br label %loop
found:
  %valuep = getelementptr inbounds %nhf.fast.table_set, ptr @nhf.fast.tables, i64 0, i64 %table, i64 %i, i32 1
  %value = load i64, ptr %valuep
  ret i64 %value
absent:
  ret i64 -1
}

; getattr(object, name) as an unsigned 64-bit int; false (no error set) if it
; is missing or not an int in range.
define internal i1 @nhf.fast.attr_u64(ptr %object, ptr %name_constant, ptr %out) {
entry:
  %name = call ptr @nhf.fast.object(ptr %name_constant)
  %value = call ptr @PyObject_GetAttr(ptr %object, ptr %name)
  %missing = icmp eq ptr %value, null
  br i1 %missing, label %fail, label %convert
convert:
  %converted = call i1 @nhf.fast.exact_u64(ptr %value, ptr %out)
  call void @Py_DecRef(ptr %value)
  ret i1 %converted
fail:
  call void @nhf.fast.clear_error()
  ret i1 false
}

; An exact int as an unsigned 64-bit value; false (no error set) if it is not one.
; Only an answer of all ones can be an error (negative, or too large).
define internal i1 @nhf.fast.exact_u64(ptr %value, ptr %out) {
entry:
  %type = call ptr @nhf.fast.type_of(ptr %value)
  %is_int = icmp eq ptr %type, @PyLong_Type
  br i1 %is_int, label %as_int, label %no
as_int:
  %n = call i64 @PyLong_AsUnsignedLongLong(ptr %value)
  %all_ones = icmp eq i64 %n, -1
  br i1 %all_ones, label %check, label %ok
check:
  %error = call ptr @PyErr_Occurred()
  %bad = icmp ne ptr %error, null
  br i1 %bad, label %clear, label %ok
clear:
  call void @nhf.fast.clear_error()
  br label %no
ok:
  store i64 %n, ptr %out
  ret i1 true
no:
  ret i1 false
}

; ---- the function ----

; A plain function (%bound 0) or a bound method's function (%bound 1): a
; Python callable if its code object is known not to be a coroutine's and
; it can be called with no arguments (as _launch.classify_function checks).
define internal i64 @nhf.fast.plain_function(ptr %function, i64 %bound) {
entry:
  %code = call ptr @PyFunction_GetCode(ptr %function)
  %argcount = call i64 @nhf.fast.lookup(ptr @nhf.fast.table.codes, ptr %code)
  %unknown = icmp slt i64 %argcount, 0
  br i1 %unknown, label %no, label %defaults
defaults:
  %tuple = call ptr @PyFunction_GetDefaults(ptr %function)
  %none = icmp eq ptr %tuple, null
  br i1 %none, label %count, label %sized
sized:
  %size = call i64 @nhf.fast.tuple_size(ptr %tuple)
  br label %count
count:
  %given = phi i64 [ 0, %defaults ], [ %size, %sized ]
  %covered = add i64 %given, %bound
  %required = sub i64 %argcount, %covered
  %needs_arguments = icmp sgt i64 %required, 0
  br i1 %needs_arguments, label %no, label %python
python:
  %kind = load i64, ptr @nhf.fast.kind.python
  ret i64 %kind
no:
  ret i64 0
}

; A ctypes pointer of a known CUhostFn type: its prototype as the instance
; has it now (restype None, argtypes (c_void_p,)), and its address.  Two
; attribute reads and three comparisons: exact even when restype or argtypes
; were set on this instance.
define internal i64 @nhf.fast.ctypes_pointer(ptr %fn, ptr %address_out) {
entry:
  %view = alloca %nhf.py_buffer, align 8
  %restype_name = call ptr @nhf.fast.object(ptr @nhf.fast.slot.name_restype)
  %restype = call ptr @PyObject_GetAttr(ptr %fn, ptr %restype_name)
  %no_restype = icmp eq ptr %restype, null
  br i1 %no_restype, label %clear, label %check_restype
check_restype:
  call void @Py_DecRef(ptr %restype)
  %void = icmp eq ptr %restype, @_Py_NoneStruct
  br i1 %void, label %argtypes, label %no
argtypes:
  %argtypes_name = call ptr @nhf.fast.object(ptr @nhf.fast.slot.name_argtypes)
  %types = call ptr @PyObject_GetAttr(ptr %fn, ptr %argtypes_name)
  %no_types = icmp eq ptr %types, null
  br i1 %no_types, label %clear, label %check_tuple
check_tuple:
  %types_type = call ptr @nhf.fast.type_of(ptr %types)
  %is_tuple = icmp eq ptr %types_type, @PyTuple_Type
  br i1 %is_tuple, label %check_size, label %drop_types
check_size:
  %n = call i64 @nhf.fast.tuple_size(ptr %types)
  %one = icmp eq i64 %n, 1
  br i1 %one, label %check_item, label %drop_types
check_item:
  %item = call ptr @nhf.fast.tuple_item(ptr %types, i64 0)
  %c_void_p = call ptr @nhf.fast.object(ptr @nhf.fast.slot.c_void_p)
  %is_void_p = icmp eq ptr %item, %c_void_p
  call void @Py_DecRef(ptr %types)
  br i1 %is_void_p, label %address, label %no
drop_types:
  call void @Py_DecRef(ptr %types)
  br label %no
address:
  ; The function pointer is the object's buffer (what from_buffer reads).
  %got = call i32 @PyObject_GetBuffer(ptr %fn, ptr %view, i32 0)
  %failed = icmp ne i32 %got, 0
  br i1 %failed, label %clear, label %read
read:
  %bufp = getelementptr inbounds %nhf.py_buffer, ptr %view, i32 0, i32 0
  %buf = load ptr, ptr %bufp
  %lenp = getelementptr inbounds %nhf.py_buffer, ptr %view, i32 0, i32 2
  %len = load i64, ptr %lenp
  %wide = icmp eq i64 %len, 8
  br i1 %wide, label %load_address, label %release_view
load_address:
  %value = load i64, ptr %buf, align 1
  call void @PyBuffer_Release(ptr %view)
  %null = icmp eq i64 %value, 0
  br i1 %null, label %no, label %pointer
release_view:
  call void @PyBuffer_Release(ptr %view)
  br label %no
pointer:
  store i64 %value, ptr %address_out
  %kind = load i64, ptr @nhf.fast.kind.pointer
  ret i64 %kind
clear:
  call void @nhf.fast.clear_error()
  br label %no
no:
  ret i64 0
}

; What %fn is: a kind (@nhf.fast.kind.*), or 0 to fall through.  For
; compiled code, its address; for a HostFunction, its declared layout (a new
; reference, or null for none) and the layout's size.
define internal i64 @nhf.fast.function(ptr %fn, ptr %address_out, ptr %layout_out, ptr %layout_bytes_out) {
entry:
  store ptr null, ptr %layout_out
  %compiled = load i64, ptr @nhf.fast.kind.compiled
  %type = call ptr @nhf.fast.type_of(ptr %fn)
  ; Plain functions and bound methods first: checked per function, no type lookup.
  %is_function = icmp eq ptr %type, @PyFunction_Type
  br i1 %is_function, label %function, label %not_function
function:
  %function_kind = call i64 @nhf.fast.plain_function(ptr %fn, i64 0)
  ret i64 %function_kind
not_function:
  %is_method = icmp eq ptr %type, @PyMethod_Type
  br i1 %is_method, label %method, label %by_type
method:
  %inner = call ptr @PyMethod_Function(ptr %fn)
  %inner_type = call ptr @nhf.fast.type_of(ptr %inner)
  %plain = icmp eq ptr %inner_type, @PyFunction_Type
  br i1 %plain, label %bound_function, label %no
bound_function:
  %method_kind = call i64 @nhf.fast.plain_function(ptr %inner, i64 1)
  ret i64 %method_kind
by_type:
  %kind = call i64 @nhf.fast.lookup(ptr @nhf.fast.table.function_types, ptr %type)
  %is_compiled = icmp eq i64 %kind, %compiled
  br i1 %is_compiled, label %known_host_function, label %not_compiled
known_host_function:
  ; A HostFunction without a dtype that Python has seen: its address (read-only).
  %known_address = call i64 @nhf.fast.lookup(ptr @nhf.fast.table.host_functions, ptr %fn)
  %known = icmp sge i64 %known_address, 0
  br i1 %known, label %remembered, label %host_function
remembered:
  store i64 %known_address, ptr %address_out
  ret i64 %compiled
not_compiled:
  %pointer = load i64, ptr @nhf.fast.kind.pointer
  %is_pointer = icmp eq i64 %kind, %pointer
  br i1 %is_pointer, label %ctypes, label %not_pointer
ctypes:
  %ctypes_kind = call i64 @nhf.fast.ctypes_pointer(ptr %fn, ptr %address_out)
  ret i64 %ctypes_kind
not_pointer:
  %python = load i64, ptr @nhf.fast.kind.python
  %is_python = icmp eq i64 %kind, %python
  br i1 %is_python, label %python_type, label %instance
python_type:
  ret i64 %python
instance:
  ; A numba cfunc that Python checked: the table holds its address.
  %address = call i64 @nhf.fast.lookup(ptr @nhf.fast.table.instances, ptr %fn)
  %is_cfunc = icmp sge i64 %address, 0
  br i1 %is_cfunc, label %cfunc, label %no
cfunc:
  store i64 %address, ptr %address_out
  ret i64 %pointer
host_function:
  %has_address = call i1 @nhf.fast.attr_u64(ptr %fn, ptr @nhf.fast.slot.name_address, ptr %address_out)
  br i1 %has_address, label %layout, label %no
layout:
  %dtype_name = call ptr @nhf.fast.object(ptr @nhf.fast.slot.name_dtype)
  %dtype = call ptr @PyObject_GetAttr(ptr %fn, ptr %dtype_name)
  %no_dtype = icmp eq ptr %dtype, null
  br i1 %no_dtype, label %clear, label %check_dtype
check_dtype:
  %undeclared = icmp eq ptr %dtype, @_Py_NoneStruct
  br i1 %undeclared, label %no_layout, label %declared
no_layout:
  call void @Py_DecRef(ptr %dtype)
  ret i64 %compiled
declared:
  store ptr %dtype, ptr %layout_out
  %has_size = call i1 @nhf.fast.attr_u64(ptr %dtype, ptr @nhf.fast.slot.name_itemsize, ptr %layout_bytes_out)
  br i1 %has_size, label %sized, label %no
sized:
  ret i64 %compiled
clear:
  call void @nhf.fast.clear_error()
  br label %no
no:
  ret i64 0
}

; ---- user_data ----

; A private copy of %size bytes at %data, owned by a new bytearray: true, with
; its address and the bytearray (a new reference); false (no error set) if
; it cannot be made.
define internal i1 @nhf.fast.copy(ptr %data, i64 %size, ptr %arg_out, ptr %owner_out) {
entry:
  %copy = call ptr @PyByteArray_FromStringAndSize(ptr %data, i64 %size)
  %failed = icmp eq ptr %copy, null
  br i1 %failed, label %clear, label %ok
ok:
  %address = call ptr @PyByteArray_AsString(ptr %copy)
  %arg = ptrtoint ptr %address to i64
  store i64 %arg, ptr %arg_out
  store ptr %copy, ptr %owner_out
  ret i1 true
clear:
  call void @nhf.fast.clear_error()
  ret i1 false
}

; user_data of compiled code as _userdata.resolve_user_data resolves it, for
; None, an int, by_ref(...), bytes and bytearray: true, with the address and
; what the launch must own (a new reference, or null); false to fall through
; (no error set).  %layout is the declared dtype or null, of %layout_bytes.
define internal i1 @nhf.fast.user_data(ptr %data, ptr %layout, i64 %layout_bytes, ptr %arg_out, ptr %owner_out) {
entry:
  %field = alloca i64, align 8
  store ptr null, ptr %owner_out
  %declared = icmp ne ptr %layout, null
  %undeclared = icmp eq ptr %layout, null
  %is_none = icmp eq ptr %data, @_Py_NoneStruct
  br i1 %is_none, label %none, label %not_none
none:
  ; NULL: the Python path decides (a declared layout, or a body that reads its
  ; argument, is refused there).
  br label %no
not_none:
  %type = call ptr @nhf.fast.type_of(ptr %data)
  %is_int = icmp eq ptr %type, @PyLong_Type
  br i1 %is_int, label %int, label %not_int
int:
  ; An address, as is (out of range, or NULL, falls through: the Python path
  ; refuses NULL for a declared layout or a body that reads its argument).
  %is_address = call i1 @nhf.fast.exact_u64(ptr %data, ptr %arg_out)
  br i1 %is_address, label %check_null, label %no
check_null:
  %address = load i64, ptr %arg_out
  %zero = icmp eq i64 %address, 0
  br i1 %zero, label %no, label %address_ok
address_ok:
  ret i1 true
not_int:
  %by_ref = call ptr @nhf.fast.object(ptr @nhf.fast.slot.by_ref_type)
  %is_by_ref = icmp eq ptr %type, %by_ref
  br i1 %is_by_ref, label %reference, label %not_by_ref
reference:
  br i1 %declared, label %reference_layout, label %reference_address
reference_layout:
  ; by_ref of the declared dtype (the same dtype object), or of no dtype, and its size.
  %dtype_name = call ptr @nhf.fast.object(ptr @nhf.fast.slot.name_dtype)
  %dtype = call ptr @PyObject_GetAttr(ptr %data, ptr %dtype_name)
  %no_dtype = icmp eq ptr %dtype, null
  br i1 %no_dtype, label %clear, label %compare_dtype
compare_dtype:
  call void @Py_DecRef(ptr %dtype)
  %same = icmp eq ptr %dtype, %layout
  %untyped = icmp eq ptr %dtype, @_Py_NoneStruct
  %dtype_ok = or i1 %same, %untyped
  br i1 %dtype_ok, label %reference_size, label %no
reference_size:
  %has_size = call i1 @nhf.fast.attr_u64(ptr %data, ptr @nhf.fast.slot.name_nbytes, ptr %field)
  br i1 %has_size, label %compare_size, label %no
compare_size:
  %nbytes = load i64, ptr %field
  %fits = icmp eq i64 %nbytes, %layout_bytes
  br i1 %fits, label %reference_address, label %no
reference_address:
  %has_address = call i1 @nhf.fast.attr_u64(ptr %data, ptr @nhf.fast.slot.name_address, ptr %arg_out)
  br i1 %has_address, label %own_reference, label %no
own_reference:
  call void @Py_IncRef(ptr %data)
  store ptr %data, ptr %owner_out
  ret i1 true
not_by_ref:
  %is_bytes = icmp eq ptr %type, @PyBytes_Type
  br i1 %is_bytes, label %bytes, label %not_bytes
bytes:
  %bytes_size = call i64 @PyBytes_Size(ptr %data)
  %bytes_data = call ptr @PyBytes_AsString(ptr %data)
  br label %sized
not_bytes:
  ; A writable buffer (bytearray, numpy) is shared, never copied: the Python path.
  br label %no
sized:
  %size = phi i64 [ %bytes_size, %bytes ]
  %source = phi ptr [ %bytes_data, %bytes ]
  ; Empty data, or a size other than the declared layout's: the Python path raises.
  %empty = icmp sle i64 %size, 0
  br i1 %empty, label %no, label %check_layout
check_layout:
  %matches = icmp eq i64 %size, %layout_bytes
  %size_ok = or i1 %matches, %undeclared
  br i1 %size_ok, label %copy, label %no
copy:
  %copied = call i1 @nhf.fast.copy(ptr %source, i64 %size, ptr %arg_out, ptr %owner_out)
  ret i1 %copied
clear:
  call void @nhf.fast.clear_error()
  br label %no
no:
  ret i1 false
}

; ---- the stream and the executor ----

; The handle from stream.__cuda_stream__ (version 0 of the protocol), called
; as a method or read as an attribute (%how, from the stream type's table
; entry): true, with the handle, the handle's int object (borrowed from the
; tuple) and the tuple (a new reference, which keeps it); false (no error set)
; for anything else.
define internal i1 @nhf.fast.stream_handle(ptr %stream, i64 %how, ptr %handle_out, ptr %key_out, ptr %tuple_out) {
entry:
  %version_value = alloca i64, align 8
  %self = alloca ptr, align 8
  %name = call ptr @nhf.fast.object(ptr @nhf.fast.slot.name_cuda_stream)
  %method = load i64, ptr @nhf.fast.stream_method
  %is_method = icmp eq i64 %how, %method
  br i1 %is_method, label %call, label %attribute
call:
  ; stream.__cuda_stream__(), without making a bound method.
  store ptr %stream, ptr %self
  %called = call ptr @PyObject_VectorcallMethod(ptr %name, ptr %self, i64 1, ptr null)
  br label %value
attribute:
  %read = call ptr @PyObject_GetAttr(ptr %stream, ptr %name)
  br label %value
value:
  %result = phi ptr [ %called, %call ], [ %read, %attribute ]
  %failed = icmp eq ptr %result, null
  br i1 %failed, label %clear, label %check_tuple
check_tuple:
  %type = call ptr @nhf.fast.type_of(ptr %result)
  %is_tuple = icmp eq ptr %type, @PyTuple_Type
  br i1 %is_tuple, label %check_size, label %drop
check_size:
  %size = call i64 @nhf.fast.tuple_size(ptr %result)
  %pair = icmp eq i64 %size, 2
  br i1 %pair, label %check_version, label %drop
check_version:
  %version = call ptr @nhf.fast.tuple_item(ptr %result, i64 0)
  %version_int = call i1 @nhf.fast.exact_u64(ptr %version, ptr %version_value)
  br i1 %version_int, label %check_zero, label %drop
check_zero:
  %v = load i64, ptr %version_value
  %zero = icmp eq i64 %v, 0
  br i1 %zero, label %check_handle, label %drop
check_handle:
  %handle = call ptr @nhf.fast.tuple_item(ptr %result, i64 1)
  %handle_int = call i1 @nhf.fast.exact_u64(ptr %handle, ptr %handle_out)
  br i1 %handle_int, label %ok, label %drop
ok:
  store ptr %handle, ptr %key_out
  store ptr %result, ptr %tuple_out
  ret i1 true
drop:
  call void @Py_DecRef(ptr %result)
  ret i1 false
clear:
  call void @nhf.fast.clear_error()
  ret i1 false
}

; An open HostExecutor (the Python path raises for anything else, and
; checks it before it reads the stream's handle, as this does).
define internal i1 @nhf.fast.open_executor(ptr %executor) {
entry:
  %type = call ptr @nhf.fast.type_of(ptr %executor)
  %executor_type = call ptr @nhf.fast.object(ptr @nhf.fast.slot.executor_type)
  %is_executor = icmp eq ptr %type, %executor_type
  br i1 %is_executor, label %closed, label %no
closed:
  %closed_name = call ptr @nhf.fast.object(ptr @nhf.fast.slot.name_closed)
  %flag = call ptr @PyObject_GetAttr(ptr %executor, ptr %closed_name)
  %no_flag = icmp eq ptr %flag, null
  br i1 %no_flag, label %clear, label %check_open
check_open:
  call void @Py_DecRef(ptr %flag)
  %open = icmp eq ptr %flag, @_Py_FalseStruct
  ret i1 %open
clear:
  call void @nhf.fast.clear_error()
  br label %no
no:
  ret i1 false
}

; The executor's lane for the stream whose handle is %key (its _lanes entry):
; true, with the lane; false (no error set) if it has none for that stream yet.
define internal i1 @nhf.fast.lane(ptr %executor, ptr %key, ptr %lane_out) {
entry:
  %lanes_name = call ptr @nhf.fast.object(ptr @nhf.fast.slot.name_lanes)
  %table = call ptr @PyObject_GetAttr(ptr %executor, ptr %lanes_name)
  %no_table = icmp eq ptr %table, null
  br i1 %no_table, label %clear, label %check_dict
check_dict:
  %table_type = call ptr @nhf.fast.type_of(ptr %table)
  %is_dict = icmp eq ptr %table_type, @PyDict_Type
  br i1 %is_dict, label %find, label %drop
find:
  %lane = call ptr @PyDict_GetItemWithError(ptr %table, ptr %key)
  %absent = icmp eq ptr %lane, null
  br i1 %absent, label %drop_clear, label %read
read:
  %read_ok = call i1 @nhf.fast.exact_u64(ptr %lane, ptr %lane_out)
  call void @Py_DecRef(ptr %table)
  ret i1 %read_ok
drop_clear:
  call void @Py_DecRef(ptr %table)
  br label %clear
drop:
  call void @Py_DecRef(ptr %table)
  br label %no
clear:
  call void @nhf.fast.clear_error()
  br label %no
no:
  ret i1 false
}

; On the simulator, whose registry vets every stream: true if the handle
; %key is registered to this very %stream (sim_streams: handle -> a weak
; reference to its Stream); else false, and the Python path decides.  Always
; true on CUDA (no registry).
define internal i1 @nhf.fast.registered(ptr %stream, ptr %key) {
entry:
  %registry = call ptr @nhf.fast.object(ptr @nhf.fast.slot.sim_streams)
  %none = icmp eq ptr %registry, null
  br i1 %none, label %yes, label %find
find:
  %ref = call ptr @PyDict_GetItemWithError(ptr %registry, ptr %key)
  %absent = icmp eq ptr %ref, null
  br i1 %absent, label %clear, label %follow
follow:
  ; Calling a weak reference is C code: it gives its object, or None.
  %object = call ptr @PyObject_CallNoArgs(ptr %ref)
  %failed = icmp eq ptr %object, null
  br i1 %failed, label %clear, label %compare
compare:
  call void @Py_DecRef(ptr %object)
  %same = icmp eq ptr %object, %stream
  ret i1 %same
clear:
  call void @nhf.fast.clear_error()
  ret i1 false
yes:
  ret i1 true
}

; ---- the launch ----

; host_launch(stream, fn, user_data=..., executor=...) for the cases above.
; Returns 0 (launched), 1 (fall through: nothing enqueued, nothing kept, no
; error set) or 2 (an error is set: the enqueue function refused, and
; _fastpath.py's raise_status raised what the Python path raises; or code the
; launch called, such as __cuda_stream__, raised a KeyboardInterrupt).
define internal i64 @nhf.fast.launch(ptr %stream, ptr %fn, ptr %data, ptr %executor) {
entry:
  %address = alloca i64, align 8
  %layout = alloca ptr, align 8
  %layout_bytes = alloca i64, align 8
  %arg = alloca i64, align 8
  %data_owner = alloca ptr, align 8
  %handle = alloca i64, align 8
  %key = alloca ptr, align 8
  %stream_tuple = alloca ptr, align 8
  %lane = alloca i64, align 8
  %made_owner = alloca ptr, align 8
  %result = alloca i64, align 8
  store i64 0, ptr %address
  store i64 0, ptr %arg
  store i64 0, ptr %handle
  store i64 0, ptr %lane
  store i64 0, ptr %layout_bytes
  store ptr null, ptr %layout
  store ptr null, ptr %data_owner
  store ptr null, ptr %key
  store ptr null, ptr %stream_tuple
  store ptr null, ptr %made_owner
  store i64 1, ptr %result
  %stream_type = call ptr @nhf.fast.type_of(ptr %stream)
  %stream_kind = call i64 @nhf.fast.lookup(ptr @nhf.fast.table.stream_types, ptr %stream_type)
  %known_stream = icmp sgt i64 %stream_kind, 0
  br i1 %known_stream, label %classify, label %cleanup
classify:
  %kind = call i64 @nhf.fast.function(ptr %fn, ptr %address, ptr %layout, ptr %layout_bytes)
  %python = load i64, ptr @nhf.fast.kind.python
  %is_python = icmp eq i64 %kind, %python
  br i1 %is_python, label %callable, label %maybe_compiled
callable:
  ; A Python callable takes no user_data (the Python path raises ValueError).
  %no_data = icmp eq ptr %data, @_Py_NoneStruct
  %self = ptrtoint ptr %fn to i64
  store i64 %self, ptr %arg
  br i1 %no_data, label %stream_handle, label %cleanup
maybe_compiled:
  %unknown = icmp eq i64 %kind, 0
  br i1 %unknown, label %cleanup, label %resolve
resolve:
  %layout_object = load ptr, ptr %layout
  %size = load i64, ptr %layout_bytes
  %resolved = call i1 @nhf.fast.user_data(ptr %data, ptr %layout_object, i64 %size, ptr %arg, ptr %data_owner)
  br i1 %resolved, label %stream_handle, label %cleanup
stream_handle:
  %on_executor = icmp ne ptr %executor, @_Py_NoneStruct
  br i1 %on_executor, label %check_executor, label %read_handle
check_executor:
  %usable = call i1 @nhf.fast.open_executor(ptr %executor)
  br i1 %usable, label %read_handle, label %cleanup
read_handle:
  %has_handle = call i1 @nhf.fast.stream_handle(ptr %stream, i64 %stream_kind, ptr %handle, ptr %key, ptr %stream_tuple)
  br i1 %has_handle, label %vet, label %cleanup
vet:
  %vetted_key = load ptr, ptr %key
  %vetted = call i1 @nhf.fast.registered(ptr %stream, ptr %vetted_key)
  br i1 %vetted, label %which_queue, label %cleanup
which_queue:
  br i1 %on_executor, label %find_lane, label %own
find_lane:
  %key_object = load ptr, ptr %key
  %has_lane = call i1 @nhf.fast.lane(ptr %executor, ptr %key_object, ptr %lane)
  br i1 %has_lane, label %own, label %cleanup
own:
  ; What the launch owns, as the Python path builds it: the function alone,
  ; or (function, data, None), or (function, data, None, executor).
  %owned_data = load ptr, ptr %data_owner
  %nothing_else = icmp eq ptr %owned_data, null
  %data_or_none = select i1 %nothing_else, ptr @_Py_NoneStruct, ptr %owned_data
  br i1 %on_executor, label %own_with_executor, label %own_without
own_with_executor:
  %four = call ptr (i64, ...) @PyTuple_Pack(i64 4, ptr %fn, ptr %data_or_none, ptr @_Py_NoneStruct, ptr %executor)
  br label %owner_made
own_without:
  br i1 %nothing_else, label %enqueue, label %own_three
own_three:
  %three = call ptr (i64, ...) @PyTuple_Pack(i64 3, ptr %fn, ptr %owned_data, ptr @_Py_NoneStruct)
  br label %owner_made
owner_made:
  %made = phi ptr [ %four, %own_with_executor ], [ %three, %own_three ]
  store ptr %made, ptr %made_owner
  %no_tuple = icmp eq ptr %made, null
  br i1 %no_tuple, label %clear, label %enqueue
enqueue:
  %owner = phi ptr [ %fn, %own_without ], [ %made, %owner_made ]
  %trampoline_slot = select i1 %is_python, ptr @nhf.fast.slot.run_python, ptr @nhf.fast.slot.run_compiled
  %trampoline = call ptr @nhf.fast.object(ptr %trampoline_slot)
  %fn_address = load i64, ptr %address
  %fnp = inttoptr i64 %fn_address to ptr
  %arg_value = load i64, ptr %arg
  %argp = inttoptr i64 %arg_value to ptr
  %queue_slot = select i1 %on_executor, ptr @nhf.fast.slot.executor_enqueue_fn, ptr @nhf.fast.slot.enqueue_fn
  %enqueue_fn = call ptr @nhf.fast.object(ptr %queue_slot)
  %lane_value = load i64, ptr %lane
  %handle_value = load i64, ptr %handle
  %target = select i1 %on_executor, i64 %lane_value, i64 %handle_value
  %targetp = inttoptr i64 %target to ptr
  %status = call i64 @nhf.enqueue_record(ptr %enqueue_fn, ptr %targetp, ptr %trampoline, ptr %fnp, ptr %argp, ptr %owner)
  %launched = icmp eq i64 %status, 0
  br i1 %launched, label %count, label %refused
count:
  %counter = select i1 %is_python, ptr @nhf.fast.count.python, ptr @nhf.fast.count.compiled
  %pointer_kind = load i64, ptr @nhf.fast.kind.pointer
  %is_pointer = icmp eq i64 %kind, %pointer_kind
  %kind_counter = select i1 %is_pointer, ptr @nhf.fast.count.pointer, ptr %counter
  call void @nhf.fast.count(ptr %kind_counter)
  br i1 %on_executor, label %count_executor, label %done
count_executor:
  call void @nhf.fast.count(ptr @nhf.fast.count.executor)
  br label %done
done:
  store i64 0, ptr %result
  br label %cleanup
refused:
  ; Capturing (a graph node instead) or no free record: the Python path.
  %no_record = load i64, ptr @nhf.status.no_record
  %capturing = load i64, ptr @nhf.status.capturing
  %is_no_record = icmp eq i64 %status, %no_record
  %is_capturing = icmp eq i64 %status, %capturing
  %again = or i1 %is_no_record, %is_capturing
  br i1 %again, label %cleanup, label %raise
raise:
  %raise_status = call ptr @nhf.fast.object(ptr @nhf.fast.slot.raise_status)
  %status_object = call ptr @PyLong_FromUnsignedLongLong(i64 %status)
  %no_status = icmp eq ptr %status_object, null
  br i1 %no_status, label %error, label %call_raise
call_raise:
  %raised = call ptr (ptr, ...) @PyObject_CallFunctionObjArgs(ptr %raise_status, ptr %status_object, ptr %executor, ptr null)
  call void @Py_DecRef(ptr %status_object)
  call void @Py_DecRef(ptr %raised)
  br label %error
error:
  store i64 2, ptr %result
  br label %cleanup
clear:
  call void @nhf.fast.clear_error()
  br label %cleanup
cleanup:
  ; Falling through with an error still set: it is one to raise (clear_error).
  %outcome = load i64, ptr %result
  %falling = icmp eq i64 %outcome, 1
  br i1 %falling, label %check_error, label %release
check_error:
  %pending_error = call ptr @PyErr_Occurred()
  %has_error = icmp ne ptr %pending_error, null
  %final = select i1 %has_error, i64 2, i64 1
  store i64 %final, ptr %result
  br label %release
release:
  %layout_ref = load ptr, ptr %layout
  call void @nhf.fast.release(ptr %layout_ref)
  %data_ref = load ptr, ptr %data_owner
  call void @nhf.fast.release(ptr %data_ref)
  %tuple_ref = load ptr, ptr %stream_tuple
  call void @nhf.fast.release(ptr %tuple_ref)
  %owner_ref = load ptr, ptr %made_owner
  call void @nhf.fast.release(ptr %owner_ref)
  %answer = load i64, ptr %result
  ret i64 %answer
}

; Py_XDECREF without a call for null (most of a launch's references are).
define internal void @nhf.fast.release(ptr %object) alwaysinline {
entry:
  %null = icmp eq ptr %object, null
  br i1 %null, label %done, label %decref
decref:
  call void @Py_DecRef(ptr %object)
  br label %done
done:
  ret void
}

; The call, unchanged, to the Python implementation: fallback(*args, **kwargs).
define internal ptr @nhf.fast.fall_through(ptr %args, i64 %nargs, ptr %kwnames) {
entry:
  call void @nhf.fast.count(ptr @nhf.fast.count.fell_through)
  %positional = call ptr @PyTuple_New(i64 %nargs)
  %no_tuple = icmp eq ptr %positional, null
  br i1 %no_tuple, label %fail, label %fill
fill:
  %i = phi i64 [ 0, %entry ], [ %i1, %put ]
  %more = icmp slt i64 %i, %nargs
  br i1 %more, label %put, label %keywords
put:
  %slot = getelementptr ptr, ptr %args, i64 %i
  %item = load ptr, ptr %slot
  call void @Py_IncRef(ptr %item)
  %set = call i32 @PyTuple_SetItem(ptr %positional, i64 %i, ptr %item)
  %i1 = add i64 %i, 1
  br label %fill
keywords:
  %has_keywords = icmp ne ptr %kwnames, null
  br i1 %has_keywords, label %make_dict, label %call
make_dict:
  %nkw = call i64 @PyTuple_Size(ptr %kwnames)
  %kwargs = call ptr @PyDict_New()
  %no_dict = icmp eq ptr %kwargs, null
  br i1 %no_dict, label %drop_positional, label %fill_dict
fill_dict:
  %k = phi i64 [ 0, %make_dict ], [ %k1, %put_keyword ]
  %more_keywords = icmp slt i64 %k, %nkw
  br i1 %more_keywords, label %put_keyword, label %call
put_keyword:
  %name = call ptr @PyTuple_GetItem(ptr %kwnames, i64 %k)
  %value_index = add i64 %nargs, %k
  %value_slot = getelementptr ptr, ptr %args, i64 %value_index
  %value = load ptr, ptr %value_slot
  %stored = call i32 @PyDict_SetItem(ptr %kwargs, ptr %name, ptr %value)
  %k1 = add i64 %k, 1
  %store_failed = icmp ne i32 %stored, 0
  br i1 %store_failed, label %drop_both, label %fill_dict
drop_both:
  call void @Py_DecRef(ptr %kwargs)
  br label %drop_positional
drop_positional:
  call void @Py_DecRef(ptr %positional)
  br label %fail
call:
  %dict = phi ptr [ null, %keywords ], [ %kwargs, %fill_dict ]
  %fallback = call ptr @nhf.fast.object(ptr @nhf.fast.slot.fallback)
  %result = call ptr @PyObject_Call(ptr %fallback, ptr %positional, ptr %dict)
  call void @Py_DecRef(ptr %positional)
  call void @Py_DecRef(ptr %dict)
  ret ptr %result
fail:
  ret ptr null
}

; numba_hostfn.host_launch(stream, fn, *, user_data=None, executor=None, blocking=True)
define ptr @nhf_py_host_launch(ptr %self, ptr %args, i64 %nargs, ptr %kwnames) {
entry:
  %data = alloca ptr, align 8
  %executor = alloca ptr, align 8
  store ptr @_Py_NoneStruct, ptr %data
  store ptr @_Py_NoneStruct, ptr %executor
  %enabled = call i64 @nhf.fast.word(ptr @nhf.fast.slot.enabled)
  %on = icmp ne i64 %enabled, 0
  %two = icmp eq i64 %nargs, 2
  %go = and i1 %on, %two
  br i1 %go, label %keywords, label %fall
keywords:
  %has_keywords = icmp ne ptr %kwnames, null
  br i1 %has_keywords, label %count_keywords, label %launch
count_keywords:
  %nkw = call i64 @nhf.fast.tuple_size(ptr %kwnames)
  %user_data_name = call ptr @nhf.fast.object(ptr @nhf.fast.slot.name_user_data)
  %executor_name = call ptr @nhf.fast.object(ptr @nhf.fast.slot.name_executor)
  %blocking_name = call ptr @nhf.fast.object(ptr @nhf.fast.slot.name_blocking)
  br label %keyword
keyword:
  ; Names compare by identity: a call site's keywords are interned, like
  ; ours; any other name (or a non-interned one) falls through.
  %i = phi i64 [ 0, %count_keywords ], [ %i1, %next ]
  %more = icmp slt i64 %i, %nkw
  br i1 %more, label %match, label %launch
match:
  %name = call ptr @nhf.fast.tuple_item(ptr %kwnames, i64 %i)
  %value_index = add i64 %i, 2
  %value_slot = getelementptr ptr, ptr %args, i64 %value_index
  %value = load ptr, ptr %value_slot
  %is_data = icmp eq ptr %name, %user_data_name
  br i1 %is_data, label %set_data, label %not_data
set_data:
  store ptr %value, ptr %data
  br label %next
not_data:
  %is_executor = icmp eq ptr %name, %executor_name
  br i1 %is_executor, label %set_executor, label %not_executor
set_executor:
  store ptr %value, ptr %executor
  br label %next
not_executor:
  %is_blocking = icmp eq ptr %name, %blocking_name
  %is_true = icmp eq ptr %value, @_Py_TrueStruct
  %blocking_true = and i1 %is_blocking, %is_true
  br i1 %blocking_true, label %next, label %fall
next:
  %i1 = add i64 %i, 1
  br label %keyword
launch:
  %stream_slot = getelementptr ptr, ptr %args, i64 0
  %stream = load ptr, ptr %stream_slot
  %fn_slot = getelementptr ptr, ptr %args, i64 1
  %fn = load ptr, ptr %fn_slot
  %data_value = load ptr, ptr %data
  %executor_value = load ptr, ptr %executor
  %outcome = call i64 @nhf.fast.launch(ptr %stream, ptr %fn, ptr %data_value, ptr %executor_value)
  switch i64 %outcome, label %raised [ i64 0, label %none
                                       i64 1, label %fall ]
none:
  call void @Py_IncRef(ptr @_Py_NoneStruct)
  ret ptr @_Py_NoneStruct
raised:
  ret ptr null
fall:
  %answer = call ptr @nhf.fast.fall_through(ptr %args, i64 %nargs, ptr %kwnames)
  ret ptr %answer
}
