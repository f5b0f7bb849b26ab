/*
 * kinds.c — the registry of order kinds a configuration can name
 * (tf_order_config.order): for each, what the rest of the library asks of it.
 * order.c builds an order through its row, state.c mixes its fingerprint in,
 * a mixture asks whether it can be one's source, the engine how many
 * processes it means by 0. Adding a kind is a row here, its constructor, and
 * its name in the settings table's enum; no `if` on the kind elsewhere.
 *
 * The state's rule for another loader's order: its config names the kind
 * (the `order` setting) and holds the kind's settings; the config
 * fingerprint mixes in the kind's own fingerprint: kind_fp(config) when the
 * configuration determines it (llm.c, OLMo), or, for a kind whose order
 * reads data of its own (data_fp: Megatron's index cache), the fingerprint
 * the order took of that data, which the state records as "order": [name,
 * fingerprint] (null for every other kind).
 */
#include <string.h>

#include "kind.h"

static const tf__order_kind kinds[] = {
    /* tokenfeed's own order: concat or packed by cfg.packing */
    {TF_ORDER_TOKENFEED, "tokenfeed", NULL, 1, 0, NULL, 1, 0, NULL},
    /* llm.c's data loader: each file cut on its own; 0 processes: the ranks (tf_loader_create) */
    {TF_ORDER_LLMC, "llmc", tf__llmc_init, 0, 0, tf__llmc_kind_fp, 0, 1, NULL},
    /* OLMo-core's NumpyFSLDataset: every instance ends in pad_id */
    {TF_ORDER_OLMO, "olmo", tf__olmo_init, 1, 1, tf__olmo_kind_fp, 0, 0, NULL},
    /* Megatron-core's GPTDataset, read from its index cache (cfg.megatron_cache):
     * the cache decides the samples, so neither ids nor documents are checked
     * first; its fingerprint is the cache's */
    {TF_ORDER_MEGATRON, "megatron", tf__megatron_init, 0, 0, NULL, 0, 0, "the Megatron index cache"},
};

const tf__order_kind *tf__order_kind_of(int order) {
    for (size_t i = 0; i < sizeof kinds / sizeof *kinds; i++)
        if ((int)kinds[i].id == order) return &kinds[i];
    return NULL;
}

const tf__order_kind *tf__order_kind_named(const char *name) {
    for (size_t i = 0; name && i < sizeof kinds / sizeof *kinds; i++)
        if (!strcmp(kinds[i].name, name)) return &kinds[i];
    return NULL;
}
