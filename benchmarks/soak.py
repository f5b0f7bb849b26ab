"""Soak test: resources stay flat over a long run.

Phase 1 iterates one Loader for N batches (default 10^7 batches of 1 x 16
tokens: the per-batch overheads dominate, which is what leaks show up in) and
samples the process's RSS (/proc/self/status VmRSS), open file descriptors
(/proc/self/fd) and threads (/proc/self/status Threads) every --every batches.

Phase 2 opens a dataset, creates a Loader, takes one batch (so the worker
threads start), closes both, --loaders times (default 10^4), cycling through
the backends (mmap, pread, io_uring when usable) and packing modes (concat,
best_fit, document), sampling the same figures 100 times.

"Flat" means: RSS grows by less than --rss-slack-mb after the warm-up (the
first --warmup fraction of each phase: allocator arenas, page cache of the
mapped shard, caches filling), and file descriptors and threads end where they
started (phase 1: with the loader running; phase 2: with none alive).

    python benchmarks/soak.py                         # the full run (minutes)
    python benchmarks/soak.py --batches 100000 --loaders 1000 --json out.json

Exit status 0 when both phases are flat, 1 otherwise. tests/engine/test_soak.py runs
the same checks at 10^5 batches and 10^3 loaders.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import tempfile
import time
from typing import Any, Dict, List

import numpy as np

import tokenfeed


def sample() -> Dict[str, int]:
    rss = threads = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    return {"rss": rss, "fds": len(os.listdir("/proc/self/fd")), "threads": threads}


def make_data(path: str, n_docs: int = 2000, vocab: int = 50257, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    lens = np.maximum(1, rng.lognormal(np.log(200), 1.0, size=n_docs).astype(np.int64))
    with tokenfeed.DatasetWriter(path, vocab_size=vocab, shard_tokens=100_000) as w:
        for n in lens:
            w.add_document(rng.integers(0, vocab, size=int(n)))


def summarize(samples: List[Dict[str, int]], warm: int, base: Dict[str, int], rss_slack: int) -> Dict[str, Any]:
    after = samples[warm:] or samples[-1:]
    out: Dict[str, Any] = {}
    for k in ("rss", "fds", "threads"):
        vals = [s[k] for s in samples]
        out[k] = {"start": vals[0], "after_warmup": after[0][k], "end": vals[-1], "max": max(vals)}
    growth = max(s["rss"] for s in after) - after[0]["rss"]
    out["rss_growth_after_warmup"] = growth
    out["flat"] = {
        "rss": growth < rss_slack,
        "fds": samples[-1]["fds"] == base["fds"],
        "threads": samples[-1]["threads"] == base["threads"],
    }
    out["pass"] = all(out["flat"].values())
    return out


def phase_batches(path: str, n: int, every: int, warmup: float, rss_slack: int, backend: str) -> Dict[str, Any]:
    ds = tokenfeed.open(path)
    samples = []
    t0 = time.monotonic()
    with tokenfeed.Loader(ds, seq_len=15, batch_size=1, seed=1, output="numpy", backend=backend) as l:
        next(l)
        gc.collect()
        base = sample()
        samples.append(base)
        nxt = l.__next__
        done = 1
        while done < n:
            k = min(every, n - done)
            for _ in range(k):
                nxt()
            done += k
            gc.collect()
            samples.append(sample())
        secs = time.monotonic() - t0
    warm = max(1, int(len(samples) * warmup))
    r = summarize(samples, warm, base, rss_slack)
    r.update({"batches": n, "seconds": round(secs, 1), "batches_per_s": round(n / secs), "backend": backend,
              "series_rss_mb": [round(s["rss"] / 2**20, 2) for s in samples]})
    return r


def phase_loaders(path: str, n: int, warmup: float, rss_slack: int) -> Dict[str, Any]:
    backends = ["mmap", "pread"] + (["io_uring"] if tokenfeed.build_info()["io_uring"]["usable"] else [])
    packings = ["concat", "best_fit", "document"]
    gc.collect()
    base = sample()
    samples = [base]
    every = max(1, n // 100)
    t0 = time.monotonic()
    for i in range(n):
        ds = tokenfeed.open(path)
        l = tokenfeed.Loader(ds, seq_len=15, batch_size=2, seed=i, output="numpy",
                             backend=backends[i % len(backends)], packing=packings[(i // len(backends)) % 3],
                             num_threads=1 + i % 2)
        next(l)
        l.close()
        del l, ds
        if (i + 1) % every == 0:
            gc.collect()
            samples.append(sample())
    secs = time.monotonic() - t0
    warm = max(1, int(len(samples) * warmup))
    r = summarize(samples, warm, base, rss_slack)
    r.update({"loaders": n, "seconds": round(secs, 1), "loaders_per_s": round(n / secs),
              "series_rss_mb": [round(s["rss"] / 2**20, 2) for s in samples]})
    return r


def fmt(name: str, r: Dict[str, Any]) -> str:
    lines = [f"{name}: {'PASS' if r['pass'] else 'FAIL'} "
             f"({', '.join(k + ('=flat' if v else '=NOT flat') for k, v in r['flat'].items())})"]
    for k, unit, div in (("rss", "MiB", 2**20), ("fds", "", 1), ("threads", "", 1)):
        v = r[k]
        lines.append(f"  {k:8s} start {v['start'] / div:10.2f}  after warm-up {v['after_warmup'] / div:10.2f}  "
                     f"end {v['end'] / div:10.2f}  max {v['max'] / div:10.2f} {unit}")
    lines.append(f"  RSS growth after warm-up: {r['rss_growth_after_warmup'] / 2**20:.2f} MiB")
    return "\n".join(lines)


def run(batches: int, every: int, loaders: int, warmup: float, rss_slack_mb: float, backend: str,
        data: str | None = None) -> Dict[str, Any]:
    slack = int(rss_slack_mb * 2**20)
    with tempfile.TemporaryDirectory() as tmp:
        path = data or os.path.join(tmp, "soak")
        if not data:
            make_data(path)
        res: Dict[str, Any] = {
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
            "config": {"batches": batches, "every": every, "loaders": loaders, "warmup": warmup,
                       "rss_slack_mb": rss_slack_mb, "backend": backend},
        }
        if batches:
            res["batches"] = phase_batches(path, batches, every, warmup, slack, backend)
        if loaders:
            res["loaders"] = phase_loaders(path, loaders, warmup, slack)
        res["pass"] = all(res[k]["pass"] for k in ("batches", "loaders") if k in res)
        return res


def main(argv: List[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, default=10**7, help="phase 1 batches (0 to skip)")
    ap.add_argument("--every", type=int, default=10**5, help="sample every this many batches")
    ap.add_argument("--loaders", type=int, default=10**4, help="phase 2 loaders created and destroyed (0 to skip)")
    ap.add_argument("--warmup", type=float, default=0.1, help="fraction of each phase's samples that is warm-up")
    ap.add_argument("--rss-slack-mb", type=float, default=4.0, help="allowed RSS growth after warm-up")
    ap.add_argument("--backend", default="mmap", help="phase 1 backend")
    ap.add_argument("--data", help="an existing dataset (default: a generated one)")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args(argv)
    res = run(a.batches, a.every, a.loaders, a.warmup, a.rss_slack_mb, a.backend, a.data)
    print(f"machine: {res['machine']['cpus']} CPUs, Python {res['machine']['python']}, {res['machine']['platform']}")
    if "batches" in res:
        b = res["batches"]
        print(f"phase 1: {b['batches']:,} batches (1 x 16 tokens, {b['backend']}) in {b['seconds']} s "
              f"({b['batches_per_s']:,}/s)")
        print(fmt("batches", b))
    if "loaders" in res:
        lo = res["loaders"]
        print(f"phase 2: {lo['loaders']:,} datasets + loaders opened, used and closed in {lo['seconds']} s")
        print(fmt("loaders", lo))
    print("soak:", "PASS" if res["pass"] else "FAIL")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0 if res["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
