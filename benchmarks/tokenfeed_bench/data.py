"""Data the benchmark reads: generated token streams, shard layouts, a larger-than-memory file.

Everything is written into the cache directory and reused while its parameters match
(a ``meta.json`` or ``done`` stamp is written last). Nothing is downloaded.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import numpy as np

from .common import human

DocSpec = Tuple[Any, ...]


def parse_doc_length(spec: str) -> DocSpec:
    """lognormal:MU:SIGMA, fixed:N or uniform:LO:HI -> a tuple; ValueError otherwise."""
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
    raise ValueError(f"--doc-length {spec!r}: use lognormal:MU:SIGMA, fixed:N or uniform:LO:HI")


def doc_lengths(rng: np.random.Generator, n: int, spec: DocSpec) -> np.ndarray:
    if spec[0] == "lognormal":
        x = rng.lognormal(spec[1], spec[2], size=n)
        return np.clip(np.rint(x), 1, 1 << 20).astype(np.int64)
    if spec[0] == "fixed":
        return np.full(n, spec[1], dtype=np.int64)
    return rng.integers(spec[1], spec[2] + 1, size=n, dtype=np.int64)


def _zipf_table(vocab: int, s: float, rng: np.random.Generator) -> Tuple[Optional[np.ndarray], Optional[np.ndarray]]:
    """CDF over ranks and a fixed rank -> token id map (frequent ids spread over the vocabulary)."""
    if s <= 0:
        return None, None
    w = np.arange(1, vocab + 1, dtype=np.float64) ** (-s)
    cdf = np.cumsum(w)
    cdf /= cdf[-1]
    return cdf, rng.permutation(vocab).astype(np.uint32)


def token_dtype(vocab_size: int) -> Any:
    return np.uint8 if vocab_size <= 256 else np.uint16 if vocab_size <= 65536 else np.uint32


def _tokens(rng: np.random.Generator, n: int, vocab: int, table: Tuple[Any, Any]) -> np.ndarray:
    cdf, ids = table
    if cdf is not None:
        return ids[np.searchsorted(cdf, rng.random(n), side="right").clip(0, vocab - 1)]
    return rng.integers(0, vocab, size=n, dtype=np.uint32)


def _progress(log: Callable[[str], None], what: str, total: int, period: float,
              speed: Callable[[int, float], str], at_once: bool = False) -> Callable[[int], None]:
    """``report(done)`` for a loop writing ``total`` units: a line ``what: P% (speed)`` at most
    every ``period`` seconds (the first at the first report when ``at_once``), ``speed(done,
    seconds since the start)`` saying how fast it goes."""
    t0 = time.monotonic()
    last = float("-inf") if at_once else t0

    def report(done: int) -> None:
        nonlocal last
        now = time.monotonic()
        if now - last > period:
            log(f"{what}: {done / total * 100:5.1f}% ({speed(done, now - t0)})")
            last = now

    return report


def generate_dataset(out_dir: str, *, tokens: int, vocab_size: int, doc_length: str, zipf: float, seed: int,
                     log: Callable[[str], None], zstd: bool = True) -> Dict[str, Any]:
    """Write one synthetic token stream three ways: native, native+zstd, flat raw .bin (nanoGPT style).

    Token ids are Zipf-distributed, documents log-normal (or fixed/uniform) long, each
    ending with the end-of-text id ``vocab_size - 1``. Reused when ``meta.json``
    (written last) matches the parameters.
    """
    import tokenfeed

    spec = {"tokens": int(tokens), "vocab_size": int(vocab_size), "doc_length": doc_length, "zipf": zipf,
            "seed": seed, "generator": 4}  # 4: the zstd copy as the writer writes it by default (2048-token blocks, raw literals where Huffman gains little)
    meta_path = os.path.join(out_dir, "meta.json")
    if os.path.exists(meta_path):
        try:
            with open(meta_path) as f:
                meta: Dict[str, Any] = json.load(f)
            if meta.get("spec") == spec and (not zstd or meta.get("zstd")):
                log(f"reusing generated dataset {out_dir}")
                meta["reused"] = True
                return meta
        except (OSError, ValueError):
            pass
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    dtype = token_dtype(vocab_size)
    rng = np.random.default_rng(seed)
    table = _zipf_table(vocab_size, zipf, rng)
    lspec = parse_doc_length(doc_length)
    eot = vocab_size - 1
    native, zdir, raw = (os.path.join(out_dir, n) for n in ("native", "zstd", "train.bin"))
    t0 = time.monotonic()
    report = _progress(log, "generating data", tokens, 2,
                       lambda n, s: f"{human(n)} tokens, {human(n / max(s, 1e-9))} tokens/s", at_once=True)
    written = ndocs = 0
    lengths_all: List[np.ndarray] = []
    ends_all: List[np.ndarray] = []
    zw = tokenfeed.DatasetWriter(zdir, vocab_size=vocab_size, compression="zstd", level=3) if zstd else None
    with tokenfeed.DatasetWriter(native, vocab_size=vocab_size) as w, open(raw, "wb") as rf:
        chunk = 1 << 22
        while written < tokens:
            n = min(chunk, tokens - written)
            toks = _tokens(rng, n, vocab_size, table).astype(dtype)
            lens = doc_lengths(rng, max(16, 4 * n // 64), lspec)
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
            ends_all.append(ends + written)
            written += n
            ndocs += len(lens)
            report(written)
    if zw is not None:
        zw.close()
    lens = np.concatenate(lengths_all)
    doc_ends = os.path.join(out_dir, "doc_ends.npy")
    np.save(doc_ends, np.concatenate(ends_all).astype(np.int64))
    meta = {"spec": spec, "dtype": np.dtype(dtype).name, "documents": int(ndocs), "native": native,
            "zstd": zdir if zstd else None, "raw": raw, "doc_ends": doc_ends,
            "seconds": round(time.monotonic() - t0, 2),
            "doc_length_stats": {"mean": float(lens.mean()), "median": float(np.median(lens)),
                                 "p99": float(np.percentile(lens, 99)), "max": int(lens.max())}}
    with open(meta_path + ".tmp", "w") as f:
        json.dump(meta, f, indent=1)
    os.replace(meta_path + ".tmp", meta_path)
    meta["reused"] = False
    log(f"generated {human(tokens)} tokens, {ndocs:,} documents in {meta['seconds']}s")
    return meta


def raw_copy(ds: Any, out: str, log: Callable[[str], None]) -> str:
    """A headerless copy of an existing dataset's tokens for the loaders that read one flat file."""
    stamp = out + ".done"
    if os.path.exists(stamp) and open(stamp).read() == ds.fingerprint:
        return out
    log(f"writing a flat copy of --data for the other loaders: {out}")
    with open(out + ".tmp", "wb") as f:
        step = 1 << 24
        for s in range(0, ds.num_tokens, step):
            np.ascontiguousarray(ds.tokens(s, min(ds.num_tokens, s + step))).tofile(f)
    os.replace(out + ".tmp", out)
    with open(stamp, "w") as f:
        f.write(ds.fingerprint)
    return out


