/*
 * state.c — the loader state: what a checkpoint keeps to resume a stream, as
 * a JSON object (docs/design.md, "The state"):
 *
 *   format_version       2 (states of version 1 still load)
 *   dataset_fingerprint  16 hex digits: the data (a mixture: its sources, in order)
 *   config_fingerprint   16 hex digits: the order's configuration
 *   position             global position (samples) of the next batch
 *   samples_per_epoch    of the order, for messages
 *   world_size           data-parallel ranks when saved (any size that divides
 *                        the global batch resumes)
 *   config               one member per order setting of the settings table:
 *                        its value when it changes the stream, else null;
 *                        and weights / schedule_steps / interpolation of a
 *                        mixture (null without one)
 *   mix_anchor           null, or [position, [samples each source had delivered
 *                        there]]: the hand-over of a mixture resumed under
 *                        other weights, or given weights while it ran
 *   excluded             null, or [[position, source, [ids]], ...]: documents
 *                        taken down from a position on (tf_order_exclude),
 *                        ids ascending and distinct; absent in older states
 *   skipped              null, or [[start, stop], ...]: global positions the
 *                        loader skips (tf_order_skip: the data of some steps
 *                        left out), ascending
 *   weights_history      null, or [[position, [weights]], ...]: the weights a
 *                        mixture was given while its stream ran
 *                        (tf_order_mix_set_weights), oldest first. A state
 *                        that lists some resumes with the last of them and
 *                        its anchor, whatever weights the loader was built with
 *   weights_initial      null, or with weights_history [weights,
 *                        schedule_steps, interpolation, mix_anchor]: the
 *                        mixture before the first change (as config and
 *                        mix_anchor write them), so that the steps before a
 *                        change are told from the state alone (mix.c)
 *   order                null for tokenfeed's own orders; for an order that
 *                        reproduces another loader's, [its name, 16 hex
 *                        digits: the fingerprint of the data of its own it
 *                        reads] (["megatron", ...]: the index cache), which
 *                        enters config_fingerprint
 *
 * Every key is always present and every value is an integer, a double, a
 * string, null or a list of them, so that every checkpointer keeps the state
 * whatever the loader's history (torch.distributed.checkpoint only fills the
 * keys a freshly built loader already has, and traverses nested objects).
 *
 * A resume compares each setting only where it changes the stream (a block
 * size under a full shuffle is never compared), so a state is refused exactly
 * when the stream would differ. Each field is checked for its type.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kind.h"
#include "../common/settings.h"

#define STATE_VERSION 2
#define DIFFS 480

static uint64_t dataset_fp(const tf_order *o) {
    tf_dataset_info in;
    return tf_dataset_get_info(tf_order_dataset(o), &in) == 0 ? in.fingerprint : 0;
}

/* ------------------------------------------------------------------ save */

static void write_doubles(tf__jw *w, const double *d, size_t n) {
    tf__jw_printf(w, "[");
    for (size_t i = 0; i < n; i++) {
        if (i) tf__jw_printf(w, ", ");
        tf__jw_double(w, d[i]);
    }
    tf__jw_printf(w, "]");
}

/* weights, schedule_steps and interpolation of a mixture (nulls without one):
 * plain weights as one list, a schedule as a list per point. */
static void write_mixture(tf__jw *w, const tf__sched_spec *sp) {
    if (!sp) {
        tf__jw_printf(w, "\"weights\": null, \"schedule_steps\": null, \"interpolation\": null");
        return;
    }
    tf__jw_printf(w, "\"weights\": ");
    if (sp->npoints == 1 && !sp->linear) {
        write_doubles(w, sp->weights, sp->K);
        tf__jw_printf(w, ", \"schedule_steps\": null, \"interpolation\": null");
        return;
    }
    tf__jw_printf(w, "[");
    for (size_t p = 0; p < sp->npoints; p++) {
        if (p) tf__jw_printf(w, ", ");
        write_doubles(w, sp->weights + p * sp->K, sp->K);
    }
    tf__jw_printf(w, "], \"schedule_steps\": [");
    for (size_t p = 0; p < sp->npoints; p++) tf__jw_printf(w, "%s%llu", p ? ", " : "", (unsigned long long)sp->steps[p]);
    tf__jw_printf(w, "], \"interpolation\": \"%s\"", sp->linear ? "linear" : "constant");
}

static void write_history(tf__jw *w, const tf_order *o) {
    size_t n = tf__order_mix_history_len(o), K = tf_order_num_sources(o);
    double *hw = n ? malloc(K * sizeof *hw) : NULL;
    if (!n || !hw) {
        if (n) w->rc = -ENOMEM;
        tf__jw_printf(w, "null");
        return;
    }
    tf__jw_printf(w, "[");
    for (size_t i = 0; i < n; i++) {
        uint64_t pos = tf__order_mix_history_at(o, i, hw);
        tf__jw_printf(w, "%s[%llu, ", i ? ", " : "", (unsigned long long)pos);
        write_doubles(w, hw, K);
        tf__jw_printf(w, "]");
    }
    tf__jw_printf(w, "]");
    free(hw);
}

/* [weights, schedule_steps, interpolation, mix_anchor] of the mixture before
 * the first change of its history; null without a history. */
static void write_initial(tf__jw *w, const tf_order *o) {
    tf__sched_spec sp;
    if (!tf__order_mix_history_len(o) || tf__order_mix_base(o, &sp)) {
        tf__jw_printf(w, "null");
        return;
    }
    tf__jw_printf(w, "[");
    if (sp.npoints == 1 && !sp.linear) {
        write_doubles(w, sp.weights, sp.K);
        tf__jw_printf(w, ", null, null, ");
    } else {
        tf__jw_printf(w, "[");
        for (size_t p = 0; p < sp.npoints; p++) {
            if (p) tf__jw_printf(w, ", ");
            write_doubles(w, sp.weights + p * sp.K, sp.K);
        }
        tf__jw_printf(w, "], [");
        for (size_t p = 0; p < sp.npoints; p++)
            tf__jw_printf(w, "%s%llu", p ? ", " : "", (unsigned long long)sp.steps[p]);
        tf__jw_printf(w, "], \"%s\", ", sp.linear ? "linear" : "constant");
    }
    if (sp.anchor_counts) {
        tf__jw_printf(w, "[%llu, [", (unsigned long long)sp.anchor_pos);
        for (size_t k = 0; k < sp.K; k++)
            tf__jw_printf(w, "%s%llu", k ? ", " : "", (unsigned long long)sp.anchor_counts[k]);
        tf__jw_printf(w, "]]]");
    } else {
        tf__jw_printf(w, "null]");
    }
}

static void write_setting(tf__jw *w, const tf__setting_row *r, const tf__cond_ctx *x) {
    int64_t v = tf__setting_get(r, x->cfg);
    if (!tf__setting_in_fingerprint(r, x) || (r->pub.nullable && v == r->pub.none_value))
        tf__jw_printf(w, "null");
    else if (r->pub.type == TF_SETTING_ENUM)
        tf__jw_printf(w, "\"%s\"", r->pub.names[v]);
    else if (r->is_signed || r->pub.min < 0)
        tf__jw_printf(w, "%lld", (long long)v);
    else
        tf__jw_printf(w, "%llu", (unsigned long long)v);
}

