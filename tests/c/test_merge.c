/* Datasets made of parts: tf_dataset_merge over part directories written by
 * tf_writer, the version 2 manifest (shard names with subdirectories) and the
 * names it refuses, and the merge's refusals (dtype/vocab mismatch, a part
 * without a manifest, paths leaving the dataset, a writer's dataset in place). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "helpers.h"

static char tmpdir[256];

/* Part k: documents of length 3 + j (j < ndocs), token t of document j is
 * (k * 1000 + j * 10 + t) % vocab. Small shards so parts have several. */
typedef struct part {
    int k;
    uint64_t vocab;
} part;

static uint64_t part_doc(void *ctx, uint64_t j, uint32_t *buf) {
    const part *p = ctx;
    uint64_t n = 3 + j;
    for (uint64_t t = 0; t < n; t++) buf[t] = (uint32_t)((p->k * 1000 + j * 10 + t) % p->vocab);
    return n;
}

/* Write part k into root/name (root itself when name is NULL). */
static void write_part(const char *root, const char *name, int k, uint64_t ndocs, tf_dtype dt, uint64_t vocab) {
    char dir[700];
    if (name) snprintf(dir, sizeof dir, "%s/%s", root, name);
    else snprintf(dir, sizeof dir, "%s", root);
    tf_writer_options o = t_writer_options(dt, vocab, 40, 0, 0);
    part p = {k, vocab};
    CHECK_OK(t_write_dataset(dir, &o, ndocs, part_doc, &p));
}

static void test_merge_basic(const char *root) {
    char p[400];
    const char *parts[] = {"parts/part-00000", "parts/part-00001", "parts/part-00002"};
    for (int k = 0; k < 3; k++) write_part(root, parts[k], k, k == 1 ? 0 : 9, TF_UINT16, 5000); /* part 1 is empty: allowed */
    CHECK_OK(tf_dataset_merge(root, parts, 3, 0));
    tf_dataset *ds = NULL;
    CHECK_OK(tf_dataset_open(root, NULL, &ds));
    if (ds) {
        tf_dataset_info info;
        CHECK_OK(tf_dataset_get_info(ds, &info));
        CHECK(info.num_documents == 18);
        /* order: part 0's documents, then part 2's, each in write order */
        for (uint64_t d = 0; d < 18; d++) {
            int k = d < 9 ? 0 : 2;
            uint64_t j = d % 9, start = 0, len = 0;
            CHECK_OK(tf_dataset_document(ds, d, &start, &len));
            CHECK(len == 3 + j);
            uint16_t tok[64];
            CHECK_OK(tf_dataset_read(ds, start, len, tok, TF_UINT16));
            for (uint64_t t = 0; t < len; t++) CHECK(tok[t] == (k * 1000 + j * 10 + t) % 5000);
        }
        CHECK_OK(tf_dataset_verify(ds, 1, NULL, NULL));
    }
    tf_dataset_info i1 = {0};
    if (ds) CHECK_OK(tf_dataset_get_info(ds, &i1));
    uint64_t fp1 = i1.fingerprint;
    tf_dataset_free(ds);

    /* idempotent: the same parts give the same bytes, untouched */
    snprintf(p, sizeof p, "%s/tokenfeed.manifest", root);
    size_t n1 = 0, n2 = 0;
    uint8_t *m1 = t_read_file(p, &n1);
    CHECK(m1 && strncmp((char *)m1, "tokenfeed-manifest 2\n", 21) == 0);
    CHECK(m1 && strstr((char *)m1, "\nshard parts/part-00002/shard-") != NULL);
    struct stat st1, st2;
    CHECK(stat(p, &st1) == 0);
    CHECK_OK(tf_dataset_merge(root, parts, 3, 0));
    uint8_t *m2 = t_read_file(p, &n2);
    CHECK(stat(p, &st2) == 0);
    CHECK(m1 && m2 && n1 == n2 && memcmp(m1, m2, n1) == 0);
    CHECK(st1.st_ino == st2.st_ino); /* not rewritten */
    /* ... and compared before the lock is taken: where the lock file cannot be
     * created (read-only storage; here a directory in its place, which stops
     * root too) the merge that writes nothing still succeeds */
    char lk[600];
    snprintf(lk, sizeof lk, "%s/.tokenfeed.lock", root);
    CHECK(mkdir(lk, 0755) == 0);
    CHECK_OK(tf_dataset_merge(root, parts, 3, 0));
    const char *other[] = {"parts/part-00001", "parts/part-00000"};
    CHECK(tf_dataset_merge(root, other, 2, 0) == -EISDIR); /* one that writes needs the lock */
    CHECK(stat(p, &st2) == 0 && st1.st_ino == st2.st_ino);
    CHECK(rmdir(lk) == 0);

    /* a previous merge is replaced by a merge of other parts */
    const char *two[] = {"parts/part-00002", "parts/part-00000"};
    CHECK_OK(tf_dataset_merge(root, two, 2, 0));
    ds = NULL;
    CHECK_OK(tf_dataset_open(root, NULL, &ds));
    if (ds) {
        uint64_t start = 0, len = 0;
        uint16_t tok[4];
        CHECK_OK(tf_dataset_document(ds, 0, &start, &len));
        CHECK_OK(tf_dataset_read(ds, start, 1, tok, TF_UINT16));
        CHECK(tok[0] == 2000); /* part 2 first now */
        tf_dataset_info i2;
        CHECK_OK(tf_dataset_get_info(ds, &i2));
        CHECK(i2.fingerprint != fp1);
    }
    tf_dataset_free(ds);
    free(m1);
    free(m2);
}