def dataset_files(path: Any) -> List[str]:
    """Every file of a dataset path (directory, file, or list of them), index files included."""
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


LLMC_MAGIC = 20240520


def _llmc_header(n: int) -> bytes:
    hdr = np.zeros(256, dtype=np.int32)
    hdr[0], hdr[1], hdr[2] = LLMC_MAGIC, 1, n
    return hdr.tobytes()


def make_sparse_llmc(d: str, total: int, shards: int) -> List[str]:
    """llm.c v1 shards (256 x int32 header, uint16 tokens) as sparse files: a real header, a hole for the tokens."""
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
        with open(name, "wb") as f:
            f.write(_llmc_header(n))
            f.truncate(1024 + 2 * n)
    open(stamp, "w").close()
    return names


def make_llmc_shards(raw: str, dtype: str, d: str, shards: int) -> List[str]:
    """The flat token file split into `shards` llm.c shards of real tokens (uint16 only)."""
    stamp = os.path.join(d, "done")
    names = [os.path.join(d, f"shard_{i:05d}.bin") for i in range(shards)]
    if os.path.exists(stamp):
        return names
    if np.dtype(dtype) != np.uint16:
        raise ValueError("llm.c shards hold uint16 tokens; the data is " + dtype)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    data = np.memmap(raw, dtype=np.uint16, mode="r")
    bounds = np.linspace(0, len(data), shards + 1).astype(np.int64)
    for i, name in enumerate(names):
        s, e = int(bounds[i]), int(bounds[i + 1])
        with open(name, "wb") as f:
            f.write(_llmc_header(e - s))
            np.asarray(data[s:e]).tofile(f)
    open(stamp, "w").close()
    return names


