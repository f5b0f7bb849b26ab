#!/usr/bin/env python3
"""zstd-compressed datasets: compression ratio on real text, and loader speed against uncompressed data.

Everything runs offline. The real text is the source of the Python standard library
installed with this interpreter (``sysconfig``'s ``stdlib`` directory: ``*.py`` files,
code and docstrings, one document per file), tokenized with a byte-level BPE that
``tokenizers`` trains here, in-process, on part of that text. No data or model is
downloaded.

It measures:

* the zstd ratio (level 3 unless ``--level``) of the real tokens for several
  ``block_tokens``, and of i.i.d. Zipf tokens for reference;
* loader tokens/s, ``shuffle="block"`` (defaults: block_size 1024, window_blocks 16):
  uncompressed vs zstd (64 Ki-token blocks), with the decode cost from ``stats()``;
* the single-thread sequential decode rate (``Dataset.tokens()`` in 1 Mi-token
  chunks: C decode + copy), and workers x that rate;
* ``shuffle="full"`` on zstd data at small block sizes (``--full-block-tokens``) and
  at 64 Ki, beside uncompressed;
* rank 0 of ``--ranks`` data-parallel ranks on the block shuffle, at 64 Ki and 4 Ki
  blocks: each rank decodes the blocks its own samples touch.

Trials are interleaved (every configuration once per trial) so that a noisy machine
slows all of them alike; the report gives the best trial of each and the ratios of
the medians. ``--json`` writes every figure.

    python benchmarks/zstd_bench.py                 # ~4 minutes on 2 cores
    python benchmarks/zstd_bench.py --quick         # ~1.5 minutes, smaller data
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import sys
import sysconfig
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

import tokenfeed

MiB = 1 << 20


def log(msg: str) -> None:
    print(f"[zstd_bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def human(x: float) -> str:
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.3g} {unit}"
    return f"{x:.3g}"


def dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path) if f.endswith(".tfs"))


def token_bytes(path: str) -> int:
    """Stored bytes of the token sections (what compression changes), summed over the shards."""
    total = 0
    for f in os.listdir(path):
        if f.endswith(".tfs"):
            with open(os.path.join(path, f), "rb") as fh:
                h = fh.read(256)
            total += int.from_bytes(h[56:64], "little")
    return total


# ---------------------------------------------------------------------------
# real text: the standard library's sources, tokenized with an in-process BPE
# ---------------------------------------------------------------------------

def stdlib_documents(max_bytes: int) -> Tuple[List[str], Dict[str, Any]]:
    root = sysconfig.get_paths()["stdlib"]
    site = {os.path.realpath(p) for p in (sysconfig.get_paths().get("purelib"), sysconfig.get_paths().get("platlib"))
            if p}
    docs: List[str] = []
    total = 0
    for d, subdirs, files in os.walk(root):
        subdirs[:] = sorted(s for s in subdirs if os.path.realpath(os.path.join(d, s)) not in site
                            and s not in ("site-packages", "dist-packages", "__pycache__"))
        for f in sorted(files):
            if not f.endswith(".py"):
                continue
            try:
                with open(os.path.join(d, f), encoding="utf-8") as fh:
                    text = fh.read()
            except (OSError, UnicodeDecodeError):
                continue
            if text:
                docs.append(text)
                total += len(text.encode("utf-8"))
            if total >= max_bytes:
                break
        if total >= max_bytes:
            break
    info = {"source": f"*.py under {root} (Python {sys.version.split()[0]}), site-packages excluded",
            "documents": len(docs), "bytes": total}
    return docs, info


def tokenize_real(cache: str, max_bytes: int, vocab: int) -> Tuple[np.ndarray, np.ndarray, Dict[str, Any]]:
    """Tokens (uint16) and document lengths of the stdlib text; cached in `cache`."""
    key = f"stdlib-{sys.version_info[0]}.{sys.version_info[1]}-{max_bytes}-{vocab}"
    tpath, lpath, mpath = (os.path.join(cache, f"{key}.{x}") for x in ("tokens.npy", "lengths.npy", "json"))
    if all(os.path.exists(p) for p in (tpath, lpath, mpath)):
        with open(mpath) as fh:
            info = json.load(fh)
        info["reused"] = True
        return np.load(tpath), np.load(lpath), info
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    docs, info = stdlib_documents(max_bytes)
    log(f"real text: {len(docs)} files, {info['bytes'] / MiB:.1f} MiB; training a {vocab}-token BPE")
    t0 = time.monotonic()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    # train on every 4th file (a quarter of the text), tokenize all of it
    tok.train_from_iterator(docs[::4], trainer=trainer)
    t1 = time.monotonic()
    eot = tok.token_to_id("<|endoftext|>")
    parts: List[np.ndarray] = []
    lens: List[int] = []
    for i in range(0, len(docs), 256):
        for enc in tok.encode_batch(docs[i:i + 256]):
            ids = np.asarray(enc.ids + [eot], dtype=np.uint16)
            parts.append(ids)
            lens.append(len(ids))
    tokens = np.concatenate(parts)
    lengths = np.asarray(lens, dtype=np.int64)
    info.update(vocab_size=vocab, tokens=int(tokens.size), bytes_per_token=info["bytes"] / tokens.size,
                train_seconds=round(t1 - t0, 1), tokenize_seconds=round(time.monotonic() - t1, 1),
                tokenizer="tokenizers byte-level BPE trained here on every 4th file")
    os.makedirs(cache, exist_ok=True)
    np.save(tpath, tokens)
    np.save(lpath, lengths)
    with open(mpath, "w") as fh:
        json.dump(info, fh)
    info["reused"] = False
    log(f"real text: {tokens.size / 1e6:.1f} M tokens ({info['bytes_per_token']:.2f} bytes/token), "
        f"BPE {info['train_seconds']}s, tokenize {info['tokenize_seconds']}s")
    return tokens, lengths, info


def zipf_tokens(n: int, vocab: int, seed: int = 0) -> Tuple[np.ndarray, np.ndarray]:
    """i.i.d. Zipf(1.1) tokens over a shuffled vocabulary, as the main benchmark generates."""
    rng = np.random.default_rng(seed)
    ranks = np.arange(1, vocab + 1, dtype=np.float64)
    cdf = np.cumsum(ranks ** -1.1)
    cdf /= cdf[-1]
    ids = rng.permutation(vocab).astype(np.uint16)
    toks = ids[np.searchsorted(cdf, rng.random(n), side="right").clip(0, vocab - 1)]
    lens = np.clip(np.rint(rng.lognormal(6.0, 1.0, size=n // 64 + 16)), 1, 1 << 20).astype(np.int64)
    ends = np.cumsum(lens)
    k = int(np.searchsorted(ends, n))
    lens = lens[:k + 1]
    lens[-1] = n - (int(ends[k - 1]) if k else 0)
    return toks, lens[lens > 0]


def write(path: str, tokens: np.ndarray, lengths: np.ndarray, vocab: int, *, repeat: int = 1,
          compression: Optional[str] = None, block_tokens: int = 65536, level: int = 3) -> Dict[str, Any]:
    """Write tokens (split at `lengths`) `repeat` times; reused when the same spec was written before."""
    spec = {"tokens": int(tokens.size), "repeat": repeat, "compression": compression, "block_tokens": block_tokens,
            "level": level, "vocab": vocab, "checksum": int(tokens[: 1 << 16].astype(np.uint64).sum())}
    mpath = os.path.join(path, "bench-spec.json")
    if os.path.exists(mpath):
        with open(mpath) as fh:
            if json.load(fh) == spec:
                return {"path": path, "reused": True}
    shutil.rmtree(path, ignore_errors=True)
    t0 = time.monotonic()
    ends = np.cumsum(lengths)
    starts = ends - lengths
    with tokenfeed.DatasetWriter(path, vocab_size=vocab, compression=compression, block_tokens=block_tokens,
                                 level=level) as w:
        for _ in range(repeat):
            for s, e in zip(starts.tolist(), ends.tolist()):
                w.add_document(tokens[s:e])
    with open(mpath, "w") as fh:
        json.dump(spec, fh)
    return {"path": path, "reused": False, "seconds": round(time.monotonic() - t0, 1)}


def ratios(tokens: np.ndarray, lengths: np.ndarray, vocab: int, scratch: str, block_sizes: List[int],
           level: int) -> List[Dict[str, Any]]:
    """zstd ratio (token section bytes) for each block size."""
    raw = tokens.size * tokens.dtype.itemsize
    out = []
    for bt in block_sizes:
        p = os.path.join(scratch, f"ratio-{bt}")
        write(p, tokens, lengths, vocab, compression="zstd", block_tokens=bt, level=level)
        z = token_bytes(p)
        ds = tokenfeed.open(p)
        t = time.perf_counter()
        n = 0
        for s in range(0, ds.num_tokens, MiB):
            n += len(ds.tokens(s, min(ds.num_tokens, s + MiB)))
        dt = time.perf_counter() - t
        out.append({"block_tokens": bt, "level": level, "raw_bytes": raw, "zstd_bytes": z, "ratio": raw / z,
                    "decode_tokens_per_s": n / dt})
        shutil.rmtree(p, ignore_errors=True)
    return out


# ---------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------

def other_threads_cpu() -> float:
    """CPU seconds used so far by this process's threads other than the caller (the loader's
    workers), from /proc; 0.0 where /proc is missing. On a busy machine, tokens per worker
    CPU-second is steadier than tokens per second: it leaves out the time the workers were
    not running."""
    me = str(threading.get_native_id())
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    try:
        for t in os.listdir("/proc/self/task"):
            if t == me:
                continue
            try:
                with open(f"/proc/self/task/{t}/stat") as fh:
                    f = fh.read().rsplit(")", 1)[1].split()
                total += int(f[11]) + int(f[12])
            except OSError:
                pass
    except OSError:
        return 0.0
    return total / tick


def time_loader(path: str, shuffle: str, *, seq_len: int, batch_size: int, seconds: float, warmup_tokens: int,
                threads: Optional[int] = None, world_size: int = 1) -> Dict[str, Any]:
    """Tokens/s of rank 0 of world_size ranks (the other ranks' batches are not read)."""
    ds = tokenfeed.open(path)
    ld = tokenfeed.Loader(ds, seq_len=seq_len, batch_size=batch_size, seed=0, shuffle=shuffle, rank=0,
                          world_size=world_size, num_threads=threads, dtype="int64", output="numpy")
    it = iter(ld)
    per = seq_len * batch_size
    # warm-up: a shuffle window or more, and until the block cache has touched all of its memory
    # (first-touch page faults are a start-up cost, not the steady state), within a time limit
    t = time.perf_counter()
    got = 0
    while time.perf_counter() - t < max(3 * seconds, 5.0):
        for _ in range(16):
            next(it)
        got += 16 * per
        if got >= warmup_tokens:
            z = ld.stats().get("zstd") or {}
            if z.get("cache_allocated", 0) >= z.get("cache_bytes", 0):
                break
    st0 = ld.stats()
    z0 = st0.get("zstd") or {}
    c0 = other_threads_cpu()
    t = time.perf_counter()
    n = 0
    while True:
        next(it)
        n += 1
        if n % 16 == 0 and time.perf_counter() - t >= seconds:
            break
    dt = time.perf_counter() - t
    cpu = other_threads_cpu() - c0
    st = ld.stats()
    z = st.get("zstd") or {}
    ld.close()
    r: Dict[str, Any] = {"tokens_per_s": n * per / dt, "batches": n, "seconds": dt, "num_threads": st["num_threads"],
                         "tokens_per_worker_cpu_s": n * per / cpu if cpu > 0 else None}
    if z.get("cache_bytes"):
        dec = z["tokens_decoded"] - z0.get("tokens_decoded", 0)
        used = z["tokens_used"] - z0.get("tokens_used", 0)
        r.update(decode_ratio=dec / used if used else None, decode_model=z["decode_model"],
                 cache_mib=z["cache_bytes"] / MiB, cache_allocated_mib=z["cache_allocated"] / MiB,
                 note=z.get("note", ""))
    return r


def time_decode(path: str, seconds: float) -> Dict[str, Any]:
    """One thread decoding sequentially: Dataset.tokens() in 1 Mi-token chunks (C decode + copy)."""
    ds = tokenfeed.open(path)
    n = 0
    s = 0
    c = time.thread_time()
    t = time.perf_counter()
    while time.perf_counter() - t < seconds:
        e = min(ds.num_tokens, s + MiB)
        n += len(ds.tokens(s, e))
        s = 0 if e >= ds.num_tokens else e
    dt, cpu = time.perf_counter() - t, time.thread_time() - c
    return {"tokens_per_s": n / dt, "tokens_per_worker_cpu_s": n / cpu if cpu > 0 else None}


def interleaved(cases: Dict[str, Callable[[], Dict[str, Any]]], trials: int) -> Dict[str, Dict[str, Any]]:
    runs: Dict[str, List[Dict[str, Any]]] = {k: [] for k in cases}
    for t in range(trials):
        for name, fn in cases.items():
            r = fn()
            runs[name].append(r)
            extra = f", decode x{r['decode_ratio']:.2f}" if r.get("decode_ratio") else ""
            log(f"trial {t + 1}/{trials} {name}: {human(r['tokens_per_s'])} tokens/s{extra}")
    out = {}
    for name, rs in runs.items():
        tps = [r["tokens_per_s"] for r in rs]
        best = max(rs, key=lambda r: r["tokens_per_s"])
        cpus = [r["tokens_per_worker_cpu_s"] for r in rs if r.get("tokens_per_worker_cpu_s")]
        out[name] = dict(best, best_tokens_per_s=max(tps), median_tokens_per_s=statistics.median(tps),
                         trials=tps, cpu_trials=cpus)
    return out


# ---------------------------------------------------------------------------

def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cache-dir", default=os.environ.get("TOKENFEED_BENCH_CACHE",
                                                         os.path.expanduser("~/.cache/tokenfeed/zstd-bench")))
    p.add_argument("--text-bytes", type=int, default=48 * MiB, help="stdlib text to tokenize (default 48 MiB)")
    p.add_argument("--vocab", type=int, default=32000, help="BPE vocabulary (default 32000)")
    p.add_argument("--tokens", type=int, default=None,
                   help="tokens of the speed datasets: the real tokens repeated (default 160e6; 96e6 with --quick)")
    p.add_argument("--level", type=int, default=3)
    p.add_argument("--block-sizes", default="65536,16384,8192,4096,2048,1024",
                   help="block_tokens values for the ratio table")
    p.add_argument("--full-block-tokens", default="2048,4096,8192,16384",
                   help="small block sizes measured with shuffle='full' (comma-separated)")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--threads", default="default",
                   help="comma-separated worker counts for the block-shuffle comparison ('default' = the "
                        "loader's default); e.g. default,2")
    p.add_argument("--ranks", type=int, default=8, help="world size of the data-parallel cases (rank 0 is timed)")
    p.add_argument("--seconds", type=float, default=None, help="timed seconds per configuration and trial (default 2)")
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", help="write the report here")
    a = p.parse_args(argv)
    if a.seconds is None:
        a.seconds = 1.0 if a.quick else 2.0
    if a.tokens is None:
        a.tokens = 96_000_000 if a.quick else 160_000_000
    if a.quick:
        a.trials = min(a.trials, 2)
    if not tokenfeed.build_info()["zstd"]["usable"]:
        print("zstd is not compiled into this tokenfeed build (install libzstd-dev and reinstall)", file=sys.stderr)
        return 2
    os.makedirs(a.cache_dir, exist_ok=True)
    t_start = time.monotonic()
    report: Dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                                          "loadavg_start": os.getloadavg()[0],
                                          "tokenfeed": tokenfeed.__version__ if hasattr(tokenfeed, "__version__")
                                          else None},
                              "config": {k: v for k, v in vars(a).items() if k != "json"}}

    # ---- ratio on real text and on Zipf tokens
    real, real_lens, tinfo = tokenize_real(a.cache_dir, a.text_bytes, a.vocab)
    report["real_text"] = tinfo
    sizes = [int(x) for x in a.block_sizes.split(",")]
    small = [int(x) for x in a.full_block_tokens.split(",")]
    sizes += [b for b in small if b not in sizes]
    log("ratios on real text ...")
    report["ratio_real"] = ratios(real, real_lens, a.vocab, a.cache_dir, sizes, a.level)
    ztok, zlens = zipf_tokens(min(real.size, 16 * MiB), 50257)
    log("ratios on Zipf tokens ...")
    report["ratio_zipf"] = ratios(ztok, zlens, 50257, a.cache_dir, [65536] + small, a.level)
    for name in ("ratio_real", "ratio_zipf"):
        for r in report[name]:
            log(f"{name}: block_tokens {r['block_tokens']:>6}: ratio {r['ratio']:.3f}, "
                f"sequential decode {human(r['decode_tokens_per_s'])} tokens/s")

    # ---- speed datasets: the real tokens repeated up to --tokens
    rep = max(1, -(-a.tokens // real.size))
    log(f"writing speed datasets: {rep} x {real.size / 1e6:.1f} M real tokens")
    paths: Dict[Any, str] = {k: os.path.join(a.cache_dir, k) for k in ("plain", "zstd")}
    paths.update({b: os.path.join(a.cache_dir, f"zstd-{b}") for b in small})
    write(paths["plain"], real, real_lens, a.vocab, repeat=rep)
    write(paths["zstd"], real, real_lens, a.vocab, repeat=rep, compression="zstd", block_tokens=65536, level=a.level)
    for b in small:
        write(paths[b], real, real_lens, a.vocab, repeat=rep, compression="zstd", block_tokens=b, level=a.level)
    plain_bytes = token_bytes(paths["plain"])
    report["speed_data"] = {"tokens": int(real.size * rep), "ratio": {
        str(b): plain_bytes / token_bytes(paths[b if b != 65536 else "zstd"]) for b in [65536] + small}}

    L, B = a.seq_len, a.batch_size
    window_tokens = 1024 * 16 * L
    kw: Dict[str, Any] = dict(seq_len=L, batch_size=B, seconds=a.seconds,
                              warmup_tokens=window_tokens + window_tokens // 2)
    cases: Dict[str, Callable[[], Dict[str, Any]]] = {}
    threads = [None if t == "default" else int(t) for t in a.threads.split(",")]
    for th in threads:
        sfx = "" if th is None else f" threads={th}"
        cases[f"plain block{sfx}"] = functools.partial(time_loader, paths["plain"], "block", threads=th, **kw)
        cases[f"zstd block{sfx}"] = functools.partial(time_loader, paths["zstd"], "block", threads=th, **kw)
    cases["decode 1 thread"] = lambda: time_decode(paths["zstd"], a.seconds)
    # data parallel: rank 0 of 8 takes 1/8 of every window's samples, scattered over all of its blocks
    sb = 4096 if 4096 in small else small[0]
    kr = dict(kw, world_size=a.ranks, warmup_tokens=kw["warmup_tokens"] // a.ranks)
    cases[f"zstd block, rank 0 of {a.ranks}"] = functools.partial(time_loader, paths["zstd"], "block", **kr)
    cases[f"zstd block, rank 0 of {a.ranks}, block_tokens={sb}"] = functools.partial(time_loader, paths[sb], "block", **kr)
    kf = dict(kw, warmup_tokens=20 * L * B)  # a full shuffle's cache holds no window: a short warm-up
    cases["plain full"] = lambda: time_loader(paths["plain"], "full", **kf)
    for b in small:
        cases[f"zstd full block_tokens={b}"] = functools.partial(time_loader, paths[b], "full", **kf)
    cases["zstd full block_tokens=65536"] = lambda: time_loader(paths["zstd"], "full", **dict(kf, seconds=a.seconds / 2))
    res = interleaved(cases, a.trials)
    report["speed"] = res

    dec = res["decode 1 thread"]["median_tokens_per_s"]
    checks = []
    for th in threads:
        sfx = "" if th is None else f" threads={th}"
        plain, z = res[f"plain block{sfx}"], res[f"zstd block{sfx}"]
        nthr = z["num_threads"]
        bar_plain = 0.5 * plain["median_tokens_per_s"]
        bar_dec = 0.8 * nthr * dec
        bar = min(bar_plain, bar_dec)
        got = z["median_tokens_per_s"]
        checks.append({"threads": nthr, "zstd_block_tokens_per_s": got, "plain_block_tokens_per_s":
                       plain["median_tokens_per_s"], "decode_1_thread_tokens_per_s": dec,
                       "of_plain": got / plain["median_tokens_per_s"], "of_workers_x_decode": got / (nthr * dec),
                       "bar": "50% of uncompressed" if bar_plain <= bar_dec else "80% of workers x decode",
                       "met": got >= bar, "decode_ratio": z.get("decode_ratio"), "cache_mib": z.get("cache_mib"),
                       "cpu_efficiency": (statistics.median(z["cpu_trials"]) / statistics.median(
                           res["decode 1 thread"]["cpu_trials"])) if z.get("cpu_trials") else None})
    report["block_shuffle_goal"] = checks
    report["total_seconds"] = round(time.monotonic() - t_start, 1)
    report["machine"]["loadavg_end"] = os.getloadavg()[0]

    # ---- summary
    print()
    print("zstd ratio, level %d (token section bytes, uncompressed / zstd)" % a.level)
    print("| block_tokens | real text (stdlib, BPE %d) | Zipf 1.1 i.i.d. |" % a.vocab)
    print("|---:|---:|---:|")
    zr = {r["block_tokens"]: r["ratio"] for r in report["ratio_zipf"]}
    for r in report["ratio_real"]:
        print(f"| {r['block_tokens']} | {r['ratio']:.2f} | {zr[r['block_tokens']]:.2f} |"
              if r["block_tokens"] in zr else f"| {r['block_tokens']} | {r['ratio']:.2f} | |")
    print()
    print("| configuration | tokens/s (median of %d) | best | per worker CPU-s | decode x (model) | cache |" % a.trials)
    print("|---|---:|---:|---:|---:|---:|")
    for name, r in res.items():
        dr = f"{r['decode_ratio']:.2f} ({r['decode_model']:.2f})" if r.get("decode_ratio") else ""
        cm = f"{r['cache_mib']:.2g} MiB" if r.get("cache_mib") else ""
        cp = human(statistics.median(r["cpu_trials"])) if r.get("cpu_trials") else ""
        print(f"| {name} | {human(r['median_tokens_per_s'])} | {human(r['best_tokens_per_s'])} | {cp} | {dr} | {cm} |")
    print()
    for c in checks:
        print(f"block shuffle, {c['threads']} worker(s): zstd {human(c['zstd_block_tokens_per_s'])} = "
              f"{c['of_plain'] * 100:.0f}% of uncompressed, {c['of_workers_x_decode'] * 100:.0f}% of workers x "
              f"single-thread decode ({human(c['decode_1_thread_tokens_per_s'])}); bar: {c['bar']}: "
              f"{'met' if c['met'] else 'NOT met'}")
        if c["cpu_efficiency"]:
            print(f"  per CPU-second (leaves out time the threads waited for a core): a worker delivers "
                  f"{c['cpu_efficiency'] * 100:.0f}% of what the decoding thread decodes")
    fulls = [(b, res[f"zstd full block_tokens={b}"]) for b in small]
    # chosen by tokens per worker CPU-second where known (steadier than wall time on a shared machine)
    best_b, best_r = max(fulls, key=lambda x: statistics.median(x[1]["cpu_trials"]) if x[1].get("cpu_trials")
                         else x[1]["median_tokens_per_s"])
    report["full_shuffle_recommended"] = {"block_tokens": best_b, "tokens_per_s": best_r["median_tokens_per_s"],
                                          "decode_ratio": best_r.get("decode_ratio"),
                                          "ratio_real_text": report["speed_data"]["ratio"][str(best_b)]}
    print(f"full shuffle: the cheapest small block here is block_tokens={best_b}: "
          f"{human(best_r['median_tokens_per_s'])} tokens/s, decoding x{best_r.get('decode_ratio') or 0:.2f}, "
          f"ratio {report['speed_data']['ratio'][str(best_b)]:.2f} on the real text (64 Ki: "
          f"{human(res['zstd full block_tokens=65536']['median_tokens_per_s'])} tokens/s, ratio "
          f"{report['speed_data']['ratio']['65536']:.2f})")
    print(f"total {report['total_seconds']}s; load average {report['machine']['loadavg_start']:.1f} at the start, "
          f"{report['machine']['loadavg_end']:.1f} at the end on {os.cpu_count()} CPUs")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(report, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
