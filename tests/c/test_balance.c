/* test_balance.c — the C API of balancing and sequence-length warmup
 * (docs/balance.md): tf_order_balance partitions each step into bins of B
 * rows, its busiest bin is never busier than the plain slices' and is a pure
 * function of the step; a balanced loader's batches are tf_order_fill_sample
 * of the positions tf_order_balance gives it, whatever the thread count; a
 * warming loader's rows are the samples' tokens, cut. */
#include <stdint.h>

#include "helpers.h"

static uint64_t rng_state = 99;

/* D documents with long-tailed lengths, token t = 1 + t % 30000. */
static tf_dataset *make_docs(uint64_t D) {
    uint64_t *ends = malloc(D * sizeof *ends), T = 0;
    for (uint64_t k = 0; k < D; k++) {
        uint64_t r = t_xorshift(&rng_state) % 100, x = t_xorshift(&rng_state);
        T += r < 70 ? 1 + x % 20 : r < 95 ? 20 + x % 60 : 80 + x % 400;
        ends[k] = T;
    }
    uint16_t *t = malloc(T * sizeof *t);
    for (uint64_t i = 0; i < T; i++) t[i] = (uint16_t)(1 + i % 30000);
    tf_dataset *ds = NULL;
    CHECK_OK(tf_dataset_from_memory(t, T, TF_UINT16, ends, D, 30001, &ds));
    free(t);
    free(ends);
    return ds;
}

static int cmp64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The order the balancing tests share: best-fit packed samples of 64 tokens,
 * global batches of 24 (4 ranks x 6 rows), for epochs epochs (0: endless). */
static tf_order *packed_order(const tf_dataset *ds, uint64_t epochs) {
    tf_order_config oc = t_order_config(64);
    oc.packing = TF_PACK_BEST_FIT;
    oc.global_batch = 24;
    oc.epochs = epochs;
    return t_order_create(ds, &oc);
}

static void test_rule(const tf_dataset *ds) {
    tf_order *o = packed_order(ds, 0);
    if (!o) return;
    uint64_t out[48], again[48], sorted[48];
    size_t n = 0;
    double plain_sum = 0, bal_sum = 0;
    for (uint64_t s = 0; s < 20; s++) {
        CHECK_OK(tf_order_balance(o, s * 48, 4, 2, TF_BALANCE_ATTENTION, out, 48, &n));
        CHECK(n == 48);
        CHECK_OK(tf_order_balance(o, s * 48, 4, 2, TF_BALANCE_ATTENTION, again, 48, &n));
        CHECK(!memcmp(out, again, sizeof out));
        memcpy(sorted, out, sizeof out);
        qsort(sorted, 48, sizeof *sorted, cmp64);
        for (uint64_t i = 0; i < 48; i++) CHECK(sorted[i] == s * 48 + i);
        uint64_t plain_max = 0, bal_max = 0;
        for (int k = 0; k < 8; k++) { /* 2 micro-batches x 4 ranks, 6 rows each */
            uint64_t p = 0, b = 0, c;
            for (int j = 0; j < 6; j++) {
                CHECK_OK(tf_order_row_cost(o, s * 48 + (uint64_t)k * 6 + (uint64_t)j, TF_BALANCE_ATTENTION, &c));
                p += c;
                CHECK_OK(tf_order_row_cost(o, out[k * 6 + j], TF_BALANCE_ATTENTION, &c));
                b += c;
                if (j) CHECK(out[k * 6 + j] > out[k * 6 + j - 1]);
            }
            if (p > plain_max) plain_max = p;
            if (b > bal_max) bal_max = b;
        }
        CHECK(bal_max <= plain_max);
        plain_sum += (double)plain_max;
        bal_sum += (double)bal_max;
    }
    CHECK(bal_sum < plain_sum);
    CHECK_OK(tf_order_balance(o, 24, 4, 1, TF_BALANCE_NONE, out, 48, &n));
    CHECK(n == 24 && out[0] == 24 && out[23] == 47);
    CHECK_RC(tf_order_balance(o, 0, 5, 1, TF_BALANCE_ATTENTION, out, 48, &n), -EINVAL);
    CHECK_RC(tf_order_balance(o, 24, 4, 2, TF_BALANCE_ATTENTION, out, 48, &n), -EINVAL);
    CHECK_RC(tf_order_balance(o, 0, 4, 2, TF_BALANCE_ATTENTION, out, 24, &n), -EINVAL);
    tf_order_free(o);
}

