/* test_schedule.c — mixture weight schedules (csrc/order/schedule.c): every
 * position's (source, j) is the source's running count, windows hold their
 * exact counts, linear segments follow the documented move rule, lookups
 * jump to any position (even 10^18) without walking, and a hand-over anchor
 * keeps each source's count. */
#include <stdint.h>

#include "helpers.h"
#include "order/schedule.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ULL;
static uint64_t rnd(void) { return t_xorshift(&rng_state); }

/* Round-robin table, as documented (independent of schedule.c's). */
static void swrr(const uint64_t *c, size_t K, uint64_t W, uint32_t *out) {
    int64_t credit[16] = {0};
    for (uint64_t t = 0; t < W; t++) {
        size_t best = 0;
        for (size_t s = 0; s < K; s++) credit[s] += (int64_t)c[s];
        for (size_t s = 1; s < K; s++)
            if (credit[s] > credit[best]) best = s;
        credit[best] -= (int64_t)W;
        out[t] = (uint32_t)best;
    }
}

/* Walk positions [from, to) of a schedule of two sources: each position
 * names a source and the next of that source's samples, counted in seen. */
static void walk2(const tf__sched *s, uint64_t from, uint64_t to, uint64_t seen[2]) {
    for (uint64_t p = from; p < to; p++) {
        uint64_t j;
        uint32_t src = tf__sched_at(s, p, &j);
        CHECK(src < 2 && j == seen[src]);
        if (src < 2) seen[src]++;
    }
}

static void test_plain_weights(void) {
    /* 0.7 / 0.3 over a window of 1000: 7 and 3 per 10, as the plain mixture always did */
    double w[2] = {0.7, 0.3};
    uint64_t steps[1] = {0};
    tf__sched_spec sp = {.K = 2, .M = 1000, .G = 4, .npoints = 1, .steps = steps, .weights = w};
    tf__sched *s = NULL;
    CHECK_OK(tf__sched_create(&sp, &s));
    if (!s) return;
    uint64_t c[2];
    CHECK(tf__sched_counts_at(s, 12345, c) == 10 && c[0] == 7 && c[1] == 3);
    CHECK(tf__sched_num_runs(s) == 1);
    uint64_t seen[2] = {0, 0};
    for (uint64_t p = 0; p < 1000; p += 10) {
        walk2(s, p, p + 10, seen);
        CHECK(seen[1] == (p + 10) / 10 * 3);
    }
    /* far away: count(pos) is exact arithmetic */
    uint64_t far = 1000000000000000000ULL;
    CHECK(tf__sched_count(s, 0, far) == far / 10 * 7 && tf__sched_count(s, 1, far) == far / 10 * 3);
    tf__sched_free(s);
}

