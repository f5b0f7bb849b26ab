/* eio_shim.c — LD_PRELOAD shim for tests/engine/test_faults.py: makes pread() on one
 * file fail with EIO (or return short), the way a failing disk or a network
 * file system would, without root or a device-mapper target.
 *
 *   EIO_SHIM_MATCH=substring   only descriptors whose /proc/self/fd link holds it
 *   EIO_SHIM_NTH=N             the Nth matching pread (from 1) is faulted ...
 *   EIO_SHIM_COUNT=K           ... and the K-1 after it (default 1)
 *   EIO_SHIM_MODE=eio|short    fail with EIO (default), or return half the bytes
 *
 * Build: cc -shared -fPIC -O1 -o eio_shim.so eio_shim.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

typedef ssize_t (*pread_fn)(int, void *, size_t, off_t);
static _Atomic long seen;

static int matches(int fd) {
    const char *m = getenv("EIO_SHIM_MATCH");
    if (!m || !*m) return 0;
    char link[64], target[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n <= 0) return 0;
    target[n] = '\0';
    return strstr(target, m) != NULL;
}

static ssize_t shim(const char *sym, int fd, void *buf, size_t len, off_t off) {
    pread_fn real = (pread_fn)dlsym(RTLD_NEXT, sym);
    if (!real) {
        errno = ENOSYS;
        return -1;
    }
    if (matches(fd)) {
        long k = atomic_fetch_add(&seen, 1) + 1;
        const char *e = getenv("EIO_SHIM_NTH"), *c = getenv("EIO_SHIM_COUNT"), *mode = getenv("EIO_SHIM_MODE");
        long nth = e ? atol(e) : 1, cnt = c ? atol(c) : 1;
        if (k >= nth && k < nth + cnt) {
            if (mode && !strcmp(mode, "short")) return real(fd, buf, len > 1 ? len / 2 : len, off);
            errno = EIO;
            return -1;
        }
    }
    return real(fd, buf, len, off);
}

ssize_t pread(int fd, void *buf, size_t len, off_t off) { return shim("pread", fd, buf, len, off); }
ssize_t pread64(int fd, void *buf, size_t len, off_t off) { return shim("pread64", fd, buf, len, off); }
