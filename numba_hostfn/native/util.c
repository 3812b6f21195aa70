/* Shared helpers, below everything: the arguments of the entry points Python calls
 * (an address, a pointer that must not be NULL, a count of arguments), the
 * module's address constants and its pthread keys.  GIL held, all of them.
 */
#include "nhf.h"

#include <errno.h>

int nhf_address_arg(PyObject *value, void **out) {
    if (!PyLong_Check(value)) {
        PyErr_Format(PyExc_TypeError, "expected an address (an int), got %.100s",
                     Py_TYPE(value)->tp_name);
        return -1;
    }
    unsigned long long n = nhf_as_u64(value);
    if (n == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    *out = (void *)(uintptr_t)n;
    return 0;
}

void *nhf_pointer_arg(PyObject *value, const char *what) {
    void *pointer;
    if (nhf_address_arg(value, &pointer) < 0)
        return NULL;
    if (pointer == NULL)
        PyErr_Format(PyExc_ValueError, "a NULL %s", what);
    return pointer;
}

int nhf_check_nargs(const char *usage, Py_ssize_t nargs, Py_ssize_t expected) {
    if (nargs == expected)
        return 0;
    PyErr_Format(PyExc_TypeError, "%s takes %zd arguments (%zd given)", usage, expected, nargs);
    return -1;
}

int nhf_address_args(const char *usage, PyObject *const *args, Py_ssize_t nargs,
                     Py_ssize_t expected, void **out) {
    if (nhf_check_nargs(usage, nargs, expected) < 0)
        return -1;
    for (Py_ssize_t i = 0; i < expected; i++)
        if (nhf_address_arg(args[i], &out[i]) < 0)
            return -1;
    return 0;
}

int nhf_key_create_once(pthread_key_t *key, bool *made) {
    if (*made)
        return 0;
    int rc = pthread_key_create(key, NULL);
    if (rc != 0) {
        errno = rc;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    *made = true;
    return 0;
}

int nhf_add_testing(PyObject *module, PyMethodDef *methods) {
    PyObject *testing = PyObject_GetAttrString(module, "_testing");
    if (testing == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            return -1;
        PyErr_Clear();
        testing = PyModule_New("numba_hostfn._core._testing");
        if (testing == NULL)
            return -1;
        if (PyModule_AddStringConstant(testing, "__doc__",
                                       "The native core's hooks for tests only: counters, "
                                       "stand-ins, pauses.  Not an API.") < 0 ||
            PyModule_AddObjectRef(module, "_testing", testing) < 0) {
            Py_DECREF(testing);
            return -1;
        }
    }
    int rc = PyModule_AddFunctions(testing, methods);
    Py_DECREF(testing);
    return rc;
}

int nhf_add_address(PyObject *module, const char *name, void *address) {
    PyObject *value = PyLong_FromVoidPtr(address);
    if (value == NULL)
        return -1;
    int rc = PyModule_AddObjectRef(module, name, value);
    Py_DECREF(value);
    return rc;
}
