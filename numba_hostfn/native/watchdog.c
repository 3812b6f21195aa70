/* Device faults: the watchdog that finds them, and what it does then.
 *
 * After a device fault (a kernel that traps, an illegal address) CUDA runs no
 * host function of that context again, and writes none of its stream memory
 * operations: every launch still on a stream would wait for ever.  The driver
 * tells no one; a query does (after a fault every stream of the context,
 * one with no work too, answers the sticky error to cuStreamQuery: seen on the
 * H200).  So, only while some launch is in flight, one native thread (the
 * watchdog) walks the launch records, queries each *context* that has one in
 * flight, through the backend's query function (the simulator's, or
 * nhf_cuda_query_context below, which queries the watchdog's own per-thread
 * stream in that context: the same code on both backends), at an interval that
 * backs off from first_ns to max_ns, and on any answer but success, NOT_READY
 * or one that cannot tell (a destroyed context) it *fails* the context's
 * launches (LIFETIME.md, invariant 23).
 *
 * The watchdog never touches a user's stream handle: a stream may be destroyed
 * with launches pending (they still run), and a destroyed handle given to the
 * driver is undefined behaviour (on the H200 it crashed the process).  So the
 * enqueue, on the caller's thread while the caller's stream is valid, notes in
 * the record the stream (a value, compared, never dereferenced) and its
 * context (cuStreamGetCtx, 24 ns on the H200).  Then, for a faulted context:
 *
 *   - each record in flight on it is claimed, by compare-and-swap, from
 *     in flight to failed (a trampoline that comes later finds it failed and
 *     returns at once; one that came first runs it), and completed: the drain
 *     releases its owners on the main thread, and never reuses the record;
 *   - a signal's record also pushes its signal as failed, so the Python side
 *     fails the wait (done_future, async_done) or drops and counts the callback;
 *   - the executor's lanes on the streams of those records fail their tasks
 *     that the stream has not reached, so their pool's threads answer them and
 *     close() returns;
 *   - the context is noted as faulted: enqueues on its streams are refused.
 *
 * With nothing in flight the watchdog parks on a condition variable, and after
 * idle_ms (10 s) parked its thread ends; the enqueue that puts a record in flight
 * wakes it (one load of `active` when it is awake; its mutex and a condition
 * signal when it is parked), or starts it.  Healthy contexts cost a query each
 * per interval; the launch path, cuStreamGetCtx, a compare-and-swap and a few
 * loads while it is awake; with no watchdog set up (NUMBA_HOSTFN_CUDA_WATCHDOG=0),
 * two loads.
 *
 * Threads: the watchdog is native and never touches CPython but through
 * nhf_record_complete and the failed signal's push (notify.c's hook: a pending
 * call, inside the guard).
 */
#include "nhf.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <time.h>

/* An answer that says nothing about a fault: the context is busy or idle, or
 * it is gone (a reset context ran or dropped its work: tests/test_faults.py). */
static bool not_a_fault(int rc) {
    switch (rc) {
    case CUDA_SUCCESS:
    case CUDA_ERROR_NOT_READY:
    case CUDA_ERROR_NOT_INITIALIZED:
    case CUDA_ERROR_DEINITIALIZED:
    case CUDA_ERROR_INVALID_CONTEXT:
    case CUDA_ERROR_CONTEXT_ALREADY_IN_USE:
    case CUDA_ERROR_INVALID_HANDLE:
    case CUDA_ERROR_CONTEXT_IS_DESTROYED:
    case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED:
        return true;
    default:
        return false;
    }
}

/* ---- the faulted contexts ------------------------------------------------------ */

/* The contexts noted faulted, in the order their faults were found: chunks of
 * FAULTS_PER_CHUNK entries, allocated as needed and never freed, so that a reader
 * walks the published entries without a lock (a fixed table of 64 stopped noting
 * at the 65th faulted context: its enqueues were no longer refused by us, and its
 * errors named the stream of another context's fault of the same code). */
#define FAULTS_PER_CHUNK 64
#define FAULT_CHUNKS 1024

typedef struct {
    void *ctx;
    unsigned code;
    void *stream; /* the stream the fault was found on */
} fault_entry;

static fault_entry *fault_chunks[FAULT_CHUNKS]; /* written under fault_lock, before nfaults */
static atomic_int nfaults; /* entries published (written under fault_lock) */
static pthread_mutex_t fault_lock = PTHREAD_MUTEX_INITIALIZER;

