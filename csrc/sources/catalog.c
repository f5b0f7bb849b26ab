/*
 * catalog.c — the node's catalog of a multi-file local dataset: everything
 * open needs to place any position (per file: path, format, dtype, counts,
 * document kind, the fingerprint's inputs, the token offset, the checksums
 * its header holds) and each file's identity (device, inode, size,
 * modification time, for the file and its index file), in one file.
 *
 * The first open of a set of paths on a node parses every file's header
 * (as without a catalog), then writes the catalog into the node's catalog
 * directory ($TOKENFEED_CATALOG_DIR, default ~/.cache/tokenfeed/catalog;
 * empty or "off": none), named by a hash of the paths and the open options.
 * Later opens, by this process, the node's other ranks or a restart, read it
 * and stat each file instead of mapping it: a file whose identity changed is
 * parsed again (its entry refreshed, the catalog rewritten); a tokenfeed
 * dataset's manifest that changed, or a native shard that did, sends the
 * whole open down the parsing path. The files are then mapped on first touch
 * (file.c), their headers checked against the entry: a file changed after
 * the catalog was read is an error naming it there.
 *
 * Trusted entries. Checking each file's identity is one stat per file: at
 * 10^4 files, most of an open. Two kinds of catalog skip it, because what
 * they depend on covers the files:
 *   - a tokenfeed dataset's (opened as its directories): its shards are
 *     written once, before its manifest; the manifest unchanged, the shards
 *     are the ones catalogued;
 *   - a shard set's (a directory of foreign files, or a glob in one, keyed by
 *     what open was given, not by the files it expanded to): the directories
 *     holding its files, unchanged (device, inode, size, modification time),
 *     hold the same names, so the same files.
 * A file changed in place under an unchanged name is then found on first
 * touch (file.c checks its identity and header against the entry): an error
 * naming it, and the catalog is deleted, so the next open parses the files
 * again. Directories and manifests modified in the last seconds are not
 * trusted (a change within the file system's timestamp granularity would go
 * unseen).
 *
 * File layout (little-endian): "TFCATLG1", u32 version, u32 flags, u64 key,
 * u64 files, u64 deps; per file a record (see put_file); per dependency u32
 * length, path, identity (a file that must be unchanged: a tokenfeed
 * dataset's manifest; or, with known = 0, a name that must stay absent: the
 * datatrove .index a headerless file did not have); u64 XXH64 of all before.
 * Written to a temporary file in the directory (safe_fs.c: O_EXCL, no
 * symlink followed) and renamed over the old one, so a reader sees a whole
 * catalog or none; a catalog that does not parse is ignored (and replaced).
 *
 * The node's catalog of files, when built with zstd and larger than
 * CAT_PACK_ABOVE (4 MiB, about 25,000 files: below, reading it whole costs
 * less than decompressing it), is stored compressed: "TFCATZS1", u64 length of the
 * catalog, then one zstd frame of it (pack/unpack). Its entries are alike
 * from file to file (about 24x smaller at 10^6 files: 161 MB to 7 MB), and
 * reading them from a cold disk was most of a cold open. A build without
 * zstd finds such a catalog unusable and parses the files, as for none.
 * A catalog beside the data on disk (tokenfeed index on a local set) whose
 * file records pass the same size is stored with them compressed, the rest
 * as it was (version 4, flag CAT_PACKED): the header, u64 length of the
 * records, u64 length of their zstd frame, the frame, then the
 * dependencies and the checksum (of the bytes stored) as before, so that
 * its writer can still set the directory's identity in place, at a fixed
 * offset. Every open of the set reads it whole: at 10^6 files 161 MB
 * otherwise. An older build, or one without zstd, finds version 4 unusable
 * and lists the set, as without a catalog; version 3 catalogs (uncompressed)
 * are read as before. A catalog in object storage, and a dataset's own
 * catalog, read by other machines and builds, are never compressed.
 *
 * A catalog beside the data may also live in object storage, next to a remote
 * shard set's objects: see "a catalog beside the data in object storage"
 * below.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "safe_fs.h"
#include "source.h"

#ifdef TF_HAVE_ZSTD
#include <zstd.h>
#endif

typedef unsigned long long ull;

#define CAT_MAGIC "TFCATLG1"
#define SET_MAGIC "TFCATSET"
#define CAT_VERSION 3u
/* flags: the dependencies cover the files (see "Trusted entries") */
#define CAT_TRUST 1u
/* flags: a catalog beside the data (paths relative to its directory) */
#define CAT_BESIDE 2u
/* flags: a catalog beside the data in object storage (see "A catalog in
 * object storage") */
#define CAT_OBJECTS 8u
/* flags: the file records are one zstd frame (version 4; see the layout) */
#define CAT_PACKED 16u
#define CAT_VERSION_PACKED 4u
#define CAT_MAX_BYTES ((size_t)1 << 32)
#define PACK_MAGIC "TFCATZS1"
#define CAT_PACK_ABOVE ((size_t)4 << 20)

/* How old a file must be to enter a catalog. */
#define TF_CATALOG_SETTLE_NS 2000000000ull

tf__parse_fn tf__parser_of(tf_format fmt) {
    const tf__format_row *r = tf__format_row_of(fmt);
    return r ? r->reparse : NULL;
}

/* The catalog directory (malloc'ed), or NULL when there is none. */
static char *catalog_dir(void) {
    const char *e = getenv("TOKENFEED_CATALOG_DIR");
    if (e) return *e && strcmp(e, "off") != 0 ? strdup(e) : NULL;
    const char *home = getenv("HOME");
    if (!home || !*home) return NULL;
    size_t n = strlen(home) + 40;
    char *d = malloc(n);
    if (d) snprintf(d, n, "%s/.cache/tokenfeed/catalog", home);
    return d;
}

static void hash_str(tf__xxh64_state *h, const char *s) {
    uint8_t rec[8];
    size_t n = s ? strlen(s) + 1 : 0;
    tf__put_le64(rec, n);
    tf__xxh64_update(h, rec, 8);
    if (n) tf__xxh64_update(h, s, n);
}

/* The key of a catalog: of the files of paths (set 0), or of the shard set
 * that paths name (set 1: globs and directories, as open was given them), or
 * of a catalog beside the data (set 2: the pattern within its directory; set
 * 3: the same in object storage). */
static uint64_t catalog_key(int set, const char *const *paths, size_t n, const tf_open_options *opt) {
    tf__xxh64_state h;
    tf__xxh64_reset(&h, 0x54464341544c4731ULL);
    if (set) hash_str(&h, set == 3 ? "shard set in object storage" : set == 2 ? "shard set beside the data" : "shard set");
    uint8_t rec[40];
    tf__put_le64(rec, n);
    tf__put_le64(rec + 8, (uint64_t)opt->format);
    tf__put_le64(rec + 16, (uint64_t)opt->raw_dtype);
    tf__put_le64(rec + 24, (uint64_t)opt->has_eos_id);
    tf__put_le64(rec + 32, opt->has_eos_id ? opt->eos_id : 0);
    tf__xxh64_update(&h, rec, sizeof rec);
    /* the node's index directory is this machine's: not part of a catalog beside the data */
    hash_str(&h, set >= 2 ? NULL : opt->index_dir);
    char cwd[4096];
    /* relative paths name other files from another directory (but a
     * catalog beside the data is keyed by names within its directory) */
    for (size_t i = 0; set < 2 && i < n; i++)
        if (paths[i][0] != '/') {
            hash_str(&h, getcwd(cwd, sizeof cwd) ? cwd : "");
            break;
        }
    for (size_t i = 0; i < n; i++) hash_str(&h, paths[i]);
    return tf__xxh64_digest(&h);
}

/* ---- serialisation -------------------------------------------------------- */

static void put64(tf__byte_wr *b, uint64_t v) {
    tf__byte_put_le(b, 8, v);
}
static void put32(tf__byte_wr *b, uint32_t v) {
    tf__byte_put_le(b, 4, v);
}
static void put_str(tf__byte_wr *b, const char *s) {
    size_t n = s ? strlen(s) : 0;
    put32(b, s ? (uint32_t)n + 1 : 0);
    if (n) tf__byte_put(b, s, n);
}
static void put_id(tf__byte_wr *b, const tf__file_id *id) {
    put64(b, id->dev);
    put64(b, id->ino);
    put64(b, id->size);
    put64(b, id->mtime_ns);
    put64(b, (uint64_t)id->known);
}

/* An entry: the path as the length it shares with the previous entry's path
 * and the rest (the files of a set share their directory), the index file's
 * path, then a fixed record (ENTRY_FIXED bytes) read in one piece. */
#define ENTRY_FIXED (4 * 4 + 11 * 8 + 5 * 8)
#define ENTRY_AUX_ID 8u /* flags: the index file's identity follows the record */

/* strip: bytes of every path left out (the directory of a catalog beside
 * the data, whose identities are then size and time only; a dataset's own
 * catalog, sized_only, records the size alone: it is read where times mean
 * nothing, from object storage). */
