/* numba_hostfn._core: the module, its entry points for Python, and its constants.
 *
 * Addresses cross into Python as ints (the trampolines, the enqueue functions,
 * a simulated stream, a pool's lane): Python hands them back to these entry
 * points or to the driver, never dereferences them.
 */
#include "nhf.h"

#include <stdlib.h>

int nhf_address_arg(PyObject *value, void **out) {
    if (!PyLong_Check(value)) {
        PyErr_Format(PyExc_TypeError, "expected an address (an int), got %.100s",
                     Py_TYPE(value)->tp_name);
        return -1;
    }
    unsigned long long n = PyLong_AsUnsignedLongLong(value);
    if (n == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    *out = (void *)(uintptr_t)n;
    return 0;
}

int nhf_add_address(PyObject *module, const char *name, void *address) {
    PyObject *value = PyLong_FromVoidPtr(address);
    if (value == NULL)
        return -1;
    int rc = PyModule_AddObjectRef(module, name, value);
    Py_DECREF(value);
    return rc;
}

static int address_args(const char *usage, PyObject *const *args, Py_ssize_t nargs,
                        Py_ssize_t expected, void **out) {
    if (nargs != expected) {
        PyErr_Format(PyExc_TypeError, "%s takes %zd arguments (%zd given)", usage, expected, nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < expected; i++)
        if (nhf_address_arg(args[i], &out[i]) < 0)
            return -1;
    return 0;
}

/* enqueue(enqueue_fn, target, trampoline, fn, arg, owner[, context]) -> status,
 * for the Python implementation of host_launch (and host_copy, release_after,
 * the executor's): nhf_enqueue_record. */
static PyObject *py_enqueue(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    void *a[5], *context = NULL;
    if (nargs != 6 && nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "enqueue(enqueue_fn, handle, trampoline, fn, arg, owner"
                                         "[, context]) takes 6 or 7 arguments");
        return NULL;
    }
    if (address_args("enqueue", args, 5, 5, a) < 0 ||
        (nargs == 7 && nhf_address_arg(args[6], &context) < 0))
        return NULL;
    uint64_t status = nhf_enqueue_record((nhf_enqueue_fn)(uintptr_t)a[0], a[1],
                                         (nhf_hostfn)(uintptr_t)a[2], (nhf_hostfn)(uintptr_t)a[3],
                                         a[4], context, args[5]);
    if (status == NHF_NO_RECORD)
        return NULL;
    return PyLong_FromUnsignedLongLong(status);
}

static PyObject *py_drain(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyLong_FromSsize_t(nhf_drain());
}

static PyObject *py_held(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyLong_FromSsize_t(nhf_records_held());
}

static PyObject *py_schedule_failures(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyLong_FromSsize_t(nhf_schedule_failures());
}

/* close_guard(ms) -> how many threads were still inside CPython after ms. */
static PyObject *py_close_guard(PyObject *self, PyObject *arg) {
    (void)self;
    long ms = PyLong_AsLong(arg);
    if (ms == -1 && PyErr_Occurred())
        return NULL;
    return PyLong_FromLong(nhf_guard_close(ms));
}

/* set_cuda(is_capturing, launch_host_func, write_value32, wait_value32,
 * batch_mem_op): the driver's entry points (cuGetProcAddress); batch_mem_op 0
 * where the driver lacks it. */
static PyObject *py_set_cuda(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    void *a[5];
    if (address_args("set_cuda", args, nargs, 5, a) < 0)
        return NULL;
    atomic_store(&nhf_cuda.is_capturing, (nhf_cu_is_capturing)(uintptr_t)a[0]);
    atomic_store(&nhf_cuda.launch_host_func, (nhf_cu_launch_host_func)(uintptr_t)a[1]);
    atomic_store(&nhf_cuda.write_value32, (nhf_cu_write_value32)(uintptr_t)a[2]);
    atomic_store(&nhf_cuda.wait_value32, (nhf_cu_wait_value32)(uintptr_t)a[3]);
    atomic_store(&nhf_cuda.batch_mem_op, (nhf_cu_batch_mem_op)(uintptr_t)a[4]);
    Py_RETURN_NONE;
}

/* host_words(nbytes) -> address: zeroed memory for a simulated HostExecutor's
 * words, never freed (a stream may still wait on them). */
static PyObject *py_host_words(PyObject *self, PyObject *arg) {
    (void)self;
    Py_ssize_t nbytes = PyLong_AsSsize_t(arg);
    if (nbytes == -1 && PyErr_Occurred())
        return NULL;
    void *words = nbytes > 0 ? calloc(1, (size_t)nbytes) : NULL;
    if (words == NULL)
        return PyErr_Format(PyExc_MemoryError,
                            "the simulator could not allocate a HostExecutor's words (%zd bytes)",
                            nbytes);
    return PyLong_FromVoidPtr(words);
}

static PyMethodDef methods[] = {
    {"host_words", py_host_words, METH_O,
     "host_words($module, nbytes, /)\n--\n\n"
     "Returns zeroed memory, never freed"},
    {"enqueue", (PyCFunction)(void (*)(void))py_enqueue, METH_FASTCALL,
     "enqueue($module, enqueue_fn, target, trampoline, fn, arg, owner, context=0, /)\n--\n\n"
     "Returns status"},
    {"drain", py_drain, METH_NOARGS,
     "drain($module, /)\n--\n\n"
     "Release the records that have run; return how many."},
    {"held", py_held, METH_NOARGS,
     "held($module, /)\n--\n\n"
     "Records taken and not released."},
    {"schedule_failures", py_schedule_failures, METH_NOARGS,
     "schedule_failures($module, /)\n--\n\n"
     "How many times Py_AddPendingCall refused a drain."},
    {"close_guard", py_close_guard, METH_O,
     "close_guard($module, ms, /)\n--\n\n"
     "No thread of ours enters CPython from now on; wait for those inside."},
    {"set_cuda", (PyCFunction)(void (*)(void))py_set_cuda, METH_FASTCALL,
     "set_cuda($module, is_capturing, launch_host_func, write_value32, wait_value32, "
     "batch_mem_op, /)\n--\n\n"
     "The driver's entry points (cuGetProcAddress); batch_mem_op 0 where the driver lacks it."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "numba_hostfn._core",
    .m_doc = "The native core of numba_hostfn: launch records, trampolines, enqueue, "
             "host_launch's common cases, the simulator, the HostExecutor and signals.",
    .m_size = -1, /* one interpreter: the state is the process's (LIFETIME.md, Scope) */
    .m_methods = methods,
};

static int add_status(PyObject *module, const char *name, uint64_t value) {
    PyObject *word = PyLong_FromUnsignedLongLong(value);
    if (word == NULL)
        return -1;
    int rc = PyModule_AddObjectRef(module, name, word);
    Py_DECREF(word);
    return rc;
}

PyMODINIT_FUNC PyInit__core(void) {
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL)
        return NULL;
    if (add_status(module, "CAPTURE_CHECK_FAILED", NHF_CAPTURE_CHECK_FAILED) < 0 ||
        add_status(module, "CAPTURING", NHF_CAPTURING) < 0 ||
        add_status(module, "QUEUE_STOPPED", NHF_QUEUE_STOPPED) < 0 ||
        add_status(module, "OUT_OF_MEMORY", NHF_OUT_OF_MEMORY) < 0 ||
        add_status(module, "KEPT", NHF_KEPT) < 0 ||
        add_status(module, "EXECUTOR_CLOSED", NHF_EXECUTOR_CLOSED) < 0 ||
        add_status(module, "IN_HOST_FUNCTION", NHF_IN_HOST_FUNCTION) < 0 ||
        add_status(module, "FAULTED", NHF_FAULTED) < 0 ||
        nhf_add_address(module, "RUN_COMPILED", (void *)(uintptr_t)nhf_run_compiled) < 0 ||
        nhf_add_address(module, "RUN_PYTHON", (void *)(uintptr_t)nhf_run_python) < 0 ||
        nhf_add_address(module, "REPLAY_PYTHON", (void *)(uintptr_t)nhf_replay_python) < 0 ||
        nhf_add_address(module, "USER_OBJECT_RELEASE",
                        (void *)(uintptr_t)nhf_user_object_release) < 0 ||
        nhf_add_address(module, "CUDA_ENQUEUE", (void *)(uintptr_t)nhf_cuda_enqueue) < 0 ||
        nhf_fork_init() < 0 || nhf_enqueue_init(module) < 0 || nhf_host_launch_init(module) < 0 ||
        nhf_simulator_init(module) < 0 ||
        nhf_executor_init(module) < 0 || nhf_notify_init(module) < 0 ||
        nhf_watchdog_init(module) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
