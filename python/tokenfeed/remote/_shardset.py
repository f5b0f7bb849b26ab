"""Shard sets: a directory of foreign token files, or a glob, expanded into the sorted list of
files that :func:`tokenfeed.open` concatenates (docs/format.md, "Shard sets"). Local sets are
listed by the core (csrc/sources/pathspec.c, one listing per directory, companion files found
in it); this module expands remote ones, by the same rules:

* A directory without a ``tokenfeed.manifest`` (local, or a URL ending in ``/``) holds files of
  one format: ``.npy`` files, llm.c shards, Megatron ``.bin``/``.idx`` pairs, or headerless
  files (with ``dtype=``). Files whose names start with ``.`` or ``_`` (``_SUCCESS``) and a
  dataset's documentation and configs (``.md``, ``.json``, ``.txt``, ...) are not data; a
  document index beside its file (datatrove's ``X.index``, ``X.tfdocs``, OLMo's ``x.csv.gz``
  beside ``x.npy``) belongs to it. A directory that mixes formats, or
  holds none, is an error that says what it holds.
* A path or URL with ``*``, ``?`` or ``[`` matches names segment by segment (``*`` never
  crosses ``/``), as :mod:`glob` does; a remote glob is matched against one listing of the
  store under the pattern's fixed prefix.

The order is the sorted order of the names, so every process of a job sees the same set in
the same order. Both Megatron files of a pair become one entry (the ``.bin``).
"""
from __future__ import annotations

import fnmatch
import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .. import _core
from . import _remote

MANIFEST = "tokenfeed.manifest"
_MAGIC = "*?["


def is_glob(path: str) -> bool:
    """Whether ``path`` has glob characters in its file name part (URL or local)."""
    return any(c in path for c in _MAGIC)


def _collapse(names: Sequence[str]) -> Tuple[List[str], Dict[str, List[str]]]:
    """Sorted names, Megatron pairs as their ``.bin`` and datatrove ``.index`` files dropped
    beside their data file; with the names grouped by kind (for the mixed-format error)."""
    present = set(names)
    out: List[str] = []
    kinds: Dict[str, List[str]] = {}
    for n in sorted(present):
        if n.endswith(".idx") and n[:-4] + ".bin" in present:
            continue  # counted with its .bin
        if n.endswith(".index") and n[:-6] in present or n.endswith(".tfdocs") and n[:-7] in present:
            continue  # a document index (datatrove's, or tokenfeed's for eos_id=) belongs to its data file
        if n.endswith(".csv.gz") and n[:-7] + ".npy" in present:
            continue  # OLMo's document metadata belongs to its .npy
        if n.endswith(".bin") and n[:-4] + ".idx" in present:
            kind = "Megatron .bin/.idx pairs"
        else:
            base = n.rsplit("/", 1)[-1]
            ext = os.path.splitext(base)[1]
            kind = f"{ext} files" if ext else "files without an extension"
        kinds.setdefault(kind, []).append(n)
        out.append(n)
    return out, kinds


