/*
 * fuzz_util.h — shared helpers for the libFuzzer targets in tests/fuzz/.
 *
 * Every target defines LLVMFuzzerTestOneInput(data, size). Built two ways:
 *   - with clang -fsanitize=fuzzer,address,undefined (make -C csrc fuzz) for
 *     fuzzing runs, and
 *   - with any cc plus replay.c (make -C csrc replay, part of make test) to
 *     replay the saved corpus without libFuzzer.
 * Targets link the static library so that the hidden tf__ parsers are
 * reachable.
 *
 * Contract under test: whatever the bytes, the library returns 0 or a
 * negative code and never reads or writes out of bounds, never aborts, never
 * leaks. Error codes themselves are fine.
 *
 * Inputs that are several files use a tiny container: a sequence of chunks,
 * each a little-endian u16 length followed by that many bytes; a length that
 * runs past the end takes the rest. (fuzz_split below.)
 */
#ifndef TF_FUZZ_UTIL_H
#define TF_FUZZ_UTIL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sources/source.h"
#include "tokenfeed.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A scratch directory per process, on tmpfs when there is one. Files written
 * by one input are removed before the next (fuzz_clean). */
static char fuzz_dir_path[256];

/* Remove every file in dir (names are ours or came from fuzzed input; both
 * are plain names inside the directory). */
static inline void fuzz_unlink_all(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[700];
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.' && (e->d_name[1] == 0 || (e->d_name[1] == '.' && e->d_name[2] == 0))) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    closedir(d);
}

static inline void fuzz_rmdir_at_exit(void) {
    fuzz_unlink_all(fuzz_dir_path);
    rmdir(fuzz_dir_path);
}

static inline const char *fuzz_dir(void) {
    if (!fuzz_dir_path[0]) {
        struct stat st;
        const char *base = stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) && access("/dev/shm", W_OK) == 0 ? "/dev/shm" : NULL;
        if (!base) base = getenv("TMPDIR");
        if (!base) base = "/tmp";
        snprintf(fuzz_dir_path, sizeof fuzz_dir_path, "%s/tokenfeed-fuzz-XXXXXX", base);
        if (!mkdtemp(fuzz_dir_path)) {
            perror("mkdtemp");
            abort();
        }
        atexit(fuzz_rmdir_at_exit);
    }
    return fuzz_dir_path;
}

/* Remove every file in the scratch directory. */
static inline void fuzz_clean(void) { fuzz_unlink_all(fuzz_dir()); }

/* Path of name inside the scratch directory (static buffer per slot). */
static inline const char *fuzz_path(int slot, const char *name) {
    static char bufs[4][600];
    snprintf(bufs[slot & 3], sizeof bufs[0], "%s/%s", fuzz_dir(), name);
    return bufs[slot & 3];
}

static inline void fuzz_write(const char *path, const uint8_t *p, size_t n) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return; /* e.g. a manifest-supplied name that is too long */
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w <= 0) break;
        p += w;
        n -= (size_t)w;
    }
    close(fd);
}

/* An llm.c shard of 40 tokens (100 * i + t) at path. */
static inline void fuzz_write_llmc(const char *path, int i) {
    int32_t hdr[256 + 20];
    memset(hdr, 0, sizeof hdr);
    hdr[0] = 20240520;
    hdr[1] = 1;
    hdr[2] = 40;
    uint16_t *tok = (uint16_t *)(hdr + 256);
    for (int t = 0; t < 40; t++) tok[t] = (uint16_t)(t + 100 * i);
    fuzz_write(path, (const uint8_t *)hdr, sizeof hdr);
}

typedef struct fuzz_chunk {
    const uint8_t *p;
    size_t n;
} fuzz_chunk;

/* Split data into at most max chunks (see the container above). Returns the
 * number of chunks; missing ones are empty. */
static inline int fuzz_split(const uint8_t *data, size_t size, fuzz_chunk *out, int max) {
    int k = 0;
    memset(out, 0, sizeof *out * (size_t)max);
    while (k < max && size >= 2) {
        size_t n = (size_t)data[0] | (size_t)data[1] << 8;
        data += 2;
        size -= 2;
        if (n > size || k == max - 1) n = n > size ? size : n;
        out[k].p = data;
        out[k].n = n;
        k++;
        data += n;
        size -= n;
    }
    return k;
}

/* The native header and the manifest carry checksums over their own bytes,
 * which random mutations almost never satisfy. To reach the checks behind
 * them, the targets rewrite the checksum to the right value unless the
 * input asks otherwise (low bit of the stored checksum's first byte set). */
static inline void fuzz_fix_native_header(uint8_t *buf, size_t len) {
    if (len < TF_NATIVE_HEADER_SIZE || memcmp(buf, TF_NATIVE_MAGIC, 8) != 0) return;
    if (buf[TF_NATIVE_HDR_CHECKSUM_AT] & 1) return;
    tf__put_le64(buf + TF_NATIVE_HDR_CHECKSUM_AT, tf_hash64(buf, TF_NATIVE_HDR_CHECKSUM_AT, 0));
}

/* Manifest: if the text ends with "end <16 hex>\n", recompute the hex digits
 * over the bytes before that line. */
