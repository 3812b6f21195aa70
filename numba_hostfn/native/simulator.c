/* The simulator: simulated streams, the simulated context's one host-function
 * thread, and the simulated graphs, whose owners stand in for CUDA user objects.
 *
 * A simulated stream is a FIFO of items that the stream's own native thread
 * (its "device engine") takes in order.  A *device* item (simulated device
 * work: a delay, a compiled "kernel", a stream memory operation) runs on that
 * thread.  A *host* item (a host function, as cuLaunchHostFunc enqueues it) is
 * handed to the context's host-function thread, and the stream waits until it
 * has run.  So, as on the driver, the host functions of all streams run one at
 * a time on one thread, and each stream waits for its own.  Every thread here
 * is native, foreign to Python; none touches CPython but through the
 * trampolines.
 */
#include "nhf.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum lane { LANE_DEVICE, LANE_HOST };

/* A simulated context: a fault domain.  Its streams share the one host-function
 * thread (the simulator models one thread for all contexts).  A fault (the
 * device work Stream.fault() enqueues) is sticky, as a CUDA kernel fault is:
 * from the moment it runs, no item of the context's streams runs any more
 * (they are dropped), every stream answers the fault to sync() and queries,
 * and enqueues are refused.  Streams made after sim_new_context() belong to a
 * new, healthy context.  Contexts are never freed. */
typedef struct nhf_sim_ctx {
    atomic_uint fault;      /* 0, or the CUresult of the context's fault */
    _Atomic(void *) found;  /* the stream the fault ran on */
} nhf_sim_ctx;

static _Atomic(nhf_sim_ctx *) current_ctx; /* streams made now belong to it */

typedef struct item {
    struct item *next;
    nhf_hostfn fn;
    void *arg;
    enum lane lane;
} item;

struct nhf_sim_stream {
    pthread_mutex_t mutex; /* guards every field below */
    pthread_cond_t wake;     /* an item arrived, or stop */
    pthread_cond_t host_ran; /* host_done was set (apart from wake: an enqueue during a
                              * host function wakes no one who waits for it) */
    pthread_cond_t idle;     /* nothing pending (CLOCK_MONOTONIC, for sync's slices) */
    pthread_cond_t ended;    /* the thread has run its last item (has_ended was set) */
    item *head, *tail;     /* the FIFO */
    long pending;          /* items enqueued and not yet finished */
    /* Items ever appended and ever finished (run or dropped): a sync waits until
     * `ran` reaches what `appended` was when it began, as cuStreamSynchronize waits
     * for the work enqueued before it, not for work other threads enqueue meanwhile. */
    unsigned long long appended, ran;
    int syncing;           /* syncs waiting: `idle` is broadcast at every item then */
    int stopping;          /* refuse new items; the thread ends once empty */
    int has_ended;         /* the thread is past its last item: every closer may return */
    int capturing;         /* enqueues refuse: the capture path records */
    nhf_sim_ctx *ctx;      /* its context, set at creation */
    /* Which stream it is (cuStreamGetId's): a number of its own, set at creation;
     * sim_new_identity gives it another, as CUDA gives a destroyed stream's handle to
     * a new one (an executor's lane then serves another stream). */
    atomic_ullong serial;
    pthread_t thread;
    /* The stream's turn on the host-function thread. */
    nhf_sim_stream *host_next; /* link in the context's queue */
    nhf_hostfn host_fn;
    void *host_arg;
    int host_done;
};

/* The simulated context: its host-function thread and the streams waiting for it. */
static struct {
    pthread_mutex_t mutex;
    pthread_cond_t work; /* a stream handed over a host function */
    nhf_sim_stream *head, *tail;
    pthread_t thread;
    int started;
} context = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, NULL, 0, 0};

/* The context's host-function thread, which writes its own id once, as it starts:
 * a host function runs there, and CUDA forbids a host function any CUDA call.  Not
 * a _Thread_local: every enqueueing thread would read it, and a dlopen'ed module's
 * lazily allocated dynamic TLS is reported by TSan as a race with the exit of a
 * pool thread (trampolines.c says the same of its key). */
static pthread_t host_thread_id;
static atomic_int host_thread_known;

/* Any thread: whether it is the context's host-function thread. */
static bool on_host_function_thread(void) {
    return atomic_load_explicit(&host_thread_known, memory_order_acquire) &&
           pthread_equal(pthread_self(), host_thread_id);
}

/* ---- enqueue (without the GIL) ------------------------------------------------ */

static item *new_item(nhf_hostfn fn, void *arg, enum lane lane) {
    item *it = malloc(sizeof(item));
    if (it != NULL) {
        it->next = NULL;
        it->fn = fn;
        it->arg = arg;
        it->lane = lane;
    }
    return it;
}

/* Under the stream's mutex: append a chain of n items, first..last. */
static void append_locked(nhf_sim_stream *stream, item *first, item *last, long n) {
    if (stream->tail == NULL)
        stream->head = first;
    else
        stream->tail->next = first;
    stream->tail = last;
    stream->pending += n;
    stream->appended += (unsigned long long)n;
    pthread_cond_signal(&stream->wake);
}

/* Under the stream's mutex: 0, or why the stream takes nothing now.  A host
 * function that enqueues (a launch, a copy, a replay, an executor's stream
 * operations) is refused first: on CUDA it would call cuLaunchHostFunc (or
 * cuGraphLaunch, cuStreamWriteValue32) from a host function, which CUDA forbids
 * (the driver may refuse it or deadlock); nothing is enqueued. */
static uint64_t refusal_locked(nhf_sim_stream *stream) {
    if (on_host_function_thread())
        return NHF_IN_HOST_FUNCTION;
    unsigned fault = atomic_load(&stream->ctx->fault);
    if (fault != 0)
        return NHF_FAULTED | fault; /* as the driver refuses on a faulted context */
    if (stream->stopping)
        return NHF_QUEUE_STOPPED;
    if (stream->capturing)
        return NHF_CAPTURING;
    return 0;
}

static uint64_t enqueue(nhf_sim_stream *stream, nhf_hostfn fn, void *arg, enum lane lane) {
    if (stream == NULL) /* CUDA's legacy stream 0, which the simulator has not */
        return CUDA_ERROR_INVALID_HANDLE;
    item *it = new_item(fn, arg, lane);
    if (it == NULL)
        return NHF_OUT_OF_MEMORY;
    pthread_mutex_lock(&stream->mutex);
    uint64_t status = refusal_locked(stream);
    if (status == 0)
        append_locked(stream, it, it, 1);
    pthread_mutex_unlock(&stream->mutex);
    if (status != 0)
        free(it);
    return status;
}

