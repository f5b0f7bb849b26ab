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
 *     through the block reader its parser installed (f->read_block).
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "source.h"

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
        TF_FAIL(-EMFILE, "%s: cannot map the file: the process has %llu memory mappings, at the kernel's limit vm.max_map_count = %llu (every file of a dataset takes one, two with an index file). Write the data into fewer, larger shards (DatasetWriter's shard_tokens, tokenfeed convert), or raise the limit as root: sysctl -w vm.max_map_count=%llu.",
                path, (unsigned long long)count, (unsigned long long)limit, (unsigned long long)(limit * 4 > 1048576 ? limit * 4 : 1048576));
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

int tf__map_file(const char *path, void **map, size_t *len) {
    *map = NULL;
    *len = 0;
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
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

void tf__file_close(tf_file *f) {
    if (!f) return;
    if (f->bytes_ops && f->bytes_ops->free) f->bytes_ops->free(f->bytes_src);
    free(f->meta);
    tf__unmap(f->map, f->map_len);
    tf__unmap(f->aux_map, f->aux_len);
    free(f->owned);
    free(f->path);
    free(f->aux_path);
    memset(f, 0, sizeof *f);
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

int tf__file_document(const tf_file *f, uint64_t j, uint64_t *start, uint64_t *len) {
    if (j >= f->num_docs) TF_FAIL(-ERANGE, "document %llu out of range", (unsigned long long)j);
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
    case TF_DOCS_MEGATRON: {
        size_t isz = tf_dtype_size(f->dtype);
        int64_t p = tf__mg_pointer(f, j);
        int32_t n = tf__mg_size(f, j);
        if (p < 0 || n < 0 || (uint64_t)p % isz != 0 || (uint64_t)p / isz > f->num_tokens ||
            (uint64_t)n > f->num_tokens - (uint64_t)p / isz)
            TF_FAIL(-TF_EFORMAT, "%s: sequence %llu: pointer %lld, size %d lie outside the %llu tokens of the .bin. The .idx does not belong to this .bin or is corrupt.",
                    f->aux_path, (unsigned long long)j, (long long)p, (int)n, (unsigned long long)f->num_tokens);
        *start = (uint64_t)p / isz;
        *len = (uint64_t)n;
        return 0;
    }
    }
    return -EINVAL;
}

uint64_t tf__file_find_document(const tf_file *f, uint64_t pos) {
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
    case TF_DOCS_MEGATRON: {
        /* last j with start(j) <= pos; pointers are ascending in valid files */
        size_t isz = tf_dtype_size(f->dtype);
        uint64_t lo = 0, hi = f->num_docs;
        while (hi - lo > 1) {
            uint64_t mid = lo + (hi - lo) / 2;
            int64_t p = tf__mg_pointer(f, mid);
            if (p >= 0 && (uint64_t)p / isz <= pos) lo = mid; else hi = mid;
        }
        /* skip empty sequences that start at the same position */
        while (lo + 1 < f->num_docs && tf__mg_pointer(f, lo + 1) >= 0 &&
               (uint64_t)tf__mg_pointer(f, lo + 1) / isz <= pos) lo++;
        return lo;
    }
    }
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

int tf__file_read_block(const tf_file *f, uint64_t b, void *out, size_t out_cap) {
    if (!f->compressed || !f->read_block)
        TF_FAIL(-EINVAL, "%s: block %llu requested from a file that has no compressed blocks", f->path,
                (unsigned long long)b);
    return f->read_block(f, b, out, out_cap);
}

int tf__file_read(const tf_file *f, uint64_t start, uint64_t count, void *out, tf_dtype out_dtype) {
    if (start > f->num_tokens || count > f->num_tokens - start)
        TF_FAIL(-ERANGE, "%s: tokens [%llu, %llu) out of range (%llu tokens)", f->path,
                (unsigned long long)start, (unsigned long long)(start + count), (unsigned long long)f->num_tokens);
    size_t isz = tf_dtype_size(f->dtype), osz = tf_dtype_size(out_dtype);
    if (!f->compressed && f->bytes_ops) return f->bytes_ops->read_tokens(f, start, count, out, out_dtype);
    if (!f->compressed) {
        tf_convert(out, out_dtype, f->tokens + start * isz, f->dtype, (size_t)count);
        return 0;
    }
    /* Compressed: decompress each block touched. The batch engine keeps a
     * block cache; this path serves random access and verify. */
    uint64_t bt = f->block_tokens;
    size_t need = (size_t)bt * isz;
    tf_blockbuf *bb = thread_blockbuf(need);
    if (!bb) return -ENOMEM;
    uint8_t *o = out;
    while (count) {
        uint64_t b = start / bt, off = start % bt;
        uint64_t n = bt - off < count ? bt - off : count;
        TF_TRY(tf__file_read_block(f, b, bb->p, bb->cap));
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
    const uint8_t *a = addr;
    for (uint64_t i = 0; files && i < n; i++) {
        const tf_file *f = &files[i];
        const char *path = NULL;
        size_t off = 0;
        if (f->map && a >= (const uint8_t *)f->map && (size_t)(a - (const uint8_t *)f->map) < f->map_len) {
            path = f->path;
            off = (size_t)(a - (const uint8_t *)f->map);
        } else if (f->aux_map && a >= (const uint8_t *)f->aux_map &&
                   (size_t)(a - (const uint8_t *)f->aux_map) < f->aux_len) {
            path = f->aux_path ? f->aux_path : f->path;
            off = (size_t)(a - (const uint8_t *)f->aux_map);
        }
        if (path)
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
