/*
 * explain.c — provenance: which documents, and which tokens of them, make the
 * sample at a stream position (tf_order_segments_at), and the reverse, which
 * positions of a range hold a given document (tf_order_find_document).
 *
 * Both are answered from the order alone, never by reading tokens: a position
 * gives its source and that source's sample (tf_order_mix_source_at, then
 * tf_order_sample_at on the source's own order), the sample gives its token
 * spans (the kind's spans, in the source dataset's coordinates), and the
 * dataset's document index turns a span into (document, offset) segments.
 * Working on the source's own order keeps document numbers those of the
 * dataset the user opened, not of a mixture's concatenated view.
 *
 * Cost. tf_order_segments_at: one sample_at, one spans call, and per span one
 * O(log documents) search plus one step per document it crosses: O(seq_len)
 * at worst, independent of the position. tf_order_find_document runs the
 * order backwards: the kind names the few samples that can hold the document
 * (doc_samples: CONCAT computes them from the document's offset, BEST_FIT and
 * DOCUMENT take the samples of its packing window; a kind without it has all
 * its samples visited), their spans say which do, the inverse of the epoch
 * shuffle (tf__order_position_of) gives each one's index in every epoch of
 * the source's stream, and in a mixture a binary search over the source's
 * counts (tf_order_mix_source_count) the position that takes that index. The
 * cost is O(candidates x spans + hits x log positions), whatever the range;
 * were the inversion ever to disagree with the forward order (checked for
 * every mixture position), the range is scanned position by position.
 */
#include <stdlib.h>
#include <string.h>

#include "kind.h"

/* The end of both queries: *n = k found, -ENOBUFS when they did not all fit
 * in cap (what and at say which, for the message). */
static int found(size_t k, size_t cap, size_t *n, const char *what, unsigned long long at) {
    *n = k;
    if (k > cap)
        TF_FAIL(-ENOBUFS, "%s %llu: %zu found, room was given for %zu", what, at, k, cap);
    return 0;
}

/* The source order and its sample at global position pos. */
static int locate(const tf_order *o, uint64_t pos, size_t *source, const tf_order **so, uint64_t *sample) {
    uint64_t j;
    TF_TRY(tf_order_mix_source_at(o, pos, source, &j));
    *so = tf_order_source(o, *source);
    if (!*so) TF_FAIL(-EFAULT, "internal: mixture source %zu missing", *source);
    *sample = tf_order_sample_at(*so, j);
    if (*sample >= tf_order_num_samples(*so))
        TF_FAIL(-ENOMEM, "out of memory computing the sample at position %llu", (unsigned long long)pos);
    return 0;
}

static int sample_spans(const tf_order *so, uint64_t sample, tf__span **spans, size_t *n) {
    size_t cap = tf__order_max_spans(so);
    *spans = malloc(cap * sizeof **spans);
    if (!*spans) return -ENOMEM;
    int rc = tf__order_sample_spans(so, sample, *spans, cap, n);
    if (rc) {
        free(*spans);
        *spans = NULL;
    }
    return rc;
}

