/* The HostExecutor's graph slots: the words of one executor node in a CUDA (or
 * simulated) graph, the pool's threads' share of them, and GraphSlot, the object
 * Python holds for one (executor.h; LIFETIME.md, invariants 16 and 21).
 */
#include "executor.h"

#include <stdlib.h>
#include <unistd.h>

static void claim_end(slot *s);

/* A graph slot whose replay has reached it (reached swapped back to 0), counted
 * in its running until nhf_slot_run ends; NULL if none.  The count is raised
 * before live is read again (both sequentially consistent), and slot_give_back
 * clears live before it reads the count: either this claim sees the slot
 * disarmed, or the give-back sees the claim and leaves the slot to it. */
slot *nhf_slot_claim(nhf_pool *pool) {
    for (slot *s = atomic_load(&pool->slots); s != NULL; s = s->next) {
        if (!atomic_load_explicit(&s->live, memory_order_acquire) ||
            atomic_load(&s->words[0]) != 1)
            continue;
        atomic_fetch_add(&s->running, 1);
        uint32_t one = 1;
        if (atomic_load(&s->live) && atomic_compare_exchange_strong(&s->words[0], &one, 0))
            return s;
        claim_end(s);
    }
    return NULL;
}

/* Run a claimed slot's work, then write its "done" (the graph's wait goes on).  The
 * work is its kind's call of the launch's fn and arg (kinds.c), which gives back a
 * GIL the body kept (invariant 13), or the pool's copy: what the slot's owner
 * keeps alive, never the graph's record (invariant 16).  Then the claim ends
 * (claim_end). */
void nhf_slot_run(nhf_pool *pool, slot *s) {
    if (s->copy)
        nhf_copy_run(pool, s->arg);
    else
        s->call(s->fn, s->arg);
    atomic_thread_fence(memory_order_seq_cst); /* the work's writes before "done" */
    atomic_store(&s->words[1], 1);
    claim_end(s);
}

/* Under nothing: s on its pool's free list, for the next node made. */
static void slot_free(slot *s) {
    nhf_pool *pool = s->pool;
    pthread_mutex_lock(&pool->mutex);
    s->next_free = pool->free_slots;
    pool->free_slots = s;
    pthread_mutex_unlock(&pool->mutex);
}

/* A pool thread, without the GIL: a claim of s ends.  If it was the last one in
 * (another thread's claim that lost the race for the same reach counts too) and
 * the GraphSlot went meanwhile (slot_give_back left the slot to the run in
 * progress), this thread gives the slot back and hands the node's owners to the
 * main thread's next drain (invariant 2; at exit, with the guard closed, they are
 * leaked).  The count is lowered before the hand-off is read, as the give-back
 * sets it before it reads the count: one of the two sees the other, and the
 * compare-and-swap makes one of them the one that gives it back. */
static void claim_end(slot *s) {
    if (atomic_fetch_sub(&s->running, 1) != 1)
        return; /* a claim still in: the last one out gives it back */
    int handed = 1;
    if (!atomic_load(&s->handed_off) ||
        !atomic_compare_exchange_strong(&s->handed_off, &handed, 0))
        return;
    PyObject *owner = s->handed_owner;
    s->handed_owner = NULL;
    slot_free(s);
    if (owner != NULL && nhf_guard_enter()) {
        PyGILState_STATE state = nhf_gil_take();
        nhf_defer_release(owner);
        nhf_gil_give(state);
        nhf_guard_leave();
    }
}

/* ---- graph slots, from Python ------------------------------------------------------ */

static slot *slot_arg(PyObject *value) { return nhf_pointer_arg(value, "graph slot"); }

/* exec_slot_op(slot, i): the simulator's argument for the slot's i-th node. */
static PyObject *py_slot_op(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nhf_check_nargs("exec_slot_op(slot, i)", nargs, 2) < 0)
        return NULL;
    slot *s = slot_arg(args[0]);
    long i = s == NULL ? -1 : PyLong_AsLong(args[1]);
    if (s == NULL || PyErr_Occurred())
        return NULL;
    if (i < 0 || i > 2) {
        PyErr_SetString(PyExc_ValueError, "a graph slot has nodes 0, 1 and 2");
        return NULL;
    }
    return PyLong_FromVoidPtr(&s->ops[i]);
}

/* ---- GraphSlot: a graph slot as Python holds it ------------------------------------ */

/* One executor node's slot, owned by the node's launch record, so the graph owns
 * it (invariant 16); it owns the node's other owners (arm's owner).  Its dealloc,
 * run when the record is released on the main thread, disarms the slot, gives it
 * back to the pool's free list and releases those owners, or leaves both to a run
 * of it in progress (slot_give_back): one native step, with no bytecode between
 * the release and the disarm, so an asynchronous exception (a Ctrl-C) cannot
 * leave a slot armed (invariant 21).  Made only by ExecutorBase._slot_new and
 * _slot_take. */
