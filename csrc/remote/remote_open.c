/*
 * remote_open.c — opening remote files (URLs) as dataset files: metadata only,
 * with concurrent ranged requests, through the same parsers as local files so
 * that the fingerprint is the same (docs/remote.md, "Open reads metadata
 * only").
 *
 * DESIGN
 *
 * The format parsers read a file through tf__map_file and pointers into the
 * mapping. For a remote object this file prepares, before any parser runs, a
 * "sparse map": an anonymous mapping of the object's size in which only the
 * byte ranges a parser reads are filled (headers, the first and last 64 KiB
 * that fingerprints sample, document indices, block tables, whole index
 * files). The prepared maps of one open are kept in a per-thread registry;
 * tf__map_file hands a URL's map over from it, tf__file_exists answers from
 * it, and tf__release_pages leaves such maps alone (MADV_DONTNEED would zero
 * an anonymous mapping). Token bytes are never fetched here.
 *
 * Rounds, each one batch of concurrent requests on the remote's fetch pool:
 *   1. sizes and versions: a listing of each parent prefix when the
 *      transport can list and many objects share it, else one stat each;
 *   2. the manifests of dataset directories (whole), then the sizes of their
 *      shards (round 1 again for those);
 *   3. for every object: the whole object when small or an index file,
 *      otherwise its first and last 64 KiB (the tail sized to hold a native
 *      shard's document index when the manifest tells its length);
 *   4. what the headers show is still missing (a native shard's document
 *      index and tables, a long .npy header).
 * Then the parsers run on the calling thread, and each remote file is
 * finished: its token region becomes a chunked object read through the
 * cache (f->bytes_src), its metadata moves out of the sparse map into a compact
 * buffer, and the sparse map is unmapped.
 *
 * A dataset directory with its own catalog (tokenfeed.catalog, catalog.c:
 * a candidate of round 1, fetched whole with the manifest in round 2) skips
 * the rest for its shards (no listing, no header): when the catalog
 * describes the manifest, its entries become the files, lazily (file.c),
 * each with a lazy_obj as its source: the object as the catalog knows it,
 * its size and a version made of its entry (catalog_info), never sent to
 * the store. Such a shard's bytes are kept right by the check of its header
 * against the entry and of its chunks against the header's checksums; one
 * without chunk checksums asks the store for its version on first touch and
 * is pinned to it from then on (lazy_obj_open). A shard's first touch
 * (lazy_obj_open) runs rounds 3 and 4 for that object alone, parses it as
 * above and checks it against its entry; the scheduler's touches
 * (tf__file_robj) take the next shards of the dataset into the same round,
 * at a lower priority, keeping their bytes for their own touch. A touch's
 * ranges go through the node's chunk cache (tf__remote_read_many_shared),
 * each a chunk of its own keyed by URL, version and range: a header is
 * fetched once per node, and read back by the node's other processes and
 * after a restart (whose open reads the node's record), with no request. The token
 * region of a touched shard (lazy_obj.robj) lives as long as the dataset, so
 * that the scheduler's chunk references outlive an unmapped shard.
 *
 * A shard set of foreign objects with its catalog beside the data in object
 * storage (tf_dataset_open_remote_set; catalog.c writes and parses it) opens
 * the same way: the catalog is a candidate of round 1, learnt from the set's
 * listing (which the caller that expanded the set hands down, so that round
 * 1 sends nothing), fetched whole, and checked against that listing object by
 * object (name, size, the hash of the version; no companion object); its
 * entries then become the files, each a lazy_obj pinned to its listed version,
 * parsed at first touch by its own format's parser. A catalog that differs
 * fails the open with -ESTALE, and the caller opens the objects without it.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "remote.h"
#include "../sources/source.h"

typedef unsigned long long ull;

#define HEAD_BYTES (64u << 10)
#define TAIL_BYTES (64u << 10)
#define WHOLE_BELOW (256u << 10)

/* ------------------------------------------------------------------------ */
/* rounds of requests                                                        */
/* ------------------------------------------------------------------------ */

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

/* Whether url is an index fetched whole: a catalog, a manifest, or a
 * companion a remote open reads (format table: a pair's .idx, a datatrove
 * .index, a .bos.idx). */
static int is_index_name(const char *url) {
    size_t n = strlen(url);
    const char *base = strrchr(url, '/');
    if (base && !strncmp(base + 1, TF_DATA_CATALOG_STEM, sizeof TF_DATA_CATALOG_STEM - 1)) return 1;
    const tf__companion *c;
    for (size_t k = 0; (c = tf__companion_at(k)) != NULL; k++)
        if ((c->fetch || c->pair) && ends_with(url, c->suffix) && n > strlen(c->suffix)) return 1;
    return (n > 18 && !strcmp(url + n - 18, TF_MANIFEST_NAME)) ||
           (n > 17 && !strcmp(url + n - 17, TF_DATASET_CATALOG_NAME));
}

typedef struct listed {
    tf__preg *g;
    const char *prefix;
} listed;

static int on_listed(void *ctx, const char *url, const tf_object_info *info) {
    listed *l = ctx;
    tf__pobj *p = tf__preg_find(l->g, url);
    if (p && !p->known) {
        p->known = p->exists = 1;
        p->info = *info;
    }
    return 0;
}

/* Once every object under prefix was listed: the registered ones the listing
 * did not show do not exist. A listing shows every object whose URL starts
 * with the prefix, deeper ones included, so that a candidate such as
 * <shard>/tokenfeed.manifest under a listed prefix is known absent without a
 * request of its own. */
static void absent_unless_listed(tf__preg *g, const char *prefix) {
    size_t pl = strlen(prefix);
    for (size_t j = 0; j < g->n; j++)
        if (!g->o[j].known && !strncmp(g->o[j].url, prefix, pl)) {
            g->o[j].known = 1;
            g->o[j].exists = 0;
        }
}

static size_t parent_len(const char *url) {
    const char *s = strrchr(url, '/');
    return s ? (size_t)(s - url) + 1 : 0;
}

/* An object of g and its parent prefix's length, sorted so that the objects
 * of one parent prefix stand together. */
typedef struct by_parent {
    const char *url;
    size_t pl, i;
} by_parent;

static int cmp_parent(const void *a, const void *b) {
    const by_parent *x = a, *y = b;
    int c = memcmp(x->url, y->url, x->pl < y->pl ? x->pl : y->pl);
    if (c) return c;
    return x->pl < y->pl ? -1 : x->pl > y->pl;
}

/* The objects of g that pick selects, grouped by parent prefix (sorted: one
 * pass over them finds each group, where comparing every object with every
 * other took n^2 steps at open). *out is to be freed; NULL with *n 0 when
 * none is picked. */
static int group_by_parent(const tf__preg *g, int (*pick)(const tf__preg *, size_t, const void *), const void *ctx,
                           by_parent **out, size_t *n) {
    *out = NULL;
    *n = 0;
    by_parent *v = malloc((g->n ? g->n : 1) * sizeof *v);
    if (!v) return -ENOMEM;
    size_t m = 0;
    for (size_t i = 0; i < g->n; i++)
        if (pick(g, i, ctx)) v[m++] = (by_parent){g->o[i].url, parent_len(g->o[i].url), i};
    qsort(v, m, sizeof *v, cmp_parent);
    *out = v;
    *n = m;
    return 0;
}

/* The end of the group of v[a] (objects of the same parent prefix). */
static size_t group_end(const by_parent *v, size_t n, size_t a) {
    size_t b = a + 1;
    while (b < n && v[b].pl == v[a].pl && !memcmp(v[b].url, v[a].url, v[a].pl)) b++;
    return b;
}

/* A parent prefix holding at least this many of the objects asked about is
 * listed (one request per 1000 objects) rather than asked object by object. */
#define LIST_AT_LEAST 16

static int pick_unknown(const tf__preg *g, size_t i, const void *ctx) {
    (void)ctx;
    return !g->o[i].known;
}

/* Round 1: sizes and versions of every registered object not yet known. */
static int learn_sizes(tf__preg *g) {
    /* listings first: a parent prefix with many unknown objects */
    by_parent *v;
    size_t nv;
    if (group_by_parent(g, pick_unknown, NULL, &v, &nv) < 0) return -ENOMEM;
    for (size_t a = 0, b; a < nv; a = b) {
        b = group_end(v, nv, a);
        size_t same = 0; /* (a listing of a shallower prefix may have answered some) */
        for (size_t k = a; k < b; k++) same += !g->o[v[k].i].known;
        if (same < LIST_AT_LEAST) continue;
        char *prefix = strndup(v[a].url, v[a].pl);
        if (!prefix) {
            free(v);
            return -ENOMEM;
        }
        listed l = {g, prefix};
        int rc = tf__remote_list_node(g->r, prefix, g->list_flags, on_listed, &l);
        if (rc == 0) absent_unless_listed(g, prefix);
        free(prefix);
        if (rc != -TF_EUNSUPPORTED) g->fetched = 1;
        if (rc < 0 && rc != -TF_EUNSUPPORTED) {
            free(v);
            return rc;
        }
    }
    free(v);
    size_t n = g->n ? g->n : 1, m = 0;
    size_t *idx = malloc(n * sizeof *idx);
    const char **urls = malloc(n * sizeof *urls);
    tf_object_info *infos = malloc(n * sizeof *infos);
    int *rcs = malloc(n * sizeof *rcs);
    int rc = idx && urls && infos && rcs ? 0 : -ENOMEM;
    for (size_t i = 0; i < g->n && !rc; i++)
        if (!g->o[i].known) {
            idx[m] = i;
            urls[m++] = g->o[i].url;
        }
    if (!rc && m) {
        g->fetched = 1;
        rc = tf__remote_stat_many(g->r, urls, m, infos, rcs);
    }
    for (size_t k = 0; k < m && !rc; k++) {
        tf__pobj *p = &g->o[idx[k]];
        if (rcs[k] == 0) p->info = infos[k];
        p->known = 1;
        p->exists = rcs[k] == 0;
    }
    free(idx);
    free(urls);
    free(infos);
    free(rcs);
    return rc;
}

typedef struct want {
    tf__pobj *p;
    uint64_t off, len;
} want;

typedef struct fetch_plan {
    want *w;
    size_t n, cap;
} fetch_plan;

static int plan_add(fetch_plan *fp, tf__pobj *p, uint64_t off, uint64_t len) {
    if (!len) return 0;
    want *nw = tf__grow(fp->w, &fp->cap, fp->n, sizeof *nw, 256);
    if (!nw) return -ENOMEM;
    fp->w = nw;
    fp->w[fp->n++] = (want){p, off, len};
    return 0;
}

/* Fetch the planned ranges into their objects' maps, concurrently: those
 * the maps do not hold yet (a node's metadata record may hold them all). */
