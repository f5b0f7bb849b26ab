/*
 * megatron.c — Megatron-LM MMIDIDX v1 datasets (P.bin + P.idx), read in place.
 *
 * Layout of P.idx (megatron/core/datasets/indexed_dataset.py, _IndexWriter):
 *   0   char[9]  "MMIDIDX\0\0"
 *   9   u64      version = 1
 *   17  u8       dtype code (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64,
 *                6 float64, 7 float32, 8 uint16)
 *   18  u64      sequence_count
 *   26  u64      document_count (entries of document_indices, incl. the 0)
 *   34  int32    sequence_lengths[sequence_count]
 *       int64    sequence_pointers[sequence_count]   (byte offsets in .bin)
 *       int64    document_indices[document_count]
 *       [int8    sequence_modes[sequence_count]]     (multimodal only)
 *
 * Documents are sequences: tokenfeed document i is IndexedDataset[i].
 *
 * The arrays start at offset 34, which is never aligned for int32/int64, so
 * the file's private state (mg_file, in tf_file's format_priv) keeps them as
 * raw bytes, read with unaligned-safe loads by this format's document ops
 * (the format table's row: file.c asks them for a document): open stays O(1)
 * and touches only the header, the last entry and the sampled fingerprint
 * bytes. Every pointer and size is range-checked when a document is looked
 * up; verify() walks them all.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "source.h"

/* The private state of a Megatron file: the raw int64 pointer and int32 size
 * arrays inside the mapped .idx (kept as bytes: never aligned for their
 * types, and a copy would make opening O(sequences)). */
typedef struct mg_file {
    const uint8_t *pointers;
    const uint8_t *sizes;
} mg_file;
_Static_assert(sizeof(mg_file) <= TF__FORMAT_PRIV_BYTES, "mg_file must fit tf_file's format_priv");

/* Sequence j: byte offset in the .bin and length in tokens. */
static int64_t mg_pointer(const tf_file *f, uint64_t j) {
    return (int64_t)tf__le64(tf__format_priv(f, const mg_file)->pointers + 8 * j);
}
static int32_t mg_size(const tf_file *f, uint64_t j) {
    return (int32_t)tf__le32(tf__format_priv(f, const mg_file)->sizes + 4 * j);
}

static int mg_document(const tf_file *f, uint64_t j, uint64_t *start, uint64_t *len) {
    size_t isz = tf_dtype_size(f->dtype);
    int64_t p = mg_pointer(f, j);
    int32_t n = mg_size(f, j);
    if (p < 0 || n < 0 || (uint64_t)p % isz != 0 || (uint64_t)p / isz > f->num_tokens ||
        (uint64_t)n > f->num_tokens - (uint64_t)p / isz)
        TF_FAIL(-TF_EFORMAT, "%s: sequence %llu: pointer %lld, size %d lie outside the %llu tokens of the .bin. The .idx does not belong to this .bin or is corrupt.",
                f->aux_path, (unsigned long long)j, (long long)p, (int)n, (unsigned long long)f->num_tokens);
    *start = (uint64_t)p / isz;
    *len = (uint64_t)n;
    return 0;
}

static uint64_t mg_find_document(const tf_file *f, uint64_t pos) {
    /* last j with start(j) <= pos; pointers are ascending in valid files */
    size_t isz = tf_dtype_size(f->dtype);
    uint64_t lo = 0, hi = f->num_docs;
    while (hi - lo > 1) {
        uint64_t mid = lo + (hi - lo) / 2;
        int64_t p = mg_pointer(f, mid);
        if (p >= 0 && (uint64_t)p / isz <= pos) lo = mid; else hi = mid;
    }
    /* skip empty sequences that start at the same position */
    while (lo + 1 < f->num_docs && mg_pointer(f, lo + 1) >= 0 && (uint64_t)mg_pointer(f, lo + 1) / isz <= pos) lo++;
    return lo;
}

const tf__doc_ops tf__megatron_doc_ops = {mg_document, mg_find_document};

typedef unsigned long long ull;

static tf_dtype mg_dtype(uint8_t code) {
    switch (code) {
    case 1: return TF_UINT8;
    case 2: return TF_INT8;
    case 3: return TF_INT16;
    case 4: return TF_INT32;
    case 5: return TF_INT64;
    case 6: return TF_FLOAT64;
    case 7: return TF_FLOAT32;
    case 8: return TF_UINT16;
    default: return TF_DTYPE_INVALID;
    }
}

#define MG_HEADER 34u
#define FIX "Re-run Megatron's preprocess_data.py, or check that the .idx belongs to the .bin."

