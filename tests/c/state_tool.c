/*
 * state_tool.c — a C trainer's side of the loader state, for tests/order/test_state_c.py
 * (built there against the package's library; not one of the `make test`
 * programs).
 *
 *   state_tool save STATE K N A [B WA WB] [name=value ...]
 *       take K batches, write the loader's state to STATE, print the checksum
 *       of the next N batches
 *   state_tool load STATE N A [B WA WB] [--lenient] [name=value ...]
 *       resume from STATE, print the checksum of the next N batches
 *
 * A (with B and weights: a mixture of A and B). Settings are set by name
 * through the settings table (tf_config_set), as a trainer's config file
 * would; the defaults here are seq_len=16, batch_size=4, seed=3, int32 tokens.
 * Prints "checksum <16 hex digits> position <p>", after a load first one line
 * "excluded <position> <source> <id> ..." per takedown the state holds (the
 * order's, tf_loader_order); errors go to stderr with
 * tf_last_error() and exit 1.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenfeed.h"

static int fail(const char *what, int rc) {
    fprintf(stderr, "%s: %s (%s)\n", what, tf_last_error(), tf_strerror(rc));
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: state_tool save STATE K N A [B WA WB] [name=value ...] | load STATE N A ...\n");
        return 2;
    }
    int save = !strcmp(argv[1], "save");
    const char *state_path = argv[2];
    int a = 3, k = save ? atoi(argv[a++]) : 0, n = atoi(argv[a++]);
    const char *paths[2] = {argv[a++], NULL};
    double w[2] = {0, 0};
    if (a + 2 < argc && !strchr(argv[a], '=') && strncmp(argv[a], "--", 2)) {
        paths[1] = argv[a++];
        w[0] = atof(argv[a++]);
        w[1] = atof(argv[a++]);
    }
    tf_loader_config cfg;
    tf_loader_config_init(&cfg);
    cfg.order.seq_len = 16;
    cfg.order.seed = 3;
    cfg.batch_size = 4;
    cfg.out_dtype = TF_INT32;
    cfg.num_threads = 1;
    unsigned flags = 0;
    for (; a < argc; a++) {
        if (!strcmp(argv[a], "--lenient")) {
            flags |= TF_STATE_LENIENT;
            continue;
        }
        char name[64];
        const char *eq = strchr(argv[a], '=');
        if (!eq || (size_t)(eq - argv[a]) >= sizeof name) return fprintf(stderr, "bad setting %s\n", argv[a]), 2;
        memcpy(name, argv[a], (size_t)(eq - argv[a]));
        name[eq - argv[a]] = 0;
        const tf_setting *s = tf_setting_find(name);
        int64_t v = strtoll(eq + 1, NULL, 10);
        for (int e = 0; s && s->names && s->names[e]; e++)
            if (!strcmp(s->names[e], eq + 1)) v = e;
        int rc = tf_config_set(TF_SCOPE_ENGINE, &cfg, name, v); /* order settings go to cfg.order */
        if (rc) return fail(name, rc);
    }
    tf_dataset *ds[2] = {NULL, NULL};
    tf_loader *l = NULL;
    int rc = 0;
    for (int i = 0; i < 2 && !rc; i++)
        if (paths[i]) rc = tf_dataset_open(paths[i], NULL, &ds[i]);
    if (rc) return fail("open", rc);
    rc = paths[1] ? tf_loader_create_mix((const tf_dataset *const *)ds, w, 2, &cfg, &l) : tf_loader_create(ds[0], &cfg, &l);
    if (rc) return fail("create", rc);
    tf_batch *b;
    for (int i = 0; i < k; i++) {
        if ((rc = tf_loader_next(l, &b))) return fail("next", rc);
        tf_batch_release(b);
    }
    if (save) {
        size_t len;
        tf_loader_state_save(l, NULL, 0, &len); /* -ENOSPC: sizes the buffer */
        char *text = malloc(len + 1);
        if (!text || (rc = tf_loader_state_save(l, text, len + 1, &len))) return fail("state_save", rc);
        FILE *f = fopen(state_path, "w");
        if (!f || fwrite(text, 1, len, f) != len || fclose(f)) return perror(state_path), 1;
        free(text);
    } else {
        char text[1 << 16];
        FILE *f = fopen(state_path, "r");
        if (!f) return perror(state_path), 1;
        size_t len = fread(text, 1, sizeof text, f);
        fclose(f);
        if ((rc = tf_loader_state_load(l, text, len, flags))) return fail("state_load", rc);
        const tf_order *o = tf_loader_order(l);
        for (size_t i = 0; i < tf_order_num_excluded(o); i++) {
            uint64_t at;
            size_t src, m;
            const uint64_t *ids;
            if ((rc = tf_order_excluded(o, i, &at, &src, &ids, &m))) return fail("excluded", rc);
            printf("excluded %llu %zu", (unsigned long long)at, src);
            for (size_t j = 0; j < m; j++) printf(" %llu", (unsigned long long)ids[j]);
            printf("\n");
        }
    }
    uint64_t h = 0xCBF29CE484222325ULL;
    for (int i = 0; i < n; i++) {
        if ((rc = tf_loader_next(l, &b))) return fail("next", rc);
        tf_batch_view v;
        tf_batch_get_view(b, &v);
        const int32_t *t = v.tokens;
        for (uint64_t j = 0; j < v.rows * (v.seq_len + 1); j++) h = (h ^ (uint64_t)(uint32_t)t[j]) * 0x100000001B3ULL;
        tf_batch_release(b);
    }
    printf("checksum %016llx position %llu\n", (unsigned long long)h, (unsigned long long)tf_loader_position(l));
    tf_loader_free(l);
    for (int i = 0; i < 2; i++) tf_dataset_free(ds[i]);
    return 0;
}
