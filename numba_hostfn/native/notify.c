/* Notifications: a host function that signals Python through a file descriptor.
 *
 * A *channel* is an eventfd and a lock-free stack of *signals*.  A signal is
 * what one launch will say when its stream gets there: a key that Python maps
 * to a future or a callable.  nhf_signal is the signal's CUhostFn: it runs on
 * the driver's (or a pool's, or the simulator's) thread, pushes the signal, and
 * writes the eventfd when the stack was empty; it never touches the GIL.  A
 * channel made with wake_main also asks the interpreter, with a pending call,
 * to call the callable set with set_notify_callable.
 *
 * The reader (an asyncio loop's reader callback; the non-blocking callbacks'
 * helper thread or pending call) reads the descriptor first, then takes the
 * signals, oldest first: a signal pushed after the take finds the stack empty
 * and writes again, so no wake-up is lost.  A channel is made by its one
 * reader, a Dispatcher, whose batch lock serializes the takes.
 *
 * A channel is reference counted: its Dispatcher holds one reference while it
 * lives (not released once the interpreter is finalizing: a reader on a daemon
 * thread may still wait on it), and each signal not yet run holds one.  The
 * last release frees the signals nobody took and closes the descriptor: nothing
 * writes to it after that, so a descriptor number the OS hands out again is
 * never written (LIFETIME.md, invariant 17).
 */
#include "nhf.h"

#include <errno.h>
#include <sys/eventfd.h>
#include <stdlib.h>
#include <unistd.h>

typedef struct signal_node {
    struct signal_node *next;
    struct channel *channel;
    uint64_t key;
    unsigned fault; /* 0, or the CUresult of a device fault: its launch never ran */
} signal_node;

typedef struct channel {
    atomic_long refs;
    int fd;        /* an eventfd, closed by the last release */
    int wake_main; /* also schedule pending_notify on the main thread */
    _Atomic(signal_node *) pushed; /* signals run, newest first (lock-free) */
    /* Taken by its one reader, the Dispatcher that made it, under that one's batch
     * lock (no lock of the channel's own). */
    signal_node *taken; /* signals taken, oldest first */
} channel;

static void free_all(signal_node *node) {
    while (node != NULL) {
        signal_node *following = node->next;
        free(node);
        node = following;
    }
}

/* Any thread: drop one reference; the last frees what nobody took and closes
 * the descriptor. */
static void channel_release(channel *ch) {
    if (atomic_fetch_sub(&ch->refs, 1) != 1)
        return;
    free_all(atomic_load(&ch->pushed));
    free_all(ch->taken);
    close(ch->fd);
    free(ch);
}

/* ---- the main thread's share: a pending call to a Python callable ------------ */

static atomic_int notify_scheduled;
static _Atomic(PyObject *) notify_callable; /* one reference, set once */

/* Python 3.10-3.12 see a Py_AddPendingCall made on a thread foreign to Python
 * only when the main thread next drops or takes the GIL: up to a switch
 * interval while it runs Python.  3.12's _PyEval_AddPendingCall(interp, fn, arg,
 * 0) queues a call that any thread of the interpreter runs, and sets the eval
 * breaker at once (see _compat.any_thread_pending_call). */
typedef int (*add_pending_fn)(void *interp, int (*fn)(void *), void *arg, int main_only);
static _Atomic(add_pending_fn) any_thread_pending;
static void *main_interpreter;

/* The pending call: the thread that runs it (the main thread, or from 3.12 any
 * thread) calls the notify callable, GIL held.  The callable reports what the
 * callbacks raise itself; an exception that still comes out of it is a signal
 * handler's (a SIGALRM timeout, a Ctrl-C) that ran inside it: returned as the
 * pending call's failure, CPython raises it in whatever that thread was running,
 * as it raises a signal handler's own (issue 27: it went to sys.unraisablehook).
 *
 * A child forked while this call was scheduled inherits it, and the parent's
 * batch with it: it runs nothing there (LIFETIME.md, invariant 22).  The check is
 * the native fork flag, set inside fork(): the child may run the call in the
 * first Python code after fork (threading's own after-fork hook), before any
 * after-fork hook of numba_hostfn's. */
static int pending_notify(void *unused) {
    (void)unused;
    atomic_store(&notify_scheduled, 0);
    PyObject *callable = atomic_load(&notify_callable);
    if (!nhf_guard_open() || nhf_forked() || callable == NULL)
        return 0;
    PyObject *result = PyObject_CallNoArgs(callable);
    if (result == NULL)
        return -1;
    Py_DECREF(result);
    return 0;
}

/* As the records' drain: once until the call starts; a refusal clears the flag
 * (the eventfd has been written, so the reader's thread still runs the batch). */
static void schedule_notify(void) {
    int expected = 0;
    if (!atomic_compare_exchange_strong(&notify_scheduled, &expected, 1))
        return;
    int refused = 1;
    if (nhf_guard_enter()) {
        add_pending_fn add = atomic_load(&any_thread_pending);
        refused = add != NULL ? add(main_interpreter, pending_notify, NULL, 0)
                              : Py_AddPendingCall(pending_notify, NULL);
        nhf_guard_leave();
    }
    if (refused)
        atomic_store(&notify_scheduled, 0);
}

/* ---- the signal ------------------------------------------------------------------ */

