/*
 * zcache.c — the decompressed-block cache shared by a loader's workers, and
 * the cost model that sizes it.
 *
 * WHY SHARED AND SIZED FROM THE WINDOW
 *
 * A zstd shard stores tokens in independent frames of block_tokens tokens
 * (2048 by default). A sample uses L + 1 tokens of a block, so reading a
 * sample from a block nobody decoded yet costs (block_tokens + L) tokens of
 * decoding. The block shuffle (order.c) gives locality: the W * Bk samples of
 * one window come from W runs of Bk consecutive samples, i.e. about
 * W * (Bk * L / block_tokens + 2) blocks, and a window is consumed before the
 * next one starts. A cache that holds one window's blocks therefore decodes
 * each block once per window visit: once per epoch, twice for a block that
 * straddles two sample blocks of different windows. A per-worker cache of a
 * few blocks cannot: with the defaults (L 2048, Bk 1024, W 16) a window spans
 * ~540 blocks, and the workers take batches in turn, so the cache must be
 * shared and about one window deep (~70 MiB of uint16 blocks). The order is
 * untouched: this only changes how often a block is decoded.
 *
 * STRUCTURE
 *
 * A fixed array of entries (capacity fixed at create), a chained hash on
 * (file, block), and an LRU list (most recent at the head; empty entries at
 * the tail). Entry i's buffer is slice i of one anonymous mapping (the
 * arena), reserved at create and touched only when the entry is first used,
 * so memory grows with use up to the capacity and a steady state allocates
 * nothing. The arena asks for transparent huge pages: samples are copied
 * from random places of a window's ~70 MiB, and with 4 KiB pages the copy
 * stalled on TLB misses.
 *
 * Entry states: EMPTY, LOADING (one worker decodes into the buffer, outside
 * the lock), READY. pins counts workers reading the buffer; a pinned or
 * LOADING entry is never chosen as a victim. A worker pins at most one entry
 * at a time (tf__zhold: the block it is copying from, kept while consecutive
 * pieces come from it) or the one it loads, so with capacity >= workers + 1
 * (any automatic size) a victim always exists; with a smaller explicit
 * capacity, a worker that finds every entry in use decodes into its own
 * scratch buffer without caching.
 *
 * Locking: one mutex `mu` over the table, the list and the entries' state,
 * pins and keys. Block bytes are written only by the loading worker while
 * LOADING (pins = 1, invisible to others, who wait on `loaded`) and read by
 * pinners while READY; the mutex orders the two. The lock is taken once per
 * block switch, not per sample or token. Decoding happens outside the lock:
 * it touches mapped memory, and the SIGBUS guard (common/sigbus.c) may
 * abandon it there, so the worker records the entry in its hold first and
 * tf__zcache_abandon empties it and wakes the waiters.
 *
 * Who wakes whom: a worker that finds its block LOADING waits on `loaded`;
 * every load that ends (ready or failed) broadcasts it. A failed load leaves
 * the entry EMPTY, so each waiter retries and meets the error itself (with
 * its own tf_last_error message).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "zcache.h"

enum { Z_EMPTY = 0, Z_LOADING = 1, Z_READY = 2 };
#define Z_NIL UINT32_MAX
/* At most this many entries (the entry table itself costs ~64 bytes each). */
#define Z_MAX_ENTRIES (1u << 20)

struct tf__zent {
    uint64_t file, block;
    uint8_t *buf;
    uint32_t pins;
    int state;
    uint32_t hnext;      /* hash chain */
    uint32_t prev, next; /* LRU list: prev is more recent */
};

/* The cache's counters: atomics of tf__zcache, each reported in the field of
 * tf__zinfo of the same name. */
#define Z_COUNTERS(X) X(blocks_decoded) X(tokens_decoded) X(tokens_used) X(hits) X(misses) X(waits)

