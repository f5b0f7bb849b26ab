/*
 * balance.c — which rows of a step each data-parallel rank takes, so that
 * every rank (and every micro-batch of a rank) gets about the same work
 * (docs/balance.md; the rule is stated in tokenfeed.h at tf_balance).
 *
 * Why it is free: the stream is a pure function of (configuration, position),
 * so every rank can compute the cost of every row of the step it is in — from
 * the document index alone, without reading a token — and run the same
 * deterministic assignment. No rank talks to another; the step holds the same
 * rows as without balancing; the state stays a position, so resume (at any
 * step, on any world size dividing the global batch) is exact.
 *
 * Costs are integers and every comparison has a fixed tie-break, so the
 * result is bit-identical on every host. A step of n rows into K bins costs
 * O(n log n) for the sort, O(n log K) for the greedy pass (a heap of bins) and
 * at most SWAP_ROUNDS rounds of O(B n) for the swaps.
 */
#include <stdlib.h>
#include <string.h>

#include "kind.h"

/* Swap rounds after the greedy pass; each lowers the busiest bin or stops. */
#define SWAP_ROUNDS 64

static uint64_t sat_add(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

/* Cost of sample `sample` with scratch cu (L + 1) and spans (max_spans). */
static int sample_cost(const tf_order *o, uint64_t sample, tf_balance mode, int32_t *cu, tf__span *spans,
                       uint64_t *cost) {
    const uint64_t L = o->cfg.seq_len;
    *cost = 0;
    if (mode == TF_BALANCE_TOKENS) {
        size_t ns = 0;
        TF_TRY(tf__order_sample_spans(o, sample, spans, o->max_spans, &ns));
        uint64_t pad = 0;
        for (size_t i = 0; i < ns; i++) {
            if (spans[i].src != TF_SPAN_PAD || spans[i].dst >= L) continue;
            uint64_t end = spans[i].dst + spans[i].len < L ? spans[i].dst + spans[i].len : L;
            pad += end - spans[i].dst;
        }
        *cost = L - pad;
        return 0;
    }
    int32_t nseg = 0;
    tf_sample_extras ex = {NULL, cu, &nseg, NULL};
    TF_TRY(tf__order_fill_extras(o, sample, &ex));
    uint64_t c = 0;
    for (int32_t k = 0; k < nseg; k++) {
        uint64_t s = (uint64_t)(cu[k + 1] - cu[k]);
        c = sat_add(c, s * s); /* s <= L < 2^31: s * s fits */
    }
    *cost = c;
    return 0;
}

int tf_order_row_cost(const tf_order *o, uint64_t pos, tf_balance mode, uint64_t *cost) {
    TF_NEED_ARG(o);
    TF_NEED_ARG(cost);
    *cost = 0;
    if (mode == TF_BALANCE_NONE || mode == TF_BALANCE_STRIDED) return 0;
    if (mode != TF_BALANCE_TOKENS && mode != TF_BALANCE_ATTENTION)
        TF_FAIL(-EINVAL, "balance: expected NONE (0), TOKENS (1), ATTENTION (2) or STRIDED (3), found %d", (int)mode);
    if (pos >= o->num_positions)
        TF_FAIL(-ERANGE, "position %llu is past the %llu positions of the stream", (unsigned long long)pos,
                (unsigned long long)o->num_positions);
    int32_t *cu = malloc((o->cfg.seq_len + 1) * sizeof *cu);
    tf__span *spans = malloc(o->max_spans * sizeof *spans);
    int rc = cu && spans ? sample_cost(o, tf_order_sample_at(o, pos), mode, cu, spans, cost) : -ENOMEM;
    free(cu);
    free(spans);
    return rc;
}

typedef struct row {
    uint64_t cost, pos;
} row;

/* Rows by sample: a packed order answers a sample from a plan of its window,
 * cached per thread, so costing a step's rows in sample order plans each
 * window once however many of the step's rows it holds. */
typedef struct by_sample {
    uint64_t sample, index;
} by_sample;

static int by_sample_cmp(const void *a, const void *b) {
    const by_sample *x = a, *y = b;
    return x->sample < y->sample ? -1 : x->sample > y->sample;
}

static int row_cmp(const void *a, const void *b) {
    const row *x = a, *y = b;
    if (x->cost != y->cost) return x->cost > y->cost ? -1 : 1; /* costs descending */
    return x->pos < y->pos ? -1 : x->pos > y->pos;            /* then positions ascending */
}

static int u64_cmp(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Bins ordered by (load, index): heap[0] is the least loaded, lowest bin. */
static int bin_less(const uint64_t *load, uint32_t a, uint32_t b) {
    return load[a] != load[b] ? load[a] < load[b] : a < b;
}
static void heap_down(uint32_t *h, size_t n, const uint64_t *load, size_t i) {
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && bin_less(load, h[l], h[m])) m = l;
        if (r < n && bin_less(load, h[r], h[m])) m = r;
        if (m == i) return;
        uint32_t t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

/* Rows rw[0..n) (costs filled) into K bins of cap rows each (n == K * cap):
 * bins[k * cap + j] is the index into rw of bin k's row j. */
static int assign(row *rw, size_t n, size_t K, size_t cap, uint64_t *bins) {
    uint64_t *load = calloc(K, sizeof *load);
    uint32_t *cnt = calloc(K, sizeof *cnt), *heap = malloc(K * sizeof *heap);
    if (!load || !cnt || !heap) {
        free(load);
        free(cnt);
        free(heap);
        return -ENOMEM;
    }
    qsort(rw, n, sizeof *rw, row_cmp);
    /* greedy: each row to the least loaded bin with room */
    size_t hn = K;
    for (size_t k = 0; k < K; k++) heap[k] = (uint32_t)k;
    for (size_t i = 0; i < n; i++) {
        uint32_t k = heap[0];
        bins[(size_t)k * cap + cnt[k]++] = i;
        load[k] = sat_add(load[k], rw[i].cost);
        if (cnt[k] == cap) heap[0] = heap[--hn];
        if (hn) heap_down(heap, hn, load, 0);
    }
    /* swaps: exchange a row of the busiest bin with a cheaper row of another
     * bin when that lowers the larger of the two loads; the best exchange
     * (lowest resulting pair maximum, then lowest bin and slots) each round */
    for (int round = 0; round < SWAP_ROUNDS && K > 1; round++) {
        size_t a = 0;
        for (size_t k = 1; k < K; k++)
            if (load[k] > load[a]) a = k;
        uint64_t best = load[a];
        size_t bb = 0, bi = 0, bj = 0;
        int found = 0;
        for (size_t b = 0; b < K; b++) {
            if (b == a || load[b] >= load[a]) continue;
            for (size_t i = 0; i < cap; i++) {
                uint64_t ci = rw[bins[a * cap + i]].cost;
                for (size_t j = 0; j < cap; j++) {
                    uint64_t cj = rw[bins[b * cap + j]].cost;
                    if (cj >= ci) continue;
                    uint64_t d = ci - cj, na = load[a] - d, nb = sat_add(load[b], d);
                    uint64_t m = na > nb ? na : nb;
                    if (m < best) {
                        best = m;
                        bb = b;
                        bi = i;
                        bj = j;
                        found = 1;
                    }
                }
            }
        }
        if (!found) break;
        uint64_t *x = &bins[a * cap + bi], *y = &bins[bb * cap + bj];
        uint64_t d = rw[*x].cost - rw[*y].cost, t = *x;
        load[a] -= d;
        load[bb] = sat_add(load[bb], d);
        *x = *y;
        *y = t;
    }
    free(load);
    free(cnt);
    free(heap);
    return 0;
}

int tf_order_balance(const tf_order *o, uint64_t start, uint32_t R, uint32_t M, tf_balance mode, uint64_t *out,
                     size_t cap, size_t *n) {
    TF_NEED_ARG(o);
    TF_NEED_ARG(out);
    TF_NEED_ARG(n);
    *n = 0;
    const uint64_t G = o->cfg.global_batch;
    if (M == 0) M = 1;
    if (R == 0 || G % R)
        TF_FAIL(-EINVAL, "world_size %u does not divide the global batch %llu", R, (unsigned long long)G);
    if (mode != TF_BALANCE_NONE && mode != TF_BALANCE_TOKENS && mode != TF_BALANCE_ATTENTION &&
        mode != TF_BALANCE_STRIDED)
        TF_FAIL(-EINVAL, "balance: expected NONE (0), TOKENS (1), ATTENTION (2) or STRIDED (3), found %d", (int)mode);
    uint64_t step;
    if (tf__mul_overflow(G, M, &step) || start % step)
        TF_FAIL(-EINVAL, "step start %llu is not a multiple of micro_batches x global_batch (%u x %llu)",
                (unsigned long long)start, M, (unsigned long long)G);
    if (start >= o->num_positions)
        TF_FAIL(-ERANGE, "position %llu is past the %llu positions of the stream", (unsigned long long)start,
                (unsigned long long)o->num_positions);
    /* whole global batches of the step inside the stream */
    uint64_t left = o->num_positions - start, batches = left / G < M ? left / G : M;
    uint64_t rows = batches * G, B = G / R;
    if (rows > cap)
        TF_FAIL(-EINVAL, "output holds %zu positions, the step has %llu", cap, (unsigned long long)rows);
    if (mode == TF_BALANCE_NONE || R * batches == 1) {
        for (uint64_t i = 0; i < rows; i++) out[i] = start + i;
        *n = (size_t)rows;
        return 0;
    }
    if (mode == TF_BALANCE_STRIDED) { /* bin (m, k): rows k, k + R, ... of global batch m */
        for (uint64_t m = 0; m < batches; m++)
            for (uint64_t k = 0; k < R; k++)
                for (uint64_t j = 0; j < B; j++) out[(m * R + k) * B + j] = start + m * G + j * R + k;
        *n = (size_t)rows;
        return 0;
    }
    row *rw = malloc(rows * sizeof *rw);
    uint64_t *bins = malloc(rows * sizeof *bins);
    by_sample *bs = malloc(rows * sizeof *bs);
    int32_t *cu = malloc((o->cfg.seq_len + 1) * sizeof *cu);
    tf__span *spans = malloc(o->max_spans * sizeof *spans);
    int rc = rw && bins && bs && cu && spans ? 0 : -ENOMEM;
    for (uint64_t i = 0; !rc && i < rows; i++) {
        rw[i].pos = start + i;
        bs[i] = (by_sample){tf_order_sample_at(o, start + i), i};
    }
    if (!rc) qsort(bs, (size_t)rows, sizeof *bs, by_sample_cmp);
    for (uint64_t i = 0; !rc && i < rows; i++)
        rc = sample_cost(o, bs[i].sample, mode, cu, spans, &rw[bs[i].index].cost);
    /* the busiest bin of the plain slices (rw is still in position order) */
    uint64_t plain = 0, busiest = 0;
    for (uint64_t k = 0; !rc && k < R * batches; k++) {
        uint64_t load = 0;
        for (uint64_t j = 0; j < B; j++) load = sat_add(load, rw[k * B + j].cost);
        if (load > plain) plain = load;
    }
    if (!rc) rc = assign(rw, (size_t)rows, (size_t)(R * batches), (size_t)B, bins);
    for (uint64_t k = 0; !rc && k < R * batches; k++) {
        uint64_t load = 0;
        for (uint64_t j = 0; j < B; j++) load = sat_add(load, rw[bins[k * B + j]].cost);
        if (load > busiest) busiest = load;
    }
    if (!rc) {
        /* never busier than the plain slices: keep them when the heuristic lost */
        for (uint64_t i = 0; i < rows; i++) out[i] = plain < busiest ? start + i : rw[bins[i]].pos;
        for (uint64_t k = 0; k < R * batches; k++) qsort(out + k * B, (size_t)B, sizeof *out, u64_cmp);
        *n = (size_t)rows;
    }
    free(rw);
    free(bins);
    free(bs);
    free(cu);
    free(spans);
    return rc;
}

int tf__balance_rows(const tf_order *o, tf_balance mode, uint32_t R, uint32_t M, uint64_t batch, uint32_t rank,
                     tf__balance_cache *c, const uint64_t **rows) {
    const uint64_t G = o->cfg.global_batch;
    if (M == 0) M = 1;
    if (R == 0 || G % R || rank >= R)
        TF_FAIL(-EINVAL, "rank %u of world_size %u: the world size must divide the global batch %llu and the rank "
                         "be below it", rank, R, (unsigned long long)G);
    const uint64_t B = G / R, start = batch / M * M * G;
    if (!c->rows && !(c->rows = malloc((size_t)(M * G) * sizeof *c->rows))) return -ENOMEM;
    if (!c->n || c->start != start) {
        c->n = 0;
        size_t n = 0;
        TF_TRY(tf_order_balance(o, start, R, M, mode, c->rows, (size_t)(M * G), &n));
        c->n = n;
        c->start = start;
    }
    uint64_t at = ((batch % M) * R + rank) * B;
    if (at + B > c->n)
        TF_FAIL(-ERANGE, "global batch %llu is past the end of the stream (its balancing step has %zu rows)",
                (unsigned long long)batch, c->n);
    *rows = c->rows + at;
    return 0;
}

void tf__balance_cache_free(tf__balance_cache *c) {
    free(c->rows);
    memset(c, 0, sizeof *c);
}

int tf_order_rank_rows(const tf_order *o, tf_balance mode, uint32_t world_size, uint32_t micro_batches,
                       uint64_t batch, uint32_t rank, uint64_t *out, size_t cap, size_t *n) {
    TF_NEED_ARG(o);
    TF_NEED_ARG(out);
    TF_NEED_ARG(n);
    *n = 0;
    const uint64_t G = o->cfg.global_batch;
    if (world_size == 0 || G % world_size || rank >= world_size)
        TF_FAIL(-EINVAL, "rank %u of world_size %u: the world size must divide the global batch %llu and the rank "
                         "be below it", rank, world_size, (unsigned long long)G);
    const uint64_t B = G / world_size;
    if (cap < B) TF_FAIL(-EINVAL, "output holds %zu positions, a rank's rows are %llu", cap, (unsigned long long)B);
    uint64_t first;
    if (tf__mul_overflow(batch, G, &first) || first >= o->num_positions)
        TF_FAIL(-ERANGE, "global batch %llu is past the %llu positions of the stream", (unsigned long long)batch,
                (unsigned long long)o->num_positions);
    if (mode == TF_BALANCE_NONE) { /* the rank's contiguous slice */
        for (uint64_t j = 0; j < B; j++) out[j] = first + rank * B + j;
        *n = (size_t)B;
        return 0;
    }
    tf__balance_cache c = {0};
    const uint64_t *rows = NULL;
    int rc = tf__balance_rows(o, mode, world_size, micro_batches, batch, rank, &c, &rows);
    if (!rc) {
        memcpy(out, rows, (size_t)B * sizeof *out);
        *n = (size_t)B;
    }
    tf__balance_cache_free(&c);
    return rc;
}

int tf_order_row_of(const tf_order *o, tf_balance mode, uint32_t world_size, uint32_t micro_batches, uint64_t pos,
                    uint64_t *batch, uint32_t *rank, uint64_t *row) {
    TF_NEED_ARG(o);
    TF_NEED_ARG(batch);
    TF_NEED_ARG(rank);
    TF_NEED_ARG(row);
    const uint64_t G = o->cfg.global_batch;
    if (world_size == 0 || G % world_size)
        TF_FAIL(-EINVAL, "world_size %u does not divide the global batch %llu", world_size, (unsigned long long)G);
    if (pos >= o->num_positions)
        TF_FAIL(-ERANGE, "position %llu is past the %llu positions of the stream", (unsigned long long)pos,
                (unsigned long long)o->num_positions);
    const uint64_t B = G / world_size;
    if (micro_batches == 0) micro_batches = 1;
    if (mode == TF_BALANCE_NONE) {
        *batch = pos / G;
        *rank = (uint32_t)(pos % G / B);
        *row = pos % G % B;
        return 0;
    }
    /* the balancing step that holds pos, searched for it: bin (m * world + r) holds rank r's
     * micro-batch m */
    const uint64_t M = micro_batches, start = pos / G / M * M * G;
    tf__balance_cache c = {0};
    const uint64_t *rows = NULL;
    int rc = tf__balance_rows(o, mode, world_size, micro_batches, start / G, 0, &c, &rows);
    if (!rc) {
        rc = tf__seterr(-EFAULT, "internal: position %llu is in no bin of its balancing step", (unsigned long long)pos);
        for (size_t i = 0; i < c.n; i++)
            if (c.rows[i] == pos) {
                uint64_t bin = i / B;
                *batch = start / G + bin / world_size;
                *rank = (uint32_t)(bin % world_size);
                *row = i % B;
                rc = 0;
                break;
            }
    }
    tf__balance_cache_free(&c);
    return rc;
}
