/* The CUDA driver as this core sees it: cuda.h's constants and layouts that it
 * uses, in one place, and one table of the driver's entry points (driver.c), filled
 * once by the CUDA backend and read by every file that calls the driver.
 *
 * No file includes cuda.h (the package builds with no CUDA toolkit): what is
 * used of it is written here, with cuda.h's names, and nowhere else.  Each entry
 * point is reached through its address from cuGetProcAddress (the backend
 * resolves the names that NHF_DRIVER_ENTRY_POINTS lists, through cuda.bindings,
 * and driver_load stores them), never through cuda.bindings' wrappers, which
 * route a CUhostFn through a trampoline that takes the GIL.
 *
 * Include through nhf.h.  No Python here.
 */
#ifndef NHF_DRIVER_H
#define NHF_DRIVER_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* ---- cuda.h: CUresult values this core tells apart ----------------------------- */

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_DEINITIALIZED = 4,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_CONTEXT_ALREADY_IN_USE = 216,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_CONTEXT_IS_DESTROYED = 709,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
};

/* ---- cuda.h: enums and flags ---------------------------------------------------- */

enum { /* CUstreamCaptureStatus */
    CU_STREAM_CAPTURE_STATUS_NONE = 0,
    CU_STREAM_CAPTURE_STATUS_ACTIVE = 1,
    CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2,
};
enum { /* CUstreamCaptureMode */
    CU_STREAM_CAPTURE_MODE_GLOBAL = 0,
    CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1,
    CU_STREAM_CAPTURE_MODE_RELAXED = 2,
};
enum { CU_STREAM_NON_BLOCKING = 0x1 }; /* CUstream_flags */
enum { /* CUstreamWaitValue_flags, CUstreamWriteValue_flags */
    CU_STREAM_WAIT_VALUE_GEQ = 0x0,
    CU_STREAM_WRITE_VALUE_DEFAULT = 0x0,
};
enum { /* CUstreamBatchMemOpType */
    CU_STREAM_MEM_OP_WAIT_VALUE_32 = 1,
    CU_STREAM_MEM_OP_WRITE_VALUE_32 = 2,
};
enum { CU_USER_OBJECT_NO_DESTRUCTOR_SYNC = 1 }; /* CUuserObject_flags */
enum { CU_GRAPH_USER_OBJECT_MOVE = 1 };         /* CUuserObjectRetain_flags */
enum { /* cuMemHostAlloc's flags */
    CU_MEMHOSTALLOC_PORTABLE = 0x01,
    CU_MEMHOSTALLOC_DEVICEMAP = 0x02,
};
/* CUstream's default streams: the NULL stream (0) and CU_STREAM_LEGACY (0x1) name
 * the legacy default stream of the current context, CU_STREAM_PER_THREAD (0x2) the
 * per-thread default stream of the calling thread in the current context. */
#define CU_STREAM_LEGACY ((void *)0x1)
#define CU_STREAM_PER_THREAD ((void *)0x2)

/* CUstreamBatchMemOpParams as cuda.h declares its writeValue and waitValue
 * members (one layout): a 48-byte union. */
typedef union {
    unsigned operation; /* CUstreamBatchMemOpType */
    struct {
        unsigned operation;
        uint64_t address; /* CUdeviceptr */
        union {
            uint32_t value;
            uint64_t value64;
        };
        unsigned flags;
        uint64_t alias; /* unused */
    } value_op;
    uint64_t pad[6];
} nhf_cu_batch_mem_op_params;

/* ---- the entry points -------------------------------------------------------------- */

/* The CUDA version whose entry points the types below declare (cuda.h of CUDA 13.0):
 * the backend asks cuGetProcAddress for each at this version (or the driver's own,
 * if older), so a newer driver that changes a signature still gives the one
 * declared here. */
#define NHF_DRIVER_ABI_VERSION 13000

/* What the driver calls back (CUhostFn). */
typedef void (*nhf_cu_host_fn)(void *user_data);

/* Each entry point's type, as cuda.h declares it (CUstream, CUcontext, CUgraph and
 * CUuserObject are opaque pointers; CUdeviceptr a 64-bit address; an enum an int). */
typedef int (*nhf_cuStreamIsCapturing_fn)(void *hStream, int *captureStatus);
typedef int (*nhf_cuLaunchHostFunc_fn)(void *hStream, nhf_cu_host_fn fn, void *userData);
typedef int (*nhf_cuUserObjectCreate_fn)(void **object_out, void *ptr, nhf_cu_host_fn destroy,
                                         unsigned initialRefcount, unsigned flags);
typedef int (*nhf_cuUserObjectRelease_fn)(void *object, unsigned count);
typedef int (*nhf_cuGraphRetainUserObject_fn)(void *graph, void *object, unsigned count,
                                              unsigned flags);
/* (stream, status, id, graph, then optional outs): the form of CUDA 12.0 to 12.2
 * has two optional outs after graph (dependencies, their count), that of 12.3 and
 * later three (edge data between them).  Both take NULL for each, and passing one
 * NULL more than a form reads is harmless in the C calling conventions of x86-64
 * and AArch64. */