int tf__open_megatron(const char *prefix, const tf_open_options *opt, tf_file *f) {
    (void)opt;
    size_t pl = strlen(prefix);
    f->path = malloc(pl + 5);
    f->aux_path = malloc(pl + 5);
    if (!f->path || !f->aux_path) return -ENOMEM;
    sprintf(f->path, "%s.bin", prefix);
    sprintf(f->aux_path, "%s.idx", prefix);
    const char *ip = f->aux_path;
    TF_TRY(tf__map_file(ip, &f->aux_map, &f->aux_len));
    TF_TRY(tf__map_file_main(f->path, f));
    const uint8_t *b = f->aux_map;
    uint64_t il = f->aux_len;
    if (il < MG_HEADER)
        TF_FAIL(-TF_EFORMAT, "%s: header: expected at least %u bytes, found %llu. The .idx is truncated. " FIX, ip, MG_HEADER, (ull)il);
    if (memcmp(b, "MMIDIDX\0\0", 9) != 0)
        TF_FAIL(-TF_EFORMAT, "%s: magic: expected \"MMIDIDX\\0\\0\", found another value. This is not a Megatron .idx file.", ip);
    uint64_t version = tf__le64(b + 9);
    if (version != 1)
        TF_FAIL(-TF_EFORMAT, "%s: version: expected 1, found %llu. Only MMIDIDX v1 (Megatron-LM indexed_dataset.py) is supported.", ip, (ull)version);
    tf_dtype dt = mg_dtype(b[17]);
    if (dt == TF_DTYPE_INVALID)
        TF_FAIL(-TF_EFORMAT, "%s: dtype code: expected 1 to 8, found %u. " FIX, ip, b[17]);
    uint64_t nseq = tf__le64(b + 18), ndoc = tf__le64(b + 26);
    uint64_t sz_lens, sz_ptrs, sz_docs, want, want_modes;
    if (tf__mul_overflow(nseq, 4, &sz_lens) || tf__mul_overflow(nseq, 8, &sz_ptrs) || tf__mul_overflow(ndoc, 8, &sz_docs) ||
        tf__add_overflow(MG_HEADER, sz_lens, &want) || tf__add_overflow(want, sz_ptrs, &want) ||
        tf__add_overflow(want, sz_docs, &want) || tf__add_overflow(want, nseq, &want_modes))
        TF_FAIL(-TF_EFORMAT, "%s: sequence_count: expected counts whose arrays fit in 64 bits, found %llu sequences and %llu documents. " FIX,
                ip, (ull)nseq, (ull)ndoc);
    /* want_modes: the multimodal variant appends one int8 mode per sequence */
    if (il != want && il != want_modes)
        TF_FAIL(-TF_EFORMAT, "%s: file size: expected %llu bytes for %llu sequences and %llu document indices, found %llu. The .idx is truncated or corrupt. " FIX,
                ip, (ull)want, (ull)nseq, (ull)ndoc, (ull)il);
    size_t isz = tf_dtype_size(dt);
    uint64_t bl = f->map_len;
    if (bl % isz)
        TF_FAIL(-TF_EFORMAT, "%s: file size: expected a multiple of the %s item size %zu, found %llu bytes. The .bin is truncated. " FIX,
                f->path, tf_dtype_name(dt), isz, (ull)bl);
    f->format = TF_FORMAT_MEGATRON;
    f->dtype = dt;
    f->num_tokens = bl / isz;
    f->num_docs = nseq;
    f->tokens = f->map;
    f->doc_kind = TF_DOCS_FORMAT;
    f->doc_ops = &tf__megatron_doc_ops;
    mg_file *m = tf__format_priv(f, mg_file);
    m->sizes = b + MG_HEADER;
    m->pointers = b + MG_HEADER + sz_lens;
    if (f->num_tokens > 0 && nseq == 0)
        TF_FAIL(-TF_EFORMAT, "%s: sequence_count: expected >= 1 for %llu tokens in the .bin, found 0. " FIX, ip, (ull)f->num_tokens);
    if (nseq) {
        /* O(1): the last sequence must end exactly where the .bin ends, as
         * Megatron's builder writes it. This also catches a dtype code that
         * reinterprets the .bin with another item size (the sizes would then
         * cover a different number of bytes). */
        uint64_t s, n;
        TF_TRY(tf__file_document(f, nseq - 1, &s, &n));
        if (s + n != f->num_tokens)
            TF_FAIL(-TF_EFORMAT, "%s: sizes/pointers: the last sequence ends at token %llu (%llu bytes as %s), but %s holds %llu bytes. "
                    "The .idx dtype code or sizes do not match the .bin; rebuild the .idx or check that both files belong together.",
                    ip, (ull)(s + n), (ull)((s + n) * isz), tf_dtype_name(dt), f->path, (ull)bl);
    }
    /* Fingerprint: header, sizes, and the first/last 64 KiB of both files. */
    tf__xxh64_state h;
    tf__xxh64_reset(&h, 0x6d6567617472);
    uint8_t rec[16];
    tf__put_le64(rec, il);
    tf__put_le64(rec + 8, bl);
    tf__xxh64_update(&h, b, MG_HEADER);
    tf__xxh64_update(&h, rec, sizeof rec);
    const uint64_t S = 64 * 1024;
    const uint8_t *bins = f->map;
    tf__xxh64_update(&h, b, (size_t)(il < S ? il : S));
    tf__xxh64_update(&h, b + (il < S ? 0 : il - S), (size_t)(il < S ? il : S));
    if (bl) {
        tf__xxh64_update(&h, bins, (size_t)(bl < S ? bl : S));
        tf__xxh64_update(&h, bins + (bl < S ? 0 : bl - S), (size_t)(bl < S ? bl : S));
    }
    f->fingerprint = tf__xxh64_digest(&h);
    tf__release_pages(f->map, f->map_len);
    tf__release_pages(f->aux_map, f->aux_len);
    return 0;
}