static void put_file_as(tf__byte_wr *b, const tf_file *f, const tf_file *prev, size_t strip, const tf__file_id *as) {
    tf__file_id id[2];
    int64_t tok_off = tf__file_lazy_ids(f, id);
    if (strip)
        for (int k = 0; k < 2; k++)
            if (id[k].known) id[k] = (tf__file_id){.size = id[k].size, .mtime_ns = id[k].mtime_ns, .known = 2};
    if (as) {
        id[0] = *as;
        memset(&id[1], 0, sizeof id[1]);
    }
    const char *path = f->path + strip, *before = prev ? prev->path + strip : NULL;
    size_t n = strlen(path), shared = 0;
    if (before)
        while (shared < n && shared < UINT32_MAX && before[shared] == path[shared]) shared++;
    put32(b, (uint32_t)shared);
    put32(b, (uint32_t)(n - shared));
    tf__byte_put(b, path + shared, n - shared);
    put_str(b, f->aux_path ? f->aux_path + strip : NULL);
    put32(b, (uint32_t)f->format);
    put32(b, (uint32_t)f->dtype);
    put32(b, (uint32_t)f->doc_kind);
    const tf__format_row *r = tf__format_row_of(f->format);
    const tf__format_ops *ops = r ? r->ops : NULL;
    uint8_t priv[TF__CATALOG_PRIV_BYTES] = {0};
    if (ops && ops->catalog_pack) ops->catalog_pack(f, priv);
    /* flag 2: the entry holds the format's private state (its checksums) */
    put32(b, (uint32_t)((f->blocks.ops ? 1 : 0) | (ops && ops->catalog_pack ? 2 : 0) | (f->eos.split ? 4 : 0) |
                        (f->aux_path ? ENTRY_AUX_ID : 0)));
    put64(b, f->num_tokens);
    put64(b, f->num_docs);
    put64(b, f->vocab_size);
    put64(b, f->eos.id);
    put64(b, f->fingerprint);
    put64(b, f->blocks.tokens);
    put64(b, f->blocks.count);
    tf__byte_put(b, priv, sizeof priv);
    put64(b, (uint64_t)tok_off);
    put_id(b, &id[0]);
    if (f->aux_path) put_id(b, &id[1]);
}

static void put_file(tf__byte_wr *b, const tf_file *f, const tf_file *prev, size_t strip, int sized_only) {
    tf__file_id sized = {.size = tf__file_size(f), .known = 2};
    put_file_as(b, f, prev, strip, sized_only ? &sized : NULL);
}

static uint64_t get64(tf__byte_rd *r) {
    const uint8_t *p = tf__byte_take(r, 8);
    return p ? tf__le64(p) : 0;
}
static uint32_t get32(tf__byte_rd *r) {
    const uint8_t *p = tf__byte_take(r, 4);
    return p ? tf__le32(p) : 0;
}
/* A string (malloc'ed; NULL for none); sets r->bad on a malformed one. */
static char *get_str(tf__byte_rd *r) {
    uint32_t n = get32(r);
    if (!n || r->bad) return NULL;
    const uint8_t *p = tf__byte_take(r, n - 1);
    if (!p || memchr(p, 0, n - 1)) {
        r->bad = 1;
        return NULL;
    }
    char *s = malloc(n);
    if (!s) {
        r->bad = 1;
        return NULL;
    }
    memcpy(s, p, n - 1);
    s[n - 1] = '\0';
    return s;
}
static void get_id(tf__byte_rd *r, tf__file_id *id) {
    id->dev = get64(r);
    id->ino = get64(r);
    id->size = get64(r);
    id->mtime_ns = get64(r);
    uint64_t k = get64(r);
    if (k > 2) r->bad = 1;
    id->known = (int)(k & 3);
}

/* Identities: known 0 (absent), 1 (device, inode, size, modification
 * time), or 2 (size and modification time only: a catalog beside the data,
 * read from other machines, where device and inode numbers differ). */
static int same_id(const tf__file_id *a, const tf__file_id *b) {
    if (!a->known || !b->known) return !a->known && !b->known;
    if (a->known == 2 || b->known == 2) return a->size == b->size && a->mtime_ns == b->mtime_ns;
    return a->dev == b->dev && a->ino == b->ino && a->size == b->size && a->mtime_ns == b->mtime_ns;
}

/* The directory of the files last checked, open: the files of a set share a
 * few directories, and fstatat relative to one walks one path component per
 * file instead of the whole path (at 10^4 files, the path walks are most of
 * a catalog's open). */
typedef struct dircache {
    char *dir;
    size_t len;
    int fd;
} dircache;

static void dircache_close(dircache *c) {
    if (c->fd >= 0) close(c->fd);
    free(c->dir);
    c->dir = NULL;
    c->fd = -1;
}

