/*
 * cudart_double.c — a test double of the CUDA runtime, on host memory.
 *
 * Implements exactly the entry points tokenfeed's device layer resolves
 * (csrc/device/device.h), with the runtime's ABI, so that the tests load it
 * through the same dlopen path as the real libcudart ($TOKENFEED_CUDART).
 *
 * Model:
 *   - "Device" memory is malloc'd host memory, filled with 0xAB on allocation
 *     so that reading a slot before its copy shows up. Allocations are tracked:
 *     a copy whose destination is not inside one fails with
 *     cudaErrorInvalidValue, and freeing memory a queued operation still
 *     targets is counted ("bad_frees") and refused.
 *   - A stream is a FIFO of operations executed in order by its own thread
 *     (the default stream, handles 0/1/2, has one too): copies (memcpy done at
 *     execution time, so a source overwritten too early is caught), event
 *     records, waits on events, and "reads" queued by the tests to stand in
 *     for kernels. CUDA_DOUBLE_DELAY_US delays every operation; tests can
 *     pause a stream (cuda_double_pause) to hold its events pending.
 *   - Each cudaEventRecord is a record of its own: cudaEventQuery is "not
 *     ready" while the event's latest record has not executed;
 *     cudaStreamWaitEvent waits for the record current at the call (none: no
 *     wait), as CUDA does, even when the event is recorded again, on another
 *     stream, before that one has run. A completed record keeps the time it
 *     executed, for cudaEventElapsedTime (refused, as CUDA does, for events
 *     created with cudaEventDisableTiming).
 *   - Copies are host to device (from registered "pinned" memory or from
 *     pageable memory: counted apart, because the real runtime stages a
 *     pageable source through its own pinned buffer, a hidden host memcpy),
 *     device to device and device to host. CUDA_DOUBLE_COPY_US / CUDA_DOUBLE_COPY_GBPS make
 *     each copy take time on its stream, as a DMA engine would.
 *
 * Environment:
 *   CUDA_DOUBLE_DEVICES=N   devices (default 1; 0: cudaErrorNoDevice)
 *   CUDA_DOUBLE_FAIL=a,b    failures: malloc (every cudaMalloc: out of memory),
 *                           malloc_after=N (the first N succeed), register
 *                           (cudaHostRegister), memcpy_after=N, record_after=N,
 *                           stream (cudaStreamCreateWithFlags), driver
 *                           (cudaGetDeviceCount: insufficient driver)
 *   CUDA_DOUBLE_MEM=BYTES   per-process "device memory" (default unlimited)
 *   CUDA_DOUBLE_DELAY_US=N  sleep before each stream operation
 *   CUDA_DOUBLE_COPY_US=N   each copy takes N more microseconds on its stream
 *   CUDA_DOUBLE_COPY_GBPS=X each copy takes bytes / (X GB/s) more
 *   CUDA_DOUBLE_VERSION=N   cudaRuntimeGetVersion (default 12040)
 *
 * Extra exports for the tests: cuda_double_counter(name),
 * cuda_double_pause(stream, on), cuda_double_enqueue_read(stream, dev, n, out),
 * cuda_double_enqueue_kernel(stream, us),
 * cuda_double_stream_drain(stream), cuda_double_stream_pending(stream),
 * cuda_double_is_pinned(ptr, n).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))

typedef int cudaError_t;
enum {
    OK = 0,
    ERR_VALUE = 1,
    ERR_MEMORY = 2,
    ERR_DRIVER = 35,
    ERR_NO_DEVICE = 100,
    ERR_DEVICE = 101,
    ERR_HANDLE = 400,
    ERR_NOT_READY = 600,
    ERR_ALREADY_REGISTERED = 712,
    ERR_NOT_REGISTERED = 713,
};

/* ---------------------------------------------------------------- state */

/* One cudaEventRecord: shared by the event (while it is the latest), the
 * record operation and the waits queued on it. */
typedef struct rec {
    int done, refs;
    uint64_t done_ns; /* when it executed */
} rec;

