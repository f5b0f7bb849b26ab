/* Common layer: dtype conversion, XXH64 known answers, memory datasets. */
#include <limits.h>

#include "helpers.h"

int main(void) {
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
    tf_dataset_free(ds);
    tf_dataset_free(NULL);
    return T_DONE();
}
