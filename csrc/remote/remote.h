/*
 * remote.h — remote objects for the sources layer: the transport wrapper with
 * retries (remote.c), the fetch pool (remote.c) and the node-local chunk
 * cache shared by every process on the node (remote_cache.c).
 * docs/remote.md describes the behaviour; this header the pieces.
 *
 * Vocabulary:
 *   object    one remote file at one version (url, size, version/ETag).
 *   chunking  how an object's data region [data_off, data_off + data_len) is
 *             cut into chunks of chunk_bytes (the last one shorter). Bytes
 *             outside the region (headers, indices) are only read at open,
 *             directly, never through the cache.
 *   oid       128-bit identity of (url, size, version, data_off, data_len,
 *             chunk_bytes): a changed object or another chunking never shares
 *             chunks with this one.
 *   need      the stream position at which a process will next use a chunk
 *             (a loader's scheduler publishes them); eviction drops the chunk
 *             whose next use is farthest away.
 */
#ifndef TF_REMOTE_H
#define TF_REMOTE_H

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "../common/internal.h"
#include "../sources/source.h"

typedef struct tf__cache tf__cache; /* remote_cache.c */

/* No known next use: evicted first (most recently used first among them). */
#define TF__NO_NEED UINT64_MAX

typedef struct tf__ckey {
    uint64_t oid_lo, oid_hi;
    uint32_t chunk;
} tf__ckey;

/* One remote object as a dataset file uses it. Owned by the file; holds a
 * reference on its tf_remote. */
typedef struct tf__robj {
    tf_remote *r;
    char *url;             /* owned */
    tf_object_info info;
    uint64_t data_off, data_len; /* the chunked region */
    uint64_t chunk_bytes;
    uint32_t nchunks;
    uint64_t oid_lo, oid_hi;
    /* Optional per-granule XXH64 of the data region (native shards with a
     * chunk table): sums[g] covers [data_off + g * granule, + granule).
     * chunk_bytes is a multiple of granule. Owned (copied at set-up). */
    uint64_t *sums;
    uint64_t nsums;
    uint64_t granule;
    /* The node's metadata record this object's open used or wrote
     * (remote_meta.c): dropped when a read finds the object changed. */
    int meta_on;
    uint64_t meta_key;
    /* The tokens are read from memory: the first touch fetched the whole
     * (small) object, and every process of the node reads it back whole
     * from the cache. No reader needs a chunk of it, so the scheduler asks
     * for none (the data region would be fetched a second time). */
    int held_whole;
} tf__robj;


/* List objects under prefix through the transport (with retries), on the
 * fetch pool; emit runs on the calling thread once the listing is complete,
 * and may be called several times for one object if a retry restarts the
 * listing. -TF_EUNSUPPORTED when the transport cannot list; -EINTR at once
 * when the caller is interrupted (the request in flight is left to end). */
TF_HIDDEN int tf__remote_list(tf_remote *r, const char *prefix, tf_list_emit_fn emit, void *emit_ctx);
/* Whether r's transport can list. */
TF_HIDDEN int tf__remote_can_list(const tf_remote *r);

/* Stat url and make an object with the whole file as its data region. */
TF_HIDDEN int tf__robj_open(tf_remote *r, const char *url, tf__robj **out);
/* The version of a shard known from its dataset's catalog, when no listing
 * gave the store's own (remote_open.c): this prefix and a hash of the
 * catalog's entry. It keys the shard's chunks in the node's cache like an
 * ETag, so that a catalog describing other contents reads none of them, but
 * is never sent to the store: such a shard's reads are checked against the
 * catalog (its header) and its chunk checksums (its tokens) instead. */
#define TF__CATALOG_VERSION "tokenfeed-catalog:"
static inline int tf__version_from_catalog(const char *version) {
    return strncmp(version, TF__CATALOG_VERSION, sizeof TF__CATALOG_VERSION - 1) == 0;
}
/* Same, from an already known size/version (no request). */
TF_HIDDEN int tf__robj_from_info(tf_remote *r, const char *url, const tf_object_info *info,
                                 tf__robj **out);
