/* Megatron's GPTDataset order (tf_order_create_megatron) through the C API.
 *
 * The arrays are made here as megatron-core makes them: a document index of
 * every document for each epoch, shuffled; the sample index by
 * build_sample_idx (megatron/core/datasets/helpers.cpp) written out; a
 * shuffled sample order. The reference sample is GPTDataset's
 * _query_document_sample_shuffle_indices written out. For int32 and int64
 * arrays, with and without the extra token, every sample a loader gives
 * equals the reference; a state saved at a step resumes there and is
 * refused by an order over another cache; a cache that does not fit the
 * data or seq_len is refused at create. The same cache written as GPTDataset
 * writes it (.npy files in a cache directory) is read through the settings
 * (order megatron, megatron_cache) and gives the same stream and states.
 * (tests/order/test_megatron_order.py compares with megatron-core itself.) */
#include "helpers.h"

#define NDOCS 90
#define EPOCHS 2
#define L 16

static int32_t sizes[NDOCS];
static uint16_t *text; /* the .bin's tokens */
static uint64_t doc_start[NDOCS + 1];

/* n <= NDOCS documents; the last file written is the one the caches index. */
static void write_megatron(const char *prefix, uint64_t seed, int n_docs) {
    uint64_t st = seed, total = 0;
    for (int d = 0; d < n_docs; d++) {
        sizes[d] = (int32_t)(1 + t_xorshift(&st) % 40);
        doc_start[d] = total;
        total += (uint64_t)sizes[d];
    }
    doc_start[n_docs] = total;
    free(text);
    text = malloc(total * 2);
    for (uint64_t i = 0; i < total; i++) text[i] = (uint16_t)(t_xorshift(&st) % 50000);
    char p[512];
    snprintf(p, sizeof p, "%s.bin", prefix);
    t_write_file(p, text, total * 2);
    /* MMIDIDX v1: header, sizes, byte pointers, document indices */
    size_t n = 34 + (size_t)n_docs * 12 + (size_t)(n_docs + 1) * 8;
    uint8_t *idx = calloc(1, n), *q = idx;
    memcpy(q, "MMIDIDX\0\0", 9);
    uint64_t v = 1, cnt = (uint64_t)n_docs, dcnt = (uint64_t)n_docs + 1;
    memcpy(q + 9, &v, 8);
    q[17] = 8; /* uint16 */
    memcpy(q + 18, &cnt, 8);
    memcpy(q + 26, &dcnt, 8);
    q += 34;
    memcpy(q, sizes, (size_t)n_docs * 4);
    q += n_docs * 4;
    for (int d = 0; d < n_docs; d++, q += 8) {
        int64_t ptr = (int64_t)doc_start[d] * 2;
        memcpy(q, &ptr, 8);
    }
    for (int64_t d = 0; d <= n_docs; d++, q += 8) memcpy(q, &d, 8);
    snprintf(p, sizeof p, "%s.idx", prefix);
    t_write_file(p, idx, n);
    free(idx);
}

