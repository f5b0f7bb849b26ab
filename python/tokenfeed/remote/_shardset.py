"""Shard sets: a directory of foreign token files, or a glob, that :func:`tokenfeed.open` expands
into the sorted list of files it concatenates (docs/format.md, "Shard sets"). The core expands
them, local and remote alike, by one set of rules (csrc/sources/pathspec.c; remote ones from one
listing of their prefix per node, csrc/remote/remote_spec.c). This module only tells which paths
name a set, and how a set's catalog beside the data is keyed.
"""
from __future__ import annotations

import os
from typing import List, Optional, Sequence, Tuple

from . import _remote

MANIFEST = "tokenfeed.manifest"
_MAGIC = "*?["


def is_glob(path: str) -> bool:
    """Whether ``path`` has glob characters in its file name part (URL or local)."""
    return any(c in path for c in _MAGIC)


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