/* Any thread: the CUhostFn of a signal: push it, wake the reader if the stack
 * was empty, then drop the signal's reference.  The node belongs to the reader
 * once pushed: it is not touched again here. */
static void nhf_signal(void *node_) {
    signal_node *node = node_;
    channel *ch = node->channel;
    /* fault is written before the push, and read by the reader after its take. */
    signal_node *top = atomic_load(&ch->pushed);
    do {
        node->next = top;
    } while (!atomic_compare_exchange_weak(&ch->pushed, &top, node));
    if (top == NULL) {
        static const uint64_t one = 1;
        ssize_t written = write(ch->fd, &one, sizeof one);
        (void)written; /* an eventfd counter cannot overflow at one per signal */
        if (ch->wake_main)
            schedule_notify();
    }
    channel_release(ch);
}

/* Any thread (the watchdog's): the signal's launch will never run: push it,
 * marked with the fault, as it would have pushed itself (invariant 23). */
static void signal_fail(void *node_, unsigned code) {
    signal_node *node = node_;
    node->fault = code;
    nhf_signal(node);
}

/* Any thread (the watchdog's hook, nhf_fault_on_record_failed): a record that a
 * device fault failed; a signal's pushes its signal as failed. */
static void record_failed(nhf_record *record, unsigned code) {
    if (record->fn == nhf_signal)
        signal_fail(record->arg, code);
}

/* ---- from Python ---------------------------------------------------------------- */

/* Under its reader's batch lock: the signals run since the last take, oldest
 * first, in ch->taken (the newest-first stack reversed). */
static void take_locked(channel *ch) {
    if (ch->taken != NULL)
        return;
    signal_node *node = atomic_exchange(&ch->pushed, NULL), *oldest = NULL;
    while (node != NULL) { /* newest first -> oldest first */
        signal_node *following = node->next;
        node->next = oldest;
        oldest = node;
        node = following;
    }
    ch->taken = oldest;
}

/* GIL held: enqueue a signal of (channel, key) on target: the enqueue (enqueue.c)
 * with a signal in place of fn(arg).  The signal is made here and, if the
 * enqueue refused it, freed here: it never reaches Python, so no exception raised
 * in Python around this call (a Ctrl-C, or one a pending call raises, after the
 * enqueue) can free a signal that the stream, and then the channel's reader,
 * owns.  The signal is compiled code (nhf_signal): its trampoline is
 * nhf_run_compiled.  Returns the status word; NHF_NO_RECORD with an error set. */
static uint64_t enqueue_signal(int route, void *target, channel *ch, uint64_t key,
                               PyObject *owner) {
    signal_node *node = malloc(sizeof(signal_node));
    if (node == NULL)
        return NHF_OUT_OF_MEMORY;
    atomic_fetch_add(&ch->refs, 1);
    *node = (signal_node){NULL, ch, key, 0};
    uint64_t status =
        nhf_enqueue_record(route, target, nhf_run_compiled, nhf_signal, node, NULL, owner);
    if (status != 0 && !(status & NHF_KEPT)) {
        free(node);
        channel_release(ch);
    }
    return status;
}

/* ---- the dispatcher: what Python does when a channel's signals have run --------- */

/* A Dispatcher owns, for one channel, the entries its signals will act on (key ->
 * a callable to call, or a (future, stream) to resolve), the keys taken from the
 * channel and not yet acted on, and the lock of its batches.  Everything from
 * registering an entry with its signal's enqueue to acting on a taken key is
 * done here, in C: no bytecode boundary of numba_hostfn's own lies between taking
 * work and owning it, so an asynchronous exception (a Ctrl-C, a signal handler's)
 * loses, strands or doubly runs nothing (LIFETIME.md, invariant 21).  The only
 * Python code a batch runs is the entries' own. */
enum dispatch { DISPATCH_CALL, DISPATCH_RESOLVE };

/* A key taken from the channel, and the fault its launch failed with (or 0). */
typedef struct {
    uint64_t key;
    unsigned fault;
} due_key;

typedef struct {
    PyObject_HEAD
    channel *ch;       /* one reference of the channel's, dropped at dealloc */
    int mode;          /* DISPATCH_CALL or DISPATCH_RESOLVE */
    PyObject *waiting; /* dict: key -> entry, until it has been acted on */
    uint64_t next_key;
    due_key *due;      /* a ring of keys taken from the channel, oldest first */
    size_t due_head, due_len, due_cap;
    pthread_mutex_t lock;     /* one batch at a time: stream order */
    atomic_ulong runner;      /* the thread running the batch, or 0 */
    PyObject *invalid_state;  /* for DISPATCH_RESOLVE: asyncio.InvalidStateError */
    PyObject *on_fault;       /* on_fault(entry, code) for a failed launch's entry, or NULL */
    atomic_long faulted;      /* entries whose launch a device fault failed */
} dispatcher;

/* A Dispatcher made with __new__ alone (or cleared by the collector) has no channel
 * or table: its methods refuse instead of reading through NULL. */
static int dispatcher_ready(dispatcher *d) {
    if (d->ch != NULL && d->waiting != NULL)
        return 0;
    PyErr_SetString(PyExc_RuntimeError,
                    "this Dispatcher was never made (Dispatcher(wake_main, ...)) or is cleared");
    return -1;
}

