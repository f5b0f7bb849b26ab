/* test_packing.c — BEST_FIT and DOCUMENT packing and weighted mixtures:
 * every token of every document exactly once per epoch (best fit), documents
 * that fit land whole in one sample, extras against a reference derived from
 * the spans, random access == sequential access (the per-thread window cache),
 * exact mixture proportions in every window, per-source coverage, and the
 * engine's batches == tf_order_fill_sample whatever the thread count. */
#include <stdint.h>

#include "helpers.h"
#include "order/order_internal.h"

static uint64_t rng_state = 777;
static uint64_t rnd(uint64_t n) {
    rng_state = tf_mix64(rng_state + 0x9E3779B97F4A7C15ULL);
    return n ? rng_state % n : 0;
}

/* D documents with heavy-tailed lengths (some empty), token t = t % 50000. */
static tf_dataset *make_docs(uint64_t D, uint64_t mean, uint64_t **ends_out) {
    uint64_t *ends = malloc(D * sizeof *ends), T = 0;
    for (uint64_t k = 0; k < D; k++) {
        uint64_t r = rnd(100), len;
        if (r < 5) len = 0;
        else if (r < 80) len = 1 + rnd(mean);
        else if (r < 97) len = mean + rnd(4 * mean);
        else len = 5 * mean + rnd(20 * mean);
        T += len;
        ends[k] = T;
    }
    uint16_t *t = malloc((T ? T : 1) * sizeof *t);
    for (uint64_t i = 0; i < T; i++) t[i] = (uint16_t)(i % 50000);
    tf_dataset *ds = NULL;
    CHECK_OK(tf_dataset_from_memory(t, T, TF_UINT16, ends, D, 50001, &ds));
    free(t);
    if (ends_out) *ends_out = ends;
    else free(ends);
    return ds;
}

