/* Sources layer: the native writer and reader (plain and zstd, several shards,
 * empty documents), the foreign formats written by hand (Megatron, llm.c,
 * .npy, headerless + datatrove index), corrupt and truncated inputs, verify. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "helpers.h"
#include "sources/source.h"

static char tmpdir[256];

static void path_in(char *out, size_t cap, const char *name) { snprintf(out, cap, "%s/%s", tmpdir, name); }

static int count_files(const char *dir, const char *prefix) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (!strncmp(e->d_name, prefix, strlen(prefix))) n++;
    closedir(d);
    return n;
}

static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

/* Deterministic test documents: doc d has len_of(d) tokens, token t of doc d
 * is (d * 131 + t * 7) % vocab. Some documents are empty. */
static uint64_t len_of(uint64_t d) { return d % 7 == 3 ? 0 : (d * 37) % 500 + 1; }
static uint32_t tok_of(uint64_t d, uint64_t t, uint64_t vocab) { return (uint32_t)((d * 131 + t * 7) % vocab); }

static void write_docs(const char *dir, const tf_writer_options *o, uint64_t ndocs, uint64_t *total) {
    tf_writer *w = NULL;
    CHECK_OK(tf_writer_create(dir, o, &w));
    if (!w) return;
    uint32_t buf[600];
    *total = 0;
    for (uint64_t d = 0; d < ndocs; d++) {
        uint64_t n = len_of(d);
        for (uint64_t t = 0; t < n; t++) buf[t] = tok_of(d, t, o->vocab_size);
        /* alternate source dtypes: the writer converts */
        if (d % 2) {
            int64_t b64[600];
            for (uint64_t t = 0; t < n; t++) b64[t] = buf[t];
            CHECK_OK(tf_writer_add_document(w, b64, n, TF_INT64));
        } else {
            CHECK_OK(tf_writer_add_document(w, buf, n, TF_UINT32));
        }
        *total += n;
    }
    CHECK(tf_writer_num_documents(w) == ndocs);
    CHECK(tf_writer_num_tokens(w) == *total);
    CHECK_OK(tf_writer_finish(w));
    tf_writer_free(w);
}

static void check_docs(const char *dir, uint64_t ndocs, uint64_t total, uint64_t vocab, int compressed,
                       uint64_t *fingerprint) {
    tf_dataset *ds = NULL;
    CHECK_OK(tf_dataset_open(dir, NULL, &ds));
    if (!ds) return;
    tf_dataset_info info;
    CHECK_OK(tf_dataset_get_info(ds, &info));
    CHECK(info.num_tokens == total);
    CHECK(info.num_documents == ndocs);
    CHECK(info.vocab_size == vocab);
    CHECK(info.format == TF_FORMAT_NATIVE);
    CHECK(info.num_files > 1);
    *fingerprint = info.fingerprint;
    tf_file_info fi;
    CHECK_OK(tf_dataset_get_file(ds, 0, &fi));
    CHECK(fi.compressed == compressed);
    uint32_t out[600];
    uint64_t expect_start = 0;
    int bad = 0;
    for (uint64_t d = 0; d < ndocs && !bad; d++) {
        uint64_t s, n;
        CHECK_OK(tf_dataset_document(ds, d, &s, &n));
        if (s != expect_start || n != len_of(d)) {
            fprintf(stderr, "doc %llu: start %llu len %llu, expected %llu %llu\n", (unsigned long long)d,
                    (unsigned long long)s, (unsigned long long)n, (unsigned long long)expect_start,
                    (unsigned long long)len_of(d));
            bad = 1;
        }
        if (n) {
            CHECK_OK(tf_dataset_read(ds, s, n, out, TF_UINT32));
            for (uint64_t t = 0; t < n; t++)
                if (out[t] != tok_of(d, t, vocab)) bad = 1;
            uint64_t dd;
            CHECK_OK(tf_dataset_find_document(ds, s + n - 1, &dd));
            if (dd != d) bad = 1;
        }
        expect_start += n;
    }
    CHECK(!bad);
    /* a read across shard boundaries */
    uint16_t *all = malloc(total * sizeof *all);
    CHECK_OK(tf_dataset_read(ds, 0, total, all, TF_UINT16));
    free(all);
    const void *p;
    tf_dtype dt;
    /* several shards, each mapped on demand: no pointer handed out */
    CHECK(tf_dataset_view(ds, 0, 1, &p, &dt) == -TF_EUNSUPPORTED);
    CHECK_OK(tf_dataset_verify(ds, 2, NULL, NULL));
    tf_dataset_free(ds);
}

static void first_shard(const char *dir, char *out, size_t cap) {
    DIR *d = opendir(dir);
    struct dirent *e;
    char best[256] = "";
    while (d && (e = readdir(d)))
        if (!strncmp(e->d_name, "shard-", 6) && (!best[0] || strcmp(e->d_name, best) < 0))
            snprintf(best, sizeof best, "%s", e->d_name);
    if (d) closedir(d);
    snprintf(out, cap, "%s/%s", dir, best);
}

static void test_native(void) {
    char dir[300], dirz[300];
    path_in(dir, sizeof dir, "plain");
    path_in(dirz, sizeof dirz, "zstd");
    tf_writer_options o;
    tf_writer_options_init(&o);
    CHECK(o.dtype == TF_UINT16 && o.shard_tokens == (1ull << 28) && o.block_tokens == 2048 && o.level == 3);
    tf_writer *w = NULL;
    CHECK_RC(tf_writer_create(dir, &o, &w), -EINVAL); /* vocab_size unset */
    o.vocab_size = 1000;
    o.shard_tokens = 4000;
    uint64_t total = 0, totalz = 0, fp = 0, fpz = 0;
    write_docs(dir, &o, 200, &total);
    CHECK(count_files(dir, "shard-") > 3);
    CHECK(count_files(dir, ".") == 2); /* only . and .. : no temp files left */
    check_docs(dir, 200, total, 1000, 0, &fp);

    int have_zstd = (tf_features() & TF_FEATURE_ZSTD) != 0;
    o.compression = TF_COMPRESS_ZSTD;
    o.block_tokens = 1000;
    if (have_zstd) {
        write_docs(dirz, &o, 200, &totalz);
        check_docs(dirz, 200, totalz, 1000, 1, &fpz);
        CHECK(total == totalz);
        CHECK(fp == fpz); /* compressed twin: same fingerprint */
    } else {
        CHECK_RC(tf_writer_create(dirz, &o, &w), -TF_EUNSUPPORTED);
    }
    o.compression = TF_COMPRESS_NONE;

    /* existing dataset: refused without overwrite, replaced with it */
    CHECK_RC(tf_writer_create(dir, &o, &w), -EEXIST);
    CHECK(strstr(tf_last_error(), "overwrite=True") != NULL);
    int before = count_files(dir, "shard-");
    o.overwrite = 1;
    o.shard_tokens = 1 << 20;
    write_docs(dir, &o, 50, &total);
    CHECK(count_files(dir, "shard-") == 1); /* the old shards are gone */
    CHECK(before > 1);
    tf_dataset *ds = NULL;
    CHECK_OK(tf_dataset_open(dir, NULL, &ds));
    tf_dataset_info info;
    if (ds) {
        CHECK_OK(tf_dataset_get_info(ds, &info));
        CHECK(info.num_documents == 50 && info.num_files == 1);
    }
    tf_dataset_free(ds);

    /* a single shard opens on its own */
    char shard[600];
    first_shard(dir, shard, sizeof shard);
    CHECK_OK(tf_dataset_open(shard, NULL, &ds));
    tf_dataset_free(ds);

    /* unfinished writer: free removes everything of its run */
    char d2[300];
    path_in(d2, sizeof d2, "unfinished");
    o.overwrite = 0;
    o.shard_tokens = 100;
    CHECK_OK(tf_writer_create(d2, &o, &w));
    uint16_t toks[80];
    for (int i = 0; i < 80; i++) toks[i] = (uint16_t)i;
    for (int i = 0; i < 5; i++) CHECK_OK(tf_writer_add_document(w, toks, 80, TF_UINT16));
    /* vocab violations name the document and the token, and leave the writer usable */
    toks[17] = 1000;
    CHECK_RC(tf_writer_add_document(w, toks, 80, TF_UINT16), -TF_EVOCAB);
    CHECK(strstr(tf_last_error(), "document 5") && strstr(tf_last_error(), "token 17") && strstr(tf_last_error(), "1000"));
    int32_t neg[2] = {1, -4};
    CHECK_RC(tf_writer_add_document(w, neg, 2, TF_INT32), -TF_EVOCAB);
    float fl[1] = {1};
    CHECK_RC(tf_writer_add_document(w, fl, 1, TF_FLOAT32), -EINVAL);
    CHECK(tf_writer_num_documents(w) == 5);
    CHECK(count_files(d2, "shard-") >= 1);
    tf_writer_free(w);
    CHECK(count_files(d2, "shard-") == 0 && count_files(d2, ".shard") == 0);
    /* no manifest: refused with the documented message */
    CHECK_RC(tf_dataset_open(d2, NULL, &ds), -TF_EFORMAT);
    CHECK(strstr(tf_last_error(), "no manifest") != NULL);

    /* empty dataset: the writer publishes it, open refuses it */
    CHECK_OK(tf_writer_create(d2, &o, &w));
    CHECK_OK(tf_writer_finish(w));
    tf_writer_free(w);
    CHECK_RC(tf_dataset_open(d2, NULL, &ds), -TF_EFORMAT);

    /* a big document gets its own shard; uint8 and uint32 dtypes */
    char d3[300];
    path_in(d3, sizeof d3, "bigdoc");
    o.dtype = TF_UINT32;
    o.vocab_size = 1ull << 32;
    o.shard_tokens = 10;
    CHECK_OK(tf_writer_create(d3, &o, &w));
    uint32_t big[25];
    for (int i = 0; i < 25; i++) big[i] = 0xfffffff0u + (uint32_t)(i % 16);
    CHECK_OK(tf_writer_add_document(w, big, 3, TF_UINT32));
    CHECK_OK(tf_writer_add_document(w, big, 25, TF_UINT32));
    CHECK_OK(tf_writer_add_document(w, big, 4, TF_UINT32));
    CHECK_OK(tf_writer_finish(w));
    tf_writer_free(w);
    CHECK_OK(tf_dataset_open(d3, NULL, &ds));
    if (ds) {
        CHECK_OK(tf_dataset_get_info(ds, &info));
        CHECK(info.num_files == 3 && info.num_tokens == 32 && info.dtype == TF_UINT32);
        uint32_t got[25];
        CHECK_OK(tf_dataset_read(ds, 3, 25, got, TF_UINT32));
        CHECK(!memcmp(got, big, sizeof got));
    }
    tf_dataset_free(ds);
    o.dtype = TF_UINT8;
    o.vocab_size = 70000;
    CHECK_RC(tf_writer_create(d3, &o, &w), -EINVAL); /* vocab does not fit uint8 */
}

