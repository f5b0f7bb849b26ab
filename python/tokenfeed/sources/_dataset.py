"""Datasets: open token files in place, and write the native format."""
from __future__ import annotations

import errno
import functools
import os
import time
import warnings
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple, TypeVar, Union

import numpy as np

from .. import _core
from ..remote import _remote, _shardset
from . import _views
from ..common._warnings import renamed
from ..common._errors import StateError
from ..common._warnings import DataWarning, PerformanceWarning
from ..common._progress import Progress

PathLike = Union[str, "os.PathLike[str]"]
DTypeLike = Union[str, np.dtype, type, None]

__all__ = ["Dataset", "DatasetView", "DatasetWriter", "build_index", "open"]


def default_index_dir() -> str:
    """The node's directory for document indexes of data whose directory is read-only:
    ``$TOKENFEED_INDEX_DIR``, else ``~/.cache/tokenfeed/docindex``."""
    return os.environ.get("TOKENFEED_INDEX_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "tokenfeed",
                                                                  "docindex")


def build_index(path: PathLike, *, dtype: DTypeLike, eos_id: int, index_dir: Optional[PathLike] = None) -> str:
    """Build the document index of a headerless token file whose documents end after
    ``eos_id`` (what :func:`open` with ``eos_id=`` reads for best-fit and document packing),
    and return where it was written: ``PATH.tfdocs`` beside the data, or the node's index
    directory when that directory is read-only. OLMo's document metadata (``x.csv.gz`` beside
    ``x.npy``) gives the documents when present (read by the C library, which needs zlib at run
    time for it: docs/format.md); otherwise the file is scanned once."""
    p = os.fspath(path)
    name = _dtype_name(dtype)
    if name is None:
        raise ValueError("dtype= is required: a headerless token file does not record it")
    # (the core reads OLMo's metadata itself: C programs get the same index)
    return _core.build_doc_index(p, name, int(eos_id), None, os.fspath(index_dir or default_index_dir()))


def build_catalog(path: PathLike, *, dtype: DTypeLike = None, format: Optional[str] = None,
                  eos_id: Optional[int] = None, endpoint_url: Optional[str] = None,
                  storage_options: Optional[Dict[str, Any]] = None) -> str:
    """Write the catalog of a local shard set beside its data and return its path.

    For a tokenfeed dataset directory (one with a manifest), write the dataset's own
    catalog, ``tokenfeed.catalog``, which its writer also writes: a remote open reads it
    instead of every shard's header (docs/format.md, "The dataset's catalog"). Datasets
    written before tokenfeed wrote one get it this way.

    ``path`` is a directory of foreign token files (no manifest) or a glob of names in one
    directory, as given to :func:`open`, with the same ``dtype``, ``format`` and ``eos_id``.
    Every file's header is read once; the catalog (``.tokenfeed-catalog-<key>`` in that
    directory) then lets every machine that reads the data open the set without listing the
    directory or reading a file, while the directory is unchanged (docs/format.md, "A catalog
    beside the data"). Files modified in the last 2 seconds are waited for.

    ``path`` may be a remote shard set (``"s3://bucket/tokens/*.bin"``, or a directory URL
    ending in ``/``): every object's header is read once and the catalog is stored as an
    object under the set's prefix (its URL is returned), from which every node opens the set
    with its listing and one more request instead of a request per object (docs/remote.md, "A
    catalog beside the data in object storage"). ``endpoint_url`` and ``storage_options`` are
    :func:`open`'s.
    """
    p = os.fspath(path)
    if _remote.is_url(p):
        return _build_remote_catalog(p, _dtype_name(dtype), format, None if eos_id is None else int(eos_id),
                                     endpoint_url, storage_options)
    if endpoint_url is not None or storage_options is not None:
        raise ValueError("endpoint_url and storage_options: only for a shard set in object storage")
    if os.path.isfile(os.path.join(p, _shardset.MANIFEST)):
        # a tokenfeed dataset: its own catalog, from its shards as opened (its writer writes one too)
        return Dataset([p])._core.write_dataset_catalog(p)
    spec = _shardset.data_catalog_spec(p)
    if spec is None:
        raise ValueError(f"{p}: a catalog beside the data describes a shard set in one local directory: a directory "
                         "without a manifest, or a glob of names in one directory (data/shard_*.bin)")
    dt, eos = _dtype_name(dtype), None if eos_id is None else int(eos_id)
    ds = Dataset([p], dtype=dt, format=format, eos_id=eos)  # (the core lists the set)
    give_up = time.monotonic() + 5.0
    while True:
        try:
            return ds._core.write_data_catalog(spec[0], spec[1], dtype=dt, format=format, eos_id=eos,
                                               index_dir=default_index_dir() if eos is not None else None)
        except BlockingIOError:  # modified in the last 2 s: recorded once settled
            if time.monotonic() > give_up:
                raise
            time.sleep(0.5)


def _build_remote_catalog(url: str, dt: Optional[str], format: Optional[str], eos: Optional[int],
                          endpoint_url: Optional[str], storage_options: Optional[Dict[str, Any]]) -> str:
    import tempfile

    spec = _shardset.remote_set_spec(url)
    if spec is None:
        raise ValueError(f"{url}: a catalog in object storage describes a shard set under one prefix: a directory URL "
                         "ending in / or a glob of names under one prefix (s3://bucket/tokens/*.bin)")
    if eos is not None:
        raise ValueError(f"{url}: a catalog in object storage describes files read without a document index; "
                         "files split at an eos id are opened by their listing")
    # a cache of its own: every header read from the store as it is now, not from a node's record
    with tempfile.TemporaryDirectory(prefix="tokenfeed-index-") as tmp:
        opts = _remote.store_options(cache_dir=tmp, endpoint_url=endpoint_url, storage_options=storage_options)
        store = _remote.get_store(**opts)
        # the set as the core expands it, from one listing of its prefix (which the open reuses)
        if spec[1] == "" and any(u == spec[0] + _shardset.MANIFEST for u, _, _ in store.list(spec[0])):
            raise ValueError(f"{url}: a tokenfeed dataset: write its catalog (tokenfeed.catalog) where it is written "
                             "(tokenfeed index DATASET_DIR, or the dataset writer), and upload it with the dataset")
        ds = Dataset([url], dtype=dt, format=format, remote=opts, spec=True)
        data = ds._core.remote_set_catalog(spec[0], spec[1], dtype=dt, format=format)
        name = spec[0] + _core.Dataset.set_catalog_name(spec[1], dtype=dt, format=format)
        put = store.transport.put  # (the transport only: a put that Ctrl-C interrupts must not keep the store)
        try:
            _remote.interruptible(lambda: put(name, data), "tokenfeed-put")
        except OSError as e:
            raise OSError(e.errno, f"{name}: cannot store the shard set's catalog there ({e.strerror or e}); "
                                   "tokenfeed index needs permission to write objects under the set's prefix") from None
        del ds, store
    return name


def _as_paths(path: Union[PathLike, Sequence[PathLike]]) -> list[str]:
    if isinstance(path, (str, os.PathLike)):
        return [os.fspath(path)]
    paths = [os.fspath(p) for p in path]
    if not paths:
        raise ValueError("open() needs at least one path")
    return paths


def _sentence(e: OSError) -> str:
    """An OSError's message as the sentence it is, without the "[Errno N] " of its str()."""
    if e.errno is None or not e.strerror:
        return str(e)
    named = e.filename is None or str(e.filename) in e.strerror
    return e.strerror if named else f"{e.filename}: {e.strerror}"


