"""``tokenfeed merge``: join the parts written by independent tasks into one dataset (no copy)."""
from __future__ import annotations

import argparse
import time
from typing import Any

__all__ = ["add_parser", "cmd_merge"]


def cmd_merge(a: argparse.Namespace) -> int:
    from ..sources._parts import merge_parts, read_parts

    t0 = time.monotonic()
    n = len(read_parts(a.path))
    ds = merge_parts(a.path, overwrite=a.overwrite)
    print(f"merged {n} part(s) into {a.path}: {ds.num_tokens:,} tokens, {ds.num_documents:,} documents, "
          f"{ds.num_files} shard(s), dtype {ds.dtype.name}, vocab_size {ds.vocab_size}; fingerprint {ds.fingerprint} "
          f"({time.monotonic() - t0:.1f}s)")
    return 0


def add_parser(sub: Any) -> None:
    m = sub.add_parser("merge", help="join the parts written by independent tasks into one dataset (no copy)",
                       description="Write PATH/tokenfeed.manifest naming the shards of every part under "
                                   "PATH/parts/ (written by tokenfeed.PartWriter or the datatrove step), part 0 "
                                   "first. Copies no token data. Refuses a missing part, a part twice, parts of "
                                   "runs with different part counts, and parts written with different settings.")
    m.add_argument("path", metavar="PATH", help="dataset directory holding parts/")
    m.add_argument("--overwrite", action="store_true",
                   help="replace a dataset in PATH that is not a merge of parts (a merge is always replaced)")
    m.set_defaults(func=cmd_merge)