def _describe(kinds: Dict[str, List[str]]) -> str:
    parts = []
    for kind, names in sorted(kinds.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        shown = ", ".join(n.rsplit("/", 1)[-1] for n in names[:3])
        more = f", ... ({len(names) - 3} more)" if len(names) > 3 else ""
        parts.append(f"{len(names)} {kind} ({shown}{more})")
    return "; ".join(parts)


# Beside the shards of a dataset repository: its card, configs, another tool's index
# (LitData's and MosaicML's index.json), scripts. Never token data in a format read here.
_NOT_DATA = (".md", ".json", ".yaml", ".yml", ".txt", ".py", ".sh", ".toml", ".cfg")


def _not_data(base: str) -> bool:
    """Hidden files, markers (_SUCCESS) and the documentation and configs of a dataset."""
    return base.startswith((".", "_")) or base.lower().endswith(_NOT_DATA)


def _native_leftovers(names: Sequence[str]) -> bool:
    """Native shards (or a writer's temporary files) without a manifest: a native dataset whose
    write did not finish, which the core reports as such."""
    return any(n.endswith((".tfs", ".tmp")) for n in names)


def _one_format(where: str, names: Sequence[str], others: Sequence[str]) -> List[str]:
    """The data files of a directory listing (full names), checked to be of one format."""
    data = [n for n in names if not _not_data(n.rsplit("/", 1)[-1])]
    out, kinds = _collapse(data)
    if not out:
        found = f"{len(others)} subdirectories ({', '.join(sorted(others)[:3])})" if others else "nothing"
        skipped = sorted(set(names) - set(data))
        if skipped:
            shown = ", ".join(n.rsplit("/", 1)[-1] for n in skipped[:3]) + (", ..." if len(skipped) > 3 else "")
            found += f" and {len(skipped)} files that are not token data ({shown})"
        raise _core.FormatError(f"{where}: no manifest ({MANIFEST}) and no token files: found {found}. Expected a "
                                "tokenfeed dataset, or files of one format (.npy, llm.c, Megatron .bin/.idx pairs, "
                                "headerless with dtype=)")
    if len(kinds) > 1:
        raise _core.FormatError(f"{where}: holds files of more than one format: {_describe(kinds)}. A directory "
                                "opens as one shard set of one format: open a glob (e.g. dir/*.bin) or a list of "
                                "paths instead")
    return out


def _local_set(path: str) -> bool:
    """Whether a local path names a shard set the core lists: a glob that names no file, or a
    directory without a manifest."""
    if is_glob(path) and not os.path.lexists(path):
        return True
    return os.path.isdir(path) and not os.path.exists(os.path.join(path, MANIFEST))


def local_sets(paths: Sequence[str]) -> bool:
    """Whether every entry of ``paths`` is a local shard set (a glob, or a directory without a
    manifest): what the node's catalog may hold under these paths, unexpanded."""
    return bool(paths) and all(not _remote.is_url(p) and _local_set(p) for p in paths)


def names_sets(paths: Sequence[str]) -> bool:
    """Whether local ``paths`` may name a shard set that the core expanded into its files: a
    glob or a path ending in ``/`` among them, or one directory without a manifest (a
    directory among several files is looked at only when it ends in ``/``)."""
    if any(is_glob(p) or p.endswith("/") for p in paths):
        return True
    return len(paths) == 1 and _local_set(paths[0])


def _fixed_prefix(key: str) -> str:
    """The part of ``key`` before the first segment that holds a glob character."""
    segs = key.split("/")
    fixed: List[str] = []
    for s in segs:
        if is_glob(s):
            break
        fixed.append(s)
    return "/".join(fixed) + "/" if fixed else ""


def _match(pattern_key: str, key: str) -> bool:
    ps, ks = pattern_key.split("/"), key.split("/")
    return len(ps) == len(ks) and all(fnmatch.fnmatchcase(k, p) for p, k in zip(ps, ks))


Lister = Callable[[str], Any]


def _remote_glob(url: str, lister: Lister) -> List[str]:
    u = _remote.parse_url(url)
    prefix_url = f"{u.scheme}://{u.bucket}/{_fixed_prefix(u.key)}"
    hits = []
    for obj_url, _size, _version in _remote.list_objects(lister, prefix_url):
        key = _remote.parse_url(obj_url).key
        if _match(u.key, key):
            hits.append(obj_url)
    if not hits:
        raise FileNotFoundError(f"{url}: no object matches this pattern (listed {prefix_url})")
    return _collapse(hits)[0]


def _remote_dir(url: str, lister: Lister) -> Optional[List[str]]:
    """The objects directly under ``url`` (which ends in ``/``); None when the core opens it:
    it holds a manifest (a native dataset), or nothing, or native shards without a manifest
    (a write that did not finish, which the core reports)."""
    names, subdirs = [], set()
    for obj_url, _size, _version in _remote.list_objects(lister, url):
        rest = obj_url[len(url):] if obj_url.startswith(url) else ""
        if not rest:
            continue
        if "/" in rest:
            subdirs.add(rest.split("/", 1)[0])
        elif rest == MANIFEST:
            return None
        else:
            names.append(url + rest)
    if _native_leftovers(names) or not (names or subdirs):
        return None  # the core says what is missing ("no manifest")
    return _one_format(url, names, sorted(subdirs))


def data_catalog_spec(path: str) -> Optional[Tuple[str, str]]:
    """For a local shard set in one directory (a glob of names in it, or a directory without a
    manifest): ``(prefix, pattern)``, how its files are named (``"dir/"``, or ``""`` for names
    in the working directory) and the glob of their names (``""`` for the directory's data
    files), which key its catalog beside the data; else None."""
    if _remote.is_url(path):
        return None
    if is_glob(path) and not os.path.exists(path):
        d, name = os.path.split(path)
        if is_glob(d) or not name:
            return None
        return (d + "/" if d and not d.endswith("/") else d), name
    if os.path.isdir(path) and not os.path.exists(os.path.join(path, MANIFEST)):
        return path.rstrip("/") + "/" if path.rstrip("/") else "/", ""
    return None


def remote_set_spec(path: str) -> Optional[Tuple[str, str]]:
    """For a remote shard set under one prefix (a glob of names under it, or a directory URL):
    ``(prefix_url, pattern)``, the prefix (ending in ``/``) and the glob of the names under it
    (``""`` for a directory's data objects), which key its catalog beside the data; else None."""
    if not _remote.is_url(path):
        return None
    u = _remote.parse_url(path)
    if is_glob(u.key):
        d, _, name = u.key.rpartition("/")
        if is_glob(d) or not name:
            return None
        return f"{u.scheme}://{u.bucket}/{d + '/' if d else ''}", name
    if path.endswith("/"):
        return f"{u.scheme}://{u.bucket}/{u.key}", ""
    return None


def local_set_dirs(paths: Sequence[str]) -> Optional[List[Tuple[str, Tuple[int, int, int, int]]]]:
    """When every entry of ``paths`` is a local shard set (a glob in its last path component,
    or a directory without a manifest), the directories that hold their files, each with its
    identity now (device, inode, size, modification time in ns); else None.

    Taken before the sets are listed: the node's catalog records the files under these
    identities, and a later open that finds the directories unchanged opens the files from
    the catalog without listing the directories again (docs/format.md, "The node's catalog")."""
    dirs: List[str] = []
    for p in paths:
        spec = data_catalog_spec(p)
        if spec is None:
            return None  # a file, a URL, or a glob over several directory levels
        d = spec[0].rstrip("/") or ("/" if spec[0] else ".")
        if d not in dirs:
            dirs.append(d)
    out = []
    for d in dirs:
        try:
            st = os.stat(d)
        except OSError:
            return None
        out.append((d, (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)))
    return out


Listing = Tuple[str, List[Tuple[str, int, str]]]


def expand_listed(paths: Sequence[str], list_objects: Lister) -> Tuple[List[str], Optional[Listing]]:
    """:func:`expand` of remote paths, with the one listing it made when the files all lie under
    its prefix (``(prefix_url, [(url, size, version), ...])``, else None): the open learns the
    objects' sizes and versions from it instead of listing them again.

    ``list_objects`` is the transport's bound ``list`` only, never the store: a listing that
    Ctrl-C interrupts runs on in its thread, and must not keep the store alive with it."""
    listings: List[Listing] = []

    def lister(prefix_url: str) -> Any:
        objects: List[Tuple[str, int, str]] = []
        listings.append((prefix_url, objects))
        for obj in list_objects(prefix_url):
            objects.append(obj)
            yield obj

    files = expand(paths, lister)
    if len(listings) == 1 and all(f.startswith(listings[0][0]) for f in files):
        return files, listings[0]
    return files, None


def expand(paths: Sequence[str], lister: Optional[Lister] = None) -> List[str]:
    """``paths`` with every remote glob and directory URL replaced by its objects (local
    directories and globs are listed by the core, csrc/sources/pathspec.c, as they are opened).

    ``lister(prefix_url)`` yields ``(url, size, version)`` of every object under a remote
    prefix; it is called only for remote globs and remote directories (URLs ending in ``/``)."""
    out: List[str] = []
    for p in paths:
        if _remote.is_url(p):
            if lister is not None and is_glob(_remote.parse_url(p).key):
                out.extend(_remote_glob(p, lister))
                continue
            if lister is not None and p.endswith("/"):
                files = _remote_dir(p, lister)
                out.extend([p] if files is None else files)
                continue
            out.append(p)
        else:
            out.append(p)  # a local directory or glob: the core lists it (csrc/sources/pathspec.c)
    return out
