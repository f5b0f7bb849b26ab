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
 * returned by tf_order_sample_at; -ERANGE past N). cap must be >=
 * tf__order_max_spans(o). Source coordinates are tokens of
 * tf_order_dataset(o). */
TF_HIDDEN int tf__order_sample_spans(const tf_order *o, uint64_t sample, tf__span *spans, size_t cap,
                                     size_t *n);

/* Whether every sample's last token is pad_id, its label never trained
 * (TF_ORDER_OLMO): extras computed from a row's tokens keep its loss mask 0. */
TF_HIDDEN int tf__order_pads_last(const tf_order *o);

/* Fill only the extras of a sample (tokens are fetched by the caller). Any
 * pointer of ex may be NULL; ex itself may be NULL. */
/* Prefetch what locating sample (< N, not checked beyond that) will read,
 * stage 0 then 1 (kind.h: tf__order_ops.prefetch); a no-op for kinds without. */
TF_HIDDEN void tf__order_prefetch(const tf_order *o, uint64_t sample, int stage);
TF_HIDDEN int tf__order_fill_extras(const tf_order *o, uint64_t sample, const tf_sample_extras *ex);

/* The registry of order kinds (kinds.c): one row per value of
 * tf_order_config.order, all that the library asks of a kind outside its own
 * file. */
typedef struct tf__order_kind {
    tf_order_kind id;
    const char *name;                           /* as the settings table's enum spells it */
    int (*init)(struct tf_order *o, const void *ds); /* its constructor; NULL: tokenfeed's own (by packing) */
    int checks_data;                            /* token ids and documents are checked before init */
    int pads_last;                              /* every sample ends in pad_id: pad_id must be a token id */
    uint64_t (*kind_fp)(const tf_order_config *c); /* mixed into a saved state's fingerprint; NULL: none */
    int mixable;                                /* can be a mixture's sources' order */
    int processes_from_world;                   /* llmc_processes 0 means the data-parallel ranks */
    const char *data_fp;                        /* its fingerprint reads data of its own (named so in
                                                   messages), not the config alone: the state records it
                                                   under "order"; NULL: none */
} tf__order_kind;

/* The row of an order kind, NULL for a value no row has (a config the
 * settings table's bounds let through cannot have one). */
TF_HIDDEN const tf__order_kind *tf__order_kind_of(int order);
/* The row named name (the settings table's enum spelling), NULL for none. */
TF_HIDDEN const tf__order_kind *tf__order_kind_named(const char *name);

/* Which rows a data-parallel rank reads under balancing (balance.c): the one
 * account of it, for the engine's workers, the chunk scheduler and the
 * public tf_order_rank_rows / tf_order_row_of. A step of `micro` global
 * batches is balanced at once (tf_order_balance); the cache keeps the last
 * step computed (rows: micro x global_batch entries, malloc'd on first use;
 * free with tf__balance_cache_free). */
typedef struct tf__balance_cache {
    uint64_t *rows;
    size_t n;       /* entries of rows filled (0: none yet) */
    uint64_t start; /* position of the step's first row */
} tf__balance_cache;

/* The B = global_batch / world positions that rank `rank` reads as its rows
 * of global batch `batch`: *rows points into the cache (valid until it is
 * used for another step). -ERANGE past the end of the stream. */
TF_HIDDEN int tf__balance_rows(const tf_order *o, tf_balance mode, uint32_t world, uint32_t micro, uint64_t batch,
                               uint32_t rank, tf__balance_cache *c, const uint64_t **rows);
TF_HIDDEN void tf__balance_cache_free(tf__balance_cache *c);

#endif
