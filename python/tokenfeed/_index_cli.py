"""``tokenfeed index``: build the document index of headerless token files split at an
end-of-document id, so that best-fit and document packing can place their documents.

::

    tokenfeed index data/part-0-00000.npy --dtype uint32 --eos-id 100257
"""
from __future__ import annotations

import argparse
import os
from typing import Any

from ._dataset import build_index, default_index_dir

__all__ = ["add_parser", "cmd_index"]


def cmd_index(a: argparse.Namespace) -> int:
    for p in a.path:
        out = build_index(p, dtype=a.dtype, eos_id=a.eos_id, index_dir=a.index_dir)
        if not a.quiet:
            print(f"{p}: {out}")
    return 0


def add_parser(sub: Any) -> None:
    """Add the ``index`` command to an argparse subparsers object."""
    i = sub.add_parser("index", help="build the document index of headerless token files split at an eos id",
                       description="Scan headerless token files (nanoGPT, OLMo, datatrove) once for the "
                                   "end-of-document id and write each one's document index, PATH.tfdocs "
                                   "beside it, or in the node's index directory when that directory is "
                                   "read-only. OLMo's metadata (x.csv.gz beside x.npy) is used when present. "
                                   "tokenfeed.open(..., eos_id=N) reads it; an index whose data file "
                                   "changed is refused until it is rebuilt here (docs/format.md).")
    i.add_argument("path", nargs="+", metavar="PATH", help="headerless token file(s)")
    i.add_argument("--dtype", required=True, help="token dtype of the files (uint16, uint32, ...)")
    i.add_argument("--eos-id", type=int, required=True, help="the id that ends every document")
    i.add_argument("--index-dir", default=None,
                   help=f"where indexes go when the data's directory is read-only (default: $TOKENFEED_INDEX_DIR "
                        f"or {default_index_dir().replace(os.path.expanduser('~'), '~')})")
    i.add_argument("-q", "--quiet", action="store_true", help="print nothing")
    i.set_defaults(func=cmd_index)