struct tf__zcache {
    pthread_mutex_t mu;
    pthread_cond_t loaded;
    tf__zent *e;
    uint32_t n;
    uint8_t *arena;    /* n * blk_bytes of address space; pages are touched on use */
    size_t arena_len;
    uint32_t *bucket;
    uint32_t nbucket;  /* power of two */
    uint32_t head, tail;
    size_t blk_bytes;  /* largest decompressed block among the files */
    _Atomic uint64_t allocated; /* bytes of block buffers allocated */
    /* statistics (atomics: read by get_stats from any thread); Z_COUNTERS
     * lists them */
    _Atomic uint64_t blocks_decoded, tokens_decoded, tokens_used, hits, misses, waits;
    double model;
    char note[200];
};

/* ------------------------------------------------------------------------ */
/* cost model and sizing                                                     */
/* ------------------------------------------------------------------------ */

/* The compressed files of ds: blocks, tokens, smallest and largest block. */
typedef struct zfacts {
    uint64_t blocks, tokens, bt_min, bt_max;
    size_t blk_bytes;
} zfacts;

static int gather(const tf_dataset *ds, zfacts *z) {
    memset(z, 0, sizeof *z);
    for (uint64_t i = 0; i < ds->nfiles; i++) {
        const tf_file *f = &ds->files[i];
        if (!f->blocks.ops || !f->num_tokens) continue;
        uint64_t bt = f->blocks.tokens, bytes;
        size_t isz = tf_dtype_size(f->dtype);
        if (!bt || tf__mul_overflow(bt, isz, &bytes) || bytes > TF_NATIVE_MAX_BLOCK_BYTES)
            TF_FAIL(-TF_EFORMAT, "%s: block_tokens: %llu is not a usable block size", f->path, (unsigned long long)bt);
        z->blocks += f->blocks.count;
        z->tokens += f->num_tokens;
        if (!z->bt_min || bt < z->bt_min) z->bt_min = bt;
        if (bt > z->bt_max) z->bt_max = bt;
        if (bytes > z->blk_bytes) z->blk_bytes = (size_t)bytes;
    }
    return 0;
}

/* floor and ceil of x >= 0 without libm (the shared library links none);
 * values beyond 2^63 saturate, far past any size used here. */
static double floor_pos(double x) { return x < 9.2e18 ? (double)(uint64_t)x : x; }
static double ceil_pos(double x) {
    double f = floor_pos(x);
    return f < x ? f + 1 : f;
}

/* Blocks one window of the block shuffle touches (all sources of a mixture
 * advance together, so each contributes its window). */
static double window_blocks(const tf__zgeom *g, const zfacts *z) {
    double bt = (double)z->bt_min;
    double per_run = ceil_pos((double)g->block_size * (double)g->seq_len / bt) + 2;
    return (double)g->num_sources * (double)g->window_blocks * per_run;
}

/* Entries the cache needs so that, with the shuffle of g, each block is
 * decoded once per window visit (block shuffle), once (no shuffle), or as
 * rarely as a small cache allows (full shuffle: hits are luck).
 *
 * Block shuffle: between two uses of a block of window w, the workers use
 * other blocks of w (at most the window's ws), blocks of w - 1 that batches
 * still in flight read (near the start of w) and blocks of w + 1 that batches
 * claimed ahead read (near its end). At most depth batches of B samples are in
 * flight (the claim bound of loader.c), each sample touching at most
 * 1 + ceil(L / bt) blocks, and they span at most ceil(depth * B / window) + 1
 * windows. With ws + twice that + one pin per worker, LRU never evicts a block
 * before its last use in its window, whatever the thread timing, so a block
 * is decoded at most once per window it belongs to: at most twice per epoch
 * (a block can straddle two sample blocks of different windows). */
static double needed_entries(const tf__zgeom *g, const zfacts *z) {
    double S = (double)g->seq_len + 1, bt = (double)z->bt_min;
    double per_sample = 1 + ceil_pos((S - 1) / bt);
    /* what the workers assemble at once */
    double base = (double)g->nthreads * (ceil_pos((double)g->batch_size * S / bt) + 2);
    if (base < 16.0 * g->nthreads) base = 16.0 * g->nthreads; /* the old per-worker cache, at least */
    double need = base + g->nthreads + 1;
    if (g->shuffle == TF_SHUFFLE_BLOCK) {
        double ws = window_blocks(g, z);
        double flight = (double)g->depth * (double)g->batch_size; /* samples */
        double ahead = flight * per_sample;
        double wins = ceil_pos(flight / ((double)g->window_blocks * (double)g->block_size)) + 1;
        if (ahead > wins * ws) ahead = wins * ws;
        need += ws + 2 * ahead;
    }
    return need;
}

