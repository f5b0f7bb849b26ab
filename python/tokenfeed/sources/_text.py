"""Text for tokenizing: where it is, how it is read, and the tokenizer.

The inputs of a text conversion are cut into *chunks* (:class:`Chunk`): byte ranges of a
JSONL file (cut at line ends), row groups of a Parquet file, whole plain-text files.
:func:`chunk_texts` yields the texts of one chunk. Both ``tokenfeed convert`` (worker
processes, one chunk at a time) and the datatrove steps (tokenfeed.integrations.datatrove)
read text through this module, so they see the same documents in the same order.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import math
import os
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

__all__ = ["ConvertError", "EOD_CANDIDATES", "Chunk", "Settings", "expand_inputs", "plan_chunks", "chunk_texts",
           "load_tokenizer", "default_eod", "file_sha256"]

EOD_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>")
TEXT_EXTS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".parquet": "parquet", ".txt": "text",
             ".text": "text", ".md": "text"}


class ConvertError(Exception):
    """A problem the user can fix (bad input, missing file, bad option): reported as one line."""


class Chunk(NamedTuple):
    """One unit of tokenizing work: a byte range of a JSONL file, a Parquet row group or a text file."""
    seq: int          # position in the output order
    path: str
    kind: str         # "jsonl", "jsonl.gz", "parquet", "text"
    start: int        # byte offset (jsonl) or row group (parquet)
    stop: int
    weight: int       # bytes, for the progress bar


class Settings(NamedTuple):
    """How texts become documents: what every chunk of one conversion is tokenized with."""
    tokenizer: str
    text_field: str
    eod_id: Optional[int]
    add_special_tokens: bool
    paragraphs: bool
    utf8_errors: str
    vocab_size: int
    batch_docs: int
    #: JSONL fields / Parquet columns kept as each document's metadata columns (convert --meta)
    meta: Tuple[str, ...] = ()


def input_kind(path: str, forced: Optional[str]) -> str:
    name = path[:-3] if path.endswith(".gz") else path
    gz = path.endswith(".gz")
    if forced:
        kind = forced
    else:
        ext = os.path.splitext(name)[1].lower()
        if ext not in TEXT_EXTS:
            raise ConvertError(f"{path}: cannot tell the input format from the extension {ext or '(none)'!r}: "
                           f"pass --input-format jsonl, parquet or text")
        kind = TEXT_EXTS[ext]
    if gz and kind == "parquet":
        raise ConvertError(f"{path}: a gzip-compressed Parquet file is not supported; Parquet compresses internally")
    return kind + (".gz" if gz else "")


def expand_inputs(inputs: Sequence[str], forced: Optional[str]) -> List[str]:
    out: List[str] = []
    for p in inputs:
        if os.path.isdir(p):
            found, other = [], []
            for root, dirs, files in os.walk(p):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for f in sorted(files):
                    base = f[:-3] if f.endswith(".gz") else f
                    if forced or os.path.splitext(base)[1].lower() in TEXT_EXTS:
                        found.append(os.path.join(root, f))
                    elif not f.startswith("."):
                        other.append(f)
            if not found:
                kinds: Dict[str, List[str]] = {}
                for ext, kind in TEXT_EXTS.items():
                    kinds.setdefault(kind, []).append(ext)
                formats = "; ".join(f"{'/'.join(exts)}: {kind} (--input-format {kind})" for kind, exts in kinds.items())
                held = (f"it holds {len(other)} other file(s), e.g. {', '.join(other[:3])}" if other
                        else "it holds no files")
                raise ConvertError(f"{p}: no file in this directory has an extension that tells its format "
                                   f"({formats}; each may end in .gz); {held}. To read every file as one format, "
                                   f"pass it: e.g. --input-format text for plain text")
            out.extend(found)
        elif os.path.exists(p):
            out.append(p)
        else:
            raise ConvertError(f"{p}: no such file or directory")
    return out


def plan_chunks(paths: Sequence[str], forced: Optional[str], chunk_bytes: int) -> List[Chunk]:
    chunks: List[Chunk] = []
    for path in paths:
        kind = input_kind(path, forced)
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
        raise ConvertError("reading Parquet needs pyarrow: pip install pyarrow") from None
    return pq


def load_tokenizer(path: str) -> Any:
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ConvertError("converting text needs the Hugging Face tokenizers library: pip install tokenizers") from None
    if not os.path.isfile(path):
        raise ConvertError(f"{path}: no such tokenizer file (give the path of a tokenizer.json)")
    try:
        return Tokenizer.from_file(path)
    except Exception as e:  # the Rust side raises a plain Exception
        raise ConvertError(f"{path}: not a Hugging Face tokenizers file: {e}") from None


def _decode(raw: bytes, where: str, errors: str) -> str:
    try:
        return raw.decode("utf-8", errors=errors)
    except UnicodeDecodeError as e:
        raise ConvertError(f"{where}: invalid UTF-8 at byte {e.start}: {e.reason}; "
                       f"pass --utf8-errors replace to substitute U+FFFD") from None


def _jsonl_texts(chunk: Chunk, field: str, errors: str) -> Iterator[Optional[str]]:
    """Texts of the lines that *start* inside [chunk.start, chunk.stop)."""
    for text, _ in _jsonl_records(chunk, field, errors, ()):
        yield text


def _jsonl_records(chunk: Chunk, field: str, errors: str,
                   meta: Sequence[str]) -> Iterator[Tuple[Optional[str], Dict[str, Any]]]:
    """(text, {meta field: value}) of the lines that *start* inside [chunk.start, chunk.stop)."""
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
                raise ConvertError(f"{where}: not valid JSON ({e})") from None
            if not isinstance(obj, dict):
                raise ConvertError(f"{where}: expected a JSON object per line, got {type(obj).__name__}")
            if field not in obj:
                raise ConvertError(f"{where}: no field {field!r} (fields: {', '.join(map(str, obj)) or 'none'}); "
                               f"choose one with --text-field")
            text = obj[field]
            m = {k: _meta_value(obj.get(k), where, k) for k in meta}
            if text is None:
                yield None, m
                continue
            if not isinstance(text, str):
                raise ConvertError(f"{where}: field {field!r} is {type(text).__name__}, not a string")
            yield text, m


def _meta_value(v: Any, where: str, name: str) -> Any:
    """A metadata value as a column holds it: int, float, str or None."""
    if v is None or isinstance(v, (int, float, str)):
        return v
    raise ConvertError(f"{where}: metadata field {name!r} is {type(v).__name__}: --meta keeps numbers, strings "
                       f"and nulls")


def _parquet_texts(chunk: Chunk, field: str) -> Iterator[Optional[str]]:
    for text, _ in _parquet_records(chunk, field, ()):
        yield text


def _parquet_records(chunk: Chunk, field: str, meta: Sequence[str]) -> Iterator[Tuple[Optional[str], Dict[str, Any]]]:
    pq = _pyarrow_parquet()
    pf = pq.ParquetFile(chunk.path)
    names = pf.schema_arrow.names
    if field not in names:
        raise ConvertError(f"{chunk.path}: no column {field!r} (columns: {', '.join(names)}); choose one with --text-field")
    missing = [k for k in meta if k not in names]
    if missing:
        raise ConvertError(f"{chunk.path}: no column {missing[0]!r} for --meta (columns: {', '.join(names)})")
    table = pf.read_row_group(chunk.start, columns=[field, *meta])
    cols = {k: table.column(k).to_pylist() for k in meta}
    for i, v in enumerate(table.column(0).to_pylist()):
        if v is not None and not isinstance(v, str):
            v = v.decode("utf-8") if isinstance(v, bytes) else str(v)
        yield v, {k: _meta_value(cols[k][i], f"{chunk.path}: row {i}", k) for k in meta}


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


def chunk_records(chunk: Chunk, s: Settings) -> Iterator[Tuple[Optional[str], Dict[str, Any]]]:
    """(text, metadata of s.meta) of one chunk's documents, in file order; plain text has none."""
    if chunk.kind.startswith("jsonl"):
        return _jsonl_records(chunk, s.text_field, s.utf8_errors, s.meta)
    if chunk.kind == "parquet":
        return _parquet_records(chunk, s.text_field, s.meta)
    if s.meta:
        raise ConvertError(f"{chunk.path}: --meta reads fields of JSONL or Parquet inputs; plain text has none")
    return ((t, {}) for t in _text_texts(chunk, s.paragraphs, s.utf8_errors))


def chunk_texts(chunk: Chunk, s: Settings) -> Iterator[Optional[str]]:
    """The texts of one chunk, in file order (``None`` for a null JSONL field or Parquet value)."""
    if chunk.kind.startswith("jsonl"):
        return _jsonl_texts(chunk, s.text_field, s.utf8_errors)
    if chunk.kind == "parquet":
        return _parquet_texts(chunk, s.text_field)
    return _text_texts(chunk, s.paragraphs, s.utf8_errors)


def file_sha256(path: str) -> str:
    """SHA-256 of a file (a tokenizer's identity in a conversion plan or a part's metadata), hex."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def default_eod(tok: Any) -> Optional[Tuple[str, int]]:
    """(token, id) of the tokenizer's end-of-document token, the first of EOD_CANDIDATES it has; or None."""
    for t in EOD_CANDIDATES:
        i = tok.token_to_id(t)
        if i is not None:
            return t, int(i)
    return None
