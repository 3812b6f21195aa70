/* The enqueue: the core every launch goes through.
 * An *enqueue function* (nhf_enqueue_fn) puts trampoline(record) on a stream
 * and returns a status word: 0, or NHF_* flags with a CUresult in the low 32
 * bits where a driver call failed.  Each backend's is next to it: the driver's
 * in cuda.c, the simulator's in simulator.c, an executor lane's in
 * executor_cuda.c and executor_sim.c; each is a *route* (nhf.h's enum
 * nhf_route), which is what Python names: a number, never an address.
 */
#include "nhf.h"

/* The routes (nhf.h's enum nhf_route): each one's enqueue function, and the
 * stream of its target where the target is not the stream (an executor's lane).
 * Written at module load, with the GIL, before any launch (nhf_enqueue_add_route,
 * by the layer that owns each); read after. */
static struct {
    nhf_enqueue_fn enqueue_fn; /* a stream's */
    nhf_lane_fn lane_fn;       /* or an executor lane's */
    void *(*stream_of)(void *target);
} routes[NHF_NROUTES];

void nhf_enqueue_add_route(int route, nhf_enqueue_fn enqueue_fn,
                           void *(*stream_of)(void *target)) {
    routes[route].enqueue_fn = enqueue_fn;
    routes[route].stream_of = stream_of;
}

void nhf_enqueue_add_lane(int route, nhf_lane_fn lane_fn, void *(*stream_of)(void *target)) {
    routes[route].lane_fn = lane_fn;
    routes[route].stream_of = stream_of;
}

int nhf_route_arg(PyObject *value) {
    long route = PyLong_AsLong(value);
    if (route == -1 && PyErr_Occurred())
        return NHF_ROUTE_NONE;
    if (route <= NHF_ROUTE_NONE || route >= NHF_NROUTES ||
        (routes[route].enqueue_fn == NULL && routes[route].lane_fn == NULL)) {
        PyErr_Format(PyExc_ValueError,
                     "%ld names no route (_core.ROUTE_CUDA, ROUTE_SIM, ROUTE_SIM_DEVICE, "
                     "ROUTE_CUDA_LANE or ROUTE_SIM_LANE)",
                     route);
        return NHF_ROUTE_NONE;
    }
    if ((route == NHF_ROUTE_CUDA || route == NHF_ROUTE_CUDA_LANE) && !nhf_driver_loaded()) {
        PyErr_SetString(PyExc_ValueError, "a CUDA route before the CUDA backend loaded the "
                                          "driver table (driver_load): nothing to call");
        return NHF_ROUTE_NONE;
    }
    return (int)route;
}

/* The lane task the last enqueue on this thread opened (nhf_enqueue_last_task),
 * the value of a pthread key (the number itself, not a pointer); reset by the one
 * caller that reads it, not by every enqueue.  Not _Thread_local (nhf.h,
 * nhf_key_create_once).  Made at module load (nhf_enqueue_init). */
static pthread_key_t last_task_key;

void nhf_enqueue_note_task(uint32_t task) {
    (void)pthread_setspecific(last_task_key, (void *)(uintptr_t)task);
}

uint32_t nhf_enqueue_last_task(void) {
    return (uint32_t)(uintptr_t)pthread_getspecific(last_task_key);
}

/* GIL held: release the owners lanes' direct tasks held (taken out of the lane),
 * count of them, where not NULL. */
static void release_owners(PyObject **owners, int count) {
    for (int i = 0; i < count; i++) {
        if (owners[i] != NULL) {
            nhf_owner_held(-1);
            Py_DECREF(owners[i]);
        }
    }
}

/* GIL held on entry and exit; dropped only around the enqueue function, so no
 * driver call holds it (invariant 10).  Shared by nhf_enqueue_launch (host_launch,
 * the enqueue builtin below) and the signals' enqueue (notify.c).  On a lane, the
 * enqueue may hand back owners of the lane's direct tasks that have run. */
uint64_t nhf_enqueue_record(int route, void *target, nhf_hostfn trampoline, nhf_hostfn fn,
                            void *arg, void *context, PyObject *owner) {
    nhf_enqueue_fn enqueue_fn = routes[route].enqueue_fn;
    nhf_lane_fn lane_fn = routes[route].lane_fn;
    void *(*stream_of)(void *target) = routes[route].stream_of;
    nhf_record *record = nhf_record_take(fn, arg, owner);
    if (record == NULL)
        return NHF_NO_RECORD;
    record->context = context;
    unsigned long taken = atomic_load_explicit(&record->state, memory_order_relaxed);
    uint64_t status;
    PyObject *released[NHF_LANE_RELEASED] = {NULL}; /* a lane's direct tasks' */
    Py_BEGIN_ALLOW_THREADS
    /* The stream a device fault would be found on, and its context (invariant 23). */
    nhf_watch_prepare(record, stream_of != NULL ? stream_of(target) : target);
    status = lane_fn != NULL ? lane_fn(target, trampoline, record, NULL, released)
                             : enqueue_fn(target, trampoline, record);
    Py_END_ALLOW_THREADS
    if (status == 0 || (status & NHF_KEPT))
        nhf_watch_enqueued(record, taken);
    bool refused = status != 0 && !(status & NHF_KEPT);
    /* A refusal drains where the lanes are owed a look: a drain may have skipped
     * this lane while this enqueue held it, and no task of it follows to settle. */
    bool drain = status == 0 ? nhf_drain_wanted() : refused && nhf_lanes_owed();
    /* The drain and the releases below run finalizers, which may launch on a lane
     * from this thread: this enqueue's task number (nhf_enqueue_last_task) is kept
     * across them.  Read only where they run: a pthread key's value is a call here. */
    bool python = drain || refused || released[0] != NULL;
    uint32_t task = python ? nhf_enqueue_last_task() : 0;
    if (drain)
        (void)nhf_drain();
    if (refused)
        nhf_record_release(record); /* refused: nothing will run it (invariant 3) */
    release_owners(released, NHF_LANE_RELEASED);
    if (python)
        nhf_enqueue_note_task(task);
    return status;
}

