/*
 * mix.c — the order kind of weighted mixtures of datasets: one order per
 * dataset (a source), interleaved by a fixed schedule.
 *
 * Schedule
 * --------
 * Weights w_s (s = 0 .. K-1) become integer counts per window of M =
 * mix_window positions: c_s = floor(M * w_s / sum w), the M - sum c_s left go
 * one each to the largest fractional parts (ties: lower s); then every c_s and
 * M are divided by gcd(c_0, ..., c_{K-1}). W = the reduced M. A table of W
 * entries assigns each offset t of a window to a source by smooth weighted
 * round-robin (at each t every source gains c_s credit, the source with the
 * most credit, lowest s on ties, is chosen and pays W), so each source gets
 * exactly c_s offsets, spread evenly; rank[t] = how many earlier offsets of
 * the window went to the same source. Then position pos, k = pos / W,
 * t = pos % W, belongs to source s = src[t] as the j-th position of that
 * source's own stream, j = k * c_s + rank[t]: O(1), and exact in every window
 * [k*W, (k+1)*W) — no drift, no randomness in the counts.
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

#define KEY_SOURCE 0x50C1A7ED5EED0003ULL
#define MAX_MIX_WINDOW (1u << 20)
#define MAX_SOURCES 65536

typedef struct mix_source {
    tf_order *order;  /* its own order (seed_s, endless, global batch 1) */
    uint64_t tok_off; /* its first token in the view */
    uint64_t first;   /* its first mixture sample id: prefix(s) */
    uint64_t count;   /* c_s: its positions per window */
} mix_source;

typedef struct mix_slot {
    uint32_t src;  /* the source of window offset t */
    uint32_t rank; /* offsets of the same source before t in the window */
} mix_slot;

typedef struct tf__mix {
    size_t K;
    mix_source *src; /* K */
    uint64_t W;
    mix_slot *tab;   /* W */
    tf_dataset *view;
} tf__mix;

static void mix_free(void *v) {
    tf__mix *m = v;
    if (!m) return;
    for (size_t s = 0; m->src && s < m->K; s++) tf_order_free(m->src[s].order);
    free(m->src);
    free(m->tab);
    tf_dataset_free(m->view);
    free(m);
}

static uint64_t gcd64(uint64_t a, uint64_t b) {
    while (b) {
        uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* Counts per window from the weights (see the top of the file). */
static int schedule_counts(const double *weights, size_t K, uint64_t M, mix_source *src, uint64_t *W) {
    double sum = 0;
    for (size_t s = 0; s < K; s++) {
        if (!(weights[s] > 0) || !isfinite(weights[s]))
            TF_FAIL(-EINVAL, "weights[%zu]: expected a finite weight > 0, found %g", s, weights[s]);
        sum += weights[s];
    }
    if (!isfinite(sum)) TF_FAIL(-EINVAL, "weights: the sum overflows");
    double *frac = malloc(K * sizeof *frac);
    if (!frac) return -ENOMEM;
    uint64_t used = 0;
    for (size_t s = 0; s < K; s++) {
        double q = (double)M * (weights[s] / sum);
        src[s].count = (uint64_t)floor(q);
        if (src[s].count > M) src[s].count = M;
        frac[s] = q - (double)src[s].count;
        used += src[s].count;
    }
    while (used < M) { /* largest remainder, lowest index on ties */
        size_t best = 0;
        for (size_t s = 1; s < K; s++)
            if (frac[s] > frac[best]) best = s;
        src[best].count++;
        frac[best] = -1;
        used++;
    }
    free(frac);
    for (size_t s = 0; s < K; s++)
        if (src[s].count == 0)
            TF_FAIL(-EINVAL, "weights[%zu] = %g rounds to 0 positions in a window of %llu: raise mix_window or the weight",
                    s, weights[s], (unsigned long long)M);
    uint64_t g = 0;
    for (size_t s = 0; s < K; s++) g = gcd64(g, src[s].count);
    for (size_t s = 0; s < K; s++) src[s].count /= g;
    *W = M / g;
    return 0;
}

typedef struct mix_args {
    const tf_dataset *const *ds;
    const double *weights;
    size_t n;
} mix_args;

static const tf__order_ops mix_ops;

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
    rc = schedule_counts(a->weights, n, cfg->mix_window, m->src, &m->W);
    if (rc) goto fail;
    m->tab = malloc(m->W * sizeof *m->tab);
    int64_t *credit = calloc(n, sizeof *credit);
    uint32_t *given = calloc(n, sizeof *given);
    if (!m->tab || !credit || !given) {
        free(credit);
        free(given);
        rc = -ENOMEM;
        goto fail;
    }
    for (uint64_t t = 0; t < m->W; t++) {
        size_t best = 0;
        for (size_t s = 0; s < n; s++) {
            credit[s] += (int64_t)m->src[s].count;
            if (credit[s] > credit[best]) best = s;
        }
        credit[best] -= (int64_t)m->W;
        m->tab[t] = (mix_slot){(uint32_t)best, given[best]++};
    }
    free(credit);
    free(given);

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
    {
        tf__xxh64_state h;
        uint8_t rec[8];
        tf__xxh64_reset(&h, 0x4D49585343484544ULL); /* "MIXSCHED" */
        tf__put_le64(rec, n);
        tf__xxh64_update(&h, rec, 8);
        tf__put_le64(rec, m->W);
        tf__xxh64_update(&h, rec, 8);
        for (size_t s = 0; s < n; s++) {
            tf__put_le64(rec, m->src[s].count);
            tf__xxh64_update(&h, rec, 8);
        }
        o->kind_fp = tf__xxh64_digest(&h);
        o->has_kind_fp = 1;
    }
    o->ops = &mix_ops;
    o->impl = m;
    o->ds = m->view;
    return 0;
fail:
    mix_free(m);
    return rc;
}

int tf_order_create_mix(const tf_dataset *const *ds, const double *weights, size_t n,
                        const tf_order_config *cfg, tf_order **out) {
    if (!out) return -EINVAL;
    *out = NULL;
    tf__clearerr();
    if (!ds || !weights || !cfg || n == 0)
        TF_FAIL(-EINVAL, "tf_order_create_mix: datasets, weights (n >= 1) and config are required");
    if (n > MAX_SOURCES) TF_FAIL(-EINVAL, "a mixture takes at most %d sources, found %zu", MAX_SOURCES, n);
    for (size_t s = 0; s < n; s++)
        if (!ds[s]) TF_FAIL(-EINVAL, "tf_order_create_mix: dataset %zu is NULL", s);
    if (cfg->mix_window < 1 || cfg->mix_window > MAX_MIX_WINDOW)
        TF_FAIL(-EINVAL, "mix_window: expected 1 <= mix_window <= %u, found %llu", MAX_MIX_WINDOW,
                (unsigned long long)cfg->mix_window);
    mix_args a = {ds, weights, n};
    return tf__order_build(mix_init, &a, cfg, out);
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

static uint64_t mix_sample_at(const tf_order *o, uint64_t pos) {
    const tf__mix *m = o->impl;
    uint64_t k = pos / m->W, t = pos % m->W;
    const mix_source *src = &m->src[m->tab[t].src];
    uint64_t j = k * src->count + m->tab[t].rank;
    return src->first + tf_order_sample_at(src->order, j);
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
    return m ? m->W : 1;
}

uint64_t tf_order_mix_count(const tf_order *o, size_t i) {
    const tf__mix *m = mix_of(o);
    if (!o) return 0;
    if (!m) return i == 0;
    return i < m->K ? m->src[i].count : 0;
}