static void check_loader(const tf_dataset *ds, int threads, uint64_t warm_steps) {
    const uint64_t L = 64, B = 3, R = 2, rank = 1, M = 2, G = B * R;
    tf_loader_config lc;
    tf_loader_config_init(&lc);
    lc.order.seq_len = L;
    lc.order.packing = TF_PACK_BEST_FIT;
    lc.order.seed = 5;
    lc.batch_size = B;
    lc.world_size = (uint32_t)R;
    lc.rank = (uint32_t)rank;
    lc.num_threads = threads;
    lc.out_dtype = TF_INT32;
    lc.balance = TF_BALANCE_ATTENTION;
    lc.balance_micro_batches = (uint32_t)M;
    lc.warmup_steps = warm_steps;
    lc.warmup_min_seq_len = 16;
    tf_loader *l = NULL;
    CHECK_OK(tf_loader_create(ds, &lc, &l));
    if (!l) return;
    tf_order_config oc = lc.order;
    oc.global_batch = G;
    tf_order *o = NULL;
    CHECK_OK(tf_order_create(ds, &oc, &o));
    uint64_t rows[12];
    int32_t tok[65];
    int ok = 1;
    for (uint64_t bi = 0; bi < 12 && o; bi++) {
        tf_batch *b = NULL;
        CHECK_OK(tf_loader_next(l, &b));
        if (!b) break;
        tf_batch_view v;
        tf_batch_get_view(b, &v);
        size_t n = 0;
        CHECK_OK(tf_order_balance(o, bi / M * M * G, (uint32_t)R, (uint32_t)M, TF_BALANCE_ATTENTION, rows, 12, &n));
        uint64_t l_s = tf_seq_len_warmup(L, 16, warm_steps, bi), k = L / l_s;
        if (v.rows != B * k || v.seq_len != l_s) ok = 0;
        for (uint64_t r = 0; ok && r < B; r++) {
            uint64_t p = rows[((bi % M) * R + rank) * B + r];
            CHECK_OK(tf_order_fill_sample(o, tf_order_sample_at(o, p), tok, TF_INT32, NULL));
            for (uint64_t j = 0; j < k; j++)
                if (memcmp(tok + j * l_s, (int32_t *)v.tokens + (r * k + j) * (l_s + 1), (l_s + 1) * sizeof *tok))
                    ok = 0;
        }
        tf_batch_release(b);
    }
    if (!ok) fprintf(stderr, "balanced loader (threads %d, warmup %llu) differs from fill_sample\n", threads,
                     (unsigned long long)warm_steps);
    CHECK(ok);
    tf_order_free(o);
    tf_loader_free(l);
}

/* The rank map: each rank's rows of each global batch are its bin of the
 * balancing step, for every mode; every position is read by exactly the
 * (batch, rank, row) row_of names; hostile ranks, sizes and positions. */
static void test_rank_map(const tf_dataset *ds) {
    tf_order *o = packed_order(ds, 1);
    if (!o) return;
    const tf_balance modes[] = {TF_BALANCE_NONE, TF_BALANCE_TOKENS, TF_BALANCE_ATTENTION, TF_BALANCE_STRIDED};
    uint64_t step[48], rows[6];
    size_t n = 0;
    for (int mi = 0; mi < 4; mi++) {
        for (uint64_t s = 0; s < 6; s++) {
            CHECK_OK(tf_order_balance(o, s * 48, 4, 2, modes[mi], step, 48, &n));
            for (uint64_t m = 0; m < 2; m++)
                for (uint32_t r = 0; r < 4; r++) {
                    CHECK_OK(tf_order_rank_rows(o, modes[mi], 4, 2, s * 2 + m, r, rows, 6, &n));
                    CHECK(n == 6);
                    for (uint64_t j = 0; j < 6; j++) {
                        uint64_t want = modes[mi] == TF_BALANCE_NONE ? (s * 2 + m) * 24 + r * 6 + j
                                                                     : step[(m * 4 + r) * 6 + j];
                        CHECK(rows[j] == want);
                        uint64_t b = 99, row = 99;
                        uint32_t rk = 99;
                        CHECK_OK(tf_order_row_of(o, modes[mi], 4, 2, rows[j], &b, &rk, &row));
                        CHECK(b == s * 2 + m && rk == r && row == j);
                    }
                }
        }
    }
    uint64_t N = tf_order_num_positions(o), b;
    uint32_t rk;
    CHECK_RC(tf_order_rank_rows(o, TF_BALANCE_TOKENS, 4, 2, 0, 4, rows, 6, &n), -EINVAL);  /* rank >= world */
    CHECK_RC(tf_order_rank_rows(o, TF_BALANCE_TOKENS, 5, 2, 0, 0, rows, 6, &n), -EINVAL);  /* 5 does not divide 24 */
    CHECK_RC(tf_order_rank_rows(o, TF_BALANCE_TOKENS, 0, 2, 0, 0, rows, 6, &n), -EINVAL);
    CHECK_RC(tf_order_rank_rows(o, TF_BALANCE_TOKENS, 4, 2, 0, 0, rows, 5, &n), -EINVAL);  /* no room */
    CHECK_RC(tf_order_rank_rows(o, TF_BALANCE_TOKENS, 4, 2, N / 24, 0, rows, 6, &n), -ERANGE);
    CHECK_RC(tf_order_rank_rows(o, TF_BALANCE_TOKENS, 4, 2, UINT64_MAX, 0, rows, 6, &n), -ERANGE);
    CHECK_RC(tf_order_row_of(o, TF_BALANCE_ATTENTION, 4, 2, N, &b, &rk, &b), -ERANGE);
    CHECK_RC(tf_order_row_of(o, (tf_balance)9, 4, 2, 0, &b, &rk, &b), -EINVAL);
    CHECK_RC(tf_order_row_of(NULL, TF_BALANCE_NONE, 4, 2, 0, &b, &rk, &b), -EINVAL);
    tf_order_free(o);
}

int main(void) {
    tf_dataset *ds = make_docs(3000);
    if (!ds) return T_EXIT_FAIL;
    test_rule(ds);
    test_rank_map(ds);
    for (int threads = 1; threads <= 3; threads += 2) {
        check_loader(ds, threads, 0);
        check_loader(ds, threads, 8);
    }
    tf_loader_config lc;
    tf_loader_config_init(&lc);
    lc.order.seq_len = 64;
    lc.balance = (tf_balance)7;
    tf_loader *l = NULL;
    CHECK_RC(tf_loader_create(ds, &lc, &l), -EINVAL);
    lc.balance = TF_BALANCE_NONE;
    lc.warmup_steps = 4;
    lc.warmup_min_seq_len = 24;
    CHECK_RC(tf_loader_create(ds, &lc, &l), -EINVAL);
    tf_dataset_free(ds);
    if (t_failures) return T_EXIT_FAIL;
    printf("PASS test_balance\n");
    return T_EXIT_PASS;
}
