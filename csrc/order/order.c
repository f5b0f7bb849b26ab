/*
 * order.c — tf_order: which tokens make up the sample at each stream position.
 * Every query is a pure function of (dataset, config, argument): no per-sample
 * index is built or stored, memory is O(1) in the number of samples, and any
 * position can be computed without its predecessors (O(1) seek and resume).
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
 * Shuffle
 * -------
 * Position pos (0 .. inf, epoch-major): e = pos / N, i = pos % N. Epoch key
 * ek = mix64(seed ^ mix64(e + G)).
 *   NONE   sample = i.
 *   FULL   sample = perm_N[ek](i).
 *   BLOCK  Bk = block_size, W = window_blocks, nbf = floor(N / Bk) full blocks,
 *          tail = N - nbf*Bk. Full blocks are permuted per epoch by
 *          perm_nbf[mix64(ek ^ C_B)]. Windows group W consecutive permuted
 *          blocks: window w covers epoch positions [w*W*Bk, ...); the last
 *          window takes the remaining full blocks plus the tail samples (with
 *          nbf == 0, one window holding only the tail). Inside window w (size
 *          S_w, b_w full blocks) j = i - w*W*Bk is permuted by
 *          perm_{S_w}[mix64(ek ^ mix64(w + C_W))] to j'; then
 *            j' <  b_w*Bk: sample = blk*Bk + j' % Bk, blk = perm_nbf(w*W + j'/Bk)
 *            j' >= b_w*Bk: sample = nbf*Bk + (j' - b_w*Bk)   (tail)
 *          Every sample appears exactly once per epoch, reads stay inside W
 *          blocks for W*Bk consecutive positions, and each position costs two
 *          permutation evaluations.
 *
 * Positions: the stream is infinite when epochs == 0 (num_positions =
 * UINT64_MAX); otherwise floor(epochs*N / G) * G, dropping the final partial
 * global batch so that every rank sees the same number of batches.
 *
 * The key derivations and formulas here are part of the checkpoint contract;
 * changing them must change ORDER_FP_VERSION.
 */
#include <stdlib.h>
#include <string.h>

#include "order_internal.h"

#define ORDER_FP_VERSION 1
#define KEY_EPOCH 0x9E3779B97F4A7C15ULL
#define KEY_BLOCKS 0xB10CB10C5EED0001ULL
#define KEY_WINDOW 0x57A1D0E5C0FFEE01ULL
/* Largest seq_len: extras are int32 and cu_seqlens holds L itself. */
#define MAX_SEQ_LEN ((uint64_t)INT32_MAX - 1)


void tf_order_config_init(tf_order_config *cfg) {
    if (!cfg) return;
    memset(cfg, 0, sizeof *cfg);
    cfg->seq_len = 2048;
    cfg->packing = TF_PACK_CONCAT;
    cfg->separator_id = -1;
    cfg->seed = 0;
    cfg->shuffle = TF_SHUFFLE_FULL;
    cfg->block_size = 1024;
    cfg->window_blocks = 16;
    cfg->global_batch = 1;
    cfg->epochs = 0;
    cfg->pad_id = 0;
    cfg->pack_window = 1024;
    cfg->mix_window = 1000;
}

/* ------------------------------------------------------------------------ */
/* fingerprint                                                               */
/* ------------------------------------------------------------------------ */

/* XXH64 over a fixed little-endian encoding, so it is the same on every host
 * and independent of struct layout. BLOCK-only fields enter only in BLOCK mode
 * (changing block_size under FULL does not change the stream). */
static uint64_t config_fingerprint(const tf_order_config *c) {
    uint8_t buf[16 * 8], *p = buf;
#define PUT(v) (tf__put_le64(p, (uint64_t)(v)), p += 8)
    PUT(0x3144524f4654ULL); /* "TFORD1" tag */
    PUT(ORDER_FP_VERSION);
    PUT(c->seq_len);
    PUT(c->packing);
    PUT(c->separator_id);
    PUT(c->seed);
    PUT(c->shuffle);
    if (c->shuffle == TF_SHUFFLE_BLOCK) {
        PUT(c->block_size);
        PUT(c->window_blocks);
    }
    PUT(c->global_batch);
    PUT(c->epochs);
    /* packed modes only, so CONCAT fingerprints (and checkpoints) are unchanged */
    if (c->packing != TF_PACK_CONCAT) PUT(c->pad_id);
    if (c->packing == TF_PACK_BEST_FIT) PUT(c->pack_window);
#undef PUT
    return tf_hash64(buf, (size_t)(p - buf), 0);
}

