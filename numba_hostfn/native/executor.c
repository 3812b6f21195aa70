/* The HostExecutor: stream-ordered host work on a pool of native threads,
 * through stream memory operations instead of the driver's host-function thread.
 *
 * Each stream served by a pool has a *lane*: two 32-bit words in pinned,
 * device-mapped host memory, "reached" and "done", and a FIFO of *tasks*
 * numbered 1, 2, 3, ...  Enqueueing task k puts on the stream a write of k to
 * "reached", then a wait until "done" >= k (a cyclic comparison: wrap-around is
 * harmless).  A pool thread that sees reached != done claims the lane's first
 * task, runs trampoline(record) and writes k to "done"; the stream goes on.
 * Tasks of different lanes run on different threads at once; a lane's tasks
 * run one after another, as the stream orders them.
 *
 * Waiting: a thread spins while tasks are outstanding (enqueued, not done) for
 * up to spin_ns since its last task, then polls every poll_ns; with nothing
 * outstanding it parks on a condition variable, and an enqueue wakes it.
 *
 * The invariant above all (LIFETIME.md, invariant 15): every "reached" gets its
 * "done".  A task's trampoline always returns (a Python callable is skipped
 * once the interpreter guard is closed, an exception is reported), and the
 * pool's threads end only when nothing is outstanding.  close() is
 * linearizable with launches: an enqueue checks that the pool is open under
 * its lane's enqueue mutex, and close() passes every lane's enqueue mutex after
 * it stopped the pool, so an enqueue either was counted before close() waits
 * for the outstanding tasks, or is refused (NHF_EXECUTOR_CLOSED).
 */
#include "nhf.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#define PARALLEL_COPY_MIN (1u << 20) /* below 1 MiB, one thread copies */
#define CACHE_LINE 64

/* The driver's constants (cuda.h), and CUstreamBatchMemOpParams as cuda.h
 * declares its writeValue and waitValue members: a 48-byte union. */
enum {
    CU_STREAM_WAIT_VALUE_GEQ = 0x0,
    CU_STREAM_WRITE_VALUE_DEFAULT = 0x0,
    CU_STREAM_MEM_OP_WAIT_VALUE_32 = 1,
    CU_STREAM_MEM_OP_WRITE_VALUE_32 = 2,
    CUDA_ERROR_NOT_SUPPORTED = 801,
};
typedef union {
    unsigned operation;
    struct {
        unsigned operation;
        uint64_t address; /* CUdeviceptr */
        union {
            uint32_t value;
            uint64_t value64;
        };
        unsigned flags;
        uint64_t alias; /* unused */
    } value_op;       /* waitValue and writeValue have this layout */
    uint64_t pad[6];
} cu_batch_mem_op;
_Static_assert(sizeof(cu_batch_mem_op) == 48, "CUstreamBatchMemOpParams is 48 bytes");

typedef struct task {
    struct task *next;
    uint32_t seq; /* the number written to "reached" for it */
    nhf_hostfn trampoline;
    void *record;
} task;

typedef struct lane {
    /* Read by spinning threads: on a cache line of their own. */
    struct lane *next;   /* the next lane of the pool (appended under its mutex) */
    void *stream;        /* the handle the stream operations go to */
    _Atomic uint32_t *words; /* reached, then done */
    nhf_pool *pool;
    /* Written by the producer at each enqueue. */
    _Alignas(CACHE_LINE) pthread_mutex_t fifo_mutex; /* guards head, tail */
    task *head, *tail;
    atomic_int claimed;      /* a thread runs the head task (set by compare-and-swap) */
    uint32_t seq;            /* the last number given (under enqueue_mutex) */
    pthread_mutex_t enqueue_mutex; /* one producer at a time per lane */
    /* Set once by the watchdog: the stream has a device fault, and will never
     * reach the tasks it has not reached (invariant 23). */
    atomic_uint fault;
} lane;

/* A simulated stream memory operation: its word and value. */
typedef struct {
    _Atomic uint32_t *word;
    uint32_t value;
} word_op;

/* A graph slot: the words of one executor node in a CUDA graph (invariant 16).
 * The graph holds three stream memory operations on them, replayed as they
 * are: write reached := 1, wait until done >= 1, write done := 0.  A pool
 * thread that sees reached == 1 swaps it back to 0, runs fn(arg) and writes
 * done := 1.  Armed while the graph lives; a disarmed slot is reused. */
typedef struct slot {
    struct slot *next; /* the next slot of the pool */
    struct slot *next_free; /* the next disarmed slot to reuse (under the pool's mutex) */
    _Atomic uint32_t *words;
    nhf_hostfn fn;
    void *arg;
    atomic_int live; /* armed */
    int copy;        /* run the pool's parallel copy of arg, not fn(arg) */
    nhf_pool *pool;
    word_op ops[3];  /* the simulator's node arguments, in graph order */
} slot;

/* A large copy shared among the pool's threads, chunk by chunk. */
typedef struct {
    char *dst;
    const char *src;
    size_t nbytes, chunk, nchunks;
    atomic_size_t next;     /* the next chunk to take */
    atomic_size_t finished; /* chunks copied */
    atomic_long helpers;    /* threads other than the owner inside the job */
} job;

