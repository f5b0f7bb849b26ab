/* test_cp.c — context-parallel index arithmetic (csrc/engine/cp.c) against the
 * published layouts: the plain split of Megatron-Core's get_batch_on_this_cp_rank
 * and TransformerEngine's thd_partition_indices_kernel (per-token formula). */
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

int main(void) {
    test_plain();
    test_thd_matches_transformer_engine();
    return T_DONE();
}