/* Any thread: a host function, handed to the context's host-function thread
 * when the stream reaches it (the simulator's cuLaunchHostFunc). */
uint64_t nhf_sim_enqueue(void *stream, nhf_hostfn fn, void *arg) {
    return enqueue(stream, fn, arg, LANE_HOST);
}

/* Any thread: simulated device work, run by the stream's own thread. */
uint64_t nhf_sim_enqueue_device(void *stream, nhf_hostfn fn, void *arg) {
    return enqueue(stream, fn, arg, LANE_DEVICE);
}

/* ---- the threads ---------------------------------------------------------------- */

/* The stream whose thread this is (NULL on other threads): its device work
 * finds its context here (a fault, a wait that must stop).  A pthread key, not
 * _Thread_local: the dynamic TLS of a dlopen'ed module is allocated lazily by
 * the loader, which ThreadSanitizer reports as a race at thread exit. */
static pthread_key_t this_stream_key;
static pthread_once_t this_stream_once = PTHREAD_ONCE_INIT;

static void this_stream_key_make(void) { (void)pthread_key_create(&this_stream_key, NULL); }

static nhf_sim_stream *this_stream(void) {
    pthread_once(&this_stream_once, this_stream_key_make);
    return pthread_getspecific(this_stream_key);
}

/* Any thread (a stream's): simulated device work that faults: the stream's
 * context has the sticky error (uintptr_t)arg from now on. */
static void sim_fault(void *arg) {
    nhf_sim_stream *stream = this_stream();
    unsigned expected = 0;
    unsigned code = (unsigned)(uintptr_t)arg;
    if (atomic_compare_exchange_strong(&stream->ctx->fault, &expected, code)) {
        atomic_store(&stream->ctx->found, stream);
        /* What the driver knows, for the error's message; the watchdog still
         * has to find the fault by querying, as on a GPU. */
        (void)nhf_fault_note(stream->ctx, code, stream);
    }
}

/* Any thread (a stream's, inside device work): whether its context has
 * faulted (a simulated wait stops waiting then, as a faulted GPU does). */
bool nhf_sim_faulted_here(void) {
    nhf_sim_stream *stream = this_stream();
    return stream != NULL && atomic_load(&stream->ctx->fault) != 0;
}

/* ---- stream memory operations, as device work ---------------------------------- */

/* Any thread (a simulated stream's): write op.word := op.value (a graph node's
 * argument: kept for the next replay). */
void nhf_sim_set(void *op_) {
    nhf_sim_word_op *op = op_;
    atomic_store(op->word, op->value);
}

/* Any thread (a simulated stream's): wait until op.word >= op.value (cyclic),
 * polling; a fault of the stream's context ends the wait, as on a GPU. */
void nhf_sim_await(void *op_) {
    nhf_sim_word_op *op = op_;
    while ((int32_t)(atomic_load(op->word) - op->value) < 0 && !nhf_sim_faulted_here())
        usleep(20);
}

void nhf_sim_write_once(void *op) {
    nhf_sim_set(op);
    free(op);
}

void nhf_sim_wait_once(void *op) {
    nhf_sim_await(op);
    free(op);
}

static void replay_end(void *graph_);

/* On a stream's thread: an item a fault keeps from running.  Only what is the
 * simulator's own bookkeeping still runs: the end of a graph replay, which
 * gives the replay's hold on the graph back; a one-time word operation (an
 * executor's) frees its argument. */
static void drop_item(item *it) {
    if (it->fn == nhf_sim_graph_release || it->fn == replay_end)
        it->fn(it->arg);
    else if (it->fn == nhf_sim_write_once || it->fn == nhf_sim_wait_once)
        free(it->arg);
}

/* On the stream's thread: hand fn(arg) to the host-function thread and wait
 * until it has run, as a CUDA stream waits for its host function. */
static void run_on_host_thread(nhf_sim_stream *stream, nhf_hostfn fn, void *arg) {
    stream->host_fn = fn;
    stream->host_arg = arg;
    stream->host_next = NULL;
    pthread_mutex_lock(&context.mutex);
    if (context.tail == NULL)
        context.head = stream;
    else
        context.tail->host_next = stream;
    context.tail = stream;
    pthread_cond_signal(&context.work);
    pthread_mutex_unlock(&context.mutex);
    pthread_mutex_lock(&stream->mutex);
    while (!stream->host_done)
        pthread_cond_wait(&stream->host_ran, &stream->mutex);
    stream->host_done = 0;
    pthread_mutex_unlock(&stream->mutex);
}

/* A stream's thread: run its items in order until it is stopped and empty. */
static void *stream_main(void *stream_) {
    nhf_sim_stream *stream = stream_;
    pthread_once(&this_stream_once, this_stream_key_make);
    (void)pthread_setspecific(this_stream_key, stream);
    pthread_mutex_lock(&stream->mutex);
    for (;;) {
        item *it = stream->head;
        if (it == NULL) {
            if (stream->stopping)
                break;
            pthread_cond_wait(&stream->wake, &stream->mutex);
            continue;
        }
        stream->head = it->next;
        if (stream->head == NULL)
            stream->tail = NULL;
        pthread_mutex_unlock(&stream->mutex);
        if (atomic_load(&stream->ctx->fault) != 0)
            drop_item(it); /* host work behind a fault never runs (invariant 23) */
        else if (it->lane == LANE_HOST)
            run_on_host_thread(stream, it->fn, it->arg);
        else
            it->fn(it->arg);
        free(it);
        pthread_mutex_lock(&stream->mutex);
        stream->ran++;
        if (--stream->pending == 0 || stream->syncing > 0)
            pthread_cond_broadcast(&stream->idle);
    }
    stream->has_ended = 1; /* stopping and empty: nothing of the stream runs any more */
    pthread_cond_broadcast(&stream->ended);
    pthread_mutex_unlock(&stream->mutex);
    return NULL;
}

/* The context's host-function thread: run the host functions that streams hand
 * over, one at a time, in the order they were reached.  It runs until the
 * process ends, like the driver's. */
