"""The ``tokenfeed`` command line: convert, inspect, verify, bench.

::

    tokenfeed convert corpus/*.jsonl data/train --tokenizer tokenizer.json
    tokenfeed convert megatron/my_text_document data/train --compression zstd
    tokenfeed inspect data/train --seq-len 2048
    tokenfeed verify data/train

Each subcommand has ``--help``. Errors (bad input, missing files, bad options) print
one line on stderr and exit with status 1; ``--debug`` shows the traceback instead.

How ``convert`` from text works (and what ``--resume`` does)
-------------------------------------------------------------
The inputs are cut into *chunks*: byte ranges of about ``--chunk-mb`` MiB of a JSONL
file (cut at line ends), one row group of a Parquet file, or one plain-text file.
Worker processes tokenize chunks in parallel; each finished chunk is written as a
small native dataset under ``OUT/.tokenfeed-convert/`` (atomically, with a ``done``
marker last). When every chunk is done, the chunks are concatenated *in input order*
into ``OUT`` with :class:`tokenfeed.DatasetWriter`, whose manifest is written last, and
the work directory is removed. So the output does not depend on ``--workers``, and
until the very end ``OUT`` holds no manifest: a run that dies leaves nothing that
``tokenfeed.open`` accepts.

``--resume`` re-runs a conversion that died: it checks that the inputs (path, size,
modification time), the tokenizer file and every option that changes the tokens are
the same as recorded in ``OUT/.tokenfeed-convert/plan.json`` (and refuses otherwise),
keeps every chunk that has its ``done`` marker, tokenizes only the others, and then
writes ``OUT`` from all chunks again (a sequential copy, fast next to tokenizing).
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import math
import multiprocessing
import os
import shutil
import sys
import time
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

__all__ = ["main"]

PROG = "tokenfeed"
WORK_DIR = ".tokenfeed-convert"
PLAN_VERSION = 1
EOD_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>")
TEXT_EXTS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".parquet": "parquet", ".txt": "text",
             ".text": "text", ".md": "text"}


class CLIError(Exception):
    """A problem the user can fix; printed as one line, exit status 1."""


# --------------------------------------------------------------------------- helpers


def _progress(desc: str, unit: str, enabled: Optional[bool]) -> Callable[[int, int], None]:
    from ._progress import Progress

    return Progress(desc, unit=unit, enabled=enabled)


def _note(msg: str) -> None:
    print(f"{PROG}: note: {msg}", file=sys.stderr)


def _human(n: float) -> str:
    from ._progress import _human as h

    return h(n)


# --------------------------------------------------------------------------- convert: text


class Chunk(NamedTuple):
    """One unit of tokenizing work: a byte range of a JSONL file, a Parquet row group or a text file."""
    seq: int          # position in the output order
    path: str
    kind: str         # "jsonl", "jsonl.gz", "parquet", "text"
    start: int        # byte offset (jsonl) or row group (parquet)
    stop: int
    weight: int       # bytes, for the progress bar


class Settings(NamedTuple):
    tokenizer: str
    text_field: str
    eod_id: Optional[int]
    add_special_tokens: bool
    paragraphs: bool
    utf8_errors: str
    vocab_size: int
    batch_docs: int


def _input_kind(path: str, forced: Optional[str]) -> str:
    name = path[:-3] if path.endswith(".gz") else path
    gz = path.endswith(".gz")
    if forced:
        kind = forced
    else:
        ext = os.path.splitext(name)[1].lower()
        if ext not in TEXT_EXTS:
            raise CLIError(f"{path}: cannot tell the input format from the extension {ext or '(none)'!r}: "
                           f"pass --input-format jsonl, parquet or text")
        kind = TEXT_EXTS[ext]
    if gz and kind == "parquet":
        raise CLIError(f"{path}: a gzip-compressed Parquet file is not supported; Parquet compresses internally")
    return kind + (".gz" if gz else "")


def _expand_inputs(inputs: Sequence[str], forced: Optional[str]) -> List[str]:
    out: List[str] = []
    for p in inputs:
        if os.path.isdir(p):
            found = []
            for root, dirs, files in os.walk(p):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for f in sorted(files):
                    base = f[:-3] if f.endswith(".gz") else f
                    if forced or os.path.splitext(base)[1].lower() in TEXT_EXTS:
                        found.append(os.path.join(root, f))
            if not found:
                raise CLIError(f"{p}: no .jsonl/.json/.parquet/.txt files in this directory")
            out.extend(found)
        elif os.path.exists(p):
            out.append(p)
        else:
            raise CLIError(f"{p}: no such file or directory")
    return out


def _plan_chunks(paths: Sequence[str], forced: Optional[str], chunk_bytes: int) -> List[Chunk]:
    chunks: List[Chunk] = []
    for path in paths:
        kind = _input_kind(path, forced)
        size = os.path.getsize(path)
        if kind == "jsonl":
            n = max(1, math.ceil(size / chunk_bytes))
            step = math.ceil(size / n) if size else 0
            for k in range(n):
                a, b = k * step, min(size, (k + 1) * step)
                if a < b or (k == 0 and size == 0):
                    chunks.append(Chunk(len(chunks), path, kind, a, b, b - a))
        elif kind == "parquet":
            pq = _pyarrow_parquet()
            md = pq.ParquetFile(path).metadata
            rows = max(1, md.num_rows)
            for g in range(md.num_row_groups):
                w = size * md.row_group(g).num_rows // rows
                chunks.append(Chunk(len(chunks), path, kind, g, g + 1, w))
        else:  # text, text.gz, jsonl.gz: one chunk per file (gzip cannot seek)
            chunks.append(Chunk(len(chunks), path, kind, 0, size, size))
    return chunks


def _pyarrow_parquet() -> Any:
    try:
        import pyarrow.parquet as pq  # type: ignore[import-untyped, import-not-found, unused-ignore]
    except ImportError:
        raise CLIError("reading Parquet needs pyarrow: pip install pyarrow") from None
    return pq


def _load_tokenizer(path: str) -> Any:
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise CLIError("converting text needs the Hugging Face tokenizers library: pip install tokenizers") from None
    if not os.path.isfile(path):
        raise CLIError(f"{path}: no such tokenizer file (give the path of a tokenizer.json)")
    try:
        return Tokenizer.from_file(path)
    except Exception as e:  # the Rust side raises a plain Exception
        raise CLIError(f"{path}: not a Hugging Face tokenizers file: {e}") from None


def _decode(raw: bytes, where: str, errors: str) -> str:
    try:
        return raw.decode("utf-8", errors=errors)
    except UnicodeDecodeError as e:
        raise CLIError(f"{where}: invalid UTF-8 at byte {e.start}: {e.reason}; "
                       f"pass --utf8-errors replace to substitute U+FFFD") from None


def _jsonl_texts(chunk: Chunk, field: str, errors: str) -> Iterator[Optional[str]]:
    """Texts of the lines that *start* inside [chunk.start, chunk.stop)."""
    opener: Callable[..., Any] = gzip.open if chunk.kind.endswith(".gz") else io.open
    with opener(chunk.path, "rb") as f:
        pos = chunk.start
        if pos > 0 and not chunk.kind.endswith(".gz"):
            f.seek(pos - 1)
            pos = pos - 1 + len(f.readline())  # skip the line that began in the previous chunk
        gz = chunk.kind.endswith(".gz")
        while gz or pos < chunk.stop:
            line = f.readline()
            if not line:
                break
            where = f"{chunk.path}: line starting at byte {pos}"
            pos += len(line)
            s = line.strip()
            if not s:
                continue
            try:
                obj = json.loads(s)
            except ValueError as e:
                raise CLIError(f"{where}: not valid JSON ({e})") from None
            if not isinstance(obj, dict):
                raise CLIError(f"{where}: expected a JSON object per line, got {type(obj).__name__}")
            if field not in obj:
                raise CLIError(f"{where}: no field {field!r} (fields: {', '.join(map(str, obj)) or 'none'}); "
                               f"choose one with --text-field")
            text = obj[field]
            if text is None:
                yield None
                continue
            if not isinstance(text, str):
                raise CLIError(f"{where}: field {field!r} is {type(text).__name__}, not a string")
            yield text


def _parquet_texts(chunk: Chunk, field: str) -> Iterator[Optional[str]]:
    pq = _pyarrow_parquet()
    pf = pq.ParquetFile(chunk.path)
    names = pf.schema_arrow.names
    if field not in names:
        raise CLIError(f"{chunk.path}: no column {field!r} (columns: {', '.join(names)}); choose one with --text-field")
    col = pf.read_row_group(chunk.start, columns=[field]).column(0)
    for v in col.to_pylist():
        if v is not None and not isinstance(v, str):
            v = v.decode("utf-8") if isinstance(v, bytes) else str(v)
        yield v


def _text_texts(chunk: Chunk, paragraphs: bool, errors: str) -> Iterator[Optional[str]]:
    opener: Callable[..., Any] = gzip.open if chunk.kind.endswith(".gz") else io.open
    with opener(chunk.path, "rb") as f:
        text = _decode(f.read(), chunk.path, errors)
    if not paragraphs:
        yield text
        return
    para: List[str] = []
    for line in text.splitlines(keepends=True):
        if line.strip():
            para.append(line)
        elif para:
            yield "".join(para).rstrip("\n")
            para = []
    if para:
        yield "".join(para).rstrip("\n")


def _chunk_texts(chunk: Chunk, s: Settings) -> Iterator[Optional[str]]:
    if chunk.kind.startswith("jsonl"):
        return _jsonl_texts(chunk, s.text_field, s.utf8_errors)
    if chunk.kind == "parquet":
        return _parquet_texts(chunk, s.text_field)
    return _text_texts(chunk, s.paragraphs, s.utf8_errors)


_WORKER: Dict[str, Any] = {}


def _worker_init(settings: Settings) -> None:
    # one worker per core: the tokenizer's own thread pool would oversubscribe
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _WORKER["settings"] = settings
    _WORKER["tokenizer"] = _load_tokenizer(settings.tokenizer)


def _part_dir(work: str, index: int) -> str:
    return os.path.join(work, f"part-{index:06d}")


def _tokenize_chunk(args: Tuple[Chunk, str]) -> Tuple[int, int, int, int, int]:
    """Worker: tokenize one chunk into its own small dataset. Returns (index, weight, docs, tokens, skipped)."""
    chunk, work = args
    from ._dataset import DatasetWriter

    s: Settings = _WORKER["settings"]
    tok = _WORKER["tokenizer"]
    out = _part_dir(work, chunk.seq)
    if os.path.exists(out):
        shutil.rmtree(out)  # an unfinished attempt
    docs = tokens = skipped = 0
    eod = None if s.eod_id is None else np.array([s.eod_id], dtype=np.uint32)
    try:
        with DatasetWriter(out, vocab_size=s.vocab_size, shard_tokens=1 << 62) as w:
            batch: List[str] = []

            def flush() -> None:
                nonlocal docs, tokens
                for enc in tok.encode_batch(batch, add_special_tokens=s.add_special_tokens):
                    ids = np.asarray(enc.ids, dtype=np.uint32)
                    if eod is not None:
                        ids = np.concatenate([ids, eod])
                    w.add_document(ids)
                    docs += 1
                    tokens += len(ids)
                batch.clear()

            for text in _chunk_texts(chunk, s):
                if text is None or not text.strip():
                    skipped += 1
                    continue
                batch.append(text)
                if len(batch) >= s.batch_docs:
                    flush()
            if batch:
                flush()
    except ValueError as e:  # an id >= vocab_size (e.g. --vocab-size too small)
        raise CLIError(f"{chunk.path}: {e}") from None
    with open(os.path.join(out, "done.tmp"), "w") as f:
        json.dump({"documents": docs, "tokens": tokens, "skipped": skipped}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(os.path.join(out, "done.tmp"), os.path.join(out, "done"))
    return chunk.seq, chunk.weight, docs, tokens, skipped


def _chunk_bytes(a: argparse.Namespace) -> int:
    return max(4096, int(a.chunk_mb * (1 << 20)))


def _file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _default_eod(tok: Any) -> Optional[Tuple[str, int]]:
    for t in EOD_CANDIDATES:
        i = tok.token_to_id(t)
        if i is not None:
            return t, int(i)
    return None


def _clean_orphans(out: str) -> None:
    """Remove shards and temporary files a killed writer left in ``out`` (only when it has no manifest)."""
    if not os.path.isdir(out) or os.path.exists(os.path.join(out, "tokenfeed.manifest")):
        return
    for name in os.listdir(out):
        if (name.startswith("shard-") and name.endswith(".tfs")) or (name.startswith(".") and name.endswith(".tmp")):
            os.unlink(os.path.join(out, name))


def _convert_text(a: argparse.Namespace) -> int:
    tok = _load_tokenizer(a.tokenizer)
    tok_vocab = int(tok.get_vocab_size(with_added_tokens=True))
    vocab = a.vocab_size or tok_vocab
    if vocab < tok_vocab:
        _note(f"--vocab-size {vocab} is smaller than the tokenizer's {tok_vocab}: any larger id will be refused")
    if a.no_eod:
        eod: Optional[int] = None
    elif a.eod_id is not None:
        eod = a.eod_id
    else:
        found = _default_eod(tok)
        if found is None:
            raise CLIError(f"{a.tokenizer}: no end-of-document token ({', '.join(EOD_CANDIDATES)}) in this "
                           f"tokenizer: give one with --eod-id ID, or pass --no-eod to separate nothing")
        _note(f"appending {found[0]!r} (id {found[1]}) after every document")
        eod = found[1]
    if eod is not None and not 0 <= eod < vocab:
        raise CLIError(f"--eod-id {eod} is outside the vocabulary [0, {vocab})")
    dtype = "uint8" if vocab <= 1 << 8 else "uint16" if vocab <= 1 << 16 else "uint32"

    paths = _expand_inputs(a.inputs, a.input_format)
    out = a.out
    work = os.path.join(out, WORK_DIR)
    manifest = os.path.join(out, "tokenfeed.manifest")
    if os.path.exists(manifest) and not a.overwrite:
        raise CLIError(f"{out}: a tokenfeed dataset already exists here; pass --overwrite to replace it")
    settings = Settings(os.path.abspath(a.tokenizer), a.text_field, eod, a.add_special_tokens, a.paragraphs,
                        a.utf8_errors, vocab, a.batch_docs)
    plan = {
        "version": PLAN_VERSION,
        "inputs": [{"path": os.path.abspath(p), "size": os.path.getsize(p), "mtime_ns": os.stat(p).st_mtime_ns}
                   for p in paths],
        "tokenizer_sha256": _file_sha256(a.tokenizer),
        "text_field": a.text_field, "eod_id": eod, "add_special_tokens": a.add_special_tokens,
        "paragraphs": a.paragraphs, "utf8_errors": a.utf8_errors, "vocab_size": vocab,
        "input_format": a.input_format, "chunk_bytes": _chunk_bytes(a),
    }
    plan_path = os.path.join(work, "plan.json")
    if os.path.exists(work):
        if a.resume and os.path.exists(plan_path):
            with open(plan_path) as f:
                old = json.load(f)
            changed = [k for k in sorted(set(old) | set(plan)) if old.get(k) != plan.get(k)]
            if changed:
                raise CLIError(f"{work}: cannot resume: {', '.join(changed)} changed since the interrupted run; "
                               f"run with --overwrite instead of --resume to start over")
        elif a.resume or a.overwrite:
            shutil.rmtree(work)
        else:
            raise CLIError(f"{out}: holds an unfinished conversion ({WORK_DIR}); pass --resume to continue it "
                           f"or --overwrite to start over")
    elif a.resume:
        _note(f"nothing to resume in {out}: starting a new conversion")
    os.makedirs(work, exist_ok=True)
    if not os.path.exists(plan_path):
        with open(plan_path + ".tmp", "w") as f:
            json.dump(plan, f, indent=1)
        os.replace(plan_path + ".tmp", plan_path)

    chunks = _plan_chunks(paths, a.input_format, _chunk_bytes(a))
    done = {c.seq for c in chunks if os.path.exists(os.path.join(_part_dir(work, c.seq), "done"))}
    todo = [c for c in chunks if c.seq not in done]
    total_w = sum(c.weight for c in chunks) or 1
    done_w = sum(c.weight for c in chunks if c.seq in done)
    if done:
        _note(f"resuming: {len(done)} of {len(chunks)} chunks already tokenized, {len(todo)} to go")
    t0 = time.monotonic()
    bar = _progress("tokenize", "B", a.progress)
    bar(done_w, total_w)
    workers = max(1, min(a.workers or os.cpu_count() or 1, len(todo) or 1))
    if todo:
        jobs = [(c, work) for c in todo]
        if workers == 1:
            _worker_init(settings)
            results: Iterator[Tuple[int, int, int, int, int]] = map(_tokenize_chunk, jobs)
            pool = None
        else:
            # spawn: the tokenizer's Rust thread pool does not survive fork, and neither would our threads
            ctx = multiprocessing.get_context("spawn")
            pool = ctx.Pool(workers, initializer=_worker_init, initargs=(settings,))
            results = pool.imap_unordered(_tokenize_chunk, jobs)
        try:
            for _, weight, _, _, _ in results:
                done_w += weight
                bar(done_w, total_w)
        finally:
            if pool is not None:
                pool.terminate()
                pool.join()
    getattr(bar, "close")()

    # concatenate the parts in input order; the manifest is written last
    from ._dataset import DatasetWriter, open as tf_open

    skipped = 0
    parts: List[Tuple[str, int]] = []
    for c in chunks:
        d = _part_dir(work, c.seq)
        with open(os.path.join(d, "done")) as f:
            meta = json.load(f)
        skipped += meta["skipped"]
        if meta["documents"]:
            parts.append((d, meta["tokens"]))
    total_tokens = sum(t for _, t in parts)
    if not parts:
        raise CLIError("no documents found in the inputs (every text was empty or missing)")
    _clean_orphans(out)
    bar = _progress("write", " tokens", a.progress)
    written = 0
    with DatasetWriter(out, vocab_size=vocab, dtype=dtype, shard_tokens=a.shard_tokens, compression=a.compression,
                       level=a.level, overwrite=a.overwrite) as w:
        for d, _ in parts:
            ds = tf_open(d)
            for i in range(ds.num_documents):
                doc = ds.document(i)
                w.add_document(doc)
                written += len(doc)
                if i % 1024 == 0:
                    bar(written, total_tokens)
        bar(written, total_tokens)
        n_docs = w.num_documents
    getattr(bar, "close")()
    shutil.rmtree(work, ignore_errors=True)
    dt = time.monotonic() - t0
    print(f"wrote {out}: {written:,} tokens, {n_docs:,} documents, dtype {dtype}, vocab_size {vocab}"
          f"{', zstd' if a.compression else ''} ({dt:.1f}s)")
    if skipped:
        _note(f"skipped {skipped:,} empty or missing texts")
    return 0


# --------------------------------------------------------------------------- convert: tokens


def _convert_tokens(a: argparse.Namespace) -> int:
    from ._dataset import DatasetWriter, open as tf_open

    for flag, v in (("--text-field", a.text_field != "text"), ("--eod-id", a.eod_id is not None),
                    ("--no-eod", a.no_eod), ("--paragraphs", a.paragraphs), ("--resume", a.resume)):
        if v:
            raise CLIError(f"{flag} applies to text input only (with --tokenizer); the inputs here are token files")
    for p in a.inputs:
        base = p[:-3] if p.endswith(".gz") else p
        if not a.format and os.path.splitext(base)[1].lower() in TEXT_EXTS:
            raise CLIError(f"{p} looks like text: give --tokenizer PATH (a tokenizer.json) to tokenize it")
    if os.path.abspath(a.out) in [os.path.abspath(p) for p in a.inputs]:
        raise CLIError(f"{a.out}: the output cannot be one of the inputs")
    ds = tf_open(a.inputs, dtype=a.dtype, format=a.format)
    vocab = a.vocab_size or ds.vocab_size
    if vocab is None:
        bar = _progress("scan max id", " tokens", a.progress)
        mx = 0
        step = 1 << 24
        for s in range(0, ds.num_tokens, step):
            t = ds.tokens(s, min(ds.num_tokens, s + step))
            if len(t):
                mx = max(mx, int(t.max()))
                if t.dtype.kind == "i" and int(t.min()) < 0:
                    raise CLIError(f"{a.inputs[0]}: negative token id {int(t.min())} near token {s}; "
                                   f"is --dtype right?")
            bar(min(ds.num_tokens, s + step), ds.num_tokens)
        getattr(bar, "close")()
        vocab = mx + 1
        _note(f"the input does not record its vocabulary size: using max id + 1 = {vocab}. "
              f"Pass --vocab-size (the tokenizer's vocabulary) to record the real one")
    if os.path.exists(os.path.join(a.out, WORK_DIR)):
        raise CLIError(f"{a.out}: holds an unfinished text conversion ({WORK_DIR}); remove it or convert elsewhere")
    bar = _progress("convert", " tokens", a.progress)
    t0 = time.monotonic()
    written = 0
    _clean_orphans(a.out)
    with DatasetWriter(a.out, vocab_size=int(vocab), shard_tokens=a.shard_tokens, compression=a.compression,
                       level=a.level, overwrite=a.overwrite) as w:
        dtype = w.dtype.name
        for i in range(ds.num_documents):
            doc = ds.document(i)
            w.add_document(doc)
            written += len(doc)
            if i % 1024 == 0:
                bar(written, ds.num_tokens)
        bar(written, ds.num_tokens)
    getattr(bar, "close")()
    print(f"wrote {a.out}: {written:,} tokens, {ds.num_documents:,} documents from {ds.format} "
          f"({ds.num_files} file(s)), dtype {dtype}, vocab_size {vocab}{', zstd' if a.compression else ''} "
          f"({time.monotonic() - t0:.1f}s)")
    return 0


def cmd_convert(a: argparse.Namespace) -> int:
    if len(a.inputs) < 1:
        raise CLIError("convert needs at least one INPUT and an OUT directory")
    if a.workers is not None and a.workers < 1:
        raise CLIError("--workers must be >= 1")
    if a.compression == "none":
        a.compression = None
    if a.compression == "zstd":
        from . import build_info

        if not build_info()["zstd"]["usable"]:
            raise CLIError("--compression zstd: this tokenfeed was built without zstd (install libzstd-dev and reinstall)")
    if a.tokenizer:
        if a.dtype or a.format:
            raise CLIError("--dtype and --format describe token inputs; with --tokenizer the inputs are text")
        return _convert_text(a)
    return _convert_tokens(a)


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
    if seq_len is not None:
        info["packing"] = _packing(ds, int(seq_len), packing, starts, lens, sampled)
    return info


def _packing(ds: Any, L: int, packing: str, starts: np.ndarray, lens: np.ndarray, sampled: bool) -> Dict[str, Any]:
    """How one epoch packs: the library's own statistics, plus concat-only extras measured here."""
    from ._loader import Loader

    try:  # builds the order only: no threads start until the first batch
        loader = Loader(ds, seq_len=L, batch_size=1, shuffle=False, rank=0, world_size=1, output="numpy",
                        packing=packing)
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
        print(f"  {os.path.basename(f['path']) or f['path']}  {f['num_tokens']:,} tokens, "
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
    from ._dataset import open as tf_open

    if a.seq_len is not None and a.seq_len < 1:
        raise CLIError("--seq-len must be >= 1")
    ds = tf_open(a.path, dtype=a.dtype, format=a.format)
    info = _inspect(ds, a.seq_len, a.max_docs, a.packing)
    if a.json:
        print(json.dumps(info, indent=2))
    else:
        _print_inspect(info)
    return 0


# --------------------------------------------------------------------------- verify


def cmd_verify(a: argparse.Namespace) -> int:
    from ._core import FormatError
    from ._dataset import open as tf_open

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


def _source_options(p: Any) -> None:
    p.add_argument("--dtype", help="token dtype of headerless files (uint16, uint32, int32, ...); "
                                   "required for raw token files (nanoGPT .bin, OLMo .npy-less, datatrove .ds)")
    p.add_argument("--format", choices=["tokenfeed", "megatron", "llm.c", "raw", "npy"],
                   help="input format (default: detected)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=PROG, description="Convert, inspect and verify token datasets for tokenfeed.",
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
            "--resume (text only) keeps the chunks an interrupted run finished; see 'python -m pydoc\n"
            "tokenfeed.cli' for exactly what it checks."),
        epilog=("examples:\n"
                "  tokenfeed convert corpus/ data/train --tokenizer tokenizer.json --text-field content\n"
                "  tokenfeed convert books/*.txt data/books --tokenizer tokenizer.json --paragraphs\n"
                "  tokenfeed convert gpt2_data/my_text_document data/train --compression zstd\n"
                "  tokenfeed convert fineweb_train_*.bin data/fineweb --vocab-size 50257\n"
                "  tokenfeed convert tokens.bin data/train --dtype uint16 --vocab-size 50304"))
    c.add_argument("paths", nargs="+", metavar="PATH", help="INPUT files or directories, then the OUT directory")
    g = c.add_argument_group("text input (with --tokenizer)")
    g.add_argument("--tokenizer", metavar="PATH", help="Hugging Face tokenizers file (tokenizer.json)")
    g.add_argument("--input-format", choices=["jsonl", "parquet", "text"],
                   help="input format (default: from the extension: .jsonl/.json/.ndjson, .parquet, .txt/.md)")
    g.add_argument("--text-field", default="text", help="JSONL field / Parquet column holding the text (default: text)")
    g.add_argument("--paragraphs", action="store_true",
                   help="plain text: one document per blank-line-separated paragraph (default: one per file)")
    g.add_argument("--eod-id", type=int, default=None,
                   help="id appended after every document (default: the tokenizer's "
                        + ", ".join(EOD_CANDIDATES) + ", whichever exists)")
    g.add_argument("--no-eod", action="store_true", help="append nothing after documents")
    g.add_argument("--add-special-tokens", action="store_true",
                   help="let the tokenizer's post-processor add its special tokens (e.g. a BOS) to each document")
    g.add_argument("--workers", type=int, default=None, help="tokenizer processes (default: number of cores)")
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
    o.add_argument("--level", type=int, default=3, help="zstd level (default: 3)")
    o.add_argument("--shard-tokens", type=int, default=1 << 28, help="tokens per shard (default: 2**28)")
    o.add_argument("--overwrite", action="store_true", help="replace a dataset (or unfinished conversion) in OUT")
    o.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar on stderr (default: when stderr is a terminal)")
    c.set_defaults(func=cmd_convert)

    i = sub.add_parser("inspect", help="show format, counts, dtype, files, document lengths and packing",
                       description="Describe a dataset: format detected, token and document counts, dtype, "
                                   "vocabulary, files, a document-length histogram (log2 buckets), the packing "
                                   "for --seq-len, and the fingerprint that loader states are tied to.")
    i.add_argument("path", nargs="+", metavar="PATH", help="dataset directory, shard, Megatron prefix, llm.c/.npy/raw file(s)")
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
    v.add_argument("path", nargs="+", metavar="PATH", help="dataset directory, shard, or any readable token file(s)")
    _source_options(v)
    v.add_argument("--threads", type=int, default=0, help="threads (default: number of cores)")
    v.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar on stderr (default: when stderr is a terminal)")
    v.set_defaults(func=cmd_verify)

    sub.add_parser("bench", add_help=False, help="benchmark the loader (see 'tokenfeed bench --help')")
    sub.add_parser("build-info", help="what this build has (zstd, io_uring, CUDA), what is usable here, how to get the rest",
                   description="Print what the C core was built with and what is usable on this machine; for a "
                               "library the build lacks, which package to install.").set_defaults(func=cmd_build_info)
    return ap


def cmd_build_info(a: argparse.Namespace) -> int:
    from ._build import report

    print(report())
    return 0


def _version() -> str:
    try:
        from . import __version__

        return __version__
    except Exception:
        return "unknown"


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``tokenfeed`` console script and ``python -m tokenfeed``. Returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    # bench forwards everything after its name to the benchmark package
    if "bench" in args:
        k = args.index("bench")
        if all(x.startswith("-") for x in args[:k]):
            return _run(lambda: cmd_bench(args[k + 1:]), debug)
    ap = build_parser()
    a = ap.parse_args(args)
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
    from ._core import FormatError

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
    except (CLIError, FormatError, OSError, ValueError, NotImplementedError) as e:
        if debug:
            raise
        msg = str(e)
        if isinstance(e, NotImplementedError):  # a feature this build lacks
            msg += f" ('{PROG} build-info' says what this build has and how to get the rest)"
        if isinstance(e, OSError) and e.strerror:  # drop the "[Errno N]" prefix
            msg = e.strerror
        if isinstance(e, OSError) and e.filename and str(e.filename) not in msg:
            msg = f"{e.filename}: {msg}"
        print(f"{PROG}: error: {msg}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
