/*
 * ring.c — pinned host memory and the device ring. The slot state machine,
 * the events and who waits on what are described at the top of cudart.c.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "device.h"

/* ------------------------------------------------------------------------ */
/* Pinned host memory                                                        */
/* ------------------------------------------------------------------------ */

static size_t page_round(size_t n) {
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    return (n + pg - 1) / pg * pg;
}

int tf_pinned_alloc(size_t bytes, void **out, int *pinned) {
    *out = NULL;
    if (pinned) *pinned = 0;
    if (bytes == 0) return tf__seterr(-EINVAL, "tf_pinned_alloc: bytes must be > 0");
    size_t len = page_round(bytes);
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return tf__seterr(-ENOMEM, "cannot map %zu bytes of host memory for pinned staging", len);
    *out = p;
    const tf__cudart *cu = tf__cuda_load();
    if (!cu) {
        tf__seterr(0, "host memory is pageable: CUDA is not available (%s)", tf__cuda_why());
        return 0;
    }
    /* Portable: usable from every device's context, whichever is current. */
    tf__cuerr e = cu->HostRegister(p, len, TF__CU_HOST_REGISTER_PORTABLE);
    if (e != TF__CU_SUCCESS) {
        tf__cuda_fail(cu, e, "cudaHostRegister",
                      "host staging stays pageable (copies are slower); raise the memlock limit "
                      "(ulimit -l) to page-lock it");
        return 0;
    }
    if (pinned) *pinned = 1;
    return 0;
}

/* Unregister (if it was registered) and unmap. */
static void pinned_free(void *ptr, size_t bytes, int pinned) {
    if (!ptr) return;
    const tf__cudart *cu = tf__cuda_load();
    if (cu && pinned) {
        if (cu->HostUnregister(ptr) != TF__CU_SUCCESS) cu->GetLastError();
    }
    munmap(ptr, page_round(bytes));
}

void tf_pinned_free(void *ptr, size_t bytes) {
    if (!ptr || bytes == 0) return;
    const tf__cudart *cu = tf__cuda_load();
    /* Unregistering memory that was never registered fails harmlessly. */
    pinned_free(ptr, bytes, cu != NULL);
}

/* ------------------------------------------------------------------------ */
/* Device ring                                                               */
/* ------------------------------------------------------------------------ */

static size_t align_up(size_t n) { return (n + TF_DEVICE_ALIGN - 1) / TF_DEVICE_ALIGN * TF_DEVICE_ALIGN; }

/* Free every resource. Called with no lock by whoever drops the last
 * reference, or by create on failure. Waits on events still in flight (a
 * host wait on each event, not a device synchronisation). */