int tf_order_segments_at(const tf_order *o, uint64_t pos, tf_segment *out, size_t cap, size_t *n) {
    TF_NEED_ARG(o);
    TF_NEED_ARG(n);
    TF_NEED_BUF(out, cap);
    *n = 0;
    if (pos >= o->num_positions)
        TF_FAIL(-ERANGE, "position %llu is past the end of the stream (%llu positions)", (unsigned long long)pos,
                (unsigned long long)o->num_positions);
    size_t source = 0;
    const tf_order *so = NULL;
    uint64_t sample = 0;
    TF_TRY(locate(o, pos, &source, &so, &sample));
    const tf_dataset *ds = tf_order_dataset(so);
    tf__span *spans;
    size_t ns;
    TF_TRY(sample_spans(so, sample, &spans, &ns));
    int rc = 0;
    size_t k = 0;
    for (size_t i = 0; !rc && i < ns; i++) {
        if (spans[i].src >= TF_SPAN_PAD || !spans[i].len) continue; /* separator or padding */
        uint64_t cur = spans[i].src, end = spans[i].src + spans[i].len, doc;
        rc = tf_dataset_find_document(ds, cur, &doc);
        while (!rc && cur < end) {
            uint64_t dstart, dlen;
            rc = tf_dataset_document(ds, doc, &dstart, &dlen);
            if (rc) break;
            uint64_t dend = dstart + dlen;
            if (dend <= cur) { /* an empty document at this offset */
                doc++;
                continue;
            }
            uint64_t stop = end < dend ? end : dend;
            uint64_t id = doc; /* over a view: the id in the dataset it selects from */
            rc = tf_dataset_document_id(ds, doc, &id);
            if (rc) break;
            if (k < cap)
                out[k] = (tf_segment){.source = source, .document = id, .start = cur - dstart, .stop = stop - dstart,
                                      .offset = spans[i].dst + (cur - spans[i].src)};
            k++;
            cur = stop;
            doc++;
        }
    }
    free(spans);
    if (rc) return rc;
    return found(k, cap, n, "segments (seq_len + 1 always suffice) of the sample at position", pos);
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Samples in [first, end) of so (ascending) that hold tokens of dataset range
 * [lo, hi). */
static int samples_holding(const tf_order *so, uint64_t first, uint64_t end, uint64_t lo, uint64_t hi,
                           uint64_t **out, size_t *n) {
    *out = NULL;
    *n = 0;
    size_t cap = tf__order_max_spans(so), have = 0, room = 0;
    tf__span *spans = malloc(cap * sizeof *spans);
    if (!spans) return -ENOMEM;
    uint64_t *set = NULL;
    int rc = 0;
    for (uint64_t s = first; !rc && s < end; s++) {
        size_t ns;
        rc = tf__order_sample_spans(so, s, spans, cap, &ns);
        for (size_t i = 0; !rc && i < ns; i++) {
            if (spans[i].src >= TF_SPAN_PAD || spans[i].src >= hi || spans[i].src + spans[i].len <= lo) continue;
            if (have == room) {
                room = room ? room * 2 : 16;
                uint64_t *g = realloc(set, room * sizeof *g);
                if (!g) {
                    rc = -ENOMEM;
                    break;
                }
                set = g;
            }
            set[have++] = s;
            break;
        }
    }
    free(spans);
    if (rc) {
        free(set);
        return rc;
    }
    *out = set;
    *n = have;
    return 0;
}

/* A growing list of positions. */
typedef struct poslist {
    uint64_t *v;
    size_t n, room;
} poslist;

static int poslist_add(poslist *l, uint64_t pos) {
    uint64_t *g = tf__grow(l->v, &l->room, l->n, sizeof *g, 64);
    if (!g) return -ENOMEM;
    l->v = g;
    l->v[l->n++] = pos;
    return 0;
}

/* Every position of [begin, end): is its sample (of source `source`) in set? */
static int scan_positions(const tf_order *o, size_t source, const tf_order *so, const uint64_t *set, size_t nset,
                          uint64_t begin, uint64_t end, poslist *out) {
    for (uint64_t pos = begin; pos < end; pos++) {
        size_t s;
        uint64_t j;
        TF_TRY(tf_order_mix_source_at(o, pos, &s, &j));
        if (s != source) continue;
        uint64_t sample = tf_order_sample_at(so, j);
        if (bsearch(&sample, set, nset, sizeof *set, cmp_u64)) TF_TRY(poslist_add(out, pos));
    }
    return 0;
}

/* The error of a count that failed (UINT64_MAX) at pos: the position's, when
 * it cannot be told (before a recorded weight change that the order cannot
 * rebuild), else out of memory. */
static int count_failed(const tf_order *o, uint64_t pos) {
    size_t s;
    uint64_t j;
    int rc = tf_order_mix_source_at(o, pos, &s, &j);
    return rc ? rc : tf__seterr(-ENOMEM, "out of memory building a mixture schedule table");
}

/* The mixture position of index j of source `source`'s own stream, in
 * [begin, end): the first p with count(p + 1) > j, checked against
 * tf_order_mix_source_at. 1 when found, 0 when the check disagrees. */
static int mix_position(const tf_order *o, size_t source, uint64_t j, uint64_t begin, uint64_t end, uint64_t *pos) {
    uint64_t lo = begin, hi = end - 1; /* answer in [lo, hi] */
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        uint64_t c = tf_order_mix_source_count(o, source, mid + 1);
        if (c == UINT64_MAX) return count_failed(o, mid + 1);
        if (c > j) hi = mid;
        else lo = mid + 1;
    }
    size_t s;
    uint64_t idx;
    TF_TRY(tf_order_mix_source_at(o, lo, &s, &idx));
    *pos = lo;
    return s == source && idx == j;
}

