/*
 * cudart.c — the CUDA runtime, loaded at run time.
 *
 * DESIGN of the device layer (this file and ring.c)
 * -------------------------------------------------
 * Loading. libcudart is never linked. tf__cuda_load() runs once per process
 * (pthread_once), in the style of NCCL's gdrwrap: dlopen, dlsym every entry
 * point, and on any failure reset every pointer to NULL and keep a sentence
 * saying why. Search order: $TOKENFEED_CUDART (a path; overrides everything,
 * the tests point it at a double), then a libcudart already loaded in the
 * process (RTLD_NOLOAD on the usual sonames, so that we share PyTorch's
 * runtime and its primary context instead of loading a second one), then the
 * usual sonames through the dynamic linker, then the usual install locations.
 * Nothing here runs unless a device function is called, so the CPU path never
 * touches CUDA.
 *
 * The device ring (ring.c). A tf_device_ring owns, allocated once at creation:
 * `slots` device buffers, the same amount of pinned host staging (one
 * anonymous mapping registered with cudaHostRegister once), one non-blocking
 * copy stream, and per slot two events created with cudaEventDisableTiming:
 * "copied" and "released".
 *
 *   slot state     who owns it          how it leaves the state
 *   ----------     -----------          ---------------------------------------
 *   free           the ring             acquire (producer thread)
 *   filling        the producer         commit: cudaMemcpyAsync staging->device
 *                                       on the copy stream, record "copied" on
 *                                       the copy stream
 *   in use         the consumer         release(stream): record "released" on
 *                  (copy may still be   the consumer's stream
 *                  running)
 *   released       the ring, pending    acquire polls "released" with
 *                                       cudaEventQuery; completed -> free
 *   lost           nobody               a CUDA error on release: never reused
 *
 * Who waits on what:
 *   - The consumer's stream waits on "copied" (cudaStreamWaitEvent at the
 *     hand-off, tf_device_slot_wait). The host never waits for a copy.
 *   - The producer reuses a slot (its staging and its device buffer) only
 *     after "released" has completed: all work the consumer queued on its
 *     stream before releasing has finished reading the slot. Because that
 *     stream waited on "copied", "released" completing implies the copy has
 *     completed too, so the staging is also free to overwrite.
 *   - When no slot is free and one is released but pending, acquire(wait=1)
 *     blocks on that one event (cudaEventSynchronize on the event). Nothing
 *     calls cudaDeviceSynchronize or cudaStreamSynchronize, ever.
 *   - The ring is reference counted: the owner holds one reference and every
 *     slot out of the free list holds one, so tensors outlive a closed loader;
 *     the last reference waits on outstanding events and frees everything.
 *
 * Locking: one mutex per ring guards the slot states and counters; it is
 * dropped around cudaEventSynchronize so that releases from other threads
 * (DLPack deleters run wherever the consumer frees a tensor) never wait on
 * the GPU.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"

static tf__cudart tf_cu;
static int tf_cu_ok;
static char tf_cu_why[512];
static pthread_once_t tf_cu_once = PTHREAD_ONCE_INIT;

static const char *const tf_cu_sonames[] = {
    "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so",
};

static const char *const tf_cu_dirs[] = {
    "/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib",
    "/usr/local/cuda/targets/sbsa-linux/lib", "/usr/lib/x86_64-linux-gnu", "/usr/lib64",
};

/* Resolve every symbol; on the first missing one, say which. */
static int resolve(void *h, const char *from) {
#define TF_SYM(field, name)                                                                        \
    do {                                                                                           \
        *(void **)&tf_cu.field = dlsym(h, name);                                                   \
        if (!tf_cu.field) {                                                                        \
            snprintf(tf_cu_why, sizeof tf_cu_why,                                                  \
                     "%s does not export %s (a CUDA runtime older than 11.0, or not libcudart)",   \
                     from, name);                                                                  \
            return -1;                                                                             \
        }                                                                                          \
    } while (0)
    TF_SYM(GetDeviceCount, "cudaGetDeviceCount");
    TF_SYM(SetDevice, "cudaSetDevice");
    TF_SYM(GetDevice, "cudaGetDevice");
    TF_SYM(Malloc, "cudaMalloc");
    TF_SYM(Free, "cudaFree");
    TF_SYM(HostRegister, "cudaHostRegister");
    TF_SYM(HostUnregister, "cudaHostUnregister");
    TF_SYM(StreamCreateWithFlags, "cudaStreamCreateWithFlags");
    TF_SYM(StreamDestroy, "cudaStreamDestroy");
    TF_SYM(EventCreateWithFlags, "cudaEventCreateWithFlags");
    TF_SYM(EventDestroy, "cudaEventDestroy");
    TF_SYM(EventRecord, "cudaEventRecord");
    TF_SYM(EventQuery, "cudaEventQuery");
    TF_SYM(EventSynchronize, "cudaEventSynchronize");
    TF_SYM(EventElapsedTime, "cudaEventElapsedTime");
    TF_SYM(StreamWaitEvent, "cudaStreamWaitEvent");
    TF_SYM(MemcpyAsync, "cudaMemcpyAsync");
    TF_SYM(GetErrorString, "cudaGetErrorString");
    TF_SYM(GetLastError, "cudaGetLastError");
    TF_SYM(RuntimeGetVersion, "cudaRuntimeGetVersion");
#undef TF_SYM
    return 0;
}

