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
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kind.h"
#include "../sources/source.h"

#define MEGATRON_FP_VERSION 1
#define MEGATRON_CHECKED_SAMPLES 64
#define CACHE_FIX "The cache belongs to other data or another configuration: point at the GPTDataset cache built from this dataset, with the same sequence_length and add_extra_token_to_sequence."

typedef unsigned long long ull;

typedef struct megatron {
    const tf_dataset *ds;
    tf_megatron_index ix;
    uint64_t L, X, N, D; /* seq_len, extra token, samples, dataset documents */
    /* read from the cache (tf__megatron_init): the arrays' files, mapped */
    void *map[3];
    size_t map_len[3];
    char *cache; /* the cache's common start DIR/HASH-GPTDataset-SPLIT- */
    char *given; /* cfg.megatron_cache as given (the order's cfg points here) */
} megatron;

static void mg_destroy(void *impl) {
    megatron *m = impl;
    if (!m) return;
    for (int i = 0; i < 3; i++)
        if (m->map[i]) munmap(m->map[i], m->map_len[i]);
    free(m->cache);
    free(m->given);
    free(m);
}

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
                                           .extras = mg_extras, .stats = mg_stats, .destroy = mg_destroy};

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
    megatron *owned; /* the mappings and the cache's name, given to the order (NULL: borrowed arrays) */
} mg_args;

