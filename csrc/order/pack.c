/*
 * pack.c — the order kind of BEST_FIT and DOCUMENT packing: which document
 * chunks make up each sample, as a pure function of (dataset, seq_len,
 * separator, pack_window). The seed does not enter the plan: it shuffles the
 * packed samples like any other (the epoch shuffle of order.c).
 *
 * Documents and chunks
 * --------------------
 * A document's virtual range is its tokens, plus the separator when
 * separator_id >= 0 (v = len + 1), so an empty document is [SEP] with a
 * separator and has no range without one (it is skipped). C = L + 1 is the
 * sample size.
 *
 * BEST_FIT. Documents are grouped in windows of W = pack_window consecutive
 * documents: window w = documents [w*W, min((w+1)*W, D)). Inside a window each
 * document with v > 0 is cut into floor(v / C) full chunks of C tokens (each a
 * sample of its own) and a remainder chunk of v % C tokens when that is > 0.
 * The remainders are packed best-fit-decreasing: taken by length descending
 * (ties: lower document first), each goes into the open sample with the least
 * room that still fits it (ties: the sample opened first), or opens a new
 * sample. Samples of window w, in order: the full-chunk samples in document
 * order, then the BFD samples in opening order, each with its chunks in
 * placement order. Every token of every document lands in exactly one sample
 * per epoch; a document with v <= C lands whole in one sample.
 *
 * DOCUMENT. Each document with v > 0 is one sample: its first min(v, C)
 * virtual tokens (the rest are dropped). N = non-empty documents. It uses the
 * same windows (W = 1024 fixed, not part of its config) to locate samples.
 *
 * The rest of every sample is pad_id.
 *
 * Seeking
 * -------
 * create builds counts[w] (samples of window w) for every window — on threads,
 * each window independently — and their prefix sums; N = prefix[nwin]. Sample
 * s is in window w = the last with prefix[w] <= s (binary search, O(log
 * windows)); its chunks come from rebuilding window w's plan, O(W log W),
 * cached per thread (the last window built by this thread, keyed by a serial
 * number unique to the plan, so a stale cache is never read). The counts are
 * built once per order: a Loader builds its order once and hands it to the
 * engine, so nothing needs to share them across orders.
 *
 * Inputs, labels and masks of a packed sample (extras_from_segments):
 * segment k is chunk k; when the chunks end at P < C, [P, C) is one more
 * segment (padding). Then, for t in [0, L):
 *   position_ids[t] = t - start of t's segment
 *   cu_seqlens      = 0, segment starts in (0, L) ascending, L, then L
 *   loss_mask[t]    = 1 iff t + 1 < P and t + 1 starts no chunk: labels never
 *                     cross a chunk boundary and never fall in the padding.
 *
 * The formulas here are part of the checkpoint contract (see order.c).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kind.h"

#define MAX_PACK_WINDOW TF__MAX_PACK_WINDOW
#define DOCUMENT_WINDOW 1024
#define COUNT_CHUNK 16 /* windows a counting thread claims at once */

/* One piece of a packed sample: ntok dataset tokens from src, then the
 * separator when sep (a chunk of a document's virtual range doc + SEP). */
typedef struct tf__chunk {
    uint64_t src;
    uint32_t ntok;
    uint32_t sep;
} tf__chunk;

/* The kind's state: the plan of every window, as counts. */
typedef struct tf__plan {
    const tf_dataset *ds;
    tf_packing mode;
    uint64_t C, W, D, nwin, N;
    uint64_t sep; /* 1 with a separator */
    uint64_t *prefix; /* nwin + 1 */
    uint64_t serial;
    tf_packing_stats st;
} tf__plan;

/* ------------------------------------------------------------------------ */
/* one window                                                                */
/* ------------------------------------------------------------------------ */

typedef struct wbuild {
    size_t cap;                 /* documents the scratch holds */
    uint64_t *start, *vlen;     /* per local document */
    uint64_t *keys, *tmp;       /* remainder items: rem << 24 | (2^24 - 1 - i) */
    uint64_t *open;             /* open bins: room << 32 | bin, ascending */
    uint32_t *item_bin;         /* bin of the k-th item in placement order */
    uint64_t *bin_first;        /* per bin, then prefix */
    size_t bins_cap;
    /* materialized plan */
    uint64_t nsamples;
    uint64_t *first; /* nsamples + 1 offsets into chunks */
    size_t first_cap;
    tf__chunk *chunks;
    size_t nchunks, chunks_cap;
    uint64_t serial, window;
    int valid;
} wbuild;

