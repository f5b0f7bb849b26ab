"""``tokenfeed bench``: tokens/s of tokenfeed beside the loaders people use, in one run.

With no arguments it generates a synthetic dataset (Zipf-distributed token ids,
log-normal document lengths) in a cache directory, then measures on the same data and
batch shape (default 8 x 2048, uint16 data, int64 output, shuffled):

* tokenfeed in its main configurations (shuffle modes, threads, backends, zstd data,
  output dtype, the device when there is one);
* a C gather ceiling: a tiny C program, compiled at run time, that copies the same
  shuffled samples out of the memory-mapped file into int64;
* baselines: the nanoGPT ``get_batch`` loop and a map-style ``torch.utils.data.DataLoader``
  with 0, 2 and 4 workers, with and without ``pin_memory``;
* peers, each when installed (``--install-peers`` tries ``pip install`` in a private
  virtual environment): LitData ``TokensLoader``, MosaicML Streaming, Megatron-core
  ``GPTDataset`` and Hugging Face ``datasets``. A peer that cannot run is reported with
  the reason.

Every measurement runs in a fresh subprocess so that peak RSS and CPU time belong to
that loader alone. Warm-up batches are excluded; the figures are tokens/s (``batch x
seq_len`` training tokens per batch), batches/s, p50/p99 time per batch, CPU seconds per
billion tokens (all threads and worker processes), and peak RSS. Also: cold page cache
(``posix_fadvise(DONTNEED)`` on every file first), zstd ratio and decode rate, time to
first batch and memory as the dataset grows to 10^12 tokens (sparse files), and restore
time versus stream position.

``main(argv)`` is the CLI entry (``tokenfeed bench``, ``benchmarks/bench_tokens.py``).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

import numpy as np

__all__ = ["main", "parse_args", "open_scaling", "PEERS"]

SCHEMA_VERSION = 1
PEERS = ("litdata", "mosaicml-streaming", "megatron-core", "datasets")
# import name and pip name of each peer
_PEER_IMPORT = {"litdata": "litdata", "mosaicml-streaming": "streaming", "megatron-core": "megatron.core",
                "datasets": "datasets"}

# ----------------------------------------------------------------------------- arguments


def _default_cache() -> str:
    base = os.environ.get("TOKENFEED_BENCH_CACHE")
    if base:
        return base
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(xdg, "tokenfeed", "bench")


def _count(s: str) -> int:
    """Parse 5e7, 50M, 1G, 2**20 style counts."""
    t = s.strip().lower().replace("_", "")
    mult = {"k": 10**3, "m": 10**6, "g": 10**9, "b": 10**9, "t": 10**12}
    if t and t[-1] in mult:
        return int(float(t[:-1]) * mult[t[-1]])
    if "**" in t:
        a, b = t.split("**")
        return int(a) ** int(b)
    return int(float(t))


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="tokenfeed bench",
        description="Tokens/s of tokenfeed beside the C gather ceiling, the nanoGPT loop, torch DataLoader "
                    "and peer loaders, on the same data and batch shape.")
    d = p.add_argument_group("data")
    d.add_argument("--data", metavar="PATH", nargs="+",
                   help="use an existing dataset (any format tokenfeed.open reads) instead of generating one")
    d.add_argument("--dtype", help="token dtype of a headerless --data file (uint8/uint16/uint32)")
    d.add_argument("--tokens", type=_count, default=None,
                   help="tokens to generate (default 5e8; 5e7 with --quick)")
    d.add_argument("--vocab-size", type=int, default=50257, help="vocabulary of the generated data (default 50257)")
    d.add_argument("--doc-length", default="lognormal:6.0:1.0",
                   help="document lengths: lognormal:MU:SIGMA (default 6.0:1.0, median ~400 tokens), "
                        "fixed:N, or uniform:LO:HI")
    d.add_argument("--zipf", type=float, default=1.1,
                   help="Zipf exponent of token frequencies in generated data (default 1.1; 0 = uniform)")
    d.add_argument("--cache-dir", default=_default_cache(),
                   help="where generated data, converted peer data and the compiled ceiling live "
                        "(default $TOKENFEED_BENCH_CACHE or ~/.cache/tokenfeed/bench)")
    s = p.add_argument_group("shape")
    s.add_argument("--seq-len", type=int, default=2048)
    s.add_argument("--batch-size", type=int, default=8)
    s.add_argument("--seed", type=int, default=0)
    r = p.add_argument_group("run")
    r.add_argument("--quick", action="store_true", help="small data and short runs: about two minutes on 2 cores")
    r.add_argument("--seconds", type=float, default=None,
                   help="timed seconds per configuration (default 3; 0.6 with --quick)")
    r.add_argument("--warmup", type=int, default=None, help="warm-up batches excluded from timing (default 20)")
    r.add_argument("--only", default=None,
                   help="comma-separated groups to run: tokenfeed,ceiling,baselines,peers,cold,zstd,scaling,restore")
    r.add_argument("--skip", default=None, help="comma-separated groups to skip (same names as --only)")
    r.add_argument("--install-peers", action="store_true",
                   help="pip install missing peers into a private venv in the cache dir (needs network)")
    r.add_argument("--no-peers", action="store_true", help="do not run peer loaders")
    r.add_argument("--timeout", type=float, default=300.0, help="seconds before a single measurement is abandoned")
    o = p.add_argument_group("output")
    o.add_argument("--json", metavar="PATH", help="write every figure as JSON")
    o.add_argument("--plot", metavar="PATH", help="write a PNG chart (needs matplotlib)")
    o.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    # internal: run one measurement and print its JSON (used by the parent process)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.tokens is None:
        a.tokens = 50_000_000 if a.quick else 500_000_000
    if a.seconds is None:
        a.seconds = 0.6 if a.quick else 3.0
    if a.warmup is None:
        a.warmup = 20
    for name in ("seq_len", "batch_size", "tokens", "vocab_size"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be positive")
    if a.tokens < (a.seq_len + 1) * a.batch_size * 4:
        p.error(f"--tokens {a.tokens} is too small for batches of {a.batch_size} x {a.seq_len}")
    _parse_doc_length(a.doc_length, p.error)
    groups = {"tokenfeed", "ceiling", "baselines", "peers", "cold", "zstd", "scaling", "restore"}
    for opt in ("only", "skip"):
        v = getattr(a, opt)
        sel = set() if v is None else {x.strip() for x in v.split(",") if x.strip()}
        bad = sel - groups
        if bad:
            p.error(f"--{opt}: unknown group(s) {', '.join(sorted(bad))}; choose from {', '.join(sorted(groups))}")
        setattr(a, opt, sel or None)
    a.groups = (a.only or groups) - (a.skip or set())
    if a.no_peers:
        a.groups.discard("peers")
    return a


def _parse_doc_length(spec: str, error: Callable[[str], Any] = None) -> tuple:  # type: ignore[assignment]
    parts = spec.split(":")
    try:
        if parts[0] == "lognormal" and len(parts) == 3:
            return ("lognormal", float(parts[1]), float(parts[2]))
        if parts[0] == "fixed" and len(parts) == 2 and int(parts[1]) > 0:
            return ("fixed", int(parts[1]))
        if parts[0] == "uniform" and len(parts) == 3 and 0 < int(parts[1]) <= int(parts[2]):
            return ("uniform", int(parts[1]), int(parts[2]))
    except ValueError:
        pass
    msg = f"--doc-length {spec!r}: use lognormal:MU:SIGMA, fixed:N or uniform:LO:HI"
    if error is not None:
        error(msg)
    raise ValueError(msg)


# ----------------------------------------------------------------------------- progress


class _Log:
    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.t0 = time.monotonic()

    def __call__(self, msg: str) -> None:
        if not self.quiet:
            sys.stderr.write(f"[{time.monotonic() - self.t0:6.1f}s] {msg}\n")
            sys.stderr.flush()


def _human(n: Optional[float], unit: str = "") -> str:
    if n is None:
        return "-"
    for suffix in ("", "K", "M", "G", "T", "P"):
        if abs(n) < 1000:
            return f"{n:.3g}{suffix}{unit}" if suffix or n != int(n) else f"{int(n)}{unit}"
        n /= 1000
    return f"{n:.3g}E{unit}"


# ----------------------------------------------------------------------------- machine


def machine_info() -> Dict[str, Any]:
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    info: Dict[str, Any] = {"cpu_model": cpu, "cores": os.cpu_count(), "memory_gib": mem,
                            "kernel": platform.release(), "python": platform.python_version(),
                            "numpy": np.__version__}
    try:
        import tokenfeed

        info["tokenfeed"] = tokenfeed.__version__
        info["build_info"] = tokenfeed.build_info()
    except Exception as e:  # pragma: no cover
        info["tokenfeed"] = f"unavailable: {e}"
    try:
        import importlib.metadata as md

        info["torch"] = md.version("torch")
    except Exception:
        info["torch"] = None
    return info


# ----------------------------------------------------------------------------- dataset generation


def _zipf_cdf(vocab: int, s: float, rng: np.random.Generator) -> tuple:
    """CDF over ranks and a fixed rank -> token id map (frequent ids spread over the vocabulary)."""
    if s <= 0:
        return None, None
    ranks = np.arange(1, vocab + 1, dtype=np.float64)
    w = ranks ** (-s)
    cdf = np.cumsum(w)
    cdf /= cdf[-1]
    ids = rng.permutation(vocab).astype(np.uint32)
    return cdf, ids


def _doc_lengths(rng: np.random.Generator, n: int, spec: tuple) -> np.ndarray:
    if spec[0] == "lognormal":
        x = rng.lognormal(spec[1], spec[2], size=n)
        return np.clip(np.rint(x), 1, 1 << 20).astype(np.int64)
    if spec[0] == "fixed":
        return np.full(n, spec[1], dtype=np.int64)
    return rng.integers(spec[1], spec[2] + 1, size=n, dtype=np.int64)


def generate_dataset(out_dir: str, *, tokens: int, vocab_size: int, doc_length: str, zipf: float, seed: int,
                     log: Callable[[str], None], zstd: bool = True) -> Dict[str, Any]:
    """Write the same synthetic token stream three ways: native, native+zstd, raw .bin (nanoGPT style).

    Reused when ``meta.json`` (written last) matches the parameters.
    """
    import tokenfeed

    spec = {"tokens": int(tokens), "vocab_size": int(vocab_size), "doc_length": doc_length, "zipf": zipf,
            "seed": seed, "generator": 2}
    meta_path = os.path.join(out_dir, "meta.json")
    if os.path.exists(meta_path):
        try:
            with open(meta_path) as f:
                meta = json.load(f)
            if meta.get("spec") == spec and (not zstd or meta.get("zstd")):
                log(f"reusing generated dataset {out_dir}")
                meta["reused"] = True
                return meta
        except (OSError, ValueError):
            pass
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    dtype = np.uint8 if vocab_size <= 256 else np.uint16 if vocab_size <= 65536 else np.uint32
    rng = np.random.default_rng(seed)
    cdf, ids = _zipf_cdf(vocab_size, zipf, rng)
    lspec = _parse_doc_length(doc_length)
    eot = vocab_size - 1
    native, zdir, raw = (os.path.join(out_dir, n) for n in ("native", "zstd", "train.bin"))
    t0 = time.monotonic()
    written = ndocs = 0
    lengths_all: List[np.ndarray] = []
    zw = tokenfeed.DatasetWriter(zdir, vocab_size=vocab_size, compression="zstd", level=3) if zstd else None
    with tokenfeed.DatasetWriter(native, vocab_size=vocab_size) as w, open(raw, "wb") as rf:
        chunk = 1 << 22
        last = 0.0
        while written < tokens:
            n = min(chunk, tokens - written)
            if cdf is not None:
                toks = ids[np.searchsorted(cdf, rng.random(n), side="right").clip(0, vocab_size - 1)]
            else:
                toks = rng.integers(0, vocab_size, size=n, dtype=np.uint32)
            toks = toks.astype(dtype)
            lens = _doc_lengths(rng, max(16, 4 * n // 64), lspec)
            ends = np.cumsum(lens)
            k = int(np.searchsorted(ends, n))
            lens = lens[: k + 1]
            lens[-1] = n - (int(ends[k - 1]) if k else 0)
            lens = lens[lens > 0]
            ends = np.cumsum(lens)
            toks[ends - 1] = eot  # every document ends with an end-of-text token
            start = 0
            for e in ends.tolist():
                doc = toks[start:e]
                w.add_document(doc)
                if zw is not None:
                    zw.add_document(doc)
                start = e
            toks.tofile(rf)
            lengths_all.append(lens)
            written += n
            ndocs += len(lens)
            now = time.monotonic()
            if now - last > 2:
                log(f"generating data: {written / tokens * 100:5.1f}% ({_human(written)} tokens, "
                    f"{_human(written / max(now - t0, 1e-9))} tokens/s)")
                last = now
    if zw is not None:
        zw.close()
    lens = np.concatenate(lengths_all)
    meta = {"spec": spec, "dtype": np.dtype(dtype).name, "documents": int(ndocs), "native": native,
            "zstd": zdir if zstd else None, "raw": raw, "seconds": round(time.monotonic() - t0, 2),
            "doc_length_stats": {"mean": float(lens.mean()), "median": float(np.median(lens)),
                                 "p99": float(np.percentile(lens, 99)), "max": int(lens.max())}}
    with open(meta_path + ".tmp", "w") as f:
        json.dump(meta, f, indent=1)
    os.replace(meta_path + ".tmp", meta_path)
    meta["reused"] = False
    log(f"generated {_human(tokens)} tokens, {ndocs:,} documents in {meta['seconds']}s")
    return meta


def _raw_copy(ds: Any, out: str, log: Callable[[str], None]) -> str:
    """A headerless copy of an existing dataset's tokens for the baselines (which read one flat file)."""
    stamp = out + ".done"
    if os.path.exists(stamp) and open(stamp).read() == ds.fingerprint:
        return out
    log(f"writing a flat copy of --data for the baselines: {out}")
    with open(out + ".tmp", "wb") as f:
        step = 1 << 24
        for s in range(0, ds.num_tokens, step):
            np.ascontiguousarray(ds.tokens(s, min(ds.num_tokens, s + step))).tofile(f)
    os.replace(out + ".tmp", out)
    with open(stamp, "w") as f:
        f.write(ds.fingerprint)
    return out