static void test_merge_refusals(const char *root) {
    char p[400];
    write_part(root, "a", 0, 4, TF_UINT16, 5000);
    write_part(root, "b", 1, 4, TF_UINT32, 70000);
    write_part(root, "c", 2, 4, TF_UINT16, 6000);
    const char *ab[] = {"a", "b"}, *ac[] = {"a", "c"}, *am[] = {"a", "missing"};
    CHECK_RC(tf_dataset_merge(root, ab, 2, 0), -TF_EFORMAT);
    CHECK(strstr(tf_last_error(), "dtype") != NULL);
    CHECK_RC(tf_dataset_merge(root, ac, 2, 0), -TF_EFORMAT);
    CHECK(strstr(tf_last_error(), "vocab_size") != NULL && strstr(tf_last_error(), "5000") != NULL);
    CHECK_RC(tf_dataset_merge(root, am, 2, 0), -TF_EFORMAT);
    CHECK(strstr(tf_last_error(), "part 1 of 2") != NULL && strstr(tf_last_error(), "did not finish") != NULL);
    const char *bad_paths[] = {"../a", "/abs", "a/../a", "a//b", "a/", "", "a b", ".", "a/./b"};
    for (size_t i = 0; i < sizeof bad_paths / sizeof *bad_paths; i++) {
        const char *one[] = {bad_paths[i]};
        CHECK_RC(tf_dataset_merge(root, one, 1, 0), -EINVAL);
    }
    const char *dup[] = {"a", "a"};
    CHECK_RC(tf_dataset_merge(root, dup, 2, 0), -EINVAL);
    CHECK_RC(tf_dataset_merge(root, NULL, 0, 0), -EINVAL);
    /* nothing was published by any refusal */
    snprintf(p, sizeof p, "%s/tokenfeed.manifest", root);
    CHECK(access(p, F_OK) != 0);

    /* a writer's dataset in the directory is replaced only with overwrite */
    write_part(root, NULL, 9, 2, TF_UINT16, 5000);
    const char *a[] = {"a"};
    CHECK_RC(tf_dataset_merge(root, a, 1, 0), -EEXIST);
    CHECK_OK(tf_dataset_merge(root, a, 1, 1));
    tf_dataset *ds = NULL;
    CHECK_OK(tf_dataset_open(root, NULL, &ds));
    tf_dataset_info i3 = {0};
    if (ds) CHECK_OK(tf_dataset_get_info(ds, &i3));
    CHECK(i3.num_documents == 4);
    tf_dataset_free(ds);
}