static int mg_init(tf_order *order, const void *vargs) {
    const mg_args *a = vargs;
    const tf_order_config *c = &order->cfg;
    TF_TRY(check_index(a->ix, c));
    tf_dataset_info info;
    TF_TRY(tf_dataset_get_info(a->ds, &info));
    if (c->seq_len > (uint64_t)SIZE_MAX / sizeof(tf__span) - 2) TF_FAIL(-EINVAL, "seq_len %llu is too large", (ull)c->seq_len);
    megatron *m = a->owned ? a->owned : calloc(1, sizeof *m);
    if (!m) return -ENOMEM;
    m->ds = a->ds;
    m->ix = *a->ix;
    m->L = c->seq_len;
    m->X = (uint64_t)a->ix->add_extra_token;
    m->N = a->ix->sample_index_rows - 1;
    m->D = info.num_documents;
    int rc = check_samples(m);
    if (rc) {
        if (!a->owned) free(m);
        return rc;
    }
    order->cfg.megatron_cache = m->given; /* the order's copy: the caller's string is borrowed */
    order->ops = &megatron_ops;
    order->impl = m;
    order->ds = a->ds;
    order->N = m->N;
    order->max_spans = (size_t)(m->L + 2); /* every piece holds a token, then one pad span */
    order->has_kind_fp = 1;
    order->kind_fp = index_fingerprint(a->ix);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* The index cache on disk: finding it and mapping its arrays                */
/* ------------------------------------------------------------------------ */

static const char *const ARRAYS[3] = {"document_index", "sample_index", "shuffle_index"};
static const char *const SPLITS[3] = {"train", "valid", "test"};
#define DESC_MAX (1u << 20) /* description.txt is a few hundred bytes */
#define CACHES_MAX 4096     /* caches of one split listed in a directory */
#define LOOKUP_FIX "point megatron_cache at Megatron's path_to_cache (--data-cache-path), where GPTDataset wrote its indices, or at one of a cache's files"

static int ends_with(const char *s, size_t n, const char *suffix) {
    size_t k = strlen(suffix);
    return n >= k && !memcmp(s + n - k, suffix, k);
}

static char *join(const char *a, const char *b, const char *c) {
    size_t n = strlen(a) + strlen(b) + strlen(c) + 1;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s%s%s", a, b, c);
    return p;
}

static int regular_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* description.txt of the cache at base, parsed into j (0: the caller frees
 * j with free_description, which also frees the text its nodes point into),
 * or 1 when there is none (GPTDataset always writes one; a copied cache may
 * lack it). */
static int read_description(const char *base, tf__json *j) {
    char *p = join(base, "description.txt", "");
    if (!p) return -ENOMEM;
    int fd = open(p, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    struct stat st;
    int rc = 1;
    if (fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
        if ((uint64_t)st.st_size > DESC_MAX) {
            rc = tf__seterr(-TF_EFORMAT, "%s: size: expected a GPTDataset description of at most %u bytes, found %llu. This is not Megatron's description.txt: remove it or point megatron_cache at one of the cache's .npy files",
                            p, DESC_MAX, (ull)st.st_size);
        } else {
            char *buf = malloc((size_t)st.st_size + 1);
            ssize_t got = buf ? pread(fd, buf, (size_t)st.st_size, 0) : -1;
            if (!buf) rc = -ENOMEM;
            else if (got != (ssize_t)st.st_size) rc = 1; /* changed under us: read as absent, the arrays are checked anyway */
            else if (tf__json_parse(buf, (size_t)got, j)) {
                free(buf);
                buf = NULL;
                char msg[300];
                snprintf(msg, sizeof msg, "%s", tf_last_error());
                rc = tf__seterr(-TF_EFORMAT, "%s: expected GPTDataset's description (JSON): %s. Remove the file, or regenerate the cache with Megatron", p, msg);
            } else if (j->nodes[0].type != TF__J_OBJ) {
                tf__json_free(j);
                free(buf);
                buf = NULL;
                rc = tf__seterr(-TF_EFORMAT, "%s: expected a JSON object (GPTDataset's description), found %s", p,
                                tf__json_type_name(&j->nodes[0]));
            } else {
                rc = 0;
                buf = NULL; /* j->text: free_description frees it */
            }
            free(buf);
        }
    }
    if (fd >= 0) close(fd);
    free(p);
    return rc;
}

static void free_description(tf__json *j) {
    char *text = (char *)j->text;
    tf__json_free(j);
    free(text);
}

/* The description's class and sequence_length against this configuration. */
static int check_description(const char *base, uint64_t seq_len) {
    tf__json j;
    int rc = read_description(base, &j);
    if (rc) return rc > 0 ? 0 : rc;
    const tf__jnode *cls = tf__json_get(&j, &j.nodes[0], "class");
    const tf__jnode *sl = tf__json_get(&j, &j.nodes[0], "sequence_length");
    if (cls && cls->type == TF__J_STR && !tf__json_streq(cls, "GPTDataset"))
        rc = tf__seterr(-EINVAL, "%sdescription.txt: a %.*s cache; this order reproduces GPTDataset's: point megatron_cache at a GPTDataset cache",
                        base, (int)(cls->slen > 64 ? 64 : cls->slen), cls->s);
    else if (sl && sl->type == TF__J_INT && (sl->neg || sl->u != seq_len))
        rc = tf__seterr(-EINVAL, "%sdescription.txt: the cache was built with sequence_length %s%llu, the loader has seq_len=%llu: use seq_len=%llu to continue that run",
                        base, sl->neg ? "-" : "", (ull)sl->u, (ull)seq_len, (ull)sl->u);
    free_description(&j);
    return rc;
}

/* Whether the cache at base fits: its description names seq_len (or none)
 * and, when it names its data, one of ds's files. */
static int cache_fits(const char *base, uint64_t seq_len, const tf_dataset *ds) {
    tf__json j;
    if (read_description(base, &j)) return 1;
    const tf__jnode *sl = tf__json_get(&j, &j.nodes[0], "sequence_length");
    const tf__jnode *dp = tf__json_get(&j, &j.nodes[0], "dataset_path");
    int fits = !(sl && sl->type == TF__J_INT && (sl->neg || sl->u != seq_len));
    if (fits && dp && dp->type == TF__J_STR && dp->slen < PATH_MAX - 8) {
        char bin[PATH_MAX], want[PATH_MAX], have[PATH_MAX];
        snprintf(bin, sizeof bin, "%.*s.bin", (int)dp->slen, dp->s);
        fits = 0;
        if (realpath(bin, want))
            for (uint64_t i = 0; !fits && i < ds->nfiles; i++)
                fits = ds->files[i].path && realpath(ds->files[i].path, have) && !strcmp(want, have);
    }
    free_description(&j);
    return fits;
}

/* A one-line summary of a cache's description, for a message. */
static void summary(const char *base, char *out, size_t cap) {
    static const char *const keys[] = {"dataset_path", "num_samples", "random_seed", "sequence_length", "split"};
    tf__json j;
    *out = 0;
    if (read_description(base, &j)) {
        snprintf(out, cap, "(no description)");
        return;
    }
    for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) {
        const tf__jnode *n = tf__json_get(&j, &j.nodes[0], keys[k]);
        size_t l = strlen(out);
        if (!n || l + 1 >= cap) continue;
        if (n->type == TF__J_STR)
            snprintf(out + l, cap - l, "%s%s='%.*s'", l ? ", " : "", keys[k], (int)(n->slen > 200 ? 200 : n->slen), n->s);
        else if (n->type == TF__J_INT)
            snprintf(out + l, cap - l, "%s%s=%s%llu", l ? ", " : "", keys[k], n->neg ? "-" : "", (ull)n->u);
    }
    free_description(&j);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The cache of split in directory dir: its common start in *base. */
static int find_in_directory(const char *dir, const char *split, uint64_t seq_len, const tf_dataset *ds, char **base) {
    DIR *d = opendir(dir);
    if (!d) TF_FAIL(-errno, "%s: cannot list the directory (%s): " LOOKUP_FIX, dir, strerror(errno));
    char want[64], splits[64] = "";
    snprintf(want, sizeof want, "-GPTDataset-%s-document_index.npy", split);
    char **found = NULL;
    size_t n = 0;
    int rc = 0;
    const char *sep = ends_with(dir, strlen(dir), "/") ? "" : "/";
    for (struct dirent *e; !rc && (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        if (!ends_with(e->d_name, len, "-document_index.npy") || !strstr(e->d_name, "-GPTDataset-")) continue;
        for (int k = 0; k < 3; k++) { /* the splits it holds, for the message */
            char s[40];
            snprintf(s, sizeof s, "-GPTDataset-%s-document_index.npy", SPLITS[k]);
            if (ends_with(e->d_name, len, s) && !strstr(splits, SPLITS[k]))
                snprintf(splits + strlen(splits), sizeof splits - strlen(splits), "%s%s", *splits ? " " : "", SPLITS[k]);
        }
        if (!ends_with(e->d_name, len, want)) continue;
        if (n == CACHES_MAX) {
            rc = tf__seterr(-EINVAL, "%s holds more than %d GPTDataset caches of split '%s': pass the path of one (its description.txt or any of its files)",
                            dir, CACHES_MAX, split);
            break;
        }
        char **grown = realloc(found, (n + 1) * sizeof *found);
        char stem[NAME_MAX + 1];
        snprintf(stem, sizeof stem, "%.*s", (int)(len - strlen("document_index.npy")), e->d_name);
        char *b = grown ? join(dir, sep, stem) : NULL;
        if (grown) found = grown;
        if (!b) rc = -ENOMEM;
        else found[n++] = b;
    }
    closedir(d);
    if (!rc && n == 0) {
        /* in sorted order, as the message lists them */
        char sorted[64] = "";
        for (const char *const *k = (const char *const[]){"test", "train", "valid", NULL}; *k; k++)
            if (strstr(splits, *k)) snprintf(sorted + strlen(sorted), sizeof sorted - strlen(sorted), "%s%s", *sorted ? ", " : "", *k);
        rc = *sorted ? tf__seterr(-ENOENT, "%s: no GPTDataset index cache of split '%s' (files *-GPTDataset-%s-document_index.npy); it holds the splits %s",
                                  dir, split, split, sorted)
                     : tf__seterr(-ENOENT, "%s: no GPTDataset index cache of split '%s' (files *-GPTDataset-%s-document_index.npy): " LOOKUP_FIX,
                                  dir, split, split);
    }
    if (!rc && n > 1) {
        qsort(found, n, sizeof *found, cmp_str);
        size_t kept = 0;
        for (size_t i = 0; i < n; i++)
            if (cache_fits(found[i], seq_len, ds)) kept++;
        if (kept > 0 && kept < n) { /* the caches that fit the data and seq_len (all when none does) */
            size_t w = 0;
            for (size_t i = 0; i < n; i++) {
                if (cache_fits(found[i], seq_len, ds)) found[w++] = found[i];
                else free(found[i]);
            }
            n = w;
        }
        if (n > 1) {
            char list[2048] = "";
            for (size_t i = 0; i < n && strlen(list) + 1 < sizeof list; i++) {
                char sum[512];
                summary(found[i], sum, sizeof sum);
                snprintf(list + strlen(list), sizeof list - strlen(list), "\n  %sdescription.txt: %s", found[i], sum);
            }
            rc = tf__seterr(-EINVAL, "%s holds %zu GPTDataset caches of split '%s' for this data and seq_len; pass the path of one (its description.txt or any of its files):%s",
                            dir, n, split, list);
        }
    }
    if (!rc) {
        *base = found[0];
        found[0] = NULL;
    }
    for (size_t i = 0; i < n; i++) free(found[i]);
    free(found);
    return rc;
}

/* The common start DIR/HASH-GPTDataset-SPLIT- of the cache path names: a
 * directory (the split's cache in it), or one of a cache's files (or their
 * common start). */
static int resolve_cache(const char *path, const char *split, uint64_t seq_len, const tf_dataset *ds, char **base) {
    struct stat st;
    *base = NULL;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) return find_in_directory(path, split, seq_len, ds, base);
    static const char *const suffixes[] = {"description.txt", "document_index.npy", "sample_index.npy",
                                           "shuffle_index.npy", ""};
    size_t n = strlen(path);
    for (size_t k = 0; k < sizeof suffixes / sizeof *suffixes; k++) {
        const char *suf = suffixes[k];
        if (!ends_with(path, n, suf) || (!*suf && !ends_with(path, n, "-"))) continue;
        char *b = malloc(n - strlen(suf) + 1);
        if (!b) return -ENOMEM;
        memcpy(b, path, n - strlen(suf));
        b[n - strlen(suf)] = 0;
        char *doc = join(b, "document_index.npy", "");
        int ok = doc && regular_file(doc);
        free(doc);
        if (ok) {
            *base = b;
            return 0;
        }
        free(b);
    }
    TF_FAIL(-ENOENT, "%s: not a GPTDataset index cache: expected Megatron's cache directory, or one of its files HASH-GPTDataset-SPLIT-{description.txt,document_index.npy,sample_index.npy,shuffle_index.npy}",
            path);
}

/* Map the array file base + name + ".npy" (ndim dimensions; a 2-D array has
 * two columns) and describe it in *data, *dt, *len (shape[0]). The bytes are
 * checked here (header, dtype, size); the values where they are read. */
static int map_array(const char *base, const char *name, int ndim, megatron *m, int slot, const void **data,
                     tf_dtype *dt, uint64_t *len) {
    char *p = join(base, name, ".npy");
    if (!p) return -ENOMEM;
    int rc = 0, fd = open(p, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    struct stat st;
    if (fd < 0) {
        rc = tf__seterr(-errno, "%s: cannot open the Megatron index cache's %s (%s): the cache is incomplete; point megatron_cache at a complete GPTDataset cache",
                        p, name, strerror(errno));
    } else if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        rc = tf__seterr(-EINVAL, "%s: expected a regular file (the Megatron index cache's %s)", p, name);
    } else if (st.st_size < 10) {
        rc = tf__seterr(-TF_EFORMAT, "%s: header: expected a .npy file of at least 10 bytes, found %llu. The file is truncated: regenerate the cache with Megatron",
                        p, (ull)st.st_size);
    } else {
        void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
        if (map == MAP_FAILED) {
            rc = tf__seterr(-errno, "%s: cannot map the Megatron index cache's %s (%s)", p, name, strerror(errno));
        } else {
            m->map[slot] = map;
            m->map_len[slot] = (size_t)st.st_size;
        }
    }
    if (fd >= 0) close(fd);
    tf_npy_header h;
    if (!rc) rc = tf__parse_npy_header_2d(p, m->map[slot], m->map_len[slot], &h);
    if (!rc && (h.dtype != TF_INT32 && h.dtype != TF_UINT32 && h.dtype != TF_INT64 && h.dtype != TF_UINT64))
        rc = tf__seterr(-TF_EFORMAT, "%s: descr: expected int32, uint32, int64 or uint64 indices (GPTDataset writes int32 or int64, and uint32 or int64 for the shuffle), found %s. Regenerate the cache with Megatron",
                        p, tf_dtype_name(h.dtype));
    if (!rc && (h.ndim != ndim || (ndim == 2 && h.dim1 != 2)))
        rc = tf__seterr(-TF_EFORMAT, "%s: shape: expected %s, found %d dimension(s)%s. The file is not GPTDataset's %s",
                        p, ndim == 2 ? "(rows, 2)" : "one dimension", h.ndim, ndim == 2 && h.ndim == 2 ? " with another number of columns" : "", name);
    uint64_t items, bytes, want;
    size_t isz = rc ? 0 : tf_dtype_size(h.dtype);
    if (!rc && (tf__mul_overflow(h.num_items, (uint64_t)ndim, &items) || tf__mul_overflow(items, isz, &bytes) ||
                tf__add_overflow(bytes, h.data_offset, &want) || want != m->map_len[slot]))
        rc = tf__seterr(-TF_EFORMAT, "%s: file size: expected %llu bytes of header and %llu x %d entries of %zu bytes, found %llu. The file is truncated or the header is wrong: regenerate the cache with Megatron",
                        p, (ull)h.data_offset, (ull)h.num_items, ndim, isz, (ull)m->map_len[slot]);
    if (!rc && h.data_offset % isz)
        rc = tf__seterr(-TF_EFORMAT, "%s: data offset: expected a multiple of the entry size %zu, found %llu. Re-save the array with a current numpy",
                        p, isz, (ull)h.data_offset);
    if (!rc) {
        *data = (const uint8_t *)m->map[slot] + h.data_offset;
        *dt = h.dtype;
        *len = h.num_items;
    }
    free(p);
    return rc;
}

typedef struct guarded_init {
    tf_order *o;
    mg_args *a;
} guarded_init;

static int run_init(void *arg) {
    guarded_init *g = arg;
    return mg_init(g->o, g->a);
}

int tf__megatron_init(tf_order *o, const void *vds) {
    const tf_dataset *ds = vds;
    const tf_order_config *c = &o->cfg;
    if (!c->megatron_cache || !*c->megatron_cache)
        TF_FAIL(-EINVAL, "order megatron reads Megatron-core's GPTDataset index cache: set megatron_cache to its path_to_cache (--data-cache-path) or to one of the cache's files");
    if (tf_dataset_selection(ds, NULL, NULL) == 1)
        TF_FAIL(-EINVAL, "order megatron: Megatron's order comes from its index cache over the whole dataset and cannot read a view (a filtered dataset); use tokenfeed's own order for a filter");
    if ((unsigned)c->megatron_split > 2) TF_FAIL(-EINVAL, "megatron_split: expected 0 to 2, found %d", (int)c->megatron_split);
    megatron *m = calloc(1, sizeof *m);
    if (!m) return -ENOMEM;
    tf_megatron_index ix = {.add_extra_token = c->megatron_add_extra_token};
    m->given = strdup(c->megatron_cache);
    int rc = m->given ? 0 : -ENOMEM;
    if (!rc) rc = resolve_cache(c->megatron_cache, SPLITS[c->megatron_split], c->seq_len, ds, &m->cache);
    if (!rc) rc = check_description(m->cache, c->seq_len);
    if (!rc) rc = map_array(m->cache, ARRAYS[0], 1, m, 0, &ix.document_index, &ix.document_index_dtype, &ix.document_index_len);
    if (!rc) rc = map_array(m->cache, ARRAYS[1], 2, m, 1, &ix.sample_index, &ix.sample_index_dtype, &ix.sample_index_rows);
    if (!rc) rc = map_array(m->cache, ARRAYS[2], 1, m, 2, &ix.shuffle_index, &ix.shuffle_index_dtype, &ix.shuffle_index_len);
    if (!rc) { /* the checks read the mapped arrays: a file truncated meanwhile is an error, not a crash */
        mg_args a = {ds, &ix, m};
        guarded_init g = {o, &a};
        tf__sigbus_fault fault;
        tf__sigbus_install();
        rc = tf__sigbus_run(run_init, &g, &fault);
        if (fault.hit) {
            const char *file = "an array";
            for (int i = 0; i < 3; i++)
                if ((const char *)fault.addr >= (const char *)m->map[i] &&
                    (const char *)fault.addr < (const char *)m->map[i] + m->map_len[i])
                    file = ARRAYS[i];
            rc = tf__seterr(-EIO, "%s%s.npy: the file shrank while it was read: regenerate the cache with Megatron, and keep it unchanged while a loader reads it",
                            m->cache, file);
        }
    }
    if (rc) mg_destroy(m);
    return rc;
}

int tf__megatron_index_init(tf_order *o, const void *args) {
    const tf__megatron_args *ma = args;
    mg_args a = {ma->ds, ma->ix, NULL};
    return mg_init(o, &a);
}
