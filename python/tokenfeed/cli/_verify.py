"""``tokenfeed verify``: check every checksum, document index and token id."""
from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from ._common import PROG, _progress_option, _source_options

__all__ = ["add_parser", "cmd_verify"]


def cmd_verify(a: argparse.Namespace) -> int:
    from .._core import FormatError
    from ..sources._dataset import open as tf_open

    t0 = time.monotonic()
    ds = tf_open(a.path, dtype=a.dtype, format=a.format)  # errors here: the generic one-line report
    try:
        ds.verify(threads=a.threads, progress=a.progress)
    except (FormatError, OSError) as e:
        if a.debug:
            raise
        print(f"{PROG} verify: FAILED: {e}", file=sys.stderr)
        return 1
    vocab = f"all ids < {ds.vocab_size}" if ds.vocab_size else "vocab size unknown: ids not range-checked"
    print(f"OK  {ds.num_tokens:,} tokens, {ds.num_documents:,} documents, {ds.num_files} file(s) ({ds.format}); "
          f"{vocab}; fingerprint {ds.fingerprint} ({time.monotonic() - t0:.1f}s)")
    return 0


def add_parser(sub: Any) -> None:
    v = sub.add_parser("verify", help="check every checksum, document index and token id (< vocab size)",
                       description="Full verification on several threads. Prints OK and exits 0, or names the "
                                   "failing file and field and exits 1.")
    v.add_argument("path", nargs="+", metavar="PATH", help="dataset directory, shard, or any readable token file(s); local, or a URL (s3://, "
                        "gs://, az://, https://) whose chunks are fetched through the node's cache")
    _source_options(v)
    v.add_argument("--threads", type=int, default=0, help="threads (default: number of cores)")
    _progress_option(v)
    v.set_defaults(func=cmd_verify)
