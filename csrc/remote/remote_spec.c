/*
 * remote_spec.c — remote path specs (a glob, a directory URL) opened in C,
 * from one listing per node (docs/remote.md, "Shard sets, listed once per
 * node").
 *
 * A glob (s3://bucket/tokens/shard_*.bin) or a directory URL ending in '/' is
 * expanded from one listing of its fixed prefix by the rules local sets
 * follow (pathspec.c: the pattern matched segment by segment, companion
 * files found in the listing and joined to their data file, one format per
 * directory, sorted names): the listing becomes the directories of a
 * tf__listing (tf__listing_add_objects), and the local expansion runs on it.
 * The open then learns every object's size and version from that listing.
 *
 * One listing per node. Every listing a remote open makes (this expansion,
 * the sizes of many objects under one prefix, the check of the node's
 * metadata record against the store) goes through tf__remote_list_node:
 * the listing of a prefix is recorded in the cache's meta/ directory
 * (<key>.tflist, key a hash of the prefix), and a process of the node that
 * needs the same prefix reads the record instead of listing when it trusts
 * it:
 *   - it waited for the process that made it (the first of a node's
 *     processes to need a prefix lists it under meta/<key>.lock, flock; the
 *     others wait, answering the interrupt check, for at most the metadata
 *     wait; a holder that dies drops its lock and a waiter that then finds
 *     no record lists itself);
 *   - or the listing ended at most $TOKENFEED_LISTING_MAX_AGE seconds ago
 *     (default 60: the processes of a job start within it; 0 trusts none by
 *     age), by the clock of this node;
 *   - or the open says the set is immutable (TF_OPEN_IMMUTABLE: the caller
 *     vouches that no object was added, removed or rewritten since this node
 *     listed it, as for local sets; the node's metadata record is then not
 *     checked against the store either).
 * Anything else lists again. A record is sealed like the metadata records
 * (XXH64 with the cache's secret under a SipHash tag keyed by its key file),
 * written to a temporary file and renamed into place without following a
 * symlink, read through the meta/ descriptor (O_NOFOLLOW, a regular file of
 * this user's) and parsed with every length checked; one that does not
 * verify is ignored and replaced. A read that finds an object changed or
 * missing drops the listing records with the metadata record.
 *
 * Record (little-endian): "TFLIST01", u32 version, u32 0, u64 key, u64 time
 * the listing began and u64 time it ended (ns since the epoch), u32 prefix
 * length and the prefix, u64 objects, per object u32 length and the URL
 * after the prefix, u64 size, u32 length and the version; then the u64 seal.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../sources/safe_fs.h"
#include "remote.h"

typedef unsigned long long ull;

#define LIST_MAGIC "TFLIST01"
#define LIST_VERSION 1u
#define LIST_MAX_AGE_DEFAULT_S 60ull
#define LIST_HARD_MAX ((size_t)1 << 32)

static uint64_t wall_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t tf__listing_max_age_ns(void) {
    const char *e = getenv("TOKENFEED_LISTING_MAX_AGE");
    if (!e || !*e) return LIST_MAX_AGE_DEFAULT_S * 1000000000ull;
    char *end;
    double s = strtod(e, &end);
    if (end == e || *end || !(s >= 0) || s > 1e9) return LIST_MAX_AGE_DEFAULT_S * 1000000000ull;
    return (uint64_t)(s * 1e9);
}

static uint64_t list_key(const char *prefix) {
    tf__xxh64_state h;
    tf__xxh64_reset(&h, 0x54464c4953543031ULL);
    tf__xxh64_update(&h, "tokenfeed listing 1", 19);
    tf__xxh64_update(&h, prefix, strlen(prefix) + 1);
    return tf__xxh64_digest(&h);
}

/* ---- a listing in memory ------------------------------------------------ */

void tf__objlist_free(tf__objlist *v) {
    for (size_t i = 0; i < v->n; i++) free(v->urls[i]);
    free(v->urls);
    free(v->infos);
    memset(v, 0, sizeof *v);
}

