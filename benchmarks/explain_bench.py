#!/usr/bin/env python3
"""Loader.explain(step) at step 10 and at step 10^9, and the data-wait meter against known truths.

explain is computed from the order alone, so its cost must not grow with the step: this
times it (median of many calls, per packing and for a mixture) at steps 10, 10^3, 10^6 and
10^9, and Loader.where (the reverse) over ten epochs. The meter part runs a consumer that works a known time per step against an engine
slowed by a known amount (the $TOKENFEED_FAULT_DELAY_MS hook of a test build) and prints
the fraction of wall time reported waiting next to the truth.

    python benchmarks/explain_bench.py                 # both parts
    python benchmarks/explain_bench.py --no-meter --json explain.json
"""
import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

import numpy as np

import tokenfeed

STEPS = (10, 10 ** 3, 10 ** 6, 10 ** 9)


def write(path, n_docs, mean_len, vocab, seed):
    rng = np.random.default_rng(seed)
    lens = np.maximum(1, rng.lognormal(np.log(mean_len), 1.0, size=n_docs).astype(np.int64))
    with tokenfeed.DatasetWriter(path, vocab_size=vocab) as w:
        for n in lens:
            w.add_document(rng.integers(0, vocab, size=int(n)))
    return tokenfeed.open(path)


def time_explain(loader, step, reps):
    loader.explain(step)  # warm (a packed order's window plan, the permutation's round keys)
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        loader.explain(step)
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def explain_part(tmp, reps, log):
    a = write(os.path.join(tmp, "a"), 20_000, 400, 50_000, 1)
    b = write(os.path.join(tmp, "b"), 5_000, 1_500, 50_000, 2)
    cases = {
        "concat": dict(dataset=a),
        "best_fit": dict(dataset=a, packing="best_fit"),
        "document": dict(dataset=a, packing="document"),
        "block shuffle": dict(dataset=a, shuffle="block"),
        "mixture 0.7/0.3": dict(dataset=[a, b], weights=[0.7, 0.3]),
    }
    rows = []
    for name, kw in cases.items():
        ds = kw.pop("dataset")
        l = tokenfeed.Loader(ds, seq_len=2048, batch_size=8, seed=0, output="numpy", **kw)
        t = {s: time_explain(l, s, reps) for s in STEPS}
        t0 = time.perf_counter()
        hits = l.where(1234, epochs="0:10")
        tw = time.perf_counter() - t0
        rows.append({"case": name, "seconds": {str(s): t[s] for s in STEPS}, "where_10_epochs_seconds": tw,
                     "where_rows": len(hits)})
        log(f"{name:>16}: " + "  ".join(f"step {s:.0e} {t[s] * 1e6:7.1f} us" for s in STEPS)
            + f"   (10^9 / 10: {t[10 ** 9] / t[10]:.2f}x); where(1234) over 10 epochs {tw * 1e3:.2f} ms"
            f" ({len(hits)} rows)")
    return rows


def meter_part(tmp, log):
    if not tokenfeed.build_info()["test_hooks"]:
        log("meter: skipped (needs a test build: TOKENFEED_TEST_HOOKS=1 for the engine delay hook)")
        return []
    ds = write(os.path.join(tmp, "m"), 2_000, 300, 50_000, 3)
    # (engine delay ms, consumer work ms, truth): truth = share of the cycle spent waiting
    cases = [(0, 50, 0.0), (100, 0, 1.0), (100, 50, 0.5), (100, 75, 0.25)]
    rows = []
    for delay, work, truth in cases:
        os.environ["TOKENFEED_FAULT_DELAY_MS"] = str(delay)
        l = tokenfeed.Loader(ds, seq_len=2048, batch_size=8, output="numpy", num_threads=1, prefetch=1)
        os.environ.pop("TOKENFEED_FAULT_DELAY_MS")
        for _ in range(5):  # warm-up: the first batch waits for the threads to start
            next(l)
        for _ in range(40):
            next(l)
            if work:
                time.sleep(work / 1e3)
        m = l.meter(40)
        l.close()
        rows.append({"engine_ms": delay, "consumer_ms": work, "truth": truth, **m})
        log(f"engine {delay:3d} ms/batch, consumer {work:3d} ms/step: truth {100 * truth:5.1f} %, "
            f"meter {m['wait_percent']:5.1f} % (p50 {m['wait_p50_seconds'] * 1e3:.1f} ms, "
            f"p99 {m['wait_p99_seconds'] * 1e3:.1f} ms, ready ahead {m['ready_ahead_mean']:.1f})")
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=200, help="calls timed per step (median)")
    p.add_argument("--no-meter", action="store_true", help="only the explain timings")
    p.add_argument("--json", help="write the figures as JSON")
    a = p.parse_args()
    log = print
    with tempfile.TemporaryDirectory() as tmp:
        out = {"explain": explain_part(tmp, a.reps, log), "meter": [] if a.no_meter else meter_part(tmp, log)}
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
