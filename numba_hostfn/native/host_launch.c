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
 *   fn        a HostFunction (the compiled base type below), a ctypes CUhostFn
 *             (exactly CFUNCTYPE(None, c_void_p), as the instance declares it
 *             now), a plain function or a bound method whose code is no
 *             coroutine's and needs no argument;
 *   user_data None (a body that does not read it), a nonzero int, a ByRef of
 *             the declared dtype and size, bytes (copied); for a Python
 *             callable, None;
 *   executor  an executor that has a lane for the stream; blocking True.
 *
 * Capture (the enqueue function says the stream is capturing), a type it does
 * not know, a HostFunction never compiled (address 0), and any ordinary error
 * of a check (a bad value) fall through: nothing enqueued, nothing kept, no
 * error set.  What __cuda_stream__ raises (its own error, or a signal
 * handler's exception raised inside it) is raised as it is, with nothing
 * enqueued, as the Python path raises it; so is an exception that is not an
 * Exception (a KeyboardInterrupt) from any other check (LIFETIME.md,
 * invariant 20).  A refused enqueue is raised by the backend's Python function
 * that raises for a status, as the Python path does.
 */
#include "nhf.h"

#include <structmember.h>
#include <string.h>

enum { FELL_THROUGH, COMPILED, POINTER, PYTHON, EXECUTOR, NCOUNTS };
static const char *const count_names[NCOUNTS] = {"fell_through", "compiled", "pointer",
                                                 "python", "executor"};
static atomic_long counts[NCOUNTS];

static struct {
    PyObject *fallback;        /* the Python host_launch */
    PyObject *raise_status;    /* raise_status(status, executor): raises */
    PyObject *sim_stream_type; /* numba_hostfn.simulator.Stream (exactly) */
    PyObject *cuda_stream_type; /* cuda.core's Stream (and its subclasses) */
    PyObject *cuhostfn_type;   /* ctypes.CFUNCTYPE(None, ctypes.c_void_p) */
    PyObject *c_void_p;        /* ctypes.c_void_p */
    nhf_enqueue_fn enqueue_fn;
    nhf_enqueue_fn executor_enqueue_fn;
    int configured;
    int wanted;                /* tests may send every call to Python */
    PyObject *s_stream, *s_fn, *s_user_data, *s_executor, *s_blocking;
    PyObject *s_cuda_stream, *s_restype, *s_argtypes;
} launch = {.wanted = 1};

/* ---- the compiled-function base type (HostFunction subclasses it) ------------ */

static PyObject *compiled_bind(PyObject *self_, PyObject *const *args, Py_ssize_t nargs) {
    nhf_compiled_object *self = (nhf_compiled_object *)self_;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "_bind(address, dtype, layout_bytes, reads_user_data)");
        return NULL;
    }
    if (self->address != 0) {
        PyErr_SetString(PyExc_RuntimeError, "a HostFunction is bound once");
        return NULL;
    }
    void *address;
    if (nhf_address_arg(args[0], &address) < 0)
        return NULL;
    Py_ssize_t layout_bytes = PyLong_AsSsize_t(args[2]);
    if (layout_bytes == -1 && PyErr_Occurred())
        return NULL;
    int reads = PyObject_IsTrue(args[3]);
    if (reads < 0)
        return NULL;
    if (address == NULL) {
        PyErr_SetString(PyExc_ValueError, "a HostFunction's address cannot be NULL");
        return NULL;
    }
    self->address = (uintptr_t)address;
    self->layout = args[1] == Py_None ? NULL : Py_NewRef(args[1]);
    self->layout_bytes = layout_bytes;
    self->reads_user_data = reads;
    Py_RETURN_NONE;
}

static PyObject *compiled_address(PyObject *self, void *closure) {
    (void)closure;
    return PyLong_FromSize_t(((nhf_compiled_object *)self)->address);
}

static PyObject *compiled_dtype(PyObject *self, void *closure) {
    (void)closure;
    PyObject *layout = ((nhf_compiled_object *)self)->layout;
    return Py_NewRef(layout != NULL ? layout : Py_None);
}

static PyObject *compiled_reads(PyObject *self, void *closure) {
    (void)closure;
    return PyBool_FromLong(((nhf_compiled_object *)self)->reads_user_data);
}

static void compiled_dealloc(PyObject *self) {
    Py_CLEAR(((nhf_compiled_object *)self)->layout);
    Py_TYPE(self)->tp_free(self);
}

