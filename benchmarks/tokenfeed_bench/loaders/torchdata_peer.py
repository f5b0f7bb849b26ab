"""torchdata ``StatefulDataLoader``: the drop-in ``DataLoader`` with ``state_dict()``,
over the same map-style memmap dataset, ``shuffle=True`` (its stateful sampler),
worker processes. Restore: a fresh loader given the state at a position."""
from __future__ import annotations

from typing import Any, Dict

from ..worker import Feed
from .common import MemmapSamples, loader_state, restored

IMPORTS = ("torchdata.stateful_dataloader",)


RESTORE_METHOD = "its own state_dict()/load_state_dict() at the position"


def version() -> str:
    import importlib.metadata as md

    return md.version("torchdata")


def _dl(case: Dict[str, Any]) -> Any:
    import torch
    from torchdata.stateful_dataloader import StatefulDataLoader

    g = torch.Generator()
    g.manual_seed(case["seed"])
    nw = case["workers"]
    ds = MemmapSamples(case["raw"], case["raw_dtype"], case["seq_len"])
    return StatefulDataLoader(ds, batch_size=case["batch_size"], shuffle=True, generator=g, num_workers=nw,
                              persistent_workers=nw > 0, prefetch_factor=2 if nw else None, drop_last=True)


def open(case: Dict[str, Any]) -> Feed:  # noqa: A001
    from .common import cycling

    dl = _dl(case)
    nb = cycling(lambda: dl)
    return Feed(lambda: nb())


def make_state(case: Dict[str, Any], position: int) -> Any:
    from . import state_tools

    return loader_state(state_tools.stateful_dataloader_state, _dl, case, position)


def restore(case: Dict[str, Any], state: Any) -> Feed:
    it = iter(restored(_dl(case), state))

    def nb() -> None:
        next(it)

    return Feed(nb)
