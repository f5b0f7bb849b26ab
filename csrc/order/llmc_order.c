/*
 * llmc_order.c — the order of llm.c's training data loader (karpathy/llm.c,
 * llmc/dataloader.h), so that a run begun on llm.c's loader continues on
 * tokenfeed sample for sample (tf_order_create_llmc in tokenfeed.h).
 *
 * llm.c's loader, with B rows of T tokens per process and R processes (a
 * global batch of G = R*B rows, R*B*T tokens), over its shards (here: the
 * dataset's files, in the order given, which for llm.c is its sorted glob):
 *   - shard f holds n_f = (tokens_f - 1) / (R*B*T) global batches, read from
 *     the shard's own token 0; its tail of (tokens_f - 1) mod (R*B*T) tokens
 *     is never read, and no batch spans two shards;
 *   - global batch c of shard f: process r reads B*T + 1 tokens from offset
 *     c*R*B*T + r*B*T; its row j is tokens [j*T, j*T + T + 1) of them (rows
 *     overlap by one token, as CONCAT samples do);
 *   - an epoch visits every shard once, then the loader starts over;
 *   - with shuffling (train_gpt2's permute_train_loader) process r draws from
 *     its own MT19937 (PyTorch's generator, llmc/rand.h) seeded with
 *     seed + r (llm.c: 42 + r): at the start of every epoch it shuffles the
 *     shard order in place (Fisher-Yates from the last element down,
 *     j = randint32() % (i + 1); applied to the previous epoch's order), and
 *     each time it opens a shard it shuffles that shard's batches, starting
 *     from the identity. Processes therefore read different shards at the
 *     same step.
 *
 * Positions. pos = k*G + r*B + j is row j of process r at step k. An epoch
 * has E = sum n_f steps whatever the shuffle, so e = k / E; inside the epoch
 * process r's shard order and batch permutation give (f, c). The sample id
 * (what spans and extras take) is the row's place in the unshuffled epoch,
 * (C_f + c)*G + r*B + j with C_f the batches of the files before f, and
 * N = E*G. Extras are CONCAT's over the row's tokens.
 *
 * The draws are sequential: epoch e's depend on every draw before it. Each
 * process keeps the epoch it drew last (its shard order, where each slot's
 * steps start, and its batch permutations: O(files + E) integers, allocated
 * at create) with its generator after it, so consecutive epochs cost one
 * epoch of draws each; an earlier epoch is drawn again from epoch 0. Nothing
 * is allocated after create. A mutex serialises queries (the engine's
 * workers share the order). Everything here, the generator included, is part
 * of the checkpoint contract: changing it must change LLMC_FP_VERSION.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kind.h"

#define LLMC_FP_VERSION 1
#define MT_N 624
#define MT_M 397
#define NO_EPOCH UINT64_MAX

/* MT19937 as llmc/rand.h (PyTorch's): seeded with init_genrand, tempered. */
typedef struct mt19937 {
    uint32_t s[MT_N];
    int left, next;
} mt19937;

static void mt_seed(mt19937 *m, uint32_t seed) {
    m->s[0] = seed;
    for (uint32_t j = 1; j < MT_N; j++) m->s[j] = 1812433253u * (m->s[j - 1] ^ (m->s[j - 1] >> 30)) + j;
    m->left = 1;
    m->next = 0;
}

static void mt_refill(mt19937 *m) {
    static const uint32_t mag[2] = {0, 0x9908b0dfu};
    uint32_t y;
    int j;
    for (j = 0; j < MT_N - MT_M; j++) {
        y = (m->s[j] & 0x80000000u) | (m->s[j + 1] & 0x7fffffffu);
        m->s[j] = m->s[j + MT_M] ^ (y >> 1) ^ mag[y & 1];
    }
    for (; j < MT_N - 1; j++) {
        y = (m->s[j] & 0x80000000u) | (m->s[j + 1] & 0x7fffffffu);
        m->s[j] = m->s[j + MT_M - MT_N] ^ (y >> 1) ^ mag[y & 1];
    }
    y = (m->s[MT_N - 1] & 0x80000000u) | (m->s[0] & 0x7fffffffu);
    m->s[MT_N - 1] = m->s[MT_M - 1] ^ (y >> 1) ^ mag[y & 1];
    m->left = MT_N;
    m->next = 0;
}