static PyMethodDef compiled_methods[] = {
    {"_bind", (PyCFunction)(void (*)(void))compiled_bind, METH_FASTCALL,
     "_bind($self, address, dtype, layout_bytes, reads_user_data, /)\n--\n\n"
     "Set once, at compile time."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef compiled_getset[] = {
    {"address", compiled_address, NULL, "The ``void (*)(void *)`` machine-code address.", NULL},
    {"dtype", compiled_dtype, NULL, "The declared user_data layout (a numpy dtype), or None.",
     NULL},
    {"reads_user_data", compiled_reads, NULL,
     "Whether the body reads its argument (then user_data=None is refused).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject nhf_compiled_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "numba_hostfn._core.CompiledBase",
    .tp_doc = "A compiled CUhostFn's address and layout (HostFunction subclasses this).",
    .tp_basicsize = sizeof(nhf_compiled_object),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_new = PyType_GenericNew,
    .tp_dealloc = compiled_dealloc,
    .tp_methods = compiled_methods,
    .tp_getset = compiled_getset,
};

/* ---- ByRef: a buffer, exported while a launch owns it ----------------------------- */

/* Whether a buffer's struct format (PEP 3118, as the struct module and numpy
 * write it) has an item of type 'O', a Python object pointer.  Only type codes
 * count: a structured type's field names, each between two colons, are skipped
 * ("T{<d:Open:}" is one double named Open).  NULL is "B", bytes. */
static bool format_holds_objects(const char *format) {
    for (const char *c = format; c != NULL && *c != '\0'; c++) {
        if (*c == 'O')
            return true;
        if (*c == ':') { /* a field name: up to the next colon */
            const char *end = strchr(c + 1, ':');
            if (end == NULL)
                return strchr(c + 1, 'O') != NULL; /* malformed: as codes, to be safe */
            c = end;
        }
    }
    return false;
}

/* format_holds_objects(format) -> bool, for the Python path's checks. */
static PyObject *py_format_holds_objects(PyObject *self, PyObject *format) {
    (void)self;
    const char *text = PyUnicode_AsUTF8(format);
    if (text == NULL)
        return NULL;
    return PyBool_FromLong(format_holds_objects(text));
}

/* BufferRef(obj, dtype=None, *, pin_only=False).  Without pin_only: obj's writable,
 * C-contiguous buffer, to share with a host function as its user data.  With
 * pin_only: any layout, read-only or not, held only so that the memory an address
 * was taken from stays put (host_copy's buffers, a record's fields); never user
 * data (user_data() below falls through for it). */
static int byref_init(PyObject *self_, PyObject *args, PyObject *kwargs) {
    nhf_byref_object *self = (nhf_byref_object *)self_;
    PyObject *obj, *dtype = Py_None;
    int pin_only = 0;
    static char *keywords[] = {"obj", "dtype", "pin_only", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O$p:BufferRef", keywords, &obj, &dtype,
                                     &pin_only))
        return -1;
    if (self->exported) {
        PyErr_SetString(PyExc_RuntimeError, "a ByRef is made once");
        return -1;
    }
    /* The export pins the buffer: a bytearray cannot be resized (and moved), nor a
     * memoryview released, while it lives (invariants 1 and 7). */
    int flags = pin_only ? PyBUF_RECORDS_RO : PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT;
    if (PyObject_GetBuffer(obj, &self->view, flags) < 0)
        return -1;
    /* What every launch of it relies on, checked once, here (ByRef's Python
     * checks say more, first): a byte to point at, and no object pointers. */
    if (self->view.len == 0 || format_holds_objects(self->view.format)) {
        /* A pin is made for host_copy's buffers and a record's address fields. */
        const char *who = pin_only ? "a buffer that host_copy or a record() field points to"
                                   : "the buffer given to by_ref()";
        if (self->view.len == 0)
            PyErr_Format(PyExc_ValueError, "%s is empty: it needs at least one byte", who);
        else
            PyErr_Format(PyExc_TypeError,
                         "%s holds Python objects; a host function cannot use object "
                         "pointers without the GIL: pass numeric data",
                         who);
        PyBuffer_Release(&self->view);
        return -1;
    }
    self->exported = 1;
    self->pin_only = pin_only;
    self->obj = Py_NewRef(obj);
    self->dtype = Py_NewRef(dtype);
    return 0;
}

static void byref_dealloc(PyObject *self_) {
    nhf_byref_object *self = (nhf_byref_object *)self_;
    if (self->exported)
        PyBuffer_Release(&self->view);
    Py_CLEAR(self->obj);
    Py_CLEAR(self->dtype);
    Py_TYPE(self_)->tp_free(self_);
}

static PyObject *byref_address(PyObject *self, void *closure) {
    (void)closure;
    nhf_byref_object *ref = (nhf_byref_object *)self;
    return PyLong_FromVoidPtr(ref->exported ? ref->view.buf : NULL);
}

static PyObject *byref_nbytes(PyObject *self, void *closure) {
    (void)closure;
    nhf_byref_object *ref = (nhf_byref_object *)self;
    return PyLong_FromSsize_t(ref->exported ? ref->view.len : 0);
}

static PyObject *byref_obj(PyObject *self, void *closure) {
    (void)closure;
    PyObject *obj = ((nhf_byref_object *)self)->obj;
    return Py_NewRef(obj != NULL ? obj : Py_None);
}

static PyObject *byref_dtype(PyObject *self, void *closure) {
    (void)closure;
    PyObject *dtype = ((nhf_byref_object *)self)->dtype;
    return Py_NewRef(dtype != NULL ? dtype : Py_None);
}

static PyGetSetDef byref_getset[] = {
    {"obj", byref_obj, NULL, "The buffer's object.", NULL},
    {"address", byref_address, NULL, "The buffer's address.", NULL},
    {"nbytes", byref_nbytes, NULL, "The buffer's size in bytes.", NULL},
    {"dtype", byref_dtype, NULL, "The numpy array's dtype, or None.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject nhf_byref_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "numba_hostfn._core.BufferRef",
    .tp_doc = "BufferRef(obj, dtype=None, *, pin_only=False)\n--\n\n"
              "obj's writable, C-contiguous "
              "buffer, exported; with pin_only, any buffer, exported only to keep its memory "
              "in place.",
    .tp_basicsize = sizeof(nhf_byref_object),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_new = PyType_GenericNew,
    .tp_init = byref_init,
    .tp_dealloc = byref_dealloc,
    .tp_getset = byref_getset,
};

/* ---- deciding -------------------------------------------------------------------- */

enum kind { UNKNOWN, KIND_COMPILED, KIND_POINTER, KIND_PYTHON };

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
    unsigned long long n = PyLong_AsUnsignedLongLong(value);
    if (n == (unsigned long long)-1 && PyErr_Occurred()) {
        clear_ordinary_error();
        return false;
    }
    *out = n;
    return true;
}

/* A plain function (bound 0) or a bound method's function (bound 1) that is no
 * coroutine function and can be called with no arguments. */
static enum kind plain_function(PyObject *function, Py_ssize_t bound) {
    PyCodeObject *code = (PyCodeObject *)PyFunction_GET_CODE(function);
    if (code->co_flags & (CO_COROUTINE | CO_ASYNC_GENERATOR)) /* _classify's _ASYNC_FLAGS */
        return UNKNOWN;
    if (code->co_kwonlyargcount != 0) /* keyword-only defaults: Python checks those */
        return UNKNOWN;
    PyObject *defaults = PyFunction_GET_DEFAULTS(function);
    Py_ssize_t given = defaults == NULL ? 0 : PyTuple_GET_SIZE(defaults);
    return code->co_argcount - bound - given > 0 ? UNKNOWN : KIND_PYTHON;
}

/* A ctypes CUhostFn as the instance declares it now: restype None, argtypes
 * (c_void_p,), and its address (the pointer is the object's buffer). */
static enum kind ctypes_pointer(PyObject *fn, uintptr_t *address) {
    PyObject *restype = PyObject_GetAttr(fn, launch.s_restype);
    if (restype == NULL) {
        clear_ordinary_error();
        return UNKNOWN;
    }
    bool void_result = restype == Py_None;
    Py_DECREF(restype);
    if (!void_result)
        return UNKNOWN;
    PyObject *argtypes = PyObject_GetAttr(fn, launch.s_argtypes);
    if (argtypes == NULL) {
        clear_ordinary_error();
        return UNKNOWN;
    }
    bool one_pointer = PyTuple_CheckExact(argtypes) && PyTuple_GET_SIZE(argtypes) == 1 &&
                       PyTuple_GET_ITEM(argtypes, 0) == launch.c_void_p;
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
    return KIND_POINTER;
}

/* What fn is: a kind, or UNKNOWN to fall through.  For compiled code, its
 * address, and for a HostFunction its layout and whether it reads its argument. */
static enum kind function_kind(PyObject *fn, uintptr_t *address, nhf_compiled_object **compiled) {
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
        *address = host_function->address;
        *compiled = host_function;
        return KIND_COMPILED;
    }
    if ((PyObject *)type == launch.cuhostfn_type)
        return ctypes_pointer(fn, address);
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
    if (PyObject_TypeCheck(data, &nhf_byref_type)) {
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
        PyObject *copy = PyByteArray_FromStringAndSize(PyBytes_AS_STRING(data), size);
        if (copy == NULL) {
            clear_ordinary_error();
            return false;
        }
        *arg = (uintptr_t)PyByteArray_AS_STRING(copy);
        *owner = copy;
        return true;
    }
    return false;
}

/* The handle from stream.__cuda_stream__() (version 0 of the protocol), for a
 * stream type the backend registered; false for anything else.  What
 * __cuda_stream__ raises stays set, to be raised as itself (the Python path,
 * _streams.stream_handle, lets it propagate too); a wrong value falls through,
 * with no error set, to the Python path's TypeError. */
static bool stream_handle(PyObject *stream, void **handle) {
    PyTypeObject *type = Py_TYPE(stream);
    void *own = NULL; /* a simulated stream's: the handle must be this one */
    if ((PyObject *)type == launch.sim_stream_type) {
        if ((own = nhf_sim_stream_of(stream)) == NULL)
            return false;
    } else if (launch.cuda_stream_type == NULL ||
               !PyObject_TypeCheck(stream, (PyTypeObject *)launch.cuda_stream_type)) {
        return false;
    }
    PyObject *value = PyObject_CallMethodNoArgs(stream, launch.s_cuda_stream);
    if (value == NULL)
        return false; /* its exception, raised as it is */
    uint64_t version, h;
    bool ok = PyTuple_CheckExact(value) && PyTuple_GET_SIZE(value) == 2 &&
              exact_u64(PyTuple_GET_ITEM(value, 0), &version) && version == 0 &&
              exact_u64(PyTuple_GET_ITEM(value, 1), &h);
    Py_DECREF(value);
    if (!ok || (own != NULL && (void *)(uintptr_t)h != own))
        return false; /* not its own handle: Python's registry refuses it */
    *handle = (void *)(uintptr_t)h;
    return true;
}

/* host_launch(stream, fn, user_data=..., executor=...) for the cases above.
 * Returns 0 (launched), 1 (fall through: nothing enqueued, nothing kept, no
 * error set) or -1 (an error is set: raise it). */
static int fast_launch(PyObject *stream, PyObject *fn, PyObject *data, PyObject *executor) {
    uintptr_t address = 0, arg = 0;
    nhf_compiled_object *compiled = NULL;
    enum kind kind = function_kind(fn, &address, &compiled);
    if (kind == UNKNOWN)
        return PyErr_Occurred() ? -1 : 1;
    PyObject *data_owner = NULL;
    if (kind == KIND_PYTHON) {
        if (data != Py_None)
            return 1; /* Python raises ValueError */
        arg = (uintptr_t)fn;
    } else if (!user_data(data, compiled, &arg, &data_owner)) {
        return PyErr_Occurred() ? -1 : 1;
    }
    int outcome = 1;
    void *handle = NULL, *target;
    PyObject *owner = NULL;
    nhf_pool *pool = NULL;
    if (executor != Py_None) {
        if (!PyObject_TypeCheck(executor, &nhf_executor_type))
            goto done;
        pool = ((nhf_executor_object *)executor)->pool;
        if (pool == NULL)
            goto done;
    }
    if (!stream_handle(stream, &handle))
        goto done;
    target = handle;
    if (pool != NULL && (target = nhf_exec_find_lane(pool, handle)) == NULL)
        goto done; /* Python makes the lane */
    /* What the launch owns, as the Python path builds it: the function alone,
     * or (function, data, None), or (function, data, None, executor). */
    PyObject *data_or_none = data_owner != NULL ? data_owner : Py_None;
    if (pool != NULL)
        owner = PyTuple_Pack(4, fn, data_or_none, Py_None, executor);
    else if (data_owner != NULL)
        owner = PyTuple_Pack(3, fn, data_or_none, Py_None);
    else
        owner = Py_NewRef(fn);
    if (owner == NULL)
        goto error;
    nhf_hostfn trampoline = kind == KIND_PYTHON ? nhf_run_python : nhf_run_compiled;
    nhf_enqueue_fn enqueue_fn = pool != NULL ? launch.executor_enqueue_fn : launch.enqueue_fn;
    uint64_t status = nhf_enqueue_record(enqueue_fn, target, trampoline,
                                         (nhf_hostfn)address, (void *)arg, NULL, owner);
    if (status == NHF_NO_RECORD)
        goto error;
    if (status == NHF_CAPTURING)
        goto done; /* a graph node instead: the Python path */
    if (status != 0) {
        PyObject *word = PyLong_FromUnsignedLongLong(status);
        PyObject *raise_status = Py_NewRef(launch.raise_status); /* configure may swap it */
        PyObject *raised = word == NULL ? NULL
                                        : PyObject_CallFunctionObjArgs(raise_status, word,
                                                                       executor, NULL);
        Py_DECREF(raise_status);
        Py_XDECREF(word);
        Py_XDECREF(raised);
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "host_launch: the enqueue was refused");
        goto error;
    }
    atomic_fetch_add(&counts[kind == KIND_PYTHON ? PYTHON : kind == KIND_POINTER ? POINTER
                                                                                 : COMPILED],
                     1);
    if (pool != NULL)
        atomic_fetch_add(&counts[EXECUTOR], 1);
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
    PyObject *const positional[2] = {launch.s_stream, launch.s_fn};
    bool given[2] = {nargs > 0, nargs > 1};
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i);
        if (is_name(name, launch.s_user_data) || is_name(name, launch.s_executor) ||
            is_name(name, launch.s_blocking))
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

