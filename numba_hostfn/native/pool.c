/* The HostExecutor's pool: its threads, its lanes and their tasks, its life
 * (start, close), and its answer to a device fault (executor.h).
 */
#include "executor.h"

#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

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

/* A lane's count with one writer at a time (the enqueue mutex's holder, or the
 * claiming thread): a plain load and store, no locked instruction; order: what its
 * readers need. */
static void count_add(atomic_ulong *count, long change, memory_order order) {
    unsigned long now = atomic_load_explicit(count, memory_order_relaxed);
    atomic_store_explicit(count, now + (unsigned long)change, order);
}

/* The next task of a lane whose stream has reached it (or that a device fault
 * failed), claimed: the lane's cursor moves onto it; NULL if none.  A task on a
 * faulted lane that the stream has not reached is claimed only with the lane's
 * enqueue mutex (*failing set): its producer may still be inside its enqueue,
 * holding that mutex, and take the task back itself (nhf_lane_unlink_task) if the
 * driver refuses the write; trylock, as a producer that holds it waits for nothing
 * this thread holds. */
static task *claim(nhf_pool *pool, lane **lane_out, bool *failing) {
    for (lane *l = atomic_load(&pool->lanes); l != NULL; l = l->next) {
        /* Without a lock: reached == done means nothing is waiting here. */
        uint32_t reached = reached_word(l);
        bool faulted = atomic_load_explicit(&l->fault, memory_order_relaxed) != 0;
        if (reached == atomic_load(&l->words[1]) && !faulted)
            continue;
        /* One thread claims a lane, the others move on: a compare-and-swap of
         * the claimed flag, so that spinning threads do not all rush the lane
         * when the stream reaches it. */
        if (atomic_load_explicit(&l->claimed, memory_order_relaxed))
            continue;
        int expected = 0;
        if (!atomic_compare_exchange_strong_explicit(&l->claimed, &expected, 1,
                                                     memory_order_acquire, memory_order_relaxed))
            continue;
        /* The claimed flag makes this thread the lane's one reader of the chain: the
         * next task is published by the producer's release store of its link. */
        task *cursor = atomic_load_explicit(&l->cursor, memory_order_relaxed);
        task *next = atomic_load_explicit(&cursor->next, memory_order_acquire);
        bool reached_it =
            next != NULL &&
            (int32_t)(reached - atomic_load_explicit(&next->seq, memory_order_relaxed)) >= 0;
        *failing = next != NULL && !reached_it && faulted &&
                   pthread_mutex_trylock(&l->enqueue_mutex) == 0;
        if (*failing && atomic_load_explicit(&cursor->next, memory_order_acquire) != next) {
            /* Its producer took it back (its write refused) between the read above
             * and the lock: claimed, it would count a task out that never was, and
             * close() would then miss one outstanding on another lane. */
            pthread_mutex_unlock(&l->enqueue_mutex);
            *failing = false;
        }
        if (reached_it || *failing) {
            /* Taken: the cursor moves onto it, and the task before it may be reused
             * by the producer (never this one, until the next claim moves past it:
             * run() reads it until it releases the claim).  The producer never takes
             * back a task the stream reached (its write was refused), nor one claimed
             * failing (this thread then holds its enqueue mutex). */
            atomic_store_explicit(&l->cursor, next, memory_order_release);
            *lane_out = l;
            return next;
        }
        atomic_store_explicit(&l->claimed, 0, memory_order_release);
    }
    return NULL;
}

/* Tests only: a pause after each task's "done" write (exec_done_pause). */
static atomic_long test_done_pause_ns;

/* Run a claimed task, count it out, write its "done", and retire it.  Counted
 * out first: a thread that saw the stream pass the task (its stream.sync()
 * returned) finds it no longer outstanding.  A task claimed failing
 * (the stream has not reached it on a faulted lane, claim holds the lane's
 * enqueue mutex) never runs: its record is failed (the watchdog may have failed
 * it first), and the drain releases it.  A direct task runs its compiled code
 * itself (nhf_run_compiled's work, with no record), and its owner is released
 * once "done" is written for it: by its producer, or by the drain it owes. */
