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
 * and writes again, so no wake-up is lost.  Takes of one channel are
 * serialized by its own mutex.
 *
 * A channel is reference counted: Python holds one reference while it reads
 * it, and each signal not yet run holds one.  The last release frees the
 * signals nobody took and closes the descriptor: nothing writes to it after
 * that, so a descriptor number the OS hands out again is never written
 * (LIFETIME.md, invariant 17).
 */
#include "nhf.h"

#include <stdlib.h>
#include <unistd.h>

typedef struct signal_node {
    struct signal_node *next;
    struct channel *channel;
    uint64_t key;
} signal_node;

typedef struct channel {
    atomic_long refs;
    int fd;        /* an eventfd, closed by the last release */
    int wake_main; /* also schedule pending_notify on the main thread */
    _Atomic(signal_node *) pushed; /* signals run, newest first (lock-free) */
    pthread_mutex_t take_lock;     /* one reader at a time; guards taken */
    signal_node *taken;            /* signals taken, oldest first */
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
    pthread_mutex_destroy(&ch->take_lock);
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
 * thread) calls the notify callable, GIL held.  Its errors are reported, never
 * raised into whatever that thread was running. */
static int pending_notify(void *unused) {
    (void)unused;
    atomic_store(&notify_scheduled, 0);
    PyObject *callable = atomic_load(&notify_callable);
    if (nhf_guard_open() && callable != NULL)
        Py_XDECREF(nhf_call_reporting(callable));
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

/* ---- from Python ---------------------------------------------------------------- */

static channel *channel_arg(PyObject *value) {
    void *ch;
    if (nhf_address_arg(value, &ch) < 0)
        return NULL;
    if (ch == NULL)
        PyErr_SetString(PyExc_ValueError, "a NULL notification channel");
    return ch;
}

/* channel_new(fd, wake_main): a channel over the eventfd fd, with one reference
 * (the caller's), which from now on owns the descriptor. */
static PyObject *py_channel_new(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "channel_new(fd, wake_main)");
        return NULL;
    }
    long fd = PyLong_AsLong(args[0]);
    int wake_main = PyObject_IsTrue(args[1]);
    if ((fd == -1 && PyErr_Occurred()) || wake_main < 0)
        return NULL;
    channel *ch = calloc(1, sizeof(channel));
    if (ch == NULL || pthread_mutex_init(&ch->take_lock, NULL)) {
        free(ch);
        return PyErr_NoMemory();
    }
    atomic_store(&ch->refs, 1);
    ch->fd = fd;
    ch->wake_main = wake_main;
    return PyLong_FromVoidPtr(ch);
}

static PyObject *py_channel_release(PyObject *self, PyObject *arg) {
    (void)self;
    channel *ch = channel_arg(arg);
    if (ch == NULL)
        return NULL;
    channel_release(ch);
    Py_RETURN_NONE;
}

/* channel_take(channel) -> list: the keys of the signals that have run since
 * the last take, oldest first; their nodes are freed. */
static PyObject *py_channel_take(PyObject *self, PyObject *arg) {
    (void)self;
    channel *ch = channel_arg(arg);
    if (ch == NULL)
        return NULL;
    PyObject *keys = PyList_New(0);
    if (keys == NULL)
        return NULL;
    pthread_mutex_lock(&ch->take_lock);
    if (ch->taken == NULL) {
        signal_node *node = atomic_exchange(&ch->pushed, NULL), *oldest = NULL;
        while (node != NULL) { /* newest first -> oldest first */
            signal_node *following = node->next;
            node->next = oldest;
            oldest = node;
            node = following;
        }
        ch->taken = oldest;
    }
    while (ch->taken != NULL) {
        PyObject *key = PyLong_FromUnsignedLongLong(ch->taken->key);
        if (key == NULL || PyList_Append(keys, key) < 0) {
            Py_XDECREF(key);
            Py_CLEAR(keys); /* what is left stays taken, for the next take */
            break;
        }
        Py_DECREF(key);
        signal_node *next = ch->taken->next;
        free(ch->taken);
        ch->taken = next;
    }
    pthread_mutex_unlock(&ch->take_lock);
    return keys;
}