/* numba_hostfn.host_launch(stream, fn, *, user_data=None, executor=None, blocking=True) */
PyObject *nhf_host_launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                          PyObject *kwnames) {
    (void)self;
    PyObject *data = Py_None, *executor = Py_None;
    if ((nargs != 2 || kwnames != NULL) && check_arguments(nargs, kwnames) < 0)
        return NULL;
    if (!launch.configured || !launch.wanted || nhf_forked() || nargs != 2)
        goto fall;
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i), *value = args[nargs + i];
        if (name == launch.s_user_data)
            data = value;
        else if (name == launch.s_executor)
            executor = value;
        else if (name != launch.s_blocking || value != Py_True)
            goto fall; /* blocking=False, a name not interned, an unknown keyword */
    }
    switch (fast_launch(args[0], args[1], data, executor)) {
    case 0:
        Py_RETURN_NONE;
    case -1:
        return NULL;
    }
fall:
    atomic_fetch_add(&counts[FELL_THROUGH], 1);
    if (launch.fallback == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "numba_hostfn._launch is not imported");
        return NULL;
    }
    PyObject *fallback = Py_NewRef(launch.fallback); /* configure may swap it */
    PyObject *result = PyObject_Vectorcall(fallback, args, (size_t)nargs, kwnames);
    Py_DECREF(fallback);
    return result;
}