static int push(tf__objlist *v, const char *url, const tf_object_info *info) {
    if (v->n == v->cap) {
        size_t c = v->cap ? v->cap * 2 : 256;
        char **u = realloc(v->urls, c * sizeof *u);
        if (!u) return -ENOMEM;
        v->urls = u;
        tf_object_info *in = realloc(v->infos, c * sizeof *in);
        if (!in) return -ENOMEM;
        v->infos = in;
        v->cap = c;
    }
    if (!(v->urls[v->n] = strdup(url))) return -ENOMEM;
    v->infos[v->n++] = *info;
    return 0;
}

static int on_object(void *ctx, const char *url, const tf_object_info *info) {
    tf__objlist *v = ctx;
    v->rc = push(v, url, info);
    return v->rc;
}

typedef struct url_at {
    char *url;
    size_t i;
} url_at;

static int cmp_url_at(const void *a, const void *b) {
    const url_at *x = a, *y = b;
    int c = strcmp(x->url, y->url);
    return c ? c : (x->i > y->i) - (x->i < y->i);
}

/* Sorted by URL, each once (a retried listing may emit an object again:
 * its last answer is kept). */
static int tidy(tf__objlist *v) {
    if (v->n < 2) return 0;
    url_at *p = malloc(v->n * sizeof *p);
    tf_object_info *in = malloc(v->n * sizeof *in);
    if (!p || !in) {
        free(p);
        free(in);
        return -ENOMEM;
    }
    for (size_t i = 0; i < v->n; i++) p[i] = (url_at){v->urls[i], i};
    qsort(p, v->n, sizeof *p, cmp_url_at);
    size_t m = 0;
    for (size_t i = 0; i < v->n; i++) {
        if (m && strcmp(v->urls[m - 1], p[i].url) == 0) {
            free(v->urls[m - 1]);
            m--;
        }
        v->urls[m] = p[i].url;
        in[m++] = v->infos[p[i].i];
    }
    free(p);
    free(v->infos);
    v->infos = in;
    v->n = m;
    return 0;
}

/* ---- the record --------------------------------------------------------- */

static void put_str(tf__byte_wr *b, const char *s, size_t n) {
    tf__byte_put_le(b, 4, n);
    tf__byte_put(b, s, n);
}

static void meta_dir_name(tf_remote *r, char *out, size_t cap) {
    snprintf(out, cap, "%s/meta", tf__cache_dir(tf__remote_cache(r)));
}

/* Record v (the listing of prefix, begun at t0 and ended at t1). Best
 * effort: a listing that cannot be recorded is made again by the next
 * process. Objects without a version are not recorded (a change to them
 * cannot be seen), as for metadata records. */