int tf_order_state_save(const tf_order *o, uint64_t pos, uint32_t world_size, char *buf, size_t cap, size_t *len) {
    TF_NEED_ARG(o);
    TF_NEED_BUF(buf, cap); /* cap 0 sizes the state */
    tf__clearerr();
    tf__sched_spec sp;
    int mixture = tf__order_mix_spec(o, &sp, NULL) == 0;
    tf__cond_ctx x = {&o->cfg, mixture, mixture && sp.npoints > 1};
    tf__jw w = {0};
    tf__jw_printf(&w, "{\"format_version\": %d, \"dataset_fingerprint\": \"%016llx\", \"config_fingerprint\": "
                  "\"%016llx\", \"position\": %llu, \"samples_per_epoch\": %llu, \"world_size\": %u, \"config\": {",
                  STATE_VERSION, (unsigned long long)dataset_fp(o), (unsigned long long)tf_order_fingerprint(o),
                  (unsigned long long)pos, (unsigned long long)tf_order_num_samples(o), world_size);
    for (size_t i = 0; i < tf__nsettings; i++) {
        const tf__setting_row *r = &tf__settings[i];
        if (r->pub.scope != TF_SCOPE_ORDER) continue;
        tf__jw_printf(&w, "\"%s\": ", r->pub.name);
        write_setting(&w, r, &x);
        tf__jw_printf(&w, ", ");
    }
    write_mixture(&w, mixture ? &sp : NULL);
    tf__jw_printf(&w, "}, \"mix_anchor\": ");
    if (mixture && sp.anchor_counts) {
        tf__jw_printf(&w, "[%llu, [", (unsigned long long)sp.anchor_pos);
        for (size_t k = 0; k < sp.K; k++)
            tf__jw_printf(&w, "%s%llu", k ? ", " : "", (unsigned long long)sp.anchor_counts[k]);
        tf__jw_printf(&w, "]]");
    } else {
        tf__jw_printf(&w, "null");
    }
    tf__jw_printf(&w, ", \"skipped\": ");
    if (!o->nskips) tf__jw_printf(&w, "null");
    for (size_t i = 0; i < o->nskips; i++)
        tf__jw_printf(&w, "%s[%llu, %llu]%s", i ? ", " : "[", (unsigned long long)o->skips[2 * i],
                      (unsigned long long)o->skips[2 * i + 1], i + 1 == o->nskips ? "]" : "");
    tf__jw_printf(&w, ", \"excluded\": ");
    if (!o->nexcl) tf__jw_printf(&w, "null");
    for (size_t i = 0; i < o->nexcl; i++) {
        const tf__excl *e = &o->excl[i];
        tf__jw_printf(&w, "%s[%llu, %zu, [", i ? ", " : "[", (unsigned long long)e->pos, e->source);
        for (size_t k = 0; k < e->n; k++)
            tf__jw_printf(&w, "%s%llu", k ? ", " : "", (unsigned long long)e->ids[k]);
        tf__jw_printf(&w, "]]%s", i + 1 == o->nexcl ? "]" : "");
    }
    tf__jw_printf(&w, ", \"weights_history\": ");
    write_history(&w, o);
    tf__jw_printf(&w, ", \"weights_initial\": ");
    write_initial(&w, o);
    const tf__order_kind *kind = tf__order_kind_of((int)o->cfg.order);
    if (kind && kind->data_fp) /* the one rule for another loader's order: kinds.c */
        tf__jw_printf(&w, ", \"order\": [\"%s\", \"%016llx\"]}", kind->name, (unsigned long long)o->kind_fp);
    else
        tf__jw_printf(&w, ", \"order\": null}");
    int rc = w.rc;
    if (!rc && w.len > TF_STATE_MAX_BYTES)
        rc = tf__seterr(-EINVAL, "the state would take %zu bytes, more than the %u a state may hold "
                        "(TF_STATE_MAX_BYTES): a mixture of many sources with a long weights_history", w.len,
                        TF_STATE_MAX_BYTES);
    if (!rc) {
        if (len) *len = w.len;
        if (cap) {
            size_t n = w.len < cap ? w.len : cap - 1;
            memcpy(buf, w.buf, n);
            buf[n] = 0;
        }
        if (w.len >= cap) rc = tf__seterr(-ENOSPC, "the state takes %zu bytes and a terminating NUL, the buffer holds %zu",
                                          w.len, cap);
    }
    free(w.buf);
    return rc;
}

/* ------------------------------------------------------------------ load */

/* What a state says, parsed and type-checked. */
typedef struct saved {
    int version;
    uint64_t position, samples, dataset_fp, config_fp;
    tf_order_config cfg;
    int mixture;
    tf__sched_spec spec; /* M, G unused here; arrays owned */
    int has_anchor;
    uint64_t anchor_pos;
    uint64_t *anchor_counts; /* K */
    uint64_t sched_fp;       /* a mixture: its schedule's fingerprint (the assignment) */
    size_t nskips;           /* skipped: [start, stop) pairs (owned) */
    uint64_t *skips;
    size_t nexcl;            /* excluded: takedowns (owned) */
    tf__excl *excl;
    size_t nhist;            /* weights_history: positions and K weights each (owned) */
    uint64_t *hist_pos;
    double *hist_w;
    int has_initial;         /* weights_initial: the mixture before the first change (arrays owned) */
    tf__sched_spec initial;
    char foreign[32];        /* order: another loader's order ("" for tokenfeed's own) */
    uint64_t foreign_fp;     /* and its data's fingerprint */
} saved;

static void saved_free(saved *s) {
    free((void *)s->spec.steps);
    free((void *)s->spec.weights);
    free(s->anchor_counts);
    free(s->hist_pos);
    free(s->hist_w);
    free((void *)s->initial.steps);
    free((void *)s->initial.weights);
    free((void *)s->initial.anchor_counts);
    free(s->skips);
    tf__excl_free(s->excl, s->nexcl);
}

static int bad(const char *field, const char *want, const tf__jnode *n) {
    if (n && n->type == TF__J_STR)
        TF_FAIL(-TF_ESTATE, "the state's %s: expected %s, found a string (\"%.*s\")", field, want, (int)n->slen, n->s);
    if (n && n->type == TF__J_INT && n->neg)
        TF_FAIL(-TF_ESTATE, "the state's %s: expected %s, found %lld", field, want, -(long long)n->u);
    if (n && n->type == TF__J_NUM) TF_FAIL(-TF_ESTATE, "the state's %s: expected %s, found %g", field, want, n->d);
    TF_FAIL(-TF_ESTATE, "the state's %s: expected %s, found %s", field, want, tf__json_type_name(n));
}

static int get_u64(const tf__jnode *n, const char *field, uint64_t *v) {
    if (!n || n->type != TF__J_INT || n->neg) return bad(field, "a non-negative integer", n);
    *v = n->u;
    return 0;
}

static int get_hex(const tf__jnode *n, const char *field, uint64_t *v) {
    char buf[17];
    if (!n || n->type != TF__J_STR || n->slen == 0 || n->slen > 16) return bad(field, "16 hex digits", n);
    memcpy(buf, n->s, n->slen);
    buf[n->slen] = 0;
    char *end;
    *v = strtoull(buf, &end, 16);
    if (*end) return bad(field, "16 hex digits", n);
    return 0;
}

static int get_double(const tf__jnode *n, const char *field, double *d) {
    if (!n || (n->type != TF__J_INT && n->type != TF__J_NUM)) return bad(field, "a number", n);
    *d = n->d;
    return 0;
}

