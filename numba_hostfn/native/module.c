/* numba_hostfn._core: the module root.  It makes the module, adds its status
 * constants, and calls every file's *_init, bottom-up (nhf.h's layers); no file
 * calls into it.  Each file adds its own entry points and addresses.
 *
 * Addresses cross into Python as ints (the trampolines, the enqueue functions,
 * a simulated stream, a pool's lane): Python hands them back to these entry
 * points or to the driver, never dereferences them.
 */
#include "nhf.h"

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "numba_hostfn._core",
    .m_doc = "The native core of numba_hostfn: launch records, trampolines, enqueue, "
             "host_launch's common cases, the simulator, the HostExecutor and signals.",
    .m_size = -1, /* one interpreter: the state is the process's (LIFETIME.md, Scope) */
};

static int add_status(PyObject *module, const char *name, uint64_t value) {
    PyObject *word = PyLong_FromUnsignedLongLong(value);
    if (word == NULL)
        return -1;
    int rc = PyModule_AddObjectRef(module, name, word);
    Py_DECREF(word);
    return rc;
}

/* main_interpreter() -> whether the calling interpreter is the main one. */
static PyObject *py_main_interpreter(PyObject *module, PyObject *unused) {
    (void)module;
    (void)unused;
    return PyBool_FromLong(PyInterpreterState_Get() == PyInterpreterState_Main());
}

static PyMethodDef methods[] = {
    {"main_interpreter", py_main_interpreter, METH_NOARGS,
     "main_interpreter($module, /)\n--\n\n"
     "Whether the calling interpreter is the main one (the package refuses others)."},
    {NULL, NULL, 0, NULL},
};

PyMODINIT_FUNC PyInit__core(void) {
    /* One interpreter (LIFETIME.md, Scope): pending calls go to the main one, the
     * guard and the records are the process's, and a sub-interpreter's exit hook
     * would close the guard for all.  An isolated sub-interpreter refuses this
     * single-phase module itself; a legacy one (shared GIL) that imports it first
     * is refused here, up to 3.12.  From 3.13 CPython runs a single-phase init in
     * the main interpreter, and hands the module to the sub-interpreter: the
     * package's __init__ asks main_interpreter() and refuses it there. */
    if (PyInterpreterState_Get() != PyInterpreterState_Main()) {
        PyErr_SetString(PyExc_ImportError,
                        "numba_hostfn runs in the main interpreter only, not in a "
                        "sub-interpreter");
        return NULL;
    }
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL)
        return NULL;
    if (PyModule_AddFunctions(module, methods) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    if (add_status(module, "CAPTURE_CHECK_FAILED", NHF_CAPTURE_CHECK_FAILED) < 0 ||
        add_status(module, "CAPTURING", NHF_CAPTURING) < 0 ||
        add_status(module, "QUEUE_STOPPED", NHF_QUEUE_STOPPED) < 0 ||
        add_status(module, "OUT_OF_MEMORY", NHF_OUT_OF_MEMORY) < 0 ||
        add_status(module, "KEPT", NHF_KEPT) < 0 ||
        add_status(module, "EXECUTOR_CLOSED", NHF_EXECUTOR_CLOSED) < 0 ||
        add_status(module, "IN_HOST_FUNCTION", NHF_IN_HOST_FUNCTION) < 0 ||
        add_status(module, "FAULTED", NHF_FAULTED) < 0 ||
        add_status(module, "LANE_STALE", NHF_LANE_STALE) < 0 ||
        /* Bottom-up, as nhf.h lists the layers. */
        nhf_driver_init(module) < 0 || nhf_guard_init(module) < 0 ||
        nhf_compiled_init(module) < 0 ||
        nhf_buffer_ref_init(module) < 0 || nhf_records_init(module) < 0 ||
        nhf_trampolines_init(module) < 0 || nhf_kinds_init(module) < 0 ||
        nhf_watchdog_init(module) < 0 ||
        nhf_enqueue_init(module) < 0 || nhf_cuda_init(module) < 0 ||
        nhf_simulator_init(module) < 0 || nhf_notify_init(module) < 0 ||
        nhf_graph_slots_init(module) < 0 || nhf_pool_init(module) < 0 ||
        nhf_executor_init(module) < 0 || nhf_launch_config_init(module) < 0 ||
        nhf_host_launch_init(module) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
