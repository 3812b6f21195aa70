/* The HostExecutor's enqueue on a CUDA stream: a lane's task, and its two stream
 * memory operations through the driver (executor.h; driver.h's table and layouts).
 */
#include "executor.h"

#include <string.h>

/* Any thread: on a CUDA stream, refuse a capturing stream, and a stream the lane
 * does not serve (NHF_LANE_STALE, nhf_lane_identify), append the task, write
 * "reached", wait for "done" (one cuStreamBatchMemOp, or two calls if the batch is
 * refused).  If the write fails the task is taken back; if the wait fails after
 * the write was enqueued, the task still runs (the stream reaches the write):
 * status NHF_KEPT | CUresult.  owner: a direct task's (NULL for a record's);
 * released: see nhf_lane_fn. */
uint64_t nhf_exec_cuda_enqueue(void *lane_, nhf_hostfn trampoline, void *record,
                               PyObject *owner, PyObject **released) {
    lane *l = lane_;
    uint64_t refusal = nhf_cuda_refusal(l->stream); /* as cuda.c's enqueue refuses */
    if (refusal != 0)
        return refusal;
    unsigned long long id = 0;
    nhf_cuStreamGetId_fn get_id = NHF_CU(cuStreamGetId); /* CUDA 12.0 on */
    bool known = get_id != NULL && get_id(l->stream, &id) == 0;
    if (!nhf_lane_lock_for(l, known, id))
        return NHF_LANE_STALE;
    uint64_t status = 0;
    task *t = nhf_lane_open_task(l, trampoline, record, owner, &status, released);
    if (t == NULL) {
        pthread_mutex_unlock(&l->enqueue_mutex);
        return status;
    }
    uint64_t reached = (uintptr_t)&l->words[0], done = (uintptr_t)&l->words[1];
    int rc;
    /* Both operations in one driver call: cheaper to enqueue (1.1-1.6 us
     * against 1.7-1.9 for the two calls, in two C probes on the H200) and, as
     * the driver's documentation says, to run.  A call the driver refuses
     * enqueues nothing (the rule every step here relies on: a refused write is
     * taken back); the two single calls then follow. */
    nhf_cuStreamBatchMemOp_fn batch = NHF_CU(cuStreamBatchMemOp);
    if (batch != NULL) {
        nhf_cu_batch_mem_op_params ops[2];
        memset(ops, 0, sizeof ops);
        ops[0].value_op.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
        ops[0].value_op.address = reached;
        ops[0].value_op.value = t->seq;
        ops[0].value_op.flags = CU_STREAM_WRITE_VALUE_DEFAULT;
        ops[1].value_op.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
        ops[1].value_op.address = done;
        ops[1].value_op.value = t->seq;
        ops[1].value_op.flags = CU_STREAM_WAIT_VALUE_GEQ;
        rc = batch(l->stream, 2, ops, 0);
        if (rc == 0) {
            pthread_mutex_unlock(&l->enqueue_mutex);
            return 0;
        }
        if (rc == CUDA_ERROR_NOT_SUPPORTED) /* a driver without the batch: says so once */
            atomic_store(&nhf_driver.cuStreamBatchMemOp, NULL);
    }
    rc = NHF_CU(cuStreamWriteValue32)(l->stream, reached, t->seq, CU_STREAM_WRITE_VALUE_DEFAULT);
    if (rc != 0) {
        nhf_lane_unlink_task(l, t);
        pthread_mutex_unlock(&l->enqueue_mutex);
        return (uint32_t)rc;
    }
    rc = NHF_CU(cuStreamWaitValue32)(l->stream, done, t->seq, CU_STREAM_WAIT_VALUE_GEQ);
    pthread_mutex_unlock(&l->enqueue_mutex);
    return rc == 0 ? 0 : NHF_KEPT | (uint32_t)rc;
}
