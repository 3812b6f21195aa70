/* The native core of numba_hostfn: what the CUDA driver's (or a pool's, or the
 * simulator's) threads run, and host_launch's common cases.
 *
 * One header for the whole extension module (numba_hostfn._core).  Each .c file
 * is one concern, as docs/design.md's module map lists; LIFETIME.md (in the
 * package) states the invariants, and names the function that keeps each.
 *
 * Threads.  A function marked "any thread" may run on a thread that Python did
 * not create and that holds no GIL (the driver's host-function thread, a pool
 * thread, a simulated stream's thread).  Such a function touches CPython only
 * between nhf_guard_enter() and nhf_guard_leave(), and only after taking the GIL
 * with nhf_gil_take().  A function marked "GIL held" is called from Python.
 *
 * Layers.  The files call only down (or sideways, without a cycle), as
 * docs/design.md's C map numbers them and tests/test_native_layers.py checks;
 * where a lower file must reach a higher one, the higher one registers a hook
 * at module load (the watchdog's nhf_fault_on_record_failed and
 * nhf_fault_on_stream_faulted and nhf_watchdog_add_backend, the enqueue's
 * nhf_enqueue_add_route, the trampolines' nhf_trampoline_add).  Bottom up:
 *
 *    0  util.c          argument helpers, nhf_add_address
 *    1  driver.c        the CUDA driver's entry points: one table (driver.h)
 *    1  guard.c         the interpreter guard, the GIL on foreign threads, fork
 *    1  compiled.c      CompiledBase: compiled code and its launch kind
 *    1  buffer_ref.c    BufferRef, format_holds_objects
 *    2  records.c       launch records
 *    3  trampolines.c   what the driver calls
 *    4  kinds.c         the table of launch kinds, the owner rule
 *    4  watchdog.c      device faults
 *    5  enqueue.c       the enqueue every launch goes through
 *    6  cuda.c          the CUDA backend: its enqueue, graphs, captures, pinned words
 *    6  simulator.c     the simulator: streams, graphs, its word operations
 *    6  notify.c        signals to Python, the dispatcher
 *    7  parallel_copy.c the executor's shared copies      (executor.h: 7 to 11)
 *    8  graph_slots.c   the executor's graph slots, GraphSlot
 *    9  pool.c          the executor's pool: threads, lanes, tasks, life
 *   10  executor_cuda.c the executor's enqueue on a CUDA stream
 *   10  executor_sim.c  the executor's enqueue on a simulated stream
 *   11  executor.c      ExecutorBase
 *   12  launch_config.c configure_launch, launch counts, interned names
 *   13  host_launch.c   host_launch's common cases (the fast path)
 *   14  module.c        the module root: calls every *_init, called by none
 *
 * Errors.  One rule for what crosses to Python.  A builtin raises (sets an
 * exception and returns NULL) for its own arguments and for memory (a record
 * not taken: NHF_NO_RECORD).  An enqueue's answer, whoever refused (the driver's
 * CUresult, a capturing stream, a closed executor or queue, a host function that
 * may not enqueue, a faulted context), is a status word (NHF_* flags, a CUresult
 * in the low 32 bits), which Python reads in one place (Backend.refusal_error);
 * any other driver call answers (value, CUresult, call) (cuda.c), which the
 * backend reads in one place (CudaBackend._answer).  The two never mix: a status
 * word or an answer comes with no exception set.
 *
 * Locks.  Native data has its own locks or atomics, never the GIL alone: the
 * free list of launch records has a mutex, the completed stack is lock-free,
 * counters are atomics.  No thread waits for the GIL while it holds a native
 * mutex, with one exception: a Dispatcher's batch lock is held across the
 * entries' Python code, so a thread that must wait for it drops the GIL first
 * (dispatcher_run).  Holding the GIL while taking any other never deadlocks.
 */
#ifndef NHF_H
#define NHF_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "driver.h"

/* A cache line.  Globals written often by one thread and read or written often by
 * others sit in a struct whose first member is _Alignas(NHF_CACHE_LINE): its size
 * is then a multiple of the line, and no other variable shares its lines (false
 * sharing: each write would reach every thread that reads a neighbour). */
#define NHF_CACHE_LINE 64

/* GIL held: *counter += change as a relaxed load and store, no locked instruction
 * (the GIL makes the one writer); atomic for a reader without the GIL.  The launch
 * counts and the records held (docs/compatibility.md: what leans on the GIL). */
static inline void nhf_gil_count(atomic_long *counter, long change) {
    long n = atomic_load_explicit(counter, memory_order_relaxed);
    atomic_store_explicit(counter, n + change, memory_order_relaxed);
}

/* ---- shared helpers (util.c) ------------------------------------------------- */

/* An int argument as an address; -1 and a TypeError set if it is not one. */
int nhf_address_arg(PyObject *value, void **out);
/* An int argument as a pointer that must not be NULL; NULL with an error set
 * (a ValueError "a NULL <what>" for 0). */
void *nhf_pointer_arg(PyObject *value, const char *what);
/* 0 if nargs == expected, else -1 with a TypeError naming usage. */
int nhf_check_nargs(const char *usage, Py_ssize_t nargs, Py_ssize_t expected);
/* Exactly `expected` address arguments, into out. */
int nhf_address_args(const char *usage, PyObject *const *args, Py_ssize_t nargs,
                     Py_ssize_t expected, void **out);
