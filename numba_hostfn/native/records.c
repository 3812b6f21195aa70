/* Launch records: what each launch owns, and its release on the main thread.
 *
 * A record's life: *taken* from the free list (with a strong reference to its
 * owner), handed to the driver with a trampoline, *run* there, *completed*
 * (pushed on the lock-free completed stack, and a drain scheduled with
 * Py_AddPendingCall), then *released* by the drain on the main thread: owner
 * and result decref'd, the record back on the free list.  A record whose
 * enqueue failed is released at once.  A record kept by a graph is completed
 * by the graph's user object (or a simulated graph) when the graph is
 * gone.  LIFETIME.md, invariants 1, 2, 6, 11 and 14.
 *
 * Locks: the free list is the GIL's: every take increfs an owner and every
 * release decrefs one, so each runs with the GIL held anyway (the core declares
 * no Py_mod_gil: a free-threaded interpreter enables the GIL for it), and a lock
 * of its own cost an uncontended lock and unlock at every launch (26 ns on the
 * H200).  The completed stack and the deferred objects are lock-free stacks that
 * only the drain empties (an exchange, so no ABA); the counters are atomics.
 */
#include "nhf.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define RECORDS_PER_SLAB 1024

/* Every slab, for the watchdog's walk (nhf_records_each): a slab's first
 * record is its header's link, pushed once and never removed. */
typedef struct slab {
    struct slab *next;
    nhf_record records[RECORDS_PER_SLAB];
} slab;

/* An object whose release is deferred to the drain (a replayed callable's result). */
typedef struct deferred {
    struct deferred *next;
    PyObject *object; /* one reference */
} deferred;

/* The globals in three groups, each on cache lines of its own (nhf.h's
 * NHF_CACHE_LINE), as each has its own writers: the free list (a thread with the
 * GIL, at every take and release), the handoff to the drain (every completion, and
 * the drain), and the owed drain (the pool's threads, whose spinning reads it at
 * every turn: on one line with the handoff, each drain's exchange reached every
 * spinning thread, and their reads came back to the next one). */
static struct {
    _Alignas(NHF_CACHE_LINE) nhf_record *records; /* GIL held */
    /* Taken and not released (nhf_gil_count). */
    atomic_long held;
    _Atomic(slab *) slabs; /* GIL held to push; the watchdog walks it without */
} free_list;
static struct {
    _Alignas(NHF_CACHE_LINE) _Atomic(nhf_record *) completed; /* have run: for the drain */
    _Atomic(deferred *) deferred_objects;
    atomic_int drain_scheduled;    /* a pending-call drain is scheduled */
    atomic_long schedule_failures; /* Py_AddPendingCall refusals */
    /* The next drain takes out the owners of lanes' direct tasks that have run
     * (set by a pool thread's settle, or by a drain that had to skip a lane). */
    atomic_bool lanes_owed;
} handoff;

/* The executor's hooks for its lanes' direct tasks (nhf_drain_on_lanes); NULL
 * before its module load, and then no lane exists. */
static _Atomic(const nhf_lane_owner_hooks *) lane_owners;

void nhf_drain_on_lanes(const nhf_lane_owner_hooks *hooks) { atomic_store(&lane_owners, hooks); }

Py_ssize_t nhf_records_held(void) { return atomic_load(&free_list.held); }

void nhf_owner_held(long change) { nhf_gil_count(&free_list.held, change); }
Py_ssize_t nhf_schedule_failures(void) { return atomic_load(&handoff.schedule_failures); }

/* ---- the GIL held ---------------------------------------------------------- */

nhf_record *nhf_record_take(nhf_hostfn fn, void *arg, PyObject *owner) {
    if (free_list.records == NULL) {
        /* Slabs are never freed (invariant 6): a driver thread may still write a
         * record while the process exits.  Aligned as a record is (nhf.h), which
         * calloc's alignment is not. */
        slab *fresh = aligned_alloc(_Alignof(slab), sizeof(slab));
        if (fresh == NULL) {
            PyErr_SetString(PyExc_MemoryError, "numba_hostfn could not allocate launch records");
            return NULL;
        }
        memset(fresh, 0, sizeof(slab));
        for (size_t i = 0; i < RECORDS_PER_SLAB; i++) {
            fresh->records[i].next = free_list.records;
            free_list.records = &fresh->records[i];
        }
        fresh->next = atomic_load(&free_list.slabs);
        atomic_store(&free_list.slabs, fresh); /* the GIL held: one writer */
    }
    nhf_record *record = free_list.records;
    free_list.records = record->next;
    record->next = NULL;
    record->fn = fn;
    record->arg = arg;
    record->context = NULL;
    record->result = NULL;
    atomic_store_explicit(&record->watch, NULL, memory_order_relaxed);
    atomic_store_explicit(&record->watch_ctx, NULL, memory_order_relaxed);
    /* A new incarnation: a compare-and-swap on an earlier one's state fails. */
    unsigned long state = atomic_load_explicit(&record->state, memory_order_relaxed);
    atomic_store_explicit(&record->state, NHF_WITH_PHASE(state + 4u, NHF_TAKEN),
                          memory_order_relaxed);
    record->pin = NHF_UNPINNED; /* a pinned record never comes back here */
    Py_INCREF(owner);
    record->owner = owner;
    nhf_gil_count(&free_list.held, 1);
    return record;
}

