/*
 * columns.c — per-document metadata columns beside a dataset (docs/format.md,
 * "Metadata columns"), and the filter language evaluated over them
 * (docs/views.md).
 *
 * A column file is memory-mapped. At open, the header and the directory are
 * checked (magic, version, header checksum, every section inside the file,
 * each section's size what its type and the document count make it, names
 * valid and unique); nothing of the columns' payload is read. A column's
 * payload is checked where it is used: the first time a filter, a match or a
 * value read touches a column, its checksum is computed and its structure
 * checked (string offsets ascending and inside the bytes, category codes
 * below the dictionary's size), under the SIGBUS guard, so that a file
 * truncated since it was mapped gives -EIO rather than a crash. Evaluation
 * then relies on those checks.
 *
 * The filter language (tf_columns_eval):
 *
 *   expr   := or
 *   or     := and ('or' and)*
 *   and    := unary ('and' unary)*
 *   unary  := 'not' unary | '(' expr ')' | cmp
 *   cmp    := NAME op literal | NAME ['not'] 'in' '(' literal (',' literal)* [','] ')'
 *   op     := '==' | '!=' | '<' | '<=' | '>' | '>='
 *   literal:= number | 'string' | "string"
 *
 * It is evaluated over chunks of documents, one byte per document per node of
 * the expression: memory is O(nodes x chunk), whatever the number of
 * documents. A missing value (int64 INT64_MIN, float NaN, category code
 * 0xFFFFFFFF) satisfies no comparison and no in-list; 'not' flips the result.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "source.h"

#define COL_MAGIC "TFCOLS1\0"
#define COL_VERSION 1u
#define COL_HEADER 64u
#define COL_ENTRY 80u
#define COL_MAX_COLUMNS 4096u
#define COL_MAX_NAME 255u
#define COL_NULL_CODE 0xFFFFFFFFu
#define EVAL_CHUNK 4096u

typedef struct col {
    char name[COL_MAX_NAME + 1];
    tf_column_type type;
    const uint8_t *a, *b, *c;
    uint64_t a_len, b_len, c_len;
    uint64_t checksum;
    uint64_t ncat; /* categories */
    _Atomic int checked; /* 0 not yet, 1 good */
} col;

struct tf_columns {
    char *path;
    void *map;
    size_t map_len;
    int owns_map;
    uint64_t n;
    uint64_t fingerprint;
    uint32_t ncols;
    col *cols;
};

/* ------------------------------------------------------------------------ */
/* open and header checks                                                    */
/* ------------------------------------------------------------------------ */

static int name_ok(const uint8_t *s, uint64_t n) {
    if (n == 0 || n > COL_MAX_NAME) return 0;
    for (uint64_t i = 0; i < n; i++) {
        uint8_t ch = s[i];
        int alpha = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_';
        if (!alpha && !(i && ch >= '0' && ch <= '9')) return 0;
    }
    /* the language's words cannot name a column */
    static const char *const words[] = {"and", "or", "not", "in"};
    for (size_t w = 0; w < 4; w++)
        if (strlen(words[w]) == n && memcmp(words[w], s, n) == 0) return 0;
    return 1;
}

static int section(const char *path, const char *cname, const char *which, const uint8_t *buf, uint64_t len,
                   uint64_t off, uint64_t slen, const uint8_t **out) {
    uint64_t end;
    if (off % 8 || tf__add_overflow(off, slen, &end) || end > len)
        TF_FAIL(-TF_EFORMAT, "%s: column %s: section %s [%llu, +%llu) lies outside the %llu-byte file or is not 8-aligned. The file is truncated or corrupt: write it again (tokenfeed meta attach).",
                path, cname, which, (unsigned long long)off, (unsigned long long)slen, (unsigned long long)len);
    *out = buf + off;
    return 0;
}