/* base^q for 0 < base <= 1, q >= 0, without libm (the shared library links
 * no libm): squaring for the integer part, linear between the two integer
 * powers for the fraction. Close enough for a cost model. */
static double pow_model(double base, double q) {
    double r = 1.0, b = base;
    uint64_t k = (uint64_t)q;
    double f = q - (double)k;
    for (uint64_t e = k; e; e >>= 1, b *= b)
        if (e & 1) r *= b;
    return r * (1.0 - f * (1.0 - base));
}

/* Predicted tokens decoded per token delivered from compressed files, for
 * capacity C entries. A sample is S = L + 1 consecutive tokens (packed modes:
 * at most that); from a cold cache it touches 1 + (S - 1) / bt blocks on
 * average, i.e. costs c1 = (bt + S - 1) / S.
 *   FULL   uniform random samples: a block is cached with probability
 *          C / blocks, so c1 * (1 - C / blocks) (>= 1).
 *   NONE   consecutive batches share blocks; with R ranks a rank reads B of
 *          every G = B * R samples: min(R, 1 + bt / (B * L)).
 *   BLOCK  a window's blocks stay cached (C >= working set): each block the
 *          rank touches is decoded once per window. A block is used by
 *          q = (bt + S - 1) / L samples, each taken by this rank with
 *          probability 1 / R, so R * (1 - (1 - 1/R)^q) * (L + bt / Bk) / S
 *          (the last factor: blocks split between two sample blocks). A cache
 *          smaller than the working set falls back toward c1.
 * R ranks on a shuffled order each decode the blocks their samples touch:
 * the model says how much of that work is theirs alone. */
enum { Z_WHY_FULL = 1, Z_WHY_CACHE = 2, Z_WHY_RANKS = 3 }; /* what makes the cost (*why) */
static double cost_model(const tf__zgeom *g, const zfacts *z, double C, int *why) {
    double S = (double)g->seq_len + 1, L = (double)g->seq_len;
    double bt = (double)z->tokens / (double)(z->blocks ? z->blocks : 1);
    double NB = (double)z->blocks, R = (double)(g->world_size ? g->world_size : 1);
    double c1 = (bt + S - 1) / S;
    double r;
    *why = 0;
    if (C >= NB) return 1.0; /* everything fits: each block is decoded once */
    switch (g->shuffle) {
    case TF_SHUFFLE_NONE: {
        double B = (double)(g->batch_size ? g->batch_size : 1);
        r = 1 + bt / (B * L);
        if (r > R) r = R;
        if (R == 1) r = 1;
        *why = Z_WHY_RANKS;
        break;
    }
    case TF_SHUFFLE_BLOCK: {
        double q = (bt + S - 1) / L;
        double touch = R == 1 ? 1.0 : 1.0 - pow_model(1.0 - 1.0 / R, q);
        double Bk = (double)(g->block_size ? g->block_size : 1);
        r = R * touch * (L + bt / Bk) / S;
        *why = Z_WHY_RANKS;
        double ws = window_blocks(g, z) * touch;
        if (ws > NB) ws = NB;
        if (C < ws) {
            double miss = c1 * (1 - C / ws);
            if (miss > r) r = miss, *why = Z_WHY_CACHE;
        }
        break;
    }
    default:
        r = c1 * (1 - C / NB);
        *why = Z_WHY_FULL;
        break;
    }
    return r < 1 ? 1 : r;
}

static void human_bytes(char *out, size_t cap, double b) {
    if (b >= 1024.0 * 1024 * 1024) snprintf(out, cap, "%.1f GiB", b / (1024.0 * 1024 * 1024));
    else if (b >= 1024.0 * 1024) snprintf(out, cap, "%.0f MiB", ceil_pos(b / (1024.0 * 1024)));
    else snprintf(out, cap, "%.0f KiB", ceil_pos(b / 1024.0));
}

/* ------------------------------------------------------------------------ */
/* table                                                                     */
/* ------------------------------------------------------------------------ */

