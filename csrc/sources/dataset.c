/*
 * dataset.c — a dataset is an ordered list of files of any supported format,
 * concatenated: documents and tokens in order. This file owns format detection,
 * the concatenation (prefix sums, O(log files) lookups), token reads with dtype
 * conversion, the fingerprint, views that concatenate datasets (mixtures read
 * through one), and the multi-threaded verify. Formats live in their own files
 * and only fill a tf_file; a file's bytes are obtained and read in file.c (see
 * source.h).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "source.h"

/* ------------------------------------------------------------------------ */
/* detection and open                                                        */
/* ------------------------------------------------------------------------ */

/* The probe of the resolution (resolve.c) for local paths: a shard set's
 * listing answers for the names in its directories (no call per name), the
 * file system (stat, following links as open does) for the others. */
static int local_kind(void *ctx, const char *name) {
    int k = ctx ? tf__listed_kind(ctx, name) : -1;
    if (k >= 0) return k;
    struct stat st;
    if (stat(name, &st) != 0) return TF__NAME_NONE;
    return S_ISDIR(st.st_mode) ? TF__NAME_DIR : S_ISREG(st.st_mode) ? TF__NAME_FILE : TF__NAME_OTHER;
}

static long local_head(void *ctx, const char *name, uint8_t *buf, size_t cap) {
    (void)ctx;
    int fd = open(name, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return 0; /* (gone since: no magic) */
    ssize_t got = pread(fd, buf, cap, 0);
    close(fd);
    return got > 0 ? (long)got : 0;
}

/* What a file without a token header is, when its first bytes say so: "" when
 * they do not (it may be a headerless token file). Names the common mistakes
 * (an empty file, text not yet tokenized, an image or archive) in the error. */
static const char *not_tokens(const uint8_t *head, ssize_t got) {
    static const struct { const char *magic; size_t n; const char *what; } known[] = {
        {"\xff\xd8\xff", 3, "a JPEG image"}, {"\x89PNG", 4, "a PNG image"}, {"GIF8", 4, "a GIF image"},
        {"%PDF", 4, "a PDF document"}, {"PK\x03\x04", 4, "a zip archive"}, {"\x1f\x8b", 2, "a gzip file"},
        {"\x28\xb5\x2f\xfd", 4, "a zstd-compressed file"}, {"PAR1", 4, "a Parquet file"},
    };
    if (got == 0) return "empty (0 bytes): there are no tokens in it";
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if ((size_t)got >= known[i].n && memcmp(head, known[i].magic, known[i].n) == 0) return known[i].what;
    for (ssize_t i = 0; i < got; i++) /* text: printable ASCII, whitespace or UTF-8 bytes, and no NUL */
        if (head[i] < 0x20 && head[i] != '\n' && head[i] != '\r' && head[i] != '\t') return "";
    return "text, not tokens: tokenize it with tokenfeed convert FILE OUT --tokenizer tokenizer.json "
           "(--input-format text for plain text)";
}

static int detect_file(const char *path, tf_format *fmt, char *why, size_t why_cap) {
    uint8_t head[512] = {0};
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        TF_FAIL(-e, "%s: cannot open: %s", path, strerror(e));
    }
    ssize_t got = pread(fd, head, sizeof head, 0);
    close(fd);
    *fmt = tf__format_sniff(head, got > 0 ? (size_t)got : 0);
    const tf__format_row *r = tf__format_row_of(*fmt);
    if (r && r->headerless) snprintf(why, why_cap, "%s", got < 0 ? "" : not_tokens(head, got));
    return 0;
}

/* Open path; listed: the listing that found it (NULL: none), which says
 * whether it is a directory and which companion files lie beside it. */
static int open_one(const char *path, const tf_open_options *opt, const tf__listing *listed, tf_file **files,
                    uint64_t *nfiles, uint64_t *cap) {
    tf__probe pr = {(void *)listed, local_kind, local_head, "file", 0};
    tf__target t;
    TF_TRY(tf__resolve_target(path, opt->format, &pr, &t));
    if (t.kind == TF__TARGET_DATASET) {
        int rc = tf__open_native_dir(t.path, opt, files, nfiles, cap);
        free(t.path);
        return rc;
    }
    tf_format fmt = t.row ? t.row->format : TF_FORMAT_AUTO;
    char *prefix = t.kind == TF__TARGET_PAIR ? t.path : NULL;
    if (!prefix) free(t.path);
    if (fmt == TF_FORMAT_AUTO) {
        char why[160] = "";
        int rc = detect_file(path, &fmt, why, sizeof why);
        if (!rc) rc = tf__resolve_sniffed(path, fmt, opt->raw_dtype, why);
        if (rc) {
            free(prefix);
            return rc;
        }
    }
    tf_file *f = tf__files_push(files, nfiles, cap);
    if (!f) {
        free(prefix);
        return -ENOMEM;
    }
    const tf__format_row *row = tf__format_row_of(fmt);
    int rc = row ? row->parse(prefix ? prefix : path, opt, f)
                 : tf__seterr(-EINVAL, "%s: unknown format code %d", path, (int)fmt);
    free(prefix);
    if (rc < 0) {
        tf__file_close(f);
        (*nfiles)--;
    }
    return rc;
}

/* What the open of path would read (tokenfeed.h): the same resolution with
 * the same probe, so that callers (the Python package) never re-derive it. */
int tf_path_resolve(const char *path, tf_format format, tf_path_kind *kind, char *out, size_t out_cap) {
    TF_NEED_ARG(path);
    TF_NEED_ARG(kind);
    TF_NEED_ARG(out);
    tf__clearerr();
    if (tf__is_url(path))
        TF_FAIL(-EINVAL, "%s: a URL: tf_path_resolve answers for local paths only; open the URL with tf_dataset_open_remote, which resolves it against the store", path);
    tf__probe pr = {NULL, local_kind, local_head, "file", 0};
    tf__target t;
    TF_TRY(tf__resolve_target(path, format, &pr, &t));
    size_t n = strlen(t.path);
    int rc = 0;
    if (n >= out_cap)
        rc = tf__seterr(-ENAMETOOLONG, "%s: out: the resolved path needs %zu bytes, %zu given: pass a larger buffer (PATH_MAX)",
                        path, n + 1, out_cap);
    else {
        memcpy(out, t.path, n + 1);
        *kind = t.kind == TF__TARGET_DATASET ? TF_PATH_DATASET : t.kind == TF__TARGET_PAIR ? TF_PATH_PAIR : TF_PATH_FILE;
    }
    free(t.path);
    return rc;
}

