/* test_order.c — the order layer: the keyed permutation, packing with and
 * without separators (tokens, spans and extras against a brute-force reference
 * built here), the NONE / FULL / BLOCK shuffles (every sample exactly once per
 * epoch), positions, fingerprints and config errors. */
#include <stdint.h>
#include <unistd.h>

#include "helpers.h"
#include "order/order_internal.h"

/* ------------------------------------------------------------------------ */
/* perm                                                                      */
/* ------------------------------------------------------------------------ */

static void test_perm_bijection(void) {
    const uint64_t ns[] = {1, 2, 3, 5, 7, 8, 16, 17, 1000, 65537, (1u << 20) + 3};
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++) {
        uint64_t n = ns[a];
        for (uint64_t key = 0; key < 3; key++) {
            tf_perm p;
            CHECK_OK(tf_perm_init(&p, n, key * 0x1234567ULL));
            uint8_t *seen = calloc((size_t)(n + 7) / 8, 1);
            int ok = 1, moved = 0;
            for (uint64_t i = 0; i < n; i++) {
                uint64_t j = tf_perm_apply(&p, i);
                if (j >= n || (seen[j / 8] >> (j % 8) & 1)) { ok = 0; break; }
                seen[j / 8] |= (uint8_t)(1u << (j % 8));
                if (tf_perm_inverse(&p, j) != i) { ok = 0; break; }
                moved += j != i;
            }
            if (!ok) fprintf(stderr, "perm n=%llu key=%llu is not a bijection\n", (unsigned long long)n, (unsigned long long)key);
            CHECK(ok);
            if (n >= 1000) CHECK(moved > (int)(n / 2)); /* it actually shuffles */
            free(seen);
        }
    }
    tf_perm p;
    CHECK_RC(tf_perm_init(&p, 0, 1), -EINVAL);
    /* huge domains: spot checks of apply(inverse(j)) == j and inverse(apply(i)) == i */
    const uint64_t big[] = {(1ULL << 63) - 1, 1ULL << 63, (1ULL << 63) + 1, UINT64_MAX - 1, UINT64_MAX,
                            (1ULL << 62) + 1};
    for (size_t a = 0; a < sizeof big / sizeof big[0]; a++) {
        CHECK_OK(tf_perm_init(&p, big[a], 99));
        for (uint64_t t = 0; t < 2000; t++) {
            uint64_t j = tf_mix64(t) % big[a];
            uint64_t i = tf_perm_inverse(&p, j);
            CHECK(i < big[a]);
            CHECK(tf_perm_apply(&p, i) == j);
            uint64_t y = tf_perm_apply(&p, j);
            CHECK(y < big[a] && tf_perm_inverse(&p, y) == j);
        }
        CHECK(tf_perm_apply(&p, big[a] - 1) < big[a]);
    }
    /* different keys give different permutations */
    tf_perm p1, p2;
    CHECK_OK(tf_perm_init(&p1, 1000, 1));
    CHECK_OK(tf_perm_init(&p2, 1000, 2));
    int same = 0;
    for (uint64_t i = 0; i < 1000; i++) same += tf_perm_apply(&p1, i) == tf_perm_apply(&p2, i);
    CHECK(same < 50);
}

/* ------------------------------------------------------------------------ */
/* helpers                                                                   */
/* ------------------------------------------------------------------------ */

static uint64_t rng_state = 12345;
static uint64_t rnd(uint64_t n) {
    rng_state = tf_mix64(rng_state + 0x9E3779B97F4A7C15ULL);
    return n ? rng_state % n : 0;
}

/* A dataset of T tokens (token t = t % 60000) in one document. */
static tf_dataset *flat_dataset(uint64_t T) {
    uint16_t *t = malloc(T * sizeof *t);
    for (uint64_t i = 0; i < T; i++) t[i] = (uint16_t)(i % 60000);
    tf_dataset *ds = NULL;
    CHECK_OK(tf_dataset_from_memory(t, T, TF_UINT16, NULL, 0, 0, &ds));
    free(t);
    return ds;
}

static tf_order *make_order(const tf_dataset *ds, tf_shuffle sh, uint64_t seq_len, uint64_t block, uint64_t window) {
    tf_order_config c = t_order_config(seq_len);
    c.shuffle = sh;
    c.seed = 7;
    c.block_size = block;
    c.window_blocks = window;
    return t_order_create(ds, &c);
}

/* ------------------------------------------------------------------------ */
/* shuffles                                                                  */
/* ------------------------------------------------------------------------ */

/* Every epoch of the stream is a permutation of [0, N); epochs differ; BLOCK
 * windows read from at most W blocks plus the tail. */
static void check_epochs(const tf_order *o, uint64_t N, tf_shuffle sh, uint64_t Bk, uint64_t W) {
    CHECK(tf_order_num_samples(o) == N);
    uint8_t *seen = malloc(N);
    uint64_t *ep0 = malloc(N * sizeof *ep0);
    for (uint64_t e = 0; e < 3; e++) {
        memset(seen, 0, N);
        uint64_t diff = 0;
        int ok = 1;
        for (uint64_t i = 0; i < N; i++) {
            uint64_t s = tf_order_sample_at(o, e * N + i);
            if (s >= N || seen[s]) { ok = 0; break; }
            seen[s] = 1;
            if (e == 0) ep0[i] = s;
            else diff += ep0[i] != s;
            if (sh == TF_SHUFFLE_NONE) CHECK(s == i);
        }
        if (!ok) fprintf(stderr, "shuffle %d N=%llu B=%llu W=%llu epoch %llu is not a permutation\n", (int)sh,
                         (unsigned long long)N, (unsigned long long)Bk, (unsigned long long)W, (unsigned long long)e);
        CHECK(ok);
        if (e > 0 && sh != TF_SHUFFLE_NONE && N >= 50) CHECK(diff > N / 2);
    }
    if (sh == TF_SHUFFLE_BLOCK) {
        /* locality: a full window's W*Bk positions touch at most W blocks */
        uint64_t nbf = N / Bk, wsz = W * Bk;
        uint64_t nwin = nbf ? (nbf + W - 1) / W : 1;
        for (uint64_t w = 0; w < nwin; w++) {
            uint64_t lo = w * wsz, hi = w + 1 < nwin ? lo + wsz : N;
            uint64_t limit = w + 1 < nwin ? W : nbf - w * W + (N % Bk ? 1 : 0); /* tail counts as one */
            uint64_t blocks[256];
            size_t nb = 0;
            for (uint64_t j = lo; j < hi; j++) {
                uint64_t b = ep0[j] / Bk;
                if (b > nbf) b = nbf; /* tail */
                size_t q = 0;
                while (q < nb && blocks[q] != b) q++;
                if (q == nb && nb < 256) blocks[nb++] = b;
            }
            CHECK(nb <= limit);
        }
    }
    free(seen);
    free(ep0);
}

static void test_shuffles(void) {
    struct { uint64_t N, B, W; } combos[] = {
        {1, 1, 1},   {2, 4, 2},    {5, 10, 2},   {100, 7, 3},  {100, 10, 5},   {64, 8, 8},
        {1000, 16, 4}, {37, 1, 1}, {50, 3, 100}, {999, 32, 2}, {4096, 64, 16}, {123, 123, 1},
        {124, 123, 1}, {1, 1024, 16},
    };
    for (size_t c = 0; c < sizeof combos / sizeof combos[0]; c++) {
        uint64_t N = combos[c].N;
        tf_dataset *ds = flat_dataset(N + 1); /* seq_len 1: N samples */
        for (int sh = 0; sh < 3; sh++) {
            tf_order *o = make_order(ds, (tf_shuffle)sh, 1, combos[c].B, combos[c].W);
            if (o) check_epochs(o, N, (tf_shuffle)sh, combos[c].B, combos[c].W);
            tf_order_free(o);
        }
        tf_dataset_free(ds);
    }
    /* seeds give different orders */
    tf_dataset *ds = flat_dataset(1001);
    tf_order_config c;
    tf_order_config_init(&c);
    c.seq_len = 1;
    tf_order *a = NULL, *b = NULL;
    c.seed = 1;
    CHECK_OK(tf_order_create(ds, &c, &a));
    c.seed = 2;
    CHECK_OK(tf_order_create(ds, &c, &b));
    int same = 0;
    for (uint64_t i = 0; i < 1000; i++) same += tf_order_sample_at(a, i) == tf_order_sample_at(b, i);
    CHECK(same < 50);
    /* positions far into an infinite stream are computed directly */
    uint64_t far = 1000ULL * 123456789ULL + 17;
    CHECK(tf_order_sample_at(a, far) < 1000);
    tf_order_free(a);
    tf_order_free(b);
    tf_dataset_free(ds);
}