void nhf_records_each(void (*visit)(nhf_record *record, void *arg), void *arg) {
    for (slab *s = atomic_load(&free_list.slabs); s != NULL; s = s->next)
        for (size_t i = 0; i < RECORDS_PER_SLAB; i++)
            visit(&s->records[i], arg);
}

/* The record is back on the free list before its references are dropped: a
 * finalizer run by the decref may take or drain records itself (invariant 11).
 * A record that a device fault failed is never reused (invariant 23): the driver
 * might yet call its trampoline, which then finds it failed and returns. */
void nhf_record_release(nhf_record *record) {
    if (record->pin != NHF_UNPINNED) { /* nhf_record_unpin's to release, or kept */
        if (record->pin == NHF_PINNED)
            record->pin = NHF_PINNED_OWED;
        return;
    }
    PyObject *result = record->result, *owner = record->owner;
    record->result = NULL;
    record->owner = NULL;
    if (NHF_PHASE(atomic_load(&record->state)) != NHF_FAILED) {
        record->next = free_list.records;
        free_list.records = record;
    }
    nhf_gil_count(&free_list.held, -1);
    Py_XDECREF(result);
    Py_XDECREF(owner);
}

void nhf_record_pin(nhf_record *record) { record->pin = NHF_PINNED; }

void nhf_record_unpin(nhf_record *record, bool keep) {
    bool owed = record->pin == NHF_PINNED_OWED;
    record->pin = keep ? NHF_PIN_KEPT : NHF_UNPINNED;
    if (owed && !keep)
        nhf_record_release(record);
}

/* GIL held: the owners of lanes' direct tasks that have run, released; how many.
 * A lane skipped (its producer inside an enqueue) leaves the drain owed. */
static Py_ssize_t drain_lanes(void) {
    const nhf_lane_owner_hooks *hooks = atomic_load(&lane_owners);
    if (hooks == NULL)
        return 0;
    Py_ssize_t released = hooks->release_ran();
    if (released >= 0)
        return released;
    atomic_store(&handoff.lanes_owed, true);
    return -1 - released;
}

/* GIL held: nhf_drain, with the lanes' owners owed whether a settle owed them or
 * not (drain()). */
static Py_ssize_t drain_all(void) {
    atomic_store(&handoff.lanes_owed, true);
    return nhf_drain();
}

Py_ssize_t nhf_drain(void) {
    /* Cleared before the lanes are read: an owed drain set after this finds them
     * again, for the next drain. */
    Py_ssize_t lanes = 0;
    if (atomic_load_explicit(&handoff.lanes_owed, memory_order_relaxed) &&
        atomic_exchange(&handoff.lanes_owed, false))
        lanes = drain_lanes();
    deferred *node = atomic_exchange(&handoff.deferred_objects, NULL);
    while (node != NULL) {
        deferred *following = node->next;
        PyObject *object = node->object;
        free(node);
        Py_DECREF(object);
        node = following;
    }
    Py_ssize_t n = 0;
    nhf_record *record = atomic_exchange(&handoff.completed, NULL);
    while (record != NULL) {
        nhf_record *following = record->next;
        nhf_record_release(record);
        n++;
        record = following;
    }
    return n + lanes;
}

/* ---- any thread: complete, and schedule the drain ---------------------------- */

/* The pending call that completions schedule: the main thread drains, unless
 * the interpreter guard is closed (exit: leak rather than release).  The flag
 * is cleared first, so a completion during this drain schedules another. */
static int pending_drain(void *unused) {
    (void)unused;
    atomic_store(&handoff.drain_scheduled, 0);
    if (nhf_guard_open() && !nhf_forked()) /* inherited by a forked child: not its own */
        (void)nhf_drain();
    return 0;
}

/* Ask the interpreter to drain on the main thread, once: the flag stays set
 * until that drain starts.  If Py_AddPendingCall refuses (its queue is small
 * and shared), clear the flag so that the next completion, or the next
 * enqueue, tries again, and count the refusal (invariant 14).  Py_AddPendingCall
 * needs no GIL. */
