"""``tokenfeed cache``: show and prune the node-local chunk cache of remote datasets.

::

    tokenfeed cache show [DIR] [--json]          size, chunks, objects, processes attached
    tokenfeed cache prune [DIR] --keep 50GB       evict (farthest next use first) down to 50 GB
    tokenfeed cache prune [DIR] --all             empty it, the recorded metadata of remote opens too
                                                  (refused while a process has it open)

``DIR`` defaults to ``$TOKENFEED_CACHE_DIR`` or ``~/.cache/tokenfeed/remote`` (see docs/remote.md).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Dict, List

from ..remote._remote import default_cache_dir, parse_size

__all__ = ["add_parser", "cache_objects", "cmd_cache"]


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    return f"{n:.2f} PB"  # pragma: no cover


def cache_objects(cache_dir: str) -> List[Dict[str, Any]]:
    """One dict per cached object: url, size, version, chunks and bytes on disk (largest first)."""
    out = []
    root = os.path.join(cache_dir, "objects")
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        return []
    for name in names:
        d = os.path.join(root, name)
        info: Dict[str, Any] = {"id": name, "url": "?", "size": None, "version": ""}
        try:
            with open(os.path.join(d, "info"), encoding="utf-8", errors="replace") as f:
                for line in f:
                    k, _, v = line.rstrip("\n").partition(" ")
                    if k == "size":
                        info["size"] = int(v) if v.isdigit() else None
                    elif k in ("url", "version"):
                        info[k] = v
        except OSError:
            pass
        chunks = 0
        nbytes = 0
        try:
            with os.scandir(d) as it:
                for e in it:
                    if e.name.endswith(".c"):
                        chunks += 1
                        nbytes += max(0, e.stat().st_size - 40)  # less the trailer
        except OSError:
            continue
        if chunks:
            info["chunks"] = chunks
            info["bytes"] = nbytes
            out.append(info)
    out.sort(key=lambda o: -o["bytes"])
    return out


def cmd_cache(a: argparse.Namespace) -> int:
    from .. import _core

    d = a.dir or default_cache_dir()
    if a.cache_command == "prune":
        if a.all == (a.keep is not None):
            raise ValueError("cache prune: give either --keep SIZE or --all")
        keep = 0 if a.all else (parse_size(a.keep, "--keep") or 0)
        before = _core.cache_info(d)
        _core.cache_prune(d, keep)
        after = _core.cache_info(d)
        print(f"{d}: {_human(before['bytes'])} in {before['chunks']} chunks -> "
              f"{_human(after['bytes'])} in {after['chunks']} chunks")
        return 0
    if a.dir is None and not os.path.lexists(d):  # the default on a fresh node: an empty cache, not an error
        print(json.dumps({"cache_dir": d, "exists": False, "chunks": 0, "bytes": 0, "objects": 0}) if a.json
              else f"cache        {d}\nchunks       0 (nothing cached yet: the directory is made when a remote "
                   f"dataset is first read)")
        return 0
    info = _core.cache_info(d)
    objs = cache_objects(d)
    if a.json:
        print(json.dumps({"cache_dir": d, **info, "objects_detail": objs}, indent=2))
        return 0
    print(f"cache        {d}")
    print(f"chunks       {info['chunks']:,} ({_human(info['bytes'])}) of {info['objects']:,} object(s)")
    if info["fetching"]:
        print(f"fetching     {info['fetching']:,} chunk(s) now")
    if info["temp_bytes"]:
        print(f"temporary    {_human(info['temp_bytes'])} (chunks being written)")
    print(f"processes    {info['processes']} attached")
    if objs:
        print()
        width = max(len(o["url"]) for o in objs[:a.top])
        for o in objs[:a.top]:
            size = o["size"]
            frac = f"{100.0 * o['bytes'] / size:5.1f}%" if size else "     ?"
            print(f"  {o['url']:<{width}}  {o['chunks']:>7,} chunks  {_human(o['bytes']):>10}  {frac} of the object")
        if len(objs) > a.top:
            print(f"  ... and {len(objs) - a.top} more (--top N)")
    return 0


def add_parser(sub: Any) -> None:
    """Add the ``cache`` command to an argparse subparsers object."""
    c = sub.add_parser("cache", help="show or prune the local chunk cache of remote datasets",
                       description="The cache that remote datasets (s3://, gs://, az://, https://) fill on this node "
                                   "(docs/remote.md). DIR defaults to $TOKENFEED_CACHE_DIR or "
                                   "~/.cache/tokenfeed/remote.")
    cs = c.add_subparsers(dest="cache_command", metavar="ACTION")
    cs.required = True
    dir_help = "the cache directory (default: $TOKENFEED_CACHE_DIR or ~/.cache/tokenfeed/remote)"
    s = cs.add_parser("show", help="size, chunks, objects and processes attached",
                      description="Show the cache's size, its chunks and the objects they belong to (largest "
                                  "first), chunks being fetched, and how many processes have it open.")
    s.add_argument("dir", nargs="?", metavar="DIR", help=dir_help)
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.add_argument("--top", type=int, default=20, help="objects listed (largest first; default 20)")
    p = cs.add_parser("prune", help="evict chunks down to a size (farthest next use first)",
                      description="Evict cached chunks until the cache holds at most --keep bytes: first those "
                                  "no attached process needs, then those needed farthest ahead, so it may run "
                                  "while training uses the cache. --all empties it, the metadata recorded by "
                                  "remote opens included (the next open reads it from the store again), and is "
                                  "refused while a process has it open.")
    p.add_argument("dir", nargs="?", metavar="DIR", help=dir_help)
    p.add_argument("--keep", metavar="SIZE", help="bytes to keep: 50GB, 1.5TiB, 500M, ...")
    p.add_argument("--all", action="store_true", help="empty the cache, recorded metadata included (refused while a process has it open)")
    c.set_defaults(func=cmd_cache)


if __name__ == "__main__":  # pragma: no cover
    ap = argparse.ArgumentParser(prog="tokenfeed")
    add_parser(ap.add_subparsers(dest="command"))
    ns = ap.parse_args()
    sys.exit(ns.func(ns))
