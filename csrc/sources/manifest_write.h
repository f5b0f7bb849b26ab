/*
 * manifest_write.h — publishing a dataset's manifest (writer.c, merge.c).
 */
#ifndef TF_MANIFEST_WRITE_H
#define TF_MANIFEST_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "../common/internal.h"

/* printf-append to the growing buffer *buf (length *len, capacity *cap). */
TF_HIDDEN int tf__strbuf_append(char **buf, size_t *len, size_t *cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Manifest text: the header, the shard lines already formatted in
 * lines[0, llen), and the end line over all of it. *buf is malloc'ed. */
TF_HIDDEN int tf__manifest_text(char **buf, size_t *len, int version, tf_dtype dt, uint64_t vocab, uint64_t nshards,
                                const char *lines, size_t llen);

/* Publish buf[0, len) as dfd's manifest: write it to a new temporary file
 * (tf__tmp_create), fsync it, fsync the directory (every shard renamed into
 * place before is then durable before a manifest names it), rename it over
 * the manifest (the atomic switch readers see) and fsync the directory.
 * *renamed says whether the switch happened. With old, the previous
 * manifest's bytes (read O_NOFOLLOW; NULL when there was none) go to *old. */
TF_HIDDEN int tf__manifest_publish(int dfd, const char *dir, const char *buf, size_t len, uint8_t **old,
                                   size_t *old_len, int *renamed);

/* Remove the shards of the manifest text old[0, len) (a dataset replaced by
 * another) that keep[0, nkeep) does not name, through tf__unlink_regular.
 * Failures only leave garbage behind. */
TF_HIDDEN void tf__remove_replaced_shards(int dfd, const char *dir, const uint8_t *old, size_t len,
                                          const char *const *keep, uint64_t nkeep);

#endif
