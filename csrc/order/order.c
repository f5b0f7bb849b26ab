/*
 * order.c — tf_order: which tokens make up the sample at each stream position.
 * Every query is a pure function of (dataset, config, argument): no per-sample
 * index is built or stored, memory is O(1) in the number of samples, and any
 * position can be computed without its predecessors (O(1) seek and resume).
 *
 * This file owns what every kind of order shares (kind.h): the configuration
 * (defaults, checks, fingerprint), positions, the epoch shuffle, and the fill
 * of a sample from its spans. How samples are made of tokens is the kind's:
 * concat.c (CONCAT), pack.c (BEST_FIT, DOCUMENT), mix.c (mixtures).
 *
 * Shuffle
 * -------
 * Position pos (0 .. inf, epoch-major): e = pos / N, i = pos % N. Epoch key
 * ek = mix64(seed ^ mix64(e + C_E)).
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

#include "kind.h"
#include "../common/settings.h"
#include "../sources/source.h"

#define ORDER_FP_VERSION 1
#define KEY_EPOCH 0x9E3779B97F4A7C15ULL /* C_E */
#define KEY_BLOCKS 0xB10CB10C5EED0001ULL /* C_B */
#define KEY_WINDOW 0x57A1D0E5C0FFEE01ULL /* C_W */

void tf_order_config_init(tf_order_config *cfg) {
    if (!cfg) return;
    memset(cfg, 0, sizeof *cfg);
    tf__settings_init(TF_SCOPE_ORDER, cfg); /* common/settings.c */
}

/* ------------------------------------------------------------------------ */
/* fingerprint                                                               */
/* ------------------------------------------------------------------------ */

/* XXH64 over a fixed little-endian encoding, so it is the same on every host
 * and independent of struct layout. BLOCK-only fields enter only in BLOCK mode
 * (changing block_size under FULL does not change the stream). */
uint64_t tf__order_config_fingerprint(const tf_order_config *c) {
    uint8_t buf[16 * 8], *p = buf;
    tf__put_le64(p, 0x3144524f4654ULL); /* "TFORD1" tag */
    tf__put_le64(p + 8, ORDER_FP_VERSION);
    p += 16;
    /* the order rows in table order, each when it changes the stream; a
     * mixture's window enters through the schedule's own hash (mix.c) */
    tf__cond_ctx x = {c, 0, 0};
    for (size_t i = 0; i < tf__nsettings; i++) {
        const tf__setting_row *r = &tf__settings[i];
        if (r->pub.scope != TF_SCOPE_ORDER || !strcmp(r->pub.stream, "mixture") || !tf__setting_in_fingerprint(r, &x))
            continue;
        tf__put_le64(p, (uint64_t)tf__setting_get(r, c));
        p += 8;
    }
    return tf_hash64(buf, (size_t)(p - buf), 0);
}

/* ------------------------------------------------------------------------ */
/* create                                                                    */
/* ------------------------------------------------------------------------ */

/* The one check of a configuration, whatever the kind and whoever calls
 * (C embedders, the Python binding, a mixture for its sources). */
static int check_config(const tf_order_config *c) {
    TF_TRY(tf__settings_check(TF_SCOPE_ORDER, c)); /* every row's bounds, in every mode */
    const tf__order_kind *k = tf__order_kind_of((int)c->order);
    if (!k) TF_FAIL(-EINVAL, "order: no order kind has the value %d", (int)c->order);
    if ((c->packing != TF_PACK_CONCAT || k->pads_last) && c->pad_id < 0)
        TF_FAIL(-EINVAL, "pad_id: expected a token id >= 0 for packing BEST_FIT / DOCUMENT and order OLMO, found %lld",
                (long long)c->pad_id);
    return 0;
}

