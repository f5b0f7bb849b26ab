"""Rows for tokenfeed's PyTorch ``DataLoader`` adapters, beside the Loader's own: the same
data, order and batch shape through ``TokenBatches`` and ``TokenDataset``, with 0 workers
and with the worker count the other DataLoader rows use."""
from __future__ import annotations

from typing import Any, Dict, List

NOTES = {
    "TokenBatches": "DataLoader(TokenBatches(...), batch_size=None): whole batches from the C engine; with "
                    "workers each batch reaches the loop through a shared-memory ring",
    "TokenDataset": "DataLoader(TokenDataset(...), sampler=ResumableSampler(...)): one sample per __getitem__, "
                    "default collate",
}


def rows(R: Any, tf: Dict[str, Any], workers: int) -> List[Dict[str, Any]]:
    """One row per adapter and worker count (0 and ``workers``); ``tf`` is the Loader's case."""
    out = []
    for adapter in ("TokenBatches", "TokenDataset"):
        for w in sorted({0, workers}):
            case = dict(tf, kind="tokenfeed_torch", adapter=adapter, workers=w)
            out.append(R.run(f"tokenfeed {adapter} workers={w}", "tokenfeed", case, note=NOTES[adapter]))
    return out
