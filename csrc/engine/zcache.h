/*
 * zcache.h — the decompressed-block cache that a loader's workers share
 * (zcache.c), and the cost model that sizes it. Private to the engine.
 */
#ifndef TF_ZCACHE_H
#define TF_ZCACHE_H

#include <stddef.h>
#include <stdint.h>

#include "../common/internal.h"
#include "../sources/source.h"

typedef struct tf__zcache tf__zcache;
typedef struct tf__zent tf__zent;

/* What a worker holds in the cache: at most one pinned entry (blocks it is
 * copying from) and at most one entry it is decompressing. Lives in the
 * worker, so that a fill abandoned by the SIGBUS guard can be cleaned up
 * (tf__zcache_abandon). */
typedef struct tf__zhold {
    tf__zent *pinned;
    uint64_t file, block;   /* key of `pinned` */
    const uint8_t *data;    /* its decompressed bytes */
    tf__zent *loading;
    uint8_t *scratch;       /* private block when every entry is pinned */
    size_t scratch_cap;
    uint64_t decoded_bytes; /* compressed bytes decoded by this worker (bytes_read) */
    uint64_t used;          /* tokens copied out since the last release (stats) */
} tf__zhold;

/* What sizes the cache and feeds the cost model: the loader's configuration. */
typedef struct tf__zgeom {
    tf_shuffle shuffle;
    tf_packing packing;
    uint64_t seq_len, block_size, window_blocks;
    uint64_t batch_size;   /* B: samples per rank per batch */
    uint64_t world_size;   /* R */
    uint64_t num_samples;  /* N of the order */
    size_t num_sources;    /* 1, or the sources of a mixture */
    int depth, nthreads;
    uint64_t cache_bytes;  /* requested capacity; 0 = sized from the window */
} tf__zgeom;

/* Facts about the cache and the model, for tf_loader_get_stats. */
typedef struct tf__zinfo {
    uint64_t capacity_bytes, allocated_bytes;
    uint64_t entries;
    uint64_t blocks_decoded, tokens_decoded, tokens_used;
    uint64_t hits, misses, waits;
    double model;          /* predicted tokens decoded per token used */
    char note[200];
} tf__zinfo;

/* Auto-sized caches stop at this many bytes (the loader config can ask for more). */
#define TF__ZCACHE_AUTO_MAX (1ull << 30)
/* A configuration predicted to decode more than this many tokens per token it
 * delivers gets a note (and a Python warning). */
#define TF__ZCOST_WARN 8.0

/* Build the cache of a loader over ds (the order's dataset). *out = NULL and 0
 * when ds has no compressed file. Entries are allocated here; their block
 * buffers on first use, then reused. */
TF_HIDDEN int tf__zcache_create(const tf_dataset *ds, const tf__zgeom *g, tf__zcache **out);
TF_HIDDEN void tf__zcache_free(tf__zcache *c);
/* In a fork()ed child: new lock, every entry empty (the parent's workers may
 * have been mid-update). Buffers are kept. */
TF_HIDDEN int tf__zcache_after_fork(tf__zcache *c);

/* Tokens [start, start + count) of compressed file fi, converted to out_dtype
 * into out. Uses and updates h (the caller's hold). */
TF_HIDDEN int tf__zcache_read(tf__zcache *c, tf__zhold *h, const tf_dataset *ds, uint64_t fi, uint64_t start,
                              uint64_t count, void *out, tf_dtype out_dtype);
/* Prefetch global tokens [tok, tok + ntok) (as far as their first block goes)
 * when they lie in a compressed file whose block is cached: a hint, which
 * does nothing otherwise. */
TF_HIDDEN void tf__zcache_prefetch(tf__zcache *c, const tf_dataset *ds, uint64_t tok, uint64_t ntok);
/* Drop h's pin (end of a fill). */
TF_HIDDEN void tf__zcache_release(tf__zcache *c, tf__zhold *h);
/* After a fill was abandoned mid-decode (SIGBUS): the entry being loaded is
 * emptied and its waiters woken; the pin is dropped. */
TF_HIDDEN void tf__zcache_abandon(tf__zcache *c, tf__zhold *h);
/* Free h's scratch (worker teardown; the pin must be released already). */
TF_HIDDEN void tf__zhold_destroy(tf__zhold *h);

TF_HIDDEN void tf__zcache_info(tf__zcache *c, tf__zinfo *info);

#endif