/* Whether path still has identity id (known = 0: is still absent). */
static int unchanged(dircache *c, const char *path, const tf__file_id *id) {
    tf__file_id now;
    memset(&now, 0, sizeof now);
    const char *slash = strrchr(path, '/');
    struct stat st;
    if (slash && slash != path) {
        size_t n = (size_t)(slash - path);
        if (!c->dir || c->len != n || memcmp(c->dir, path, n) != 0) {
            dircache_close(c);
            if ((c->dir = strndup(path, n))) {
                c->len = n;
                c->fd = open(c->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
            }
        }
        if (c->fd >= 0) {
            if (fstatat(c->fd, slash + 1, &st, 0) == 0) {
                now.dev = (uint64_t)st.st_dev;
                now.ino = (uint64_t)st.st_ino;
                now.size = (uint64_t)st.st_size;
                now.mtime_ns = (uint64_t)st.st_mtim.tv_sec * 1000000000ull + (uint64_t)st.st_mtim.tv_nsec;
                now.known = 1;
            }
            return same_id(&now, id);
        }
    }
    if (tf__file_id_get(path, &now) != 0) now.known = 0;
    return same_id(&now, id);
}

/* The dependencies of opening paths: each directory's manifest. */
static int each_dep(const char *const *paths, size_t n, int (*fn)(void *, const char *), void *ctx) {
    for (size_t i = 0; i < n; i++) {
        struct stat st;
        if (stat(paths[i], &st) != 0 || !S_ISDIR(st.st_mode)) continue;
        char *m = tf__path_join(paths[i], TF_MANIFEST_NAME);
        if (!m) return -ENOMEM;
        int rc = fn(ctx, m);
        free(m);
        if (rc) return rc;
    }
    return 0;
}

static int dep_put(void *ctx, const char *path) {
    tf__byte_wr *b = ctx;
    tf__file_id id;
    if (tf__file_id_get(path, &id) != 0) id.known = 0;
    put_str(b, path);
    put_id(b, &id);
    return 0;
}
static int dep_count(void *ctx, const char *path) {
    (void)path;
    ++*(uint64_t *)ctx;
    return 0;
}

/* Whether f is a shard its dataset's manifest checks (the format table says
 * which formats' files are). */
static int of_manifest(const tf_file *f) {
    const tf__format_row *r = tf__format_row_of(f->format);
    return r && r->manifest;
}

/* The companion file (format table: a datatrove .index, a .bos.idx) that a
 * file read without one may later get. */
static char *absent_index(const tf_file *f) {
    const tf__format_row *r = tf__format_row_of(f->format);
    if (f->aux_path || f->eos.split || (r && r->pair)) return NULL; /* a pair's companion is never absent */
    int oom = 0;
    return tf__format_companion(f->format, f->path, 0, &oom);
}

/* ---- load and save --------------------------------------------------------- */

/* The catalog directory opened (created when create, mode 0700 whatever the
 * umask, its missing parents too), or -1 when it is not there or not
 * private: a catalog says where every token of a dataset lies, so one that
 * another user could write (a shared team directory) is never read or
 * written. Checked on the directory opened, not on its path. (The Python
 * package says once, naming the directory, when it refuses one.) */
static int open_catalog_dir(const char *dir, int create) {
    int dfd = -1;
    struct stat st;
    if (tf__dir_open(dir, create ? TF_DIR_PRIVATE : 0, &dfd) != 0) return -1;
    if (fstat(dfd, &st) != 0 || st.st_uid != geteuid() || (st.st_mode & (S_IWGRP | S_IWOTH))) {
        close(dfd);
        return -1;
    }
    return dfd;
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* A file modified in the last seconds may be modified again within the file
 * system's timestamp granularity, unseen by its identity (as git treats
 * "racy" entries). */
static int settled(const tf__file_id *id, uint64_t now) {
    return !id->known || id->mtime_ns + TF_CATALOG_SETTLE_NS <= now;
}

/* Whether a dataset of these files can be described by a catalog: local
 * files mapped on demand, whose documents are known at open, none of them
 * modified in the last seconds. */
static int cataloguable(const tf_file *files, uint64_t nfiles) {
    if (nfiles < 2) return 0;
    uint64_t now = now_ns();
    for (uint64_t i = 0; i < nfiles; i++) {
        if (!files[i].lazy || files[i].eos.rows_only || !tf__parser_of(files[i].format)) return 0;
        tf__file_id id[2];
        tf__file_lazy_ids(&files[i], id);
        if (!settled(&id[0], now) || !settled(&id[1], now)) return 0;
    }
    return 1;
}

static void catalog_name(uint64_t key, char name[40]) { snprintf(name, 40, "%016llx.tfcat", (ull)key); }
static void set_name(uint64_t key, char name[40]) { snprintf(name, 40, "%016llx.tfset", (ull)key); }

/* Bytes the node's catalog directory may hold ($TOKENFEED_CATALOG_MAX, a
 * size as tf_parse_size reads it: "2GiB", "1.5G", "500M"; default 2 GiB):
 * past it, the catalogs used least recently are deleted (a catalog is about
 * 160 bytes per file, so 10^6-file sets would otherwise pile up in a home
 * directory's quota). A value that does not parse is refused at open
 * (tf__catalog_check_settings), so the default here is never silently used
 * in its place. */
#define CAT_DIR_MAX_DEFAULT ((uint64_t)2 << 30)
static uint64_t catalog_max(void) {
    const char *e = getenv("TOKENFEED_CATALOG_MAX");
    uint64_t v = CAT_DIR_MAX_DEFAULT;
    if (e && *e && tf_parse_size(e, "TOKENFEED_CATALOG_MAX", &v) != 0) v = CAT_DIR_MAX_DEFAULT;
    return v;
}

int tf__catalog_check_settings(void) {
    const char *e = getenv("TOKENFEED_CATALOG_MAX");
    char *dir = catalog_dir();
    uint64_t v;
    int rc = dir && e && *e ? tf_parse_size(e, "$TOKENFEED_CATALOG_MAX (the bytes the node's catalog directory may hold)", &v) : 0;
    free(dir);
    return rc;
}

/* Bytes of catalog above which it is stored compressed. */
static size_t pack_above(void) {
    size_t above = CAT_PACK_ABOVE;
#ifdef TF_TEST_HOOKS
    /* (tests reach the compressed form without writing 4 MiB of catalog) */
    const char *t = getenv("TOKENFEED_TEST_CATALOG_PACK_ABOVE");
    if (t && *t) above = (size_t)strtoull(t, NULL, 10);
#endif
    return above;
}

/* The node's catalog b, compressed when that is possible and worth it
 * (see the layout above): *out to write (b itself, or packed, which the
 * caller frees). */
static const tf__byte_wr *pack(const tf__byte_wr *b, tf__byte_wr *packed) {
#ifdef TF_HAVE_ZSTD
    if (b->err || b->n <= pack_above()) return b;
    size_t cap = ZSTD_compressBound(b->n);
    packed->p = malloc(16 + cap);
    if (!packed->p) return b;
    size_t z = ZSTD_compress(packed->p + 16, cap, b->p, b->n, 1);
    if (ZSTD_isError(z)) {
        free(packed->p);
        packed->p = NULL;
        return b;
    }
    memcpy(packed->p, PACK_MAGIC, 8);
    tf__put_le64(packed->p + 8, b->n);
    packed->n = 16 + z;
    packed->err = 0;
    return packed;
#else
    (void)packed;
    return b;
#endif
}

/* A catalog read as *buf, *len: unpacked in place when compressed. 0, or 1
 * when it cannot be (damaged, too large, or this build has no zstd): then
 * unusable, as one that does not parse. */
static int unpack(uint8_t **buf, size_t *len) {
    if (*len < 16 || memcmp(*buf, PACK_MAGIC, 8) != 0) return 0;
#ifdef TF_HAVE_ZSTD
    uint64_t n = tf__le64(*buf + 8);
    unsigned long long framed = ZSTD_getFrameContentSize(*buf + 16, *len - 16);
    if (n < 16 || n > CAT_MAX_BYTES || framed != n) return 1;
    uint8_t *raw = tf__table_alloc((size_t)n, 0);
    if (!raw) return 1;
    size_t got = ZSTD_decompress(raw, (size_t)n, *buf + 16, *len - 16);
    if (ZSTD_isError(got) || got != n) {
        free(raw);
        return 1;
    }
    free(*buf);
    *buf = raw;
    *len = (size_t)n;
    return 0;
#else
    return 1;
#endif
}

/* A catalog beside the data (b, its header 40 bytes, its file records
 * [40, end)): the records replaced by their zstd frame when that is
 * possible and worth it (version 4, CAT_PACKED; see the layout). Returns
 * how many bytes shorter b became (0: left as it was). */
static size_t pack_records(tf__byte_wr *b, size_t end) {
#ifdef TF_HAVE_ZSTD
    size_t raw = end - 40;
    if (b->err || end < 40 || raw <= pack_above()) return 0;
    size_t cap = ZSTD_compressBound(raw);
    uint8_t *z = malloc(16 + cap);
    if (!z) return 0;
    size_t zn = ZSTD_compress(z + 16, cap, b->p + 40, raw, 3);
    if (ZSTD_isError(zn) || 16 + zn >= raw) {
        free(z);
        return 0;
    }
    tf__put_le64(z, raw);
    tf__put_le64(z + 8, zn);
    memcpy(b->p + 40, z, 16 + zn);
    memmove(b->p + 40 + 16 + zn, b->p + end, b->n - end);
    free(z);
    size_t shorter = raw - 16 - zn;
    b->n -= shorter;
    tf__put_le32(b->p + 8, CAT_VERSION_PACKED);
    tf__put_le32(b->p + 12, tf__le32(b->p + 12) | CAT_PACKED);
    return shorter;
#else
    (void)b;
    (void)end;
    return 0;
#endif
}

/* A catalog read as *buf, *len whose file records are compressed
 * (CAT_PACKED): checked against its checksum as stored, then expanded in
 * place into the layout of version 3 with its checksum made anew, for the
 * parse that follows. 0 (also when not packed), or 1 when it cannot be
 * (damaged, too large, or this build has no zstd): unusable, as one that
 * does not parse. */
static int expand_records(uint8_t **buf, size_t *len) {
    const uint8_t *b = *buf;
    size_t n = *len;
    if (n < 40 + 16 + 8 || memcmp(b, CAT_MAGIC, 8) != 0 || tf__le32(b + 8) != CAT_VERSION_PACKED) return 0;
    if (!(tf__le32(b + 12) & CAT_PACKED)) return 1;
#ifdef TF_HAVE_ZSTD
    if (tf_hash64(b, n - 8, 0) != tf__le64(b + n - 8)) return 1;
    uint64_t raw = tf__le64(b + 40), zn = tf__le64(b + 48);
    if (zn > n - 40 - 16 - 8 || raw > CAT_MAX_BYTES || ZSTD_getFrameContentSize(b + 56, (size_t)zn) != raw) return 1;
    size_t rest = n - 56 - (size_t)zn, out_n = 40 + (size_t)raw + rest;
    uint8_t *out = tf__table_alloc(out_n, 0);
    if (!out) return 1;
    memcpy(out, b, 40);
    size_t got = ZSTD_decompress(out + 40, (size_t)raw, b + 56, (size_t)zn);
    if (ZSTD_isError(got) || got != raw) {
        free(out);
        return 1;
    }
    memcpy(out + 40 + raw, b + 56 + zn, rest);
    tf__put_le32(out + 8, CAT_VERSION);
    tf__put_le32(out + 12, tf__le32(out + 12) & ~CAT_PACKED);
    tf__put_le64(out + out_n - 8, tf_hash64(out, out_n - 8, 0));
    free(*buf);
    *buf = out;
    *len = out_n;
    return 0;
#else
    return 1;
#endif
}

/* Write b as name in the node's catalog directory, whole or not at all (best
 * effort: a node without a writable catalog directory opens by parsing). */
static void write_named(const char *name, const tf__byte_wr *b) {
    char *dir = catalog_dir();
    if (!dir) return;
    int dfd = -1, fd = -1;
    char tmp[64];
    if (!b->err && (dfd = open_catalog_dir(dir, 1)) >= 0 && tf__tmp_create(dfd, dir, "catalog", tmp, sizeof tmp, &fd) == 0) {
        int rc = fchmod(fd, 0600) == 0 ? 0 : -errno; /* this user's, as its directory */
        if (rc == 0) rc = tf__pwrite_all(fd, b->p, b->n, 0, dir);
        close(fd);
        if (rc == 0) rc = tf__rename_at(dfd, dir, tmp, name, 0);
        if (rc != 0) unlinkat(dfd, tmp, 0);
        else { /* within catalog_max(): the catalogs used least recently go (a load marks one used) */
            static const char *const ours[] = {".tfcat", ".tfset", NULL};
            tf__dir_trim(dfd, ours, name, b->n, catalog_max());
        }
    }
    if (dfd >= 0) close(dfd);
    tf__clearerr();
    free(dir);
}

/* Whether name in the node's catalog directory holds b already: an open
 * that found nothing changed leaves it as it is (same inode, no write). */
static int named_holds(const char *name, const tf__byte_wr *b) {
    char *dir = catalog_dir();
    int dfd = dir && !b->err ? open_catalog_dir(dir, 0) : -1, same = 0;
    uint8_t *buf = NULL;
    size_t len = 0;
    if (dfd >= 0 && tf__read_file_trusted(dfd, dir, name, b->n + 1, 1, (uid_t)-1, &buf, &len, NULL) == 0)
        same = len == b->n && memcmp(buf, b->p, len) == 0;
    if (dfd >= 0) close(dfd);
    free(buf);
    free(dir);
    tf__clearerr();
    return same;
}

/* The checksum that ends every catalog and set record. */
static void seal(tf__byte_wr *b) {
    tf__xxh64_state h;
    tf__xxh64_reset(&h, 0);
    if (!b->err) tf__xxh64_update(&h, b->p, b->n);
    put64(b, tf__xxh64_digest(&h));
}

/* Write the catalog: the header, the files, then ndeps dependencies already
 * serialised in deps. */
static void write_catalog(uint64_t key, uint32_t flags, const tf_file *files, uint64_t nfiles, const tf__byte_wr *deps,
                          uint64_t ndeps) {
    tf__byte_wr b = {0};
    tf__byte_put(&b, CAT_MAGIC, 8);
    put32(&b, CAT_VERSION);
    put32(&b, flags);
    put64(&b, key);
    put64(&b, nfiles);
    put64(&b, ndeps);
    for (uint64_t i = 0; i < nfiles; i++) put_file(&b, &files[i], i ? &files[i - 1] : NULL, 0, 0);
    if (deps->err) b.err = deps->err;
    else tf__byte_put(&b, deps->p, deps->n);
    seal(&b);
    char name[40];
    catalog_name(key, name);
    tf__byte_wr packed = {0};
    write_named(name, pack(&b, &packed));
    free(packed.p);
    free(b.p);
}

/* The companion files that files without one may later get: names that must
 * stay absent. */
static uint64_t put_absent_indexes(tf__byte_wr *d, const tf_file *files, uint64_t nfiles) {
    uint64_t k = 0;
    for (uint64_t i = 0; i < nfiles; i++) {
        char *ip = absent_index(&files[i]);
        if (ip) {
            tf__file_id none = {0};
            put_str(d, ip);
            put_id(d, &none);
            free(ip);
            k++;
        }
    }
    return k;
}

static void save_files(const char *const *paths, size_t n, const tf_open_options *opt, const tf_file *files,
                       uint64_t nfiles, int all_files) {
    if (!cataloguable(files, nfiles)) return;
    tf__byte_wr d = {0};
    uint64_t ndeps = 0;
    if (!all_files) {
        (void)each_dep(paths, n, dep_count, &ndeps);
        (void)each_dep(paths, n, dep_put, &d);
    }
    /* A tokenfeed dataset opened as its directories: each path has its
     * manifest (a dependency), every file is one of their shards. */
    int trust = ndeps == n;
    for (uint64_t i = 0; trust && i < nfiles; i++) trust = of_manifest(&files[i]);
    if (trust) { /* every manifest recorded known and settled */
        tf__byte_rd r = {d.p, d.n, 0, 0};
        uint64_t now = now_ns();
        for (uint64_t k = 0; trust && k < ndeps; k++) {
            char *p = get_str(&r);
            tf__file_id id;
            get_id(&r, &id);
            trust = !r.bad && id.known && settled(&id, now);
            free(p);
        }
    }
    ndeps += put_absent_indexes(&d, files, nfiles);
    write_catalog(catalog_key(0, paths, n, opt), trust ? CAT_TRUST : 0, files, nfiles, &d, ndeps);
    free(d.p);
}

void tf__catalog_save(const char *const *paths, size_t n, const tf_open_options *opt, const tf_file *files,
                      uint64_t nfiles) {
    save_files(paths, n, opt, files, nfiles, 0);
}

void tf__catalog_save_files(const char *const *paths, size_t n, const tf_open_options *opt, const tf_file *files,
                            uint64_t nfiles) {
    save_files(paths, n, opt, files, nfiles, 1);
}

/* Whether dir is the directory part of path ("." for none). */
static int parent_is(const char *path, const char *dir) {
    const char *slash = strrchr(path, '/');
    if (!slash) return strcmp(dir, ".") == 0;
    size_t n = (size_t)(slash - path);
    if (n == 0) return strcmp(dir, "/") == 0;
    return strlen(dir) == n && memcmp(path, dir, n) == 0;
}

int tf__catalog_save_set(const char *const *spec, size_t nspec, const tf_open_options *opt, const tf_file *files,
                         uint64_t nfiles, const char *const *dirs, const tf__file_id *dir_ids, size_t ndirs) {
    if (!cataloguable(files, nfiles) || ndirs == 0) return 1;
    uint64_t now = now_ns();
    for (size_t k = 0; k < ndirs; k++) {
        tf__file_id cur;
        /* the directory as it was listed, settled, and still so */
        if (!dir_ids[k].known || !settled(&dir_ids[k], now) || tf__file_id_get(dirs[k], &cur) != 0 ||
            !same_id(&cur, &dir_ids[k]))
            return 1;
    }
    /* the directories must hold every file, or a file could change unseen */
    for (uint64_t i = 0; i < nfiles; i++) {
        int in = 0, aux_in = files[i].aux_path == NULL;
        for (size_t k = 0; k < ndirs; k++) {
            in = in || parent_is(files[i].path, dirs[k]);
            aux_in = aux_in || parent_is(files[i].aux_path, dirs[k]);
        }
        if (!in || !aux_in) return 1;
    }
    /* A small record: the directories, and the key of the catalog of the
     * files they hold (written by the open that listed them), which it
     * trusts while the directories are unchanged. */
    const char **paths = malloc(nfiles * sizeof *paths);
    if (!paths) return 1;
    for (uint64_t i = 0; i < nfiles; i++) paths[i] = files[i].path;
    uint64_t files_key = catalog_key(0, paths, (size_t)nfiles, opt);
    free(paths);
    uint64_t key = catalog_key(1, spec, nspec, opt);
    tf__byte_wr b = {0};
    tf__byte_put(&b, SET_MAGIC, 8);
    put32(&b, CAT_VERSION);
    put32(&b, 0);
    put64(&b, key);
    put64(&b, files_key);
    put64(&b, ndirs);
    for (size_t k = 0; k < ndirs; k++) {
        put_str(&b, dirs[k]);
        put_id(&b, &dir_ids[k]);
    }
    seal(&b);
    char name[40];
    set_name(key, name);
    if (!named_holds(name, &b)) write_named(name, &b);
    int rc = b.err ? 1 : 0;
    free(b.p);
    return rc;
}

/* Delete the catalog of key (a file it describes changed). */
static void forget_catalog(uint64_t key) {
    char *dir = catalog_dir();
    if (!dir) return;
    char name[40];
    catalog_name(key, name);
    int dfd = open_catalog_dir(dir, 0);
    if (dfd >= 0) {
        unlinkat(dfd, name, 0);
        close(dfd);
    }
    free(dir);
}

/* Fault in a large fresh allocation with one call instead of a page fault per
 * page as it is filled (at 10^4 files, page faults were most of an open). */
static void prefault(void *p, size_t n) {
#ifdef MADV_POPULATE_WRITE
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)p + pg - 1) & ~(uintptr_t)(pg - 1), e = ((uintptr_t)p + n) & ~(uintptr_t)(pg - 1);
    if (p && e > a) (void)madvise((void *)a, e - a, MADV_POPULATE_WRITE);
