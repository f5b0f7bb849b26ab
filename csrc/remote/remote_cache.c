/*
 * remote_cache.c — the node-local chunk cache shared by every process that
 * opens the same directory (docs/remote.md, "One cache per node").
 *
 * DESIGN
 *
 * Truth and index. A chunk is cached iff its file objects/<oid>/<k>.c exists;
 * files land complete (temporary file + rename) and carry a trailer with their
 * XXH64, checked before a process first uses them. The index (file "index",
 * mapped MAP_SHARED by every process) is an open-addressing table of records
 * (key -> state, bytes, next use, fetcher) plus a header with the byte total
 * and the process slots. It is what makes the limit, "fetched once per node"
 * and farthest-next-use eviction work across processes; if it is ever
 * suspect it is rebuilt from the files.
 *
 * Locking. Every index access holds the process mutex `mu` (threads) and an
 * exclusive flock on the file "lock" (processes). The kernel drops a flock
 * when its holder dies, so a killed process never leaves the cache locked.
 * The header's `dirty` word is set while the lock is held and cleared on
 * release: a process that takes the lock and finds it set knows the previous
 * holder died mid-update and rebuilds the index from the chunk files (the
 * only state lost is who is fetching what and the published next uses).
 *
 * Process slots. A process (one tf__cache) owns slot i while it holds an
 * exclusive flock on procs/<i>.lock; the header's procs[i].gen is bumped on
 * every claim and release. Records name their fetcher and their need by
 * (slot, gen); a slot whose gen moved on, or whose lock file nobody holds,
 * is dead: its fetches are taken over, its needs ignored, its temporary
 * files removed. This works across PID namespaces (containers) because it
 * relies on the shared file system only.
 *
 * Eviction. The victim is the present chunk whose effective next use is
 * largest: a need counts while its process is alive and has not consumed past
 * it (procs[slot].position); chunks without a valid need come first, most
 * recently used first (for an order that repeats, the one needed last). A fetch ahead for position p evicts only
 * chunks needed after p (or not at all); a reader that waits evicts anything.
 * One table scan keeps the best candidates (revalidated before use), so a
 * scan is paid once per many evictions.
 *
 * Files removed while another process has them mapped stay readable there
 * (POSIX unlink); their space is freed when unmapped.
 *
 * Trust. The directory is checked (owner, mode) on the descriptor opened at
 * open, and every file is reached relative to descriptors of the directory and
 * its objects/, tmp/ and procs/ subdirectories, with O_NOFOLLOW: swapping the
 * path (or a directory in it) under a running process changes nothing it
 * reads or writes, and a chunk file must be a regular file of this user. A
 * chunk's trailer carries a tag keyed by the cache's secret (the file "key",
 * 0600, made with the cache): bytes another user planted fail it. Layout
 * version 2 (the marker file); a cache of another layout is refused, never
 * read.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "../sources/safe_fs.h"
#include "remote.h"

typedef unsigned long long ull;

#define IDX_MAGIC "TFCIDX02"
#define IDX_VERSION 2u
#define MAX_PROCS 256
#define HDR_BYTES 16384u
#define NCAND 64
#define MAX_SLOTS (1u << 24) /* records of the index: 1 GiB of table at most */
#define LAYOUT 2
#define MARKER "tokenfeed-cache 2\n"
#define KEY_BYTES 16

enum { ST_EMPTY = 0, ST_FETCHING = 1, ST_PRESENT = 2, ST_TOMB = 3 };

typedef struct idx_proc {
    uint64_t gen;
    uint64_t position; /* consumer position: its needs below this are stale */
    int64_t pid;       /* for `tokenfeed cache show` only (not for liveness) */
    uint64_t pad;
} idx_proc;

typedef struct idx_hdr {
    char magic[8];
    uint32_t version, rec_size;
    uint64_t nslots, used, tombs;
    uint64_t bytes;  /* present + being fetched */
    uint64_t chunks; /* present */
    uint64_t dirty;  /* non-zero while a holder of the lock is updating */
    uint64_t stamp;  /* logical clock for LRU among chunks without a need */
    _Atomic uint64_t evictions; /* bumped on every removal: readers revalidate mappings */
    uint64_t changes; /* bumped by publish, commit and eviction: candidate lists go stale */
    uint64_t default_limit; /* the limit of processes that set none (fixed by the creator) */
    uint64_t pad[4];
    idx_proc procs[MAX_PROCS];
} idx_hdr;

typedef struct idx_rec {
    uint64_t oid_lo, oid_hi;
    uint32_t chunk, state;
    uint16_t fetch_slot, need_slot;
    uint32_t fetch_gen;
    uint32_t need_gen, pad;
    uint64_t bytes;
    uint64_t next_use;
    uint64_t stamp;
} idx_rec;

_Static_assert(sizeof(idx_rec) == 64, "index record is 64 bytes");
_Static_assert(sizeof(idx_hdr) <= HDR_BYTES, "index header fits its page run");

typedef struct cand {
    tf__ckey id;
    int cls;
    uint64_t key, stamp;
} cand;

struct tf__cache {
    char *dir;   /* for messages */
    char *abs;   /* dir made absolute at open: the re-check on use */
    int dfd;     /* the directory, checked at open; everything is reached through it */
    int obj_fd, tmp_fd, procs_fd;
    int meta_fd; /* meta/: the node's metadata records (remote_meta.c); -1 when unusable */
    dev_t dev;   /* the directory's identity at open */
    ino_t ino;
    uint64_t key[2]; /* the cache's secret: keys the chunk trailers */
    int lock_fd;
    int slot_fd;
    int index_fd;
    int *peer_fds; /* per slot, for liveness checks; -1 when not open */
    uint32_t slot, gen;
    pid_t pid;
    uint64_t limit;
    uint64_t creator_limit; /* the default limit recorded in the index */
    idx_hdr *hdr;    /* in the first mapping, kept until close */
    idx_rec *recs;   /* in the latest mapping (the table grows: remap) */
    size_t map_len;  /* of the first mapping */
    void *maps[40];  /* mappings made when the table grew (unmapped at close) */
    size_t map_lens[40];
    int nmaps;
    uint64_t mask;
    pthread_mutex_t mu;
    cand cands[NCAND];
    int ncand;
    uint64_t scan_changes, scan_ns; /* index state and time of the last scan */
    _Atomic uint64_t tmp_counter;
    uint64_t fault_n;
    _Atomic uint64_t fault_count;
    int positioned; /* a scheduler of this process published a position */
    _Atomic int full; /* a chunk could not land: the disk is full (reported once, tf__cache_failed) */
};

/* ------------------------------------------------------------------------ */
/* paths and the directory                                                   */
/* ------------------------------------------------------------------------ */

static char *cat3(const char *a, const char *b, const char *c) {
    size_t la = strlen(a), lb = strlen(b), lc = c ? strlen(c) : 0;
    char *s = malloc(la + lb + lc + 1);
    if (!s) return NULL;
    memcpy(s, a, la);
    memcpy(s + la, b, lb);
    if (c) memcpy(s + la + lb, c, lc);
    s[la + lb + lc] = '\0';
    return s;
}

static void oid_hex(const tf__ckey *k, char out[33]) {
    snprintf(out, 33, "%016llx%016llx", (ull)k->oid_hi, (ull)k->oid_lo);
}

static int chunk_path(const tf__cache *c, const tf__ckey *k, char *out, size_t cap) {
    char h[33];
    oid_hex(k, h);
    int n = snprintf(out, cap, "%s/objects/%s/%08x.c", c->dir, h, k->chunk);
    return n > 0 && (size_t)n < cap ? 0 : -ENAMETOOLONG;
}

/* The directory must be ours and writable by nobody else: a cache another
 * user can write could feed a run poisoned bytes. Checked on the object
 * opened (fstat), not on a path that may name another one by the time it is
 * used. */
static int check_private_fd(int fd, const char *path) {
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        TF_FAIL(-e, "%s: cannot stat the cache directory: %s", path, strerror(e));
    }
    if (!S_ISDIR(st.st_mode)) TF_FAIL(-ENOTDIR, "%s: the cache path is not a directory. Pass cache_dir= a directory.", path);
    if (st.st_uid != geteuid())
        TF_FAIL(-EPERM, "%s: the cache directory belongs to uid %u, not to this user (uid %u). A cache another user controls could feed the run altered bytes: use a directory of your own (cache_dir=).",
                path, (unsigned)st.st_uid, (unsigned)geteuid());
    if (st.st_mode & (S_IWGRP | S_IWOTH))
        TF_FAIL(-EPERM, "%s: the cache directory is writable by %s (mode %03o). A cache others can write could feed the run altered bytes: run `chmod go-w %s` or use another cache_dir.",
                path, (st.st_mode & S_IWOTH) ? "every user" : "its group", (unsigned)(st.st_mode & 0777), path);
    return 0;
}

/* Open the subdirectory name of the cache (creating it when create), never
 * through a symlink, and check it as the cache directory itself. */
