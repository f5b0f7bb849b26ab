/* The decompressed-block cache the workers of a loader share (engine/zcache.c):
 * batches from a zstd dataset are byte-identical to those of its uncompressed
 * twin for every shuffle, thread count {1, 2, 4}, backend and cache size (auto,
 * a few entries: constant eviction, one entry: workers decoding privately),
 * across seeks and in a fork()ed child; the block shuffle decodes each block
 * at most twice per epoch whatever the thread count; the stats and the cost
 * model say what was decoded and what a configuration will cost. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"

#define SEQ 64
#define VOCAB 30000
#define BLOCK_TOKENS 256

static char tmpdir[256];

static uint64_t rs = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) { return t_xorshift(&rs); }

/* ~200 K tokens in shards of ~20 K (samples cross shard and block
 * boundaries; the last block of each shard is short). */
static uint64_t random_doc(void *ctx, uint64_t d, uint32_t *buf) {
    uint64_t n = rnd() % 12 == 0 ? 0 : 1 + rnd() % 800;
    for (uint64_t i = 0; i < n; i++) buf[i] = (uint32_t)(rnd() % 64 == 0 ? rnd() % VOCAB : 100 + i % 50);
    return n;
}

static int write_dataset(const char *dir, int zstd) {
    tf_writer_options o = t_writer_options(TF_UINT16, VOCAB, 20000, BLOCK_TOKENS, zstd);
    rs = 0x9E3779B97F4A7C15ull;
    return t_write_dataset(dir, &o, 500, random_doc, NULL);
}

typedef struct cfg {
    tf_shuffle shuffle;
    int threads;
    uint64_t cache_bytes;
    tf_backend backend;
    uint64_t epochs;
    uint64_t seq_len;
    unsigned want;
    uint32_t world;
} cfg;

static tf_loader *mk(const tf_dataset *ds, const cfg *c) {
    tf_loader_config lc;
    tf_loader_config_init(&lc);
    lc.order.seq_len = c->seq_len ? c->seq_len : SEQ;
    lc.order.seed = 7;
    lc.order.shuffle = c->shuffle;
    lc.order.block_size = 8;
    lc.order.window_blocks = 4;
    lc.order.epochs = c->epochs;
    lc.batch_size = 4;
    lc.world_size = c->world ? c->world : 1;
    lc.out_dtype = TF_UINT16;
    lc.want = c->want;
    lc.num_threads = c->threads;
    lc.backend = c->backend;
    lc.zstd_cache_bytes = c->cache_bytes;
    return t_loader_create(ds, &lc);
}

static size_t batch_bytes(const cfg *c) { return 4 * ((c->seq_len ? c->seq_len : SEQ) + 1) * 2; }

/* Compare n batches of a and b (same configuration, different data copies). */
static int same_batches(tf_loader *a, tf_loader *b, const cfg *c, int n, const char *what) {
    for (int i = 0; i < n; i++) {
        tf_batch *x = NULL, *y = NULL;
        int ra = tf_loader_next(a, &x), rb = tf_loader_next(b, &y);
        if (ra || rb) {
            fprintf(stderr, "%s: batch %d: next returned %d / %d: %s\n", what, i, ra, rb, tf_last_error());
            tf_batch_release(x);
            tf_batch_release(y);
            return 1;
        }
        tf_batch_view vx, vy;
        tf_batch_get_view(x, &vx);
        tf_batch_get_view(y, &vy);
        int bad = vx.position != vy.position || memcmp(vx.tokens, vy.tokens, batch_bytes(c)) != 0;
        if (!bad && c->want) {
            size_t L = c->seq_len ? c->seq_len : SEQ;
            bad = memcmp(vx.position_ids, vy.position_ids, 4 * L * 4) != 0;
        }
        tf_batch_release(x);
        tf_batch_release(y);
        if (bad) {
            fprintf(stderr, "%s: batch %d differs from the uncompressed dataset's\n", what, i);
            return 1;
        }
    }
    return 0;
}

