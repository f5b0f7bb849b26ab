/*
 * docindex.c — document indexes of headerless token files split at an
 * end-of-document id (nanoGPT, OLMo and datatrove token files opened with
 * eos_id).
 *
 * Such a file says nothing of its documents but the eos tokens inside it.
 * Concat packing needs only the row in hand (the engine finds the eos tokens
 * in it); best-fit and document packing place whole documents and need all
 * of them at open. Scanning the file at every open would make opening
 * O(tokens), so the index is built once (tf_doc_index_build, `tokenfeed
 * index`) and kept in "<file>.tfdocs" beside the data, or in the node's index
 * directory when the data's directory is not writable.
 *
 * Layout (little-endian, docs/format.md "Document index"):
 *   0  magic "TFDOCIX\0"          32 data mtime (ns since the epoch, int64)
 *   8  version u32 (1)            40 number of documents D
 *  12  token dtype u32 (tf_dtype) 48 XXH64 of the D ends
 *  16  eos id u64                 56 XXH64 of bytes [0, 56)
 *  24  data file size u64         64 D uint64 cumulative document ends
 * A document ends after each eos token; tokens after the last eos form a last
 * document, so the last end is the token count.
 * Version 2, written when the ends come from OLMo's document metadata
 * (x.csv.gz beside x.npy, olmo_meta.c), records that file too, so that an
 * index is refused when the metadata changes or goes as when the tokens do:
 *  56 metadata size u64           72 metadata inode u64
 *  64 metadata mtime (ns, int64)  80 zero u64
 *  88 XXH64 of bytes [0, 88)      96 D uint64 cumulative document ends An index is used only if its
 * header, dtype, eos id, data size and mtime match and both checksums hold;
 * otherwise open refuses it and says how to rebuild it (a stale index would
 * give documents of another file).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "olmo_meta.h"
#include "safe_fs.h"
#include "source.h"

typedef unsigned long long ull;

#define DOCIX_MAGIC "TFDOCIX\0"
#define DOCIX_VERSION 1u
#define DOCIX_HEADER 64u
#define DOCIX_VERSION_META 2u /* built from OLMo's metadata: the header records it */
#define DOCIX_HEADER_META 96u