static inline void fuzz_fix_manifest(uint8_t *buf, size_t len) {
    static const char hex[] = "0123456789abcdef";
    if (len < 21 || buf[len - 1] != '\n' || memcmp(buf + len - 21, "end ", 4) != 0) return;
    if (len > 21 && buf[len - 22] != '\n') return;
    if (buf[len - 17] == 'x') return; /* opt-out: keep the bytes as given */
    uint64_t h = tf_hash64(buf, len - 21, 0);
    for (int i = 0; i < 16; i++) buf[len - 17 + i] = (uint8_t)hex[(h >> (60 - 4 * i)) & 15];
}

/* Everything a consumer does with an opened dataset, bounded so that a
 * header claiming 2^60 tokens cannot make one input take minutes: read
 * documents (copy and zero-copy view), find documents, verify each file,
 * then pack samples with tf_order and fill a few. ctl picks the order
 * configuration. */
static inline void fuzz_exercise(tf_dataset *ds, uint32_t ctl) {
    tf_dataset_info info;
    if (tf_dataset_get_info(ds, &info) != 0) abort();
    static int64_t buf[4096];
    uint64_t nd = info.num_documents < 64 ? info.num_documents : 64;
    for (uint64_t j = 0; j < nd; j++) {
        uint64_t i = j < 32 ? j : info.num_documents - 1 - (j - 32);
        uint64_t s, n, k;
        if (tf_dataset_document(ds, i, &s, &n) != 0) continue;
        if (s > info.num_tokens || n > info.num_tokens - s) abort(); /* the API promises in-range documents */
        uint64_t m = n < 4096 ? n : 4096;
        tf_dataset_read(ds, s, m, buf, TF_INT64);
        const void *v;
        tf_dtype vd;
        if (tf_dataset_view(ds, s, m, &v, &vd) == 0 && m) {
            volatile uint8_t sink = ((const uint8_t *)v)[m * tf_dtype_size(vd) - 1];
            (void)sink;
        }
        if (n && tf_dataset_find_document(ds, s, &k) == 0 && k >= info.num_documents) abort();
    }
    if (info.num_tokens) {
        uint64_t k;
        tf_dataset_find_document(ds, info.num_tokens - 1, &k);
        tf_dataset_find_document(ds, info.num_tokens / 2, &k);
        uint64_t m = info.num_tokens < 4096 ? info.num_tokens : 4096;
        tf_dataset_read(ds, info.num_tokens - m, m, buf, TF_UINT16);
    }
    /* verify, file by file on this thread (tf_dataset_verify would start a
     * thread and poll every 20 ms, which is too slow per input). Skipped for
     * files whose token count is far beyond what the input could hold. */
    for (uint64_t i = 0; i < ds->nfiles; i++) {
        const tf_file *f = &ds->files[i];
        if (f->num_tokens > (1u << 22)) continue;
        _Atomic uint64_t progress = 0;
        _Atomic int cancel = 0;
        tf__file_verify(f, ds->vocab_size, &progress, &cancel);
    }

    tf_order_config cfg;
    tf_order_config_init(&cfg);
    cfg.seq_len = 1 + (ctl & 31);
    cfg.shuffle = (tf_shuffle)((ctl >> 5) % 3);
    cfg.separator_id = (ctl >> 7) & 1 ? (int64_t)((ctl >> 8) & 3) : -1;
    cfg.block_size = 1 + ((ctl >> 10) & 7);
    cfg.window_blocks = 1 + ((ctl >> 13) & 3);
    cfg.global_batch = 1 + ((ctl >> 15) & 3);
    cfg.epochs = (ctl >> 17) & 1;
    cfg.seed = ctl;
    tf_order *o = NULL;
    if (tf_order_create(ds, &cfg, &o) != 0) return;
    uint64_t N = tf_order_num_samples(o), L = cfg.seq_len;
    static int32_t pos[64], cu[65], ns[1];
    static uint8_t mask[64];
    tf_sample_extras ex = {pos, cu, ns, mask};
    uint64_t picks[6] = {0, N - 1, N / 2, 1 % N, tf_order_sample_at(o, 0), tf_order_sample_at(o, N ? 2 * N - 1 : 0)};
    for (int t = 0; t < 6; t++) {
        if (picks[t] >= N) abort();
        ns[0] = 0;
        if (tf_order_fill_sample(o, picks[t], buf, t & 1 ? TF_UINT32 : TF_INT64, t & 2 ? NULL : &ex) == 0 && !(t & 2) &&
            (ns[0] < 1 || (uint64_t)ns[0] > L + 1 || cu[0] != 0))
            abort(); /* extras out of their documented ranges */
    }
    tf_order_free(o);
}

/* A data file and its companion from one input: chunk 0 written as name0,
 * chunk 1 (when the input has two chunks) as name1, then opened with opt and
 * exercised with ctl; the scratch directory is emptied after. */
static inline void fuzz_open_pair(const uint8_t *data, size_t size, const char *name0, const char *name1,
                                  const tf_open_options *opt, uint32_t ctl) {
    fuzz_chunk c[2];
    int k = fuzz_split(data, size, c, 2);
    const char *p = fuzz_path(0, name0);
    fuzz_write(p, c[0].p, c[0].n);
    if (k > 1) fuzz_write(fuzz_path(1, name1), c[1].p, c[1].n);
    tf_dataset *ds = NULL;
    if (tf_dataset_open(p, opt, &ds) == 0) {
        fuzz_exercise(ds, ctl);
        tf_dataset_free(ds);
    }
    fuzz_clean();
}

#endif
