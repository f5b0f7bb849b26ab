/*
 * megatron_order.c — the order of Megatron-core's GPTDataset, read from the
 * index cache GPTDataset wrote (tf_order_create_megatron in tokenfeed.h), so
 * that a run begun on Megatron continues on tokenfeed sample for sample.
 *
 * GPTDataset (megatron/core/datasets/gpt_dataset.py) keeps three arrays in
 * its path_to_cache, as HASH-GPTDataset-SPLIT-{document,sample,shuffle}_index.npy:
 *   document_index  the dataset's documents (IndexedDataset sequences) of the
 *                   split, every epoch it needs, shuffled: one stream of text;
 *   sample_index    (N + 1) rows (d, o): sample s starts at token o of
 *                   document document_index[d] and ends where row s + 1
 *                   starts, plus add_extra_token_to_sequence (X) tokens;
 *   shuffle_index   N rows of sample_index: the sample at training index i
 *                   is shuffle_index[i].
 * GPTDataset.__getitem__(i) reads sample s = shuffle_index[i]: from (d0, o0)
 * to (d1, o1), the pieces are [o0, end of doc) of document_index[d0], the
 * whole documents in between and [0, o1 + X) of document_index[d1] (one
 * piece [o0, o1 + X) when d0 == d1); seq_length + X tokens, except a final
 * partial sample (a validation split without drop_last_partial_validation_sequence),
 * padded with Megatron's pad id, which it returns as token 0. Without the
 * extra token (X = 0) Megatron's labels end with that padding: tokenfeed's
 * sample (seq_len + 1 tokens) is then the seq_len tokens and a 0.
 *
 * Here: position pos is training index i = pos mod N (the cache is one epoch
 * of this order: with epochs = 1 the stream ends where Megatron's dataset
 * does; endless streams read it again in the same order); sample_at gives
 * shuffle_index[i], and spans are the pieces, in dataset token coordinates,
 * and padding. Each query reads O(pieces) entries of the arrays in place:
 * nothing is copied, built or allocated, so opening a cache of any size is
 * O(1). The arrays are borrowed (the caller maps the .npy files).
 *
 * Checks. A cache that does not belong to the data or the configuration must
 * fail, never yield other tokens: create checks the shapes, the first row,
 * and a spread of samples in full (documents within the dataset, offsets
 * within their documents, seq_len + X tokens); every sample read later is
 * checked the same way (-TF_EFORMAT naming the sample and what differs).
 *
 * Extras follow the pieces: a document starts at every piece but the first;
 * labels never cross into another document nor into the padding (the rule of
 * packed samples, pack.c). The fingerprint of the order's own data (kind_fp)
 * hashes the arrays' shapes, dtypes, X and their first and last 64 KiB: a
 * state saved on one cache is refused on another (state.c). Changing any of
 * this must change MEGATRON_FP_VERSION.
 */
#include <stdlib.h>
#include <string.h>

#include "kind.h"

#define MEGATRON_FP_VERSION 1
#define MEGATRON_CHECKED_SAMPLES 64
#define CACHE_FIX "The cache belongs to other data or another configuration: point at the GPTDataset cache built from this dataset, with the same sequence_length and add_extra_token_to_sequence."

typedef unsigned long long ull;

typedef struct megatron {
    const tf_dataset *ds;
    tf_megatron_index ix;
    uint64_t L, X, N, D; /* seq_len, extra token, samples, dataset documents */
} megatron;

/* Entry i of an integer array of dtype dt (checked at create); negative
 * values become huge, so every range check rejects them. */
static uint64_t entry(const void *a, tf_dtype dt, uint64_t i) {
    switch (dt) {
    case TF_INT32: { int32_t v; memcpy(&v, (const char *)a + 4 * i, 4); return v < 0 ? UINT64_MAX : (uint64_t)v; }
    case TF_UINT32: { uint32_t v; memcpy(&v, (const char *)a + 4 * i, 4); return v; }
    case TF_INT64: { int64_t v; memcpy(&v, (const char *)a + 8 * i, 8); return v < 0 ? UINT64_MAX : (uint64_t)v; }
    case TF_UINT64: { uint64_t v; memcpy(&v, (const char *)a + 8 * i, 8); return v; }
    default: return UINT64_MAX;
    }
}

static uint64_t sample_row(const megatron *m, uint64_t row, int col) {
    return entry(m->ix.sample_index, m->ix.sample_index_dtype, 2 * row + (uint64_t)col);
}