static uint32_t hash_of(const tf__zcache *c, uint64_t file, uint64_t block) {
    return (uint32_t)(tf__mix64(file * 0x9E3779B97F4A7C15ULL ^ block) & (c->nbucket - 1));
}

static void lru_unlink(tf__zcache *c, uint32_t i) {
    tf__zent *e = &c->e[i];
    if (e->prev != Z_NIL) c->e[e->prev].next = e->next;
    else c->head = e->next;
    if (e->next != Z_NIL) c->e[e->next].prev = e->prev;
    else c->tail = e->prev;
    e->prev = e->next = Z_NIL;
}

/* Link entry i (unlinked) in between prev and next, neighbours in the list
 * (Z_NIL: i becomes that end of it). */
static void lru_link(tf__zcache *c, uint32_t i, uint32_t prev, uint32_t next) {
    c->e[i].prev = prev;
    c->e[i].next = next;
    if (prev != Z_NIL) c->e[prev].next = i;
    else c->head = i;
    if (next != Z_NIL) c->e[next].prev = i;
    else c->tail = i;
}

static void lru_push_head(tf__zcache *c, uint32_t i) { lru_link(c, i, Z_NIL, c->head); }
static void lru_push_tail(tf__zcache *c, uint32_t i) { lru_link(c, i, c->tail, Z_NIL); }

static uint32_t find(const tf__zcache *c, uint64_t file, uint64_t block) {
    for (uint32_t i = c->bucket[hash_of(c, file, block)]; i != Z_NIL; i = c->e[i].hnext)
        if (c->e[i].file == file && c->e[i].block == block) return i;
    return Z_NIL;
}

static void hash_insert(tf__zcache *c, uint32_t i) {
    uint32_t h = hash_of(c, c->e[i].file, c->e[i].block);
    c->e[i].hnext = c->bucket[h];
    c->bucket[h] = i;
}

static void hash_remove(tf__zcache *c, uint32_t i) {
    uint32_t *p = &c->bucket[hash_of(c, c->e[i].file, c->e[i].block)];
    while (*p != Z_NIL && *p != i) p = &c->e[*p].hnext;
    if (*p == i) *p = c->e[i].hnext;
    c->e[i].hnext = Z_NIL;
}

/* Every entry empty, unlinked from the hash, in the list in index order. */
static void reset_table(tf__zcache *c) {
    for (uint32_t b = 0; b < c->nbucket; b++) c->bucket[b] = Z_NIL;
    c->head = c->tail = Z_NIL;
    for (uint32_t i = 0; i < c->n; i++) {
        c->e[i].state = Z_EMPTY;
        c->e[i].pins = 0;
        c->e[i].hnext = Z_NIL;
        lru_push_tail(c, i);
    }
}

static int init_sync(tf__zcache *c) {
    if (pthread_mutex_init(&c->mu, NULL) != 0) return -ENOMEM;
    if (pthread_cond_init(&c->loaded, NULL) != 0) {
        pthread_mutex_destroy(&c->mu);
        return -ENOMEM;
    }
    return 0;
}

