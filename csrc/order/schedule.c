/*
 * schedule.c — mixture schedules: the source, and the sample of that source's
 * own stream, of every position of a mixture.
 *
 * Counts
 * ------
 * The weights of a point become integer counts per window of M = mix_window
 * positions: c_s = floor(M * w_s / sum w), the M - sum c_s left go one each to
 * the largest fractional parts (ties: lower s; a zero weight never gets one).
 * A positive weight that rounds to 0 is an error (raise mix_window).
 *
 * Runs
 * ----
 * The stream is cut into runs: maximal stretches of positions [start, next
 * start) whose windows all hold the same counts. A run's counts are divided by
 * their gcd, giving W positions per (reduced) window and c_s per window; a
 * table of W entries interleaves them by smooth weighted round-robin (at each
 * offset every source gains c_s credit; the one with the most credit, lowest
 * s on ties, is chosen and pays W), so source s gets exactly c_s offsets of
 * every window, evenly spread; rank[t] counts the earlier offsets of the
 * window that went to the same source. Position pos of run r, x = pos - start,
 * t = x % W, takes source s = src[t] and is the j-th position of s in the whole
 * stream with j = J0_s + (x / W) * c_s + rank[t], where J0_s counts the
 * positions of s before the run. Finding the run is a binary search.
 *
 * Point m starts at position P_m = steps[m] * G. Piecewise constant: one run
 * per point, from P_m to P_{m+1} (the last forever), so windows restart at
 * every phase start; a phase whose length is not a multiple of W ends in a
 * cut window holding its table's first offsets. Linear: between points m and
 * m+1, windows of M positions from P_m; with a, b the two points' counts and
 * T = sum max(0, b_s - a_s), window k (of the len = P_{m+1} - P_m positions)
 * has the first tau(k) = min(T, floor((T (2k+1) M + len) / (2 len))) moves
 * applied: move i takes one position from inc/dec lists, dec[i] losing one
 * and inc[i] gaining one, where dec lists the decreasing sources' units and
 * inc the increasing ones', each interleaved by the same round-robin. tau is
 * nondecreasing in k, so a run is a maximal range of windows with one tau;
 * the next run starts at the first k with tau(k) > tau, found in O(1). A
 * linear segment therefore has at most min(windows, T + 1) runs, T <= M:
 * creation costs O(points x M x K), never O(steps).
 *
 * The J0 of every run are computed at creation: a run of n positions adds
 * (n / W) c_s plus the count of s among the first n % W table entries.
 *
 * Anchor: a resume with another schedule hands over at anchor_pos: from there
 * j = anchor_counts[s] + (j under this schedule - positions of s before
 * anchor_pos under this schedule), so what each source delivered before the
 * hand-over stays consumed.
 *
 * Tables of constant phases are built at creation; those of linear runs (up
 * to M + 1 per segment, W entries each) are built on use and cached per
 * thread (the last one, keyed by a serial unique to the schedule). When that
 * cache cannot be allocated, tf__sched_at returns UINT32_MAX (the order turns
 * it into an out-of-range sample, which the engine reports as an error).
 *
 * These rules are part of the checkpoint contract (see order.c).
 */
#include "schedule.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_RUNS (1u << 22)

typedef struct run {
    uint64_t start; /* first position */
    uint64_t W;     /* reduced window */
    uint32_t *src;  /* W entries, or NULL: built on use */
    uint32_t *rank;
} run;

struct tf__sched {
    size_t K;
    uint64_t M, G;
    int linear;
    size_t npoints;
    uint64_t *pcounts; /* npoints x K counts per M positions */
    uint64_t *steps;   /* npoints */
    size_t nruns;
    run *runs;
    uint64_t *cnt; /* nruns x K reduced counts per run window */
    uint64_t *J0;  /* nruns x K */
    uint64_t anchor_pos;
    uint64_t *anchor_delta; /* K: anchor_counts[s] - count(s, anchor_pos) (mod 2^64), or NULL */
    uint64_t serial;
    uint64_t fp;
};

typedef unsigned __int128 u128;