def _dtype_name(dtype: DTypeLike) -> Optional[str]:
    return None if dtype is None else np.dtype(dtype).name


_CATALOG_DIRS_SEEN: Set[str] = set()


def _catalog_dir() -> Optional[str]:
    """The node's catalog directory as the C library finds it (docs/format.md, "The node's catalog")."""
    d = os.environ.get("TOKENFEED_CATALOG_DIR")
    if d is not None:
        return d if d and d != "off" else None
    home = os.environ.get("HOME")
    return os.path.join(home, ".cache", "tokenfeed", "catalog") if home else None


_CATALOG_STEM = ".tokenfeed-catalog-"


_OPTION_FORMATS = (None, *_core.Dataset.formats())  # the C library's format table


def _option_sets(dt: Optional[str], format: Optional[str],
                 eos: Optional[int]) -> List[Tuple[Optional[str], Optional[str], Optional[int]]]:
    """(format, dtype, eos_id) an open's catalog may have been built with, this open's first."""
    return list(dict.fromkeys((f, d, e) for f in dict.fromkeys([format, *_OPTION_FORMATS])
                              for d in dict.fromkeys([dt, None]) for e in dict.fromkeys([eos, None])))


def _object_catalog_names(pattern: str, dt: Optional[str], format: Optional[str], eos: Optional[int]) -> Set[str]:
    """The names a set's catalog in object storage has for this pattern under the options an
    open may have been given (a copy of a bucket on disk carries it beside the objects)."""
    return {_core.Dataset.set_catalog_name(pattern, dtype=d, format=f, eos_id=e)
            for f, d, e in _option_sets(dt, format, eos)}


def _warn_unused_catalog(where: str, names: Sequence[str], dt: Optional[str], format: Optional[str],
                         eos: Optional[int], found: Callable[[Optional[str], Optional[str], Optional[int]], bool]) -> None:
    """A catalog beside the data lies there but this open did not use it (its options, or the
    glob it was built for, differ): said once, naming the catalog and what differs, since the
    open then lists and reads every file instead. ``found(dtype, format, eos_id)`` tells whether
    a catalog for those options is there."""
    if not names:
        return
    given = {"format": format, "dtype": dt, "eos_id": eos}
    differs = None
    for fmt, d, e in _option_sets(dt, format, eos)[1:]:  # (this open's own found nothing)
        try:
            hit = found(d, fmt, e)
        except (OSError, ValueError):
            hit = False
        if hit:
            differs = {"format": fmt, "dtype": d, "eos_id": e}
            break
    cats = ", ".join(sorted(names))
    if differs:
        what = "; ".join(f"{k}: the catalog's {v!r}, this open's {given[k]!r}" for k, v in differs.items()
                         if v != given[k])
        warnings.warn(f"{where}: the catalog beside the data ({cats}) was not used: it was built with other "
                      f"options ({what}), so every file is listed and read instead. Open with the options "
                      f"`tokenfeed index` was given, or build the catalog again with this open's options.",
                      PerformanceWarning, stacklevel=3)
    else:
        warnings.warn(f"{where}: the catalog beside the data ({cats}) was not used: it was built for another "
                      f"glob of this directory or other options (format, dtype, eos_id), so every file is listed "
                      f"and read instead. Open the set by the glob and options `tokenfeed index` was given, or "
                      f"build the catalog again for this one.", PerformanceWarning, stacklevel=3)


def _warn_refused_catalog_dir() -> None:
    """Say once per process, naming it and why, when the node's catalog directory exists but is
    refused (not this user's, or writable by others): the library then neither reads nor writes
    it, and every open of several files parses each of them again."""
    d = _catalog_dir()
    if d is None or d in _CATALOG_DIRS_SEEN:
        return
    _CATALOG_DIRS_SEEN.add(d)
    try:
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return  # not there yet (the library creates it, mode 0700) or not a directory
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    if st.st_uid != os.geteuid():
        why = f"it belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()})"
    elif st.st_mode & 0o022:
        why = (f"its mode {st.st_mode & 0o777:04o} lets others write it (a directory made under umask 002 "
               "by an older tokenfeed is one such); `chmod 700` it if only you wrote into it, or delete it")
    else:
        return
    warnings.warn(f"{d}: the node's catalog directory is not used: {why}. A catalog says where every token "
                  "lies, so one that another user could write is neither read nor written, and each open of "
                  "several files parses all of them again. Set $TOKENFEED_CATALOG_DIR to a directory of your "
                  "own (or to 'off')", PerformanceWarning, stacklevel=3)


def _warn_unversioned(store: Any) -> None:
    take = getattr(store.transport, "take_unversioned", None)
    seen = take() if take is not None else []
    if seen:
        more = f" and {len(seen) - 1} more" if len(seen) > 1 else ""
        warnings.warn(f"{seen[0]}{more}: the store gives no version (ETag) for these objects, so a change made "
                      "to them after open cannot be detected; bytes read later may come from the new content "
                      "(native shards with a chunk checksum table are still checked). Rewrite data under new "
                      "names, or serve it from a store that sends ETags (docs/remote.md)", RuntimeWarning,
                      stacklevel=4)


