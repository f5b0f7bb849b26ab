/* Stress test of the batch engine for ThreadSanitizer (make -C csrc
 * SANITIZE=thread test-stress): many workers, tiny rings, random seeks,
 * random holds, releases from another thread (also after the loader is
 * gone), a thread polling stats and position, loaders freed with batches
 * out, and zstd data read through the workers' shared block cache at sizes
 * from one entry up. Every delivered batch is checked against
 * tf_order_fill_sample. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include "helpers.h"

#define SEQ 32
#define MAXQ 64

static uint64_t rs = 88172645463325252ull;
static uint64_t rnd(void) { return t_xorshift(&rs); }

/* Batches handed to the releaser thread. */
static pthread_mutex_t qmu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t qcv = PTHREAD_COND_INITIALIZER;
static tf_batch *q[MAXQ];
static int qn, qdone;

static void hand_off(tf_batch *b) {
    pthread_mutex_lock(&qmu);
    while (qn == MAXQ) {
        pthread_mutex_unlock(&qmu);
        usleep(100);
        pthread_mutex_lock(&qmu);
    }
    q[qn++] = b;
    pthread_cond_signal(&qcv);
    pthread_mutex_unlock(&qmu);
}

static void *releaser(void *arg) {
    (void)arg;
    uint64_t r = 12345;
    pthread_mutex_lock(&qmu);
    for (;;) {
        while (!qn && !qdone) pthread_cond_wait(&qcv, &qmu);
        if (!qn && qdone) break;
        tf_batch *b = q[--qn];
        pthread_mutex_unlock(&qmu);
        r = r * 6364136223846793005ull + 1;
        if ((r >> 33) % 4 == 0) usleep((unsigned)((r >> 40) % 200));
        tf_batch_view v;
        tf_batch_get_view(b, &v);
        volatile uint8_t x = ((uint8_t *)v.tokens)[0]; /* the buffer is still ours */
        (void)x;
        tf_batch_release(b);
        pthread_mutex_lock(&qmu);
    }
    pthread_mutex_unlock(&qmu);
    return NULL;
}

typedef struct poller_arg {
    tf_loader *l;
    _Atomic int stop;
} poller_arg;

static void *poller(void *arg) {
    poller_arg *p = arg;
    while (!atomic_load(&p->stop)) {
        tf_loader_stats st;
        tf_loader_get_stats(p->l, &st);
        if (st.zstd_cache_allocated > st.zstd_cache_bytes) {
            fprintf(stderr, "zstd cache allocated %llu > capacity %llu\n", (unsigned long long)st.zstd_cache_allocated,
                    (unsigned long long)st.zstd_cache_bytes);
            t_failures++;
        }
        if (st.ring_ready > st.ring_slots) {
            fprintf(stderr, "ring_ready %llu > ring_slots %llu\n", (unsigned long long)st.ring_ready,
                    (unsigned long long)st.ring_slots);
            t_failures++;
        }
        (void)tf_loader_position(p->l);
        usleep(50);
    }
    return NULL;
}

static int write_dataset(const char *dir, int zstd) {
    tf_writer_options o;
    tf_writer_options_init(&o);
    o.vocab_size = 30000;
    o.shard_tokens = 2000;
    o.block_tokens = 128;
    o.compression = zstd ? TF_COMPRESS_ZSTD : TF_COMPRESS_NONE;
    tf_writer *w = NULL;
    int rc = tf_writer_create(dir, &o, &w);
    uint16_t buf[200];
    uint64_t r = 7;
    for (int d = 0; d < 200 && !rc; d++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        uint64_t n = (r >> 33) % 150;
        for (uint64_t i = 0; i < n; i++) buf[i] = (uint16_t)((r >> 20) + i * 31) % 30000;
        rc = tf_writer_add_document(w, buf, n, TF_UINT16);
    }
    if (!rc) rc = tf_writer_finish(w);
    tf_writer_free(w);
    return rc;
}

