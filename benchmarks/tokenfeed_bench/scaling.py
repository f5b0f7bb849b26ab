"""open() time, memory and time to first batch as a dataset grows to 10^12 tokens.

Used by ``benchmarks/open_scaling.py``. The shards are sparse llm.c files (a real
header, a hole for the tokens), so 10^12 tokens take no disk space; each size is
measured in a fresh process (RSS delta = peak RSS after minus RSS before).
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from .common import RESULT, human, package_parent, reset_peak_rss, self_status
from .data import drop_cache, make_sparse_llmc


def open_scaling(cache: str, sizes: Sequence[int], *, shards_for: Optional[Callable[[int], int]] = None,
                 seq_len: int = 2048, batch_size: int = 8, log: Callable[[str], None] = lambda m: None,
                 python: str = sys.executable, first_batch: bool = True) -> List[Dict[str, Any]]:
    if shards_for is None:
        shards_for = lambda n: max(1, min(10_000, n // 10**8))  # noqa: E731
    out = []
    for n in sizes:
        k = shards_for(n)
        d = os.path.join(cache, "sparse", f"llmc-{n}-{k}")
        make_sparse_llmc(d, n, k)
        out.append(_child(python, f"scaling_child({d!r}, {seq_len}, {batch_size}, {bool(first_batch)})",
                          {"tokens": n, "shards": k, "format": "llm.c (sparse)"}, log,
                          f"scaling {human(n)} tokens / {k} shards",
                          lambda r: f"open {r['open_s'] * 1e3:.0f} ms, +{r['open_rss_delta_mb']:.1f} MB; first batch "
                                    f"{r.get('first_batch_s', 0) * 1e3:.0f} ms"))
    return out


def _child(python: str, call: str, extra: Dict[str, Any], log: Callable[[str], None], label: str,
           summary: Callable[[Dict[str, Any]], str], env_extra: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """Run ``tokenfeed_bench.scaling.<call>`` in a fresh process (with ``env_extra`` in its
    environment): its dict and ``extra``, with status "ok" (logged as ``label: summary(r)``), or
    status "failed" and the last line of its stderr."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(x for x in (package_parent(), os.environ.get("PYTHONPATH"))
                                                      if x), **(env_extra or {}))
    code = f"import json\nfrom tokenfeed_bench import scaling\nprint({RESULT!r}+json.dumps(scaling.{call}))"
    p = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=600, env=env)
    i = p.stdout.rfind(RESULT)
    if i < 0:
        r: Dict[str, Any] = {"status": "failed", "reason": (p.stderr.strip().splitlines() or ["?"])[-1]}
        log(f"{label}: failed: {r['reason']}")
    else:
        r = dict(json.loads(p.stdout[i + len(RESULT):]), status="ok")
        log(f"{label}: {summary(r)}")
    r.update(extra)
    return r


def scaling_child(d: str, seq_len: int, batch_size: int, first_batch: bool) -> Dict[str, Any]:
    import tokenfeed

    names = sorted(glob.glob(os.path.join(d, "shard_*.bin")))
    rss0 = self_status("VmRSS")
    reset_peak_rss()
    t = time.perf_counter()
    ds = tokenfeed.open(names)
    r: Dict[str, Any] = {"open_s": time.perf_counter() - t}
    r["open_rss_delta_mb"] = (self_status("VmHWM") - rss0) / 1024
    if first_batch:
        t = time.perf_counter()
        loader = tokenfeed.Loader(ds, seq_len=seq_len, batch_size=batch_size, seed=0, output="numpy")
        next(iter(loader))
        r["first_batch_s"] = time.perf_counter() - t
        r["first_batch_rss_delta_mb"] = (self_status("VmHWM") - rss0) / 1024
        loader.close()
    r["num_tokens"] = ds.num_tokens
    return r


# ---- start-up against the shard count: glob of llm.c shards, native dataset, cold and warm ----

def _evict(paths: Sequence[str]) -> None:
    """Drop the files' clean pages from the page cache (no root needed), for a cold start."""
    drop_cache(paths)


