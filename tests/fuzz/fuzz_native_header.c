/* Fuzz target: the native shard header parser (tf__parse_native_header) and,
 * when the input is a whole shard, the document index and block table it
 * points at (document lookups, token reads, zstd block decompression).
 * The header checksum is fixed up unless the input opts out (fuzz_util.h). */
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (1u << 20)) return 0;
    /* byte 0 of the input: how file_size relates to the bytes given, so the
     * "header only" path (a prefix of a larger file) is exercised too */
    if (size < 1) return 0;
    uint8_t mode = data[0];
    data++;
    size--;
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    fuzz_fix_native_header(buf, size);
    uint64_t file_size = size;
    if (mode & 1) file_size += (uint64_t)(mode >> 1) * 4096;
    tf_file f;
    memset(&f, 0, sizeof f);
    f.path = (char *)"fuzz.tfs"; /* messages only; never freed */
    if (tf__parse_native_header("fuzz.tfs", buf, size, file_size, &f) == 0 && file_size == size) {
        static int64_t out[4096];
        uint64_t nd = f.num_docs < 64 ? f.num_docs : 64;
        for (uint64_t j = 0; j < nd; j++) {
            uint64_t s, n;
            if (tf__file_document(&f, j, &s, &n) == 0) {
                if (s > f.num_tokens || n > f.num_tokens - s) abort();
                tf__file_read(&f, s, n < 4096 ? n : 4096, out, TF_INT64);
            }
        }
        if (f.num_tokens) { uint64_t d; (void)tf__file_find_document(&f, f.num_tokens - 1, &d); }
        if (f.blocks.ops)
            for (uint64_t b = 0; b < f.blocks.count && b < 16; b++) {
                static uint8_t blk[1 << 16];
                tf__file_read_block(&f, b, blk, sizeof blk, NULL);
            }
        if (f.num_tokens <= (1u << 22)) {
            _Atomic uint64_t progress = 0;
            _Atomic int cancel = 0;
            tf__file_verify(&f, f.vocab_size, &progress, &cancel);
        }
    }
    free(buf);
    return 0;
}