static int64_t mtime_ns(const struct stat *st) {
    return (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
}

/* The index's name in index_dir: the data file's absolute path hashed (two
 * data files of one name in different directories get different indexes). */
static char *cache_name(const char *data_path, const char *index_dir) {
    char *abs = tf__listed_realpath(data_path); /* (a shard set's listing resolved its directory once) */
    if (!abs) abs = realpath(data_path, NULL);
    const char *p = abs ? abs : data_path;
    uint64_t h = tf_hash64(p, strlen(p), 0x646f6378);
    const char *base = strrchr(p, '/');
    base = base ? base + 1 : p;
    size_t n = strlen(index_dir) + strlen(base) + 40;
    char *out = malloc(n);
    if (out) snprintf(out, n, "%s/%.64s.%016llx.tfdocs", index_dir, base, (ull)h);
    free(abs);
    return out;
}

static char *beside_name(const char *data_path) {
    size_t n = strlen(data_path) + 8;
    char *out = malloc(n);
    if (out) snprintf(out, n, "%s.tfdocs", data_path);
    return out;
}

static int rebuild_hint(int rc, const char *ip, const char *data, const char *why, const tf_open_options *opt) {
    return tf__seterr(rc, "%s: %s. Rebuild it: tokenfeed index %s --dtype %s --eos-id %llu (or delete it to read %s with concat packing only).",
                      ip, why, data, tf_dtype_name(opt->raw_dtype), (ull)opt->eos_id, data);
}

/* An index built from OLMo's metadata holds while that file is the one it
 * was built from (its size, modification time and inode, looked at now,
 * never through a symlink). */
static int check_meta(const uint8_t *b, const char *ip, const char *data, const tf_open_options *opt) {
    char *mp = tf__olmo_meta_path(data);
    if (!mp) return rebuild_hint(-TF_EFORMAT, ip, data, "built from OLMo's document metadata, but the data file is not a .npy", opt);
    struct stat ms;
    char why[PATH_MAX + 160];
    int rc = 0;
    if (fstatat(AT_FDCWD, mp, &ms, AT_SYMLINK_NOFOLLOW) != 0) {
        snprintf(why, sizeof why, "built from OLMo's document metadata %s, which is gone (%s)", mp, strerror(errno));
        rc = rebuild_hint(-TF_EFORMAT, ip, data, why, opt);
    } else if (!S_ISREG(ms.st_mode) || tf__le64(b + 56) != (uint64_t)ms.st_size ||
               (int64_t)tf__le64(b + 64) != mtime_ns(&ms) || tf__le64(b + 72) != (uint64_t)ms.st_ino) {
        snprintf(why, sizeof why, "stale: OLMo's document metadata %s changed since the index was built (size %llu, was %llu; or its modification time or inode)",
                 mp, (ull)ms.st_size, (ull)tf__le64(b + 56));
        rc = rebuild_hint(-TF_EFORMAT, ip, data, why, opt);
    }
    free(mp);
    return rc;
}

/* Map and check one index file (never through a symlink). 1: not there.
 * Its type, owner, mode and size are checked on the descriptor before a byte
 * is mapped: opened O_NONBLOCK, so a FIFO planted under the name does not
 * hold the open; it must be a regular file no larger than the header and one
 * end per token, and in the node's index directory (in_cache) this user's
 * and writable by no one else. (Beside the data it is the data's, as the
 * data is: whoever may write one may write the other.) */
static int map_index(const char *ip, const char *data, const struct stat *dst, uint64_t num_tokens,
                     const tf_open_options *opt, int in_cache, tf_file *f) {
    int fd = open(ip, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) {
        int e = errno;
        if (e == ENOENT) return 1;
        if (e == ELOOP) TF_FAIL(-ELOOP, "%s: a symlink: a document index is never read through one. Remove it and run tokenfeed index.", ip);
        TF_FAIL(-e, "%s: cannot open: %s", ip, strerror(e));
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        TF_FAIL(-EINVAL, "%s: not a regular file (a document index is one). Remove it and run tokenfeed index %s --dtype %s --eos-id %llu.",
                ip, data, tf_dtype_name(opt->raw_dtype), (ull)opt->eos_id);
    }
    if (in_cache && (st.st_uid != geteuid() || (st.st_mode & (S_IWGRP | S_IWOTH)))) {
        close(fd);
        TF_FAIL(-EPERM, "%s: not used: %s, so another user may have put it there or changed it. Remove it and run tokenfeed index %s --dtype %s --eos-id %llu.",
                ip, st.st_uid != geteuid() ? "it is not this user's" : "others may write it", data,
                tf_dtype_name(opt->raw_dtype), (ull)opt->eos_id);
    }
    if ((uint64_t)st.st_size > DOCIX_HEADER_META + 8 * (num_tokens + 1)) {
        close(fd);
        return rebuild_hint(-TF_EFORMAT, ip, data, "size: larger than an index of the file's tokens can be", opt);
    }
    uint64_t len = (uint64_t)st.st_size;
    void *m = len ? mmap(NULL, (size_t)len, PROT_READ, MAP_SHARED, fd, 0) : NULL;
    int e = errno;
    close(fd);
    if (m == MAP_FAILED) TF_FAIL(-e, "%s: cannot map: %s", ip, strerror(e));
    f->aux_map = m;
    f->aux_len = (size_t)len;
    f->aux_path = strdup(ip);
    if (!f->aux_path) return -ENOMEM;
    const uint8_t *b = m;
    const uint32_t ver = len >= DOCIX_HEADER ? tf__le32(b + 8) : 0;
    const uint64_t hs = ver == DOCIX_VERSION_META ? DOCIX_HEADER_META : DOCIX_HEADER;
    if (len < hs || memcmp(b, DOCIX_MAGIC, 8) != 0)
        return rebuild_hint(-TF_EFORMAT, ip, data, "header: expected a tokenfeed document index (magic TFDOCIX), found something else", opt);
    if (tf__le64(b + hs - 8) != tf_hash64(b, hs - 8, 0))
        return rebuild_hint(-TF_EFORMAT, ip, data, "header checksum: mismatch (the index is damaged)", opt);
    if (ver != DOCIX_VERSION && ver != DOCIX_VERSION_META)
        TF_FAIL(-TF_EFORMAT, "%s: version: expected %u, found %u. It was written by another tokenfeed version: rebuild it with tokenfeed index.",
                ip, DOCIX_VERSION, tf__le32(b + 8));
    if (tf__le32(b + 12) != (uint32_t)opt->raw_dtype || tf__le64(b + 16) != opt->eos_id) {
        char why[160];
        snprintf(why, sizeof why, "built for dtype %s and eos id %llu, opened with dtype %s and eos id %llu",
                 tf_dtype_name((tf_dtype)tf__le32(b + 12)), (ull)tf__le64(b + 16), tf_dtype_name(opt->raw_dtype),
                 (ull)opt->eos_id);
        return rebuild_hint(-TF_EFORMAT, ip, data, why, opt);
    }
    if (tf__le64(b + 24) != (uint64_t)dst->st_size || (int64_t)tf__le64(b + 32) != mtime_ns(dst)) {
        char why[200];
        snprintf(why, sizeof why, "stale: %s changed since the index was built (size %llu, was %llu; or its modification time)",
                 data, (ull)dst->st_size, (ull)tf__le64(b + 24));
        return rebuild_hint(-TF_EFORMAT, ip, data, why, opt);
    }
    uint64_t nd = tf__le64(b + 40);
    if (nd > (len - hs) / 8 || len != hs + nd * 8 || (num_tokens > 0 && nd == 0))
        return rebuild_hint(-TF_EFORMAT, ip, data, "size: does not match its document count (truncated)", opt);
    if (tf__le64(b + 48) != tf_hash64(b + hs, nd * 8, 0))
        return rebuild_hint(-TF_EFORMAT, ip, data, "document ends checksum: mismatch (the index is damaged)", opt);
    if (nd && tf__le64(b + hs + 8 * (nd - 1)) != num_tokens)
        return rebuild_hint(-TF_EFORMAT, ip, data, "last document end: not the token count of the data file", opt);
    if (ver == DOCIX_VERSION_META) TF_TRY(check_meta(b, ip, data, opt));
    f->doc_kind = TF_DOCS_ENDS;
    f->doc_ends = (const uint64_t *)(b + hs); /* page-aligned map + 64 or 96 */
    f->num_docs = nd;
    return 0;
}

int tf__docindex_open(const char *path, const tf_open_options *opt, tf_file *f) {
    struct stat dst;
    if (stat(path, &dst) != 0) {
        int e = errno;
        TF_FAIL(-e, "%s: cannot stat: %s", path, strerror(e));
    }
    char *ip = beside_name(path);
    if (!ip) return -ENOMEM;
    /* (a shard set's listing says whether it lies beside the file: no probe) */
    int rc = tf__listed_exists(ip) == 0 ? 1 : map_index(ip, path, &dst, f->num_tokens, opt, 0, f);
    free(ip);
    if (rc == 1 && opt->index_dir && *opt->index_dir) {
        ip = cache_name(path, opt->index_dir);
        if (!ip) return -ENOMEM;
        rc = map_index(ip, path, &dst, f->num_tokens, opt, 1, f);
        free(ip);
    }
    if (rc == 1) { /* no index: documents come from the rows (concat only) */
        f->eos.rows_only = 1;
        return 0;
    }
    return rc;
}

/* ---- building ------------------------------------------------------------ */

typedef struct ends_buf {
    uint64_t *v;
    uint64_t n;
    size_t cap;
} ends_buf;

static int ends_push(ends_buf *e, uint64_t x) {
    uint64_t *p = tf__grow(e->v, &e->cap, (size_t)e->n, sizeof *p, 1024);
    if (!p) return -ENOMEM;
    e->v = p;
    e->v[e->n++] = x;
    return 0;
}

typedef struct scan_arg {
    const tf_file *f;
    uint64_t eos;
    ends_buf *out;
} scan_arg;

static int scan_eos(void *p) {
    scan_arg *a = p;
    const tf_file *f = a->f;
    const size_t isz = tf_dtype_size(f->dtype);
    const uint8_t *t = f->tokens;
    const uint64_t n = f->num_tokens, eos = a->eos;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t v;
        switch (isz) {
        case 1: v = t[i]; break;
        case 2: v = (uint64_t)t[2 * i] | (uint64_t)t[2 * i + 1] << 8; break;
        case 4: v = tf__le32(t + 4 * i); break;
        default: v = tf__le64(t + 8 * i); break;
        }
        if (f->dtype == TF_INT16) v = (uint64_t)(int64_t)(int16_t)v;
        else if (f->dtype == TF_INT32) v = (uint64_t)(int64_t)(int32_t)v;
        if (v == eos) TF_TRY(ends_push(a->out, i + 1));
    }
    if (!a->out->n || a->out->v[a->out->n - 1] != n) TF_TRY(ends_push(a->out, n));
    return 0;
}