def _dataset_files(path: Any) -> List[str]:
    paths = path if isinstance(path, (list, tuple)) else [path]
    out: List[str] = []
    for p in paths:
        if os.path.isdir(p):
            out += [os.path.join(p, f) for f in sorted(os.listdir(p))]
        else:
            out.append(p)
            for ext in (".idx", ".index", ".ds.index"):
                if os.path.exists(p + ext):
                    out.append(p + ext)
            if p.endswith(".bin") and os.path.exists(p[:-4] + ".idx"):
                out.append(p[:-4] + ".idx")
    return out


def drop_cache(files: Iterable[str]) -> int:
    """posix_fadvise(DONTNEED) on every file (after fdatasync so clean pages can go). Returns files dropped."""
    n = 0
    for p in files:
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError:
            continue
        try:
            try:
                os.fdatasync(fd)
            except OSError:
                pass
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            n += 1
        finally:
            os.close(fd)
    return n


# ----------------------------------------------------------------------------- measuring (worker side)


def _proc_tree_cpu_rss() -> tuple:
    """(cpu seconds, summed VmHWM kB) of this process's descendants (DataLoader workers and the like)."""
    me = os.getpid()
    parent: Dict[int, int] = {}
    stat: Dict[int, tuple] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                s = f.read()
            fields = s[s.rindex(")") + 2:].split()
            parent[int(name)] = int(fields[1])
            stat[int(name)] = (int(fields[11]) + int(fields[12])) / tick
        except (OSError, ValueError, IndexError):
            continue
    kids = {me}
    changed = True
    while changed:
        changed = False
        for pid, pp in parent.items():
            if pp in kids and pid not in kids:
                kids.add(pid)
                changed = True
    kids.discard(me)
    cpu = 0.0
    hwm = 0
    per: Dict[int, float] = {}
    for pid in kids:
        cpu += stat.get(pid, 0.0)
        per[pid] = stat.get(pid, 0.0)
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        hwm += int(line.split()[1])
        except OSError:
            pass
    return per, hwm


def _self_status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _measure(next_batch: Callable[[], Any], *, tokens_per_batch: int, warmup: int, seconds: float,
             max_batches: int, min_batches: int = 5) -> Dict[str, Any]:
    t_first = time.perf_counter()
    next_batch()
    first = time.perf_counter() - t_first
    for _ in range(max(0, warmup - 1)):
        next_batch()
    kids0, _ = _proc_tree_cpu_rss()
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    rc0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    times: List[float] = []
    perf = time.perf_counter
    w0 = perf()
    deadline = w0 + seconds
    while True:
        t = perf()
        next_batch()
        e = perf()
        times.append(e - t)
        if len(times) >= max_batches or (e >= deadline and len(times) >= min_batches):
            break
    wall = perf() - w0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    rc1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    kids1, kids_hwm = _proc_tree_cpu_rss()
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    cpu += (rc1.ru_utime - rc0.ru_utime) + (rc1.ru_stime - rc0.ru_stime)
    cpu += sum(v - kids0.get(pid, 0.0) for pid, v in kids1.items())
    t = np.array(times)
    n = len(times)
    toks = n * tokens_per_batch
    return {"batches": n, "seconds": wall, "tokens_per_s": toks / wall, "batches_per_s": n / wall,
            "p50_ms": float(np.percentile(t, 50) * 1e3), "p99_ms": float(np.percentile(t, 99) * 1e3),
            "cpu_s": cpu, "cpu_s_per_btok": cpu / toks * 1e9, "first_batch_s": first,
            "peak_rss_mb": (_self_status("VmHWM") + kids_hwm) / 1024.0, "workers_peak_rss_mb": kids_hwm / 1024.0}


def _sample_offsets(case: Dict[str, Any]) -> np.ndarray:
    return np.load(case["offsets"], mmap_mode="r")


def _max_batches(case: Dict[str, Any]) -> int:
    return int(case.get("max_batches", 10**9))


def _run_tokenfeed(case: Dict[str, Any]) -> Dict[str, Any]:
    import tokenfeed

    if case.get("cold"):
        case["dropped_files"] = drop_cache(_dataset_files(case["path"]))
    rss0 = _self_status("VmRSS")
    _reset_peak_rss()
    ds = tokenfeed.open(case["path"], dtype=case.get("dtype_in"))
    kw = dict(seq_len=case["seq_len"], batch_size=case["batch_size"], seed=case["seed"],
              shuffle=case.get("shuffle", True), num_threads=case.get("threads"), backend=case.get("backend"),
              dtype=case.get("out_dtype", "int64"), output=case.get("output", "numpy"),
              direct_io=bool(case.get("direct_io", False)))
    loader = tokenfeed.Loader(ds, **kw)
    it = iter(loader)

    def nb() -> None:
        next(it)

    r = _measure(nb, tokens_per_batch=case["batch_size"] * case["seq_len"], warmup=case["warmup"],
                 seconds=case["seconds"], max_batches=_max_batches(case))
    st = loader.stats()
    r["stats"] = {k: st.get(k) for k in ("backend", "num_threads", "backend_note", "wait_seconds", "ring_slots")}
    r["rss_delta_mb"] = r["peak_rss_mb"] - rss0 / 1024.0
    loader.close()
    return r


