/*
 * stage.c — the device stage: a loader's batches copied to the GPU ahead of
 * the consumer (tf_device_loader in tokenfeed.h).
 *
 * DESIGN
 *
 * Threads. Three kinds take part: the engine's workers (loader.c), which
 * assemble host batches; one copy thread per device loader (here), started on
 * the first next() (or tf_device_loader_start); and the consumer, the thread
 * that calls tf_device_loader_next. Releases (tf_device_batch_release) may
 * come from any thread: a DLPack deleter runs wherever a framework frees its
 * tensor.
 *
 * The copy thread is the engine's only consumer. In a loop it
 *   1. waits on feed_cv until the queue has room (fewer than `prefetch`
 *      batches copied ahead and not yet delivered);
 *   2. takes a device slot from the ring (ring.c): a free one, else it waits
 *      on the oldest "released" event (cudaEventSynchronize on that event,
 *      with blocking sync: the thread sleeps; the GPU reaches the event when
 *      the consumer's stream has finished the step that read the slot), else,
 *      when every slot is queued here or held by the consumer, it marks itself
 *      starved and waits on feed_cv for a release;
 *   3. takes the next host batch from the engine (tf_loader_next_timed, in
 *      slices so that a stop is seen within one), which returns as soon as a
 *      worker has published it: the copy below is issued right after the
 *      batch is assembled, whatever the consumer is doing;
 *   4. issues the host-to-device copy on the ring's non-blocking stream,
 *      between two timing events, then records the slot's "copied" event;
 *   5. publishes {slot, position} at the tail of the queue and broadcasts
 *      ready_cv.
 * The slot is taken before the host batch, so the copy is not held up by a
 * slot once the batch exists. On the first batch the slot layout becomes
 * known: the ring (device memory, pinned staging, stream, events) is
 * allocated then, by the copy thread, once.
 *
 * Arrays. Which arrays a batch has is the engine's business: the stage asks
 * it (tf__batch_segments) for each array's place in the host batch, the room
 * the loader gives it and the part this batch filled, and copies what is
 * there. So whole samples (tokens, with input_ids / labels as views of it,
 * and the extras) and a context-parallel rank's share (input_ids, labels and
 * the extras in buffers of their own, or TransformerEngine's THD layout with
 * cu_seqlens_padded) go the same way. A slot holds every array at the room
 * the loader gives it, at fixed offsets, so that any batch fits; under THD
 * the arrays' lengths change from batch to batch and only the filled part is
 * copied. Counts that are not arrays (THD num_seqs and max_seqlen, the
 * share's num_tokens) travel in the queue entry and reach the consumer as
 * host values in the batch view.
 *
 * Host memory. Creating a device loader gives the engine an allocator of
 * page-locked memory (tf__loader_set_allocator: the engine itself knows
 * nothing of CUDA): every batch buffer is then registered once, when the
 * engine makes it, and the workers assemble batches straight into it. Step 4
 * copies such a batch from the engine's buffer itself, one cudaMemcpyAsync
 * per array, into the slot: no host-to-host copy. The host batch cannot go
 * back to the engine (to be refilled) before the DMA has read it, so it stays
 * attached to its slot (hold[]) until the slot's "copied" event is seen
 * complete: polled after every copy, and certain when the slot comes back
 * from the ring ("released" completed implies "copied" did). A batch in a
 * pageable buffer (made before the device loader existed) is first copied
 * into the ring's pinned staging, allocated on first need (a host memcpy,
 * counted in staging_copies/staging_bytes), and given back at once; the DMA
 * reads only page-locked memory either way.
 *
 * Queue (under mu): a ring of entries in batch order. An entry is a copied
 * batch {slot, position, loader position after it}, or an error / end of
 * stream {rc, message}. The copy thread appends; only the consumer removes.
 * After publishing an error or the end, the copy thread exits: it fetches
 * nothing past a batch that failed.
 *
 * Consumer (next). It looks at the head entry, waiting on ready_cv if there
 * is none. "Copied ahead" is decided on entry: the head was already there.
 * Outside the lock it makes its stream wait on the slot's "copied" event
 * (cudaStreamWaitEvent: no host wait), or, with static buffers, queues on
 * its stream the device-to-device copies of the slot into the static
 * buffers (the caller's, or with alloc_static our own, one allocation made
 * with the ring) and then releases the slot on that stream at once. Only then does
 * it remove the entry, so a failure leaves the batch at the head for the
 * next call. It signals feed_cv (room in the queue). When the queue is empty
 * and the copy thread is starved, every slot is held by the consumer and
 * waiting would never end: next() returns -EBUSY instead.
 *
 * Who wakes whom. Copy thread → consumer: ready_cv on every publish and when
 * it starts starving. Consumer → copy thread: feed_cv when it removes an
 * entry. Release → copy thread: feed_cv, with `releases` bumped, so a
 * starved copy thread retries the ring (it reads `releases` before trying,
 * so a release between its try and its wait is not lost). Stop → copy
 * thread: the `stop` flag, feed_cv broadcast, and the engine slices.
 *
 * Ordering on the GPU. The consumer's stream waits on "copied" before any
 * work that reads the batch. A slot goes back to the ring only after
 * "released", recorded on the consumer's stream at release (after making
 * that stream wait on "copied" if it had not), has completed: everything the
 * consumer queued on it before releasing has run, and so has the copy. The
 * copy into the slot's staging (pageable engine buffers) happens only for a
 * slot taken from the ring, so after that too. With static buffers the
 * device-to-device copies into the caller's buffers are queued on the
 * consumer's stream: they run after the previous step's kernels on that
 * stream, so a step never sees its batch overwritten; if next() is given a
 * different stream than the previous call, the new stream first waits on an
 * event recorded on the previous one. Nothing calls cudaDeviceSynchronize
 * or cudaStreamSynchronize.
 *
 * Ownership and lifetime. A slot is owned by the ring (free or pending
 * release), the copy thread (filling), a queue entry, or a batch handle the
 * consumer holds. The device loader is reference counted: 1 for its owner
 * plus one per handle out, so handles (and framework tensors) outlive
 * tf_device_loader_free; the last reference frees the ring and the events,
 * and our own static buffers once the work queued before the last release
 * of a batch (on its stream: the static_done event) has run.
 *
 * State. `position` is the loader position after the last batch delivered to
 * the consumer, never one copied ahead. A seek, a reset after an error and
 * free stop the copy thread (join), drop the queue (slots released on the
 * copy stream, so they are reused only after their copies complete) and seek
 * the engine back to the consumer's position: what was fetched ahead is
 * fetched again.
 *
 * fork. CUDA does not survive fork(): in a child, next/seek/start fail with
 * -TF_ECUDA and free leaks the parent's state without touching it.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../engine/engine.h"
#include "../engine/meter.h"
#include "device.h"

#define TF__ERRMSG 512
#define TF__WAITS 4096       /* consumer waits kept for the p99 */
#define TF__SLICE_NS (20ull * 1000 * 1000)
#define TF__STOPPED 1        /* internal: the copy thread was asked to stop */

typedef struct dentry {
    tf_device_slot *slot; /* NULL for an error or end entry */
    int rc;               /* 0, an error, or -TF_EEOF */
    uint64_t position;    /* global position of the batch's first sample */
    uint64_t pos_after;   /* the loader's position after it */
    /* what this batch filled: bytes per array (a prefix of its room under
     * THD) and the counts that stay on the host */
    size_t used[TF__NSEGS];
    uint64_t num_tokens;
    int32_t thd_seqs, max_seqlen;
    char err[TF__ERRMSG];
} dentry;

