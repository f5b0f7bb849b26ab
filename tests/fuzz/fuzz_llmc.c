/* Fuzz target: an llm.c token shard (256 x int32 header, then tokens),
 * written as a file and opened with format llm.c, then exercised. */
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (1u << 20)) return 0;
    const char *p = fuzz_path(0, "shard.bin");
    fuzz_write(p, data, size);
    tf_open_options opt = {.format = TF_FORMAT_LLMC, .raw_dtype = TF_DTYPE_INVALID};
    tf_dataset *ds = NULL;
    if (tf_dataset_open(p, &opt, &ds) == 0) {
        fuzz_exercise(ds, size > 16 ? tf__le32(data + 12) : 0);
        tf_dataset_free(ds);
    }
    fuzz_clean();
    return 0;
}