static void run(nhf_pool *pool, lane *l, task *t, bool failing) {
    bool direct = t->direct;
    if (direct) {
        if (!failing) {
            t->trampoline(t->record);
            nhf_gil_give_back_leaked();
        }
        /* Sequentially consistent, as the owed flag that nhf_owe_drain reads below,
         * and a settle clears before it reads this (nhf_exec_owners_idle): one of
         * the two sees the other. */
        count_add(&l->direct_ran, 1, memory_order_seq_cst);
    } else if (failing) {
        nhf_record *record = t->record;
        (void)nhf_fault_fail_record(record, atomic_load(&l->fault), atomic_load(&record->state));
    } else {
        t->trampoline(t->record);
    }
    /* The pool is never freed, and close() joins (or detaches) this thread after
     * the count reaches 0, so what follows may still touch the lane and t. */
    atomic_fetch_add(&pool->finished, 1);
    /* A release store: the task's writes and the count above are visible before
     * "done" (on x86 a plain store; the seq_cst fence and store it replaces cost
     * an mfence and an xchg per task, and ordered nothing more). */
    atomic_store_explicit(&l->words[1], t->seq, memory_order_release);
    long pause = atomic_load_explicit(&test_done_pause_ns, memory_order_relaxed);
    if (pause > 0)
        nhf_sleep_ns(pause);
    /* The next claim of this lane may start, and move the cursor past t: from then
     * on the producer may reuse t, so nothing here touches it after this store. */
    atomic_store_explicit(&l->claimed, 0, memory_order_release);
    if (failing)
        pthread_mutex_unlock(&l->enqueue_mutex);
    if (direct)
        nhf_owe_drain(); /* its owner, if no enqueue on the lane takes it out first */
}

/* If this thread is the poller, give the role up and wake the parked threads
 * (one of them becomes the poller; all of them spin for a while first). */