/* Version 2 names: relative paths only. Each manifest is written by hand with
 * a correct end checksum, so only the name rule can refuse it. */
static void test_manifest_names(const char *root) {
    char p[400];
    write_part(root, "sub", 0, 3, TF_UINT16, 5000);
    /* the part's own manifest gives the shard's counts and checksums */
    snprintf(p, sizeof p, "%s/sub/tokenfeed.manifest", root);
    size_t n = 0;
    uint8_t *pm = t_read_file(p, &n);
    CHECK(pm != NULL);
    if (!pm) return;
    char *line = strstr((char *)pm, "\nshard ");
    CHECK(line != NULL);
    if (!line) {
        free(pm);
        return;
    }
    char shard[64];
    unsigned long long nt, nd;
    char ts[17], dsum[17];
    CHECK(sscanf(line + 1, "shard %63s %llu %llu %16s %16s", shard, &nt, &nd, ts, dsum) == 5);
    struct {
        int version;
        const char *prefix;
        int ok;
    } cases[] = {
        {2, "sub/", 1}, {2, "./sub/", 0}, {2, "sub/../sub/", 0}, {2, "/sub/", 0}, {2, "sub//", 0},
        {1, "sub/", 0}, /* version 1 keeps plain names */
        {3, "sub/", 0}, /* a newer version is refused */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char body[1024];
        int len = snprintf(body, sizeof body,
                           "tokenfeed-manifest %d\ndtype uint16\nvocab_size 5000\nnum_shards 1\nshard %s%s %llu %llu %s %s\n",
                           cases[i].version, cases[i].prefix, shard, nt, nd, ts, dsum);
        len += snprintf(body + len, sizeof body - (size_t)len, "end %016llx\n",
                        (unsigned long long)tf_hash64(body, (size_t)len, 0));
        snprintf(p, sizeof p, "%s/tokenfeed.manifest", root);
        t_write_file(p, body, (size_t)len);
        tf_dataset *ds = NULL;
        int rc = tf_dataset_open(root, NULL, &ds);
        if (cases[i].ok) CHECK_OK(rc);
        else CHECK_RC(rc, -TF_EFORMAT);
        if (!cases[i].ok && cases[i].version == 3) CHECK(strstr(tf_last_error(), "newer tokenfeed") != NULL);
        tf_dataset_free(ds);
    }
    /* the same shard named twice (version 2): refused */
    char body[1024];
    int len = snprintf(body, sizeof body,
                       "tokenfeed-manifest 2\ndtype uint16\nvocab_size 5000\nnum_shards 2\nshard sub/%s %llu %llu %s %s\n"
                       "shard sub/%s %llu %llu %s %s\n",
                       shard, nt, nd, ts, dsum, shard, nt, nd, ts, dsum);
    len += snprintf(body + len, sizeof body - (size_t)len, "end %016llx\n",
                    (unsigned long long)tf_hash64(body, (size_t)len, 0));
    t_write_file(p, body, (size_t)len);
    tf_dataset *ds = NULL;
    CHECK_RC(tf_dataset_open(root, NULL, &ds), -TF_EFORMAT);
    CHECK(strstr(tf_last_error(), "twice") != NULL);
    free(pm);
}

/* Run test in a directory of its own, tmpdir/name, removed after. */
static void in_dir(const char *name, void (*test)(const char *root)) {
    char root[300];
    snprintf(root, sizeof root, "%s/%s", tmpdir, name);
    test(root);
    t_rm_rf(root);
}

int main(void) {
    if (t_mkdtemp(tmpdir, sizeof tmpdir, "tf_test_merge")) return T_EXIT_FAIL;
    in_dir("ds", test_merge_basic);
    in_dir("bad", test_merge_refusals);
    in_dir("names", test_manifest_names);
    t_rm_rf(tmpdir);
    return t_failures ? T_EXIT_FAIL : T_EXIT_PASS;
}