static void shuffle64(int64_t *a, uint64_t n, uint64_t *st) {
    for (uint64_t i = n - 1; i > 0; i--) {
        uint64_t j = t_xorshift(st) % (i + 1);
        int64_t t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}

/* GPTDataset's three arrays (as int64) for seq_len L and extra token X. */
typedef struct cache {
    int64_t doc[NDOCS * EPOCHS];
    int64_t *smp; /* (N + 1) x 2 */
    int64_t *shf; /* N */
    uint64_t N;
} cache;

static void build_cache(cache *c, int X, uint64_t seed) {
    uint64_t st = seed;
    for (int e = 0; e < EPOCHS; e++)
        for (int d = 0; d < NDOCS; d++) c->doc[e * NDOCS + d] = d;
    shuffle64(c->doc, NDOCS * EPOCHS, &st);
    int64_t tokens = (int64_t)doc_start[NDOCS] * EPOCHS;
    c->N = (uint64_t)((tokens - X) / L);
    c->smp = malloc((c->N + 1) * 2 * sizeof *c->smp);
    c->shf = malloc(c->N * sizeof *c->shf);
    /* helpers.cpp build_sample_idx, drop_last_partial_sequence = true */
    int64_t si = 0, di = 0, off = 0;
    c->smp[0] = 0;
    c->smp[1] = 0;
    for (si = 1; si <= (int64_t)c->N; si++) {
        int64_t remaining = L + X;
        while (remaining != 0) {
            int64_t len = sizes[c->doc[di]] - off;
            remaining -= len;
            if (remaining <= 0) {
                off += remaining + len - X;
                remaining = 0;
            } else {
                if (di == NDOCS * EPOCHS - 1) {
                    off = sizes[c->doc[di]] - X;
                    break;
                }
                di++;
                off = 0;
            }
        }
        c->smp[2 * si] = di;
        c->smp[2 * si + 1] = off;
    }
    for (uint64_t i = 0; i < c->N; i++) c->shf[i] = (int64_t)i;
    shuffle64(c->shf, c->N, &st);
}

/* GPTDataset's text of item i (L + X tokens), then the last label (0) without X. */
static void reference(const cache *c, int X, uint64_t i, uint16_t *out) {
    int64_t s = c->shf[i], d0 = c->smp[2 * s], o0 = c->smp[2 * s + 1], d1 = c->smp[2 * s + 2], o1 = c->smp[2 * s + 3];
    size_t k = 0;
    for (int64_t d = d0; d <= d1; d++) {
        int64_t a = d == d0 ? o0 : 0, b = d < d1 ? sizes[c->doc[d]] : o1 + X;
        for (int64_t t = a; t < b; t++) out[k++] = text[doc_start[c->doc[d]] + (uint64_t)t];
    }
    while (k < L + 1) out[k++] = 0;
}

static void describe(const cache *c, int X, int narrow, int32_t *d32, int32_t *s32, uint32_t *h32,
                     tf_megatron_index *ix) {
    if (!narrow) {
        *ix = (tf_megatron_index){c->doc, TF_INT64, NDOCS * EPOCHS, c->smp, TF_INT64, c->N + 1, c->shf, TF_INT64,
                                  c->N, X};
        return;
    }
    for (uint64_t i = 0; i < NDOCS * EPOCHS; i++) d32[i] = (int32_t)c->doc[i];
    for (uint64_t i = 0; i < 2 * (c->N + 1); i++) s32[i] = (int32_t)c->smp[i];
    for (uint64_t i = 0; i < c->N; i++) h32[i] = (uint32_t)c->shf[i];
    *ix = (tf_megatron_index){d32, TF_INT32, NDOCS * EPOCHS, s32, TF_INT32, c->N + 1, h32, TF_UINT32, c->N, X};
}

static tf_order *make(tf_dataset *ds, const tf_megatron_index *ix, uint64_t seq_len) {
    tf_order_config oc;
    tf_order_config_init(&oc);
    oc.seq_len = seq_len;
    oc.shuffle = TF_SHUFFLE_NONE;
    oc.global_batch = 4;
    oc.epochs = 1;
    tf_order *o = NULL;
    tf_order_create_megatron(ds, &oc, ix, &o);
    return o;
}

static tf_loader *loader_of(tf_order *o) {
    tf_loader_config lc;
    tf_loader_config_init(&lc);
    lc.batch_size = 4;
    lc.num_threads = 2;
    lc.out_dtype = TF_UINT16;
    tf_loader *l = NULL;
    CHECK_OK(tf_loader_create_from_order(o, &lc, &l));
    return l;
}

/* Batch k of the loader against the reference's items 4k .. 4k + 3. */
static int same_batch(tf_loader *l, const cache *c, int X, uint64_t k) {
    tf_batch *b = NULL;
    if (tf_loader_next(l, &b) != 0 || !b) return 0;
    tf_batch_view v;
    tf_batch_get_view(b, &v);
    int ok = v.rows == 4 && v.position == 4 * k;
    uint16_t want[L + 1];
    for (uint64_t r = 0; ok && r < 4; r++) {
        reference(c, X, 4 * k + r, want);
        ok = !memcmp((const uint16_t *)v.tokens + r * (L + 1), want, sizeof want);
    }
    tf_batch_release(b);
    return ok;
}

static void compare(tf_dataset *ds, int X, int narrow, uint64_t seed) {
    static cache c, other;
    static int32_t d32[NDOCS * EPOCHS], s32[4096];
    static uint32_t h32[2048];
    build_cache(&c, X, seed);
    CHECK(c.N < 2000);
    tf_megatron_index ix;
    describe(&c, X, narrow, d32, s32, h32, &ix);
    tf_order *o = make(ds, &ix, L);
    CHECK(o && tf_order_num_samples(o) == c.N);
    if (!o) return;
    tf_loader *l = loader_of(o);
    uint64_t steps = c.N / 4, at = steps / 2;
    char state[4096] = "";
    for (uint64_t k = 0; l && k < steps; k++) {
        if (k == at) CHECK_OK(tf_loader_state_save(l, state, sizeof state, NULL));
        if (!same_batch(l, &c, X, k)) {
            fprintf(stderr, "X %d narrow %d seed %llu: batch %llu differs from GPTDataset's\n", X, narrow,
                    (unsigned long long)seed, (unsigned long long)k);
            CHECK(0);
            break;
        }
    }
    tf_loader_free(l);
    /* the state resumes at its step on a fresh loader */
    l = loader_of(o);
    CHECK_OK(tf_loader_state_load(l, state, strlen(state), 0));
    CHECK(l && same_batch(l, &c, X, at));
    tf_loader_free(l);
    CHECK(strstr(state, "\"order\": [\"megatron\", \"") != NULL);
    /* and is refused by another cache (another seed) */
    build_cache(&other, X, seed + 1);
    tf_megatron_index ox = {other.doc, TF_INT64, NDOCS * EPOCHS, other.smp, TF_INT64, other.N + 1, other.shf, TF_INT64,
                            other.N, X};
    tf_order *o2 = make(ds, &ox, L);
    uint64_t pos;
    tf_order *h = NULL;
    CHECK(o2 && tf_order_state_load(o2, state, strlen(state), 0, &pos, &h) == -TF_ESTATE);
    CHECK(strstr(tf_last_error(), "the Megatron index cache: saved") != NULL);
    tf_order_free(o2);
    free(other.smp);
    free(other.shf);
    tf_order_free(o);
    free(c.smp);
    free(c.shf);
}

/* Caches that do not fit are refused when the order is made. */
static void refusals(tf_dataset *ds, tf_dataset *small) {
    static cache c;
    build_cache(&c, 1, 5);
    tf_megatron_index ix = {c.doc, TF_INT64, NDOCS * EPOCHS, c.smp, TF_INT64, c.N + 1, c.shf, TF_INT64, c.N, 1};
    CHECK(make(ds, &ix, L - 1) == NULL && strstr(tf_last_error(), "holds more than 16 tokens"));
    CHECK(make(ds, &ix, L + 1) == NULL && strstr(tf_last_error(), "holds 17 tokens, seq_len 17 + the extra token needs 18"));
    CHECK(make(small, &ix, L) == NULL && strstr(tf_last_error(), "the dataset has 30 documents"));
    tf_megatron_index bad = ix;
    bad.shuffle_index_len--;
    CHECK(make(ds, &bad, L) == NULL && strstr(tf_last_error(), "shuffle_index has"));
    bad = ix;
    bad.sample_index_dtype = TF_FLOAT32;
    CHECK(make(ds, &bad, L) == NULL && strstr(tf_last_error(), "dtype float32"));
    int64_t saved = c.shf[0];
    c.shf[0] = (int64_t)c.N; /* not a sample */
    CHECK(make(ds, &ix, L) == NULL && strstr(tf_last_error(), "shuffle_index[0]"));
    c.shf[0] = saved;
    tf_order_config oc;
    tf_order_config_init(&oc);
    oc.seq_len = L;
    tf_order *o = NULL;
    CHECK_RC(tf_order_create_megatron(ds, &oc, &ix, &o), -EINVAL); /* shuffle FULL */
    free(c.smp);
    free(c.shf);
}

/* numpy.save of a C-contiguous array: rows x cols (cols 0: 1-D) entries of descr. */
static void write_npy(const char *path, const char *descr, uint64_t rows, int cols, const void *data, size_t bytes) {
    char dict[128];
    int n = cols ? snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (%llu, %d), }", descr,
                            (unsigned long long)rows, cols)
                 : snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (%llu,), }", descr,
                            (unsigned long long)rows);
    size_t hl = ((size_t)n + 1 + 10 + 63) / 64 * 64 - 10; /* header padded so that the data starts at 64k */
    uint8_t *buf = malloc(10 + hl + bytes);
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    buf[8] = (uint8_t)(hl & 0xff);
    buf[9] = (uint8_t)(hl >> 8);
    memset(buf + 10, ' ', hl);
    memcpy(buf + 10, dict, (size_t)n);
    buf[10 + hl - 1] = '\n';
    memcpy(buf + 10 + hl, data, bytes);
    t_write_file(path, buf, 10 + hl + bytes);
    free(buf);
}

