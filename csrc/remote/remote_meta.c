/*
 * remote_meta.c — the node's record of what a remote open fetched, kept in
 * the chunk cache's directory and shared by every process of the node
 * (docs/remote.md, "Metadata, once per node").
 *
 * DESIGN
 *
 * A remote open (remote_open.c) learns, in rounds of requests, the sizes and
 * versions of its objects (and which candidate names do not exist), and
 * fetches the byte ranges its parsers read into sparse maps. After an open
 * succeeds, all of it — per object its URL, whether it exists, its size and
 * version, and each range with its bytes — is written into one file,
 * meta/<key>.tfmeta, where key hashes the URLs opened and the open options
 * that change what the parsers read or make of it. A later open of the same
 * URLs with the same options, by any process of the node or after a restart,
 * fills its registry from the file; its rounds then find every size known and
 * every range present, so no request is sent, and the parsers run on the same
 * bytes: the same dataset, the same fingerprint.
 *
 * Why that stays right. The open that loads a record first asks the store
 * for the sizes and versions of the objects it names (remote_open.c,
 * load_current: a listing of their prefix, or a HEAD each, or a tokenfeed
 * dataset's manifest alone); a record of objects changed since is deleted
 * and the open fetches afresh, so a node whose cache still holds the old
 * version's chunks reads the new version as a node without a record does.
 * Every chunk read is also conditional on the version recorded (If-Match on
 * the ETag, or the chunk checksums of native shards), so an object changed
 * after the open is refused when its chunk is read, with an error naming it;
 * that error also removes the record (tf__cache_meta_forget, from remote.c).
 *
 * File (little-endian): "TFRMETA1", u32 version, u32 0, u64 key, u64
 * objects; per object u32 URL length, the URL, u32 flags (1: exists), u64
 * size, u32 version length, the version, u32 ranges, and per range u64
 * offset, u64 length, the bytes; then a u64 seal of everything before: its
 * XXH64 sealed with the cache's secret as chunks are (tf__cache_seal), so a
 * record only this user's processes can write is ever read. It is
 * written to a temporary file (O_EXCL|O_NOFOLLOW, safe_fs.c) and renamed
 * over the old one, so a reader sees a whole record or none; one that does
 * not parse is ignored (and replaced by the next open, which fetches). The
 * records of a cache together hold at most tf__meta_max_bytes: the least
 * recently written go first, and an open whose metadata alone is larger is
 * not recorded.
 *
 * Processes starting together. One that finds no record takes an flock on
 * meta/<key>.lock (LOCK_NB) and fetches while holding it; the others poll the
 * lock every TF__META_POLL_NS, answering the interrupt check, and read the
 * record once it is free. The kernel drops the lock of a holder that dies. A
 * waiter that finds no record when the lock comes free (its holder failed),
 * or that waited TF__META_WAIT_NS, fetches itself: the record never fails an
 * open.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../sources/safe_fs.h"
#include "remote.h"

typedef unsigned long long ull;

#define META_MAGIC "TFRMETA1"
#define META_VERSION 1u
#define META_HARD_MAX (4ull << 30)
#define TF__META_POLL_NS (20ull * 1000 * 1000)
#define TF__META_WAIT_NS (600ull * 1000 * 1000 * 1000)

uint64_t tf__meta_max_bytes(const tf_remote *r) {
    uint64_t b = tf__cache_limit(tf__remote_cache(r)) / 8;
    return b < META_HARD_MAX ? b : META_HARD_MAX;
}

uint64_t tf__meta_key(const char *const *urls, size_t n, const tf_open_options *opt) {
    tf__xxh64_state h;
    tf__xxh64_reset(&h, 0x5446524d45544131ULL);
    uint8_t rec[56];
    tf__put_le64(rec, META_VERSION);
    tf__put_le64(rec + 8, n);
    tf__put_le64(rec + 16, (uint64_t)opt->format);
    tf__put_le64(rec + 24, (uint64_t)opt->raw_dtype);
    tf__put_le64(rec + 32, (uint64_t)opt->has_eos_id);
    tf__put_le64(rec + 40, opt->has_eos_id ? opt->eos_id : 0);
    tf__put_le64(rec + 48, opt->index_dir != NULL);
    tf__xxh64_update(&h, rec, sizeof rec);
    /* NUL-terminated: no string runs into the next one */
    if (opt->index_dir) tf__xxh64_update(&h, opt->index_dir, strlen(opt->index_dir) + 1);
    for (size_t i = 0; i < n; i++) tf__xxh64_update(&h, urls[i], strlen(urls[i]) + 1);
    return tf__xxh64_digest(&h);
}