/* Write header + ends as dir/name atomically: O_EXCL temporary (never a
 * symlink), fsync, renameat, fsync of the directory. */
static int write_index(int dirfd, const char *dir, const char *name, const uint8_t *hdr, size_t hlen,
                       const uint64_t *ends, uint64_t n) {
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, ".%.200s.%d.%llx.tmp", name, (int)getpid(), (ull)tf_mix64((uint64_t)(uintptr_t)&tmp ^ (uint64_t)getpid()));
    int fd = openat(dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) {
        int e = errno;
        TF_FAIL(-e, "%s/%s: cannot create: %s", dir, tmp, strerror(e));
    }
    int rc = tf__pwrite_all(fd, hdr, hlen, TF_AT_POS, name);
    uint8_t buf[8192];
    for (uint64_t i = 0; !rc && i < n;) {
        size_t k = 0;
        for (; k < sizeof buf / 8 && i < n; k++, i++) tf__put_le64(buf + 8 * k, ends[i]);
        rc = tf__pwrite_all(fd, buf, 8 * k, TF_AT_POS, name);
    }
    if (!rc && fsync(fd) != 0) rc = tf__seterr(-errno, "%s/%s: fsync failed", dir, tmp);
    close(fd);
    if (!rc && renameat(dirfd, tmp, dirfd, name) != 0) rc = tf__seterr(-errno, "%s/%s: cannot rename: %s", dir, name, strerror(errno));
    if (rc) {
        unlinkat(dirfd, tmp, 0);
        return rc;
    }
    fsync(dirfd);
    return 0;
}

