/* Fuzz target: a whole dataset of any format, opened with format detection
 * (tf_dataset_open / tf_dataset_open_many) and iterated: every document
 * read, verify, then samples packed by tf_order.
 *
 * Input: byte 0 = kind, bytes 1..4 = order control, then chunks
 * (fuzz_split):
 *   kind % 6 == 0  native directory: chunk 0 = manifest, chunk k = the
 *                  k-th shard named by the manifest (names come from
 *                  tf__parse_manifest, so mutations keep files and manifest
 *                  paired); header and manifest checksums fixed up
 *   kind % 6 == 1  native shards given as a list of files (chunks 0..3)
 *   kind % 6 == 2  Megatron pair: chunk 0 = .idx, chunk 1 = .bin
 *   kind % 6 == 3  llm.c shards as a list (chunks 0..3)
 *   kind % 6 == 4  .npy files as a list (chunks 0..3)
 *   kind % 6 == 5  mixed list: each chunk a file whose format is detected,
 *                  with raw dtype uint16 for headerless ones
 */
#include "fuzz_util.h"

#define MAXC 9

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (1u << 20) || size < 5) return 0;
    uint8_t kind = data[0] % 6;
    uint32_t ctl = tf__le32(data + 1);
    fuzz_chunk c[MAXC];
    int k = fuzz_split(data + 5, size - 5, c, MAXC);
    tf_open_options opt = {.format = TF_FORMAT_AUTO, .raw_dtype = TF_DTYPE_INVALID};
    const char *paths[4];
    char names[4][32];
    int np = 0;
    if (kind == 0) {
        if (k < 1) return 0;
        uint8_t *man = malloc(c[0].n ? c[0].n : 1);
        if (!man) return 0;
        if (c[0].n) memcpy(man, c[0].p, c[0].n);
        fuzz_fix_manifest(man, c[0].n);
        tf_manifest m;
        if (tf__parse_manifest("m", man, c[0].n, &m) == 0) {
            for (uint64_t i = 0; i < m.num_shards && (int)i + 1 < k; i++) {
                uint8_t *sh = malloc(c[i + 1].n ? c[i + 1].n : 1);
                if (!sh) break;
                if (c[i + 1].n) memcpy(sh, c[i + 1].p, c[i + 1].n);
                fuzz_fix_native_header(sh, c[i + 1].n);
                fuzz_write(fuzz_path(1, m.shards[i].name), sh, c[i + 1].n);
                free(sh);
            }
            tf__manifest_free(&m);
        }
        fuzz_write(fuzz_path(0, TF_MANIFEST_NAME), man, c[0].n);
        free(man);
        paths[np++] = fuzz_dir();
    } else if (kind == 2) {
        fuzz_write(fuzz_path(0, "m.idx"), c[0].p, c[0].n);
        fuzz_write(fuzz_path(0, "m.bin"), c[1].p, c[1].n);
        paths[np++] = fuzz_path(1, "m");
    } else {
        static const char *ext[6] = {"", ".tfs", "", ".bin", ".npy", ".dat"};
        for (int i = 0; i < k && i < 4; i++) {
            snprintf(names[i], sizeof names[i], "f%d%s", i, ext[kind]);
            uint8_t *b = malloc(c[i].n ? c[i].n : 1);
            if (!b) break;
            if (c[i].n) memcpy(b, c[i].p, c[i].n);
            fuzz_fix_native_header(b, c[i].n);
            fuzz_write(fuzz_path(i, names[i]), b, c[i].n);
            free(b);
            paths[np] = fuzz_path(i, names[i]);
            np++;
        }
        if (kind == 5) opt.raw_dtype = TF_UINT16;
    }
    tf_dataset *ds = NULL;
    if (np && tf_dataset_open_many(paths, (size_t)np, &opt, &ds) == 0) {
        fuzz_exercise(ds, ctl);
        tf_dataset_free(ds);
    }
    fuzz_clean();
    return 0;
}