TF_HIDDEN void tf__robj_free(tf__robj *o);
/* Re-cut the data region (before any chunk is read). sums may be NULL;
 * otherwise nsums entries of granule bytes each (copied); chunk_bytes is
 * rounded up to a multiple of granule. */
TF_HIDDEN int tf__robj_set_region(tf__robj *o, uint64_t data_off, uint64_t data_len, const uint64_t *sums,
                                  uint64_t nsums, uint64_t granule);

/* Read object bytes [off, off + len): through the cache inside the data
 * region, directly (uncached, with retries) outside it. */
TF_HIDDEN int tf__robj_read(const tf__robj *o, uint64_t off, uint64_t len, void *out);

/* A small read of data-region bytes [off, off + len) that cannot wait for
 * its chunk (not cached yet): fetched directly (and checked), while the
 * chunk is asked for. Returns 0 when out was filled, 1 when the caller should
 * go through the chunk (large read, chunk ready, or the direct read failed),
 * or a negative code. */
TF_HIDDEN int tf__robj_read_small(const tf__robj *o, uint64_t off, uint64_t len, void *out);

/* Uncached ranged reads with retries, concurrently on the fetch pool; every
 * request is tried even if one fails; returns the first failure in array
 * order, with its message. Each request reads into memory of its own, copied
 * into buf once it is done: an interrupted caller gets -EINTR at once, and
 * nothing writes into its buffers afterwards. */
typedef struct tf__rreq {
    const tf__robj *o;
    uint64_t off, len;
    void *buf;
    int rc; /* out */
} tf__rreq;
TF_HIDDEN int tf__remote_read_many(tf_remote *r, tf__rreq *reqs, size_t n);
/* The same through the node's chunk cache, shared by its processes: each
 * range is kept there as a chunk of its own, keyed by the object's URL,
 * version (ETag) and the range, sealed and checked as chunks are. A range
 * cached is read back with no request, one another process of the node is
 * fetching is waited for, the others are fetched (conditional on the
 * version) and kept. A range the cache has no room for (it never evicts a
 * chunk a reader needs for one) is read directly. */
TF_HIDDEN int tf__remote_read_many_shared(tf_remote *r, tf__rreq *reqs, size_t n);
/* On (1) for the calling thread while the requests it makes serve a read
 * ahead (the scheduler opening a shard known from a catalog before its
 * reader needs it): they queue behind every chunk a reader waits for. */
TF_HIDDEN void tf__remote_open_ahead(int on);
/* The sizes and versions of n objects (tf_remote_stat with retries),
 * concurrently on the fetch pool: rcs[i] is 0 (infos[i] filled), -ENOENT or
 * the failure of urls[i]. Returns the first failure in index order other than
 * -ENOENT, with its message; -EINTR at once when interrupted (as
 * tf__remote_read_many). */
TF_HIDDEN int tf__remote_stat_many(tf_remote *r, const char *const *urls, size_t n, tf_object_info *infos,
                                   int *rcs);

/* Hot path: chunk k of o, mapped and verified, valid until released. *data
 * points at the chunk's first byte (object offset data_off + k * chunk_bytes),
 * *len its length. Blocks while the chunk is fetched (by this process or
 * another). */
typedef struct tf__chunkref tf__chunkref;
TF_HIDDEN int tf__chunk_acquire(const tf__robj *o, uint32_t k, const uint8_t **data, size_t *len,
                                tf__chunkref **ref);
TF_HIDDEN void tf__chunk_release(tf__chunkref *ref);

/* Scheduler side: ask for chunk k of o to be fetched ahead (no-op when it is
 * cached or already asked for), to be used at stream position next_use.
 * Lower next_use is fetched first. */
TF_HIDDEN void tf__chunk_want(const tf__robj *o, uint32_t k, uint64_t next_use);
/* Publish next uses of cached chunks (one lock for the batch) and this
 * process's consumer position (needs below it are stale). */
TF_HIDDEN void tf__remote_publish(tf_remote *r, const tf__ckey *keys, const uint64_t *next_use, size_t n,
                                  uint64_t position);
