/*
 * writer.c — tf_writer: writes a native dataset directory (docs/format.md).
 *
 * Design:
 *   - One run = one random 32-bit run id; shards are named
 *     shard-<runid 8 hex>-<index 5 digits>.tfs, so a rewrite never touches the
 *     files the current manifest refers to.
 *   - A shard is written to ".<name>.<random>.tmp" (created O_EXCL|O_NOFOLLOW,
 *     safe_fs.h): header placeholder (zeros), tokens at offset 4096, document
 *     index, block table (zstd only), then the real header with pwrite, fsync,
 *     rename (never over an existing name). The manifest is written last the
 *     same way and the directory fsynced before and after its rename, so a
 *     reader sees the old complete dataset or the new complete dataset, never
 *     a mix.
 *   - The directory is opened once; every file is reached relative to that
 *     descriptor without following symlinks, because the directory may be
 *     shared with other users (safe_fs.h). A writer holds the directory's
 *     lock (".tokenfeed.lock", flock) from create to free: a second writer or
 *     merge into the same directory is refused at once instead of deleting
 *     this one's files. Holding it, create removes what killed writers left
 *     (temporary files; shards too when there is no manifest).
 *   - Documents stay whole inside one shard: before adding a document, the
 *     writer rolls over when the current shard holds tokens and would pass
 *     shard_tokens. A document larger than shard_tokens gets a shard of its own.
 *   - A document is validated entirely (ids within [0, vocab_size)) before any
 *     of it is written, so a -TF_EVOCAB failure leaves the writer usable and
 *     the shard unchanged.
 *   - Checksums are computed while streaming: XXH64 over the uncompressed
 *     little-endian token bytes, so compressed and uncompressed twins agree.
 *   - zstd: tokens are gathered into blocks of block_tokens; each block is one
 *     independent frame (ZSTD_compress2 on a reused CCtx with the level and the
 *     frame checksum flag set as sticky parameters; ZSTD_compressCCtx would
 *     reset them and drop the frame checksum).
 *   - zstd literals: a small frame spends most of its decoding time on the
 *     Huffman-coded literals (building the table, then decoding): 2048 uint16
 *     tokens decode in ~6.6 us with them and ~3.6 us with the literals stored
 *     raw, for ~10 % of ratio on BPE-tokenized text and ~4 % on i.i.d. Zipf
 *     tokens. At levels up to TF__ZSTD_FAST_LEVEL (3, the default) the writer
 *     therefore stores literals raw unless Huffman coding makes a frame at
 *     least a fifth smaller (ids concentrated on a few hundred tokens keep
 *     it): every TF__ZSTD_PROBE_BLOCKS-th block of a shard is compressed
 *     both ways and the choice holds for the blocks up to the next probe, so
 *     the bytes written depend only on the tokens and the options. Higher
 *     levels leave the choice to zstd. Either way each block is one standard
 *     frame (experimental parameter ZSTD_c_literalCompressionMode; a libzstd
 *     that refuses it just keeps Huffman literals).
 *   - An empty dataset (no documents at all) is allowed: finish writes a
 *     manifest with num_shards 0. tf_dataset_open refuses it (a dataset needs
 *     at least one token) but it can be concatenated with others. Documents of
 *     zero tokens are kept (a shard may hold only empty documents).
 *   - Errors: an I/O error poisons the writer (every later call returns it);
 *     tf_writer_free of an unfinished writer removes its temporary file and the
 *     shards of this run already renamed (no manifest refers to them).
 *   - With overwrite, the previous manifest's shards are removed only after the
 *     new manifest is in place, and only regular files reached without
 *     following a symlink; a previous manifest that cannot be parsed is left
 *     alone along with its shards.
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

#ifdef TF_HAVE_ZSTD
#define ZSTD_STATIC_LINKING_ONLY /* ZSTD_c_literalCompressionMode: set by value, so a shared libzstd takes it */
#include <zstd.h>
#endif

#include "manifest_write.h"
#include "safe_fs.h"
#include "source.h"

typedef unsigned long long ull;

enum { CHUNK_TOKENS = 1 << 16, IOBUF_BYTES = 1 << 20 };

typedef struct shard_rec {
    char name[32];
    uint64_t num_tokens, num_docs, tokens_checksum, docs_checksum;
    /* the header written into the shard and its size: what the dataset's
     * catalog records of it, without reading it back */
    uint8_t header[TF_NATIVE_HEADER_SIZE];
    uint64_t size;
} shard_rec;