static void *host_thread_main(void *unused) {
    (void)unused;
    host_thread_id = pthread_self();
    atomic_store_explicit(&host_thread_known, 1, memory_order_release);
    nhf_mark_host_function_thread(); /* a HostExecutor's close() from here: refused */
    pthread_mutex_lock(&context.mutex);
    for (;;) {
        nhf_sim_stream *stream = context.head;
        if (stream == NULL) {
            pthread_cond_wait(&context.work, &context.mutex);
            continue;
        }
        context.head = stream->host_next;
        if (context.head == NULL)
            context.tail = NULL;
        pthread_mutex_unlock(&context.mutex);
        if (atomic_load(&stream->ctx->fault) == 0) /* else it never runs */
            stream->host_fn(stream->host_arg);
        pthread_mutex_lock(&stream->mutex);
        stream->host_done = 1;
        pthread_cond_signal(&stream->host_ran);
        pthread_mutex_unlock(&stream->mutex);
        pthread_mutex_lock(&context.mutex);
    }
    return NULL;
}

/* Any thread: simulated device work that sleeps for (uintptr_t)arg microseconds;
 * a fault of the stream's context ends it, as a faulted GPU's work ends. */
void nhf_sim_delay(void *arg) {
    uintptr_t left = (uintptr_t)arg;
    while (left > 0 && !nhf_sim_faulted_here()) {
        unsigned chunk = left > 10000 ? 10000 : (unsigned)left;
        usleep(chunk);
        left -= chunk;
    }
}

/* ---- simulated graphs: their nodes, and what they own, like a CUDA user object ------------- */

/* A simulated graph holds its records and its nodes, and a count of references:
 * the graph definition, each executable graph, each replay not yet finished.
 * The last release completes every record (invariant 8). */
typedef struct node {
    int device; /* device work, else a host function */
    nhf_hostfn fn;
    void *arg;
} node;

typedef struct sim_graph {
    atomic_long refs;
    pthread_mutex_t lock; /* guards records and nodes */
    nhf_record *records;  /* linked through their next field */
    node *nodes;
    size_t count, capacity;
    int ended; /* the capture ended: it takes no more nodes (guarded by lock) */
    /* Replays are ordered as CUDA orders the launches of one executable graph
     * (cuGraphLaunch: behind its previous launches), whatever their streams: an
     * executor node's slot words serve one replay at a time (invariant 16).  A
     * replay takes a ticket as it is appended, waits until `finished` reaches it,
     * and adds one to `finished` as it ends. */
    _Atomic uint32_t issued, finished;
} sim_graph;

/* Any thread (the last item of every replay, on a stream's thread). */
void nhf_sim_graph_release(void *graph_) {
    sim_graph *k = graph_;
    if (atomic_fetch_sub(&k->refs, 1) != 1)
        return;
    nhf_record *record = k->records;
    while (record != NULL) {
        nhf_record *following = record->next;
        nhf_record_complete(record);
        record = following;
    }
    pthread_mutex_destroy(&k->lock);
    free(k->nodes);
    free(k);
}

/* The capture of graph k has ended: a node added from now on is refused
 * (graph_add_node answers False).  Under the graph's lock: an add that took it
 * first is a node of the capture, made before its end. */
static void graph_end(sim_graph *k) {
    pthread_mutex_lock(&k->lock);
    k->ended = 1;
    pthread_mutex_unlock(&k->lock);
}

/* A replay's last item (a stream's thread, or drop_item behind a fault): the next
 * replay of the graph may start, and the replay's reference is given back. */
static void replay_end(void *graph_) {
    sim_graph *k = graph_;
    atomic_fetch_add(&k->finished, 1);
    nhf_sim_graph_release(k);
}

/* Without the GIL: one replay of the graph's nodes on the stream, all of it or
 * nothing.  The caller took the replay's reference to k with the GIL held, so
 * a close racing the replay cannot free k under it.  Every item is made first,
 * then the whole chain (the nodes, then the release of that reference) is
 * appended under the stream's mutex in one step; a refused replay gives the
 * reference back here: a refused or interrupted replay enqueues nothing and
 * holds nothing (issue 27: a half-enqueued replay whose
 * hold was dropped let the graph free a buffer its queued nodes still wrote). */
static uint64_t replay(nhf_sim_stream *stream, sim_graph *k) {
    nhf_sim_word_op *turn = malloc(sizeof(nhf_sim_word_op));
    item *first = turn == NULL ? NULL : new_item(nhf_sim_wait_once, turn, LANE_DEVICE);
    item *last = first;
    uint64_t status = first == NULL ? NHF_OUT_OF_MEMORY : 0;
    if (first == NULL)
        free(turn);
    pthread_mutex_lock(&k->lock);
    size_t count = k->count;
    for (size_t i = 0; i <= count && status == 0; i++) {
        item *it = i < count ? new_item(k->nodes[i].fn, k->nodes[i].arg,
                                        k->nodes[i].device ? LANE_DEVICE : LANE_HOST)
                             : new_item(replay_end, k, LANE_DEVICE);
        if (it == NULL) {
            status = NHF_OUT_OF_MEMORY;
            break;
        }
        last->next = it;
        last = it;
    }
    pthread_mutex_unlock(&k->lock);
    if (status == 0) {
        pthread_mutex_lock(&stream->mutex);
        status = refusal_locked(stream);
        if (status == 0) { /* the replay's reference, dropped by its last item */
            *turn = (nhf_sim_word_op){&k->finished, atomic_fetch_add(&k->issued, 1)};
            append_locked(stream, first, last, (long)count + 2);
        }
        pthread_mutex_unlock(&stream->mutex);
    }
    if (status != 0) {
        if (first != NULL)
            free(turn);
        while (first != NULL) {
            item *following = first->next;
            free(first);
            first = following;
        }
        nhf_sim_graph_release(k); /* refused: the replay holds nothing */
    }
    return status;
}

/* ---- from Python ------------------------------------------------------------------ */

static nhf_sim_stream *stream_arg(PyObject *value) {
    return nhf_pointer_arg(value, "simulated stream");
}

/* A SimGraph: one reference to a graph, given back once, by release() or at
 * collection: one C call, so no exception can come between giving it back and
 * marking it given (a reference lost, or given back twice). */
typedef struct {
    PyObject_HEAD
    _Atomic(sim_graph *) k;
} sim_graph_ref;

static PyTypeObject sim_graph_type;

/* GIL held: the graph of a SimGraph reference.  The reference holds the graph
 * for as long as the GIL is held (giving it back takes the GIL), so the graph
 * is passed as the object, never as a raw address across a GIL release. */
static sim_graph *graph_arg(PyObject *value) {
    if (!PyObject_TypeCheck(value, &sim_graph_type)) {
        PyErr_Format(PyExc_TypeError, "expected a SimGraph, got %R", value);
        return NULL;
    }
    sim_graph *k = atomic_load(&((sim_graph_ref *)value)->k);
    if (k == NULL)
        PyErr_SetString(PyExc_RuntimeError, "the simulated graph is closed");
    return k;
}