int tf__zcache_create(const tf_dataset *ds, const tf__zgeom *g, tf__zcache **out) {
    *out = NULL;
    zfacts z;
    TF_TRY(gather(ds, &z));
    if (!z.blocks) return 0;
    double want;
    int capped = 0;
    double floor_n = (double)g->nthreads + 1;
    if (g->cache_bytes) {
        /* As asked, even below one entry per worker: workers that find every
         * entry in use decode into their own buffer, uncached. */
        want = floor_pos((double)g->cache_bytes / (double)z.blk_bytes);
        if (want < 1) want = 1;
        if (want > (double)z.blocks + floor_n) want = (double)z.blocks + floor_n; /* more is useless */
    } else {
        want = needed_entries(g, &z);
        if (want > (double)z.blocks + floor_n) want = (double)z.blocks + floor_n;
        if (want * (double)z.blk_bytes > (double)TF__ZCACHE_AUTO_MAX) {
            want = floor_pos((double)TF__ZCACHE_AUTO_MAX / (double)z.blk_bytes);
            capped = 1;
        }
        if (want < floor_n) want = floor_n;
    }
    if (want > Z_MAX_ENTRIES) want = Z_MAX_ENTRIES;

    tf__zcache *c = calloc(1, sizeof *c);
    if (!c) return -ENOMEM;
    c->n = (uint32_t)want;
    c->blk_bytes = z.blk_bytes;
    c->nbucket = 1;
    while (c->nbucket < 2 * c->n) c->nbucket <<= 1;
    c->e = calloc(c->n, sizeof *c->e);
    c->bucket = malloc((size_t)c->nbucket * sizeof *c->bucket);
    c->arena_len = (size_t)c->n * c->blk_bytes;
    void *a = mmap(NULL, c->arena_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    c->arena = a == MAP_FAILED ? NULL : a;
    if (!c->e || !c->bucket || !c->arena || init_sync(c)) {
        if (c->arena) munmap(c->arena, c->arena_len);
        free(c->e);
        free(c->bucket);
        size_t len = c->arena_len;
        free(c);
        if (a == MAP_FAILED)
            TF_FAIL(-ENOMEM, "cannot reserve %zu bytes for the zstd block cache: lower zstd_cache_bytes", len);
        return -ENOMEM;
    }
#ifdef MADV_HUGEPAGE
    if (c->arena_len >= (2u << 20)) madvise(c->arena, c->arena_len, MADV_HUGEPAGE); /* best effort */
#endif
    reset_table(c);
    atomic_init(&c->allocated, 0);
#define Z_ZERO(f) atomic_init(&c->f, 0);
    Z_COUNTERS(Z_ZERO)
#undef Z_ZERO

    /* The pins held by workers are not available for reuse. */
    double usable = (double)c->n - g->nthreads;
    int why;
    c->model = cost_model(g, &z, usable < 1 ? 1 : usable, &why);
    char need_s[24], have_s[24];
    human_bytes(have_s, sizeof have_s, (double)c->n * (double)z.blk_bytes);
    human_bytes(need_s, sizeof need_s, needed_entries(g, &z) * (double)z.blk_bytes);
    unsigned long long bt = (unsigned long long)z.bt_max, L2 = 2 * (unsigned long long)g->seq_len;
    if (capped)
        snprintf(c->note, sizeof c->note,
                 "the block-shuffle window needs %.12s of decompressed zstd blocks, the cache stops at %.12s: "
                 "set zstd_cache_bytes, or lower block_size x window_blocks",
                 need_s, have_s);
    else if (c->model > TF__ZCOST_WARN && why == Z_WHY_FULL)
        snprintf(c->note, sizeof c->note,
                 "decodes ~%.0fx the zstd tokens it delivers: a full shuffle decodes a %llu-token block per "
                 "sample. Pass shuffle='block', or run tokenfeed convert DIR NEW --compression zstd --block-tokens %llu",
                 c->model, bt, L2);
    else if (c->model > TF__ZCOST_WARN && why == Z_WHY_CACHE)
        snprintf(c->note, sizeof c->note,
                 "decodes ~%.0fx the zstd tokens it delivers: zstd_cache_bytes gives %.12s, one block-shuffle "
                 "window needs %.12s. Raise it, or leave it at 0 (sized from the window)",
                 c->model, have_s, need_s);
    else if (c->model > TF__ZCOST_WARN)
        snprintf(c->note, sizeof c->note,
                 "decodes ~%.0fx the zstd tokens it delivers: each of the %llu ranks decodes the %llu-token "
                 "blocks its samples touch. Run tokenfeed convert DIR NEW --compression zstd "
                 "--block-tokens %llu",
                 c->model, (unsigned long long)g->world_size, bt, L2);
    *out = c;
    return 0;
}

void tf__zcache_free(tf__zcache *c) {
    if (!c) return;
    munmap(c->arena, c->arena_len);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->loaded);
    free(c->e);
    free(c->bucket);
    free(c);
}