static int run_plan(tf__preg *g, fetch_plan *fp) {
    size_t m = 0;
    for (size_t i = 0; i < fp->n; i++)
        if (!tf__pobj_has(fp->w[i].p, fp->w[i].off, fp->w[i].len)) fp->w[m++] = fp->w[i];
    fp->n = m;
    if (!fp->n) return 0;
    g->fetched = 1;
    tf__rreq *rq = calloc(fp->n, sizeof *rq);
    tf__robj **objs = calloc(fp->n, sizeof *objs);
    int rc = rq && objs ? 0 : -ENOMEM;
    for (size_t i = 0; i < fp->n && !rc; i++) {
        want *w = &fp->w[i];
        rc = tf__robj_from_info(g->r, w->p->url, &w->p->info, &objs[i]);
        if (!rc) {
            /* an object found changed drops the node's record of this open */
            objs[i]->meta_on = g->meta_on;
            objs[i]->meta_key = g->meta_key;
            rq[i] = (tf__rreq){objs[i], w->off, w->len, w->p->map + w->off, 0};
        }
    }
    if (!rc) rc = g->shared ? tf__remote_read_many_shared(g->r, rq, fp->n) : tf__remote_read_many(g->r, rq, fp->n);
    for (size_t i = 0; i < fp->n && !rc; i++) rc = tf__pobj_note(g, fp->w[i].p, fp->w[i].off, fp->w[i].len);
    for (size_t i = 0; objs && i < fp->n; i++) tf__robj_free(objs[i]);
    free(rq);
    free(objs);
    fp->n = 0;
    return rc;
}

/* Plan what a parser will read of p: whole, or head and tail. */
static int plan_head_tail(fetch_plan *fp, tf__pobj *p, uint64_t tail_hint) {
    TF_TRY(tf__pobj_map(p));
    uint64_t size = p->info.size;
    if (!size) {
        p->whole = 1;
        return 0;
    }
    uint64_t tail = tail_hint > TAIL_BYTES ? tail_hint : TAIL_BYTES;
    if (size <= WHOLE_BELOW || is_index_name(p->url) || HEAD_BYTES + tail >= size) {
        p->whole = 1;
        p->head = size;
        p->tail = 0;
        return plan_add(fp, p, 0, size);
    }
    p->head = HEAD_BYTES;
    p->tail = size - tail;
    TF_TRY(plan_add(fp, p, 0, HEAD_BYTES));
    return plan_add(fp, p, p->tail, tail);
}

/* Plan bytes [off, end) of p that are not fetched yet (everything outside
 * the head [0, head) and the tail [tail, size) fetched before). */
static int plan_range(fetch_plan *fp, tf__pobj *p, uint64_t off, uint64_t end) {
    if (p->whole) return 0;
    if (off < p->head) off = p->head;
    if (end > p->tail) end = p->tail;
    if (off >= end) return 0;
    TF_TRY(plan_add(fp, p, off, end - off));
    if (off == p->head) p->head = end;
    else if (end == p->tail) p->tail = off;
    return 0;
}

/* Plan what the headers fetched show is still missing (the rows' needs: a
 * native shard's document index and tables, a long .npy header). */
static int plan_missing(tf__preg *g, fetch_plan *fp) {
    int rc = 0;
    for (size_t i = 0; i < g->n && !rc; i++) {
        tf__pobj *p = &g->o[i];
        if (!p->map || p->whole || p->info.size < 8) continue;
        /* what its format's parse needs beyond the head (format table) */
        const tf__format_row *r = tf__format_row_of(tf__format_sniff(p->map, p->info.size < 512 ? p->info.size : 512));
        uint64_t off, end;
        if (r && r->needs && r->needs(p->url, p->map, (size_t)p->info.size, p->info.size, &off, &end) == 0)
            rc = plan_range(fp, p, off, end);
        tf__clearerr();
    }
    return rc;
}

/* ------------------------------------------------------------------------ */
/* resolving what a URL names                                                */
/* ------------------------------------------------------------------------ */

/* What a URL names (resolve.c decides it, as for a local path). */
typedef enum kind { K_DIR, K_PAIR, K_FILE } kind;

typedef struct target {
    const char *url;   /* as given */
    kind k;
    char *path;        /* directory URL, pair prefix, or file URL (owned) */
    const tf__format_row *row; /* K_PAIR: the pair's row; K_FILE: the open's format's (NULL: its bytes say) */
    int else_file;     /* K_PAIR: the URL is an object of its own too (tf__target) */
    tf_manifest m;     /* K_DIR */
    int have_m;
    tf_file *cat;      /* K_DIR: its shards from the dataset's catalog (NULL: none usable) */
    uint64_t ncat;
} target;

/* The names the resolution may ask about, as objects to learn the sizes of;
 * a dataset directory's catalog with its manifest (asked for in the same
 * round: whether there is one is known before the manifest is read). */
static int add_name(void *ctx, const char *name, int manifest) {
    tf__preg *g = ctx;
    if (!tf__preg_add(g, name)) return -ENOMEM;
    if (!manifest) return 0;
    const char *slash = strrchr(name, '/');
    char *d = slash ? strndup(name, (size_t)(slash - name)) : NULL, *cf = d ? tf__path_join(d, TF_DATASET_CATALOG_NAME) : NULL;
    int rc = cf && tf__preg_add(g, cf) ? 0 : -ENOMEM;
    free(d);
    free(cf);
    return rc;
}

static int register_candidates(tf__preg *g, const char *url, const tf_open_options *opt) {
    int rc = tf__resolve_names(url, opt->format, add_name, g);
    /* the companion objects of a file's formats that a remote open reads (a
     * datatrove .index, a .bos.idx), from the format table */
    const tf__format_row *want = tf__format_row_of(opt->format);
    for (size_t i = 0; !rc && !ends_with(url, "/") && tf__format_at(i); i++) {
        const tf__format_row *r = tf__format_at(i);
        if (want && want != r) continue;
        int oom = 0;
        char *c;
        for (size_t k = 0; !rc && (c = tf__format_companion(r->format, url, k, &oom)) != NULL; k++) {
            if (!tf__preg_add(g, c)) rc = -ENOMEM;
            free(c);
        }
        if (oom) rc = -ENOMEM;
    }
    return rc;
}

static int exists(tf__preg *g, const char *url) {
    tf__pobj *p = tf__preg_find(g, url);
    return p && p->exists;
}

/* The resolution's probe: what the sizes learnt say of a name (a URL ending
 * in '/' spells a directory); no bytes are known yet. */
static int remote_kind(void *ctx, const char *name) {
    if (ends_with(name, "/")) return TF__NAME_DIR;
    return exists(ctx, name) ? TF__NAME_FILE : TF__NAME_NONE;
}

/* Decide what t->url names, from the sizes learnt (before any bytes): the
 * one resolution (resolve.c); a pair is confirmed by its companion's magic
 * once fetched. */
static int resolve(tf__preg *g, target *t, const tf_open_options *opt) {
    tf__probe pr = {g, remote_kind, NULL, "object", 1};
    tf__target rt;
    TF_TRY(tf__resolve_target(t->url, opt->format, &pr, &rt));
    t->k = rt.kind == TF__TARGET_DATASET ? K_DIR : rt.kind == TF__TARGET_PAIR ? K_PAIR : K_FILE;
    t->path = rt.path;
    t->row = rt.row;
    t->else_file = rt.else_file;
    return 0;
}

/* What an object's first bytes (fetched into p's map) say it is: the one
 * detection of the format table (formats.c), as for a local file. */
static tf_format sniff_format(const tf__pobj *p) {
    const uint8_t *h = p ? p->map : NULL;
    uint64_t n = p && h ? p->info.size : 0;
    return tf__format_sniff(h, n < 512 ? (size_t)n : 512);
}

/* ------------------------------------------------------------------------ */
/* after the parsers: turn a remote file into a chunked object               */
/* ------------------------------------------------------------------------ */

/* Move bytes [off, end) of f's sparse map into a compact buffer and repoint
 * the metadata pointers that lie there. */
static int relocate_native(tf_file *f, uint64_t docs_off) {
    const uint8_t *m = f->map;
    uint64_t end = f->map_len;
    uint8_t *meta = NULL;
    if (end > docs_off) {
        meta = aligned_alloc(64, (size_t)((end - docs_off + 63) & ~63ull));
        if (!meta) return -ENOMEM;
        memcpy(meta, m + docs_off, (size_t)(end - docs_off));
    }
    if (f->doc_ends) f->doc_ends = (const void *)(meta + ((const uint8_t *)f->doc_ends - (m + docs_off)));
    tf__native_rebase(f, m, docs_off, meta); /* its tables; its token section is not kept */
    f->meta = meta;
    return 0;
}

/* Tokens of a remote, uncompressed file: straight from the cached chunks
 * into out, converting on the way. The chunked region starts at the first
 * token and chunks are a multiple of 4096 bytes, so no token straddles two. */
static int remote_read_tokens(const tf_file *f, uint64_t start, uint64_t count, void *out, tf_dtype out_dtype) {
    const tf__robj *o = f->bytes_src;
    size_t isz = tf_dtype_size(f->dtype), osz = tf_dtype_size(out_dtype);
    uint64_t off = start * isz, left = count * isz; /* relative to the data region */
    uint8_t *dst = out;
    while (left) {
        uint32_t k = (uint32_t)(off / o->chunk_bytes);
        uint64_t in = off % o->chunk_bytes;
        uint64_t n = o->chunk_bytes - in < left ? o->chunk_bytes - in : left;
        if (n <= (256u << 10)) {
            /* not cached yet and small: read it directly rather than wait */
            uint8_t *tmp = f->dtype == out_dtype ? dst : malloc((size_t)n);
            int s = tmp ? tf__robj_read_small(o, off, n, tmp) : 1;
            if (s == 0 && tmp != dst) tf_convert(dst, out_dtype, tmp, f->dtype, (size_t)(n / isz));
            if (tmp != dst) free(tmp);
            if (s < 0) return s;
            if (s == 0) {
                dst += n / isz * osz;
                off += n;
                left -= n;
                continue;
            }
        }
        const uint8_t *data;
        size_t clen;
        tf__chunkref *ref;
        TF_TRY(tf__chunk_acquire(o, k, &data, &clen, &ref));
        n = clen - in < left ? clen - in : left;
        tf_convert(dst, out_dtype, data + in, f->dtype, (size_t)(n / isz));
        tf__chunk_release(ref);
        dst += n / isz * osz;
        off += n;
        left -= n;
    }
    return 0;
}

static int remote_read(const void *src, uint64_t off, uint64_t len, void *out) {
    return tf__robj_read(src, off, len, out);
}

static void remote_free(void *src) { tf__robj_free(src); }

/* The remote byte provider of the files this stack opens (source.h); a
 * shard opened on first touch borrows its object from its lazy_obj. */