/* tf__order_build after check_config. */
static int build(tf__order_init init, const void *args, const tf_order_config *cfg, tf_order **out) {
    *out = NULL;
    tf_order *o = calloc(1, sizeof *o);
    if (!o) return -ENOMEM;
    o->cfg = *cfg;
    int rc = init(o, args);
    if (rc) {
        free(o);
        return rc;
    }
    if (o->N == 0 || o->max_spans == 0) { /* a kind reports an empty order itself */
        rc = tf__seterr(-EFAULT, "internal: order kind %s built %llu samples", o->ops->name, (unsigned long long)o->N);
        goto fail;
    }
    if (!o->epoch_len) o->epoch_len = o->N;
    if (cfg->epochs == 0) {
        o->num_positions = UINT64_MAX;
    } else {
        uint64_t total;
        if (tf__mul_overflow(cfg->epochs, o->epoch_len, &total)) {
            rc = tf__seterr(-EOVERFLOW, "epochs %llu x %llu samples per epoch overflows 64 bits: use epochs = 0 for an endless stream",
                            (unsigned long long)cfg->epochs, (unsigned long long)o->N);
            goto fail;
        }
        o->num_positions = total / cfg->global_batch * cfg->global_batch;
        if (o->num_positions == 0) {
            rc = tf__seterr(-EINVAL, "%llu epoch(s) of %llu samples do not fill one global batch of %llu: lower the batch size or raise epochs",
                            (unsigned long long)cfg->epochs, (unsigned long long)o->N,
                            (unsigned long long)cfg->global_batch);
            goto fail;
        }
    }
    if (cfg->shuffle == TF_SHUFFLE_BLOCK) {
        uint64_t Bk = cfg->block_size, W = cfg->window_blocks;
        o->nbf = o->N / Bk;
        if (tf__mul_overflow(W, Bk, &o->wsz)) o->wsz = UINT64_MAX;
        /* ceil(nbf / W) windows; one (tail only) when there is no full block */
        o->nwin = o->nbf ? o->nbf / W + (o->nbf % W != 0) : 1;
    }
    o->fingerprint = tf__order_config_fingerprint(cfg);
    if (o->has_kind_fp) o->fingerprint = tf_mix64(o->fingerprint ^ o->kind_fp);
    *out = o;
    return 0;
fail:
    tf_order_free(o);
    return rc;
}

int tf__order_build(tf__order_init init, const void *args, const tf_order_config *cfg, tf_order **out) {
    *out = NULL;
    TF_TRY(check_config(cfg));
    return build(init, args, cfg, out);
}

/* Token ids the order writes must lie in the vocabulary when it is known. */
static int check_ids(const tf_dataset *ds, const tf_order_config *cfg) {
    tf_dataset_info info;
    TF_TRY(tf_dataset_get_info(ds, &info));
    if (!info.vocab_size) return 0;
    if ((cfg->packing != TF_PACK_CONCAT || tf__order_kind_of((int)cfg->order)->pads_last) &&
        (uint64_t)cfg->pad_id >= info.vocab_size)
        TF_FAIL(-EINVAL, "pad_id %lld is outside the dataset's vocabulary (vocab_size %llu): use an id < vocab_size (padding is masked out of the loss)",
                (long long)cfg->pad_id, (unsigned long long)info.vocab_size);
    if (cfg->separator_id >= 0 && (uint64_t)cfg->separator_id >= info.vocab_size)
        TF_FAIL(-EINVAL, "separator_id %lld is outside the dataset's vocabulary (vocab_size %llu): use an id < vocab_size, such as the tokenizer's EOS",
                (long long)cfg->separator_id, (unsigned long long)info.vocab_size);
    return 0;
}

/* Files split at an eos id without their document index know their documents
 * only inside each row (the engine reads them from the row's tokens): enough
 * for concat rows, not for packings that place whole documents. */
static int check_docs(const tf_dataset *ds, const tf_order_config *cfg) {
    if (!ds->docs_from_rows || (cfg->packing == TF_PACK_CONCAT && cfg->separator_id < 0)) return 0;
    const char *p = "";
    for (uint64_t i = 0; i < ds->nfiles && !*p; i++)
        if (ds->files[i].eos.rows_only) p = ds->files[i].path;
    TF_FAIL(-EINVAL, "%s: %s the document index of this file, which is split at eos id %llu and has none: build it once with `tokenfeed index %s --dtype %s --eos-id %llu` (kept beside the data, or in the node cache when that directory is read-only)",
            p, cfg->packing == TF_PACK_CONCAT ? "separator_id needs" : "best-fit and document packing need", (unsigned long long)ds->eos_id, p,
            tf_dtype_name(ds->dtype), (unsigned long long)ds->eos_id);
}

int tf_order_create(const tf_dataset *ds, const tf_order_config *cfg, tf_order **out) {
    TF_NEED_ARG(out);
    *out = NULL;
    if (!ds || !cfg) TF_FAIL(-EINVAL, "tf_order_create: dataset and config are required");
    tf__clearerr();
    TF_TRY(check_config(cfg));
    const tf__order_kind *k = tf__order_kind_of((int)cfg->order);
    if (k->checks_data) {
        TF_TRY(check_ids(ds, cfg));
        TF_TRY(check_docs(ds, cfg));
    }
    if (k->init) return build(k->init, ds, cfg, out);
    return build(cfg->packing == TF_PACK_CONCAT ? tf__concat_init : tf__packed_init, ds, cfg, out);
}