/* Positions of [begin, end) whose sample is in set, by inverting the order:
 * the epoch shuffle gives each sample's index in the source's stream, a
 * binary search over the mixture's counts its position. 0 when done; 1 when
 * the inversion disagrees with the forward order (the caller then scans). */
static int invert_positions(const tf_order *o, size_t source, const tf_order *so, const uint64_t *set, size_t nset,
                            uint64_t begin, uint64_t end, poslist *out) {
    if (so->ops->sample_at) return 1; /* not the epoch shuffle */
    uint64_t Ns = so->N;
    int mixture = so != o;
    uint64_t jlo = begin, jhi = end; /* the source's own indices that [begin, end) reads */
    if (mixture) {
        jlo = tf_order_mix_source_count(o, source, begin);
        jhi = tf_order_mix_source_count(o, source, end);
        if (jlo == UINT64_MAX || jhi == UINT64_MAX) return count_failed(o, jlo == UINT64_MAX ? begin : end);
    }
    if (jlo >= jhi) return 0;
    for (uint64_t e = jlo / Ns; e <= (jhi - 1) / Ns; e++) {
        for (size_t k = 0; k < nset; k++) {
            uint64_t j = tf__order_position_of(so, e, set[k]);
            if (j < jlo || j >= jhi) continue;
            uint64_t pos = j;
            if (mixture) {
                int ok = mix_position(o, source, j, begin, end, &pos);
                if (ok < 0) return ok;
                if (!ok) return 1;
            }
            TF_TRY(poslist_add(out, pos));
        }
    }
    qsort(out->v, out->n, sizeof *out->v, cmp_u64);
    return 0;
}

int tf_order_find_document(const tf_order *o, size_t source, uint64_t document, uint64_t begin, uint64_t end,
                           uint64_t *out, size_t cap, size_t *n) {
    TF_NEED_ARG(o);
    TF_NEED_ARG(n);
    TF_NEED_BUF(out, cap);
    *n = 0;
    tf__clearerr();
    const tf_order *so = tf_order_source(o, source);
    if (!so)
        TF_FAIL(-ERANGE, "source %zu: the loader has %zu dataset(s)", source, tf_order_num_sources(o));
    const tf_dataset *ds = tf_order_dataset(so);
    if (tf_dataset_selection(ds, NULL, NULL) == 1) {
        /* a view: document is an id of the dataset it selects from; one it
         * leaves out is in no position */
        uint64_t k;
        int rc = tf_dataset_document_index(ds, document, &k);
        if (rc == -ENOENT) {
            tf__clearerr();
            return 0;
        }
        TF_TRY(rc);
        document = k;
    }
    tf_dataset_info info;
    TF_TRY(tf_dataset_get_info(ds, &info));
    if (document >= info.num_documents)
        TF_FAIL(-ERANGE, "document %llu: dataset %zu has %llu documents", (unsigned long long)document, source,
                (unsigned long long)info.num_documents);
    uint64_t dstart, dlen;
    TF_TRY(tf_dataset_document(ds, document, &dstart, &dlen));
    if (end > o->num_positions) end = o->num_positions;
    if (!dlen || begin >= end) return 0;
    uint64_t first = 0, last = so->N;
    if (so->ops->doc_samples) TF_TRY(so->ops->doc_samples(so, document, &first, &last));
    uint64_t *set;
    size_t nset;
    TF_TRY(samples_holding(so, first, last, dstart, dstart + dlen, &set, &nset));
    poslist l = {0};
    int rc = nset ? invert_positions(o, source, so, set, nset, begin, end, &l) : 0;
    if (rc == 1) { /* the forward order, position by position */
        l.n = 0;
        rc = scan_positions(o, source, so, set, nset, begin, end, &l);
    }
    free(set);
    size_t k = l.n;
    for (size_t i = 0; !rc && i < k && i < cap; i++) out[i] = l.v[i];
    free(l.v);
    if (rc) return rc;
    return found(k, cap, n, "positions of the range holding document", document);
}
