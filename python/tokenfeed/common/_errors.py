"""The package's error classes that more than one module raises, below every module that raises
them (``FormatError`` comes from the C extension)."""
from __future__ import annotations

__all__ = ["StateError"]


class StateError(ValueError):
    """A saved loader state does not match this loader (other data or configuration)."""
