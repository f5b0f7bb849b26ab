/* features.c — run-time probes for optional features compiled in. */
#include <stdio.h>
#include <string.h>

#include "internal.h"

#ifdef TF_HAVE_IO_URING
#include <liburing.h>
#endif

int tf_io_uring_usable(char *why, size_t why_len) {
#ifdef TF_HAVE_IO_URING
    struct io_uring ring;
    int rc = io_uring_queue_init(8, &ring, 0);
    if (rc < 0) {
        if (why && why_len)
            snprintf(why, why_len, "io_uring_queue_init failed: %s%s", strerror(-rc),
                     rc == -EPERM ? " (blocked by seccomp or kernel.io_uring_disabled)"
                     : rc == -ENOSYS ? " (kernel without io_uring)"
                     : rc == -ENOMEM ? " (memlock limit too low)" : "");
        return 0;
    }
    io_uring_queue_exit(&ring);
    if (why && why_len) snprintf(why, why_len, "usable");
    return 1;
#else
    if (why && why_len) snprintf(why, why_len, "not compiled in (liburing headers were not found at build time)");
    return 0;
#endif
}