/* Start the host-function thread (once per process); a RuntimeError saying why
 * if it could not be started. */
static PyObject *py_context_start(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    int rc = 0;
    pthread_mutex_lock(&context.mutex);
    if (!context.started) {
        rc = pthread_create(&context.thread, NULL, host_thread_main, NULL);
        context.started = rc == 0;
    }
    pthread_mutex_unlock(&context.mutex);
    if (rc != 0)
        return PyErr_Format(PyExc_RuntimeError,
                            "the simulator could not start its host-function thread: %s",
                            strerror(rc));
    Py_RETURN_NONE;
}

/* A new stream with its thread running; NULL if that failed.  Its memory is
 * never freed: a stale handle finds the stream stopped, not freed. */
static nhf_sim_ctx *the_context(void) {
    nhf_sim_ctx *ctx = atomic_load(&current_ctx);
    if (ctx == NULL) {
        nhf_sim_ctx *fresh = calloc(1, sizeof(nhf_sim_ctx));
        if (fresh == NULL)
            return NULL;
        if (atomic_compare_exchange_strong(&current_ctx, &ctx, fresh))
            ctx = fresh;
        else
            free(fresh); /* another thread made the first one */
    }
    return ctx;
}

/* The streams' serial numbers (nhf_sim_stream_id): the last one given. */
static atomic_ullong last_serial;

static nhf_sim_stream *stream_new(void) {
    nhf_sim_ctx *ctx = the_context();
    nhf_sim_stream *stream = ctx == NULL ? NULL : calloc(1, sizeof(nhf_sim_stream));
    if (stream == NULL)
        return NULL;
    stream->ctx = ctx;
    atomic_store(&stream->serial, atomic_fetch_add(&last_serial, 1) + 1);
    if (pthread_mutex_init(&stream->mutex, NULL) || pthread_cond_init(&stream->wake, NULL) ||
        pthread_cond_init(&stream->host_ran, NULL) ||
        nhf_cond_init_monotonic(&stream->idle) || /* wait_idle_for_a_slice's deadlines */
        pthread_cond_init(&stream->ended, NULL) ||
        pthread_create(&stream->thread, NULL, stream_main, stream)) {
        free(stream);
        return NULL;
    }
    return stream;
}

/* Any thread: stream refuses new items, and its thread ends once it is empty;
 * true for the first stop, whose caller joins or detaches the thread. */
static bool stream_stop(nhf_sim_stream *stream) {
    pthread_mutex_lock(&stream->mutex);
    bool first = !stream->stopping;
    stream->stopping = 1;
    pthread_cond_broadcast(&stream->wake);
    pthread_mutex_unlock(&stream->mutex);
    return first;
}

/* The simulated Stream's base type: the native stream it opened, which is the
 * handle host_launch trusts (an instance's __cuda_stream__ must give this one). */
typedef struct {
    PyObject_HEAD
    nhf_sim_stream *stream; /* NULL until _open */
    int opening;            /* an _open is making the stream (GIL released) */
    PyObject *capture;      /* the capture under way (a SimGraph), or NULL: see below */
} sim_stream_object;

static PyObject *sim_stream_open(PyObject *self, PyObject *unused) {
    (void)unused;
    sim_stream_object *object = (sim_stream_object *)self;
    if (object->stream != NULL || object->opening) {
        PyErr_SetString(PyExc_RuntimeError, "the simulated stream is open already");
        return NULL;
    }
    object->opening = 1; /* with the GIL: the check and the claim are one step */
    nhf_sim_stream *stream;
    Py_BEGIN_ALLOW_THREADS
    stream = stream_new();
    Py_END_ALLOW_THREADS
    object->opening = 0;
    if (stream == NULL) {
        PyErr_SetString(PyExc_RuntimeError,
                        "the simulator could not create a stream (memory or thread)");
        return NULL;
    }
    object->stream = stream;
    Py_RETURN_NONE;
}

static PyObject *sim_stream_handle(PyObject *self, void *closure) {
    (void)closure;
    return PyLong_FromVoidPtr(((sim_stream_object *)self)->stream);
}

/* ---- the stream's capture: its SimGraph and the native flag, set together ------ */

/* GIL held: the capture's graph takes no more nodes (SimGraph.end()). */
static void capture_end(PyObject *capture) {
    sim_graph *k = atomic_load(&((sim_graph_ref *)capture)->k);
    if (k != NULL)
        graph_end(k);
}

static void set_capturing(nhf_sim_stream *stream, int capturing) {
    pthread_mutex_lock(&stream->mutex);
    stream->capturing = capturing;
    pthread_mutex_unlock(&stream->mutex);
}

/* _capture_begin(capture) -> whether it began: the stream's capture from now on,
 * unless one is under way.  The record and the flag that makes enqueues refuse in
 * one call with the GIL: two threads that begin at once cannot both begin, and no
 * exception comes between the two (kept apart, a GraphBuilder's __del__ stopped
 * between them left the flag set with no capture, and every later launch on the
 * stream spun for ever). */
static PyObject *sim_stream_capture_begin(PyObject *self, PyObject *capture) {
    sim_stream_object *object = (sim_stream_object *)self;
    if (graph_arg(capture) == NULL)
        return NULL;
    if (object->stream == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the simulated stream is not open");
        return NULL;
    }
    if (object->capture != NULL)
        Py_RETURN_FALSE;
    object->capture = Py_NewRef(capture);
    set_capturing(object->stream, 1);
    Py_RETURN_TRUE;
}

/* _capture_take(only=None) -> the capture, ended, now the caller's; None if none is
 * under way, or if it is not `only` (a GraphBuilder's own, never another's begun
 * since).  A node whose launch read the capture before this goes to the stream, as
 * after cuStreamEndCapture (graph_add_node answers False once it has ended). */
static PyObject *sim_stream_capture_take(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    sim_stream_object *object = (sim_stream_object *)self;
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "_capture_take(only=None) takes at most 1 argument");
        return NULL;
    }
    PyObject *capture = object->capture;
    if (capture == NULL || (nargs == 1 && args[0] != Py_None && args[0] != capture))
        Py_RETURN_NONE;
    object->capture = NULL;
    if (object->stream != NULL)
        set_capturing(object->stream, 0);
    capture_end(capture);
    return capture; /* the stream's reference */
}

static PyObject *sim_stream_capture(PyObject *self, void *closure) {
    (void)closure;
    PyObject *capture = ((sim_stream_object *)self)->capture;
    return Py_NewRef(capture != NULL ? capture : Py_None);
}