static void schedule_drain(void) {
    int expected = 0;
    if (!atomic_compare_exchange_strong(&handoff.drain_scheduled, &expected, 1))
        return;
    if (!nhf_guard_enter())
        return;
    int refused = Py_AddPendingCall(pending_drain, NULL);
    nhf_guard_leave();
    if (refused) {
        atomic_store(&handoff.drain_scheduled, 0);
        atomic_fetch_add(&handoff.schedule_failures, 1);
    }
}

/* A pool thread defers: it owes the drain instead of scheduling it at each
 * task (a pending call a task: it interrupted the launching thread's loop at
 * every task, 25% of an executor enqueue's host time on the H200).  Which
 * threads defer is a pthread key's value, set once per thread: a _Thread_local
 * in this shared object would take its block from glibc's dynamic TLS, which a
 * later thread reusing the stack frees, a race TSan reports (the stack cache's
 * lock is glibc's own). */
static pthread_key_t defer_key; /* non-NULL on a thread that defers */
static struct {
    /* A deferred completion is on the stack, maybe undrained. */
    _Alignas(NHF_CACHE_LINE) atomic_bool owed;
    atomic_long since; /* when owed was set (CLOCK_MONOTONIC, ns): a hint */
} owing;

void nhf_defer_drains(void) { (void)pthread_setspecific(defer_key, &defer_key); }

/* owed is cleared before the stack is read, and a deferring completion reads
 * owed after its push (all seq_cst): either this read finds that push, or the
 * completion finds owed clear and sets it again, for a later settle (its own
 * thread's at the latest: a pool thread settles before it sleeps). */
void nhf_settle_drain(long now) {
    if (!atomic_load(&owing.owed))
        return;
    if (now != 0 && now - atomic_load(&owing.since) < NHF_DRAIN_DEFER_NS)
        return;
    atomic_store(&owing.owed, false);
    /* The lanes' direct tasks: their owners wait for a drain only where their
     * producer has stopped taking them out as it launches (before this thread
     * sleeps: wherever they wait); where it goes on, look again later. */
    const nhf_lane_owner_hooks *hooks = atomic_load(&lane_owners);
    int lanes = hooks != NULL ? hooks->idle(now == 0) : 0;
    if (lanes > 0)
        atomic_store(&handoff.lanes_owed, true);
    if (lanes > 0 || nhf_drain_wanted())
        schedule_drain();
    if (lanes < 0) /* owed again whatever was scheduled: that drain skips the lanes */
        nhf_owe_drain();
}

void nhf_owe_drain(void) {
    if (!atomic_load(&owing.owed)) { /* after the work it owes for: see nhf_settle_drain */
        atomic_store(&owing.since, nhf_now_ns());
        atomic_store(&owing.owed, true);
    }
}

/* Any thread (the trampolines, a user object's destructor, a simulated graph). */
void nhf_record_complete(nhf_record *record) {
    nhf_record *top = atomic_load(&handoff.completed);
    do {
        record->next = top;
    } while (!atomic_compare_exchange_weak(&handoff.completed, &top, record));
    if (pthread_getspecific(defer_key) != NULL) {
        nhf_owe_drain(); /* after the push: see nhf_settle_drain */
    } else {
        schedule_drain();
    }
}

/* Any thread, GIL held by the caller.  None is released at once: its release
 * never frees anything; so is everything when no memory is left for a node. */
void nhf_defer_release(PyObject *object) {
    deferred *node = object == Py_None ? NULL : malloc(sizeof(deferred));
    if (node == NULL) {
        Py_DECREF(object);
        return;
    }
    node->object = object;
    deferred *top = atomic_load(&handoff.deferred_objects);
    do {
        node->next = top;
    } while (!atomic_compare_exchange_weak(&handoff.deferred_objects, &top, node));
    schedule_drain();
}

bool nhf_drain_wanted(void) {
    return atomic_load(&handoff.completed) != NULL ||
           atomic_load(&handoff.deferred_objects) != NULL;
}

bool nhf_lanes_owed(void) { return atomic_load(&handoff.lanes_owed); }

/* ---- from Python ------------------------------------------------------------------ */

static PyObject *py_drain(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyLong_FromSsize_t(drain_all());
}

static PyObject *py_held(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyLong_FromSsize_t(nhf_records_held());
}

static void collect(PyObject *owner, void *list) {
    if (owner != NULL && *(PyObject **)list != NULL &&
        PyList_Append(*(PyObject **)list, owner) < 0)
        Py_CLEAR(*(PyObject **)list);
}

static void collect_owner(nhf_record *record, void *list) {
    collect(record->owner, list); /* set and cleared with the GIL, which is held */
}

