/*
 * settings.c — the settings table: one row per setting of the order, the
 * engine, the device stage and remote reading. It lives in common/, below
 * every layer, so that remote/ reads its defaults and bounds from the rows too. Defaults (tf_*_config_init), range checks, the
 * configuration fingerprint, the configuration a loader state records and the
 * bounds a caller queries (tf_setting_find) all come from these rows; the
 * Python binding parses its keywords from them and exposes them as
 * _core.settings().
 *
 * Adding a setting: add its member to the config struct in tokenfeed.h, one
 * row below (in its scope's group; order rows that enter the fingerprint go
 * where the fingerprint should hash them, after those already there, so that
 * existing fingerprints do not change), and the code that uses the value. The
 * row's `stream` says when the setting changes the stream: "always", "never"
 * (engine and device settings), or a condition on earlier order settings
 * ("shuffle=block", "packing!=concat", "mixture", ...: atom() gives the grammar); a
 * resume compares the setting exactly when it holds. `fp` (NULL: the same)
 * says when it enters the fingerprint, and so when the state records it (else
 * null); it can be wider than `stream` (seed and global_batch entered the
 * fingerprint before their finer conditions were known, and fingerprints
 * never change). tests/test_settings.py checks that _core.pyi and the docs' option
 * tables name every row.
 */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "settings.h"

#define ORDER(m) offsetof(tf_order_config, m), sizeof(((tf_order_config *)0)->m)
#define ENGINE(m) offsetof(tf_loader_config, m), sizeof(((tf_loader_config *)0)->m)
#define DEVICE(m) offsetof(tf_device_config, m), sizeof(((tf_device_config *)0)->m)
#define REMOTE(m) offsetof(tf_remote_config, m), sizeof(((tf_remote_config *)0)->m)

static const char *const PACKING_NAMES[] = {"concat", "best_fit", "document", NULL};
static const char *const SHUFFLE_NAMES[] = {"none", "full", "block", NULL};
static const char *const BACKEND_NAMES[] = {"auto", "mmap", "pread", "io_uring", NULL};
static const char *const BALANCE_NAMES[] = {"none", "tokens", "attention", "strided", NULL};
static const char *const ORDER_NAMES[] = {"tokenfeed", "llmc", "olmo", NULL};

/* Largest seq_len: extras are int32 and cu_seqlens holds L itself. */
#define MAX_SEQ_LEN ((uint64_t)INT32_MAX - 1)

/* name, type, signed, default, min, max, none (nullable: the value that means
 * none / default, shown as null), enum names, stream, description; then where
 * it lives. One line per row; the order rows are in fingerprint order. */
