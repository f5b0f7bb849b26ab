#!/usr/bin/env python3
"""Feeding a GPU: tokenfeed's device loader beside the nanoGPT loop and a torch DataLoader.

Two measurements, on one CUDA GPU, with synthetic data this script writes itself (no
network, no downloads):

(a) Host-to-device copy throughput. tokenfeed's copies (timed with CUDA events on its
    copy stream, ``stats()["device"]["h2d_gbps"]``) beside a plain ``cudaMemcpyAsync``
    from page-locked memory of the same size (a pinned torch tensor's
    ``.to(device, non_blocking=True)``, timed the same way), for batch-sized and large
    transfers.

(b) A GPT-2 small (124M parameters, defined below, random init) training step in bf16,
    batch 8 x 1024 and 8 x 2048 tokens, fed by
      - tokenfeed: ``Loader(..., device="cuda")``: batches copied to the GPU ahead of
        the step by tokenfeed's copy thread;
      - the nanoGPT loop: ``get_batch`` from karpathy/nanoGPT train.py (np.memmap,
        torch.stack, ``pin_memory().to(device, non_blocking=True)``), prefetching the
        next batch right after the forward pass, as train.py does;
      - ``torch.utils.data.DataLoader`` (4 workers, ``pin_memory=True``) over the same
        file, then ``.to(device, non_blocking=True)``.
    Per loader: step time, tokens/s, and the time the GPU waited for data per step:
    CUDA events recorded on the training stream after the last kernel before the batch
    is used and once the batch is ready there; their distance is the time the stream
    spent on the input (idle while the host was late, plus copies on the stream).
    ``--sync-every 1`` (the default) reads the loss every step, as a loop that logs it
    does: the host then cannot run ahead of the GPU, and data preparation that is not
    done ahead shows up as GPU wait.

Usage:
  python benchmarks/gpu_feed.py                       # everything, on cuda:0
  python benchmarks/gpu_feed.py --json gpu.json --steps 100
  python benchmarks/gpu_feed.py --dry-run             # CPU only: arguments, data, loaders, model
"""
from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import platform
import sys
import tempfile
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np

VOCAB = 50257
DTYPE = np.uint16


# ----------------------------------------------------------------------------- data

def write_tokens(path: str, n_tokens: int, seed: int = 0, chunk: int = 1 << 24) -> str:
    """A flat uint16 token file (nanoGPT's train.bin layout), deterministic in `seed`."""
    if os.path.exists(path) and os.path.getsize(path) == n_tokens * 2:
        return path
    rng = np.random.default_rng(seed)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        left = n_tokens
        while left:
            n = min(chunk, left)
            rng.integers(0, VOCAB, size=n, dtype=DTYPE).tofile(f)
            left -= n
    os.replace(tmp, path)
    return path


# ----------------------------------------------------------------------------- model

