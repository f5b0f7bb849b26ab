/*
 * merge.c — tf_dataset_merge: one dataset made of parts written independently
 * (docs/format.md, "Datasets made of parts").
 *
 * The merge reads each part's manifest and writes the dataset's manifest
 * (format version 2) naming every part's shards by their path relative to
 * the dataset directory; no token data is read or copied. A merge that
 * writes runs holding the directory's lock (safe_fs.h), as a writer does, so
 * a merge and a writer (or two merges) into one directory never interleave
 * (one that finds the manifest already equal to its result writes nothing and
 * takes no lock), and it
 * publishes through the same path as the writer (a temporary file created
 * O_EXCL|O_NOFOLLOW, renamed relative to the directory's descriptor).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "manifest_write.h"
#include "safe_fs.h"
#include "source.h"

typedef unsigned long long ull;

/* Read and parse the manifest of dir/part. */
static int read_part_manifest(const char *dir, const char *part, uint64_t index, uint64_t nparts, tf_manifest *m,
                              char **mpath) {
    memset(m, 0, sizeof *m);
    char *pdir = tf__path_join(dir, part);
    *mpath = pdir ? tf__path_join(pdir, TF_MANIFEST_NAME) : NULL;
    free(pdir);
    if (!*mpath) return -ENOMEM;
    struct stat st;
    if (stat(*mpath, &st) != 0) {
        int e = errno;
        if (e == ENOENT)
            TF_FAIL(-TF_EFORMAT, "%s: part %llu of %llu has no manifest: the task that writes it did not finish. Run that task again, then merge.",
                    *mpath, (ull)index, (ull)nparts);
        TF_FAIL(-e, "%s: cannot read part %llu: %s", *mpath, (ull)index, strerror(e));
    }
    void *map = NULL;
    size_t len = 0;
    TF_TRY(tf__map_file(*mpath, &map, &len));
    int rc = tf__parse_manifest(*mpath, map, len, m);
    tf__unmap(map, len);
    return rc;
}

static int check_part_names(const char *dir, const char *const *parts, uint64_t nparts) {
    for (uint64_t i = 0; i < nparts; i++) {
        if (!parts[i] || !tf__manifest_name_ok(parts[i], strlen(parts[i]), 1))
            TF_FAIL(-EINVAL, "part %llu: expected a path relative to %s without '..', a leading '/' or empty parts, found \"%s\". Put the parts inside the dataset directory.",
                    (ull)i, dir, parts[i] ? parts[i] : "(null)");
        for (uint64_t k = 0; k < i; k++)
            if (strcmp(parts[k], parts[i]) == 0)
                TF_FAIL(-EINVAL, "part %llu: expected each part once, found \"%s\" as part %llu too", (ull)i, parts[i], (ull)k);
    }
    return 0;
}

/* The merged manifest's text in *buf: every part's shards, in part order. */
static int merged_text(const char *dir, const char *const *parts, uint64_t nparts, char **buf, size_t *len) {
    char *lines = NULL, *mpath = NULL, *first = NULL;
    size_t llen = 0, lcap = 0;
    uint64_t nshards = 0, vocab = 0;
    tf_dtype dt = TF_DTYPE_INVALID;
    int rc = 0;
    for (uint64_t i = 0; i < nparts && rc == 0; i++) {
        tf_manifest m;
        rc = read_part_manifest(dir, parts[i], i, nparts, &m, &mpath);
        if (rc == 0 && i == 0) {
            dt = m.dtype;
            vocab = m.vocab_size;
            first = mpath;
            mpath = NULL;
        } else if (rc == 0 && m.dtype != dt) {
            rc = tf__seterr(-TF_EFORMAT, "%s: dtype: expected %s as in %s, found %s. The parts were written with different settings: write every part with the same vocabulary size.",
                            mpath, tf_dtype_name(dt), first, tf_dtype_name(m.dtype));
        } else if (rc == 0 && m.vocab_size != vocab) {
            rc = tf__seterr(-TF_EFORMAT, "%s: vocab_size: expected %llu as in %s, found %llu. The parts were written with different settings: write every part with the same tokenizer and vocabulary size.",
                            mpath, (ull)vocab, first, (ull)m.vocab_size);
        }
        for (uint64_t k = 0; rc == 0 && k < m.num_shards; k++) {
            const tf_manifest_shard *s = &m.shards[k];
            if (strlen(parts[i]) + 1 + strlen(s->name) > TF_MANIFEST_MAX_PATH)
                rc = tf__seterr(-EINVAL, "%s: shard %s: the path %s/%s is longer than %d bytes. Use a shorter part path.",
                                mpath ? mpath : first, s->name, parts[i], s->name, TF_MANIFEST_MAX_PATH);
            else
                rc = tf__strbuf_append(&lines, &llen, &lcap, "shard %s/%s %llu %llu %016llx %016llx\n", parts[i], s->name,
                                       (ull)s->num_tokens, (ull)s->num_docs, (ull)s->tokens_checksum,
                                       (ull)s->docs_checksum);
            nshards++;
        }
        tf__manifest_free(&m);
        free(mpath);
        mpath = NULL;
    }
    if (rc == 0 && nparts == 0) rc = tf__seterr(-EINVAL, "%s: no parts to merge", dir);
    if (rc == 0) rc = tf__manifest_text(buf, len, 2, dt, vocab, nshards, lines, llen);
    free(lines);
    free(first);
    return rc;
}