static const tf__byte_ops remote_byte_ops = {remote_read, remote_read_tokens, remote_free};
static const tf__byte_ops remote_borrowed_ops = {remote_read, remote_read_tokens, NULL};

static const tf__lazy_src remote_lazy_src;

/* A shard known from its dataset's catalog, opened on first touch: the
 * object as the open's listing saw it, and once touched its token region,
 * kept for the dataset's life (the parsed file may be dropped and opened
 * again under the bound on open shards; the scheduler holds its chunks by
 * this object). */
typedef struct lazy_obj {
    tf_remote *r; /* a reference */
    char *url;
    tf_object_info info; /* as listed, or the catalog's size and version (TF__CATALOG_VERSION) */
    /* the store's size and version, asked for at first touch of a shard
     * known from the catalog that has no chunk checksums (lo_info) */
    _Atomic(tf_object_info *) stored;
    uint64_t tail_hint; /* the tail a first touch fetches: a native shard's document index with it */
    /* how the open reads the object without a catalog: the format it was
     * given (TF_FORMAT_AUTO: what the object's magic says) and the dtype of
     * a headerless one; a first touch parses what the bytes say, never only
     * what the entry says */
    tf_format open_format;
    tf_dtype open_dtype;
    int meta_on;
    uint64_t meta_key;
    _Atomic(tf__robj *) robj;
    _Atomic int failed; /* its first touch failed: the reader reports it */
    struct lazy_group *grp; /* its dataset's shards (shared) */
    size_t idx;             /* its place there */
    /* under grp->mu: bytes another shard's touch fetched ahead for this one */
    tf__prange *ahead;
    size_t nahead;
    uint64_t ahead_bytes;
    uint64_t fetching; /* bytes reserved while a touch fetches ahead for it */
} lazy_obj;

/* What lo's reads are pinned to: the store's version once asked for, else
 * the open's. */
static const tf_object_info *lo_info(lazy_obj *lo) {
    tf_object_info *s = atomic_load(&lo->stored);
    return s ? s : &lo->info;
}

/* Set while the scheduler opens a shard ahead of its reader. */
static _Thread_local int scheduler_touch;

const tf__robj *tf__file_robj(const tf_file *f) {
    if (!f) return NULL;
    if (f->bytes_ops == &remote_byte_ops || f->bytes_ops == &remote_borrowed_ops) return f->bytes_src;
    lazy_obj *lo = tf__file_lazy_source(f, &remote_lazy_src);
    /* (compressed shards are never opened from the catalog: read_catalog) */
    if (!lo || f->blocks.ops) return NULL;
    tf__robj *o = atomic_load(&lo->robj);
    if (!o && !atomic_load(&lo->failed)) {
        /* the scheduler asks ahead of the reader: open the shard now, its
         * requests behind those of readers waiting */
        tf__remote_open_ahead(1);
        scheduler_touch = 1;
        int rc = tf__file_touch(f);
        scheduler_touch = 0;
        tf__remote_open_ahead(0);
        /* stopped (the loader closes): not a failure of the shard, which
         * its reader opens when it needs it */
        if (rc != 0 && rc != -EINTR) atomic_store(&lo->failed, 1);
        if (rc != 0) tf__clearerr();
        o = atomic_load(&lo->robj);
    }
    return o;
}

/* Where the tokens of f, just parsed from its map, lie in its object: a
 * native shard's token section, or what a foreign file's parser pointed at. */
static int token_region(const tf_file *f, uint64_t *off, uint64_t *len) {
    tf__native_info ni;
    if (tf__native_info_of(f, &ni) == 0) {
        *off = ni.tokens_at;
        *len = ni.tokens_len;
        return 0;
    }
    if (f->num_tokens && (!f->tokens || f->tokens < (const uint8_t *)f->map))
        TF_FAIL(-EINVAL, "%s: token offset unknown (internal error)", f->path);
    *off = f->num_tokens ? (uint64_t)(f->tokens - (const uint8_t *)f->map) : 0;
    *len = f->num_tokens * tf_dtype_size(f->dtype);
    return 0;
}