static int open_sub(int dfd, const char *dir, const char *name, int create, int *out) {
    *out = -1;
    char *p = cat3(dir, "/", name);
    if (!p) return -ENOMEM;
    int rc = 0;
    if (create && mkdirat(dfd, name, 0700) != 0 && errno != EEXIST)
        rc = tf__seterr(-errno, "%s: cannot create: %s", p, strerror(errno));
    int fd = rc ? -1 : openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (!rc && fd < 0)
        rc = tf__seterr(-errno, "%s: cannot open: %s", p,
                        errno == ELOOP || errno == ENOTDIR ? "not a directory (a symbolic link?)" : strerror(errno));
    if (!rc) rc = check_private_fd(fd, p);
    free(p);
    if (rc && fd >= 0) close(fd);
    if (!rc) *out = fd;
    return rc;
}

/* mkdir -p with mode 0700 for every component created. */
static int mkdirs(const char *path) {
    char *p = strdup(path);
    if (!p) return -ENOMEM;
    size_t n = strlen(p);
    while (n > 1 && p[n - 1] == '/') p[--n] = '\0';
    for (char *s = p + 1; *s; s++) {
        if (*s != '/') continue;
        *s = '\0';
        if (mkdir(p, 0700) != 0 && errno != EEXIST) {
            int e = errno;
            free(p);
            TF_FAIL(-e, "%s: cannot create the cache directory: %s", path, strerror(e));
        }
        *s = '/';
    }
    int rc = 0;
    if (mkdir(p, 0700) != 0 && errno != EEXIST) {
        int e = errno;
        rc = tf__seterr(-e, "%s: cannot create the cache directory: %s", path, strerror(e));
    }
    free(p);
    return rc;
}

static int write_small_file(int dfd, const char *name, const char *text) {
    int fd = openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd >= 0) {
        ssize_t w = write(fd, text, strlen(text));
        (void)w;
        close(fd);
    }
    return 0;
}

/* The layout marker, whole or not at all: a process opening the cache at the
 * same moment (before it takes the lock) reads it, and an empty file read
 * between its creation and its write would say "damaged". */
static void write_marker(int dfd) {
    char tmp[64];
    snprintf(tmp, sizeof tmp, "tokenfeed-cache.%ld", (long)getpid());
    unlinkat(dfd, tmp, 0);
    write_small_file(dfd, tmp, MARKER);
    if (renameat(dfd, tmp, dfd, "tokenfeed-cache") != 0) unlinkat(dfd, tmp, 0);
}

/* ------------------------------------------------------------------------ */
/* index                                                                     */
/* ------------------------------------------------------------------------ */

static uint64_t key_hash(const tf__ckey *k) { return tf__mix64(k->oid_lo ^ tf__mix64(k->oid_hi + k->chunk)); }

static int key_eq(const idx_rec *r, const tf__ckey *k) {
    return r->oid_lo == k->oid_lo && r->oid_hi == k->oid_hi && r->chunk == k->chunk;
}

/* Record of key, or NULL. */
static idx_rec *find(tf__cache *c, const tf__ckey *k) {
    uint64_t i = key_hash(k) & c->mask;
    for (uint64_t n = 0; n <= c->mask; n++, i = (i + 1) & c->mask) {
        idx_rec *r = &c->recs[i];
        if (r->state == ST_EMPTY) return NULL;
        if (r->state != ST_TOMB && key_eq(r, k)) return r;
    }
    return NULL;
}

/* A free record for key (not present): the first tombstone on its probe path,
 * or the empty slot that ends it. NULL when the table is full. */
static idx_rec *insert(tf__cache *c, const tf__ckey *k) {
    uint64_t i = key_hash(k) & c->mask;
    idx_rec *tomb = NULL;
    for (uint64_t n = 0; n <= c->mask; n++, i = (i + 1) & c->mask) {
        idx_rec *r = &c->recs[i];
        if (r->state == ST_TOMB) {
            if (!tomb) tomb = r;
            continue;
        }
        if (r->state == ST_EMPTY) {
            idx_rec *dst = tomb ? tomb : r;
            if (tomb) c->hdr->tombs--;
            c->hdr->used++;
            memset(dst, 0, sizeof *dst);
            dst->oid_lo = k->oid_lo;
            dst->oid_hi = k->oid_hi;
            dst->chunk = k->chunk;
            return dst;
        }
    }
    if (tomb) {
        c->hdr->tombs--;
        c->hdr->used++;
        memset(tomb, 0, sizeof *tomb);
        tomb->oid_lo = k->oid_lo;
        tomb->oid_hi = k->oid_hi;
        tomb->chunk = k->chunk;
    }
    return tomb;
}

static void remove_rec(tf__cache *c, idx_rec *r) {
    c->hdr->changes++;
    if (r->state == ST_PRESENT) atomic_fetch_add_explicit(&c->hdr->evictions, 1, memory_order_release);
    r->state = ST_TOMB;
    c->hdr->used--;
    c->hdr->tombs++;
}

/* Rehash in place to drop tombstones (lock held). The live records are
 * counted here rather than taken from hdr->used: the header may be damaged
 * and claim more records than the table holds. */
/* The live records (present or being fetched) of the table, copied out
 * (*live malloc'ed, NULL when none): what a rehash puts back. Counted here
 * rather than taken from hdr->used: the header may be damaged and claim more
 * records than the table holds. */
static int live_records(tf__cache *c, idx_rec **live, uint64_t *n) {
    uint64_t cnt = 0, k = 0;
    for (uint64_t i = 0; i <= c->mask; i++)
        if (c->recs[i].state == ST_PRESENT || c->recs[i].state == ST_FETCHING) cnt++;
    *live = cnt ? malloc(cnt * sizeof **live) : NULL;
    if (cnt && !*live) return -ENOMEM;
    for (uint64_t i = 0; i <= c->mask; i++) {
        idx_rec *r = &c->recs[i];
        if ((r->state == ST_PRESENT || r->state == ST_FETCHING) && k < cnt) (*live)[k++] = *r;
    }
    *n = k;
    return 0;
}

/* Empty the table (slots records) and insert the live records again; frees live. */
static void reinsert(tf__cache *c, uint64_t slots, idx_rec *live, uint64_t n) {
    memset(c->recs, 0, slots * sizeof *c->recs);
    c->hdr->used = c->hdr->tombs = 0;
    for (uint64_t j = 0; j < n; j++) {
        tf__ckey key = {live[j].oid_lo, live[j].oid_hi, live[j].chunk};
        idx_rec *r = insert(c, &key);
        if (r) *r = live[j];
    }
    free(live);
}

/* Rehash in place to drop tombstones (lock held). */
static int compact(tf__cache *c) {
    idx_rec *live = NULL;
    uint64_t n = 0;
    TF_TRY(live_records(c, &live, &n));
    reinsert(c, c->mask + 1, live, n);
    c->ncand = 0;
    return 0;
}

