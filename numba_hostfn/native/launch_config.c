/* host_launch's configuration: what the backend and the Python path set, the
 * launch counts, and the interned names the fast path compares keywords with.
 *
 * configure_launch is called from Python (at import, when the backend is made,
 * and by tests that send every call to Python); host_launch.c reads nhf_launch.
 * GIL held throughout: the counts are atomics only so that a reader without it
 * sees whole values; their one writer holds the GIL, so an increment is a load
 * and a store (no locked instruction on every launch).
 */
#include "nhf.h"

#include <string.h>

struct nhf_launch_config nhf_launch = {.wanted = 1};

static struct {
    /* Written at every launch: on lines of their own (nhf.h's NHF_CACHE_LINE). */
    _Alignas(NHF_CACHE_LINE) atomic_long n[NHF_NCOUNTS];
} counts;

static int set_object(PyObject **slot, PyObject *value) {
    Py_XSETREF(*slot, value == Py_None ? NULL : Py_NewRef(value));
    return 0;
}

/* A type (or None) for a slot the fast path casts with: 0, or -1 with a TypeError
 * set.  base: the type it must extend, whose C layout the fast path reads (NULL:
 * any type). */
static int set_type(PyObject **slot, PyObject *value, const char *keyword, PyTypeObject *base) {
    bool usable = value == Py_None ||
                  (PyType_Check(value) &&
                   (base == NULL || PyType_IsSubtype((PyTypeObject *)value, base)));
    if (!usable) {
        PyErr_Format(PyExc_TypeError, "configure_launch(%s=) expected %s or None, got %R",
                     keyword, base != NULL ? "a subclass of _core.BufferRef" : "a type", value);
        return -1;
    }
    return set_object(slot, value);
}

/* The two data descriptors that read a ctypes pointer's (restype, argtypes), or
 * None for neither: 0, or -1 with a TypeError set. */
static int set_prototype(PyObject *value) {
    if (value == Py_None) {
        set_object(&nhf_launch.restype_descr, Py_None);
        set_object(&nhf_launch.argtypes_descr, Py_None);
        return 0;
    }
    if (!PyTuple_CheckExact(value) || PyTuple_GET_SIZE(value) != 2) {
        PyErr_SetString(PyExc_TypeError, "configure_launch(prototype=) expected a tuple "
                                         "(restype descriptor, argtypes descriptor) or None");
        return -1;
    }
    for (Py_ssize_t i = 0; i < 2; i++) {
        PyObject *descr = PyTuple_GET_ITEM(value, i);
        if (Py_TYPE(descr)->tp_descr_get == NULL || !PyDescr_IsData(descr)) {
            PyErr_Format(PyExc_TypeError,
                         "configure_launch(prototype=) expected data descriptors "
                         "(vars(ctypes._CFuncPtr)['restype'], ['argtypes']), got %R",
                         descr);
            return -1;
        }
    }
    set_object(&nhf_launch.restype_descr, PyTuple_GET_ITEM(value, 0));
    set_object(&nhf_launch.argtypes_descr, PyTuple_GET_ITEM(value, 1));
    return 0;
}

/* numba's (CFunc, Signature, voidptr, void), or None for none: 0, or -1 with a
 * TypeError set. */
static int set_cfunc(PyObject *value) {
    PyObject **slots[4] = {&nhf_launch.cfunc_type, &nhf_launch.signature_type,
                           &nhf_launch.voidptr, &nhf_launch.void_type};
    if (value == Py_None) {
        for (int i = 0; i < 4; i++)
            set_object(slots[i], Py_None);
        return 0;
    }
    if (!PyTuple_CheckExact(value) || PyTuple_GET_SIZE(value) != 4 ||
        !PyType_Check(PyTuple_GET_ITEM(value, 0)) || !PyType_Check(PyTuple_GET_ITEM(value, 1))) {
        PyErr_SetString(PyExc_TypeError,
                        "configure_launch(cfunc=) expected a tuple (numba's CFunc, its "
                        "Signature type, types.voidptr, types.void) or None");
        return -1;
    }
    for (int i = 0; i < 4; i++)
        set_object(slots[i], PyTuple_GET_ITEM(value, i));
    return 0;
}

