"""``tokenfeed inspect``: format, counts, dtype, files, document lengths and packing of a dataset."""
from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from typing import Any, Dict, List, Optional, Tuple, cast

import numpy as np

from ..common._warnings import DataWarning
from ._common import CLIError, _human, _source_options, cli_words

__all__ = ["add_parser", "cmd_inspect"]


def _doc_lengths(ds: Any, max_docs: int) -> Tuple[np.ndarray, np.ndarray, bool]:
    """(starts, lengths, sampled) of every document, or of a uniform sample of max_docs of them."""
    n = ds.num_documents
    core = ds._core
    sampled = n > max_docs
    idx = np.sort(np.random.default_rng(0).choice(n, size=max_docs, replace=False)) if sampled else np.arange(n)
    starts = np.empty(len(idx), dtype=np.int64)
    lens = np.empty(len(idx), dtype=np.int64)
    for j, i in enumerate(idx.tolist()):
        starts[j], lens[j] = core.document(i)
    return starts, lens, sampled


def _inspect(ds: Any, seq_len: Optional[int], max_docs: int, packing: str = "concat") -> Dict[str, Any]:
    starts, lens, sampled = _doc_lengths(ds, max_docs)
    info: Dict[str, Any] = {
        "path": ds.paths if len(ds.paths) > 1 else ds.paths[0],
        "format": ds.format,
        "num_tokens": ds.num_tokens,
        "num_documents": ds.num_documents,
        "dtype": ds.dtype.name,
        "vocab_size": ds.vocab_size,
        "fingerprint": ds.fingerprint,
        "files": ds.files(),
    }
    hist: List[Dict[str, Any]] = []
    if len(lens):
        buckets = np.where(lens > 0, np.floor(np.log2(np.maximum(lens, 1))).astype(np.int64) + 1, 0)
        counts = np.bincount(buckets)
        for k, c in enumerate(counts.tolist()):
            if c or (hist and k < len(counts)):
                lo = 0 if k == 0 else 1 << (k - 1)
                hi = 0 if k == 0 else (1 << k) - 1
                hist.append({"min": lo, "max": hi, "documents": int(c),
                             "tokens": int(lens[buckets == k].sum())})
        info["document_length"] = {
            "sampled": sampled, "documents_measured": int(len(lens)),
            "min": int(lens.min()), "median": float(np.median(lens)), "mean": float(lens.mean()),
            "p99": float(np.percentile(lens, 99)), "max": int(lens.max()),
            "empty": int((lens == 0).sum()), "histogram": hist,
        }
    info.update(_max_id(ds))
    if seq_len is not None:
        info["packing"] = _packing(ds, int(seq_len), packing, starts, lens, sampled)
    return info


# Up to this many local tokens the maximum id is exact; beyond, and for remote data, it is
# the maximum of evenly spaced pieces (inspect stays quick; `verify` reads everything).
_MAX_ID_SCAN = 1 << 31


