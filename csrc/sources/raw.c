/*
 * raw.c — headerless token files (nanoGPT train.bin, OLMo .npy-less memmaps,
 * datatrove .ds), with an explicit dtype (opt->raw_dtype).
 *
 * Documents: with an eos id (opt->has_eos_id), a document ends after each
 * eos token, read from the document index docindex.c keeps. Otherwise one per
 * file, unless "<path>.index" exists beside it. datatrove's
 * TokenizedFile writes that file (e.g. "x.ds.index") as uint64 little-endian
 * cumulative document ends in tokens (doc_ends.append(write_idx), where
 * write_idx counts tokens), and its DatatroveFileDataset reads it the same
 * way; so the index maps directly to TF_DOCS_ENDS. Open checks its size (a
 * multiple of 8) and its last entry (== num_tokens) in O(1); monotonicity is
 * verify()'s job. An empty file is an empty token file (0 tokens), not an
 * error: tf_dataset_open refuses a dataset that is empty as a whole.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "source.h"

typedef unsigned long long ull;

int tf__open_raw(const char *path, const tf_open_options *opt, tf_file *f) {
    tf_dtype dt = opt->raw_dtype;
    size_t isz = tf_dtype_size(dt);
    if (!isz)
        TF_FAIL(-TF_EFORMAT, "%s: dtype: expected an explicit token dtype for a headerless file, found none. Pass dtype= (e.g. dtype=\"uint16\").", path);
    f->path = strdup(path);
    if (!f->path) return -ENOMEM;
    TF_TRY(tf__map_file_main(path, f));
    uint64_t len = f->map_len;
    if (len % isz)
        TF_FAIL(-TF_EFORMAT, "%s: file size: expected a multiple of the %s item size %zu, found %llu bytes. The file is truncated, or dtype= is wrong.",
                path, tf_dtype_name(dt), isz, (ull)len);
    f->format = TF_FORMAT_RAW;
    f->dtype = dt;
    f->num_tokens = len / isz;
    f->tokens = f->map;
    f->doc_kind = TF_DOCS_SINGLE;
    f->num_docs = f->num_tokens > 0;
    f->fingerprint = tf__sampled_fingerprint(f->map, len, 0x726177 + (uint64_t)dt);
    if (opt->has_eos_id) {
        /* documents end after each eos id (docindex.c); the index, whether
         * present or not, leaves the fingerprint alone: it is a function of
         * the tokens and the eos id */
        f->eos.split = 1;
        f->eos.id = opt->eos_id;
        f->fingerprint ^= tf_mix64(opt->eos_id ^ 0x656f7369640aULL);
        if (tf__is_url(path)) {
            f->eos.rows_only = 1;
            return 0;
        }
        return tf__docindex_open(path, opt, f);
    }

    size_t pl = strlen(path);
    char *ip = malloc(pl + 7);
    if (!ip) return -ENOMEM;
    sprintf(ip, "%s.index", path);
    if (!tf__file_exists(ip)) {
        free(ip);
        return 0;
    }
    f->aux_path = ip;
    TF_TRY(tf__map_file(ip, &f->aux_map, &f->aux_len));
    uint64_t il = f->aux_len;
    if (il % 8)
        TF_FAIL(-TF_EFORMAT, "%s: file size: expected a multiple of 8 (uint64 document ends), found %llu bytes. The datatrove index is truncated: re-run the tokenizer, or delete the .index to read the file as one document.",
                ip, (ull)il);
    uint64_t nd = il / 8;
    if (f->num_tokens > 0 && nd == 0)
        TF_FAIL(-TF_EFORMAT, "%s: document count: expected >= 1 for %llu tokens, found an empty index. Re-run the tokenizer, or delete the .index.",
                ip, (ull)f->num_tokens);
    if (nd) {
        uint64_t last = tf__le64((const uint8_t *)f->aux_map + il - 8);
        if (last != f->num_tokens)
            TF_FAIL(-TF_EFORMAT, "%s: last document end: expected %llu (the token count of %s with dtype %s), found %llu. The index belongs to another file, or dtype= is wrong.",
                    ip, (ull)f->num_tokens, path, tf_dtype_name(dt), (ull)last);
    }
    f->doc_kind = TF_DOCS_ENDS;
    f->doc_ends = f->aux_map; /* page-aligned mapping */
    f->num_docs = nd;
    f->fingerprint ^= tf__sampled_fingerprint(f->aux_map, il, 0x696478);
    return 0;
}
