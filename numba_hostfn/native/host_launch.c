/* numba_hostfn.host_launch: the common launches here, everything else in Python.
 *
 * host_launch is this METH_FASTCALL | METH_KEYWORDS builtin.  It binds its
 * arguments (a wrong count or keyword is its own TypeError, naming
 * host_launch), decides the common cases with direct type checks, with the GIL
 * held, and hands every other call, unchanged, to the one Python implementation
 * (_launch.host_launch_python), which alone raises the other errors:
 *
 *   stream    a simulated Stream whose __cuda_stream__() gives its own native
 *             stream, or a cuda.core Stream whose __cuda_stream__() gives
 *             (0, handle) (the types the backend registered);
 *   fn        a CompiledBase of kind compiled (a HostFunction: compiled.c),
 *             a ctypes CUhostFn
 *             (exactly CFUNCTYPE(None, c_void_p), as the instance declares it
 *             now), a plain function or a bound method whose code is no
 *             generator's or coroutine's and needs no argument;
 *   user_data None (a body that does not read it), a nonzero int, a ByRef of
 *             the declared dtype and size, bytes (copied); for a Python
 *             callable, None;
 *   executor  an executor that has a lane for the stream; blocking True.
 *
 * Each launch is a kind of kinds.c's table, which gives its trampoline and the
 * rule for its owner (nhf_launch_owner), as the Python path reads them.
 *
 * Capture (the enqueue function says the stream is capturing), a type it does
 * not know, a HostFunction never compiled (address 0), a CompiledBase of
 * another kind or none, and any ordinary error
 * of a check (a bad value) fall through: nothing enqueued, nothing kept, no
 * error set.  A call that falls through after asking the stream's
 * __cuda_stream__ goes, with its answer, to _launch.host_launch_answered, which
 * launches with that answer: the protocol is asked once per call (asked again,
 * it may count its calls, or name another stream).  What __cuda_stream__
 * raises (its own error, or a signal
 * handler's exception raised inside it) is raised as it is, with nothing
 * enqueued, as the Python path raises it; so is an exception that is not an
 * Exception (a KeyboardInterrupt) from any other check (LIFETIME.md,
 * invariant 20).  A refused enqueue is raised by the backend's Python function
 * that raises for a status, as the Python path does.
 */
#include "nhf.h"

#include <string.h>

/* ---- deciding -------------------------------------------------------------------- */

/* NHF_KIND_NONE: not decided here; the launch falls through to Python. */
#define UNKNOWN NHF_KIND_NONE

/* After a failed call: an ordinary error (an Exception) is cleared, and the
 * launch falls through to the Python path, which raises its own; anything else
 * (KeyboardInterrupt, SystemExit) stays set, to be raised. */
static void clear_ordinary_error(void) {
    if (PyErr_ExceptionMatches(PyExc_Exception))
        PyErr_Clear();
}

/* An exact int as an unsigned 64-bit value; false (no error set) if it is not one. */
static bool exact_u64(PyObject *value, uint64_t *out) {
    if (!PyLong_CheckExact(value))
        return false;
    unsigned long long n = nhf_as_u64(value);
    if (n == (unsigned long long)-1 && PyErr_Occurred()) {
        clear_ordinary_error();
        return false;
    }
    *out = n;
    return true;
}

/* Code flags of a function whose call makes a generator, coroutine or async
 * generator and never runs its body: _hostfunction's SUSPENDING_FLAGS.  Such a
 * function falls through to Python (_classify), which refuses it: one decision. */
#define SUSPENDING_FLAGS (CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR)

/* A plain function (bound 0) or a bound method's function (bound 1) that is no
 * generator or coroutine function and can be called with no arguments. */
