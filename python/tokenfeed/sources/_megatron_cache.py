"""Megatron-core GPTDataset's index cache: finding one in a cache directory and mapping its arrays.

GPTDataset writes, into its ``path_to_cache``, four files per dataset and split, named after
the MD5 of its description: ``HASH-GPTDataset-SPLIT-description.txt`` (JSON: dataset_path,
num_samples, index_split, random_seed, sequence_length, ...), and ``-document_index.npy``,
``-sample_index.npy``, ``-shuffle_index.npy``. The arrays are mapped read-only
(``numpy.load(mmap_mode="r")``) and handed to the C order, which reads them in place.
"""
from __future__ import annotations

import glob
import json
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

PathLike = Any
_ARRAYS = ("document_index", "sample_index", "shuffle_index")
_SUFFIXES = ("description.txt",) + tuple(f"{a}.npy" for a in _ARRAYS)


def _description(base: str) -> Optional[Dict[str, Any]]:
    try:
        with open(base + "description.txt", encoding="utf-8") as f:
            d = json.load(f)
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) else None


def _bin_of(prefix: Any) -> Optional[str]:
    return os.path.realpath(str(prefix) + ".bin") if isinstance(prefix, str) else None


def resolve(cache: PathLike, *, split: str = "train", seq_len: Optional[int] = None,
            data_paths: Sequence[str] = ()) -> str:
    """The common start ``DIR/HASH-GPTDataset-SPLIT-`` of one cached GPTDataset's files.

    ``cache``: the cache directory (then the GPTDataset of ``split`` whose description names
    one of ``data_paths`` and ``seq_len``, when several are there), or any of the set's files
    (or their common start)."""
    path = os.fspath(cache)
    if os.path.isdir(path):
        bases = sorted(p[:-len("document_index.npy")]
                       for p in glob.glob(os.path.join(glob.escape(path), f"*-GPTDataset-{split}-document_index.npy")))
        if not bases:
            found = sorted({os.path.basename(p).split("-")[-2] for p in
                            glob.glob(os.path.join(glob.escape(path), "*-GPTDataset-*-document_index.npy"))})
            raise FileNotFoundError(
                f"{path}: no GPTDataset index cache of split {split!r} (files *-GPTDataset-{split}-document_index.npy)"
                + (f"; it holds the splits {', '.join(found)}" if found else
                   ": point megatron_cache at Megatron's path_to_cache (--data-cache-path), where GPTDataset wrote "
                   "its indices"))
        if len(bases) > 1:
            bases = _narrow(bases, seq_len, data_paths)
        if len(bases) > 1:
            lines = "\n".join(f"  {b}description.txt: {_summary(_description(b))}" for b in bases)
            raise ValueError(f"{path} holds {len(bases)} GPTDataset caches of split {split!r} for this data and "
                             f"seq_len; pass the path of one (its description.txt or any of its files):\n{lines}")
        return bases[0]
    for suffix in _SUFFIXES + ("",):
        if path.endswith(suffix) and (suffix or path.endswith("-")):
            base = path[:len(path) - len(suffix)]
            if os.path.exists(base + "document_index.npy"):
                return base
    raise FileNotFoundError(f"{path}: not a GPTDataset index cache: expected Megatron's cache directory, or one of "
                            f"its files HASH-GPTDataset-SPLIT-{{description.txt,document_index.npy,sample_index.npy,"
                            f"shuffle_index.npy}}")


def _narrow(bases: List[str], seq_len: Optional[int], data_paths: Sequence[str]) -> List[str]:
    """The caches whose description matches the data and seq_len (all of them when none does)."""
    data = {os.path.realpath(p) for p in data_paths}

    def fits(b: str) -> bool:
        d = _description(b) or {}
        if seq_len is not None and d.get("sequence_length") not in (None, seq_len):
            return False
        return not data or _bin_of(d.get("dataset_path")) in data
    kept = [b for b in bases if fits(b)]
    return kept or bases


def _summary(d: Optional[Dict[str, Any]]) -> str:
    if d is None:
        return "(no description)"
    keys = ("dataset_path", "num_samples", "random_seed", "sequence_length", "split")
    return ", ".join(f"{k}={d.get(k)!r}" for k in keys if k in d)


def load(base: str, *, seq_len: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The three arrays, mapped read-only; the description (when present) checked against seq_len."""
    d = _description(base)
    if d is not None:
        if d.get("class", "GPTDataset") != "GPTDataset":
            raise ValueError(f"{base}description.txt: a {d.get('class')} cache; this order reproduces GPTDataset's")
        want = d.get("sequence_length")
        if isinstance(want, int) and want != seq_len:
            raise ValueError(f"{base}description.txt: the cache was built with sequence_length {want}, the loader has "
                             f"seq_len={seq_len}: use seq_len={want} to continue that run")
    out = []
    for name in _ARRAYS:
        p = f"{base}{name}.npy"
        try:
            out.append(np.load(p, mmap_mode="r", allow_pickle=False))
        except (OSError, ValueError) as e:
            raise type(e)(f"{p}: {e}") from None
    doc, smp, shf = out
    return doc, smp, shf