def _run_ceiling(case: Dict[str, Any]) -> Dict[str, Any]:
    out = subprocess.run([case["binary"], case["path"], "0", str(case["elem_size"]), str(case["seq_len"]),
                          str(case["batch_size"]), case["offsets_file"], str(case["warmup"]), str(case["threads"]),
                          str(case["seconds"]), str(_max_batches(case))],
                         capture_output=True, text=True, timeout=case.get("timeout", 120))
    if out.returncode != 0:
        raise RuntimeError(f"ceiling program failed ({out.returncode}): {out.stderr.strip()[-500:]}")
    j = json.loads(out.stdout.strip().splitlines()[-1])
    toks = j["batches"] * case["batch_size"] * case["seq_len"]
    return {"batches": j["batches"], "seconds": j["wall_s"], "tokens_per_s": toks / j["wall_s"],
            "batches_per_s": j["batches"] / j["wall_s"], "p50_ms": j["p50_ms"], "p99_ms": j["p99_ms"],
            "cpu_s": j["cpu_s"], "cpu_s_per_btok": j["cpu_s"] / toks * 1e9, "peak_rss_mb": j["peak_rss_kb"] / 1024}


def _run_nanogpt(case: Dict[str, Any]) -> Dict[str, Any]:
    import torch

    if case.get("cold"):
        case["dropped_files"] = drop_cache([case["raw"]])
    offs = _sample_offsets(case)
    path, L, B = case["raw"], case["seq_len"], case["batch_size"]
    dt = np.dtype(case["raw_dtype"])
    state = {"b": 0}

    # karpathy/nanoGPT train.py get_batch, with the random offsets replaced by the shared
    # shuffled sample list so every loader reads the same samples
    def get_batch() -> Any:
        data = np.memmap(path, dtype=dt, mode="r")  # re-created every batch, as nanoGPT does
        b = state["b"]
        state["b"] += 1
        ix = [int(offs[(b * B + j) % len(offs)]) for j in range(B)]
        x = torch.stack([torch.from_numpy((data[i:i + L]).astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy((data[i + 1:i + 1 + L]).astype(np.int64)) for i in ix])
        return x, y

    rss0 = _self_status("VmRSS")
    _reset_peak_rss()
    r = _measure(get_batch, tokens_per_batch=B * L, warmup=case["warmup"], seconds=case["seconds"],
                 max_batches=_max_batches(case))
    r["rss_delta_mb"] = r["peak_rss_mb"] - rss0 / 1024.0
    return r


class _SampleList:
    """Sampler over the shared shuffled sample list (cycled)."""

    def __init__(self, samples: np.ndarray, n: int) -> None:
        self.samples, self.n = samples, n

    def __iter__(self) -> Any:
        m = len(self.samples)
        for i in range(self.n):
            yield int(self.samples[i % m])

    def __len__(self) -> int:
        return self.n


class _MemmapSamples:
    """Map-style dataset: sample k = tokens [k*L, k*L + L + 1) of the flat file as int64."""

    def __init__(self, path: str, dtype: str, seq_len: int) -> None:
        self.path, self.dtype, self.L = path, dtype, seq_len
        self.data: Any = None

    def __len__(self) -> int:
        return (os.path.getsize(self.path) // np.dtype(self.dtype).itemsize - 1) // self.L

    def __getitem__(self, k: int) -> Any:
        import torch

        if self.data is None:  # opened lazily in each worker
            self.data = np.memmap(self.path, dtype=self.dtype, mode="r")
        s = k * self.L
        return torch.from_numpy(self.data[s:s + self.L + 1].astype(np.int64))


def _drive_torch_loader(dl: Any, case: Dict[str, Any], tokens_per_batch: int) -> Dict[str, Any]:
    it = iter(dl)

    def nb() -> None:
        next(it)

    r = _measure(nb, tokens_per_batch=tokens_per_batch, warmup=case["warmup"], seconds=case["seconds"],
                 max_batches=_max_batches(case))
    del it
    return r


def _run_dataloader(case: Dict[str, Any]) -> Dict[str, Any]:
    import torch
    from torch.utils.data import DataLoader

    rss0 = _self_status("VmRSS")
    _reset_peak_rss()
    samples = np.load(case["samples"])
    ds = _MemmapSamples(case["raw"], case["raw_dtype"], case["seq_len"])
    nw = case["workers"]
    dl = DataLoader(ds, batch_size=case["batch_size"], sampler=_SampleList(samples, 10**9),
                    num_workers=nw, pin_memory=case["pin_memory"], persistent_workers=nw > 0,
                    prefetch_factor=2 if nw else None)
    r = _drive_torch_loader(dl, case, case["batch_size"] * case["seq_len"])
    r["rss_delta_mb"] = r["peak_rss_mb"] - rss0 / 1024.0
    r["pin_memory_effective"] = bool(case["pin_memory"] and torch.cuda.is_available())
    return r


# ----------------------------------------------------------------------------- peers (worker side)


def _run_hf_datasets(case: Dict[str, Any]) -> Dict[str, Any]:
    import datasets
    from torch.utils.data import DataLoader

    path = os.path.join(case["peer_dir"], "hf-datasets")
    L = case["seq_len"]
    if not os.path.exists(os.path.join(path, "done")):
        data = np.memmap(case["raw"], dtype=case["raw_dtype"], mode="r")
        n = (len(data) - 1) // L

        def gen() -> Any:
            for k in range(n):
                yield {"input_ids": np.asarray(data[k * L:k * L + L + 1])}

        feats = datasets.Features({"input_ids": datasets.Sequence(datasets.Value(case["raw_dtype"]))})
        d = datasets.Dataset.from_generator(gen, features=feats, cache_dir=os.path.join(case["peer_dir"], "hf-cache"))
        d.save_to_disk(path)
        open(os.path.join(path, "done"), "w").close()
    rss0 = _self_status("VmRSS")
    _reset_peak_rss()
    d = datasets.load_from_disk(path).with_format("torch")
    samples = np.load(case["samples"])
    dl = DataLoader(d, batch_size=case["batch_size"], sampler=_SampleList(samples, 10**9),
                    num_workers=case["workers"], persistent_workers=case["workers"] > 0)
    r = _drive_torch_loader(dl, case, case["batch_size"] * L)
    r["rss_delta_mb"] = r["peak_rss_mb"] - rss0 / 1024.0
    r["version"] = datasets.__version__
    return r


def _run_litdata(case: Dict[str, Any]) -> Dict[str, Any]:
    import litdata
    import torch
    from litdata import StreamingDataLoader, StreamingDataset, TokensLoader, optimize

    L1 = case["seq_len"] + 1
    path = os.path.join(case["peer_dir"], "litdata")
    if not os.path.exists(os.path.join(path, "done")):
        shutil.rmtree(path, ignore_errors=True)
        ntok = os.path.getsize(case["raw"]) // np.dtype(case["raw_dtype"]).itemsize
        step = 1 << 20
        inputs = [(case["raw"], case["raw_dtype"], s, min(ntok, s + step)) for s in range(0, ntok, step)]
        optimize(fn=_litdata_tokens, inputs=inputs, output_dir=path, chunk_size=L1 * 512,
                 item_loader=TokensLoader(), num_workers=1, mode="overwrite")
        open(os.path.join(path, "done"), "w").close()
    rss0 = _self_status("VmRSS")
    _reset_peak_rss()
    ds = StreamingDataset(path, item_loader=TokensLoader(block_size=L1), shuffle=True, seed=case["seed"],
                          drop_last=True)
    dl = StreamingDataLoader(ds, batch_size=case["batch_size"], num_workers=case["workers"], pin_memory=True,
                             drop_last=True)

    state = {"it": iter(dl)}

    def nb() -> None:
        try:
            b = next(state["it"])
        except StopIteration:
            state["it"] = iter(dl)
            b = next(state["it"])
        b.to(torch.int64)  # litgpt widens on the GPU; count the same int64 output as everyone else

    r = _measure(nb, tokens_per_batch=case["batch_size"] * case["seq_len"], warmup=case["warmup"],
                 seconds=case["seconds"], max_batches=_max_batches(case))
    r["rss_delta_mb"] = r["peak_rss_mb"] - rss0 / 1024.0
    r["version"] = litdata.__version__
    return r


def _litdata_tokens(item: tuple) -> Any:
    import torch

    path, dt, s, e = item
    data = np.memmap(path, dtype=dt, mode="r")
    yield torch.from_numpy(np.array(data[s:e]).astype(np.int32 if dt != "uint8" else np.int16))


def _run_streaming(case: Dict[str, Any]) -> Dict[str, Any]:
    import streaming
    import torch
    from streaming import MDSWriter, StreamingDataset
    from torch.utils.data import DataLoader

    L = case["seq_len"]
    path = os.path.join(case["peer_dir"], "mds")
    if not os.path.exists(os.path.join(path, "done")):
        shutil.rmtree(path, ignore_errors=True)
        data = np.memmap(case["raw"], dtype=case["raw_dtype"], mode="r")
        n = (len(data) - 1) // L
        with MDSWriter(out=path, columns={"tokens": "bytes"}, compression=None, size_limit="64mb") as w:
            for k in range(n):
                w.write({"tokens": np.asarray(data[k * L:k * L + L + 1]).tobytes()})
        open(os.path.join(path, "done"), "w").close()
    rss0 = _self_status("VmRSS")
    _reset_peak_rss()
    dt = np.dtype(case["raw_dtype"])

    class TokenBlocks(StreamingDataset):
        def __getitem__(self, idx: int) -> Any:
            obj = super().__getitem__(idx)
            return torch.from_numpy(np.frombuffer(obj["tokens"], dtype=dt).astype(np.int64))

    remote = None
    ds = TokenBlocks(local=path, remote=remote, shuffle=True, shuffle_seed=case["seed"],
                     batch_size=case["batch_size"])
    dl = DataLoader(ds, batch_size=case["batch_size"], num_workers=case["workers"], pin_memory=True,
                    persistent_workers=case["workers"] > 0)
    state = {"it": iter(dl)}

    def nb() -> None:
        try:
            next(state["it"])
        except StopIteration:
            state["it"] = iter(dl)
            next(state["it"])

    r = _measure(nb, tokens_per_batch=case["batch_size"] * L, warmup=case["warmup"], seconds=case["seconds"],
                 max_batches=_max_batches(case))
    r["rss_delta_mb"] = r["peak_rss_mb"] - rss0 / 1024.0
    r["version"] = streaming.__version__
    return r


def _run_megatron(case: Dict[str, Any]) -> Dict[str, Any]:
    import torch
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    from torch.utils.data import DataLoader

    L = case["seq_len"]
    prefix = os.path.join(case["peer_dir"], "megatron", "text_document")
    if not os.path.exists(prefix + ".done"):
        os.makedirs(os.path.dirname(prefix), exist_ok=True)
        data = np.memmap(case["raw"], dtype=case["raw_dtype"], mode="r")
        ends = case.get("doc_ends")
        b = IndexedDatasetBuilder(prefix + ".bin", dtype=np.dtype(case["raw_dtype"]).type)
        step = 1 << 16
        bounds = np.load(ends) if ends else np.arange(step, len(data) + step, step).clip(0, len(data))
        s = 0
        for e in bounds.tolist():
            b.add_item(torch.from_numpy(np.asarray(data[s:e]).astype(np.int64)))
            b.end_document()
            s = e
        b.finalize(prefix + ".idx")
        open(prefix + ".done", "w").close()

    class _Tok:  # GPTDataset needs only the eod/pad ids and a cache key from the tokenizer
        eod = eos = case["vocab_size"] - 1
        pad = -1
        vocab_size = case["vocab_size"]
        unique_identifiers = {"class": "tokenfeed-bench-tokenizer", "vocab_size": case["vocab_size"]}

    rss0 = _self_status("VmRSS")
    _reset_peak_rss()
    n = 10**6
    cfg_kw = dict(random_seed=case["seed"], sequence_length=L, blend=([prefix], None), split="1,0,0",
                  reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False,
                  path_to_cache=os.path.join(case["peer_dir"], "megatron", "cache"), tokenizer=_Tok(),
                  mmap_bin_files=True, create_attention_mask=False)
    for optional in (None, "create_attention_mask", "mmap_bin_files"):  # older releases lack these fields
        if optional:
            cfg_kw.pop(optional, None)
        try:
            cfg = GPTDatasetConfig(**cfg_kw)
            break
        except TypeError:
            if optional == "mmap_bin_files":
                raise
    train, _, _ = BlendedMegatronDatasetBuilder(GPTDataset, [n, None, None], lambda: True, cfg).build()
    dl = DataLoader(train, batch_size=case["batch_size"], num_workers=case["workers"], pin_memory=True,
                    persistent_workers=case["workers"] > 0, shuffle=False)
    r = _drive_torch_loader(dl, case, case["batch_size"] * L)
    r["rss_delta_mb"] = r["peak_rss_mb"] - rss0 / 1024.0
    return r


_RUNNERS: Dict[str, Callable[[Dict[str, Any]], Dict[str, Any]]] = {
    "tokenfeed": _run_tokenfeed, "ceiling": _run_ceiling, "nanogpt": _run_nanogpt, "dataloader": _run_dataloader,
    "datasets": _run_hf_datasets, "litdata": _run_litdata, "mosaicml-streaming": _run_streaming,
    "megatron-core": _run_megatron,
}


def _worker() -> int:
    case = json.loads(sys.stdin.read())
    try:
        r = _RUNNERS[case["kind"]](case)
        r["status"] = "ok"
    except ImportError as e:
        r = {"status": "not installed", "reason": f"{type(e).__name__}: {e}"}
    except Exception as e:
        import traceback

        tb = traceback.format_exc().strip().splitlines()
        r = {"status": "failed", "reason": f"{type(e).__name__}: {e}", "traceback": tb[-6:]}
    sys.stdout.write("\n@@RESULT@@" + json.dumps(r) + "\n")
    sys.stdout.flush()
    os._exit(0)  # skip slow interpreter teardown (worker processes, atexit hooks)


# ----------------------------------------------------------------------------- orchestration


def _spawn(case: Dict[str, Any], python: str, timeout: float) -> Dict[str, Any]:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    try:
        p = subprocess.run([python, "-c", "import sys; from tokenfeed.bench import main; sys.exit(main(['--worker']))"],
                           input=json.dumps(case), capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"status": "failed", "reason": f"timed out after {timeout:.0f}s"}
    out = p.stdout
    k = out.rfind("@@RESULT@@")
    if k < 0:
        err = (p.stderr or "").strip().splitlines()
        return {"status": "failed", "reason": f"worker exited {p.returncode}: {' | '.join(err[-3:])[:600]}"}
    return json.loads(out[k + len("@@RESULT@@"):].strip().splitlines()[0])


def _compile_ceiling(cache: str) -> tuple:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        return None, "no C compiler found (set CC or install gcc) - ceiling skipped"
    h = hashlib.sha1(_CEILING_C.encode()).hexdigest()[:12]
    binary = os.path.join(cache, f"ceiling-{h}")
    if os.path.exists(binary):
        return binary, None
    src = binary + ".c"
    with open(src, "w") as f:
        f.write(_CEILING_C)
    errs = []
    for flags in (["-O3", "-march=native"], ["-O3"], ["-O2"]):
        p = subprocess.run([cc, *flags, "-pthread", "-o", binary + ".tmp", src], capture_output=True, text=True)
        if p.returncode == 0:
            os.replace(binary + ".tmp", binary)
            return binary, None
        errs.append(p.stderr.strip()[-300:])
    return None, f"the ceiling program did not compile with {cc}: {errs[-1]}"


def _peer_python(args: argparse.Namespace, log: Callable[[str], None]) -> tuple:
    """The interpreter peers run in, and {peer: install note}. A private venv when --install-peers."""
    venv = os.path.join(args.cache_dir, "peers-venv")
    py = os.path.join(venv, "bin", "python")
    notes: Dict[str, str] = {}
    if args.install_peers:
        if not os.path.exists(py):
            log(f"creating {venv} (system site-packages visible, so tokenfeed and torch are reused)")
            subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", venv], check=False,
                           capture_output=True)
        if not os.path.exists(py):
            return sys.executable, {p: "could not create a virtual environment for --install-peers" for p in PEERS}
        # pin everything already installed here (torch, numpy, huggingface-hub, ...): a peer may add
        # packages but never swap one that this environment or another peer relies on
        import importlib.metadata as md

        cons = os.path.join(venv, "constraints.txt")
        with open(cons, "w") as f:
            seen = set()
            for dist in md.distributions():
                name = (dist.metadata.get("Name") or "").lower()
                if not name or name in seen or name in PEERS or name == "tokenfeed":
                    continue
                seen.add(name)
                f.write(f"{name}=={dist.version}\n")
        for peer in PEERS:
            if _has_module(py, _PEER_IMPORT[peer]):
                continue
            log(f"pip install {peer} ...")
            p = subprocess.run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", "-c", cons, peer],
                               capture_output=True, text=True, timeout=900)
            if p.returncode != 0:
                lines = [x for x in p.stderr.strip().splitlines() if "WARNING" not in x]
                notes[peer] = f"pip install {peer} failed: {' | '.join(lines[-3:])[:500]}"
        return py, notes
    if os.path.exists(py):
        return py, notes  # installed by an earlier --install-peers run
    return sys.executable, notes