static uint64_t mg_sample_at(const tf_order *o, uint64_t pos) {
    const megatron *m = o->impl;
    return entry(m->ix.shuffle_index, m->ix.shuffle_index_dtype, pos % m->N);
}

/* A document starts at token b (0 < b) of a sample: extras (see mg_extras). */
static void boundary(const tf_sample_extras *ex, uint64_t L, uint64_t b, uint64_t *last, uint64_t *nc) {
    if (ex->loss_mask && b <= L) ex->loss_mask[b - 1] = 0;
    if (b < L) tf__extras_segment(ex, b, last, nc);
}

/* The pieces of sample s (< N), checked against the dataset and the
 * configuration: into spans (when not NULL; dataset tokens, then one pad span
 * up to L + 1: at most L + 2 spans), and into the extras ex (when not NULL).
 * *ntok receives the tokens before the padding. Allocates nothing (it reads
 * mapped memory under the engine's SIGBUS guard). */
static int walk(const megatron *m, uint64_t s, tf__span *spans, const tf_sample_extras *ex, size_t *n,
                uint64_t *ntok) {
    const uint64_t want = m->L + m->X, L = m->L;
    uint64_t d0 = sample_row(m, s, 0), o0 = sample_row(m, s, 1);
    uint64_t d1 = sample_row(m, s + 1, 0), o1 = sample_row(m, s + 1, 1);
    if (d0 > d1 || d1 >= m->ix.document_index_len)
        TF_FAIL(-TF_EFORMAT, "the Megatron index cache's sample %llu spans document_index positions %lld to %lld, outside [0, %llu) or reversed. " CACHE_FIX,
                (ull)s, (long long)d0, (long long)d1, (ull)m->ix.document_index_len);
    uint64_t got = 0, last = 0, nc = 1;
    size_t k = 0;
    if (ex && ex->loss_mask) memset(ex->loss_mask, 1, (size_t)L);
    if (ex && ex->cu_seqlens) ex->cu_seqlens[0] = 0;
    for (uint64_t d = d0; d <= d1; d++) {
        uint64_t doc = entry(m->ix.document_index, m->ix.document_index_dtype, d), start, len;
        if (doc >= m->D)
            TF_FAIL(-TF_EFORMAT, "the Megatron index cache's document_index[%llu] is document %lld, the dataset has %llu documents. " CACHE_FIX,
                    (ull)d, (long long)doc, (ull)m->D);
        TF_TRY(tf_dataset_document(m->ds, doc, &start, &len));
        uint64_t a = d == d0 ? o0 : 0, b = d < d1 ? len : o1 == UINT64_MAX ? UINT64_MAX : o1 + m->X;
        if (a > b || b > len)
            TF_FAIL(-TF_EFORMAT, "the Megatron index cache's sample %llu reads tokens [%lld, %lld) of document %llu, which has %llu tokens. " CACHE_FIX,
                    (ull)s, (long long)a, (long long)b, (ull)doc, (ull)len);
        if (a == b) continue;
        if (got + (b - a) > want)
            TF_FAIL(-TF_EFORMAT, "the Megatron index cache's sample %llu holds more than %llu tokens (seq_len %llu%s). " CACHE_FIX
                    " The cache's sequence_length is in its description.txt.",
                    (ull)s, (ull)want, (ull)L, m->X ? " + the extra token" : "");
        if (spans) spans[k] = (tf__span){start + a, b - a, got};
        if (ex && got) boundary(ex, L, got, &last, &nc);
        k++;
        got += b - a;
    }
    /* only the last sample may be short (Megatron pads it) */
    if (got < want && s + 1 < m->N)
        TF_FAIL(-TF_EFORMAT, "the Megatron index cache's sample %llu holds %llu tokens, seq_len %llu%s needs %llu. " CACHE_FIX,
                (ull)s, (ull)got, (ull)L, m->X ? " + the extra token" : "", (ull)want);
    if (got < L + 1) {
        if (spans) spans[k] = (tf__span){TF_SPAN_PAD, L + 1 - got, got};
        k++;
        if (ex) { /* no label in the padding; the padding is a segment of its own */
            if (ex->loss_mask)
                for (uint64_t t = got ? got - 1 : 0; t < L; t++) ex->loss_mask[t] = 0;
            if (got) boundary(ex, L, got, &last, &nc);
        }
    }
    if (ex) tf__extras_finish(ex, L, last, nc);
    *n = k;
    *ntok = got;
    return 0;
}