static void ring_destroy(tf_device_ring *r) {
    const tf__cudart *cu = r->cu;
    int prev = -1;
    int have_dev = tf__cuda_push_device(cu, r->device, &prev) == 0;
    /* Every copy out of the staging must be done before it is unmapped,
     * including one whose event could not be recorded: record a last event
     * on the copy stream and wait for it (our stream only, at teardown). */
    if (have_dev && r->stream && r->slots && r->slots[0].copied) {
        if (cu->EventRecord(r->slots[0].copied, r->stream) != TF__CU_SUCCESS ||
            cu->EventSynchronize(r->slots[0].copied) != TF__CU_SUCCESS)
            cu->GetLastError();
    }
    for (int i = 0; r->slots && i < r->nslots; i++) {
        tf_device_slot *s = &r->slots[i];
        if (have_dev && s->state != TF__SLOT_LOST) {
            /* the consumer's last reads must be done before the memory goes
             * (cudaFree would wait for the device anyway) */
            if (s->released && cu->EventSynchronize(s->released) != TF__CU_SUCCESS) cu->GetLastError();
        }
        if (s->copied) cu->EventDestroy(s->copied);
        if (s->released) cu->EventDestroy(s->released);
        if (s->dev && s->state != TF__SLOT_LOST) cu->Free(s->dev); /* a lost slot may still be read: leak it */
    }
    if (r->stream) cu->StreamDestroy(r->stream);
    cu->GetLastError();
    if (have_dev) tf__cuda_pop_device(cu, r->device, prev);
    pinned_free(r->staging, r->staging_bytes, r->staging_pinned);
    free(r->slots);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

/* Drop one reference; the last one destroys the ring. */
static void ring_unref(tf_device_ring *r) {
    pthread_mutex_lock(&r->mu);
    int left = --r->refs;
    pthread_mutex_unlock(&r->mu);
    if (left == 0) ring_destroy(r);
}

/* Pinned staging for every slot, once (mu not needed: before any slot is
 * filled from it, by the one thread that fills). */
static int ring_staging(tf_device_ring *r) {
    if (r->staging) return 0;
    size_t total = r->slot_bytes * (size_t)r->nslots;
    int pinned = 0;
    uint8_t *p = NULL;
    int rc = tf_pinned_alloc(total, (void **)&p, &pinned);
    if (rc < 0)
        return tf__seterr(rc, "device ring: cannot allocate %zu bytes of host staging (%d slots of %zu bytes)", total,
                          r->nslots, r->slot_bytes);
    pthread_mutex_lock(&r->mu);
    if (!pinned) snprintf(r->note, sizeof r->note, "%s", tf_last_error());
    for (int i = 0; i < r->nslots; i++) r->slots[i].host = p + (size_t)i * r->slot_bytes;
    r->staging_bytes = total;
    r->staging_pinned = pinned;
    r->staging = p;
    pthread_mutex_unlock(&r->mu);
    return 0;
}

int tf__device_ring_ensure_staging(tf_device_ring *r) { return ring_staging(r); }

static int ring_create(int device, size_t slot_bytes, int slots, int staging, tf_device_ring **out) {
    *out = NULL;
    if (slots < 1 || slots > 1024)
        return tf__seterr(-EINVAL, "device ring: slots must be in [1, 1024], got %d", slots);
    if (slot_bytes == 0 || slot_bytes > ((size_t)1 << 40))
        return tf__seterr(-EINVAL, "device ring: slot_bytes must be in [1, 2^40], got %zu", slot_bytes);
    const tf__cudart *cu = tf__cuda_load();
    if (!cu) return tf__seterr(-TF_ECUDA, "CUDA is not available: %s", tf__cuda_why());
    int n = 0;
    TF_TRY(tf_cuda_device_count(&n));
    if (n == 0)
        return tf__seterr(-TF_ECUDA,
                          "CUDA: no CUDA device is visible to this process (%s); check CUDA_VISIBLE_DEVICES "
                          "and nvidia-smi, or use the CPU (device=None)",
                          tf__cuda_why());
    if (device < 0 || device >= n)
        return tf__seterr(-EINVAL,
                          "CUDA device index %d is out of range: this process sees %d device(s) (0..%d); "
                          "check LOCAL_RANK / the device string and CUDA_VISIBLE_DEVICES",
                          device, n, n - 1);
    slot_bytes = align_up(slot_bytes);
    size_t total = slot_bytes * (size_t)slots;

    tf_device_ring *r = calloc(1, sizeof *r);
    if (!r) return tf__seterr(-ENOMEM, "device ring: out of host memory");
    r->cu = cu;
    r->device = device;
    r->nslots = slots;
    r->slot_bytes = slot_bytes;
    r->refs = 1;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->slots = calloc((size_t)slots, sizeof *r->slots);
    if (!r->slots) {
        ring_destroy(r);
        return tf__seterr(-ENOMEM, "device ring: out of host memory");
    }
    for (int i = 0; i < slots; i++) {
        r->slots[i].ring = r;
        r->slots[i].index = i;
        r->slots[i].state = TF__SLOT_LOST; /* nothing to wait on until set up */
    }
    int prev = -1, rc = tf__cuda_push_device(cu, device, &prev);
    if (rc < 0) {
        free(r->slots);
        r->slots = NULL;
        ring_destroy(r);
        return rc;
    }
    /* Host staging first: page-locked once here, never per batch. */
    if (staging && (rc = ring_staging(r)) < 0) goto fail;
    tf__cuerr e = cu->StreamCreateWithFlags(&r->stream, TF__CU_STREAM_NON_BLOCKING);
    if (e != TF__CU_SUCCESS) {
        r->stream = NULL;
        rc = tf__cuda_fail(cu, e, "cudaStreamCreateWithFlags (the ring's copy stream)", "");
        goto fail;
    }
    for (int i = 0; i < slots; i++) {
        tf_device_slot *s = &r->slots[i];
        e = cu->Malloc(&s->dev, slot_bytes);
        if (e != TF__CU_SUCCESS) {
            s->dev = NULL;
            char what[160];
            snprintf(what, sizeof what, "cudaMalloc of slot %d/%d (%zu bytes, %zu in all) on device %d", i + 1,
                     slots, slot_bytes, total, device);
            rc = tf__cuda_fail(cu, e, what,
                               e == TF__CU_ERR_MEMORY_ALLOCATION
                                   ? "the GPU is out of memory: lower batch_size or the number of device "
                                     "slots, or free GPU memory before creating the loader"
                                   : "");
            goto fail;
        }
        s->state = TF__SLOT_FREE;
        /* "released" may be waited on by a host thread (acquire with wait):
         * blocking sync makes that wait sleep instead of spinning a core. */
        if ((e = cu->EventCreateWithFlags(&s->copied, TF__CU_EVENT_DISABLE_TIMING)) != TF__CU_SUCCESS ||
            (e = cu->EventCreateWithFlags(&s->released, TF__CU_EVENT_DISABLE_TIMING | TF__CU_EVENT_BLOCKING_SYNC)) !=
                TF__CU_SUCCESS) {
            rc = tf__cuda_fail(cu, e, "cudaEventCreateWithFlags", "");
            goto fail;
        }
    }
    tf__cuda_pop_device(cu, device, prev);
    *out = r;
    return 0;
fail:;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", tf_last_error());
    tf__cuda_pop_device(cu, device, prev);
    ring_destroy(r);
    return tf__seterr(rc, "%s", msg);
}

int tf_device_ring_create(int device, size_t slot_bytes, int slots, tf_device_ring **out) {
    return ring_create(device, slot_bytes, slots, 1, out);
}

int tf__device_ring_create(int device, size_t slot_bytes, int slots, int staging, tf_device_ring **out) {
    return ring_create(device, slot_bytes, slots, staging, out);
}

void tf_device_ring_free(tf_device_ring *r) {
    if (r) ring_unref(r);
}

void tf_device_ring_get_info(tf_device_ring *r, tf_device_ring_info *info) {
    memset(info, 0, sizeof *info);
    pthread_mutex_lock(&r->mu);
    info->device = r->device;
    info->slots = r->nslots;
    info->slot_bytes = r->slot_bytes;
    info->host_pinned = r->staging ? r->staging_pinned : 1; /* no staging: nothing pageable */
    for (int i = 0; i < r->nslots; i++) {
        int st = r->slots[i].state;
        info->free_slots += st == TF__SLOT_FREE;
        info->in_use += st == TF__SLOT_FILLING || st == TF__SLOT_IN_USE;
        info->lost += st == TF__SLOT_LOST;
    }
    info->uploads = r->uploads;
    info->release_waits = r->release_waits;
    snprintf(info->note, sizeof info->note, "%s", r->note);
    pthread_mutex_unlock(&r->mu);
}

/* mu held. Poll released slots (oldest first); the first whose event has
 * completed becomes free. Returns a free slot or NULL; *oldest gets the
 * oldest still-pending released slot (NULL if none). */
static tf_device_slot *find_free(tf_device_ring *r, tf_device_slot **oldest, int *err) {
    const tf__cudart *cu = r->cu;
    *oldest = NULL;
    *err = 0;
    for (int i = 0; i < r->nslots; i++)
        if (r->slots[i].state == TF__SLOT_FREE) return &r->slots[i];
    for (;;) {
        tf_device_slot *o = NULL;
        for (int i = 0; i < r->nslots; i++) {
            tf_device_slot *s = &r->slots[i];
            if (s->state == TF__SLOT_RELEASED && (!o || s->release_seq < o->release_seq)) o = s;
        }
        if (!o) return NULL;
        tf__cuerr e = cu->EventQuery(o->released);
        if (e == TF__CU_SUCCESS) {
            o->state = TF__SLOT_FREE;
            return o;
        }
        if (e != TF__CU_ERR_NOT_READY) {
            *err = tf__cuda_fail(cu, e, "cudaEventQuery (a device slot's release event)",
                                 "a kernel on the consumer stream probably failed; the CUDA context may be "
                                 "unusable: close the loader");
            return NULL;
        }
        /* Released events complete in stream order only per stream; the
         * oldest pending one is what we wait on when we must. */
        *oldest = o;
        return NULL;
    }
}

int tf_device_ring_acquire(tf_device_ring *r, int wait, tf_device_slot **out) {
    *out = NULL;
    const tf__cudart *cu = r->cu;
    int prev = -1;
    TF_TRY(tf__cuda_push_device(cu, r->device, &prev));
    int rc = 0, waited = 0;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        tf_device_slot *oldest, *s = find_free(r, &oldest, &rc);
        if (rc < 0) break;
        if (s) {
            s->state = TF__SLOT_FILLING;
            r->refs++;
            r->release_waits += waited;
            *out = s;
            break;
        }
        if (!oldest) {
            int waiting = 0;
            for (int i = 0; i < r->nslots; i++) waiting += r->slots[i].state == TF__SLOT_WAITED;
            if (waiting && wait) { /* another thread is waiting on an event: let it finish */
                pthread_cond_wait(&r->cv, &r->mu);
                continue;
            }
            rc = waiting ? -EAGAIN : -EBUSY;
            if (rc == -EBUSY)
                tf__seterr(-EBUSY,
                           "all %d device slots are held by the consumer and none is released: drop references "
                           "to the device tensors of old batches, or give the loader more device slots",
                           r->nslots);
            else
                tf__seterr(-EAGAIN, "no device slot is free yet");
            break;
        }
        if (!wait) {
            rc = tf__seterr(-EAGAIN, "no device slot is free yet: the consumer's stream has not reached the "
                                     "release of an older batch");
            break;
        }
        /* Block on that one event, without the lock, so that releases from
         * other threads go on. WAITED keeps other acquirers off the slot. */
        oldest->state = TF__SLOT_WAITED;
        pthread_mutex_unlock(&r->mu);
        tf__cuerr e = cu->EventSynchronize(oldest->released);
        pthread_mutex_lock(&r->mu);
        oldest->state = TF__SLOT_RELEASED;
        pthread_cond_broadcast(&r->cv);
        waited = 1;
        if (e != TF__CU_SUCCESS) {
            rc = tf__cuda_fail(cu, e, "cudaEventSynchronize (a device slot's release event)",
                               "a kernel on the consumer stream probably failed; close the loader");
            break;
        }
    }
    pthread_mutex_unlock(&r->mu);
    tf__cuda_pop_device(cu, r->device, prev);
    return rc;
}