static int finish_remote_file(tf__preg *g, tf_file *f) {
    tf_remote *r = g->r;
    const char *url = f->path;
    tf__pobj *p = tf__preg_find(g, url);
    if (!p) TF_FAIL(-EINVAL, "%s: not prepared (internal error)", url);
    uint64_t data_off, data_len;
    TF_TRY(token_region(f, &data_off, &data_len));
    tf__native_info ni;
    if (tf__native_info_of(f, &ni) == 0) {
        TF_TRY(relocate_native(f, ni.index_at));
        TF_TRY(tf__native_info_of(f, &ni)); /* its chunk table, moved */
    }
    tf__robj *o = NULL;
    TF_TRY(tf__robj_from_info(r, url, &p->info, &o));
    int rc = tf__robj_set_region(o, data_off, data_len, ni.chunk_table, ni.chunk_count, ni.chunk_bytes);
    if (rc) {
        tf__robj_free(o);
        return rc;
    }
    o->meta_on = g->meta_on;
    o->meta_key = g->meta_key;
    f->bytes_ops = &remote_byte_ops;
    f->bytes_src = o;
    f->data_off = data_off;
    /* no token byte is in memory: every read goes through the cache (the
     * format's pointers into its token section went with relocate_native) */
    f->tokens = NULL;
    tf__unmap(f->map, f->map_len);
    f->map = NULL;
    f->map_len = 0;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* a dataset's catalog: shards opened on first touch                         */
/* ------------------------------------------------------------------------ */

/* Shards whose headers a first touch by the scheduler fetches along with its
 * own, in the same round of concurrent requests: the next ones of the
 * dataset not touched yet (a reader of small shards crosses into the next
 * one soon),
 * while the headers fetched ahead and not used yet stay within
 * READ_AHEAD_BYTES per dataset. */
#define READ_AHEAD 8u
#define READ_AHEAD_BYTES (64ull << 20)

/* The shards of one dataset opened from its catalog. */
typedef struct lazy_group {
    pthread_mutex_t mu;
    char *catalog;            /* a shard set's catalog (its URL; owned), or NULL: the dataset's */
    size_t n, alive;          /* under mu */
    struct lazy_obj **objs;   /* in file order; NULL once freed (under mu) */
    uint64_t ahead_bytes;     /* bytes fetched ahead, not used yet (under mu) */
} lazy_group;

/* The shards of t from its dataset's catalog, when it has a usable one (read
 * with the manifest pm): t->cat filled, or left NULL (then every shard's
 * header is read now, as for a dataset without a catalog). */
static int read_catalog(tf__preg *g, target *t, tf__pobj *pm, const tf_open_options *opt) {
    char *cf = tf__path_join(t->path, TF_DATASET_CATALOG_NAME);
    if (!cf) return -ENOMEM;
    tf__pobj *pc = tf__preg_find(g, cf);
    free(cf);
    if (!pc || !pc->exists || !pc->map || !tf__pobj_has(pc, 0, pc->info.size)) return 0;
    if (tf__catalog_parse_dataset(t->path, pm->map, (size_t)pm->info.size, &t->m, pc->map, (size_t)pc->info.size,
                                  opt, &t->cat, &t->ncat) != 0) {
        t->cat = NULL; /* another dataset's (rewritten since), or damaged: ignored */
        t->ncat = 0;
    }
    /* Compressed shards are opened at open as before: the scheduler places
     * their blocks by the block table, which a shard known from the catalog
     * only has once touched, so they would be read without it. */
    for (uint64_t k = 0; k < t->ncat; k++)
        if (t->cat[k].blocks.ops) {
            for (uint64_t j = 0; j < t->ncat; j++) tf__file_close(&t->cat[j]);
            free(t->cat);
            t->cat = NULL;
            t->ncat = 0;
        }
    return 0;
}

static void ahead_drop(lazy_obj *lo) {
    for (size_t k = 0; k < lo->nahead; k++) free(lo->ahead[k].copy);
    free(lo->ahead);
    lo->ahead = NULL;
    lo->grp->ahead_bytes -= lo->ahead_bytes;
    lo->nahead = 0;
    lo->ahead_bytes = 0;
}

static void lazy_obj_free(void *ctx) {
    lazy_obj *lo = ctx;
    if (!lo) return;
    lazy_group *grp = lo->grp;
    pthread_mutex_lock(&grp->mu);
    ahead_drop(lo);
    grp->objs[lo->idx] = NULL;
    int last = --grp->alive == 0;
    pthread_mutex_unlock(&grp->mu);
    if (last) {
        pthread_mutex_destroy(&grp->mu);
        free(grp->objs);
        free(grp->catalog);
        free(grp);
    }
    tf__robj_free(atomic_load(&lo->robj));
    free(atomic_load(&lo->stored));
    tf_remote_free(lo->r);
    free(lo->url);
    free(lo);
}

/* Bytes a first touch fetches of lo's object (at most). */
static uint64_t touch_bytes(const lazy_obj *lo) {
    uint64_t b = HEAD_BYTES + lo->tail_hint + (64u << 10);
    return b < lo->info.size ? b : lo->info.size;
}

/* Fetch what opening lo's object reads, with the headers of up to ahead next
 * shards not touched yet: g filled. The shards fetched ahead keep their
 * bytes for their own first touch. */
static int touch_fetch(tf__preg *g, lazy_obj *lo, size_t ahead) {
    lazy_group *grp = lo->grp;
    lazy_obj *next[READ_AHEAD];
    size_t nn = 0;
    tf__prange *mine = NULL;
    size_t nmine = 0;
    pthread_mutex_lock(&grp->mu);
    /* what an earlier touch fetched ahead for this one */
    mine = lo->ahead;
    nmine = lo->nahead;
    grp->ahead_bytes -= lo->ahead_bytes;
    lo->ahead = NULL;
    lo->nahead = 0;
    lo->ahead_bytes = 0;
    /* a round of requests is needed for this one: the next ones join it */
    for (size_t j = lo->idx + 1; !nmine && j < grp->n && nn < ahead && nn < READ_AHEAD; j++) {
        lazy_obj *o = grp->objs[j];
        if (!o || o->fetching || o->nahead || atomic_load(&o->robj) || atomic_load(&o->failed)) continue;
        uint64_t b = touch_bytes(o);
        if (grp->ahead_bytes + b > READ_AHEAD_BYTES) break;
        grp->ahead_bytes += b; /* reserved; settled when its bytes are in */
        o->fetching = b;
        next[nn++] = o;
    }
    pthread_mutex_unlock(&grp->mu);
    g->record = 1; /* keep copies of the bytes: those fetched ahead are kept */
    g->record_max = UINT64_MAX;
    /* through the node's chunk cache: a shard's header fetched once per
     * node, by whichever process touches it first, read back by the others
     * and after a restart (keyed by the shard's version, listed or the
     * catalog's) */
    g->shared = 1;
    int rc = 0;
    tf__pobj *p = tf__preg_add(g, lo->url);
    if (!p) rc = -ENOMEM;
    else {
        p->known = p->exists = 1;
        p->info = *lo_info(lo);
        rc = tf__pobj_map(p);
        for (size_t k = 0; k < nmine && !rc; k++) {
            memcpy(p->map + mine[k].off, mine[k].copy, (size_t)mine[k].len);
            rc = tf__pobj_note(g, p, mine[k].off, mine[k].len);
        }
    }
    for (size_t k = 0; k < nmine; k++) free(mine[k].copy);
    free(mine);
    fetch_plan fp = {NULL, 0, 0};
    if (!rc) rc = plan_head_tail(&fp, p, lo->tail_hint);
    for (size_t k = 0; k < nn && !rc; k++) {
        tf__pobj *q = tf__preg_add(g, next[k]->url);
        if (!q) rc = -ENOMEM;
        else {
            q->known = q->exists = 1;
            q->info = *lo_info(next[k]);
            rc = plan_head_tail(&fp, q, next[k]->tail_hint);
        }
    }
    if (!rc) rc = run_plan(g, &fp);
    if (!rc) rc = plan_missing(g, &fp);
    if (!rc) rc = run_plan(g, &fp);
    free(fp.w);
    /* hand the bytes fetched ahead to their shards */
    pthread_mutex_lock(&grp->mu);
    for (size_t k = 0; k < nn; k++) {
        lazy_obj *o = next[k];
        tf__pobj *q = tf__preg_find(g, o->url);
        grp->ahead_bytes -= o->fetching;
        o->fetching = 0;
        if (rc || !q || grp->objs[o->idx] != o || atomic_load(&o->robj)) continue; /* touched meanwhile */
        uint64_t b = 0;
        int whole = 1;
        for (size_t i = 0; i < q->ngot; i++) {
            b += q->got[i].len;
            whole = whole && (q->got[i].copy || !q->got[i].len);
        }
        if (!whole) continue;
        o->ahead = q->got;
        o->nahead = q->ngot;
        o->ahead_bytes = b;
        grp->ahead_bytes += b;
        q->got = NULL;
        q->ngot = q->capgot = 0;
    }
    pthread_mutex_unlock(&grp->mu);
    return rc;
}

/* A shard held whole in memory: its token section against its chunk
 * table, as the cache checks chunks. */
static int check_tokens(const tf_file *f) {
    const uint8_t *m = f->map;
    tf__native_info ni;
    tf__native_info_of(f, &ni); /* (zero for other formats: no chunk table) */
    uint64_t len = ni.tokens_len, g = ni.chunk_bytes;
    if (!ni.chunk_table || !g) return 0;
    if (ni.tokens_at > f->map_len || len > f->map_len - ni.tokens_at ||
        ni.chunk_count != len / g + (len % g != 0))
        TF_FAIL(-TF_EFORMAT, "%s: chunk checksums: expected %llu entries, found %llu", f->path,
                (ull)(len / g + (len % g != 0)), (ull)ni.chunk_count);
    for (uint64_t i = 0; i < ni.chunk_count; i++) {
        uint64_t off = i * g, n = len - off < g ? len - off : g;
        if (tf_hash64(m + ni.tokens_at + off, (size_t)n, 0) != tf__le64((const uint8_t *)&ni.chunk_table[i]))
            TF_FAIL(-EIO, "%s: bytes [%llu, +%llu) do not match the shard's chunk checksum: corrupted in transit or in the store. Run verify() on the source.",
                    f->path, (ull)(ni.tokens_at + off), (ull)n);
    }
    return 0;
}

static int size_changed(const char *url, uint64_t want, uint64_t found) {
    TF_FAIL(-TF_EFORMAT, "%s: size: expected %llu bytes as the dataset's catalog (%s) records, found %llu. The object was replaced after the catalog was written: restore it, or write the catalog again (tokenfeed index DATASET_DIR on the dataset's source directory, then upload its %s).",
            url, (ull)want, TF_DATASET_CATALOG_NAME, (ull)found, TF_DATASET_CATALOG_NAME);
}

/* Ask the store about lo's object (one request): its size against the
 * catalog's, and its version, to which every later read of the shard is
 * pinned as if a listing had shown it. */
static int ask_store(lazy_obj *lo, const tf_file *meta) {
    tf_object_info st;
    int rc = tf_remote_stat(lo->r, lo->url, &st);
    if (rc == -ENOENT)
        TF_FAIL(-ENOENT, "%s: does not exist, although the dataset's manifest names it (it was deleted, or never uploaded). The dataset is incomplete: upload every shard, or rewrite the dataset.",
                lo->url);
    if (rc) return rc;
    if (st.size != tf__file_size(meta)) return size_changed(lo->url, tf__file_size(meta), st.size);
    tf_object_info *keep = malloc(sizeof *keep), *none = NULL;
    if (!keep) return -ENOMEM;
    *keep = st;
    if (!atomic_compare_exchange_strong(&lo->stored, &none, keep)) free(keep); /* another touch asked too */
    return 0;
}

/* What to say, in an error about lo's object, of the catalog that described
 * it: which catalog, and how to write it again. */
static void catalog_what(const lazy_obj *lo, char *out, size_t cap) {
    if (lo->grp->catalog)
        snprintf(out, cap, "The shard set's catalog (%s) does not describe the object: it was written for other contents, or altered. Write it again (tokenfeed index on the set).",
                 lo->grp->catalog);
    else
        snprintf(out, cap, "The dataset's catalog (%s) does not describe the object: restore the object, or write the catalog again (tokenfeed index DATASET_DIR on the dataset's source directory, then upload its %s).",
                 TF_DATASET_CATALOG_NAME, TF_DATASET_CATALOG_NAME);
}

/* The object's bytes (its head, fetched into p) are of the format and dtype
 * the entry meta names, as the open without a catalog would find them: the
 * format the open was given, or what the object's magic says, and a
 * headerless object only with the dtype the open was given. An entry that
 * names another parser is never believed: the bytes would be read as tokens
 * of another layout (an llm.c header read as uint16 tokens). */
static int check_format(const lazy_obj *lo, const tf_file *meta, const tf__pobj *p) {
    tf_format fmt = lo->open_format != TF_FORMAT_AUTO ? lo->open_format : sniff_format(p);
    char what[768];
    if (fmt == TF_FORMAT_RAW && lo->open_dtype == TF_DTYPE_INVALID) fmt = TF_FORMAT_AUTO; /* not a token file */
    if (fmt == meta->format && (fmt != TF_FORMAT_RAW || meta->dtype == lo->open_dtype)) return 0;
    catalog_what(lo, what, sizeof what);
    if (fmt == TF_FORMAT_AUTO)
        TF_FAIL(-TF_EFORMAT, "%s: format: the catalog reads the object as %s, but its header has no tokenfeed, llm.c or .npy magic number and the open names no dtype for a headerless file. %s",
                meta->path, tf_format_name(meta->format), what);
    if (fmt == TF_FORMAT_RAW && meta->format == TF_FORMAT_RAW)
        TF_FAIL(-TF_EFORMAT, "%s: dtype: the catalog reads the headerless object as %s tokens, the open as %s. %s", meta->path,
                tf_dtype_name(meta->dtype), tf_dtype_name(lo->open_dtype), what);
    TF_FAIL(-TF_EFORMAT, "%s: format: the catalog reads the object as %s, but its bytes are %s (%s). %s", meta->path,
            tf_format_name(meta->format), tf_format_name(fmt),
            lo->open_format != TF_FORMAT_AUTO ? "the format the open names" : "the magic number of its header", what);
}

/* First touch of a shard known from the catalog: its header, document index
 * and tables fetched (conditional on the version listed at open, if one
 * was), parsed, and checked against the catalog's entry meta. */
static int lazy_obj_open(void *ctx, const tf_file *meta, tf_file *out) {
    lazy_obj *lo = ctx;
    const char *url = meta->path;
    if (lo->info.size != tf__file_size(meta)) return size_changed(url, tf__file_size(meta), lo->info.size);
again:;
    int unpinned = tf__version_from_catalog(lo_info(lo)->version);
    tf__preg g;
    memset(&g, 0, sizeof g);
    g.r = lo->r;
    g.meta_on = lo->meta_on;
    g.meta_key = lo->meta_key;
    /* the scheduler's touches, ahead of the reader, fetch the next shards'
     * headers too (it walks the stream one position at a time); a reader's
     * asks for what it waits for alone: its failure is this shard's, and
     * bounded as any request's */
    int rc = touch_fetch(&g, lo, scheduler_touch ? READ_AHEAD : 0);
    if (rc && rc != -EINTR && g.n > 1) {
        /* a shard fetched ahead may be what failed: this one alone */
        tf__preg_free(&g);
        tf__clearerr();
        rc = touch_fetch(&g, lo, 0);
    }
    if (!rc) rc = check_format(lo, meta, tf__preg_find(&g, url));
    if (!rc) {
        /* the parser of what the bytes are, which is the entry's (a shard
         * set's catalog holds llm.c, .npy and headerless objects too;
         * catalog.c) */
        tf_open_options o = {.format = meta->format,
                             .raw_dtype = meta->format == TF_FORMAT_RAW ? meta->dtype : TF_DTYPE_INVALID};
        tf__parse_fn parse = tf__parser_of(meta->format);
        rc = tf__preg_enter(&g);
        if (!rc) rc = parse ? parse(url, &o, out) : tf__seterr(-EINVAL, "%s: no parser (internal error)", url);
        tf__preg_enter(NULL);
    }
    if (!rc && tf__file_check_same(meta, out) != 0) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", tf_last_error());
        if (lo->grp->catalog)
            rc = tf__seterr(-TF_EFORMAT, "%s The shard set's catalog (%s) describes another object under the version listed now: it was altered, or the store changed the object without a new version. Write the catalog again (tokenfeed index on the set).",
                            msg, lo->grp->catalog);
        else
            rc = tf__seterr(-TF_EFORMAT, "%s The dataset's catalog (%s) describes the object as it was when the catalog was written: the object was replaced since. Restore it, or write the catalog again (tokenfeed index DATASET_DIR on the dataset's source directory, then upload its %s).",
                            msg, TF_DATASET_CATALOG_NAME, TF_DATASET_CATALOG_NAME);
    }
    tf__native_info oi;
    tf__native_info_of(out, &oi); /* (zero for other formats: no chunk table) */
    if (unpinned && rc != -EINTR && rc != -ENOMEM && (rc || !oi.chunk_table || !oi.chunk_bytes)) {
        /* Read unpinned (no listing gave the store's version), a shard's
         * bytes are kept right by the check against its entry (its header)
         * and by its chunk checksums (its tokens). One without chunk
         * checksums, or whose first touch failed (a shorter or missing object
         * fails before any check could), is asked about: its size against
         * the catalog's, then read again pinned to the version the store
         * gave. A failure stays the failure it was, unless the store's
         * answer explains it. */
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", rc ? tf_last_error() : "");
        int was = rc;
        tf__preg_free(&g);
        rc = ask_store(lo, meta);
        if (rc || was) return rc ? rc : tf__seterr(was, "%s", msg);
        tf__file_close(out);
        memset(out, 0, sizeof *out);
        goto again;
    }
    tf__pobj *p = rc ? NULL : tf__preg_find(&g, url);
    if (!rc && p && p->whole && p->claimed && !out->blocks.ops && p->info.size <= HEAD_BYTES) {
        /* A shard no larger than the head a first touch reads anyway was
         * fetched whole: its tokens stay in the map the parser took (no
         * second request for them), checked as chunks are (the GET was
         * conditional on the version listed; then the shard's chunk table,
         * when it has one). Larger ones read their tokens through the
         * node's chunk cache. */
        rc = check_tokens(out);
        /* its object all the same, for the scheduler (which places chunks
         * by it, and finds the store by any file's object) */
        tf__robj *o = NULL;
        if (!rc && !atomic_load(&lo->robj)) rc = tf__robj_from_info(lo->r, url, lo_info(lo), &o);
        uint64_t data_off = 0, data_len = 0;
        if (!rc && o) rc = token_region(out, &data_off, &data_len);
        if (!rc && o) rc = tf__robj_set_region(o, data_off, data_len, oi.chunk_table, oi.chunk_count, oi.chunk_bytes);
        if (!rc && o) {
            o->meta_on = lo->meta_on;
            o->meta_key = lo->meta_key;
            o->held_whole = 1;
            tf__robj *kept = NULL;
            if (atomic_compare_exchange_strong(&lo->robj, &kept, o)) o = NULL;
        }
        tf__robj_free(o);
        tf__preg_free(&g);
        return rc;
    }
    if (!rc) rc = finish_remote_file(&g, out);
    if (!rc) {
        /* one token region per shard, whichever touch made it first */
        tf__robj *mine = out->bytes_src, *kept = NULL;
        if (!atomic_compare_exchange_strong(&lo->robj, &kept, mine)) {
            tf__robj_free(mine);
            out->bytes_src = kept;
        }
        out->bytes_ops = &remote_borrowed_ops;
    }
    tf__preg_free(&g);
    return rc;
}