/* At module load: a pthread key with no destructor, made unless *made (then set);
 * -1 with an OSError set if pthread_key_create refused.  The native core keeps its
 * per-thread values in pthread keys, never _Thread_local: a dlopen'ed module's
 * dynamic TLS is allocated lazily by glibc and freed by a later thread reusing the
 * stack, a race ThreadSanitizer reports (the stack cache's lock is glibc's own). */
int nhf_key_create_once(pthread_key_t *key, bool *made);
/* Add methods to the module's _testing submodule (made by the first call): the
 * hooks for tests only (counters, stand-ins, pauses), apart from the module's API. */
int nhf_add_testing(PyObject *module, PyMethodDef *methods);
/* Add name = address (an int) to the module. */
int nhf_add_address(PyObject *module, const char *name, void *address);
/* An int (PyLong_Check already true) as an unsigned 64-bit number: (unsigned
 * long long)-1 with an OverflowError set for a negative or too large one.  Where
 * unsigned long is 64 bits, PyLong_AsUnsignedLong: a loop over the int's digits,
 * where PyLong_AsUnsignedLongLong converts every int over one digit (an address)
 * byte by byte (CPython 3.10-3.13), about 6x slower: 12.8 against 2.0 ns measured,
 * and a launch converts two or more. */
static inline unsigned long long nhf_as_u64(PyObject *value) {
#if ULONG_MAX == UINT64_MAX
    return PyLong_AsUnsignedLong(value);
#else
    return PyLong_AsUnsignedLongLong(value);
#endif
}
/* CLOCK_MONOTONIC, in nanoseconds. */
static inline long nhf_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}
/* ns nanoseconds from now on CLOCK_MONOTONIC: a deadline for pthread_cond_timedwait
 * on a condition variable made by nhf_cond_init_monotonic. */
static inline struct timespec nhf_deadline_ns(long ns) {
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    long sum = until.tv_nsec + ns;
    until.tv_sec += sum / 1000000000L;
    until.tv_nsec = sum % 1000000000L;
    return until;
}
/* pthread_cond_init on CLOCK_MONOTONIC (nhf_deadline_ns's clock): 0 or an error. */
static inline int nhf_cond_init_monotonic(pthread_cond_t *cond) {
    pthread_condattr_t attr;
    int rc = pthread_condattr_init(&attr);
    if (rc != 0)
        return rc;
    rc = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    if (rc == 0)
        rc = pthread_cond_init(cond, &attr);
    pthread_condattr_destroy(&attr);
    return rc;
}
/* Sleep ns nanoseconds (a signal may end it early). */
static inline void nhf_sleep_ns(long ns) {
    struct timespec ts = {ns / 1000000000L, ns % 1000000000L};
    nanosleep(&ts, NULL);
}
/* Relax the CPU in a spin-wait. */
static inline void nhf_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* ---- status words of the enqueue functions ---------------------------------
 * 0, a CUresult in the low 32 bits where a driver call failed, and these flags. */
#define NHF_CAPTURE_CHECK_FAILED (UINT64_C(1) << 32) /* cuStreamIsCapturing failed */
#define NHF_CAPTURING (UINT64_C(1) << 33)            /* capturing: nothing enqueued */
#define NHF_QUEUE_STOPPED (UINT64_C(1) << 34)        /* closed stream or executor */
#define NHF_OUT_OF_MEMORY (UINT64_C(1) << 36)        /* no memory for an entry or task */
#define NHF_KEPT (UINT64_C(1) << 37)                 /* enqueued after all: it will run */
#define NHF_EXECUTOR_CLOSED (UINT64_C(1) << 38)      /* the executor is closed */
#define NHF_IN_HOST_FUNCTION (UINT64_C(1) << 40)     /* simulator: called by a host function */
#define NHF_FAULTED (UINT64_C(1) << 41) /* the stream's context has a device fault (CUresult) */
#define NHF_LANE_STALE (UINT64_C(1) << 42) /* an executor's lane serves an earlier stream */
#define NHF_CURESULT_MASK UINT64_C(0xFFFFFFFF)

/* A CUhostFn: void (*)(void *). */
typedef void (*nhf_hostfn)(void *);

/* An enqueue function: put trampoline(record) on `target` (a stream, or an
 * executor's lane), without the GIL; returns a status word. */
typedef uint64_t (*nhf_enqueue_fn)(void *target, nhf_hostfn trampoline, void *record);
/* A lane's enqueue function (an executor's lane, LIFETIME.md invariant 15), without
 * the GIL: trampoline(record) as the lane's next task; or, with an owner, a *direct*
 * task: compiled code trampoline(record), fn(arg), with no record, the lane holding
 * owner (one reference) until the task has run.  released: NHF_LANE_RELEASED
 * slots, NULL on entry; each it fills is the owner of an earlier direct task of the
 * lane that has run, taken out of the lane (the caller releases it, with the GIL).
 * Returns a status word, as an enqueue function does. */
typedef uint64_t (*nhf_lane_fn)(void *lane, nhf_hostfn trampoline, void *record,
                                PyObject *owner, PyObject **released);
/* At most this many at each enqueue: one more than it adds, so that what a burst
 * left shrinks while a thread goes on launching. */
#define NHF_LANE_RELEASED 2

/* ---- launch records (records.c) ---------------------------------------------- */

