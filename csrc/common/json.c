/*
 * json.c — the small JSON reader and writer of the loader state (see
 * tokenfeed.h, "Loader state"). The state is a handful of numbers, names and
 * short lists, so the reader builds a flat array of nodes (preorder, children
 * linked by index) and the writer appends to a growing buffer. Integers keep
 * all 64 bits; a number with a fraction or exponent is a double.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define MAX_DEPTH 32

typedef struct parser {
    const char *p, *end;
    tf__json *j;
    int depth;
} parser;

static void skip_ws(parser *ps) {
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r')) ps->p++;
}

static int fail(parser *ps, const char *what) {
    TF_FAIL(-EINVAL, "the state is not valid JSON: %s at character %zu", what, (size_t)(ps->p - ps->j->text));
}

static long new_node(parser *ps, tf__jtype t) {
    tf__json *j = ps->j;
    tf__jnode *n = tf__grow(j->nodes, &j->cap, j->count, sizeof *n, 32);
    if (!n) return -ENOMEM;
    j->nodes = n;
    memset(&j->nodes[j->count], 0, sizeof j->nodes[0]);
    j->nodes[j->count].type = t;
    return (long)j->count++;
}

static int parse_string(parser *ps, const char **s, size_t *len) {
    ps->p++; /* the opening quote */
    *s = ps->p;
    while (ps->p < ps->end && *ps->p != '"') {
        if ((unsigned char)*ps->p < 0x20) return fail(ps, "a control character in a string");
        if (*ps->p == '\\') ps->p++;
        ps->p++;
    }
    if (ps->p >= ps->end) return fail(ps, "an unterminated string");
    *len = (size_t)(ps->p - *s);
    ps->p++;
    return 0;
}

static int parse_value(parser *ps, long *out);

static int parse_number(parser *ps, long idx) {
    tf__jnode *n = &ps->j->nodes[idx];
    const char *q = ps->p;
    int neg = q < ps->end && *q == '-';
    if (neg) q++;
    uint64_t u = 0;
    int digits = 0, overflow = 0;
    while (q < ps->end && *q >= '0' && *q <= '9') {
        if (tf__mul_overflow(u, 10, &u) || tf__add_overflow(u, (uint64_t)(*q - '0'), &u)) overflow = 1;
        q++;
        digits++;
    }
    if (!digits) return fail(ps, "an unexpected character");
    int frac = q < ps->end && (*q == '.' || *q == 'e' || *q == 'E');
    char buf[64];
    size_t take = 0;
    if (frac || overflow) {
        const char *e = q;
        while (e < ps->end && strchr("0123456789+-.eE", *e)) e++;
        take = (size_t)(e - ps->p);
        if (take >= sizeof buf) return fail(ps, "a number too long");
        memcpy(buf, ps->p, take);
        buf[take] = 0;
        n->type = TF__J_NUM;
        n->d = strtod(buf, NULL);
        ps->p = e;
        return 0;
    }
    n->type = TF__J_INT;
    n->neg = neg && u != 0;
    n->u = u;
    n->d = neg ? -(double)u : (double)u;
    ps->p = q;
    return 0;
}

static int parse_container(parser *ps, long idx, int obj) {
    char close = obj ? '}' : ']';
    ps->p++;
    skip_ws(ps);
    long prev = -1;
    if (ps->p < ps->end && *ps->p == close) {
        ps->p++;
        return 0;
    }
    for (;;) {
        const char *key = NULL;
        size_t klen = 0;
        skip_ws(ps);
        if (obj) {
            if (ps->p >= ps->end || *ps->p != '"') return fail(ps, "a member name expected");
            TF_TRY(parse_string(ps, &key, &klen));
            skip_ws(ps);
            if (ps->p >= ps->end || *ps->p != ':') return fail(ps, "':' expected");
            ps->p++;
        }
        long child;
        TF_TRY(parse_value(ps, &child));
        tf__jnode *c = &ps->j->nodes[child];
        c->key = key;
        c->klen = klen;
        if (prev < 0) ps->j->nodes[idx].first = (size_t)child;
        else ps->j->nodes[prev].next = (size_t)child;
        if (++ps->j->nodes[idx].n > TF_STATE_MAX_MEMBERS && obj)
            TF_FAIL(-EINVAL, "the state is not valid: an object with more than %u members (TF_STATE_MAX_MEMBERS) at "
                    "character %zu; pass the state Loader.state_dict() / tf_order_state_save wrote",
                    TF_STATE_MAX_MEMBERS, (size_t)(ps->p - ps->j->text));
        prev = child;
        skip_ws(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            continue;
        }
        if (ps->p < ps->end && *ps->p == close) {
            ps->p++;
            return 0;
        }
        return fail(ps, obj ? "',' or '}' expected" : "',' or ']' expected");
    }
}