const tf__setting_row tf__settings[] = {
    {{"seq_len", TF_SCOPE_ORDER, TF_SETTING_INT, 2048, 1, MAX_SEQ_LEN, 0, 0, NULL, "always", "tokens per sample the model sees (a sample holds seq_len + 1 tokens)"}, NULL, 0, ORDER(seq_len)},
    {{"packing", TF_SCOPE_ORDER, TF_SETTING_ENUM, TF_PACK_CONCAT, 0, 2, 0, 0, PACKING_NAMES, "always", "how documents become samples: concat, best_fit or document"}, NULL, 0, ORDER(packing)},
    {{"separator_id", TF_SCOPE_ORDER, TF_SETTING_INT, -1, -1, INT64_MAX, 1, -1, NULL, "always", "token inserted after every document (None: none)"}, NULL, 1, ORDER(separator_id)},
    {{"seed", TF_SCOPE_ORDER, TF_SETTING_INT, 0, 0, UINT64_MAX, 0, 0, NULL, "shuffle!=none", "seed of the shuffle (and of each mixture source's own)"}, "always", 0, ORDER(seed)},
    {{"shuffle", TF_SCOPE_ORDER, TF_SETTING_ENUM, TF_SHUFFLE_FULL, 0, 2, 0, 0, SHUFFLE_NAMES, "always", "order of the samples within an epoch: none, full or block"}, NULL, 0, ORDER(shuffle)},
    {{"block_size", TF_SCOPE_ORDER, TF_SETTING_INT, 1024, 1, UINT64_MAX, 0, 0, NULL, "shuffle=block", "samples per block of the block shuffle"}, NULL, 0, ORDER(block_size)},
    {{"window_blocks", TF_SCOPE_ORDER, TF_SETTING_INT, 16, 1, UINT64_MAX, 0, 0, NULL, "shuffle=block", "blocks per window of the block shuffle"}, NULL, 0, ORDER(window_blocks)},
    {{"global_batch", TF_SCOPE_ORDER, TF_SETTING_INT, 1, 1, UINT64_MAX, 0, 0, NULL, "always", "samples per step over all data-parallel ranks (batch_size x dp_size)"}, "always", 0, ORDER(global_batch)},
    {{"epochs", TF_SCOPE_ORDER, TF_SETTING_INT, 0, 0, UINT64_MAX, 1, 0, NULL, "always", "passes over the data before the stream ends (None: endless)"}, NULL, 0, ORDER(epochs)},
    {{"pad_id", TF_SCOPE_ORDER, TF_SETTING_INT, 0, 0, INT64_MAX, 0, 0, NULL, "packing!=concat or order=olmo", "token that fills the rest of a packed sample (and ends an OLMo instance)"}, NULL, 1, ORDER(pad_id)},
    {{"pack_window", TF_SCOPE_ORDER, TF_SETTING_INT, 1024, 1, TF__MAX_PACK_WINDOW, 0, 0, NULL, "packing=best_fit", "documents per best_fit packing window"}, NULL, 0, ORDER(pack_window)},
    {{"mix_window", TF_SCOPE_ORDER, TF_SETTING_INT, 1000, 1, 1u << 20, 0, 0, NULL, "mixture", "positions per mixing window, over which the weights become exact counts"}, NULL, 0, ORDER(mix_window)},
    {{"order", TF_SCOPE_ORDER, TF_SETTING_ENUM, TF_ORDER_TOKENFEED, 0, 2, 0, 0, ORDER_NAMES, "always", "whose order of samples: tokenfeed's, or llmc / olmo to continue a run begun on llm.c's or OLMo-core's loader"}, "order!=tokenfeed", 1, ORDER(order)},
    {{"llmc_processes", TF_SCOPE_ORDER, TF_SETTING_INT, 1, 1, UINT32_MAX, 1, 0, NULL, "order=llmc", "llm.c's number of processes, each shuffling on its own (None: the data-parallel size)"}, NULL, 0, ORDER(llmc_processes)},
    {{"olmo_chunk", TF_SCOPE_ORDER, TF_SETTING_INT, 1, 1, UINT32_MAX, 1, 0, NULL, "order=olmo", "OLMo's max_target_sequence_length / seq_len: instances shuffled in runs of this many (None: 1)"}, NULL, 0, ORDER(olmo_chunk)},

    {{"batch_size", TF_SCOPE_ENGINE, TF_SETTING_INT, 8, 1, UINT64_MAX, 0, 0, NULL, "never", "samples per data-parallel rank per batch"}, NULL, 0, ENGINE(batch_size)},
    {{"dp_rank", TF_SCOPE_ENGINE, TF_SETTING_INT, 0, 0, UINT32_MAX - 1, 0, 0, NULL, "never", "data-parallel rank: which slice of every global batch (older name: rank)"}, NULL, 0, ENGINE(rank)},
    {{"dp_size", TF_SCOPE_ENGINE, TF_SETTING_INT, 1, 1, UINT32_MAX, 0, 0, NULL, "never", "data-parallel ranks the global batch is split over (older name: world_size)"}, NULL, 0, ENGINE(world_size)},
    {{"cp_rank", TF_SCOPE_ENGINE, TF_SETTING_INT, 0, 0, UINT32_MAX - 1, 0, 0, NULL, "never", "context-parallel rank: which share of every sample"}, NULL, 0, ENGINE(cp_rank)},
    {{"cp_size", TF_SCOPE_ENGINE, TF_SETTING_INT, 1, 1, UINT32_MAX, 1, 0, NULL, "never", "context-parallel ranks every sample is shared over (None: 1, no split)"}, NULL, 0, ENGINE(cp_size)},
    {{"num_threads", TF_SCOPE_ENGINE, TF_SETTING_INT, 0, 0, TF_MAX_THREADS, 1, 0, NULL, "never", "worker threads assembling batches (None: the engine's choice for the backend)"}, NULL, 1, ENGINE(num_threads)},
    {{"prefetch_batches", TF_SCOPE_ENGINE, TF_SETTING_INT, 0, 0, TF_MAX_PREFETCH, 1, 0, NULL, "never", "batches assembled ahead of the consumer (None: 2 x num_threads + 2; older name: prefetch)"}, NULL, 1, ENGINE(prefetch_batches)},
    {{"backend", TF_SCOPE_ENGINE, TF_SETTING_ENUM, TF_BACKEND_AUTO, 0, 3, 1, TF_BACKEND_AUTO, BACKEND_NAMES, "never", "how bytes come off storage: mmap, pread or io_uring (None: $TOKENFEED_BACKEND, else mmap)"}, NULL, 0, ENGINE(backend)},
    {{"direct_io", TF_SCOPE_ENGINE, TF_SETTING_BOOL, 0, 0, 1, 0, 0, NULL, "never", "io_uring reads with O_DIRECT (past the page cache)"}, NULL, 1, ENGINE(direct_io)},
    {{"zstd_cache_bytes", TF_SCOPE_ENGINE, TF_SETTING_INT, 0, 0, INT64_MAX, 1, 0, NULL, "never", "bytes of decompressed zstd blocks the workers share (None: sized from the shuffle)"}, NULL, 0, ENGINE(zstd_cache_bytes)},
    {{"balance", TF_SCOPE_ENGINE, TF_SETTING_ENUM, TF_BALANCE_NONE, 0, 3, 1, TF_BALANCE_NONE, BALANCE_NAMES, "never", "which rows of a step each data-parallel rank takes: none (contiguous slices), tokens or attention (equal work), strided (rows r, r + R, ...: OLMo-core's split; None: none)"}, NULL, 0, ENGINE(balance)},
    {{"balance_micro_batches", TF_SCOPE_ENGINE, TF_SETTING_INT, 1, 1, TF_MAX_BALANCE_MICRO_BATCHES, 0, 0, NULL, "never", "batches per optimizer step balanced together (gradient accumulation steps)"}, NULL, 0, ENGINE(balance_micro_batches)},
    {{"warmup_steps", TF_SCOPE_ENGINE, TF_SETTING_INT, 0, 0, UINT64_MAX, 0, 0, NULL, "never", "steps of sequence-length warmup, whose samples come cut into shorter rows (0: none)"}, NULL, 0, ENGINE(warmup_steps)},
    {{"warmup_min_seq_len", TF_SCOPE_ENGINE, TF_SETTING_INT, 0, 1, MAX_SEQ_LEN, 1, 0, NULL, "never", "row length at step 0 of the warmup, seq_len / 2^m (needed with warmup_steps; None: none)"}, NULL, 0, ENGINE(warmup_min_seq_len)},

    {{"device_prefetch_batches", TF_SCOPE_DEVICE, TF_SETTING_INT, 2, 1, 256, 1, 0, NULL, "never", "batches copied to the GPU ahead of the consumer (older name: device_prefetch)"}, NULL, 1, DEVICE(prefetch_batches)},
    {{"device_slots", TF_SCOPE_DEVICE, TF_SETTING_INT, 0, 2, 1024, 1, 0, NULL, "never", "device buffers in all, at least device_prefetch_batches + 1 (None: device_prefetch_batches + 2)"}, NULL, 1, DEVICE(device_slots)},
    /* remote reading (tf_remote_config): 0 is none, the row's default (tf_remote_create resolves it) */
    {{"cache_limit", TF_SCOPE_REMOTE, TF_SETTING_INT, 0, 1, UINT64_MAX, 1, 0, NULL, "never", "bytes of chunks the node's cache keeps, at least 4 chunks; fixed when the cache is created (None: 10% of its file system, 1 GB to half of it)"}, NULL, 0, REMOTE(cache_limit)},
    {{"chunk_bytes", TF_SCOPE_REMOTE, TF_SETTING_INT, 8u << 20, 64u << 10, 1u << 30, 1, 0, NULL, "never", "bytes per cached chunk, a multiple of 4096 (open(chunk_size=))"}, NULL, 0, REMOTE(chunk_bytes)},
    {{"prefetch_bytes", TF_SCOPE_REMOTE, TF_SETTING_INT, 0, 1, UINT64_MAX, 1, 0, NULL, "never", "bytes of distinct chunks requested ahead of the loader, at most the cache limit (None: half the cache limit, at most 2 GiB; older name: prefetch)"}, NULL, 0, REMOTE(prefetch_bytes)},
    {{"fetch_threads", TF_SCOPE_REMOTE, TF_SETTING_INT, 16, 1, TF_MAX_THREADS, 1, 0, NULL, "never", "concurrent range requests per process"}, NULL, 1, REMOTE(fetch_threads)},
    {{"max_attempts", TF_SCOPE_REMOTE, TF_SETTING_INT, 8, 1, 1000, 1, 0, NULL, "never", "attempts per request, the first included, before the error"}, NULL, 1, REMOTE(max_attempts)},
    {{"backoff_ms", TF_SCOPE_REMOTE, TF_SETTING_INT, 100, 1, UINT32_MAX, 1, 0, NULL, "never", "milliseconds before the first retry; doubles per retry, with full jitter"}, NULL, 0, REMOTE(backoff_ms)},
    {{"backoff_max_ms", TF_SCOPE_REMOTE, TF_SETTING_INT, 5000, 1, UINT32_MAX, 1, 0, NULL, "never", "milliseconds the retry delay grows to at most (at least backoff_ms)"}, NULL, 0, REMOTE(backoff_max_ms)},
    {{"deadline_ms", TF_SCOPE_REMOTE, TF_SETTING_INT, 30000, 1, 86400000, 1, 0, NULL, "never", "milliseconds per request, retries included (open(deadline=) in seconds)"}, NULL, 0, REMOTE(deadline_ms)},
};

