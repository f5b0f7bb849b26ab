/*
 * remote.c — remote objects: the transport wrapper (retries with backoff and
 * jitter), the fetch pool, and the chunk read path over the node-local cache
 * (remote_cache.c). docs/remote.md describes the behaviour.
 *
 * DESIGN
 *
 * Threads. A tf_remote owns a pool of fetch threads (started on the first
 * job). Jobs are either a chunk (fetch, check, land in the cache) or one of
 * the metadata requests of an open: a plain range (uncached), the size of an
 * object, or the listing of a prefix. They wait
 * in a min-heap ordered by (urgent first, then next use, then arrival): a
 * reader blocked on a chunk is urgent; the scheduler's requests come in the
 * order of first use. A chunk has at most one job per process (hash by key);
 * asking again only raises its priority.
 *
 * Who waits on whom. Readers (engine workers, tf_dataset_read) wait on
 * `done_cv` for the job of the chunk they need; pool threads broadcast it
 * when a job ends. A pool thread whose chunk is being fetched by another
 * process polls the index (backing off from 1 to 50 ms) until it lands or its
 * fetcher dies. Backoff sleeps between retries wait on `stop_cv`, so freeing
 * the remote never waits out a backoff.
 *
 * Ownership. A job is referenced by the pool while queued or running and by
 * each waiter; the last unref frees it. Jobs copy what they need of the object
 * (URL, size, version, checksums), so a dataset may be freed while its chunks
 * are still being fetched ahead. A job never writes into its waiter's memory:
 * a range lands in a buffer of the job's own, a size or a listing in the job,
 * and the waiter copies the result out once the job is done.
 *
 * Open chunks. Chunks mapped by this process are kept in a small table (at
 * most TF__OPEN_CHUNKS unreferenced ones, least recently used dropped first)
 * so that the hash check of a cached chunk is paid once per mapping, not per
 * read.
 *
 * Interrupts. A caller's thread waiting for jobs (an open's requests, a
 * chunk) wakes every TF__INTERRUPT_SLICE_NS to ask tf__interrupted(); when
 * interrupted it returns -EINTR at once, without waiting for a transport call
 * in flight. A chunk's job goes on (it writes only into the cache, and others
 * may wait for it too); of an open's requests the queued ones are dropped and
 * the running ones marked cancelled (their retry loop stops before the next
 * attempt, waking from its backoff) and left to end and free themselves.
 * Caller threads that retry in place (stat, reads outside the chunked region)
 * are interrupted in their backoff.
 *
 * Freeing. The last tf_remote_free stops the pool and joins its threads,
 * except those still inside a transport call for a job whose waiter was
 * interrupted: they are detached (pool_thread), and the last of them to end
 * frees the remote, so that freeing the store of an interrupted open does not
 * wait for the request in flight either.
 *
 * fork(). A child (a DataLoader worker) has no pool threads and may hold
 * copies of locked mutexes: the first call in the child re-initialises the
 * locks, forgets (leaks) the parent's jobs and starts its own pool, and takes
 * its own process slot in the cache.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../common/settings.h"
#include "remote.h"

typedef unsigned long long ull;

#define TF__OPEN_CHUNKS 64
#define TF__JOB_NOSPACE 1 /* internal: a prefetch found no room; asked again later */
#define TF__HASH 1024
#define TF__SMALL_READ (256u << 10) /* reads up to this size do not wait for their whole chunk */

/* ------------------------------------------------------------------------ */
/* transport messages                                                        */
/* ------------------------------------------------------------------------ */

/* Per-thread message buffer, from a pthread key rather than _Thread_local:
 * the extension module's static TLS (it has an initial-exec variable, see
 * sigbus.c) must stay small enough for dlopen. */
#define TMSG_CAP 512
static pthread_key_t tmsg_key;
static pthread_once_t tmsg_once = PTHREAD_ONCE_INIT;
static int tmsg_ok;
static char tmsg_fallback[1]; /* "" when no buffer can be had */
static void tmsg_init(void) { tmsg_ok = pthread_key_create(&tmsg_key, free) == 0; }

static char *tmsg(void) {
    pthread_once(&tmsg_once, tmsg_init);
    if (!tmsg_ok) return tmsg_fallback;
    char *b = pthread_getspecific(tmsg_key);
    if (!b) {
        b = calloc(1, TMSG_CAP);
        if (!b || pthread_setspecific(tmsg_key, b) != 0) {
            free(b);
            return tmsg_fallback;
        }
    }
    return b;
}

void tf_transport_set_error(const char *fmt, ...) {
    char *b = tmsg();
    if (b == tmsg_fallback) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b, TMSG_CAP, fmt, ap);
    va_end(ap);
}

/* The job a pool thread runs (NULL on other threads): its retry loops stop
 * when the job is cancelled. */
static pthread_key_t cjob_key;
static pthread_once_t cjob_once = PTHREAD_ONCE_INIT;
static int cjob_ok;
static void cjob_init(void) { cjob_ok = pthread_key_create(&cjob_key, NULL) == 0; }
static void set_current_job(void *j) {
    pthread_once(&cjob_once, cjob_init);
    if (cjob_ok) pthread_setspecific(cjob_key, j);
}
static void *current_job(void) {
    pthread_once(&cjob_once, cjob_init);
    return cjob_ok ? pthread_getspecific(cjob_key) : NULL;
}

static pthread_key_t rpos_key;
static pthread_once_t rpos_once = PTHREAD_ONCE_INIT;
static int rpos_ok;
static void rpos_init(void) { rpos_ok = pthread_key_create(&rpos_key, NULL) == 0; }

void tf__remote_set_reader_position(uint64_t pos) {
    pthread_once(&rpos_once, rpos_init);
    if (rpos_ok) pthread_setspecific(rpos_key, (void *)(uintptr_t)(pos == UINT64_MAX ? 0 : pos + 1));
}

static uint64_t reader_position(void) {
    pthread_once(&rpos_once, rpos_init);
    uintptr_t v = rpos_ok ? (uintptr_t)pthread_getspecific(rpos_key) : 0;
    return v ? (uint64_t)v - 1 : TF__NO_NEED;
}

/* ------------------------------------------------------------------------ */
/* the remote object                                                         */
/* ------------------------------------------------------------------------ */

typedef struct job {
    struct job *hnext;
    int kind; /* J_CHUNK, J_RANGE, J_STAT or J_LIST */
    tf__ckey key;
    char *url;
    tf_object_info info;
    uint64_t off, len;
    uint64_t *sums;
    size_t nsums;
    uint64_t granule;
    uint64_t next_use;
    int urgent;
    uint64_t seq;
    int state; /* QUEUED, RUNNING, DONE */
    int cancel; /* its waiter gave up (interrupted): stop at the next retry */
    int attempt;   /* the attempt running now (1-based; 0: none yet), and its */
    char cur[256]; /* object: for a waiter's progress line */
    int rc;
    char err[600];
    int refs;
    uint8_t *buf;          /* J_RANGE: the bytes read (len of them once done) */
    struct listed_obj *ls; /* J_LIST: what the listing showed */
    size_t nls, capls;
    int ls_nomem;          /* J_LIST: an object could not be kept */
    int open_range;        /* J_CHUNK: a range an open reads (tf__remote_read_many_shared) */
    size_t heap_i;
} job;

typedef struct listed_obj {
    char *url;
    tf_object_info info;
} listed_obj;

enum { J_CHUNK = 0, J_RANGE = 1, J_STAT = 2, J_LIST = 3 };
enum { JS_QUEUED = 0, JS_RUNNING = 1, JS_DONE = 2 };

/* A fetch thread. cur (mu) is the job it runs; a thread running a job its
 * waiter abandoned is detached when the remote is freed, not joined: it ends
 * after its transport call returns, and the last such thread frees the
 * remote (tf_remote_free). */
typedef struct pool_thread {
    tf_remote *r;
    pthread_t th;
    job *cur;
    int detached;
} pool_thread;

typedef struct ochunk {
    struct ochunk *next;
    tf_remote *owner;
    tf__ckey key;
    void *map;
    size_t map_len;
    size_t len;
    int refs;
    uint64_t last;
    uint64_t valid_at; /* the cache's eviction counter when last known cached */
} ochunk;

struct tf_remote {
    _Atomic long refs;
    tf_transport t;
    tf_remote_config cfg;
    char *cache_dir;
    tf__cache *cache;
    pid_t pid;

    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv, stop_cv;
    job **heap;
    size_t nheap, capheap;
    job *hash[TF__HASH];
    struct pool_thread *threads;
    int nstarted;
    int ndetached; /* pool threads left to end on their own when the remote was freed */
    int handed_over; /* the last of them frees the remote */
    int stop;
    uint64_t seq;

    pthread_mutex_t omu;
    ochunk *open[TF__HASH];
    uint64_t nopen, nidle, clock;
    uint64_t seen_evictions; /* eviction counter when idle mappings were last revalidated */

    _Atomic uint64_t st_requests, st_bytes, st_retries, st_chunks, st_hits, st_waits, st_refetch, st_evict,
        st_evict_bytes, st_wait_ns, st_small;
};

