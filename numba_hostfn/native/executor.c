/* ExecutorBase: the native pool of a HostExecutor, as Python holds it (its Python
 * class subclasses this), and the executor's addresses and hooks (executor.h).
 */
#include "executor.h"

/* ---- the executor's base type, for Python ---------------------------------------- */

static nhf_pool *started(nhf_executor_object *self) {
    if (self->pool == NULL)
        PyErr_Format(PyExc_RuntimeError,
                     "the %s was not started: HostExecutor.__init__ never ran (a subclass's "
                     "__init__ must call super().__init__())",
                     Py_TYPE(self)->tp_name);
    return self->pool;
}

/* _start(threads, spin_ns, poll_ns): start the pool's threads. */
static PyObject *executor_start(PyObject *self_, PyObject *const *args, Py_ssize_t nargs) {
    nhf_executor_object *self = (nhf_executor_object *)self_;
    if (nhf_check_nargs("_start(threads, spin_ns, poll_ns)", nargs, 3) < 0)
        return NULL;
    long values[3];
    for (int i = 0; i < 3; i++) {
        values[i] = PyLong_AsLong(args[i]);
        if (values[i] == -1 && PyErr_Occurred())
            return NULL;
    }
    long threads = values[0], spin_ns = values[1], poll_ns = values[2];
    if (self->pool != NULL) {
        PyErr_SetString(PyExc_RuntimeError,
                        "the HostExecutor is started already; make another HostExecutor");
        return NULL;
    }
    /* With the GIL, so two _start calls cannot both see no pool: starting threads
     * needs no Python, and the threads take the GIL only to run a task. */
    nhf_pool *pool = nhf_pool_new(threads, spin_ns, poll_ns);
    if (pool == NULL) {
        PyErr_Format(PyExc_RuntimeError,
                     "HostExecutor could not start %ld threads (memory or thread limit)", threads);
        return NULL;
    }
    self->pool = pool;
    Py_RETURN_NONE;
}

/* The refusal of a close() from a host function with tasks outstanding. */
static PyObject *refuse_close_from_host_function(long outstanding, const char *then) {
    PyErr_Format(PyExc_RuntimeError,
                 "HostExecutor.close() was called from a host function while %ld of its tasks "
                 "%s outstanding: close() would wait for them, and a task queued behind this "
                 "host function waits for it, so close() would be waiting for itself; close "
                 "the executor from another thread once the streams have passed this host "
                 "function (after stream.sync())%s",
                 outstanding, outstanding == 1 ? "is" : "are", then);
    return NULL;
}

/* How long close waits, without the GIL, between two checks for signals. */
#define CLOSE_SLICE_NS 50000000L /* 50 ms */

/* _close(): finish what is enqueued, then stop the threads (GIL released).
 * Refused from one of the pool's own tasks, and from any host function (a
 * driver's, the simulator's, another executor's task) while tasks are
 * outstanding: a host function must not wait for stream work.  The wait is
 * taken in slices; between two, with the GIL, Python's signal handlers run
 * (PyErr_CheckSignals, on the main thread), so a Ctrl-C raises KeyboardInterrupt
 * while a task is still running (as ThreadPoolExecutor.shutdown's join does), and
 * a handler that returns lets the wait go on.  One interrupted leaves the pool
 * stopped (launches are refused) with its threads running the outstanding tasks;
 * a later _close() waits for them again and joins the threads. */
