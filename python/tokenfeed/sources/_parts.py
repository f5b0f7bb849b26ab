"""Datasets made of parts: many independent tasks each write one part, a merge joins them.

::

    # in task k of n (any engine: datatrove, Slurm array, Ray, Spark, a shell loop)
    with tokenfeed.PartWriter("data/train", part=k, parts=n, vocab_size=50257) as w:
        for doc in my_share_of_the_corpus(k, n):
            w.add_document(doc)

    # once every task has finished
    ds = tokenfeed.merge_parts("data/train")

Layout (docs/format.md, "Datasets made of parts")::

    data/train/
      tokenfeed.manifest        written by merge_parts (format version 2)
      parts/part-00000/         a complete dataset directory: it opens on its own
        tokenfeed.manifest
        shard-....tfs
        part.json               which part of how many, counts, settings
      parts/part-00001/ ...

A part is written into a hidden staging directory (``parts/.part-00003.<random>.tmp``) and
renamed to ``parts/part-00003`` only when complete, so a task that dies leaves no part,
and a task that runs again replaces its part whole: a merge never sees a half-written
part or two copies of one. A part writer holds the part's lock (``parts/.part-00003.lock``,
see ``_lock.py``) from start to finish: a second attempt of the same part started while
the first still runs is refused with ``OSError(EBUSY)`` naming the holder, instead of
removing the running attempt's files; with the lock held, what dead attempts left is
removed. The merge reads each part's manifest and writes the
dataset's manifest naming the parts' shards (no token data is copied), after checking
that every part from 0 to n-1 is there exactly once, and that all agree on dtype,
vocabulary and the settings recorded by the writer. The merged dataset's documents are
part 0's in the order they were added, then part 1's, and so on.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
from typing import Any, Dict, List, Optional, Tuple

from .. import _core
from ._dataset import Dataset, DatasetWriter, DTypeLike, PathLike, _DocumentWriter, open as tf_open
from ..common._lock import RunLock

__all__ = ["PartWriter", "merge_parts", "PARTS_DIR", "PART_INFO"]

PARTS_DIR = "parts"
PART_INFO = "part.json"
PART_FORMAT = "tokenfeed-part"
PART_VERSION = 1
_PART_NAME = re.compile(r"^part-(\d+)$")


def part_name(part: int) -> str:
    """Directory name of part ``part`` under ``parts/``."""
    return f"part-{part:05d}"


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_json_atomic(path: str, obj: Dict[str, Any]) -> None:
    tmp = f"{path}.{secrets.token_hex(8)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class PartWriter(_DocumentWriter):
    """Write part ``part`` of ``parts`` of the dataset at ``path``, atomically.

    Use one per task; tasks run at the same time, on any machines that share the
    filesystem. Takes the options of :class:`tokenfeed.DatasetWriter` (every part of a
    dataset must use the same ``vocab_size`` and ``dtype``). ``metadata`` is a
    JSON-serialisable dict of settings that every part must share (the tokenizer's hash,
    the end-of-document id, ...): :func:`merge_parts` refuses parts whose metadata differ.

    Nothing is visible until the context exits cleanly (or :meth:`close`): the part is
    written into a hidden staging directory and renamed into place, replacing any
    earlier complete attempt of the same part. If the block raises, or the process dies,
    the staging directory is discarded (a later attempt of the same part removes what a
    killed one left).
    """

    _closed_message = "the part writer is closed"

    def __init__(self, path: PathLike, part: int, parts: int, *, vocab_size: int, dtype: DTypeLike = None,
                 shard_tokens: int = 1 << 28, compression: Optional[str] = None, level: int = 3,
                 block_tokens: Optional[int] = None, metadata: Optional[Dict[str, Any]] = None) -> None:
        for name, v in (("part", part), ("parts", parts)):
            if not isinstance(v, int) or isinstance(v, bool):
                raise TypeError(f"{name} must be an int, not {type(v).__name__}")
        if parts < 1 or not 0 <= part < parts:
            raise ValueError(f"part must be in [0, parts) and parts >= 1, got part={part}, parts={parts}")
        self.path = os.fspath(path)
        self.part = part
        self.parts = parts
        self.metadata: Dict[str, Any] = dict(metadata or {})
        #: free-form counts recorded in part.json (e.g. documents left out); merge does not compare them
        self.counts: Dict[str, int] = {}
        json.dumps(self.metadata)  # refuse what cannot be recorded, now rather than at the end
        self._root = os.path.join(self.path, PARTS_DIR)
        self.final_path = os.path.join(self._root, part_name(part))
        os.makedirs(self._root, exist_ok=True)
        self._lock: Optional[RunLock] = RunLock(self._root, f".{part_name(part)}.lock", f"this attempt of part {part}")
        self._w: Optional[DatasetWriter] = None
        try:
            self._remove_stale_attempts()
            self._staging = os.path.join(self._root, f".{part_name(part)}.{secrets.token_hex(8)}.tmp")
            self._w = DatasetWriter(
                self._staging, vocab_size=vocab_size, dtype=dtype, shard_tokens=shard_tokens, compression=compression,
                level=level, block_tokens=block_tokens)
        except BaseException:
            self._release()
            raise
        self.dtype = self._w.dtype
        self.vocab_size = self._w.vocab_size
        self._counts: Tuple[int, int] = (0, 0)

    def _release(self) -> None:
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.release()

    def _remove_stale_attempts(self) -> None:
        """Remove what dead attempts of this part left (staging or replaced directories); the lock is held."""
        prefix = f".{part_name(self.part)}."
        for name in os.listdir(self._root):
            if name.startswith(prefix) and (name.endswith(".tmp") or name.endswith(".old")):
                shutil.rmtree(os.path.join(self._root, name), ignore_errors=True)

    def _written(self) -> Tuple[int, int]:
        return self._w._written() if self._w is not None else self._counts

    def close(self) -> None:
        """Finish the part and publish it under ``parts/``. Idempotent."""
        if self._w is None:
            return
        w, self._w = self._w, None
        try:
            w.close()
            self._counts = (w.num_documents, w.num_tokens)
            _write_json_atomic(os.path.join(self._staging, PART_INFO), {
                "format": PART_FORMAT, "version": PART_VERSION, "part": self.part, "parts": self.parts,
                "documents": w.num_documents, "tokens": w.num_tokens, "dtype": self.dtype.name,
                "vocab_size": self.vocab_size, "metadata": self.metadata, "counts": dict(self.counts)})
            _fsync_dir(self._staging)
            old = None
            if os.path.exists(self.final_path):  # an earlier attempt finished: replace it whole
                old = os.path.join(self._root, f".{part_name(self.part)}.{secrets.token_hex(4)}.old")
                os.rename(self.final_path, old)
            os.rename(self._staging, self.final_path)
            _fsync_dir(self._root)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        except BaseException:
            shutil.rmtree(self._staging, ignore_errors=True)
            raise
        finally:
            self._release()

    def abort(self) -> None:
        """Discard this attempt; an earlier complete attempt of the part stays."""
        if self._w is not None:
            w, self._w = self._w, None
            w.abort()
        if self._lock is not None:
            shutil.rmtree(self._staging, ignore_errors=True)
        self._release()


def read_parts(path: PathLike) -> List[Dict[str, Any]]:
    """The ``part.json`` records of the parts under ``path/parts``, each with its ``name``, in part order.

    Raises ``ValueError`` naming what is wrong when the parts do not make one dataset:
    a part missing, a part index twice, parts of runs with different part counts, or
    parts written with a different dtype, vocabulary size or settings.
    """
    root = os.path.join(os.fspath(path), PARTS_DIR)
    if not os.path.isdir(root):
        raise ValueError(f"{root}: no such directory: nothing to merge (parts are written under {PARTS_DIR}/)")
    infos: List[Dict[str, Any]] = []
    for name in sorted(os.listdir(root)):
        if not _PART_NAME.match(name) or not os.path.isdir(os.path.join(root, name)):
            continue  # staging directories of unfinished attempts are hidden
        ip = os.path.join(root, name, PART_INFO)
        try:
            with open(ip) as f:
                info = json.load(f)
        except FileNotFoundError:
            raise ValueError(f"{ip}: missing: {PARTS_DIR}/{name} was not written by a tokenfeed part writer; "
                             f"remove it or write it again") from None
        except ValueError as e:
            raise ValueError(f"{ip}: not valid JSON ({e}); write the part again") from None
        if not isinstance(info, dict) or info.get("format") != PART_FORMAT:
            raise ValueError(f"{ip}: format: expected {PART_FORMAT!r}; write the part again")
        if info.get("version") != PART_VERSION:
            raise ValueError(f"{ip}: version: expected {PART_VERSION}, found {info.get('version')!r}; "
                             f"write the part with this tokenfeed, or upgrade tokenfeed")
        info["name"] = name
        infos.append(info)
    if not infos:
        raise ValueError(f"{root}: no finished parts: run the tasks that write them first")
    first = infos[0]
    counts = sorted({int(i["parts"]) for i in infos})
    if len(counts) > 1:
        by = {c: [i["name"] for i in infos if i["parts"] == c] for c in counts}
        raise ValueError(f"{root}: parts from runs with different part counts ({', '.join(f'{len(v)} of {c}' for c, v in by.items())}"
                         f", e.g. {by[counts[0]][0]} of {counts[0]} and {by[counts[-1]][0]} of {counts[-1]}): "
                         f"remove the parts of the older run and run the missing tasks")
    n = counts[0]
    seen: Dict[int, str] = {}
    for i in infos:
        k = int(i["part"])
        if not 0 <= k < n:
            raise ValueError(f"{root}/{i['name']}: part {k} is outside [0, {n}); remove it")
        if k in seen:
            raise ValueError(f"{root}: part {k} twice ({seen[k]} and {i['name']}): remove the copy that should not be there")
        seen[k] = i["name"]
    missing = [k for k in range(n) if k not in seen]
    if missing:
        shown = ", ".join(map(str, missing[:10])) + (f" and {len(missing) - 10} more" if len(missing) > 10 else "")
        raise ValueError(f"{root}: {len(missing)} of {n} parts missing ({shown}): the tasks that write them did not "
                         f"finish; run them again (a datatrove executor reruns unfinished tasks), then merge")
    for i in infos:
        for key in ("dtype", "vocab_size", "metadata"):
            if i.get(key) != first.get(key):
                raise ValueError(f"{root}/{i['name']}: {key}: expected {first.get(key)!r} as in {first['name']}, found "
                                 f"{i.get(key)!r}: the parts were written with different settings; write them again "
                                 f"with the same ones")
    infos.sort(key=lambda i: int(i["part"]))
    return infos


def merge_parts(path: PathLike, *, overwrite: bool = False) -> Dataset:
    """Join the parts under ``path/parts`` into the dataset ``path`` and open it.

    Writes ``path/tokenfeed.manifest`` naming every part's shards, part 0 first, each
    part's documents in the order its writer added them. Copies no token data: the cost
    is one small file read per part. Atomic (readers see the old manifest or the new
    one) and idempotent (merging the same parts again changes nothing). Refuses, with a
    ``ValueError`` naming the problem, parts that do not make one dataset (see
    :func:`read_parts`). A dataset already in ``path`` that is not a merge of parts is
    replaced only with ``overwrite=True``. The same parts give the same fingerprint.
    """
    p = os.fspath(path)
    infos = read_parts(p)
    _core.merge(p, [f"{PARTS_DIR}/{i['name']}" for i in infos], overwrite=bool(overwrite))
    return tf_open(p)


def part_paths(path: PathLike) -> List[str]:
    """Directories of the finished parts under ``path/parts``, in part order (each opens on its own)."""
    root = os.path.join(os.fspath(path), PARTS_DIR)
    return [os.path.join(root, i["name"]) for i in read_parts(path)]
