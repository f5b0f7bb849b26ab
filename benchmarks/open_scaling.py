#!/usr/bin/env python3
"""open() of 10^4 sparse llm.c shards totalling 10^12 tokens: time and memory.

Target: under 1 s and under 100 MB (peak RSS delta of a fresh process). Each size runs in
its own process; the shards are sparse files (a real header, a hole for the tokens) kept
in the cache directory. Also prints time to first shuffled batch.

    python benchmarks/open_scaling.py                # 10^12 tokens in 10^4 shards
    python benchmarks/open_scaling.py --sizes 1e9 1e10 1e11 1e12 --json scaling.json
    python benchmarks/open_scaling.py --startup 10 1000 10000 100000   # open to first batch against shard count

--startup times open() to the first batch in a fresh process for a glob of llm.c shards and
a native dataset of that many shards (up to 10^4), without the node's catalog (cold: the
files' pages dropped from the page cache first; warm: again) and with it (the first open,
which writes it; then cold and warm opens that read it), and prints the ratio of each warm
figure to the smallest count's.
"""
import argparse
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tokenfeed_bench.common import default_cache as _default_cache  # noqa: E402
from tokenfeed_bench.scaling import open_scaling, startup_scaling  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", nargs="+", type=float, default=[1e12], help="total tokens per dataset")
    p.add_argument("--shards", type=int, default=10_000, help="shards for the largest size (default 10^4)")
    p.add_argument("--cache-dir", default=_default_cache())
    p.add_argument("--json", help="write the figures as JSON")
    p.add_argument("--clean", action="store_true", help="remove the sparse files afterwards")
    p.add_argument("--startup", nargs="+", type=int, metavar="SHARDS",
                   help="instead: open to first batch at these shard counts, cold and warm")
    p.add_argument("--repeats", type=int, default=5,
                   help="--startup: warm figures are the median of this many fresh processes (default 5)")
    a = p.parse_args()
    if a.startup:
        return startup(a)
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


def startup(a: argparse.Namespace) -> int:
    rows = startup_scaling(a.cache_dir, sorted(a.startup), log=lambda m: print(m, file=sys.stderr),
                           warm_repeats=max(1, a.repeats))
    ok = [r for r in rows if r["status"] == "ok"]
    base = {(r["set"], r["catalog"]): r for r in ok
            if r["start"] == "warm" and r["shards"] == min(a.startup)}
    print("| set | shards | no catalog: cold / warm (ms) | catalog: first open / cold / warm (ms) "
          "| warm / smallest, without / with catalog |")
    print("|---|--:|--:|--:|--:|")

    def ms(kind: str, k: int, cat: str, start: str) -> str:
        r = next((r for r in rows if (r["set"], r["shards"], r["catalog"], r["start"]) == (kind, k, cat, start)), None)
        return f"{r['first_batch_s'] * 1e3:.1f}" if r and r["status"] == "ok" else "failed" if r else "-"

    def ratio(kind: str, k: int, cat: str) -> str:
        w = next((r for r in ok if (r["set"], r["shards"], r["catalog"], r["start"]) == (kind, k, cat, "warm")), None)
        b = base.get((kind, cat))
        return f"{w['first_batch_s'] / b['first_batch_s']:.1f}x" if w and b else "-"

    for kind in dict.fromkeys(r["set"] for r in rows):
        for k in sorted(a.startup):
            if not any(r["set"] == kind and r["shards"] == k for r in rows):
                continue
            print(f"| {kind} | {k:,} | {ms(kind, k, 'none', 'cold')} / {ms(kind, k, 'none', 'warm')} "
                  f"| {ms(kind, k, 'first open', 'cold')} / {ms(kind, k, 'read', 'cold')} / {ms(kind, k, 'read', 'warm')} "
                  f"| {ratio(kind, k, 'none')} / {ratio(kind, k, 'read')} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