/* ------------------------------------------------------------------------ */
/* packing against a brute-force reference                                   */
/* ------------------------------------------------------------------------ */

/* Build the virtual stream explicitly: tokens (separators inserted) and, for
 * each virtual position, whether a document starts there. */
static void build_reference(const uint32_t *tok, const uint64_t *ends, uint64_t D, int64_t sep, int64_t **vt,
                            uint8_t **start, uint64_t *Tv) {
    uint64_t T = D ? ends[D - 1] : 0;
    uint64_t cap = T + D + 1;
    *vt = malloc(cap * sizeof **vt);
    *start = calloc(cap, 1);
    uint64_t p = 0, prev = 0;
    for (uint64_t k = 0; k < D; k++) {
        uint64_t len = ends[k] - prev;
        if (sep >= 0 || len > 0) (*start)[p] = 1;
        for (uint64_t t = prev; t < ends[k]; t++) (*vt)[p++] = tok[t];
        if (sep >= 0) (*vt)[p++] = sep;
        prev = ends[k];
    }
    *Tv = p;
}

/* Compare every sample of ds (tokens, extras, spans) with the reference stream
 * built from (tok, ends). ds == NULL: a memory dataset over them. */
static void check_packing_ds(const tf_dataset *given, const uint32_t *tok, const uint64_t *ends, uint64_t D,
                             int64_t sep, uint64_t L, tf_dtype odt) {
    int64_t *vt;
    uint8_t *st;
    uint64_t Tv;
    build_reference(tok, ends, D, sep, &vt, &st, &Tv);
    tf_dataset *ds = NULL;
    if (!given) CHECK_OK(tf_dataset_from_memory(tok, ends[D - 1], TF_UINT32, ends, D, 0, &ds));
    tf_order_config c;
    tf_order_config_init(&c);
    c.seq_len = L;
    c.separator_id = sep;
    c.shuffle = TF_SHUFFLE_NONE;
    tf_order *o = NULL;
    uint64_t N = Tv ? (Tv - 1) / L : 0;
    int rc = tf_order_create(given ? given : ds, &c, &o);
    if (N == 0) {
        CHECK(rc == -EINVAL);
        CHECK(strstr(tf_last_error(), "tokens") != NULL);
        goto out;
    }
    CHECK(rc == 0);
    if (rc) goto out;
    CHECK(tf_order_num_samples(o) == N);
    size_t ms = tf__order_max_spans(o);
    tf__span *spans = malloc(ms * sizeof *spans);
    int64_t *got = malloc((L + 1) * sizeof *got);
    int32_t *pid = malloc(L * 4), *cu = malloc((L + 1) * 4), ns;
    uint8_t *lm = malloc(L);
    void *raw = malloc((L + 1) * 8);
    int bad = 0;
    for (uint64_t i = 0; i < N && bad < 5; i++) {
        uint64_t p0 = i * L;
        tf_sample_extras ex = {pid, cu, &ns, lm};
        CHECK_OK(tf_order_fill_sample(o, i, raw, odt, &ex));
        tf_convert(got, TF_INT64, raw, odt, L + 1);
        int ok = memcmp(got, vt + p0, (L + 1) * 8) == 0;
        /* extras reference */
        int32_t seg = 0, nseg = 1, cux[4096 + 2];
        size_t ncu = 0;
        cux[ncu++] = 0;
        for (uint64_t t = 0; t < L; t++) {
            if (t > 0 && st[p0 + t]) { seg = 0; cux[ncu++] = (int32_t)t; nseg++; }
            if (pid[t] != seg++) ok = 0;
            if (lm[t] != (st[p0 + t + 1] ? 0 : 1)) ok = 0;
        }
        cux[ncu++] = (int32_t)L;
        for (size_t q = 0; q <= L; q++)
            if (cu[q] != (q < ncu ? cux[q] : (int32_t)L)) ok = 0;
        if (ns != nseg) ok = 0;
        /* spans rebuild the same tokens and cover [0, L + 1) in order */
        size_t n = 0;
        CHECK_OK(tf__order_sample_spans(o, i, spans, ms, &n));
        uint64_t dst = 0;
        for (size_t q = 0; q < n; q++) {
            if (spans[q].dst != dst || spans[q].len == 0) ok = 0;
            for (uint64_t t = 0; t < spans[q].len && dst + t <= L; t++) {
                int64_t v = spans[q].src == TF_SPAN_SEPARATOR ? sep : (int64_t)tok[spans[q].src + t];
                if (v != vt[p0 + dst + t]) ok = 0;
            }
            dst += spans[q].len;
        }
        if (dst != L + 1) ok = 0;
        if (!ok) {
            fprintf(stderr, "packing mismatch: D=%llu sep=%lld L=%llu sample %llu\n", (unsigned long long)D,
                    (long long)sep, (unsigned long long)L, (unsigned long long)i);
            bad++;
        }
        CHECK(ok);
    }
    CHECK_RC(tf_order_fill_sample(o, N, raw, odt, NULL), -ERANGE);
    free(spans);
    free(got);
    free(pid);
    free(cu);
    free(lm);
    free(raw);
out:
    tf_order_free(o);
    tf_dataset_free(ds);
    free(vt);
    free(st);
}

static void check_packing(const uint32_t *tok, const uint64_t *ends, uint64_t D, int64_t sep, uint64_t L,
                          tf_dtype odt) {
    check_packing_ds(NULL, tok, ends, D, sep, L, odt);
}

