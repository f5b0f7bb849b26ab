/*
 * test_device.c — the device layer through the CUDA runtime test double
 * (tests/cuda_double, built next to this program as libcudart_double.so and
 * loaded through $TOKENFEED_CUDART, the same dlopen path as the real runtime).
 *
 * The runtime is loaded once per process, so every case runs in a forked
 * child with its own environment. Covers: loading (override, already loaded,
 * absent), device count / bad index / no device / driver errors, OOM clean-up,
 * pageable fallback, the slot state machine and event gating (a slot is not
 * reused while its release event is pending), CUDA errors mid-run, a ring that
 * outlives its owner, and that nothing ever synchronises the device.
 *
 * The device loader (stage.c): copies issued ahead of the consumer without
 * being asked, never more than `prefetch` ahead; device batches byte-identical
 * to the CPU loader's; position counting only what the consumer received and
 * exact resume; static buffers (one set of caller-owned device buffers, no
 * overwrite while a step reads them, across streams too); slots held by the
 * consumer; CUDA and loader errors; free with copies in flight; stats.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <libgen.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "helpers.h"

static char double_path[4096], double_so12[4096];

/* Hooks exported by the double (resolved in the child after loading). */
static long long (*d_counter)(const char *);
static void (*d_pause)(void *, int);
static int (*d_read)(void *, const void *, size_t, void *);
static void (*d_drain)(void *);
static int (*d_malloc)(void **, size_t);
static int (*d_free)(void *);
static int (*d_stream_create)(void **, unsigned);
static int (*d_stream_destroy)(void *);

static int bind_double(void) {
    tf_cuda_available(NULL, 0); /* loads the runtime (the double) */
    void *h = dlopen(double_path, RTLD_NOW | RTLD_NOLOAD);
    if (!h) h = dlopen(double_so12, RTLD_NOW | RTLD_NOLOAD);
    if (!h) {
        fprintf(stderr, "the double is not loaded in this process\n");
        return -1;
    }
    *(void **)&d_counter = dlsym(h, "cuda_double_counter");
    *(void **)&d_pause = dlsym(h, "cuda_double_pause");
    *(void **)&d_read = dlsym(h, "cuda_double_enqueue_read");
    *(void **)&d_drain = dlsym(h, "cuda_double_stream_drain");
    *(void **)&d_stream_create = dlsym(h, "cudaStreamCreateWithFlags");
    *(void **)&d_stream_destroy = dlsym(h, "cudaStreamDestroy");
    *(void **)&d_malloc = dlsym(h, "cudaMalloc");
    *(void **)&d_free = dlsym(h, "cudaFree");
    return d_counter && d_pause && d_read && d_drain && d_stream_create && d_stream_destroy && d_malloc && d_free
               ? 0
               : -1;
}

static void use_double(const char *fail) {
    setenv("TOKENFEED_CUDART", double_path, 1);
    if (fail) setenv("CUDA_DOUBLE_FAIL", fail, 1);
    else unsetenv("CUDA_DOUBLE_FAIL");
}

#define CONTAINS(s, sub)                                                                           \
    do {                                                                                           \
        if (!strstr((s), (sub))) {                                                                 \
            fprintf(stderr, "%s:%d: expected \"%s\" in \"%s\"\n", __FILE__, __LINE__, (sub), (s)); \
            t_failures++;                                                                          \
        }                                                                                          \
    } while (0)

static void fill(uint8_t *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(seed * 131u + i * 7u + (i >> 8));
}

/* The end of a case: everything allocated, registered or created on the
 * "GPU" was given back, no memory was freed under a queued operation, and
 * nothing synchronised the device or a stream. */
static void expect_all_given_back(void) {
    CHECK(d_counter("device_syncs") == 0 && d_counter("stream_syncs") == 0 && d_counter("bad_frees") == 0);
    CHECK(d_counter("live_allocs") == 0 && d_counter("live_registered") == 0);
    CHECK(d_counter("live_streams") == 0 && d_counter("live_events") == 0);
}

/* ---------------------------------------------------------------- cases */

/* CUDA is not usable: tf_cuda_available says why (with why_has), and a ring
 * cannot be made (an error with err_has). */
static void expect_unusable(const char *why_has, const char *err_has) {
    char why[512];
    CHECK(tf_cuda_available(why, sizeof why) == 0);
    CONTAINS(why, why_has);
    tf_device_ring *r = NULL;
    CHECK_RC(tf_device_ring_create(0, 4096, 2, &r), -TF_ECUDA);
    CONTAINS(tf_last_error(), err_has);
    CHECK(r == NULL);
}

static int case_absent(void) {
    setenv("TOKENFEED_CUDART", "/nonexistent/libcudart.so.12", 1);
    expect_unusable("TOKENFEED_CUDART", "CUDA is not available");
    int n = -1;
    CHECK_RC(tf_cuda_device_count(&n), -TF_ECUDA);
    CHECK(n == 0);
    tf_device_ring_free(NULL);
    /* pinned allocation falls back to pageable memory */
    void *p = NULL;
    int pinned = 1;
    CHECK_OK(tf_pinned_alloc(10000, &p, &pinned));
    CHECK(p && pinned == 0);
    if (p) memset(p, 1, 10000);
    tf_pinned_free(p, 10000);
    /* the CPU path is unaffected */
    uint16_t toks[4000];
    for (int i = 0; i < 4000; i++) toks[i] = (uint16_t)(i % 1000);
    tf_dataset *ds = NULL;
    CHECK_OK(tf_dataset_from_memory(toks, 4000, TF_UINT16, NULL, 0, 1000, &ds));
    tf_loader_config cfg = t_loader_config(16, 4);
    tf_loader *l = NULL;
    CHECK_OK(tf_loader_create(ds, &cfg, &l));
    tf_batch *b = NULL;
    if (l) CHECK_OK(tf_loader_next(l, &b));
    tf_batch_release(b);
    tf_loader_free(l);
    tf_dataset_free(ds);
    return T_DONE();
}

static int case_search_default(void) {
    /* No override: on a machine without CUDA this reports why; with CUDA,
     * what it found. Either way it must not crash and must say something. */
    unsetenv("TOKENFEED_CUDART");
    char why[512] = "";
    int ok = tf_cuda_available(why, sizeof why);
    CHECK(strlen(why) > 10);
    if (!ok) CHECK(strstr(why, "no CUDA runtime found") || strstr(why, "cudaGetDeviceCount"));
    printf("  default search: %s (%s)\n", ok ? "available" : "unavailable", why);
    return T_DONE();
}

static int case_loaded_via_env(void) {
    use_double(NULL);
    setenv("CUDA_DOUBLE_DEVICES", "2", 1);
    char why[512];
    CHECK(tf_cuda_available(why, sizeof why) == 1);
    CONTAINS(why, "CUDA runtime 12.4");
    CONTAINS(why, "$TOKENFEED_CUDART");
    CONTAINS(why, "2 device(s)");
    int n = 0;
    CHECK_OK(tf_cuda_device_count(&n));
    CHECK(n == 2);
    CHECK((tf_features() & TF_FEATURE_CUDA) != 0);
    return T_DONE();
}

static int case_already_loaded(void) {
    unsetenv("TOKENFEED_CUDART");
    /* as if a framework had loaded its libcudart.so.12 first */
    void *h = dlopen(double_so12, RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        fprintf(stderr, "cannot load %s: %s\n", double_so12, dlerror());
        return T_EXIT_FAIL;
    }
    char why[512];
    CHECK(tf_cuda_available(why, sizeof why) == 1);
    CONTAINS(why, "libcudart.so.12 (already loaded in the process)");
    return T_DONE();
}

static int case_no_device(void) {
    use_double(NULL);
    setenv("CUDA_DOUBLE_DEVICES", "0", 1);
    expect_unusable("no CUDA-capable device", "no CUDA device is visible");
    return T_DONE();
}

static int case_driver(void) {
    use_double("driver");
    expect_unusable("driver", "cudaGetDeviceCount");
    return T_DONE();
}

static int case_bad_index(void) {
    use_double(NULL);
    setenv("CUDA_DOUBLE_DEVICES", "2", 1);
    tf_device_ring *r = NULL;
    CHECK_RC(tf_device_ring_create(2, 4096, 2, &r), -EINVAL);
    CONTAINS(tf_last_error(), "device index 2 is out of range");
    CONTAINS(tf_last_error(), "2 device(s)");
    CHECK_RC(tf_device_ring_create(-1, 4096, 2, &r), -EINVAL);
    CHECK_RC(tf_device_ring_create(0, 0, 2, &r), -EINVAL);
    CHECK_RC(tf_device_ring_create(0, 4096, 0, &r), -EINVAL);
    /* device 1 works, and the caller's current device is left alone */
    CHECK_OK(tf_device_ring_create(1, 4096, 2, &r));
    tf_device_ring_info info;
    if (r) {
        tf_device_ring_get_info(r, &info);
        CHECK(info.device == 1 && info.slots == 2 && info.slot_bytes == 4096 && info.host_pinned == 1);
    }
    tf_device_ring_free(r);
    return T_DONE();
}

static int case_oom(void) {
    use_double("malloc_after=2");
    if (bind_double() < 0) return T_EXIT_FAIL;
    tf_device_ring *r = NULL;
    CHECK_RC(tf_device_ring_create(0, 1 << 20, 4, &r), -ENOMEM);
    CONTAINS(tf_last_error(), "out of memory");
    CONTAINS(tf_last_error(), "slot 3/4");
    CONTAINS(tf_last_error(), "lower batch_size");
    CHECK(r == NULL);
    expect_all_given_back(); /* what was allocated before the failure */
    return T_DONE();
}

