/* helpers.h — tiny harness for the C test programs (exit 0 pass, 1 fail,
 * 77 skip), in the style of liburing's test/helpers.h. */
#ifndef TF_TEST_HELPERS_H
#define TF_TEST_HELPERS_H
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define TF_EXPERIMENTAL_API /* the tests cover the experimental API too */
#include "tokenfeed.h"

#define T_EXIT_PASS 0
#define T_EXIT_FAIL 1
#define T_EXIT_SKIP 77

static int t_failures;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);               \
            t_failures++;                                                                          \
        }                                                                                          \
    } while (0)

/* Expect a library call to return 0; prints the library's message if not. */
#define CHECK_OK(expr)                                                                             \
    do {                                                                                           \
        int t_rc = (expr);                                                                         \
        if (t_rc != 0) {                                                                           \
            fprintf(stderr, "%s:%d: %s returned %d (%s): %s\n", __FILE__, __LINE__, #expr, t_rc,   \
                    tf_strerror(t_rc), tf_last_error());                                           \
            t_failures++;                                                                          \
        }                                                                                          \
    } while (0)

#define CHECK_RC(expr, want)                                                                       \
    do {                                                                                           \
        int t_rc = (expr);                                                                         \
        if (t_rc != (want)) {                                                                      \
            fprintf(stderr, "%s:%d: %s returned %d, expected %d (%s)\n", __FILE__, __LINE__,       \
                    #expr, t_rc, (int)(want), tf_last_error());                                    \
            t_failures++;                                                                          \
        }                                                                                          \
    } while (0)

/* xorshift64: a reproducible stream of pseudo-random numbers from *state
 * (which must not be 0). */
static inline uint64_t t_xorshift(uint64_t *state) {
    uint64_t x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *state = x;
}

/* Make a fresh directory $TMPDIR/<name>_XXXXXX (TMPDIR defaults to /tmp) and
 * put its path in buf. 0, or -1 with the reason printed. */
static inline int t_mkdtemp(char *buf, size_t cap, const char *name) {
    const char *base = getenv("TMPDIR");
    snprintf(buf, cap, "%s/%s_XXXXXX", base && *base ? base : "/tmp", name);
    if (!mkdtemp(buf)) {
        perror(buf);
        return -1;
    }
    return 0;
}

/* Remove a file, or a directory and everything below it; a symbolic link is
 * removed, never followed. */
static inline void t_rm_rf(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) return;
    if (!S_ISDIR(st.st_mode)) {
        unlink(path);
        return;
    }
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        char p[1024];
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            if ((size_t)snprintf(p, sizeof p, "%s/%s", path, e->d_name) < sizeof p) t_rm_rf(p);
        }
        closedir(d);
    }
    rmdir(path);
}

/* The whole file in a malloc'd buffer with a NUL after its *n bytes, or NULL
 * if it cannot be read. The caller frees it. */
static inline uint8_t *t_read_file(const char *path, size_t *n) {
    *n = 0;
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    long len = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *b = len < 0 ? NULL : malloc((size_t)len + 1);
    if (b && fread(b, 1, (size_t)len, fp) != (size_t)len) {
        free(b);
        b = NULL;
    }
    fclose(fp);
    if (!b) return NULL;
    b[len] = 0;
    *n = (size_t)len;
    return b;
}

/* Write n bytes to path (replacing it); a failure counts as a failed check. */
static inline void t_write_file(const char *path, const void *data, size_t n) {
    FILE *fp = fopen(path, "wb");
    if (!fp) {
        perror(path);
        t_failures++;
        return;
    }
    if (n && fwrite(data, 1, n, fp) != n) t_failures++;
    if (fclose(fp) != 0) t_failures++;
}

/* Writer settings: the library's defaults but for the dtype, the vocabulary,
 * shards of shard_tokens and blocks of block_tokens (0 keeps the default for
 * either) and zstd compression when zstd is set. */
static inline tf_writer_options t_writer_options(tf_dtype dt, uint64_t vocab, uint64_t shard_tokens,
                                                 uint64_t block_tokens, int zstd) {
    tf_writer_options o;
    tf_writer_options_init(&o);
    o.dtype = dt;
    o.vocab_size = vocab;
    if (shard_tokens) o.shard_tokens = shard_tokens;
    if (block_tokens) o.block_tokens = block_tokens;
    o.compression = zstd ? TF_COMPRESS_ZSTD : TF_COMPRESS_NONE;
    return o;
}

/* The longest document a t_doc_fn may make. */
#define T_DOC_MAX 4096

/* Document d of a test dataset: its tokens into buf (room for T_DOC_MAX), and
 * its length returned. ctx is what the caller gave t_write_dataset. */
typedef uint64_t (*t_doc_fn)(void *ctx, uint64_t d, uint32_t *buf);

/* Write a dataset of ndocs documents made by doc, in order, into dir with
 * settings o, and publish it. 0, or the library's error (-E2BIG for a
 * document longer than T_DOC_MAX). */
static inline int t_write_dataset(const char *dir, const tf_writer_options *o, uint64_t ndocs, t_doc_fn doc,
                                  void *ctx) {
    tf_writer *w = NULL;
    int rc = tf_writer_create(dir, o, &w);
    uint32_t *buf = rc ? NULL : malloc(T_DOC_MAX * sizeof *buf);
    if (!rc && !buf) rc = -ENOMEM;
    for (uint64_t d = 0; d < ndocs && !rc; d++) {
        uint64_t n = doc(ctx, d, buf);
        rc = n > T_DOC_MAX ? -E2BIG : tf_writer_add_document(w, buf, n, TF_UINT32);
    }
    if (!rc) rc = tf_writer_finish(w);
    tf_writer_free(w);
    free(buf);
    return rc;
}

/* Order settings: the library's defaults but for seq_len. */
static inline tf_order_config t_order_config(uint64_t seq_len) {
    tf_order_config c;
    tf_order_config_init(&c);
    c.seq_len = seq_len;
    return c;
}

/* An order over ds with settings c, or NULL with the failure counted. */
static inline tf_order *t_order_create(const tf_dataset *ds, const tf_order_config *c) {
    tf_order *o = NULL;
    CHECK_OK(tf_order_create(ds, c, &o));
    return o;
}

/* Loader settings for one rank of one: the library's defaults but for
 * seq_len and batch_size, which is then the global batch too. */
static inline tf_loader_config t_loader_config(uint64_t seq_len, uint64_t batch_size) {
    tf_loader_config c;
    tf_loader_config_init(&c);
    c.order.seq_len = seq_len;
    c.batch_size = batch_size;
    c.order.global_batch = batch_size;
    return c;
}

/* A loader over ds with settings c, or NULL with the failure counted. */
static inline tf_loader *t_loader_create(const tf_dataset *ds, const tf_loader_config *c) {
    tf_loader *l = NULL;
    CHECK_OK(tf_loader_create(ds, c, &l));
    return l;
}

#define T_DONE() (t_failures ? (fprintf(stderr, "%d check(s) failed\n", t_failures), T_EXIT_FAIL) : T_EXIT_PASS)

#endif
