"""Train a tiny GPT on CPU with tokenfeed, checkpointing model, optimizer and loader.

    python docs/examples/train_tiny_gpt.py --out runs/tiny --steps 300

Kill it at any point (even with SIGKILL) and run the same command again: it resumes
from the last checkpoint and produces exactly the losses an uninterrupted run would,
because the loader's state (a few hundred bytes) is saved in the checkpoint and
restoring it is O(1). Each step's loss is appended to ``<out>/losses.jsonl``.
"""
from __future__ import annotations

import argparse
import json
import math
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import tokenfeed


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, seq_len: int, d: int = 64, layers: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq_len, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.shape[1]
        mask = torch.triu(torch.full((T, T), float("-inf")), diagonal=1)
        x = self.tok(idx) + self.pos(torch.arange(T))
        for b in self.blocks:
            x = b(x, mask)
        return self.head(self.ln(x))


def make_corpus(path: str, vocab: int, n_docs: int = 2000, seed: int = 0) -> None:
    """A synthetic corpus with learnable structure (repeated n-gram patterns)."""
    rng = np.random.default_rng(seed)
    patterns = [rng.integers(1, vocab, size=rng.integers(3, 9)) for _ in range(40)]
    with tokenfeed.DatasetWriter(path, vocab_size=vocab, shard_tokens=50_000) as w:
        for _ in range(n_docs):
            parts = [patterns[i] for i in rng.integers(0, len(patterns), size=rng.integers(2, 30))]
            w.add_document(np.concatenate(parts + [np.array([0])]))  # 0 = end of document


def save_atomic(obj: dict, path: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/tiny-gpt")
    ap.add_argument("--data", default=None, help="dataset path (default: generate one under --out)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--ckpt-every", type=int, default=25)
    ap.add_argument("--vocab", type=int, default=None,
                    help="vocabulary size (default: the dataset's, or 256 for the generated corpus)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    os.makedirs(args.out, exist_ok=True)
    data = args.data or os.path.join(args.out, "data")
    if not os.path.exists(os.path.join(data, "tokenfeed.manifest")):
        make_corpus(data, args.vocab or 256)

    ds = tokenfeed.open(data)
    if args.vocab is None:
        args.vocab = ds.vocab_size or 256
    if ds.vocab_size and args.vocab < ds.vocab_size:
        ap.error(f"--vocab {args.vocab} is smaller than the dataset's vocabulary ({ds.vocab_size})")
    loader = tokenfeed.Loader(ds, seq_len=args.seq_len, batch_size=args.batch_size, seed=args.seed,
                              rank=0, world_size=1, output="torch")
    model = TinyGPT(args.vocab, args.seq_len)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    ckpt_path = os.path.join(args.out, "ckpt.pt")
    step = 0
    if os.path.exists(ckpt_path):
        ckpt = torch.load(ckpt_path, weights_only=False)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        loader.load_state_dict(ckpt["loader"])   # O(1): no replay
        step = ckpt["step"]
        print(f"resumed at step {step}, loader position {loader.position}")

    log = open(os.path.join(args.out, "losses.jsonl"), "a")
    while step < args.steps:
        batch = next(loader)
        logits = model(batch["input_ids"])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["labels"].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        log.write(json.dumps({"step": step, "loss": loss.item()}) + "\n")
        log.flush()
        if step % args.ckpt_every == 0 or step == args.steps:
            save_atomic({"model": model.state_dict(), "optimizer": opt.state_dict(),
                         "loader": loader.state_dict(), "step": step}, ckpt_path)
        if step % 50 == 0:
            print(f"step {step:5d}  loss {loss.item():.4f}  (ln vocab = {math.log(args.vocab):.2f})")
    loader.close()


if __name__ == "__main__":
    main()
