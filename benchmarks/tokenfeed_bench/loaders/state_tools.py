"""Resumable states of peers at a chosen position, made from a real state.

Each peer's loader is iterated for a few batches, its ``state_dict()`` taken, and the
counters in it moved to the target position: what the loader itself would have saved
there, without iterating millions of batches first. The state's other fields (seeds,
generator state, epoch) are the loader's own.
"""
from __future__ import annotations

import copy
from typing import Any, Dict


def _take(dl: Any, n: int) -> Any:
    it = iter(dl)
    for _ in range(n):
        next(it)
    return it


def stateful_dataloader_state(dl: Any, batches: int, batch_size: int) -> Dict[str, Any]:
    """torchdata StatefulDataLoader: snapshot step, sampler samples/yielded counts."""
    nw = max(1, int(dl.num_workers))
    _take(dl, nw + 1)
    st = copy.deepcopy(dl.state_dict())
    snap = st["_snapshot"]
    snap["_snapshot_step"] = batches
    snap["_last_yielded_worker_id"] = (batches - 1) % nw
    main = snap["_main_snapshot"]
    main["_sampler_iter_yielded"] = batches
    it_state = main.get("_sampler_iter_state") or {}
    if "samples_yielded" in it_state:
        it_state["samples_yielded"] = batches * batch_size
    inner = it_state.get("sampler_iter_state") or {}
    if "yielded" in inner:
        inner["yielded"] = batches * batch_size
    return st


def litdata_state(dl: Any, batches: int, batch_size: int) -> Dict[str, Any]:
    """LitData StreamingDataLoader: samples yielded, the dataset's own state at that count."""
    nw = max(1, int(dl.num_workers))
    _take(dl, nw + 1)
    st = copy.deepcopy(dl.state_dict())
    n = batches * batch_size
    st["num_samples_yielded"] = n
    st["dataset"] = dl.dataset.state_dict(n, dl.num_workers, batch_size)
    st["latest_worker_idx"] = (batches - 1) % nw
    return st


def grain_state(state: Dict[str, Any], batches: int, batch_size: int) -> Dict[str, Any]:
    """Grain DataLoader: batch j comes from worker j % W, worker w reads records w, w + W, ..."""
    st = copy.deepcopy(state)
    nw = max(1, int(st.get("worker_count") or 1))
    seen = {}
    for w in range(nw):
        done = (batches - w + nw - 1) // nw if batches > w else 0
        seen[str(w)] = (done * batch_size - 1) * nw + w if done else st["last_seen_indices"].get(str(w), -1)
    st["last_seen_indices"] = seen
    st["last_worker_index"] = (batches - 1) % nw
    return st