struct nhf_pool {
    struct nhf_pool *next_pool; /* every pool, for a device fault (never removed) */
    /* Read by spinning threads at every turn. */
    _Atomic(lane *) lanes;
    _Atomic(slot *) slots;  /* appended under mutex, never removed */
    slot *free_slots;       /* disarmed slots that no GraphSlot holds (under mutex) */
    _Atomic(job *) job;     /* the parallel copy being shared out, or NULL */
    long spin_ns, poll_ns;
    pthread_t *threads;
    long nthreads;
    /* Written by the producer at each enqueue. */
    _Alignas(CACHE_LINE) atomic_long outstanding; /* tasks enqueued and not done */
    atomic_int stopping;
    /* Set by close after every enqueue that saw the pool open has counted its
     * task: a thread quits only with quit set and nothing outstanding. */
    atomic_int quit;
    atomic_int parked;      /* threads waiting on wake */
    atomic_long live_slots; /* slots armed (their graphs are alive) */
    atomic_int poller;      /* a thread polls the slots for a replay (the others park) */
    pthread_mutex_t mutex;  /* guards lanes (append), slots (append), parking, job */
    pthread_cond_t wake;    /* parked threads */
    pthread_mutex_t close_mutex; /* one close() at a time */
    int closed;             /* close() finished (under close_mutex) */
    pid_t pid;              /* the process whose threads these are (not a forked child) */
};

/* ---- time --------------------------------------------------------------------- */

static long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

static void sleep_ns(long ns) {
    struct timespec ts = {ns / 1000000000L, ns % 1000000000L};
    nanosleep(&ts, NULL);
}

/* ---- the pool's threads -------------------------------------------------------- */

/* Wake parked threads (after outstanding was raised, or a slot armed). */
static void wake(nhf_pool *pool) {
    if (atomic_load(&pool->parked) == 0)
        return;
    pthread_mutex_lock(&pool->mutex);
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mutex);
}

static uint32_t reached_word(const lane *l) { return atomic_load(&l->words[0]); }

/* The first task of a lane whose stream has reached it (or that a device fault
 * failed), claimed; NULL if none.  A task on a faulted lane that the stream has
 * not reached is claimed only with the lane's enqueue mutex (*failing set): its
 * producer may still be inside its enqueue, holding that mutex, and take the task
 * back itself (unlink_task) if the driver refuses the write; trylock, as this
 * thread holds fifo_mutex, which producers take after enqueue_mutex. */
static task *claim(nhf_pool *pool, lane **lane_out, bool *failing) {
    for (lane *l = atomic_load(&pool->lanes); l != NULL; l = l->next) {
        /* Without a lock: reached == done means nothing is waiting here. */
        uint32_t reached = reached_word(l);
        bool faulted = atomic_load_explicit(&l->fault, memory_order_relaxed) != 0;
        if (reached == atomic_load(&l->words[1]) && !faulted)
            continue;
        /* One thread claims a lane, the others move on: a compare-and-swap of
         * the claimed flag, so that spinning threads do not all rush the lane's
         * lock (or the producer appending under it) when the stream reaches it. */
        if (atomic_load_explicit(&l->claimed, memory_order_relaxed))
            continue;
        int expected = 0;
        if (!atomic_compare_exchange_strong_explicit(&l->claimed, &expected, 1,
                                                     memory_order_acquire, memory_order_relaxed))
            continue;
        pthread_mutex_lock(&l->fifo_mutex);
        task *head = l->head;
        bool reached_it = head != NULL && (int32_t)(reached - head->seq) >= 0;
        *failing = head != NULL && !reached_it && faulted &&
                   pthread_mutex_trylock(&l->enqueue_mutex) == 0;
        if (reached_it || *failing) {
            pthread_mutex_unlock(&l->fifo_mutex);
            *lane_out = l;
            return head;
        }
        atomic_store_explicit(&l->claimed, 0, memory_order_release);
        pthread_mutex_unlock(&l->fifo_mutex);
    }
    return NULL;
}

/* Run a claimed task, write its "done", and retire it.  A task claimed failing
 * (the stream has not reached it on a faulted lane, claim holds the lane's
 * enqueue mutex) never runs: its record is failed (the watchdog may have failed
 * it first), and the drain releases it. */
static void run(nhf_pool *pool, lane *l, task *t, bool failing) {
    if (failing) {
        nhf_record *record = t->record;
        (void)nhf_fault_fail_record(record, atomic_load(&l->fault), atomic_load(&record->state));
    } else {
        t->trampoline(t->record);
    }
    atomic_thread_fence(memory_order_seq_cst); /* the task's writes before "done" */
    atomic_store(&l->words[1], t->seq);
    pthread_mutex_lock(&l->fifo_mutex);
    l->head = t->next;
    if (l->head == NULL)
        l->tail = NULL;
    atomic_store_explicit(&l->claimed, 0, memory_order_release);
    pthread_mutex_unlock(&l->fifo_mutex);
    if (failing)
        pthread_mutex_unlock(&l->enqueue_mutex);
    free(t);
    atomic_fetch_sub(&pool->outstanding, 1);
}

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
static bool help(nhf_pool *pool) {
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
static void copy_run(nhf_pool *pool, const uint64_t *desc) {
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
    copy_run(record->context, record->arg);
    nhf_record_complete(record);
}

/* A graph slot whose replay has reached it (reached swapped back to 0); NULL if none. */
static slot *claim_slot(nhf_pool *pool) {
    for (slot *s = atomic_load(&pool->slots); s != NULL; s = s->next) {
        if (!atomic_load_explicit(&s->live, memory_order_acquire))
            continue;
        uint32_t one = 1;
        if (atomic_load(&s->words[0]) == 1 && atomic_compare_exchange_strong(&s->words[0], &one, 0))
            return s;
    }
    return NULL;
}

/* Run a claimed slot's work, then write its "done" (the graph's wait goes on). */
static void run_slot(nhf_pool *pool, slot *s) {
    if (s->copy)
        copy_run(pool, s->arg);
    else
        s->fn(s->arg);
    atomic_thread_fence(memory_order_seq_cst); /* the work's writes before "done" */
    atomic_store(&s->words[1], 1);
}

/* If this thread is the poller, give the role up and wake the parked threads
 * (one of them becomes the poller; all of them spin for a while first). */
static void hand_on(nhf_pool *pool, int *me_poller) {
    if (!*me_poller)
        return;
    *me_poller = 0;
    atomic_store(&pool->poller, 0);
    pthread_mutex_lock(&pool->mutex);
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mutex);
}