static tf_dtype wider(tf_dtype a, tf_dtype b) {
    if (a == TF_DTYPE_INVALID) return b;
    if (a == b) return a;
    /* Mixed dtypes: the widest integer type that holds both. */
    int fa = a == TF_FLOAT32 || a == TF_FLOAT64, fb = b == TF_FLOAT32 || b == TF_FLOAT64;
    if (fa || fb) return TF_FLOAT64;
    int sa = a >= TF_INT8, sb = b >= TF_INT8;
    size_t za = tf_dtype_size(a), zb = tf_dtype_size(b), z = za > zb ? za : zb;
    if (sa || sb) return z >= 8 || (!sa && za == z) || (!sb && zb == z) ? TF_INT64 : (z == 4 ? TF_INT32 : z == 2 ? TF_INT16 : TF_INT8);
    return z == 8 ? TF_UINT64 : z == 4 ? TF_UINT32 : z == 2 ? TF_UINT16 : TF_UINT8;
}

/* Prefix sums (overflow-checked), dtype and vocab_size of ds->files. A
 * dataset's vocab_size is known only when every file records one. */
static int index_files(tf_dataset *ds) {
    ds->tok_prefix = malloc((ds->nfiles + 1) * sizeof(uint64_t));
    ds->doc_prefix = malloc((ds->nfiles + 1) * sizeof(uint64_t));
    if (!ds->tok_prefix || !ds->doc_prefix) return -ENOMEM;
    ds->tok_prefix[0] = ds->doc_prefix[0] = 0;
    uint64_t vocab = 0;
    int vocab_known = 1;
    for (uint64_t i = 0; i < ds->nfiles; i++) {
        const tf_file *f = &ds->files[i];
        if (tf__add_overflow(ds->tok_prefix[i], f->num_tokens, &ds->tok_prefix[i + 1]) ||
            tf__add_overflow(ds->doc_prefix[i], f->num_docs, &ds->doc_prefix[i + 1]))
            TF_FAIL(-TF_EFORMAT, "%s: num_tokens: the dataset's total overflows 64 bits", f->path);
        ds->dtype = wider(ds->dtype, f->dtype);
        if (f->vocab_size == 0) vocab_known = 0;
        else if (f->vocab_size > vocab) vocab = f->vocab_size;
    }
    ds->num_tokens = ds->tok_prefix[ds->nfiles];
    ds->num_docs = ds->doc_prefix[ds->nfiles];
    ds->vocab_size = vocab_known ? vocab : 0;
    return 0;
}

/* Build the dataset from files (takes ownership of the array). */
static int finish_dataset(tf_file *files, uint64_t nfiles, tf_dataset **out) {
    tf_dataset *ds = calloc(1, sizeof *ds);
    if (!ds) {
        for (uint64_t i = 0; i < nfiles; i++) tf__file_close(&files[i]);
        free(files);
        return -ENOMEM;
    }
    ds->files = files;
    ds->nfiles = nfiles;
    int rc = index_files(ds); /* on failure the message is set before paths die with ds */
    if (rc) {
        tf_dataset_free(ds);
        return rc;
    }
    tf__xxh64_state h;
    tf__xxh64_reset(&h, 0x746f6b656e666565ULL);
    for (uint64_t i = 0; i < nfiles; i++) {
        const tf_file *f = &files[i];
        uint8_t rec[32];
        tf__put_le64(rec, f->fingerprint);
        tf__put_le64(rec + 8, f->num_tokens);
        /* an eos-split file's documents follow from its tokens and eos id */
        tf__put_le64(rec + 16, f->eos.split ? UINT64_MAX : f->num_docs);
        tf__put_le64(rec + 24, (uint64_t)f->dtype);
        tf__xxh64_update(&h, rec, sizeof rec);
        if (f->eos.rows_only) {
            ds->docs_from_rows = 1;
            ds->eos_id = f->eos.id;
        }
    }
    ds->fingerprint = tf__xxh64_digest(&h);
    if (ds->num_tokens == 0) {
        const char *p = nfiles ? files[0].path : "(no files)";
        rc = tf__seterr(-TF_EFORMAT, "%s: num_tokens: expected at least one token, found an empty dataset. Check that the path points at the data you meant.", p);
        tf_dataset_free(ds);
        return rc;
    }
    *out = ds;
    return 0;
}

int tf__dataset_concat_view(const tf_dataset *const *dss, size_t n, tf_dataset **out) {
    *out = NULL;
    tf_dataset *v = calloc(1, sizeof *v);
    if (!v) return -ENOMEM;
    v->borrowed = 1;
    for (size_t s = 0; s < n; s++) v->nfiles += dss[s]->nfiles;
    v->files = calloc(v->nfiles ? v->nfiles : 1, sizeof *v->files);
    if (!v->files) {
        tf_dataset_free(v);
        return -ENOMEM;
    }
    tf__xxh64_state h;
    tf__xxh64_reset(&h, 0x4D49585455524531ULL); /* "MIXTURE1" */
    uint8_t rec[8];
    tf__put_le64(rec, n);
    tf__xxh64_update(&h, rec, 8);
    uint64_t f = 0;
    for (size_t s = 0; s < n; s++) {
        for (uint64_t i = 0; i < dss[s]->nfiles; i++) v->files[f++] = dss[s]->files[i];
        tf__put_le64(rec, dss[s]->fingerprint);
        tf__xxh64_update(&h, rec, 8);
    }
    int rc = index_files(v);
    if (rc) {
        tf_dataset_free(v);
        return rc;
    }
    v->fingerprint = tf__xxh64_digest(&h);
    *out = v;
    return 0;
}

int tf_dataset_open_many(const char *const *paths, size_t n, const tf_open_options *opt, tf_dataset **out) {
    return tf__dataset_open_paths(paths, n, opt, NULL, NULL, out);
}

/* ---- the path-spec open ---------------------------------------------------------
 * A local path may name a shard set: a directory without a manifest, or a
 * glob (pathspec.c). A set the node's catalog holds under the spec, with its
 * directories unchanged, opens from it without a listing; otherwise each
 * directory is listed once, its files are opened with what the listing showed
 * (no probe per file for a directory, a companion file or a Megatron pair),
 * and the catalog records the set under the spec and the directories'
 * identities for the next open. */

