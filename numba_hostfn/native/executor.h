/* The HostExecutor's native layouts, shared by its files (LIFETIME.md, invariants
 * 15 and 16; docs/design.md's C map): parallel_copy.c, graph_slots.c, pool.c,
 * executor_cuda.c, executor_sim.c and executor.c.  Included only by those; nhf.h
 * stays the one header that includes Python.
 *
 * The HostExecutor: stream-ordered host work on a pool of native threads,
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
#ifndef NHF_EXECUTOR_H
#define NHF_EXECUTOR_H

#include "nhf.h"

#include <stddef.h>

#define CACHE_LINE NHF_CACHE_LINE

/* A lane's task.  A lane's tasks form one chain, oldest first, that no one
 * frees: the pool's threads take them in order (the lane's cursor), and the
 * producer reuses the ones behind the cursor for its next tasks (pool.c's
 * new_task), so an enqueue neither allocates nor locks what the pool's threads
 * lock, and a task's memory is never handed from one thread's malloc arena to
 * another's free.  One cache line each: the producer fills a task while a pool
 * thread reads the one before it. */
typedef struct task {
    _Alignas(CACHE_LINE) _Atomic(struct task *) next; /* published with release */
    /* The number written to "reached" for it.  Atomic: a pool thread may read it
     * through a link just taken back (nhf_lane_unlink_task), while the producer
     * gives the same number to the task again. */
    _Atomic uint32_t seq;
    nhf_hostfn trampoline; /* a direct task's: its compiled code */
    void *record;          /* a direct task's: its argument */
    bool direct;           /* no record: its owner is in the lane's ring (lane.owners) */
} task;

/* The owner of a lane's direct task, and the task's number. */
typedef struct {
    uint32_t seq;
    PyObject *owner; /* one reference */
} held_owner;

typedef struct lane {
    /* Read by spinning threads: on a cache line of their own. */
    struct lane *next;   /* the next lane of the pool (appended under its mutex) */
    void *stream;        /* the handle the stream operations go to */
    /* With stream, which stream it is (nhf_cuda_stream_key): for a default-stream
     * handle, the id of the stream it named where the lane was made, and that
     * context (a fault of another context is not this lane's); 0 and NULL for any
     * other handle.  id changes when an idle lane is handed to another stream of
     * its handle and context (nhf_exec_reuse_lane); it is written and read with the
     * GIL held (nhf_exec_find_lane), ctx never changes. */
    void *ctx;
    unsigned long long id;
    /* Any other handle's lane: a later stream of the handle has another lane, this
     * one serving a destroyed stream that had tasks still to reach then (renewed:
     * nhf_exec_reuse_lane), so the lookup passes it by; once its tasks have run, a
     * later renewal of the handle takes it back.  GIL held, as id. */
    bool superseded;
    _Atomic uint32_t *words; /* reached, then done */
    nhf_pool *pool;
    /* Set once by the watchdog: the stream has a device fault, and will never
     * reach the tasks it has not reached (invariant 23).  Read by every claim: here,
     * not beside what the producer writes at each enqueue. */
    atomic_uint fault;
    /* The context of the lane's stream, as its last enqueue found it (written only
     * when it changes; NULL with no watchdog): the watchdog queries it for the
     * lane's direct tasks (no record carries it), and a fault of another context is
     * not this lane's (nhf_exec_fault_stream). */
    _Atomic(void *) watch_ctx;
    /* Whether an enqueue noted watch_ctx since the lane was made or handed back
     * (nhf_exec_reuse_lane): set after watch_ctx, with release.  A lane with none has
     * no task, and no fault is its own (nhf_exec_fault_stream). */
    atomic_bool watch_noted;
    /* Written by the pool's threads at each claim.  A thread took the lane's next
     * task and runs it, until its "done" is written (set by compare-and-swap): a
     * lane's tasks run in order, and the claim makes one reader of the chain. */
    _Alignas(CACHE_LINE) atomic_int claimed;
    /* Direct tasks run (or failed), counted before their "done" (one writer at a
     * time: the claiming thread). */
    atomic_ulong direct_ran;
    /* What a pool thread's settle last saw of direct_released (nhf_exec_owners_idle). */
    atomic_ulong released_seen;
    /* The last task taken (at first a placeholder that never runs): the next to
     * run is cursor->next.  Written by the claiming thread, with release; the
     * producer reads it to find tasks it may reuse (those before it). */
    _Atomic(task *) cursor;
    /* Written by the producer at each enqueue, under enqueue_mutex. */
    _Alignas(CACHE_LINE) pthread_mutex_t enqueue_mutex; /* one producer at a time per lane */
    task *tail;      /* the last task appended: its next gets the next task */
    task *before;    /* the tail before the last append (for nhf_lane_unlink_task) */
    task *first;     /* the oldest task of the chain: reused once behind the cursor */
    task *cursor_seen; /* the cursor as the producer last read it */
    task *spare;     /* a task taken back, to reuse first */
    uint32_t seq;    /* the last number given */
    /* The id of the stream the lane serves (cuStreamGetId; the simulator's serial),
     * set at its first enqueue (nhf_lane_identify): the handle may name another
     * stream later. */
    unsigned long long serves;
    bool serves_known;
    /* The owners of the direct tasks, oldest first: a ring that only the producer
     * and the drain touch, each under enqueue_mutex (no thread of the pool reads
     * it).  An owner is taken out only once its task has run: by the producer's
     * enqueues (nhf_lane_open_task) or by a drain, up to the "done" word. */
    held_owner *owners;
    size_t owners_size, owners_first, owners_count;
    /* Direct tasks counted in (a task taken back: out again), and their owners
     * taken out (released); written under enqueue_mutex, read by the pool's and
     * the watchdog's threads. */
    atomic_ulong direct_enqueued;
    atomic_ulong direct_released;
    atomic_ulong released_by_drain; /* of direct_released (the rest: by enqueues) */
} lane;
/* A lane is allocated on a cache line's boundary (aligned_zeroed, pool.c), and
 * what a spinning thread reads at each claim, what a claim writes and what the
 * producer writes at each enqueue are on three lines: with fault beside the FIFO,
 * every enqueue paid for the spinning thread's reads (the simulator: 1.07 against
 * 0.74 us an enqueue, a thread spinning). */