def build_gpt2(torch: Any, block_size: int, n_layer: int = 12, n_head: int = 12, n_embd: int = 768,
               vocab_size: int = 50304) -> Any:
    """GPT-2 small as in nanoGPT's model.py (no bias, no dropout, tied embeddings)."""
    nn: Any = torch.nn
    F: Any = torch.nn.functional
    Module: Any = nn.Module

    class Attention(Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = nn.Linear(n_embd, 3 * n_embd, bias=False)
            self.proj = nn.Linear(n_embd, n_embd, bias=False)

        def forward(self, x: Any) -> Any:
            B, T, C = x.shape
            q, k, v = self.qkv(x).split(n_embd, dim=2)
            q, k, v = (t.view(B, T, n_head, C // n_head).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.proj(y.transpose(1, 2).contiguous().view(B, T, C))

    class Block(Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1 = nn.LayerNorm(n_embd, bias=False)
            self.attn = Attention()
            self.ln2 = nn.LayerNorm(n_embd, bias=False)
            self.fc = nn.Linear(n_embd, 4 * n_embd, bias=False)
            self.out = nn.Linear(4 * n_embd, n_embd, bias=False)

        def forward(self, x: Any) -> Any:
            x = x + self.attn(self.ln1(x))
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    class GPT(Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte = nn.Embedding(vocab_size, n_embd)
            self.wpe = nn.Embedding(block_size, n_embd)
            self.blocks = nn.ModuleList(Block() for _ in range(n_layer))
            self.ln_f = nn.LayerNorm(n_embd, bias=False)
            self.head = nn.Linear(n_embd, vocab_size, bias=False)
            self.head.weight = self.wte.weight
            for name, p in self.named_parameters():
                if p.dim() >= 2:
                    std = 0.02 / math.sqrt(2 * n_layer) if name.endswith(("proj.weight", "out.weight")) else 0.02
                    torch.nn.init.normal_(p, mean=0.0, std=std)

        def forward(self, idx: Any, targets: Any) -> Any:
            T = idx.shape[1]
            pos = torch.arange(T, device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for b in self.blocks:
                x = b(x)
            logits = self.head(self.ln_f(x))
            return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))

    return GPT()


# ----------------------------------------------------------------------------- loaders
# Each yields (x, y): int64 tensors of B x L on `device` (on the CPU in --dry-run).

def tokenfeed_batches(raw: str, B: int, L: int, device: Optional[str], prefetch: int, seed: int) -> Tuple[Iterator, Any]:
    import tokenfeed

    kw: Dict[str, Any] = dict(seq_len=L, batch_size=B, seed=seed, dtype="int64", output="torch")
    if device is not None:
        kw["device"] = device
        if hasattr(tokenfeed._core, "settings"):  # versions with the settings table name it so
            kw["device_prefetch_batches"] = prefetch
        elif "device_prefetch" in inspect.signature(tokenfeed.Loader).parameters:
            kw["device_prefetch"] = prefetch
    loader = tokenfeed.Loader(tokenfeed.open(raw, dtype="uint16", format="raw"), **kw)

    def gen() -> Iterator:
        for b in loader:
            yield b["input_ids"], b["labels"]

    return gen(), loader


def nanogpt_get_batch(raw: str, B: int, L: int, device: Optional[str], seed: int) -> Callable[[], Tuple[Any, Any]]:
    """karpathy/nanoGPT train.py get_batch (device_type == 'cuda' branch)."""
    import torch

    gen = torch.Generator().manual_seed(seed)

    def get_batch() -> Tuple[Any, Any]:
        data = np.memmap(raw, dtype=np.uint16, mode="r")  # re-created every batch, as nanoGPT does
        ix = torch.randint(len(data) - L, (B,), generator=gen)
        x = torch.stack([torch.from_numpy((data[i:i + L]).astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy((data[i + 1:i + 1 + L]).astype(np.int64)) for i in ix])
        if device is not None:
            x, y = x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
        return x, y

    return get_batch


class MemmapSamples:
    """Map-style dataset: sample k = tokens [k*L, k*L + L + 1) of the flat file."""

    def __init__(self, raw: str, L: int) -> None:
        self.raw, self.L = raw, L
        self.data: Any = None

    def __len__(self) -> int:
        return (os.path.getsize(self.raw) // 2 - 1) // self.L

    def __getitem__(self, k: int) -> Any:
        import torch

        if self.data is None:  # opened in each worker
            self.data = np.memmap(self.raw, dtype=np.uint16, mode="r")
        s = k * self.L
        return torch.from_numpy(self.data[s:s + self.L + 1].astype(np.int64))


def dataloader_batches(raw: str, B: int, L: int, device: Optional[str], workers: int, seed: int) -> Tuple[Iterator, Any]:
    import torch

    ds: Any = MemmapSamples(raw, L)
    dl: Any = torch.utils.data.DataLoader(
        ds, batch_size=B, sampler=torch.utils.data.RandomSampler(ds, generator=torch.Generator().manual_seed(seed)),
        num_workers=workers, pin_memory=device is not None, persistent_workers=workers > 0, drop_last=True)

    def gen() -> Iterator:
        while True:
            for t in dl:
                if device is not None:
                    t = t.to(device, non_blocking=True)
                yield t[:, :-1], t[:, 1:]

    return gen(), dl


# ----------------------------------------------------------------------------- (a) H2D

def h2d_plain(torch: Any, nbytes: int, device: str, reps: int, one_at_a_time: bool = False) -> float:
    """GB/s of cudaMemcpyAsync from page-locked memory (pinned tensor .to(non_blocking)), event-timed:
    `reps` copies back to back between two events, or (`one_at_a_time`) each copy between events of its
    own, as tokenfeed times its copies (small copies then also pay their fixed cost in full)."""
    src = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    s = torch.cuda.Stream(device)
    ev = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731
    with torch.cuda.stream(s):
        for _ in range(3):
            dst.copy_(src, non_blocking=True)
        pairs = []
        if one_at_a_time:
            for _ in range(reps):
                a, b = ev(), ev()
                a.record(s)
                dst.copy_(src, non_blocking=True)
                b.record(s)
                pairs.append((a, b))
        else:
            a, b = ev(), ev()
            a.record(s)
            for _ in range(reps):
                dst.copy_(src, non_blocking=True)
            b.record(s)
            pairs.append((a, b))
    torch.cuda.synchronize(device)
    return nbytes * reps / (sum(a.elapsed_time(b) for a, b in pairs) / 1e3) / 1e9


def h2d_tokenfeed(raw: str, B: int, L: int, device: str, batches: int, prefetch: int) -> Dict[str, Any]:
    """tokenfeed's copies of B x (L + 1) int64 batches, timed with events on its copy stream.

    The first batches are a warm-up, left out of the figures: until the engine has a buffer for every
    batch it holds ahead (2 x threads + 2 by default), each new buffer is page-locked when first
    used, which for large batches costs milliseconds and holds the driver meanwhile."""
    import torch

    it, loader = tokenfeed_batches(raw, B, L, device, prefetch, seed=1)
    for _ in range(2 * (os.cpu_count() or 1) + 2 + prefetch + 4):
        x, y = next(it)
        del x, y
    torch.cuda.synchronize()
    st0 = loader.stats().get("device", {})
    t0 = time.perf_counter()
    for _ in range(batches):
        x, y = next(it)
        del x, y
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    st = loader.stats().get("device", {})
    loader.close()
    secs = st.get("h2d_seconds", 0.0) - st0.get("h2d_seconds", 0.0)
    timed = st.get("h2d_timed_bytes", 0) - st0.get("h2d_timed_bytes", 0)
    ahead = st.get("issued_ahead", 0) - st0.get("issued_ahead", 0)
    return {"h2d_gbps": timed / secs / 1e9 if secs > 0 else None,
            "copies_issued_ahead": ahead / batches, "staging_copies": st.get("staging_copies"),
            "batches_per_s": batches / wall, "delivered_gbps": batches * B * (L + 1) * 8 / wall / 1e9}


# ----------------------------------------------------------------------------- (b) training

def train(name: str, model: Any, opt: Any, torch: Any, raw: str, B: int, L: int, device: str, steps: int,
          warmup: int, sync_every: int, prefetch: int, workers: int) -> Dict[str, Any]:
    stream = torch.cuda.current_stream()
    ev = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731
    waits: List[Tuple[Any, Any]] = []
    loader: Any = None
    nano = name == "nanogpt"
    if name == "tokenfeed":
        it, loader = tokenfeed_batches(raw, B, L, device, prefetch, seed=2)
    elif name == "dataloader":
        it, loader = dataloader_batches(raw, B, L, device, workers, seed=2)
    else:
        get_batch = nanogpt_get_batch(raw, B, L, device, seed=2)

    def fwd_bwd(x: Any, y: Any, after_forward: Callable[[], Any]) -> Any:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x, y)
        nxt = after_forward()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss, nxt

    total = warmup + steps
    t_start = None
    ev_start = ev()
    ev_end = ev()
    host_fetch = 0.0
    if nano:  # train.py fetches the first batch before the loop, then one after each forward
        a = ev()
        a.record(stream)
        x, y = get_batch()
        b = ev()
        b.record(stream)
    for k in range(total):
        if k == warmup:
            torch.cuda.synchronize()
            t_start = time.perf_counter()
            ev_start.record(stream)
            host_fetch = 0.0
        if nano:
            if k >= warmup:
                waits.append((a, b))

            def after_forward() -> Any:
                nonlocal host_fetch
                a2 = ev()
                a2.record(stream)  # after the forward's last kernel
                h0 = time.perf_counter()
                xy = get_batch()
                host_fetch += time.perf_counter() - h0
                b2 = ev()
                b2.record(stream)  # the next batch is on the stream
                return a2, b2, xy

            loss, (a, b, (x, y)) = fwd_bwd(x, y, after_forward)
        else:
            a = ev()
            a.record(stream)  # after the previous step's last kernel
            h0 = time.perf_counter()
            x, y = next(it)
            host_fetch += time.perf_counter() - h0
            b = ev()
            b.record(stream)  # the batch is ready on the stream
            if k >= warmup:
                waits.append((a, b))
            loss, _ = fwd_bwd(x, y, lambda: None)
        if sync_every and (k + 1) % sync_every == 0:
            loss.item()
    ev_end.record(stream)
    torch.cuda.synchronize()
    wall = time.perf_counter() - (t_start or 0.0)
    gpu_ms = ev_start.elapsed_time(ev_end)
    wait_ms = [a.elapsed_time(b) for a, b in waits]
    out: Dict[str, Any] = {
        "loader": name, "batch": B, "seq_len": L, "steps": steps,
        "step_ms": wall / steps * 1e3, "gpu_step_ms": gpu_ms / steps,
        "tokens_per_s": B * L * steps / wall,
        "gpu_wait_ms_mean": float(np.mean(wait_ms)), "gpu_wait_ms_p99": float(np.percentile(wait_ms, 99)),
        "gpu_wait_fraction": float(np.sum(wait_ms)) / gpu_ms if gpu_ms else None,
        "host_fetch_ms_mean": host_fetch / steps * 1e3,
    }
    if name == "tokenfeed":
        out["device_stats"] = loader.stats().get("device")
        # tokenfeed's own data-wait meter over the timed steps, beside the events above: its
        # host figure (the wait in next()) and its figure on the GPU's clock
        if hasattr(loader, "meter"):
            m = loader.meter(steps)
            out["meter"] = {k: m.get(k) for k in ("wait_fraction", "wait_p99_seconds", "gpu_wait_fraction",
                                                  "gpu_wait_p50_seconds", "gpu_wait_p99_seconds", "gpu_batches")}
        loader.close()
    elif name == "dataloader":
        del it, loader  # shuts the workers down
    return out


# ----------------------------------------------------------------------------- main

def dry_run(args: argparse.Namespace) -> Dict[str, Any]:
    """Everything that does not need a GPU: the data file, the three loaders' host batches, the model."""
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        raw = write_tokens(os.path.join(tmp, "train.bin"), args.dry_tokens, seed=args.seed)
        B, L = 2, 32
        got: Dict[str, Any] = {}
        it, loader = tokenfeed_batches(raw, B, L, None, args.prefetch, seed=2)
        got["tokenfeed"] = next(it)
        loader.close()
        got["nanogpt"] = nanogpt_get_batch(raw, B, L, None, seed=2)()
        it, _ = dataloader_batches(raw, B, L, None, 0, seed=2)
        got["dataloader"] = next(it)
        for name, (x, y) in got.items():
            assert x.shape == (B, L) and y.shape == (B, L) and x.dtype == torch.int64, name
            assert int(x.max()) < VOCAB and torch.equal(x[:, 1:], y[:, :-1]), name
        model = build_gpt2(torch, block_size=L, n_layer=1, n_head=2, n_embd=32, vocab_size=VOCAB)
        loss = model(*got["tokenfeed"])
        loss.backward()
        assert math.isfinite(loss.item())
        full = build_gpt2(torch, block_size=max(args.seq_lens), vocab_size=50304)
        params = sum(p.numel() for p in full.parameters())
    return {"dry_run": True, "loaders": sorted(got), "tiny_model_loss": loss.item(), "gpt2_params": params,
            "seq_lens": args.seq_lens, "batch": args.batch}


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--data-dir", default=None, help="where the synthetic token file goes (default: a temp dir)")
    p.add_argument("--tokens", type=int, default=200_000_000, help="tokens in the synthetic file")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-lens", type=lambda s: [int(x) for x in s.split(",")], default=[1024, 2048])
    p.add_argument("--loaders", default="tokenfeed,nanogpt,dataloader")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--sync-every", type=int, default=1, help="read the loss every N steps (0: never)")
    p.add_argument("--prefetch", type=int, default=2, help="tokenfeed: batches copied to the GPU ahead")
    p.add_argument("--workers", type=int, default=4, help="DataLoader workers")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--h2d-sizes", default="65600,131200,1048576,16777216,67108864",
                   help="bytes per transfer for the plain pinned copy")
    p.add_argument("--skip-h2d", action="store_true")
    p.add_argument("--skip-train", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--dry-run", action="store_true", help="no GPU: check arguments, data, loaders and model")
    p.add_argument("--dry-tokens", type=int, default=1_000_000, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    loaders = [s.strip() for s in args.loaders.split(",") if s.strip()]
    bad = [s for s in loaders if s not in ("tokenfeed", "nanogpt", "dataloader")]
    if bad:
        p.error(f"unknown loader(s) {bad}: choose from tokenfeed, nanogpt, dataloader")

    if args.dry_run:
        dry = dry_run(args)
        print(json.dumps(dry, indent=2))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(dry, f, indent=2)
        return 0

    import torch
    import tokenfeed

    if not torch.cuda.is_available():
        print("gpu_feed: torch sees no CUDA device; use --dry-run on a machine without a GPU", file=sys.stderr)
        return 2
    dev = torch.device(args.device)
    torch.cuda.set_device(dev)
    torch.backends.cuda.matmul.allow_tf32 = True
    report: Dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(dev), "torch": torch.__version__, "cuda": torch.version.cuda,
        "tokenfeed": getattr(tokenfeed, "__version__", "?"), "cuda_detail": tokenfeed.build_info()["cuda"],
        "host": platform.node(), "cpus": os.cpu_count(), "args": vars(args), "h2d": [], "train": []}
    print(f"GPU: {report['gpu']}  torch {report['torch']}  CUDA {report['cuda']}", flush=True)
    data_dir = args.data_dir or tempfile.mkdtemp(prefix="gpu_feed_")
    os.makedirs(data_dir, exist_ok=True)
    t0 = time.perf_counter()
    raw = write_tokens(os.path.join(data_dir, "train.bin"), args.tokens, seed=args.seed)
    print(f"data: {args.tokens:,} tokens in {raw} ({time.perf_counter() - t0:.1f} s)", flush=True)

    if not args.skip_h2d:
        print("\n(a) host-to-device copies", flush=True)
        for nbytes in [int(s) for s in args.h2d_sizes.split(",")]:
            gbps = h2d_plain(torch, nbytes, args.device, reps=max(20, min(2000, (1 << 30) // nbytes)))
            report["h2d"].append({"what": "plain cudaMemcpyAsync from pinned", "bytes": nbytes, "gbps": gbps})
            print(f"  plain pinned cudaMemcpyAsync {nbytes:>10,} B: {gbps:6.2f} GB/s", flush=True)
        for B, L in [(args.batch, s) for s in args.seq_lens] + [(64, 16383), (256, 32767)]:
            r = h2d_tokenfeed(raw, B, L, args.device, batches=200 if B * L < 1 << 20 else 40, prefetch=args.prefetch)
            nbytes = B * (L + 1) * 8
            reps = max(20, min(2000, (1 << 30) // nbytes))
            plain = h2d_plain(torch, nbytes, args.device, reps=reps)
            single = h2d_plain(torch, nbytes, args.device, reps=min(reps, 200), one_at_a_time=True)
            r.update(what="tokenfeed device loader", bytes=nbytes, batch=B, seq_len=L, plain_gbps=plain,
                     plain_one_at_a_time_gbps=single,
                     ratio=(r["h2d_gbps"] / single) if r.get("h2d_gbps") else None)
            report["h2d"].append(r)
            print(f"  tokenfeed {B}x{L + 1} int64 ({nbytes:,} B): {r['h2d_gbps'] or float('nan'):6.2f} GB/s "
                  f"(plain: {single:.2f} one copy at a time, {plain:.2f} back to back; ratio to the first "
                  f"{r['ratio'] or float('nan'):.2f}); {r['batches_per_s']:.0f} batches/s delivered, "
                  f"copies issued ahead {r['copies_issued_ahead']:.3f}", flush=True)

    if not args.skip_train:
        print("\n(b) GPT-2 small (124M) training step, bf16", flush=True)
        for L in args.seq_lens:
            for name in loaders:
                torch.manual_seed(args.seed)
                model = build_gpt2(torch, block_size=max(args.seq_lens)).to(dev)
                if args.compile:
                    model = torch.compile(model)
                opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
                r = train(name, model, opt, torch, raw, args.batch, L, args.device, args.steps, args.warmup,
                          args.sync_every, args.prefetch, args.workers)
                report["train"].append(r)
                print(f"  {name:<10} {args.batch}x{L}: step {r['step_ms']:7.2f} ms  {r['tokens_per_s']:>10,.0f} tok/s  "
                      f"GPU waited for data {r['gpu_wait_ms_mean']:.3f} ms/step (p99 {r['gpu_wait_ms_p99']:.3f}, "
                      f"{100 * (r['gpu_wait_fraction'] or 0):.2f}% of GPU time)  host fetch "
                      f"{r['host_fetch_ms_mean']:.3f} ms", flush=True)
                mt = r.get("meter")
                if mt and mt.get("gpu_wait_fraction") is not None:
                    print(f"  {'':<10} tokenfeed's meter: GPU waited {100 * mt['gpu_wait_fraction']:.2f}% "
                          f"(p99 {1e3 * mt['gpu_wait_p99_seconds']:.3f} ms), host waited in next() "
                          f"{100 * mt['wait_fraction']:.2f}%", flush=True)
                del model, opt
                torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2, default=str)
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
