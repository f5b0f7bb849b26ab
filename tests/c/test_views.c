/* test_views.c — views through the C API alone: a selection of a dataset's
 * documents (tf_dataset_select) read by a concat order with and without
 * separators, checked token by token against the selected documents laid end
 * to end; the selection's checks; the view's fingerprint; a column file
 * parsed from memory and a filter evaluated over it (tf_columns_*). */
#include "helpers.h"

enum { D = 500 };

static uint16_t toks[D * 40];
static uint64_t ends[D];

static tf_dataset *make(void) {
    uint64_t st = 0x9E3779B97F4A7C15ull, n = 0;
    for (uint64_t k = 0; k < D; k++) {
        uint64_t len = t_xorshift(&st) % 40; /* empty documents too */
        for (uint64_t j = 0; j < len; j++) toks[n + j] = (uint16_t)(1 + k % 1000);
        n += len;
        ends[k] = n;
    }
    tf_dataset *ds = NULL;
    CHECK_OK(tf_dataset_from_memory(toks, n, TF_UINT16, ends, D, 0, &ds));
    return ds;
}

static void check_concat(const tf_dataset *v, const uint64_t *ids, uint64_t n, int sep) {
    /* the reference stream: the selected documents, each followed by a separator (0) with sep */
    uint64_t cap = D * 41, m = 0;
    uint16_t *ref = malloc(cap * sizeof *ref);
    for (uint64_t i = 0; i < n; i++) {
        uint64_t s = ids[i] ? ends[ids[i] - 1] : 0;
        for (uint64_t t = s; t < ends[ids[i]]; t++) ref[m++] = toks[t];
        if (sep) ref[m++] = 0;
    }
    tf_order_config c;
    tf_order_config_init(&c);
    c.seq_len = 16;
    c.shuffle = TF_SHUFFLE_NONE;
    c.separator_id = sep ? 0 : -1;
    tf_order *o = NULL;
    CHECK_OK(tf_order_create(v, &c, &o));
    if (!o) {
        free(ref);
        return;
    }
    uint64_t N = tf_order_num_samples(o);
    CHECK(N == (m - 1) / 16);
    uint16_t out[17];
    uint8_t mask[16];
    tf_sample_extras ex = {0};
    ex.loss_mask = mask;
    for (uint64_t i = 0; i < N; i++) {
        CHECK_OK(tf_order_fill_sample(o, i, out, TF_UINT16, &ex));
        CHECK(memcmp(out, ref + i * 16, sizeof out) == 0);
        for (int t = 0; t < 16; t++) {
            /* the mask is 0 exactly where the label opens a document: here, where the
             * token value changes (documents hold distinct values) */
            if (!sep && out[t + 1] != out[t]) CHECK(mask[t] == 0);
        }
        tf_segment seg[17];
        size_t ns;
        CHECK_OK(tf_order_segments_at(o, i, seg, 17, &ns));
        for (size_t k = 0; k < ns; k++) {
            int found = 0;
            for (uint64_t j = 0; j < n; j++) found |= ids[j] == seg[k].document;
            CHECK(found); /* segments name the dataset's documents */
        }
    }
    tf_order_free(o);
    free(ref);
}

