/*
 * pathspec.c — a shard set named by a path spec: a directory without a
 * manifest, or a glob (docs/format.md, "Shard sets"), expanded into the
 * sorted files that tf_dataset_open concatenates.
 *
 * Each directory the spec reaches is listed once (open, fstat for its
 * identity, getdents), and everything the open needs to know about the
 * names in it comes from that listing: which entries are regular files,
 * and which companion files (the format table's: a Megatron .idx, a
 * datatrove .index, an eos_id .tfdocs, OLMo's .csv.gz, a .bos.idx) lie
 * beside each data file. Nothing is
 * probed per file: on a shared file system every stat is a round trip to a
 * metadata server that all ranks share. While the files of a listing are
 * opened, tf__listed_exists answers "is this file there" from it.
 *
 * The identity of each listed directory is taken from the descriptor the
 * listing reads (before the entries), so the node's catalog that records
 * the set under those identities can only be older than the listing, never
 * newer: a file added or removed changes its directory, and the set is
 * listed again (catalog.c, tf__catalog_load_set).
 *
 * Rules (the same as the Python package applied before this file existed):
 * a glob matches names segment by segment with fnmatch (FNM_PERIOD: '*'
 * does not match a leading '.'); a directory's data files are its regular
 * files less hidden ones, markers (_SUCCESS), a dataset's docs and configs,
 * and companion files of another listed file; they must be of one kind.
 * Order is byte order of the full names (code point order for UTF-8), the
 * same on every rank.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "source.h"

/* Companion files (a name that belongs to a data file beside it: X.idx to
 * X.bin, X.index to X) are the format table's rows' (companions.c,
 * tf__companion_at): one table says them all. */

/* A dataset's documentation and configs beside its shards: never token data. */
static const char *const not_data_ext[] = {".md", ".json", ".yaml", ".yml", ".txt", ".py", ".sh", ".toml", ".cfg"};

/* ---- one listed directory --------------------------------------------------- */

typedef struct entry {
    char *name;
    int is_dir;
    int is_link; /* a symbolic link (to what is_dir says) */
} entry;

typedef struct listed_dir {
    char *path;  /* as the spec writes it ("" for the working directory) */
    char *real;  /* its realpath, once asked for */
    tf__file_id id;
    entry *e;
    size_t n;
} listed_dir;

struct tf__listing {
    listed_dir *dirs;
    size_t ndirs, cap;
    size_t last; /* the directory found last + 1 (0: none): a set's files come directory by directory */
    int objects; /* made from an object listing (tf__listing_add_objects): never read from disk */
};

static int cmp_entry(const void *a, const void *b) {
    return strcmp(((const entry *)a)->name, ((const entry *)b)->name);
}

static const entry *find(const listed_dir *d, const char *name) {
    entry key = {(char *)name, 0, 0};
    return bsearch(&key, d->e, d->n, sizeof *d->e, cmp_entry);
}

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && memcmp(s + a - b, suf, b) == 0;
}

static int has_magic(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] == '*' || s[i] == '?' || s[i] == '[') return 1;
    return 0;
}