/* The stream position the calling thread is reading for (an engine worker
 * filling a batch sets it): chunks it has to fetch itself are published as
 * needed there. UINT64_MAX (the default) when unknown. Per thread. */
TF_HIDDEN void tf__remote_set_reader_position(uint64_t pos);

/* The cache of r (for the metadata record kept beside the chunks). */
TF_HIDDEN tf__cache *tf__remote_cache(const tf_remote *r);

/* Whether chunk k of o is on this node's disk now (a hint). */
TF_HIDDEN int tf__chunk_cached(const tf__robj *o, uint32_t k);
/* Bytes the scheduler may keep requested ahead. */
TF_HIDDEN uint64_t tf__remote_prefetch_bytes(const tf_remote *r);
TF_HIDDEN tf_remote *tf__remote_ref(tf_remote *r);

/* ---- remote_open.c: remote files for the format parsers ---------------- */

/* Open the URLs urls[0, n) (remote objects read through remote, which may be
 * NULL only to fail with a message) and append their files, as the sources
 * layer does for local paths: their bytes come through the remote byte
 * provider (tf__remote_byte_ops). */
TF_HIDDEN int tf__open_remote_many(const char *const *urls, size_t n, const tf_open_options *opt,
                                   tf_remote *remote, tf_file **files, uint64_t *nfiles, uint64_t *cap);
/* The remote object behind f, or NULL when f is not read through the remote
 * provider. */
TF_HIDDEN const tf__robj *tf__file_robj(const tf_file *f);

/* ---- remote_registry.c: objects prepared by a remote open --------------- */

/* A byte range of an object that the open has (fetched, or read from the
 * node's metadata record); copy holds its bytes while the open records them
 * for the node (NULL otherwise). */
typedef struct tf__prange {
    uint64_t off, len;
    uint8_t *copy;
} tf__prange;

/* An object a remote open (remote_open.c) prepares for the parsers: its size
 * and version, and a sparse anonymous map of its size with the bytes they
 * read filled in. */
typedef struct tf__pobj {
    char *url;
    int known;  /* size/version known */
    int exists;
    tf_object_info info;
    uint8_t *map; /* NULL when the object is empty */
    int whole;    /* every byte fetched */
    int claimed;  /* handed to a parser (the file owns the map now) */
    uint64_t head, tail; /* fetched: [0, head) and [tail, size) */
    tf__prange *got;     /* the ranges in map */
    size_t ngot, capgot;
} tf__pobj;

typedef struct tf__preg {
    tf_remote *r;
    tf__pobj *o;
    size_t n, cap;
    size_t *slots;      /* hash table of URL -> index + 1 (0: empty) */
    size_t nslots;      /* a power of two, at least twice n */
    int meta_on;        /* the node's metadata record is in use for this open */
    uint64_t meta_key;  /* its key (tf__meta_key) */
    int record;         /* keep copies of the bytes fetched, to write the record */
    uint64_t record_max; /* bytes a record may hold (tf__meta_max_bytes) */
    uint64_t recorded;  /* bytes kept so far */
    int too_big;        /* the record would pass its bound: not written */
    int fetched;        /* this open sent requests (sizes or bytes) */
    int shared;         /* ranges through the node's chunk cache (a first touch) */
    unsigned list_flags; /* TF_OPEN_IMMUTABLE: a recorded listing of any age is trusted */
} tf__preg;

/* Make g the calling thread's registry (NULL: none) for the parsers' reads:
 * the file primitives (file.c) take URLs from it through the open hooks
 * (tf__open_hooks_enter). */
TF_HIDDEN int tf__preg_enter(tf__preg *g);
TF_HIDDEN tf__pobj *tf__preg_find(tf__preg *g, const char *url);
TF_HIDDEN tf__pobj *tf__preg_add(tf__preg *g, const char *url);
/* Unmap what no parser claimed; free the entries. */
TF_HIDDEN void tf__preg_free(tf__preg *g);
/* Make p's sparse map (no bytes in it yet) when it has none. */
TF_HIDDEN int tf__pobj_map(tf__pobj *p);
/* Note that p's map holds [off, off + len); with copy, a copy of those bytes
 * is kept too (g->record). */
