/*
 * order_internal.h — what the engine needs from the order layer beyond the
 * public API: the token spans that make up a sample, so that each read backend
 * (mmap, pread, io_uring, zstd) can fetch them its own way, and the extras
 * (position ids, cu_seqlens, loss mask), computed from document boundaries.
 */
#ifndef TF_ORDER_INTERNAL_H
#define TF_ORDER_INTERNAL_H

#include "../common/internal.h"

/* One piece of a sample: either tokens [src, src + len) of the dataset (global
 * token coordinates, possibly crossing file boundaries), or, when src ==
 * TF_SPAN_SEPARATOR, len copies of the separator id. dst is the offset of the
 * piece inside the sample (in tokens). The spans of a sample are in dst order
 * and cover [0, L + 1) exactly. */
#define TF_SPAN_SEPARATOR UINT64_MAX
/* src == TF_SPAN_PAD: len copies of the pad id (BEST_FIT / DOCUMENT). */
#define TF_SPAN_PAD (UINT64_MAX - 1)
typedef struct tf__span {
    uint64_t src;
    uint64_t len;
    uint64_t dst;
} tf__span;

/* Upper bound on the spans of one sample for this order (>= 1). */
TF_HIDDEN size_t tf__order_max_spans(const tf_order *o);

/* Spans of sample `sample` (an index in the unshuffled sample sequence, as
 * returned by tf_order_sample_at). cap must be >= tf__order_max_spans(o). */
TF_HIDDEN int tf__order_sample_spans(const tf_order *o, uint64_t sample, tf__span *spans, size_t cap,
                                     size_t *n);

/* Fill only the extras of a sample (tokens are fetched by the caller). */
TF_HIDDEN int tf__order_fill_extras(const tf_order *o, uint64_t sample, const tf_sample_extras *ex);

/* Separator id (or -1) and sequence length, for the engine. */
TF_HIDDEN int64_t tf__order_separator(const tf_order *o);
TF_HIDDEN int64_t tf__order_pad(const tf_order *o);
TF_HIDDEN uint64_t tf__order_seq_len(const tf_order *o);

/* ---- packing plans (pack.c): BEST_FIT and DOCUMENT ---------------------- */

/* One piece of a packed sample: ntok dataset tokens from src, then the
 * separator when sep (a chunk of a document's virtual range doc + SEP). */
typedef struct tf__chunk {
    uint64_t src;
    uint32_t ntok;
    uint32_t sep;
} tf__chunk;

typedef struct tf__plan tf__plan;

/* Build the per-window sample counts (on threads) for ds under cfg; *n_out = N. */
TF_HIDDEN int tf__plan_create(const tf_dataset *ds, const tf_order_config *cfg, tf__plan **out,
                              uint64_t *n_out);
TF_HIDDEN void tf__plan_free(tf__plan *p);
/* Chunks of sample (< N), in sample order; *chunks points into a per-thread
 * cache valid until this thread's next plan call. */
TF_HIDDEN int tf__plan_sample(const tf__plan *p, uint64_t sample, const tf__chunk **chunks, size_t *n);
TF_HIDDEN uint64_t tf__plan_max_chunks(const tf__plan *p);
TF_HIDDEN void tf__plan_stats(const tf__plan *p, tf_packing_stats *st);

/* ---- the order object (order.c), shared with mix.c ---------------------- */

typedef struct tf__mix tf__mix;

struct tf_order {
    const tf_dataset *ds; /* a mixture: the concatenated view (mix.c) */
    tf_order_config cfg;
    uint64_t T;  /* dataset tokens */
    uint64_t D;  /* dataset documents */
    uint64_t Tv; /* virtual stream length: T, or T + D with separators */
    uint64_t N;  /* samples per epoch */
    uint64_t num_positions;
    uint64_t fingerprint;
    int sep;     /* separator mode */
    /* BLOCK shuffle geometry */
    uint64_t nbf;  /* full blocks */
    uint64_t wsz;  /* positions per full window (W * Bk, saturated) */
    uint64_t nwin; /* windows per epoch */
    tf__plan *plan; /* BEST_FIT / DOCUMENT */
    tf__mix *mix;   /* a mixture of sources */
    uint64_t mix_fp;
};

TF_HIDDEN int tf__order_finish(tf_order *o, tf_order **out);

/* mix.c */
TF_HIDDEN void tf__mix_free(tf__mix *m);
TF_HIDDEN uint64_t tf__mix_sample_at(const tf_order *o, uint64_t pos);
TF_HIDDEN size_t tf__mix_max_spans(const tf_order *o);
TF_HIDDEN int tf__mix_sample_spans(const tf_order *o, uint64_t sample, tf__span *spans, size_t cap, size_t *n);
TF_HIDDEN int tf__mix_fill_extras(const tf_order *o, uint64_t sample, const tf_sample_extras *ex);

/* Extras of a sample whose segments have the given lengths (sum <= L + 1,
 * rest padding); shared by packed modes. */
TF_HIDDEN void tf__extras_from_segments(uint64_t L, const tf__chunk *c, size_t n, const tf_sample_extras *ex);

/* Building position_ids / cu_seqlens / num_seqs from segment starts, shared by
 * every packing: start with {last = 0, nc = 1} and cu_seqlens[0] = 0, call
 * tf__extras_segment for each segment start b in (0, L) in order, then
 * tf__extras_finish (fills the rest of position_ids, pads cu_seqlens with L,
 * and stores the number of segments). */
static inline void tf__extras_segment(const tf_sample_extras *ex, uint64_t b, uint64_t *last, uint64_t *nc) {
    if (ex->position_ids)
        for (uint64_t t = *last; t < b; t++) ex->position_ids[t] = (int32_t)(t - *last);
    if (ex->cu_seqlens) ex->cu_seqlens[*nc] = (int32_t)b;
    (*nc)++;
    *last = b;
}
static inline void tf__extras_finish(const tf_sample_extras *ex, uint64_t L, uint64_t last, uint64_t nc) {
    if (ex->position_ids)
        for (uint64_t t = last; t < L; t++) ex->position_ids[t] = (int32_t)(t - last);
    if (ex->cu_seqlens)
        for (uint64_t t = nc; t <= L; t++) ex->cu_seqlens[t] = (int32_t)L;
    if (ex->num_seqs) ex->num_seqs[0] = (int32_t)nc; /* entries 0..nc-1 are segment starts: nc segments */
}

#endif
