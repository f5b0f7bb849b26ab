/*
 * loader.c — the batch engine: worker threads assemble whole batches ahead of
 * the consumer into buffers that are handed out as reference-counted batches.
 *
 * DESIGN
 *
 * Stream. After a seek to global position `base` (a multiple of G = B * R),
 * batch k (k = 0, 1, ...) of this rank covers stream positions
 * base + k*G + rank*B ... + B - 1; read.c turns positions into tokens. A
 * generation counter `gen` is bumped by every seek (and by an error reset), so
 * work started for an older generation is recognisably stale.
 *
 * Queues (all under `mu` unless said otherwise):
 *   - claim counter `next_claim`: a worker takes batch k = next_claim++ when
 *     k < next_deliver + depth (at most `depth` batches assembled or being
 *     assembled ahead of the consumer) and the stream is not exhausted.
 *   - ring `slots[depth]`: batch k, once assembled, is published in slot
 *     k % depth (ready = 1, with its buffer or its error). Workers finish out
 *     of order; the consumer takes slot next_deliver % depth only, so delivery
 *     is in order. A slot is free when the consumer has taken its batch, and
 *     the claim bound above guarantees no two live batches share a slot.
 *   - free list `free_list`: buffers the loader owns and may fill. Capped at
 *     depth + threads entries; extras are freed.
 *   - returned stack `pool->returned`: lock-free (CAS push by releasers,
 *     exchange-all by the loader, so no ABA). tf_batch_release only pushes
 *     there and decrements a counter: it never takes `mu` and never blocks.
 *     Whoever needs a buffer drains it into the free list under `mu`.
 *
 * Ownership. A buffer (struct tf_batch + 64-byte aligned payload, one
 * allocation) is owned by exactly one of: the free list, a worker filling it,
 * a ready slot, the consumer (after next() until release), the returned stack.
 * A buffer the consumer holds is never written: when the free list and the
 * returned stack are empty a worker allocates a new buffer, so memory is
 * (depth + threads + held) buffers at most.
 *
 * Who wakes whom. Workers sleep on `work_cv` until a claim is possible; the
 * consumer signals it when it takes a batch (one slot freed), seek/reset/stop
 * broadcast it. The consumer sleeps on `ready_cv` until its slot is ready; a
 * worker broadcasts it when it publishes batch next_deliver (publishing a later
 * batch wakes no one: the consumer cannot use it yet).
 *
 * Seek / errors. seek(pos) bumps gen, resets base/next_claim/next_deliver,
 * moves ready buffers back to the free list and wakes workers: O(depth), no
 * waiting. Workers still filling for an old gen finish, see the gen changed,
 * and return their buffer to the free list. A worker's failure (EIO, format
 * error, ...) is stored in the batch's slot with its message; next() returns
 * it with tf_last_error set and resets the pipeline at the same position,
 * paused: the position does not advance, and workers start again (retrying
 * the batch) only when the consumer calls next() or seek() again.
 *
 * Lifetime. `pool` is shared by the loader and the batches it handed out:
 * refs = 1 (the loader) + batches held by the consumer. The loader frees what
 * it owns, then drops its ref; the last tf_batch_release frees the pool and
 * whatever sits on the returned stack. Releasers push before they decrement,
 * so whoever drops the last ref sees every returned buffer.
 *
 * Threads start lazily on the first next() and record getpid(). If next()
 * (or seek/free) runs in another process (a fork()ed DataLoader worker), the
 * parent's threads do not exist there and `mu` may be a copy of a locked
 * mutex: the child re-initialises the mutex and condition variables, forgets
 * (leaks) the parent's worker contexts, slots and free list without touching
 * them, and starts its own threads. Workers block all signals, so Ctrl-C is
 * delivered to the consumer's thread.
 *
 * position (atomic) is what the consumer has received — never what was
 * prefetched; stats counters are atomics readable from any thread.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "cp.h"
#include "engine.h"
#include "meter.h"
#include "../remote/remote.h"
#include "../common/settings.h"

#define TF__ERRMSG 512

typedef struct tf__pool {
    _Atomic(struct tf_batch *) returned; /* lock-free stack of released buffers */
    _Atomic uint64_t refs;               /* 1 (loader, while alive) + batches held */
    size_t seg_cap[TF__NSEGS];           /* room per array (tf__batch_segments); outlives the loader */
} tf__pool;

struct tf_batch {
    struct tf_batch *next; /* link on the free list / returned stack */
    tf__pool *pool;
    const tf__buffer_allocator *alloc; /* NULL: posix_memalign'd */
    size_t alloc_bytes;
    int locked;            /* page-locked (from alloc) */
    tf_batch_view view;    /* pointers into the payload after this header */
    tf__row_acct *acct;    /* a mixture: per-row accounting (rows entries), else NULL */
    const size_t *seg_cap; /* the loader's room per array (tf__seg_id), in the pool */
};

typedef struct tf__slot {
    tf_batch *b; /* NULL when the batch failed before it had a buffer */
    _Atomic int ready; /* written under mu; read without it by the spinning consumer */
    int rc;
    char err[TF__ERRMSG];
} tf__slot;

struct tf_loader {
    const tf_dataset *ds;  /* tf_order_dataset(order) */
    const tf_order *order;
    int owns_order;        /* built by tf_loader_create(_mix); borrowed from tf_loader_create_from_order */
    tf_loader_config cfg;  /* as created (its order member unused) */
    int synced;            /* mu and the condition variables exist */
    uint64_t B, G, L, npos, rank;
    int finite;
    tf_dtype out_dtype;
    unsigned want;
    uint32_t cp_size; /* > 1: context parallelism (the rank's share of each row) */
    int thd;
    size_t hdr, off_pos, off_cu, off_ns, off_lm, bytes; /* buffer layout */
    size_t off_in, off_lab, off_cup, off_acct;          /* context parallelism, mixture accounting */
    /* per-source stats of a mixture (nsources > 0): sample id offsets
     * (nsources + 1) and what the consumer received, per source */
    size_t nsources;
    uint64_t *source_first;
    _Atomic uint64_t *src_samples, *src_tokens, *src_docs;
    int nthreads, depth;
    tf__reader rd;
    tf__pool *pool;

    pthread_mutex_t mu;
    pthread_cond_t work_cv, ready_cv;
    /* under mu */
    uint64_t gen, base, next_claim, next_deliver;
    tf__slot *slots;
    tf_batch *free_list;
    uint64_t nfree;
    int stop;
    int paused; /* after an error: no claims until the consumer asks again */
    /* Fault injection ($TOKENFEED_FAULT_DELAY_MS, read at create in test
     * builds, TF_TEST_HOOKS; 0 otherwise): each worker
     * waits this long before assembling a batch, so tests can hold next() in
     * its wait (Ctrl-C, close from another thread) deterministically. The
     * wait ends early when the loader stops. */
    uint64_t fault_delay_ns;
    uint64_t spin_ns; /* consumer spin before sleeping in next() (0: none) */

    /* consumer-side thread state (next/seek/free are not called concurrently) */
    /* 0 while no threads run, else the pid of the process that started them
     * (atomic: get_stats may read it from another thread). */
    _Atomic pid_t owner;
    pthread_t *threads;
    tf__worker *workers;
    int nstarted;

    _Atomic uint64_t position;

    /* Remote data: the chunk scheduler walks this rank's positions ahead of
     * the consumer (remote/remote_prefetch.c); pf_base is the position of
     * its local index 0 (the last seek). NULL when nothing is remote. */
    tf__prefetch *pf;
    void *pf_ctx;
    uint64_t pf_base;
    int pf_started;
    _Atomic uint64_t st_batches, st_tokens, st_wait_ns;
    /* page-locked buffers for a device stage (tf__loader_set_allocator) */
    _Atomic(const tf__buffer_allocator *) alloc;
    _Atomic uint64_t st_locked;
    tf__meter meter; /* the consumer's waits (meter.h) */
    tf__takedowns *td; /* under mu: the order's takedowns as of the last seek (NULL: none) */
};