/* config.<row>: by type, then the row's bounds. */
static int parse_setting(const tf__json *j, const tf__jnode *config, const tf__setting_row *r, saved *s) {
    const tf_setting *st = &r->pub;
    const tf__jnode *n = tf__json_get(j, config, st->name);
    char field[64];
    snprintf(field, sizeof field, "config.%s", st->name);
    int64_t v = 0;
    if (!n || n->type == TF__J_NULL) {
        if (st->nullable) v = st->none_value;
        else if (!tf__setting_in_fingerprint(r, &(tf__cond_ctx){&s->cfg, s->mixture, s->spec.npoints > 1})) v = st->def;
        else return bad(field, st->type == TF_SETTING_ENUM ? "a name" : "an integer", n);
    } else if (st->type == TF_SETTING_ENUM) {
        if (n->type != TF__J_STR) return bad(field, "a name", n);
        for (v = 0; st->names[v] && !tf__json_streq(n, st->names[v]); v++) {}
        if (!st->names[v]) TF_FAIL(-TF_ESTATE, "the state's %s: '%.*s' is not a name this tokenfeed knows", field,
                                   (int)n->slen, n->s);
    } else {
        if (!n || n->type != TF__J_INT || (n->neg && st->min >= 0))
            return bad(field, st->min < 0 ? "an integer" : "a non-negative integer", n);
        v = n->neg ? -(int64_t)n->u : (int64_t)n->u;
        if (tf__setting_check(r, v)) {
            char msg[300];
            snprintf(msg, sizeof msg, "%s", tf_last_error());
            TF_FAIL(-TF_ESTATE, "the state's config: %s", msg);
        }
    }
    tf__setting_put(r, &s->cfg, v);
    return 0;
}

static int parse_point(const tf__json *j, const tf__jnode *n, size_t K, double *out, const char *field) {
    if (!n || n->type != TF__J_ARR || n->n != K) return bad(field, "one weight per source", n);
    for (size_t k = 0; k < K; k++) TF_TRY(get_double(tf__json_child(j, n, k), field, &out[k]));
    return 0;
}

static int parse_weights(const tf__json *j, const tf__jnode *w, const tf__jnode *steps, const tf__jnode *interp,
                         tf__sched_spec *spec, const char *field, const char *steps_field, const char *interp_field);

/* weights (a list: plain; a list of lists with schedule_steps: a schedule;
 * version 1: a dict {steps, weights, interpolation}). */
static int parse_mixture(const tf__json *j, const tf__jnode *config, saved *s) {
    const tf__jnode *w = tf__json_get(j, config, "weights"), *steps = NULL, *interp = NULL, *points = w;
    if (!w || w->type == TF__J_NULL) return 0;
    s->mixture = 1;
    if (w->type == TF__J_OBJ) {
        points = tf__json_get(j, w, "weights");
        steps = tf__json_get(j, w, "steps");
        interp = tf__json_get(j, w, "interpolation");
    } else if (w->type == TF__J_ARR && w->n && tf__json_child(j, w, 0)->type == TF__J_ARR) {
        steps = tf__json_get(j, config, "schedule_steps");
        interp = tf__json_get(j, config, "interpolation");
    } else if (w->type != TF__J_ARR) {
        return bad("config.weights", "a list", w);
    }
    return parse_weights(j, points, steps, interp, &s->spec, "config.weights", "config.schedule_steps",
                         "config.interpolation");
}

/* Weights as the state writes them: points (one list of K, or one per step of
 * steps) and interpolation; into spec (arrays owned by the caller). */
static int parse_weights(const tf__json *j, const tf__jnode *points, const tf__jnode *steps, const tf__jnode *interp,
                         tf__sched_spec *spec, const char *field, const char *steps_field, const char *interp_field) {
    const tf__jnode *w = points;
    if (!w || w->type != TF__J_ARR) return bad(field, "a list", w);
    size_t P = 1, K;
    if (steps && steps->type == TF__J_NULL) steps = NULL;
    if (steps) {
        if (steps->type != TF__J_ARR || steps->n != points->n || !steps->n)
            return bad(steps_field, "one step per point of the weights", steps);
        P = steps->n;
        const tf__jnode *first = tf__json_child(j, points, 0);
        if (first->type != TF__J_ARR) return bad(field, "a list of weights per schedule step", first);
        K = first->n;
    } else {
        K = w->n;
    }
    if (!K) return bad(field, "at least one weight", w);
    uint64_t *st = calloc(P, sizeof *st);
    double *wt = calloc(P * K, sizeof *wt);
    spec->steps = st;
    spec->weights = wt;
    if (!st || !wt) return -ENOMEM;
    spec->K = K;
    spec->npoints = P;
    spec->allow_zero = 1;
    if (!steps) return parse_point(j, w, K, wt, field);
    for (size_t p = 0; p < P; p++) {
        TF_TRY(get_u64(tf__json_child(j, steps, p), steps_field, &st[p]));
        TF_TRY(parse_point(j, tf__json_child(j, points, p), K, wt + p * K, field));
    }
    if (interp && interp->type != TF__J_NULL) {
        if (tf__json_streq(interp, "linear")) spec->linear = 1;
        else if (!tf__json_streq(interp, "constant")) return bad(interp_field, "'constant' or 'linear'", interp);
    }
    return 0;
}

static int parse_anchor(const tf__json *j, const tf__jnode *a, saved *s) {
    if (!a || a->type == TF__J_NULL) return 0;
    const tf__jnode *pos, *counts;
    if (a->type == TF__J_OBJ) { /* version 1 */
        pos = tf__json_get(j, a, "position");
        counts = tf__json_get(j, a, "counts");
    } else if (a->type == TF__J_ARR && a->n == 2) {
        pos = tf__json_child(j, a, 0);
        counts = tf__json_child(j, a, 1);
    } else {
        return bad("mix_anchor", "null or [position, [counts]]", a);
    }
    TF_TRY(get_u64(pos, "mix_anchor position", &s->anchor_pos));
    if (!s->mixture || !counts || counts->type != TF__J_ARR || counts->n != s->spec.K)
        return bad("mix_anchor", "one count per source of the saved mixture", counts);
    s->anchor_counts = calloc(s->spec.K, sizeof *s->anchor_counts);
    if (!s->anchor_counts) return -ENOMEM;
    for (size_t k = 0; k < s->spec.K; k++)
        TF_TRY(get_u64(tf__json_child(j, counts, k), "mix_anchor counts", &s->anchor_counts[k]));
    s->has_anchor = 1;
    return 0;
}

static int parse_skipped(const tf__json *j, const tf__jnode *h, saved *s) {
    if (!h || h->type == TF__J_NULL || (h->type == TF__J_ARR && h->n == 0)) return 0;
    if (h->type != TF__J_ARR) return bad("skipped", "null, or [[start, stop], ...]", h);
    if (h->n > TF_STATE_MAX_SKIPS)
        TF_FAIL(-TF_ESTATE, "the state's skipped lists %zu ranges, more than the %u a state may hold "
                "(TF_STATE_MAX_SKIPS)", h->n, TF_STATE_MAX_SKIPS);
    s->skips = calloc(2 * h->n, sizeof *s->skips);
    if (!s->skips) return -ENOMEM;
    for (size_t i = 0; i < h->n; i++) {
        const tf__jnode *e = tf__json_child(j, h, i);
        if (!e || e->type != TF__J_ARR || e->n != 2) return bad("skipped", "[start, stop] entries", e);
        TF_TRY(get_u64(tf__json_child(j, e, 0), "skipped start", &s->skips[2 * i]));
        TF_TRY(get_u64(tf__json_child(j, e, 1), "skipped stop", &s->skips[2 * i + 1]));
        if (s->skips[2 * i] >= s->skips[2 * i + 1] || (i && s->skips[2 * i] <= s->skips[2 * i - 1]))
            TF_FAIL(-TF_ESTATE, "the state's skipped: expected ascending, disjoint [start, stop] ranges with start < "
                    "stop, found [%llu, %llu]", (unsigned long long)s->skips[2 * i],
                    (unsigned long long)s->skips[2 * i + 1]);
    }
    s->nskips = h->n;
    return 0;
}

