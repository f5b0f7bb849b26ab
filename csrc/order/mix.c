/*
 * mix.c — the order kind of weighted mixtures of datasets: one order per
 * dataset (a source), interleaved by a fixed schedule.
 *
 * Schedule
 * --------
 * Which source, and which sample of that source's own stream, each position
 * takes is decided by schedule.c: plain weights become exact counts per
 * window of positions, interleaved by a fixed table (j = k * c_s + rank[t]:
 * O(1), exact in every window, no drift); a weight schedule is a list of such
 * phases, constant or moving linearly from one point to the next, found by a
 * binary search over runs of windows with equal counts. One point is exactly
 * the plain-weights mixture (same assignment, same fingerprint).
 *
 * Sources
 * -------
 * Source s is an ordinary order over its dataset with the mixture's config,
 * except seed_s = mix64(seed ^ mix64(s + KEY_SOURCE)), epochs = 0 (infinite)
 * and global_batch = 1. Position j of its stream is epoch j / N_s of that
 * source, shuffled with its own key: a small source repeats (its epochs come
 * round faster), a large one is subsampled (the mixture moves on before its
 * epoch ends), and each keeps its own shuffle.
 *
 * Sample ids and the view
 * -----------------------
 * Sample ids of the mixture are prefix(s) + the source's sample id, prefix(s)
 * = N_0 + ... + N_{s-1}; N of the mixture = sum N_s, which also defines a
 * mixture "epoch" for cfg.epochs (positions = floor(epochs * N / G) * G). The
 * engine reads through one tf_dataset: a view whose file list concatenates
 * the sources' files (tf__dataset_concat_view: borrowed, never closed here),
 * so a source's spans are shifted by the tokens of the sources before it and
 * every read backend works unchanged. The view's fingerprint hashes the
 * sources' fingerprints in order; the schedule (K, W, c_s) enters the config
 * fingerprint. Packing statistics of a mixture are the sum of its sources'.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../sources/source.h"
#include "kind.h"
#include "schedule.h"

#define KEY_SOURCE 0x50C1A7ED5EED0003ULL
#define MAX_SOURCES 65536

typedef struct mix_source {
    tf_order *order;  /* its own order (seed_s, endless, global batch 1) */
    uint64_t tok_off; /* its first token in the view */
    uint64_t first;   /* its first mixture sample id: prefix(s) */
} mix_source;

typedef struct tf__mix {
    size_t K;
    mix_source *src; /* K */
    tf__sched *sched;
    tf_dataset *view;
    /* what it was built from, for the loader state (state.c): the datasets
     * (borrowed) and a copy of the schedule with its anchor */
    const tf_dataset **ds;
    tf__sched_spec spec;
    /* weights set while the stream ran (tf_order_mix_set_weights), oldest
     * first: nhist entries of a position and K weights; the state records them */
    size_t nhist;
    uint64_t *hist_pos;
    double *hist_w;
} tf__mix;

static void mix_free(void *v) {
    tf__mix *m = v;
    if (!m) return;
    for (size_t s = 0; m->src && s < m->K; s++) tf_order_free(m->src[s].order);
    free(m->src);
    tf__sched_free(m->sched);
    tf_dataset_free(m->view);
    free(m->ds);
    free((void *)m->spec.steps);
    free((void *)m->spec.weights);
    free((void *)m->spec.anchor_counts);
    free(m->hist_pos);
    free(m->hist_w);
    free(m);
}

typedef struct mix_args {
    const tf_dataset *const *ds;
    size_t n;
    tf__sched_spec spec; /* K, steps, weights, interpolation, anchor; M and G come from the config */
} mix_args;

static const tf__order_ops mix_ops;

/* A copy of the datasets and the schedule, so that the state can record the
 * schedule and a resume can rebuild the mixture with a hand-over anchor. */
static int keep_spec(tf__mix *m, const tf_dataset *const *ds, const tf__sched_spec *sp) {
    size_t K = sp->K, P = sp->npoints;
    m->spec = *sp;
    m->spec.steps = NULL;
    m->spec.weights = NULL;
    m->spec.anchor_counts = NULL;
    uint64_t *steps = malloc(P * sizeof *steps), *anchor = NULL;
    double *w = malloc(P * K * sizeof *w);
    const tf_dataset **d = malloc(K * sizeof *d);
    if (sp->anchor_counts) anchor = malloc(K * sizeof *anchor);
    m->spec.steps = steps;
    m->spec.weights = w;
    m->spec.anchor_counts = anchor;
    m->ds = d;
    if (!steps || !w || !d || (sp->anchor_counts && !anchor)) return -ENOMEM;
    memcpy(steps, sp->steps, P * sizeof *steps);
    memcpy(w, sp->weights, P * K * sizeof *w);
    memcpy(d, ds, K * sizeof *d);
    if (anchor) memcpy(anchor, sp->anchor_counts, K * sizeof *anchor);
    return 0;
}