int tf__columns_parse(const char *path, const uint8_t *buf, size_t len, tf_columns *c) {
    if (len < COL_HEADER)
        TF_FAIL(-TF_EFORMAT, "%s: header: expected at least %u bytes, found %zu. The file is truncated or not a tokenfeed column file: write it again (tokenfeed meta attach).",
                path, COL_HEADER, len);
    if (memcmp(buf, COL_MAGIC, 8) != 0)
        TF_FAIL(-TF_EFORMAT, "%s: magic: expected \"TFCOLS1\", found other bytes. This is not a tokenfeed column file.", path);
    uint32_t version = tf__le32(buf + 8), ncols = tf__le32(buf + 12);
    if (version != COL_VERSION)
        TF_FAIL(-TF_EFORMAT, "%s: version: expected %u, found %u. Upgrade tokenfeed or write the columns again.", path,
                COL_VERSION, version);
    if (ncols > COL_MAX_COLUMNS)
        TF_FAIL(-TF_EFORMAT, "%s: ncols: expected at most %u, found %u. The file is corrupt: write it again.", path,
                COL_MAX_COLUMNS, ncols);
    uint64_t n = tf__le64(buf + 16), dir = tf__le64(buf + 32);
    uint64_t dir_len = (uint64_t)ncols * COL_ENTRY, dir_end;
    if (dir != COL_HEADER || tf__add_overflow(dir, dir_len, &dir_end) || dir_end > len)
        TF_FAIL(-TF_EFORMAT, "%s: directory: expected %llu bytes at offset %u inside the %zu-byte file, found offset %llu. The file is truncated or corrupt: write it again.",
                path, (unsigned long long)dir_len, COL_HEADER, len, (unsigned long long)dir);
    uint64_t h = tf_hash64(buf, 56, 0);
    h = tf_hash64(buf + dir, (size_t)dir_len, h);
    if (h != tf__le64(buf + 56))
        TF_FAIL(-TF_EFORMAT, "%s: header_checksum: expected %016llx, found %016llx. The header or directory is corrupt: write the columns again.",
                path, (unsigned long long)tf__le64(buf + 56), (unsigned long long)h);
    c->n = n;
    c->fingerprint = tf__le64(buf + 24);
    c->ncols = ncols;
    c->cols = calloc(ncols ? ncols : 1, sizeof *c->cols);
    if (!c->cols) return -ENOMEM;
    for (uint32_t i = 0; i < ncols; i++) {
        const uint8_t *e = buf + dir + (uint64_t)i * COL_ENTRY;
        col *k = &c->cols[i];
        uint64_t noff = tf__le64(e), nlen = tf__le64(e + 8), nend;
        if (nlen > COL_MAX_NAME || tf__add_overflow(noff, nlen, &nend) || nend > len || !name_ok(buf + noff, nlen))
            TF_FAIL(-TF_EFORMAT, "%s: column %u: name: expected 1 to %u bytes of [A-Za-z_][A-Za-z0-9_]* inside the file (not and/or/not/in), found %llu bytes at %llu. The file is corrupt: write it again.",
                    path, i, COL_MAX_NAME, (unsigned long long)nlen, (unsigned long long)noff);
        memcpy(k->name, buf + noff, nlen);
        k->name[nlen] = 0;
        for (uint32_t j = 0; j < i; j++)
            if (strcmp(c->cols[j].name, k->name) == 0)
                TF_FAIL(-TF_EFORMAT, "%s: column %u: name: \"%s\" is already column %u. The file is corrupt: write it again.",
                        path, i, k->name, j);
        uint32_t type = tf__le32(e + 16);
        k->a_len = tf__le64(e + 32);
        k->b_len = tf__le64(e + 48);
        k->c_len = tf__le64(e + 64);
        k->checksum = tf__le64(e + 72);
        TF_TRY(section(path, k->name, "a", buf, len, tf__le64(e + 24), k->a_len, &k->a));
        TF_TRY(section(path, k->name, "b", buf, len, tf__le64(e + 40), k->b_len, &k->b));
        TF_TRY(section(path, k->name, "c", buf, len, tf__le64(e + 56), k->c_len, &k->c));
        uint64_t want_a = 0, n1;
        int ok = 1;
        switch (type) {
        case TF_COLUMN_INT64:
        case TF_COLUMN_FLOAT64:
            ok = !tf__mul_overflow(n, 8, &want_a) && k->a_len == want_a && !k->b_len && !k->c_len;
            break;
        case TF_COLUMN_STRING:
            ok = !tf__add_overflow(n, 1, &n1) && !tf__mul_overflow(n1, 8, &want_a) && k->a_len == want_a &&
                 !k->c_len;
            break;
        case TF_COLUMN_CATEGORY:
            ok = !tf__mul_overflow(n, 4, &want_a) && k->a_len == want_a && k->b_len >= 8 && k->b_len % 8 == 0;
            k->ncat = k->b_len / 8 - 1;
            if (k->ncat >= COL_NULL_CODE) ok = 0;
            break;
        default:
            TF_FAIL(-TF_EFORMAT, "%s: column %s: type: expected 1 (int64), 2 (float64), 3 (string) or 4 (category), found %u. Upgrade tokenfeed or write the columns again.",
                    path, k->name, type);
        }
        if (!ok)
            TF_FAIL(-TF_EFORMAT, "%s: column %s: section sizes (%llu, %llu, %llu bytes) do not fit a %s column of %llu documents. The file is corrupt: write it again.",
                    path, k->name, (unsigned long long)k->a_len, (unsigned long long)k->b_len,
                    (unsigned long long)k->c_len, tf_column_type_name((tf_column_type)type), (unsigned long long)n);
        k->type = (tf_column_type)type;
    }
    return 0;
}