static void test_select(void) {
    tf_dataset *ds = make();
    uint64_t ids[D], n = 0;
    for (uint64_t k = 0; k < D; k++)
        if (k % 3 != 1) ids[n++] = k;
    tf_dataset *v = NULL;
    CHECK_OK(tf_dataset_select(ds, ids, n, &v));
    uint64_t docs = 0, tokens = 0, id = 0, at = 0;
    CHECK(tf_dataset_selection(v, &docs, &tokens) == 1);
    CHECK(docs == n);
    CHECK(tf_dataset_selection(ds, NULL, NULL) == 0);
    CHECK_OK(tf_dataset_document_id(v, 5, &id));
    CHECK(id == ids[5]);
    CHECK_OK(tf_dataset_document_index(v, ids[7], &at));
    CHECK(at == 7);
    CHECK_RC(tf_dataset_document_index(v, 1, &at), -ENOENT);
    tf_dataset_info a, b;
    tf_dataset_get_info(ds, &a);
    tf_dataset_get_info(v, &b);
    CHECK(a.fingerprint != b.fingerprint && b.num_documents == n);
    check_concat(v, ids, n, 0);
    check_concat(v, ids, n, 1);
    /* a view of a view: ids of the view, mapped to the dataset's */
    uint64_t sub[3] = {0, 2, 4}, want[3] = {ids[0], ids[2], ids[4]};
    tf_dataset *vv = NULL;
    CHECK_OK(tf_dataset_select(v, sub, 3, &vv));
    for (uint64_t k = 0; k < 3 && vv; k++) {
        CHECK_OK(tf_dataset_document_id(vv, k, &id));
        CHECK(id == want[k]);
    }
    tf_dataset_free(vv);
    /* refused selections */
    uint64_t bad1[2] = {4, 4}, bad2[1] = {D};
    tf_dataset *x = NULL;
    CHECK_RC(tf_dataset_select(ds, bad1, 2, &x), -EINVAL);
    CHECK_RC(tf_dataset_select(ds, bad2, 1, &x), -ERANGE);
    CHECK_RC(tf_dataset_select(ds, ids, 0, &x), -EINVAL);
    CHECK(x == NULL);
    tf_dataset_free(v);
    tf_dataset_free(ds);
}

/* A column file by hand (docs/format.md, "Metadata columns"): one int64 column "q". */
static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void test_columns(void) {
    uint8_t f[64 + 80 + 8 + 32];
    memset(f, 0, sizeof f);
    memcpy(f, "TFCOLS1", 8);
    f[8] = 1;  /* version */
    f[12] = 1; /* ncols */
    put64(f + 16, 4);
    put64(f + 32, 64);
    uint8_t *e = f + 64;
    put64(e, 144);
    put64(e + 8, 1);
    e[16] = TF_COLUMN_INT64;
    put64(e + 24, 152);
    put64(e + 32, 32);
    f[144] = 'q';
    int64_t vals[4] = {3, INT64_MIN, -2, 7};
    for (int i = 0; i < 4; i++) put64(f + 152 + 8 * i, (uint64_t)vals[i]);
    uint64_t h = tf_hash64(f + 152, 32, 0);
    h = tf_hash64(NULL, 0, h);
    h = tf_hash64(NULL, 0, h);
    put64(e + 72, h);
    h = tf_hash64(f, 56, 0);
    put64(f + 56, tf_hash64(f + 64, 80, h));
    tf_columns *c = NULL;
    CHECK_OK(tf_columns_from_memory(f, sizeof f, &c));
    if (!c) return;
    uint8_t m[4];
    CHECK_OK(tf_columns_eval(c, "q < 5 and not q in (-2)", m));
    CHECK(m[0] == 1 && m[1] == 0 && m[2] == 0 && m[3] == 0); /* missing: no comparison holds */
    CHECK_OK(tf_columns_eval(c, "not q in (-2)", m));
    CHECK(m[0] == 1 && m[1] == 1 && m[2] == 0 && m[3] == 1); /* not (false) for the missing one */
    CHECK_OK(tf_columns_eval(c, "q != 3", m));
    CHECK(m[0] == 0 && m[1] == 0 && m[2] == 1 && m[3] == 1);
    CHECK_RC(tf_columns_eval(c, "q >", m), -EINVAL);
    CHECK_RC(tf_columns_eval(c, "r == 1", m), -ENOENT);
    tf_column_value v;
    CHECK_OK(tf_columns_value(c, "q", 1, &v));
    CHECK(v.is_null && v.type == TF_COLUMN_INT64);
    tf_columns_free(c);
    f[152] ^= 1; /* a payload byte: refused where used */
    CHECK_OK(tf_columns_from_memory(f, sizeof f, &c));
    CHECK_RC(tf_columns_eval(c, "q == 3", m), -TF_EFORMAT);
    tf_columns_free(c);
}

int main(void) {
    test_select();
    test_columns();
    return t_failures ? T_EXIT_FAIL : T_EXIT_PASS;
}
