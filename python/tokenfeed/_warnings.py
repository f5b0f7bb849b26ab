"""The package's warning classes, below every module that emits them."""
from __future__ import annotations

__all__ = ["PerformanceWarning"]


class PerformanceWarning(UserWarning):
    """A loader configuration that works, but will be much slower than it needs to be.

    Emitted once per loader, e.g. when reading zstd-compressed data would decode more than
    8x the tokens it delivers (a full shuffle over large compressed blocks). The same text
    is in ``stats()["zstd"]["note"]``. Silence with ``warnings.filterwarnings("ignore",
    category=tokenfeed.PerformanceWarning)``.
    """