uint64_t tf__meta_key_set(const char *const *urls, size_t n, const tf_open_options *opt, const char *prefix,
                          const char *pattern) {
    tf__xxh64_state h;
    tf__xxh64_reset(&h, tf__meta_key(urls, n, opt));
    tf__xxh64_update(&h, "shard set catalog", 17);
    tf__xxh64_update(&h, prefix, strlen(prefix) + 1);
    tf__xxh64_update(&h, pattern, strlen(pattern) + 1);
    return tf__xxh64_digest(&h);
}

static int has_record(tf_remote *r, uint64_t key) {
    int dfd = tf__cache_meta_fd(tf__remote_cache(r));
    if (dfd < 0) return 0;
    char name[40];
    tf__cache_meta_name(key, "tfmeta", name);
    struct stat st;
    return fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode);
}

int tf_remote_has_set_record(tf_remote *r, const char *const *urls, size_t n, const char *prefix, const char *pattern,
                             const tf_open_options *opt) {
    if (!r || !urls || n == 0 || !prefix || !pattern) return 0;
    for (size_t i = 0; i < n; i++)
        if (!urls[i]) return 0;
    tf_open_options dflt = {.format = TF_FORMAT_AUTO, .raw_dtype = TF_DTYPE_INVALID};
    return has_record(r, tf__meta_key_set(urls, n, opt ? opt : &dflt, prefix, pattern));
}

int tf_remote_has_record(tf_remote *r, const char *const *urls, size_t n, const tf_open_options *opt) {
    if (!r || !urls || n == 0) return 0;
    for (size_t i = 0; i < n; i++)
        if (!urls[i]) return 0;
    tf_open_options dflt = {.format = TF_FORMAT_AUTO, .raw_dtype = TF_DTYPE_INVALID};
    return has_record(r, tf__meta_key(urls, n, opt ? opt : &dflt));
}

/* "<cache dir>/meta", for messages. */
static void meta_dir_name(const tf_remote *r, char *out, size_t cap) {
    snprintf(out, cap, "%s/meta", tf__cache_dir(tf__remote_cache(r)));
}

/* ---- writing ------------------------------------------------------------- */

/* A buffered writer to a file that hashes what it writes. */
typedef struct mwriter {
    int fd;
    const char *path;
    uint8_t buf[1 << 16];
    size_t n;
    uint64_t total;
    tf__xxh64_state h;
    int err;
} mwriter;

static void mw_flush(mwriter *w) {
    if (!w->err && w->n) w->err = tf__pwrite_all(w->fd, w->buf, w->n, TF_AT_POS, w->path);
    w->n = 0;
}

static void mw_put(mwriter *w, const void *src, size_t n) {
    if (w->err) return;
    tf__xxh64_update(&w->h, src, n);
    w->total += n;
    const uint8_t *s = src;
    while (n) {
        if (w->n == sizeof w->buf) mw_flush(w);
        size_t k = sizeof w->buf - w->n < n ? sizeof w->buf - w->n : n;
        memcpy(w->buf + w->n, s, k);
        w->n += k;
        s += k;
        n -= k;
    }
}

/* The low `bytes` bytes of v, little-endian. */
static void mw_le(mwriter *w, size_t bytes, uint64_t v) {
    uint8_t r[8];
    tf__put_le64(r, v);
    mw_put(w, r, bytes);
}

/* A string: its u32 length, then its bytes. */
static void mw_str(mwriter *w, const char *s) {
    size_t n = strlen(s);
    mw_le(w, 4, n);
    mw_put(w, s, n);
}

/* Whether g can be recorded: every range has its bytes kept (the record is
 * whole), and every object has a version. A change to an object without one
 * cannot be seen when its chunks are read; recorded, its metadata would outlive
 * the process that read it. */
static int recordable(const tf__preg *g) {
    for (size_t i = 0; i < g->n; i++) {
        const tf__pobj *p = &g->o[i];
        if (!p->known || (p->exists && !p->info.version[0])) return 0;
        for (size_t k = 0; k < p->ngot; k++)
            if (p->got[k].len && !p->got[k].copy) return 0;
    }
    return 1;
}