typedef struct wstats {
    uint64_t samples, docs, empty, real, split, truncated, dropped;
} wstats;

static void wbuild_release(wbuild *b) {
    free(b->start);
    free(b->vlen);
    free(b->keys);
    free(b->tmp);
    free(b->open);
    free(b->item_bin);
    free(b->bin_first);
    free(b->first);
    free(b->chunks);
    memset(b, 0, sizeof *b);
}

static int grow(void **p, size_t *cap, size_t need, size_t elsize) {
    if (need <= *cap) return 0;
    size_t nc = *cap ? *cap : 64;
    while (nc < need) nc *= 2;
    void *q = realloc(*p, nc * elsize);
    if (!q) return -ENOMEM;
    *p = q;
    *cap = nc;
    return 0;
}

static int wbuild_reserve(wbuild *b, size_t n) {
    if (n <= b->cap) return 0;
    size_t c = n;
    uint64_t *a[5];
    for (int i = 0; i < 5; i++) a[i] = NULL;
    uint32_t *ib = NULL;
    a[0] = realloc(b->start, c * 8);
    if (a[0]) b->start = a[0];
    a[1] = realloc(b->vlen, c * 8);
    if (a[1]) b->vlen = a[1];
    a[2] = realloc(b->keys, c * 8);
    if (a[2]) b->keys = a[2];
    a[3] = realloc(b->tmp, c * 8);
    if (a[3]) b->tmp = a[3];
    a[4] = realloc(b->open, c * 8);
    if (a[4]) b->open = a[4];
    ib = realloc(b->item_bin, c * 4);
    if (ib) b->item_bin = ib;
    for (int i = 0; i < 5; i++)
        if (!a[i]) return -ENOMEM;
    if (!ib) return -ENOMEM;
    b->cap = c;
    return 0;
}

/* Ascending LSD radix sort of n keys (bytes that are equal in every key are
 * skipped). Result in b->keys. */
static void radix_sort(wbuild *b, size_t n) {
    uint64_t *src = b->keys, *dst = b->tmp;
    size_t cnt[256];
    for (int byte = 0; byte < 8; byte++) {
        int sh = byte * 8;
        memset(cnt, 0, sizeof cnt);
        for (size_t i = 0; i < n; i++) cnt[(src[i] >> sh) & 255]++;
        if (n == 0 || cnt[(src[0] >> sh) & 255] == n) continue;
        size_t sum = 0;
        for (int d = 0; d < 256; d++) {
            size_t c = cnt[d];
            cnt[d] = sum;
            sum += c;
        }
        for (size_t i = 0; i < n; i++) dst[cnt[(src[i] >> sh) & 255]++] = src[i];
        uint64_t *t = src;
        src = dst;
        dst = t;
    }
    if (src != b->keys) memcpy(b->keys, src, n * 8);
}

static size_t lower_bound(const uint64_t *a, size_t n, uint64_t x) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (a[mid] < x) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Chunk of local document i covering virtual [off, off + m). */
static tf__chunk make_chunk(const tf__plan *p, const wbuild *b, size_t i, uint64_t off, uint64_t m) {
    uint64_t len = b->vlen[i] - p->sep; /* tokens */
    tf__chunk c;
    c.src = b->start[i] + (off < len ? off : len);
    c.ntok = (uint32_t)(off < len ? ((off + m < len ? off + m : len) - off) : 0);
    c.sep = (uint32_t)(p->sep && off + m == b->vlen[i]);
    return c;
}

/* Plan window w into b: counts into *ws, and with materialize the samples'
 * chunks (b->first / b->chunks). */