typedef struct event {
    rec *last; /* latest record, NULL if never recorded */
    int live, timing;
} event;

enum { OP_COPY, OP_RECORD, OP_WAIT, OP_READ, OP_KERNEL, OP_EXIT };

typedef struct op {
    int kind;
    void *dst;
    const void *src;
    size_t n;
    struct alloc *target; /* OP_COPY: destination allocation */
    rec *r;               /* OP_RECORD: the record; OP_WAIT: the record waited for (NULL: none) */
    struct op *next;
} op;

typedef struct stream {
    op *head, *tail;
    int paused, busy, destroyed;
    pthread_t thread;
} stream;

typedef struct alloc {
    void *p;
    size_t n;
    int pending; /* queued copies into it */
    struct alloc *next;
} alloc;

typedef struct reg {
    void *p;
    size_t n;
    struct reg *next;
} reg;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static stream *g_default;
static alloc *g_allocs;
static reg *g_regs;
static size_t g_mem_used;
static _Thread_local int t_device;
static _Thread_local cudaError_t t_last;

static struct {
    long long device_syncs, stream_syncs, event_queries, event_syncs, memcpys, mallocs, frees, live_allocs,
        streams_created, live_streams, events_created, live_events, registers, live_registered, stream_waits,
        records, bad_frees, set_device, h2d_pinned, h2d_pageable, h2d_bytes, d2d, d2d_bytes, d2h, elapsed;
} C;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static double env_double(const char *name) {
    const char *v = getenv(name);
    return v && *v ? atof(v) : 0.0;
}

static int env_int(const char *name, int dflt) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}

/* CUDA_DOUBLE_FAIL contains `key` (alone) or `key=N` (returns N; -1 when
 * absent, 0 when given without a number). */
static long fail_param(const char *key) {
    const char *v = getenv("CUDA_DOUBLE_FAIL");
    if (!v) return -1;
    size_t k = strlen(key);
    for (const char *p = v; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len >= k && !strncmp(p, key, k) && (len == k || p[k] == '=')) return len == k ? 0 : atol(p + k + 1);
        p += len + (e ? 1 : 0);
    }
    return -1;
}

static cudaError_t ret(cudaError_t e) {
    if (e != OK && e != ERR_NOT_READY) t_last = e;
    return e;
}

static int ndevices(void) { return env_int("CUDA_DOUBLE_DEVICES", 1); }

/* ---------------------------------------------------------------- streams */

/* g_mu held. */
static void rec_unref(rec *r) {
    if (r && --r->refs == 0) free(r);
}

static void *stream_main(void *arg) {
    stream *s = arg;
    int delay = env_int("CUDA_DOUBLE_DELAY_US", 0);
    int copy_us = env_int("CUDA_DOUBLE_COPY_US", 0);
    double copy_gbps = env_double("CUDA_DOUBLE_COPY_GBPS");
    pthread_mutex_lock(&g_mu);
    for (;;) {
        while (!s->head || s->paused || (s->head->kind == OP_WAIT && s->head->r && !s->head->r->done))
            pthread_cond_wait(&g_cv, &g_mu);
        op *o = s->head;
        if (o->kind == OP_EXIT) break;
        s->busy = 1;
        pthread_mutex_unlock(&g_mu);
        if (delay) usleep((useconds_t)delay);
        if (o->kind == OP_COPY) {
            double us = copy_us + (copy_gbps > 0 ? (double)o->n / (copy_gbps * 1e3) : 0.0);
            if (us >= 1.0) usleep((useconds_t)us);
        }
        if (o->kind == OP_KERNEL) usleep((useconds_t)o->n); /* n: microseconds of "compute" */
        if (o->kind == OP_COPY || o->kind == OP_READ) memcpy(o->dst, o->src, o->n);
        pthread_mutex_lock(&g_mu);
        if (o->kind == OP_RECORD) {
            o->r->done = 1;
            o->r->done_ns = now_ns();
        }
        if (o->kind == OP_RECORD || o->kind == OP_WAIT) rec_unref(o->r);
        if (o->kind == OP_COPY && o->target) o->target->pending--;
        s->head = o->next;
        if (!s->head) s->tail = NULL;
        s->busy = 0;
        free(o);
        pthread_cond_broadcast(&g_cv);
    }
    pthread_mutex_unlock(&g_mu);
    free(s->head);
    free(s);
    return NULL;
}

