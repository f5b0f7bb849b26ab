#!/usr/bin/env python3
"""Work imbalance across data-parallel ranks, with and without balancing (docs/balance.md).

For each document-length distribution: write a dataset of that many tokens, pack it best-fit
(seq_len 4096 by default), and for every step of the full shuffle ask the C order which rows
each of the 8 ranks (4 rows each) takes, with balance off, "tokens" and "attention". Per step
the imbalance is the busiest rank's cost over the mean rank's; the figure is its mean (and
99th percentile) over the steps. Costs come from the document index (cu_seqlens), never from
the tokens, exactly as the engine computes them.

Costs reported:
  attention  sum over the segments of every row of length^2 (causal attention work)
  step       alpha * L + beta * attention per row, with beta/alpha = 1/crossover: the
             predicted step time of a fixed-shape step (every position of a row is computed)
  tokens     non-padding input tokens

    python benchmarks/balance_bench.py
    python benchmarks/balance_bench.py --steps 300 --json balance.json
"""
import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time

import numpy as np

import tokenfeed
from tokenfeed import _core

MODES = {"none": _core.BALANCE_NONE, "tokens": _core.BALANCE_TOKENS, "attention": _core.BALANCE_ATTENTION}


def doc_lengths(spec: str, n_tokens: int, rng: np.random.Generator) -> np.ndarray:
    """lognormal:MU:SIGMA:CAP or pareto:ALPHA:XMIN:CAP, enough documents for n_tokens."""
    kind, *p = spec.split(":")
    out, total = [], 0
    while total < n_tokens:
        if kind == "lognormal":
            x = rng.lognormal(float(p[0]), float(p[1]), size=100_000)
        elif kind == "pareto":
            x = float(p[1]) * (1.0 + rng.pareto(float(p[0]), size=100_000))
        else:
            raise SystemExit(f"unknown distribution {spec!r}: use lognormal:MU:SIGMA:CAP or pareto:ALPHA:XMIN:CAP")
        x = np.minimum(int(p[2]), np.maximum(1, x.astype(np.int64)))
        out.append(x)
        total += int(x.sum())
    lens = np.concatenate(out)
    return lens[: int(np.searchsorted(np.cumsum(lens), n_tokens)) + 1]


def write(path: str, lens: np.ndarray) -> tokenfeed.Dataset:
    with tokenfeed.DatasetWriter(path, vocab_size=2) as w:
        for n in lens:
            w.add_document(np.ones(int(n), dtype=np.uint16))
    return tokenfeed.open(path)


def imbalance(load: np.ndarray) -> np.ndarray:
    """max / mean over the last axis."""
    return load.max(-1) / load.mean(-1)


def measure(ds: tokenfeed.Dataset, seq_len: int, ranks: int, rows: int, steps: int, micro: int,
            crossovers: list) -> dict:
    G = ranks * rows
    order = _core.Order(ds._core, seq_len=seq_len, packing=_core.PACK_BEST_FIT, global_batch=G, seed=1,
                        shuffle=_core.SHUFFLE_FULL)
    steps = min(steps, order.num_samples // (G * micro))
    n = steps * G * micro
    att = order.row_costs(0, n, MODES["attention"]).astype(np.float64)
    tok = order.row_costs(0, n, MODES["tokens"]).astype(np.float64)
    out = {"steps": steps, "global_batch": G, "micro_batches": micro, "samples_per_epoch": order.num_samples}
    for mode in ("none", "tokens", "attention"):
        t0 = time.perf_counter()
        # bins: [step, micro, rank, row] -> position
        bins = np.stack([order.balance(s * G * micro, ranks, micro, MODES[mode]) for s in range(steps)])
        sec = (time.perf_counter() - t0) / steps
        bins = bins.reshape(steps, micro, ranks, rows)
        a = att[bins].sum(-1)  # [step, micro, rank]
        k = tok[bins].sum(-1)
        r = {"rule_us_per_step": round(sec * 1e6, 1)}
        # per rank over the whole step (gradient accumulation syncs once a step) ...
        ia = imbalance(a.sum(1))
        r["attention_imbalance_mean"] = float(ia.mean())
        r["attention_imbalance_p99"] = float(np.percentile(ia, 99))
        r["tokens_imbalance_mean"] = float(imbalance(k.sum(1)).mean())
        # ... and per micro-batch (each one a sync point under FSDP or pipelining)
        if micro > 1:
            r["attention_imbalance_per_micro_batch_mean"] = float(imbalance(a).mean())
        for c in crossovers:
            step = rows * seq_len + a.sum(1) / c  # alpha = 1 per position, beta = 1 / crossover
            r[f"step_imbalance_mean@{c}"] = float(imbalance(step).mean())
            r[f"step_max@{c}"] = float(step.max(-1).sum())
        out[mode] = r
    for c in crossovers:
        out[f"predicted_step_time_gain@{c}"] = out["none"][f"step_max@{c}"] / out["attention"][f"step_max@{c}"]
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dists", nargs="+", default=["lognormal:6.0:1.5:20000", "pareto:1.1:100:100000"],
                   help="document lengths: lognormal:MU:SIGMA:CAP or pareto:ALPHA:XMIN:CAP")
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--rows", type=int, default=4, help="rows per rank per micro-batch")
    p.add_argument("--micro-batches", type=int, nargs="+", default=[1, 4])
    p.add_argument("--steps", type=int, default=300, help="steps per configuration (fewer if the epoch is short)")
    p.add_argument("--crossover", type=int, nargs="+", default=[32768, 6144],
                   help="alpha/beta in tokens: the document length whose attention costs as much as its "
                        "linear work (docs/balance.md)")
    p.add_argument("--json", help="write the figures as JSON")
    p.add_argument("--dir", help="where to write the datasets (default: a temporary directory)")
    a = p.parse_args()
    tmp = a.dir or tempfile.mkdtemp(prefix="tf-balance-")
    rng = np.random.default_rng(0)
    res = {"machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs",
           "seq_len": a.seq_len, "ranks": a.ranks, "rows": a.rows, "results": []}
    try:
        for spec in a.dists:
            need = a.seq_len * a.ranks * a.rows * max(a.micro_batches) * a.steps * 11 // 10
            lens = doc_lengths(spec, need, rng)
            ds = write(os.path.join(tmp, spec.replace(":", "_")), lens)
            for m in a.micro_batches:
                r = measure(ds, a.seq_len, a.ranks, a.rows, a.steps, m, a.crossover)
                r.update(dist=spec, documents=int(len(lens)), mean_doc=float(lens.mean()))
                res["results"].append(r)
                print(f"{spec}  micro_batches={m}  steps={r['steps']}  ({len(lens)} docs, mean {lens.mean():.0f})")
                for mode in ("none", "tokens", "attention"):
                    x = r[mode]
                    extra = (f"  per micro-batch {x['attention_imbalance_per_micro_batch_mean']:.3f}"
                             if m > 1 else "")
                    steps_txt = "  ".join(f"step@{c} {x[f'step_imbalance_mean@{c}']:.3f}" for c in a.crossover)
                    print(f"  {mode:9s} attention {x['attention_imbalance_mean']:.3f} "
                          f"(p99 {x['attention_imbalance_p99']:.3f})  tokens {x['tokens_imbalance_mean']:.4f}  "
                          f"{steps_txt}{extra}  rule {x['rule_us_per_step']:.0f} us/step")
                print("  predicted step-time gain: " + "  ".join(
                    f"{r[f'predicted_step_time_gain@{c}']:.3f}x @ crossover {c}" for c in a.crossover))
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1)
    finally:
        if not a.dir:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