static size_t hslot(const tf__ckey *k) {
    return (size_t)(tf__mix64(k->oid_lo ^ (k->oid_hi * 31) ^ k->chunk) % TF__HASH);
}
static int keq(const tf__ckey *a, const tf__ckey *b) {
    return a->oid_lo == b->oid_lo && a->oid_hi == b->oid_hi && a->chunk == b->chunk;
}

void tf_remote_config_init(tf_remote_config *cfg) {
    if (!cfg) return;
    memset(cfg, 0, sizeof *cfg);
    tf__settings_init(TF_SCOPE_REMOTE, cfg);
}

static int resolve_config(const tf_remote_config *in, tf_remote_config *c) {
    *c = *in;
    if (!c->cache_dir || !*c->cache_dir) TF_FAIL(-EINVAL, "cache_dir: expected a directory for the chunk cache, found none");
    /* defaults and bounds: the remote rows of the settings table (common/settings.c) */
    TF_TRY(tf__settings_resolve(TF_SCOPE_REMOTE, c));
    if (c->chunk_bytes % 4096)
        TF_FAIL(-EINVAL, "chunk_size: expected a multiple of 4096 between 64 KiB and 1 GiB, found %llu", (ull)c->chunk_bytes);
    if (c->backoff_max_ms < c->backoff_ms) c->backoff_max_ms = c->backoff_ms;
    return 0;
}

/* With the cache open: its limit (0 asks for the cache's default, the same
 * for every process of the node) and what depends on it. */
static int resolve_limits(tf_remote_config *c, uint64_t cache_limit) {
    c->cache_limit = cache_limit;
    if (c->cache_limit < 4 * c->chunk_bytes)
        TF_FAIL(-EINVAL, "cache_limit: expected at least 4 chunks (%llu bytes at chunk_size %llu), found %llu. Raise cache_limit or lower chunk_size.",
                (ull)(4 * c->chunk_bytes), (ull)c->chunk_bytes, (ull)c->cache_limit);
    if (!c->prefetch_bytes) {
        c->prefetch_bytes = c->cache_limit / 2;
        if (c->prefetch_bytes > (2ull << 30)) c->prefetch_bytes = 2ull << 30;
    }
    if (c->prefetch_bytes > c->cache_limit) c->prefetch_bytes = c->cache_limit;
    return 0;
}

static int init_locks(tf_remote *r) {
    if (pthread_mutex_init(&r->mu, NULL) || pthread_mutex_init(&r->omu, NULL)) return -ENOMEM;
    return tf__cond_init(&r->work_cv) || tf__cond_init(&r->done_cv) || tf__cond_init(&r->stop_cv) ? -ENOMEM : 0;
}

int tf_remote_create(const tf_transport *t, const tf_remote_config *cfg, tf_remote **out) {
    TF_NEED_ARG(out);
    *out = NULL;
    tf__clearerr();
    if (!t || !t->stat || !t->read) TF_FAIL(-EINVAL, "transport: expected stat and read callbacks");
    if (!cfg) TF_FAIL(-EINVAL, "remote config: expected a configuration with cache_dir");
    tf_remote *r = calloc(1, sizeof *r);
    if (!r) return -ENOMEM;
    int rc = resolve_config(cfg, &r->cfg);
    if (!rc) {
        r->cache_dir = strdup(r->cfg.cache_dir);
        rc = r->cache_dir ? 0 : -ENOMEM;
        r->cfg.cache_dir = r->cache_dir;
    }
    if (!rc) rc = init_locks(r);
    if (!rc) rc = tf__cache_open(r->cache_dir, r->cfg.cache_limit, r->cfg.chunk_bytes, 1, &r->cache);
    if (!rc) rc = resolve_limits(&r->cfg, tf__cache_limit(r->cache));
    if (rc) {
        tf__cache_close(r->cache);
        free(r->cache_dir);
        free(r);
        return rc;
    }
    r->t = *t;
    r->pid = getpid();
    atomic_store(&r->refs, 1);
    *out = r;
    return 0;
}

tf_remote *tf__remote_ref(tf_remote *r) {
    if (r) atomic_fetch_add(&r->refs, 1);
    return r;
}

static void job_unref_locked(job *j) {
    if (--j->refs > 0) return;
    for (size_t i = 0; i < j->nls; i++) free(j->ls[i].url);
    free(j->ls);
    free(j->buf);
    free(j->url);
    free(j->sums);
    free(j);
}

/* Stop the fetch threads: joined, except those still inside a request of a
 * job whose waiter was interrupted (pool_thread), which are detached. */
static void stop_pool(tf_remote *r) {
    pthread_mutex_lock(&r->mu);
    r->stop = 1;
    pthread_cond_broadcast(&r->work_cv);
    pthread_cond_broadcast(&r->stop_cv);
    for (int i = 0; i < r->nstarted; i++) {
        pool_thread *pt = &r->threads[i];
        if (pt->cur && pt->cur->cancel) {
            pt->detached = 1;
            r->ndetached++;
            pthread_detach(pt->th);
        }
    }
    pthread_mutex_unlock(&r->mu);
    for (int i = 0; i < r->nstarted; i++)
        if (!r->threads[i].detached) pthread_join(r->threads[i].th, NULL);
    pthread_mutex_lock(&r->mu);
    for (size_t i = 0; i < r->nheap; i++) {
        job *j = r->heap[i];
        j->state = JS_DONE;
        j->rc = -ECANCELED;
        job_unref_locked(j);
    }
    r->nheap = 0;
    memset(r->hash, 0, sizeof r->hash);
    pthread_cond_broadcast(&r->done_cv);
    pthread_mutex_unlock(&r->mu);
}

static void check_fork(tf_remote *r);

static void remote_destroy(tf_remote *r);

void tf_remote_free(tf_remote *r) {
    if (!r) return;
    if (atomic_fetch_sub(&r->refs, 1) != 1) return;
    check_fork(r);
    stop_pool(r);
    pthread_mutex_lock(&r->mu);
    int later = r->ndetached > 0;
    r->handed_over = later;
    pthread_mutex_unlock(&r->mu);
    if (!later) remote_destroy(r);
}

/* Everything of r once no fetch thread runs any more. */
static void remote_destroy(tf_remote *r) {
    free(r->threads);
    free(r->heap);
    for (size_t b = 0; b < TF__HASH; b++) {
        ochunk *o = r->open[b];
        while (o) {
            ochunk *n = o->next;
            tf__cache_unmap(o->map, o->map_len);
            free(o);
            o = n;
        }
    }
    tf__cache_close(r->cache);
    pthread_mutex_destroy(&r->mu);
    pthread_mutex_destroy(&r->omu);
    pthread_cond_destroy(&r->work_cv);
    pthread_cond_destroy(&r->done_cv);
    pthread_cond_destroy(&r->stop_cv);
    if (r->t.release) r->t.release(r->t.ctx);
    free(r->cache_dir);
    free(r);
}

/* In a fork()ed child: start over with fresh locks, no jobs, a new slot. */
static void check_fork(tf_remote *r) {
    if (TF_LIKELY(r->pid == getpid())) return;
    init_locks(r);
    r->threads = NULL; /* the parent's threads do not exist here */
    r->nstarted = 0;
    r->ndetached = 0;
    r->stop = 0;
    r->heap = NULL;    /* leaked: the parent's jobs may be mid-update */
    r->nheap = r->capheap = 0;
    memset(r->hash, 0, sizeof r->hash);
    for (size_t b = 0; b < TF__HASH; b++)
        for (ochunk *o = r->open[b]; o; o = o->next) o->refs = 0; /* mappings are inherited */
    tf__cache_after_fork(r->cache);
    r->pid = getpid();
}

/* ------------------------------------------------------------------------ */
/* transport calls with retries                                              */
/* ------------------------------------------------------------------------ */

static int transient(int rc) {
    switch (-rc) {
    case EAGAIN: case ETIMEDOUT: case ECONNRESET: case ECONNREFUSED: case ECONNABORTED: case EPIPE:
    case EPROTO: case EIO: case ENETUNREACH: case EHOSTUNREACH: case ENETDOWN: case EINTR:
        return 1;
    default: return 0;
    }
}

static const char *advice(int rc) {
    switch (-rc) {
    case ENOENT: return "The object does not exist (any more): check the URL, or reopen the dataset if it was rewritten.";
    case EACCES: case EPERM: return "The store refused the request: check the credentials (environment, profile files, instance role) and the bucket policy.";
    case ESTALE: return "The object changed since the dataset was opened: reopen the dataset to read the new data (its fingerprint will change), or restore the object.";
    default:
        if (transient(rc)) return "The store kept failing: check the network and the endpoint, or raise the retry limits (open()'s max_attempts, deadline, request_timeout; max_attempts, deadline_ms in tf_remote_config).";
        return "Check the URL, the endpoint and the credentials.";
    }
}

static uint64_t rand_u64(void) {
    static _Thread_local uint64_t s;
    if (!s) s = tf__mix64(tf__now_ns() ^ (uint64_t)(uintptr_t)&s);
    s += 0x9E3779B97F4A7C15ULL;
    return tf__mix64(s);
}

/* Why a wait ended early (pool_sleep), and the code and words for it. */
enum { WAKE_NONE = 0, WAKE_STOP = 1, WAKE_CANCEL = 2, WAKE_INTR = 3 };
static int wake_code(int why) { return why == WAKE_INTR ? -EINTR : -ECANCELED; }
static const char *wake_words(int why) {
    return why == WAKE_STOP ? "cancelled: the remote store is being closed"
           : why == WAKE_CANCEL ? "cancelled: its reader was interrupted"
                                : "interrupted";
}