static enum nhf_kind plain_function(PyObject *function, Py_ssize_t bound) {
    PyCodeObject *code = (PyCodeObject *)PyFunction_GET_CODE(function);
    if (code->co_flags & SUSPENDING_FLAGS) /* Python refuses it */
        return UNKNOWN;
    if (code->co_kwonlyargcount != 0) /* keyword-only defaults: Python checks those */
        return UNKNOWN;
    if (bound > code->co_argcount && !(code->co_flags & CO_VARARGS))
        return UNKNOWN; /* a method without self: no call succeeds; Python refuses it */
    PyObject *defaults = PyFunction_GET_DEFAULTS(function);
    Py_ssize_t given = defaults == NULL ? 0 : PyTuple_GET_SIZE(defaults);
    return code->co_argcount - bound - given > 0 ? UNKNOWN : NHF_KIND_PYTHON;
}

/* What ctypes' data descriptor descr gives for fn (its restype or argtypes, as
 * fn's calls use it): a new reference, or NULL with an error set.  Called
 * directly, as _compat.pointer_prototype calls it: no attribute lookup. */
static PyObject *declared(PyObject *descr, PyObject *fn) {
    if (descr == NULL) /* unset by a configure_launch that the other descriptor ran */
        return NULL;   /* (no error set: the launch falls through) */
    return Py_TYPE(descr)->tp_descr_get(descr, fn, (PyObject *)Py_TYPE(fn));
}

/* A ctypes CUhostFn as the instance declares it now: restype None, argtypes
 * (c_void_p,) or [c_void_p], and its address (the pointer is the object's buffer). */
static enum nhf_kind ctypes_pointer(PyObject *fn, uintptr_t *address) {
    PyObject *restype = declared(nhf_launch.restype_descr, fn);
    if (restype == NULL) {
        clear_ordinary_error();
        return UNKNOWN;
    }
    bool void_result = restype == Py_None;
    Py_DECREF(restype);
    if (!void_result)
        return UNKNOWN;
    PyObject *argtypes = declared(nhf_launch.argtypes_descr, fn);
    if (argtypes == NULL) {
        clear_ordinary_error();
        return UNKNOWN;
    }
    /* A tuple (a prototype class's), or a list (what an instance's argtypes give
     * back as set: a C library's function is declared so); Python takes any
     * sequence of the one type. */
    bool one_pointer =
        (PyTuple_CheckExact(argtypes) || PyList_CheckExact(argtypes)) &&
        PySequence_Fast_GET_SIZE(argtypes) == 1 &&
        PySequence_Fast_GET_ITEM(argtypes, 0) == nhf_launch.c_void_p;
    Py_DECREF(argtypes);
    if (!one_pointer)
        return UNKNOWN;
    Py_buffer view;
    if (PyObject_GetBuffer(fn, &view, PyBUF_SIMPLE) < 0) {
        clear_ordinary_error();
        return UNKNOWN;
    }
    uintptr_t value = 0;
    if (view.len == (Py_ssize_t)sizeof(void *))
        memcpy(&value, view.buf, sizeof(void *));
    PyBuffer_Release(&view);
    if (value == 0) /* NULL: Python raises ValueError */
        return UNKNOWN;
    *address = value;
    return NHF_KIND_POINTER;
}

/* A ctypes function pointer of another prototype class than CUhostFn (a C
 * library's function, a subclass): whether its class's _flags_ are exactly
 * cdecl, as _compat.pointer_flags reads them (an attribute of the class; ctypes'
 * own flags are in its private type data).  Anything else, a flag more
 * (use_errno) or a value that is no exact int, is the Python path's, which
 * decides by the same attribute. */
static bool declared_cdecl(PyTypeObject *type) {
    PyObject *cdecl = nhf_launch.cdecl_flags;
    if (cdecl == NULL)
        return false;
    PyObject *flags = PyObject_GetAttr((PyObject *)type, nhf_launch.s_flags);
    if (flags == NULL) {
        clear_ordinary_error();
        return false;
    }
    uint64_t value, wanted;
    bool same = exact_u64(flags, &value) && exact_u64(cdecl, &wanted) && value == wanted;
    Py_DECREF(flags);
    return same;
}

/* Whether attribute name of obj is exactly expected (an identity): false for
 * anything else, a failed read included (its ordinary error cleared). */
