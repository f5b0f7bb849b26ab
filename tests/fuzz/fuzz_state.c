/* Fuzz target: the loader state reader (tf_order_state_load, and the JSON
 * reader under it) against a small order of a memory dataset.
 *
 * Byte 0: bit 0 picks the order (0: one dataset, 1: a mixture of two, with a
 * weight change and a skipped range recorded), bit 1 the input's use (0: the
 * rest of the bytes are the state; 1: the order's own state with the rest
 * written over it at the offset in bytes 1-2, little-endian, so that edits of
 * a valid state reach the checks past the fingerprints), bit 2 the lenient
 * flag. A state that loads is saved again from the order that reads on, and
 * that text must load too. */
#include "fuzz_util.h"

static tf_dataset *ds[2];

static tf_dataset *memory_dataset(uint64_t T, uint16_t mul) {
    uint16_t *t = malloc(T * sizeof *t);
    uint64_t ends[4] = {T / 4, T / 2, 3 * T / 4, T};
    tf_dataset *d = NULL;
    if (!t) return NULL;
    for (uint64_t i = 0; i < T; i++) t[i] = (uint16_t)((i * mul) % 60000);
    if (tf_dataset_from_memory(t, T, TF_UINT16, ends, 4, 0, &d)) d = NULL;
    free(t);
    return d;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > (1u << 20)) return 0;
    if (!ds[0]) {
        ds[0] = memory_dataset(1001, 1);
        ds[1] = memory_dataset(2001, 7);
        if (!ds[0] || !ds[1]) abort();
    }
    tf_order_config c;
    tf_order_config_init(&c);
    c.seq_len = 10;
    c.global_batch = 2;
    tf_order *o = NULL, *live = NULL;
    double w[2] = {0.5, 0.5}, w2[2] = {0.25, 0.75};
    if (data[0] & 1) {
        if (tf_order_create_mix((const tf_dataset *const *)ds, w, 2, &c, &o)) abort();
        if (tf_order_mix_set_weights(o, 4, w2, 2, &live)) abort();
        tf_order_free(o);
        o = live;
    } else if (tf_order_create(ds[0], &c, &o)) {
        abort();
    }
    if (tf_order_skip(o, 8, 12)) abort();
    char *text = NULL;
    size_t len = 0;
    if (data[0] & 2) { /* the order's own state, written over */
        size_t own = 0;
        if (tf_order_state_save(o, 6, 1, NULL, 0, &own) != -ENOSPC) abort();
        size_t off = size >= 3 ? (size_t)(data[1] | data[2] << 8) % (own + 1) : 0;
        size_t add = size >= 3 ? size - 3 : 0;
        len = off + add > own ? off + add : own;
        text = malloc(len + 1);
        if (!text || tf_order_state_save(o, 6, 1, text, own + 1, &own)) abort();
        if (add) memcpy(text + off, data + 3, add);
    } else {
        len = size - 1;
        text = malloc(len + 1);
        if (!text) abort();
        memcpy(text, data + 1, len);
    }
    uint64_t pos = 0;
    tf_order *h = NULL;
    unsigned flags = data[0] & 4 ? TF_STATE_LENIENT : 0;
    int rc = tf_order_state_load(o, text, len, flags, &pos, &h);
    if (rc > 0 || (rc < 0 && !*tf_last_error())) abort(); /* every refusal says why */
    if (rc == 0) { /* what loads, saves, and loads again */
        const tf_order *on = h ? h : o;
        size_t n = 0;
        if (tf_order_state_save(on, pos, 1, NULL, 0, &n) != -ENOSPC) abort();
        char *again = malloc(n + 1);
        if (!again || tf_order_state_save(on, pos, 1, again, n + 1, &n)) abort();
        uint64_t pos2 = 0;
        tf_order *h2 = NULL;
        if (tf_order_state_load(on, again, n, 0, &pos2, &h2) || pos2 != pos) abort();
        tf_order_free(h2);
        free(again);
    }
    tf_order_free(h);
    tf_order_free(o);
    free(text);
    return 0;
}
