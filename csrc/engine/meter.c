/*
 * meter.c — the data-wait meter (meter.h): a ring of the last cycles of the
 * consumer and their summary.
 */
#include <stdlib.h>
#include <string.h>

#include "meter.h"

void tf__meter_init(tf__meter *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    m->ring = calloc(TF__METER_CAP, sizeof *m->ring);
}

void tf__meter_destroy(tf__meter *m) {
    if (!m->ring) return; /* never initialised (or out of memory then) */
    pthread_mutex_destroy(&m->mu);
    free(m->ring);
    m->ring = NULL;
}

void tf__meter_reinit_lock(tf__meter *m) { pthread_mutex_init(&m->mu, NULL); }

void tf__meter_enter(tf__meter *m) {
    if (!m->t_call) m->t_call = tf__now_ns();
}

void tf__meter_leave(tf__meter *m, int rc, uint32_t ahead) {
    if (rc == -TF_ENOTREADY || !m->t_call) return;
    uint64_t now = tf__now_ns(), t_call = m->t_call;
    m->t_call = 0;
    if (rc) return;
    if (!m->started) { /* the first batch: the engine's start-up, not a cycle of the steady state */
        m->t_last = now;
        tf__meter_record_startup(m, now - t_call);
        return;
    }
    uint64_t start = m->t_last && m->t_last <= t_call ? m->t_last : t_call;
    m->t_last = now;
    tf__meter_record(m, now - t_call, now - start, ahead);
}

void tf__meter_record(tf__meter *m, uint64_t wait_ns, uint64_t cycle_ns, uint32_t ahead) {
    if (!m->ring) return;
    pthread_mutex_lock(&m->mu);
    tf__meter_rec *r = &m->ring[m->total % TF__METER_CAP];
    r->wait_ns = wait_ns;
    r->cycle_ns = cycle_ns;
    r->ahead = ahead;
    m->total++;
    pthread_mutex_unlock(&m->mu);
}

void tf__meter_record_startup(tf__meter *m, uint64_t wait_ns) {
    if (!m->ring) return;
    pthread_mutex_lock(&m->mu);
    m->started = 1;
    m->startup_ns = wait_ns;
    pthread_mutex_unlock(&m->mu);
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Nearest-rank percentile of sorted v[0..n). */
static uint64_t pct(const uint64_t *v, uint64_t n, double p) {
    uint64_t i = (uint64_t)(p * (double)n + 0.999999);
    if (i < 1) i = 1;
    if (i > n) i = n;
    return v[i - 1];
}

void tf__meter_get(tf__meter *m, uint32_t window, tf_meter *out) {
    memset(out, 0, sizeof *out);
    uint64_t waits[TF__METER_CAP];
    pthread_mutex_lock(&m->mu);
    uint64_t have = m->total < TF__METER_CAP ? m->total : TF__METER_CAP;
    uint64_t n = window && window < have ? window : have;
    uint64_t wsum = 0, csum = 0, asum = 0, amin = UINT64_MAX;
    for (uint64_t i = 0; m->ring && i < n; i++) {
        const tf__meter_rec *r = &m->ring[(m->total - 1 - i) % TF__METER_CAP];
        waits[i] = r->wait_ns;
        wsum += r->wait_ns;
        csum += r->cycle_ns;
        asum += r->ahead;
        if (r->ahead < amin) amin = r->ahead;
    }
    out->total_batches = m->total + (m->started ? 1 : 0);
    out->startup_seconds = (double)m->startup_ns / 1e9;
    pthread_mutex_unlock(&m->mu);
    out->batches = n;
    if (!n) return;
    qsort(waits, n, sizeof *waits, cmp_u64);
    out->window_seconds = (double)csum / 1e9;
    out->wait_seconds = (double)wsum / 1e9;
    out->wait_fraction = csum ? (double)wsum / (double)csum : 0.0;
    out->wait_p50_seconds = (double)pct(waits, n, 0.50) / 1e9;
    out->wait_p99_seconds = (double)pct(waits, n, 0.99) / 1e9;
    out->wait_max_seconds = (double)waits[n - 1] / 1e9;
    out->ready_ahead_mean = (double)asum / (double)n;
    out->ready_ahead_min = amin;
}
