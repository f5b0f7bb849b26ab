/*
 * file.c — one file of a dataset (tf_file): how its bytes are obtained and
 * read. Every format parser and the dataset use these primitives; nothing
 * here knows a format.
 *
 *   - Mapping: tf__map_file maps a whole file read-only (and arms the SIGBUS
 *     guard, common/sigbus.c); tf__release_pages drops the pages touched while
 *     checking headers from this process's RSS; tf__file_close unmaps and frees.
 *   - Identity: tf__sampled_fingerprint hashes a file's size and a page at
 *     each end, so that opening stays O(1) per file.
 *   - Reading: documents (tf__file_document, tf__file_find_document) and
 *     tokens (tf__file_read), from the mapping or, for a compressed file,
 *     through the block ops its parser installed (f->blocks.ops).
 *   - Guarding: tf__files_guard runs code that touches mapped bytes so that a
 *     file truncated under the mapping gives -EIO naming the file.
 *
 * Today every byte comes from a local mapping (or, for memory datasets, a heap
 * copy). This file is the one place to change for another way of obtaining
 * bytes (a range reader over object storage, say): parsers and the dataset
 * only see tf_file and these functions.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "safe_fs.h"
#include "source.h"

typedef unsigned long long ull;

/* ------------------------------------------------------------------------ */
/* mapping and identity                                                      */
/* ------------------------------------------------------------------------ */

/* The process's memory mappings and the kernel's limit on them
 * (vm.max_map_count). 0 when both could be read. Test builds:
 * $TOKENFEED_FAULT_MAP_LIMIT=N stands for the limit, and mapping a file fails
 * with ENOMEM once N mappings exist. */
static int map_count(uint64_t *count, uint64_t *limit) {
    *count = *limit = 0;
#ifdef TF_TEST_HOOKS
    const char *fake = getenv("TOKENFEED_FAULT_MAP_LIMIT");
    if (fake && *fake) *limit = strtoull(fake, NULL, 10);
#endif
    FILE *fp;
    if (!*limit && (fp = fopen("/proc/sys/vm/max_map_count", "re"))) {
        unsigned long long v = 0;
        if (fscanf(fp, "%llu", &v) == 1) *limit = v;
        fclose(fp);
    }
    if (!(fp = fopen("/proc/self/maps", "re"))) return -1;
    int c;
    while ((c = getc(fp)) != EOF)
        if (c == '\n') ++*count;
    fclose(fp);
    return *limit ? 0 : -1;
}

/* A mapping refused with ENOMEM: out of mappings rather than of memory? */
static int map_failed(const char *path, long long size, int e) {
    uint64_t count, limit;
    if (e == ENOMEM && map_count(&count, &limit) == 0 && count + 16 >= limit)
        TF_FAIL(-EMFILE, "%s: cannot map the file: the process has %llu memory mappings, at the kernel's limit vm.max_map_count = %llu (every mapped file takes one, two with an index file; a dataset of several files keeps at most $TOKENFEED_MAX_OPEN_SHARDS = %llu of them mapped). Lower TOKENFEED_MAX_OPEN_SHARDS, write the data into fewer, larger shards (DatasetWriter's shard_tokens, tokenfeed convert), or raise the limit as root: sysctl -w vm.max_map_count=%llu.",
                path, (unsigned long long)count, (unsigned long long)limit, (unsigned long long)tf__lazy_limit(),
                (unsigned long long)(limit * 4 > 1048576 ? limit * 4 : 1048576));
    TF_FAIL(-e, "%s: cannot map %lld bytes: %s", path, size, strerror(e));
}

/* The open hooks of the calling thread (tf__open_hooks_enter). */
static pthread_key_t hooks_key;
static pthread_once_t hooks_once = PTHREAD_ONCE_INIT;
static int hooks_key_ok;
static void hooks_init(void) { hooks_key_ok = pthread_key_create(&hooks_key, NULL) == 0; }

static const tf__open_hooks *open_hooks(void) {
    pthread_once(&hooks_once, hooks_init);
    return hooks_key_ok ? pthread_getspecific(hooks_key) : NULL;
}

int tf__open_hooks_enter(const tf__open_hooks *h) {
    pthread_once(&hooks_once, hooks_init);
    if (!hooks_key_ok) return -ENOMEM;
    return pthread_setspecific(hooks_key, h) == 0 ? 0 : -ENOMEM;
}

static void id_of_stat(const struct stat *st, tf__file_id *id) {
    id->dev = (uint64_t)st->st_dev;
    id->ino = (uint64_t)st->st_ino;
    id->size = (uint64_t)st->st_size;
    id->mtime_ns = (uint64_t)st->st_mtim.tv_sec * 1000000000ull + (uint64_t)st->st_mtim.tv_nsec;
    id->known = 1;
}

static int map_file_id(const char *path, void **map, size_t *len, tf__file_id *id);

int tf__map_file(const char *path, void **map, size_t *len) { return map_file_id(path, map, len, NULL); }

/* Files larger than this are looked at without read-around (see below). */
#define TF_NZ_AROUND ((size_t)1 << 20)

int tf__map_file_main(const char *path, tf_file *f) {
    f->map_nz = 0;
    TF_TRY(map_file_id(path, &f->map, &f->map_len, &f->map_id));
    if (!f->map_id.known || !f->map || !f->map_len) return 0;
    /* The last page only, which the parsers' sampled fingerprint reads anyway:
     * looking further back would fault in pages no read needs (a sparse shard
     * of zeros would read 64 KiB per file at open). A last page of zeros
     * leaves map_nz 0, and check_tail then stats the path for a read that
     * ends in that page. */
    long ps = sysconf(_SC_PAGESIZE);
    size_t page = ps > 0 ? (size_t)ps : 4096;
    const uint8_t *m = f->map;
    size_t lo = (f->map_len - 1) / page * page;
    /* A large file: MADV_RANDOM while looking, as the fingerprint samples, or
     * the fault on the last page reads the kernel's read-around window with
     * it (up to megabytes: 1.4 ms per file on a cold page cache here, 15 s
     * instead of 1.5 s to open 10^4 sparse shards). A small file is left to
     * read-around, which brings the whole file in one read that the parser's
     * reads of its header and tables then find in the page cache. */
    int advise = f->map_len > TF_NZ_AROUND;
    if (advise) madvise(f->map, f->map_len, MADV_RANDOM);
    for (size_t q = f->map_len; q > lo; q--)
        if (m[q - 1]) {
            f->map_nz = q;
            break;
        }
    if (advise) madvise(f->map, f->map_len, MADV_NORMAL);
    return 0;
}