static int parse_value(parser *ps, long *out) {
    skip_ws(ps);
    if (ps->p >= ps->end) return fail(ps, "a value expected");
    if (++ps->depth > MAX_DEPTH) return fail(ps, "nesting too deep");
    char c = *ps->p;
    long idx;
    int rc = 0;
    if (c == '{' || c == '[') {
        idx = new_node(ps, c == '{' ? TF__J_OBJ : TF__J_ARR);
        if (idx < 0) return (int)idx;
        rc = parse_container(ps, idx, c == '{');
    } else if (c == '"') {
        idx = new_node(ps, TF__J_STR);
        if (idx < 0) return (int)idx;
        const char *s;
        size_t len;
        rc = parse_string(ps, &s, &len);
        ps->j->nodes[idx].s = s;
        ps->j->nodes[idx].slen = len;
    } else if (!strncmp(ps->p, "null", 4) || !strncmp(ps->p, "true", 4) || !strncmp(ps->p, "false", 5)) {
        idx = new_node(ps, c == 'n' ? TF__J_NULL : TF__J_BOOL);
        if (idx < 0) return (int)idx;
        ps->j->nodes[idx].u = c == 't';
        ps->p += c == 'f' ? 5 : 4;
    } else if (!strncmp(ps->p, "NaN", 3) || !strncmp(ps->p, "Infinity", 8) || !strncmp(ps->p, "-Infinity", 9)) {
        return fail(ps, "NaN or Infinity (not a JSON number: a state holds finite numbers)");
    } else {
        idx = new_node(ps, TF__J_INT);
        if (idx < 0) return (int)idx;
        rc = parse_number(ps, idx);
    }
    ps->depth--;
    *out = idx;
    return rc;
}

typedef struct keyref {
    const char *key;
    size_t klen;
} keyref;

static int cmp_key(const void *a, const void *b) {
    const keyref *x = a, *y = b;
    int c = memcmp(x->key, y->key, x->klen < y->klen ? x->klen : y->klen);
    return c ? c : (x->klen > y->klen) - (x->klen < y->klen);
}

/* Every container's children listed in order (j->kids), and no key twice in
 * one object: O(nodes), plus a sort of each object's keys. */
static int index_children(tf__json *j) {
    j->kids = malloc((j->count ? j->count : 1) * sizeof *j->kids);
    if (!j->kids) return -ENOMEM;
    size_t at = 0, most = 0;
    for (size_t i = 0; i < j->count; i++) {
        tf__jnode *n = &j->nodes[i];
        if (n->type != TF__J_ARR && n->type != TF__J_OBJ) continue;
        n->kids = at;
        for (size_t k = 0, c = n->first; k < n->n; k++, c = j->nodes[c].next) j->kids[at++] = c;
        if (n->type == TF__J_OBJ && n->n > most) most = n->n;
    }
    if (most < 2) return 0;
    keyref *keys = malloc(most * sizeof *keys);
    if (!keys) return -ENOMEM;
    int rc = 0;
    for (size_t i = 0; !rc && i < j->count; i++) {
        const tf__jnode *n = &j->nodes[i];
        if (n->type != TF__J_OBJ || n->n < 2) continue;
        for (size_t k = 0; k < n->n; k++) {
            const tf__jnode *c = &j->nodes[j->kids[n->kids + k]];
            keys[k] = (keyref){c->key, c->klen};
        }
        qsort(keys, n->n, sizeof *keys, cmp_key);
        for (size_t k = 1; !rc && k < n->n; k++)
            if (!cmp_key(&keys[k - 1], &keys[k]))
                rc = tf__seterr(-EINVAL, "the state is not valid: the key \"%.*s\" appears twice in one object (at "
                                "character %zu); a state holds each key once: pass the state Loader.state_dict() / "
                                "tf_order_state_save wrote", (int)(keys[k].klen > 64 ? 64 : keys[k].klen), keys[k].key,
                                (size_t)(keys[k].key - j->text));
    }
    free(keys);
    return rc;
}

