/*
 * nemo_nanogpt.c — NeMo AutoModel's nanogpt token shards, read in place.
 *
 * Layout (NVIDIA-NeMo/Automodel, nemo_automodel/components/datasets/llm/
 * nanogpt_dataset.py, load_bin_shard and _load_bos_index; written by its
 * tools/nanogpt_data_processor.py):
 *   int32 header[256]: [0] magic 278895051, [1] version 1, [2] number of
 *     tokens, [3] bytes per token (2: uint16, 4: uint32)
 *   tokens from byte 1024; file size == 1024 + n * itemsize exactly.
 * Optional sidecar, named as pathlib's with_suffix(".bos.idx") names it (the
 * last extension replaced: "shard.bin" -> "shard.bos.idx"): int32 positions
 * (in tokens) of the BOS token that starts each document. With it, document
 * j starts at the j-th position (and tokens before the first position, if
 * any, are one document of their own); without it, the file is one document.
 * Positions are checked at open (each in [0, tokens), strictly increasing)
 * and turned into cumulative document ends: O(documents) at open, the
 * sidecar's size. The vocabulary size is not recorded (0).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdlib.h>
#include <string.h>

#include "source.h"

typedef unsigned long long ull;

#define NEMO_MAGIC 278895051u
#define NEMO_HEADER 1024u

TF_HIDDEN int tf__nemo_nanogpt_magic(const uint8_t *head, size_t n);
TF_HIDDEN int tf__open_nemo_nanogpt(const char *path, const tf_open_options *opt, tf_file *f);
/* Its row's companion, the sidecar named as with_suffix ("x.bin" ->
 * "x.bos.idx"): tf__nemo_nanogpt_companions (companions.c). */

int tf__nemo_nanogpt_magic(const uint8_t *head, size_t n) {
    return n >= 4 && tf__le32(head) == NEMO_MAGIC;
}

/* The documents from the sidecar bos (f->aux_path, mapped into aux_map). */
static int open_bos(tf_file *f) {
    const char *ip = f->aux_path;
    const uint8_t *b = f->aux_map;
    uint64_t len = f->aux_len, n = len / 4;
    if (len % 4)
        TF_FAIL(-TF_EFORMAT, "%s: file size: expected a multiple of 4 (int32 BOS positions), found %llu bytes. The index is truncated: write it again, or delete it to read %s as one document.",
                ip, (ull)len, f->path);
    if (n == 0 || f->num_tokens == 0) {
        if (n && f->num_tokens == 0)
            TF_FAIL(-TF_EFORMAT, "%s: BOS position 0: expected none for a shard of 0 tokens, found %llu positions. The index belongs to another shard: write it again, or delete it.",
                    ip, (ull)n);
        return 0; /* one document (or none): as without an index */
    }
    int lead = tf__le32(b) != 0; /* tokens before the first BOS: a document of their own */
    uint64_t nd = n + (uint64_t)lead;
    uint64_t *ends = malloc(nd * sizeof *ends);
    if (!ends) return -ENOMEM;
    uint64_t d = 0, prev = 0;
    for (uint64_t j = 0; j < n; j++) {
        int32_t p = (int32_t)tf__le32(b + 4 * j);
        if (p < 0 || (uint64_t)p >= f->num_tokens || (j > 0 && (uint64_t)p <= prev)) {
            free(ends);
            TF_FAIL(-TF_EFORMAT, "%s: BOS position %llu: expected %s%llu and below %llu (the token count of %s), found %d. The index is corrupt or belongs to another shard: write it again, or delete it to read the shard as one document.",
                    ip, (ull)j, j ? "above " : "at least ", j ? (ull)prev : 0ull, (ull)f->num_tokens, f->path, p);
        }
        if (j > 0 || lead) ends[d++] = (uint64_t)p;
        prev = (uint64_t)p;
    }
    ends[d++] = f->num_tokens;
    f->owned = ends;
    f->doc_ends = ends;
    f->doc_kind = TF_DOCS_ENDS;
    f->num_docs = d;
    f->fingerprint ^= tf__sampled_fingerprint(b, len, 0x626f73);
    return 0;
}

int tf__open_nemo_nanogpt(const char *path, const tf_open_options *opt, tf_file *f) {
    (void)opt;
    TF_TRY(tf__open_main(path, f, NEMO_HEADER, "256 x int32", "The nanogpt shard is truncated: write it again."));
    const uint8_t *b = f->map;
    uint64_t len = f->map_len;
    uint32_t magic = tf__le32(b), version = tf__le32(b + 4), isz = tf__le32(b + 12);
    int32_t ntok = (int32_t)tf__le32(b + 8);
    if (magic != NEMO_MAGIC)
        TF_FAIL(-TF_EFORMAT, "%s: magic: expected %u (a NeMo AutoModel nanogpt shard), found %u. Open it without format= to detect what it is.",
                path, NEMO_MAGIC, magic);
    if (version != 1)
        TF_FAIL(-TF_EFORMAT, "%s: version (header[1]): expected 1, found %u. The shard is from a writer tokenfeed does not know.",
                path, version);
    if (isz != 2 && isz != 4)
        TF_FAIL(-TF_EFORMAT, "%s: bytes per token (header[3]): expected 2 (uint16) or 4 (uint32), found %u. The header is corrupt: write the shard again.",
                path, isz);
    if (ntok < 0)
        TF_FAIL(-TF_EFORMAT, "%s: num_tokens (header[2]): expected >= 0, found %d. The header is corrupt.", path, ntok);
    uint64_t want = NEMO_HEADER + (uint64_t)ntok * isz;
    if (len != want)
        TF_FAIL(-TF_EFORMAT, "%s: file size: expected %llu (1024 + %d tokens x %u bytes), found %llu. The shard is truncated or its header is wrong: write it again.",
                path, (ull)want, ntok, isz, (ull)len);
    f->format = TF_FORMAT_NEMO_NANOGPT;
    f->dtype = isz == 2 ? TF_UINT16 : TF_UINT32;
    f->num_tokens = (uint64_t)ntok;
    f->num_docs = ntok > 0;
    f->doc_kind = TF_DOCS_SINGLE;
    f->tokens = b + NEMO_HEADER;
    f->fingerprint = tf__sampled_fingerprint(b, len, 0x6e656d6f);
    char *ip = tf__companion_path(path, tf__nemo_nanogpt_companions[0].suffix, 1);
    if (!ip) return -ENOMEM;
    if (!tf__file_exists(ip)) {
        free(ip);
        return 0;
    }
    f->aux_path = ip;
    TF_TRY(tf__map_file(ip, &f->aux_map, &f->aux_len));
    return open_bos(f);
}
