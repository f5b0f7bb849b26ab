/* llm.c's data order (tf_order_create_llmc) against llm.c's own loader.
 *
 * The reference is llm.c's DataLoader, ported function for function in
 * llmc_dataloader.h (karpathy/llm.c, llmc/dataloader.h, MIT license); its
 * generator is checked here against the PyTorch values llmc/rand.h quotes.
 * For several (processes, B, T, shuffle, seed) over shards of unequal sizes,
 * every process's batches over three epochs equal a tokenfeed loader's at
 * that rank; seeking to a step (forward and back) gives the same batch; a
 * shard shorter than one global batch is refused naming it. */
#include "helpers.h"

#include "llmc_dataloader.h"

/* ---- the comparison -------------------------------------------------------- */

#define NSHARDS 4
static char dir[64], paths_buf[NSHARDS + 1][128];
static const char *paths[NSHARDS + 1];

static void write_shard(const char *path, int ntok, uint32_t salt) {
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    int header[HEADER_SIZE] = {20240520, 1, ntok};
    fwrite(header, sizeof header, 1, f);
    for (int i = 0; i < ntok; i++) {
        uint16_t t = (uint16_t)((i * 2654435761u + salt) % 50257u);
        fwrite(&t, 2, 1, f);
    }
    fclose(f);
}

/* Does tokenfeed's batch equal llm.c's buffer (B rows of T + 1 tokens, each
 * starting T after the previous)? */
static int same_batch(const tf_batch_view *v, const uint16_t *buf, size_t B, size_t T) {
    if (v->rows != B || v->seq_len != T || v->dtype != TF_UINT16) return 0;
    const uint16_t *t = v->tokens;
    for (size_t j = 0; j < B; j++)
        if (memcmp(t + j * (T + 1), buf + j * T, (T + 1) * 2)) return 0;
    return 1;
}

static tf_order *make_order(tf_dataset *ds, size_t R, size_t B, size_t T, int shuffle, uint32_t seed) {
    tf_order_config oc;
    tf_order_config_init(&oc);
    oc.seq_len = T;
    oc.global_batch = R * B;
    oc.shuffle = shuffle ? TF_SHUFFLE_FULL : TF_SHUFFLE_NONE;
    oc.seed = seed;
    tf_order *o = NULL;
    CHECK_OK(tf_order_create_llmc(ds, &oc, (uint32_t)R, &o));
    return o;
}

static tf_loader *make_loader(tf_order *o, size_t R, size_t B, size_t r) {
    tf_loader_config lc;
    tf_loader_config_init(&lc);
    lc.batch_size = B;
    lc.rank = (uint32_t)r;
    lc.world_size = (uint32_t)R;
    lc.num_threads = 2;
    tf_loader *l = NULL;
    CHECK_OK(tf_loader_create_from_order(o, &lc, &l));
    return l;
}

/* Every process over three epochs; for one process, seeks. */
static void compare(tf_dataset *ds, size_t R, size_t B, size_t T, int shuffle, uint32_t seed) {
    tf_order *o = make_order(ds, R, B, T, shuffle, seed);
    if (!o) return;
    uint64_t G = R * B, E = tf_order_num_samples(o) / G, steps = 3 * E;
    /* an epoch: every shard's batches, as llm.c counts them */
    DataLoader cnt;
    dataloader_init(&cnt, paths, NSHARDS, B, T, 0, (int)R, 0, seed);
    uint64_t E_ref = 0;
    for (int f = 0; f < NSHARDS; f++) {
        dataloader_load_shard_(&cnt, f);
        E_ref += cnt.shard_num_samples;
    }
    dataloader_free(&cnt);
    CHECK(E == E_ref && tf_order_num_samples(o) % G == 0);
    for (size_t r = 0; r < R; r++) {
        DataLoader ref;
        dataloader_init(&ref, paths, NSHARDS, B, T, (int)r, (int)R, shuffle, seed);
        uint16_t *want = malloc(steps * (B * T + 1) * 2);
        tf_loader *l = make_loader(o, R, B, r);
        int ok = want && l;
        for (uint64_t k = 0; ok && k < steps; k++) {
            dataloader_next_batch(&ref);
            memcpy(want + k * (B * T + 1), ref.buffer, (B * T + 1) * 2);
            tf_batch *b = NULL;
            int rc = tf_loader_next(l, &b);
            CHECK_OK(rc);
            if (rc < 0) break;
            tf_batch_view v;
            tf_batch_get_view(b, &v);
            if (!same_batch(&v, ref.buffer, B, T)) {
                fprintf(stderr, "R %zu B %zu T %zu shuffle %d seed %u: process %zu step %llu differs from llm.c's\n",
                        R, B, T, shuffle, seed, r, (unsigned long long)k);
                ok = 0;
            }
            CHECK(v.position == k * G);
            tf_batch_release(b);
        }
        CHECK(ok);
        /* resume anywhere: forward, across epochs, and back to an earlier epoch */
        const uint64_t at[] = {2 * E + E / 2, 5 % steps, E + 1, steps - 1, 0};
        for (size_t i = 0; ok && i < sizeof at / sizeof at[0]; i++) {
            CHECK_OK(tf_loader_seek(l, at[i] * G));
            tf_batch *b = NULL;
            CHECK_OK(tf_loader_next(l, &b));
            if (!b) break;
            tf_batch_view v;
            tf_batch_get_view(b, &v);
            CHECK(same_batch(&v, want + at[i] * (B * T + 1), B, T));
            tf_batch_release(b);
        }
        tf_loader_free(l);
        free(want);
        dataloader_free(&ref);
    }
    tf_order_free(o);
}