/* ------------------------------------------------------------------------ */
/* buffers                                                                   */
/* ------------------------------------------------------------------------ */

static size_t align64(size_t x) { return (x + 63) & ~(size_t)63; }

static void batch_free(tf_batch *b) {
    if (!b) return;
    if (b->alloc) b->alloc->free(b, b->alloc_bytes, b->locked);
    else free(b);
}

static void pool_drain_free(tf__pool *p) {
    tf_batch *b = atomic_exchange_explicit(&p->returned, NULL, memory_order_acquire);
    while (b) {
        tf_batch *n = b->next;
        batch_free(b);
        b = n;
    }
}

static void pool_unref(tf__pool *p) {
    if (atomic_fetch_sub_explicit(&p->refs, 1, memory_order_acq_rel) == 1) {
        pool_drain_free(p);
        free(p);
    }
}

static tf_batch *batch_alloc(tf_loader *l) {
    void *mem = NULL;
    const tf__buffer_allocator *a = atomic_load_explicit(&l->alloc, memory_order_acquire);
    int locked = 0;
    if (a) {
        /* page-aligned, so the payload keeps its 64-byte alignment */
        if (!(mem = a->alloc(l->hdr + l->bytes, &locked))) return NULL;
        if (locked) atomic_fetch_add_explicit(&l->st_locked, 1, memory_order_relaxed);
    } else if (posix_memalign(&mem, 64, l->hdr + l->bytes) != 0) {
        return NULL;
    }
    tf_batch *b = mem;
    memset(b, 0, sizeof *b);
    b->alloc = a;
    b->alloc_bytes = l->hdr + l->bytes;
    b->locked = locked;
    uint8_t *base = (uint8_t *)mem + l->hdr;
    b->pool = l->pool;
    b->view.tokens = base;
    b->view.dtype = l->out_dtype;
    b->view.rows = l->B;
    b->view.seq_len = l->L;
    if (l->want & TF_WANT_POSITION_IDS) b->view.position_ids = (int32_t *)(base + l->off_pos);
    if (l->want & TF_WANT_CU_SEQLENS) {
        b->view.cu_seqlens = (int32_t *)(base + l->off_cu);
        b->view.num_seqs = (int32_t *)(base + l->off_ns);
    }
    if (l->want & TF_WANT_LOSS_MASK) b->view.loss_mask = base + l->off_lm;
    b->view.cp_size = l->cp_size;
    b->view.thd = l->thd;
    if (l->cp_size > 1) {
        b->view.input_ids = base + l->off_in;
        b->view.labels = base + l->off_lab;
        if (l->thd) b->view.cu_seqlens_padded = (int32_t *)(base + l->off_cup);
    }
    if (l->nsources) b->acct = (tf__row_acct *)(base + l->off_acct);
    b->seg_cap = l->pool->seg_cap;
    return b;
}

/* mu held. */
static void put_buffer_locked(tf_loader *l, tf_batch *b) {
    if (!b) return;
    const tf__buffer_allocator *a = atomic_load_explicit(&l->alloc, memory_order_relaxed);
    /* With an allocator, a buffer from it is kept (it was page-locked once;
     * the buffers in use are bounded by the ring and the stage), any other
     * is replaced; without one, the free list is capped. */
    if (b->alloc != a || (!a && l->nfree >= (uint64_t)(l->depth + l->nthreads))) {
        batch_free(b);
        return;
    }
    b->next = l->free_list;
    l->free_list = b;
    l->nfree++;
}

/* mu held. A free buffer, or NULL (the caller allocates outside the lock). */
static tf_batch *take_buffer_locked(tf_loader *l) {
    if (!l->free_list) {
        tf_batch *b = atomic_exchange_explicit(&l->pool->returned, NULL, memory_order_acquire);
        while (b) {
            tf_batch *n = b->next;
            put_buffer_locked(l, b);
            b = n;
        }
    }
    tf_batch *b = l->free_list;
    if (b) {
        l->free_list = b->next;
        l->nfree--;
    }
    return b;
}

/* ------------------------------------------------------------------------ */
/* workers                                                                   */
/* ------------------------------------------------------------------------ */

/* Global position of claimable batch k of the current generation, or 0 with
 * *ok = 0 when the stream ends before it. mu held. */
static uint64_t batch_pos(const tf_loader *l, uint64_t k, int *ok) {
    uint64_t off, pos, end;
    *ok = !tf__mul_overflow(k, l->G, &off) && !tf__add_overflow(l->base, off, &pos) &&
          !tf__add_overflow(pos, l->G, &end) && (!l->finite || end <= l->npos);
    return *ok ? pos : 0;
}

static int can_claim(const tf_loader *l) {
    if (l->paused) return 0;
    if (l->next_claim >= l->next_deliver + (uint64_t)l->depth) return 0;
    int ok;
    batch_pos(l, l->next_claim, &ok);
    return ok;
}

/* ------------------------------------------------------------------------ */
/* takedowns                                                                 */
/* ------------------------------------------------------------------------ */

static void td_free(tf__takedowns *t) {
    if (!t) return;
    for (size_t i = 0; i < t->n; i++) free(t->e[i].ids);
    free(t->e);
    free(t);
}

static void td_unref_locked(tf__takedowns *t) {
    if (t && --t->refs == 0) td_free(t);
}

/* A copy of the order's takedowns (*out NULL when it has none). */
static int td_build(const tf_order *o, tf__takedowns **out) {
    *out = NULL;
    size_t n = tf_order_num_excluded(o);
    if (!n) return 0;
    tf__takedowns *t = calloc(1, sizeof *t);
    if (!t || !(t->e = calloc(n, sizeof *t->e))) {
        free(t);
        return -ENOMEM;
    }
    t->refs = 1;
    for (size_t i = 0; i < n; i++) {
        const uint64_t *ids;
        tf__takedown *e = &t->e[i];
        int rc = tf_order_excluded(o, i, &e->pos, &e->source, &ids, &e->n);
        if (!rc && !(e->ids = malloc((e->n ? e->n : 1) * sizeof *e->ids))) rc = -ENOMEM;
        if (rc) {
            t->n = i + (e->ids != NULL);
            td_free(t);
            return rc;
        }
        if (e->n) memcpy(e->ids, ids, e->n * sizeof *e->ids);
        t->n = i + 1;
    }
    *out = t;
    return 0;
}