/* What path names, when that can be told without a look at the file system
 * that an open of a plain file would not make anyway: a glob or a directory
 * (TF__SPEC_*), or -1 when unknown until the path is opened. */
static int spec_kind(const char *path, size_t n) {
    if (!path || tf__is_url(path)) return TF__SPEC_PATH;
    size_t len = strlen(path);
    int magic = strpbrk(path, "*?[") != NULL;
    if (n == 1 || magic || (len && path[len - 1] == '/')) return tf__pathspec_kind(path);
    return -1;
}

/* The paths to open, each set entry replaced by the files its listing found. */
typedef struct item {
    const char *path; /* borrowed from the caller or from names */
    int listed;       /* found in the listing: it says what is beside it */
} item;

/* Room for need elements in *v (of *cap): 0, or -ENOMEM with *v unchanged. */
static int reserve(void **v, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t nc = *cap ? *cap : 64;
    while (nc < need) nc *= 2;
    void *g = realloc(*v, nc * elem);
    if (!g) return -ENOMEM;
    *v = g;
    *cap = nc;
    return 0;
}

static void drop_files(tf_file *files, uint64_t n) {
    for (uint64_t k = 0; k < n; k++) tf__file_close(&files[k]);
    free(files);
}

static int open_paths(const char *const *paths, size_t n, const tf_open_options *opt, unsigned flags,
                      tf__url_open_fn open_urls, void *ctx, tf_dataset **out) {
    TF_NEED_ARG_OF("tf_dataset_open", out);
    *out = NULL;
    tf__clearerr();
    if (!paths || n == 0) TF_FAIL(-EINVAL, "no paths given");
    tf_open_options dflt = {.format = TF_FORMAT_AUTO, .raw_dtype = TF_DTYPE_INVALID};
    if (!opt) opt = &dflt;
    if (opt->raw_dtype != TF_DTYPE_INVALID && opt->raw_dtype != TF_UINT8 && opt->raw_dtype != TF_UINT16 &&
        opt->raw_dtype != TF_UINT32 && opt->raw_dtype != TF_INT32 && opt->raw_dtype != TF_INT64 &&
        opt->raw_dtype != TF_UINT64 && opt->raw_dtype != TF_INT16)
        TF_FAIL(-EINVAL, "dtype %s is not a token dtype", tf_dtype_name(opt->raw_dtype));
    for (size_t i = 0; i < n; i++)
        if (!paths[i]) TF_FAIL(-EINVAL, "path %zu is NULL", i);
    tf_file *files = NULL;
    uint64_t nfiles = 0, cap = 0, lazy_done = 0;
    if (flags & TF_OPEN_CATALOG_ONLY) {
        /* the set from the node's catalog, or -ENOENT: nothing is looked at but the catalog (and, unless
         * immutable, the identity of each directory it records) */
        TF_TRY(tf__catalog_check_settings());
        if (tf__catalog_load_set(paths, n, opt, (flags & TF_OPEN_IMMUTABLE) != 0, &files, &nfiles) != 0)
            TF_FAIL(-ENOENT, "%s: the node's catalog has no entry for this shard set, or a directory holding its "
                    "files changed since it was listed", paths[0]);
        return finish_dataset(files, nfiles, out);
    }
    /* Several local files, or a directory, or a glob: the node's catalog,
     * if it has one for these paths, places every position without reading
     * them. */
    int *kinds = malloc(n * sizeof *kinds);
    if (!kinds) return -ENOMEM;
    int local = 1, sets = 0, globs = 0;
    for (size_t i = 0; i < n; i++) {
        kinds[i] = spec_kind(paths[i], n);
        if (tf__is_url(paths[i])) local = 0;
        sets += kinds[i] == TF__SPEC_GLOB || kinds[i] == TF__SPEC_DIR;
        globs += kinds[i] == TF__SPEC_GLOB;
    }
    int many = n > 1 || sets, rc = 0;
    if (local && many) rc = tf__catalog_check_settings();
    if (rc == 0 && local && sets &&
        tf__catalog_load_set(paths, n, opt, (flags & TF_OPEN_IMMUTABLE) != 0, &files, &nfiles) == 0) {
        free(kinds);
        return finish_dataset(files, nfiles, out);
    }
    /* (a directory may be a tokenfeed dataset, catalogued under its path with its manifest) */
    if (rc == 0 && local && many && !globs && tf__catalog_load(paths, n, opt, &files, &nfiles) == 0) {
        free(kinds);
        return finish_dataset(files, nfiles, out);
    }
    /* each set entry listed: the files it names */
    tf__listing *L = NULL;
    item *items = NULL;
    size_t nitems = 0, icap = 0, nsets = 0;
    char **names = NULL; /* owned by this open: the listed files' paths */
    size_t nnames = 0, ncap = 0;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        int kind = kinds[i];
        if (kind < 0) kind = local_kind(NULL, paths[i]) == TF__NAME_DIR ? TF__SPEC_DIR : TF__SPEC_PATH;
        char **got = NULL;
        size_t k = 0;
        if (kind != TF__SPEC_PATH) {
            if (!L && !(L = tf__listing_new())) rc = -ENOMEM;
            if (rc == 0) rc = tf__pathspec_expand(L, paths[i], kind, &got, &k);
            if (rc == 1) { /* a dataset directory, or one whose open explains what it holds */
                rc = 0;
                kind = TF__SPEC_PATH;
            } else if (rc == 0) {
                nsets++;
            }
        }
        size_t add = kind == TF__SPEC_PATH ? 1 : k;
        if (rc == 0 && (reserve((void **)&items, &icap, nitems + add, sizeof *items) ||
                        reserve((void **)&names, &ncap, nnames + k, sizeof *names)))
            rc = -ENOMEM;
        for (size_t j = 0; j < k; j++) {
            if (rc == 0) {
                names[nnames++] = got[j];
                items[nitems++] = (item){got[j], 1};
            } else {
                free(got[j]);
            }
        }
        free(got);
        if (rc == 0 && kind == TF__SPEC_PATH) items[nitems++] = (item){paths[i], 0};
    }
    free(kinds);
    /* a listed set whose files this node has catalogued: placed without reading them (each
     * file's identity checked) */
    const char **ipaths = NULL;
    if (rc == 0 && local && nsets && nitems > 1 && (ipaths = malloc(nitems * sizeof *ipaths))) {
        for (size_t i = 0; i < nitems; i++) ipaths[i] = items[i].path;
        if (tf__catalog_load(ipaths, nitems, opt, &files, &nfiles) == 0) lazy_done = nfiles;
    }
    int from_catalog = nfiles > 0;
    for (size_t i = 0; rc == 0 && !from_catalog && i < nitems; i++) {
        if (tf__is_url(items[i].path)) {
            /* a run of remote URLs is opened together: their metadata is
             * fetched with concurrent requests */
            size_t j = i + 1;
            while (j < nitems && tf__is_url(items[j].path)) j++;
            const char **run = malloc((j - i) * sizeof *run);
            if (!run) {
                rc = -ENOMEM;
                break;
            }
            for (size_t k = i; k < j; k++) run[k - i] = items[k].path;
            rc = open_urls ? open_urls(ctx, run, j - i, opt, &files, &nfiles, &cap)
                           : tf__seterr(-EINVAL, "%s: a remote URL needs a remote store: open it with tf_dataset_open_remote and a tf_remote (tf_remote_create), or with tokenfeed.open() from Python",
                                        items[i].path);
            free(run);
            i = j - 1;
            continue;
        }
        /* companion files of a listed file: answered from the listing */
        tf__listing_activate(items[i].listed ? L : NULL);
        rc = open_one(items[i].path, opt, items[i].listed ? L : NULL, &files, &nfiles, &cap);
        tf__listing_activate(NULL);
        /* several files: each is mapped on demand from now on */
        if (rc == 0 && (nitems > 1 || nfiles > 1))
            for (; rc == 0 && lazy_done < nfiles; lazy_done++)
                rc = tf__file_make_lazy(&files[lazy_done], opt, tf__parser_of(files[lazy_done].format));
    }
    if (rc == 0 && nfiles == 0) { /* e.g. a dataset written with no documents: name what was opened */
        rc = tf__seterr(-TF_EFORMAT, "%s: num_tokens: expected at least one token, found an empty dataset (no token files; a "
                        "DatasetWriter that received no documents writes one). Check that the path points at the data you "
                        "meant.", paths[0]);
    }
    if (rc == 0 && local && nsets) {
        /* the files as listed, then the set under the spec and the directories listed */
        if (!from_catalog && ipaths && nnames == nitems)
            tf__catalog_save_files(ipaths, nitems, opt, files, nfiles);
        else if (!from_catalog && ipaths)
            tf__catalog_save(ipaths, nitems, opt, files, nfiles);
        const char **dirs;
        tf__file_id *ids;
        size_t nd = tf__listing_dirs(L, &dirs, &ids);
        if (nd && ipaths) (void)tf__catalog_save_set(paths, n, opt, files, nfiles, dirs, ids, nd);
        free(dirs);
        free(ids);
    } else if (rc == 0 && local && many) {
        tf__catalog_save(paths, n, opt, files, nfiles);
    }
    free(ipaths);
    tf__listing_free(L);
    free(items);
    for (size_t k = 0; k < nnames; k++) free(names[k]);
    free(names);
    if (rc < 0) {
        drop_files(files, nfiles);
        return rc;
    }
    return finish_dataset(files, nfiles, out);
}

