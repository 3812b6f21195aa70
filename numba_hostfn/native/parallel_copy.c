/* The HostExecutor's parallel copy: a large copy task (or graph slot) shared out
 * chunk by chunk among the pool's threads (executor.h).
 */
#include "executor.h"

#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#define PARALLEL_COPY_MIN (1u << 20) /* below 1 MiB, one thread copies */

/* A chunk of a shared-out copy, with streaming (non-temporal) stores, which do
 * not read the destination into the cache first.  libc's memcpy streams only
 * above its own size threshold (glibc's x86_non_temporal_threshold: 240 MiB on
 * a 2-core EPYC VM), and a copy shared out in chunks below it wrote through the
 * cache: about 1.5x the memory traffic, so a second thread added almost
 * nothing.  The head up to 64-byte alignment of d and the tail go through
 * memcpy; the fence orders the streaming stores before "finished". */
static void stream_copy(char *d, const char *s, size_t n) {
#if defined(__x86_64__)
    if (n < 4096) {
        memcpy(d, s, n);
        return;
    }
    size_t head = (CACHE_LINE - ((uintptr_t)d & (CACHE_LINE - 1))) & (CACHE_LINE - 1);
    memcpy(d, s, head);
    d += head, s += head, n -= head;
    size_t body = n & ~(size_t)127;
    for (size_t off = 0; off < body; off += 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(s + off));
        _mm_stream_si128((__m128i *)(d + off), v);
    }
    memcpy(d + body, s + body, n - body);
    _mm_sfence();
#else
    memcpy(d, s, n);
#endif
}

/* Copy chunks of j until none is left. */
static void copy_chunks(job *j) {
    for (;;) {
        size_t i = atomic_fetch_add(&j->next, 1);
        if (i >= j->nchunks)
            return;
        size_t offset = i * j->chunk;
        size_t size = j->nbytes - offset < j->chunk ? j->nbytes - offset : j->chunk;
        stream_copy(j->dst + offset, j->src + offset, size);
        atomic_fetch_add(&j->finished, 1);
    }
}

/* A thread joins the pool's current job, if it has chunks left (true if it
 * helped).  A job whose chunks are all taken stays posted until its owner has
 * seen them finished: joining it again would only contend for the mutex that
 * the owner needs to withdraw it. */
bool nhf_copy_help(nhf_pool *pool) {
    if (atomic_load(&pool->job) == NULL)
        return false;
    pthread_mutex_lock(&pool->mutex);
    job *j = atomic_load(&pool->job);
    if (j == NULL || atomic_load(&j->next) >= j->nchunks) {
        pthread_mutex_unlock(&pool->mutex);
        return false;
    }
    atomic_fetch_add(&j->helpers, 1);
    pthread_mutex_unlock(&pool->mutex);
    copy_chunks(j);
    atomic_fetch_sub(&j->helpers, 1);
    return true;
}

/* The copy of a MEMCPY_LAYOUT descriptor {dst, src, nbytes}: a large one is
 * shared out to the pool's threads. */
void nhf_copy_run(nhf_pool *pool, const uint64_t *desc) {
    char *dst = (char *)(uintptr_t)desc[0];
    const char *src = (const char *)(uintptr_t)desc[1];
    size_t nbytes = desc[2];
    if (nbytes < PARALLEL_COPY_MIN || pool->nthreads <= 1) {
        memcpy(dst, src, nbytes);
        return;
    }
    job j = {.dst = dst, .src = src, .nbytes = nbytes};
    size_t per = nbytes / (size_t)(pool->nthreads * 4);
    j.chunk = (per + 4095) & ~(size_t)4095; /* whole pages, at least one */
    j.nchunks = (nbytes + j.chunk - 1) / j.chunk;
    pthread_mutex_lock(&pool->mutex);
    job *none = NULL;
    bool posted = atomic_compare_exchange_strong(&pool->job, &none, &j);
    pthread_mutex_unlock(&pool->mutex);
    if (!posted) { /* another copy is being shared out: this one alone */
        memcpy(dst, src, nbytes);
        return;
    }
    copy_chunks(&j);
    while (atomic_load(&j.finished) != j.nchunks)
        nhf_cpu_relax();
    pthread_mutex_lock(&pool->mutex);
    atomic_store(&pool->job, NULL);
    pthread_mutex_unlock(&pool->mutex);
    while (atomic_load(&j.helpers) != 0)
        nhf_cpu_relax();
}

/* Any thread (a pool's): a copy task's trampoline.  record.arg is the
 * MEMCPY_LAYOUT descriptor, record.context the pool. */
void nhf_exec_copy(void *record_) {
    nhf_record *record = record_;
    if (!nhf_record_start(record))
        return; /* failed by a device fault: released by the drain (invariant 23) */
    nhf_copy_run(record->context, record->arg);
    nhf_record_complete(record);
}