struct tf_device_batch {
    struct tf_device_batch *next; /* free list */
    tf_device_loader *d;
    tf_device_slot *slot;         /* NULL with static buffers (back in the ring at delivery) */
    uintptr_t waited;             /* last stream made to wait on the copy */
    tf_device_batch_view view;
};

struct tf_device_loader {
    tf_loader *l; /* borrowed */
    const tf__cudart *cu;
    int device, prefetch, nslots;
    int is_static;
    int own_static;   /* the static buffers are ours (alloc_static): static_mem */
    tf_device_static stat;
    void *static_mem;
    pid_t pid;

    /* Layout and device resources: made by the copy thread at the first
     * batch, then read-only (readers see them after taking an entry under
     * mu). */
    int have_layout;
    tf_dtype dtype;
    uint64_t rows, seq_len;
    uint32_t cp_size;
    int thd;
    size_t seg_cap[TF__NSEGS], seg_off[TF__NSEGS], slot_need; /* the arrays' room and place in a slot */
    tf_device_ring *ring;
    tf__cuevent *t0, *t1; /* per slot: timing events around its copy */
    tf_batch **hold;      /* per slot: the page-locked host batch its copy reads (copy thread; after a join, the consumer) */
    tf__cuevent static_ready, static_consumed;
    tf__cuevent static_done; /* own static buffers: recorded where batches are released */

    pthread_mutex_t mu;
    pthread_cond_t feed_cv;  /* copy thread waits: room in the queue, a release, stop */
    pthread_cond_t ready_cv; /* consumer waits: an entry, or the copy thread starving */
    /* under mu */
    dentry *q;
    int qhead, qcount, qcap;
    int starved;           /* the copy thread found every slot queued or held ... */
    uint64_t starved_seen; /* ... when `releases` had this value */
    uint64_t releases;
    int refs, held;
    tf_device_batch *free_handles;
    unsigned char *timing;   /* per slot: copy timed, not yet collected */
    size_t *timing_bytes;
    uint64_t st_batches, st_ahead, st_copies, st_h2d_bytes, st_timed_bytes, st_staging, st_staging_bytes;
    uint64_t st_full_waits, st_timed_ns, st_direct, st_pageable;
    uint64_t waits[TF__WAITS], nwaits, wait_total_ns;

    atomic_int stop;
    _Atomic uint64_t position;

    /* consumer side (next/seek/start/free are not called concurrently) */
    pthread_t thread;
    int running;
    uint64_t wait_t0; /* start of the wait in progress across timed-out calls (0: none) */
    int wait_ahead;
    uintptr_t static_last; /* stream of the previous static delivery (0: none) */
    tf__meter meter; /* the consumer's waits (engine/meter.h) */
    tf__gpu_meter gm; /* what the consumer's stream waited, on the GPU's clock (gpu_meter.c) */
    int gm_request;   /* a request for a batch is in progress (across timed-out calls) ... */
    int gm_mark;      /* ... with this mark (-1: not measured) */
    int gm_caller;    /* the request was marked by the caller, who marks the hand-off too ... */
    int gm_delivered; /* ... and has the batch: tf_device_loader_gpu_handoff records B */
};

/* ------------------------------------------------------------------------ */
/* small helpers                                                             */
/* ------------------------------------------------------------------------ */

void tf_device_config_init(tf_device_config *cfg) {
    if (!cfg) return;
    memset(cfg, 0, sizeof *cfg);
}

static int forked(const tf_device_loader *d) { return d->pid != getpid(); }

static int fail_forked(void) {
    return tf__seterr(-TF_ECUDA, "this device loader was created in another process: CUDA does not survive "
                                 "fork(); create the loader with a device in the process that trains");
}

/* Page-locked batch buffers for the engine (see "Host memory" above). */
static void *locked_alloc(size_t bytes, int *locked) {
    void *p = NULL;
    return tf_pinned_alloc(bytes, &p, locked) < 0 ? NULL : p;
}
static void locked_free(void *p, size_t bytes, int locked) { tf_pinned_free(p, bytes); }
static const tf__buffer_allocator locked_allocator = {locked_alloc, locked_free};

/* Give back the host batches whose copies have completed; slot `done` (or
 * -1) is known to have completed. Copy thread, or the consumer after a join. */
static void return_hosts(tf_device_loader *d, int done) {
    if (!d->ring) return;
    const tf__cudart *cu = d->cu;
    for (int i = 0; i < d->nslots; i++) {
        if (!d->hold[i]) continue;
        if (i != done) {
            tf__cuerr e = cu->EventQuery(d->ring->slots[i].copied);
            if (e != TF__CU_SUCCESS) {
                if (e != TF__CU_ERR_NOT_READY) cu->GetLastError();
                continue; /* still read by the DMA (or unknown: kept until free waits) */
            }
        }
        tf_batch_release(d->hold[i]);
        d->hold[i] = NULL;
    }
}

/* Error path of a direct copy: wait (host) until everything issued on the
 * copy stream so far has run. -1 if that cannot be known. */
static int fence(tf_device_loader *d, tf_device_slot *s) {
    const tf__cudart *cu = d->cu;
    int rc = cu->EventRecord(s->copied, d->ring->stream) == TF__CU_SUCCESS &&
                     cu->EventSynchronize(s->copied) == TF__CU_SUCCESS
                 ? 0
                 : -1;
    cu->GetLastError();
    return rc;
}

/* At free, copy thread stopped: wait for the copies that still read host
 * batches (an event wait on our own copies, at teardown), give them back. */
static void return_hosts_wait(tf_device_loader *d) {
    if (!d->ring) return;
    const tf__cudart *cu = d->cu;
    for (int i = 0; i < d->nslots; i++) {
        if (!d->hold[i]) continue;
        if (cu->EventSynchronize(d->ring->slots[i].copied) != TF__CU_SUCCESS) {
            cu->GetLastError(); /* the CUDA context failed: leak the buffer rather than risk it */
            d->hold[i] = NULL;
            continue;
        }
        tf_batch_release(d->hold[i]);
        d->hold[i] = NULL;
    }
}

/* mu held. Collect slot i's copy time if its events have completed. */
static void collect_timing(tf_device_loader *d, int i) {
    if (!d->timing[i]) return;
    const tf__cudart *cu = d->cu;
    tf__cuerr e = cu->EventQuery(d->t1[i]);
    if (e == TF__CU_ERR_NOT_READY) return;
    d->timing[i] = 0;
    float ms = 0;
    if (e == TF__CU_SUCCESS && cu->EventElapsedTime(&ms, d->t0[i], d->t1[i]) == TF__CU_SUCCESS && ms >= 0) {
        d->st_timed_ns += (uint64_t)((double)ms * 1e6);
        d->st_timed_bytes += d->timing_bytes[i];
    } else {
        cu->GetLastError();
    }
}

/* Publish an entry (copy thread). */
static void publish(tf_device_loader *d, const dentry *e, size_t bytes) {
    pthread_mutex_lock(&d->mu);
    dentry *t = &d->q[(d->qhead + d->qcount) % d->qcap];
    *t = *e;
    d->qcount++;
    if (e->slot) {
        int i = e->slot->index;
        d->timing[i] = d->t0[i] != NULL;
        d->timing_bytes[i] = bytes;
        d->st_copies++;
        d->st_h2d_bytes += bytes;
    }
    pthread_cond_broadcast(&d->ready_cv);
    pthread_mutex_unlock(&d->mu);
}