class Dataset:
    """Token files opened in place (memory-mapped, never converted) and concatenated.

    Use :func:`tokenfeed.open` to create one. ``len(ds)`` is the number of documents and
    ``ds[i]`` is document ``i`` as a NumPy array (zero-copy where possible).
    """

    def __init__(self, paths: Sequence[str], dtype: Optional[str] = None, format: Optional[str] = None,
                 remote: Optional[Dict[str, Any]] = None, eos_id: Optional[int] = None,
                 set_catalog: Optional[Tuple[str, str]] = None, spec: bool = False, immutable: bool = False) -> None:
        self._paths: Optional[List[str]] = list(paths)
        self._dtype_arg = dtype
        self._format_arg = format
        self._remote_args = remote
        self._eos_id = eos_id
        self._set_catalog = set_catalog
        self.eos_id: Optional[int] = eos_id
        store = None
        if any(_remote.is_url(p) for p in self._paths):
            store = _remote.get_store(**(remote or {}))
        self._store = store
        kw: Dict[str, Any] = {"dtype": dtype, "format": format, "remote": store, "eos_id": eos_id,
                              "index_dir": default_index_dir() if eos_id is not None else None}
        self._catalog_missing = False
        core = None
        if spec:
            # remote path specs (globs, directory URLs): expanded by the core from one listing of
            # their prefix per node, and with set_catalog from the set's catalog beside the data
            # when that listing shows one (docs/remote.md)
            if immutable:
                kw["immutable"] = True
            if set_catalog is not None:
                try:
                    core = _core.Dataset(self._paths, **dict(kw, set_catalog=True))
                except OSError as e:
                    if e.errno != errno.ESTALE:
                        raise
                    warnings.warn(_sentence(e), PerformanceWarning, stacklevel=3)  # out of date: objects read
                    self._set_catalog = None
                else:
                    # opened from the catalog when the listing showed one for these options
                    files = [f["path"] for f in core.files()]
                    used = store is not None and _core.Dataset.recorded(
                        store, files, dtype=dtype, format=format, eos_id=eos_id, index_dir=kw["index_dir"],
                        set_prefix=set_catalog[0], set_pattern=set_catalog[1])
                    if not used:
                        self._catalog_missing = True
                        self._set_catalog = None
        elif set_catalog is not None:
            try:
                # the set's expanded objects, from its catalog (prefix, pattern): a worker reopening it
                core = _core.Dataset(self._paths, **dict(kw, set_prefix=set_catalog[0], set_pattern=set_catalog[1]))
            except OSError as e:
                if e.errno not in (errno.ESTALE, errno.ENOENT):
                    raise
                # out of date or gone (a DataLoader worker reopening it too): the objects are read
                warnings.warn(_sentence(e), PerformanceWarning, stacklevel=3)
                self._set_catalog = None
        self._core = core if core is not None else _core.Dataset(self._paths, **kw)
        if spec:
            self._paths = None  # the files the core expanded the specs to, when asked for
        if store is None and self._paths is not None and _shardset.names_sets(self._paths):
            self._paths = None  # the core listed them: its files, when asked for
        if store is not None:
            _warn_unversioned(store)
        self._set_info()

    @classmethod
    def _from_catalog(cls, spec: Sequence[str], dtype: Optional[str], format: Optional[str],
                      eos_id: Optional[int], beside_data: bool = False, immutable: bool = False) -> "Dataset":
        """The shard set ``spec`` (globs, directories of foreign files) from the node's catalog,
        without listing its directories; FileNotFoundError when the catalog has no entry or a
        directory changed since it was listed (``immutable``: the directories are not looked
        at). ``beside_data``: spec is ``[prefix, pattern]``, read from the set's catalog beside
        the data (OSError ESTALE when it is out of date)."""
        self = cls.__new__(cls)
        kw: Dict[str, Any] = {"immutable": True} if immutable else {}
        self._core = _core.Dataset(list(spec), dtype=dtype, format=format, eos_id=eos_id,
                                   shard_set=2 if beside_data else 1,
                                   index_dir=default_index_dir() if eos_id is not None else None, **kw)
        self._paths = None  # the files, from the catalog when asked for
        self._dtype_arg, self._format_arg, self._remote_args = dtype, format, None
        self._eos_id = self.eos_id = eos_id
        self._set_catalog = None
        self._store = None
        self._set_info()
        return self

    def _catalog_as_set(self, spec: Sequence[str], dirs: Sequence[Tuple[str, Tuple[int, int, int, int]]]) -> bool:
        """Record this dataset, opened from the files ``spec`` expanded to, as that shard set."""
        return bool(self._core.catalog_set(list(spec), [d for d, _ in dirs], [i for _, i in dirs],
                                           dtype=self._dtype_arg, format=self._format_arg, eos_id=self._eos_id,
                                           index_dir=default_index_dir() if self._eos_id is not None else None))

    def _set_info(self) -> None:
        info = self._core.info
        self.num_tokens: int = info["num_tokens"]
        self._num_documents: int = info["num_documents"]
        self._documents_known: Optional[bool] = None if self._eos_id is not None else True
        self.dtype: np.dtype = np.dtype(info["dtype"])
        self.vocab_size: Optional[int] = info["vocab_size"] or None
        self.format: str = info["format"]
        self.num_files: int = info["num_files"]
        self.fingerprint: str = f"{info['fingerprint']:016x}"

    # pickles as paths + options: a spawned DataLoader worker re-opens the files, and must find the
    # dataset its parent opened (_reopened)
    def __reduce__(self) -> tuple[Any, ...]:
        return (_reopened, ((self.paths, self._dtype_arg, self._format_arg, self._remote_args, self._eos_id,
                             self._set_catalog), self.fingerprint))

    def cache_stats(self) -> Optional[Dict[str, Any]]:
        """For a remote dataset: requests, bytes fetched, chunks fetched and hit, cache usage (else None)."""
        return None if self._store is None else dict(self._store.stats(), cache_dir=self._store.cache_dir)

    @property
    def paths(self) -> list[str]:
        if self._paths is None:  # opened from the node's catalog: its files
            self._paths = [f["path"] for f in self._core.files()]
        return list(self._paths)

    def files(self) -> list[dict[str, Any]]:
        """One dict per file: path, format, dtype, first_token, num_tokens, first_document, num_documents, compressed."""
        return self._core.files()

    def _need_documents(self) -> None:
        """ValueError naming ``tokenfeed index`` when a file split at an eos id has no document
        index: its documents are known only inside the rows of a concat loader, never counted
        as one per file."""
        if not self._documents_known:
            self._core.check_documents()  # raises, naming the file and the command
            self._documents_known = True

    @property
    def num_documents(self) -> int:
        """The number of documents. A file opened with ``eos_id=`` needs its document index
        (``tokenfeed index``) to be counted: without it this raises ``ValueError`` naming the
        command (concat loaders still find each row's documents in its own tokens)."""
        self._need_documents()
        return self._num_documents

    def __len__(self) -> int:
        return self.num_documents

    def __bool__(self) -> bool:
        return True  # an open dataset holds at least one token (len() may need a document index)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.document(i)

    def document(self, i: int) -> np.ndarray:
        """Document ``i`` (negative indices count from the end)."""
        if not isinstance(i, (int, np.integer)):
            raise TypeError(f"document index must be an int, not {type(i).__name__}")
        self._need_documents()
        i = int(i)
        if i < 0:
            i += self.num_documents
        if not 0 <= i < self.num_documents:
            raise IndexError(f"document {i} out of range: the dataset has {self.num_documents} documents")
        start, length = self._core.document(i)
        return self.tokens(start, start + length)

    def tokens(self, start: int, stop: int) -> np.ndarray:
        """Tokens ``[start, stop)`` of the concatenated stream, in the dataset's dtype.

        A zero-copy read-only view when the range lies in one uncompressed file, a copy otherwise.
        """
        if start < 0 or stop < start or stop > self.num_tokens:
            raise IndexError(f"tokens [{start}, {stop}) out of range: the dataset has {self.num_tokens} tokens")
        v = self._core.view(start, stop - start)
        if v is not None:
            v.flags.writeable = False
            return v
        return self._core.read(start, stop - start, self.dtype.name)

    def find_document(self, pos: int) -> int:
        """Index of the document that holds token ``pos``."""
        if not isinstance(pos, (int, np.integer)) or isinstance(pos, bool):
            raise TypeError(f"pos must be an int, not {type(pos).__name__}")
        if not 0 <= pos < self.num_tokens:
            raise IndexError(f"token {pos} out of range: the dataset has {self.num_tokens} tokens")
        self._need_documents()
        return int(self._core.find_document(int(pos)))

    def verify(self, threads: int = 0, progress: Union[bool, Callable[[int, int], Any], None] = None) -> None:
        """Check every checksum, document index and token id (< vocab_size) on ``threads`` threads.

        Raises :class:`tokenfeed.FormatError` naming the first bad file. ``progress`` is a
        callable ``(done_bytes, total_bytes)``, ``True`` for a bar on stderr, or ``None`` for a
        bar only when stderr is a terminal.
        """
        bar: Optional[Progress] = None
        cb: Optional[Callable[[int, int], Any]]
        if progress is None or progress is True or progress is False:
            bar = Progress("verify", enabled=None if progress is None else bool(progress))
            cb = bar
        else:
            cb = progress
        try:
            self._core.verify(threads=threads, progress=cb)
        finally:
            if bar is not None:
                bar.close()

    def __repr__(self) -> str:
        vocab = self.vocab_size if self.vocab_size is not None else "unknown"
        try:
            docs = f"{self.num_documents:,} documents"
        except ValueError:
            docs = f"documents split at eos id {self._eos_id} (no document index)"
        return (f"tokenfeed.Dataset({self.format}, {self.num_files} file(s), {self.num_tokens:,} tokens, "
                f"{docs}, dtype={self.dtype.name}, vocab_size={vocab}, "
                f"fingerprint={self.fingerprint})")


    # ---- views: metadata columns and filters (docs/views.md) ----------------------------

    def _base(self) -> "Dataset":
        """The dataset whose files a view reads (itself for a dataset)."""
        return self

    @property
    def document_ids(self) -> np.ndarray:
        """The ids of this dataset's documents in the dataset a view selects from (``arange`` here)."""
        return np.arange(self.num_documents, dtype=np.uint64)

    @property
    def columns_path(self) -> str:
        """Where this dataset's metadata columns live (docs/views.md): ``DIR/tokenfeed.columns``
        for a directory, ``PREFIX.columns`` for a Megatron pair, ``PATH.columns`` beside a single
        file: where the open found the data, by its own rules."""
        base = self._base()
        return _views.columns_path(base.paths, getattr(base, "_format_arg", None))

    def columns(self, path: Optional[PathLike] = None) -> "_views.Columns":
        """The metadata columns of this dataset (from ``path``, default :attr:`columns_path`),
        checked against it: one row per document, written for these files (fingerprint)."""
        base = self._base()
        p = os.fspath(path) if path is not None else base.columns_path
        try:
            cols = _views.Columns(p)
        except FileNotFoundError:
            raise FileNotFoundError(errno.ENOENT, f"{p}: this dataset has no metadata columns: write them with "
                                    f"DatasetWriter.add_document(tokens, meta=...), `tokenfeed convert --meta`, "
                                    f"or `tokenfeed meta attach`", p) from None
        if cols.num_documents != base.num_documents:
            raise _core.FormatError(f"{p}: num_documents: the columns describe {cols.num_documents:,} documents, the "
                                    f"dataset has {base.num_documents:,}. They belong to other data: attach the "
                                    f"columns again (tokenfeed meta attach).")
        if int(cols.dataset_fingerprint, 16) and cols.dataset_fingerprint != base.fingerprint:
            raise _core.FormatError(f"{p}: dataset_fingerprint: the columns were written for dataset "
                                    f"{cols.dataset_fingerprint}, these files are {base.fingerprint}. The data "
                                    f"changed since: attach the columns again (tokenfeed meta attach).")
        return cols

    def attach_columns(self, table: Union[PathLike, Mapping[str, Sequence[Any]], Sequence[Mapping[str, Any]]], *,
                       key: str = "doc_index", path: Optional[PathLike] = None,
                       types: Optional[Mapping[str, str]] = None) -> str:
        """Attach per-document metadata to this dataset without touching its token files.

        ``table`` is a ``.jsonl``/``.csv``/``.parquet`` file (Parquet needs pyarrow) or a list
        of row dicts, or a dict of columns with one value per document in order. Rows are
        matched to documents by ``key``: ``"doc_index"`` (a field holding the document's
        index) or the name of a column the dataset already has (``"url"``), whose values must
        be unique. Documents no row names get missing values. Columns already attached are
        kept, and replaced where the table has a column of the same name. Returns the path
        written (default :attr:`columns_path`)."""
        base = self._base()
        if self is not base:
            raise ValueError("attach columns to the dataset itself, not to a filtered view of it")
        n = base.num_documents
        out = os.fspath(path) if path is not None else base.columns_path
        existing: Dict[str, List[Any]] = {}
        old_types: Dict[str, str] = {}
        # a symlink planted at the name is replaced, never read through
        if os.path.exists(out) and not os.path.islink(out):
            old = base.columns(out)
            existing = old.read_all()
            old_types = dict(old.types)
        if isinstance(table, Mapping):
            new = {k: list(v) for k, v in table.items()}
            for k, v in new.items():
                if len(v) != n:
                    raise ValueError(f"column {k!r} has {len(v)} values for {n} documents")
        else:
            if isinstance(table, (str, os.PathLike)):
                fields, rows = _views.read_table(os.fspath(table))
                where = os.fspath(table)
            else:
                rows = [dict(r) for r in table]
                fields = list(dict.fromkeys(k for r in rows for k in r))
                where = "table"
            index: List[int] = []
            if key == "doc_index":
                for i, r in enumerate(rows):
                    di = r.get("doc_index")
                    if isinstance(di, bool) or not isinstance(di, (int, np.integer)) or not 0 <= int(di) < n:
                        raise ValueError(f"{where}: row {i}: doc_index {di!r} is not a document index of this "
                                         f"dataset (0 to {n - 1})")
                    index.append(int(di))
            else:
                if key not in existing:
                    raise ValueError(f"{where}: key {key!r}: the dataset has no column {key!r} to match rows "
                                     f"with (it has: {', '.join(existing) or 'none'}); use --key doc_index, or "
                                     f"attach {key!r} first")
                where_of: Dict[Any, int] = {}
                for d, v in enumerate(existing[key]):
                    if v is None:
                        continue
                    if v in where_of:
                        raise ValueError(f"key {key!r}: value {v!r} names documents {where_of[v]} and {d}: "
                                         f"a key must be unique")
                    where_of[v] = d
                for i, r in enumerate(rows):
                    kv = r.get(key)
                    if kv not in where_of:
                        raise ValueError(f"{where}: row {i}: {key} {kv!r} names no document of this dataset")
                    index.append(where_of[kv])
            if len(set(index)) != len(index):
                seen: Set[int] = set()
                dup = next(i for i in index if i in seen or seen.add(i))  # type: ignore[func-returns-value]
                raise ValueError(f"{where}: two rows name document {dup}")
            new = {}
            for f_ in fields:
                if f_ in ("doc_index", key):
                    continue
                col: List[Any] = [None] * n
                for d, r in zip(index, rows):
                    col[d] = r.get(f_)
                new[f_] = col
        merged = dict(existing)
        merged.update(new)
        t = {k: v for k, v in old_types.items() if k not in new}
        t.update(types or {})
        return _views.write_columns(out, n, merged, types=t, dataset_fingerprint=base.fingerprint)

    def filter(self, where: Union[str, np.ndarray, None] = None, *,
               exclude: Union[Mapping[str, Iterable[Any]], Iterable[int], np.ndarray, None] = None,
               columns: Optional[PathLike] = None) -> "DatasetView":
        """A view of the documents that satisfy ``where`` and are not in ``exclude``.

        ``where`` is a filter over the metadata columns (``"lang == 'en' and quality >= 0.5"``,
        the language of docs/views.md, evaluated in C) or a boolean NumPy mask with one entry
        per document of this dataset (or view). ``exclude`` is document ids (of the dataset
        the view selects from, as :func:`tokenfeed.explain` reports them) or a dict
        ``{column: values}`` (urls, dedup clusters). The view is a dataset wherever one is
        taken (a :class:`~tokenfeed.Loader`, a mixture's sources); its fingerprint covers the
        selection, so its order is seekable and resumes exactly."""
        base = self._base()
        # over a view, masks of the dataset's documents are read at the view's ids
        ids = self.document_ids if self is not base else None
        # a selection made from the columns is kept in the node's catalog under a key of its
        # inputs, and read back (checked) by the next open instead of evaluated again
        key = None
        if (where is None or isinstance(where, str)) and (where is not None or exclude is not None):
            cpath = os.fspath(columns) if columns is not None else base.columns_path
            uses_columns = isinstance(where, str) or isinstance(exclude, Mapping)
            key = _views.selection_key(base.fingerprint, cpath if uses_columns else None, where, exclude, ids)
            kept = _views.load_selection(key) if key is not None else None
            if kept is not None:
                if uses_columns:
                    self.columns(columns)  # still the columns of this data
                try:
                    return DatasetView(self, self._core.select(kept), kept)
                except (ValueError, IndexError):
                    pass  # not a selection of this dataset after all: computed again below
        keep = np.ones(self.num_documents, dtype=bool)
        cols: Optional[_views.Columns] = None

        def mine(m: np.ndarray) -> np.ndarray:
            return m if ids is None else m[ids]

        if where is not None:
            if isinstance(where, str):
                cols = self.columns(columns)
                keep &= mine(cols.eval(where))
            else:
                m = np.asarray(where)
                if m.dtype != np.bool_ or m.shape != keep.shape:
                    raise ValueError(f"where= as a mask is a boolean array of {len(keep):,} entries (one per "
                                     f"document), got dtype {m.dtype} and shape {m.shape}")
                keep &= m
        if exclude is not None:
            if isinstance(exclude, Mapping):
                cols = cols or self.columns(columns)
                for name, values in exclude.items():
                    vals = [values] if isinstance(values, (str, bytes)) else list(values)
                    keep &= ~mine(cols.match(name, vals))
            else:
                ex = np.asarray(list(exclude) if not isinstance(exclude, np.ndarray) else exclude)
                if ex.size and (ex.dtype.kind not in "iu" or ex.min() < 0 or ex.max() >= base.num_documents):
                    raise ValueError(f"exclude= takes document ids of the dataset (0 to {base.num_documents - 1}) "
                                     f"or a dict {{column: values}}")
                if ids is None:
                    keep[ex.astype(np.int64)] = False
                else:
                    keep &= ~np.isin(ids, ex.astype(np.uint64))
        sel = np.flatnonzero(keep).view(np.uint64)  # int64 indices, never negative
        view = DatasetView(self, self._core.select(sel), sel)
        if key is not None:
            _views.save_selection(key, sel)
        return view


