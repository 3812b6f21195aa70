/* The CUDA backend: its enqueue function, a graph's records (owned through CUDA
 * user objects), and every other driver call the backend makes for Python (a
 * capture's state and its host nodes, the executor's graph-slot nodes and their
 * child graph, pinned words, the thread's capture mode): all through the driver
 * table (driver.h), with the GIL released around each call.  The watchdog's
 * queries of the driver are in watchdog.c; the executor's stream memory
 * operations in executor_cuda.c.
 *
 * Errors.  A builtin here raises only for its own arguments (or memory); what the
 * driver answers goes back as a CUresult beside the call's name, in a tuple
 * (value, CUresult, call), call None when all succeeded, and the backend
 * (_cuda.CudaBackend) raises for it with the message that says what to do.
 */
#include "nhf.h"

#include <string.h>

/* Without the GIL.  What an enqueue on stream is refused with before it
 * launches, or 0: a fault noted on its context (refused at once), a failed read
 * of its capture, or NHF_CAPTURING (the capture path owns its nodes by the graph:
 * LIFETIME.md, invariant 8).  Both CUDA enqueues (this file's, an executor lane's
 * in executor_cuda.c) and a signal's check before it makes anything
 * (cuda_refusal: invariant 3) read it here, so the three refuse alike. */
uint64_t nhf_cuda_refusal(void *stream) {
    uint64_t fault = nhf_fault_of_stream(stream);
    if (fault != 0)
        return fault;
    int capture = 0;
    int rc = NHF_CU(cuStreamIsCapturing)(stream, &capture);
    if (rc != 0)
        return NHF_CAPTURE_CHECK_FAILED | (uint32_t)rc;
    return capture != 0 ? NHF_CAPTURING : 0;
}

/* Without the GIL.  nhf_cuda_refusal, else cuLaunchHostFunc: raw driver entry
 * points, never cuda.bindings' wrapper, which routes every host function through
 * a trampoline that takes the GIL. */
uint64_t nhf_cuda_enqueue(void *stream, nhf_hostfn trampoline, void *record) {
    uint64_t refusal = nhf_cuda_refusal(stream);
    if (refusal != 0)
        return refusal;
    return (uint32_t)NHF_CU(cuLaunchHostFunc)(stream, trampoline, record);
}

void nhf_cuda_stream_key(void *stream, void **ctx, unsigned long long *id) {
    *ctx = NULL;
    *id = 0;
    if ((uintptr_t)stream > (uintptr_t)CU_STREAM_PER_THREAD)
        return;
    nhf_cuCtxGetCurrent_fn current = NHF_CU(cuCtxGetCurrent);
    nhf_cuStreamGetId_fn get_id = NHF_CU(cuStreamGetId);
    Py_BEGIN_ALLOW_THREADS /* no driver call holds the GIL (invariant 10) */
    if (current == NULL || current(ctx) != 0)
        *ctx = NULL;
    if (get_id == NULL || get_id(stream, id) != 0)
        *id = 0;
    Py_END_ALLOW_THREADS
}

/* GIL held, at the top of a builtin: the answer for an entry point the driver
 * table does not have (not loaded: the simulator's; or a test's stand-in of 0). */