def _has_module(python: str, mod: str) -> bool:
    p = subprocess.run([python, "-c", f"import importlib.util,sys; sys.exit(0 if importlib.util.find_spec('{mod.split('.')[0]}') else 1)"],
                       capture_output=True)
    if p.returncode != 0:
        return False
    if "." in mod:
        p = subprocess.run([python, "-c", f"import {mod}"], capture_output=True)
        return p.returncode == 0
    return True


def _torch_ok() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def open_scaling(cache: str, sizes: Sequence[int], *, shards_for: Callable[[int], int] = None,  # type: ignore[assignment]
                 seq_len: int = 2048, batch_size: int = 8, log: Callable[[str], None] = lambda m: None,
                 python: str = sys.executable, first_batch: bool = True) -> List[Dict[str, Any]]:
    """open() time, memory and time to first batch over sparse llm.c shards of growing total size.

    Each size is measured in a fresh process (RSS delta = peak RSS after minus RSS before).
    The shards are sparse files: their header is real, their tokens are holes that read as 0.
    """
    if shards_for is None:
        shards_for = lambda n: max(1, min(10_000, n // 10**8))  # noqa: E731
    out = []
    for n in sizes:
        k = shards_for(n)
        d = os.path.join(cache, "sparse", f"llmc-{n}-{k}")
        make_sparse_llmc(d, n, k)
        code = ("import json,os,sys,time,glob\nfrom tokenfeed.bench import _scaling_child\n"
                f"print('@@RESULT@@'+json.dumps(_scaling_child({d!r}, {seq_len}, {batch_size}, {bool(first_batch)})))")
        p = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=600)
        k_ = p.stdout.rfind("@@RESULT@@")
        if k_ < 0:
            r = {"status": "failed", "reason": (p.stderr.strip().splitlines() or ["?"])[-1]}
        else:
            r = json.loads(p.stdout[k_ + 10:])
            r["status"] = "ok"
        r.update({"tokens": n, "shards": k, "format": "llm.c (sparse)"})
        out.append(r)
        if r["status"] == "ok":
            log(f"scaling {_human(n)} tokens / {k} shards: open {r['open_s'] * 1e3:.0f} ms, "
                f"+{r['open_rss_delta_mb']:.1f} MB; first batch {r.get('first_batch_s', 0) * 1e3:.0f} ms")
        else:
            log(f"scaling {_human(n)} tokens: failed: {r['reason']}")
    return out


def make_sparse_llmc(d: str, total: int, shards: int) -> List[str]:
    """llm.c v1 shards (256 x int32 header, magic 20240520, uint16 tokens) as sparse files."""
    stamp = os.path.join(d, "done")
    names = [os.path.join(d, f"shard_{i:05d}.bin") for i in range(shards)]
    if os.path.exists(stamp):
        return names
    os.makedirs(d, exist_ok=True)
    per = total // shards
    for i, name in enumerate(names):
        n = per + (total - per * shards if i == shards - 1 else 0)
        if n >= 2**31:
            raise ValueError(f"llm.c shards hold < 2**31 tokens; use more shards than {shards} for {total}")
        hdr = np.zeros(256, dtype=np.int32)
        hdr[0], hdr[1], hdr[2] = 20240520, 1, n
        with open(name, "wb") as f:
            f.write(hdr.tobytes())
            f.truncate(1024 + 2 * n)
    open(stamp, "w").close()
    return names


def _scaling_child(d: str, seq_len: int, batch_size: int, first_batch: bool) -> Dict[str, Any]:
    import glob

    import tokenfeed

    names = sorted(glob.glob(os.path.join(d, "shard_*.bin")))
    rss0 = _self_status("VmRSS")
    _reset_peak_rss()
    t = time.perf_counter()
    ds = tokenfeed.open(names)
    r: Dict[str, Any] = {"open_s": time.perf_counter() - t}
    r["open_rss_delta_mb"] = (_self_status("VmHWM") - rss0) / 1024
    if first_batch:
        t = time.perf_counter()
        loader = tokenfeed.Loader(ds, seq_len=seq_len, batch_size=batch_size, seed=0, output="numpy")
        next(iter(loader))
        r["first_batch_s"] = time.perf_counter() - t
        r["first_batch_rss_delta_mb"] = (_self_status("VmHWM") - rss0) / 1024
        loader.close()
    r["num_tokens"] = ds.num_tokens
    return r


def _restore_child(path: str, seq_len: int, batch_size: int, positions: Sequence[int]) -> List[Dict[str, Any]]:
    import tokenfeed

    ds = tokenfeed.open(path)
    out = []
    for pos in positions:
        ref = tokenfeed.Loader(ds, seq_len=seq_len, batch_size=batch_size, seed=0, output="numpy")
        st = ref.state_dict()
        ref.close()
        st["position"] = pos
        t = time.perf_counter()
        loader = tokenfeed.Loader(ds, seq_len=seq_len, batch_size=batch_size, seed=0, output="numpy")
        loader.load_state_dict(st)
        next(iter(loader))
        out.append({"loader": "tokenfeed", "position": pos, "restore_s": time.perf_counter() - t})
        loader.close()
    return out


def _restore_dataloader_child(raw: str, dtype: str, seq_len: int, batch_size: int, samples_path: str,
                              positions: Sequence[int]) -> List[Dict[str, Any]]:
    """A plain map-style DataLoader resumes by replaying (iterating and dropping) batches."""
    from torch.utils.data import DataLoader

    samples = np.load(samples_path)
    out = []
    for pos in positions:
        ds = _MemmapSamples(raw, dtype, seq_len)
        t = time.perf_counter()
        dl = DataLoader(ds, batch_size=batch_size, sampler=_SampleList(samples, 10**9), num_workers=0)
        it = iter(dl)
        for _ in range(pos // batch_size):
            next(it)
        next(it)
        out.append({"loader": "torch DataLoader (replay)", "position": pos, "restore_s": time.perf_counter() - t})
    return out


# The C gather ceiling (compiled at run time into the cache dir by _compile_ceiling).
_CEILING_C = r"""/* The C gather ceiling for `tokenfeed bench`: the fastest plain C can copy the same
 * shuffled samples out of a memory-mapped token file into an int64 batch.
 *
 * Compiled at run time by bench.py (cc -O3) into the benchmark cache; not part of the
 * library. No threads beyond a fixed pool of pthreads that each own one output buffer
 * and take batches t, t+T, t+2T, ... of the cyclic sample list; thread 0 also records
 * the time of each of its batches for p50/p99.
 *
 * usage: ceiling FILE DATA_OFFSET ELEM_SIZE SEQ_LEN BATCH OFFSETS_FILE WARMUP THREADS SECONDS MAX_BATCHES
 * OFFSETS_FILE holds uint64 token offsets (one per sample, sample = SEQ_LEN + 1 tokens).
 * Prints one JSON line: batches, wall_s, cpu_s, p50_ms, p99_ms, peak_rss_kb, checksum.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const unsigned char *g_data;
static size_t g_elem, g_l1, g_batch, g_noffs, g_warmup, g_max;
static const uint64_t *g_offs;
static double g_seconds;
static int g_threads;
static double *g_times;
static size_t g_ntimes;

typedef struct {
    int id;
    size_t batches;
    uint64_t checksum;
    double start, end, cpu;
} worker;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void gather(int64_t *out, size_t b) {
    for (size_t s = 0; s < g_batch; s++) {
        uint64_t off = g_offs[(b * g_batch + s) % g_noffs];
        int64_t *o = out + s * g_l1;
        if (g_elem == 2) {
            const uint16_t *src = (const uint16_t *)(g_data) + off;
            for (size_t j = 0; j < g_l1; j++) o[j] = src[j];
        } else if (g_elem == 4) {
            const uint32_t *src = (const uint32_t *)(g_data) + off;
            for (size_t j = 0; j < g_l1; j++) o[j] = src[j];
        } else {
            const uint8_t *src = g_data + off;
            for (size_t j = 0; j < g_l1; j++) o[j] = src[j];
        }
    }
}

static void *run(void *arg) {
    worker *w = arg;
    int64_t *out = aligned_alloc(64, ((g_batch * g_l1 * 8 + 63) / 64) * 64);
    if (!out) return NULL;
    size_t b = (size_t)w->id;
    for (size_t i = 0; i < g_warmup; i++, b += (size_t)g_threads) gather(out, b);
    struct timespec c0, c1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
    double start = w->start = now();
    for (;;) {
        double t0 = now();
        gather(out, b);
        double t1 = now();
        w->checksum += (uint64_t)out[(b * 31) % (g_batch * g_l1)];
        if (w->id == 0 && g_ntimes < g_max) g_times[g_ntimes++] = t1 - t0;
        w->batches++;
        b += (size_t)g_threads;
        if (w->batches * (size_t)g_threads >= g_max || t1 - start >= g_seconds) break;
    }
    w->end = now();
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
    w->cpu = (c1.tv_sec - c0.tv_sec) + (c1.tv_nsec - c0.tv_nsec) * 1e-9;
    free(out);
    return NULL;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc != 11) {
        fprintf(stderr, "usage: %s FILE DATA_OFFSET ELEM_SIZE SEQ_LEN BATCH OFFSETS WARMUP THREADS SECONDS MAX\n", argv[0]);
        return 2;
    }
    size_t data_off = strtoull(argv[2], NULL, 10);
    g_elem = strtoull(argv[3], NULL, 10);
    g_l1 = strtoull(argv[4], NULL, 10) + 1;
    g_batch = strtoull(argv[5], NULL, 10);
    g_warmup = strtoull(argv[7], NULL, 10);
    g_threads = atoi(argv[8]);
    g_seconds = atof(argv[9]);
    g_max = strtoull(argv[10], NULL, 10);
    if (g_threads < 1) g_threads = 1;

    int fd = open(argv[1], O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) { perror(argv[1]); return 1; }
    const unsigned char *map = mmap(NULL, st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) { perror("mmap"); return 1; }
    g_data = map + data_off;

    int ofd = open(argv[6], O_RDONLY);
    struct stat ost;
    if (ofd < 0 || fstat(ofd, &ost) < 0) { perror(argv[6]); return 1; }
    g_noffs = ost.st_size / 8;
    g_offs = mmap(NULL, ost.st_size, PROT_READ, MAP_SHARED, ofd, 0);
    if (g_offs == MAP_FAILED || g_noffs == 0) { perror("offsets"); return 1; }

    g_times = calloc(g_max + 1, sizeof(double));
    worker *ws = calloc(g_threads, sizeof(worker));
    pthread_t *th = calloc(g_threads, sizeof(pthread_t));
    for (int i = 0; i < g_threads; i++) {
        ws[i].id = i;
        pthread_create(&th[i], NULL, run, &ws[i]);
    }
    size_t total = 0;
    uint64_t sum = 0;
    double t0 = 1e300, t1 = 0, cpu = 0;
    for (int i = 0; i < g_threads; i++) {
        pthread_join(th[i], NULL);
        total += ws[i].batches;
        sum += ws[i].checksum;
        if (ws[i].start < t0) t0 = ws[i].start;
        if (ws[i].end > t1) t1 = ws[i].end;
        cpu += ws[i].cpu;
    }
    double wall = t1 - t0; /* the timed window, warm-up excluded */
    double t_sum = 0;
    for (size_t i = 0; i < g_ntimes; i++) t_sum += g_times[i];
    qsort(g_times, g_ntimes, sizeof(double), cmp);
    double p50 = g_ntimes ? g_times[g_ntimes / 2] : 0, p99 = g_ntimes ? g_times[(size_t)(g_ntimes * 0.99)] : 0;
    long hwm = 0;
    FILE *f = fopen("/proc/self/status", "r");
    if (f) {
        char line[256];
        while (fgets(line, sizeof line, f))
            if (!strncmp(line, "VmHWM:", 6)) hwm = atol(line + 6);
        fclose(f);
    }
    printf("{\"batches\": %zu, \"wall_s\": %.6f, \"cpu_s\": %.6f, \"thread0_batches\": %zu, \"thread0_busy_s\": %.6f, "
           "\"p50_ms\": %.6f, \"p99_ms\": %.6f, \"peak_rss_kb\": %ld, \"warmup_per_thread\": %zu, \"checksum\": %llu}\n",
           total, wall, cpu, g_ntimes, t_sum, p50 * 1e3, p99 * 1e3, hwm, g_warmup, (unsigned long long)sum);
    return 0;
}
"""


# ----------------------------------------------------------------------------- the run


def _sample_list(ds: Any, args: argparse.Namespace, n: int, shuffle: Any = True) -> np.ndarray:
    """The first n sample indices of tokenfeed's stream for this configuration (shared by every loader)."""
    import tokenfeed

    loader = tokenfeed.Loader(ds, seq_len=args.seq_len, batch_size=args.batch_size, seed=args.seed,
                              shuffle=shuffle, output="numpy")
    n = min(n, loader.num_samples)
    order = getattr(loader, "_order", None)
    if order is not None and hasattr(order, "sample_at"):
        s = np.asarray(order.sample_at(np.arange(n, dtype=np.uint64)), dtype=np.uint64)
    else:  # same distribution, other order: only the ordering differs from tokenfeed's
        s = np.random.default_rng(args.seed).permutation(loader.num_samples)[:n].astype(np.uint64)
    loader.close()
    return s


def _row(name: str, group: str, config: Dict[str, Any], r: Dict[str, Any], cache: str = "warm",
         note: str = "") -> Dict[str, Any]:
    row = {"name": name, "group": group, "cache": cache, "config": config, "note": note}
    row.update(r)
    return row


def _run_cases(cases: List[tuple], args: argparse.Namespace, log: Callable[[str], None],
               results: List[Dict[str, Any]]) -> None:
    for i, (name, group, case, python, note, cache) in enumerate(cases):
        log(f"({i + 1}/{len(cases)}) {name} [{cache}] ...")
        t = time.monotonic()
        r = _spawn(case, python, args.timeout)
        shown = {k: v for k, v in case.items() if k not in ("offsets", "samples", "offsets_file", "binary",
                                                              "peer_dir", "warmup", "seconds", "timeout")}
        results.append(_row(name, group, shown, r, cache=cache, note=note))
        if r.get("status") == "ok":
            log(f"    {_human(r['tokens_per_s'])} tokens/s, p50 {r['p50_ms']:.3f} ms, p99 {r['p99_ms']:.3f} ms, "
                f"{r['cpu_s_per_btok']:.1f} CPU s/Gtok, peak RSS {r['peak_rss_mb']:.0f} MB "
                f"({time.monotonic() - t:.1f}s)")
        else:
            log(f"    {r.get('status')}: {r.get('reason')}")


def run(args: argparse.Namespace) -> Dict[str, Any]:
    import tokenfeed

    log = _Log(args.quiet)
    os.makedirs(args.cache_dir, exist_ok=True)
    t_start = time.monotonic()
    report: Dict[str, Any] = {"schema": SCHEMA_VERSION, "tool": "tokenfeed bench", "argv": getattr(args, "argv", None),
                              "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": machine_info(),
                              "quick": bool(args.quick)}
    m = report["machine"]
    log(f"machine: {m['cpu_model']}, {m['cores']} cores, {m['memory_gib']} GiB, Linux {m['kernel']}")

    # ---- data
    if args.data:
        paths = args.data if len(args.data) > 1 else args.data[0]
        ds = tokenfeed.open(paths, dtype=args.dtype)
        run_dir = os.path.join(args.cache_dir, f"data-{ds.fingerprint}")
        os.makedirs(run_dir, exist_ok=True)
        raw = _raw_copy(ds, os.path.join(run_dir, "train.bin"), log)
        data_info = {"generated": False, "path": args.data, "format": ds.format, "tokens": ds.num_tokens,
                     "documents": ds.num_documents, "dtype": ds.dtype.name, "vocab_size": ds.vocab_size,
                     "files": ds.num_files, "raw_copy": raw}
        native, zdir, vocab = paths, None, ds.vocab_size or int(np.iinfo(ds.dtype).max) + 1
        doc_ends = None
    else:
        key = hashlib.sha1(json.dumps([args.tokens, args.vocab_size, args.doc_length, args.zipf, args.seed]).encode())
        run_dir = os.path.join(args.cache_dir, f"gen-{_human(args.tokens)}-{key.hexdigest()[:10]}")
        meta = generate_dataset(run_dir, tokens=args.tokens, vocab_size=args.vocab_size, doc_length=args.doc_length,
                                zipf=args.zipf, seed=args.seed, log=log)
        native, zdir, raw = meta["native"], meta["zstd"], meta["raw"]
        ds = tokenfeed.open(native)
        vocab = args.vocab_size
        data_info = {"generated": True, "path": run_dir, "format": ds.format, "tokens": ds.num_tokens,
                     "documents": ds.num_documents, "dtype": ds.dtype.name, "vocab_size": vocab,
                     "doc_length": args.doc_length, "doc_length_stats": meta["doc_length_stats"],
                     "zipf": args.zipf, "generation_s": meta["seconds"], "reused": meta["reused"]}
        doc_ends = None
    raw_dtype = ds.dtype.name
    report["dataset"] = data_info
    L, B = args.seq_len, args.batch_size
    report["config"] = {"seq_len": L, "batch_size": B, "seed": args.seed, "data_dtype": raw_dtype,
                        "output_dtype": "int64", "shuffle": "full", "tokens_per_batch": B * L,
                        "seconds_per_case": args.seconds, "warmup_batches": args.warmup,
                        "token_count_note": "tokens/s counts batch x seq_len training tokens per batch"}

    # ---- shared sample list: tokenfeed's own shuffled order (full shuffle, seed)
    n_samples = min(ds.num_tokens // L, 1 << 21)
    samples = _sample_list(ds, args, n_samples)
    samples_path = os.path.join(run_dir, f"samples-{L}-{B}-{args.seed}.npy")
    np.save(samples_path, samples)
    offsets_file = os.path.join(run_dir, f"offsets-{L}-{B}-{args.seed}.u64")
    (samples * np.uint64(L)).astype(np.uint64).tofile(offsets_file)
    base = {"seq_len": L, "batch_size": B, "seed": args.seed, "warmup": args.warmup, "seconds": args.seconds,
            "samples": samples_path, "offsets": samples_path.replace("samples-", "offsets-"), "raw": raw,
            "raw_dtype": raw_dtype, "vocab_size": vocab}
    np.save(base["offsets"], samples * np.uint64(L))

    results: List[Dict[str, Any]] = []
    cases: List[tuple] = []
    py = sys.executable
    have_torch = _torch_ok()
    out_kind = "torch" if have_torch else "numpy"
    tf = dict(base, kind="tokenfeed", path=native, output=out_kind, dtype_in=args.dtype if args.data else None)
    bi = tokenfeed.build_info()

    def add(name: str, group: str, case: Dict[str, Any], note: str = "", cache: str = "warm",
            python: str = py) -> None:
        cases.append((name, group, case, python, note, cache))

    def skip(name: str, group: str, status: str, reason: str, config: Optional[Dict[str, Any]] = None,
             cache: str = "warm") -> None:
        results.append(_row(name, group, config or {}, {"status": status, "reason": reason}, cache=cache))

    if "tokenfeed" in args.groups:
        add("tokenfeed", "tokenfeed", dict(tf), "reference: shuffle=full, default threads and backend, int64, "
            f"output={out_kind}")
        add("tokenfeed threads=1", "tokenfeed", dict(tf, threads=1))
        add("tokenfeed threads=2", "tokenfeed", dict(tf, threads=2))
        add("tokenfeed shuffle=block", "tokenfeed", dict(tf, shuffle="block"))
        add("tokenfeed shuffle=none", "tokenfeed", dict(tf, shuffle=False))
        add("tokenfeed backend=mmap", "tokenfeed", dict(tf, backend="mmap"))
        add("tokenfeed backend=pread", "tokenfeed", dict(tf, backend="pread"))
        if bi.get("io_uring", {}).get("usable"):
            add("tokenfeed backend=io_uring", "tokenfeed", dict(tf, backend="io_uring"))
        else:
            skip("tokenfeed backend=io_uring", "tokenfeed", "skipped",
                 f"io_uring not usable here: {bi.get('io_uring', {}).get('detail')}")
        if zdir and bi.get("zstd", {}).get("usable"):
            add("tokenfeed zstd data", "tokenfeed", dict(tf, path=zdir),
                "full shuffle: every sample decompresses its own zstd block")
            add("tokenfeed zstd data shuffle=block", "tokenfeed", dict(tf, path=zdir, shuffle="block"),
                "two-level shuffle: consecutive samples share a decompressed block")
        elif not zdir:
            skip("tokenfeed zstd data", "tokenfeed", "skipped", "--data given: no zstd copy of it is made")
        else:
            skip("tokenfeed zstd data", "tokenfeed", "skipped", "zstd not compiled in")
        add("tokenfeed dtype=int32", "tokenfeed", dict(tf, out_dtype="int32"))
        if have_torch:
            add("tokenfeed output=numpy", "tokenfeed", dict(tf, output="numpy"))
        add("tokenfeed on the flat .bin", "tokenfeed", dict(tf, path=raw, dtype_in=raw_dtype),
            "the same headerless file the baselines read")
        if bi.get("cuda", {}).get("usable"):
            add("tokenfeed device=cuda", "tokenfeed", dict(tf, device="cuda"))
        else:
            skip("tokenfeed device=cuda", "tokenfeed", "skipped",
                 f"no usable CUDA device (build_info: {bi.get('cuda', {}).get('detail')})")

    ceiling_reason = None
    if "ceiling" in args.groups:
        binary, ceiling_reason = _compile_ceiling(args.cache_dir)
        for t in (1, 2):
            name = f"C gather ceiling ({t} thread{'s' if t > 1 else ''})"
            if binary is None:
                skip(name, "ceiling", "skipped", ceiling_reason or "?")
                continue
            add(name, "ceiling", dict(base, kind="ceiling", binary=binary, path=raw, offsets_file=offsets_file,
                                      elem_size=np.dtype(raw_dtype).itemsize, threads=t,
                                      max_batches=50_000_000),
                "same shuffled samples, mmap -> int64, compiled with cc -O3 at run time")

    if "baselines" in args.groups:
        if have_torch:
            add("nanoGPT get_batch", "baseline", dict(base, kind="nanogpt"),
                "karpathy/nanoGPT train.py get_batch: np.memmap per batch, torch.stack of astype(int64) slices "
                "for x and y; offsets from the shared sample list")
            for w in (0, 2, 4):
                for pin in (False, True):
                    add(f"DataLoader workers={w}{' pin_memory' if pin else ''}", "baseline",
                        dict(base, kind="dataloader", workers=w, pin_memory=pin),
                        "map-style Dataset over np.memmap, default collate (torch.stack), batch_size=8"
                        + ("; pin_memory is a no-op without CUDA" if pin and not bi.get("cuda", {}).get("usable")
                           else ""))
        else:
            for nm in ["nanoGPT get_batch"] + [f"DataLoader workers={w}{p}" for w in (0, 2, 4)
                                               for p in ("", " pin_memory")]:
                skip(nm, "baseline", "not installed", "torch is not installed (pip install torch)")

    if "peers" in args.groups:
        ppy, notes = _peer_python(args, log)
        peer_dir = os.path.join(run_dir, "peers")
        os.makedirs(peer_dir, exist_ok=True)
        nw = min(2, os.cpu_count() or 1)
        recommended = {
            "litdata": (f"litdata.optimize(item_loader=TokensLoader()) chunks of {L + 1}x512 tokens; "
                        f"StreamingDataset(item_loader=TokensLoader(block_size={L + 1}), shuffle=True); "
                        f"StreamingDataLoader(batch_size={B}, num_workers={nw}, pin_memory=True) as in litgpt "
                        "pretraining; widened to int64"),
            "mosaicml-streaming": (f"MDSWriter(columns={{'tokens': 'bytes'}}, no compression, 64mb shards) of "
                                   f"{L + 1}-token samples; StreamingDataset(local=..., shuffle=True, "
                                   f"batch_size={B}) (default py1e shuffle); DataLoader(num_workers={nw}, "
                                   "pin_memory=True)"),
            "megatron-core": (f"IndexedDatasetBuilder .bin/.idx; GPTDataset via BlendedMegatronDatasetBuilder "
                              f"(sequence_length={L}, mmap_bin_files=True, create_attention_mask=False as for "
                              f"flash attention, shuffled sample index); "
                              f"DataLoader(num_workers={nw}, pin_memory=True)"),
            "datasets": (f"Dataset of {L + 1}-token rows saved to disk (Arrow), load_from_disk().with_format('torch'); "
                         f"DataLoader(batch_size={B}, num_workers={nw}) over the shared sample list "
                         "(batched __getitems__)"),
        }
        for peer in PEERS:
            name = {"litdata": "LitData TokensLoader", "mosaicml-streaming": "MosaicML Streaming (MDS)",
                    "megatron-core": "Megatron-core GPTDataset", "datasets": "HF datasets (Arrow)"}[peer]
            if not have_torch:
                skip(name, "peer", "not installed", "torch is not installed")
                continue
            if peer in notes:
                skip(name, "peer", "not installed", notes[peer])
                continue
            if not _has_module(ppy, _PEER_IMPORT[peer]):
                skip(name, "peer", "not installed",
                     f"{peer} is not installed (run with --install-peers, or pip install {peer})")
                continue
            add(name, "peer", dict(base, kind=peer, peer_dir=peer_dir, workers=nw), recommended[peer], python=ppy)
    elif args.no_peers:
        for peer in PEERS:
            skip(peer, "peer", "skipped", "--no-peers")

    if "cold" in args.groups:
        nb = 150 if args.quick else 600
        cold = dict(tf, warmup=1, seconds=1e9, max_batches=nb, cold=True, output="numpy")
        add("tokenfeed backend=mmap (cold)", "tokenfeed", dict(cold, backend="mmap"), f"{nb} batches after "
            "posix_fadvise(DONTNEED) of every file", cache="cold")
        if bi.get("io_uring", {}).get("usable"):
            add("tokenfeed backend=io_uring (cold)", "tokenfeed", dict(cold, backend="io_uring"), cache="cold")
            add("tokenfeed backend=io_uring direct_io (cold)", "tokenfeed",
                dict(cold, backend="io_uring", direct_io=True), "O_DIRECT: bypasses the page cache", cache="cold")
        add("tokenfeed backend=pread (cold)", "tokenfeed", dict(cold, backend="pread"), cache="cold")
        if have_torch:
            add("nanoGPT get_batch (cold)", "baseline", dict(base, kind="nanogpt", warmup=1, seconds=1e9,
                                                             max_batches=nb, cold=True), cache="cold")

    _run_cases(cases, args, log, results)
    order = {"tokenfeed": 0, "ceiling": 1, "baseline": 2, "peer": 3}
    results.sort(key=lambda r: (r["cache"] == "cold", order.get(r["group"], 9)))  # stable: keeps case order
    report["results"] = results

    # ---- ratios and goals
    def tps(name: str) -> Optional[float]:
        for r in results:
            if r["name"] == name and r.get("status") == "ok":
                return r["tokens_per_s"]
        return None

    ref = tps("tokenfeed")
    ceil1 = tps("C gather ceiling (1 thread)")
    ceil2 = tps("C gather ceiling (2 threads)")
    ceil = max([c for c in (ceil1, ceil2) if c] or [0]) or None
    for r in results:
        if r.get("status") == "ok":
            r["ratio_to_tokenfeed"] = r["tokens_per_s"] / ref if ref else None
            r["ratio_to_ceiling"] = r["tokens_per_s"] / ceil if ceil else None
    report["reference"] = {"tokenfeed_tokens_per_s": ref, "ceiling_tokens_per_s": ceil,
                           "ceiling_1_thread_tokens_per_s": ceil1, "ceiling_2_threads_tokens_per_s": ceil2}
    nano = tps("nanoGPT get_batch")
    cold_mmap = tps("tokenfeed backend=mmap (cold)")
    cold_uring = max([x for x in (tps("tokenfeed backend=io_uring (cold)"),
                                  tps("tokenfeed backend=io_uring direct_io (cold)")) if x] or [0]) or None
    report["goals"] = {
        "warm_vs_ceiling": {"target": 0.8, "value": ref / ceil if ref and ceil else None,
                            "value_vs_1_thread_ceiling": ref / ceil1 if ref and ceil1 else None},
        "warm_vs_nanogpt": {"target": 25.0, "value": ref / nano if ref and nano else None},
        "cold_io_uring_vs_mmap": {"target": 4.0, "value": cold_uring / cold_mmap if cold_uring and cold_mmap else None},
    }
    for g in report["goals"].values():
        g["met"] = None if g["value"] is None else bool(g["value"] >= g["target"])

    # ---- zstd
    if "zstd" in args.groups:
        report["zstd"] = _zstd_figures(native, zdir, log)

    # ---- scaling and restore
    if "scaling" in args.groups:
        # 10^4 shards take minutes to open while open() touches every shard (see docs/performance.md)
        sizes = [10**9, 10**10, 10**11] if args.quick else [10**9, 10**10, 10**11, 10**12]
        log("time to first batch and memory vs dataset size (sparse llm.c shards)")
        report["scaling"] = open_scaling(args.cache_dir, sizes, seq_len=L, batch_size=B, log=log)
        report["scaling_nanogpt"] = _nanogpt_scaling(args.cache_dir, sizes, L, B, log) if have_torch else []
    if "restore" in args.groups:
        report["restore"] = _restore_figures(native, raw, raw_dtype, samples_path, L, B, have_torch, log)
    report["peers_note"] = ("peers run with their recommended configuration (see each row's note); a peer that "
                            "is missing or fails is listed with the reason")
    report["total_seconds"] = round(time.monotonic() - t_start, 1)
    report["baselines_ok"] = sorted({r["name"] for r in results
                                     if r["group"] in ("baseline", "peer") and r.get("status") == "ok"})
    log(f"done in {report['total_seconds']}s")
    return report


def _zstd_figures(native: Any, zdir: Optional[str], log: Callable[[str], None]) -> Dict[str, Any]:
    import tokenfeed

    if not zdir:
        return {"status": "skipped", "reason": "--data given: the benchmark compresses only generated data"}
    try:
        raw_bytes = sum(os.path.getsize(p) for p in _dataset_files(native))
        z_bytes = sum(os.path.getsize(p) for p in _dataset_files(zdir))
        zs = tokenfeed.open(zdir)
        n = min(zs.num_tokens, 1 << 26)
        step = 1 << 20
        drop = 0
        t = time.perf_counter()
        for s in range(0, n, step):
            drop += len(zs.tokens(s, min(n, s + step)))
        dt = time.perf_counter() - t
        r = {"status": "ok", "level": 3, "bytes_uncompressed_dataset": raw_bytes, "bytes_zstd_dataset": z_bytes,
             "ratio": raw_bytes / z_bytes, "decode_tokens_per_s": drop / dt,
             "decode_mb_per_s": drop * zs.dtype.itemsize / dt / 1e6,
             "method": "sequential Dataset.tokens() over the zstd dataset, one thread (C decode + copy)",
             "note": "synthetic i.i.d. Zipf tokens: entropy coding only, no repeated phrases - real "
                     "tokenized text also has LZ matches, so its ratio is typically higher"}
        log(f"zstd: ratio {r['ratio']:.3f}, decode {_human(r['decode_tokens_per_s'])} tokens/s")
        return r
    except Exception as e:
        return {"status": "failed", "reason": f"{type(e).__name__}: {e}"}


def _nanogpt_scaling(cache: str, sizes: Sequence[int], L: int, B: int, log: Callable[[str], None]) -> List[Dict]:
    """nanoGPT's loop needs one flat file: time to first batch over one sparse .bin of each size."""
    out = []
    for n in sizes:
        path = os.path.join(cache, "sparse", f"flat-{n}.bin")
        if not os.path.exists(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.truncate(2 * n)
        code = (
            "import json,time,numpy as np,torch,sys\n"
            "from tokenfeed.bench import _self_status,_reset_peak_rss\n"
            f"rss0=_self_status('VmRSS');_reset_peak_rss();t=time.perf_counter()\n"
            f"data=np.memmap({path!r},dtype=np.uint16,mode='r')\n"
            f"ix=torch.randint(len(data)-{L},({B},))\n"
            f"x=torch.stack([torch.from_numpy((data[i:i+{L}]).astype(np.int64)) for i in ix])\n"
            "print('@@RESULT@@'+json.dumps({'first_batch_s':time.perf_counter()-t,"
            "'first_batch_rss_delta_mb':(_self_status('VmHWM')-rss0)/1024}))")
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        k = p.stdout.rfind("@@RESULT@@")
        r = json.loads(p.stdout[k + 10:]) if k >= 0 else {"status": "failed", "reason": p.stderr[-300:]}
        r.setdefault("status", "ok")
        r.update({"tokens": n, "files": 1, "loader": "nanoGPT get_batch (one flat file)"})
        out.append(r)
    log("nanoGPT first batch vs size: " + ", ".join(f"{_human(r['tokens'])}: {r.get('first_batch_s', 0) * 1e3:.1f} ms"
                                                    for r in out if r["status"] == "ok"))
    return out


def _restore_figures(native: Any, raw: str, raw_dtype: str, samples_path: str, L: int, B: int, have_torch: bool,
                     log: Callable[[str], None]) -> List[Dict[str, Any]]:
    out: List[Dict[str, Any]] = []
    pos = [0, B * 10**3, B * 10**6, B * 10**9, B * 10**12]
    code = (f"import json; from tokenfeed.bench import _restore_child\n"
            f"print('@@RESULT@@'+json.dumps(_restore_child({native!r}, {L}, {B}, {pos!r})))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    k = p.stdout.rfind("@@RESULT@@")
    if k >= 0:
        out += json.loads(p.stdout[k + 10:])
    else:
        out.append({"loader": "tokenfeed", "status": "failed", "reason": p.stderr.strip()[-300:]})
    if have_torch:
        dpos = [0, B * 10, B * 100, B * 1000]
        code = (f"import json; from tokenfeed.bench import _restore_dataloader_child\n"
                f"print('@@RESULT@@'+json.dumps(_restore_dataloader_child({raw!r}, {raw_dtype!r}, {L}, {B}, "
                f"{samples_path!r}, {dpos!r})))")
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        k = p.stdout.rfind("@@RESULT@@")
        if k >= 0:
            out += json.loads(p.stdout[k + 10:])
        else:
            out.append({"loader": "torch DataLoader (replay)", "status": "failed", "reason": p.stderr.strip()[-300:]})
    out.append({"loader": "peers", "status": "not measured",
                "reason": "LitData and MosaicML Streaming keep resumable state too; their restore is not "
                          "measured yet"})
    for r in out:
        r.setdefault("status", "ok")
    log("restore: " + ", ".join(f"{r['loader']}@{_human(r['position'])}: {r['restore_s'] * 1e3:.1f} ms"
                                for r in out if r["status"] == "ok"))
    return out


# ----------------------------------------------------------------------------- output


def format_table(report: Dict[str, Any]) -> str:
    rows = report.get("results", [])
    hdr = ("loader", "cache", "tokens/s", "batches/s", "p50 ms", "p99 ms", "CPU s/Gtok", "peak RSS MB",
           "x tokenfeed", "x ceiling")
    lines = []
    for r in rows:
        if r.get("status") == "ok":
            lines.append((r["name"], r["cache"], _human(r["tokens_per_s"]), f"{r['batches_per_s']:,.0f}",
                          f"{r['p50_ms']:.3f}", f"{r['p99_ms']:.3f}", f"{r['cpu_s_per_btok']:.1f}",
                          f"{r['peak_rss_mb']:.0f}",
                          f"{r['ratio_to_tokenfeed']:.3f}" if r.get("ratio_to_tokenfeed") else "-",
                          f"{r['ratio_to_ceiling']:.3f}" if r.get("ratio_to_ceiling") else "-"))
        else:
            lines.append((r["name"], r["cache"], f"{r.get('status')}: {r.get('reason', '')}"[:120], "", "", "", "", "",
                          "", ""))
    w = [max(len(h), *(len(l[i]) for l in lines if l[3] or i < 3)) if lines else len(h) for i, h in enumerate(hdr)]
    w[2] = max(len(hdr[2]), *(len(l[2]) for l in lines if l[3])) if any(l[3] for l in lines) else len(hdr[2])
    out = ["  ".join(h.ljust(w[i]) for i, h in enumerate(hdr))]
    for l in lines:
        if l[3]:
            out.append("  ".join(c.ljust(w[i]) if i < 2 else c.rjust(w[i]) for i, c in enumerate(l)))
        else:
            out.append(f"{l[0].ljust(w[0])}  {l[1].ljust(w[1])}  {l[2]}")
    return "\n".join(out)


def format_summary(report: Dict[str, Any]) -> str:
    out = [format_table(report), ""]
    g = report.get("goals", {})

    def f(x: Optional[float]) -> str:
        return "n/a" if x is None else f"{x:.2f}x"

    if g:
        out.append("goals (issue 4): warm shuffled int64 vs C ceiling "
                   f"{f(g['warm_vs_ceiling']['value'])} (target 0.8x; vs 1-thread ceiling "
                   f"{f(g['warm_vs_ceiling']['value_vs_1_thread_ceiling'])}), vs nanoGPT "
                   f"{f(g['warm_vs_nanogpt']['value'])} (target 25x), cold io_uring vs mmap "
                   f"{f(g['cold_io_uring_vs_mmap']['value'])} (target 4x)")
    z = report.get("zstd")
    if z and z.get("status") == "ok":
        out.append(f"zstd level {z['level']}: ratio {z['ratio']:.3f}, decode {_human(z['decode_tokens_per_s'])} "
                   f"tokens/s ({z['decode_mb_per_s']:.0f} MB/s)")
    for r in report.get("scaling", []):
        if r.get("status") == "ok":
            out.append(f"{_human(r['tokens'])} tokens in {r['shards']} shards: open {r['open_s'] * 1e3:.0f} ms "
                       f"(+{r['open_rss_delta_mb']:.1f} MB), first batch {r['first_batch_s'] * 1e3:.0f} ms "
                       f"(+{r['first_batch_rss_delta_mb']:.1f} MB)")
    out.append(f"baselines and peers that ran: {', '.join(report.get('baselines_ok', [])) or 'none'}")
    return "\n".join(out)


def write_plot(report: Dict[str, Any], path: str) -> Optional[str]:
    """PNG bar chart of tokens/s. Returns an error message instead of raising when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: pip install matplotlib to get --plot"
    rows = [r for r in report.get("results", []) if r.get("status") == "ok"]
    if not rows:
        return "nothing to plot: no configuration ran"
    colors = {"tokenfeed": "#1f77b4", "ceiling": "#7f7f7f", "baseline": "#ff7f0e", "peer": "#2ca02c"}
    labels = [r["name"] + (" [cold]" if r["cache"] == "cold" and "cold" not in r["name"] else "") for r in rows]
    vals = [r["tokens_per_s"] for r in rows]
    fig, ax = plt.subplots(figsize=(10, 0.32 * len(rows) + 1.6))
    y = np.arange(len(rows))[::-1]
    ax.barh(y, vals, color=[colors.get(r["group"], "#9467bd") for r in rows],
            hatch=None, alpha=0.9, edgecolor=["black" if r["cache"] == "cold" else "none" for r in rows])
    ax.set_yticks(y)
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("tokens/s (log scale)")
    for yi, v in zip(y, vals):
        ax.text(v, yi, " " + _human(v), va="center", fontsize=7)
    m = report.get("machine", {})
    c = report.get("config", {})
    ax.set_title(f"tokenfeed bench: {c.get('batch_size')} x {c.get('seq_len')} {c.get('data_dtype')} -> int64, "
                 f"shuffled\n{m.get('cpu_model')}, {m.get('cores')} cores", fontsize=9)
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color=v, label=k) for k, v in colors.items()], fontsize=7, loc="lower right")
    ax.set_xlim(right=max(vals) * 8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def main(argv: Optional[List[str]] = None) -> int:
    """CLI entry of ``tokenfeed bench``. Returns the exit status."""
    raw_argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(raw_argv)
    if args.worker:
        return _worker()
    args.argv = raw_argv
    try:
        report = run(args)
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130
    print(format_summary(report))
    if args.json:
        with open(args.json + ".tmp", "w") as f:
            json.dump(report, f, indent=1, default=str)
        os.replace(args.json + ".tmp", args.json)
        sys.stderr.write(f"wrote {args.json}\n")
    if args.plot:
        err = write_plot(report, args.plot)
        if err:
            sys.stderr.write(f"--plot: {err}\n")
            return 0 if not args.json else 0
        sys.stderr.write(f"wrote {args.plot}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