const size_t tf__nsettings = sizeof tf__settings / sizeof tf__settings[0];

size_t tf_settings_count(void) { return tf__nsettings; }

const tf_setting *tf_setting_get(size_t i) { return i < tf__nsettings ? &tf__settings[i].pub : NULL; }

const tf__setting_row *tf__setting_row_find(const char *name) {
    for (size_t i = 0; name && i < tf__nsettings; i++)
        if (!strcmp(tf__settings[i].pub.name, name)) return &tf__settings[i];
    return NULL;
}

const tf_setting *tf_setting_find(const char *name) {
    const tf__setting_row *r = tf__setting_row_find(name);
    return r ? &r->pub : NULL;
}

int tf_setting_bounds(const char *name, int64_t *min, uint64_t *max) {
    const tf_setting *s = tf_setting_find(name);
    if (!s) TF_FAIL(-ENOENT, "no setting named %s", name ? name : "(null)");
    if (min) *min = s->min;
    if (max) *max = s->max;
    return 0;
}

/* ----------------------------------------------------------- values */

int64_t tf__setting_get(const tf__setting_row *r, const void *cfg) {
    const char *p = (const char *)cfg + r->offset;
    switch (r->size) {
    case 1: return r->is_signed ? (int64_t) * (const int8_t *)p : (int64_t) * (const uint8_t *)p;
    case 2: return r->is_signed ? (int64_t) * (const int16_t *)p : (int64_t) * (const uint16_t *)p;
    case 4: return r->is_signed ? (int64_t) * (const int32_t *)p : (int64_t) * (const uint32_t *)p;
    default: {
        int64_t v;
        memcpy(&v, p, sizeof v);
        return v;
    }
    }
}

