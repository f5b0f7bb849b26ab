/*
 * concat.c — the order kind of CONCAT packing: the documents, in order, as
 * one stream (with separators), cut every seq_len tokens.
 *
 * Packing (TF_PACK_CONCAT)
 * ------------------------
 * The dataset's documents, in order, form one stream. Without a separator the
 * stream is the T tokens themselves. With separator_id >= 0 a separator follows
 * every document (empty ones included):
 *
 *     doc0 SEP doc1 SEP ... doc(D-1) SEP          T' = T + D virtual tokens
 *
 * and document k occupies virtual [vs(k), vs(k) + len(k) + 1) with
 * vs(k) = start(k) + k, strictly increasing in k. The separator belongs to the
 * document it closes; the next document starts right after it. This assumes the
 * documents tile the tokens (doc 0 starts at 0, each starts where the previous
 * ends, the last ends at T), which every supported format guarantees for a
 * verified dataset; create checks the two ends in O(1).
 *
 * With L = seq_len, sample i is virtual tokens [i*L, i*L + L + 1) (inputs and
 * labels share L tokens; consecutive samples overlap by one token), and
 * N = floor((T' - 1) / L). A virtual position p is located by a binary search
 * for the last k with vs(k) <= p: O(log D) document lookups, each O(log files).
 * Without a separator a sample is one dataset span and costs O(1) to locate.
 *
 * Boundaries and extras
 * ---------------------
 * A boundary is a sample offset b in (0, L] at which a document starts. Without
 * a separator: the start of every non-empty document (empty documents have no
 * tokens and so no boundary). With a separator: vs(k) - i*L for every k (an
 * empty document is the 1-token document [SEP]). Boundaries are found by
 * locating offset 0 and walking the documents inside the sample window only
 * (O(log) + O(docs in window)). From them:
 *   position_ids[t] = t - (last boundary <= t, or 0)           t in [0, L)
 *   cu_seqlens      = 0, boundaries b < L ascending, L, then L repeated up to
 *                     L + 1 entries (the fill makes trailing segments empty, so
 *                     varlen kernels can read a fixed-size row)
 *   num_seqs        = segments = (number of non-fill entries) - 1
 *   loss_mask[t]    = 0 iff t + 1 is a boundary (labels[t] opens a new
 *                     document: predicting it from the previous document is
 *                     noise), else 1.
 *
 * The formulas here are part of the checkpoint contract (see order.c).
 */
#include <stdlib.h>
#include <string.h>

#include "../sources/source.h"
#include "kind.h"

typedef struct concat {
    const tf_dataset *ds;
    uint64_t L;  /* seq_len */
    uint64_t T;  /* dataset tokens */
    uint64_t D;  /* dataset documents */
    uint64_t Tv; /* virtual stream length: T, or T + D with separators */
    uint64_t N;  /* samples per epoch */
    int sep;     /* separator mode */
    const tf__sel *sel; /* a view's documents (NULL: the dataset's, tiling its tokens) */
    int walk;    /* spans and boundaries walk the documents: with separators, or over a view */
    /* Over a view: where each stride of the stream starts. hint[j] is the
     * last document k with vs(k) <= j << shift (nhint entries), so locating
     * a position searches the few documents of one stride instead of all of
     * them: a row of seq_len tokens spans a handful of documents, and the
     * full binary search over the view's offsets (a cache miss per step on a
     * large view) was the cost a filtered concat loader paid over an
     * unfiltered one. At most one entry per selected document. */
    uint64_t *hint;
    uint64_t nhint;
    unsigned shift;
} concat;

/* Document k: its token range, from the view's table without a search (and
 * without entering the SIGBUS guard per document) when there is one. */
static inline int doc_of(const concat *o, uint64_t k, uint64_t *s, uint64_t *len) {
    if (o->sel) {
        *s = o->sel->start[k];
        *len = o->sel->vstart[k + 1] - o->sel->vstart[k];
        return 0;
    }
    return tf_dataset_document(o->ds, k, s, len);
}

/* Over a view the documents do not tile the tokens: the stream is the view's
 * documents one after another, and document k starts at vstart[k] of it (its
 * separators aside) instead of at its token position. */