int tf__json_parse(const char *text, size_t len, tf__json *j) {
    memset(j, 0, sizeof *j);
    j->text = text;
    if (len > TF_STATE_MAX_BYTES)
        TF_FAIL(-EINVAL, "the state takes %zu bytes, more than the %u a state may hold (TF_STATE_MAX_BYTES); pass the "
                "state Loader.state_dict() / tf_order_state_save wrote", len, TF_STATE_MAX_BYTES);
    parser ps = {text, text + len, j, 0};
    long root;
    int rc = parse_value(&ps, &root);
    if (!rc) {
        skip_ws(&ps);
        if (ps.p != ps.end) rc = fail(&ps, "text after the value");
    }
    if (!rc) rc = index_children(j);
    if (rc) tf__json_free(j);
    return rc;
}

void tf__json_free(tf__json *j) {
    free(j->nodes);
    free(j->kids);
    j->nodes = NULL;
    j->kids = NULL;
    j->count = j->cap = 0;
}

const tf__jnode *tf__json_child(const tf__json *j, const tf__jnode *n, size_t i) {
    if (!n || (n->type != TF__J_ARR && n->type != TF__J_OBJ) || i >= n->n) return NULL;
    return &j->nodes[j->kids[n->kids + i]];
}

const tf__jnode *tf__json_get(const tf__json *j, const tf__jnode *obj, const char *key) {
    if (!obj || obj->type != TF__J_OBJ) return NULL;
    size_t kl = strlen(key);
    for (size_t i = 0; i < obj->n; i++) {
        const tf__jnode *c = &j->nodes[j->kids[obj->kids + i]];
        if (c->klen == kl && !memcmp(c->key, key, kl)) return c;
    }
    return NULL;
}

int tf__json_streq(const tf__jnode *n, const char *s) {
    return n && n->type == TF__J_STR && n->slen == strlen(s) && !memcmp(n->s, s, n->slen);
}

const char *tf__json_type_name(const tf__jnode *n) {
    if (!n) return "missing";
    switch (n->type) {
    case TF__J_NULL: return "null";
    case TF__J_BOOL: return "a boolean";
    case TF__J_INT: return "an integer";
    case TF__J_NUM: return "a fraction";
    case TF__J_STR: return "a string";
    case TF__J_ARR: return "a list";
    case TF__J_OBJ: return "an object";
    }
    return "?";
}

/* ------------------------------------------------------------------ writer */

int tf__jw_printf(tf__jw *w, const char *fmt, ...) {
    if (w->rc) return w->rc;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        size_t room = w->cap - w->len;
        int n = vsnprintf(w->buf ? w->buf + w->len : NULL, w->buf ? room : 0, fmt, ap);
        va_end(ap);
        if (n < 0) return w->rc = -EINVAL;
        if ((size_t)n < room) {
            w->len += (size_t)n;
            return 0;
        }
        size_t cap = w->cap ? w->cap : 256;
        while (cap - w->len <= (size_t)n) cap *= 2;
        char *b = realloc(w->buf, cap);
        if (!b) return w->rc = -ENOMEM;
        w->buf = b;
        w->cap = cap;
    }
}

int tf__jw_double(tf__jw *w, double d) {
    /* the shortest text that reads back as d, as Python's repr writes it */
    char buf[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, d);
        if (strtod(buf, NULL) == d) break;
    }
    if (!strpbrk(buf, ".eEn")) strcat(buf, ".0");
    return tf__jw_printf(w, "%s", buf);
}
