/* Engine: the threaded loader against a direct tf_order_fill_sample reference,
 * for every backend (mmap, pread, io_uring when usable), thread count and
 * compressed shards; kept batches stay intact; rank slices concatenate to the
 * single-rank stream; seek + continue == uninterrupted; the loader can be
 * freed while batches are held; loaders over one order built by the caller
 * (tf_loader_create_from_order) give the stream of tf_loader_create. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"

static char tmpdir[256];
static char dir_plain[300], dir_zstd[300];

#define SEQ 64
#define VOCAB 50000

static uint64_t rng_state = 0x1234567;
static uint64_t rnd(void) { return t_xorshift(&rng_state); }

/* Documents of random lengths (some empty, some longer than a sample), in
 * shards small enough that samples cross shard boundaries. */
static uint64_t random_doc(void *ctx, uint64_t d, uint32_t *buf) {
    uint64_t n = rnd() % 10 == 0 ? 0 : 1 + rnd() % 300;
    for (uint64_t i = 0; i < n; i++) buf[i] = (uint32_t)(10 + rnd() % (VOCAB - 10));
    return n;
}

static int write_dataset(const char *dir, int zstd) {
    tf_writer_options o = t_writer_options(TF_UINT16, VOCAB, 3000, 256, zstd);
    rng_state = 0x1234567;
    return t_write_dataset(dir, &o, 300, random_doc, NULL);
}

typedef struct spec {
    tf_backend backend;
    int threads, prefetch;
    uint32_t world, rank;
    uint64_t B;
    tf_dtype odt;
    unsigned want;
    uint64_t epochs;
    int64_t sep;
    tf_shuffle shuffle;
} spec;

static spec default_spec(void) {
    spec s = {TF_BACKEND_MMAP, 2, 0, 1, 0, 4, TF_INT64, TF_WANT_POSITION_IDS | TF_WANT_CU_SEQLENS | TF_WANT_LOSS_MASK,
              0, 3, TF_SHUFFLE_FULL};
    return s;
}

static void order_cfg(const spec *s, tf_order_config *oc) {
    tf_order_config_init(oc);
    oc->seq_len = SEQ;
    oc->seed = 42;
    oc->separator_id = s->sep;
    oc->shuffle = s->shuffle;
    oc->block_size = 8;
    oc->window_blocks = 4;
    oc->epochs = s->epochs;
    oc->global_batch = s->B * s->world;
}

static tf_loader *mk(const tf_dataset *ds, const spec *s) {
    tf_loader_config c;
    tf_loader_config_init(&c);
    order_cfg(s, &c.order);
    c.batch_size = s->B;
    c.world_size = s->world;
    c.rank = s->rank;
    c.out_dtype = s->odt;
    c.want = s->want;
    c.num_threads = s->threads;
    c.prefetch = s->prefetch;
    c.backend = s->backend;
    return t_loader_create(ds, &c);
}

/* The order the loader of spec s reads (NULL, counted as a failure, if it cannot be made). */
static tf_order *mk_order(const tf_dataset *ds, const spec *s) {
    tf_order_config oc;
    order_cfg(s, &oc);
    tf_order *o = NULL;
    CHECK_OK(tf_order_create(ds, &oc, &o));
    return o;
}

/* Compare batch b (global position pos) with rows built by tf_order_fill_sample. */
static int check_against_reference(const tf_order *o, const spec *s, tf_batch *b, uint64_t pos) {
    tf_batch_view v;
    tf_batch_get_view(b, &v);
    size_t osz = tf_dtype_size(s->odt);
    int bad = 0;
    if (v.position != pos || v.rows != s->B || v.seq_len != SEQ || v.dtype != s->odt) return 1;
    uint8_t tok[(SEQ + 1) * 8];
    int32_t pid[SEQ], cu[SEQ + 1], ns;
    uint8_t lm[SEQ];
    for (uint64_t j = 0; j < s->B; j++) {
        uint64_t sample = tf_order_sample_at(o, pos + s->rank * s->B + j);
        tf_sample_extras ex = {pid, cu, &ns, lm};
        if (tf_order_fill_sample(o, sample, tok, s->odt, &ex)) {
            fprintf(stderr, "reference sample %llu: %s\n", (unsigned long long)sample, tf_last_error());
            return 1;
        }
        bad |= memcmp(tok, (uint8_t *)v.tokens + j * (SEQ + 1) * osz, (SEQ + 1) * osz) != 0;
        if (s->want & TF_WANT_POSITION_IDS) bad |= memcmp(pid, v.position_ids + j * SEQ, sizeof pid) != 0;
        else bad |= v.position_ids != NULL;
        if (s->want & TF_WANT_CU_SEQLENS) {
            bad |= memcmp(cu, v.cu_seqlens + j * (SEQ + 1), sizeof cu) != 0;
            bad |= v.num_seqs[j] != ns;
        } else {
            bad |= v.cu_seqlens != NULL || v.num_seqs != NULL;
        }
        if (s->want & TF_WANT_LOSS_MASK) bad |= memcmp(lm, v.loss_mask + j * SEQ, sizeof lm) != 0;
        else bad |= v.loss_mask != NULL;
    }
    return bad;
}

