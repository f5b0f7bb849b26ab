/*
 * replay.c — run fuzz targets over saved inputs without libFuzzer, in the
 * style of zstd's tests/fuzz/regression_driver.c. Linked with one target
 * (make -C csrc replay builds replay_<target> for each), it calls
 * LLVMFuzzerTestOneInput once per file given on the command line, recursing
 * into directories. Built with plain cc (and with SANITIZE=... for the
 * sanitizer CI pass), so every make test replays the whole corpus.
 *
 * Exit 0 when every input ran; 1 if a file could not be read or no input
 * was found. A bug shows as a crash or a sanitizer report.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static long ninputs, nfail;

static void run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: cannot open %s\n", path);
        nfail++;
        return;
    }
    size_t cap = 1 << 16, n = 0;
    uint8_t *buf = malloc(cap);
    for (;;) {
        if (!buf) break;
        if (n == cap) {
            uint8_t *nb = realloc(buf, cap * 2);
            if (!nb) { free(buf); buf = NULL; break; }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        if (got == 0) break;
        n += got;
    }
    int err = ferror(f);
    fclose(f);
    if (!buf || err) {
        fprintf(stderr, "replay: cannot read %s\n", path);
        free(buf);
        nfail++;
        return;
    }
    /* an exact-size copy, so that ASan catches a read one past the end */
    uint8_t *exact = malloc(n ? n : 1);
    if (!exact) { free(buf); nfail++; return; }
    memcpy(exact, buf, n);
    free(buf);
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    ninputs++;
}

static int cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void run_path(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "replay: no such file or directory: %s\n", path);
        nfail++;
        return;
    }
    if (!S_ISDIR(st.st_mode)) {
        run_file(path);
        return;
    }
    DIR *d = opendir(path);
    if (!d) { nfail++; return; }
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue; /* ., .., hidden files */
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            char **nn = realloc(names, cap * sizeof *nn);
            if (!nn) break;
            names = nn;
        }
        size_t l = strlen(path) + strlen(e->d_name) + 2;
        names[n] = malloc(l);
        if (!names[n]) break;
        snprintf(names[n], l, "%s/%s", path, e->d_name);
        n++;
    }
    closedir(d);
    if (n) qsort(names, n, sizeof *names, cmp); /* deterministic order */
    for (size_t i = 0; i < n; i++) {
        run_path(names[i]);
        free(names[i]);
    }
    free(names);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE_OR_DIR...\n", argv[0]);
        return 1;
    }
    for (int i = 1; i < argc; i++) run_path(argv[i]);
    printf("%s: %ld inputs replayed%s\n", argv[0], ninputs, nfail ? ", some unreadable" : "");
    return nfail || ninputs == 0 ? 1 : 0;
}
