"""``tokenfeed index``: with ``--eos-id``, build the document index of headerless token files
split at an end-of-document id, so that best-fit and document packing can place their
documents; without it, write a shard set's catalog beside its data, so that every machine
opens the set without listing its directory or reading its files, or a tokenfeed dataset's
own catalog (tokenfeed.catalog), which a remote open reads instead of every shard's header.

::

    tokenfeed index data/part-0-00000.npy --dtype uint32 --eos-id 100257
    tokenfeed index 'fineweb10B/fineweb_train_*.bin'
    tokenfeed index 's3://bucket/fineweb10B/fineweb_train_*.bin'   # the catalog stored beside the objects
    tokenfeed index my_dataset/            # a tokenfeed dataset written before catalogs
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from ..remote import _remote
from ..sources._dataset import build_catalog, build_index, default_index_dir
from ..sources._dataset import open as tf_open

__all__ = ["add_parser", "cmd_index"]


def cmd_index(a: argparse.Namespace) -> int:
    for p in a.path:
        if a.eos_id is None:
            t = time.perf_counter()
            if _remote.is_url(p) and not a.quiet:  # minutes at 10^5 objects: say what it does meanwhile
                print(f"{p}: listing the set and reading every object's header once (a request per object)",
                      file=sys.stderr, flush=True)
            out = build_catalog(p, dtype=a.dtype, format=a.format, endpoint_url=a.endpoint_url)
            if not a.quiet:
                print(f"{p}: catalog {out}{_found(p, a)} ({time.perf_counter() - t:.1f} s)")
            continue
        if a.dtype is None:
            raise ValueError("--eos-id needs --dtype: a headerless token file does not record its dtype")
        out = build_index(p, dtype=a.dtype, eos_id=a.eos_id, index_dir=a.index_dir)
        if not a.quiet:
            print(f"{p}: {out}")
    return 0


def _found(path: str, a: argparse.Namespace) -> str:
    """What the catalog describes, as the open it serves sees it (from the catalog just written, so
    no file is read again): ": N files (formats, dtype), T tokens, D documents". Local sets only: a
    remote open would cost a request and need the cache options."""
    if _remote.is_url(path):
        return ""
    ds = tf_open(path, dtype=a.dtype, format=a.format)
    formats = ", ".join(sorted({f["format"] for f in ds.files()}))
    files, docs = ds.num_files, ds.num_documents
    return (f": {files:,} file{'s' if files != 1 else ''} ({formats}, {ds.dtype.name}), {ds.num_tokens:,} tokens, "
            f"{docs:,} document{'s' if docs != 1 else ''}")


def add_parser(sub: Any) -> None:
    """Add the ``index`` command to an argparse subparsers object."""
    i = sub.add_parser("index", help="write a shard set's catalog beside its data, or (with --eos-id) the "
                                     "document index of headerless token files",
                       description="Without --eos-id: read every file of a shard set once (a directory of "
                                   "foreign token files, or a glob of names in one directory: quote it) and "
                                   "write its catalog beside the data (.tokenfeed-catalog-<key>), from which "
                                   "every machine reading the data opens the set without listing the directory "
                                   "or reading a file, while the directory is unchanged. A shard set in object "
                                   "storage (a glob of names under one prefix, or a prefix URL ending in /) gets "
                                   "its catalog stored as an object under that prefix: every node then opens the "
                                   "set with its listing and one request. For a tokenfeed "
                                   "dataset directory (with a manifest): its own catalog, tokenfeed.catalog, "
                                   "which a remote open reads instead of every shard's header (the dataset "
                                   "writer writes it too). "
                                   "With --eos-id: scan headerless token files (nanoGPT, OLMo, datatrove) once "
                                   "for the end-of-document id and write each one's document index, PATH.tfdocs "
                                   "beside it, or in the node's index directory when that directory is "
                                   "read-only. OLMo's metadata (x.csv.gz beside x.npy) gives the documents when present "
                                   "(read with zlib, loaded at run time: libz.so.1 or $TOKENFEED_ZLIB). "
                                   "tokenfeed.open(..., eos_id=N) reads it; an index whose data file or "
                                   "metadata changed is refused until it is rebuilt here (docs/format.md).")
    i.add_argument("path", nargs="+", metavar="PATH",
                   help="a shard set (directory or quoted glob), or with --eos-id headerless token file(s)")
    i.add_argument("--dtype", default=None, help="token dtype of headerless files (uint16, uint32, ...); "
                                                 "required with --eos-id")
    i.add_argument("--format", default=None, help="the files' format when it cannot be detected (as open's format=)")
    i.add_argument("--eos-id", type=int, default=None, help="the id that ends every document: build document "
                                                            "indexes instead of a catalog")
    i.add_argument("--index-dir", default=None,
                   help=f"where indexes go when the data's directory is read-only (default: $TOKENFEED_INDEX_DIR "
                        f"or {default_index_dir().replace(os.path.expanduser('~'), '~')})")
    i.add_argument("--endpoint-url", default=None,
                   help="for a shard set in object storage: an S3-compatible endpoint (default: $AWS_ENDPOINT_URL_S3 "
                        "or $AWS_ENDPOINT_URL)")
    i.add_argument("-q", "--quiet", action="store_true", help="print nothing")
    i.set_defaults(func=cmd_index)