static int slot_alive(tf__cache *c, uint32_t slot, uint32_t gen) {
    if (slot >= MAX_PROCS) return 0;
    if (slot == c->slot) return gen == c->gen;
    if ((uint32_t)c->hdr->procs[slot].gen != gen) return 0;
    if (c->peer_fds[slot] < 0) {
        char name[32];
        snprintf(name, sizeof name, "%u.lock", slot);
        c->peer_fds[slot] = openat(c->procs_fd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        if (c->peer_fds[slot] < 0) return 0;
    }
    if (flock(c->peer_fds[slot], LOCK_SH | LOCK_NB) == 0) {
        flock(c->peer_fds[slot], LOCK_UN);
        return 0;
    }
    return errno == EWOULDBLOCK;
}

/* How much a chunk is worth keeping, for eviction: cls 1 with key = its next
 * use when a live process announced one it has not consumed past; else cls 0
 * with key = the stale need (the position it was last needed at) or
 * UINT64_MAX when it never had one. */
static void chunk_worth(tf__cache *c, const idx_rec *r, int *cls, uint64_t *key) {
    if (r->next_use == TF__NO_NEED) {
        *cls = 0;
        *key = UINT64_MAX;
    } else if (!slot_alive(c, r->need_slot, r->need_gen) || r->next_use < c->hdr->procs[r->need_slot].position) {
        *cls = 0;
        *key = r->next_use;
    } else {
        *cls = 1;
        *key = r->next_use;
    }
}

/* Next use that counts (publish): the key of a cls-1 chunk, else TF__NO_NEED. */
static uint64_t eff_need(tf__cache *c, const idx_rec *r) {
    int cls;
    uint64_t key;
    chunk_worth(c, r, &cls, &key);
    return cls ? key : TF__NO_NEED;
}

/* Candidate a is a better victim than b. Chunks nobody needs go first: an
 * order that repeats (epochs read in the same order) needs the one used last
 * again last, so among them the latest stale need (then the latest use) goes
 * first; then the chunk whose next use is farthest. That is Belady's choice
 * where the order is known, and its usual stand-in where it is not. */
static int better_victim(const cand *a, const cand *b) {
    if (a->cls != b->cls) return a->cls < b->cls;
    if (a->key != b->key) return a->key > b->key;
    return a->stamp > b->stamp;
}

static void scan_candidates(tf__cache *c) {
    c->ncand = 0;
    c->scan_changes = c->hdr->changes;
    c->scan_ns = tf__now_ns();
    for (uint64_t i = 0; i <= c->mask; i++) {
        idx_rec *r = &c->recs[i];
        if (r->state != ST_PRESENT) continue;
        cand x = {{r->oid_lo, r->oid_hi, r->chunk}, 0, 0, r->stamp};
        chunk_worth(c, r, &x.cls, &x.key);
        if (c->ncand < NCAND) {
            c->cands[c->ncand++] = x;
        } else {
            /* replace the worst kept candidate if x is better */
            int w = 0;
            for (int j = 1; j < c->ncand; j++)
                if (better_victim(&c->cands[w], &c->cands[j])) w = j;
            if (better_victim(&x, &c->cands[w])) c->cands[w] = x;
        }
    }
    /* sort best first (insertion sort: at most NCAND) */
    for (int i = 1; i < c->ncand; i++) {
        cand x = c->cands[i];
        int j = i - 1;
        while (j >= 0 && better_victim(&x, &c->cands[j])) {
            c->cands[j + 1] = c->cands[j];
            j--;
        }
        c->cands[j + 1] = x;
    }
}

/* The object directory of k (created when create), or -errno. */
static int obj_dir(const tf__cache *c, const tf__ckey *k, int create) {
    char h[33];
    oid_hex(k, h);
    if (create && mkdirat(c->obj_fd, h, 0700) != 0 && errno != EEXIST) return -errno;
    int fd = openat(c->obj_fd, h, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    return fd < 0 ? -errno : fd;
}

static void chunk_name(const tf__ckey *k, char out[16]) { snprintf(out, 16, "%08x.c", k->chunk); }

static void unlink_chunk(const tf__cache *c, const tf__ckey *k) {
    int d = obj_dir(c, k, 0);
    if (d < 0) return;
    char nm[16];
    chunk_name(k, nm);
    unlinkat(d, nm, 0);
    close(d);
}

static void evict_rec(tf__cache *c, idx_rec *r) {
    tf__ckey k = {r->oid_lo, r->oid_hi, r->chunk};
    unlink_chunk(c, &k);
    c->hdr->bytes -= r->bytes < c->hdr->bytes ? r->bytes : c->hdr->bytes;
    if (c->hdr->chunks) c->hdr->chunks--;
    remove_rec(c, r);
}

/* Evict one chunk whose effective next use is later than `after` (any chunk
 * with urgent). Returns its bytes, or 0 when there is none. Lock held. */
static uint64_t evict_one(tf__cache *c, uint64_t after, int urgent) {
    /* A list from an older state of the index may miss a better victim (a
     * chunk whose need just passed): scan again when the index changed, at
     * once for small tables, at most every 20 ms for large ones. */
    if (c->ncand && c->hdr->changes != c->scan_changes &&
        (c->mask < (1u << 16) || tf__now_ns() - c->scan_ns > 20000000ull))
        c->ncand = 0;
    for (int pass = 0; pass < 2; pass++) {
        while (c->ncand > 0) {
            cand x = c->cands[0];
            memmove(&c->cands[0], &c->cands[1], (size_t)(c->ncand - 1) * sizeof(cand));
            c->ncand--;
            idx_rec *r = find(c, &x.id);
            if (!r || r->state != ST_PRESENT) continue;
            int cls;
            uint64_t key;
            chunk_worth(c, r, &cls, &key);
            if (cls != x.cls || key != x.key) continue; /* changed since the scan: rescan decides */
            if (!urgent && cls == 1 && key <= after) {
                /* the best candidate is needed sooner: nothing to evict
                 * (keep it at the front for the next caller) */
                memmove(&c->cands[1], &c->cands[0], (size_t)c->ncand * sizeof(cand));
                c->cands[0] = x;
                c->ncand++;
                return 0;
            }
            uint64_t b = r->bytes;
            evict_rec(c, r);
            c->scan_changes = c->hdr->changes; /* our own eviction leaves the list valid */
            return b ? b : 1;
        }
        if (pass == 0) scan_candidates(c);
    }
    return 0;
}

static int rebuild(tf__cache *c);
static void follow_growth(tf__cache *c);
static int grow(tf__cache *c);

static void lock(tf__cache *c) {
    pthread_mutex_lock(&c->mu);
    while (flock(c->lock_fd, LOCK_EX) != 0 && errno == EINTR) {
    }
    if (c->hdr->nslots != c->mask + 1) follow_growth(c);
    if (c->hdr->dirty) rebuild(c);
    c->hdr->dirty = 1;
}

static void unlock(tf__cache *c) {
    c->hdr->dirty = 0;
    flock(c->lock_fd, LOCK_UN);
    pthread_mutex_unlock(&c->mu);
}

/* Parse "<32 hex>" and "<8 hex>.c". */
static int parse_hex(const char *s, size_t n, uint64_t *v) {
    uint64_t x = 0;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
        if (d < 0) return 0;
        x = x << 4 | (uint64_t)d;
    }
    *v = x;
    return 1;
}

static int tmp_owner(const char *name, uint32_t *slot, uint32_t *gen) {
    unsigned s, g;
    if (sscanf(name, "%u-%u-", &s, &g) != 2) return 0;
    *slot = s;
    *gen = g;
    return 1;
}

/* Remove the temporary files of dead processes (lock held). */
/* A directory stream over a copy of dfd (the descriptor stays usable). */
static DIR *open_dir_fd(int dfd) {
    int d = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *dp = d >= 0 ? fdopendir(d) : NULL;
    if (!dp && d >= 0) close(d);
    if (dp) rewinddir(dp);
    return dp;
}

static void clean_tmp(tf__cache *c) {
    DIR *t = open_dir_fd(c->tmp_fd);
    if (t) {
        struct dirent *e;
        while ((e = readdir(t))) {
            uint32_t s, g;
            if (e->d_name[0] == '.' || !tmp_owner(e->d_name, &s, &g)) continue;
            if (!slot_alive(c, s, g)) unlinkat(c->tmp_fd, e->d_name, 0);
        }
        closedir(t);
    }
}

/* Rebuild the index from the chunk files (lock held, table possibly torn). */
static int rebuild(tf__cache *c) {
    memset(c->recs, 0, (c->mask + 1) * sizeof *c->recs);
    c->hdr->used = c->hdr->tombs = c->hdr->bytes = c->hdr->chunks = 0;
    c->ncand = 0;
    DIR *d = open_dir_fd(c->obj_fd);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            uint64_t hi, lo;
            if (strlen(e->d_name) != 32 || !parse_hex(e->d_name, 16, &hi) || !parse_hex(e->d_name + 16, 16, &lo)) continue;
            int sfd = openat(c->obj_fd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            DIR *sd = sfd >= 0 ? fdopendir(sfd) : NULL;
            if (!sd && sfd >= 0) close(sfd);
            if (sd) {
                struct dirent *f;
                while ((f = readdir(sd))) {
                    uint64_t k;
                    if (strlen(f->d_name) != 10 || strcmp(f->d_name + 8, ".c") != 0 || !parse_hex(f->d_name, 8, &k)) continue;
                    struct stat st;
                    if (fstatat(dirfd(sd), f->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) ||
                        st.st_uid != geteuid() || (uint64_t)st.st_size <= TF__CHUNK_TRAILER)
                        continue;
                    tf__ckey key = {lo, hi, (uint32_t)k};
                    idx_rec *r = c->hdr->used < (c->mask + 1) / 4 * 3 || grow(c) == 0 ? insert(c, &key) : NULL;
                    if (!r) break;
                    r->state = ST_PRESENT;
                    r->bytes = (uint64_t)st.st_size - TF__CHUNK_TRAILER;
                    r->next_use = TF__NO_NEED;
                    r->stamp = ++c->hdr->stamp;
                    c->hdr->bytes += r->bytes;
                    c->hdr->chunks++;
                }
                closedir(sd);
            }
        }
        closedir(d);
    }
    clean_tmp(c);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* open / close                                                              */
/* ------------------------------------------------------------------------ */

static uint64_t table_slots(uint64_t limit, uint64_t chunk_bytes) {
    /* room for 4x the chunks of the creator's limit (the table is kept at
     * most 3/4 full), bounded; a scan for victims reads it all */
    if (!chunk_bytes) chunk_bytes = 1u << 20;
    uint64_t want = (limit > (1ull << 50) ? (1ull << 50) : limit) / chunk_bytes * 4, n = 1u << 12;
    while (n < want && n < (1u << 22)) n <<= 1;
    return n;
}

static int map_index(tf__cache *c, uint64_t limit, uint64_t chunk_bytes) {
    char *p = cat3(c->dir, "/index", NULL);
    if (!p) return -ENOMEM;
    c->index_fd = openat(c->dfd, "index", O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    int e = errno;
    if (c->index_fd < 0) {
        int rc = tf__seterr(-e, "%s: cannot open the cache index: %s", p, strerror(e));
        free(p);
        return rc;
    }
    struct stat st;
    if (fstat(c->index_fd, &st) != 0) {
        e = errno;
        free(p);
        TF_FAIL(-e, "cannot stat the cache index: %s", strerror(e));
    }
    if (!S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
        int rc = tf__seterr(-EPERM, "%s: the cache index is not a regular file of this user (uid %u). Use a cache directory of your own (cache_dir=).",
                            p, (unsigned)geteuid());
        free(p);
        return rc;
    }
    uint64_t nslots;
    if (st.st_size == 0) {
        nslots = table_slots(limit, chunk_bytes);
#ifdef TF_TEST_HOOKS
        /* a small first table, for tests of its growth */
        const char *ts = getenv("TOKENFEED_TEST_CACHE_SLOTS");
        if (ts && strtoull(ts, NULL, 10) >= 16 && !(strtoull(ts, NULL, 10) & (strtoull(ts, NULL, 10) - 1)))
            nslots = strtoull(ts, NULL, 10);
#endif
        size_t len = HDR_BYTES + (size_t)nslots * sizeof(idx_rec);
        if (ftruncate(c->index_fd, (off_t)len) != 0) {
            e = errno;
            int rc = tf__seterr(-e, "%s: cannot size the cache index (%zu bytes): %s", p, len, strerror(e));
            free(p);
            return rc;
        }
        idx_hdr h;
        memset(&h, 0, sizeof h);
        memcpy(h.magic, IDX_MAGIC, 8);
        h.version = IDX_VERSION;
        h.rec_size = sizeof(idx_rec);
        h.nslots = nslots;
        h.default_limit = c->creator_limit;
        if (pwrite(c->index_fd, &h, sizeof h, 0) != (ssize_t)sizeof h) {
            e = errno ? errno : EIO;
            int rc = tf__seterr(-e, "%s: cannot write the cache index: %s", p, strerror(e));
            free(p);
            return rc;
        }
    } else {
        idx_hdr h;
        if (pread(c->index_fd, &h, sizeof h, 0) != (ssize_t)sizeof h || memcmp(h.magic, IDX_MAGIC, 8) != 0 ||
            h.version != IDX_VERSION || h.rec_size != sizeof(idx_rec) || h.nslots < 16 ||
            (h.nslots & (h.nslots - 1)) || (uint64_t)st.st_size < HDR_BYTES ||
            /* divided, not multiplied: nslots * 64 can wrap around to the file size */
            /* (larger: a process that grew the table died before it said so) */
            h.nslots > MAX_SLOTS || ((uint64_t)st.st_size - HDR_BYTES) / sizeof(idx_rec) < h.nslots ||
            ((uint64_t)st.st_size - HDR_BYTES) % sizeof(idx_rec) != 0) {
            int rc = tf__seterr(-TF_EFORMAT, "%s: index: expected a tokenfeed cache index version %u, found another layout (the cache was made by another tokenfeed version, or the file is damaged). Nothing in it can be trusted: use another cache_dir, or delete this cache directory (no process may be using it) and let it be rebuilt from the store.",
                                p, IDX_VERSION);
            free(p);
            return rc;
        }
        nslots = h.nslots;
        c->creator_limit = h.default_limit;
    }
    free(p);
    c->map_len = HDR_BYTES + (size_t)nslots * sizeof(idx_rec);
    void *m = mmap(NULL, c->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, c->index_fd, 0);
    if (m == MAP_FAILED) {
        e = errno;
        TF_FAIL(-e, "cannot map the cache index: %s", strerror(e));
    }
    c->hdr = m;
    c->recs = (idx_rec *)(void *)((uint8_t *)m + HDR_BYTES);
    c->mask = nslots - 1;
    return 0;
}

/* Map the table of nslots records (the file is that large): the records are
 * read through the new mapping from now on; the header stays in the first
 * one (lock-free readers of it never see it move). */
static int remap_records(tf__cache *c, uint64_t nslots) {
    if ((size_t)c->nmaps >= sizeof c->maps / sizeof *c->maps) return -ENOMEM;
    size_t len = HDR_BYTES + (size_t)nslots * sizeof(idx_rec);
    void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, c->index_fd, 0);
    if (m == MAP_FAILED) return -errno;
    c->maps[c->nmaps] = m;
    c->map_lens[c->nmaps++] = len;
    c->recs = (idx_rec *)(void *)((uint8_t *)m + HDR_BYTES);
    c->mask = nslots - 1;
    c->ncand = 0;
    return 0;
}

/* Another process grew the table (lock held): map its new size (or the
 * size another process fell back to). A header that names a size the file
 * does not have is damaged: the table keeps the size this process knows,
 * rebuilt from the chunk files. */
static void follow_growth(tf__cache *c) {
    uint64_t n = c->hdr->nslots;
    struct stat st;
    if (n >= 16 && n <= MAX_SLOTS && !(n & (n - 1)) && fstat(c->index_fd, &st) == 0 &&
        (uint64_t)st.st_size >= HDR_BYTES && ((uint64_t)st.st_size - HDR_BYTES) / sizeof(idx_rec) >= n &&
        remap_records(c, n) == 0)
        return;
    c->hdr->nslots = c->mask + 1;
    c->hdr->dirty = 1; /* lock() rebuilds next */
}

/* The most records the table may grow to for a limit: one per 2 KiB of it
 * (a cached range takes at least a block of the disk, usually 4 KiB), so a
 * node keeps every small range its limit has room for. */
static uint64_t max_slots(uint64_t limit) {
    uint64_t want = limit / 2048, n = 1u << 12;
    while (n < want && n < MAX_SLOTS) n <<= 1;
    return n;
}

/* Double the table (lock held) when the limit has room for more records:
 * 0, or -errno (the table is left as it was). The file grows first, then
 * the records are rehashed into it and the header says its new size; a
 * holder that dies midway leaves the header dirty, and the next one
 * rebuilds the table from the chunk files at whichever size it then has. */
static int grow(tf__cache *c) {
    uint64_t n = (c->mask + 1) * 2;
    if (n > max_slots(c->limit) || n > MAX_SLOTS) return -ENOSPC;
    if (ftruncate(c->index_fd, (off_t)(HDR_BYTES + n * sizeof(idx_rec))) != 0) return -errno;
    idx_rec *live = NULL;
    uint64_t live_n = 0;
    TF_TRY(live_records(c, &live, &live_n));
    int rc = remap_records(c, n);
    if (rc) {
        free(live);
        return rc;
    }
    reinsert(c, n, live, live_n);
    c->hdr->nslots = n;
    c->hdr->changes++;
    return 0;
}

static int claim_slot(tf__cache *c) {
    for (uint32_t i = 0; i < MAX_PROCS; i++) {
        char name[32];
        snprintf(name, sizeof name, "%u.lock", i);
        int fd = openat(c->procs_fd, name, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd < 0) continue;
        if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
            c->slot_fd = fd;
            c->slot = i;
            return 0;
        }
        close(fd);
    }
    TF_FAIL(-EBUSY, "%s: every one of the %d process slots of the cache is taken. Close other processes using this cache_dir, or give this job another one.",
            c->dir, MAX_PROCS);
}

