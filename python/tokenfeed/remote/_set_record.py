"""A remote shard set's files, listed once per node (docs/remote.md, "Metadata, once per node").

A glob (``s3://bucket/tokens/*.bin``) or a directory URL of foreign files is expanded by a
listing of the store before the C core opens the files it names; the core keeps what that
open fetched in the node's metadata record, keyed by those files. This module keeps the
expansion beside it, in the cache's ``meta/`` directory (``<key>.tfset``, the key a hash of
the paths given), so that a restart or another process of the node opening the same paths
neither lists nor sends any request: the expansion is used only while the core still holds
the record of opening exactly those files (the record is dropped when a read finds an
object changed or missing, and then the set is listed again).

Processes of a node starting together list once: the first takes ``<key>.tfset.lock``
(``flock``; the kernel drops it if that process dies) and holds it until its open is
recorded; the others wait for it (answering Ctrl-C, saying so every 10 s through the
``tokenfeed`` logger, giving up after 10 minutes) and then read its expansion. Nothing here
makes an open fail: a cache whose ``meta/`` cannot be used just means each process lists.
Files are opened relative to the directory's descriptor without following symlinks, and
written to a temporary name and renamed into place.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import stat
import time
from typing import Callable, List, Optional, Sequence

__all__ = ["SetRecord"]

_log = logging.getLogger("tokenfeed")

WAIT_LIMIT = 600.0  # seconds a process waits for another one listing the same set
_POLL = 0.05
_SAY_EVERY = 10.0
_MAX_RECORD = 64 << 20  # bytes of a set record (the URLs of a set's objects)


def _key(paths: Sequence[str]) -> str:
    return hashlib.sha256(json.dumps(["tokenfeed set record 1", list(paths)]).encode()).hexdigest()[:32]


class SetRecord:
    """The node's record of which files ``paths`` (remote globs or directory URLs) name.

    ``urls()`` gives the recorded files when ``recorded(files)`` says the core can open
    them from its record; otherwise the caller lists, opens, and calls ``save(files)``.
    :meth:`close` releases the lock that :meth:`urls` took.
    """

    def __init__(self, cache_dir: str, paths: Sequence[str]) -> None:
        self._name = _key(paths) + ".tfset"
        self._dfd: Optional[int] = None
        self._lock_fd: Optional[int] = None
        self._what = ", ".join(paths)
        self._dir = os.path.join(cache_dir, "meta")
        try:
            fd = os.open(self._dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return  # no usable meta/ (the cache made before it existed): every process lists
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            os.close(fd)  # (the cache refuses such a directory; never trust one here)
            return
        self._dfd = fd

    def close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # drops the flock
            self._lock_fd = None
        if self._dfd is not None:
            os.close(self._dfd)
            self._dfd = None

    def _read(self) -> Optional[List[str]]:
        if self._dfd is None:
            return None
        try:
            # O_NONBLOCK: a FIFO under the name must not hold the open; type, owner, mode and
            # size are then checked on the descriptor before a byte is read
            fd = os.open(self._name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=self._dfd)
        except OSError:
            return None
        try:
            with os.fdopen(fd, "rb") as f:
                st = os.fstat(f.fileno())
                if (not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022
                        or st.st_size > _MAX_RECORD):
                    _log.warning("%s/%s: not used: not a regular file of this user's that only this user may "
                                 "write, of at most %d bytes; the set is listed. Remove it.", self._dir, self._name,
                                 _MAX_RECORD)
                    return None
                data = json.loads(f.read(_MAX_RECORD).decode("utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(data, list) or not data or not all(isinstance(u, str) for u in data):
            return None
        return data

    def _lock(self) -> None:
        """Wait for (then hold) the lock of this set's listing, within WAIT_LIMIT."""
        assert self._dfd is not None
        try:
            fd = os.open(self._name + ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                         dir_fd=self._dfd)
        except OSError:
            return  # (a symlink planted under its name, or no room): list without it
        t0 = last = time.monotonic()
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self._lock_fd = fd
                return
            except BlockingIOError:
                pass
            except OSError as e:
                os.close(fd)
                if e.errno not in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP):
                    raise
                return  # a file system without flock: each process lists
            now = time.monotonic()
            if now - t0 >= WAIT_LIMIT:
                os.close(fd)
                _log.warning("gave up waiting for another process of this node to list %s after %.0f s: "
                             "listing it here", self._what, now - t0)
                return
            if now - last >= _SAY_EVERY:
                last = now
                _log.warning("waiting for another process of this node to list %s (%.0f s)", self._what, now - t0)
            try:
                time.sleep(_POLL)  # Ctrl-C interrupts the wait here
            except BaseException:
                os.close(fd)
                raise

    def urls(self, recorded: Callable[[List[str]], bool]) -> Optional[List[str]]:
        """The set's files as this node recorded them, if the core still holds the record of
        opening them (``recorded``); else None, with this set's lock held until :meth:`close`
        (another process of the node that lists it meanwhile is waited for first)."""
        if self._dfd is None:
            return None
        got = self._read()
        if got is not None and recorded(got):
            return got
        self._lock()
        got = self._read()  # written by the process we waited for
        if got is not None and recorded(got):
            return got
        return None

    def save(self, files: Sequence[str]) -> None:
        """Record ``files`` as this set's, once the core has recorded their open. Best effort."""
        if self._dfd is None or not files:
            return
        tmp = f".{self._name}.{os.getpid()}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                         dir_fd=self._dfd)
        except OSError:
            return
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(json.dumps(list(files)).encode("utf-8"))
            os.rename(tmp, self._name, src_dir_fd=self._dfd, dst_dir_fd=self._dfd)
        except OSError:
            try:
                os.unlink(tmp, dir_fd=self._dfd)
            except OSError:
                pass
