/*
 * settings.h — inside the library: the rows of the settings table
 * (settings.c) with where each value lives, and the helpers that config
 * initialisation, checks, fingerprint and state use. Not installed.
 */
#ifndef TF_COMMON_SETTINGS_H
#define TF_COMMON_SETTINGS_H

#include "internal.h"

/* Largest best_fit packing window (documents); the row's bound and pack.c's. */
#define TF__MAX_PACK_WINDOW (1u << 24)

typedef struct tf__setting_row {
    tf_setting pub;
    const char *fp;  /* order rows: when the setting enters the fingerprint (and the
                        state records it): pub.stream's language; NULL: as pub.stream */
    int is_signed;   /* the member is a signed integer (or an int enum) */
    size_t offset;   /* in tf_order_config, tf_loader_config, tf_device_config or
                        tf_remote_config (pub.scope) */
    size_t size;
} tf__setting_row;

TF_HIDDEN extern const tf__setting_row tf__settings[];
TF_HIDDEN extern const size_t tf__nsettings;

TF_HIDDEN const tf__setting_row *tf__setting_row_find(const char *name);
TF_HIDDEN int64_t tf__setting_get(const tf__setting_row *r, const void *cfg);
TF_HIDDEN void tf__setting_put(const tf__setting_row *r, void *cfg, int64_t v);
/* A TF_SETTING_PATH row's value (NULL: none, or another type of row). Such
 * a row reads as 0 through tf__setting_get (no integer value: never
 * compared nor hashed) and tf__setting_put only clears it. */
TF_HIDDEN const char *tf__setting_path(const tf__setting_row *r, const void *cfg);
/* Every row of scope: its default / its bounds (-EINVAL naming the setting). */
TF_HIDDEN void tf__settings_init(tf_setting_scope scope, void *cfg);
TF_HIDDEN int tf__settings_check(tf_setting_scope scope, const void *cfg);
TF_HIDDEN int tf__setting_check(const tf__setting_row *r, int64_t v);
/* Every row of scope: none becomes the row's default, any other value is
 * checked against the row's bounds (-EINVAL naming the setting). */
TF_HIDDEN int tf__settings_resolve(tf_setting_scope scope, void *cfg);
/* The value as Python writes it: None, 'name', True, 12. */
TF_HIDDEN int tf__setting_describe(const tf__setting_row *r, int64_t v, char *buf, size_t cap);
/* What a condition of the table is evaluated on: a configuration, and
 * whether it is a mixture (of several weight points: a schedule). */
typedef struct tf__cond_ctx {
    const tf_order_config *cfg;
    int mixture, schedule;
} tf__cond_ctx;
/* Whether an order setting changes the stream of a configuration / enters
 * its fingerprint. */
TF_HIDDEN int tf__setting_enters_stream(const tf__setting_row *r, const tf__cond_ctx *c);
/* Whether a row's condition (stream, fp) is in the grammar holds() reads:
 * a row whose condition is not would be compared always. */
TF_HIDDEN int tf__setting_cond_valid(const char *w);
TF_HIDDEN int tf__setting_in_fingerprint(const tf__setting_row *r, const tf__cond_ctx *c);

#endif
