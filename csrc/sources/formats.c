/*
 * formats.c — the format table: per on-disk format its names, magic test,
 * parser and re-parse, companion files, document kind and whether a catalog
 * may describe it (source.h, tf__format_row). Detection from bytes happens
 * here only (tf__format_sniff), for local files (dataset.c) and remote objects
 * (remote_open.c) alike; the open switch, the catalog's re-parse on first
 * touch, the binding's names and the CLI's --format choices read the rows.
 *
 * What a path or URL names (a dataset directory, a pair by its prefix, a
 * file) is decided once too, from these rows (resolve.c). Every companion
 * file tokenfeed knows (a Megatron .idx, a datatrove .index, an eos_id
 * .tfdocs, OLMo's .csv.gz, a nanogpt .bos.idx) is in some row's list: shard
 * set grouping (pathspec.c), the local pair check and a remote open's
 * requests read them there.
 *
 * Adding a format: its parser file (which fills a tf_file, see source.h) and
 * one row below, plus its enum constant in tokenfeed.h.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "source.h"

static int magic_native(const uint8_t *h, size_t n) {
    return n >= 8 && memcmp(h, TF_NATIVE_MAGIC, 8) == 0;
}

static int magic_npy(const uint8_t *h, size_t n) {
    return n >= 6 && memcmp(h, "\x93NUMPY", 6) == 0;
}

/* llm.c: 20240520 (GPT-2, uint16) or 20240801 (Llama 3, uint32) */
static int magic_llmc(const uint8_t *h, size_t n) {
    return n >= 4 && (tf__le32(h) == 20240520u || tf__le32(h) == 20240801u);
}

int tf__megatron_idx_magic(const uint8_t *h, size_t n) {
    return n >= 9 && memcmp(h, "MMIDIDX\0\0", 9) == 0;
}

/* Megatron files are parsed from their prefix; f->path is the .bin. */
static int reopen_megatron(const char *bin, const tf_open_options *opt, tf_file *f) {
    size_t n = strlen(bin);
    char *pre = strdup(bin);
    if (!pre) return -ENOMEM;
    if (n > 4 && strcmp(pre + n - 4, ".bin") == 0) pre[n - 4] = '\0';
    int rc = tf__open_megatron(pre, opt, f);
    free(pre);
    return rc;
}

/* A native shard's document index and tables: from its header's offset to
 * the end of the file. */
static int needs_native(const char *path, const uint8_t *h, size_t n, uint64_t size, uint64_t *off, uint64_t *end) {
    tf_file tmp;
    tf__native_info ni;
    memset(&tmp, 0, sizeof tmp);
    if (n < TF_NATIVE_HEADER_SIZE || tf__parse_native_header(path, h, TF_NATIVE_HEADER_SIZE, size, &tmp) != 0 ||
        tf__native_info_of(&tmp, &ni) != 0)
        return 1;
    *off = ni.index_at;
    *end = size;
    return 0;
}

/* A .npy header: format 1.0 has a u16 header length at 8; 2.0 and 3.0 a u32. */
static int needs_npy(const char *path, const uint8_t *h, size_t n, uint64_t size, uint64_t *off, uint64_t *end) {
    (void)path;
    if (n < 12 || size < 12) return 1;
    uint64_t hl = h[6] == 1 ? 10u + (uint64_t)(h[8] | h[9] << 8) : 12u + tf__le32(h + 8);
    *off = 0;
    *end = hl < size ? hl : size;
    return 0;
}

/* NeMo AutoModel's nanogpt shard (nemo_nanogpt.c). */
TF_HIDDEN int tf__open_nemo_nanogpt(const char *path, const tf_open_options *opt, tf_file *f);
TF_HIDDEN int tf__nemo_nanogpt_magic(const uint8_t *head, size_t n);
/* Detection order is table order: the rows with a magic are tried first to
 * last. Headerless (raw) files have none and are what no row claims. */
