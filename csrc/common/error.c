/* error.c — error codes, the thread-local detail message, version, features. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

/* Per-thread message buffers live on the heap, reached through a pthread key,
 * not in _Thread_local arrays: the library's TLS segment goes into the static
 * TLS block (common/sigbus.c needs an initial-exec variable), and glibc has
 * only a small surplus for libraries loaded with dlopen. With 1 KiB arrays, the
 * extension and libtokenfeed.so could not both be loaded in one process
 * ("cannot allocate memory in static TLS block"). */
typedef struct tf_thread_msgs {
    char err[1024];
    char strerr[128];
} tf_thread_msgs;

static pthread_key_t msgs_key;
static pthread_once_t msgs_once = PTHREAD_ONCE_INIT;
static int msgs_key_ok;

static void msgs_init(void) { msgs_key_ok = pthread_key_create(&msgs_key, free) == 0; }

/* NULL when the key or the allocation fails: callers then report a fixed
 * message instead of the detail. */
static tf_thread_msgs *thread_msgs(int create) {
    pthread_once(&msgs_once, msgs_init);
    if (!msgs_key_ok) return NULL;
    tf_thread_msgs *m = pthread_getspecific(msgs_key);
    if (!m && create) {
        m = calloc(1, sizeof *m);
        if (m && pthread_setspecific(msgs_key, m) != 0) {
            free(m);
            m = NULL;
        }
    }
    return m;
}

int tf__seterr(int code, const char *fmt, ...) {
    tf_thread_msgs *m = thread_msgs(1);
    if (!m) return code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->err, sizeof m->err, fmt, ap);
    va_end(ap);
    return code;
}

void tf__clearerr(void) {
    tf_thread_msgs *m = thread_msgs(0);
    if (m) m->err[0] = '\0';
}

const char *tf_last_error(void) {
    tf_thread_msgs *m = thread_msgs(0);
    return m ? m->err : "";
}

const char *tf_strerror(int err) {
    if (err == INT_MIN) return "unknown error"; /* -INT_MIN is not an int */
    if (err < 0) err = -err;
    switch (err) {
    case 0: return "success";
    case TF_EFORMAT: return "malformed input file";
    case TF_ECHECKSUM: return "checksum mismatch";
    case TF_EVOCAB: return "token id out of vocabulary range";
    case TF_ESTATE: return "state does not match this loader";
    case TF_EEOF: return "end of stream";
    case TF_EUNSUPPORTED: return "not supported in this build or on this system";
    case TF_ECUDA: return "CUDA error";
    case TF_ENOTREADY: return "nothing ready yet: call again";
    default: break;
    }
    /* strerror() is not thread-safe; strerror_r (GNU) returns a static or
     * thread-safe string for known codes. */
    tf_thread_msgs *m = thread_msgs(1);
    if (!m) return "system error";
    return strerror_r(err, m->strerr, sizeof m->strerr);
}

const char *tf_version(void) { return TF_VERSION_STRING; }

unsigned tf_features(void) {
    unsigned f = 0;
#ifdef TF_HAVE_ZSTD
    f |= TF_FEATURE_ZSTD;
#endif
#ifdef TF_HAVE_IO_URING
    f |= TF_FEATURE_IO_URING;
#endif
#ifdef TF_HAVE_CUDA_LAYER
    f |= TF_FEATURE_CUDA;
#endif
    return f;
}

int tf__num_cpus(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (int)n;
}

uint64_t tf__now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int tf__cond_init(pthread_cond_t *cv) {
    pthread_condattr_t ca;
    if (pthread_condattr_init(&ca) != 0) return -ENOMEM;
    int rc = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) || pthread_cond_init(cv, &ca);
    pthread_condattr_destroy(&ca);
    return rc ? -ENOMEM : 0;
}