/* Entry i < nfaults (as loaded): its chunk was published before nfaults. */
static fault_entry *fault_at(int i) {
    return &fault_chunks[i / FAULTS_PER_CHUNK][i % FAULTS_PER_CHUNK];
}

static struct {
    pthread_mutex_t mutex;
    pthread_cond_t wake;   /* a record went in flight while parked */
    atomic_int active;     /* polling: an enqueue need not wake it */
    int started;           /* under mutex */
    int parked;            /* under mutex: its thread waits, not yet woken (tests) */
    pthread_t thread;
    _Atomic(nhf_query_fn) query;
    _Atomic(nhf_context_fn) context_of;
    atomic_long first_ns, max_ns; /* the backoff */
    atomic_long idle_ms;   /* parked this long, the thread ends */
    atomic_long failed;    /* records failed */
    atomic_long polls;     /* polls done (tests: the watchdog parks) */
    atomic_long wakes;     /* times an enqueue woke it */
    atomic_int last_answer; /* the last query's answer (diagnoses: -1 none yet) */
    atomic_long unasked;   /* CUDA queries not made (their answer: NOT_READY) */
} dog = {.mutex = PTHREAD_MUTEX_INITIALIZER,
         .wake = PTHREAD_COND_INITIALIZER,
         .first_ns = 1000000,
         .max_ns = 20000000,
         .idle_ms = 10000,
         .last_answer = -1};

bool nhf_fault_note(void *ctx, unsigned code, void *stream) {
    bool added = false;
    pthread_mutex_lock(&fault_lock);
    int n = atomic_load(&nfaults);
    bool known = false;
    for (int i = 0; i < n && !known; i++)
        known = fault_at(i)->ctx == ctx;
    int chunk = n / FAULTS_PER_CHUNK;
    if (!known && chunk < FAULT_CHUNKS && fault_chunks[chunk] == NULL)
        fault_chunks[chunk] = calloc(FAULTS_PER_CHUNK, sizeof(fault_entry));
    if (!known && chunk < FAULT_CHUNKS && fault_chunks[chunk] != NULL) {
        *fault_at(n) = (fault_entry){ctx, code, stream};
        atomic_store(&nfaults, n + 1);
        added = true;
    }
    pthread_mutex_unlock(&fault_lock);
    return added;
}

static unsigned fault_of_context(void *ctx) {
    int n = atomic_load(&nfaults);
    for (int i = 0; i < n; i++)
        if (fault_at(i)->ctx == ctx)
            return fault_at(i)->code;
    return 0;
}

uint64_t nhf_fault_of_stream(void *stream) {
    if (atomic_load_explicit(&nfaults, memory_order_relaxed) == 0)
        return 0; /* the healthy path: one load */
    nhf_context_fn context_of = atomic_load(&dog.context_of);
    void *ctx = NULL;
    if (context_of == NULL || context_of(stream, &ctx) != 0)
        return 0;
    unsigned code = fault_of_context(ctx);
    return code == 0 ? 0 : NHF_FAULTED | code;
}

/* ---- failing what will never run --------------------------------------------------- */

/* What the layers above do with a failed record and a faulted stream (nhf.h):
 * set once each at module load, before any launch, by notify.c and executor.c,
 * which the watchdog so calls without calling up into their files. */
static struct {
    _Atomic(nhf_record_failed_fn) record_failed;
    _Atomic(nhf_stream_faulted_fn) stream_faulted;
} hooks;

void nhf_fault_on_record_failed(nhf_record_failed_fn hook) {
    atomic_store(&hooks.record_failed, hook);
}

void nhf_fault_on_stream_faulted(nhf_stream_faulted_fn hook) {
    atomic_store(&hooks.stream_faulted, hook);
}

bool nhf_fault_fail_record(nhf_record *record, unsigned code, unsigned long state) {
    /* From exactly the state the caller saw: a record run, released and taken
     * again for a later launch meanwhile (a new incarnation, maybe in flight on a
     * healthy stream) is not this one, and the compare-and-swap fails. */
    if (NHF_PHASE(state) != NHF_IN_FLIGHT ||
        !atomic_compare_exchange_strong(&record->state, &state,
                                        NHF_WITH_PHASE(state, NHF_FAILED)))
        return false;
    nhf_record_failed_fn record_failed = atomic_load(&hooks.record_failed);
    if (record_failed != NULL) /* notify.c: a signal's record pushes its signal as failed */
        record_failed(record, code);
    atomic_fetch_add(&dog.failed, 1);
    nhf_record_complete(record); /* released on the main thread (invariant 2) */
    return true;
}