/* llm.c's order by its own constructor (llmc_order.c builds it). */
int tf_order_create_llmc(const tf_dataset *ds, const tf_order_config *cfg, uint32_t num_processes, tf_order **out) {
    TF_NEED_ARG(out);
    *out = NULL;
    if (!ds || !cfg) TF_FAIL(-EINVAL, "tf_order_create_llmc: dataset and config are required");
    tf__clearerr();
    if (num_processes < 1) TF_FAIL(-EINVAL, "llm.c's order: num_processes must be at least 1");
    /* the configuration says what it is, so a state records it */
    tf_order_config c = *cfg;
    c.order = TF_ORDER_LLMC;
    c.llmc_processes = num_processes;
    return tf__order_build(tf__llmc_init, ds, &c, out);
}

/* Megatron's order from arrays the caller mapped (megatron_order.c builds
 * it); the configuration names the kind, so that a state records it. */
int tf_order_create_megatron(const tf_dataset *ds, const tf_order_config *cfg, const tf_megatron_index *index,
                             tf_order **out) {
    TF_NEED_ARG(out);
    *out = NULL;
    if (!ds || !cfg || !index) TF_FAIL(-EINVAL, "tf_order_create_megatron: dataset, config and index are required");
    if (tf_dataset_selection(ds, NULL, NULL) == 1)
        TF_FAIL(-EINVAL, "tf_order_create_megatron: Megatron's order comes from its index cache over the whole dataset and cannot read a view (a filtered dataset); use tokenfeed's own order for a filter");
    tf__clearerr();
    tf_order_config c = *cfg;
    c.order = TF_ORDER_MEGATRON;
    c.megatron_cache = NULL;
    c.megatron_add_extra_token = index->add_extra_token;
    tf__megatron_args a = {ds, index};
    return tf__order_build(tf__megatron_index_init, &a, &c, out);
}

void tf_order_free(tf_order *o) {
    if (!o) return;
    if (o->ops && o->ops->destroy) o->ops->destroy(o->impl);
    free(o->skips);
    tf__excl_free(o->excl, o->nexcl);
    free(o);
}

void tf__excl_free(tf__excl *e, size_t n) {
    for (size_t i = 0; e && i < n; i++) free(e[i].ids);
    free(e);
}

int tf__order_set_excluded(tf_order *o, const tf__excl *e, size_t n) {
    tf__excl *c = n ? calloc(n, sizeof *c) : NULL;
    if (n && !c) return -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        c[i] = e[i];
        c[i].ids = malloc((e[i].n ? e[i].n : 1) * sizeof *c[i].ids);
        if (!c[i].ids) {
            tf__excl_free(c, i);
            return -ENOMEM;
        }
        if (e[i].n) memcpy(c[i].ids, e[i].ids, e[i].n * sizeof *c[i].ids);
    }
    tf__excl_free(o->excl, o->nexcl);
    o->excl = c;
    o->nexcl = n;
    return 0;
}

/* Skipped ranges (tf_order_skip, state.c) are copied to the orders a mixture
 * hands over to, so they live here, below both. */
int tf__order_set_skips(tf_order *o, const uint64_t *ranges, size_t n) {
    uint64_t *r = NULL;
    if (n) {
        r = malloc(2 * n * sizeof *r);
        if (!r) return -ENOMEM;
        memcpy(r, ranges, 2 * n * sizeof *r);
    }
    free(o->skips);
    o->skips = r;
    o->nskips = n;
    return 0;
}

uint64_t tf_order_num_samples(const tf_order *o) { return o ? o->N : 0; }
uint64_t tf_order_epoch_positions(const tf_order *o) { return o ? o->epoch_len : 0; }
uint64_t tf_order_num_positions(const tf_order *o) { return o ? o->num_positions : 0; }
uint64_t tf_order_fingerprint(const tf_order *o) { return o ? o->fingerprint : 0; }
const tf_dataset *tf_order_dataset(const tf_order *o) { return o ? o->ds : NULL; }

int tf_order_get_config(const tf_order *o, tf_order_config *cfg) {
    TF_NEED_ARG(o);
    TF_NEED_ARG(cfg);
    *cfg = o->cfg;
    return 0;
}

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
    if (o->ops->sample_at) return o->ops->sample_at(o, pos);
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