static PyObject *executor_close(PyObject *self_, PyObject *unused) {
    (void)unused;
    nhf_pool *pool = ((nhf_executor_object *)self_)->pool;
    if (pool != NULL) {
        /* Once close has let the threads go, their ids may be a later thread's
         * (glibc reuses a joined thread's): no task of the pool runs any more. */
        bool released = atomic_load(&pool->threads_released);
        for (long i = 0; !released && i < pool->nthreads; i++) {
            if (pthread_equal(pthread_self(), pool->threads[i])) {
                PyErr_SetString(PyExc_RuntimeError,
                                "HostExecutor.close() was called from one of its own tasks, "
                                "which close() would wait for; close it from another thread");
                return NULL;
            }
        }
        int from_host_function = nhf_in_host_function();
        long outstanding = nhf_pool_outstanding(pool);
        if (from_host_function && outstanding > 0)
            return refuse_close_from_host_function(outstanding, ""); /* the pool goes on */
        for (;;) {
            Py_BEGIN_ALLOW_THREADS
            outstanding = nhf_pool_close(pool, from_host_function, CLOSE_SLICE_NS);
            Py_END_ALLOW_THREADS
            if (outstanding != NHF_POOL_CLOSE_WAITING)
                break;
            if (PyErr_CheckSignals() < 0)
                return NULL; /* stopped, its tasks still running: close() again waits */
        }
        if (outstanding > 0) /* a launch raced the check above: stopped, not waited for */
            return refuse_close_from_host_function(
                outstanding,
                "; a launch raced this close(), which has stopped the executor (it refuses "
                "new launches, and its threads end once the outstanding tasks ran): call "
                "close() again from another thread to wait for them");
    }
    Py_RETURN_NONE;
}

static PyObject *executor_outstanding(PyObject *self_, PyObject *unused) {
    (void)unused;
    nhf_pool *pool = started((nhf_executor_object *)self_);
    return pool == NULL ? NULL : PyLong_FromLong(nhf_pool_outstanding(pool));
}

static PyObject *executor_live_slots(PyObject *self_, PyObject *unused) {
    (void)unused;
    nhf_pool *pool = started((nhf_executor_object *)self_);
    return pool == NULL ? NULL : PyLong_FromLong(atomic_load(&pool->live_slots));
}

/* _find_lane(stream): the pool's lane for stream, as this thread names it (a
 * default-stream handle: in its current context, and thread), or 0 if none. */
static PyObject *executor_find_lane(PyObject *self_, PyObject *stream_) {
    nhf_pool *pool = started((nhf_executor_object *)self_);
    void *stream;
    if (pool == NULL || nhf_address_arg(stream_, &stream) < 0)
        return NULL;
    return PyLong_FromVoidPtr(nhf_exec_find_lane(pool, stream));
}

/* _reuse_lane(stream, stale): an idle lane for the stream this thread names, where it
 * has none (stale 0: a default-stream handle's) or its lane stale answered LANE_STALE
 * (nhf_exec_reuse_lane), or 0. */
static PyObject *executor_reuse_lane(PyObject *self_, PyObject *const *args,
                                     Py_ssize_t nargs) {
    nhf_pool *pool = started((nhf_executor_object *)self_);
    void *stream, *stale;
    if (pool == NULL)
        return NULL;
    if (nhf_check_nargs("_reuse_lane(stream, stale)", nargs, 2) < 0)
        return NULL;
    if (nhf_address_arg(args[0], &stream) < 0 || nhf_address_arg(args[1], &stale) < 0)
        return NULL;
    if (stale != NULL && !nhf_exec_has_lane(pool, stale)) { /* it is written to */
        PyErr_SetString(PyExc_ValueError, "_reuse_lane: stale is no lane of this executor");
        return NULL;
    }
    return PyLong_FromVoidPtr(nhf_exec_reuse_lane(pool, stream, stale));
}

/* _lane_count(): how many lanes the pool has. */
static PyObject *executor_lane_count(PyObject *self_, PyObject *unused) {
    (void)unused;
    nhf_pool *pool = ((nhf_executor_object *)self_)->pool;
    return PyLong_FromSize_t(pool == NULL ? 0 : nhf_exec_lane_count(pool));
}

/* _lane_new(stream, words): a lane for stream, its words at words (two zeroed
 * 32-bit words of pinned memory); its address. */
static PyObject *executor_lane_new(PyObject *self_, PyObject *const *args, Py_ssize_t nargs) {
    nhf_pool *pool = started((nhf_executor_object *)self_);
    void *stream, *words;
    if (pool == NULL)
        return NULL;
    if (nhf_check_nargs("_lane_new(stream, words)", nargs, 2) < 0)
        return NULL;
    if (nhf_address_arg(args[0], &stream) < 0 || nhf_address_arg(args[1], &words) < 0)
        return NULL;
    lane *l = nhf_lane_new(pool, stream, words);
    return l == NULL ? PyErr_NoMemory() : PyLong_FromVoidPtr(l);
}