struct survey;
static void survey_pair(void *ctx, void *stream, long n, void *survey_);

typedef struct {
    void *ctx;
    unsigned code;
    struct survey *failed; /* the (context, stream) pairs of the records failed */
} fail_job;

static void fail_on_context(nhf_record *record, void *job_) {
    fail_job *job = job_;
    unsigned long state = atomic_load(&record->state);
    if (NHF_PHASE(state) != NHF_IN_FLIGHT ||
        atomic_load_explicit(&record->watch_ctx, memory_order_relaxed) != job->ctx)
        return;
    /* Read before the fail: once completed, the record may serve another launch
     * (a fail from the state seen after a reuse is refused by its compare). */
    void *stream = atomic_load_explicit(&record->watch, memory_order_relaxed);
    if (nhf_fault_fail_record(record, job->code, state))
        survey_pair(job->ctx, stream, 1, job->failed);
}

/* ---- the watchdog's thread ---------------------------------------------------------- */

/* The distinct (context, stream) pairs of what is in flight: records, and the
 * lanes' direct tasks. */
typedef struct survey {
    struct watched {
        void *ctx, *stream;
    } *pairs;
    size_t count, capacity;
    long in_flight;
    bool lost;       /* a pair left out: no memory to grow pairs */
    bool fail_grows; /* tests only: each growth fails, as with no memory */
} survey;

/* Tests only: the growth of a faulted context's survey of streams fails, as a
 * realloc with no memory does (watchdog_fail_stream_survey). */
static atomic_bool test_fail_stream_survey;

/* The executor's lanes with direct tasks outstanding (nhf_watch_on_lanes). */
static _Atomic(void (*)(nhf_watch_visit_fn visit, void *arg)) lanes_each;

void nhf_watch_on_lanes(void (*each)(nhf_watch_visit_fn visit, void *arg)) {
    atomic_store(&lanes_each, each);
}

/* A watched (context, stream) with n launches in flight there. */
static void survey_pair(void *ctx, void *stream, long n, void *survey_) {
    survey *s = survey_;
    s->in_flight += n;
    for (size_t i = 0; i < s->count; i++)
        if (s->pairs[i].ctx == ctx && s->pairs[i].stream == stream)
            return;
    if (s->count == s->capacity) {
        size_t capacity = s->capacity ? 2 * s->capacity : 16;
        struct watched *pairs =
            s->fail_grows ? NULL : realloc(s->pairs, capacity * sizeof(*pairs));
        if (pairs == NULL) {
            s->lost = true; /* the poll's: its context at the next poll; fail_context's: */
            return;         /* every lane of the context answered */
        }
        s->pairs = pairs;
        s->capacity = capacity;
    }
    s->pairs[s->count++] = (struct watched){ctx, stream};
}

static void survey_record(nhf_record *record, void *survey_) {
    if (NHF_PHASE(atomic_load(&record->state)) != NHF_IN_FLIGHT)
        return;
    void *ctx = atomic_load_explicit(&record->watch_ctx, memory_order_relaxed);
    if (ctx == NULL)
        return; /* not watched: nothing to query for it */
    survey_pair(ctx, atomic_load_explicit(&record->watch, memory_order_relaxed), 1, survey_);
}

/* The survey of what is in flight: the records, and the lanes' direct tasks. */
static void survey_all(survey *s) {
    s->count = 0;
    s->in_flight = 0;
    s->lost = false;
    nhf_records_each(survey_record, s);
    void (*each)(nhf_watch_visit_fn, void *) = atomic_load(&lanes_each);
    if (each != NULL)
        each(survey_pair, s);
}

/* The watchdog's thread: context ctx answered code, a fault.  Note it (found on
 * the first of its streams with a launch in flight), fail its records, and
 * answer the executor tasks on each of its streams: those of the survey, and
 * those of every record failed here, which may have gone in flight after the
 * survey.  A failed record is in no later survey, so its stream, if it is a
 * lane's whose other tasks carry records too, would never be answered: the
 * lane's tasks stayed outstanding, and close() waited for ever.  So where a
 * stream was left out (no memory for the list, in this survey or the poll's),
 * every lane of the context is answered instead (stream NULL): none of them
 * will be reached again. */