/* The cache as GPTDataset writes it into dir (int32 / uint32 arrays when
 * narrow), with its description. */
static void write_cache(const char *dir, const char *split, const cache *c, int narrow) {
    static int32_t d32[NDOCS * EPOCHS], s32[4096];
    static uint32_t h32[2048];
    char p[512];
    tf_megatron_index ix;
    describe(c, 1, narrow, d32, s32, h32, &ix);
    const char *wide = narrow ? "<i4" : "<i8";
    size_t w = narrow ? 4 : 8;
    snprintf(p, sizeof p, "%s/5eed-GPTDataset-%s-document_index.npy", dir, split);
    write_npy(p, wide, NDOCS * EPOCHS, 0, ix.document_index, NDOCS * EPOCHS * w);
    snprintf(p, sizeof p, "%s/5eed-GPTDataset-%s-sample_index.npy", dir, split);
    write_npy(p, wide, c->N + 1, 2, ix.sample_index, (c->N + 1) * 2 * w);
    snprintf(p, sizeof p, "%s/5eed-GPTDataset-%s-shuffle_index.npy", dir, split);
    write_npy(p, narrow ? "<u4" : "<i8", c->N, 0, ix.shuffle_index, c->N * w);
    snprintf(p, sizeof p, "%s/5eed-GPTDataset-%s-description.txt", dir, split);
    char desc[128];
    int n = snprintf(desc, sizeof desc, "{\"class\": \"GPTDataset\", \"sequence_length\": %d}", L);
    t_write_file(p, desc, (size_t)n);
}

