/*
 * olmo_order.c — the order of OLMo-core's fixed-sequence-length data
 * (olmo_core.data: NumpyFSLDataset read by NumpyFSLDataLoader), so that a run
 * begun on OLMo's loader continues on tokenfeed instance for instance
 * (TF_ORDER_OLMO in tokenfeed.h).
 *
 * OLMo's dataset, over its token files (here: the dataset's files, in the
 * order given), with L = sequence_length:
 *   - file f holds n_f = floor(tokens_f / L) instances, tokens [c*L, c*L + L)
 *     of the file for c < n_f; its tail of tokens_f mod L is never read and
 *     no instance spans two files;
 *   - instance k of the dataset is instance k - C_f of file f, C_f the
 *     instances of the files before it (k is OLMo's dataset index, which its
 *     batches carry as "index").
 * OLMo's data loader, with G instances per global batch:
 *   - epoch E (1-based) reads the indices arange(N) shuffled in place by
 *     numpy.random.Generator(numpy.random.PCG64(seed + E)).shuffle (or in
 *     order without shuffling), cut to the first N' = floor(N / G) * G: the
 *     rest of every epoch is dropped;
 *   - with max_target_sequence_length = c * L (olmo_chunk c, its loader's
 *     chunk_size), a file holds c * floor(tokens_f / (c*L)) instances, and
 *     the shuffle is of arange(N / c), run k standing for instances
 *     [k*c, k*c + c) in order;
 *   - global batch b of the epoch is indices [b*G, (b+1)*G); rank r of R takes
 *     its rows r, r + R, ... (TF_BALANCE_STRIDED gives the same rows).
 *
 * Here sample k is instance k followed by one pad_id token: the model sees
 * the instance's L tokens as inputs, as OLMo's, and OLMo trains no label for
 * the last one (its labels are the inputs shifted, the last ignored), so
 * neither does the loss mask here. Position pos is epoch e = pos / N' (OLMo's
 * epoch e + 1), index i = pos % N' of it.
 *
 * The shuffle is NumPy's, reproduced bit for bit: the seed becomes 32-bit
 * words (little end first), SeedSequence mixes them into a pool of four and
 * draws eight words, which seed PCG64 (XSL-RR output of a 128-bit LCG); the
 * shuffle is Fisher-Yates from the last element down, swapping i with
 * random_interval(i) (masked rejection on 32-bit draws, each 64-bit output
 * giving its low then its high half, while i < 2^32). It is sequential, so an
 * epoch's permutation is computed whole (O(N), a few ms per million
 * instances) when a position of it is first asked for, and kept; two slots,
 * so that the positions around an epoch end, which the engine's workers read
 * together, do not recompute it in turn. Both are allocated at create.
 * A mutex serialises shuffled queries. Everything here is part of the
 * checkpoint contract: changing it must change OLMO_FP_VERSION.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kind.h"

#define OLMO_FP_VERSION 1
#define NO_EPOCH UINT64_MAX

__extension__ typedef unsigned __int128 u128;

/* ---- NumPy's SeedSequence (pool of 4 words) and PCG64 -------------------- */

#define SS_INIT_A 0x43b0d7e5u
#define SS_MULT_A 0x931e8875u
#define SS_INIT_B 0x8b51f9ddu
#define SS_MULT_B 0x58f38dedu
#define SS_MIX_L 0xca01f9ddu
#define SS_MIX_R 0x4973f715u

static uint32_t ss_hashmix(uint32_t v, uint32_t *h) {
    v ^= *h;
    *h *= SS_MULT_A;
    v *= *h;
    return v ^ (v >> 16);
}

static uint32_t ss_mix(uint32_t x, uint32_t y) {
    uint32_t r = SS_MIX_L * x - SS_MIX_R * y;
    return r ^ (r >> 16);
}

/* SeedSequence(entropy).generate_state(4, uint64) for an entropy of n <= 4 words. */
static void seed_sequence(const uint32_t *ent, size_t n, uint64_t out[4]) {
    uint32_t pool[4], h = SS_INIT_A;
    for (size_t i = 0; i < 4; i++) pool[i] = ss_hashmix(i < n ? ent[i] : 0, &h);
    for (size_t s = 0; s < 4; s++)
        for (size_t d = 0; d < 4; d++)
            if (s != d) pool[d] = ss_mix(pool[d], ss_hashmix(pool[s], &h));
    uint32_t w[8], hb = SS_INIT_B;
    for (size_t i = 0; i < 8; i++) {
        uint32_t v = pool[i % 4] ^ hb;
        hb *= SS_MULT_B;
        v *= hb;
        w[i] = v ^ (v >> 16);
    }
    for (size_t i = 0; i < 4; i++) out[i] = (uint64_t)w[2 * i] | (uint64_t)w[2 * i + 1] << 32;
}

typedef struct pcg64 {
    u128 state, inc;
    int has32;
    uint32_t next32;
} pcg64;

static const u128 PCG_MULT = ((u128)2549297995355413924ULL << 64) | 4865540595714422341ULL;

static void pcg_step(pcg64 *g) { g->state = g->state * PCG_MULT + g->inc; }