static void fail_context(const survey *s, void *ctx, unsigned code) {
    void *found = NULL;
    for (size_t i = 0; i < s->count && found == NULL; i++)
        if (s->pairs[i].ctx == ctx)
            found = s->pairs[i].stream;
    (void)nhf_fault_note(ctx, code, found);
    survey streams = {0}; /* the context's streams: the survey's, then the failed */
    streams.fail_grows = atomic_load(&test_fail_stream_survey);
    for (size_t i = 0; i < s->count; i++)
        if (s->pairs[i].ctx == ctx)
            survey_pair(ctx, s->pairs[i].stream, 0, &streams);
    fail_job job = {ctx, code, &streams};
    nhf_records_each(fail_on_context, &job);
    nhf_stream_faulted_fn stream_faulted = atomic_load(&hooks.stream_faulted);
    for (size_t i = 0; i < streams.count && stream_faulted != NULL; i++)
        stream_faulted(streams.pairs[i].stream, ctx, code); /* executor.c: its lanes there */
    if ((streams.lost || s->lost) && stream_faulted != NULL)
        stream_faulted(NULL, ctx, code);
    free(streams.pairs);
}

/* One poll: query every context with a record in flight, once; fail the
 * faulted ones.  Returns how many watched records were in flight. */
static long poll_once(survey *s) {
    survey_all(s);
    nhf_query_fn query = atomic_load(&dog.query);
    for (size_t i = 0; i < s->count && query != NULL; i++) {
        bool first = true; /* the first pair of its context: query it */
        for (size_t j = 0; j < i && first; j++)
            first = s->pairs[j].ctx != s->pairs[i].ctx;
        if (!first)
            continue; /* asked already */
        /* A context noted faulted is not asked again: what went in flight on it
         * since (an enqueue that passed its fault check first) is failed too. */
        unsigned known = fault_of_context(s->pairs[i].ctx);
        int rc = known != 0 ? (int)known : query(s->pairs[i].ctx);
        atomic_store_explicit(&dog.last_answer, rc, memory_order_relaxed);
        if (!not_a_fault(rc))
            fail_context(s, s->pairs[i].ctx, (unsigned)rc);
    }
    atomic_fetch_add(&dog.polls, 1);
    return s->in_flight;
}

/* Under dog.mutex: wait until woken; false if idle_ms passed first (the
 * thread then ends, and the next wake starts another). */
static bool park_locked(void) {
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    long ns = deadline.tv_nsec + (atomic_load(&dog.idle_ms) % 1000) * 1000000L;
    deadline.tv_sec += atomic_load(&dog.idle_ms) / 1000 + ns / 1000000000L;
    deadline.tv_nsec = ns % 1000000000L;
    dog.parked = 1;
    while (!atomic_load(&dog.active)) {
        if (pthread_cond_timedwait(&dog.wake, &dog.mutex, &deadline) == ETIMEDOUT &&
            !atomic_load(&dog.active)) {
            dog.parked = 0;
            dog.started = 0;
            return false;
        }
    }
    dog.parked = 0;
    return true;
}

/* The watchdog's thread (native, named nhf-watchdog): it touches CPython only
 * through nhf_record_complete and the failed signal's push, inside the guard. */
/* The running watchdog thread (pthread_self() as an integer; 0 while none runs),
 * and whether its capture mode is relaxed yet (the CUDA query's; touched by that
 * one thread only, reset as each starts: a new thread starts only after the last
 * one cleared dog.started under dog.mutex).  Not _Thread_local: the dynamic TLS
 * of a dlopen'ed module is allocated lazily by the loader, which ThreadSanitizer
 * reports as a race at thread exit (simulator.c, trampolines.c: pthread keys). */
static atomic_ulong watchdog_self;
static bool watchdog_relaxed;

/* The end of the interpreter's finalization (Py_AtExit, after every atexit handler,
 * before the C library's exit handlers tear the driver down): the watchdog polls
 * no more.  Not the guard's close: that is the first atexit handler, and a later
 * one (an executor's close(), a done_future's result()) would wait for ever on a
 * fault found after it.  Failing then touches no CPython: the completions and the
 * failed signals' pushes schedule no pending call once the guard is closed. */
static atomic_int dog_finished; /* set at Py_AtExit */
static atomic_int dog_polling;  /* a poll is under way */
static atomic_int dog_at_exit_set; /* else the guard's close ends the polls, as before */

static bool dog_may_poll(void) {
    atomic_store(&dog_polling, 1);
    if (atomic_load(&dog_finished) || (!atomic_load(&dog_at_exit_set) && !nhf_guard_open())) {
        atomic_store(&dog_polling, 0);
        return false;
    }
    return true;
}