static int mix_init(tf_order *o, const void *args) {
    const mix_args *a = args;
    const tf_order_config *cfg = &o->cfg;
    size_t n = a->n;
    tf__mix *m = calloc(1, sizeof *m);
    if (!m) return -ENOMEM;
    m->K = n;
    m->src = calloc(n, sizeof *m->src);
    int rc = 0;
    if (!m->src) {
        rc = -ENOMEM;
        goto fail;
    }
    tf__sched_spec sp = a->spec;
    sp.M = cfg->mix_window;
    sp.G = cfg->global_batch;
    rc = tf__sched_create(&sp, &m->sched);
    if (rc) goto fail;
    rc = keep_spec(m, a->ds, &sp);
    if (rc) goto fail;

    for (size_t s = 0; s < n; s++) {
        tf_order_config sc = *cfg;
        sc.seed = tf_mix64(cfg->seed ^ tf_mix64(s + KEY_SOURCE));
        sc.epochs = 0;
        sc.global_batch = 1;
        rc = tf_order_create(a->ds[s], &sc, &m->src[s].order);
        if (rc) {
            char msg[400];
            snprintf(msg, sizeof msg, "%s", tf_last_error());
            rc = tf__seterr(rc, "mixture source %zu: %s", s, msg);
            goto fail;
        }
        if (s + 1 < n) m->src[s + 1].first = m->src[s].first + tf_order_num_samples(m->src[s].order);
        else o->N = m->src[s].first + tf_order_num_samples(m->src[s].order);
        size_t ms = tf__order_max_spans(m->src[s].order);
        if (ms > o->max_spans) o->max_spans = ms;
    }
    rc = tf__dataset_concat_view(a->ds, n, &m->view);
    if (rc) goto fail;
    for (size_t s = 1; s < n; s++) m->src[s].tok_off = m->src[s - 1].tok_off + a->ds[s - 1]->num_tokens;
    o->kind_fp = tf__sched_fingerprint(m->sched);
    o->has_kind_fp = 1;
    o->ops = &mix_ops;
    o->impl = m;
    o->ds = m->view;
    return 0;
fail:
    mix_free(m);
    return rc;
}

static int create_mix(const tf_dataset *const *ds, size_t n, const tf__sched_spec *spec, const tf_order_config *cfg,
                      tf_order **out) {
    if (n > MAX_SOURCES) TF_FAIL(-EINVAL, "a mixture takes at most %d sources, found %zu", MAX_SOURCES, n);
    if (cfg->order != TF_ORDER_TOKENFEED)
        TF_FAIL(-EINVAL, "order: another loader's order (llmc, olmo) reads one dataset, not a mixture; use order 'tokenfeed'");
    for (size_t s = 0; s < n; s++)
        if (!ds[s]) TF_FAIL(-EINVAL, "tf_order_create_mix: dataset %zu is NULL", s);
    mix_args a = {ds, n, *spec};
    return tf__order_build(mix_init, &a, cfg, out);
}

int tf_order_create_mix(const tf_dataset *const *ds, const double *weights, size_t n,
                        const tf_order_config *cfg, tf_order **out) {
    TF_NEED_ARG(out);
    *out = NULL;
    tf__clearerr();
    if (!ds || !weights || !cfg || n == 0)
        TF_FAIL(-EINVAL, "tf_order_create_mix: datasets, weights (n >= 1) and config are required");
    static const uint64_t step0 = 0;
    tf__sched_spec sp = {.K = n, .npoints = 1, .steps = &step0, .weights = weights};
    return create_mix(ds, n, &sp, cfg, out);
}