static const tf__format_row rows[] = {
    {.format = TF_FORMAT_NATIVE, .name = "tokenfeed", .alias = "native", .magic = magic_native,
     .parse = tf__open_native, .reparse = tf__open_native, .docs = TF_DOCS_ENDS, .catalog = 1, .manifest = 1,
     .ops = &tf__native_ops, .tail_per_doc = 8, .needs = needs_native, .what = "a tokenfeed shard or dataset"},
    {.format = TF_FORMAT_MEGATRON, .name = "megatron", .parse = tf__open_megatron, .reparse = reopen_megatron,
     .companions = tf__megatron_companions, .docs = TF_DOCS_FORMAT, .doc_ops = &tf__megatron_doc_ops,
     .pair_data_suffix = ".bin", .pair = "a Megatron pair", .pair_magic = tf__megatron_idx_magic,
     .pair_magic_what = "\"MMIDIDX\\0\\0\"", .catalog = 0,
     .what = "a Megatron .bin/.idx pair"},
    {.format = TF_FORMAT_LLMC, .name = "llm.c", .alias = "llmc", .magic = magic_llmc, .parse = tf__open_llmc,
     .reparse = tf__open_llmc, .docs = TF_DOCS_SINGLE, .catalog = 1, .what = "an llm.c shard"},
    {.format = TF_FORMAT_RAW, .name = "raw", .parse = tf__open_raw, .reparse = tf__open_raw,
     .companions = tf__raw_companions, .docs = TF_DOCS_ENDS, .catalog = 1, .headerless = 1,
     .what = "a headerless token file"},
    {.format = TF_FORMAT_NPY, .name = "npy", .magic = magic_npy, .parse = tf__open_npy, .reparse = tf__open_npy,
     .docs = TF_DOCS_SINGLE, .catalog = 1, .needs = needs_npy, .what = "a .npy array"},
    {.format = TF_FORMAT_NEMO_NANOGPT, .name = "nemo-nanogpt", .alias = "nanogpt", .magic = tf__nemo_nanogpt_magic,
     .parse = tf__open_nemo_nanogpt, .reparse = tf__open_nemo_nanogpt, .companions = tf__nemo_nanogpt_companions,
     .docs = TF_DOCS_ENDS, .catalog = 1, .what = "a NeMo AutoModel nanogpt shard"},
};

#define NROWS (sizeof rows / sizeof rows[0])

const tf__format_row *tf__format_at(size_t i) {
    return i < NROWS ? &rows[i] : NULL;
}

const tf__format_row *tf__format_row_of(tf_format fmt) {
    for (size_t i = 0; i < NROWS; i++)
        if (rows[i].format == fmt) return &rows[i];
    return NULL;
}

tf_format tf__format_sniff(const uint8_t *head, size_t n) {
    for (size_t i = 0; head && i < NROWS; i++)
        if (rows[i].magic && rows[i].magic(head, n)) return rows[i].format;
    return TF_FORMAT_RAW;
}

char *tf__companion_name(const tf__companion *c, const char *path) {
    return tf__companion_path(path, c->suffix, c->data_ext[0] != '\0');
}

char *tf__format_companion(tf_format fmt, const char *path, size_t k, int *oom) {
    const tf__format_row *r = tf__format_row_of(fmt);
    *oom = 0;
    for (size_t i = 0; r && r->companions && r->companions[i].suffix; i++) {
        if (!r->companions[i].fetch || k--) continue;
        char *out = tf__companion_name(&r->companions[i], path);
        if (!out) *oom = 1;
        return out;
    }
    return NULL;
}

const tf__format_row *tf__format_manifest_row(void) {
    for (size_t i = 0; i < NROWS; i++)
        if (rows[i].manifest) return &rows[i];
    return NULL;
}

/* ---- the public face: names ---------------------------------------------- */

const char *tf_format_name(tf_format f) {
    if (f == TF_FORMAT_AUTO) return "auto";
    const tf__format_row *r = tf__format_row_of(f);
    return r ? r->name : "unknown";
}

int tf_format_from_name(const char *name, tf_format *out) {
    if (!name || !out) TF_FAIL(-EINVAL, "tf_format_from_name: a name and an output are required");
    if (strcmp(name, "auto") == 0) {
        *out = TF_FORMAT_AUTO;
        return 0;
    }
    for (size_t i = 0; i < NROWS; i++)
        if (strcmp(name, rows[i].name) == 0 || (rows[i].alias && strcmp(name, rows[i].alias) == 0)) {
            *out = rows[i].format;
            return 0;
        }
    char names[256] = "";
    size_t used = 0;
    for (size_t i = 0; i < NROWS && used < sizeof names; i++) {
        int w = snprintf(names + used, sizeof names - used, "%s'%s'", i ? ", " : "", rows[i].name);
        if (w > 0) used += (size_t)w;
    }
    TF_FAIL(-EINVAL, "unknown format '%.64s': expected one of %s, or none to detect it", name, names);
}

tf_format tf_format_at(size_t i) {
    return i < NROWS ? rows[i].format : TF_FORMAT_AUTO;
}