def free_bytes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def make_big_file(path: str, size: int, vocab_size: int, seed: int, log: Callable[[str], None],
                  block_tokens: int = 1 << 24) -> Dict[str, Any]:
    """A flat uint16 token file of `size` bytes, every page real data (no holes).

    One block of Zipf tokens is generated and written again and again, each copy rotated
    by a different random amount, so no two pages are alike and the disk and page cache
    hold real bytes. Reused when the stamp matches.
    """
    stamp = path + ".done"
    want = json.dumps({"size": size, "vocab": vocab_size, "seed": seed, "v": 1})
    if os.path.exists(stamp) and os.path.exists(path) and open(stamp).read() == want:
        log(f"reusing {human_size(size)} file {path}")
        return {"path": path, "bytes": size, "reused": True, "seconds": 0.0}
    for p in (path, stamp):
        if os.path.exists(p):
            os.remove(p)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    rng = np.random.default_rng(seed)
    dt = token_dtype(vocab_size)
    block = _tokens(rng, block_tokens, vocab_size, _zipf_table(vocab_size, 1.1, rng)).astype(dt)
    item = np.dtype(dt).itemsize
    t0 = time.monotonic()
    report = _progress(log, "writing the larger-than-memory file", size, 5, lambda n, s: f"{n / s / 1e6:.0f} MB/s")
    written = 0
    with open(path + ".tmp", "wb") as f:
        while written < size:
            chunk = np.roll(block, int(rng.integers(1, block_tokens))).tobytes()
            chunk = chunk[: min(len(chunk), size - written)]
            f.write(chunk)
            written += len(chunk)
            report(written)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)
    drop_cache([path])
    with open(stamp, "w") as f:
        f.write(want)
    secs = time.monotonic() - t0
    log(f"wrote {human_size(size)} in {secs:.0f}s ({size / secs / 1e6:.0f} MB/s)")
    assert written % item == 0
    return {"path": path, "bytes": size, "reused": False, "seconds": round(secs, 1)}


def human_size(n: float) -> str:
    return f"{n / 1e9:.3g} GB" if n >= 1e9 else f"{n / 1e6:.3g} MB"


def sample_list(ds: Any, seq_len: int, batch_size: int, seed: int, n: int) -> np.ndarray:
    """The first n sample indices of tokenfeed's full-shuffle stream (shared by every loader that can take it)."""
    import tokenfeed

    loader = tokenfeed.Loader(ds, seq_len=seq_len, batch_size=batch_size, seed=seed, shuffle=True, output="numpy")
    n = min(n, loader.num_samples)
    order = getattr(loader, "_order", None)
    if order is not None and hasattr(order, "sample_at"):
        s = np.asarray(order.sample_at(np.arange(n, dtype=np.uint64)), dtype=np.uint64)
    else:  # same distribution, other order: only the ordering differs from tokenfeed's
        s = np.random.default_rng(seed).permutation(loader.num_samples)[:n].astype(np.uint64)
    loader.close()
    return s