static void cuda_load_once(void) {
    void *h = NULL;
    char from[320] = "";
    const char *how = "";
    const char *env = getenv("TOKENFEED_CUDART");
    if (env && *env) {
        h = dlopen(env, RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            const char *e = dlerror();
            snprintf(tf_cu_why, sizeof tf_cu_why,
                     "TOKENFEED_CUDART=%s could not be loaded (%s); unset it to search the usual places",
                     env, e ? e : "unknown error");
            return;
        }
        snprintf(from, sizeof from, "%s", env);
        how = " ($TOKENFEED_CUDART)";
    }
    for (size_t i = 0; !h && i < sizeof tf_cu_sonames / sizeof *tf_cu_sonames; i++) {
        h = dlopen(tf_cu_sonames[i], RTLD_NOW | RTLD_NOLOAD);
        if (h) {
            snprintf(from, sizeof from, "%s", tf_cu_sonames[i]);
            how = " (already loaded in the process)";
        }
    }
    for (size_t i = 0; !h && i < sizeof tf_cu_sonames / sizeof *tf_cu_sonames; i++) {
        h = dlopen(tf_cu_sonames[i], RTLD_NOW | RTLD_LOCAL);
        if (h) snprintf(from, sizeof from, "%s", tf_cu_sonames[i]);
    }
    for (size_t d = 0; !h && d < sizeof tf_cu_dirs / sizeof *tf_cu_dirs; d++) {
        for (size_t i = 0; !h && i < sizeof tf_cu_sonames / sizeof *tf_cu_sonames; i++) {
            snprintf(from, sizeof from, "%s/%s", tf_cu_dirs[d], tf_cu_sonames[i]);
            h = dlopen(from, RTLD_NOW | RTLD_LOCAL);
        }
    }
    if (!h) {
        snprintf(tf_cu_why, sizeof tf_cu_why,
                 "no CUDA runtime found (libcudart.so.13/.12/.11.0 are neither loaded nor on the "
                 "library path nor in /usr/local/cuda); install the CUDA runtime (e.g. "
                 "pip install nvidia-cuda-runtime-cu12, or import torch first) or set "
                 "TOKENFEED_CUDART to libcudart's path");
        return;
    }
    if (resolve(h, from) < 0) {
        memset(&tf_cu, 0, sizeof tf_cu); /* all or nothing */
        dlclose(h);
        return;
    }
    int ver = 0;
    tf_cu.RuntimeGetVersion(&ver);
    snprintf(tf_cu_why, sizeof tf_cu_why, "CUDA runtime %d.%d from %s%s", ver / 1000, ver % 1000 / 10,
             from, how);
    tf_cu_ok = 1;
    /* h stays open for the life of the process, as the runtime expects. */
}