static bool attribute_is(PyObject *obj, PyObject *name, PyObject *expected) {
    PyObject *value = PyObject_GetAttr(obj, name);
    if (value == NULL) {
        clear_ordinary_error();
        return false;
    }
    bool same = value == expected;
    Py_DECREF(value);
    return same;
}

/* Whether a numba Signature is void(voidptr), with no receiver and no Python
 * signature: _classify compares it by value (Signature.__eq__, Python code); here
 * its four slots by the identity of numba's types, which numba interns, so that
 * no Python code runs.  An equal signature of other objects falls through. */
static bool host_fn_signature(PyObject *sig) {
    if (!Py_IS_TYPE(sig, (PyTypeObject *)nhf_launch.signature_type))
        return false;
    PyObject *args = PyObject_GetAttr(sig, nhf_launch.s_args);
    if (args == NULL) {
        clear_ordinary_error();
        return false;
    }
    bool one_pointer = PyTuple_CheckExact(args) && PyTuple_GET_SIZE(args) == 1 &&
                       PyTuple_GET_ITEM(args, 0) == nhf_launch.voidptr;
    Py_DECREF(args);
    return one_pointer && attribute_is(sig, nhf_launch.s_return_type, nhf_launch.void_type) &&
           attribute_is(sig, nhf_launch.s_recvr, Py_None) &&
           attribute_is(sig, nhf_launch.s_pysig, Py_None);
}

/* A numba cfunc (exactly numba's CFunc: a subclass is Python's) of signature
 * void(voidptr), as _classify reads it (its _sig, then its address property). */
static enum nhf_kind numba_cfunc(PyObject *fn, uintptr_t *address) {
    PyObject *sig = PyObject_GetAttr(fn, nhf_launch.s_sig);
    if (sig == NULL) {
        clear_ordinary_error();
        return UNKNOWN;
    }
    bool host_fn = host_fn_signature(sig);
    Py_DECREF(sig);
    if (!host_fn)
        return UNKNOWN; /* Python refuses another signature */
    PyObject *value = PyObject_GetAttr(fn, nhf_launch.s_address);
    if (value == NULL) {
        clear_ordinary_error();
        return UNKNOWN;
    }
    uint64_t got;
    bool usable = exact_u64(value, &got) && got != 0;
    Py_DECREF(value);
    if (!usable)
        return UNKNOWN;
    *address = (uintptr_t)got;
    return NHF_KIND_POINTER;
}

/* What fn is: a kind, or UNKNOWN to fall through.  For compiled code, its
 * address, and for a HostFunction its layout and whether it reads its argument. */
static enum nhf_kind function_kind(PyObject *fn, uintptr_t *address, nhf_compiled_object **compiled) {
    PyTypeObject *type = Py_TYPE(fn);
    if (type == &PyFunction_Type)
        return plain_function(fn, 0);
    if (type == &PyMethod_Type) {
        PyObject *function = PyMethod_GET_FUNCTION(fn);
        return Py_IS_TYPE(function, &PyFunction_Type) ? plain_function(function, 1) : UNKNOWN;
    }
    if (PyObject_TypeCheck(fn, &nhf_compiled_type)) {
        nhf_compiled_object *host_function = (nhf_compiled_object *)fn;
        if (host_function->address == 0) /* never compiled: Python raises ValueError */
            return UNKNOWN;
        /* Only the kind it declares (a HostFunction's: compiled); any other, or
         * none, is Python's to refuse (_classify), never assumed one-argument code. */
        if (host_function->kind != NHF_KIND_COMPILED)
            return UNKNOWN;
        *address = host_function->address;
        *compiled = host_function;
        return NHF_KIND_COMPILED;
    }
    if ((PyObject *)type == nhf_launch.cuhostfn_type)
        return ctypes_pointer(fn, address);
    if (nhf_launch.pointer_type != NULL &&
        PyObject_TypeCheck(fn, (PyTypeObject *)nhf_launch.pointer_type) && declared_cdecl(type))
        return ctypes_pointer(fn, address);
    if ((PyObject *)type == nhf_launch.cfunc_type && nhf_launch.signature_type != NULL)
        return numba_cfunc(fn, address);
    return UNKNOWN;
}