static void dog_at_exit(void) {
    atomic_store(&dog_finished, 1);
    for (int waited = 0; atomic_load(&dog_polling) && waited < 2000; waited++)
        nhf_sleep_ns(1000000); /* a poll under way ends (bounded, as the guard's wait) */
}

bool nhf_on_watchdog_thread(void) {
    unsigned long self = atomic_load_explicit(&watchdog_self, memory_order_relaxed);
    return self != 0 && pthread_equal((pthread_t)self, pthread_self());
}

static void *dog_main(void *unused) {
    (void)unused;
    watchdog_relaxed = false;
    atomic_store(&watchdog_self, (unsigned long)pthread_self());
    (void)prctl(PR_SET_NAME, "nhf-watchdog", 0UL, 0UL, 0UL);
    survey s = {NULL, 0, 0, 0};
    long interval = atomic_load(&dog.first_ns);
    pthread_mutex_lock(&dog.mutex);
    for (;;) {
        if (!atomic_load(&dog.active)) {
            if (!park_locked())
                break;
            interval = atomic_load(&dog.first_ns);
        }
        pthread_mutex_unlock(&dog.mutex);
        nhf_sleep_ns(interval);
        long max = atomic_load(&dog.max_ns);
        interval = 2 * interval < max ? 2 * interval : max;
        /* After the interpreter's finalization (dog_at_exit) nothing is failed
         * any more: leak rather than touch a driver being torn down. */
        long in_flight = 0;
        if (dog_may_poll()) {
            in_flight = poll_once(&s);
            atomic_store(&dog_polling, 0);
        }
        pthread_mutex_lock(&dog.mutex);
        if (in_flight == 0) {
            /* Park, unless a record went in flight meanwhile: an enqueue marks
             * its record, then reads active; this writes active, then looks
             * again (both sequentially consistent), so one of the two sees
             * the other. */
            atomic_store(&dog.active, 0);
            pthread_mutex_unlock(&dog.mutex);
            s.count = 0;
            s.in_flight = 0;
            if (dog_may_poll()) {
                survey_all(&s);
                atomic_store(&dog_polling, 0);
            }
            pthread_mutex_lock(&dog.mutex);
            if (s.in_flight > 0)
                atomic_store(&dog.active, 1);
        }
    }
    atomic_store(&watchdog_self, 0UL);
    pthread_mutex_unlock(&dog.mutex);
    free(s.pairs);
    return NULL;
}

/* Under dog.mutex: wake the watchdog, starting it the first time. */
static void wake_locked(void) {
    if (atomic_load(&dog.active) || atomic_load(&dog.query) == NULL)
        return;
    if (!dog.started) {
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        dog.started = pthread_create(&dog.thread, &attr, dog_main, NULL) == 0;
        pthread_attr_destroy(&attr);
        if (dog.started) /* named at once, not when it first runs (tests count it) */
            (void)pthread_setname_np(dog.thread, "nhf-watchdog");
        if (!dog.started)
            return; /* tried again at the next enqueue */
    }
    atomic_store(&dog.active, 1);
    atomic_fetch_add(&dog.wakes, 1);
    dog.parked = 0; /* woken, though it has not run yet: a poll may follow this wake */
    pthread_cond_signal(&dog.wake);
}

void *nhf_watch_context(void *stream) {
    nhf_context_fn context_of = atomic_load_explicit(&dog.context_of, memory_order_acquire);
    if (context_of == NULL || atomic_load_explicit(&dog.query, memory_order_relaxed) == NULL)
        return NULL; /* no watchdog: not watched */
    void *ctx = NULL;
    if (context_of(stream, &ctx) != 0)
        ctx = NULL; /* the enqueue will fail too, or the stream is not the driver's */
    return ctx;
}

void nhf_watch_prepare(nhf_record *record, void *stream) {
    void *ctx = nhf_watch_context(stream);
    if (ctx == NULL)
        return; /* not watched: both fields stay NULL, as nhf_record_take left them */
    atomic_store_explicit(&record->watch, stream, memory_order_relaxed);
    atomic_store_explicit(&record->watch_ctx, ctx, memory_order_relaxed);
}

void nhf_watch_wake(void) {
    if (atomic_load(&dog.active))
        return;
    pthread_mutex_lock(&dog.mutex);
    wake_locked();
    pthread_mutex_unlock(&dog.mutex);
}

