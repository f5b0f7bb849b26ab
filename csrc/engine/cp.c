/*
 * cp.c — context-parallel index arithmetic (see cp.h for the layouts).
 */
#include <stdlib.h>

#include "cp.h"

int tf__cp_chunks(uint64_t L, uint32_t cp, uint32_t r, uint64_t first[2], uint64_t *c) {
    if (cp < 1 || r >= cp) TF_FAIL(-EINVAL, "cp_rank: expected 0 <= cp_rank < cp_size (%u), found %u", cp, r);
    uint64_t k = 2 * (uint64_t)cp;
    if (L % k)
        TF_FAIL(-EINVAL, "seq_len %llu is not divisible by 2 x cp_size = %llu: context parallelism cuts every sample into 2 x cp_size equal chunks. Use a seq_len that is a multiple of %llu.",
                (unsigned long long)L, (unsigned long long)k, (unsigned long long)k);
    *c = L / k;
    first[0] = r * *c;
    first[1] = (k - 1 - r) * *c;
    return 0;
}

int tf_cp_chunks(uint64_t seq_len, uint32_t cp_size, uint32_t cp_rank, uint64_t first[2], uint64_t *chunk) {
    TF_NEED_ARG(first);
    TF_NEED_ARG(chunk);
    return tf__cp_chunks(seq_len, cp_size, cp_rank, first, chunk);
}

/* Append the part of padded-segment offsets [u0, u0 + h) of a segment that
 * starts at row position start and has s real positions. */
static size_t chunk_pieces(uint64_t start, uint64_t s, uint64_t u0, uint64_t h, tf__cp_piece *out) {
    size_t m = 0;
    if (u0 < s) {
        uint64_t real = s - u0 < h ? s - u0 : h;
        out[m++] = (tf__cp_piece){start + u0, real, u0};
        if (real < h) out[m++] = (tf__cp_piece){TF_CP_PAD, h - real, u0 + real};
    } else {
        out[m++] = (tf__cp_piece){TF_CP_PAD, h, u0};
    }
    return m;
}

size_t tf__cp_thd_pieces(const uint64_t *seg, size_t n, uint32_t cp, uint32_t r, tf__cp_piece *out,
                         uint64_t *local, uint64_t *padded) {
    const uint64_t k = 2 * (uint64_t)cp;
    size_t m = 0;
    uint64_t start = 0, total = 0;
    for (size_t j = 0; j < n; j++) {
        uint64_t s = seg[j], p = (s + k - 1) / k * k, h = p / k;
        if (padded) padded[j] = p;
        if (h) {
            m += chunk_pieces(start, s, r * h, h, out + m);
            m += chunk_pieces(start, s, (k - 1 - r) * h, h, out + m);
        }
        start += s;
        total += p;
    }
    *local = total / cp;
    return m;
}

int tf_cp_thd_positions(const uint64_t *seg, size_t n, uint32_t cp_size, uint32_t cp_rank, int64_t *out, size_t cap,
                        size_t *len) {
    TF_NEED_ARG(len);
    if (n) TF_NEED_ARG(seg);
    TF_NEED_BUF(out, cap);
    *len = 0;
    if (cp_size < 1 || cp_rank >= cp_size)
        TF_FAIL(-EINVAL, "cp_rank: expected 0 <= cp_rank < cp_size (%u), found %u", cp_size, cp_rank);
    const uint64_t k = 2 * (uint64_t)cp_size;
    for (size_t j = 0; j < n; j++)
        if (seg[j] > (uint64_t)INT64_MAX - k)
            TF_FAIL(-EINVAL, "sequence %zu has %llu positions, more than a position can name", j,
                    (unsigned long long)seg[j]);
    if (n > SIZE_MAX / 4 / sizeof(tf__cp_piece)) return -ENOMEM;
    tf__cp_piece *pc = malloc((n ? 4 * n : 1) * sizeof *pc);
    if (!pc) return -ENOMEM;
    uint64_t local = 0;
    size_t np = tf__cp_thd_pieces(seg, n, cp_size, cp_rank, pc, &local, NULL);
    size_t m = 0;
    for (size_t q = 0; q < np; q++)
        for (uint64_t e = 0; e < pc[q].len; e++, m++)
            if (m < cap) out[m] = pc[q].src == TF_CP_PAD ? -1 : (int64_t)(pc[q].src + e);
    free(pc);
    *len = m;
    if (m > cap) TF_FAIL(-ENOBUFS, "the THD share of rank %u has %zu entries, room was given for %zu", cp_rank, m, cap);
    return 0;
}