static int base_of(const concat *o, uint64_t k, uint64_t *b) {
    if (o->sel) {
        *b = o->sel->vstart[k];
        return 0;
    }
    uint64_t n;
    return tf_dataset_document(o->ds, k, b, &n);
}

/* ------------------------------------------------------------------------ */
/* separator stream: locating virtual positions                              */
/* ------------------------------------------------------------------------ */

/* Last document k with vs(k) = base(k) + (k with separators) <= p (p < Tv). */
static int sep_locate(const concat *o, uint64_t p, uint64_t *k_out, uint64_t *vs_out) {
    const uint64_t w = o->sep ? 1 : 0;
    uint64_t lo = 0, hi = o->D; /* invariant: vs(lo) <= p < vs(hi), vs(D) = Tv */
    if (o->hint) {
        uint64_t j = p >> o->shift;
        if (j < o->nhint) {
            lo = o->hint[j];
            /* vs(hint[j + 1] + 1) > (j + 1) << shift > p */
            if (j + 1 < o->nhint && o->hint[j + 1] + 1 < hi) hi = o->hint[j + 1] + 1;
        }
    }
    while (hi - lo > 1) {
        uint64_t mid = lo + (hi - lo) / 2, s;
        TF_TRY(base_of(o, mid, &s));
        if (s + w * mid <= p) lo = mid; else hi = mid;
    }
    uint64_t s;
    TF_TRY(base_of(o, lo, &s));
    *k_out = lo;
    *vs_out = s + w * lo;
    return 0;
}

/* Walk over a sample's spans, document by document. */
typedef struct span_cursor {
    uint64_t k;   /* current document (separator mode) */
    uint64_t off; /* offset inside document k's virtual range */
    uint64_t dst; /* next sample offset to produce */
} span_cursor;

static int spans_begin(const concat *o, uint64_t sample, span_cursor *c) {
    memset(c, 0, sizeof *c);
    c->off = sample * o->L; /* no-separator mode: the token position */
    if (o->walk) {
        uint64_t vs;
        TF_TRY(sep_locate(o, c->off, &c->k, &vs));
        c->off -= vs;
    }
    return 0;
}

/* Append up to cap spans; *n = count. Consecutive separators (empty documents)
 * merge into one span. Done when c->dst == L + 1. */
static int spans_next(const concat *o, span_cursor *c, tf__span *spans, size_t cap, size_t *n) {
    const uint64_t need = o->L + 1;
    size_t m = 0;
    if (!o->walk) {
        if (c->dst < need && cap) {
            spans[m++] = (tf__span){c->off, need, 0};
            c->dst = need;
        }
        *n = m;
        return 0;
    }
    while (c->dst < need) {
        if (c->k >= o->D)
            TF_FAIL(-TF_EFORMAT, "document index ends before the token stream does: run verify() on the dataset");
        uint64_t s, len;
        TF_TRY(doc_of(o, c->k, &s, &len));
        if (c->off < len) {
            if (m == cap) break;
            uint64_t take = len - c->off;
            if (take > need - c->dst) take = need - c->dst;
            spans[m++] = (tf__span){s + c->off, take, c->dst};
            c->off += take;
            c->dst += take;
            if (c->dst == need) break;
        }
        if (!o->sep) { /* a view without separators: the next document follows */
            c->k++;
            c->off = 0;
            continue;
        }
        /* c->off == len: the separator closing document k */
        if (m && spans[m - 1].src == TF_SPAN_SEPARATOR && spans[m - 1].dst + spans[m - 1].len == c->dst) {
            spans[m - 1].len++;
        } else {
            if (m == cap) break;
            spans[m++] = (tf__span){TF_SPAN_SEPARATOR, 1, c->dst};
        }
        c->dst++;
        c->k++;
        c->off = 0;
    }
    *n = m;
    return 0;
}

