"""torchtitan's own components around TokenfeedDataLoader, for tests/integrations/test_torchtitan.py:
the loader built from its Config as the Trainer builds it, and the DCP CheckpointManager
the Trainer builds, over a small model, optimizer and LR schedule.

Run under torchrun (gloo) it trains STEPS steps on each rank, saves a checkpoint at step
SAVE_AT and writes every batch it received to OUT/rank<r>.npz."""
from __future__ import annotations

import sys
from typing import Any, Dict, List, Tuple

import numpy as np
import torch

from tokenfeed.integrations.torchtitan import TokenfeedDataLoader

L = 32


class TrainState:
    """What the Trainer passes as states={"train_state": self}: a step counter."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> Dict[str, Any]:
        return {"step": torch.tensor(self.step)}

    def load_state_dict(self, sd: Dict[str, Any]) -> None:
        self.step = int(sd["step"])


def build(path: str, dp_rank: int, dp_size: int, local_batch: int, folder: str, **cfg: Any) -> Tuple[Any, ...]:
    from torchtitan.components.checkpoint import CheckpointManager
    from torchtitan.components.optimizer.lr_scheduler import LRSchedulersContainer
    from torchtitan.components.optimizer.optimizer import default_adamw

    torch.manual_seed(0)
    model = torch.nn.Linear(L, 8)
    dl = TokenfeedDataLoader.Config(dataset_path=path, **cfg).build(
        dp_world_size=dp_size, dp_rank=dp_rank, tokenizer=None, seq_len=L, local_batch_size=local_batch,
        snapshot_every_n_steps=None)
    ocfg = default_adamw(lr=1e-3)
    ocfg.implementation = "for-loop"  # fused AdamW is CUDA only
    opt = ocfg.build(model_parts=[model])
    lrs = LRSchedulersContainer.Config(warmup_steps=1).build(optimizers=opt, training_steps=100)
    ts = TrainState()
    ckpt = CheckpointManager.Config(enable=True, folder="checkpoint", interval=1).build(
        dataloader=dl, model_parts=[model], optimizers=opt, lr_schedulers=lrs, states={"train_state": ts},
        sd_adapter=None, base_folder=folder)
    return model, dl, opt, lrs, ts, ckpt


def train(model: Any, dl: Any, opt: Any, lrs: Any, ts: Any, ckpt: Any, steps: int,
          save_at: int = -1) -> List[Dict[str, np.ndarray]]:
    """The Trainer's loop, reduced: a batch per step, a step of the optimizer, a save."""
    got = []
    it = iter(dl)
    for _ in range(steps):
        inputs, labels = next(it)
        got.append({"input": inputs["input"].numpy().copy(), "positions": inputs["positions"].numpy().copy(),
                    "labels": labels.numpy().copy()})
        loss = model(inputs["input"].float()).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        lrs.step()
        ts.step += 1
        if ts.step == save_at:
            ckpt.save(curr_step=ts.step)
    return got


if __name__ == "__main__":
    import torch.distributed as dist

    path, folder, out = sys.argv[1], sys.argv[2], sys.argv[3]
    steps, save_at, local_batch = (int(x) for x in sys.argv[4:7])
    dist.init_process_group("gloo")
    r, w = dist.get_rank(), dist.get_world_size()
    parts = build(path, r, w, local_batch, folder, seed=3)
    got = train(*parts, steps=steps, save_at=save_at)
    parts[-1].close()
    np.savez(f"{out}/rank{r}.npz", **{f"{k}{i}": v for i, b in enumerate(got) for k, v in b.items()})
    dist.barrier()
    dist.destroy_process_group()
