/*
 * remote_prefetch.c — the scheduler that fetches remote chunks ahead of the
 * consumer, in the order of their first use (docs/remote.md, "The
 * scheduler").
 *
 * DESIGN
 *
 * One scheduler per loader. It knows this rank's positions (batch b covers
 * global positions base + b*G + rank*B ... + B - 1, numbered here by a local
 * index i = b*B + j) and asks the caller's locate() callback which chunks
 * position i needs. A thread walks the local indices ahead of the consumer
 * and keeps a window:
 *
 *   entries   a FIFO, in walk order, of runs (first, last, chunk): the chunk
 *             is used at every index of [first, last] (consecutive uses are
 *             merged, so reading a chunk sequentially costs one entry).
 *   chunks    a hash of the distinct chunks in the window, each with its
 *             bytes, its earliest entry (head) and latest (tail) linked
 *             through the FIFO, and when it was last asked for.
 *
 * Each tick: entries whose last use the consumer has passed are popped (a
 * chunk whose last entry goes leaves the window); the walk extends the window
 * until its distinct chunks add up to prefetch_bytes (or the stream ends, or a
 * per-tick walk budget is spent); the chunks are asked for in FIFO order,
 * i.e. in the order of first use; and the next use of every chunk whose head
 * moved is published to the cache index, where eviction reads it.
 *
 * The thread sleeps on `cv` until the consumer moves (tf__prefetch_advance,
 * tf__prefetch_seek) or 100 ms pass. It holds `mu` only to read and write the
 * consumer position and the stop flag: the window belongs to the thread.
 * locate() runs on the scheduler thread, outside `mu`.
 *
 * Stopping is prompt whatever the walk is doing. locate() may open a shard
 * known only from a catalog (its first touch: a round of requests), and one
 * tick may walk many positions: the walk looks at `cancel` before every
 * position, and the thread names `cancel` as its stop flag
 * (tf__thread_cancel_on), so that a first touch waiting for its requests
 * gives up with -EINTR the moment tf__prefetch_free sets it (the requests
 * are left to end on the fetch pool, as an interrupted reader's are; the
 * shard is opened again by whoever needs it next).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "remote.h"

#define NONE UINT64_MAX
#define WALK_PER_TICK 65536u  /* local indices walked per tick, at most */
#define REWANT_TICKS 8        /* ask again for window chunks every this many ticks */
#define MAX_PER_SAMPLE 64     /* distinct chunks of one sample considered for run merging */

typedef struct pf_entry {
    uint64_t first, last; /* local indices */
    uint32_t chunk;       /* index into chunks */
    uint64_t next;        /* next entry (absolute FIFO index) of the same chunk, or NONE */
} pf_entry;

typedef struct pf_chunk {
    const tf__robj *o;
    uint32_t k;
    uint32_t used;        /* slot in use */
    uint64_t bytes;
    uint64_t head, tail;  /* absolute FIFO indices */
    uint64_t published;   /* local index last published as its next use */
    uint64_t want_tick;   /* tick of the last want (0: never) */
    uint32_t hnext;       /* hash chain, UINT32_MAX ends */
} pf_chunk;

struct tf__prefetch {
    tf_remote *r;
    tf__prefetch_locate_fn locate;
    void *ctx;
    uint64_t B, G, rank;
    uint64_t end_index; /* local indices available (UINT64_MAX: infinite; under mu, read by the thread) */
    uint64_t prefetch_bytes;

    pthread_t thread;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
    volatile int cancel; /* set once, by free, outside mu: read by the walk and by its waits */
    uint64_t base;       /* global position of local index 0 (under mu) */
    uint64_t consumer;   /* local index the consumer will receive next (under mu) */
    uint64_t gen;        /* bumped by seek (under mu) */

    /* window (scheduler thread only) */
    uint64_t wgen, wbase, cursor;
    pf_entry *ents;
    uint64_t ecap, efront, eback; /* absolute indices; slot = i % ecap */
    pf_chunk *chunks;
    uint32_t ccap, cfree;
    uint32_t *hash;
    uint32_t hcap;
    uint64_t window_bytes;
    uint64_t tick;

    /* scratch */
    tf__ckey *pkeys;
    uint64_t *puses;
    tf_remote **prem;
    size_t pcap;
    uint32_t sample_chunks[MAX_PER_SAMPLE];
    size_t nsample;
    uint64_t cur_index;

    /* stats */
    _Atomic uint64_t st_walked, st_wants, st_ticks, st_window_bytes;
};

static uint64_t pos_of(const tf__prefetch *p, uint64_t base, uint64_t i) {
    return base + (i / p->B) * p->G + p->rank * p->B + i % p->B;
}