#define NHF_CU_OR_ANSWER(name, value)                                                      \
    do {                                                                                   \
        if (NHF_CU(name) == NULL)                                                          \
            return answer(value, CUDA_ERROR_NOT_INITIALIZED, #name);                       \
    } while (0)

/* GIL held: the (value, CUresult, call) answer; call is NULL when rc is 0. */
static PyObject *answer(PyObject *value, int rc, const char *call) {
    if (value == NULL)
        return NULL;
    if (rc == 0)
        call = NULL;
    return Py_BuildValue("(Niz)", value, rc, call);
}

/* ---- graphs: a record the graph owns ----------------------------------------------- */

/* cuda_graph_record(graph, fn, arg, owner) -> (record, 0, None), or (0, CUresult,
 * call), call "cuUserObjectCreate" or "cuGraphRetainUserObject".
 *
 * Takes a record for fn(arg) owning owner and makes the graph own it, through a
 * user object whose destructor completes it (LIFETIME.md, invariant 8), in one
 * call: no exception can come between taking the record and the graph owning it
 * (a record no one would release), and a failure lets the owner go at once (the
 * record itself once a user object made for it is destroyed).  The
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
    NHF_CU_OR_ANSWER(cuUserObjectCreate, PyLong_FromLong(0));
    NHF_CU_OR_ANSWER(cuGraphRetainUserObject, PyLong_FromLong(0));
    NHF_CU_OR_ANSWER(cuUserObjectRelease, PyLong_FromLong(0));
    nhf_record *record = nhf_record_take((nhf_hostfn)(uintptr_t)fn, arg, args[3]);
    if (record == NULL)
        return NULL;
    void *object = NULL;
    int rc;
    const char *call = "cuUserObjectCreate";
    Py_BEGIN_ALLOW_THREADS
    rc = NHF_CU(cuUserObjectCreate)(&object, record, nhf_user_object_release, 1,
                                    CU_USER_OBJECT_NO_DESTRUCTOR_SYNC);
    if (rc == 0) {
        call = "cuGraphRetainUserObject";
        rc = NHF_CU(cuGraphRetainUserObject)(graph, object, 1, CU_GRAPH_USER_OBJECT_MOVE);
    }
    Py_END_ALLOW_THREADS
    if (rc != 0 && strcmp(call, "cuUserObjectCreate") == 0) {
        nhf_record_release(record);
    } else if (rc != 0) {
        /* A refused retain: the user object is ours alone, and its destructor
         * completes the record whenever the driver runs it (later, on a thread of
         * its own: no destructor sync).  The owner is let go now, before the
         * release, so that the error leaves nothing kept (invariant 3): the
         * record goes back to the free list empty once the destructor has run. */
        PyObject *owner = record->owner;
        record->owner = NULL;
        Py_BEGIN_ALLOW_THREADS
        (void)NHF_CU(cuUserObjectRelease)(object, 1);
        Py_END_ALLOW_THREADS
        Py_DECREF(owner);
    }
    return answer(PyLong_FromVoidPtr(rc == 0 ? record : NULL), rc, call);
}

/* ---- captures ------------------------------------------------------------------------ */

/* cuda_refusal(stream) -> the status word an enqueue on stream would be refused
 * with before it launches, or 0 (nhf_cuda_refusal), read without enqueuing: a
 * signal's check before it makes its thread, channel or lane (_cuda.CudaBackend's
 * signal_refusal).  CUDA_ERROR_NOT_INITIALIZED with the capture-read flag where
 * the driver table is not loaded. */
static PyObject *py_cuda_refusal(PyObject *self, PyObject *stream_) {
    (void)self;
    void *stream;
    if (nhf_address_arg(stream_, &stream) < 0)
        return NULL;
    if (NHF_CU(cuStreamIsCapturing) == NULL)
        return PyLong_FromUnsignedLongLong(NHF_CAPTURE_CHECK_FAILED |
                                           (uint32_t)CUDA_ERROR_NOT_INITIALIZED);
    uint64_t status;
    Py_BEGIN_ALLOW_THREADS /* no driver call holds the GIL (invariant 10) */
    status = nhf_cuda_refusal(stream);
    Py_END_ALLOW_THREADS
    return PyLong_FromUnsignedLongLong(status);
}


/* cuda_capture_info(stream) -> ((status, graph), CUresult, call): the stream's
 * CUstreamCaptureStatus and, while it captures, the graph being captured. */
static PyObject *py_cuda_capture_info(PyObject *self, PyObject *stream_) {
    (void)self;
    void *stream, *graph = NULL;
    if (nhf_address_arg(stream_, &stream) < 0)
        return NULL;
    NHF_CU_OR_ANSWER(cuStreamGetCaptureInfo, Py_BuildValue("(ii)", 0, 0));
    int status = CU_STREAM_CAPTURE_STATUS_NONE, rc;
    Py_BEGIN_ALLOW_THREADS
    rc = NHF_CU(cuStreamGetCaptureInfo)(stream, &status, NULL, &graph, NULL, NULL, NULL);
    Py_END_ALLOW_THREADS
    return answer(Py_BuildValue("(iN)", status, PyLong_FromVoidPtr(graph)), rc,
                  "cuStreamGetCaptureInfo");
}

/* cuda_exchange_capture_mode(mode) -> (the thread's mode before, CUresult, call):
 * cuThreadExchangeStreamCaptureMode; (mode, 0, None) unchanged where the driver
 * lacks it (an old driver: as a HostExecutor made there). */
