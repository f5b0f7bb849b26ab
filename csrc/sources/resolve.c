/*
 * resolve.c — what a path or URL names, decided once for local paths
 * (dataset.c) and remote URLs (remote_open.c): a dataset directory, a pair
 * opened by its common prefix, or a single file whose bytes say its format.
 * What is format-specific comes from the format table's rows (formats.c):
 * the row whose shards a manifest lists, the pair row's data suffix, its
 * companion and the companion's magic. The caller answers questions about
 * names through a probe (source.h, tf__probe), so the rules and their
 * messages are the same whether the names are files or objects.
 *
 * The rules, in order:
 *   1. a directory (for object storage: a URL ending in '/', or a name that
 *      is no object but has a manifest under it) is a dataset directory when
 *      the open's format may be one; without a manifest it is refused;
 *   2. a pair: P.bin and P.idx both files, named by P, P.bin or P.idx, and
 *      the .idx starting with its magic. A name that is a file of its own and
 *      not one of the pair's two names is that file, not the pair (unless the
 *      open names the pair's format); a pair whose companion has another
 *      magic is the given name's file when it is one, else an error;
 *   3. a regular file is a file (its format from the open, or its bytes).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "source.h"

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

char *tf__cat2(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    char *s = malloc(la + lb + 1);
    if (!s) return NULL;
    memcpy(s, a, la);
    memcpy(s + la, b, lb + 1);
    return s;
}

/* path without its trailing slashes ("/" kept). */
static char *dir_of(const char *path) {
    char *d = strdup(path);
    if (!d) return NULL;
    size_t n = strlen(d);
    while (n > 1 && d[n - 1] == '/') d[--n] = '\0';
    return d;
}

char *tf__pair_name(const tf__format_row *row, const char *prefix, int which) {
    return tf__cat2(prefix, which ? row->companions[0].suffix : row->pair_data_suffix);
}

/* The prefix path names for the pair row r: path less its data suffix or its
 * companion's suffix ("x.bin" and "x.idx" -> "x"; "x" -> "x"). */
static char *pair_prefix(const tf__format_row *r, const char *path) {
    char *pre = strdup(path);
    if (!pre) return NULL;
    size_t n = strlen(pre);
    const char *sufs[2] = {r->pair_data_suffix, r->companions[0].suffix};
    for (int i = 0; i < 2; i++)
        if (ends_with(pre, sufs[i]) && n > strlen(sufs[i])) {
            pre[n - strlen(sufs[i])] = '\0';
            break;
        }
    return pre;
}

/* Whether the open's format (want; NULL: auto) allows row r. */
static int allows(const tf__format_row *want, const tf__format_row *r) {
    return r && (!want || want == r);
}

static int is_pair_row(const tf__format_row *r) {
    return r->pair_data_suffix && r->companions && r->companions[0].pair && r->pair_magic;
}

int tf__resolve_names(const char *path, tf_format fmt, int (*add)(void *ctx, const char *name, int manifest),
                      void *ctx) {
    const tf__format_row *want = fmt == TF_FORMAT_AUTO ? NULL : tf__format_row_of(fmt);
    TF_TRY(add(ctx, path, 0));
    const tf__format_row *man = tf__format_manifest_row();
    if (allows(want, man)) {
        char *d = dir_of(path), *mf = d ? tf__path_join(d, TF_MANIFEST_NAME) : NULL;
        int rc = mf ? add(ctx, mf, 1) : -ENOMEM;
        free(d);
        free(mf);
        TF_TRY(rc);
    }
    const tf__format_row *r;
    for (size_t i = 0; (r = tf__format_at(i)) != NULL; i++) {
        if (!is_pair_row(r) || !allows(want, r)) continue;
        char *pre = pair_prefix(r, path), *a = pre ? tf__pair_name(r, pre, 0) : NULL;
        char *b = pre ? tf__pair_name(r, pre, 1) : NULL;
        int rc = a && b ? add(ctx, a, 0) : -ENOMEM;
        if (!rc) rc = add(ctx, b, 0);
        free(pre);
        free(a);
        free(b);
        TF_TRY(rc);
    }
    return 0;
}

int tf__resolve_confirm(tf__target *t, const char *path, const uint8_t *head, size_t n) {
    if (t->kind != TF__TARGET_PAIR || t->row->pair_magic(head, n)) return 0;
    if (t->else_file) { /* not the pair after all: the name given is a file of its own */
        char *p = strdup(path);
        if (!p) return -ENOMEM;
        free(t->path);
        t->path = p;
        t->kind = TF__TARGET_FILE;
        t->row = NULL;
        t->else_file = 0;
        return 0;
    }
    const tf__companion *c = &t->row->companions[0];
    TF_FAIL(-TF_EFORMAT, "%s%s: magic: expected %s, found another value. This is not %s file.", t->path, c->suffix,
            t->row->pair_magic_what, c->what);
}

/* The pair of row r that path names, into t (1), or 0 for none. */
static int find_pair(const char *path, int kind, const tf__format_row *r, int named, const tf__probe *pr,
                     tf__target *t) {
    char *pre = pair_prefix(r, path), *a = pre ? tf__pair_name(r, pre, 0) : NULL;
    char *b = pre ? tf__pair_name(r, pre, 1) : NULL;
    int rc = a && b ? 0 : -ENOMEM;
    /* the given name, a file of its own that is neither half: that file */
    int own = kind == TF__NAME_FILE && strcmp(path, a ? a : "") != 0 && strcmp(path, b ? b : "") != 0;
    if (!rc && (named || !own) && pr->kind(pr->ctx, a) == TF__NAME_FILE && pr->kind(pr->ctx, b) == TF__NAME_FILE) {
        t->kind = TF__TARGET_PAIR;
        t->row = r;
        t->path = pre;
        pre = NULL;
        t->else_file = !named && kind == TF__NAME_FILE;
        uint8_t head[64];
        long got = pr->head ? pr->head(pr->ctx, b, head, sizeof head) : -1;
        rc = got >= 0 ? tf__resolve_confirm(t, path, head, (size_t)got) : 0;
        if (!rc) rc = 1;
    }
    free(pre);
    free(a);
    free(b);
    return rc;
}