static const tf__lazy_src remote_lazy_src = {lazy_obj_open, lazy_obj_free};

/* A catalogued shard as the catalog knows it: its size, and for a version
 * a hash of its entry (TF__CATALOG_VERSION), which keys its ranges in the
 * node's cache: another catalog, describing other contents under the same
 * name, reads none of them. */
static void catalog_info(const tf_file *e, tf_object_info *info) {
    uint8_t rec[48];
    tf__put_le64(rec, tf__file_size(e));
    tf__put_le64(rec + 8, e->num_tokens);
    tf__put_le64(rec + 16, e->num_docs);
    tf__put_le64(rec + 24, e->fingerprint);
    tf__native_info ni;
    tf__native_info_of(e, &ni); /* (zero for other formats) */
    tf__put_le64(rec + 32, ni.sum_tokens);
    tf__put_le64(rec + 40, ni.sum_docs);
    memset(info, 0, sizeof *info);
    info->size = tf__file_size(e);
    snprintf(info->version, sizeof info->version, "%s%016llx", TF__CATALOG_VERSION, (ull)tf_hash64(rec, sizeof rec, 0));
}

/* Move t's catalogued shards into files, each with the object as the
 * catalog knows it: no shard is asked about at open (lazy_obj_open). */
static int adopt_catalog(tf__preg *g, target *t, const char *set_catalog, const tf_open_options *opt, tf_file **files,
                         uint64_t *nfiles, uint64_t *cap) {
    lazy_group *grp = calloc(1, sizeof *grp);
    lazy_obj **objs = calloc(t->ncat ? t->ncat : 1, sizeof *objs);
    char *cname = set_catalog ? strdup(set_catalog) : NULL;
    if (!grp || !objs || (set_catalog && !cname) || pthread_mutex_init(&grp->mu, NULL) != 0) {
        free(grp);
        free(objs);
        free(cname);
        return -ENOMEM;
    }
    grp->catalog = cname;
    grp->objs = objs;
    grp->n = (size_t)t->ncat;
    int rc = 0;
    for (uint64_t k = 0; k < t->ncat && !rc; k++) {
        tf__pobj *p = tf__preg_find(g, t->cat[k].path);
        lazy_obj *lo = calloc(1, sizeof *lo);
        if (lo) lo->url = strdup(t->cat[k].path);
        if (!lo || !lo->url) {
            free(lo);
            rc = -ENOMEM;
            break;
        }
        lo->r = tf__remote_ref(g->r);
        if (p && p->known && p->exists) lo->info = p->info; /* listed (a node record of an older open) */
        else catalog_info(&t->cat[k], &lo->info);
        lo->meta_on = g->meta_on;
        lo->meta_key = g->meta_key;
        const tf__format_row *er = tf__format_row_of(t->cat[k].format);
        lo->tail_hint = (er ? er->tail_per_doc * t->cat[k].num_docs : 0) + TAIL_BYTES; /* its document index */
        /* a dataset's shards are of the manifest's format (tf__open_native_dir);
         * a shard set's objects are what the open's options make of them */
        lo->open_format = set_catalog ? opt->format : tf__format_manifest_row()->format;
        lo->open_dtype = set_catalog ? opt->raw_dtype : TF_DTYPE_INVALID;
        lo->grp = grp;
        lo->idx = (size_t)k;
        objs[k] = lo;
        grp->alive++;
        tf__file_lazy_set_source(&t->cat[k], &remote_lazy_src, lo);
    }
    if (grp->alive == 0) { /* nothing refers to the group */
        pthread_mutex_destroy(&grp->mu);
        free(objs);
        free(grp->catalog);
        free(grp);
    }
    for (uint64_t k = 0; k < t->ncat && !rc; k++) {
        tf_file *f = tf__files_push(files, nfiles, cap);
        if (!f) return -ENOMEM;
        *f = t->cat[k];
        memset(&t->cat[k], 0, sizeof t->cat[k]);
    }
    return rc;
}

/* ------------------------------------------------------------------------ */
/* a remote shard set's catalog beside the data                              */
/* ------------------------------------------------------------------------ */

/* A shard set in object storage: the objects prefix + a name matching
 * pattern ("" for every data object under the prefix), as listed. */
typedef struct set_spec {
    const char *prefix, *pattern;     /* pattern NULL: no catalog */
    const tf_remote_listing *listing; /* the set's listing, when the caller has it */
    unsigned flags;                   /* TF_OPEN_IMMUTABLE: see open_remote */
} set_spec;

/* What a listing the caller took just now shows (the set's, which it
 * expanded): the sizes and versions of the objects registered, and those
 * under its prefix that it does not show absent, as learn_sizes does with a
 * listing of its own. */
static void apply_listing(tf__preg *g, const tf_remote_listing *l) {
    listed ctx = {g, l->prefix};
    for (size_t i = 0; i < l->n; i++)
        if (l->urls[i]) on_listed(&ctx, l->urls[i], &l->infos[i]);
    absent_unless_listed(g, l->prefix);
}

static char *set_catalog_url(const set_spec *set, const tf_open_options *opt) {
    char name[64];
    tf__catalog_objects_name(set->pattern, opt, name, sizeof name);
    return tf__cat2(set->prefix, name);
}

/* The shard set urls[0, n), as its listing shows it (g learnt), from its
 * catalog cu: every object's entry, opened on first touch. -ENOENT when
 * there is no catalog, -ESTALE when the catalog does not describe the set as
 * listed now (an object added, removed or rewritten since, a companion
 * object that changes how one reads, another version of tokenfeed). */
static int open_set_catalog(tf__preg *g, const char *cu, const set_spec *set, const char *const *urls, size_t n,
                            const tf_open_options *opt, tf_file **files, uint64_t *nfiles, uint64_t *cap) {
    tf__pobj *pc = tf__preg_find(g, cu);
    if (!pc || !pc->exists)
        TF_FAIL(-ENOENT, "%s: no catalog of the shard set %s%s in object storage", cu, set->prefix, set->pattern);
    fetch_plan fp = {NULL, 0, 0};
    int rc = plan_head_tail(&fp, pc, 0);
    if (!rc) rc = run_plan(g, &fp);
    free(fp.w);
    if (rc) return rc;
    target t;
    memset(&t, 0, sizeof t);
    if (tf__catalog_parse_objects(set->prefix, set->pattern, opt, pc->map, (size_t)pc->info.size, &t.cat, &t.ncat) != 0)
        TF_FAIL(-ESTALE, "%s: not a catalog of this shard set with these open options (damaged, or written by another version of tokenfeed): the set's objects are read instead. Write it again with `tokenfeed index '%s%s'`.",
                cu, set->prefix, set->pattern);
    char why[1536];
    why[0] = '\0';
    if (t.ncat != n)
        snprintf(why, sizeof why, "the set has %zu objects now, the catalog %llu", n, (ull)t.ncat);
    for (size_t i = 0; !why[0] && i < n; i++) {
        const tf_file *e = &t.cat[i];
        tf__file_id id[2];
        tf__file_lazy_ids(e, id);
        tf__pobj *p = tf__preg_find(g, urls[i]);
        if (strcmp(e->path, urls[i]) != 0)
            snprintf(why, sizeof why, "object %zu of the set is %s now, %s in the catalog", i, urls[i], e->path);
        else if (!p || !p->known || !p->exists)
            snprintf(why, sizeof why, "%s is not listed", urls[i]);
        else if (p->info.size != id[0].size)
            snprintf(why, sizeof why, "%s holds %llu bytes now, %llu in the catalog", urls[i], (ull)p->info.size,
                     (ull)id[0].size);
        else if (tf__catalog_version_hash(p->info.version) != id[0].mtime_ns)
            snprintf(why, sizeof why, "%s was rewritten since (its version is %s now)", urls[i],
                     p->info.version[0] ? p->info.version : "none");
        else {
            /* read as the catalog has it: a file of its own now too (no
             * dataset manifest or Megatron pair under its name, no datatrove
             * index beside a headerless one) */
            target r;
            memset(&r, 0, sizeof r);
            r.url = urls[i];
            int k = resolve(g, &r, opt) == 0 ? (int)r.k : -1;
            const tf__format_row *pr = r.row;
            free(r.path);
            tf__clearerr();
            /* a companion of its format that a remote open reads (format
             * table) beside it now */
            const tf__format_row *er = tf__format_row_of(e->format);
            const char *comp = NULL;
            for (size_t j = 0; !rc && !comp && er && er->companions && er->companions[j].suffix; j++) {
                if (!er->companions[j].fetch) continue;
                char *c = tf__companion_name(&er->companions[j], urls[i]);
                if (!c) rc = -ENOMEM;
                else if (exists(g, c)) comp = er->companions[j].what;
                free(c);
            }
            if (!rc && (k != K_FILE || comp))
                snprintf(why, sizeof why, "%s is read with a companion object now (%s)", urls[i],
                         k == K_DIR ? "a dataset manifest" : k == K_PAIR ? pr->companions[0].what : comp);
            if (rc) break;
        }
    }
    if (!rc && why[0])
        rc = tf__seterr(-ESTALE, "%s: the shard set's catalog is out of date (%s): the set's objects are read instead. Write it again with `tokenfeed index '%s%s'` once the set is complete.",
                        cu, why, set->prefix, set->pattern);
    if (!rc) rc = adopt_catalog(g, &t, cu, opt, files, nfiles, cap);
    for (uint64_t k = 0; k < t.ncat; k++) tf__file_close(&t.cat[k]);
    free(t.cat);
    return rc;
}