#else
    (void)p;
    (void)n;
#endif
}

static void free_files(tf_file *files, uint64_t n) {
    for (uint64_t i = 0; i < n; i++) tf__file_close(&files[i]);
    free(files);
}

static int id_at(const uint8_t *p, tf__file_id *id) {
    id->dev = tf__le64(p);
    id->ino = tf__le64(p + 8);
    id->size = tf__le64(p + 16);
    id->mtime_ns = tf__le64(p + 24);
    uint64_t k = tf__le64(p + 32);
    id->known = (int)(k & 3);
    return k <= 2 ? 0 : -1;
}

/* prefix + s (n bytes) + t (m bytes), malloc'ed. */
/* prefix (plen bytes) + s (n) + t (m) + NUL into out, which holds them. */
static char *put3(char *out, const char *prefix, size_t plen, const char *s, size_t n, const void *t, size_t m) {
    if (!out) return NULL;
    memcpy(out, prefix, plen);
    memcpy(out + plen, s, n);
    memcpy(out + plen + n, t, m);
    out[plen + n + m] = '\0';
    return out;
}

static char *join3(const char *prefix, size_t plen, const char *s, size_t n, const void *t, size_t m) {
    return put3(malloc(plen + n + m + 1), prefix, plen, s, n, t, m);
}

/* join3 into an arena. */
static char *ajoin3(tf__arena *a, const char *prefix, size_t plen, const char *s, size_t n, const void *t, size_t m) {
    return put3(tf__arena_alloc(a, plen + n + m + 1), prefix, plen, s, n, t, m);
}