TF_HIDDEN int tf__pobj_note(tf__preg *g, tf__pobj *p, uint64_t off, uint64_t len);
/* Whether p's map holds every byte of [off, off + len). */
TF_HIDDEN int tf__pobj_has(const tf__pobj *p, uint64_t off, uint64_t len);

/* ---- remote_meta.c: the node's record of what remote opens fetched ------ */

/* The record's key: the URLs opened (in order) and the open options that
 * change what the parsers read or make of it. */
TF_HIDDEN uint64_t tf__meta_key(const char *const *urls, size_t n, const tf_open_options *opt);
/* The key of an open of the shard set prefix + pattern, urls as listed, from
 * its catalog beside the data (tf_dataset_open_remote_set). */
TF_HIDDEN uint64_t tf__meta_key_set(const char *const *urls, size_t n, const tf_open_options *opt, const char *prefix,
                                    const char *pattern);
/* Fill the (empty) registry g from the record of key: 0, or 1 when there is
 * none or it does not parse (g is left empty). Never fails the open. */
TF_HIDDEN int tf__meta_load(tf_remote *r, uint64_t key, tf__preg *g);
/* A record's bytes b[0, len) before its seal into the (empty) registry g:
 * 0, or -1 when they do not parse (g is left empty). */
TF_HIDDEN int tf__meta_parse(const uint8_t *b, size_t len, uint64_t key, tf__preg *g);
/* Write what g fetched as the record of key (atomically; best effort). */
TF_HIDDEN void tf__meta_save(tf_remote *r, uint64_t key, const tf__preg *g);
/* Take the lock of key's record, waiting while another process of the node
 * holds it (it is fetching): 0 with *fd the lock held (-1: none could be had,
 * fetch without) and *waited set when another process held it; -EINTR when
 * interrupted. A wait is bounded; the kernel drops a dead holder's lock. */
TF_HIDDEN int tf__meta_lock(tf_remote *r, uint64_t key, const char *what, int *fd, int *waited);
TF_HIDDEN void tf__meta_unlock(int fd);
/* Bytes the records of a cache may hold together: an eighth of the cache
 * limit, at most 4 GiB. */
TF_HIDDEN uint64_t tf__meta_max_bytes(const tf_remote *r);

/* ---- remote_spec.c: remote path specs, one listing per node ------------- */

/* Every object under a prefix, as one listing showed it: sorted by URL. */
typedef struct tf__objlist {
    char **urls;
    tf_object_info *infos;
    size_t n, cap;
    int rc; /* (while listing) */
} tf__objlist;
TF_HIDDEN void tf__objlist_free(tf__objlist *v);
/* Seconds a recorded listing is trusted for by age ($TOKENFEED_LISTING_MAX_AGE,
 * default 60), in ns. */
TF_HIDDEN uint64_t tf__listing_max_age_ns(void);
/* The objects under prefix, from the node's recorded listing when it is
 * trusted (remote_spec.c), else listed (once per node: the node's other
 * processes wait for it) and recorded. -TF_EUNSUPPORTED when the transport
 * cannot list; -EINTR when interrupted. */
TF_HIDDEN int tf__remote_objects(tf_remote *r, const char *prefix, unsigned flags, tf__objlist *v);
/* tf__remote_list through the node's recorded listing (tf__remote_objects). */
TF_HIDDEN int tf__remote_list_node(tf_remote *r, const char *prefix, unsigned flags, tf_list_emit_fn emit,
                                   void *emit_ctx);
/* Make v (the listing of prefix) the one this thread's listings of prefix or
 * below it are answered from, until called again with NULLs. */
TF_HIDDEN void tf__listing_in_use(const char *prefix, const tf__objlist *v);
/* The files a remote spec names (a glob, a directory URL of foreign files;
 * else the URL itself), and the listing they came from with its prefix
 * (*prefix NULL when none was made). */