/* _slot_new(words): a disarmed GraphSlot on words (two 32-bit words); the
 * native slot is never freed. */
static PyObject *executor_slot_new(PyObject *self_, PyObject *words_) {
    nhf_pool *pool = started((nhf_executor_object *)self_);
    void *words;
    if (pool == NULL || nhf_address_arg(words_, &words) < 0)
        return NULL;
    return nhf_slot_new(self_, pool, words);
}

/* _slot_take(): a disarmed GraphSlot whose words served an earlier node, or
 * None if no slot of the pool is free. */
static PyObject *executor_slot_take(PyObject *self_, PyObject *unused) {
    (void)unused;
    nhf_pool *pool = started((nhf_executor_object *)self_);
    if (pool == NULL)
        return NULL;
    return nhf_slot_take(self_, pool);
}

static PyObject *executor_pool(PyObject *self_, void *closure) {
    (void)closure;
    return PyLong_FromVoidPtr(((nhf_executor_object *)self_)->pool);
}

/* Whether the pool refuses launches: a close() began (one interrupted, or refused
 * after a launch raced it, leaves it stopped with the executor not closed). */
static PyObject *executor_stopping(PyObject *self_, void *closure) {
    (void)closure;
    nhf_pool *pool = ((nhf_executor_object *)self_)->pool;
    return PyBool_FromLong(pool != NULL && atomic_load(&pool->stopping));
}

static void executor_dealloc(PyObject *self) {
    /* The pool is never freed: a stream may still wait on its words.  __del__
     * closes it; one that raised (an interrupt between its lines, no memory) or a
     * subclass's that did not call it left its threads running, parked for good:
     * stopped here, never waiting for a stream (nhf_pool_let_go: joined when
     * nothing is outstanding, else detached, to end once they ran the tasks).  Not
     * in a forked child (the parent's threads: a mutex may be held by one) nor at
     * exit (a thread may wait for the GIL in a task, as Dispatcher's dealloc). */
    nhf_pool *pool = ((nhf_executor_object *)self)->pool;
    if (pool != NULL && pool->pid == getpid() && !nhf_interpreter_finalizing()) {
        Py_BEGIN_ALLOW_THREADS
        nhf_pool_let_go(pool); /* nothing to do where __del__ closed it */
        Py_END_ALLOW_THREADS
    }
    Py_TYPE(self)->tp_free(self);
}

/* lane_reached(lane, task, budget_us, spin) -> 1, 0 or -1 (GIL released): whether
 * the stream reached the lane's task numbered task within budget_us (nhf_lane_reached);
 * done_future's result() watches its stream with it.  Any lane address a
 * signal's launch gave (lanes are never freed). */
static PyObject *py_lane_reached(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    void *lane_;
    if (nhf_check_nargs("lane_reached(lane, task, budget_us, spin)", nargs, 4) < 0 ||
        nhf_address_arg(args[0], &lane_) < 0)
        return NULL;
    unsigned long task = PyLong_AsUnsignedLong(args[1]);
    long budget_us = PyLong_AsLong(args[2]);
    int spin = PyObject_IsTrue(args[3]);
    if (PyErr_Occurred() || spin < 0)
        return NULL;
    if (lane_ == NULL || task == 0 || task > UINT32_MAX || budget_us < 0 ||
        budget_us > 3600L * 1000000L) {
        PyErr_SetString(PyExc_ValueError, "lane_reached(lane, task, budget_us, spin) expected "
                                          "a lane, a task number from 1 to 2**32 - 1 and "
                                          "0 to 3600e6 microseconds");
        return NULL;
    }
    int answer;
    Py_BEGIN_ALLOW_THREADS
    answer = nhf_lane_reached(lane_, (uint32_t)task, budget_us * 1000L, spin);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(answer);
}

static PyMethodDef module_methods[] = {
    {"lane_reached", (PyCFunction)(void (*)(void))py_lane_reached, METH_FASTCALL,
     "lane_reached($module, lane, task, budget_us, spin, /)\n--\n\n"
     "1 if the stream reached the lane's task within budget_us, 0 if not yet, "
     "-1 if it never will (GIL released)."},
    {NULL, NULL, 0, NULL},
};