/* Bytes of record g will take (an upper bound is enough). */
static uint64_t record_bytes(const tf__preg *g) {
    uint64_t b = 48;
    for (size_t i = 0; i < g->n; i++) {
        const tf__pobj *p = &g->o[i];
        b += 24 + strlen(p->url) + strlen(p->info.version);
        for (size_t k = 0; k < p->ngot; k++) b += 16 + p->got[k].len;
    }
    return b;
}

void tf__meta_save(tf_remote *r, uint64_t key, const tf__preg *g) {
    int dfd = tf__cache_meta_fd(tf__remote_cache(r));
    uint64_t need = record_bytes(g), max = tf__meta_max_bytes(r);
    if (dfd < 0 || !recordable(g) || need > max) return;
    char dir[4200], tmp[64], name[40];
    meta_dir_name(r, dir, sizeof dir);
    tf__cache_meta_name(key, "tfmeta", name);
    /* the records of meta/ together stay within max, the least recently
     * written removed first (a record is only read at open: removing one in
     * use costs its next open a fetch, nothing else) */
    static const char *const records[] = {".tfmeta", NULL};
    tf__dir_trim(dfd, records, name, need, max);
    mwriter *w = malloc(sizeof *w);
    if (!w) return;
    w->n = 0;
    w->total = 0;
    w->err = 0;
    w->path = dir;
    tf__xxh64_reset(&w->h, tf__cache_seed(tf__remote_cache(r)));
    /* best effort: an open whose record cannot be written still succeeded */
    if (tf__tmp_create(dfd, dir, "meta", tmp, sizeof tmp, &w->fd) != 0) {
        free(w);
        tf__clearerr();
        return;
    }
    mw_put(w, META_MAGIC, 8);
    mw_le(w, 4, META_VERSION);
    mw_le(w, 4, 0);
    mw_le(w, 8, key);
    mw_le(w, 8, g->n);
    for (size_t i = 0; i < g->n; i++) {
        const tf__pobj *p = &g->o[i];
        mw_str(w, p->url);
        mw_le(w, 4, p->exists ? 1u : 0u);
        mw_le(w, 8, p->exists ? p->info.size : 0);
        mw_str(w, p->exists ? p->info.version : "");
        mw_le(w, 4, p->exists ? (uint32_t)p->ngot : 0u);
        for (size_t k = 0; p->exists && k < p->ngot; k++) {
            mw_le(w, 8, p->got[k].off);
            mw_le(w, 8, p->got[k].len);
            if (p->got[k].len) mw_put(w, p->got[k].copy, (size_t)p->got[k].len);
        }
    }
    uint64_t seal = tf__cache_seal(tf__remote_cache(r), META_MAGIC, tf__xxh64_digest(&w->h));
    mw_le(w, 8, seal);
    mw_flush(w);
    int rc = w->err;
    close(w->fd);
    if (rc == 0) rc = tf__rename_at(dfd, dir, tmp, name, 0);
    if (rc != 0) unlinkat(dfd, tmp, 0);
    free(w);
    tf__clearerr();
}

/* ---- reading ------------------------------------------------------------- */

/* A string of at most cap - 1 bytes, without NULs, into out. */
static int mr_str(tf__byte_rd *m, char *out, size_t cap) {
    uint32_t n = (uint32_t)tf__byte_le(m, 4);
    const uint8_t *p = n < cap ? tf__byte_take(m, n) : NULL;
    if (!p || memchr(p, 0, n)) {
        m->bad = 1;
        return -1;
    }
    memcpy(out, p, n);
    out[n] = '\0';
    return 0;
}

/* Objects and ranges of the record into g (empty): 0, or -1 when it does not
 * parse. */