/* Wait on the pool's condition variable while there is nothing to do: no task
 * outstanding, and no armed slot without a poller (when stopping: no slot armed). */
static void park(nhf_pool *pool) {
    pthread_mutex_lock(&pool->mutex);
    atomic_fetch_add(&pool->parked, 1);
    for (;;) {
        bool work = atomic_load(&pool->outstanding) > 0;
        bool armed = atomic_load(&pool->live_slots) > 0;
        bool need_poller = armed && atomic_load(&pool->poller) == 0;
        bool may_quit = atomic_load(&pool->quit) && !armed;
        if (work || need_poller || may_quit)
            break;
        pthread_cond_wait(&pool->wake, &pool->mutex);
    }
    atomic_fetch_sub(&pool->parked, 1);
    pthread_mutex_unlock(&pool->mutex);
}

/* A pool thread: claim and run reached tasks and slots; spin, poll or park in
 * between.  It spins for spin_ns after its last work (or wake-up); then, with
 * tasks outstanding, it polls every poll_ns.  With none outstanding but graph
 * slots armed, a replay may reach a slot at any time and no enqueue announces
 * it: one thread, the poller, polls every poll_ns (spinning first for spin_ns
 * after work) and the others park; when the poller finds work it hands the
 * role on and wakes the others, which spin for a while, so the rest of the
 * replay finds them awake.  With neither, every thread parks until an enqueue
 * or an armed slot wakes it. */
static void *thread_main(void *pool_) {
    nhf_pool *pool = pool_;
    int me_poller = 0;
    /* Sleep as long as asked, not the default 50 us longer. */
    (void)prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
    long last_work = now_ns();
    for (;;) {
        if (help(pool)) {
            last_work = now_ns();
            continue;
        }
        lane *l;
        bool failing;
        task *t = claim(pool, &l, &failing);
        if (t != NULL) {
            hand_on(pool, &me_poller);
            run(pool, l, t, failing);
            last_work = now_ns();
            continue;
        }
        slot *s = claim_slot(pool);
        if (s != NULL) {
            hand_on(pool, &me_poller);
            run_slot(pool, s);
            last_work = now_ns();
            continue;
        }
        /* Spinning reads nothing that the producer writes (not even the count
         * of outstanding tasks): only the words and the lanes' read-mostly fields. */
        if (now_ns() - last_work < pool->spin_ns) {
            nhf_cpu_relax();
            continue;
        }
        if (atomic_load(&pool->outstanding) > 0) {
            sleep_ns(pool->poll_ns);
            continue;
        }
        if (atomic_load(&pool->live_slots) > 0) {
            int expected = 0;
            if (me_poller || atomic_compare_exchange_strong(&pool->poller, &expected, 1)) {
                me_poller = 1;
                sleep_ns(pool->poll_ns);
                continue;
            }
            park(pool);
            last_work = now_ns();
            continue;
        }
        hand_on(pool, &me_poller);
        /* quit before outstanding: every task counted before close set quit is
         * seen here.  Stopping alone is not enough: an enqueue that saw the pool
         * open may not have counted its task yet. */
        if (atomic_load(&pool->quit) && atomic_load(&pool->outstanding) == 0 &&
            atomic_load(&pool->live_slots) == 0)
            break;
        park(pool);
        last_work = now_ns();
    }
    nhf_gil_forget(); /* invariant 12's exception: threads that end give theirs back */
    return NULL;
}

/* ---- enqueue functions: (lane, trampoline, record), without the GIL ------------ */

/* Append a task numbered seq, before its "reached" write goes on the stream:
 * a thread that sees the write then finds the task in place.  The caller holds
 * the lane's enqueue mutex.  NULL if there was no memory for it. */
static task *append(lane *l, uint32_t seq, nhf_hostfn trampoline, void *record) {
    task *t = malloc(sizeof(task));
    if (t == NULL)
        return NULL;
    *t = (task){NULL, seq, trampoline, record};
    l->seq = seq;
    pthread_mutex_lock(&l->fifo_mutex);
    if (l->tail == NULL)
        l->head = t;
    else
        l->tail->next = t;
    l->tail = t;
    pthread_mutex_unlock(&l->fifo_mutex);
    atomic_fetch_add(&l->pool->outstanding, 1);
    wake(l->pool);
    return t;
}

/* Take back the task just appended, whose "reached" write could not be
 * enqueued (the caller holds the enqueue mutex, so it is the lane's last task;
 * no thread claims it, since the stream never reaches it). */
static void unlink_task(lane *l, task *t) {
    pthread_mutex_lock(&l->fifo_mutex);
    if (l->head == t) {
        l->head = l->tail = NULL;
    } else {
        task *before = l->head;
        while (before->next != t)
            before = before->next;
        before->next = NULL;
        l->tail = before;
    }
    pthread_mutex_unlock(&l->fifo_mutex);
    l->seq = t->seq - 1;
    free(t);
    atomic_fetch_sub(&l->pool->outstanding, 1);
}

/* Tests only: a pause between open_task's check and the count of its task, the
 * window a preempted launching thread leaves to a racing close (exec_test_pause). */
static atomic_long test_pause_ns;

/* Under the lane's enqueue mutex: the task for trampoline(record), numbered
 * next; NULL with *status set if the pool is closed or no memory is left. */