int tf__dataset_open_paths(const char *const *paths, size_t n, const tf_open_options *opt, tf__url_open_fn open_urls,
                           void *ctx, tf_dataset **out) {
    return open_paths(paths, n, opt, 0, open_urls, ctx, out);
}

static const tf_open_options open_defaults = {.format = TF_FORMAT_AUTO, .raw_dtype = TF_DTYPE_INVALID};

int tf_dataset_open_spec(const char *const *spec, size_t nspec, const tf_open_options *opt, unsigned flags,
                         tf_dataset **out) {
    TF_NEED_ARG(out);
    *out = NULL;
    if (flags & ~(unsigned)(TF_OPEN_IMMUTABLE | TF_OPEN_CATALOG_ONLY))
        TF_FAIL(-EINVAL, "tf_dataset_open_spec: flags: unknown bits 0x%x", flags);
    return open_paths(spec, nspec, opt, flags, NULL, NULL, out);
}

int tf_dataset_open_set(const char *const *spec, size_t nspec, const tf_open_options *opt, tf_dataset **out) {
    TF_NEED_ARG(out);
    *out = NULL;
    tf__clearerr();
    if (!spec || nspec == 0) TF_FAIL(-EINVAL, "no shard set given");
    for (size_t i = 0; i < nspec; i++)
        if (!spec[i]) TF_FAIL(-EINVAL, "shard set entry %zu is NULL", i);
    return open_paths(spec, nspec, opt, TF_OPEN_CATALOG_ONLY, NULL, NULL, out);
}

int tf_dataset_catalog_set(const tf_dataset *ds, const char *const *spec, size_t nspec, const tf_open_options *opt,
                           const char *const *dirs, const uint64_t *dir_ids, size_t ndirs) {
    tf__clearerr();
    if (!ds || !spec || nspec == 0 || (ndirs && (!dirs || !dir_ids)))
        TF_FAIL(-EINVAL, "tf_dataset_catalog_set: a dataset, a shard set and its directories are required");
    tf__file_id *ids = calloc(ndirs ? ndirs : 1, sizeof *ids);
    if (!ids) return -ENOMEM;
    int rc = 0;
    for (size_t k = 0; k < ndirs && rc == 0; k++) {
        if (!dirs[k]) rc = tf__seterr(-EINVAL, "directory %zu is NULL", k);
        ids[k] = (tf__file_id){.dev = dir_ids[4 * k], .ino = dir_ids[4 * k + 1], .size = dir_ids[4 * k + 2],
                               .mtime_ns = dir_ids[4 * k + 3], .known = 1};
    }
    for (size_t i = 0; i < nspec && rc == 0; i++)
        if (!spec[i]) rc = tf__seterr(-EINVAL, "shard set entry %zu is NULL", i);
    if (rc == 0 && ds->borrowed) rc = 1;
    if (rc == 0)
        rc = tf__catalog_save_set(spec, nspec, opt ? opt : &open_defaults, ds->files, ds->nfiles, dirs, ids, ndirs);
    free(ids);
    return rc;
}

