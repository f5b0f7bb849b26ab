/* Fuzz target: a headerless token file split at an eos id, with its document
 * index (docs/format.md, "Document index of files split at an eos id").
 * Byte 0: bits 0-2 the dtype, bits 3-5 the eos id, bit 6 keeps the index's
 * header checksum as given (else it is recomputed, so the fields behind it
 * are reached), bit 7 recomputes the ends checksum (a version-2 index, built
 * from OLMo's metadata, has its header checksum at 88 and its ends at 96). Chunk 0 is the token
 * file; chunk 1 the index, whose data size and mtime fields are set to the
 * token file's (else every input would be refused as stale). With one chunk,
 * the index is built by tf_doc_index_build and then read. */
#include <sys/stat.h>

#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (1u << 20) || size < 1) return 0;
    static const tf_dtype dts[8] = {TF_UINT8, TF_UINT16, TF_UINT32, TF_INT32, TF_INT64, TF_UINT64, TF_INT16, TF_UINT16};
    uint8_t ctl = data[0];
    fuzz_chunk c[2];
    int k = fuzz_split(data + 1, size - 1, c, 2);
    const char *p = fuzz_path(0, "x.bin");
    fuzz_write(p, c[0].p, c[0].n);
    tf_open_options opt = {.format = TF_FORMAT_RAW, .raw_dtype = dts[ctl & 7], .has_eos_id = 1,
                           .eos_id = (uint64_t)((ctl >> 3) & 7)};
    if (k > 1) {
        struct stat st;
        uint8_t *ix = malloc(c[1].n ? c[1].n : 1);
        if (ix && stat(p, &st) == 0) {
            memcpy(ix, c[1].p, c[1].n);
            if (c[1].n >= 64) {
                tf__put_le64(ix + 24, (uint64_t)st.st_size);
                tf__put_le64(ix + 32, (uint64_t)((int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec));
                uint64_t nd = tf__le64(ix + 40);
                /* version 2 (built from OLMo's metadata): a 96-byte header, its checksum at 88 */
                size_t hs = c[1].n >= 96 && tf__le32(ix + 8) == 2 ? 96 : 64;
                if ((ctl & 0x80) && nd <= (c[1].n - hs) / 8) tf__put_le64(ix + 48, tf_hash64(ix + hs, nd * 8, 0));
                if (!(ctl & 0x40)) tf__put_le64(ix + hs - 8, tf_hash64(ix, hs - 8, 0));
            }
            fuzz_write(fuzz_path(1, "x.bin.tfdocs"), ix, c[1].n);
        }
        free(ix);
    } else {
        char out[512];
        (void)tf_doc_index_build(p, &opt, NULL, 0, out, sizeof out);
    }
    tf_dataset *ds = NULL;
    if (tf_dataset_open(p, &opt, &ds) == 0) {
        fuzz_exercise(ds, (uint32_t)(ctl >> 3) * 0x9e3779b9u);
        tf_dataset_free(ds);
    }
    fuzz_clean();
    return 0;
}
