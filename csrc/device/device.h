/*
 * device.h — private interface of the device layer: the CUDA runtime entry
 * points resolved at run time (cudart.c), the device ring (ring.c) and the
 * device stage that feeds it from the engine (stage.c). Not installed. No
 * CUDA header is needed: the few types, enums and constants used are declared
 * here with the runtime's ABI values.
 */
#ifndef TF_DEVICE_H
#define TF_DEVICE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "../common/internal.h"
#include "../engine/meter.h"

/* The runtime's ABI, as far as tokenfeed uses it. */
typedef int tf__cuerr;        /* cudaError_t */
typedef void *tf__custream;   /* cudaStream_t */
typedef void *tf__cuevent;    /* cudaEvent_t */

enum {
    TF__CU_SUCCESS = 0,
    TF__CU_ERR_INVALID_VALUE = 1,
    TF__CU_ERR_MEMORY_ALLOCATION = 2,
    TF__CU_ERR_INITIALIZATION = 3,
    TF__CU_ERR_STUB_LIBRARY = 34,
    TF__CU_ERR_INSUFFICIENT_DRIVER = 35,
    TF__CU_ERR_NO_DEVICE = 100,
    TF__CU_ERR_INVALID_DEVICE = 101,
    TF__CU_ERR_NOT_READY = 600,
    TF__CU_ERR_HOST_ALREADY_REGISTERED = 712,
};

enum {
    TF__CU_STREAM_NON_BLOCKING = 0x1,  /* cudaStreamNonBlocking */
    TF__CU_EVENT_DEFAULT = 0x0,        /* cudaEventDefault (timing enabled) */
    TF__CU_EVENT_BLOCKING_SYNC = 0x1,  /* cudaEventBlockingSync: a host wait sleeps, not spins */
    TF__CU_EVENT_DISABLE_TIMING = 0x2, /* cudaEventDisableTiming */
    TF__CU_HOST_REGISTER_PORTABLE = 0x1,
    TF__CU_MEMCPY_H2D = 1,             /* cudaMemcpyHostToDevice */
    TF__CU_MEMCPY_D2D = 3,             /* cudaMemcpyDeviceToDevice */
    TF__CU_EVENT_WAIT_DEFAULT = 0,
};

/* Entry points, resolved once by tf__cuda_load(). Every pointer is non-NULL
 * after a successful load and all are NULL after a failed one. */
typedef struct tf__cudart {
    tf__cuerr (*GetDeviceCount)(int *);
    tf__cuerr (*SetDevice)(int);
    tf__cuerr (*GetDevice)(int *);
    tf__cuerr (*Malloc)(void **, size_t);
    tf__cuerr (*Free)(void *);
    tf__cuerr (*HostRegister)(void *, size_t, unsigned);
    tf__cuerr (*HostUnregister)(void *);
    tf__cuerr (*StreamCreateWithFlags)(tf__custream *, unsigned);
    tf__cuerr (*StreamDestroy)(tf__custream);
    tf__cuerr (*EventCreateWithFlags)(tf__cuevent *, unsigned);
    tf__cuerr (*EventDestroy)(tf__cuevent);
    tf__cuerr (*EventRecord)(tf__cuevent, tf__custream);
    tf__cuerr (*EventQuery)(tf__cuevent);
    tf__cuerr (*EventSynchronize)(tf__cuevent);
    tf__cuerr (*EventElapsedTime)(float *, tf__cuevent, tf__cuevent);
    tf__cuerr (*StreamWaitEvent)(tf__custream, tf__cuevent, unsigned);
    tf__cuerr (*MemcpyAsync)(void *, const void *, size_t, int, tf__custream);
    const char *(*GetErrorString)(tf__cuerr);
    tf__cuerr (*GetLastError)(void);
    tf__cuerr (*RuntimeGetVersion)(int *);
} tf__cudart;

/* Load the runtime (once per process; thread-safe). Returns the table, or
 * NULL with the reason available from tf__cuda_why(). */
TF_HIDDEN const tf__cudart *tf__cuda_load(void);
/* Why loading failed, or a one-line description of what was loaded. */
TF_HIDDEN const char *tf__cuda_why(void);

/* Record "<what> failed: <cuda error string> (cudaError N)<hint>" and return
 * the tokenfeed code for a CUDA error: -ENOMEM for out-of-memory, -EINVAL for
 * an invalid device, -TF_ECUDA otherwise. Clears the runtime's last error so
 * that a non-sticky failure does not poison later calls. */
TF_HIDDEN int tf__cuda_fail(const tf__cudart *cu, tf__cuerr e, const char *what, const char *hint);

/* Make `device` current on this thread, remembering the previous one in *prev
 * (restored by tf__cuda_pop_device) so that a framework's current device is
 * left as it was. */
TF_HIDDEN int tf__cuda_push_device(const tf__cudart *cu, int device, int *prev);
TF_HIDDEN void tf__cuda_pop_device(const tf__cudart *cu, int device, int prev);