/* Collected: a stream still open is stopped, its thread detached (it runs what is
 * queued, then ends), whatever the Python layer above recorded: an exception
 * between _open() and Stream.__init__'s marks (a Ctrl-C while the thread was
 * made) left a stream that nothing stopped.  A stream closed before was joined or
 * detached by that close; in a forked child there is no thread.  A capture no
 * close or end took (a __del__ or close() stopped by an exception before it) is
 * ended and given back, its partial graph's owners with it; in a forked child it is
 * kept (the parent's: its graph's lock may be held, invariant 22). */
static void sim_stream_dealloc(PyObject *self) {
    sim_stream_object *object = (sim_stream_object *)self;
    nhf_sim_stream *stream = object->stream;
    if (stream != NULL && !nhf_forked() && stream_stop(stream))
        pthread_detach(stream->thread);
    PyObject *capture = object->capture;
    object->capture = NULL;
    if (capture != NULL && !nhf_forked()) {
        /* Given back now, as SimGraph.release() does, not when another holder of the
         * reference object (a builder collected with the stream) lets it go. */
        sim_graph *k = atomic_exchange(&((sim_graph_ref *)capture)->k, NULL);
        if (k != NULL) {
            graph_end(k);
            nhf_sim_graph_release(k);
        }
        Py_DECREF(capture);
    }
    Py_TYPE(self)->tp_free(self);
}