def _max_id(ds: Any) -> Dict[str, Any]:
    """The largest token id (exact, or over evenly spaced pieces), and warnings about it: ids at
    the dtype's largest value (a vocabulary wider than the dtype was cut when written) or at or
    above vocab_size."""
    from ..sources._dataset import dtype_mismatch
    from ..remote._remote import is_url

    n, step = ds.num_tokens, 1 << 24
    if n <= _MAX_ID_SCAN and not any(is_url(str(p)) for p in ds.paths):
        ranges, scanned = [(s, min(n, s + step)) for s in range(0, n, step)], n
    else:
        piece = min(1 << 20, n)
        k = min(256, max(1, n // piece))
        starts = np.unique(np.linspace(0, n - piece, k).astype(np.int64))
        ranges, scanned = [(int(s), int(s) + piece) for s in starts], len(starts) * piece
    mx = None
    for a, b in ranges:
        t = ds.tokens(a, b)
        if len(t):
            m = int(t.max())
            mx = m if mx is None or m > mx else mx
    out: Dict[str, Any] = {"max_token_id": mx, "max_token_id_tokens_scanned": scanned}
    warn: List[str] = []
    if mx is not None:
        dt = np.dtype(ds.dtype)
        if dt.kind in "iu" and mx == int(np.iinfo(dt).max):
            wider = {"uint8": "uint16", "uint16": "uint32"}.get(dt.name, "a wider dtype")
            if ds.format == "raw":  # the dtype is the one passed, not one the file records
                warn.append(f"the maximum token id {mx:,} is the largest {dt.name} value: the file may hold wider "
                            f"ids than --dtype {dt.name} reads (read as {dt.name}, {wider} data never shows an id "
                            f"above {mx:,}); check --dtype, or the data was cut when written (more than "
                            f"{mx + 1:,} ids need {wider})")
            else:
                warn.append(f"the maximum token id {mx:,} is the largest {dt.name} value: ids from a vocabulary "
                            f"wider than {dt.name} may have been cut when the data was written (more than "
                            f"{mx + 1:,} ids need {wider})")
        if ds.vocab_size is not None and mx >= ds.vocab_size:
            warn.append(f"the maximum token id {mx:,} is >= vocab_size {ds.vocab_size:,}: an embedding of "
                        f"vocab_size rows would fail on it (wrong --dtype, or wrong --vocab-size when converted?)")
    if ds.format == "raw" and not any(is_url(str(p)) for p in ds.paths):
        why = dtype_mismatch(ds)
        if why is not None:
            warn.append(why)
    out["warnings"] = warn
    return out


def _packing(ds: Any, L: int, packing: str, starts: np.ndarray, lens: np.ndarray, sampled: bool) -> Dict[str, Any]:
    """How one epoch packs: the library's own statistics, plus concat-only extras measured here."""
    from ..engine._loader import Loader

    try:  # builds the order only: no threads start until the first batch
        loader = Loader(ds, seq_len=L, batch_size=1, shuffle=False, rank=0, world_size=1, output="numpy",
                        packing=cast(Any, packing))  # argparse's choices: one of the row's names
    except (ValueError, NotImplementedError) as e:
        raise CLIError(f"--seq-len {L} --packing {packing}: {e}") from None
    T = ds.num_tokens
    n_samples = int(loader.num_samples)
    pk: Dict[str, Any] = {"mode": packing, "seq_len": L, "samples_per_epoch": n_samples, "sampled": sampled}
    nz = lens > 0
    if hasattr(loader, "packing_stats"):
        st = loader.packing_stats()
        docs = max(1, int(st["documents"]))
        pk.update(tokens_used=T - int(st["tokens_dropped"]), tokens_dropped=int(st["tokens_dropped"]),
                  pad_tokens=int(st["pad_tokens"]), padding_fraction=float(st["padding_fraction"]),
                  documents_split=int(st["documents_split"]) / docs,
                  documents_truncated=int(st["documents_truncated"]) / docs, stats=st)
    else:  # concat only: sample i holds tokens [i*L, i*L + L + 1)
        s, end = starts[nz], starts[nz] + lens[nz]
        split = (s // L) != ((end - 1) // L)
        used = n_samples * L + 1
        pk.update(tokens_used=used, tokens_dropped=T - used, pad_tokens=0, padding_fraction=0.0,
                  documents_split=float(split.mean()) if len(split) else 0.0, documents_truncated=None)
    pk["efficiency"] = pk["tokens_used"] / T if T else 0.0
    pk["documents_longer_than_seq_len"] = float((lens[nz] > L).mean()) if nz.any() else 0.0
    if packing == "concat":
        s = starts[nz]
        scale = ds.num_documents / max(1, len(lens))
        # each sample touches its first document plus every document starting inside its inputs
        pk["mean_documents_per_sample"] = 1.0 + float(((s % L) != 0).sum() * scale) / n_samples
        pk["samples_starting_at_document_start"] = (None if sampled else
                                                   float(len(np.unique(s[(s % L) == 0] // L))) / n_samples)
    loader.close()
    return pk


def _print_inspect(info: Dict[str, Any]) -> None:
    vocab = info["vocab_size"] if info["vocab_size"] is not None else "unknown (not recorded by this format)"
    p = info["path"]
    print(f"path          {p if isinstance(p, str) else ', '.join(p)}")
    print(f"format        {info['format']}")
    print(f"tokens        {info['num_tokens']:,}")
    print(f"documents     {info['num_documents']:,}")
    print(f"dtype         {info['dtype']}")
    print(f"vocab_size    {vocab}")
    if info.get("max_token_id") is not None:
        part = info["max_token_id_tokens_scanned"] < info["num_tokens"]
        print(f"max token id  {info['max_token_id']:,}"
              + (f" (over {info['max_token_id_tokens_scanned']:,} evenly spaced tokens)" if part else ""))
    for w in info.get("warnings", []):
        print(f"warning: {cli_words(w)}", file=sys.stderr)
    print(f"fingerprint   {info['fingerprint']}")
    files = info["files"]
    comp = sum(1 for f in files if f["compressed"])
    print(f"files         {len(files)}" + (f" ({comp} zstd-compressed)" if comp else ""))
    show = files if len(files) <= 12 else files[:5] + [None] + files[-5:]
    for f in show:
        if f is None:
            print(f"  ... {len(files) - 10} more")
            continue
        size = os.path.getsize(f["path"]) if os.path.exists(f["path"]) else None
        extra = f", {_human(size)}B on disk" if size is not None else ""
        # a merged dataset's shards live in part directories: show the path inside the dataset
        name = os.path.relpath(f["path"], p) if isinstance(p, str) and os.path.isdir(p) else None
        print(f"  {name or os.path.basename(f['path']) or f['path']}  {f['num_tokens']:,} tokens, "
              f"{f['num_documents']:,} documents{', zstd' if f['compressed'] else ''}{extra}")
    dl = info.get("document_length")
    if dl:
        what = f" (estimated from a sample of {dl['documents_measured']:,})" if dl["sampled"] else ""
        print(f"\ndocument length{what}: min {dl['min']:,}, median {dl['median']:,.0f}, mean {dl['mean']:,.1f}, "
              f"p99 {dl['p99']:,.0f}, max {dl['max']:,}" + (f", {dl['empty']:,} empty" if dl["empty"] else ""))
        hist = dl["histogram"]
        top = max(h["documents"] for h in hist) or 1
        width = 40
        for h in hist:
            label = "0" if h["max"] == 0 else (f"{h['min']}" if h["min"] == h["max"] else f"{h['min']}-{h['max']}")
            bar = "#" * max(1 if h["documents"] else 0, round(width * h["documents"] / top))
            print(f"  {label:>15} | {bar:<{width}} {h['documents']:,}")
    pk = info.get("packing")
    if pk:
        print(f"\npacking ({pk['mode']}, seq_len {pk['seq_len']}){' (estimated from a sample)' if pk['sampled'] else ''}:")
        print(f"  samples per epoch                {pk['samples_per_epoch']:,}")
        print(f"  tokens used                      {pk['tokens_used']:,} of {info['num_tokens']:,} "
              f"({pk['efficiency'] * 100:.2f}%)")
        print(f"  tokens dropped                   {pk['tokens_dropped']:,}"
              + (" (the tail of the stream)" if pk["mode"] == "concat" else ""))
        print(f"  padding                          {pk['pad_tokens']:,} tokens ({pk['padding_fraction'] * 100:.2f}%)")
        print(f"  documents split across samples   {pk['documents_split'] * 100:.1f}%"
              f" ({pk['documents_longer_than_seq_len'] * 100:.1f}% are longer than seq_len)")
        if pk.get("documents_truncated") is not None:
            print(f"  documents truncated              {pk['documents_truncated'] * 100:.1f}%")
        if pk.get("samples_starting_at_document_start") is not None:
            print(f"  samples starting at a document   {pk['samples_starting_at_document_start'] * 100:.1f}%")
        if "mean_documents_per_sample" in pk:
            print(f"  documents per sample (mean)      {pk['mean_documents_per_sample']:.2f}")


def cmd_inspect(a: argparse.Namespace) -> int:
    from ..sources._dataset import open as tf_open

    if a.seq_len is not None and a.seq_len < 1:
        raise CLIError("--seq-len must be >= 1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataWarning)  # inspect reports it among its own warnings
        ds = tf_open(a.path, dtype=a.dtype, format=a.format)
    info = _inspect(ds, a.seq_len, a.max_docs, a.packing)
    if a.json:
        print(json.dumps(info, indent=2))
    else:
        _print_inspect(info)
    return 0


def add_parser(sub: Any) -> None:
    i = sub.add_parser("inspect", help="show format, counts, dtype, files, document lengths and packing",
                       description="Describe a dataset: format detected, token and document counts, dtype, "
                                   "vocabulary, files, a document-length histogram (log2 buckets), the packing "
                                   "for --seq-len, and the fingerprint that loader states are tied to.")
    i.add_argument("path", nargs="+", metavar="PATH", help="dataset directory, shard, Megatron prefix, llm.c/.npy/raw file(s); local, or "
                        "a URL (s3://, gs://, az://, https://) read through the node's cache (docs/remote.md)")
    _source_options(i)
    i.add_argument("--seq-len", type=int, default=None,
                   help="show how packing cuts the data at this sequence length: samples, tokens dropped, padding, documents split")
    i.add_argument("--packing", choices=["concat", "best_fit", "document"], default="concat",
                   help="packing mode for --seq-len (default: concat); see docs/packing.md")
    i.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    i.add_argument("--max-docs", type=int, default=20_000_000,
                   help="measure at most this many documents (a uniform sample beyond; default 20M)")
    i.set_defaults(func=cmd_inspect)
