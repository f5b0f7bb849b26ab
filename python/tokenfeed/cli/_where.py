"""``tokenfeed where``: which steps, ranks and rows of an epoch range hold a document, found by running the
order backwards."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np

from ._explain import _Problem, _datasets, _loader_options, _one_line, make_loader

__all__ = ["add_parser", "cmd_where"]


@_one_line
def cmd_where(a: argparse.Namespace) -> int:
    a.rank, a.dp_size = 0, getattr(a, "dp_size", 1)
    loader = make_loader(a)
    if a.document is None:
        a.document = _document_by_value(loader, a)
    hits = loader.where(a.document, source=a.source, epochs=a.epochs)
    if a.json:
        json.dump({"document": a.document, "source": a.source, "epochs": a.epochs or "0:1", "rows": hits}, sys.stdout)
        print()
        return 0
    where = f"document {a.document}" + (f" of source {a.source}" if len(_datasets(loader)) > 1 else "")
    if not hits:
        print(f"{where}: in no step of epochs {a.epochs or '0:1'} (empty, or dropped by the packing: "
              f"'tokenfeed inspect --seq-len' shows what is dropped)")
        return 0
    print(f"{where}: {len(hits)} row{'s' if len(hits) != 1 else ''} in epochs {a.epochs or '0:1'} "
          f"(dp-size {a.dp_size})")
    for h in hits:
        print(f"  step {h['step']}  rank {h['rank']}  row {h['row']}  (position {h['position']}, epoch {h['epoch']})")
    return 0


def _document_by_value(loader: Any, a: argparse.Namespace) -> int:
    """The document --url / --value names, found in its dataset's metadata columns."""
    if a.url is not None:
        col, val = "url", a.url
    elif a.value and "=" in a.value:
        col, val = a.value.split("=", 1)
    else:
        raise _Problem("give --document N, --url URL or --value COLUMN=VALUE")
    ds = _datasets(loader)[a.source]
    hits = np.flatnonzero(ds.columns().match(col, [val]))
    if len(hits) != 1:
        raise _Problem(f"{col} {val!r} names {len(hits)} documents of {ds.columns_path}; give --document N")
    return int(hits[0])


def add_parser(sub: Any) -> None:
    """Add the ``where`` command to an argparse subparsers object."""
    w = sub.add_parser("where", help="which steps of an epoch range hold a document",
                       description="The steps, ranks and rows whose batches hold tokens of a document, found "
                                   "by running the order backwards (no token is read, the range is not visited).")
    _loader_options(w)
    w.add_argument("--document", type=int, help="the document's index in its dataset")
    w.add_argument("--url", help="the document whose url column is this (as --value url=URL)")
    w.add_argument("--value", metavar="COLUMN=VALUE", help="the document whose metadata column COLUMN holds VALUE "
                                                          "(docs/views.md)")
    w.add_argument("--source", type=int, default=0, help="the dataset's index among DATA in a mixture (default 0)")
    w.add_argument("--epochs", metavar="A:B", help="epochs A to B-1 (default 0:1)")
    w.set_defaults(func=cmd_where)