void nhf_watch_enqueued(nhf_record *record, unsigned long taken) {
    if (atomic_load_explicit(&record->watch_ctx, memory_order_relaxed) == NULL)
        return; /* not watched (no watchdog): its phase stays taken until it runs */
    unsigned long expected = taken;
    if (!atomic_compare_exchange_strong(&record->state, &expected,
                                        NHF_WITH_PHASE(taken, NHF_IN_FLIGHT)))
        return; /* it ran already (or was released and taken again) */
    nhf_watch_wake();
}

/* ---- the CUDA backend's query ------------------------------------------------------- */

/* Its entry points are the driver table's (driver.h): the backend configures
 * the watchdog with these two only once the table has all five it calls. */

/* The watchdog's thread: a CUDA context's state, as cuStreamQuery of the
 * watchdog thread's own per-thread default stream in it answers (after a fault,
 * every stream of the context answers the sticky error, an idle one too: seen
 * on the H200).  No user handle is touched, and that stream never captures.
 * The thread's capture mode is relaxed, so the query never invalidates another
 * thread's capture in global mode (torch's default): without it, it does (seen
 * on the H200).  The mode is the thread's, and a watchdog thread that ended
 * (idle) is followed by a new one, which may have the same pthread_t: so the
 * flag is reset as each watchdog thread starts (dog_main), not kept by id. */
static int nhf_cuda_query_context(void *ctx) {
    if (!watchdog_relaxed) {
        int mode = CU_STREAM_CAPTURE_MODE_RELAXED;
        nhf_cuThreadExchangeStreamCaptureMode_fn exchange =
            NHF_CU(cuThreadExchangeStreamCaptureMode);
        if (exchange == NULL || exchange(&mode) != 0) {
            atomic_fetch_add(&dog.unasked, 1);
            return CUDA_ERROR_NOT_READY; /* not queried: that could invalidate a capture */
        }
        watchdog_relaxed = true;
    }
    nhf_cuCtxPushCurrent_fn push = NHF_CU(cuCtxPushCurrent);
    nhf_cuStreamQuery_fn query = NHF_CU(cuStreamQuery);
    nhf_cuCtxPopCurrent_fn pop = NHF_CU(cuCtxPopCurrent);
    if (push == NULL || query == NULL || pop == NULL) {
        atomic_fetch_add(&dog.unasked, 1);
        return CUDA_ERROR_NOT_READY; /* a driver table without them: nothing to ask */
    }
    int rc = push(ctx);
    if (rc != 0)
        return rc; /* a destroyed context: not a fault (not_a_fault) */
    rc = query(CU_STREAM_PER_THREAD);
    void *popped = NULL;
    (void)pop(&popped);
    return rc;
}

/* Any thread: a CUDA stream's context (cuStreamGetCtx).  The form of CUDA 12.5
 * and later (cuGetProcAddress at NHF_DRIVER_ABI_VERSION gives it) answers, for a
 * green context's stream, the device's primary context, and the green context
 * in the third out, which is not needed: a fault in a green context is the
 * device's, and the primary context and every other green context refuse work
 * after it (an H200, 2026-12-06: test_device_faults.py::
 * test_a_fault_in_a_green_context_reaches_its_waits).  The older form answers the
 * green context's own CUcontext, which a fault fails as well. */
static int nhf_cuda_context_of(void *stream, void **ctx) {
    nhf_cuStreamGetCtx_fn get_ctx = NHF_CU(cuStreamGetCtx);
    if (get_ctx == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    void *green = NULL; /* written by the newer form only; not read */
    *ctx = NULL;
    return get_ctx(stream, ctx, &green);
}

/* ---- from Python ------------------------------------------------------------------------ */

/* The backends' query functions, by route (nhf_watchdog_add_backend): written at
 * module load, with the GIL, before watchdog_configure reads them. */
static struct {
    nhf_query_fn query;
    nhf_context_fn context_of;
} backends[NHF_NROUTES];

void nhf_watchdog_add_backend(int route, nhf_query_fn query, nhf_context_fn context_of) {
    backends[route].query = query;
    backends[route].context_of = context_of;
}

/* watchdog_configure(route[, first_us, max_us[, idle_ms]]): query the backend
 * whose route is route (its functions, picked here), with the backoff, and how
 * long a parked watchdog keeps its thread (tests change them). */
static PyObject *py_watchdog_configure(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 1 && nargs != 3 && nargs != 4) {
        PyErr_SetString(PyExc_TypeError,
                        "watchdog_configure(route[, first_us, max_us[, idle_ms]])");
        return NULL;
    }
    long route = PyLong_AsLong(args[0]);
    if (route == -1 && PyErr_Occurred())
        return NULL;
    if (route <= NHF_ROUTE_NONE || route >= NHF_NROUTES || backends[route].query == NULL) {
        PyErr_Format(PyExc_ValueError,
                     "watchdog_configure: %ld is no backend's route (_core.ROUTE_CUDA or "
                     "ROUTE_SIM)",
                     route);
        return NULL;
    }
    if (nargs >= 3) {
        long first = PyLong_AsLong(args[1]);
        if (first == -1 && PyErr_Occurred())
            return NULL;
        long max = PyLong_AsLong(args[2]);
        if (max == -1 && PyErr_Occurred())
            return NULL;
        if (first < 1 || max < first) {
            PyErr_SetString(PyExc_ValueError, "expected 1 <= first_us <= max_us");
            return NULL;
        }
        atomic_store(&dog.first_ns, first * 1000);
        atomic_store(&dog.max_ns, max * 1000);
    }
    if (nargs == 4) {
        long idle = PyLong_AsLong(args[3]);
        if (idle < 1) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "expected idle_ms >= 1");
            return NULL;
        }
        atomic_store(&dog.idle_ms, idle);
    }
    atomic_store(&dog.context_of, backends[route].context_of);
    atomic_store(&dog.query, backends[route].query);
    Py_RETURN_NONE;
}