static int map_file_id(const char *path, void **map, size_t *len, tf__file_id *id) {
    *map = NULL;
    *len = 0;
    if (id) memset(id, 0, sizeof *id);
    /* a URL: the map its provider prepared (metadata filled in) */
    if (tf__is_url(path)) {
        const tf__open_hooks *h = open_hooks();
        if (!h) TF_FAIL(-EINVAL, "%s: a remote object read outside of a remote open (internal error)", path);
        return h->map_take(path, map, len);
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        TF_FAIL(-e, "%s: cannot open: %s", path, strerror(e));
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        TF_FAIL(-e, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        TF_FAIL(-EINVAL, "%s: not a regular file", path);
    }
    if (id) id_of_stat(&st, id);
    if (st.st_size == 0) {
        close(fd);
        return 0;
    }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    int e = errno;
    close(fd);
#ifdef TF_TEST_HOOKS
    uint64_t cnt, lim;
    if (m != MAP_FAILED && getenv("TOKENFEED_FAULT_MAP_LIMIT") && map_count(&cnt, &lim) == 0 && cnt >= lim) {
        munmap(m, (size_t)st.st_size);
        m = MAP_FAILED;
        e = ENOMEM;
    }
#endif
    if (m == MAP_FAILED) return map_failed(path, (long long)st.st_size, e);
    *map = m;
    *len = (size_t)st.st_size;
    tf__sigbus_install(); /* from now on a shrinking file may raise SIGBUS */
    return 0;
}

void tf__unmap(void *map, size_t len) {
    if (map && len) munmap(map, len);
}

int tf__file_exists(const char *path) {
    if (tf__is_url(path)) {
        const tf__open_hooks *h = open_hooks();
        return h && h->exists(path);
    }
    int listed = tf__listed_exists(path); /* a shard set's listing says (pathspec.c) */
    if (listed >= 0) return listed;
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

void tf__file_close(tf_file *f) {
    if (!f) return;
    tf__file_lazy_free(f);
    if (f->bytes_ops && f->bytes_ops->free) f->bytes_ops->free(f->bytes_src);
    free(f->meta);
    tf__unmap(f->map, f->map_len);
    tf__unmap(f->aux_map, f->aux_len);
    free(f->owned);
    tf__arena *ar = f->arena;
    if (!ar) {
        free(f->path);
        free(f->aux_path);
    }
    memset(f, 0, sizeof *f);
    if (ar) tf__arena_release(ar);
}

/* ---- arenas ---- */

#define ARENA_CHUNK ((size_t)1 << 20)

typedef struct arena_chunk {
    struct arena_chunk *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
} arena_chunk;

struct tf__arena {
    _Atomic uint64_t refs;
    arena_chunk *chunks; /* newest first: the one allocated from */
    size_t nchunks;
};

/* Chunks of an arena on transparent huge pages: the first ones only, as for
 * tables (safe_fs.h, TF_TABLE_HUGE_MAX): a fragmented machine compacts memory
 * for each huge page. */
#define ARENA_HUGE_CHUNKS 32

tf__arena *tf__arena_new(void) {
    tf__arena *a = calloc(1, sizeof *a);
    if (a) atomic_init(&a->refs, 1);
    return a;
}

void *tf__arena_alloc(tf__arena *a, size_t n) {
    if (n > SIZE_MAX / 2) return NULL;
    n = (n + 15) & ~(size_t)15;
    arena_chunk *c = a->chunks;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > ARENA_CHUNK - sizeof *c ? n : ARENA_CHUNK - sizeof *c;
        /* whole huge pages for the first ones (tf__table_alloc) */
        c = a->nchunks < ARENA_HUGE_CHUNKS ? tf__table_alloc(sizeof *c + cap, 0) : malloc(sizeof *c + cap);
        if (!c) return NULL;
        a->nchunks++;
        c->next = a->chunks;
        c->used = 0;
        c->cap = cap;
        a->chunks = c;
    }
    void *p = c->data + c->used;
    c->used += n;
    return p;
}

void tf__arena_ref(tf__arena *a) { atomic_fetch_add_explicit(&a->refs, 1, memory_order_relaxed); }

void tf__arena_release(tf__arena *a) {
    if (!a || atomic_fetch_sub_explicit(&a->refs, 1, memory_order_acq_rel) != 1) return;
    for (arena_chunk *c = a->chunks, *n; c; c = n) {
        n = c->next;
        free(c);
    }
    free(a);
}

tf_file *tf__files_push(tf_file **files, uint64_t *nfiles, uint64_t *cap) {
    if (*nfiles == *cap) {
        uint64_t nc = *cap ? *cap * 2 : 8;
        tf_file *nf = realloc(*files, nc * sizeof *nf);
        if (!nf) return NULL;
        *files = nf;
        *cap = nc;
    }
    tf_file *f = &(*files)[(*nfiles)++];
    memset(f, 0, sizeof *f);
    return f;
}

void tf__release_pages(const void *map, uint64_t len) {
    /* During a remote open the maps are anonymous, where MADV_DONTNEED
     * would zero the metadata just fetched. */
    if (open_hooks()) return;
    /* MADV_DONTNEED on a shared file mapping only drops this process's page
     * table entries; the page cache keeps the data and a later access maps it
     * again. Opening 10^4 shards would otherwise leave the header pages (and
     * their fault-around neighbours) counted in RSS. */
    if (map && len) madvise((void *)map, (size_t)len, MADV_DONTNEED);
}

uint64_t tf__sampled_fingerprint(const uint8_t *b, uint64_t len, uint64_t seed) {
    /* One page at each end: enough to tell files apart, and cheap at 10^4
     * shards. MADV_RANDOM while sampling keeps the two faults from pulling a
     * readahead window each into the page cache (hundreds of MB over many
     * shards); the mapping goes back to normal (sequential) advice after. */
    const uint64_t S = 4096;
    if (len > 2 * S) madvise((void *)b, (size_t)len, MADV_RANDOM);
    tf__xxh64_state h;
    tf__xxh64_reset(&h, seed);
    uint8_t rec[8];
    tf__put_le64(rec, len);
    tf__xxh64_update(&h, rec, sizeof rec);
    if (len) {
        tf__xxh64_update(&h, b, (size_t)(len < S ? len : S));
        tf__xxh64_update(&h, b + (len < S ? 0 : len - S), (size_t)(len < S ? len : S));
    }
    if (len > 2 * S) madvise((void *)b, (size_t)len, MADV_NORMAL);
    tf__release_pages(b, len);
    return tf__xxh64_digest(&h);
}

char *tf__path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    size_t k = a;
    if (a && dir[a - 1] != '/') p[k++] = '/';
    memcpy(p + k, name, b + 1);
    return p;
}

