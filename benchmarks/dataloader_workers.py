#!/usr/bin/env python3
"""TokenBatches through torch's DataLoader with and without workers, next to what the
DataLoader itself can hand over (docs/guides/dataloader.md, "Speed").

For each batch shape: tokens/s of ``DataLoader(TokenBatches(...), batch_size=None)`` with
``num_workers=0`` and with ``--workers`` workers, each measured ``--rounds`` times in turn
for ``--seconds`` (the best of each is reported, so a passing load spike on a shared machine
costs one sample, not the figure), and the ratio. The last line is the DataLoader's own
item rate with the same workers over a dataset that yields small integers: the most batches
per second any dataset can get through those workers on this machine, whatever it does.

    python benchmarks/dataloader_workers.py
    python benchmarks/dataloader_workers.py --shapes 8x2048 64x8192 --json dl.json
"""
import argparse
import json
import os
import platform
import tempfile
import time
import warnings
from typing import Any, Dict, List

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset

import tokenfeed
from tokenfeed.torch import TokenBatches


class _Counter(IterableDataset):  # type: ignore[type-arg]
    def __iter__(self) -> Any:
        i = 0
        while True:
            yield i
            i += 1


def rate(dl: DataLoader, seconds: float, tokens: bool) -> float:  # type: ignore[type-arg]
    """Tokens (or items) per second over ``seconds``, after a warm-up of 20 items."""
    it = iter(dl)
    for _ in range(20):
        next(it)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        b = next(it)
        n += b["input_ids"].numel() if tokens else 1
    out = n / (time.perf_counter() - t0)
    del it
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=["8x2048", "16x8192", "64x8192"], help="BxL batch shapes")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--prefetch-factor", type=int, default=None,
                    help="the DataLoader's prefetch_factor with workers (torch's default: 2)")
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=50_000_000, help="tokens in the generated dataset")
    ap.add_argument("--json", help="write the figures here")
    a = ap.parse_args()
    warnings.simplefilter("ignore")  # the PerformanceWarning that workers add nothing: measured here
    rng = np.random.default_rng(0)
    rows: List[Dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ds")
        with tokenfeed.DatasetWriter(path, vocab_size=50257) as w:
            left = a.tokens
            while left > 0:
                n = min(left, int(rng.integers(100, 5000)))
                w.add_document(rng.integers(0, 50000, n, dtype=np.uint16))
                left -= n
        ds = tokenfeed.open(path)
        for shape in a.shapes:
            b, l = (int(x) for x in shape.split("x"))
            best = {0: 0.0, a.workers: 0.0}
            for _ in range(a.rounds):
                for nw in best:
                    pf = {"prefetch_factor": a.prefetch_factor} if nw and a.prefetch_factor else {}
                    dl = DataLoader(TokenBatches(ds, seq_len=l, batch_size=b, seed=1), batch_size=None, num_workers=nw,
                                    **pf)
                    best[nw] = max(best[nw], rate(dl, a.seconds, tokens=True))
            r = {"shape": shape, "workers0_tokens_per_s": best[0], "workers_tokens_per_s": best[a.workers],
                 "ratio": best[a.workers] / best[0], "batches_per_s_with_workers": best[a.workers] / (b * l)}
            rows.append(r)
            print(f"{shape:>9}: workers=0 {best[0] / 1e6:8.0f} M tokens/s   workers={a.workers} "
                  f"{best[a.workers] / 1e6:8.0f} M ({r['batches_per_s_with_workers']:,.0f} batches/s)   "
                  f"ratio {r['ratio']:.2f}", flush=True)
    pf = {"prefetch_factor": a.prefetch_factor} if a.prefetch_factor else {}
    items = max(rate(DataLoader(_Counter(), batch_size=None, num_workers=a.workers, **pf), a.seconds, tokens=False)
                for _ in range(a.rounds))
    print(f"the DataLoader's own item rate with {a.workers} workers (a dataset of integers): {items:,.0f} items/s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                       "torch": torch.__version__, "workers": a.workers, "prefetch_factor": a.prefetch_factor,
                       "rows": rows,
                       "dataloader_items_per_s": items}, f, indent=1)


if __name__ == "__main__":
    main()
