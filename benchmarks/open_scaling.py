#!/usr/bin/env python3
"""open() of 10^4 sparse llm.c shards totalling 10^12 tokens: time and memory.

Target: under 1 s and under 100 MB (peak RSS delta of a fresh process). Each size runs in
its own process; the shards are sparse files (a real header, a hole for the tokens) kept
in the cache directory. Also prints time to first shuffled batch.

    python benchmarks/open_scaling.py                # 10^12 tokens in 10^4 shards
    python benchmarks/open_scaling.py --sizes 1e9 1e10 1e11 1e12 --json scaling.json
"""
import argparse
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tokenfeed_bench.common import default_cache as _default_cache  # noqa: E402
from tokenfeed_bench.scaling import open_scaling  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", nargs="+", type=float, default=[1e12], help="total tokens per dataset")
    p.add_argument("--shards", type=int, default=10_000, help="shards for the largest size (default 10^4)")
    p.add_argument("--cache-dir", default=_default_cache())
    p.add_argument("--json", help="write the figures as JSON")
    p.add_argument("--clean", action="store_true", help="remove the sparse files afterwards")
    a = p.parse_args()
    sizes = [int(s) for s in a.sizes]
    big = max(sizes)
    shards = lambda n: max(1, round(a.shards * n / big))  # noqa: E731
    rows = open_scaling(a.cache_dir, sizes, shards_for=shards, log=lambda m: print(m, file=sys.stderr))
    ok = True
    for r in rows:
        if r["status"] != "ok":
            print(f"{r['tokens']:.0e} tokens: failed: {r['reason']}")
            ok = False
            continue
        good = r["open_s"] < 1.0 and r["open_rss_delta_mb"] < 100
        ok &= good
        print(f"{r['tokens']:.0e} tokens in {r['shards']} shards ({r['format']}): open() {r['open_s'] * 1e3:.0f} ms, "
              f"peak RSS +{r['open_rss_delta_mb']:.1f} MB; first batch {r['first_batch_s'] * 1e3:.0f} ms "
              f"(+{r['first_batch_rss_delta_mb']:.1f} MB) -> {'OK' if good else 'OVER TARGET'} (< 1 s, < 100 MB)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    if a.clean:
        shutil.rmtree(os.path.join(a.cache_dir, "sparse"), ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