int tf_dataset_write_data_catalog(const tf_dataset *ds, const char *prefix, const char *pattern,
                                  const tf_open_options *opt, char *path, size_t cap) {
    tf__clearerr();
    if (!ds || !prefix || !pattern) TF_FAIL(-EINVAL, "tf_dataset_write_data_catalog: a dataset, a prefix and a pattern are required");
    if (path && cap) path[0] = '\0';
    if (ds->borrowed) TF_FAIL(-EINVAL, "a view of datasets has no catalog of its own");
    return tf__catalog_write_beside(prefix, pattern, opt ? opt : &open_defaults, ds->files, ds->nfiles, path, cap);
}

int tf_dataset_write_dataset_catalog(const tf_dataset *ds, const char *dataset_dir, char *path, size_t cap) {
    tf__clearerr();
    if (!ds || !dataset_dir)
        TF_FAIL(-EINVAL, "tf_dataset_write_dataset_catalog: a dataset and its directory are required");
    if (path && cap) path[0] = '\0';
    if (ds->borrowed) TF_FAIL(-EINVAL, "a view of datasets has no catalog of its own");
    char *dir = tf__prefix_dir(dataset_dir);
    if (!dir) return -ENOMEM;
    /* the shards as ds opened them: none is read again */
    int rc = tf__catalog_write_dataset(dir, ds->files, ds->nfiles, path, cap);
    free(dir);
    return rc;
}

int tf_dataset_open_data_catalog(const char *prefix, const char *pattern, const tf_open_options *opt,
                                 tf_dataset **out) {
    TF_NEED_ARG(out);
    *out = NULL;
    tf__clearerr();
    if (!prefix || !pattern) TF_FAIL(-EINVAL, "tf_dataset_open_data_catalog: a prefix and a pattern are required");
    tf_file *files = NULL;
    uint64_t nfiles = 0;
    int rc = tf__catalog_load_beside(prefix, pattern, opt ? opt : &open_defaults, &files, &nfiles);
    if (rc == 1) TF_FAIL(-ENOENT, "%s: no catalog of this shard set beside the data", *prefix ? prefix : ".");
    if (rc == 3) return -EPERM; /* a file not to be read under its name: the message says what and why */
    if (rc == 2)
        TF_FAIL(-ESTALE, "%s: the shard set's catalog beside the data (%s*) is older than its directory (a file was added, removed or renamed since): the set is listed and its files read instead; rebuild the catalog with `tokenfeed index` once the set is complete",
                *prefix ? prefix : ".", TF_DATA_CATALOG_STEM);
    return finish_dataset(files, nfiles, out);
}

int tf_dataset_open(const char *path, const tf_open_options *opt, tf_dataset **out) {
    return tf_dataset_open_many(&path, 1, opt, out);
}

int tf_dataset_from_memory(const void *tokens, uint64_t n, tf_dtype dt, const uint64_t *doc_ends,
                           uint64_t ndocs, uint64_t vocab_size, tf_dataset **out) {
    TF_NEED_ARG(out);
    *out = NULL;
    tf__clearerr();
    size_t isz = tf_dtype_size(dt);
    if (!isz) TF_FAIL(-EINVAL, "invalid dtype %d", (int)dt);
    if (n && !tokens) TF_FAIL(-EINVAL, "tokens is NULL");
    if (doc_ends) {
        if (ndocs == 0 || doc_ends[ndocs - 1] != n)
            TF_FAIL(-EINVAL, "doc_ends: the last entry must equal the token count %llu", (unsigned long long)n);
        for (uint64_t j = 1; j < ndocs; j++)
            if (doc_ends[j] < doc_ends[j - 1]) TF_FAIL(-EINVAL, "doc_ends: not monotonic at entry %llu", (unsigned long long)j);
    }
    uint64_t tbytes, dbytes = 0;
    if (tf__mul_overflow(n, isz, &tbytes) || (doc_ends && tf__mul_overflow(ndocs, 8, &dbytes)))
        return -ENOMEM;
    uint64_t tpad = (tbytes + 7) & ~7ull;
    tf_file *files = calloc(1, sizeof *files);
    if (!files) return -ENOMEM;
    tf_file *f = &files[0];
    f->owned = malloc(tpad + dbytes + 1);
    f->path = strdup("<memory>");
    if (!f->owned || !f->path) {
        tf__file_close(f);
        free(files);
        return -ENOMEM;
    }
    if (tbytes) memcpy(f->owned, tokens, tbytes);
    f->format = TF_FORMAT_RAW;
    f->dtype = dt;
    f->num_tokens = n;
    f->vocab_size = vocab_size;
    f->tokens = f->owned;
    if (doc_ends) {
        memcpy((uint8_t *)f->owned + tpad, doc_ends, dbytes);
        f->doc_ends = (const uint64_t *)((uint8_t *)f->owned + tpad);
        f->doc_kind = TF_DOCS_ENDS;
        f->num_docs = ndocs;
    } else {
        f->doc_kind = TF_DOCS_SINGLE;
        f->num_docs = n ? 1 : 0;
    }
    f->fingerprint = tf_hash64(f->owned, tbytes, ndocs) ^ (doc_ends ? tf_hash64(doc_ends, dbytes, 1) : 0);
    return finish_dataset(files, 1, out);
}

void tf_dataset_free(tf_dataset *ds) {
    if (!ds) return;
    for (uint64_t i = 0; !ds->borrowed && i < ds->nfiles; i++) tf__file_close(&ds->files[i]);
    free(ds->files);
    free(ds->tok_prefix);
    free(ds->doc_prefix);
    tf__sel_free(ds->sel);
    free(ds);
}

/* ------------------------------------------------------------------------ */
/* queries                                                                   */
/* ------------------------------------------------------------------------ */

int tf_dataset_get_info(const tf_dataset *ds, tf_dataset_info *info) {
    TF_NEED_ARG(ds);
    TF_NEED_ARG(info);
    info->num_tokens = ds->num_tokens;
    info->num_documents = ds->sel ? ds->sel->n : ds->num_docs;
    info->vocab_size = ds->vocab_size;
    info->dtype = ds->dtype;
    info->format = ds->nfiles ? ds->files[0].format : TF_FORMAT_AUTO;
    info->num_files = ds->nfiles;
    info->fingerprint = ds->fingerprint;
    return 0;
}

