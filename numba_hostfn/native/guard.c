/* The interpreter guard, and the GIL on threads that Python did not create.
 *
 * Host functions run on threads foreign to Python: the CUDA driver's, a
 * HostExecutor's, the simulator's.  Such a thread may call into CPython only
 * between nhf_guard_enter() and nhf_guard_leave().  At interpreter exit,
 * nhf_guard_close() shuts the guard and waits for the threads inside: from
 * then on no thread of ours touches CPython (LIFETIME.md, invariant 6).
 */
#include "nhf.h"

#include <pthread.h>
#include <unistd.h>

/* On lines of their own (nhf.h's NHF_CACHE_LINE): closing is read by every task
 * of the pool's threads, and inside written by every thread that enters. */
static struct {
    _Alignas(NHF_CACHE_LINE) atomic_int closing; /* the guard is closed: exit has begun */
} guard;
static struct {
    _Alignas(NHF_CACHE_LINE) atomic_long count; /* threads between enter and leave */
} inside;

/* Any thread. */
bool nhf_guard_enter(void) {
    atomic_fetch_add(&inside.count, 1);
    if (atomic_load(&guard.closing)) {
        atomic_fetch_sub(&inside.count, 1);
        return false;
    }
    return true;
}

/* Any thread. */
void nhf_guard_leave(void) { atomic_fetch_sub(&inside.count, 1); }

/* Any thread. */
bool nhf_guard_open(void) { return !atomic_load(&guard.closing); }

/* GIL held: called by the exit hook (LIFETIME.md, invariant 6).  In a forked child
 * it closes without waiting: whatever was inside at fork ran on the parent's threads,
 * none of which exists here (invariant 22). */
long nhf_guard_close(long ms) {
    long left;
    atomic_store(&guard.closing, 1);
    if (nhf_forked())
        return 0;
    Py_BEGIN_ALLOW_THREADS
    for (long waited = 0;; waited++) {
        left = atomic_load(&inside.count);
        if (left == 0 || waited >= ms)
            break;
        usleep(1000);
    }
    Py_END_ALLOW_THREADS
    return left;
}

/* Any thread, inside the guard.  The first time, a thread foreign to Python
 * gets a thread state that it keeps: PyGILState_Ensure makes it (counter 1),
 * PyEval_SaveThread drops the GIL and keeps it, so later calls only take and
 * drop the GIL instead of creating and destroying a state each (invariant 12). */
PyGILState_STATE nhf_gil_take(void) {
    if (PyGILState_GetThisThreadState() == NULL) {
        (void)PyGILState_Ensure();
        (void)PyEval_SaveThread();
    }
    return PyGILState_Ensure();
}

/* Any thread. */
void nhf_gil_give(PyGILState_STATE state) { PyGILState_Release(state); }

/* Any thread, before it ends (a pool's threads, at close): give back the thread
 * state that nhf_gil_take kept.  Skipped once the guard is closed: at exit it
 * is leaked instead. */
void nhf_gil_forget(void) {
    if (!nhf_guard_enter())
        return;
    if (PyGILState_GetThisThreadState() != NULL) {
        /* Ensure (counter 1 -> 2, the GIL taken); Release(LOCKED) (2 -> 1, the
         * GIL kept); Release(UNLOCKED) (1 -> 0): the thread state is cleared
         * and deleted, and the GIL released with it. */
        (void)PyGILState_Ensure();
        PyGILState_Release(PyGILState_LOCKED);
        PyGILState_Release(PyGILState_UNLOCKED);
    }
    nhf_guard_leave();
}

/* The thread state attached to this thread (3.12+) or holding the GIL (before),
 * without the fatal error PyThreadState_Get gives when there is none. */
static PyThreadState *current_thread_state(void) {
#if PY_VERSION_HEX >= 0x030D0000
    return PyThreadState_GetUnchecked();
#else
    return _PyThreadState_UncheckedGet(); /* its name before 3.13 (_compat.py) */
#endif
}

bool nhf_interpreter_finalizing(void) {
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsFinalizing();
#else
    return _Py_IsFinalizing();
#endif
}

/* Any thread, right after a compiled body returned.  A body is entered without
 * the GIL and must return without it; some of numba's error paths return from
 * inside a GIL-taking block (a cfunc whose Environment was never registered:
 * print's check returns with the GIL held), and a host-function thread that
 * kept the GIL would stop every Python thread for ever.  Undo that one
 * PyGILState_Ensure: PyGILState_Release(UNLOCKED) drops the GIL, and the thread
 * state too if the body created it (invariant 13).  Once the guard is closed too:
 * a body may take the GIL after the close (the main thread drops it in every later
 * atexit handler), and one kept then hangs exit.  A thread that holds the GIL is
 * one finalization cannot have begun under (it needs the GIL; a thread that asks
 * for it after is ended by CPython), so reading its state is safe; once
 * finalization has begun nothing is read.  Counted as inside, so that an
 * nhf_guard_close waiting meanwhile waits for the release. */