_Static_assert(offsetof(lane, fault) / CACHE_LINE != offsetof(lane, claimed) / CACHE_LINE,
               "a lane's fault shares its cache line with what each claim writes");
_Static_assert(offsetof(lane, words) / CACHE_LINE != offsetof(lane, claimed) / CACHE_LINE,
               "a lane's words pointer shares its cache line with what each claim writes");
_Static_assert(offsetof(lane, claimed) / CACHE_LINE != offsetof(lane, enqueue_mutex) / CACHE_LINE,
               "what each claim writes shares its cache line with the producer's fields");

/* A graph slot: the words of one executor node in a CUDA graph (invariant 16).
 * The graph holds three stream memory operations on them, replayed as they
 * are: write reached := 1, wait until done >= 1, write done := 0.  A pool
 * thread that sees reached == 1 swaps it back to 0, runs fn(arg) and writes
 * done := 1.  Armed while the graph lives; a disarmed slot is reused. */
typedef struct slot {
    struct slot *next; /* the next slot of the pool */
    struct slot *next_free; /* the next disarmed slot to reuse (under the pool's mutex) */
    _Atomic uint32_t *words;
    /* The node's work, set by arm: its kind's call of the launch's fn and arg
     * (never of the graph's record, which a device fault may let go, and a new
     * launch take, while a claimed run still waits for the GIL), or the pool's
     * copy of the MEMCPY_LAYOUT at arg. */
    nhf_call_fn call;
    nhf_hostfn fn;
    void *arg;
    atomic_int live; /* armed */
    /* Pool threads inside a claim of it: from before the claim reads live again to
     * after its run wrote "done".  A give-back while one runs (a device fault ends
     * a replay's wait for "done" while the node may still run) is handed off to
     * it: handed_off set, with the node's owners in handed_owner (a reference),
     * and the run's claim_end gives the slot back and those owners to the drain. */
    atomic_int running;
    atomic_int handed_off;
    PyObject *handed_owner;
    int copy;        /* run the pool's parallel copy of arg, not fn(arg) */
    nhf_pool *pool;
    nhf_sim_word_op ops[3];  /* the simulator's node arguments, in graph order */
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
    /* Written by the producer at each enqueue.  Tasks outstanding (enqueued, not
     * done) are enqueued - finished: two counts, each written by one side only
     * (nhf_pool_outstanding). */
    _Alignas(CACHE_LINE) atomic_long enqueued; /* counted in (a task taken back: out again) */
    atomic_int stopping;
    /* Written by the pool's threads at each task. */
    _Alignas(CACHE_LINE) atomic_long finished; /* tasks run (or failed), "done" written next */
    /* Set by close after every enqueue that saw the pool open has counted its
     * task: a thread quits only with quit set and nothing outstanding.  Read by
     * spinning threads at every turn: on a line of its own, which nothing else
     * writes (the mutex below is taken at enqueues that wake parked threads). */
    _Alignas(CACHE_LINE) atomic_int quit;
    _Alignas(CACHE_LINE) atomic_int parked; /* threads waiting on wake */
    atomic_long live_slots; /* slots armed (their graphs are alive) */
    atomic_int poller;      /* a thread polls the slots for a replay (the others park) */
    pthread_mutex_t mutex;  /* guards lanes (append), slots (append), parking, job */
    pthread_cond_t wake;    /* parked threads, and polling ones (poll_wait; CLOCK_MONOTONIC) */
    pthread_mutex_t close_mutex; /* one close() at a time */
    int closed;             /* close() finished (under close_mutex) */
    /* Set by close once nothing is outstanding, before it joins (or detaches) the
     * threads: from then on their ids may be given to new threads, so a close() is
     * no longer matched against them (executor_close). */
    atomic_int threads_released;
    pid_t pid;              /* the process whose threads these are (not a forked child) */
};