const char *tf_column_type_name(tf_column_type t) {
    switch (t) {
    case TF_COLUMN_INT64: return "int64";
    case TF_COLUMN_FLOAT64: return "float64";
    case TF_COLUMN_STRING: return "string";
    case TF_COLUMN_CATEGORY: return "category";
    }
    return "unknown";
}

static int columns_new(const char *path, tf_columns **out) {
    tf_columns *c = calloc(1, sizeof *c);
    if (!c) return -ENOMEM;
    c->path = strdup(path ? path : "(memory)");
    if (!c->path) {
        free(c);
        return -ENOMEM;
    }
    *out = c;
    return 0;
}

int tf_columns_open(const char *path, tf_columns **out) {
    TF_NEED_ARG(path);
    TF_NEED_ARG(out);
    *out = NULL;
    tf_columns *c;
    TF_TRY(columns_new(path, &c));
    int rc = tf__map_file(path, &c->map, &c->map_len);
    if (rc) {
        tf_columns_free(c);
        return rc;
    }
    c->owns_map = 1;
    tf__sigbus_install();
    rc = tf__columns_parse(path, c->map, c->map_len, c);
    if (rc) {
        tf_columns_free(c);
        return rc;
    }
    *out = c;
    return 0;
}

int tf_columns_from_memory(const void *buf, size_t len, tf_columns **out) {
    TF_NEED_ARG(out);
    *out = NULL;
    if (!buf && len) return tf__seterr(-EINVAL, "tf_columns_from_memory: buf is NULL");
    tf_columns *c;
    TF_TRY(columns_new(NULL, &c));
    c->map = (void *)buf;
    c->map_len = len;
    int rc = tf__columns_parse(c->path, buf, len, c);
    if (rc) {
        tf_columns_free(c);
        return rc;
    }
    *out = c;
    return 0;
}

void tf_columns_free(tf_columns *c) {
    if (!c) return;
    if (c->owns_map) tf__unmap(c->map, c->map_len);
    free(c->cols);
    free(c->path);
    free(c);
}

uint64_t tf_columns_num_documents(const tf_columns *c) { return c ? c->n : 0; }
uint64_t tf_columns_dataset_fingerprint(const tf_columns *c) { return c ? c->fingerprint : 0; }
size_t tf_columns_count(const tf_columns *c) { return c ? c->ncols : 0; }

int tf_columns_get(const tf_columns *c, size_t i, const char **name, tf_column_type *type) {
    TF_NEED_ARG(c);
    if (i >= c->ncols) TF_FAIL(-ERANGE, "column %zu out of range (%u columns)", i, c->ncols);
    if (name) *name = c->cols[i].name;
    if (type) *type = c->cols[i].type;
    return 0;
}

static int find_col(const tf_columns *c, const char *name, size_t nlen, col **out) {
    for (uint32_t i = 0; i < c->ncols; i++)
        if (strlen(c->cols[i].name) == nlen && memcmp(c->cols[i].name, name, nlen) == 0) {
            *out = &c->cols[i];
            return 0;
        }
    char list[512];
    size_t at = 0;
    list[0] = 0;
    for (uint32_t i = 0; i < c->ncols && at + 2 < sizeof list; i++)
        at += (size_t)snprintf(list + at, sizeof list - at, "%s%s", i ? ", " : "", c->cols[i].name);
    TF_FAIL(-ENOENT, "%s: no column named \"%.*s\"; the file has: %s. Attach it (tokenfeed meta attach) or fix the name.",
            c->path, (int)(nlen > 200 ? 200 : nlen), name, c->ncols ? list : "(none)");
}

/* ------------------------------------------------------------------------ */
/* checks where used                                                         */
/* ------------------------------------------------------------------------ */

typedef struct check_call {
    const tf_columns *c;
    col *k;
} check_call;

static int offsets_ok(const uint8_t *offs, uint64_t count, uint64_t bytes, uint64_t *bad) {
    uint64_t prev = 0;
    for (uint64_t i = 0; i <= count; i++) {
        uint64_t o = tf__le64(offs + 8 * i);
        if ((i == 0 && o != 0) || o < prev || o > bytes || (i == count && o != bytes)) {
            *bad = i;
            return 0;
        }
        prev = o;
    }
    return 1;
}