void nhf_gil_give_back_leaked(void) {
    if (!nhf_guard_open() && nhf_interpreter_finalizing())
        return;
    PyThreadState *own = PyGILState_GetThisThreadState();
    if (own == NULL || current_thread_state() != own)
        return;
    atomic_fetch_add(&inside.count, 1);
    PyGILState_Release(PyGILState_UNLOCKED);
    atomic_fetch_sub(&inside.count, 1);
}

/* ---- fork -------------------------------------------------------------------- */

/* A child forked from a process that had used numba_hostfn (its backend was made:
 * nhf_mark_used), as _process.forked() says in Python.  Set inside fork(), by the
 * handler pthread_atfork runs in the child, before the child runs any Python:
 * checks made from Python's own after-fork hooks would come too late for a pending
 * call the child inherited (LIFETIME.md, invariant 22).  A child of a process that
 * only imported the package may use it: the flag stays clear there. */
static struct {
    _Alignas(NHF_CACHE_LINE) atomic_int used; /* written once, read at a fork */
    atomic_int forked;                        /* read at every launch */
} fork_state;

static void at_fork_in_child(void) {
    if (atomic_load(&fork_state.used))
        atomic_store(&fork_state.forked, 1);
}

/* Any thread: this process's backend is made (configure_launch got its enqueue). */
void nhf_mark_used(void) { atomic_store(&fork_state.used, 1); }

/* Any thread. */
bool nhf_forked(void) { return atomic_load(&fork_state.forked); }

/* ---- from Python ---------------------------------------------------------------- */

/* close_guard(ms) -> how many threads were still inside CPython after ms.  The exit
 * hook itself (_records.LaunchRecords, a functools.partial of this): no line of Python
 * runs before the close, so a Ctrl-C that lands as exit begins cannot skip it, as it
 * skipped a Python method there whole.  A Ctrl-C during the wait is raised here, once
 * the guard is closed, rather than into the next handler, which it would skip. */
static PyObject *py_close_guard(PyObject *self, PyObject *arg) {
    (void)self;
    long ms = PyLong_AsLong(arg);
    if (ms == -1 && PyErr_Occurred())
        return NULL;
    long left = nhf_guard_close(ms);
    if (PyErr_CheckSignals() < 0)
        return NULL;
    return PyLong_FromLong(left);
}

/* to_front_of_atexit(fn): atexit.register(functools.partial(fn)), then
 * atexit.unregister(fn): fn moved to the front of the atexit handlers (the last
 * registered runs first), in one native call, the threading exit hook that
 * _compat.register_first_atexit registers, once per fn.  A Python function there
 * took a Ctrl-C between its two lines: fn, unregistered, never ran (the guard
 * stayed open through every later handler).  Between the register and the
 * unregister no bytecode runs but a handler's own __eq__, which unregister()
 * calls: an exception there leaves fn registered twice (each such fn is
 * idempotent), never not at all; so the copy, a partial (equal only to itself),
 * goes in first.  Not idempotent itself: a second move of fn leaves its first
 * copy registered (unregister(fn) does not match it). */
static PyObject *py_to_front_of_atexit(PyObject *self, PyObject *fn) {
    (void)self;
    PyObject *atexit = PyImport_ImportModule("atexit");
    PyObject *functools = atexit == NULL ? NULL : PyImport_ImportModule("functools");
    PyObject *copy = functools == NULL ? NULL : PyObject_CallMethod(functools, "partial", "O", fn);
    PyObject *registered = copy == NULL ? NULL : PyObject_CallMethod(atexit, "register", "O", copy);
    PyObject *unregistered =
        registered == NULL ? NULL : PyObject_CallMethod(atexit, "unregister", "O", fn);
    Py_XDECREF(unregistered);
    Py_XDECREF(registered);
    Py_XDECREF(copy);
    Py_XDECREF(functools);
    Py_XDECREF(atexit);
    if (unregistered == NULL)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"close_guard", py_close_guard, METH_O,
     "close_guard($module, ms, /)\n--\n\n"
     "No thread of ours enters CPython from now on; wait for those inside."},
    {"to_front_of_atexit", py_to_front_of_atexit, METH_O,
     "to_front_of_atexit($module, fn, /)\n--\n\n"
     "Move fn to the front of the atexit handlers, in one native call."},
    {NULL, NULL, 0, NULL},
};

/* GIL held, at module load. */
int nhf_guard_init(PyObject *module) {
    if (pthread_atfork(NULL, NULL, at_fork_in_child) != 0) {
        PyErr_SetString(PyExc_RuntimeError, "numba_hostfn could not register its fork handler");
        return -1;
    }
    return PyModule_AddFunctions(module, methods);
}
