/*
 * device.h — private interface of the device layer: the CUDA runtime entry
 * points resolved at run time (cudart.c) and used by the device ring
 * (ring.c). Not installed. No CUDA header is needed: the few types, enums and
 * constants used are declared here with the runtime's ABI values.
 */
#ifndef TF_DEVICE_H
#define TF_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "../common/internal.h"

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
    TF__CU_EVENT_DISABLE_TIMING = 0x2, /* cudaEventDisableTiming */
    TF__CU_HOST_REGISTER_PORTABLE = 0x1,
    TF__CU_MEMCPY_H2D = 1,             /* cudaMemcpyHostToDevice */
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

#endif
