"""karpathy/nanoGPT ``train.py`` ``get_batch``, with its random offsets replaced by the
shared shuffled sample list so that every loader reads the same samples."""
from __future__ import annotations

from typing import Any, Dict

import numpy as np

from ..data import drop_cache
from ..worker import Feed


def version() -> str:
    import torch

    return f"torch {torch.__version__}"


def open(case: Dict[str, Any]) -> Feed:  # noqa: A001
    import torch

    if case.get("cold"):
        drop_cache([case["raw"]])
    offs = np.load(case["samples"], mmap_mode="r")
    path, L, B = case["raw"], case["seq_len"], case["batch_size"]
    dt = np.dtype(case["raw_dtype"])
    state = {"b": 0}

    def get_batch() -> Any:
        data = np.memmap(path, dtype=dt, mode="r")  # re-created every batch, as nanoGPT does
        b = state["b"]
        state["b"] += 1
        ix = [int(offs[(b * B + j) % len(offs)]) * L for j in range(B)]
        x = torch.stack([torch.from_numpy((data[i:i + L]).astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy((data[i + 1:i + 1 + L]).astype(np.int64)) for i in ix])
        return x, y

    return Feed(get_batch)
