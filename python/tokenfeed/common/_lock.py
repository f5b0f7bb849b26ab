"""Run locks: one process at a time writes into a given output.

A lock is an exclusive ``flock`` on a small file in the directory it guards, opened
relative to the directory's descriptor with ``O_NOFOLLOW`` (a symlink planted under its
name is refused, never followed). The kernel drops the lock when its holder dies, so a
killed run never leaves its output locked; the holder removes the file when it lets go,
and a process that locked a file that was removed meanwhile tries again, so two
processes never both hold one. The file holds the holder's pid and host, for the
message the next process gets. The C writer and merge lock ``.tokenfeed.lock`` the same
way (csrc/sources/safe_fs.c); ``tokenfeed convert`` and :class:`tokenfeed.PartWriter`
lock their own files with this module, so they can hold their lock across the writers
they run.
"""
from __future__ import annotations

import errno
import fcntl
import os
import socket
from types import TracebackType
from typing import Optional, Type

__all__ = ["RunLock"]


class RunLock:
    """Hold the lock file ``name`` in directory ``directory`` (which must exist) until :meth:`release`.

    Raises ``OSError(EBUSY)`` naming the holder and ``what`` when another process (or
    another :class:`RunLock` of this one) holds it.
    """

    def __init__(self, directory: str, name: str, what: str) -> None:
        self.directory = directory
        self.name = name
        self._dfd: Optional[int] = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._fd: Optional[int] = None
        try:
            self._acquire(what)
        except BaseException:
            os.close(self._dfd)
            self._dfd = None
            raise

    def _acquire(self, what: str) -> None:
        assert self._dfd is not None
        for _ in range(64):
            try:
                fd = os.open(self.name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=self._dfd)
            except OSError as e:
                if e.errno == errno.ELOOP:
                    raise OSError(errno.ELOOP, f"{os.path.join(self.directory, self.name)}: the lock file is a "
                                               f"symbolic link; refusing to follow it") from None
                raise
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 128, 0).decode("utf-8", "replace").split("\n")[0] or "a process"
                os.close(fd)
                raise OSError(errno.EBUSY, f"{self.directory}: another process is writing here ({holder} holds "
                                           f"{self.name}) and {what} would collide with it. Wait for it to finish, "
                                           f"or write somewhere else; nothing of the other run was touched.") from None
            except OSError as e:
                os.close(fd)
                if e.errno not in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP):
                    raise
                return  # a file system without flock: run unlocked (concurrent runs go undetected)
            try:
                now = os.stat(self.name, dir_fd=self._dfd, follow_symlinks=False)
            except FileNotFoundError:
                now = None
            mine = os.fstat(fd)
            if now is None or (now.st_ino, now.st_dev) != (mine.st_ino, mine.st_dev):
                os.close(fd)  # its holder removed it as we opened it: take the new one
                continue
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
            self._fd = fd
            return
        raise OSError(errno.EBUSY, f"{self.directory}/{self.name}: the lock file kept being replaced; another "
                                   f"process is writing here")

    def release(self) -> None:
        """Remove the lock file and let go of the lock. Idempotent."""
        fd, dfd, self._fd, self._dfd = self._fd, self._dfd, None, None
        try:
            if fd is not None and dfd is not None:
                try:
                    now = os.stat(self.name, dir_fd=dfd, follow_symlinks=False)
                    mine = os.fstat(fd)
                    if (now.st_ino, now.st_dev) == (mine.st_ino, mine.st_dev):
                        os.unlink(self.name, dir_fd=dfd)
                except OSError:
                    pass
        finally:
            if fd is not None:
                os.close(fd)
            if dfd is not None:
                os.close(dfd)

    def __enter__(self) -> "RunLock":
        return self

    def __exit__(self, et: Optional[Type[BaseException]], ev: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self.release()

    def __del__(self) -> None:
        if getattr(self, "_fd", None) is not None:
            self.release()