static void save(tf_remote *r, uint64_t key, const char *prefix, const tf__objlist *v, uint64_t t0, uint64_t t1) {
    int dfd = tf__cache_meta_fd(tf__remote_cache(r));
    if (dfd < 0) return;
    size_t plen = strlen(prefix);
    tf__byte_wr b = {0};
    tf__byte_put(&b, LIST_MAGIC, 8);
    tf__byte_put_le(&b, 4, LIST_VERSION);
    tf__byte_put_le(&b, 4, 0);
    tf__byte_put_le(&b, 8, key);
    tf__byte_put_le(&b, 8, t0);
    tf__byte_put_le(&b, 8, t1);
    put_str(&b, prefix, plen);
    tf__byte_put_le(&b, 8, v->n);
    for (size_t i = 0; i < v->n && !b.err; i++) {
        if (strncmp(v->urls[i], prefix, plen) != 0 || !v->infos[i].version[0]) {
            free(b.p);
            return;
        }
        put_str(&b, v->urls[i] + plen, strlen(v->urls[i] + plen));
        tf__byte_put_le(&b, 8, v->infos[i].size);
        put_str(&b, v->infos[i].version, strlen(v->infos[i].version));
    }
    const tf__cache *c = tf__remote_cache(r);
    if (!b.err) tf__byte_put_le(&b, 8, tf__cache_seal(c, LIST_MAGIC, tf_hash64(b.p, b.n, tf__cache_seed(c))));
    uint64_t max = tf__meta_max_bytes(r);
    if (b.err || b.n > max) {
        free(b.p);
        return;
    }
    char dir[4200], tmp[64], name[40];
    meta_dir_name(r, dir, sizeof dir);
    tf__cache_meta_name(key, "tflist", name);
    static const char *const records[] = {".tflist", NULL};
    tf__dir_trim(dfd, records, name, b.n, max);
    int fd = -1;
    if (tf__tmp_create(dfd, dir, "list", tmp, sizeof tmp, &fd) == 0) {
        int rc = fchmod(fd, 0600) == 0 ? 0 : -errno;
        if (rc == 0) rc = tf__pwrite_all(fd, b.p, b.n, 0, dir);
        close(fd);
        if (rc == 0) rc = tf__rename_at(dfd, dir, tmp, name, 0);
        if (rc != 0) unlinkat(dfd, tmp, 0);
    }
    free(b.p);
    tf__clearerr();
}

/* The recorded listing of prefix into v (empty), when it verifies, parses
 * and ended at or after not_before (ns since the epoch): 0; else 1. */
static int load(tf_remote *r, uint64_t key, const char *prefix, uint64_t not_before, tf__objlist *v) {
    int dfd = tf__cache_meta_fd(tf__remote_cache(r));
    if (dfd < 0) return 1;
    char dir[4200], name[40];
    meta_dir_name(r, dir, sizeof dir);
    tf__cache_meta_name(key, "tflist", name);
    uint8_t *b = NULL;
    size_t len = 0;
    /* O_NOFOLLOW, O_NONBLOCK; a regular file of this user's that no one else
     * may write, of a sane size: all checked before a byte is read */
    if (tf__read_file_trusted(dfd, dir, name, LIST_HARD_MAX, 1, (uid_t)-1, &b, &len, NULL) != 0) {
        tf__clearerr();
        return 1;
    }
    const tf__cache *c = tf__remote_cache(r);
    int ok = len > 56 && tf__cache_seal(c, LIST_MAGIC, tf_hash64(b, len - 8, tf__cache_seed(c))) == tf__le64(b + len - 8);
    tf__byte_rd m = {b, ok ? len - 8 : 0, 0, !ok};
    const uint8_t *magic = tf__byte_take(&m, 8);
    ok = ok && magic && memcmp(magic, LIST_MAGIC, 8) == 0 && tf__byte_le(&m, 4) == LIST_VERSION;
    tf__byte_le(&m, 4);
    ok = ok && tf__byte_le(&m, 8) == key;
    tf__byte_le(&m, 8); /* began */
    uint64_t ended = tf__byte_le(&m, 8), now = wall_ns();
    /* (a time ahead of this node's clock says nothing about its age) */
    ok = ok && ended >= not_before && ended <= now + 5000000000ull;
    size_t plen = strlen(prefix);
    uint32_t pl = (uint32_t)tf__byte_le(&m, 4);
    const uint8_t *pp = tf__byte_take(&m, pl);
    ok = ok && pp && pl == plen && memcmp(pp, prefix, plen) == 0;
    uint64_t n = tf__byte_le(&m, 8);
    ok = ok && !m.bad && n <= (m.n - m.at) / 16;
    char *url = ok ? malloc(plen + 65536) : NULL;
    if (ok && !url) ok = 0;
    if (url) memcpy(url, prefix, plen);
    for (uint64_t i = 0; ok && i < n; i++) {
        tf_object_info info;
        memset(&info, 0, sizeof info);
        uint32_t ul = (uint32_t)tf__byte_le(&m, 4);
        const uint8_t *up = ul < 65536 ? tf__byte_take(&m, ul) : NULL;
        info.size = tf__byte_le(&m, 8);
        uint32_t vl = (uint32_t)tf__byte_le(&m, 4);
        const uint8_t *vp = vl < sizeof info.version ? tf__byte_take(&m, vl) : NULL;
        if (!up || !vp || !ul || !vl || memchr(up, 0, ul) || memchr(vp, 0, vl)) {
            ok = 0;
            break;
        }
        memcpy(url + plen, up, ul);
        url[plen + ul] = '\0';
        memcpy(info.version, vp, vl);
        if (push(v, url, &info) != 0) ok = 0;
    }
    ok = ok && !m.bad && m.at == m.n;
    free(url);
    free(b);
    if (!ok) tf__objlist_free(v);
    return ok ? 0 : 1;
}