static PyObject *py_cuda_exchange_capture_mode(PyObject *self, PyObject *mode_) {
    (void)self;
    long value = PyLong_AsLong(mode_);
    if (value == -1 && PyErr_Occurred())
        return NULL;
    if (value < CU_STREAM_CAPTURE_MODE_GLOBAL || value > CU_STREAM_CAPTURE_MODE_RELAXED) {
        PyErr_Format(PyExc_ValueError, "%ld is not a CUstreamCaptureMode (0, 1 or 2)", value);
        return NULL;
    }
    int mode = (int)value;
    nhf_cuThreadExchangeStreamCaptureMode_fn exchange = NHF_CU(cuThreadExchangeStreamCaptureMode);
    int rc = 0;
    if (exchange != NULL) {
        Py_BEGIN_ALLOW_THREADS
        rc = exchange(&mode);
        Py_END_ALLOW_THREADS
    }
    return answer(PyLong_FromLong(mode), rc, "cuThreadExchangeStreamCaptureMode");
}

/* ---- the executor's words and graph slots ------------------------------------------ */

/* cuda_pinned_words(nbytes) -> (address, CUresult, call): nbytes of zeroed pinned
 * host memory, portable and mapped (the executor's words), in the current
 * context; never freed (a stream may still wait on them). */
static PyObject *py_cuda_pinned_words(PyObject *self, PyObject *nbytes_) {
    (void)self;
    size_t nbytes = PyLong_AsSize_t(nbytes_);
    if (nbytes == (size_t)-1 && PyErr_Occurred())
        return NULL;
    if (nbytes == 0) {
        PyErr_SetString(PyExc_ValueError, "cuda_pinned_words: nbytes must be positive");
        return NULL;
    }
    NHF_CU_OR_ANSWER(cuMemHostAlloc, PyLong_FromLong(0));
    void *words = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = NHF_CU(cuMemHostAlloc)(&words, nbytes,
                                CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP);
    if (rc == 0 && words != NULL)
        memset(words, 0, nbytes);
    Py_END_ALLOW_THREADS
    return answer(PyLong_FromVoidPtr(rc == 0 ? words : NULL), rc, "cuMemHostAlloc");
}

/* Without the GIL: a graph slot's three operations on stream (capturing): write
 * "reached" 1, wait for "done" >= 1, write "done" 0 (graph_slots.c says what the
 * pool does between).  *call names the one that failed.
 *
 * whole: the capture is not ours (a user's stream), so the three are captured
 * all or none (invariant 16): one cuStreamBatchMemOp, which a refusal leaves out
 * whole (a refused driver call enqueues nothing).  Three single calls could leave
 * a part in a capture that stays valid (a failed call need not invalidate it): a
 * lone "reached := 1" runs the node's work with no stream waiting for it.  So
 * without the batch, whole refuses with nothing captured.  Not whole (our own
 * capture into a child graph, discarded on failure): the three single calls. */
static int slot_nodes(void *stream, uint64_t words, bool whole, const char **call) {
    uint64_t reached = words, done = words + 4;
    nhf_cuStreamBatchMemOp_fn batch = NHF_CU(cuStreamBatchMemOp);
    *call = "cuStreamBatchMemOp";
    if (whole && batch != NULL) {
        nhf_cu_batch_mem_op_params ops[3];
        memset(ops, 0, sizeof ops);
        ops[0].value_op.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
        ops[0].value_op.address = reached;
        ops[0].value_op.value = 1;
        ops[0].value_op.flags = CU_STREAM_WRITE_VALUE_DEFAULT;
        ops[1].value_op.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
        ops[1].value_op.address = done;
        ops[1].value_op.value = 1;
        ops[1].value_op.flags = CU_STREAM_WAIT_VALUE_GEQ;
        ops[2].value_op.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
        ops[2].value_op.address = done;
        ops[2].value_op.value = 0;
        ops[2].value_op.flags = CU_STREAM_WRITE_VALUE_DEFAULT;
        return batch(stream, 3, ops, 0);
    }
    if (whole)
        return CUDA_ERROR_NOT_SUPPORTED;
    *call = "cuStreamWriteValue32";
    int rc = NHF_CU(cuStreamWriteValue32)(stream, reached, 1, CU_STREAM_WRITE_VALUE_DEFAULT);
    if (rc != 0)
        return rc;
    *call = "cuStreamWaitValue32";
    rc = NHF_CU(cuStreamWaitValue32)(stream, done, 1, CU_STREAM_WAIT_VALUE_GEQ);
    if (rc != 0)
        return rc;
    *call = "cuStreamWriteValue32";
    return NHF_CU(cuStreamWriteValue32)(stream, done, 0, CU_STREAM_WRITE_VALUE_DEFAULT);
}

