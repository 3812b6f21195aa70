/* The CUDA driver's entry points: one table (driver.h), filled once by the CUDA
 * backend (driver_load), read by every file that calls the driver (cuda.c,
 * executor_cuda.c).  The names come from this table to Python
 * (driver_entry_points), which resolves them through cuGetProcAddress, so the
 * list is written once.
 */
#include "nhf.h"

#include <string.h>

struct nhf_driver nhf_driver;

/* Set once driver_load has filled the table: the CUDA routes serve from then on. */
static atomic_bool loaded;

bool nhf_driver_loaded(void) { return atomic_load_explicit(&loaded, memory_order_acquire); }

static const struct {
    const char *name;
    int required;
} entry_points[] = {
#define NHF_DRIVER_NAME(name, required) {#name, required},
    NHF_DRIVER_ENTRY_POINTS(NHF_DRIVER_NAME)
#undef NHF_DRIVER_NAME
};
enum { NENTRY_POINTS = sizeof entry_points / sizeof entry_points[0] };

/* GIL held: store entry point i (the table's order). */
static void store(int i, void *address) {
    int at = 0;
#define NHF_DRIVER_STORE(name, required)                                                     \
    if (at++ == i)                                                                          \
        atomic_store_explicit(&nhf_driver.name, (nhf_##name##_fn)(uintptr_t)address,         \
                              memory_order_release);
    NHF_DRIVER_ENTRY_POINTS(NHF_DRIVER_STORE)
#undef NHF_DRIVER_STORE
}

/* GIL held: entry point i's address (the table's order). */
static void *load(int i) {
    int at = 0;
    void *address = NULL;
#define NHF_DRIVER_LOAD(name, required)                                                      \
    if (at++ == i)                                                                          \
        address = (void *)(uintptr_t)NHF_CU(name);
    NHF_DRIVER_ENTRY_POINTS(NHF_DRIVER_LOAD)
#undef NHF_DRIVER_LOAD
    return address;
}

static int index_of(PyObject *name) {
    const char *s = PyUnicode_Check(name) ? PyUnicode_AsUTF8(name) : NULL;
    if (s == NULL) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_TypeError, "expected an entry point's name (a str), got %.100s",
                         Py_TYPE(name)->tp_name);
        return -1;
    }
    for (int i = 0; i < NENTRY_POINTS; i++)
        if (strcmp(entry_points[i].name, s) == 0)
            return i;
    PyErr_Format(PyExc_ValueError, "%s is not in the driver table (driver_entry_points())", s);
    return -1;
}

/* driver_entry_points() -> ((name, required), ...), in the table's order. */
static PyObject *py_driver_entry_points(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    PyObject *out = PyTuple_New(NENTRY_POINTS);
    for (int i = 0; out != NULL && i < NENTRY_POINTS; i++) {
        PyObject *item = Py_BuildValue("(sO)", entry_points[i].name,
                                       entry_points[i].required ? Py_True : Py_False);
        if (item == NULL)
            Py_CLEAR(out);
        else
            PyTuple_SET_ITEM(out, i, item);
    }
    return out;
}

/* driver_load(addresses) -> names missing: the table, filled from one address for
 * each of driver_entry_points(), in its order (0 for an optional one the driver
 * lacks).  Checked whole before anything is stored: a required one that is 0 is a
 * ValueError naming it, and the table stays as it was. */
