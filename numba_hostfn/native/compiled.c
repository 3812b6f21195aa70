/* CompiledBase: compiled machine code at an address, and the launch kind it is.
 *
 * HostFunction subclasses it in Python and binds it once, at compile time
 * (_bind): the address, the declared user_data layout, whether the body reads
 * its argument, and its launch kind (kinds.c's table; NHF_KIND_COMPILED for a
 * HostFunction).  host_launch launches a CompiledBase only as the kind it says:
 * one that declares none (or another) is not taken for a one-argument compiled
 * function (LIFETIME.md, invariant 20).  GIL held throughout.
 */
#include "nhf.h"

static PyObject *compiled_bind(PyObject *self_, PyObject *const *args, Py_ssize_t nargs) {
    nhf_compiled_object *self = (nhf_compiled_object *)self_;
    if (nargs != 4 && nargs != 5) {
        PyErr_SetString(PyExc_TypeError,
                        "_bind(address, dtype, layout_bytes, reads_user_data, kind=None)");
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
    long kind = NHF_KIND_NONE;
    if (nargs == 5 && args[4] != Py_None) {
        kind = PyLong_AsLong(args[4]);
        if (kind == -1 && PyErr_Occurred())
            return NULL;
        if (kind <= NHF_KIND_NONE || kind >= NHF_NKINDS) {
            PyErr_Format(PyExc_ValueError,
                         "_bind(): kind %ld is no launch kind (_core.launch_kinds() lists them)",
                         kind);
            return NULL;
        }
    }
    self->address = (uintptr_t)address;
    self->layout = args[1] == Py_None ? NULL : Py_NewRef(args[1]);
    self->layout_bytes = layout_bytes;
    self->reads_user_data = reads;
    self->kind = (int)kind;
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

static PyObject *compiled_kind(PyObject *self, void *closure) {
    (void)closure;
    int kind = ((nhf_compiled_object *)self)->kind;
    if (kind == NHF_KIND_NONE)
        Py_RETURN_NONE;
    return PyLong_FromLong(kind);
}

static void compiled_dealloc(PyObject *self) {
    Py_CLEAR(((nhf_compiled_object *)self)->layout);
    Py_TYPE(self)->tp_free(self);
}

static PyMethodDef compiled_methods[] = {
    {"_bind", (PyCFunction)(void (*)(void))compiled_bind, METH_FASTCALL,
     "_bind($self, address, dtype, layout_bytes, reads_user_data, kind=None, /)\n--\n\n"
     "Set once, at compile time; kind is a launch kind's number (KIND_COMPILED)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef compiled_getset[] = {
    {"address", compiled_address, NULL, "The ``void (*)(void *)`` machine-code address.", NULL},
    {"dtype", compiled_dtype, NULL, "The declared user_data layout (a numpy dtype), or None.",
     NULL},
    {"reads_user_data", compiled_reads, NULL,
     "Whether the body reads its argument (then user_data=None is refused).", NULL},
    {"_kind", compiled_kind, NULL,
     "The launch kind its _bind declared (KIND_COMPILED), or None: not launched.", NULL},
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

int nhf_compiled_init(PyObject *module) {
    if (PyType_Ready(&nhf_compiled_type) < 0 ||
        PyModule_AddObjectRef(module, "CompiledBase", (PyObject *)&nhf_compiled_type) < 0)
        return -1;
    return 0;
}
