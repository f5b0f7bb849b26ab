"""Text-to-token conversion: the pipeline behind ``tokenfeed convert``.

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
import errno
import json
import math
import multiprocessing
import os
import shutil
import sys
import time
import warnings
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from ..common._extras import pip_hint
from ..common._lock import RunLock
from ._text import (EOD_CANDIDATES, TEXT_EXTS, Chunk, ConvertError, Settings, chunk_records, chunk_texts,
                    default_eod, expand_inputs, file_sha256, load_tokenizer, plan_chunks)

__all__ = ["ConvertError", "convert"]

PROG = "tokenfeed"
WORK_DIR = ".tokenfeed-convert"
PLAN_VERSION = 1
#: held by a conversion for its whole run (tokenizing included): a second ``convert`` into
#: the same OUT is refused at once instead of deleting the first one's files
CONVERT_LOCK = ".tokenfeed-convert.lock"


# --------------------------------------------------------------------------- helpers


def _progress(desc: str, unit: str, enabled: Optional[bool]) -> Callable[[int, int], None]:
    from ..common._progress import Progress

    return Progress(desc, unit=unit, enabled=enabled)


def _note(msg: str) -> None:
    print(f"{PROG}: note: {msg}", file=sys.stderr)


# --------------------------------------------------------------------------- convert: text


_WORKER: Dict[str, Any] = {}


def _worker_init(settings: Settings) -> None:
    # one worker per core: the tokenizer's own thread pool would oversubscribe
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _WORKER["settings"] = settings
    _WORKER["tokenizer"] = load_tokenizer(settings.tokenizer)


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
            metas: List[Dict[str, Any]] = []

            def flush() -> None:
                nonlocal docs, tokens
                for k, enc in enumerate(tok.encode_batch(batch, add_special_tokens=s.add_special_tokens)):
                    ids = np.asarray(enc.ids, dtype=np.uint32)
                    if eod is not None:
                        ids = np.concatenate([ids, eod])
                    w.add_document(ids, meta=metas[k] if s.meta else None)
                    docs += 1
                    tokens += len(ids)
                batch.clear()
                metas.clear()

            for text, meta in chunk_records(chunk, s):
                if text is None or not text.strip():
                    skipped += 1
                    continue
                batch.append(text)
                metas.append(meta)
                if len(batch) >= s.batch_docs:
                    flush()
            if batch:
                flush()
    except ValueError as e:  # an id >= vocab_size (e.g. --vocab-size too small)
        raise ConvertError(f"{chunk.path}: {e}") from None
    with open(os.path.join(out, "done.tmp"), "w") as f:
        json.dump({"documents": docs, "tokens": tokens, "skipped": skipped}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(os.path.join(out, "done.tmp"), os.path.join(out, "done"))
    return chunk.seq, chunk.weight, docs, tokens, skipped


def _chunk_bytes(a: argparse.Namespace) -> int:
    return max(4096, int(a.chunk_mb * (1 << 20)))


def _lock_output(out: str) -> RunLock:
    """Take OUT's conversion lock (creating OUT), or raise ConvertError naming the run that holds it."""
    os.makedirs(out, exist_ok=True)
    try:
        return RunLock(out, CONVERT_LOCK, "this conversion")
    except OSError as e:
        if e.errno == errno.EBUSY:
            raise ConvertError(str(e.strerror)) from None
        raise


def _convert_text(a: argparse.Namespace) -> int:
    tok = load_tokenizer(a.tokenizer)
    tok_vocab = int(tok.get_vocab_size(with_added_tokens=True))
    vocab = a.vocab_size or tok_vocab
    if vocab < tok_vocab:
        _note(f"--vocab-size {vocab} is smaller than the tokenizer's {tok_vocab}: any larger id will be refused")
    if a.no_eod:
        eod: Optional[int] = None
    elif a.eod_id is not None:
        eod = a.eod_id
    else:
        found = default_eod(tok)
        if found is None:
            raise ConvertError(f"{a.tokenizer}: no end-of-document token ({', '.join(EOD_CANDIDATES)}) in this "
                           f"tokenizer: give one with --eod-id ID, or pass --no-eod to separate nothing")
        _note(f"appending {found[0]!r} (id {found[1]}) after every document")
        eod = found[1]
    if eod is not None and not 0 <= eod < vocab:
        raise ConvertError(f"--eod-id {eod} is outside the vocabulary [0, {vocab})")
    dtype = "uint8" if vocab <= 1 << 8 else "uint16" if vocab <= 1 << 16 else "uint32"

    paths = expand_inputs(a.inputs, a.input_format)
    with _lock_output(a.out):
        return _convert_text_locked(a, paths, vocab, eod, dtype)


