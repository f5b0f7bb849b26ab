/*
 * llmc.c — karpathy/llm.c token shards, read in place.
 *
 * Layout (dev/data/data_common.py write_datafile, llmc/dataloader.h):
 *   int32 header[256]: [0] magic, [1] version, [2] number of tokens
 *     magic 20240520 + version 1 -> uint16 tokens (GPT-2)
 *     magic 20240801 + version 7 -> uint32 tokens (Llama 3)
 *   tokens from byte 1024; file size == 1024 + n * itemsize exactly.
 * One document per file (llm.c shards carry no boundaries besides EOT
 * tokens); the vocabulary size is not recorded (0).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdlib.h>
#include <string.h>

#include "source.h"

typedef unsigned long long ull;

#define LLMC_HEADER 1024u

int tf__open_llmc(const char *path, const tf_open_options *opt, tf_file *f) {
    (void)opt;
    TF_TRY(tf__open_main(path, f, LLMC_HEADER, "256 x int32",
                         "The llm.c shard is truncated: regenerate it with llm.c's dev/data scripts."));
    const uint8_t *b = f->map;
    uint64_t len = f->map_len;
    uint32_t magic = tf__le32(b), version = tf__le32(b + 4);
    int32_t ntok = (int32_t)tf__le32(b + 8);
    tf_dtype dt;
    if (magic == 20240520u && version == 1) dt = TF_UINT16;
    else if (magic == 20240801u && version == 7) dt = TF_UINT32;
    else if (magic == 20240520u || magic == 20240801u)
        TF_FAIL(-TF_EFORMAT, "%s: version: expected %u for magic %u, found %u. The shard is from an llm.c variant tokenfeed does not know.",
                path, magic == 20240520u ? 1u : 7u, magic, version);
    else
        TF_FAIL(-TF_EFORMAT, "%s: magic: expected 20240520 or 20240801, found %u. This is not an llm.c token shard (eval files use 20240522).",
                path, magic);
    if (ntok < 0)
        TF_FAIL(-TF_EFORMAT, "%s: num_tokens (header[2]): expected >= 0, found %d. The header is corrupt.", path, ntok);
    size_t isz = tf_dtype_size(dt);
    uint64_t want = LLMC_HEADER + (uint64_t)ntok * isz;
    if (len != want)
        TF_FAIL(-TF_EFORMAT, "%s: file size: expected %llu (1024 + %d tokens x %zu bytes), found %llu. The shard is truncated or its header is wrong: regenerate it.",
                path, (ull)want, ntok, isz, (ull)len);
    f->format = TF_FORMAT_LLMC;
    f->dtype = dt;
    f->num_tokens = (uint64_t)ntok;
    f->num_docs = ntok > 0;
    f->doc_kind = TF_DOCS_SINGLE;
    f->tokens = b + LLMC_HEADER;
    f->fingerprint = tf__sampled_fingerprint(b, len, 0x6c6c6d63);
    return 0;
}