static task *open_task(lane *l, nhf_hostfn trampoline, void *record, uint64_t *status) {
    if (atomic_load(&l->pool->stopping)) {
        *status = NHF_EXECUTOR_CLOSED;
        return NULL;
    }
    unsigned fault = atomic_load(&l->fault);
    if (fault != 0) {
        *status = NHF_FAULTED | fault;
        return NULL;
    }
    long pause = atomic_load_explicit(&test_pause_ns, memory_order_relaxed);
    if (pause > 0)
        sleep_ns(pause);
    task *t = append(l, l->seq + 1, trampoline, record);
    if (t == NULL)
        *status = NHF_OUT_OF_MEMORY;
    return t;
}

/* Any thread: on a CUDA stream, refuse a capturing stream, append the task,
 * write "reached", wait for "done" (one cuStreamBatchMemOp, or two calls if the
 * batch is refused).  If the write fails the task is taken back; if the wait
 * fails after the write was enqueued, the task still runs (the stream reaches
 * the write): status NHF_KEPT | CUresult. */
uint64_t nhf_exec_cuda_enqueue(void *lane_, nhf_hostfn trampoline, void *record) {
    lane *l = lane_;
    uint64_t fault = nhf_fault_of_stream(l->stream); /* a faulted context: refused at once */
    if (fault != 0)
        return fault;
    int capture = 0;
    int rc = atomic_load(&nhf_cuda.is_capturing)(l->stream, &capture);
    if (rc != 0)
        return NHF_CAPTURE_CHECK_FAILED | (uint32_t)rc;
    if (capture != 0)
        return NHF_CAPTURING;
    uint64_t status = 0;
    pthread_mutex_lock(&l->enqueue_mutex);
    task *t = open_task(l, trampoline, record, &status);
    if (t == NULL) {
        pthread_mutex_unlock(&l->enqueue_mutex);
        return status;
    }
    uint64_t reached = (uintptr_t)&l->words[0], done = (uintptr_t)&l->words[1];
    /* Both operations in one driver call: cheaper to enqueue (1.1-1.6 us
     * against 1.7-1.9 for the two calls, in two C probes on the H200) and, as
     * the driver's documentation says, to run.  A call the driver refuses
     * enqueues nothing (the rule every step here relies on: a refused write is
     * taken back); the two single calls then follow. */
    nhf_cu_batch_mem_op batch = atomic_load(&nhf_cuda.batch_mem_op);
    if (batch != NULL) {
        cu_batch_mem_op ops[2];
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
            atomic_store(&nhf_cuda.batch_mem_op, NULL);
    }
    rc = atomic_load(&nhf_cuda.write_value32)(l->stream, reached, t->seq,
                                              CU_STREAM_WRITE_VALUE_DEFAULT);
    if (rc != 0) {
        unlink_task(l, t);
        pthread_mutex_unlock(&l->enqueue_mutex);
        return (uint32_t)rc;
    }
    rc = atomic_load(&nhf_cuda.wait_value32)(l->stream, done, t->seq, CU_STREAM_WAIT_VALUE_GEQ);
    pthread_mutex_unlock(&l->enqueue_mutex);
    return rc == 0 ? 0 : NHF_KEPT | (uint32_t)rc;
}

/* Any thread (a simulated stream's): write op.word := op.value (a graph node's
 * argument: kept for the next replay). */
static void sim_set(void *op_) {
    word_op *op = op_;
    atomic_store(op->word, op->value);
}

/* Any thread (a simulated stream's): wait until op.word >= op.value (cyclic),
 * polling; a fault of the stream's context ends the wait, as on a GPU. */
static void sim_await(void *op_) {
    word_op *op = op_;
    while ((int32_t)(atomic_load(op->word) - op->value) < 0 && !nhf_sim_faulted_here())
        usleep(20);
}

static void sim_write_once(void *op) {
    sim_set(op);
    free(op);
}

static void sim_wait_once(void *op) {
    sim_await(op);
    free(op);
}

bool nhf_exec_sim_drop(nhf_hostfn fn, void *arg) {
    if (fn != sim_write_once && fn != sim_wait_once)
        return false;
    free(arg);
    return true;
}

static word_op *new_word_op(_Atomic uint32_t *word, uint32_t value) {
    word_op *op = malloc(sizeof(word_op));
    if (op != NULL)
        *op = (word_op){word, value};
    return op;
}

/* Any thread: on a simulated stream, the same steps, as simulated device work. */
uint64_t nhf_exec_sim_enqueue(void *lane_, nhf_hostfn trampoline, void *record) {
    lane *l = lane_;
    uint64_t status = 0;
    pthread_mutex_lock(&l->enqueue_mutex);
    word_op *write_op = new_word_op(&l->words[0], l->seq + 1);
    word_op *wait_op = new_word_op(&l->words[1], l->seq + 1);
    task *t = write_op && wait_op ? open_task(l, trampoline, record, &status) : NULL;
    if (t == NULL) {
        pthread_mutex_unlock(&l->enqueue_mutex);
        free(write_op);
        free(wait_op);
        return status ? status : NHF_OUT_OF_MEMORY;
    }
    status = nhf_sim_enqueue_device(l->stream, sim_write_once, write_op);
    if (status != 0) {
        unlink_task(l, t);
        pthread_mutex_unlock(&l->enqueue_mutex);
        free(write_op);
        free(wait_op);
        return status;
    }
    status = nhf_sim_enqueue_device(l->stream, sim_wait_once, wait_op);
    pthread_mutex_unlock(&l->enqueue_mutex);
    if (status != 0) {
        free(wait_op);
        return status | NHF_KEPT;
    }
    return 0;
}

/* ---- the pool's life ------------------------------------------------------------- */

