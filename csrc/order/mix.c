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
 *
 * The past of a mixture whose weights were changed
 * ------------------------------------------------
 * After tf_order_mix_set_weights (or a resume from a state that lists
 * changes) the order's own schedule holds from the last change on. Before it,
 * the stream was the schedule it began with (`base`), then each recorded
 * change in turn: constant weights handed over where each source was. Those
 * hand-overs are a pure function of the base and the history, so a position
 * before the last change is answered by the schedule in force there, rebuilt
 * once (mix_past): the same source and index the run read. The rebuilt chain
 * must end where the order's own anchor says each source was; when it does not
 * (a base that is not the one the run began with), such positions are refused
 * with the reason, never answered with other data.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
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
     * first, which the state records: the first nprefix entries of hist
     * (shared with the other orders of the run), then, with has_last, the
     * last entry, this order's own (so that a call at its position can
     * replace it without touching what the others share) */
    struct mix_hist *hist;
    size_t nprefix;
    int has_last;
    uint64_t last_pos;
    double *last_w; /* K */
    /* the schedule the stream began with, before the first change of the
     * history (owned arrays; has_base 0: the order's own spec) */
    tf__sched_spec base;
    int has_base;
    struct mix_past *past; /* the schedules before the last change, built on first use */
} tf__mix;

/* Where each source was at each change of the history, and the schedules in
 * force before the last one (see the file comment). */
typedef struct mix_past {
    pthread_mutex_t mu;
    int built;       /* 0: not yet; 1: built; < 0: refused (why says why) */
    char why[480];
    size_t n;        /* changes */
    uint64_t *pos;   /* n: where each took effect */
    double *w;       /* n x K: its weights */
    uint64_t *counts;/* n x K: where each source was there */
    tf__sched *base; /* the schedule before the first change */
    size_t seg;      /* the change whose schedule seg_sched is (cached) */
    tf__sched *seg_sched;
} mix_past;

/* Entries of a weight history, shared by reference count and only ever
 * appended to: an order reads its first nprefix entries, which never change.
 * The lock covers appends (which may move the arrays) and reads. */
typedef struct mix_hist {
    _Atomic size_t refs;
    pthread_mutex_t mu;
    size_t n, cap, K;
    uint64_t *pos;
    double *w;
} mix_hist;

static void hist_release(mix_hist *h) {
    if (!h || atomic_fetch_sub(&h->refs, 1) != 1) return;
    pthread_mutex_destroy(&h->mu);
    free(h->pos);
    free(h->w);
    free(h);
}

static mix_hist *hist_new(size_t K) {
    mix_hist *h = calloc(1, sizeof *h);
    if (!h) return NULL;
    atomic_init(&h->refs, 1);
    pthread_mutex_init(&h->mu, NULL);
    h->K = K;
    return h;
}

/* Append one entry (h->mu held, or h not yet shared). */
static int hist_append(mix_hist *h, uint64_t pos, const double *w) {
    if (h->n == h->cap) {
        size_t cap = h->cap ? 2 * h->cap : 16;
        uint64_t *p = realloc(h->pos, cap * sizeof *p);
        if (!p) return -ENOMEM;
        h->pos = p;
        double *x = realloc(h->w, cap * h->K * sizeof *x);
        if (!x) return -ENOMEM;
        h->w = x;
        h->cap = cap;
    }
    h->pos[h->n] = pos;
    memcpy(h->w + h->n * h->K, w, h->K * sizeof *w);
    h->n++;
    return 0;
}

static void spec_free(tf__sched_spec *sp) {
    free((void *)sp->steps);
    free((void *)sp->weights);
    free((void *)sp->anchor_counts);
    memset(sp, 0, sizeof *sp);
}

/* A copy of *src with its own arrays (dst is overwritten, not freed). */
static int spec_dup(tf__sched_spec *dst, const tf__sched_spec *src) {
    size_t K = src->K, P = src->npoints;
    *dst = *src;
    dst->steps = NULL;
    dst->weights = NULL;
    dst->anchor_counts = NULL;
    uint64_t *steps = malloc(P * sizeof *steps), *anchor = NULL;
    double *w = malloc(P * K * sizeof *w);
    if (src->anchor_counts) anchor = malloc(K * sizeof *anchor);
    dst->steps = steps;
    dst->weights = w;
    dst->anchor_counts = anchor;
    if (!steps || !w || (src->anchor_counts && !anchor)) {
        spec_free(dst);
        return -ENOMEM;
    }
    memcpy(steps, src->steps, P * sizeof *steps);
    memcpy(w, src->weights, P * K * sizeof *w);
    if (anchor) memcpy(anchor, src->anchor_counts, K * sizeof *anchor);
    return 0;
}