int tf_dataset_get_file(const tf_dataset *ds, uint64_t i, tf_file_info *info) {
    TF_NEED_ARG(ds);
    TF_NEED_ARG(info);
    if (i >= ds->nfiles) TF_FAIL(-ERANGE, "file %llu out of range (%llu files)", (unsigned long long)i, (unsigned long long)ds->nfiles);
    const tf_file *f = &ds->files[i];
    info->path = f->path;
    info->format = f->format;
    info->dtype = f->dtype;
    info->first_token = ds->tok_prefix[i];
    info->num_tokens = f->num_tokens;
    info->first_document = ds->doc_prefix[i];
    info->num_documents = f->num_docs;
    info->compressed = f->blocks.ops != NULL;
    return 0;
}

void tf__dataset_advise_random(const tf_dataset *ds) {
    if (!ds) return;
    for (uint64_t i = 0; i < ds->nfiles; i++) {
        const tf_file *f = &ds->files[i];
        if (f->map && f->map_len && f->tokens) madvise(f->map, f->map_len, MADV_RANDOM);
    }
}

uint64_t tf__dataset_file_of(const tf_dataset *ds, uint64_t pos) {
    /* last i with tok_prefix[i] <= pos and a non-empty file */
    uint64_t lo = 0, hi = ds->nfiles;
    while (hi - lo > 1) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (ds->tok_prefix[mid] <= pos) lo = mid; else hi = mid;
    }
    while (lo + 1 < ds->nfiles && ds->tok_prefix[lo + 1] <= pos) lo++;
    return lo;
}

/* Public reads and lookups touch mapped bytes: they run under the SIGBUS
 * guard (common/sigbus.c), so a file truncated while mapped gives -EIO. */
typedef struct guarded_call {
    const tf_dataset *ds;
    uint64_t a, b;
    void *out;
    tf_dtype dt;
    uint64_t *r1, *r2;
} guarded_call;

static int dataset_read(const tf_dataset *ds, uint64_t start, uint64_t count, void *out, tf_dtype out_dtype);
static int dataset_document(const tf_dataset *ds, uint64_t i, uint64_t *start, uint64_t *len);
static int dataset_find_document(const tf_dataset *ds, uint64_t pos, uint64_t *doc);
static int call_read(void *p) {
    guarded_call *c = p;
    return dataset_read(c->ds, c->a, c->b, c->out, c->dt);
}
static int call_document(void *p) {
    guarded_call *c = p;
    return dataset_document(c->ds, c->a, c->r1, c->r2);
}
static int call_find_document(void *p) {
    guarded_call *c = p;
    return dataset_find_document(c->ds, c->a, c->r1);
}

int tf_dataset_read(const tf_dataset *ds, uint64_t start, uint64_t count, void *out, tf_dtype out_dtype) {
    TF_NEED_ARG(ds);
    guarded_call c = {ds, start, count, out, out_dtype, NULL, NULL};
    return tf__files_guard(ds->files, ds->nfiles, call_read, &c);
}

int tf_dataset_check_documents(const tf_dataset *ds) {
    if (!ds) return -EINVAL;
    for (uint64_t i = 0; i < ds->nfiles; i++) {
        const tf_file *f = &ds->files[i];
        if (!f->eos.rows_only) continue;
        if (tf__is_url(f->path))
            TF_FAIL(-EINVAL, "%s: the documents of this file, split at eos id %llu, are known only inside the rows a concat loader reads: a file read from object storage has no document index, so num_documents, document() and find_document() cannot be answered. Copy it to a local disk and build its index with `tokenfeed index PATH --dtype %s --eos-id %llu`.",
                    f->path, (unsigned long long)f->eos.id, tf_dtype_name(f->dtype), (unsigned long long)f->eos.id);
        TF_FAIL(-EINVAL, "%s: the documents of this file, split at eos id %llu, are known only inside the rows a concat loader reads until its document index is built: num_documents, document() and find_document() need it. Build it once with `tokenfeed index %s --dtype %s --eos-id %llu` (kept beside the data, or in the node cache when that directory is read-only).",
                f->path, (unsigned long long)f->eos.id, f->path, tf_dtype_name(f->dtype), (unsigned long long)f->eos.id);
    }
    return 0;
}

int tf_dataset_document(const tf_dataset *ds, uint64_t i, uint64_t *start, uint64_t *len) {
    TF_NEED_ARG(ds);
    guarded_call c = {ds, i, 0, NULL, TF_DTYPE_INVALID, start, len};
    return tf__files_guard(ds->files, ds->nfiles, call_document, &c);
}

int tf_dataset_find_document(const tf_dataset *ds, uint64_t pos, uint64_t *doc) {
    TF_NEED_ARG(ds);
    guarded_call c = {ds, pos, 0, NULL, TF_DTYPE_INVALID, doc, NULL};
    return tf__files_guard(ds->files, ds->nfiles, call_find_document, &c);
}

static int dataset_read(const tf_dataset *ds, uint64_t start, uint64_t count, void *out, tf_dtype out_dtype) {
    TF_NEED_ARG_OF("tf_dataset_read", ds);
    TF_NEED_BUF_OF("tf_dataset_read", out, count);
    size_t osz = tf_dtype_size(out_dtype);
    if (!osz) TF_FAIL(-EINVAL, "invalid output dtype %d", (int)out_dtype);
    if (start > ds->num_tokens || count > ds->num_tokens - start)
        TF_FAIL(-ERANGE, "tokens [%llu, %llu) out of range: the dataset has %llu tokens",
                (unsigned long long)start, (unsigned long long)start + count, (unsigned long long)ds->num_tokens);
    if (!count) return 0;
    uint64_t i = tf__dataset_file_of(ds, start);
    uint8_t *o = out;
    while (count) {
        const tf_file *f = &ds->files[i];
        uint64_t local = start - ds->tok_prefix[i];
        uint64_t n = f->num_tokens - local;
        if (n > count) n = count;
        if (n) TF_TRY(tf__file_read(f, local, n, o, out_dtype));
        o += n * osz;
        start += n;
        count -= n;
        i++;
    }
    return 0;
}