/* Run nb batches from a fresh loader and compare each with the reference. */
static void check_stream(const tf_dataset *ds, const spec *s, int nb, const char *what) {
    tf_order *o = mk_order(ds, s);
    tf_loader *l = mk(ds, s);
    if (!l || !o) goto out;
    uint64_t G = s->B * s->world;
    for (int i = 0; i < nb; i++) {
        tf_batch *b = NULL;
        CHECK(tf_loader_position(l) == (uint64_t)i * G);
        int rc = tf_loader_next(l, &b);
        if (rc) {
            fprintf(stderr, "%s: next() at batch %d: %d %s\n", what, i, rc, tf_last_error());
            t_failures++;
            break;
        }
        if (check_against_reference(o, s, b, (uint64_t)i * G)) {
            fprintf(stderr, "%s: batch %d differs from the reference\n", what, i);
            t_failures++;
            tf_batch_release(b);
            break;
        }
        tf_batch_release(b);
    }
    tf_loader_stats st;
    tf_loader_get_stats(l, &st);
    CHECK(st.batches == (uint64_t)nb);
    CHECK(st.tokens == (uint64_t)nb * s->B * (SEQ + 1));
    CHECK(st.ring_slots == (uint64_t)(s->prefetch ? s->prefetch : 2 * s->threads + 2));
    CHECK(st.num_threads == s->threads);
    if (s->backend != TF_BACKEND_IO_URING) CHECK(st.backend == s->backend);
    CHECK(st.bytes_read > 0);
out:
    tf_loader_free(l);
    tf_order_free(o);
}

static int uring_ok(void) { return tf_io_uring_usable(NULL, 0); }

static void test_backends_threads(const tf_dataset *plain, const tf_dataset *zstd) {
    tf_backend bes[] = {TF_BACKEND_MMAP, TF_BACKEND_PREAD, TF_BACKEND_IO_URING};
    int ths[] = {1, 2, 4};
    for (int bi = 0; bi < 3; bi++) {
        if (bes[bi] == TF_BACKEND_IO_URING && !uring_ok()) {
            fprintf(stderr, "io_uring not usable here: skipping its part\n");
            continue;
        }
        for (int ti = 0; ti < 3; ti++) {
            for (int z = 0; z < 2; z++) {
                const tf_dataset *ds = z ? zstd : plain;
                if (!ds) continue;
                spec s = default_spec();
                s.backend = bes[bi];
                s.threads = ths[ti];
                char what[96];
                snprintf(what, sizeof what, "%s %d threads %s int64+extras", tf_backend_name(s.backend), s.threads,
                         z ? "zstd" : "plain");
                check_stream(ds, &s, 60, what);
                /* native dtype, no separator, no extras, block shuffle */
                s.odt = TF_UINT16;
                s.want = 0;
                s.sep = -1;
                s.shuffle = TF_SHUFFLE_BLOCK;
                s.prefetch = 1;
                snprintf(what, sizeof what, "%s %d threads %s uint16", tf_backend_name(s.backend), s.threads,
                         z ? "zstd" : "plain");
                check_stream(ds, &s, 60, what);
            }
        }
    }
    /* io_uring with O_DIRECT (falls back to buffered reads where the file
     * system refuses it; the bytes must be the same either way). */
    if (uring_ok()) {
        spec s = default_spec();
        tf_loader_config c;
        tf_loader_config_init(&c);
        order_cfg(&s, &c.order);
        c.batch_size = s.B;
        c.out_dtype = s.odt;
        c.want = s.want;
        c.num_threads = 2;
        c.backend = TF_BACKEND_IO_URING;
        c.direct_io = 1;
        tf_loader *l = NULL;
        tf_order *o = NULL;
        CHECK_OK(tf_loader_create(plain, &c, &l));
        CHECK_OK(tf_order_create(plain, &c.order, &o));
        for (int i = 0; l && o && i < 40; i++) {
            tf_batch *b = NULL;
            CHECK_OK(tf_loader_next(l, &b));
            if (!b) break;
            if (check_against_reference(o, &s, b, (uint64_t)i * s.B)) {
                fprintf(stderr, "io_uring O_DIRECT: batch %d differs\n", i);
                t_failures++;
            }
            tf_batch_release(b);
        }
        tf_loader_free(l);
        tf_order_free(o);
    }
}