static int open_lock(tf__cache *c) {
    char *p = cat3(c->dir, "/lock", NULL);
    if (!p) return -ENOMEM;
    c->lock_fd = openat(c->dfd, "lock", O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    int e = errno;
    int rc = c->lock_fd < 0 ? tf__seterr(-e, "%s: cannot open: %s", p, strerror(e)) : 0;
    free(p);
    return rc;
}

/* Take a slot and register it in the header (the index lock is taken here). */
static int register_slot(tf__cache *c) {
    TF_TRY(claim_slot(c));
    lock(c);
    idx_proc *pr = &c->hdr->procs[c->slot];
    pr->gen++;
    if ((uint32_t)pr->gen == 0) pr->gen++;
    c->gen = (uint32_t)pr->gen;
    pr->position = 0;
    pr->pid = (int64_t)getpid();
    unlock(c);
    c->pid = getpid();
    return 0;
}

/* The layout marker: 1 this layout, 0 absent, -2 an older layout, -1 another
 * (message set for both). */
static int read_marker(int dfd, const char *dir) {
    int fd = openat(dfd, "tokenfeed-cache", O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) return 0;
    char b[64] = "";
    ssize_t n = fd >= 0 ? read(fd, b, sizeof b - 1) : -1;
    if (fd >= 0) close(fd);
    b[n > 0 ? n : 0] = '\0';
    if (strcmp(b, MARKER) == 0) return 1;
    unsigned v = 0;
    int older = sscanf(b, "tokenfeed-cache %u", &v) == 1 && v >= 1 && v < LAYOUT;
    if (v)
        tf__seterr(-TF_EFORMAT, "%s: a tokenfeed cache of layout %u (made by %s tokenfeed); this one reads layout %d only. %s",
                   dir, v, older ? "an older" : "a newer", LAYOUT,
                   older ? "Opening a remote dataset with this cache_dir empties it and makes it again in this layout, once no process of the older version has it open."
                         : "Use another cache_dir, or the tokenfeed that made it.");
    else
        tf__seterr(-TF_EFORMAT, "%s: the tokenfeed-cache file is damaged or not a regular file. Use another cache_dir, or delete this directory (no process may be using it).",
                   dir);
    return older ? -2 : -1;
}

/* Remove every entry of the directory name in dfd (regular files, and with
 * depth 1 the regular files of its subdirectories, then those), never
 * following a symlink. */
static void empty_dir(int dfd, const char *name, int depth) {
    int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0) close(fd);
        return;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        struct stat st;
        if (fstatat(fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
        if (S_ISDIR(st.st_mode) && depth > 0) {
            empty_dir(fd, e->d_name, depth - 1);
            unlinkat(fd, e->d_name, AT_REMOVEDIR);
        } else if (!S_ISDIR(st.st_mode)) {
            unlinkat(fd, e->d_name, 0);
        }
    }
    closedir(d);
}

/* A cache of an older layout (lock held, its marker read): nothing in it can
 * be read by this version, so it is emptied and made again, unless a process
 * of the older version still has it open (it holds a process slot). */
static int upgrade_layout(tf__cache *c) {
    if (read_marker(c->dfd, c->dir) == 1) { /* another process upgraded it meanwhile */
        tf__clearerr();
        return 0;
    }
    DIR *d = open_dir_fd(c->procs_fd);
    int busy = 0;
    struct dirent *e;
    while (d && !busy && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        int fd = openat(c->procs_fd, e->d_name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0) continue;
        if (flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) busy = 1;
        close(fd);
    }
    if (d) closedir(d);
    if (busy)
        TF_FAIL(-TF_EFORMAT, "%s: a cache of an older layout, still in use by a process of an older tokenfeed. Use another cache_dir, or let that process finish: the next open then rebuilds the cache in this layout.",
                c->dir);
    unlinkat(c->dfd, "tokenfeed-cache", 0); /* first: a crash from here leaves a cache to make again */
    empty_dir(c->dfd, "objects", 1);
    empty_dir(c->dfd, "tmp", 0);
    empty_dir(c->dfd, "procs", 0);
    empty_dir(c->dfd, "meta", 0);
    unlinkat(c->dfd, "index", 0);
    unlinkat(c->dfd, "key", 0);
    tf__clearerr();
    return 0;
}

/* The cache's secret (lock held): read from "key", made when missing. Only
 * this user can read it (0600 in a 0700 directory), so only this user's
 * processes can make a chunk trailer that verifies. */
static int load_key(tf__cache *c, int create) {
    uint8_t k[KEY_BYTES];
    for (int attempt = 0; attempt < 2; attempt++) {
        int fd = openat(c->dfd, "key", O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        if (fd >= 0) {
            struct stat st;
            int ok = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() && !(st.st_mode & 077) &&
                     st.st_size == KEY_BYTES && pread(fd, k, KEY_BYTES, 0) == KEY_BYTES;
            close(fd);
            if (ok) {
                c->key[0] = tf__le64(k);
                c->key[1] = tf__le64(k + 8);
                return 0;
            }
            if (!create)
                TF_FAIL(-EPERM, "%s/key: the cache's key is not a %d-byte file only this user can read. Delete the cache directory (no process may be using it) and let it be rebuilt.",
                        c->dir, KEY_BYTES);
            /* damaged (a crash while it was made): a new key; chunks made
             * with the old one fail their check and are fetched again */
            unlinkat(c->dfd, "key", 0);
        } else if (errno != ENOENT || !create) {
            int e = errno == ENOENT ? ENOENT : errno;
            TF_FAIL(-e, "%s/key: cannot read the cache's key: %s", c->dir, strerror(e));
        }
        tf__random_bytes(k, sizeof k);
        char tmp[48];
        snprintf(tmp, sizeof tmp, "key.%u.tmp", (unsigned)getpid());
        unlinkat(c->dfd, tmp, 0);
        fd = openat(c->dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd < 0) TF_FAIL(-errno, "%s: cannot create the cache's key: %s", c->dir, strerror(errno));
        int ok = write(fd, k, sizeof k) == (ssize_t)sizeof k && fsync(fd) == 0;
        close(fd);
        if (!ok || renameat(c->dfd, tmp, c->dfd, "key") != 0) {
            int e = errno ? errno : EIO;
            unlinkat(c->dfd, tmp, 0);
            TF_FAIL(-e, "%s: cannot write the cache's key: %s", c->dir, strerror(e));
        }
    }
    TF_FAIL(-EIO, "%s/key: cannot make the cache's key", c->dir);
}

/* The limit of a process that sets none: 10% of what the cache's file system
 * can hold (its free space plus the chunks already cached), at least 1 GB,
 * but never more than half of what it can hold, so that a small disk gets a
 * limit that fits it. Fixed by the process that creates the index and
 * recorded there: every process of the node gets the same one. */
static uint64_t default_limit(int dfd) {
    struct statvfs sv;
    if (fstatvfs(dfd, &sv) != 0) return 1000000000ull;
    uint64_t room = (uint64_t)sv.f_bavail * sv.f_frsize, lim = room / 10;
    if (lim < 1000000000ull) lim = 1000000000ull;
    if (lim > room / 2) lim = room / 2;
    return lim;
}

/* Whether the path still names the directory opened, and it is still
 * private: re-checked whenever a chunk is mapped, so a cache swapped or
 * opened up under a running process is noticed (its descriptors keep
 * reaching the directory checked at open either way). */
static int recheck(const tf__cache *c) {
    struct stat st;
    if (stat(c->abs, &st) != 0 || st.st_dev != c->dev || st.st_ino != c->ino)
        TF_FAIL(-EPERM, "%s: the cache directory was replaced (or moved) since this process opened it. Someone able to write a directory above it may be tampering with it: use a cache_dir whose parent directories only you can write.",
                c->dir);
    return check_private_fd(c->dfd, c->dir);
}

int tf__cache_open(const char *dir, uint64_t limit, uint64_t chunk_bytes, int create, tf__cache **out) {
    *out = NULL;
    if (!dir || !*dir) TF_FAIL(-EINVAL, "cache_dir: expected a directory, found an empty path");
    if (create) TF_TRY(mkdirs(dir));
    tf__cache *c = calloc(1, sizeof *c);
    if (!c) return -ENOMEM;
    c->lock_fd = c->slot_fd = c->index_fd = c->obj_fd = c->tmp_fd = c->procs_fd = c->meta_fd = -1;
    c->limit = limit;
#ifdef TF_TEST_HOOKS
    const char *fe = getenv("TOKENFEED_FAULT_CACHE");
    if (fe && !strncmp(fe, "enospc:", 7)) c->fault_n = strtoull(fe + 7, NULL, 10);
#endif
    c->dir = strdup(dir);
    if (dir[0] == '/') {
        c->abs = strdup(dir);
    } else { /* the process may change its working directory later */
        char cwd[4096];
        c->abs = getcwd(cwd, sizeof cwd) ? cat3(cwd, "/", dir) : strdup(dir);
    }
    c->peer_fds = malloc(MAX_PROCS * sizeof(int));
    int rc = c->dir && c->abs && c->peer_fds ? 0 : -ENOMEM;
    if (!rc) {
        for (int i = 0; i < MAX_PROCS; i++) c->peer_fds[i] = -1;
        size_t n = strlen(c->dir);
        while (n > 1 && c->dir[n - 1] == '/') c->dir[--n] = '\0';
        pthread_mutex_init(&c->mu, NULL);
        c->dfd = open(c->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (c->dfd < 0) {
            int e = errno;
            rc = e == ENOTDIR ? tf__seterr(-ENOTDIR, "%s: the cache path is not a directory. Pass cache_dir= a directory.", dir)
                              : tf__seterr(-e, "%s: cannot open the cache directory: %s", dir, strerror(e));
        }
    } else {
        c->dfd = -1;
    }
    if (!rc) rc = check_private_fd(c->dfd, c->dir);
    if (!rc) {
        struct stat st;
        fstat(c->dfd, &st);
        c->dev = st.st_dev;
        c->ino = st.st_ino;
    }
    int have = 0, upgrade = 0;
    if (!rc) {
        have = read_marker(c->dfd, c->dir);
        upgrade = have == -2 && create;
        if (upgrade) have = 1; /* its files are ours to replace (below, under the lock) */
        else if (have < 0) rc = -TF_EFORMAT;
        else if (!have && !create) rc = tf__seterr(-ENOENT, "%s: not a tokenfeed cache directory (no tokenfeed-cache file)", dir);
    }
    if (!rc && !have) {
        /* an existing non-empty directory that is not a cache: refuse rather
         * than fill (and later prune) someone's files */
        DIR *d = open_dir_fd(c->dfd);
        int other = 0;
        char first[64] = "";
        if (d) {
            struct dirent *e;
            /* (the marker too: another process that was making the cache
             * may have finished since read_marker looked) */
            static const char *const ours[] = {".",    "..",  "lock", "index",        "objects",        "tmp",
                                               "procs", "meta", "key", "CACHEDIR.TAG", "tokenfeed-cache"};
            while ((e = readdir(d))) {
                int known = strncmp(e->d_name, "key.", 4) == 0 || strncmp(e->d_name, "tokenfeed-cache.", 16) == 0;
                for (size_t i = 0; i < sizeof ours / sizeof *ours && !known; i++) known = strcmp(e->d_name, ours[i]) == 0;
                if (!known && !other++) snprintf(first, sizeof first, "%.*s", (int)sizeof first - 1, e->d_name);
            }
            closedir(d);
        }
        if (other)
            rc = tf__seterr(-EEXIST, "%s: the directory holds other files (%s%s) and is not a tokenfeed cache. Pass cache_dir= an empty or new directory.",
                            dir, first, other > 1 ? ", ..." : "");
    }
    if (!rc) rc = open_sub(c->dfd, c->dir, "objects", create, &c->obj_fd);
    if (!rc) rc = open_sub(c->dfd, c->dir, "tmp", create, &c->tmp_fd);
    if (!rc) rc = open_sub(c->dfd, c->dir, "procs", create, &c->procs_fd);
    /* the metadata records are an optimisation: a cache without a usable
     * meta/ (one made before it existed, opened without create) has none */
    if (!rc && open_sub(c->dfd, c->dir, "meta", create, &c->meta_fd) != 0) {
        c->meta_fd = -1;
        tf__clearerr();
    }
    if (!rc) rc = open_lock(c);
    if (!rc) {
        /* creating the index and the key happens under the lock, so two
         * processes opening a new cache at once agree on one of each */
        while (flock(c->lock_fd, LOCK_EX) != 0 && errno == EINTR) {
        }
        c->creator_limit = default_limit(c->dfd); /* recorded if this process creates the index */
        if (upgrade) rc = upgrade_layout(c);
        if (!rc) rc = map_index(c, limit ? limit : c->creator_limit, chunk_bytes);
        if (!rc) rc = load_key(c, create);
        if (!rc && !limit) c->limit = c->creator_limit ? c->creator_limit : default_limit(c->dfd);
        if (!rc && create) {
            write_small_file(c->dfd, "CACHEDIR.TAG",
                             "Signature: 8a477f597d28d172789f06886806bc55\n# This directory is a tokenfeed chunk cache (docs/remote.md).\n");
            write_marker(c->dfd); /* last: the cache is complete */
        }
        flock(c->lock_fd, LOCK_UN);
    }
    if (!rc && create) rc = register_slot(c);
    if (rc) {
        tf__cache_close(c);
        return rc;
    }
    *out = c;
    return 0;
}

uint64_t tf__cache_limit(const tf__cache *c) { return c->limit; }

void tf__cache_failure_said(tf__cache *c) { atomic_store(&c->full, 0); }

int tf__cache_failed(tf__cache *c) {
    if (!atomic_exchange(&c->full, 0)) return 0;
    TF_FAIL(-ENOSPC, "%s: the cache disk is full: chunks fetched ahead could not be written (cache_limit is %llu bytes, more than that file system has free). Nothing in the cache was damaged; free space there or lower cache_limit.",
            c->dir, (ull)c->limit);
}

void tf__cache_close(tf__cache *c) {
    if (!c) return;
    if (c->hdr && c->slot_fd >= 0 && c->pid == getpid()) {
        lock(c);
        /* our needs and fetches die with the slot's generation */
        c->hdr->procs[c->slot].gen++;
        c->hdr->procs[c->slot].pid = 0;
        c->hdr->procs[c->slot].position = 0;
        unlock(c);
    }
    if (c->slot_fd >= 0) close(c->slot_fd);
    if (c->lock_fd >= 0) close(c->lock_fd);
    if (c->index_fd >= 0) close(c->index_fd);
    if (c->obj_fd >= 0) close(c->obj_fd);
    if (c->tmp_fd >= 0) close(c->tmp_fd);
    if (c->procs_fd >= 0) close(c->procs_fd);
    if (c->meta_fd >= 0) close(c->meta_fd);
    if (c->dfd >= 0) close(c->dfd);
    if (c->peer_fds)
        for (int i = 0; i < MAX_PROCS; i++)
            if (c->peer_fds[i] >= 0) close(c->peer_fds[i]);
    for (int i = 0; i < c->nmaps; i++) munmap(c->maps[i], c->map_lens[i]);
    if (c->hdr) munmap(c->hdr, c->map_len);
    if (c->dir) pthread_mutex_destroy(&c->mu);
    free(c->peer_fds);
    free(c->abs);
    free(c->dir);
    free(c);
}

int tf__cache_after_fork(tf__cache *c) {
    if (c->pid == getpid()) return 0;
    /* The child shares the parent's open file descriptions, and with them its
     * flocks: reopen everything lock-related and take a slot of its own. */
    pthread_mutex_init(&c->mu, NULL);
    if (c->lock_fd >= 0) close(c->lock_fd);
    if (c->slot_fd >= 0) close(c->slot_fd);
    c->lock_fd = c->slot_fd = -1;
    for (int i = 0; i < MAX_PROCS; i++) {
        if (c->peer_fds[i] >= 0) close(c->peer_fds[i]);
        c->peer_fds[i] = -1;
    }
    c->ncand = 0;
    TF_TRY(open_lock(c));
    return register_slot(c);
}

const char *tf__cache_dir(const tf__cache *c) { return c->dir; }

int tf__cache_meta_fd(const tf__cache *c) { return c->meta_fd; }

void tf__cache_meta_name(uint64_t key, const char *ext, char out[40]) {
    snprintf(out, 40, "%016llx.%s", (ull)key, ext);
}

void tf__cache_meta_forget(tf__cache *c, uint64_t key) {
    if (c->meta_fd < 0) return;
    char name[40];
    tf__cache_meta_name(key, "tfmeta", name);
    (void)tf__unlink_regular(c->meta_fd, name);
}

void tf__cache_listings_forget(tf__cache *c) {
    if (c->meta_fd < 0) return;
    int fd = openat(c->meta_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0) close(fd);
        return;
    }
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t n = strlen(de->d_name);
        if (n > 7 && strcmp(de->d_name + n - 7, ".tflist") == 0) (void)tf__unlink_regular(c->meta_fd, de->d_name);
    }
    closedir(d);
}

/* ------------------------------------------------------------------------ */
/* fetch protocol                                                            */
/* ------------------------------------------------------------------------ */

int tf__cache_begin(tf__cache *c, const tf__ckey *key, uint64_t bytes, uint64_t next_use, int urgent,
                    uint64_t *evicted_chunks, uint64_t *evicted_bytes) {
    lock(c);
    int rc;
    idx_rec *r = find(c, key);
    if (r && r->state == ST_PRESENT) {
        r->stamp = ++c->hdr->stamp;
        rc = TF__BEGIN_PRESENT;
        goto out;
    }
    if (r && r->state == ST_FETCHING) {
        if (slot_alive(c, r->fetch_slot, r->fetch_gen) && r->fetch_slot != c->slot) {
            rc = TF__BEGIN_OTHER;
            goto out;
        }
        /* its fetcher died (or is an earlier attempt of ours): take it over */
        r->fetch_slot = (uint16_t)c->slot;
        r->fetch_gen = c->gen;
        rc = TF__BEGIN_FETCH;
        goto out;
    }
    /* (counts beyond the table size are a damaged header: compact recounts) */
    if (c->hdr->used > c->mask || c->hdr->tombs > c->mask || c->hdr->used + c->hdr->tombs >= (c->mask + 1) / 4 * 3)
        compact(c);
    /* many small ranges (first touches) fill the table before the bytes
     * reach the limit: the table grows rather than drop what the node read */
    while (c->hdr->used >= (c->mask + 1) / 4 * 3 && grow(c) == 0) {
    }
    while (c->hdr->bytes + bytes > c->limit || c->hdr->used >= (c->mask + 1) / 4 * 3) {
        uint64_t b = evict_one(c, next_use, urgent);
        if (!b) {
            rc = TF__BEGIN_NOSPACE;
            goto out;
        }
        if (evicted_chunks) (*evicted_chunks)++;
        if (evicted_bytes) *evicted_bytes += b;
    }
    r = insert(c, key);
    if (!r) {
        rc = TF__BEGIN_NOSPACE;
        goto out;
    }
    r->state = ST_FETCHING;
    r->bytes = bytes;
    r->fetch_slot = (uint16_t)c->slot;
    r->fetch_gen = c->gen;
    r->next_use = TF__NO_NEED;
    c->hdr->bytes += bytes;
    rc = TF__BEGIN_FETCH;
out:
    unlock(c);
    return rc;
}

void tf__cache_abort(tf__cache *c, const tf__ckey *key) {
    lock(c);
    idx_rec *r = find(c, key);
    if (r && r->state == ST_FETCHING && r->fetch_slot == c->slot && r->fetch_gen == c->gen) {
        c->hdr->bytes -= r->bytes < c->hdr->bytes ? r->bytes : c->hdr->bytes;
        remove_rec(c, r);
    }
    unlock(c);
}

static int write_all(int fd, const void *p, size_t n) {
    const uint8_t *b = p;
    while (n) {
        ssize_t w = write(fd, b, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        if (w == 0) return -EIO;
        b += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Test-only fault injection ($TOKENFEED_FAULT_CACHE, read when a cache is
 * opened, only in test builds (TF_TEST_HOOKS); tests/c/test_remote.c,
 * tests/remote/test_remote_faults.py): "enospc:N" makes the Nth chunk write of this
 * cache (counted from 1) fail as if the disk were full. */
static int fault_write(tf__cache *c) {
    return c->fault_n && atomic_fetch_add(&c->fault_count, 1) + 1 == c->fault_n;
}

/* SipHash-2-4 (Aumasson and Bernstein): a keyed PRF, so a tag cannot be
 * made without the key. */
#define SIPROUND                                                                                                       \
    do {                                                                                                               \
        v0 += v1; v1 = v1 << 13 | v1 >> 51; v1 ^= v0; v0 = v0 << 32 | v0 >> 32;                                          \
        v2 += v3; v3 = v3 << 16 | v3 >> 48; v3 ^= v2;                                                                     \
        v0 += v3; v3 = v3 << 21 | v3 >> 43; v3 ^= v0;                                                                     \
        v2 += v1; v1 = v1 << 17 | v1 >> 47; v1 ^= v2; v2 = v2 << 32 | v2 >> 32;                                          \
    } while (0)
static uint64_t siphash(const uint64_t key[2], const uint8_t *m, size_t n) {
    uint64_t v0 = 0x736f6d6570736575ull ^ key[0], v1 = 0x646f72616e646f6dull ^ key[1];
    uint64_t v2 = 0x6c7967656e657261ull ^ key[0], v3 = 0x7465646279746573ull ^ key[1];
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w = tf__le64(m + i);
        v3 ^= w;
        SIPROUND;
        SIPROUND;
        v0 ^= w;
    }
    uint64_t b = (uint64_t)n << 56;
    for (size_t j = 0; i + j < n; j++) b |= (uint64_t)m[i + j] << (8 * j);
    v3 ^= b;
    SIPROUND;
    SIPROUND;
    v0 ^= b;
    v2 ^= 0xff;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}
#undef SIPROUND

/* Chunk trailer (layout 2): magic, object id, chunk index, length, then a tag
 * keyed by the cache's secret: SipHash of those 32 bytes and of the data's
 * XXH64 seeded with the secret (hashing the data itself with SipHash would
 * cost a core per GB/s read; the seed is as secret as the key). */
static void make_trailer(const tf__cache *c, uint8_t t[TF__CHUNK_TRAILER], const tf__ckey *k, const void *data, size_t len) {
    memcpy(t, TF__CHUNK_MAGIC, 8);
    tf__put_le64(t + 8, k->oid_lo ^ k->oid_hi);
    tf__put_le64(t + 16, k->chunk);
    tf__put_le64(t + 24, len);
    uint8_t m[40];
    memcpy(m, t, 32);
    tf__put_le64(m + 32, tf_hash64(data, len, c->key[0] ^ tf__mix64(c->key[1])));
    tf__put_le64(t + 32, siphash(c->key, m, sizeof m));
}

uint64_t tf__cache_seed(const tf__cache *c) { return c->key[0] ^ tf__mix64(c->key[1]); }

uint64_t tf__cache_seal(const tf__cache *c, const char magic[8], uint64_t digest) {
    uint8_t m[16];
    memcpy(m, magic, 8);
    tf__put_le64(m + 8, digest);
    return siphash(c->key, m, sizeof m);
}

int tf__cache_trailer_ok(const tf__cache *c, const tf__ckey *k, const void *data, size_t len) {
    uint8_t expect[TF__CHUNK_TRAILER];
    make_trailer(c, expect, k, data, len);
    return memcmp((const uint8_t *)data + len, expect, TF__CHUNK_TRAILER) == 0;
}

/* objects/<oid>/ with its info file (written once, atomically). Returns the
 * directory's descriptor, or -errno. */
static int ensure_object_dir(tf__cache *c, const tf__ckey *k, const char *url, const tf_object_info *info) {
    char h[33];
    oid_hex(k, h);
    int made = mkdirat(c->obj_fd, h, 0700) == 0;
    if (!made && errno != EEXIST) {
        int e = errno;
        TF_FAIL(-e, "%s/objects/%s: cannot create: %s", c->dir, h, strerror(e));
    }
    int d = openat(c->obj_fd, h, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (d < 0) {
        int e = errno;
        TF_FAIL(-e, "%s/objects/%s: cannot open: %s", c->dir, h, strerror(e));
    }
    if (!made) return d;
    char tmp[96];
    snprintf(tmp, sizeof tmp, "%u-%u-%llu.info", c->slot, c->gen, (ull)atomic_fetch_add(&c->tmp_counter, 1));
    int fd = openat(c->tmp_fd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return d; /* the info file only serves `tokenfeed cache show` */
    char text[4600];
    int n = snprintf(text, sizeof text, "url %s\nsize %llu\nversion %s\n", url, (ull)info->size, info->version);
    int rc = write_all(fd, text, (size_t)(n > 0 && (size_t)n < sizeof text ? n : 0));
    close(fd);
    if (rc || renameat(c->tmp_fd, tmp, d, "info") != 0) unlinkat(c->tmp_fd, tmp, 0);
    return d;
}

int tf__cache_commit(tf__cache *c, const tf__ckey *key, const char *url, const tf_object_info *info,
                     const void *data, size_t len, uint64_t next_use, void **map_out, size_t *map_len_out) {
    if (map_out) {
        *map_out = NULL;
        *map_len_out = 0;
    }
    char tmp[96], dst[16];
    int od = ensure_object_dir(c, key, url, info), rc = 0;
    if (od < 0) {
        tf__cache_abort(c, key);
        return od;
    }
    chunk_name(key, dst);
    uint64_t rnd;
    tf__random_bytes(&rnd, sizeof rnd);
    snprintf(tmp, sizeof tmp, "%u-%u-%llu-%016llx.tmp", c->slot, c->gen, (ull)atomic_fetch_add(&c->tmp_counter, 1),
             (ull)rnd);
    uint8_t tr[TF__CHUNK_TRAILER];
    make_trailer(c, tr, key, data, len);
    int fd = openat(c->tmp_fd, tmp, (map_out ? O_RDWR : O_WRONLY) | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    void *m = MAP_FAILED;
    if (fd < 0) {
        rc = -errno;
    } else {
        rc = fault_write(c) ? -ENOSPC : write_all(fd, data, len);
        if (!rc) rc = write_all(fd, tr, sizeof tr);
        /* mapped before it has a name: an eviction right after the rename
         * cannot take it from the reader waiting for it */
        if (!rc && map_out) m = mmap(NULL, len + TF__CHUNK_TRAILER, PROT_READ, MAP_SHARED, fd, 0);
        if (close(fd) != 0 && !rc) rc = -errno;
        /* no fsync: a chunk torn by a power loss fails its hash and is fetched again */
        if (!rc && renameat(c->tmp_fd, tmp, od, dst) != 0) {
            rc = -errno;
            /* a concurrent prune removed the (then empty) object directory */
            if (rc == -ENOENT) {
                close(od);
                od = ensure_object_dir(c, key, url, info);
                rc = od < 0 ? od : renameat(c->tmp_fd, tmp, od, dst) == 0 ? 0 : -errno;
            }
        }
        if (rc) unlinkat(c->tmp_fd, tmp, 0);
    }
    if (od >= 0) close(od);
    if (rc && m != MAP_FAILED) {
        munmap(m, len + TF__CHUNK_TRAILER);
        m = MAP_FAILED;
    }
    if (!rc && m != MAP_FAILED) {
        *map_out = m;
        *map_len_out = len + TF__CHUNK_TRAILER;
    }
    if (rc) {
        tf__cache_abort(c, key);
        if (rc == -ENOSPC || rc == -EDQUOT) atomic_store(&c->full, 1);
        if (rc == -ENOSPC || rc == -EDQUOT)
            TF_FAIL(-ENOSPC, "%s: the cache disk is full (writing a %zu-byte chunk of %s). Nothing in the cache was damaged; free space on that file system or lower cache_limit (now %llu bytes).",
                    c->dir, len, url, (ull)c->limit);
        TF_FAIL(rc, "%s: cannot write a chunk of %s into the cache: %s", c->dir, url, strerror(-rc));
    }
    lock(c);
    idx_rec *r = find(c, key);
    if (!r) {
        r = insert(c, key);
        if (r) {
            r->bytes = len;
            c->hdr->bytes += len;
        }
    }
    if (r) {
        if (r->state != ST_PRESENT) c->hdr->chunks++;
        if (r->bytes != len) {
            c->hdr->bytes += len;
            c->hdr->bytes -= r->bytes < c->hdr->bytes ? r->bytes : c->hdr->bytes;
            r->bytes = len;
        }
        r->state = ST_PRESENT;
        r->stamp = ++c->hdr->stamp;
        c->hdr->changes++;
        if (next_use != TF__NO_NEED) {
            /* a need the consumer already reached (a reader waiting now, or
             * a fetch that took a while) means "now", not "passed" */
            uint64_t now = c->hdr->procs[c->slot].position;
            r->next_use = !c->positioned ? TF__NO_NEED : next_use < now ? now : next_use;
            r->need_slot = (uint16_t)c->slot;
            r->need_gen = c->gen;
        } else {
            r->next_use = TF__NO_NEED;
        }
    }
    unlock(c);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* readers                                                                   */
/* ------------------------------------------------------------------------ */

void tf__cache_unmap(void *map, size_t map_len) {
    if (map && map_len) munmap(map, map_len);
}

void tf__cache_forget(tf__cache *c, const tf__ckey *key) {
    lock(c);
    idx_rec *r = find(c, key);
    if (r && r->state == ST_PRESENT) evict_rec(c, r);
    else unlink_chunk(c, key);
    unlock(c);
}

int tf__cache_map(tf__cache *c, const tf__ckey *key, size_t len, const uint64_t *sums, size_t nsums,
                  uint64_t granule, void **map, size_t *map_len) {
    *map = NULL;
    *map_len = 0;
    char path[4096], nm[16];
    TF_TRY(chunk_path(c, key, path, sizeof path));
    TF_TRY(recheck(c));
    int od = obj_dir(c, key, 0);
    if (od < 0) return od == -ENOENT ? -ENOENT : od == -ELOOP || od == -ENOTDIR ? -TF_ECHECKSUM : od;
    chunk_name(key, nm);
    int fd = openat(od, nm, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    int fe = errno;
    close(od);
    if (fd < 0 && fe == ENOENT) return -ENOENT;
    struct stat st;
    const char *why = NULL;
    size_t want = len + TF__CHUNK_TRAILER;
    void *m = MAP_FAILED;
    if (fd < 0) {
        if (fe != ELOOP) return -fe;
        why = "a symbolic link";
    } else if (fstat(fd, &st) != 0) why = "cannot stat";
    else if (!S_ISREG(st.st_mode) || st.st_uid != geteuid()) why = "not a regular file of this user";
    else if ((uint64_t)st.st_size != want) why = "wrong size";
    else m = mmap(NULL, want, PROT_READ, MAP_SHARED, fd, 0);
    if (fd >= 0) close(fd);
    if (!why && m == MAP_FAILED) why = "cannot map";
    if (!why) {
        const uint8_t *b = m;
        if (!tf__cache_trailer_ok(c, key, b, len)) why = "its trailer does not verify (damaged, or not written by this cache)";
        for (size_t g = 0; !why && sums && g < nsums; g++) {
            uint64_t off = g * granule, n = len - off < granule ? len - off : granule;
            if (off >= len) break;
            if (tf_hash64(b + off, (size_t)n, 0) != sums[g]) why = "chunk checksum mismatch";
        }
    }
    if (why) {
        if (m != MAP_FAILED) munmap(m, want);
        tf__cache_forget(c, key);
        TF_FAIL(-TF_ECHECKSUM, "%s: cached chunk is corrupt (%s); it was removed", path, why);
    }
    lock(c);
    idx_rec *r = find(c, key);
    if (r && r->state == ST_PRESENT) r->stamp = ++c->hdr->stamp;
    unlock(c);
    *map = m;
    *map_len = want;
    return 0;
}

uint64_t tf__cache_evictions(const tf__cache *c) {
    return atomic_load_explicit(&c->hdr->evictions, memory_order_acquire);
}

int tf__cache_present(tf__cache *c, const tf__ckey *key) {
    lock(c);
    idx_rec *r = find(c, key);
    int p = r && r->state == ST_PRESENT;
    unlock(c);
    return p;
}

int tf__cache_fetching_elsewhere(tf__cache *c, const tf__ckey *key) {
    lock(c);
    idx_rec *r = find(c, key);
    int f = r && r->state == ST_FETCHING && r->fetch_slot != c->slot && slot_alive(c, r->fetch_slot, r->fetch_gen);
    unlock(c);
    return f;
}

void tf__cache_publish(tf__cache *c, const tf__ckey *keys, const uint64_t *next_use, size_t n, uint64_t position) {
    lock(c);
    if (c->hdr->procs[c->slot].position != position || n) c->hdr->changes++;
    c->hdr->procs[c->slot].position = position;
    c->positioned = 1;
    for (size_t i = 0; i < n; i++) {
        idx_rec *r = find(c, &keys[i]);
        if (!r || (r->state != ST_PRESENT && r->state != ST_FETCHING)) continue;
        int mine = r->need_slot == c->slot && r->need_gen == c->gen;
        uint64_t cur = mine ? TF__NO_NEED : eff_need(c, r);
        if (mine || next_use[i] <= cur) {
            r->next_use = next_use[i];
            r->need_slot = (uint16_t)c->slot;
            r->need_gen = c->gen;
        }
    }
    unlock(c);
}

void tf__cache_usage(tf__cache *c, uint64_t *bytes, uint64_t *limit) {
    lock(c);
    *bytes = c->hdr->bytes;
    unlock(c);
    *limit = c->limit;
}

/* ------------------------------------------------------------------------ */
/* administration: tf_cache_info_get, tf_cache_prune                         */
/* ------------------------------------------------------------------------ */

/* Open an existing cache without taking a process slot. */
static int open_admin(const char *dir, tf__cache **out) {
    tf__clearerr();
    int rc = tf__cache_open(dir, UINT64_MAX, 0, 0, out);
    if (rc) return rc;
    (*out)->slot = UINT32_MAX; /* no slot: every slot is a peer */
    (*out)->pid = getpid();
    return 0;
}

static uint64_t count_objects_and_tmp(const tf__cache *c, uint64_t *temp_bytes, int remove_empty) {
    uint64_t n = 0;
    DIR *d = open_dir_fd(c->obj_fd);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.') continue;
            int sfd = openat(c->obj_fd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            DIR *sd = sfd >= 0 ? fdopendir(sfd) : NULL;
            if (!sd && sfd >= 0) close(sfd);
            int chunks = 0;
            if (sd) {
                struct dirent *f;
                while ((f = readdir(sd)))
                    if (strlen(f->d_name) > 2 && strcmp(f->d_name + strlen(f->d_name) - 2, ".c") == 0) chunks++;
                if (!chunks && remove_empty) unlinkat(dirfd(sd), "info", 0);
                closedir(sd);
            }
            if (chunks) n++;
            else if (remove_empty && sd) unlinkat(c->obj_fd, e->d_name, AT_REMOVEDIR);
        }
        closedir(d);
    }
    *temp_bytes = 0;
    DIR *t = open_dir_fd(c->tmp_fd);
    if (t) {
        struct dirent *e;
        while ((e = readdir(t))) {
            struct stat st;
            if (e->d_name[0] != '.' && fstatat(c->tmp_fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0)
                *temp_bytes += (uint64_t)st.st_size;
        }
        closedir(t);
    }
    return n;
}

int tf_cache_info_get(const char *dir, tf_cache_info *info) {
    TF_NEED_ARG(dir);
    TF_NEED_ARG(info);
    memset(info, 0, sizeof *info);
    tf__cache *c;
    TF_TRY(open_admin(dir, &c));
    lock(c);
    info->bytes = 0;
    for (uint64_t i = 0; i <= c->mask; i++) {
        idx_rec *r = &c->recs[i];
        if (r->state == ST_PRESENT) {
            info->chunks++;
            info->bytes += r->bytes;
        } else if (r->state == ST_FETCHING && slot_alive(c, r->fetch_slot, r->fetch_gen)) {
            info->fetching++;
        }
    }
    for (uint32_t s = 0; s < MAX_PROCS; s++)
        if (c->hdr->procs[s].pid && slot_alive(c, s, (uint32_t)c->hdr->procs[s].gen)) info->processes++;
    unlock(c);
    info->objects = count_objects_and_tmp(c, &info->temp_bytes, 0);
    tf__cache_close(c);
    return 0;
}

int tf_cache_prune(const char *dir, uint64_t keep_bytes) {
    TF_NEED_ARG(dir);
    tf__cache *c;
    TF_TRY(open_admin(dir, &c));
    lock(c);
    int rc = 0;
    if (keep_bytes == 0) {
        for (uint32_t s = 0; s < MAX_PROCS; s++)
            if (c->hdr->procs[s].pid && slot_alive(c, s, (uint32_t)c->hdr->procs[s].gen)) {
                rc = tf__seterr(-EBUSY, "%s: a process (pid %lld) has the cache open; emptying it now would make it fetch everything again. Stop it first, or prune to a size (--keep).",
                                c->dir, (long long)c->hdr->procs[s].pid);
                break;
            }
    }
    if (!rc) {
        clean_tmp(c);
        c->ncand = 0;
        while (c->hdr->bytes > keep_bytes)
            if (!evict_one(c, 0, 1)) break;
    }
    unlock(c);
    uint64_t tb;
    if (!rc) count_objects_and_tmp(c, &tb, 1);
    /* emptied: the metadata records go too (nobody has the cache open) */
    if (!rc && keep_bytes == 0) empty_dir(c->dfd, "meta", 0);
    tf__cache_close(c);
    return rc;
}