static uint64_t doc_of(const uint64_t *ends, uint64_t D, uint64_t tok) {
    uint64_t lo = 0, hi = D;
    while (lo < hi) {
        uint64_t mid = (lo + hi) / 2;
        if (ends[mid] <= tok) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Per-slot document id of a sample (-1 = padding), from its spans. A
 * separator belongs to the document whose last token precedes it; otherwise
 * (the lone separator chunk of a document of exactly k*C virtual tokens, or
 * an empty document) it is a segment of its own. */
static void slot_docs(const tf__span *sp, size_t n, const uint64_t *ends, uint64_t D, int64_t *slot,
                      uint64_t C) {
    for (uint64_t t = 0; t < C; t++) slot[t] = -1;
    for (size_t i = 0; i < n; i++) {
        for (uint64_t t = 0; t < sp[i].len; t++) {
            int64_t d;
            if (sp[i].src == TF_SPAN_PAD) {
                d = -1;
            } else if (sp[i].src == TF_SPAN_SEPARATOR) {
                d = -2 - (int64_t)(sp[i].dst + t);
                if (i > 0 && sp[i - 1].src < TF_SPAN_PAD && sp[i - 1].len) {
                    uint64_t last = sp[i - 1].src + sp[i - 1].len - 1, dd = doc_of(ends, D, last);
                    if (ends[dd] == last + 1 && t == 0) d = (int64_t)dd;
                }
            } else {
                d = (int64_t)doc_of(ends, D, sp[i].src + t);
            }
            slot[sp[i].dst + t] = d;
        }
    }
}

static void check_best_fit(uint64_t D, uint64_t mean, uint64_t L, int64_t sep, uint64_t window) {
    uint64_t *ends;
    tf_dataset *ds = make_docs(D, mean, &ends);
    uint64_t T = ends[D - 1];
    tf_order_config c = t_order_config(L);
    c.packing = TF_PACK_BEST_FIT;
    c.separator_id = sep;
    c.pad_id = 7;
    c.pack_window = window;
    c.seed = 5;
    tf_order *o = t_order_create(ds, &c);
    if (!o) return;
    uint64_t N = tf_order_num_samples(o), C = L + 1;
    size_t cap = tf__order_max_spans(o);
    tf__span *sp = malloc(cap * sizeof *sp);
    uint8_t *seen = calloc(T + 1, 1);
    uint64_t *seps = calloc(D, sizeof *seps);
    int64_t *sample_of_doc = malloc(D * sizeof *sample_of_doc);
    for (uint64_t k = 0; k < D; k++) sample_of_doc[k] = -1;
    int64_t *slot = malloc(C * sizeof *slot);
    int32_t *pos = malloc(L * 4), *cu = malloc((L + 1) * 4), ns;
    uint8_t *lm = malloc(L);
    uint16_t *tok = malloc(C * 2);
    int whole_ok = 1, extras_ok = 1, tokens_ok = 1, cover_ok = 1;
    uint64_t pads = 0;
    /* visit samples in epoch order (shuffled): spans and extras per sample */
    for (uint64_t p = 0; p < N; p++) {
        uint64_t s = tf_order_sample_at(o, p);
        size_t n = 0;
        CHECK_OK(tf__order_sample_spans(o, s, sp, cap, &n));
        uint64_t dst = 0;
        for (size_t i = 0; i < n; i++) {
            if (sp[i].dst != dst) cover_ok = 0;
            dst += sp[i].len;
            if (sp[i].src == TF_SPAN_PAD) { pads += sp[i].len; continue; }
            if (sp[i].src == TF_SPAN_SEPARATOR) {
                /* the separator closes the document of the previous token span, or an empty one */
                continue;
            }
            for (uint64_t t = 0; t < sp[i].len; t++) {
                if (seen[sp[i].src + t]++) cover_ok = 0;
            }
            uint64_t d0 = doc_of(ends, D, sp[i].src);
            uint64_t v = ends[d0] - (d0 ? ends[d0 - 1] : 0) + (sep >= 0);
            if (v <= C) {
                if (sample_of_doc[d0] >= 0 && sample_of_doc[d0] != (int64_t)s) whole_ok = 0;
                sample_of_doc[d0] = (int64_t)s;
                if (sp[i].len != v - (sep >= 0)) whole_ok = 0;
            }
        }
        if (dst != C) cover_ok = 0;
        slot_docs(sp, n, ends, D, slot, C);
        tf_sample_extras ex = {pos, cu, &ns, lm};
        CHECK_OK(tf_order_fill_sample(o, s, tok, TF_UINT16, &ex));
        for (size_t i = 0; i < n; i++)
            for (uint64_t t = 0; t < sp[i].len; t++) {
                uint16_t want = sp[i].src == TF_SPAN_PAD ? 7 : sp[i].src == TF_SPAN_SEPARATOR ? (uint16_t)sep
                                                                                              : (uint16_t)((sp[i].src + t) % 50000);
                if (tok[sp[i].dst + t] != want) tokens_ok = 0;
            }
        /* reference extras from the slot documents */
        uint64_t seg_start = 0, nc = 1;
        if (cu[0] != 0) extras_ok = 0;
        for (uint64_t t = 0; t < L; t++) {
            if (t > 0 && slot[t] != slot[t - 1]) {
                seg_start = t;
                if (cu[nc++] != (int32_t)t) extras_ok = 0;
            }
            if (pos[t] != (int32_t)(t - seg_start)) extras_ok = 0;
            int same = slot[t] != -1 && slot[t] == slot[t + 1];
            if (lm[t] != same) extras_ok = 0;
        }
        if (ns != (int32_t)nc) extras_ok = 0;
        for (uint64_t t = nc; t <= L; t++)
            if (cu[t] != (int32_t)L) extras_ok = 0;
    }
    for (uint64_t i = 0; i < T; i++)
        if (seen[i] != 1) cover_ok = 0;
    if (!cover_ok || !whole_ok || !extras_ok || !tokens_ok)
        fprintf(stderr, "best_fit D=%llu L=%llu sep=%lld window=%llu: cover %d whole %d extras %d tokens %d\n",
                (unsigned long long)D, (unsigned long long)L, (long long)sep, (unsigned long long)window, cover_ok,
                whole_ok, extras_ok, tokens_ok);
    CHECK(cover_ok);
    CHECK(whole_ok);
    CHECK(extras_ok);
    CHECK(tokens_ok);
    /* stats agree with what was seen */
    tf_packing_stats st;
    CHECK_OK(tf_order_packing_stats(o, &st));
    CHECK(st.samples == N && st.token_slots == N * C && st.pad_tokens == pads && st.tokens_dropped == 0);
    CHECK(st.documents == D && st.documents_truncated == 0);

    /* random access (other windows in between) == sequential */
    for (int r = 0; r < 300; r++) {
        uint64_t s = rnd(N), s2 = rnd(N);
        size_t n1 = 0, n2 = 0;
        tf__span *x = malloc(cap * sizeof *x), *y = malloc(cap * sizeof *y);
        CHECK_OK(tf__order_sample_spans(o, s, x, cap, &n1));
        CHECK_OK(tf__order_sample_spans(o, s2, y, cap, &n2));
        CHECK_OK(tf__order_sample_spans(o, s, y, cap, &n2));
        CHECK(n1 == n2 && !memcmp(x, y, n1 * sizeof *x));
        free(x);
        free(y);
    }
    /* a second order on the same data and settings gives the same N */
    tf_order *o2 = NULL;
    CHECK_OK(tf_order_create(ds, &c, &o2));
    CHECK(o2 && tf_order_num_samples(o2) == N && tf_order_fingerprint(o2) == tf_order_fingerprint(o));
    tf_order_free(o2);
    free(sp); free(seen); free(seps); free(sample_of_doc); free(slot); free(pos); free(cu); free(lm); free(tok);
    tf_order_free(o);
    tf_dataset_free(ds);
    free(ends);
}

static void test_best_fit(void) {
    check_best_fit(500, 40, 64, -1, 1024);
    check_best_fit(500, 40, 64, 3, 16);
    check_best_fit(900, 200, 128, -1, 7);
    check_best_fit(300, 10, 8, 1, 1);
    check_best_fit(2000, 300, 256, 2, 100);
}

static void test_best_fit_beats_concat_on_splits(void) {
    tf_dataset *ds = make_docs(3000, 300, NULL);
    tf_order_config c = t_order_config(512);
    tf_order *oc = NULL, *ob = NULL;
    CHECK_OK(tf_order_create(ds, &c, &oc));
    c.packing = TF_PACK_BEST_FIT;
    CHECK_OK(tf_order_create(ds, &c, &ob));
    tf_packing_stats a, b;
    CHECK_OK(tf_order_packing_stats(oc, &a));
    CHECK_OK(tf_order_packing_stats(ob, &b));
    CHECK(a.pad_tokens == 0 && a.documents_split > b.documents_split);
    CHECK(b.padding_fraction < 0.2);
    /* config fingerprint: packing, pad_id and pack_window matter */
    CHECK(tf_order_fingerprint(oc) != tf_order_fingerprint(ob));
    tf_order *o3 = NULL;
    c.pack_window = 77;
    CHECK_OK(tf_order_create(ds, &c, &o3));
    CHECK(tf_order_fingerprint(o3) != tf_order_fingerprint(ob));
    tf_order_free(o3);
    c.pad_id = -1;
    CHECK_RC(tf_order_create(ds, &c, &o3), -EINVAL);
    c.pad_id = 60000; /* >= vocab */
    CHECK_RC(tf_order_create(ds, &c, &o3), -EINVAL);
    c.pad_id = 0;
    c.pack_window = 0;
    CHECK_RC(tf_order_create(ds, &c, &o3), -EINVAL);
    tf_order_free(oc);
    tf_order_free(ob);
    tf_dataset_free(ds);
}

static void test_document_mode(void) {
    uint64_t *ends, D = 700;
    tf_dataset *ds = make_docs(D, 50, &ends);
    tf_order_config c = t_order_config(63);
    c.packing = TF_PACK_DOCUMENT;
    c.pad_id = 9;
    c.shuffle = TF_SHUFFLE_NONE;
    tf_order *o = NULL;
    CHECK_OK(tf_order_create(ds, &c, &o));
    uint64_t nonempty = 0, trunc = 0;
    for (uint64_t k = 0; k < D; k++) {
        uint64_t len = ends[k] - (k ? ends[k - 1] : 0);
        nonempty += len > 0;
        trunc += len > 64;
    }
    CHECK(tf_order_num_samples(o) == nonempty);
    uint16_t tok[64];
    uint8_t lm[63];
    tf_sample_extras ex = {NULL, NULL, NULL, lm};
    uint64_t s = 0;
    int ok = 1;
    for (uint64_t k = 0; k < D; k++) {
        uint64_t st = k ? ends[k - 1] : 0, len = ends[k] - st;
        if (!len) continue;
        CHECK_OK(tf_order_fill_sample(o, tf_order_sample_at(o, s), tok, TF_UINT16, &ex));
        s++;
        for (uint64_t t = 0; t < 64; t++) {
            uint16_t want = t < len ? (uint16_t)((st + t) % 50000) : 9;
            if (tok[t] != want) ok = 0;
        }
        for (uint64_t t = 0; t < 63; t++)
            if (lm[t] != (t + 1 < len)) ok = 0;
    }
    CHECK(ok);
    tf_packing_stats stt;
    CHECK_OK(tf_order_packing_stats(o, &stt));
    CHECK(stt.documents_truncated == trunc && stt.empty_documents == D - nonempty);
    tf_order_free(o);
    tf_dataset_free(ds);
    free(ends);
}

static void test_mixture(void) {
    tf_dataset *a = make_docs(200, 40, NULL), *b = make_docs(900, 60, NULL);
    const tf_dataset *dss[2] = {a, b};
    double w[2] = {0.7, 0.3};
    tf_order_config c = t_order_config(32);
    c.seed = 11;
    for (int packing = 0; packing < 3; packing++) {
        c.packing = (tf_packing)packing;
        tf_order *o = NULL;
        CHECK_OK(tf_order_create_mix(dss, w, 2, &c, &o));
        if (!o) continue;
        CHECK(tf_order_mix_window(o) == 10 && tf_order_mix_count(o, 0) == 7 && tf_order_mix_count(o, 1) == 3);
        uint64_t N0 = tf_order_num_samples(tf_order_source(o, 0)), N1 = tf_order_num_samples(tf_order_source(o, 1));
        CHECK(tf_order_num_samples(o) == N0 + N1);
        /* exact in every window; per-source streams cover each epoch once */
        uint64_t P = 30 * (N0 > N1 ? N0 : N1);
        uint8_t *seen0 = calloc(N0, 1), *seen1 = calloc(N1, 1);
        uint64_t j0 = 0, j1 = 0, in_win[2] = {0, 0};
        int exact = 1, cover = 1;
        for (uint64_t p = 0; p < P; p++) {
            uint64_t s = tf_order_sample_at(o, p);
            int src = s >= N0;
            in_win[src]++;
            if (src == 0) {
                uint64_t e = j0 / N0;
                if (seen0[s] != e) cover = 0;
                seen0[s]++;
                j0++;
            } else {
                uint64_t e = j1 / N1;
                if (seen1[s - N0] != e) cover = 0;
                seen1[s - N0]++;
                j1++;
            }
            if (p % 10 == 9) {
                if (in_win[0] != 7 || in_win[1] != 3) exact = 0;
                in_win[0] = in_win[1] = 0;
            }
        }
        CHECK(exact);
        CHECK(cover);
        /* sub-stream of source s equals that source's own order stream */
        tf_order_config sc = c;
        int same = 1;
        (void)sc;
        for (uint64_t p = 0, k0 = 0; p < 200; p++) {
            uint64_t s = tf_order_sample_at(o, p);
            if (s < N0) {
                if (s != tf_order_sample_at(tf_order_source(o, 0), k0)) same = 0;
                k0++;
            }
        }
        CHECK(same);
        /* tokens: the mixture's sample == the source order's sample */
        uint16_t x[33], y[33];
        int tok_ok = 1;
        for (uint64_t s = 0; s < N0 + N1; s += 7) {
            CHECK_OK(tf_order_fill_sample(o, s, x, TF_UINT16, NULL));
            const tf_order *so = tf_order_source(o, s >= N0);
            CHECK_OK(tf_order_fill_sample(so, s >= N0 ? s - N0 : s, y, TF_UINT16, NULL));
            if (memcmp(x, y, sizeof x)) tok_ok = 0;
        }
        CHECK(tok_ok);
        tf_packing_stats st;
        CHECK_OK(tf_order_packing_stats(o, &st));
        CHECK(st.samples == N0 + N1);
        free(seen0);
        free(seen1);
        tf_order_free(o);
    }
    /* weights: bad values, rounding to zero, fingerprints */
    double bad[2] = {1, 0};
    tf_order *o = NULL;
    CHECK_RC(tf_order_create_mix(dss, bad, 2, &c, &o), -EINVAL);
    double tiny[2] = {1, 1e-6};
    CHECK_RC(tf_order_create_mix(dss, tiny, 2, &c, &o), -EINVAL);
    c.packing = TF_PACK_CONCAT;
    tf_order *m1 = NULL, *m2 = NULL;
    double w2[2] = {0.6, 0.4};
    CHECK_OK(tf_order_create_mix(dss, w, 2, &c, &m1));
    CHECK_OK(tf_order_create_mix(dss, w2, 2, &c, &m2));
    CHECK(m1 && m2 && tf_order_fingerprint(m1) != tf_order_fingerprint(m2));
    tf_dataset_info i1, ia, ib;
    tf_dataset_get_info(tf_order_dataset(m1), &i1);
    tf_dataset_get_info(a, &ia);
    tf_dataset_get_info(b, &ib);
    CHECK(i1.num_tokens == ia.num_tokens + ib.num_tokens && i1.fingerprint != ia.fingerprint);
    tf_order_free(m1);
    tf_order_free(m2);
    tf_dataset_free(a);
    tf_dataset_free(b);
}

/* The engine's batches equal tf_order_fill_sample at the right positions. */
static void check_loader(const tf_dataset *const *dss, const double *w, size_t n, tf_packing packing, int threads) {
    tf_loader_config lc;
    tf_loader_config_init(&lc);
    lc.order.seq_len = 40;
    lc.order.packing = packing;
    lc.order.pad_id = 5;
    lc.order.separator_id = 1;
    lc.order.seed = 3;
    lc.order.pack_window = 16;
    lc.batch_size = 3;
    lc.world_size = 2;
    lc.rank = 1;
    lc.num_threads = threads;
    lc.out_dtype = TF_INT32;
    lc.want = TF_WANT_POSITION_IDS | TF_WANT_CU_SEQLENS | TF_WANT_LOSS_MASK;
    tf_loader *l = NULL;
    CHECK_OK(w ? tf_loader_create_mix(dss, w, n, &lc, &l) : tf_loader_create(dss[0], &lc, &l));
    if (!l) return;
    tf_order_config oc = lc.order;
    oc.global_batch = 6;
    tf_order *o = NULL;
    CHECK_OK(w ? tf_order_create_mix(dss, w, n, &oc, &o) : tf_order_create(dss[0], &oc, &o));
    int ok = 1;
    int32_t tok[41], pos[40], cu[41], ns;
    uint8_t lm[40];
    for (int bi = 0; bi < 25; bi++) {
        tf_batch *b = NULL;
        CHECK_OK(tf_loader_next(l, &b));
        if (!b) break;
        tf_batch_view v;
        tf_batch_get_view(b, &v);
        for (uint64_t r = 0; r < 3; r++) {
            uint64_t p = v.position + 3 + r;
            tf_sample_extras ex = {pos, cu, &ns, lm};
            CHECK_OK(tf_order_fill_sample(o, tf_order_sample_at(o, p), tok, TF_INT32, &ex));
            if (memcmp(tok, (int32_t *)v.tokens + r * 41, sizeof tok) || memcmp(pos, v.position_ids + r * 40, sizeof pos) ||
                memcmp(cu, v.cu_seqlens + r * 41, sizeof cu) || ns != v.num_seqs[r] || memcmp(lm, v.loss_mask + r * 40, sizeof lm))
                ok = 0;
        }
        tf_batch_release(b);
    }
    if (!ok) fprintf(stderr, "loader packing %d threads %d sources %zu differs from fill_sample\n", (int)packing, threads, n);
    CHECK(ok);
    tf_order_free(o);
    tf_loader_free(l);
}

static void test_loader(void) {
    tf_dataset *a = make_docs(400, 30, NULL), *b = make_docs(300, 80, NULL);
    const tf_dataset *dss[2] = {a, b};
    double w[2] = {1, 2};
    for (int packing = 0; packing < 3; packing++)
        for (int th = 1; th <= 3; th += 2) {
            check_loader(dss, NULL, 1, (tf_packing)packing, th);
            check_loader(dss, w, 2, (tf_packing)packing, th);
        }
    tf_dataset_free(a);
    tf_dataset_free(b);
}

int main(void) {
    test_best_fit();
    test_best_fit_beats_concat_on_splits();
    test_document_mode();
    test_mixture();
    test_loader();
    return T_DONE();
}