/* Sleep up to ns, waking early when the pool stops, when the pool thread's
 * job is cancelled, or (a caller's thread) when interrupted. Returns a
 * WAKE_* value. */
static int pool_sleep(tf_remote *r, uint64_t ns) {
    job *cj = current_job();
    uint64_t until = tf__now_ns() + ns;
    int why = WAKE_NONE;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        why = r->stop ? WAKE_STOP : cj && cj->cancel ? WAKE_CANCEL : WAKE_NONE;
        uint64_t now = tf__now_ns();
        if (why || now >= until) break;
        uint64_t slice = cj || until - now < TF__INTERRUPT_SLICE_NS ? until : now + TF__INTERRUPT_SLICE_NS;
        struct timespec ts = tf__abstime(slice);
        pthread_cond_timedwait(&r->stop_cv, &r->mu, &ts);
        if (!cj && tf__now_ns() < until) {
            pthread_mutex_unlock(&r->mu);
            int intr = tf__interrupted();
            pthread_mutex_lock(&r->mu);
            if (intr) {
                why = WAKE_INTR;
                break;
            }
        }
    }
    pthread_mutex_unlock(&r->mu);
    return why;
}

/* Full jitter: uniform in [0, min(max, base * 2^(attempt-1))]. */
static uint64_t backoff_ns(const tf_remote *r, int attempt) {
    uint64_t cap = (uint64_t)r->cfg.backoff_max_ms * 1000000ull, d = (uint64_t)r->cfg.backoff_ms * 1000000ull;
    for (int i = 1; i < attempt && d < cap; i++) d *= 2;
    if (d > cap) d = cap;
    return d ? rand_u64() % (d + 1) : 0;
}

/* A pool thread's job starts attempt n at url: recorded for its waiters'
 * progress lines. */
static void note_attempt(tf_remote *r, const char *url, int n) {
    job *cj = current_job();
    if (!cj) return;
    pthread_mutex_lock(&r->mu);
    if (cj->attempt != n || strncmp(cj->cur, url, sizeof cj->cur - 1)) snprintf(cj->cur, sizeof cj->cur, "%s", url);
    cj->attempt = n;
    pthread_mutex_unlock(&r->mu);
}

/* Whether to try again after a failed attempt: a transient failure, attempts
 * left, and time for one more as slow as the slowest failed one (a server
 * that accepts and never answers costs a whole request timeout per attempt)
 * before the deadline. */
static int retry_allowed(const tf_remote *r, int rc, int attempt, uint64_t t0, uint64_t slowest) {
    uint64_t el = tf__now_ns() - t0, dl = (uint64_t)r->cfg.deadline_ms * 1000000ull;
    return transient(rc) && attempt < r->cfg.max_attempts && el + slowest <= dl;
}

/* Read [off, off + len) of url into buf, retrying transient failures. */
static int fetch_range(tf_remote *r, const char *url, const tf_object_info *info, uint64_t off, uint64_t len,
                       void *buf) {
    uint64_t done = 0, t0 = tf__now_ns(), slowest = 0;
    int attempt = 0, rc = 0;
    char last[512] = "";
    tf_object_info unpinned;
    if (tf__version_from_catalog(info->version)) { /* not the store's: nothing to send */
        memset(&unpinned, 0, sizeof unpinned);
        unpinned.size = info->size;
        info = &unpinned;
    }
    while (done < len) {
        uint64_t ta = tf__now_ns();
        note_attempt(r, url, attempt + 1);
        atomic_fetch_add_explicit(&r->st_requests, 1, memory_order_relaxed);
        if (attempt) atomic_fetch_add_explicit(&r->st_retries, 1, memory_order_relaxed);
        char *tm = tmsg();
        tm[0] = '\0';
        size_t want = (size_t)(len - done);
        int64_t n = r->t.read(r->t.ctx, url, info, off + done, (uint8_t *)buf + done, want);
        if (n > 0 && (uint64_t)n <= want) {
            atomic_fetch_add_explicit(&r->st_bytes, (uint64_t)n, memory_order_relaxed);
            done += (uint64_t)n;
            continue;
        }
        if (n > 0) {
            rc = -EPROTO;
            snprintf(last, sizeof last, "the transport returned %lld bytes for a %zu-byte request", (long long)n, want);
        } else {
            rc = n == 0 ? -EPROTO : (int)n;
            snprintf(last, sizeof last, "%s", tm[0] ? tm : n == 0 ? "empty response" : tf_strerror(rc));
        }
        attempt++;
        if (tf__now_ns() - ta > slowest) slowest = tf__now_ns() - ta;
        if (!retry_allowed(r, rc, attempt, t0, slowest)) break;
        int why = pool_sleep(r, backoff_ns(r, attempt));
        if (why) {
            rc = wake_code(why);
            snprintf(last, sizeof last, "%s", wake_words(why));
            break;
        }
    }
    if (done >= len) return 0;
    double secs = (double)(tf__now_ns() - t0) / 1e9;
    /* still throttled after every retry: an I/O error for the caller (EAGAIN
     * would read as "try again now", which the retries just did) */
    if (rc == -EAGAIN) rc = -EIO;
    TF_FAIL(rc, "%s: bytes [%llu, %llu): %s (after %d attempt%s in %.1f s). %s", url, (ull)(off + done),
            (ull)(off + len), last, attempt, attempt == 1 ? "" : "s", secs, advice(rc));
}

/* One metadata request (stat or list) with the retries of fetch_range: call
 * runs one attempt. Returns 0, or the last failure with *attempts made (the
 * transport's message, if any, in tmsg()). */
typedef int (*meta_call_fn)(tf_remote *r, const char *url, void *ctx);
static int retry_meta(tf_remote *r, const char *url, meta_call_fn call, void *ctx, int *attempts) {
    uint64_t t0 = tf__now_ns(), slowest = 0;
    int attempt = 0, rc;
    char *tm = tmsg();
    for (;;) {
        uint64_t ta = tf__now_ns();
        note_attempt(r, url, attempt + 1);
        tm[0] = '\0';
        atomic_fetch_add_explicit(&r->st_requests, 1, memory_order_relaxed);
        rc = call(r, url, ctx);
        if (rc >= 0) return 0;
        attempt++;
        if (tf__now_ns() - ta > slowest) slowest = tf__now_ns() - ta;
        if (!retry_allowed(r, rc, attempt, t0, slowest)) break;
        atomic_fetch_add_explicit(&r->st_retries, 1, memory_order_relaxed);
        int why = pool_sleep(r, backoff_ns(r, attempt));
        if (why) {
            rc = wake_code(why);
            tf_transport_set_error("%s", wake_words(why));
            break;
        }
    }
    *attempts = attempt;
    return rc;
}

static int stat_call(tf_remote *r, const char *url, void *info) {
    memset(info, 0, sizeof(tf_object_info));
    return r->t.stat(r->t.ctx, url, info);
}

int tf_remote_stat(tf_remote *r, const char *url, tf_object_info *info) {
    TF_NEED_ARG(r);
    TF_NEED_ARG(url);
    TF_NEED_ARG(info);
    int attempt = 0, rc = retry_meta(r, url, stat_call, info, &attempt);
    char *tm = tmsg();
    if (!rc) {
        info->version[TF_OBJECT_VERSION_MAX - 1] = '\0';
        return 0;
    }
    if (rc == -ENOENT) TF_FAIL(rc, "%s: no such object%s%s", url, tm[0] ? ": " : "", tm);
    TF_FAIL(rc, "%s: cannot get the object's size: %s (after %d attempt%s). %s", url, tm[0] ? tm : tf_strerror(rc),
            attempt, attempt == 1 ? "" : "s", advice(rc));
}

typedef struct list_args {
    tf_list_emit_fn emit;
    void *emit_ctx;
} list_args;

static int list_call(tf_remote *r, const char *prefix, void *ctx) {
    list_args *a = ctx;
    return r->t.list(r->t.ctx, prefix, a->emit, a->emit_ctx);
}

/* The listing of prefix on this thread, with retries (a J_LIST job). */
static int list_here(tf_remote *r, const char *prefix, tf_list_emit_fn emit, void *emit_ctx) {
    list_args a = {emit, emit_ctx};
    int attempt = 0, rc = retry_meta(r, prefix, list_call, &a, &attempt);
    if (!rc) return 0;
    char *tm = tmsg();
    TF_FAIL(rc, "%s: cannot list the objects: %s (after %d attempt%s). %s", prefix, tm[0] ? tm : tf_strerror(rc),
            attempt, attempt == 1 ? "" : "s", advice(rc));
}

/* ------------------------------------------------------------------------ */
/* objects                                                                   */
/* ------------------------------------------------------------------------ */