int tf_order_create_mix_schedule(const tf_dataset *const *ds, size_t n, const tf_mix_schedule *sch,
                                 const tf_order_config *cfg, tf_order **out) {
    TF_NEED_ARG(out);
    *out = NULL;
    tf__clearerr();
    if (!ds || !sch || !cfg || n == 0 || sch->num_points == 0 || !sch->steps || !sch->weights)
        TF_FAIL(-EINVAL, "tf_order_create_mix_schedule: datasets (n >= 1), a schedule with points and a config are required");
    if (sch->interpolation != TF_MIX_CONSTANT && sch->interpolation != TF_MIX_LINEAR)
        TF_FAIL(-EINVAL, "schedule interpolation: expected TF_MIX_CONSTANT (0) or TF_MIX_LINEAR (1), found %d",
                (int)sch->interpolation);
    tf__sched_spec sp = {.K = n, .npoints = sch->num_points, .steps = sch->steps, .weights = sch->weights,
                         .linear = sch->interpolation == TF_MIX_LINEAR, .allow_zero = 1,
                         .anchor_pos = sch->anchor_position, .anchor_counts = sch->anchor_counts};
    return create_mix(ds, n, &sp, cfg, out);
}

/* Source of mixture sample id `sample` (< N). */
static const mix_source *source_of(const tf__mix *m, uint64_t sample) {
    size_t lo = 0, hi = m->K; /* src[lo].first <= sample < src[hi].first (src[K].first = N) */
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (m->src[mid].first <= sample) lo = mid;
        else hi = mid;
    }
    return &m->src[lo];
}

/* UINT64_MAX (a sample past N, which the fill reports as an error) when the
 * schedule's table cache cannot be allocated. */
static uint64_t mix_sample_at(const tf_order *o, uint64_t pos) {
    const tf__mix *m = o->impl;
    uint64_t j;
    uint32_t s = tf__sched_at(m->sched, pos, &j);
    if (s == UINT32_MAX) {
        tf__seterr(-ENOMEM, "out of memory building a mixture schedule table");
        return UINT64_MAX;
    }
    return m->src[s].first + tf_order_sample_at(m->src[s].order, j);
}

static int mix_spans(const tf_order *o, uint64_t sample, tf__span *spans, size_t cap, size_t *n) {
    const tf__mix *m = o->impl;
    const mix_source *src = source_of(m, sample);
    TF_TRY(tf__order_sample_spans(src->order, sample - src->first, spans, cap, n));
    for (size_t i = 0; i < *n; i++)
        if (spans[i].src < TF_SPAN_PAD) spans[i].src += src->tok_off;
    return 0;
}

static int mix_extras(const tf_order *o, uint64_t sample, const tf_sample_extras *ex) {
    const tf__mix *m = o->impl;
    const mix_source *src = source_of(m, sample);
    return tf__order_fill_extras(src->order, sample - src->first, ex);
}

/* The sum over the sources, each over its own epoch. */
static int mix_stats(const tf_order *o, tf_packing_stats *st) {
    const tf__mix *m = o->impl;
    tf_packing_stats sum, one;
    memset(&sum, 0, sizeof sum);
    for (size_t s = 0; s < m->K; s++) {
        TF_TRY(tf_order_packing_stats(m->src[s].order, &one));
        sum.samples += one.samples;
        sum.documents += one.documents;
        sum.empty_documents += one.empty_documents;
        sum.token_slots += one.token_slots;
        sum.pad_tokens += one.pad_tokens;
        sum.documents_split += one.documents_split;
        sum.documents_truncated += one.documents_truncated;
        sum.tokens_dropped += one.tokens_dropped;
    }
    sum.padding_fraction = sum.token_slots ? (double)sum.pad_tokens / (double)sum.token_slots : 0.0;
    *st = sum;
    return 0;
}

static const tf__order_ops mix_ops = {.name = "mixture", .sample_at = mix_sample_at, .spans = mix_spans,
                                      .extras = mix_extras, .stats = mix_stats, .destroy = mix_free};

/* ------------------------------------------------------------------------ */
/* the mixture queries of the public API                                     */
/* ------------------------------------------------------------------------ */

static const tf__mix *mix_of(const tf_order *o) { return o && o->ops == &mix_ops ? o->impl : NULL; }

size_t tf_order_num_sources(const tf_order *o) {
    const tf__mix *m = mix_of(o);
    return !o ? 0 : m ? m->K : 1;
}

const tf_order *tf_order_source(const tf_order *o, size_t i) {
    const tf__mix *m = mix_of(o);
    if (!o) return NULL;
    if (!m) return i == 0 ? o : NULL;
    return i < m->K ? m->src[i].order : NULL;
}