class DatasetView(Dataset):
    """A dataset with a selection of its documents (:meth:`Dataset.filter`): usable wherever a
    dataset is. Document ``i`` of the view is document ``document_ids[i]`` of the dataset it
    selects from; token positions (``tokens``) are that dataset's."""

    def __init__(self, parent: Dataset, core: Any, selected: np.ndarray) -> None:  # noqa: D107
        self.__dict__.update({k: v for k, v in parent.__dict__.items() if not k.startswith("_view")})
        self._parent = parent
        self._selected = selected
        self._core = core
        self._set_info()
        docs, toks = core.selection()
        self._num_documents = docs
        self._documents_known = True
        self.num_tokens = toks

    def _base(self) -> Dataset:
        return self._parent._base()

    @property
    def parent(self) -> Dataset:
        return self._parent

    @property
    def document_ids(self) -> np.ndarray:
        return np.asarray(self._core.document_id(np.arange(self._num_documents, dtype=np.uint64)), dtype=np.uint64)

    def document(self, i: int) -> np.ndarray:
        """Document ``i`` of the view."""
        if not isinstance(i, (int, np.integer)):
            raise TypeError(f"document index must be an int, not {type(i).__name__}")
        i = int(i) + (self._num_documents if i < 0 else 0)
        if not 0 <= i < self._num_documents:
            raise IndexError(f"document {i} out of range: the view has {self._num_documents} documents")
        start, length = self._core.document(i)
        return self._base().tokens(start, start + length)

    def tokens(self, start: int, stop: int) -> np.ndarray:
        """Tokens ``[start, stop)`` of the files' stream (the dataset the view selects from)."""
        return self._base().tokens(start, stop)

    def find_document(self, pos: int) -> int:
        """Index in the view of the document holding token ``pos`` of the files' stream
        (``IndexError`` when the view leaves that document out)."""
        base = self._base()
        d = base.find_document(pos)
        hit = np.searchsorted(self.document_ids, d)
        if hit >= self._num_documents or int(self.document_ids[hit]) != d:
            raise IndexError(f"token {pos} lies in document {d}, which the view leaves out")
        return int(hit)

    def verify(self, threads: int = 0, progress: Union[bool, Callable[[int, int], Any], None] = None) -> None:
        self._base().verify(threads=threads, progress=progress)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_reselect, (self._parent, self._selected))

    def __repr__(self) -> str:
        base = self._base()
        return (f"tokenfeed.DatasetView({self._num_documents:,} of {base.num_documents:,} documents, "
                f"{self.num_tokens:,} tokens, of {base!r}, fingerprint={self.fingerprint})")