/* Any thread: the tasks enqueued and not done.  finished is read first, so a task
 * that completes between the two reads is still counted: never less than the
 * tasks outstanding at the second read. */
static inline long nhf_pool_outstanding(nhf_pool *pool) {
    long finished = atomic_load(&pool->finished);
    return atomic_load(&pool->enqueued) - finished;
}

/* nhf_lane_identify's answers. */
enum nhf_lane_identity {
    NHF_LANE_SAME,  /* the stream the lane served at its last enqueue */
    NHF_LANE_NEW,   /* its first stream, one it is handed to, or not known (no id) */
    NHF_LANE_OTHER, /* another stream, and the lane's earlier one may still reach tasks */
};

/* Under the lane's enqueue mutex: whether every task of l has run ("done" is the last
 * number given) and its stream has no fault: its stream will reach nothing more of
 * it, and another stream may have it. */
static inline bool nhf_lane_idle(lane *l) {
    return atomic_load_explicit(&l->fault, memory_order_relaxed) == 0 &&
           atomic_load_explicit(&l->words[1], memory_order_acquire) == l->seq;
}

/* Under the lane's enqueue mutex: whether l may take a task of the stream its handle
 * names now, whose id is id (known false where the driver gave none).  A lane is
 * found by its stream's handle, and the driver gives a destroyed stream's handle to
 * a later stream, at once even while the destroyed one's work is pending (on an
 * H200, every second cuStreamCreate: LIFETIME.md, invariant 15).  A lane whose
 * tasks have all run is handed to the new stream (a non-default handle's: a default
 * handle's lanes are found by the id, and an idle one is handed on as it is found,
 * nhf_exec_reuse_lane); else its earlier stream may still
 * reach its tasks, and a task of the new stream, whose "reached" comes first, would
 * let a pool thread run them early: NHF_LANE_OTHER, and the caller makes the new
 * stream a lane of its own. */
static inline enum nhf_lane_identity nhf_lane_identify(lane *l, bool known,
                                                       unsigned long long id) {
    if (!known)
        return NHF_LANE_NEW;
    if (l->serves_known && l->serves == id)
        return NHF_LANE_SAME;
    if (l->serves_known &&
        ((uintptr_t)l->stream <= (uintptr_t)CU_STREAM_PER_THREAD || !nhf_lane_idle(l)))
        return NHF_LANE_OTHER;
    l->serves = id;
    l->serves_known = true;
    return NHF_LANE_NEW;
}

/* Under the lane's enqueue mutex, before a task's enqueue: the context of the
 * lane's stream, which the watchdog queries for the lane's direct tasks (a record's
 * enqueue finds it the same way, nhf_watch_prepare) and a fault is matched by
 * (nhf_exec_fault_stream: a record's task too): looked up again only when the lane's
 * stream may have changed (identity), or no watchdog had noted one; written only
 * when it changes. */