typedef struct {
    PyObject_HEAD
    slot *slot;
    PyObject *executor; /* the HostExecutor, alive while the node is */
    PyObject *owner;    /* what the node's work uses (arm's), released after its run */
} graph_slot_object;

static PyTypeObject graph_slot_type;

/* GIL held: disarm s if it is armed (once, however often it is called) and put
 * it on the pool's free list; true if owner (the node's owners, a reference the
 * caller then releases) may go now.  Where a pool thread's run of s is in
 * progress (a device fault ends a replay's wait for "done" while the node may
 * still run, and the graph then lets its record go), s and owner are left to
 * that run instead (claim_end): false, and the reference is the run's.  So the
 * owners are never released under the run, and its late "done" never lands in
 * the words of the node that takes the slot next; nothing here waits for the run
 * (a node may wait for this thread).  Not in a forked child: the pool's mutex may
 * have been held by a thread of the parent, which does not exist here. */
static bool slot_give_back(slot *s, PyObject *owner) {
    nhf_pool *pool = s->pool;
    if (getpid() != pool->pid)
        return true;
    pthread_mutex_lock(&pool->mutex);
    if (atomic_exchange(&s->live, 0)) {
        atomic_fetch_sub(&pool->live_slots, 1);
        pthread_cond_broadcast(&pool->wake); /* a closing pool's parked threads may now quit */
    }
    pthread_mutex_unlock(&pool->mutex);
    if (atomic_load(&s->running) != 0) {
        s->handed_owner = owner;
        atomic_store(&s->handed_off, 1);
        if (atomic_load(&s->running) != 0)
            return false; /* its claim_end sees the hand-off */
        int handed = 1;   /* it ended meanwhile: take it back, unless claim_end took it */
        if (!atomic_compare_exchange_strong(&s->handed_off, &handed, 0))
            return false;
        s->handed_owner = NULL;
    }
    slot_free(s);
    return true;
}

/* A new GraphSlot for the disarmed slot s of executor's pool; NULL (s given
 * back to the free list) if there was no memory for it. */
static PyObject *graph_slot_wrap(PyObject *executor, slot *s) {
    graph_slot_object *self = PyObject_New(graph_slot_object, &graph_slot_type);
    if (self == NULL) {
        (void)slot_give_back(s, NULL); /* disarmed: no run of it */
        return NULL;
    }
    self->slot = s;
    self->executor = Py_NewRef(executor);
    self->owner = NULL;
    return (PyObject *)self;
}

static void graph_slot_dealloc(PyObject *self_) {
    graph_slot_object *self = (graph_slot_object *)self_;
    if (slot_give_back(self->slot, self->owner)) /* else a run in progress has them */
        Py_XDECREF(self->owner);
    Py_DECREF(self->executor);
    PyObject_Free(self);
}

/* arm(kind, fn, arg, copy, owner): from now on a replay that reaches the slot
 * runs the launch kind's call of fn and arg (_core.KIND_*: fn(arg), compiled, or
 * the Python callable at arg), or the pool's copy of the MEMCPY_LAYOUT at arg,
 * and the slot holds owner (what that work uses) until it is given back;
 * RuntimeError once the pool is stopping (no thread would answer). */
static PyObject *graph_slot_arm(PyObject *self_, PyObject *const *args, Py_ssize_t nargs) {
    graph_slot_object *self = (graph_slot_object *)self_;
    slot *s = self->slot;
    if (nhf_check_nargs("arm(kind, fn, arg, copy, owner)", nargs, 5) < 0)
        return NULL;
    long kind = PyLong_AsLong(args[0]);
    if (kind == -1 && PyErr_Occurred())
        return NULL;
    if (kind <= NHF_KIND_NONE || kind >= NHF_NKINDS) {
        PyErr_Format(PyExc_ValueError, "%ld names no launch kind (_core.KIND_*)", kind);
        return NULL;
    }
    void *fn, *arg;
    if (nhf_address_arg(args[1], &fn) < 0 || nhf_address_arg(args[2], &arg) < 0)
        return NULL;
    int copy = PyObject_IsTrue(args[3]);
    if (copy < 0)
        return NULL;
    nhf_pool *pool = s->pool;
    pthread_mutex_lock(&pool->mutex);
    if (atomic_load(&pool->stopping)) {
        pthread_mutex_unlock(&pool->mutex);
        /* _backend.executor_refused_error's text for an executor not known: stopping
         * covers a stopped pool (a close() that has not returned) and a closed one. */
        PyErr_SetString(PyExc_RuntimeError,
                        "the HostExecutor is closed, or stopped by a close() that has not "
                        "returned; it takes no new work: create a new one (a stopped one's "
                        "close(), called again, waits for its outstanding tasks)");
        return NULL;
    }
    if (atomic_load(&s->live)) {
        pthread_mutex_unlock(&pool->mutex);
        PyErr_SetString(PyExc_RuntimeError, "the graph slot is armed already");
        return NULL;
    }
    atomic_store(&s->words[0], 0);
    atomic_store(&s->words[1], 0);
    s->call = nhf_kinds[kind].call;
    s->fn = (nhf_hostfn)(uintptr_t)fn;
    s->arg = arg;
    s->copy = copy;
    atomic_store(&s->live, 1);
    atomic_fetch_add(&pool->live_slots, 1);
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mutex);
    /* Armed once (above: an armed slot is refused), so there is no owner before;
     * the caller holds owner until this returns. */
    Py_XSETREF(self->owner, Py_NewRef(args[4]));
    Py_RETURN_NONE;
}

