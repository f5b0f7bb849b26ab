/*
 * meter.h — the data-wait meter: how much of the consumer's wall time went
 * into waiting for data, over a sliding window of the last batches. Used by
 * the engine (tf_loader_next_timed) and the device stage
 * (tf_device_loader_next_timed), each around its own wait. Not installed.
 *
 * The consumer's time is cut into cycles, one per batch: a cycle runs from
 * the return of one batch to the return of the next, and its wait is the part
 * spent inside next() (from the first call for that batch, across the timed
 * slices the binding polls in, to the return). Everything else in the cycle
 * is the consumer's own work. The first batch is not a cycle: its wait is the
 * engine's start-up (threads starting, the first reads, a device's first copy),
 * kept apart as startup_ns so that the window judges the steady state alone
 * (one slow first batch would otherwise weigh on every short window that still
 * holds it). The window keeps the last TF__METER_CAP cycles
 * (wait, cycle length, batches ready ahead at delivery); the fraction waiting
 * is sum(wait) / sum(cycle) over the last `window` of them.
 *
 * Thread-safety: enter/leave are called by the consumer's thread only; get
 * may run on any thread (a logger's): a mutex guards the ring.
 */
#ifndef TF_ENGINE_METER_H
#define TF_ENGINE_METER_H

#include <pthread.h>
#include <stdint.h>

#include "../common/internal.h"

#define TF__METER_CAP TF_METER_MAX_WINDOW

typedef struct tf__meter_rec {
    uint64_t wait_ns, cycle_ns;
    uint32_t ahead;
} tf__meter_rec;

typedef struct tf__meter {
    pthread_mutex_t mu;
    uint64_t t_call;   /* first call of the batch being waited for (0: none) */
    uint64_t t_last;   /* return of the last batch delivered (0: none yet) */
    uint64_t total;    /* cycles recorded (batches after the first) */
    uint64_t startup_ns; /* the first batch's wait (guarded by mu) */
    int started;       /* the first batch was delivered */
    tf__meter_rec *ring; /* TF__METER_CAP; NULL: the meter could not be allocated (records nothing) */
} tf__meter;

TF_HIDDEN void tf__meter_init(tf__meter *m);
TF_HIDDEN void tf__meter_destroy(tf__meter *m);
/* After fork: the mutex may be a copy of a locked one. */
TF_HIDDEN void tf__meter_reinit_lock(tf__meter *m);
/* The consumer calls next(): starts a wait unless one is in progress. */
TF_HIDDEN void tf__meter_enter(tf__meter *m);
/* next() returned rc: 0 records the batch (ahead: batches ready behind it; the
 * first batch records the start-up instead);
 * -TF_ENOTREADY keeps the wait going; anything else (end, error) drops it. */
TF_HIDDEN void tf__meter_leave(tf__meter *m, int rc, uint32_t ahead);
/* A cycle measured elsewhere (the device stage's GPU clock): record it as
 * leave() would; the first call of the second records the start-up. Any thread. */
TF_HIDDEN void tf__meter_record(tf__meter *m, uint64_t wait_ns, uint64_t cycle_ns, uint32_t ahead);
TF_HIDDEN void tf__meter_record_startup(tf__meter *m, uint64_t wait_ns);
/* Summary of the last `window` batches (0: all kept). */
TF_HIDDEN void tf__meter_get(tf__meter *m, uint32_t window, tf_meter *out);

#endif
