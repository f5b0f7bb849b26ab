"""Reference context-parallel layouts, written from the published implementations.

The Loader's CP output is checked against these, so they follow their sources'
arithmetic rather than tokenfeed's:

- ``megatron_cp_split``: Megatron-Core ``megatron/core/utils.py``
  ``get_batch_on_this_cp_rank`` (pretraining path): the sequence dim is viewed as
  ``[2 * cp_size, seq_len // (2 * cp_size)]`` and ``index_select`` keeps chunks
  ``[cp_rank, 2 * cp_size - cp_rank - 1]``, then the two are flattened back.
- ``te_thd_partitioned_indices``: TransformerEngine
  ``transformer_engine/common/fused_attn/context_parallel.cu``,
  ``thd_partition_indices_kernel`` (behind ``tex.thd_get_partitioned_indices``): for
  every local token, a binary search over ``cu_seqlens / world_size`` finds its
  sequence; the first half of the sequence's local tokens come from chunk ``rank`` and
  the second half from chunk ``2 * world_size - 1 - rank``.
- ``te_pad_thd``/``te_positions_thd``: TransformerEngine
  ``transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py``
  ``pad_thd_sequences_for_cp`` (every sequence padded at its end to a multiple of the
  divisibility factor ``2 * cp_size``; ``cu_seqlens_padded`` the cumulative padded
  lengths) and ``generate_positional_ids_for_cp`` (positions restart at 0 for each
  sequence and continue through its padding).

NumPy only, so the tests need no GPU, TransformerEngine or Megatron.
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import numpy as np


def megatron_cp_split(x: np.ndarray, cp_size: int, cp_rank: int, seq_dim: int = 1) -> np.ndarray:
    """This CP rank's part of ``x`` along ``seq_dim`` (Megatron-Core ``get_batch_on_this_cp_rank``)."""
    if cp_size == 1:
        return x
    s = x.shape[seq_dim]
    assert s % (2 * cp_size) == 0, "Megatron asserts seq_length % (2 * context_parallel_size) == 0"
    v = x.reshape(*x.shape[:seq_dim], 2 * cp_size, s // (2 * cp_size), *x.shape[seq_dim + 1:])
    index = np.array([cp_rank, 2 * cp_size - cp_rank - 1])
    v = np.take(v, index, axis=seq_dim)
    return v.reshape(*x.shape[:seq_dim], -1, *x.shape[seq_dim + 1:])


def megatron_cp_unsplit(parts: Sequence[np.ndarray], seq_dim: int = 1) -> np.ndarray:
    """Inverse of ``megatron_cp_split`` over all ranks of a CP group (rank order)."""
    cp = len(parts)
    chunks: List[np.ndarray] = [None] * (2 * cp)  # type: ignore[list-item]
    for r, p in enumerate(parts):
        a, b = np.split(p, 2, axis=seq_dim)
        chunks[r], chunks[2 * cp - 1 - r] = a, b
    return np.concatenate(chunks, axis=seq_dim)


def te_thd_partitioned_indices(cu_seqlens: Sequence[int], total_tokens: int, world_size: int,
                               rank: int) -> np.ndarray:
    """``thd_get_partitioned_indices(cu_seqlens, total_tokens, world_size, rank)``, token by token."""
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    batch = len(cu) - 1
    assert (cu % (world_size * 2) == 0).all(), "TE assumes every sequence length divisible by 2 * world_size"
    cu_s = cu // world_size

    def binary_search(target: int, array: np.ndarray, length: int) -> int:
        left, right = 1, length - 1
        while left < right:
            mid = (left + right) // 2
            if array[mid] <= target:
                left = mid + 1
            else:
                right = mid
        return left - 1

    out = np.empty(total_tokens // world_size, dtype=np.int64)
    for token_id in range(total_tokens // world_size):
        seq_id = binary_search(token_id, cu_s, batch + 1)
        seq_len = cu_s[seq_id + 1] - cu_s[seq_id]
        index = token_id - cu_s[seq_id]
        offset = rank if index < seq_len // 2 else (world_size - 1) * 2 - rank
        index += cu_s[seq_id] * world_size + seq_len // 2 * offset
        out[token_id] = index
    return out


def te_pad_thd(values: np.ndarray, cu_seqlens: Sequence[int], divisibility_factor: int,
               pad_value: int) -> Tuple[np.ndarray, np.ndarray]:
    """``pad_thd_sequences_for_cp`` for one 1-D tensor: (padded values, cu_seqlens_padded)."""
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    seqlens = cu[1:] - cu[:-1]
    pads = [((n + divisibility_factor - 1) // divisibility_factor) * divisibility_factor - n for n in seqlens]
    pieces = []
    for a, b, p in zip(cu[:-1], cu[1:], pads):
        pieces.append(values[a:b])
        pieces.append(np.full(p, pad_value, dtype=values.dtype))
    padded = np.concatenate(pieces) if pieces else values[:0]
    cu_pad = np.concatenate([[0], np.cumsum(seqlens + np.asarray(pads, dtype=np.int64))]).astype(np.int64)
    return padded, cu_pad


def te_positions_thd(cu_seqlens: Sequence[int], divisibility_factor: int) -> np.ndarray:
    """``generate_positional_ids_for_cp``: 0, 1, ... per sequence, continuing through its padding."""
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    seqlens = cu[1:] - cu[:-1]
    padded = ((seqlens + divisibility_factor - 1) // divisibility_factor) * divisibility_factor
    return np.concatenate([np.arange(n) for n in padded]) if len(padded) else np.zeros(0, np.int64)


def row_segments(cu_row: np.ndarray, num_seqs: int) -> List[int]:
    """Segment lengths of one row from tokenfeed's per-row ``cu_seqlens``/``num_seqs`` (no CP)."""
    cu = np.asarray(cu_row[:num_seqs + 1], dtype=np.int64)
    return [int(x) for x in np.diff(cu)]


def thd_layout(batch: Dict[str, np.ndarray], cp_size: int, cp_rank: int, pad_id: int) -> Dict[str, np.ndarray]:
    """A CP rank's THD batch built from a whole (no-CP) batch with cu_seqlens.

    The rows are laid end to end, each row's segments padded to a multiple of
    ``2 * cp_size`` (TE ``pad_thd_sequences_for_cp``), positions from
    ``generate_positional_ids_for_cp``, then every tensor indexed with
    ``thd_get_partitioned_indices``.
    """
    tokens = batch["tokens"]
    rows, l1 = tokens.shape
    L = l1 - 1
    seglens: List[int] = []
    for r in range(rows):
        seglens += row_segments(batch["cu_seqlens"][r], int(np.ravel(batch["num_seqs"])[r]))
    cu = np.concatenate([[0], np.cumsum(seglens)]).astype(np.int64)
    assert cu[-1] == rows * L
    f = 2 * cp_size
    inputs, cu_pad = te_pad_thd(tokens[:, :-1].reshape(-1), cu, f, pad_id)
    labels, _ = te_pad_thd(tokens[:, 1:].reshape(-1), cu, f, pad_id)
    mask, _ = te_pad_thd(batch["loss_mask"].reshape(-1).astype(np.uint8), cu, f, 0)
    pos = te_positions_thd(cu, f)
    idx = te_thd_partitioned_indices(cu_pad, int(cu_pad[-1]), cp_size, cp_rank)
    return {"input_ids": inputs[idx], "labels": labels[idx], "loss_mask": mask[idx], "position_ids": pos[idx],
            "cu_seqlens": cu.astype(np.int32), "cu_seqlens_padded": cu_pad.astype(np.int32),
            "max_seqlen": np.array([int(np.diff(cu_pad).max()) if len(cu_pad) > 1 else 0], dtype=np.int32)}


def thd_unsplit(parts: Sequence[np.ndarray], cu_seqlens_padded: Sequence[int]) -> np.ndarray:
    """Whole padded THD sequence from every CP rank's part (inverse of the partition)."""
    cp = len(parts)
    cu = np.asarray(cu_seqlens_padded, dtype=np.int64)
    out = np.empty(int(cu[-1]), dtype=parts[0].dtype)
    for r, p in enumerate(parts):
        out[te_thd_partitioned_indices(cu, int(cu[-1]), cp, r)] = p
    return out
