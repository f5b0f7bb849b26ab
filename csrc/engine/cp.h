/*
 * cp.h — what one context-parallel rank takes of a sample (docs/packing.md,
 * "Context parallelism"). Pure index arithmetic, shared by the batch fill.
 *
 * Plain split: the L input positions are cut into 2*cp chunks of c = L/(2cp);
 * rank r takes chunks r and 2cp-1-r (Megatron-Core / TransformerEngine
 * get_batch_on_this_cp_rank).
 *
 * THD: every segment of the row (the sequences its cu_seqlens gives without
 * CP) is padded to a multiple of 2cp, cut into 2cp chunks, and rank r takes
 * chunks r and 2cp-1-r of each, segment after segment (TransformerEngine
 * thd_get_partitioned_indices). A piece is a run of consecutive output
 * entries: `len` real input positions starting at row position `src`, or
 * (src == TF_CP_PAD) `len` padding entries; `pos` is the position id of its
 * first entry (the offset inside its padded segment).
 */
#ifndef TF_CP_H
#define TF_CP_H

#include "../common/internal.h"

#define TF_CP_PAD UINT64_MAX

typedef struct tf__cp_piece {
    uint64_t src; /* row input position of the first entry, or TF_CP_PAD */
    uint64_t len;
    uint64_t pos; /* position id of the first entry */
} tf__cp_piece;

/* Plain split: first input position of rank r's two chunks and the chunk
 * length. -EINVAL (with a message) when L is not a multiple of 2*cp. */
TF_HIDDEN int tf__cp_chunks(uint64_t L, uint32_t cp, uint32_t r, uint64_t first[2], uint64_t *c);

/* THD: the pieces of rank r for a row whose segments have the lengths
 * seg[0..n) (summing to the row's L input positions). At most 4 pieces per
 * segment: out must hold 4*n. *local = entries this rank gets (sum of the
 * padded lengths / cp); padded[j] receives segment j's padded length when
 * padded is not NULL. */
TF_HIDDEN size_t tf__cp_thd_pieces(const uint64_t *seg, size_t n, uint32_t cp, uint32_t r, tf__cp_piece *out,
                                   uint64_t *local, uint64_t *padded);

#endif