static int concat_spans(const tf_order *order, uint64_t sample, tf__span *spans, size_t cap, size_t *n) {
    const concat *o = order->impl;
    span_cursor c;
    TF_TRY(spans_begin(o, sample, &c));
    TF_TRY(spans_next(o, &c, spans, cap, n));
    if (c.dst != o->L + 1) TF_FAIL(-EFAULT, "internal: spans of sample %llu incomplete", (unsigned long long)sample);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* boundaries and extras                                                     */
/* ------------------------------------------------------------------------ */

/* Iterator over the boundaries of one sample, ascending, in (0, L]. */
typedef struct bnd_iter {
    const concat *o;
    uint64_t p0;   /* absolute position of offset 0 (virtual with separators) */
    uint64_t next; /* absolute position of the next candidate boundary */
    uint64_t k;    /* separator mode: document whose end is `next` */
    int done;
} bnd_iter;

/* p0: the absolute position of the sample's offset 0 (sample * L). */
static int bnd_begin(bnd_iter *it, const concat *o, uint64_t p0) {
    memset(it, 0, sizeof *it);
    it->o = o;
    it->p0 = p0;
    if (o->walk) {
        uint64_t vs, s, n;
        TF_TRY(sep_locate(o, it->p0, &it->k, &vs));
        TF_TRY(doc_of(o, it->k, &s, &n));
        it->next = vs + n + (o->sep ? 1 : 0); /* = vs(k + 1) */
    } else if (o->D == 0) {
        it->done = 1;
    } else {
        /* find_document returns the non-empty document holding the token, so
         * the walk jumps over empty documents: they have no boundary */
        uint64_t k, s, n;
        TF_TRY(tf_dataset_find_document(o->ds, it->p0, &k));
        TF_TRY(tf_dataset_document(o->ds, k, &s, &n));
        it->next = s + n;
    }
    return 0;
}

/* *b = next boundary offset; returns 1 when one was produced, 0 at the end. */
static int bnd_next(bnd_iter *it, uint64_t *b) {
    const concat *o = it->o;
    const uint64_t L = o->L;
    if (it->done || it->next > it->p0 + L || it->next <= it->p0) return 0;
    *b = it->next - it->p0;
    uint64_t s, n;
    if (o->sep) {
        if (++it->k >= o->D) {
            it->done = 1;
        } else {
            TF_TRY(doc_of(o, it->k, &s, &n));
            it->next += n + 1;
        }
    } else if (o->walk) {
        /* a view without separators: a boundary where a non-empty document
         * starts, once however many empty ones lie there */
        uint64_t at = it->next;
        while (it->next == at) {
            if (++it->k >= o->D) {
                it->done = 1;
                break;
            }
            TF_TRY(doc_of(o, it->k, &s, &n));
            it->next += n;
        }
    } else if (it->next >= o->T) {
        it->done = 1;
    } else {
        uint64_t k;
        TF_TRY(tf_dataset_find_document(o->ds, it->next, &k));
        TF_TRY(tf_dataset_document(o->ds, k, &s, &n));
        /* the document holding `next` ends after it, so the walk advances */
        if (s + n <= it->next) it->done = 1;
        else it->next = s + n;
    }
    return 1;
}

/* Extras of the L + 1 tokens whose offset 0 is at (virtual) position p0. */
static int extras_at(const concat *o, uint64_t p0, const tf_sample_extras *ex) {
    const uint64_t L = o->L;
    bnd_iter it;
    TF_TRY(bnd_begin(&it, o, p0));
    if (ex->loss_mask) memset(ex->loss_mask, 1, (size_t)L);
    uint64_t last = 0, nc = 0, b;
    if (ex->cu_seqlens) ex->cu_seqlens[0] = 0;
    nc = 1;
    for (;;) {
        int got = bnd_next(&it, &b);
        if (got < 0) return got;
        if (!got) break;
        if (ex->loss_mask) ex->loss_mask[b - 1] = 0;
        if (b < L) tf__extras_segment(ex, b, &last, &nc);
    }
    tf__extras_finish(ex, L, last, nc);
    return 0;
}

static int concat_extras(const tf_order *order, uint64_t sample, const tf_sample_extras *ex) {
    const concat *o = order->impl;
    return extras_at(o, sample * o->L, ex);
}

int tf__concat_extras_at(const tf_dataset *ds, uint64_t L, uint64_t p0, const tf_sample_extras *ex) {
    tf_dataset_info info;
    TF_TRY(tf_dataset_get_info(ds, &info));
    concat o = {.ds = ds, .L = L, .T = info.num_tokens, .D = info.num_documents, .Tv = info.num_tokens};
    return extras_at(&o, p0, ex);
}

/* ------------------------------------------------------------------------ */
/* packing statistics                                                        */
/* ------------------------------------------------------------------------ */

/* CONCAT: sample i is virtual tokens [i*L, i*L + L + 1); positions past
 * N*L + 1 are dropped. A document is split when no single sample holds all of
 * its virtual range (i = start / L is the best candidate), truncated when part
 * of it lies in the dropped tail. */
static int concat_stats(const tf_order *order, tf_packing_stats *st) {
    const concat *o = order->impl;
    const uint64_t L = o->L, end = o->N * L + 1;
    memset(st, 0, sizeof *st);
    st->samples = o->N;
    st->documents = o->D;
    st->token_slots = o->N * (L + 1);
    st->tokens_dropped = o->Tv - end;
    for (uint64_t k = 0; k < o->D; k++) {
        uint64_t s, len;
        TF_TRY(tf_dataset_document(o->ds, k, &s, &len));
        if (o->sel) s = o->sel->vstart[k];
        uint64_t a = s + (o->sep ? k : 0), v = len + (o->sep ? 1 : 0);
        if (!v) {
            st->empty_documents++;
            continue;
        }
        if (a + v > end) st->documents_truncated++;
        else if (a + v > a / L * L + L + 1) st->documents_split++;
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* the kind                                                                  */
/* ------------------------------------------------------------------------ */

/* With separators, locating positions relies on documents tiling the tokens;
 * check the two ends (O(1)). A dataset that passes verify() satisfies it. */
static int check_tiling(const concat *o) {
    if (o->T == 0) return 0;
    if (o->D == 0)
        TF_FAIL(-TF_EFORMAT, "separator_id is set but the dataset has %llu tokens and no documents",
                (unsigned long long)o->T);
    uint64_t s0, n0, sl, nl;
    TF_TRY(tf_dataset_document(o->ds, 0, &s0, &n0));
    TF_TRY(tf_dataset_document(o->ds, o->D - 1, &sl, &nl));
    if (s0 != 0 || sl + nl != o->T)
        TF_FAIL(-TF_EFORMAT, "documents do not cover the tokens (first starts at %llu, last ends at %llu, %llu tokens): separators cannot be placed. Run verify() on the dataset.",
                (unsigned long long)s0, (unsigned long long)(sl + nl), (unsigned long long)o->T);
    return 0;
}

/* sample_at: NULL, the epoch shuffle */
/* Document doc occupies virtual [vs, vs + len) (its separator aside); sample
 * i covers [i*L, i*L + L], so the samples holding it are (vs - 1) / L (0 when
 * vs == 0) to (vs + len - 1) / L. */
static int concat_doc_samples(const tf_order *order, uint64_t doc, uint64_t *first, uint64_t *end) {
    const concat *o = order->impl;
    uint64_t s, len;
    TF_TRY(tf_dataset_document(o->ds, doc, &s, &len));
    if (o->sel) s = o->sel->vstart[doc];
    *first = *end = 0;
    if (!len) return 0;
    uint64_t vs = s + (o->sep ? doc : 0);
    *first = vs ? (vs - 1) / o->L : 0;
    *end = (vs + len - 1) / o->L + 1;
    if (*end > o->N) *end = o->N;
    if (*first > *end) *first = *end;
    return 0;
}

/* Stage 0: the stride entry of the sample's first position; stage 1: the
 * view's offsets and token starts of the documents of that stride. */
static void concat_prefetch(const tf_order *order, uint64_t sample, int stage) {
    const concat *o = order->impl;
    if (!o->hint) return;
    uint64_t j = (sample * o->L) >> o->shift;
    if (j >= o->nhint) return;
    if (stage == 0) {
        __builtin_prefetch(&o->hint[j], 0, 0);
        return;
    }
    uint64_t k = o->hint[j];
    __builtin_prefetch(&o->sel->vstart[k], 0, 0);
    __builtin_prefetch(&o->sel->start[k], 0, 0);
    if (k + 8 < o->D) {
        __builtin_prefetch(&o->sel->vstart[k] + 8, 0, 0);
        __builtin_prefetch(&o->sel->start[k] + 8, 0, 0);
    }
}

static void concat_destroy(void *impl) {
    concat *o = impl;
    if (o) free(o->hint);
    free(o);
}

static const tf__order_ops concat_ops = {.name = "concat", .spans = concat_spans, .extras = concat_extras,
                                         .doc_samples = concat_doc_samples,
                                         .stats = concat_stats, .destroy = concat_destroy,
                                         .prefetch = concat_prefetch};

/* The stride index of a view (see concat.hint): strides of 2^shift virtual
 * tokens, the smallest power of two >= seq_len that keeps the index at most
 * one entry per selected document; one pass over the view's offsets. A view
 * too small to need it, or memory refused, leaves the plain binary search
 * (the same answers). */
static void build_hint(concat *o) {
    if (!o->sel || o->D < 64 || o->Tv == 0) return;
    const uint64_t w = o->sep ? 1 : 0;
    unsigned shift = 0;
    while (shift < 63 && ((uint64_t)1 << shift) < o->L) shift++;
    while (shift < 63 && ((o->Tv - 1) >> shift) + 1 > o->D) shift++;
    uint64_t n = ((o->Tv - 1) >> shift) + 1;
    if (n > SIZE_MAX / sizeof(uint64_t)) return;
    uint64_t *h = malloc((size_t)n * sizeof *h);
    if (!h) return;
    uint64_t k = 0;
    for (uint64_t j = 0; j < n; j++) {
        uint64_t p = j << shift; /* p < Tv = vs(D) */
        while (k + 1 < o->D && o->sel->vstart[k + 1] + w * (k + 1) <= p) k++;
        h[j] = k;
    }
    o->hint = h;
    o->nhint = n;
    o->shift = shift;
}

int tf__concat_init(tf_order *order, const void *args) {
    const tf_dataset *ds = args;
    tf_dataset_info info;
    TF_TRY(tf_dataset_get_info(ds, &info));
    concat o = {.ds = ds, .L = order->cfg.seq_len, .T = info.num_tokens, .D = info.num_documents,
                .sep = order->cfg.separator_id >= 0, .sel = ds->sel};
    o.walk = o.sep || o.sel;
    if (o.sel) o.T = o.sel->vstart[o.sel->n];
    o.Tv = o.T;
    if (o.sep) {
        if (tf__add_overflow(o.T, o.D, &o.Tv)) TF_FAIL(-EOVERFLOW, "tokens + documents overflow 64 bits");
        if (!o.sel) TF_TRY(check_tiling(&o));
    }
    o.N = o.Tv ? (o.Tv - 1) / o.L : 0;
    if (o.N == 0)
        TF_FAIL(-EINVAL, "the dataset is shorter than one sample: it has %llu tokens%s, one sample of seq_len %llu needs %llu (seq_len + 1). Use a smaller seq_len or more data.",
                (unsigned long long)o.Tv, o.sep ? " (separators included)" : "", (unsigned long long)o.L,
                (unsigned long long)o.L + 1);
    build_hint(&o);
    concat *impl = malloc(sizeof *impl);
    if (!impl) {
        free(o.hint);
        return -ENOMEM;
    }
    *impl = o;
    order->ops = &concat_ops;
    order->impl = impl;
    order->ds = ds;
    order->N = o.N;
    /* without separators a sample is one span; with them each document
     * touched gives at most a token span and a separator span, and every span
     * holds at least one of the L + 1 tokens */
    uint64_t a = o.L + 1, b = o.D <= UINT64_MAX / 2 ? 2 * o.D : UINT64_MAX;
    if (!o.sep) b = o.D; /* a view without separators: a span per document touched */
    order->max_spans = o.walk ? (size_t)(a < b ? a : b) : 1;
    return 0;
}