/* order megatron through the settings: a C program names the cache, and gets
 * the stream and states of tf_order_create_megatron over the same arrays. */
static void through_settings(tf_dataset *ds, const char *dir) {
    static cache c;
    build_cache(&c, 1, 21);
    char cdir[256];
    snprintf(cdir, sizeof cdir, "%s/cache", dir);
    CHECK(mkdir(cdir, 0700) == 0);
    write_cache(cdir, "valid", &c, 1);
    tf_order_config oc;
    tf_order_config_init(&oc);
    oc.seq_len = L;
    oc.global_batch = 4;
    oc.epochs = 1;
    CHECK_OK(tf_config_set(TF_SCOPE_ORDER, &oc, "shuffle", TF_SHUFFLE_NONE));
    CHECK_OK(tf_config_set(TF_SCOPE_ORDER, &oc, "order", TF_ORDER_MEGATRON));
    CHECK_OK(tf_config_set(TF_SCOPE_ORDER, &oc, "megatron_split", TF_MEGATRON_VALID));
    CHECK_OK(tf_config_set_path(TF_SCOPE_ORDER, &oc, "megatron_cache", cdir));
    CHECK_RC(tf_config_set(TF_SCOPE_ORDER, &oc, "megatron_cache", 1), -EINVAL); /* a path has no integer value */
    tf_order *o = NULL;
    CHECK_OK(tf_order_create(ds, &oc, &o));
    CHECK(o && tf_order_num_samples(o) == c.N);
    if (!o) return;
    /* the order keeps its own copy of the path */
    tf_order_config got;
    const char *path = NULL;
    CHECK_OK(tf_order_get_config(o, &got));
    CHECK_OK(tf_config_get_path(TF_SCOPE_ORDER, &got, "megatron_cache", &path));
    CHECK(path && path != cdir && !strcmp(path, cdir));
    tf_loader *l = loader_of(o);
    char state[4096] = "";
    for (uint64_t k = 0; l && k < c.N / 4; k++) {
        if (k == 3) CHECK_OK(tf_loader_state_save(l, state, sizeof state, NULL));
        CHECK(same_batch(l, &c, 1, k));
    }
    tf_loader_free(l);
    CHECK(strstr(state, "\"order\": \"megatron\"") && strstr(state, "\"megatron_split\": \"valid\""));
    CHECK(strstr(state, "\"order\": [\"megatron\", \""));
    /* the arrays mapped by the caller make the same order (the split is the configuration's) */
    static int32_t d32[NDOCS * EPOCHS], s32[4096];
    static uint32_t h32[2048];
    tf_megatron_index ix;
    describe(&c, 1, 1, d32, s32, h32, &ix);
    tf_order_config mc = oc;
    mc.megatron_cache = NULL;
    tf_order *o2 = NULL;
    CHECK_OK(tf_order_create_megatron(ds, &mc, &ix, &o2));
    CHECK(o2 && tf_order_fingerprint(o2) == tf_order_fingerprint(o));
    l = o2 ? loader_of(o2) : NULL;
    CHECK(l && tf_loader_state_load(l, state, strlen(state), 0) == 0 && same_batch(l, &c, 1, 3));
    tf_loader_free(l);
    tf_order_free(o2);
    /* what does not fit is refused, naming it */
    tf_order *bad = NULL;
    tf_order_config tc = oc;
    CHECK_OK(tf_config_set(TF_SCOPE_ORDER, &tc, "megatron_split", TF_MEGATRON_TRAIN));
    CHECK_RC(tf_order_create(ds, &tc, &bad), -ENOENT);
    CHECK(strstr(tf_last_error(), "no GPTDataset index cache of split 'train'") && strstr(tf_last_error(), "valid"));
    tc = oc;
    CHECK_OK(tf_config_set(TF_SCOPE_ORDER, &tc, "order", TF_ORDER_TOKENFEED));
    CHECK_RC(tf_order_create(ds, &tc, &bad), -EINVAL); /* a cache where it is not read */
    CHECK(strstr(tf_last_error(), "megatron_cache") && strstr(tf_last_error(), "order=megatron"));
    tc = oc;
    CHECK_OK(tf_config_set_path(TF_SCOPE_ORDER, &tc, "megatron_cache", NULL));
    CHECK_RC(tf_order_create(ds, &tc, &bad), -EINVAL);
    CHECK(strstr(tf_last_error(), "set megatron_cache"));
    tc = oc;
    tc.seq_len = L + 1; /* the description says L */
    CHECK_RC(tf_order_create(ds, &tc, &bad), -EINVAL);
    CHECK(strstr(tf_last_error(), "description.txt: the cache was built with sequence_length 16"));
    tf_order_free(o);
    free(c.smp);
    free(c.shf);
}

int main(void) {
    char dir[64] = "/tmp/tf_megatron_XXXXXX", prefix[128], p[160];
    if (!mkdtemp(dir)) return T_EXIT_FAIL;
    snprintf(prefix, sizeof prefix, "%s/small", dir);
    write_megatron(prefix, 11, 30);
    snprintf(prefix, sizeof prefix, "%s/data", dir);
    write_megatron(prefix, 3, NDOCS);
    tf_dataset *ds = NULL, *small = NULL;
    snprintf(p, sizeof p, "%s/data.bin", dir);
    CHECK_OK(tf_dataset_open(p, NULL, &ds));
    snprintf(p, sizeof p, "%s/small.bin", dir);
    CHECK_OK(tf_dataset_open(p, NULL, &small));
    if (ds && small) {
        compare(ds, 1, 0, 1);
        compare(ds, 1, 1, 2);
        compare(ds, 0, 0, 3);
        compare(ds, 0, 1, 4);
        refusals(ds, small);
        through_settings(ds, dir);
    }
    tf_dataset_free(ds);
    tf_dataset_free(small);
    t_rm_rf(dir);
    free(text);
    return T_DONE();
}
