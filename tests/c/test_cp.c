/* test_cp.c — context-parallel index arithmetic (csrc/engine/cp.c) against the
 * published layouts: the plain split of Megatron-Core's get_batch_on_this_cp_rank
 * and TransformerEngine's thd_partition_indices_kernel (per-token formula); and
 * the C API of a CP loader (tf_loader_config cp_rank/cp_size): its batches are
 * the split of the whole batch, and a mixture's per-source stats. */
#include <stdint.h>

#include "helpers.h"
#include "engine/cp.h"

/* TransformerEngine's kernel, token by token: index into the padded THD
 * sequence of local token `tid` of rank `rank` (cu: padded cumulative lengths). */
static uint64_t te_index(const uint64_t *cu, size_t batch, uint64_t tid, uint64_t world, uint64_t rank) {
    size_t left = 1, right = batch; /* binary search over cu / world */
    while (left < right) {
        size_t mid = (left + right) / 2;
        if (cu[mid] / world <= tid) left = mid + 1;
        else right = mid;
    }
    size_t seq = left - 1;
    uint64_t seq_len = cu[seq + 1] / world - cu[seq] / world, index = tid - cu[seq] / world;
    uint64_t offset = index < seq_len / 2 ? rank : (world - 1) * 2 - rank;
    return index + cu[seq] / world * world + seq_len / 2 * offset;
}

static void test_plain(void) {
    uint64_t first[2], c;
    CHECK_OK(tf__cp_chunks(8192, 4, 0, first, &c));
    CHECK(c == 1024 && first[0] == 0 && first[1] == 7168);
    CHECK_OK(tf__cp_chunks(8192, 4, 3, first, &c));
    CHECK(first[0] == 3072 && first[1] == 4096);
    CHECK_OK(tf__cp_chunks(16, 1, 0, first, &c));
    CHECK(c == 8 && first[0] == 0 && first[1] == 8);
    CHECK_RC(tf__cp_chunks(100, 3, 0, first, &c), -EINVAL);
    CHECK(strstr(tf_last_error(), "not divisible by 2 x cp_size = 6") != NULL);
    CHECK_RC(tf__cp_chunks(96, 3, 3, first, &c), -EINVAL);
}

static void test_thd_matches_transformer_engine(void) {
    uint64_t seeds = 12345;
    for (int trial = 0; trial < 200; trial++) {
        uint64_t seg[40], padded[40], cu[41], local[8], L = 0;
        tf__cp_piece pieces[160];
        seeds = seeds * 6364136223846793005ULL + 1442695040888963407ULL;
        size_t n = 1 + (seeds >> 33) % 40;
        uint32_t cp = 1 + (uint32_t)((seeds >> 20) % 4);
        for (size_t j = 0; j < n; j++) {
            seeds = seeds * 6364136223846793005ULL + 1442695040888963407ULL;
            seg[j] = 1 + (seeds >> 40) % 30;
            L += seg[j];
        }
        cu[0] = 0;
        uint64_t row_of_padded[2048]; /* padded position -> row position, or UINT64_MAX */
        for (uint32_t r = 0; r < cp; r++) {
            size_t m = tf__cp_thd_pieces(seg, n, cp, r, pieces, &local[r], padded);
            CHECK(m <= 4 * n);
            if (r == 0) {
                for (size_t j = 0; j < n; j++) cu[j + 1] = cu[j] + padded[j];
                CHECK(cu[n] <= 2048);
                uint64_t src = 0;
                for (size_t j = 0; j < n; j++) {
                    CHECK(padded[j] % (2 * cp) == 0 && padded[j] >= seg[j] && padded[j] < seg[j] + 2 * cp);
                    for (uint64_t u = 0; u < padded[j]; u++) row_of_padded[cu[j] + u] = u < seg[j] ? src + u : UINT64_MAX;
                    src += seg[j];
                }
            }
            CHECK(local[r] * cp == cu[n]);
            /* expand the pieces and compare with TE's index of every local token */
            uint64_t tid = 0;
            for (size_t i = 0; i < m; i++)
                for (uint64_t e = 0; e < pieces[i].len; e++, tid++) {
                    uint64_t idx = te_index(cu, n, tid, cp, r);
                    uint64_t want = row_of_padded[idx];
                    uint64_t got = pieces[i].src == TF_CP_PAD ? UINT64_MAX : pieces[i].src + e;
                    size_t j = 0;
                    while (cu[j + 1] <= idx) j++;
                    if (got != want || pieces[i].pos + e != idx - cu[j]) {
                        fprintf(stderr, "trial %d cp %u rank %u token %llu: row %llu pos %llu, TE says %llu pos %llu\n",
                                trial, cp, r, (unsigned long long)tid, (unsigned long long)got,
                                (unsigned long long)(pieces[i].pos + e), (unsigned long long)want,
                                (unsigned long long)(idx - cu[j]));
                        t_failures++;
                        return;
                    }
                }
            CHECK(tid == local[r]);
        }
        (void)L;
    }
}