def make_native_shards(d: str, shards: int, tokens_per_shard: int = 2048) -> str:
    """A native dataset of `shards` shards of one document each (vocab 50257)."""
    import numpy as np

    import tokenfeed

    stamp = d + ".done"
    if not os.path.exists(stamp):
        rng = np.random.default_rng(0)
        with tokenfeed.DatasetWriter(d, vocab_size=50257, shard_tokens=tokens_per_shard, overwrite=True) as w:
            for _ in range(shards):
                w.add_document(rng.integers(0, 50257, size=tokens_per_shard, dtype=np.uint16))
        open(stamp, "w").close()
    return d


def startup_child(spec: str, seq_len: int, batch_size: int) -> Dict[str, Any]:
    import tokenfeed

    t0 = time.perf_counter()
    ds = tokenfeed.open(spec)
    t1 = time.perf_counter()
    loader = tokenfeed.Loader(ds, seq_len=seq_len, batch_size=batch_size, seed=0, output="numpy")
    next(iter(loader))
    t2 = time.perf_counter()
    loader.close()
    return {"open_s": t1 - t0, "first_batch_s": t2 - t0, "num_files": ds.num_files}


def startup_scaling(cache: str, counts: Sequence[int], *, seq_len: int = 512, batch_size: int = 8,
                    log: Callable[[str], None] = lambda m: None, python: str = sys.executable,
                    native_max: int = 10_000, warm_repeats: int = 5) -> List[Dict[str, Any]]:
    """Time from open() to the first batch in a fresh process, for each shard count and set kind
    (native datasets up to ``native_max`` shards), without and with the node's catalog:

    * no catalog (``TOKENFEED_CATALOG_DIR=off``): cold (the files' pages dropped from the page
      cache first), then warm (the same again);
    * catalog: the first open, which parses every file and writes the catalog (cold); then cold
      again (pages and catalog dropped from the page cache, the catalog file kept); then warm.

    Warm figures are the median of ``warm_repeats`` fresh processes."""
    out = []
    for k in counts:
        ld = os.path.join(cache, "startup", f"llmc-{k}")
        names = make_sparse_llmc(ld, k * 1_000_000, k)
        sets = [("llm.c glob", os.path.join(ld, "shard_*.bin"), names)]
        if k <= native_max:
            nd = make_native_shards(os.path.join(cache, "startup", f"native-{k}"), k)
            sets.append(("native", nd, sorted(glob.glob(os.path.join(nd, "*")))))
        # The node's catalog records only files and directories left unmodified for two
        # seconds (a change within the file system's timestamp granularity would go unseen):
        # a set written just now is catalogued once it has settled, as a real dataset has.
        newest = max(os.stat(p).st_mtime for p in [ld] + ([nd] if k <= native_max else []))
        time.sleep(max(0.0, newest + 2.5 - time.time()))
        for kind, spec, files in sets:
            catdir = os.path.join(cache, "startup", "catalog")
            shutil.rmtree(catdir, ignore_errors=True)
            runs = [("none", "cold", "off"), ("none", "warm", "off"),
                    ("first open", "cold", catdir), ("read", "cold", catdir), ("read", "warm", catdir)]
            for cat, temp, cdir in runs:
                # a warm start takes a few ms, where one sample is mostly noise: the median of
                # warm_repeats fresh processes (each sample kept in "samples")
                samples = []
                for _ in range(warm_repeats if temp == "warm" else 1):
                    if temp == "cold":
                        extra = [p for ext in ("*.tfcat", "*.tfset") for p in glob.glob(os.path.join(catdir, ext))] \
                            if cdir != "off" else []
                        _evict(files + extra + ([os.path.dirname(files[0])] if files else []))
                    samples.append(_child(python, f"startup_child({spec!r}, {seq_len}, {batch_size})",
                                          {"set": kind, "shards": k, "start": temp, "catalog": cat}, log,
                                          f"start-up {kind}, {k} shards, {temp}, catalog {cat}",
                                          lambda r: f"open {r['open_s'] * 1e3:.1f} ms, first batch "
                                                    f"{r['first_batch_s'] * 1e3:.1f} ms",
                                          env_extra={"TOKENFEED_CATALOG_DIR": cdir}))
                ok = sorted((r for r in samples if r.get("status") == "ok"), key=lambda r: r["first_batch_s"])
                r = dict(ok[len(ok) // 2]) if ok else samples[-1]
                if len(samples) > 1:
                    r["samples"] = [x.get("first_batch_s") for x in samples]
                out.append(r)
            shutil.rmtree(catdir, ignore_errors=True)
    return out
