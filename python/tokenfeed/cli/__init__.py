"""The ``tokenfeed`` command line: convert, merge, inspect, verify, cache, bench, build-info.

::

    tokenfeed convert corpus/*.jsonl data/train --tokenizer tokenizer.json
    tokenfeed convert megatron/my_text_document data/train --compression zstd
    tokenfeed convert corpus/ data/train --tokenizer tokenizer.json --tasks 64 --workers 8
    tokenfeed merge data/train
    tokenfeed inspect data/train --seq-len 2048
    tokenfeed verify data/train
    tokenfeed verify s3://bucket/train/
    tokenfeed cache show
    tokenfeed bench --quick
    tokenfeed build-info

Each subcommand has ``--help``. Errors (bad input, missing files, bad options) print
one line on stderr and exit with status 1; ``--debug`` shows the traceback instead.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, cast

import numpy as np

from .. import _core
from ..sources._convert import convert
from ..common._extras import pip_hint
from ..sources._text import EOD_CANDIDATES, ConvertError
from ..common._warnings import DataWarning

__all__ = ["main"]

PROG = "tokenfeed"


class CLIError(Exception):
    """A problem the user can fix; printed as one line, exit status 1."""


def _human(n: float) -> str:
    from ..common._progress import _human as h

    return h(n)


def cmd_convert(a: argparse.Namespace) -> int:
    return convert(a)



# --------------------------------------------------------------------------- inspect


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


# --------------------------------------------------------------------------- merge


def cmd_merge(a: argparse.Namespace) -> int:
    from ..sources._parts import merge_parts, read_parts

    t0 = time.monotonic()
    n = len(read_parts(a.path))
    ds = merge_parts(a.path, overwrite=a.overwrite)
    print(f"merged {n} part(s) into {a.path}: {ds.num_tokens:,} tokens, {ds.num_documents:,} documents, "
          f"{ds.num_files} shard(s), dtype {ds.dtype.name}, vocab_size {ds.vocab_size}; fingerprint {ds.fingerprint} "
          f"({time.monotonic() - t0:.1f}s)")
    return 0


# --------------------------------------------------------------------------- verify


def cmd_verify(a: argparse.Namespace) -> int:
    from .._core import FormatError
    from ..sources._dataset import open as tf_open

    t0 = time.monotonic()
    ds = tf_open(a.path, dtype=a.dtype, format=a.format)  # errors here: the generic one-line report
    try:
        ds.verify(threads=a.threads, progress=a.progress)
    except (FormatError, OSError) as e:
        if a.debug:
            raise
        print(f"{PROG} verify: FAILED: {e}", file=sys.stderr)
        return 1
    vocab = f"all ids < {ds.vocab_size}" if ds.vocab_size else "vocab size unknown: ids not range-checked"
    print(f"OK  {ds.num_tokens:,} tokens, {ds.num_documents:,} documents, {ds.num_files} file(s) ({ds.format}); "
          f"{vocab}; fingerprint {ds.fingerprint} ({time.monotonic() - t0:.1f}s)")
    return 0


# --------------------------------------------------------------------------- bench


def cmd_bench(argv: List[str]) -> int:
    """Hand the arguments to the benchmark, a separate package (tokenfeed_bench) imported only here."""
    import importlib

    here = os.path.dirname(os.path.abspath(__file__))
    checkout = os.path.normpath(os.path.join(here, "..", "..", "benchmarks"))  # a source tree, not installed
    for attempt in (0, 1):
        try:
            bench = importlib.import_module("tokenfeed_bench")
            break
        except ModuleNotFoundError as e:
            if e.name != "tokenfeed_bench":
                raise  # the benchmark exists but needs something missing: show that, not "not available"
            if attempt == 0 and os.path.isdir(os.path.join(checkout, "tokenfeed_bench")):
                sys.path.insert(0, checkout)
                continue
            print(f"{PROG} bench: the benchmark package (tokenfeed_bench) is not available in this installation; "
                  "reinstall tokenfeed, or run python benchmarks/bench_tokens.py from a source checkout",
                  file=sys.stderr)
            return 2
    rc = bench.main(argv)
    return int(rc or 0)


# --------------------------------------------------------------------------- parser


def _progress_option(p: Any) -> None:
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar on stderr (default: when stderr is a terminal)")


def _source_options(p: Any) -> None:
    p.add_argument("--dtype", help="token dtype of headerless files (uint16, uint32, int32, ...); "
                                   "required for raw token files (nanoGPT .bin, OLMo .npy-less, datatrove .ds)")
    p.add_argument("--format", choices=list(_core.Dataset.formats()),  # the C library's format table
                   help="input format (default: detected)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=PROG, description="Convert, merge, inspect and verify token datasets for tokenfeed; show or prune "
                               "the node-local cache of remote datasets; benchmark the loader; say what this build has.",
        epilog="Run 'tokenfeed COMMAND --help' for each command's options. Docs: docs/quickstart.md")
    ap.add_argument("--debug", action="store_true", help="show Python tracebacks on errors")
    ap.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")

    c = sub.add_parser(
        "convert", usage="tokenfeed convert [options] INPUT [INPUT ...] OUT", help="tokenize text (JSONL, Parquet, plain text) or convert token files into a tokenfeed dataset",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Write a native tokenfeed dataset directory OUT.\n\n"
            "With --tokenizer: INPUTs are text (JSONL with one JSON object per line, Parquet, or plain text;\n"
            "directories are searched for such files; .gz is read for JSONL and text), tokenized in parallel\n"
            "processes with a Hugging Face tokenizers file, with an end-of-document id after every document.\n"
            "Without --tokenizer: INPUTs are token files tokenfeed can read (a tokenfeed dataset, a Megatron\n"
            "prefix, llm.c .bin shards, .npy, raw tokens with --dtype), concatenated in order, documents kept.\n\n"
            "The token dtype follows the vocabulary size: uint8 up to 256, uint16 up to 65536, else uint32.\n"
            "OUT has no manifest until the end, so an interrupted run leaves nothing that opens.\n"
            "--resume (text only) keeps the chunks an interrupted run finished; it refuses when the inputs\n"
            "(path, size, modification time), the tokenizer file or an option that changes the tokens differ."),
        epilog=("examples:\n"
                "  tokenfeed convert corpus/ data/train --tokenizer tokenizer.json --text-field content\n"
                "  tokenfeed convert books/*.txt data/books --tokenizer tokenizer.json --paragraphs\n"
                "  tokenfeed convert corpus/ data/train --tokenizer tokenizer.json --tasks 16 --workers 8\n"
                "  tokenfeed convert gpt2_data/my_text_document data/train --compression zstd\n"
                "  tokenfeed convert data/train data/train-zstd --compression zstd --block-tokens 4096\n"
                "  tokenfeed convert fineweb_train_*.bin data/fineweb --vocab-size 50257\n"
                "  tokenfeed convert tokens.bin data/train --dtype uint16 --vocab-size 50304"))
    c.add_argument("paths", nargs="+", metavar="PATH", help="INPUT files or directories, then the OUT directory")
    g = c.add_argument_group("text input (with --tokenizer)")
    g.add_argument("--tokenizer", metavar="PATH", help="Hugging Face tokenizers file (tokenizer.json)")
    g.add_argument("--input-format", choices=["jsonl", "parquet", "text"],
                   help="input format (default: from the extension: .jsonl/.json/.ndjson, .parquet, .txt/.md)")
    g.add_argument("--text-field", default="text", help="JSONL field / Parquet column holding the text (default: text)")
    g.add_argument("--meta", metavar="A,B", help="JSONL fields / Parquet columns kept as per-document metadata "
                                                 "columns beside the shards: url,lang,score (docs/views.md)")
    g.add_argument("--paragraphs", action="store_true",
                   help="plain text: one document per blank-line-separated paragraph (default: one per file)")
    g.add_argument("--eod-id", type=int, default=None,
                   help="id appended after every document (default: the tokenizer's "
                        + ", ".join(EOD_CANDIDATES) + ", whichever exists)")
    g.add_argument("--no-eod", action="store_true", help="append nothing after documents")
    g.add_argument("--add-special-tokens", action="store_true",
                   help="let the tokenizer's post-processor add its special tokens (e.g. a BOS) to each document")
    g.add_argument("--workers", type=int, default=None, help="tokenizer processes (default: number of cores)")
    g.add_argument("--tasks", type=int, default=None, metavar="N",
                   help="run the conversion as N datatrove tasks (part k = a contiguous share of the input), "
                        "--workers at a time on datatrove's local executor, then merge the parts without copying; "
                        "needs " + pip_hint("datatrove") + " (see docs/guides/cluster-conversion.md)")
    g.add_argument("--resume", action="store_true",
                   help="continue an interrupted conversion into OUT, keeping the chunks it finished")
    g.add_argument("--chunk-mb", type=float, default=64, help="JSONL bytes per work unit, in MiB (default: 64)")
    g.add_argument("--batch-docs", type=int, default=256, help=argparse.SUPPRESS)
    g.add_argument("--utf8-errors", choices=["strict", "replace", "ignore"], default="strict",
                   help="what to do with invalid UTF-8 in text files (default: strict, stop with an error)")
    t = c.add_argument_group("token input (without --tokenizer)")
    _source_options(t)
    o = c.add_argument_group("output")
    o.add_argument("--vocab-size", type=int, default=None,
                   help="vocabulary size to record (default: the tokenizer's, or the input's when it records one, "
                        "else max id + 1 with a note)")
    o.add_argument("--compression", choices=["none", "zstd"], default=None, help="compress token blocks with zstd")
    o.add_argument("--level", type=int, default=3,
                   help="zstd level (default: 3; up to 3, literals are stored raw where Huffman coding saves less "
                        "than a fifth, which decodes ~2x faster; 4 or more: zstd's own choice)")
    o.add_argument("--block-tokens", type=int, default=None, metavar="N",
                   help="tokens per zstd frame (default: 2048, suits a full shuffle at seq_len >= 1024; larger "
                        "blocks compress a little better and suit shuffle='block'; see docs/performance.md)")
    o.add_argument("--shard-tokens", type=int, default=1 << 28, help="tokens per shard (default: 2**28)")
    o.add_argument("--overwrite", action="store_true", help="replace a dataset (or unfinished conversion) in OUT")
    _progress_option(o)
    c.set_defaults(func=cmd_convert)

    m = sub.add_parser("merge", help="join the parts written by independent tasks into one dataset (no copy)",
                       description="Write PATH/tokenfeed.manifest naming the shards of every part under "
                                   "PATH/parts/ (written by tokenfeed.PartWriter or the datatrove step), part 0 "
                                   "first. Copies no token data. Refuses a missing part, a part twice, parts of "
                                   "runs with different part counts, and parts written with different settings.")
    m.add_argument("path", metavar="PATH", help="dataset directory holding parts/")
    m.add_argument("--overwrite", action="store_true",
                   help="replace a dataset in PATH that is not a merge of parts (a merge is always replaced)")
    m.set_defaults(func=cmd_merge)

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

    v = sub.add_parser("verify", help="check every checksum, document index and token id (< vocab size)",
                       description="Full verification on several threads. Prints OK and exits 0, or names the "
                                   "failing file and field and exits 1.")
    v.add_argument("path", nargs="+", metavar="PATH", help="dataset directory, shard, or any readable token file(s); local, or a URL (s3://, "
                        "gs://, az://, https://) whose chunks are fetched through the node's cache")
    _source_options(v)
    v.add_argument("--threads", type=int, default=0, help="threads (default: number of cores)")
    _progress_option(v)
    v.set_defaults(func=cmd_verify)

    from ._cache import add_parser as add_cache_parser

    add_cache_parser(sub)
    from ._explain import add_parsers as add_explain_parsers

    add_explain_parsers(sub)

    from ._index import add_parser as add_index_parser

    add_index_parser(sub)
    from ._meta import add_parser as add_meta_parser

    add_meta_parser(sub)
    sub.add_parser("bench", add_help=False, help="benchmark the loader (see 'tokenfeed bench --help')")
    sub.add_parser("build-info", help="what this build has (zstd, io_uring, CUDA), what is usable here, how to get the rest",
                   description="Print what the C core was built with and what is usable on this machine; for a "
                               "library the build lacks, which package to install.").set_defaults(func=cmd_build_info)
    return ap


def cmd_build_info(a: argparse.Namespace) -> int:
    from ..common._build import report

    print(report())
    return 0


def _version() -> str:
    try:
        from .. import __version__

        return __version__
    except Exception:
        return "unknown"


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``tokenfeed`` console script and ``python -m tokenfeed``. Returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args  # accepted before or after the command, for every command
    args = [x for x in args if x != "--debug"]
    # bench forwards everything after its name to the benchmark package
    if "bench" in args:
        k = args.index("bench")
        if all(x.startswith("-") for x in args[:k]):
            return _run(lambda: cmd_bench(args[k + 1:]), debug)
    ap = build_parser()
    a = ap.parse_args(args)
    a.debug = debug
    if a.command is None:
        ap.print_help()
        return 2
    if a.command == "convert":
        if len(a.paths) < 2:
            ap.parse_args(["convert", "--help"]) if not a.paths else None
            print(f"{PROG} convert: error: give at least one INPUT and the OUT directory", file=sys.stderr)
            return 2
        a.inputs, a.out = a.paths[:-1], a.paths[-1]
    return _run(lambda: a.func(a), debug)


def _run(fn: Callable[[], int], debug: bool) -> int:
    from .._core import FormatError

    try:
        return fn()
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `tokenfeed inspect ... | head`: stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except (CLIError, ConvertError, FormatError, OSError, ValueError, NotImplementedError, ImportError) as e:
        if debug:
            raise
        msg = str(e)
        if isinstance(e, NotImplementedError):  # a feature this build lacks
            msg += f" ('{PROG} build-info' says what this build has and how to get the rest)"
        if isinstance(e, OSError) and e.strerror:  # drop the "[Errno N]" prefix
            msg = e.strerror
        if isinstance(e, OSError) and e.filename and str(e.filename) not in msg:
            msg = f"{e.filename}: {msg}"
        print(f"{PROG}: error: {cli_words(msg)}", file=sys.stderr)
        return 1
    except Exception as e:  # anything else (a missing optional module, a bug): one line, the traceback on --debug
        if debug:
            raise
        print(f"{PROG}: error: {type(e).__name__}: {cli_words(str(e))} (rerun with --debug for the traceback)",
              file=sys.stderr)
        return 1


# Keyword arguments that the library's messages advise, and the command-line flag that
# does the same: a message shown by the CLI names what can be typed there.
_FLAGS = {"dtype": "--dtype", "format": "--format", "vocab_size": "--vocab-size", "block_tokens": "--block-tokens",
          "seq_len": "--seq-len", "packing": "--packing"}
_KW = re.compile(r"\b(" + "|".join(_FLAGS) + r")=(?:([\"'])([^\"']*)\2|(?=[\s).,;]|$))")


def cli_words(msg: str) -> str:
    """`msg` with library keywords (``dtype="uint16"``, ``pass dtype=``) as CLI flags (``--dtype uint16``)."""
    return _KW.sub(lambda m: _FLAGS[m.group(1)] + (f" {m.group(3)}" if m.group(2) else ""), msg)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