static int mg_spans(const tf_order *o, uint64_t sample, tf__span *spans, size_t cap, size_t *n) {
    (void)cap; /* >= max_spans = L + 2, checked by order.c */
    uint64_t ntok;
    return walk(o->impl, sample, spans, NULL, n, &ntok);
}

/* As a packed sample's (pack.c): segments start at each piece after the
 * first and at the padding; a label is trained unless it starts a segment
 * or lies in the padding. */
static int mg_extras(const tf_order *o, uint64_t sample, const tf_sample_extras *ex) {
    size_t n;
    uint64_t ntok;
    return walk(o->impl, sample, NULL, ex, &n, &ntok);
}

/* Samples and padding; the documents as the dataset counts them. */
static int mg_stats(const tf_order *o, tf_packing_stats *st) {
    const megatron *m = o->impl;
    tf_dataset_info info;
    TF_TRY(tf_dataset_get_info(m->ds, &info));
    size_t n;
    uint64_t last;
    TF_TRY(walk(m, m->N - 1, NULL, NULL, &n, &last));
    memset(st, 0, sizeof *st);
    st->samples = m->N;
    st->documents = info.num_documents;
    st->token_slots = m->N * (m->L + 1);
    st->pad_tokens = (m->N - 1) * (1 - m->X) + (m->L + 1 - last);
    st->padding_fraction = (double)st->pad_tokens / (double)st->token_slots;
    return 0;
}

static const tf__order_ops megatron_ops = {.name = "megatron", .sample_at = mg_sample_at, .spans = mg_spans,
                                           .extras = mg_extras, .stats = mg_stats, .destroy = free,
                                           .foreign = "megatron"};

static int index_dtype(tf_dtype dt, const char *name) {
    if (dt == TF_INT32 || dt == TF_UINT32 || dt == TF_INT64 || dt == TF_UINT64) return 0;
    TF_FAIL(-EINVAL, "Megatron index cache: %s has dtype %s; GPTDataset writes int32, uint32 or int64 indices", name,
            tf_dtype_name(dt));
}

/* Shapes, dtypes, the first row and the configuration. */
static int check_index(const tf_megatron_index *ix, const tf_order_config *c) {
    if (c->packing != TF_PACK_CONCAT || c->separator_id != -1 || c->shuffle != TF_SHUFFLE_NONE)
        TF_FAIL(-EINVAL, "Megatron's order takes its samples and their order from the cache: packing must be CONCAT, separator_id -1 and shuffle NONE");
    if (c->pad_id != 0)
        TF_FAIL(-EINVAL, "Megatron's order pads with 0 (GPTDataset returns 0 where it pads): pad_id must be 0, found %lld",
                (long long)c->pad_id);
    if (ix->add_extra_token != 0 && ix->add_extra_token != 1)
        TF_FAIL(-EINVAL, "Megatron index cache: add_extra_token must be 0 or 1 (add_extra_token_to_sequence), found %d",
                ix->add_extra_token);
    TF_TRY(index_dtype(ix->document_index_dtype, "document_index"));
    TF_TRY(index_dtype(ix->sample_index_dtype, "sample_index"));
    TF_TRY(index_dtype(ix->shuffle_index_dtype, "shuffle_index"));
    if (!ix->document_index || !ix->sample_index || !ix->shuffle_index || ix->document_index_len == 0 ||
        ix->sample_index_rows < 2)
        TF_FAIL(-EINVAL, "Megatron index cache: found %llu document_index entries and %llu sample_index rows; GPTDataset writes at least 1 and 2 (one sample)",
                (ull)ix->document_index_len, (ull)ix->sample_index_rows);
    if (ix->shuffle_index_len != ix->sample_index_rows - 1)
        TF_FAIL(-EINVAL, "Megatron index cache: shuffle_index has %llu entries, sample_index %llu rows: GPTDataset writes one entry per sample (rows - 1); the files come from different caches",
                (ull)ix->shuffle_index_len, (ull)ix->sample_index_rows);
    return 0;
}

/* Hash the arrays' first and last 64 KiB. */
static void hash_ends(tf__xxh64_state *h, const void *a, uint64_t bytes) {
    const uint64_t S = 64 * 1024;
    tf__xxh64_update(h, a, (size_t)(bytes < S ? bytes : S));
    if (bytes > S) tf__xxh64_update(h, (const char *)a + (bytes - S), (size_t)S);
}