uint64_t tf_order_mix_window(const tf_order *o) {
    const tf__mix *m = mix_of(o);
    if (!m) return 1;
    uint64_t *c = malloc(m->K * sizeof *c);
    if (!c) return 0;
    uint64_t W = tf__sched_counts_at(m->sched, 0, c);
    free(c);
    return W;
}

uint64_t tf_order_mix_count(const tf_order *o, size_t i) {
    const tf__mix *m = mix_of(o);
    if (!o) return 0;
    if (!m) return i == 0;
    if (i >= m->K) return 0;
    uint64_t *c = malloc(m->K * sizeof *c);
    if (!c) return 0;
    tf__sched_counts_at(m->sched, 0, c);
    uint64_t r = c[i];
    free(c);
    return r;
}

uint64_t tf_order_mix_counts_at(const tf_order *o, uint64_t pos, uint64_t *counts) {
    const tf__mix *m = mix_of(o);
    if (!o || !counts) return 0;
    if (!m) {
        counts[0] = 1;
        return 1;
    }
    return tf__sched_counts_at(m->sched, pos, counts);
}

int tf_order_mix_source_at(const tf_order *o, uint64_t pos, size_t *source, uint64_t *index) {
    TF_NEED_ARG(o);
    TF_NEED_ARG(source);
    TF_NEED_ARG(index);
    const tf__mix *m = mix_of(o);
    if (!m) {
        *source = 0;
        *index = pos;
        return 0;
    }
    uint32_t s = tf__sched_at(m->sched, pos, index);
    if (s == UINT32_MAX) TF_FAIL(-ENOMEM, "out of memory building a mixture schedule table");
    *source = s;
    return 0;
}

uint64_t tf_order_mix_source_count(const tf_order *o, size_t i, uint64_t pos) {
    const tf__mix *m = mix_of(o);
    if (!o) return 0;
    if (!m) return i == 0 ? pos : 0;
    return i < m->K ? tf__sched_count(m->sched, i, pos) : 0;
}

int tf__order_mix_spec(const tf_order *o, tf__sched_spec *spec, const tf_dataset *const **ds) {
    const tf__mix *m = mix_of(o);
    if (!m) return -EINVAL;
    *spec = m->spec;
    if (ds) *ds = m->ds;
    return 0;
}

int tf__order_mix_create(const tf_order *like, const tf_order_config *cfg, const tf__sched_spec *spec,
                         tf_order **out) {
    const tf__mix *m = mix_of(like);
    *out = NULL;
    if (!m) return -EINVAL;
    if (spec->K != m->K)
        TF_FAIL(-EINVAL, "the mixture has %zu sources, the schedule %zu", m->K, spec->K);
    TF_TRY(create_mix(m->ds, m->K, spec, cfg, out));
    int rc = tf__order_mix_set_history(*out, m->nhist, m->hist_pos, m->hist_w, NULL);
    if (!rc) rc = tf__order_set_skips(*out, like->skips, like->nskips);
    if (rc) {
        tf_order_free(*out);
        *out = NULL;
    }
    return rc;
}

size_t tf__order_mix_history(const tf_order *o, const uint64_t **pos, const double **w) {
    const tf__mix *m = mix_of(o);
    if (!m) return 0;
    *pos = m->hist_pos;
    *w = m->hist_w;
    return m->nhist;
}

int tf__order_mix_set_history(tf_order *o, size_t n, const uint64_t *pos, const double *w, const double *extra_w) {
    tf__mix *m = o && o->ops == &mix_ops ? o->impl : NULL;
    if (!m) return -EINVAL;
    size_t total = n + (extra_w != NULL), K = m->K;
    uint64_t *hp = total ? malloc(total * sizeof *hp) : NULL;
    double *hw = total ? malloc(total * K * sizeof *hw) : NULL;
    if (total && (!hp || !hw)) {
        free(hp);
        free(hw);
        return -ENOMEM;
    }
    if (n) {
        memcpy(hp, pos, n * sizeof *hp);
        memcpy(hw, w, n * K * sizeof *hw);
    }
    if (extra_w) {
        hp[n] = m->spec.anchor_pos;
        memcpy(hw + n * K, extra_w, K * sizeof *hw);
    }
    free(m->hist_pos);
    free(m->hist_w);
    m->hist_pos = hp;
    m->hist_w = hw;
    m->nhist = total;
    return 0;
}