static PyMethodDef sim_stream_methods[] = {
    {"_open", sim_stream_open, METH_NOARGS, "_open($self, /)\n--\n\n"
     "Open the native stream (once)."},
    {"_capture_begin", sim_stream_capture_begin, METH_O, "_capture_begin($self, capture, /)\n--\n\n"
     "Begin capturing into capture (a SimGraph), unless a capture is under way."},
    {"_capture_take", (PyCFunction)(void (*)(void))sim_stream_capture_take, METH_FASTCALL,
     "_capture_take($self, only=None, /)\n--\n\n"
     "End the capture under way (only this one, if given) and return it, or None."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef sim_stream_getset[] = {
    {"_handle", sim_stream_handle, NULL, "The native stream's address (0 before _open).", NULL},
    {"_capture", sim_stream_capture, NULL, "The capture under way (a SimGraph), or None.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject sim_stream_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "numba_hostfn._core.SimStreamBase",
    .tp_doc = "A simulated stream's native queue (numba_hostfn.simulator.Stream subclasses "
              "this).",
    .tp_basicsize = sizeof(sim_stream_object),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_new = PyType_GenericNew,
    .tp_dealloc = sim_stream_dealloc,
    .tp_methods = sim_stream_methods,
    .tp_getset = sim_stream_getset,
};

void *nhf_sim_stream_of(PyObject *object) {
    if (!PyObject_TypeCheck(object, &sim_stream_type))
        return NULL;
    return ((sim_stream_object *)object)->stream;
}

/* A host function must not wait for streams (CUDA forbids it any CUDA call):
 * on the host-function thread it would wait for itself, for ever. */
static int refuse_on_host_thread(const char *what) {
    /* The host-function thread, or a host function anywhere (a HostExecutor's task). */
    if (!on_host_function_thread() && !nhf_in_host_function())
        return 0;
    PyErr_Format(PyExc_RuntimeError,
                 "%s was called from a host function, which it would wait for: a host "
                 "function must not wait for a stream (CUDA forbids it any CUDA call)",
                 what);
    return -1;
}

/* How long sync waits, without the GIL, between two checks for signals. */
#define SYNC_SLICE_NS 50000000L /* 50 ms */

/* Without the GIL: wait at most one slice for the stream to have finished its
 * first `target` items; true if it has. */
static int wait_idle_for_a_slice(nhf_sim_stream *stream, unsigned long long target) {
    struct timespec until = nhf_deadline_ns(SYNC_SLICE_NS);
    pthread_mutex_lock(&stream->mutex);
    int timed_out = 0;
    stream->syncing++;
    while (stream->ran < target && !timed_out)
        timed_out = pthread_cond_timedwait(&stream->idle, &stream->mutex, &until) != 0;
    stream->syncing--;
    int idle = stream->ran >= target;
    pthread_mutex_unlock(&stream->mutex);
    return idle;
}

/* Wait, without the GIL, until everything enqueued so far has run.  The wait is
 * taken in slices; between two, with the GIL, Python's signal handlers run
 * (PyErr_CheckSignals, on the main thread), so a Ctrl-C raises KeyboardInterrupt
 * at once instead of after the work, and a handler that returns lets the wait
 * go on (as time.sleep does).  A sync changes nothing on the stream, so one
 * interrupted leaves it as it was: its work still runs, and sync() may be
 * called again.  (CUDA's cuStreamSynchronize is not interrupted: docs/simulator.md.)
 * Returns 0, or the context's fault (work a fault dropped counts as done),
 * as cuStreamSynchronize answers it. */
static PyObject *py_sync(PyObject *self, PyObject *arg) {
    (void)self;
    nhf_sim_stream *stream = stream_arg(arg);
    if (stream == NULL || refuse_on_host_thread("simulator.Stream.sync()") < 0)
        return NULL;
    pthread_mutex_lock(&stream->mutex); /* held only for loads: no GIL wait under it */
    unsigned long long target = stream->appended;
    pthread_mutex_unlock(&stream->mutex);
    for (;;) {
        int idle;
        Py_BEGIN_ALLOW_THREADS
        idle = wait_idle_for_a_slice(stream, target);
        Py_END_ALLOW_THREADS
        if (idle)
            break;
        if (PyErr_CheckSignals() < 0)
            return NULL;
    }
    return PyLong_FromUnsignedLong(atomic_load(&stream->ctx->fault));
}

/* Any thread: the simulator's cuStreamQuery: the context's fault, else
 * NOT_READY (600) while work is pending, else 0.  A closed stream's memory is
 * kept, so a stale handle answers too. */
/* Stream handles the watchdog's thread gave the simulator: none, by design
 * (a user's stream may be destroyed by then; LIFETIME.md, invariant 23). */
static atomic_long watchdog_stream_uses;

int nhf_sim_query(void *stream_) {
    nhf_sim_stream *stream = stream_;
    if (nhf_on_watchdog_thread())
        atomic_fetch_add(&watchdog_stream_uses, 1);
    unsigned fault = atomic_load(&stream->ctx->fault);
    if (fault != 0)
        return (int)fault;
    pthread_mutex_lock(&stream->mutex);
    long pending = stream->pending;
    pthread_mutex_unlock(&stream->mutex);
    return pending > 0 ? 600 : 0;
}

/* Any thread (the watchdog's): the simulator's query of a context: its fault, or 0. */
int nhf_sim_query_context(void *ctx) { return (int)atomic_load(&((nhf_sim_ctx *)ctx)->fault); }

/* Any thread: the simulator's cuStreamGetCtx. */
int nhf_sim_context_of(void *stream_, void **ctx) {
    if (stream_ == NULL)
        return CUDA_ERROR_INVALID_HANDLE; /* no legacy stream 0: enqueue refuses it too */
    if (nhf_on_watchdog_thread())
        atomic_fetch_add(&watchdog_stream_uses, 1);
    *ctx = ((nhf_sim_stream *)stream_)->ctx;
    return 0;
}

/* Any thread: the simulator's cuStreamGetId. */
unsigned long long nhf_sim_stream_id(void *stream) {
    return atomic_load_explicit(&((nhf_sim_stream *)stream)->serial, memory_order_relaxed);
}

/* sim_new_identity(stream) (tests): the stream's id becomes a new one, as if CUDA had
 * given its handle to a new stream; its queue stays the same. */
static PyObject *py_new_identity(PyObject *self, PyObject *arg) {
    (void)self;
    nhf_sim_stream *stream = stream_arg(arg);
    if (stream == NULL)
        return NULL;
    atomic_store(&stream->serial, atomic_fetch_add(&last_serial, 1) + 1);
    Py_RETURN_NONE;
}

/* sim_watchdog_stream_uses() -> how many stream handles the watchdog's thread
 * gave the simulator's query or cuStreamGetCtx (tests: 0). */
static PyObject *py_watchdog_stream_uses(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyLong_FromLong(atomic_load(&watchdog_stream_uses));
}

/* sim_query(stream) -> what nhf_sim_query answers. */
static PyObject *py_query(PyObject *self, PyObject *arg) {
    (void)self;
    nhf_sim_stream *stream = stream_arg(arg);
    return stream == NULL ? NULL : PyLong_FromLong(nhf_sim_query(stream));
}

/* sim_new_context(): streams made from now on belong to a new, healthy context. */
static PyObject *py_new_context(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    nhf_sim_ctx *fresh = calloc(1, sizeof(nhf_sim_ctx));
    if (fresh == NULL)
        return PyErr_NoMemory();
    atomic_store(&current_ctx, fresh); /* the old one is kept: its streams use it */
    return PyLong_FromVoidPtr(fresh);
}

/* in_host_function() -> True on the simulated host-function thread: a host
 * function's call (the capture path asks, which enqueues nothing to refuse). */
static PyObject *py_in_host_function(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyBool_FromLong(on_host_function_thread());
}

static PyObject *py_pending(PyObject *self, PyObject *arg) {
    (void)self;
    nhf_sim_stream *stream = stream_arg(arg);
    if (stream == NULL)
        return NULL;
    pthread_mutex_lock(&stream->mutex);
    long pending = stream->pending;
    pthread_mutex_unlock(&stream->mutex);
    return PyLong_FromLong(pending);
}

/* sim_stopped(stream) -> whether the stream was closed: what its enqueue refuses
 * with QUEUE_STOPPED, asked by a call that has nothing to enqueue (a zero-byte
 * host_copy, release_after with no objects), which is refused as one that has. */
static PyObject *py_stopped(PyObject *self, PyObject *arg) {
    (void)self;
    nhf_sim_stream *stream = stream_arg(arg);
    if (stream == NULL)
        return NULL;
    pthread_mutex_lock(&stream->mutex);
    int stopping = stream->stopping;
    pthread_mutex_unlock(&stream->mutex);
    return PyBool_FromLong(stopping);
}

/* sim_refusal(stream) -> what its enqueue would answer now (refusal_locked: 0, or
 * why it takes nothing), enqueuing nothing: a signal's check before it makes the
 * thread or lane that serves it (_simbackend.signal_refusal). */
static PyObject *py_refusal(PyObject *self, PyObject *arg) {
    (void)self;
    nhf_sim_stream *stream = stream_arg(arg);
    if (stream == NULL)
        return NULL;
    pthread_mutex_lock(&stream->mutex);
    uint64_t status = refusal_locked(stream);
    pthread_mutex_unlock(&stream->mutex);
    return PyLong_FromUnsignedLongLong(status);
}

/* Refuse new work; the thread runs what is queued, then ends.  Then wait for it
 * to end (join true), without the GIL, or let it end alone (join false).  One
 * call, so that no exception can come between the two (a half-closed stream).
 * Only the first close joins or detaches the thread; a later close with join
 * true (another thread's, while the first still joins) waits, without the GIL,
 * until the thread has run its last item, so that every close that returns
 * means what the first means: everything queued before it has run. */
static PyObject *py_close(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nhf_check_nargs("sim_close(stream, join)", nargs, 2) < 0)
        return NULL;
    nhf_sim_stream *stream = stream_arg(args[0]);
    int join = stream == NULL ? -1 : PyObject_IsTrue(args[1]);
    if (join < 0 || (join && refuse_on_host_thread("simulator.Stream.close()") < 0))
        return NULL;
    /* A forked child has the streams' memory but none of their threads (a mutex may
     * even be held by one that is gone): a close there touches nothing (the Python
     * side refuses everything else). */
    if (nhf_forked())
        Py_RETURN_NONE; /* no thread to stop, none to join */
    if (!stream_stop(stream)) { /* closed before: its thread is joined, detached, or being joined */
        if (join) {
            Py_BEGIN_ALLOW_THREADS
            pthread_mutex_lock(&stream->mutex);
            while (!stream->has_ended)
                pthread_cond_wait(&stream->ended, &stream->mutex);
            pthread_mutex_unlock(&stream->mutex);
            Py_END_ALLOW_THREADS
        }
        Py_RETURN_NONE;
    }
    if (join) {
        Py_BEGIN_ALLOW_THREADS
        pthread_join(stream->thread, NULL);
        Py_END_ALLOW_THREADS
    } else {
        pthread_detach(stream->thread);
    }
    Py_RETURN_NONE;
}

/* enqueue(stream, fn, arg, device) -> status: fn(arg) as a host function, or
 * as device work (device true), without the GIL. */
static PyObject *py_enqueue(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nhf_check_nargs("sim_enqueue(stream, fn, arg, device)", nargs, 4) < 0)
        return NULL;
    nhf_sim_stream *stream = stream_arg(args[0]);
    void *fn, *arg;
    if (stream == NULL || nhf_address_arg(args[1], &fn) < 0 || nhf_address_arg(args[2], &arg) < 0)
        return NULL;
    int device = PyObject_IsTrue(args[3]);
    if (device < 0)
        return NULL;
    uint64_t status;
    Py_BEGIN_ALLOW_THREADS
    status = enqueue(stream, (nhf_hostfn)(uintptr_t)fn, arg, device ? LANE_DEVICE : LANE_HOST);
    Py_END_ALLOW_THREADS
    return PyLong_FromUnsignedLongLong(status);
}

/* sim_graph_record(graph, fn, arg, owner) -> record: a record for fn(arg) owning
 * owner, owned by the graph from the start (one call: see cuda_graph_record). */
static PyObject *py_graph_record(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nhf_check_nargs("sim_graph_record(graph, fn, arg, owner)", nargs, 4) < 0)
        return NULL;
    sim_graph *k = graph_arg(args[0]);
    void *fn, *arg;
    if (k == NULL || nhf_address_arg(args[1], &fn) < 0 || nhf_address_arg(args[2], &arg) < 0)
        return NULL;
    nhf_record *record = nhf_record_take((nhf_hostfn)(uintptr_t)fn, arg, args[3]);
    if (record == NULL)
        return NULL;
    pthread_mutex_lock(&k->lock);
    record->next = k->records;
    k->records = record;
    pthread_mutex_unlock(&k->lock);
    return PyLong_FromVoidPtr(record);
}