/* ---- a node launched into a capture that another thread may end ------------------- */

/* Where a captured node's launch went (into_capture). */
enum captured_where {
    CAPTURE_ENDED = 0, /* the capture of the graph had ended: nothing enqueued */
    CAPTURE_NODE = 1,  /* a node of that capture, for sure */
    CAPTURE_UNSURE = 2 /* it ended during the launch: a node, or work on the stream */
};

/* Without the GIL: what a node launches on the capturing stream (one driver call,
 * all of it or none); 0 or the failing call's CUresult, named in *call. */
typedef int (*capture_launch_fn)(void *stream, void *what, void *record, const char **call);

static int launch_host_node(void *stream, void *replay, void *record, const char **call) {
    *call = "cuLaunchHostFunc";
    return NHF_CU(cuLaunchHostFunc)(stream, (nhf_hostfn)(uintptr_t)replay, record);
}

static int launch_slot_nodes(void *stream, void *words, void *record, const char **call) {
    (void)record; /* the slot's: it owns the slot that answers the words */
    return slot_nodes(stream, (uintptr_t)words, true, call);
}

/* Without the GIL: launch(stream, what, record) into graph's capture on stream,
 * on the stream itself, so that the capture's dependencies are the driver's
 * own; 0 or the failing call's CUresult (*call), and *where.  Another thread
 * may end the capture at any time (cuStreamEndCapture, cuda.core's
 * end_building): a launch after that end goes to the stream, and runs there
 * with the record that graph owns, which the graph's destruction may release
 * first.  So the capture is read just before the launch (graph's, or nothing is
 * launched) and just after (the same capture, by its id, still active: the
 * launch was its node, as a capture that ended never goes on). */
static int into_capture(void *stream, void *graph, capture_launch_fn launch, void *what,
                        void *record, int *where, const char **call) {
    nhf_cuStreamGetCaptureInfo_fn info = NHF_CU(cuStreamGetCaptureInfo);
    int status = CU_STREAM_CAPTURE_STATUS_NONE;
    uint64_t id = 0, id_after = 0;
    void *capturing = NULL;
    *where = CAPTURE_ENDED;
    *call = "cuStreamGetCaptureInfo";
    int rc = info(stream, &status, &id, &capturing, NULL, NULL, NULL);
    if (rc != 0 || status != CU_STREAM_CAPTURE_STATUS_ACTIVE || capturing != graph)
        return rc; /* ended (another capture may have begun): the caller enqueues again */
    rc = launch(stream, what, record, call);
    if (rc != 0)
        return rc; /* refused: nothing enqueued */
    *where = info(stream, &status, &id_after, NULL, NULL, NULL, NULL) == 0 &&
                     status == CU_STREAM_CAPTURE_STATUS_ACTIVE && id_after == id
                 ? CAPTURE_NODE
                 : CAPTURE_UNSURE;
    return 0;
}

/* GIL held: into_capture, with the GIL released around it, and the answer
 * (where, CUresult, call).  The record (the one graph owns) is pinned meanwhile:
 * the graph's end and destruction on another thread may release it, and that
 * release waits for the answer.  Where the capture ended during the launch, the
 * launch may run once on the stream with that record, after the graph is gone:
 * it is kept for good (its owners leak rather than dangle; never reused). */
static PyObject *into_capture_answer(void *stream, void *graph, capture_launch_fn launch,
                                     void *what, nhf_record *record) {
    const char *call;
    int rc, where;
    nhf_record_pin(record);
    Py_BEGIN_ALLOW_THREADS
    rc = into_capture(stream, graph, launch, what, record, &where, &call);
    Py_END_ALLOW_THREADS
    nhf_record_unpin(record, where == CAPTURE_UNSURE);
    return answer(PyLong_FromLong(where), rc, call);
}