static void publish_error(tf_device_loader *d, int rc, const char *msg) {
    dentry e;
    memset(&e, 0, sizeof e);
    e.rc = rc;
    snprintf(e.err, sizeof e.err, "%s", msg && *msg ? msg : tf_strerror(rc));
    publish(d, &e, 0);
}

/* ------------------------------------------------------------------------ */
/* the copy thread                                                           */
/* ------------------------------------------------------------------------ */

/* The caller's static buffers, indexed by tf__seg_id. */
static void static_ptrs(const tf_device_static *s, void **p, size_t *cap) {
    p[TF__SEG_TOKENS] = s->tokens, cap[TF__SEG_TOKENS] = s->tokens_bytes;
    p[TF__SEG_POSITION_IDS] = s->position_ids, cap[TF__SEG_POSITION_IDS] = s->position_ids_bytes;
    p[TF__SEG_CU_SEQLENS] = s->cu_seqlens, cap[TF__SEG_CU_SEQLENS] = s->cu_seqlens_bytes;
    p[TF__SEG_NUM_SEQS] = s->num_seqs, cap[TF__SEG_NUM_SEQS] = s->num_seqs_bytes;
    p[TF__SEG_LOSS_MASK] = s->loss_mask, cap[TF__SEG_LOSS_MASK] = s->loss_mask_bytes;
    p[TF__SEG_INPUT_IDS] = s->input_ids, cap[TF__SEG_INPUT_IDS] = s->input_ids_bytes;
    p[TF__SEG_LABELS] = s->labels, cap[TF__SEG_LABELS] = s->labels_bytes;
    p[TF__SEG_CU_SEQLENS_PADDED] = s->cu_seqlens_padded, cap[TF__SEG_CU_SEQLENS_PADDED] = s->cu_seqlens_padded_bytes;
}

/* Buffers of our own as static buffers: the arrays at their slot offsets in
 * one allocation of a slot's size. */
static void static_own(tf_device_static *s, uint8_t *mem, const size_t *off, const size_t *cap) {
    void *p[TF__NSEGS];
    for (int j = 0; j < TF__NSEGS; j++) p[j] = cap[j] ? mem + off[j] : NULL;
    s->tokens = p[TF__SEG_TOKENS], s->tokens_bytes = cap[TF__SEG_TOKENS];
    s->position_ids = p[TF__SEG_POSITION_IDS], s->position_ids_bytes = cap[TF__SEG_POSITION_IDS];
    s->cu_seqlens = p[TF__SEG_CU_SEQLENS], s->cu_seqlens_bytes = cap[TF__SEG_CU_SEQLENS];
    s->num_seqs = p[TF__SEG_NUM_SEQS], s->num_seqs_bytes = cap[TF__SEG_NUM_SEQS];
    s->loss_mask = p[TF__SEG_LOSS_MASK], s->loss_mask_bytes = cap[TF__SEG_LOSS_MASK];
    s->input_ids = p[TF__SEG_INPUT_IDS], s->input_ids_bytes = cap[TF__SEG_INPUT_IDS];
    s->labels = p[TF__SEG_LABELS], s->labels_bytes = cap[TF__SEG_LABELS];
    s->cu_seqlens_padded = p[TF__SEG_CU_SEQLENS_PADDED], s->cu_seqlens_padded_bytes = cap[TF__SEG_CU_SEQLENS_PADDED];
}

/* Device pointer p of array j into the view. */
static void view_set(tf_device_batch_view *v, int j, void *p) {
    switch (j) {
    case TF__SEG_TOKENS: v->tokens = p; break;
    case TF__SEG_POSITION_IDS: v->position_ids = p; break;
    case TF__SEG_CU_SEQLENS: v->cu_seqlens = p; break;
    case TF__SEG_NUM_SEQS: v->num_seqs = p; break;
    case TF__SEG_LOSS_MASK: v->loss_mask = p; break;
    case TF__SEG_INPUT_IDS: v->input_ids = p; break;
    case TF__SEG_LABELS: v->labels = p; break;
    case TF__SEG_CU_SEQLENS_PADDED: v->cu_seqlens_padded = p; break;
    default: break;
    }
}

/* Destroy the events made by setup (device current). */
static void destroy_events(tf_device_loader *d) {
    const tf__cudart *cu = d->cu;
    for (int i = 0; i < d->nslots; i++) {
        if (d->t0 && d->t0[i]) cu->EventDestroy(d->t0[i]);
        if (d->t1 && d->t1[i]) cu->EventDestroy(d->t1[i]);
    }
    free(d->t0);
    free(d->t1);
    d->t0 = d->t1 = NULL;
    if (d->static_mem) {
        /* The consumer's last reads (queued before its last release) and our
         * copies into them (before the slots' release events, which the
         * ring's teardown has waited for) are done before the memory goes. */
        if (d->static_done && cu->EventSynchronize(d->static_done) != TF__CU_SUCCESS) cu->GetLastError();
        cu->Free(d->static_mem);
    }
    d->static_mem = NULL;
    if (d->static_ready) cu->EventDestroy(d->static_ready);
    if (d->static_consumed) cu->EventDestroy(d->static_consumed);
    if (d->static_done) cu->EventDestroy(d->static_done);
    d->static_ready = d->static_consumed = d->static_done = NULL;
    cu->GetLastError();
}

/* First batch: fix the layout (every array the loader makes, at the room
 * the loader gives it, so that any later batch fits), check or allocate the
 * static buffers, allocate the ring and the events. Copy thread, device
 * current. */
static int setup(tf_device_loader *d, const tf_batch_view *v, const tf__batch_seg *seg) {
    const tf__cudart *cu = d->cu;
    size_t cap[TF__NSEGS], off[TF__NSEGS];
    tf_device_seg segs[TF__NSEGS];
    for (int j = 0; j < TF__NSEGS; j++) segs[j].host = NULL, segs[j].bytes = cap[j] = seg[j].cap;
    size_t need = tf_device_packed_size(segs, TF__NSEGS, off);
    if (d->is_static && !d->own_static) {
        void *p[TF__NSEGS];
        size_t have[TF__NSEGS];
        static_ptrs(&d->stat, p, have);
        for (int j = 0; j < TF__NSEGS; j++) {
            if (!cap[j]) continue;
            if (!p[j] || have[j] < cap[j])
                return tf__seterr(-EINVAL,
                                  "static buffers: %s needs a device buffer of %zu bytes (%llu rows, seq_len %llu%s), "
                                  "%s; allocate it on device %d and pass it in tf_device_static",
                                  tf__seg_names[j], cap[j], (unsigned long long)v->rows, (unsigned long long)v->seq_len,
                                  v->cp_size > 1 ? (v->thd ? ", a context-parallel share in the THD layout"
                                                           : ", a context-parallel share")
                                                 : "",
                                  p[j] ? "a smaller one was given" : "none was given", d->device);
        }
    }
    tf_device_ring *r = NULL;
    /* no staging unless a pageable batch ever needs it */
    TF_TRY(tf__device_ring_create(d->device, need ? need : 1, d->nslots, 0, &r));
    d->t0 = calloc((size_t)d->nslots, sizeof *d->t0);
    d->t1 = calloc((size_t)d->nslots, sizeof *d->t1);
    int rc = 0;
    if (!d->t0 || !d->t1) {
        rc = tf__seterr(-ENOMEM, "device loader: out of host memory");
        goto fail;
    }
    for (int i = 0; i < d->nslots; i++) {
        tf__cuerr e;
        if ((e = cu->EventCreateWithFlags(&d->t0[i], TF__CU_EVENT_DEFAULT)) != TF__CU_SUCCESS ||
            (e = cu->EventCreateWithFlags(&d->t1[i], TF__CU_EVENT_DEFAULT)) != TF__CU_SUCCESS) {
            rc = tf__cuda_fail(cu, e, "cudaEventCreateWithFlags (copy timing)", "");
            goto fail;
        }
    }
    if (d->is_static) {
        tf__cuerr e;
        if ((e = cu->EventCreateWithFlags(&d->static_ready, TF__CU_EVENT_DISABLE_TIMING)) != TF__CU_SUCCESS ||
            (e = cu->EventCreateWithFlags(&d->static_consumed, TF__CU_EVENT_DISABLE_TIMING)) != TF__CU_SUCCESS ||
            (d->own_static && (e = cu->EventCreateWithFlags(&d->static_done, TF__CU_EVENT_DISABLE_TIMING |
                                                                                 TF__CU_EVENT_BLOCKING_SYNC)) !=
                                  TF__CU_SUCCESS)) {
            rc = tf__cuda_fail(cu, e, "cudaEventCreateWithFlags (static buffers)", "");
            goto fail;
        }
    }
    if (d->own_static) {
        tf__cuerr e = cu->Malloc(&d->static_mem, need ? need : 1);
        if (e != TF__CU_SUCCESS) {
            d->static_mem = NULL;
            char what[96];
            snprintf(what, sizeof what, "cudaMalloc of %zu bytes (the static buffers)", need);
            rc = tf__cuda_fail(cu, e, what, "lower batch_size or seq_len, or free GPU memory");
            goto fail;
        }
        static_own(&d->stat, d->static_mem, off, cap);
    }
    pthread_mutex_lock(&d->mu);
    d->dtype = v->dtype;
    d->rows = v->rows;
    d->seq_len = v->seq_len;
    d->cp_size = v->cp_size;
    d->thd = v->thd;
    memcpy(d->seg_cap, cap, sizeof cap);
    memcpy(d->seg_off, off, sizeof off);
    d->slot_need = need;
    d->ring = r;
    d->have_layout = 1;
    pthread_mutex_unlock(&d->mu);
    return 0;
fail:;
    char msg[TF__ERRMSG];
    snprintf(msg, sizeof msg, "%s", tf_last_error());
    destroy_events(d);
    tf_device_ring_free(r);
    return tf__seterr(rc, "%s", msg);
}