def _convert_text_locked(a: argparse.Namespace, paths: List[str], vocab: int, eod: Optional[int], dtype: str) -> int:
    out = a.out
    work = os.path.join(out, WORK_DIR)
    manifest = os.path.join(out, "tokenfeed.manifest")
    if os.path.exists(manifest) and not a.overwrite:
        raise ConvertError(f"{out}: a tokenfeed dataset already exists here; pass --overwrite to replace it")
    meta = tuple(f for f in (getattr(a, "meta", None) or "").split(",") if f)
    settings = Settings(os.path.abspath(a.tokenizer), a.text_field, eod, a.add_special_tokens, a.paragraphs,
                        a.utf8_errors, vocab, a.batch_docs, meta)
    plan = {
        "version": PLAN_VERSION,
        "inputs": [{"path": os.path.abspath(p), "size": os.path.getsize(p), "mtime_ns": os.stat(p).st_mtime_ns}
                   for p in paths],
        "tokenizer_sha256": file_sha256(a.tokenizer),
        "text_field": a.text_field, "eod_id": eod, "add_special_tokens": a.add_special_tokens,
        "paragraphs": a.paragraphs, "utf8_errors": a.utf8_errors, "vocab_size": vocab,
        "input_format": a.input_format, "chunk_bytes": _chunk_bytes(a),
    }
    if meta:  # the parts hold these columns: a plan without them cannot resume
        plan["meta"] = list(meta)
    if a.tasks:  # parts merged at the end: the layout differs, so a plan of the other kind cannot resume
        plan["tasks"] = a.tasks
        plan["chunk_bytes"] = _task_chunk_bytes(a, paths)
    plan_path = os.path.join(work, "plan.json")
    if os.path.exists(work):
        if a.resume and os.path.exists(plan_path):
            with open(plan_path) as f:
                old = json.load(f)
            changed = [k for k in sorted(set(old) | set(plan)) if old.get(k) != plan.get(k)]
            if changed:
                raise ConvertError(f"{work}: cannot resume: {', '.join(changed)} changed since the interrupted run; "
                               f"run with --overwrite instead of --resume to start over")
        elif a.resume or a.overwrite:
            shutil.rmtree(work)
        else:
            raise ConvertError(f"{out}: holds an unfinished conversion ({WORK_DIR}); pass --resume to continue it "
                           f"or --overwrite to start over")
    elif a.resume:
        _note(f"nothing to resume in {out}: starting a new conversion")
    os.makedirs(work, exist_ok=True)
    if not os.path.exists(plan_path):
        with open(plan_path + ".tmp", "w") as f:
            json.dump(plan, f, indent=1)
        os.replace(plan_path + ".tmp", plan_path)

    if a.tasks:
        if meta:
            raise ConvertError("--meta is read by convert's own workers: run without --tasks, or attach the "
                               "columns afterwards (tokenfeed meta attach)")
        return _convert_text_tasks(a, paths, settings, plan["chunk_bytes"], dtype)
    chunks = plan_chunks(paths, a.input_format, _chunk_bytes(a))
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
        raise ConvertError("no documents found in the inputs (every text was empty or missing)")
    bar = _progress("write", " tokens", a.progress)
    written = 0
    with DatasetWriter(out, vocab_size=vocab, dtype=dtype, shard_tokens=a.shard_tokens, compression=a.compression,
                       level=a.level, block_tokens=a.block_tokens, overwrite=a.overwrite) as w:
        for d, _ in parts:
            ds = tf_open(d)
            rows = ds.columns().read_all() if settings.meta else {}
            for i in range(ds.num_documents):
                doc = ds.document(i)
                w.add_document(doc, meta={k: v[i] for k, v in rows.items()} if settings.meta else None)
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


# --------------------------------------------------------------------------- convert: text, as datatrove tasks


def _task_chunk_bytes(a: argparse.Namespace, paths: Sequence[str]) -> int:
    """JSONL bytes per chunk with --tasks: --chunk-mb, or finer so that every task gets about four chunks."""
    total = sum(os.path.getsize(p) for p in paths)
    return max(4096, min(_chunk_bytes(a), math.ceil(total / (4 * a.tasks)) if total else _chunk_bytes(a)))