/* PCG64(SeedSequence(seed)) for seed = hi * 2^64 + lo. */
static void pcg_seed(pcg64 *g, uint64_t lo, uint64_t hi) {
    uint32_t ent[4];
    size_t n = 0;
    u128 v = (u128)hi << 64 | lo;
    do {
        ent[n++] = (uint32_t)v;
        v >>= 32;
    } while (v && n < 4);
    uint64_t s[4];
    seed_sequence(ent, n, s);
    u128 initstate = (u128)s[0] << 64 | s[1], initseq = (u128)s[2] << 64 | s[3];
    g->state = 0;
    g->inc = initseq << 1 | 1;
    pcg_step(g);
    g->state += initstate;
    pcg_step(g);
    g->has32 = 0;
}

static uint64_t pcg_u64(pcg64 *g) {
    pcg_step(g);
    uint64_t x = (uint64_t)(g->state >> 64) ^ (uint64_t)g->state;
    unsigned rot = (unsigned)(g->state >> 122);
    return (x >> rot) | (x << ((64 - rot) & 63));
}

static uint32_t pcg_u32(pcg64 *g) {
    if (g->has32) {
        g->has32 = 0;
        return g->next32;
    }
    uint64_t x = pcg_u64(g);
    g->has32 = 1;
    g->next32 = (uint32_t)(x >> 32);
    return (uint32_t)x;
}

/* NumPy's random_interval: uniform in [0, max]. */
static uint64_t pcg_interval(pcg64 *g, uint64_t max) {
    if (max == 0) return 0;
    uint64_t mask = max, v;
    mask |= mask >> 1;
    mask |= mask >> 2;
    mask |= mask >> 4;
    mask |= mask >> 8;
    mask |= mask >> 16;
    mask |= mask >> 32;
    if (max <= 0xffffffffu) {
        while ((v = (pcg_u32(g) & mask)) > max) {
        }
    } else {
        while ((v = (pcg_u64(g) & mask)) > max) {
        }
    }
    return v;
}

/* ---- the order ----------------------------------------------------------- */

typedef struct slot {
    uint64_t epoch; /* NO_EPOCH: empty */
    uint64_t used;  /* when it was last asked for (the other slot is replaced) */
    uint32_t *perm; /* the runs of the epoch in order (N / chunk) */
} slot;

typedef struct olmo {
    const tf_dataset *ds;
    uint64_t L, N, Ne; /* seq_len, instances, positions per epoch */
    uint64_t chunk;    /* instances per shuffled run (OLMo's chunk_size) */
    int shuffle;
    uint64_t seed;
    tf__runs files; /* units: instances */
    pthread_mutex_t mu;
    slot slots[2];
    uint64_t clock;
} olmo;

/* Epoch e's shuffle (OLMo's epoch e + 1) of the N / chunk runs into p. */
static void draw_epoch(const olmo *o, uint64_t e, uint32_t *p) {
    pcg64 g;
    u128 seed = (u128)o->seed + e + 1; /* OLMo seeds epoch E with seed + E */
    pcg_seed(&g, (uint64_t)seed, (uint64_t)(seed >> 64));
    const uint64_t n = o->N / o->chunk;
    for (uint64_t i = 0; i < n; i++) p[i] = (uint32_t)i;
    for (uint64_t i = n - 1; i > 0; i--) {
        uint64_t j = pcg_interval(&g, i);
        uint32_t t = p[i];
        p[i] = p[j];
        p[j] = t;
    }
}

static uint64_t olmo_sample_at(const tf_order *order, uint64_t pos) {
    olmo *o = order->impl;
    uint64_t e = pos / o->Ne, i = pos % o->Ne;
    if (!o->shuffle) return i;
    pthread_mutex_lock(&o->mu);
    slot *s = o->slots[0].epoch == e ? &o->slots[0] : o->slots[1].epoch == e ? &o->slots[1] : NULL;
    if (!s) {
        s = o->slots[0].used <= o->slots[1].used ? &o->slots[0] : &o->slots[1];
        draw_epoch(o, e, s->perm);
        s->epoch = e;
    }
    s->used = ++o->clock;
    uint64_t k = (uint64_t)s->perm[i / o->chunk] * o->chunk + i % o->chunk;
    pthread_mutex_unlock(&o->mu);
    return k;
}

/* The instance's first token in the dataset. */
static uint64_t instance_start(const olmo *o, uint64_t k) {
    size_t f = tf__runs_find(&o->files, k);
    return o->files.first[f] + (k - o->files.cum[f]) * o->L;
}

static int olmo_spans(const tf_order *order, uint64_t sample, tf__span *spans, size_t cap, size_t *n) {
    const olmo *o = order->impl;
    (void)cap; /* >= max_spans = 2, checked by order.c */
    spans[0] = (tf__span){instance_start(o, sample), o->L, 0};
    spans[1] = (tf__span){TF_SPAN_PAD, 1, o->L};
    *n = 2;
    return 0;
}