static int due_push(dispatcher *d, due_key key) {
    if (d->due_len == d->due_cap) {
        size_t cap = d->due_cap ? 2 * d->due_cap : 64;
        due_key *ring = malloc(cap * sizeof(due_key));
        if (ring == NULL)
            return -1;
        for (size_t i = 0; i < d->due_len; i++)
            ring[i] = d->due[(d->due_head + i) % d->due_cap];
        free(d->due);
        d->due = ring;
        d->due_head = 0;
        d->due_cap = cap;
    }
    d->due[(d->due_head + d->due_len) % d->due_cap] = key;
    d->due_len++;
    return 0;
}

/* Under the batch lock: move the channel's run signals into the due ring.  The
 * channel has no other reader (dispatcher_init), so that lock guards ch->taken. */
static int take_into(dispatcher *d) {
    int rc = 0;
    take_locked(d->ch);
    while (d->ch->taken != NULL) {
        due_key key = {d->ch->taken->key, d->ch->taken->fault};
        if (due_push(d, key) < 0) {
            rc = -1; /* what is left stays taken, for the next batch */
            break;
        }
        signal_node *next = d->ch->taken->next;
        free(d->ch->taken);
        d->ch->taken = next;
    }
    return rc;
}

/* Act on one entry: call it (reporting its exception), or resolve its future.
 * -1 with an error set only for what must reach the program. */
static int act(dispatcher *d, PyObject *entry) {
    if (d->mode == DISPATCH_CALL) {
        Py_XDECREF(nhf_call_reporting(entry));
        return 0;
    }
    /* (future, stream, ...): the result is the stream (what follows it is for
     * on_fault: async_done's handle); a future cancelled meanwhile is skipped
     * (interest dropped).  Resolving runs no user code: the awaiting coroutines
     * are scheduled with call_soon. */
    if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) < 2)
        return 0;
    PyObject *future = PyTuple_GET_ITEM(entry, 0), *stream = PyTuple_GET_ITEM(entry, 1);
    PyObject *done = PyObject_CallMethod(future, "done", NULL);
    if (done == NULL)
        return -1;
    int is_done = PyObject_IsTrue(done);
    Py_DECREF(done);
    if (is_done)
        return is_done < 0 ? -1 : 0;
    PyObject *set = PyObject_CallMethod(future, "set_result", "O", stream);
    if (set != NULL) {
        Py_DECREF(set);
        return 0;
    }
    if (d->invalid_state != NULL && PyErr_ExceptionMatches(d->invalid_state)) {
        PyErr_Clear(); /* cancelled just now */
        return 0;
    }
    return -1;
}

/* How many times fail() calls on_fault for one entry that KeyboardInterrupts stop. */
#define FAIL_TRIES 4

/* A device fault failed the entry's launch (invariant 23): on_fault(entry,
 * code) fails its wait; without on_fault (non-blocking callbacks) it is
 * dropped.  Counted either way.  What on_fault raises is reported, except a
 * KeyboardInterrupt: a Ctrl-C's handler that ran between two of its bytecodes
 * may have stopped it before it failed the wait, which nothing would fail
 * later (the entry is taken: an awaiting coroutine waited for ever).  So
 * on_fault is called again (it fails a wait once: one failed already is left
 * as it is), FAIL_TRIES times at most, and the interrupt delivered again to
 * the main thread after. */
static int fail(dispatcher *d, PyObject *entry, unsigned code) {
    atomic_fetch_add(&d->faulted, 1);
    if (d->on_fault == NULL)
        return 0;
    bool interrupted = false;
    for (int tries = 0; tries < FAIL_TRIES; tries++) {
        PyObject *result = PyObject_CallFunction(d->on_fault, "OI", entry, code);
        if (result != NULL) {
            Py_DECREF(result);
            break;
        }
        if (!PyErr_ExceptionMatches(PyExc_KeyboardInterrupt)) {
            PyErr_WriteUnraisable(d->on_fault);
            break;
        }
        PyErr_Clear();
        interrupted = true;
    }
    if (interrupted)
        PyErr_SetInterrupt();
    return 0;
}

/* How long a blocked run waits for another thread's batch, without the GIL, between
 * two checks for signals. */
#define BATCH_WAIT_SLICE_NS 50000000L /* 50 ms */

/* GIL held: take the batch lock, which another thread holds (it runs a batch, whose
 * entries may take as long as they like).  The wait is taken in slices, without the
 * GIL; between two, with the GIL, Python's signal handlers run (PyErr_CheckSignals,
 * on the main thread), so a Ctrl-C in drain() raises KeyboardInterrupt at once,
 * instead of when that batch ends (never, where an entry there waits for this
 * thread), and a handler that returns lets the wait go on, as a simulated sync does.
 * The slices are on CLOCK_REALTIME, pthread_mutex_timedlock's clock (glibc 2.17 has
 * no pthread_mutex_clocklock): a clock step only lengthens or shortens one slice.
 * Returns 0 with the lock held, or -1 with the handler's exception set, nothing
 * taken. */
static int lock_checking_signals(pthread_mutex_t *lock) {
    for (;;) {
        int rc;
        Py_BEGIN_ALLOW_THREADS
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        long ns = until.tv_nsec + BATCH_WAIT_SLICE_NS;
        until.tv_sec += ns / 1000000000L;
        until.tv_nsec = ns % 1000000000L;
        rc = pthread_mutex_timedlock(lock, &until);
        if (rc != 0 && rc != ETIMEDOUT)
            rc = pthread_mutex_lock(lock); /* cannot happen with a valid deadline */
        Py_END_ALLOW_THREADS
        if (rc == 0)
            return 0;
        if (PyErr_CheckSignals() < 0)
            return -1;
    }
}

