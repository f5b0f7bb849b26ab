"""Hugging Face ``datasets``: rows of seq_len + 1 tokens saved to disk (Arrow),
``load_from_disk().with_format("torch")``, a ``DataLoader`` over the shared sample list
(batched ``__getitems__``). ``shards`` sets ``save_to_disk(num_shards=...)``."""
from __future__ import annotations

import os
from typing import Any, Dict, Optional

import numpy as np

from ..worker import Feed
from .common import SampleList, convert_once, num_samples, peer_path

IMPORTS = ("datasets",)


def version() -> str:
    import datasets

    return str(datasets.__version__)


def _path(case: Dict[str, Any]) -> str:
    return peer_path(case, "hf-datasets")


def data_paths(case: Dict[str, Any]) -> Any:
    return [_path(case)]


def prepare(case: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    return convert_once(_path(case), _convert, case)


def _convert(case: Dict[str, Any], path: str) -> Dict[str, Any]:
    import datasets

    L = case["seq_len"]
    raw, dt = case["raw"], case["raw_dtype"]
    n = num_samples(case)

    def gen() -> Any:
        data = np.memmap(raw, dtype=dt, mode="r")
        for k in range(n):
            yield {"input_ids": np.asarray(data[k * L:k * L + L + 1])}

    feats = datasets.Features({"input_ids": datasets.Sequence(datasets.Value(dt))})
    d = datasets.Dataset.from_generator(gen, features=feats, cache_dir=os.path.join(case["peer_dir"], "hf-cache"))
    kw = {"num_shards": int(case["shards"])} if case.get("shards") else {}
    d.save_to_disk(path, **kw)
    return {"what": f"{n} rows of {L + 1} tokens saved with save_to_disk", **kw}


def open(case: Dict[str, Any]) -> Feed:  # noqa: A001
    import datasets
    from torch.utils.data import DataLoader

    d = datasets.load_from_disk(_path(case)).with_format("torch")
    samples = np.load(case["samples"])
    nw = case["workers"]
    dl = DataLoader(d, batch_size=case["batch_size"], sampler=SampleList(samples % len(d), 10**9),
                    num_workers=nw, persistent_workers=nw > 0)
    it = iter(dl)

    def nb() -> None:
        next(it)

    return Feed(nb, info={"files": len(d.cache_files)})
