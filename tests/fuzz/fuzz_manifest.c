/* Fuzz target: the dataset manifest parser (tf__parse_manifest). The final
 * "end <checksum>" line is recomputed unless the input opts out
 * (fuzz_util.h), so mutations reach the shard-line checks. */
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (1u << 20)) return 0;
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    if (size) memcpy(buf, data, size);
    fuzz_fix_manifest(buf, size);
    tf_manifest m;
    if (tf__parse_manifest("fuzz/tokenfeed.manifest", buf, size, &m) == 0) {
        if (!tf__native_dtype_code(m.dtype) || m.vocab_size == 0) abort();
        for (uint64_t i = 0; i < m.num_shards; i++)
            if (!m.shards[i].name || !m.shards[i].name[0] || strchr(m.shards[i].name, '/')) abort();
        tf__manifest_free(&m);
    } else if (m.shards || m.num_shards) {
        abort(); /* on error *m must be empty */
    }
    free(buf);
    return 0;
}
