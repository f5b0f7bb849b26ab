/*
 * npy.c — NumPy .npy files holding a 1-D little-endian integer array.
 *
 * Format (numpy/lib/format.py): "\x93NUMPY", major, minor (1.0, 2.0, 3.0),
 * header length (u16 for 1.0, u32 for 2.0/3.0), then a Python dict literal
 *   {'descr': '<u2', 'fortran_order': False, 'shape': (N,), }
 * padded with spaces and a newline; data follows. tf__parse_npy_header is a
 * pure parser over bytes (fuzzed): a small tokenizer for exactly the literals
 * numpy writes (quoted strings, True/False, tuples of non-negative integers),
 * never reading past the header it was given.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdlib.h>
#include <string.h>

#include "source.h"

typedef unsigned long long ull;

#define NFIX "Save the array with numpy.save(path, arr.astype('<u2').ravel()) or similar."

typedef struct ncur {
    const uint8_t *p, *end;
} ncur;

static void skip_ws(ncur *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r')) c->p++;
}

static int eat(ncur *c, char ch) {
    skip_ws(c);
    if (c->p < c->end && *c->p == ch) {
        c->p++;
        return 1;
    }
    return 0;
}

/* A quoted string: contents in [*s, +*n). No escapes (numpy writes none). */
static int str_lit(ncur *c, const uint8_t **s, size_t *n) {
    skip_ws(c);
    if (c->p >= c->end || (*c->p != '\'' && *c->p != '"')) return 0;
    uint8_t q = *c->p++;
    const uint8_t *st = c->p;
    while (c->p < c->end && *c->p != q) {
        if (*c->p == '\\') return 0;
        c->p++;
    }
    if (c->p >= c->end) return 0;
    *s = st;
    *n = (size_t)(c->p - st);
    c->p++;
    return 1;
}

static int word(ncur *c, const char *w) {
    skip_ws(c);
    size_t n = strlen(w);
    if ((size_t)(c->end - c->p) >= n && memcmp(c->p, w, n) == 0) {
        c->p += n;
        return 1;
    }
    return 0;
}

static int uint_lit(ncur *c, uint64_t *v) {
    skip_ws(c);
    uint64_t x = 0;
    const uint8_t *st = c->p;
    while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
        if (tf__mul_overflow(x, 10, &x) || tf__add_overflow(x, (uint64_t)(*c->p - '0'), &x)) return 0;
        c->p++;
    }
    if (c->p < c->end && *c->p == 'L') c->p++; /* Python 2 longs in old files */
    *v = x;
    return c->p > st;
}

static tf_dtype npy_dtype(const uint8_t *s, size_t n, int *big_endian) {
    *big_endian = 0;
    if (n != 3) return TF_DTYPE_INVALID;
    char order = (char)s[0], kind = (char)s[1], size = (char)s[2];
    if (kind != 'u' && kind != 'i') return TF_DTYPE_INVALID;
    if (size == '1') {
        if (order != '|' && order != '<' && order != '>' && order != '=') return TF_DTYPE_INVALID;
        return kind == 'u' ? TF_UINT8 : TF_INT8;
    }
    if (order == '>') {
        *big_endian = 1;
        return TF_DTYPE_INVALID;
    }
    if (order != '<') return TF_DTYPE_INVALID;
    switch (size) {
    case '2': return kind == 'u' ? TF_UINT16 : TF_INT16;
    case '4': return kind == 'u' ? TF_UINT32 : TF_INT32;
    case '8': return kind == 'u' ? TF_UINT64 : TF_INT64;
    default: return TF_DTYPE_INVALID;
    }
}

/* The header of an array of up to two dimensions (1-D for the token files
 * tf__parse_npy_header reads; 2-D for the index arrays of Megatron's cache,
 * tf__parse_npy_header_2d). */