void *tf_device_slot_host(tf_device_slot *s) { return s->host; }

void *tf_device_slot_ptr(const tf_device_slot *s) { return s->dev; }

int tf__device_slot_issue(tf_device_slot *s, const tf_device_seg *segs, const size_t *offs, int nsegs,
                          size_t bytes, tf__cuevent t0, tf__cuevent t1) {
    tf_device_ring *r = s->ring;
    const tf__cudart *cu = r->cu;
    if (s->state != TF__SLOT_FILLING)
        return tf__seterr(-EINVAL, "tf_device_slot_commit: the slot was not acquired (or was committed already)");
    if (segs && !offs) {
        bytes = tf_device_packed_size(segs, nsegs, NULL);
    } else if (segs) { /* the end of the furthest segment */
        bytes = 0;
        for (int i = 0; i < nsegs; i++)
            if (segs[i].bytes && offs[i] + segs[i].bytes > bytes) bytes = offs[i] + segs[i].bytes;
    }
    if (bytes > r->slot_bytes)
        return tf__seterr(-EINVAL, "tf_device_slot_commit: %zu bytes do not fit a slot of %zu bytes", bytes,
                          r->slot_bytes);
    int prev = -1;
    TF_TRY(tf__cuda_push_device(cu, r->device, &prev));
    int rc = 0;
    tf__cuerr e = TF__CU_SUCCESS;
    /* Timing is best effort: a failed record only loses the measurement. */
    if (t0 && cu->EventRecord(t0, r->stream) != TF__CU_SUCCESS) cu->GetLastError();
    if (!segs) {
        if (bytes) e = cu->MemcpyAsync(s->dev, s->host, bytes, TF__CU_MEMCPY_H2D, r->stream);
    } else {
        size_t off = 0;
        for (int i = 0; i < nsegs && e == TF__CU_SUCCESS; i++) {
            off = offs ? offs[i] : align_up(off);
            if (segs[i].bytes)
                e = cu->MemcpyAsync((uint8_t *)s->dev + off, segs[i].host, segs[i].bytes, TF__CU_MEMCPY_H2D, r->stream);
            off += segs[i].bytes;
        }
    }
    if (e != TF__CU_SUCCESS) {
        char what[128];
        snprintf(what, sizeof what, "cudaMemcpyAsync of %zu bytes to device %d", bytes, r->device);
        rc = tf__cuda_fail(cu, e, what, "the batch was not copied; close the loader if this repeats");
        /* A copy of an earlier segment may be in flight: the slot's next
         * user is ordered after it by the copy stream, and nothing frees the
         * slot before the ring's teardown waits on that stream. */
    } else {
        if (t1 && cu->EventRecord(t1, r->stream) != TF__CU_SUCCESS) cu->GetLastError();
        if ((e = cu->EventRecord(s->copied, r->stream)) != TF__CU_SUCCESS) {
            rc = tf__cuda_fail(cu, e, "cudaEventRecord (a device slot's copy event)", "");
            /* The copy may be in flight with nothing to wait on: withdraw. */
            pthread_mutex_lock(&r->mu);
            s->state = TF__SLOT_LOST;
            pthread_mutex_unlock(&r->mu);
            ring_unref(r);
        } else {
            pthread_mutex_lock(&r->mu);
            s->state = TF__SLOT_IN_USE;
            r->uploads++;
            pthread_mutex_unlock(&r->mu);
        }
    }
    tf__cuda_pop_device(cu, r->device, prev);
    return rc;
}

