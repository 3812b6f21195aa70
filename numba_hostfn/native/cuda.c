/* The CUDA backend: the driver's entry points (set once by the backend, from
 * cuGetProcAddress), its enqueue function, and a graph's records, owned through
 * CUDA user objects.  The watchdog's queries of the driver are in watchdog.c;
 * the executor's stream memory operations in executor_cuda.c.
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

/* set_cuda(is_capturing, launch_host_func, write_value32, wait_value32,
 * batch_mem_op): the driver's entry points (cuGetProcAddress); batch_mem_op 0
 * where the driver lacks it. */
static PyObject *py_set_cuda(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    void *a[5];
    if (nhf_address_args("set_cuda", args, nargs, 5, a) < 0)
        return NULL;
    atomic_store(&nhf_cuda.is_capturing, (nhf_cu_is_capturing)(uintptr_t)a[0]);
    atomic_store(&nhf_cuda.launch_host_func, (nhf_cu_launch_host_func)(uintptr_t)a[1]);
    atomic_store(&nhf_cuda.write_value32, (nhf_cu_write_value32)(uintptr_t)a[2]);
    atomic_store(&nhf_cuda.wait_value32, (nhf_cu_wait_value32)(uintptr_t)a[3]);
    atomic_store(&nhf_cuda.batch_mem_op, (nhf_cu_batch_mem_op)(uintptr_t)a[4]);
    Py_RETURN_NONE;
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
static PyObject *py_set_cuda_user_objects(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    void *a[3];
    if (nhf_address_args("set_cuda_user_objects(create, release, retain)", args, nargs, 3, a) < 0)
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
    if (nhf_check_nargs("cuda_graph_record(graph, fn, arg, owner)", nargs, 4) < 0)
        return NULL;
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
    {"set_cuda_user_objects", (PyCFunction)(void (*)(void))py_set_cuda_user_objects,
     METH_FASTCALL, "set_cuda_user_objects($module, create, release, retain, /)\n--\n\n"},
    {"set_cuda", (PyCFunction)(void (*)(void))py_set_cuda, METH_FASTCALL,
     "set_cuda($module, is_capturing, launch_host_func, write_value32, wait_value32, "
     "batch_mem_op, /)\n--\n\n"
     "The driver's entry points (cuGetProcAddress); batch_mem_op 0 where the driver lacks it."},
    {"cuda_graph_record", (PyCFunction)(void (*)(void))py_cuda_graph_record, METH_FASTCALL,
     "cuda_graph_record($module, graph, fn, arg, owner, /)\n--\n\n"
     "Returns (record, CUresult, call)"},
    {NULL, NULL, 0, NULL},
};


int nhf_cuda_init(PyObject *module) {
    if (PyModule_AddFunctions(module, graph_methods) < 0)
        return -1;
    return nhf_add_address(module, "CUDA_ENQUEUE", (void *)(uintptr_t)nhf_cuda_enqueue);
}