static int case_pageable_fallback(void) {
    use_double("register");
    if (bind_double() < 0) return T_EXIT_FAIL;
    void *p = NULL;
    int pinned = 1;
    CHECK_OK(tf_pinned_alloc(5000, &p, &pinned));
    CHECK(p && !pinned);
    CONTAINS(tf_last_error(), "ulimit -l");
    tf_pinned_free(p, 5000);
    tf_device_ring *r = NULL;
    CHECK_OK(tf_device_ring_create(0, 1000, 2, &r));
    if (!r) return T_DONE();
    tf_device_ring_info info;
    tf_device_ring_get_info(r, &info);
    CHECK(info.host_pinned == 0);
    CONTAINS(info.note, "pageable");
    uint8_t src[1000], out[1000];
    fill(src, sizeof src, 3);
    tf_device_seg seg = {src, sizeof src};
    tf_device_slot *s = NULL;
    CHECK_OK(tf_device_ring_upload(r, &seg, 1, 1, &s));
    if (s) {
        CHECK_OK(tf_device_slot_synchronize(s));
        memcpy(out, tf_device_slot_ptr(s), sizeof out); /* device memory is host memory here */
        CHECK(!memcmp(src, out, sizeof out));
        CHECK_OK(tf_device_slot_release(s, TF_DEVICE_STREAM_NONE));
    }
    tf_device_ring_free(r);
    return T_DONE();
}

static int case_pinned(void) {
    use_double(NULL);
    if (bind_double() < 0) return T_EXIT_FAIL;
    void *p = NULL;
    int pinned = 0;
    CHECK_OK(tf_pinned_alloc(5000, &p, &pinned));
    CHECK(p && pinned && ((uintptr_t)p & 4095) == 0);
    CHECK(d_counter("live_registered") == 1);
    tf_pinned_free(p, 5000);
    CHECK(d_counter("live_registered") == 0);
    CHECK_RC(tf_pinned_alloc(0, &p, NULL), -EINVAL);
    return T_DONE();
}

/* The double bound (failing nothing), a consumer stream *cs and a ring of
 * `slots` slots of `bytes` on device 0; NULL when one cannot be made
 * (reported). */
static tf_device_ring *ring_open(size_t bytes, int slots, void **cs) {
    tf_device_ring *r = NULL;
    use_double(NULL);
    if (bind_double() < 0) return NULL;
    CHECK(d_stream_create(cs, 1) == 0);
    CHECK_OK(tf_device_ring_create(0, bytes, slots, &r));
    return r;
}

/* Two segments round trip through a consumer stream. */
static int case_roundtrip(void) {
    void *cs = NULL;
    tf_device_ring *r = ring_open(2000, 2, &cs);
    if (!r) return T_EXIT_FAIL;
    tf_device_ring_info info;
    tf_device_ring_get_info(r, &info);
    CHECK(info.slot_bytes == 2048 && info.free_slots == 2 && info.host_pinned == 1);
    uint8_t a[1000], b[300], outa[1000], outb[300];
    fill(a, sizeof a, 1);
    fill(b, sizeof b, 2);
    tf_device_seg segs[2] = {{a, sizeof a}, {b, sizeof b}};
    size_t off[2];
    CHECK(tf_device_packed_size(segs, 2, off) == 1324);
    CHECK(off[0] == 0 && off[1] == 1024);
    tf_device_slot *s = NULL;
    CHECK_OK(tf_device_ring_upload(r, segs, 2, 0, &s));
    if (!s) return T_DONE();
    memset(a, 0, sizeof a); /* the caller's buffers are free once upload returns */
    tf_device_ring_get_info(r, &info);
    CHECK(info.in_use == 1 && info.free_slots == 1 && info.uploads == 1);
    CHECK_OK(tf_device_slot_wait(s, (uintptr_t)cs));
    uint8_t *dev = tf_device_slot_ptr(s);
    d_read(cs, dev, sizeof outa, outa);
    d_read(cs, dev + off[1], sizeof outb, outb);
    CHECK_OK(tf_device_slot_release(s, (uintptr_t)cs));
    d_drain(cs);
    fill(a, sizeof a, 1);
    CHECK(!memcmp(outa, a, sizeof a));
    CHECK(!memcmp(outb, b, sizeof b));
    /* default-stream handles work as consumer streams too */
    CHECK_OK(tf_device_ring_upload(r, segs, 1, 1, &s));
    if (s) {
        CHECK_OK(tf_device_slot_wait(s, 1));
        CHECK_OK(tf_device_slot_release(s, 1));
    }
    /* misuse is an error, not a crash */
    CHECK_OK(tf_device_ring_acquire(r, 1, &s));
    if (s) {
        CHECK_RC(tf_device_slot_commit(s, 4096), -EINVAL);
        CHECK_RC(tf_device_slot_wait(s, 1), -EINVAL);
        CHECK_OK(tf_device_slot_release(s, TF_DEVICE_STREAM_NONE)); /* never committed */
    }
    uint8_t big[3000] = {0};
    tf_device_seg bs = {big, sizeof big};
    CHECK_RC(tf_device_ring_upload(r, &bs, 1, 1, &s), -EINVAL);
    CONTAINS(tf_last_error(), "do not fit");
    tf_device_ring_free(r);
    d_stream_destroy(cs);
    expect_all_given_back();
    return T_DONE();
}

struct acq_arg {
    tf_device_ring *r;
    tf_device_seg seg;
    tf_device_slot *slot;
    int rc;
    atomic_int done;
};

static void *acquire_thread(void *p) {
    struct acq_arg *a = p;
    a->rc = tf_device_ring_upload(a->r, &a->seg, 1, 1, &a->slot);
    atomic_store(&a->done, 1);
    return NULL;
}

/* The heart of it: a slot whose release event is pending is not reused. */
static int case_event_gating(void) {
    void *cs = NULL;
    tf_device_ring *r = ring_open(4096, 2, &cs);
    if (!r) return T_EXIT_FAIL;
    static uint8_t A[4096], B[4096], Cb[4096], seenA[4096];
    fill(A, sizeof A, 10);
    fill(B, sizeof B, 11);
    fill(Cb, sizeof Cb, 12);
    tf_device_seg sa = {A, sizeof A}, sb = {B, sizeof B};
    tf_device_slot *a = NULL, *b = NULL, *c = NULL;

    /* The consumer stream is held, as if busy with a long training step. */
    d_pause(cs, 1);
    CHECK_OK(tf_device_ring_upload(r, &sa, 1, 0, &a));
    if (!a) return T_DONE();
    void *slot_a_dev = tf_device_slot_ptr(a);
    CHECK_OK(tf_device_slot_wait(a, (uintptr_t)cs));
    d_read(cs, slot_a_dev, sizeof seenA, seenA); /* the step reads batch A ... */
    CHECK_OK(tf_device_slot_release(a, (uintptr_t)cs)); /* ... and releases it: event pending */
    CHECK_OK(tf_device_ring_upload(r, &sb, 1, 0, &b)); /* the other slot is free */
    if (!b) return T_DONE();
    CHECK(tf_device_slot_ptr(b) != slot_a_dev);

    long long q0 = d_counter("event_queries");
    tf_device_slot *x = NULL;
    CHECK_RC(tf_device_ring_upload(r, &sa, 1, 0, &x), -EAGAIN); /* A's slot is still being read */
    CHECK(d_counter("event_queries") > q0);
    tf_device_ring_info info;
    tf_device_ring_get_info(r, &info);
    CHECK(info.free_slots == 0 && info.in_use == 1);

    /* A blocking upload waits for exactly that event ... */
    struct acq_arg arg = {.r = r, .seg = {Cb, sizeof Cb}};
    pthread_t th;
    pthread_create(&th, NULL, acquire_thread, &arg);
    usleep(100 * 1000);
    CHECK(atomic_load(&arg.done) == 0);
    /* ... which completes when the consumer stream gets past the release. */
    d_pause(cs, 0);
    pthread_join(th, NULL);
    CHECK_OK(arg.rc);
    c = arg.slot;
    CHECK(c && tf_device_slot_ptr(c) == slot_a_dev);
    d_drain(cs);
    CHECK(!memcmp(seenA, A, sizeof A)); /* the step saw A, not C */
    tf_device_ring_get_info(r, &info);
    CHECK(info.release_waits == 1 && info.uploads == 3);

    /* every slot held by the consumer and none released: a clear error */
    CHECK_RC(tf_device_ring_acquire(r, 1, &x), -EBUSY);
    CONTAINS(tf_last_error(), "held by the consumer");

    CHECK_OK(tf_device_slot_release(b, TF_DEVICE_STREAM_NONE));
    if (c) {
        CHECK_OK(tf_device_slot_synchronize(c));
        CHECK(!memcmp(tf_device_slot_ptr(c), Cb, sizeof Cb));
        CHECK_OK(tf_device_slot_release(c, (uintptr_t)cs));
    }
    tf_device_ring_free(r);
    d_stream_destroy(cs);
    expect_all_given_back();
    return T_DONE();
}

/* Many batches through 3 slots with slow "hardware": every consumer read sees
 * its own batch, and nothing synchronises the device. */
