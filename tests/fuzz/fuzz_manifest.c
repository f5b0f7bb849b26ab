/* Fuzz target: the dataset manifest parser (tf__parse_manifest), versions 1
 * and 2 (shard names that are relative paths into parts). The final
 * "end <checksum>" line is recomputed unless the input opts out
 * (fuzz_util.h), so mutations reach the shard-line checks. */
#include "fuzz_util.h"

/* What a shard name must never be, checked independently of the parser: empty,
 * absolute, or a path with an empty, "." or ".." component (one that could
 * leave the dataset directory); version 1 names have no '/' at all. */
static int name_stays_inside(const char *name, uint32_t version) {
    if (!name || !name[0] || name[0] == '/') return 0;
    if (version == 1 && strchr(name, '/')) return 0;
    const char *s = name;
    for (;;) {
        const char *e = strchr(s, '/');
        size_t n = e ? (size_t)(e - s) : strlen(s);
        if (n == 0 || (n == 1 && s[0] == '.') || (n == 2 && s[0] == '.' && s[1] == '.')) return 0;
        if (!e) return 1;
        s = e + 1;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (1u << 20)) return 0;
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    if (size) memcpy(buf, data, size);
    fuzz_fix_manifest(buf, size);
    tf_manifest m;
    if (tf__parse_manifest("fuzz/tokenfeed.manifest", buf, size, &m) == 0) {
        if (!tf__native_dtype_code(m.dtype) || m.vocab_size == 0) abort();
        if (m.version != 1 && m.version != 2) abort();
        for (uint64_t i = 0; i < m.num_shards; i++)
            if (!name_stays_inside(m.shards[i].name, m.version)) abort();
        tf__manifest_free(&m);
    } else if (m.shards || m.num_shards) {
        abort(); /* on error *m must be empty */
    }
    free(buf);
    return 0;
}
