/* BufferRef: a buffer, exported while a launch owns it; format_holds_objects.
 *
 * A BufferRef holds a buffer export of its object for as long as it lives: a
 * launch that owns it keeps the object alive, and a bytearray unresizable
 * (LIFETIME.md, invariants 1 and 7).  The copy a launch makes of read-only
 * user data is one too (nhf_buffer_ref_copy), on both paths.  GIL held
 * throughout.
 */
#include "nhf.h"

#include <string.h>

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
            /* A name may itself hold a colon (ctypes writes _fields_ names as they
             * are), which shifts this parse: a code would be read as a name.  An
             * empty name ("::") or one with format syntax in it is such a shift:
             * then every 'O' counts, to be safe. */
            bool shifted = end == c + 1;
            for (const char *n = c + 1; n < end && !shifted; n++)
                shifted = strchr("<>=!@^{}()", *n) != NULL;
            if (shifted)
                return strchr(format, 'O') != NULL;
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

/* The references a BufferRef holds, for the cyclic collector: a cycle through
 * one (an ndarray subclass that keeps its own by_ref) was never collected, and
 * kept its buffer exported for ever.  BufferRef itself is no GC type (a launch's
 * copy of its user data is one: no work for the collector per launch); its Python
 * subclass ByRef is, and calls these through subtype_traverse and subtype_clear. */
static int byref_traverse(PyObject *self_, visitproc visit, void *arg) {
    nhf_byref_object *self = (nhf_byref_object *)self_;
    Py_VISIT(self->obj);
    Py_VISIT(self->dtype);
    if (self->exported)
        Py_VISIT(self->view.obj);
    return 0;
}

static int byref_clear(PyObject *self_) {
    nhf_byref_object *self = (nhf_byref_object *)self_;
    if (self->exported) { /* unreachable garbage: no launch owns it */
        self->exported = 0;
        PyBuffer_Release(&self->view);
    }
    Py_CLEAR(self->obj);
    Py_CLEAR(self->dtype);
    return 0;
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
    {"dtype", byref_dtype, NULL, "The dtype given (by_ref's: _userdata.buffer_dtype), or None.",
     NULL},
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
    .tp_traverse = byref_traverse,
    .tp_clear = byref_clear,
    .tp_getset = byref_getset,
};

/* A BufferRef of a new bytearray holding a copy of size bytes at data, as the
 * Python path's _core.BufferRef(bytearray(view)) makes it: a new reference and
 * the copy's address, or NULL with an error set. */
PyObject *nhf_buffer_ref_copy(const char *data, Py_ssize_t size, uintptr_t *address) {
    PyObject *copy = PyByteArray_FromStringAndSize(data, size);
    if (copy == NULL)
        return NULL;
    PyObject *ref = PyObject_CallOneArg((PyObject *)&nhf_byref_type, copy);
    Py_DECREF(copy);
    if (ref == NULL)
        return NULL;
    *address = (uintptr_t)((nhf_byref_object *)ref)->view.buf;
    return ref;
}

static PyMethodDef methods[] = {
    {"format_holds_objects", py_format_holds_objects, METH_O,
     "format_holds_objects($module, format, /)\n--\n\n"
     "Returns whether a buffer format has an 'O' item (names skipped)."},
    {NULL, NULL, 0, NULL},
};

int nhf_buffer_ref_init(PyObject *module) {
    if (PyType_Ready(&nhf_byref_type) < 0 ||
        PyModule_AddObjectRef(module, "BufferRef", (PyObject *)&nhf_byref_type) < 0 ||
        PyModule_AddFunctions(module, methods) < 0)
        return -1;
    return 0;
}