/* user_data of compiled code, as _userdata.resolve_user_data resolves it, for
 * None, a nonzero int, a ByRef and bytes: true, with the address and what the
 * launch must own (a new reference, or NULL); false to fall through. */
static bool user_data(PyObject *data, nhf_compiled_object *compiled, uintptr_t *arg,
                      PyObject **owner) {
    PyObject *layout = compiled != NULL ? compiled->layout : NULL;
    *owner = NULL;
    if (data == Py_None) { /* NULL: only for a body that never reads it */
        *arg = 0;
        return layout == NULL && (compiled == NULL || !compiled->reads_user_data);
    }
    uint64_t value;
    if (PyLong_CheckExact(data)) /* an address, as is; NULL: Python decides */
        return exact_u64(data, &value) && (*arg = (uintptr_t)value) != 0;
    if (nhf_launch.byref_type != NULL &&
        PyObject_TypeCheck(data, (PyTypeObject *)nhf_launch.byref_type)) {
        /* A ByRef (by_ref's type): a bare _core.BufferRef is no user data in Python. */
        nhf_byref_object *ref = (nhf_byref_object *)data;
        if (!ref->exported || ref->pin_only)
            return false;
        if (layout != NULL && ((ref->dtype != layout && ref->dtype != Py_None) ||
                               ref->view.len != compiled->layout_bytes))
            return false; /* Python compares the dtypes by value, and says what differs */
        *arg = (uintptr_t)ref->view.buf;
        *owner = Py_NewRef(data);
        return true;
    }
    if (PyBytes_CheckExact(data)) { /* copied: a body may write its user data */
        Py_ssize_t size = PyBytes_GET_SIZE(data);
        if (size <= 0 || (layout != NULL && size != compiled->layout_bytes))
            return false;
        /* A BufferRef of a bytearray copy, as _userdata.resolve_user_data makes it. */
        PyObject *copy = nhf_buffer_ref_copy(PyBytes_AS_STRING(data), size, arg);
        if (copy == NULL) {
            clear_ordinary_error();
            return false;
        }
        *owner = copy;
        return true;
    }
    return false;
}

/* With a TypeError set by calling stream.__cuda_stream__: the attribute, if it is a
 * value and not a method (a new reference, the TypeError cleared): the protocol's
 * answer, as _streams.stream_handle reads it; else NULL, the TypeError kept (a
 * method raised it), also if reading the attribute fails. */
static PyObject *cuda_stream_value(PyObject *stream) {
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyObject *attribute = PyObject_GetAttr(stream, nhf_launch.s_cuda_stream);
    if (attribute != NULL && !PyCallable_Check(attribute)) {
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(traceback);
        return attribute;
    }
    Py_XDECREF(attribute);
    PyErr_Clear();
    PyErr_Restore(type, value, traceback);
    return NULL;
}

/* The handle from stream.__cuda_stream__() (version 0 of the protocol), for a
 * stream type the backend registered; false for anything else.  What
 * __cuda_stream__ raises stays set, to be raised as itself (the Python path,
 * _streams.stream_handle, lets it propagate too); a value it does not decide
 * falls through, with no error set, to the Python path (its TypeError, or a
 * launch).  *answer: what the protocol gave, a new reference, wherever it was
 * asked and gave something (else left NULL), for the Python path to read
 * instead of asking again. */