/* A direct task (invariant 15): the lane holds a reference to owner, and no record
 * is taken, watched, completed or drained for it: the launching thread's later
 * enqueues on the lane take the owners of tasks that ran out of it, and a drain
 * takes out the rest (nhf_exec_release_ran).  The watchdog watches the lane's
 * context instead (nhf_exec_watch_lanes), woken here as for a record in flight. */
uint64_t nhf_enqueue_launch(int route, void *target, nhf_hostfn trampoline, nhf_hostfn fn,
                            void *arg, void *context, PyObject *owner) {
    nhf_lane_fn lane_fn = routes[route].lane_fn;
    if (lane_fn == NULL || trampoline != nhf_run_compiled || context != NULL)
        return nhf_enqueue_record(route, target, trampoline, fn, arg, context, owner);
    nhf_owner_held(1);
    Py_INCREF(owner);
    uint64_t status;
    PyObject *released[NHF_LANE_RELEASED] = {NULL};
    Py_BEGIN_ALLOW_THREADS
    status = lane_fn(target, fn, arg, owner, released);
    if (status == 0 || (status & NHF_KEPT))
        nhf_watch_wake();
    Py_END_ALLOW_THREADS
    bool refused = status != 0 && !(status & NHF_KEPT);
    if (refused)
        release_owners(&owner, 1); /* refused: nothing will run it (invariant 3) */
    release_owners(released, NHF_LANE_RELEASED);
    /* other launches' records, as above; refused, the lanes' owners a drain skipped */
    if (status == 0 ? nhf_drain_wanted() : refused && nhf_lanes_owed())
        (void)nhf_drain();
    return status;
}

/* enqueue(route, target, trampoline, fn, arg, owner[, context]) -> status, for
 * the Python implementation of host_launch (and host_copy, release_after, the
 * executor's): nhf_enqueue_launch.  route and trampoline are numbers
 * (_core.ROUTE_*, _core.RUN_*): the core picks the functions they name. */
static PyObject *py_enqueue(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    void *target, *fn, *arg, *context = NULL;
    if (nargs != 6 && nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "enqueue(route, target, trampoline, fn, arg, owner"
                                         "[, context]) takes 6 or 7 arguments");
        return NULL;
    }
    int route = nhf_route_arg(args[0]);
    if (route == NHF_ROUTE_NONE || nhf_address_arg(args[1], &target) < 0)
        return NULL;
    long id = PyLong_AsLong(args[2]);
    if (id == -1 && PyErr_Occurred())
        return NULL;
    nhf_hostfn trampoline = nhf_trampoline_of(id);
    if (trampoline == NULL || nhf_address_arg(args[3], &fn) < 0 ||
        nhf_address_arg(args[4], &arg) < 0 ||
        (nargs == 7 && nhf_address_arg(args[6], &context) < 0))
        return NULL;
    uint64_t status = nhf_enqueue_launch(route, target, trampoline, (nhf_hostfn)(uintptr_t)fn,
                                         arg, context, args[5]);
    if (status == NHF_NO_RECORD)
        return NULL;
    return PyLong_FromUnsignedLongLong(status);
}

static PyMethodDef methods[] = {
    {"enqueue", (PyCFunction)(void (*)(void))py_enqueue, METH_FASTCALL,
     "enqueue($module, route, target, trampoline, fn, arg, owner, context=0, /)\n--\n\n"
     "Returns status"},
    {NULL, NULL, 0, NULL},
};

int nhf_enqueue_init(PyObject *module) {
    static bool keyed;
    if (nhf_key_create_once(&last_task_key, &keyed) < 0 ||
        PyModule_AddFunctions(module, methods) < 0)
        return -1;
    if (PyModule_AddIntConstant(module, "ROUTE_CUDA", NHF_ROUTE_CUDA) < 0 ||
        PyModule_AddIntConstant(module, "ROUTE_SIM", NHF_ROUTE_SIM) < 0 ||
        PyModule_AddIntConstant(module, "ROUTE_SIM_DEVICE", NHF_ROUTE_SIM_DEVICE) < 0 ||
        PyModule_AddIntConstant(module, "ROUTE_CUDA_LANE", NHF_ROUTE_CUDA_LANE) < 0 ||
        PyModule_AddIntConstant(module, "ROUTE_SIM_LANE", NHF_ROUTE_SIM_LANE) < 0)
        return -1;
    return 0;
}