/* Build a one-shard dataset and return the shard's path and bytes. */
static uint8_t *make_shard(const char *name, int zstd, char *shard, size_t cap, size_t *len) {
    char dir[300];
    path_in(dir, sizeof dir, name);
    tf_writer_options o;
    tf_writer_options_init(&o);
    o.vocab_size = 500;
    o.compression = zstd ? TF_COMPRESS_ZSTD : TF_COMPRESS_NONE;
    o.block_tokens = 64;
    tf_writer *w = NULL;
    CHECK_OK(tf_writer_create(dir, &o, &w));
    uint16_t t[300];
    for (int i = 0; i < 300; i++) t[i] = (uint16_t)(i % 500);
    CHECK_OK(tf_writer_add_document(w, t, 300, TF_UINT16));
    CHECK_OK(tf_writer_add_document(w, t, 0, TF_UINT16));
    CHECK_OK(tf_writer_add_document(w, t, 100, TF_UINT16));
    CHECK_OK(tf_writer_finish(w));
    tf_writer_free(w);
    first_shard(dir, shard, cap);
    return t_read_file(shard, len);
}

/* Rewrite the header checksum after editing a field, so that the field's own
 * check is what fails. */
static void fix_header(uint8_t *b) { put64(b + 248, tf_hash64(b, 248, 0)); }

static int open_bytes(const char *path, const uint8_t *b, size_t n) {
    t_write_file(path, b, n);
    tf_dataset *ds = NULL;
    int rc = tf_dataset_open(path, NULL, &ds);
    tf_dataset_free(ds);
    return rc;
}

static void test_native_corrupt(void) {
    char shard[600], bad[300];
    size_t n = 0;
    uint8_t *orig = make_shard("corrupt", 0, shard, sizeof shard, &n);
    if (!orig) {
        t_failures++;
        return;
    }
    uint8_t *b = malloc(n);
    path_in(bad, sizeof bad, "bad.tfs");

    memcpy(b, orig, n);
    CHECK_OK(open_bytes(bad, b, n));
    /* truncations at many lengths: always -TF_EFORMAT, never a crash */
    size_t cuts[] = {0, 1, 7, 8, 100, 255, 256, 4096, 4097, n - 8, n - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) CHECK_RC(open_bytes(bad, b, cuts[i]), -TF_EFORMAT);
    /* appended garbage */
    uint8_t *longer = calloc(1, n + 16);
    memcpy(longer, orig, n);
    CHECK_RC(open_bytes(bad, longer, n + 16), -TF_EFORMAT);
    CHECK(strstr(tf_last_error(), "file_size") != NULL);
    free(longer);

    struct { size_t off; int width; uint64_t val; const char *field; } edits[] = {
        {8, 4, 2, "version"},           {12, 4, 128, "header_size"},   {16, 4, 4, "flags"},
        {20, 4, 9, "dtype"},            {24, 8, 0, "vocab_size"},      {32, 8, 301, "tokens_bytes"},
        {40, 8, 0, "num_docs"},         {48, 8, 4095, "tokens_offset"}, {48, 8, 1ull << 62, "tokens_offset"},
        {56, 8, UINT64_MAX - 10, "tokens_bytes"}, {64, 8, 12, "docs_offset"}, {64, 8, UINT64_MAX - 7, "docs_offset"},
        {72, 8, 16, "docs_bytes"},      {80, 8, 8, "blocks_offset"},   {96, 8, 64, "blocks_offset"},
        {128, 8, 1, "file_size"},       {200, 1, 1, "reserved"},
    };
    for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
        memcpy(b, orig, n);
        if (edits[i].width == 4) put32(b + edits[i].off, (uint32_t)edits[i].val);
        else if (edits[i].width == 8) put64(b + edits[i].off, edits[i].val);
        else b[edits[i].off] = (uint8_t)edits[i].val;
        fix_header(b);
        int rc = open_bytes(bad, b, n);
        CHECK_RC(rc, -TF_EFORMAT);
        if (!strstr(tf_last_error(), edits[i].field))
            fprintf(stderr, "edit %zu: message lacks \"%s\": %s\n", i, edits[i].field, tf_last_error()), t_failures++;
        if (!strstr(tf_last_error(), bad)) fprintf(stderr, "message lacks the path: %s\n", tf_last_error()), t_failures++;
    }
    /* bad magic reaches detection, which asks for dtype= */
    memcpy(b, orig, n);
    b[0] = 'X';
    CHECK_RC(open_bytes(bad, b, n), -TF_EFORMAT);
    /* header field change without fixing the checksum */
    memcpy(b, orig, n);
    b[33] ^= 1;
    CHECK_RC(open_bytes(bad, b, n), -TF_EFORMAT);
    CHECK(strstr(tf_last_error(), "header_checksum") != NULL);
    /* last document end != num_tokens */
    memcpy(b, orig, n);
    uint64_t docs_off;
    memcpy(&docs_off, b + 64, 8);
    put64(b + docs_off + 16, 399);
    CHECK_RC(open_bytes(bad, b, n), -TF_EFORMAT);

    /* verify: flipped payload byte -> checksum; non-monotonic index -> checksum
     * too (the index is covered by docs_checksum) */
    memcpy(b, orig, n);
    b[4096 + 10] ^= 0x01;
    t_write_file(bad, b, n);
    tf_dataset *ds = NULL;
    CHECK_OK(tf_dataset_open(bad, NULL, &ds));
    if (ds) CHECK_RC(tf_dataset_verify(ds, 1, NULL, NULL), -TF_ECHECKSUM);
    tf_dataset_free(ds);
    ds = NULL;

    /* token >= vocab with valid checksums: -TF_EVOCAB from verify */
    memcpy(b, orig, n);
    uint16_t big = 499 + 7;
    memcpy(b + 4096 + 20, &big, 2);
    uint64_t ntok;
    memcpy(&ntok, b + 32, 8);
    put64(b + 104, tf_hash64(b + 4096, ntok * 2, 0));
    uint32_t flags;
    memcpy(&flags, b + 16, 4);
    if (flags & 2) { /* the chunk checksum table covers the token too */
        uint64_t ck_off, cb;
        memcpy(&ck_off, b + 136, 8);
        memcpy(&cb, b + 152, 8);
        uint64_t nck = (ntok * 2 + cb - 1) / cb;
        for (uint64_t i = 0; i < nck; i++) {
            uint64_t len = ntok * 2 - i * cb < cb ? ntok * 2 - i * cb : cb;
            put64(b + ck_off + 8 * i, tf_hash64(b + 4096 + i * cb, len, 0));
        }
        put64(b + 160, tf_hash64(b + ck_off, nck * 8, 0));
    }
    fix_header(b);
    t_write_file(bad, b, n);
    CHECK_OK(tf_dataset_open(bad, NULL, &ds));
    if (ds) {
        CHECK_RC(tf_dataset_verify(ds, 1, NULL, NULL), -TF_EVOCAB);
        CHECK(strstr(tf_last_error(), "506") != NULL);
    }
    tf_dataset_free(ds);
    ds = NULL;
    free(orig);

    /* manifest corruption */
    char dir[300], man[400];
    path_in(dir, sizeof dir, "corrupt");
    snprintf(man, sizeof man, "%s/tokenfeed.manifest", dir);
    size_t mn = 0;
    uint8_t *m = t_read_file(man, &mn);
    if (m && mn > 20) {
        uint8_t *mm = malloc(mn + 1);
        memcpy(mm, m, mn);
        mm[mn - 3] = mm[mn - 3] == '0' ? '1' : '0'; /* end checksum */
        t_write_file(man, mm, mn);
        CHECK_RC(tf_dataset_open(dir, NULL, &ds), -TF_EFORMAT);
        t_write_file(man, m, mn - 1); /* no final newline */
        CHECK_RC(tf_dataset_open(dir, NULL, &ds), -TF_EFORMAT);
        t_write_file(man, m, mn / 2);
        CHECK_RC(tf_dataset_open(dir, NULL, &ds), -TF_EFORMAT);
        t_write_file(man, m, mn);
        CHECK_OK(tf_dataset_open(dir, NULL, &ds));
        tf_dataset_free(ds);
        ds = NULL;
        /* shard replaced by another one: header disagrees with manifest */
        char other[600];
        size_t on = 0;
        uint8_t *ob = make_shard("other", 0, other, sizeof other, &on);
        char sh[600];
        first_shard(dir, sh, sizeof sh);
        if (ob) {
            ob[4096] ^= 1; /* payload differs, header identical: caught by verify only */
            put64(ob + 104, tf_hash64(ob + 4096, 400 * 2, 0));
            fix_header(ob);
            t_write_file(sh, ob, on);
            CHECK_RC(tf_dataset_open(dir, NULL, &ds), -TF_EFORMAT);
            CHECK(strstr(tf_last_error(), "tokens_checksum") != NULL);
        }
        free(ob);
        free(mm);
        /* a manifest field corrupt at every byte position: never a crash */
        for (size_t i = 0; i < mn; i++) {
            memcpy(mm = malloc(mn), m, mn);
            mm[i] ^= 0x5a;
            t_write_file(man, mm, mn);
            if (tf_dataset_open(dir, NULL, &ds) == 0) tf_dataset_free(ds);
            ds = NULL;
            free(mm);
        }
    }
    free(m);
    free(b);

    /* zstd: corrupt frame -> error, not garbage */
    if (tf_features() & TF_FEATURE_ZSTD) {
        uint8_t *z = make_shard("zcorrupt", 1, shard, sizeof shard, &n);
        if (z) {
            CHECK_OK(open_bytes(bad, z, n));
            z[4096 + 20] ^= 0xff;
            t_write_file(bad, z, n);
            CHECK_OK(tf_dataset_open(bad, NULL, &ds));
            if (ds) {
                int rc = tf_dataset_verify(ds, 1, NULL, NULL);
                CHECK(rc == -TF_EFORMAT || rc == -TF_ECHECKSUM);
            }
            tf_dataset_free(ds);
            ds = NULL;
            /* block table entry pointing past the section */
            z[4096 + 20] ^= 0xff;
            uint64_t boff;
            memcpy(&boff, z + 80, 8);
            put64(z + boff + 16, 1ull << 40);
            t_write_file(bad, z, n);
            CHECK_OK(tf_dataset_open(bad, NULL, &ds)); /* O(1) open: entry checked on read */
            uint16_t out[10];
            if (ds) CHECK_RC(tf_dataset_read(ds, 70, 10, out, TF_UINT16), -TF_EFORMAT);
            tf_dataset_free(ds);
            free(z);
        }
    }
}