/* graph_add_node(graph, device, fn, arg[, fn, arg, ...]) -> added: captured nodes,
 * replayed in order, added all of them or none (a graph slot's three operations: a
 * part of them would run the slot's work with no wait for it, invariant 21).  False,
 * adding none, once the capture has ended (SimGraph.end(): another thread ended it
 * after the caller read it), as cuLaunchHostFunc then enqueues on the stream. */
static PyObject *py_graph_add_node(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    enum { MOST = 3 };
    if (nargs < 4 || nargs % 2 != 0 || (nargs - 2) / 2 > MOST) {
        PyErr_SetString(PyExc_TypeError,
                        "sim_graph_add_node(graph, device, fn, arg[, fn, arg]...) takes 1 to 3 "
                        "(fn, arg) pairs");
        return NULL;
    }
    /* device first: its __bool__ may run Python, which may release the graph, whose
     * native part graph_arg reads last, with no Python run after it (a use after
     * free, in review; the addresses are ints, read without running any). */
    int device = PyObject_IsTrue(args[1]);
    if (device < 0)
        return NULL;
    size_t n = (size_t)(nargs - 2) / 2;
    void *fn[MOST], *arg[MOST];
    for (size_t i = 0; i < n; i++)
        if (nhf_address_arg(args[2 + 2 * i], &fn[i]) < 0 ||
            nhf_address_arg(args[3 + 2 * i], &arg[i]) < 0)
            return NULL;
    sim_graph *k = graph_arg(args[0]);
    if (k == NULL)
        return NULL;
    pthread_mutex_lock(&k->lock);
    if (k->ended) {
        pthread_mutex_unlock(&k->lock);
        Py_RETURN_FALSE;
    }
    if (k->count + n > k->capacity) {
        size_t capacity = k->capacity ? 2 * k->capacity : 16;
        while (capacity < k->count + n)
            capacity *= 2;
        node *nodes = realloc(k->nodes, capacity * sizeof(node));
        if (nodes == NULL) {
            pthread_mutex_unlock(&k->lock);
            return PyErr_NoMemory();
        }
        k->nodes = nodes;
        k->capacity = capacity;
    }
    for (size_t i = 0; i < n; i++)
        k->nodes[k->count++] = (node){device, (nhf_hostfn)(uintptr_t)fn[i], arg[i]};
    pthread_mutex_unlock(&k->lock);
    Py_RETURN_TRUE;
}

/* replay(stream, graph) -> status: one replay of a simulated graph. */
static PyObject *py_replay(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nhf_check_nargs("sim_replay(stream, graph)", nargs, 2) < 0)
        return NULL;
    nhf_sim_stream *stream = stream_arg(args[0]);
    sim_graph *k = stream == NULL ? NULL : graph_arg(args[1]);
    if (k == NULL)
        return NULL;
    atomic_fetch_add(&k->refs, 1); /* the replay's, taken while the GIL holds k */
    uint64_t status;
    Py_BEGIN_ALLOW_THREADS
    status = replay(stream, k);
    Py_END_ALLOW_THREADS
    return PyLong_FromUnsignedLongLong(status);
}

/* host_words(nbytes) -> address: zeroed memory for a simulated HostExecutor's
 * words, never freed (a stream may still wait on them). */
static PyObject *py_host_words(PyObject *self, PyObject *arg) {
    (void)self;
    Py_ssize_t nbytes = PyLong_AsSsize_t(arg);
    if (nbytes == -1 && PyErr_Occurred())
        return NULL;
    void *words = nbytes > 0 ? calloc(1, (size_t)nbytes) : NULL;
    if (words == NULL)
        return PyErr_Format(PyExc_MemoryError,
                            "the simulator could not allocate a HostExecutor's words (%zd bytes)",
                            nbytes);
    return PyLong_FromVoidPtr(words);
}

/* SimGraph(): a new graph, and this, its first reference. */
static int sim_graph_ref_init(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, ":SimGraph", keywords))
        return -1;
    if (atomic_load(&((sim_graph_ref *)self)->k) != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a SimGraph is made once");
        return -1;
    }
    sim_graph *k = calloc(1, sizeof(sim_graph));
    if (k == NULL || pthread_mutex_init(&k->lock, NULL)) {
        free(k);
        PyErr_SetString(PyExc_MemoryError, "the simulator could not allocate a graph");
        return -1;
    }
    atomic_store(&k->refs, 1);
    atomic_store(&((sim_graph_ref *)self)->k, k);
    return 0;
}

/* share() -> another reference to the same graph (an executable graph's). */
static PyObject *sim_graph_ref_share(PyObject *self, PyObject *unused) {
    (void)unused;
    sim_graph *k = atomic_load(&((sim_graph_ref *)self)->k);
    if (k == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the simulated graph is closed");
        return NULL;
    }
    sim_graph_ref *other = PyObject_New(sim_graph_ref, &sim_graph_type);
    if (other == NULL)
        return NULL;
    atomic_fetch_add(&k->refs, 1);
    atomic_init(&other->k, k);
    return (PyObject *)other;
}

static PyObject *sim_graph_ref_release(PyObject *self, PyObject *unused) {
    (void)unused;
    sim_graph *k = atomic_exchange(&((sim_graph_ref *)self)->k, NULL);
    if (k != NULL)
        nhf_sim_graph_release(k);
    Py_RETURN_NONE;
}

