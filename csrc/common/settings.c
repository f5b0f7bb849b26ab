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
 * never change). tests/order/test_settings.py checks that _core.pyi and the docs' option
 * tables name every row.
 */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "settings.h"

#define ORDER(m) .offset = offsetof(tf_order_config, m), .size = sizeof(((tf_order_config *)0)->m)
#define ENGINE(m) .offset = offsetof(tf_loader_config, m), .size = sizeof(((tf_loader_config *)0)->m)
#define DEVICE(m) .offset = offsetof(tf_device_config, m), .size = sizeof(((tf_device_config *)0)->m)
#define REMOTE(m) .offset = offsetof(tf_remote_config, m), .size = sizeof(((tf_remote_config *)0)->m)

static const char *const PACKING_NAMES[] = {"concat", "best_fit", "document", NULL};
static const char *const SHUFFLE_NAMES[] = {"none", "full", "block", NULL};
static const char *const BACKEND_NAMES[] = {"auto", "mmap", "pread", "io_uring", NULL};
static const char *const BALANCE_NAMES[] = {"none", "tokens", "attention", "strided", NULL};
static const char *const ORDER_NAMES[] = {"tokenfeed", "llmc", "olmo", "megatron", NULL};
static const char *const SPLIT_NAMES[] = {"train", "valid", "test", NULL};

/* Largest seq_len: extras are int32 and cu_seqlens holds L itself. */
#define MAX_SEQ_LEN ((uint64_t)INT32_MAX - 1)

/* One row per setting, in designated initializers (fields left out are 0 /
 * NULL: not nullable, no enum names, the fingerprint's condition the same as
 * the stream's, an unsigned member); ORDER() and the others say where the
 * value lives. The order rows are in fingerprint order. */
