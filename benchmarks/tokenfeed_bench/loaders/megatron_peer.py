"""Megatron-core ``GPTDataset``: the token stream written with ``IndexedDatasetBuilder``
(.bin/.idx, the generated documents), built through ``BlendedMegatronDatasetBuilder``
(shuffled sample index, ``mmap_bin_files=True``, ``create_attention_mask=False`` as for
flash attention), read by a ``DataLoader`` with pinned memory."""
from __future__ import annotations

import os
from typing import Any, Dict, Optional

import numpy as np

from ..worker import Feed
from .common import done, mark

IMPORTS = ("megatron.core.datasets.gpt_dataset",)


def version() -> str:
    import importlib.metadata as md

    return md.version("megatron-core")


def _prefix(case: Dict[str, Any]) -> str:
    return os.path.join(case["peer_dir"], "megatron", "text_document")


def prepare(case: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    prefix = _prefix(case)
    if done(prefix + ".done"):
        return None
    os.makedirs(os.path.dirname(prefix), exist_ok=True)
    data = np.memmap(case["raw"], dtype=case["raw_dtype"], mode="r")
    b = IndexedDatasetBuilder(prefix + ".bin", dtype=np.dtype(case["raw_dtype"]).type)
    ends = case.get("doc_ends")
    step = 1 << 16
    bounds = np.load(ends) if ends else np.arange(step, len(data) + step, step).clip(0, len(data))
    s = 0
    for e in bounds.tolist():
        b.add_item(torch.from_numpy(np.asarray(data[s:e]).astype(np.int64)))
        b.end_document()
        s = e
    b.finalize(prefix + ".idx")
    mark(prefix + ".done")
    return {"what": f"{len(bounds)} documents into .bin/.idx"}


def open(case: Dict[str, Any]) -> Feed:  # noqa: A001
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from torch.utils.data import DataLoader

    L, V = case["seq_len"], case["vocab_size"]

    class _Tok:  # GPTDataset needs only the eod/pad ids and a cache key from the tokenizer
        eod = eos = V - 1
        pad = -1
        vocab_size = V
        unique_identifiers = {"class": "tokenfeed-bench-tokenizer", "vocab_size": V}

    cfg_kw = dict(random_seed=case["seed"], sequence_length=L, blend=([_prefix(case)], None), split="1,0,0",
                  reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False,
                  path_to_cache=os.path.join(case["peer_dir"], "megatron", "cache"), tokenizer=_Tok(),
                  mmap_bin_files=True, create_attention_mask=False)
    cfg = None
    for optional in (None, "create_attention_mask", "mmap_bin_files"):  # older releases lack these fields
        if optional:
            cfg_kw.pop(optional, None)
        try:
            cfg = GPTDatasetConfig(**cfg_kw)
            break
        except TypeError:
            if optional == "mmap_bin_files":
                raise
    train, _, _ = BlendedMegatronDatasetBuilder(GPTDataset, [10**6, None, None], lambda: True, cfg).build()
    nw = case["workers"]
    dl = DataLoader(train, batch_size=case["batch_size"], num_workers=nw, pin_memory=True,
                    persistent_workers=nw > 0, shuffle=False)
    it = iter(dl)

    def nb() -> None:
        next(it)

    return Feed(nb)


def data_paths(case: Dict[str, Any]) -> Any:
    return [_prefix(case) + ".bin", _prefix(case) + ".idx"]
