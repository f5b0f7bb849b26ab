"""A minimal progress bar for long operations (verify, convert, dataset generation).

It draws on stderr only when stderr is a terminal, so logs and CI output stay clean;
``tqdm`` is used instead when it is installed and the caller asks for it.
"""
from __future__ import annotations

import sys
import time
from typing import Optional, TextIO


class Progress:
    """Callable ``(done, total)`` that renders a one-line bar, at most 10 times a second."""

    def __init__(self, desc: str, unit: str = "B", enabled: Optional[bool] = None, stream: Optional[TextIO] = None) -> None:
        self.desc = desc
        self.unit = unit
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self._last = 0.0
        self._start = time.monotonic()
        self._drawn = False

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last < 0.1 and done < total:
            return
        self._last = now
        frac = done / total if total else 1.0
        width = 30
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        rate = done / max(now - self._start, 1e-9)
        self.stream.write(f"\r{self.desc} [{bar}] {frac * 100:5.1f}% {_human(done)}/{_human(total)}{self.unit} {_human(rate)}{self.unit}/s")
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False


def _human(n: float) -> str:
    for suffix in ("", "K", "M", "G", "T", "P"):
        if abs(n) < 1000:
            return f"{n:.0f}{suffix}" if suffix == "" else f"{n:.1f}{suffix}"
        n /= 1000
    return f"{n:.1f}E"