/* A memory dataset has no file: pread / io_uring read it through memory. */
static void test_memory_dataset(void) {
    uint16_t toks[5000];
    uint64_t ends[50];
    for (int i = 0; i < 5000; i++) toks[i] = (uint16_t)(i * 7 % 1000);
    for (int i = 0; i < 50; i++) ends[i] = (uint64_t)(i + 1) * 100;
    tf_dataset *ds = NULL;
    CHECK_OK(tf_dataset_from_memory(toks, 5000, TF_UINT16, ends, 50, 1000, &ds));
    if (!ds) return;
    spec s = default_spec();
    s.backend = TF_BACKEND_PREAD;
    check_stream(ds, &s, 30, "memory pread");
    s.backend = TF_BACKEND_MMAP;
    s.epochs = 1;
    /* finite stream: ends with EOF at position + G > num_positions */
    tf_loader *l = mk(ds, &s);
    tf_order *o = mk_order(ds, &s);
    uint64_t npos = o ? tf_order_num_positions(o) : 0, got = 0;
    tf_batch *b = NULL;
    while (l && tf_loader_next(l, &b) == 0) {
        got += s.B;
        tf_batch_release(b);
        b = NULL;
    }
    CHECK(got == npos / s.B * s.B);
    CHECK_RC(tf_loader_next(l, &b), -TF_EEOF);
    CHECK(b == NULL);
    CHECK(tf_loader_position(l) == got);
    CHECK_OK(tf_loader_seek(l, 0));
    CHECK_OK(tf_loader_next(l, &b));
    tf_batch_release(b);
    tf_loader_free(l);
    tf_order_free(o);
    tf_dataset_free(ds);
}

static void copy_batch(tf_batch *b, uint8_t *out, size_t n) {
    tf_batch_view v;
    tf_batch_get_view(b, &v);
    memcpy(out, v.tokens, n);
}

static void test_kept_batch(const tf_dataset *ds) {
    spec s = default_spec();
    s.threads = 4;
    s.prefetch = 3;
    tf_loader *l = mk(ds, &s);
    if (!l) return;
    size_t n = s.B * (SEQ + 1) * 8;
    uint8_t *keep = malloc(n), *now = malloc(n);
    tf_batch *held = NULL, *held2 = NULL;
    CHECK_OK(tf_loader_next(l, &held));
    copy_batch(held, keep, n);
    for (int i = 0; i < 1000; i++) {
        tf_batch *b = NULL;
        CHECK_OK(tf_loader_next(l, &b));
        if (i == 500) held2 = b; /* hold a second one for a while */
        else tf_batch_release(b);
    }
    copy_batch(held, now, n);
    CHECK(memcmp(keep, now, n) == 0);
    tf_batch_view v;
    tf_batch_get_view(held, &v);
    CHECK(v.position == 0);
    tf_batch_get_view(held2, &v);
    CHECK(v.position == 501 * s.B);
    tf_batch_release(held);
    tf_batch_release(held2);
    free(keep);
    free(now);
    tf_loader_free(l);
}

/* Rank slices for R in {1,2,4,8} with G = 8 concatenate to the R = 1 stream. */
static void test_ranks(const tf_dataset *ds) {
    const int NB = 25, G = 8;
    size_t row = (SEQ + 1) * 8;
    uint8_t *ref = malloc((size_t)NB * G * row), *got = malloc((size_t)NB * G * row);
    for (int R = 1; R <= 8; R *= 2) {
        for (uint32_t r = 0; r < (uint32_t)R; r++) {
            spec s = default_spec();
            s.world = (uint32_t)R;
            s.rank = r;
            s.B = (uint64_t)(G / R);
            s.threads = 1 + (int)r % 3;
            tf_loader *l = mk(ds, &s);
            for (int b = 0; l && b < NB; b++) {
                tf_batch *bt = NULL;
                CHECK_OK(tf_loader_next(l, &bt));
                if (!bt) break;
                tf_batch_view v;
                tf_batch_get_view(bt, &v);
                CHECK(v.position == (uint64_t)b * G);
                memcpy((R == 1 ? ref : got) + ((size_t)b * G + r * s.B) * row, v.tokens, s.B * row);
                tf_batch_release(bt);
            }
            tf_loader_free(l);
        }
        if (R > 1 && memcmp(ref, got, (size_t)NB * G * row) != 0) {
            fprintf(stderr, "rank slices with R=%d do not concatenate to the R=1 stream\n", R);
            t_failures++;
        }
    }
    free(ref);
    free(got);
}

static void test_seek(const tf_dataset *ds) {
    spec s = default_spec();
    s.threads = 3;
    const int NB = 40;
    size_t bb = s.B * (SEQ + 1) * 8;
    uint8_t *ref = malloc(NB * bb), *tmp = malloc(bb);
    tf_loader *l = mk(ds, &s);
    if (!l) return;
    for (int i = 0; i < NB; i++) {
        tf_batch *b = NULL;
        CHECK_OK(tf_loader_next(l, &b));
        if (b) copy_batch(b, ref + i * bb, bb);
        tf_batch_release(b);
    }
    CHECK_RC(tf_loader_seek(l, 3), -EINVAL);
    CHECK(strstr(tf_last_error(), "multiple") != NULL);
    /* seek on a warm loader (prefetched work discarded), and on fresh ones */
    int ks[] = {0, 1, 7, 20, 33, 39};
    for (size_t t = 0; t < sizeof ks / sizeof ks[0]; t++) {
        for (int fresh = 0; fresh < 2; fresh++) {
            tf_loader *m = fresh ? mk(ds, &s) : l;
            if (!m) continue;
            CHECK_OK(tf_loader_seek(m, (uint64_t)ks[t] * s.B));
            CHECK(tf_loader_position(m) == (uint64_t)ks[t] * s.B);
            for (int i = ks[t]; i < NB; i++) {
                tf_batch *b = NULL;
                CHECK_OK(tf_loader_next(m, &b));
                if (!b) break;
                copy_batch(b, tmp, bb);
                tf_batch_release(b);
                if (memcmp(tmp, ref + i * bb, bb) != 0) {
                    fprintf(stderr, "seek(%d) then continue differs at batch %d (fresh=%d)\n", ks[t], i, fresh);
                    t_failures++;
                    break;
                }
                if (i == ks[t] + 2) break; /* a few suffice on the warm loader */
            }
            if (fresh) tf_loader_free(m);
        }
    }
    /* position counts what was delivered, not what was prefetched */
    CHECK_OK(tf_loader_seek(l, 0));
    tf_batch *b = NULL;
    CHECK_OK(tf_loader_next(l, &b));
    usleep(20000); /* let the workers run ahead */
    CHECK(tf_loader_position(l) == s.B);
    tf_batch_release(b);
    tf_loader_free(l);
    free(ref);
    free(tmp);
}