def _convert_text_tasks(a: argparse.Namespace, paths: Sequence[str], settings: Settings, chunk_bytes: int,
                        dtype: str) -> int:
    """``--tasks N``: the inputs cut into chunks, task k of N tokenizes a contiguous run of them and writes
    part k (tokenfeed.integrations.datatrove), datatrove's local executor runs the tasks on --workers
    processes, and the parts are merged without copying. Same documents in the same order as without
    --tasks; a rerun with --resume redoes only the tasks datatrove did not record as complete."""
    try:
        from datatrove.executor import LocalPipelineExecutor  # type: ignore[import-untyped, unused-ignore]

        from ..integrations.datatrove import ConvertReader, TokenfeedWriter
    except ImportError as e:
        raise ConvertError(f"--tasks runs the conversion as datatrove tasks and needs datatrove ({e}): "
                           f"{pip_hint('datatrove')}") from None
    from ._parts import PARTS_DIR, merge_parts

    out = a.out
    work = os.path.join(out, WORK_DIR)
    parts_dir = os.path.join(out, PARTS_DIR)
    if os.path.isdir(parts_dir) and not (a.resume and os.path.isdir(os.path.join(work, "datatrove"))):
        if not a.overwrite and os.listdir(parts_dir):
            raise ConvertError(f"{parts_dir}: holds parts of another conversion; pass --overwrite to replace them")
        shutil.rmtree(parts_dir)
    chunks = plan_chunks(paths, a.input_format, chunk_bytes)
    workers = max(1, min(a.workers or os.cpu_count() or 1, a.tasks))
    # one tokenizer thread per task: tasks are the parallelism (as the worker processes without --tasks)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    t0 = time.monotonic()
    pipeline = [
        ConvertReader(chunks, settings),
        TokenfeedWriter(out, tokenizer=settings.tokenizer, vocab_size=settings.vocab_size, eod_id=settings.eod_id,
                        add_special_tokens=settings.add_special_tokens, batch_size=settings.batch_docs,
                        shard_tokens=a.shard_tokens, compression=a.compression, level=a.level,
                        block_tokens=a.block_tokens),
    ]
    executor = LocalPipelineExecutor(pipeline, tasks=a.tasks, workers=workers,
                                     logging_dir=os.path.join(work, "datatrove"))
    try:
        executor.run()
    except Exception as e:  # in a worker or (one worker) in this process
        what = str(e) if isinstance(e, ConvertError) else f"{type(e).__name__}: {e}"
        raise ConvertError(f"a conversion task failed: {what} (logs in {work}/datatrove/logs); "
                           f"fix the cause and run again with --resume: finished tasks are kept") from None
    incomplete = executor.get_incomplete_ranks()
    if incomplete:
        raise ConvertError(f"{len(incomplete)} of {a.tasks} tasks did not finish ({work}/datatrove); "
                           f"run again with --resume")
    ds = merge_parts(out, overwrite=a.overwrite)  # removes the shards of a dataset it replaces
    skipped = 0
    for p in _part_infos(out):
        skipped += int(p.get("counts", {}).get("skipped_empty", 0))
    shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {out}: {ds.num_tokens:,} tokens, {ds.num_documents:,} documents in {a.tasks} parts, dtype {dtype}, "
          f"vocab_size {settings.vocab_size}{', zstd' if a.compression else ''} ({time.monotonic() - t0:.1f}s)")
    if skipped:
        _note(f"skipped {skipped:,} empty or missing texts")
    return 0


def _part_infos(out: str) -> List[Dict[str, Any]]:
    from ._parts import read_parts

    return read_parts(out)


# --------------------------------------------------------------------------- convert: tokens


def _convert_tokens(a: argparse.Namespace) -> int:
    from ._dataset import DatasetWriter, open as tf_open

    for flag, v in (("--text-field", a.text_field != "text"), ("--eod-id", a.eod_id is not None),
                    ("--no-eod", a.no_eod), ("--paragraphs", a.paragraphs), ("--resume", a.resume)):
        if v:
            raise ConvertError(f"{flag} applies to text input only (with --tokenizer); the inputs here are token files")
    for p in a.inputs:
        base = p[:-3] if p.endswith(".gz") else p
        if not a.format and os.path.splitext(base)[1].lower() in TEXT_EXTS:
            raise ConvertError(f"{p} looks like text: give --tokenizer PATH (a tokenizer.json) to tokenize it")
    if os.path.abspath(a.out) in [os.path.abspath(p) for p in a.inputs]:
        raise ConvertError(f"{a.out}: the output cannot be one of the inputs")
    with _lock_output(a.out):
        return _convert_tokens_locked(a)