void tf__setting_put(const tf__setting_row *r, void *cfg, int64_t v) {
    char *p = (char *)cfg + r->offset;
    switch (r->size) {
    case 1: *(uint8_t *)p = (uint8_t)v; break;
    case 2: *(uint16_t *)p = (uint16_t)v; break;
    case 4: *(uint32_t *)p = (uint32_t)v; break;
    default: memcpy(p, &v, sizeof v);
    }
}

/* Whether v (signed or not, as the row stores it) lies in the row's bounds. */
static int in_bounds(const tf__setting_row *r, int64_t v) {
    if (r->is_signed || r->pub.min < 0) return v >= r->pub.min && (v < 0 || (uint64_t)v <= r->pub.max);
    return (uint64_t)v >= (uint64_t)r->pub.min && (uint64_t)v <= r->pub.max;
}

void tf__settings_init(tf_setting_scope scope, void *cfg) {
    for (size_t i = 0; i < tf__nsettings; i++)
        if (tf__settings[i].pub.scope == scope) tf__setting_put(&tf__settings[i], cfg, tf__settings[i].pub.def);
}

int tf__setting_describe(const tf__setting_row *r, int64_t v, char *buf, size_t cap) {
    const tf_setting *s = &r->pub;
    if (s->nullable && v == s->none_value) return snprintf(buf, cap, "None");
    if (s->type == TF_SETTING_ENUM && v >= 0 && v <= (int64_t)s->max) return snprintf(buf, cap, "'%s'", s->names[v]);
    if (s->type == TF_SETTING_BOOL) return snprintf(buf, cap, v ? "True" : "False");
    if (r->is_signed || s->min < 0) return snprintf(buf, cap, "%lld", (long long)v);
    return snprintf(buf, cap, "%llu", (unsigned long long)v);
}