static void *aligned_zeroed(size_t size) {
    size = (size + CACHE_LINE - 1) & ~(size_t)(CACHE_LINE - 1);
    void *memory = aligned_alloc(CACHE_LINE, size);
    if (memory != NULL)
        memset(memory, 0, size);
    return memory;
}

/* Without the GIL: finish the outstanding tasks (the threads keep running
 * them), then stop the threads: joined if no graph slot is armed, else
 * detached, to quit on their own once the last graph holding a slot is gone
 * (its replays still need them).  Idempotent, and one close at a time.  The
 * pool's memory, lanes and slots are kept: a stream may still have to execute
 * a wait on their words.  0 once closed.  With no_wait (a close from a host
 * function), it returns the count of tasks outstanding instead of waiting for
 * them, if any are once the pool is stopped (a launch raced the caller's
 * check): the threads run them and quit, and a later close joins them. */
static long pool_close(nhf_pool *pool, bool no_wait) {
    pthread_mutex_lock(&pool->close_mutex);
    if (pool->closed) {
        pthread_mutex_unlock(&pool->close_mutex);
        return 0;
    }
    pthread_mutex_lock(&pool->mutex);
    atomic_store(&pool->stopping, 1);
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mutex);
    /* Linearize with enqueues: one that holds a lane's enqueue mutex now saw the
     * pool open and counts its task before releasing it; later ones see it
     * stopping.  Slots: arming checks stopping under the pool's mutex. */
    for (lane *l = atomic_load(&pool->lanes); l != NULL; l = l->next) {
        pthread_mutex_lock(&l->enqueue_mutex);
        pthread_mutex_unlock(&l->enqueue_mutex);
    }
    pthread_mutex_lock(&pool->mutex);
    atomic_store(&pool->quit, 1);
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mutex);
    long outstanding = atomic_load(&pool->outstanding);
    if (no_wait && outstanding > 0) {
        pthread_mutex_unlock(&pool->close_mutex);
        return outstanding;
    }
    while (atomic_load(&pool->outstanding) > 0)
        sleep_ns(20000);
    pthread_mutex_lock(&pool->mutex);
    bool armed = atomic_load(&pool->live_slots) > 0;
    pthread_mutex_unlock(&pool->mutex);
    for (long i = 0; i < pool->nthreads; i++) {
        if (armed)
            pthread_detach(pool->threads[i]);
        else
            pthread_join(pool->threads[i], NULL);
    }
    pool->closed = 1;
    pthread_mutex_unlock(&pool->close_mutex);
    return 0;
}

/* Every pool ever started (a pool is never freed). */
static _Atomic(nhf_pool *) all_pools;
static pthread_mutex_t all_pools_lock = PTHREAD_MUTEX_INITIALIZER;

void *nhf_exec_lane_stream(void *lane_) { return ((lane *)lane_)->stream; }

void nhf_exec_fault_stream(void *stream, unsigned code) {
    for (nhf_pool *pool = atomic_load(&all_pools); pool != NULL; pool = pool->next_pool) {
        bool marked = false;
        for (lane *l = atomic_load(&pool->lanes); l != NULL; l = l->next) {
            unsigned expected = 0;
            if (l->stream == stream && atomic_compare_exchange_strong(&l->fault, &expected, code))
                marked = true;
        }
        if (marked)
            wake(pool); /* its threads answer the lane's tasks */
    }
}

/* A pool of nthreads threads, started; NULL if that failed.  Never freed. */
static nhf_pool *pool_new(long nthreads, long spin_ns, long poll_ns) {
    nhf_pool *pool = aligned_zeroed(sizeof(nhf_pool));
    pthread_t *threads = calloc((size_t)nthreads, sizeof(pthread_t));
    if (pool == NULL || threads == NULL || pthread_mutex_init(&pool->mutex, NULL) ||
        pthread_cond_init(&pool->wake, NULL) || pthread_mutex_init(&pool->close_mutex, NULL)) {
        free(pool);
        free(threads);
        return NULL;
    }
    pool->spin_ns = spin_ns;
    pool->poll_ns = poll_ns;
    pool->threads = threads;
    pool->pid = getpid();
    for (long i = 0; i < nthreads; i++) {
        if (pthread_create(&threads[i], NULL, thread_main, pool) != 0) {
            pool->nthreads = i; /* close the threads that started */
            (void)pool_close(pool, false);
            return NULL;
        }
        pool->nthreads = i + 1;
    }
    pthread_mutex_lock(&all_pools_lock);
    pool->next_pool = atomic_load(&all_pools);
    atomic_store(&all_pools, pool);
    pthread_mutex_unlock(&all_pools_lock);
    return pool;
}

/* GIL held: the lane of the pool for stream, or NULL if it has none yet. */
void *nhf_exec_find_lane(nhf_pool *pool, void *stream) {
    for (lane *l = atomic_load(&pool->lanes); l != NULL; l = l->next)
        if (l->stream == stream)
            return l;
    return NULL;
}

/* ---- the executor's base type, for Python ---------------------------------------- */

static nhf_pool *started(nhf_executor_object *self) {
    if (self->pool == NULL)
        PyErr_SetString(PyExc_RuntimeError, "the HostExecutor was not started");
    return self->pool;
}