def _reselect(parent: Dataset, selected: np.ndarray) -> DatasetView:
    return DatasetView(parent, parent._core.select(selected), selected)


_Open = TypeVar("_Open", bound=Callable[..., "Dataset"])


def _checks_dtype(fn: _Open) -> _Open:
    """open() checks the dtype it was given against what it opened, however it opened it
    (listing the files, or from a catalog): an explicit dtype that headers contradict is an
    error; on local headerless files, a sample that looks like another dtype warns."""

    @functools.wraps(fn)
    def checked(*args: Any, **kw: Any) -> "Dataset":
        ds = fn(*args, **kw)
        dt = _dtype_name(kw.get("dtype"))
        if dt is not None:
            _check_header_dtype(ds, dt)
            if ds.format == "raw" and not any(_remote.is_url(p) for p in ds.paths[:1]):
                why = dtype_mismatch(ds)
                if why is not None:
                    warnings.warn(why, DataWarning, stacklevel=2)
        return ds

    return checked  # type: ignore[return-value]


@_checks_dtype
def open(path: Union[PathLike, Sequence[PathLike]], *, dtype: DTypeLike = None, format: Optional[str] = None,
         cache_dir: Optional[PathLike] = None, cache_limit: Union[int, str, None] = None,
         endpoint_url: Optional[str] = None, chunk_size: Union[int, str, None] = None,
         prefetch_bytes: Union[int, str, None] = None, fetch_threads: Optional[int] = None,
         storage_options: Optional[Dict[str, Any]] = None, request_timeout: Optional[float] = None,
         max_attempts: Optional[int] = None, deadline: Optional[float] = None,
         eos_id: Optional[int] = None, prefetch: Union[int, str, None] = None, immutable: bool = False) -> Dataset:
    """Open token data in place and return a :class:`Dataset`.

    ``path`` is a tokenfeed dataset directory or shard, a Megatron ``.bin/.idx`` prefix,
    an llm.c shard, a ``.npy`` file, a NeMo AutoModel nanogpt shard (its ``.bos.idx`` beside
    it gives document boundaries), a headerless token file (with ``dtype=``; a datatrove
    ``.index`` beside it gives document boundaries), or a list of any of these,
    concatenated in order. A shard set opens as its files in sorted name order: a directory
    without a manifest holding files of one format (``"data/"``), or a glob
    (``"data/*.npy"``, ``"s3://bucket/tokens/*.bin"``); see docs/format.md, "Shard sets". The format is detected unless ``format=`` names one
    (a name of the C library's format table:
    ``"tokenfeed"``, ``"megatron"``, ``"llm.c"``, ``"raw"``, ``"npy"``, ``"nemo-nanogpt"``).
    Malformed input raises :class:`tokenfeed.FormatError` naming the file and field.

    Any path may be a URL in object storage (``s3://bucket/prefix/``, ``gs://``, ``az://``,
    ``https://``; needs ``pip install 'obstore>=0.6'``): open reads metadata only, and
    token bytes reach the loader through a bounded local cache filled ahead of use
    (docs/remote.md). ``cache_dir`` (default ``$TOKENFEED_CACHE_DIR`` or
    ``~/.cache/tokenfeed/remote``) is shared by every process of the node; ``cache_limit``
    caps it (bytes or ``"200GB"``); ``endpoint_url`` (default ``$AWS_ENDPOINT_URL_S3`` /
    ``$AWS_ENDPOINT_URL``) points ``s3://`` at an S3-compatible store; ``chunk_size``,
    ``prefetch_bytes`` (bytes kept requested ahead; older name ``prefetch``, deprecated) and
    ``fetch_threads`` tune the transfers;
    ``request_timeout`` (seconds, default 20) bounds one request before it is retried;
    ``max_attempts`` (default 8) and ``deadline`` (seconds, default 30) bound the retries of
    one request (whichever ends first); ``storage_options`` go to the client (never printed).
    ``eos_id`` splits the documents of headerless token files (nanoGPT, OLMo, datatrove
    without ``.index``) after each occurrence of that id, and enters the dataset
    fingerprint. Concat packing needs nothing more: each row finds its documents (position
    ids, ``cu_seqlens``, loss mask) in its own tokens. Best-fit and document packing, and
    ``num_documents``, ``document()`` and ``find_document()`` (which raise ``ValueError``
    without it, never counting a file as one document), need the document index, built once with ``tokenfeed index PATH --dtype D --eos-id N``
    (:func:`tokenfeed.build_index`) and kept beside the data or, when that directory is
    read-only, in the node's index directory (``$TOKENFEED_INDEX_DIR``, default
    ``~/.cache/tokenfeed/docindex``); an index
    whose data file changed is refused (docs/format.md, "Document index").

    ``immutable=True`` (local shard sets): the caller vouches that no file of the set's
    directories was added, removed or renamed since this node last opened it, and the set
    opens from the node's catalog without looking at a directory: on a shared file system,
    no metadata request at all before the first touch of a file. A file added since is not
    seen; a file replaced or modified is still a ``FormatError`` naming it at its first touch
    (docs/format.md, "Shard sets"). For remote paths: the node's recorded listing of a glob's or
    directory URL's prefix is used whatever its age, and the node's record of the open without
    asking the store, so that a restart sends no request; an object rewritten since is refused
    by name when read (docs/remote.md, "Shard sets, listed once per node").
    """
    if eos_id is not None and (not isinstance(eos_id, (int, np.integer)) or isinstance(eos_id, bool) or eos_id < 0):
        raise ValueError(f"eos_id must be a non-negative int, got {eos_id!r}")
    prefetch_bytes = renamed("prefetch_bytes", prefetch_bytes, "prefetch", prefetch, stacklevel=3)
    paths = _as_paths(path)
    remote: Optional[Dict[str, Any]] = None
    opts = {"cache_dir": cache_dir, "cache_limit": cache_limit, "endpoint_url": endpoint_url,
            "chunk_size": chunk_size, "prefetch_bytes": prefetch_bytes, "fetch_threads": fetch_threads,
            "storage_options": storage_options, "request_timeout": request_timeout,
            "max_attempts": max_attempts, "deadline": deadline}
    if any(_remote.is_url(p) for p in paths):
        remote = _remote.store_options(**opts)  # type: ignore[arg-type]
    elif any(v is not None for v in opts.values()):
        given = ", ".join(k for k, v in opts.items() if v is not None)
        raise ValueError(f"{given}: only for remote paths (s3://, gs://, az://, https://); no path here is remote")
    dt, eos = _dtype_name(dtype), None if eos_id is None else int(eos_id)
    if immutable and remote is None:
        # the caller vouches that the set's directories are as this node recorded them: nothing
        # on the data's file system is looked at before the first touch of a file
        _warn_refused_catalog_dir()
        try:
            return Dataset._from_catalog(paths, dt, format, eos, immutable=True)
        except FileNotFoundError:
            pass  # not catalogued on this node yet: opened as any other
    sets = remote is None and _shardset.local_sets(paths)
    if remote is None and (len(paths) > 1 or sets or os.path.isdir(paths[0])):
        _warn_refused_catalog_dir()  # (what the node's catalog may serve: several files)
    if sets:
        try:
            return Dataset._from_catalog(paths, dt, format, eos)
        except FileNotFoundError:
            pass  # not catalogued on this node yet, or a directory changed: the core lists the directories
        beside = _shardset.data_catalog_spec(paths[0]) if len(paths) == 1 else None
        set_dirs = _shardset.local_set_dirs(paths) if beside is not None else None
        if beside is not None and set_dirs is not None:
            try:
                ds = Dataset._from_catalog(beside, dt, format, eos, beside_data=True)
            except FileNotFoundError:
                d = beside[0] or "."
                try:
                    # a bucket's own catalog copied to disk with its objects is not one a local open
                    # could use (its key space is another): nothing to say about it
                    objects = _object_catalog_names(beside[1], dt, format, eos)
                    cats = [n for n in os.listdir(d) if n.startswith(_CATALOG_STEM) and n not in objects]
                except (OSError, ValueError):
                    cats = []

                def found_local(d_: Optional[str], f_: Optional[str], e_: Optional[int]) -> bool:
                    try:
                        Dataset._from_catalog(beside, d_, f_, e_, beside_data=True)
                    except FileNotFoundError:
                        return False
                    return True
                _warn_unused_catalog(paths[0], cats, dt, format, eos, found_local)
            except OSError as e:
                # out of date, or not to be read (a FIFO, another user's file under its name):
                # said, and the set is listed
                if e.errno not in (errno.ESTALE, errno.EPERM):
                    raise
                warnings.warn(_sentence(e), PerformanceWarning, stacklevel=2)
            else:
                ds._catalog_as_set(paths, set_dirs)  # this node's own entry: the next open is faster still
                return ds
    if remote is not None:
        return _open_remote(paths, dt, format, remote, eos, immutable)
    # (local directories and globs are listed by the core, which records the set in the node's catalog)
    ds = Dataset(paths, dtype=dt, format=format, eos_id=eos)
    if ds.format == "raw" and remote is None:
        _warn_if_not_tokens(ds.paths[:4])
    return ds


