/*
 * native.c — reader of the tokenfeed shard format and of dataset directories
 * (docs/format.md is the contract; this file implements it exactly).
 *
 * Design:
 *   - Opening is O(1) per shard: the header is validated field by field, every
 *     section offset/size is checked against the real file size with
 *     overflow-checked arithmetic, and only O(1) facts about the payload are
 *     checked (the last document end). Full checks (checksums, monotonic
 *     document index, vocab) are tf_dataset_verify()'s job.
 *   - The header parser is a pure function over bytes (tf__parse_native_header)
 *     so fuzz targets can drive it without files; the manifest parser likewise
 *     (tf__parse_manifest).
 *   - Compressed shards keep the block table as raw bytes; a block entry is
 *     validated when that block is read (its block ops), never all at
 *     open, so open stays O(1) whatever the number of blocks.
 *   - The per-file fingerprint hashes (tokens_checksum, docs_checksum,
 *     num_tokens, num_docs, dtype, vocab): it identifies the data, so a zstd
 *     shard and its uncompressed twin share it.
 *   - Decompression uses one ZSTD_DCtx per thread (pthread key with a
 *     destructor, so threads that exit do not leak it).
 *
 * The library assumes a little-endian host: token and index sections are
 * mapped and used in place.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef TF_HAVE_ZSTD
#include <zstd.h>
#endif

#include "source.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "tokenfeed maps little-endian token files in place and needs a little-endian host"
#endif

typedef unsigned long long ull;

/* The private state of a native shard (tf_file's format_priv): where its
 * sections lie, the checksums its header stores, and pointers to the tables
 * read in place. Other layers reach it through this format's row ops
 * (tf__native_ops) and tf__native_info_of, never by its fields. The pointers
 * point into the file's mapping (or the remote stack's copy of its metadata)
 * and are NULL for a file known only from a catalog until its first touch. */
typedef struct nat_file {
    const uint8_t *zdata;        /* the stored token section of a compressed shard */
    const uint8_t *block_table;  /* raw block table bytes (16 per block) */
    const uint8_t *docs_section; /* the document index */
    const uint64_t *chunk_sums;  /* per-chunk checksums of the stored token section */
    uint64_t tokens_offset, tokens_bytes, docs_offset, docs_bytes;
    uint64_t tokens_checksum, docs_checksum, blocks_checksum, chunks_checksum;
    uint64_t num_chunk_sums, chunk_bytes;
} nat_file;
_Static_assert(sizeof(nat_file) <= TF__FORMAT_PRIV_BYTES, "nat_file must fit tf_file's format_priv");

#define NAT(f) tf__format_priv(f, nat_file)
#define CNAT(f) tf__format_priv(f, const nat_file)

static int native_read_block(const tf_file *f, uint64_t b, void *out, size_t out_cap);
static int block_entry(const tf_file *f, uint64_t b, uint64_t *off, uint64_t *size);
static const tf__block_ops native_block_ops = {native_read_block, block_entry};

tf_dtype tf__native_dtype_from_code(uint32_t code) {
    switch (code) {
    case 1: return TF_UINT8;
    case 2: return TF_UINT16;
    case 3: return TF_UINT32;
    default: return TF_DTYPE_INVALID;
    }
}

uint32_t tf__native_dtype_code(tf_dtype dt) {
    switch (dt) {
    case TF_UINT8: return 1;
    case TF_UINT16: return 2;
    case TF_UINT32: return 3;
    default: return 0;
    }
}

/* ------------------------------------------------------------------------ */
/* shard header                                                              */
/* ------------------------------------------------------------------------ */

#define BAD(field, fmt, ...) return tf__seterr(-TF_EFORMAT, "%s: " field ": " fmt, path, ##__VA_ARGS__)
#define REGEN "Regenerate the shard with tokenfeed's writer, or restore it from a good copy."

/* Section [off, off + size) lies inside [lo, file_size). */
static int section_ok(uint64_t off, uint64_t size, uint64_t lo, uint64_t file_size) {
    uint64_t end;
    return off >= lo && !tf__add_overflow(off, size, &end) && end <= file_size;
}