/* What one launch owns, from its enqueue until the drain after it has run. */
typedef struct nhf_record {
    /* A trampoline touches only the record's first cache line (state to result),
     * and records lie two lines apart: the thread that fills one record never
     * writes the line, nor the one a processor fetches beside it, where another
     * thread runs or completes the record before (docs/benchmarks.md, the A/B
     * against 0c737ac).  The state: see watch, below. */
    _Alignas(2 * NHF_CACHE_LINE) atomic_ulong state;
    nhf_hostfn fn;           /* what a trampoline calls (NULL for a Python callable) */
    void *arg;               /* its user_data, or the PyObject* of the Python callable */
    void *context;           /* the executor's pool, for its copy trampoline */
    struct nhf_record *next; /* link: free list, completed stack, or a simulated graph's list */
    PyObject *result;        /* what a Python callable returned (released by the drain) */
    PyObject *owner;         /* strong reference to what the launch keeps alive */
    int pin;                 /* enum nhf_pin: the GIL's */
    /* A device fault (watchdog.c, LIFETIME.md invariant 23): the stream the
     * launch was enqueued on (an executor's: its lane's) and that stream's
     * context, both found at the enqueue (the watchdog never touches a user's
     * stream handle: it may be destroyed by then); and the record's state (above):
     * an incarnation number (raised at every take) and a phase, changed by
     * compare-and-swap only. */
    _Atomic(void *) watch;
    _Atomic(void *) watch_ctx; /* NULL: not watched (no watchdog, or no context) */
} nhf_record;
_Static_assert(offsetof(nhf_record, result) + sizeof(PyObject *) <= NHF_CACHE_LINE,
               "what a trampoline touches is not on a record's first cache line");

/* A record's phase: the low two bits of its state. */
enum nhf_phase {
    NHF_TAKEN = 0,     /* taken, not (yet) known to be on a stream */
    NHF_IN_FLIGHT = 1, /* enqueued: a trampoline or the watchdog will claim it */
    NHF_RUN = 2,       /* a trampoline claimed it: it runs */
    NHF_FAILED = 3,    /* the watchdog claimed it: it never runs; never reused */
};
/* A graph record's pin (nhf_record_pin): while a captured node's launch is
 * checked, and for good where a run on the stream may still read the record. */
enum nhf_pin {
    NHF_UNPINNED = 0,
    NHF_PINNED = 1,      /* a release that comes is owed, not done */
    NHF_PINNED_OWED = 2, /* released while pinned: nhf_record_unpin releases it */
    NHF_PIN_KEPT = 3,    /* never released nor reused: owner and record leak */
};

#define NHF_PHASE(state) ((unsigned)((state) & 3u))
#define NHF_WITH_PHASE(state, phase) (((state) & ~(unsigned long)3u) | (unsigned long)(phase))

/* Any thread: a trampoline claims its record before it runs; false if the
 * watchdog failed it (a device fault): then it must touch nothing of the
 * record's but return (the record is released by the drain, never reused). */
static inline bool nhf_record_start(nhf_record *record) {
    unsigned long state = atomic_load(&record->state);
    while (NHF_PHASE(state) != NHF_FAILED) {
        if (atomic_compare_exchange_weak(&record->state, &state, NHF_WITH_PHASE(state, NHF_RUN)))
            return true;
    }
    return false;
}

/* GIL held.  Take a free record for fn(arg) with a new reference to owner;
 * NULL (MemoryError set) if no memory. */
nhf_record *nhf_record_take(nhf_hostfn fn, void *arg, PyObject *owner);
/* GIL held.  Put a record back and drop its references (its enqueue failed, or
 * the drain releases it). */
void nhf_record_release(nhf_record *record);
/* GIL held.  Pin a graph's record: nhf_record_release leaves it to
 * nhf_record_unpin, which releases it then if it was released meanwhile, or,
 * with keep, keeps it for good (a launch on the stream may still read it:
 * LIFETIME.md, invariant 8). */
void nhf_record_pin(nhf_record *record);
void nhf_record_unpin(nhf_record *record, bool keep);
/* GIL held.  Release every completed record and deferred object; returns how
 * many records were released. */
Py_ssize_t nhf_drain(void);
/* Any thread.  The record has run, or its graph is gone: hand it to Python.
 * On a thread that defers (nhf_defer_drains), the drain is owed instead of
 * scheduled: that thread settles it (nhf_settle_drain). */
void nhf_record_complete(nhf_record *record);
/* An executor's pool thread, once: its completions leave the drain owed, to be
 * scheduled by a pool thread NHF_DRAIN_DEFER_NS later, or before it sleeps
 * (invariant 14). */
void nhf_defer_drains(void);
/* Any thread: schedule the drain that deferred completions owe, if they owe one
 * and it has been owed NHF_DRAIN_DEFER_NS at now (CLOCK_MONOTONIC, ns); now 0:
 * however long. */
void nhf_settle_drain(long now);
/* How long a pool thread may leave a drain owed while it keeps working: the
 * launching thread's own drain (each enqueue drains) then releases what ran
 * in the meantime, and no pending call interrupts it for each task. */
#define NHF_DRAIN_DEFER_NS 50000L
/* Any thread, GIL held by the caller.  Release object on the main thread's next
 * drain instead of here. */