static int build_window(const tf__plan *p, uint64_t w, wbuild *b, int materialize, wstats *ws) {
    const uint64_t C = p->C;
    uint64_t d0 = w * p->W, d1 = d0 + p->W < p->D ? d0 + p->W : p->D;
    size_t n = (size_t)(d1 - d0);
    b->valid = 0;
    TF_TRY(wbuild_reserve(b, n));
    wstats s;
    memset(&s, 0, sizeof s);
    uint64_t nfull = 0;
    size_t nitems = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t st, len;
        TF_TRY(tf_dataset_document(p->ds, d0 + i, &st, &len));
        uint64_t v = len + p->sep;
        b->start[i] = st;
        b->vlen[i] = v;
        s.docs++;
        if (v == 0) {
            s.empty++;
            continue;
        }
        if (p->mode == TF_PACK_DOCUMENT) {
            s.samples++;
            if (v > C) {
                s.truncated++;
                s.dropped += v - C;
            }
            s.real += v < C ? v : C;
            continue;
        }
        uint64_t full = v / C, rem = v % C;
        nfull += full;
        if (full + (rem > 0) > 1) s.split++;
        if (rem) b->keys[nitems++] = rem << 24 | (uint64_t)(MAX_PACK_WINDOW - 1 - i);
        s.real += v;
    }

    uint64_t nbins = 0;
    if (p->mode == TF_PACK_BEST_FIT) {
        radix_sort(b, nitems);
        size_t nopen = 0;
        for (size_t k = 0; k < nitems; k++) {
            uint64_t key = b->keys[nitems - 1 - k];
            uint64_t sz = key >> 24;
            size_t lo = lower_bound(b->open, nopen, sz << 32);
            uint64_t bin, room;
            if (lo < nopen) {
                bin = b->open[lo] & 0xFFFFFFFFu;
                room = (b->open[lo] >> 32) - sz;
                if (room) {
                    /* smaller room: the entry moves down, into [0, lo] */
                    uint64_t e = room << 32 | bin;
                    size_t q = lower_bound(b->open, lo, e);
                    memmove(b->open + q + 1, b->open + q, (lo - q) * 8);
                    b->open[q] = e;
                } else {
                    memmove(b->open + lo, b->open + lo + 1, (nopen - lo - 1) * 8);
                    nopen--;
                }
            } else {
                bin = nbins++;
                room = C - sz;
                if (room) {
                    uint64_t e = room << 32 | bin;
                    size_t q = lower_bound(b->open, nopen, e);
                    memmove(b->open + q + 1, b->open + q, (nopen - q) * 8);
                    b->open[q] = e;
                    nopen++;
                }
            }
            b->item_bin[k] = (uint32_t)bin;
        }
        s.samples = nfull + nbins;
    }
    *ws = s;
    if (!materialize) return 0;

    /* samples: full chunks (document order), then bins (opening order) */
    uint64_t ns = s.samples, nch = p->mode == TF_PACK_DOCUMENT ? s.samples : nfull + nitems;
    TF_TRY(grow((void **)&b->first, &b->first_cap, (size_t)ns + 1, sizeof *b->first));
    TF_TRY(grow((void **)&b->chunks, &b->chunks_cap, (size_t)nch + 1, sizeof *b->chunks));
    uint64_t si = 0, ci = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t v = b->vlen[i];
        if (!v) continue;
        if (p->mode == TF_PACK_DOCUMENT) {
            b->first[si++] = ci;
            b->chunks[ci++] = make_chunk(p, b, i, 0, v < C ? v : C);
            continue;
        }
        for (uint64_t f = 0; f < v / C; f++) {
            b->first[si++] = ci;
            b->chunks[ci++] = make_chunk(p, b, i, f * C, C);
        }
    }
    if (p->mode == TF_PACK_BEST_FIT && nbins) {
        TF_TRY(grow((void **)&b->bin_first, &b->bins_cap, (size_t)nbins + 1, sizeof *b->bin_first));
        memset(b->bin_first, 0, ((size_t)nbins + 1) * sizeof *b->bin_first);
        for (size_t k = 0; k < nitems; k++) b->bin_first[b->item_bin[k] + 1]++;
        for (uint64_t j = 0; j < nbins; j++) {
            b->bin_first[j + 1] += b->bin_first[j];
            b->first[si + j] = ci + b->bin_first[j];
        }
        for (size_t k = 0; k < nitems; k++) {
            uint64_t key = b->keys[nitems - 1 - k];
            size_t i = (size_t)(MAX_PACK_WINDOW - 1 - (key & 0xFFFFFF));
            uint64_t v = b->vlen[i];
            b->chunks[ci + b->bin_first[b->item_bin[k]]++] = make_chunk(p, b, i, v / C * C, v % C);
        }
        si += nbins;
        ci += nitems;
    }
    b->first[si] = ci;
    b->nsamples = si;
    b->nchunks = (size_t)ci;
    b->serial = p->serial;
    b->window = w;
    b->valid = 1;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* per-thread window cache                                                   */