/* ------------------------------------------------------------------------ */
/* foreign formats, written by hand as their own writers do                  */
/* ------------------------------------------------------------------------ */

static int open_path(const char *path, const tf_open_options *o, tf_dataset **ds) {
    *ds = NULL;
    return tf_dataset_open(path, o, ds);
}

static void test_megatron(void) {
    /* 3 sequences of lengths 4, 0, 3, uint16 (code 8) */
    uint16_t toks[7] = {10, 11, 12, 13, 20, 21, 22};
    int32_t sizes[3] = {4, 0, 3};
    int64_t ptrs[3] = {0, 8, 8};
    int64_t docidx[4] = {0, 1, 2, 3};
    uint8_t idx[34 + 12 + 24 + 32];
    memcpy(idx, "MMIDIDX\0\0", 9);
    put64(idx + 9, 1);
    idx[17] = 8;
    put64(idx + 18, 3);
    put64(idx + 26, 4);
    memcpy(idx + 34, sizes, 12);
    memcpy(idx + 46, ptrs, 24);
    memcpy(idx + 70, docidx, 32);
    char pre[300], bin[320], idxp[320];
    path_in(pre, sizeof pre, "mg");
    snprintf(bin, sizeof bin, "%s.bin", pre);
    snprintf(idxp, sizeof idxp, "%s.idx", pre);
    t_write_file(bin, toks, sizeof toks);
    t_write_file(idxp, idx, sizeof idx);
    tf_dataset *ds;
    const char *names[3] = {pre, bin, idxp};
    for (int k = 0; k < 3; k++) {
        CHECK_OK(open_path(names[k], NULL, &ds));
        if (!ds) continue;
        tf_dataset_info info;
        CHECK_OK(tf_dataset_get_info(ds, &info));
        CHECK(info.format == TF_FORMAT_MEGATRON && info.num_tokens == 7 && info.num_documents == 3 && info.dtype == TF_UINT16);
        uint64_t s, n, d;
        CHECK_OK(tf_dataset_document(ds, 2, &s, &n));
        CHECK(s == 4 && n == 3);
        CHECK_OK(tf_dataset_document(ds, 1, &s, &n));
        CHECK(s == 4 && n == 0);
        CHECK_OK(tf_dataset_find_document(ds, 5, &d));
        CHECK(d == 2);
        CHECK_OK(tf_dataset_find_document(ds, 3, &d));
        CHECK(d == 0);
        int32_t out[3];
        CHECK_OK(tf_dataset_read(ds, 4, 3, out, TF_INT32));
        CHECK(out[0] == 20 && out[2] == 22);
        CHECK_OK(tf_dataset_verify(ds, 1, NULL, NULL));
        tf_dataset_free(ds);
    }
    tf_open_options o = {.format = TF_FORMAT_MEGATRON, .raw_dtype = TF_DTYPE_INVALID};
    CHECK_OK(open_path(pre, &o, &ds));
    tf_dataset_free(ds);
    /* multimodal variant: one mode byte per sequence appended */
    uint8_t idxm[sizeof idx + 3];
    memcpy(idxm, idx, sizeof idx);
    memset(idxm + sizeof idx, 0, 3);
    t_write_file(idxp, idxm, sizeof idxm);
    CHECK_OK(open_path(pre, NULL, &ds));
    tf_dataset_free(ds);

    uint8_t b[sizeof idx];
    struct { size_t off; int width; uint64_t val; } edits[] = {
        {9, 8, 2}, {17, 1, 9}, {17, 1, 0}, {18, 8, 4}, {18, 8, UINT64_MAX / 2}, {26, 8, 1ull << 61},
    };
    for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
        memcpy(b, idx, sizeof idx);
        if (edits[i].width == 8) put64(b + edits[i].off, edits[i].val);
        else b[edits[i].off] = (uint8_t)edits[i].val;
        t_write_file(idxp, b, sizeof b);
        CHECK_RC(open_path(pre, NULL, &ds), -TF_EFORMAT);
        CHECK(strstr(tf_last_error(), idxp) != NULL);
    }
    for (size_t cut = 9; cut < sizeof idx; cut += 5) {
        t_write_file(idxp, idx, cut);
        CHECK_RC(open_path(pre, NULL, &ds), -TF_EFORMAT);
    }
    /* last sequence past the end of the .bin */
    memcpy(b, idx, sizeof idx);
    put32(b + 34 + 8, 4);
    t_write_file(idxp, b, sizeof b);
    CHECK_RC(open_path(pre, NULL, &ds), -TF_EFORMAT);
    /* a middle pointer out of range: open is O(1), the lookup and verify catch it */
    memcpy(b, idx, sizeof idx);
    put64(b + 46 + 8, 1ull << 40);
    t_write_file(idxp, b, sizeof b);
    CHECK_OK(open_path(pre, NULL, &ds));
    if (ds) {
        uint64_t s, n;
        CHECK_RC(tf_dataset_document(ds, 1, &s, &n), -TF_EFORMAT);
        CHECK_RC(tf_dataset_verify(ds, 1, NULL, NULL), -TF_EFORMAT);
    }
    tf_dataset_free(ds);
    /* pointers going backwards: verify */
    memcpy(b, idx, sizeof idx);
    put64(b + 46 + 8, 0); /* the middle sequence restarts at 0 (the last still ends at the .bin end) */
    t_write_file(idxp, b, sizeof b);
    CHECK_OK(open_path(pre, NULL, &ds));
    if (ds) CHECK_RC(tf_dataset_verify(ds, 1, NULL, NULL), -TF_EFORMAT);
    tf_dataset_free(ds);
    /* odd .bin size */
    t_write_file(idxp, idx, sizeof idx);
    t_write_file(bin, toks, sizeof toks - 1);
    CHECK_RC(open_path(pre, NULL, &ds), -TF_EFORMAT);
}

static void test_llmc(void) {
    char p[300];
    path_in(p, sizeof p, "llmc.bin");
    uint8_t f[1024 + 5 * 4];
    memset(f, 0, sizeof f);
    put32(f, 20240520);
    put32(f + 4, 1);
    put32(f + 8, 5);
    uint16_t t16[5] = {1, 2, 3, 50256, 7};
    memcpy(f + 1024, t16, sizeof t16);
    t_write_file(p, f, 1024 + 10);
    tf_dataset *ds;
    CHECK_OK(open_path(p, NULL, &ds));
    if (ds) {
        tf_dataset_info info;
        CHECK_OK(tf_dataset_get_info(ds, &info));
        CHECK(info.format == TF_FORMAT_LLMC && info.num_tokens == 5 && info.num_documents == 1 && info.dtype == TF_UINT16 &&
              info.vocab_size == 0);
        uint32_t out[5];
        CHECK_OK(tf_dataset_read(ds, 0, 5, out, TF_UINT32));
        CHECK(out[3] == 50256);
    }
    tf_dataset_free(ds);
    /* llama-3 variant */
    put32(f, 20240801);
    put32(f + 4, 7);
    uint32_t t32[5] = {1, 128000, 3, 4, 5};
    memcpy(f + 1024, t32, sizeof t32);
    t_write_file(p, f, sizeof f);
    CHECK_OK(open_path(p, NULL, &ds));
    if (ds) {
        uint32_t out[5];
        CHECK_OK(tf_dataset_read(ds, 0, 5, out, TF_UINT32));
        CHECK(out[1] == 128000);
    }
    tf_dataset_free(ds);
    t_write_file(p, f, sizeof f - 1); /* truncated */
    CHECK_RC(open_path(p, NULL, &ds), -TF_EFORMAT);
    CHECK(strstr(tf_last_error(), "file size") != NULL);
    t_write_file(p, f, 1000);
    CHECK_RC(open_path(p, NULL, &ds), -TF_EFORMAT);
    put32(f + 4, 1); /* wrong version for the magic */
    t_write_file(p, f, sizeof f);
    CHECK_RC(open_path(p, NULL, &ds), -TF_EFORMAT);
    CHECK(strstr(tf_last_error(), "version") != NULL);
    put32(f + 4, 7);
    put32(f + 8, (uint32_t)-3);
    t_write_file(p, f, sizeof f);
    CHECK_RC(open_path(p, NULL, &ds), -TF_EFORMAT);
}

/* A NeMo AutoModel nanogpt shard (256 x int32 header: magic 278895051,
 * version 1, tokens, bytes per token), with and without its .bos.idx, read
 * through the public C API; and the format table's names. */