int tf_device_slot_commit(tf_device_slot *s, size_t bytes) {
    return tf__device_slot_issue(s, NULL, NULL, 0, bytes, NULL, NULL);
}

size_t tf_device_packed_size(const tf_device_seg *segs, int nsegs, size_t *offsets) {
    size_t off = 0;
    for (int i = 0; i < nsegs; i++) {
        off = align_up(off);
        if (offsets) offsets[i] = off;
        off += segs[i].bytes;
    }
    return off;
}

int tf_device_ring_upload(tf_device_ring *r, const tf_device_seg *segs, int nsegs, int wait,
                          tf_device_slot **out) {
    *out = NULL;
    if (nsegs < 0 || (nsegs && !segs)) return tf__seterr(-EINVAL, "tf_device_ring_upload: bad segment list");
    size_t need = tf_device_packed_size(segs, nsegs, NULL);
    if (need > r->slot_bytes)
        return tf__seterr(-EINVAL, "tf_device_ring_upload: %zu bytes (packed) do not fit a device slot of %zu bytes",
                          need, r->slot_bytes);
    tf_device_slot *s;
    TF_TRY(tf_device_ring_acquire(r, wait, &s));
    size_t off = 0;
    for (int i = 0; i < nsegs; i++) {
        off = align_up(off);
        if (segs[i].bytes) memcpy(s->host + off, segs[i].host, segs[i].bytes);
        off += segs[i].bytes;
    }
    int rc = tf_device_slot_commit(s, need);
    if (rc < 0) {
        if (s->state == TF__SLOT_FILLING) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", tf_last_error());
            tf_device_slot_release(s, TF_DEVICE_STREAM_NONE);
            tf__seterr(rc, "%s", msg);
        }
        return rc;
    }
    *out = s;
    return 0;
}

