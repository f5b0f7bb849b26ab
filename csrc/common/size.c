/*
 * size.c — sizes written for people ("200GB", "1.5TiB", "500M", "4096"): the
 * one parser of every size setting, in C for the environment variables the
 * library reads and, through tf_parse_size, for the Python package's options
 * (cache_limit, chunk_size, tokenfeed cache prune --keep).
 */
#include <ctype.h>
#include <errno.h>
#include <string.h>
#include <strings.h>

#include "internal.h"

typedef unsigned __int128 u128;

static const struct {
    const char *name;
    uint64_t mult;
} UNITS[] = {
    {"", 1},
    {"B", 1},
    {"K", 1000ull},
    {"KB", 1000ull},
    {"M", 1000000ull},
    {"MB", 1000000ull},
    {"G", 1000000000ull},
    {"GB", 1000000000ull},
    {"T", 1000000000000ull},
    {"TB", 1000000000000ull},
    {"P", 1000000000000000ull},
    {"PB", 1000000000000000ull},
    {"KIB", 1ull << 10},
    {"MIB", 1ull << 20},
    {"GIB", 1ull << 30},
    {"TIB", 1ull << 40},
    {"PIB", 1ull << 50},
};

int tf_parse_size(const char *text, const char *what, uint64_t *bytes) {
    if (!what || !*what) what = "size";
    if (!bytes) return -EINVAL;
    *bytes = 0;
    if (!text)
        TF_FAIL(-EINVAL, "%s: expected a size such as 200GB, 1.5TiB, 500M or a number of bytes, found none", what);
    const char *s = text;
    while (isspace((unsigned char)*s)) s++;
    /* the number: digits, with an optional fraction ("1.5", "2.", ".5") */
    u128 whole = 0, frac = 0, scale = 1;
    int digits = 0, bad = 0;
    for (; isdigit((unsigned char)*s); s++, digits++) {
        whole = whole * 10 + (u128)(*s - '0');
        if (whole > UINT64_MAX) bad = 1; /* (stays bounded: bad once past it) */
        if (bad) whole = (u128)UINT64_MAX + 1;
    }
    if (*s == '.') {
        s++;
        for (; isdigit((unsigned char)*s); s++, digits++)
            if (scale < 1000000000000000000ull) { /* 18 digits: finer than any unit's byte */
                frac = frac * 10 + (u128)(*s - '0');
                scale *= 10;
            }
    }
    while (isspace((unsigned char)*s)) s++;
    const char *u = s;
    while (isalpha((unsigned char)*s)) s++;
    size_t ulen = (size_t)(s - u);
    while (isspace((unsigned char)*s)) s++;
    uint64_t mult = 0;
    for (size_t i = 0; i < sizeof UNITS / sizeof UNITS[0] && ulen < 4; i++)
        if (strlen(UNITS[i].name) == ulen && strncasecmp(UNITS[i].name, u, ulen) == 0) mult = UNITS[i].mult;
    if (!digits || *s || !mult)
        TF_FAIL(-EINVAL, "%s: cannot read '%s' as a size; expected e.g. 200GB, 1.5TiB, 500M or a number of bytes (K, M, G, T, P with or without B are powers of 1000; KiB, MiB, GiB, TiB, PiB powers of 1024; a fraction such as 1.5G is allowed)",
                what, text);
    u128 v = bad ? (u128)UINT64_MAX + 1 : whole * mult + frac * mult / scale; /* whole < 2^64, mult < 2^51 */
    if (v > UINT64_MAX)
        TF_FAIL(-ERANGE, "%s: '%s' is more bytes than 64 bits hold; expected a size such as 200GB or 1.5TiB", what,
                text);
    *bytes = (uint64_t)v;
    return 0;
}