/* enqueue_signal(enqueue_fn, target, trampoline, channel, key, owner) -> status:
 * the enqueue builtin (enqueue.c) with a signal of (channel, key) in place of
 * fn(arg).  The signal is made here and, if the enqueue refused it, freed here:
 * it never reaches Python, so no exception raised in Python around this call (a
 * Ctrl-C, or one a pending call raises, after the enqueue) can free a signal
 * that the stream, and then the channel's reader, owns. */
static PyObject *py_enqueue_signal(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError,
                        "enqueue_signal(enqueue_fn, handle, trampoline, channel, key, owner) "
                        "takes 6 arguments");
        return NULL;
    }
    void *enqueue_fn, *target, *trampoline;
    if (nhf_address_arg(args[0], &enqueue_fn) < 0 || nhf_address_arg(args[1], &target) < 0 ||
        nhf_address_arg(args[2], &trampoline) < 0)
        return NULL;
    channel *ch = channel_arg(args[3]);
    uint64_t key = ch == NULL ? 0 : PyLong_AsUnsignedLongLong(args[4]);
    if (ch == NULL || PyErr_Occurred())
        return NULL;
    signal_node *node = malloc(sizeof(signal_node));
    if (node == NULL)
        return PyLong_FromUnsignedLongLong(NHF_OUT_OF_MEMORY);
    atomic_fetch_add(&ch->refs, 1);
    *node = (signal_node){NULL, ch, key};
    uint64_t status =
        nhf_enqueue_record((nhf_enqueue_fn)(uintptr_t)enqueue_fn, target,
                           (nhf_hostfn)(uintptr_t)trampoline, nhf_signal, node, NULL, args[5]);
    if (status != 0 && !(status & NHF_KEPT)) {
        free(node);
        channel_release(ch);
        if (status == NHF_NO_RECORD)
            return NULL;
    }
    return PyLong_FromUnsignedLongLong(status);
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

/* call_reporting(callable): call it, reporting its exception (invariant 18). */
static PyObject *py_call_reporting(PyObject *self, PyObject *callable) {
    (void)self;
    Py_XDECREF(nhf_call_reporting(callable));
    Py_RETURN_NONE;
}

/* set_any_thread_pending(add, interpreter): 3.12's _PyEval_AddPendingCall. */
static PyObject *py_set_any_thread_pending(PyObject *self, PyObject *const *args,
                                           Py_ssize_t nargs) {
    (void)self;
    void *add, *interp;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "set_any_thread_pending(add, interpreter)");
        return NULL;
    }
    if (nhf_address_arg(args[0], &add) < 0 || nhf_address_arg(args[1], &interp) < 0)
        return NULL;
    main_interpreter = interp;
    atomic_store(&any_thread_pending, (add_pending_fn)(uintptr_t)add);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"channel_new", (PyCFunction)(void (*)(void))py_channel_new, METH_FASTCALL,
     "channel_new(fd, wake_main) -> channel address"},
    {"channel_release", py_channel_release, METH_O, "Drop one reference to the channel."},
    {"channel_take", py_channel_take, METH_O,
     "channel_take(channel) -> the keys of the signals run since the last take, oldest first"},
    {"enqueue_signal", (PyCFunction)(void (*)(void))py_enqueue_signal, METH_FASTCALL,
     "enqueue_signal(enqueue_fn, handle, trampoline, channel, key, owner) -> status"},
    {"set_notify_callable", py_set_notify_callable, METH_O,
     "The callable the notification pending call calls."},
    {"call_reporting", py_call_reporting, METH_O,
     "Call callable(); report an exception (a KeyboardInterrupt is delivered again)."},
    {"set_any_thread_pending", (PyCFunction)(void (*)(void))py_set_any_thread_pending,
     METH_FASTCALL, "set_any_thread_pending(add, interpreter): Python 3.12's pending call."},
    {NULL, NULL, 0, NULL},
};

int nhf_notify_init(PyObject *module) {
    if (PyModule_AddFunctions(module, methods) < 0)
        return -1;
    return nhf_add_address(module, "SIGNAL", (void *)(uintptr_t)nhf_signal);
}