int tf_device_slot_wait(tf_device_slot *s, uintptr_t stream) {
    tf_device_ring *r = s->ring;
    const tf__cudart *cu = r->cu;
    if (s->state != TF__SLOT_IN_USE) return tf__seterr(-EINVAL, "tf_device_slot_wait: the slot has no copy in flight");
    if (stream == TF_DEVICE_STREAM_NONE) return 0;
    int prev = -1;
    TF_TRY(tf__cuda_push_device(cu, r->device, &prev));
    int rc = 0;
    tf__cuerr e = cu->StreamWaitEvent((tf__custream)stream, s->copied, TF__CU_EVENT_WAIT_DEFAULT);
    if (e != TF__CU_SUCCESS)
        rc = tf__cuda_fail(cu, e, "cudaStreamWaitEvent (consumer stream on a batch's copy)",
                           "pass a valid stream of the ring's device");
    tf__cuda_pop_device(cu, r->device, prev);
    return rc;
}

int tf_device_slot_synchronize(tf_device_slot *s) {
    const tf__cudart *cu = s->ring->cu;
    if (s->state != TF__SLOT_IN_USE) return tf__seterr(-EINVAL, "tf_device_slot_synchronize: the slot has no copy in flight");
    tf__cuerr e = cu->EventSynchronize(s->copied);
    if (e != TF__CU_SUCCESS) return tf__cuda_fail(cu, e, "cudaEventSynchronize (a batch's copy event)", "");
    return 0;
}