def _convert_tokens_locked(a: argparse.Namespace) -> int:
    from ._dataset import DatasetWriter, open as tf_open

    from ._dataset import dtype_mismatch
    from ..common._warnings import DataWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataWarning)  # said below, with the flag to change
        ds = tf_open(a.inputs, dtype=a.dtype, format=a.format)
    wrong = dtype_mismatch(ds) if a.dtype and ds.format == "raw" else None
    if wrong is not None:
        if a.vocab_size is None:
            raise ConvertError(f"--dtype {a.dtype}: {wrong}. (If --dtype {a.dtype} is right, give --vocab-size "
                               f"to convert anyway)")
        _note(f"--dtype {a.dtype}: {wrong}")
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
                    raise ConvertError(f"{a.inputs[0]}: negative token id {int(t.min())} near token {s}; "
                                   f"is --dtype right?")
            bar(min(ds.num_tokens, s + step), ds.num_tokens)
        getattr(bar, "close")()
        if a.dtype and mx >= 1 << 24:
            raise ConvertError(f"{a.inputs[0]}: read as --dtype {a.dtype}, the largest token id is {mx:,}, far above "
                               f"any vocabulary: is --dtype right? (give --vocab-size to convert anyway)")
        vocab = mx + 1
        _note(f"the input does not record its vocabulary size: using max id + 1 = {vocab}. "
              f"Pass --vocab-size (the tokenizer's vocabulary) to record the real one")
    if os.path.exists(os.path.join(a.out, WORK_DIR)):
        raise ConvertError(f"{a.out}: holds an unfinished text conversion ({WORK_DIR}); remove it or convert elsewhere")
    bar = _progress("convert", " tokens", a.progress)
    t0 = time.monotonic()
    written = 0
    with DatasetWriter(a.out, vocab_size=int(vocab), shard_tokens=a.shard_tokens, compression=a.compression,
                       level=a.level, block_tokens=a.block_tokens, overwrite=a.overwrite) as w:
        dtype = w.dtype.name
        for i in range(ds.num_documents):
            doc = ds.document(i)
            try:
                w.add_document(doc)
            except ValueError as e:  # an id >= vocab_size: a wrong --vocab-size, or tokens read with a wrong dtype
                hint = f" (read as --dtype {a.dtype}: is that the dtype the file was written with?)" if a.dtype else ""
                raise ConvertError(f"{ds.paths[0] if ds.num_files == 1 else a.inputs[0]}: {e}{hint}") from None
            written += len(doc)
            if i % 1024 == 0:
                bar(written, ds.num_tokens)
        bar(written, ds.num_tokens)
    getattr(bar, "close")()
    print(f"wrote {a.out}: {written:,} tokens, {ds.num_documents:,} documents from {ds.format} "
          f"({ds.num_files} file(s)), dtype {dtype}, vocab_size {vocab}{', zstd' if a.compression else ''} "
          f"({time.monotonic() - t0:.1f}s)")
    return 0


def convert(a: argparse.Namespace) -> int:
    """Run ``tokenfeed convert`` with parsed options ``a``. Returns the exit status."""
    if len(a.inputs) < 1:
        raise ConvertError("convert needs at least one INPUT and an OUT directory")
    a.tasks = getattr(a, "tasks", None)
    if a.tasks is not None and a.tasks < 1:
        raise ConvertError("--tasks must be >= 1")
    if a.tasks and not a.tokenizer:
        raise ConvertError("--tasks applies to text input (with --tokenizer); token files are copied in one pass")
    if a.workers is not None and a.workers < 1:
        raise ConvertError("--workers must be >= 1")
    if a.compression == "none":
        a.compression = None
    a.block_tokens = getattr(a, "block_tokens", None)
    if a.block_tokens is not None:
        if a.compression != "zstd":
            raise ConvertError("--block-tokens sets the size of zstd frames: add --compression zstd")
        if a.block_tokens < 1:
            raise ConvertError(f"--block-tokens {a.block_tokens}: give a positive number of tokens, e.g. 2048")
    if a.compression == "zstd":
        from ..common._build import build_info

        if not build_info()["zstd"]["usable"]:
            raise ConvertError("--compression zstd: this tokenfeed was built without zstd (install libzstd-dev and reinstall)")
    if a.tokenizer:
        if a.dtype or a.format:
            raise ConvertError("--dtype and --format describe token inputs; with --tokenizer the inputs are text")
        return _convert_text(a)
    return _convert_tokens(a)
