/*
 * kind.h — inside the order layer: the order object and the table of
 * operations behind which each kind of order lives. Not seen by the engine
 * (it uses order_internal.h) nor installed.
 *
 * An order answers, for a configuration over some data: which sample is at
 * stream position pos (sample_at), which token spans make that sample
 * (spans), its per-sample extras (extras) and the packing statistics of an
 * epoch (stats). order.c owns what every kind shares — the configuration and
 * its checks, the fingerprint, the number of positions, the epoch shuffle and
 * the generic fill of a sample from its spans — and calls the kind only
 * through its table. A kind owns its state (impl) and never calls back into
 * order.c, except a mixture, which is made of orders and uses them through
 * the public and engine-facing functions like any caller.
 *
 *   concat.c  CONCAT packing: the documents as one stream (with separators),
 *             cut every seq_len tokens
 *   pack.c    BEST_FIT and DOCUMENT packing: per-window plans of chunks
 *   mix.c     weighted mixtures of orders, one per dataset
 *   llmc_order.c  llm.c's data loader order: each file cut on its own, in
 *             per-process shuffled order
 *   megatron_order.c  Megatron-core GPTDataset's order, read from its index
 *             cache
 *   olmo_order.c  OLMo-core's NumpyFSLDataset instances in its data
 *             loader's seeded order
 *
 * A new kind of sample order (another packing, a view) is a new table and a
 * constructor. A new kind a configuration names (tf_order_config.order:
 * another loader's order to continue its run) is that, a row in kinds.c
 * (what the rest of the library asks of it: its constructor, the checks of
 * the data it needs, pad_id, its fingerprint, mixtures, processes) and its
 * name in the settings table's enum; no code elsewhere tests the kind. The
 * Megatron order is such a kind (its constructor reads the index cache named
 * by cfg.megatron_cache); tf_order_create_megatron builds the same order from
 * arrays the caller mapped. What must stay true
 * of every kind: sample_at, spans and extras are pure functions of (data,
 * config, argument), computed in O(1) memory in the number of samples, and
 * spans cover [0, seq_len + 1) exactly, in order (order_internal.h).
 */
#ifndef TF_ORDER_KIND_H
#define TF_ORDER_KIND_H

#include "../common/settings.h"
#include "order_internal.h"
#include "schedule.h"

/* Largest best_fit packing window: pack.c's sort key gives a document's index 24 bits. */

typedef struct tf__order_ops {
    const char *name;
    /* Sample at global position pos. NULL: the epoch shuffle over the order's
     * N samples (order.c), which plain and packed orders share. */
    uint64_t (*sample_at)(const tf_order *o, uint64_t pos);
    /* Spans of sample (< N; cap >= max_spans, both checked by order.c). */
    int (*spans)(const tf_order *o, uint64_t sample, tf__span *spans, size_t cap, size_t *n);
    /* Extras of sample (< N, checked); at least one pointer of ex is set. */
    int (*extras)(const tf_order *o, uint64_t sample, const tf_sample_extras *ex);
    /* Packing statistics of one epoch. */
    int (*stats)(const tf_order *o, tf_packing_stats *st);
    /* Free impl (may be NULL). */
    void (*destroy)(void *impl);
    /* Optional (NULL: every sample): samples [*first, *end) include every
     * sample that holds tokens of document doc (< the dataset's documents), so
     * that finding a document's samples (explain.c) need not visit them all. */
    int (*doc_samples)(const tf_order *o, uint64_t doc, uint64_t *first, uint64_t *end);
    /* Optional (NULL: nothing to prefetch): start the memory reads that
     * locating sample will need, so a worker can issue them for the rows
     * ahead before it computes any of their spans. stage 0 may only issue
     * prefetches of what is found from the sample alone; stage 1 may read
     * what stage 0 fetched and prefetch what it points to. Never reads
     * mapped token bytes (no SIGBUS guard needed); never fails. */
    void (*prefetch)(const tf_order *o, uint64_t sample, int stage);
} tf__order_ops;

