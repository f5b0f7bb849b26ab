/* Fuzz target: a remote shard set's catalog (docs/remote.md, "A catalog
 * beside the data in object storage"), the bytes an open fetches from the
 * store and parses (sources/catalog.c, tf__catalog_parse_objects) before it
 * checks the set's listing against them. The parser must refuse what it cannot
 * use, never read or write out of bounds, never leak, and never hand out an
 * entry outside the set's prefix or one the first touch could not read alone
 * (a companion file, compressed blocks, a Megatron pair).
 *
 * Byte 0: bit 0 keeps the trailing checksum as given (else it is recomputed),
 * bit 1 keeps the key as given (else the key of the set parsed is put in), so
 * that the fields behind them are reached; bit 2 XORs the rest of the input
 * into a real catalog of three llm.c files written here (else the rest is
 * the catalog). */
#define TF_EXPERIMENTAL_API
#include "fuzz_util.h"
#include "sources/source.h"

#define PREFIX "s3://bucket/tokens/"
#define PATTERN "*.bin"

/* A catalog of three llm.c files as tokenfeed index writes one: *out
 * malloc'ed, or NULL. */
static void real_catalog(const tf_open_options *opt, uint8_t **out, size_t *len) {
    *out = NULL;
    *len = 0;
    const char *paths[3];
    for (int i = 0; i < 3; i++) {
        char name[16];
        snprintf(name, sizeof name, "%c.bin", 'a' + i);
        paths[i] = strdup(fuzz_path(i, name));
        fuzz_write_llmc(paths[i], i);
    }
    tf_dataset *ds = NULL;
    if (tf_dataset_open_many(paths, 3, opt, &ds) == 0) {
        /* the files as objects under PREFIX (the records hold names only) */
        char prefix[400];
        snprintf(prefix, sizeof prefix, "%s/", fuzz_dir());
        uint64_t sizes[3] = {1104, 1104, 1104};
        const char *versions[3] = {"\"etag-a\"", "\"etag-b\"", ""};
        if (tf__catalog_pack_objects(prefix, PATTERN, opt, ds->files, sizes, versions, 3, out, len) != 0) *out = NULL;
        tf_dataset_free(ds);
    }
    for (int i = 0; i < 3; i++) free((void *)paths[i]);
    fuzz_clean();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > (1u << 20)) return 0;
    uint8_t ctl = data[0];
    tf_open_options opt = {.format = TF_FORMAT_AUTO, .raw_dtype = TF_DTYPE_INVALID};
    uint8_t *buf = NULL;
    size_t n = 0;
    if (ctl & 4) {
        real_catalog(&opt, &buf, &n);
        if (!buf) return 0;
        for (size_t i = 1; i < size && i - 1 < n; i++) buf[i - 1] ^= data[i];
    } else {
        n = size - 1;
        buf = malloc(n ? n : 1);
        if (!buf) return 0;
        memcpy(buf, data + 1, n);
    }
    if (!(ctl & 2) && n >= 24) {
        char name[64];
        tf__catalog_objects_name(PATTERN, &opt, name, sizeof name);
        uint64_t key = strtoull(name + strlen(TF_DATA_CATALOG_STEM), NULL, 16);
        tf__put_le64(buf + 16, key);
    }
    if (!(ctl & 1) && n >= 16) tf__put_le64(buf + n - 8, tf_hash64(buf, n - 8, 0));
    tf_file *files = NULL;
    uint64_t nfiles = 0;
    int rc = tf__catalog_parse_objects(PREFIX, PATTERN, &opt, buf, n, &files, &nfiles);
    if (rc != 0 && ctl == 4 && size == 1) abort(); /* the real catalog, untouched, must parse */
    if (rc == 0) {
        if (nfiles < 2) abort();
        for (uint64_t i = 0; i < nfiles; i++) {
            const tf_file *f = &files[i];
            size_t pl = strlen(PREFIX);
            if (strncmp(f->path, PREFIX, pl) != 0 || !f->path[pl] || strchr(f->path + pl, '/')) abort();
            if (f->aux_path || f->blocks.ops || f->eos.split || f->format == TF_FORMAT_MEGATRON) abort();
            if (!tf__parser_of(f->format) || !tf_dtype_size(f->dtype)) abort();
            tf__file_id id[2];
            tf__file_lazy_ids(f, id);
            if (id[0].known != 2) abort();
        }
        for (uint64_t i = 0; i < nfiles; i++) tf__file_close(&files[i]);
        free(files);
    }
    free(buf);
    tf__clearerr();
    return 0;
}