/* ------------------------------------------------------------------------ */

static pthread_key_t tls_key;
static pthread_once_t tls_once = PTHREAD_ONCE_INIT;
static int tls_ok;

static void tls_destroy(void *v) {
    wbuild_release(v);
    free(v);
}
static void tls_init(void) { tls_ok = pthread_key_create(&tls_key, tls_destroy) == 0; }

static wbuild *tls_get(void) {
    pthread_once(&tls_once, tls_init);
    if (!tls_ok) return NULL;
    wbuild *b = pthread_getspecific(tls_key);
    if (!b) {
        b = calloc(1, sizeof *b);
        if (b && pthread_setspecific(tls_key, b) != 0) {
            free(b);
            b = NULL;
        }
    }
    return b;
}

/* ------------------------------------------------------------------------ */
/* counts: parallel build                                                    */
/* ------------------------------------------------------------------------ */

typedef struct count_ctx {
    const tf__plan *p;
    uint64_t *counts;
    _Atomic uint64_t next;
    _Atomic int failed;
} count_ctx;

typedef struct count_job {
    count_ctx *ctx;
    wstats acc;
    int rc;
    char err[256];
} count_job;

static void *count_main(void *arg) {
    count_job *j = arg;
    count_ctx *c = j->ctx;
    wbuild b;
    memset(&b, 0, sizeof b);
    memset(&j->acc, 0, sizeof j->acc);
    for (;;) {
        if (atomic_load_explicit(&c->failed, memory_order_relaxed)) break;
        uint64_t w0 = atomic_fetch_add_explicit(&c->next, COUNT_CHUNK, memory_order_relaxed);
        if (w0 >= c->p->nwin) break;
        uint64_t w1 = w0 + COUNT_CHUNK < c->p->nwin ? w0 + COUNT_CHUNK : c->p->nwin;
        for (uint64_t w = w0; w < w1; w++) {
            wstats s;
            int rc = build_window(c->p, w, &b, 0, &s);
            if (rc) {
                j->rc = rc;
                snprintf(j->err, sizeof j->err, "%s", tf_last_error());
                atomic_store(&c->failed, 1);
                break;
            }
            c->counts[w] = s.samples;
            j->acc.samples += s.samples;
            j->acc.docs += s.docs;
            j->acc.empty += s.empty;
            j->acc.real += s.real;
            j->acc.split += s.split;
            j->acc.truncated += s.truncated;
            j->acc.dropped += s.dropped;
        }
        if (j->rc) break;
    }
    wbuild_release(&b);
    return NULL;
}

/* counts -> prefix (nwin + 1 entries, allocated) and the stats. */
static int count_windows(tf__plan *p, uint64_t **prefix_out, tf_packing_stats *st) {
    uint64_t *pre = malloc((size_t)(p->nwin + 1) * sizeof *pre);
    if (!pre) return -ENOMEM;
    count_ctx ctx = {.p = p, .counts = pre + 1};
    atomic_init(&ctx.next, 0);
    atomic_init(&ctx.failed, 0);
    int nt = tf__num_cpus();
    if (nt > 64) nt = 64;
    uint64_t need = (p->nwin + COUNT_CHUNK - 1) / COUNT_CHUNK;
    if ((uint64_t)nt > need) nt = (int)need;
    if (nt < 1) nt = 1;
    count_job jobs[64];
    pthread_t th[64];
    memset(jobs, 0, sizeof jobs);
    int started = 0;
    for (int i = 0; i < nt; i++) jobs[i].ctx = &ctx;
    for (int i = 1; i < nt; i++) {
        if (pthread_create(&th[i], NULL, count_main, &jobs[i]) != 0) break;
        started = i;
    }
    count_main(&jobs[0]); /* the caller works too */
    for (int i = 1; i <= started; i++) pthread_join(th[i], NULL);
    wstats a;
    memset(&a, 0, sizeof a);
    for (int i = 0; i <= started; i++) {
        if (jobs[i].rc) {
            int rc = jobs[i].rc;
            free(pre);
            return tf__seterr(rc, "%s", jobs[i].err);
        }
        a.samples += jobs[i].acc.samples;
        a.docs += jobs[i].acc.docs;
        a.empty += jobs[i].acc.empty;
        a.real += jobs[i].acc.real;
        a.split += jobs[i].acc.split;
        a.truncated += jobs[i].acc.truncated;
        a.dropped += jobs[i].acc.dropped;
    }
    pre[0] = 0;
    for (uint64_t w = 0; w < p->nwin; w++) pre[w + 1] += pre[w];
    memset(st, 0, sizeof *st);
    st->samples = pre[p->nwin];
    st->documents = a.docs;
    st->empty_documents = a.empty;
    st->token_slots = st->samples * p->C;
    st->pad_tokens = st->token_slots - a.real;
    st->documents_split = a.split;
    st->documents_truncated = a.truncated;
    st->tokens_dropped = a.dropped;
    st->padding_fraction = st->token_slots ? (double)st->pad_tokens / (double)st->token_slots : 0.0;
    *prefix_out = pre;
    return 0;
}