/* A slot for the next copy. 0, TF__STOPPED, or an error. */
static int get_slot(tf_device_loader *d, tf_device_slot **s) {
    for (;;) {
        if (atomic_load(&d->stop)) return TF__STOPPED;
        pthread_mutex_lock(&d->mu);
        uint64_t seen = d->releases;
        pthread_mutex_unlock(&d->mu);
        /* wait = 1: a slot pending release is waited for on its event. */
        int rc = tf_device_ring_acquire(d->ring, 1, s);
        if (rc != -EBUSY) return rc;
        /* Every slot is queued here or held by the consumer. */
        pthread_mutex_lock(&d->mu);
        d->st_full_waits++;
        d->starved = 1;
        d->starved_seen = seen;
        pthread_cond_broadcast(&d->ready_cv);
        while (!atomic_load(&d->stop) && d->releases == seen) pthread_cond_wait(&d->feed_cv, &d->mu);
        d->starved = 0;
        pthread_mutex_unlock(&d->mu);
    }
}

/* The next host batch from the engine, in slices. */
static int fetch(tf_device_loader *d, tf_batch **hb) {
    for (;;) {
        int rc = tf_loader_next_timed(d->l, hb, TF__SLICE_NS);
        if (rc != -TF_ENOTREADY) return rc;
        if (atomic_load(&d->stop)) return TF__STOPPED;
    }
}

/* Step 1 of a batch: a device slot (once the ring exists), then the next
 * host batch; the slot first, so that the copy is not held up by a slot once
 * the batch exists. 0, TF__STOPPED (nothing held), or an error (what was
 * taken is left in *s and *hb for the caller to give back). */
static int take(tf_device_loader *d, tf_device_slot **s, tf_batch **hb) {
    if (d->ring) {
        int rc = get_slot(d, s);
        if (rc != 0) return rc;
    }
    int rc = fetch(d, hb);
    if (rc == TF__STOPPED) {
        tf_device_slot_release(*s, TF_DEVICE_STREAM_NONE);
        *s = NULL;
    }
    return rc;
}

/* The batch has the layout the ring was made for (a loader's batches all
 * have one); *bytes is what its copy moves. */
static int check_layout(const tf_device_loader *d, const tf_batch_view *v, const tf__batch_seg *seg, size_t *bytes) {
    size_t n = 0;
    int same = v->rows == d->rows && v->seq_len == d->seq_len && v->dtype == d->dtype;
    for (int j = 0; j < TF__NSEGS; j++) {
        same &= seg[j].cap == d->seg_cap[j];
        n += seg[j].bytes;
    }
    *bytes = n;
    if (!same) return tf__seterr(-EINVAL, "device loader: batch shape changed (the loader was reconfigured?)");
    return 0;
}

/* Slot i came back from the ring, so its last copy is over: the host batch
 * that copy read goes back to the engine, and its timing is collected (if
 * its event still says otherwise, the sample is dropped). */
static void reclaim_slot(tf_device_loader *d, int i) {
    return_hosts(d, i);
    pthread_mutex_lock(&d->mu);
    collect_timing(d, i);
    d->timing[i] = 0;
    pthread_mutex_unlock(&d->mu);
}

/* The queue entry of a batch (all but its slot) and its arrays to copy:
 * each to its place in the slot, under THD only the prefix the batch
 * filled. The counts are read here, while the host batch is ours. */
static void make_entry(dentry *e, tf_device_seg *segs, const tf_batch_view *v, const tf__batch_seg *seg,
                       uint64_t pos_after) {
    memset(e, 0, sizeof *e);
    e->position = v->position;
    e->pos_after = pos_after;
    if (v->cp_size > 1) {
        e->num_tokens = v->num_tokens;
        if (v->thd) {
            e->thd_seqs = v->num_seqs[0];
            e->max_seqlen = v->max_seqlen;
        }
    }
    for (int j = 0; j < TF__NSEGS; j++) {
        segs[j].host = seg[j].host;
        segs[j].bytes = e->used[j] = seg[j].bytes;
    }
}

/* Page-locked engine buffer: the DMA reads it in place, and the host batch
 * stays attached to the slot (hold[]) until the copy is seen complete. On
 * failure *hb is the caller's to give back once the copy stream has passed
 * it (an earlier array's copy may be in flight), or NULL when that cannot be
 * told: leaked rather than risked. */
static int issue_direct(tf_device_loader *d, tf_device_slot *s, tf_batch **hb, const tf_device_seg *segs) {
    int i = s->index;
    int rc = tf__device_slot_issue(s, segs, d->seg_off, TF__NSEGS, 0, d->t0[i], d->t1[i]);
    if (rc < 0) {
        if (fence(d, s) < 0) *hb = NULL;
        return rc;
    }
    d->hold[i] = *hb;
    *hb = NULL;
    return 0;
}

/* Pageable engine buffer: into the slot's pinned staging, then the host
 * batch goes straight back to the engine, then the copy. */
static int issue_staged(tf_device_loader *d, tf_device_slot *s, tf_batch **hb, tf_device_seg *segs, size_t bytes) {
    int rc = tf__device_ring_ensure_staging(d->ring);
    if (rc < 0) return rc;
    for (int j = 0; j < TF__NSEGS; j++) {
        if (segs[j].bytes) memcpy(s->host + d->seg_off[j], segs[j].host, segs[j].bytes);
        segs[j].host = s->host + d->seg_off[j];
    }
    tf_batch_release(*hb);
    *hb = NULL;
    pthread_mutex_lock(&d->mu);
    d->st_staging++;
    d->st_staging_bytes += bytes;
    d->st_pageable += !d->ring->staging_pinned;
    pthread_mutex_unlock(&d->mu);
    int i = s->index;
    return tf__device_slot_issue(s, segs, d->seg_off, TF__NSEGS, 0, d->t0[i], d->t1[i]);
}