/* _start(threads, spin_ns, poll_ns): start the pool's threads. */
static PyObject *executor_start(PyObject *self_, PyObject *const *args, Py_ssize_t nargs) {
    nhf_executor_object *self = (nhf_executor_object *)self_;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "_start(threads, spin_ns, poll_ns)");
        return NULL;
    }
    long values[3];
    for (int i = 0; i < 3; i++) {
        values[i] = PyLong_AsLong(args[i]);
        if (values[i] == -1 && PyErr_Occurred())
            return NULL;
    }
    long threads = values[0], spin_ns = values[1], poll_ns = values[2];
    if (self->pool != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the HostExecutor is started already");
        return NULL;
    }
    /* With the GIL, so two _start calls cannot both see no pool: starting threads
     * needs no Python, and the threads take the GIL only to run a task. */
    nhf_pool *pool = pool_new(threads, spin_ns, poll_ns);
    if (pool == NULL) {
        PyErr_Format(PyExc_RuntimeError,
                     "HostExecutor could not start %ld threads (memory or thread limit)", threads);
        return NULL;
    }
    self->pool = pool;
    Py_RETURN_NONE;
}

/* The refusal of a close() from a host function with tasks outstanding. */
static PyObject *refuse_close_from_host_function(long outstanding, const char *then) {
    PyErr_Format(PyExc_RuntimeError,
                 "HostExecutor.close() was called from a host function while %ld of its tasks "
                 "%s outstanding: close() would wait for them, and a task queued behind this "
                 "host function waits for it, so close() would be waiting for itself; close "
                 "the executor from another thread once the streams have passed this host "
                 "function (after stream.sync())%s",
                 outstanding, outstanding == 1 ? "is" : "are", then);
    return NULL;
}

/* _close(): finish what is enqueued, then stop the threads (GIL released).
 * Refused from one of the pool's own tasks, and from any host function (a
 * driver's, the simulator's, another executor's task) while tasks are
 * outstanding: a host function must not wait for stream work. */
static PyObject *executor_close(PyObject *self_, PyObject *unused) {
    (void)unused;
    nhf_pool *pool = ((nhf_executor_object *)self_)->pool;
    if (pool != NULL) {
        for (long i = 0; i < pool->nthreads; i++) {
            if (pthread_equal(pthread_self(), pool->threads[i])) {
                PyErr_SetString(PyExc_RuntimeError,
                                "HostExecutor.close() was called from one of its own tasks, "
                                "which close() would wait for; close it from another thread");
                return NULL;
            }
        }
        int from_host_function = nhf_in_host_function();
        long outstanding = atomic_load(&pool->outstanding);
        if (from_host_function && outstanding > 0)
            return refuse_close_from_host_function(outstanding, ""); /* the pool goes on */
        Py_BEGIN_ALLOW_THREADS
        outstanding = pool_close(pool, from_host_function);
        Py_END_ALLOW_THREADS
        if (outstanding > 0) /* a launch raced the check above: stopped, not waited for */
            return refuse_close_from_host_function(
                outstanding,
                "; a launch raced this close(), which has stopped the executor (it refuses "
                "new launches, and its threads end once the outstanding tasks ran): call "
                "close() again from another thread to wait for them");
    }
    Py_RETURN_NONE;
}

static PyObject *executor_outstanding(PyObject *self_, PyObject *unused) {
    (void)unused;
    nhf_pool *pool = started((nhf_executor_object *)self_);
    return pool == NULL ? NULL : PyLong_FromLong(atomic_load(&pool->outstanding));
}

static PyObject *executor_live_slots(PyObject *self_, PyObject *unused) {
    (void)unused;
    nhf_pool *pool = started((nhf_executor_object *)self_);
    return pool == NULL ? NULL : PyLong_FromLong(atomic_load(&pool->live_slots));
}

/* _lane_new(stream, words): a lane for stream, its words at words (two zeroed
 * 32-bit words of pinned memory); its address. */
static PyObject *executor_lane_new(PyObject *self_, PyObject *const *args, Py_ssize_t nargs) {
    nhf_pool *pool = started((nhf_executor_object *)self_);
    void *stream, *words;
    if (pool == NULL)
        return NULL;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "_lane_new(stream, words)");
        return NULL;
    }
    if (nhf_address_arg(args[0], &stream) < 0 || nhf_address_arg(args[1], &words) < 0)
        return NULL;
    lane *l = aligned_zeroed(sizeof(lane));
    if (l == NULL || pthread_mutex_init(&l->fifo_mutex, NULL) ||
        pthread_mutex_init(&l->enqueue_mutex, NULL)) {
        free(l);
        return PyErr_NoMemory();
    }
    l->stream = stream;
    l->words = words;
    l->pool = pool;
    pthread_mutex_lock(&pool->mutex);
    l->next = atomic_load(&pool->lanes);
    atomic_store(&pool->lanes, l);
    pthread_mutex_unlock(&pool->mutex);
    return PyLong_FromVoidPtr(l);
}

static PyObject *graph_slot_wrap(PyObject *executor, slot *s);

/* _slot_new(words): a disarmed GraphSlot on words (two 32-bit words); the
 * native slot is never freed. */
static PyObject *executor_slot_new(PyObject *self_, PyObject *words_) {
    nhf_pool *pool = started((nhf_executor_object *)self_);
    void *words;
    if (pool == NULL || nhf_address_arg(words_, &words) < 0)
        return NULL;
    slot *s = calloc(1, sizeof(slot));
    if (s == NULL)
        return PyErr_NoMemory();
    s->words = words;
    s->pool = pool;
    s->ops[0] = (word_op){&s->words[0], 1};
    s->ops[1] = (word_op){&s->words[1], 1};
    s->ops[2] = (word_op){&s->words[1], 0};
    pthread_mutex_lock(&pool->mutex);
    s->next = atomic_load(&pool->slots);
    atomic_store(&pool->slots, s);
    pthread_mutex_unlock(&pool->mutex);
    return graph_slot_wrap(self_, s);
}

/* _slot_take(): a disarmed GraphSlot whose words served an earlier node, or
 * None if no slot of the pool is free. */
