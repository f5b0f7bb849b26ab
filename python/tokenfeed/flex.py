"""Document masks for FlexAttention from a packed batch's ``cu_seqlens`` (docs/balance.md).

A packed row holds several documents; attention must not cross from one to another.
:func:`document_ids` gives every position of a row the index of its document (the
segments of ``cu_seqlens``, the padding tail of a packed row included), :func:`mask_mod`
the FlexAttention ``mask_mod`` over them, and :func:`block_mask` the ``BlockMask``
itself, built from the document boundaries directly: for each query block the range of
key blocks its documents can reach (and which of those are wholly inside one document,
so FlexAttention skips their mask), with no pass over the ``L x L`` mask that
``create_block_mask`` evaluates. Arrays may be NumPy or torch (on any device);
torch is needed only for :func:`mask_mod` and :func:`block_mask` and imported there.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np

__all__ = ["document_ids", "mask_mod", "block_mask"]


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def document_ids(cu_seqlens: Any, seq_len: Optional[int] = None) -> Any:
    """int32 ``[rows, L]``: the index (0, 1, ...) of the segment of ``cu_seqlens`` that each
    position belongs to, restarting in every row.

    ``cu_seqlens`` is the batch's ``[rows, L + 1]`` array (or one row's ``[L + 1]``): 0, the
    segment ends, then ``L`` repeated. ``seq_len`` defaults to ``L`` from its shape. NumPy in,
    NumPy out; a torch tensor in gives a tensor on its device (no host synchronisation)."""
    one = cu_seqlens.ndim == 1
    cu = cu_seqlens[None] if one else cu_seqlens
    L = int(cu.shape[-1]) - 1 if seq_len is None else int(seq_len)
    rows = int(cu.shape[0])
    # a 1 at every segment start inside (0, L), then a running sum along the row
    ids: Any
    if _is_torch(cu):
        import torch

        tstarts = cu[:, 1:].long().clamp(max=L)
        tmarks = torch.zeros((rows, L + 1), dtype=torch.int32, device=cu.device)
        tmarks.scatter_add_(1, tstarts, torch.ones_like(tstarts, dtype=torch.int32))
        ids = tmarks[:, :L].cumsum(1, dtype=torch.int32)
    else:
        starts = np.minimum(np.asarray(cu[:, 1:], dtype=np.int64), L)
        marks = np.zeros((rows, L + 1), dtype=np.int32)
        np.add.at(marks, (np.arange(rows)[:, None], starts), 1)
        ids = np.cumsum(marks[:, :L], axis=1, dtype=np.int32)
    return ids[0] if one else ids


def mask_mod(doc_ids: Any, causal: bool = True) -> Callable[..., Any]:
    """The FlexAttention ``mask_mod`` of a document mask: query ``q`` of row ``b`` sees key
    ``k`` when both are in the same document (and ``k <= q`` when causal). ``doc_ids`` is the
    ``[rows, L]`` torch tensor of :func:`document_ids`."""

    def doc_causal(b: Any, h: Any, q: Any, k: Any) -> Any:
        return (doc_ids[b, q] == doc_ids[b, k]) & (q >= k)

    def doc_only(b: Any, h: Any, q: Any, k: Any) -> Any:
        return doc_ids[b, q] == doc_ids[b, k]

    return doc_causal if causal else doc_only


def block_mask(cu_seqlens: Any, *, causal: bool = True, block_size: int = 128, device: Any = None) -> Any:
    """A FlexAttention ``BlockMask`` (one per row, shared by the heads) for a packed batch.

    ``cu_seqlens``: the batch's ``[rows, L + 1]`` array (NumPy or torch); ``L`` must be a
    multiple of ``block_size``. For query block ``i`` the key blocks from the one holding
    the start of the document of its first query to ``i`` (causal), or to the block holding
    the end of the document of its last query, are kept; those entirely inside the query
    block's one document (and, causal, strictly before it) are full blocks, computed without
    the mask. O(rows x (L / block_size)^2) work on small integer tensors."""
    import torch
    from torch.nn.attention.flex_attention import BlockMask

    cu = cu_seqlens if _is_torch(cu_seqlens) else torch.from_numpy(np.ascontiguousarray(cu_seqlens))
    if device is not None:
        cu = cu.to(device)
    if cu.ndim == 1:
        cu = cu[None]
    cu = cu.long()
    rows, L = int(cu.shape[0]), int(cu.shape[1]) - 1
    if L % block_size:
        raise ValueError(f"seq_len {L} is not a multiple of block_size {block_size}: FlexAttention works in "
                         f"blocks of block_size positions; use a seq_len that is a multiple of it")
    nb = L // block_size
    ids = document_ids(cu, L).long()  # [rows, L]
    start = torch.gather(cu, 1, ids)  # first position of each position's document
    end = torch.gather(cu, 1, ids + 1)  # one past its last
    first = torch.arange(nb, device=cu.device) * block_size  # first position of each block
    last = first + block_size - 1
    j = torch.arange(nb, device=cu.device)
    lo = (start[:, first] // block_size)[:, :, None]  # [rows, q block, 1]
    if causal:
        hi = j[None, :, None].expand(rows, nb, 1)
    else:
        hi = ((end[:, last] - 1) // block_size)[:, :, None]
    reach = (j[None, None, :] >= lo) & (j[None, None, :] <= hi)  # [rows, q block, kv block]
    # a key block is full when it and the query block lie in one document
    doc_first, doc_last = ids[:, first], ids[:, last]  # [rows, block]
    one_doc = doc_first == doc_last  # block inside one document
    full = (reach & one_doc[:, :, None] & one_doc[:, None, :]
            & (doc_first[:, :, None] == doc_first[:, None, :]))
    if causal:
        full &= j[None, None, :] < j[None, :, None]
    partial = reach & ~full

    def listing(m: Any) -> Any:
        num = m.sum(-1, dtype=torch.int32)
        idx = torch.argsort((~m).to(torch.int8), dim=-1, stable=True).to(torch.int32)
        return num[:, None], idx[:, None]  # one head, broadcast over the heads

    kv_num, kv_idx = listing(partial)
    full_num, full_idx = listing(full)
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=block_size,
                                    mask_mod=mask_mod(ids.to(torch.int32), causal), seq_lengths=(L, L))