static uint32_t hkey(const tf__prefetch *p, const tf__robj *o, uint32_t k) {
    return (uint32_t)(tf__mix64((uint64_t)(uintptr_t)o * 31 + k) & (p->hcap - 1));
}

static void window_clear(tf__prefetch *p) {
    p->efront = p->eback = 0;
    p->window_bytes = 0;
    for (uint32_t i = 0; i < p->hcap; i++) p->hash[i] = UINT32_MAX;
    p->cfree = UINT32_MAX;
    for (uint32_t i = p->ccap; i-- > 0;) {
        p->chunks[i].used = 0;
        p->chunks[i].hnext = p->cfree;
        p->cfree = i;
    }
}

static int grow_chunks(tf__prefetch *p) {
    uint32_t nc = p->ccap ? p->ccap * 2 : 1024;
    pf_chunk *c = realloc(p->chunks, nc * sizeof *c);
    if (!c) return -ENOMEM;
    p->chunks = c;
    for (uint32_t i = nc; i-- > p->ccap;) {
        c[i].used = 0;
        c[i].hnext = p->cfree;
        p->cfree = i;
    }
    p->ccap = nc;
    /* keep the hash at least twice the chunk slots */
    if (p->hcap < 2 * nc) {
        uint32_t nh = p->hcap ? p->hcap : 2048;
        while (nh < 2 * nc) nh *= 2;
        uint32_t *h = malloc(nh * sizeof *h);
        if (!h) return -ENOMEM;
        free(p->hash);
        p->hash = h;
        p->hcap = nh;
        for (uint32_t i = 0; i < nh; i++) h[i] = UINT32_MAX;
        for (uint32_t i = 0; i < p->ccap; i++) {
            if (!c[i].used) continue;
            uint32_t s = hkey(p, c[i].o, c[i].k);
            c[i].hnext = h[s];
            h[s] = i;
        }
    }
    return 0;
}

static int64_t chunk_find_or_add(tf__prefetch *p, const tf__robj *o, uint32_t k) {
    uint32_t s = hkey(p, o, k);
    for (uint32_t i = p->hash[s]; i != UINT32_MAX; i = p->chunks[i].hnext)
        if (p->chunks[i].o == o && p->chunks[i].k == k) return i;
    if (p->cfree == UINT32_MAX) {
        if (grow_chunks(p)) return -ENOMEM;
        s = hkey(p, o, k);
    }
    uint32_t i = p->cfree;
    pf_chunk *c = &p->chunks[i];
    p->cfree = c->hnext;
    memset(c, 0, sizeof *c);
    c->o = o;
    c->k = k;
    c->used = 1;
    uint64_t off = (uint64_t)k * o->chunk_bytes;
    c->bytes = o->data_len - off < o->chunk_bytes ? o->data_len - off : o->chunk_bytes;
    c->head = c->tail = NONE;
    c->published = NONE;
    c->hnext = p->hash[s];
    p->hash[s] = i;
    p->window_bytes += c->bytes;
    return i;
}

static void chunk_remove(tf__prefetch *p, uint32_t i) {
    pf_chunk *c = &p->chunks[i];
    uint32_t *q = &p->hash[hkey(p, c->o, c->k)];
    while (*q != i) q = &p->chunks[*q].hnext;
    *q = c->hnext;
    p->window_bytes -= c->bytes;
    c->used = 0;
    c->hnext = p->cfree;
    p->cfree = i;
}

static pf_entry *ent(tf__prefetch *p, uint64_t i) { return &p->ents[i % p->ecap]; }

static int push_entry(tf__prefetch *p, uint64_t idx, uint32_t ci) {
    if (p->eback - p->efront == p->ecap) {
        uint64_t nc = p->ecap ? p->ecap * 2 : 4096;
        pf_entry *ne = malloc(nc * sizeof *ne);
        if (!ne) return -ENOMEM;
        for (uint64_t i = p->efront; i < p->eback; i++) ne[i % nc] = p->ents[i % p->ecap];
        free(p->ents);
        p->ents = ne;
        p->ecap = nc;
    }
    uint64_t e = p->eback++;
    *ent(p, e) = (pf_entry){idx, idx, ci, NONE};
    pf_chunk *c = &p->chunks[ci];
    if (c->tail != NONE) ent(p, c->tail)->next = e;
    else c->head = e;
    c->tail = e;
    return 0;
}