/* ---- one listing per node ----------------------------------------------- */

/* The listing an open of a spec expanded it from, for the rest of that open
 * on this thread (the node's record checked against it, sizes learnt from
 * it): one listing per open, whatever the age rule says. */
static _Thread_local const tf__objlist *tl_list;
static _Thread_local const char *tl_prefix;

void tf__listing_in_use(const char *prefix, const tf__objlist *v) {
    tl_prefix = prefix;
    tl_list = v;
}

/* The objects of the listing in use that lie under prefix (which lies under its own). */
static int from_in_use(const char *prefix, tf__objlist *v) {
    size_t a = strlen(tl_prefix), b = strlen(prefix);
    if (b < a || strncmp(prefix, tl_prefix, a) != 0) return 1;
    for (size_t i = 0; i < tl_list->n; i++)
        if (strncmp(tl_list->urls[i], prefix, b) == 0 && push(v, tl_list->urls[i], &tl_list->infos[i]) != 0) {
            tf__objlist_free(v);
            return -ENOMEM;
        }
    return 0;
}

int tf__remote_objects(tf_remote *r, const char *prefix, unsigned flags, tf__objlist *v) {
    memset(v, 0, sizeof *v);
    if (!tf__remote_can_list(r)) return -TF_EUNSUPPORTED;
    if (tl_list && tl_prefix) {
        int rc = from_in_use(prefix, v);
        if (rc <= 0) return rc;
    }
    int on = tf__cache_meta_fd(tf__remote_cache(r)) >= 0;
    uint64_t key = list_key(prefix), max_age = tf__listing_max_age_ns(), now = wall_ns();
    if (on) {
        /* immutable: any age; else ended at most max_age ago (0: never by age) */
        uint64_t not_before = flags & TF_OPEN_IMMUTABLE ? 0 : !max_age ? UINT64_MAX : max_age < now ? now - max_age : 0;
        if (not_before != UINT64_MAX && load(r, key, prefix, not_before, v) == 0) {
            return 0;
        }
    }
    int lock_fd = -1, waited = 0, rc = 0;
    uint64_t waited_from = wall_ns();
    if (on) rc = tf__meta_lock(r, key, prefix, &lock_fd, &waited);
    if (rc) return rc;
    /* listed by the process we waited for, while we waited: the store as
     * it was when we asked, or later */
    if (on && waited && load(r, key, prefix, waited_from > 1000000000ull ? waited_from - 1000000000ull : 0, v) == 0) {
        tf__meta_unlock(lock_fd);
        return 0;
    }
    uint64_t t0 = wall_ns();
#ifdef TF_TEST_HOOKS
    const char *forbid = getenv("TOKENFEED_FAULT_NO_LISTING");
    if (forbid && *forbid == '1') {
        tf__meta_unlock(lock_fd);
        TF_FAIL(-EIO, "%s: listed (test builds: $TOKENFEED_FAULT_NO_LISTING forbids it)", prefix);
    }
#endif
    rc = tf__remote_list(r, prefix, on_object, v);
    if (!rc && v->rc) rc = v->rc;
    if (!rc) rc = tidy(v);
    if (!rc && on && lock_fd >= 0) save(r, key, prefix, v, t0, wall_ns());
    tf__meta_unlock(lock_fd);
    if (rc) tf__objlist_free(v);
    return rc;
}