/* fault_info() -> [(context, code, stream), ...]: the faulted contexts. */
static PyObject *py_fault_info(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    PyObject *list = PyList_New(0);
    if (list == NULL)
        return NULL;
    /* Without fault_lock, as fault_of_context reads: an entry is written once,
     * before nfaults publishes it.  Held, the lock would be held across
     * allocations, which may run the collector and a finalizer that asks this
     * again (a self-deadlock on the lock, in review). */
    int n = atomic_load(&nfaults);
    for (int i = 0; i < n; i++) {
        fault_entry *f = fault_at(i);
        PyObject *item = Py_BuildValue("(NIN)", PyLong_FromVoidPtr(f->ctx), f->code,
                                       PyLong_FromVoidPtr(f->stream));
        if (item == NULL || PyList_Append(list, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(list);
            return NULL;
        }
        Py_DECREF(item);
    }
    return list;
}

/* watchdog_stats() -> dict: failed (records), polls, wakes, active, running
 * (its thread exists), parked (its thread waits for a wake: not active is not
 * enough, since after a poll that found nothing it surveys once more before it
 * parks, and may go on polling), last_answer (the last query's CUresult, -1 if
 * none yet) and unasked (CUDA queries not made): what a wait that never
 * resolves heard. */
static PyObject *py_watchdog_stats(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    /* One snapshot of parked, wakes and polls: a wake counts itself and clears
     * parked under the mutex, and a parked thread made its last poll before it took
     * the mutex, so a poll after a snapshot that saw it parked comes after a wake
     * that this snapshot did not count. */
    pthread_mutex_lock(&dog.mutex);
    int running = dog.started, parked = dog.parked;
    long wakes = atomic_load(&dog.wakes), polls = atomic_load(&dog.polls);
    pthread_mutex_unlock(&dog.mutex);
    return Py_BuildValue("{slslslsisisisisl}", "failed", atomic_load(&dog.failed), "polls",
                         polls, "wakes", wakes, "active",
                         atomic_load(&dog.active), "running", running, "parked", parked,
                         "last_answer", atomic_load(&dog.last_answer), "unasked",
                         atomic_load(&dog.unasked));
}

/* watchdog_fail_stream_survey(fail): tests only, see test_fail_stream_survey. */
static PyObject *py_fail_stream_survey(PyObject *self, PyObject *arg) {
    (void)self;
    int fail = PyObject_IsTrue(arg);
    if (fail < 0)
        return NULL;
    atomic_store(&test_fail_stream_survey, fail != 0);
    Py_RETURN_NONE;
}

/* stream_fault(stream) -> 0 or the code of its context's noted fault. */
static PyObject *py_stream_fault(PyObject *self, PyObject *arg) {
    (void)self;
    void *stream;
    if (nhf_address_arg(arg, &stream) < 0)
        return NULL;
    uint64_t fault;
    Py_BEGIN_ALLOW_THREADS /* cuStreamGetCtx: no driver call holds the GIL (invariant 10) */
    fault = nhf_fault_of_stream(stream);
    Py_END_ALLOW_THREADS
    return PyLong_FromUnsignedLong((unsigned long)(fault & NHF_CURESULT_MASK));
}

/* stream_fault_found(stream) -> the stream its context's noted fault was found on, or 0:
 * the fault of the stream's own context, not another's of the same code. */
static PyObject *py_stream_fault_found(PyObject *self, PyObject *arg) {
    (void)self;
    void *stream, *found = NULL;
    if (nhf_address_arg(arg, &stream) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS /* cuStreamGetCtx: no driver call holds the GIL (invariant 10) */
    nhf_context_fn context_of = atomic_load(&dog.context_of);
    void *ctx = NULL;
    if (atomic_load(&nfaults) != 0 && context_of != NULL && context_of(stream, &ctx) == 0) {
        pthread_mutex_lock(&fault_lock);
        for (int i = 0; i < atomic_load(&nfaults) && found == NULL; i++)
            if (fault_at(i)->ctx == ctx)
                found = fault_at(i)->stream;
        pthread_mutex_unlock(&fault_lock);
    }
    Py_END_ALLOW_THREADS
    return PyLong_FromVoidPtr(found);
}

static PyMethodDef methods[] = {
    {"stream_fault_found", py_stream_fault_found, METH_O,
     "stream_fault_found($module, stream, /)\n--\n\n"
     "The stream the noted fault of the stream's context was found on, or 0."},
    {"watchdog_configure", (PyCFunction)(void (*)(void))py_watchdog_configure, METH_FASTCALL,
     "watchdog_configure($module, route, first_us=<unrepresentable>, "
     "max_us=<unrepresentable>, idle_ms=<unrepresentable>, /)\n--\n\n"
     "watchdog_configure(route[, first_us, max_us[, idle_ms]]): query the backend of route."},
    {"fault_info", py_fault_info, METH_NOARGS,
     "fault_info($module, /)\n--\n\n"
     "The faulted contexts: (context, code, stream)."},
    {"stream_fault", py_stream_fault, METH_O,
     "stream_fault($module, stream, /)\n--\n\n"
     "The noted fault of a stream's context, or 0."},
    {NULL, NULL, 0, NULL},
};

static void find_record(nhf_record *record, void *found_) {
    void **found = found_;
    if ((void *)record == found[0])
        found[1] = record;
}

/* fail_record(record, state) -> whether the watchdog's fail from that state word took
 * the record (nhf_fault_fail_record, with CUDA_ERROR_LAUNCH_FAILED): for a test that
 * a state seen before the record was run, released and taken again fails nothing. */
static PyObject *py_fail_record(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    void *address;
    if (nhf_check_nargs("fail_record(record, state)", nargs, 2) < 0 ||
        nhf_address_arg(args[0], &address) < 0)
        return NULL;
    unsigned long state = PyLong_AsUnsignedLong(args[1]);
    if (state == (unsigned long)-1 && PyErr_Occurred())
        return NULL;
    void *found[2] = {address, NULL};
    nhf_records_each(find_record, found);
    if (found[1] == NULL) {
        PyErr_SetString(PyExc_ValueError, "fail_record: not a launch record's address");
        return NULL;
    }
    const unsigned launch_failed = 719; /* CUDA_ERROR_LAUNCH_FAILED */
    return PyBool_FromLong(nhf_fault_fail_record(found[1], launch_failed, state));
}

static PyMethodDef testing_methods[] = {
    {"fail_record", (PyCFunction)(void (*)(void))py_fail_record, METH_FASTCALL,
     "fail_record($module, record, state, /)\n--\n\n"
     "Fail a record from the state word given, as the watchdog does (for tests)."},
    {"watchdog_stats", py_watchdog_stats, METH_NOARGS,
     "watchdog_stats($module, /)\n--\n\n"
     "The watchdog's counters."},
    {"watchdog_fail_stream_survey", py_fail_stream_survey, METH_O,
     "watchdog_fail_stream_survey($module, fail, /)\n--\n\n"
     "Whether a faulted context's list of streams fails to grow, as with no memory."},
    {NULL, NULL, 0, NULL},
};

int nhf_watchdog_init(PyObject *module) {
    if (PyModule_AddFunctions(module, methods) < 0 || nhf_add_testing(module, testing_methods) < 0)
        return -1;
    nhf_watchdog_add_backend(NHF_ROUTE_CUDA, nhf_cuda_query_context, nhf_cuda_context_of);
    if (Py_AtExit(dog_at_exit) == 0) /* refused (32 registered): the guard's close ends them */
        atomic_store(&dog_at_exit_set, 1);
    return 0;
}