static void test_free_with_batches_out(const tf_dataset *ds) {
    tf_backend bes[] = {TF_BACKEND_MMAP, TF_BACKEND_PREAD};
    for (int bi = 0; bi < 2; bi++) {
        spec s = default_spec();
        s.backend = bes[bi];
        tf_loader *l = mk(ds, &s);
        if (!l) return;
        tf_batch *held[5] = {0};
        for (int i = 0; i < 5; i++) CHECK_OK(tf_loader_next(l, &held[i]));
        tf_batch_release(held[2]);
        held[2] = NULL;
        tf_loader_free(l);
        for (int i = 0; i < 5; i++) {
            if (!held[i]) continue;
            tf_batch_view v;
            tf_batch_get_view(held[i], &v);
            CHECK(v.position == (uint64_t)i * s.B);
            volatile int64_t x = ((int64_t *)v.tokens)[s.B * (SEQ + 1) - 1]; /* still readable */
            (void)x;
            tf_batch_release(held[i]);
        }
    }
}

/* next() in a fork()ed child (a DataLoader worker) restarts the threads there
 * instead of waiting on the parent's, and continues at the same position. */
static void test_fork(const tf_dataset *ds) {
#if defined(__SANITIZE_THREAD__)
    (void)ds; /* TSan refuses to start threads after a multi-threaded fork */
    return;
#endif
    spec s = default_spec();
    s.threads = 2;
    tf_loader *l = mk(ds, &s);
    if (!l) return;
    tf_order *o = mk_order(ds, &s);
    tf_batch *b = NULL;
    for (int i = 0; i < 3; i++) {
        CHECK_OK(tf_loader_next(l, &b));
        tf_batch_release(b);
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        int bad = 0;
        for (int i = 3; i < 10 && !bad; i++) {
            bad |= tf_loader_next(l, &b) != 0;
            bad |= !b || check_against_reference(o, &s, b, (uint64_t)i * s.B);
            tf_batch_release(b);
        }
        bad |= tf_loader_seek(l, 0) != 0 || tf_loader_next(l, &b) != 0;
        bad |= !b || check_against_reference(o, &s, b, 0);
        tf_batch_release(b);
        tf_loader_free(l);
        _exit(bad);
    }
    int st = 0;
    CHECK(pid > 0 && waitpid(pid, &st, 0) == pid);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    /* the parent's loader is unaffected */
    CHECK_OK(tf_loader_next(l, &b));
    CHECK(b && check_against_reference(o, &s, b, 3 * s.B) == 0);
    tf_batch_release(b);
    tf_loader_free(l);
    tf_order_free(o);
}

/* A read error in a worker (a file truncated under a pread loader) comes back
 * from next() for that batch with a message naming the file; the position
 * does not move, and the batch is retried once the file is whole again. */
static void test_worker_error(void) {
    char path[400];
    snprintf(path, sizeof path, "%s/raw.bin", tmpdir);
    enum { N = 20000 };
    uint16_t *toks = malloc(N * sizeof *toks);
    for (int i = 0; i < N; i++) toks[i] = (uint16_t)(i % 5000);
    FILE *fp = fopen(path, "wb");
    if (!fp || fwrite(toks, 2, N, fp) != N) t_failures++;
    if (fp) fclose(fp);
    tf_open_options opt = {.format = TF_FORMAT_RAW, .raw_dtype = TF_UINT16};
    tf_dataset *ds = NULL;
    CHECK_OK(tf_dataset_open(path, &opt, &ds));
    spec s = default_spec();
    s.backend = TF_BACKEND_PREAD;
    s.want = 0;
    s.sep = -1;
    s.shuffle = TF_SHUFFLE_NONE;
    tf_loader *l = ds ? mk(ds, &s) : NULL;
    if (!l) goto out;
    CHECK(truncate(path, 1000) == 0); /* before the first read: every batch past 500 tokens fails */
    tf_batch *b = NULL;
    CHECK_OK(tf_loader_seek(l, 40 * s.B));
    int rc = tf_loader_next(l, &b);
    CHECK(rc == -EIO);
    CHECK(b == NULL);
    CHECK(strstr(tf_last_error(), "raw.bin") != NULL);
    CHECK(tf_loader_position(l) == 40 * s.B);
    fp = fopen(path, "r+b");
    if (!fp || fwrite(toks, 2, N, fp) != N) t_failures++;
    if (fp) fclose(fp);
    CHECK_OK(tf_loader_next(l, &b));
    if (b) {
        tf_batch_view v;
        tf_batch_get_view(b, &v);
        CHECK(v.position == 40 * s.B);
        CHECK(((int64_t *)v.tokens)[0] == (int64_t)toks[40 * s.B * SEQ]);
        tf_batch_release(b);
    }
out:
    tf_loader_free(l);
    tf_dataset_free(ds);
    free(toks);
}