/* A string of the catalog (get_str's) into an arena: NULL when absent or bad. */
static char *aget_str(tf__byte_rd *r, tf__arena *a) {
    uint32_t n = get32(r);
    if (!n || r->bad) return NULL;
    const uint8_t *p = tf__byte_take(r, n - 1);
    char *s = p && !memchr(p, 0, n - 1) ? ajoin3(a, "", 0, "", 0, p, n - 1) : NULL;
    if (!s) r->bad = 1;
    return s;
}

/* A zeroed table of n files read from a catalog, and the arena their paths
 * and lazy records go into (*ar, one reference for the caller to release
 * once the files hold theirs), with the open options' index directory copied
 * into it (*index_dir). NULL when out of memory. */
static tf_file *files_table(uint64_t n, const tf_open_options *opt, tf__arena **ar, const char **index_dir) {
    *ar = NULL;
    *index_dir = NULL;
    tf_file *files = n <= SIZE_MAX / sizeof *files ? tf__table_alloc(n * sizeof *files, 1) : NULL;
    if (files && n * sizeof *files < TF_TABLE_HUGE / 2) prefault(files, n * sizeof *files);
    tf__arena *a = files ? tf__arena_new() : NULL;
    if (a && opt && opt->index_dir && !(*index_dir = ajoin3(a, "", 0, "", 0, opt->index_dir, strlen(opt->index_dir)))) {
        tf__arena_release(a);
        a = NULL;
    }
    if (!a) {
        free(files);
        return NULL;
    }
    *ar = a;
    return files;
}

/* An entry of the catalog into f (zeroed), prev the one before (NULL for the
 * first), its paths under prefix (plen bytes; a catalog beside the data):
 * 0, or -1 when the catalog is unusable. */
static int read_entry(tf__byte_rd *r, tf_file *f, const tf_file *prev, const char *prefix, size_t plen,
                      tf__arena *ar, const char *index_dir, int nested) {
    f->arena = ar; /* the file's paths and lazy record live there */
    tf__arena_ref(ar);
    uint32_t shared = get32(r), rest = get32(r);
    const uint8_t *tail = tf__byte_take(r, rest);
    if (r->bad || (shared && (!prev || shared > strlen(prev->path) - plen)) || (!shared && !rest) ||
        memchr(tail, 0, rest) ||
        !(f->path = ajoin3(ar, prefix, plen, prev ? prev->path + plen : "", shared, tail, rest)))
        return -1;
    /* beside the data, a name within the directory: never a path elsewhere
     * (a dataset's own catalog, nested, is checked name by name against its
     * manifest instead) */
    if (plen && !nested && (strchr(f->path + plen, '/') || !strcmp(f->path + plen, ".") || !strcmp(f->path + plen, "..")))
        return -1;
    f->aux_path = aget_str(r, ar);
    if (r->bad) return -1;
    if (f->aux_path && plen && (strchr(f->aux_path, '/') || !strcmp(f->aux_path, ".") || !strcmp(f->aux_path, "..")))
        return -1;
    if (f->aux_path && plen && !(f->aux_path = ajoin3(ar, prefix, plen, "", 0, f->aux_path, strlen(f->aux_path))))
        return -1;
    const uint8_t *p = tf__byte_take(r, ENTRY_FIXED);
    if (r->bad || !p) return -1;
    f->format = (tf_format)tf__le32(p);
    f->dtype = (tf_dtype)tf__le32(p + 4);
    f->doc_kind = (tf_doc_kind)tf__le32(p + 8);
    uint32_t flags = tf__le32(p + 12);
    p += 16;
    f->num_tokens = tf__le64(p);
    f->num_docs = tf__le64(p + 8);
    f->vocab_size = tf__le64(p + 16);
    f->eos.id = tf__le64(p + 24);
    f->fingerprint = tf__le64(p + 32);
    f->blocks.tokens = tf__le64(p + 40);
    f->blocks.count = tf__le64(p + 48);
    const uint8_t *priv = p + 56; /* TF__CATALOG_PRIV_BYTES: the format's own */
    int64_t tok_off = (int64_t)tf__le64(p + 80);
    tf__file_id id[2];
    memset(id, 0, sizeof id);
    if (id_at(p + 88, &id[0]) != 0) return -1;
    if (flags & ENTRY_AUX_ID) {
        const uint8_t *q = tf__byte_take(r, 40);
        if (!q || id_at(q, &id[1]) != 0) return -1;
    }
    if (!tf__parser_of(f->format) || !tf_dtype_size(f->dtype) || f->doc_kind > TF_DOCS_FORMAT ||
        !(flags & ENTRY_AUX_ID) != !f->aux_path)
        return -1;
    /* the format's row reads its private state back and says how its blocks
     * are read: an entry claiming what its format has not is refused */
    const tf__format_ops *ops = tf__format_row_of(f->format)->ops;
    if ((flags & 1) && !(ops && ops->blocks)) return -1;
    if ((flags & 2) && !(ops && ops->catalog_unpack)) return -1;
    f->format_ops = ops;
    f->blocks.ops = (flags & 1) ? ops->blocks : NULL;
    if (!f->blocks.ops) f->blocks.tokens = f->blocks.count = 0;
    /* the blocks a file's header implies: the engine sizes its block cache by
     * the entry's before the file is first touched */
    else if (!f->blocks.tokens || f->blocks.count != f->num_tokens / f->blocks.tokens + (f->num_tokens % f->blocks.tokens != 0))
        return -1;
    if (flags & 2) ops->catalog_unpack(f, priv);
    f->eos.split = (flags & 4) != 0;
    return tf__file_lazy_from_meta(f, index_dir, tf__parser_of(f->format), id, tok_off) != 0 ? -1 : 0;
}

/* File i changed since it was catalogued: parse it again in place. */
static int refresh_entry(tf_file *files, uint64_t i, const tf_open_options *opt) {
    /* a tokenfeed shard is checked against its manifest: open it all again */
    if (of_manifest(&files[i])) return -1;
    tf_file fresh;
    memset(&fresh, 0, sizeof fresh);
    tf_open_options o = *opt;
    o.format = files[i].format;
    int prc = tf__parser_of(files[i].format)(files[i].path, &o, &fresh);
    if (prc == 0) prc = tf__file_make_lazy(&fresh, opt, tf__parser_of(fresh.format));
    if (prc != 0) {
        tf__file_close(&fresh);
        return -1; /* the parsing open says what is wrong */
    }
    tf__file_close(&files[i]);
    files[i] = fresh;
    return 0;
}

/* Where a catalog is read from: the node's catalog directory (private), or
 * the data's own directory, whose files are named relative to prefix. */
typedef struct cat_src {
    char *dir;          /* owned */
    char name[64];
    int node;           /* the node's catalog directory: must be private */
    const char *prefix; /* "" for the node's */
} cat_src;

#define CAT_STALE 2   /* load_catalog: a dependency changed */
#define CAT_REFUSED 3 /* load_catalog: beside the data, a file not to be read (the error says why) */

/* A catalog or set record in buf: its magic, checksum and version checked,
 * *r set to read what follows the flags (*flags). 1 when it is whole. */
static int unseal(const uint8_t *buf, size_t len, const char *magic, tf__byte_rd *r, uint32_t *flags) {
    *r = (tf__byte_rd){buf, len, 0, 0};
    int ok = len > 8 + 8 + 24 + 8 && memcmp(buf, magic, 8) == 0;
    if (ok) {
        ok = tf_hash64(buf, len - 8, 0) == tf__le64(buf + len - 8);
        r->n = len - 8;
    }
    tf__byte_take(r, 8);
    ok = ok && get32(r) == CAT_VERSION;
    *flags = get32(r);
    return ok && !r->bad;
}

/* The catalog of key: 0 with *out (*nout files) filled, 1 when there is no
 * usable one, CAT_STALE when what it depends on changed, CAT_REFUSED when a
 * catalog beside the data is not this user's or its directory owner's, or
 * not a regular file (its message set); *stale set when
 * some files were parsed again. A catalog that is not trusted (see "Trusted
 * entries") is used only when need_trust is 0. */
