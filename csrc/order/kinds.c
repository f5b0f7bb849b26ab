/*
 * kinds.c — the registry of order kinds a configuration can name
 * (tf_order_config.order): for each, what the rest of the library asks of it.
 * order.c builds an order through its row, state.c mixes its fingerprint in,
 * a mixture asks whether it can be one's source, the engine how many
 * processes it means by 0. Adding a kind is a row here, its constructor, and
 * its name in the settings table's enum; no `if` on the kind elsewhere.
 */
#include "kind.h"

static const tf__order_kind kinds[] = {
    /* tokenfeed's own order: concat or packed by cfg.packing */
    {TF_ORDER_TOKENFEED, "tokenfeed", NULL, 1, 0, NULL, 1, 0},
    /* llm.c's data loader: each file cut on its own; 0 processes: the ranks (tf_loader_create) */
    {TF_ORDER_LLMC, "llmc", tf__llmc_init, 0, 0, tf__llmc_kind_fp, 0, 1},
    /* OLMo-core's NumpyFSLDataset: every instance ends in pad_id */
    {TF_ORDER_OLMO, "olmo", tf__olmo_init, 1, 1, tf__olmo_kind_fp, 0, 0},
};

const tf__order_kind *tf__order_kind_of(int order) {
    for (size_t i = 0; i < sizeof kinds / sizeof *kinds; i++)
        if ((int)kinds[i].id == order) return &kinds[i];
    return NULL;
}
