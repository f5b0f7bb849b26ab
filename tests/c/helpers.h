/* helpers.h — tiny harness for the C test programs (exit 0 pass, 1 fail,
 * 77 skip), in the style of liburing's test/helpers.h. */
#ifndef TF_TEST_HELPERS_H
#define TF_TEST_HELPERS_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>

#include "tokenfeed.h"

#define T_EXIT_PASS 0
#define T_EXIT_FAIL 1
#define T_EXIT_SKIP 77

static int t_failures;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);               \
            t_failures++;                                                                          \
        }                                                                                          \
    } while (0)

/* Expect a library call to return 0; prints the library's message if not. */
#define CHECK_OK(expr)                                                                             \
    do {                                                                                           \
        int t_rc = (expr);                                                                         \
        if (t_rc != 0) {                                                                           \
            fprintf(stderr, "%s:%d: %s returned %d (%s): %s\n", __FILE__, __LINE__, #expr, t_rc,   \
                    tf_strerror(t_rc), tf_last_error());                                           \
            t_failures++;                                                                          \
        }                                                                                          \
    } while (0)

#define CHECK_RC(expr, want)                                                                       \
    do {                                                                                           \
        int t_rc = (expr);                                                                         \
        if (t_rc != (want)) {                                                                      \
            fprintf(stderr, "%s:%d: %s returned %d, expected %d (%s)\n", __FILE__, __LINE__,       \
                    #expr, t_rc, (int)(want), tf_last_error());                                    \
            t_failures++;                                                                          \
        }                                                                                          \
    } while (0)

#define T_DONE() (t_failures ? (fprintf(stderr, "%d check(s) failed\n", t_failures), T_EXIT_FAIL) : T_EXIT_PASS)

#endif
