/* Fuzz target: the .npy header parser (tf__parse_npy_header), then the
 * same bytes opened as a .npy file (size checks, reads, order); and the
 * parser of the 1-D and 2-D index arrays of Megatron's cache
 * (tf__parse_npy_header_2d). */
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (1u << 20)) return 0;
    tf_npy_header h;
    if (tf__parse_npy_header_2d("fuzz.npy", data, size, &h) == 0 &&
        (!tf_dtype_size(h.dtype) || h.data_offset > size || h.ndim < 1 || h.ndim > 2))
        abort();
    if (tf__parse_npy_header("fuzz.npy", data, size, &h) == 0) {
        if (!tf_dtype_size(h.dtype) || h.data_offset > size) abort();
        const char *p = fuzz_path(0, "f.npy");
        fuzz_write(p, data, size);
        tf_open_options opt = {.format = TF_FORMAT_NPY, .raw_dtype = TF_DTYPE_INVALID};
        tf_dataset *ds = NULL;
        if (tf_dataset_open(p, &opt, &ds) == 0) {
            fuzz_exercise(ds, size > 12 ? (uint32_t)data[size - 1] << 8 | data[size - 2] : 0);
            tf_dataset_free(ds);
        }
        fuzz_clean();
    }
    return 0;
}
