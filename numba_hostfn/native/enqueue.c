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
 * builtin below and the signals' (notify.c). */
uint64_t nhf_enqueue_record(nhf_enqueue_fn enqueue_fn, void *target, nhf_hostfn trampoline,
                            nhf_hostfn fn, void *arg, void *context, PyObject *owner) {
    nhf_record *record = nhf_record_take(fn, arg, owner);
    if (record == NULL)
        return NHF_NO_RECORD;
    record->context = context;
    uint64_t status;
    Py_BEGIN_ALLOW_THREADS
    status = enqueue_fn(target, trampoline, record);
    Py_END_ALLOW_THREADS
    if (status == 0) {
        if (nhf_drain_wanted())
            (void)nhf_drain();
    } else if (!(status & NHF_KEPT)) {
        nhf_record_release(record); /* refused: nothing will run it (invariant 3) */
    }
    return status;
}
