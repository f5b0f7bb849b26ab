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
 * at worst, independent of the position. tf_order_find_document: one pass
 * over the source's samples of an epoch to find the few that hold the
 * document (O(N_s x spans); sequential, so a packed order's window plans stay
 * cached), then one sample_at per position of the range (no spans).
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
    if (!o || !n || (!out && cap)) return -EINVAL;
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
            if (k < cap)
                out[k] = (tf_segment){.source = source, .document = doc, .start = cur - dstart, .stop = stop - dstart,
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

/* Samples of so (sorted) that hold tokens of dataset range [lo, hi). */
static int samples_holding(const tf_order *so, uint64_t lo, uint64_t hi, uint64_t **out, size_t *n) {
    *out = NULL;
    *n = 0;
    size_t cap = tf__order_max_spans(so), have = 0, room = 0;
    tf__span *spans = malloc(cap * sizeof *spans);
    if (!spans) return -ENOMEM;
    uint64_t *set = NULL;
    int rc = 0;
    uint64_t N = tf_order_num_samples(so);
    for (uint64_t s = 0; !rc && s < N; s++) {
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
    *out = set; /* ascending: samples were visited in order */
    *n = have;
    return 0;
}

int tf_order_find_document(const tf_order *o, size_t source, uint64_t document, uint64_t begin, uint64_t end,
                           uint64_t *out, size_t cap, size_t *n) {
    if (!o || !n || (!out && cap)) return -EINVAL;
    *n = 0;
    tf__clearerr();
    const tf_order *so = tf_order_source(o, source);
    if (!so)
        TF_FAIL(-ERANGE, "source %zu: the loader has %zu dataset(s)", source, tf_order_num_sources(o));
    const tf_dataset *ds = tf_order_dataset(so);
    tf_dataset_info info;
    TF_TRY(tf_dataset_get_info(ds, &info));
    if (document >= info.num_documents)
        TF_FAIL(-ERANGE, "document %llu: dataset %zu has %llu documents", (unsigned long long)document, source,
                (unsigned long long)info.num_documents);
    uint64_t dstart, dlen;
    TF_TRY(tf_dataset_document(ds, document, &dstart, &dlen));
    if (end > o->num_positions) end = o->num_positions;
    if (!dlen || begin >= end) return 0;
    uint64_t *set;
    size_t nset;
    TF_TRY(samples_holding(so, dstart, dstart + dlen, &set, &nset));
    size_t k = 0;
    int rc = 0;
    for (uint64_t pos = begin; nset && pos < end; pos++) {
        size_t s;
        uint64_t j;
        rc = tf_order_mix_source_at(o, pos, &s, &j);
        if (rc) break;
        if (s != source) continue;
        uint64_t sample = tf_order_sample_at(so, j);
        if (!bsearch(&sample, set, nset, sizeof *set, cmp_u64)) continue;
        if (k < cap) out[k] = pos;
        k++;
    }
    free(set);
    if (rc) return rc;
    return found(k, cap, n, "positions of the range holding document", document);
}
