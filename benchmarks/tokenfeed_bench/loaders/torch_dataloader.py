"""A map-style ``torch.utils.data.DataLoader`` over ``np.memmap`` (default collate),
sampling the shared shuffled sample list. A plain DataLoader has no resumable state:
``restore`` replays (iterates and drops) the batches before the position."""
from __future__ import annotations

from typing import Any, Dict

import numpy as np

from ..worker import Feed
from .common import MemmapSamples, SampleList


RESTORE_METHOD = "no state: replays (iterates and drops) the batches before the position"


def version() -> str:
    import torch

    return f"torch {torch.__version__}"


def _dl(case: Dict[str, Any], workers: int) -> Any:
    from torch.utils.data import DataLoader

    samples = np.load(case["samples"])
    ds = MemmapSamples(case["raw"], case["raw_dtype"], case["seq_len"])
    return DataLoader(ds, batch_size=case["batch_size"], sampler=SampleList(samples, 10**9),
                      num_workers=workers, pin_memory=bool(case.get("pin_memory")),
                      persistent_workers=workers > 0, prefetch_factor=2 if workers else None)


def open(case: Dict[str, Any]) -> Feed:  # noqa: A001
    import torch

    it = iter(_dl(case, case["workers"]))

    def nb() -> None:
        next(it)

    return Feed(nb, info={"pin_memory_effective": bool(case.get("pin_memory") and torch.cuda.is_available())})


def make_state(case: Dict[str, Any], position: int) -> int:
    return position


def restore(case: Dict[str, Any], position: int) -> Feed:
    it = iter(_dl(case, 0))
    for _ in range(position // case["batch_size"]):
        next(it)

    def nb() -> None:
        next(it)

    return Feed(nb, info={"method": "replay"})