/* end(): the capture of this graph has ended (graph_end). */
static PyObject *sim_graph_ref_end(PyObject *self, PyObject *unused) {
    (void)unused;
    sim_graph *k = graph_arg(self);
    if (k == NULL)
        return NULL;
    graph_end(k);
    Py_RETURN_NONE;
}

static PyObject *sim_graph_ref_held(PyObject *self, void *closure) {
    (void)closure;
    return PyBool_FromLong(atomic_load(&((sim_graph_ref *)self)->k) != NULL);
}

static void sim_graph_ref_dealloc(PyObject *self) {
    sim_graph *k = atomic_exchange(&((sim_graph_ref *)self)->k, NULL);
    if (k != NULL)
        nhf_sim_graph_release(k);
    Py_TYPE(self)->tp_free(self);
}

static PyMethodDef sim_graph_ref_methods[] = {
    {"release", sim_graph_ref_release, METH_NOARGS, "release($self, /)\n--\n\n"
     "Give the reference back (once)."},
    {"share", sim_graph_ref_share, METH_NOARGS, "share($self, /)\n--\n\n"
     "Another reference to the same graph."},
    {"end", sim_graph_ref_end, METH_NOARGS, "end($self, /)\n--\n\n"
     "The capture has ended: the graph takes no more nodes."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef sim_graph_ref_getset[] = {
    {"held", sim_graph_ref_held, NULL, "Whether the reference is still held.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject sim_graph_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "numba_hostfn._core.SimGraph",
    .tp_doc = "SimGraph()\n--\n\n"
              "A new simulated graph's graph, and one reference to it.",
    .tp_basicsize = sizeof(sim_graph_ref),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = sim_graph_ref_init,
    .tp_dealloc = sim_graph_ref_dealloc,
    .tp_methods = sim_graph_ref_methods,
    .tp_getset = sim_graph_ref_getset,
};

static PyMethodDef methods[] = {
    {"host_words", py_host_words, METH_O, "host_words($module, nbytes, /)\n--\n\n"
     "Returns zeroed memory, never freed"},
    {"sim_context_start", py_context_start, METH_NOARGS, "sim_context_start($module, /)\n--\n\n"
     "Start the host-function thread."},
    {"sim_sync", py_sync, METH_O, "sim_sync($module, stream, /)\n--\n\n"
     "Wait (GIL released) until the stream's work has run."},
    {"sim_in_host_function", py_in_host_function, METH_NOARGS,
     "sim_in_host_function($module, /)\n--\n\n"
     "True on the simulated host-function thread (a host function's call)."},
    {"sim_query", py_query, METH_O, "sim_query($module, stream, /)\n--\n\n"
     "Returns 0, 600 (not ready) or the fault."},
    {"sim_stopped", py_stopped, METH_O, "sim_stopped($module, stream, /)\n--\n\n"
     "True once the stream was closed (its enqueue refuses with QUEUE_STOPPED)."},
    {"sim_refusal", py_refusal, METH_O, "sim_refusal($module, stream, /)\n--\n\n"
     "What the stream's enqueue would refuse with now (a status word), or 0."},
    {"sim_new_context", py_new_context, METH_NOARGS,
     "sim_new_context($module, /)\n--\n\n"
     "Streams made from now on belong to a new, healthy simulated context."},
    {"sim_close", (PyCFunction)(void (*)(void))py_close, METH_FASTCALL,
     "sim_close($module, stream, join, /)\n--\n\n"
     "Stop the stream once empty; join its thread or detach it."},
    {"sim_enqueue", (PyCFunction)(void (*)(void))py_enqueue, METH_FASTCALL,
     "sim_enqueue($module, stream, fn, arg, device, /)\n--\n\n"
     "Returns status"},
    {"sim_graph_record", (PyCFunction)(void (*)(void))py_graph_record, METH_FASTCALL,
     "sim_graph_record($module, graph, fn, arg, owner, /)\n--\n\n"
     "Returns a record the graph owns"},
    {"sim_graph_add_node", (PyCFunction)(void (*)(void))py_graph_add_node, METH_FASTCALL,
     "sim_graph_add_node($module, graph, device, fn, arg, /, *more)\n--\n\n"},
    {"sim_replay", (PyCFunction)(void (*)(void))py_replay, METH_FASTCALL,
     "sim_replay($module, stream, graph, /)\n--\n\n"
     "Returns status: one replay, all of it or nothing."},
    {NULL, NULL, 0, NULL},
};

static PyMethodDef testing_methods[] = {
    {"sim_watchdog_stream_uses", py_watchdog_stream_uses, METH_NOARGS,
     "sim_watchdog_stream_uses($module, /)\n--\n\n"
     "Stream handles the watchdog's thread touched (0 by design)."},
    {"sim_pending", py_pending, METH_O, "sim_pending($module, stream, /)\n--\n\n"
     "Items enqueued on the stream and not yet finished."},
    {"sim_new_identity", py_new_identity, METH_O, "sim_new_identity($module, stream, /)\n--\n\n"
     "Give the stream a new id, as CUDA gives a destroyed stream's handle to a new one."},
    {NULL, NULL, 0, NULL},
};

int nhf_simulator_init(PyObject *module) {
    if (PyModule_AddFunctions(module, methods) < 0 || nhf_add_testing(module, testing_methods) < 0 ||
        PyType_Ready(&sim_graph_type) < 0 ||
        PyModule_AddObjectRef(module, "SimGraph", (PyObject *)&sim_graph_type) < 0 ||
        PyType_Ready(&sim_stream_type) < 0 ||
        PyModule_AddObjectRef(module, "SimStreamBase", (PyObject *)&sim_stream_type) < 0)
        return -1;
    nhf_enqueue_add_route(NHF_ROUTE_SIM, nhf_sim_enqueue, NULL);
    nhf_enqueue_add_route(NHF_ROUTE_SIM_DEVICE, nhf_sim_enqueue_device, NULL);
    if (nhf_add_address(module, "SIM_DELAY", (void *)(uintptr_t)nhf_sim_delay) < 0 ||
        nhf_add_address(module, "SIM_FAULT", (void *)(uintptr_t)sim_fault) < 0 ||
        nhf_add_address(module, "SIM_GRAPH_RELEASE",
                        (void *)(uintptr_t)nhf_sim_graph_release) < 0)
        return -1;
    nhf_watchdog_add_backend(NHF_ROUTE_SIM, nhf_sim_query_context, nhf_sim_context_of);
    return 0;
}
