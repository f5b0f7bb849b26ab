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
    return d_counter && d_pause && d_read && d_drain && d_stream_create && d_stream_destroy ? 0 : -1;
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

/* ---------------------------------------------------------------- cases */

static int case_absent(void) {
    setenv("TOKENFEED_CUDART", "/nonexistent/libcudart.so.12", 1);
    char why[512];
    CHECK(tf_cuda_available(why, sizeof why) == 0);
    CONTAINS(why, "TOKENFEED_CUDART");
    int n = -1;
    CHECK_RC(tf_cuda_device_count(&n), -TF_ECUDA);
    CHECK(n == 0);
    tf_device_ring *r = NULL;
    CHECK_RC(tf_device_ring_create(0, 4096, 2, &r), -TF_ECUDA);
    CONTAINS(tf_last_error(), "CUDA is not available");
    CHECK(r == NULL);
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
    tf_loader_config cfg;
    tf_loader_config_init(&cfg);
    cfg.order.seq_len = 16;
    cfg.batch_size = 4;
    cfg.order.global_batch = 4;
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
    char why[512];
    CHECK(tf_cuda_available(why, sizeof why) == 0);
    CONTAINS(why, "no CUDA-capable device");
    tf_device_ring *r = NULL;
    CHECK_RC(tf_device_ring_create(0, 4096, 2, &r), -TF_ECUDA);
    CONTAINS(tf_last_error(), "no CUDA device is visible");
    return T_DONE();
}