static PyMethodDef executor_methods[] = {
    {"_start", (PyCFunction)(void (*)(void))executor_start, METH_FASTCALL,
     "_start($self, threads, spin_ns, poll_ns, /)\n--\n\n"
     "Start the pool."},
    {"_close", executor_close, METH_NOARGS,
     "_close($self, /)\n--\n\n"
     "Finish what is enqueued, then stop the threads (GIL released); idempotent."},
    {"_outstanding", executor_outstanding, METH_NOARGS, "_outstanding($self, /)\n--\n\n"
     "Tasks enqueued and not yet run."},
    {"_live_slots", executor_live_slots, METH_NOARGS, "_live_slots($self, /)\n--\n\n"
     "Graph slots armed."},
    {"_find_lane", executor_find_lane, METH_O,
     "_find_lane($self, stream, /)\n--\n\n"
     "The lane for stream as this thread names it, or 0"},
    {"_reuse_lane", (PyCFunction)(void (*)(void))executor_reuse_lane, METH_FASTCALL,
     "_reuse_lane($self, stream, stale, /)\n--\n\n"
     "An idle lane, handed to the stream this thread names, or 0"},
    {"_lane_count", executor_lane_count, METH_NOARGS, "_lane_count($self, /)\n--\n\n"
     "How many lanes the pool has"},
    {"_lane_new", (PyCFunction)(void (*)(void))executor_lane_new, METH_FASTCALL,
     "_lane_new($self, stream, words, /)\n--\n\n"
     "Returns lane address"},
    {"_slot_new", executor_slot_new, METH_O, "_slot_new($self, words, /)\n--\n\n"
     "Returns a new, disarmed GraphSlot"},
    {"_slot_take", executor_slot_take, METH_NOARGS,
     "_slot_take($self, /)\n--\n\n"
     "Returns a disarmed GraphSlot to reuse, or None"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef executor_getset[] = {
    {"_pool", executor_pool, NULL, "The native pool's address (0 before _start).", NULL},
    {"_stopping", executor_stopping, NULL,
     "Whether the pool refuses launches: a close() began (False before _start).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject nhf_executor_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "numba_hostfn._core.ExecutorBase",
    .tp_doc = "The native pool of a HostExecutor (its Python class subclasses this).",
    .tp_basicsize = sizeof(nhf_executor_object),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_new = PyType_GenericNew,
    .tp_dealloc = executor_dealloc,
    .tp_methods = executor_methods,
    .tp_getset = executor_getset,
};

int nhf_executor_init(PyObject *module) {
    if (PyType_Ready(&nhf_executor_type) < 0 ||
        PyModule_AddObjectRef(module, "ExecutorBase", (PyObject *)&nhf_executor_type) < 0 ||
        PyModule_AddFunctions(module, module_methods) < 0)
        return -1;
    if (nhf_add_address(module, "EXEC_SIM_SET", (void *)(uintptr_t)nhf_sim_set) < 0 ||
        nhf_add_address(module, "EXEC_SIM_AWAIT", (void *)(uintptr_t)nhf_sim_await) < 0)
        return -1;
    /* The layers below call up through these (no call cycle among the files): the
     * enqueue's routes to a lane, and its stream; the copy's trampoline; the
     * watchdog fails a faulted stream's lanes. */
    nhf_enqueue_add_lane(NHF_ROUTE_CUDA_LANE, nhf_exec_cuda_enqueue, nhf_exec_lane_stream);
    nhf_enqueue_add_lane(NHF_ROUTE_SIM_LANE, nhf_exec_sim_enqueue, nhf_exec_lane_stream);
    nhf_trampoline_add(NHF_TRAMPOLINE_EXEC_COPY, nhf_exec_copy);
    nhf_fault_on_stream_faulted(nhf_exec_fault_stream);
    /* Lanes' direct tasks: their owners for the drain, their contexts for the
     * watchdog (invariants 14, 15 and 23). */
    static const nhf_lane_owner_hooks owner_hooks = {
        nhf_exec_release_ran, nhf_exec_owners_idle, nhf_exec_each_owner};
    nhf_drain_on_lanes(&owner_hooks);
    nhf_watch_on_lanes(nhf_exec_watch_lanes);
    return 0;
}