static uint32_t mt_u32(mt19937 *m) {
    if (--m->left <= 0) mt_refill(m);
    uint32_t y = m->s[m->next++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

/* llmc/rand.h random_permutation. */
static void mt_shuffle(uint32_t *a, uint32_t n, mt19937 *m) {
    for (uint32_t i = n ? n - 1 : 0; i > 0; i--) {
        uint32_t j = mt_u32(m) % (i + 1), t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}

typedef struct proc {
    uint64_t epoch;       /* drawn into order / slot_first / perm (NO_EPOCH: none yet) */
    mt19937 m;            /* the generator after that epoch's draws */
    uint64_t *slot_first; /* nfiles + 1: steps of the epoch before each slot */
    uint32_t *perm;       /* E: perm[slot_first[s] + i] = the batch of file order[s] read at its step i */
    uint32_t *order;      /* nfiles: the file at each slot of the epoch */
} proc;

typedef struct llmc {
    const tf_dataset *ds;
    uint64_t T, G, B, E;
    uint32_t R;
    int shuffle;
    uint32_t seed;
    size_t nfiles;
    tf__runs files; /* units: global batches */
    pthread_mutex_t mu;
    proc *procs;     /* R, with shuffling */
    uint64_t *proc_mem; /* their arrays, one allocation */
} llmc;

/* Last i with cum[i] <= k (cum ascending, cum[0] = 0, k < cum[n]). */
static size_t find(const uint64_t *cum, size_t n, uint64_t k) {
    tf__runs r = {.n = n, .cum = (uint64_t *)cum};
    return tf__runs_find(&r, k);
}

/* Process p's draws for the epoch after p->epoch (its order carries over). */
static void draw_next_epoch(const llmc *o, proc *p) {
    mt_shuffle(p->order, (uint32_t)o->nfiles, &p->m);
    uint64_t at = 0;
    for (size_t s = 0; s < o->nfiles; s++) {
        uint32_t f = p->order[s], n = (uint32_t)o->files.count[f];
        p->slot_first[s] = at;
        for (uint32_t i = 0; i < n; i++) p->perm[at + i] = i;
        mt_shuffle(p->perm + at, n, &p->m);
        at += n;
    }
    p->slot_first[o->nfiles] = at;
    p->epoch = p->epoch == NO_EPOCH ? 0 : p->epoch + 1;
}

/* mu held. Process r's draws for epoch e. */
static proc *epoch_of(llmc *o, uint32_t r, uint64_t e) {
    proc *p = &o->procs[r];
    if (p->epoch == NO_EPOCH || e < p->epoch) { /* from the start */
        mt_seed(&p->m, o->seed + r);
        for (size_t f = 0; f < o->nfiles; f++) p->order[f] = (uint32_t)f;
        p->epoch = NO_EPOCH;
    }
    while (p->epoch == NO_EPOCH || p->epoch < e) draw_next_epoch(o, p);
    return p;
}

static uint64_t llmc_sample_at(const tf_order *order, uint64_t pos) {
    llmc *o = order->impl;
    uint64_t k = pos / o->G, w = pos % o->G, e = k / o->E, step = k % o->E;
    size_t f;
    uint64_t c;
    if (!o->shuffle) {
        f = tf__runs_find(&o->files, step);
        c = step - o->files.cum[f];
    } else {
        pthread_mutex_lock(&o->mu);
        proc *p = epoch_of(o, (uint32_t)(w / o->B), e);
        size_t s = find(p->slot_first, o->nfiles, step);
        f = p->order[s];
        c = p->perm[step];
        pthread_mutex_unlock(&o->mu);
    }
    return (o->files.cum[f] + c) * o->G + w;
}

/* The row's first token in the dataset. */
static uint64_t row_start(const llmc *o, uint64_t sample) {
    uint64_t q = sample / o->G, w = sample % o->G;
    size_t f = tf__runs_find(&o->files, q);
    return o->files.first[f] + ((q - o->files.cum[f]) * o->G + w) * o->T;
}

static int llmc_spans(const tf_order *order, uint64_t sample, tf__span *spans, size_t cap, size_t *n) {
    const llmc *o = order->impl;
    spans[0] = (tf__span){row_start(o, sample), o->T + 1, 0};
    *n = 1;
    return 0;
}

static int llmc_extras(const tf_order *order, uint64_t sample, const tf_sample_extras *ex) {
    const llmc *o = order->impl;
    return tf__concat_extras_at(o->ds, o->T, row_start(o, sample), ex);
}

/* As CONCAT's, file by file: a file's read region is its tokens
 * [0, n_f*G*T + 1); a document is truncated when part of it lies past that,
 * split when no single row holds it. */
static int llmc_stats(const tf_order *order, tf_packing_stats *st) {
    const llmc *o = order->impl;
    memset(st, 0, sizeof *st);
    st->samples = order->N;
    st->token_slots = order->N * (o->T + 1);
    return tf__runs_doc_stats(&o->files, o->ds, o->G * o->T, o->T, 1, st);
}

static void llmc_destroy(void *impl) {
    llmc *o = impl;
    if (o) {
        pthread_mutex_destroy(&o->mu);
        free(o->proc_mem);
        free(o->procs);
        tf__runs_free(&o->files);
    }
    free(o);
}

static const tf__order_ops llmc_ops = {.name = "llmc", .sample_at = llmc_sample_at, .spans = llmc_spans,
                                       .extras = llmc_extras, .stats = llmc_stats, .destroy = llmc_destroy};

/* The files and their batches; o->T, G, R set. */
static int measure_files(llmc *o) {
    uint64_t GT;
    if (tf__mul_overflow(o->G, o->T, &GT)) TF_FAIL(-EOVERFLOW, "global_batch x seq_len overflows 64 bits");
    TF_TRY(tf__runs_init(&o->files, o->ds, "llm.c's order"));
    o->nfiles = o->files.n;
    for (size_t f = 0; f < o->nfiles; f++) {
        tf_file_info fi;
        TF_TRY(tf_dataset_get_file(o->ds, f, &fi));
        uint64_t n = fi.num_tokens ? (fi.num_tokens - 1) / GT : 0;
        if (n == 0)
            TF_FAIL(-EINVAL, "%s: %llu tokens, fewer than one global batch of llm.c's order needs (%llu processes x %llu rows x seq_len %llu + 1 = %llu): llm.c refuses such a shard too; use fewer rows or leave the file out",
                    fi.path, (unsigned long long)fi.num_tokens, (unsigned long long)o->R,
                    (unsigned long long)o->B, (unsigned long long)o->T, (unsigned long long)GT + 1);
        if (n > INT32_MAX) TF_FAIL(-EINVAL, "%s: %llu global batches in one file, llm.c counts at most %d", fi.path, (unsigned long long)n, INT32_MAX);
        o->files.count[f] = n;
    }
    tf__runs_sum(&o->files);
    o->E = o->files.cum[o->nfiles];
    return 0;
}

int tf__llmc_init(tf_order *order, const void *vds) {
    const tf_order_config *c = &order->cfg;
    const tf_dataset *ds = vds;
    const uint32_t nproc = c->llmc_processes;
    if (nproc == 0)
        TF_FAIL(-EINVAL, "llmc_processes is 0 (None), which means the data-parallel size, and an order built on its "
                "own (tf_order_create) does not know it: set llmc_processes to llm.c's number of processes, or build "
                "the loader with tf_loader_create, which takes it from world_size");
    if (c->packing != TF_PACK_CONCAT || c->separator_id != -1)
        TF_FAIL(-EINVAL, "llm.c's order cuts the tokens as they are: packing must be CONCAT and separator_id -1");
    if (c->shuffle == TF_SHUFFLE_BLOCK)
        TF_FAIL(-EINVAL, "llm.c's order: shuffle must be NONE or FULL (llm.c's own shuffle), not BLOCK");
    if (nproc < 1 || c->global_batch % nproc)
        TF_FAIL(-EINVAL, "llm.c's order: global_batch (%llu) must be num_processes (%u) x the rows per process",
                (unsigned long long)c->global_batch, nproc);
    if (c->seed > UINT32_MAX - nproc)
        TF_FAIL(-EINVAL, "llm.c's order: seed + num_processes must fit 32 bits (llm.c seeds process r with 42 + r), found seed %llu",
                (unsigned long long)c->seed);
    llmc *o = calloc(1, sizeof *o);
    if (!o) return -ENOMEM;
    pthread_mutex_init(&o->mu, NULL);
    o->ds = ds;
    o->T = c->seq_len;
    o->G = c->global_batch;
    o->R = nproc;
    o->B = o->G / o->R;
    o->shuffle = c->shuffle == TF_SHUFFLE_FULL;
    o->seed = (uint32_t)c->seed;
    int rc = measure_files(o);
    uint64_t N = 0;
    if (rc == 0 && tf__mul_overflow(o->E, o->G, &N)) rc = tf__seterr(-EOVERFLOW, "samples per epoch overflow 64 bits");
    if (rc == 0 && o->shuffle) {
        /* per process, in 64-bit words: slot_first, then perm and order (32-bit) */
        uint64_t words = o->nfiles + 1 + (o->E + o->nfiles + 1) / 2, all;
        o->procs = calloc(o->R, sizeof *o->procs);
        o->proc_mem = tf__mul_overflow(words, o->R, &all) || all > SIZE_MAX / 8 ? NULL : malloc(all * 8);
        if (!o->procs || !o->proc_mem)
            rc = tf__seterr(-ENOMEM, "llm.c's order: out of memory for %u processes' shuffles of %llu steps", o->R,
                            (unsigned long long)o->E);
        for (uint32_t r = 0; rc == 0 && r < o->R; r++) {
            proc *p = &o->procs[r];
            p->epoch = NO_EPOCH;
            p->slot_first = o->proc_mem + r * words;
            p->perm = (uint32_t *)(p->slot_first + o->nfiles + 1);
            p->order = p->perm + o->E;
        }
    }
    if (rc < 0) {
        llmc_destroy(o);
        return rc;
    }
    order->ops = &llmc_ops;
    order->impl = o;
    order->ds = ds;
    order->N = N;
    order->max_spans = 1;
    order->has_kind_fp = 1;
    order->kind_fp = tf__llmc_kind_fp(c);
    return 0;
}

uint64_t tf__llmc_kind_fp(const tf_order_config *c) {
    uint8_t buf[24];
    tf__put_le64(buf, 0x31434d4c4cULL); /* "LLMC1" */
    tf__put_le64(buf + 8, LLMC_FP_VERSION);
    tf__put_le64(buf + 16, c->llmc_processes);
    return tf_hash64(buf, sizeof buf, 0);
}
