"""A training loop that adapts its mixture from per-domain losses (tests/order/test_online_mixing.py).

Simulates ``--ranks`` data-parallel ranks in one process (one Loader each). Every step it
logs a hash of the global batch (the ranks' rows in rank order); every ``K`` steps it sets
new weights, on every rank, from the mean "loss" of each domain over the last ``K`` steps
(a stand-in: the mean token id of the domain's rows, which the data decides), and right
after that saves a checkpoint (rank 0's state: as JSON, or through
torch.distributed.checkpoint). Started again, it resumes from the last checkpoint, with
whatever ``--ranks`` it is given.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import time

import numpy as np

import tokenfeed

K = 4
GLOBAL_BATCH = 8


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", nargs="+", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--steps", type=int, default=96)
    ap.add_argument("--ckpt", choices=["json", "dcp"], default="json")
    ap.add_argument("--sleep", type=float, default=0.0)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    loaders = [tokenfeed.Loader(a.data, weights=[1.0] * len(a.data), seq_len=16,
                                batch_size=GLOBAL_BATCH // a.ranks, dp_rank=r, dp_size=a.ranks, seed=5,
                                mix_window=20, output="numpy", num_threads=1, source_ids=True)
               for r in range(a.ranks)]
    latest = os.path.join(a.out, "latest")
    if os.path.exists(latest):
        with open(latest) as f:
            where = f.read().strip()
        for ld in loaders:
            if a.ckpt == "json":
                with open(where) as f:
                    ld.load_state_dict(json.load(f))
            else:
                import torch.distributed.checkpoint as dcp

                dcp.load({"loader": ld}, checkpoint_id=where)
        print(f"resumed at step {loaders[0].position // GLOBAL_BATCH}", flush=True)
    nsrc = len(a.data)
    sums, counts = np.zeros(nsrc), np.zeros(nsrc)
    with open(os.path.join(a.out, "log.jsonl"), "a") as log:
        for step in range(loaders[0].position // GLOBAL_BATCH, a.steps):
            batches = [next(ld) for ld in loaders]
            tokens = np.concatenate([b["tokens"] for b in batches])
            src = np.concatenate([b["source_ids"] for b in batches])
            loss = tokens.mean(axis=1)  # one number per row
            np.add.at(sums, src, loss)
            np.add.at(counts, src, 1)
            log.write(json.dumps({"step": step, "hash": hashlib.sha256(tokens.tobytes()).hexdigest()[:16],
                                  "sources": src.tolist()}) + "\n")
            log.flush()
            if (step + 1) % K == 0:
                # more weight to the domains with the highest mean loss (exponentiated, then mixed
                # with uniform so that no domain starves)
                mean = np.where(counts > 0, sums / np.maximum(counts, 1), 0.0)
                z = np.exp((mean - mean.max()) / 500.0)
                w = 0.5 * z / z.sum() + 0.5 / nsrc
                w = [round(float(x), 6) for x in w]
                for ld in loaders:
                    ld.set_weights(w)
                sums[:], counts[:] = 0, 0
                where = os.path.join(a.out, f"ckpt-{step + 1}")
                if a.ckpt == "json":
                    with open(where + ".tmp", "w") as f:
                        json.dump(loaders[0].state_dict(), f)
                    os.replace(where + ".tmp", where)
                else:
                    import torch.distributed.checkpoint as dcp

                    dcp.save({"loader": loaders[0]}, checkpoint_id=where)
                with open(latest + ".tmp", "w") as f:
                    f.write(where)
                os.replace(latest + ".tmp", latest)
            if a.sleep:
                time.sleep(a.sleep)
    for ld in loaders:
        ld.close()
    assert not math.isnan(float(sums.sum()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