/* What is in dir now: 0 none, 1 a writer's dataset (version 1), 2 a previous
 * merge, -1 a manifest that does not parse; *same when it equals buf. */
static int current_manifest(int dfd, const char *dir, const char *buf, size_t len, int *same) {
    uint8_t *old = NULL;
    size_t olen = 0;
    *same = 0;
    int r = tf__read_file_at(dfd, dir, TF_MANIFEST_NAME, (size_t)1 << 30, &old, &olen);
    tf__clearerr();
    if (r < 0) return r == -ENOENT ? 0 : -1;
    *same = olen == len && memcmp(old, buf, len) == 0;
    tf_manifest m;
    int kind = tf__parse_manifest(dir, old, olen, &m) == 0 ? (m.version >= 2 ? 2 : 1) : -1;
    if (kind > 0) tf__manifest_free(&m);
    tf__clearerr();
    free(old);
    return kind;
}

int tf_dataset_merge(const char *dir, const char *const *parts, uint64_t nparts, int overwrite) {
    tf__clearerr();
    if (!dir || !*dir) TF_FAIL(-EINVAL, "dir: expected a directory path, found none");
    if (nparts && !parts) TF_FAIL(-EINVAL, "parts is NULL");
    TF_TRY(check_part_names(dir, parts, nparts));
    int dfd = -1, lock_fd = -1;
    char *buf = NULL;
    size_t len = 0;
    int same = 0, kind = 0;
    int rc = tf__dir_open(dir, 0, &dfd);
    /* Idempotent: the same parts give the same bytes, and a manifest already
     * equal to them is left as it is. That is known before anything is
     * written, so it is decided first, without the lock: a merged dataset on
     * read-only storage (where the lock file cannot be created) merges again
     * as the no-op it is. Only a merge that writes takes the lock, and then
     * reads the parts and the manifest again under it (another merge or a
     * part writer may have changed them meanwhile). */
    if (rc == 0) {
        /* (a merge that cannot be made is reported as before, under the
         * lock: a writer still at work here is said first) */
        if (merged_text(dir, parts, nparts, &buf, &len) == 0 && current_manifest(dfd, dir, buf, len, &same) >= 0 && same)
            goto out;
        free(buf);
        buf = NULL;
        tf__clearerr();
        rc = tf__dir_lock(dfd, dir, "this merge", &lock_fd);
    }
    if (rc == 0) rc = merged_text(dir, parts, nparts, &buf, &len);
    if (rc < 0) goto out;
    /* A previous merge (version 2) is replaced; a dataset written by a
     * writer only with overwrite. */
    kind = current_manifest(dfd, dir, buf, len, &same);
    if (same) goto out;
    if (kind != 0 && kind != 2 && !overwrite) {
        rc = tf__seterr(-EEXIST, "%s: a dataset that is not a merge of parts already exists here (%s). Pass overwrite to replace it (its shards are removed once the merged manifest is in place), or merge into another directory.",
                        dir, TF_MANIFEST_NAME);
        goto out;
    }
    if (kind == 0) tf__clean_unpublished(dfd); /* what killed writers left */
    uint8_t *old = NULL;
    size_t olen = 0;
    int renamed;
    rc = tf__manifest_publish(dfd, dir, buf, len, kind == 1 ? &old : NULL, &olen, &renamed);
    /* the replaced writer's shards are named by nothing now; a previous
     * merge's shards belong to its parts and stay */
    if (renamed && old) tf__remove_replaced_shards(dfd, dir, old, olen, NULL, 0);
    free(old);
out:
    free(buf);
    tf__dir_unlock(dfd, lock_fd);
    if (dfd >= 0) close(dfd);
    return rc;
}