static void plan_free(void *v) {
    tf__plan *p = v;
    if (!p) return;
    free(p->prefix);
    free(p);
}

static int plan_create(const tf_dataset *ds, const tf_order_config *cfg, tf__plan **out) {
    *out = NULL;
    tf_dataset_info info;
    TF_TRY(tf_dataset_get_info(ds, &info));
    tf__plan *p = calloc(1, sizeof *p);
    if (!p) return -ENOMEM;
    static _Atomic uint64_t serials = 1;
    p->serial = atomic_fetch_add(&serials, 1);
    p->ds = ds;
    p->mode = cfg->packing;
    p->C = cfg->seq_len + 1;
    p->W = cfg->packing == TF_PACK_BEST_FIT ? cfg->pack_window : DOCUMENT_WINDOW;
    p->D = info.num_documents;
    p->sep = cfg->separator_id >= 0;
    p->nwin = p->D / p->W + (p->D % p->W != 0);
    int rc = 0;
    if (p->nwin) {
        rc = count_windows(p, &p->prefix, &p->st);
    } else {
        p->prefix = calloc(1, sizeof *p->prefix);
        if (!p->prefix) rc = -ENOMEM;
    }
    if (rc) {
        plan_free(p);
        return rc;
    }
    p->st.documents = info.num_documents;
    p->N = p->prefix[p->nwin];
    *out = p;
    return 0;
}

/* Chunks of sample (< N), in sample order; *chunks points into a per-thread
 * cache valid until this thread's next plan call. */
static int plan_sample(const tf__plan *p, uint64_t sample, const tf__chunk **chunks, size_t *n) {
    if (sample >= p->N)
        TF_FAIL(-ERANGE, "sample %llu out of range: an epoch has %llu samples", (unsigned long long)sample,
                (unsigned long long)p->N);
    /* last window w with prefix[w] <= sample (windows may hold no sample) */
    uint64_t lo = 0, hi = p->nwin; /* prefix[lo] <= sample < prefix[hi] */
    while (hi - lo > 1) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (p->prefix[mid] <= sample) lo = mid;
        else hi = mid;
    }
    wbuild *b = tls_get();
    if (!b) return -ENOMEM;
    if (!b->valid || b->serial != p->serial || b->window != lo) {
        wstats s;
        TF_TRY(build_window(p, lo, b, 1, &s));
        if (b->nsamples != p->prefix[lo + 1] - p->prefix[lo])
            TF_FAIL(-TF_EFORMAT, "packing window %llu now has %llu samples, %llu when the order was built: the dataset changed underneath",
                    (unsigned long long)lo, (unsigned long long)b->nsamples,
                    (unsigned long long)(p->prefix[lo + 1] - p->prefix[lo]));
    }
    uint64_t local = sample - p->prefix[lo];
    *chunks = b->chunks + b->first[local];
    *n = (size_t)(b->first[local + 1] - b->first[local]);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* extras                                                                    */
/* ------------------------------------------------------------------------ */