static int check_col(void *p) {
    check_call *cc = p;
    const tf_columns *c = cc->c;
    col *k = cc->k;
    uint64_t h = tf_hash64(k->a, (size_t)k->a_len, 0);
    h = tf_hash64(k->b, (size_t)k->b_len, h);
    h = tf_hash64(k->c, (size_t)k->c_len, h);
    if (h != k->checksum)
        TF_FAIL(-TF_EFORMAT, "%s: column %s: checksum: expected %016llx, found %016llx. The column's bytes changed since they were written: write the columns again (tokenfeed meta attach).",
                c->path, k->name, (unsigned long long)k->checksum, (unsigned long long)h);
    uint64_t bad;
    if (k->type == TF_COLUMN_STRING && !offsets_ok(k->a, c->n, k->b_len, &bad))
        TF_FAIL(-TF_EFORMAT, "%s: column %s: string offset %llu is out of order or past the %llu bytes of the strings. The file is corrupt: write it again.",
                c->path, k->name, (unsigned long long)bad, (unsigned long long)k->b_len);
    if (k->type == TF_COLUMN_CATEGORY) {
        if (!offsets_ok(k->b, k->ncat, k->c_len, &bad))
            TF_FAIL(-TF_EFORMAT, "%s: column %s: category offset %llu is out of order or past the %llu bytes of the dictionary. The file is corrupt: write it again.",
                    c->path, k->name, (unsigned long long)bad, (unsigned long long)k->c_len);
        for (uint64_t i = 0; i < c->n; i++) {
            uint32_t code = tf__le32(k->a + 4 * i);
            if (code != COL_NULL_CODE && code >= k->ncat)
                TF_FAIL(-TF_EFORMAT, "%s: column %s: document %llu has category code %u, expected below %llu. The file is corrupt: write it again.",
                        c->path, k->name, (unsigned long long)i, code, (unsigned long long)k->ncat);
        }
    }
    return 0;
}

static int guarded(const tf_columns *c, int (*fn)(void *), void *arg) {
    if (!c->owns_map) return fn(arg);
    tf__sigbus_fault fault = {0, NULL};
    int rc = tf__sigbus_run(fn, arg, &fault);
    if (fault.hit)
        TF_FAIL(-EIO, "%s: the file was truncated while mapped (bus error at offset %lld). Write the columns again and reopen.",
                c->path, (long long)((const uint8_t *)fault.addr - (const uint8_t *)c->map));
    return rc;
}

static int need_col(const tf_columns *c, col *k) {
    if (atomic_load(&k->checked)) return 0;
    check_call cc = {c, k};
    TF_TRY(guarded(c, check_col, &cc));
    atomic_store(&k->checked, 1);
    return 0;
}

static inline int64_t get_i64(const col *k, uint64_t i) { return (int64_t)tf__le64(k->a + 8 * i); }
static inline double get_f64(const col *k, uint64_t i) {
    uint64_t u = tf__le64(k->a + 8 * i);
    double d;
    memcpy(&d, &u, 8);
    return d;
}
static inline void get_str(const uint8_t *offs, const uint8_t *bytes, uint64_t i, const uint8_t **s, uint64_t *n) {
    uint64_t a = tf__le64(offs + 8 * i), b = tf__le64(offs + 8 * i + 8);
    *s = bytes + a;
    *n = b - a;
}

/* ------------------------------------------------------------------------ */
/* the expression                                                            */
/* ------------------------------------------------------------------------ */

enum { N_AND, N_OR, N_NOT, N_CMP, N_IN };
enum { OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE };

typedef struct lit {
    int is_str, is_int;
    int64_t i;
    double f;
    char *s;
    size_t slen;
} lit;

typedef struct node {
    int kind, op, negate;
    struct node *l, *r;
    col *k;
    lit *lits;
    size_t nlits;
    uint8_t *cat_table; /* category: result per code */
    uint8_t *buf;       /* EVAL_CHUNK results */
} node;

typedef struct parser {
    const tf_columns *c;
    const char *src, *p;
    int depth;
} parser;

static void node_free(node *n) {
    if (!n) return;
    node_free(n->l);
    node_free(n->r);
    for (size_t i = 0; i < n->nlits; i++) free(n->lits[i].s);
    free(n->lits);
    free(n->cat_table);
    free(n->buf);
    free(n);
}

static int perr(const parser *ps, const char *what) {
    TF_FAIL(-EINVAL, "where: %s at offset %ld of \"%.200s\". The language is: NAME op literal (op one of == != < <= > >=), NAME [not] in (literal, ...), joined with and / or / not and parentheses; strings in quotes (docs/views.md).",
            what, (long)(ps->p - ps->src), ps->src);
}

