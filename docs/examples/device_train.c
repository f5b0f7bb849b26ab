/*
 * device_train.c — a C/CUDA training loop fed by tokenfeed's device loader.
 *
 *   device_train DATASET STEPS [static]
 *
 * tokenfeed's copy thread puts each batch on the GPU as soon as the engine
 * has assembled it, up to `prefetch` batches ahead; every step finds its
 * batch's copy already issued, and its stream waits for that copy on the GPU
 * (no host wait). `static` delivers every batch into the same device buffers
 * instead, as a step captured in a CUDA graph needs.
 *
 * train_step() stands in for your kernels: it queues, on the step's stream, a
 * copy of the tokens the step would read back to the host, so that the
 * program can print a checksum of what the GPU saw (tests compare it with the
 * CPU loader's stream).
 *
 * Build (plain C; link the CUDA runtime your kernels use):
 *   cc -O2 -I"$INC" device_train.c -L"$LIB" -ltokenfeed -lcudart -o device_train
 * tokenfeed uses the libcudart already loaded in the process, so the loader
 * and your kernels share one runtime and one context.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenfeed.h"

#ifdef __CUDACC__
#include <cuda_runtime.h>
#else
/* The CUDA runtime calls used here, as cuda_runtime_api.h declares them, so
 * that a C compiler builds this file without the toolkit's headers. */
typedef int cudaError_t;
typedef struct CUstream_st *cudaStream_t;
enum { cudaSuccess = 0, cudaStreamNonBlocking = 1, cudaMemcpyDeviceToHost = 2 };
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, int kind, cudaStream_t stream);
cudaError_t cudaMalloc(void **ptr, size_t size);
cudaError_t cudaFree(void *ptr);
const char *cudaGetErrorString(cudaError_t error);
#endif

enum { SEQ_LEN = 64, BATCH = 4 };

#define CUDA_CHECK(call)                                                                           \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(e_));                            \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)

#define TF_CHECK(call)                                                                             \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ < 0) {                                                                             \
            fprintf(stderr, "%s: %s (%s)\n", #call, tf_last_error(), tf_strerror(rc_));            \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)

/* Your kernels, launched on `stream` (which already waits for the batch's
 * copy). Here: the tokens the step would read, copied back to `seen`. */
static cudaError_t train_step(const tf_device_batch_view *v, cudaStream_t stream, int32_t *seen) {
    size_t bytes = v->rows * (v->seq_len + 1) * sizeof(int32_t);
    return cudaMemcpyAsync(seen, v->tokens, bytes, cudaMemcpyDeviceToHost, stream);
}

static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = (const uint8_t *)p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001B3ull;
    return h;
}

