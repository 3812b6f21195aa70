/* The enqueue: the core every launch goes through.
 * An *enqueue function* (nhf_enqueue_fn) puts trampoline(record) on a stream
 * and returns a status word: 0, or NHF_* flags with a CUresult in the low 32
 * bits where a driver call failed.  Each backend's is next to it: the driver's
 * in cuda.c, the simulator's in simulator.c, an executor lane's in
 * executor_cuda.c and executor_sim.c.
 */
#include "nhf.h"

/* The enqueue functions whose target is an executor's lane, and the stream of
 * such a target (nhf_enqueue_add_lanes): written at module load, with the GIL,
 * before any launch; read with the GIL. */
#define MAX_LANE_KINDS 4
static struct {
    nhf_enqueue_fn enqueue_fn;
    void *(*stream_of)(void *target);
} lane_kinds[MAX_LANE_KINDS];
static int nlane_kinds;

int nhf_enqueue_add_lanes(nhf_enqueue_fn enqueue_fn, void *(*stream_of)(void *target)) {
    if (nlane_kinds == MAX_LANE_KINDS) {
        PyErr_SetString(PyExc_RuntimeError, "numba_hostfn: too many lane enqueue functions");
        return -1;
    }
    lane_kinds[nlane_kinds].enqueue_fn = enqueue_fn;
    lane_kinds[nlane_kinds].stream_of = stream_of;
    nlane_kinds++;
    return 0;
}

/* GIL held: how to find the stream of enqueue_fn's target, or NULL if the
 * target is the stream. */
static void *(*lane_stream_of(nhf_enqueue_fn enqueue_fn))(void *target) {
    for (int i = 0; i < nlane_kinds; i++)
        if (lane_kinds[i].enqueue_fn == enqueue_fn)
            return lane_kinds[i].stream_of;
    return NULL;
}

/* GIL held on entry and exit; dropped only around the enqueue function, so no
 * driver call holds it (invariant 10).  Shared by host_launch, the enqueue
 * builtin (below) and the signals' (notify.c). */
uint64_t nhf_enqueue_record(nhf_enqueue_fn enqueue_fn, void *target, nhf_hostfn trampoline,
                            nhf_hostfn fn, void *arg, void *context, PyObject *owner) {
    nhf_record *record = nhf_record_take(fn, arg, owner);
    if (record == NULL)
        return NHF_NO_RECORD;
    record->context = context;
    void *(*stream_of)(void *target) = lane_stream_of(enqueue_fn);
    unsigned long taken = atomic_load_explicit(&record->state, memory_order_relaxed);
    uint64_t status;
    Py_BEGIN_ALLOW_THREADS
    /* The stream a device fault would be found on, and its context (invariant 23). */
    nhf_watch_prepare(record, stream_of != NULL ? stream_of(target) : target);
    status = enqueue_fn(target, trampoline, record);
    Py_END_ALLOW_THREADS
    if (status == 0 || (status & NHF_KEPT))
        nhf_watch_enqueued(record, taken);
    if (status == 0) {
        if (nhf_drain_wanted())
            (void)nhf_drain();
    } else if (!(status & NHF_KEPT)) {
        nhf_record_release(record); /* refused: nothing will run it (invariant 3) */
    }
    return status;
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
    if (nhf_address_args("enqueue", args, 5, 5, a) < 0 ||
        (nargs == 7 && nhf_address_arg(args[6], &context) < 0))
        return NULL;
    uint64_t status = nhf_enqueue_record((nhf_enqueue_fn)(uintptr_t)a[0], a[1],
                                         (nhf_hostfn)(uintptr_t)a[2], (nhf_hostfn)(uintptr_t)a[3],
                                         a[4], context, args[5]);
    if (status == NHF_NO_RECORD)
        return NULL;
    return PyLong_FromUnsignedLongLong(status);
}

static PyMethodDef methods[] = {
    {"enqueue", (PyCFunction)(void (*)(void))py_enqueue, METH_FASTCALL,
     "enqueue($module, enqueue_fn, target, trampoline, fn, arg, owner, context=0, /)\n--\n\n"
     "Returns status"},
    {NULL, NULL, 0, NULL},
};

int nhf_enqueue_init(PyObject *module) { return PyModule_AddFunctions(module, methods); }