/* One batch: slot and host batch, copy, publish. Returns 1 to go on, 0 when
 * asked to stop, -1 when an error or the end was published. */
static int copy_one(tf_device_loader *d) {
    tf_device_slot *s = NULL;
    tf_batch *hb = NULL;
    int rc = take(d, &s, &hb);
    if (rc == TF__STOPPED) return 0;
    if (rc < 0) goto fail;
    uint64_t pos_after = tf_loader_position(d->l);
    tf_batch_view v;
    tf_batch_get_view(hb, &v);
    tf__batch_seg seg[TF__NSEGS];
    tf__batch_segments(hb, seg);
    if (!d->ring) { /* the first batch: its layout makes the ring, then the slot */
        rc = setup(d, &v, seg);
        if (rc == 0) rc = get_slot(d, &s);
        if (rc == TF__STOPPED) {
            tf_batch_release(hb);
            return 0;
        }
        if (rc < 0) goto fail;
    }
    size_t bytes;
    if ((rc = check_layout(d, &v, seg, &bytes)) < 0) goto fail;
    reclaim_slot(d, s->index);
    dentry e;
    tf_device_seg segs[TF__NSEGS];
    make_entry(&e, segs, &v, seg, pos_after);
    int direct = tf__batch_locked(hb);
    rc = direct ? issue_direct(d, s, &hb, segs) : issue_staged(d, s, &hb, segs, bytes);
    if (rc < 0) goto fail;
    pthread_mutex_lock(&d->mu);
    d->st_direct += direct;
    pthread_mutex_unlock(&d->mu);
    e.slot = s;
    publish(d, &e, bytes);
    return_hosts(d, -1);
    return 1;
fail:;
    char msg[TF__ERRMSG];
    snprintf(msg, sizeof msg, "%s", tf_last_error());
    tf_batch_release(hb);
    if (s) tf_device_slot_release(s, TF_DEVICE_STREAM_NONE); /* still filling: straight back */
    publish_error(d, rc, msg);
    return -1;
}

