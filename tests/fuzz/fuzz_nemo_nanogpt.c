/* Fuzz target: a NeMo AutoModel nanogpt shard (256 x int32 header, then
 * tokens) with its ".bos.idx" beside it (int32 BOS positions). Byte 0 picks
 * the order configuration (bit 0: the format named rather than detected);
 * then chunk 0 is the shard, chunk 1 the index (absent when the input has one
 * chunk only). */
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (1u << 20) || size < 1) return 0;
    tf_open_options opt = {.format = (data[0] & 1) ? TF_FORMAT_NEMO_NANOGPT : TF_FORMAT_AUTO,
                           .raw_dtype = TF_DTYPE_INVALID};
    fuzz_open_pair(data + 1, size - 1, "shard.bin", "shard.bos.idx", &opt, (uint32_t)(data[0] >> 1) * 0x9e3779b9u);
    return 0;
}