static void skip_ws(parser *ps) {
    while (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r') ps->p++;
}

static int is_word(parser *ps, const char *w) {
    skip_ws(ps);
    size_t n = strlen(w);
    if (strncmp(ps->p, w, n) != 0) return 0;
    char ch = ps->p[n];
    if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_') return 0;
    ps->p += n;
    return 1;
}

static int parse_lit(parser *ps, lit *out) {
    skip_ws(ps);
    memset(out, 0, sizeof *out);
    char q = *ps->p;
    if (q == '\'' || q == '"') {
        const char *s = ++ps->p;
        size_t cap = 16, n = 0;
        char *buf = malloc(cap);
        if (!buf) return -ENOMEM;
        for (;;) {
            char ch = *ps->p;
            if (!ch) {
                free(buf);
                return perr(ps, "unterminated string");
            }
            ps->p++;
            if (ch == '\\' && (*ps->p == q || *ps->p == '\\')) ch = *ps->p++;
            else if (ch == q) break;
            if (n + 1 >= cap) {
                char *g = realloc(buf, cap * 2);
                if (!g) {
                    free(buf);
                    return -ENOMEM;
                }
                buf = g;
                cap *= 2;
            }
            buf[n++] = ch;
        }
        (void)s;
        buf[n] = 0;
        out->is_str = 1;
        out->s = buf;
        out->slen = n;
        return 0;
    }
    const char *start = ps->p;
    char *end = NULL;
    errno = 0;
    long long iv = strtoll(start, &end, 10);
    if (end != start && errno == 0 && *end != '.' && *end != 'e' && *end != 'E') {
        out->is_int = 1;
        out->i = iv;
        out->f = (double)iv;
        ps->p = end;
        return 0;
    }
    errno = 0;
    double dv = strtod(start, &end);
    if (end == start || isnan(dv)) return perr(ps, "expected a number or a quoted string");
    if (errno == ERANGE && isinf(dv)) return perr(ps, "number out of range");
    out->f = dv;
    ps->p = end;
    return 0;
}

static int check_lit(parser *ps, const col *k, const lit *l) {
    int want_str = k->type == TF_COLUMN_STRING || k->type == TF_COLUMN_CATEGORY;
    if (want_str != l->is_str)
        TF_FAIL(-EINVAL, "where: column %s is %s, compared with a %s at offset %ld of \"%.200s\": quote strings, leave numbers bare.",
                k->name, tf_column_type_name(k->type), l->is_str ? "string" : "number", (long)(ps->p - ps->src), ps->src);
    return 0;
}

static int parse_expr(parser *ps, node **out);

static int new_node(int kind, node **out) {
    *out = calloc(1, sizeof **out);
    return *out ? 0 : -ENOMEM;
}

static int parse_cmp(parser *ps, node **out) {
    skip_ws(ps);
    const char *s = ps->p;
    while ((*ps->p >= 'a' && *ps->p <= 'z') || (*ps->p >= 'A' && *ps->p <= 'Z') || *ps->p == '_' ||
           (ps->p > s && *ps->p >= '0' && *ps->p <= '9'))
        ps->p++;
    if (ps->p == s) return perr(ps, "expected a column name");
    col *k;
    TF_TRY(find_col(ps->c, s, (size_t)(ps->p - s), &k));
    node *n;
    TF_TRY(new_node(N_CMP, &n));
    n->k = k;
    int rc = 0;
    skip_ws(ps);
    int neg = 0;
    const char *save = ps->p;
    if (is_word(ps, "not")) {
        neg = 1;
        if (!is_word(ps, "in")) {
            ps->p = save;
            node_free(n);
            return perr(ps, "expected 'in' after 'not'");
        }
    }
    if (neg || is_word(ps, "in")) {
        n->kind = N_IN;
        n->negate = neg;
        skip_ws(ps);
        if (*ps->p != '(') {
            node_free(n);
            return perr(ps, "expected '(' after 'in'");
        }
        ps->p++;
        size_t cap = 0;
        for (;;) {
            skip_ws(ps);
            if (*ps->p == ')') {
                ps->p++;
                break;
            }
            lit *g = tf__grow(n->lits, &cap, n->nlits, sizeof *n->lits, 8);
            if (!g) {
                node_free(n);
                return -ENOMEM;
            }
            n->lits = g;
            rc = parse_lit(ps, &n->lits[n->nlits]);
            if (rc) {
                node_free(n);
                return rc;
            }
            n->nlits++;
            if ((rc = check_lit(ps, k, &n->lits[n->nlits - 1]))) {
                node_free(n);
                return rc;
            }
            skip_ws(ps);
            if (*ps->p == ',') ps->p++;
            else if (*ps->p != ')') {
                node_free(n);
                return perr(ps, "expected ',' or ')' in the in-list");
            }
        }
        *out = n;
        return 0;
    }
    n->kind = N_CMP;
    const char *p = ps->p;
    if (p[0] == '=' && p[1] == '=') n->op = OP_EQ, ps->p += 2;
    else if (p[0] == '!' && p[1] == '=') n->op = OP_NE, ps->p += 2;
    else if (p[0] == '<' && p[1] == '=') n->op = OP_LE, ps->p += 2;
    else if (p[0] == '>' && p[1] == '=') n->op = OP_GE, ps->p += 2;
    else if (p[0] == '<') n->op = OP_LT, ps->p += 1;
    else if (p[0] == '>') n->op = OP_GT, ps->p += 1;
    else {
        node_free(n);
        return perr(ps, "expected a comparison (== != < <= > >=) or 'in'");
    }
    n->lits = calloc(1, sizeof *n->lits);
    if (!n->lits) {
        node_free(n);
        return -ENOMEM;
    }
    n->nlits = 1;
    if ((rc = parse_lit(ps, n->lits)) || (rc = check_lit(ps, k, n->lits))) {
        node_free(n);
        return rc;
    }
    *out = n;
    return 0;
}

static int parse_unary(parser *ps, node **out) {
    if (++ps->depth > 64) return perr(ps, "nested more than 64 deep");
    int rc;
    skip_ws(ps);
    if (is_word(ps, "not")) {
        node *n;
        TF_TRY(new_node(N_NOT, &n));
        n->kind = N_NOT;
        if ((rc = parse_unary(ps, &n->l))) {
            node_free(n);
            return rc;
        }
        *out = n;
    } else if (*ps->p == '(') {
        ps->p++;
        TF_TRY(parse_expr(ps, out));
        skip_ws(ps);
        if (*ps->p != ')') {
            node_free(*out);
            *out = NULL;
            return perr(ps, "expected ')'");
        }
        ps->p++;
    } else {
        TF_TRY(parse_cmp(ps, out));
    }
    ps->depth--;
    return 0;
}

static int parse_bin(parser *ps, node **out, int kind) {
    node *l;
    TF_TRY(kind == N_OR ? parse_bin(ps, &l, N_AND) : parse_unary(ps, &l));
    for (;;) {
        if (!is_word(ps, kind == N_OR ? "or" : "and")) break;
        node *n, *r;
        int rc = kind == N_OR ? parse_bin(ps, &r, N_AND) : parse_unary(ps, &r);
        if (rc) {
            node_free(l);
            return rc;
        }
        if ((rc = new_node(kind, &n))) {
            node_free(l);
            node_free(r);
            return rc;
        }
        n->kind = kind;
        n->l = l;
        n->r = r;
        l = n;
    }
    *out = l;
    return 0;
}

static int parse_expr(parser *ps, node **out) { return parse_bin(ps, out, N_OR); }

static int str_cmp(const uint8_t *a, uint64_t an, const char *b, size_t bn) {
    size_t m = an < bn ? (size_t)an : bn;
    int r = m ? memcmp(a, b, m) : 0;
    if (r) return r;
    return (an > bn) - (an < bn);
}

static int op_holds(int op, int cmp) {
    switch (op) {
    case OP_EQ: return cmp == 0;
    case OP_NE: return cmp != 0;
    case OP_LT: return cmp < 0;
    case OP_LE: return cmp <= 0;
    case OP_GT: return cmp > 0;
    default: return cmp >= 0;
    }
}

static int lit_cmp(const void *x, const void *y) {
    const lit *a = x, *b = y;
    int r = str_cmp((const uint8_t *)a->s, a->slen, b->s, b->slen);
    return r;
}

/* Whether string s is in the sorted literals. */
static int in_sorted(const lit *lits, size_t n, const uint8_t *s, uint64_t sn) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int r = str_cmp(s, sn, lits[mid].s, lits[mid].slen);
        if (!r) return 1;
        if (r > 0) lo = mid + 1; else hi = mid;
    }
    return 0;
}

