/* Fuzz target: the parser of OLMo's document metadata (olmo_meta.c), the
 * rows "start,end,..." of the CSV that dolma gzips beside a token file.
 * Byte 0: bits 0-2 pick the data file's token count, bits 3-6 where the text
 * is cut into the pieces it is fed in, bit 7 also writes the bytes as
 * x.csv.gz and reads them through zlib (when it loads) as the index build
 * does. The rest is the text. Checked: fed whole or in pieces, the parser
 * gives the same answer; on success the ends increase strictly, the last is
 * the token count, and there are no more of them than tokens. */
#include "fuzz_util.h"
#include "sources/olmo_meta.h"

static const uint64_t counts[8] = {0, 1, 7, 100, 4096, 1u << 20, 1ull << 40, UINT64_MAX / 2};

static int parse(const uint8_t *t, size_t n, size_t step, uint64_t nt, uint64_t **ends, uint64_t *ne) {
    tf__olmo_csv c;
    tf__olmo_csv_init(&c, "fuzz.csv.gz", nt);
    int rc = 0;
    for (size_t i = 0; !rc && i < n; i += step) rc = tf__olmo_csv_feed(&c, t + i, n - i < step ? n - i : step);
    if (!rc) rc = tf__olmo_csv_finish(&c, ends, ne);
    tf__olmo_csv_free(&c);
    return rc;
}

static void check(int rc, const uint64_t *e, uint64_t n, uint64_t nt) {
    if (rc > 0) abort();
    if (rc < 0) return;
    if (n > nt || (n == 0) != (nt == 0) || (n && e[n - 1] != nt)) abort();
    for (uint64_t i = 1; i < n; i++)
        if (e[i] <= e[i - 1]) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (1u << 20) || size < 1) return 0;
    uint8_t ctl = data[0];
    const uint8_t *t = data + 1;
    size_t n = size - 1;
    uint64_t nt = counts[ctl & 7];
    uint64_t *a = NULL, *b = NULL, na = 0, nb = 0;
    int ra = parse(t, n, n ? n : 1, nt, &a, &na);
    int rb = parse(t, n, 1 + ((ctl >> 3) & 15), nt, &b, &nb);
    check(ra, a, na, nt);
    if (ra != rb || na != nb || (na && memcmp(a, b, na * 8) != 0)) abort();
    free(a);
    free(b);
    if (ctl & 0x80) {
        const char *p = fuzz_path(0, "x.csv.gz");
        fuzz_write(p, t, n);
        struct stat st;
        uint64_t *e = NULL, ne = 0;
        int rc = tf__olmo_meta_read(p, nt, &e, &ne, &st);
        if (rc == 1) abort(); /* (it is there) */
        check(rc, e, ne, nt);
        free(e);
        fuzz_clean();
    }
    return 0;
}