static void *copier_main(void *arg) {
    tf_device_loader *d = arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL); /* Ctrl-C goes to the consumer */
    /* This thread's current device, once (the ring's calls also push it). */
    tf__cuerr e = d->cu->SetDevice(d->device);
    if (e != TF__CU_SUCCESS) {
        tf__cuda_fail(d->cu, e, "cudaSetDevice (device loader copy thread)", "check the device index");
        publish_error(d, -TF_ECUDA, tf_last_error());
        return NULL;
    }
    pthread_mutex_lock(&d->mu);
    for (;;) {
        while (!atomic_load(&d->stop) && d->qcount >= d->prefetch) pthread_cond_wait(&d->feed_cv, &d->mu);
        if (atomic_load(&d->stop)) break;
        pthread_mutex_unlock(&d->mu);
        int go = copy_one(d);
        pthread_mutex_lock(&d->mu);
        if (go <= 0) break;
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* consumer side                                                             */
/* ------------------------------------------------------------------------ */

static int start_thread(tf_device_loader *d) {
    if (d->running) return 0;
    atomic_store(&d->stop, 0);
    int e = pthread_create(&d->thread, NULL, copier_main, d);
    if (e) return tf__seterr(-e, "device loader: cannot start its copy thread (%s)", strerror(e));
    d->running = 1;
    return 0;
}

static void stop_thread(tf_device_loader *d) {
    if (!d->running) return;
    atomic_store(&d->stop, 1);
    pthread_mutex_lock(&d->mu);
    pthread_cond_broadcast(&d->feed_cv);
    pthread_mutex_unlock(&d->mu);
    pthread_join(d->thread, NULL);
    d->running = 0;
    atomic_store(&d->stop, 0);
}

/* Copy thread stopped: drop every queued entry; their slots go back on the
 * copy stream (after their copies). */
static void drop_queue(tf_device_loader *d) {
    tf_device_slot *drop[64];
    for (;;) {
        int n = 0;
        pthread_mutex_lock(&d->mu);
        while (d->qcount && n < 64) {
            dentry *e = &d->q[d->qhead];
            if (e->slot) drop[n++] = e->slot;
            d->qhead = (d->qhead + 1) % d->qcap;
            d->qcount--;
        }
        d->starved = 0;
        int more = d->qcount > 0;
        pthread_mutex_unlock(&d->mu);
        for (int i = 0; i < n; i++) tf_device_slot_release(drop[i], TF_DEVICE_STREAM_NONE);
        if (!more) break;
    }
}

/* Stop, drop what was copied ahead, and put the engine at pos. */
static int reset_at(tf_device_loader *d, uint64_t pos) {
    stop_thread(d);
    drop_queue(d);
    d->wait_t0 = 0;
    return tf_loader_seek(d->l, pos);
}

static void destroy(tf_device_loader *d) {
    const tf__cudart *cu = d->cu;
    if (d->ring || d->gm.made) {
        int prev = -1, have = tf__cuda_push_device(cu, d->device, &prev) == 0;
        if (d->ring) {
            tf_device_ring_free(d->ring); /* every slot is back: waits on its copy stream, frees */
            destroy_events(d);
        }
        tf__gpu_meter_destroy(&d->gm, cu);
        if (have) tf__cuda_pop_device(cu, d->device, prev);
    } else {
        tf__gpu_meter_destroy(&d->gm, NULL);
    }
    while (d->free_handles) {
        tf_device_batch *n = d->free_handles->next;
        free(d->free_handles);
        d->free_handles = n;
    }
    free(d->q);
    free(d->timing);
    free(d->timing_bytes);
    free(d->hold);
    pthread_cond_destroy(&d->feed_cv);
    pthread_cond_destroy(&d->ready_cv);
    pthread_mutex_destroy(&d->mu);
    tf__meter_destroy(&d->meter);
    free(d);
}

static void unref(tf_device_loader *d) {
    pthread_mutex_lock(&d->mu);
    int last = --d->refs == 0;
    pthread_mutex_unlock(&d->mu);
    if (last) destroy(d);
}

int tf_device_loader_create(tf_loader *l, const tf_device_config *cfg, tf_device_loader **out) {
    TF_NEED_ARG(out);
    *out = NULL;
    if (!l) TF_FAIL(-EINVAL, "tf_device_loader_create: the loader must not be NULL");
    tf_device_config def;
    if (!cfg) {
        tf_device_config_init(&def);
        cfg = &def;
    }
    int prefetch = cfg->prefetch_batches ? cfg->prefetch_batches : 2;
    if (prefetch < 1 || prefetch > 256)
        TF_FAIL(-EINVAL, "device prefetch: expected 1..256 batches (0 = default 2), found %d", cfg->prefetch_batches);
    int slots = cfg->device_slots ? cfg->device_slots : prefetch + 2;
    if (slots < prefetch + 1 || slots > 1024)
        TF_FAIL(-EINVAL,
                "device slots: expected prefetch + 1 (%d) to 1024 (0 = prefetch + 2), found %d: the consumer needs "
                "at least one slot beside the batches copied ahead",
                prefetch + 1, cfg->device_slots);
    if (cfg->device < 0) TF_FAIL(-EINVAL, "CUDA device index must be >= 0, got %d", cfg->device);
    const tf__cudart *cu = tf__cuda_load();
    if (!cu) TF_FAIL(-TF_ECUDA, "CUDA is not available: %s", tf__cuda_why());
    int n = 0;
    TF_TRY(tf_cuda_device_count(&n));
    if (n == 0)
        TF_FAIL(-TF_ECUDA,
                "CUDA: no CUDA device is visible to this process (%s); check CUDA_VISIBLE_DEVICES and nvidia-smi, "
                "or use the CPU",
                tf__cuda_why());
    if (cfg->device >= n)
        TF_FAIL(-EINVAL,
                "CUDA device index %d is out of range: this process sees %d device(s) (0..%d); check LOCAL_RANK / "
                "the device string and CUDA_VISIBLE_DEVICES",
                cfg->device, n, n - 1);

    tf_device_loader *d = calloc(1, sizeof *d);
    if (!d) return -ENOMEM;
    d->l = l;
    d->cu = cu;
    d->device = cfg->device;
    d->prefetch = prefetch;
    d->nslots = slots;
    d->qcap = prefetch + 1;
    d->q = calloc((size_t)d->qcap, sizeof *d->q);
    d->timing = calloc((size_t)slots, 1);
    d->timing_bytes = calloc((size_t)slots, sizeof *d->timing_bytes);
    d->hold = calloc((size_t)slots, sizeof *d->hold);
    if (!d->q || !d->timing || !d->timing_bytes || !d->hold) {
        free(d->q);
        free(d->hold);
        free(d->timing);
        free(d->timing_bytes);
        free(d);
        return -ENOMEM;
    }
    if (cfg->static_buffers) {
        d->is_static = 1;
        d->stat = *cfg->static_buffers;
    } else if (cfg->alloc_static) {
        d->is_static = d->own_static = 1; /* d->stat is filled when the layout is known */
    }
    d->pid = getpid();
    d->refs = 1;
    pthread_mutex_init(&d->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&d->feed_cv, NULL);
    pthread_cond_init(&d->ready_cv, &ca);
    pthread_condattr_destroy(&ca);
    atomic_init(&d->stop, 0);
    atomic_init(&d->position, tf_loader_position(l));
    tf__meter_init(&d->meter);
    tf__gpu_meter_init(&d->gm);
    d->gm_mark = -1;
    /* From now on the engine assembles batches in page-locked buffers. */
    tf__loader_set_allocator(l, &locked_allocator);
    *out = d;
    return 0;
}

int tf_device_loader_start(tf_device_loader *d) {
    TF_NEED_ARG(d);
    if (forked(d)) return fail_forked();
    return start_thread(d);
}

void tf_device_loader_free(tf_device_loader *d) {
    if (!d) return;
    if (forked(d)) return; /* the parent's threads and CUDA state are not ours */
    int fetched = d->running;
    stop_thread(d);
    drop_queue(d);
    return_hosts_wait(d); /* host batches still read by copies in flight */
    /* The engine went ahead of the consumer: put it back, so that a caller
     * who goes on with the plain loader continues exactly (with ordinary
     * buffers again: page-locked ones are freed as they come back). */
    if (fetched) tf_loader_seek(d->l, atomic_load(&d->position));
    tf__loader_set_allocator(d->l, NULL);
    unref(d);
}

uint64_t tf_device_loader_position(const tf_device_loader *d) {
    return d ? atomic_load(&((tf_device_loader *)d)->position) : 0;
}

int tf_device_loader_seek(tf_device_loader *d, uint64_t pos) {
    TF_NEED_ARG(d);
    if (forked(d)) return fail_forked();
    uint64_t cur = atomic_load(&d->position);
    int rc = reset_at(d, pos);
    if (rc < 0) {
        char msg[TF__ERRMSG];
        snprintf(msg, sizeof msg, "%s", tf_last_error());
        tf_loader_seek(d->l, cur); /* a refused position changes nothing */
        return tf__seterr(rc, "%s", msg);
    }
    atomic_store(&d->position, pos);
    d->static_last = 0;
    return 0;
}

/* Static buffers: queue the copies slot -> static buffers on `stream` (the
 * part of each array that the batch `e` filled). */
static int deliver_static(tf_device_loader *d, const dentry *ent, uintptr_t stream) {
    tf_device_slot *s = ent->slot;
    const tf__cudart *cu = d->cu;
    int prev = -1;
    TF_TRY(tf__cuda_push_device(cu, d->device, &prev));
    int rc = 0;
    tf__cuerr e = TF__CU_SUCCESS;
    tf__custream st = (tf__custream)stream;
    if (d->static_last && d->static_last != stream) {
        /* The previous batch may still be read by work on the other stream. */
        if ((e = cu->EventRecord(d->static_consumed, (tf__custream)d->static_last)) != TF__CU_SUCCESS ||
            (e = cu->StreamWaitEvent(st, d->static_consumed, TF__CU_EVENT_WAIT_DEFAULT)) != TF__CU_SUCCESS) {
            rc = tf__cuda_fail(cu, e, "ordering static buffers after the previous stream", "");
            goto done;
        }
    }
    if ((e = cu->StreamWaitEvent(st, s->copied, TF__CU_EVENT_WAIT_DEFAULT)) != TF__CU_SUCCESS) {
        rc = tf__cuda_fail(cu, e, "cudaStreamWaitEvent (consumer stream on a batch's copy)",
                           "pass a valid stream of the loader's device");
        goto done;
    }
    void *dst[TF__NSEGS];
    size_t cap[TF__NSEGS];
    static_ptrs(&d->stat, dst, cap);
    for (int j = 0; j < TF__NSEGS; j++) {
        if (!ent->used[j]) continue;
        e = cu->MemcpyAsync(dst[j], (uint8_t *)s->dev + d->seg_off[j], ent->used[j], TF__CU_MEMCPY_D2D, st);
        if (e != TF__CU_SUCCESS) {
            char what[128];
            snprintf(what, sizeof what, "cudaMemcpyAsync of %s into its static buffer", tf__seg_names[j]);
            rc = tf__cuda_fail(cu, e, what, "check that the static buffers are device memory of the loader's device");
            goto done;
        }
    }
    if ((e = cu->EventRecord(d->static_ready, st)) != TF__CU_SUCCESS) {
        rc = tf__cuda_fail(cu, e, "cudaEventRecord (static buffers ready)", "");
        goto done;
    }
    d->static_last = stream;
done:
    tf__cuda_pop_device(cu, d->device, prev);
    return rc;
}

static int next_timed(tf_device_loader *d, uintptr_t stream, tf_device_batch **out, uint64_t timeout_ns) {
    TF_NEED_ARG_OF("tf_device_loader_next", out);
    *out = NULL;
    TF_NEED_ARG_OF("tf_device_loader_next", d);
    if (forked(d)) return fail_forked();
    if (d->is_static && (stream == TF_DEVICE_STREAM_NONE || stream == 0))
        TF_FAIL(-EINVAL, "device loader with static buffers: next() needs the consumer's stream (the copies into "
                         "the static buffers are queued there), not TF_DEVICE_STREAM_NONE or 0");
    int rc = start_thread(d);
    if (rc < 0) return rc;

    pthread_mutex_lock(&d->mu);
    if (!d->wait_t0) { /* a new request (not the continuation of a timed-out one) */
        d->wait_t0 = tf__now_ns();
        d->wait_ahead = d->qcount > 0 && d->q[d->qhead].slot != NULL;
    }
    struct timespec dl;
    if (timeout_ns != UINT64_MAX) {
        clock_gettime(CLOCK_MONOTONIC, &dl);
        uint64_t ns = (uint64_t)dl.tv_nsec + timeout_ns % 1000000000ull;
        dl.tv_sec += (time_t)(timeout_ns / 1000000000ull + ns / 1000000000ull);
        dl.tv_nsec = (long)(ns % 1000000000ull);
    }
    while (d->qcount == 0) {
        /* Starved with no release since: every slot is held by the consumer. */
        if (d->starved && d->releases == d->starved_seen) {
            pthread_mutex_unlock(&d->mu);
            d->wait_t0 = 0;
            TF_FAIL(-EBUSY,
                    "all %d device slots are held by the consumer (%d copied ahead + %d to hold): release the "
                    "batches of old steps (drop their tensors), or give the loader more device slots",
                    d->nslots, d->prefetch, d->nslots - d->prefetch);
        }
        if (timeout_ns == UINT64_MAX) {
            pthread_cond_wait(&d->ready_cv, &d->mu);
        } else if (pthread_cond_timedwait(&d->ready_cv, &d->mu, &dl) == ETIMEDOUT && d->qcount == 0) {
            pthread_mutex_unlock(&d->mu);
            return -TF_ENOTREADY;
        }
    }
    dentry e = d->q[d->qhead];
    pthread_mutex_unlock(&d->mu);

    if (e.rc == -TF_EEOF) { /* stays at the head: every later call says the same */
        d->wait_t0 = 0;
        return tf__seterr(e.rc, "%s", e.err);
    }
    if (e.rc) { /* an error: the position stays; the next call retries this batch */
        pthread_mutex_lock(&d->mu);
        d->qhead = (d->qhead + 1) % d->qcap;
        d->qcount--;
        pthread_mutex_unlock(&d->mu);
        reset_at(d, atomic_load(&d->position));
        return tf__seterr(e.rc, "%s", e.err);
    }
    tf_device_slot *s = e.slot;
    if (d->is_static) rc = deliver_static(d, &e, stream);
    else if (stream != TF_DEVICE_STREAM_NONE) rc = tf_device_slot_wait(s, stream);
    if (rc < 0) { /* the batch stays at the head */
        d->wait_t0 = 0;
        return rc;
    }

    pthread_mutex_lock(&d->mu);
    d->qhead = (d->qhead + 1) % d->qcap;
    d->qcount--;
    pthread_cond_signal(&d->feed_cv);
    uint64_t w = tf__now_ns() - d->wait_t0;
    d->wait_t0 = 0;
    d->waits[d->nwaits % TF__WAITS] = w;
    d->nwaits++;
    d->wait_total_ns += w;
    d->st_batches++;
    d->st_ahead += d->wait_ahead;
    tf_device_batch *b = d->free_handles;
    if (b) d->free_handles = b->next;
    if (b || (b = calloc(1, sizeof *b))) {
        d->refs++;
        d->held++;
    }
    pthread_mutex_unlock(&d->mu);
    if (!b) {
        tf_device_slot_release(s, d->is_static ? stream : TF_DEVICE_STREAM_NONE);
        return tf__seterr(-ENOMEM, "device loader: out of host memory");
    }
    atomic_store(&d->position, e.pos_after);

    memset(b, 0, sizeof *b);
    b->d = d;
    tf_device_batch_view *v = &b->view;
    v->dtype = d->dtype;
    v->rows = d->rows;
    v->seq_len = d->seq_len;
    v->position = e.position;
    v->device = d->device;
    v->cp_size = d->cp_size;
    v->thd = d->thd;
    v->num_tokens = e.num_tokens;
    v->thd_seqs = e.thd_seqs;
    v->max_seqlen = e.max_seqlen;
    void *p[TF__NSEGS];
    if (d->is_static) {
        size_t cap[TF__NSEGS];
        static_ptrs(&d->stat, p, cap);
        v->ready_event = (uintptr_t)d->static_ready;
        b->waited = stream;
        /* The slot's data is in the caller's buffers once the copies queued
         * on `stream` have run: back to the ring on that stream. */
        tf_device_slot_release(s, stream);
    } else {
        for (int j = 0; j < TF__NSEGS; j++) p[j] = (uint8_t *)s->dev + d->seg_off[j];
        v->ready_event = (uintptr_t)s->copied;
        b->slot = s;
        b->waited = stream;
    }
    for (int j = 0; j < TF__NSEGS; j++)
        if (d->seg_cap[j]) view_set(v, j, p[j]);
    *out = b;
    return 0;
}

/* A mark of the GPU-clock meter on the consumer's stream (gpu_meter.c),
 * device current: at the first call for a batch (the request: A, which
 * completes when the stream has run what was queued before the consumer
 * asked) and once the hand-off is queued there (B). A call that timed out
 * keeps the request's mark; any other failure drops it. A caller that marks
 * the request itself (tf_device_loader_gpu_request) marks the hand-off too. */
static void gpu_mark(tf_device_loader *d, uintptr_t stream, int leave, int delivered) {
    int prev = -1, pushed = 0;
    if (stream != TF_DEVICE_STREAM_NONE && !d->gm.off) {
        pushed = tf__cuda_push_device(d->cu, d->device, &prev) == 0;
        if (!pushed) d->cu->GetLastError();
    }
    if (!leave) {
        d->gm_mark = pushed || stream == TF_DEVICE_STREAM_NONE ? tf__gpu_meter_begin(&d->gm, d->cu, stream) : -1;
        d->gm_request = 1;
    } else {
        tf__gpu_meter_end(&d->gm, d->cu, d->gm_mark, stream, delivered && pushed);
        d->gm_request = d->gm_caller = d->gm_delivered = 0;
        d->gm_mark = -1;
    }
    if (pushed) tf__cuda_pop_device(d->cu, d->device, prev);
}

/* A batch delivered whose hand-off the caller never marked: not measured. */
static void gpu_drop_delivered(tf_device_loader *d) {
    if (!d->gm_delivered) return;
    tf__gpu_meter_end(&d->gm, d->cu, d->gm_mark, TF_DEVICE_STREAM_NONE, 0);
    tf__gpu_meter_skip(&d->gm);
    d->gm_request = d->gm_caller = d->gm_delivered = 0;
    d->gm_mark = -1;
}

int tf_device_loader_gpu_request(tf_device_loader *d, uintptr_t stream) {
    TF_NEED_ARG(d);
    if (forked(d)) return fail_forked();
    gpu_drop_delivered(d);
    if (d->gm_request) return 0; /* a request in progress (a next() that timed out) keeps its mark */
    gpu_mark(d, stream, 0, 0);
    d->gm_caller = 1;
    return 0;
}

int tf_device_loader_gpu_handoff(tf_device_loader *d, uintptr_t stream) {
    TF_NEED_ARG(d);
    if (forked(d)) return fail_forked();
    if (d->gm_delivered) gpu_mark(d, stream, 1, 1);
    return 0;
}

/* next_timed between the data-wait meters' marks: the host's (engine/meter.h;
 * batches ready ahead: those whose copy was issued behind the one delivered)
 * and the GPU's. */
int tf_device_loader_next_timed(tf_device_loader *d, uintptr_t stream, tf_device_batch **out, uint64_t timeout_ns) {
    int own = d && !forked(d);
    if (own) {
        tf__meter_enter(&d->meter);
        gpu_drop_delivered(d);
        if (!d->gm_request) gpu_mark(d, stream, 0, 0);
    }
    int rc = next_timed(d, stream, out, timeout_ns);
    if (own) {
        uint32_t ahead = 0;
        if (!rc) {
            pthread_mutex_lock(&d->mu);
            ahead = (uint32_t)d->qcount;
            pthread_mutex_unlock(&d->mu);
        }
        if (rc == 0 && d->gm_caller)
            d->gm_delivered = 1; /* the caller marks the hand-off once the batch is in its hands */
        else if (rc != -TF_ENOTREADY)
            gpu_mark(d, stream, 1, rc == 0);
        tf__meter_leave(&d->meter, rc, ahead);
    }
    return rc;
}

void tf_device_loader_get_meter(const tf_device_loader *d, uint32_t window, tf_meter *m) {
    if (!m) return;
    memset(m, 0, sizeof *m);
    if (d) tf__meter_get(&((tf_device_loader *)d)->meter, window, m);
}

int tf_device_loader_get_gpu_meter(const tf_device_loader *cd, uint32_t window, tf_meter *m, uint64_t *pending) {
    if (m) memset(m, 0, sizeof *m);
    if (pending) *pending = 0;
    TF_NEED_ARG_OF("tf_device_loader_get_gpu_meter", cd);
    TF_NEED_ARG_OF("tf_device_loader_get_gpu_meter", m);
    tf_device_loader *d = (tf_device_loader *)cd;
    if (forked(d)) return fail_forked();
    char why[sizeof d->gm.why];
    uint64_t unmeasured = 0;
    tf__gpu_meter_get(&d->gm, d->cu, window, m, pending, &unmeasured, why, sizeof why);
    if (why[0]) return tf__seterr(-TF_ECUDA, "%s", why);
    return 0;
}

int tf_device_loader_next(tf_device_loader *d, uintptr_t stream, tf_device_batch **out) {
    return tf_device_loader_next_timed(d, stream, out, UINT64_MAX);
}

void tf_device_batch_get_view(const tf_device_batch *b, tf_device_batch_view *view) {
    if (!view) return;
    if (!b) {
        memset(view, 0, sizeof *view);
        return;
    }
    *view = b->view;
}

int tf_device_batch_wait(tf_device_batch *b, uintptr_t stream) {
    TF_NEED_ARG(b);
    if (stream == TF_DEVICE_STREAM_NONE) return 0;
    tf_device_loader *d = b->d;
    int rc;
    if (b->slot) {
        rc = tf_device_slot_wait(b->slot, stream);
    } else {
        const tf__cudart *cu = d->cu;
        int prev = -1;
        TF_TRY(tf__cuda_push_device(cu, d->device, &prev));
        tf__cuerr e = cu->StreamWaitEvent((tf__custream)stream, d->static_ready, TF__CU_EVENT_WAIT_DEFAULT);
        rc = e == TF__CU_SUCCESS ? 0 : tf__cuda_fail(cu, e, "cudaStreamWaitEvent (on static buffers)", "");
        tf__cuda_pop_device(cu, d->device, prev);
    }
    if (rc == 0) b->waited = stream;
    return rc;
}

int tf_device_batch_synchronize(tf_device_batch *b) {
    TF_NEED_ARG(b);
    const tf__cudart *cu = b->d->cu;
    tf__cuerr e = cu->EventSynchronize((tf__cuevent)b->view.ready_event);
    if (e != TF__CU_SUCCESS) return tf__cuda_fail(cu, e, "cudaEventSynchronize (a batch's ready event)", "");
    return 0;
}

int tf_device_batch_release(tf_device_batch *b, uintptr_t stream) {
    if (!b) return 0;
    tf_device_loader *d = b->d;
    int rc = 0;
    if (b->slot) {
        /* "released" completing must imply the copy completed: a stream that
         * never waited on the copy waits now (on the device). */
        if (stream != TF_DEVICE_STREAM_NONE && stream != b->waited) rc = tf_device_slot_wait(b->slot, stream);
        int rc2 = tf_device_slot_release(b->slot, rc < 0 ? TF_DEVICE_STREAM_NONE : stream);
        if (rc == 0) rc = rc2;
    } else if (d->own_static) {
        /* Our static buffers go with the last handle: not before the work
         * queued where it is released (else where it was delivered) has run
         * (the event is waited on then). */
        const tf__cudart *cu = d->cu;
        int prev = -1;
        if (stream == TF_DEVICE_STREAM_NONE) stream = b->waited;
        if ((rc = tf__cuda_push_device(cu, d->device, &prev)) == 0) {
            tf__cuerr e = cu->EventRecord(d->static_done, (tf__custream)stream);
            if (e != TF__CU_SUCCESS) rc = tf__cuda_fail(cu, e, "cudaEventRecord (release of static buffers)", "");
            tf__cuda_pop_device(cu, d->device, prev);
        }
    }
    pthread_mutex_lock(&d->mu);
    d->held--;
    d->releases++;
    pthread_cond_broadcast(&d->feed_cv);
    b->slot = NULL;
    b->next = d->free_handles;
    d->free_handles = b;
    pthread_mutex_unlock(&d->mu);
    unref(d);
    return rc;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

void tf_device_loader_get_stats(const tf_device_loader *cd, tf_device_stats *st) {
    if (!st) return;
    memset(st, 0, sizeof *st);
    if (!cd) return;
    tf_device_loader *d = (tf_device_loader *)cd;
    st->prefetch = d->prefetch;
    st->slots = d->nslots;
    st->static_buffers = d->is_static;
    if (forked(d)) return;
    uint64_t *sorted = malloc(TF__WAITS * sizeof *sorted);
    pthread_mutex_lock(&d->mu);
    if (d->ring)
        for (int i = 0; i < d->nslots; i++) collect_timing(d, i);
    st->batches = d->st_batches;
    st->issued_ahead = d->st_ahead;
    st->copies_issued_ahead = d->st_batches ? (double)d->st_ahead / (double)d->st_batches : 0.0;
    st->copies = d->st_copies;
    st->h2d_bytes = d->st_h2d_bytes;
    st->h2d_timed_bytes = d->st_timed_bytes;
    st->h2d_seconds = (double)d->st_timed_ns / 1e9;
    st->h2d_gbps = d->st_timed_ns ? (double)d->st_timed_bytes / (double)d->st_timed_ns : 0.0;
    st->staging_copies = d->st_staging;
    st->staging_bytes = d->st_staging_bytes;
    st->slot_full_waits = d->st_full_waits;
    st->queued = 0;
    for (int i = 0; i < d->qcount; i++) st->queued += d->q[(d->qhead + i) % d->qcap].slot != NULL;
    st->held = d->held;
    st->direct_copies = d->st_direct;
    st->engine_buffers_locked = tf__loader_locked_buffers(d->l);
    st->host_pinned = d->st_copies ? d->st_pageable == 0 : -1;
    uint64_t n = d->nwaits < TF__WAITS ? d->nwaits : TF__WAITS;
    if (sorted) memcpy(sorted, d->waits, n * sizeof *sorted);
    st->wait_total_s = (double)d->wait_total_ns / 1e9;
    st->wait_mean_s = d->nwaits ? st->wait_total_s / (double)d->nwaits : 0.0;
    if (d->ring) {
        tf_device_ring_info info;
        tf_device_ring_get_info(d->ring, &info);
        st->release_waits = info.release_waits;
        snprintf(st->note, sizeof st->note, "%s", info.note);
    }
    pthread_mutex_unlock(&d->mu);
    if (n && sorted) {
        qsort(sorted, (size_t)n, sizeof *sorted, cmp_u64);
        uint64_t k = (n * 99 + 99) / 100; /* ceil(0.99 n) */
        st->wait_p99_s = (double)sorted[k - 1] / 1e9;
    }
    free(sorted);
}
