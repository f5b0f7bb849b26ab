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

tf__pobj *tf__preg_find(tf__preg *g, const char *url) {
    for (size_t i = 0; g && i < g->n; i++)
        if (strcmp(g->o[i].url, url) == 0) return &g->o[i];
    return NULL;
}

tf__pobj *tf__preg_add(tf__preg *g, const char *url) {
    tf__pobj *p = tf__preg_find(g, url);
    if (p) return p;
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
    return p;
}

void tf__preg_free(tf__preg *g) {
    for (size_t i = 0; i < g->n; i++) {
        if (!g->o[i].claimed && g->o[i].map) munmap(g->o[i].map, (size_t)g->o[i].info.size);
        free(g->o[i].url);
    }
    free(g->o);
    g->o = NULL;
    g->n = g->cap = 0;
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
