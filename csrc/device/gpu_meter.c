/*
 * gpu_meter.c — the data-wait meter read on the GPU's clock (device.h).
 *
 * The host meter (engine/meter.h) times the consumer's wait inside next():
 * with a device stage that is the wait for a batch whose copy has been
 * *issued*, which says nothing of whether the GPU then stood still waiting
 * for that copy. The training step's kernels are queued asynchronously, so a
 * host loop that runs ahead of the GPU sees no wait at all while the GPU
 * idles at every hand-off, and one that runs behind it sees a wait the GPU
 * never had. This meter measures on the consumer's stream itself:
 *
 *   consumer asks for batch i (first call of next() for it):
 *                          record A_i on the consumer's stream
 *   hand-off (next() returns it):
 *                          the stream waits on the batch's copy (and, with
 *                          static buffers, runs the copies into them)
 *                          record B_i on the consumer's stream
 *
 * A_i completes when the stream has finished what was queued before the
 * consumer asked for the batch (the previous step), or at once if it had
 * already; B_i when, in addition, the batch is on the device. Between them
 * the stream has nothing to do but wait for data: for the host to get the
 * batch (an engine that is late) and for its copy (a copy that is late). So
 *
 *   GPU wait of batch i   = elapsed(A_i, B_i)   (~0 when the batch was there)
 *   GPU cycle of batch i  = elapsed(B_i-1, B_i) (the step, wait included)
 *
 * A stream left idle by a host that is slow elsewhere (before it asks) is not
 * waiting for data: A_i then completes at once and that idle time is in the
 * cycle, not the wait. The fraction of GPU time spent waiting for data is
 * sum(wait) / sum(cycle) over a window, as for the host meter. The first
 * batch's wait is start-up, kept apart. Nothing waits for these events: they
 * are read with cudaEventQuery when they have completed, a step or more
 * later, at the next request or when the meter is read. Up to TF__GPU_MARKS
 * hand-offs can be pending; the consumer's stream cannot lag further behind
 * than the device slots allow, so that bound is not reached in practice; if
 * it is, a hand-off goes unmeasured (counted) and the next measured one
 * starts a new cycle.
 *
 * Thread-safety: begin/end run on the consumer's thread; poll and get may
 * run on any thread (a logger's): mu guards the marks and the meter.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"

void tf__gpu_meter_init(tf__gpu_meter *g) {
    memset(g, 0, sizeof *g);
    pthread_mutex_init(&g->mu, NULL);
    tf__meter_init(&g->meter);
    g->prev = -1;
}

/* Device current (the stage's). */
void tf__gpu_meter_destroy(tf__gpu_meter *g, const tf__cudart *cu) {
    if (g->made && cu) {
        for (int i = 0; i < TF__GPU_MARKS; i++) {
            if (g->a[i]) cu->EventDestroy(g->a[i]);
            if (g->b[i]) cu->EventDestroy(g->b[i]);
        }
        cu->GetLastError();
    }
    g->made = 0;
    pthread_mutex_destroy(&g->mu);
    tf__meter_destroy(&g->meter);
}

/* The meter stops measuring and says why (a CUDA failure of its own never
 * fails a hand-off: the batch is delivered, only its measurement is lost). */
static void give_up(tf__gpu_meter *g, const tf__cudart *cu, tf__cuerr e, const char *what) {
    const char *s = cu->GetErrorString ? cu->GetErrorString(e) : NULL;
    cu->GetLastError();
    g->off = 1;
    snprintf(g->why, sizeof g->why, "%s failed: %s (cudaError %d); the GPU-clock meter stopped", what,
             s ? s : "unknown error", e);
}

static int make_events(tf__gpu_meter *g, const tf__cudart *cu) {
    for (int i = 0; i < TF__GPU_MARKS; i++) {
        tf__cuerr e;
        if ((e = cu->EventCreateWithFlags(&g->a[i], TF__CU_EVENT_DEFAULT)) != TF__CU_SUCCESS ||
            (e = cu->EventCreateWithFlags(&g->b[i], TF__CU_EVENT_DEFAULT)) != TF__CU_SUCCESS) {
            give_up(g, cu, e, "cudaEventCreate (GPU-clock meter)");
            return -1;
        }
    }
    return 0;
}