/* List dir (as written; "" is "."), once per listing. */
static int list_dir(tf__listing *L, const char *dir, const listed_dir **out) {
    for (size_t k = 0; k < L->ndirs; k++)
        if (strcmp(L->dirs[k].path, dir) == 0) {
            *out = &L->dirs[k];
            return 0;
        }
    if (L->objects || tf__is_url(dir)) /* (no directory in object storage but the listing's) */
        TF_FAIL(-ENOENT, "%s: no object lies under this prefix", dir);
#ifdef TF_TEST_HOOKS
    const char *forbid = getenv("TOKENFEED_FAULT_NO_LISTING");
    if (forbid && *forbid == '1') TF_FAIL(-EIO, "%s: listed (test builds: $TOKENFEED_FAULT_NO_LISTING forbids it)", *dir ? dir : ".");
#endif
    listed_dir *ds = tf__grow(L->dirs, &L->cap, L->ndirs, sizeof *ds, 4);
    if (!ds) return -ENOMEM;
    L->dirs = ds;
    listed_dir *d = &L->dirs[L->ndirs];
    memset(d, 0, sizeof *d);
    int fd = open(*dir ? dir : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        TF_FAIL(-e, "%s: cannot list this directory: %s", *dir ? dir : ".", strerror(e));
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        TF_FAIL(-e, "%s: cannot stat this directory: %s", *dir ? dir : ".", strerror(e));
    }
    /* the identity first: a change made while listing shows as a change */
    d->id = (tf__file_id){.dev = (uint64_t)st.st_dev, .ino = (uint64_t)st.st_ino, .size = (uint64_t)st.st_size,
                          .mtime_ns = (uint64_t)st.st_mtim.tv_sec * 1000000000ull + (uint64_t)st.st_mtim.tv_nsec,
                          .known = 1};
    DIR *dp = fdopendir(fd);
    if (!dp) {
        int e = errno;
        close(fd);
        TF_FAIL(-e, "%s: cannot list this directory: %s", *dir ? dir : ".", strerror(e));
    }
    if (!(d->path = strdup(dir))) {
        closedir(dp);
        return -ENOMEM;
    }
    L->ndirs++;
    size_t cap = 0;
    int rc = 0;
    struct dirent *de;
    errno = 0;
    while (rc == 0 && (de = readdir(dp))) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) continue;
        int is_dir = de->d_type == DT_DIR;
        if (de->d_type == DT_LNK || de->d_type == DT_UNKNOWN) {
            /* (a symlink, or a file system without d_type: the target says) */
            struct stat ls;
            is_dir = fstatat(dirfd(dp), de->d_name, &ls, 0) == 0 && S_ISDIR(ls.st_mode);
        } else if (de->d_type != DT_REG && de->d_type != DT_DIR) {
            continue; /* a FIFO, socket or device is never token data */
        }
        entry *e = tf__grow(d->e, &cap, d->n, sizeof *e, 64);
        if (!e) {
            rc = -ENOMEM;
            break;
        }
        d->e = e;
        if (!(d->e[d->n].name = strdup(de->d_name))) rc = -ENOMEM;
        else {
            d->e[d->n].is_link = de->d_type != DT_REG && de->d_type != DT_DIR;
            d->e[d->n++].is_dir = is_dir;
        }
        errno = 0;
    }
    if (rc == 0 && errno) rc = tf__seterr(-errno, "%s: cannot list this directory: %s", *dir ? dir : ".", strerror(errno));
    closedir(dp);
    if (rc) return rc;
    if (d->n) qsort(d->e, d->n, sizeof *d->e, cmp_entry);
    *out = d;
    return 0;
}

void tf__listing_free(tf__listing *L) {
    if (!L) return;
    for (size_t k = 0; k < L->ndirs; k++) {
        for (size_t i = 0; i < L->dirs[k].n; i++) free(L->dirs[k].e[i].name);
        free(L->dirs[k].e);
        free(L->dirs[k].path);
        free(L->dirs[k].real);
    }
    free(L->dirs);
    free(L);
}

tf__listing *tf__listing_new(void) { return calloc(1, sizeof(tf__listing)); }

size_t tf__listing_dirs(const tf__listing *L, const char ***paths, tf__file_id **ids) {
    *paths = NULL;
    *ids = NULL;
    if (!L || !L->ndirs) return 0;
    const char **p = malloc(L->ndirs * sizeof *p);
    tf__file_id *id = malloc(L->ndirs * sizeof *id);
    if (!p || !id) {
        free(p);
        free(id);
        return 0;
    }
    for (size_t k = 0; k < L->ndirs; k++) {
        /* the directory as catalog.c names a file's parent: "." for none */
        p[k] = *L->dirs[k].path ? L->dirs[k].path : ".";
        id[k] = L->dirs[k].id;
    }
    *paths = p;
    *ids = id;
    return L->ndirs;
}

/* ---- answering from a listing --------------------------------------------------- */

static _Thread_local const tf__listing *active;

void tf__listing_activate(const tf__listing *L) { active = L; }