static tf_device_loader *make_loader(tf_dataset *ds, const tf_device_static *sb, tf_loader **lp) {
    tf_loader_config cfg;
    tf_loader_config_init(&cfg);
    cfg.order.seq_len = SEQ_LEN;
    cfg.order.seed = 1234;
    cfg.batch_size = BATCH;
    cfg.order.global_batch = BATCH;
    cfg.out_dtype = TF_INT32;
    tf_device_config dc;
    tf_device_config_init(&dc);
    dc.device = 0;          /* cuda:LOCAL_RANK in a multi-GPU job */
    dc.prefetch_batches = 2; /* batches copied ahead of the step */
    dc.static_buffers = sb; /* NULL: each batch in a slot of its own */
    tf_device_loader *dl = NULL;
    if (tf_loader_create(ds, &cfg, lp) < 0 || tf_device_loader_create(*lp, &dc, &dl) < 0) {
        fprintf(stderr, "creating the loader: %s\n", tf_last_error());
        return NULL;
    }
    return dl;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s DATASET STEPS [static]\n", argv[0]);
        return 2;
    }
    int steps = atoi(argv[2]), use_static = argc > 3 && !strcmp(argv[3], "static");
    int status = 1;
    tf_dataset *ds = NULL;
    tf_loader *loader = NULL, *loader2 = NULL;
    tf_device_loader *dl = NULL, *dl2 = NULL;
    tf_device_batch *batch = NULL;
    cudaStream_t stream = NULL;
    tf_device_batch_view v;
    tf_device_stats st;
    uint64_t resume_at = 0, h;
    int32_t *again;
    int k;
    tf_device_static sb;
    memset(&sb, 0, sizeof sb);
    size_t row_bytes = (SEQ_LEN + 1) * sizeof(int32_t), batch_bytes = BATCH * row_bytes;
    int32_t *seen = (int32_t *)calloc((size_t)(steps > 0 ? steps : 1) + 1, batch_bytes);
    if (steps < 1 || !seen) {
        fprintf(stderr, "STEPS must be >= 1\n");
        free(seen);
        return 2;
    }

    TF_CHECK(tf_dataset_open(argv[1], NULL, &ds));
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    if (use_static) { /* one set of device buffers for every batch */
        sb.tokens_bytes = batch_bytes;
        CUDA_CHECK(cudaMalloc(&sb.tokens, sb.tokens_bytes));
    }
    if (!(dl = make_loader(ds, use_static ? &sb : NULL, &loader))) goto done;

    for (int step = 0; step < steps; step++) {
        /* The batch's copy was issued ahead; `stream` waits for it on the GPU. */
        TF_CHECK(tf_device_loader_next(dl, (uintptr_t)stream, &batch));
        tf_device_batch_get_view(batch, &v);
        CUDA_CHECK(train_step(&v, stream, seen + (size_t)step * BATCH * (SEQ_LEN + 1)));
        /* Its slot is reused once the work queued on `stream` so far is done. */
        TF_CHECK(tf_device_batch_release(batch, (uintptr_t)stream));
        batch = NULL;
        if (step == steps / 2) resume_at = tf_device_loader_position(dl); /* a checkpoint */
    }
    /* Only to read back what the steps saw; a trainer never waits per step. */
    CUDA_CHECK(cudaStreamSynchronize(stream));
    h = fnv1a(0xCBF29CE484222325ull, seen, (size_t)steps * batch_bytes);
    tf_device_loader_get_stats(dl, &st);
    printf("batches %d  checksum %016llx  position %llu\n", steps, (unsigned long long)h,
           (unsigned long long)tf_device_loader_position(dl));
    printf("copies issued ahead %.3f  consumer wait mean %.1f us p99 %.1f us  H2D %.2f GB/s\n",
           st.copies_issued_ahead, st.wait_mean_s * 1e6, st.wait_p99_s * 1e6, st.h2d_gbps);

    /* Resume from the checkpoint in a fresh loader: the same next batch. */
    if (!(dl2 = make_loader(ds, use_static ? &sb : NULL, &loader2))) goto done;
    TF_CHECK(tf_device_loader_seek(dl2, resume_at));
    TF_CHECK(tf_device_loader_next(dl2, (uintptr_t)stream, &batch));
    tf_device_batch_get_view(batch, &v);
    again = seen + (size_t)steps * BATCH * (SEQ_LEN + 1);
    CUDA_CHECK(train_step(&v, stream, again));
    TF_CHECK(tf_device_batch_release(batch, (uintptr_t)stream));
    batch = NULL;
    CUDA_CHECK(cudaStreamSynchronize(stream));
    k = steps / 2 + 1;
    if (k < steps)
        printf("resume at position %llu: %s batch\n", (unsigned long long)resume_at,
               memcmp(again, seen + (size_t)k * BATCH * (SEQ_LEN + 1), batch_bytes) ? "DIFFERENT" : "same");
    status = 0;
done:
    tf_device_batch_release(batch, (uintptr_t)stream); /* release/free functions accept NULL */
    tf_device_loader_free(dl2);
    tf_device_loader_free(dl);
    tf_loader_free(loader2);
    tf_loader_free(loader);
    tf_dataset_free(ds);
    if (sb.tokens) cudaFree(sb.tokens);
    if (stream) cudaStreamDestroy(stream);
    free(seen);
    return status;
}