void nhf_defer_release(PyObject *object);
/* Any thread.  Whether a drain would find work (a hint). */
bool nhf_drain_wanted(void);
/* Any thread.  Whether a drain owes the lanes a look (a lane it skipped, its
 * producer inside an enqueue; a settle's): a refused enqueue, which leaves no
 * task for a pool thread to settle after, drains then (invariant 14). */
bool nhf_lanes_owed(void);
/* Records taken and not released, and owners held by lanes' direct tasks. */
Py_ssize_t nhf_records_held(void);
/* GIL held: an owner that a lane's direct task holds (change 1), or one released
 * (-1), counted as held (the tests' count of what launches hold). */
void nhf_owner_held(long change);
/* A pool's thread, after a direct task ran: a drain is owed, as after a deferred
 * completion (nhf_record_complete on a thread that defers). */
void nhf_owe_drain(void);
/* The executor's hooks for the owners that lanes' direct tasks hold, set once at
 * module load (executor.c): release_ran releases those of tasks that have run (GIL
 * held; returns how many); idle says whether some that have run wait for a drain
 * (a pool's thread: 1 yes; 0 no; -1 their producers are releasing them, ask again
 * later; any_age: 1 if any wait at all); each_owner visits each owner held (GIL
 * held, for tests). */
typedef struct {
    Py_ssize_t (*release_ran)(void);
    int (*idle)(bool any_age);
    void (*each_owner)(void (*visit)(PyObject *owner, void *arg), void *arg);
} nhf_lane_owner_hooks;
void nhf_drain_on_lanes(const nhf_lane_owner_hooks *hooks);
/* Py_AddPendingCall refusals (each retried later). */
Py_ssize_t nhf_schedule_failures(void);
/* Any thread: call visit(record, arg) for every record ever allocated (slabs
 * are never freed); the records may change under it (read their state). */
void nhf_records_each(void (*visit)(nhf_record *record, void *arg), void *arg);
/* drain(), held(), schedule_failures(). */
int nhf_records_init(PyObject *module);

/* ---- the CUDA driver's table (driver.c; its types and constants: driver.h) ---- */

/* GIL held, at module load: driver_entry_points(), driver_load(), and in
 * _core._testing driver_swap() and driver_address(). */
int nhf_driver_init(PyObject *module);
/* Any thread: whether driver_load has filled the table (the CUDA backend is made);
 * until then a CUDA route names nothing that could be called. */
bool nhf_driver_loaded(void);

/* ---- the interpreter guard, and the GIL on foreign threads (guard.c) --------- */

/* Any thread: count this thread in before touching CPython; false once the
 * guard is closed (interpreter exit). */
bool nhf_guard_enter(void);
void nhf_guard_leave(void);
bool nhf_guard_open(void);
/* GIL held: close the guard and wait, GIL released, at most ms milliseconds
 * for the threads inside; returns how many are left. */
long nhf_guard_close(long ms);
/* Any thread: this process is a child forked from one that had used numba_hostfn
 * (set by the fork handler inside fork(), before the child runs any Python). */
bool nhf_forked(void);
/* Any thread: this process has used numba_hostfn (its backend is made). */
void nhf_mark_used(void);
/* GIL held, at module load: close_guard(), and the fork handler. */
int nhf_guard_init(PyObject *module);

/* Any thread, inside the guard: take the GIL (a foreign thread gets a thread
 * state that it keeps); returns what nhf_gil_give gives back. */
PyGILState_STATE nhf_gil_take(void);
void nhf_gil_give(PyGILState_STATE state);
/* Any thread: give back the thread state nhf_gil_take kept for this thread,
 * before the thread ends (a pool's threads). */
void nhf_gil_forget(void);
/* Whether the interpreter's finalization has begun (Py_IsFinalizing). */
bool nhf_interpreter_finalizing(void);
/* Any thread: after a compiled body, undo a PyGILState_Ensure the body left. */
void nhf_gil_give_back_leaked(void);

/* ---- trampolines (trampolines.c): what the driver calls ------------------------ */

/* The trampolines a launch record can be enqueued with, as Python names them
 * (_core.RUN_COMPILED, ...): a small number, never an address, which the core
 * checks.  The executor's copy is registered by its layer. */
enum nhf_trampoline_id {
    NHF_TRAMPOLINE_NONE = 0,
    NHF_TRAMPOLINE_RUN_COMPILED, /* nhf_run_compiled: fn(arg), no GIL */
    NHF_TRAMPOLINE_RUN_PYTHON,   /* nhf_run_python: the owner's callable, with the GIL */
    NHF_TRAMPOLINE_EXEC_COPY,    /* nhf_exec_copy: a copy shared among a pool's threads */
    NHF_NTRAMPOLINES
};
/* GIL held: the trampoline numbered id, or NULL with a ValueError set. */
nhf_hostfn nhf_trampoline_of(long id);
/* The number of trampoline fn, or NHF_TRAMPOLINE_NONE (a kind's run, for Python). */
int nhf_trampoline_id_of(nhf_hostfn fn);
/* GIL held, at module load: a higher layer's trampoline (the executor's copy). */
void nhf_trampoline_add(int id, nhf_hostfn fn);

void nhf_run_compiled(void *record);
void nhf_run_python(void *record);
void nhf_replay_compiled(void *record);
void nhf_replay_python(void *record);
/* A graph node's call at each replay, on fn and arg themselves: what the replays
 * above call with the record's, and an executor's graph slot with its own (a
 * slot's run never reads the record, which a fault may let go under it). */