int tf__remote_list_node(tf_remote *r, const char *prefix, unsigned flags, tf_list_emit_fn emit, void *emit_ctx) {
    tf__objlist v;
    int rc = tf__remote_objects(r, prefix, flags, &v);
    for (size_t i = 0; !rc && i < v.n; i++)
        if (emit(emit_ctx, v.urls[i], &v.infos[i])) break;
    tf__objlist_free(&v);
    return rc;
}

int tf_remote_list_objects(tf_remote *r, const char *prefix, unsigned flags, tf_list_emit_fn emit, void *emit_ctx) {
    tf__clearerr();
    if (!r || !prefix || !emit) TF_FAIL(-EINVAL, "tf_remote_list_objects: a remote, a prefix and an emit function are required");
    if (flags & ~(unsigned)TF_OPEN_IMMUTABLE) TF_FAIL(-EINVAL, "tf_remote_list_objects: flags: unknown bits 0x%x", flags);
    int rc = tf__remote_list_node(r, prefix, flags, emit, emit_ctx);
    if (rc == -TF_EUNSUPPORTED) TF_FAIL(rc, "%s: this store's transport cannot list", prefix);
    return rc;
}

/* ---- expansion ------------------------------------------------------------ */

int tf__remote_expand(tf_remote *r, const char *spec, const tf_open_options *opt, unsigned flags, char ***files,
                      size_t *nfiles, tf__objlist *listing, char **prefix_out) {
    *files = NULL;
    *nfiles = 0;
    *prefix_out = NULL;
    memset(listing, 0, sizeof *listing);
    int kind = tf__pathspec_url_kind(spec);
    int as_is = kind == TF__SPEC_PATH;
    /* a directory URL this node opened before as it is (a tokenfeed dataset):
     * its metadata record, and no listing */
    if (kind == TF__SPEC_DIR && tf_remote_has_record(r, &spec, 1, opt)) as_is = 1;
    char *prefix = NULL;
    int rc = 0;
    if (!as_is) {
        if (!(prefix = tf__pathspec_url_prefix(spec))) return -ENOMEM;
        rc = tf__remote_objects(r, prefix, flags, listing);
        if (rc == -TF_EUNSUPPORTED && kind == TF__SPEC_DIR) {
            rc = 0; /* a store that cannot list: the URL opens as itself */
            as_is = 1;
            tf__clearerr();
        } else if (rc == -TF_EUNSUPPORTED) {
            rc = tf__seterr(-EINVAL, "%s: a glob needs a listing of %s, and this store's transport cannot list", spec,
                            prefix);
            free(prefix);
            return rc;
        } else if (rc) {
            free(prefix);
            return rc;
        }
    }
    if (!as_is) {
        tf__listing *L = tf__listing_new();
        rc = L ? tf__listing_add_objects(L, prefix, (const char *const *)listing->urls, listing->n) : -ENOMEM;
        if (!rc) rc = tf__pathspec_expand(L, spec, kind, files, nfiles);
        tf__listing_free(L);
        if (rc == 1) {
            rc = 0;
            as_is = 1; /* a dataset directory (a manifest), or nothing: the open says what it is */
        } else if (rc == -ENOENT) {
            rc = tf__seterr(-ENOENT, "%s: no object matches this pattern (listed %s)", spec, prefix);
        }
    }
    if (!rc && as_is) {
        char **one = malloc(sizeof *one);
        if (!one || !(one[0] = strdup(spec))) {
            free(one);
            rc = -ENOMEM;
        } else {
            *files = one;
            *nfiles = 1;
        }
    }
    if (rc) {
        tf__objlist_free(listing);
        free(prefix);
        return rc;
    }
    if (listing->n || prefix) *prefix_out = prefix;
    else free(prefix);
    return 0;
}