struct tf_writer {
    char *dir;
    int dfd;     /* the directory, opened once */
    int lock_fd; /* its lock, held until free */
    tf_writer_options opt;
    size_t isz;
    uint32_t run_id;
    int finished;
    int error; /* sticky I/O error (negative) */

    /* current shard (fd < 0: none open) */
    int fd;
    char name[32];
    char tmp_name[64]; /* in dfd */
    char *tmp_path;    /* dir/tmp_name, for messages */
    uint64_t pos; /* bytes written so far (file offset of the next write) */
    uint64_t cur_tokens, cur_docs;
    uint64_t *ends;
    size_t ends_cap;
    tf__xxh64_state tok_hash;
    uint8_t *iobuf; /* staging for uncompressed writes */
    size_t iolen;

    /* zstd state */
    uint8_t *blk;   /* block_tokens * isz */
    uint64_t blk_fill; /* tokens in blk */
    uint8_t *zbuf, *zbuf2; /* zbuf2: the second encoding of a probe block (fast levels) */
    size_t zcap;
    int lit_raw;    /* literals stored raw in the blocks up to the next probe */
    uint8_t *table; /* 16 bytes per block */
    uint64_t nblocks;
    size_t table_cap;
#ifdef TF_HAVE_ZSTD
    ZSTD_CCtx *cctx;
#endif

    /* conversion scratch */
    int64_t *i64;
    uint8_t *conv;

    /* finished shards of this run */
    shard_rec *shards;
    uint64_t nshards;
    size_t shards_cap;
    uint64_t total_tokens, total_docs;
};

/* ------------------------------------------------------------------------ */
/* small helpers                                                             */
/* ------------------------------------------------------------------------ */


/* zstd literals (see the top of this file): levels up to this one favour decoding speed */
#define TF__ZSTD_FAST_LEVEL 3
#define TF__ZSTD_PROBE_BLOCKS 64
/* ZSTD_c_literalCompressionMode values (ZSTD_ps_auto / ZSTD_ps_disable; ZSTD_lcm_* before 1.5.1) */
#define TF__LIT_AUTO 0
#define TF__LIT_RAW 2
static int write_all(int fd, const void *buf, size_t n, const char *path) {
    return tf__pwrite_all(fd, buf, n, TF_AT_POS, path);
}

static int exists_at(int dfd, const char *name) {
    struct stat st;
    return fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0;
}

/* ------------------------------------------------------------------------ */
/* options                                                                   */
/* ------------------------------------------------------------------------ */

void tf_writer_options_init(tf_writer_options *opt) {
    if (!opt) return;
    memset(opt, 0, sizeof *opt);
    opt->dtype = TF_UINT16;
    opt->vocab_size = 0; /* must be set by the caller */
    opt->shard_tokens = 1ull << 28;
    opt->compression = TF_COMPRESS_NONE;
    opt->level = 3;
    opt->block_tokens = 2048;
    opt->overwrite = 0;
    opt->chunk_checksum_bytes = TF_NATIVE_CHUNK_BYTES;
}