static void extras_from_segments(uint64_t L, const tf__chunk *c, size_t n, const tf_sample_extras *ex) {
    uint64_t P = 0;
    for (size_t k = 0; k < n; k++) P += (uint64_t)c[k].ntok + c[k].sep;
    if (ex->loss_mask) {
        for (uint64_t t = 0; t < L; t++) ex->loss_mask[t] = t + 1 < P;
        uint64_t b = 0;
        for (size_t k = 0; k + 1 < n; k++) {
            b += (uint64_t)c[k].ntok + c[k].sep;
            if (b >= 1 && b <= L) ex->loss_mask[b - 1] = 0;
        }
    }
    uint64_t last = 0, nc = 1, b = 0;
    if (ex->cu_seqlens) ex->cu_seqlens[0] = 0;
    /* segment starts: chunk k >= 1, then the padding at P */
    for (size_t k = 0; k < n; k++) {
        b += (uint64_t)c[k].ntok + c[k].sep;
        int is_start = k + 1 < n || b < L + 1;
        if (!is_start || b >= L) break;
        tf__extras_segment(ex, b, &last, &nc);
    }
    tf__extras_finish(ex, L, last, nc);
}

/* ------------------------------------------------------------------------ */
/* the kind                                                                  */
/* ------------------------------------------------------------------------ */

/* Spans of a packed sample: each chunk's tokens and separator, then padding. */
static int packed_spans(const tf_order *o, uint64_t sample, tf__span *spans, size_t cap, size_t *n) {
    const tf__chunk *ch;
    size_t nch, m = 0;
    TF_TRY(plan_sample(o->impl, sample, &ch, &nch));
    uint64_t dst = 0;
    for (size_t k = 0; k < nch; k++) {
        if (ch[k].ntok) spans[m++] = (tf__span){ch[k].src, ch[k].ntok, dst};
        dst += ch[k].ntok;
        if (ch[k].sep) spans[m++] = (tf__span){TF_SPAN_SEPARATOR, 1, dst++};
    }
    if (dst < o->cfg.seq_len + 1) spans[m++] = (tf__span){TF_SPAN_PAD, o->cfg.seq_len + 1 - dst, dst};
    *n = m;
    return 0;
}

static int packed_extras(const tf_order *o, uint64_t sample, const tf_sample_extras *ex) {
    const tf__chunk *ch;
    size_t nch;
    TF_TRY(plan_sample(o->impl, sample, &ch, &nch));
    extras_from_segments(o->cfg.seq_len, ch, nch, ex);
    return 0;
}

/* Free: gathered when the plan counts were built. */
static int packed_stats(const tf_order *o, tf_packing_stats *st) {
    *st = ((const tf__plan *)o->impl)->st;
    return 0;
}

/* A document's chunks are all in the samples of its window. */
static int packed_doc_samples(const tf_order *o, uint64_t doc, uint64_t *first, uint64_t *end) {
    const tf__plan *p = o->impl;
    uint64_t w = doc / p->W;
    *first = w < p->nwin ? p->prefix[w] : p->N;
    *end = w < p->nwin ? p->prefix[w + 1] : p->N;
    return 0;
}

/* sample_at: NULL, the epoch shuffle */
static const tf__order_ops packed_ops = {.name = "packed", .spans = packed_spans, .extras = packed_extras,
                                         .stats = packed_stats, .destroy = plan_free,
                                         .doc_samples = packed_doc_samples};

int tf__packed_init(tf_order *o, const void *args) {
    const tf_dataset *ds = args;
    tf__plan *p;
    TF_TRY(plan_create(ds, &o->cfg, &p));
    if (p->N == 0) {
        int rc = tf__seterr(-EINVAL, "the dataset has no sample: its %llu documents are all empty (packing %s)",
                            (unsigned long long)p->D, p->mode == TF_PACK_BEST_FIT ? "best_fit" : "document");
        plan_free(p);
        return rc;
    }
    uint64_t max_chunks = p->mode == TF_PACK_DOCUMENT ? 1 : p->C < p->W ? p->C : p->W; /* every chunk holds >= 1 token */
    o->ops = &packed_ops;
    o->impl = p;
    o->ds = ds;
    o->N = p->N;
    o->max_spans = (size_t)(2 * max_chunks + 1); /* tokens + SEP per chunk, one PAD */
    return 0;
}
