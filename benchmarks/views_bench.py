#!/usr/bin/env python3
"""Views: building a selection over 10^7 (or 10^8) documents, and a filtered loader's steady tokens/s.

Part 1 writes a Megatron .bin/.idx of N short documents with NumPy (no tokenfeed writer) and
two numeric metadata columns beside it, then, in a fresh process per size, times each step
of ``Dataset.filter("quality >= 0.5 and bucket < 80")`` (the C filter over the columns, the
ids, the view's lengths in C) and reports the process's peak RSS above what opening took.

Part 2 writes ~10^8 tokens in documents of log-normal lengths, and alternates two loaders
over it in one run (unfiltered; a filter keeping about half the documents), each for the
same number of batches, and reports tokens/s of each (median of the rounds).

    python benchmarks/views_bench.py                       # 10^7 documents, throughput
    python benchmarks/views_bench.py --docs 100000000      # 10^8 (needs ~6 GB of disk, ~4 GB RAM)
    python benchmarks/views_bench.py --json views.json
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

import tokenfeed
from tokenfeed.sources import _views


def write_megatron(prefix: str, lens: np.ndarray, vocab: int, seed: int) -> None:
    """MMIDIDX v1 (uint16 tokens) of documents of lengths ``lens``, written in slices."""
    n = len(lens)
    sizes = lens.astype(np.int32)
    pointers = np.zeros(n, dtype=np.int64)
    np.cumsum(sizes[:-1].astype(np.int64) * 2, out=pointers[1:])
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", 8) + struct.pack("<Q", n)
                + struct.pack("<Q", n + 1))
        f.write(sizes.tobytes())
        f.write(pointers.tobytes())
        f.write(np.arange(n + 1, dtype=np.int64).tobytes())
    rng = np.random.default_rng(seed)
    total = int(lens.sum())
    with open(prefix + ".bin", "wb") as f:
        step = 1 << 26
        for a in range(0, total, step):
            f.write(rng.integers(1, vocab, size=min(step, total - a), dtype=np.uint16).tobytes())


def make_selection_data(d: str, n: int) -> str:
    prefix = os.path.join(d, f"sel{n}")
    if not os.path.exists(prefix + ".columns"):
        write_megatron(prefix, np.full(n, 4, dtype=np.int64), 50000, 1)
        rng = np.random.default_rng(2)
        ds = tokenfeed.open(prefix)
        _views.write_columns(prefix + ".columns", n, {"quality": rng.random(n), "bucket": rng.integers(0, 100, n)},
                             dataset_fingerprint=ds.fingerprint)
    return prefix


CHILD = r"""
import json, resource, sys, time
import numpy as np
import tokenfeed
prefix, where = sys.argv[1], sys.argv[2]
t = time.perf_counter(); ds = tokenfeed.open(prefix); t_open = time.perf_counter() - t
rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter(); cols = ds.columns(); t_cols = time.perf_counter() - t
t = time.perf_counter(); mask = cols.eval(where); t_eval = time.perf_counter() - t
t = time.perf_counter(); ids = np.flatnonzero(mask).astype(np.uint64); t_ids = time.perf_counter() - t
t = time.perf_counter(); core = ds._core.select(ids); t_sel = time.perf_counter() - t
del core, ids, mask
t = time.perf_counter(); v = ds.filter(where); t_filter = time.perf_counter() - t
rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
del v
t = time.perf_counter(); v = tokenfeed.open(prefix).filter(where); t_kept = time.perf_counter() - t
print(json.dumps({"documents": ds.num_documents, "selected": v.num_documents, "open_s": t_open,
                  "columns_open_s": t_cols, "eval_s": t_eval, "ids_s": t_ids, "select_s": t_sel,
                  "filter_s": t_filter, "open_and_filter_kept_s": t_kept, "peak_rss_above_open_mib": (rss1 - rss0) / 1024}))