static void *worker_main(void *arg) {
    tf__worker *w = arg;
    tf_loader *l = w->loader;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        while (!l->stop && !can_claim(l)) pthread_cond_wait(&l->work_cv, &l->mu);
        if (l->stop) break;
        uint64_t k = l->next_claim++, gen = l->gen;
        if (TF_UNLIKELY(l->fault_delay_ns)) {
            uint64_t until = tf__now_ns() + l->fault_delay_ns;
            struct timespec ts = tf__abstime(until);
            while (!l->stop && tf__now_ns() < until) pthread_cond_timedwait(&l->work_cv, &l->mu, &ts);
        }
        int ok;
        uint64_t pos = batch_pos(l, k, &ok);
        tf_batch *b = take_buffer_locked(l);
        tf__takedowns *td = l->td; /* the copy of this generation, kept while the batch is filled */
        if (td) td->refs++;
        w->td = td;
        w->td_gpos = pos;
        pthread_mutex_unlock(&l->mu);

        char err[TF__ERRMSG];
        err[0] = '\0';
        int rc = 0;
        if (!b) b = batch_alloc(l);
        if (!b) {
            rc = -ENOMEM;
            snprintf(err, sizeof err, "cannot allocate a batch buffer of %zu bytes", l->hdr + l->bytes);
        } else {
            b->view.position = pos;
            b->view.rows = l->B; /* a warmed batch of an earlier step may have changed them */
            b->view.seq_len = l->L;
            tf__clearerr();
            rc = tf__worker_fill(w, pos + l->rank * l->B, l->B, &b->view, b->acct);
            uint64_t wl = tf_seq_len_warmup(l->L, l->cfg.warmup_min_seq_len, l->cfg.warmup_steps, pos / l->G);
            if (!rc && wl < l->L) {
                if (!w->warm_cu && !(w->warm_cu = malloc((l->L + 1) * sizeof *w->warm_cu))) rc = -ENOMEM;
                else tf__warmup_cut(&b->view, wl, w->warm_cu);
            }
            if (rc) {
                const char *m = tf_last_error();
                snprintf(err, sizeof err, "%s", m && *m ? m : tf_strerror(rc));
            }
        }

        pthread_mutex_lock(&l->mu);
        w->td = NULL;
        td_unref_locked(td);
        if (gen == l->gen) {
            tf__slot *s = &l->slots[k % (uint64_t)l->depth];
            s->b = b;
            s->rc = rc;
            memcpy(s->err, err, sizeof err);
            s->ready = 1;
            if (k == l->next_deliver) pthread_cond_broadcast(&l->ready_cv);
        } else {
            put_buffer_locked(l, b); /* stale: a seek happened meanwhile */
        }
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

static int init_sync(tf_loader *l) {
    if (pthread_mutex_init(&l->mu, NULL) != 0) return -ENOMEM;
    return tf__cond_init(&l->work_cv) || tf__cond_init(&l->ready_cv) ? -ENOMEM : 0;
}

static void stop_threads(tf_loader *l) {
    if (!atomic_load(&l->owner)) return;
    pthread_mutex_lock(&l->mu);
    l->stop = 1;
    pthread_cond_broadcast(&l->work_cv);
    pthread_mutex_unlock(&l->mu);
    for (int i = 0; i < l->nstarted; i++) pthread_join(l->threads[i], NULL);
    for (int i = 0; i < l->nthreads; i++) tf__worker_destroy(&l->workers[i]);
    free(l->threads);
    free(l->workers);
    l->threads = NULL;
    l->workers = NULL;
    l->nstarted = 0;
    atomic_store(&l->owner, 0);
    l->stop = 0;
}

static int start_threads(tf_loader *l) {
    l->threads = calloc((size_t)l->nthreads, sizeof *l->threads);
    l->workers = calloc((size_t)l->nthreads, sizeof *l->workers);
    if (!l->threads || !l->workers) goto nomem;
    for (int i = 0; i < l->nthreads; i++) {
        int rc = tf__worker_init(&l->workers[i], &l->rd, i);
        if (rc) {
            for (int j = 0; j <= i; j++) tf__worker_destroy(&l->workers[j]);
            goto nomem;
        }
        l->workers[i].loader = l;
    }
    sigset_t all, old;
    sigfillset(&all);
    sigdelset(&all, SIGBUS); /* a fault on a truncated mapping must reach the guard (sigbus.c) */
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int started = 0, err = 0;
    for (int i = 0; i < l->nthreads; i++) {
        int rc = pthread_create(&l->threads[started], NULL, worker_main, &l->workers[i]);
        if (rc) {
            err = rc;
            break;
        }
        started++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    l->nstarted = started;
    atomic_store(&l->owner, getpid());
    if (!started) {
        stop_threads(l);
        TF_FAIL(-err, "cannot start loader threads: pthread_create: %s", strerror(err));
    }
    return 0;
nomem:
    free(l->threads);
    free(l->workers);
    l->threads = NULL;
    l->workers = NULL;
    return -ENOMEM;
}

/* In a fork()ed child, the parent's workers do not exist and mu may be a copy
 * of a held lock: start over without touching any of it. */
static int after_fork(tf_loader *l) {
    pid_t ow = atomic_load(&l->owner);
    if (!ow || ow == getpid()) return 0;
    /* Leaked on purpose: worker contexts (their rings are shared with the
     * parent's), slots' and free-list buffers (state may be mid-update). */
    l->threads = NULL;
    l->workers = NULL;
    l->nstarted = 0;
    atomic_store(&l->owner, 0);
    l->stop = 0;
    l->paused = 0;
    l->free_list = NULL;
    l->nfree = 0;
    if (init_sync(l)) return -ENOMEM;
    tf__meter_reinit_lock(&l->meter);
    for (int i = 0; i < l->depth; i++) memset(&l->slots[i], 0, sizeof l->slots[i]);
    l->gen++;
    l->base = atomic_load(&l->position);
    l->next_claim = l->next_deliver = 0;
    if (l->pf) {
        tf__prefetch_forget_thread(l->pf); /* the parent's scheduler thread is not here */
        l->pf_started = 0;
    }
    return tf__zcache_after_fork(l->rd.zc);
}

/* ------------------------------------------------------------------------ */
/* public API                                                                */
/* ------------------------------------------------------------------------ */

const char *tf_backend_name(tf_backend b) {
    switch (b) {
    case TF_BACKEND_AUTO: return "auto";
    case TF_BACKEND_MMAP: return "mmap";
    case TF_BACKEND_PREAD: return "pread";
    case TF_BACKEND_IO_URING: return "io_uring";
    }
    return "unknown";
}

void tf_loader_config_init(tf_loader_config *cfg) {
    if (!cfg) return;
    memset(cfg, 0, sizeof *cfg);
    tf_order_config_init(&cfg->order);
    tf__settings_init(TF_SCOPE_ENGINE, cfg); /* the settings table (common/settings.c) */
    cfg->out_dtype = TF_DTYPE_INVALID;
    cfg->want = 0;
}

/* The engine's own settings, checked before any order is built (building a
 * packed order's plan takes time). */
static int check_engine_config(const tf_loader_config *cfg) {
    TF_TRY(tf__settings_check(TF_SCOPE_ENGINE, cfg)); /* every row's bounds */
    if (cfg->rank >= cfg->world_size)
        TF_FAIL(-EINVAL, "dp_rank: expected 0 <= dp_rank < dp_size (%u), found %u", cfg->world_size, cfg->rank);
    if (cfg->want & ~(unsigned)(TF_WANT_POSITION_IDS | TF_WANT_CU_SEQLENS | TF_WANT_LOSS_MASK))
        TF_FAIL(-EINVAL, "want: unknown bits 0x%x", cfg->want);
    if (cfg->cp_size > 1 && cfg->cp_rank >= cfg->cp_size)
        TF_FAIL(-EINVAL, "cp_rank: expected 0 <= cp_rank < cp_size (%u), found %u", cfg->cp_size, cfg->cp_rank);
    if (cfg->out_dtype != TF_DTYPE_INVALID && !tf_dtype_size(cfg->out_dtype))
        TF_FAIL(-EINVAL, "out_dtype: unknown dtype code %d", (int)cfg->out_dtype);
    uint64_t G;
    if (tf__mul_overflow(cfg->batch_size, cfg->world_size, &G))
        TF_FAIL(-EINVAL, "batch_size x world_size (%llu x %u) overflows 64 bits",
                (unsigned long long)cfg->batch_size, cfg->world_size);
    return 0;
}

/* Default out dtype: the widest (by size) of the order's sources' dtypes,
 * the first of them on a tie. */
static tf_dtype default_out_dtype(const tf_order *o) {
    tf_dtype dt = TF_DTYPE_INVALID;
    for (size_t s = 0; s < tf_order_num_sources(o); s++) {
        tf_dataset_info in;
        if (tf_dataset_get_info(tf_order_dataset(tf_order_source(o, s)), &in) == 0 &&
            (dt == TF_DTYPE_INVALID || tf_dtype_size(in.dtype) > tf_dtype_size(dt)))
            dt = in.dtype;
    }
    return dt;
}

static void free_accounting(tf_loader *l) {
    free(l->source_first);
    free((void *)l->src_samples);
    free((void *)l->src_tokens);
    free((void *)l->src_docs);
}

static void reset_locked(tf_loader *l, uint64_t pos);

/* Buffer layout of a batch: tokens, then the extras, each 64-byte aligned,
 * and what a stage copies out of it (filled into the pool's seg_cap). */
typedef struct layout {
    uint64_t tok, pos_b, cu_b, ns_b, lm_b, in_b, cup_b, acct_b;
    uint64_t cp_first[2], cp_c, thd_cap, rowsL;
    uint32_t cp;
    int thd;
} layout;

static int plan_layout(const tf_loader_config *cfg, uint64_t L, tf_dtype odt, size_t nsources, layout *y) {
    memset(y, 0, sizeof *y);
    size_t osz = tf_dtype_size(odt);
    uint64_t rowsL1;
    if (tf__add_overflow(L, 1, &rowsL1) || tf__mul_overflow(rowsL1, cfg->batch_size, &rowsL1) ||
        tf__mul_overflow(rowsL1, osz, &y->tok) || y->tok > (uint64_t)SIZE_MAX / 4)
        TF_FAIL(-EINVAL, "batch_size x (seq_len + 1) (%llu x %llu) is too large for one buffer",
                (unsigned long long)cfg->batch_size, (unsigned long long)L + 1);
    uint64_t rowsL = y->rowsL = cfg->batch_size * L;
    uint32_t cp = y->cp = cfg->cp_size > 1 ? cfg->cp_size : 1;
    /* sequence-length warmup (warmup.c): a sample cut into up to kmax rows
     * needs kmax - 1 more tokens and cu_seqlens entries, and kmax num_seqs
     * entries */
    uint64_t kmax = 1;
    if (cfg->warmup_steps) {
        if (cp > 1)
            TF_FAIL(-EINVAL, "warmup_steps: sequence-length warmup cuts whole samples into shorter rows; it does not combine with context parallelism (cp_size %u)", cp);
        TF_TRY(tf__warmup_check(L, cfg->warmup_min_seq_len, cfg->warmup_steps));
        kmax = L / cfg->warmup_min_seq_len;
        if (tf__add_overflow(L + 1, kmax - 1, &rowsL1) || tf__mul_overflow(rowsL1, cfg->batch_size, &rowsL1) ||
            tf__mul_overflow(rowsL1, osz, &y->tok) || y->tok > (uint64_t)SIZE_MAX / 4)
            TF_FAIL(-EINVAL, "batch_size x (seq_len + 1) (%llu x %llu) is too large for one buffer",
                    (unsigned long long)cfg->batch_size, (unsigned long long)L + 1);
    }
    int thd = y->thd = cp > 1 && (cfg->want & TF_WANT_CU_SEQLENS);
    if (cp > 1) {
        TF_TRY(tf__cp_chunks(L, cp, cfg->cp_rank, y->cp_first, &y->cp_c));
        /* plain: rows x L/cp entries. THD: a padded sequence is shorter than
         * its length + 2cp, and there are at most rows x L sequences, so a rank
         * gets fewer than 2 x rows x L entries; cu_seqlens go up to 2cp x that. */
        y->thd_cap = thd ? 2 * rowsL : rowsL / cp;
        if (thd && (rowsL > (uint64_t)INT32_MAX / 2 / cp))
            TF_FAIL(-EINVAL, "batch_size x seq_len x 2 x cp_size (%llu x %llu x 2 x %u) exceeds the int32 range of cu_seqlens in the THD layout: use a smaller batch",
                    (unsigned long long)cfg->batch_size, (unsigned long long)L, cp);
        y->in_b = y->thd_cap * osz;
        if (cfg->want & TF_WANT_POSITION_IDS) y->pos_b = y->thd_cap * 4;
        if (cfg->want & TF_WANT_LOSS_MASK) y->lm_b = y->thd_cap;
        if (thd) {
            y->cu_b = y->cup_b = (rowsL + 1) * 4;
            y->ns_b = 4;
        }
    } else {
        if (cfg->want & TF_WANT_POSITION_IDS) y->pos_b = rowsL * 4;
        if (cfg->want & TF_WANT_CU_SEQLENS) {
            y->cu_b = (rowsL + cfg->batch_size * kmax) * 4;
            y->ns_b = cfg->batch_size * kmax * 4;
        }
        if (cfg->want & TF_WANT_LOSS_MASK) y->lm_b = rowsL;
    }
    /* a mixture keeps per-row accounting for its per-source stats */
    y->acct_b = nsources ? cfg->batch_size * sizeof(tf__row_acct) : 0;
    return 0;
}

static void apply_layout(tf_loader *l, const layout *y) {
    l->hdr = align64(sizeof(struct tf_batch));
    l->off_pos = align64((size_t)y->tok);
    l->off_cu = l->off_pos + align64((size_t)y->pos_b);
    l->off_ns = l->off_cu + align64((size_t)y->cu_b);
    l->off_lm = l->off_ns + align64((size_t)y->ns_b);
    l->off_in = l->off_lm + align64((size_t)y->lm_b);
    l->off_lab = l->off_in + align64((size_t)y->in_b);
    l->off_cup = l->off_lab + align64((size_t)y->in_b);
    l->off_acct = l->off_cup + align64((size_t)y->cup_b);
    l->bytes = l->off_acct + align64((size_t)y->acct_b);
    if (l->bytes == 0) l->bytes = 64;
    l->cp_size = y->cp;
    l->thd = y->thd;
}

/* Per-source accounting of a mixture: the first sample id of each source. */
static int alloc_accounting(tf_loader *l, const tf_order *order, size_t nsources) {
    l->nsources = nsources;
    if (!nsources) return 0;
    l->source_first = calloc(nsources + 1, sizeof *l->source_first);
    l->src_samples = calloc(nsources, sizeof *l->src_samples);
    l->src_tokens = calloc(nsources, sizeof *l->src_tokens);
    l->src_docs = calloc(nsources, sizeof *l->src_docs);
    if (!l->source_first || !l->src_samples || !l->src_tokens || !l->src_docs) return -ENOMEM;
    for (size_t s = 0; s < nsources; s++)
        l->source_first[s + 1] = l->source_first[s] + tf_order_num_samples(tf_order_source(order, s));
    return 0;
}

/* The reader over the order's data (backend probe, context-parallel split,
 * zstd block cache) and the chunk scheduler of remote data. Undone by
 * detach_order; a loader re-attaches when a resume hands its mixture over to
 * another order. */
static int attach_order(tf_loader *l, const tf_order *order, const layout *y) {
    const tf_loader_config *cfg = &l->cfg;
    tf_order_config oc;
    TF_TRY(tf_order_get_config(order, &oc));
    l->order = order;
    l->ds = tf_order_dataset(order);
    l->npos = tf_order_num_positions(order);
    l->finite = l->npos != UINT64_MAX;
    int rc = tf__reader_init(&l->rd, l->ds, order, cfg->backend, cfg->direct_io, l->out_dtype);
    if (rc) {
        memset(&l->rd, 0, sizeof l->rd); /* it freed what it had */
        return rc;
    }
    l->rd.cp_size = y->cp;
    l->rd.cp_rank = cfg->cp_rank;
    l->rd.thd = y->thd;
    l->rd.cp_c = y->cp_c;
    l->rd.cp_first[0] = y->cp_first[0];
    l->rd.cp_first[1] = y->cp_first[1];
    l->rd.thd_cap_tokens = y->thd_cap;
    l->rd.thd_cap_seqs = y->rowsL;
    l->rd.nsources = l->nsources;
    l->rd.source_first = l->source_first;
    l->rd.bal = cfg->balance;
    l->rd.bal_world = cfg->world_size;
    l->rd.bal_rank = cfg->rank;
    l->rd.bal_micro = cfg->balance_micro_batches;
    l->rd.bal_B = cfg->batch_size;
    if (!l->nthreads) {
        /* Default worker count. mmap (CPU-bound copies from the page cache):
         * leave one core to the consumer, at most 4 - on 2 cores, 2 workers plus
         * the consumer measured ~25% slower than 1 worker. pread/io_uring (chosen
         * for cold data, where workers mostly wait on the device): 4, so that
         * about four batches' reads are in flight - cold shuffled io_uring went
         * from 80 M (1 worker) to 133-142 M tokens/s (4) on 2 cores. */
        int cores = tf__num_cpus();
        int cpu_default = cores - 1 < 4 ? cores - 1 : 4;
        l->nthreads = cfg->num_threads ? cfg->num_threads : (l->rd.backend == TF_BACKEND_MMAP ? cpu_default : 4);
        if (l->nthreads < 1) l->nthreads = 1;
        l->depth = cfg->prefetch_batches ? cfg->prefetch_batches : 2 * l->nthreads + 2;
        l->spin_ns = l->nthreads < cores ? 50 * 1000 : 0;
    }
    /* A full shuffle over mapped files reads a sample here, a sample there.
     * Under the kernel's default advice every fault on a page that is not
     * cached reads a readahead window around it: on a dataset larger than
     * memory (38 GiB on 23.5 GiB, virtio disk) that ran at ~0.3 M tokens/s
     * against a device good for 14-20 M at one request at a time, and at
     * 12 M with MADV_RANDOM, which makes a fault read what it touches.
     * Cached data is unaffected. */
    if (l->rd.backend == TF_BACKEND_MMAP && oc.shuffle == TF_SHUFFLE_FULL) tf__dataset_advise_random(l->ds);
    /* The zstd block cache is sized from the shuffle geometry (zcache.c). */
    tf__zgeom zg = {oc.shuffle, oc.packing, oc.seq_len, oc.block_size, oc.window_blocks, cfg->batch_size,
                    cfg->world_size, tf_order_num_samples(order), tf_order_num_sources(order), l->depth,
                    l->nthreads, cfg->zstd_cache_bytes};
    rc = tf__zcache_create(l->ds, &zg, &l->rd.zc);
    /* Compressed data: a batch takes the workers tens of microseconds of
     * decoding, so a consumer that waits for one would spin for most of it,
     * taking a core from the decoding workers or the training loop when cores
     * are short (on 2 shared cores: ~10 % more zstd tokens/s without it). */
    if (!rc && l->rd.zc) l->spin_ns = 0;
    if (!rc)
        rc = tf__engine_prefetch_create(order, l->B, l->G, l->rank, cfg->balance, cfg->balance_micro_batches, &l->pf,
                                        &l->pf_ctx);
    return rc;
}

static void detach_order(tf_loader *l) {
    tf__engine_prefetch_free(l->pf, l->pf_ctx);
    l->pf = NULL;
    l->pf_ctx = NULL;
    l->pf_started = 0;
    tf__reader_destroy(&l->rd);
    memset(&l->rd, 0, sizeof l->rd);
}

/* The ring: slots, the buffer pool and its per-array capacities, the lock. */
static int alloc_ring(tf_loader *l, const layout *y) {
    l->slots = calloc((size_t)l->depth, sizeof *l->slots);
    l->pool = calloc(1, sizeof *l->pool);
    if (!l->slots || !l->pool || init_sync(l)) return -ENOMEM;
    l->synced = 1;
    atomic_init(&l->pool->returned, NULL);
    atomic_init(&l->pool->refs, 1);
    size_t *cap = l->pool->seg_cap; /* what a stage copies out of a batch (tf__batch_segments) */
    cap[TF__SEG_TOKENS] = y->cp > 1 ? 0 : (size_t)y->tok; /* under CP: the workers' scratch */
    cap[TF__SEG_POSITION_IDS] = (size_t)y->pos_b;
    cap[TF__SEG_CU_SEQLENS] = (size_t)y->cu_b;
    cap[TF__SEG_NUM_SEQS] = y->thd ? 0 : (size_t)y->ns_b; /* THD: a count, not an array */
    cap[TF__SEG_LOSS_MASK] = (size_t)y->lm_b;
    cap[TF__SEG_INPUT_IDS] = cap[TF__SEG_LABELS] = (size_t)y->in_b;
    cap[TF__SEG_CU_SEQLENS_PADDED] = (size_t)y->cup_b;
    return 0;
}

/* The engine over an order (engine settings checked), in named steps. The
 * engine reads through tf_order_dataset(order), which for a mixture is a view
 * over every source's files, so the backends need no notion of sources. With
 * owns, the loader frees the order (on success). */
static int engine_create(const tf_order *order, int owns, const tf_loader_config *cfg, tf_loader **out) {
    tf_order_config oc;
    TF_TRY(tf_order_get_config(order, &oc));
    uint64_t G = cfg->batch_size * cfg->world_size; /* no overflow: check_engine_config */
    if (oc.global_batch != G)
        TF_FAIL(-EINVAL, "the order's global batch is %llu, but batch_size x world_size is %llu x %u = %llu: "
                "build the order with global_batch = batch_size x world_size",
                (unsigned long long)oc.global_batch, (unsigned long long)cfg->batch_size, cfg->world_size,
                (unsigned long long)G);
    uint64_t steprows; /* balancing holds a step's positions, twice (read.c, remote_glue.c) */
    if (cfg->balance != TF_BALANCE_NONE &&
        (tf__mul_overflow(G, cfg->balance_micro_batches, &steprows) || steprows > (uint64_t)SIZE_MAX / 16))
        TF_FAIL(-EINVAL, "balance: balance_micro_batches x global batch (%u x %llu) is too many rows to balance at once",
                cfg->balance_micro_batches, (unsigned long long)G);
    tf_dtype odt = cfg->out_dtype != TF_DTYPE_INVALID ? cfg->out_dtype : default_out_dtype(order);
    size_t nsources = tf_order_source(order, 0) != order ? tf_order_num_sources(order) : 0;
    layout y;
    TF_TRY(plan_layout(cfg, oc.seq_len, odt, nsources, &y));

    tf_loader *l = calloc(1, sizeof *l);
    if (!l) return -ENOMEM;
    l->cfg = *cfg;
    l->B = cfg->batch_size;
    l->G = G;
    l->L = oc.seq_len;
    l->rank = cfg->rank;
    l->out_dtype = odt;
    l->want = cfg->want;
    apply_layout(l, &y);
    atomic_init(&l->position, 0);
    atomic_init(&l->st_batches, 0);
    atomic_init(&l->st_tokens, 0);
    atomic_init(&l->st_wait_ns, 0);
    atomic_init(&l->alloc, NULL);
    atomic_init(&l->st_locked, 0);
    atomic_init(&l->owner, 0);
    tf__meter_init(&l->meter);
#ifdef TF_TEST_HOOKS
    const char *fd = getenv("TOKENFEED_FAULT_DELAY_MS");
    if (fd && *fd) l->fault_delay_ns = strtoull(fd, NULL, 10) * 1000000ull;
#endif
    int rc = alloc_accounting(l, order, nsources);
    if (!rc) rc = attach_order(l, order, &y);
    if (!rc) rc = alloc_ring(l, &y);
    if (!rc) rc = td_build(order, &l->td);
    if (rc) {
        tf_loader_free(l); /* the caller frees the order on failure */
        return rc;
    }
    l->owns_order = owns;
    *out = l;
    return 0;
}

/* Read another order from here on (a mixture handed over at a resume): the
 * same data and settings, so the layout and the ring stay; the threads, the
 * reader and the scheduler start over. The loader owns the new order. */
static int rebind_order(tf_loader *l, tf_order *order) {
    TF_TRY(after_fork(l));
    stop_threads(l);
    pthread_mutex_lock(&l->mu);
    reset_locked(l, atomic_load(&l->position));
    pthread_mutex_unlock(&l->mu);
    tf__reader old_rd = l->rd;
    tf__prefetch *old_pf = l->pf;
    void *old_ctx = l->pf_ctx;
    const tf_order *old_order = l->order;
    memset(&l->rd, 0, sizeof l->rd);
    l->pf = NULL;
    l->pf_ctx = NULL;
    l->pf_started = 0;
    layout y;
    tf_order_config oc;
    int rc = tf_order_get_config(order, &oc);
    if (!rc) rc = plan_layout(&l->cfg, oc.seq_len, l->out_dtype, l->nsources, &y);
    if (!rc) rc = attach_order(l, order, &y);
    if (rc) { /* keep reading the old order */
        detach_order(l);
        l->rd = old_rd;
        l->pf = old_pf;
        l->pf_ctx = old_ctx;
        l->order = old_order;
        l->ds = tf_order_dataset(old_order);
        l->npos = tf_order_num_positions(old_order);
        l->finite = l->npos != UINT64_MAX;
        return rc;
    }
    tf__engine_prefetch_free(old_pf, old_ctx);
    tf__reader_destroy(&old_rd);
    if (l->owns_order) tf_order_free((tf_order *)old_order);
    l->owns_order = 1;
    return 0;
}

/* A loader that builds and owns its order: a plain one (n == 0: dss[0]
 * alone) or a mixture of n datasets. */
static int loader_create(const tf_dataset *const *dss, const double *weights, size_t n,
                         const tf_loader_config *cfg, tf_loader **out) {
    TF_NEED_ARG_OF("tf_loader_create", out);
    *out = NULL;
    tf__clearerr();
    if (!dss || !dss[0] || !cfg) TF_FAIL(-EINVAL, "tf_loader_create: dataset and config must not be NULL");
    TF_TRY(check_engine_config(cfg));
    tf_order_config oc = cfg->order;
    oc.global_batch = cfg->batch_size * cfg->world_size;
    /* llm.c's processes, 0 (None): the data-parallel ranks that continue its run, as in Python; the order
     * records the number, so its state and fingerprint are those of that many processes */
    const tf__order_kind *kind = tf__order_kind_of((int)oc.order);
    if (kind && kind->processes_from_world && oc.llmc_processes == 0) oc.llmc_processes = cfg->world_size;
    tf_order *order = NULL;
    TF_TRY(n ? tf_order_create_mix(dss, weights, n, &oc, &order) : tf_order_create(dss[0], &oc, &order));
    int rc = engine_create(order, 1, cfg, out);
    if (rc) tf_order_free(order);
    return rc;
}

int tf_loader_create(const tf_dataset *ds, const tf_loader_config *cfg, tf_loader **out) {
    return loader_create(&ds, NULL, 0, cfg, out);
}

int tf_loader_create_mix(const tf_dataset *const *ds, const double *weights, size_t n,
                         const tf_loader_config *cfg, tf_loader **out) {
    if (!ds || n == 0) {
        if (out) *out = NULL;
        TF_FAIL(-EINVAL, "tf_loader_create_mix: at least one dataset is required");
    }
    return loader_create(ds, weights, n, cfg, out);
}

int tf_loader_get_config(const tf_loader *l, tf_loader_config *cfg) {
    if (!l || !cfg) TF_FAIL(-EINVAL, "tf_loader_get_config: loader and config must not be NULL");
    *cfg = l->cfg;
    return tf_order_get_config(l->order, &cfg->order);
}

int tf_loader_create_from_order(const tf_order *order, const tf_loader_config *cfg, tf_loader **out) {
    TF_NEED_ARG(out);
    *out = NULL;
    tf__clearerr();
    if (!order || !cfg) TF_FAIL(-EINVAL, "tf_loader_create_from_order: order and config must not be NULL");
    TF_TRY(check_engine_config(cfg));
    return engine_create(order, 0, cfg, out); /* borrowed: read only, never freed here */
}

void tf_loader_free(tf_loader *l) {
    if (!l) return;
    pid_t ow = atomic_load(&l->owner);
    int same_process = !ow || ow == getpid();
    if (same_process && l->synced) { /* else a loader whose creation failed: no ring, no threads */
        stop_threads(l);
        for (int i = 0; l->slots && i < l->depth; i++) {
            batch_free(l->slots[i].b);
            l->slots[i].b = NULL;
        }
        while (l->free_list) {
            tf_batch *n = l->free_list->next;
            batch_free(l->free_list);
            l->free_list = n;
        }
        pthread_mutex_destroy(&l->mu);
        pthread_cond_destroy(&l->work_cv);
        pthread_cond_destroy(&l->ready_cv);
    }
    /* In a forked child whose threads were the parent's, the worker state and
     * the possibly-locked mutex are left alone (see after_fork). */
    detach_order(l);
    if (l->owns_order) tf_order_free((tf_order *)l->order);
    free(l->slots);
    if (l->pool) {
        pool_drain_free(l->pool);
        pool_unref(l->pool);
    }
    free_accounting(l);
    tf__meter_destroy(&l->meter);
    /* no worker runs (a forked child's copy may count the parent's: leaked) */
    if (same_process && l->td) td_unref_locked(l->td);
    free(l);
}

/* Local indices of this rank left in the stream after pf_base (the
 * scheduler walks no further). */
static uint64_t pf_end(const tf_loader *l) {
    if (!l->finite) return UINT64_MAX;
    uint64_t base = l->pf_base;
    return l->npos > base ? (l->npos - base) / l->G * l->B : 0;
}

/* Epochs of a finite stream (its positions are those epochs rounded down to
 * whole global batches). */
static uint64_t epochs_of(const tf_loader *l) {
    tf_order_config oc;
    return tf_order_get_config(l->order, &oc) == 0 ? oc.epochs : 0;
}

/* Reset the pipeline at global position pos (mu held). */
static void reset_locked(tf_loader *l, uint64_t pos) {
    l->gen++;
    l->base = pos;
    l->next_claim = l->next_deliver = 0;
    for (int i = 0; i < l->depth; i++) {
        tf__slot *s = &l->slots[i];
        if (s->ready) put_buffer_locked(l, s->b);
        s->b = NULL;
        s->ready = 0;
    }
    pthread_cond_broadcast(&l->work_cv);
}

/* next, step 1: threads (after a fork: this process's own) and the chunk
 * scheduler running, and the workers unpaused after a failed batch. */
static int next_start(tf_loader *l) {
    TF_TRY(after_fork(l));
    if (!atomic_load(&l->owner)) TF_TRY(start_threads(l));
    if (l->pf && !l->pf_started) {
        l->pf_base = atomic_load(&l->position);
        tf__prefetch_seek(l->pf, l->pf_base, 0, pf_end(l));
        l->pf_started = 1;
    }
    return 0;
}

/* next, step 2 (mu held): wait until slot s is ready, up to timeout_ns
 * (UINT64_MAX: for ever). -TF_ENOTREADY when the time ran out first. */
static int next_wait_ready(tf_loader *l, tf__slot *s, uint64_t timeout_ns) {
    if (s->ready) return 0;
    uint64_t t0 = tf__now_ns();
    /* Spin briefly before sleeping when a core is free for it (workers <
     * cores): a futex sleep and wake-up per batch cost ~30% of the CPU
     * time in perf on the 2-core VM, more than assembling the batch.
     * With as many workers as cores, spinning would take a worker's core,
     * so the consumer sleeps at once. seek/next/free are not concurrent,
     * so the slot cannot change meaning while mu is released. */
    if (l->spin_ns) {
        pthread_mutex_unlock(&l->mu);
        while (!atomic_load_explicit(&s->ready, memory_order_acquire) && tf__now_ns() - t0 < l->spin_ns)
            tf__cpu_relax();
        pthread_mutex_lock(&l->mu);
    }
    struct timespec dl = {0, 0};
    if (timeout_ns != UINT64_MAX) dl = tf__deadline_after(timeout_ns);
    int timed_out = 0;
    while (!s->ready) {
        if (timeout_ns == UINT64_MAX) {
            pthread_cond_wait(&l->ready_cv, &l->mu);
        } else if (pthread_cond_timedwait(&l->ready_cv, &l->mu, &dl) == ETIMEDOUT && !s->ready) {
            timed_out = 1;
            break;
        }
    }
    atomic_fetch_add_explicit(&l->st_wait_ns, tf__now_ns() - t0, memory_order_relaxed);
    return timed_out ? -TF_ENOTREADY : 0; /* not an error: the binding polls */
}

/* next, step 3 (mu held, released): the batch of slot s failed. Its buffer
 * goes back, the pipeline restarts at pos and pauses, so that the same
 * batch is tried again on the next call, not before. Returns its failure. */
static int next_fail(tf_loader *l, tf__slot *s, uint64_t pos) {
    char err[TF__ERRMSG];
    int rc = s->rc;
    memcpy(err, s->err, sizeof err);
    s->ready = 0; /* reset_locked returns the buffer */
    put_buffer_locked(l, s->b);
    s->b = NULL;
    reset_locked(l, pos);
    l->paused = 1;
    pthread_mutex_unlock(&l->mu);
    return tf__seterr(rc, "%s", err);
}

/* next, step 4 (no lock): batch b at global position pos is handed out: the
 * position, the scheduler and the counters move on. */
static void next_deliver(tf_loader *l, tf_batch *b, uint64_t pos) {
    atomic_store_explicit(&l->position, pos + l->G, memory_order_release);
    if (l->pf) tf__prefetch_advance(l->pf, (pos + l->G - l->pf_base) / l->G * l->B);
    atomic_fetch_add_explicit(&l->st_batches, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&l->st_tokens, l->cp_size > 1 ? b->view.num_tokens : l->B * (l->L + 1),
                              memory_order_relaxed);
    for (size_t j = 0; b->acct && j < l->B; j++) {
        const tf__row_acct *a = &b->acct[j];
        atomic_fetch_add_explicit(&l->src_samples[a->source], 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&l->src_tokens[a->source], a->tokens, memory_order_relaxed);
        atomic_fetch_add_explicit(&l->src_docs[a->source], a->documents, memory_order_relaxed);
    }
    atomic_fetch_add_explicit(&l->pool->refs, 1, memory_order_relaxed);
}

static int next_timed(tf_loader *l, tf_batch **out, uint64_t timeout_ns) {
    TF_NEED_ARG_OF("tf_loader_next", out);
    *out = NULL;
    TF_NEED_ARG_OF("tf_loader_next", l);
    /* a skipped range (tf_order_skip) that starts here: continue after it */
    uint64_t at = atomic_load_explicit(&l->position, memory_order_acquire), to = tf_order_skip_to(l->order, at);
    if (to != at) TF_TRY(tf_loader_seek(l, to));
    TF_TRY(next_start(l));

    pthread_mutex_lock(&l->mu);
    if (l->paused) {
        l->paused = 0;
        pthread_cond_broadcast(&l->work_cv);
    }
    uint64_t k = l->next_deliver, pos = l->base + k * l->G;
    int ok;
    batch_pos(l, k, &ok);
    if (!ok) {
        pthread_mutex_unlock(&l->mu);
        TF_FAIL(-TF_EEOF, "end of stream: position %llu + global batch %llu exceeds the %llu positions of %llu epoch(s)",
                (unsigned long long)pos, (unsigned long long)l->G, (unsigned long long)l->npos,
                (unsigned long long)epochs_of(l));
    }
    tf__slot *s = &l->slots[k % (uint64_t)l->depth];
    int rc = next_wait_ready(l, s, timeout_ns);
    if (rc) {
        pthread_mutex_unlock(&l->mu);
        return rc;
    }
    if (s->rc) return next_fail(l, s, pos);
    tf_batch *b = s->b;
    s->b = NULL;
    s->ready = 0;
    l->next_deliver++;
    pthread_cond_signal(&l->work_cv);
    pthread_mutex_unlock(&l->mu);

    next_deliver(l, b, pos);
    *out = b;
    return 0;
}

/* Batches assembled behind the next one the consumer will take (consecutive
 * ready slots from next_deliver), for the meter. */
static uint32_t ready_ahead(tf_loader *l) {
    uint32_t n = 0;
    pthread_mutex_lock(&l->mu);
    for (uint64_t k = l->next_deliver; n < (uint32_t)l->depth; k++, n++) {
        const tf__slot *s = &l->slots[k % (uint64_t)l->depth];
        if (!s->ready || s->rc) break;
    }
    pthread_mutex_unlock(&l->mu);
    return n;
}

/* next_timed between the data-wait meter's marks (meter.h). */
int tf_loader_next_timed(tf_loader *l, tf_batch **out, uint64_t timeout_ns) {
    if (l) tf__meter_enter(&l->meter);
    int rc = next_timed(l, out, timeout_ns);
    if (l) tf__meter_leave(&l->meter, rc, rc ? 0 : ready_ahead(l));
    return rc;
}

int tf_loader_next(tf_loader *l, tf_batch **out) { return tf_loader_next_timed(l, out, UINT64_MAX); }

void tf_loader_get_meter(const tf_loader *l, uint32_t window, tf_meter *m) {
    if (!m) return;
    memset(m, 0, sizeof *m);
    if (l) tf__meter_get(&((tf_loader *)l)->meter, window, m);
}

uint64_t tf_loader_position(const tf_loader *l) {
    return l ? atomic_load_explicit(&((tf_loader *)l)->position, memory_order_acquire) : 0;
}

const tf_order *tf_loader_order(const tf_loader *l) { return l ? l->order : NULL; }

int tf_loader_exclude(tf_loader *l, size_t source, const uint64_t *ids, size_t n) {
    TF_NEED_ARG(l);
    if (n) TF_NEED_ARG(ids);
    uint64_t pos = tf_loader_position(l);
    /* the order is the loader's or the caller's, who gave it to be read and
     * takes documents down through the loader that reads it */
    TF_TRY(tf_order_exclude((tf_order *)l->order, pos, source, ids, n));
    return tf_loader_seek(l, pos); /* batches assembled ahead held the documents */
}

int tf_loader_seek(tf_loader *l, uint64_t pos) {
    TF_NEED_ARG(l);
    if (pos % l->G)
        TF_FAIL(-EINVAL, "seek: position %llu is not a multiple of the global batch %llu (batch_size x world_size); "
                "positions count samples of the whole stream",
                (unsigned long long)pos, (unsigned long long)l->G);
    if (l->finite && pos > l->npos)
        TF_FAIL(-EINVAL, "seek: position %llu is past the end of the stream, which has %llu positions (%llu epoch(s) of "
                "%llu samples, rounded down to whole global batches of %llu)",
                (unsigned long long)pos, (unsigned long long)l->npos, (unsigned long long)epochs_of(l),
                (unsigned long long)tf_order_num_samples(l->order), (unsigned long long)l->G);
    TF_TRY(after_fork(l));
    tf__takedowns *td;
    TF_TRY(td_build(l->order, &td)); /* the order's takedowns now: batches from here on leave them out */
    pthread_mutex_lock(&l->mu);
    reset_locked(l, pos);
    l->paused = 0;
    tf__takedowns *old = l->td;
    l->td = td;
    td_unref_locked(old);
    pthread_mutex_unlock(&l->mu);
    atomic_store_explicit(&l->position, pos, memory_order_release);
    if (l->pf) {
        l->pf_base = pos;
        tf__prefetch_seek(l->pf, pos, 0, pf_end(l));
        l->pf_started = 1;
    }
    return 0;
}

void tf_batch_get_view(const tf_batch *b, tf_batch_view *view) {
    if (!view) return;
    if (!b) {
        memset(view, 0, sizeof *view);
        return;
    }
    *view = b->view;
    if (view->cp_size > 1) view->tokens = NULL; /* only this rank's ranges were read there */
}

const char *const tf__seg_names[TF__NSEGS] = {"tokens",    "position_ids", "cu_seqlens", "num_seqs",
                                               "loss_mask", "input_ids",    "labels",     "cu_seqlens_padded"};

void tf__batch_segments(const tf_batch *b, tf__batch_seg seg[TF__NSEGS]) {
    const tf_batch_view *v = &b->view;
    void *host[TF__NSEGS] = {v->tokens,    v->position_ids, v->cu_seqlens, v->num_seqs,
                             v->loss_mask, v->input_ids,    v->labels,     v->cu_seqlens_padded};
    size_t tok = 0, seqs = 0; /* THD: entries used of the token arrays and of cu_seqlens */
    if (v->cp_size > 1 && v->thd) {
        tok = (size_t)v->num_tokens;
        seqs = (size_t)v->num_seqs[0] + 1;
    }
    for (int j = 0; j < TF__NSEGS; j++) {
        size_t cap = b->seg_cap[j], bytes = cap;
        if (tok || seqs) {
            switch (j) {
            case TF__SEG_INPUT_IDS:
            case TF__SEG_LABELS: bytes = tok * tf_dtype_size(v->dtype); break;
            case TF__SEG_POSITION_IDS: bytes = tok * 4; break;
            case TF__SEG_LOSS_MASK: bytes = tok; break;
            case TF__SEG_CU_SEQLENS:
            case TF__SEG_CU_SEQLENS_PADDED: bytes = seqs * 4; break;
            default: break;
            }
            if (bytes > cap) bytes = cap; /* (cannot happen: the fill stays within its room) */
        }
        seg[j].host = cap ? host[j] : NULL;
        seg[j].bytes = cap ? bytes : 0;
        seg[j].cap = cap;
    }
}

void tf_batch_release(tf_batch *b) {
    if (!b) return;
    tf__pool *p = b->pool;
    tf_batch *head = atomic_load_explicit(&p->returned, memory_order_relaxed);
    do {
        b->next = head;
    } while (!atomic_compare_exchange_weak_explicit(&p->returned, &head, b, memory_order_release,
                                                    memory_order_relaxed));
    pool_unref(p);
}

void tf_loader_get_stats(const tf_loader *cl, tf_loader_stats *st) {
    if (!st) return;
    memset(st, 0, sizeof *st);
    if (!cl) return;
    tf_loader *l = (tf_loader *)cl;
    st->batches = atomic_load(&l->st_batches);
    st->tokens = atomic_load(&l->st_tokens);
    st->bytes_read = atomic_load(&l->rd.bytes_read);
    st->wait_ns = atomic_load(&l->st_wait_ns);
    st->ring_slots = (uint64_t)l->depth;
    st->num_threads = l->nthreads;
    st->backend = l->rd.backend;
    pid_t ow = atomic_load(&l->owner);
    if (!ow || ow == getpid()) {
        pthread_mutex_lock(&l->mu);
        for (int i = 0; i < l->depth; i++) st->ring_ready += l->slots[i].ready && !l->slots[i].rc;
        pthread_mutex_unlock(&l->mu);
    }
    /* The backend the workers actually use: io_uring may have fallen back on
     * every one of them after the create-time probe succeeded. */
    if (st->backend == TF_BACKEND_IO_URING && ow == getpid() &&
        atomic_load(&l->rd.uring_workers) == 0)
        st->backend = TF_BACKEND_PREAD;
    tf__reader_get_note(&l->rd, st->backend_note, sizeof st->backend_note);
    if (l->rd.zc) {
        tf__zinfo zi;
        tf__zcache_info(l->rd.zc, &zi);
        st->zstd_cache_bytes = zi.capacity_bytes;
        st->zstd_cache_allocated = zi.allocated_bytes;
        st->zstd_blocks_decoded = zi.blocks_decoded;
        st->zstd_tokens_decoded = zi.tokens_decoded;
        st->zstd_tokens_used = zi.tokens_used;
        st->zstd_cache_hits = zi.hits;
        st->zstd_cache_misses = zi.misses;
        st->zstd_cache_waits = zi.waits;
        st->zstd_decode_ratio = zi.tokens_used ? (double)zi.tokens_decoded / (double)zi.tokens_used : 0.0;
        st->zstd_decode_model = zi.model;
        snprintf(st->zstd_note, sizeof st->zstd_note, "%s", zi.note);
    }
}

/* ------------------------------------------------------------------------ */
/* hand-off to the device stage                                              */
/* ------------------------------------------------------------------------ */

void tf__loader_set_allocator(tf_loader *l, const tf__buffer_allocator *a) {
    atomic_store_explicit(&l->alloc, a, memory_order_release);
}

int tf__batch_locked(const tf_batch *b) { return b && b->locked; }

uint64_t tf__loader_locked_buffers(const tf_loader *l) {
    return atomic_load_explicit(&((tf_loader *)l)->st_locked, memory_order_relaxed);
}

int tf_loader_get_source_stats(const tf_loader *cl, size_t i, tf_source_stats *st) {
    if (!cl) return tf__seterr(-EINVAL, "%s: the argument l is NULL", __func__);
    TF_NEED_ARG(st);
    tf_loader *l = (tf_loader *)cl;
    if (!l->nsources)
        TF_FAIL(-EINVAL, "per-source stats are kept for mixtures; this loader reads one dataset (see tf_loader_get_stats)");
    if (i >= l->nsources)
        TF_FAIL(-ERANGE, "source %zu out of range: the mixture has %zu sources", i, l->nsources);
    st->samples = atomic_load(&l->src_samples[i]);
    st->tokens = atomic_load(&l->src_tokens[i]);
    st->documents = atomic_load(&l->src_docs[i]);
    return 0;
}


/* ------------------------------------------------------------------------ */
/* state                                                                     */
/* ------------------------------------------------------------------------ */

int tf_loader_state_save(const tf_loader *l, char *buf, size_t cap, size_t *len) {
    TF_NEED_ARG(l);
    return tf_order_state_save(l->order, tf_loader_position(l), l->cfg.world_size, buf, cap, len);
}

int tf_loader_state_load(tf_loader *l, const char *state, size_t len, unsigned flags) {
    TF_NEED_ARG(l);
    TF_NEED_ARG(state);
    uint64_t pos;
    tf_order *handover = NULL;
    TF_TRY(tf_order_state_load(l->order, state, len, flags, &pos, &handover));
    if (handover) {
        int rc = rebind_order(l, handover);
        if (rc) {
            tf_order_free(handover);
            return rc;
        }
    }
    return tf_loader_seek(l, pos);
}
