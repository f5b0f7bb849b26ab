"""The package's warning classes, below every module that emits them."""
from __future__ import annotations

__all__ = ["DataWarning", "PerformanceWarning"]


class PerformanceWarning(UserWarning):
    """A loader configuration that works, but will be much slower than it needs to be.

    Emitted once per loader, e.g. when reading zstd-compressed data would decode more than
    8x the tokens it delivers (a full shuffle over large compressed blocks). The same text
    is in ``stats()["zstd"]["note"]``. Silence with ``warnings.filterwarnings("ignore",
    category=tokenfeed.PerformanceWarning)``.
    """


class DataWarning(UserWarning):
    """Data that opens and reads, but whose tokens look wrong.

    Emitted by :func:`tokenfeed.open` when the bytes of a headerless token file, read with the
    ``dtype`` passed, show the signature of another dtype (ids paired up into values no
    vocabulary reaches; every other id 0, the high half of a wider id); ``tokenfeed inspect``
    prints the same text. The check reads a fixed-size sample from a few places of the file.
    Silence with ``warnings.filterwarnings("ignore", category=tokenfeed.DataWarning)``.
    """