int tf_device_slot_release(tf_device_slot *s, uintptr_t stream) {
    if (!s) return 0;
    tf_device_ring *r = s->ring;
    const tf__cudart *cu = r->cu;
    int rc = 0, prev = -1;
    if (s->state == TF__SLOT_FILLING) {
        /* Never committed: nothing in flight, straight back to free. */
        pthread_mutex_lock(&r->mu);
        s->state = TF__SLOT_FREE;
        pthread_mutex_unlock(&r->mu);
        ring_unref(r);
        return 0;
    }
    if (s->state != TF__SLOT_IN_USE)
        return tf__seterr(-EINVAL, "tf_device_slot_release: the slot is not in use (released twice?)");
    int lost = 0;
    rc = tf__cuda_push_device(cu, r->device, &prev);
    if (rc == 0) {
        tf__custream st = stream == TF_DEVICE_STREAM_NONE ? r->stream : (tf__custream)stream;
        tf__cuerr e = cu->EventRecord(s->released, st);
        if (e != TF__CU_SUCCESS) {
            rc = tf__cuda_fail(cu, e, "cudaEventRecord (release of a device slot on the consumer stream)",
                               "the slot is withdrawn from the ring; pass a valid stream of the ring's device");
            lost = 1;
        }
        tf__cuda_pop_device(cu, r->device, prev);
    } else {
        lost = 1;
    }
    pthread_mutex_lock(&r->mu);
    if (lost) {
        s->state = TF__SLOT_LOST;
    } else {
        s->state = TF__SLOT_RELEASED;
        s->release_seq = ++r->release_seq;
    }
    pthread_mutex_unlock(&r->mu);
    ring_unref(r);
    return rc;
}