static void test_nemo_nanogpt(void) {
    char p[300], idx[300];
    path_in(p, sizeof p, "nemo.bin");
    path_in(idx, sizeof idx, "nemo.bos.idx");
    uint8_t f[1024 + 10 * 4] = {0};
    const uint32_t head[4] = {278895051, 1, 10, 4}; /* magic, version, tokens, bytes per token */
    for (uint32_t i = 0; i < 14; i++) put32(i < 4 ? f + 4 * i : f + 1024 + 4 * (i - 4), i < 4 ? head[i] : 100000 + i - 4);
    t_write_file(p, f, sizeof f);
    tf_dataset *ds = NULL;
    CHECK_OK(open_path(p, NULL, &ds)); /* detected, no sidecar: one document */
    if (ds) {
        tf_dataset_info info;
        CHECK_OK(tf_dataset_get_info(ds, &info));
        CHECK(info.format == TF_FORMAT_NEMO_NANOGPT && info.num_tokens == 10 && info.num_documents == 1 &&
              info.dtype == TF_UINT32);
        uint32_t out[10];
        CHECK_OK(tf_dataset_read(ds, 0, 10, out, TF_UINT32));
        CHECK(out[0] == 100000 && out[9] == 100009);
    }
    tf_dataset_free(ds);
    uint8_t bos[12];
    put32(bos, 0);
    put32(bos + 4, 4);
    put32(bos + 8, 7);
    t_write_file(idx, bos, sizeof bos);
    tf_open_options o = {.format = TF_FORMAT_NEMO_NANOGPT, .raw_dtype = TF_DTYPE_INVALID};
    CHECK_OK(open_path(p, &o, &ds)); /* documents start at the BOS positions */
    if (ds) {
        uint64_t s, n, want[3][2] = {{0, 4}, {4, 3}, {7, 3}};
        tf_dataset_info in;
        CHECK_OK(tf_dataset_get_info(ds, &in));
        CHECK(in.num_documents == 3);
        for (uint64_t j = 0; j < 3; j++) {
            CHECK_OK(tf_dataset_document(ds, j, &s, &n));
            CHECK(s == want[j][0] && n == want[j][1]);
        }
    }
    tf_dataset_free(ds);
    put32(bos + 8, 3); /* not increasing */
    t_write_file(idx, bos, sizeof bos);
    CHECK_RC(open_path(p, NULL, &ds), -TF_EFORMAT);
    CHECK(strstr(tf_last_error(), "nemo.bos.idx: BOS position 2") != NULL);
    unlink(idx);
    put32(f + 12, 3); /* no such item size */
    t_write_file(p, f, sizeof f);
    CHECK_RC(open_path(p, NULL, &ds), -TF_EFORMAT);
    CHECK(strstr(tf_last_error(), "bytes per token") != NULL);
    /* names from the table */
    tf_format fmt = TF_FORMAT_AUTO;
    CHECK_OK(tf_format_from_name("nanogpt", &fmt));
    CHECK(fmt == TF_FORMAT_NEMO_NANOGPT && strcmp(tf_format_name(fmt), "nemo-nanogpt") == 0);
    CHECK_OK(tf_format_from_name("llmc", &fmt));
    CHECK(fmt == TF_FORMAT_LLMC);
    CHECK_RC(tf_format_from_name("parquet", &fmt), -EINVAL);
    CHECK(strstr(tf_last_error(), "'nemo-nanogpt'") != NULL);
    size_t k = 0;
    while (tf_format_at(k) != TF_FORMAT_AUTO) k++;
    CHECK(k == 6);
}

static void test_npy(void) {
    char p[300];
    path_in(p, sizeof p, "a.npy");
    const char *descrs[] = {"|u1", "<u2", "<u4", "<u8", "|i1", "<i2", "<i4", "<i8"};
    tf_dtype want[] = {TF_UINT8, TF_UINT16, TF_UINT32, TF_UINT64, TF_INT8, TF_INT16, TF_INT32, TF_INT64};
    for (int v = 1; v <= 3; v++) {
        for (int k = 0; k < 8; k++) {
            uint8_t f[256 + 64];
            memset(f, 0, sizeof f);
            size_t pre = v == 1 ? 10 : 12;
            char hdr[200];
            int hn = snprintf(hdr, sizeof hdr, "{'descr': '%s', 'fortran_order': False, 'shape': (6,), }", descrs[k]);
            size_t total = pre + (size_t)hn + 1;
            size_t padded = (total + 63) / 64 * 64;
            memset(hdr + hn, ' ', padded - total);
            hdr[padded - pre - 1] = '\n';
            memcpy(f, "\x93NUMPY", 6);
            f[6] = (uint8_t)v;
            f[7] = 0;
            if (v == 1) {
                f[8] = (uint8_t)(padded - pre);
                f[9] = 0;
            } else {
                put32(f + 8, (uint32_t)(padded - pre));
            }
            memcpy(f + pre, hdr, padded - pre);
            size_t isz = tf_dtype_size(want[k]);
            for (int i = 0; i < 6; i++) {
                uint64_t val = (uint64_t)(i * 3 + 1);
                memcpy(f + padded + i * isz, &val, isz);
            }
            t_write_file(p, f, padded + 6 * isz);
            tf_dataset *ds;
            CHECK_OK(open_path(p, NULL, &ds));
            if (ds) {
                tf_dataset_info info;
                CHECK_OK(tf_dataset_get_info(ds, &info));
                CHECK(info.format == TF_FORMAT_NPY && info.num_tokens == 6 && info.dtype == want[k]);
                int64_t out[6];
                CHECK_OK(tf_dataset_read(ds, 0, 6, out, TF_INT64));
                CHECK(out[5] == 16);
            }
            tf_dataset_free(ds);
            /* one byte short */
            CHECK_RC(open_bytes(p, f, padded + 6 * isz - 1), -TF_EFORMAT);
        }
    }
    /* malformed headers */
    const char *bad[] = {
        "{'descr': '>u2', 'fortran_order': False, 'shape': (6,), }",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (6,), }",
        "{'descr': '<u2', 'fortran_order': False, 'shape': (2, 3), }",
        "{'descr': '<u2', 'fortran_order': False, 'shape': (), }",
        "{'descr': '<u2', 'fortran_order': False, }",
        "{'descr': '<u2', 'fortran_order': False, 'shape': (6,), 'x': 1}",
        "{'descr': '<u2', 'fortran_order': Fals, 'shape': (6,), }",
        "{'descr': '<u2', 'fortran_order': False, 'shape': (99999999999999999999999,), }",
        "{'descr': [('a', '<u2')], 'fortran_order': False, 'shape': (6,), }",
        "{'descr': '<u2', 'fortran_order': False, 'shape': (6,) ",
        "",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint8_t f[200];
        memset(f, 0, sizeof f);
        memcpy(f, "\x93NUMPY\x01\x00", 8);
        size_t hn = strlen(bad[i]);
        f[8] = (uint8_t)hn;
        memcpy(f + 10, bad[i], hn);
        CHECK_RC(open_bytes(p, f, 10 + hn + 12), -TF_EFORMAT);
        /* header_len larger than the file */
        f[8] = 0xff;
        CHECK_RC(open_bytes(p, f, 10 + hn), -TF_EFORMAT);
    }
    CHECK_RC(open_bytes(p, (const uint8_t *)"\x93NUMPY\x04\x00\x00\x00", 10), -TF_EFORMAT);
}

static void test_raw(void) {
    char p[300], ip[320];
    path_in(p, sizeof p, "x.ds");
    snprintf(ip, sizeof ip, "%s.index", p);
    uint16_t toks[10] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
    t_write_file(p, toks, sizeof toks);
    tf_dataset *ds;
    CHECK_RC(open_path(p, NULL, &ds), -TF_EFORMAT); /* no dtype */
    CHECK(strstr(tf_last_error(), "dtype=") != NULL);
    tf_open_options o = {.format = TF_FORMAT_AUTO, .raw_dtype = TF_UINT16};
    CHECK_OK(open_path(p, &o, &ds));
    if (ds) {
        tf_dataset_info info;
        CHECK_OK(tf_dataset_get_info(ds, &info));
        CHECK(info.format == TF_FORMAT_RAW && info.num_tokens == 10 && info.num_documents == 1);
    }
    tf_dataset_free(ds);
    o.raw_dtype = TF_UINT32;
    t_write_file(p, toks, 18); /* 18 bytes: not a multiple of 4 */
    CHECK_RC(open_path(p, &o, &ds), -TF_EFORMAT);
    o.raw_dtype = TF_UINT16;
    t_write_file(p, toks, sizeof toks);
    /* datatrove index: uint64 cumulative ends in tokens */
    uint64_t ends[4] = {3, 3, 7, 10};
    t_write_file(ip, ends, sizeof ends);
    CHECK_OK(open_path(p, &o, &ds));
    if (ds) {
        tf_dataset_info info;
        CHECK_OK(tf_dataset_get_info(ds, &info));
        CHECK(info.num_documents == 4);
        uint64_t s, n;
        CHECK_OK(tf_dataset_document(ds, 2, &s, &n));
        CHECK(s == 3 && n == 4);
        CHECK_OK(tf_dataset_verify(ds, 1, NULL, NULL));
    }
    tf_dataset_free(ds);
    uint64_t bad_last[2] = {3, 11};
    t_write_file(ip, bad_last, sizeof bad_last);
    CHECK_RC(open_path(p, &o, &ds), -TF_EFORMAT);
    CHECK(strstr(tf_last_error(), ip) != NULL);
    t_write_file(ip, ends, 12);
    CHECK_RC(open_path(p, &o, &ds), -TF_EFORMAT);
    t_write_file(ip, ends, 0);
    CHECK_RC(open_path(p, &o, &ds), -TF_EFORMAT);
    uint64_t nonmono[3] = {5, 3, 10};
    t_write_file(ip, nonmono, sizeof nonmono);
    CHECK_OK(open_path(p, &o, &ds)); /* O(1) open; verify walks the index */
    if (ds) CHECK_RC(tf_dataset_verify(ds, 1, NULL, NULL), -TF_EFORMAT);
    tf_dataset_free(ds);
    unlink(ip);
    /* vocab: raw files have none, so verify checks no ids; an empty file alone
     * is an empty dataset */
    t_write_file(p, toks, 0);
    CHECK_RC(open_path(p, &o, &ds), -TF_EFORMAT);
}

/* Random byte mutations of valid files: open, read everything and verify must
 * return an error or succeed, never crash or read out of bounds (run this
 * under ASan: make -C csrc SANITIZE=address,undefined test). */
static uint64_t rng_state = 0x1234567;
static uint64_t rng(void) {
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return rng_state >> 33;
}