static void compute_oid(tf__robj *o) {
    tf__xxh64_state h;
    uint8_t rec[32];
    tf__put_le64(rec, o->info.size);
    tf__put_le64(rec + 8, o->data_off);
    tf__put_le64(rec + 16, o->data_len);
    tf__put_le64(rec + 24, o->chunk_bytes);
    for (int i = 0; i < 2; i++) {
        tf__xxh64_reset(&h, i ? 0x72656d6f7465ull : 0x63616368656b6579ull);
        tf__xxh64_update(&h, o->url, strlen(o->url) + 1);
        tf__xxh64_update(&h, o->info.version, strlen(o->info.version) + 1);
        tf__xxh64_update(&h, rec, sizeof rec);
        if (i) o->oid_hi = tf__xxh64_digest(&h);
        else o->oid_lo = tf__xxh64_digest(&h);
    }
}

static int set_chunking(tf__robj *o, uint64_t data_off, uint64_t data_len, uint64_t chunk_bytes) {
    uint64_t end;
    if (tf__add_overflow(data_off, data_len, &end) || end > o->info.size)
        TF_FAIL(-ERANGE, "%s: data region [%llu, +%llu) past the object's %llu bytes", o->url, (ull)data_off,
                (ull)data_len, (ull)o->info.size);
    uint64_t n = data_len / chunk_bytes + (data_len % chunk_bytes != 0);
    if (n >= UINT32_MAX)
        TF_FAIL(-EINVAL, "%s: %llu chunks of %llu bytes: too many; raise chunk_size", o->url, (ull)n, (ull)chunk_bytes);
    o->data_off = data_off;
    o->data_len = data_len;
    o->chunk_bytes = chunk_bytes;
    o->nchunks = (uint32_t)n;
    compute_oid(o);
    return 0;
}

int tf__robj_from_info(tf_remote *r, const char *url, const tf_object_info *info, tf__robj **out) {
    *out = NULL;
    tf__robj *o = calloc(1, sizeof *o);
    if (!o) return -ENOMEM;
    o->url = strdup(url);
    if (!o->url) {
        free(o);
        return -ENOMEM;
    }
    o->info = *info;
    o->info.version[TF_OBJECT_VERSION_MAX - 1] = '\0';
    int rc = set_chunking(o, 0, info->size, r->cfg.chunk_bytes);
    if (rc) {
        free(o->url);
        free(o);
        return rc;
    }
    o->r = tf__remote_ref(r);
    *out = o;
    return 0;
}

int tf__robj_open(tf_remote *r, const char *url, tf__robj **out) {
    tf_object_info info;
    TF_TRY(tf_remote_stat(r, url, &info));
    return tf__robj_from_info(r, url, &info, out);
}

void tf__robj_free(tf__robj *o) {
    if (!o) return;
    tf_remote *r = o->r;
    free(o->url);
    free(o->sums);
    free(o);
    tf_remote_free(r);
}

int tf__robj_set_region(tf__robj *o, uint64_t data_off, uint64_t data_len, const uint64_t *sums, uint64_t nsums,
                        uint64_t granule) {
    uint64_t cb = o->r->cfg.chunk_bytes;
    if (sums) {
        if (!granule || nsums != data_len / granule + (data_len % granule != 0))
            TF_FAIL(-TF_EFORMAT, "%s: chunk checksums: expected %llu entries of %llu bytes, found %llu", o->url,
                    (ull)(granule ? data_len / granule + (data_len % granule != 0) : 0), (ull)granule, (ull)nsums);
        cb = (cb + granule - 1) / granule * granule;
        uint64_t *s = nsums ? malloc(nsums * sizeof *s) : NULL;
        if (nsums && !s) return -ENOMEM;
        if (nsums) memcpy(s, sums, nsums * sizeof *s);
        free(o->sums);
        o->sums = s;
        o->nsums = nsums;
        o->granule = granule;
    }
    return set_chunking(o, data_off, data_len, cb);
}

static uint64_t chunk_len(const tf__robj *o, uint32_t k) {
    uint64_t s = (uint64_t)k * o->chunk_bytes;
    return o->data_len - s < o->chunk_bytes ? o->data_len - s : o->chunk_bytes;
}

/* ------------------------------------------------------------------------ */
/* the fetch pool                                                            */
/* ------------------------------------------------------------------------ */

static int job_before(const job *a, const job *b) {
    if (a->urgent != b->urgent) return a->urgent > b->urgent;
    if (a->next_use != b->next_use) return a->next_use < b->next_use;
    return a->seq < b->seq;
}

static void heap_swap(job **h, size_t a, size_t b) {
    job *t = h[a];
    h[a] = h[b];
    h[b] = t;
    h[a]->heap_i = a;
    h[b]->heap_i = b;
}
static void heap_up(job **h, size_t i) {
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!job_before(h[i], h[p])) break;
        heap_swap(h, i, p);
        i = p;
    }
}
static void heap_down(job **h, size_t n, size_t i) {
    for (;;) {
        size_t l = 2 * i + 1, rr = l + 1, m = i;
        if (l < n && job_before(h[l], h[m])) m = l;
        if (rr < n && job_before(h[rr], h[m])) m = rr;
        if (m == i) break;
        heap_swap(h, i, m);
        i = m;
    }
}

static int heap_push(tf_remote *r, job *j) {
    if (r->nheap == r->capheap) {
        size_t nc = r->capheap ? r->capheap * 2 : 64;
        job **nh = realloc(r->heap, nc * sizeof *nh);
        if (!nh) return -ENOMEM;
        r->heap = nh;
        r->capheap = nc;
    }
    j->heap_i = r->nheap;
    r->heap[r->nheap++] = j;
    heap_up(r->heap, j->heap_i);
    return 0;
}

static job *heap_pop(tf_remote *r) {
    job *j = r->heap[0];
    r->nheap--;
    if (r->nheap) {
        r->heap[0] = r->heap[r->nheap];
        r->heap[0]->heap_i = 0;
        heap_down(r->heap, r->nheap, 0);
    }
    return j;
}

/* Take a queued job out of the heap. mu held. */
static void heap_remove(tf_remote *r, job *j) {
    size_t i = j->heap_i;
    r->nheap--;
    if (i == r->nheap) return;
    job *m = r->heap[r->nheap];
    r->heap[i] = m;
    m->heap_i = i;
    heap_down(r->heap, r->nheap, i);
    heap_up(r->heap, m->heap_i);
}

static void hash_remove(tf_remote *r, job *j) {
    job **p = &r->hash[hslot(&j->key)];
    while (*p && *p != j) p = &(*p)->hnext;
    if (*p) *p = j->hnext;
    j->hnext = NULL;
}

static job *hash_find(tf_remote *r, const tf__ckey *k) {
    for (job *j = r->hash[hslot(k)]; j; j = j->hnext)
        if (keq(&j->key, k)) return j;
    return NULL;
}

static void trim_open(tf_remote *r);
static ochunk *open_find(tf_remote *r, const tf__ckey *k);

/* A chunk just landed, mapped by its fetcher: put it in the open table so
 * that its reader finds it there even if the cache evicts it meanwhile. */
static void offer_open(tf_remote *r, const tf__ckey *key, void *map, size_t ml, size_t len) {
    ochunk *n = calloc(1, sizeof *n);
    pthread_mutex_lock(&r->omu);
    if (!n || open_find(r, key)) {
        pthread_mutex_unlock(&r->omu);
        free(n);
        tf__cache_unmap(map, ml);
        return;
    }
    n->key = *key;
    n->owner = r;
    n->map = map;
    n->map_len = ml;
    n->len = len;
    n->valid_at = tf__cache_evictions(r->cache);
    n->last = ++r->clock;
    size_t h = hslot(key);
    n->next = r->open[h];
    r->open[h] = n;
    r->nopen++;
    r->nidle++;
    trim_open(r);
    pthread_mutex_unlock(&r->omu);
}