TF_HIDDEN int tf__remote_expand(tf_remote *r, const char *spec, const tf_open_options *opt, unsigned flags,
                                char ***files, size_t *nfiles, tf__objlist *listing, char **prefix);

/* ---- remote_prefetch.c: the scheduler ---------------------------------- */

/* One scheduler per loader: walks this rank's positions ahead of the
 * consumer and asks for their chunks in the order of first use. locate()
 * calls emit for each chunk the sample at global position pos needs (it runs
 * on the scheduler's thread). Local index i is the i-th sample this rank
 * receives after a seek: global position base + (i / B) * G + rank * B + i % B. */
typedef void (*tf__prefetch_emit_fn)(void *ectx, const tf__robj *o, uint32_t k);
typedef int (*tf__prefetch_locate_fn)(void *ctx, uint64_t pos, tf__prefetch_emit_fn emit, void *ectx);
typedef struct tf__prefetch tf__prefetch;
/* end_index: local indices in the stream (UINT64_MAX for an infinite one;
 * each seek sets it anew). Holds a reference on r; the thread starts at the
 * first seek/advance. */
TF_HIDDEN int tf__prefetch_create(tf_remote *r, tf__prefetch_locate_fn locate, void *ctx, uint64_t B, uint64_t G,
                                  uint64_t rank, uint64_t end_index, tf__prefetch **out);
/* The consumer restarts at local index consumer_index of a stream whose index
 * 0 is global position base and that ends before local index end_index
 * (UINT64_MAX: never): the window is rebuilt. */
TF_HIDDEN void tf__prefetch_seek(tf__prefetch *p, uint64_t base, uint64_t consumer_index, uint64_t end_index);
/* The consumer moved on (local index of the next sample it will receive). */
TF_HIDDEN void tf__prefetch_advance(tf__prefetch *p, uint64_t consumer_index);
/* In a fork()ed child: forget the parent's thread (a new one starts on the
 * next seek/advance). */
TF_HIDDEN void tf__prefetch_forget_thread(tf__prefetch *p);
TF_HIDDEN void tf__prefetch_free(tf__prefetch *p);
TF_HIDDEN void tf__prefetch_stats(tf__prefetch *p, uint64_t *walked, uint64_t *wants, uint64_t *window_bytes);

/* ---- remote_cache.c: the cache directory and its shared index ----------- */

typedef struct tf__cache tf__cache;

/* Open (creating if needed) the cache in dir and take a process slot.
 * chunk_bytes sizes the index of a new cache (0: 1 MiB). */
TF_HIDDEN int tf__cache_open(const char *dir, uint64_t limit, uint64_t chunk_bytes, int create, tf__cache **out);
TF_HIDDEN void tf__cache_close(tf__cache *c);
/* After fork(): take a new slot for the child (the parent keeps its own). */
TF_HIDDEN int tf__cache_after_fork(tf__cache *c);
TF_HIDDEN const char *tf__cache_dir(const tf__cache *c);
/* The cache's meta/ directory (checked at open like the others), or -1 when
 * it could not be had: no metadata record then. */
TF_HIDDEN int tf__cache_meta_fd(const tf__cache *c);
/* The name in meta/ of the metadata record of key (ext "tfmeta") or of its
 * lock (ext "lock"). */
TF_HIDDEN void tf__cache_meta_name(uint64_t key, const char *ext, char out[40]);
/* Remove the metadata record of key (remote_meta.c): an object it describes
 * changed. */
TF_HIDDEN void tf__cache_meta_forget(tf__cache *c, uint64_t key);
/* Delete every recorded listing (the .tflist files of meta/, remote_spec.c): an object was
 * found changed. */
TF_HIDDEN void tf__cache_listings_forget(tf__cache *c);

/* Outcome of tf__cache_begin. */
enum {
    TF__BEGIN_PRESENT = 0,  /* already cached: nothing to fetch */
    TF__BEGIN_FETCH = 1,    /* reserved: the caller fetches, then commits or aborts */
    TF__BEGIN_OTHER = 2,    /* a live process fetches it: wait and look again */
    TF__BEGIN_NOSPACE = 3,  /* every cached chunk is needed sooner: try later */
};
/* Look up key; when absent, reserve bytes for it (evicting the chunks whose
 * next use is farthest away, but only ones needed later than next_use; with
 * urgent set, any chunk). Returns a TF__BEGIN_* value or a negative code. */