/* locate() callback target: chunk k of o is used by the sample being walked. */
static void on_chunk(void *ctx, const tf__robj *o, uint32_t k) {
    tf__prefetch *p = ctx;
    if (!o || k >= o->nchunks) return;
    int64_t ci = chunk_find_or_add(p, o, k);
    if (ci < 0) return;
    for (size_t j = 0; j < p->nsample; j++)
        if (p->sample_chunks[j] == (uint32_t)ci) return; /* already counted for this sample */
    if (p->nsample < MAX_PER_SAMPLE) p->sample_chunks[p->nsample++] = (uint32_t)ci;
    pf_chunk *c = &p->chunks[ci];
    uint64_t idx = p->cur_index;
    if (c->tail != NONE && ent(p, c->tail)->last + 1 >= idx) {
        ent(p, c->tail)->last = idx; /* a consecutive use: extend the run */
        return;
    }
    push_entry(p, idx, (uint32_t)ci);
}

static int ensure_scratch(tf__prefetch *p, size_t n) {
    if (n <= p->pcap) return 0;
    size_t nc = n * 2;
    tf__ckey *k = realloc(p->pkeys, nc * sizeof *k);
    if (!k) return -ENOMEM;
    p->pkeys = k;
    uint64_t *u = realloc(p->puses, nc * sizeof *u);
    if (!u) return -ENOMEM;
    p->puses = u;
    tf_remote **rm = realloc(p->prem, nc * sizeof *rm);
    if (!rm) return -ENOMEM;
    p->prem = rm;
    p->pcap = nc;
    return 0;
}

/* One pass over the window (scheduler thread; mu not held). */
static void tick(tf__prefetch *p, uint64_t base, uint64_t consumer, uint64_t end) {
    p->tick++;
    atomic_fetch_add_explicit(&p->st_ticks, 1, memory_order_relaxed);
    if (p->cursor < consumer) {
        /* the consumer overtook the walk: start again from it */
        window_clear(p);
        p->cursor = consumer;
    }
    /* drop what the consumer has passed */
    while (p->efront < p->eback && ent(p, p->efront)->last < consumer) {
        pf_entry *e = ent(p, p->efront);
        pf_chunk *c = &p->chunks[e->chunk];
        c->head = e->next;
        if (c->head == NONE) chunk_remove(p, e->chunk);
        p->efront++;
    }
    /* walk ahead */
    uint64_t walked = 0;
    while (p->cursor < end && p->window_bytes < p->prefetch_bytes && walked < WALK_PER_TICK &&
           !__atomic_load_n(&p->cancel, __ATOMIC_ACQUIRE)) {
        p->nsample = 0;
        p->cur_index = p->cursor;
        if (p->locate(p->ctx, pos_of(p, base, p->cursor), on_chunk, p) < 0) break;
        p->cursor++;
        walked++;
    }
    atomic_fetch_add_explicit(&p->st_walked, walked, memory_order_relaxed);
    atomic_store_explicit(&p->st_window_bytes, p->window_bytes, memory_order_relaxed);
    /* ask for the chunks in the order of first use */
    for (uint64_t i = p->efront; i < p->eback; i++) {
        pf_entry *e = ent(p, i);
        pf_chunk *c = &p->chunks[e->chunk];
        if (c->head != i) continue; /* only a chunk's earliest entry */
        if (c->want_tick && p->tick - c->want_tick < REWANT_TICKS) continue;
        uint64_t use = e->first > consumer ? e->first : consumer;
        tf__chunk_want(c->o, c->k, pos_of(p, base, use));
        c->want_tick = p->tick;
        atomic_fetch_add_explicit(&p->st_wants, 1, memory_order_relaxed);
    }
    /* publish the next uses that moved, grouped by remote store (a dataset
     * may mix stores; almost always there is one) */
    size_t n = 0;
    for (uint64_t i = p->efront; i < p->eback; i++) {
        pf_entry *e = ent(p, i);
        pf_chunk *c = &p->chunks[e->chunk];
        if (c->head != i) continue;
        uint64_t use = e->first > consumer ? e->first : consumer;
        if (c->published == use) continue;
        if (ensure_scratch(p, n + 1)) break;
        p->pkeys[n] = (tf__ckey){c->o->oid_lo, c->o->oid_hi, c->k};
        p->puses[n] = pos_of(p, base, use);
        p->prem[n] = c->o->r;
        n++;
        c->published = use;
    }
    /* the consumer's global batch start: needs below it are stale */
    uint64_t at = base + (consumer / p->B) * p->G;
    tf__remote_publish(p->r, NULL, NULL, 0, at);
    size_t done = 0;
    while (done < n) {
        tf_remote *rr = p->prem[done];
        size_t m = done;
        for (size_t j = done; j < n; j++) {
            if (p->prem[j] != rr) continue;
            tf__ckey k = p->pkeys[j];
            uint64_t u = p->puses[j];
            p->pkeys[j] = p->pkeys[m];
            p->puses[j] = p->puses[m];
            p->prem[j] = p->prem[m];
            p->pkeys[m] = k;
            p->puses[m] = u;
            p->prem[m] = rr;
            m++;
        }
        tf__remote_publish(rr, p->pkeys + done, p->puses + done, m - done, at);
        done = m;
    }
}