/* 10^4 files under pread: descriptors are opened lazily and cached (at most a
 * quarter of the limit); the files are mapped on demand, under the process's
 * bound. With few descriptors: the same bytes, the reader giving back idle
 * descriptors when an open fails for want of one. (A process with none left
 * at all cannot map a file it has not mapped yet.) */
static void test_many_files(void) {
    enum { NF = 10000, PER = 40 };
    char dir[400];
    snprintf(dir, sizeof dir, "%s/many", tmpdir);
    mkdir(dir, 0755);
    char **paths = calloc(NF, sizeof *paths);
    uint16_t toks[PER];
    for (int i = 0; i < NF; i++) {
        paths[i] = malloc(450);
        snprintf(paths[i], 450, "%s/f%05d.bin", dir, i);
        for (int k = 0; k < PER; k++) toks[k] = (uint16_t)(i * 3 + k);
        FILE *fp = fopen(paths[i], "wb");
        if (!fp || fwrite(toks, 2, PER, fp) != PER) t_failures++;
        if (fp) fclose(fp);
    }
    tf_open_options opt = {.format = TF_FORMAT_RAW, .raw_dtype = TF_UINT16};
    tf_dataset *ds = NULL;
    CHECK_OK(tf_dataset_open_many((const char *const *)paths, NF, &opt, &ds));
    if (ds) {
        spec s = default_spec();
        s.backend = TF_BACKEND_PREAD;
        s.B = 16;
        check_stream(ds, &s, 200, "10^4 files pread");
        /* with few descriptors left: same bytes through the mapping */
        struct rlimit old, low;
        getrlimit(RLIMIT_NOFILE, &old);
        low = old;
        low.rlim_cur = 160;
        CHECK(setrlimit(RLIMIT_NOFILE, &low) == 0);
        check_stream(ds, &s, 100, "10^4 files pread, 160 fds");
        s.backend = TF_BACKEND_IO_URING;
        if (uring_ok()) check_stream(ds, &s, 100, "10^4 files io_uring, 160 fds");
        CHECK(setrlimit(RLIMIT_NOFILE, &old) == 0);
        tf_dataset_free(ds);
    }
    for (int i = 0; i < NF; i++) free(paths[i]);
    free(paths);
}

/* Several loaders borrow one order built once: every rank's stream is the one
 * tf_loader_create gives for the same configuration, and the order outlives
 * (and is not freed by) the loaders. Engine limits are checked here too. */