static bool stream_handle(PyObject *stream, void **handle, PyObject **answer) {
    PyTypeObject *type = Py_TYPE(stream);
    void *own = NULL; /* a simulated stream's: the handle must be this one */
    if ((PyObject *)type == nhf_launch.sim_stream_type) {
        if ((own = nhf_sim_stream_of(stream)) == NULL)
            return false;
    } else if (nhf_launch.cuda_stream_type == NULL ||
               !PyObject_TypeCheck(stream, (PyTypeObject *)nhf_launch.cuda_stream_type)) {
        return false;
    }
    PyObject *value = PyObject_CallMethodNoArgs(stream, nhf_launch.s_cuda_stream);
    if (value == NULL) {
        /* A value, not a method (a subclass's attribute): _streams.stream_handle reads
         * it as the protocol's answer; the Python path decides.  Looked at only here,
         * so a launch pays no attribute lookup of its own. */
        if (PyErr_ExceptionMatches(PyExc_TypeError))
            *answer = cuda_stream_value(stream);
        return false; /* else its exception, raised as it is */
    }
    *answer = value; /* the caller's: released, or handed to the Python path */
    uint64_t version, h;
    bool ok = PyTuple_CheckExact(value) && PyTuple_GET_SIZE(value) == 2 &&
              exact_u64(PyTuple_GET_ITEM(value, 0), &version) && version == 0 &&
              exact_u64(PyTuple_GET_ITEM(value, 1), &h);
    if (!ok || (own != NULL && (void *)(uintptr_t)h != own))
        return false; /* not its own handle: Python's registry refuses it */
    *handle = (void *)(uintptr_t)h;
    return true;
}

/* host_launch(stream, fn, user_data=..., executor=...) for the cases above.
 * Returns 0 (launched), 1 (fall through: nothing enqueued, nothing kept but
 * *answer, no error set) or -1 (an error is set: raise it).  *answer: what the
 * stream's __cuda_stream__ gave, where it was asked (a new reference, else NULL),
 * whatever the outcome: the caller's to hand over or release.  Python runs inside
 * (__cuda_stream__, a descriptor, the finalizers of owners released) and may call
 * configure_launch: a slot of nhf_launch read after it may be unset (NULL), and is
 * checked where it is read. */
static int fast_launch(PyObject *stream, PyObject *fn, PyObject *data, PyObject *executor,
                       PyObject **answer) {
    uintptr_t address = 0, arg = 0;
    nhf_compiled_object *compiled = NULL;
    void *handle = NULL, *target;
    /* The stream first, as the Python path asks it: its __cuda_stream__ runs
     * Python, which may change fn (its code, a ctypes prototype), and what is
     * decided after it is what is launched. */
    if (!stream_handle(stream, &handle, answer))
        return PyErr_Occurred() ? -1 : 1;
    enum nhf_kind kind = function_kind(fn, &address, &compiled);
    if (kind == UNKNOWN)
        return PyErr_Occurred() ? -1 : 1;
    const nhf_kind_info *info = &nhf_kinds[kind]; /* the table Python reads too */
    PyObject *data_owner = NULL;
    if (info->owns == NHF_OWNS_FN) { /* the callable is the argument: no user_data */
        if (data != Py_None)
            return 1; /* Python raises ValueError */
        arg = (uintptr_t)fn;
    } else if (!user_data(data, compiled, &arg, &data_owner)) {
        return PyErr_Occurred() ? -1 : 1;
    }
    int outcome = 1;
    PyObject *owner = NULL;
    nhf_pool *pool = NULL;
    if (executor != Py_None) {
        if (!PyObject_TypeCheck(executor, &nhf_executor_type))
            goto done;
        pool = ((nhf_executor_object *)executor)->pool;
        if (pool == NULL)
            goto done;
    }
    target = handle;
    if (pool != NULL && (target = nhf_exec_find_lane(pool, handle)) == NULL)
        goto done; /* Python makes the lane */
    /* What the launch owns: the one rule, the Python path's too (kinds.c). */
    owner = nhf_launch_owner(fn, data_owner, Py_None, pool != NULL ? executor : Py_None);
    if (owner == NULL)
        goto error;
    nhf_hostfn trampoline = info->run;
    int route = pool != NULL ? nhf_launch.executor_route : nhf_launch.route;
    uint64_t status = nhf_enqueue_launch(route, target, trampoline,
                                         (nhf_hostfn)address, (void *)arg, NULL, owner);
    if (status == NHF_NO_RECORD)
        goto error;
    if (status == NHF_CAPTURING || status == NHF_LANE_STALE)
        goto done; /* a graph node instead, or a lane of the stream's own: the Python path */
    if (status != 0) {
        PyObject *word = PyLong_FromUnsignedLongLong(status);
        PyObject *on = PyLong_FromVoidPtr(handle); /* the stream: its context's fault */
        /* configure may swap it, or unset it (from Python that the launch ran) */
        PyObject *raise_status = Py_XNewRef(nhf_launch.raise_status);
        PyObject *raised = word == NULL || on == NULL || raise_status == NULL
                               ? NULL
                               : PyObject_CallFunctionObjArgs(raise_status, word, executor,
                                                              on, NULL);
        Py_XDECREF(raise_status);
        Py_XDECREF(word);
        Py_XDECREF(on);
        Py_XDECREF(raised);
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "host_launch: the enqueue was refused");
        goto error;
    }
    nhf_count_launch(kind);
    if (pool != NULL)
        nhf_count_launch(NHF_COUNT_EXECUTOR);
    outcome = 0;
    goto done;
