/* The trampolines: what the driver calls, void (*)(void *record).
 *
 * They run on a thread of the driver's (or a pool's, or the simulator's), which
 * holds no GIL.  A compiled host function never takes it; a Python callable
 * takes it inside the interpreter guard and is skipped once the guard is
 * closed (LIFETIME.md, invariants 4, 5, 6 and 13).
 */
#include "nhf.h"

#include <pthread.h>
#include <signal.h>
#include <stdint.h>

/* Any thread: a compiled host function, once: fn(arg), then complete the
 * record.  No CPython call but Py_AddPendingCall (in the completion, once per
 * batch) and, if the body left the GIL taken, giving it back. */
void nhf_run_compiled(void *record_) {
    nhf_record *record = record_;
    if (!nhf_record_start(record))
        return; /* failed by a device fault: released by the drain (invariant 23) */
    record->fn(record->arg);
    nhf_gil_give_back_leaked();
    nhf_record_complete(record);
}

/* GIL held: 1 if SIGINT has a Python-level handler (Python's own
 * default_int_handler, or the program's), so that PyErr_SetInterrupt delivers
 * a KeyboardInterrupt (or calls that handler); 0 if it has none: SIGINT
 * ignored (SIG_IGN, inherited by a background job), at its default (SIG_DFL, a
 * CLI tool), or installed by C code (None).  PyErr_SetInterrupt then does
 * nothing, on 3.10 to 3.13 (PyErr_SetInterruptEx skips SIG_IGN and SIG_DFL;
 * for None it reports "Signal 2 ignored").  -1 with an error set if the
 * handler could not be read. */
static int sigint_is_pythons(void) {
    PyObject *module = PyImport_ImportModule("_signal");
    if (module == NULL)
        return -1;
    PyObject *handler = PyObject_CallMethod(module, "getsignal", "i", SIGINT);
    Py_DECREF(module);
    if (handler == NULL)
        return -1;
    int pythons = handler != Py_None && !PyLong_Check(handler); /* SIG_IGN, SIG_DFL: ints */
    Py_DECREF(handler);
    return pythons;
}

/* GIL held: call callable(); an exception goes to sys.unraisablehook with the
 * callable as the object, except KeyboardInterrupt (Ctrl-C, whose handler ran
 * inside the call on the main thread): it is not swallowed but delivered again,
 * as a new SIGINT that the main thread handles at its next check.  Where SIGINT
 * has no Python handler, delivering it would drop it: it goes to
 * sys.unraisablehook too (invariant 18: never swallowed). */
PyObject *nhf_call_reporting(PyObject *callable) {
    PyObject *result = PyObject_CallNoArgs(callable);
    if (result == NULL) {
        if (PyErr_ExceptionMatches(PyExc_KeyboardInterrupt)) {
            PyObject *type, *value, *traceback;
            PyErr_Fetch(&type, &value, &traceback);
            int pythons = sigint_is_pythons();
            if (pythons > 0) {
                Py_XDECREF(type);
                Py_XDECREF(value);
                Py_XDECREF(traceback);
                PyErr_SetInterrupt();
                return NULL;
            }
            if (pythons < 0)
                PyErr_Clear(); /* the handler unknown: report, never drop */
            PyErr_Restore(type, value, traceback);
        }
        PyErr_WriteUnraisable(callable);
    }
    return result;
}

/* How many Python callables this thread is running as host functions (one,
 * unless a callable runs a trampoline itself), as a thread-specific value: a
 * pthread key, not _Thread_local, whose lazily allocated dynamic TLS in a
 * dlopen'ed module TSan reports as a race with the exit of a pool thread. */
static pthread_key_t host_function_key;
static bool host_function_key_made; /* false if the process had no key left */
static pthread_once_t host_function_once = PTHREAD_ONCE_INIT;

static void host_function_key_make(void) {
    host_function_key_made = pthread_key_create(&host_function_key, NULL) == 0;
}

/* Without a key no thread is counted (the self-wait refusals then do not fire),
 * rather than reading and writing a key that another library owns. */
static intptr_t host_function_depth(void) {
    pthread_once(&host_function_once, host_function_key_make);
    return host_function_key_made ? (intptr_t)pthread_getspecific(host_function_key) : 0;
}

static void host_function_depth_add(intptr_t delta) {
    /* Read first, in a statement of its own: the read makes the key (pthread_once),
     * and C leaves the order of a call's arguments open.  Written as one call,
     * pthread_setspecific(host_function_key, depth() + delta), clang (the wheels'
     * zig cc) read the key before making it, and wrote 1 into key 0: CPython's
     * thread-state key ("PyGILState_Release: thread state 0x1 must be current"). */
    intptr_t depth = host_function_depth();
    if (host_function_key_made)
        (void)pthread_setspecific(host_function_key, (void *)(depth + delta));
}

int nhf_in_host_function(void) { return host_function_depth() > 0; }

void nhf_mark_host_function_thread(void) { host_function_depth_add(1); }

/* GIL held: a launch's callable (a record's, or a graph slot's), called; its
 * exception reported with the callable as the object (a blocking Python callable
 * reports every exception, KeyboardInterrupt included, as the stream cannot
 * stop). */
static PyObject *call_python(PyObject *callable) {
    host_function_depth_add(1);
    PyObject *result = PyObject_CallNoArgs(callable);
    host_function_depth_add(-1);
    if (result == NULL)
        PyErr_WriteUnraisable(callable);
    return result;
}

/* Any thread: a Python callable, once: its result stays in the record until
 * the drain releases it on the main thread. */