/* g_mu held. */
static stream *stream_new(void) {
    stream *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    if (pthread_create(&s->thread, NULL, stream_main, s)) {
        free(s);
        return NULL;
    }
    pthread_detach(s->thread);
    return s;
}

/* g_mu held. Handles 0, 1 (legacy) and 2 (per-thread) are the default stream. */
static stream *resolve(void *h) {
    if ((uintptr_t)h <= 2) {
        if (!g_default) g_default = stream_new();
        return g_default;
    }
    return h;
}

/* g_mu held. */
static void enqueue(stream *s, op *o) {
    o->next = NULL;
    if (s->tail) s->tail->next = o;
    else s->head = o;
    s->tail = o;
    pthread_cond_broadcast(&g_cv);
}

static alloc *find_alloc(const void *p, size_t n) {
    for (alloc *a = g_allocs; a; a = a->next)
        if ((const char *)p >= (char *)a->p && (const char *)p + n <= (char *)a->p + a->n) return a;
    return NULL;
}

/* g_mu held. Whether [p, p + n) lies in memory registered with
 * cudaHostRegister. */
static int registered(const void *p, size_t n) {
    for (reg *r = g_regs; r; r = r->next)
        if ((const char *)p >= (char *)r->p && (const char *)p + n <= (char *)r->p + r->n) return 1;
    return 0;
}

/* ---------------------------------------------------------------- API */

API cudaError_t cudaGetDeviceCount(int *n) {
    *n = 0;
    if (fail_param("driver") >= 0) return ret(ERR_DRIVER);
    int d = ndevices();
    if (d <= 0) return ret(ERR_NO_DEVICE);
    *n = d;
    return OK;
}

API cudaError_t cudaSetDevice(int d) {
    if (d < 0 || d >= ndevices()) return ret(ERR_DEVICE);
    __atomic_add_fetch(&C.set_device, 1, __ATOMIC_RELAXED);
    t_device = d;
    return OK;
}

API cudaError_t cudaGetDevice(int *d) {
    *d = t_device;
    return OK;
}

API cudaError_t cudaMalloc(void **p, size_t n) {
    *p = NULL;
    if (ndevices() <= 0) return ret(ERR_NO_DEVICE);
    pthread_mutex_lock(&g_mu);
    long after = fail_param("malloc_after");
    long limit = env_int("CUDA_DOUBLE_MEM", 0);
    int fail = fail_param("malloc") >= 0 || (after >= 0 && C.mallocs >= after) ||
               (limit > 0 && g_mem_used + n > (size_t)limit);
    C.mallocs++;
    alloc *a = fail ? NULL : calloc(1, sizeof *a);
    if (a) {
        a->p = malloc(n ? n : 1);
        if (!a->p) {
            free(a);
            a = NULL;
        }
    }
    if (!a) {
        pthread_mutex_unlock(&g_mu);
        return ret(ERR_MEMORY);
    }
    memset(a->p, 0xAB, n);
    a->n = n;
    a->next = g_allocs;
    g_allocs = a;
    g_mem_used += n;
    C.live_allocs++;
    *p = a->p;
    pthread_mutex_unlock(&g_mu);
    return OK;
}

API cudaError_t cudaFree(void *p) {
    if (!p) return OK;
    pthread_mutex_lock(&g_mu);
    alloc **pp = &g_allocs;
    while (*pp && (*pp)->p != p) pp = &(*pp)->next;
    alloc *a = *pp;
    if (!a || a->pending) {
        if (a) C.bad_frees++;
        pthread_mutex_unlock(&g_mu);
        return ret(ERR_VALUE);
    }
    *pp = a->next;
    g_mem_used -= a->n;
    C.frees++;
    C.live_allocs--;
    pthread_mutex_unlock(&g_mu);
    free(a->p);
    free(a);
    return OK;
}