static int check(const tf_order *o, tf_batch *b, uint64_t B, uint32_t rank, uint64_t pos) {
    tf_batch_view v;
    tf_batch_get_view(b, &v);
    if (v.position != pos) return 1;
    int32_t tok[SEQ + 1];
    for (uint64_t j = 0; j < B; j++) {
        if (tf_order_fill_sample(o, tf_order_sample_at(o, pos + rank * B + j), tok, TF_INT32, NULL)) return 1;
        if (memcmp(tok, (int32_t *)v.tokens + j * (SEQ + 1), sizeof tok)) return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    /* stress_engine [rounds [seed]]: the seed makes a failing run repeatable */
    int rounds = argc > 1 ? atoi(argv[1]) : 24;
    if (argc > 2) rs = strtoull(argv[2], NULL, 0) | 1;
    char tmp[256], dp[300], dz[300];
    if (t_mkdtemp(tmp, sizeof tmp, "tf_stress")) return T_EXIT_FAIL;
    snprintf(dp, sizeof dp, "%s/plain", tmp);
    snprintf(dz, sizeof dz, "%s/zstd", tmp);
    tf_dataset *ds[2] = {NULL, NULL};
    CHECK_OK(write_dataset(dp, 0));
    CHECK_OK(tf_dataset_open(dp, NULL, &ds[0]));
    if (tf_features() & TF_FEATURE_ZSTD) {
        CHECK_OK(write_dataset(dz, 1));
        CHECK_OK(tf_dataset_open(dz, NULL, &ds[1]));
    }
    int uring = tf_io_uring_usable(NULL, 0);
    pthread_t rel;
    pthread_create(&rel, NULL, releaser, NULL);
    uint64_t delivered = 0;

    for (int round = 0; round < rounds && ds[0] && !t_failures; round++) {
        const tf_dataset *d = ds[1] && rnd() % 2 == 0 ? ds[1] : ds[0];
        tf_loader_config c;
        tf_loader_config_init(&c);
        c.order.seq_len = SEQ;
        c.order.seed = rnd();
        c.order.separator_id = rnd() % 2 ? 1 : -1;
        c.order.shuffle = (tf_shuffle)(rnd() % 3);
        c.order.block_size = 4;
        c.order.window_blocks = 3;
        c.order.epochs = rnd() % 4 == 0 ? 1 : 0;
        c.world_size = (uint32_t)(1 + rnd() % 2);
        c.rank = (uint32_t)(rnd() % c.world_size);
        c.batch_size = 1 + rnd() % 4;
        c.out_dtype = TF_INT32;
        c.num_threads = 1 + (int)(rnd() % 8);
        c.prefetch = 1 + (int)(rnd() % 3);
        int be = (int)(rnd() % 3);
        c.backend = be == 0 ? TF_BACKEND_MMAP : be == 1 || !uring ? TF_BACKEND_PREAD : TF_BACKEND_IO_URING;
        /* zstd: the shared block cache sized from the window, a few entries
         * (constant eviction while other workers wait for or read blocks),
         * or one entry (workers decoding privately). Blocks are 256 bytes. */
        int zc = (int)(rnd() % 3);
        c.zstd_cache_bytes = zc == 0 ? 0 : zc == 1 ? 1 : (1 + rnd() % 6) * 256;
        tf_loader *l = NULL;
        CHECK_OK(tf_loader_create(d, &c, &l));
        tf_order_config oc = c.order;
        oc.global_batch = c.batch_size * c.world_size;
        tf_order *o = NULL;
        CHECK_OK(tf_order_create(d, &oc, &o));
        if (!l || !o) break;
        uint64_t G = oc.global_batch, npos = tf_order_num_positions(o);
        uint64_t N = tf_order_num_samples(o);
        poller_arg pa = {l, 0};
        pthread_t pt;
        pthread_create(&pt, NULL, poller, &pa);
        tf_batch *held[16] = {0};
        uint64_t expect = 0;
        for (int op = 0; op < 400 && !t_failures; op++) {
            uint64_t r = rnd() % 100;
            if (r < 8) {
                uint64_t nb = (npos == UINT64_MAX ? 3 * N : npos) / G;
                expect = (nb ? rnd() % (nb + 1) : 0) * G;
                CHECK_OK(tf_loader_seek(l, expect));
                continue;
            }
            tf_batch *b = NULL;
            int rc = tf_loader_next(l, &b);
            if (rc == -TF_EEOF) {
                CHECK(npos != UINT64_MAX && expect + G > npos);
                expect = 0;
                CHECK_OK(tf_loader_seek(l, 0));
                continue;
            }
            CHECK_OK(rc);
            if (!b) break;
            if (check(o, b, c.batch_size, c.rank, expect)) {
                fprintf(stderr, "round %d: batch at %llu differs from the reference\n", round,
                        (unsigned long long)expect);
                t_failures++;
            }
            delivered++;
            expect += G;
            CHECK(tf_loader_position(l) == expect);
            int slot = (int)(rnd() % 16);
            if (r < 40) {
                if (held[slot]) hand_off(held[slot]);
                held[slot] = b;
            } else if (r < 70) {
                hand_off(b);
            } else {
                tf_batch_release(b);
            }
        }
        atomic_store(&pa.stop, 1);
        pthread_join(pt, NULL);
        /* Free the loader with batches out; some are released by the other
         * thread while (or after) it goes away. */
        for (int i = 0; i < 16; i += 2)
            if (held[i]) hand_off(held[i]), held[i] = NULL;
        tf_loader_free(l);
        for (int i = 0; i < 16; i++)
            if (held[i]) tf_batch_release(held[i]);
        tf_order_free(o);
    }
    pthread_mutex_lock(&qmu);
    qdone = 1;
    pthread_cond_broadcast(&qcv);
    pthread_mutex_unlock(&qmu);
    pthread_join(rel, NULL);
    tf_dataset_free(ds[0]);
    tf_dataset_free(ds[1]);
    t_rm_rf(tmp);
    fprintf(stderr, "stress_engine: %d rounds, %llu batches checked\n", rounds, (unsigned long long)delivered);
    return T_DONE();
}