/* Per node: buffers, columns checked, string lists sorted, category tables. */
static int prepare(const tf_columns *c, node *n) {
    if (!n) return 0;
    n->buf = malloc(EVAL_CHUNK);
    if (!n->buf) return -ENOMEM;
    TF_TRY(prepare(c, n->l));
    TF_TRY(prepare(c, n->r));
    if (n->kind != N_CMP && n->kind != N_IN) return 0;
    TF_TRY(need_col(c, n->k));
    col *k = n->k;
    if (k->type == TF_COLUMN_STRING && n->kind == N_IN && n->nlits > 1)
        qsort(n->lits, n->nlits, sizeof *n->lits, lit_cmp);
    if (k->type == TF_COLUMN_CATEGORY) {
        n->cat_table = calloc(k->ncat ? k->ncat : 1, 1);
        if (!n->cat_table) return -ENOMEM;
        if (n->kind == N_IN && n->nlits > 1) qsort(n->lits, n->nlits, sizeof *n->lits, lit_cmp);
        for (uint64_t j = 0; j < k->ncat; j++) {
            const uint8_t *s;
            uint64_t sn;
            get_str(k->b, k->c, j, &s, &sn);
            n->cat_table[j] = n->kind == N_IN ? (uint8_t)in_sorted(n->lits, n->nlits, s, sn)
                                              : (uint8_t)op_holds(n->op, str_cmp(s, sn, n->lits->s, n->lits->slen));
        }
    }
    return 0;
}