API cudaError_t cudaHostRegister(void *p, size_t n, unsigned flags) {
    if (fail_param("register") >= 0) return ret(ERR_MEMORY);
    pthread_mutex_lock(&g_mu);
    for (reg *r = g_regs; r; r = r->next)
        if (r->p == p) {
            pthread_mutex_unlock(&g_mu);
            return ret(ERR_ALREADY_REGISTERED);
        }
    reg *r = calloc(1, sizeof *r);
    if (!r) {
        pthread_mutex_unlock(&g_mu);
        return ret(ERR_MEMORY);
    }
    r->p = p;
    r->n = n;
    r->next = g_regs;
    g_regs = r;
    C.registers++;
    C.live_registered++;
    pthread_mutex_unlock(&g_mu);
    return OK;
}

API cudaError_t cudaHostUnregister(void *p) {
    pthread_mutex_lock(&g_mu);
    reg **pp = &g_regs;
    while (*pp && (*pp)->p != p) pp = &(*pp)->next;
    reg *r = *pp;
    if (r) {
        *pp = r->next;
        C.live_registered--;
    }
    pthread_mutex_unlock(&g_mu);
    if (!r) return ret(ERR_NOT_REGISTERED);
    free(r);
    return OK;
}

API cudaError_t cudaStreamCreateWithFlags(void **out, unsigned flags) {
    *out = NULL;
    if (fail_param("stream") >= 0) return ret(ERR_MEMORY);
    pthread_mutex_lock(&g_mu);
    stream *s = stream_new();
    if (s) {
        C.streams_created++;
        C.live_streams++;
    }
    pthread_mutex_unlock(&g_mu);
    if (!s) return ret(ERR_MEMORY);
    *out = s;
    return OK;
}

API cudaError_t cudaStreamDestroy(void *h) {
    if ((uintptr_t)h <= 2) return ret(ERR_HANDLE);
    op *o = calloc(1, sizeof *o);
    if (!o) return ret(ERR_MEMORY);
    o->kind = OP_EXIT;
    pthread_mutex_lock(&g_mu);
    stream *s = h;
    s->destroyed = 1;
    C.live_streams--;
    enqueue(s, o); /* the thread drains what is queued, then exits */
    pthread_mutex_unlock(&g_mu);
    return OK;
}

API cudaError_t cudaEventCreateWithFlags(void **out, unsigned flags) {
    event *e = calloc(1, sizeof *e);
    *out = e;
    if (!e) return ret(ERR_MEMORY);
    e->live = 1;
    e->timing = !(flags & 0x2); /* cudaEventDisableTiming */
    __atomic_add_fetch(&C.events_created, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&C.live_events, 1, __ATOMIC_RELAXED);
    return OK;
}

API cudaError_t cudaEventDestroy(void *h) {
    if (!h) return ret(ERR_HANDLE);
    event *e = h;
    pthread_mutex_lock(&g_mu);
    /* Operations still queued hold its records, not the event. */
    e->live = 0;
    C.live_events--;
    rec_unref(e->last);
    pthread_mutex_unlock(&g_mu);
    free(e);
    return OK;
}

API cudaError_t cudaEventRecord(void *h, void *st) {
    op *o = calloc(1, sizeof *o);
    if (!o) return ret(ERR_MEMORY);
    pthread_mutex_lock(&g_mu);
    long after = fail_param("record_after");
    if (after >= 0 && C.records >= after) {
        pthread_mutex_unlock(&g_mu);
        free(o);
        return ret(ERR_VALUE);
    }
    C.records++;
    event *e = h;
    o->kind = OP_RECORD;
    rec *r = calloc(1, sizeof *r);
    if (!r) {
        pthread_mutex_unlock(&g_mu);
        free(o);
        return ret(ERR_MEMORY);
    }
    r->refs = 2; /* the event and the operation */
    rec_unref(e->last);
    e->last = r;
    o->r = r;
    enqueue(resolve(st), o);
    pthread_mutex_unlock(&g_mu);
    return OK;
}