static int check_options(const tf_writer_options *o) {
    if (!tf__native_dtype_code(o->dtype))
        TF_FAIL(-EINVAL, "dtype: expected uint8, uint16 or uint32, found %s", tf_dtype_name(o->dtype));
    if (o->vocab_size == 0)
        TF_FAIL(-EINVAL, "vocab_size: expected > 0, found 0. Set it to your tokenizer's vocabulary size (e.g. 50257 for GPT-2).");
    size_t isz = tf_dtype_size(o->dtype);
    if (isz < 8 && o->vocab_size > (1ull << (8 * isz)))
        TF_FAIL(-EINVAL, "vocab_size: %llu ids do not fit dtype %s (at most %llu). Use dtype=\"%s\".", (ull)o->vocab_size,
                tf_dtype_name(o->dtype), 1ull << (8 * isz), isz == 1 ? "uint16" : "uint32");
    if (o->shard_tokens == 0) TF_FAIL(-EINVAL, "shard_tokens: expected > 0, found 0");
    uint64_t cb = o->chunk_checksum_bytes;
    if (cb && (cb < 4096 || cb > (1ull << 30) || (cb & (cb - 1))))
        TF_FAIL(-EINVAL, "chunk_checksum_bytes: expected 0 or a power of two from 4096 to 2^30, found %llu", (ull)cb);
    if (o->compression != TF_COMPRESS_NONE && o->compression != TF_COMPRESS_ZSTD)
        TF_FAIL(-EINVAL, "compression: expected none (0) or zstd (1), found %d", o->compression);
    if (o->compression == TF_COMPRESS_ZSTD) {
#ifdef TF_HAVE_ZSTD
        if (o->block_tokens == 0 || o->block_tokens > TF_NATIVE_MAX_BLOCK_BYTES / isz)
            TF_FAIL(-EINVAL, "block_tokens: expected 1 to %llu, found %llu", (ull)(TF_NATIVE_MAX_BLOCK_BYTES / isz),
                    (ull)o->block_tokens);
        if (o->level < ZSTD_minCLevel() || o->level > ZSTD_maxCLevel())
            TF_FAIL(-EINVAL, "level: expected a zstd level from %d to %d, found %d", ZSTD_minCLevel(), ZSTD_maxCLevel(), o->level);
#else
        TF_FAIL(-TF_EUNSUPPORTED, "compression: this tokenfeed build lacks zstd. Rebuild with libzstd installed, or write uncompressed.");
#endif
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* create / free                                                             */
/* ------------------------------------------------------------------------ */

int tf_writer_create(const char *dir, const tf_writer_options *opt, tf_writer **out) {
    TF_NEED_ARG(out);
    *out = NULL;
    tf__clearerr();
    if (!dir || !*dir) TF_FAIL(-EINVAL, "dir: expected a directory path, found none");
    tf_writer_options dflt;
    if (!opt) {
        tf_writer_options_init(&dflt);
        opt = &dflt;
    }
    TF_TRY(check_options(opt));
    tf_writer *w = calloc(1, sizeof *w);
    if (!w) return -ENOMEM;
    w->fd = w->lock_fd = -1;
    int rc = tf__dir_open(dir, TF_DIR_CREATE, &w->dfd);
    if (rc == 0) rc = tf__dir_lock(w->dfd, dir, "this writer", &w->lock_fd);
    if (rc == 0 && !opt->overwrite && exists_at(w->dfd, TF_MANIFEST_NAME))
        rc = tf__seterr(-EEXIST, "%s: a tokenfeed dataset already exists here (%s). Pass overwrite=True to replace it, or choose another directory.",
                        dir, TF_MANIFEST_NAME);
    if (rc) {
        w->finished = 1; /* nothing of ours to remove */
        tf_writer_free(w);
        return rc;
    }
    tf__clean_unpublished(w->dfd);
    w->opt = *opt;
    w->isz = tf_dtype_size(opt->dtype);
    w->dir = strdup(dir);
    w->i64 = malloc(CHUNK_TOKENS * sizeof(int64_t));
    w->conv = malloc(CHUNK_TOKENS * sizeof(uint64_t));
    w->iobuf = malloc(IOBUF_BYTES);
    if (!w->dir || !w->i64 || !w->conv || !w->iobuf) goto nomem;
    if (opt->compression == TF_COMPRESS_ZSTD) {
#ifdef TF_HAVE_ZSTD
        size_t bb = (size_t)(opt->block_tokens * w->isz);
        w->blk = malloc(bb);
        w->zcap = ZSTD_compressBound(bb);
        w->zbuf = malloc(w->zcap);
        w->zbuf2 = opt->level <= TF__ZSTD_FAST_LEVEL ? malloc(w->zcap) : NULL;
        w->cctx = ZSTD_createCCtx();
        if (!w->blk || !w->zbuf || !w->cctx || (opt->level <= TF__ZSTD_FAST_LEVEL && !w->zbuf2)) goto nomem;
        if (ZSTD_isError(ZSTD_CCtx_setParameter(w->cctx, ZSTD_c_compressionLevel, opt->level)) ||
            ZSTD_isError(ZSTD_CCtx_setParameter(w->cctx, ZSTD_c_checksumFlag, 1))) {
            tf_writer_free(w);
            TF_FAIL(-EINVAL, "zstd: cannot set compression level %d", opt->level);
        }
#endif
    }
    /* A run id whose first shard name is free; 2^-32 odds of a clash per try. */
    for (int tries = 0;; tries++) {
        tf__random_bytes(&w->run_id, sizeof w->run_id);
        char nm[64];
        snprintf(nm, sizeof nm, "shard-%08x-00000.tfs", w->run_id);
        if (!exists_at(w->dfd, nm)) break;
        if (tries > 16) {
            tf_writer_free(w);
            TF_FAIL(-EEXIST, "%s: cannot find a free shard run id", dir);
        }
    }
    *out = w;
    return 0;
nomem:
    tf_writer_free(w);
    return -ENOMEM;
}

static void remove_run_files(tf_writer *w) {
    if (w->fd >= 0) {
        close(w->fd);
        w->fd = -1;
    }
    if (w->tmp_path) {
        unlinkat(w->dfd, w->tmp_name, 0);
        free(w->tmp_path);
        w->tmp_path = NULL;
    }
    for (uint64_t i = 0; i < w->nshards; i++) unlinkat(w->dfd, w->shards[i].name, 0);
}

void tf_writer_free(tf_writer *w) {
    if (!w) return;
    if (!w->finished) remove_run_files(w);
    if (w->fd >= 0) close(w->fd);
    tf__dir_unlock(w->dfd, w->lock_fd);
    if (w->dfd >= 0) close(w->dfd);
    free(w->tmp_path);
    free(w->dir);
    free(w->ends);
    free(w->iobuf);
    free(w->blk);
    free(w->zbuf);
    free(w->zbuf2);
    free(w->table);
#ifdef TF_HAVE_ZSTD
    ZSTD_freeCCtx(w->cctx);
#endif
    free(w->i64);
    free(w->conv);
    free(w->shards);
    free(w);
}

uint64_t tf_writer_num_documents(const tf_writer *w) { return w ? w->total_docs : 0; }
uint64_t tf_writer_num_tokens(const tf_writer *w) { return w ? w->total_tokens : 0; }

/* ------------------------------------------------------------------------ */
/* shards                                                                    */
/* ------------------------------------------------------------------------ */

static int open_shard(tf_writer *w) {
    snprintf(w->name, sizeof w->name, "shard-%08x-%05llu.tfs", w->run_id, (ull)w->nshards);
    free(w->tmp_path);
    w->tmp_path = NULL;
    TF_TRY(tf__tmp_create(w->dfd, w->dir, w->name, w->tmp_name, sizeof w->tmp_name, &w->fd));
    w->tmp_path = tf__path_join(w->dir, w->tmp_name);
    if (!w->tmp_path) return -ENOMEM;
    /* Header placeholder: the token section starts at 4096 (page-aligned). */
    static const uint8_t zeros[TF_NATIVE_TOKENS_ALIGN];
    TF_TRY(write_all(w->fd, zeros, sizeof zeros, w->tmp_path));
    w->pos = TF_NATIVE_TOKENS_ALIGN;
    w->cur_tokens = w->cur_docs = 0;
    w->iolen = 0;
    w->blk_fill = 0;
    w->nblocks = 0;
    tf__xxh64_reset(&w->tok_hash, 0);
    return 0;
}

static int flush_io(tf_writer *w) {
    if (!w->iolen) return 0;
    TF_TRY(write_all(w->fd, w->iobuf, w->iolen, w->tmp_path));
    w->pos += w->iolen;
    w->iolen = 0;
    return 0;
}

static int put_bytes(tf_writer *w, const void *data, size_t n) {
    const uint8_t *p = data;
    while (n) {
        if (w->iolen == IOBUF_BYTES) TF_TRY(flush_io(w));
        size_t k = IOBUF_BYTES - w->iolen < n ? IOBUF_BYTES - w->iolen : n;
        memcpy(w->iobuf + w->iolen, p, k);
        w->iolen += k;
        p += k;
        n -= k;
    }
    return 0;
}

static int pad_to(tf_writer *w, uint64_t align) {
    static const uint8_t zeros[8];
    uint64_t at = w->pos + w->iolen;
    uint64_t pad = (align - at % align) % align;
    return pad ? put_bytes(w, zeros, (size_t)pad) : 0;
}

#ifdef TF_HAVE_ZSTD
/* The block in w->blk as one frame in out, literals raw or as zstd chooses. */
static size_t compress_block(tf_writer *w, uint8_t *out, int lit_raw) {
    if (w->opt.level <= TF__ZSTD_FAST_LEVEL &&
        ZSTD_isError(ZSTD_CCtx_setParameter(w->cctx, ZSTD_c_literalCompressionMode,
                                            lit_raw ? TF__LIT_RAW : TF__LIT_AUTO)) && lit_raw)
        return compress_block(w, out, 0); /* a libzstd without the parameter */
    return ZSTD_compress2(w->cctx, out, w->zcap, w->blk, (size_t)(w->blk_fill * w->isz));
}

static int flush_block(tf_writer *w) {
    if (!w->blk_fill) return 0;
    const uint8_t *zb = w->zbuf;
    size_t z;
    if (w->opt.level <= TF__ZSTD_FAST_LEVEL && w->nblocks % TF__ZSTD_PROBE_BLOCKS == 0) {
        /* Probe: Huffman literals only where they make the frame a fifth smaller. */
        size_t zh = compress_block(w, w->zbuf, 0), zr = compress_block(w, w->zbuf2, 1);
        w->lit_raw = !ZSTD_isError(zh) && !ZSTD_isError(zr) && 5 * zh > 4 * zr;
        z = w->lit_raw ? zr : zh;
        if (w->lit_raw) zb = w->zbuf2;
    } else {
        z = compress_block(w, w->zbuf, w->lit_raw);
    }
    if (ZSTD_isError(z)) TF_FAIL(-EIO, "%s: zstd compression failed: %s", w->tmp_path, ZSTD_getErrorName(z));
    uint8_t *nt = tf__grow(w->table, &w->table_cap, (size_t)w->nblocks, 16, 64);
    if (!nt) return -ENOMEM;
    w->table = nt;
    uint64_t at = w->pos + w->iolen;
    tf__put_le64(w->table + 16 * w->nblocks, at - TF_NATIVE_TOKENS_ALIGN);
    tf__put_le64(w->table + 16 * w->nblocks + 8, z);
    w->nblocks++;
    w->blk_fill = 0;
    return put_bytes(w, zb, z);
}
#endif

/* Append n tokens already in the shard dtype (little-endian). */
static int put_tokens(tf_writer *w, const uint8_t *t, uint64_t n) {
    tf__xxh64_update(&w->tok_hash, t, (size_t)(n * w->isz));
    if (w->opt.compression != TF_COMPRESS_ZSTD) return put_bytes(w, t, (size_t)(n * w->isz));
#ifdef TF_HAVE_ZSTD
    while (n) {
        uint64_t k = w->opt.block_tokens - w->blk_fill;
        if (k > n) k = n;
        memcpy(w->blk + w->blk_fill * w->isz, t, (size_t)(k * w->isz));
        w->blk_fill += k;
        t += k * w->isz;
        n -= k;
        if (w->blk_fill == w->opt.block_tokens) TF_TRY(flush_block(w));
    }
    return 0;
#else
    return -TF_EUNSUPPORTED;
#endif
}

/* The chunk checksum table (docs/format.md): XXH64 of every cb bytes of the
 * stored token section [tok_off, tok_off + tok_bytes), read back from the
 * shard being written (a second pass over bytes the page cache still holds,
 * so that the writing path itself stays as it is). Returns a malloc'ed table
 * of *n entries (n may be 0). */
static int chunk_table(tf_writer *w, uint64_t tok_off, uint64_t tok_bytes, uint64_t cb, uint8_t **out, uint64_t *n) {
    *out = NULL;
    *n = tok_bytes / cb + (tok_bytes % cb != 0);
    if (!*n) return 0;
    uint8_t *t = malloc(*n * 8), *buf = malloc((size_t)cb);
    if (!t || !buf) {
        free(t);
        free(buf);
        return -ENOMEM;
    }
    int rfd = w->fd, rc = 0; /* opened O_RDWR */
    for (uint64_t i = 0; i < *n && !rc; i++) {
        uint64_t o = i * cb, len = tok_bytes - o < cb ? tok_bytes - o : cb, got = 0;
        while (got < len) {
            ssize_t r = pread(rfd, buf + got, (size_t)(len - got), (off_t)(tok_off + o + got));
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) {
                rc = r < 0 ? -errno : -EIO;
                break;
            }
            got += (uint64_t)r;
        }
        if (!rc) tf__put_le64(t + 8 * i, tf_hash64(buf, (size_t)len, 0));
    }
    free(buf);
    if (rc) {
        free(t);
        TF_FAIL(rc, "%s: cannot read the token section back for its chunk checksums: %s", w->tmp_path, strerror(-rc));
    }
    *out = t;
    return 0;
}

static int close_shard(tf_writer *w) {
    int compressed = w->opt.compression == TF_COMPRESS_ZSTD;
#ifdef TF_HAVE_ZSTD
    if (compressed) TF_TRY(flush_block(w));
#endif
    uint64_t tok_bytes = w->pos + w->iolen - TF_NATIVE_TOKENS_ALIGN;
    TF_TRY(pad_to(w, 8));
    uint64_t docs_off = w->pos + w->iolen;
    /* the ends are written as they are: the host is little-endian (native.c) */
    uint64_t docs_bytes = w->cur_docs * 8;
    uint64_t dsum = tf_hash64(w->ends, (size_t)docs_bytes, 0);
    TF_TRY(put_bytes(w, w->ends, (size_t)docs_bytes));
    uint64_t blk_off = 0, blk_bytes = 0, bsum = 0;
    if (compressed) {
        TF_TRY(pad_to(w, 8));
        blk_off = w->pos + w->iolen;
        blk_bytes = w->nblocks * 16;
        bsum = tf_hash64(w->table, (size_t)blk_bytes, 0);
        TF_TRY(put_bytes(w, w->table, (size_t)blk_bytes));
    }
    uint64_t ck_off = 0, ck_n = 0, ck_sum = 0, cb = w->opt.chunk_checksum_bytes;
    if (cb) {
        uint8_t *ct = NULL;
        TF_TRY(flush_io(w)); /* the token section must be on file to be read back */
        TF_TRY(chunk_table(w, TF_NATIVE_TOKENS_ALIGN, tok_bytes, cb, &ct, &ck_n));
        TF_TRY(pad_to(w, 8));
        ck_off = w->pos + w->iolen;
        ck_sum = tf_hash64(ct, (size_t)(ck_n * 8), 0);
        int prc = put_bytes(w, ct, (size_t)(ck_n * 8));
        free(ct);
        TF_TRY(prc);
    }
    TF_TRY(flush_io(w));
    uint64_t tsum = tf__xxh64_digest(&w->tok_hash);

    uint8_t h[TF_NATIVE_HEADER_SIZE];
    memset(h, 0, sizeof h);
    memcpy(h, TF_NATIVE_MAGIC, 8);
    tf__put_le32(h + 8, TF_NATIVE_VERSION);
    tf__put_le32(h + 12, TF_NATIVE_HEADER_SIZE);
    tf__put_le32(h + 16, (compressed ? TF_NATIVE_FLAG_ZSTD : 0) | (cb ? TF_NATIVE_FLAG_CHUNKS : 0));
    tf__put_le32(h + 20, tf__native_dtype_code(w->opt.dtype));
    tf__put_le64(h + 24, w->opt.vocab_size);
    tf__put_le64(h + 32, w->cur_tokens);
    tf__put_le64(h + 40, w->cur_docs);
    tf__put_le64(h + 48, TF_NATIVE_TOKENS_ALIGN);
    tf__put_le64(h + 56, tok_bytes);
    tf__put_le64(h + 64, docs_off);
    tf__put_le64(h + 72, docs_bytes);
    tf__put_le64(h + 80, blk_off);
    tf__put_le64(h + 88, blk_bytes);
    tf__put_le64(h + 96, compressed ? w->opt.block_tokens : 0);
    tf__put_le64(h + 104, tsum);
    tf__put_le64(h + 112, dsum);
    tf__put_le64(h + 120, bsum);
    tf__put_le64(h + 128, w->pos);
    if (cb) {
        tf__put_le64(h + 136, ck_off);
        tf__put_le64(h + 144, ck_n * 8);
        tf__put_le64(h + 152, cb);
        tf__put_le64(h + 160, ck_sum);
    }
    tf__put_le64(h + TF_NATIVE_HDR_CHECKSUM_AT, tf_hash64(h, TF_NATIVE_HDR_CHECKSUM_AT, 0));
    TF_TRY(tf__pwrite_all(w->fd, h, sizeof h, 0, w->tmp_path));
    if (fsync(w->fd) != 0) {
        int e = errno;
        TF_FAIL(-e, "%s: fsync failed: %s", w->tmp_path, strerror(e));
    }
    close(w->fd);
    w->fd = -1;

    shard_rec *ns = tf__grow(w->shards, &w->shards_cap, (size_t)w->nshards, sizeof *ns, 16);
    if (!ns) return -ENOMEM;
    w->shards = ns;
    TF_TRY(tf__rename_at(w->dfd, w->dir, w->tmp_name, w->name, 1));
    free(w->tmp_path);
    w->tmp_path = NULL;
    shard_rec *r = &w->shards[w->nshards++];
    memset(r, 0, sizeof *r);
    snprintf(r->name, sizeof r->name, "%s", w->name);
    r->num_tokens = w->cur_tokens;
    r->num_docs = w->cur_docs;
    r->tokens_checksum = tsum;
    r->docs_checksum = dsum;
    memcpy(r->header, h, sizeof h);
    r->size = w->pos;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* documents                                                                 */
/* ------------------------------------------------------------------------ */

static int is_int_dtype(tf_dtype d) {
    return d == TF_UINT8 || d == TF_UINT16 || d == TF_UINT32 || d == TF_UINT64 || d == TF_INT8 ||
           d == TF_INT16 || d == TF_INT32 || d == TF_INT64;
}

/* Check every id of the document against [0, vocab) before writing any. */
static int check_ids(tf_writer *w, const uint8_t *src, uint64_t n, tf_dtype sd) {
    size_t ssz = tf_dtype_size(sd);
    uint64_t vocab = w->opt.vocab_size;
    for (uint64_t s = 0; s < n; s += CHUNK_TOKENS) {
        size_t k = (size_t)(n - s < CHUNK_TOKENS ? n - s : CHUNK_TOKENS);
        const uint8_t *p = src + s * ssz;
        if (sd == TF_UINT64) { /* does not fit int64: compare unsigned */
            uint64_t *u = (uint64_t *)w->i64;
            memcpy(u, p, k * 8);
            for (size_t i = 0; i < k; i++)
                if (u[i] >= vocab)
                    TF_FAIL(-TF_EVOCAB, "document %llu: token %llu is %llu, expected 0 <= id < vocab_size %llu. Check the tokenizer and vocab_size.",
                            (ull)w->total_docs, (ull)(s + i), (ull)u[i], (ull)vocab);
            continue;
        }
        tf_convert(w->i64, TF_INT64, p, sd, k);
        for (size_t i = 0; i < k; i++)
            if (w->i64[i] < 0 || (uint64_t)w->i64[i] >= vocab)
                TF_FAIL(-TF_EVOCAB, "document %llu: token %llu is %lld, expected 0 <= id < vocab_size %llu. Check the tokenizer and vocab_size.",
                        (ull)w->total_docs, (ull)(s + i), (long long)w->i64[i], (ull)vocab);
    }
    return 0;
}

static int add_document(tf_writer *w, const uint8_t *src, uint64_t n, tf_dtype sd) {
    uint64_t room = w->cur_tokens < w->opt.shard_tokens ? w->opt.shard_tokens - w->cur_tokens : 0;
    if (w->fd >= 0 && w->cur_tokens > 0 && n > room) TF_TRY(close_shard(w));
    if (w->fd < 0) TF_TRY(open_shard(w));
    uint64_t *ne = tf__grow(w->ends, &w->ends_cap, (size_t)w->cur_docs, sizeof *ne, 1024);
    if (!ne) return -ENOMEM;
    w->ends = ne;
    size_t ssz = tf_dtype_size(sd);
    for (uint64_t s = 0; s < n; s += CHUNK_TOKENS) {
        size_t k = (size_t)(n - s < CHUNK_TOKENS ? n - s : CHUNK_TOKENS);
        const uint8_t *p = src + s * ssz;
        if (sd != w->opt.dtype) { /* ids are known to fit: plain narrowing */
            tf_convert(w->conv, w->opt.dtype, p, sd, k);
            p = w->conv;
        }
        TF_TRY(put_tokens(w, p, k));
    }
    w->cur_tokens += n;
    w->ends[w->cur_docs++] = w->cur_tokens;
    w->total_tokens += n;
    w->total_docs++;
    return 0;
}

int tf_writer_add_document(tf_writer *w, const void *tokens, uint64_t n, tf_dtype src_dtype) {
    TF_NEED_ARG(w);
    tf__clearerr();
    if (w->finished) TF_FAIL(-EINVAL, "%s: the writer is finished; create a new one", w->dir);
    if (w->error) TF_FAIL(w->error, "%s: an earlier write failed (%s); the writer cannot continue", w->dir, tf_strerror(w->error));
    if (n && !tokens) TF_FAIL(-EINVAL, "tokens is NULL");
    if (!is_int_dtype(src_dtype))
        TF_FAIL(-EINVAL, "document %llu: dtype %s: expected an integer token dtype. Convert the ids to integers first.",
                (ull)w->total_docs, tf_dtype_name(src_dtype));
    uint64_t bytes;
    if (tf__mul_overflow(n, tf_dtype_size(src_dtype), &bytes) || bytes > SIZE_MAX)
        TF_FAIL(-EINVAL, "document %llu: %llu tokens is too many", (ull)w->total_docs, (ull)n);
    TF_TRY(check_ids(w, tokens, n, src_dtype));
    int rc = add_document(w, tokens, n, src_dtype);
    if (rc < 0) w->error = rc; /* part of the document may be in the shard */
    return rc;
}

/* ------------------------------------------------------------------------ */
/* finish                                                                    */
/* ------------------------------------------------------------------------ */

static int write_catalog(const tf_writer *w) {
    tf__written_shard *sh = malloc((w->nshards + 1) * sizeof *sh);
    if (!sh) return -ENOMEM;
    for (uint64_t i = 0; i < w->nshards; i++)
        sh[i] = (tf__written_shard){w->shards[i].name, w->shards[i].header, w->shards[i].size};
    int rc = tf__catalog_write_written(w->dir, sh, w->nshards);
    free(sh);
    return rc;
}

static int write_manifest(tf_writer *w) {
    char *lines = NULL, *buf = NULL;
    size_t llen = 0, lcap = 0, len = 0;
    int rc = 0;
    for (uint64_t i = 0; i < w->nshards && rc == 0; i++) {
        const shard_rec *r = &w->shards[i];
        rc = tf__strbuf_append(&lines, &llen, &lcap, "shard %s %llu %llu %016llx %016llx\n", r->name,
                               (ull)r->num_tokens, (ull)r->num_docs, (ull)r->tokens_checksum, (ull)r->docs_checksum);
    }
    if (rc == 0) rc = tf__manifest_text(&buf, &len, 1, w->opt.dtype, w->opt.vocab_size, w->nshards, lines, llen);
    free(lines);
    if (rc < 0) return rc;
    uint8_t *old = NULL;
    size_t olen = 0;
    int renamed;
    rc = tf__manifest_publish(w->dfd, w->dir, buf, len, w->opt.overwrite ? &old : NULL, &olen, &renamed);
    free(buf);
    if (renamed) w->finished = 1; /* from here on the shards belong to the manifest */
    if (renamed && old) {
        /* Remove the replaced dataset's shards (never one of ours: run ids
         * differ, but compare names anyway). Failures only leave garbage. */
        const char **keep = malloc((w->nshards + 1) * sizeof *keep);
        if (keep) {
            for (uint64_t i = 0; i < w->nshards; i++) keep[i] = w->shards[i].name;
            tf__remove_replaced_shards(w->dfd, w->dir, old, olen, keep, w->nshards);
        }
        free(keep);
    }
    free(old);
    /* The dataset's own catalog (catalog.c), so that a remote open reads it
     * instead of every shard's header, from the headers just written. Best
     * effort: a dataset without one opens as before, and a catalog left here
     * by an earlier dataset describes another manifest, so it is ignored. */
    if (rc == 0 && write_catalog(w) != 0) tf__clearerr();
    return rc;
}

int tf_writer_finish(tf_writer *w) {
    TF_NEED_ARG(w);
    tf__clearerr();
    if (w->finished) TF_FAIL(-EINVAL, "%s: the writer is already finished", w->dir);
    if (w->error) TF_FAIL(w->error, "%s: an earlier write failed (%s); nothing was published", w->dir, tf_strerror(w->error));
    int rc = 0;
    if (w->fd >= 0) rc = close_shard(w);
    if (rc == 0) {
        /* Re-check: something without the lock may have published here. */
        if (!w->opt.overwrite && exists_at(w->dfd, TF_MANIFEST_NAME))
            rc = tf__seterr(-EEXIST, "%s: a tokenfeed dataset appeared here while writing. Pass overwrite=True to replace it.", w->dir);
    }
    if (rc == 0) rc = write_manifest(w);
    if (rc < 0 && !w->finished) w->error = rc;
    return rc;
}