static int case_driver(void) {
    use_double("driver");
    char why[512];
    CHECK(tf_cuda_available(why, sizeof why) == 0);
    CONTAINS(why, "driver");
    tf_device_ring *r = NULL;
    CHECK_RC(tf_device_ring_create(0, 4096, 2, &r), -TF_ECUDA);
    CONTAINS(tf_last_error(), "cudaGetDeviceCount");
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
    /* everything allocated before the failure was given back */
    CHECK(d_counter("live_allocs") == 0);
    CHECK(d_counter("live_streams") == 0);
    CHECK(d_counter("live_registered") == 0);
    CHECK(d_counter("live_events") == 0);
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

/* Two segments round trip through a consumer stream. */
static int case_roundtrip(void) {
    use_double(NULL);
    if (bind_double() < 0) return T_EXIT_FAIL;
    void *cs = NULL;
    CHECK(d_stream_create(&cs, 1) == 0);
    tf_device_ring *r = NULL;
    CHECK_OK(tf_device_ring_create(0, 2000, 2, &r));
    if (!r) return T_DONE();
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
    CHECK(d_counter("device_syncs") == 0 && d_counter("stream_syncs") == 0);
    CHECK(d_counter("live_allocs") == 0);
    CHECK(d_counter("live_registered") == 0);
    CHECK(d_counter("live_streams") == 0);
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
    use_double(NULL);
    if (bind_double() < 0) return T_EXIT_FAIL;
    void *cs = NULL;
    CHECK(d_stream_create(&cs, 1) == 0);
    tf_device_ring *r = NULL;
    CHECK_OK(tf_device_ring_create(0, 4096, 2, &r));
    if (!r) return T_DONE();
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
    CHECK(d_counter("device_syncs") == 0);
    CHECK(d_counter("stream_syncs") == 0);
    CHECK(d_counter("bad_frees") == 0);
    CHECK(d_counter("live_allocs") == 0);
    return T_DONE();
}

/* Many batches through 3 slots with slow "hardware": every consumer read sees
 * its own batch, and nothing synchronises the device. */
static int case_pipeline(void) {
    use_double(NULL);
    setenv("CUDA_DOUBLE_DELAY_US", "100", 1);
    if (bind_double() < 0) return T_EXIT_FAIL;
    void *cs = NULL;
    CHECK(d_stream_create(&cs, 1) == 0);
    tf_device_ring *r = NULL;
    enum { N = 200, SZ = 512 };
    CHECK_OK(tf_device_ring_create(0, SZ, 3, &r));
    if (!r) return T_DONE();
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
    CHECK(d_counter("device_syncs") == 0 && d_counter("stream_syncs") == 0);
    CHECK(d_counter("registers") == 1);                  /* staging registered once, not per batch */
    CHECK(d_counter("mallocs") == 3);                    /* device slots allocated once */
    printf("  pipeline: %d batches, %u release waits, %lld event queries, %lld event syncs\n", N,
           (unsigned)info.release_waits, d_counter("event_queries"), d_counter("event_syncs"));
    tf_device_ring_free(r);
    d_stream_destroy(cs);
    CHECK(d_counter("live_allocs") == 0);
    return T_DONE();
}

static int case_memcpy_failure(void) {
    use_double("memcpy_after=3");
    if (bind_double() < 0) return T_EXIT_FAIL;
    tf_device_ring *r = NULL;
    CHECK_OK(tf_device_ring_create(0, 256, 2, &r));
    if (!r) return T_DONE();
    uint8_t src[256] = {1};
    tf_device_seg seg = {src, sizeof src};
    tf_device_slot *s = NULL;
    for (int i = 0; i < 3; i++) {
        CHECK_OK(tf_device_ring_upload(r, &seg, 1, 1, &s));
        if (s) CHECK_OK(tf_device_slot_release(s, TF_DEVICE_STREAM_NONE));
    }
    CHECK_RC(tf_device_ring_upload(r, &seg, 1, 1, &s), -TF_ECUDA);
    CONTAINS(tf_last_error(), "cudaMemcpyAsync");
    CONTAINS(tf_last_error(), "invalid argument");
    CHECK(s == NULL);
    tf_device_ring_info info;
    tf_device_ring_get_info(r, &info);
    CHECK(info.in_use == 0 && info.lost == 0); /* the slot went back */
    tf_device_ring_free(r);
    CHECK(d_counter("live_allocs") == 0);
    return T_DONE();
}

static int case_release_failure(void) {
    use_double("record_after=1"); /* the copy's event records, the release's does not */
    if (bind_double() < 0) return T_EXIT_FAIL;
    tf_device_ring *r = NULL;
    CHECK_OK(tf_device_ring_create(0, 256, 2, &r));
    if (!r) return T_DONE();
    uint8_t src[256] = {1};
    tf_device_seg seg = {src, sizeof src};
    tf_device_slot *s = NULL;
    CHECK_OK(tf_device_ring_upload(r, &seg, 1, 1, &s));
    /* (with event records failing, teardown cannot wait for the copy itself) */
    if (s) CHECK_OK(tf_device_slot_synchronize(s));
    CHECK_RC(tf_device_slot_release(s, 1), -TF_ECUDA);
    CONTAINS(tf_last_error(), "withdrawn");
    tf_device_ring_info info;
    tf_device_ring_get_info(r, &info);
    CHECK(info.lost == 1 && info.in_use == 0 && info.free_slots == 1);
    tf_device_ring_free(r);
    CHECK(d_counter("live_allocs") == 1); /* the withdrawn slot is never freed under a reader */
    return T_DONE();
}

static int case_outlives_owner(void) {
    use_double(NULL);
    if (bind_double() < 0) return T_EXIT_FAIL;
    tf_device_ring *r = NULL;
    CHECK_OK(tf_device_ring_create(0, 256, 2, &r));
    if (!r) return T_DONE();
    uint8_t src[256];
    fill(src, sizeof src, 5);
    tf_device_seg seg = {src, sizeof src};
    tf_device_slot *s = NULL;
    CHECK_OK(tf_device_ring_upload(r, &seg, 1, 1, &s));
    tf_device_ring_free(r); /* loader closed while a tensor is alive */
    CHECK(d_counter("live_allocs") == 2);
    if (s) {
        CHECK_OK(tf_device_slot_synchronize(s));
        CHECK(!memcmp(tf_device_slot_ptr(s), src, sizeof src));
        CHECK_OK(tf_device_slot_release(s, 1));
    }
    CHECK(d_counter("live_allocs") == 0);
    CHECK(d_counter("live_registered") == 0);
    return T_DONE();
}

/* ---------------------------------------------------------------- driver */

static int run_case(const char *name, int (*fn)(void)) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        unsetenv("CUDA_DOUBLE_DEVICES");
        unsetenv("CUDA_DOUBLE_FAIL");
        unsetenv("CUDA_DOUBLE_DELAY_US");
        alarm(60);
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

int main(void) {
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return T_EXIT_SKIP;
    exe[n] = '\0';
    const char *dir = dirname(exe);
    snprintf(double_path, sizeof double_path, "%s/libcudart_double.so", dir);
    snprintf(double_so12, sizeof double_so12, "%s/cuda_double/libcudart.so.12", dir);
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
    return T_DONE();
}