/* cuda_captured_host_node(stream, graph, replay, record) -> (where, CUresult,
 * call): replay(record) as a host node of graph's capture on stream (record: the
 * one graph owns, cuda_graph_record's).  where: CAPTURE_ENDED where that capture
 * had ended (nothing enqueued: the caller enqueues on the stream, with a record
 * of its own), CAPTURE_NODE, or CAPTURE_UNSURE (into_capture_answer). */
static PyObject *py_cuda_captured_host_node(PyObject *self, PyObject *const *args,
                                            Py_ssize_t nargs) {
    (void)self;
    void *a[4];
    if (nhf_address_args("cuda_captured_host_node(stream, graph, replay, record)", args, nargs,
                         4, a) < 0)
        return NULL;
    if (a[2] == NULL || a[3] == NULL) {
        PyErr_SetString(PyExc_ValueError,
                        "cuda_captured_host_node: a NULL replay trampoline or record");
        return NULL;
    }
    NHF_CU_OR_ANSWER(cuStreamGetCaptureInfo, PyLong_FromLong(CAPTURE_ENDED));
    NHF_CU_OR_ANSWER(cuLaunchHostFunc, PyLong_FromLong(CAPTURE_ENDED));
    return into_capture_answer(a[0], a[1], launch_host_node, a[2], a[3]);
}

/* cuda_slot_nodes(stream, graph, words, record) -> (where, CUresult, call): a graph
 * slot's three operations, captured on stream into graph's capture, all or none
 * (one cuStreamBatchMemOp); record: the one graph owns, which owns the slot.
 * where as cuda_captured_host_node's: on the stream, the operations would wait
 * for a slot that the graph's destruction disarms. */
static PyObject *py_cuda_slot_nodes(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    void *a[4];
    if (nhf_address_args("cuda_slot_nodes(stream, graph, words, record)", args, nargs, 4, a) <
        0)
        return NULL;
    if (a[3] == NULL) {
        PyErr_SetString(PyExc_ValueError, "cuda_slot_nodes: a NULL record");
        return NULL;
    }
    NHF_CU_OR_ANSWER(cuStreamGetCaptureInfo, PyLong_FromLong(CAPTURE_ENDED));
    NHF_CU_OR_ANSWER(cuStreamWriteValue32, PyLong_FromLong(CAPTURE_ENDED));
    NHF_CU_OR_ANSWER(cuStreamWaitValue32, PyLong_FromLong(CAPTURE_ENDED));
    return into_capture_answer(a[0], a[1], launch_slot_nodes, a[2], a[3]);
}

/* cuda_slot_graph(graph, words) -> (None, CUresult, call): a graph slot's three
 * operations added to graph (an explicit graph's child, empty): captured into it
 * by a stream of our own (cuStreamBeginCaptureToGraph, relaxed: no other stream's
 * capture is affected), which is destroyed after.  Where the driver lacks
 * cuStreamBeginCaptureToGraph (before CUDA 12.3): (None, CUDA_ERROR_NOT_SUPPORTED,
 * "cuStreamBeginCaptureToGraph"), nothing done. */
static PyObject *py_cuda_slot_graph(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    void *a[2];
    if (nhf_address_args("cuda_slot_graph(graph, words)", args, nargs, 2, a) < 0)
        return NULL;
    nhf_cuStreamBeginCaptureToGraph_fn begin = NHF_CU(cuStreamBeginCaptureToGraph);
    if (begin == NULL)
        return answer(Py_NewRef(Py_None), CUDA_ERROR_NOT_SUPPORTED, "cuStreamBeginCaptureToGraph");
    NHF_CU_OR_ANSWER(cuStreamCreate, Py_NewRef(Py_None));
    NHF_CU_OR_ANSWER(cuStreamEndCapture, Py_NewRef(Py_None));
    NHF_CU_OR_ANSWER(cuStreamDestroy, Py_NewRef(Py_None));
    NHF_CU_OR_ANSWER(cuStreamWriteValue32, Py_NewRef(Py_None));
    NHF_CU_OR_ANSWER(cuStreamWaitValue32, Py_NewRef(Py_None));
    const char *call = "cuStreamCreate";
    int rc;
    Py_BEGIN_ALLOW_THREADS
    void *stream = NULL;
    rc = NHF_CU(cuStreamCreate)(&stream, CU_STREAM_NON_BLOCKING);
    if (rc == 0) {
        call = "cuStreamBeginCaptureToGraph";
        rc = begin(stream, a[0], NULL, NULL, 0, CU_STREAM_CAPTURE_MODE_RELAXED);
        if (rc == 0) {
            rc = slot_nodes(stream, (uintptr_t)a[1], false, &call);
            void *captured = NULL;
            int end = NHF_CU(cuStreamEndCapture)(stream, &captured);
            if (rc == 0 && end != 0) {
                rc = end;
                call = "cuStreamEndCapture";
            }
        }
        (void)NHF_CU(cuStreamDestroy)(stream);
    }
    Py_END_ALLOW_THREADS
    return answer(Py_NewRef(Py_None), rc, call);
}

