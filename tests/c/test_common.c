/* Common layer: dtype conversion, XXH64 known answers, memory datasets. */
#include <limits.h>

#include "helpers.h"
#include "common/settings.h"

/* Every row's conditions (when it enters the stream, the fingerprint) are in
 * the grammar the table reads (a condition outside it would be compared
 * always), and read the configuration through the rows: kinds and modes by
 * their enum names. */
static void test_setting_conditions(void) {
    for (size_t i = 0; i < tf__nsettings; i++) {
        const tf__setting_row *r = &tf__settings[i];
        if (!tf__setting_cond_valid(r->pub.stream)) fprintf(stderr, "row %s: stream \"%s\"\n", r->pub.name, r->pub.stream);
        CHECK(tf__setting_cond_valid(r->pub.stream));
        CHECK(!r->fp || tf__setting_cond_valid(r->fp));
    }
    const char *bad[] = {"", "sometimes", "order=mosaic", "packing=", "=concat", "seq_len=1", "order!=", "always or",
                         "shuffle=block or nope", NULL};
    for (int i = 0; bad[i]; i++) CHECK(!tf__setting_cond_valid(bad[i]));
    CHECK(tf__setting_cond_valid("packing!=concat or order=olmo or mixture"));
    CHECK(tf__setting_cond_valid("order=megatron")); /* a kind of the registry, as its name */
    tf_order_config c;
    tf_order_config_init(&c);
    tf__cond_ctx x = {&c, 0, 0};
    const tf__setting_row *pad = tf__setting_row_find("pad_id"), *bs = tf__setting_row_find("block_size"),
                          *mw = tf__setting_row_find("mix_window");
    CHECK(pad && bs && mw);
    if (!pad || !bs || !mw) return;
    CHECK(!tf__setting_enters_stream(pad, &x)); /* concat, tokenfeed's order */
    c.order = TF_ORDER_OLMO;
    CHECK(tf__setting_enters_stream(pad, &x));
    c.order = TF_ORDER_TOKENFEED;
    c.packing = TF_PACK_DOCUMENT;
    CHECK(tf__setting_enters_stream(pad, &x));
    CHECK(!tf__setting_enters_stream(bs, &x));
    c.shuffle = TF_SHUFFLE_BLOCK;
    CHECK(tf__setting_enters_stream(bs, &x));
    CHECK(!tf__setting_enters_stream(mw, &x));
    x.mixture = 1;
    CHECK(tf__setting_enters_stream(mw, &x));
}

int main(void) {
    test_setting_conditions();
    /* every int has a sentence, INT_MIN (whose negation is no int) included */
    CHECK(tf_strerror(INT_MIN) && *tf_strerror(INT_MIN));
    CHECK(tf_strerror(INT_MAX) && *tf_strerror(INT_MAX));
    CHECK(!strcmp(tf_strerror(-TF_ESTATE), tf_strerror(TF_ESTATE)));
    /* XXH64 reference values (xxhash test vectors). */
    CHECK(tf_hash64("", 0, 0) == 0xEF46DB3751D8E999ULL);
    CHECK(tf_hash64("a", 1, 0) == 0xD24EC4F1A98C6E5BULL);
    CHECK(tf_hash64("abc", 3, 0) == 0x44BC2CF5AD770999ULL);

    uint16_t src[5] = {0, 1, 65535, 7, 300};
    int64_t dst[5];
    tf_convert(dst, TF_INT64, src, TF_UINT16, 5);
    CHECK(dst[2] == 65535 && dst[4] == 300);
    CHECK(tf_dtype_from_name("uint32") == TF_UINT32);
    CHECK(tf_dtype_size(TF_FLOAT64) == 8);

    uint64_t ends[3] = {2, 2, 5};
    tf_dataset *ds = NULL;
    CHECK_OK(tf_dataset_from_memory(src, 5, TF_UINT16, ends, 3, 65536, &ds));
    tf_dataset_info info;
    CHECK_OK(tf_dataset_get_info(ds, &info));
    CHECK(info.num_tokens == 5 && info.num_documents == 3);
    uint64_t s, n, d;
    CHECK_OK(tf_dataset_document(ds, 1, &s, &n));
    CHECK(s == 2 && n == 0);
    CHECK_OK(tf_dataset_find_document(ds, 2, &d));
    CHECK(d == 2);
    int32_t out[3];
    CHECK_OK(tf_dataset_read(ds, 2, 3, out, TF_INT32));
    CHECK(out[0] == 65535 && out[2] == 300);
    CHECK(tf_dataset_read(ds, 4, 2, out, TF_INT32) == -ERANGE);
    CHECK_OK(tf_dataset_verify(ds, 2, NULL, NULL));
    CHECK_OK(tf_dataset_check_documents(ds)); /* documents given: known */
    tf_dataset_free(ds);
    tf_dataset_free(NULL);

    /* sizes, as every size setting reads them */
    uint64_t b = 1;
    CHECK_OK(tf_parse_size("1.5G", "x", &b));
    CHECK(b == 1500000000ull);
    CHECK_OK(tf_parse_size("1T", "x", &b));
    CHECK(b == 1000000000000ull);
    CHECK_OK(tf_parse_size(" 2 kib ", "x", &b));
    CHECK(b == 2048);
    CHECK_OK(tf_parse_size("1.5TiB", "x", &b));
    CHECK(b == 3ull << 39);
    CHECK_OK(tf_parse_size("4096", "x", &b));
    CHECK(b == 4096);
    CHECK_OK(tf_parse_size("18446744073709551615", "x", &b));
    CHECK(b == UINT64_MAX);
    CHECK(tf_parse_size("18446744073709551616", "x", &b) == -ERANGE);
    CHECK(tf_parse_size("19000P", "x", &b) == -ERANGE);
    const char *bad[] = {"", "G", "1.5X", "-1G", "1.2.3G", "5 parsecs", "1 G B", NULL};
    for (int i = 0; bad[i]; i++) {
        CHECK(tf_parse_size(bad[i], "TOKENFEED_CATALOG_MAX", &b) == -EINVAL);
        CHECK(b == 0 && strstr(tf_last_error(), "TOKENFEED_CATALOG_MAX") && strstr(tf_last_error(), "KiB"));
    }
    return T_DONE();
}