static PyObject *executor_slot_take(PyObject *self_, PyObject *unused) {
    (void)unused;
    nhf_pool *pool = started((nhf_executor_object *)self_);
    if (pool == NULL)
        return NULL;
    pthread_mutex_lock(&pool->mutex);
    slot *s = pool->free_slots;
    if (s != NULL)
        pool->free_slots = s->next_free;
    pthread_mutex_unlock(&pool->mutex);
    if (s == NULL)
        Py_RETURN_NONE;
    return graph_slot_wrap(self_, s);
}

static PyObject *executor_pool(PyObject *self_, void *closure) {
    (void)closure;
    return PyLong_FromVoidPtr(((nhf_executor_object *)self_)->pool);
}

static void executor_dealloc(PyObject *self) {
    /* The pool is never freed: a stream may still wait on its words.  A pool
     * still running (close() not called) finishes its tasks and parks. */
    Py_TYPE(self)->tp_free(self);
}

static PyMethodDef executor_methods[] = {
    {"_start", (PyCFunction)(void (*)(void))executor_start, METH_FASTCALL,
     "_start($self, threads, spin_ns, poll_ns, /)\n--\n\n"
     "Start the pool."},
    {"_close", executor_close, METH_NOARGS,
     "_close($self, /)\n--\n\n"
     "Finish what is enqueued, then stop the threads (GIL released); idempotent."},
    {"_outstanding", executor_outstanding, METH_NOARGS,
     "_outstanding($self, /)\n--\n\n"
     "Tasks enqueued and not yet run."},
    {"_live_slots", executor_live_slots, METH_NOARGS,
     "_live_slots($self, /)\n--\n\n"
     "Graph slots armed."},
    {"_lane_new", (PyCFunction)(void (*)(void))executor_lane_new, METH_FASTCALL,
     "_lane_new($self, stream, words, /)\n--\n\n"
     "Returns lane address"},
    {"_slot_new", executor_slot_new, METH_O,
     "_slot_new($self, words, /)\n--\n\n"
     "Returns a new, disarmed GraphSlot"},
    {"_slot_take", executor_slot_take, METH_NOARGS,
     "_slot_take($self, /)\n--\n\n"
     "Returns a disarmed GraphSlot to reuse, or None"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef executor_getset[] = {
    {"_pool", executor_pool, NULL, "The native pool's address (0 before _start).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject nhf_executor_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "numba_hostfn._core.ExecutorBase",
    .tp_doc = "The native pool of a HostExecutor (its Python class subclasses this).",
    .tp_basicsize = sizeof(nhf_executor_object),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_new = PyType_GenericNew,
    .tp_dealloc = executor_dealloc,
    .tp_methods = executor_methods,
    .tp_getset = executor_getset,
};

/* ---- graph slots, from Python ------------------------------------------------------ */

static slot *slot_arg(PyObject *value) {
    void *s;
    if (nhf_address_arg(value, &s) < 0)
        return NULL;
    if (s == NULL)
        PyErr_SetString(PyExc_ValueError, "a NULL graph slot");
    return s;
}

/* exec_slot_op(slot, i): the simulator's argument for the slot's i-th node. */
static PyObject *py_slot_op(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "exec_slot_op(slot, i)");
        return NULL;
    }
    slot *s = slot_arg(args[0]);
    long i = s == NULL ? -1 : PyLong_AsLong(args[1]);
    if (s == NULL || PyErr_Occurred())
        return NULL;
    if (i < 0 || i > 2) {
        PyErr_SetString(PyExc_ValueError, "a graph slot has nodes 0, 1 and 2");
        return NULL;
    }
    return PyLong_FromVoidPtr(&s->ops[i]);
}

/* ---- GraphSlot: a graph slot as Python holds it ------------------------------------ */

/* One executor node's slot, owned by the node's launch record (with the
 * node's other owners), so the graph owns it (invariant 16).  Its dealloc, run
 * when the record is released on the main thread, disarms the slot and gives
 * it back to the pool's free list: one native step, with no bytecode between
 * the release and the disarm, so an asynchronous exception (a Ctrl-C) cannot
 * leave a slot armed (invariant 21).  Made only by ExecutorBase._slot_new and
 * _slot_take. */
typedef struct {
    PyObject_HEAD
    slot *slot;
    PyObject *executor; /* the HostExecutor, alive while the node is */
} graph_slot_object;

static PyTypeObject graph_slot_type;

/* GIL held: disarm s if it is armed (once, however often it is called), and
 * put it on the pool's free list.  Not in a forked child: the pool's mutex may
 * have been held by a thread of the parent, which does not exist here. */
static void slot_give_back(slot *s) {
    nhf_pool *pool = s->pool;
    if (getpid() != pool->pid)
        return;
    pthread_mutex_lock(&pool->mutex);
    if (atomic_exchange(&s->live, 0)) {
        atomic_fetch_sub(&pool->live_slots, 1);
        pthread_cond_broadcast(&pool->wake); /* a closing pool's parked threads may now quit */
    }
    s->next_free = pool->free_slots;
    pool->free_slots = s;
    pthread_mutex_unlock(&pool->mutex);
}

/* A new GraphSlot for the disarmed slot s of executor's pool; NULL (s given
 * back to the free list) if there was no memory for it. */
static PyObject *graph_slot_wrap(PyObject *executor, slot *s) {
    graph_slot_object *self = PyObject_New(graph_slot_object, &graph_slot_type);
    if (self == NULL) {
        slot_give_back(s);
        return NULL;
    }
    self->slot = s;
    self->executor = Py_NewRef(executor);
    return (PyObject *)self;
}

static void graph_slot_dealloc(PyObject *self_) {
    graph_slot_object *self = (graph_slot_object *)self_;
    slot_give_back(self->slot);
    Py_DECREF(self->executor);
    PyObject_Free(self);
}

/* arm(fn, arg, copy): from now on a replay that reaches the slot runs fn(arg)
 * (or the pool's copy of the MEMCPY_LAYOUT at arg); RuntimeError once the pool
 * is stopping (no thread would answer). */
static PyObject *graph_slot_arm(PyObject *self_, PyObject *const *args, Py_ssize_t nargs) {
    slot *s = ((graph_slot_object *)self_)->slot;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "arm(fn, arg, copy)");
        return NULL;
    }
    void *fn, *arg;
    if (nhf_address_arg(args[0], &fn) < 0 || nhf_address_arg(args[1], &arg) < 0)
        return NULL;
    int copy = PyObject_IsTrue(args[2]);
    if (copy < 0)
        return NULL;
    nhf_pool *pool = s->pool;
    pthread_mutex_lock(&pool->mutex);
    if (atomic_load(&pool->stopping)) {
        pthread_mutex_unlock(&pool->mutex);
        PyErr_SetString(PyExc_RuntimeError, "the HostExecutor is closed; create a new one");
        return NULL;
    }
    if (atomic_load(&s->live)) {
        pthread_mutex_unlock(&pool->mutex);
        PyErr_SetString(PyExc_RuntimeError, "the graph slot is armed already");
        return NULL;
    }
    atomic_store(&s->words[0], 0);
    atomic_store(&s->words[1], 0);
    s->fn = (nhf_hostfn)(uintptr_t)fn;
    s->arg = arg;
    s->copy = copy;
    atomic_store(&s->live, 1);
    atomic_fetch_add(&pool->live_slots, 1);
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mutex);
    Py_RETURN_NONE;
}