/* excluded: null (or absent: a state of an older tokenfeed), or [[position,
 * source, [ids]], ...] with ids ascending and distinct; sources and ids are
 * checked against the order in check_excluded. */
static int parse_excluded(const tf__json *j, const tf__jnode *h, saved *s) {
    static const char want[] = "null, or [[position, source, [document ids]], ...]";
    if (!h || h->type == TF__J_NULL) return 0;
    if (h->type != TF__J_ARR) return bad("excluded", want, h);
    if (h->n > TF_STATE_MAX_EXCLUDED)
        TF_FAIL(-TF_ESTATE, "the state's excluded lists %zu takedowns, more than the %u a state may hold "
                "(TF_STATE_MAX_EXCLUDED): the state was edited or damaged; pass the state the loader saved",
                (size_t)h->n, TF_STATE_MAX_EXCLUDED);
    s->excl = calloc(h->n ? h->n : 1, sizeof *s->excl);
    if (!s->excl) return -ENOMEM;
    size_t total = 0;
    for (size_t i = 0; i < h->n; i++) {
        const tf__jnode *e = tf__json_child(j, h, i);
        if (!e || e->type != TF__J_ARR || e->n != 3) return bad("excluded", "[position, source, [document ids]] entries", e);
        tf__excl *x = &s->excl[i];
        uint64_t src = 0;
        TF_TRY(get_u64(tf__json_child(j, e, 0), "excluded position", &x->pos));
        TF_TRY(get_u64(tf__json_child(j, e, 1), "excluded source", &src));
        x->source = src > SIZE_MAX ? SIZE_MAX : (size_t)src;
        const tf__jnode *ids = tf__json_child(j, e, 2);
        if (!ids || ids->type != TF__J_ARR) return bad("excluded", "a list of document ids in each entry", ids);
        total += ids->n;
        if (total > TF_STATE_MAX_EXCLUDED_IDS)
            TF_FAIL(-TF_ESTATE, "the state's excluded lists more than the %u document ids a state may hold "
                    "(TF_STATE_MAX_EXCLUDED_IDS): the state was edited or damaged; pass the state the loader saved",
                    TF_STATE_MAX_EXCLUDED_IDS);
        x->ids = malloc((ids->n ? ids->n : 1) * sizeof *x->ids);
        if (!x->ids) return -ENOMEM;
        s->nexcl = i + 1; /* owned from here: saved_free frees it */
        for (size_t k = 0; k < ids->n; k++) {
            TF_TRY(get_u64(tf__json_child(j, ids, k), "excluded document id", &x->ids[k]));
            if (k && x->ids[k] <= x->ids[k - 1])
                TF_FAIL(-TF_ESTATE, "the state's excluded entry %zu: document ids must be ascending and distinct, "
                        "found %llu after %llu: the state was edited or damaged; pass the state the loader saved",
                        i, (unsigned long long)x->ids[k], (unsigned long long)x->ids[k - 1]);
            x->n = k + 1;
        }
    }
    s->nexcl = h->n;
    return 0;
}

/* The documents of source i's dataset (the dataset a view selects from): ids are below it. */
static uint64_t source_docs(const tf_order *o, size_t i) {
    const tf_order *s = tf_order_source(o, i);
    tf_dataset_info info;
    tf_file_info f;
    if (!s || !s->ds || tf_dataset_get_info(s->ds, &info) || !info.num_files ||
        tf_dataset_get_file(s->ds, info.num_files - 1, &f))
        return 0;
    return f.first_document + f.num_documents;
}

/* The state's takedowns name sources and documents of this loader's data. */
static int check_excluded(const tf_order *o, const saved *s) {
    size_t K = tf_order_num_sources(o);
    for (size_t i = 0; i < s->nexcl; i++) {
        const tf__excl *x = &s->excl[i];
        if (x->source >= K)
            TF_FAIL(-TF_ESTATE, "the state's excluded entry %zu names source %zu, and this loader reads %zu "
                    "source%s: resume with the datasets the state was saved with", i, x->source, K, K == 1 ? "" : "s");
        uint64_t D = source_docs(o, x->source);
        if (x->n && x->ids[x->n - 1] >= D)
            TF_FAIL(-TF_ESTATE, "the state's excluded entry %zu names document %llu of source %zu, which has %llu "
                    "documents (0 to %llu): the state was edited or saved on other data; pass the state the loader "
                    "saved", i, (unsigned long long)x->ids[x->n - 1], x->source, (unsigned long long)D,
                    (unsigned long long)(D ? D - 1 : 0));
    }
    return 0;
}

static int parse_history(const tf__json *j, const tf__jnode *h, saved *s) {
    if (!h || h->type == TF__J_NULL || (h->type == TF__J_ARR && h->n == 0)) return 0;
    if (h->type != TF__J_ARR || !s->mixture) return bad("weights_history", "null, or [[position, [weights]], ...] of a mixture", h);
    size_t n = h->n, K = s->spec.K;
    if (n > TF_STATE_MAX_WEIGHTS_HISTORY)
        TF_FAIL(-TF_ESTATE, "the state's weights_history lists %zu entries, more than the %u a state may hold "
                "(TF_STATE_MAX_WEIGHTS_HISTORY)", n, TF_STATE_MAX_WEIGHTS_HISTORY);
    s->hist_pos = calloc(n, sizeof *s->hist_pos);
    s->hist_w = calloc(n * K, sizeof *s->hist_w);
    if (!s->hist_pos || !s->hist_w) return -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        const tf__jnode *e = tf__json_child(j, h, i);
        if (!e || e->type != TF__J_ARR || e->n != 2) return bad("weights_history", "[position, [weights]] entries", e);
        TF_TRY(get_u64(tf__json_child(j, e, 0), "weights_history position", &s->hist_pos[i]));
        const tf__jnode *w = tf__json_child(j, e, 1);
        if (!w || w->type != TF__J_ARR || w->n != K) return bad("weights_history", "one weight per source", w);
        double sum = 0;
        for (size_t k = 0; k < K; k++) {
            double *x = &s->hist_w[i * K + k];
            TF_TRY(get_double(tf__json_child(j, w, k), "weights_history weight", x));
            if (!isfinite(*x) || *x < 0)
                TF_FAIL(-TF_ESTATE, "the state's weights_history entry %zu: weight %zu is %g; weights are finite "
                        "and >= 0", i, k, *x);
            sum += *x;
        }
        if (!(sum > 0))
            TF_FAIL(-TF_ESTATE, "the state's weights_history entry %zu: every weight is 0; at least one must be > 0 "
                    "(as set_weights requires)", i);
    }
    s->nhist = n;
    return 0;
}

/* weights_initial: null, or with a weights_history [weights, schedule_steps,
 * interpolation, mix_anchor] of the saved mixture's sources. */