/* ------------------------------------------------------------------------ */
/* create                                                                    */
/* ------------------------------------------------------------------------ */

static int check_config(const tf_order_config *c) {
    if (c->seq_len < 1 || c->seq_len > MAX_SEQ_LEN)
        TF_FAIL(-EINVAL, "seq_len: expected 1 <= seq_len <= %llu, found %llu",
                (unsigned long long)MAX_SEQ_LEN, (unsigned long long)c->seq_len);
    if (c->packing != TF_PACK_CONCAT && c->packing != TF_PACK_BEST_FIT && c->packing != TF_PACK_DOCUMENT)
        TF_FAIL(-EINVAL, "packing: expected CONCAT (0), BEST_FIT (1) or DOCUMENT (2), found %d", (int)c->packing);
    if (c->packing != TF_PACK_CONCAT && c->pad_id < 0)
        TF_FAIL(-EINVAL, "pad_id: expected a token id >= 0 for packing BEST_FIT / DOCUMENT, found %lld",
                (long long)c->pad_id);
    if (c->separator_id < -1)
        TF_FAIL(-EINVAL, "separator_id: expected -1 (none) or a token id >= 0, found %lld",
                (long long)c->separator_id);
    if (c->shuffle != TF_SHUFFLE_NONE && c->shuffle != TF_SHUFFLE_FULL && c->shuffle != TF_SHUFFLE_BLOCK)
        TF_FAIL(-EINVAL, "shuffle: expected NONE (0), FULL (1) or BLOCK (2), found %d", (int)c->shuffle);
    if (c->shuffle == TF_SHUFFLE_BLOCK && (c->block_size < 1 || c->window_blocks < 1))
        TF_FAIL(-EINVAL, "block shuffle: block_size and window_blocks must be >= 1, found %llu and %llu",
                (unsigned long long)c->block_size, (unsigned long long)c->window_blocks);
    if (c->global_batch < 1) TF_FAIL(-EINVAL, "global_batch: expected >= 1, found 0");
    return 0;
}

/* With separators, locating positions relies on documents tiling the tokens;
 * check the two ends (O(1)). A dataset that passes verify() satisfies it. */