struct tf_order {
    /* set by the kind's constructor */
    const tf__order_ops *ops;
    void *impl;            /* the kind's state */
    const tf_dataset *ds;  /* what spans index: the dataset, or a mixture's view of its sources */
    uint64_t N;            /* samples per epoch (>= 1) */
    uint64_t epoch_len;    /* positions per epoch; 0: N (an order that leaves samples out of every epoch sets it) */
    int pad_last;          /* the sample's last token is pad_id, its label never trained (tf__order_pads_last) */
    size_t max_spans;      /* upper bound on the spans of one sample (>= 1) */
    int has_kind_fp;       /* kind_fp enters the fingerprint (a mixture's schedule) */
    uint64_t kind_fp;
    /* set by order.c */
    tf_order_config cfg;
    uint64_t num_positions;
    uint64_t fingerprint;
    uint64_t nbf, wsz, nwin; /* BLOCK shuffle geometry (order.c) */
    /* positions a loader skips (tf_order_skip): nskips [start, stop) pairs,
     * ascending and disjoint; the order of the stream is unchanged */
    size_t nskips;
    uint64_t *skips;
    /* documents taken down from a position on (tf_order_exclude): nexcl
     * entries in the order they were made, each with its ids ascending and
     * distinct; kept with the order and its state, the stream unchanged */
    size_t nexcl;
    struct tf__excl *excl;
};

typedef struct tf__excl {
    uint64_t pos;
    size_t source;
    size_t n;
    uint64_t *ids; /* owned */
} tf__excl;

/* A kind's constructor: fills ops, impl, ds, N and max_spans of o (o->cfg is
 * set and checked) from args, or returns an error with nothing left to free.
 * An order with no sample is an error the constructor reports (it knows why). */
typedef int (*tf__order_init)(tf_order *o, const void *args);

/* order.c: check cfg, run init, derive positions, shuffle geometry and
 * fingerprint. On success *out owns the order (tf_order_free). */
TF_HIDDEN int tf__order_build(tf__order_init init, const void *args, const tf_order_config *cfg, tf_order **out);

/* order.c: the position in epoch e of sample (< N) of an order whose
 * sample_at is the epoch shuffle (not a mixture): the inverse of the shuffle. */
TF_HIDDEN uint64_t tf__order_position_of(const tf_order *o, uint64_t e, uint64_t sample);

/* Constructors; args is the const tf_dataset * the order reads. */
TF_HIDDEN int tf__concat_init(tf_order *o, const void *ds);   /* concat.c */
TF_HIDDEN int tf__packed_init(tf_order *o, const void *ds);   /* pack.c */
TF_HIDDEN int tf__olmo_init(tf_order *o, const void *ds);     /* olmo_order.c */
TF_HIDDEN int tf__llmc_init(tf_order *o, const void *ds);     /* llmc_order.c (cfg.llmc_processes; 0 is refused: tf_loader_create resolves it to world_size) */
TF_HIDDEN int tf__megatron_init(tf_order *o, const void *ds); /* megatron_order.c (reads cfg.megatron_cache) */
/* megatron_order.c: the same order from arrays the caller mapped (tf_order_create_megatron) */
typedef struct tf__megatron_args {
    const tf_dataset *ds;
    const tf_megatron_index *ix; /* borrowed, as the arrays */
} tf__megatron_args;
TF_HIDDEN int tf__megatron_index_init(tf_order *o, const void *args);
/* The kind fingerprints of another loader's orders (the version of their
 * algorithm), from the configuration alone, so that a saved state's
 * fingerprint can be recomputed from its config (state.c). */
TF_HIDDEN uint64_t tf__llmc_kind_fp(const tf_order_config *c);
TF_HIDDEN uint64_t tf__olmo_kind_fp(const tf_order_config *c);

/* concat.c: the CONCAT extras (no separator) of the L + 1 dataset tokens that
 * start at token p0, for kinds that cut the tokens at other places. */
TF_HIDDEN int tf__concat_extras_at(const tf_dataset *ds, uint64_t L, uint64_t p0, const tf_sample_extras *ex);