int tf__resolve_target(const char *path, tf_format fmt, const tf__probe *pr, tf__target *t) {
    memset(t, 0, sizeof *t);
    const tf__format_row *want = fmt == TF_FORMAT_AUTO ? NULL : tf__format_row_of(fmt);
    if (fmt != TF_FORMAT_AUTO && !want) TF_FAIL(-EINVAL, "%s: unknown format code %d", path, (int)fmt);
    const tf__format_row *man = tf__format_manifest_row();
    int kind = pr->kind(pr->ctx, path), slash = ends_with(path, "/");
    char *d = dir_of(path), *mf = d ? tf__path_join(d, TF_MANIFEST_NAME) : NULL;
    int rc = mf ? 0 : -ENOMEM;

    /* 1. a dataset directory */
    if (!rc && allows(want, man) &&
        (kind == TF__NAME_DIR || (kind == TF__NAME_NONE && pr->kind(pr->ctx, mf) == TF__NAME_FILE))) {
        if (pr->kind(pr->ctx, mf) != TF__NAME_FILE) {
            rc = tf__seterr(-TF_EFORMAT, "%s: no manifest: expected %s. This is not a tokenfeed dataset, or its write did not finish: rerun the writer to completion, or pass the path of a single %s.",
                            path, mf, pr->noun);
        } else {
            t->kind = TF__TARGET_DATASET;
            t->row = man;
            t->path = d;
            d = NULL;
            rc = 1;
        }
    }
    /* 2. a pair by its prefix */
    const tf__format_row *r, *pair = NULL;
    for (size_t i = 0; !rc && !slash && (r = tf__format_at(i)) != NULL; i++) {
        if (!is_pair_row(r) || !allows(want, r)) continue;
        pair = r;
        rc = find_pair(path, kind, r, want == r, pr, t);
    }
    if (!rc && pair && want == pair) {
        char *pre = pair_prefix(pair, path), *a = pre ? tf__pair_name(pair, pre, 0) : NULL;
        char *b = pre ? tf__pair_name(pair, pre, 1) : NULL;
        free(pre);
        rc = a && b ? tf__seterr(-TF_EFORMAT, "%s: no %s dataset here: expected %s and %s, the second starting with %s. Pass the common prefix of the two %ss.",
                                 path, pair->companions[0].pair, a, b, pair->pair_magic_what, pr->noun)
                    : -ENOMEM;
        free(a);
        free(b);
    }
    /* 3. a file */
    if (!rc && (kind == TF__NAME_FILE || (kind == TF__NAME_DIR && !pr->slash_dirs))) {
        /* (a local directory the open's format cannot read as a dataset:
         * its parser says why) */
        t->kind = TF__TARGET_FILE;
        t->row = want;
        t->path = strdup(path);
        rc = t->path ? 1 : -ENOMEM;
    }
    if (!rc && kind == TF__NAME_OTHER) rc = tf__seterr(-EINVAL, "%s: not a regular file or directory", path);
    if (!rc) {
        /* nothing there: say what was looked for */
        const char *base = strrchr(d, '/');
        int dirlike = pr->slash_dirs && !strchr(base ? base + 1 : d, '.');
        char alt[1024] = "";
        size_t used = 0;
        if (allows(want, man))
            used += (size_t)snprintf(alt, sizeof alt, "a dataset directory with %s", mf);
        for (size_t i = 0; !slash && (r = tf__format_at(i)) != NULL && used < sizeof alt; i++) {
            if (!is_pair_row(r) || !allows(want, r)) continue;
            char *pre = pair_prefix(r, path), *a = pre ? tf__pair_name(r, pre, 0) : NULL;
            char *b = pre ? tf__pair_name(r, pre, 1) : NULL;
            if (a && b)
                used += (size_t)snprintf(alt + used, sizeof alt - used, "%sa %s pair %s and %s", used ? ", nor " : "",
                                         r->companions[0].pair, a, b);
            free(pre);
            free(a);
            free(b);
        }
        rc = tf__seterr(-ENOENT, "%s: no such %s%s%s%s%s%s%s", path, pr->noun, alt[0] ? " (nor " : "", alt,
                        alt[0] ? ")" : "", dirlike ? ". For a directory of shards, end the URL with / or give a glob: " : "",
                        dirlike ? d : "", dirlike ? "/*.bin" : "");
    }
    free(d);
    free(mf);
    if (rc < 0) {
        free(t->path);
        memset(t, 0, sizeof *t);
        return rc;
    }
    return 0;
}

int tf__resolve_sniffed(const char *path, tf_format fmt, tf_dtype dtype, const char *why) {
    const tf__format_row *r = tf__format_row_of(fmt);
    if (!r || !r->headerless || dtype != TF_DTYPE_INVALID) return 0;
    if (why && why[0])
        TF_FAIL(-TF_EFORMAT, "%s: the file is %s. tokenfeed reads tokenfeed datasets, llm.c shards, .npy files, "
                "Megatron .bin/.idx and headerless token files (pass dtype=).", path, why);
    TF_FAIL(-TF_EFORMAT, "%s: header: expected a tokenfeed, llm.c or .npy magic number, found none. For a headerless token file (nanoGPT train.bin, OLMo, datatrove .ds) pass dtype= (e.g. dtype=\"uint16\").", path);
}