int tf__parse_native_header(const char *path, const uint8_t *buf, size_t len, uint64_t file_size,
                            tf_file *f) {
    const uint64_t H = TF_NATIVE_HEADER_SIZE;
    if (file_size == 0 || len == 0)
        BAD("header", "expected a %llu-byte tokenfeed header, found an empty file. The write did not finish; regenerate the shard.", (ull)H);
    if (len < H || file_size < H)
        BAD("header", "expected at least %llu bytes, found %llu. The file is truncated: regenerate it or restore it from a good copy.",
            (ull)H, (ull)(len < file_size ? len : file_size));
    if (memcmp(buf, TF_NATIVE_MAGIC, 8) != 0)
        BAD("magic", "expected \"TFSHARD\\0\", found %02x %02x %02x %02x %02x %02x %02x %02x. This is not a tokenfeed shard; pass format= for other formats.",
            buf[0], buf[1], buf[2], buf[3], buf[4], buf[5], buf[6], buf[7]);
    uint32_t version = tf__le32(buf + 8);
    if (version != TF_NATIVE_VERSION)
        BAD("version", "expected %u, found %u. The shard was written by a newer or incompatible tokenfeed; upgrade tokenfeed or rewrite the shard.",
            TF_NATIVE_VERSION, version);
    uint32_t header_size = tf__le32(buf + 12);
    if (header_size != H) BAD("header_size", "expected %llu, found %u. " REGEN, (ull)H, header_size);
    uint64_t hsum = tf_hash64(buf, TF_NATIVE_HDR_CHECKSUM_AT, 0);
    uint64_t stored = tf__le64(buf + TF_NATIVE_HDR_CHECKSUM_AT);
    if (hsum != stored)
        BAD("header_checksum", "expected %016llx, found %016llx. The header is corrupt. " REGEN, (ull)stored, (ull)hsum);

    uint32_t flags = tf__le32(buf + 16);
    uint32_t code = tf__le32(buf + 20);
    uint64_t vocab = tf__le64(buf + 24), ntok = tf__le64(buf + 32), ndocs = tf__le64(buf + 40);
    uint64_t tok_off = tf__le64(buf + 48), tok_bytes = tf__le64(buf + 56);
    uint64_t docs_off = tf__le64(buf + 64), docs_bytes = tf__le64(buf + 72);
    uint64_t blk_off = tf__le64(buf + 80), blk_bytes = tf__le64(buf + 88), blk_tokens = tf__le64(buf + 96);
    uint64_t tsum = tf__le64(buf + 104), dsum = tf__le64(buf + 112), bsum = tf__le64(buf + 120);
    uint64_t fsize = tf__le64(buf + 128);

    if (flags & ~(TF_NATIVE_FLAG_ZSTD | TF_NATIVE_FLAG_CHUNKS))
        BAD("flags", "expected only bits 0 (zstd) and 1 (chunk checksums) to be possibly set, found 0x%x. The shard uses a feature this tokenfeed does not know; upgrade tokenfeed.", flags);
    tf_dtype dt = tf__native_dtype_from_code(code);
    if (dt == TF_DTYPE_INVALID)
        BAD("dtype", "expected 1 (uint8), 2 (uint16) or 3 (uint32), found %u. " REGEN, code);
    size_t isz = tf_dtype_size(dt);
    int has_chunks = (flags & TF_NATIVE_FLAG_CHUNKS) != 0;
    uint64_t ck_off = tf__le64(buf + 136), ck_bytes = tf__le64(buf + 144), ck_size = tf__le64(buf + 152),
             ck_sum = tf__le64(buf + 160);
    for (size_t i = has_chunks ? 168 : 136; i < TF_NATIVE_HDR_CHECKSUM_AT; i++)
        if (buf[i]) BAD("reserved", "expected zero bytes at %d..247, found 0x%02x at byte %zu. The shard uses a feature this tokenfeed does not know; upgrade tokenfeed.", has_chunks ? 168 : 136, buf[i], i);
    if (vocab == 0) BAD("vocab_size", "expected > 0, found 0. " REGEN);
    if (fsize != file_size)
        BAD("file_size", "expected %llu (from the header), found %llu on disk. The file is truncated or was appended to: regenerate it or restore it from a good copy.",
            (ull)fsize, (ull)file_size);
    if (tok_off % TF_NATIVE_TOKENS_ALIGN != 0 || tok_off < H)
        BAD("tokens_offset", "expected a multiple of %u that is >= %llu, found %llu. " REGEN, TF_NATIVE_TOKENS_ALIGN, (ull)H, (ull)tok_off);
    if (tok_off > file_size)
        BAD("tokens_offset", "expected at most the file size %llu, found %llu. The file is truncated or corrupt. " REGEN,
            (ull)file_size, (ull)tok_off);
    if (!section_ok(tok_off, tok_bytes, H, file_size))
        BAD("tokens_bytes", "expected the token section [%llu, +%llu) to end within the file size %llu. The file is truncated. " REGEN,
            (ull)tok_off, (ull)tok_bytes, (ull)file_size);
    int compressed = (flags & TF_NATIVE_FLAG_ZSTD) != 0;
    uint64_t raw_bytes;
    if (tf__mul_overflow(ntok, isz, &raw_bytes))
        BAD("num_tokens", "expected a count whose byte size fits 64 bits, found %llu. " REGEN, (ull)ntok);
    if (!compressed && tok_bytes != raw_bytes)
        BAD("tokens_bytes", "expected num_tokens * %zu = %llu, found %llu. " REGEN, isz, (ull)raw_bytes, (ull)tok_bytes);
    if (ntok > 0 && ndocs == 0)
        BAD("num_docs", "expected >= 1 for %llu tokens, found 0. " REGEN, (ull)ntok);
    uint64_t want_docs;
    if (tf__mul_overflow(ndocs, 8, &want_docs) || docs_bytes != want_docs)
        BAD("docs_bytes", "expected num_docs * 8 = %llu * 8, found %llu. " REGEN, (ull)ndocs, (ull)docs_bytes);
    if (docs_off % 8 != 0) BAD("docs_offset", "expected a multiple of 8, found %llu. " REGEN, (ull)docs_off);
    if (!section_ok(docs_off, docs_bytes, tok_off + tok_bytes, file_size))
        BAD("docs_offset", "expected the document index [%llu, +%llu) between the token section end %llu and the file size %llu. The file is truncated or corrupt. " REGEN,
            (ull)docs_off, (ull)docs_bytes, (ull)(tok_off + tok_bytes), (ull)file_size);

    uint64_t nblocks = 0;
    if (compressed) {
        if (blk_tokens == 0 || blk_tokens > TF_NATIVE_MAX_BLOCK_BYTES / isz)
            BAD("block_tokens", "expected 1 to %llu for a compressed shard, found %llu. " REGEN,
                (ull)(TF_NATIVE_MAX_BLOCK_BYTES / isz), (ull)blk_tokens);
        nblocks = ntok / blk_tokens + (ntok % blk_tokens != 0);
        uint64_t want_blk;
        if (tf__mul_overflow(nblocks, 16, &want_blk) || blk_bytes != want_blk)
            BAD("blocks_bytes", "expected ceil(num_tokens / block_tokens) * 16 = %llu * 16, found %llu. " REGEN,
                (ull)nblocks, (ull)blk_bytes);
        if (blk_off % 8 != 0) BAD("blocks_offset", "expected a multiple of 8, found %llu. " REGEN, (ull)blk_off);
        if (!section_ok(blk_off, blk_bytes, docs_off + docs_bytes, file_size))
            BAD("blocks_offset", "expected the block table [%llu, +%llu) between the document index end %llu and the file size %llu. The file is truncated or corrupt. " REGEN,
                (ull)blk_off, (ull)blk_bytes, (ull)(docs_off + docs_bytes), (ull)file_size);
    } else if (blk_off || blk_bytes || blk_tokens || bsum) {
        BAD("blocks_offset", "expected blocks_offset, blocks_bytes, block_tokens and blocks_checksum to be 0 in an uncompressed shard, found %llu, %llu, %llu, %016llx. " REGEN,
            (ull)blk_off, (ull)blk_bytes, (ull)blk_tokens, (ull)bsum);
    }
    uint64_t nchunks = 0;
    if (has_chunks) {
        if (ck_size < 4096 || ck_size > (1ull << 30) || (ck_size & (ck_size - 1)))
            BAD("chunk_bytes", "expected a power of two from 4096 to 2^30, found %llu. " REGEN, (ull)ck_size);
        nchunks = tok_bytes / ck_size + (tok_bytes % ck_size != 0);
        uint64_t prev_end = compressed ? blk_off + blk_bytes : docs_off + docs_bytes;
        if (ck_bytes != nchunks * 8)
            BAD("chunks_bytes", "expected ceil(tokens_bytes / chunk_bytes) * 8 = %llu * 8, found %llu. " REGEN,
                (ull)nchunks, (ull)ck_bytes);
        if (ck_off % 8 != 0) BAD("chunks_offset", "expected a multiple of 8, found %llu. " REGEN, (ull)ck_off);
        if (!section_ok(ck_off, ck_bytes, prev_end, file_size))
            BAD("chunks_offset", "expected the chunk checksum table [%llu, +%llu) between the end of the previous section %llu and the file size %llu. The file is truncated or corrupt. " REGEN,
                (ull)ck_off, (ull)ck_bytes, (ull)prev_end, (ull)file_size);
    }

    f->format = TF_FORMAT_NATIVE;
    f->dtype = dt;
    f->vocab_size = vocab;
    f->num_tokens = ntok;
    f->num_docs = ndocs;
    f->doc_kind = TF_DOCS_ENDS;
    f->format_ops = &tf__native_ops;
    f->blocks.ops = compressed ? &native_block_ops : NULL;
    f->blocks.count = nblocks;
    f->blocks.tokens = compressed ? blk_tokens : 0;
    nat_file *nf = NAT(f);
    nf->tokens_checksum = tsum;
    nf->docs_checksum = dsum;
    nf->blocks_checksum = bsum;
    nf->tokens_bytes = tok_bytes;
    nf->tokens_offset = tok_off;
    nf->docs_offset = docs_off;
    nf->docs_bytes = docs_bytes;
    nf->num_chunk_sums = nchunks;
    nf->chunk_bytes = has_chunks ? ck_size : 0;
    nf->chunks_checksum = has_chunks ? ck_sum : 0;
    /* the chunk table is not part of the fingerprint: a shard identifies its
     * data whether or not it carries one */
    uint8_t rec[48];
    tf__put_le64(rec, tsum);
    tf__put_le64(rec + 8, dsum);
    tf__put_le64(rec + 16, ntok);
    tf__put_le64(rec + 24, ndocs);
    tf__put_le64(rec + 32, code);
    tf__put_le64(rec + 40, vocab);
    f->fingerprint = tf_hash64(rec, sizeof rec, 0);

    /* Pointers only when the whole file is in buf (the header alone may be
     * parsed, e.g. by a fuzz target fed a prefix). */
    if (len < file_size) return 0;
    nf->docs_section = buf + docs_off;
    f->doc_ends = (const uint64_t *)(const void *)(buf + docs_off); /* 8-aligned: checked above */
    if (compressed) {
        f->tokens = NULL;
        nf->zdata = buf + tok_off;
        nf->block_table = buf + blk_off;
    } else {
        f->tokens = buf + tok_off;
    }
    if (has_chunks) nf->chunk_sums = (const uint64_t *)(const void *)(buf + ck_off); /* 8-aligned: checked above */
    if (ndocs) {
        uint64_t last = tf__le64(buf + docs_off + docs_bytes - 8);
        if (last != ntok)
            BAD("document index", "expected the last document end to equal num_tokens %llu, found %llu. The index is corrupt. " REGEN,
                (ull)ntok, (ull)last);
    }
    return 0;
}