static void test_generator(void) {
    /* the values llmc/rand.h quotes for torch.manual_seed(137) */
    static const uint32_t want[] = {4053805790u, 2173880614u, 380293709u, 1237255315u, 2986595568u};
    ref_mt g;
    ref_seed(&g, 137);
    for (size_t i = 0; i < 5; i++) CHECK(ref_u32(&g) == want[i]);
}

static void test_refusals(tf_dataset *ds) {
    tf_order_config oc;
    tf_order_config_init(&oc);
    oc.seq_len = 64;
    oc.global_batch = 8;
    tf_order *o = NULL;
    /* 8 rows of 64 tokens: more than the 300-token shard holds */
    CHECK_RC(tf_order_create_llmc(ds, &oc, 1, &o), -EINVAL);
    CHECK(strstr(tf_last_error(), paths[0]) != NULL);
    oc.seq_len = 8;
    CHECK_RC(tf_order_create_llmc(ds, &oc, 3, &o), -EINVAL); /* 8 rows over 3 processes */
    oc.shuffle = TF_SHUFFLE_BLOCK;
    CHECK_RC(tf_order_create_llmc(ds, &oc, 2, &o), -EINVAL);
    oc.shuffle = TF_SHUFFLE_FULL;
    oc.separator_id = 0;
    CHECK_RC(tf_order_create_llmc(ds, &oc, 2, &o), -EINVAL);
    oc.separator_id = -1;
    /* the number of processes changes the stream, so the fingerprint */
    tf_order *a = NULL, *b = NULL;
    CHECK_OK(tf_order_create_llmc(ds, &oc, 2, &a));
    CHECK_OK(tf_order_create_llmc(ds, &oc, 4, &b));
    if (a && b) CHECK(tf_order_fingerprint(a) != tf_order_fingerprint(b));
    /* the same order as a setting of tf_order_create */
    tf_order *c = NULL;
    oc.order = TF_ORDER_LLMC;
    oc.llmc_processes = 2;
    CHECK_OK(tf_order_create(ds, &oc, &c));
    if (a && c) {
        CHECK(tf_order_fingerprint(a) == tf_order_fingerprint(c));
        for (uint64_t pos = 0; pos < 3 * tf_order_num_samples(a); pos += 7)
            CHECK(tf_order_sample_at(a, pos) == tf_order_sample_at(c, pos));
    }
    tf_order_free(c);
    tf_order_free(a);
    tf_order_free(b);
}

int main(void) {
    test_generator();
    snprintf(dir, sizeof dir, "/tmp/tf_llmc_XXXXXX");
    if (!mkdtemp(dir)) return T_EXIT_FAIL;
    /* unequal shards, so that shuffled processes cross shard ends at different steps */
    static const int ntok[NSHARDS] = {300, 1031, 517, 777};
    for (int f = 0; f < NSHARDS; f++) {
        snprintf(paths_buf[f], sizeof paths_buf[f], "%s/shard_%02d.bin", dir, f);
        paths[f] = paths_buf[f];
        write_shard(paths[f], ntok[f], (uint32_t)f * 7919u);
    }
    tf_dataset *ds = NULL;
    CHECK_OK(tf_dataset_open_many(paths, NSHARDS, NULL, &ds));
    if (ds) {
        compare(ds, 1, 4, 8, 0, 42);
        compare(ds, 1, 3, 10, 1, 42);
        compare(ds, 2, 2, 16, 1, 42);
        compare(ds, 2, 2, 16, 0, 42);
        compare(ds, 3, 1, 7, 1, 7);
        test_refusals(ds);
    }
    tf_dataset_free(ds);
    for (int f = 0; f < NSHARDS; f++) unlink(paths[f]);
    rmdir(dir);
    return T_DONE();
}
