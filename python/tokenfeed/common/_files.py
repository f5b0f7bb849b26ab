"""Files written whole and put in place at once, safely on directories other users share."""
from __future__ import annotations

import os
import secrets
from typing import Iterable, Tuple


def write_atomic(path: str, pieces: Iterable[Tuple[int, bytes]], size: int) -> None:
    """Write a file of ``size`` bytes (``pieces``: offset and bytes; the rest zero) at ``path``:
    a new file beside it, created exclusively and never through a symbolic link, synced, then
    renamed over ``path``. A symbolic link at ``path`` is replaced, not followed; a reader sees
    the old file or the new one, never a part. The directory is reached once, by descriptor."""
    d, base = os.path.split(os.path.abspath(path))
    dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        tmp = f".{base}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dfd)
        try:
            try:
                os.ftruncate(fd, size)
                for off, data in pieces:
                    if data:
                        os.pwrite(fd, data, off)
                os.fsync(fd)
            finally:
                os.close(fd)
            # rename replaces whatever has the name (a symlink included) and follows none
            os.rename(tmp, base, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
            raise
        os.fsync(dfd)
    finally:
        os.close(dfd)
