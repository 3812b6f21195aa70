/* The HostExecutor's enqueue on a simulated stream: a lane's task, and its two
 * stream memory operations as the simulator's device work (executor.h;
 * simulator.c's word operations).
 */
#include "executor.h"

#include <stdlib.h>

static nhf_sim_word_op *new_word_op(_Atomic uint32_t *word, uint32_t value) {
    nhf_sim_word_op *op = malloc(sizeof(nhf_sim_word_op));
    if (op != NULL)
        *op = (nhf_sim_word_op){word, value};
    return op;
}

/* Any thread: on a simulated stream, the same steps, as simulated device work
 * (nhf_lane_fn); the stream's id is the simulator's serial. */
uint64_t nhf_exec_sim_enqueue(void *lane_, nhf_hostfn trampoline, void *record,
                              PyObject *owner, PyObject **released) {
    lane *l = lane_;
    if (!nhf_lane_lock_for(l, true, nhf_sim_stream_id(l->stream)))
        return NHF_LANE_STALE;
    uint64_t status = 0;
    nhf_sim_word_op *write_op = new_word_op(&l->words[0], l->seq + 1);
    nhf_sim_word_op *wait_op = new_word_op(&l->words[1], l->seq + 1);
    task *t = write_op && wait_op
                  ? nhf_lane_open_task(l, trampoline, record, owner, &status, released)
                  : NULL;
    if (t == NULL) {
        pthread_mutex_unlock(&l->enqueue_mutex);
        free(write_op);
        free(wait_op);
        return status ? status : NHF_OUT_OF_MEMORY;
    }
    status = nhf_sim_enqueue_device(l->stream, nhf_sim_write_once, write_op);
    if (status != 0) {
        nhf_lane_unlink_task(l, t);
        pthread_mutex_unlock(&l->enqueue_mutex);
        free(write_op);
        free(wait_op);
        return status;
    }
    status = nhf_sim_enqueue_device(l->stream, nhf_sim_wait_once, wait_op);
    pthread_mutex_unlock(&l->enqueue_mutex);
    if (status != 0) {
        free(wait_op);
        return status | NHF_KEPT;
    }
    return 0;
}