static uint64_t gcd64(uint64_t a, uint64_t b) {
    while (b) {
        uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* Largest-remainder counts of one point (see the top of the file). */
static int point_counts(const double *w, size_t K, uint64_t M, int allow_zero, size_t point, size_t npoints,
                        uint64_t *cnt) {
    double sum = 0;
    char where[48] = "";
    if (npoints > 1) snprintf(where, sizeof where, " (schedule point %zu)", point);
    for (size_t s = 0; s < K; s++) {
        if (!isfinite(w[s]) || w[s] < 0 || (!allow_zero && !(w[s] > 0)))
            TF_FAIL(-EINVAL, "weights[%zu]%s: expected a finite weight %s, found %g", s, where,
                    allow_zero ? ">= 0" : "> 0", w[s]);
        sum += w[s];
    }
    if (!(sum > 0)) TF_FAIL(-EINVAL, "weights%s: at least one weight must be > 0", where);
    if (!isfinite(sum)) TF_FAIL(-EINVAL, "weights%s: the sum overflows", where);
    double *frac = malloc(K * sizeof *frac);
    if (!frac) return -ENOMEM;
    uint64_t used = 0;
    for (size_t s = 0; s < K; s++) {
        double q = (double)M * (w[s] / sum);
        cnt[s] = (uint64_t)floor(q);
        if (cnt[s] > M) cnt[s] = M;
        frac[s] = w[s] > 0 ? q - (double)cnt[s] : -2.0;
        used += cnt[s];
    }
    while (used < M) { /* largest remainder, lowest index on ties */
        size_t best = 0;
        for (size_t s = 1; s < K; s++)
            if (frac[s] > frac[best]) best = s;
        cnt[best]++;
        frac[best] = -1;
        used++;
    }
    free(frac);
    for (size_t s = 0; s < K; s++)
        if (cnt[s] == 0 && w[s] > 0)
            TF_FAIL(-EINVAL, "weights[%zu] = %g%s rounds to 0 positions in a window of %llu: raise mix_window or the weight",
                    s, w[s], where, (unsigned long long)M);
    return 0;
}

/* Round-robin table of counts c (sum W): src[t], and rank[t] when not NULL. */
static void build_table(const uint64_t *c, size_t K, uint64_t W, int64_t *credit, uint64_t *given, uint32_t *src,
                        uint32_t *rank) {
    memset(credit, 0, K * sizeof *credit);
    memset(given, 0, K * sizeof *given);
    for (uint64_t t = 0; t < W; t++) {
        size_t best = 0;
        for (size_t s = 0; s < K; s++) {
            credit[s] += (int64_t)c[s];
            if (credit[s] > credit[best]) best = s;
        }
        credit[best] -= (int64_t)W;
        src[t] = (uint32_t)best;
        if (rank) rank[t] = (uint32_t)given[best];
        given[best]++;
    }
}

/* ---- per-thread table cache for runs without a table -------------------- */

typedef struct tcache {
    uint64_t serial, run;
    int valid;
    uint32_t *src, *rank;
    uint64_t cap;
    int64_t *credit;
    uint64_t *given;
    size_t kcap;
} tcache;

static pthread_key_t tc_key;
static pthread_once_t tc_once = PTHREAD_ONCE_INIT;
static int tc_ok;

static void tc_destroy(void *p) {
    tcache *c = p;
    if (!c) return;
    free(c->src);
    free(c->rank);
    free(c->credit);
    free(c->given);
    free(c);
}
static void tc_init(void) { tc_ok = pthread_key_create(&tc_key, tc_destroy) == 0; }

static tcache *tc_get(void) {
    pthread_once(&tc_once, tc_init);
    if (!tc_ok) return NULL;
    tcache *c = pthread_getspecific(tc_key);
    if (!c) {
        c = calloc(1, sizeof *c);
        if (c && pthread_setspecific(tc_key, c) != 0) {
            free(c);
            c = NULL;
        }
    }
    return c;
}

static uint32_t lookup(const tf__sched *s, size_t r, uint64_t t, uint64_t *rank) {
    const run *R = &s->runs[r];
    if (R->src) {
        *rank = R->rank[t];
        return R->src[t];
    }
    tcache *c = tc_get();
    if (!c) return UINT32_MAX;
    if (!c->valid || c->serial != s->serial || c->run != r) {
        c->valid = 0;
        if (c->cap < R->W) {
            uint32_t *a = realloc(c->src, R->W * sizeof *a);
            if (a) c->src = a;
            uint32_t *b = realloc(c->rank, R->W * sizeof *b);
            if (b) c->rank = b;
            if (!a || !b) return UINT32_MAX;
            c->cap = R->W;
        }
        if (c->kcap < s->K) {
            int64_t *a = realloc(c->credit, s->K * sizeof *a);
            if (a) c->credit = a;
            uint64_t *b = realloc(c->given, s->K * sizeof *b);
            if (b) c->given = b;
            if (!a || !b) return UINT32_MAX;
            c->kcap = s->K;
        }
        build_table(s->cnt + r * s->K, s->K, R->W, c->credit, c->given, c->src, c->rank);
        c->serial = s->serial;
        c->run = r;
        c->valid = 1;
    }
    *rank = c->rank[t];
    return c->src[t];
}

/* Count of source k among the first n entries of run r's table (n < W).
 * scratch: W src entries, K credits and K counters (used when the run keeps
 * no table). */
static uint64_t table_prefix(const tf__sched *s, size_t r, uint64_t n, size_t k, uint32_t *tab, int64_t *credit,
                             uint64_t *given) {
    const run *R = &s->runs[r];
    const uint32_t *src = R->src;
    if (!src) {
        build_table(s->cnt + r * s->K, s->K, R->W, credit, given, tab, NULL);
        src = tab;
    }
    uint64_t c = 0;
    for (uint64_t t = 0; t < n; t++) c += src[t] == k;
    return c;
}

static int grow_runs(tf__sched *s, size_t *cap) {
    if (s->nruns < *cap) return 0;
    if (s->nruns >= MAX_RUNS)
        TF_FAIL(-EINVAL, "the weight schedule has more than %u runs of windows with equal counts: use fewer points or a smaller mix_window",
                MAX_RUNS);
    size_t nc = *cap ? *cap * 2 : 16;
    run *r = realloc(s->runs, nc * sizeof *r);
    if (!r) return -ENOMEM;
    s->runs = r;
    uint64_t *c = realloc(s->cnt, nc * s->K * sizeof *c);
    if (!c) return -ENOMEM;
    s->cnt = c;
    uint64_t *j = realloc(s->J0, nc * s->K * sizeof *j);
    if (!j) return -ENOMEM;
    s->J0 = j;
    *cap = nc;
    return 0;
}

/* Append a run starting at `start` with counts c per M positions; its J0 is J.
 * with_table: build the table now (constant phases). */
static int add_run(tf__sched *s, size_t *cap, uint64_t start, const uint64_t *c, const uint64_t *J, int with_table,
                   int64_t *credit, uint64_t *given) {
    TF_TRY(grow_runs(s, cap));
    size_t r = s->nruns, K = s->K;
    uint64_t g = 0;
    for (size_t q = 0; q < K; q++) g = gcd64(g, c[q]);
    run *R = &s->runs[r];
    memset(R, 0, sizeof *R);
    R->start = start;
    R->W = s->M / g;
    for (size_t q = 0; q < K; q++) {
        s->cnt[r * K + q] = c[q] / g;
        s->J0[r * K + q] = J[q];
    }
    s->nruns++;
    if (with_table) {
        R->src = malloc(R->W * sizeof *R->src);
        R->rank = malloc(R->W * sizeof *R->rank);
        if (!R->src || !R->rank) return -ENOMEM;
        build_table(s->cnt + r * K, K, R->W, credit, given, R->src, R->rank);
    }
    return 0;
}

/* J += the positions of every source among the first n positions of run r. */
static void advance(const tf__sched *s, size_t r, uint64_t n, uint64_t *J, uint32_t *tab, int64_t *credit,
                    uint64_t *given) {
    const run *R = &s->runs[r];
    uint64_t q = n / R->W, rem = n % R->W;
    for (size_t k = 0; k < s->K; k++) J[k] += q * s->cnt[r * s->K + k];
    if (rem) {
        const uint32_t *src = R->src;
        if (!src) {
            build_table(s->cnt + r * s->K, s->K, R->W, credit, given, tab, NULL);
            src = tab;
        }
        for (uint64_t t = 0; t < rem; t++) J[src[t]]++;
    }
}

static size_t run_of(const tf__sched *s, uint64_t pos) {
    size_t lo = 0, hi = s->nruns; /* runs[lo].start <= pos < runs[hi].start */
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (s->runs[mid].start <= pos) lo = mid;
        else hi = mid;
    }
    return lo;
}

void tf__sched_free(tf__sched *s) {
    if (!s) return;
    for (size_t r = 0; s->runs && r < s->nruns; r++) {
        free(s->runs[r].src);
        free(s->runs[r].rank);
    }
    free(s->runs);
    free(s->cnt);
    free(s->J0);
    free(s->pcounts);
    free(s->steps);
    free(s->anchor_delta);
    free(s);
}

static uint64_t fingerprint(const tf__sched *s) {
    tf__xxh64_state h;
    uint8_t rec[8];
#define PUT(v) (tf__put_le64(rec, (uint64_t)(v)), tf__xxh64_update(&h, rec, 8))
    if (s->npoints == 1) {
        /* the plain-weights hash, unchanged since before schedules */
        tf__xxh64_reset(&h, 0x4D49585343484544ULL); /* "MIXSCHED" */
        PUT(s->K);
        PUT(s->runs[0].W);
        for (size_t k = 0; k < s->K; k++) PUT(s->cnt[k]);
    } else {
        tf__xxh64_reset(&h, 0x4D49585343484432ULL); /* "MIXSCHD2" */
        PUT(s->K);
        PUT(s->M);
        PUT(s->linear);
        PUT(s->npoints);
        for (size_t m = 0; m < s->npoints; m++) {
            PUT(s->steps[m]);
            for (size_t k = 0; k < s->K; k++) PUT(s->pcounts[m * s->K + k]);
        }
    }
#undef PUT
    return tf__xxh64_digest(&h);
}

int tf__sched_create(const tf__sched_spec *sp, tf__sched **out) {
    if (!out) return -EINVAL;
    *out = NULL;
    if (!sp || sp->K == 0 || sp->npoints == 0 || !sp->steps || !sp->weights)
        TF_FAIL(-EINVAL, "mixture schedule: sources, points, steps and weights are required");
    if (sp->M < 1 || sp->M > (1u << 20))
        TF_FAIL(-EINVAL, "mix_window: expected 1 <= mix_window <= %u, found %llu", 1u << 20, (unsigned long long)sp->M);
    if (sp->G < 1) TF_FAIL(-EINVAL, "global_batch: expected >= 1, found 0");
    if (sp->steps[0] != 0)
        TF_FAIL(-EINVAL, "weight schedule: the first point must be at step 0, found step %llu",
                (unsigned long long)sp->steps[0]);
    for (size_t m = 1; m < sp->npoints; m++) {
        uint64_t p;
        if (sp->steps[m] <= sp->steps[m - 1])
            TF_FAIL(-EINVAL, "weight schedule: steps must increase, found step %llu after step %llu (point %zu)",
                    (unsigned long long)sp->steps[m], (unsigned long long)sp->steps[m - 1], m);
        if (tf__mul_overflow(sp->steps[m], sp->G, &p))
            TF_FAIL(-EINVAL, "weight schedule: step %llu x global batch %llu overflows 64-bit positions (point %zu)",
                    (unsigned long long)sp->steps[m], (unsigned long long)sp->G, m);
    }
    size_t K = sp->K;
    tf__sched *s = calloc(1, sizeof *s);
    if (!s) return -ENOMEM;
    static _Atomic uint64_t serials = 1;
    s->serial = atomic_fetch_add(&serials, 1);
    s->K = K;
    s->M = sp->M;
    s->G = sp->G;
    s->linear = sp->linear ? 1 : 0;
    s->npoints = sp->npoints;
    int rc = 0;
    size_t cap = 0;
    int64_t *credit = calloc(K, sizeof *credit);
    uint64_t *given = calloc(K, sizeof *given), *J = calloc(K, sizeof *J), *cur = calloc(K, sizeof *cur);
    uint32_t *tab = malloc(sp->M * sizeof *tab), *inc = malloc(sp->M * sizeof *inc),
             *dec = malloc(sp->M * sizeof *dec);
    uint64_t *d = calloc(K, sizeof *d);
    s->pcounts = calloc(sp->npoints * K, sizeof *s->pcounts);
    s->steps = malloc(sp->npoints * sizeof *s->steps);
    if (!credit || !given || !J || !cur || !tab || !inc || !dec || !d || !s->pcounts || !s->steps) {
        rc = -ENOMEM;
        goto done;
    }
    memcpy(s->steps, sp->steps, sp->npoints * sizeof *s->steps);
    for (size_t m = 0; m < sp->npoints; m++) {
        rc = point_counts(sp->weights + m * K, K, sp->M, sp->allow_zero, m, sp->npoints, s->pcounts + m * K);
        if (rc) goto done;
    }
    for (size_t m = 0; m < sp->npoints; m++) {
        const uint64_t *a = s->pcounts + m * K;
        uint64_t P = sp->steps[m] * sp->G;
        int last = m + 1 == sp->npoints;
        uint64_t end = last ? UINT64_MAX : sp->steps[m + 1] * sp->G;
        const uint64_t *b = last ? a : s->pcounts + (m + 1) * K;
        int ramp = s->linear && !last && memcmp(a, b, K * sizeof *a) != 0;
        if (!ramp) {
            rc = add_run(s, &cap, P, a, J, 1, credit, given);
            if (rc) goto done;
            if (!last) advance(s, s->nruns - 1, end - P, J, tab, credit, given);
            continue;
        }
        /* linear segment: unit moves from the decreasing to the increasing sources */
        uint64_t T = 0;
        for (size_t k = 0; k < K; k++) {
            d[k] = b[k] > a[k] ? b[k] - a[k] : 0;
            T += d[k];
        }
        build_table(d, K, T, credit, given, inc, NULL);
        for (size_t k = 0; k < K; k++) d[k] = a[k] > b[k] ? a[k] - b[k] : 0;
        build_table(d, K, T, credit, given, dec, NULL);
        uint64_t len = end - P, M = sp->M;
        uint64_t n = len / M + (len % M != 0);
        memcpy(cur, a, K * sizeof *cur);
        uint64_t applied = 0, k = 0;
        while (k < n) {
            u128 raw = ((u128)T * (2 * (u128)k + 1) * M + len) / (2 * (u128)len);
            uint64_t tau = raw < T ? (uint64_t)raw : T;
            for (; applied < tau; applied++) {
                cur[dec[applied]]--;
                cur[inc[applied]]++;
            }
            uint64_t knext = n;
            if (tau < T) {
                u128 num_hi = 2 * (u128)len * (tau + 1), sub = (u128)len + (u128)T * M;
                u128 kk = num_hi > sub ? (num_hi - sub + 2 * (u128)T * M - 1) / (2 * (u128)T * M) : 0;
                knext = kk < n ? (uint64_t)kk : n;
                if (knext <= k) knext = k + 1;
            }
            rc = add_run(s, &cap, P + k * M, cur, J, 0, credit, given);
            if (rc) goto done;
            u128 stop = (u128)knext * M;
            uint64_t npos = (stop < len ? (uint64_t)stop : len) - k * M;
            advance(s, s->nruns - 1, npos, J, tab, credit, given);
            k = knext;
        }
    }
    if (sp->anchor_counts) {
        s->anchor_pos = sp->anchor_pos;
        s->anchor_delta = malloc(K * sizeof *s->anchor_delta);
        if (!s->anchor_delta) {
            rc = -ENOMEM;
            goto done;
        }
        size_t r = run_of(s, sp->anchor_pos);
        uint64_t x = sp->anchor_pos - s->runs[r].start, W = s->runs[r].W;
        for (size_t k = 0; k < K; k++)
            s->anchor_delta[k] = sp->anchor_counts[k] -
                                 (s->J0[r * K + k] + x / W * s->cnt[r * K + k] +
                                  table_prefix(s, r, x % W, k, tab, credit, given));
    }
    s->fp = fingerprint(s);
done:
    free(credit);
    free(given);
    free(J);
    free(cur);
    free(tab);
    free(inc);
    free(dec);
    free(d);
    if (rc) {
        tf__sched_free(s);
        return rc;
    }
    *out = s;
    return 0;
}

uint32_t tf__sched_at(const tf__sched *s, uint64_t pos, uint64_t *j) {
    size_t r = run_of(s, pos), K = s->K;
    const run *R = &s->runs[r];
    uint64_t x = pos - R->start, rank;
    uint32_t src = lookup(s, r, x % R->W, &rank);
    if (src == UINT32_MAX) return src;
    *j = s->J0[r * K + src] + x / R->W * s->cnt[r * K + src] + rank;
    if (s->anchor_delta && pos >= s->anchor_pos) *j += s->anchor_delta[src];
    return src;
}

uint64_t tf__sched_count(const tf__sched *s, size_t k, uint64_t pos) {
    size_t r = run_of(s, pos), K = s->K;
    const run *R = &s->runs[r];
    uint64_t x = pos - R->start, rem = x % R->W;
    uint64_t c = s->J0[r * K + k] + x / R->W * s->cnt[r * K + k];
    if (s->anchor_delta && pos >= s->anchor_pos) c += s->anchor_delta[k];
    if (!rem) return c;
    uint64_t rank;
    for (uint64_t t = 0; t < rem; t++) {
        uint32_t src = lookup(s, r, t, &rank);
        if (src == UINT32_MAX) return UINT64_MAX;
        c += src == k;
    }
    return c;
}

uint64_t tf__sched_counts_at(const tf__sched *s, uint64_t pos, uint64_t *w) {
    size_t r = run_of(s, pos);
    for (size_t k = 0; k < s->K; k++) w[k] = s->cnt[r * s->K + k];
    return s->runs[r].W;
}

uint64_t tf__sched_fingerprint(const tf__sched *s) { return s->fp; }
size_t tf__sched_num_runs(const tf__sched *s) { return s->nruns; }