static int parse_initial(const tf__json *j, const tf__jnode *n, saved *s) {
    if (!n || n->type == TF__J_NULL) return 0;
    const char *want = "null, or [weights, schedule_steps, interpolation, mix_anchor] of a mixture with a "
                       "weights_history";
    if (n->type != TF__J_ARR || n->n != 4 || !s->nhist) return bad("weights_initial", want, n);
    TF_TRY(parse_weights(j, tf__json_child(j, n, 0), tf__json_child(j, n, 1), tf__json_child(j, n, 2), &s->initial,
                         "weights_initial weights", "weights_initial schedule_steps", "weights_initial interpolation"));
    size_t K = s->initial.K;
    if (K != s->spec.K) return bad("weights_initial", "one weight per source of the saved mixture", tf__json_child(j, n, 0));
    const tf__jnode *a = tf__json_child(j, n, 3);
    if (a->type != TF__J_NULL) {
        const tf__jnode *counts = a->type == TF__J_ARR && a->n == 2 ? tf__json_child(j, a, 1) : NULL;
        if (!counts || counts->type != TF__J_ARR || counts->n != K)
            return bad("weights_initial mix_anchor", "null or [position, [one count per source]]", a);
        TF_TRY(get_u64(tf__json_child(j, a, 0), "weights_initial mix_anchor position", &s->initial.anchor_pos));
        uint64_t *c = calloc(K, sizeof *c);
        if (!c) return -ENOMEM;
        s->initial.anchor_counts = c;
        for (size_t k = 0; k < K; k++)
            TF_TRY(get_u64(tf__json_child(j, counts, k), "weights_initial mix_anchor counts", &c[k]));
    }
    s->has_initial = 1;
    return 0;
}

/* order: null, or [name, fingerprint] of another loader's order. */
static int parse_foreign(const tf__json *j, const tf__jnode *n, saved *s) {
    if (!n || n->type == TF__J_NULL) return 0;
    const tf__jnode *name = n->type == TF__J_ARR && n->n == 2 ? tf__json_child(j, n, 0) : NULL;
    if (!name || name->type != TF__J_STR || name->slen == 0 || name->slen >= sizeof s->foreign)
        return bad("order", "null, or [name, fingerprint]", n);
    memcpy(s->foreign, name->s, name->slen);
    s->foreign[name->slen] = 0;
    return get_hex(tf__json_child(j, n, 1), "order fingerprint", &s->foreign_fp);
}

static int parse_state(const tf__json *j, saved *s) {
    const tf__jnode *root = &j->nodes[0];
    if (root->type != TF__J_OBJ)
        TF_FAIL(-TF_ESTATE, "not a tokenfeed loader state: expected an object, found %s", tf__json_type_name(root));
    static const char *const required[] = {"format_version", "dataset_fingerprint", "config_fingerprint", "position",
                                           "config"};
    char missing[160] = "";
    for (size_t i = 0; i < sizeof required / sizeof *required; i++)
        if (!tf__json_get(j, root, required[i]))
            snprintf(missing + strlen(missing), sizeof missing - strlen(missing), "%s%s", *missing ? ", " : "",
                     required[i]);
    if (*missing) TF_FAIL(-TF_ESTATE, "not a tokenfeed loader state: missing %s", missing);
    uint64_t v = 0;
    const tf__jnode *fv = tf__json_get(j, root, "format_version");
    TF_TRY(get_u64(fv, "format_version", &v));
    if (v < 1 || v > STATE_VERSION)
        TF_FAIL(-TF_ESTATE, "state format version %llu is not supported (this tokenfeed reads versions 1 to %d)",
                (unsigned long long)v, STATE_VERSION);
    s->version = (int)v;
    TF_TRY(get_hex(tf__json_get(j, root, "dataset_fingerprint"), "dataset_fingerprint", &s->dataset_fp));
    TF_TRY(get_hex(tf__json_get(j, root, "config_fingerprint"), "config_fingerprint", &s->config_fp));
    TF_TRY(get_u64(tf__json_get(j, root, "position"), "position", &s->position));
    const tf__jnode *n = tf__json_get(j, root, "samples_per_epoch");
    if (n && n->type != TF__J_NULL) TF_TRY(get_u64(n, "samples_per_epoch", &s->samples));
    n = tf__json_get(j, root, "world_size");
    if (n && n->type != TF__J_NULL) TF_TRY(get_u64(n, "world_size", &v));
    const tf__jnode *config = tf__json_get(j, root, "config");
    if (config->type != TF__J_OBJ) return bad("config", "an object", config);
    TF_TRY(parse_mixture(j, config, s));
    tf_order_config_init(&s->cfg);
    for (size_t i = 0; i < tf__nsettings; i++)
        if (tf__settings[i].pub.scope == TF_SCOPE_ORDER) TF_TRY(parse_setting(j, config, &tf__settings[i], s));
    TF_TRY(parse_anchor(j, tf__json_get(j, root, "mix_anchor"), s));
    TF_TRY(parse_skipped(j, tf__json_get(j, root, "skipped"), s));
    TF_TRY(parse_excluded(j, tf__json_get(j, root, "excluded"), s));
    TF_TRY(parse_foreign(j, tf__json_get(j, root, "order"), s));
    TF_TRY(parse_history(j, tf__json_get(j, root, "weights_history"), s));
    return parse_initial(j, tf__json_get(j, root, "weights_initial"), s);
}

/* ------------------------------------------------------------- compare */

static void add_diff(char *d, const char *name, const char *was, const char *now) {
    size_t l = strlen(d);
    snprintf(d + l, DIFFS - l, "%s%s: saved %s, now %s", l ? "; " : "", name, was, now);
}

/* Weights as Python shows them: [0.7, 0.3], or a schedule's points
 * [(0, [0.7, 0.3]), (25, [0.2, 0.8])] (linear). */
static void spec_text(const tf__sched_spec *sp, char *buf, size_t cap) {
    tf__jw w = {0};
    if (!sp) {
        tf__jw_printf(&w, "None");
    } else if (sp->npoints == 1 && !sp->linear) {
        write_doubles(&w, sp->weights, sp->K);
    } else {
        tf__jw_printf(&w, "[");
        for (size_t p = 0; p < sp->npoints; p++) {
            tf__jw_printf(&w, "%s(%llu, ", p ? ", " : "", (unsigned long long)sp->steps[p]);
            write_doubles(&w, sp->weights + p * sp->K, sp->K);
            tf__jw_printf(&w, ")");
        }
        tf__jw_printf(&w, "]%s", sp->linear ? " (linear)" : "");
    }
    snprintf(buf, cap, "%s", w.rc ? "?" : w.buf);
    free(w.buf);
}

static int same_spec(const tf__sched_spec *a, const tf__sched_spec *b) {
    if (!a || !b) return a == b;
    if (a->K != b->K || a->npoints != b->npoints || (a->npoints > 1 && a->linear != b->linear)) return 0;
    return !memcmp(a->steps, b->steps, a->npoints * sizeof *a->steps) &&
           !memcmp(a->weights, b->weights, a->npoints * a->K * sizeof *a->weights);
}

static void diff_value(const tf__setting_row *r, int64_t a, int64_t b, char *d) {
    char was[48], now[48];
    tf__setting_describe(r, a, was, sizeof was);
    tf__setting_describe(r, b, now, sizeof now);
    add_diff(d, r->pub.name, was, now);
}

/* What differs between the saved configuration and o's, where it changes the
 * stream. The global batch is not compared here: a state of another global
 * batch is refused before (global_batch_changed). A mixture's weights and
 * window change the stream only through the assignment they make (0.7 / 0.3
 * in windows of 10 or of 20 is the same). */
