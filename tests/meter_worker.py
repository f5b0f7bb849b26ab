"""One rank of test_meter.py's torchrun run (gloo, CPU, 2 processes).

    python -m torch.distributed.run --nproc-per-node 2 ... meter_worker.py DATA OUT

Both ranks' consumers work 40 ms per step; rank 1's engine is slowed to 150 ms per batch
($TOKENFEED_FAULT_DELAY_MS, a test build's hook), so it waits most of its time and rank 0
almost none. Each rank writes what tokenfeed.meter_all_ranks returned to OUT/meter.<rank>.json.
"""
from __future__ import annotations

import json
import os
import sys
import time

import torch.distributed as dist

import tokenfeed


def main() -> None:
    data, out = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank == 1:
        os.environ["TOKENFEED_FAULT_DELAY_MS"] = "150"
    l = tokenfeed.Loader(tokenfeed.open(data), seq_len=32, batch_size=2, seed=1, output="numpy", num_threads=1,
                         prefetch=1)
    for _ in range(8):
        next(l)
        time.sleep(0.04)
    report = tokenfeed.meter_all_ranks(l, window=6)
    with open(os.path.join(out, f"meter.{rank}.json"), "w") as f:
        json.dump(report, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