typedef void (*nhf_call_fn)(nhf_hostfn fn, void *arg);
void nhf_call_compiled(nhf_hostfn fn, void *arg);
void nhf_call_python(nhf_hostfn fn, void *arg);
void nhf_user_object_release(void *record);
/* GIL held: call callable(), reporting an exception (a KeyboardInterrupt is
 * delivered again to the main thread where SIGINT has Python's handler, and goes
 * to sys.unraisablehook where it has not); a new reference, or NULL. */
PyObject *nhf_call_reporting(PyObject *callable);
/* Any thread: true while this thread runs a Python callable as a host function
 * (the driver's, the simulator's, or a HostExecutor's task or graph node): a
 * wait for stream work from there may wait for itself, and is refused. */
int nhf_in_host_function(void);
/* A thread that runs only host functions (a HostExecutor's pool thread, the
 * simulator's host-function thread), at its start: from then on it counts as in a
 * host function whatever it runs, a ctypes CUhostFn that calls Python too (which no
 * trampoline marks: a wait for stream work from it waited for itself, for ever). */
void nhf_mark_host_function_thread(void);
/* The trampolines' numbers (RUN_COMPILED, ...) and the replays' addresses. */
int nhf_trampolines_init(PyObject *module);

/* ---- the enqueue (enqueue.c) --------------------------------------------------- */

/* Where a launch goes, as Python names it (_core.ROUTE_CUDA, ...): each route is
 * an enqueue function and what its target is, registered at module load by the
 * layer that owns it (nhf_enqueue_add_route): a small number, never an address. */
enum nhf_route {
    NHF_ROUTE_NONE = 0,
    NHF_ROUTE_CUDA,        /* a CUDA stream (cuda.c) */
    NHF_ROUTE_SIM,         /* a simulated stream's host-function thread (simulator.c) */
    NHF_ROUTE_SIM_DEVICE,  /* a simulated stream's device work (simulator.c) */
    NHF_ROUTE_CUDA_LANE,   /* an executor's lane on a CUDA stream (executor_cuda.c) */
    NHF_ROUTE_SIM_LANE,    /* an executor's lane on a simulated stream (executor_sim.c) */
    NHF_NROUTES
};

/* GIL held on entry and exit.  Take a record owning `owner`, drop the GIL only
 * for the route's enqueue function (target, trampoline, record), release the
 * record if that refused, and drain what has run meanwhile.  The record's
 * context is given (the executor's copy finds its pool there).  Returns the
 * status word; NHF_NO_RECORD with a Python error set if no record could be taken. */
uint64_t nhf_enqueue_record(int route, void *target, nhf_hostfn trampoline, nhf_hostfn fn,
                            void *arg, void *context, PyObject *owner);
/* GIL held: a launch of host_launch or _core.enqueue.  Compiled code (trampoline
 * nhf_run_compiled, no context) on an executor lane's route is a direct task, with
 * no record; anything else is nhf_enqueue_record's. */
uint64_t nhf_enqueue_launch(int route, void *target, nhf_hostfn trampoline, nhf_hostfn fn,
                            void *arg, void *context, PyObject *owner);
/* A flag of its own, sharing no bit with the others (not NHF_KEPT's: a failed
 * record allocation is a refusal, and what the caller made for it is freed). */
#define NHF_NO_RECORD (UINT64_C(1) << 39)
/* Any thread, inside an enqueue function: the lane task it opened is numbered
 * task (pool.c, under the lane's enqueue mutex); 0 resets it (before an enqueue
 * whose task the caller will read). */
void nhf_enqueue_note_task(uint32_t task);
/* GIL held, right after nhf_enqueue_record on this thread, reset before it with
 * nhf_enqueue_note_task(0): the number of the lane task that enqueue opened (what
 * its stream writes to the lane's "reached" word, for lane_reached), or 0 if it
 * opened none (not a lane's route, or refused first).  Per thread: the enqueue ran
 * on this thread, and kept the number across the Python code it runs after its
 * driver call (the drain's and the releases' finalizers, which may launch on a lane
 * from this thread: LIFETIME.md, invariant 25). */
uint32_t nhf_enqueue_last_task(void);

/* GIL held, at module load: route's enqueue function, and, where its target is
 * not a stream but holds one (an executor's lane), stream_of(target): the stream
 * a device fault would be found on (NULL: the target is the stream). */
void nhf_enqueue_add_route(int route, nhf_enqueue_fn enqueue_fn,
                           void *(*stream_of)(void *target));
/* GIL held, at module load: a route whose target is an executor's lane: its
 * enqueue function, and stream_of(target). */
void nhf_enqueue_add_lane(int route, nhf_lane_fn lane_fn, void *(*stream_of)(void *target));
/* GIL held: a route argument from Python; NHF_ROUTE_NONE with a ValueError set
 * if it names none (or one not registered). */
int nhf_route_arg(PyObject *value);
/* enqueue(...), for the Python paths. */
int nhf_enqueue_init(PyObject *module);

/* ---- the CUDA backend (cuda.c) ------------------------------------------------- */

/* The driver's entry points are driver.h's table (driver.c). */
/* Without the GIL: what an enqueue on stream is refused with before it launches
 * (a noted fault, a failed capture read, NHF_CAPTURING), or 0; every CUDA enqueue
 * and the signals' check read it. */