static int load_catalog(const cat_src *src, uint64_t key, const tf_open_options *opt, int need_trust,
                        int force_trust, tf_file **out, uint64_t *nout, int *stale) {
    *out = NULL;
    *nout = 0;
    *stale = 0;
    if (!src->dir) return 1;
    uint8_t *buf = NULL;
    size_t len = 0;
    int dfd = -1;
    if (src->node) dfd = open_catalog_dir(src->dir, 0);
    else if (tf__dir_open(src->dir, 0, &dfd) != 0) dfd = -1;
    struct stat st, dst;
    /* this user's (in the node's directory), or beside the data this user's
     * or the directory owner's, and writable by no one else: not planted by
     * another user where anyone may create files (a sticky /tmp). All of it,
     * and the type (a FIFO never blocks the open) and size, is decided on the
     * descriptor before a byte is read. */
    uid_t also = (uid_t)-1;
    if (dfd >= 0 && !src->node && fstat(dfd, &dst) == 0) also = dst.st_uid;
    int rc = dfd >= 0 ? tf__read_file_trusted(dfd, src->dir, src->name, CAT_MAX_BYTES, 1, also, &buf, &len, &st) : 1;
    if (rc == 0 && src->node) (void)utimensat(dfd, src->name, NULL, AT_SYMLINK_NOFOLLOW); /* used: pruned last */
    if (dfd >= 0) close(dfd);
    /* refused beside the data: the caller says why (the message is kept) and
     * lists the set; anything else unusable is as absent */
    if (!src->node && (rc == -EPERM || rc == -EFBIG || rc == -ELOOP)) return CAT_REFUSED;
    tf__clearerr();
    if (rc != 0) return 1;
    if ((src->node && unpack(&buf, &len) != 0) || expand_records(&buf, &len) != 0) {
        free(buf);
        return 1;
    }
    tf__byte_rd r;
    uint32_t flags = 0;
    int ok = unseal(buf, len, CAT_MAGIC, &r, &flags);
    int trusted = (flags & CAT_TRUST) != 0 || force_trust, beside = (flags & CAT_BESIDE) != 0;
    /* (a catalog of objects, brought down with the data, describes versions
     * in object storage, not these files) */
    ok = ok && get64(&r) == key && (trusted || !need_trust) && beside == !src->node && !(flags & CAT_OBJECTS);
    uint64_t nfiles = get64(&r), ndeps = get64(&r);
    ok = ok && nfiles >= 2 && nfiles <= len / 64;
    const char *index_dir = NULL;
    tf__arena *ar = NULL;
    tf_file *files = ok ? files_table(nfiles, opt, &ar, &index_dir) : NULL;
    rc = files ? 0 : 1;
    size_t plen = strlen(src->prefix);
    for (uint64_t i = 0; files && i < nfiles && rc == 0; i++)
        if (read_entry(&r, &files[i], i ? &files[i - 1] : NULL, src->prefix, plen, ar, index_dir, 0) < 0) rc = 1;
    tf__arena_release(ar); /* the files hold it now */
    /* what the files depend on first: a changed one means the files are
     * described anew by the parsing open */
    dircache dc = {NULL, 0, -1};
    for (uint64_t d = 0; rc == 0 && d < ndeps; d++) {
        char *p = get_str(&r);
        tf__file_id id;
        get_id(&r, &id);
        char *full = p && plen ? join3(src->prefix, plen, "", 0, p, strlen(p)) : NULL;
        if (r.bad || !p || (plen && !full)) rc = 1;
        /* an absent name in a directory known unchanged is still absent */
        else if ((id.known || !trusted) && !unchanged(&dc, full ? full : p, &id)) rc = CAT_STALE;
        free(full);
        free(p);
    }
    if (rc == 0 && (r.bad || r.at != r.n)) rc = 1;
    for (uint64_t i = 0; rc == 0 && i < nfiles; i++) {
        if (trusted) {
            tf__file_lazy_set_catalog(&files[i], key, src->node ? forget_catalog : NULL);
            continue;
        }
        tf__file_id id[2];
        tf__file_lazy_ids(&files[i], id);
        if (!unchanged(&dc, files[i].path, &id[0]) || (files[i].aux_path && !unchanged(&dc, files[i].aux_path, &id[1]))) {
            if (refresh_entry(files, i, opt) != 0) rc = 1;
            else *stale = 1;
        }
    }
    dircache_close(&dc);
    free(buf);
    tf__clearerr();
    if (rc != 0) {
        if (files) free_files(files, nfiles);
        return rc;
    }
    *out = files;
    *nout = nfiles;
    return 0;
}

static cat_src node_src(uint64_t key) {
    cat_src src = {catalog_dir(), "", 1, ""};
    catalog_name(key, src.name);
    return src;
}

char *tf__prefix_dir(const char *prefix) {
    size_t n = strlen(prefix);
    while (n > 1 && prefix[n - 1] == '/') n--;
    return n && strcmp(prefix, "/") != 0 ? strndup(prefix, n) : strdup(n ? "/" : ".");
}

static cat_src beside_src(const char *prefix, uint64_t key) {
    cat_src src = {tf__prefix_dir(prefix), "", 0, prefix};
    snprintf(src.name, sizeof src.name, "%s%016llx", TF_DATA_CATALOG_STEM, (ull)key);
    return src;
}

int tf__catalog_load(const char *const *paths, size_t n, const tf_open_options *opt, tf_file **out,
                     uint64_t *nout) {
    int stale = 0;
    uint64_t key = catalog_key(0, paths, n, opt);
    cat_src src = node_src(key);
    int rc = load_catalog(&src, key, opt, 0, 0, out, nout, &stale);
    free(src.dir);
    if (rc == 0 && stale) tf__catalog_save(paths, n, opt, *out, *nout);
    return rc ? 1 : 0;
}

int tf__catalog_load_set(const char *const *spec, size_t nspec, const tf_open_options *opt, int immutable,
                         tf_file **out, uint64_t *nout) {
    *out = NULL;
    *nout = 0;
    uint64_t key = catalog_key(1, spec, nspec, opt);
    cat_src src = node_src(key);
    set_name(key, src.name);
    uint8_t *buf = NULL;
    size_t len = 0;
    int dfd = src.dir ? open_catalog_dir(src.dir, 0) : -1;
    int rc = dfd >= 0 ? tf__read_file_trusted(dfd, src.dir, src.name, 1u << 24, 1, (uid_t)-1, &buf, &len, NULL) : 1;
    if (rc == 0) (void)utimensat(dfd, src.name, NULL, AT_SYMLINK_NOFOLLOW);
    if (dfd >= 0) close(dfd);
    tf__clearerr();
    uint64_t files_key = 0;
    if (rc == 0) {
        tf__byte_rd r;
        uint32_t flags;
        int ok = unseal(buf, len, SET_MAGIC, &r, &flags);
        ok = ok && get64(&r) == key;
        files_key = get64(&r);
        uint64_t ndirs = get64(&r);
        ok = ok && ndirs >= 1 && ndirs <= len;
        /* the directories holding the files, unchanged since they were listed */
        dircache dc = {NULL, 0, -1};
        for (uint64_t k = 0; ok && k < ndirs; k++) {
            char *p = get_str(&r);
            tf__file_id id;
            get_id(&r, &id);
            ok = !r.bad && p && id.known == 1 && (immutable || unchanged(&dc, p, &id));
            free(p);
        }
        dircache_close(&dc);
        rc = ok && !r.bad && r.at == r.n ? 0 : 1;
    }
    free(buf);
    free(src.dir);
    if (rc != 0) return 1;
    int stale = 0;
    src = node_src(files_key);
    rc = load_catalog(&src, files_key, opt, 0, 1, out, nout, &stale);
    free(src.dir);
    return rc ? 1 : 0;
}

int tf__catalog_load_beside(const char *prefix, const char *pattern, const tf_open_options *opt, tf_file **out,
                            uint64_t *nout) {
    int stale = 0;
    uint64_t key = catalog_key(2, &pattern, 1, opt);
    cat_src src = beside_src(prefix, key);
    int rc = load_catalog(&src, key, opt, 1, 0, out, nout, &stale);
    free(src.dir);
    return rc;
}

