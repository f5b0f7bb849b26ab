"""LitData: ``litdata.optimize(item_loader=TokensLoader())`` into chunks,
``StreamingDataset(item_loader=TokensLoader(block_size=seq_len + 1), shuffle=True)``,
``StreamingDataLoader(pin_memory=True)`` as in litgpt pretraining, widened to int64.
``shards`` sets the chunk size so the data lands in about that many chunk files.
Restore: a fresh ``StreamingDataLoader`` given its ``state_dict()`` at a position."""
from __future__ import annotations

import math
import os
from typing import Any, Dict, Optional

import numpy as np

from ..worker import Feed
from .common import convert_once, count_files, loader_state, peer_path, restored

IMPORTS = ("litdata",)


RESTORE_METHOD = "its own state_dict()/load_state_dict() at the position"


def version() -> str:
    import litdata

    return str(litdata.__version__)


def _path(case: Dict[str, Any]) -> str:
    return peer_path(case, "litdata")


def _tokens(item: Any) -> Any:
    import torch

    path, dt, s, e = item
    data = np.memmap(path, dtype=dt, mode="r")
    yield torch.from_numpy(np.array(data[s:e]).astype(np.int32 if dt != "uint8" else np.int16))


def data_paths(case: Dict[str, Any]) -> Any:
    return [_path(case)]


def prepare(case: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    return convert_once(_path(case), _convert, case)


def _convert(case: Dict[str, Any], path: str) -> Dict[str, Any]:
    from litdata import TokensLoader, optimize

    L1 = case["seq_len"] + 1
    ntok = os.path.getsize(case["raw"]) // np.dtype(case["raw_dtype"]).itemsize
    if case.get("shards"):
        chunk = max(L1, math.ceil(ntok / int(case["shards"])))
    else:
        chunk = L1 * 512
    step = max(chunk, 1 << 20)
    inputs = [(case["raw"], case["raw_dtype"], s, min(ntok, s + step)) for s in range(0, ntok, step)]
    optimize(fn=_tokens, inputs=inputs, output_dir=path, chunk_size=chunk, item_loader=TokensLoader(),
             num_workers=1, mode="overwrite")
    chunks = count_files(path, ".bin")
    return {"what": f"{ntok} tokens in {chunks} chunks of {chunk} tokens", "chunks": chunks}


def _dl(case: Dict[str, Any]) -> Any:
    from litdata import StreamingDataLoader, StreamingDataset, TokensLoader

    ds = StreamingDataset(_path(case), item_loader=TokensLoader(block_size=case["seq_len"] + 1), shuffle=True,
                          seed=case["seed"], drop_last=True)
    return StreamingDataLoader(ds, batch_size=case["batch_size"], num_workers=case["workers"], pin_memory=True,
                               drop_last=True)


def _feed(dl: Any, restart: bool = True) -> Feed:
    import torch

    state = {"it": iter(dl)}

    def nb() -> None:
        try:
            b = next(state["it"])
        except StopIteration:
            if not restart:
                raise
            state["it"] = iter(dl)
            b = next(state["it"])
        b.to(torch.int64)  # litgpt widens on the GPU; count the same int64 output as everyone else

    return Feed(nb)


def open(case: Dict[str, Any]) -> Feed:  # noqa: A001
    f = _feed(_dl(case))
    f.info["chunks"] = count_files(_path(case), ".bin")
    return f


def make_state(case: Dict[str, Any], position: int) -> Any:
    from . import state_tools

    return loader_state(state_tools.litdata_state, _dl, case, position)


def restore(case: Dict[str, Any], state: Any) -> Feed:
    return _feed(restored(_dl(case), state), restart=False)