/* Whether listed directory d is the directory part (n bytes) of path. */
static int is_parent(const listed_dir *d, const char *path, size_t n, const char *slash) {
    const char *p = d->path;
    size_t m = strlen(p);
    while (m > 1 && p[m - 1] == '/') m--; /* "d/" lists the same names as "d" */
    if (m == n && memcmp(p, path, n) == 0) return 1;
    return n == 0 && slash && m == 1 && p[0] == '/'; /* "/x" */
}

/* The listed directory path's parent is (its path part "" when none), or NULL. */
static const listed_dir *parent_of(const tf__listing *L, const char *path, const char **base) {
    const char *slash = strrchr(path, '/');
    size_t n = slash ? (size_t)(slash - path) : 0;
    *base = slash ? slash + 1 : path;
    if (L->last && L->last <= L->ndirs && is_parent(&L->dirs[L->last - 1], path, n, slash))
        return &L->dirs[L->last - 1];
    for (size_t k = 0; k < L->ndirs; k++)
        if (is_parent(&L->dirs[k], path, n, slash)) {
            ((tf__listing *)L)->last = k + 1; /* (one thread opens a listing's files) */
            return &L->dirs[k];
        }
    return NULL;
}

int tf__listed_exists(const char *path) {
    const tf__listing *L = active;
    if (!L || !path) return -1;
    const char *base;
    const listed_dir *d = parent_of(L, path, &base);
    if (!d) return -1;
    const entry *e = find(d, base);
    return e && !e->is_dir;
}

char *tf__listed_realpath(const char *path) {
    const tf__listing *L = active;
    if (!L || !path) return NULL;
    const char *base;
    listed_dir *d = (listed_dir *)parent_of(L, path, &base);
    const entry *e = d ? find(d, base) : NULL;
    if (!e || e->is_link) return NULL; /* (a link resolves to its target's name) */
    if (!d->real && !(d->real = realpath(*d->path ? d->path : ".", NULL))) return NULL;
    size_t a = strlen(d->real), b = strlen(base);
    char *out = malloc(a + b + 2);
    if (!out) return NULL;
    memcpy(out, d->real, a);
    out[a] = '/';
    memcpy(out + a + (a == 1 && d->real[0] == '/' ? 0 : 1), base, b + 1);
    return out;
}

/* ---- the spec's kind -------------------------------------------------------------- */

int tf__pathspec_kind(const char *path) {
    if (!path || tf__is_url(path)) return TF__SPEC_PATH;
    if (has_magic(path, strlen(path))) {
        struct stat st;
        /* a name that holds '*' or '[' and exists is that name */
        if (lstat(path, &st) != 0) return TF__SPEC_GLOB;
        return S_ISDIR(st.st_mode) ? TF__SPEC_DIR : TF__SPEC_PATH;
    }
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) return TF__SPEC_DIR;
    return TF__SPEC_PATH;
}

/* ---- expansion ------------------------------------------------------------------- */

typedef struct hits {
    char **v;
    size_t n, cap;
} hits;

