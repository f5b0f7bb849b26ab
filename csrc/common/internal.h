/*
 * internal.h — helpers shared by every layer of the C library. Not installed.
 *
 * Errors: functions return 0 or a negative code (see tokenfeed.h). When a
 * failure deserves more than its code, the raising site records a detail
 * message with tf__seterr(); the binding turns code + message into a Python
 * exception. Use TF_FAIL(code, fmt, ...) to record and return in one step.
 */
#ifndef TF_INTERNAL_H
#define TF_INTERNAL_H

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TF_EXPERIMENTAL_API /* the library implements the whole header */
#include "tokenfeed.h"

#define TF_HIDDEN __attribute__((visibility("hidden")))
#define TF_LIKELY(x) __builtin_expect(!!(x), 1)
#define TF_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* Record a detail message for the current thread (printf-style). Returns code
 * so that call sites can write `return tf__seterr(-EINVAL, "...")`. */
TF_HIDDEN int tf__seterr(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Clear the thread's detail message. */
TF_HIDDEN void tf__clearerr(void);

#define TF_FAIL(code, ...) return tf__seterr((code), __VA_ARGS__)

/* Forward a negative return code unchanged. */
#define TF_TRY(expr)                                                                               \
    do {                                                                                           \
        int tf__rc = (expr);                                                                       \
        if (TF_UNLIKELY(tf__rc < 0)) return tf__rc;                                                \
    } while (0)

/* Overflow-checked arithmetic on uint64_t: return non-zero on overflow. */
static inline int tf__add_overflow(uint64_t a, uint64_t b, uint64_t *r) {
    return __builtin_add_overflow(a, b, r);
}
static inline int tf__mul_overflow(uint64_t a, uint64_t b, uint64_t *r) {
    return __builtin_mul_overflow(a, b, r);
}

/* A growing array v of *cap elements of elem bytes, n of them used: v itself while
 * n < *cap, else v reallocated to twice the room (first elements for an empty one),
 * *cap updated. NULL (v and *cap unchanged) when memory runs out. */
static inline void *tf__grow(void *v, size_t *cap, size_t n, size_t elem, size_t first) {
    if (n < *cap) return v;
    size_t nc = *cap ? *cap * 2 : first;
    void *g = realloc(v, nc * elem);
    if (g) *cap = nc;
    return g;
}

/* Little-endian loads from possibly unaligned bytes. */
static inline uint32_t tf__le32(const void *p) {
    const uint8_t *b = (const uint8_t *)p;
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}
static inline uint64_t tf__le64(const void *p) {
    return (uint64_t)tf__le32(p) | (uint64_t)tf__le32((const uint8_t *)p + 4) << 32;
}
/* A growing buffer of bytes to be written whole (a record, a catalog): a
 * failed allocation marks it (err = -ENOMEM) and later puts do nothing, so a
 * writer checks once, at the end. */
typedef struct tf__byte_wr {
    uint8_t *p;
    size_t n, cap;
    int err;
} tf__byte_wr;
static inline void tf__byte_put(tf__byte_wr *b, const void *src, size_t n) {
    if (b->err || n == 0) return; /* src may be NULL then (an empty buffer) */
    if (b->n + n > b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 4096;
        while (nc < b->n + n) nc *= 2;
        uint8_t *np = (uint8_t *)realloc(b->p, nc);
        if (!np) {
            b->err = -ENOMEM;
            return;
        }
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
/* The low `bytes` (at most 8) bytes of v, little-endian. */
static inline void tf__byte_put_le(tf__byte_wr *b, size_t bytes, uint64_t v) {
    uint8_t r[8];
    for (size_t i = 0; i < 8; i++) r[i] = (uint8_t)(v >> (8 * i));
    tf__byte_put(b, r, bytes);
}

/* A bounded reader over bytes read from disk or the network: a read past the
 * end marks it bad and gives NULL (or 0) from then on, so a parser checks
 * once, at the end, whether what it read was all there. */
typedef struct tf__byte_rd {
    const uint8_t *p;
    size_t n, at;
    int bad;
} tf__byte_rd;
static inline const uint8_t *tf__byte_take(tf__byte_rd *m, uint64_t n) {
    if (m->bad || n > m->n - m->at) {
        m->bad = 1;
        return NULL;
    }
    const uint8_t *p = m->p + m->at;
    m->at += (size_t)n;
    return p;
}
/* A little-endian integer of `bytes` (at most 8) bytes; 0 once short. */
static inline uint64_t tf__byte_le(tf__byte_rd *m, size_t bytes) {
    const uint8_t *p = tf__byte_take(m, bytes);
    uint64_t v = 0;
    for (size_t i = bytes; p && i-- > 0;) v = v << 8 | p[i];
    return v;
}
static inline void tf__put_le32(void *p, uint32_t v) {
    uint8_t *b = (uint8_t *)p;
    b[0] = (uint8_t)v; b[1] = (uint8_t)(v >> 8); b[2] = (uint8_t)(v >> 16); b[3] = (uint8_t)(v >> 24);
}
static inline void tf__put_le64(void *p, uint64_t v) {
    tf__put_le32(p, (uint32_t)v);
    tf__put_le32((uint8_t *)p + 4, (uint32_t)(v >> 32));
}

/* Streaming XXH64 (for writers that checksum as they go). */
typedef struct tf__xxh64_state {
    uint64_t total_len;
    uint64_t v[4];
    uint8_t mem[32];
    uint32_t memsize;
    uint64_t seed;
} tf__xxh64_state;
TF_HIDDEN void tf__xxh64_reset(tf__xxh64_state *s, uint64_t seed);
TF_HIDDEN void tf__xxh64_update(tf__xxh64_state *s, const void *data, size_t len);
TF_HIDDEN uint64_t tf__xxh64_digest(const tf__xxh64_state *s);

/* splitmix64 finalizer: the library's 64-bit mixer (tf_mix64 exports it;
 * hot loops such as the Feistel rounds use this inline copy). */
static inline uint64_t tf__mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ULL;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBULL;
    x ^= x >> 31;
    return x;
}

/* Hint to the CPU inside a spin-wait loop. */
static inline void tf__cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

/* The embedder's interrupt check (interrupt.c; tf_interrupt_set_check): 1
 * when the calling thread should give up its wait with -EINTR. Waits that a
 * caller's thread makes poll it every TF__INTERRUPT_SLICE_NS. Call it without
 * holding a lock (the check may take an interpreter's lock). */
TF_HIDDEN int tf__interrupted(void);
/* A thread of the library's own whose waits end when *flag is set (the
 * chunk scheduler, which close stops whatever request it waits for):
 * tf__interrupted() answers 1 on the calling thread while *flag is non-zero.
 * NULL clears it. */
TF_HIDDEN void tf__thread_cancel_on(const volatile int *flag);
#define TF__INTERRUPT_SLICE_NS (50ull * 1000 * 1000)
/* Pass a progress line to the embedder's notice function (tf_notice_set_fn),
 * if any. No lock of the library's may be held. */
TF_HIDDEN void tf__notice(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
#define TF__NOTICE_NS (10ull * 1000 * 1000 * 1000)

/* Whether path names a remote object ("scheme://..." other than file://). */
TF_HIDDEN int tf__is_url(const char *path);

/* Number of online CPUs (>= 1). */
TF_HIDDEN int tf__num_cpus(void);

/* Monotonic clock in nanoseconds. */
TF_HIDDEN uint64_t tf__now_ns(void);

/* Timed waits. Every condition variable that a thread waits on with a
 * timeout is made by tf__cond_init (0 or -ENOMEM): its deadlines are on the
 * monotonic clock, so a change of the wall clock neither cuts a wait short
 * nor stretches it. tf__abstime turns a tf__now_ns() instant into such a
 * deadline; tf__deadline_after is the instant ns from now (saturating). */
TF_HIDDEN int tf__cond_init(pthread_cond_t *cv);

static inline struct timespec tf__abstime(uint64_t mono_ns) {
    struct timespec ts = {(time_t)(mono_ns / 1000000000ull), (long)(mono_ns % 1000000000ull)};
    return ts;
}

static inline struct timespec tf__deadline_after(uint64_t ns) {
    uint64_t now = tf__now_ns();
    return tf__abstime(ns > UINT64_MAX - now ? UINT64_MAX : now + ns);
}

/* SIGBUS guard (sigbus.c): a file truncated while mapped must give -EIO, not
 * kill the process. tf__sigbus_install() (once per process; the sources layer
 * calls it when it maps a file) installs a chaining SIGBUS handler.
 * tf__sigbus_run() calls fn(arg) so that a bus error on a mapped page inside
 * it returns -EIO with fault->hit = 1 and the faulting address in
 * fault->addr (the caller says which file that is); otherwise it returns
 * fn's result with fault->hit = 0. Guards nest. Code under a guard must not
 * hold a lock or an unstored allocation across a load from a mapping. */
typedef struct tf__sigbus_fault {
    int hit;
    const void *addr;
} tf__sigbus_fault;
TF_HIDDEN void tf__sigbus_install(void);
TF_HIDDEN int tf__sigbus_installed(void);
TF_HIDDEN int tf__sigbus_run(int (*fn)(void *), void *arg, tf__sigbus_fault *fault);

/* A NULL argument of a public function: -EINVAL with a message naming the
 * function and the argument (fn: the public name, where a helper checks). */
#define TF_NEED_ARG_OF(fn, p)                                                                      \
    do {                                                                                           \
        if (!(p)) return tf__seterr(-EINVAL, "%s: the argument %s is NULL", fn, #p);               \
    } while (0)
#define TF_NEED_ARG(p) TF_NEED_ARG_OF(__func__, p)
/* A buffer that may be NULL only when its size is 0. */
#define TF_NEED_BUF_OF(fn, p, n)                                                                   \
    do {                                                                                           \
        if (!(p) && (n))                                                                           \
            return tf__seterr(-EINVAL, "%s: the argument %s is NULL with %s %llu (NULL only with 0)", fn, #p, \
                              #n, (unsigned long long)(n));                                        \
    } while (0)
#define TF_NEED_BUF(p, n) TF_NEED_BUF_OF(__func__, p, n)

/* JSON (json.c), for the loader state: a flat array of nodes in preorder; an
 * array's or object's children are linked by index (first, next), and listed
 * in order from j->kids[kids] (so that child i is found in O(1)); an object
 * member's name is key/klen. Strings are slices of the text (escapes kept). A
 * key twice in one object, more than TF_STATE_MAX_MEMBERS members in one and
 * NaN / Infinity are refused. */
typedef enum tf__jtype { TF__J_NULL, TF__J_BOOL, TF__J_INT, TF__J_NUM, TF__J_STR, TF__J_ARR, TF__J_OBJ } tf__jtype;
typedef struct tf__jnode {
    tf__jtype type;
    int neg;        /* TF__J_INT: negative (value -u) */
    uint64_t u;     /* TF__J_INT: magnitude; TF__J_BOOL: 0 / 1 */
    double d;       /* TF__J_INT, TF__J_NUM */
    const char *s;  /* TF__J_STR */
    size_t slen;
    size_t first, next, n; /* children */
    size_t kids;           /* where its children's indices begin in j->kids */
    const char *key;
    size_t klen;
} tf__jnode;
typedef struct tf__json {
    const char *text;
    tf__jnode *nodes; /* nodes[0] is the root */
    size_t count, cap;
    size_t *kids;     /* every container's children, in order, one after the other */
} tf__json;
/* -EINVAL with a message naming the place of the first error. */
TF_HIDDEN int tf__json_parse(const char *text, size_t len, tf__json *j);
TF_HIDDEN void tf__json_free(tf__json *j);
TF_HIDDEN const tf__jnode *tf__json_child(const tf__json *j, const tf__jnode *n, size_t i);
TF_HIDDEN const tf__jnode *tf__json_get(const tf__json *j, const tf__jnode *obj, const char *key);
TF_HIDDEN int tf__json_streq(const tf__jnode *n, const char *s);
/* "an integer", "a string", ... "missing" (NULL), for messages. */
TF_HIDDEN const char *tf__json_type_name(const tf__jnode *n);
/* A growing text buffer (free buf when done); the first failure sticks in rc. */
typedef struct tf__jw {
    char *buf;
    size_t len, cap;
    int rc;
} tf__jw;
TF_HIDDEN int tf__jw_printf(tf__jw *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
TF_HIDDEN int tf__jw_double(tf__jw *w, double d);

#endif