/* run(block=True) -> how many entries were acted on; the due keys oldest first.
 * A call from inside the batch (an entry that drains) returns 0 at once, unless
 * nested (a done_future's wait there, which only this batch can end): it then acts
 * on the keys due within the outer batch.  With block false, a call while another
 * thread runs the batch returns 0 at once; with block, it waits for that batch, and
 * a handler's exception meanwhile (a Ctrl-C) is raised, nothing taken
 * (lock_checking_signals).  Between two
 * entries, pending signals are handled (PyErr_CheckSignals, a no-op off the main
 * thread): a handler's exception (a Ctrl-C, a callback's own delivered again)
 * stops the batch, the rest stay due for the next run, and the exception is
 * raised to the caller. */
static PyObject *dispatcher_run(PyObject *self_, PyObject *const *args, Py_ssize_t nargs) {
    dispatcher *d = (dispatcher *)self_;
    if (nargs > 3) {
        PyErr_Format(PyExc_TypeError, "run(block=True, read_first=False, nested=False) takes "
                                      "at most 3 arguments (%zd given)",
                     nargs);
        return NULL;
    }
    if (dispatcher_ready(d) < 0)
        return NULL;
    int block = nargs > 0 ? PyObject_IsTrue(args[0]) : 1;
    if (block < 0)
        return NULL;
    /* read_first (a loop's reader, on a non-blocking eventfd): consume the wake-up in
     * this same step, under the batch lock: a Ctrl-C between a read in Python and the
     * take would leave the keys on the stack with nothing written for them. */
    int read_first = nargs > 1 ? PyObject_IsTrue(args[1]) : 0;
    if (read_first < 0)
        return NULL;
    /* nested: from inside this thread's own batch (a wait in an entry, or in a signal
     * handler or finalizer run in one, for an entry only this batch can act on): go on
     * with the due keys, oldest first, within it.  The outer batch reads the ring
     * afresh after each entry, so it goes on after them. */
    int nested = nargs > 2 ? PyObject_IsTrue(args[2]) : 0;
    if (nested < 0)
        return NULL;
    unsigned long me = PyThread_get_thread_ident();
    int inner = atomic_load(&d->runner) == me;
    if (inner && (!nested || read_first))
        return PyLong_FromLong(0);
    if (!inner) {
        if (pthread_mutex_trylock(&d->lock) != 0) {
            if (!block)
                return PyLong_FromLong(0);
            /* Without the GIL: the batch's thread may need it to finish the batch. */
            if (lock_checking_signals(&d->lock) < 0)
                return NULL;
        }
        atomic_store(&d->runner, me);
    }
    Py_INCREF(self_); /* an entry may drop the last other reference to this */
    if (read_first) {
        uint64_t count;
        ssize_t got = read(d->ch->fd, &count, sizeof count);
        (void)got; /* EAGAIN: nothing written since the last read */
    }
    long ran = 0;
    int failed = 0;
    for (;;) {
        if (d->due_len == 0 && take_into(d) < 0) {
            PyErr_NoMemory();
            failed = 1;
            break;
        }
        if (d->due_len == 0)
            break;
        if (ran > 0 && PyErr_CheckSignals() < 0) {
            failed = 1;
            break;
        }
        due_key key = d->due[d->due_head];
        PyObject *k = PyLong_FromUnsignedLongLong(key.key);
        if (k == NULL) {
            failed = 1;
            break;
        }
        PyObject *entry = PyDict_GetItemWithError(d->waiting, k);
        Py_XINCREF(entry);
        if (entry != NULL && PyDict_DelItem(d->waiting, k) < 0) {
            Py_DECREF(entry);
            Py_DECREF(k);
            failed = 1;
            break;
        }
        Py_DECREF(k);
        if (entry == NULL && PyErr_Occurred()) {
            failed = 1;
            break;
        }
        d->due_head = (d->due_head + 1) % d->due_cap; /* taken: it is this batch's now */
        d->due_len--;
        if (entry != NULL) { /* else its launch was refused after all: nothing to do */
            ran++;
            int rc = key.fault ? fail(d, entry, key.fault) : act(d, entry);
            Py_DECREF(entry);
            if (rc < 0) {
                failed = 1;
                break;
            }
        }
    }
    if (failed && (d->due_len > 0 || atomic_load(&d->ch->pushed) != NULL)) {
        /* Stopped with work left (a handler's exception): wake the reader again, or
         * the rest would wait for an unrelated signal or drain. */
        static const uint64_t one = 1;
        ssize_t written = write(d->ch->fd, &one, sizeof one);
        (void)written;
    }
    if (!inner) {
        atomic_store(&d->runner, 0);
        pthread_mutex_unlock(&d->lock);
    }
    Py_DECREF(self_);
    return failed ? NULL : PyLong_FromLong(ran);
}

/* launch(route, target, owner, entry) -> (status, task): register entry under a new
 * key and enqueue that key's signal on target by route (_core.ROUTE_*), as one step:
 * refused, the entry is dropped again (nothing will come); enqueued, the entry is
 * the batch's to act on, whatever Python raises afterwards.  task: on a lane's
 * route, the number of the signal's task, which the stream writes to the lane's
 * "reached" word when it gets there (lane_reached watches for it); else 0. */