/* Fingerprint of a configuration (order.c); an order's is this, mixed with
 * its kind's (a mixture's schedule): tf_mix64(config ^ kind). */
TF_HIDDEN uint64_t tf__order_config_fingerprint(const tf_order_config *c);

/* A mixture's schedule as built (mix.c; -EINVAL for another kind): the
 * spec (with its anchor; M and G are the config's) and the datasets, both
 * borrowed from o. */
TF_HIDDEN int tf__order_mix_spec(const tf_order *o, tf__sched_spec *spec, const tf_dataset *const **ds);
/* A mixture over like's datasets with another config and schedule (and
 * like's weight history). */
TF_HIDDEN int tf__order_mix_create(const tf_order *like, const tf_order_config *cfg, const tf__sched_spec *spec,
                                   tf_order **out);
/* The weights a mixture was given while its stream ran (tf_order_mix_set_weights),
 * oldest first: their number (0 for another order), and entry i's position and
 * K weights (copied to w). set_history replaces them with n given entries (a
 * resumed state's). inherit_history gives o (built from like) like's history
 * and, with w, one more entry at o's hand-over position; an entry at the
 * position of like's last replaces it (of calls at one position only the last
 * took effect). O(K) amortised: the entries before the last are shared between
 * the orders of one run, appended to in place, never copied per call. */
TF_HIDDEN size_t tf__order_mix_history_len(const tf_order *o);
TF_HIDDEN uint64_t tf__order_mix_history_at(const tf_order *o, size_t i, double *w);
TF_HIDDEN int tf__order_mix_set_history(tf_order *o, size_t n, const uint64_t *pos, const double *w);
TF_HIDDEN int tf__order_mix_inherit_history(tf_order *o, const tf_order *like, const double *w);
/* The schedule a mixture's stream began with, before the first change of its
 * history (its own spec when it has none): the state records it so that the
 * steps before a change are told from the state alone. set_base replaces it
 * (copied). */
TF_HIDDEN int tf__order_mix_base(const tf_order *o, tf__sched_spec *base);
TF_HIDDEN int tf__order_mix_set_base(tf_order *o, const tf__sched_spec *base);

/* The dataset's files as runs of units, for orders that cut each file on
 * its own (file_runs.c): unit u is unit u - cum[f] of file f = find(u). */
typedef struct tf__runs {
    size_t n;        /* files (>= 1) */
    uint64_t *first; /* n: the file's first token in the dataset (the allocation) */
    uint64_t *count; /* n: units of the file (init: its tokens, which the kind converts) */
    uint64_t *cum;   /* n + 1: units of the files before it (tf__runs_sum) */
} tf__runs;
/* Files of ds with their tokens in count; -EINVAL naming `who` without a file. */
TF_HIDDEN int tf__runs_init(tf__runs *r, const tf_dataset *ds, const char *who);
TF_HIDDEN void tf__runs_sum(tf__runs *r);
TF_HIDDEN void tf__runs_free(tf__runs *r);
TF_HIDDEN size_t tf__runs_find(const tf__runs *r, uint64_t unit);
/* Documents, empty, truncated and split documents and dropped tokens, when
 * file f is read as its tokens [0, count[f] * unit + overlap) in rows of L
 * tokens every L (rows of L + overlap tokens). */
TF_HIDDEN int tf__runs_doc_stats(const tf__runs *r, const tf_dataset *ds, uint64_t unit, uint64_t L, uint64_t overlap,
                                 tf_packing_stats *st);

/* Replace o's skipped ranges with n [start, stop) pairs (order.c). */
TF_HIDDEN int tf__order_set_skips(tf_order *o, const uint64_t *ranges, size_t n);
/* order.c: o's excluded documents become a copy of e[0, n) (replacing its own). */
TF_HIDDEN int tf__order_set_excluded(tf_order *o, const tf__excl *e, size_t n);
TF_HIDDEN void tf__excl_free(tf__excl *e, size_t n);


/* Building position_ids / cu_seqlens / num_seqs from segment starts, shared by
 * every kind: start with {last = 0, nc = 1} and cu_seqlens[0] = 0, call
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
