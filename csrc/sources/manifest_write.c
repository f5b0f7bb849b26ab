/*
 * manifest_write.c — publishing a dataset's manifest, for the writer and the
 * merge (docs/format.md, "Manifest" and "Writing atomically"), through the
 * directory's descriptor (safe_fs.h).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "manifest_write.h"
#include "safe_fs.h"
#include "source.h"

void tf__remove_replaced_shards(int dfd, const char *dir, const uint8_t *old, size_t len, const char *const *keep,
                                uint64_t nkeep) {
    tf_manifest m;
    if (tf__parse_manifest(dir, old, len, &m) < 0) {
        tf__clearerr();
        return; /* unreadable: leave it and its shards alone */
    }
    for (uint64_t i = 0; i < m.num_shards; i++) {
        int kept = 0;
        for (uint64_t k = 0; k < nkeep && !kept; k++) kept = strcmp(m.shards[i].name, keep[k]) == 0;
        if (!kept) tf__unlink_regular(dfd, m.shards[i].name);
    }
    tf__manifest_free(&m);
}

/* ------------------------------------------------------------------------ */
/* manifests                                                                 */
/* ------------------------------------------------------------------------ */

int tf__strbuf_append(char **buf, size_t *len, size_t *cap, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(*buf ? *buf + *len : NULL, *buf ? *cap - *len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) return -EINVAL;
        if (*buf && *len + (size_t)n < *cap) {
            *len += (size_t)n;
            return 0;
        }
        size_t nc = (*cap ? *cap * 2 : 4096) + (size_t)n;
        char *nb = realloc(*buf, nc);
        if (!nb) return -ENOMEM;
        *buf = nb;
        *cap = nc;
    }
}

int tf__manifest_text(char **buf, size_t *len, int version, tf_dtype dt, uint64_t vocab, uint64_t nshards,
                      const char *lines, size_t llen) {
    size_t cap = 0;
    *buf = NULL;
    *len = 0;
    int rc = tf__strbuf_append(buf, len, &cap, "tokenfeed-manifest %d\ndtype %s\nvocab_size %llu\nnum_shards %llu\n",
                               version, tf_dtype_name(dt), (unsigned long long)vocab, (unsigned long long)nshards);
    if (rc == 0 && llen) rc = tf__strbuf_append(buf, len, &cap, "%.*s", (int)llen, lines);
    if (rc == 0) rc = tf__strbuf_append(buf, len, &cap, "end %016llx\n", (unsigned long long)tf_hash64(*buf, *len, 0));
    if (rc < 0) {
        free(*buf);
        *buf = NULL;
    }
    return rc;
}

int tf__manifest_publish(int dfd, const char *dir, const char *buf, size_t len, uint8_t **old, size_t *old_len,
                         int *renamed) {
    *renamed = 0;
    if (old) {
        *old = NULL;
        *old_len = 0;
    }
    char tmp[64];
    int fd;
    TF_TRY(tf__tmp_create(dfd, dir, TF_MANIFEST_NAME, tmp, sizeof tmp, &fd));
    int rc = 0;
    for (size_t off = 0; off < len && !rc;) {
        ssize_t w = write(fd, buf + off, len - off);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) rc = tf__seterr(-errno, "%s/%s: write failed: %s", dir, tmp, strerror(errno));
        else off += (size_t)w;
    }
    if (!rc && fsync(fd) != 0) rc = tf__seterr(-errno, "%s/%s: fsync failed: %s", dir, tmp, strerror(errno));
    close(fd);
    if (!rc) rc = tf__fsync_dir(dfd, dir);
    if (!rc && old) {
        int r = tf__read_file_at(dfd, dir, TF_MANIFEST_NAME, (size_t)1 << 30, old, old_len);
        if (r < 0 && r != -ENOENT) rc = r;
    }
    if (!rc) rc = tf__rename_at(dfd, dir, tmp, TF_MANIFEST_NAME, 0);
    if (rc) {
        unlinkat(dfd, tmp, 0);
        if (old) {
            free(*old);
            *old = NULL;
        }
        return rc;
    }
    *renamed = 1;
    return tf__fsync_dir(dfd, dir);
}