API cudaError_t cudaEventQuery(void *h) {
    event *e = h;
    pthread_mutex_lock(&g_mu);
    C.event_queries++;
    int done = !e->last || e->last->done;
    pthread_mutex_unlock(&g_mu);
    return done ? OK : ERR_NOT_READY;
}

API cudaError_t cudaEventSynchronize(void *h) {
    event *e = h;
    pthread_mutex_lock(&g_mu);
    C.event_syncs++;
    rec *r = e->last;
    if (r) {
        r->refs++;
        while (!r->done) pthread_cond_wait(&g_cv, &g_mu);
        rec_unref(r);
    }
    pthread_mutex_unlock(&g_mu);
    return OK;
}

/* Milliseconds between two completed records, as CUDA reports them. */
API cudaError_t cudaEventElapsedTime(float *ms, void *start, void *end) {
    event *a = start, *b = end;
    if (!ms || !a || !b) return ret(ERR_VALUE);
    pthread_mutex_lock(&g_mu);
    C.elapsed++;
    cudaError_t e = OK;
    if (!a->timing || !b->timing) e = ERR_HANDLE;
    else if (!a->last || !b->last || !a->last->done || !b->last->done)
        e = ERR_NOT_READY;
    else *ms = (float)((double)((int64_t)(b->last->done_ns - a->last->done_ns)) / 1e6);
    pthread_mutex_unlock(&g_mu);
    return e == OK ? OK : ret(e);
}

API cudaError_t cudaStreamWaitEvent(void *st, void *h, unsigned flags) {
    op *o = calloc(1, sizeof *o);
    if (!o) return ret(ERR_MEMORY);
    pthread_mutex_lock(&g_mu);
    C.stream_waits++;
    o->kind = OP_WAIT;
    o->r = ((event *)h)->last;
    if (o->r) o->r->refs++;
    enqueue(resolve(st), o);
    pthread_mutex_unlock(&g_mu);
    return OK;
}

/* g_mu held. Queue o, a copy or a read of n bytes from src to dst, on st. */
static void submit(void *st, op *o, int kind, void *dst, const void *src, size_t n) {
    o->kind = kind;
    o->dst = dst;
    o->src = src;
    o->n = n;
    enqueue(resolve(st), o);
}

/* Host to device (1), device to host (2) and device to device (3) are
 * modelled: the device ends must lie inside allocations. */
API cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, void *st) {
    if (kind < 1 || kind > 3) return ret(ERR_VALUE);
    op *o = calloc(1, sizeof *o);
    if (!o) return ret(ERR_MEMORY);
    pthread_mutex_lock(&g_mu);
    long after = fail_param("memcpy_after");
    alloc *a = kind == 2 ? NULL : find_alloc(dst, n);
    if ((after >= 0 && C.memcpys >= after) || (kind != 2 && !a) || (kind != 1 && !find_alloc(src, n))) {
        pthread_mutex_unlock(&g_mu);
        free(o);
        return ret(ERR_VALUE);
    }
    C.memcpys++;
    if (kind == 2) {
            C.d2h++;
    } else if (kind == 3) {
        C.d2d++;
        C.d2d_bytes += (long long)n;
    } else {
        if (registered(src, n)) C.h2d_pinned++;
        else C.h2d_pageable++;
        C.h2d_bytes += (long long)n;
    }
    if (a) a->pending++;
    o->target = a;
    submit(st, o, OP_COPY, dst, src, n);
    pthread_mutex_unlock(&g_mu);
    return OK;
}

/* Not resolved by tokenfeed: here so that a use would be counted. */
static void drain(stream *s) {
    while (s->head) pthread_cond_wait(&g_cv, &g_mu);
}

API cudaError_t cudaDeviceSynchronize(void) {
    pthread_mutex_lock(&g_mu);
    C.device_syncs++;
    if (g_default) drain(g_default);
    pthread_mutex_unlock(&g_mu);
    return OK;
}