/* ---- configuration, from Python ---------------------------------------------------- */

static int set_object(PyObject **slot, PyObject *value) {
    Py_XSETREF(*slot, value == Py_None ? NULL : Py_NewRef(value));
    return 0;
}

/* configure_launch(*, fallback=, raise_status=, enqueue_fn=, executor_enqueue_fn=,
 * sim_stream_type=, cuda_stream_type=, cuhostfn_type=, c_void_p=, wanted=):
 * each given keyword sets what host_launch uses; the fast path is on once
 * raise_status and enqueue_fn are set.  wanted=False sends every call to Python. */
PyObject *nhf_py_configure_launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                  PyObject *kwnames) {
    (void)self;
    if (nargs != 0) {
        PyErr_SetString(PyExc_TypeError, "configure_launch() takes keyword arguments only");
        return NULL;
    }
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < nkw; i++) {
        const char *name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(kwnames, i));
        PyObject *value = args[i];
        void *address;
        if (name == NULL)
            return NULL;
        if (!strcmp(name, "fallback"))
            set_object(&launch.fallback, value);
        else if (!strcmp(name, "raise_status"))
            set_object(&launch.raise_status, value);
        else if (!strcmp(name, "sim_stream_type"))
            set_object(&launch.sim_stream_type, value);
        else if (!strcmp(name, "cuda_stream_type"))
            set_object(&launch.cuda_stream_type, value);
        else if (!strcmp(name, "cuhostfn_type"))
            set_object(&launch.cuhostfn_type, value);
        else if (!strcmp(name, "c_void_p"))
            set_object(&launch.c_void_p, value);
        else if (!strcmp(name, "enqueue_fn")) {
            if (nhf_address_arg(value, &address) < 0)
                return NULL;
            launch.enqueue_fn = (nhf_enqueue_fn)(uintptr_t)address;
            if (address != 0)
                nhf_mark_used(); /* the backend is made: a forked child refuses */
        } else if (!strcmp(name, "executor_enqueue_fn")) {
            if (nhf_address_arg(value, &address) < 0)
                return NULL;
            launch.executor_enqueue_fn = (nhf_enqueue_fn)(uintptr_t)address;
        } else if (!strcmp(name, "wanted")) {
            int wanted = PyObject_IsTrue(value);
            if (wanted < 0)
                return NULL;
            launch.wanted = wanted;
        } else {
            PyErr_Format(PyExc_TypeError, "configure_launch() got an unknown keyword %s", name);
            return NULL;
        }
    }
    launch.configured = launch.fallback != NULL && launch.raise_status != NULL &&
                        launch.enqueue_fn != NULL && launch.executor_enqueue_fn != NULL &&
                        launch.cuhostfn_type != NULL &&
                        launch.c_void_p != NULL;
    Py_RETURN_NONE;
}