static int open_dir(const char *dir, int create) {
    if (create) { /* the node's index directory: this user's, 0700 (its parents too) whatever the umask */
        int d;
        if (tf__dir_open(dir, TF_DIR_PRIVATE, &d) == 0) close(d);
        tf__clearerr();
    }
    return open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
}

int tf_doc_index_build(const char *data_path, const tf_open_options *opt, const uint64_t *ends, uint64_t nends,
                       char *out, size_t cap) {
    tf__clearerr();
    TF_NEED_ARG(data_path);
    TF_NEED_ARG(opt);
    TF_NEED_ARG(out);
    if (!cap) return tf__seterr(-EINVAL, "tf_doc_index_build: cap is 0: out must hold the path written");
    if (!opt->has_eos_id) TF_FAIL(-EINVAL, "tf_doc_index_build: an eos id is required (has_eos_id)");
    if (!tf_dtype_size(opt->raw_dtype))
        TF_FAIL(-EINVAL, "%s: dtype: a headerless token file needs an explicit dtype (e.g. uint16)", data_path);
    /* the data file alone, mapped as raw.c does (without its index lookup) */
    tf_file f;
    memset(&f, 0, sizeof f);
    struct stat dst;
    const size_t isz = tf_dtype_size(opt->raw_dtype);
    f.path = strdup(data_path);
    int rc = f.path ? tf__map_file(data_path, &f.map, &f.map_len) : -ENOMEM;
    if (!rc && f.map_len % isz)
        rc = tf__seterr(-TF_EFORMAT, "%s: file size: expected a multiple of the %s item size %zu, found %llu bytes. The file is truncated, or the dtype is wrong.",
                        data_path, tf_dtype_name(opt->raw_dtype), isz, (ull)f.map_len);
    f.format = TF_FORMAT_RAW;
    f.dtype = opt->raw_dtype;
    f.num_tokens = f.map_len / isz;
    f.tokens = f.map;
    if (!rc && stat(data_path, &dst) != 0) rc = tf__seterr(-errno, "%s: cannot stat: %s", data_path, strerror(errno));
    ends_buf eb = {0};
    if (!rc && ends) {
        if (nends == 0 && f.num_tokens > 0) rc = tf__seterr(-EINVAL, "%s: document ends: none given for %llu tokens", data_path, (ull)f.num_tokens);
        for (uint64_t j = 0; !rc && j < nends; j++)
            if ((j && ends[j] < ends[j - 1]) || ends[j] > f.num_tokens)
                rc = tf__seterr(-EINVAL, "%s: document ends: entry %llu (%llu) is out of order or past the %llu tokens of the file",
                                data_path, (ull)j, (ull)ends[j], (ull)f.num_tokens);
        if (!rc && nends && ends[nends - 1] != f.num_tokens)
            rc = tf__seterr(-EINVAL, "%s: document ends: the last is %llu, the file has %llu tokens: the metadata belongs to another file",
                            data_path, (ull)ends[nends - 1], (ull)f.num_tokens);
        eb.v = (uint64_t *)ends;
        eb.n = nends;
    }
    /* no ends given: OLMo's metadata beside x.npy gives them, else the eos scan */
    struct stat mst;
    int from_meta = 0;
    if (!rc && !ends) {
        char *mp = tf__olmo_meta_path(data_path);
        int m = mp ? tf__olmo_meta_read(mp, f.num_tokens, &eb.v, &eb.n, &mst) : 1;
        free(mp);
        if (m < 0) rc = m;
        from_meta = m == 0;
    }
    if (!rc && !ends && !from_meta) {
        scan_arg a = {&f, opt->eos_id, &eb};
        rc = tf__files_guard(&f, 1, scan_eos, &a);
    }
    uint8_t hdr[DOCIX_HEADER_META];
    const size_t hlen = from_meta ? DOCIX_HEADER_META : DOCIX_HEADER;
    memset(hdr, 0, sizeof hdr);
    if (!rc) {
        memcpy(hdr, DOCIX_MAGIC, 8);
        tf__put_le32(hdr + 8, from_meta ? DOCIX_VERSION_META : DOCIX_VERSION);
        tf__put_le32(hdr + 12, (uint32_t)opt->raw_dtype);
        tf__put_le64(hdr + 16, opt->eos_id);
        tf__put_le64(hdr + 24, (uint64_t)dst.st_size);
        tf__put_le64(hdr + 32, (uint64_t)mtime_ns(&dst));
        tf__put_le64(hdr + 40, eb.n);
        /* checksum of the little-endian bytes, as the reader sees them */
        tf__xxh64_state h;
        tf__xxh64_reset(&h, 0);
        for (uint64_t j = 0; j < eb.n; j++) {
            uint8_t le[8];
            tf__put_le64(le, eb.v[j]);
            tf__xxh64_update(&h, le, 8);
        }
        tf__put_le64(hdr + 48, tf__xxh64_digest(&h));
        if (from_meta) {
            tf__put_le64(hdr + 56, (uint64_t)mst.st_size);
            tf__put_le64(hdr + 64, (uint64_t)mtime_ns(&mst));
            tf__put_le64(hdr + 72, (uint64_t)mst.st_ino);
        }
        tf__put_le64(hdr + hlen - 8, tf_hash64(hdr, hlen - 8, 0));
    }
    if (!rc) {
        /* beside the data first; else the node's index directory */
        char *dcopy = strdup(data_path);
        char *slash = dcopy ? strrchr(dcopy, '/') : NULL;
        const char *dir = slash ? (slash == dcopy ? "/" : (*slash = 0, dcopy)) : ".";
        const char *base = strrchr(data_path, '/') ? strrchr(data_path, '/') + 1 : data_path;
        char name[PATH_MAX];
        snprintf(name, sizeof name, "%s.tfdocs", base);
        int dfd = dcopy ? open_dir(dir, 0) : -1;
        int w = -EACCES;
        if (dfd >= 0 && faccessat(dfd, ".", W_OK, AT_EACCESS) == 0) {
            w = write_index(dfd, dir, name, hdr, hlen, eb.v, eb.n);
            if (!w) snprintf(out, cap, "%s/%s", dir, name);
        }
        if (dfd >= 0) close(dfd);
        if (w && opt->index_dir && *opt->index_dir) {
            char *cp = cache_name(data_path, opt->index_dir);
            int cfd = open_dir(opt->index_dir, 1);
            if (!cp || cfd < 0) {
                w = cp ? tf__seterr(-errno, "%s: cannot open the index directory: %s", opt->index_dir, strerror(errno)) : -ENOMEM;
            } else {
                w = write_index(cfd, opt->index_dir, strrchr(cp, '/') + 1, hdr, hlen, eb.v, eb.n);
                if (!w) snprintf(out, cap, "%s", cp);
            }
            if (cfd >= 0) close(cfd);
            free(cp);
        } else if (w == -EACCES) {
            w = tf__seterr(-EACCES, "%s: directory not writable, and no index directory given for the document index", dir);
        }
        free(dcopy);
        rc = w;
    }
    if (!ends) free(eb.v);
    tf__file_close(&f);
    return rc;
}