/* Read every pending hand-off whose B has completed, oldest first (under mu). */
static void poll_locked(tf__gpu_meter *g, const tf__cudart *cu) {
    while (g->count > 0 && !g->off) {
        int i = g->head;
        tf__cuerr e = cu->EventQuery(g->b[i]);
        if (e == TF__CU_ERR_NOT_READY) {
            cu->GetLastError();
            return;
        }
        if (e != TF__CU_SUCCESS) {
            give_up(g, cu, e, "cudaEventQuery (GPU-clock meter)");
            return;
        }
        float wait_ms = 0.f, cycle_ms = 0.f;
        if ((e = cu->EventElapsedTime(&wait_ms, g->a[i], g->b[i])) != TF__CU_SUCCESS) {
            give_up(g, cu, e, "cudaEventElapsedTime (GPU-clock meter)");
            return;
        }
        int have_cycle = g->prev >= 0 && !g->gap[i];
        if (have_cycle && (e = cu->EventElapsedTime(&cycle_ms, g->b[g->prev], g->b[i])) != TF__CU_SUCCESS) {
            give_up(g, cu, e, "cudaEventElapsedTime (GPU-clock meter)");
            return;
        }
        uint64_t wait_ns = wait_ms > 0.f ? (uint64_t)((double)wait_ms * 1e6) : 0;
        uint64_t cycle_ns = cycle_ms > 0.f ? (uint64_t)((double)cycle_ms * 1e6) : 0;
        /* Two streams (a consumer that changes stream) can order B_i-1 after
         * A_i: the cycle is then at least the wait. */
        if (cycle_ns < wait_ns) cycle_ns = wait_ns;
        if (!g->started)
            tf__meter_record_startup(&g->meter, wait_ns);
        else if (have_cycle)
            tf__meter_record(&g->meter, wait_ns, cycle_ns, 0);
        g->started = 1;
        g->prev = i;
        g->head = (g->head + 1) % TF__GPU_MARKS;
        g->count--;
    }
}

int tf__gpu_meter_begin(tf__gpu_meter *g, const tf__cudart *cu, uintptr_t stream) {
    if (g->off) return -1;
    pthread_mutex_lock(&g->mu);
    int idx = -1;
    if (stream == TF_DEVICE_STREAM_NONE) { /* no consumer stream: nothing stands still on the GPU here */
        g->lost_cycle = 1;
        goto out;
    }
    if (!g->made) {
        g->made = 1;
        if (make_events(g, cu) < 0) goto out;
    }
    poll_locked(g, cu);
    if (g->off) goto out;
    /* The slot after the pending ones, unless it holds the last completed
     * B (the start of the next cycle). */
    int next = (g->head + g->count) % TF__GPU_MARKS;
    if (g->count >= TF__GPU_MARKS - 1 || next == g->prev) {
        g->unmeasured++;
        g->lost_cycle = 1;
        goto out;
    }
    tf__cuerr e = cu->EventRecord(g->a[next], (tf__custream)stream);
    if (e != TF__CU_SUCCESS) {
        give_up(g, cu, e, "cudaEventRecord (GPU-clock meter)");
        goto out;
    }
    idx = next;
out:
    pthread_mutex_unlock(&g->mu);
    return idx;
}

void tf__gpu_meter_end(tf__gpu_meter *g, const tf__cudart *cu, int idx, uintptr_t stream, int delivered) {
    if (idx < 0) return;
    pthread_mutex_lock(&g->mu);
    if (!delivered) { /* the hand-off failed: A is recorded but nothing is pending */
        pthread_mutex_unlock(&g->mu);
        return;
    }
    tf__cuerr e = cu->EventRecord(g->b[idx], (tf__custream)stream);
    if (e != TF__CU_SUCCESS) {
        give_up(g, cu, e, "cudaEventRecord (GPU-clock meter)");
    } else {
        g->gap[idx] = g->lost_cycle;
        g->lost_cycle = 0;
        g->count++;
        g->handoffs++;
    }
    pthread_mutex_unlock(&g->mu);
}

void tf__gpu_meter_skip(tf__gpu_meter *g) {
    pthread_mutex_lock(&g->mu);
    g->unmeasured++;
    g->lost_cycle = 1;
    pthread_mutex_unlock(&g->mu);
}

void tf__gpu_meter_get(tf__gpu_meter *g, const tf__cudart *cu, uint32_t window, tf_meter *out, uint64_t *pending,
                       uint64_t *unmeasured, char *why, size_t why_len) {
    pthread_mutex_lock(&g->mu);
    if (cu && g->made) poll_locked(g, cu);
    if (pending) *pending = (uint64_t)g->count;
    if (unmeasured) *unmeasured = g->unmeasured;
    if (why && why_len) snprintf(why, why_len, "%s", g->why);
    pthread_mutex_unlock(&g->mu);
    tf__meter_get(&g->meter, window, out);
}