const tf__setting_row tf__settings[] = {
    {.pub = {.name = "seq_len", .scope = TF_SCOPE_ORDER, .type = TF_SETTING_INT, .def = 2048, .min = 1,
             .max = MAX_SEQ_LEN, .stream = "always",
             .description = "tokens per sample the model sees (a sample holds seq_len + 1 tokens)"},
     ORDER(seq_len)},
    {.pub = {.name = "packing", .scope = TF_SCOPE_ORDER, .type = TF_SETTING_ENUM, .def = TF_PACK_CONCAT, .min = 0,
             .max = 2, .names = PACKING_NAMES, .stream = "always",
             .description = "how documents become samples: concat, best_fit or document"},
     ORDER(packing)},
    {.pub = {.name = "separator_id", .scope = TF_SCOPE_ORDER, .type = TF_SETTING_INT, .def = -1, .min = -1,
             .max = INT64_MAX, .nullable = 1, .none_value = -1, .stream = "always",
             .description = "token inserted after every document (None: none)"},
     .is_signed = 1, ORDER(separator_id)},
    {.pub = {.name = "seed", .scope = TF_SCOPE_ORDER, .type = TF_SETTING_INT, .def = 0, .min = 0, .max = UINT64_MAX,
             .stream = "shuffle!=none", .description = "seed of the shuffle (and of each mixture source's own)"},
     .fp = "always", ORDER(seed)},
    {.pub = {.name = "shuffle", .scope = TF_SCOPE_ORDER, .type = TF_SETTING_ENUM, .def = TF_SHUFFLE_FULL, .min = 0,
             .max = 2, .names = SHUFFLE_NAMES, .stream = "always",
             .description = "order of the samples within an epoch: none, full or block"},
     ORDER(shuffle)},
    {.pub = {.name = "block_size", .scope = TF_SCOPE_ORDER, .type = TF_SETTING_INT, .def = 1024, .min = 1,
             .max = UINT64_MAX, .stream = "shuffle=block", .description = "samples per block of the block shuffle"},
     ORDER(block_size)},
    {.pub = {.name = "window_blocks", .scope = TF_SCOPE_ORDER, .type = TF_SETTING_INT, .def = 16, .min = 1,
             .max = UINT64_MAX, .stream = "shuffle=block", .description = "blocks per window of the block shuffle"},
     ORDER(window_blocks)},
    {.pub = {.name = "global_batch", .scope = TF_SCOPE_ORDER, .type = TF_SETTING_INT, .def = 1, .min = 1,
             .max = UINT64_MAX, .stream = "always",
             .description = "samples per step over all data-parallel ranks (batch_size x dp_size)"},
     .fp = "always", ORDER(global_batch)},
    {.pub = {.name = "epochs", .scope = TF_SCOPE_ORDER, .type = TF_SETTING_INT, .def = 0, .min = 0,
             .max = UINT64_MAX, .nullable = 1, .stream = "always",
             .description = "passes over the data before the stream ends (None: endless)"},
     ORDER(epochs)},
    {.pub = {.name = "pad_id", .scope = TF_SCOPE_ORDER, .type = TF_SETTING_INT, .def = 0, .min = 0, .max = INT64_MAX,
             .stream = "packing!=concat or order=olmo",
             .description = "token that fills the rest of a packed sample (and ends an OLMo instance)"},
     .is_signed = 1, ORDER(pad_id)},
    {.pub = {.name = "pack_window", .scope = TF_SCOPE_ORDER, .type = TF_SETTING_INT, .def = 1024, .min = 1,
             .max = TF__MAX_PACK_WINDOW, .stream = "packing=best_fit",
             .description = "documents per best_fit packing window"},
     ORDER(pack_window)},
    {.pub = {.name = "mix_window", .scope = TF_SCOPE_ORDER, .type = TF_SETTING_INT, .def = 1000, .min = 1,
             .max = 1u << 20, .stream = "mixture",
             .description = "positions per mixing window, over which the weights become exact counts"},
     ORDER(mix_window)},
    {.pub = {.name = "order", .scope = TF_SCOPE_ORDER, .type = TF_SETTING_ENUM, .def = TF_ORDER_TOKENFEED, .min = 0,
             .max = 3, .names = ORDER_NAMES, .stream = "always",
             .description = "whose order of samples: tokenfeed's, or llmc / olmo / megatron to continue a run begun "
                             "on llm.c's or OLMo-core's loader or Megatron-core's GPTDataset"},
     .fp = "order!=tokenfeed", .is_signed = 1, ORDER(order)},
    {.pub = {.name = "llmc_processes", .scope = TF_SCOPE_ORDER, .type = TF_SETTING_INT, .def = 1, .min = 1,
             .max = UINT32_MAX, .nullable = 1, .stream = "order=llmc",
             .description = "llm.c's number of processes, each shuffling on its own (None: the data-parallel size)"},
     ORDER(llmc_processes)},
    {.pub = {.name = "olmo_chunk", .scope = TF_SCOPE_ORDER, .type = TF_SETTING_INT, .def = 1, .min = 1,
             .max = UINT32_MAX, .nullable = 1, .stream = "order=olmo",
             .description = "OLMo's max_target_sequence_length / seq_len: instances shuffled in runs of this many "
                             "(None: 1)"},
     ORDER(olmo_chunk)},
    /* Megatron's order: where its index cache is (a path: what the cache
     * holds enters the state through the order's fingerprint of it, so a
     * cache moved elsewhere still resumes), which split's, and the option
     * the cache does not record */
    {.pub = {.name = "megatron_cache", .scope = TF_SCOPE_ORDER, .type = TF_SETTING_PATH, .def = 0, .min = 0,
             .max = 0, .nullable = 1, .none_value = 0, .stream = "order=megatron",
             .description = "Megatron-core's path_to_cache (--data-cache-path) holding GPTDataset's index cache, or "
                             "one of that cache's files"},
     .fp = "never", ORDER(megatron_cache)},
    {.pub = {.name = "megatron_split", .scope = TF_SCOPE_ORDER, .type = TF_SETTING_ENUM, .def = TF_MEGATRON_TRAIN,
             .min = 0, .max = 2, .names = SPLIT_NAMES, .stream = "order=megatron",
             .description = "the split whose GPTDataset cache megatron_cache's directory holds: train, valid or test"},
     ORDER(megatron_split)},
    {.pub = {.name = "megatron_add_extra_token", .scope = TF_SCOPE_ORDER, .type = TF_SETTING_BOOL, .def = 1,
             .min = 0, .max = 1, .stream = "order=megatron",
             .description = "GPTDatasetConfig.add_extra_token_to_sequence the cache was built with"},
     .is_signed = 1, ORDER(megatron_add_extra_token)},

    {.pub = {.name = "batch_size", .scope = TF_SCOPE_ENGINE, .type = TF_SETTING_INT, .def = 8, .min = 1,
             .max = UINT64_MAX, .stream = "never", .description = "samples per data-parallel rank per batch"},
     ENGINE(batch_size)},
    {.pub = {.name = "dp_rank", .scope = TF_SCOPE_ENGINE, .type = TF_SETTING_INT, .def = 0, .min = 0,
             .max = UINT32_MAX - 1, .stream = "never",
             .description = "data-parallel rank: which slice of every global batch (older name: rank)"},
     ENGINE(rank)},
    {.pub = {.name = "dp_size", .scope = TF_SCOPE_ENGINE, .type = TF_SETTING_INT, .def = 1, .min = 1,
             .max = UINT32_MAX, .stream = "never",
             .description = "data-parallel ranks the global batch is split over (older name: world_size)"},
     ENGINE(world_size)},
    {.pub = {.name = "cp_rank", .scope = TF_SCOPE_ENGINE, .type = TF_SETTING_INT, .def = 0, .min = 0,
             .max = UINT32_MAX - 1, .stream = "never",
             .description = "context-parallel rank: which share of every sample"},
     ENGINE(cp_rank)},
    {.pub = {.name = "cp_size", .scope = TF_SCOPE_ENGINE, .type = TF_SETTING_INT, .def = 1, .min = 1,
             .max = UINT32_MAX, .nullable = 1, .stream = "never",
             .description = "context-parallel ranks every sample is shared over (None: 1, no split)"},
     ENGINE(cp_size)},
    {.pub = {.name = "num_threads", .scope = TF_SCOPE_ENGINE, .type = TF_SETTING_INT, .def = 0, .min = 0,
             .max = TF_MAX_THREADS, .nullable = 1, .stream = "never",
             .description = "worker threads assembling batches (None: the engine's choice for the backend)"},
     .is_signed = 1, ENGINE(num_threads)},
    {.pub = {.name = "prefetch_batches", .scope = TF_SCOPE_ENGINE, .type = TF_SETTING_INT, .def = 0, .min = 0,
             .max = TF_MAX_PREFETCH, .nullable = 1, .stream = "never",
             .description = "batches assembled ahead of the consumer (None: 2 x num_threads + 2; older name: "
                             "prefetch)"},
     .is_signed = 1, ENGINE(prefetch_batches)},
    {.pub = {.name = "backend", .scope = TF_SCOPE_ENGINE, .type = TF_SETTING_ENUM, .def = TF_BACKEND_AUTO, .min = 0,
             .max = 3, .nullable = 1, .none_value = TF_BACKEND_AUTO, .names = BACKEND_NAMES, .stream = "never",
             .description = "how bytes come off storage: mmap, pread or io_uring (None: $TOKENFEED_BACKEND, else "
                             "mmap)"},
     ENGINE(backend)},
    {.pub = {.name = "direct_io", .scope = TF_SCOPE_ENGINE, .type = TF_SETTING_BOOL, .def = 0, .min = 0, .max = 1,
             .stream = "never", .description = "io_uring reads with O_DIRECT (past the page cache)"},
     .is_signed = 1, ENGINE(direct_io)},
    {.pub = {.name = "zstd_cache_bytes", .scope = TF_SCOPE_ENGINE, .type = TF_SETTING_INT, .def = 0, .min = 0,
             .max = INT64_MAX, .nullable = 1, .stream = "never",
             .description = "bytes of decompressed zstd blocks the workers share (None: sized from the shuffle)"},
     ENGINE(zstd_cache_bytes)},
    {.pub = {.name = "balance", .scope = TF_SCOPE_ENGINE, .type = TF_SETTING_ENUM, .def = TF_BALANCE_NONE, .min = 0,
             .max = 3, .nullable = 1, .none_value = TF_BALANCE_NONE, .names = BALANCE_NAMES, .stream = "never",
             .description = "which rows of a step each data-parallel rank takes: none (contiguous slices), tokens or "
                             "attention (equal work), strided (rows r, r + R, ...: OLMo-core's split; None: none)"},
     ENGINE(balance)},
    {.pub = {.name = "balance_micro_batches", .scope = TF_SCOPE_ENGINE, .type = TF_SETTING_INT, .def = 1, .min = 1,
             .max = TF_MAX_BALANCE_MICRO_BATCHES, .stream = "never",
             .description = "batches per optimizer step balanced together (gradient accumulation steps)"},
     ENGINE(balance_micro_batches)},
    {.pub = {.name = "warmup_steps", .scope = TF_SCOPE_ENGINE, .type = TF_SETTING_INT, .def = 0, .min = 0,
             .max = UINT64_MAX, .stream = "never",
             .description = "steps of sequence-length warmup, whose samples come cut into shorter rows (0: none)"},
     ENGINE(warmup_steps)},
    {.pub = {.name = "warmup_min_seq_len", .scope = TF_SCOPE_ENGINE, .type = TF_SETTING_INT, .def = 0, .min = 1,
             .max = MAX_SEQ_LEN, .nullable = 1, .stream = "never",
             .description = "row length at step 0 of the warmup, seq_len / 2^m (needed with warmup_steps; None: "
                             "none)"},
     ENGINE(warmup_min_seq_len)},

    {.pub = {.name = "device_prefetch_batches", .scope = TF_SCOPE_DEVICE, .type = TF_SETTING_INT, .def = 2, .min = 1,
             .max = 256, .nullable = 1, .stream = "never",
             .description = "batches copied to the GPU ahead of the consumer (older name: device_prefetch)"},
     .is_signed = 1, DEVICE(prefetch_batches)},
    {.pub = {.name = "device_slots", .scope = TF_SCOPE_DEVICE, .type = TF_SETTING_INT, .def = 0, .min = 2,
             .max = 1024, .nullable = 1, .stream = "never",
             .description = "device buffers in all, at least device_prefetch_batches + 1 (None: "
                             "device_prefetch_batches + 2)"},
     .is_signed = 1, DEVICE(device_slots)},
    /* remote reading (tf_remote_config): 0 is none, the row's default (tf_remote_create resolves it) */
    {.pub = {.name = "cache_limit", .scope = TF_SCOPE_REMOTE, .type = TF_SETTING_INT, .def = 0, .min = 1,
             .max = UINT64_MAX, .nullable = 1, .stream = "never",
             .description = "bytes of chunks the node's cache keeps, at least 4 chunks; fixed when the cache is "
                             "created (None: 10% of its file system, 1 GB to half of it)"},
     REMOTE(cache_limit)},
    {.pub = {.name = "chunk_bytes", .scope = TF_SCOPE_REMOTE, .type = TF_SETTING_INT, .def = 8u << 20,
             .min = 64u << 10, .max = 1u << 30, .nullable = 1, .stream = "never",
             .description = "bytes per cached chunk, a multiple of 4096 (open(chunk_size=))"},
     REMOTE(chunk_bytes)},
    {.pub = {.name = "prefetch_bytes", .scope = TF_SCOPE_REMOTE, .type = TF_SETTING_INT, .def = 0, .min = 1,
             .max = UINT64_MAX, .nullable = 1, .stream = "never",
             .description = "bytes of distinct chunks requested ahead of the loader, at most the cache limit (None: "
                             "half the cache limit, at most 2 GiB; older name: prefetch)"},
     REMOTE(prefetch_bytes)},
    {.pub = {.name = "fetch_threads", .scope = TF_SCOPE_REMOTE, .type = TF_SETTING_INT, .def = 16, .min = 1,
             .max = TF_MAX_THREADS, .nullable = 1, .stream = "never",
             .description = "concurrent range requests per process"},
     .is_signed = 1, REMOTE(fetch_threads)},
    {.pub = {.name = "max_attempts", .scope = TF_SCOPE_REMOTE, .type = TF_SETTING_INT, .def = 8, .min = 1,
             .max = 1000, .nullable = 1, .stream = "never",
             .description = "attempts per request, the first included, before the error"},
     .is_signed = 1, REMOTE(max_attempts)},
    {.pub = {.name = "backoff_ms", .scope = TF_SCOPE_REMOTE, .type = TF_SETTING_INT, .def = 100, .min = 1,
             .max = UINT32_MAX, .nullable = 1, .stream = "never",
             .description = "milliseconds before the first retry; doubles per retry, with full jitter"},
     REMOTE(backoff_ms)},
    {.pub = {.name = "backoff_max_ms", .scope = TF_SCOPE_REMOTE, .type = TF_SETTING_INT, .def = 5000, .min = 1,
             .max = UINT32_MAX, .nullable = 1, .stream = "never",
             .description = "milliseconds the retry delay grows to at most (at least backoff_ms)"},
     REMOTE(backoff_max_ms)},
    {.pub = {.name = "deadline_ms", .scope = TF_SCOPE_REMOTE, .type = TF_SETTING_INT, .def = 30000, .min = 1,
             .max = 86400000, .nullable = 1, .stream = "never",
             .description = "milliseconds per request, retries included (open(deadline=) in seconds)"},
     REMOTE(deadline_ms)},
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
    if (r->pub.type == TF_SETTING_PATH) return 0; /* no integer value (tf__setting_path) */
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

const char *tf__setting_path(const tf__setting_row *r, const void *cfg) {
    if (r->pub.type != TF_SETTING_PATH) return NULL;
    const char *v;
    memcpy(&v, (const char *)cfg + r->offset, sizeof v);
    return v;
}

void tf__setting_put(const tf__setting_row *r, void *cfg, int64_t v) {
    char *p = (char *)cfg + r->offset;
    if (r->pub.type == TF_SETTING_PATH) { /* only none (a default, a state's null) */
        const char *none = NULL;
        memcpy(p, &none, sizeof none);
        return;
    }
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
    if (r->pub.type == TF_SETTING_PATH || in_bounds(r, v)) return 0;
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

/* A path given where its condition does not hold would be ignored: refused,
 * naming the condition (megatron_cache without order=megatron). */
static int check_path(const tf__setting_row *r, const void *cfg) {
    const char *p = tf__setting_path(r, cfg);
    if (!p || r->pub.scope != TF_SCOPE_ORDER || tf__setting_enters_stream(r, &(tf__cond_ctx){cfg, 0, 0})) return 0;
    TF_FAIL(-EINVAL, "%s: given (%.200s) where it is not read: it is read when %s", r->pub.name, p, r->pub.stream);
}

int tf__settings_check(tf_setting_scope scope, const void *cfg) {
    for (size_t i = 0; i < tf__nsettings; i++) {
        const tf__setting_row *r = &tf__settings[i];
        if (r->pub.scope != scope) continue;
        if (r->pub.type == TF_SETTING_PATH) {
            TF_TRY(check_path(r, cfg));
            continue;
        }
        int64_t v = tf__setting_get(r, cfg);
        if (r->pub.nullable && v == r->pub.none_value) continue;
        TF_TRY(tf__setting_check(r, v));
    }
    return 0;
}

int tf__settings_resolve(tf_setting_scope scope, void *cfg) {
    for (size_t i = 0; i < tf__nsettings; i++) {
        const tf__setting_row *r = &tf__settings[i];
        if (r->pub.scope != scope || r->pub.type == TF_SETTING_PATH) continue;
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
    if (r->pub.type == TF_SETTING_PATH && value != r->pub.none_value)
        TF_FAIL(-EINVAL, "%s is a path: set it with tf_config_set_path", name);
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

int tf_config_set_path(tf_setting_scope scope, void *cfg, const char *name, const char *path) {
    const tf__setting_row *r = tf__setting_row_find(name);
    TF_NEED_ARG(cfg);
    void *base = r ? scope_base(scope, r, cfg) : NULL;
    if (!base) TF_FAIL(-ENOENT, "no setting named %s in this configuration", name ? name : "(null)");
    if (r->pub.type != TF_SETTING_PATH) TF_FAIL(-EINVAL, "%s is not a path: set it with tf_config_set", name);
    memcpy((char *)base + r->offset, &path, sizeof path);
    return 0;
}

int tf_config_get_path(tf_setting_scope scope, const void *cfg, const char *name, const char **path) {
    const tf__setting_row *r = tf__setting_row_find(name);
    TF_NEED_ARG(cfg);
    TF_NEED_ARG(path);
    const void *base = r ? scope_base(scope, r, (void *)cfg) : NULL;
    if (!base) TF_FAIL(-ENOENT, "no setting named %s in this configuration", name ? name : "(null)");
    if (r->pub.type != TF_SETTING_PATH) TF_FAIL(-EINVAL, "%s is not a path: read it with tf_config_get", name);
    *path = tf__setting_path(r, base);
    return 0;
}
