"""tokenfeed itself: ``tokenfeed.Loader`` over the dataset, with the case's options."""
from __future__ import annotations

import glob
import os
from typing import Any, Dict

from ..data import dataset_files, drop_cache
from ..worker import Feed

IMPORTS = ("tokenfeed",)


RESTORE_METHOD = "state_dict() with the position: O(1), nothing replayed"


def version() -> str:
    import tokenfeed

    return str(tokenfeed.__version__)


def _paths(case: Dict[str, Any]) -> Any:
    if case.get("shards_dir"):
        return sorted(glob.glob(os.path.join(case["shards_dir"], "shard_*.bin")))
    return case["path"]


def data_paths(case: Dict[str, Any]) -> Any:
    return _paths(case)


def _loader(case: Dict[str, Any]) -> Any:
    import tokenfeed

    # a shard directory opens as users open it, by glob: the node's catalog then opens the set
    # again without listing it (docs/format.md, "The node's catalog")
    spec = os.path.join(case["shards_dir"], "shard_*.bin") if case.get("shards_dir") else case["path"]
    if case.get("catalog_dir"):  # the start-up group's own node catalog: first open, then read
        os.environ["TOKENFEED_CATALOG_DIR"] = case["catalog_dir"]
    ds = tokenfeed.open(spec, dtype=case.get("dtype_in"))
    kw = {"device": case["device"]} if case.get("device") else {}
    return tokenfeed.Loader(ds, seq_len=case["seq_len"], batch_size=case["batch_size"], seed=case["seed"],
                            shuffle=case.get("shuffle", True), num_threads=case.get("threads"),
                            backend=case.get("backend"), dtype=case.get("out_dtype", "int64"),
                            output=case.get("output", "numpy"), direct_io=bool(case.get("direct_io", False)), **kw)


def _feed(loader: Any) -> Feed:
    it = iter(loader)

    def nb() -> None:
        next(it)

    return Feed(nb, loader.close)


def open(case: Dict[str, Any]) -> Feed:  # noqa: A001 - the loader-module protocol
    if case.get("cold"):
        drop_cache(dataset_files(_paths(case)))
    loader = _loader(case)
    f = _feed(loader)
    f.obj = loader
    return f


def after(feed: Feed) -> Dict[str, Any]:
    st = feed.obj.stats()
    return {"stats": {k: st.get(k) for k in ("backend", "num_threads", "backend_note", "wait_seconds", "ring_slots")}}


def make_state(case: Dict[str, Any], position: int) -> Dict[str, Any]:
    loader = _loader(case)
    st: Dict[str, Any] = loader.state_dict()
    loader.close()
    st["position"] = position
    return st


def restore(case: Dict[str, Any], state: Dict[str, Any]) -> Feed:
    """A fresh Loader given the state: O(1), nothing replayed."""
    loader = _loader(case)
    loader.load_state_dict(state)
    return _feed(loader)