static void test_identical(const tf_dataset *plain, const tf_dataset *zstd, size_t blk_bytes) {
    tf_shuffle shs[] = {TF_SHUFFLE_NONE, TF_SHUFFLE_FULL, TF_SHUFFLE_BLOCK};
    int ths[] = {1, 2, 4};
    uint64_t caches[] = {0, 3 * blk_bytes, 1};
    tf_backend bes[] = {TF_BACKEND_MMAP, TF_BACKEND_PREAD};
    for (int si = 0; si < 3; si++)
        for (int ti = 0; ti < 3; ti++)
            for (int ci = 0; ci < 3; ci++)
                for (int bi = 0; bi < 2; bi++) {
                    cfg c = {shs[si], ths[ti], caches[ci], bes[bi], 0, 0, 0, 1};
                    if (si == 2 && ci == 0) c.want = TF_WANT_POSITION_IDS;
                    tf_loader *a = mk(plain, &c), *b = mk(zstd, &c);
                    char what[128];
                    snprintf(what, sizeof what, "shuffle %d, %d threads, cache %llu bytes, %s", (int)c.shuffle,
                             c.threads, (unsigned long long)c.cache_bytes, tf_backend_name(c.backend));
                    if (a && b && same_batches(a, b, &c, 120, what)) t_failures++;
                    if (b) {
                        tf_loader_stats st;
                        tf_loader_get_stats(b, &st);
                        CHECK(st.zstd_cache_bytes > 0);
                        CHECK(st.zstd_cache_allocated <= st.zstd_cache_bytes);
                        CHECK(st.zstd_blocks_decoded > 0);
                        CHECK(st.zstd_tokens_used > 0);
                        if (ci == 1) CHECK(st.zstd_cache_bytes == 3 * blk_bytes);
                        if (ci == 2) CHECK(st.zstd_cache_bytes == blk_bytes); /* one entry */
                    }
                    if (a) {
                        tf_loader_stats st;
                        tf_loader_get_stats(a, &st);
                        CHECK(st.zstd_cache_bytes == 0 && st.zstd_blocks_decoded == 0 && st.zstd_decode_model == 0);
                    }
                    tf_loader_free(a);
                    tf_loader_free(b);
                }
}

/* Random seeks: after each, the zstd loader (small cache, 4 threads, blocks
 * of the old position still cached or being decoded) continues exactly as a
 * fresh uncompressed loader started there. */
static void test_seeks(const tf_dataset *plain, const tf_dataset *zstd, size_t blk_bytes) {
    for (int k = 0; k < 2; k++) {
        cfg c = {k ? TF_SHUFFLE_FULL : TF_SHUFFLE_BLOCK, 4, k ? 5 * blk_bytes : 0, TF_BACKEND_MMAP, 0, 0, 0, 1};
        tf_loader *z = mk(zstd, &c);
        if (!z) return;
        for (int s = 0; s < 12; s++) {
            uint64_t pos = (rnd() % 4000) * 4;
            CHECK_OK(tf_loader_seek(z, pos));
            tf_loader *p = mk(plain, &c);
            if (!p) break;
            CHECK_OK(tf_loader_seek(p, pos));
            char what[64];
            snprintf(what, sizeof what, "seek %d to %llu (shuffle %d)", s, (unsigned long long)pos, (int)c.shuffle);
            if (same_batches(p, z, &c, 1 + (int)(rnd() % 20), what)) t_failures++;
            tf_loader_free(p);
        }
        tf_loader_free(z);
    }
}

/* One epoch of the block shuffle: every block is decoded at most twice (once
 * per window it belongs to) whatever the number of threads, and every token
 * delivered was copied from a decoded block. */
static void test_decode_bound(const tf_dataset *zstd, uint64_t num_blocks) {
    int ths[] = {1, 2, 4};
    for (int ti = 0; ti < 3; ti++) {
        cfg c = {TF_SHUFFLE_BLOCK, ths[ti], 0, TF_BACKEND_MMAP, 1, 0, 0, 1};
        tf_loader *l = mk(zstd, &c);
        if (!l) return;
        uint64_t batches = 0;
        for (;;) {
            tf_batch *b = NULL;
            int rc = tf_loader_next(l, &b);
            if (rc == -TF_EEOF) break;
            CHECK_OK(rc);
            if (rc) break;
            tf_batch_release(b);
            batches++;
        }
        tf_loader_stats st;
        tf_loader_get_stats(l, &st);
        fprintf(stderr, "  block shuffle, %d thread(s), one epoch: %llu blocks decoded (%llu blocks), %.3f tokens "
                "decoded per token used, model %.3f, cache %llu bytes\n", c.threads,
                (unsigned long long)st.zstd_blocks_decoded, (unsigned long long)num_blocks, st.zstd_decode_ratio,
                st.zstd_decode_model, (unsigned long long)st.zstd_cache_bytes);
        CHECK(st.zstd_tokens_used == batches * 4 * (SEQ + 1));
        if (st.zstd_blocks_decoded > 2 * num_blocks) {
            fprintf(stderr, "%d threads: %llu blocks decoded in one epoch over %llu blocks\n", c.threads,
                    (unsigned long long)st.zstd_blocks_decoded, (unsigned long long)num_blocks);
            t_failures++;
        }
        CHECK(st.zstd_decode_ratio > 0.5 && st.zstd_decode_ratio < 2.5);
        CHECK(st.zstd_decode_model >= 1.0 && st.zstd_decode_model < 1.5);
        CHECK(st.zstd_note[0] == '\0');
        CHECK(st.zstd_cache_hits + st.zstd_cache_misses > 0);
        tf_loader_free(l);
    }
}