/* configure_launch(*, fallback=, answered=, raise_status=, route=, executor_route=,
 * sim_stream_type=, cuda_stream_type=, cuhostfn_type=, pointer_type=, cdecl_flags=,
 * cfunc=, byref_type=, c_void_p=, prototype=, wanted=):
 * each given keyword sets what host_launch uses; the fast path is on once all
 * but the stream types, pointer_type, cdecl_flags and cfunc are set (without the
 * two pointer keywords, only a CUhostFn is the native path's among ctypes
 * pointers; without cfunc, no numba cfunc is).  wanted=False sends every call to
 * Python. */
PyObject *nhf_py_configure_launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                  PyObject *kwnames) {
    (void)self;
    if (nargs != 0) {
        PyErr_SetString(PyExc_TypeError, "configure_launch() takes keyword arguments only");
        return NULL;
    }
    bool ok = false;
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < nkw; i++) {
        const char *name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(kwnames, i));
        PyObject *value = args[i];
        if (name == NULL)
            goto out;
        if (!strcmp(name, "fallback"))
            set_object(&nhf_launch.fallback, value);
        else if (!strcmp(name, "answered"))
            set_object(&nhf_launch.answered, value);
        else if (!strcmp(name, "raise_status"))
            set_object(&nhf_launch.raise_status, value);
        else if (!strcmp(name, "sim_stream_type"))
            set_object(&nhf_launch.sim_stream_type, value);
        else if (!strcmp(name, "cuda_stream_type")) {
            if (set_type(&nhf_launch.cuda_stream_type, value, name, NULL) < 0)
                goto out;
        } else if (!strcmp(name, "cuhostfn_type"))
            set_object(&nhf_launch.cuhostfn_type, value);
        else if (!strcmp(name, "pointer_type")) {
            if (set_type(&nhf_launch.pointer_type, value, name, NULL) < 0)
                goto out;
        } else if (!strcmp(name, "cfunc")) {
            if (set_cfunc(value) < 0)
                goto out;
        } else if (!strcmp(name, "cdecl_flags")) {
            if (value != Py_None && !PyLong_CheckExact(value)) {
                PyErr_Format(PyExc_TypeError,
                             "configure_launch(cdecl_flags=) expected an int or None, got %R",
                             value);
                goto out;
            }
            set_object(&nhf_launch.cdecl_flags, value);
        } else if (!strcmp(name, "byref_type")) {
            if (set_type(&nhf_launch.byref_type, value, name, &nhf_byref_type) < 0)
                goto out;
        } else if (!strcmp(name, "c_void_p"))
            set_object(&nhf_launch.c_void_p, value);
        else if (!strcmp(name, "prototype")) {
            if (set_prototype(value) < 0)
                goto out;
        } else if (!strcmp(name, "route")) {
            int route = nhf_route_arg(value);
            if (route == NHF_ROUTE_NONE)
                goto out;
            nhf_launch.route = route;
            nhf_mark_used(); /* the backend is made: a forked child refuses */
        } else if (!strcmp(name, "executor_route")) {
            int route = nhf_route_arg(value);
            if (route == NHF_ROUTE_NONE)
                goto out;
            nhf_launch.executor_route = route;
        } else if (!strcmp(name, "wanted")) {
            int wanted = PyObject_IsTrue(value);
            if (wanted < 0)
                goto out;
            nhf_launch.wanted = wanted;
        } else {
            PyErr_Format(PyExc_TypeError, "configure_launch() got an unknown keyword %s", name);
            goto out;
        }
    }
    ok = true;