static void diff_config(const tf_order *o, const tf__sched_spec *now_spec, const saved *s, char *d) {
    tf__cond_ctx now = {&o->cfg, now_spec != NULL, now_spec && now_spec->npoints > 1};
    tf__cond_ctx was = {&s->cfg, s->mixture, s->mixture && s->spec.npoints > 1};
    const tf__setting_row *gb = tf__setting_row_find("global_batch"), *mw = tf__setting_row_find("mix_window");
    for (size_t i = 0; i < tf__nsettings; i++) {
        const tf__setting_row *r = &tf__settings[i];
        if (r->pub.scope != TF_SCOPE_ORDER || r == gb || r == mw) continue;
        int used_now = tf__setting_enters_stream(r, &now);
        int used_was = tf__setting_enters_stream(r, &was);
        if (!used_now || !used_was) continue; /* where the condition differs, its setting says so */
        int64_t a = tf__setting_get(r, &s->cfg), b = tf__setting_get(r, &o->cfg);
        if (a != b) diff_value(r, a, b, d);
    }
    int mix_same = s->mixture == (now_spec != NULL) && (!s->mixture || s->sched_fp == o->kind_fp);
    if (mix_same) return;
    if (!same_spec(s->mixture ? &s->spec : NULL, now_spec)) {
        char a[160], b[160];
        spec_text(s->mixture ? &s->spec : NULL, a, sizeof a);
        spec_text(now_spec, b, sizeof b);
        add_diff(d, "weights", a, b);
    } else if (s->cfg.mix_window != o->cfg.mix_window) {
        diff_value(mw, (int64_t)s->cfg.mix_window, (int64_t)o->cfg.mix_window, d);
    } else {
        add_diff(d, "weights", "another schedule", "this one");
    }
}

/* The fingerprint the saved configuration has: its settings', mixed with its
 * schedule's for a mixture. A state whose recorded fingerprint differs was
 * edited, or written by an order version this library does not reproduce. */
static int saved_fingerprint(saved *s, uint64_t *fp) {
    *fp = tf__order_config_fingerprint(&s->cfg);
    if (*s->foreign) *fp = tf_mix64(*fp ^ s->foreign_fp);
    if (!s->mixture) {
        const tf__order_kind *k = tf__order_kind_of((int)s->cfg.order);
        if (k && k->kind_fp) *fp = tf_mix64(*fp ^ k->kind_fp(&s->cfg));
        return 0;
    }
    tf__sched_spec sp = s->spec;
    sp.M = s->cfg.mix_window;
    sp.G = s->cfg.global_batch;
    sp.anchor_counts = NULL;
    tf__sched *sc;
    int rc = tf__sched_create(&sp, &sc);
    if (rc) {
        char msg[300];
        snprintf(msg, sizeof msg, "%s", tf_last_error());
        TF_FAIL(-TF_ESTATE, "the state's weights: %s", msg);
    }
    s->sched_fp = tf__sched_fingerprint(sc);
    *fp = tf_mix64(*fp ^ s->sched_fp);
    tf__sched_free(sc);
    return 0;
}

/* ------------------------------------------------------------ hand-over */

static int counts_at(const tf_order *o, size_t K, uint64_t pos, uint64_t *c) {
    for (size_t k = 0; k < K; k++) {
        c[k] = tf_order_mix_source_count(o, k, pos);
        if (c[k] == UINT64_MAX) TF_FAIL(-ENOMEM, "out of memory building a mixture schedule table");
    }
    return 0;
}

/* Where each source of o's mixture must continue from at pos: the anchor the
 * resumed order needs (*need = 0: none). Under the saved configuration every
 * source had delivered some samples at pos; when o's schedule would put one
 * elsewhere, hand over there, so that nothing consumed is repeated or
 * skipped. */
static int needed_anchor(const tf_order *o, const tf__sched_spec *now, const saved *s, int same, uint64_t *counts,
                         int *need) {
    size_t K = now->K;
    *need = 0;
    if (same) { /* the saved state resumes with its own anchor */
        if (s->has_anchor) {
            memcpy(counts, s->anchor_counts, K * sizeof *counts);
            *need = 1;
        }
        return 0;
    }
    if (!s->mixture || s->spec.K != K) return 0; /* nothing to hand over from */
    tf__sched_spec was = s->spec;
    was.anchor_pos = s->anchor_pos;
    was.anchor_counts = s->anchor_counts;
    tf_order *before = NULL, *plain = NULL;
    int rc = tf__order_mix_create(o, &s->cfg, &was, &before);
    if (rc) {
        char msg[300];
        snprintf(msg, sizeof msg, "%s", tf_last_error());
        TF_FAIL(-TF_ESTATE, "the saved mixture configuration cannot be rebuilt to find where each source was (%s); "
                "resume with the saved weights", msg);
    }
    uint64_t *mine = malloc(K * sizeof *mine);
    rc = mine ? counts_at(before, K, s->position, counts) : -ENOMEM;
    if (!rc) {
        tf__sched_spec bare = *now;
        bare.anchor_counts = NULL;
        rc = now->anchor_counts ? tf__order_mix_create(o, &o->cfg, &bare, &plain) : 0;
        if (!rc) rc = counts_at(plain ? plain : o, K, s->position, mine);
        if (!rc) *need = memcmp(mine, counts, K * sizeof *mine) != 0;
    }
    free(mine);
    tf_order_free(plain);
    tf_order_free(before);
    return rc;
}

static int resume_mixture(const tf_order *o, const saved *s, int same, tf_order **handover) {
    tf__sched_spec now;
    TF_TRY(tf__order_mix_spec(o, &now, NULL));
    uint64_t *counts = calloc(now.K, sizeof *counts);
    if (!counts) return -ENOMEM;
    int need = 0;
    int rc = needed_anchor(o, &now, s, same, counts, &need);
    uint64_t apos = same ? s->anchor_pos : s->position;
    int differs = need != (now.anchor_counts != NULL) ||
                  (need && (apos != now.anchor_pos || memcmp(counts, now.anchor_counts, now.K * sizeof *counts)));
    if (!rc && differs) {
        tf__sched_spec sp = now;
        sp.anchor_pos = apos;
        sp.anchor_counts = need ? counts : NULL;
        rc = tf__order_mix_create(o, &o->cfg, &sp, handover);
    }
    free(counts);
    return rc;
}

static int live_order(const tf_order *o, const saved *s, tf_order **out);

/* A state written when an order of data of its own was built by a
 * constructor of its own (Megatron's, tf_order_create_megatron) names it only
 * under "order", its config saying tokenfeed's order (and fingerprinted so,
 * checked before this): it is that kind's state, and the kind's settings it
 * did not record (the cache's fingerprint covers them) are taken as they are
 * now. */
static void upgrade_foreign(const tf_order *o, saved *s) {
    const tf__order_kind *k = tf__order_kind_named(s->foreign);
    if (!*s->foreign || s->cfg.order != TF_ORDER_TOKENFEED || !k || !k->data_fp || o->cfg.order != k->id) return;
    tf_order_config before = s->cfg;
    tf__cond_ctx now = {&o->cfg, 0, 0}, was = {&before, 0, 0};
    s->cfg.order = k->id;
    for (size_t i = 0; i < tf__nsettings; i++) { /* the settings that only the kind reads */
        const tf__setting_row *r = &tf__settings[i];
        if (r->pub.scope == TF_SCOPE_ORDER && tf__setting_enters_stream(r, &now) && !tf__setting_enters_stream(r, &was))
            tf__setting_put(r, &s->cfg, tf__setting_get(r, &o->cfg));
    }
}