def _open_remote(paths: List[str], dt: Optional[str], format: Optional[str], remote: Dict[str, Any],
                 eos: Optional[int], immutable: bool) -> Dataset:
    """Remote paths: the core expands globs and directory URLs from one listing of their prefix
    per node (csrc/remote/remote_spec.c) and opens the objects; a set under one prefix opens
    from its catalog beside the data when that listing shows one."""
    set_spec = _shardset.remote_set_spec(paths[0]) if len(paths) == 1 else None
    ds = Dataset(paths, dtype=dt, format=format, remote=remote, eos_id=eos, set_catalog=set_spec,
                 spec=True, immutable=immutable)
    if set_spec is not None and ds._catalog_missing and ds._store is not None:
        # no catalog under this open's key: say so when one for other options lies beside the set
        # (the names come from the node's recorded listing, which the open just made or read)
        prefix, pattern = set_spec
        try:
            listed_names = {u[len(prefix):] for u, _, _ in ds._store.list(prefix, immutable=True)}
        except OSError:
            listed_names = set()
        cats = [n for n in listed_names if n.startswith(_CATALOG_STEM)]

        def found_remote(d_: Optional[str], f_: Optional[str], e_: Optional[int]) -> bool:
            return _core.Dataset.set_catalog_name(pattern, dtype=d_, format=f_, eos_id=e_) in listed_names
        if cats:
            _warn_unused_catalog(paths[0], cats, dt, format, eos, found_remote)
    return ds