out:
    /* Recomputed on every exit: the keywords before a bad one are set (a cleared
     * raise_status too), and the fast path must not run with one of them unset. */
    nhf_launch.configured = nhf_launch.fallback != NULL && nhf_launch.answered != NULL &&
                        nhf_launch.raise_status != NULL &&
                        nhf_launch.route != NHF_ROUTE_NONE &&
                        nhf_launch.executor_route != NHF_ROUTE_NONE &&
                        nhf_launch.cuhostfn_type != NULL && nhf_launch.byref_type != NULL &&
                        nhf_launch.c_void_p != NULL && nhf_launch.restype_descr != NULL &&
                        nhf_launch.argtypes_descr != NULL;
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

/* launch_counts() -> dict: launches that fell through, and fast launches by kind
 * (named as the table names them) and on an executor. */
PyObject *nhf_py_launch_counts(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    PyObject *result = PyDict_New();
    for (int i = 0; result != NULL && i < NHF_NCOUNTS; i++) {
        const char *name = i == NHF_COUNT_FELL_THROUGH ? "fell_through"
                           : i == NHF_COUNT_EXECUTOR   ? "executor"
                                                       : nhf_kinds[i].name;
        PyObject *n = PyLong_FromLong(atomic_load(&counts.n[i]));
        if (n == NULL || PyDict_SetItemString(result, name, n) < 0)
            Py_CLEAR(result);
        Py_XDECREF(n);
    }
    return result;
}

void nhf_count_launch(int which) { nhf_gil_count(&counts.n[which], 1); }

static PyMethodDef methods[] = {
    {"configure_launch", (PyCFunction)(void (*)(void))nhf_py_configure_launch,
     METH_FASTCALL | METH_KEYWORDS,
     "configure_launch($module, /, *, fallback=<unrepresentable>, "
     "answered=<unrepresentable>, "
     "raise_status=<unrepresentable>, route=<unrepresentable>, "
     "executor_route=<unrepresentable>, sim_stream_type=<unrepresentable>, "
     "cuda_stream_type=<unrepresentable>, cuhostfn_type=<unrepresentable>, "
     "pointer_type=<unrepresentable>, cdecl_flags=<unrepresentable>, "
     "cfunc=<unrepresentable>, "
     "byref_type=<unrepresentable>, "
     "c_void_p=<unrepresentable>, prototype=<unrepresentable>, "
     "wanted=<unrepresentable>)\n--\n\n"
     "Each keyword given sets what host_launch uses; an omitted one is left as it is."},
    {"launch_counts", nhf_py_launch_counts, METH_NOARGS,
     "launch_counts($module, /)\n--\n\n"
     "Launches that fell through to Python, and fast launches by kind (for tests)."},
    {NULL, NULL, 0, NULL},
};

static PyObject *interned(const char *name) { return PyUnicode_InternFromString(name); }

int nhf_launch_config_init(PyObject *module) {
    if (PyModule_AddFunctions(module, methods) < 0)
        return -1;
    /* The names the fast path compares keywords with, and the attributes it reads. */
    const struct {
        PyObject **slot;
        const char *name;
    } names[] = {
        {&nhf_launch.s_stream, "stream"},
        {&nhf_launch.s_fn, "fn"},
        {&nhf_launch.s_user_data, "user_data"},
        {&nhf_launch.s_executor, "executor"},
        {&nhf_launch.s_blocking, "blocking"},
        {&nhf_launch.s_cuda_stream, "__cuda_stream__"},
        {&nhf_launch.s_flags, "_flags_"},
        {&nhf_launch.s_sig, "_sig"},
        {&nhf_launch.s_address, "address"},
        {&nhf_launch.s_args, "_args"},
        {&nhf_launch.s_return_type, "_return_type"},
        {&nhf_launch.s_recvr, "_recvr"},
        {&nhf_launch.s_pysig, "_pysig"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if ((*names[i].slot = interned(names[i].name)) == NULL)
            return -1;
    return 0;
}