static void test_packing(void) {
    for (int round = 0; round < 12; round++) {
        uint64_t D = 1 + rnd(40);
        uint64_t *ends = malloc(D * sizeof *ends);
        uint64_t T = 0;
        for (uint64_t k = 0; k < D; k++) {
            uint64_t r = rnd(10);
            uint64_t len = r < 3 ? 0 : r < 7 ? 1 + rnd(4) : rnd(50); /* many empty and tiny docs */
            T += len;
            ends[k] = T;
        }
        uint32_t *tok = malloc((T + 1) * sizeof *tok);
        for (uint64_t t = 0; t < T; t++) tok[t] = (uint32_t)(1 + rnd(5000));
        const uint64_t Ls[] = {1, 2, 3, 7, 16, 64};
        for (size_t a = 0; a < sizeof Ls / sizeof Ls[0]; a++) {
            check_packing(tok, ends, D, -1, Ls[a], TF_INT32);
            check_packing(tok, ends, D, 0, Ls[a], TF_UINT16);
            check_packing(tok, ends, D, 50000, Ls[a], TF_INT64);
        }
        free(ends);
        free(tok);
    }
    /* a separator that does not fit the output dtype is refused */
    uint32_t tok[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    uint64_t ends[2] = {4, 10};
    tf_dataset *ds = NULL;
    CHECK_OK(tf_dataset_from_memory(tok, 10, TF_UINT32, ends, 2, 0, &ds));
    tf_order_config c;
    tf_order_config_init(&c);
    c.seq_len = 4;
    c.separator_id = 300;
    tf_order *o = NULL;
    CHECK_OK(tf_order_create(ds, &c, &o));
    uint8_t out[5];
    CHECK_RC(tf_order_fill_sample(o, 0, out, TF_UINT8, NULL), -EINVAL);
    tf_order_free(o);
    tf_dataset_free(ds);
    /* separator outside a known vocabulary */
    CHECK_OK(tf_dataset_from_memory(tok, 10, TF_UINT32, ends, 2, 100, &ds));
    o = NULL;
    CHECK_RC(tf_order_create(ds, &c, &o), -EINVAL);
    CHECK(o == NULL);
    tf_dataset_free(ds);
}

/* Samples that straddle files: needs the raw-file parser (skipped until the
 * sources layer provides it). */
static void test_multi_file(void) {
    char dir[] = "/tmp/tf_order_XXXXXX";
    if (!mkdtemp(dir)) return;
    char p1[64], p2[64];
    snprintf(p1, sizeof p1, "%s/a.bin", dir);
    snprintf(p2, sizeof p2, "%s/b.bin", dir);
    uint16_t t[100];
    for (int i = 0; i < 100; i++) t[i] = (uint16_t)i;
    FILE *f = fopen(p1, "wb");
    fwrite(t, 2, 37, f);
    fclose(f);
    f = fopen(p2, "wb");
    fwrite(t + 37, 2, 63, f);
    fclose(f);
    const char *paths[2] = {p1, p2};
    tf_open_options opt = {.format = TF_FORMAT_RAW, .raw_dtype = TF_UINT16};
    tf_dataset *ds = NULL;
    int rc = tf_dataset_open_many(paths, 2, &opt, &ds);
    if (rc == 0) {
        tf_order *o = make_order(ds, TF_SHUFFLE_NONE, 10, 1, 1);
        uint16_t out[11];
        for (uint64_t s = 0; o && s < tf_order_num_samples(o); s++) {
            CHECK_OK(tf_order_fill_sample(o, s, out, TF_UINT16, NULL));
            for (int i = 0; i <= 10; i++) CHECK(out[i] == s * 10 + (uint64_t)i);
        }
        tf_order_free(o);
        tf_dataset_free(ds);
    } else {
        fprintf(stderr, "note: multi-file packing not tested (raw files: %s)\n", tf_strerror(rc));
    }
    unlink(p1);
    unlink(p2);
    rmdir(dir);
}

/* Documents and samples spread over several native shards (the writer rolls
 * over every ~50 tokens): tokens, extras and spans must match the reference.
 * Skipped until the writer is available. */
static void test_multi_shard(void) {
    char dir[] = "/tmp/tf_order_ds_XXXXXX";
    if (!mkdtemp(dir)) return;
    tf_writer_options wo;
    tf_writer_options_init(&wo);
    wo.dtype = TF_UINT16;
    wo.vocab_size = 65536;
    wo.shard_tokens = 50;
    wo.overwrite = 1;
    tf_writer *w = NULL;
    int rc = tf_writer_create(dir, &wo, &w);
    if (rc < 0) {
        fprintf(stderr, "note: multi-shard packing not tested (writer: %s)\n", tf_strerror(rc));
        rmdir(dir);
        return;
    }
    enum { D = 60 };
    uint64_t ends[D], T = 0;
    uint32_t tok[D * 30];
    for (uint64_t k = 0; k < D; k++) {
        uint64_t len = k % 7 == 3 ? 0 : 1 + rnd(25);
        for (uint64_t t = 0; t < len; t++) tok[T + t] = (uint32_t)(1 + rnd(60000));
        CHECK_OK(tf_writer_add_document(w, tok + T, len, TF_UINT32));
        T += len;
        ends[k] = T;
    }
    CHECK_OK(tf_writer_finish(w));
    tf_writer_free(w);
    tf_dataset *ds = NULL;
    rc = tf_dataset_open(dir, NULL, &ds);
    CHECK_OK(rc);
    if (rc == 0) {
        tf_dataset_info info;
        CHECK_OK(tf_dataset_get_info(ds, &info));
        CHECK(info.num_files > 1 && info.num_tokens == T && info.num_documents == D);
        const uint64_t Ls[] = {1, 5, 16, 61};
        for (size_t a = 0; a < sizeof Ls / sizeof Ls[0]; a++) {
            check_packing_ds(ds, tok, ends, D, -1, Ls[a], TF_INT32);
            check_packing_ds(ds, tok, ends, D, 7, Ls[a], TF_UINT16);
        }
        tf_dataset_free(ds);
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "note: could not remove %s\n", dir);
}

/* ------------------------------------------------------------------------ */
/* positions, fingerprint, errors                                            */
/* ------------------------------------------------------------------------ */

static void test_positions_and_errors(void) {
    tf_dataset *ds = flat_dataset(1001); /* seq_len 10: N = 100 */
    tf_order_config c;
    tf_order_config_init(&c);
    CHECK(c.seq_len == 2048 && c.packing == TF_PACK_CONCAT && c.separator_id == -1 && c.seed == 0 &&
          c.shuffle == TF_SHUFFLE_FULL && c.block_size == 1024 && c.window_blocks == 16 && c.global_batch == 1 &&
          c.epochs == 0);
    tf_order *o = NULL;
    /* default seq_len 2048 > 1000 tokens: refused, saying how many tokens */
    CHECK_RC(tf_order_create(ds, &c, &o), -EINVAL);
    CHECK(strstr(tf_last_error(), "1001") && strstr(tf_last_error(), "2049"));
    c.seq_len = 10;
    CHECK_OK(tf_order_create(ds, &c, &o));
    CHECK(tf_order_num_samples(o) == 100);
    CHECK(tf_order_num_positions(o) == UINT64_MAX);
    tf_order_free(o);
    c.epochs = 3;
    c.global_batch = 7;
    CHECK_OK(tf_order_create(ds, &c, &o));
    CHECK(tf_order_num_positions(o) == 294);
    tf_order_free(o);
    c.epochs = 1;
    c.global_batch = 101;
    CHECK_RC(tf_order_create(ds, &c, &o), -EINVAL);
    c.global_batch = 0;
    CHECK_RC(tf_order_create(ds, &c, &o), -EINVAL);
    c.global_batch = 1;
    c.epochs = UINT64_MAX / 50;
    CHECK(tf_order_create(ds, &c, &o) < 0);
    c.epochs = 0;
    c.packing = (tf_packing)7; /* BEST_FIT / DOCUMENT exist now: tests/c/test_packing.c */
    CHECK_RC(tf_order_create(ds, &c, &o), -EINVAL);
    c.packing = TF_PACK_CONCAT;
    c.shuffle = TF_SHUFFLE_BLOCK;
    c.block_size = 0;
    CHECK_RC(tf_order_create(ds, &c, &o), -EINVAL);
    c.block_size = 4;
    c.window_blocks = 0;
    CHECK_RC(tf_order_create(ds, &c, &o), -EINVAL);
    c.window_blocks = 2;
    c.seq_len = 0;
    CHECK_RC(tf_order_create(ds, &c, &o), -EINVAL);
    c.seq_len = 10;
    c.separator_id = -5;
    CHECK_RC(tf_order_create(ds, &c, &o), -EINVAL);
    c.separator_id = -1;
    c.shuffle = (tf_shuffle)9;
    CHECK_RC(tf_order_create(ds, &c, &o), -EINVAL);
    CHECK(o == NULL);
    tf_order_free(NULL);

    /* fingerprint: each stream-changing field changes it */
    tf_order_config base;
    tf_order_config_init(&base);
    base.seq_len = 10;
    base.shuffle = TF_SHUFFLE_BLOCK;
    base.block_size = 4;
    base.window_blocks = 2;
    base.global_batch = 2;
    base.epochs = 2;
    uint64_t fps[16];
    int nfp = 0;
    for (int field = 0; field < 9; field++) {
        tf_order_config x = base;
        switch (field) {
        case 0: break;
        case 1: x.seq_len = 11; break;
        case 2: x.separator_id = 3; break;
        case 3: x.seed = 1; break;
        case 4: x.shuffle = TF_SHUFFLE_FULL; break;
        case 5: x.block_size = 5; break;
        case 6: x.window_blocks = 3; break;
        case 7: x.global_batch = 4; break;
        case 8: x.epochs = 3; break;
        }
        CHECK_OK(tf_order_create(ds, &x, &o));
        fps[nfp++] = tf_order_fingerprint(o);
        tf_order_free(o);
    }
    for (int a = 0; a < nfp; a++)
        for (int b = a + 1; b < nfp; b++) CHECK(fps[a] != fps[b]);
    /* same config, same fingerprint; BLOCK-only fields ignored under FULL */
    tf_order_config x = base;
    x.shuffle = TF_SHUFFLE_FULL;
    CHECK_OK(tf_order_create(ds, &x, &o));
    uint64_t f1 = tf_order_fingerprint(o);
    tf_order_free(o);
    x.block_size = 99;
    CHECK_OK(tf_order_create(ds, &x, &o));
    CHECK(tf_order_fingerprint(o) == f1 && f1 == fps[4]);
    tf_order_free(o);
    tf_dataset_free(ds);
}

/* tf_order_segments_at: the segments, read back (token value = its position in the
 * dataset, plus 10^6 for a mixture's second source), rebuild every sample, for each
 * packing, a mixture and far positions; tf_order_find_document agrees with them. */
#define SEG_SEP 4000000
#define SEG_PAD 4000001
static tf_dataset *seg_dataset(uint64_t D, uint32_t base, uint64_t seed) {
    uint64_t *ends = malloc(D * sizeof *ends), T = 0;
    for (uint64_t d = 0; d < D; d++) {
        uint64_t len = tf_mix64(seed + d) % 40; /* some documents are empty */
        T += len;
        ends[d] = T;
    }
    uint32_t *tok = malloc(T * sizeof *tok);
    for (uint64_t t = 0; t < T; t++) tok[t] = base + (uint32_t)t;
    tf_dataset *ds = NULL;
    CHECK_OK(tf_dataset_from_memory(tok, T, TF_UINT32, ends, D, 0, &ds));
    free(tok);
    free(ends);
    return ds;
}

static void check_segments(const tf_order *o, const tf_dataset *const *dss, uint64_t pos) {
    tf_order_config c;
    CHECK_OK(tf_order_get_config(o, &c));
    uint64_t L1 = c.seq_len + 1;
    uint32_t *got = malloc(L1 * 4), *want = malloc(L1 * 4);
    tf_segment *seg = malloc(L1 * sizeof *seg);
    size_t n = 0;
    CHECK_OK(tf_order_fill_sample(o, tf_order_sample_at(o, pos), got, TF_UINT32, NULL));
    CHECK_OK(tf_order_segments_at(o, pos, seg, L1, &n));
    for (uint64_t t = 0; t < L1; t++) want[t] = UINT32_MAX; /* no segment: a separator or padding */
    for (size_t i = 0; i < n; i++) {
        uint64_t dstart, dlen;
        CHECK_OK(tf_dataset_document(dss[seg[i].source], seg[i].document, &dstart, &dlen));
        CHECK(seg[i].start < seg[i].stop && seg[i].stop <= dlen && seg[i].offset + seg[i].stop - seg[i].start <= L1);
        for (uint64_t t = seg[i].start; t < seg[i].stop; t++)
            want[seg[i].offset + t - seg[i].start] = (uint32_t)(seg[i].source * 1000000 + dstart + t);
    }
    for (uint64_t t = 0; t < L1; t++) {
        if (want[t] == UINT32_MAX) CHECK(got[t] == SEG_SEP || (c.packing != TF_PACK_CONCAT && got[t] == SEG_PAD));
        else CHECK(got[t] == want[t]);
    }
    if (n > 1) CHECK_RC(tf_order_segments_at(o, pos, seg, 1, &n), -ENOBUFS);
    free(got);
    free(want);
    free(seg);
}

static void test_segments(void) {
    tf_dataset *dss[2] = {seg_dataset(120, 0, 1), seg_dataset(50, 1000000, 2)};
    tf_order_config c;
    tf_order_config_init(&c);
    c.seq_len = 24;
    c.separator_id = SEG_SEP;
    c.pad_id = SEG_PAD;
    c.global_batch = 4;
    c.pack_window = 16;
    for (int k = 0; k < 4; k++) {
        tf_order *o = NULL;
        c.packing = k == 3 ? TF_PACK_BEST_FIT : (tf_packing)k;
        c.shuffle = k == 1 ? TF_SHUFFLE_BLOCK : TF_SHUFFLE_FULL;
        c.block_size = 3;
        if (k < 3) {
            CHECK_OK(tf_order_create(dss[0], &c, &o));
        } else {
            double w[2] = {0.6, 0.4};
            c.mix_window = 10;
            CHECK_OK(tf_order_create_mix((const tf_dataset *const *)dss, w, 2, &c, &o));
        }
        uint64_t N = tf_order_num_samples(o);
        for (uint64_t pos = 0; pos < 2 * N + 5; pos++) check_segments(o, (const tf_dataset *const *)dss, pos);
        check_segments(o, (const tf_dataset *const *)dss, 4000000000000ULL + 7);
        /* find_document == the documents' segments, over two epochs */
        size_t src = k == 3 ? 1 : 0;
        for (uint64_t doc = 0; doc < 50; doc += 7) {
            uint64_t pos_found[512];
            size_t nf = 0, m = 0;
            CHECK_OK(tf_order_find_document(o, src, doc, 0, 2 * N, pos_found, 512, &nf));
            tf_segment seg[32];
            for (uint64_t pos = 0; pos < 2 * N; pos++) {
                size_t n = 0;
                CHECK_OK(tf_order_segments_at(o, pos, seg, 32, &n));
                int has = 0;
                for (size_t i = 0; i < n; i++) has |= seg[i].source == src && seg[i].document == doc;
                if (has) CHECK(m < nf && pos_found[m++] == pos);
            }
            CHECK(m == nf);
        }
        CHECK_RC(tf_order_find_document(o, 2, 0, 0, 10, NULL, 0, &(size_t){0}), -ERANGE);
        CHECK_RC(tf_order_find_document(o, 0, 100000, 0, 10, NULL, 0, &(size_t){0}), -ERANGE);
        tf_order_free(o);
    }
    tf_dataset_free(dss[0]);
    tf_dataset_free(dss[1]);
}

/* ------------------------------------------------------------------------ */
/* C API errors: NULL arguments, states that are not JSON, flags, duplicates */
/* ------------------------------------------------------------------------ */

/* A call that returned -EINVAL for a NULL argument says which function and
 * which argument, never an empty message or the previous call's. */
static void check_null(int rc, const char *fn, const char *arg, int line) {
    char want[160];
    snprintf(want, sizeof want, "%s: the argument %s is NULL", fn, arg);
    if (rc != -EINVAL || !strstr(tf_last_error(), want)) {
        fprintf(stderr, "test_order.c:%d: %s with %s NULL returned %d, message \"%s\"\n", line, fn, arg, rc,
                tf_last_error());
        t_failures++;
    }
}
/* first a failing call, so that a stale message would show */
#define NULL_ARG(call, fn, arg)                                                                    \
    do {                                                                                           \
        tf_order_skip(stale, 3, 1);                                                                \
        check_null((call), fn, arg, __LINE__);                                                     \
    } while (0)

static void test_c_api_errors(void) {
    tf_dataset *ds = flat_dataset(1001);
    tf_order_config c;
    tf_order_config_init(&c);
    c.seq_len = 10;
    c.global_batch = 2;
    tf_order *o = NULL, *stale = NULL, *h = NULL;
    CHECK_OK(tf_order_create(ds, &c, &o));
    CHECK_OK(tf_order_create(ds, &c, &stale));
    uint64_t pos = 0, u = 0, buf64[4];
    size_t n = 0, src = 0;
    char st[4096];
    tf_segment seg[4];
    tf_packing_stats ps;
    tf_dataset_info di;
    tf_file_info fi;
    tf_loader_config lc;
    tf_loader_config_init(&lc);
    lc.order = c;
    lc.batch_size = 2;
    lc.world_size = 1;
    tf_loader *l = NULL;
    CHECK_OK(tf_loader_create(ds, &lc, &l));
    tf_batch *b = NULL;
    int64_t v = 0;
    tf_perm perm;
    const void *ptr = NULL;
    tf_dtype dt;
    double w = 1;
    tf_source_stats ss;
    NULL_ARG(tf_order_create(ds, &c, NULL), "tf_order_create", "out");
    NULL_ARG(tf_order_create_llmc(ds, &c, 1, NULL), "tf_order_create_llmc", "out");
    NULL_ARG(tf_order_create_mix((const tf_dataset *const *)&ds, &w, 1, &c, NULL), "tf_order_create_mix", "out");
    NULL_ARG(tf_order_create_megatron(ds, &c, NULL, NULL), "tf_order_create_megatron", "out");
    NULL_ARG(tf_order_state_save(NULL, 0, 1, st, sizeof st, &n), "tf_order_state_save", "o");
    NULL_ARG(tf_order_state_save(o, 0, 1, NULL, 10, &n), "tf_order_state_save", "buf");
    NULL_ARG(tf_order_state_load(NULL, "{}", 2, 0, &pos, &h), "tf_order_state_load", "o");
    NULL_ARG(tf_order_state_load(o, NULL, 2, 0, &pos, &h), "tf_order_state_load", "state");
    NULL_ARG(tf_order_state_load(o, "{}", 2, 0, NULL, &h), "tf_order_state_load", "pos");
    NULL_ARG(tf_order_state_load(o, "{}", 2, 0, &pos, NULL), "tf_order_state_load", "handover");
    NULL_ARG(tf_order_mix_set_weights(o, 0, &w, 1, NULL), "tf_order_mix_set_weights", "out");
    NULL_ARG(tf_order_mix_set_weights(NULL, 0, &w, 1, &h), "tf_order_mix_set_weights", "o");
    NULL_ARG(tf_order_skip(NULL, 0, 2), "tf_order_skip", "o");
    NULL_ARG(tf_order_get_config(NULL, &c), "tf_order_get_config", "o");
    NULL_ARG(tf_order_get_config(o, NULL), "tf_order_get_config", "cfg");
    NULL_ARG(tf_order_packing_stats(o, NULL), "tf_order_packing_stats", "st");
    NULL_ARG(tf_order_packing_stats(NULL, &ps), "tf_order_packing_stats", "o");
    NULL_ARG(tf_order_fill_sample(o, 0, NULL, TF_UINT32, NULL), "tf_order_fill_sample", "out");
    NULL_ARG(tf_order_segments_at(o, 0, NULL, 4, &n), "tf_order_segments_at", "out");
    NULL_ARG(tf_order_segments_at(o, 0, seg, 4, NULL), "tf_order_segments_at", "n");
    NULL_ARG(tf_order_find_document(NULL, 0, 0, 0, 2, buf64, 4, &n), "tf_order_find_document", "o");
    NULL_ARG(tf_order_row_cost(o, 0, TF_BALANCE_NONE, NULL), "tf_order_row_cost", "cost");
    NULL_ARG(tf_order_balance(o, 0, 1, 1, TF_BALANCE_NONE, NULL, 4, &n), "tf_order_balance", "out");
    NULL_ARG(tf_order_mix_source_at(o, 0, NULL, &u), "tf_order_mix_source_at", "source");
    NULL_ARG(tf_order_mix_source_at(o, 0, &src, NULL), "tf_order_mix_source_at", "index");
    NULL_ARG(tf_perm_init(NULL, 10, 1), "tf_perm_init", "p");
    NULL_ARG(tf_config_set(TF_SCOPE_ORDER, NULL, "seed", 1), "tf_config_set", "cfg");
    NULL_ARG(tf_config_get(TF_SCOPE_ORDER, &c, "seed", NULL), "tf_config_get", "value");
    NULL_ARG(tf_dataset_get_info(NULL, &di), "tf_dataset_get_info", "ds");
    NULL_ARG(tf_dataset_get_file(ds, 0, NULL), "tf_dataset_get_file", "info");
    NULL_ARG(tf_dataset_read(NULL, 0, 1, buf64, TF_UINT32), "tf_dataset_read", "ds");
    NULL_ARG(tf_dataset_read(ds, 0, 1, NULL, TF_UINT32), "tf_dataset_read", "out");
    NULL_ARG(tf_dataset_document(ds, 0, NULL, &u), "tf_dataset_document", "start");
    NULL_ARG(tf_dataset_find_document(ds, 0, NULL), "tf_dataset_find_document", "doc");
    NULL_ARG(tf_dataset_view(ds, 0, 1, NULL, &dt), "tf_dataset_view", "ptr");
    NULL_ARG(tf_dataset_verify(NULL, 1, NULL, NULL), "tf_dataset_verify", "ds");
    NULL_ARG(tf_dataset_open("/nonexistent", NULL, NULL), "tf_dataset_open", "out");
    NULL_ARG(tf_dataset_from_memory(buf64, 1, TF_UINT32, NULL, 0, 0, NULL), "tf_dataset_from_memory", "out");
    NULL_ARG(tf_loader_create(ds, &lc, NULL), "tf_loader_create", "out");
    NULL_ARG(tf_loader_create_from_order(o, &lc, NULL), "tf_loader_create_from_order", "out");
    NULL_ARG(tf_loader_next(NULL, &b), "tf_loader_next", "l");
    NULL_ARG(tf_loader_next(l, NULL), "tf_loader_next", "out");
    NULL_ARG(tf_loader_seek(NULL, 0), "tf_loader_seek", "l");
    NULL_ARG(tf_loader_get_source_stats(NULL, 0, &ss), "tf_loader_get_source_stats", "l");
    NULL_ARG(tf_loader_state_save(NULL, st, sizeof st, &n), "tf_loader_state_save", "l");
    NULL_ARG(tf_loader_state_load(l, NULL, 2, 0), "tf_loader_state_load", "state");
    NULL_ARG(tf_writer_create("/nonexistent", NULL, NULL), "tf_writer_create", "out");
    NULL_ARG(tf_writer_add_document(NULL, buf64, 1, TF_UINT32), "tf_writer_add_document", "w");
    NULL_ARG(tf_writer_finish(NULL), "tf_writer_finish", "w");
    NULL_ARG(tf_remote_create(NULL, NULL, NULL), "tf_remote_create", "out");
    NULL_ARG(tf_remote_stat(NULL, "s3://b/k", NULL), "tf_remote_stat", "r");
    NULL_ARG(tf_cache_info_get(NULL, NULL), "tf_cache_info_get", "dir");
    NULL_ARG(tf_cache_prune(NULL, 0), "tf_cache_prune", "dir");
    NULL_ARG(tf_device_loader_create(l, NULL, NULL), "tf_device_loader_create", "out");
    NULL_ARG(tf_device_loader_seek(NULL, 0), "tf_device_loader_seek", "d");
    NULL_ARG(tf_device_loader_start(NULL), "tf_device_loader_start", "d");
    NULL_ARG(tf_device_batch_wait(NULL, 0), "tf_device_batch_wait", "b");
    NULL_ARG(tf_device_batch_synchronize(NULL), "tf_device_batch_synchronize", "b");
    (void)perm;
    (void)ptr;
    (void)fi;
    (void)v;

    /* cap 0 sizes the state: -ENOSPC with the length */
    CHECK_RC(tf_order_state_save(o, 0, 1, NULL, 0, &n), -ENOSPC);
    CHECK(n > 0 && n < sizeof st);
    CHECK_OK(tf_order_state_save(o, 4, 1, st, sizeof st, &n));

    /* a state that is not JSON: -TF_ESTATE with the parser's sentence */
    tf_order_skip(stale, 3, 1);
    CHECK_RC(tf_order_state_load(o, "not json", 8, 0, &pos, &h), -TF_ESTATE);
    CHECK(strstr(tf_last_error(), "not valid JSON") != NULL);
    CHECK_RC(tf_order_state_load(o, "{\"position\": NaN}", 17, 0, &pos, &h), -TF_ESTATE);
    CHECK(strstr(tf_last_error(), "NaN") != NULL);

    /* flags other than TF_STATE_LENIENT are refused, by the loader too */
    CHECK_RC(tf_order_state_load(o, st, n, 0x10, &pos, &h), -EINVAL);
    CHECK(strstr(tf_last_error(), "TF_STATE_LENIENT") != NULL);
    CHECK_RC(tf_loader_state_load(l, st, n, TF_STATE_LENIENT | 0x4), -EINVAL);
    CHECK_OK(tf_order_state_load(o, st, n, TF_STATE_LENIENT, &pos, &h));
    CHECK(pos == 4 && h == NULL);

    /* a key twice in one object is refused, whichever value comes first */
    char dup[4200];
    const char *at = strstr(st, "\"position\": 4");
    CHECK(at != NULL);
    if (at) {
        int k = snprintf(dup, sizeof dup, "%.*s\"position\": 6, %s", (int)(at - st), st, at);
        CHECK_RC(tf_order_state_load(o, dup, (size_t)k, 0, &pos, &h), -TF_ESTATE);
        CHECK(strstr(tf_last_error(), "\"position\" appears twice") != NULL);
    }
    /* a C message names the C flag (Python's strict=False only besides it) */
    char edited[4200];
    at = strstr(st, "\"config_fingerprint\": \"");
    if (at) {
        snprintf(edited, sizeof edited, "%s", st);
        char *fp = edited + (at - st) + strlen("\"config_fingerprint\": \"");
        fp[0] = fp[0] == '0' ? '1' : '0';
        CHECK_RC(tf_order_state_load(o, edited, n, 0, &pos, &h), -TF_ESTATE);
        CHECK(strstr(tf_last_error(), "TF_STATE_LENIENT") != NULL);
    }
    tf_loader_free(l);
    tf_order_free(stale);
    tf_order_free(o);
    tf_dataset_free(ds);
}

/* The weights a mixture was given: one entry per position where a change took
 * effect (a second call at one position replaces the first), the same in every
 * order of a run however they branch. */
static int history_is(const tf_order *o, const char *want) {
    char st[8192];
    size_t n = 0;
    if (tf_order_state_save(o, 0, 1, st, sizeof st, &n)) return 0;
    const char *h = strstr(st, "\"weights_history\": ");
    if (!h || strncmp(h + 19, want, strlen(want))) {
        fprintf(stderr, "weights_history: want %s, state %s\n", want, h ? h : st);
        return 0;
    }
    return 1;
}

/* Positions [a, b) of o read what ref reads there: the same source, index,
 * counts and sample. */
static int same_past(const tf_order *o, const tf_order *ref, uint64_t a, uint64_t b) {
    for (uint64_t p = a; p < b; p++) {
        size_t s1 = 9, s2 = 8;
        uint64_t j1 = 0, j2 = 1;
        if (tf_order_mix_source_at(o, p, &s1, &j1) || tf_order_mix_source_at(ref, p, &s2, &j2) || s1 != s2 ||
            j1 != j2 || tf_order_sample_at(o, p) != tf_order_sample_at(ref, p)) {
            fprintf(stderr, "position %llu: source %zu index %llu, want %zu %llu (%s)\n", (unsigned long long)p, s1,
                    (unsigned long long)j1, s2, (unsigned long long)j2, tf_last_error());
            return 0;
        }
        for (size_t k = 0; k < 2; k++)
            if (tf_order_mix_source_count(o, k, p) != tf_order_mix_source_count(ref, k, p)) return 0;
    }
    return 1;
}

static void test_weights_history(void) {
    tf_dataset *ds[2] = {flat_dataset(1001), flat_dataset(2001)};
    tf_order_config c;
    tf_order_config_init(&c);
    c.seq_len = 10;
    c.global_batch = 2;
    double w0[2] = {0.5, 0.5}, w1[2] = {0.25, 0.75}, w2[2] = {0.75, 0.25}, w3[2] = {1, 0}, w4[2] = {0, 1};
    tf_order *o = NULL, *o1 = NULL, *o2 = NULL, *o3 = NULL, *o4 = NULL, *o5 = NULL, *same = NULL;
    CHECK_OK(tf_order_create_mix((const tf_dataset *const *)ds, w0, 2, &c, &o));
    CHECK_OK(tf_order_mix_set_weights(o, 0, w1, 2, &o1));
    CHECK_OK(tf_order_mix_set_weights(o1, 4, w2, 2, &o2));
    CHECK_OK(tf_order_mix_set_weights(o1, 8, w3, 2, &o3)); /* from o1 again: a branch */
    CHECK_OK(tf_order_mix_set_weights(o2, 4, w4, 2, &o4)); /* o2's position again: replaces */
    CHECK_OK(tf_order_mix_set_weights(o2, 6, w3, 2, &o5));
    CHECK(history_is(o, "null"));
    CHECK(history_is(o1, "[[0, [0.25, 0.75]]]"));
    CHECK(history_is(o2, "[[0, [0.25, 0.75]], [4, [0.75, 0.25]]]"));
    CHECK(history_is(o3, "[[0, [0.25, 0.75]], [8, [1.0, 0.0]]]"));
    CHECK(history_is(o4, "[[0, [0.25, 0.75]], [4, [0.0, 1.0]]]"));
    CHECK(history_is(o5, "[[0, [0.25, 0.75]], [4, [0.75, 0.25]], [6, [1.0, 0.0]]]"));
    /* 1,000 calls at one position: still one entry */
    for (int i = 0; i < 1000; i++) {
        double w[2] = {i % 2 ? 0.25 : 0.75, i % 2 ? 0.75 : 0.25};
        tf_order *next = NULL;
        CHECK_OK(tf_order_mix_set_weights(same ? same : o5, 8, w, 2, &next));
        tf_order_free(same);
        same = next;
    }
    CHECK(history_is(same, "[[0, [0.25, 0.75]], [4, [0.75, 0.25]], [6, [1.0, 0.0]], [8, [0.25, 0.75]]]"));
    CHECK(history_is(o5, "[[0, [0.25, 0.75]], [4, [0.75, 0.25]], [6, [1.0, 0.0]]]"));
    /* a resumed state lists the same */
    char st[8192];
    size_t n = 0;
    uint64_t pos = 0;
    tf_order *h = NULL;
    CHECK_OK(tf_order_state_save(same, 8, 1, st, sizeof st, &n));
    CHECK_OK(tf_order_state_load(o, st, n, 0, &pos, &h));
    CHECK(pos == 8 && h && history_is(h, "[[0, [0.25, 0.75]], [4, [0.75, 0.25]], [6, [1.0, 0.0]], [8, [0.25, 0.75]]]"));
    /* the positions before each change read what the order of that time read: on
     * the orders of the run, on a branch, and on the resumed one */
    CHECK(same_past(o5, o1, 0, 4) && same_past(o5, o2, 4, 6) && same_past(o5, o5, 6, 40));
    CHECK(same_past(o3, o1, 0, 8) && same_past(o4, o1, 0, 4) && same_past(o2, o1, 0, 4));
    CHECK(same_past(h, o1, 0, 4) && same_past(h, o2, 4, 6) && same_past(h, o5, 6, 8) && same_past(h, same, 0, 40));
    /* resumed into an order of other weights: the state's weights_initial stands for them */
    tf_order *other = NULL, *h2 = NULL;
    CHECK_OK(tf_order_create_mix((const tf_dataset *const *)ds, w2, 2, &c, &other));
    CHECK_OK(tf_order_state_load(other, st, n, 0, &pos, &h2));
    CHECK(h2 && same_past(h2, same, 0, 40));
    tf_order_free(h2);
    /* without it (an older state) the order's own weights stand for the first ones, checked
     * against the recorded anchor: another base is refused with the reason, and from the last
     * change on it answers (o5's first change is at 0, where any base has delivered nothing) */
    tf_order *p1 = NULL, *p2 = NULL;
    CHECK_OK(tf_order_mix_set_weights(o, 6, w1, 2, &p1));
    CHECK_OK(tf_order_mix_set_weights(p1, 10, w2, 2, &p2));
    CHECK_OK(tf_order_state_save(p2, 10, 1, st, sizeof st, &n));
    char *cut = strstr(st, ", \"weights_initial\": "), *end = cut ? strstr(cut, ", \"order\"") : NULL;
    CHECK(cut && end);
    if (cut && end) memmove(cut, end, strlen(end) + 1);
    n = strlen(st);
    CHECK_OK(tf_order_state_load(o, st, n, 0, &pos, &h2));
    CHECK(h2 && same_past(h2, o, 0, 6) && same_past(h2, p1, 6, 10) && same_past(h2, p2, 0, 40));
    tf_order_free(h2);
    CHECK_OK(tf_order_state_load(other, st, n, 0, &pos, &h2));
    size_t src = 0;
    uint64_t idx = 0;
    CHECK_RC(tf_order_mix_source_at(h2, 7, &src, &idx), -TF_ESTATE);
    CHECK(strstr(tf_last_error(), "step 3 is before the mixture's last weight change (step 5)") != NULL);
    CHECK(tf_order_mix_source_count(h2, 0, 7) == UINT64_MAX && tf_order_sample_at(h2, 7) == UINT64_MAX);
    CHECK(same_past(h2, p2, 10, 40));
    tf_order_free(h2);
    tf_order_free(p2);
    tf_order_free(p1);
    tf_order_free(other);
    tf_order_free(h);
    tf_order_free(same);
    tf_order_free(o5);
    tf_order_free(o4);
    tf_order_free(o3);
    tf_order_free(o2);
    tf_order_free(o1);
    tf_order_free(o);
    tf_dataset_free(ds[0]);
    tf_dataset_free(ds[1]);
}

/* llm.c's order with llmc_processes 0 (None): the data-parallel size, which
 * tf_loader_create takes from world_size; an order built on its own does not
 * know it and refuses, rather than reading one process's order. */
static void test_llmc_processes_none(void) {
    tf_dataset *ds = flat_dataset(20001);
    tf_loader_config lc;
    tf_loader_config_init(&lc);
    tf_order_config_init(&lc.order);
    lc.order.seq_len = 10;
    lc.order.order = TF_ORDER_LLMC;
    lc.order.shuffle = TF_SHUFFLE_FULL;
    lc.order.seed = 42;
    lc.batch_size = 2;
    lc.world_size = 2;
    lc.order.llmc_processes = 0;
    tf_loader *none = NULL, *two = NULL;
    CHECK_OK(tf_loader_create(ds, &lc, &none));
    lc.order.llmc_processes = 2;
    CHECK_OK(tf_loader_create(ds, &lc, &two));
    char a[4096], b[4096];
    size_t na = 0, nb = 0;
    if (none && two) {
        CHECK_OK(tf_loader_state_save(none, a, sizeof a, &na));
        CHECK_OK(tf_loader_state_save(two, b, sizeof b, &nb));
        CHECK(na == nb && !memcmp(a, b, na)); /* the same configuration and fingerprint */
        CHECK(strstr(a, "\"llmc_processes\": 2") != NULL);
        CHECK_OK(tf_loader_state_load(two, a, na, 0)); /* each accepts the other's state */
        CHECK_OK(tf_loader_state_load(none, b, nb, 0));
        for (int k = 0; k < 6; k++) { /* and reads the same batches: two processes' order */
            tf_batch *x = NULL, *y = NULL;
            CHECK_OK(tf_loader_next(none, &x));
            CHECK_OK(tf_loader_next(two, &y));
            if (!x || !y) break;
            tf_batch_view vx, vy;
            tf_batch_get_view(x, &vx);
            tf_batch_get_view(y, &vy);
            CHECK(vx.rows == vy.rows && vx.dtype == vy.dtype &&
                  !memcmp(vx.tokens, vy.tokens, vx.rows * (vx.seq_len + 1) * tf_dtype_size(vx.dtype)));
            tf_batch_release(x);
            tf_batch_release(y);
        }
    }
    tf_order_config c = lc.order;
    c.global_batch = 4;
    c.llmc_processes = 0;
    tf_order *o = NULL;
    CHECK_RC(tf_order_create(ds, &c, &o), -EINVAL);
    CHECK(strstr(tf_last_error(), "llmc_processes") && strstr(tf_last_error(), "world_size"));
    tf_loader_free(none);
    tf_loader_free(two);
    tf_dataset_free(ds);
}

/* ------------------------------------------------------------------------ */
/* documents taken down mid-run (tf_order_exclude) and the state            */
/* ------------------------------------------------------------------------ */

static int load_text(const tf_order *o, const char *text) {
    uint64_t pos;
    tf_order *h = NULL;
    int rc = tf_order_state_load(o, text, strlen(text), 0, &pos, &h);
    tf_order_free(h);
    return rc;
}

/* The C loader leaves taken-down documents out itself: after tf_loader_exclude
 * (and after a resume of the state that records it) their tokens are pad_id
 * and their labels' loss_mask 0; every other token, and the positions, are
 * those of the loader without the takedown. Token values name documents
 * (document d holds d + 1). */
static int in_ids(uint64_t v, const uint64_t *ids, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (ids[i] == v) return 1;
    return 0;
}

static void test_loader_takes_documents_down(void) {
    enum { D = 60, L = 12, B = 3, STEPS = 8, AT = 2 };
    uint16_t t[D * 20];
    uint64_t ends[D], n = 0;
    for (uint64_t d = 0; d < D; d++) {
        uint64_t len = 1 + (d * 7) % 19;
        for (uint64_t k = 0; k < len; k++) t[n++] = (uint16_t)(d + 1);
        ends[d] = n;
    }
    tf_dataset *ds = NULL;
    CHECK_OK(tf_dataset_from_memory(t, n, TF_UINT16, ends, D, 0, &ds));
    if (!ds) return;
    for (int packing = 0; packing < 2; packing++) {
        tf_loader_config lc;
        tf_loader_config_init(&lc);
        tf_order_config_init(&lc.order);
        lc.order.seq_len = L;
        lc.order.seed = 9;
        lc.order.pad_id = 0;
        if (packing) lc.order.packing = TF_PACK_BEST_FIT;
        lc.batch_size = B;
        lc.want = TF_WANT_LOSS_MASK | TF_WANT_POSITION_IDS;
        tf_loader *plain = NULL, *l = NULL, *resumed = NULL;
        CHECK_OK(tf_loader_create(ds, &lc, &plain));
        CHECK_OK(tf_loader_create(ds, &lc, &l));
        CHECK_OK(tf_loader_create(ds, &lc, &resumed));
        if (!plain || !l || !resumed) break;
        const uint64_t gone[] = {3, 17, 18, 41, 59};
        char st[8192];
        size_t len = 0;
        int touched = 0;
        for (int k = 0; k < STEPS; k++) {
            if (k == AT) {
                uint64_t bad = D;
                CHECK_RC(tf_loader_exclude(l, 0, &bad, 1), -EINVAL); /* refused, nothing changed */
                CHECK(tf_order_num_excluded(tf_loader_order(l)) == 0);
                CHECK_OK(tf_loader_exclude(l, 0, gone, 5));
                CHECK_OK(tf_loader_state_save(l, st, sizeof st, &len));
                CHECK(strstr(st, "\"excluded\": [[6, 0, [3, 17, 18, 41, 59]]]") != NULL);
                CHECK_OK(tf_loader_state_load(resumed, st, len, 0));
            }
            tf_batch *x = NULL, *y = NULL, *z = NULL;
            CHECK_OK(tf_loader_next(plain, &x));
            CHECK_OK(tf_loader_next(l, &y));
            if (k >= AT) CHECK_OK(tf_loader_next(resumed, &z));
            if (!x || !y || (k >= AT && !z)) break;
            tf_batch_view a, b;
            tf_batch_get_view(x, &a);
            tf_batch_get_view(y, &b);
            const uint16_t *pa = a.tokens, *pb = b.tokens;
            for (uint64_t r = 0; r < B; r++)
                for (uint64_t i = 0; i <= L; i++) {
                    uint16_t v = pa[r * (L + 1) + i], w = pb[r * (L + 1) + i];
                    int out = k >= AT && v && in_ids(v - 1u, gone, 5);
                    touched += out;
                    CHECK(w == (out ? 0 : v));
                    if (i < L) {
                        uint16_t lab = pa[r * (L + 1) + i + 1];
                        int lab_out = k >= AT && lab && in_ids(lab - 1u, gone, 5);
                        CHECK(b.loss_mask[r * L + i] == (lab_out ? 0 : a.loss_mask[r * L + i]));
                        CHECK(b.position_ids[r * L + i] == a.position_ids[r * L + i]);
                    }
                }
            if (z) { /* the resumed state serves the same batches */
                tf_batch_view c;
                tf_batch_get_view(z, &c);
                CHECK(!memcmp(c.tokens, b.tokens, B * (L + 1) * sizeof(uint16_t)));
                CHECK(!memcmp(c.loss_mask, b.loss_mask, B * L));
            }
            tf_batch_release(x);
            tf_batch_release(y);
            tf_batch_release(z);
        }
        CHECK(touched > 0);
        tf_loader_free(plain);
        tf_loader_free(l);
        tf_loader_free(resumed);
    }
    tf_dataset_free(ds);
}

static void test_excluded_state(void) {
    enum { T = 1000, D = 40 };
    uint16_t *t = malloc(T * sizeof *t);
    uint64_t ends[D];
    for (uint64_t i = 0; i < T; i++) t[i] = (uint16_t)(i % 700);
    for (uint64_t d = 0; d < D; d++) ends[d] = (d + 1) * (T / D);
    tf_dataset *ds = NULL;
    CHECK_OK(tf_dataset_from_memory(t, T, TF_UINT16, ends, D, 0, &ds));
    free(t);
    tf_order_config c;
    tf_order_config_init(&c);
    c.seq_len = 10;
    c.global_batch = 4;
    c.seed = 5;
    tf_order *o = NULL, *fresh = NULL;
    CHECK_OK(tf_order_create(ds, &c, &o));
    CHECK_OK(tf_order_create(ds, &c, &fresh));
    if (!o || !fresh) return;
    /* refused: another source, a document past the dataset's */
    uint64_t past[] = {3, D};
    CHECK_RC(tf_order_exclude(o, 8, 1, past, 1), -EINVAL);
    CHECK(strstr(tf_last_error(), "source 1") != NULL);
    CHECK_RC(tf_order_exclude(o, 8, 0, past, 2), -EINVAL);
    CHECK(strstr(tf_last_error(), "document 40") != NULL);
    CHECK(tf_order_num_excluded(o) == 0);
    /* kept sorted and distinct, entry by entry */
    uint64_t ids[] = {9, 2, 9, 30};
    CHECK_OK(tf_order_exclude(o, 8, 0, ids, 4));
    CHECK_OK(tf_order_exclude(o, 12, 0, ids + 3, 1));
    uint64_t at;
    size_t src, n;
    const uint64_t *got;
    CHECK(tf_order_num_excluded(o) == 2);
    CHECK_OK(tf_order_excluded(o, 0, &at, &src, &got, &n));
    CHECK(at == 8 && src == 0 && n == 3 && got[0] == 2 && got[1] == 9 && got[2] == 30);
    CHECK_RC(tf_order_excluded(o, 2, &at, &src, &got, &n), -ERANGE);
    /* saved in the state, and restored on a fresh order */
    char st[4096];
    size_t len;
    CHECK_OK(tf_order_state_save(o, 16, 1, st, sizeof st, &len));
    CHECK(strstr(st, "\"excluded\": [[8, 0, [2, 9, 30]], [12, 0, [30]]]") != NULL);
    uint64_t pos;
    tf_order *h = NULL;
    CHECK_OK(tf_order_state_load(fresh, st, len, 0, &pos, &h));
    CHECK(!h && pos == 16 && tf_order_num_excluded(fresh) == 2);
    CHECK_OK(tf_order_excluded(fresh, 1, &at, &src, &got, &n));
    CHECK(at == 12 && n == 1 && got[0] == 30);
    /* the stream is unchanged: the same samples at every position */
    for (uint64_t p = 0; p < 50; p++) CHECK(tf_order_sample_at(o, p) == tf_order_sample_at(fresh, p));
    /* hostile states: each refused with a sentence naming excluded, nothing changed */
    char bad[4096];
    const char *cut = strstr(st, "\"excluded\": ");
    const char *rest = strstr(st, ", \"weights_history\"");
    static const char *const attacks[][2] = {
        {"[[0, 0, [40]]]", "document 40 of source 0"},
        {"[[0, 3, [1]]]", "names source 3"},
        {"[[0, 18446744073709551615, [1]]]", "names source"},
        {"[[0, 0, [4, 4]]]", "ascending and distinct"},
        {"[[0, 0, [5, 1]]]", "ascending and distinct"},
        {"[[0, 0, [\"1\"]]]", "excluded document id"},
        {"[[0, 0, [-1]]]", "excluded document id"},
        {"[[0, 0, [1e30]]]", "excluded document id"},
        {"[[0, 0, [99999999999999999999999]]]", "excluded"},
        {"[[-1, 0, [1]]]", "excluded position"},
        {"[[0, 0]]", "excluded"},
        {"{\"0\": 1}", "excluded"},
        {"true", "excluded"},
    };
    for (size_t a = 0; cut && rest && a < sizeof attacks / sizeof *attacks; a++) {
        snprintf(bad, sizeof bad, "%.*s\"excluded\": %s%s", (int)(cut - st), st, attacks[a][0], rest);
        CHECK_RC(load_text(fresh, bad), -TF_ESTATE);
        if (!strstr(tf_last_error(), attacks[a][1])) fprintf(stderr, "attack %s: %s\n", attacks[a][0], tf_last_error());
        CHECK(strstr(tf_last_error(), attacks[a][1]) != NULL);
    }
    CHECK(tf_order_num_excluded(fresh) == 2); /* a refused state changes nothing */
    /* a huge count: more entries than a state may hold */
    size_t cap = 4097 * 16 + 4096;
    char *big = malloc(cap);
    size_t k = (size_t)snprintf(big, cap, "%.*s\"excluded\": [", (int)(cut - st), st);
    for (unsigned i = 0; i <= TF_STATE_MAX_EXCLUDED; i++) k += (size_t)snprintf(big + k, cap - k, "%s[0, 0, [1]]", i ? ", " : "");
    snprintf(big + k, cap - k, "]%s", rest);
    CHECK_RC(load_text(fresh, big), -TF_ESTATE);
    CHECK(strstr(tf_last_error(), "TF_STATE_MAX_EXCLUDED") != NULL);
    free(big);
    /* an old state (no excluded key) loads, with no takedowns */
    snprintf(bad, sizeof bad, "%.*s%s", (int)(cut - st - 2), st, rest);
    tf_order *old = NULL;
    CHECK_OK(tf_order_create(ds, &c, &old));
    CHECK_OK(load_text(old, bad));
    CHECK(tf_order_num_excluded(old) == 0);
    /* an order full of takedowns refuses one more */
    for (unsigned i = 1; i < TF_STATE_MAX_EXCLUDED; i++) CHECK_OK(tf_order_exclude(old, 0, 0, ids, 1));
    CHECK(tf_order_num_excluded(old) == TF_STATE_MAX_EXCLUDED - 1);
    CHECK_OK(tf_order_exclude(old, 0, 0, ids, 1));
    CHECK_RC(tf_order_exclude(old, 0, 0, ids, 1), -EINVAL);
    CHECK(strstr(tf_last_error(), "TF_STATE_MAX_EXCLUDED") != NULL);
    /* and its state loads again */
    size_t need = 0;
    tf_order_state_save(old, 0, 1, NULL, 0, &need);
    char *full = malloc(need + 1);
    CHECK_OK(tf_order_state_save(old, 0, 1, full, need + 1, &need));
    CHECK_OK(load_text(fresh, full));
    CHECK(tf_order_num_excluded(fresh) == TF_STATE_MAX_EXCLUDED);
    free(full);
    tf_order_free(old);
    tf_order_free(o);
    tf_order_free(fresh);
    tf_dataset_free(ds);
}

int main(void) {
    test_segments();
    test_perm_bijection();
    test_shuffles();
    test_packing();
    test_multi_file();
    test_multi_shard();
    test_positions_and_errors();
    test_c_api_errors();
    test_weights_history();
    test_llmc_processes_none();
    test_excluded_state();
    test_loader_takes_documents_down();
    return T_DONE();
}