static void test_from_order(const tf_dataset *ds) {
    const int NB = 12;
    spec s = default_spec();
    s.world = 2;
    s.B = 3;
    tf_order *o = mk_order(ds, &s);
    if (!o) return;
    for (uint32_t r = 0; r < s.world; r++) {
        s.rank = r;
        tf_loader_config c;
        tf_loader_config_init(&c);
        c.order.seq_len = 7; /* not used: the order decides the stream */
        c.batch_size = s.B;
        c.world_size = s.world;
        c.rank = r;
        c.out_dtype = s.odt;
        c.want = s.want;
        c.num_threads = s.threads;
        tf_loader *shared = NULL, *own = mk(ds, &s);
        CHECK_OK(tf_loader_create_from_order(o, &c, &shared));
        for (int i = 0; shared && own && i < NB; i++) {
            tf_batch *a = NULL, *b = NULL;
            CHECK_OK(tf_loader_next(shared, &a));
            CHECK_OK(tf_loader_next(own, &b));
            if (!a || !b) break;
            CHECK(check_against_reference(o, &s, a, (uint64_t)i * s.B * s.world) == 0);
            tf_batch_view va, vb;
            tf_batch_get_view(a, &va);
            tf_batch_get_view(b, &vb);
            CHECK(memcmp(va.tokens, vb.tokens, s.B * (SEQ + 1) * 8) == 0);
            tf_batch_release(a);
            tf_batch_release(b);
        }
        tf_loader_free(shared);
        tf_loader_free(own);
    }
    /* the order is still usable after its loaders are gone */
    CHECK(tf_order_num_samples(o) > 0);
    tf_order_config got;
    CHECK_OK(tf_order_get_config(o, &got));
    CHECK(got.seq_len == SEQ && got.global_batch == s.B * s.world);

    tf_loader_config c;
    tf_loader_config_init(&c);
    c.batch_size = s.B;
    c.world_size = s.world;
    tf_loader *l = NULL;
    c.batch_size = s.B + 1; /* the order's global batch is B x world */
    CHECK_RC(tf_loader_create_from_order(o, &c, &l), -EINVAL);
    CHECK(strstr(tf_last_error(), "global batch") != NULL && l == NULL);
    c.batch_size = s.B;
    c.num_threads = TF_MAX_THREADS + 1;
    CHECK_RC(tf_loader_create_from_order(o, &c, &l), -EINVAL);
    CHECK(strstr(tf_last_error(), "num_threads") != NULL);
    c.num_threads = TF_MAX_THREADS;
    c.prefetch = TF_MAX_PREFETCH + 1;
    CHECK_RC(tf_loader_create_from_order(o, &c, &l), -EINVAL);
    CHECK(strstr(tf_last_error(), "prefetch") != NULL);
    c.prefetch = 0;
    CHECK_RC(tf_loader_create_from_order(NULL, &c, &l), -EINVAL);
    CHECK_OK(tf_loader_create_from_order(o, &c, &l)); /* the largest thread count is accepted */
    tf_loader_stats st;
    tf_loader_get_stats(l, &st);
    CHECK(st.num_threads == TF_MAX_THREADS);
    /* the engine's settings as given, read back by name; the order's in its member */
    tf_loader_config back;
    int64_t v = 0;
    CHECK_OK(tf_loader_get_config(l, &back));
    CHECK(back.num_threads == TF_MAX_THREADS && back.batch_size == s.B && back.world_size == s.world);
    CHECK_OK(tf_config_get(TF_SCOPE_ENGINE, &back, "num_threads", &v));
    CHECK(v == TF_MAX_THREADS);
    CHECK_OK(tf_config_get(TF_SCOPE_ENGINE, &back, "seq_len", &v));
    CHECK(v == SEQ && back.order.global_batch == s.B * s.world);
    CHECK_RC(tf_loader_get_config(l, NULL), -EINVAL);
    CHECK_RC(tf_loader_get_config(NULL, &back), -EINVAL);
    tf_loader_free(l);
    tf_order_free(o);
}

static void test_config_errors(const tf_dataset *ds) {
    tf_loader_config c;
    tf_loader_config_init(&c);
    CHECK(c.batch_size == 8 && c.world_size == 1 && c.rank == 0 && c.backend == TF_BACKEND_AUTO);
    CHECK(c.order.seq_len == 2048);
    c.order.seq_len = SEQ;
    tf_loader *l = NULL;
    c.batch_size = 0;
    CHECK_RC(tf_loader_create(ds, &c, &l), -EINVAL);
    c.batch_size = 2;
    c.world_size = 2;
    c.rank = 2;
    CHECK_RC(tf_loader_create(ds, &c, &l), -EINVAL);
    CHECK(strstr(tf_last_error(), "rank") != NULL);
    c.rank = 0;
    c.world_size = 0;
    CHECK_RC(tf_loader_create(ds, &c, &l), -EINVAL);
    c.world_size = 2;
    c.batch_size = UINT64_MAX / 2 + 1;
    CHECK_RC(tf_loader_create(ds, &c, &l), -EINVAL);
    CHECK(l == NULL);
    c.batch_size = 2;
    setenv("TOKENFEED_BACKEND", "floppy", 1);
    CHECK_RC(tf_loader_create(ds, &c, &l), -EINVAL);
    CHECK(strstr(tf_last_error(), "TOKENFEED_BACKEND") != NULL);
    setenv("TOKENFEED_BACKEND", "pread", 1);
    CHECK_OK(tf_loader_create(ds, &c, &l));
    tf_loader_stats st;
    tf_loader_get_stats(l, &st);
    CHECK(st.backend == TF_BACKEND_PREAD);
    CHECK(st.batches == 0 && st.ring_ready == 0);
    tf_loader_free(l);
    unsetenv("TOKENFEED_BACKEND");
    CHECK_OK(tf_loader_create(ds, &c, &l));
    tf_loader_get_stats(l, &st);
    CHECK(st.backend == TF_BACKEND_MMAP);
    /* timed next: a generous timeout returns a batch */
    tf_batch *b = NULL;
    CHECK_OK(tf_loader_next_timed(l, &b, 5000000000ull));
    tf_batch_release(b);
    tf_loader_free(l);
    tf_loader_free(NULL);
    tf_batch_release(NULL);
    CHECK(strcmp(tf_backend_name(TF_BACKEND_IO_URING), "io_uring") == 0);
    CHECK(strcmp(tf_backend_name(TF_BACKEND_AUTO), "auto") == 0);
}

/* The data-wait meter counts the batches the consumer received, in a window,
 * with waits inside the cycles and timed-out calls folded into one wait; the
 * first batch (the engine's start-up) is reported apart, outside the window. */
