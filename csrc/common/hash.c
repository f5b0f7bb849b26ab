/* hash.c — XXH64 (one-shot and streaming), the checksum of the native format
 * and the basis of dataset and configuration fingerprints. Bit-exact with the
 * reference implementation (tests compare against the xxhash package). */
#include <string.h>

#include "internal.h"

#define P1 0x9E3779B185EBCA87ULL
#define P2 0xC2B2AE3D27D4EB4FULL
#define P3 0x165667B19E3779F9ULL
#define P4 0x85EBCA77C2B2AE63ULL
#define P5 0x27D4EB2F165667C5ULL

static inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
static inline uint64_t xround(uint64_t acc, uint64_t in) {
    acc += in * P2;
    acc = rotl64(acc, 31);
    return acc * P1;
}
static inline uint64_t xmerge(uint64_t acc, uint64_t v) {
    acc ^= xround(0, v);
    return acc * P1 + P4;
}

void tf__xxh64_reset(tf__xxh64_state *s, uint64_t seed) {
    memset(s, 0, sizeof *s);
    s->seed = seed;
    s->v[0] = seed + P1 + P2;
    s->v[1] = seed + P2;
    s->v[2] = seed;
    s->v[3] = seed - P1;
}

void tf__xxh64_update(tf__xxh64_state *s, const void *data, size_t len) {
    const uint8_t *p = (const uint8_t *)data;
    const uint8_t *end = p + len;
    s->total_len += len;
    if (s->memsize + len < 32) {
        if (len) memcpy(s->mem + s->memsize, p, len);
        s->memsize += (uint32_t)len;
        return;
    }
    if (s->memsize) {
        memcpy(s->mem + s->memsize, p, 32 - s->memsize);
        p += 32 - s->memsize;
        for (int i = 0; i < 4; i++) s->v[i] = xround(s->v[i], tf__le64(s->mem + 8 * i));
        s->memsize = 0;
    }
    uint64_t v0 = s->v[0], v1 = s->v[1], v2 = s->v[2], v3 = s->v[3];
    while (p + 32 <= end) {
        v0 = xround(v0, tf__le64(p));
        v1 = xround(v1, tf__le64(p + 8));
        v2 = xround(v2, tf__le64(p + 16));
        v3 = xround(v3, tf__le64(p + 24));
        p += 32;
    }
    s->v[0] = v0; s->v[1] = v1; s->v[2] = v2; s->v[3] = v3;
    if (p < end) {
        memcpy(s->mem, p, (size_t)(end - p));
        s->memsize = (uint32_t)(end - p);
    }
}

uint64_t tf__xxh64_digest(const tf__xxh64_state *s) {
    uint64_t h;
    if (s->total_len >= 32) {
        h = rotl64(s->v[0], 1) + rotl64(s->v[1], 7) + rotl64(s->v[2], 12) + rotl64(s->v[3], 18);
        for (int i = 0; i < 4; i++) h = xmerge(h, s->v[i]);
    } else {
        h = s->seed + P5;
    }
    h += s->total_len;
    const uint8_t *p = s->mem, *end = s->mem + s->memsize;
    while (p + 8 <= end) {
        h ^= xround(0, tf__le64(p));
        h = rotl64(h, 27) * P1 + P4;
        p += 8;
    }
    if (p + 4 <= end) {
        h ^= (uint64_t)tf__le32(p) * P1;
        h = rotl64(h, 23) * P2 + P3;
        p += 4;
    }
    while (p < end) {
        h ^= (uint64_t)(*p) * P5;
        h = rotl64(h, 11) * P1;
        p++;
    }
    h ^= h >> 33;
    h *= P2;
    h ^= h >> 29;
    h *= P3;
    h ^= h >> 32;
    return h;
}

uint64_t tf_hash64(const void *data, size_t len, uint64_t seed) {
    tf__xxh64_state s;
    tf__xxh64_reset(&s, seed);
    tf__xxh64_update(&s, data, len);
    return tf__xxh64_digest(&s);
}

uint64_t tf_mix64(uint64_t x) { return tf__mix64(x); }