uint64_t nhf_cuda_refusal(void *stream);
uint64_t nhf_cuda_enqueue(void *stream, nhf_hostfn trampoline, void *record);
/* GIL held (dropped around the driver's answers; none is asked for any handle but
 * the three): which stream a default-stream handle names for the calling thread (0
 * and CU_STREAM_LEGACY: one in each context; CU_STREAM_PER_THREAD: one in each
 * context and thread): its unique id (cuStreamGetId) and the current context
 * (cuCtxGetCurrent); 0 and NULL where the table lacks them (not loaded).  (NULL,
 * 0) for any other handle, which names one stream wherever it is used. */
void nhf_cuda_stream_key(void *stream, void **ctx, unsigned long long *id);
int nhf_cuda_init(PyObject *module);

/* ---- device faults: the watchdog (watchdog.c) ---------------------------------- */

/* Without the GIL, before the enqueue: the stream (a value, never
 * dereferenced by the watchdog) and its context, asked of the backend now,
 * while the caller's stream is valid, and only while a watchdog is set up. */
void nhf_watch_prepare(nhf_record *record, void *stream);
/* GIL held: the record (whose state was `taken` before its enqueue) was
 * enqueued (status 0 or NHF_KEPT): mark it in flight, unless it ran already,
 * and wake the watchdog if it is parked (one load when it is not). */
void nhf_watch_enqueued(nhf_record *record, unsigned long taken);
/* Any thread: 0, or NHF_FAULTED | CUresult if the watchdog knows stream's
 * context to have a device fault (one relaxed load while no fault is known). */
uint64_t nhf_fault_of_stream(void *stream);
/* Without the GIL, before a lane's direct enqueue: the context a launch on stream
 * is watched in (the backend's answer now, while the stream is valid), or NULL
 * where no watchdog is set up. */
void *nhf_watch_context(void *stream);
/* Any thread, after an enqueue left a lane's direct task outstanding: wake the
 * watchdog if it is parked (one load when it is not). */
void nhf_watch_wake(void);
/* The executor's hook, set once at module load (executor.c): each(visit, arg)
 * calls visit(ctx, stream, n, arg) for each lane with n direct tasks outstanding
 * in context ctx, on the watchdog's thread, which queries those contexts too. */
typedef void (*nhf_watch_visit_fn)(void *ctx, void *stream, long n, void *arg);
void nhf_watch_on_lanes(void (*each)(nhf_watch_visit_fn visit, void *arg));
/* Any thread: note that context ctx has the device fault code, found on stream
 * (the first note of a context wins).  Returns true if it was new. */
bool nhf_fault_note(void *ctx, unsigned code, void *stream);
/* Any thread (a pool's): fail one record that will never run, from the state
 * the caller loaded (in flight); false if a trampoline or the watchdog claimed
 * it first, or it is no longer that incarnation. */
bool nhf_fault_fail_record(nhf_record *record, unsigned code, unsigned long state);
/* The backend's query of a context, shaped like cuStreamQuery (0 or NOT_READY:
 * healthy; else its error), and the context of a stream, like cuStreamGetCtx. */
typedef int (*nhf_query_fn)(void *ctx);
typedef int (*nhf_context_fn)(void *stream, void **ctx);
/* GIL held, at module load: the query functions of the backend whose route is
 * route (NHF_ROUTE_CUDA: watchdog.c's own; NHF_ROUTE_SIM: simulator.c's), which
 * watchdog_configure(route) selects. */
void nhf_watchdog_add_backend(int route, nhf_query_fn query, nhf_context_fn context_of);
/* Any thread: whether it is the watchdog's (the simulator counts the stream
 * handles the watchdog touches: none, by design). */
bool nhf_on_watchdog_thread(void);
/* Hooks, set once at module load by the layers above, that the watchdog calls
 * when it fails a record (notify.c: a signal's record pushes its signal as
 * failed) and for each stream of a faulted context with a launch in flight, or
 * once with stream NULL for all of them where it lost one (executor.c: the lanes
 * on it fail their tasks).  Any thread (the watchdog's). */
typedef void (*nhf_record_failed_fn)(nhf_record *record, unsigned code);
typedef void (*nhf_stream_faulted_fn)(void *stream, void *ctx, unsigned code);
void nhf_fault_on_record_failed(nhf_record_failed_fn hook);
void nhf_fault_on_stream_faulted(nhf_stream_faulted_fn hook);
int nhf_watchdog_init(PyObject *module);

/* ---- launch kinds (kinds.c): one table, read by host_launch and by Python ---- */

/* What a launch is.  NHF_KIND_NONE (0, what a CompiledBase never bound has):
 * not a launch kind; the native path falls through to Python for it. */
enum nhf_kind {
    NHF_KIND_NONE = 0,
    NHF_KIND_COMPILED, /* a HostFunction: fn(user_data), compiled */
    NHF_KIND_POINTER,  /* a ctypes CUhostFn or numba cfunc: machine code at an address */
    NHF_KIND_PYTHON,   /* a Python callable, called with no arguments */
    NHF_NKINDS
};
/* What a launch owns (nhf_launch_owner builds it). */
enum nhf_owns {
    NHF_OWNS_FN,          /* the callable, which is also the record's argument */
    NHF_OWNS_FN_AND_DATA, /* the function and its user data's owner */
};
typedef struct {
    const char *name;    /* as _classify names it: "compiled", "pointer", "python" */
    nhf_hostfn run;      /* the trampoline on a stream */
    nhf_hostfn replay;   /* a graph node's call at each replay (arg: the record) */
    nhf_call_fn call;    /* the same call on the launch's fn and arg (a graph slot's) */
    enum nhf_owns owns;
} nhf_kind_info;
extern const nhf_kind_info nhf_kinds[NHF_NKINDS];
/* GIL held: what a launch keeps: fn alone where it owns nothing more, else
 * (fn, data, also), or (fn, data, also, executor) on an executor (None for any
 * of data, also, executor not given; NULL is None).  A new reference, or NULL. */