static void past_clear(mix_past *p) {
    free(p->pos);
    free(p->w);
    free(p->counts);
    tf__sched_free(p->base);
    tf__sched_free(p->seg_sched);
    p->pos = NULL;
    p->w = NULL;
    p->counts = NULL;
    p->base = NULL;
    p->seg_sched = NULL;
    p->n = 0;
    p->built = 0;
    p->why[0] = 0;
}

static void past_free(mix_past *p) {
    if (!p) return;
    past_clear(p);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

static void mix_free(void *v) {
    tf__mix *m = v;
    if (!m) return;
    spec_free(&m->base);
    past_free(m->past);
    for (size_t s = 0; m->src && s < m->K; s++) tf_order_free(m->src[s].order);
    free(m->src);
    tf__sched_free(m->sched);
    tf_dataset_free(m->view);
    free(m->ds);
    free((void *)m->spec.steps);
    free((void *)m->spec.weights);
    free((void *)m->spec.anchor_counts);
    hist_release(m->hist);
    free(m->last_w);
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
    m->past = calloc(1, sizeof *m->past);
    if (m->past) pthread_mutex_init(&m->past->mu, NULL);
    int rc = 0;
    if (!m->src || !m->past) {
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
    const tf__order_kind *k = tf__order_kind_of((int)cfg->order);
    if (k && !k->mixable)
        TF_FAIL(-EINVAL, "order: another loader's order (%s) reads one dataset, not a mixture; use order 'tokenfeed'",
                k->name);
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

static tf__sched *sched_of(const tf_order *o, const tf__sched_spec *sp) {
    tf__sched_spec x = *sp;
    x.M = o->cfg.mix_window;
    x.G = o->cfg.global_batch;
    tf__sched *s = NULL;
    return tf__sched_create(&x, &s) ? NULL : s;
}

/* The schedule in force from change i on: its constant weights, handed over
 * where each source was. */
static tf__sched *change_sched(const tf_order *o, const mix_past *p, size_t K, size_t i) {
    static const uint64_t step0 = 0;
    tf__sched_spec sp = {.K = K, .npoints = 1, .steps = &step0, .weights = p->w + i * K, .allow_zero = 1,
                         .anchor_pos = p->pos[i], .anchor_counts = p->counts + i * K};
    return sched_of(o, &sp);
}

/* Rebuild the chain of schedules from the base through every change but the
 * last (p->mu held): where each source was at each change. 0, or -errno with
 * p->why saying why positions before the last change cannot be told. */
static int past_build(const tf_order *o, const tf__mix *m, mix_past *p) {
    size_t K = m->K, n = tf__order_mix_history_len(o);
    uint64_t G = o->cfg.global_batch;
    const tf__sched_spec *base = m->has_base ? &m->base : &m->spec;
    p->n = n;
    p->pos = malloc(n * sizeof *p->pos);
    p->w = malloc(n * K * sizeof *p->w);
    p->counts = malloc(n * K * sizeof *p->counts);
    if (!p->pos || !p->w || !p->counts) return -ENOMEM;
    for (size_t i = 0; i < n; i++) p->pos[i] = tf__order_mix_history_at(o, i, p->w + i * K);
    p->base = sched_of(o, base);
    if (!p->base) {
        snprintf(p->why, sizeof p->why, "the weights the mixture began with cannot be rebuilt (%s)", tf_last_error());
        return -TF_ESTATE;
    }
    tf__sched *prev = p->base;
    for (size_t i = 0; i < n; i++) {
        int oom = 0;
        for (size_t k = 0; k < K; k++) {
            p->counts[i * K + k] = tf__sched_count(prev, k, p->pos[i]);
            oom |= p->counts[i * K + k] == UINT64_MAX;
        }
        if (prev != p->base) tf__sched_free(prev);
        prev = NULL;
        if (oom) return -ENOMEM;
        if (i + 1 < n && !(prev = change_sched(o, p, K, i))) {
            snprintf(p->why, sizeof p->why, "the weights set at step %llu cannot be rebuilt (%s)",
                     (unsigned long long)(p->pos[i] / G), tf_last_error());
            return -TF_ESTATE;
        }
    }
    const uint64_t *last = p->counts + (n - 1) * K;
    if (!m->spec.anchor_counts || m->spec.anchor_pos != p->pos[n - 1] ||
        memcmp(last, m->spec.anchor_counts, K * sizeof *last)) {
        snprintf(p->why, sizeof p->why, "the weights this mixture began with are not the ones its run began with: "
                 "they do not lead to where the state says each source was when the weights were last set "
                 "(step %llu)", (unsigned long long)(p->pos[n - 1] / G));
        return -TF_ESTATE;
    }
    return 0;
}

/* Source (*src) and index (*j) of a position before the last change
 * (m->has_last, pos < m->last_pos); with count_k, *j is instead the positions
 * of source *count_k among [0, pos). 0, or -errno with the error set when it
 * cannot be told. */
static int past_at(const tf_order *o, uint64_t pos, const size_t *count_k, uint32_t *srcp, uint64_t *j) {
    const tf__mix *m = o->impl;
    mix_past *p = m->past;
    uint64_t G = o->cfg.global_batch;
    const tf__sched_spec *base = m->has_base ? &m->base : &m->spec;
    uint32_t src = UINT32_MAX;
    int rc = 0;
    pthread_mutex_lock(&p->mu);
    if (!p->built) {
        rc = past_build(o, m, p);
        if (rc) {
            if (!*p->why) snprintf(p->why, sizeof p->why, "out of memory rebuilding the mixture's weight changes");
            p->built = rc;
        } else {
            p->built = 1;
        }
    }
    if (p->built < 0) {
        rc = tf__seterr(p->built, "step %llu is before the mixture's last weight change (step %llu), and %s: build the "
                   "Loader with the weights the run began with and load the state saved by the run",
                   (unsigned long long)(pos / G), (unsigned long long)(m->last_pos / G), p->why);
        goto out;
    }
    size_t lo = 0, hi = p->n; /* the first change after pos: pos[i] <= pos for i < lo */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (p->pos[mid] <= pos) lo = mid + 1;
        else hi = mid;
    }
    const tf__sched *sc = p->base;
    if (lo == 0 && base->anchor_counts && pos < base->anchor_pos) {
        rc = tf__seterr(-TF_ESTATE, "step %llu is before step %llu, where this mixture was resumed under other weights "
                   "(strict=False) or handed over, and no state records the weights before that: explain it on a "
                   "Loader restored from a checkpoint of before the hand-over",
                   (unsigned long long)(pos / G), (unsigned long long)(base->anchor_pos / G));
        goto out;
    }
    if (lo > 0) {
        if (!p->seg_sched || p->seg != lo - 1) {
            tf__sched_free(p->seg_sched);
            p->seg_sched = change_sched(o, p, m->K, lo - 1);
            p->seg = lo - 1;
            if (!p->seg_sched) {
                rc = tf__seterr(-ENOMEM, "out of memory rebuilding the mixture's weights set at step %llu",
                           (unsigned long long)(p->pos[lo - 1] / G));
                goto out;
            }
        }
        sc = p->seg_sched;
    }
    if (count_k) {
        *j = tf__sched_count(sc, *count_k, pos);
        src = *j == UINT64_MAX ? UINT32_MAX : 0;
    } else {
        src = tf__sched_at(sc, pos, j);
    }
    if (src == UINT32_MAX) rc = tf__seterr(-ENOMEM, "out of memory building a mixture schedule table");
    *srcp = src;
out:
    pthread_mutex_unlock(&p->mu);
    return rc;
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
    if (m->has_last && pos < m->last_pos) {
        uint32_t s;
        return past_at(o, pos, NULL, &s, &j) ? UINT64_MAX : m->src[s].first + tf_order_sample_at(m->src[s].order, j);
    }
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

int tf__order_mix_base(const tf_order *o, tf__sched_spec *base) {
    const tf__mix *m = mix_of(o);
    if (!m) return -EINVAL;
    *base = m->has_base ? m->base : m->spec;
    return 0;
}

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
    if (m->has_last && pos < m->last_pos) {
        uint32_t s;
        TF_TRY(past_at(o, pos, NULL, &s, index));
        *source = s;
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
    if (i >= m->K) return 0;
    if (m->has_last && pos < m->last_pos) {
        uint32_t unused;
        uint64_t c;
        return past_at(o, pos, &i, &unused, &c) ? UINT64_MAX : c;
    }
    return tf__sched_count(m->sched, i, pos);
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
    int rc = tf__order_mix_inherit_history(*out, like, NULL);
    if (!rc) rc = tf__order_set_skips(*out, like->skips, like->nskips);
    if (!rc) rc = tf__order_set_excluded(*out, like->excl, like->nexcl);
    if (rc) {
        tf_order_free(*out);
        *out = NULL;
    }
    return rc;
}

size_t tf__order_mix_history_len(const tf_order *o) {
    const tf__mix *m = mix_of(o);
    return m ? m->nprefix + (m->has_last != 0) : 0;
}

uint64_t tf__order_mix_history_at(const tf_order *o, size_t i, double *w) {
    const tf__mix *m = mix_of(o);
    if (i == m->nprefix) {
        memcpy(w, m->last_w, m->K * sizeof *w);
        return m->last_pos;
    }
    mix_hist *h = m->hist;
    pthread_mutex_lock(&h->mu);
    uint64_t pos = h->pos[i];
    memcpy(w, h->w + i * m->K, m->K * sizeof *w);
    pthread_mutex_unlock(&h->mu);
    return pos;
}

static tf__mix *mix_mut(tf_order *o) { return o && o->ops == &mix_ops ? o->impl : NULL; }

/* o's history: the first nprefix entries of h (a reference the caller gives
 * up), then with pos/w its own last entry. */
static int hist_take(tf__mix *m, mix_hist *h, size_t nprefix, int has_last, uint64_t pos, const double *w) {
    if (!m->last_w) m->last_w = malloc(m->K * sizeof *m->last_w);
    if (!m->last_w) {
        hist_release(h);
        return -ENOMEM;
    }
    hist_release(m->hist); /* (the caller holds its own reference to h, the same or not) */
    pthread_mutex_lock(&m->past->mu);
    past_clear(m->past);
    pthread_mutex_unlock(&m->past->mu);
    m->hist = h;
    m->nprefix = h ? nprefix : 0;
    m->has_last = has_last;
    m->last_pos = pos;
    if (has_last) memcpy(m->last_w, w, m->K * sizeof *w);
    return 0;
}

int tf__order_mix_set_history(tf_order *o, size_t n, const uint64_t *pos, const double *w) {
    tf__mix *m = mix_mut(o);
    if (!m) return -EINVAL;
    mix_hist *h = n > 1 ? hist_new(m->K) : NULL;
    if (n > 1 && !h) return -ENOMEM;
    for (size_t i = 0; i + 1 < n; i++)
        if (hist_append(h, pos[i], w + i * m->K)) {
            hist_release(h);
            return -ENOMEM;
        }
    return hist_take(m, h, n ? n - 1 : 0, n > 0, n ? pos[n - 1] : 0, n ? w + (n - 1) * m->K : NULL);
}

int tf__order_mix_inherit_history(tf_order *o, const tf_order *like, const double *w) {
    tf__mix *m = mix_mut(o);
    const tf__mix *lm = mix_of(like);
    if (!m || !lm || m->K != lm->K) return -EINVAL;
    TF_TRY(tf__order_mix_set_base(o, lm->has_base ? &lm->base : &lm->spec));
    mix_hist *h = lm->hist;
    size_t np = lm->nprefix;
    if (h) atomic_fetch_add(&h->refs, 1);
    if (!w) /* the same history */
        return hist_take(m, h, np, lm->has_last, lm->last_pos, lm->last_w);
    uint64_t at = m->spec.anchor_pos;
    if (lm->has_last && lm->last_pos != at) { /* like's last entry took effect: it joins the shared entries */
        if (np + 1 >= TF_STATE_MAX_WEIGHTS_HISTORY) {
            hist_release(h);
            TF_FAIL(-EINVAL, "set_weights: the mixture's weights were changed at %zu positions already, the most "
                    "a state records (TF_STATE_MAX_WEIGHTS_HISTORY = %u): change them less often", np + 1,
                    TF_STATE_MAX_WEIGHTS_HISTORY);
        }
        int rc = 0, appended = 0;
        if (h) {
            pthread_mutex_lock(&h->mu);
            if (h->n == np) { /* like holds the newest of the shared entries: append in place */
                rc = hist_append(h, lm->last_pos, lm->last_w);
                appended = 1;
            }
            pthread_mutex_unlock(&h->mu);
        }
        if (!appended && !rc) { /* another order went on from like already: a copy of like's own */
            mix_hist *c = hist_new(m->K);
            if (!c) rc = -ENOMEM;
            for (size_t i = 0; !rc && i < np; i++) {
                pthread_mutex_lock(&h->mu);
                rc = hist_append(c, h->pos[i], h->w + i * m->K);
                pthread_mutex_unlock(&h->mu);
            }
            if (!rc) rc = hist_append(c, lm->last_pos, lm->last_w);
            hist_release(h);
            h = c;
        }
        if (rc) {
            hist_release(h);
            return rc;
        }
        np++;
    }
    return hist_take(m, h, np, 1, at, w);
}

int tf__order_mix_set_base(tf_order *o, const tf__sched_spec *base) {
    tf__mix *m = mix_mut(o);
    if (!m || base->K != m->K) return -EINVAL;
    if (m->has_base && base == &m->base) return 0;
    tf__sched_spec copy;
    TF_TRY(spec_dup(&copy, base));
    copy.M = o->cfg.mix_window;
    copy.G = o->cfg.global_batch;
    spec_free(&m->base);
    m->base = copy;
    m->has_base = 1;
    pthread_mutex_lock(&m->past->mu);
    past_clear(m->past);
    pthread_mutex_unlock(&m->past->mu);
    return 0;
}