static PyObject *graph_slot_address(PyObject *self_, void *closure) {
    (void)closure;
    return PyLong_FromVoidPtr(((graph_slot_object *)self_)->slot);
}

static PyObject *graph_slot_words(PyObject *self_, void *closure) {
    (void)closure;
    return PyLong_FromVoidPtr((void *)((graph_slot_object *)self_)->slot->words);
}

static PyObject *graph_slot_armed(PyObject *self_, void *closure) {
    (void)closure;
    return PyBool_FromLong(atomic_load(&((graph_slot_object *)self_)->slot->live));
}

static PyObject *graph_slot_executor(PyObject *self_, void *closure) {
    (void)closure;
    return Py_NewRef(((graph_slot_object *)self_)->executor);
}

static PyMethodDef graph_slot_methods[] = {
    {"arm", (PyCFunction)(void (*)(void))graph_slot_arm, METH_FASTCALL,
     "arm($self, fn, arg, copy, /)\n--\n\n"
     "A replay that reaches the slot runs fn(arg) (or the copy)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef graph_slot_getset[] = {
    {"address", graph_slot_address, NULL, "The native slot's address.", NULL},
    {"words", graph_slot_words, NULL, "The address of its two 32-bit words.", NULL},
    {"armed", graph_slot_armed, NULL, "True while a replay may reach it.", NULL},
    {"executor", graph_slot_executor, NULL, "Its HostExecutor.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject graph_slot_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "numba_hostfn._core.GraphSlot",
    .tp_doc = "One executor node's graph slot, disarmed when this object goes "
              "(LIFETIME.md, invariant 16).",
    .tp_basicsize = sizeof(graph_slot_object),
    /* Made only by the executor (its slot set): never from Python, whose object
     * would have no slot for the dealloc to give back. */
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .tp_dealloc = graph_slot_dealloc,
    .tp_methods = graph_slot_methods,
    .tp_getset = graph_slot_getset,
};

/* exec_test_pause(ns): tests only, see test_pause_ns. */
static PyObject *py_test_pause(PyObject *self, PyObject *arg) {
    (void)self;
    long ns = PyLong_AsLong(arg);
    if (ns == -1 && PyErr_Occurred())
        return NULL;
    atomic_store(&test_pause_ns, ns);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"exec_test_pause", py_test_pause, METH_O,
     "exec_test_pause($module, ns, /)\n--\n\n"
     "Tests only, pause each executor enqueue after its open check"},
    {"exec_slot_op", (PyCFunction)(void (*)(void))py_slot_op, METH_FASTCALL,
     "exec_slot_op($module, slot, i, /)\n--\n\n"
     "Returns the simulator's argument of the slot's node i"},
    {NULL, NULL, 0, NULL},
};

int nhf_executor_init(PyObject *module) {
    if (PyType_Ready(&nhf_executor_type) < 0 ||
        PyModule_AddObjectRef(module, "ExecutorBase", (PyObject *)&nhf_executor_type) < 0 ||
        PyType_Ready(&graph_slot_type) < 0 ||
        PyModule_AddObjectRef(module, "GraphSlot", (PyObject *)&graph_slot_type) < 0)
        return -1;
    if (PyModule_AddFunctions(module, methods) < 0)
        return -1;
    if (nhf_add_address(module, "EXEC_COPY", (void *)(uintptr_t)nhf_exec_copy) < 0 ||
        nhf_add_address(module, "EXEC_CUDA_ENQUEUE", (void *)(uintptr_t)nhf_exec_cuda_enqueue) < 0 ||
        nhf_add_address(module, "EXEC_SIM_ENQUEUE", (void *)(uintptr_t)nhf_exec_sim_enqueue) < 0 ||
        nhf_add_address(module, "EXEC_SIM_SET", (void *)(uintptr_t)sim_set) < 0 ||
        nhf_add_address(module, "EXEC_SIM_AWAIT", (void *)(uintptr_t)sim_await) < 0)
        return -1;
    return 0;
}