/* Another loader's order: which one, and the data of its own it reads. */
static void diff_foreign(const tf_order *o, const saved *s, char *d) {
    const tf__order_kind *k = tf__order_kind_of((int)o->cfg.order);
    const char *now = k && k->data_fp ? k->name : "";
    char was_fp[40], now_fp[40];
    if (strcmp(now, s->foreign)) {
        add_diff(d, "order", *s->foreign ? s->foreign : "tokenfeed's own", *now ? now : "tokenfeed's own");
    } else if (*now && s->foreign_fp != o->kind_fp) {
        snprintf(was_fp, sizeof was_fp, "%016llx", (unsigned long long)s->foreign_fp);
        snprintf(now_fp, sizeof now_fp, "%016llx", (unsigned long long)o->kind_fp);
        add_diff(d, k->data_fp, was_fp, now_fp);
    }
}

int tf_order_state_load(const tf_order *o, const char *state, size_t len, unsigned flags, uint64_t *pos,
                        tf_order **handover) {
    TF_NEED_ARG(o);
    TF_NEED_ARG(state);
    TF_NEED_ARG(pos);
    TF_NEED_ARG(handover);
    *handover = NULL;
    tf__clearerr();
    if (flags & ~(unsigned)TF_STATE_LENIENT)
        return tf__seterr(-EINVAL, "tf_order_state_load: flags 0x%x: unknown bits 0x%x (the only flag is "
                          "TF_STATE_LENIENT)", flags, flags & ~(unsigned)TF_STATE_LENIENT);
    tf__json j;
    int rc = tf__json_parse(state, len, &j);
    if (rc) {
        /* the message is formatted into the buffer tf_last_error() returns: copy it first */
        char msg[600];
        snprintf(msg, sizeof msg, "%s", tf_last_error());
        TF_FAIL(-TF_ESTATE, "%s", *msg ? msg : "the state is not valid JSON");
    }
    saved s;
    memset(&s, 0, sizeof s);
    rc = parse_state(&j, &s);
    tf__json_free(&j);
    const tf_order *orig = o;
    tf__sched_spec now_spec;
    int mixture = tf__order_mix_spec(o, &now_spec, NULL) == 0;
    tf_order *live = NULL; /* weights given while the saved stream ran: they replace o's */
    if (!rc && mixture && s.nhist) {
        rc = live_order(o, &s, &live);
        if (!rc) {
            o = live;
            tf__order_mix_spec(o, &now_spec, NULL);
        }
    }
    if (!rc && s.dataset_fp != dataset_fp(o)) {
        char samples[32] = "?";
        if (s.samples) snprintf(samples, sizeof samples, "%llu", (unsigned long long)s.samples);
        rc = tf__seterr(-TF_ESTATE, "the dataset changed: the state was saved on data with fingerprint %016llx (%s "
                        "samples per epoch), this loader reads %016llx (%llu samples per epoch). Point the loader at "
                        "the same files (in the same order%s) to resume.",
                        (unsigned long long)s.dataset_fp, samples, (unsigned long long)dataset_fp(o),
                        (unsigned long long)tf_order_num_samples(o),
                        mixture ? ", and the same sources in the same order" : "");
    }
    char diffs[DIFFS] = "";
    uint64_t fp = 0;
    if (!rc) rc = saved_fingerprint(&s, &fp);
    if (!rc && fp != s.config_fp && !(flags & TF_STATE_LENIENT))
        rc = tf__seterr(-TF_ESTATE, "the state's config_fingerprint %016llx does not match its config (which gives "
                        "%016llx): the state was edited, or written by an order version this tokenfeed does not "
                        "reproduce; load it leniently (TF_STATE_LENIENT in C, strict=False in Python) to continue "
                        "from its position",
                        (unsigned long long)s.config_fp, (unsigned long long)fp);
    /* The global batch is refused at every position, strict or lenient: the
     * position, the skipped ranges, a schedule's steps and the steps that
     * explain/where/skip_steps count are whole global batches of the saved
     * size, and elastic resume keeps it (dp_size changes, batch_size x dp_size
     * does not). */
    if (!rc && s.cfg.global_batch != o->cfg.global_batch)
        rc = tf__seterr(-TF_ESTATE, "global_batch changed: the state was saved with a global batch of %llu samples "
                        "(batch_size x dp_size), this loader has %llu. Its position (step %llu) and its steps count "
                        "global batches of %llu: resume with batch_size x dp_size = %llu (on other ranks, another "
                        "batch_size: dp_size may change), and reach a larger batch per optimizer step with gradient "
                        "accumulation",
                        (unsigned long long)s.cfg.global_batch, (unsigned long long)o->cfg.global_batch,
                        (unsigned long long)(s.position / s.cfg.global_batch), (unsigned long long)s.cfg.global_batch,
                        (unsigned long long)s.cfg.global_batch);
    if (!rc) upgrade_foreign(o, &s);
    if (!rc) diff_config(o, mixture ? &now_spec : NULL, &s, diffs);
    if (!rc) diff_foreign(o, &s, diffs);
    int same = !*diffs;
    if (!rc && *diffs && !(flags & TF_STATE_LENIENT))
        rc = tf__seterr(-TF_ESTATE, "the loader configuration changed (%s). Restore with the saved settings, or load "
                        "leniently (TF_STATE_LENIENT in C, strict=False in Python) to continue from the saved "
                        "position with the new ones.", diffs);
    uint64_t G = o->cfg.global_batch;
    if (!rc && s.position % G)
        rc = tf__seterr(-TF_ESTATE, "the state's position %llu is not a multiple of the global batch %llu: keep "
                        "batch_size x world_size the same as when the state was saved",
                        (unsigned long long)s.position, (unsigned long long)G);
    if (!rc && s.position > tf_order_num_positions(o))
        rc = tf__seterr(-TF_ESTATE, "the state's position %llu is past the end of this stream (%llu positions)",
                        (unsigned long long)s.position, (unsigned long long)tf_order_num_positions(o));
    if (!rc && s.nskips && s.skips[2 * s.nskips - 1] % G)
        rc = tf__seterr(-TF_ESTATE, "the state's skipped ranges are not whole global batches of %llu: keep "
                        "batch_size x world_size the same as when the state was saved", (unsigned long long)G);
    if (!rc) rc = check_excluded(o, &s);
    if (!rc && mixture) rc = resume_mixture(o, &s, same, handover);
    if (!rc) *pos = s.position;
    if (!rc && live && !*handover) *handover = live;
    else tf_order_free(live);
    /* the skipped ranges are the state's: on the order that reads on (o itself
     * is the caller's, and the ranges are no part of its stream) */
    if (!rc) rc = tf__order_set_skips(*handover ? *handover : (tf_order *)orig, s.skips, s.nskips);
    if (!rc) rc = tf__order_set_excluded(*handover ? *handover : (tf_order *)orig, s.excl, s.nexcl);
    if (rc && *handover) {
        tf_order_free(*handover);
        *handover = NULL;
    }
    saved_free(&s);
    return rc;
}

/* The mixture the saved stream was reading: o's datasets and settings with the
 * saved weights, anchor and weight history. */
static int live_order(const tf_order *o, const saved *s, tf_order **out) {
    tf__sched_spec sp = s->spec;
    sp.anchor_pos = s->anchor_pos;
    sp.anchor_counts = s->has_anchor ? s->anchor_counts : NULL;
    int rc = tf__order_mix_create(o, &o->cfg, &sp, out);
    if (rc) {
        char msg[300];
        snprintf(msg, sizeof msg, "%s", tf_last_error());
        TF_FAIL(-TF_ESTATE, "the state's weights_history: the weights last set cannot be applied (%s)", msg);
    }
    rc = tf__order_mix_set_history(*out, s->nhist, s->hist_pos, s->hist_w);
    /* the steps before the first change: the state's record of them (a state
     * of an older tokenfeed has none: then the weights o was built with) */
    if (!rc && s->has_initial) rc = tf__order_mix_set_base(*out, &s->initial);
    if (rc) {
        tf_order_free(*out);
        *out = NULL;
    }
    return rc;
}