static int case_pipeline(void) {
    setenv("CUDA_DOUBLE_DELAY_US", "100", 1);
    enum { N = 200, SZ = 512 };
    void *cs = NULL;
    tf_device_ring *r = ring_open(SZ, 3, &cs);
    if (!r) return T_EXIT_FAIL;
    static uint8_t seen[N][SZ];
    uint8_t src[SZ];
    for (int i = 0; i < N; i++) {
        fill(src, SZ, (unsigned)i);
        tf_device_seg seg = {src, SZ};
        tf_device_slot *s = NULL;
        int rc = tf_device_ring_upload(r, &seg, 1, 1, &s);
        CHECK_OK(rc);
        if (rc) break;
        CHECK_OK(tf_device_slot_wait(s, (uintptr_t)cs));
        d_read(cs, tf_device_slot_ptr(s), SZ, seen[i]);
        CHECK_OK(tf_device_slot_release(s, (uintptr_t)cs));
    }
    d_drain(cs);
    int bad = 0;
    for (int i = 0; i < N; i++) {
        fill(src, SZ, (unsigned)i);
        bad += memcmp(seen[i], src, SZ) != 0;
    }
    CHECK(bad == 0);
    tf_device_ring_info info;
    tf_device_ring_get_info(r, &info);
    CHECK(info.uploads == N);
    CHECK(d_counter("memcpys") == N);
    CHECK(d_counter("registers") == 1);                  /* staging registered once, not per batch */
    CHECK(d_counter("mallocs") == 3);                    /* device slots allocated once */
    printf("  pipeline: %d batches, %u release waits, %lld event queries, %lld event syncs\n", N,
           (unsigned)info.release_waits, d_counter("event_queries"), d_counter("event_syncs"));
    tf_device_ring_free(r);
    d_stream_destroy(cs);
    expect_all_given_back();
    return T_DONE();
}

/* A ring case without a consumer stream: a ring of two slots of 256 bytes,
 * one segment of 256 bytes to upload (its first byte 1) and the slot it went
 * to. */
typedef struct {
    tf_device_ring *r;
    uint8_t src[256];
    tf_device_seg seg;
    tf_device_slot *s;
} small_ring;

/* Bind the double, failing as fail says (NULL: nothing), and make a small
 * ring case; -1 when it cannot be made (reported). */
static int small_ring_open(small_ring *t, const char *fail) {
    memset(t, 0, sizeof *t);
    t->src[0] = 1;
    t->seg = (tf_device_seg){t->src, sizeof t->src};
    use_double(fail);
    if (bind_double() < 0) return -1;
    CHECK_OK(tf_device_ring_create(0, sizeof t->src, 2, &t->r));
    return t->r ? 0 : -1;
}

/* Free the ring; the device allocations still live after. */
static long long small_ring_close(small_ring *t) {
    tf_device_ring_free(t->r);
    return d_counter("live_allocs");
}

static int case_memcpy_failure(void) {
    small_ring t;
    if (small_ring_open(&t, "memcpy_after=3") < 0) return T_EXIT_FAIL;
    for (int i = 0; i < 3; i++) {
        CHECK_OK(tf_device_ring_upload(t.r, &t.seg, 1, 1, &t.s));
        if (t.s) CHECK_OK(tf_device_slot_release(t.s, TF_DEVICE_STREAM_NONE));
    }
    CHECK_RC(tf_device_ring_upload(t.r, &t.seg, 1, 1, &t.s), -TF_ECUDA);
    CONTAINS(tf_last_error(), "cudaMemcpyAsync");
    CONTAINS(tf_last_error(), "invalid argument");
    CHECK(t.s == NULL);
    tf_device_ring_info info;
    tf_device_ring_get_info(t.r, &info);
    CHECK(info.in_use == 0 && info.lost == 0); /* the slot went back */
    CHECK(small_ring_close(&t) == 0);
    return T_DONE();
}

static int case_release_failure(void) {
    small_ring t;
    /* the copy's event records, the release's does not */
    if (small_ring_open(&t, "record_after=1") < 0) return T_EXIT_FAIL;
    CHECK_OK(tf_device_ring_upload(t.r, &t.seg, 1, 1, &t.s));
    /* (with event records failing, teardown cannot wait for the copy itself) */
    if (t.s) CHECK_OK(tf_device_slot_synchronize(t.s));
    CHECK_RC(tf_device_slot_release(t.s, 1), -TF_ECUDA);
    CONTAINS(tf_last_error(), "withdrawn");
    tf_device_ring_info info;
    tf_device_ring_get_info(t.r, &info);
    CHECK(info.lost == 1 && info.in_use == 0 && info.free_slots == 1);
    CHECK(small_ring_close(&t) == 1); /* the withdrawn slot is never freed under a reader */
    return T_DONE();
}

static int case_outlives_owner(void) {
    small_ring t;
    if (small_ring_open(&t, NULL) < 0) return T_EXIT_FAIL;
    fill(t.src, sizeof t.src, 5);
    CHECK_OK(tf_device_ring_upload(t.r, &t.seg, 1, 1, &t.s));
    CHECK(small_ring_close(&t) == 2); /* loader closed while a tensor is alive */
    if (t.s) {
        CHECK_OK(tf_device_slot_synchronize(t.s));
        CHECK(!memcmp(tf_device_slot_ptr(t.s), t.src, sizeof t.src));
        CHECK_OK(tf_device_slot_release(t.s, 1));
    }
    expect_all_given_back();
    return T_DONE();
}


/* ---------------------------------------------------------------- device loader */

/* A dataset of 300 documents of 1..299 uint16 tokens. */
static tf_dataset *stage_dataset(void) {
    enum { NDOC = 300 };
    static uint16_t toks[NDOC * 300];
    uint64_t ends[NDOC], n = 0;
    uint64_t x = 12345;
    for (int d = 0; d < NDOC; d++) {
        x = tf_mix64(x + 1);
        uint64_t len = 1 + x % 299;
        for (uint64_t i = 0; i < len; i++) toks[n + i] = (uint16_t)(tf_mix64(x ^ i) % 5000);
        n += len;
        ends[d] = n;
    }
    tf_dataset *ds = NULL;
    if (tf_dataset_from_memory(toks, n, TF_UINT16, ends, NDOC, 5000, &ds) < 0) {
        fprintf(stderr, "tf_dataset_from_memory: %s\n", tf_last_error());
        return NULL;
    }
    return ds;
}

enum { S_L = 64, S_B = 4 };

/* What the device loader cases vary in the loader: the arrays it makes, its
 * epochs (0: an infinite stream) and context parallelism (cp_size 0: none). */
typedef struct {
    unsigned want;
    uint64_t epochs;
    uint32_t cp_rank, cp_size;
} stage_cfg;

static const stage_cfg PLAIN = {0, 0, 0, 0};
#define ALL_ARRAYS (TF_WANT_POSITION_IDS | TF_WANT_CU_SEQLENS | TF_WANT_LOSS_MASK)
/* A context-parallel rank's share: plain split, and TransformerEngine's THD
 * layout (what cu_seqlens asks for under CP). */
static const stage_cfg CP_PLAIN = {TF_WANT_POSITION_IDS | TF_WANT_LOSS_MASK, 1, 1, 2};
static const stage_cfg CP_THD = {ALL_ARRAYS, 1, 1, 2};

static tf_loader *stage_loader(tf_dataset *ds, const stage_cfg *c) {
    tf_loader_config cfg;
    tf_loader_config_init(&cfg);
    cfg.order.seq_len = S_L;
    cfg.order.seed = 7;
    cfg.order.shuffle = TF_SHUFFLE_FULL;
    cfg.order.epochs = c->epochs;
    cfg.batch_size = S_B;
    cfg.order.global_batch = S_B;
    cfg.out_dtype = TF_INT32;
    cfg.want = c->want;
    cfg.num_threads = 2;
    if (c->cp_size > 1) {
        cfg.cp_rank = c->cp_rank;
        cfg.cp_size = c->cp_size;
    }
    tf_loader *l = NULL;
    if (tf_loader_create(ds, &cfg, &l) < 0) fprintf(stderr, "tf_loader_create: %s\n", tf_last_error());
    return l;
}

/* A batch's arrays, in a fixed order (tokens, position_ids, cu_seqlens,
 * num_seqs, loss_mask, input_ids, labels, cu_seqlens_padded; size 0 for those
 * it does not have), sized from the layout tokenfeed.h documents (out dtype
 * int32), and its host-side counts (num_tokens, THD sequences, max_seqlen). */
enum { NARR = 8 };
typedef struct {
    const void *p[NARR];
    size_t n[NARR];
    int64_t counts[3];
} arrays;

static void arrays_size(arrays *a, uint64_t rows, uint64_t L, uint32_t cp, int thd) {
    uint64_t N = rows * L, t = (uint64_t)a->counts[0], seqs = thd ? (uint64_t)a->counts[1] + 1 : 0;
    uint64_t whole[NARR] = {(N + rows) * 4, N * 4, (N + rows) * 4, rows * 4, N, 0, 0, 0};
    uint64_t share[NARR] = {0, t * 4, seqs * 4, 0, t, t * 4, t * 4, seqs * 4};
    for (int j = 0; j < NARR; j++) a->n[j] = a->p[j] ? (size_t)(cp > 1 ? share[j] : whole[j]) : 0;
}

static void host_arrays(const tf_batch_view *v, arrays *a) {
    const void *p[NARR] = {v->tokens,    v->position_ids, v->cu_seqlens, v->thd ? NULL : v->num_seqs,
                           v->loss_mask, v->input_ids,    v->labels,     v->cu_seqlens_padded};
    memcpy(a->p, p, sizeof p);
    a->counts[0] = v->cp_size > 1 ? (int64_t)v->num_tokens : 0;
    a->counts[1] = v->thd ? v->num_seqs[0] : 0;
    a->counts[2] = v->thd ? v->max_seqlen : 0;
    arrays_size(a, v->rows, v->seq_len, v->cp_size, v->thd);
}