/* Fetch, check and land one chunk (a pool thread, no lock held). */
static int run_chunk(tf_remote *r, job *j) {
    int refetched = 0;
    uint64_t t0 = tf__now_ns(), poll = 1000000;
again:
    for (;;) {
        uint64_t ec = 0, eb = 0;
        /* an open's range never evicts a chunk a reader needs: without room
         * it is read directly (tf__remote_read_many_shared) */
        int urgent = j->urgent && !j->open_range;
        int b = tf__cache_begin(r->cache, &j->key, j->len, j->open_range ? TF__NO_NEED : j->next_use, urgent, &ec,
                                &eb);
        if (ec) {
            atomic_fetch_add_explicit(&r->st_evict, ec, memory_order_relaxed);
            atomic_fetch_add_explicit(&r->st_evict_bytes, eb, memory_order_relaxed);
        }
        if (b < 0) return b;
        if (b == TF__BEGIN_PRESENT) return 0;
        if (b == TF__BEGIN_FETCH) break;
        if (b == TF__BEGIN_NOSPACE && !urgent) return TF__JOB_NOSPACE;
        /* another process fetches it, or (urgent) every byte is being fetched:
         * look again shortly */
        /* the other process has the same retry budget: no longer than it */
        if (tf__now_ns() - t0 > (uint64_t)r->cfg.deadline_ms * 1000000ull)
            TF_FAIL(-ETIMEDOUT, "%s: bytes [%llu, +%llu): waited %.1f s (the deadline) for another process to fetch this chunk into %s, in vain. Check the other processes using this cache_dir, and the network.",
                    j->url, (ull)j->off, (ull)j->len, r->cfg.deadline_ms / 1000.0, r->cache_dir);
        int why = pool_sleep(r, poll);
        if (why) TF_FAIL(wake_code(why), "%s: bytes [%llu, +%llu): %s", j->url, (ull)j->off, (ull)j->len, wake_words(why));
        if (poll < 50000000) poll *= 2;
    }
    uint8_t *buf = malloc(j->len ? (size_t)j->len : 1);
    if (!buf) {
        tf__cache_abort(r->cache, &j->key);
        return -ENOMEM;
    }
    int rc = fetch_range(r, j->url, &j->info, j->off, j->len, buf);
    if (!rc && j->sums) {
        for (size_t g = 0; g < j->nsums; g++) {
            uint64_t o = g * j->granule, n = j->len - o < j->granule ? j->len - o : j->granule;
            uint64_t got = tf_hash64(buf + o, (size_t)n, 0);
            if (got != j->sums[g]) {
                rc = tf__seterr(-TF_ECHECKSUM, "%s: bytes [%llu, %llu): chunk checksum: expected %016llx, found %016llx, %s. %s",
                                j->url, (ull)(j->off + o), (ull)(j->off + o + n), (ull)j->sums[g], (ull)got,
                                refetched ? "again after fetching it a second time" : "on the first fetch",
                                tf__version_from_catalog(j->info.version)
                                    ? "The object differs from the shard its dataset's catalog (" TF_DATASET_CATALOG_NAME ") describes: it was replaced or corrupted in the store, or in transit. Restore it, or write the catalog again (tokenfeed index DATASET_DIR on the dataset's source directory, then upload its " TF_DATASET_CATALOG_NAME ")."
                                    : "The object differs from the shard opened, or the transfer was corrupted: if the data was rewritten, reopen the dataset; otherwise check the store.");
                break;
            }
        }
    }
    if (!rc) {
        void *map = NULL;
        size_t ml = 0;
        /* (an open's range: needed by no reader, the first to go) */
        rc = tf__cache_commit(r->cache, &j->key, j->url, &j->info, buf, (size_t)j->len,
                              j->open_range ? TF__NO_NEED : j->next_use, &map, &ml);
        free(buf);
        if (!rc) {
            atomic_fetch_add_explicit(&r->st_chunks, 1, memory_order_relaxed);
            if (map) offer_open(r, &j->key, map, ml, (size_t)j->len);
        }
        return rc;
    }
    free(buf);
    tf__cache_abort(r->cache, &j->key);
    if ((rc == -TF_ECHECKSUM || rc == -ESTALE) && !refetched) {
        refetched = 1;
        atomic_fetch_add_explicit(&r->st_refetch, 1, memory_order_relaxed);
        goto again;
    }
    return rc;
}

/* A range of an open (a pool thread, no lock held): into the job's own buffer,
 * which its waiter copies out. */
static int run_range(tf_remote *r, job *j) {
    j->buf = malloc(j->len ? (size_t)j->len : 1);
    if (!j->buf) return -ENOMEM;
    return fetch_range(r, j->url, &j->info, j->off, j->len, j->buf);
}

/* tf_list_emit_fn of a listing job: the object is kept in the job. */
static int keep_listed(void *ctx, const char *url, const tf_object_info *info) {
    job *j = ctx;
    listed_obj *n = tf__grow(j->ls, &j->capls, j->nls, sizeof *n, 256);
    if (n) j->ls = n;
    if (!n || !(n[j->nls].url = strdup(url))) {
        j->ls_nomem = 1; /* a listing cut short would read as objects that do not exist */
        return -ENOMEM;
    }
    n[j->nls++].info = *info;
    return 0;
}

/* The listing of a prefix (a pool thread, no lock held), kept in the job. */
static int run_list(tf_remote *r, job *j) {
    int rc = list_here(r, j->url, keep_listed, j);
    return rc ? rc : j->ls_nomem ? -ENOMEM : 0;
}

static void *pool_main(void *arg) {
    pool_thread *pt = arg;
    tf_remote *r = pt->r;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (!r->stop && r->nheap == 0) pthread_cond_wait(&r->work_cv, &r->mu);
        if (r->stop) break;
        job *j = heap_pop(r);
        j->state = JS_RUNNING;
        pt->cur = j;
        pthread_mutex_unlock(&r->mu);
        tf__clearerr();
        set_current_job(j);
        int rc = j->kind == J_RANGE  ? run_range(r, j)
                 : j->kind == J_STAT ? tf_remote_stat(r, j->url, &j->info)
                 : j->kind == J_LIST ? run_list(r, j)
                                     : run_chunk(r, j);
        set_current_job(NULL);
        pthread_mutex_lock(&r->mu);
        j->rc = rc;
        if (rc < 0) snprintf(j->err, sizeof j->err, "%s", tf_last_error()[0] ? tf_last_error() : tf_strerror(rc));
        j->state = JS_DONE;
        if (j->kind == J_CHUNK) hash_remove(r, j);
        pt->cur = NULL;
        pthread_cond_broadcast(&r->done_cv);
        job_unref_locked(j);
    }
    int last = pt->detached && --r->ndetached == 0 && r->handed_over;
    pthread_mutex_unlock(&r->mu);
    if (last) remote_destroy(r);
    return NULL;
}