int tf_order_mix_set_weights(const tf_order *o, uint64_t pos, const double *weights, size_t n, tf_order **out) {
    TF_NEED_ARG(out);
    *out = NULL;
    tf__clearerr();
    tf__sched_spec now;
    TF_NEED_ARG(o);
    TF_NEED_ARG(weights);
    if (tf__order_mix_spec(o, &now, NULL))
        TF_FAIL(-EINVAL, "set_weights: the order is not a mixture (build it with weights)");
    if (n != now.K) TF_FAIL(-EINVAL, "set_weights: the mixture has %zu sources, %zu weights given", now.K, n);
    if (pos % o->cfg.global_batch)
        TF_FAIL(-EINVAL, "set_weights: position %llu is not a multiple of the global batch %llu",
                (unsigned long long)pos, (unsigned long long)o->cfg.global_batch);
    uint64_t *counts = malloc(n * sizeof *counts);
    if (!counts) return -ENOMEM;
    static const uint64_t step0 = 0;
    tf__sched_spec sp = {.K = n, .npoints = 1, .steps = &step0, .weights = weights, .allow_zero = 1,
                         .anchor_pos = pos, .anchor_counts = counts};
    int rc = counts_at(o, n, pos, counts);
    if (!rc) rc = tf__order_mix_create(o, &o->cfg, &sp, out);
    if (!rc) {
        rc = tf__order_mix_inherit_history(*out, o, weights);
        if (rc) {
            tf_order_free(*out);
            *out = NULL;
        }
    }
    free(counts);
    return rc;
}

/* ------------------------------------------------------------- skipping */

int tf_order_skip(tf_order *o, uint64_t start, uint64_t stop) {
    TF_NEED_ARG(o);
    tf__clearerr();
    uint64_t G = o->cfg.global_batch;
    if (start >= stop || start % G || stop % G)
        TF_FAIL(-EINVAL, "skip: [%llu, %llu) is not a range of whole global batches of %llu (start < stop)",
                (unsigned long long)start, (unsigned long long)stop, (unsigned long long)G);
    if (stop > o->num_positions)
        TF_FAIL(-EINVAL, "skip: position %llu is past the end of the stream (%llu positions)",
                (unsigned long long)stop, (unsigned long long)o->num_positions);
    /* merge with the ranges it overlaps or touches */
    uint64_t *r = malloc(2 * (o->nskips + 1) * sizeof *r);
    if (!r) return -ENOMEM;
    size_t n = 0, i = 0;
    for (; i < o->nskips && o->skips[2 * i + 1] < start; i++, n++) {
        r[2 * n] = o->skips[2 * i];
        r[2 * n + 1] = o->skips[2 * i + 1];
    }
    for (; i < o->nskips && o->skips[2 * i] <= stop; i++) {
        if (o->skips[2 * i] < start) start = o->skips[2 * i];
        if (o->skips[2 * i + 1] > stop) stop = o->skips[2 * i + 1];
    }
    r[2 * n] = start;
    r[2 * n + 1] = stop;
    n++;
    for (; i < o->nskips; i++, n++) {
        r[2 * n] = o->skips[2 * i];
        r[2 * n + 1] = o->skips[2 * i + 1];
    }
    if (n > TF_STATE_MAX_SKIPS) {
        free(r);
        TF_FAIL(-EINVAL, "skip: the order already leaves out %zu separate ranges, the most a state may hold "
                "(TF_STATE_MAX_SKIPS = %u): skip ranges that touch, so that they merge", o->nskips, TF_STATE_MAX_SKIPS);
    }
    free(o->skips);
    o->skips = r;
    o->nskips = n;
    return 0;
}

size_t tf_order_skips(const tf_order *o, uint64_t *ranges, size_t cap) {
    if (!o) return 0;
    for (size_t i = 0; ranges && i < o->nskips && i < cap; i++) {
        ranges[2 * i] = o->skips[2 * i];
        ranges[2 * i + 1] = o->skips[2 * i + 1];
    }
    return o->nskips;
}

uint64_t tf_order_skip_to(const tf_order *o, uint64_t pos) {
    if (!o || !o->nskips) return pos;
    size_t lo = 0, hi = o->nskips; /* the ranges are ascending: the last that starts at or before pos */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (o->skips[2 * mid] <= pos) lo = mid + 1;
        else hi = mid;
    }
    return lo && pos < o->skips[2 * (lo - 1) + 1] ? o->skips[2 * (lo - 1) + 1] : pos;
}

/* ------------------------------------------------------------- takedowns */

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

int tf_order_exclude(tf_order *o, uint64_t pos, size_t source, const uint64_t *ids, size_t n) {
    TF_NEED_ARG(o);
    if (n) TF_NEED_ARG(ids);
    tf__clearerr();
    size_t K = tf_order_num_sources(o);
    if (source >= K)
        TF_FAIL(-EINVAL, "exclude: source %zu, and the order reads %zu source%s (0 to %zu)", source, K,
                K == 1 ? "" : "s", K - 1);
    uint64_t D = source_docs(o, source);
    size_t total = n;
    for (size_t i = 0; i < o->nexcl; i++) total += o->excl[i].n;
    if (o->nexcl >= TF_STATE_MAX_EXCLUDED || total > TF_STATE_MAX_EXCLUDED_IDS || n > TF_STATE_MAX_EXCLUDED_IDS)
        TF_FAIL(-EINVAL, "exclude: the order would hold more takedowns than a state may (TF_STATE_MAX_EXCLUDED = %u "
                "calls, TF_STATE_MAX_EXCLUDED_IDS = %u ids): take many documents down in one call, or filter them "
                "out with a view at the next restart", TF_STATE_MAX_EXCLUDED, TF_STATE_MAX_EXCLUDED_IDS);
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= D)
            TF_FAIL(-EINVAL, "exclude: document %llu is not a document of source %zu (0 to %llu)",
                    (unsigned long long)ids[i], source, (unsigned long long)(D ? D - 1 : 0));
    uint64_t *c = malloc((n ? n : 1) * sizeof *c);
    if (!c) return -ENOMEM;
    if (n) memcpy(c, ids, n * sizeof *c);
    qsort(c, n, sizeof *c, cmp_u64);
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (!m || c[i] != c[m - 1]) c[m++] = c[i];
    tf__excl *e = realloc(o->excl, (o->nexcl + 1) * sizeof *e);
    if (!e) {
        free(c);
        return -ENOMEM;
    }
    o->excl = e;
    e[o->nexcl++] = (tf__excl){.pos = pos, .source = source, .n = m, .ids = c};
    return 0;
}

size_t tf_order_num_excluded(const tf_order *o) { return o ? o->nexcl : 0; }

int tf_order_excluded(const tf_order *o, size_t i, uint64_t *pos, size_t *source, const uint64_t **ids, size_t *n) {
    TF_NEED_ARG(o);
    if (i >= o->nexcl)
        TF_FAIL(-ERANGE, "excluded: entry %zu, and the order holds %zu", i, o->nexcl);
    const tf__excl *e = &o->excl[i];
    if (pos) *pos = e->pos;
    if (source) *source = e->source;
    if (ids) *ids = e->ids;
    if (n) *n = e->n;
    return 0;
}