static int parse_record(tf__byte_rd *m, uint64_t key, tf__preg *g) {
    const uint8_t *magic = tf__byte_take(m, 8);
    if (!magic || memcmp(magic, META_MAGIC, 8) != 0 || (uint32_t)tf__byte_le(m, 4) != META_VERSION) return -1;
    tf__byte_le(m, 4); /* reserved */
    if (tf__byte_le(m, 8) != key) return -1;
    uint64_t nobj = tf__byte_le(m, 8);
    if (m->bad || nobj > m->n / 24) return -1;
    char *url = malloc(65536);
    if (!url) return -1;
    int rc = 0;
    for (uint64_t i = 0; i < nobj && !rc; i++) {
        tf_object_info info;
        memset(&info, 0, sizeof info);
        if (mr_str(m, url, 65536) != 0) rc = -1;
        uint32_t flags = (uint32_t)tf__byte_le(m, 4);
        info.size = tf__byte_le(m, 8);
        if (!rc && mr_str(m, info.version, sizeof info.version) != 0) rc = -1;
        uint32_t nr = (uint32_t)tf__byte_le(m, 4);
        tf__pobj *p = rc || m->bad ? NULL : tf__preg_add(g, url);
        if (!p || p->known || flags > 1 || (!(flags & 1) && (info.size || nr))) {
            rc = -1;
            break;
        }
        p->known = 1;
        p->exists = flags & 1;
        p->info = info;
        if (p->exists && tf__pobj_map(p) != 0) rc = -1;
        for (uint32_t k = 0; k < nr && !rc; k++) {
            uint64_t off = tf__byte_le(m, 8), len = tf__byte_le(m, 8);
            const uint8_t *b = len <= info.size && off <= info.size - len ? tf__byte_take(m, len) : NULL;
            if (!b || (len && !p->map)) rc = -1;
            else if (len) {
                memcpy(p->map + off, b, (size_t)len);
                rc = tf__pobj_note(g, p, off, len);
            }
        }
    }
    free(url);
    return rc || m->bad || m->at != m->n ? -1 : 0;
}

int tf__meta_load(tf_remote *r, uint64_t key, tf__preg *g) {
    int dfd = tf__cache_meta_fd(tf__remote_cache(r));
    if (dfd < 0) return 1;
    char name[40];
    tf__cache_meta_name(key, "tfmeta", name);
    int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return 1;
    struct stat st;
    /* a file of this user's, in a directory only this user can write (the
     * cache's checks): a regular file of a sane size */
    int ok = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() && st.st_size > 40 &&
             (uint64_t)st.st_size <= META_HARD_MAX + 4096;
    void *map = ok ? mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
    close(fd);
    if (map == MAP_FAILED) return 1;
    size_t len = (size_t)st.st_size;
    const uint8_t *b = map;
    const tf__cache *c = tf__remote_cache(r);
    ok = tf__cache_seal(c, META_MAGIC, tf_hash64(b, len - 8, tf__cache_seed(c))) == tf__le64(b + len - 8);
    if (ok && tf__meta_parse(b, len - 8, key, g) != 0) ok = 0;
    munmap(map, len);
    tf__clearerr();
    return ok ? 0 : 1;
}

int tf__meta_parse(const uint8_t *b, size_t len, uint64_t key, tf__preg *g) {
    tf__byte_rd m = {b, len, 0, 0};
    int saved = g->record;
    g->record = 0; /* the bytes stay in the maps: nothing to copy */
    int rc = parse_record(&m, key, g);
    g->record = saved;
    if (rc) tf__preg_free(g);
    return rc;
}

/* ---- the lock ------------------------------------------------------------ */

int tf__meta_lock(tf_remote *r, uint64_t key, const char *what, int *out, int *waited) {
    *out = -1;
    *waited = 0;
    int dfd = tf__cache_meta_fd(tf__remote_cache(r));
    if (dfd < 0) return 0;
    char name[40];
    tf__cache_meta_name(key, "lock", name);
    int fd = openat(dfd, name, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return 0; /* no lock: fetch without */
    uint64_t t0 = tf__now_ns(), next_notice = t0 + TF__NOTICE_NS;
    for (;;) {
        if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
            *out = fd;
            return 0;
        }
        int e = errno;
        if (e == EINTR) continue;
        uint64_t now = tf__now_ns();
        if (e != EWOULDBLOCK || now - t0 > TF__META_WAIT_NS) {
            /* no flock here (ENOLCK), or a holder that does not finish:
             * fetch without the lock */
            close(fd);
            *waited = e == EWOULDBLOCK;
            return 0;
        }
        *waited = 1;
        if (tf__interrupted()) {
            close(fd);
            TF_FAIL(-EINTR, "%s: interrupted while waiting for another process of this node to read the dataset's metadata",
                    what);
        }
        if (now >= next_notice) {
            char dir[4200];
            meta_dir_name(r, dir, sizeof dir);
            tf__notice("waiting for another process of this node to read the metadata of %s (%.0f s; %s/%s)", what,
                       (double)(now - t0) / 1e9, dir, name);
            next_notice = now + TF__NOTICE_NS;
        }
        struct timespec ts = {0, (long)TF__META_POLL_NS};
        nanosleep(&ts, NULL);
    }
}

void tf__meta_unlock(int fd) {
    if (fd < 0) return;
    flock(fd, LOCK_UN);
    close(fd);
}