/* ------------------------------------------------------------------------ */
/* documents and tokens                                                      */
/* ------------------------------------------------------------------------ */

static int check_tail(const tf_file *f, size_t end);

int tf__file_document(const tf_file *f, uint64_t j, uint64_t *start, uint64_t *len) {
    if (j >= f->num_docs) TF_FAIL(-ERANGE, "document %llu out of range", (unsigned long long)j);
    if (f->lazy && f->doc_kind != TF_DOCS_SINGLE) {
        const tf_file *l;
        TF_TRY(tf__file_acquire(f, &l));
        int rc = tf__file_document(l, j, start, len);
        tf__file_release(f);
        return rc;
    }
    switch (f->doc_kind) {
    case TF_DOCS_SINGLE:
        *start = 0;
        *len = f->num_tokens;
        return 0;
    case TF_DOCS_ENDS: {
        uint64_t s = j ? f->doc_ends[j - 1] : 0, e = f->doc_ends[j];
        if (e < s || e > f->num_tokens)
            TF_FAIL(-TF_EFORMAT, "%s: document index: entry %llu is %llu, expected between %llu and %llu. Run verify(); the index is corrupt.",
                    f->aux_path ? f->aux_path : f->path, (unsigned long long)j, (unsigned long long)e,
                    (unsigned long long)s, (unsigned long long)f->num_tokens);
        *start = s;
        *len = e - s;
        return 0;
    }
    case TF_DOCS_FORMAT:
        if (f->doc_ops) return f->doc_ops->document(f, j, start, len);
        break;
    }
    return -EINVAL;
}

static uint64_t find_document(const tf_file *f, uint64_t pos) {
    switch (f->doc_kind) {
    case TF_DOCS_SINGLE: return 0;
    case TF_DOCS_ENDS: {
        /* first j with doc_ends[j] > pos */
        uint64_t lo = 0, hi = f->num_docs;
        while (lo < hi) {
            uint64_t mid = lo + (hi - lo) / 2;
            if (f->doc_ends[mid] > pos) hi = mid; else lo = mid + 1;
        }
        return lo < f->num_docs ? lo : f->num_docs - 1;
    }
    case TF_DOCS_FORMAT: return f->doc_ops ? f->doc_ops->find_document(f, pos) : 0;
    }
    return 0;
}

int tf__file_find_document(const tf_file *f, uint64_t pos, uint64_t *doc) {
    if (f->lazy && f->doc_kind != TF_DOCS_SINGLE) {
        const tf_file *l;
        TF_TRY(tf__file_acquire(f, &l));
        *doc = find_document(l, pos);
        tf__file_release(f);
        return 0;
    }
    *doc = find_document(f, pos);
    return 0;
}

/* Per-thread scratch for one decompressed block. Held in a pthread key (not
 * _Thread_local) so that its destructor frees it when a verify or engine
 * thread exits. */
typedef struct tf_blockbuf {
    uint8_t *p;
    size_t cap;
} tf_blockbuf;
static pthread_key_t tf_blockbuf_key;
static pthread_once_t tf_blockbuf_once = PTHREAD_ONCE_INIT;
static int tf_blockbuf_key_ok;

static void tf_blockbuf_free(void *v) {
    tf_blockbuf *b = v;
    if (b) free(b->p);
    free(b);
}
static void tf_blockbuf_init(void) { tf_blockbuf_key_ok = pthread_key_create(&tf_blockbuf_key, tf_blockbuf_free) == 0; }

static tf_blockbuf *thread_blockbuf(size_t need) {
    pthread_once(&tf_blockbuf_once, tf_blockbuf_init);
    if (!tf_blockbuf_key_ok) return NULL;
    tf_blockbuf *b = pthread_getspecific(tf_blockbuf_key);
    if (!b) {
        b = calloc(1, sizeof *b);
        if (!b) return NULL;
        if (pthread_setspecific(tf_blockbuf_key, b) != 0) {
            free(b);
            return NULL;
        }
    }
    if (b->cap < need) {
        uint8_t *nb = realloc(b->p, need);
        if (!nb) return NULL;
        b->p = nb;
        b->cap = need;
    }
    return b;
}

int tf__file_read_block(const tf_file *f, uint64_t b, void *out, size_t out_cap, uint64_t *stored) {
    if (f->lazy) {
        const tf_file *l;
        TF_TRY(tf__file_acquire(f, &l));
        int rc = tf__file_read_block(l, b, out, out_cap, stored);
        tf__file_release(f);
        return rc;
    }
    if (!f->blocks.ops)
        TF_FAIL(-EINVAL, "%s: block %llu requested from a file that has no compressed blocks", f->path,
                (unsigned long long)b);
    if (stored) {
        uint64_t off;
        TF_TRY(f->blocks.ops->extent(f, b, &off, stored));
    }
    return f->blocks.ops->read(f, b, out, out_cap);
}