static void test_errors(void) {
    tf__sched *s = NULL;
    uint64_t st[2] = {1, 5}, st2[2] = {0, 0}, st3[2] = {0, UINT64_MAX / 2}, ok[2] = {0, 10};
    double w[4] = {1, 1, 1, 1}, neg[4] = {1, -1, 1, 1}, zero[4] = {0, 0, 1, 1}, tiny[4] = {1, 1e-9, 1, 1};
    /* two points of two sources, zero weights allowed: each refused, saying why */
    const struct {
        const uint64_t *steps;
        const double *weights;
        const char *why;
    } bad[] = {
        {st, w, "first point must be at step 0"},
        {st2, w, "steps must increase"},
        {st3, w, "overflows"},
        {ok, neg, "weights[1] (schedule point 0): expected a finite weight >= 0, found -1"},
        {ok, zero, "at least one weight must be > 0"},
        {ok, tiny, "rounds to 0"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        tf__sched_spec sp = {.K = 2, .M = 100, .G = 8, .npoints = 2, .steps = bad[i].steps, .weights = bad[i].weights,
                             .allow_zero = 1};
        CHECK_RC(tf__sched_create(&sp, &s), -EINVAL);
        CHECK(strstr(tf_last_error(), bad[i].why) != NULL);
    }
    double z1[2] = {0, 1};
    tf__sched_spec plain = {.K = 2, .M = 100, .G = 8, .npoints = 1, .steps = ok, .weights = z1};
    CHECK_RC(tf__sched_create(&plain, &s), -EINVAL); /* plain weights stay > 0 */
    CHECK(s == NULL);
}

/* Largest-remainder counts of one point, as documented (ties: lower source). */
static void lr(const double *w, size_t K, uint64_t M, uint64_t *c) {
    double sum = 0, frac[16];
    for (size_t k = 0; k < K; k++) sum += w[k];
    uint64_t used = 0;
    for (size_t k = 0; k < K; k++) {
        double q = (double)M * (w[k] / sum);
        c[k] = (uint64_t)q;
        frac[k] = w[k] > 0 ? q - (double)c[k] : -2;
        used += c[k];
    }
    for (; used < M; used++) {
        size_t b = 0;
        for (size_t k = 1; k < K; k++)
            if (frac[k] > frac[b]) b = k;
        c[b]++;
        frac[b] = -1;
    }
}

static int checked;

/* Brute-force check of one schedule over positions [0, npos): (source, j)
 * equals the running count, count() agrees, and every window holds the
 * counts the documented rules give. */
static void check_schedule(size_t K, uint64_t M, uint64_t G, size_t np, const uint64_t *steps, const double *w,
                           int linear, uint64_t npos) {
    tf__sched_spec sp = {.K = K, .M = M, .G = G, .npoints = np, .steps = steps, .weights = w, .linear = linear,
                         .allow_zero = 1};
    tf__sched *s = NULL;
    int rc = tf__sched_create(&sp, &s);
    if (rc == -EINVAL && strstr(tf_last_error(), "rounds to 0")) return; /* a valid refusal for these weights */
    CHECK_OK(rc);
    if (!s) return;
    checked++;
    uint64_t seen[16] = {0};
    uint64_t pc[8][16];
    for (size_t m = 0; m < np; m++) lr(w + m * K, K, M, pc[m]);
    uint32_t tab[4096];
    for (uint64_t p = 0; p < npos; p++) {
        if (p % 997 == 0)
            for (size_t k = 0; k < K; k++) CHECK(tf__sched_count(s, k, p) == seen[k]);
        uint64_t j = UINT64_MAX;
        uint32_t src = tf__sched_at(s, p, &j);
        CHECK(src < K);
        if (src >= K) break;
        if (j != seen[src]) {
            fprintf(stderr, "position %llu: source %u j %llu, expected %llu\n", (unsigned long long)p, src,
                    (unsigned long long)j, (unsigned long long)seen[src]);
            t_failures++;
            break;
        }
        seen[src]++;
        /* the documented rule, window by window */
        size_t m = 0;
        while (m + 1 < np && steps[m + 1] * G <= p) m++;
        uint64_t P = steps[m] * G, u = p - P, c[16];
        if (linear && m + 1 < np) {
            uint64_t len = steps[m + 1] * G - P, k = u / M, d[16], T = 0;
            uint32_t inc[4096], dec[4096];
            for (size_t q = 0; q < K; q++) {
                d[q] = pc[m + 1][q] > pc[m][q] ? pc[m + 1][q] - pc[m][q] : 0;
                T += d[q];
            }
            swrr(d, K, T, inc);
            for (size_t q = 0; q < K; q++) d[q] = pc[m][q] > pc[m + 1][q] ? pc[m][q] - pc[m + 1][q] : 0;
            swrr(d, K, T, dec);
            uint64_t tau = T ? (T * (2 * k + 1) * M + len) / (2 * len) : 0;
            if (tau > T) tau = T;
            memcpy(c, pc[m], K * sizeof *c);
            for (uint64_t i = 0; i < tau; i++) {
                c[dec[i]]--;
                c[inc[i]]++;
            }
            u %= M;
        } else {
            memcpy(c, pc[m], K * sizeof *c);
        }
        uint64_t g = 0;
        for (size_t q = 0; q < K; q++) {
            uint64_t a = g, b = c[q];
            while (b) {
                uint64_t t = a % b;
                a = b;
                b = t;
            }
            g = a;
        }
        uint64_t W = M / g, cr[16];
        for (size_t q = 0; q < K; q++) cr[q] = c[q] / g;
        swrr(cr, K, W, tab);
        if (tab[u % W] != src) {
            fprintf(stderr, "position %llu: source %u, the rules give %u (K %zu M %llu W %llu u %llu c %llu %llu %llu)\n", (unsigned long long)p, src,
                    tab[u % W], K, (unsigned long long)M, (unsigned long long)W, (unsigned long long)u, (unsigned long long)c[0], (unsigned long long)c[1], (unsigned long long)c[2]);
            t_failures++;
            break;
        }
    }
    tf__sched_free(s);
}

static void test_random_schedules(void) {
    for (int trial = 0; trial < 60; trial++) {
        size_t K = 2 + rnd() % 4, np = 1 + rnd() % 4;
        uint64_t M = (uint64_t[]){10, 12, 50, 100, 360}[rnd() % 5], G = 1 + rnd() % 16;
        uint64_t steps[8];
        double w[8 * 16];
        steps[0] = 0;
        for (size_t m = 1; m < np; m++) steps[m] = steps[m - 1] + 1 + rnd() % 40;
        for (size_t m = 0; m < np; m++) {
            double sum = 0;
            for (size_t k = 0; k < K; k++) {
                w[m * K + k] = rnd() % 4 == 0 ? 0.0 : (double)(1 + rnd() % 1000) / 1000.0;
                sum += w[m * K + k];
            }
            if (sum == 0) w[m * K] = 1;
        }
        int linear = (int)(rnd() % 2);
        uint64_t npos = steps[np - 1] * G + 3 * M + rnd() % 500;
        check_schedule(K, M, G, np, steps, w, linear, npos);
    }
    CHECK(checked >= 40); /* most random schedules are valid */
}

static void test_linear_is_monotone_and_near_the_line(void) {
    /* web 0.9 -> 0.5, code 0.1 -> 0.3, math 0 -> 0.2 over 2000 steps of 16 */
    double w[6] = {0.9, 0.1, 0.0, 0.5, 0.3, 0.2};
    uint64_t steps[2] = {0, 2000};
    tf__sched_spec sp = {.K = 3, .M = 1000, .G = 16, .npoints = 2, .steps = steps, .weights = w, .linear = 1,
                         .allow_zero = 1};
    tf__sched *s = NULL;
    CHECK_OK(tf__sched_create(&sp, &s));
    if (!s) return;
    CHECK(tf__sched_num_runs(s) <= 400 + 2); /* T = 400 moves: at most T + 1 runs, plus the last phase */
    uint64_t prev[3] = {900, 100, 0}, len = 2000 * 16;
    for (uint64_t k = 0; k < len / 1000; k++) {
        uint64_t c[3], W = tf__sched_counts_at(s, k * 1000, c);
        double alpha = (k * 1000.0 + 500.0) / (double)len, target[3] = {900 - 400 * alpha, 100 + 200 * alpha,
                                                                          200 * alpha};
        for (int q = 0; q < 3; q++) {
            uint64_t full = c[q] * (1000 / W);
            CHECK(q == 0 ? full <= prev[q] : full >= prev[q]); /* each source moves one way */
            CHECK(full + 1.5 >= target[q] && full <= target[q] + 1.5);
            prev[q] = full;
        }
    }
    uint64_t c[3];
    CHECK(tf__sched_counts_at(s, len, c) * 0 == 0 && c[0] * 10 == 5 * (c[0] + c[1] + c[2]));
    /* a lookup anywhere is O(log runs): far positions work without walking */
    uint64_t j;
    CHECK(tf__sched_at(s, 999999999999999ULL, &j) < 3);
    tf__sched_free(s);
}

static void test_anchor(void) {
    /* saved under 0.5/0.5 at position 1000, continued under 0.8/0.2 */
    double w[2] = {0.8, 0.2};
    uint64_t steps[1] = {0}, had[2] = {500, 500};
    tf__sched_spec sp = {.K = 2, .M = 10, .G = 1, .npoints = 1, .steps = steps, .weights = w, .anchor_pos = 1000,
                         .anchor_counts = had};
    tf__sched *s = NULL;
    CHECK_OK(tf__sched_create(&sp, &s));
    if (!s) return;
    uint64_t seen[2] = {500, 500};
    walk2(s, 1000, 1200, seen);
    CHECK(seen[0] == 500 + 160 && seen[1] == 500 + 40);
    tf__sched_free(s);
}

int main(void) {
    test_plain_weights();
    test_errors();
    test_random_schedules();
    test_linear_is_monotone_and_near_the_line();
    test_anchor();
    return T_DONE();
}