error:
    outcome = -1;
done:
    if (outcome == 1 && PyErr_Occurred())
        outcome = -1; /* falling with an error still set: one to raise */
    Py_XDECREF(owner);
    Py_XDECREF(data_owner);
    return outcome;
}

/* Whether the keyword name is the interned parameter name (its identity, as
 * source code passes it, or its value, as a ** dict may). */
static bool is_name(PyObject *name, PyObject *parameter) {
    return name == parameter || PyUnicode_Compare(name, parameter) == 0;
}

/* The argument errors of host_launch(stream, fn, *, user_data=None,
 * executor=None, blocking=True), raised here so that they name host_launch and
 * say what to do, not the Python implementation behind it (which binds the
 * same parameters): 0, or -1 with a TypeError set. */
static int check_arguments(Py_ssize_t nargs, PyObject *kwnames) {
    if (nargs > 2) {
        PyErr_Format(PyExc_TypeError,
                     "host_launch() takes 2 positional arguments (stream, fn) but %zd were "
                     "given; user_data, executor and blocking are keyword-only: pass "
                     "user_data=... as a keyword",
                     nargs);
        return -1;
    }
    PyObject *const positional[2] = {nhf_launch.s_stream, nhf_launch.s_fn};
    bool given[2] = {nargs > 0, nargs > 1};
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i);
        if (is_name(name, nhf_launch.s_user_data) || is_name(name, nhf_launch.s_executor) ||
            is_name(name, nhf_launch.s_blocking))
            continue;
        int which = is_name(name, positional[0]) ? 0 : is_name(name, positional[1]) ? 1 : -1;
        if (which < 0) {
            PyErr_Format(PyExc_TypeError,
                         "host_launch() got an unexpected keyword argument '%U'; it takes "
                         "stream and fn, and the keywords user_data, executor and blocking",
                         name);
            return -1;
        }
        if (given[which]) {
            PyErr_Format(PyExc_TypeError, "host_launch() got multiple values for argument '%U'",
                         positional[which]);
            return -1;
        }
        given[which] = true;
    }
    for (int which = 0; which < 2; which++) {
        if (!given[which]) {
            PyErr_Format(PyExc_TypeError,
                         "host_launch() missing required argument '%U': call it as "
                         "host_launch(stream, fn, user_data=...)",
                         positional[which]);
            return -1;
        }
    }
    return 0;
}

/* The Python path for a call that fell through after __cuda_stream__ gave answer:
 * host_launch_answered(answer, stream, fn, **keywords), the call's own arguments
 * after the answer. */