static int parse_header(const char *path, const uint8_t *buf, size_t len, tf_npy_header *h, int max_ndim) {
    memset(h, 0, sizeof *h);
    if (len == 0) TF_FAIL(-TF_EFORMAT, "%s: header: expected a .npy header, found an empty file. " NFIX, path);
    if (len < 10)
        TF_FAIL(-TF_EFORMAT, "%s: header: expected at least 10 bytes, found %zu. The file is truncated. " NFIX, path, len);
    if (memcmp(buf, "\x93NUMPY", 6) != 0)
        TF_FAIL(-TF_EFORMAT, "%s: magic: expected \"\\x93NUMPY\", found another value. This is not a .npy file.", path);
    uint8_t major = buf[6], minor = buf[7];
    uint64_t hl, start;
    if (major == 1 && minor == 0) {
        hl = (uint64_t)buf[8] | (uint64_t)buf[9] << 8;
        start = 10;
    } else if ((major == 2 || major == 3) && minor == 0) {
        if (len < 12) TF_FAIL(-TF_EFORMAT, "%s: header: expected at least 12 bytes, found %zu. The file is truncated. " NFIX, path, len);
        hl = tf__le32(buf + 8);
        start = 12;
    } else {
        TF_FAIL(-TF_EFORMAT, "%s: version: expected 1.0, 2.0 or 3.0, found %u.%u. " NFIX, path, major, minor);
    }
    if (hl > len - start)
        TF_FAIL(-TF_EFORMAT, "%s: header_len: expected at most %llu (the bytes after the preamble), found %llu. The file is truncated. " NFIX,
                path, (ull)(len - start), (ull)hl);
    ncur c = {buf + start, buf + start + hl};
    int have_descr = 0, have_fortran = 0, have_shape = 0, fortran = 0, ndim = 0, big = 0;
    const uint8_t *ds = NULL;
    size_t dn = 0;
    uint64_t dim0 = 0;
    if (!eat(&c, '{')) goto syntax;
    while (!eat(&c, '}')) {
        const uint8_t *k;
        size_t kn;
        if (!str_lit(&c, &k, &kn) || !eat(&c, ':')) goto syntax;
        if (kn == 5 && !memcmp(k, "descr", 5) && !have_descr) {
            if (!str_lit(&c, &ds, &dn)) {
                TF_FAIL(-TF_EFORMAT, "%s: descr: expected a simple dtype string such as '<u2', found a structured dtype. " NFIX, path);
            }
            have_descr = 1;
        } else if (kn == 13 && !memcmp(k, "fortran_order", 13) && !have_fortran) {
            if (word(&c, "True")) fortran = 1;
            else if (!word(&c, "False")) goto syntax;
            have_fortran = 1;
        } else if (kn == 5 && !memcmp(k, "shape", 5) && !have_shape) {
            if (!eat(&c, '(')) goto syntax;
            while (!eat(&c, ')')) {
                uint64_t d;
                if (!uint_lit(&c, &d)) goto syntax;
                if (ndim == 0) dim0 = d;
                if (ndim == 1) h->dim1 = d;
                if (ndim < 64) ndim++;
                if (!eat(&c, ',')) {
                    if (!eat(&c, ')')) goto syntax;
                    break;
                }
            }
            have_shape = 1;
        } else {
            TF_FAIL(-TF_EFORMAT, "%s: header: expected only the keys 'descr', 'fortran_order' and 'shape' (once each), found '%.*s'. " NFIX,
                    path, (int)(kn > 40 ? 40 : kn), (const char *)k);
        }
        if (!eat(&c, ',')) {
            if (!eat(&c, '}')) goto syntax;
            break;
        }
    }
    skip_ws(&c);
    if (c.p != c.end) goto syntax;
    if (!have_descr || !have_fortran || !have_shape)
        TF_FAIL(-TF_EFORMAT, "%s: header: expected the keys 'descr', 'fortran_order' and 'shape', found %s%s%s missing. " NFIX, path,
                have_descr ? "" : "'descr' ", have_fortran ? "" : "'fortran_order' ", have_shape ? "" : "'shape' ");
    h->dtype = npy_dtype(ds, dn, &big);
    if (h->dtype == TF_DTYPE_INVALID)
        TF_FAIL(-TF_EFORMAT, "%s: descr: expected a little-endian integer dtype (|u1 <u2 <u4 <u8 |i1 <i2 <i4 <i8), found '%.*s'. %s", path,
                (int)(dn > 40 ? 40 : dn), (const char *)ds,
                big ? "Convert it with arr.astype(arr.dtype.newbyteorder('<')) and save again." : NFIX);
    if (max_ndim == 1 && ndim != 1)
        TF_FAIL(-TF_EFORMAT, "%s: shape: expected a 1-D array, found %d dimensions. Save arr.ravel() (tokens in order) instead.", path, ndim);
    if (ndim < 1 || ndim > max_ndim)
        TF_FAIL(-TF_EFORMAT, "%s: shape: expected an array of 1 to %d dimensions, found %d.", path, max_ndim, ndim);
    /* fortran_order True is accepted for a 1-D array: it has the same layout
     * in either order (numpy itself writes False for 1-D arrays). */
    if (fortran && ndim > 1)
        TF_FAIL(-TF_EFORMAT, "%s: fortran_order: expected False (rows in order, as numpy.save writes a C-contiguous array), found True. Save numpy.ascontiguousarray(arr) instead.", path);
    h->ndim = ndim;
    h->num_items = dim0;
    h->data_offset = start + hl;
    return 0;
syntax:
    TF_FAIL(-TF_EFORMAT, "%s: header: expected a Python dict literal as numpy writes it, found malformed text at byte %llu. " NFIX, path,
            (ull)(c.p - buf));
}

int tf__parse_npy_header(const char *path, const uint8_t *buf, size_t len, tf_npy_header *h) {
    return parse_header(path, buf, len, h, 1);
}

int tf__parse_npy_header_2d(const char *path, const uint8_t *buf, size_t len, tf_npy_header *h) {
    return parse_header(path, buf, len, h, 2);
}

int tf__open_npy(const char *path, const tf_open_options *opt, tf_file *f) {
    (void)opt;
    f->path = strdup(path);
    if (!f->path) return -ENOMEM;
    TF_TRY(tf__map_file_main(path, f));
    tf_npy_header h;
    TF_TRY(tf__parse_npy_header(path, f->map, f->map_len, &h));
    size_t isz = tf_dtype_size(h.dtype);
    uint64_t bytes, want;
    if (tf__mul_overflow(h.num_items, isz, &bytes) || tf__add_overflow(bytes, h.data_offset, &want) || want != f->map_len)
        TF_FAIL(-TF_EFORMAT, "%s: file size: expected %llu bytes (data offset %llu + %llu items x %zu), found %llu. The file is truncated or the header is wrong. " NFIX,
                path, (ull)(h.data_offset + h.num_items * isz), (ull)h.data_offset, (ull)h.num_items, isz, (ull)f->map_len);
    if (h.data_offset % isz)
        TF_FAIL(-TF_EFORMAT, "%s: data offset: expected a multiple of the item size %zu, found %llu. Re-save the array with a current numpy. " NFIX,
                path, isz, (ull)h.data_offset);
    f->format = TF_FORMAT_NPY;
    f->dtype = h.dtype;
    f->num_tokens = h.num_items;
    f->num_docs = h.num_items > 0;
    f->doc_kind = TF_DOCS_SINGLE;
    f->tokens = (const uint8_t *)f->map + h.data_offset;
    f->fingerprint = tf__sampled_fingerprint(f->map, f->map_len, 0x6e7079);
    return 0;
}