TF_HIDDEN int tf__cache_begin(tf__cache *c, const tf__ckey *key, uint64_t bytes, uint64_t next_use, int urgent,
                              uint64_t *evicted_chunks, uint64_t *evicted_bytes);
/* Land a fetched chunk: data (len bytes) is written to a temporary file with
 * its trailer and renamed into place; the record becomes present. With
 * map_out, the file is also mapped (before the rename) and returned. On error
 * (ENOSPC...) nothing is left behind and the reservation is dropped. */
TF_HIDDEN int tf__cache_commit(tf__cache *c, const tf__ckey *key, const char *url, const tf_object_info *info,
                               const void *data, size_t len, uint64_t next_use, void **map_out, size_t *map_len_out);
TF_HIDDEN void tf__cache_abort(tf__cache *c, const tf__ckey *key);
/* Map the cached chunk read-only and verify its trailer and hash (and, when
 * sums is not NULL, its granule checksums). Returns 0, -ENOENT (not cached),
 * or -TF_ECHECKSUM (corrupt: the file was removed). */
TF_HIDDEN int tf__cache_map(tf__cache *c, const tf__ckey *key, size_t len, const uint64_t *sums, size_t nsums,
                            uint64_t granule, void **map, size_t *map_len);
TF_HIDDEN void tf__cache_unmap(void *map, size_t map_len);
/* Forget a chunk (remove its file and record): a corrupted one. */
TF_HIDDEN void tf__cache_forget(tf__cache *c, const tf__ckey *key);
TF_HIDDEN void tf__cache_publish(tf__cache *c, const tf__ckey *keys, const uint64_t *next_use, size_t n,
                                 uint64_t position);
TF_HIDDEN int tf__cache_present(tf__cache *c, const tf__ckey *key);
/* Whether another live process of the node is fetching key now. */
TF_HIDDEN int tf__cache_fetching_elsewhere(tf__cache *c, const tf__ckey *key);
/* A counter bumped (in the shared index) whenever a chunk leaves the cache:
 * a reader holding mappings revalidates them when it moved. Lock-free. */
TF_HIDDEN uint64_t tf__cache_evictions(const tf__cache *c);
TF_HIDDEN void tf__cache_usage(tf__cache *c, uint64_t *bytes, uint64_t *limit);

/* The limit in force: the one given, or the cache's default (recorded in its
 * index by the process that created it: the same for every process). */
TF_HIDDEN uint64_t tf__cache_limit(const tf__cache *c);
/* -ENOSPC (with a message naming the directory) when a chunk could not be
 * written since the last call because the disk is full, else 0: readers that
 * do not wait for chunks (small direct reads) learn of it this way. */
TF_HIDDEN int tf__cache_failed(tf__cache *c);
/* A reader was told of the full disk by its own fetch's failure: the next
 * tf__cache_failed does not say it again. */
TF_HIDDEN void tf__cache_failure_said(tf__cache *c);
/* Whether data[0, len) followed by its trailer is chunk k of this cache (the
 * trailer's tag is keyed by the cache's secret). */
TF_HIDDEN int tf__cache_trailer_ok(const tf__cache *c, const tf__ckey *k, const void *data, size_t len);

/* Other files of the cache authenticated as chunks are: their XXH64 seeded
 * with tf__cache_seed (as secret as the cache's key), sealed with SipHash
 * keyed by the key, after an 8-byte magic naming the kind of file. Only a
 * process that can read the key (this user's) can make a seal that holds. */
TF_HIDDEN uint64_t tf__cache_seed(const tf__cache *c);
TF_HIDDEN uint64_t tf__cache_seal(const tf__cache *c, const char magic[8], uint64_t digest);

/* Chunk file trailer (docs/remote.md). */
#define TF__CHUNK_MAGIC "TFCHUNK2"
#define TF__CHUNK_TRAILER 40u

#endif