int tf__catalog_write_beside(const char *prefix, const char *pattern, const tf_open_options *opt,
                             const tf_file *files, uint64_t nfiles, char *written, size_t cap) {
    size_t plen = strlen(prefix);
    for (uint64_t i = 0; i < nfiles; i++) {
        const char *ps[2] = {files[i].path, files[i].aux_path};
        for (int k = 0; k < 2; k++)
            if (ps[k] && (strncmp(ps[k], prefix, plen) != 0 || strchr(ps[k] + plen, '/')))
                TF_FAIL(-EINVAL, "%s: not in the directory of the shard set (%s): a catalog beside the data describes the files of one directory",
                        ps[k], *prefix ? prefix : ".");
    }
    if (nfiles < 2 || !cataloguable(files, nfiles))
        TF_FAIL(nfiles < 2 ? -EINVAL : -EAGAIN, "%s: %s", *prefix ? prefix : ".",
                nfiles < 2 ? "a catalog describes a shard set of at least two files"
                           : "a file of the set was modified in the last 2 seconds (or is not one a catalog can describe: a headerless file split at an eos id without its document index): a catalog records files once they have settled");
    uint64_t key = catalog_key(2, &pattern, 1, opt);
    cat_src src = beside_src(prefix, key);
    if (!src.dir) return -ENOMEM;
    tf__byte_wr b = {0};
    tf__byte_put(&b, CAT_MAGIC, 8);
    put32(&b, CAT_VERSION);
    put32(&b, CAT_TRUST | CAT_BESIDE);
    put64(&b, key);
    put64(&b, nfiles);
    put64(&b, 1);
    for (uint64_t i = 0; i < nfiles; i++) put_file(&b, &files[i], i ? &files[i - 1] : NULL, plen, 0);
    (void)pack_records(&b, b.n); /* (the records only: the identity below stays in place) */
    /* the one dependency: the directory itself, its identity taken once the
     * catalog is in it (creating the catalog changes it) */
    put_str(&b, ".");
    size_t id_at_off = b.n;
    tf__file_id none = {.known = 2};
    put_id(&b, &none);
    put64(&b, 0); /* the checksum, once the identity is in */
    int dfd = -1, fd = -1, rc = b.err;
    char tmp[64];
    if (!rc) rc = tf__dir_open(src.dir, 0, &dfd);
    if (!rc) rc = tf__tmp_create(dfd, src.dir, "catalog", tmp, sizeof tmp, &fd);
    if (!rc) {
        rc = tf__pwrite_all(fd, b.p, b.n, 0, src.dir);
        if (!rc) rc = tf__rename_at(dfd, src.dir, tmp, src.name, 0);
        if (rc) unlinkat(dfd, tmp, 0);
    }
    struct stat st;
    if (!rc && fstat(dfd, &st) != 0) rc = tf__seterr(-errno, "%s: cannot stat: %s", src.dir, strerror(errno));
    if (!rc) {
        /* rewritten in place (same size): the directory's identity stays */
        tf__file_id dir_id = {.size = (uint64_t)st.st_size,
                              .mtime_ns = (uint64_t)st.st_mtim.tv_sec * 1000000000ull + (uint64_t)st.st_mtim.tv_nsec,
                              .known = 2};
        tf__byte_wr idb = {0};
        put_id(&idb, &dir_id);
        if (idb.err) rc = idb.err;
        else memcpy(b.p + id_at_off, idb.p, idb.n);
        free(idb.p);
        tf__xxh64_state h;
        tf__xxh64_reset(&h, 0);
        tf__xxh64_update(&h, b.p, b.n - 8);
        tf__put_le64(b.p + b.n - 8, tf__xxh64_digest(&h));
        if (!rc) rc = tf__pwrite_all(fd, b.p, b.n, 0, src.dir);
        struct stat again;
        if (!rc && (fstat(dfd, &again) != 0 || again.st_mtim.tv_sec != st.st_mtim.tv_sec ||
                    again.st_mtim.tv_nsec != st.st_mtim.tv_nsec))
            rc = tf__seterr(-EAGAIN, "%s: the directory changed while its catalog was written: run again once the set is complete", src.dir);
    }
    if (fd >= 0) close(fd);
    if (dfd >= 0) close(dfd);
    if (!rc && written) snprintf(written, cap, "%s/%s", src.dir, src.name);
    free(b.p);
    free(src.dir);
    return rc;
}

/* ---- a catalog beside the data in object storage --------------------------- */

/* The end of reading n entries of a catalog into files (rc: 0 while every
 * entry was usable): 0 with the files handed out when the catalog was read to
 * its end, else 1 with them freed. */
static int parsed(const tf__byte_rd *r, int rc, tf__arena *ar, tf_file *files, uint64_t n, tf_file **out, uint64_t *nout) {
    if (rc == 0 && (r->bad || r->at != r->n)) rc = 1;
    tf__arena_release(ar); /* the files hold it now */
    tf__clearerr();
    if (rc != 0) {
        if (files) free_files(files, n);
        return 1;
    }
    *out = files;
    *nout = n;
    return 0;
}

/* A remote shard set's catalog (`tokenfeed index 's3://bucket/tokens/shard_[0-9]*.bin'`):
 * an object under the set's prefix, named TF_DATA_CATALOG_STEM + its key
 * (keyed as a catalog beside the data, in a space of its own, so that a copy
 * of the bucket on disk keeps both kinds apart). The records of a catalog
 * beside the data, names relative to the prefix, each identity the object's
 * size and, in place of a modification time, a hash of its version (its
 * ETag) as listed when the catalog was written; no dependency. Nothing here
 * is trusted: the open that reads it (csrc/remote/remote_open.c) checks the
 * set as listed now against it, name by name, size and version, and ignores
 * a catalog that differs in any. */

/* Whether the first touch of f reads f's own bytes only, as an entry of such
 * a catalog must: not a file with a companion (a Megatron .idx, a datatrove
 * .index, a document index) or compressed blocks, opened at open as without
 * a catalog. */
static int read_alone(const tf_file *f) {
    const tf__format_row *r = tf__format_row_of(f->format);
    return !f->aux_path && !f->eos.split && !f->blocks.ops && r && r->catalog;
}

/* Whether the open options opt (those keying the catalog) can read f as its
 * entry says: the format they name, if any, and a headerless file only with
 * their dtype (without one, an open reads no headerless file). What the
 * object's bytes say is checked when it is first touched (remote_open.c). */
static int as_opened(const tf_file *f, const tf_open_options *opt) {
    tf_format want = opt ? opt->format : TF_FORMAT_AUTO;
    tf_dtype dt = opt ? opt->raw_dtype : TF_DTYPE_INVALID;
    if (want != TF_FORMAT_AUTO && f->format != want) return 0;
    const tf__format_row *r = tf__format_row_of(f->format);
    return !(r && r->headerless) || (dt != TF_DTYPE_INVALID && f->dtype == dt);
}

void tf__catalog_objects_name(const char *pattern, const tf_open_options *opt, char *name, size_t cap) {
    snprintf(name, cap, "%s%016llx", TF_DATA_CATALOG_STEM, (ull)catalog_key(3, &pattern, 1, opt));
}

uint64_t tf__catalog_version_hash(const char *version) {
    return tf_hash64(version, strlen(version), 0x5446564552534e31ULL);
}

int tf__catalog_pack_objects(const char *prefix, const char *pattern, const tf_open_options *opt,
                             const tf_file *files, const uint64_t *sizes, const char *const *versions,
                             uint64_t nfiles, uint8_t **out, size_t *len) {
    *out = NULL;
    *len = 0;
    size_t plen = strlen(prefix);
    if (nfiles < 2) TF_FAIL(-EINVAL, "%s: a catalog describes a shard set of at least two objects", prefix);
    for (uint64_t i = 0; i < nfiles; i++) {
        const tf_file *f = &files[i];
        if (strncmp(f->path, prefix, plen) != 0 || !f->path[plen] || strchr(f->path + plen, '/'))
            TF_FAIL(-EINVAL, "%s: not an object directly under the shard set's prefix (%s): a catalog describes the objects of one prefix",
                    f->path, prefix);
        if (!read_alone(f))
            TF_FAIL(-EINVAL, "%s: a catalog in object storage describes llm.c, .npy, headerless and uncompressed tokenfeed shards (without a document index or a companion file); this one is %s",
                    f->path, tf__format_row_of(f->format) && tf__format_row_of(f->format)->pair ? tf__format_row_of(f->format)->pair
                             : f->blocks.ops ? "compressed" : "read with a companion file");
    }
    tf__byte_wr b = {0};
    tf__byte_put(&b, CAT_MAGIC, 8);
    put32(&b, CAT_VERSION);
    put32(&b, CAT_BESIDE | CAT_OBJECTS); /* (not CAT_TRUST: the open checks every entry against the listing) */
    put64(&b, catalog_key(3, &pattern, 1, opt));
    put64(&b, nfiles);
    put64(&b, 0);
    for (uint64_t i = 0; i < nfiles; i++) {
        tf__file_id id = {.size = sizes[i], .mtime_ns = tf__catalog_version_hash(versions[i]), .known = 2};
        put_file_as(&b, &files[i], i ? &files[i - 1] : NULL, plen, &id);
    }
    seal(&b);
    if (b.err) {
        free(b.p);
        return b.err;
    }
    *out = b.p;
    *len = b.n;
    return 0;
}

int tf__catalog_parse_objects(const char *prefix, const char *pattern, const tf_open_options *opt,
                              const uint8_t *buf, size_t len, tf_file **out, uint64_t *nout) {
    *out = NULL;
    *nout = 0;
    tf__byte_rd r;
    uint32_t flags = 0;
    int ok = unseal(buf, len, CAT_MAGIC, &r, &flags);
    ok = ok && (flags & CAT_OBJECTS) && (flags & CAT_BESIDE) && get64(&r) == catalog_key(3, &pattern, 1, opt);
    uint64_t nfiles = get64(&r), ndeps = get64(&r);
    ok = ok && !r.bad && ndeps == 0 && nfiles >= 2 && nfiles <= len / 64;
    const char *index_dir = NULL;
    tf__arena *ar = NULL;
    tf_file *files = ok ? files_table(nfiles, opt, &ar, &index_dir) : NULL;
    size_t plen = strlen(prefix);
    int rc = files ? 0 : 1;
    for (uint64_t i = 0; rc == 0 && i < nfiles; i++) {
        tf_file *f = &files[i];
        tf__file_id id[2];
        if (read_entry(&r, f, i ? &files[i - 1] : NULL, prefix, plen, ar, index_dir, 0) < 0 || !read_alone(f))
            rc = 1;
        else if (tf__file_lazy_ids(f, id), id[0].known != 2) /* a size and a version's hash, nothing else */
            rc = 1;
        else if (!as_opened(f, opt))
            rc = 1;
    }
    return parsed(&r, rc, ar, files, nfiles, out, nout);
}