int tf_dataset_view(const tf_dataset *ds, uint64_t start, uint64_t count, const void **ptr, tf_dtype *dtype) {
    TF_NEED_ARG(ds);
    TF_NEED_ARG(ptr);
    if (start > ds->num_tokens || count > ds->num_tokens - start)
        TF_FAIL(-ERANGE, "tokens [%llu, %llu) out of range: the dataset has %llu tokens",
                (unsigned long long)start, (unsigned long long)start + count, (unsigned long long)ds->num_tokens);
    uint64_t i = tf__dataset_file_of(ds, start);
    const tf_file *f = &ds->files[i];
    uint64_t local = start - ds->tok_prefix[i];
    /* a file mapped on demand may be unmapped again: no pointer into it */
    if (f->blocks.ops || f->lazy || !f->tokens || count > f->num_tokens - local) return -TF_EUNSUPPORTED;
    *ptr = f->tokens + local * tf_dtype_size(f->dtype);
    if (dtype) *dtype = f->dtype;
    return 0;
}

const void *tf__dataset_peek(const tf_dataset *ds, uint64_t pos) {
    if (pos >= ds->num_tokens) return NULL;
    const tf_file *f = &ds->files[tf__dataset_file_of(ds, pos)];
    if (f->lazy || f->blocks.ops || !f->tokens) return NULL;
    return f->tokens + (pos - ds->tok_prefix[tf__dataset_file_of(ds, pos)]) * tf_dtype_size(f->dtype);
}

static uint64_t file_of_doc(const tf_dataset *ds, uint64_t doc) {
    uint64_t lo = 0, hi = ds->nfiles;
    while (hi - lo > 1) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (ds->doc_prefix[mid] <= doc) lo = mid; else hi = mid;
    }
    while (lo + 1 < ds->nfiles && ds->doc_prefix[lo + 1] <= doc) lo++;
    return lo;
}

static int dataset_document(const tf_dataset *ds, uint64_t i, uint64_t *start, uint64_t *len) {
    TF_NEED_ARG_OF("tf_dataset_document", ds);
    TF_NEED_ARG_OF("tf_dataset_document", start);
    TF_NEED_ARG_OF("tf_dataset_document", len);
    if (ds->sel) {
        if (i >= ds->sel->n)
            TF_FAIL(-ERANGE, "document %llu out of range: the view has %llu documents", (unsigned long long)i,
                    (unsigned long long)ds->sel->n);
        i = ds->sel->ids[i];
    }
    if (i >= ds->num_docs)
        TF_FAIL(-ERANGE, "document %llu out of range: the dataset has %llu documents", (unsigned long long)i, (unsigned long long)ds->num_docs);
    uint64_t k = file_of_doc(ds, i);
    TF_TRY(tf__file_document(&ds->files[k], i - ds->doc_prefix[k], start, len));
    *start += ds->tok_prefix[k];
    return 0;
}

