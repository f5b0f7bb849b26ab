/* Fuzz target: a Megatron MMIDIDX v1 pair. Chunk 0 is P.idx, chunk 1 is
 * P.bin, the first byte of chunk 2 (if any) picks the order configuration
 * (fuzz_split in fuzz_util.h). Opened as format megatron, then exercised. */
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (1u << 20)) return 0;
    fuzz_chunk c[3];
    fuzz_split(data, size, c, 3);
    fuzz_write(fuzz_path(0, "m.idx"), c[0].p, c[0].n);
    fuzz_write(fuzz_path(0, "m.bin"), c[1].p, c[1].n);
    tf_open_options opt = {.format = TF_FORMAT_MEGATRON, .raw_dtype = TF_DTYPE_INVALID};
    tf_dataset *ds = NULL;
    if (tf_dataset_open(fuzz_path(0, "m"), &opt, &ds) == 0) {
        fuzz_exercise(ds, c[2].n ? (uint32_t)c[2].p[0] * 2654435761u : 0);
        tf_dataset_free(ds);
    }
    fuzz_clean();
    return 0;
}