void nhf_run_python(void *record_) {
    nhf_record *record = record_;
    if (!nhf_record_start(record))
        return; /* failed by a device fault: released by the drain (invariant 23) */
    if (nhf_guard_enter()) {
        PyGILState_STATE state = nhf_gil_take();
        record->result = call_python(record->arg);
        nhf_gil_give(state);
        nhf_guard_leave();
    }
    nhf_record_complete(record);
}

/* Any thread: a compiled host function in a graph, at every replay: fn(arg).
 * Never the function itself as the node: a body that returned holding the GIL
 * has it given back here (invariant 13), where kept it stopped every Python
 * thread at the first replay. */
void nhf_call_compiled(nhf_hostfn fn, void *arg) {
    fn(arg);
    nhf_gil_give_back_leaked();
}

/* Any thread: a Python callable (arg; fn unused) in a graph, at every replay;
 * the result is released by the next drain. */
void nhf_call_python(nhf_hostfn fn, void *arg) {
    (void)fn;
    if (!nhf_guard_enter())
        return;
    PyGILState_STATE state = nhf_gil_take();
    PyObject *result = call_python(arg);
    if (result != NULL)
        nhf_defer_release(result);
    nhf_gil_give(state);
    nhf_guard_leave();
}

/* Any thread: a graph's host node, at every replay: its kind's call of the
 * record's fn and arg, the record staying with the graph. */
void nhf_replay_compiled(void *record_) {
    nhf_record *record = record_;
    nhf_call_compiled(record->fn, record->arg);
}

void nhf_replay_python(void *record_) {
    nhf_record *record = record_;
    nhf_call_python(record->fn, record->arg);
}

/* Any thread: the destructor of the user object that keeps a graph's record:
 * the graph and all its executable instances are gone (invariant 8). */
void nhf_user_object_release(void *record) { nhf_record_complete(record); }

/* ---- the trampolines by number (nhf.h's enum nhf_trampoline_id) ------------------- */

/* Written at module load, with the GIL, before any launch; read after. */
static nhf_hostfn trampolines[NHF_NTRAMPOLINES] = {
    [NHF_TRAMPOLINE_RUN_COMPILED] = nhf_run_compiled,
    [NHF_TRAMPOLINE_RUN_PYTHON] = nhf_run_python,
};

void nhf_trampoline_add(int id, nhf_hostfn fn) { trampolines[id] = fn; }

nhf_hostfn nhf_trampoline_of(long id) {
    if (id <= NHF_TRAMPOLINE_NONE || id >= NHF_NTRAMPOLINES || trampolines[id] == NULL) {
        PyErr_Format(PyExc_ValueError,
                     "%ld names no trampoline (_core.RUN_COMPILED, RUN_PYTHON or EXEC_COPY)", id);
        return NULL;
    }
    return trampolines[id];
}

int nhf_trampoline_id_of(nhf_hostfn fn) {
    for (int id = NHF_TRAMPOLINE_NONE + 1; id < NHF_NTRAMPOLINES; id++)
        if (trampolines[id] == fn)
            return id;
    return NHF_TRAMPOLINE_NONE;
}

/* report_unraisable(obj, exc): GIL held; exc, a caught exception, to
 * sys.unraisablehook with obj as the object, as a Python callable's own is
 * reported (call_python): for a wrapper that calls the user's callable
 * (add_callback), so that the report names the callable it was given. */
static PyObject *py_report_unraisable(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nhf_check_nargs("report_unraisable(obj, exc)", nargs, 2) < 0)
        return NULL;
    if (!PyExceptionInstance_Check(args[1])) {
        PyErr_Format(PyExc_TypeError, "report_unraisable() expected an exception, got %s",
                     Py_TYPE(args[1])->tp_name);
        return NULL;
    }
    PyObject *type = (PyObject *)Py_TYPE(args[1]);
    PyObject *traceback = PyException_GetTraceback(args[1]); /* new reference, or NULL */
    Py_INCREF(type);
    Py_INCREF(args[1]);
    PyErr_Restore(type, args[1], traceback); /* steals all three */
    PyErr_WriteUnraisable(args[0]);
    Py_RETURN_NONE;
}

static PyMethodDef trampoline_methods[] = {
    {"report_unraisable", (PyCFunction)(void (*)(void))py_report_unraisable, METH_FASTCALL,
     "report_unraisable($module, obj, exc, /)\n--\n\n"
     "Report exc to sys.unraisablehook with obj as the object."},
    {NULL, NULL, 0, NULL},
};

/* The trampolines' numbers, which Python hands back to the enqueue, and the
 * addresses of what a graph's node or user object calls (a record's fn). */
int nhf_trampolines_init(PyObject *module) {
    if (PyModule_AddFunctions(module, trampoline_methods) < 0)
        return -1;
    if (PyModule_AddIntConstant(module, "RUN_COMPILED", NHF_TRAMPOLINE_RUN_COMPILED) < 0 ||
        PyModule_AddIntConstant(module, "RUN_PYTHON", NHF_TRAMPOLINE_RUN_PYTHON) < 0 ||
        PyModule_AddIntConstant(module, "EXEC_COPY", NHF_TRAMPOLINE_EXEC_COPY) < 0 ||
        nhf_add_address(module, "REPLAY_PYTHON", (void *)(uintptr_t)nhf_replay_python) < 0 ||
        nhf_add_address(module, "USER_OBJECT_RELEASE",
                        (void *)(uintptr_t)nhf_user_object_release) < 0)
        return -1;
    return 0;
}