/* ------------------------------------------------------------------------ */
/* The device ring (ring.c), shared with the stage (stage.c)                 */
/* ------------------------------------------------------------------------ */

enum { TF__SLOT_FREE, TF__SLOT_FILLING, TF__SLOT_IN_USE, TF__SLOT_RELEASED, TF__SLOT_WAITED, TF__SLOT_LOST };

struct tf_device_slot {
    tf_device_ring *ring;
    int index, state;
    void *dev;              /* slot_bytes of device memory */
    uint8_t *host;          /* slot_bytes of the ring's staging */
    tf__cuevent copied, released;
    uint64_t release_seq;   /* order of release, to recycle oldest first */
};

struct tf_device_ring {
    const tf__cudart *cu;
    int device, nslots;
    size_t slot_bytes;
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* a WAITED slot went back to RELEASED */
    int refs;               /* owner + slots out of the ring; under mu */
    tf__custream stream;    /* the copy stream (non-blocking) */
    uint8_t *staging;       /* nslots * slot_bytes, one mapping */
    size_t staging_bytes;
    int staging_pinned;
    char note[160];
    uint64_t uploads, release_waits, release_seq;
    tf_device_slot *slots;
};

/* A ring as tf_device_ring_create makes it, but with staging only if
 * `staging`; tf__device_ring_ensure_staging adds it later (once; called by
 * the one thread that fills slots, before it fills one from staging). */
TF_HIDDEN int tf__device_ring_create(int device, size_t slot_bytes, int slots, int staging, tf_device_ring **out);
TF_HIDDEN int tf__device_ring_ensure_staging(tf_device_ring *r);

/* Issue the host-to-device copy of a slot in state filling and record its
 * "copied" event (state in use), as tf_device_slot_commit does, with two
 * differences for the stage: the sources are either the slot's staging
 * (segs == NULL: its first `bytes`) or page-locked host segments copied
 * straight into the slot (no host memcpy), at offs[i] (NULL: packed as
 * tf_device_packed_size packs them), one copy per non-empty segment; and t0/t1
 * (timing events, may be NULL) are recorded just before and just after the
 * copies, before "copied", so that "copied" completing implies t1 has. On
 * failure the slot stays in state filling, as with tf_device_slot_commit. */
TF_HIDDEN int tf__device_slot_issue(tf_device_slot *s, const tf_device_seg *segs, const size_t *offs, int nsegs,
                                    size_t bytes, tf__cuevent t0, tf__cuevent t1);

/* ------------------------------------------------------------------------ */
/* The data-wait meter on the GPU's clock (gpu_meter.c)                      */
/* ------------------------------------------------------------------------ */

#define TF__GPU_MARKS 64 /* hand-offs whose GPU wait may be pending at once */

typedef struct tf__gpu_meter {
    pthread_mutex_t mu;
    int made, off, started;
    tf__cuevent a[TF__GPU_MARKS], b[TF__GPU_MARKS]; /* per hand-off: before and after the wait */
    unsigned char gap[TF__GPU_MARKS]; /* the hand-off before this one went unmeasured: no cycle */
    int head, count;   /* pending hand-offs, in order */
    int prev;          /* mark of the last completed hand-off (its B starts the next cycle); -1: none */
    int lost_cycle;    /* the next hand-off follows an unmeasured one (consumer thread) */
    uint64_t handoffs, unmeasured;
    char why[200];     /* why the meter stopped, if it did */
    tf__meter meter;   /* cycles as read: wait and cycle on the GPU's clock */
} tf__gpu_meter;

TF_HIDDEN void tf__gpu_meter_init(tf__gpu_meter *g);
/* Device current. */
TF_HIDDEN void tf__gpu_meter_destroy(tf__gpu_meter *g, const tf__cudart *cu);
/* Around a hand-off on the consumer's stream (device current, consumer's
 * thread): begin records A and returns a mark (-1: not measured); end records
 * B when the hand-off delivered the batch. */
TF_HIDDEN int tf__gpu_meter_begin(tf__gpu_meter *g, const tf__cudart *cu, uintptr_t stream);
TF_HIDDEN void tf__gpu_meter_end(tf__gpu_meter *g, const tf__cudart *cu, int idx, uintptr_t stream, int delivered);
/* A batch delivered without a measurement: the next cycle is not counted. */
TF_HIDDEN void tf__gpu_meter_skip(tf__gpu_meter *g);
/* Read what has completed, then the summary of the last `window` cycles;
 * pending: hand-offs not yet read; unmeasured: hand-offs skipped; why: why
 * the meter stopped ("" if it runs). Any thread. */
TF_HIDDEN void tf__gpu_meter_get(tf__gpu_meter *g, const tf__cudart *cu, uint32_t window, tf_meter *out,
                                 uint64_t *pending, uint64_t *unmeasured, char *why, size_t why_len);

#endif