PyObject *nhf_launch_owner(PyObject *fn, PyObject *data, PyObject *also, PyObject *executor);
/* launch_kinds(), launch_owner(), the KIND_* numbers. */
int nhf_kinds_init(PyObject *module);

/* ---- CompiledBase (compiled.c) ------------------------------------------------- */

/* The compiled-function base type: HostFunction subclasses it in Python. */
typedef struct {
    PyObject_HEAD
    uintptr_t address;        /* the CUhostFn's machine code */
    PyObject *layout;         /* the declared numpy dtype, or NULL */
    Py_ssize_t layout_bytes;  /* its itemsize (0 without a layout) */
    int reads_user_data;      /* the body reads its argument: NULL is refused */
    int kind;                 /* its enum nhf_kind, as _bind declared it (NONE: not launched) */
} nhf_compiled_object;
extern PyTypeObject nhf_compiled_type;
int nhf_compiled_init(PyObject *module);

/* ---- BufferRef (buffer_ref.c) ------------------------------------------------- */

/* ByRef: a buffer exported for as long as a launch owns it (a writable one to
 * share as user data; with pin_only, any one whose address a launch uses). */
typedef struct {
    PyObject_HEAD
    PyObject *obj;     /* the buffer's object */
    PyObject *dtype;   /* obj.dtype for a numpy array, else None */
    Py_buffer view;    /* the export: a bytearray cannot be resized while it lives */
    int exported;
    int pin_only;      /* any layout, maybe read-only: never user data */
} nhf_byref_object;
extern PyTypeObject nhf_byref_type;
/* GIL held: a BufferRef of a bytearray copy of size bytes at data (what a launch
 * owns for read-only user data, on both paths), its address in *address; a new
 * reference, or NULL with an error set. */
PyObject *nhf_buffer_ref_copy(const char *data, Py_ssize_t size, uintptr_t *address);
/* BufferRef, format_holds_objects(). */
int nhf_buffer_ref_init(PyObject *module);

/* ---- host_launch's configuration (launch_config.c) ------------------------------ */

struct nhf_launch_config {
    PyObject *fallback;         /* the Python host_launch */
    /* host_launch_answered(answer, stream, fn, **keywords): the Python host_launch
     * for a call handed over after the stream's __cuda_stream__ gave answer */
    PyObject *answered;
    PyObject *raise_status;     /* raise_status(status, executor): raises */
    PyObject *sim_stream_type;  /* numba_hostfn.simulator.Stream (exactly) */
    PyObject *cuda_stream_type; /* cuda.core's Stream (and its subclasses) */
    PyObject *cuhostfn_type;    /* ctypes.CFUNCTYPE(None, ctypes.c_void_p) */
    /* ctypes._CFuncPtr, and its cdecl flag (ctypes._FUNCFLAG_CDECL): a function
     * pointer of another prototype class (a C library's function, a subclass of
     * CUhostFn) is launched when its class's _flags_ say cdecl (NULL: never) */
    PyObject *pointer_type;
    PyObject *cdecl_flags;
    /* numba's CFunc (exactly), its Signature type, and the interned types of
     * void(voidptr): a numba cfunc of that signature is launched (NULL: never; the
     * Python path sets them at its first cfunc, since numba is imported only then) */
    PyObject *cfunc_type, *signature_type, *voidptr, *void_type;
    PyObject *byref_type;       /* numba_hostfn.ByRef (and its subclasses) */
    PyObject *c_void_p;         /* ctypes.c_void_p */
    /* ctypes' restype and argtypes data descriptors (_compat.POINTER_PROTOTYPE):
     * a pointer's prototype as its calls use it, read as the Python path reads it */
    PyObject *restype_descr, *argtypes_descr;
    int route;          /* the backend's route for a stream (NHF_ROUTE_CUDA, _SIM) */
    int executor_route; /* and for an executor's lane (NHF_ROUTE_CUDA_LANE, _SIM_LANE) */
    int configured;
    int wanted; /* tests may send every call to Python */
    PyObject *s_stream, *s_fn, *s_user_data, *s_executor, *s_blocking; /* interned */
    PyObject *s_cuda_stream, *s_flags;
    PyObject *s_sig, *s_address, *s_args, *s_return_type, *s_recvr, *s_pysig;
};
extern struct nhf_launch_config nhf_launch;
/* The launch counts: one per kind (indexed by enum nhf_kind), and these two. */
enum { NHF_COUNT_FELL_THROUGH = NHF_KIND_NONE, NHF_COUNT_EXECUTOR = NHF_NKINDS, NHF_NCOUNTS };
void nhf_count_launch(int which);
PyObject *nhf_py_configure_launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                  PyObject *kwnames);
PyObject *nhf_py_launch_counts(PyObject *self, PyObject *unused);
int nhf_launch_config_init(PyObject *module);

