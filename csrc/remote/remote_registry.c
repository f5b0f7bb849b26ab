/*
 * remote_registry.c — the objects a remote open has prepared (remote_open.c),
 * and how the file primitives (file.c) find them while the format parsers
 * run: one registry per thread, set for the duration of one open. It sits
 * below both, so that the openers and the primitives never call each other
 * in a circle.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "remote.h"

static pthread_key_t reg_key;
static pthread_once_t reg_once = PTHREAD_ONCE_INIT;
static int reg_key_ok;
static void reg_init(void) { reg_key_ok = pthread_key_create(&reg_key, NULL) == 0; }

static tf__preg *cur_reg(void) {
    pthread_once(&reg_once, reg_init);
    return reg_key_ok ? pthread_getspecific(reg_key) : NULL;
}

static int map_take(const char *url, void **map, size_t *len);
static int exists(const char *url);
static const tf__open_hooks hooks = {map_take, exists};

int tf__preg_enter(tf__preg *g) {
    pthread_once(&reg_once, reg_init);
    if (!reg_key_ok) return -ENOMEM;
    if (pthread_setspecific(reg_key, g) != 0) return -ENOMEM;
    return tf__open_hooks_enter(g ? &hooks : NULL);
}

/* Objects are found by URL through a hash table: an open of 10^4 shards
 * looks each one up several times. */
static size_t url_hash(const char *url) { return (size_t)tf_hash64(url, strlen(url), 0); }

static size_t *slot_of(tf__preg *g, const char *url) {
    size_t mask = g->nslots - 1, i = url_hash(url) & mask;
    while (g->slots[i] && strcmp(g->o[g->slots[i] - 1].url, url) != 0) i = (i + 1) & mask;
    return &g->slots[i];
}

tf__pobj *tf__preg_find(tf__preg *g, const char *url) {
    if (!g || !g->nslots) return NULL;
    size_t s = *slot_of(g, url);
    return s ? &g->o[s - 1] : NULL;
}

/* Room for one more object in the table (rebuilt twice as large when half full). */
static int reserve_slot(tf__preg *g) {
    if (2 * (g->n + 1) <= g->nslots) return 0;
    size_t ns = g->nslots ? g->nslots * 2 : 256;
    size_t *t = calloc(ns, sizeof *t);
    if (!t) return -ENOMEM;
    free(g->slots);
    g->slots = t;
    g->nslots = ns;
    for (size_t i = 0; i < g->n; i++) *slot_of(g, g->o[i].url) = i + 1;
    return 0;
}

tf__pobj *tf__preg_add(tf__preg *g, const char *url) {
    tf__pobj *p = tf__preg_find(g, url);
    if (p) return p;
    if (reserve_slot(g)) return NULL;
    if (g->n == g->cap) {
        size_t nc = g->cap ? g->cap * 2 : 64;
        tf__pobj *no = realloc(g->o, nc * sizeof *no);
        if (!no) return NULL;
        g->o = no;
        g->cap = nc;
    }
    p = &g->o[g->n];
    memset(p, 0, sizeof *p);
    p->url = strdup(url);
    if (!p->url) return NULL;
    g->n++;
    *slot_of(g, url) = g->n;
    return p;
}

void tf__preg_free(tf__preg *g) {
    for (size_t i = 0; i < g->n; i++) {
        tf__pobj *p = &g->o[i];
        if (!p->claimed && p->map) munmap(p->map, (size_t)p->info.size);
        for (size_t k = 0; k < p->ngot; k++) free(p->got[k].copy);
        free(p->got);
        free(p->url);
    }
    free(g->o);
    free(g->slots);
    g->o = NULL;
    g->slots = NULL;
    g->n = g->cap = g->nslots = 0;
    g->recorded = 0;
}

int tf__pobj_map(tf__pobj *p) {
    if (p->map || !p->info.size) return 0;
    void *m = mmap(NULL, (size_t)p->info.size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (m == MAP_FAILED) {
        int e = errno;
        TF_FAIL(-e, "%s: cannot reserve %llu bytes of address space for its metadata: %s", p->url,
                (unsigned long long)p->info.size, strerror(e));
    }
    p->map = m;
    p->tail = p->info.size;
    return 0;
}

/* Drop the copies kept for the record (it will not be written). */
static void drop_copies(tf__preg *g) {
    for (size_t i = 0; i < g->n; i++)
        for (size_t k = 0; k < g->o[i].ngot; k++) {
            free(g->o[i].got[k].copy);
            g->o[i].got[k].copy = NULL;
        }
    g->record = 0;
    g->recorded = 0;
}

int tf__pobj_note(tf__preg *g, tf__pobj *p, uint64_t off, uint64_t len) {
    tf__prange *n = tf__grow(p->got, &p->capgot, p->ngot, sizeof *n, 4);
    if (!n) return -ENOMEM;
    p->got = n;
    uint8_t *copy = NULL;
    if (g->record && len) {
        if (g->recorded + len > g->record_max) {
            g->too_big = 1;
            drop_copies(g);
        } else if (!(copy = malloc((size_t)len))) {
            drop_copies(g); /* the record is an optimisation: the open goes on without it */
            g->too_big = 1;
        } else {
            memcpy(copy, p->map + off, (size_t)len);
            g->recorded += len;
        }
    }
    p->got[p->ngot++] = (tf__prange){off, len, copy};
    return 0;
}

int tf__pobj_has(const tf__pobj *p, uint64_t off, uint64_t len) {
    /* few ranges per object (head, tail, a table): advance through them */
    uint64_t end = off + len;
    for (int moved = 1; off < end && moved;) {
        moved = 0;
        for (size_t k = 0; k < p->ngot; k++) {
            const tf__prange *r = &p->got[k];
            if (r->off <= off && off < r->off + r->len) {
                off = r->off + r->len;
                moved = 1;
            }
        }
    }
    return off >= end;
}

/* The file primitives' hooks during a remote open: the prepared map of url,
 * and whether an object exists. */
static int map_take(const char *url, void **map, size_t *len) {
    tf__pobj *p = tf__preg_find(cur_reg(), url);
    if (!p || !p->known)
        TF_FAIL(-EINVAL, "%s: a remote object read outside of a remote open (internal error)", url);
    if (!p->exists) TF_FAIL(-ENOENT, "%s: no such object", url);
    if (p->claimed) TF_FAIL(-EINVAL, "%s: opened twice in one open (internal error)", url);
    p->claimed = 1;
    *map = p->map;
    *len = (size_t)p->info.size;
    return 0;
}

static int exists(const char *url) {
    tf__pobj *p = tf__preg_find(cur_reg(), url);
    return p && p->known && p->exists;
}