int tf__setting_check(const tf__setting_row *r, int64_t v) {
    if (in_bounds(r, v)) return 0;
    const tf_setting *s = &r->pub;
    char found[48];
    tf__setting_describe(r, v, found, sizeof found);
    if (s->type == TF_SETTING_ENUM) {
        char names[96] = "";
        for (int k = 0; s->names[k]; k++)
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s'%s' (%d)", k ? ", " : "", s->names[k], k);
        TF_FAIL(-EINVAL, "%s: expected one of %s, found %s", s->name, names, found);
    }
    if (r->is_signed || s->min < 0)
        TF_FAIL(-EINVAL, "%s: expected %lld <= %s <= %llu%s, found %s", s->name, (long long)s->min, s->name,
                (unsigned long long)s->max, s->nullable ? " (or None)" : "", found);
    TF_FAIL(-EINVAL, "%s: expected %llu <= %s <= %llu%s, found %s", s->name, (unsigned long long)s->min, s->name,
            (unsigned long long)s->max, s->nullable ? " (or None)" : "", found);
}

int tf__settings_check(tf_setting_scope scope, const void *cfg) {
    for (size_t i = 0; i < tf__nsettings; i++) {
        const tf__setting_row *r = &tf__settings[i];
        if (r->pub.scope != scope) continue;
        int64_t v = tf__setting_get(r, cfg);
        if (r->pub.nullable && v == r->pub.none_value) continue;
        TF_TRY(tf__setting_check(r, v));
    }
    return 0;
}

int tf__settings_resolve(tf_setting_scope scope, void *cfg) {
    for (size_t i = 0; i < tf__nsettings; i++) {
        const tf__setting_row *r = &tf__settings[i];
        if (r->pub.scope != scope) continue;
        int64_t v = tf__setting_get(r, cfg);
        if (r->pub.nullable && v == r->pub.none_value) tf__setting_put(r, cfg, r->pub.def);
        else TF_TRY(tf__setting_check(r, v));
    }
    return 0;
}

/* One atom of a row's condition: "always", "never", "mixture", "schedule",
 * "epochs" (a finite stream), or "<order enum row>=<name>" / "...!=<name>"
 * (shuffle=block, packing!=concat, order=olmo, ...), read through the rows
 * themselves so that a new kind or mode needs no case here. 0 with *v, or -1
 * for an atom this grammar does not have. */