static int check_tiling(const tf_order *o) {
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

int tf_order_create(const tf_dataset *ds, const tf_order_config *cfg, tf_order **out) {
    if (!out) return -EINVAL;
    *out = NULL;
    if (!ds || !cfg) TF_FAIL(-EINVAL, "tf_order_create: dataset and config are required");
    tf__clearerr();
    TF_TRY(check_config(cfg));
    tf_dataset_info info;
    TF_TRY(tf_dataset_get_info(ds, &info));

    tf_order o;
    memset(&o, 0, sizeof o);
    o.ds = ds;
    o.cfg = *cfg;
    o.T = info.num_tokens;
    o.D = info.num_documents;
    o.sep = cfg->separator_id >= 0;
    if (cfg->packing != TF_PACK_CONCAT) {
        if (info.vocab_size && (uint64_t)cfg->pad_id >= info.vocab_size)
            TF_FAIL(-EINVAL, "pad_id %lld is outside the dataset's vocabulary (vocab_size %llu): use an id < vocab_size (padding is masked out of the loss)",
                    (long long)cfg->pad_id, (unsigned long long)info.vocab_size);
        if (o.sep && info.vocab_size && (uint64_t)cfg->separator_id >= info.vocab_size)
            TF_FAIL(-EINVAL, "separator_id %lld is outside the dataset's vocabulary (vocab_size %llu): use an id < vocab_size, such as the tokenizer's EOS",
                    (long long)cfg->separator_id, (unsigned long long)info.vocab_size);
        TF_TRY(tf__plan_create(ds, cfg, &o.plan, &o.N));
        o.Tv = o.T;
    } else if (o.sep) {
        if (info.vocab_size && (uint64_t)cfg->separator_id >= info.vocab_size)
            TF_FAIL(-EINVAL, "separator_id %lld is outside the dataset's vocabulary (vocab_size %llu): use an id < vocab_size, such as the tokenizer's EOS",
                    (long long)cfg->separator_id, (unsigned long long)info.vocab_size);
        if (tf__add_overflow(o.T, o.D, &o.Tv)) TF_FAIL(-EOVERFLOW, "tokens + documents overflow 64 bits");
        TF_TRY(check_tiling(&o));
    } else {
        o.Tv = o.T;
    }
    uint64_t L = cfg->seq_len;
    if (!o.plan) o.N = o.Tv ? (o.Tv - 1) / L : 0;
    int rc = tf__order_finish(&o, out);
    if (rc) tf__plan_free(o.plan);
    return rc;
}

/* Positions, shuffle geometry and fingerprint of a filled-in order (N, cfg
 * set); allocates *out as a copy of o. Shared with mixtures (mix.c). */
int tf__order_finish(tf_order *po, tf_order **out) {
    tf_order o = *po;
    const tf_order_config *cfg = &o.cfg;
    uint64_t L = cfg->seq_len;
    if (o.N == 0) {
        if (o.plan)
            TF_FAIL(-EINVAL, "the dataset has no sample: its %llu documents are all empty (packing %s)",
                    (unsigned long long)o.D, cfg->packing == TF_PACK_BEST_FIT ? "best_fit" : "document");
        TF_FAIL(-EINVAL, "the dataset is shorter than one sample: it has %llu tokens%s, one sample of seq_len %llu needs %llu (seq_len + 1). Use a smaller seq_len or more data.",
                (unsigned long long)o.Tv, o.sep ? " (separators included)" : "", (unsigned long long)L,
                (unsigned long long)L + 1);
    }

    if (cfg->epochs == 0) {
        o.num_positions = UINT64_MAX;
    } else {
        uint64_t total;
        if (tf__mul_overflow(cfg->epochs, o.N, &total))
            TF_FAIL(-EOVERFLOW, "epochs %llu x %llu samples per epoch overflows 64 bits: use epochs = 0 for an endless stream",
                    (unsigned long long)cfg->epochs, (unsigned long long)o.N);
        o.num_positions = total / cfg->global_batch * cfg->global_batch;
        if (o.num_positions == 0)
            TF_FAIL(-EINVAL, "%llu epoch(s) of %llu samples do not fill one global batch of %llu: lower the batch size or raise epochs",
                    (unsigned long long)cfg->epochs, (unsigned long long)o.N,
                    (unsigned long long)cfg->global_batch);
    }

    if (cfg->shuffle == TF_SHUFFLE_BLOCK) {
        uint64_t Bk = cfg->block_size, W = cfg->window_blocks;
        o.nbf = o.N / Bk;
        if (tf__mul_overflow(W, Bk, &o.wsz)) o.wsz = UINT64_MAX;
        /* ceil(nbf / W) windows; one (tail only) when there is no full block */
        o.nwin = o.nbf ? o.nbf / W + (o.nbf % W != 0) : 1;
    }
    o.fingerprint = config_fingerprint(cfg);
    if (o.mix) o.fingerprint = tf_mix64(o.fingerprint ^ o.mix_fp);

    tf_order *h = malloc(sizeof *h);
    if (!h) return -ENOMEM;
    *h = o;
    *out = h;
    return 0;
}

void tf_order_free(tf_order *o) {
    if (!o) return;
    tf__plan_free(o->plan);
    tf__mix_free(o->mix);
    free(o);
}

uint64_t tf_order_num_samples(const tf_order *o) { return o ? o->N : 0; }
uint64_t tf_order_num_positions(const tf_order *o) { return o ? o->num_positions : 0; }
uint64_t tf_order_fingerprint(const tf_order *o) { return o ? o->fingerprint : 0; }
int64_t tf__order_separator(const tf_order *o) { return o->cfg.separator_id; }
int64_t tf__order_pad(const tf_order *o) { return o->cfg.pad_id; }
const tf_dataset *tf_order_dataset(const tf_order *o) { return o ? o->ds : NULL; }
uint64_t tf__order_seq_len(const tf_order *o) { return o->cfg.seq_len; }

/* ------------------------------------------------------------------------ */
/* shuffle                                                                   */
/* ------------------------------------------------------------------------ */

static inline uint64_t epoch_key(uint64_t seed, uint64_t e) {
    return tf_mix64(seed ^ tf_mix64(e + KEY_EPOCH));
}

static uint64_t block_sample(const tf_order *o, uint64_t ek, uint64_t i) {
    const uint64_t Bk = o->cfg.block_size, W = o->cfg.window_blocks;
    uint64_t w = o->wsz == UINT64_MAX ? 0 : i / o->wsz;
    if (w >= o->nwin) w = o->nwin - 1; /* the last window also holds the tail */
    uint64_t wstart = w * o->wsz; /* no overflow: w > 0 only when wsz did not saturate */
    uint64_t size = w + 1 < o->nwin ? o->wsz : o->N - wstart;
    uint64_t blocks = w + 1 < o->nwin ? W : o->nbf - w * W; /* 0 when nbf == 0 */
    tf_perm pw;
    tf_perm_init(&pw, size, tf_mix64(ek ^ tf_mix64(w + KEY_WINDOW)));
    uint64_t j = tf_perm_apply(&pw, i - wstart);
    if (j >= blocks * Bk) return o->nbf * Bk + (j - blocks * Bk);
    tf_perm pb;
    tf_perm_init(&pb, o->nbf, tf_mix64(ek ^ KEY_BLOCKS));
    uint64_t blk = tf_perm_apply(&pb, w * W + j / Bk);
    return blk * Bk + j % Bk;
}

uint64_t tf_order_sample_at(const tf_order *o, uint64_t pos) {
    if (!o) return 0;
    if (o->mix) return tf__mix_sample_at(o, pos);
    uint64_t e = pos / o->N, i = pos % o->N;
    switch (o->cfg.shuffle) {
    case TF_SHUFFLE_NONE: return i;
    case TF_SHUFFLE_FULL: {
        /* The permutation is a pure function of (N, key): each thread keeps
         * the last one it built, so consecutive positions of an epoch do not
         * re-derive the 10 round keys (~140 instructions per call). */
        static _Thread_local tf_perm tl_perm;
        static _Thread_local uint64_t tl_key;
        static _Thread_local int tl_valid;
        uint64_t key = epoch_key(o->cfg.seed, e);
        if (!tl_valid || tl_key != key || tl_perm.n != o->N) {
            tf_perm_init(&tl_perm, o->N, key);
            tl_key = key;
            tl_valid = 1;
        }
        return tf_perm_apply(&tl_perm, i);
    }
    case TF_SHUFFLE_BLOCK: return block_sample(o, epoch_key(o->cfg.seed, e), i);
    }
    return i;
}

/* ------------------------------------------------------------------------ */
/* separator stream: locating virtual positions                              */
/* ------------------------------------------------------------------------ */

/* Last document k with vs(k) = start(k) + k <= p (p < Tv). */
static int sep_locate(const tf_order *o, uint64_t p, uint64_t *k_out, uint64_t *vs_out) {
    uint64_t lo = 0, hi = o->D; /* invariant: vs(lo) <= p < vs(hi), vs(D) = Tv */
    while (hi - lo > 1) {
        uint64_t mid = lo + (hi - lo) / 2, s, n;
        TF_TRY(tf_dataset_document(o->ds, mid, &s, &n));
        if (s + mid <= p) lo = mid; else hi = mid;
    }
    uint64_t s, n;
    TF_TRY(tf_dataset_document(o->ds, lo, &s, &n));
    *k_out = lo;
    *vs_out = s + lo;
    return 0;
}

/* Resumable walk over a sample's spans, so that fill_sample can use a small
 * stack buffer while the engine asks for all spans at once. */
typedef struct span_cursor {
    uint64_t k;   /* current document (separator mode) */
    uint64_t off; /* offset inside document k's virtual range */
    uint64_t dst; /* next sample offset to produce */
} span_cursor;

static int spans_begin(const tf_order *o, uint64_t sample, span_cursor *c) {
    memset(c, 0, sizeof *c);
    if (sample >= o->N)
        TF_FAIL(-ERANGE, "sample %llu out of range: an epoch has %llu samples", (unsigned long long)sample,
                (unsigned long long)o->N);
    c->off = sample * o->cfg.seq_len; /* no-separator mode: the token position */
    if (o->sep) {
        uint64_t vs;
        TF_TRY(sep_locate(o, c->off, &c->k, &vs));
        c->off -= vs;
    }
    return 0;
}

/* Append up to cap spans; *n = count. Consecutive separators (empty documents)
 * merge into one span. Done when c->dst == L + 1. */
static int spans_next(const tf_order *o, span_cursor *c, tf__span *spans, size_t cap, size_t *n) {
    const uint64_t need = o->cfg.seq_len + 1;
    size_t m = 0;
    if (!o->sep) {
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
        TF_TRY(tf_dataset_document(o->ds, c->k, &s, &len));
        if (c->off < len) {
            if (m == cap) break;
            uint64_t take = len - c->off;
            if (take > need - c->dst) take = need - c->dst;
            spans[m++] = (tf__span){s + c->off, take, c->dst};
            c->off += take;
            c->dst += take;
            if (c->dst == need) break;
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

/* Spans of a packed sample: each chunk's tokens and separator, then padding. */
static int plan_spans(const tf_order *o, uint64_t sample, tf__span *spans, size_t *n) {
    const tf__chunk *ch;
    size_t nch, m = 0;
    TF_TRY(tf__plan_sample(o->plan, sample, &ch, &nch));
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

size_t tf__order_max_spans(const tf_order *o) {
    if (o->mix) return tf__mix_max_spans(o);
    if (o->plan) return (size_t)(2 * tf__plan_max_chunks(o->plan) + 1); /* tokens + SEP per chunk, one PAD */
    if (!o->sep) return 1;
    /* each document touched gives at most a token span and a separator span,
     * and every span holds at least one of the L + 1 tokens */
    uint64_t a = o->cfg.seq_len + 1, b = o->D <= UINT64_MAX / 2 ? 2 * o->D : UINT64_MAX;
    return (size_t)(a < b ? a : b);
}

int tf__order_sample_spans(const tf_order *o, uint64_t sample, tf__span *spans, size_t cap, size_t *n) {
    if (!o || !spans || !n) return -EINVAL;
    if (cap < tf__order_max_spans(o))
        TF_FAIL(-EINVAL, "span buffer holds %zu spans, this order needs %zu", cap, tf__order_max_spans(o));
    if (o->mix) return tf__mix_sample_spans(o, sample, spans, cap, n);
    if (o->plan) return plan_spans(o, sample, spans, n);
    span_cursor c;
    TF_TRY(spans_begin(o, sample, &c));
    TF_TRY(spans_next(o, &c, spans, cap, n));
    if (c.dst != o->cfg.seq_len + 1) TF_FAIL(-EFAULT, "internal: spans of sample %llu incomplete", (unsigned long long)sample);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* boundaries and extras                                                     */
/* ------------------------------------------------------------------------ */

/* Iterator over the boundaries of one sample, ascending, in (0, L]. */
typedef struct bnd_iter {
    const tf_order *o;
    uint64_t p0;   /* absolute position of offset 0 (virtual with separators) */
    uint64_t next; /* absolute position of the next candidate boundary */
    uint64_t k;    /* separator mode: document whose end is `next` */
    int done;
} bnd_iter;

static int bnd_begin(bnd_iter *it, const tf_order *o, uint64_t sample) {
    memset(it, 0, sizeof *it);
    it->o = o;
    if (sample >= o->N)
        TF_FAIL(-ERANGE, "sample %llu out of range: an epoch has %llu samples", (unsigned long long)sample,
                (unsigned long long)o->N);
    it->p0 = sample * o->cfg.seq_len;
    if (o->sep) {
        uint64_t vs, s, n;
        TF_TRY(sep_locate(o, it->p0, &it->k, &vs));
        TF_TRY(tf_dataset_document(o->ds, it->k, &s, &n));
        it->next = vs + n + 1; /* = vs(k + 1) */
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
    const tf_order *o = it->o;
    const uint64_t L = o->cfg.seq_len;
    if (it->done || it->next > it->p0 + L || it->next <= it->p0) return 0;
    *b = it->next - it->p0;
    uint64_t s, n;
    if (o->sep) {
        if (++it->k >= o->D) {
            it->done = 1;
        } else {
            TF_TRY(tf_dataset_document(o->ds, it->k, &s, &n));
            it->next += n + 1;
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

int tf__order_fill_extras(const tf_order *o, uint64_t sample, const tf_sample_extras *ex) {
    if (!o) return -EINVAL;
    if (!ex || (!ex->position_ids && !ex->cu_seqlens && !ex->num_seqs && !ex->loss_mask)) return 0;
    const uint64_t L = o->cfg.seq_len;
    if (o->mix) return tf__mix_fill_extras(o, sample, ex);
    if (o->plan) {
        const tf__chunk *ch;
        size_t nch;
        TF_TRY(tf__plan_sample(o->plan, sample, &ch, &nch));
        tf__extras_from_segments(L, ch, nch, ex);
        return 0;
    }
    bnd_iter it;
    TF_TRY(bnd_begin(&it, o, sample));
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

/* ------------------------------------------------------------------------ */
/* fill_sample                                                               */
/* ------------------------------------------------------------------------ */

/* Whether v is representable in integer dtype dt (floats: always). */
static int fits_dtype(int64_t v, tf_dtype dt) {
    switch (dt) {
    case TF_UINT8: return v <= UINT8_MAX;
    case TF_UINT16: return v <= UINT16_MAX;
    case TF_UINT32: return v <= (int64_t)UINT32_MAX;
    case TF_INT8: return v <= INT8_MAX;
    case TF_INT16: return v <= INT16_MAX;
    case TF_INT32: return v <= INT32_MAX;
    default: return 1;
    }
}

/* fill_sample for packed modes and mixtures: all spans at once. */
static int fill_packed(const tf_order *o, uint64_t sample, void *out, tf_dtype out_dtype,
                       const tf_sample_extras *extras) {
    size_t osz = tf_dtype_size(out_dtype), cap = tf__order_max_spans(o), n = 0;
    int64_t vals[2] = {o->cfg.separator_id, o->cfg.pad_id};
    uint8_t conv[2][8];
    for (int k = 0; k < 2; k++) {
        if (vals[k] < 0 || (k == 1 && o->cfg.packing == TF_PACK_CONCAT)) continue;
        if (!fits_dtype(vals[k], out_dtype))
            TF_FAIL(-EINVAL, "%s %lld does not fit the output dtype %s: use a wider out_dtype",
                    k ? "pad_id" : "separator_id", (long long)vals[k], tf_dtype_name(out_dtype));
        tf_convert(conv[k], out_dtype, &vals[k], TF_INT64, 1);
    }
    tf__span *spans = malloc(cap * sizeof *spans);
    if (!spans) return -ENOMEM;
    int rc = tf__order_sample_spans(o, sample, spans, cap, &n);
    for (size_t i = 0; !rc && i < n; i++) {
        uint8_t *d = (uint8_t *)out + spans[i].dst * osz;
        if (spans[i].src >= TF_SPAN_PAD) {
            const uint8_t *v = conv[spans[i].src == TF_SPAN_PAD];
            for (uint64_t t = 0; t < spans[i].len; t++) memcpy(d + t * osz, v, osz);
        } else {
            rc = tf_dataset_read(o->ds, spans[i].src, spans[i].len, d, out_dtype);
        }
    }
    free(spans);
    if (rc) return rc;
    /* extras after the tokens: the per-thread window cache is still warm */
    return tf__order_fill_extras(o, sample, extras);
}

int tf_order_fill_sample(const tf_order *o, uint64_t sample, void *out, tf_dtype out_dtype,
                         const tf_sample_extras *extras) {
    if (!o || !out) return -EINVAL;
    size_t osz = tf_dtype_size(out_dtype);
    if (!osz) TF_FAIL(-EINVAL, "invalid output dtype %d", (int)out_dtype);
    uint8_t sepval[8] = {0};
    if (o->sep) {
        if (!fits_dtype(o->cfg.separator_id, out_dtype))
            TF_FAIL(-EINVAL, "separator_id %lld does not fit the output dtype %s: use a wider out_dtype",
                    (long long)o->cfg.separator_id, tf_dtype_name(out_dtype));
        int64_t s = o->cfg.separator_id;
        tf_convert(sepval, out_dtype, &s, TF_INT64, 1);
    }
    if (o->plan || o->mix) return fill_packed(o, sample, out, out_dtype, extras);
    span_cursor c;
    TF_TRY(spans_begin(o, sample, &c));
    uint8_t *dst = out;
    tf__span spans[64];
    while (c.dst < o->cfg.seq_len + 1) {
        size_t n = 0;
        TF_TRY(spans_next(o, &c, spans, sizeof spans / sizeof spans[0], &n));
        for (size_t i = 0; i < n; i++) {
            const tf__span *sp = &spans[i];
            uint8_t *d = dst + sp->dst * osz;
            if (sp->src == TF_SPAN_SEPARATOR) {
                for (uint64_t t = 0; t < sp->len; t++) memcpy(d + t * osz, sepval, osz);
            } else {
                TF_TRY(tf_dataset_read(o->ds, sp->src, sp->len, d, out_dtype));
            }
        }
    }
    return tf__order_fill_extras(o, sample, extras);
}