static PyObject *dispatcher_launch(PyObject *self_, PyObject *const *args, Py_ssize_t nargs) {
    dispatcher *d = (dispatcher *)self_;
    void *target;
    if (dispatcher_ready(d) < 0 ||
        nhf_check_nargs("launch(route, target, owner, entry)", nargs, 4) < 0)
        return NULL;
    int route = nhf_route_arg(args[0]);
    if (route == NHF_ROUTE_NONE || nhf_address_arg(args[1], &target) < 0)
        return NULL;
    uint64_t key = ++d->next_key;
    PyObject *k = PyLong_FromUnsignedLongLong(key);
    if (k == NULL || PyDict_SetItem(d->waiting, k, args[3]) < 0) {
        Py_XDECREF(k);
        return NULL;
    }
    nhf_enqueue_note_task(0);
    uint64_t status = enqueue_signal(route, target, d->ch, key, args[2]);
    uint32_t task = 0;
    bool lane = route == NHF_ROUTE_CUDA_LANE || route == NHF_ROUTE_SIM_LANE;
    if (lane && (status == 0 || (status & NHF_KEPT)))
        task = nhf_enqueue_last_task(); /* what its stream will write to the lane's word */
    if (status != 0 && !(status & NHF_KEPT)) {
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback); /* a no-record error, if any */
        if (PyDict_DelItem(d->waiting, k) < 0)
            PyErr_Clear();
        PyErr_Restore(type, value, traceback);
    }
    Py_DECREF(k);
    if (status == NHF_NO_RECORD)
        return NULL;
    return Py_BuildValue("(KI)", (unsigned long long)status, (unsigned int)task);
}

static PyObject *dispatcher_outstanding(PyObject *self_, PyObject *unused) {
    (void)unused;
    if (dispatcher_ready((dispatcher *)self_) < 0)
        return NULL;
    return PyLong_FromSsize_t(PyDict_Size(((dispatcher *)self_)->waiting));
}

static PyObject *dispatcher_running_here(PyObject *self_, PyObject *unused) {
    (void)unused;
    return PyBool_FromLong(atomic_load(&((dispatcher *)self_)->runner) ==
                           PyThread_get_thread_ident());
}

static PyObject *dispatcher_faulted(PyObject *self_, PyObject *unused) {
    (void)unused;
    return PyLong_FromLong(atomic_load(&((dispatcher *)self_)->faulted));
}

static PyObject *dispatcher_due(PyObject *self_, PyObject *unused) {
    (void)unused;
    return PyLong_FromSize_t(((dispatcher *)self_)->due_len);
}

/* Dispatcher(wake_main, nonblocking=False, resolve=False, invalid_state=None,
 * on_fault=None): a new channel over a new eventfd (nonblocking: read without
 * blocking), which this Dispatcher alone reads and owns, made in this one native
 * call: an exception right after it (a Ctrl-C) drops the object, whose dealloc
 * releases the channel and so closes the descriptor, where a descriptor made by
 * Python and handed to the channel in a later step leaked (invariant 21).
 * wake_main: a signal run also schedules pending_notify on the main thread. */
static int dispatcher_init(PyObject *self_, PyObject *args, PyObject *kwargs) {
    dispatcher *d = (dispatcher *)self_;
    PyObject *invalid_state = Py_None, *on_fault = Py_None;
    int wake_main, nonblocking = 0, resolve = 0;
    static char *keywords[] = {"wake_main",     "nonblocking", "resolve",
                               "invalid_state", "on_fault",    NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "p|ppOO:Dispatcher", keywords, &wake_main,
                                     &nonblocking, &resolve, &invalid_state, &on_fault))
        return -1;
    if (d->waiting != NULL || d->ch != NULL) { /* made, maybe cleared since */
        PyErr_SetString(PyExc_RuntimeError, "a Dispatcher is made once");
        return -1;
    }
    channel *ch = calloc(1, sizeof(channel));
    if (ch == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    ch->fd = eventfd(0, EFD_CLOEXEC | (nonblocking ? EFD_NONBLOCK : 0));
    if (ch->fd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        free(ch);
        return -1;
    }
    atomic_store(&ch->refs, 1);
    ch->wake_main = wake_main;
    d->waiting = PyDict_New();
    if (d->waiting == NULL || pthread_mutex_init(&d->lock, NULL)) {
        Py_CLEAR(d->waiting);
        channel_release(ch);
        PyErr_NoMemory();
        return -1;
    }
    d->ch = ch;
    d->mode = resolve ? DISPATCH_RESOLVE : DISPATCH_CALL;
    d->invalid_state = invalid_state == Py_None ? NULL : Py_NewRef(invalid_state);
    d->on_fault = on_fault == Py_None ? NULL : Py_NewRef(on_fault);
    return 0;
}

/* The channel's descriptor, which its readers wait on (a loop's add_reader, the
 * callbacks thread's read); -1 where the Dispatcher was never made. */
static PyObject *dispatcher_fd(PyObject *self_, void *unused) {
    (void)unused;
    dispatcher *d = (dispatcher *)self_;
    return PyLong_FromLong(d->ch == NULL ? -1 : d->ch->fd);
}