/* launch_counts() -> dict: launches that fell through, and fast launches by kind. */
PyObject *nhf_py_launch_counts(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    PyObject *result = PyDict_New();
    for (int i = 0; result != NULL && i < NCOUNTS; i++) {
        PyObject *n = PyLong_FromLong(atomic_load(&counts[i]));
        if (n == NULL || PyDict_SetItemString(result, count_names[i], n) < 0)
            Py_CLEAR(result);
        Py_XDECREF(n);
    }
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
    {"configure_launch", (PyCFunction)(void (*)(void))nhf_py_configure_launch,
     METH_FASTCALL | METH_KEYWORDS,
     "configure_launch($module, /, *, fallback=<unrepresentable>, "
     "raise_status=<unrepresentable>, enqueue_fn=<unrepresentable>, "
     "executor_enqueue_fn=<unrepresentable>, sim_stream_type=<unrepresentable>, "
     "cuda_stream_type=<unrepresentable>, cuhostfn_type=<unrepresentable>, "
     "c_void_p=<unrepresentable>, wanted=<unrepresentable>)\n--\n\n"
     "Each keyword given sets what host_launch uses; an omitted one is left as it is."},
    {"format_holds_objects", py_format_holds_objects, METH_O,
     "format_holds_objects($module, format, /)\n--\n\n"
     "Returns whether a buffer format has an 'O' item (names skipped)."},
    {"launch_counts", nhf_py_launch_counts, METH_NOARGS,
     "launch_counts($module, /)\n--\n\n"
     "Launches that fell through to Python, and fast launches by kind (for tests)."},
    {"make_host_launch", py_make_host_launch, METH_O,
     "make_host_launch($module, doc, /)\n--\n\n"
     "Returns the host_launch builtin, documented by doc."},
    {NULL, NULL, 0, NULL},
};

static PyObject *interned(const char *name) { return PyUnicode_InternFromString(name); }

int nhf_host_launch_init(PyObject *module) {
    if (PyType_Ready(&nhf_compiled_type) < 0 || PyType_Ready(&nhf_byref_type) < 0 ||
        PyModule_AddObjectRef(module, "CompiledBase", (PyObject *)&nhf_compiled_type) < 0 ||
        PyModule_AddObjectRef(module, "BufferRef", (PyObject *)&nhf_byref_type) < 0)
        return -1;
    if (PyModule_AddFunctions(module, methods) < 0)
        return -1;
    launch.s_stream = interned("stream");
    launch.s_fn = interned("fn");
    launch.s_user_data = interned("user_data");
    launch.s_executor = interned("executor");
    launch.s_blocking = interned("blocking");
    launch.s_cuda_stream = interned("__cuda_stream__");
    launch.s_restype = interned("restype");
    launch.s_argtypes = interned("argtypes");
    if (!launch.s_stream || !launch.s_fn || !launch.s_user_data || !launch.s_executor || !launch.s_blocking ||
        !launch.s_cuda_stream || !launch.s_restype || !launch.s_argtypes)
        return -1;
    return 0;
}