static int atom(const char *a, size_t n, const tf__cond_ctx *x, int *v) {
    char w[64];
    if (n >= sizeof w) return -1;
    memcpy(w, a, n);
    w[n] = '\0';
    const tf_order_config *c = x ? x->cfg : NULL;
    if (!strcmp(w, "always")) return *v = 1, 0;
    if (!strcmp(w, "never")) return *v = 0, 0;
    if (!strcmp(w, "mixture")) return *v = x && x->mixture, 0;
    if (!strcmp(w, "schedule")) return *v = x && x->schedule, 0;
    if (!strcmp(w, "epochs")) return *v = c && c->epochs != 0, 0;
    char *eq = strchr(w, '=');
    if (!eq || eq == w) return -1;
    int neg = eq[-1] == '!';
    eq[neg ? -1 : 0] = '\0';
    const char *value = eq + 1;
    const tf__setting_row *r = tf__setting_row_find(w);
    if (!r || r->pub.scope != TF_SCOPE_ORDER || r->pub.type != TF_SETTING_ENUM || !r->pub.names) return -1;
    int64_t want = -1;
    for (int64_t i = 0; r->pub.names[i]; i++)
        if (!strcmp(r->pub.names[i], value)) want = i;
    if (want < 0) return -1;
    *v = c ? (tf__setting_get(r, c) == want) != neg : 0;
    return 0;
}

/* A condition: atoms joined by " or ". 0 with *v, -1 if an atom is unknown. */
static int eval(const char *w, const tf__cond_ctx *x, int *v) {
    *v = 0;
    for (const char *p = w;;) {
        const char *e = strstr(p, " or ");
        size_t n = e ? (size_t)(e - p) : strlen(p);
        int a = 0;
        if (atom(p, n, x, &a) < 0) return -1;
        *v = *v || a;
        if (!e) return 0;
        p = e + 4;
    }
}

static int holds(const char *w, const tf__cond_ctx *x) {
    int v;
    if (eval(w, x, &v) < 0) return 1; /* a condition the grammar does not have: compare, never ignore */
    return v;
}

int tf__setting_cond_valid(const char *w) {
    int v;
    return w && eval(w, NULL, &v) == 0;
}

int tf__setting_enters_stream(const tf__setting_row *r, const tf__cond_ctx *c) { return holds(r->pub.stream, c); }

int tf__setting_in_fingerprint(const tf__setting_row *r, const tf__cond_ctx *c) {
    return holds(r->fp ? r->fp : r->pub.stream, c);
}

static void *scope_base(tf_setting_scope scope, const tf__setting_row *r, void *cfg) {
    /* a loader config holds its order's settings in its `order` member */
    if (scope == TF_SCOPE_ENGINE && r->pub.scope == TF_SCOPE_ORDER) return &((tf_loader_config *)cfg)->order;
    return r->pub.scope == scope ? cfg : NULL;
}

int tf_config_set(tf_setting_scope scope, void *cfg, const char *name, int64_t value) {
    const tf__setting_row *r = tf__setting_row_find(name);
    TF_NEED_ARG(cfg);
    void *base = r ? scope_base(scope, r, cfg) : NULL;
    if (!base) TF_FAIL(-ENOENT, "no setting named %s in this configuration", name ? name : "(null)");
    if (!(r->pub.nullable && value == r->pub.none_value)) TF_TRY(tf__setting_check(r, value));
    tf__setting_put(r, base, value);
    return 0;
}

int tf_config_get(tf_setting_scope scope, const void *cfg, const char *name, int64_t *value) {
    const tf__setting_row *r = tf__setting_row_find(name);
    TF_NEED_ARG(cfg);
    TF_NEED_ARG(value);
    const void *base = r ? scope_base(scope, r, (void *)cfg) : NULL;
    if (!base) TF_FAIL(-ENOENT, "no setting named %s in this configuration", name ? name : "(null)");
    *value = tf__setting_get(r, base);
    return 0;
}