/* The first batch of a loader made from o with lc: the loader goes to *l, the
 * batch's view to *v; the caller releases the batch and frees *l. NULL, with
 * *l = NULL and a failed check counted, when the loader or the batch cannot
 * be made. */
static tf_batch *first_batch(const tf_order *o, const tf_loader_config *lc, tf_loader **l, tf_batch_view *v) {
    tf_batch *b = NULL;
    *l = NULL;
    CHECK_OK(tf_loader_create_from_order(o, lc, l));
    if (*l) CHECK_OK(tf_loader_next(*l, &b));
    if (!b) {
        tf_loader_free(*l);
        *l = NULL;
        return NULL;
    }
    tf_batch_get_view(b, v);
    return b;
}

/* A loader over the same order without CP and with it: every CP rank's
 * input_ids / labels / position_ids are chunks r and 2cp-1-r of the whole
 * batch's rows; THD: the real tokens of every rank's pieces are the rows'. */
static void test_loader_api(void) {
    enum { NT = 6000, ND = 60 };
    static uint16_t toks[NT];
    uint64_t ends[ND];
    for (int i = 0; i < NT; i++) toks[i] = (uint16_t)(i * 7 % 1000 + 1);
    for (int i = 0; i < ND; i++) ends[i] = (uint64_t)(i + 1) * (NT / ND) - (uint64_t)(i % 7) * 3;
    ends[ND - 1] = NT;
    tf_dataset *ds = NULL;
    CHECK_OK(tf_dataset_from_memory(toks, NT, TF_UINT16, ends, ND, 1000, &ds));
    if (!ds) return;
    const uint64_t L = 48, B = 3;
    tf_order_config oc;
    tf_order_config_init(&oc);
    oc.seq_len = L;
    oc.global_batch = B;
    oc.seed = 5;
    tf_order *o = NULL;
    CHECK_OK(tf_order_create(ds, &oc, &o));
    if (!o) {
        tf_dataset_free(ds);
        return;
    }
    tf_loader_config lc;
    tf_loader_config_init(&lc);
    CHECK(lc.cp_size == 1 && lc.cp_rank == 0);
    lc.batch_size = B;
    lc.out_dtype = TF_INT32;
    lc.want = TF_WANT_POSITION_IDS | TF_WANT_LOSS_MASK;
    lc.num_threads = 1;
    tf_loader *whole;
    tf_batch_view wv;
    tf_batch *wb = first_batch(o, &lc, &whole, &wv);
    if (!wb) {
        tf_order_free(o);
        tf_dataset_free(ds);
        return;
    }
    CHECK(wv.cp_size == 1 && wv.tokens != NULL);
    for (uint32_t cp = 2; cp <= 3; cp++)
        for (uint32_t r = 0; r < cp; r++) {
            lc.cp_size = cp;
            lc.cp_rank = r;
            tf_loader *l;
            tf_batch_view v;
            tf_batch *b = first_batch(o, &lc, &l, &v);
            if (!b) continue;
            CHECK(v.tokens == NULL && v.cp_size == cp && !v.thd && v.num_tokens == B * L / cp);
            uint64_t c = L / (2 * cp), first[2] = {r * c, (2 * cp - 1 - r) * c};
            for (uint64_t j = 0; j < B; j++)
                for (int h = 0; h < 2; h++)
                    for (uint64_t e = 0; e < c; e++) {
                        uint64_t t = first[h] + e, at = j * (L / cp) + (uint64_t)h * c + e;
                        const int32_t *row = (const int32_t *)wv.tokens + j * (L + 1);
                        CHECK(((int32_t *)v.input_ids)[at] == row[t]);
                        CHECK(((int32_t *)v.labels)[at] == row[t + 1]);
                        CHECK(v.position_ids[at] == wv.position_ids[j * L + t]);
                        CHECK(v.loss_mask[at] == wv.loss_mask[j * L + t]);
                    }
            tf_batch_release(b);
            tf_loader_free(l);
        }
    /* THD: every real token of every rank's pieces, put back by position, is the row's */
    lc.want = TF_WANT_CU_SEQLENS | TF_WANT_POSITION_IDS;
    lc.cp_size = 2;
    uint64_t seen = 0, real_total = 0;
    for (uint32_t r = 0; r < 2; r++) {
        lc.cp_rank = r;
        tf_loader *l;
        tf_batch_view v;
        tf_batch *b = first_batch(o, &lc, &l, &v);
        if (!b) continue;
        CHECK(v.thd && v.cu_seqlens_padded && v.num_tokens * 2 == (uint64_t)v.cu_seqlens_padded[v.num_seqs[0]]);
        CHECK((uint64_t)v.cu_seqlens[v.num_seqs[0]] == B * L);
        real_total = B * L;
        /* walk this rank's entries: sequence q, offset in it = position id */
        uint64_t k = 0;
        for (int32_t q = 0; q < v.num_seqs[0]; q++) {
            uint64_t s = (uint64_t)(v.cu_seqlens[q + 1] - v.cu_seqlens[q]);
            uint64_t p = (uint64_t)(v.cu_seqlens_padded[q + 1] - v.cu_seqlens_padded[q]), h = p / 4;
            for (uint64_t e = 0; e < 2 * h; e++, k++) {
                uint64_t u = (uint64_t)v.position_ids[k];
                CHECK(u == (e < h ? r * h + e : (3 - r) * h + e - h));
                if (u < s) {
                    uint64_t flat = (uint64_t)v.cu_seqlens[q] + u, j = flat / L, t = flat % L;
                    CHECK(((int32_t *)v.input_ids)[k] == ((const int32_t *)wv.tokens)[j * (L + 1) + t]);
                    seen++;
                }
            }
        }
        CHECK(k == v.num_tokens);
        tf_batch_release(b);
        tf_loader_free(l);
    }
    CHECK(seen == real_total);
    /* errors: seq_len not divisible, rank past the group */
    lc.cp_size = 5;
    lc.cp_rank = 0;
    tf_loader *bad = NULL;
    CHECK_RC(tf_loader_create_from_order(o, &lc, &bad), -EINVAL);
    CHECK(strstr(tf_last_error(), "2 x cp_size = 10") != NULL);
    lc.cp_size = 2;
    lc.cp_rank = 2;
    CHECK_RC(tf_loader_create_from_order(o, &lc, &bad), -EINVAL);
    /* (a CP loader's batches on the device: tests/c/test_device.c, stage_cp / stage_thd) */
    tf_source_stats ss;
    CHECK_RC(tf_loader_get_source_stats(whole, 0, &ss), -EINVAL); /* one dataset: no per-source accounting */
    tf_batch_release(wb);
    tf_loader_free(whole);
    tf_order_free(o);

    /* a mixture counts per source what the consumer received */
    const tf_dataset *two[2] = {ds, ds};
    double w[2] = {0.75, 0.25};
    oc.mix_window = 4;
    oc.global_batch = 8;
    CHECK_OK(tf_order_create_mix(two, w, 2, &oc, &o));
    lc.cp_size = 1;
    lc.cp_rank = 0;
    lc.batch_size = 8;
    lc.want = 0;
    tf_loader *m = NULL;
    CHECK_OK(tf_loader_create_from_order(o, &lc, &m));
    for (int i = 0; m && i < 5; i++) {
        tf_batch *b = NULL;
        CHECK_OK(tf_loader_next(m, &b));
        tf_batch_release(b);
    }
    CHECK_OK(tf_loader_get_source_stats(m, 0, &ss));
    CHECK(ss.samples == 30 && ss.tokens == 30 * L && ss.documents > 0);
    CHECK_OK(tf_loader_get_source_stats(m, 1, &ss));
    CHECK(ss.samples == 10 && ss.tokens == 10 * L);
    CHECK_RC(tf_loader_get_source_stats(m, 2, &ss), -ERANGE);
    tf_loader_free(m);
    tf_order_free(o);
    tf_dataset_free(ds);
}

int main(void) {
    test_plain();
    test_thd_matches_transformer_engine();
    test_loader_api();
    return T_DONE();
}