static PyGetSetDef dispatcher_getset[] = {
    {"fd", dispatcher_fd, NULL, "The channel's eventfd, which its readers wait on.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static int dispatcher_traverse(PyObject *self_, visitproc visit, void *arg) {
    dispatcher *d = (dispatcher *)self_;
    Py_VISIT(d->waiting);
    Py_VISIT(d->invalid_state);
    Py_VISIT(d->on_fault);
    return 0;
}

static int dispatcher_clear(PyObject *self_) {
    dispatcher *d = (dispatcher *)self_;
    Py_CLEAR(d->waiting);
    Py_CLEAR(d->invalid_state);
    Py_CLEAR(d->on_fault);
    return 0;
}

static void dispatcher_dealloc(PyObject *self_) {
    dispatcher *d = (dispatcher *)self_;
    PyObject_GC_UnTrack(self_);
    dispatcher_clear(self_);
    if (d->ch != NULL) {
        pthread_mutex_destroy(&d->lock);
        /* Not once the interpreter is finalizing: a reader on a daemon thread may
         * still wait on the descriptor (invariant 6: leak rather than dangle). */
        if (!nhf_interpreter_finalizing())
            channel_release(d->ch);
    }
    free(d->due);
    Py_TYPE(self_)->tp_free(self_);
}

static PyMethodDef dispatcher_methods[] = {
    {"run", (PyCFunction)(void (*)(void))dispatcher_run, METH_FASTCALL,
     "run($self, block=True, read_first=False, nested=False, /)\n--\n\n"
     "Returns how many entries the batch acted on, oldest first."},
    {"launch", (PyCFunction)(void (*)(void))dispatcher_launch, METH_FASTCALL,
     "launch($self, route, target, owner, entry, /)\n--\n\n"
     "Returns (status, task): register and enqueue."},
    {"outstanding", dispatcher_outstanding, METH_NOARGS,
     "outstanding($self, /)\n--\n\n"
     "Entries registered, not acted on."},
    {"due", dispatcher_due, METH_NOARGS,
     "due($self, /)\n--\n\n"
     "Keys taken from the channel, not acted on yet."},
    {"faulted", dispatcher_faulted, METH_NOARGS,
     "faulted($self, /)\n--\n\n"
     "Entries whose launch a device fault failed (dropped, or failed by on_fault)."},
    {"running_here", dispatcher_running_here, METH_NOARGS,
     "running_here($self, /)\n--\n\n"
     "Whether this thread is running the batch (an entry that drains)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject dispatcher_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "numba_hostfn._core.Dispatcher",
    .tp_doc = "Dispatcher(wake_main, nonblocking=False, resolve=False, invalid_state=None, "
              "on_fault=None)\n--\n\n"
              "A new channel over a new eventfd (fd), and what its signals act on, "
              "registered and run without a Python-level window.",
    .tp_basicsize = sizeof(dispatcher),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = dispatcher_init,
    .tp_dealloc = dispatcher_dealloc,
    .tp_traverse = dispatcher_traverse,
    .tp_clear = dispatcher_clear,
    .tp_methods = dispatcher_methods,
    .tp_getset = dispatcher_getset,
};

/* ---- a done_future's done callbacks ------------------------------------------ */

/* Keep the exception set now as the call's first BaseException (*kept), or, if one
 * is kept already, report it to sys.unraisablehook with culprit: never swallowed. */
static void keep_first(PyObject *kept[3], PyObject *culprit) {
    if (kept[0] == NULL)
        PyErr_Fetch(&kept[0], &kept[1], &kept[2]);
    else
        PyErr_WriteUnraisable(culprit);
}

/* Call a done_future's done callbacks, oldest first, each with the future, as
 * concurrent.futures calls them: an Exception a callback raises goes to
 * report(future, error) (which logs it, as concurrent.futures does) and the next
 * callback runs; a BaseException (a Ctrl-C landing in a callback, a signal
 * handler's exception) is kept in kept (keep_first) and the rest run.  The list is
 * read afresh at each step, as concurrent.futures iterates it.  GIL held. */
static void call_callbacks(PyObject *callbacks, PyObject *future, PyObject *report,
                           PyObject *kept[3]) {
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(callbacks); i++) {
        PyObject *callback = Py_NewRef(PyList_GET_ITEM(callbacks, i));
        PyObject *result = PyObject_CallOneArg(callback, future);
        if (result == NULL && PyErr_ExceptionMatches(PyExc_Exception)) {
            PyObject *type, *value, *traceback;
            PyErr_Fetch(&type, &value, &traceback);
            PyErr_NormalizeException(&type, &value, &traceback);
            if (traceback != NULL)
                PyException_SetTraceback(value, traceback);
            result = PyObject_CallFunctionObjArgs(report, future, value, NULL);
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(traceback);
            if (result == NULL && PyErr_ExceptionMatches(PyExc_Exception))
                PyErr_WriteUnraisable(report);
            else if (result == NULL)
                keep_first(kept, report);
        } else if (result == NULL) {
            keep_first(kept, callback);
        }
        Py_XDECREF(result);
        Py_DECREF(callback);
    }
}

/* Raise the kept exception, if any (NULL), else return ok (a new reference). */
static PyObject *raise_kept(PyObject *kept[3], PyObject *ok) {
    if (kept[0] != NULL) {
        PyErr_Restore(kept[0], kept[1], kept[2]);
        return NULL;
    }
    return Py_NewRef(ok);
}

/* call_done_callbacks(callbacks, future, report): GIL held, on the thread that
 * cancels a done_future (concurrent.futures' cancel() calls _invoke_callbacks,
 * which calls this).  call_callbacks in one native call: no bytecode lies between
 * two callbacks, so an asynchronous exception lands inside a callback or after the
 * last, and strands none of the rest, which nothing would call later; the first
 * BaseException is raised once every callback has run (a later one goes to
 * sys.unraisablehook).  LIFETIME.md, invariant 21. */
static PyObject *py_call_done_callbacks(PyObject *self, PyObject *const *args,
                                        Py_ssize_t nargs) {
    (void)self;
    if (nhf_check_nargs("call_done_callbacks(callbacks, future, report)", nargs, 3) < 0)
        return NULL;
    if (!PyList_Check(args[0])) {
        PyErr_Format(PyExc_TypeError, "call_done_callbacks() expected a list, got %.100s",
                     Py_TYPE(args[0])->tp_name);
        return NULL;
    }
    PyObject *kept[3] = {NULL, NULL, NULL};
    call_callbacks(args[0], args[1], args[2], kept);
    return raise_kept(kept, Py_None);
}

/* Call method(future) of each of a future's concurrent.futures waiters (wait()'s,
 * as_completed()'s), the list read afresh at each step; a BaseException is kept
 * and the rest are called.  What runs inside one waiter's method (a few
 * bytecodes of concurrent.futures) is the one place left where an asynchronous
 * exception can strand that waiter.  GIL held, the future's lock held. */
static void tell_waiters(PyObject *future, const char *method, PyObject *kept[3]) {
    PyObject *waiters = PyObject_GetAttrString(future, "_waiters");
    if (waiters == NULL || !PyList_Check(waiters)) {
        if (waiters != NULL)
            PyErr_Format(PyExc_TypeError, "a done_future's _waiters is a %.100s, not a list",
                         Py_TYPE(waiters)->tp_name);
        keep_first(kept, future);
        Py_XDECREF(waiters);
        return;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(waiters); i++) {
        PyObject *waiter = Py_NewRef(PyList_GET_ITEM(waiters, i));
        PyObject *result = PyObject_CallMethod(waiter, method, "O", future);
        if (result == NULL)
            keep_first(kept, waiter);
        Py_XDECREF(result);
        Py_DECREF(waiter);
    }
    Py_DECREF(waiters);
}

/* Wake every thread waiting on condition (a threading.Condition whose lock this
 * thread holds), as its notify_all() does, but natively: each waiter's lock is
 * taken off the condition's deque and released with no bytecode between, where
 * notify_all's Python loop, interrupted, left the rest waiting for ever.  A waiter
 * whose wait timed out meanwhile removes itself under the lock, which is ours. */
static void wake_all(PyObject *condition, PyObject *kept[3]) {
    PyObject *waiters = PyObject_GetAttrString(condition, "_waiters");
    if (waiters == NULL) {
        keep_first(kept, condition);
        return;
    }
    for (;;) {
        Py_ssize_t left = PyObject_Length(waiters);
        if (left <= 0) {
            if (left < 0)
                keep_first(kept, waiters);
            break;
        }
        PyObject *waiter = PyObject_CallMethod(waiters, "popleft", NULL);
        if (waiter == NULL) {
            keep_first(kept, waiters);
            break;
        }
        PyObject *result = PyObject_CallMethod(waiter, "release", NULL);
        if (result == NULL && PyErr_ExceptionMatches(PyExc_RuntimeError))
            PyErr_Clear(); /* released already, as notify() allows */
        else if (result == NULL)
            keep_first(kept, waiter);
        Py_XDECREF(result);
        Py_DECREF(waiter);
    }
    Py_DECREF(waiters);
}

/* concurrent.futures' states that settle_future sets (equal strings are the same
 * state to it: it compares them by value); made once, kept for the process. */
static PyObject *finished_state, *cancelled_notified_state;

static int state_is(PyObject *state, const char *name) {
    return PyUnicode_Check(state) && PyUnicode_CompareWithASCIIString(state, name) == 0;
}

/* settle_future(future, outcome, failed, report): GIL held.  Set a done_future's
 * result (outcome), or its exception (outcome, when failed), as concurrent.futures'
 * set_result and set_exception do, from PENDING or RUNNING, and return True; or
 * return False where it is settled already (or cancelled: its waiters are told, as
 * set_running_or_notify_cancel tells them).  In one native call: the future's lock
 * is taken (interrupted there, nothing has changed) and given back natively, its
 * waiting threads woken natively (wake_all), and its done callbacks called
 * (call_callbacks) once it is FINISHED, so that an asynchronous exception raised
 * in between (a Ctrl-C in the main thread's result()) strands none of them: it is
 * raised once all is done.  Before, concurrent.futures' Python did it, and a
 * Ctrl-C after its state change left the callbacks uncalled, or the condition's
 * waiters asleep, or its lock held.  LIFETIME.md, invariant 21. */
static PyObject *py_settle_future(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nhf_check_nargs("settle_future(future, outcome, failed, report)", nargs, 4) < 0)
        return NULL;
    PyObject *future = args[0], *outcome = args[1], *report = args[3];
    int failed = PyObject_IsTrue(args[2]);
    if (failed < 0)
        return NULL;
    PyObject *condition = PyObject_GetAttrString(future, "_condition");
    PyObject *lock = condition == NULL ? NULL : PyObject_GetAttrString(condition, "_lock");
    PyObject *acquired = lock == NULL ? NULL : PyObject_CallMethod(lock, "acquire", NULL);
    if (acquired == NULL) {
        Py_XDECREF(lock);
        Py_XDECREF(condition);
        return NULL; /* nothing has changed */
    }
    Py_DECREF(acquired);
    PyObject *kept[3] = {NULL, NULL, NULL};
    PyObject *settled = Py_False;
    PyObject *state = PyObject_GetAttrString(future, "_state");
    if (state == NULL) {
        keep_first(kept, future);
    } else if (state_is(state, "PENDING") || state_is(state, "RUNNING")) {
        if (PyObject_SetAttrString(future, failed ? "_exception" : "_result", outcome) < 0 ||
            PyObject_SetAttrString(future, "_state", finished_state) < 0) {
            keep_first(kept, future);
        } else {
            settled = Py_True;
            tell_waiters(future, failed ? "add_exception" : "add_result", kept);
            wake_all(condition, kept);
        }
    } else if (state_is(state, "CANCELLED")) {
        if (PyObject_SetAttrString(future, "_state", cancelled_notified_state) < 0)
            keep_first(kept, future);
        else
            tell_waiters(future, "add_cancelled", kept);
    } else if (!state_is(state, "CANCELLED_AND_NOTIFIED") && !state_is(state, "FINISHED")) {
        PyErr_Format(PyExc_RuntimeError, "a done_future in an unexpected state: %R", state);
        keep_first(kept, future);
    }
    Py_XDECREF(state);
    PyObject *released = PyObject_CallMethod(lock, "release", NULL);
    if (released == NULL)
        keep_first(kept, lock);
    Py_XDECREF(released);
    Py_DECREF(lock);
    Py_DECREF(condition);
    if (settled == Py_True) {
        PyObject *callbacks = PyObject_GetAttrString(future, "_done_callbacks");
        if (callbacks != NULL && PyList_Check(callbacks))
            call_callbacks(callbacks, future, report, kept);
        else if (callbacks != NULL)
            PyErr_Format(PyExc_TypeError, "a done_future's _done_callbacks is a %.100s",
                         Py_TYPE(callbacks)->tp_name);
        if (PyErr_Occurred())
            keep_first(kept, future);
        Py_XDECREF(callbacks);
    }
    return raise_kept(kept, settled);
}