static void dev_arrays(const tf_device_batch_view *v, arrays *a) {
    const void *p[NARR] = {v->tokens,    v->position_ids, v->cu_seqlens, v->num_seqs,
                           v->loss_mask, v->input_ids,    v->labels,     v->cu_seqlens_padded};
    memcpy(a->p, p, sizeof p);
    a->counts[0] = v->cp_size > 1 ? (int64_t)v->num_tokens : 0;
    a->counts[1] = v->thd ? v->thd_seqs : 0;
    a->counts[2] = v->thd ? v->max_seqlen : 0;
    arrays_size(a, v->rows, v->seq_len, v->cp_size, v->thd);
}

static size_t arrays_bytes(const arrays *a) {
    size_t n = 0;
    for (int j = 0; j < NARR; j++) n += a->n[j];
    return n;
}

/* One batch flattened: its arrays end to end, then its counts, so that two
 * batches compare with one memcmp. */
typedef struct { uint8_t *p; size_t n; uint64_t position; } flat;

static flat flat_alloc(const arrays *a, uint64_t position) {
    flat f = {NULL, arrays_bytes(a) + sizeof a->counts, position};
    f.p = malloc(f.n);
    if (f.p) memcpy(f.p + f.n - sizeof a->counts, a->counts, sizeof a->counts);
    return f;
}

static flat flat_cpu(tf_batch *b) {
    tf_batch_view v;
    tf_batch_get_view(b, &v);
    arrays a;
    host_arrays(&v, &a);
    flat f = flat_alloc(&a, v.position);
    for (size_t j = 0, off = 0; j < NARR && f.p; off += a.n[j++])
        if (a.n[j]) memcpy(f.p + off, a.p[j], a.n[j]);
    return f;
}

/* What a kernel on `cs` reads from the device batch: reads queued on the
 * stream (run in stream order, after its wait on the copy). */
static flat flat_dev_enqueue(const tf_device_batch_view *v, void *cs) {
    arrays a;
    dev_arrays(v, &a);
    flat f = flat_alloc(&a, v->position);
    for (size_t j = 0, off = 0; j < NARR && f.p; off += a.n[j++])
        if (a.n[j]) d_read(cs, a.p[j], a.n[j], f.p + off);
    return f;
}

/* The CPU stream: n batches (fewer at the end of a finite stream). */
static int cpu_stream(tf_dataset *ds, const stage_cfg *c, uint64_t start, int n, flat *out) {
    tf_loader *l = stage_loader(ds, c);
    if (!l) return -1;
    if (start) tf_loader_seek(l, start);
    int k = 0;
    for (; k < n; k++) {
        tf_batch *b = NULL;
        if (tf_loader_next(l, &b) < 0) break;
        out[k] = flat_cpu(b);
        tf_batch_release(b);
    }
    tf_loader_free(l);
    return k;
}

static int flat_eq(const flat *a, const flat *b) {
    return a->n == b->n && a->position == b->position && !memcmp(a->p, b->p, a->n);
}

/* How many of n batches differ. */
static int flats_differ(const flat *a, const flat *b, int n) {
    int bad = 0;
    for (int i = 0; i < n; i++) bad += !flat_eq(&a[i], &b[i]);
    return bad;
}

static void flat_free(flat *f, int n) {
    for (int i = 0; i < n; i++) free(f[i].p);
}

/* Wait (bounded, 10 s) until the device loader reports `n` batches copied
 * ahead of the consumer. */
static int wait_queued(tf_device_loader *d, int n) {
    for (int i = 0; i < 10000; i++) {
        tf_device_stats st;
        tf_device_loader_get_stats(d, &st);
        if (st.queued >= n) return 1;
        usleep(1000);
    }
    return 0;
}

/* A device loader case's objects: the dataset, a loader over it, the
 * consumer's stream and the device loader. */
typedef struct {
    tf_dataset *ds;
    tf_loader *l;
    void *cs;
    tf_device_loader *d;
} stage;

/* Bind the double (copies taking copy_us each on the DMA engine, NULL: no
 * time) and make a case's objects; dc NULL: the default device config. -1
 * when one cannot be made (reported). */
static int stage_open(stage *t, const char *copy_us, const stage_cfg *c, const tf_device_config *dc) {
    memset(t, 0, sizeof *t);
    if (copy_us) setenv("CUDA_DOUBLE_COPY_US", copy_us, 1);
    if (bind_double() < 0 || !(t->ds = stage_dataset()) || !(t->l = stage_loader(t->ds, c))) return -1;
    CHECK(d_stream_create(&t->cs, 1) == 0);
    CHECK_OK(tf_device_loader_create(t->l, dc, &t->d));
    return t->d ? 0 : -1;
}

/* stage_open over the plain loader with the double failing nothing and a
 * device loader that copies up to prefetch batches ahead. */
static int stage_open_ahead(stage *t, const char *copy_us, int prefetch) {
    tf_device_config dc;
    tf_device_config_init(&dc);
    dc.prefetch = prefetch;
    use_double(NULL);
    return stage_open(t, copy_us, &PLAIN, &dc);
}

/* Free a case's objects, and expect_all_given_back. */
static void stage_close(stage *t) {
    tf_device_loader_free(t->d);
    tf_loader_free(t->l);
    tf_dataset_free(t->ds);
    if (t->cs) d_stream_destroy(t->cs);
    expect_all_given_back();
}

/* One step on stream cs: the next batch, a "kernel" there that reads it into
 * *f, the release on that stream. 0, or what next() returned. */
static int step(tf_device_loader *d, void *cs, flat *f) {
    tf_device_batch *b = NULL;
    int rc = tf_device_loader_next(d, (uintptr_t)cs, &b);
    if (rc < 0) return rc;
    tf_device_batch_view v;
    tf_device_batch_get_view(b, &v);
    *f = flat_dev_enqueue(&v, cs);
    CHECK_OK(tf_device_batch_release(b, (uintptr_t)cs));
    return 0;
}

/* The meter on the GPU's clock: copies of 20 ms and a consumer with nothing
 * else to do, so the consumer's stream stands still for nearly every copy;
 * events are read only once they have run (pending while the stream is
 * held), never waited for; a caller's own request and hand-off marks bracket
 * its work; every event is given back at free. */
static int case_stage_gpu_meter(void) {
    stage t;
    use_double(NULL);
    if (stage_open(&t, "20000", &PLAIN, NULL) < 0) return T_EXIT_FAIL;
    flat f[12];
    memset(f, 0, sizeof f);
    tf_meter m;
    uint64_t pending = 99;
    CHECK_RC(tf_device_loader_get_gpu_meter(NULL, 0, &m, &pending), -EINVAL);
    CHECK(pending == 0);
    CHECK_RC(tf_device_loader_get_gpu_meter(t.d, 0, NULL, NULL), -EINVAL);
    CHECK_OK(tf_device_loader_get_gpu_meter(t.d, 0, &m, &pending));
    CHECK(m.total_batches == 0 && m.batches == 0 && pending == 0);
    for (int k = 0; k < 6; k++) CHECK_OK(step(t.d, t.cs, &f[k]));
    d_drain(t.cs);
    CHECK_OK(tf_device_loader_get_gpu_meter(t.d, 0, &m, &pending));
    printf("  GPU wait %.1f %% of %.3f s over %llu batches, p50 %.1f ms\n", 100 * m.wait_fraction, m.window_seconds,
           (unsigned long long)m.batches, 1e3 * m.wait_p50_seconds);
    CHECK(m.total_batches == 6 && m.batches == 5 && pending == 0);
    CHECK(m.window_seconds >= 5 * 0.020 * 0.99); /* the copies run one after another */
    CHECK(m.wait_fraction > 0.6 && m.startup_seconds > 0);
    /* held stream: hand-offs pending, nothing read, nothing waited for */
    d_pause(t.cs, 1);
    for (int k = 6; k < 8; k++) CHECK_OK(step(t.d, t.cs, &f[k]));
    long long syncs = d_counter("event_syncs");
    CHECK_OK(tf_device_loader_get_gpu_meter(t.d, 0, &m, &pending));
    CHECK(pending == 2 && m.total_batches == 6);
    CHECK(d_counter("event_syncs") == syncs);
    d_pause(t.cs, 0);
    d_drain(t.cs);
    CHECK_OK(tf_device_loader_get_gpu_meter(t.d, 2, &m, &pending));
    CHECK(pending == 0 && m.total_batches == 8 && m.batches == 2);
    /* the caller's marks: its 30 ms of host work between next() and the hand-off is stream wait */
    for (int k = 8; k < 11; k++) {
        CHECK_OK(tf_device_loader_gpu_request(t.d, (uintptr_t)t.cs));
        tf_device_batch *b = NULL;
        CHECK_OK(tf_device_loader_next(t.d, (uintptr_t)t.cs, &b));
        usleep(30000);
        CHECK_OK(tf_device_loader_gpu_handoff(t.d, (uintptr_t)t.cs));
        CHECK_OK(tf_device_batch_release(b, (uintptr_t)t.cs));
    }
    d_drain(t.cs);
    CHECK_OK(tf_device_loader_get_gpu_meter(t.d, 3, &m, &pending));
    CHECK(m.total_batches == 11 && m.batches == 3 && m.wait_p50_seconds >= 0.030 * 0.99);
    CHECK_RC(tf_device_loader_gpu_request(NULL, 1), -EINVAL);
    for (int k = 0; k < 11; k++) flat_free(&f[k], 1);
    stage_close(&t);
    return T_DONE();
}

/* The copies run ahead of the consumer without being asked, up to prefetch,
 * and a consumer that spends 2 ms per step finds every batch's copy issued. */
