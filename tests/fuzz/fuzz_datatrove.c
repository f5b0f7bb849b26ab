/* Fuzz target: a headerless token file with a datatrove ".index" beside it
 * (uint64 cumulative document ends). Byte 0 picks the dtype and the order
 * configuration; then chunk 0 is the token file, chunk 1 the index (absent
 * when the input has one chunk only). */
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (1u << 20) || size < 1) return 0;
    static const tf_dtype dts[8] = {TF_UINT8, TF_UINT16, TF_UINT32, TF_INT32, TF_INT64, TF_UINT64, TF_INT16, TF_UINT16};
    uint8_t ctl = data[0];
    tf_open_options opt = {.format = TF_FORMAT_RAW, .raw_dtype = dts[ctl & 7]};
    fuzz_open_pair(data + 1, size - 1, "x.ds", "x.ds.index", &opt, (uint32_t)(ctl >> 3) * 0x9e3779b9u);
    return 0;
}