static inline void nhf_lane_watch(lane *l, enum nhf_lane_identity identity) {
    void *noted = atomic_load_explicit(&l->watch_ctx, memory_order_relaxed);
    bool fresh = !atomic_load_explicit(&l->watch_noted, memory_order_relaxed);
    if (identity == NHF_LANE_SAME && noted != NULL && !fresh)
        return;
    void *ctx = nhf_watch_context(l->stream);
    if (noted != ctx)
        atomic_store_explicit(&l->watch_ctx, ctx, memory_order_relaxed);
    if (fresh) /* after watch_ctx: nhf_exec_fault_stream reads them the other way */
        atomic_store_explicit(&l->watch_noted, true, memory_order_release);
}

/* Without the GIL, at a task's enqueue on either route: take the lane's enqueue
 * mutex for a task of the stream whose id is id (known: see nhf_lane_identify) and
 * note its stream's context (nhf_lane_watch).  False, the mutex not held, if the
 * lane serves another stream: the enqueue then answers NHF_LANE_STALE. */
static inline bool nhf_lane_lock_for(lane *l, bool known, unsigned long long id) {
    pthread_mutex_lock(&l->enqueue_mutex);
    enum nhf_lane_identity identity = nhf_lane_identify(l, known, id);
    if (identity == NHF_LANE_OTHER) {
        pthread_mutex_unlock(&l->enqueue_mutex);
        return false;
    }
    nhf_lane_watch(l, identity);
    return true;
}

/* ---- parallel_copy.c ---------------------------------------------------------- */

/* Any thread (a pool's): join the pool's current copy, if it has chunks left
 * (true if it helped). */
bool nhf_copy_help(nhf_pool *pool);
/* Any thread (a pool's): the copy of a MEMCPY_LAYOUT descriptor {dst, src,
 * nbytes}: a large one is shared out to the pool's threads. */
void nhf_copy_run(nhf_pool *pool, const uint64_t *desc);

/* ---- graph_slots.c ------------------------------------------------------------ */

/* Any thread (a pool's): a graph slot whose replay has reached it; NULL if none. */
slot *nhf_slot_claim(nhf_pool *pool);
/* Any thread (a pool's): run a claimed slot's work, then write its "done". */
void nhf_slot_run(nhf_pool *pool, slot *s);
/* GIL held: a new, disarmed GraphSlot of executor's pool on words. */
PyObject *nhf_slot_new(PyObject *executor, nhf_pool *pool, void *words);
/* GIL held: a disarmed GraphSlot to reuse, or None. */
PyObject *nhf_slot_take(PyObject *executor, nhf_pool *pool);

/* ---- pool.c --------------------------------------------------------------------- */

/* A pool of nthreads threads, started; NULL if that failed.  Never freed. */
nhf_pool *nhf_pool_new(long nthreads, long spin_ns, long poll_ns);
/* Without the GIL: finish the outstanding tasks, then stop the threads; with
 * slice_ns > 0, NHF_POOL_CLOSE_WAITING if tasks are still outstanding after about
 * that long (stopped: call again to go on waiting). */
#define NHF_POOL_CLOSE_WAITING (-1L)
long nhf_pool_close(nhf_pool *pool, bool no_wait, long slice_ns);
void nhf_pool_let_go(nhf_pool *pool);
/* GIL held: a lane of pool for stream on words; NULL if no memory. */
lane *nhf_lane_new(nhf_pool *pool, void *stream, void *words);
/* Under the lane's enqueue mutex: the task for trampoline(record), numbered
 * next, a direct task holding owner if owner is not NULL (a record's task: NULL);
 * NULL with *status set if the pool is closed or no memory is left.  released
 * (NHF_LANE_RELEASED of them, NULL where none): owners of earlier direct tasks
 * that have run, taken out of the lane for the caller to release. */
task *nhf_lane_open_task(lane *l, nhf_hostfn trampoline, void *record, PyObject *owner,
                         uint64_t *status, PyObject **released);
/* Under the lane's enqueue mutex: take back the task just appended (a direct
 * task's owner is the caller's again). */
void nhf_lane_unlink_task(lane *l, task *t);
/* Without the GIL: whether the stream reached l's task numbered task, within
 * budget_ns: 1 yes, 0 not yet, -1 never (a device fault). */
int nhf_lane_reached(lane *l, uint32_t task, long budget_ns, bool spin);

#endif /* NHF_EXECUTOR_H */