/* The entries of files[first, n), opened from the shard set's catalog cu,
 * that hold no tokens, checked now: nothing ever reads such a file, so no
 * first touch would check it, and an entry that says an object of tokens
 * holds none would drop its tokens from the set unseen. Each is touched as a
 * first read touches a file (its header fetched once per node, through the
 * node's cache, and checked against its entry); a set without empty objects
 * costs nothing more. One that does not match makes the catalog out of date
 * (-ESTALE: the set's objects are read instead). */
static int touch_empty(const char *cu, const set_spec *set, tf_file *files, uint64_t first, uint64_t n) {
    for (uint64_t k = first; k < n; k++) {
        if (files[k].num_tokens) continue;
        int rc = tf__file_touch(&files[k]);
        if (rc == -TF_EFORMAT) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", tf_last_error());
            TF_FAIL(-ESTALE, "%s: the shard set's catalog does not describe an object it lists as holding no tokens (%s): the set's objects are read instead. Write it again with `tokenfeed index '%s%s'`.",
                    cu, msg, set->prefix, set->pattern);
        }
        if (rc) return rc;
    }
    return 0;
}

/* The object f is read from: its size and version (for a shard known from a
 * catalog, as the open knows it). NULL when f is not a remote file. */
static const tf_object_info *file_object(const tf_file *f) {
    if (f->bytes_ops == &remote_byte_ops || f->bytes_ops == &remote_borrowed_ops)
        return f->bytes_src ? &((const tf__robj *)f->bytes_src)->info : NULL;
    lazy_obj *lo = tf__file_lazy_source(f, &remote_lazy_src);
    return lo ? lo_info(lo) : NULL;
}

int tf_dataset_remote_set_catalog(const tf_dataset *ds, const char *prefix, const char *pattern,
                                  const tf_open_options *opt, void *buf, size_t cap, size_t *len) {
    tf__clearerr();
    if (!ds || !prefix || !pattern || !len)
        TF_FAIL(-EINVAL, "tf_dataset_remote_set_catalog: a dataset, a prefix, a pattern and len are required");
    *len = 0;
    if (ds->borrowed) TF_FAIL(-EINVAL, "a view of datasets has no catalog of its own");
    tf_open_options dflt = {.format = TF_FORMAT_AUTO, .raw_dtype = TF_DTYPE_INVALID};
    if (!opt) opt = &dflt;
    const char **versions = calloc(ds->nfiles ? ds->nfiles : 1, sizeof *versions);
    uint64_t *sizes = calloc(ds->nfiles ? ds->nfiles : 1, sizeof *sizes);
    if (!versions || !sizes) {
        free(versions);
        free(sizes);
        return -ENOMEM;
    }
    int rc = 0;
    for (uint64_t i = 0; i < ds->nfiles && !rc; i++) {
        const tf_object_info *info = file_object(&ds->files[i]);
        if (!info)
            rc = tf__seterr(-EINVAL, "%s: not an object in object storage: a catalog there describes remote objects",
                            ds->files[i].path);
        else if (tf__version_from_catalog(info->version))
            rc = tf__seterr(-EINVAL, "%s: opened from a dataset's catalog, without its version from the store: open the set by its listing to catalogue it",
                            ds->files[i].path);
        else {
            versions[i] = info->version;
            sizes[i] = info->size;
        }
    }
    uint8_t *b = NULL;
    size_t n = 0;
    if (!rc) rc = tf__catalog_pack_objects(prefix, pattern, opt, ds->files, sizes, versions, ds->nfiles, &b, &n);
    free(versions);
    free(sizes);
    if (rc) return rc;
    *len = n;
    if (buf && cap >= n) memcpy(buf, b, n);
    else rc = -ENOSPC;
    free(b);
    return rc;
}