static void test_meter(const tf_dataset *ds) {
    spec s = default_spec();
    tf_loader *l = mk(ds, &s);
    if (!l) return;
    tf_meter m;
    tf_loader_get_meter(l, 0, &m);
    CHECK(m.batches == 0 && m.total_batches == 0 && m.wait_fraction == 0.0 && m.startup_seconds == 0.0);
    for (int i = 0; i < 12; i++) {
        tf_batch *b = NULL;
        int rc;
        while ((rc = tf_loader_next_timed(l, &b, 1000)) == -TF_ENOTREADY) {
        }
        CHECK_OK(rc);
        tf_batch_release(b);
        usleep(2000); /* the consumer's work */
    }
    tf_loader_get_meter(l, 5, &m);
    CHECK(m.batches == 5 && m.total_batches == 12);
    CHECK(m.wait_fraction >= 0.0 && m.wait_fraction <= 1.0);
    CHECK(m.window_seconds >= 4 * 0.002 && m.wait_seconds <= m.window_seconds);
    CHECK(m.wait_p50_seconds <= m.wait_p99_seconds && m.wait_p99_seconds <= m.wait_max_seconds);
    CHECK(m.startup_seconds > 0.0);
    tf_loader_get_meter(l, 100000, &m); /* more than recorded: all of them, less the start-up */
    CHECK(m.batches == 11 && m.total_batches == 12);
    tf_loader_get_meter(NULL, 0, &m);
    CHECK(m.batches == 0);
    tf_loader_free(l);
}

/* A finite stream: a seek past its end fails at the seek, and the end-of-stream
 * message counts the epochs asked for (not positions / samples, which rounds
 * down to 0 when the last partial global batch is dropped). */
static void test_finite_end(const tf_dataset *ds) {
    spec s = default_spec();
    s.epochs = 1;
    tf_loader *l = mk(ds, &s);
    if (!l) return;
    tf_order *o = mk_order(ds, &s);
    uint64_t npos = tf_order_num_positions(o);
    CHECK(npos < tf_order_num_samples(o)); /* one epoch, rounded down to whole global batches */
    CHECK_RC(tf_loader_seek(l, npos + s.B), -EINVAL);
    CHECK(strstr(tf_last_error(), "past the end of the stream") != NULL);
    CHECK(tf_loader_position(l) == 0); /* a refused seek changes nothing */
    CHECK_OK(tf_loader_seek(l, npos)); /* the end itself is a position */
    tf_batch *b = NULL;
    CHECK_RC(tf_loader_next(l, &b), -TF_EEOF);
    CHECK(strstr(tf_last_error(), "of 1 epoch(s)") != NULL);
    tf_order_free(o);
    tf_loader_free(l);
}

/* A C trainer's state: saved, then loaded into a fresh loader (seeks there);
 * a changed setting that changes the stream is refused with its name. */
static void test_state(const tf_dataset *ds) {
    spec s = default_spec();
    tf_loader *l = mk(ds, &s), *m = mk(ds, &s);
    if (!l || !m) return;
    tf_batch *b = NULL;
    for (int i = 0; i < 3; i++) {
        CHECK_OK(tf_loader_next(l, &b));
        tf_batch_release(b);
    }
    size_t len = 0;
    CHECK_RC(tf_loader_state_save(l, NULL, 0, &len), -ENOSPC);
    char *text = malloc(len + 1);
    CHECK_OK(tf_loader_state_save(l, text, len + 1, &len));
    CHECK(strlen(text) == len && strstr(text, "\"mix_anchor\": null") != NULL);
    CHECK_OK(tf_loader_state_load(m, text, len, 0));
    CHECK(tf_loader_position(m) == 3 * s.B);
    tf_loader_free(m);
    s.shuffle = TF_SHUFFLE_NONE;
    m = mk(ds, &s);
    if (m) {
        CHECK_RC(tf_loader_state_load(m, text, len, 0), -TF_ESTATE);
        CHECK(strstr(tf_last_error(), "shuffle: saved 'full', now 'none'") != NULL);
        CHECK_OK(tf_loader_state_load(m, text, len, TF_STATE_LENIENT));
        CHECK(tf_loader_position(m) == 3 * s.B);
        CHECK_RC(tf_loader_state_load(m, "{\"position\": 8}", 15, 0), -TF_ESTATE);
        CHECK(strstr(tf_last_error(), "missing format_version") != NULL);
        tf_loader_free(m);
    }
    free(text);
    tf_loader_free(l);
}

/* Skipped ranges and live mixture weights through the C API: a loader over an
 * order with a skipped range continues after it; a state saved before the
 * range skips it on resume; weights set at a position hand over there and the
 * state resumes them on a fresh order built with the first weights. */
static void next_tokens(tf_loader *l, uint64_t *first, uint64_t *pos) {
    tf_batch *b = NULL;
    CHECK_OK(tf_loader_next(l, &b));
    if (!b) return;
    tf_batch_view v;
    tf_batch_get_view(b, &v);
    *first = (uint64_t)((const int64_t *)v.tokens)[0];
    *pos = v.position;
    tf_batch_release(b);
}