static int dataset_find_document(const tf_dataset *ds, uint64_t pos, uint64_t *doc) {
    TF_NEED_ARG_OF("tf_dataset_find_document", ds);
    TF_NEED_ARG_OF("tf_dataset_find_document", doc);
    if (pos >= ds->num_tokens)
        TF_FAIL(-ERANGE, "token %llu out of range: the dataset has %llu tokens", (unsigned long long)pos, (unsigned long long)ds->num_tokens);
    uint64_t k = tf__dataset_file_of(ds, pos);
    uint64_t local;
    TF_TRY(tf__file_find_document(&ds->files[k], pos - ds->tok_prefix[k], &local));
    *doc = ds->doc_prefix[k] + local;
    if (ds->sel) return tf_dataset_document_index(ds, *doc, doc);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* verify                                                                    */
/* ------------------------------------------------------------------------ */

enum { CHUNK = 1 << 18 }; /* tokens per check_vocab read */

/* buf: CHUNK int64 of scratch, allocated by tf__file_verify outside the guard. */
/* The format's verify of its own checksums (its ops'), or NULL. */
static int (*format_verify(const tf_file *f))(const tf_file *, _Atomic uint64_t *, _Atomic int *, void *, size_t) {
    return f->format_ops ? f->format_ops->verify : NULL;
}

static int check_vocab(const tf_file *f, uint64_t vocab, _Atomic uint64_t *progress, _Atomic int *cancel,
                       int64_t *buf) {
    int rc = 0;
    size_t isz = tf_dtype_size(f->dtype);
    for (uint64_t s = 0; s < f->num_tokens && !rc; s += CHUNK) {
        if (atomic_load(cancel)) { rc = -ECANCELED; break; }
        uint64_t n = f->num_tokens - s < CHUNK ? f->num_tokens - s : CHUNK;
        rc = tf__file_read(f, s, n, buf, TF_INT64);
        if (rc) break;
        if (vocab) {
            for (uint64_t k = 0; k < n; k++) {
                if (buf[k] < 0 || (uint64_t)buf[k] >= vocab) {
                    rc = tf__seterr(-TF_EVOCAB, "%s: token %llu is %lld, expected 0 <= id < vocab_size %llu. The file holds ids from another tokenizer, or it is corrupt.",
                                    f->path, (unsigned long long)(s + k), (long long)buf[k], (unsigned long long)vocab);
                    break;
                }
            }
        }
        if (!format_verify(f)) atomic_fetch_add(progress, n * isz); /* else counted by it */
    }
    return rc;
}

static int file_verify(const tf_file *f, uint64_t vocab_size, _Atomic uint64_t *progress, _Atomic int *cancel,
                       void *scratch, size_t cap);
typedef struct verify_call {
    const tf_file *f;
    uint64_t vocab;
    _Atomic uint64_t *progress;
    _Atomic int *cancel;
    void *scratch;
    size_t cap;
} verify_call;
static int call_verify(void *p) {
    verify_call *c = p;
    return file_verify(c->f, c->vocab, c->progress, c->cancel, c->scratch, c->cap);
}

/* Mapping a file on demand reads its header: under the guard too. */
typedef struct acquire_args {
    const tf_file *f;
    const tf_file **live;
} acquire_args;
static int acquire_call(void *p) {
    acquire_args *a = p;
    return tf__file_acquire(a->f, a->live);
}

/* Hashing and scanning a mapped file run under the SIGBUS guard (a file
 * truncated meanwhile gives -EIO); the scratch buffer is allocated here,
 * outside the guard, so a fault cannot leak it. */
static int file_verify_live(const tf_file *f, uint64_t vocab_size, _Atomic uint64_t *progress, _Atomic int *cancel);
int tf__file_verify(const tf_file *f, uint64_t vocab_size, _Atomic uint64_t *progress, _Atomic int *cancel) {
    if (!f->lazy) return file_verify_live(f, vocab_size, progress, cancel);
    const tf_file *l = NULL;
    int rc = tf__files_guard(f, 1, acquire_call, &(acquire_args){f, &l});
    if (rc) return rc;
    rc = file_verify_live(l, vocab_size, progress, cancel);
    tf__file_release(f);
    return rc;
}

static int file_verify_live(const tf_file *f, uint64_t vocab_size, _Atomic uint64_t *progress, _Atomic int *cancel) {
    size_t cap = CHUNK * sizeof(int64_t);
    if (f->blocks.ops && f->blocks.tokens * tf_dtype_size(f->dtype) > cap)
        cap = (size_t)(f->blocks.tokens * tf_dtype_size(f->dtype));
    void *scratch = malloc(cap);
    if (!scratch) return -ENOMEM;
    verify_call c = {f, vocab_size, progress, cancel, scratch, cap};
    int rc = tf__files_guard(f, 1, call_verify, &c);
    free(scratch);
    return rc;
}

static int file_verify(const tf_file *f, uint64_t vocab_size, _Atomic uint64_t *progress, _Atomic int *cancel,
                       void *scratch, size_t cap) {
    /* The checksums the file stores: its format's (the row's verify). */
    if (format_verify(f)) TF_TRY(format_verify(f)(f, progress, cancel, scratch, cap));
    /* Document index consistency: monotonic, within the token count. */
    uint64_t prev_end = 0;
    for (uint64_t j = 0; j < f->num_docs; j++) {
        uint64_t s, n;
        TF_TRY(tf__file_document(f, j, &s, &n));
        if (f->doc_kind == TF_DOCS_FORMAT && s < prev_end)
            TF_FAIL(-TF_EFORMAT, "%s: sequence %llu: pointer goes backwards (starts at token %llu, previous ends at %llu). Rebuild the .idx.",
                    f->aux_path, (unsigned long long)j, (unsigned long long)s, (unsigned long long)prev_end);
        prev_end = s + n;
    }
    return check_vocab(f, vocab_size, progress, cancel, scratch);
}

typedef struct verify_ctx {
    const tf_dataset *ds;
    _Atomic uint64_t next;
    _Atomic uint64_t progress;
    _Atomic int cancel;
    _Atomic int running;
    pthread_mutex_t mu;
    pthread_cond_t done; /* signalled when the last worker exits */
    int rc;
    uint64_t failed_file;
    char msg[1024];
} verify_ctx;

static void *verify_worker(void *arg) {
    verify_ctx *c = arg;
    for (;;) {
        uint64_t i = atomic_fetch_add(&c->next, 1);
        if (i >= c->ds->nfiles || atomic_load(&c->cancel)) break;
        int rc = tf__file_verify(&c->ds->files[i], c->ds->vocab_size, &c->progress, &c->cancel);
        if (rc < 0 && rc != -ECANCELED) {
            pthread_mutex_lock(&c->mu);
            /* report the first failing file in dataset order */
            if (!c->rc || i < c->failed_file) {
                c->rc = rc;
                c->failed_file = i;
                snprintf(c->msg, sizeof c->msg, "%s", tf_last_error());
            }
            pthread_mutex_unlock(&c->mu);
            atomic_store(&c->cancel, 1);
        }
    }
    pthread_mutex_lock(&c->mu);
    if (atomic_fetch_sub(&c->running, 1) == 1) pthread_cond_signal(&c->done);
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

int tf_dataset_verify(const tf_dataset *ds, int threads, tf_progress_fn cb, void *user) {
    TF_NEED_ARG(ds);
    tf__clearerr();
    uint64_t total = 0;
    for (uint64_t i = 0; i < ds->nfiles; i++) {
        const tf_file *f = &ds->files[i];
        total += f->num_tokens * tf_dtype_size(f->dtype);
    }
    if (threads <= 0) threads = tf__num_cpus();
    if ((uint64_t)threads > ds->nfiles) threads = (int)ds->nfiles;
    if (threads < 1) threads = 1;
    verify_ctx c;
    memset(&c, 0, sizeof c);
    c.ds = ds;
    pthread_mutex_init(&c.mu, NULL);
    tf__cond_init(&c.done);
    pthread_t *th = calloc((size_t)threads, sizeof *th);
    if (!th) {
        pthread_cond_destroy(&c.done);
        pthread_mutex_destroy(&c.mu);
        return -ENOMEM;
    }
    int started = 0;
    for (int t = 0; t < threads; t++) {
        atomic_fetch_add(&c.running, 1);
        if (pthread_create(&th[t], NULL, verify_worker, &c) != 0) {
            atomic_fetch_sub(&c.running, 1);
            break;
        }
        started++;
    }
    if (!started) { /* run inline */
        atomic_fetch_add(&c.running, 1);
        verify_worker(&c);
    }
    /* Wake for progress reports every 100 ms, or at once when the workers are
     * done (a small dataset verifies in well under one poll interval). The
     * callback runs without mu held: it may take the GIL. */
    int cancelled = 0;
    pthread_mutex_lock(&c.mu);
    while (atomic_load(&c.running) > 0) {
        struct timespec ts = tf__deadline_after(100 * 1000 * 1000);
        pthread_cond_timedwait(&c.done, &c.mu, &ts);
        if (atomic_load(&c.running) == 0) break;
        pthread_mutex_unlock(&c.mu);
        if (cb && !cancelled && cb(user, atomic_load(&c.progress), total)) {
            atomic_store(&c.cancel, 1);
            cancelled = 1;
        }
        pthread_mutex_lock(&c.mu);
    }
    pthread_mutex_unlock(&c.mu);
    for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
    free(th);
    pthread_cond_destroy(&c.done);
    pthread_mutex_destroy(&c.mu);
    if (c.rc) return tf__seterr(c.rc, "%s", c.msg);
    if (cancelled) TF_FAIL(-ECANCELED, "verify cancelled");
    if (cb) cb(user, total, total);
    return 0;
}