def _reopened(args: Tuple[Any, ...], fingerprint: str) -> Dataset:
    """A pickled Dataset opened again (in a DataLoader worker): the files it names must still be
    the dataset the pickling process had open, or a worker would read other data than its parent
    (an object rewritten in the store since, a local file replaced) under the same loader."""
    ds = Dataset(*args)
    if ds.fingerprint != fingerprint:
        shown = ", ".join(str(p) for p in list(args[0])[:3]) + (", ..." if len(args[0]) > 3 else "")
        raise StateError(f"{shown}: the dataset changed since it was opened in the process that pickled it "
                         f"(fingerprint {fingerprint} there, {ds.fingerprint} here): a file or object was "
                         "rewritten meanwhile. Open the dataset again in the main process and make the loader "
                         "again (a state saved on the old data is refused)")
    return ds


def _check_header_dtype(ds: "Dataset", dt: str) -> None:
    """dtype= names the dtype of headerless files. Where no file of the dataset is headerless, a
    dtype that its files' headers contradict is refused, not ignored: the caller meant other data."""
    if ds.format == "raw":  # (the first file's: a headerless set, the common case, lists no file)
        return
    files = ds.files()
    if any(f["format"] == "raw" for f in files):
        return
    for f in files:
        if f["dtype"] != dt:
            raise ValueError(f"{f['path']}: dtype={dt!r} was given, but the file's {f['format']} header says "
                             f"{f['dtype']}: tokenfeed reads the dtype a header records. Drop dtype= (or pass "
                             f"dtype={f['dtype']!r}); if the file really holds {dt} ids, it was written wrongly")


# The sample dtype_mismatch reads: this many tokens from each of this many evenly spaced places.
_SAMPLE_PIECE, _SAMPLE_PLACES = 4096, 8
# No tokenizer's vocabulary comes near this many ids; two narrower ids read as one wide id do.
_IMPLAUSIBLE_ID = 1 << 24
_WIDTHS = ("uint8", "uint16", "uint32")