static void exercise(const char *path, const tf_open_options *o) {
    tf_dataset *ds = NULL;
    if (tf_dataset_open(path, o, &ds) != 0) return;
    tf_dataset_info info;
    tf_dataset_get_info(ds, &info);
    if (info.num_tokens < (1u << 20)) {
        int64_t *buf = malloc(info.num_tokens * 8);
        if (buf) tf_dataset_read(ds, 0, info.num_tokens, buf, TF_INT64);
        free(buf);
    }
    for (uint64_t d = 0; d < info.num_documents && d < 64; d++) {
        uint64_t s, n;
        tf_dataset_document(ds, d, &s, &n);
    }
    uint64_t doc;
    tf_dataset_find_document(ds, info.num_tokens - 1, &doc);
    if (rng() % 4 == 0) tf_dataset_verify(ds, 1, NULL, NULL); /* each verify polls at 20 ms */
    tf_dataset_free(ds);
}

static void mutate_file(const char *path, const uint8_t *orig, size_t n, int iters, int fixhdr, const tf_open_options *o) {
    uint8_t *b = malloc(n);
    for (int it = 0; it < iters; it++) {
        memcpy(b, orig, n);
        int k = 1 + (int)(rng() % 4);
        for (int j = 0; j < k; j++) {
            /* bias toward headers, where the offsets live */
            size_t at = rng() % 2 ? rng() % (n < 300 ? n : 300) : rng() % n;
            b[at] = rng() % 3 ? (uint8_t)rng() : (uint8_t)(b[at] ^ (1u << (rng() % 8)));
        }
        if (fixhdr && n >= 256) fix_header(b);
        size_t len = rng() % 8 ? n : rng() % (n + 1);
        t_write_file(path, b, len);
        exercise(path, o);
    }
    free(b);
}

static void test_fuzz(void) {
    char shard[600], p[300];
    size_t n = 0;
    path_in(p, sizeof p, "fuzz.tfs");
    for (int z = 0; z < 2; z++) {
        if (z && !(tf_features() & TF_FEATURE_ZSTD)) break;
        uint8_t *orig = make_shard(z ? "fuzzz" : "fuzzp", z, shard, sizeof shard, &n);
        if (!orig) continue;
        mutate_file(p, orig, n, 400, 1, NULL);
        mutate_file(p, orig, n, 100, 0, NULL);
        free(orig);
    }
    /* llm.c */
    uint8_t f[1024 + 40];
    memset(f, 0, sizeof f);
    put32(f, 20240520);
    put32(f + 4, 1);
    put32(f + 8, 20);
    path_in(p, sizeof p, "fuzz.bin");
    mutate_file(p, f, sizeof f, 200, 0, NULL);
    /* npy */
    const char *hdr = "{'descr': '<u2', 'fortran_order': False, 'shape': (10,), }          \n";
    size_t hn = strlen(hdr);
    uint8_t np[200];
    memcpy(np, "\x93NUMPY\x01\x00", 8);
    np[8] = (uint8_t)hn;
    np[9] = 0;
    memcpy(np + 10, hdr, hn);
    memset(np + 10 + hn, 1, 20);
    path_in(p, sizeof p, "fuzz.npy");
    mutate_file(p, np, 10 + hn + 20, 400, 0, NULL);
    /* datatrove index */
    char ip[320];
    path_in(p, sizeof p, "fuzz.ds");
    snprintf(ip, sizeof ip, "%s.index", p);
    uint16_t toks[10] = {0};
    t_write_file(p, toks, sizeof toks);
    uint64_t ends[3] = {2, 5, 10};
    tf_open_options o = {.format = TF_FORMAT_AUTO, .raw_dtype = TF_UINT16};
    mutate_file(ip, (const uint8_t *)ends, sizeof ends, 200, 0, &o);
    unlink(ip);
}

/* Headerless files split at an eos id: no index (rows only), the document
 * index tf_doc_index_build writes, and a stale index refused. */
static void test_eos_index(void) {
    char p[300], ip[320], out[512];
    path_in(p, sizeof p, "eos.bin");
    snprintf(ip, sizeof ip, "%s.tfdocs", p);
    uint16_t toks[10] = {5, 6, 0, 7, 0, 0, 8, 9, 0, 4}; /* docs: 3, 2, 1, 3, then a tail of 1 */
    t_write_file(p, toks, sizeof toks);
    tf_open_options o = {.format = TF_FORMAT_RAW, .raw_dtype = TF_UINT16, .has_eos_id = 1, .eos_id = 0};
    tf_dataset *ds;
    tf_dataset_info a, b;
    CHECK_OK(open_path(p, &o, &ds));
    if (ds) CHECK_OK(tf_dataset_get_info(ds, &a));
    CHECK(ds && a.num_documents == 1); /* documents known only inside rows */
    tf_dataset_free(ds);
    CHECK_OK(tf_doc_index_build(p, &o, NULL, 0, out, sizeof out));
    CHECK(strcmp(out, ip) == 0);
    CHECK_OK(open_path(p, &o, &ds));
    if (ds) {
        CHECK_OK(tf_dataset_get_info(ds, &b));
        CHECK(b.num_documents == 5 && b.fingerprint == a.fingerprint);
        uint64_t s, n;
        CHECK_OK(tf_dataset_document(ds, 3, &s, &n));
        CHECK(s == 6 && n == 3);
        CHECK_OK(tf_dataset_document(ds, 4, &s, &n));
        CHECK(s == 9 && n == 1);
    }
    tf_dataset_free(ds);
    uint64_t bad[2] = {3, 11}; /* metadata past the file's end */
    CHECK_RC(tf_doc_index_build(p, &o, bad, 2, out, sizeof out), -EINVAL);
    o.eos_id = 9; /* another eos id: another fingerprint, and this index is refused */
    CHECK_RC(open_path(p, &o, &ds), -TF_EFORMAT);
    CHECK(strstr(tf_last_error(), "eos id 0") != NULL);
    o.eos_id = 0;
    t_write_file(p, toks, 8); /* the data changed: the index is stale */
    CHECK_RC(open_path(p, &o, &ds), -TF_EFORMAT);
    CHECK(strstr(tf_last_error(), "stale") != NULL && strstr(tf_last_error(), "tokenfeed index") != NULL);
    unlink(ip);
    unlink(p);
}

/* A gzip file of one member holding data in stored (uncompressed) deflate
 * blocks, written without zlib: what the metadata reader (which loads zlib)
 * is given here. */
static size_t gzip_stored(uint8_t *out, const char *text, size_t n) {
    uint32_t crc = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        crc ^= (uint8_t)text[i];
        for (int k = 0; k < 8; k++) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1)));
    }
    crc ^= 0xFFFFFFFFu;
    static const uint8_t hdr[10] = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3};
    size_t o = 0;
    memcpy(out, hdr, 10);
    o = 10;
    size_t i = 0;
    do {
        size_t k = n - i > 65535 ? 65535 : n - i;
        out[o++] = i + k == n ? 1 : 0; /* BFINAL, BTYPE 00 */
        out[o++] = (uint8_t)k;
        out[o++] = (uint8_t)(k >> 8);
        out[o++] = (uint8_t)~k;
        out[o++] = (uint8_t)(~k >> 8);
        memcpy(out + o, text + i, k);
        o += k;
        i += k;
    } while (i < n);
    for (int b = 0; b < 4; b++) out[o++] = (uint8_t)(crc >> (8 * b));
    for (int b = 0; b < 4; b++) out[o++] = (uint8_t)(n >> (8 * b));
    return o;
}

/* OLMo's document metadata (x.csv.gz beside x.npy): a C program building
 * the document index gets the documents of the metadata (several gzip
 * members, CRLF rows, extra fields), not those of the eos scan; damaged or
 * hostile metadata is refused naming the file, line and field; and an index
 * built from it is refused once the metadata changes or goes. */