static PyMethodDef cuda_methods[] = {
    {"cuda_graph_record", (PyCFunction)(void (*)(void))py_cuda_graph_record, METH_FASTCALL,
     "cuda_graph_record($module, graph, fn, arg, owner, /)\n--\n\n"
     "A record for fn(arg) owning owner, owned by graph: (record, CUresult, call)."},
    {"cuda_refusal", py_cuda_refusal, METH_O,
     "cuda_refusal($module, stream, /)\n--\n\n"
     "The status word an enqueue on stream would be refused with, or 0."},
    {"cuda_capture_info", py_cuda_capture_info, METH_O,
     "cuda_capture_info($module, stream, /)\n--\n\n"
     "The stream's capture status and graph: ((status, graph), CUresult, call)."},
    {"cuda_captured_host_node", (PyCFunction)(void (*)(void))py_cuda_captured_host_node,
     METH_FASTCALL,
     "cuda_captured_host_node($module, stream, graph, replay, record, /)\n--\n\n"
     "replay(record) as a host node of graph's capture on stream: (where, CUresult, call)."},
    {"cuda_exchange_capture_mode", py_cuda_exchange_capture_mode, METH_O,
     "cuda_exchange_capture_mode($module, mode, /)\n--\n\n"
     "Set this thread's capture mode: (the mode before, CUresult, call)."},
    {"cuda_pinned_words", py_cuda_pinned_words, METH_O,
     "cuda_pinned_words($module, nbytes, /)\n--\n\n"
     "Zeroed pinned host memory for an executor's words: (address, CUresult, call)."},
    {"cuda_slot_nodes", (PyCFunction)(void (*)(void))py_cuda_slot_nodes, METH_FASTCALL,
     "cuda_slot_nodes($module, stream, graph, words, record, /)\n--\n\n"
     "A graph slot's three operations, captured into graph's capture on stream: "
     "(where, CUresult, call)."},
    {"cuda_slot_graph", (PyCFunction)(void (*)(void))py_cuda_slot_graph, METH_FASTCALL,
     "cuda_slot_graph($module, graph, words, /)\n--\n\n"
     "A graph slot's three operations, added to an empty graph: (None, CUresult, call)."},
    {NULL, NULL, 0, NULL},
};


int nhf_cuda_init(PyObject *module) {
    if (PyModule_AddFunctions(module, cuda_methods) < 0)
        return -1;
    if (PyModule_AddIntConstant(module, "CU_STREAM_CAPTURE_STATUS_ACTIVE",
                                CU_STREAM_CAPTURE_STATUS_ACTIVE) < 0 ||
        PyModule_AddIntConstant(module, "CU_STREAM_CAPTURE_STATUS_INVALIDATED",
                                CU_STREAM_CAPTURE_STATUS_INVALIDATED) < 0 ||
        PyModule_AddIntConstant(module, "CU_STREAM_CAPTURE_MODE_RELAXED",
                                CU_STREAM_CAPTURE_MODE_RELAXED) < 0 ||
        PyModule_AddIntConstant(module, "CAPTURE_ENDED", CAPTURE_ENDED) < 0 ||
        PyModule_AddIntConstant(module, "CAPTURE_NODE", CAPTURE_NODE) < 0 ||
        PyModule_AddIntConstant(module, "CAPTURE_UNSURE", CAPTURE_UNSURE) < 0)
        return -1;
    nhf_enqueue_add_route(NHF_ROUTE_CUDA, nhf_cuda_enqueue, NULL);
    return 0;
}