static void *pf_main(void *arg) {
    tf__prefetch *p = arg;
    tf__thread_cancel_on(&p->cancel); /* its waits (a first touch's requests) end when it is stopped */
    pthread_mutex_lock(&p->mu);
    uint64_t seen_consumer = UINT64_MAX, seen_gen = UINT64_MAX;
    for (;;) {
        if (p->stop) break;
        if (p->consumer == seen_consumer && p->gen == seen_gen) {
            struct timespec ts = tf__deadline_after(100 * 1000 * 1000);
            pthread_cond_timedwait(&p->cv, &p->mu, &ts);
            if (p->stop) break;
        }
        uint64_t base = p->base, consumer = p->consumer, gen = p->gen, end = p->end_index;
        seen_consumer = consumer;
        seen_gen = gen;
        pthread_mutex_unlock(&p->mu);
        if (gen != p->wgen) {
            window_clear(p);
            p->wgen = gen;
            p->cursor = consumer;
        }
        tick(p, base, consumer, end);
        pthread_mutex_lock(&p->mu);
        /* more to walk right away when the budget, not the window, stopped us */
        if (p->window_bytes < p->prefetch_bytes && p->cursor < p->end_index && p->gen == gen)
            seen_consumer = UINT64_MAX;
    }
    pthread_mutex_unlock(&p->mu);
    tf__thread_cancel_on(NULL);
    return NULL;
}

int tf__prefetch_create(tf_remote *r, tf__prefetch_locate_fn locate, void *ctx, uint64_t B, uint64_t G, uint64_t rank,
                        uint64_t end_index, tf__prefetch **out) {
    *out = NULL;
    if (!r || !locate || !B || !G) return -EINVAL;
    tf__prefetch *p = calloc(1, sizeof *p);
    if (!p) return -ENOMEM;
    p->r = tf__remote_ref(r);
    p->locate = locate;
    p->ctx = ctx;
    p->B = B;
    p->G = G;
    p->rank = rank;
    p->end_index = end_index;
    p->prefetch_bytes = tf__remote_prefetch_bytes(r);
    p->wgen = UINT64_MAX;
    pthread_mutex_init(&p->mu, NULL); /* on Linux neither fails without attributes that need resources */
    tf__cond_init(&p->cv);
    if (grow_chunks(p)) {
        tf__prefetch_free(p);
        return -ENOMEM;
    }
    window_clear(p);
    *out = p;
    return 0;
}

/* Start the thread on first use (lazily, as the loader's workers). mu held. */
static void ensure_thread(tf__prefetch *p) {
    if (p->started) return;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    p->started = pthread_create(&p->thread, NULL, pf_main, p) == 0;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

void tf__prefetch_seek(tf__prefetch *p, uint64_t base, uint64_t consumer_index, uint64_t end_index) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->base = base;
    p->end_index = end_index;
    p->consumer = consumer_index;
    p->gen++;
    ensure_thread(p);
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

void tf__prefetch_advance(tf__prefetch *p, uint64_t consumer_index) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    if (consumer_index != p->consumer) {
        p->consumer = consumer_index;
        ensure_thread(p);
        pthread_cond_signal(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
}

void tf__prefetch_forget_thread(tf__prefetch *p) {
    /* after fork(): the thread does not exist in this process */
    if (!p) return;
    p->started = 0;
    pthread_mutex_init(&p->mu, NULL);
    tf__cond_init(&p->cv);
    p->wgen = UINT64_MAX;
}

void tf__prefetch_free(tf__prefetch *p) {
    if (!p) return;
    /* first, outside mu: a tick in progress (a first touch waiting for its
     * requests, a long walk) ends at once */
    __atomic_store_n(&p->cancel, 1, __ATOMIC_RELEASE);
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_signal(&p->cv);
    int started = p->started;
    pthread_mutex_unlock(&p->mu);
    if (started) pthread_join(p->thread, NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->ents);
    free(p->chunks);
    free(p->hash);
    free(p->pkeys);
    free(p->puses);
    free(p->prem);
    tf_remote_free(p->r);
    free(p);
}

void tf__prefetch_stats(tf__prefetch *p, uint64_t *walked, uint64_t *wants, uint64_t *window_bytes) {
    if (walked) *walked = p ? atomic_load(&p->st_walked) : 0;
    if (wants) *wants = p ? atomic_load(&p->st_wants) : 0;
    if (window_bytes) *window_bytes = p ? atomic_load(&p->st_window_bytes) : 0;
}