static uint64_t index_fingerprint(const tf_megatron_index *ix) {
    tf__xxh64_state h;
    tf__xxh64_reset(&h, 0x4d45474f5244ULL); /* "MEGORD" */
    uint64_t rec[8] = {MEGATRON_FP_VERSION, (uint64_t)ix->add_extra_token, ix->document_index_len,
                       ix->sample_index_rows, ix->shuffle_index_len, (uint64_t)ix->document_index_dtype,
                       (uint64_t)ix->sample_index_dtype, (uint64_t)ix->shuffle_index_dtype};
    uint8_t buf[sizeof rec];
    for (size_t i = 0; i < 8; i++) tf__put_le64(buf + 8 * i, rec[i]);
    tf__xxh64_update(&h, buf, sizeof buf);
    hash_ends(&h, ix->document_index, ix->document_index_len * tf_dtype_size(ix->document_index_dtype));
    hash_ends(&h, ix->sample_index, 2 * ix->sample_index_rows * tf_dtype_size(ix->sample_index_dtype));
    hash_ends(&h, ix->shuffle_index, ix->shuffle_index_len * tf_dtype_size(ix->shuffle_index_dtype));
    return tf__xxh64_digest(&h);
}

/* Samples 0, N - 1 and a spread in between, in full; the first row; the
 * shuffle entries at both ends. */
static int check_samples(const megatron *m) {
    if (sample_row(m, 0, 0) != 0 || sample_row(m, 0, 1) != 0)
        TF_FAIL(-TF_EFORMAT, "the Megatron index cache's sample_index starts at (%lld, %lld); GPTDataset's starts at (0, 0). " CACHE_FIX,
                (long long)sample_row(m, 0, 0), (long long)sample_row(m, 0, 1));
    uint64_t k = m->N < MEGATRON_CHECKED_SAMPLES ? m->N : MEGATRON_CHECKED_SAMPLES;
    int rc = 0;
    for (uint64_t j = 0; !rc && j < k; j++) {
        uint64_t s = k == 1 ? 0 : (uint64_t)((unsigned __int128)j * (m->N - 1) / (k - 1)), t = j < k / 2 ? j : m->N - 1 - (j - k / 2);
        size_t n;
        uint64_t ntok;
        rc = walk(m, s, NULL, NULL, &n, &ntok);
        uint64_t v = entry(m->ix.shuffle_index, m->ix.shuffle_index_dtype, t);
        if (!rc && v >= m->N)
            rc = tf__seterr(-TF_EFORMAT, "the Megatron index cache's shuffle_index[%llu] is %lld, not a sample (there are %llu). " CACHE_FIX,
                            (ull)t, (long long)v, (ull)m->N);
    }
    return rc;
}

typedef struct mg_args {
    const tf_dataset *ds;
    const tf_megatron_index *ix;
} mg_args;

static int mg_init(tf_order *order, const void *vargs) {
    const mg_args *a = vargs;
    const tf_order_config *c = &order->cfg;
    TF_TRY(check_index(a->ix, c));
    tf_dataset_info info;
    TF_TRY(tf_dataset_get_info(a->ds, &info));
    if (c->seq_len > (uint64_t)SIZE_MAX / sizeof(tf__span) - 2) TF_FAIL(-EINVAL, "seq_len %llu is too large", (ull)c->seq_len);
    megatron *m = calloc(1, sizeof *m);
    if (!m) return -ENOMEM;
    *m = (megatron){.ds = a->ds, .ix = *a->ix, .L = c->seq_len, .X = (uint64_t)a->ix->add_extra_token,
                    .N = a->ix->sample_index_rows - 1, .D = info.num_documents};
    int rc = check_samples(m);
    if (rc) {
        free(m);
        return rc;
    }
    order->ops = &megatron_ops;
    order->impl = m;
    order->ds = a->ds;
    order->N = m->N;
    order->max_spans = (size_t)(m->L + 2); /* every piece holds a token, then one pad span */
    order->has_kind_fp = 1;
    order->kind_fp = index_fingerprint(a->ix);
    return 0;
}

int tf_order_create_megatron(const tf_dataset *ds, const tf_order_config *cfg, const tf_megatron_index *index,
                             tf_order **out) {
    TF_NEED_ARG(out);
    *out = NULL;
    if (!ds || !cfg || !index) TF_FAIL(-EINVAL, "tf_order_create_megatron: dataset, config and index are required");
    if (tf_dataset_selection(ds, NULL, NULL) == 1)
        TF_FAIL(-EINVAL, "tf_order_create_megatron: Megatron's order comes from its index cache over the whole dataset and cannot read a view (a filtered dataset); use tokenfeed's own order for a filter");
    tf__clearerr();
    mg_args a = {ds, index};
    return tf__order_build(mg_init, &a, cfg, out);
}
