/* error.c — error codes, the thread-local detail message, version, features. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

static _Thread_local char tf_errbuf[1024];

int tf__seterr(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tf_errbuf, sizeof tf_errbuf, fmt, ap);
    va_end(ap);
    return code;
}

void tf__clearerr(void) { tf_errbuf[0] = '\0'; }

const char *tf_last_error(void) { return tf_errbuf; }

const char *tf_strerror(int err) {
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
    default: break;
    }
    /* strerror() is not thread-safe; strerror_r (GNU) returns a static or
     * thread-safe string for known codes. */
    static _Thread_local char buf[128];
    return strerror_r(err, buf, sizeof buf);
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