static int case_stage_ahead(void) {
    stage t;
    if (stage_open_ahead(&t, "300", 3) < 0) return T_EXIT_FAIL; /* copies take time on the DMA engine */
    /* Nothing is asked of the loader: the copy thread fills the queue up to
     * prefetch, and no further. */
    CHECK_OK(tf_device_loader_start(t.d));
    CHECK(wait_queued(t.d, 3));
    usleep(50 * 1000);
    tf_device_stats st;
    tf_device_loader_get_stats(t.d, &st);
    CHECK(st.queued == 3 && st.copies == 3 && st.batches == 0);
    CHECK(tf_device_loader_position(t.d) == 0); /* copied ahead is not received */
    CHECK(tf_loader_position(t.l) == 3 * S_B);  /* (the engine handed them out) */

    enum { STEPS = 100 };
    flat got[STEPS], cpu[STEPS];
    int k = 0;
    for (; k < STEPS; k++) {
        /* The step before took 2 ms; like a training loop whose GPU work is
         * queued, the consumer comes back for the next batch. On a loaded
         * machine the copy thread may not have run in those 2 ms: wait
         * (bounded) until it reports the next copy issued, so the count
         * below does not depend on scheduling. */
        CHECK(wait_queued(t.d, 1));
        tf_device_batch *b = NULL;
        CHECK_OK(tf_device_loader_next(t.d, (uintptr_t)t.cs, &b));
        if (!b) break;
        tf_device_batch_view v;
        tf_device_batch_get_view(b, &v);
        CHECK(v.position == (uint64_t)k * S_B && v.rows == S_B && v.seq_len == S_L && v.dtype == TF_INT32);
        CHECK(tf_device_loader_position(t.d) == (uint64_t)(k + 1) * S_B);
        got[k] = flat_dev_enqueue(&v, t.cs); /* the "kernel" */
        usleep(2000);                         /* the step */
        CHECK_OK(tf_device_batch_release(b, (uintptr_t)t.cs));
    }
    tf_device_loader_get_stats(t.d, &st);
    printf("  ahead: %llu/%llu copies issued ahead, %.1f us mean wait, p99 %.1f us\n",
           (unsigned long long)st.issued_ahead, (unsigned long long)st.batches, st.wait_mean_s * 1e6,
           st.wait_p99_s * 1e6);
    CHECK(k == STEPS && st.batches == STEPS);
    CHECK(st.copies_issued_ahead >= 0.95);
    CHECK(st.issued_ahead == STEPS); /* with the bounded wait above, every one */
    CHECK(st.copies >= STEPS && st.copies <= STEPS + 3);
    CHECK(st.wait_p99_s > 0 && st.wait_mean_s > 0);
    d_drain(t.cs);
    CHECK(cpu_stream(t.ds, &PLAIN, 0, STEPS, cpu) == STEPS);
    CHECK(flats_differ(cpu, got, k) == 0);
    flat_free(cpu, STEPS);
    flat_free(got, k);
    stage_close(&t);
    CHECK(d_counter("live_streams") == 0);
    return T_DONE();
}

/* Device batches equal the CPU batches byte for byte, every array, to the
 * end of a finite stream, with the consumer holding the previous batch
 * during a step; the workers assembled each batch in page-locked memory and
 * the DMA read it there (no host memcpy into staging, no pageable source),
 * one copy per array. With context parallelism, whatever arrays the rank's
 * share has (plain: input_ids, labels, position_ids, loss_mask; THD: those
 * and cu_seqlens, cu_seqlens_padded, with the counts on the host) are copied
 * ahead the same way, a consumer that spends 2 ms per step finds them all
 * copied ahead, and no tokens buffer exists on the device. */
static int stage_bytes(const stage_cfg *c, int narrays, int paced) {
    enum { MAX = 400 };
    static flat cpu[MAX], dev[MAX];
    stage t;
    use_double(NULL);
    if (stage_open(&t, "200", c, NULL) < 0) return T_EXIT_FAIL; /* a read before the copy lands would see 0xAB */
    int n = cpu_stream(t.ds, c, 0, MAX, cpu);
    CHECK(n > 20 && n < MAX);
    int k = 0, rc = 0;
    size_t bytes = 0;
    tf_device_batch *held = NULL; /* the consumer keeps the previous batch alive during a step */
    if (paced) CHECK_OK(tf_device_loader_start(t.d));
    for (;; k++) {
        if (paced && k < n) CHECK(wait_queued(t.d, 1)); /* (bounded: see case_stage_ahead) */
        tf_device_batch *b = NULL;
        rc = tf_device_loader_next(t.d, (uintptr_t)t.cs, &b);
        if (rc < 0) break;
        tf_device_batch_view v;
        tf_device_batch_get_view(b, &v);
        CHECK(v.ready_event && v.cp_size == (c->cp_size > 1 ? c->cp_size : 1));
        CHECK(c->cp_size > 1 ? !v.tokens && v.input_ids && v.labels : v.tokens && !v.input_ids);
        CHECK(!!v.cu_seqlens_padded == (c->cp_size > 1 && (c->want & TF_WANT_CU_SEQLENS)));
        if (k < MAX) {
            dev[k] = flat_dev_enqueue(&v, t.cs);
            arrays a;
            dev_arrays(&v, &a);
            bytes += arrays_bytes(&a);
        }
        if (paced) usleep(2000);
        CHECK_OK(tf_device_batch_release(held, (uintptr_t)t.cs));
        held = b;
    }
    CHECK_RC(rc, -TF_EEOF);
    tf_device_batch *none = NULL;
    CHECK_RC(tf_device_loader_next(t.d, (uintptr_t)t.cs, &none), -TF_EEOF); /* and again */
    CHECK_OK(tf_device_batch_release(held, (uintptr_t)t.cs));
    d_drain(t.cs);
    CHECK(k == n);
    CHECK(flats_differ(cpu, dev, k < n ? k : n) == 0);
    tf_device_stats st;
    tf_device_loader_get_stats(t.d, &st);
    CHECK(st.batches == (uint64_t)n && st.copies == (uint64_t)n);
    if (paced) CHECK(st.copies_issued_ahead >= 0.95 && st.issued_ahead == st.batches);
    CHECK(st.host_pinned == 1);
    CHECK(st.h2d_bytes == bytes); /* each array's filled part, no more */
    CHECK(st.h2d_timed_bytes > 0 && st.h2d_seconds > 0 && st.h2d_gbps > 0);
    CHECK(st.staging_copies == 0 && st.staging_bytes == 0);
    CHECK(st.direct_copies == st.copies);
    CHECK(d_counter("h2d_pageable") == 0);
    CHECK(d_counter("h2d_pinned") == narrays * (long long)st.copies); /* one copy per array */
    CHECK(st.engine_buffers_locked > 0 && d_counter("registers") == (long long)st.engine_buffers_locked);
    CHECK(st.engine_buffers_locked <= 16); /* ring depth + workers + slots, for 173 batches */
    printf("  bytes: %d batches (cp %u), %llu direct copies, %llu staging copies, %llu engine buffers "
           "page-locked, %.2f copied ahead\n",
           n, c->cp_size, (unsigned long long)st.direct_copies, (unsigned long long)st.staging_copies,
           (unsigned long long)st.engine_buffers_locked, st.copies_issued_ahead);
    flat_free(cpu, n);
    flat_free(dev, k < MAX ? k : MAX);
    stage_close(&t);
    return T_DONE();
}

static int case_stage_bytes(void) {
    const stage_cfg all = {ALL_ARRAYS, 1, 0, 0};
    return stage_bytes(&all, 5, 0);
}
static int case_stage_cp(void) { return stage_bytes(&CP_PLAIN, 4, 1); }
static int case_stage_thd(void) { return stage_bytes(&CP_THD, 6, 1); }

/* A loader that already ran on the CPU has batches assembled in pageable
 * buffers: those go through the ring's pinned staging (allocated then, once,
 * and counted); every later batch is read in place; the bytes are the same. */
static int case_stage_pageable_first(void) {
    const stage_cfg lm = {TF_WANT_LOSS_MASK, 0, 0, 0};
    use_double(NULL);
    tf_dataset *ds = bind_double() < 0 ? NULL : stage_dataset();
    if (!ds) return T_EXIT_FAIL;
    enum { N = 80 };
    flat cpu[N], dev[N];
    CHECK(cpu_stream(ds, &lm, 0, N, cpu) == N);
    stage t = {ds, stage_loader(ds, &lm), NULL, NULL};
    tf_batch *hb = NULL;
    CHECK_OK(tf_loader_next(t.l, &hb)); /* the CPU path first: workers fill ordinary buffers */
    dev[0] = flat_cpu(hb);
    tf_batch_release(hb);
    /* wait (bounded) until batches assembled in ordinary buffers are waiting */
    tf_loader_stats ls;
    for (int i = 0; i < 10000; i++) {
        tf_loader_get_stats(t.l, &ls);
        if (ls.ring_ready >= 2) break;
        usleep(1000);
    }
    CHECK(ls.ring_ready >= 2);
    CHECK(d_stream_create(&t.cs, 1) == 0);
    CHECK_OK(tf_device_loader_create(t.l, NULL, &t.d));
    if (!t.d) return T_DONE();
    CHECK(tf_device_loader_position(t.d) == S_B);
    for (int k = 1; k < N; k++) CHECK_OK(step(t.d, t.cs, &dev[k]));
    d_drain(t.cs);
    CHECK(flats_differ(cpu, dev, N) == 0);
    tf_device_stats st;
    tf_device_loader_get_stats(t.d, &st);
    printf("  pageable first: %llu staging copies, then %llu direct\n", (unsigned long long)st.staging_copies,
           (unsigned long long)st.direct_copies);
    CHECK(st.staging_copies > 0 && st.direct_copies > 0);
    CHECK(st.staging_copies + st.direct_copies == st.copies);
    CHECK(st.staging_copies >= 2 && st.staging_copies <= 8); /* what was assembled before: the ring's depth at most */
    CHECK(st.host_pinned == 1 && d_counter("h2d_pageable") == 0);
    CHECK(d_counter("registers") == (long long)st.engine_buffers_locked + 1); /* + the staging, once */
    tf_device_loader_free(t.d);
    t.d = NULL;
    /* after the device loader, the plain loader goes on exactly, in ordinary memory */
    CHECK_OK(tf_loader_next(t.l, &hb));
    tf_batch_view hv;
    tf_batch_get_view(hb, &hv);
    CHECK(hv.position == (uint64_t)N * S_B);
    tf_batch_release(hb);
    flat_free(cpu, N);
    flat_free(dev, N);
    stage_close(&t);
    return T_DONE();
}

