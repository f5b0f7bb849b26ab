"""Views: per-document metadata columns beside a dataset, and filters over them (docs/views.md).

A column file (docs/format.md, "Metadata columns") is written here, with NumPy, atomically
(a temporary file created exclusively beside it, fsynced, renamed over through the
directory's descriptor: never through a symlink). It is read by the C core (``_core.columns_*``),
which checks its header at open and each column's checksum and structure where it is used.
"""
from __future__ import annotations

import csv
import json
import math
import os
import struct
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from .. import _core
from ..common._files import write_atomic

__all__ = ["Columns", "write_columns", "columns_path", "read_table", "COLUMNS_NAME", "COLUMNS_SUFFIX"]

#: the column file of a tokenfeed dataset directory (or of a directory of foreign files)
COLUMNS_NAME = "tokenfeed.columns"
#: the column file beside a single file or a Megatron prefix: PATH + this
COLUMNS_SUFFIX = ".columns"

_MAGIC = b"TFCOLS1\0"
_TYPES = {"int64": 1, "float64": 2, "string": 3, "category": 4}
_INT_NULL = np.iinfo(np.int64).min
_CAT_NULL = 0xFFFFFFFF
_RESERVED = {"and", "or", "not", "in"}


def columns_path(paths: Sequence[str], format: Optional[str] = None) -> str:
    """Where the columns of a dataset opened from ``paths`` (with ``format``) live:
    ``DIR/tokenfeed.columns`` for a directory, ``PREFIX.columns`` for a Megatron pair (named by
    its prefix, its ``.bin`` or its ``.idx``), ``PATH.columns`` beside a single file, else
    ``tokenfeed.columns`` in the directory of the first file. What a local path names is the C
    core's answer (``_core.resolve_path``, the open's own rules), never re-derived here."""
    if len(paths) == 1:
        p = paths[0].rstrip("/") or "/"
        try:
            kind, where = _core.resolve_path(paths[0], format)
            if kind == "pair":
                return where + COLUMNS_SUFFIX
        except (OSError, ValueError, _core.FormatError):
            pass  # a URL, or nothing (yet) to open there: by its name
        if os.path.isdir(p):
            return os.path.join(p, COLUMNS_NAME)
        return p + COLUMNS_SUFFIX
    return os.path.join(os.path.dirname(paths[0]) or ".", COLUMNS_NAME)


def _check_name(name: str) -> None:
    if (not isinstance(name, str) or not name or len(name.encode()) > 255 or name in _RESERVED
            or not (name[0].isascii() and (name[0].isalpha() or name[0] == "_"))
            or not all(c.isascii() and (c.isalnum() or c == "_") for c in name)):
        raise ValueError(f"column name {name!r}: use letters, digits and _ (not starting with a digit, at most "
                         f"255 bytes, not and/or/not/in), so that filters can name it")