static void hand_on(nhf_pool *pool, int *me_poller) {
    if (!*me_poller)
        return;
    *me_poller = 0;
    atomic_store(&pool->poller, 0);
    /* As wake(): a thread that parks after this load sees poller == 0 under the
     * mutex (both seq_cst), and becomes the poller instead of waiting. */
    if (atomic_load(&pool->parked) == 0)
        return;
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
        bool work = nhf_pool_outstanding(pool) > 0;
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

/* Whether a pool thread may end: close() has passed every lane's enqueue mutex
 * (quit), and no task is outstanding nor slot armed.  quit is read first: it is
 * written once, by close, and until then a spinning thread reads nothing more here
 * (nothing that the producer writes). */
static bool may_quit(nhf_pool *pool) {
    return atomic_load(&pool->quit) && nhf_pool_outstanding(pool) == 0 &&
           atomic_load(&pool->live_slots) == 0;
}

/* Sleep poll_ns while tasks are outstanding: on the pool's condition variable,
 * which close() broadcasts once nothing is outstanding (nhf_pool_close), not in a
 * nanosleep, which a thread slept out after the last task had run, holding close()
 * in its join for up to poll_us (a second at the largest), deaf to Ctrl-C.  Checked
 * under the mutex that close broadcasts under: no wake-up is lost. */
static void poll_wait(nhf_pool *pool) {
    struct timespec until = nhf_deadline_ns(pool->poll_ns);
    pthread_mutex_lock(&pool->mutex);
    if (!may_quit(pool))
        (void)pthread_cond_timedwait(&pool->wake, &pool->mutex, &until);
    pthread_mutex_unlock(&pool->mutex);
}

/* A pool thread: claim and run reached tasks and slots; spin, poll or park in
 * between.  It spins for spin_ns after its last work (or wake-up); then, with
 * tasks outstanding, it polls every poll_ns.  With none outstanding but graph
 * slots armed, a replay may reach a slot at any time and no enqueue announces
 * it: one thread, the poller, polls every poll_ns (spinning first for spin_ns
 * after work) and the others park; when the poller finds work it hands the
 * role on and wakes the others, which spin for a while, so the rest of the
 * replay finds them awake.  With neither (at its start too), every thread parks
 * until an enqueue or an armed slot wakes it. */
static void *thread_main(void *pool_) {
    nhf_pool *pool = pool_;
    int me_poller = 0;
    /* Sleep as long as asked, not the default 50 us longer. */
    (void)prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
    /* Everything it runs is a host function: a close() or a simulated sync from a
     * ctypes CUhostFn task (no Python callable's trampoline) is refused too. */
    nhf_mark_host_function_thread();
    /* The records this thread's tasks complete are drained by the launching
     * thread's next enqueue, or by a pending call that a pool thread schedules
     * once they have waited NHF_DRAIN_DEFER_NS, or before it sleeps: not one
     * pending call a task (invariant 14). */
    nhf_defer_drains();
    /* A new thread has nothing to run: it parks until a launch (or an armed slot, or
     * close) wakes it, then spins as after any wake-up.  Before, it spun for spin_ns
     * from its start, so a new executor with nothing outstanding kept a core per
     * thread busy. */
    park(pool);
    long last_work = nhf_now_ns();
    for (;;) {
        if (nhf_copy_help(pool)) {
            last_work = nhf_now_ns();
            nhf_settle_drain(last_work);
            continue;
        }
        lane *l;
        bool failing;
        task *t = claim(pool, &l, &failing);
        if (t != NULL) {
            hand_on(pool, &me_poller);
            run(pool, l, t, failing);
            last_work = nhf_now_ns();
            nhf_settle_drain(last_work);
            continue;
        }
        slot *s = nhf_slot_claim(pool);
        if (s != NULL) {
            hand_on(pool, &me_poller);
            nhf_slot_run(pool, s);
            last_work = nhf_now_ns();
            continue;
        }
        /* Spinning reads nothing that the producer writes (not even the count
         * of outstanding tasks): only the words and the lanes' read-mostly
         * fields, the owed-drain flag that the pool's own tasks set, and quit.
         * Not once the thread may quit: close() joins it, and waited out the
         * spin (up to spin_us, deaf to Ctrl-C) with nothing left to run. */
        long now = nhf_now_ns();
        if (now - last_work < pool->spin_ns && !may_quit(pool)) {
            nhf_settle_drain(now);
            nhf_cpu_relax();
            continue;
        }
        nhf_settle_drain(0); /* whatever it owes, before it sleeps or parks */
        if (nhf_pool_outstanding(pool) > 0) {
            poll_wait(pool);
            continue;
        }
        if (atomic_load(&pool->live_slots) > 0) {
            int expected = 0;
            if (me_poller || atomic_compare_exchange_strong(&pool->poller, &expected, 1)) {
                me_poller = 1;
                nhf_sleep_ns(pool->poll_ns);
                continue;
            }
            park(pool);
            last_work = nhf_now_ns();
            continue;
        }
        hand_on(pool, &me_poller);
        /* quit before outstanding: every task counted before close set quit is
         * seen here.  Stopping alone is not enough: an enqueue that saw the pool
         * open may not have counted its task yet. */
        if (may_quit(pool))
            break;
        park(pool);
        last_work = nhf_now_ns();
    }
    nhf_gil_forget(); /* invariant 12's exception: threads that end give theirs back */
    return NULL;
}

/* ---- a lane's tasks, for the enqueue functions (executor_cuda.c, executor_sim.c) -- */

/* Under the lane's enqueue mutex: the oldest owner of the lane's ring taken out
 * (its task has run), counted as released; the caller releases it with the GIL. */
static PyObject *pop_owner(lane *l) {
    PyObject *owner = l->owners[l->owners_first].owner;
    l->owners_first = (l->owners_first + 1) % l->owners_size;
    l->owners_count--;
    count_add(&l->direct_released, 1, memory_order_release);
    return owner;
}

/* Under the lane's enqueue mutex: whether the oldest owner's task has run, for a
 * task numbered ran or before. */
static bool oldest_ran(const lane *l, uint32_t ran) {
    return l->owners_count > 0 && (int32_t)(ran - l->owners[l->owners_first].seq) >= 0;
}

/* Under the lane's enqueue mutex: room in the ring for one more owner; false if no
 * memory is left. */
static bool owners_room(lane *l) {
    if (l->owners_count < l->owners_size)
        return true;
    size_t size = l->owners_size ? 2 * l->owners_size : 64;
    held_owner *ring = malloc(size * sizeof(held_owner));
    if (ring == NULL)
        return false;
    for (size_t i = 0; i < l->owners_count; i++) /* oldest first, from 0 */
        ring[i] = l->owners[(l->owners_first + i) % l->owners_size];
    free(l->owners);
    l->owners = ring;
    l->owners_size = size;
    l->owners_first = 0;
    return true;
}

/* A task to fill, under the lane's enqueue mutex: the one last taken back, else
 * the oldest of the chain if the pool's threads have moved past it (behind the
 * cursor no thread reads a task), else a new one; NULL if there is no memory. */
static task *new_task(lane *l) {
    task *t = l->spare;
    if (t != NULL) {
        l->spare = NULL;
        return t;
    }
    if (l->first == l->cursor_seen) /* read the cursor only when what it showed is used up */
        l->cursor_seen = atomic_load_explicit(&l->cursor, memory_order_acquire);
    if (l->first != l->cursor_seen) {
        t = l->first;
        l->first = atomic_load_explicit(&t->next, memory_order_relaxed);
        return t;
    }
    return aligned_alloc(CACHE_LINE, sizeof(task));
}

/* Append a task numbered seq, before its "reached" write goes on the stream:
 * a thread that sees the write then finds the task in place (the release store
 * of its link publishes it).  The caller holds the lane's enqueue mutex.  NULL
 * if there was no memory for it. */
static task *append(lane *l, uint32_t seq, nhf_hostfn trampoline, void *record,
                    PyObject *owner) {
    if (owner != NULL && !owners_room(l))
        return NULL;
    task *t = new_task(l);
    if (t == NULL)
        return NULL;
    atomic_store_explicit(&t->next, NULL, memory_order_relaxed);
    atomic_store_explicit(&t->seq, seq, memory_order_relaxed);
    t->trampoline = trampoline;
    t->record = record;
    t->direct = owner != NULL;
    if (owner != NULL) {
        l->owners[(l->owners_first + l->owners_count++) % l->owners_size] =
            (held_owner){seq, owner};
        /* Before the pool's count below: the watchdog reads both. */
        count_add(&l->direct_enqueued, 1, memory_order_relaxed);
    }
    l->seq = seq;
    atomic_store_explicit(&l->tail->next, t, memory_order_release);
    l->before = l->tail;
    l->tail = t;
    atomic_fetch_add(&l->pool->enqueued, 1);
    wake(l->pool);
    return t;
}

/* Take back the task just appended, whose "reached" write could not be
 * enqueued (the caller holds the enqueue mutex, so it is the lane's last task;
 * no thread claims it, since the stream never reaches it, and a claim of a
 * faulted lane's unreached task needs the enqueue mutex).  A thread may still
 * read its number through the link undone here: the next task takes it over,
 * with the same number. */
void nhf_lane_unlink_task(lane *l, task *t) {
    if (t->direct) { /* its owner, the newest, is the caller's again: refused */
        l->owners_count--;
        count_add(&l->direct_enqueued, -1, memory_order_relaxed);
    }
    atomic_store_explicit(&l->before->next, NULL, memory_order_release);
    l->tail = l->before;
    l->seq = atomic_load_explicit(&t->seq, memory_order_relaxed) - 1;
    l->spare = t;
    atomic_fetch_sub(&l->pool->enqueued, 1);
}

/* Tests only: a pause between open_task's check and the count of its task, the
 * window a preempted launching thread leaves to a racing close (exec_test_pause). */
static atomic_long test_pause_ns;
static atomic_long test_paused; /* launches in that pause now (exec_test_paused) */

/* Under the lane's enqueue mutex: the task for trampoline(record), numbered
 * next; NULL with *status set if the pool is closed or no memory is left. */
task *nhf_lane_open_task(lane *l, nhf_hostfn trampoline, void *record, PyObject *owner,
                         uint64_t *status, PyObject **released) {
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
    if (pause > 0) {
        atomic_fetch_add(&test_paused, 1);
        nhf_sleep_ns(pause);
        atomic_fetch_sub(&test_paused, 1);
    }
    task *t = append(l, l->seq + 1, trampoline, record, owner);
    if (t == NULL) {
        *status = NHF_OUT_OF_MEMORY;
        return NULL;
    }
    nhf_enqueue_note_task(t->seq); /* for a wait on it (lane_reached) */
    /* The owners of direct tasks that have run, a few at a time (the rest at later
     * enqueues, or a drain): those before the cursor as last read, which every task
     * there has passed; where the oldest other than this one is not among them, the
     * "done" word says how far the pool got (one read of a line the pool writes at
     * each task, only while an owner of an earlier task is held). */
    uint32_t ran = atomic_load_explicit(&l->cursor_seen->seq, memory_order_relaxed) - 1;
    if (l->owners_count > (owner != NULL ? 1u : 0u) && !oldest_ran(l, ran))
        ran = atomic_load_explicit(&l->words[1], memory_order_acquire);
    for (int i = 0; i < NHF_LANE_RELEASED && oldest_ran(l, ran); i++)
        released[i] = pop_owner(l);
    return t;
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
 * check): the threads run them and quit, and a later close joins them.  With
 * slice_ns > 0 it waits about that long at most for the outstanding tasks, and
 * returns NHF_POOL_CLOSE_WAITING if some are still outstanding then: the pool
 * stays stopped (it refuses launches, its threads run the tasks), and the next
 * call waits on where this one left off (executor_close checks for signals in
 * between: a Ctrl-C interrupts a close waiting for a task that never ends). */
long nhf_pool_close(nhf_pool *pool, bool no_wait, long slice_ns) {
    pthread_mutex_lock(&pool->close_mutex);
    if (pool->closed) {
        pthread_mutex_unlock(&pool->close_mutex);
        return 0;
    }
    if (atomic_load(&pool->quit))
        goto stopped; /* an earlier call stopped it, and left off waiting */
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
stopped:;
    long outstanding = nhf_pool_outstanding(pool);
    if (no_wait && outstanding > 0) {
        pthread_mutex_unlock(&pool->close_mutex);
        return outstanding;
    }
    long start = slice_ns > 0 ? nhf_now_ns() : 0;
    while (nhf_pool_outstanding(pool) > 0) {
        if (slice_ns > 0 && nhf_now_ns() - start >= slice_ns) {
            pthread_mutex_unlock(&pool->close_mutex);
            return NHF_POOL_CLOSE_WAITING;
        }
        nhf_sleep_ns(20000);
    }
    pthread_mutex_lock(&pool->mutex);
    bool armed = atomic_load(&pool->live_slots) > 0;
    pthread_cond_broadcast(&pool->wake); /* threads in poll_wait: nothing is outstanding */
    pthread_mutex_unlock(&pool->mutex);
    /* Before the ids are given back: a thread made after the join may get one of
     * them, and must not be taken for one of the pool's (executor_close). */
    atomic_store(&pool->threads_released, 1);
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

/* Without the GIL: a pool that no one will close (its executor was collected with
 * its __del__'s close stopped by an exception): stopped; joined if nothing is
 * outstanding, else its threads detached, to end once they have run the tasks (on
 * one of them, inside a task, the dealloc sees that task outstanding). */
void nhf_pool_let_go(nhf_pool *pool) {
    if (nhf_pool_close(pool, true, 0) == 0)
        return; /* closed: its threads joined (or detached, with slots armed) */
    pthread_mutex_lock(&pool->close_mutex);
    if (!pool->closed) {
        atomic_store(&pool->threads_released, 1);
        for (long i = 0; i < pool->nthreads; i++)
            pthread_detach(pool->threads[i]);
        pool->closed = 1;
    }
    pthread_mutex_unlock(&pool->close_mutex);
}

/* Without the GIL: whether the stream has reached l's task numbered task (its
 * "reached" word at or past it: the write is in stream order, after all the work
 * before it), within budget_ns; spinning for the pool's spin_ns first if spin,
 * then checking every poll_ns.  1 reached, 0 not yet, -1 never will (a device
 * fault of the lane's stream).  The lane and its words are never freed. */
int nhf_lane_reached(lane *l, uint32_t task, long budget_ns, bool spin) {
    long start = nhf_now_ns(), spin_ns = spin ? l->pool->spin_ns : 0;
    /* The caller's thread sleeps poll_ns, not the default 50 us longer, while here
     * (as the pool's threads always do); its own slack is given back after.  Set
     * before the first sleep only: a watch that the stream ends while it spins makes
     * no system call (one after the stream got there would delay the answer). */
    int slack = 0;
    bool slack_asked = false, slack_set = false;
    int answer;
    for (;;) {
        if ((int32_t)(reached_word(l) - task) >= 0) {
            answer = 1;
            break;
        }
        if (atomic_load_explicit(&l->fault, memory_order_relaxed) != 0) {
            answer = -1;
            break;
        }
        long waited = nhf_now_ns() - start;
        if (waited >= budget_ns) {
            answer = 0;
            break;
        }
        if (waited < spin_ns) {
            nhf_cpu_relax();
            continue;
        }
        if (!slack_asked) {
            slack_asked = true;
            slack = prctl(PR_GET_TIMERSLACK, 0UL, 0UL, 0UL, 0UL);
            slack_set = slack > 1000 && prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL) == 0;
        }
        long left = budget_ns - waited;
        nhf_sleep_ns(left < l->pool->poll_ns ? left : l->pool->poll_ns);
    }
    if (slack_set)
        (void)prctl(PR_SET_TIMERSLACK, (unsigned long)slack, 0UL, 0UL, 0UL);
    return answer;
}

/* Every pool ever started (a pool is never freed). */
static _Atomic(nhf_pool *) all_pools;
static pthread_mutex_t all_pools_lock = PTHREAD_MUTEX_INITIALIZER;

void *nhf_exec_lane_stream(void *lane_) { return ((lane *)lane_)->stream; }

void nhf_exec_fault_stream(void *stream, void *ctx, unsigned code) {
    for (nhf_pool *pool = atomic_load(&all_pools); pool != NULL; pool = pool->next_pool) {
        bool marked = false;
        for (lane *l = atomic_load(&pool->lanes); l != NULL; l = l->next) {
            unsigned expected = 0;
            /* The handle alone does not say which stream: the driver gives a
             * destroyed stream's handle to a new one while the destroyed one's tasks
             * are pending (seen on the H200), and nothing keeps that one in the same
             * context (not seen; not looked for).  A lane of another context (a
             * default handle's, where it was made; any other, as its stream's last
             * enqueue found it) is another stream's, whose tasks its stream still
             * reaches.  Where no context was noted (no watchdog then), the handle. */
            void *noted = l->ctx;
            if (noted == NULL) {
                /* A lane no enqueue noted since it was made (or handed back) has no
                 * task: a producer inside its first enqueue noted the context before
                 * its task went on, and the next poll finds that task. */
                if (!atomic_load_explicit(&l->watch_noted, memory_order_acquire))
                    continue;
                noted = atomic_load_explicit(&l->watch_ctx, memory_order_relaxed);
            }
            /* stream NULL: every lane of the context (the watchdog lost a stream). */
            bool same = stream == NULL ? noted == ctx
                                       : l->stream == stream && (noted == NULL || noted == ctx);
            if (same && atomic_compare_exchange_strong(&l->fault, &expected, code))
                marked = true;
        }
        if (marked)
            wake(pool); /* its threads answer the lane's tasks */
    }
}

/* ---- the owners of lanes' direct tasks (records.c's and the watchdog's hooks) ---- */

/* GIL held: take out of l's ring the owners of its direct tasks that have run (up
 * to its "done" word), at most n, into owners.  0 with *busy set if the lane's
 * enqueue mutex is held: its producer is inside an enqueue (maybe blocked in the
 * driver, whose progress may need the GIL: never waited for with it held). */
static size_t take_ran(lane *l, PyObject **owners, size_t n, bool *busy) {
    if (atomic_load_explicit(&l->direct_ran, memory_order_relaxed) ==
        atomic_load_explicit(&l->direct_released, memory_order_relaxed))
        return 0; /* none has run that is still held (a hint; rechecked below) */
    if (pthread_mutex_trylock(&l->enqueue_mutex) != 0) {
        *busy = true;
        return 0;
    }
    uint32_t done = atomic_load_explicit(&l->words[1], memory_order_acquire);
    size_t taken = 0;
    while (taken < n && oldest_ran(l, done)) {
        owners[taken++] = pop_owner(l);
        count_add(&l->released_by_drain, 1, memory_order_relaxed);
    }
    pthread_mutex_unlock(&l->enqueue_mutex);
    return taken;
}

/* GIL held (records.c's drain): release the owners of every lane's direct tasks
 * that have run, outside the lanes' mutexes (a finalizer may launch); how many.  A
 * lane whose producer is inside an enqueue is skipped and -1 - released returned:
 * the drain stays owed. */
Py_ssize_t nhf_exec_release_ran(void) {
    Py_ssize_t released = 0;
    bool busy = false;
    pid_t pid = getpid(); /* a forked child's copies: a parent's thread may hold a mutex */
    for (nhf_pool *pool = atomic_load(&all_pools); pool != NULL; pool = pool->next_pool) {
        if (pool->pid != pid)
            continue;
        for (lane *l = atomic_load(&pool->lanes); l != NULL; l = l->next) {
            PyObject *owners[64];
            size_t n;
            do {
                n = take_ran(l, owners, 64, &busy);
                for (size_t i = 0; i < n; i++) {
                    nhf_owner_held(-1);
                    Py_DECREF(owners[i]);
                }
                released += (Py_ssize_t)n;
            } while (n == 64);
        }
    }
    return busy ? -1 - released : released;
}

/* A pool's thread, settling a drain it owes: whether owners of direct tasks that
 * have run wait for a drain: 1 if some lane has some and its producer released none
 * since the last settle looked (it stopped launching there), -1 if only lanes whose
 * producers are releasing them as they launch have any (look again
 * later), 0 if none has any; with any_age, 1 if any lane has any. */
int nhf_exec_owners_idle(bool any_age) {
    int answer = 0;
    for (nhf_pool *pool = atomic_load(&all_pools); pool != NULL; pool = pool->next_pool) {
        for (lane *l = atomic_load(&pool->lanes); l != NULL; l = l->next) {
            unsigned long ran = atomic_load(&l->direct_ran); /* see run() */
            unsigned long released =
                atomic_load_explicit(&l->direct_released, memory_order_relaxed);
            if (ran == released)
                continue;
            if (any_age)
                return 1;
            if (atomic_exchange_explicit(&l->released_seen, released, memory_order_relaxed) ==
                released)
                return 1;
            answer = -1;
        }
    }
    return answer;
}

/* GIL held (tests): visit each owner that a lane's direct task holds (a lane whose
 * producer is inside an enqueue is skipped). */
void nhf_exec_each_owner(void (*visit)(PyObject *owner, void *arg), void *arg) {
    pid_t pid = getpid();
    for (nhf_pool *pool = atomic_load(&all_pools); pool != NULL; pool = pool->next_pool) {
        if (pool->pid != pid)
            continue;
        for (lane *l = atomic_load(&pool->lanes); l != NULL; l = l->next) {
            if (pthread_mutex_trylock(&l->enqueue_mutex) != 0)
                continue;
            for (size_t i = 0; i < l->owners_count; i++)
                visit(l->owners[(l->owners_first + i) % l->owners_size].owner, arg);
            pthread_mutex_unlock(&l->enqueue_mutex);
        }
    }
}

/* The watchdog's thread: visit(ctx, stream, n, arg) for each lane with n direct
 * tasks outstanding in a watched context.  A pool's outstanding count is read
 * first (sequentially consistent, as the enqueue's count of its task, which follows
 * its direct count): the watchdog that parks after this finds each such task, or
 * that enqueue finds the watchdog parked and wakes it (nhf_watch_wake). */
void nhf_exec_watch_lanes(nhf_watch_visit_fn visit, void *arg) {
    for (nhf_pool *pool = atomic_load(&all_pools); pool != NULL; pool = pool->next_pool) {
        if (nhf_pool_outstanding(pool) <= 0)
            continue;
        for (lane *l = atomic_load(&pool->lanes); l != NULL; l = l->next) {
            long n = (long)(atomic_load_explicit(&l->direct_enqueued, memory_order_relaxed) -
                            atomic_load_explicit(&l->direct_ran, memory_order_relaxed));
            void *ctx = atomic_load_explicit(&l->watch_ctx, memory_order_relaxed);
            if (n > 0 && ctx != NULL)
                visit(ctx, l->stream, n, arg);
        }
    }
}

/* A pool of nthreads threads, started; NULL if that failed.  Never freed. */
nhf_pool *nhf_pool_new(long nthreads, long spin_ns, long poll_ns) {
    nhf_pool *pool = aligned_zeroed(sizeof(nhf_pool));
    pthread_t *threads = calloc((size_t)nthreads, sizeof(pthread_t));
    if (pool == NULL || threads == NULL || pthread_mutex_init(&pool->mutex, NULL) ||
        nhf_cond_init_monotonic(&pool->wake) || /* poll_wait's deadlines */
        pthread_mutex_init(&pool->close_mutex, NULL)) {
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
            (void)nhf_pool_close(pool, false, 0);
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
    void *ctx;
    unsigned long long id;
    nhf_cuda_stream_key(stream, &ctx, &id);
    for (lane *l = atomic_load(&pool->lanes); l != NULL; l = l->next)
        if (l->stream == stream && l->id == id && l->ctx == ctx && !l->superseded)
            return l;
    return NULL;
}

/* GIL held: true, with l's enqueue mutex held, if its tasks have all run and it has
 * no fault; else false, the mutex not held.  Only tried: a producer inside an
 * enqueue holds it, and the lane is not idle then. */
static bool lock_if_idle(lane *l) {
    if (pthread_mutex_trylock(&l->enqueue_mutex) != 0)
        return false;
    if (nhf_lane_idle(l))
        return true;
    pthread_mutex_unlock(&l->enqueue_mutex);
    return false;
}

void *nhf_exec_reuse_lane(nhf_pool *pool, void *stream, void *stale_) {
    lane *stale = stale_;
    if ((uintptr_t)stream > (uintptr_t)CU_STREAM_PER_THREAD) {
        /* One stream at a time: its lane answered LANE_STALE (stale), as it serves a
         * destroyed stream with tasks still to reach.  That lane is passed by from
         * now on, and one passed by earlier whose tasks have all run serves instead:
         * a handle has as many lanes as its streams with tasks outstanding at once,
         * not one more at every renewal. */
        if (stale == NULL || stale->stream != stream)
            return NULL; /* no renewal: its first lane, or nhf_lane_identify's to hand on */
        stale->superseded = true;
        for (lane *l = atomic_load(&pool->lanes); l != NULL; l = l->next) {
            if (l == stale || l->stream != stream || !l->superseded || !lock_if_idle(l))
                continue;
            /* The handle's lane again: its next enqueue finds it idle and serving
             * another stream, and hands it to the one the handle names then
             * (nhf_lane_identify). */
            l->superseded = false;
            /* Its earlier stream reaches nothing more of it: a fault of that stream's
             * context is no longer this lane's, until an enqueue notes the new one. */
            atomic_store_explicit(&l->watch_noted, false, memory_order_relaxed);
            pthread_mutex_unlock(&l->enqueue_mutex);
            return l;
        }
        return NULL;
    }
    void *ctx;
    unsigned long long id;
    nhf_cuda_stream_key(stream, &ctx, &id);
    if (id == 0)
        return NULL; /* no id from the driver: streams it names cannot be told apart */
    for (lane *l = atomic_load(&pool->lanes); l != NULL; l = l->next) {
        /* Another context's lane stays its own (its fault is that context's). */
        if (l == stale || l->stream != stream || l->ctx != ctx || !lock_if_idle(l))
            continue;
        /* A producer that found it under its former id and enqueues now is refused
         * (nhf_lane_identify: NHF_LANE_OTHER), and finds another. */
        l->id = id;
        l->serves = id;
        l->serves_known = true;
        pthread_mutex_unlock(&l->enqueue_mutex);
        return l;
    }
    return NULL;
}

bool nhf_exec_has_lane(nhf_pool *pool, void *lane_) {
    for (lane *l = atomic_load(&pool->lanes); l != NULL; l = l->next)
        if (l == lane_)
            return true;
    return false;
}

size_t nhf_exec_lane_count(nhf_pool *pool) {
    size_t n = 0;
    for (lane *l = atomic_load(&pool->lanes); l != NULL; l = l->next)
        n++;
    return n;
}

/* _lane_new(stream, words) of ExecutorBase: a lane for stream, its words at
 * words (two zeroed 32-bit words of pinned memory). */
lane *nhf_lane_new(nhf_pool *pool, void *stream, void *words) {
    lane *l = aligned_zeroed(sizeof(lane));
    /* The chain's first link: a placeholder task that never runs. */
    task *placeholder = aligned_zeroed(sizeof(task));
    if (l == NULL || placeholder == NULL || pthread_mutex_init(&l->enqueue_mutex, NULL)) {
        free(l);
        free(placeholder);
        return NULL;
    }
    atomic_store(&l->cursor, placeholder);
    l->tail = l->before = l->first = l->cursor_seen = placeholder;
    l->stream = stream;
    nhf_cuda_stream_key(stream, &l->ctx, &l->id); /* which stream, for a default handle */
    l->words = words;
    l->pool = pool;
    pthread_mutex_lock(&pool->mutex);
    l->next = atomic_load(&pool->lanes);
    atomic_store(&pool->lanes, l);
    pthread_mutex_unlock(&pool->mutex);
    return l;
}

static PyObject *set_pause(atomic_long *pause, PyObject *arg) {
    long ns = PyLong_AsLong(arg);
    if (ns == -1 && PyErr_Occurred())
        return NULL;
    atomic_store(pause, ns);
    Py_RETURN_NONE;
}

/* exec_test_pause(ns), exec_done_pause(ns): tests only, see test_pause_ns and
 * test_done_pause_ns. */
static PyObject *py_test_pause(PyObject *self, PyObject *arg) {
    (void)self;
    return set_pause(&test_pause_ns, arg);
}

/* exec_test_paused() -> how many launches are in exec_test_pause's pause now: a
 * test waits for its launch to get there, not for a fixed time. */
static PyObject *py_test_paused(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyLong_FromLong(atomic_load(&test_paused));
}

static PyObject *py_done_pause(PyObject *self, PyObject *arg) {
    (void)self;
    return set_pause(&test_done_pause_ns, arg);
}

/* lane_owners() -> (enqueued, ran, released by enqueues, released by a drain):
 * the lanes' direct tasks, summed over this process's pools (tests only). */
static PyObject *py_lane_owners(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    unsigned long long sums[4] = {0, 0, 0, 0};
    pid_t pid = getpid();
    for (nhf_pool *pool = atomic_load(&all_pools); pool != NULL; pool = pool->next_pool) {
        if (pool->pid != pid)
            continue;
        for (lane *l = atomic_load(&pool->lanes); l != NULL; l = l->next) {
            unsigned long by_drain = atomic_load(&l->released_by_drain);
            sums[0] += atomic_load(&l->direct_enqueued);
            sums[1] += atomic_load(&l->direct_ran);
            sums[2] += atomic_load(&l->direct_released) - by_drain;
            sums[3] += by_drain;
        }
    }
    return Py_BuildValue("(KKKK)", sums[0], sums[1], sums[2], sums[3]);
}

static PyMethodDef methods[] = {
    {"lane_owners", py_lane_owners, METH_NOARGS,
     "lane_owners($module, /)\n--\n\n"
     "Tests only, the lanes' direct tasks: (enqueued, ran, released by enqueues, "
     "released by a drain)"},
    {"exec_test_pause", py_test_pause, METH_O,
     "exec_test_pause($module, ns, /)\n--\n\n"
     "Tests only, pause each executor enqueue after its open check"},
    {"exec_test_paused", py_test_paused, METH_NOARGS,
     "exec_test_paused($module, /)\n--\n\n"
     "Tests only, how many executor enqueues are in that pause now"},
    {"exec_done_pause", py_done_pause, METH_O,
     "exec_done_pause($module, ns, /)\n--\n\n"
     "Tests only, pause each executor task after its done write"},
    {NULL, NULL, 0, NULL},
};

int nhf_pool_init(PyObject *module) { return nhf_add_testing(module, methods); }