/* Position counts what the consumer received; seek with copies in flight,
 * and resume in a new device loader, continue the exact stream: for whole
 * samples and for context-parallel shares (plain and THD). */
static void stage_resume(stage *t, const stage_cfg *c) {
    enum { N = 60 };
    flat cpu[N];
    CHECK(cpu_stream(t->ds, c, 0, N, cpu) == N);
    tf_device_config dc;
    tf_device_config_init(&dc);
    dc.prefetch = 4;
    for (int cut = 1; cut < N; cut += 13) {
        tf_loader *l = stage_loader(t->ds, c);
        tf_device_loader *d = NULL;
        CHECK_OK(tf_device_loader_create(l, &dc, &d));
        if (!d) break;
        flat got[N];
        int k = 0;
        for (; k < cut && step(d, t->cs, &got[k]) == 0; k++) {
        }
        CHECK(wait_queued(d, 2)); /* copies in flight beyond the position */
        uint64_t saved = tf_device_loader_position(d);
        CHECK(saved == (uint64_t)cut * S_B);
        CHECK(tf_loader_position(l) > saved);
        /* a misaligned position is refused and changes nothing */
        CHECK_RC(tf_device_loader_seek(d, saved + 1), -EINVAL);
        CHECK(tf_device_loader_position(d) == saved);
        /* "checkpoint": the loader is closed with copies in flight */
        tf_device_loader_free(d);
        tf_loader_free(l);
        /* resume */
        l = stage_loader(t->ds, c);
        CHECK_OK(tf_device_loader_create(l, &dc, &d));
        if (!d) break;
        CHECK_OK(tf_device_loader_seek(d, saved));
        int sought = 0;
        for (; k < N; k++) {
            CHECK_OK(step(d, t->cs, &got[k]));
            if (k == cut + 5 && !sought) { /* seek back on a running device loader, copies in flight */
                sought = 1;
                d_drain(t->cs);
                CHECK_OK(tf_device_loader_seek(d, (uint64_t)(cut + 1) * S_B));
                CHECK(tf_device_loader_position(d) == (uint64_t)(cut + 1) * S_B);
                flat_free(&got[cut + 1], k - cut);
                k = cut;
            }
        }
        d_drain(t->cs);
        CHECK(flats_differ(cpu, got, N) == 0);
        flat_free(got, N);
        tf_device_loader_free(d);
        tf_loader_free(l);
    }
    flat_free(cpu, N);
}

/* Each configuration in a process of its own: they start many threads, and
 * ThreadSanitizer's runtime runs out of room for threads long before a
 * process would. */
static int stage_resume_case(const stage_cfg *c) {
    stage t;
    use_double(NULL);
    if (stage_open(&t, "500", &PLAIN, NULL) < 0) return T_EXIT_FAIL;
    tf_device_loader_free(t.d); /* (stage_resume makes its own) */
    t.d = NULL;
    stage_resume(&t, c);
    stage_close(&t);
    return T_DONE();
}

static int case_stage_resume(void) {
    const stage_cfg pos = {TF_WANT_POSITION_IDS, 0, 0, 0};
    return stage_resume_case(&pos);
}
/* (infinite streams; the THD case on CP rank 0) */
static int case_stage_cp_resume(void) {
    const stage_cfg c = {CP_PLAIN.want, 0, 1, 2};
    return stage_resume_case(&c);
}
static int case_stage_thd_resume(void) {
    const stage_cfg c = {CP_THD.want, 0, 0, 2};
    return stage_resume_case(&c);
}

/* Static buffers: every batch lands in the same caller-owned buffers, after
 * the work queued before it on the consumer's stream (so a step held on the
 * GPU still reads its own batch), and after work on a previous stream. */
static int case_stage_static(void) {
    const stage_cfg c = {TF_WANT_POSITION_IDS | TF_WANT_LOSS_MASK, 0, 0, 0};
    use_double(NULL);
    setenv("CUDA_DOUBLE_COPY_US", "100", 1);
    if (bind_double() < 0) return T_EXIT_FAIL;
    enum { N = 24 };
    flat cpu[N];
    stage t = {stage_dataset(), NULL, NULL, NULL};
    if (!t.ds || !(t.l = stage_loader(t.ds, &c))) return T_EXIT_FAIL;
    CHECK(cpu_stream(t.ds, &c, 0, N, cpu) == N);
    void *cs2 = NULL;
    CHECK(d_stream_create(&t.cs, 1) == 0 && d_stream_create(&cs2, 1) == 0);
    tf_device_static sb;
    memset(&sb, 0, sizeof sb);
    sb.tokens_bytes = S_B * (S_L + 1) * 4;
    sb.position_ids_bytes = S_B * S_L * 4;
    sb.loss_mask_bytes = S_B * S_L - 1; /* one byte short */
    CHECK(d_malloc(&sb.tokens, sb.tokens_bytes) == 0);
    CHECK(d_malloc((void **)&sb.position_ids, sb.position_ids_bytes) == 0);
    CHECK(d_malloc((void **)&sb.loss_mask, S_B * S_L) == 0);
    tf_device_config dc;
    tf_device_config_init(&dc);
    dc.static_buffers = &sb;
    dc.slots = 8; /* the stream is held for PAUSED steps below: slots come back only as it runs */
    tf_device_batch *b = NULL;
    CHECK_OK(tf_device_loader_create(t.l, &dc, &t.d));
    CHECK_RC(tf_device_loader_next(t.d, TF_DEVICE_STREAM_NONE, &b), -EINVAL); /* needs a stream */
    CHECK_RC(tf_device_loader_next(t.d, (uintptr_t)t.cs, &b), -EINVAL);
    CONTAINS(tf_last_error(), "loss_mask needs a device buffer of 256 bytes");
    tf_device_loader_free(t.d);
    sb.loss_mask_bytes = S_B * S_L;
    CHECK_OK(tf_device_loader_create(t.l, &dc, &t.d));
    if (!t.d) return T_DONE();

    /* The consumer's stream is busy: steps are queued, none has run. */
    enum { PAUSED = 6 };
    flat got[N];
    d_pause(t.cs, 1);
    for (int k = 0; k < PAUSED; k++) {
        CHECK_OK(tf_device_loader_next(t.d, (uintptr_t)t.cs, &b));
        if (!b) break;
        tf_device_batch_view v;
        tf_device_batch_get_view(b, &v);
        CHECK(v.tokens == sb.tokens && v.position_ids == sb.position_ids && v.loss_mask == sb.loss_mask);
        CHECK(v.cu_seqlens == NULL && v.position == (uint64_t)k * S_B);
        got[k] = flat_dev_enqueue(&v, t.cs); /* the step reads the static buffers */
        CHECK_OK(tf_device_batch_release(b, (uintptr_t)t.cs));
    }
    d_pause(t.cs, 0);
    d_drain(t.cs);
    /* Alternate streams. Step k on one stream is held (paused, not run)
     * when step k + 1 is queued on the other: the other stream must wait
     * for it before its copy into the static buffers runs. */
    int (*d_pending)(void *) = NULL;
    void *h = dlopen(double_path, RTLD_NOW | RTLD_NOLOAD);
    if (h) *(void **)&d_pending = dlsym(h, "cuda_double_stream_pending");
    CHECK(d_pending != NULL);
    for (int k = PAUSED; k + 1 < N && d_pending; k += 2) {
        void *s1 = (k / 2) % 2 ? cs2 : t.cs, *s2 = s1 == t.cs ? cs2 : t.cs;
        d_drain(t.cs);
        d_drain(cs2);
        d_pause(s1, 1);
        d_pause(s2, 1);
        CHECK_OK(step(t.d, s1, &got[k]));
        CHECK_OK(step(t.d, s2, &got[k + 1]));
        /* s2 runs up to its wait on s1's step and stays there: its copies
         * into the static buffers, reads and release (9 operations after
         * the wait) have not run. Without that wait they would, and step k
         * on s1 would read batch k + 1. */
        d_pause(s2, 0);
        usleep(20 * 1000);
        CHECK(d_pending(s2) >= 10);
        d_pause(s1, 0);
    }
    d_drain(t.cs);
    d_drain(cs2);
    CHECK(flats_differ(cpu, got, N) == 0);
    tf_device_stats st;
    tf_device_loader_get_stats(t.d, &st);
    CHECK(st.static_buffers == 1 && st.batches == N && st.held == 0);
    CHECK(d_counter("d2d") == 3 * N); /* tokens, position_ids, loss_mask per batch */
    flat_free(cpu, N);
    flat_free(got, N);
    tf_device_loader_free(t.d);
    t.d = NULL;
    d_free(sb.tokens);
    d_free(sb.position_ids);
    d_free(sb.loss_mask);
    d_stream_destroy(cs2);
    stage_close(&t);
    return T_DONE();
}