def _infer_type(values: Sequence[Any]) -> str:
    if isinstance(values, np.ndarray) and values.dtype.kind in "iubf":
        return "float64" if values.dtype.kind == "f" else "int64"
    kinds = set()
    for v in values:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            continue
        if isinstance(v, (bool, np.bool_)):
            kinds.add("int")
        elif isinstance(v, (int, np.integer)):
            kinds.add("int")
        elif isinstance(v, (float, np.floating)):
            kinds.add("float")
        elif isinstance(v, str):
            kinds.add("str")
        else:
            raise TypeError(f"column value {v!r} ({type(v).__name__}): use int, float, str or None")
    if "str" in kinds:
        if len(kinds) > 1:
            raise TypeError("a column holds both strings and numbers: make them one kind")
        distinct = len({v for v in values if v is not None})
        return "category" if distinct <= max(1, len(values) // 2) and distinct < (1 << 20) else "string"
    if "float" in kinds:
        return "float64"
    return "int64"


def _sections(kind: str, values: Sequence[Any]) -> List[bytes]:
    n = len(values)
    if isinstance(values, np.ndarray) and values.dtype.kind in "iub" and kind == "int64":
        return [values.astype("<i8").tobytes()]  # as given (no missing value but INT64_MIN)
    if isinstance(values, np.ndarray) and values.dtype.kind in "iubf" and kind == "float64":
        return [values.astype("<f8").tobytes()]  # NaN: missing
    if kind == "int64":
        a = np.empty(n, dtype="<i8")
        for i, v in enumerate(values):
            if v is None or (isinstance(v, float) and math.isnan(v)):
                a[i] = _INT_NULL
            elif isinstance(v, (int, np.integer, bool, np.bool_)):
                a[i] = int(v)
            else:
                raise TypeError(f"document {i}: {v!r} in an int64 column")
        return [a.tobytes()]
    if kind == "float64":
        f = np.array([np.nan if v is None else float(v) for v in values], dtype="<f8")
        return [f.tobytes()]
    if kind == "string":
        enc = [b"" if v is None else str(v).encode("utf-8") for v in values]
        offs = np.zeros(n + 1, dtype="<u8")
        np.cumsum([len(e) for e in enc], out=offs[1:]) if n else None
        return [offs.tobytes(), b"".join(enc)]
    if kind == "category":
        cats: Dict[str, int] = {}
        codes = np.empty(n, dtype="<u4")
        for i, v in enumerate(values):
            if v is None:
                codes[i] = _CAT_NULL
            else:
                codes[i] = cats.setdefault(str(v), len(cats))
        names = [k.encode("utf-8") for k in cats]
        offs = np.zeros(len(names) + 1, dtype="<u8")
        if names:
            np.cumsum([len(e) for e in names], out=offs[1:])
        return [codes.tobytes(), offs.tobytes(), b"".join(names)]
    raise ValueError(f"column type {kind!r}: expected one of {', '.join(_TYPES)}")


def _pad8(n: int) -> int:
    return (n + 7) & ~7


def write_columns(path: str, num_documents: int, columns: Mapping[str, Sequence[Any]], *,
                  types: Optional[Mapping[str, str]] = None, dataset_fingerprint: Union[int, str] = 0) -> str:
    """Write ``columns`` (name -> one value per document) as a column file at ``path``, atomically.

    Types are inferred (int64, float64, and strings as ``category`` when at most half the
    documents' values are distinct, else ``string``) unless ``types`` names them. ``None`` is a
    missing value. ``dataset_fingerprint`` (the dataset's, hex or int) is recorded so that
    the file is refused beside other data."""
    n = int(num_documents)
    fp = int(dataset_fingerprint, 16) if isinstance(dataset_fingerprint, str) else int(dataset_fingerprint)
    names = list(columns)
    if len(names) > 4096:
        raise ValueError(f"{len(names)} columns: at most 4096")
    built: List[Tuple[str, str, List[bytes]]] = []
    for name in names:
        _check_name(name)
        vals = columns[name]
        if len(vals) != n:
            raise ValueError(f"column {name!r} has {len(vals)} values for {n} documents")
        kind = (types or {}).get(name) or _infer_type(vals)
        if kind not in _TYPES:
            raise ValueError(f"column {name!r}: type {kind!r}, expected one of {', '.join(_TYPES)}")
        built.append((name, kind, _sections(kind, vals)))
    ncols = len(built)
    at = 64 + 80 * ncols
    name_at = []
    for name, _, _ in built:
        name_at.append(at)
        at += len(name.encode())
    at = _pad8(at)
    entries = []
    body: List[Tuple[int, bytes]] = []
    for (name, kind, secs), noff in zip(built, name_at):
        offs = []
        for s in secs + [b""] * (3 - len(secs)):
            offs.append((at, len(s)))
            if s:
                body.append((at, s))
            at = _pad8(at + len(s))
        h = 0
        for s in secs + [b""] * (3 - len(secs)):
            h = _core.hash64(s, h)
        e = struct.pack("<QQII", noff, len(name.encode()), _TYPES[kind], 0)
        for o, ln in offs:
            e += struct.pack("<QQ", o if ln else 0, ln)
        e += struct.pack("<Q", h)
        entries.append(e)
    head = _MAGIC + struct.pack("<IIQQQQQ", 1, ncols, n, fp, 64, 0, 0)
    directory = b"".join(entries)
    head += struct.pack("<Q", _core.hash64(directory, _core.hash64(head, 0)))
    write_atomic(path, [(0, head), (64, directory)] + list(zip(name_at, (nm.encode() for nm, _, _ in built)))
                  + body, at)
    return path


class Columns:
    """A column file, mapped; each column checked (checksum, offsets, codes) where first used."""

    def __init__(self, path: str) -> None:
        self.path = os.fspath(path)
        self._c = _core.columns_open(self.path)
        info = _core.columns_info(self._c)
        self.num_documents: int = info["num_documents"]
        self.dataset_fingerprint: str = f"{info['dataset_fingerprint']:016x}"
        self.types: Dict[str, str] = dict(info["columns"])

    @property
    def names(self) -> List[str]:
        return list(self.types)

    def eval(self, where: str) -> np.ndarray:
        """Boolean mask: the documents satisfying ``where`` (docs/views.md)."""
        return _core.columns_eval(self._c, where)

    def match(self, column: str, values: Iterable[Any]) -> np.ndarray:
        """Boolean mask: the documents whose ``column`` is one of ``values``."""
        return _core.columns_match(self._c, column, [str(v) for v in values])

    def values(self, column: str, ids: Any) -> List[Any]:
        """The values of ``column`` for document ids (None: missing)."""
        return _core.columns_values(self._c, column, np.asarray(ids, dtype=np.uint64).reshape(-1))

    def read_all(self) -> Dict[str, List[Any]]:
        ids = np.arange(self.num_documents, dtype=np.uint64)
        return {name: self.values(name, ids) for name in self.names}

    def __repr__(self) -> str:
        cols = ", ".join(f"{k}: {v}" for k, v in self.types.items())
        return f"tokenfeed.Columns({self.path!r}, {self.num_documents:,} documents, {{{cols}}})"


# --------------------------------------------------------------------------- tables to attach


def read_table(path: str) -> Tuple[List[str], List[Dict[str, Any]]]:
    """The rows of a JSONL, CSV or Parquet table (field names in first-seen order)."""
    low = path.lower()
    rows: List[Dict[str, Any]] = []
    if low.endswith((".jsonl", ".json", ".ndjson")):
        with open(path, encoding="utf-8") as f:
            for ln, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    r = json.loads(line)
                except ValueError as e:
                    raise ValueError(f"{path}: line {ln}: not JSON ({e})") from None
                if not isinstance(r, dict):
                    raise ValueError(f"{path}: line {ln}: expected an object, found {type(r).__name__}")
                rows.append(r)
    elif low.endswith((".csv", ".tsv")):
        with open(path, encoding="utf-8", newline="") as f:
            for r in csv.DictReader(f, delimiter="\t" if low.endswith(".tsv") else ","):
                rows.append({k: _csv_value(v) for k, v in r.items()})
    elif low.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq  # type: ignore[import-not-found,import-untyped,unused-ignore]
        except ImportError:
            raise ImportError(f"{path}: reading Parquet needs pyarrow (pip install pyarrow); or give the table "
                              f"as JSONL or CSV") from None
        rows = pq.read_table(path).to_pylist()
    else:
        raise ValueError(f"{path}: a table to attach is .jsonl, .csv, .tsv or .parquet")
    fields: Dict[str, None] = {}
    for r in rows:
        for k in r:
            fields.setdefault(k, None)
    return list(fields), rows


def _csv_value(v: Optional[str]) -> Any:
    if v is None or v == "":
        return None
    try:
        return int(v)
    except ValueError:
        pass
    try:
        return float(v)
    except ValueError:
        return v


# --------------------------------------------------------------------------- selections kept on the node

_SEL_MAGIC = b"TFSEL1\0\0"


def selection_key(dataset_fingerprint: str, columns: Optional[str], where: Optional[str], exclude: Any,
                  within: Optional[np.ndarray]) -> Optional[int]:
    """The key of a selection in the node's catalog: the dataset, the column file as it is now
    (device, inode, size, modification time: a file rewritten since has another key), the filter,
    the exclusion and the view it was taken within. None when it cannot be keyed (a mask)."""
    parts: List[Any] = [2, dataset_fingerprint, where]
    if columns is not None:
        try:
            fd = os.open(columns, os.O_RDONLY | os.O_CLOEXEC)
            try:
                st = os.fstat(fd)
                head = os.pread(fd, 64, 0)
            finally:
                os.close(fd)
        except OSError:
            return None
        # the header checksum covers the directory, which holds every column's checksum: a file
        # rewritten with other values has another key even within one timestamp tick
        parts.append([os.path.abspath(columns), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, head.hex()])
    if exclude is None:
        parts.append(None)
    elif isinstance(exclude, Mapping):
        try:
            parts.append(sorted((str(k), sorted(str(v) for v in ([vals] if isinstance(vals, (str, bytes)) else vals)))
                                for k, vals in exclude.items()))
        except TypeError:
            return None
    else:
        ex = np.unique(np.asarray(exclude)).astype(np.int64)
        parts.append(_core.hash64(ex.tobytes(), 1))
    parts.append(None if within is None else _core.hash64(np.ascontiguousarray(within, dtype=np.uint64).tobytes(), 2))
    return _core.hash64(json.dumps(parts).encode(), 3)


def selection_dir() -> Optional[str]:
    """``selections/`` of the node's catalog directory ($TOKENFEED_CATALOG_DIR, default
    ~/.cache/tokenfeed/catalog; "off": none)."""
    d = os.environ.get("TOKENFEED_CATALOG_DIR")
    if d is None:
        home = os.environ.get("HOME")
        d = os.path.join(home, ".cache", "tokenfeed", "catalog") if home else ""
    return os.path.join(d, "selections") if d and d != "off" else None


def load_selection(key: int) -> Optional[np.ndarray]:
    """The ids kept under key, checked (magic, length, key, checksum of the ids), or None."""
    d = selection_dir()
    if d is None:
        return None
    path = os.path.join(d, f"{key:016x}.sel")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            head = f.read(32)
            if len(head) != 32 or head[:8] != _SEL_MAGIC:
                return None
            n, h, k = struct.unpack("<QQQ", head[8:])
            if k != key or n > (1 << 40):
                return None
            body = f.read(8 * n + 1)
    except OSError:
        return None
    if len(body) != 8 * n or _core.hash64(body, 0) != h:
        return None
    return np.frombuffer(body, dtype="<u8")


def save_selection(key: int, ids: np.ndarray) -> None:
    """Keep ids under key (best effort: nothing when the directory cannot be written)."""
    d = selection_dir()
    if d is None:
        return
    try:
        os.makedirs(d, mode=0o700, exist_ok=True)
        body = np.ascontiguousarray(ids, dtype="<u8").tobytes()
        head = _SEL_MAGIC + struct.pack("<QQQ", len(ids), _core.hash64(body, 0), key)
        write_atomic(os.path.join(d, f"{key:016x}.sel"), [(0, head), (32, body)], 32 + len(body))
    except OSError:
        pass
