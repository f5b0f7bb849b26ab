/*
 * remote_glue.c — what the chunk scheduler (remote/remote_prefetch.c) needs
 * from the engine: which remote chunks the sample at a stream position reads.
 * The order gives the sample and its token spans; the dataset maps spans to
 * files; a remote file maps tokens (or, when compressed, the blocks holding
 * them) to chunks of its object.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "../remote/remote.h"

typedef struct glue {
    const tf_order *order;
    const tf_dataset *ds;
    tf__span *spans;
    size_t max_spans;
    /* balancing: the scheduler walks this rank's contiguous slice; row j of
     * it stands for row j of the rank's balanced rows (the last step computed
     * is kept: the scheduler runs on one thread) */
    tf_balance bal;
    uint64_t B, G, rank, micro;
    tf__balance_cache cache;
} glue;

/* The position the rank reads for position pos of its contiguous slice. */
static int balanced_pos(glue *g, uint64_t pos, uint64_t *out) {
    const uint64_t *rows = NULL;
    TF_TRY(tf__balance_rows(g->order, g->bal, (uint32_t)(g->G / g->B), (uint32_t)g->micro, pos / g->G,
                            (uint32_t)g->rank, &g->cache, &rows));
    *out = rows[pos % g->G - g->rank * g->B];
    return 0;
}

/* Chunks of object bytes [a, b) of the data region of o. */
static void emit_range(const tf__robj *o, uint64_t a, uint64_t b, tf__prefetch_emit_fn emit, void *ectx) {
    if (b <= a) return;
    for (uint64_t k = a / o->chunk_bytes; k <= (b - 1) / o->chunk_bytes; k++) emit(ectx, o, (uint32_t)k);
}

static int locate(void *ctx, uint64_t pos, tf__prefetch_emit_fn emit, void *ectx) {
    glue *g = ctx;
    if (g->bal != TF_BALANCE_NONE) TF_TRY(balanced_pos(g, pos, &pos));
    uint64_t sample = tf_order_sample_at(g->order, pos);
    size_t ns = 0;
    TF_TRY(tf__order_sample_spans(g->order, sample, g->spans, g->max_spans, &ns));
    const tf_dataset *ds = g->ds;
    for (size_t s = 0; s < ns; s++) {
        const tf__span *sp = &g->spans[s];
        if (sp->src == TF_SPAN_SEPARATOR || sp->src == TF_SPAN_PAD || !sp->len) continue;
        if (sp->src >= ds->num_tokens) continue;
        uint64_t start = sp->src, left = sp->len;
        if (left > ds->num_tokens - start) left = ds->num_tokens - start;
        uint64_t fi = tf__dataset_file_of(ds, start);
        while (left && fi < ds->nfiles) {
            const tf_file *f = &ds->files[fi];
            uint64_t local = start - ds->tok_prefix[fi];
            uint64_t n = f->num_tokens - local < left ? f->num_tokens - local : left;
            const tf__robj *ro = tf__file_robj(f);
            if (n && ro && !ro->held_whole) { /* (a shard held whole in memory reads no chunk) */
                size_t isz = tf_dtype_size(f->dtype);
                if (!f->blocks.ops) {
                    emit_range(ro, local * isz, (local + n) * isz, emit, ectx);
                } else if (f->blocks.tokens) {
                    for (uint64_t b = local / f->blocks.tokens; b <= (local + n - 1) / f->blocks.tokens && b < f->blocks.count; b++) {
                        /* (an entry the format refuses is skipped: its
                         * read gives the error) */
                        uint64_t off, size;
                        if (f->blocks.ops->extent(f, b, &off, &size) == 0) emit_range(ro, off, off + size, emit, ectx);
                        else tf__clearerr();
                    }
                }
            }
            start += n;
            left -= n;
            fi++;
        }
    }
    return 0;
}

static void glue_free(void *p) {
    glue *g = p;
    if (g) {
        free(g->spans);
        tf__balance_cache_free(&g->cache);
    }
    free(g);
}

int tf__engine_prefetch_create(const tf_order *order, uint64_t B, uint64_t G, uint64_t rank, tf_balance bal,
                               uint32_t micro, tf__prefetch **out, void **ctx_out) {
    *out = NULL;
    *ctx_out = NULL;
    const tf_dataset *ds = tf_order_dataset(order);
    tf_remote *r = NULL;
    for (uint64_t i = 0; i < ds->nfiles && !r; i++)
        if (tf__file_robj(&ds->files[i])) r = tf__file_robj(&ds->files[i])->r;
    if (!r) return 0; /* nothing remote: no scheduler */
    glue *g = calloc(1, sizeof *g);
    if (!g) return -ENOMEM;
    g->order = order;
    g->ds = ds;
    g->max_spans = tf__order_max_spans(order);
    g->spans = malloc(g->max_spans * sizeof *g->spans);
    g->bal = bal;
    g->B = B;
    g->G = G;
    g->rank = rank;
    g->micro = micro ? micro : 1;
    if (!g->spans) {
        glue_free(g);
        return -ENOMEM;
    }
    int rc = tf__prefetch_create(r, locate, g, B, G, rank, UINT64_MAX, out);
    if (rc) {
        glue_free(g);
        return rc;
    }
    *ctx_out = g;
    return 0;
}

void tf__engine_prefetch_free(tf__prefetch *p, void *ctx) {
    tf__prefetch_free(p); /* joins the thread that uses ctx */
    glue_free(ctx);
}