/* Static buffers the device loader allocates itself (alloc_static), for a
 * context-parallel rank in the THD layout, whose arrays' lengths change from
 * batch to batch: every batch is in the same buffers (room for the largest),
 * filling a prefix, with the counts on the host; steps queued on a busy
 * stream each read their own batch; a loader whose caller-owned buffers miss
 * an array is told which and how large. */
static int case_stage_static_own(void) {
    enum { N = 30, PAUSED = 5 };
    flat cpu[N], got[N];
    tf_device_config dc;
    tf_device_config_init(&dc);
    tf_device_static none;
    memset(&none, 0, sizeof none);
    dc.static_buffers = &none;
    stage t;
    use_double(NULL);
    if (stage_open(&t, "100", &CP_THD, &dc) < 0) return T_EXIT_FAIL;
    tf_device_batch *b = NULL;
    CHECK_RC(tf_device_loader_next(t.d, (uintptr_t)t.cs, &b), -EINVAL);
    CONTAINS(tf_last_error(), "position_ids needs a device buffer of 2048 bytes"); /* 2 N x 4 */
    CONTAINS(tf_last_error(), "THD");
    tf_device_loader_free(t.d);
    dc.static_buffers = NULL;
    dc.alloc_static = 1;
    dc.slots = PAUSED + 3;
    CHECK_OK(tf_device_loader_create(t.l, &dc, &t.d));
    if (!t.d) return T_DONE();
    CHECK(cpu_stream(t.ds, &CP_THD, 0, N, cpu) == N);
    tf_device_batch_view first;
    memset(&first, 0, sizeof first);
    long long d2d = 0;
    for (int k = 0; k < N; k++) {
        if (k == 0) d_pause(t.cs, 1); /* the first steps queue up behind a busy stream */
        if (k == PAUSED) {
            d_pause(t.cs, 0);
            d_drain(t.cs);
        }
        CHECK_OK(tf_device_loader_next(t.d, (uintptr_t)t.cs, &b));
        if (!b) break;
        tf_device_batch_view v;
        tf_device_batch_get_view(b, &v);
        if (k == 0) first = v;
        CHECK(v.thd == 1 && v.cp_size == 2 && !v.tokens && !v.num_seqs);
        CHECK(v.input_ids == first.input_ids && v.labels == first.labels && v.position_ids == first.position_ids &&
              v.loss_mask == first.loss_mask && v.cu_seqlens == first.cu_seqlens &&
              v.cu_seqlens_padded == first.cu_seqlens_padded && v.ready_event == first.ready_event);
        got[k] = flat_dev_enqueue(&v, t.cs);
        arrays a;
        dev_arrays(&v, &a);
        for (int j = 0; j < NARR; j++) d2d += a.n[j] > 0;
        CHECK_OK(tf_device_batch_release(b, (uintptr_t)t.cs));
    }
    d_drain(t.cs);
    CHECK(flats_differ(cpu, got, N) == 0);
    tf_device_stats st;
    tf_device_loader_get_stats(t.d, &st);
    CHECK(st.static_buffers == 1 && st.batches == N && st.held == 0);
    CHECK(d_counter("d2d") == d2d); /* one device-to-device copy per array, its filled part */
    flat_free(cpu, N);
    flat_free(got, N);
    stage_close(&t); /* the buffers went with the device loader */
    return T_DONE();
}

/* A consumer that holds every slot gets -EBUSY, not a hang; releasing one
 * lets it go on. */
static int case_stage_held(void) {
    tf_device_config dc;
    tf_device_config_init(&dc);
    dc.prefetch = 2;
    dc.slots = 3;
    stage t;
    use_double(NULL);
    if (stage_open(&t, NULL, &PLAIN, &dc) < 0) return T_EXIT_FAIL;
    tf_device_loader *d2 = NULL;
    dc.slots = 2;
    CHECK_RC(tf_device_loader_create(t.l, &dc, &d2), -EINVAL);
    CONTAINS(tf_last_error(), "device slots");
    tf_device_batch *b[4] = {NULL};
    for (int i = 0; i < 3; i++) CHECK_OK(tf_device_loader_next(t.d, 1, &b[i]));
    CHECK_RC(tf_device_loader_next(t.d, 1, &b[3]), -EBUSY);
    CONTAINS(tf_last_error(), "held by the consumer");
    CHECK(tf_device_loader_position(t.d) == 3 * S_B);
    CHECK_OK(tf_device_batch_release(b[0], 1));
    CHECK_OK(tf_device_loader_next(t.d, 1, &b[3]));
    tf_device_batch_view v;
    tf_device_batch_get_view(b[3], &v);
    CHECK(v.position == 3 * S_B);
    /* Batches outlive the device loader and the loader. */
    tf_device_loader_free(t.d);
    tf_loader_free(t.l);
    t.d = NULL;
    t.l = NULL;
    CHECK(d_counter("live_allocs") == 3);
    for (int i = 1; i < 4; i++) CHECK_OK(tf_device_batch_release(b[i], 1));
    stage_close(&t);
    CHECK(d_counter("live_streams") == 0);
    return T_DONE();
}

/* CUDA failing mid-run: the error comes in order, the position does not
 * move, and everything is given back. GPU out of memory at the first batch.
 * No CUDA at all: a clear error at create. */
static int case_stage_errors(void) {
    stage t;
    use_double("memcpy_after=5");
    if (stage_open(&t, NULL, &PLAIN, NULL) < 0) return T_EXIT_FAIL;
    tf_device_batch *b = NULL;
    int k = 0, rc = 0;
    for (; k < 10 && (rc = tf_device_loader_next(t.d, 1, &b)) == 0; k++) CHECK_OK(tf_device_batch_release(b, 1));
    CHECK(k == 5);
    CHECK_RC(rc, -TF_ECUDA);
    CONTAINS(tf_last_error(), "cudaMemcpyAsync");
    CHECK(tf_device_loader_position(t.d) == 5 * S_B);
    CHECK_RC(tf_device_loader_next(t.d, 1, &b), -TF_ECUDA); /* retried: still failing */
    CHECK(tf_device_loader_position(t.d) == 5 * S_B);
    tf_device_loader_free(t.d);
    t.d = NULL;
    CHECK(tf_loader_position(t.l) == 5 * S_B); /* the loader goes on from the consumer's position */
    tf_batch *hb = NULL;
    CHECK_OK(tf_loader_next(t.l, &hb));
    tf_batch_view hv;
    tf_batch_get_view(hb, &hv);
    CHECK(hv.position == 5 * S_B);
    tf_batch_release(hb);
    stage_close(&t);
    return T_DONE();
}

static int case_stage_oom(void) {
    stage t;
    use_double(NULL);
    setenv("CUDA_DOUBLE_MEM", "2000", 1);
    if (stage_open(&t, NULL, &PLAIN, NULL) < 0) return T_EXIT_FAIL;
    tf_device_batch *b = NULL;
    CHECK_RC(tf_device_loader_next(t.d, 1, &b), -ENOMEM);
    CONTAINS(tf_last_error(), "out of memory");
    CONTAINS(tf_last_error(), "lower batch_size");
    CHECK(tf_device_loader_position(t.d) == 0);
    stage_close(&t);
    CHECK(d_counter("live_events") == 0);
    return T_DONE();
}

static int case_stage_no_cuda(void) {
    setenv("TOKENFEED_CUDART", "/nonexistent/libcudart.so.12", 1);
    tf_dataset *ds = stage_dataset();
    tf_loader *l = ds ? stage_loader(ds, &PLAIN) : NULL;
    if (!l) return T_EXIT_FAIL;
    tf_device_loader *d = NULL;
    CHECK_RC(tf_device_loader_create(l, NULL, &d), -TF_ECUDA);
    CONTAINS(tf_last_error(), "CUDA is not available");
    CHECK(d == NULL);
    tf_device_loader_free(NULL);
    tf_loader_free(l);
    tf_dataset_free(ds);
    return T_DONE();
}

static int case_stage_bad_device(void) {
    use_double(NULL);
    setenv("CUDA_DOUBLE_DEVICES", "2", 1);
    tf_dataset *ds = stage_dataset();
    tf_loader *l = ds ? stage_loader(ds, &PLAIN) : NULL;
    if (!l) return T_EXIT_FAIL;
    tf_device_config dc;
    tf_device_config_init(&dc);
    dc.device = 2;
    tf_device_loader *d = NULL;
    CHECK_RC(tf_device_loader_create(l, &dc, &d), -EINVAL);
    CONTAINS(tf_last_error(), "device index 2 is out of range");
    dc.device = 1;
    dc.prefetch = 300;
    CHECK_RC(tf_device_loader_create(l, &dc, &d), -EINVAL);
    CONTAINS(tf_last_error(), "device prefetch");
    dc.prefetch = 0;
    CHECK_OK(tf_device_loader_create(l, &dc, &d));
    tf_device_batch *b = NULL;
    if (d) CHECK_OK(tf_device_loader_next(d, 1, &b));
    tf_device_batch_view v;
    tf_device_batch_get_view(b, &v);
    CHECK(v.device == 1);
    /* host-side check of the batch: wait for its copy, read device memory */
    CHECK_OK(tf_device_batch_synchronize(b));
    flat cpu[1] = {{NULL, 0, 0}};
    CHECK(cpu_stream(ds, &PLAIN, 0, 1, cpu) == 1);
    CHECK(!memcmp(v.tokens, cpu[0].p, S_B * (S_L + 1) * 4));
    flat_free(cpu, 1);
    tf_device_stats st;
    tf_device_loader_get_stats(d, &st);
    CHECK(st.prefetch == 2 && st.slots == 4); /* the defaults */
    CHECK_OK(tf_device_batch_release(b, 1));
    tf_device_loader_free(d);
    tf_loader_free(l);
    tf_dataset_free(ds);
    return T_DONE();
}

