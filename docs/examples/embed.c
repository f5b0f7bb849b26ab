/*
 * embed.c — use tokenfeed from a C program, without Python.
 *
 * Opens a dataset (any format tokenfeed reads), iterates N batches of packed,
 * shuffled sequences, prints a checksum of the tokens and the loader position
 * (what a trainer saves in its checkpoint), then seeks back to a saved position
 * and checks that the same batch comes out again.
 *
 * Build against an installed tokenfeed (the header and the shared library ship
 * inside the Python package):
 *
 *   INC=$(python -c 'import tokenfeed; print(tokenfeed.get_include())')
 *   LIB=$(python -c 'import tokenfeed, os; print(os.path.dirname(tokenfeed.get_library()))')
 *   cc -O2 -I"$INC" embed.c -L"$LIB" -ltokenfeed -Wl,-rpath,"$LIB" -o embed
 *   ./embed data/train 10            # dataset, number of batches
 *
 * Headerless token files need a dtype: ./embed tokens.bin 10 uint16
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenfeed.h"

/* Every tokenfeed call returns 0 or a negative code; tf_last_error() says what
 * went wrong in words (file, field, what to do). */
#define CHECK(call)                                                                      \
    do {                                                                                 \
        int rc_ = (call);                                                                \
        if (rc_ < 0) {                                                                   \
            fprintf(stderr, "%s:%d: %s failed: %s (%s)\n", __FILE__, __LINE__, #call,   \
                    tf_strerror(rc_), tf_last_error());                                  \
            goto done;                                                                   \
        }                                                                                \
    } while (0)

/* FNV-1a over the batch's token ids, widened to 64 bits so every dtype agrees. */
static uint64_t checksum(uint64_t h, const tf_batch_view *v) {
    uint64_t n = v->rows * (v->seq_len + 1);
    for (uint64_t i = 0; i < n; i++) {
        uint64_t t;
        tf_convert(&t, TF_UINT64, (const char *)v->tokens + i * tf_dtype_size(v->dtype), v->dtype, 1);
        h = (h ^ t) * 0x100000001b3ull;
    }
    return h;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s DATASET NUM_BATCHES [RAW_DTYPE]\n", argv[0]);
        return 2;
    }
    const char *path = argv[1];
    long nbatches = strtol(argv[2], NULL, 10);
    int status = 1;
    tf_dataset *ds = NULL;
    tf_loader *loader = NULL;
    tf_batch *batch = NULL;

    tf_open_options open_opt = {.format = TF_FORMAT_AUTO, .raw_dtype = TF_DTYPE_INVALID};
    if (argc > 3) open_opt.raw_dtype = tf_dtype_from_name(argv[3]);
    CHECK(tf_dataset_open(path, &open_opt, &ds));

    tf_dataset_info info;
    CHECK(tf_dataset_get_info(ds, &info));
    printf("dataset: %s, %" PRIu64 " tokens, %" PRIu64 " documents, %s, fingerprint %016" PRIx64 "\n",
           tf_format_name(info.format), info.num_tokens, info.num_documents, tf_dtype_name(info.dtype),
           info.fingerprint);

    /* One rank of one: the global batch is the batch. With data parallelism set
     * rank/world_size and global_batch = batch_size * world_size. */
    tf_loader_config cfg;
    tf_loader_config_init(&cfg);
    cfg.order.seq_len = 64;
    cfg.order.seed = 1234;
    cfg.order.shuffle = TF_SHUFFLE_FULL;
    cfg.batch_size = 4;
    cfg.rank = 0;
    cfg.world_size = 1;
    cfg.order.global_batch = cfg.batch_size * cfg.world_size;
    cfg.out_dtype = TF_INT32;
    CHECK(tf_loader_create(ds, &cfg, &loader));

    uint64_t h = 0xcbf29ce484222325ull, saved_pos = 0, saved_sum = 0;
    for (long b = 0; b < nbatches; b++) {
        if (b == nbatches / 2) saved_pos = tf_loader_position(loader); /* a "checkpoint" */
        CHECK(tf_loader_next(loader, &batch));
        tf_batch_view v;
        tf_batch_get_view(batch, &v);
        if (b == nbatches / 2) saved_sum = checksum(0xcbf29ce484222325ull, &v);
        h = checksum(h, &v);
        tf_batch_release(batch); /* the buffers go back to the loader's ring */
        batch = NULL;
    }
    printf("batches %ld  checksum %016" PRIx64 "  position %" PRIu64 "\n", nbatches, h, tf_loader_position(loader));

    /* Resume: seeking is O(1) and gives exactly the batch that followed the saved position. */
    if (nbatches > 0) {
        CHECK(tf_loader_seek(loader, saved_pos));
        CHECK(tf_loader_next(loader, &batch));
        tf_batch_view v;
        tf_batch_get_view(batch, &v);
        int same = checksum(0xcbf29ce484222325ull, &v) == saved_sum;
        tf_batch_release(batch);
        batch = NULL;
        printf("resume at position %" PRIu64 ": %s\n", saved_pos, same ? "same batch" : "DIFFERENT batch");
        if (!same) goto done;
    }
    status = 0;
done:
    tf_batch_release(batch); /* every free/release accepts NULL */
    tf_loader_free(loader);
    tf_dataset_free(ds);
    return status;
}