"""


def selection(d: str, n: int, where: str) -> dict:
    prefix = make_selection_data(d, n)
    cat = os.path.join(d, "catalog")  # a catalog of its own, emptied: the first filter computes, the last reads
    if os.path.isdir(cat):
        import shutil
        shutil.rmtree(cat)
    env = dict(os.environ, TOKENFEED_CATALOG_DIR=cat)
    out = subprocess.run([sys.executable, "-c", CHILD, prefix, where], check=True, capture_output=True, text=True,
                         env=env)
    return json.loads(out.stdout)


def throughput(d: str, tokens: int, seq_len: int, batch: int, batches: int, rounds: int, packing: str) -> dict:
    prefix = os.path.join(d, f"tp{tokens}")
    rng = np.random.default_rng(3)
    mean = 600
    if not os.path.exists(prefix + ".columns"):
        lens = np.maximum(1, rng.lognormal(np.log(mean), 1.0, size=tokens // mean)).astype(np.int64)
        write_megatron(prefix, lens, 50000, 4)
        ds = tokenfeed.open(prefix)
        _views.write_columns(prefix + ".columns", ds.num_documents, {"keep": rng.integers(0, 2, ds.num_documents)},
                             dataset_fingerprint=ds.fingerprint)
    for ext in (".bin", ".idx"):  # in the page cache before any round: rounds compare the loaders, not the disk
        with open(prefix + ext, "rb") as f:
            while f.read(1 << 24):
                pass
    ds = tokenfeed.open(prefix)
    view = ds.filter("keep == 1")
    kw = dict(seq_len=seq_len, batch_size=batch, output="numpy", packing=packing.split("+")[0], seed=1)
    if packing == "concat+sep":  # concat with a separator after each document: rows walk documents either way
        kw["separator_id"] = 0
    elif packing != "concat":
        kw["pad_id"] = 0
    res: dict = {"unfiltered": [], "filtered": []}
    for r in range(rounds):
        for name, data in (("unfiltered", ds), ("filtered", view)):
            ld = tokenfeed.Loader(data, **kw)
            for _ in range(20):  # warm: threads, page cache
                next(ld)
            t = time.perf_counter()
            for _ in range(batches):
                next(ld)
            dt = time.perf_counter() - t
            res[name].append(batches * batch * (seq_len + 1) / dt)
            ld.close()
    return {"packing": packing, "documents": ds.num_documents, "selected": view.num_documents,
            "tokens": ds.num_tokens, "selected_tokens": view.num_tokens,
            "unfiltered_tok_s": statistics.median(res["unfiltered"]),
            "filtered_tok_s": statistics.median(res["filtered"]), "rounds": res}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, nargs="+", default=[10 ** 7])
    ap.add_argument("--where", default="quality >= 0.5 and bucket < 80")
    ap.add_argument("--tokens", type=int, default=10 ** 8)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--batches", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", help="where to write the data (default: a temporary directory, kept for reruns)")
    ap.add_argument("--no-throughput", action="store_true")
    ap.add_argument("--json", metavar="PATH")
    a = ap.parse_args()
    d = a.dir or os.path.join(tempfile.gettempdir(), "tokenfeed-views-bench")
    os.makedirs(d, exist_ok=True)
    out: dict = {"selection": [], "throughput": []}
    for n in a.docs:
        r = selection(d, n, a.where)
        out["selection"].append(r)
        print(f"selection over {r['documents']:,} documents ({a.where!r}: {r['selected']:,} kept): "
              f"columns open {r['columns_open_s'] * 1e3:.1f} ms, C filter {r['eval_s']:.3f} s, ids {r['ids_s']:.3f} s, "
              f"view {r['select_s']:.3f} s; Dataset.filter {r['filter_s']:.3f} s; "
              f"open + filter from the kept selection {r['open_and_filter_kept_s']:.3f} s; "
              f"peak RSS +{r['peak_rss_above_open_mib']:.0f} MiB", flush=True)
    if not a.no_throughput:
        for packing in ("concat", "concat+sep", "best_fit"):
            r = throughput(d, a.tokens, a.seq_len, a.batch, a.batches, a.rounds, packing)
            out["throughput"].append(r)
            print(f"{packing}: unfiltered {r['unfiltered_tok_s'] / 1e6:.1f} M tok/s, filtered (keeps "
                  f"{r['selected'] / r['documents']:.0%} of documents) {r['filtered_tok_s'] / 1e6:.1f} M tok/s "
                  f"({r['filtered_tok_s'] / r['unfiltered_tok_s']:.0%})", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