/* ---- a tokenfeed dataset's own catalog ------------------------------------ */

/* The catalog of a tokenfeed dataset, written into its directory as
 * TF_DATASET_CATALOG_NAME when the dataset is written (and by `tokenfeed
 * index DIR`): the same records as above, names relative to the directory,
 * identities reduced to sizes, no dependency, keyed by the manifest's bytes,
 * so that it describes the dataset of exactly that manifest and is ignored
 * once the dataset is rewritten. A remote open reads it instead of every
 * shard's header (csrc/remote/remote_open.c); each shard is then checked
 * against its entry when first touched. */
#define CAT_DATASET 4u

static uint64_t dataset_key(const uint8_t *manifest, size_t len) {
    return tf_hash64(manifest, len, 0x5446445343415431ULL);
}

/* Whether f, its path without its first strip bytes, is shard i of the
 * manifest m as the manifest describes it: a dataset's catalog adds to its
 * manifest, never contradicts it. */
static int is_manifest_shard(const tf_file *f, size_t strip, const tf_manifest *m, uint64_t i) {
    const tf_manifest_shard *sh = &m->shards[i];
    tf__native_info ni;
    return strlen(f->path) >= strip && strcmp(f->path + strip, sh->name) == 0 && of_manifest(f) &&
           tf__native_info_of(f, &ni) == 0 && !f->aux_path && f->num_tokens == sh->num_tokens &&
           f->num_docs == sh->num_docs && ni.sum_tokens == sh->tokens_checksum &&
           ni.sum_docs == sh->docs_checksum &&
           f->dtype == m->dtype && f->vocab_size == m->vocab_size;
}

int tf__catalog_write_dataset(const char *dir, const tf_file *files, uint64_t nfiles, char *written, size_t cap) {
    int dfd = -1;
    TF_TRY(tf__dir_open(dir, 0, &dfd));
    uint8_t *mb = NULL, *again = NULL;
    size_t mlen = 0, alen = 0;
    tf_manifest m;
    memset(&m, 0, sizeof m);
    int fd = -1, have_m = 0;
    char tmp[64];
    tf__byte_wr b = {0};
    int rc = tf__read_file_at(dfd, dir, TF_MANIFEST_NAME, (size_t)1 << 30, &mb, &mlen);
    if (!rc) rc = tf__parse_manifest(TF_MANIFEST_NAME, mb, mlen, &m);
    have_m = rc == 0;
    if (!rc && m.num_shards == 0) rc = tf__seterr(-EINVAL, "%s: the dataset has no shards: nothing to catalogue", dir);
    if (!rc && nfiles != m.num_shards)
        rc = tf__seterr(-EINVAL, "%s: %llu files given for the %llu shards of its manifest: not the dataset opened from this directory",
                        dir, (ull)nfiles, (ull)m.num_shards);
    /* every file the manifest's shard at its place, named within one
     * directory (the catalog records names relative to it) */
    size_t strip = 0;
    if (!rc) {
        size_t pl = strlen(files[0].path), nl = strlen(m.shards[0].name);
        strip = pl >= nl ? pl - nl : 0;
    }
    for (uint64_t i = 0; !rc && i < nfiles; i++)
        if (!is_manifest_shard(&files[i], strip, &m, i) || strncmp(files[i].path, files[0].path, strip) != 0)
            rc = tf__seterr(-EINVAL, "%s: shard %llu is not the manifest's %s: not the dataset opened from this directory (or it was rewritten since it was opened)",
                            files[i].path, (ull)i, m.shards[i].name);
    if (!rc) {
        tf__byte_put(&b, CAT_MAGIC, 8);
        put32(&b, CAT_VERSION);
        put32(&b, CAT_TRUST | CAT_BESIDE | CAT_DATASET);
        put64(&b, dataset_key(mb, mlen));
        put64(&b, nfiles);
        put64(&b, 0);
        for (uint64_t i = 0; i < nfiles; i++) put_file(&b, &files[i], i ? &files[i - 1] : NULL, strip, 1);
        seal(&b);
        rc = b.err;
    }
    if (!rc) rc = tf__tmp_create(dfd, dir, "catalog", tmp, sizeof tmp, &fd);
    if (!rc) {
        rc = tf__pwrite_all(fd, b.p, b.n, 0, dir);
        close(fd);
        /* the manifest it describes still in place (a concurrent rewrite of
         * the dataset would leave a catalog of the old one: harmless, as it
         * is keyed by the manifest, but not what was asked) */
        if (!rc) rc = tf__read_file_at(dfd, dir, TF_MANIFEST_NAME, (size_t)1 << 30, &again, &alen);
        if (!rc && (alen != mlen || memcmp(again, mb, mlen) != 0))
            rc = tf__seterr(-EAGAIN, "%s: the dataset was rewritten while its catalog was written: run again", dir);
        if (!rc) rc = tf__rename_at(dfd, dir, tmp, TF_DATASET_CATALOG_NAME, 0);
        if (rc) unlinkat(dfd, tmp, 0);
    }
    if (!rc && written) snprintf(written, cap, "%s/%s", dir, TF_DATASET_CATALOG_NAME);
    if (have_m) tf__manifest_free(&m);
    free(mb);
    free(again);
    free(b.p);
    close(dfd);
    return rc;
}

int tf__catalog_write_written(const char *dir, const tf__written_shard *shards, uint64_t n) {
    if (n == 0) return tf__catalog_write_dataset(dir, NULL, 0, NULL, 0); /* says there is nothing to catalogue */
    const char *index_dir = NULL;
    tf__arena *ar = NULL;
    tf_file *files = files_table(n, NULL, &ar, &index_dir);
    if (!files) return -ENOMEM;
    size_t dlen = strlen(dir);
    const char *sep = dlen && dir[dlen - 1] == '/' ? "" : "/"; /* as tf__path_join, as an open names them */
    int rc = 0;
    for (uint64_t i = 0; rc == 0 && i < n; i++) {
        tf_file *f = &files[i];
        f->arena = ar;
        tf__arena_ref(ar);
        if (!(f->path = ajoin3(ar, dir, dlen, sep, strlen(sep), shards[i].name, strlen(shards[i].name)))) rc = -ENOMEM;
        if (rc == 0) rc = tf__parse_native_header(f->path, shards[i].header, TF_NATIVE_HEADER_SIZE, shards[i].size, f);
        /* a file known from its metadata, as from a catalog: its size, and its
         * first token's offset as an open that maps it finds it (none when
         * compressed: tf__file_token_offset) */
        tf__file_id id[2] = {{.size = shards[i].size, .known = 2}, {0}};
        tf__native_info ni;
        if (rc == 0) rc = tf__native_info_of(f, &ni);
        if (rc == 0)
            rc = tf__file_lazy_from_meta(f, index_dir, tf__open_native, id, f->blocks.ops ? -1 : (int64_t)ni.tokens_at);
    }
    tf__arena_release(ar); /* the files hold it now */
    if (rc == 0) rc = tf__catalog_write_dataset(dir, files, n, NULL, 0);
    free_files(files, n);
    return rc;
}

int tf__catalog_parse_dataset(const char *dir, const uint8_t *manifest, size_t mlen, const tf_manifest *m,
                              const uint8_t *buf, size_t len, const tf_open_options *opt, tf_file **out,
                              uint64_t *nout) {
    *out = NULL;
    *nout = 0;
    tf__byte_rd r;
    uint32_t flags = 0;
    int ok = unseal(buf, len, CAT_MAGIC, &r, &flags);
    ok = ok && (flags & CAT_DATASET) && get64(&r) == dataset_key(manifest, mlen);
    uint64_t nfiles = get64(&r), ndeps = get64(&r);
    ok = ok && !r.bad && ndeps == 0 && nfiles == m->num_shards && nfiles >= 1 && nfiles <= len / 64;
    const char *index_dir = NULL;
    tf__arena *ar = NULL;
    tf_file *files = ok ? files_table(nfiles, opt, &ar, &index_dir) : NULL;
    size_t plen = strlen(dir) + 1;
    char *prefix = files ? malloc(plen + 1) : NULL;
    int rc = prefix ? 0 : 1;
    if (prefix) snprintf(prefix, plen + 1, "%s/", dir);
    for (uint64_t i = 0; rc == 0 && i < nfiles; i++) {
        tf_file *f = &files[i];
        /* the manifest's shard, in the manifest's order */
        if (read_entry(&r, f, i ? &files[i - 1] : NULL, prefix, plen, ar, index_dir, 1) < 0 ||
            !is_manifest_shard(f, plen, m, i))
            rc = 1;
    }
    free(prefix);
    return parsed(&r, rc, ar, files, nfiles, out, nout);
}
