/* llmc_dataloader.h — llm.c's training data loader, for tests: the reference
 * that tokenfeed's order="llmc" is checked against (tests/c/test_llmc_order.c
 * through the C API, tests/order/test_llmc_order.py through Python, by way of the
 * llmc_ref.c driver).
 *
 * A port of karpathy/llm.c, llmc/dataloader.h (and the two functions of
 * llmc/rand.h it uses), MIT license, Copyright (c) 2024 Andrej Karpathy:
 * function for function, the same fields, shard loading, reset, advance and
 * shuffles, reading the shard files with stdio as llm.c does; glob is
 * replaced by a list of paths, exit() and assert() by a failed CHECK
 * (helpers.h), and the seed 42 of its shuffle by a parameter. Its MT19937
 * (PyTorch's, llmc/rand.h) is written out independently of the library's
 * (one loop over the state); test_llmc_order.c checks it against the values
 * llmc/rand.h quotes. */
#ifndef TF_TEST_LLMC_DATALOADER_H
#define TF_TEST_LLMC_DATALOADER_H
#include "helpers.h"

/* ---- MT19937, PyTorch's (llmc/rand.h manual_seed / randint32) ------------ */

typedef struct ref_mt {
    uint32_t mt[624];
    int idx; /* next word; 624: regenerate */
} ref_mt;

static void ref_seed(ref_mt *g, uint32_t seed) {
    g->mt[0] = seed;
    for (int i = 1; i < 624; i++) g->mt[i] = 1812433253u * (g->mt[i - 1] ^ (g->mt[i - 1] >> 30)) + (uint32_t)i;
    g->idx = 624;
}