/* mu held. Start the pool's threads if they are not running. */
static int ensure_pool(tf_remote *r) {
    if (r->nstarted) return 0;
    int n = r->cfg.fetch_threads;
    r->threads = calloc((size_t)n, sizeof *r->threads);
    if (!r->threads) return -ENOMEM;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    for (int i = 0; i < n; i++) {
        pool_thread *pt = &r->threads[r->nstarted];
        pt->r = r;
        if (pthread_create(&pt->th, NULL, pool_main, pt) != 0) break;
        r->nstarted++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (!r->nstarted) {
        free(r->threads);
        r->threads = NULL;
        TF_FAIL(-EAGAIN, "cannot start the remote fetch threads");
    }
    return 0;
}

static job *new_chunk_job(const tf__robj *o, uint32_t k, uint64_t next_use, int urgent) {
    job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    j->kind = J_CHUNK;
    j->key = (tf__ckey){o->oid_lo, o->oid_hi, k};
    j->url = strdup(o->url);
    j->info = o->info;
    j->off = o->data_off + (uint64_t)k * o->chunk_bytes;
    j->len = chunk_len(o, k);
    j->next_use = next_use;
    j->urgent = urgent;
    if (o->sums) {
        uint64_t per = o->chunk_bytes / o->granule, first = (uint64_t)k * per;
        j->nsums = (size_t)((j->len + o->granule - 1) / o->granule);
        j->granule = o->granule;
        j->sums = malloc(j->nsums * sizeof *j->sums);
        if (j->sums) memcpy(j->sums, o->sums + first, j->nsums * sizeof *j->sums);
    }
    if (!j->url || (o->sums && !j->sums)) {
        free(j->url);
        free(j->sums);
        free(j);
        return NULL;
    }
    return j;
}

/* Queue chunk k of o (or raise the priority of its job). mu held. With
 * hold, the caller gets a reference to wait on. */
static int submit_locked(tf_remote *r, const tf__robj *o, uint32_t k, uint64_t next_use, int urgent, job **held) {
    tf__ckey key = {o->oid_lo, o->oid_hi, k};
    job *j = hash_find(r, &key);
    if (j) {
        if (j->state == JS_QUEUED && (urgent > j->urgent || next_use < j->next_use)) {
            if (urgent > j->urgent) j->urgent = urgent;
            if (next_use < j->next_use) j->next_use = next_use;
            heap_up(r->heap, j->heap_i);
        }
    } else {
        TF_TRY(ensure_pool(r));
        j = new_chunk_job(o, k, next_use, urgent);
        if (!j) return -ENOMEM;
        j->seq = r->seq++;
        j->refs = 1;
        if (heap_push(r, j) != 0) {
            job_unref_locked(j);
            return -ENOMEM;
        }
        size_t h = hslot(&key);
        j->hnext = r->hash[h];
        r->hash[h] = j;
        pthread_cond_signal(&r->work_cv);
    }
    if (held) {
        j->refs++;
        *held = j;
    }
    return 0;
}

void tf__chunk_want(const tf__robj *o, uint32_t k, uint64_t next_use) {
    tf_remote *r = o->r;
    if (k >= o->nchunks) return;
    check_fork(r);
    pthread_mutex_lock(&r->mu);
    if (!r->stop) submit_locked(r, o, k, next_use, 0, NULL);
    pthread_mutex_unlock(&r->mu);
}

/* Wait (mu held) until j is done. A caller's thread (not a pool thread) wakes
 * every TF__INTERRUPT_SLICE_NS to ask whether it is interrupted: -EINTR then,
 * with j possibly still running; a pool thread waiting on behalf of a job
 * gives up when that job is cancelled. 0 when done. */
static int wait_job_locked(tf_remote *r, job *j) {
    job *cj = current_job();
    uint64_t t0 = tf__now_ns(), notice = t0 + TF__NOTICE_NS;
    while (j->state != JS_DONE) {
        if (cj) {
            if (cj->cancel) return -ECANCELED;
            struct timespec ts = tf__deadline_after(TF__INTERRUPT_SLICE_NS);
            pthread_cond_timedwait(&r->done_cv, &r->mu, &ts);
            continue;
        }
        struct timespec ts = tf__deadline_after(TF__INTERRUPT_SLICE_NS);
        pthread_cond_timedwait(&r->done_cv, &r->mu, &ts);
        if (j->state == JS_DONE) break;
        char line[400] = "";
        uint64_t now = tf__now_ns();
        if (now >= notice && j->state == JS_RUNNING && j->cur[0]) {
            snprintf(line, sizeof line, "waiting for %s (%.0f s, attempt %d of %d)", j->cur, (double)(now - t0) / 1e9,
                     j->attempt, r->cfg.max_attempts);
            notice += TF__NOTICE_NS;
        }
        pthread_mutex_unlock(&r->mu);
        if (line[0]) tf__notice("%s", line);
        int intr = tf__interrupted();
        pthread_mutex_lock(&r->mu);
        if (intr) return -EINTR;
    }
    return 0;
}

/* The caller of a batch of an open's jobs was interrupted (mu held): queued
 * ones are dropped, running ones cancelled (they stop before their next
 * attempt). Nothing is waited for: a job writes only into memory of its own,
 * freed by whichever of the pool and the caller drops the last reference. */
static void abandon_jobs_locked(tf_remote *r, job **js, size_t n) {
    for (size_t i = 0; i < n; i++) {
        job *j = js[i];
        if (!j || j->state == JS_DONE) continue;
        j->cancel = 1;
        if (j->state == JS_QUEUED) {
            heap_remove(r, j);
            j->state = JS_DONE;
            j->rc = -EINTR;
            job_unref_locked(j); /* the pool's reference */
        }
    }
    pthread_cond_broadcast(&r->stop_cv); /* wake the running ones from their backoff */
}

/* A new job of an open (J_RANGE, J_STAT, J_LIST) for url, or NULL. */
static job *new_open_job(int kind, const char *url) {
    job *j = calloc(1, sizeof *j);
    if (j && !(j->url = strdup(url))) {
        free(j);
        return NULL;
    }
    if (j) j->kind = kind;
    return j;
}

/* Set on a thread whose open requests serve a read ahead (tf__remote_open_ahead). */
static _Thread_local int open_ahead;

void tf__remote_open_ahead(int on) { open_ahead = on; }

/* Queue j ahead of every chunk, referenced by the pool and by the caller
 * (a request made for a read ahead: after the chunks readers wait for, before
 * those fetched ahead). mu held. On failure j is freed. */
static int submit_open_job_locked(tf_remote *r, job *j) {
    int rc = ensure_pool(r);
    j->urgent = open_ahead ? 0 : 2;
    j->seq = r->seq++;
    j->refs = 2;
    if (!rc && heap_push(r, j) != 0) rc = -ENOMEM;
    if (rc) {
        free(j->url);
        free(j);
    }
    return rc;
}

/* Submit n jobs made by make(ctx, i) (NULL: no memory), and wait for them in
 * index order; after each, collect(ctx, i, job) runs with mu released (the job
 * is done and only the caller holds it). Every job is waited for even after
 * one failed; returns the first failure in index order that keep() does not
 * accept as an answer, with its message; -EINTR when interrupted (the rest
 * abandoned, abandon_jobs_locked). */
typedef job *(*open_make_fn)(void *ctx, size_t i);
typedef void (*open_collect_fn)(void *ctx, size_t i, job *j);
static int run_open_jobs(tf_remote *r, size_t n, open_make_fn make, open_collect_fn collect, void *ctx,
                         int answer_rc) {
    if (!n) return 0;
    check_fork(r);
    job **js = calloc(n, sizeof *js);
    if (!js) return -ENOMEM;
    int rc = 0, intr = 0;
    pthread_mutex_lock(&r->mu);
    for (size_t i = 0; i < n && !rc; i++) {
        job *j = make(ctx, i);
        rc = j ? submit_open_job_locked(r, j) : -ENOMEM;
        if (!rc) js[i] = j;
    }
    pthread_cond_broadcast(&r->work_cv);
    for (size_t i = 0; i < n && !intr; i++) {
        job *j = js[i];
        if (!j) continue;
        if (wait_job_locked(r, j) < 0) {
            intr = 1;
            break;
        }
        if (j->rc < 0 && j->rc != answer_rc && !rc) {
            rc = j->rc;
            tf__seterr(j->rc, "%s", j->err);
        }
        pthread_mutex_unlock(&r->mu);
        collect(ctx, i, j);
        pthread_mutex_lock(&r->mu);
    }
    if (intr) abandon_jobs_locked(r, js, n);
    for (size_t i = 0; i < n; i++)
        if (js[i]) job_unref_locked(js[i]);
    pthread_mutex_unlock(&r->mu);
    free(js);
    if (intr) TF_FAIL(-EINTR, "interrupted while waiting for %zu remote request%s", n, n == 1 ? "" : "s");
    return rc;
}

/* Fetch chunk k now (urgent) and wait for it. 0, TF__JOB_NOSPACE or < 0. */
/* A read of o failed with rc: when the object changed or is gone since its
 * metadata was recorded for the node, the record goes too, so that the next
 * open fetches the metadata afresh (remote_meta.c). Returns rc. */
static int note_failure(const tf__robj *o, int rc) {
    if (o->meta_on && (rc == -ESTALE || rc == -ENOENT || rc == -TF_ECHECKSUM)) {
        tf__cache_meta_forget(o->r->cache, o->meta_key);
        tf__cache_listings_forget(o->r->cache); /* a listing of the old object must not bring it back */
    }
    return rc;
}

static int fetch_and_wait(tf_remote *r, const tf__robj *o, uint32_t k) {
    pthread_mutex_lock(&r->mu);
    job *j = NULL;
    uint64_t pos = reader_position();
    int rc = r->stop ? -ECANCELED : submit_locked(r, o, k, pos == TF__NO_NEED ? 0 : pos, 1, &j);
    if (rc) {
        pthread_mutex_unlock(&r->mu);
        return rc;
    }
    /* interrupted: the job goes on (it writes only into the cache, and others
     * may wait for it too) */
    if (wait_job_locked(r, j) < 0) {
        job_unref_locked(j);
        pthread_mutex_unlock(&r->mu);
        TF_FAIL(-EINTR, "%s: interrupted while waiting for bytes [%llu, +%llu) to be fetched", o->url,
                (ull)(o->data_off + (uint64_t)k * o->chunk_bytes), (ull)chunk_len(o, k));
    }
    rc = j->rc;
    if (rc < 0) tf__seterr(rc, "%s", j->err);
    job_unref_locked(j);
    pthread_mutex_unlock(&r->mu);
    return note_failure(o, rc);
}

typedef struct stat_many {
    const char *const *urls;
    tf_object_info *infos;
    int *rcs;
} stat_many;

static job *make_stat(void *ctx, size_t i) { return new_open_job(J_STAT, ((stat_many *)ctx)->urls[i]); }

static void collect_stat(void *ctx, size_t i, job *j) {
    stat_many *s = ctx;
    s->rcs[i] = j->rc;
    if (!j->rc) s->infos[i] = j->info;
}

int tf__remote_stat_many(tf_remote *r, const char *const *urls, size_t n, tf_object_info *infos, int *rcs) {
    stat_many s = {urls, infos, rcs};
    for (size_t i = 0; i < n; i++) rcs[i] = -EINTR;
    return run_open_jobs(r, n, make_stat, collect_stat, &s, -ENOENT);
}

static job *make_range(void *ctx, size_t i) {
    tf__rreq *q = &((tf__rreq *)ctx)[i];
    job *j = new_open_job(J_RANGE, q->o->url);
    if (j) {
        j->info = q->o->info;
        j->off = q->off;
        j->len = q->len;
    }
    return j;
}

static void collect_range(void *ctx, size_t i, job *j) {
    tf__rreq *q = &((tf__rreq *)ctx)[i];
    q->rc = j->rc;
    if (!j->rc && j->len) memcpy(q->buf, j->buf, (size_t)j->len);
    free(j->buf); /* early: the ranges of a round are not all held at once */
    j->buf = NULL;
}

int tf__remote_read_many(tf_remote *r, tf__rreq *reqs, size_t n) {
    for (size_t i = 0; i < n; i++) reqs[i].rc = -EINTR;
    int rc = run_open_jobs(r, n, make_range, collect_range, reqs, 0);
    if (rc == -EINTR) TF_FAIL(rc, "%s: interrupted while waiting for %zu remote request%s", reqs[0].o->url, n, n == 1 ? "" : "s");
    return rc;
}

/* Copy range object o's one chunk from the node's cache into buf: 0, or why
 * not (not cached, or found damaged and removed). */
static int copy_cached_range(tf_remote *r, const tf__robj *o, void *buf) {
    tf__ckey key = {o->oid_lo, o->oid_hi, 0};
    void *map = NULL;
    size_t ml = 0;
    int rc = tf__cache_map(r->cache, &key, (size_t)o->data_len, NULL, 0, 0, &map, &ml);
    if (rc) {
        /* (corrupt: removed, and fetched again as a corrupt chunk is) */
        if (rc == -TF_ECHECKSUM) atomic_fetch_add_explicit(&r->st_refetch, 1, memory_order_relaxed);
        tf__clearerr();
        return rc;
    }
    memcpy(buf, map, (size_t)o->data_len);
    tf__cache_unmap(map, ml);
    return 0;
}

int tf__remote_read_many_shared(tf_remote *r, tf__rreq *reqs, size_t n) {
    if (!n) return 0;
    check_fork(r);
    /* each range as an object of its own, cut as one chunk: its key names
     * the URL, the version (ETag) and the range */
    tf__robj *os = calloc(n, sizeof *os);
    job **js = calloc(n, sizeof *js);
    tf__rreq *direct = calloc(n, sizeof *direct);
    size_t *di = calloc(n, sizeof *di), nd = 0;
    int rc = os && js && direct && di ? 0 : -ENOMEM, intr = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        tf__rreq *q = &reqs[i];
        tf__robj *o = &os[i];
        q->rc = -EINTR;
        o->r = r;
        o->url = q->o->url; /* borrowed */
        o->info = q->o->info;
        o->meta_on = q->o->meta_on;
        o->meta_key = q->o->meta_key;
        if (!q->len) q->rc = 0;
        else if ((rc = set_chunking(o, q->off, q->len, q->len)) == 0 && copy_cached_range(r, o, q->buf) == 0) {
            q->rc = 0;
            atomic_fetch_add_explicit(&r->st_hits, 1, memory_order_relaxed);
        }
    }
    if (!rc) {
        pthread_mutex_lock(&r->mu);
        for (size_t i = 0; i < n && !rc; i++) {
            if (reqs[i].rc == 0) continue;
            rc = r->stop ? -ECANCELED : submit_locked(r, &os[i], 0, 0, open_ahead ? 0 : 2, &js[i]);
            if (!rc && js[i]->state == JS_QUEUED) js[i]->open_range = 1;
        }
        for (size_t i = 0; i < n && !rc; i++) {
            job *j = js[i];
            if (!j) continue;
            if (wait_job_locked(r, j) < 0) {
                intr = 1;
                break;
            }
            int jr = j->rc;
            if (jr < 0) {
                /* the object changed or is gone: a FormatError's cause,
                 * never other bytes */
                reqs[i].rc = jr;
                rc = tf__seterr(jr, "%s", j->err);
                break;
            }
            pthread_mutex_unlock(&r->mu);
            if (jr == 0 && copy_cached_range(r, &os[i], reqs[i].buf) == 0) reqs[i].rc = 0;
            else { /* no room in the cache, or gone from it since: read directly */
                direct[nd] = reqs[i];
                di[nd++] = i;
            }
            pthread_mutex_lock(&r->mu);
        }
        /* interrupted, or failed: the jobs left go on (they write only into
         * the cache, and other processes may wait for them) */
        for (size_t i = 0; i < n; i++)
            if (js[i]) job_unref_locked(js[i]);
        pthread_mutex_unlock(&r->mu);
    }
    for (size_t i = 0; i < n && rc < 0; i++)
        if (reqs[i].rc < 0 && reqs[i].rc != -EINTR) {
            note_failure(&os[i], reqs[i].rc);
            break;
        }
    if (!rc && !intr && nd) {
        rc = tf__remote_read_many(r, direct, nd);
        for (size_t k = 0; k < nd; k++) reqs[di[k]].rc = direct[k].rc;
    }
    free(os);
    free(js);
    free(direct);
    free(di);
    if (intr) TF_FAIL(-EINTR, "%s: interrupted while waiting for %zu remote request%s", reqs[0].o->url, n, n == 1 ? "" : "s");
    return rc;
}