static int hit_push(hits *h, const char *dir, const char *name) {
    char **v = tf__grow(h->v, &h->cap, h->n, sizeof *v, 64);
    if (!v) return -ENOMEM;
    h->v = v;
    size_t a = strlen(dir), b = strlen(name);
    int sep = a && dir[a - 1] != '/';
    char *s = malloc(a + sep + b + 1);
    if (!s) return -ENOMEM;
    memcpy(s, dir, a);
    if (sep) s[a] = '/';
    memcpy(s + a + sep, name, b + 1);
    h->v[h->n++] = s;
    return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Segments of pattern from seg on, matched under dir (listed). */
static int walk(tf__listing *L, const char *dir, const char *rest, hits *out) {
    const char *slash = strchr(rest, '/');
    size_t n = slash ? (size_t)(slash - rest) : strlen(rest);
    if (n == 0) { /* "a//b" or a trailing '/': the same directory */
        return slash ? walk(L, dir, slash + 1, out) : 0;
    }
    char *seg = strndup(rest, n);
    if (!seg) return -ENOMEM;
    const listed_dir *d;
    int rc = list_dir(L, dir, &d);
    if (rc) {
        free(seg);
        /* a directory matched by a wildcard that vanished or cannot be read: not a match */
        return rc == -ENOENT || rc == -ENOTDIR || rc == -EACCES ? (tf__clearerr(), 0) : rc;
    }
    size_t at = (size_t)(d - L->dirs); /* (a deeper listing may move L->dirs: d is found again by index) */
    for (size_t i = 0; rc == 0 && i < L->dirs[at].n; i++) {
        d = &L->dirs[at];
        if (fnmatch(seg, d->e[i].name, FNM_PERIOD) != 0) continue;
        if (!slash) {
            rc = hit_push(out, dir, d->e[i].name);
        } else if (d->e[i].is_dir) {
            hits one = {0};
            rc = hit_push(&one, dir, d->e[i].name);
            if (rc == 0) rc = walk(L, one.v[0], slash + 1, out);
            free(one.v ? one.v[0] : NULL);
            free(one.v);
        }
    }
    free(seg);
    return rc;
}

/* The data file name that companion k named name belongs to, written into
 * buf (cap bytes); 0 when name is no such companion. */
static int data_of(const char *name, const tf__companion *c, char *buf, size_t cap) {
    if (!ends_with(name, c->suffix)) return 0;
    size_t stem = strlen(name) - strlen(c->suffix);
    if (stem + strlen(c->data_ext) + 1 > cap || stem == 0) return 0;
    memcpy(buf, name, stem);
    strcpy(buf + stem, c->data_ext);
    return 1;
}

/* Whether a name (base) in listed directory d is a companion of a file listed beside it. */
static int is_companion(const listed_dir *d, const char *base) {
    char buf[4096];
    const tf__companion *c;
    for (size_t k = 0; (c = tf__companion_at(k)) != NULL; k++) {
        if (!data_of(base, c, buf, sizeof buf)) continue;
        const entry *e = find(d, buf);
        if (e && !e->is_dir) return 1;
    }
    return 0;
}

static int not_data(const char *base) {
    if (base[0] == '.' || base[0] == '_') return 1;
    size_t n = strlen(base);
    for (size_t i = 0; i < sizeof not_data_ext / sizeof *not_data_ext; i++) {
        size_t m = strlen(not_data_ext[i]);
        if (n >= m && strncasecmp(base + n - m, not_data_ext[i], m) == 0) return 1;
    }
    return 0;
}

/* The kind of a data file for the one-format rule: "Megatron .bin/.idx
 * pairs", ".EXT files" or "files without an extension". */
static void kind_of(const listed_dir *d, const char *base, char *out, size_t cap) {
    char buf[4096];
    size_t n = strlen(base);
    const tf__companion *c;
    for (size_t k = 0; (c = tf__companion_at(k)) != NULL; k++) { /* a pair's data file (format table) */
        if (!c->pair || !ends_with(base, c->data_ext)) continue;
        size_t de = strlen(c->data_ext);
        if (n - de + strlen(c->suffix) + 1 > sizeof buf) continue;
        memcpy(buf, base, n - de);
        strcpy(buf + n - de, c->suffix);
        const entry *e = find(d, buf);
        if (e && !e->is_dir) {
            snprintf(out, cap, "%.40s %s/%s pairs", c->pair, c->data_ext, c->suffix);
            return;
        }
    }
    const char *b = base;
    while (*b == '.') b++; /* (a leading dot starts no extension) */
    const char *dot = strrchr(b, '.');
    if (dot && dot != b) snprintf(out, cap, "%s files", dot);
    else snprintf(out, cap, "files without an extension");
}

/* The listed directory of a full name (dir part as the spec wrote it). */
static const listed_dir *dir_of(const tf__listing *L, const char *path, const char **base) {
    return parent_of(L, path, base);
}

/* A glob: its matches, less companions of a listed file, sorted. */
static int expand_glob(tf__listing *L, const char *pattern, hits *out) {
    /* the fixed part: the directories before the first segment with a wildcard */
    size_t len = strlen(pattern), fixed = 0;
    for (size_t i = 0; i <= len; i++) {
        if (i == len || pattern[i] == '/') {
            size_t start = fixed;
            if (has_magic(pattern + start, i - start)) break;
            fixed = i + 1;
        }
    }
    if (fixed > len) fixed = len; /* (no wildcard: not a glob) */
    char *dir = strndup(pattern, fixed);
    if (!dir) return -ENOMEM;
    size_t dl = strlen(dir);
    if (dl > 1 && dir[dl - 1] == '/') dir[dl - 1] = '\0'; /* "a/b/" -> "a/b"; "/" stays */
    hits all = {0};
    int rc = walk(L, dir, pattern + fixed, &all);
    free(dir);
    if (rc == 0 && all.n == 0)
        rc = tf__seterr(-ENOENT, "%s: no file or directory matches this pattern", pattern);
    for (size_t i = 0; i < all.n; i++) {
        const char *base;
        const listed_dir *d = rc == 0 ? dir_of(L, all.v[i], &base) : NULL;
        if (rc == 0 && !(d && is_companion(d, base))) {
            char **v = tf__grow(out->v, &out->cap, out->n, sizeof *v, 64);
            if (!v) rc = -ENOMEM;
            else {
                out->v = v;
                out->v[out->n++] = all.v[i];
                continue;
            }
        }
        free(all.v[i]);
    }
    free(all.v);
    return rc;
}

/* The kinds of a directory's data files, for the error that says what it holds. */
typedef struct kind_count {
    char kind[96];
    size_t n;
    const char *names[3];
} kind_count;

static int cmp_kind(const void *a, const void *b) {
    const kind_count *x = a, *y = b;
    if (x->n != y->n) return x->n > y->n ? -1 : 1;
    return strcmp(x->kind, y->kind);
}

/* "2 .bin files (b.bin, c.bin); 1 .npy files (a.npy)", most numerous first. */
static void describe(kind_count *k, size_t nk, char *out, size_t cap) {
    qsort(k, nk, sizeof *k, cmp_kind);
    size_t at = 0;
    out[0] = '\0';
    for (size_t i = 0; i < nk && at < cap; i++) {
        int w = snprintf(out + at, cap - at, "%s%zu %s (", i ? "; " : "", k[i].n, k[i].kind);
        for (size_t j = 0; w >= 0 && j < 3 && j < k[i].n && at + (size_t)w < cap; j++)
            w += snprintf(out + at + w, cap - at - (size_t)w, "%s%s", j ? ", " : "", k[i].names[j]);
        if (w >= 0 && at + (size_t)w < cap)
            w += k[i].n > 3 ? snprintf(out + at + w, cap - at - (size_t)w, ", ... (%zu more))", k[i].n - 3)
                            : snprintf(out + at + w, cap - at - (size_t)w, ")");
        if (w < 0) break;
        at += (size_t)w;
    }
}

/* A directory without a manifest: its data files, of one kind. 1 when it is
 * not such a set (it holds a manifest, or native shards without one, or
 * nothing): the caller opens the path itself, which says what it is. */
static int expand_dir(tf__listing *L, const char *path, hits *out) {
    char *dir = strdup(path);
    if (!dir) return -ENOMEM;
    size_t dl = strlen(dir);
    while (dl > 1 && dir[dl - 1] == '/') dir[--dl] = '\0';
    const listed_dir *d;
    int rc = list_dir(L, dir, &d);
    free(dir);
    if (rc) return rc;
    if (!d->n || find(d, TF_MANIFEST_NAME)) return 1;
    for (size_t i = 0; i < d->n; i++)
        if (!d->e[i].is_dir && (ends_with(d->e[i].name, ".tfs") || ends_with(d->e[i].name, ".tmp")))
            return 1; /* a native write that did not finish: the core's open says so */
    /* the data files and their kinds (entries are in name order) */
    kind_count kinds[8];
    size_t nkinds = 0, nsub = 0, nskipped = 0, more_kinds = 0;
    const char *sub = NULL, *skipped[3] = {NULL, NULL, NULL};
    char kind[96];
    for (size_t i = 0; rc == 0 && i < d->n; i++) {
        const entry *e = &d->e[i];
        if (e->is_dir) {
            if (!sub) sub = e->name;
            nsub++;
            continue;
        }
        if (not_data(e->name)) {
            if (nskipped < 3) skipped[nskipped] = e->name;
            nskipped++;
            continue;
        }
        if (is_companion(d, e->name)) continue;
        kind_of(d, e->name, kind, sizeof kind);
        size_t k = 0;
        while (k < nkinds && strcmp(kinds[k].kind, kind) != 0) k++;
        if (k == nkinds && nkinds < sizeof kinds / sizeof *kinds) {
            memset(&kinds[k], 0, sizeof kinds[k]);
            snprintf(kinds[k].kind, sizeof kinds[k].kind, "%s", kind);
            nkinds++;
        }
        if (k < nkinds) {
            if (kinds[k].n < 3) kinds[k].names[kinds[k].n] = e->name;
            kinds[k].n++;
        } else {
            more_kinds++;
        }
        rc = hit_push(out, path, e->name);
    }
    if (rc == 0 && !nkinds) {
        char found[512];
        int at = nsub ? snprintf(found, sizeof found, "%zu subdirectories (%s%s)", nsub, sub, nsub > 1 ? ", ..." : "")
                      : snprintf(found, sizeof found, "nothing");
        if (nskipped && at >= 0 && (size_t)at < sizeof found)
            snprintf(found + at, sizeof found - (size_t)at, " and %zu files that are not token data (%s%s%s%s%s%s)",
                     nskipped, skipped[0], skipped[1] ? ", " : "", skipped[1] ? skipped[1] : "",
                     skipped[2] ? ", " : "", skipped[2] ? skipped[2] : "", nskipped > 3 ? ", ..." : "");
        rc = tf__seterr(-TF_EFORMAT, "%s: no manifest (%s) and no token files: found %s. Expected a tokenfeed dataset, "
                        "or files of one format (.npy, llm.c, Megatron .bin/.idx pairs, headerless with dtype=)",
                        path, TF_MANIFEST_NAME, found);
    }
    if (rc == 0 && nkinds > 1) {
        char what[1024];
        describe(kinds, nkinds, what, sizeof what);
        rc = tf__seterr(-TF_EFORMAT, "%s: holds files of more than one format: %s%s. A directory opens as one shard "
                        "set of one format: open a glob (e.g. dir/*.bin) or a list of paths instead",
                        path, what, more_kinds ? "; and more" : "");
    }
    return rc;
}

int tf__pathspec_expand(tf__listing *L, const char *path, int kind, char ***files, size_t *nfiles) {
    *files = NULL;
    *nfiles = 0;
    hits h = {0};
    int rc = kind == TF__SPEC_GLOB ? expand_glob(L, path, &h) : expand_dir(L, path, &h);
    if (rc == 0 && h.n) qsort(h.v, h.n, sizeof *h.v, cmp_str);
    if (rc != 0) {
        for (size_t i = 0; i < h.n; i++) free(h.v[i]);
        free(h.v);
        return rc;
    }
    *files = h.v;
    *nfiles = h.n;
    return 0;
}

unsigned tf__listed_companions(const tf__listing *L, const char *path) {
    const char *base;
    const listed_dir *d = L ? parent_of(L, path, &base) : NULL;
    if (!d) return 0;
    unsigned mask = 0;
    char buf[4096];
    size_t n = strlen(base);
    const tf__companion *c;
    for (size_t k = 0; k < 32 && (c = tf__companion_at(k)) != NULL; k++) {
        size_t de = strlen(c->data_ext);
        if (!ends_with(base, c->data_ext) || n - de + strlen(c->suffix) + 1 > sizeof buf) continue;
        memcpy(buf, base, n - de);
        strcpy(buf + n - de, c->suffix);
        const entry *e = find(d, buf);
        if (e && !e->is_dir) mask |= 1u << k;
    }
    return mask;
}

int tf__listed_kind(const tf__listing *L, const char *path) {
    const char *base;
    const listed_dir *d = L ? parent_of(L, path, &base) : NULL;
    if (!d) return -1;
    const entry *e = find(d, base);
    return !e ? TF__NAME_NONE : e->is_dir ? TF__NAME_DIR : TF__NAME_FILE;
}

int tf__listed_is_dir(const tf__listing *L, const char *path) {
    const char *base;
    const listed_dir *d = L ? parent_of(L, path, &base) : NULL;
    if (!d) return -1;
    const entry *e = find(d, base);
    return e ? e->is_dir : -1;
}

/* ---- remote path specs: the same rules over an object listing --------------------- */

/* Where the key of a URL begins (after scheme://host/), or NULL. */
static const char *url_key(const char *url) {
    const char *p = strstr(url, "://");
    if (!p) return NULL;
    const char *slash = strchr(p + 3, '/');
    return slash ? slash + 1 : url + strlen(url);
}

int tf__pathspec_url_kind(const char *url) {
    const char *key = url ? url_key(url) : NULL;
    if (!key) return TF__SPEC_PATH;
    if (has_magic(key, strlen(key))) return TF__SPEC_GLOB;
    size_t n = strlen(url);
    return n && url[n - 1] == '/' ? TF__SPEC_DIR : TF__SPEC_PATH;
}

char *tf__pathspec_url_prefix(const char *url) {
    const char *key = url_key(url);
    if (!key) return NULL;
    size_t fixed = (size_t)(key - url), len = strlen(url);
    if (tf__pathspec_url_kind(url) != TF__SPEC_GLOB) return strdup(url);
    for (size_t i = fixed; i < len; i++) {
        if (url[i] != '/') continue;
        if (has_magic(url + fixed, i - fixed)) break;
        fixed = i + 1;
    }
    return strndup(url, fixed);
}

int tf__pathspec_url_set(const char *url, char **prefix, char **pattern) {
    *prefix = *pattern = NULL;
    int kind = tf__pathspec_url_kind(url);
    const char *key = url_key(url);
    if (kind == TF__SPEC_DIR) {
        *prefix = strdup(url);
        *pattern = strdup("");
    } else if (kind == TF__SPEC_GLOB) {
        const char *slash = strrchr(key, '/');
        const char *name = slash ? slash + 1 : key;
        if (!*name || has_magic(key, (size_t)(name - key))) return 1; /* wildcards in a directory part */
        *prefix = strndup(url, (size_t)(name - url));
        *pattern = strdup(name);
    } else {
        return 1;
    }
    if (!*prefix || !*pattern) {
        free(*prefix);
        free(*pattern);
        *prefix = *pattern = NULL;
        return -ENOMEM;
    }
    return 0;
}

typedef struct obj_entry {
    char *dir; /* the listed directory it lies in, without a trailing '/' */
    const char *name;
    int is_dir;
} obj_entry;

static int cmp_obj_entry(const void *a, const void *b) {
    const obj_entry *x = a, *y = b;
    int c = strcmp(x->dir, y->dir);
    if (c) return c;
    c = strcmp(x->name, y->name);
    return c ? c : x->is_dir - y->is_dir;
}

/* The directories of an object listing: prefix (ending in '/') and every
 * "directory" that the keys under it imply, each with the names directly in
 * it; a key with an empty segment ("a//b") names nothing a path spec can. */
int tf__listing_add_objects(tf__listing *L, const char *prefix, const char *const *urls, size_t n) {
    size_t plen = strlen(prefix);
    if (!plen || prefix[plen - 1] != '/') TF_FAIL(-EINVAL, "%s: a listing's prefix ends with '/'", prefix);
    L->objects = 1;
    obj_entry *v = NULL;
    size_t nv = 0, cap = 0;
    int rc = 0;
    char *root = strndup(prefix, plen - 1);
    if (!root) return -ENOMEM;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        if (!urls[i] || strncmp(urls[i], prefix, plen) != 0) continue;
        const char *rest = urls[i] + plen;
        if (!*rest || strstr(rest, "//") || rest[0] == '/') continue;
        for (const char *seg = rest; rc == 0 && *seg;) {
            const char *slash = strchr(seg, '/');
            if (slash && !slash[1]) break; /* "a/" : a directory marker object */
            obj_entry *g = tf__grow(v, &cap, nv, sizeof *v, 256);
            if (!g) {
                rc = -ENOMEM;
                break;
            }
            v = g;
            char *dir = malloc(plen + (size_t)(seg - rest));
            if (!dir) {
                rc = -ENOMEM;
                break;
            }
            memcpy(dir, root, plen - 1);
            if (seg != rest) {
                dir[plen - 1] = '/';
                memcpy(dir + plen, rest, (size_t)(seg - rest) - 1);
                dir[plen + (size_t)(seg - rest) - 1] = '\0';
            } else {
                dir[plen - 1] = '\0';
            }
            v[nv].dir = dir;
            v[nv].name = seg; /* up to the next '/' */
            v[nv].is_dir = slash != NULL;
            nv++;
            if (!slash) break;
            seg = slash + 1;
        }
    }
    /* names end at '/': copy them out before sorting */
    char **names = rc == 0 && nv ? calloc(nv, sizeof *names) : NULL;
    if (rc == 0 && nv && !names) rc = -ENOMEM;
    for (size_t i = 0; rc == 0 && i < nv; i++) {
        const char *slash = strchr(v[i].name, '/');
        if (!(names[i] = slash ? strndup(v[i].name, (size_t)(slash - v[i].name)) : strdup(v[i].name))) rc = -ENOMEM;
        else v[i].name = names[i];
    }
    if (rc == 0 && nv) qsort(v, nv, sizeof *v, cmp_obj_entry);
    /* the prefix itself is always listed, even with nothing under it */
    listed_dir *d = NULL;
    if (rc == 0) {
        listed_dir *ds = tf__grow(L->dirs, &L->cap, L->ndirs, sizeof *ds, 4);
        if (!ds) rc = -ENOMEM;
        else {
            L->dirs = ds;
            d = &L->dirs[L->ndirs++];
            memset(d, 0, sizeof *d);
            d->path = root;
            root = NULL;
        }
    }
    size_t dcap = 0;
    for (size_t i = 0; rc == 0 && i < nv; i++) {
        if (strcmp(v[i].dir, L->dirs[L->ndirs - 1].path) != 0) {
            size_t k = 0;
            while (k < L->ndirs && strcmp(L->dirs[k].path, v[i].dir) != 0) k++;
            if (k == L->ndirs) {
                listed_dir *ds = tf__grow(L->dirs, &L->cap, L->ndirs, sizeof *ds, 4);
                if (!ds) {
                    rc = -ENOMEM;
                    break;
                }
                L->dirs = ds;
                memset(&L->dirs[L->ndirs], 0, sizeof *ds);
                if (!(L->dirs[L->ndirs].path = strdup(v[i].dir))) {
                    rc = -ENOMEM;
                    break;
                }
                L->ndirs++;
                dcap = 0;
            } else if (k != L->ndirs - 1) {
                continue; /* (sorted: never) */
            } else {
                dcap = L->dirs[k].n;
            }
        }
        d = &L->dirs[L->ndirs - 1];
        /* one entry per name: a file and a "directory" of one name keep the file */
        if (d->n && strcmp(d->e[d->n - 1].name, v[i].name) == 0) continue;
        entry *e = tf__grow(d->e, &dcap, d->n, sizeof *e, 64);
        if (!e) {
            rc = -ENOMEM;
            break;
        }
        d->e = e;
        if (!(d->e[d->n].name = strdup(v[i].name))) {
            rc = -ENOMEM;
            break;
        }
        d->e[d->n].is_dir = v[i].is_dir;
        d->e[d->n].is_link = 0;
        d->n++;
    }
    for (size_t i = 0; i < nv; i++) {
        free(v[i].dir);
        if (names) free(names[i]);
    }
    free(names);
    free(v);
    free(root);
    return rc;
}