/* held_owners() -> list: what each record taken and not released owns (for tests:
 * both paths of a launch keep the same). */
static PyObject *py_held_owners(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    PyObject *list = PyList_New(0);
    if (list != NULL)
        nhf_records_each(collect_owner, &list);
    const nhf_lane_owner_hooks *hooks = atomic_load(&lane_owners);
    if (list != NULL && hooks != NULL) /* and the lanes' direct tasks' */
        hooks->each_owner(collect, &list);
    return list;
}

static PyObject *py_schedule_failures(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyLong_FromSsize_t(nhf_schedule_failures());
}

static PyMethodDef methods[] = {
    {"drain", py_drain, METH_NOARGS, "drain($module, /)\n--\n\n"
     "Release the records that have run; return how many."},
    {"held", py_held, METH_NOARGS, "held($module, /)\n--\n\n"
     "Records taken and not released."},
    {NULL, NULL, 0, NULL},
};

/* release_kept(record): a record kept for good (nhf_record_unpin's keep),
 * released, for a test that knows no launch can read it any more. */
static PyObject *py_release_kept(PyObject *self, PyObject *address) {
    (void)self;
    void *record;
    if (nhf_address_arg(address, &record) < 0)
        return NULL;
    if (record == NULL || ((nhf_record *)record)->pin != NHF_PIN_KEPT) {
        PyErr_SetString(PyExc_ValueError, "release_kept: not a record kept for good");
        return NULL;
    }
    ((nhf_record *)record)->pin = NHF_UNPINNED;
    nhf_record_release(record);
    Py_RETURN_NONE;
}

/* free_records() -> int: the records on the free list (for tests: a failed record
 * never goes back there, invariant 23). */
static PyObject *py_free_records(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    Py_ssize_t n = 0;
    for (nhf_record *record = free_list.records; record != NULL; record = record->next)
        n++; /* taken and given back with the GIL, which is held */
    return PyLong_FromSsize_t(n);
}

static void collect_state(nhf_record *record, void *dict) {
    PyObject *key = *(PyObject **)dict == NULL ? NULL : PyLong_FromVoidPtr(record);
    PyObject *value = key == NULL ? NULL : PyLong_FromUnsignedLong(atomic_load(&record->state));
    if (value == NULL || PyDict_SetItem(*(PyObject **)dict, key, value) < 0)
        Py_CLEAR(*(PyObject **)dict);
    Py_XDECREF(key);
    Py_XDECREF(value);
}

/* record_states() -> {address: state}: every record's state word, its incarnation
 * and phase (for tests: a fail from an earlier incarnation's state, invariant 23). */
static PyObject *py_record_states(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    PyObject *dict = PyDict_New();
    if (dict != NULL)
        nhf_records_each(collect_state, &dict);
    return dict;
}

static void find_owner(nhf_record *record, void *found_) {
    void **found = found_;
    if (record->owner == found[0]) /* set and cleared with the GIL, which is held */
        found[1] = record;
}

/* record_of(owner) -> the address of the record taken for a launch that owns exactly
 * owner (a plain function launched with no user data), or 0 (for tests). */
static PyObject *py_record_of(PyObject *self, PyObject *owner) {
    (void)self;
    void *found[2] = {owner, NULL};
    nhf_records_each(find_owner, found);
    return PyLong_FromVoidPtr(found[1]);
}

static PyMethodDef testing_methods[] = {
    {"free_records", py_free_records, METH_NOARGS, "free_records($module, /)\n--\n\n"
     "The records on the free list (for tests)."},
    {"record_states", py_record_states, METH_NOARGS, "record_states($module, /)\n--\n\n"
     "Every record's state word, by address (for tests)."},
    {"record_of", py_record_of, METH_O, "record_of($module, owner, /)\n--\n\n"
     "The record of a launch that owns exactly owner, or 0 (for tests)."},
    {"release_kept", py_release_kept, METH_O, "release_kept($module, record, /)\n--\n\n"
     "Release a record kept for good (for tests)."},
    {"held_owners", py_held_owners, METH_NOARGS, "held_owners($module, /)\n--\n\n"
     "What each record taken and not released owns (for tests)."},
    {"schedule_failures", py_schedule_failures, METH_NOARGS,
     "schedule_failures($module, /)\n--\n\n"
     "How many times Py_AddPendingCall refused a drain."},
    {NULL, NULL, 0, NULL},
};

int nhf_records_init(PyObject *module) {
    static bool keyed;
    if (nhf_key_create_once(&defer_key, &keyed) < 0 ||
        PyModule_AddFunctions(module, methods) < 0)
        return -1;
    return nhf_add_testing(module, testing_methods);
}