static PyObject *py_driver_load(PyObject *self, PyObject *addresses) {
    (void)self;
    void *a[NENTRY_POINTS];
    PyObject *seq = PySequence_Fast(addresses, "driver_load(addresses): a tuple of addresses");
    if (seq == NULL)
        return NULL;
    if (PySequence_Fast_GET_SIZE(seq) != NENTRY_POINTS) {
        PyErr_Format(PyExc_TypeError,
                     "driver_load(addresses) takes %d addresses, one for each of "
                     "driver_entry_points() (%zd given)",
                     (int)NENTRY_POINTS, PySequence_Fast_GET_SIZE(seq));
        Py_DECREF(seq);
        return NULL;
    }
    for (int i = 0; i < NENTRY_POINTS; i++) {
        if (nhf_address_arg(PySequence_Fast_GET_ITEM(seq, i), &a[i]) < 0) {
            Py_DECREF(seq);
            return NULL;
        }
        if (a[i] == NULL && entry_points[i].required) {
            PyErr_Format(PyExc_ValueError,
                         "driver_load: %s is NULL, and the CUDA backend needs it",
                         entry_points[i].name);
            Py_DECREF(seq);
            return NULL;
        }
    }
    Py_DECREF(seq);
    PyObject *missing = PyList_New(0); /* made whole before anything is stored */
    for (int i = 0; missing != NULL && i < NENTRY_POINTS; i++) {
        if (a[i] != NULL)
            continue;
        PyObject *name = PyUnicode_FromString(entry_points[i].name);
        if (name == NULL || PyList_Append(missing, name) < 0)
            Py_CLEAR(missing);
        Py_XDECREF(name);
    }
    PyObject *out = missing == NULL ? NULL : PyList_AsTuple(missing);
    Py_XDECREF(missing);
    if (out == NULL)
        return NULL;
    for (int i = 0; i < NENTRY_POINTS; i++)
        store(i, a[i]);
    atomic_store_explicit(&loaded, true, memory_order_release);
    return out;
}

/* driver_swap(name, address) -> the address it had: a test's stand-in for one
 * entry point, put back by a second swap.  0 (none) only for an optional entry
 * point, or before the table is loaded (the simulator's): a required one that
 * is NULL in a loaded table would be called. */
static PyObject *py_driver_swap(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    void *address;
    if (nhf_check_nargs("driver_swap(name, address)", nargs, 2) < 0)
        return NULL;
    int i = index_of(args[0]);
    if (i < 0 || nhf_address_arg(args[1], &address) < 0)
        return NULL;
    if (address == NULL && entry_points[i].required && nhf_driver_loaded()) {
        PyErr_Format(PyExc_ValueError,
                     "driver_swap: %s is required, and the table is loaded: it may not be NULL",
                     entry_points[i].name);
        return NULL;
    }
    void *before = load(i);
    store(i, address);
    return PyLong_FromVoidPtr(before);
}

/* driver_address(name) -> the entry point's address now (0 for none). */
static PyObject *py_driver_address(PyObject *self, PyObject *name) {
    (void)self;
    int i = index_of(name);
    return i < 0 ? NULL : PyLong_FromVoidPtr(load(i));
}

static PyMethodDef driver_methods[] = {
    {"driver_entry_points", py_driver_entry_points, METH_NOARGS,
     "driver_entry_points($module, /)\n--\n\n"
     "The driver table's entry points: ((name, required), ...), in its order."},
    {"driver_load", py_driver_load, METH_O,
     "driver_load($module, addresses, /)\n--\n\n"
     "Fill the driver table (one address per entry point, 0 where the driver lacks an "
     "optional one); returns the names missing."},
    {NULL, NULL, 0, NULL},
};

static PyMethodDef testing_methods[] = {
    {"driver_swap", (PyCFunction)(void (*)(void))py_driver_swap, METH_FASTCALL,
     "driver_swap($module, name, address, /)\n--\n\n"
     "Set one entry point (a test's stand-in); returns the address it had."},
    {"driver_address", py_driver_address, METH_O,
     "driver_address($module, name, /)\n--\n\n"
     "One entry point's address now (0 for none)."},
    {NULL, NULL, 0, NULL},
};

int nhf_driver_init(PyObject *module) {
    if (PyModule_AddFunctions(module, driver_methods) < 0 ||
        PyModule_AddIntConstant(module, "DRIVER_ABI_VERSION", NHF_DRIVER_ABI_VERSION) < 0)
        return -1;
    return nhf_add_testing(module, testing_methods);
}
