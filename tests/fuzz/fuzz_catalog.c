/* Fuzz target: the catalogs a shard set opens from (docs/format.md, "The
 * node's catalog" and "A catalog beside the data"): the node's catalog of a
 * set of files, a shard set's record in it, and the catalog beside the data.
 * Byte 0: bits 0-1 pick which (0 and 3: the files' catalog, 1: the set's
 * record, 2: the catalog beside the data); bit 2 keeps the trailing checksum
 * as given (else it is recomputed), bit 3 keeps the keys as given (else those
 * of the catalog just written are put in: a key hashes paths of this run's
 * scratch directory), so the fields behind them are reached. The rest
 * replaces the catalog that a real open of three llm.c files just wrote; the
 * set is then opened from it. */
#include <time.h>

#define TF_EXPERIMENTAL_API
#include "fuzz_util.h"

static char cat_dir[300];

static void remove_cat_dir(void) {
    fuzz_unlink_all(cat_dir);
    rmdir(cat_dir);
}

/* The first file in cat_dir whose name ends with suffix, as a path. */
static int find_in_cat_dir(const char *suffix, char *out, size_t cap) {
    DIR *d = opendir(cat_dir);
    int found = 0;
    if (!d) return 0;
    struct dirent *e;
    size_t sl = strlen(suffix);
    while (!found && (e = readdir(d)) != NULL) {
        size_t n = strlen(e->d_name);
        if (n > sl && strcmp(e->d_name + n - sl, suffix) == 0) {
            snprintf(out, cap, "%s/%s", cat_dir, e->d_name);
            found = 1;
        }
    }
    closedir(d);
    return found;
}

/* Back-date path by a minute: catalogs record only files that have settled. */
static void age(const char *path) {
    struct timespec ts[2];
    clock_gettime(CLOCK_REALTIME, &ts[0]);
    ts[0].tv_sec -= 60;
    ts[1] = ts[0];
    utimensat(AT_FDCWD, path, ts, 0);
}

/* keys: how many u64 keys follow the magic and version (at offset 16) */
static void replace_with(const char *path, const uint8_t *p, size_t n, int keep_sum, int keys) {
    uint8_t *b = malloc(n ? n : 1), was[32];
    if (!b) return;
    memcpy(b, p, n);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t got = fd >= 0 ? pread(fd, was, sizeof was, 0) : -1;
    if (fd >= 0) close(fd);
    if (keys && got == (ssize_t)sizeof was && n >= 32) memcpy(b + 16, was + 16, 8 * (size_t)keys);
    if (!keep_sum && n >= 16) tf__put_le64(b + n - 8, tf_hash64(b, n - 8, 0));
    fuzz_write(path, b, n);
    free(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (1u << 20) || size < 1) return 0;
    if (!cat_dir[0]) {
        snprintf(cat_dir, sizeof cat_dir, "%s-catalog", fuzz_dir());
        if (mkdir(cat_dir, 0700) != 0 && errno != EEXIST) return 0;
        atexit(remove_cat_dir);
        setenv("TOKENFEED_CATALOG_DIR", cat_dir, 1);
    }
    uint8_t ctl = data[0];
    const char *names[3] = {"a.bin", "b.bin", "c.bin"};
    const char *paths[3];
    for (int i = 0; i < 3; i++) {
        paths[i] = strdup(fuzz_path(i, names[i]));
        fuzz_write_llmc(paths[i], i);
        age(paths[i]);
    }
    age(fuzz_dir());
    tf_open_options opt = {.format = TF_FORMAT_AUTO, .raw_dtype = TF_DTYPE_INVALID};
    tf_dataset *ds = NULL;
    char target[700] = "", prefix[400], spec[400];
    snprintf(prefix, sizeof prefix, "%s/", fuzz_dir());
    snprintf(spec, sizeof spec, "%s/*.bin", fuzz_dir());
    const char *specs[1] = {spec}, *dirs[1] = {fuzz_dir()};
    int kind = ctl & 3;
    if (tf_dataset_open_many(paths, 3, &opt, &ds) == 0) {
        struct stat st;
        if (kind == 1 && stat(fuzz_dir(), &st) == 0) {
            uint64_t ids[4] = {(uint64_t)st.st_dev, (uint64_t)st.st_ino, (uint64_t)st.st_size,
                               (uint64_t)st.st_mtim.tv_sec * 1000000000ull + (uint64_t)st.st_mtim.tv_nsec};
            if (tf_dataset_catalog_set(ds, specs, 1, &opt, dirs, ids, 1) == 0)
                find_in_cat_dir(".tfset", target, sizeof target);
        } else if (kind == 2) {
            if (tf_dataset_write_data_catalog(ds, prefix, "*.bin", &opt, target, sizeof target) != 0) target[0] = 0;
        } else {
            find_in_cat_dir(".tfcat", target, sizeof target);
        }
        tf_dataset_free(ds);
        ds = NULL;
    }
    if (target[0]) {
        replace_with(target, data + 1, size - 1, (ctl & 4) != 0, (ctl & 8) ? 0 : kind == 1 ? 2 : 1);
        int rc = kind == 1   ? tf_dataset_open_set(specs, 1, &opt, &ds)
                 : kind == 2 ? tf_dataset_open_data_catalog(prefix, "*.bin", &opt, &ds)
                             : tf_dataset_open_many(paths, 3, &opt, &ds);
        if (rc == 0) {
            fuzz_exercise(ds, (uint32_t)ctl * 0x9e3779b9u);
            tf_dataset_free(ds);
        }
    }
    for (int i = 0; i < 3; i++) free((void *)paths[i]);
    fuzz_clean();
    fuzz_unlink_all(cat_dir);
    return 0;
}
