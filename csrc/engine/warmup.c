/*
 * warmup.c — sequence-length warmup (docs/balance.md): early in training,
 * every sample of a batch is delivered cut into k = L / l rows of l tokens,
 * so that the concatenated inputs (and labels) of the warmed stream are those
 * of the unwarmed one, position for position. Positions, the state, resume,
 * elastic resume and balancing are untouched: a position is still a sample;
 * only the shape of a batch changes, from B x (L + 1) to B k x (l + 1).
 *
 * Schedule (tf_seq_len_warmup): l0 = warmup_min_seq_len, T = warmup_steps,
 * step s = position / G. For s < T the target is l0 + (L - l0) s / T
 * (integer division) and l is the largest L / 2^m <= target (never below l0,
 * which is itself L / 2^m); from step T on, l = L. So the row length doubles
 * on the way, each length holding for a stretch of steps proportional to it.
 *
 * The cut works in place, in a buffer with room for B (L + k) tokens and
 * cu_seqlens entries: sub-row j of sample i is tokens [j l, j l + l + 1) of
 * the sample (neighbouring sub-rows share one token, as consecutive samples
 * of concat packing do), moved from offset i (L + 1) + j l to i (L + k) +
 * j (l + 1) — never to a lower offset, so moving the last sub-row first never
 * overwrites a sub-row still to be moved. position_ids restart at each
 * sub-row start (min(p, t - j l)); cu_seqlens are each sample's boundaries
 * inside the sub-row, shifted; loss_mask is per position and stays.
 */
#include <string.h>

#include "engine.h"

uint64_t tf_seq_len_warmup(uint64_t L, uint64_t min_len, uint64_t steps, uint64_t step) {
    if (!steps || step >= steps || !min_len || min_len >= L) return L;
    uint64_t target = min_len + (uint64_t)((unsigned __int128)(L - min_len) * step / steps);
    uint64_t l = L;
    while (l > min_len && l > target) l /= 2;
    return l < min_len ? min_len : l;
}

int tf__warmup_check(uint64_t L, uint64_t min_len, uint64_t steps) {
    if (!steps) return 0;
    if (!min_len)
        TF_FAIL(-EINVAL, "warmup_min_seq_len: warmup_steps needs the row length at step 0, seq_len / 2^m (%llu, %llu, ...), found None",
                (unsigned long long)(L / 2), (unsigned long long)(L / 4));
    uint64_t l = L;
    while (l > min_len && l % 2 == 0) l /= 2;
    if (l != min_len)
        TF_FAIL(-EINVAL, "warmup_min_seq_len: expected seq_len / 2^m (%llu, %llu, ...) so that every sample cuts into whole rows, found %llu",
                (unsigned long long)(L / 2), (unsigned long long)(L / 4), (unsigned long long)min_len);
    return 0;
}

void tf__warmup_cut(tf_batch_view *v, uint64_t l, int32_t *cu_scratch) {
    const uint64_t B = v->rows, L = v->seq_len, k = L / l;
    if (k <= 1) return;
    const size_t osz = tf_dtype_size(v->dtype);
    uint8_t *tok = v->tokens;
    for (uint64_t i = B; i-- > 0;) {
        int32_t n = 0;
        if (v->cu_seqlens) {
            n = v->num_seqs[i];
            memcpy(cu_scratch, v->cu_seqlens + i * (L + 1), (size_t)(n + 1) * sizeof *cu_scratch);
        }
        for (uint64_t j = k; j-- > 0;) {
            uint64_t r = i * k + j, a = j * l; /* sub-row r: sample positions [a, a + l] */
            memmove(tok + r * (l + 1) * osz, tok + (i * (L + 1) + a) * osz, (l + 1) * osz);
            if (v->cu_seqlens) {
                int32_t *cu = v->cu_seqlens + r * (l + 1), m = 1;
                cu[0] = 0;
                for (int32_t q = 1; q < n; q++) /* boundaries strictly inside the sub-row */
                    if ((uint64_t)cu_scratch[q] > a && (uint64_t)cu_scratch[q] < a + l)
                        cu[m++] = (int32_t)((uint64_t)cu_scratch[q] - a);
                v->num_seqs[r] = m;
                for (uint64_t t = (uint64_t)m; t <= l; t++) cu[t] = (int32_t)l;
            }
        }
    }
    /* position_ids and loss_mask keep their B x L layout, read as B k x l */
    if (v->position_ids)
        for (uint64_t t = 0; t < B * L; t++) {
            int32_t off = (int32_t)(t % l);
            if (v->position_ids[t] > off) v->position_ids[t] = off;
        }
    v->rows = B * k;
    v->seq_len = l;
}