def dtype_mismatch(ds: "Dataset") -> Optional[str]:
    """A sentence saying which dtype the tokens of a headerless dataset look like, when its
    bytes read with ds.dtype show another dtype's signature; None when they look honest.

    Cheap and bounded: _SAMPLE_PLACES pieces of _SAMPLE_PIECE tokens, whatever the size. The
    signatures, on byte-aligned pieces (a wider dtype's files hold a whole number of its ids):
    read too narrow, every other id is the high half of a wide id (mostly 0, far smaller on
    average than its neighbours: in honest data odd and even positions look alike); read too
    wide, pairs of narrow ids make ids of 2**24 and more, which no vocabulary has."""
    d = np.dtype(ds.dtype).name
    n = int(ds.num_tokens)
    if d not in _WIDTHS or n * ds.dtype.itemsize < 2048:
        return None
    align = 4 // ds.dtype.itemsize  # tokens per 4 bytes: every piece starts on a 4-byte boundary
    piece = min(_SAMPLE_PIECE, n) // align * align
    starts = sorted({int(s) // align * align for s in np.linspace(0, n - piece, _SAMPLE_PLACES)})
    raw = [ds.tokens(s, s + piece).tobytes() for s in starts]

    def stats(w: str) -> Tuple[float, float, float, int, int, int]:
        """Read as w: mean of the ids at even and at odd positions, share of odd ones that are 0,
        the largest id at even and at odd positions, and how many pairs were seen."""
        even = odd = zeros = 0.0
        halves, mx_even, mx_odd = 0, 0, 0
        for b in raw:
            t = np.frombuffer(b[:len(b) // 4 * 4], dtype=w)
            k = len(t) // 2 * 2
            if k == 0:
                continue
            e, o = t[0:k:2].astype(np.float64), t[1:k:2].astype(np.float64)
            even, odd, zeros = even + float(e.sum()), odd + float(o.sum()), zeros + float((o == 0).sum())
            halves += k // 2
            mx_even, mx_odd = max(mx_even, int(e.max())), max(mx_odd, int(o.max()))
        h = max(1, halves)
        return even / h, odd / h, zeros / h, mx_even, mx_odd, halves

    def narrow(w: str) -> bool:
        """Read as w, every other id is the high half of a wider one: far smaller on average, or
        never near the largest of its neighbours (in honest data odd and even positions look alike)."""
        me, mo, _, xe, xo, h = stats(w)
        return (me >= 4 and mo < 0.5 * me) or (h >= 4096 and xe >= 16 and xo < 0.85 * xe)

    def wide(w: str) -> bool:  # read as w, the ids are narrower ones paired up
        st = stats(w)
        return max(st[3], st[4]) >= _IMPLAUSIBLE_ID

    where = ds.paths[0] + (f" (and {ds.num_files - 1} more file(s))" if ds.num_files > 1 else "")
    i = _WIDTHS.index(d)
    halved = [v for v in _WIDTHS[i:2] if narrow(v)]  # read as uint8 or uint16
    if halved:
        j = _WIDTHS.index(halved[-1])
        looks = next((w for w in _WIDTHS[j + 1:] if not narrow(w) and not wide(w)), None)
        if looks is None:
            return None
        me, mo, z, xe, xo, _ = stats(d)
        why = (f"every other id looks like the high half of a wider id ({z:.0%} of them are 0; they average "
               f"{mo:,.0f} and reach {xo:,}, against {me:,.0f} and {xe:,} for their neighbours, where honest "
               f"data has both alike)")
        alt = ""
    elif wide(d):
        fits = [w for w in reversed(_WIDTHS[:i]) if not narrow(w)]  # widest first
        if not fits:
            return None
        looks, alt = fits[0], "".join(f" or {w}" for w in fits[1:])
        st = stats(d)
        why = f"ids reach {max(st[3], st[4]):,}, far above any vocabulary: narrower ids read in pairs as one"
    else:
        return None
    also = "".join(f" (or dtype=\"{w}\")" for w in alt.split(" or ")[1:])
    return (f"{where}: read as {d}, the bytes look like {looks}{alt} tokens: {why}. Pass dtype=\"{looks}\"{also} "
            f"if the file was written so")


def _warn_if_not_tokens(paths: Sequence[str]) -> None:
    """A headerless file opened with a dtype reads any bytes as tokens: say so when the file
    is text or an image (what the C detector finds when no dtype is given), instead of
    handing out meaningless ids. The first few files only: open stays O(1)."""
    for p in list(paths)[:4]:
        if not os.path.isfile(p) or os.path.getsize(p) == 0:
            continue
        try:
            _core.Dataset([p], dtype=None, format=None, remote=None)
        except _core.FormatError as e:
            msg = str(e)
            if ": the file is " in msg:
                what = msg.split(": the file is ", 1)[1].split(". tokenfeed reads", 1)[0]
                warnings.warn(f"{p}: opened as headerless tokens, but the file is {what}; its bytes read as "
                              f"tokens are meaningless ids", UserWarning, stacklevel=3)
        except Exception:
            pass  # anything else is not ours to report here: the open above succeeded


def _dtype_for_vocab(vocab_size: int) -> str:
    if vocab_size <= 1 << 8:
        return "uint8"
    if vocab_size <= 1 << 16:
        return "uint16"
    if vocab_size <= 1 << 32:
        return "uint32"
    raise ValueError(f"vocab_size {vocab_size} does not fit the native format (at most 2**32)")


_W = TypeVar("_W", bound="_DocumentWriter")


class _DocumentWriter:
    """What DatasetWriter and PartWriter share: documents go to ``_w`` until the writer is
    closed (``_w`` is then None); a ``with`` block closes the writer when it ends cleanly and
    aborts it when it raises."""

    _w: Optional[Any]
    _closed_message = "the writer is closed"

    def add_document(self, tokens: Any) -> None:
        """Append one document (any 1-D integer array-like). Ids must be in ``[0, vocab_size)``."""
        if self._w is None:
            raise ValueError(self._closed_message)
        self._w.add_document(tokens)

    def add_documents(self, docs: Iterable[Any]) -> None:
        """Append each document of ``docs``, in order."""
        for d in docs:
            self.add_document(d)

    def _written(self) -> Tuple[int, int]:
        """(documents, tokens) written so far, or in all once closed."""
        raise NotImplementedError

    @property
    def num_documents(self) -> int:
        return self._written()[0]

    @property
    def num_tokens(self) -> int:
        return self._written()[1]

    def close(self) -> None:
        raise NotImplementedError

    def abort(self) -> None:
        raise NotImplementedError

    def __enter__(self: _W) -> _W:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


class DatasetWriter(_DocumentWriter):
    """Write documents into a tokenfeed dataset directory, atomically.

    ::

        with tokenfeed.DatasetWriter("data/train", vocab_size=50257) as w:
            for doc in docs:
                w.add_document(doc)

    Shards roll over at ``shard_tokens`` tokens (documents are never split across
    shards). Nothing is visible to readers until the context exits cleanly (or
    :meth:`close` is called): shards are written under temporary names, fsynced and
    renamed, and the manifest is written last. If the block raises, everything written
    is discarded and any dataset that was already in ``path`` stays as it was.
    ``dtype`` defaults to the smallest of uint8/uint16/uint32 that holds ``vocab_size``.
    With ``compression="zstd"``, ``block_tokens`` (default 2048, the C writer's) tokens make
    one independently decodable frame: small enough that a full shuffle at ``seq_len`` >=
    1024 decodes at most ~3 tokens per token it delivers; larger blocks compress a little
    better and suit ``shuffle="block"`` (trade-off measured in docs/performance.md).
    At ``level`` 3 (the default) or below, a frame stores its literals raw unless Huffman
    coding makes it at least a fifth smaller: such frames decode about twice as fast, for
    ~4-10 % of ratio on token ids; ``level=4`` or above leaves that choice to zstd.
    ``chunk_checksum_bytes`` (a power of two, default 64 KiB) adds a checksum per that many
    stored bytes, so that reading the dataset from object storage checks every fetched piece
    (docs/format.md); 0 writes shards that tokenfeed versions without that table can read.
    """

    def __init__(self, path: PathLike, *, vocab_size: int, dtype: DTypeLike = None, shard_tokens: int = 1 << 28,
                 compression: Optional[str] = None, level: int = 3, block_tokens: Optional[int] = None,
                 overwrite: bool = False, chunk_checksum_bytes: int = 1 << 16) -> None:
        if not isinstance(vocab_size, (int, np.integer)) or vocab_size <= 0:
            raise ValueError(f"vocab_size must be a positive int, got {vocab_size!r}")
        if dtype is None:
            dtype = _dtype_for_vocab(int(vocab_size))
        name = np.dtype(dtype).name
        if name not in ("uint8", "uint16", "uint32"):
            raise ValueError(f"dtype must be uint8, uint16 or uint32 for the native format, got {name}")
        limit = 1 << (8 * np.dtype(name).itemsize)
        if vocab_size > limit:
            raise ValueError(f"vocab_size {vocab_size} does not fit {name} (at most {limit}); use a wider dtype")
        if shard_tokens <= 0 or (block_tokens is not None and block_tokens <= 0):
            raise ValueError("shard_tokens and block_tokens must be positive")
        if compression not in (None, "zstd"):
            raise ValueError(f"compression must be None or 'zstd', got {compression!r}")
        self.path = os.fspath(path)
        self.dtype = np.dtype(name)
        self.vocab_size = int(vocab_size)
        self._w: Optional[Any] = _core.Writer(self.path, dtype=name, vocab_size=int(vocab_size),
                                              shard_tokens=int(shard_tokens), compression=compression,
                                              level=int(level), block_tokens=int(block_tokens or 0),
                                              overwrite=bool(overwrite),
                                              chunk_checksum_bytes=int(chunk_checksum_bytes))
        self._counts: Tuple[int, int] = (0, 0)
        # per-document metadata (add_document(meta=)): one dict per document, None where none
        self._meta: Optional[List[Optional[Mapping[str, Any]]]] = None
        self._meta_types: Optional[Mapping[str, str]] = None

    def add_document(self, tokens: Any, meta: Optional[Mapping[str, Any]] = None) -> None:
        """Append one document (any 1-D integer array-like). Ids must be in ``[0, vocab_size)``.

        ``meta`` (``{"url": ..., "lang": ..., "quality": ...}``: int, float, str or None values)
        becomes the document's row of the dataset's metadata columns, written beside the shards
        (``tokenfeed.columns``) when the writer closes; documents given none get missing values."""
        if self._w is None:
            raise ValueError(self._closed_message)
        if meta is not None and not isinstance(meta, Mapping):
            raise TypeError(f"meta must be a dict of column values, got {type(meta).__name__}")
        n = self._w.counts[0]
        self._w.add_document(tokens)
        if meta is not None:
            if self._meta is None:
                self._meta = [None] * n
            self._meta.append(dict(meta))
        elif self._meta is not None:
            self._meta.append(None)

    def _written(self) -> Tuple[int, int]:
        c = self._w.counts if self._w is not None else None
        return c or self._counts

    def close(self) -> None:
        """Flush the last shard and publish the manifest (and the metadata columns). Idempotent."""
        if self._w is not None:
            self._counts = self._w.counts
            w, self._w = self._w, None
            w.finish()
            target = os.path.join(self.path, _views.COLUMNS_NAME)
            if self._meta is not None:
                rows = self._meta + [None] * (self._counts[0] - len(self._meta))
                names = list(dict.fromkeys(k for r in rows if r for k in r))
                cols = {k: [r.get(k) if r else None for r in rows] for k in names}
                fp = open(self.path).fingerprint
                _views.write_columns(target, self._counts[0], cols, types=self._meta_types, dataset_fingerprint=fp)
            elif os.path.lexists(target):
                os.unlink(target)  # the columns of the data this writer replaced

    def abort(self) -> None:
        """Discard everything written by this writer."""
        if self._w is not None:
            self._counts = self._w.counts
            w, self._w = self._w, None
            w.abort()