int tf__zcache_after_fork(tf__zcache *c) {
    if (!c) return 0;
    TF_TRY(init_sync(c)); /* the parent's mutex may have been held: never touch it */
    reset_table(c);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* reads                                                                     */
/* ------------------------------------------------------------------------ */

/* Drop h's pin. mu held. */
static void unpin_locked(tf__zhold *h) {
    if (h->pinned) h->pinned->pins--;
    h->pinned = NULL;
    h->data = NULL;
}

/* Make block b of file fi (f) available in h->data: from the cache, by
 * waiting for the worker that decodes it, or by decoding it. */
static int acquire(tf__zcache *c, tf__zhold *h, const tf_file *f, uint64_t fi, uint64_t b) {
    pthread_mutex_lock(&c->mu);
    unpin_locked(h);
    uint32_t i;
    for (;;) {
        i = find(c, fi, b);
        if (i == Z_NIL) break;
        tf__zent *e = &c->e[i];
        if (e->state == Z_READY) {
            e->pins++;
            lru_unlink(c, i);
            lru_push_head(c, i);
            pthread_mutex_unlock(&c->mu);
            atomic_fetch_add_explicit(&c->hits, 1, memory_order_relaxed);
            h->pinned = e;
            h->data = e->buf;
            h->file = fi;
            h->block = b;
            return 0;
        }
        /* Another worker is decoding it: wait rather than decode it twice. */
        atomic_fetch_add_explicit(&c->waits, 1, memory_order_relaxed);
        pthread_cond_wait(&c->loaded, &c->mu);
    }
    atomic_fetch_add_explicit(&c->misses, 1, memory_order_relaxed);
    /* Victim: least recently used entry that nobody reads or loads. */
    uint32_t v = c->tail;
    while (v != Z_NIL && (c->e[v].pins || c->e[v].state == Z_LOADING)) v = c->e[v].prev;
    uint64_t first = b * f->blocks.tokens;
    uint64_t ntok = f->num_tokens - first < f->blocks.tokens ? f->num_tokens - first : f->blocks.tokens;
    uint64_t stored = 0;
    int rc;
    if (v == Z_NIL) {
        /* Every entry is in use (a capacity below workers + 1): decode
         * privately, uncached. The scratch is stored in h before any mapped
         * byte is read. */
        pthread_mutex_unlock(&c->mu);
        if (h->scratch_cap < c->blk_bytes) {
            uint8_t *p = realloc(h->scratch, c->blk_bytes);
            if (!p) return -ENOMEM;
            h->scratch = p;
            h->scratch_cap = c->blk_bytes;
        }
        rc = tf__file_read_block(f, b, h->scratch, h->scratch_cap, &stored);
        if (rc) return rc;
        h->data = h->scratch;
    } else {
        tf__zent *e = &c->e[v];
        if (!e->buf) {
            e->buf = c->arena + (size_t)v * c->blk_bytes;
            atomic_fetch_add_explicit(&c->allocated, c->blk_bytes, memory_order_relaxed);
        }
        if (e->state == Z_READY) hash_remove(c, v);
        e->file = fi;
        e->block = b;
        e->state = Z_LOADING;
        e->pins = 1;
        hash_insert(c, v);
        lru_unlink(c, v);
        lru_push_head(c, v);
        h->loading = e; /* before any mapped byte is read: see tf__zcache_abandon */
        pthread_mutex_unlock(&c->mu);

        rc = tf__file_read_block(f, b, e->buf, c->blk_bytes, &stored);

        pthread_mutex_lock(&c->mu);
        h->loading = NULL;
        if (rc) {
            hash_remove(c, v);
            e->state = Z_EMPTY;
            e->pins = 0;
            lru_unlink(c, v);
            lru_push_tail(c, v);
        } else {
            e->state = Z_READY;
            h->pinned = e;
            h->data = e->buf;
        }
        pthread_cond_broadcast(&c->loaded);
        pthread_mutex_unlock(&c->mu);
        if (rc) return rc;
    }
    h->file = fi;
    h->block = b;
    h->decoded_bytes += stored;
    atomic_fetch_add_explicit(&c->blocks_decoded, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&c->tokens_decoded, ntok, memory_order_relaxed);
    return 0;
}

int tf__zcache_read(tf__zcache *c, tf__zhold *h, const tf_dataset *ds, uint64_t fi, uint64_t start, uint64_t count,
                    void *out, tf_dtype out_dtype) {
    const tf_file *f = &ds->files[fi];
    size_t isz = tf_dtype_size(f->dtype), osz = tf_dtype_size(out_dtype);
    uint64_t bt = f->blocks.tokens;
    if (!bt) TF_FAIL(-TF_EFORMAT, "%s: block_tokens: expected > 0, found 0", f->path);
    if (start > f->num_tokens || count > f->num_tokens - start)
        TF_FAIL(-ERANGE, "%s: tokens [%llu, %llu) out of range (%llu tokens)", f->path, (unsigned long long)start,
                (unsigned long long)(start + count), (unsigned long long)f->num_tokens);
    uint8_t *o = out;
    h->used += count;
    while (count) {
        uint64_t b = start / bt, off = start % bt;
        uint64_t n = bt - off < count ? bt - off : count;
        if (!h->data || h->file != fi || h->block != b) TF_TRY(acquire(c, h, f, fi, b));
        tf_convert(o, out_dtype, h->data + off * isz, f->dtype, (size_t)n);
        o += n * osz;
        start += n;
        count -= n;
    }
    return 0;
}

void tf__zcache_prefetch(tf__zcache *c, const tf_dataset *ds, uint64_t tok, uint64_t ntok) {
    if (tok >= ds->num_tokens) return;
    uint64_t fi = tf__dataset_file_of(ds, tok);
    const tf_file *f = &ds->files[fi];
    if (!f->blocks.ops || !f->blocks.tokens) return;
    uint64_t local = tok - ds->tok_prefix[fi];
    const uint8_t *p = NULL;
    uint64_t off = local % f->blocks.tokens, n = f->blocks.tokens - off;
    if (n > ntok) n = ntok;
    pthread_mutex_lock(&c->mu);
    uint32_t i = find(c, fi, local / f->blocks.tokens);
    if (i != Z_NIL && c->e[i].state == Z_READY) p = c->e[i].buf + off * tf_dtype_size(f->dtype);
    pthread_mutex_unlock(&c->mu);
    /* The arena stays mapped while the loader lives, so prefetching a slot
     * that is reused meanwhile is harmless. */
    size_t bytes = (size_t)n * tf_dtype_size(f->dtype);
    for (size_t k = 0; p && k < bytes; k += 64) __builtin_prefetch(p + k, 0, 0);
}

void tf__zcache_release(tf__zcache *c, tf__zhold *h) {
    if (c && h->used) atomic_fetch_add_explicit(&c->tokens_used, h->used, memory_order_relaxed);
    h->used = 0;
    if (!c || !h->pinned) {
        h->data = NULL; /* scratch contents are not kept across fills */
        return;
    }
    pthread_mutex_lock(&c->mu);
    unpin_locked(h);
    pthread_mutex_unlock(&c->mu);
}

void tf__zcache_abandon(tf__zcache *c, tf__zhold *h) {
    if (!c) return;
    if (h->used) atomic_fetch_add_explicit(&c->tokens_used, h->used, memory_order_relaxed);
    h->used = 0;
    pthread_mutex_lock(&c->mu);
    tf__zent *e = h->loading;
    if (e) {
        uint32_t v = (uint32_t)(e - c->e);
        hash_remove(c, v);
        e->state = Z_EMPTY;
        e->pins = 0;
        lru_unlink(c, v);
        lru_push_tail(c, v);
        h->loading = NULL;
        pthread_cond_broadcast(&c->loaded);
    }
    unpin_locked(h);
    pthread_mutex_unlock(&c->mu);
}

void tf__zhold_destroy(tf__zhold *h) {
    free(h->scratch);
    memset(h, 0, sizeof *h);
}

void tf__zcache_info(tf__zcache *c, tf__zinfo *info) {
    memset(info, 0, sizeof *info);
    if (!c) return;
    info->entries = c->n;
    info->capacity_bytes = (uint64_t)c->n * c->blk_bytes;
    info->allocated_bytes = atomic_load(&c->allocated); /* no lock: may run in a forked child */
#define Z_LOAD(f) info->f = atomic_load(&c->f);
    Z_COUNTERS(Z_LOAD)
#undef Z_LOAD
    info->model = c->model;
    snprintf(info->note, sizeof info->note, "%s", c->note);
}