const tf__cudart *tf__cuda_load(void) {
    pthread_once(&tf_cu_once, cuda_load_once);
    return tf_cu_ok ? &tf_cu : NULL;
}

const char *tf__cuda_why(void) {
    pthread_once(&tf_cu_once, cuda_load_once);
    return tf_cu_why;
}

int tf__cuda_fail(const tf__cudart *cu, tf__cuerr e, const char *what, const char *hint) {
    const char *s = cu->GetErrorString ? cu->GetErrorString(e) : NULL;
    cu->GetLastError(); /* clear a non-sticky error */
    int code = e == TF__CU_ERR_MEMORY_ALLOCATION ? -ENOMEM
               : e == TF__CU_ERR_INVALID_DEVICE ? -EINVAL
                                                 : -TF_ECUDA;
    return tf__seterr(code, "CUDA: %s failed: %s (cudaError %d)%s%s", what, s ? s : "unknown error", e,
                      hint && *hint ? "; " : "", hint ? hint : "");
}

int tf__cuda_push_device(const tf__cudart *cu, int device, int *prev) {
    *prev = -1;
    if (cu->GetDevice(prev) != TF__CU_SUCCESS) {
        cu->GetLastError();
        *prev = -1;
    }
    if (*prev == device) return 0;
    tf__cuerr e = cu->SetDevice(device);
    if (e != TF__CU_SUCCESS) return tf__cuda_fail(cu, e, "cudaSetDevice", "check the device index and CUDA_VISIBLE_DEVICES");
    return 0;
}

void tf__cuda_pop_device(const tf__cudart *cu, int device, int prev) {
    if (prev >= 0 && prev != device) cu->SetDevice(prev);
}

/* Detail for a failed cudaGetDeviceCount: the usual causes by code. */
static const char *count_hint(tf__cuerr e) {
    switch (e) {
    case TF__CU_ERR_NO_DEVICE: return "no CUDA-capable device is visible (check CUDA_VISIBLE_DEVICES and nvidia-smi)";
    case TF__CU_ERR_INSUFFICIENT_DRIVER: return "the NVIDIA driver is missing or older than this CUDA runtime";
    case TF__CU_ERR_STUB_LIBRARY: return "a stub libcudart was loaded; point TOKENFEED_CUDART at the real one";
    default: return "";
    }
}

int tf_cuda_device_count(int *count) {
    *count = 0;
    const tf__cudart *cu = tf__cuda_load();
    if (!cu) return tf__seterr(-TF_ECUDA, "CUDA is not available: %s", tf__cuda_why());
    int n = 0;
    tf__cuerr e = cu->GetDeviceCount(&n);
    if (e == TF__CU_ERR_NO_DEVICE) {
        cu->GetLastError();
        return 0;
    }
    if (e != TF__CU_SUCCESS) {
        int rc = tf__cuda_fail(cu, e, "cudaGetDeviceCount", count_hint(e));
        return rc == -TF_ECUDA ? rc : -TF_ECUDA;
    }
    *count = n;
    return 0;
}

int tf_cuda_available(char *why, size_t why_len) {
    const tf__cudart *cu = tf__cuda_load();
    if (!cu) {
        if (why && why_len) snprintf(why, why_len, "%s", tf__cuda_why());
        return 0;
    }
    int n = 0;
    tf__cuerr e = cu->GetDeviceCount(&n);
    if (e != TF__CU_SUCCESS || n < 1) {
        const char *s = e != TF__CU_SUCCESS ? cu->GetErrorString(e) : "0 devices";
        if (e != TF__CU_SUCCESS) cu->GetLastError();
        if (why && why_len)
            snprintf(why, why_len, "%s loaded, but cudaGetDeviceCount: %s%s%s", tf__cuda_why(), s ? s : "error",
                     *count_hint(e ? e : TF__CU_ERR_NO_DEVICE) ? "; " : "",
                     count_hint(e ? e : TF__CU_ERR_NO_DEVICE));
        return 0;
    }
    if (why && why_len) snprintf(why, why_len, "%s, %d device(s)", tf__cuda_why(), n);
    return 1;
}