static PyObject *graph_slot_address(PyObject *self_, void *closure) {
    (void)closure;
    return PyLong_FromVoidPtr(((graph_slot_object *)self_)->slot);
}

static PyObject *graph_slot_words(PyObject *self_, void *closure) {
    (void)closure;
    return PyLong_FromVoidPtr((void *)((graph_slot_object *)self_)->slot->words);
}

static PyObject *graph_slot_armed(PyObject *self_, void *closure) {
    (void)closure;
    return PyBool_FromLong(atomic_load(&((graph_slot_object *)self_)->slot->live));
}

static PyObject *graph_slot_executor(PyObject *self_, void *closure) {
    (void)closure;
    return Py_NewRef(((graph_slot_object *)self_)->executor);
}

static PyMethodDef graph_slot_methods[] = {
    {"arm", (PyCFunction)(void (*)(void))graph_slot_arm, METH_FASTCALL,
     "arm($self, kind, fn, arg, copy, owner, /)\n--\n\n"
     "A replay that reaches the slot runs the kind's call of fn and arg (or the copy); "
     "the slot holds owner."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef graph_slot_getset[] = {
    {"address", graph_slot_address, NULL, "The native slot's address.", NULL},
    {"words", graph_slot_words, NULL, "The address of its two 32-bit words.", NULL},
    {"armed", graph_slot_armed, NULL, "True while a replay may reach it.", NULL},
    {"executor", graph_slot_executor, NULL, "Its HostExecutor.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject graph_slot_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "numba_hostfn._core.GraphSlot",
    .tp_doc = "One executor node's graph slot, disarmed when this object goes "
              "(LIFETIME.md, invariant 16).",
    .tp_basicsize = sizeof(graph_slot_object),
    /* Made only by the executor (its slot set): never from Python, whose object
     * would have no slot for the dealloc to give back. */
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .tp_dealloc = graph_slot_dealloc,
    .tp_methods = graph_slot_methods,
    .tp_getset = graph_slot_getset,
};

/* _slot_new(words) of ExecutorBase: a disarmed GraphSlot on words (two 32-bit
 * words); the native slot is never freed. */
PyObject *nhf_slot_new(PyObject *executor, nhf_pool *pool, void *words) {
    slot *s = calloc(1, sizeof(slot));
    if (s == NULL)
        return PyErr_NoMemory();
    s->words = words;
    s->pool = pool;
    s->ops[0] = (nhf_sim_word_op){&s->words[0], 1};
    s->ops[1] = (nhf_sim_word_op){&s->words[1], 1};
    s->ops[2] = (nhf_sim_word_op){&s->words[1], 0};
    pthread_mutex_lock(&pool->mutex);
    s->next = atomic_load(&pool->slots);
    atomic_store(&pool->slots, s);
    pthread_mutex_unlock(&pool->mutex);
    return graph_slot_wrap(executor, s);
}

/* _slot_take() of ExecutorBase: a disarmed GraphSlot whose words served an
 * earlier node, or None if no slot of the pool is free. */
PyObject *nhf_slot_take(PyObject *executor, nhf_pool *pool) {
    pthread_mutex_lock(&pool->mutex);
    slot *s = pool->free_slots;
    if (s != NULL)
        pool->free_slots = s->next_free;
    pthread_mutex_unlock(&pool->mutex);
    if (s == NULL)
        Py_RETURN_NONE;
    return graph_slot_wrap(executor, s);
}

static PyMethodDef methods[] = {
    {"exec_slot_op", (PyCFunction)(void (*)(void))py_slot_op, METH_FASTCALL,
     "exec_slot_op($module, slot, i, /)\n--\n\n"
     "Returns the simulator's argument of the slot's node i"},
    {NULL, NULL, 0, NULL},
};

int nhf_graph_slots_init(PyObject *module) {
    if (PyType_Ready(&graph_slot_type) < 0 ||
        PyModule_AddObjectRef(module, "GraphSlot", (PyObject *)&graph_slot_type) < 0)
        return -1;
    return PyModule_AddFunctions(module, methods);
}