int tf_remote_set_catalog_name(const char *pattern, const tf_open_options *opt, char *name, size_t cap) {
    tf__clearerr();
    if (!pattern || !name || cap < 40) TF_FAIL(-EINVAL, "tf_remote_set_catalog_name: a pattern and 40 bytes for the name are required");
    tf_open_options dflt = {.format = TF_FORMAT_AUTO, .raw_dtype = TF_DTYPE_INVALID};
    tf__catalog_objects_name(pattern, opt ? opt : &dflt, name, cap);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* the open                                                                  */
/* ------------------------------------------------------------------------ */

static int fetch_and_open(tf__preg *g, target *ts, size_t nt, const tf_remote_listing *listing,
                          const tf_open_options *opt, tf_file **files, uint64_t *nfiles, uint64_t *cap) {
    fetch_plan fp = {NULL, 0, 0};
    int rc = 0;
    /* manifests first: they name the shards; with their catalogs, which
     * describe them */
    for (size_t i = 0; i < nt && !rc; i++)
        if (ts[i].k == K_DIR) {
            char *mf = tf__path_join(ts[i].path, TF_MANIFEST_NAME);
            char *cf = tf__path_join(ts[i].path, TF_DATASET_CATALOG_NAME);
            tf__pobj *p = mf ? tf__preg_find(g, mf) : NULL, *pc = cf ? tf__preg_find(g, cf) : NULL;
            rc = p ? plan_head_tail(&fp, p, 0) : -ENOMEM;
            if (!rc && pc && pc->known && pc->exists) rc = plan_head_tail(&fp, pc, 0);
            free(mf);
            free(cf);
        }
    if (!rc) rc = run_plan(g, &fp);
    for (size_t i = 0; i < nt && !rc; i++) {
        if (ts[i].k != K_DIR) continue;
        char *mf = tf__path_join(ts[i].path, TF_MANIFEST_NAME);
        tf__pobj *p = mf ? tf__preg_find(g, mf) : NULL;
        rc = p ? tf__parse_manifest(mf, p->map, (size_t)p->info.size, &ts[i].m) : -ENOMEM;
        ts[i].have_m = rc == 0;
        if (!rc) rc = read_catalog(g, &ts[i], p, opt);
        /* with a catalog, no shard is asked about at open: the catalog has
         * their sizes, and each first touch checks what it reads against it */
        for (uint64_t s = 0; !rc && !ts[i].cat && s < ts[i].m.num_shards; s++) {
            char *su = tf__path_join(ts[i].path, ts[i].m.shards[s].name);
            if (!su || !tf__preg_add(g, su)) rc = -ENOMEM;
            free(su);
        }
        free(mf);
    }
    /* the shards the manifests named, as the listing the caller expanded
     * the dataset's URL with shows them (a directory URL is listed once,
     * not once by the caller and again here) */
    if (!rc && listing) apply_listing(g, listing);
    if (!rc) rc = learn_sizes(g);
    /* heads and tails of everything a parser will read */
    for (size_t i = 0; i < nt && !rc; i++) {
        target *t = &ts[i];
        if (t->k == K_DIR && t->cat) {
            continue; /* a shard's header is read on first touch */
        } else if (t->k == K_DIR) {
            for (uint64_t s = 0; !rc && s < t->m.num_shards; s++) {
                char *su = tf__path_join(t->path, t->m.shards[s].name);
                tf__pobj *p = su ? tf__preg_find(g, su) : NULL;
                if (!p) rc = -ENOMEM;
                else if (!p->exists)
                    rc = tf__seterr(-ENOENT, "%s: the manifest names this shard, but there is no such object. The dataset is incomplete: upload every shard, or rewrite the dataset.",
                                    su);
                else
                    rc = plan_head_tail(&fp, p, t->m.shards[s].num_docs * t->row->tail_per_doc + TAIL_BYTES);
                free(su);
            }
        } else if (t->k == K_PAIR) {
            char *bin = tf__pair_name(t->row, t->path, 0), *idx = tf__pair_name(t->row, t->path, 1);
            tf__pobj *pb = bin ? tf__preg_find(g, bin) : NULL, *pi = idx ? tf__preg_find(g, idx) : NULL;
            rc = pb && pi ? plan_head_tail(&fp, pb, 0) : -ENOMEM;
            if (!rc) rc = plan_head_tail(&fp, pi, 0);
            free(bin);
            free(idx);
        } else {
            tf__pobj *p = tf__preg_find(g, t->path);
            rc = p ? plan_head_tail(&fp, p, 0) : -ENOMEM;
            /* companions of its possible formats that exist (format table) */
            for (size_t i = 0; !rc && tf__format_at(i); i++) {
                const tf__format_row *r = tf__format_at(i);
                int oom = 0;
                char *c;
                for (size_t k = 0; !rc && (c = tf__format_companion(r->format, t->path, k, &oom)) != NULL; k++) {
                    tf__pobj *pc = tf__preg_find(g, c);
                    if (pc && pc->exists && !pc->whole) rc = plan_head_tail(&fp, pc, 0);
                    free(c);
                }
                if (oom) rc = -ENOMEM;
            }
        }
    }
    if (!rc) rc = run_plan(g, &fp);
    if (!rc) rc = plan_missing(g, &fp);
    if (!rc) rc = run_plan(g, &fp);
    free(fp.w);
    if (rc) return rc;

    /* the parsers, on the prepared maps */
    for (size_t i = 0; i < nt && !rc; i++) {
        target *t = &ts[i];
        uint64_t first = *nfiles;
        if (t->k == K_DIR && t->cat) {
            rc = adopt_catalog(g, t, NULL, opt, files, nfiles, cap);
            continue; /* nothing to finish: each is opened on first touch */
        } else if (t->k == K_DIR) {
            rc = tf__open_native_dir(t->path, opt, files, nfiles, cap);
        } else {
            if (t->k == K_PAIR) {
                char *idx = tf__pair_name(t->row, t->path, 1);
                tf__pobj *pi = idx ? tf__preg_find(g, idx) : NULL;
                free(idx);
                if (!pi) return -ENOMEM;
                tf__target rt = {TF__TARGET_PAIR, t->row, t->path, t->else_file};
                rc = tf__resolve_confirm(&rt, t->url, pi->map, pi->info.size < 64 ? (size_t)pi->info.size : 64);
                t->path = rt.path;
                t->row = rt.row;
                if (rc) return rc;
                if (rt.kind == TF__TARGET_FILE) {
                    /* not the pair after all: the URL is a file of its own */
                    t->k = K_FILE;
                    t->row = tf__format_row_of(opt->format);
                    tf__pobj *p = tf__preg_find(g, t->path);
                    fetch_plan f2 = {NULL, 0, 0};
                    rc = p ? plan_head_tail(&f2, p, 0) : -ENOMEM;
                    if (!rc) rc = run_plan(g, &f2);
                    free(f2.w);
                    if (rc) return rc;
                }
            }
            tf_format fmt = t->row ? t->row->format : TF_FORMAT_AUTO;
            if (fmt == TF_FORMAT_AUTO) {
                fmt = sniff_format(tf__preg_find(g, t->path));
                TF_TRY(tf__resolve_sniffed(t->url, fmt, opt->raw_dtype, ""));
            }
            tf_file *f = tf__files_push(files, nfiles, cap);
            if (!f) return -ENOMEM;
            const tf__format_row *row = tf__format_row_of(fmt);
            rc = row ? row->parse(t->path, opt, f) : tf__seterr(-EINVAL, "%s: unknown format code %d", t->url, (int)fmt);
            if (rc < 0) {
                tf__file_close(f);
                (*nfiles)--;
            }
        }
        for (uint64_t k = first; k < *nfiles && !rc; k++) rc = finish_remote_file(g, &(*files)[k]);
    }
    return rc;
}

/* One open of urls with the registry g (empty, or filled from the node's
 * metadata record). */
static int open_pass(tf__preg *g, const char *const *urls, size_t n, const set_spec *set, const tf_open_options *opt,
                     tf_file **files, uint64_t *nfiles, uint64_t *cap) {
    target *ts = calloc(n, sizeof *ts);
    char *cu = set && set->pattern ? set_catalog_url(set, opt) : NULL;
    if (!ts || (set && set->pattern && !cu)) {
        free(ts);
        free(cu);
        return -ENOMEM;
    }
    /* a shard set's catalog is learnt with its objects (in their listing) */
    int rc = cu && !tf__preg_add(g, cu) ? -ENOMEM : 0;
    for (size_t i = 0; i < n && !rc; i++) {
        ts[i].url = urls[i];
        rc = register_candidates(g, urls[i], opt);
    }
    if (!rc && set && set->listing) apply_listing(g, set->listing);
    if (!rc) rc = learn_sizes(g);
    if (!rc && cu) {
        uint64_t first = *nfiles;
        rc = tf__preg_enter(g);
        if (!rc) rc = open_set_catalog(g, cu, set, urls, n, opt, files, nfiles, cap);
        tf__preg_enter(NULL);
        if (!rc) rc = touch_empty(cu, set, *files, first, *nfiles);
        if (rc) {
            for (uint64_t k = first; k < *nfiles; k++) tf__file_close(&(*files)[k]);
            *nfiles = first;
        }
        free(ts);
        free(cu);
        return rc;
    }
    free(cu);
    for (size_t i = 0; i < n && !rc; i++) rc = resolve(g, &ts[i], opt);
    if (!rc) {
        rc = tf__preg_enter(g);
        if (!rc) rc = fetch_and_open(g, ts, n, set ? set->listing : NULL, opt, files, nfiles, cap);
        tf__preg_enter(NULL);
    }
    for (size_t i = 0; i < n; i++) {
        free(ts[i].path);
        if (ts[i].have_m) tf__manifest_free(&ts[i].m);
        for (uint64_t k = 0; k < ts[i].ncat; k++) tf__file_close(&ts[i].cat[k]);
        free(ts[i].cat);
    }
    free(ts);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* the node's record, checked against the store at every open                */
/* ------------------------------------------------------------------------ */

/* A version without what a listing and a HEAD may put around the same tag
 * differently: the weak marker and the quotes (RFC 7232's weak comparison). */
static const char *bare_version(const char *v, size_t *n) {
    if (!strncmp(v, "W/", 2)) v += 2;
    size_t k = strlen(v);
    if (k >= 2 && v[0] == '"' && v[k - 1] == '"') {
        v++;
        k -= 2;
    }
    *n = k;
    return v;
}

static int version_same(const char *a, const char *b) {
    size_t na, nb;
    a = bare_version(a, &na);
    b = bare_version(b, &nb);
    return na == nb && !memcmp(a, b, na);
}

typedef struct recheck {
    tf__preg *g;
    uint8_t *state; /* per object of g: 0 to ask, 1 in a listing being read, 2 answered,
                     * 3 to ask by itself (the store lists nothing) */
    char *why;      /* the first difference found ("" while none) */
    size_t cap;
} recheck;

static void compare_now(recheck *c, const tf__pobj *p, const tf_object_info *now) {
    if (c->why[0]) return;
    if (!now)
        snprintf(c->why, c->cap, "%s no longer exists", p->url);
    else if (now->size != p->info.size)
        snprintf(c->why, c->cap, "%s holds %llu bytes now, %llu when this node recorded it", p->url, (ull)now->size,
                 (ull)p->info.size);
    else if (!version_same(now->version, p->info.version))
        snprintf(c->why, c->cap, "%s was rewritten since this node recorded it (version %s then, %s now)", p->url,
                 p->info.version, now->version[0] ? now->version : "none");
}

static int on_rechecked(void *ctx, const char *url, const tf_object_info *info) {
    recheck *c = ctx;
    tf__pobj *p = tf__preg_find(c->g, url);
    size_t i = p ? (size_t)(p - c->g->o) : 0;
    if (!p || c->state[i] != 1) return 0;
    c->state[i] = 2;
    compare_now(c, p, info);
    return 0;
}

static int pick_to_ask(const tf__preg *g, size_t i, const void *state) {
    return g->o[i].exists && !((const uint8_t *)state)[i];
}

/* Whether the store still holds every object of the record g (filled from
 * the node's record) at the size and version recorded: 0 when it does, 1
 * when not (why says the first difference), or an error of asking. Asked as
 * the open itself learns sizes: a listing per parent prefix of at least 16
 * recorded objects (one request per 1000 objects), one HEAD per object
 * otherwise, concurrently; of a tokenfeed dataset, its manifest alone. Names
 * recorded absent are not asked about ("objects added later",
 * docs/remote.md). */
static int record_changed(tf__preg *g, char *why, size_t cap) {
    why[0] = '\0';
    recheck c = {g, calloc(g->n ? g->n : 1, 1), why, cap};
    size_t *idx = malloc((g->n ? g->n : 1) * sizeof *idx);
    const char **urls = malloc((g->n ? g->n : 1) * sizeof *urls);
    tf_object_info *infos = malloc((g->n ? g->n : 1) * sizeof *infos);
    int *rcs = malloc((g->n ? g->n : 1) * sizeof *rcs);
    int rc = c.state && idx && urls && infos && rcs ? 0 : -ENOMEM;
    /* A tokenfeed dataset is what its manifest says: a shard or a catalog
     * beside a recorded manifest is checked against it (its header against
     * the manifest's counts and checksums, its tokens against the chunk
     * checksums of that header), so the manifest's version alone says whether
     * the dataset is the one recorded. */
    for (size_t i = 0; i < g->n && !rc; i++) {
        const char *u = g->o[i].url;
        size_t pl = parent_len(u);
        if (!g->o[i].exists || !pl || !strcmp(u + pl, TF_MANIFEST_NAME)) continue;
        char *mf = malloc(pl + sizeof TF_MANIFEST_NAME);
        if (!mf) {
            rc = -ENOMEM;
            break;
        }
        memcpy(mf, u, pl);
        memcpy(mf + pl, TF_MANIFEST_NAME, sizeof TF_MANIFEST_NAME);
        if (exists(g, mf)) c.state[i] = 2;
        free(mf);
    }
    by_parent *v = NULL;
    size_t nv = 0;
    if (!rc) rc = group_by_parent(g, pick_to_ask, c.state, &v, &nv);
    for (size_t a = 0, b; a < nv && !rc && !why[0]; a = b) {
        b = group_end(v, nv, a);
        if (b - a < LIST_AT_LEAST) continue;
        char *prefix = strndup(v[a].url, v[a].pl);
        if (!prefix) {
            rc = -ENOMEM;
            break;
        }
        for (size_t k = a; k < b; k++) c.state[v[k].i] = 1;
        rc = tf__remote_list_node(g->r, prefix, g->list_flags, on_rechecked, &c);
        free(prefix);
        for (size_t k = a; k < b; k++)
            if (c.state[v[k].i] == 1) {
                c.state[v[k].i] = rc == -TF_EUNSUPPORTED ? 3 : 2; /* (no listing: asked one by one below) */
                if (!rc) compare_now(&c, &g->o[v[k].i], NULL);  /* not listed: gone */
            }
        if (rc == -TF_EUNSUPPORTED) rc = 0;
    }
    free(v);
    size_t m = 0;
    for (size_t i = 0; i < g->n && !rc && !why[0]; i++)
        if (g->o[i].exists && (c.state[i] == 0 || c.state[i] == 3)) {
            idx[m] = i;
            urls[m++] = g->o[i].url;
        }
    if (!rc && !why[0] && m) rc = tf__remote_stat_many(g->r, urls, m, infos, rcs);
    for (size_t k = 0; k < m && !rc && !why[0]; k++) {
        if (rcs[k] == 0) compare_now(&c, &g->o[idx[k]], &infos[k]);
        else if (rcs[k] == -ENOENT) compare_now(&c, &g->o[idx[k]], NULL);
        else rc = rcs[k];
    }
    free(c.state);
    free(idx);
    free(urls);
    free(infos);
    free(rcs);
    if (rc) return rc;
    return why[0] ? 1 : 0;
}

/* The node's record of this open into g, when there is one and the store
 * still shows every object it names as it was recorded: 1. Else 0: no record,
 * or one of objects changed since, which is deleted (the open then reads the
 * metadata again, so this node moves to the new version, as a node without a
 * record reads it: never two versions under one name on the nodes of a job),
 * and said through the notice function. Negative: the store could not be
 * asked. */
static int load_current(tf_remote *r, tf__preg *g, const char *what) {
    if (tf__meta_load(r, g->meta_key, g) != 0) return 0;
    /* immutable: the caller vouches that the objects are as this node
     * recorded them (each read is still conditional on its version) */
    if (g->list_flags & TF_OPEN_IMMUTABLE) return 1;
    char why[1024];
    int rc = record_changed(g, why, sizeof why);
    if (rc == 0) return 1;
    tf__preg_free(g);
    if (rc < 0) return rc;
    tf__cache_meta_forget(tf__remote_cache(r), g->meta_key);
    tf__notice("%s: %s: reading its metadata again. This node now reads the new version, whose dataset fingerprint differs: a loader state saved on the old one is refused.",
               what, why);
    tf__clearerr();
    return 0;
}

static int open_remote(const char *const *urls, size_t n, const set_spec *set, const tf_open_options *opt,
                       tf_remote *r, tf_file **files, uint64_t *nfiles, uint64_t *cap) {
    if (!r)
        TF_FAIL(-EINVAL, "%s: a remote URL needs a remote store: open it with tf_dataset_open_remote and a tf_remote (tf_remote_create), or with tokenfeed.open() from Python",
                urls[0]);
    /* The node's record of this open's metadata: read it, or wait for the
     * process of the node that is fetching it, or fetch it and write it
     * (remote_meta.c). */
    tf__preg g;
    memset(&g, 0, sizeof g);
    g.r = r;
    g.meta_on = tf__cache_meta_fd(tf__remote_cache(r)) >= 0;
    g.meta_key = set && set->pattern ? tf__meta_key_set(urls, n, opt, set->prefix, set->pattern)
                                     : tf__meta_key(urls, n, opt);
    g.record_max = tf__meta_max_bytes(r);
    g.list_flags = set ? set->flags : 0;
    int loaded = 0, lock_fd = -1, waited = 0, rc = 0;
    if (g.meta_on) {
        /* a record is used only while the store shows its objects as it
         * recorded them (one listing of their prefix, or a HEAD each) */
        rc = load_current(r, &g, urls[0]);
        loaded = rc > 0;
        if (rc >= 0 && !loaded) rc = tf__meta_lock(r, g.meta_key, urls[0], &lock_fd, &waited);
        /* written by a holder meanwhile (waited for, or done just before) */
        if (rc >= 0 && !loaded) {
            rc = load_current(r, &g, urls[0]);
            loaded = rc > 0;
        }
        if (rc > 0) rc = 0;
        /* only a process that found the lock free fetches under it; one that
         * waited and found no record (its holder failed or died) fetches
         * without, as every process would without the record */
        if (loaded || waited) {
            tf__meta_unlock(lock_fd);
            lock_fd = -1;
        }
    }
    uint64_t first = *nfiles;
    g.record = g.meta_on && !loaded;
    if (!rc) rc = open_pass(&g, urls, n, set, opt, files, nfiles, cap);
    if (rc && rc != -EINTR && loaded) {
        /* the record did not open (damaged in a way its checksum missed, or
         * written by another build): drop it and fetch */
        for (uint64_t k = first; k < *nfiles; k++) tf__file_close(&(*files)[k]);
        *nfiles = first;
        tf__preg_free(&g);
        tf__cache_meta_forget(tf__remote_cache(r), g.meta_key);
        tf__clearerr();
        loaded = 0;
        g.list_flags = set ? set->flags : 0;
        g.record = 1;
        g.too_big = g.fetched = 0;
        rc = open_pass(&g, urls, n, set, opt, files, nfiles, cap);
    }
    if (!rc && g.meta_on && !loaded && !g.too_big) tf__meta_save(r, g.meta_key, &g);
    if (!rc && loaded && g.fetched) tf__cache_meta_forget(tf__remote_cache(r), g.meta_key); /* incomplete: the next open writes it whole */
    tf__meta_unlock(lock_fd);
    tf__preg_free(&g);
    return rc;
}

int tf__open_remote_many(const char *const *urls, size_t n, const tf_open_options *opt, tf_remote *r,
                         tf_file **files, uint64_t *nfiles, uint64_t *cap) {
    return open_remote(urls, n, NULL, opt, r, files, nfiles, cap);
}

static int open_urls(void *ctx, const char *const *urls, size_t n, const tf_open_options *opt, tf_file **files,
                     uint64_t *nfiles, uint64_t *cap) {
    return tf__open_remote_many(urls, n, opt, ctx, files, nfiles, cap);
}

typedef struct set_open {
    tf_remote *r;
    set_spec set;
} set_open;

static int open_set_urls(void *ctx, const char *const *urls, size_t n, const tf_open_options *opt, tf_file **files,
                         uint64_t *nfiles, uint64_t *cap) {
    set_open *so = ctx;
    return open_remote(urls, n, &so->set, opt, so->r, files, nfiles, cap);
}

int tf_dataset_open_remote_set(const char *const *urls, size_t n, const char *prefix, const char *pattern,
                               const tf_remote_listing *listing, const tf_open_options *opt, tf_remote *remote,
                               tf_dataset **out) {
    TF_NEED_ARG(out);
    *out = NULL;
    tf__clearerr();
    if (!urls || n == 0 || !prefix || !remote)
        TF_FAIL(-EINVAL, "tf_dataset_open_remote_set: the set's URLs, its prefix and a remote are required");
    if (listing && (!listing->prefix || (listing->n && (!listing->urls || !listing->infos))))
        TF_FAIL(-EINVAL, "tf_dataset_open_remote_set: a listing needs its prefix, and a URL and an info per object");
    if (!tf__is_url(prefix)) TF_FAIL(-EINVAL, "%s: not a URL: a catalog in object storage describes a remote shard set", prefix);
    size_t plen = strlen(prefix);
    for (size_t i = 0; i < n; i++)
        if (!urls[i] || strncmp(urls[i], prefix, plen) != 0)
            TF_FAIL(-EINVAL, "%s: not under the shard set's prefix %s", urls[i] ? urls[i] : "(NULL)", prefix);
    set_open so = {remote, {prefix, pattern, listing, 0}};
    return tf__dataset_open_paths(urls, n, opt, open_set_urls, &so, out);
}

static const tf_open_options spec_defaults = {.format = TF_FORMAT_AUTO, .raw_dtype = TF_DTYPE_INVALID};

/* Whether the listing shows the object url. */
static int objlist_has(const tf__objlist *v, const char *url) {
    size_t lo = 0, hi = v->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(v->urls[mid], url);
        if (!c) return 1;
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return 0;
}

int tf_dataset_open_remote_spec(const char *const *spec, size_t n, const tf_open_options *opt, unsigned flags,
                                tf_remote *remote, tf_dataset **out) {
    TF_NEED_ARG(out);
    *out = NULL;
    tf__clearerr();
    if (!spec || n == 0) TF_FAIL(-EINVAL, "tf_dataset_open_remote_spec: no path given");
    if (flags & ~(unsigned)(TF_OPEN_IMMUTABLE | TF_OPEN_SET_CATALOG))
        TF_FAIL(-EINVAL, "tf_dataset_open_remote_spec: flags: unknown bits 0x%x", flags);
    for (size_t i = 0; i < n; i++)
        if (!spec[i]) TF_FAIL(-EINVAL, "path %zu is NULL", i);
    const tf_open_options *o = opt ? opt : &spec_defaults;
    int any_url = 0;
    for (size_t i = 0; i < n; i++) any_url |= tf__is_url(spec[i]);
    if (!any_url || !remote) {
        if (flags & TF_OPEN_SET_CATALOG) TF_FAIL(-EINVAL, "TF_OPEN_SET_CATALOG opens a remote shard set: it needs a remote");
        return tf__dataset_open_paths(spec, n, opt, open_urls, remote, out);
    }
    /* every remote spec expanded from one listing of its prefix (per node) */
    char **all = NULL;
    size_t nall = 0, cap = 0;
    tf__objlist listing;
    memset(&listing, 0, sizeof listing);
    char *prefix = NULL;
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        char **f = NULL;
        size_t nf = 0;
        if (tf__is_url(spec[i])) {
            tf__objlist l;
            char *p = NULL;
            rc = tf__remote_expand(remote, spec[i], o, flags & TF_OPEN_IMMUTABLE, &f, &nf, &l, &p);
            if (!rc && n == 1) {
                listing = l;
                prefix = p;
            } else {
                if (!rc) tf__objlist_free(&l);
                free(p);
            }
        } else {
            f = malloc(sizeof *f);
            if (!f || !(f[0] = strdup(spec[i]))) rc = -ENOMEM;
            else nf = 1;
        }
        if (!rc && nall + nf > cap) {
            size_t c = cap ? cap : 16;
            while (c < nall + nf) c *= 2;
            char **g = realloc(all, c * sizeof *g);
            if (!g) rc = -ENOMEM;
            else {
                all = g;
                cap = c;
            }
        }
        for (size_t k = 0; k < nf; k++) {
            if (!rc) all[nall++] = f[k];
            else free(f[k]);
        }
        free(f);
    }
    char *cprefix = NULL, *pattern = NULL;
    if (!rc && (flags & TF_OPEN_SET_CATALOG)) {
        /* the set's catalog beside the data: there only when the listing shows it */
        char name[64];
        char *cu = NULL;
        if (n != 1 || !prefix || tf__pathspec_url_set(spec[0], &cprefix, &pattern) != 0 || strcmp(cprefix, prefix) != 0) {
            free(pattern); /* not a set under one prefix: no catalog beside the data */
            pattern = NULL;
        } else if (tf__catalog_objects_name(pattern, o, name, sizeof name), !(cu = tf__cat2(cprefix, name)))
            rc = -ENOMEM;
        else if (!objlist_has(&listing, cu)) {
            free(pattern); /* none under this open's key: the objects are read */
            pattern = NULL;
        }
        free(cu);
    }
    if (!rc) {
        tf_remote_listing tl = {prefix, (const char *const *)listing.urls, listing.infos, listing.n};
        /* the listing is the set's when every file lies under its prefix */
        int whole = prefix != NULL;
        for (size_t i = 0; whole && i < nall; i++) whole = strncmp(all[i], prefix, strlen(prefix)) == 0;
        if (whole) tf__listing_in_use(prefix, &listing); /* the rest of this open lists nothing again */
        if (whole || (flags & TF_OPEN_IMMUTABLE)) {
            set_open so = {remote, {whole ? prefix : "", whole ? pattern : NULL, whole ? &tl : NULL, flags & TF_OPEN_IMMUTABLE}};
            rc = tf__dataset_open_paths((const char *const *)all, nall, opt, open_set_urls, &so, out);
            tf__listing_in_use(NULL, NULL);
        } else {
            rc = tf__dataset_open_paths((const char *const *)all, nall, opt, open_urls, remote, out);
        }
    }
    for (size_t i = 0; i < nall; i++) free(all[i]);
    free(all);
    free(cprefix);
    free(pattern);
    free(prefix);
    tf__objlist_free(&listing);
    return rc;
}

int tf_dataset_open_remote(const char *const *paths, size_t n, const tf_open_options *opt, tf_remote *remote,
                           tf_dataset **out) {
    return tf_dataset_open_remote_spec(paths, n, opt, 0, remote, out);
}