/* The model: a full shuffle over blocks 16x a sample, with a cache far smaller
 * than the data, decodes ~16x what it delivers and says so; so do 8 ranks on
 * a block shuffle (each rank's samples touch nearly every block of a window);
 * one rank on the block shuffle stays near 1. */
static void test_cost_model(const tf_dataset *zstd, size_t blk_bytes) {
    cfg full = {TF_SHUFFLE_FULL, 2, 4 * blk_bytes, TF_BACKEND_MMAP, 0, 15, 0, 1};
    tf_loader *l = mk(zstd, &full);
    if (!l) return;
    tf_loader_stats st;
    tf_loader_get_stats(l, &st);
    CHECK(st.zstd_decode_model > 8.0 && st.zstd_decode_model < 18.0);
    CHECK(strstr(st.zstd_note, "full shuffle") != NULL);
    for (int i = 0; i < 200; i++) {
        tf_batch *b = NULL;
        CHECK_OK(tf_loader_next(l, &b));
        tf_batch_release(b);
    }
    tf_loader_get_stats(l, &st);
    fprintf(stderr, "  full shuffle, seq_len 15: model %.2f, measured %.2f\n", st.zstd_decode_model,
            st.zstd_decode_ratio);
    /* measured: (256 + 15) / 16 ~ 17 tokens decoded per token, less hits */
    CHECK(st.zstd_decode_ratio > 8.0 && st.zstd_decode_ratio < 20.0);
    tf_loader_free(l);

    cfg ranks = {TF_SHUFFLE_BLOCK, 1, 4 * blk_bytes, TF_BACKEND_MMAP, 0, 0, 0, 8};
    l = mk(zstd, &ranks);
    if (!l) return;
    tf_loader_get_stats(l, &st);
    CHECK(st.zstd_decode_model > 1.5);
    tf_loader_free(l);
}

/* A forked child (DataLoader workers) gets a cache of its own: the parent's
 * lock and entries may be mid-update at fork time. */
static void test_fork(const tf_dataset *plain, const tf_dataset *zstd) {
    cfg c = {TF_SHUFFLE_BLOCK, 2, 0, TF_BACKEND_MMAP, 0, 0, 0, 1};
    tf_loader *z = mk(zstd, &c);
    if (!z) return;
    tf_batch *b = NULL;
    CHECK_OK(tf_loader_next(z, &b));
    tf_batch_release(b);
    pid_t pid = fork();
    if (pid == 0) {
        tf_loader *p = mk(plain, &c);
        int bad = !p || tf_loader_seek(p, 4) != 0 || same_batches(p, z, &c, 40, "forked child");
        _exit(bad ? 1 : 0);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    tf_loader *p = mk(plain, &c);
    if (p) {
        CHECK_OK(tf_loader_seek(p, 4));
        if (same_batches(p, z, &c, 40, "parent after fork")) t_failures++;
    }
    tf_loader_free(p);
    tf_loader_free(z);
}

int main(void) {
    if (!(tf_features() & TF_FEATURE_ZSTD)) {
        fprintf(stderr, "zstd not compiled in: nothing to test\n");
        return T_EXIT_SKIP;
    }
    if (t_mkdtemp(tmpdir, sizeof tmpdir, "tf_zcache")) return T_EXIT_FAIL;
    char dp[300], dz[300];
    snprintf(dp, sizeof dp, "%s/plain", tmpdir);
    snprintf(dz, sizeof dz, "%s/zstd", tmpdir);
    tf_dataset *plain = NULL, *zstd = NULL;
    CHECK_OK(write_dataset(dp, 0));
    CHECK_OK(write_dataset(dz, 1));
    CHECK_OK(tf_dataset_open(dp, NULL, &plain));
    CHECK_OK(tf_dataset_open(dz, NULL, &zstd));
    if (plain && zstd) {
        tf_dataset_info info;
        tf_dataset_get_info(zstd, &info);
        uint64_t blocks = 0;
        for (uint64_t i = 0; i < info.num_files; i++) {
            tf_file_info fi;
            tf_dataset_get_file(zstd, i, &fi);
            CHECK(fi.compressed);
            blocks += (fi.num_tokens + BLOCK_TOKENS - 1) / BLOCK_TOKENS;
        }
        CHECK(info.num_files >= 5);
        size_t blk_bytes = BLOCK_TOKENS * 2;
        test_identical(plain, zstd, blk_bytes);
        test_seeks(plain, zstd, blk_bytes);
        test_decode_bound(zstd, blocks);
        test_cost_model(zstd, blk_bytes);
        test_fork(plain, zstd);
    }
    tf_dataset_free(plain);
    tf_dataset_free(zstd);
    t_rm_rf(tmpdir);
    return T_DONE();
}