static int num_cmp_holds(int op, const lit *l, const col *k, uint64_t i) {
    if (k->type == TF_COLUMN_INT64) {
        int64_t v = get_i64(k, i);
        if (v == INT64_MIN) return -1;
        if (l->is_int) return op_holds(op, (v > l->i) - (v < l->i));
        double d = (double)v;
        return op_holds(op, (d > l->f) - (d < l->f));
    }
    double d = get_f64(k, i);
    if (isnan(d)) return -1;
    return op_holds(op, (d > l->f) - (d < l->f));
}

static int is_null(const col *k, uint64_t d) {
    switch (k->type) {
    case TF_COLUMN_INT64: return get_i64(k, d) == INT64_MIN;
    case TF_COLUMN_FLOAT64: return isnan(get_f64(k, d));
    case TF_COLUMN_CATEGORY: return tf__le32(k->a + 4 * d) == COL_NULL_CODE;
    default: return 0;
    }
}

static void eval_node(const tf_columns *c, node *n, uint64_t base, uint32_t cnt) {
    (void)c;
    uint8_t *o = n->buf;
    switch (n->kind) {
    case N_AND:
        eval_node(c, n->l, base, cnt);
        eval_node(c, n->r, base, cnt);
        for (uint32_t i = 0; i < cnt; i++) o[i] = n->l->buf[i] & n->r->buf[i];
        return;
    case N_OR:
        eval_node(c, n->l, base, cnt);
        eval_node(c, n->r, base, cnt);
        for (uint32_t i = 0; i < cnt; i++) o[i] = n->l->buf[i] | n->r->buf[i];
        return;
    case N_NOT:
        eval_node(c, n->l, base, cnt);
        for (uint32_t i = 0; i < cnt; i++) o[i] = !n->l->buf[i];
        return;
    default: break;
    }
    const col *k = n->k;
    for (uint32_t i = 0; i < cnt; i++) {
        uint64_t d = base + i;
        int r = 0;
        if (k->type == TF_COLUMN_CATEGORY) {
            uint32_t code = tf__le32(k->a + 4 * d);
            r = code == COL_NULL_CODE ? 0 : n->cat_table[code];
        } else if (k->type == TF_COLUMN_STRING) {
            const uint8_t *s;
            uint64_t sn;
            get_str(k->a, k->b, d, &s, &sn);
            if (n->kind == N_IN) r = in_sorted(n->lits, n->nlits, s, sn);
            else r = op_holds(n->op, str_cmp(s, sn, n->lits->s, n->lits->slen));
        } else if (n->kind == N_IN) {
            for (size_t j = 0; j < n->nlits && r <= 0; j++) r = num_cmp_holds(OP_EQ, &n->lits[j], k, d);
            if (r < 0) r = 0;
        } else {
            r = num_cmp_holds(n->op, n->lits, k, d);
            if (r < 0) r = 0;
        }
        o[i] = (uint8_t)(n->kind == N_IN && n->negate ? (r ? 0 : !is_null(k, d)) : r);
    }
}

typedef struct eval_call {
    const tf_columns *c;
    node *root;
    uint8_t *mask;
} eval_call;

