/* dtype.c — token dtypes and conversion between them. */
/* The conversion loops are the hot path of batch assembly: GCC only
 * vectorises them at -O3 (its -O2 cost model rejects loops with an epilogue). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")
#endif
#include <string.h>

#include "internal.h"

size_t tf_dtype_size(tf_dtype dt) {
    switch (dt) {
    case TF_UINT8: case TF_INT8: return 1;
    case TF_UINT16: case TF_INT16: return 2;
    case TF_UINT32: case TF_INT32: case TF_FLOAT32: return 4;
    case TF_UINT64: case TF_INT64: case TF_FLOAT64: return 8;
    default: return 0;
    }
}

static const char *const tf_dtype_names[] = {
    "invalid", "uint8", "uint16", "uint32", "uint64", "int8",
    "int16",   "int32", "int64",  "float32", "float64",
};

const char *tf_dtype_name(tf_dtype dt) {
    if ((unsigned)dt > TF_FLOAT64) return "invalid";
    return tf_dtype_names[dt];
}

tf_dtype tf_dtype_from_name(const char *name) {
    if (!name) return TF_DTYPE_INVALID;
    for (unsigned i = 1; i <= TF_FLOAT64; i++)
        if (strcmp(name, tf_dtype_names[i]) == 0) return (tf_dtype)i;
    return TF_DTYPE_INVALID;
}

/* One loop per (src, dst) pair would be 100 functions; instead widen through
 * the destination type with a switch on the source outside the loop. The
 * compiler vectorises each inner loop. */
#define TF_CONVERT_FROM(DST_T, dst, src, s, n)                                                     \
    do {                                                                                           \
        switch (s) {                                                                               \
        case TF_UINT8: { const uint8_t *p = src; for (size_t i = 0; i < n; i++) dst[i] = (DST_T)p[i]; } break;   \
        case TF_UINT16: { const uint16_t *p = src; for (size_t i = 0; i < n; i++) dst[i] = (DST_T)p[i]; } break; \
        case TF_UINT32: { const uint32_t *p = src; for (size_t i = 0; i < n; i++) dst[i] = (DST_T)p[i]; } break; \
        case TF_UINT64: { const uint64_t *p = src; for (size_t i = 0; i < n; i++) dst[i] = (DST_T)p[i]; } break; \
        case TF_INT8: { const int8_t *p = src; for (size_t i = 0; i < n; i++) dst[i] = (DST_T)p[i]; } break;     \
        case TF_INT16: { const int16_t *p = src; for (size_t i = 0; i < n; i++) dst[i] = (DST_T)p[i]; } break;   \
        case TF_INT32: { const int32_t *p = src; for (size_t i = 0; i < n; i++) dst[i] = (DST_T)p[i]; } break;   \
        case TF_INT64: { const int64_t *p = src; for (size_t i = 0; i < n; i++) dst[i] = (DST_T)p[i]; } break;   \
        case TF_FLOAT32: { const float *p = src; for (size_t i = 0; i < n; i++) dst[i] = tf__f2i_##DST_T(p[i]); } break; \
        case TF_FLOAT64: { const double *p = src; for (size_t i = 0; i < n; i++) dst[i] = tf__f2i_##DST_T(p[i]); } break; \
        default: break;                                                                            \
        }                                                                                          \
    } while (0)

/* Float -> integer casts of out-of-range values are undefined in C; clamp. */
#define TF_F2I(T, LO, HI)                                                                          \
    static inline T tf__f2i_##T(double v) {                                                        \
        if (!(v >= (double)(LO))) return (T)(LO); /* also NaN */                                   \
        if (v >= (double)(HI)) return (T)(HI);                                                     \
        return (T)v;                                                                               \
    }
TF_F2I(uint8_t, 0, UINT8_MAX)
TF_F2I(uint16_t, 0, UINT16_MAX)
TF_F2I(uint32_t, 0, UINT32_MAX)
TF_F2I(uint64_t, 0, 18446744073709549568.0)
TF_F2I(int8_t, INT8_MIN, INT8_MAX)
TF_F2I(int16_t, INT16_MIN, INT16_MAX)
TF_F2I(int32_t, INT32_MIN, INT32_MAX)
TF_F2I(int64_t, INT64_MIN, 9223372036854774784.0)
typedef float tf_f32;
typedef double tf_f64;
static inline float tf__f2i_tf_f32(double v) { return (float)v; }
static inline double tf__f2i_tf_f64(double v) { return v; }

/* Widening u16 -> i64 is the hot loop of batch assembly. Builds are generic
 * x86-64 (SSE2), where it takes several shuffles per element; target_clones
 * adds AVX2 and AVX-512 copies chosen once at load time (ifunc), so the same
 * wheel runs everywhere and uses the wide loads where the CPU has them. */
/* Not under sanitizers: the ifunc resolver runs during relocation, before
 * the TSan runtime is initialised, and crashes there. GCC says a sanitizer is
 * on with __SANITIZE_*__, clang (the fuzz builds; zig cc, which builds the
 * wheels) with __has_feature. */
#if defined(__clang__) && defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define TF__SANITIZED 1
#endif
#endif
#if defined(__GNUC__) && defined(__x86_64__) && defined(__linux__) && !defined(__SANITIZE_THREAD__) && \
    !defined(__SANITIZE_ADDRESS__) && !defined(TF__SANITIZED)
#define TF_CONVERT_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TF_CONVERT_CLONES
#endif

TF_CONVERT_CLONES
void tf_convert(void *dst, tf_dtype d, const void *src, tf_dtype s, size_t n) {
    if (n == 0) return;
    if (d == s) {
        memcpy(dst, src, n * tf_dtype_size(s));
        return;
    }
    switch (d) {
    case TF_UINT8: { uint8_t *o = dst; TF_CONVERT_FROM(uint8_t, o, src, s, n); } break;
    case TF_UINT16: { uint16_t *o = dst; TF_CONVERT_FROM(uint16_t, o, src, s, n); } break;
    case TF_UINT32: { uint32_t *o = dst; TF_CONVERT_FROM(uint32_t, o, src, s, n); } break;
    case TF_UINT64: { uint64_t *o = dst; TF_CONVERT_FROM(uint64_t, o, src, s, n); } break;
    case TF_INT8: { int8_t *o = dst; TF_CONVERT_FROM(int8_t, o, src, s, n); } break;
    case TF_INT16: { int16_t *o = dst; TF_CONVERT_FROM(int16_t, o, src, s, n); } break;
    case TF_INT32: { int32_t *o = dst; TF_CONVERT_FROM(int32_t, o, src, s, n); } break;
    case TF_INT64: { int64_t *o = dst; TF_CONVERT_FROM(int64_t, o, src, s, n); } break;
    case TF_FLOAT32: { tf_f32 *o = dst; TF_CONVERT_FROM(tf_f32, o, src, s, n); } break;
    case TF_FLOAT64: { tf_f64 *o = dst; TF_CONVERT_FROM(tf_f64, o, src, s, n); } break;
    default: break;
    }
}