int tf__open_native(const char *path, const tf_open_options *opt, tf_file *f) {
    (void)opt;
    TF_TRY(tf__open_main(path, f, 0, "", ""));
    int rc = tf__parse_native_header(path, f->map, f->map_len, f->map_len, f);
    if (rc == 0) tf__release_pages(f->map, f->map_len);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* compressed blocks                                                         */
/* ------------------------------------------------------------------------ */

#ifdef TF_HAVE_ZSTD
static pthread_key_t dctx_key;
static pthread_once_t dctx_once = PTHREAD_ONCE_INIT;
static int dctx_key_ok;

static void dctx_free(void *p) { ZSTD_freeDCtx(p); }
static void dctx_init(void) { dctx_key_ok = pthread_key_create(&dctx_key, dctx_free) == 0; }

static ZSTD_DCtx *thread_dctx(void) {
    pthread_once(&dctx_once, dctx_init);
    if (!dctx_key_ok) return NULL;
    ZSTD_DCtx *d = pthread_getspecific(dctx_key);
    if (!d) {
        d = ZSTD_createDCtx();
        if (d && pthread_setspecific(dctx_key, d) != 0) {
            ZSTD_freeDCtx(d);
            d = NULL;
        }
    }
    return d;
}
#endif

/* Per-thread buffer for the compressed bytes of one block of a remote shard. */
static pthread_key_t zbuf_key;
static pthread_once_t zbuf_once = PTHREAD_ONCE_INIT;
static int zbuf_key_ok;
typedef struct zbuf {
    uint8_t *p;
    size_t cap;
} zbuf;
static void zbuf_free(void *v) {
    zbuf *z = v;
    if (z) free(z->p);
    free(z);
}
static void zbuf_init(void) { zbuf_key_ok = pthread_key_create(&zbuf_key, zbuf_free) == 0; }
static uint8_t *thread_zbuf(size_t need) {
    pthread_once(&zbuf_once, zbuf_init);
    if (!zbuf_key_ok) return NULL;
    zbuf *z = pthread_getspecific(zbuf_key);
    if (!z) {
        z = calloc(1, sizeof *z);
        if (!z || pthread_setspecific(zbuf_key, z) != 0) {
            free(z);
            return NULL;
        }
    }
    if (z->cap < need) {
        uint8_t *n = realloc(z->p, need ? need : 1);
        if (!n) return NULL;
        z->p = n;
        z->cap = need;
    }
    return z->p;
}

static uint64_t block_bytes_out(const tf_file *f, uint64_t b);

/* ZSTD_compressBound (zstd's ZSTD_COMPRESSBOUND, here also for builds without
 * zstd, which still check the table). */
static uint64_t frame_bound(uint64_t n) {
    return n + (n >> 8) + (n < (128u << 10) ? ((128u << 10) - n) >> 11 : 0);
}

/* Block b's entry in the block table: [*off, *off + *size) of the token section.
 * A frame of a block is never larger than ZSTD_compressBound of the block's
 * bytes: a larger entry is corrupt, refused before anything is read or
 * allocated for it (a remote shard would fetch up to the whole section). */
static int block_entry(const tf_file *f, uint64_t b, uint64_t *off, uint64_t *size) {
    const nat_file *nf = CNAT(f);
    if (!f->blocks.ops || b >= f->blocks.count)
        TF_FAIL(-ERANGE, "%s: block %llu out of range (%llu blocks)", f->path, (ull)b, (ull)f->blocks.count);
    if (!nf->block_table)
        TF_FAIL(-EINVAL, "%s: block %llu: the block table is not in memory (internal error)", f->path, (ull)b);
    const uint8_t *e = nf->block_table + 16 * b;
    *off = tf__le64(e);
    *size = tf__le64(e + 8);
    if (!section_ok(*off, *size, 0, nf->tokens_bytes))
        TF_FAIL(-TF_EFORMAT, "%s: block table: entry %llu: expected [offset, +size) within the %llu-byte token section, found [%llu, +%llu). The block table is corrupt. " REGEN,
                f->path, (ull)b, (ull)nf->tokens_bytes, (ull)*off, (ull)*size);
    uint64_t bound = frame_bound(block_bytes_out(f, b));
    if (*size > bound)
        TF_FAIL(-TF_EFORMAT, "%s: block table: entry %llu: expected a frame of at most %llu bytes (the zstd bound for its %llu bytes of tokens), found %llu. The block table is corrupt. " REGEN,
                f->path, (ull)b, (ull)bound, (ull)block_bytes_out(f, b), (ull)*size);
    return 0;
}

/* The stored (compressed) bytes of a block: in the mapping of a local shard;
 * for a remote one, fetched through the chunk cache into a per-thread buffer
 * (valid until this thread's next call). */
static int block_src(const tf_file *f, uint64_t off, uint64_t size, const uint8_t **src) {
    if (f->bytes_ops) {
        uint8_t *zb = thread_zbuf((size_t)size);
        if (!zb) return -ENOMEM;
        TF_TRY(f->bytes_ops->read(f->bytes_src, f->data_off + off, size, zb));
        *src = zb;
    } else if (CNAT(f)->zdata) {
        *src = CNAT(f)->zdata + off;
    } else {
        TF_FAIL(-EINVAL, "%s: the compressed token section is not in memory (internal error)", f->path);
    }
    return 0;
}

static uint64_t block_bytes_out(const tf_file *f, uint64_t b) {
    uint64_t bt = f->blocks.tokens, first = b * bt;
    uint64_t n = f->num_tokens - first < bt ? f->num_tokens - first : bt;
    return n * tf_dtype_size(f->dtype);
}

static int decode_block(const tf_file *f, uint64_t b, const uint8_t *src, uint64_t size, void *out,
                        size_t out_cap) {
    uint64_t want = block_bytes_out(f, b);
    if (want > out_cap)
        TF_FAIL(-EINVAL, "%s: block %llu needs %llu bytes, buffer has %zu", f->path, (ull)b, (ull)want, out_cap);
#ifdef TF_HAVE_ZSTD
    ZSTD_DCtx *d = thread_dctx();
    if (!d) return -ENOMEM;
    size_t got = ZSTD_decompressDCtx(d, out, (size_t)want, src, (size_t)size);
    if (ZSTD_isError(got))
        TF_FAIL(-TF_EFORMAT, "%s: block %llu: zstd: %s. The compressed data is corrupt. " REGEN, f->path, (ull)b,
                ZSTD_getErrorName(got));
    if (got != want)
        TF_FAIL(-TF_EFORMAT, "%s: block %llu: expected %llu decompressed bytes, found %zu. " REGEN, f->path, (ull)b,
                (ull)want, got);
    return 0;
#else
    (void)src;
    (void)size;
    TF_FAIL(-TF_EUNSUPPORTED, "%s: the shard is zstd-compressed, but this tokenfeed build lacks zstd. Rebuild with libzstd (pkg-config libzstd) installed, or rewrite the dataset with compression=None.",
            f->path);
#endif
}

static int native_read_block(const tf_file *f, uint64_t b, void *out, size_t out_cap) {
    uint64_t off, size;
    const uint8_t *src;
    TF_TRY(block_entry(f, b, &off, &size));
    TF_TRY(block_src(f, off, size, &src));
    return decode_block(f, b, src, size, out, out_cap);
}

/* verify(): block b must be one standard zstd frame, decodable on its own by
 * any zstd decoder (the zstd command-line tool included): the frame magic, a
 * stored content size equal to the block's bytes, the content checksum flag,
 * no dictionary, and exactly one frame filling the block table entry. Blocks
 * lie back to back in block order, so the token section, cut at the block
 * table's offsets, is the frames and nothing else (docs/format.md).
 * *next_off: where block b must start; advanced past it. The content checksum
 * itself is checked when verify decodes the block. */
static int check_frame(const tf_file *f, uint64_t b, uint64_t off, uint64_t size, const uint8_t *src,
                       uint64_t *next_off) {
    uint64_t zlen = CNAT(f)->tokens_bytes;
    if (!section_ok(off, size, 0, zlen))
        TF_FAIL(-TF_EFORMAT, "%s: block table: entry %llu: expected [offset, +size) within the %llu-byte token section, found [%llu, +%llu). The block table is corrupt. " REGEN,
                f->path, (ull)b, (ull)zlen, (ull)off, (ull)size);
    if (off != *next_off)
        TF_FAIL(-TF_EFORMAT, "%s: block table: entry %llu: expected the frame to start at offset %llu (right after block %llu: blocks are stored back to back in block order), found %llu. " REGEN,
                f->path, (ull)b, (ull)*next_off, (ull)(b ? b - 1 : 0), (ull)off);
    *next_off = off + size;
    if (b + 1 == f->blocks.count && *next_off != zlen)
        TF_FAIL(-TF_EFORMAT, "%s: tokens_bytes: expected the token section to end with the last frame, at %llu bytes, found %llu bytes. " REGEN,
                f->path, (ull)*next_off, (ull)zlen);
#ifdef TF_HAVE_ZSTD
    uint64_t want = block_bytes_out(f, b);
    if (size < 6 || tf__le32(src) != ZSTD_MAGICNUMBER)
        TF_FAIL(-TF_EFORMAT, "%s: block %llu: expected a zstd frame (magic 28 b5 2f fd), found %llu bytes starting %02x %02x %02x %02x. " REGEN,
                f->path, (ull)b, (ull)size, size > 0 ? src[0] : 0, size > 1 ? src[1] : 0, size > 2 ? src[2] : 0,
                size > 3 ? src[3] : 0);
    unsigned fhd = src[4]; /* frame header descriptor (RFC 8878, 3.1.1.1.1) */
    unsigned long long fcs = ZSTD_getFrameContentSize(src, (size_t)size);
    if (fcs == ZSTD_CONTENTSIZE_ERROR || fcs == ZSTD_CONTENTSIZE_UNKNOWN || fcs != want)
        TF_FAIL(-TF_EFORMAT, "%s: block %llu: expected a zstd frame that stores its content size, %llu bytes, found %s%llu. " REGEN,
                f->path, (ull)b, (ull)want,
                fcs == ZSTD_CONTENTSIZE_ERROR ? "a bad frame header, " : fcs == ZSTD_CONTENTSIZE_UNKNOWN ? "no size, " : "",
                fcs == ZSTD_CONTENTSIZE_ERROR || fcs == ZSTD_CONTENTSIZE_UNKNOWN ? 0ull : fcs);
    if (!(fhd & 0x04))
        TF_FAIL(-TF_EFORMAT, "%s: block %llu: expected a zstd frame with a content checksum, found none. " REGEN, f->path, (ull)b);
    if ((fhd & 0x03) || ZSTD_getDictID_fromFrame(src, (size_t)size) != 0)
        TF_FAIL(-TF_EFORMAT, "%s: block %llu: expected a zstd frame that needs no dictionary, found a dictionary id. " REGEN, f->path, (ull)b);
    size_t fsz = ZSTD_findFrameCompressedSize(src, (size_t)size);
    if (ZSTD_isError(fsz) || fsz != size)
        TF_FAIL(-TF_EFORMAT, "%s: block %llu: expected exactly one zstd frame of %llu bytes, found %s%zu. " REGEN,
                f->path, (ull)b, (ull)size, ZSTD_isError(fsz) ? "a truncated or corrupt frame: " : "a frame of ",
                ZSTD_isError(fsz) ? (size_t)0 : fsz);
    return 0;
#else
    TF_FAIL(-TF_EUNSUPPORTED, "%s: the shard is zstd-compressed, but this tokenfeed build lacks zstd. Rebuild with libzstd (pkg-config libzstd) installed, or rewrite the dataset with compression=None.",
            f->path);
#endif
}

/* ------------------------------------------------------------------------ */
/* checksums                                                                 */
/* ------------------------------------------------------------------------ */

/* Full check of a shard's stored checksums (verify; runs under the caller's
 * SIGBUS guard). scratch holds at least one decompressed block (cap bytes). */
static int native_verify(const tf_file *f, _Atomic uint64_t *progress, _Atomic int *cancel, void *scratch,
                      size_t cap) {
    /* tokens_checksum covers the uncompressed token bytes, so a compressed
     * shard and its uncompressed twin share checksums and fingerprint. */
    tf__xxh64_state h;
    tf__xxh64_reset(&h, 0);
    size_t isz = tf_dtype_size(f->dtype);
    const nat_file *nf = CNAT(f);
    int compressed = f->blocks.ops != NULL;
    if (!compressed && f->bytes_ops) {
        /* through the chunk cache, a chunk at a time (scratch holds 2 MiB) */
        uint8_t *buf = scratch;
        uint64_t left = f->num_tokens * isz, off = 0;
        size_t step = cap / isz * isz;
        while (left) {
            if (atomic_load(cancel)) return -ECANCELED;
            size_t n = left < step ? (size_t)left : step;
            TF_TRY(tf__file_read(f, off / isz, n / isz, buf, f->dtype));
            tf__xxh64_update(&h, buf, n);
            off += n;
            left -= n;
            atomic_fetch_add(progress, n);
        }
    } else if (!compressed) {
        const uint8_t *p = f->tokens;
        uint64_t left = f->num_tokens * isz;
        while (left) {
            if (atomic_load(cancel)) return -ECANCELED;
            size_t n = left < (8u << 20) ? (size_t)left : (8u << 20);
            tf__xxh64_update(&h, p, n);
            p += n;
            left -= n;
            atomic_fetch_add(progress, n);
        }
    } else {
        uint8_t *buf = scratch;
        uint64_t next_off = 0;
        for (uint64_t b = 0; b < f->blocks.count; b++) {
            if (atomic_load(cancel)) return -ECANCELED;
            uint64_t n = block_bytes_out(f, b) / isz;
            uint64_t off, size;
            const uint8_t *src;
            TF_TRY(block_entry(f, b, &off, &size));
            TF_TRY(block_src(f, off, size, &src)); /* a remote block is fetched once for both */
            TF_TRY(check_frame(f, b, off, size, src, &next_off));
            TF_TRY(decode_block(f, b, src, size, buf, cap));
            tf__xxh64_update(&h, buf, (size_t)(n * isz));
            atomic_fetch_add(progress, n * isz);
        }
    }
    uint64_t got = tf__xxh64_digest(&h);
    if (got != nf->tokens_checksum)
        TF_FAIL(-TF_ECHECKSUM, "%s: tokens_checksum: expected %016llx, found %016llx. The shard is corrupt: restore it from a good copy or regenerate it.",
                f->path, (unsigned long long)nf->tokens_checksum, (unsigned long long)got);
    if ((!nf->docs_section && nf->docs_bytes) || (compressed && !nf->block_table && f->blocks.count))
        TF_FAIL(-EINVAL, "%s: verify: the document index or block table is not in memory (internal error)", f->path);
    static const uint8_t none[1];
    got = tf_hash64(nf->docs_bytes ? nf->docs_section : none, (size_t)nf->docs_bytes, 0);
    if (got != nf->docs_checksum)
        TF_FAIL(-TF_ECHECKSUM, "%s: docs_checksum: expected %016llx, found %016llx. The shard's document index is corrupt: restore it from a good copy or regenerate it.",
                f->path, (unsigned long long)nf->docs_checksum, (unsigned long long)got);
    if (compressed) {
        got = tf_hash64(f->blocks.count ? nf->block_table : none, (size_t)(f->blocks.count * 16), 0);
        if (got != nf->blocks_checksum)
            TF_FAIL(-TF_ECHECKSUM, "%s: blocks_checksum: expected %016llx, found %016llx. The shard's block table is corrupt: restore it from a good copy or regenerate it.",
                    f->path, (unsigned long long)nf->blocks_checksum, (unsigned long long)got);
    }
    if (nf->chunk_sums) {
        got = tf_hash64(nf->chunk_sums, (size_t)(nf->num_chunk_sums * 8), 0);
        if (got != nf->chunks_checksum)
            TF_FAIL(-TF_ECHECKSUM, "%s: chunks_checksum: expected %016llx, found %016llx. The shard's chunk checksum table is corrupt: restore it from a good copy or regenerate it.",
                    f->path, (unsigned long long)nf->chunks_checksum, (unsigned long long)got);
        /* local stored bytes against the table (remote chunks were checked
         * against it as they landed) */
        const uint8_t *stored = compressed ? nf->zdata : f->tokens;
        for (uint64_t i = 0; stored && i < nf->num_chunk_sums; i++) {
            if (atomic_load(cancel)) return -ECANCELED;
            uint64_t o = i * nf->chunk_bytes;
            uint64_t n = nf->tokens_bytes - o < nf->chunk_bytes ? nf->tokens_bytes - o : nf->chunk_bytes;
            got = tf_hash64(stored + o, (size_t)n, 0);
            if (got != nf->chunk_sums[i])
                TF_FAIL(-TF_ECHECKSUM, "%s: chunk checksum %llu (token section bytes [%llu, %llu)): expected %016llx, found %016llx. The shard is corrupt: restore it from a good copy or regenerate it.",
                        f->path, (ull)i, (ull)o, (ull)(o + n), (ull)nf->chunk_sums[i], (ull)got);
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* the format's row ops: what other layers reach of the private state        */
/* ------------------------------------------------------------------------ */

/* A catalog entry keeps the three checksums of the header (the fingerprint
 * and the counts are the entry's own): what the first touch's parse and a
 * manifest are checked against. */
static void native_catalog_pack(const tf_file *f, uint8_t *out) {
    const nat_file *nf = CNAT(f);
    tf__put_le64(out, nf->tokens_checksum);
    tf__put_le64(out + 8, nf->docs_checksum);
    tf__put_le64(out + 16, nf->blocks_checksum);
}

static void native_catalog_unpack(tf_file *f, const uint8_t *in) {
    nat_file *nf = NAT(f);
    memset(nf, 0, sizeof *nf);
    nf->tokens_checksum = tf__le64(in);
    nf->docs_checksum = tf__le64(in + 8);
    nf->blocks_checksum = tf__le64(in + 16);
}

static void native_forget_maps(tf_file *f) {
    nat_file *nf = NAT(f);
    nf->zdata = nf->block_table = nf->docs_section = NULL;
    nf->chunk_sums = NULL;
}

const tf__format_ops tf__native_ops = {
    .blocks = &native_block_ops,
    .verify = native_verify,
    .catalog_pack = native_catalog_pack,
    .catalog_unpack = native_catalog_unpack,
    .forget_maps = native_forget_maps,
};

int tf__native_info_of(const tf_file *f, tf__native_info *out) {
    memset(out, 0, sizeof *out);
    if (!f || f->format != TF_FORMAT_NATIVE) return -EINVAL;
    const nat_file *nf = CNAT(f);
    out->tokens_at = nf->tokens_offset;
    out->tokens_len = nf->tokens_bytes;
    out->index_at = nf->docs_offset;
    out->sum_tokens = nf->tokens_checksum;
    out->sum_docs = nf->docs_checksum;
    out->chunk_table = nf->chunk_sums;
    out->chunk_count = nf->num_chunk_sums;
    out->chunk_bytes = nf->chunk_bytes;
    return 0;
}

void tf__native_rebase(tf_file *f, const uint8_t *m, uint64_t from, const uint8_t *to) {
    nat_file *nf = NAT(f);
    const uint8_t *lo = m + from;
#define REBASE(ptr, type) \
    if (ptr) ptr = (const uint8_t *)(const void *)(ptr) >= lo && to ? (type)(const void *)(to + ((const uint8_t *)(const void *)(ptr) - lo)) : NULL
    REBASE(nf->zdata, const uint8_t *);
    REBASE(nf->block_table, const uint8_t *);
    REBASE(nf->docs_section, const uint8_t *);
    REBASE(nf->chunk_sums, const uint64_t *);
#undef REBASE
}

/* ------------------------------------------------------------------------ */
/* manifest                                                                  */
/* ------------------------------------------------------------------------ */

void tf__manifest_free(tf_manifest *m) {
    if (!m) return;
    if (m->shards)
        for (uint64_t i = 0; i < m->num_shards; i++) free(m->shards[i].name);
    free(m->shards);
    memset(m, 0, sizeof *m);
}

typedef struct mcur {
    const char *path;
    const uint8_t *p, *end;
    uint64_t line;
} mcur;

/* Next line without its '\n' into [*s, *e); fails at EOF or on a line
 * without '\n' (every record ends with one). */
static int next_line(mcur *c, const uint8_t **s, const uint8_t **e) {
    if (c->p >= c->end)
        TF_FAIL(-TF_EFORMAT, "%s: line %llu: expected more records, found the end of the file. The manifest is truncated: rewrite the dataset.", c->path, (ull)c->line + 1);
    const uint8_t *nl = memchr(c->p, '\n', (size_t)(c->end - c->p));
    if (!nl)
        TF_FAIL(-TF_EFORMAT, "%s: line %llu: expected a line ending in a newline, found the end of the file. The manifest is truncated: rewrite the dataset.", c->path, (ull)c->line + 1);
    *s = c->p;
    *e = nl;
    c->p = nl + 1;
    c->line++;
    return 0;
}

/* Split the next space-separated field off [*s, e). */
static int next_field(const uint8_t **s, const uint8_t *e, const uint8_t **fs, size_t *fl) {
    if (*s >= e) return 0;
    const uint8_t *sp = memchr(*s, ' ', (size_t)(e - *s));
    const uint8_t *fe = sp ? sp : e;
    *fs = *s;
    *fl = (size_t)(fe - *s);
    *s = sp ? sp + 1 : e;
    return *fl > 0;
}

static int parse_dec(const uint8_t *s, size_t n, uint64_t *v) {
    if (n == 0 || n > 20) return 0;
    uint64_t x = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return 0;
        if (tf__mul_overflow(x, 10, &x) || tf__add_overflow(x, (uint64_t)(s[i] - '0'), &x)) return 0;
    }
    *v = x;
    return 1;
}

static int parse_hex16(const uint8_t *s, size_t n, uint64_t *v) {
    if (n != 16) return 0;
    uint64_t x = 0;
    for (size_t i = 0; i < 16; i++) {
        int d = s[i] >= '0' && s[i] <= '9' ? s[i] - '0' : s[i] >= 'a' && s[i] <= 'f' ? s[i] - 'a' + 10 : -1;
        if (d < 0) return 0;
        x = x << 4 | (uint64_t)d;
    }
    *v = x;
    return 1;
}

#define MBAD(c, what, ...) do { rc = tf__seterr(-TF_EFORMAT, "%s: line %llu: " what, (c)->path, (ull)(c)->line, __VA_ARGS__); goto fail; } while (0)
#define MFIX "The manifest is corrupt or was edited by hand: rewrite the dataset."

int tf__manifest_name_ok(const char *name, size_t n, int allow_dirs) {
    if (n == 0 || n > (allow_dirs ? TF_MANIFEST_MAX_PATH : 255)) return 0;
    size_t part = 0; /* start of the current path component */
    for (size_t k = 0; k <= n; k++) {
        if (k == n || name[k] == '/') {
            size_t len = k - part;
            if (k < n && !allow_dirs) return 0;
            /* no empty component (leading '/', trailing '/', "//"), no "." or ".." */
            if (len == 0 || len > 255 || (len == 1 && name[part] == '.') ||
                (len == 2 && name[part] == '.' && name[part + 1] == '.'))
                return 0;
            part = k + 1;
            continue;
        }
        unsigned char ch = (unsigned char)name[k];
        if (ch <= ' ' || ch == 0x7f) return 0;
    }
    return 1;
}

static int cmp_name_ptr(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Shard names must be unique; sorting keeps this O(n log n) for merged
 * datasets with many thousands of shards. */
static int check_unique_names(const mcur *c, const tf_manifest *m) {
    if (m->num_shards < 2) return 0;
    char **names = malloc(m->num_shards * sizeof *names);
    if (!names) return -ENOMEM;
    for (uint64_t i = 0; i < m->num_shards; i++) names[i] = m->shards[i].name;
    qsort(names, (size_t)m->num_shards, sizeof *names, cmp_name_ptr);
    int rc = 0;
    for (uint64_t i = 1; i < m->num_shards && rc == 0; i++)
        if (strcmp(names[i - 1], names[i]) == 0)
            rc = tf__seterr(-TF_EFORMAT, "%s: expected unique shard names, found \"%s\" twice. " MFIX, c->path, names[i]);
    free(names);
    return rc;
}

/* "key value" line with a fixed key; value returned as [*v, +*vl). */
static int keyed_line(mcur *c, const char *key, const uint8_t **v, size_t *vl) {
    const uint8_t *s, *e, *k;
    size_t kl;
    TF_TRY(next_line(c, &s, &e));
    const uint8_t *line = s;
    int ll = (int)(e - s > 80 ? 80 : e - s);
    size_t want = strlen(key);
    if (!next_field(&s, e, &k, &kl) || kl != want || memcmp(k, key, want) != 0 || !next_field(&s, e, v, vl) || s != e)
        TF_FAIL(-TF_EFORMAT, "%s: line %llu: expected \"%s <value>\", found \"%.*s\". " MFIX, c->path, (ull)c->line, key,
                ll, (const char *)line);
    return 0;
}

int tf__parse_manifest(const char *path, const uint8_t *buf, size_t len, tf_manifest *m) {
    memset(m, 0, sizeof *m);
    int rc = 0;
    if (len == 0 || !buf)
        TF_FAIL(-TF_EFORMAT, "%s: expected a tokenfeed manifest, found an empty file. The write did not finish: rewrite the dataset.", path);
    mcur c = {path, buf, buf + len, 0};
    const uint8_t *s, *e, *v, *f1;
    size_t vl, fl;

    TF_TRY(next_line(&c, &s, &e));
    /* Version 1: shard names are plain file names. Version 2 (written by a
     * merge of parts) also allows relative paths into subdirectories. */
    static const char first[] = "tokenfeed-manifest ";
    const size_t fl0 = sizeof first - 1;
    if ((size_t)(e - s) == fl0 + 1 && memcmp(s, first, fl0) == 0 && (s[fl0] == '1' || s[fl0] == '2')) {
        m->version = (uint32_t)(s[fl0] - '0');
    } else {
        if ((size_t)(e - s) > fl0 && memcmp(s, first, fl0) == 0)
            TF_FAIL(-TF_EFORMAT, "%s: line 1: version: expected 1 or 2, found \"%.*s\". The dataset was written by a newer tokenfeed; upgrade tokenfeed.",
                    path, (int)((e - s - fl0) > 40 ? 40 : (e - s - fl0)), (const char *)s + fl0);
        TF_FAIL(-TF_EFORMAT, "%s: line 1: expected \"tokenfeed-manifest 1\" or \"tokenfeed-manifest 2\", found something else. This is not a tokenfeed manifest.", path);
    }
    TF_TRY(keyed_line(&c, "dtype", &v, &vl));
    char dname[16] = {0};
    if (vl < sizeof dname) memcpy(dname, v, vl);
    m->dtype = vl < sizeof dname ? tf_dtype_from_name(dname) : TF_DTYPE_INVALID;
    if (!tf__native_dtype_code(m->dtype))
        MBAD(&c, "dtype: expected uint8, uint16 or uint32, found \"%.*s\". " MFIX, (int)(vl > 20 ? 20 : vl), (const char *)v);
    TF_TRY(keyed_line(&c, "vocab_size", &v, &vl));
    if (!parse_dec(v, vl, &m->vocab_size) || m->vocab_size == 0)
        MBAD(&c, "vocab_size: expected a positive decimal integer, found \"%.*s\". " MFIX, (int)(vl > 24 ? 24 : vl), (const char *)v);
    TF_TRY(keyed_line(&c, "num_shards", &v, &vl));
    uint64_t ns;
    /* Each shard line takes more than 40 bytes, so a count larger than
     * len / 40 cannot be honest: refuse it before allocating. */
    if (!parse_dec(v, vl, &ns) || ns > len / 40)
        MBAD(&c, "num_shards: expected a decimal count that fits the %zu-byte manifest, found \"%.*s\". " MFIX, len,
             (int)(vl > 24 ? 24 : vl), (const char *)v);
    m->shards = calloc(ns ? ns : 1, sizeof *m->shards);
    if (!m->shards) return -ENOMEM;
    for (uint64_t i = 0; i < ns; i++) {
        rc = next_line(&c, &s, &e);
        if (rc < 0) goto fail;
        tf_manifest_shard *sh = &m->shards[i];
        const uint8_t *name;
        size_t nl;
        const uint8_t *fv[4];
        size_t fvl[4];
        int ok = next_field(&s, e, &f1, &fl) && fl == 5 && memcmp(f1, "shard", 5) == 0 && next_field(&s, e, &name, &nl);
        for (int k = 0; ok && k < 4; k++) ok = next_field(&s, e, &fv[k], &fvl[k]);
        if (!ok || s != e)
            MBAD(&c, "expected \"shard NAME NUM_TOKENS NUM_DOCS TOKENS_CHECKSUM DOCS_CHECKSUM\" (shard %llu of %llu), found a line that does not match. " MFIX,
                 (ull)i, (ull)ns);
        if (!tf__manifest_name_ok((const char *)name, nl, m->version >= 2))
            MBAD(&c, "shard name: expected %s, found \"%.*s\". " MFIX,
                 m->version >= 2 ? "a relative path of plain names (no '..', no leading '/', no empty part, no spaces or control characters)"
                                 : "a plain file name (no '/', no spaces or control characters)",
                 (int)(nl > 80 ? 80 : nl), (const char *)name);
        if (!parse_dec(fv[0], fvl[0], &sh->num_tokens) || !parse_dec(fv[1], fvl[1], &sh->num_docs))
            MBAD(&c, "shard %llu: expected decimal NUM_TOKENS and NUM_DOCS, found \"%.*s\" \"%.*s\". " MFIX, (ull)i,
                 (int)(fvl[0] > 24 ? 24 : fvl[0]), (const char *)fv[0], (int)(fvl[1] > 24 ? 24 : fvl[1]), (const char *)fv[1]);
        if (!parse_hex16(fv[2], fvl[2], &sh->tokens_checksum) || !parse_hex16(fv[3], fvl[3], &sh->docs_checksum))
            MBAD(&c, "shard %llu: expected checksums as 16 lowercase hex digits, found \"%.*s\" \"%.*s\". " MFIX, (ull)i,
                 (int)(fvl[2] > 24 ? 24 : fvl[2]), (const char *)fv[2], (int)(fvl[3] > 24 ? 24 : fvl[3]), (const char *)fv[3]);
        sh->name = strndup((const char *)name, nl);
        if (!sh->name) { rc = -ENOMEM; goto fail; }
        m->num_shards = i + 1; /* so that tf__manifest_free frees what exists */
    }
    m->num_shards = ns;
    rc = check_unique_names(&c, m);
    if (rc < 0) goto fail;
    {
        const uint8_t *before = c.p;
        rc = next_line(&c, &s, &e);
        if (rc < 0) goto fail;
        uint64_t h;
        if (!next_field(&s, e, &f1, &fl) || fl != 3 || memcmp(f1, "end", 3) != 0 || !next_field(&s, e, &v, &vl) || s != e ||
            !parse_hex16(v, vl, &h))
            MBAD(&c, "expected \"end <16 hex digits>\" after %llu shard lines, found something else. %s", (ull)ns,
                 "The manifest is truncated or corrupt: rewrite the dataset.");
        uint64_t got = tf_hash64(buf, (size_t)(before - buf), 0);
        if (got != h)
            MBAD(&c, "end: expected checksum %016llx of the preceding bytes, found %016llx. %s", (ull)h, (ull)got,
                 "The manifest is corrupt or was edited by hand: rewrite the dataset.");
        if (c.p != c.end)
            MBAD(&c, "expected the end of the file after the end line, found %llu more bytes. %s", (ull)(c.end - c.p),
                 "The manifest is corrupt: rewrite the dataset.");
    }
    return 0;
fail:
    tf__manifest_free(m);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* dataset directory                                                         */
/* ------------------------------------------------------------------------ */

int tf__open_native_dir(const char *dir, const tf_open_options *opt, tf_file **files, uint64_t *nfiles,
                        uint64_t *cap) {
    char *mpath = tf__path_join(dir, TF_MANIFEST_NAME);
    if (!mpath) return -ENOMEM;
    void *map = NULL;
    size_t mlen = 0;
    if (!tf__file_exists(mpath)) {
        free(mpath);
        TF_FAIL(-TF_EFORMAT, "%s: no manifest: the write did not finish or this is not a tokenfeed dataset. Expected %s/%s; rerun the writer to completion, or pass the path of a single file.",
                dir, dir, TF_MANIFEST_NAME);
    }
    int rc = tf__map_file(mpath, &map, &mlen);
    if (rc < 0) {
        free(mpath);
        return rc;
    }
    tf_manifest m;
    rc = tf__parse_manifest(mpath, map, mlen, &m);
    tf__unmap(map, mlen);
    if (rc < 0) {
        free(mpath);
        return rc;
    }
    for (uint64_t i = 0; i < m.num_shards && rc == 0; i++) {
        const tf_manifest_shard *sh = &m.shards[i];
        char *sp = tf__path_join(dir, sh->name);
        tf_file *f = sp ? tf__files_push(files, nfiles, cap) : NULL;
        if (!f) {
            free(sp);
            rc = -ENOMEM;
            break;
        }
        rc = tf__open_native(sp, opt, f);
        if (rc == 0) {
            const char *fld = NULL;
            uint64_t want = 0, found = 0;
            if (f->num_tokens != sh->num_tokens) fld = "num_tokens", want = sh->num_tokens, found = f->num_tokens;
            else if (f->num_docs != sh->num_docs) fld = "num_docs", want = sh->num_docs, found = f->num_docs;
            else if (CNAT(f)->tokens_checksum != sh->tokens_checksum) fld = "tokens_checksum", want = sh->tokens_checksum, found = CNAT(f)->tokens_checksum;
            else if (CNAT(f)->docs_checksum != sh->docs_checksum) fld = "docs_checksum", want = sh->docs_checksum, found = CNAT(f)->docs_checksum;
            else if (f->dtype != m.dtype) fld = "dtype", want = (uint64_t)m.dtype, found = (uint64_t)f->dtype;
            else if (f->vocab_size != m.vocab_size) fld = "vocab_size", want = m.vocab_size, found = f->vocab_size;
            if (fld)
                rc = tf__seterr(-TF_EFORMAT, "%s: %s: expected %llu (0x%llx) from %s, found %llu (0x%llx) in the shard header. The shard does not belong to this manifest (mixed writes?): rewrite the dataset.",
                                sp, fld, (ull)want, (ull)want, mpath, (ull)found, (ull)found);
        }
        /* a dataset of several shards maps each on demand (file.c) */
        if (rc == 0 && m.num_shards > 1) rc = tf__file_make_lazy(f, opt, tf__open_native);
        if (rc < 0) {
            tf__file_close(f);
            (*nfiles)--;
        }
        free(sp);
    }
    tf__manifest_free(&m);
    free(mpath);
    return rc;
}