static int olmo_extras(const tf_order *order, uint64_t sample, const tf_sample_extras *ex) {
    const olmo *o = order->impl;
    TF_TRY(tf__concat_extras_at(o->ds, o->L, instance_start(o, sample), ex));
    if (ex->loss_mask) ex->loss_mask[o->L - 1] = 0; /* its label is the pad */
    return 0;
}

/* File by file: a file's read region is its tokens [0, n_f*L); a document is
 * truncated when part of it lies past that, split when no instance holds it. */
static int olmo_stats(const tf_order *order, tf_packing_stats *st) {
    const olmo *o = order->impl;
    memset(st, 0, sizeof *st);
    st->samples = o->N;
    st->token_slots = o->N * (o->L + 1);
    st->pad_tokens = o->N;
    st->padding_fraction = 1.0 / (double)(o->L + 1);
    return tf__runs_doc_stats(&o->files, o->ds, o->L, o->L, 0, st);
}

static void olmo_destroy(void *impl) {
    olmo *o = impl;
    if (o) {
        pthread_mutex_destroy(&o->mu);
        free(o->slots[0].perm);
        free(o->slots[1].perm);
        tf__runs_free(&o->files);
    }
    free(o);
}

static const tf__order_ops olmo_ops = {.name = "olmo", .sample_at = olmo_sample_at, .spans = olmo_spans,
                                       .extras = olmo_extras, .stats = olmo_stats, .destroy = olmo_destroy};

static int measure_files(olmo *o) {
    TF_TRY(tf__runs_init(&o->files, o->ds, "OLMo's order"));
    /* whole instances, in whole runs of chunk (OLMo: whole max_target_sequence_length) */
    for (size_t f = 0; f < o->files.n; f++) o->files.count[f] = o->files.count[f] / (o->L * o->chunk) * o->chunk;
    tf__runs_sum(&o->files);
    o->N = o->files.cum[o->files.n];
    return 0;
}

int tf__olmo_init(tf_order *order, const void *vds) {
    const tf_order_config *c = &order->cfg;
    if (c->packing != TF_PACK_CONCAT || c->separator_id != -1)
        TF_FAIL(-EINVAL, "OLMo's order cuts the tokens as they are: packing must be concat and separator_id None");
    if (c->shuffle == TF_SHUFFLE_BLOCK)
        TF_FAIL(-EINVAL, "OLMo's order: shuffle must be none or full (OLMo's own shuffle), not block");
    olmo *o = calloc(1, sizeof *o);
    if (!o) return -ENOMEM;
    pthread_mutex_init(&o->mu, NULL);
    o->ds = vds;
    o->L = c->seq_len;
    o->shuffle = c->shuffle == TF_SHUFFLE_FULL;
    o->chunk = c->olmo_chunk ? c->olmo_chunk : 1;
    if (tf__mul_overflow(o->L, o->chunk, &o->Ne)) { /* Ne: scratch until the files are measured */
        olmo_destroy(o);
        TF_FAIL(-EOVERFLOW, "OLMo's order: olmo_chunk x seq_len overflows 64 bits");
    }
    o->seed = c->seed;
    o->slots[0].epoch = o->slots[1].epoch = NO_EPOCH;
    int rc = measure_files(o);
    if (rc == 0 && o->N >= UINT32_MAX)
        rc = tf__seterr(-EINVAL, "OLMo's order: %llu instances, OLMo's data loader holds fewer than 2^32 - 1",
                        (unsigned long long)o->N);
    if (rc == 0) {
        o->Ne = o->N / c->global_batch * c->global_batch;
        if (o->Ne == 0)
            rc = tf__seterr(-EINVAL, "OLMo's order: the files hold %llu instances of %llu tokens, fewer than one global batch of %llu: OLMo's loader would give no batch; lower the batch size",
                            (unsigned long long)o->N, (unsigned long long)o->L, (unsigned long long)c->global_batch);
    }
    if (rc == 0 && o->shuffle) {
        o->slots[0].perm = malloc(o->N / o->chunk * sizeof *o->slots[0].perm);
        o->slots[1].perm = malloc(o->N / o->chunk * sizeof *o->slots[1].perm);
        if (!o->slots[0].perm || !o->slots[1].perm)
            rc = tf__seterr(-ENOMEM, "OLMo's order: out of memory for two epochs' shuffles of %llu instances (%llu MB)",
                            (unsigned long long)o->N, (unsigned long long)(o->N * 8 >> 20));
    }
    if (rc < 0) {
        olmo_destroy(o);
        return rc;
    }
    order->ops = &olmo_ops;
    order->impl = o;
    order->ds = o->ds;
    order->N = o->N;
    order->epoch_len = o->Ne;
    order->max_spans = 2;
    order->pad_last = 1;
    order->has_kind_fp = 1;
    order->kind_fp = tf__olmo_kind_fp(c);
    return 0;
}

uint64_t tf__olmo_kind_fp(const tf_order_config *c) {
    (void)c;
    uint8_t buf[16];
    tf__put_le64(buf, 0x314f4d4c4fULL); /* "OLMO1" */
    tf__put_le64(buf + 8, OLMO_FP_VERSION);
    return tf_hash64(buf, sizeof buf, 0);
}