static void test_olmo_metadata(void) {
    char p[300], mp[300], ip[320], out[512];
    path_in(p, sizeof p, "olmo.npy");
    path_in(mp, sizeof mp, "olmo.csv.gz");
    snprintf(ip, sizeof ip, "%s.tfdocs", p);
    uint32_t toks[20];
    for (int i = 0; i < 20; i++) toks[i] = (uint32_t)i % 4 == 3 ? 0 : 7; /* eos every 4 tokens */
    t_write_file(p, toks, sizeof toks);
    tf_open_options o = {.format = TF_FORMAT_RAW, .raw_dtype = TF_UINT32, .has_eos_id = 1, .eos_id = 0};
    uint8_t gz[4096];
    const char *m1 = "0,6,id-a,s3://b/x.json.gz,1\r\n";
    size_t n1 = gzip_stored(gz, m1, strlen(m1));
    const char *m2b = "7,9,\"q,\"\"x\"\"\ny\",2\n10,15\n"; /* a gap (6..7) joins the next document */
    size_t n2 = gzip_stored(gz + n1, m2b, strlen(m2b));
    t_write_file(mp, gz, n1 + n2);
    CHECK_OK(tf_doc_index_build(p, &o, NULL, 0, out, sizeof out));
    CHECK(strcmp(out, ip) == 0);
    tf_dataset *ds = NULL;
    tf_dataset_info info;
    CHECK_OK(open_path(p, &o, &ds));
    if (ds) {
        CHECK_OK(tf_dataset_get_info(ds, &info));
        CHECK(info.num_documents == 4); /* 6, 3, 6, then the 5 tokens after the last row */
        static const uint64_t want_s[4] = {0, 6, 9, 15}, want_n[4] = {6, 3, 6, 5};
        for (uint64_t d = 0; d < 4 && d < info.num_documents; d++) {
            uint64_t s, n;
            CHECK_OK(tf_dataset_document(ds, d, &s, &n));
            CHECK(s == want_s[d] && n == want_n[d]);
        }
    }
    tf_dataset_free(ds);
    ds = NULL;
    /* the metadata rewritten: the index is stale */
    const char *m3 = "0,5\n";
    size_t n3 = gzip_stored(gz, m3, strlen(m3));
    t_write_file(mp, gz, n3);
    struct timespec ts[2] = {{0, UTIME_OMIT}, {12345, 0}};
    utimensat(AT_FDCWD, mp, ts, 0);
    CHECK_RC(open_path(p, &o, &ds), -TF_EFORMAT);
    CHECK(strstr(tf_last_error(), "olmo.csv.gz changed since the index was built") != NULL &&
          strstr(tf_last_error(), "tokenfeed index") != NULL);
    tf_dataset_free(ds);
    ds = NULL;
    unlink(mp);
    CHECK_RC(open_path(p, &o, &ds), -TF_EFORMAT);
    CHECK(strstr(tf_last_error(), "which is gone") != NULL);
    tf_dataset_free(ds);
    ds = NULL;
    /* hostile rows: refused with the line and field, nothing written */
    unlink(ip);
    static const struct {
        const char *text, *want;
    } bad[] = {
        {"0,5\n3,9\n", "line 2, field start: start 3 overlaps"},
        {"0,5\n5,21\n", "line 2, field end: end 21 is past the 20 tokens"},
        {"0,18446744073709551616\n", "line 1, field end: the number overflows"},
        {"start,end\n", "line 1, field start: 's' where a digit was expected (OLMo's metadata has no header line)"},
        {"0,5\r6,9\n", "carriage return not followed"},
        {"", "no document rows"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        size_t nb = gzip_stored(gz, bad[k].text, strlen(bad[k].text));
        t_write_file(mp, gz, nb);
        CHECK_RC(tf_doc_index_build(p, &o, NULL, 0, out, sizeof out), -TF_EFORMAT);
        CHECK(strstr(tf_last_error(), bad[k].want) != NULL && strstr(tf_last_error(), mp) != NULL);
        CHECK(access(ip, F_OK) != 0);
    }
    /* a gzip member cut short */
    size_t nt = gzip_stored(gz, "0,5\n", 4);
    t_write_file(mp, gz, nt - 3);
    CHECK_RC(tf_doc_index_build(p, &o, NULL, 0, out, sizeof out), -TF_EFORMAT);
    CHECK(strstr(tf_last_error(), "truncated") != NULL);
    /* ends given by the caller win over the metadata (an eos-style index) */
    uint64_t given[2] = {10, 20};
    CHECK_OK(tf_doc_index_build(p, &o, given, 2, out, sizeof out));
    unlink(mp);
    CHECK_OK(open_path(p, &o, &ds));
    if (ds) CHECK_OK(tf_dataset_get_info(ds, &info));
    CHECK(ds && info.num_documents == 2);
    tf_dataset_free(ds);
    unlink(ip);
    unlink(p);
}

/* A dataset's own catalog (tokenfeed.catalog): the writer writes it from the
 * headers it wrote; tf_dataset_write_dataset_catalog writes the same bytes
 * from the dataset as opened, and refuses a dataset that is not the one in
 * the directory. */
static void test_dataset_catalog(void) {
    char dir[300], other[300], slash[310], cat[330], got[400], refused[400];
    path_in(dir, sizeof dir, "catalogued");
    path_in(other, sizeof other, "catalogued_other");
    tf_writer_options o;
    tf_writer_options_init(&o);
    o.vocab_size = 1000;
    o.shard_tokens = 3000;
    uint64_t total = 0;
    write_docs(dir, &o, 60, &total);
    o.shard_tokens = 5000;
    write_docs(other, &o, 40, &total);
    snprintf(cat, sizeof cat, "%s/tokenfeed.catalog", dir);
    size_t wlen = 0, blen = 0;
    uint8_t *written = t_read_file(cat, &wlen);
    CHECK(written && wlen > 0);
    tf_dataset *ds = NULL, *ods = NULL;
    CHECK_OK(tf_dataset_open(dir, NULL, &ds));
    CHECK_OK(tf_dataset_open(other, NULL, &ods));
    if (!ds || !ods || !written) goto out;
    CHECK(unlink(cat) == 0);
    snprintf(slash, sizeof slash, "%s/", dir);
    CHECK_OK(tf_dataset_write_dataset_catalog(ds, slash, got, sizeof got));
    CHECK(strcmp(got, cat) == 0);
    uint8_t *built = t_read_file(cat, &blen);
    CHECK(built && blen == wlen && memcmp(built, written, wlen) == 0);
    free(built);
    CHECK_OK(tf_dataset_write_dataset_catalog(ds, dir, NULL, 0));
    /* another dataset's shards are not this directory's */
    CHECK(unlink(cat) == 0);
    snprintf(refused, sizeof refused, "x");
    CHECK_RC(tf_dataset_write_dataset_catalog(ods, dir, refused, sizeof refused), -EINVAL);
    CHECK(refused[0] == '\0');
    CHECK(strstr(tf_last_error(), "not the dataset opened from this directory") != NULL);
    CHECK(access(cat, F_OK) != 0);
    CHECK_RC(tf_dataset_write_dataset_catalog(NULL, dir, NULL, 0), -EINVAL);
    CHECK_RC(tf_dataset_write_dataset_catalog(ds, NULL, NULL, 0), -EINVAL);
out:
    tf_dataset_free(ds);
    tf_dataset_free(ods);
    free(written);
}

/* A C program opens a directory of llm.c shards and a glob of them with
 * tf_dataset_open (the core lists them; companions found in the listing), in
 * sorted name order; a glob over directories; and the errors of each. */
static void write_llmc_shard(const char *path, uint16_t first, uint32_t n) {
    uint8_t hdr[1024] = {0};
    put32(hdr, 20240520u);
    put32(hdr + 4, 1);
    put32(hdr + 8, n);
    uint16_t toks[64];
    for (uint32_t t = 0; t < n && t < 64; t++) toks[t] = (uint16_t)(first + t);
    FILE *fp = fopen(path, "wb");
    CHECK(fp != NULL);
    if (!fp) return;
    CHECK(fwrite(hdr, 1, sizeof hdr, fp) == sizeof hdr);
    CHECK(fwrite(toks, 2, n, fp) == n);
    fclose(fp);
}

/* The info of the dataset spec names (zeroed, and counted as a failed check,
 * when it does not open). */
static tf_dataset_info spec_info(const char *spec) {
    tf_dataset_info info;
    memset(&info, 0, sizeof info);
    tf_dataset *ds = NULL;
    CHECK_OK(tf_dataset_open(spec, NULL, &ds));
    if (ds) CHECK_OK(tf_dataset_get_info(ds, &info));
    tf_dataset_free(ds);
    return info;
}

static void test_path_specs(void) {
    char d[512], p[600], spec[600];
    path_in(d, sizeof d, "llmc_set");
    CHECK(mkdir(d, 0755) == 0);
    for (int i = 4; i >= 0; i--) { /* written out of order: opened in name order */
        snprintf(p, sizeof p, "%s/shard_%02d.bin", d, i);
        write_llmc_shard(p, (uint16_t)(100 * i), 10);
    }
    snprintf(p, sizeof p, "%s/README.md", d); /* not data in a directory */
    t_write_file(p, "# a dataset\n", 12);
    uint64_t fp_dir = 0;
    tf_dataset *ds = NULL;
    snprintf(spec, sizeof spec, "%s/", d);
    CHECK_OK(tf_dataset_open(spec, NULL, &ds));
    if (ds) {
        tf_dataset_info info;
        tf_dataset_get_info(ds, &info);
        CHECK(info.num_files == 5 && info.num_tokens == 50 && info.format == TF_FORMAT_LLMC);
        uint16_t t[2];
        CHECK_OK(tf_dataset_read(ds, 20, 2, t, TF_UINT16));
        CHECK(t[0] == 200 && t[1] == 201); /* shard_02 third: name order */
        fp_dir = info.fingerprint;
        tf_dataset_free(ds);
        ds = NULL;
    }
    snprintf(spec, sizeof spec, "%s/shard_0[0-3].bin", d);
    tf_dataset_info some = spec_info(spec);
    CHECK(some.num_files == 4 && some.num_tokens == 40);
    snprintf(spec, sizeof spec, "%s/*.bin", d);
    CHECK(spec_info(spec).fingerprint == fp_dir); /* the same files as the directory */
    /* a glob over directories: each listed once */
    path_in(spec, sizeof spec, "llmc_s*/shard_0?.bin");
    CHECK(spec_info(spec).num_files == 5);
    /* a glob over more directories than the listing first has room for */
    char many[512];
    path_in(many, sizeof many, "llmc_many");
    CHECK(mkdir(many, 0755) == 0);
    for (int k = 11; k >= 0; k--) {
        snprintf(p, sizeof p, "%s/d%02d", many, k);
        CHECK(mkdir(p, 0755) == 0);
        snprintf(p, sizeof p, "%s/d%02d/shard_0.bin", many, k);
        write_llmc_shard(p, (uint16_t)(10 * k), 3);
    }
    path_in(spec, sizeof spec, "llmc_many/d*/shard_*.bin");
    CHECK_OK(tf_dataset_open(spec, NULL, &ds));
    if (ds) {
        tf_dataset_info info;
        tf_dataset_get_info(ds, &info);
        CHECK(info.num_files == 12 && info.num_tokens == 36);
        uint16_t t[1];
        CHECK_OK(tf_dataset_read(ds, 3 * 11, 1, t, TF_UINT16));
        CHECK(t[0] == 110); /* d11 last: name order across directories */
        tf_dataset_free(ds);
        ds = NULL;
    }
    path_in(spec, sizeof spec, "llmc_set/nothing_*.bin");
    CHECK_RC(tf_dataset_open(spec, NULL, &ds), -ENOENT);
    CHECK(strstr(tf_last_error(), "no file or directory matches") != NULL);
    /* a directory of two formats: says what it holds */
    snprintf(p, sizeof p, "%s/extra.npy", d);
    t_write_file(p, "\x93NUMPY", 6);
    CHECK_RC(tf_dataset_open(d, NULL, &ds), -TF_EFORMAT);
    CHECK(strstr(tf_last_error(), "5 .bin files (shard_00.bin, shard_01.bin, shard_02.bin, ... (2 more))") != NULL);
    CHECK(ds == NULL);
}

/* ---- what a path names: the one resolution, with a fake probe ------------ */

typedef struct fake_name {
    const char *name;
    int kind;
    const char *head; /* first bytes (NULL: unknown yet, as for an object not fetched) */
} fake_name;

typedef struct fake_probe {
    const fake_name *v;
    size_t n;
    int slash_dirs;
    int asked; /* kind() calls */
} fake_probe;

static const fake_name *fake_find(fake_probe *fp, const char *name) {
    for (size_t i = 0; i < fp->n; i++)
        if (!strcmp(fp->v[i].name, name)) return &fp->v[i];
    return NULL;
}

static int fake_kind(void *ctx, const char *name) {
    fake_probe *fp = ctx;
    fp->asked++;
    if (fp->slash_dirs && name[0] && name[strlen(name) - 1] == '/') return TF__NAME_DIR;
    char bare[256];
    snprintf(bare, sizeof bare, "%s", name);
    while (strlen(bare) > 1 && bare[strlen(bare) - 1] == '/') bare[strlen(bare) - 1] = '\0'; /* (as stat does) */
    const fake_name *e = fake_find(fp, bare);
    return e ? e->kind : TF__NAME_NONE;
}

static long fake_head(void *ctx, const char *name, uint8_t *buf, size_t cap) {
    const fake_name *e = fake_find(ctx, name);
    if (!e || !e->head) return -1;
    size_t n = strlen(e->head) + 2 < cap ? strlen(e->head) + 2 : cap; /* (with the magic's two NULs) */
    memset(buf, 0, n);
    memcpy(buf, e->head, strlen(e->head) < n ? strlen(e->head) : n);
    return (long)n;
}

/* Resolve path with the names v; want_kind 0: an error rc whose message holds msg. */
static void resolve_case(const fake_name *v, size_t n, int remote, const char *path, tf_format fmt, int want_rc,
                         int want_kind, const char *want_path, const char *msg) {
    fake_probe fp = {v, n, remote, 0};
    tf__probe pr = {&fp, fake_kind, remote ? NULL : fake_head, remote ? "object" : "file", remote};
    tf__target t;
    int rc = tf__resolve_target(path, fmt, &pr, &t);
    if (rc != want_rc) fprintf(stderr, "resolve %s (%s): rc %d, expected %d: %s\n", path, remote ? "remote" : "local", rc,
                               want_rc, tf_last_error());
    CHECK(rc == want_rc);
    if (rc == 0) {
        if ((int)t.kind != want_kind || strcmp(t.path, want_path) != 0)
            fprintf(stderr, "resolve %s: kind %d path %s, expected %d %s\n", path, (int)t.kind, t.path, want_kind, want_path);
        CHECK((int)t.kind == want_kind);
        CHECK(!strcmp(t.path, want_path));
        free(t.path);
    } else if (msg) {
        if (!strstr(tf_last_error(), msg)) fprintf(stderr, "resolve %s: '%s' lacks '%s'\n", path, tf_last_error(), msg);
        CHECK(strstr(tf_last_error(), msg) != NULL);
    }
}

static int count_name(void *ctx, const char *name, int manifest) {
    (void)name;
    int *c = ctx;
    c[0]++;
    c[1] += manifest;
    return 0;
}

static void test_resolve(void) {
    enum { F = TF__NAME_FILE, D = TF__NAME_DIR, O = TF__NAME_OTHER };
    const char *mm = "MMIDIDX"; /* + "\0\0" from fake_head */
    const fake_name v[] = {
        {"ds", D, NULL}, {"ds/" TF_MANIFEST_NAME, F, NULL}, {"ds2/" TF_MANIFEST_NAME, F, NULL},
        {"empty", D, NULL}, {"x.idx", D, NULL},
        {"m.bin", F, "tokens"}, {"m.idx", F, mm},
        {"both", F, "tokens"}, {"both.bin", F, "tokens"}, {"both.idx", F, mm},
        {"bad.bin", F, "tokens"}, {"bad.idx", F, "NOTMEGATRON"},
        {"a.b.c.bin", F, "tokens"}, {"a.b.c.idx", F, mm},
        {"y.bin", F, "tokens"}, {"y.bin.idx", F, mm},
        {"lone.idx", F, mm}, {"fifo", O, NULL}, {"plain.npy", F, "\x93NUMPY"},
    };
    size_t n = sizeof v / sizeof v[0];
    for (int remote = 0; remote < 2; remote++) {
        const char *noun = remote ? "no such object" : "no such file";
        /* a dataset directory: by its name, a trailing '/', or its manifest */
        if (!remote) resolve_case(v, n, 0, "ds", TF_FORMAT_AUTO, 0, TF__TARGET_DATASET, "ds", NULL);
        resolve_case(v, n, remote, "ds/", TF_FORMAT_AUTO, 0, TF__TARGET_DATASET, "ds", NULL);
        resolve_case(v, n, remote, "ds2", TF_FORMAT_AUTO, 0, TF__TARGET_DATASET, "ds2", NULL);
        resolve_case(v, n, remote, "ds2", TF_FORMAT_NATIVE, 0, TF__TARGET_DATASET, "ds2", NULL);
        resolve_case(v, n, remote, "empty/", TF_FORMAT_AUTO, -TF_EFORMAT, 0, NULL, "no manifest");
        /* a directory named like a file is a directory: no manifest in it */
        if (!remote) resolve_case(v, n, 0, "x.idx", TF_FORMAT_AUTO, -TF_EFORMAT, 0, NULL, "no manifest");
        /* a pair: by its prefix or either name; several dots */
        resolve_case(v, n, remote, "m", TF_FORMAT_AUTO, 0, TF__TARGET_PAIR, "m", NULL);
        resolve_case(v, n, remote, "m.bin", TF_FORMAT_AUTO, 0, TF__TARGET_PAIR, "m", NULL);
        resolve_case(v, n, remote, "m.idx", TF_FORMAT_MEGATRON, 0, TF__TARGET_PAIR, "m", NULL);
        resolve_case(v, n, remote, "a.b.c", TF_FORMAT_AUTO, 0, TF__TARGET_PAIR, "a.b.c", NULL);
        resolve_case(v, n, remote, "a.b.c.idx", TF_FORMAT_AUTO, 0, TF__TARGET_PAIR, "a.b.c", NULL);
        /* a prefix that is also a file of its own: that file, unless the open names the pair's format */
        resolve_case(v, n, remote, "both", TF_FORMAT_AUTO, 0, TF__TARGET_FILE, "both", NULL);
        resolve_case(v, n, remote, "both", TF_FORMAT_MEGATRON, 0, TF__TARGET_PAIR, "both", NULL);
        /* ".bin.idx" is no pair of "y.bin"; a companion without its data file is a file */
        resolve_case(v, n, remote, "y.bin", TF_FORMAT_AUTO, 0, TF__TARGET_FILE, "y.bin", NULL);
        resolve_case(v, n, remote, "y.bin.idx", TF_FORMAT_AUTO, 0, TF__TARGET_FILE, "y.bin.idx", NULL);
        resolve_case(v, n, remote, "lone.idx", TF_FORMAT_AUTO, 0, TF__TARGET_FILE, "lone.idx", NULL);
        resolve_case(v, n, remote, "lone", TF_FORMAT_AUTO, -ENOENT, 0, NULL, "nor a Megatron pair lone.bin and lone.idx");
        resolve_case(v, n, remote, "lone", TF_FORMAT_MEGATRON, -TF_EFORMAT, 0, NULL, "no Megatron dataset here: expected lone.bin and lone.idx");
        resolve_case(v, n, remote, "plain.npy", TF_FORMAT_AUTO, 0, TF__TARGET_FILE, "plain.npy", NULL);
        resolve_case(v, n, remote, "plain.npy", TF_FORMAT_MEGATRON, -TF_EFORMAT, 0, NULL, "no Megatron dataset here");
        resolve_case(v, n, remote, "nothing", TF_FORMAT_AUTO, -ENOENT, 0, NULL, noun);
        resolve_case(v, n, remote, "nothing", TF_FORMAT_NPY, -ENOENT, 0, NULL, noun);
        if (!remote) resolve_case(v, n, 0, "fifo", TF_FORMAT_AUTO, -EINVAL, 0, NULL, "not a regular file");
    }
    /* the companion's magic: known at once (local) or confirmed once fetched (remote) */
    resolve_case(v, n, 0, "bad.bin", TF_FORMAT_AUTO, 0, TF__TARGET_FILE, "bad.bin", NULL);
    resolve_case(v, n, 0, "bad", TF_FORMAT_AUTO, -TF_EFORMAT, 0, NULL, "bad.idx: magic: expected \"MMIDIDX\\0\\0\"");
    resolve_case(v, n, 0, "bad.bin", TF_FORMAT_MEGATRON, -TF_EFORMAT, 0, NULL, "This is not a Megatron .idx file");
    fake_probe fp = {v, n, 1, 0};
    tf__probe pr = {&fp, fake_kind, NULL, "object", 1};
    const uint8_t badhead[16] = "NOTMEGATRON";
    const uint8_t goodhead[16] = "MMIDIDX\0\0";
    const char *names[3] = {"bad.bin", "bad", "bad.bin"};
    tf_format fmts[3] = {TF_FORMAT_AUTO, TF_FORMAT_AUTO, TF_FORMAT_MEGATRON};
    int want[3] = {0, -TF_EFORMAT, -TF_EFORMAT};
    for (int i = 0; i < 3; i++) {
        tf__target t;
        CHECK_OK(tf__resolve_target(names[i], fmts[i], &pr, &t));
        CHECK(t.kind == TF__TARGET_PAIR && !strcmp(t.path, "bad"));
        int rc = tf__resolve_confirm(&t, names[i], badhead, sizeof badhead);
        CHECK(rc == want[i]);
        if (!rc) CHECK(t.kind == TF__TARGET_FILE && !strcmp(t.path, "bad.bin") && t.row == NULL);
        else CHECK(strstr(tf_last_error(), "bad.idx: magic") != NULL);
        free(t.path);
    }
    tf__target t;
    CHECK_OK(tf__resolve_target("m.bin", TF_FORMAT_AUTO, &pr, &t));
    CHECK_OK(tf__resolve_confirm(&t, "m.bin", goodhead, sizeof goodhead));
    CHECK(t.kind == TF__TARGET_PAIR && !strcmp(t.path, "m"));
    free(t.path);
    /* a remote name without an extension: the hint for a directory of shards */
    resolve_case(v, n, 1, "s3://b/shards", TF_FORMAT_AUTO, -ENOENT, 0, NULL, "end the URL with / or give a glob: s3://b/shards/*.bin");
    /* the names a remote open asks the sizes of: the URL, the manifest, the pair's two */
    int c[2] = {0, 0};
    CHECK_OK(tf__resolve_names("m.bin", TF_FORMAT_AUTO, count_name, c));
    CHECK(c[0] == 4 && c[1] == 1);
    c[0] = c[1] = 0;
    CHECK_OK(tf__resolve_names("m.bin", TF_FORMAT_LLMC, count_name, c));
    CHECK(c[0] == 1 && c[1] == 0);

    /* every companion is a row's: the shard-set listing and a remote open read them there */
    const char *const sufs[] = {".idx", ".index", ".tfdocs", ".csv.gz", ".bos.idx"};
    const tf__companion *comp;
    size_t k = 0;
    for (; (comp = tf__companion_at(k)) != NULL; k++) {
        CHECK(k < 5 && !strcmp(comp->suffix, sufs[k]));
        CHECK(tf__companion_index(comp) == (int)k);
    }
    CHECK(k == 5);
    comp = tf__companion_at(3);
    CHECK(comp == &tf__format_row_of(TF_FORMAT_RAW)->companions[2] && !comp->fetch);
    char *name = tf__companion_name(comp, "a.b/x.npy");
    CHECK(name && !strcmp(name, "a.b/x.csv.gz"));
    free(name);
    int oom = 0;
    name = tf__format_companion(TF_FORMAT_RAW, "d/x.ds", 0, &oom);
    CHECK(name && !strcmp(name, "d/x.ds.index"));
    free(name);
    CHECK(tf__format_companion(TF_FORMAT_RAW, "d/x.ds", 1, &oom) == NULL && !oom); /* (.tfdocs, .csv.gz: local only) */
    CHECK(tf__format_companion(TF_FORMAT_MEGATRON, "d/x.bin", 0, &oom) == NULL && !oom); /* (the pair's own half) */
    name = tf__format_companion(TF_FORMAT_NEMO_NANOGPT, "d/x.bin", 0, &oom);
    CHECK(name && !strcmp(name, "d/x.bos.idx"));
    free(name);
}

/* tf_path_resolve on real files: what an open of each name reads. */
static void path_resolve_case(const char *name, tf_format fmt, int want_rc, tf_path_kind want_kind,
                              const char *want_out, const char *msg) {
    char path[400], want[400], out[400] = "";
    tf_path_kind kind = (tf_path_kind)0;
    path_in(path, sizeof path, name);
    int rc = tf_path_resolve(path, fmt, &kind, out, sizeof out);
    if (rc != want_rc) fprintf(stderr, "tf_path_resolve(%s): %d, expected %d: %s\n", name, rc, want_rc, tf_last_error());
    CHECK(rc == want_rc);
    if (!rc) {
        path_in(want, sizeof want, want_out);
        CHECK(kind == want_kind);
        if (strcmp(out, want)) fprintf(stderr, "tf_path_resolve(%s): %s, expected %s\n", name, out, want);
        CHECK(!strcmp(out, want));
    } else if (msg) {
        if (!strstr(tf_last_error(), msg)) fprintf(stderr, "tf_path_resolve(%s): %s\n", name, tf_last_error());
        CHECK(strstr(tf_last_error(), msg) != NULL);
    }
}

static void test_path_resolve(void) {
    char p[400], q[400];
    path_in(p, sizeof p, "pr");
    CHECK(mkdir(p, 0700) == 0);
    path_in(p, sizeof p, "pr/ds");
    CHECK(mkdir(p, 0700) == 0);
    path_in(p, sizeof p, "pr/ds/" TF_MANIFEST_NAME);
    t_write_file(p, "{}", 2);
    path_in(p, sizeof p, "pr/nomanifest");
    CHECK(mkdir(p, 0700) == 0);
    const char mm[16] = "MMIDIDX\0\0\1";
    /* 16 bytes each (data past a string's end is zeros) */
    static const struct {
        const char *name;
        char data[24];
    } files[] = {{"pr/m.bin", "tokens.."}, {"pr/m.idx", "MMIDIDX\0\0\1"}, {"pr/o.bin", "tokens.."},
                 {"pr/o.idx", "another tool's!"}, {"pr/m", "a file of its own"}, {"pr/g.bin", "tokens.."}};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        path_in(p, sizeof p, files[i].name);
        t_write_file(p, files[i].data, 16);
    }
    path_in(p, sizeof p, "pr/g.idx");
    CHECK(mkfifo(p, 0600) == 0); /* no writer: a read would block, and none is made */
    path_in(p, sizeof p, "pr/fifo");
    CHECK(mkfifo(p, 0600) == 0);
    path_in(p, sizeof p, "pr/dir.bin");
    CHECK(mkdir(p, 0700) == 0);
    path_in(p, sizeof p, "pr/dir.idx");
    t_write_file(p, mm, 16);
    path_in(p, sizeof p, "pr/m.bin");
    path_in(q, sizeof q, "pr/l.bin");
    CHECK(symlink(p, q) == 0);
    path_in(p, sizeof p, "pr/m.idx");
    path_in(q, sizeof q, "pr/l.idx");
    CHECK(symlink(p, q) == 0);

    path_resolve_case("pr/ds", TF_FORMAT_AUTO, 0, TF_PATH_DATASET, "pr/ds", NULL);
    path_resolve_case("pr/ds/", TF_FORMAT_AUTO, 0, TF_PATH_DATASET, "pr/ds", NULL);
    path_resolve_case("pr/nomanifest", TF_FORMAT_AUTO, -TF_EFORMAT, 0, NULL, "no manifest");
    /* a pair by its prefix, its .bin or its .idx; linked halves are the pair the links name */
    path_resolve_case("pr/m.bin", TF_FORMAT_AUTO, 0, TF_PATH_PAIR, "pr/m", NULL);
    path_resolve_case("pr/m.idx", TF_FORMAT_AUTO, 0, TF_PATH_PAIR, "pr/m", NULL);
    path_resolve_case("pr/l", TF_FORMAT_AUTO, 0, TF_PATH_PAIR, "pr/l", NULL);
    path_resolve_case("pr/l.idx", TF_FORMAT_MEGATRON, 0, TF_PATH_PAIR, "pr/l", NULL);
    /* a file named like the prefix beside the pair is that file, unless the open names the pair's format */
    path_resolve_case("pr/m", TF_FORMAT_AUTO, 0, TF_PATH_FILE, "pr/m", NULL);
    path_resolve_case("pr/m", TF_FORMAT_MEGATRON, 0, TF_PATH_PAIR, "pr/m", NULL);
    path_resolve_case("pr/m.bin", TF_FORMAT_RAW, 0, TF_PATH_FILE, "pr/m.bin", NULL);
    /* an .idx with another magic: the name given is its own file; by the prefix, an error naming it */
    path_resolve_case("pr/o.bin", TF_FORMAT_AUTO, 0, TF_PATH_FILE, "pr/o.bin", NULL);
    path_resolve_case("pr/o", TF_FORMAT_AUTO, -TF_EFORMAT, 0, NULL, "o.idx: magic");
    path_resolve_case("pr/o.bin", TF_FORMAT_MEGATRON, -TF_EFORMAT, 0, NULL, "o.idx: magic");
    /* a FIFO (named, or as the companion) is never read; a directory named like a half is no half */
    path_resolve_case("pr/g.bin", TF_FORMAT_AUTO, 0, TF_PATH_FILE, "pr/g.bin", NULL);
    path_resolve_case("pr/g", TF_FORMAT_AUTO, -ENOENT, 0, NULL, "nor a Megatron pair");
    path_resolve_case("pr/fifo", TF_FORMAT_AUTO, -EINVAL, 0, NULL, "not a regular file or directory");
    path_resolve_case("pr/dir", TF_FORMAT_AUTO, -ENOENT, 0, NULL, "no such file");
    path_resolve_case("pr/missing", TF_FORMAT_AUTO, -ENOENT, 0, NULL, "pr/missing.idx");
    /* a URL is the remote open's to resolve; hostile arguments are refused, never written past */
    char out[8] = "";
    tf_path_kind kind;
    CHECK_RC(tf_path_resolve("s3://b/m.bin", TF_FORMAT_AUTO, &kind, out, sizeof out), -EINVAL);
    CHECK(strstr(tf_last_error(), "local paths only") != NULL);
    path_in(p, sizeof p, "pr/m.bin");
    CHECK_RC(tf_path_resolve(p, TF_FORMAT_AUTO, &kind, out, sizeof out), -ENAMETOOLONG);
    CHECK(out[0] == '\0' && strstr(tf_last_error(), "bytes") != NULL);
    CHECK_RC(tf_path_resolve(p, TF_FORMAT_AUTO, &kind, out, 0), -ENAMETOOLONG);
    CHECK_RC(tf_path_resolve(p, (tf_format)999, &kind, q, sizeof q), -EINVAL);
    CHECK_RC(tf_path_resolve(NULL, TF_FORMAT_AUTO, &kind, q, sizeof q), -EINVAL);
    CHECK_RC(tf_path_resolve(p, TF_FORMAT_AUTO, NULL, q, sizeof q), -EINVAL);
    CHECK_RC(tf_path_resolve(p, TF_FORMAT_AUTO, &kind, NULL, sizeof q), -EINVAL);
}

int main(void) {
    if (t_mkdtemp(tmpdir, sizeof tmpdir, "tf_test_sources")) return T_EXIT_FAIL;
    test_eos_index();
    test_olmo_metadata();
    test_native();
    test_dataset_catalog();
    test_native_corrupt();
    test_megatron();
    test_llmc();
    test_path_specs();
    test_resolve();
    test_path_resolve();
    test_nemo_nanogpt();
    test_npy();
    test_raw();
    test_fuzz();
    t_rm_rf(tmpdir);
    return T_DONE();
}