/* The inverse of block_sample: the epoch index i of sample s. */
static uint64_t block_index(const tf_order *o, uint64_t ek, uint64_t s) {
    const uint64_t Bk = o->cfg.block_size, W = o->cfg.window_blocks;
    uint64_t w, j;
    if (s < o->nbf * Bk) { /* in a full block: where the block permutation put it */
        tf_perm pb;
        tf_perm_init(&pb, o->nbf, tf_mix64(ek ^ KEY_BLOCKS));
        uint64_t q = tf_perm_inverse(&pb, s / Bk);
        w = q / W;
        j = (q - w * W) * Bk + s % Bk;
    } else { /* a tail sample: in the last window, after its full blocks */
        w = o->nwin - 1;
        j = (o->nbf - w * W) * Bk + (s - o->nbf * Bk);
    }
    uint64_t wstart = w * o->wsz;
    uint64_t size = w + 1 < o->nwin ? o->wsz : o->N - wstart;
    tf_perm pw;
    tf_perm_init(&pw, size, tf_mix64(ek ^ tf_mix64(w + KEY_WINDOW)));
    return wstart + tf_perm_inverse(&pw, j);
}

uint64_t tf__order_position_of(const tf_order *o, uint64_t e, uint64_t sample) {
    uint64_t ek = epoch_key(o->cfg.seed, e), i = sample;
    if (o->cfg.shuffle == TF_SHUFFLE_FULL) {
        tf_perm p;
        tf_perm_init(&p, o->N, ek);
        i = tf_perm_inverse(&p, sample);
    } else if (o->cfg.shuffle == TF_SHUFFLE_BLOCK) {
        i = block_index(o, ek, sample);
    }
    return e * o->N + i;
}

/* ------------------------------------------------------------------------ */
/* the kind's queries                                                        */
/* ------------------------------------------------------------------------ */

static int check_sample(const tf_order *o, uint64_t sample) {
    if (sample >= o->N)
        TF_FAIL(-ERANGE, "sample %llu out of range: an epoch has %llu samples", (unsigned long long)sample,
                (unsigned long long)o->N);
    return 0;
}

size_t tf__order_max_spans(const tf_order *o) { return o->max_spans; }
int tf__order_pads_last(const tf_order *o) { return o->pad_last; }

int tf__order_sample_spans(const tf_order *o, uint64_t sample, tf__span *spans, size_t cap, size_t *n) {
    if (!o || !spans || !n) return -EINVAL;
    if (cap < o->max_spans)
        TF_FAIL(-EINVAL, "span buffer holds %zu spans, this order needs %zu", cap, o->max_spans);
    TF_TRY(check_sample(o, sample));
    return o->ops->spans(o, sample, spans, cap, n);
}

void tf__order_prefetch(const tf_order *o, uint64_t sample, int stage) {
    if (o && o->ops->prefetch && sample < o->N) o->ops->prefetch(o, sample, stage);
}

int tf__order_fill_extras(const tf_order *o, uint64_t sample, const tf_sample_extras *ex) {
    if (!o) return -EINVAL;
    if (!ex || (!ex->position_ids && !ex->cu_seqlens && !ex->num_seqs && !ex->loss_mask)) return 0;
    TF_TRY(check_sample(o, sample));
    return o->ops->extras(o, sample, ex);
}

int tf_order_packing_stats(const tf_order *o, tf_packing_stats *st) {
    TF_NEED_ARG(o);
    TF_NEED_ARG(st);
    return o->ops->stats(o, st);
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

/* The sample's spans, then its tokens from the dataset and the separator and
 * pad values, then the extras. */
int tf_order_fill_sample(const tf_order *o, uint64_t sample, void *out, tf_dtype out_dtype,
                         const tf_sample_extras *extras) {
    TF_NEED_ARG(o);
    TF_NEED_ARG(out);
    size_t osz = tf_dtype_size(out_dtype);
    if (!osz) TF_FAIL(-EINVAL, "invalid output dtype %d", (int)out_dtype);
    TF_TRY(check_sample(o, sample));
    int64_t vals[2] = {o->cfg.separator_id, o->cfg.pad_id};
    uint8_t conv[2][8] = {{0}};
    for (int k = 0; k < 2; k++) {
        if (vals[k] < 0 || (k == 1 && o->cfg.packing == TF_PACK_CONCAT && !o->pad_last)) continue;
        if (!fits_dtype(vals[k], out_dtype))
            TF_FAIL(-EINVAL, "%s %lld does not fit the output dtype %s: use a wider out_dtype",
                    k ? "pad_id" : "separator_id", (long long)vals[k], tf_dtype_name(out_dtype));
        tf_convert(conv[k], out_dtype, &vals[k], TF_INT64, 1);
    }
    size_t n = 0;
    tf__span *spans = malloc(o->max_spans * sizeof *spans);
    if (!spans) return -ENOMEM;
    int rc = tf__order_sample_spans(o, sample, spans, o->max_spans, &n);
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
    /* extras after the tokens: a packed order's per-thread window cache is still warm */
    return tf__order_fill_extras(o, sample, extras);
}
