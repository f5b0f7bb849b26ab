"""The tokenfeed benchmark: will the GPUs wait for data?

Run it as ``tokenfeed bench``, ``python -m tokenfeed_bench`` or
``python benchmarks/bench_tokens.py``; see ``--help`` and docs/performance.md.

A separate top-level package, shipped in the wheel beside ``tokenfeed`` but never
imported by it. Parts: ``data`` (generated streams, shard layouts, the
larger-than-memory file), ``measure`` and ``worker`` (one loader per child process),
``loaders`` (one module per loader and peer), ``peers`` and ``install`` (peer
environments), ``ceiling`` (``ceiling.c``), ``fio``, ``suites`` (the run),
``report`` and ``plot``.
"""
from __future__ import annotations

from typing import List, Optional

__all__ = ["main"]


def main(argv: Optional[List[str]] = None) -> int:
    """Run the benchmark with command-line arguments; returns the exit status."""
    from .cli import main as _main

    return _main(argv)