static int eval_all(void *p) {
    eval_call *e = p;
    for (uint64_t base = 0; base < e->c->n; base += EVAL_CHUNK) {
        uint32_t cnt = (uint32_t)(e->c->n - base < EVAL_CHUNK ? e->c->n - base : EVAL_CHUNK);
        eval_node(e->c, e->root, base, cnt);
        memcpy(e->mask + base, e->root->buf, cnt);
        if ((base / EVAL_CHUNK) % 1024 == 1023 && tf__interrupted()) return -EINTR;
    }
    return 0;
}

static int run_tree(const tf_columns *c, node *root, uint8_t *mask) {
    int rc = prepare(c, root);
    if (!rc) {
        eval_call e = {c, root, mask};
        rc = guarded(c, eval_all, &e);
    }
    node_free(root);
    return rc;
}

int tf_columns_eval(const tf_columns *c, const char *where, uint8_t *mask) {
    TF_NEED_ARG(c);
    TF_NEED_ARG(where);
    TF_NEED_BUF(mask, c->n);
    parser ps = {c, where, where, 0};
    node *root = NULL;
    TF_TRY(parse_expr(&ps, &root));
    skip_ws(&ps);
    if (*ps.p) {
        node_free(root);
        return perr(&ps, "unexpected text after the expression");
    }
    return run_tree(c, root, mask);
}

int tf_columns_match(const tf_columns *c, const char *column, const char *const *values, size_t n, uint8_t *mask) {
    TF_NEED_ARG(c);
    TF_NEED_ARG(column);
    TF_NEED_BUF(values, n);
    TF_NEED_BUF(mask, c->n);
    col *k;
    TF_TRY(find_col(c, column, strlen(column), &k));
    node *root;
    TF_TRY(new_node(N_IN, &root));
    root->kind = N_IN;
    root->k = k;
    root->lits = calloc(n ? n : 1, sizeof *root->lits);
    if (!root->lits) {
        node_free(root);
        return -ENOMEM;
    }
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        lit *l = &root->lits[i];
        root->nlits = i + 1;
        if (!values[i]) {
            rc = tf__seterr(-EINVAL, "tf_columns_match: value %zu is NULL", i);
        } else if (k->type == TF_COLUMN_STRING || k->type == TF_COLUMN_CATEGORY) {
            l->is_str = 1;
            l->slen = strlen(values[i]);
            l->s = strdup(values[i]);
            if (!l->s) rc = -ENOMEM;
        } else {
            parser ps = {c, values[i], values[i], 0};
            rc = parse_lit(&ps, l);
            skip_ws(&ps);
            if (!rc && (l->is_str || *ps.p))
                rc = tf__seterr(-EINVAL, "%s: column %s is %s: value \"%.100s\" is not a number", c->path, k->name,
                                tf_column_type_name(k->type), values[i]);
        }
    }
    if (rc) {
        node_free(root);
        return rc;
    }
    return run_tree(c, root, mask);
}

typedef struct value_call {
    const tf_columns *c;
    col *k;
    uint64_t doc;
    tf_column_value *v;
} value_call;

static int read_value(void *p) {
    value_call *vc = p;
    const col *k = vc->k;
    tf_column_value *v = vc->v;
    memset(v, 0, sizeof *v);
    v->type = k->type;
    v->is_null = is_null(k, vc->doc);
    switch (k->type) {
    case TF_COLUMN_INT64: v->i = get_i64(k, vc->doc); break;
    case TF_COLUMN_FLOAT64: v->f = get_f64(k, vc->doc); break;
    case TF_COLUMN_STRING: {
        const uint8_t *s;
        uint64_t n;
        get_str(k->a, k->b, vc->doc, &s, &n);
        v->s = (const char *)s;
        v->len = (size_t)n;
        break;
    }
    case TF_COLUMN_CATEGORY: {
        uint32_t code = tf__le32(k->a + 4 * vc->doc);
        if (code != COL_NULL_CODE) {
            const uint8_t *s;
            uint64_t n;
            get_str(k->b, k->c, code, &s, &n);
            v->s = (const char *)s;
            v->len = (size_t)n;
            v->i = code;
        }
        break;
    }
    }
    return 0;
}

int tf_columns_value(const tf_columns *c, const char *column, uint64_t doc, tf_column_value *v) {
    TF_NEED_ARG(c);
    TF_NEED_ARG(column);
    TF_NEED_ARG(v);
    col *k;
    TF_TRY(find_col(c, column, strlen(column), &k));
    if (doc >= c->n)
        TF_FAIL(-ERANGE, "%s: document %llu out of range: the columns describe %llu documents", c->path,
                (unsigned long long)doc, (unsigned long long)c->n);
    TF_TRY(need_col(c, k));
    value_call vc = {c, k, doc, v};
    return guarded(c, read_value, &vc);
}