typedef struct list_many {
    const char *prefix;
    tf_list_emit_fn emit;
    void *emit_ctx;
    int rc;
} list_many;

static job *make_list(void *ctx, size_t i) {
    (void)i;
    return new_open_job(J_LIST, ((list_many *)ctx)->prefix);
}

static void collect_list(void *ctx, size_t i, job *j) {
    (void)i;
    list_many *l = ctx;
    for (size_t k = 0; k < j->nls && !j->rc && !l->rc; k++) l->rc = l->emit(l->emit_ctx, j->ls[k].url, &j->ls[k].info);
}

int tf__remote_can_list(const tf_remote *r) { return r->t.list != NULL; }

int tf__remote_list(tf_remote *r, const char *prefix, tf_list_emit_fn emit, void *emit_ctx) {
    if (!r->t.list) return -TF_EUNSUPPORTED;
    list_many l = {prefix, emit, emit_ctx, 0};
    int rc = run_open_jobs(r, 1, make_list, collect_list, &l, 0);
    if (rc == -EINTR) TF_FAIL(rc, "%s: interrupted while listing the objects", prefix);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* reading chunks                                                            */
/* ------------------------------------------------------------------------ */

/* omu held: drop least recently used idle mappings beyond the cap. */
static void trim_open(tf_remote *r) {
    while (r->nidle > TF__OPEN_CHUNKS) {
        ochunk **best = NULL;
        for (size_t b = 0; b < TF__HASH; b++)
            for (ochunk **p = &r->open[b]; *p; p = &(*p)->next)
                if ((*p)->refs == 0 && (!best || (*p)->last < (*best)->last)) best = p;
        if (!best) return;
        ochunk *o = *best;
        *best = o->next;
        tf__cache_unmap(o->map, o->map_len);
        free(o);
        r->nopen--;
        r->nidle--;
    }
}

/* Chunks evicted from the cache (by any process) since we mapped them: drop
 * the idle mappings, so that the disk space of evicted chunks is freed and
 * the limit holds; mappings in use stay until released. omu held. */
static void revalidate_open(tf_remote *r) {
    uint64_t ev = tf__cache_evictions(r->cache);
    if (ev == r->seen_evictions) return;
    r->seen_evictions = ev;
    for (size_t b = 0; b < TF__HASH; b++) {
        ochunk **p = &r->open[b];
        while (*p) {
            ochunk *o = *p;
            if (o->refs == 0 && o->valid_at != ev) {
                if (!tf__cache_present(r->cache, &o->key)) {
                    *p = o->next;
                    tf__cache_unmap(o->map, o->map_len);
                    free(o);
                    r->nopen--;
                    r->nidle--;
                    continue;
                }
                o->valid_at = ev;
            }
            p = &o->next;
        }
    }
}

static ochunk *open_find(tf_remote *r, const tf__ckey *k) {
    for (ochunk *o = r->open[hslot(k)]; o; o = o->next)
        if (keq(&o->key, k)) return o;
    return NULL;
}

/* Step 1: the chunk mapped here already (revalidated against evictions)?
 * Referenced when found. */
static ochunk *open_hit(tf_remote *r, const tf__ckey *key) {
    pthread_mutex_lock(&r->omu);
    revalidate_open(r);
    ochunk *oc = open_find(r, key);
    if (oc) {
        if (oc->refs++ == 0) r->nidle--;
        oc->last = ++r->clock;
    }
    pthread_mutex_unlock(&r->omu);
    return oc;
}

/* Step 2: the chunk on this node's disk: mapped, verified (trailer, and the
 * shard's granule checksums) and entered in the open table, referenced.
 * 0, -ENOENT (not cached), -TF_ECHECKSUM (corrupt: removed) or < 0. */
static int map_cached(tf_remote *r, const tf__robj *o, uint32_t k, const tf__ckey *key, uint64_t clen,
                      ochunk **out) {
    const uint64_t *sums = NULL;
    size_t nsums = 0;
    if (o->sums) {
        sums = o->sums + (uint64_t)k * (o->chunk_bytes / o->granule);
        nsums = (size_t)((clen + o->granule - 1) / o->granule);
    }
    void *map;
    size_t ml;
    TF_TRY(tf__cache_map(r->cache, key, (size_t)clen, sums, nsums, o->granule, &map, &ml));
    ochunk *n = calloc(1, sizeof *n);
    if (!n) {
        tf__cache_unmap(map, ml);
        return -ENOMEM;
    }
    *n = (ochunk){.key = *key, .owner = r, .valid_at = tf__cache_evictions(r->cache), .map = map, .map_len = ml,
                  .len = (size_t)clen};
    pthread_mutex_lock(&r->omu);
    ochunk *oc = open_find(r, key);
    if (oc) { /* another thread mapped it meanwhile */
        tf__cache_unmap(map, ml);
        free(n);
        if (oc->refs++ == 0) r->nidle--;
    } else {
        oc = n;
        oc->refs = 1;
        size_t h = hslot(key);
        oc->next = r->open[h];
        r->open[h] = oc;
        r->nopen++;
    }
    oc->last = ++r->clock;
    trim_open(r);
    pthread_mutex_unlock(&r->omu);
    *out = oc;
    return 0;
}

/* Steps: mapped here (1), else on disk (2), else fetched (by this process
 * or another) and looked for again; a chunk found corrupt on disk is fetched
 * once more; one that keeps disappearing means the cache is too small. */
int tf__chunk_acquire(const tf__robj *o, uint32_t k, const uint8_t **data, size_t *len, tf__chunkref **ref) {
    tf_remote *r = o->r;
    if (k >= o->nchunks)
        TF_FAIL(-ERANGE, "%s: chunk %u out of range (%u chunks)", o->url, k, o->nchunks);
    check_fork(r);
    tf__ckey key = {o->oid_lo, o->oid_hi, k};
    uint64_t clen = chunk_len(o, k), t0 = 0;
    int waited = 0, corrupt = 0;
    ochunk *oc = NULL;
    for (int round = 0; round < 64 && !oc; round++) {
        if ((oc = open_hit(r, &key))) break;
        int rc = map_cached(r, o, k, &key, clen, &oc);
        if (rc == 0) break;
        if (rc == -TF_ECHECKSUM) {
            if (corrupt++)
                TF_FAIL(-TF_ECHECKSUM, "%s: bytes [%llu, +%llu): the cached chunk was corrupt again after fetching it a second time (%s). Check the disk holding %s.",
                        o->url, (ull)(o->data_off + (uint64_t)k * o->chunk_bytes), (ull)clen, tf_last_error(), r->cache_dir);
            atomic_fetch_add_explicit(&r->st_refetch, 1, memory_order_relaxed);
        } else if (rc != -ENOENT) {
            return rc;
        }
        if (!waited) t0 = tf__now_ns();
        waited = 1;
        /* chunks fetched ahead do not land: say so before waiting on one more */
        TF_TRY(tf__cache_failed(r->cache));
        rc = fetch_and_wait(r, o, k);
        if (rc == -ENOSPC) tf__cache_failure_said(r->cache);
        if (rc < 0) return rc;
    }
    if (!oc)
        TF_FAIL(-EIO, "%s: chunk %u kept disappearing from the cache %s before it could be read: the cache is too small for the processes sharing it. Raise cache_limit.",
                o->url, k, r->cache_dir);
    if (waited) {
        atomic_fetch_add_explicit(&r->st_waits, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&r->st_wait_ns, tf__now_ns() - t0, memory_order_relaxed);
    } else {
        atomic_fetch_add_explicit(&r->st_hits, 1, memory_order_relaxed);
    }
    /* oc stays mapped while referenced: trim_open drops idle ones only */
    *data = oc->map;
    *len = oc->len;
    *ref = (tf__chunkref *)(void *)oc;
    return 0;
}

void tf__chunk_release(tf__chunkref *ref) {
    if (!ref) return;
    ochunk *oc = (ochunk *)(void *)ref;
    tf_remote *r = oc->owner;
    pthread_mutex_lock(&r->omu);
    if (--oc->refs == 0) {
        r->nidle++;
        trim_open(r);
    }
    pthread_mutex_unlock(&r->omu);
}

int tf__chunk_cached(const tf__robj *o, uint32_t k) {
    tf__ckey key = {o->oid_lo, o->oid_hi, k};
    return tf__cache_present(o->r->cache, &key);
}

/* Whether chunk k can be read without waiting for a fetch: mapped here, or
 * on this node's disk. */
static int chunk_ready(const tf__robj *o, uint32_t k) {
    tf_remote *r = o->r;
    tf__ckey key = {o->oid_lo, o->oid_hi, k};
    pthread_mutex_lock(&r->omu);
    int here = open_find(r, &key) != NULL;
    pthread_mutex_unlock(&r->omu);
    return here || tf__cache_present(r->cache, &key);
}

int tf__robj_read_small(const tf__robj *o, uint64_t off, uint64_t len, void *out) {
    /* off is relative to the data region. A few bytes a reader needs now
     * should not wait behind a whole chunk that shares the link with others
     * fetched ahead: read just them, then ask for the chunk (it lands in the
     * cache for later). Checked like a chunk: whole 64 KiB granules against
     * the shard's table when it has one, else conditional on the version.
     * "Small" is at most an eighth of a chunk (and 256 KiB): reading a whole
     * chunk's worth this way would only double the transfer. A chunk no
     * larger than 256 KiB as it is (the one chunk of a small shard) is not
     * worth a request of its own: it is fetched, once. A chunk another
     * process of the node is fetching is waited for: its bytes come once per
     * node. */
    tf_remote *r = o->r;
    uint32_t k = (uint32_t)(off / o->chunk_bytes);
    uint64_t clen = o->data_len - (uint64_t)k * o->chunk_bytes;
    if (clen > o->chunk_bytes) clen = o->chunk_bytes;
    uint64_t limit = clen <= TF__SMALL_READ ? 0 : o->chunk_bytes / 8 < TF__SMALL_READ ? o->chunk_bytes / 8 : TF__SMALL_READ;
    /* only for a loader's reads (a position is set): other readers wait for
     * the chunk, which then stays cached */
    if (reader_position() == TF__NO_NEED || len > limit || chunk_ready(o, k)) return 1;
    tf__ckey key = {o->oid_lo, o->oid_hi, k};
    if (tf__cache_fetching_elsewhere(r->cache, &key)) return 1;
    check_fork(r);
    TF_TRY(tf__cache_failed(r->cache)); /* chunks fetched ahead do not land: say so, not read around it */
    uint64_t a = off, b = off + len;
    if (o->sums) {
        a = a / o->granule * o->granule;
        b = (b + o->granule - 1) / o->granule * o->granule;
        if (b > o->data_len) b = o->data_len;
    }
    uint8_t *buf = malloc((size_t)(b - a));
    if (!buf) return -ENOMEM;
    int rc = fetch_range(r, o->url, &o->info, o->data_off + a, b - a, buf);
    int mismatch = 0;
    for (uint64_t g = a; !rc && o->sums && g < b; g += o->granule) {
        uint64_t n = b - g < o->granule ? b - g : o->granule;
        if (tf_hash64(buf + (g - a), (size_t)n, 0) != o->sums[g / o->granule]) mismatch = 1;
    }
    if (!rc && !mismatch) {
        memcpy(out, buf + (off - a), (size_t)len);
        atomic_fetch_add_explicit(&r->st_small, 1, memory_order_relaxed);
        uint64_t pos = reader_position();
        pthread_mutex_lock(&r->mu);
        if (!r->stop) submit_locked(r, o, k, pos, 1, NULL);
        pthread_mutex_unlock(&r->mu);
    }
    free(buf);
    if (rc == -ESTALE) return 1; /* the chunk path fetches once more, then reports it */
    if (rc < 0) return note_failure(o, rc); /* after the retries: the reader gets the error */
    return mismatch ? 1 : 0;     /* a mismatch: the chunk path fetches again, then fails */
}

uint64_t tf__remote_prefetch_bytes(const tf_remote *r) { return r->cfg.prefetch_bytes; }

tf__cache *tf__remote_cache(const tf_remote *r) { return r->cache; }

void tf__remote_publish(tf_remote *r, const tf__ckey *keys, const uint64_t *next_use, size_t n, uint64_t position) {
    check_fork(r);
    tf__cache_publish(r->cache, keys, next_use, n, position);
}

int tf__robj_read(const tf__robj *o, uint64_t off, uint64_t len, void *out) {
    uint64_t end;
    if (tf__add_overflow(off, len, &end) || end > o->info.size)
        TF_FAIL(-ERANGE, "%s: bytes [%llu, +%llu) past the end of the %llu-byte object", o->url, (ull)off, (ull)len,
                (ull)o->info.size);
    uint8_t *dst = out;
    uint64_t ds = o->data_off, de = o->data_off + o->data_len;
    while (len) {
        uint64_t n;
        if (off < ds || off >= de) {
            n = off < ds ? (end < ds ? end : ds) - off : len;
            TF_TRY(note_failure(o, fetch_range(o->r, o->url, &o->info, off, n, dst)));
        } else {
            uint64_t rel = off - ds;
            uint32_t k = (uint32_t)(rel / o->chunk_bytes);
            uint64_t in = rel % o->chunk_bytes;
            const uint8_t *data;
            size_t clen;
            tf__chunkref *ref;
            TF_TRY(tf__chunk_acquire(o, k, &data, &clen, &ref));
            n = clen - in;
            if (n > len) n = len;
            if (n > de - off) n = de - off;
            memcpy(dst, data + in, (size_t)n);
            tf__chunk_release(ref);
        }
        dst += n;
        off += n;
        len -= n;
    }
    return 0;
}

int tf_remote_read(tf_remote *r, const char *url, const tf_object_info *info, uint64_t off, uint64_t len, void *out) {
    TF_NEED_ARG(r);
    TF_NEED_ARG(url);
    TF_NEED_ARG(info);
    TF_NEED_BUF(out, len);
    tf__clearerr();
    tf__robj *o;
    TF_TRY(tf__robj_from_info(r, url, info, &o));
    int rc = tf__robj_read(o, off, len, out);
    tf__robj_free(o);
    return rc;
}

void tf_remote_get_stats(tf_remote *r, tf_remote_stats *st) {
    if (!st) return;
    memset(st, 0, sizeof *st);
    if (!r) return;
    st->requests = atomic_load(&r->st_requests);
    st->bytes_fetched = atomic_load(&r->st_bytes);
    st->retries = atomic_load(&r->st_retries);
    st->chunks_fetched = atomic_load(&r->st_chunks);
    st->chunk_hits = atomic_load(&r->st_hits);
    st->chunk_waits = atomic_load(&r->st_waits);
    st->refetches = atomic_load(&r->st_refetch);
    st->evictions = atomic_load(&r->st_evict);
    st->bytes_evicted = atomic_load(&r->st_evict_bytes);
    st->wait_ns = atomic_load(&r->st_wait_ns);
    st->small_reads = atomic_load(&r->st_small);
    check_fork(r);
    tf__cache_usage(r->cache, &st->cache_bytes, &st->cache_limit);
    st->chunk_bytes = r->cfg.chunk_bytes;
}
