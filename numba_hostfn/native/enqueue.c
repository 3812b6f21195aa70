/* The enqueue: the core every launch goes through, and the CUDA driver's
 * enqueue function.
 *
 * An *enqueue function* (nhf_enqueue_fn) puts trampoline(record) on a stream
 * and returns a status word: 0, or NHF_* flags with a CUresult in the low 32
 * bits where a driver call failed.  nhf_cuda_enqueue is the driver's; the
 * simulator's and the executor's are in simulator.c and executor.c.
 */
#include "nhf.h"

struct nhf_cuda nhf_cuda;

/* Without the GIL.  A capturing stream gets nothing here (the capture path
 * owns its nodes by the graph: LIFETIME.md, invariant 8), else cuLaunchHostFunc.
 * Both are raw driver entry points, never cuda.bindings' wrapper, which routes
 * every host function through a trampoline that takes the GIL. */
uint64_t nhf_cuda_enqueue(void *stream, nhf_hostfn trampoline, void *record) {
    uint64_t fault = nhf_fault_of_stream(stream); /* a faulted context: refused at once */
    if (fault != 0)
        return fault;
    int capture = 0;
    int rc = atomic_load(&nhf_cuda.is_capturing)(stream, &capture);
    if (rc != 0)
        return NHF_CAPTURE_CHECK_FAILED | (uint32_t)rc;
    if (capture != 0)
        return NHF_CAPTURING;
    return (uint32_t)atomic_load(&nhf_cuda.launch_host_func)(stream, trampoline, record);
}

/* GIL held on entry and exit; dropped only around the enqueue function, so no
 * driver call holds it (invariant 10).  Shared by host_launch, the enqueue
 * builtin (module.c) and the signals' (notify.c). */
uint64_t nhf_enqueue_record(nhf_enqueue_fn enqueue_fn, void *target, nhf_hostfn trampoline,
                            nhf_hostfn fn, void *arg, void *context, PyObject *owner) {
    nhf_record *record = nhf_record_take(fn, arg, owner);
    if (record == NULL)
        return NHF_NO_RECORD;
    record->context = context;
    bool executor = enqueue_fn == nhf_exec_cuda_enqueue || enqueue_fn == nhf_exec_sim_enqueue;
    unsigned long taken = atomic_load_explicit(&record->state, memory_order_relaxed);
    uint64_t status;
    Py_BEGIN_ALLOW_THREADS
    /* The stream a device fault would be found on, and its context (invariant 23). */
    nhf_watch_prepare(record, executor ? nhf_exec_lane_stream(target) : target);
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

/* ---- graphs: a record the graph owns ----------------------------------------------- */

typedef int (*cu_user_object_create)(void **object, void *ptr, nhf_hostfn destroy,
                                     unsigned initial, unsigned flags);
typedef int (*cu_user_object_release)(void *object, unsigned count);
typedef int (*cu_graph_retain_user_object)(void *graph, void *object, unsigned count,
                                           unsigned flags);
enum { CU_USER_OBJECT_NO_DESTRUCTOR_SYNC = 1, CU_GRAPH_USER_OBJECT_MOVE = 1 };

static struct {
    _Atomic(cu_user_object_create) create;
    _Atomic(cu_user_object_release) release;
    _Atomic(cu_graph_retain_user_object) retain;
} user_objects;

/* set_cuda_user_objects(create, release, retain): cuUserObjectCreate,
 * cuUserObjectRelease and cuGraphRetainUserObject (cuGetProcAddress). */
PyObject *nhf_py_set_cuda_user_objects(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    void *a[3];
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "set_cuda_user_objects(create, release, retain)");
        return NULL;
    }
    for (int i = 0; i < 3; i++)
        if (nhf_address_arg(args[i], &a[i]) < 0)
            return NULL;
    atomic_store(&user_objects.create, (cu_user_object_create)(uintptr_t)a[0]);
    atomic_store(&user_objects.release, (cu_user_object_release)(uintptr_t)a[1]);
    atomic_store(&user_objects.retain, (cu_graph_retain_user_object)(uintptr_t)a[2]);
    Py_RETURN_NONE;
}

/* cuda_graph_record(graph, fn, arg, owner) -> (record, 0, 0), or (0, CUresult,
 * call) with call 1 for cuUserObjectCreate and 2 for cuGraphRetainUserObject.
 *
 * Takes a record for fn(arg) owning owner and makes the graph own it, through a
 * user object whose destructor completes it (LIFETIME.md, invariant 8), in one
 * call: no exception can come between taking the record and the graph owning it
 * (a record no one would release), and a failure releases what was made.  The
 * graph owns it from here whatever follows: a node that cannot be added leaves
 * the record with the graph, released with it, never released before the node's
 * last replay (undoing after an add that may have succeeded freed what replays
 * still used). */
static PyObject *py_cuda_graph_record(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    void *graph, *fn, *arg;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "cuda_graph_record(graph, fn, arg, owner)");
        return NULL;
    }
    if (nhf_address_arg(args[0], &graph) < 0 || nhf_address_arg(args[1], &fn) < 0 ||
        nhf_address_arg(args[2], &arg) < 0)
        return NULL;
    nhf_record *record = nhf_record_take((nhf_hostfn)(uintptr_t)fn, arg, args[3]);
    if (record == NULL)
        return NULL;
    void *object = NULL;
    int rc, call = 1;
    Py_BEGIN_ALLOW_THREADS
    rc = atomic_load(&user_objects.create)(&object, record, nhf_user_object_release, 1,
                                           CU_USER_OBJECT_NO_DESTRUCTOR_SYNC);
    if (rc == 0) {
        call = 2;
        rc = atomic_load(&user_objects.retain)(graph, object, 1, CU_GRAPH_USER_OBJECT_MOVE);
        if (rc != 0) /* the user object's destructor completes the record */
            (void)atomic_load(&user_objects.release)(object, 1);
    }
    Py_END_ALLOW_THREADS
    if (rc != 0 && call == 1)
        nhf_record_release(record);
    return Py_BuildValue("(Nii)", PyLong_FromVoidPtr(rc == 0 ? record : NULL), rc,
                         rc == 0 ? 0 : call);
}

static PyMethodDef graph_methods[] = {
    {"set_cuda_user_objects", (PyCFunction)(void (*)(void))nhf_py_set_cuda_user_objects,
     METH_FASTCALL,
     "set_cuda_user_objects($module, create, release, retain, /)\n--\n\n"},
    {"cuda_graph_record", (PyCFunction)(void (*)(void))py_cuda_graph_record, METH_FASTCALL,
     "cuda_graph_record($module, graph, fn, arg, owner, /)\n--\n\n"
     "Returns (record, CUresult, call)"},
    {NULL, NULL, 0, NULL},
};

int nhf_enqueue_init(PyObject *module) { return PyModule_AddFunctions(module, graph_methods); }
