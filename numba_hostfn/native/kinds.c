/* The launch kinds: one table, read by the native host_launch and by Python.
 *
 * A launch is one of these kinds (nhf.h's enum nhf_kind); for each, the table
 * says what the record's trampoline is on a stream (run), what a graph node of
 * it calls at every replay (replay, given the record the graph owns; call, the
 * same given the launch's fn and arg, for an executor's graph slot), and what
 * the launch owns (owns).  _classify decides which kind a
 * callable is; host_launch.c decides the common cases and indexes this table;
 * _enqueue and _graphs read it through launch_kinds() (_classify.KINDS).  A new
 * kind is a row here, an enum value in nhf.h, and its classification.
 *
 * launch_owner is the one rule for the owner a launch keeps, used by both
 * paths.  GIL held throughout.
 */
#include "nhf.h"

const nhf_kind_info nhf_kinds[NHF_NKINDS] = {
    [NHF_KIND_NONE] = {.name = NULL},
    /* A HostFunction (a CompiledBase of this kind): fn(user_data), compiled. */
    [NHF_KIND_COMPILED] = {.name = "compiled",
                           .run = nhf_run_compiled,
                           .replay = nhf_replay_compiled,
                           .call = nhf_call_compiled,
                           .owns = NHF_OWNS_FN_AND_DATA},
    /* A ctypes CUhostFn or a numba cfunc: machine code at an address. */
    [NHF_KIND_POINTER] = {.name = "pointer",
                          .run = nhf_run_compiled,
                          .replay = nhf_replay_compiled,
                          .call = nhf_call_compiled,
                          .owns = NHF_OWNS_FN_AND_DATA},
    /* A Python callable, called with no arguments, with the GIL. */
    [NHF_KIND_PYTHON] = {.name = "python",
                         .run = nhf_run_python,
                         .replay = nhf_replay_python,
                         .call = nhf_call_python,
                         .owns = NHF_OWNS_FN},
};

static const char *const owns_names[] = {
    [NHF_OWNS_FN] = "fn",
    [NHF_OWNS_FN_AND_DATA] = "fn, user_data",
};

PyObject *nhf_launch_owner(PyObject *fn, PyObject *data, PyObject *also, PyObject *executor) {
    data = data != NULL ? data : Py_None;
    also = also != NULL ? also : Py_None;
    if (executor != NULL && executor != Py_None) /* an executor outlives its tasks */
        return PyTuple_Pack(4, fn, data, also, executor);
    if (data == Py_None && also == Py_None) /* no object per launch: no work for the gc */
        return Py_NewRef(fn);
    return PyTuple_Pack(3, fn, data, also);
}

/* launch_owner(fn, data, also, executor) -> what the launch keeps. */
static PyObject *py_launch_owner(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nhf_check_nargs("launch_owner(fn, data, also, executor)", nargs, 4) < 0)
        return NULL;
    return nhf_launch_owner(args[0], args[1], args[2], args[3]);
}

/* launch_kinds() -> ((number, name, run, replay, owns), ...): run is the
 * trampoline's number (_core.RUN_COMPILED, ...), replay an address (a graph
 * node's function, given the record). */
static PyObject *py_launch_kinds(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    PyObject *rows = PyTuple_New(NHF_NKINDS - 1);
    for (int kind = NHF_KIND_NONE + 1; rows != NULL && kind < NHF_NKINDS; kind++) {
        const nhf_kind_info *info = &nhf_kinds[kind];
        PyObject *row = Py_BuildValue("(isiKs)", kind, info->name,
                                      nhf_trampoline_id_of(info->run),
                                      (unsigned long long)(uintptr_t)info->replay,
                                      owns_names[info->owns]);
        if (row == NULL)
            Py_CLEAR(rows);
        else
            PyTuple_SET_ITEM(rows, kind - NHF_KIND_NONE - 1, row);
    }
    return rows;
}

static PyMethodDef methods[] = {
    {"launch_kinds", py_launch_kinds, METH_NOARGS,
     "launch_kinds($module, /)\n--\n\n"
     "Returns the table of launch kinds: (number, name, run, replay, owns) each."},
    {"launch_owner", (PyCFunction)(void (*)(void))py_launch_owner, METH_FASTCALL,
     "launch_owner($module, fn, data, also, executor, /)\n--\n\n"
     "Returns what a launch keeps: fn alone, or (fn, data, also[, executor])."},
    {NULL, NULL, 0, NULL},
};

int nhf_kinds_init(PyObject *module) {
    if (PyModule_AddFunctions(module, methods) < 0)
        return -1;
    for (int kind = NHF_KIND_NONE + 1; kind < NHF_NKINDS; kind++) {
        char name[32];
        snprintf(name, sizeof name, "KIND_%s", nhf_kinds[kind].name);
        for (char *c = name; *c; c++)
            *c = (char)(*c >= 'a' && *c <= 'z' ? *c - 'a' + 'A' : *c);
        if (PyModule_AddIntConstant(module, name, kind) < 0)
            return -1;
    }
    return 0;
}