/* set_notify_callable(callable): what the pending call calls; kept for the
 * process's life. */
static PyObject *py_set_notify_callable(PyObject *self, PyObject *callable) {
    (void)self;
    Py_INCREF(callable);
    PyObject *old = atomic_exchange(&notify_callable, callable);
    Py_XDECREF(old);
    Py_RETURN_NONE;
}

/* set_any_thread_pending(add, interpreter): 3.12's _PyEval_AddPendingCall. */
static PyObject *py_set_any_thread_pending(PyObject *self, PyObject *const *args,
                                           Py_ssize_t nargs) {
    (void)self;
    void *add, *interp;
    if (nhf_check_nargs("set_any_thread_pending(add, interpreter)", nargs, 2) < 0)
        return NULL;
    if (nhf_address_arg(args[0], &add) < 0 || nhf_address_arg(args[1], &interp) < 0)
        return NULL;
    main_interpreter = interp;
    atomic_store(&any_thread_pending, (add_pending_fn)(uintptr_t)add);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"call_done_callbacks", (PyCFunction)(void (*)(void))py_call_done_callbacks, METH_FASTCALL,
     "call_done_callbacks($module, callbacks, future, report, /)\n--\n\n"
     "Call a done_future's done callbacks, each with the future; raise the first "
     "BaseException after the last."},
    {"settle_future", (PyCFunction)(void (*)(void))py_settle_future, METH_FASTCALL,
     "settle_future($module, future, outcome, failed, report, /)\n--\n\n"
     "Set a done_future's result or exception, wake its waiters and call its done "
     "callbacks, in one native call; False where it was settled already."},
    {"set_notify_callable", py_set_notify_callable, METH_O,
     "set_notify_callable($module, callable, /)\n--\n\n"
     "The callable the notification pending call calls."},
    {"set_any_thread_pending", (PyCFunction)(void (*)(void))py_set_any_thread_pending,
     METH_FASTCALL,
     "set_any_thread_pending($module, add, interpreter, /)\n--\n\n"
     "Python 3.12's pending call."},
    {NULL, NULL, 0, NULL},
};

int nhf_notify_init(PyObject *module) {
    finished_state = PyUnicode_InternFromString("FINISHED");
    cancelled_notified_state = PyUnicode_InternFromString("CANCELLED_AND_NOTIFIED");
    if (finished_state == NULL || cancelled_notified_state == NULL)
        return -1;
    if (PyModule_AddFunctions(module, methods) < 0 || PyType_Ready(&dispatcher_type) < 0 ||
        PyModule_AddObjectRef(module, "Dispatcher", (PyObject *)&dispatcher_type) < 0)
        return -1;
    nhf_fault_on_record_failed(record_failed); /* the watchdog calls up through it */
    return nhf_add_address(module, "SIGNAL", (void *)(uintptr_t)nhf_signal);
}
