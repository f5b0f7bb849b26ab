/*
 * perm.c — tf_perm: a keyed bijection on [0, n) computed index by index, with
 * O(1) memory whatever n (1 <= n <= 2^64 - 1).
 *
 * Construction
 * ------------
 * Let k be the smallest integer >= 1 with 4^k >= n, so the domain D = [0, 4^k)
 * holds every index in 2k bits and n > 4^(k-1) = |D| / 4 (for n > 4).
 *
 *   Feistel network on D: x = (L, R), L = x >> k, R = x & (2^k - 1). Round r
 *   (r = 0 .. TF_PERM_ROUNDS-1) maps (L, R) -> (R, L ^ F(R, key_r)), with
 *   F(x, key) = mix64(x ^ key) & (2^k - 1) and mix64 the splitmix64 finalizer
 *   (a full-avalanche 64-bit bijection). Each round is invertible whatever F is,
 *   so the network is a bijection on D. Ten rounds of a strong mixer put it well
 *   past the Luby-Rackoff bound (>= 4 rounds) for statistical use; an LCG or an
 *   affine map would leave visible structure in the order and is never used.
 *
 *   Cycle-walking restricts it to [0, n): apply(i) iterates the network from i
 *   until the value falls below n. The network is a bijection on D, so the walk
 *   follows i's cycle and stops at the first element of [0, n) after i on it;
 *   that map is a bijection on [0, n) (each cycle of D is cut into arcs that
 *   start at one element < n and end at the next). Since n > |D| / 4 the walk
 *   takes fewer than 4 network evaluations on average.
 *
 *   inverse(j) walks the inverse network (rounds in reverse order) the same
 *   way, which retraces exactly the arc walked by apply.
 *
 * Round keys: key_0 = mix64(key ^ mix64(n ^ C)), key_{r+1} = mix64(key_r + G)
 * with G the 64-bit golden ratio, so every round sees an independent-looking
 * key and permutations of different sizes under one key are unrelated.
 *
 * The formulas above are part of the on-disk contract: a checkpoint stores only
 * a position, and resuming must regenerate the same order. Changing anything
 * here changes every shuffled stream; bump the order fingerprint version if so.
 */
#include "../common/internal.h"

/* tf__mix64 (internal.h) is inlined: apply runs it TF_PERM_ROUNDS times per
 * network evaluation, and the exported tf_mix64 may be reached through the PLT. */
#define mix tf__mix64

#define PERM_GOLDEN 0x9E3779B97F4A7C15ULL
#define PERM_NKEY 0x243F6A8885A308D3ULL /* pi: separates n from the key */

int tf_perm_init(tf_perm *p, uint64_t n, uint64_t key) {
    TF_NEED_ARG(p);
    if (n == 0) TF_FAIL(-EINVAL, "tf_perm_init: n must be >= 1 (a permutation of an empty set)");
    uint32_t k = 1;
    while (k < 32 && (1ULL << (2 * k)) < n) k++;
    p->n = n;
    p->half_bits = k;
    p->half_mask = k == 32 ? 0xFFFFFFFFULL : (1ULL << k) - 1;
    uint64_t rk = mix(key ^ mix(n ^ PERM_NKEY));
    for (int r = 0; r < TF_PERM_ROUNDS; r++) {
        p->keys[r] = rk;
        rk = mix(rk + PERM_GOLDEN);
    }
    return 0;
}

static inline uint64_t feistel_fwd(const tf_perm *p, uint64_t x) {
    const uint32_t k = p->half_bits;
    const uint64_t m = p->half_mask;
    uint64_t l = x >> k, r = x & m;
    for (int i = 0; i < TF_PERM_ROUNDS; i++) {
        uint64_t t = l ^ (mix(r ^ p->keys[i]) & m);
        l = r;
        r = t;
    }
    return (l << k) | r;
}

static inline uint64_t feistel_inv(const tf_perm *p, uint64_t x) {
    const uint32_t k = p->half_bits;
    const uint64_t m = p->half_mask;
    uint64_t l = x >> k, r = x & m;
    for (int i = TF_PERM_ROUNDS - 1; i >= 0; i--) {
        /* forward produced (l, r) = (R, L ^ F(R)): recover (L, R) */
        uint64_t t = r ^ (mix(l ^ p->keys[i]) & m);
        r = l;
        l = t;
    }
    return (l << k) | r;
}

/* i must be < p->n; out-of-range input is reduced mod n rather than looping on
 * values outside the domain (no abort in a library). */
/* apply (inverse 0) or inverse (1) by cycle-walking (see the top of this file). */
static inline uint64_t perm_walk(const tf_perm *p, uint64_t i, int inverse) {
    if (p->n <= 1) return 0;
    if (TF_UNLIKELY(i >= p->n)) i %= p->n;
    uint64_t x = i;
    do x = inverse ? feistel_inv(p, x) : feistel_fwd(p, x); while (x >= p->n);
    return x;
}

uint64_t tf_perm_apply(const tf_perm *p, uint64_t i) { return perm_walk(p, i, 0); }

uint64_t tf_perm_inverse(const tf_perm *p, uint64_t j) { return perm_walk(p, j, 1); }
