"""MosaicML Streaming: MDS shards of (seq_len + 1)-token ``bytes`` samples (no
compression), ``StreamingDataset(local=..., shuffle=True, batch_size=B)`` (its default
py1e shuffle), a ``DataLoader`` with pinned memory. ``shards`` sets ``size_limit`` so
the data lands in about that many shard files. Restore: a fresh dataset given
``load_state_dict({"epoch", "sample_in_epoch", ...})`` at a position."""
from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as np

from ..worker import Feed
from .common import convert_once, count_files, num_samples, peer_path


NOTES: Dict[str, str] = {}


def preload() -> None:
    """Import streaming. Its package imports streaming.vision, which imports torchvision at
    import time; a torchvision wheel built for another torch (a CUDA build beside a CPU
    torch) fails there. The token path never uses vision, so it is left out then."""
    import sys
    import types

    try:
        import torchvision  # noqa: F401
    except Exception as e:
        for k in [k for k in sys.modules if k == "torchvision" or k.startswith("torchvision.")]:
            del sys.modules[k]
        sys.modules.setdefault("streaming.vision", types.ModuleType("streaming.vision"))
        NOTES["streaming.vision"] = f"not imported: torchvision does not load with this torch ({type(e).__name__})"
    import streaming  # noqa: F401


def check() -> None:
    preload()


RESTORE_METHOD = "its own state_dict(), sample_in_epoch set; load_state_dict()"


def version() -> str:
    import streaming

    return str(streaming.__version__)


def _path(case: Dict[str, Any]) -> str:
    return peer_path(case, "mds")


def prepare(case: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    return convert_once(_path(case), _convert, case)


def _convert(case: Dict[str, Any], path: str) -> Dict[str, Any]:
    preload()
    from streaming import MDSWriter

    L = case["seq_len"]
    data = np.memmap(case["raw"], dtype=case["raw_dtype"], mode="r")
    n = num_samples(case)
    sample_bytes = (L + 1) * data.dtype.itemsize
    if case.get("shards"):
        limit = max(sample_bytes + 64, (n * (sample_bytes + 4)) // int(case["shards"]))
    else:
        limit = 64 << 20
    with MDSWriter(out=path, columns={"tokens": "bytes"}, compression=None, size_limit=limit) as w:
        for k in range(n):
            w.write({"tokens": np.asarray(data[k * L:k * L + L + 1]).tobytes()})
    shards = count_files(path, ".mds")
    return {"what": f"{n} samples in {shards} MDS shards", "shards": shards}


def _dataset(case: Dict[str, Any]) -> Any:
    preload()
    import torch
    from streaming import StreamingDataset

    dt = np.dtype(case["raw_dtype"])

    class TokenBlocks(StreamingDataset):  # type: ignore[misc]
        def __getitem__(self, idx: int) -> Any:
            obj = super().__getitem__(idx)
            return torch.from_numpy(np.frombuffer(obj["tokens"], dtype=dt).astype(np.int64))

    try:
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
    except Exception:
        pass
    return TokenBlocks(local=_path(case), remote=None, shuffle=True, shuffle_seed=case["seed"],
                       batch_size=case["batch_size"])


def _feed(ds: Any, case: Dict[str, Any]) -> Feed:
    from torch.utils.data import DataLoader

    nw = case["workers"]
    dl = DataLoader(ds, batch_size=case["batch_size"], num_workers=nw, pin_memory=True,
                    persistent_workers=nw > 0)
    state = {"it": iter(dl)}

    def nb() -> None:
        try:
            next(state["it"])
        except StopIteration:
            state["it"] = iter(dl)
            next(state["it"])

    return Feed(nb)


def open(case: Dict[str, Any]) -> Feed:  # noqa: A001
    ds = _dataset(case)
    f = _feed(ds, case)
    f.info.update(NOTES)
    f.info["shards"] = count_files(_path(case), ".mds")
    return f


def make_state(case: Dict[str, Any], position: int) -> Dict[str, Any]:
    ds = _dataset(case)
    st: Dict[str, Any] = ds.state_dict(0, True)
    st["sample_in_epoch"] = int(position)
    return st


def restore(case: Dict[str, Any], state: Dict[str, Any]) -> Feed:
    ds = _dataset(case)
    ds.load_state_dict(state)
    return _feed(ds, case)


def data_paths(case: Dict[str, Any]) -> Any:
    return [_path(case)]
