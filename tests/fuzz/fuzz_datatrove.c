/* Fuzz target: a headerless token file with a datatrove ".index" beside it
 * (uint64 cumulative document ends). Byte 0 picks the dtype and the order
 * configuration; then chunk 0 is the token file, chunk 1 the index (absent
 * when the input has one chunk only). */
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (1u << 20) || size < 1) return 0;
    static const tf_dtype dts[8] = {TF_UINT8, TF_UINT16, TF_UINT32, TF_INT32, TF_INT64, TF_UINT64, TF_INT16, TF_UINT16};
    uint8_t ctl = data[0];
    fuzz_chunk c[2];
    int k = fuzz_split(data + 1, size - 1, c, 2);
    const char *p = fuzz_path(0, "x.ds");
    fuzz_write(p, c[0].p, c[0].n);
    if (k > 1) fuzz_write(fuzz_path(1, "x.ds.index"), c[1].p, c[1].n);
    tf_open_options opt = {.format = TF_FORMAT_RAW, .raw_dtype = dts[ctl & 7]};
    tf_dataset *ds = NULL;
    if (tf_dataset_open(p, &opt, &ds) == 0) {
        fuzz_exercise(ds, (uint32_t)(ctl >> 3) * 0x9e3779b9u);
        tf_dataset_free(ds);
    }
    fuzz_clean();
    return 0;
}