API cudaError_t cudaStreamSynchronize(void *st) {
    pthread_mutex_lock(&g_mu);
    C.stream_syncs++;
    drain(resolve(st));
    pthread_mutex_unlock(&g_mu);
    return OK;
}

API const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case OK: return "no error";
    case ERR_VALUE: return "invalid argument";
    case ERR_MEMORY: return "out of memory";
    case ERR_DRIVER: return "CUDA driver version is insufficient for CUDA runtime version";
    case ERR_NO_DEVICE: return "no CUDA-capable device is detected";
    case ERR_DEVICE: return "invalid device ordinal";
    case ERR_HANDLE: return "invalid resource handle";
    case ERR_NOT_READY: return "device not ready";
    case ERR_ALREADY_REGISTERED: return "part or all of the requested memory range is already mapped";
    case ERR_NOT_REGISTERED: return "pointer does not correspond to a registered memory region";
    default: return "unrecognized error code";
    }
}

API cudaError_t cudaGetLastError(void) {
    cudaError_t e = t_last;
    t_last = OK;
    return e;
}

API cudaError_t cudaRuntimeGetVersion(int *v) {
    *v = env_int("CUDA_DOUBLE_VERSION", 12040);
    return OK;
}

/* ---------------------------------------------------------------- test hooks */

/* A counter by name; -1 for an unknown name. */
API long long cuda_double_counter(const char *name) {
    pthread_mutex_lock(&g_mu);
    long long v = -1;
#define X(f) if (!strcmp(name, #f)) v = C.f;
    X(device_syncs) X(stream_syncs) X(event_queries) X(event_syncs) X(memcpys) X(mallocs) X(frees)
    X(live_allocs) X(streams_created) X(live_streams) X(events_created) X(live_events) X(registers)
    X(live_registered) X(stream_waits) X(records) X(bad_frees) X(set_device) X(h2d_pinned)
    X(h2d_pageable) X(h2d_bytes) X(d2d) X(d2d_bytes) X(d2h) X(elapsed)
#undef X
    pthread_mutex_unlock(&g_mu);
    return v;
}

/* Queue a new operation on st, taking the lock: OK, or ERR_MEMORY. */
static int submit_new(void *st, int kind, void *dst, const void *src, size_t n) {
    op *o = calloc(1, sizeof *o);
    if (!o) return ERR_MEMORY;
    pthread_mutex_lock(&g_mu);
    submit(st, o, kind, dst, src, n);
    pthread_mutex_unlock(&g_mu);
    return OK;
}

/* Hold (on != 0) or resume a stream's execution. */
API void cuda_double_pause(void *st, int on) {
    pthread_mutex_lock(&g_mu);
    resolve(st)->paused = on;
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
}

/* Queue a "kernel" on st that copies n bytes of device memory to out when it
 * runs: what the consumer saw, in stream order. */
API int cuda_double_enqueue_read(void *st, const void *dev, size_t n, void *out) {
    return submit_new(st, OP_READ, out, dev, n);
}

/* Queue a "kernel" on st that runs for `us` microseconds: a training step's
 * compute, in stream order. */
API int cuda_double_enqueue_kernel(void *st, unsigned us) {
    return submit_new(st, OP_KERNEL, NULL, NULL, us);
}

/* Wait until everything queued on st has run (a test-side helper; not a CUDA
 * call, so it is not counted as a synchronisation by tokenfeed). */
API void cuda_double_stream_drain(void *st) {
    pthread_mutex_lock(&g_mu);
    drain(resolve(st));
    pthread_mutex_unlock(&g_mu);
}

/* Operations queued on st and not yet run. */
API int cuda_double_stream_pending(void *st) {
    pthread_mutex_lock(&g_mu);
    int n = 0;
    for (op *o = resolve(st)->head; o; o = o->next) n++;
    pthread_mutex_unlock(&g_mu);
    return n;
}

/* Whether [p, p + n) is registered host memory (1) or not (0). */
API int cuda_double_is_pinned(const void *p, size_t n) {
    pthread_mutex_lock(&g_mu);
    int r = registered(p, n);
    pthread_mutex_unlock(&g_mu);
    return r;
}
