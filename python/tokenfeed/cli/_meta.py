"""``tokenfeed meta``: per-document metadata columns beside a dataset (docs/views.md).

::

    tokenfeed meta attach data/train table.jsonl --key doc_index
    tokenfeed meta attach data/megatron_text_document urls.csv --key url
    tokenfeed meta show data/train --where "lang == 'en'"

``attach`` writes (or extends) the dataset's column file and never touches its token files.
"""
from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np

from ..sources._dataset import open as tf_open

__all__ = ["add_parser", "cmd_meta_attach", "cmd_meta_show"]


def cmd_meta_attach(a: argparse.Namespace) -> int:
    ds = tf_open(a.data if len(a.data) > 1 else a.data[0], dtype=a.dtype, format=a.format)
    types = dict(t.split("=", 1) for t in a.type) if a.type else None
    out = ds.attach_columns(a.table, key=a.key, path=a.out, types=types)
    cols = ds.columns(out)
    if not a.quiet:
        kinds = ", ".join(f"{k} ({v})" for k, v in cols.types.items())
        print(f"{out}: {cols.num_documents:,} documents, columns {kinds}")
    return 0


def cmd_meta_show(a: argparse.Namespace) -> int:
    ds = tf_open(a.data if len(a.data) > 1 else a.data[0], dtype=a.dtype, format=a.format)
    cols = ds.columns(a.columns_file)
    ids = np.flatnonzero(cols.eval(a.where)) if a.where else np.arange(cols.num_documents)
    if a.json:
        print(json.dumps({"path": cols.path, "num_documents": cols.num_documents, "columns": cols.types,
                          "selected": int(len(ids))}))
        return 0
    print(f"{cols.path}: {cols.num_documents:,} documents; columns: "
          + ", ".join(f"{k} ({v})" for k, v in cols.types.items()))
    if a.where:
        print(f"where {a.where}: {len(ids):,} documents")
    shown = ids[: a.head]
    vals: dict[str, Any] = {c: cols.values(c, shown) for c in cols.names}
    for k, d in enumerate(shown):
        print(f"  {int(d)}: " + "  ".join(f"{c}={json.dumps(vals[c][k], ensure_ascii=False)}" for c in cols.names))
    return 0


def add_parser(sub: Any) -> None:
    m = sub.add_parser("meta", help="per-document metadata columns beside a dataset (attach, show)",
                       description="Metadata columns (url, lang, quality, ...) beside a dataset, for filters, "
                                   "mixtures by column and provenance (docs/views.md).")
    msub = m.add_subparsers(dest="meta_command", required=True)
    at = msub.add_parser("attach", help="attach a table's columns to a dataset without touching its token files",
                         description="Read TABLE (.jsonl, .csv, .tsv, or .parquet with pyarrow) and write its fields "
                                     "as columns of DATA's metadata, one row per document, matched by --key. "
                                     "Columns already attached are kept (replaced where the table has the same "
                                     "name). The token files are never written.")
    at.add_argument("data", nargs="+", metavar="DATA", help="the dataset (any format tokenfeed reads)")
    at.add_argument("table", metavar="TABLE")
    at.add_argument("--key", default="doc_index",
                    help="doc_index (a field holding the document's index; default) or the name of a column the "
                         "dataset already has (url) whose values name the documents")
    at.add_argument("--out", metavar="PATH", help="where to write the column file (default: beside the data)")
    at.add_argument("--type", action="append", metavar="NAME=TYPE",
                    help="a column's type: int64, float64, string or category (default: inferred)")
    at.add_argument("--dtype", help="token dtype of headerless files")
    at.add_argument("--format", help="the data's format, when not detected")
    at.add_argument("-q", "--quiet", action="store_true")
    at.set_defaults(func=cmd_meta_attach)
    sh = msub.add_parser("show", help="list a dataset's columns and some documents' values")
    sh.add_argument("data", nargs="+", metavar="DATA")
    sh.add_argument("--where", metavar="EXPR", help="show only documents satisfying the filter")
    sh.add_argument("--head", type=int, default=10, help="documents shown (default 10)")
    sh.add_argument("--columns-file", metavar="PATH", help="the column file (default: beside the data)")
    sh.add_argument("--dtype")
    sh.add_argument("--format")
    sh.add_argument("--json", action="store_true")
    sh.set_defaults(func=cmd_meta_show)