int tf__file_read(const tf_file *f, uint64_t start, uint64_t count, void *out, tf_dtype out_dtype) {
    if (start > f->num_tokens || count > f->num_tokens - start)
        TF_FAIL(-ERANGE, "%s: tokens [%llu, %llu) out of range (%llu tokens)", f->path,
                (unsigned long long)start, (unsigned long long)(start + count), (unsigned long long)f->num_tokens);
    if (f->lazy) {
        const tf_file *l;
        TF_TRY(tf__file_acquire(f, &l));
        int rc = tf__file_read(l, start, count, out, out_dtype);
        tf__file_release(f);
        return rc;
    }
    size_t isz = tf_dtype_size(f->dtype), osz = tf_dtype_size(out_dtype);
    if (!f->blocks.ops && f->bytes_ops) return f->bytes_ops->read_tokens(f, start, count, out, out_dtype);
    if (!f->blocks.ops) {
        tf_convert(out, out_dtype, f->tokens + start * isz, f->dtype, (size_t)count);
        if (!count || !f->map) return 0;
        return check_tail(f, (size_t)(f->tokens - (const uint8_t *)f->map) + (size_t)((start + count) * isz));
    }
    /* Compressed: decompress each block touched. The batch engine keeps a
     * block cache; this path serves random access and verify. */
    uint64_t bt = f->blocks.tokens;
    size_t need = (size_t)bt * isz;
    tf_blockbuf *bb = thread_blockbuf(need);
    if (!bb) return -ENOMEM;
    uint8_t *o = out;
    while (count) {
        uint64_t b = start / bt, off = start % bt;
        uint64_t n = bt - off < count ? bt - off : count;
        TF_TRY(tf__file_read_block(f, b, bb->p, bb->cap, NULL));
        tf_convert(o, out_dtype, bb->p + off * isz, f->dtype, (size_t)n);
        o += n * osz;
        start += n;
        count -= n;
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* the SIGBUS guard over a set of files                                      */
/* ------------------------------------------------------------------------ */

/* The message for a fault at addr: which mapping of files[0, n) holds it. */
static int fault_error(const tf_file *files, uint64_t n, const void *addr) {
    for (uint64_t i = 0; files && i < n; i++) {
        const char *path = NULL;
        size_t off = 0;
        if (tf__file_mapped_at(&files[i], addr, &path, &off))
            return tf__seterr(-EIO, "%s: the file changed while mapped: reading byte %zu failed (bus error). Files must not be modified while a job reads them; re-open the dataset.",
                              path, off);
    }
    return tf__seterr(-EIO, "a mapped page at address %p could not be read (bus error): a file changed while mapped. Files must not be modified while a job reads them; re-open the dataset.",
                      addr);
}

int tf__files_guard(const tf_file *files, uint64_t nfiles, int (*fn)(void *), void *arg) {
    tf__sigbus_fault fault = {0, NULL};
    int rc = tf__sigbus_run(fn, arg, &fault);
    return fault.hit ? fault_error(files, nfiles, fault.addr) : rc;
}

/* ------------------------------------------------------------------------ */
/* files mapped on demand                                                    */
/* ------------------------------------------------------------------------ */

/*
 * the shards of a multi-file dataset, mapped on first touch and
 * unmapped again when the process holds too many.
 *
 * A dataset of many files keeps, per file, only what placing a position needs
 * (the tf_file in ds->files: counts, dtype, fingerprint, format fields) and a
 * tf__lazy: the file's identity when its metadata was taken (device, inode,
 * size, modification time, for the file and its index file) and, while it is
 * mapped, the parsed file (`live`) whose pointers the readers use.
 *
 *   - Touch: tf__file_acquire maps and parses the file if it is not mapped
 *     (the format's own parser, with the options the dataset was opened
 *     with), checks it against the metadata and the identity (a file changed
 *     since is an error naming it, never other tokens), and pins it;
 *     tf__file_release unpins it.
 *   - Source: a file whose bytes are not at its path (a remote shard known
 *     from its dataset's catalog, csrc/remote/) has a source instead
 *     (tf__file_lazy_set_source): the touch asks it for the parsed file, and
 *     checks that against the metadata the same way; no stat, no descriptor.
 *   - Bound: the files mapped this way, over all datasets of the process, are
 *     at most TOKENFEED_MAX_OPEN_SHARDS (default 256) plus those pinned at
 *     the moment; an unpinned file is unmapped least recently used first.
 *     A mapping holds no descriptor (file.c closes it after mmap), so the
 *     bound is on mappings (vm.max_map_count) and address space; the engine
 *     keeps its own bounded descriptor table for pread and io_uring.
 *
 * Threads: one process-wide mutex (lz_mu) guards every tf__lazy's mapped /
 * users / LRU links and the count; it is never held while mapped bytes are
 * read (a SIGBUS escapes with siglongjmp, common/sigbus.c), only around
 * bookkeeping, mmap's undo (munmap) and frees. Parsing happens outside it;
 * two threads touching the same unmapped file may both parse it, and the
 * second drops its copy. A reader interrupted by a bus error between acquire
 * and release leaves the file pinned (it stays mapped until the dataset is
 * freed).
 */

struct tf__lazy {
    tf_file *live; /* the parsed, mapped file while mapped (allocated then: an
                      unopened file costs its metadata only) */
    int mapped;
    int in_lru;
    _Atomic int checked; /* parsed and checked against the metadata once */
    uint32_t users;
    struct tf__lazy *prev, *next; /* LRU of mapped, unpinned files */
    char *index_dir;              /* the open options' index_dir (owned, unless in_arena) */
    int in_arena;                 /* this record and index_dir live in the file's arena */
    tf__file_id id[2];            /* the file, and its index file (aux_path) */
    tf__file_id seen;             /* the file the live mapping was made from (lz_mu; known 0: none yet) */
    tf__parse_fn reopen;          /* the format's parser, given the file's path */
    int64_t tok_off;              /* byte offset of the first token in the file, or -1 */
    uint64_t catalog_key;         /* the trusted catalog it came from */
    void (*forget_catalog)(uint64_t key); /* deletes that catalog (NULL: none) */
    const tf__lazy_src *src;      /* where the file is opened from instead of its path (NULL: the path) */
    void *src_ctx;                /* owned through src->free */
};

static pthread_mutex_t lz_mu = PTHREAD_MUTEX_INITIALIZER;
static struct tf__lazy *lru_head, *lru_tail;
static uint64_t lz_mapped;
static uint64_t lz_limit;

#define TF_LAZY_DEFAULT_LIMIT 256u

/* A fork()ed child (a DataLoader worker) gets lz_mu unlocked: the fork waits
 * for whoever holds it (only ever briefly, around bookkeeping). */
static void lz_fork_prepare(void) { pthread_mutex_lock(&lz_mu); }
static void lz_fork_done(void) { pthread_mutex_unlock(&lz_mu); }
static pthread_once_t lz_once = PTHREAD_ONCE_INIT;
/* Once per process: the fork handlers, and the bound from the environment. */
static void lz_init(void) {
    pthread_atfork(lz_fork_prepare, lz_fork_done, lz_fork_done);
    uint64_t v = TF_LAZY_DEFAULT_LIMIT;
    const char *e = getenv("TOKENFEED_MAX_OPEN_SHARDS");
    if (e && *e) {
        char *end;
        unsigned long long x = strtoull(e, &end, 10);
        if (*end == '\0' && x >= 1) v = x;
    }
    lz_limit = v;
}

uint64_t tf__lazy_limit(void) {
    pthread_once(&lz_once, lz_init); /* after it, lz_limit never changes */
    return lz_limit;
}

uint64_t tf__lazy_mapped(void) {
    pthread_mutex_lock(&lz_mu);
    uint64_t n = lz_mapped;
    pthread_mutex_unlock(&lz_mu);
    return n;
}

int tf__file_id_get(const char *path, tf__file_id *id) {
    memset(id, 0, sizeof *id);
    struct stat st;
    if (!path) return 0;
    if (stat(path, &st) != 0) return -errno;
    id_of_stat(&st, id);
    return 0;
}

/* lz_mu held. */
static void lru_unlink(struct tf__lazy *z) {
    if (!z->in_lru) return;
    if (z->prev) z->prev->next = z->next; else lru_head = z->next;
    if (z->next) z->next->prev = z->prev; else lru_tail = z->prev;
    z->prev = z->next = NULL;
    z->in_lru = 0;
}

static void lru_push_head(struct tf__lazy *z) {
    z->prev = NULL;
    z->next = lru_head;
    if (lru_head) lru_head->prev = z; else lru_tail = z;
    lru_head = z;
    z->in_lru = 1;
}

/* lz_mu held: unmap unpinned files, least recently used first, while more
 * than the limit are mapped. */
static void evict_over_limit(void) {
    while (lz_mapped > lz_limit && lru_tail) {
        struct tf__lazy *v = lru_tail;
        lru_unlink(v);
        tf__file_close(v->live);
        free(v->live);
        v->live = NULL;
        v->mapped = 0;
        lz_mapped--;
    }
}

/* What a file of meta's metadata keeps of its parsed self: everything but
 * the pointers into its mappings. */
static int strip_to_meta(tf_file *f) {
    char *path = f->path ? strdup(f->path) : NULL, *aux = f->aux_path ? strdup(f->aux_path) : NULL;
    if ((f->path && !path) || (f->aux_path && !aux)) {
        free(path);
        free(aux);
        return -ENOMEM;
    }
    f->path = path;
    f->aux_path = aux;
    f->map = f->aux_map = f->owned = f->meta = NULL;
    f->map_len = f->aux_len = 0;
    f->tokens = NULL;
    f->doc_ends = NULL;
    /* the format's private state may point into the mappings: its ops say
     * which of it goes with them (its checksums stay, as the counts do) */
    if (f->format_ops && f->format_ops->forget_maps) f->format_ops->forget_maps(f);
    else memset(f->format_priv, 0, sizeof f->format_priv);
    return 0;
}

static struct tf__lazy *lazy_alloc(const tf_open_options *opt) {
    struct tf__lazy *z = calloc(1, sizeof *z);
    if (!z) return NULL;
    if (opt && opt->index_dir && !(z->index_dir = strdup(opt->index_dir))) {
        free(z);
        return NULL;
    }
    return z;
}

int tf__file_make_lazy(tf_file *f, const tf_open_options *opt, tf__parse_fn reopen) {
    if (f->lazy || f->bytes_ops || f->owned || !f->path || tf__is_url(f->path)) return 0;
    tf__lazy_limit();
    struct tf__lazy *z = lazy_alloc(opt);
    if (!z) return -ENOMEM;
    z->reopen = reopen;
    /* the file as it was mapped (not a stat of its path, which may name
     * another file by now) */
    int rc = f->map_id.known ? 0 : tf__file_id_get(f->path, &z->id[0]);
    if (f->map_id.known) z->id[0] = f->map_id;
    z->seen = z->id[0];
    if (!rc && f->aux_path) rc = tf__file_id_get(f->aux_path, &z->id[1]);
    if (rc) {
        free(z->index_dir);
        free(z);
        TF_FAIL(rc, "%s: cannot stat: %s", f->path, strerror(-rc));
    }
    z->tok_off = tf__file_token_offset(f);
    if (!(z->live = malloc(sizeof *z->live))) {
        free(z->index_dir);
        free(z);
        return -ENOMEM;
    }
    *z->live = *f;
    if (strip_to_meta(f) < 0) {
        *f = *z->live;
        free(z->live);
        free(z->index_dir);
        free(z);
        return -ENOMEM;
    }
    f->lazy = z;
    atomic_store(&z->checked, 1);
    pthread_mutex_lock(&lz_mu);
    z->mapped = 1;
    lz_mapped++;
    lru_push_head(z);
    evict_over_limit();
    pthread_mutex_unlock(&lz_mu);
    return 0;
}

int tf__file_lazy_from_meta(tf_file *f, const char *index_dir, tf__parse_fn reopen, const tf__file_id id[2],
                            int64_t tok_off) {
    tf__lazy_limit(); /* the bound and the fork handlers, before any file is mapped */
    struct tf__lazy *z = tf__arena_alloc(f->arena, sizeof *z);
    if (!z) return -ENOMEM;
    memset(z, 0, sizeof *z);
    z->in_arena = 1;
    z->index_dir = (char *)index_dir;
    z->tok_off = tok_off;
    z->reopen = reopen;
    z->id[0] = id[0];
    z->id[1] = id[1];
    f->lazy = z;
    return 0;
}

void tf__file_lazy_set_catalog(tf_file *f, uint64_t key, void (*forget)(uint64_t key)) {
    if (!f->lazy) return;
    f->lazy->catalog_key = key;
    f->lazy->forget_catalog = forget;
}

int64_t tf__file_lazy_ids(const tf_file *f, tf__file_id id[2]) {
    memset(id, 0, 2 * sizeof *id);
    if (!f->lazy) return tf__file_token_offset(f);
    id[0] = f->lazy->id[0];
    id[1] = f->lazy->id[1];
    return f->lazy->tok_off;
}

void tf__file_lazy_free(tf_file *f) {
    struct tf__lazy *z = f->lazy;
    if (!z) return;
    pthread_mutex_lock(&lz_mu);
    lru_unlink(z);
    if (z->mapped) lz_mapped--;
    z->mapped = 0;
    pthread_mutex_unlock(&lz_mu);
    if (z->live) tf__file_close(z->live);
    free(z->live);
    if (z->src && z->src->free) z->src->free(z->src_ctx);
    if (!z->in_arena) {
        free(z->index_dir);
        free(z);
    }
    f->lazy = NULL;
}

void tf__file_lazy_set_source(tf_file *f, const tf__lazy_src *src, void *ctx) {
    struct tf__lazy *z = f->lazy;
    if (z->src && z->src->free) z->src->free(z->src_ctx);
    z->src = src;
    z->src_ctx = ctx;
    /* no descriptor reads such a file: its bytes come from its provider */
    z->tok_off = -1;
}

void *tf__file_lazy_source(const tf_file *f, const tf__lazy_src *src) {
    return f->lazy && f->lazy->src == src ? f->lazy->src_ctx : NULL;
}

/* 0 when the file found now is the one recorded (was), else -TF_EFORMAT
 * naming path and what differs. */
static int id_differs(const char *path, const tf__file_id *was, tf__file_id now) {
    if (!was->known || !now.known) return 0;
    if (was->known == 2) { /* from a catalog beside the data, written on another machine: size and time */
        now.ino = was->ino;
        now.dev = was->dev;
    }
    if (now.size != was->size || now.mtime_ns != was->mtime_ns || now.ino != was->ino || now.dev != was->dev)
        TF_FAIL(-TF_EFORMAT, "%s: the file changed after the dataset's index of it was taken (size %llu, modified at %llu.%09llu s; now %llu bytes, modified at %llu.%09llu s%s). Its tokens may no longer be those the dataset describes: open the dataset again.",
                path, (ull)was->size, (ull)(was->mtime_ns / 1000000000ull), (ull)(was->mtime_ns % 1000000000ull),
                (ull)now.size, (ull)(now.mtime_ns / 1000000000ull), (ull)(now.mtime_ns % 1000000000ull),
                now.ino != was->ino || now.dev != was->dev ? ", another file under the same name" : "");
    return 0;
}

static int id_changed(const char *path, const tf__file_id *was) {
    if (!was->known) return 0;
    tf__file_id now;
    int rc = tf__file_id_get(path, &now);
    if (rc) TF_FAIL(rc, "%s: cannot stat: %s (the file was there when the dataset was opened)", path, strerror(-rc));
    return id_differs(path, was, now);
}

/* Parse the file of meta again into *out (outside lz_mu: reads mapped bytes). */
static int reparse(const tf_file *meta, const struct tf__lazy *z, tf_file *out) {
    if (z->src) return z->src->open(z->src_ctx, meta, out);
    TF_TRY(id_changed(meta->path, &z->id[0]));
    if (meta->aux_path) TF_TRY(id_changed(meta->aux_path, &z->id[1]));
    tf_open_options o = {.format = meta->format, .raw_dtype = meta->format == TF_FORMAT_RAW ? meta->dtype : TF_DTYPE_INVALID,
                         .has_eos_id = meta->eos.split, .eos_id = meta->eos.id, .index_dir = z->index_dir};
    if (!z->reopen) TF_FAIL(-EINVAL, "%s: no parser to map the file again (internal error)", meta->path);
    return z->reopen(meta->path, &o, out);
}

/* The parsed file must be the one the metadata describes. */
int tf__file_check_same(const tf_file *m, const tf_file *p) {
    const char *fld = NULL;
    uint64_t want = 0, found = 0;
    if (p->format != m->format) fld = "format", want = (uint64_t)m->format, found = (uint64_t)p->format;
    else if (p->num_tokens != m->num_tokens) fld = "num_tokens", want = m->num_tokens, found = p->num_tokens;
    else if (p->num_docs != m->num_docs) fld = "num_docs", want = m->num_docs, found = p->num_docs;
    else if (p->dtype != m->dtype) fld = "dtype", want = (uint64_t)m->dtype, found = (uint64_t)p->dtype;
    else if (p->vocab_size != m->vocab_size) fld = "vocab_size", want = m->vocab_size, found = p->vocab_size;
    else if (p->fingerprint != m->fingerprint) fld = "fingerprint", want = m->fingerprint, found = p->fingerprint;
    else if (!p->blocks.ops != !m->blocks.ops) fld = "compressed", want = (uint64_t)!!m->blocks.ops, found = (uint64_t)!!p->blocks.ops;
    else if (p->blocks.tokens != m->blocks.tokens) fld = "block_tokens", want = m->blocks.tokens, found = p->blocks.tokens;
    else if (p->doc_kind != m->doc_kind) fld = "document kind", want = (uint64_t)m->doc_kind, found = (uint64_t)p->doc_kind;
    else if (p->eos.rows_only != m->eos.rows_only) fld = "document index", want = (uint64_t)!m->eos.rows_only, found = (uint64_t)!p->eos.rows_only;
    if (fld)
        TF_FAIL(-TF_EFORMAT, "%s: %s: expected %llu (0x%llx) as when the dataset's index of the file was taken, found %llu (0x%llx). The file changed since: open the dataset again.",
                m->path, fld, (ull)want, (ull)want, (ull)found, (ull)found);
    return 0;
}

int tf__file_acquire(const tf_file *f, const tf_file **live) {
    struct tf__lazy *z = f->lazy;
    if (!z) {
        *live = f;
        return 0;
    }
    pthread_mutex_lock(&lz_mu);
    if (z->mapped) {
        lru_unlink(z);
        z->users++;
        pthread_mutex_unlock(&lz_mu);
        *live = z->live;
        return 0;
    }
    pthread_mutex_unlock(&lz_mu);
    tf_file tmp;
    memset(&tmp, 0, sizeof tmp);
    int rc = reparse(f, z, &tmp);
    /* the file mapped is the one stat saw (it may have been replaced between) */
    if (!rc && !z->src) rc = id_differs(f->path, &z->id[0], tmp.map_id);
    if (!rc) rc = tf__file_check_same(f, &tmp);
    /* the pread and io_uring backends read at this offset without the map
     * (never a file from a source: its token offset is unknown, -1) */
    if (!rc && !z->src && tf__file_token_offset(&tmp) != z->tok_off)
        rc = tf__seterr(-TF_EFORMAT, "%s: token offset: expected %lld as when the dataset's index of the file was taken, found %lld. The file changed since: open the dataset again.",
                        f->path, (long long)z->tok_off, (long long)tf__file_token_offset(&tmp));
    if (rc) {
        tf__file_close(&tmp);
        if (z->catalog_key) {
            /* the catalog that described the file is stale: the node's is
             * deleted, so the next open parses the files again; one beside
             * the data is the data owner's to rebuild */
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", tf_last_error());
            if (z->forget_catalog) {
                z->forget_catalog(z->catalog_key);
                rc = tf__seterr(rc, "%s", msg);
            } else {
                /* opening again cannot help while the catalog beside the
                 * data describes the old file (every open believes it): say
                 * what does, first, and what differs after */
                static const char *const again[] = {" The file changed since: open the dataset again.",
                                                    " Its tokens may no longer be those the dataset describes: open the dataset again."};
                for (size_t i = 0; i < sizeof again / sizeof *again; i++) {
                    char *at = strstr(msg, again[i]);
                    if (at) *at = '\0';
                }
                const char *slash = strrchr(f->path, '/');
                int dlen = slash ? (int)(slash - f->path) : 1;
                rc = tf__seterr(rc, "%s: the shard set's catalog beside the data (%.*s/%s*) describes the file as it was when the catalog was written, not as it is now: rebuild the catalog with `tokenfeed index '%.*s/GLOB'` (the glob the set is opened by, once the set is complete), then open the dataset again. What differs: %s",
                                f->path, dlen, slash ? f->path : ".", TF_DATA_CATALOG_STEM, dlen, slash ? f->path : ".", msg);
            }
        }
        return rc;
    }
    tf_file *fresh = malloc(sizeof *fresh);
    if (!fresh) {
        tf__file_close(&tmp);
        return -ENOMEM;
    }
    *fresh = tmp;
    pthread_mutex_lock(&lz_mu);
    if (z->mapped) { /* another thread mapped it meanwhile: use that one */
        lru_unlink(z);
        z->users++;
        pthread_mutex_unlock(&lz_mu);
        tf__file_close(fresh);
        free(fresh);
    } else {
        z->live = fresh;
        if (fresh->map_id.known) z->seen = fresh->map_id;
        z->mapped = 1;
        z->users++;
        lz_mapped++;
        evict_over_limit();
        pthread_mutex_unlock(&lz_mu);
    }
    atomic_store(&z->checked, 1);
    *live = z->live; /* pinned: not unmapped or freed until released */
    return 0;
}

int tf__file_touch(const tf_file *f) {
    if (!f->lazy || atomic_load(&f->lazy->checked)) return 0;
    const tf_file *l;
    TF_TRY(tf__file_acquire(f, &l));
    tf__file_release(f);
    return 0;
}

void tf__file_release(const tf_file *f) {
    struct tf__lazy *z = f->lazy;
    if (!z) return;
    pthread_mutex_lock(&lz_mu);
    if (z->users && --z->users == 0 && z->mapped) {
        lru_push_head(z);
        evict_over_limit();
    }
    pthread_mutex_unlock(&lz_mu);
}

int tf__file_mapped_at(const tf_file *f, const void *addr, const char **path, size_t *off) {
    struct tf__lazy *z = f->lazy;
    int hit = 0;
    if (z) pthread_mutex_lock(&lz_mu);
    const tf_file *l = z ? (z->mapped ? z->live : NULL) : f;
    const uint8_t *a = addr;
    if (l && l->map && a >= (const uint8_t *)l->map && (size_t)(a - (const uint8_t *)l->map) < l->map_len) {
        *path = f->path;
        *off = (size_t)(a - (const uint8_t *)l->map);
        hit = 1;
    } else if (l && l->aux_map && a >= (const uint8_t *)l->aux_map &&
               (size_t)(a - (const uint8_t *)l->aux_map) < l->aux_len) {
        *path = f->aux_path ? f->aux_path : f->path;
        *off = (size_t)(a - (const uint8_t *)l->aux_map);
        hit = 1;
    }
    if (z) pthread_mutex_unlock(&lz_mu);
    return hit;
}

int64_t tf__file_token_offset(const tf_file *f) {
    if (f->lazy) return f->lazy->tok_off;
    if (f->blocks.ops || !f->map || !f->tokens || !f->path || f->bytes_ops) return -1;
    const uint8_t *m = f->map;
    size_t isz = tf_dtype_size(f->dtype);
    if (f->tokens < m || (size_t)(f->tokens - m) > f->map_len) return -1;
    if (f->num_tokens > (f->map_len - (size_t)(f->tokens - m)) / (isz ? isz : 1)) return -1;
    return (int64_t)(f->tokens - m);
}

uint64_t tf__file_size(const tf_file *f) {
    return f->lazy ? f->lazy->id[0].size : (uint64_t)f->map_len;
}

/* The identity a descriptor opened by f's path must have: the file its
 * mapping was made from (a file mapped on demand: the last one, or the one
 * its catalog recorded before its first touch). */
static tf__file_id expected_id(const tf_file *f) {
    struct tf__lazy *z = f->lazy;
    if (!z) return f->map_id;
    pthread_mutex_lock(&lz_mu);
    tf__file_id id = z->seen.known ? z->seen : z->id[0];
    pthread_mutex_unlock(&lz_mu);
    return id;
}

int tf__file_check_fd(const tf_file *f, int fd) {
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        TF_FAIL(-e, "%s: cannot stat the file opened for reading: %s", f->path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) TF_FAIL(-EINVAL, "%s: not a regular file any more; open the dataset again.", f->path);
    tf__file_id now, was = expected_id(f);
    id_of_stat(&st, &now);
    if (!was.known) { /* no identity recorded: at least the size must be the same */
        was = now;
        was.size = tf__file_size(f);
    }
    int same_file = was.known == 2 || (was.dev == now.dev && was.ino == now.ino);
    if (same_file && now.size < was.size)
        TF_FAIL(-EIO, "%s: the file is now %llu bytes long, %llu when the dataset was opened: it was truncated while in use; reopen the dataset.",
                f->path, (ull)now.size, (ull)was.size);
    /* A file the dataset keeps mapped for its life (not mapped on demand) is
     * pinned by that mapping: its inode cannot be reused, and a rewrite in
     * place shows through the mapping as well, so the same inode at the same
     * size is that file. A file mapped on demand may be unmapped, and its
     * inode number reused by another file: all four fields must agree. */
    if (!f->lazy && f->map && was.known == 1 && same_file) now.mtime_ns = was.mtime_ns;
    return id_differs(f->path, &was, now);
}

/* Tokens ending at byte end of f's mapping were just copied from it. A page
 * wholly past the end of a file that shrank raises SIGBUS (the guard turns it
 * into -EIO), but the part of the page where the file now ends that lies past
 * that end reads as zeros, with no fault: a file cut inside the page a read
 * ended in would give zeros. Bytes past the end read as zeros, so a non-zero
 * byte at or after end - 1 proves the file still held what was read; and the
 * bytes from f->map_nz on were zeros when the file was mapped, so reading
 * zeros there is right. Hence: look for a non-zero byte from t - 1 on (t =
 * the smaller of end and map_nz) to the end of that page, which takes a few
 * loads (the next token's); failing that, load one byte of the next page (it
 * faults when the file now ends before it); if map_nz lies in this page, its
 * byte reading zero proves the file changed. Without map_nz (no non-zero byte
 * in the mapping's last page), the last byte read, then the next page, then
 * in the last page one stat of the path. Runs under the caller's SIGBUS
 * guard, as every read of f does. */
static int check_tail(const tf_file *f, size_t end) {
    static size_t page;
    if (!page) {
        long p = sysconf(_SC_PAGESIZE);
        page = p > 0 ? (size_t)p : 4096;
    }
    if (!f->map || !end || end > f->map_len) return 0;
    const volatile uint8_t *m = f->map;
    atomic_thread_fence(memory_order_acquire); /* loaded after the copy's loads */
    size_t nz = f->map_nz;
    if (nz) {
        size_t t = nz < end ? nz : end, next = (t + page - 1) / page * page;
        size_t stop = next < nz ? next : nz;
        for (size_t q = t - 1; q < stop; q++)
            if (m[q]) return 0;
        if (stop == nz)
            TF_FAIL(-EIO, "%s: the file changed while mapped: byte %zu reads as 0, and it was not 0 when the file was mapped (it was cut short or rewritten). Files must not be modified while a job reads them; re-open the dataset.",
                    f->path, nz - 1);
        (void)m[next]; /* next < nz: a byte of the file */
        return 0;
    }
    if (m[end - 1]) return 0;
    size_t next = (end + page - 1) / page * page;
    if (next < f->map_len) {
        (void)m[next];
        return 0;
    }
    struct stat st;
    if (!f->path || stat(f->path, &st) != 0) return 0;
    if (f->map_id.known == 1 && ((uint64_t)st.st_dev != f->map_id.dev || (uint64_t)st.st_ino != f->map_id.ino))
        return 0;
    if ((uint64_t)st.st_size >= end) return 0;
    TF_FAIL(-EIO, "%s: the file changed while mapped: it now ends at byte %llu, before the tokens read (up to byte %zu), which would read as zeros. Files must not be modified while a job reads them; re-open the dataset.",
            f->path, (ull)st.st_size, end);
}

char *tf__companion_path(const char *path, const char *suffix, int replace_ext) {
    size_t n = strlen(path), sl = strlen(suffix);
    if (replace_ext) { /* pathlib's with_suffix: the last extension of the last name */
        const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path, *dot = strrchr(base, '.');
        if (dot && dot != base) n = (size_t)(dot - path);
    }
    char *out = malloc(n + sl + 1);
    if (!out) return NULL;
    memcpy(out, path, n);
    memcpy(out + n, suffix, sl + 1);
    return out;
}

int tf__open_main(const char *path, tf_file *f, uint64_t header, const char *layout, const char *fix) {
    f->path = strdup(path);
    if (!f->path) return -ENOMEM;
    TF_TRY(tf__map_file_main(path, f));
    if (f->map_len < header)
        TF_FAIL(-TF_EFORMAT, "%s: header: expected %llu bytes (%s), found %llu. %s", path, (unsigned long long)header,
                layout, (unsigned long long)f->map_len, fix);
    return 0;
}
