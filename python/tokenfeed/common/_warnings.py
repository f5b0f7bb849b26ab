"""The package's warning classes, below every module that emits them."""
from __future__ import annotations

import warnings
from typing import Any

__all__ = ["DataWarning", "PerformanceWarning", "renamed"]


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


def _description(name: str) -> str:
    from .. import _core

    return next(str(r["description"]) for r in _core.settings() if r["name"] == name)


def renamed(name: str, value: Any, old_name: str, old_value: Any, default: Any = None, stacklevel: int = 4) -> Any:
    """A setting given by its new name, or by its older one (with a DeprecationWarning pointing
    ``stacklevel`` frames up: at the caller of the function that takes both names)."""
    if old_value is None:
        return value
    if value is not None and value != default:
        raise TypeError(f"{old_name}= is the older name of {name}=: pass only {name}=")
    warnings.warn(f"{old_name}= is now {name}= ({_description(name)}); the older name will be "
                  f"removed in a later release", DeprecationWarning, stacklevel=stacklevel)
    return old_value