typedef int (*nhf_cuStreamGetCaptureInfo_fn)(void *hStream, int *captureStatus_out,
                                             uint64_t *id_out, void **graph_out,
                                             const void **dependencies_out,
                                             const void **edgeData_out,
                                             size_t *numDependencies_out);
typedef int (*nhf_cuStreamWriteValue32_fn)(void *stream, uint64_t addr, uint32_t value,
                                           unsigned flags);
typedef int (*nhf_cuStreamWaitValue32_fn)(void *stream, uint64_t addr, uint32_t value,
                                          unsigned flags);
typedef int (*nhf_cuMemHostAlloc_fn)(void **pp, size_t bytesize, unsigned Flags);
typedef int (*nhf_cuStreamCreate_fn)(void **phStream, unsigned Flags);
typedef int (*nhf_cuStreamDestroy_fn)(void *hStream);
typedef int (*nhf_cuStreamEndCapture_fn)(void *hStream, void **phGraph);
typedef int (*nhf_cuStreamBeginCaptureToGraph_fn)(void *hStream, void *hGraph,
                                                  const void *dependencies,
                                                  const void *dependencyData,
                                                  size_t numDependencies, int mode);
typedef int (*nhf_cuStreamBatchMemOp_fn)(void *stream, unsigned count,
                                         nhf_cu_batch_mem_op_params *paramArray, unsigned flags);
typedef int (*nhf_cuStreamQuery_fn)(void *hStream);
/* cuStreamGetCtx(stream, &ctx): a driver whose cuStreamGetCtx is the _v2 form
 * (CUDA 12.5+: a third out, the green context; cuda.bindings asks for it by this
 * name at 12050 too) writes it to the third pointer, which the older form ignores
 * (one argument too many is harmless, as above). */
typedef int (*nhf_cuStreamGetCtx_fn)(void *hStream, void **pctx, void **pGreenCtx);
typedef int (*nhf_cuThreadExchangeStreamCaptureMode_fn)(int *mode);
typedef int (*nhf_cuCtxGetCurrent_fn)(void **pctx);
typedef int (*nhf_cuStreamGetId_fn)(void *hStream, unsigned long long *streamId);
typedef int (*nhf_cuCtxPushCurrent_fn)(void *ctx);
typedef int (*nhf_cuCtxPopCurrent_fn)(void **pctx);

/* The table: X(name, required).  A required entry point is in every driver this
 * package supports (the backend refuses a driver without one); an optional one
 * may be missing (NULL), and what needs it says so or does without:
 * cuStreamBeginCaptureToGraph (CUDA 12.3+) an explicit graph's executor node,
 * cuStreamBatchMemOp the executor's one-call enqueue (two calls without it), the
 * last five the watchdog (device faults; not started without all of them). */
#define NHF_DRIVER_ENTRY_POINTS(X)                                                         \
    X(cuStreamIsCapturing, 1)                                                               \
    X(cuLaunchHostFunc, 1)                                                                  \
    X(cuUserObjectCreate, 1)                                                                \
    X(cuUserObjectRelease, 1)                                                               \
    X(cuGraphRetainUserObject, 1)                                                           \
    X(cuStreamGetCaptureInfo, 1)                                                            \
    X(cuStreamWriteValue32, 1)                                                              \
    X(cuStreamWaitValue32, 1)                                                               \
    X(cuMemHostAlloc, 1)                                                                    \
    X(cuStreamCreate, 1)                                                                    \
    X(cuStreamDestroy, 1)                                                                   \
    X(cuStreamEndCapture, 1)                                                                \
    X(cuCtxGetCurrent, 1)                                                                   \
    X(cuStreamGetId, 1)                                                                     \
    X(cuStreamBeginCaptureToGraph, 0)                                                       \
    X(cuStreamBatchMemOp, 0)                                                                \
    X(cuStreamQuery, 0)                                                                     \
    X(cuStreamGetCtx, 0)                                                                    \
    X(cuThreadExchangeStreamCaptureMode, 0)                                                 \
    X(cuCtxPushCurrent, 0)                                                                  \
    X(cuCtxPopCurrent, 0)

/* Every entry point, NULL until driver_load (the simulator never fills it).
 * Atomic: stored once by the backend (and by the tests' stand-ins) while the
 * driver's, a pool's or the watchdog's threads may read. */
struct nhf_driver {
#define NHF_DRIVER_FIELD(name, required) _Atomic(nhf_##name##_fn) name;
    NHF_DRIVER_ENTRY_POINTS(NHF_DRIVER_FIELD)
#undef NHF_DRIVER_FIELD
};
extern struct nhf_driver nhf_driver;

/* An entry point of the table, loaded once: NHF_CU(cuLaunchHostFunc)(...). */
#define NHF_CU(name) atomic_load_explicit(&nhf_driver.name, memory_order_acquire)

#endif /* NHF_DRIVER_H */
