/*
 * companions.c — the companion files of the format table's rows (formats.c
 * points each row at its list here): every name tokenfeed knows beside a
 * data file. Data only, and a lookup that calls nothing, so that the
 * shard-set listing (pathspec.c), which the parsers' file reads consult,
 * reads the same lists as the rows without depending on the parsers.
 */
#include <stddef.h>

#include "source.h"

/* Megatron's pair: its .idx is the pair's second half (asked for by the
 * resolution of what a name is, not beside every file). */
const tf__companion tf__megatron_companions[] = {
    {.suffix = ".idx", .data_ext = ".bin", .what = "a Megatron .idx", .pair = "Megatron"},
    {.suffix = NULL},
};

/* Beside a headerless file: datatrove's document ends (read remotely too);
 * tokenfeed's eos_id document index and OLMo's per-document metadata beside
 * x.npy, both read from local files only (docindex.c), so a remote open
 * never asks for them. */
const tf__companion tf__raw_companions[] = {
    {.suffix = ".index", .data_ext = "", .fetch = 1, .what = "a datatrove .index"},
    {.suffix = ".tfdocs", .data_ext = "", .what = "an eos_id document index"},
    {.suffix = ".csv.gz", .data_ext = ".npy", .what = "OLMo's document metadata"},
    {.suffix = NULL},
};

/* NeMo AutoModel's nanogpt sidecar, named as with_suffix ("x.bin" ->
 * "x.bos.idx"), read by a remote open too. */
const tf__companion tf__nemo_nanogpt_companions[] = {
    {.suffix = ".bos.idx", .data_ext = ".bin", .fetch = 1, .what = "a .bos.idx"},
    {.suffix = NULL},
};

/* In the format table's row order (formats.c). */
static const tf__companion *const lists[] = {tf__megatron_companions, tf__raw_companions, tf__nemo_nanogpt_companions};

const tf__companion *tf__companion_at(size_t k) {
    for (size_t i = 0; i < sizeof lists / sizeof lists[0]; i++)
        for (size_t j = 0; lists[i][j].suffix; j++)
            if (!k--) return &lists[i][j];
    return NULL;
}

int tf__companion_index(const tf__companion *c) {
    const tf__companion *x;
    for (size_t k = 0; (x = tf__companion_at(k)) != NULL; k++)
        if (x == c) return (int)k;
    return -1;
}
