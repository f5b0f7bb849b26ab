/* Fuzz target: the metadata column file (tf_columns_from_memory: header,
 * directory, sections) and what reads it: the checks of a column where it is
 * used (checksum, string offsets, category codes), the filter language and
 * value reads. The input is one column file, whose header checksum and
 * column checksums are recomputed first (so that mutations reach the
 * structural checks behind them), then up to 1 KiB of filter text after a
 * 0xFF 0xFE separator, if any. */
#include "fuzz_util.h"

static uint64_t le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}
static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t le32(const uint8_t *p) { return (uint32_t)(p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24); }

static int in_range(uint64_t off, uint64_t len, size_t size) { return off <= size && len <= size - off; }

/* Recompute every column's checksum over sections that lie inside the file,
 * then the header checksum over the header and the directory. */
static void fix_checksums(uint8_t *b, size_t size) {
    if (size < 64) return;
    uint32_t ncols = le32(b + 12);
    uint64_t dir = le64(b + 32);
    if (ncols > 4096 || !in_range(dir, (uint64_t)ncols * 80, size)) return;
    for (uint32_t i = 0; i < ncols; i++) {
        uint8_t *e = b + dir + (uint64_t)i * 80;
        uint64_t h = 0;
        int ok = 1;
        for (int s = 0; s < 3 && ok; s++) {
            uint64_t off = le64(e + 24 + 16 * s), len = le64(e + 32 + 16 * s);
            if (!in_range(off, len, size)) ok = 0;
            else h = tf_hash64(b + off, (size_t)len, h);
        }
        if (ok) put64(e + 72, h);
    }
    uint64_t h = tf_hash64(b, 56, 0);
    h = tf_hash64(b + dir, (size_t)ncols * 80, h);
    put64(b + 56, h);
}

static const char *const FILTERS[] = {
    "a == 1", "a != 'x' or b < 2.5", "not (a in (1, 2, 'z'))", "a >= 'm' and not a < 'c'", "a not in ('', 'en')",
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (1u << 20)) return 0;
    size_t fsize = size, tsize = 0;
    for (size_t i = 0; i + 1 < size; i++)
        if (data[i] == 0xFF && data[i + 1] == 0xFE) {
            fsize = i;
            tsize = size - i - 2 > 1024 ? 1024 : size - i - 2;
            break;
        }
    uint8_t *buf = malloc(fsize ? fsize : 1);
    char *text = malloc(tsize + 1);
    if (!buf || !text) {
        free(buf);
        free(text);
        return 0;
    }
    if (fsize) memcpy(buf, data, fsize);
    memcpy(text, data + fsize + (tsize ? 2 : 0), tsize);
    text[tsize] = 0;
    fix_checksums(buf, fsize);
    tf_columns *c = NULL;
    if (tf_columns_from_memory(buf, fsize, &c) == 0) {
        uint64_t n = tf_columns_num_documents(c);
        uint8_t *mask = n <= (1u << 20) ? malloc(n ? n : 1) : NULL;
        if (mask) {
            for (size_t f = 0; f < sizeof FILTERS / sizeof *FILTERS + (tsize ? 1 : 0); f++) {
                const char *w = f < sizeof FILTERS / sizeof *FILTERS ? FILTERS[f] : text;
                if (tf_columns_eval(c, w, mask) == 0)
                    for (uint64_t d = 0; d < n; d++)
                        if (mask[d] > 1) abort();
            }
        }
        for (size_t i = 0; i < tf_columns_count(c); i++) {
            const char *name;
            tf_column_type t;
            if (tf_columns_get(c, i, &name, &t)) abort();
            tf_column_value v;
            for (uint64_t d = 0; d < n && d < 4; d++)
                if (tf_columns_value(c, name, d, &v) == 0 && v.s && v.len > fsize) abort();
            const char *vals[2] = {"en", "1"};
            if (mask) tf_columns_match(c, name, vals, 2, mask);
        }
        free(mask);
        tf_columns_free(c);
    } else if (c) {
        abort(); /* on error nothing is returned */
    }
    free(buf);
    free(text);
    return 0;
}