/* ---- host_launch (host_launch.c) ----------------------------------------------- */

PyObject *nhf_host_launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                          PyObject *kwnames);
int nhf_host_launch_init(PyObject *module);
/* ---- the simulator (simulator.c) ----------------------------------------------- */

typedef struct nhf_sim_stream nhf_sim_stream;
uint64_t nhf_sim_enqueue(void *stream, nhf_hostfn fn, void *arg);
/* The simulator's query of a stream (cuStreamQuery), of a context (the
 * watchdog's), and its cuStreamGetCtx. */
int nhf_sim_query(void *stream);
int nhf_sim_query_context(void *ctx);
int nhf_sim_context_of(void *stream, void **ctx);
/* Any thread: the simulator's cuStreamGetId (a serial number). */
unsigned long long nhf_sim_stream_id(void *stream);
/* Any thread: on a simulated stream's thread, whether its context has faulted. */
bool nhf_sim_faulted_here(void);
uint64_t nhf_sim_enqueue_device(void *stream, nhf_hostfn fn, void *arg);
void nhf_sim_delay(void *arg);
/* A simulated stream memory operation: its word and value (the argument of the
 * device work below; a graph slot keeps three, as its nodes' arguments). */
typedef struct {
    _Atomic uint32_t *word;
    uint32_t value;
} nhf_sim_word_op;
/* Any thread (a simulated stream's): device work that writes op.word :=
 * op.value, or waits until op.word >= op.value (cyclic); the _once forms free
 * op after (a fault that drops them frees it too). */
void nhf_sim_set(void *op);
void nhf_sim_await(void *op);
void nhf_sim_write_once(void *op);
void nhf_sim_wait_once(void *op);
/* GIL held: the native stream of a simulated Stream (NULL for anything else). */
void *nhf_sim_stream_of(PyObject *object);
void nhf_sim_graph_release(void *graph);
int nhf_simulator_init(PyObject *module);

/* ---- the HostExecutor (executor.h, executor.c) --------------------------------------------- */

typedef struct nhf_pool nhf_pool;
typedef struct {
    PyObject_HEAD
    nhf_pool *pool; /* NULL until started; never freed */
} nhf_executor_object;
extern PyTypeObject nhf_executor_type;
/* GIL held: the lane of the pool for stream, as the calling thread names it (a
 * default-stream handle: nhf_cuda_stream_key), or NULL (pool.c). */
void *nhf_exec_find_lane(nhf_pool *pool, void *stream);
/* GIL held, where nhf_exec_find_lane found no lane for stream, or found stale, whose
 * enqueue answered NHF_LANE_STALE: a lane whose tasks have all run, handed to the
 * stream the handle names now, else NULL (the caller makes one).  A default-stream
 * handle (0, 0x1, 0x2): a lane of that handle and context, other than stale (a
 * thread's per-thread stream after another thread's, whose lane would otherwise stay
 * for ever).  Any other handle, with stale: stale is passed by from now on, and a
 * lane of the handle passed by earlier serves (a handle given again and again to
 * streams destroyed with tasks pending would otherwise add a lane each time); with
 * no stale, NULL (pool.c). */
void *nhf_exec_reuse_lane(nhf_pool *pool, void *stream, void *stale);
/* GIL held: whether lane is one of the pool's (pool.c). */
bool nhf_exec_has_lane(nhf_pool *pool, void *lane);
/* GIL held: how many lanes the pool has (pool.c). */
size_t nhf_exec_lane_count(nhf_pool *pool);
/* The enqueue functions of a lane (executor_cuda.c, executor_sim.c). */
uint64_t nhf_exec_cuda_enqueue(void *lane, nhf_hostfn trampoline, void *record,
                               PyObject *owner, PyObject **released);
uint64_t nhf_exec_sim_enqueue(void *lane, nhf_hostfn trampoline, void *record,
                              PyObject *owner, PyObject **released);
/* The owners of lanes' direct tasks (pool.c; nhf_lane_owner_hooks) and the lanes
 * the watchdog watches for them (nhf_watch_on_lanes). */
Py_ssize_t nhf_exec_release_ran(void);
int nhf_exec_owners_idle(bool any_age);
void nhf_exec_each_owner(void (*visit)(PyObject *owner, void *arg), void *arg);
void nhf_exec_watch_lanes(nhf_watch_visit_fn visit, void *arg);
/* Any thread (a pool's): a copy task's trampoline (parallel_copy.c). */
void nhf_exec_copy(void *record);
/* Any thread: the stream of an executor lane (the watchdog's query; pool.c). */
void *nhf_exec_lane_stream(void *lane);
/* Any thread (the watchdog's, through its hook): the lanes on stream (NULL: every
 * lane whose noted context is ctx), of every pool, fail their tasks that the stream
 * has not reached from now on (it never will; pool.c). */
void nhf_exec_fault_stream(void *stream, void *ctx, unsigned code);
/* exec_slot_op, GraphSlot (graph_slots.c); exec_test_pause (pool.c); ExecutorBase. */
int nhf_graph_slots_init(PyObject *module);
int nhf_pool_init(PyObject *module);
int nhf_executor_init(PyObject *module);

/* ---- signals to Python (notify.c) ---------------------------------------------- */

int nhf_notify_init(PyObject *module);

#endif /* NHF_H */