static void test_skip_and_live_weights(const tf_dataset *ds) {
    spec s = default_spec();
    tf_order_config oc;
    order_cfg(&s, &oc);
    uint64_t G = (uint64_t)s.B * s.world;
    tf_loader_config c;
    tf_loader_config_init(&c);
    c.batch_size = s.B * s.world;
    c.out_dtype = TF_INT64;
    tf_order *o = NULL;
    CHECK_OK(tf_order_create(ds, &oc, &o));
    if (!o) return;
    CHECK_RC(tf_order_skip(o, 1, 3 * G), -EINVAL);
    CHECK_OK(tf_order_skip(o, 2 * G, 5 * G));
    CHECK_OK(tf_order_skip(o, 5 * G, 6 * G)); /* touches: merges */
    uint64_t r[4];
    CHECK(tf_order_skips(o, r, 2) == 1 && r[0] == 2 * G && r[1] == 6 * G);
    CHECK(tf_order_skip_to(o, 3 * G) == 6 * G && tf_order_skip_to(o, G) == G);
    tf_loader *l = NULL;
    CHECK_OK(tf_loader_create_from_order(o, &c, &l));
    uint64_t first, pos;
    for (int i = 0; l && i < 3; i++) next_tokens(l, &first, &pos);
    CHECK(pos == 6 * G);
    char st[4096];
    size_t len;
    CHECK_OK(tf_order_state_save(o, 2 * G, 1, st, sizeof st, &len));
    CHECK(strstr(st, "\"skipped\": [[") != NULL);
    tf_order *fresh = NULL, *h = NULL;
    CHECK_OK(tf_order_create(ds, &oc, &fresh));
    if (fresh) {
        CHECK_OK(tf_order_state_load(fresh, st, len, 0, &pos, &h));
        CHECK(!h && pos == 2 * G && tf_order_skips(fresh, NULL, 0) == 1 && tf_order_skip_to(fresh, 2 * G) == 6 * G);
    }
    tf_loader_free(l);
    tf_order_free(fresh);
    tf_order_free(o);

    const tf_dataset *two[2] = {ds, ds};
    double w0[2] = {0.5, 0.5}, w1[2] = {0.0, 1.0};
    tf_order *m = NULL, *live = NULL, *m2 = NULL;
    CHECK_OK(tf_order_create_mix(two, w0, 2, &oc, &m));
    if (!m) return;
    CHECK_RC(tf_order_mix_set_weights(m, 1, w1, 2, &live), -EINVAL);
    CHECK_RC(tf_order_mix_set_weights(m, 4 * G, w1, 1, &live), -EINVAL);
    CHECK_OK(tf_order_mix_set_weights(m, 4 * G, w1, 2, &live));
    CHECK_OK(tf_order_create_mix(two, w0, 2, &oc, &m2));
    for (uint64_t p = 4 * G; live && p < 6 * G; p++) {
        size_t src;
        uint64_t idx;
        CHECK_OK(tf_order_mix_source_at(live, p, &src, &idx));
        CHECK(src == 1);
    }
    if (live && m2) {
        CHECK_OK(tf_order_state_save(live, 6 * G, 1, st, sizeof st, &len));
        CHECK(strstr(st, "\"weights_history\": [[") != NULL);
        CHECK_OK(tf_order_state_load(m2, st, len, 0, &pos, &h));
        CHECK(h != NULL && pos == 6 * G);
        for (uint64_t p = 6 * G; h && p < 8 * G; p++)
            CHECK(tf_order_sample_at(h, p) == tf_order_sample_at(live, p));
        tf_order_free(h);
    }
    tf_order_free(live);
    tf_order_free(m2);
    tf_order_free(m);
}

int main(void) {
    if (t_mkdtemp(tmpdir, sizeof tmpdir, "tf_engine")) return T_EXIT_FAIL;
    snprintf(dir_plain, sizeof dir_plain, "%s/plain", tmpdir);
    snprintf(dir_zstd, sizeof dir_zstd, "%s/zstd", tmpdir);
    tf_dataset *plain = NULL, *zstd = NULL;
    CHECK_OK(write_dataset(dir_plain, 0));
    CHECK_OK(tf_dataset_open(dir_plain, NULL, &plain));
    if (tf_features() & TF_FEATURE_ZSTD) {
        CHECK_OK(write_dataset(dir_zstd, 1));
        CHECK_OK(tf_dataset_open(dir_zstd, NULL, &zstd));
    } else {
        fprintf(stderr, "zstd not compiled in: skipping compressed datasets\n");
    }
    if (plain) {
        tf_dataset_info info;
        tf_dataset_get_info(plain, &info);
        CHECK(info.num_files > 3);
        test_config_errors(plain);
        test_from_order(plain);
        test_backends_threads(plain, zstd);
        test_memory_dataset();
        test_kept_batch(plain);
        test_ranks(plain);
        test_seek(plain);
        test_finite_end(plain);
        test_state(plain);
        test_free_with_batches_out(plain);
        test_fork(plain);
        test_worker_error();
        test_many_files();
        test_meter(plain);
        test_skip_and_live_weights(plain);
    }
    tf_dataset_free(plain);
    tf_dataset_free(zstd);
    t_rm_rf(tmpdir);
    return T_DONE();
}