static PyObject *fall_answered(PyObject *answer, PyObject *const *args, Py_ssize_t nargs,
                               PyObject *kwnames) {
    PyObject *stack[1 + 2 + 3]; /* the answer, stream and fn, at most three keywords */
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    if (1 + nargs + nkw > (Py_ssize_t)(sizeof stack / sizeof stack[0])) {
        /* Never: the fast path runs for stream, fn and the three keywords only. */
        PyErr_SetString(PyExc_SystemError, "host_launch: too many arguments to hand over");
        return NULL;
    }
    stack[0] = answer;
    memcpy(stack + 1, args, (size_t)(nargs + nkw) * sizeof(PyObject *));
    if (nhf_launch.answered == NULL) { /* unset by Python that the launch ran */
        PyErr_SetString(PyExc_RuntimeError, "numba_hostfn._launch is not imported");
        return NULL;
    }
    PyObject *answered = Py_NewRef(nhf_launch.answered); /* configure may swap it */
    PyObject *result = PyObject_Vectorcall(answered, stack, (size_t)(1 + nargs), kwnames);
    Py_DECREF(answered);
    return result;
}

/* numba_hostfn.host_launch(stream, fn, *, user_data=None, executor=None, blocking=True) */
PyObject *nhf_host_launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                          PyObject *kwnames) {
    (void)self;
    PyObject *data = Py_None, *executor = Py_None, *answer = NULL;
    if ((nargs != 2 || kwnames != NULL) && check_arguments(nargs, kwnames) < 0)
        return NULL;
    if (!nhf_launch.configured || !nhf_launch.wanted || nhf_forked() || nargs != 2)
        goto fall;
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i), *value = args[nargs + i];
        if (name == nhf_launch.s_user_data)
            data = value;
        else if (name == nhf_launch.s_executor)
            executor = value;
        else if (name != nhf_launch.s_blocking || value != Py_True)
            goto fall; /* blocking=False, a name not interned, an unknown keyword */
    }
    switch (fast_launch(args[0], args[1], data, executor, &answer)) {
    case 0:
        Py_XDECREF(answer);
        Py_RETURN_NONE;
    case -1:
        Py_XDECREF(answer);
        return NULL;
    }
fall:
    nhf_count_launch(NHF_COUNT_FELL_THROUGH);
    if (answer != NULL) { /* the stream was asked: Python launches with its answer */
        PyObject *handed = fall_answered(answer, args, nargs, kwnames);
        Py_DECREF(answer);
        return handed;
    }
    if (nhf_launch.fallback == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "numba_hostfn._launch is not imported");
        return NULL;
    }
    PyObject *fallback = Py_NewRef(nhf_launch.fallback); /* configure may swap it */
    PyObject *result = PyObject_Vectorcall(fallback, args, (size_t)nargs, kwnames);
    Py_DECREF(fallback);
    return result;
}

static PyMethodDef host_launch_def = {
    "host_launch", (PyCFunction)(void (*)(void))nhf_host_launch, METH_FASTCALL | METH_KEYWORDS,
    NULL, /* set by make_host_launch: the signature line, then the numpydoc docstring */
};

/* make_host_launch(doc) -> the builtin, with doc as its __doc__ (its first line
 * "host_launch(...)\n--\n\n" becomes its __text_signature__); once. */
static PyObject *py_make_host_launch(PyObject *module, PyObject *doc) {
    static PyObject *made;
    if (made != NULL)
        return Py_NewRef(made);
    Py_ssize_t size;
    const char *text = PyUnicode_AsUTF8AndSize(doc, &size);
    if (text == NULL)
        return NULL;
    char *kept = PyMem_RawMalloc((size_t)size + 1); /* for the process's life */
    if (kept == NULL)
        return PyErr_NoMemory();
    memcpy(kept, text, (size_t)size + 1);
    host_launch_def.ml_doc = kept;
    PyObject *name = PyUnicode_FromString("numba_hostfn");
    made = name == NULL ? NULL : PyCFunction_NewEx(&host_launch_def, NULL, name);
    Py_XDECREF(name);
    (void)module;
    return Py_XNewRef(made);
}

static PyMethodDef methods[] = {
    {"make_host_launch", py_make_host_launch, METH_O,
     "make_host_launch($module, doc, /)\n--\n\n"
     "Returns the host_launch builtin, documented by doc."},
    {NULL, NULL, 0, NULL},
};

int nhf_host_launch_init(PyObject *module) { return PyModule_AddFunctions(module, methods); }
