"""``tokenfeed exclude``: take documents down in a saved loader state.

::

    tokenfeed exclude STATE.json --ids 17,42 [--from-file ids.txt] [--source N] -o NEW.json
    tokenfeed exclude STATE.json --ids 17,42 --data DATA... [--where EXPR] --in-place

Adds one takedown (``[position, source, [ids]]``, the position the state resumes at) to the
state's ``excluded``, as ``Loader.exclude`` would have at that step, so that a run resumed
from the new state never serves those documents. With ``--data`` the state is first loaded
over the data (its fingerprints checked, as a resume does) and the ids are checked against
the source's documents by the library; without it, only what the state itself says is
checked (the loader that resumes checks the rest, and refuses a state naming a document past
its data). The state is written to ``-o`` or replaced ``--in-place``: written to a new file
beside it and renamed over it, never through a symbolic link. See docs/views.md.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import sys
from typing import Any, Dict, List, Mapping, MutableMapping

__all__ = ["add_parser", "cmd_exclude"]

_U64 = 1 << 64


class _Problem(ValueError):
    """A problem with the command line the user can fix (printed as one line)."""


def _limits() -> Dict[str, int]:
    from .. import _core

    c = getattr(_core, "STATE_MAX_EXCLUDED", 4096)
    i = getattr(_core, "STATE_MAX_EXCLUDED_IDS", 1 << 22)
    return {"entries": int(c), "ids": int(i)}


def _parse_ids(text: str, where: str) -> List[int]:
    """Document ids from text: whole numbers separated by commas, spaces or lines ('#' starts a comment)."""
    out: List[int] = []
    for ln, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0]
        for tok in re.split(r"[,\s]+", line.strip()):
            if not tok:
                continue
            if not re.fullmatch(r"[0-9]+", tok):
                at = f"{where}, line {ln}" if where != "--ids" else where
                raise _Problem(f"{at}: {tok!r} is not a document id (a whole number >= 0)")
            v = int(tok)
            if v >= _U64:
                raise _Problem(f"{where}: document id {tok} is past the largest a state holds (2**64 - 1)")
            out.append(v)
    return out


def _read_ids(a: argparse.Namespace) -> List[int]:
    ids: List[int] = []
    if a.ids is not None:
        ids += _parse_ids(a.ids, "--ids")
    if a.from_file is not None:
        cap = 128 << 20  # TF_STATE_MAX_EXCLUDED_IDS ids of 20 digits fit many times over
        try:
            with open(a.from_file, encoding="utf-8") as f:
                text = f.read(cap + 1)
        except UnicodeDecodeError:
            raise _Problem(f"{a.from_file}: not text (one document id per line)") from None
        if len(text) > cap:
            raise _Problem(f"{a.from_file}: more than {cap >> 20} MiB of ids, more than a state may hold")
        ids += _parse_ids(text, a.from_file)
    if not ids:
        raise _Problem("give the documents to take down: --ids 17,42 and/or --from-file FILE (one id per line)")
    return sorted(set(ids))


def _state_of(obj: Any, path: str) -> MutableMapping[str, Any]:
    """The loader state in obj (the state itself, or an object holding it under "loader")."""
    if isinstance(obj, dict) and "config" not in obj and isinstance(obj.get("loader"), dict):
        obj = obj["loader"]
    if not isinstance(obj, dict) or "config" not in obj or "position" not in obj:
        raise _Problem(f"{path}: not a loader state (expected the JSON of Loader.state_dict(), or an object "
                       f"holding it under 'loader')")
    return obj


def _check_entries(state: Mapping[str, Any], path: str, sources: int) -> List[List[Any]]:
    """The state's takedowns, checked for what the state alone can tell (the library checks them
    again, against the data, when a loader resumes it)."""
    ex = state.get("excluded")
    if ex is None:
        return []
    lim = _limits()

    def whole(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < _U64

    if not isinstance(ex, list):
        raise _Problem(f"{path}: the state's excluded is not a list of [position, source, [ids]] entries")
    for k, e in enumerate(ex):
        if not (isinstance(e, list) and len(e) == 3 and whole(e[0]) and whole(e[1]) and isinstance(e[2], list)
                and all(whole(x) for x in e[2])):
            raise _Problem(f"{path}: the state's excluded entry {k} is not [position, source, [document ids]] "
                           f"of whole numbers")
        if e[1] >= sources:
            raise _Problem(f"{path}: the state's excluded entry {k} names source {e[1]}, and the state's loader "
                           f"reads {sources}")
        if any(b <= a for a, b in zip(e[2], e[2][1:])):
            raise _Problem(f"{path}: the state's excluded entry {k}: document ids must be ascending and distinct")
    if len(ex) > lim["entries"] or sum(len(e[2]) for e in ex) > lim["ids"]:
        raise _Problem(f"{path}: the state's excluded is past what a state may hold")
    return [list(e) for e in ex]


def _sources_of(state: Mapping[str, Any]) -> int:
    w = state.get("config", {}).get("weights") if isinstance(state.get("config"), Mapping) else None
    return len(w) if isinstance(w, list) and w else 1


def _check_with_data(a: argparse.Namespace, state: Mapping[str, Any], ids: List[int]) -> List[int]:
    """Load the state over DATA (as a resume: fingerprints, the takedowns it has), take the ids down
    there (the library's checks: documents of the source, limits) and return them as it keeps them."""
    from ._explain import _Problem as _ExplainProblem
    from ._explain import make_loader
    from ..engine._loader import StateError

    ns = argparse.Namespace(data=a.data, state=None, dp_size=1, rank=0, dtype=a.dtype, where=a.where,
                            balance="none", balance_micro_batches=1)
    tmp = _write_temp(dict(state))
    try:
        ns.state = tmp
        try:
            loader = make_loader(ns)
        except (_ExplainProblem, StateError) as e:
            raise _Problem(f"{a.state}: {e}") from None
    finally:
        os.unlink(tmp)
    try:
        n_before = len(loader._order.excluded())
        try:
            loader.exclude(ids, source=a.source)
        except ValueError as e:
            raise _Problem(f"{a.state}: {e}") from None
        after = loader._order.excluded()
        if len(after) != n_before + 1:
            raise _Problem(f"{a.state}: the takedown was not recorded")
        return [int(x) for x in after[-1][2]]
    finally:
        loader.close()


def _write_temp(obj: Dict[str, Any]) -> str:
    import tempfile

    fd, p = tempfile.mkstemp(prefix="tokenfeed-state-", suffix=".json")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(obj, f)
    return p


def _write_atomic(path: str, text: str) -> None:
    """Write text to path: a new file beside it (created, never through a symbolic link) renamed over
    it. A symbolic link at path is replaced, not followed."""
    d, base = os.path.split(os.path.abspath(path))
    dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        tmp = f".{base}.{secrets.token_hex(8)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dfd)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, base, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
            raise
        os.fsync(dfd)
    finally:
        os.close(dfd)


def cmd_exclude(a: argparse.Namespace) -> int:
    from ..engine._loader import StateError, _state_from_json

    if (a.output is None) == (not a.in_place):
        raise _Problem("give where to write the new state: -o NEW.json, or --in-place to replace STATE")
    if a.source < 0:
        raise _Problem(f"--source {a.source}: expected the source's index (>= 0) among the loader's datasets")
    ids = _read_ids(a)
    with open(a.state, "rb") as f:
        raw = f.read((64 << 20) + 1)
    if len(raw) > 64 << 20:
        raise _Problem(f"{a.state}: larger than a loader state may be (64 MiB)")
    try:
        top = _state_from_json(raw, a.state)
    except StateError as e:
        raise _Problem(str(e)) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _Problem(f"{a.state}: not JSON ({e}); give the JSON of Loader.state_dict()") from None
    state = _state_of(top, a.state)
    pos = state["position"]
    if not isinstance(pos, int) or isinstance(pos, bool) or not 0 <= pos < _U64:
        raise _Problem(f"{a.state}: the state's position is not a whole number")
    sources = _sources_of(state)
    if a.source >= sources:
        raise _Problem(f"--source {a.source}: the state's loader reads {sources} source{'s' if sources != 1 else ''} "
                       f"(0 to {sources - 1})")
    entries = _check_entries(state, a.state, sources)
    lim = _limits()
    if len(entries) + 1 > lim["entries"] or sum(len(e[2]) for e in entries) + len(ids) > lim["ids"]:
        raise _Problem(f"{a.state}: the state would hold more takedowns than a state may ({lim['entries']} entries, "
                       f"{lim['ids']} ids in all): take many documents down in one call, or filter them out with "
                       f"exclude= at the next restart")
    if a.data:
        ids = _check_with_data(a, state, ids)
    else:
        print(f"{os.path.basename(sys.argv[0]) or 'tokenfeed'} exclude: the ids were not checked against the "
              f"documents (give --data to check them); a loader resuming the state refuses an id past its data",
              file=sys.stderr)
    entries.append([pos, a.source, ids])
    state["excluded"] = entries
    _write_atomic(a.state if a.in_place else a.output, json.dumps(top) + "\n")
    print(f"{len(ids)} document{'s' if len(ids) != 1 else ''} of source {a.source} taken down from position {pos} "
          f"(step {pos // max(1, int(state['config'].get('global_batch') or 1))}); "
          f"{'replaced ' + a.state if a.in_place else 'wrote ' + a.output}")
    return 0


def add_parser(sub: Any) -> None:
    """Add the ``exclude`` command to an argparse subparsers object."""
    p = sub.add_parser("exclude", help="take documents down in a saved loader state (a resume never serves them)",
                       description="Add a takedown to a saved Loader.state_dict(): from the position the state "
                                   "resumes at, the documents' tokens are never served (padding in their place, "
                                   "out of the loss), as Loader.exclude does in a running loader. See "
                                   "docs/views.md.")
    p.add_argument("state", metavar="STATE", help="a saved Loader.state_dict() (JSON; or an object holding it "
                                                  "under 'loader')")
    p.add_argument("--ids", metavar="A,B", help="document ids of the source's dataset (as explain reports them): "
                                                "17,42")
    p.add_argument("--from-file", metavar="FILE", help="a file of document ids, one per line ('#' comments)")
    p.add_argument("--source", type=int, default=0, help="the dataset's index in a mixture (default 0)")
    p.add_argument("--data", nargs="+", metavar="DATA", help="the dataset path(s) the loader reads: the state is "
                                                             "checked against them, the ids against the documents")
    p.add_argument("--where", metavar="EXPR", help="with --data: the filter the loader read the data through")
    p.add_argument("--dtype", help="with --data: token dtype of headerless files")
    g = p.add_mutually_exclusive_group()
    g.add_argument("-o", "--output", metavar="NEW", help="write the new state here")
    g.add_argument("--in-place", action="store_true", help="replace STATE (atomically: a new file renamed over it)")
    p.set_defaults(func=cmd_exclude)