/* Free with copies queued and in flight (slow DMA), the consumer's stream
 * still busy with a batch: nothing is freed under a reader, all is given
 * back at the end, and nothing synchronised the device. */
static int case_stage_free_in_flight(void) {
    stage t;
    if (stage_open_ahead(&t, "3000", 4) < 0) return T_EXIT_FAIL;
    tf_device_batch *b = NULL;
    CHECK_OK(tf_device_loader_next(t.d, (uintptr_t)t.cs, &b));
    CHECK(wait_queued(t.d, 2));
    d_pause(t.cs, 1);
    tf_device_batch_view v;
    tf_device_batch_get_view(b, &v);
    flat seen = flat_dev_enqueue(&v, t.cs);
    tf_device_loader_free(t.d); /* copies still running on the copy stream, the step not run */
    tf_loader_free(t.l);
    t.d = NULL;
    t.l = NULL;
    CHECK(d_counter("bad_frees") == 0);
    d_pause(t.cs, 0);
    CHECK_OK(tf_device_batch_release(b, (uintptr_t)t.cs)); /* the last reference: frees the ring */
    d_drain(t.cs);
    flat cpu[1] = {{NULL, 0, 0}};
    CHECK(cpu_stream(t.ds, &PLAIN, 0, 1, cpu) == 1);
    CHECK(flat_eq(&seen, &cpu[0]));
    flat_free(cpu, 1);
    flat_free(&seen, 1);
    /* the last release freed the ring after its copies */
    for (int i = 0; i < 1000 && d_counter("live_allocs"); i++) usleep(1000);
    stage_close(&t);
    return T_DONE();
}

/* The C/CUDA trainer of docs/guides/c-api.md (docs/examples/device_train.c,
 * linked against the double as libcudart.so.12, as a trainer links the real
 * runtime): what its steps saw on the GPU is the CPU loader's stream, with
 * and without static buffers, and its resume gives the same batch. */
static char example_path[4096];

static int run_example(const char *ds, const char *steps, const char *mode, char *out, size_t cap) {
    int fd[2];
    if (pipe(fd)) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[1], 1);
        close(fd[0]);
        unsetenv("TOKENFEED_CUDART"); /* it finds the libcudart.so.12 the program is linked with */
        execl(example_path, example_path, ds, steps, mode, (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    size_t n = 0;
    ssize_t r;
    while (n + 1 < cap && (r = read(fd[0], out + n, cap - 1 - n)) > 0) n += (size_t)r;
    out[n] = '\0';
    close(fd[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* A document of 1 to 299 tokens from the mixing state *ctx, which it advances. */
static uint64_t mixed_doc(void *ctx, uint64_t d, uint32_t *buf) {
    uint64_t *x = ctx;
    *x = tf_mix64(*x + 1);
    uint64_t len = 1 + *x % 299;
    for (uint64_t i = 0; i < len; i++) buf[i] = (uint32_t)(tf_mix64(*x ^ i) % 5000);
    return len;
}

static int case_example_trainer(void) {
    if (access(example_path, X_OK)) {
        fprintf(stderr, "%s is not built (make -C csrc builds it)\n", example_path);
        return T_EXIT_FAIL;
    }
    char dir[] = "/tmp/tf_device_example_XXXXXX";
    if (!mkdtemp(dir)) return T_EXIT_FAIL;
    char path[4200];
    snprintf(path, sizeof path, "%s/ds", dir);
    tf_writer_options wo = t_writer_options(TF_UINT16, 5000, 0, 0, 0);
    uint64_t x = 99;
    int wrc = t_write_dataset(path, &wo, 300, mixed_doc, &x);
    CHECK_OK(wrc);
    if (wrc) return T_DONE();

    /* The CPU stream, configured as the example configures its loader. */
    enum { STEPS = 30 };
    tf_dataset *ds = NULL;
    CHECK_OK(tf_dataset_open(path, NULL, &ds));
    tf_loader_config cfg = t_loader_config(64, 4);
    cfg.order.seed = 1234;
    cfg.out_dtype = TF_INT32;
    tf_loader *l = NULL;
    CHECK_OK(tf_loader_create(ds, &cfg, &l));
    uint64_t h = 0xCBF29CE484222325ull;
    for (int k = 0; k < STEPS && l; k++) {
        tf_batch *b = NULL;
        CHECK_OK(tf_loader_next(l, &b));
        tf_batch_view v;
        tf_batch_get_view(b, &v);
        const uint8_t *p = v.tokens;
        for (size_t i = 0; i < v.rows * (v.seq_len + 1) * 4; i++) h = (h ^ p[i]) * 0x100000001B3ull;
        tf_batch_release(b);
    }
    tf_loader_free(l);
    tf_dataset_free(ds);
    char want[128];
    snprintf(want, sizeof want, "batches %d  checksum %016llx  position %d", STEPS, (unsigned long long)h, STEPS * 4);

    const char *modes[2] = {"slots", "static"};
    for (int m = 0; m < 2; m++) {
        char out[4096];
        char steps[16];
        snprintf(steps, sizeof steps, "%d", STEPS);
        int rc = run_example(path, steps, modes[m], out, sizeof out);
        if (rc != 0) fprintf(stderr, "example (%s) exited with %d:\n%s\n", modes[m], rc, out);
        CHECK(rc == 0);
        CONTAINS(out, want);
        CONTAINS(out, "copies issued ahead");
        CONTAINS(out, "resume at position 64: same batch");
    }
    char cmd[4300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
    return T_DONE();
}

/* ---------------------------------------------------------------- driver */

static const char *only; /* argv[1]: run the cases whose name contains it */

static int run_case(const char *name, int (*fn)(void)) {
    if (only && !strstr(name, only)) return 1;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        unsetenv("CUDA_DOUBLE_DEVICES");
        unsetenv("CUDA_DOUBLE_FAIL");
        unsetenv("CUDA_DOUBLE_DELAY_US");
        unsetenv("CUDA_DOUBLE_COPY_US");
        unsetenv("CUDA_DOUBLE_COPY_GBPS");
        unsetenv("CUDA_DOUBLE_MEM");
        alarm(getenv("TEST_ALARM") ? atoi(getenv("TEST_ALARM")) : 120);
        t_failures = 0;
        int rc = fn();
        fflush(stdout);
        fflush(stderr);
        _exit(rc);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    int ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
    printf("  %-22s %s\n", name, ok ? "ok" : "FAILED");
    if (!ok) {
        if (WIFSIGNALED(st)) fprintf(stderr, "%s: killed by signal %d\n", name, WTERMSIG(st));
        t_failures++;
    }
    return ok;
}

int main(int argc, char **argv) {
    only = argc > 1 ? argv[1] : NULL;
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return T_EXIT_SKIP;
    exe[n] = '\0';
    const char *dir = dirname(exe);
    snprintf(double_path, sizeof double_path, "%s/libcudart_double.so", dir);
    snprintf(double_so12, sizeof double_so12, "%s/cuda_double/libcudart.so.12", dir);
    snprintf(example_path, sizeof example_path, "%s/example_device_train", dir);
    /* On a machine with a GPU, tests/gpu/run.sh builds the same trainer linked
     * against the real libcudart and points this at it: the example_trainer case
     * then checks what a real GPU saw against the CPU loader's stream. */
    const char *real = getenv("TF_TEST_EXAMPLE_TRAINER");
    if (real && *real) snprintf(example_path, sizeof example_path, "%s", real);
    if (access(double_path, R_OK) || access(double_so12, R_OK)) {
        fprintf(stderr, "test_device: %s not built (make -C csrc test builds it)\n", double_path);
        return T_EXIT_SKIP;
    }
    run_case("absent", case_absent);
    run_case("search_default", case_search_default);
    run_case("loaded_via_env", case_loaded_via_env);
    run_case("already_loaded", case_already_loaded);
    run_case("no_device", case_no_device);
    run_case("driver", case_driver);
    run_case("bad_index", case_bad_index);
    run_case("oom", case_oom);
    run_case("pageable_fallback", case_pageable_fallback);
    run_case("pinned", case_pinned);
    run_case("roundtrip", case_roundtrip);
    run_case("event_gating", case_event_gating);
    run_case("pipeline", case_pipeline);
    run_case("memcpy_failure", case_memcpy_failure);
    run_case("release_failure", case_release_failure);
    run_case("outlives_owner", case_outlives_owner);
    run_case("stage_ahead", case_stage_ahead);
    run_case("stage_bytes", case_stage_bytes);
    run_case("stage_cp", case_stage_cp);
    run_case("stage_thd", case_stage_thd);
    run_case("stage_pageable_first", case_stage_pageable_first);
    run_case("stage_resume", case_stage_resume);
    run_case("stage_cp_resume", case_stage_cp_resume);
    run_case("stage_thd_resume", case_stage_thd_resume);
    run_case("stage_static", case_stage_static);
    run_case("stage_static_own", case_stage_static_own);
    run_case("stage_held", case_stage_held);
    run_case("stage_errors", case_stage_errors);
    run_case("stage_oom", case_stage_oom);
    run_case("stage_no_cuda", case_stage_no_cuda);
    run_case("stage_bad_device", case_stage_bad_device);
    run_case("stage_free_in_flight", case_stage_free_in_flight);
    run_case("stage_gpu_meter", case_stage_gpu_meter);
    run_case("example_trainer", case_example_trainer);
    return T_DONE();
}