static uint32_t ref_u32(ref_mt *g) {
    if (g->idx >= 624) {
        for (int i = 0; i < 624; i++) {
            uint32_t y = (g->mt[i] & 0x80000000u) | (g->mt[(i + 1) % 624] & 0x7fffffffu);
            g->mt[i] = g->mt[(i + 397) % 624] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
        }
        g->idx = 0;
    }
    uint32_t y = g->mt[g->idx++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    return y ^ (y >> 18);
}

/* llmc/rand.h */
static void init_identity_permutation(int *data, int numel) {
    for (int i = 0; i < numel; i++) data[i] = i;
}
static void random_permutation(int *data, int numel, ref_mt *state) {
    for (int i = numel - 1; i > 0; i--) {
        int j = (int)(ref_u32(state) % (uint32_t)(i + 1)); /* pick an index j in [0, i] */
        int tmp = data[i];
        data[i] = data[j], data[j] = tmp;
    }
}

/* ---- llmc/dataloader.h ---------------------------------------------------- */

#define HEADER_SIZE 256

typedef struct {
    int process_rank, num_processes;
    size_t B, T, num_tokens, shard_num_samples;
    const char *const *paths; /* glob_result */
    size_t npaths;
    size_t current_shard_idx, current_sample_idx;
    FILE *tokens_file;
    uint16_t *buffer;
    ref_mt shuffle_rng;
    int should_shuffle;
    int *shard_indices, *intra_shard_indices;
    size_t total_batch_size_bytes, local_batch_offset_bytes, header_bytes;
    int64_t file_size_bytes;
} DataLoader;

static int64_t dataloader_load_shard_(DataLoader *loader, int shard_index) {
    if (loader->should_shuffle) shard_index = loader->shard_indices[shard_index];
    const char *filename = loader->paths[shard_index];
    if (loader->tokens_file != NULL) fclose(loader->tokens_file);
    loader->tokens_file = fopen(filename, "rb");
    CHECK(loader->tokens_file != NULL);
    int header[HEADER_SIZE];
    CHECK(fread(header, sizeof(int), HEADER_SIZE, loader->tokens_file) == HEADER_SIZE);
    CHECK(header[0] == 20240520 && header[1] == 1);
    int64_t ntok = header[2];
    fseek(loader->tokens_file, 0, SEEK_END);
    loader->file_size_bytes = ftell(loader->tokens_file);
    fseek(loader->tokens_file, 0, SEEK_SET);
    CHECK(loader->file_size_bytes == (int64_t)(HEADER_SIZE * sizeof(int) + ntok * sizeof(uint16_t)));
    /* -1 uint16_t due to us taking B*T+1 tokens but moving by B*T tokens */
    loader->shard_num_samples = (ntok * sizeof(uint16_t) - sizeof(uint16_t)) / loader->total_batch_size_bytes;
    return ntok;
}

static void prepare_intra_shard_indices_(DataLoader *loader) {
    free(loader->intra_shard_indices);
    loader->intra_shard_indices = malloc(loader->shard_num_samples * sizeof(int));
    init_identity_permutation(loader->intra_shard_indices, (int)loader->shard_num_samples);
    random_permutation(loader->intra_shard_indices, (int)loader->shard_num_samples, &loader->shuffle_rng);
}

static void dataloader_reset(DataLoader *loader) {
    loader->current_shard_idx = 0;
    loader->current_sample_idx = 0;
    if (loader->should_shuffle) random_permutation(loader->shard_indices, (int)loader->npaths, &loader->shuffle_rng);
    dataloader_load_shard_(loader, (int)loader->current_shard_idx);
    if (loader->should_shuffle) prepare_intra_shard_indices_(loader);
}

static void dataloader_advance_(DataLoader *loader) {
    if (loader->current_shard_idx == loader->npaths - 1) { /* the last shard: a new epoch */
        dataloader_reset(loader);
        return;
    }
    loader->current_shard_idx = (loader->current_shard_idx + 1) % loader->npaths;
    loader->current_sample_idx = 0;
    dataloader_load_shard_(loader, (int)loader->current_shard_idx);
    if (loader->should_shuffle) prepare_intra_shard_indices_(loader);
}

static void dataloader_init(DataLoader *loader, const char *const *paths, size_t npaths, size_t B, size_t T,
                            int process_rank, int num_processes, int should_shuffle, uint32_t seed) {
    memset(loader, 0, sizeof *loader);
    loader->process_rank = process_rank;
    loader->num_processes = num_processes;
    loader->B = B;
    loader->T = T;
    loader->should_shuffle = should_shuffle;
    loader->header_bytes = HEADER_SIZE * sizeof(int);
    loader->total_batch_size_bytes = ((loader->num_processes * (loader->B * loader->T)) * sizeof(uint16_t));
    loader->local_batch_offset_bytes = loader->process_rank * loader->B * loader->T * sizeof(uint16_t);
    loader->paths = paths;
    loader->npaths = npaths;
    if (should_shuffle) {
        ref_seed(&loader->shuffle_rng, seed + (uint32_t)process_rank); /* llm.c: 42 + process_rank */
        loader->shard_indices = malloc(npaths * sizeof(int));
        init_identity_permutation(loader->shard_indices, (int)npaths);
    }
    int64_t ntok_total = 0;
    for (int shard_index = 0; shard_index < (int)npaths; shard_index++) {
        int64_t shard_ntok = dataloader_load_shard_(loader, shard_index);
        CHECK(shard_ntok >= (int64_t)(num_processes * B * T + 1));
        ntok_total += shard_ntok;
    }
    loader->buffer = malloc((B * T + 1) * sizeof(uint16_t));
    loader->num_tokens = (size_t)ntok_total;
    dataloader_reset(loader);
}

static void dataloader_load_batch(DataLoader *loader) {
    size_t idx = loader->should_shuffle ? (size_t)loader->intra_shard_indices[loader->current_sample_idx]
                                        : loader->current_sample_idx;
    size_t global_batch_offset_bytes = idx * loader->total_batch_size_bytes;
    int64_t current_offset = (int64_t)(loader->header_bytes + global_batch_offset_bytes + loader->local_batch_offset_bytes);
    fseek(loader->tokens_file, (long)current_offset, SEEK_SET);
    CHECK(fread(loader->buffer, sizeof(uint16_t), loader->B * loader->T + 1, loader->tokens_file) ==
          loader->B * loader->T + 1);
}

static void dataloader_next_batch(DataLoader *loader) {
    if (loader->current_sample_idx >= loader->shard_num_samples) dataloader_advance_(loader);
    dataloader_load_batch(loader);
    loader->current_sample_idx += 1;
}

static void dataloader_free(DataLoader *loader) {
    free(loader->buffer);
    free(loader->shard_indices);
    free(loader->intra_shard_indices);
    if (loader->tokens_file) fclose(loader->tokens_file);
}

#endif
