/* Fuzz target: a NeMo AutoModel nanogpt shard (256 x int32 header, then
 * tokens) with its ".bos.idx" beside it (int32 BOS positions). Byte 0 picks
 * the order configuration; then chunk 0 is the shard, chunk 1 the index
 * (absent when the input has one chunk only). */
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (1u << 20) || size < 1) return 0;
    uint8_t ctl = data[0];
    fuzz_chunk c[2];
    int k = fuzz_split(data + 1, size - 1, c, 2);
    const char *p = fuzz_path(0, "shard.bin");
    fuzz_write(p, c[0].p, c[0].n);
    if (k > 1) fuzz_write(fuzz_path(1, "shard.bos.idx"), c[1].p, c[1].n);
    tf_open_options opt = {.format = (ctl & 1) ? TF_FORMAT_NEMO_NANOGPT : TF_FORMAT_AUTO, .raw_dtype = TF_DTYPE_INVALID};
    tf_dataset *ds = NULL;
    if (tf_dataset_open(p, &opt, &ds) == 0) {
        fuzz_exercise(ds, (uint32_t)(ctl >> 1) * 0x9e3779b9u);
        tf_dataset_free(ds);
    }
    fuzz_clean();
    return 0;
}
