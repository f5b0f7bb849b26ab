"""tokenfeed's PyTorch adapters through ``torch.utils.data.DataLoader``: ``TokenBatches``
(whole batches from the C engine, ``batch_size=None``) or ``TokenDataset`` with a
``ResumableSampler`` (one sample per ``__getitem__``, default collate), with the case's
``workers``."""
from __future__ import annotations

import warnings
from typing import Any, Dict

from ..worker import Feed

IMPORTS = ("tokenfeed", "tokenfeed.torch")

RESTORE_METHOD = "start= / the sampler's position: O(1), nothing replayed"


def version() -> str:
    import tokenfeed

    return str(tokenfeed.__version__)


def data_paths(case: Dict[str, Any]) -> Any:
    return case["path"]


def _dl(case: Dict[str, Any], start: int = 0) -> Any:
    import tokenfeed
    from torch.utils.data import DataLoader
    from tokenfeed.torch import ResumableSampler, TokenBatches, TokenDataset

    # the adapter's advice to use num_workers=0 is what this row measures: not repeated per case
    warnings.filterwarnings("ignore", category=tokenfeed.PerformanceWarning)
    ds = tokenfeed.open(case["path"], dtype=case.get("dtype_in"))
    L, B, w = case["seq_len"], case["batch_size"], case["workers"]
    mp = {"persistent_workers": True, "prefetch_factor": 2} if w else {}
    if case["adapter"] == "TokenBatches":
        return DataLoader(TokenBatches(ds, seq_len=L, batch_size=B, seed=case["seed"], rank=0, world_size=1,
                                       start=start), batch_size=None, num_workers=w, **mp)
    sampler = ResumableSampler(batch_size=B, rank=0, world_size=1, start=start)
    return DataLoader(TokenDataset(ds, seq_len=L, seed=case["seed"]), sampler=sampler, batch_size=B,
                      num_workers=w, **mp)


def _feed(dl: Any) -> Feed:
    it = iter(dl)

    def nb() -> None:
        next(it)

    return Feed(nb)


def open(case: Dict[str, Any]) -> Feed:  # noqa: A001 - the loader-module protocol
    return _feed(_dl(case))


def make_state(case: Dict[str, Any], position: int) -> int:
    return position


def restore(case: Dict[str, Any], position: int) -> Feed:
    return _feed(_dl(case, start=position))
