"""``tokenfeed explain``: which documents made a step (``tokenfeed where``, in ``_where``, the other way round:
which steps hold a document; both take the loader options defined here).

::

    tokenfeed explain DATA... --step N --state loader_state.json [--rank R --dp-size D] [--tokenizer tokenizer.json]
    tokenfeed explain DATA... --step N --seq-len 2048 --global-batch 512 --seed 0 [...]
    tokenfeed where DATA... --document D [--source S] [--epochs a:b] --state loader_state.json

The loader's configuration comes from a saved loader state (``--state``: the JSON of
``Loader.state_dict()``, or a checkpoint holding it under ``"loader"``), which is checked
against DATA as a resume would be, or from the options. Nothing is read but the datasets'
indexes (and, with ``--tokenizer``, the tokens of the segments shown). See
docs/guides/loss-spikes.md.
"""
from __future__ import annotations

import argparse
import bisect
import json
import sys
from typing import Any, Callable, Dict, List, Mapping, Optional

import numpy as np

__all__ = ["add_parser", "cmd_explain"]

# keys of a loader state's "config" that are Loader keyword arguments
_STATE_KEYS = ("seq_len", "seed", "shuffle", "block_size", "window_blocks", "separator_id", "packing", "pad_id",
               "pack_window", "weights", "mix_window", "epochs", "order", "llmc_processes",
               "olmo_chunk")


class _Problem(ValueError):
    """A problem with the command line the user can fix (printed as one line)."""


def _read_state(path: str) -> Mapping[str, Any]:
    """A loader state from a JSON file (the state itself, or an object holding it under "loader"), or
    from a torch checkpoint holding it under "loader"."""
    from ..engine._loader import StateError, _state_from_json

    try:
        with open(path, encoding="utf-8") as f:
            obj: Any = _state_from_json(f.read(), path)  # a key twice is refused, as the C library does
    except StateError as e:
        raise _Problem(str(e)) from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        try:
            import torch
        except ImportError:
            raise _Problem(f"{path}: not JSON (a loader state from Loader.state_dict(), saved with json.dump), "
                           f"and torch is not installed to read it as a checkpoint") from None
        obj = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(obj, Mapping) and "config" not in obj and isinstance(obj.get("loader"), Mapping):
        obj = obj["loader"]
    if not isinstance(obj, Mapping) or "config" not in obj or "position" not in obj:
        raise _Problem(f"{path}: not a loader state (expected the dict of Loader.state_dict(), or a checkpoint "
                       f"holding it under 'loader')")
    return obj


def _weights_arg(text: Optional[str]) -> Optional[List[float]]:
    if text is None:
        return None
    try:
        return [float(x) for x in text.split(",")]
    except ValueError:
        raise _Problem(f"--weights: expected numbers separated by commas (one per DATA path), got {text!r}") from None


def _first_weights(state: Mapping[str, Any]) -> Dict[str, Any]:
    """The weights to build the Loader of a state whose mixture's weights were changed while it ran: those the
    run began with (the state's weights_initial; the state then gives the loader its recorded changes). A state
    that does not record them (an older tokenfeed's) keeps the last weights, or equal ones where those hold a 0,
    which a Loader is not built with: loading it then tells the steps from the last change on and refuses the
    earlier ones by name."""
    from ..order._schedule import WeightSchedule

    init, w = state.get("weights_initial"), state["config"].get("weights")
    if not state.get("weights_history") or not isinstance(w, list):
        return {}
    if isinstance(init, list) and len(init) == 4 and isinstance(init[0], list):
        if init[1] is None:
            return {"weights": init[0]}
        return {"weights": WeightSchedule(list(zip(init[1], init[0])), interpolation=init[2] or "constant")}
    if all(isinstance(x, (int, float)) and x > 0 for x in w):
        return {}
    return {"weights": [1.0] * len(w)}


def make_loader(a: argparse.Namespace) -> Any:
    """The Loader of rank ``a.rank`` of ``a.dp_size`` that the options (or the saved state) describe."""
    from ..sources._dataset import open as _open
    from ..engine._loader import Loader

    if a.dp_size < 1 or not 0 <= a.rank < a.dp_size:
        raise _Problem(f"--rank {a.rank} --dp-size {a.dp_size}: expected 0 <= rank < dp-size")
    kw: Dict[str, Any] = {}
    state = None
    if a.state:
        state = _read_state(a.state)
        cfg = state["config"]
        # a state lists every setting, None where it does not apply: those keep their defaults
        kw = {k: cfg[k] for k in _STATE_KEYS if cfg.get(k) is not None}
        kw.update(_first_weights(state))
        global_batch = int(cfg["global_batch"])
    else:
        if a.seq_len is None or a.global_batch is None:
            raise _Problem("give the loader's configuration: --state FILE (a saved Loader.state_dict()), or at "
                           "least --seq-len and --global-batch (and every setting that differs from the default)")
        global_batch = a.global_batch
        kw = dict(seq_len=a.seq_len, seed=a.seed, shuffle=a.shuffle, packing=a.packing, separator_id=a.separator_id,
                  pad_id=a.pad_id, block_size=a.block_size, window_blocks=a.window_blocks,
                  pack_window=a.pack_window, epochs=a.epochs_total, mix_window=a.mix_window)
        w = _weights_arg(a.weights)
        if w is not None:
            kw["weights"] = w
    if global_batch % a.dp_size:
        raise _Problem(f"--dp-size {a.dp_size} does not divide the global batch {global_batch}")
    mixture = kw.get("weights") is not None
    data: Any = [_open(p, dtype=a.dtype) for p in a.data] if mixture else _open(a.data, dtype=a.dtype)
    if getattr(a, "where", None):
        kw["where"] = a.where  # the view the run read (docs/views.md)
    loader = Loader(data, batch_size=global_batch // a.dp_size, dp_rank=a.rank, dp_size=a.dp_size,
                    output="numpy", balance=a.balance, balance_micro_batches=a.balance_micro_batches, **kw)
    if state is not None:
        loader.load_state_dict(state)  # checks that DATA is what the state was saved on; mixture hand-over
    return loader


def _datasets(loader: Any) -> List[Any]:
    """The datasets whose document ids explain and where use (a view's: the one it selects from)."""
    return [d._base() for d in (loader.dataset if isinstance(loader.dataset, list) else [loader.dataset])]


def _file_of(files: List[Dict[str, Any]], document: int) -> str:
    firsts = [f["first_document"] for f in files]
    i = max(0, bisect.bisect_right(firsts, document) - 1)
    return str(files[i]["path"])


def _one_line(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """A step or document out of range (IndexError) is a one-line error of the command line."""
    def run(a: argparse.Namespace) -> int:
        try:
            return fn(a)
        except IndexError as e:
            raise _Problem(str(e).strip("'\"")) from None
    run.__doc__ = fn.__doc__
    return run


@_one_line
def cmd_explain(a: argparse.Namespace) -> int:
    loader = make_loader(a)
    tok = None
    if a.tokenizer:
        from ..sources._text import load_tokenizer

        tok = load_tokenizer(a.tokenizer)
    dss = _datasets(loader)
    files = [d.files() for d in dss]
    cols = [c for c in (a.columns or "").split(",") if c]
    rows = loader.explain(a.step, columns=cols or None)
    positions = loader._row_positions(a.step)
    if a.json:
        out = []
        for pos, segs in zip(positions, rows):
            out.append({"position": pos, "segments": [
                {"source": s.source, "document": s.document, "start": s.start, "stop": s.stop, "offset": s.offset,
                 "file": _file_of(files[s.source], s.document),
                 **({"meta": s.meta} if cols else {}),
                 **({"text": tok.decode(dss[s.source].document(s.document)[s.start:s.stop].tolist())} if tok else {})}
                for s in segs]})
        json.dump({"step": a.step, "rank": a.rank, "dp_size": a.dp_size, "rows": out}, sys.stdout)
        print()
        return 0
    n = loader.num_samples
    span = f"positions {positions[0]}..{positions[-1]}" if positions == list(range(positions[0], positions[-1] + 1)) \
        else f"positions {', '.join(map(str, positions))}"
    print(f"step {a.step}, rank {a.rank} of {a.dp_size}: {len(rows)} rows of {loader.seq_len + 1} tokens, "
          f"{span} (epoch {positions[0] // n})")
    for r, (pos, segs) in enumerate(zip(positions, rows)):
        print(f"row {r} (position {pos}): {len(segs)} segment{'s' if len(segs) != 1 else ''}")
        for s in segs:
            src = f"source {s.source}  " if len(dss) > 1 else ""
            print(f"  [{s.offset:>5}, {s.offset + s.stop - s.start:>5})  {src}document {s.document}  "
                  f"tokens {s.start}..{s.stop}  {_file_of(files[s.source], s.document)}")
            if cols:
                print("      " + "  ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in s.meta.items()))
            if tok is not None:
                text = tok.decode(dss[s.source].document(s.document)[s.start:s.stop].tolist())
                if a.max_chars and len(text) > a.max_chars:
                    text = text[:a.max_chars] + " ..."
                print("      " + json.dumps(text, ensure_ascii=False))
    return 0


def _loader_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("data", nargs="+", metavar="DATA", help="the dataset path(s) the loader reads (with weights: one "
                                                           "per source, in the loader's order)")
    p.add_argument("--state", metavar="FILE", help="a saved Loader.state_dict() (JSON; or a checkpoint with it under "
                                                   "'loader'): gives the configuration, checked against DATA")
    p.add_argument("--dp-size", type=int, default=1, help="data-parallel ranks (default 1)")
    p.add_argument("--dtype", help="token dtype of headerless files")
    p.add_argument("--where", metavar="EXPR", help="the filter the loader read the data through (Loader's where=; "
                                                   "docs/views.md)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--balance", choices=["none", "tokens", "attention", "strided"], default="none",
                   help="the loader's balance= (a state does not record it; default none)")
    p.add_argument("--balance-micro-batches", type=int, default=1, metavar="M",
                   help="the loader's balance_micro_batches= (default 1)")
    g = p.add_argument_group("configuration without --state (Loader's keyword arguments)")
    g.add_argument("--seq-len", type=int)
    g.add_argument("--global-batch", type=int, help="samples per step over all ranks")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--shuffle", choices=["full", "block", "none"], default="full")
    g.add_argument("--packing", choices=["concat", "best_fit", "document"], default="concat")
    g.add_argument("--separator-id", type=int)
    g.add_argument("--pad-id", type=int)
    g.add_argument("--block-size", type=int, default=1024)
    g.add_argument("--window-blocks", type=int, default=16)
    g.add_argument("--pack-window", type=int, default=1024)
    g.add_argument("--weights", help="mixture weights, one per DATA path: 0.7,0.3")
    g.add_argument("--mix-window", type=int, default=1000)
    g.add_argument("--epochs-total", type=int, metavar="K", help="the loader's epochs= (default: endless)")


def add_parser(sub: Any) -> None:
    """Add the ``explain`` command to an argparse subparsers object."""
    e = sub.add_parser("explain", help="which documents (and which of their tokens) made a training step",
                       description="For each row of step N's batch on one rank: the document pieces it was cut "
                                   "from (source, document, token range, the file it lives in), computed from the "
                                   "order without reading tokens; with --tokenizer, their text. "
                                   "See docs/guides/loss-spikes.md.")
    _loader_options(e)
    e.add_argument("--step", type=int, required=True, help="the global step (batches since the stream's start)")
    e.add_argument("--rank", type=int, default=0, help="data-parallel rank (default 0)")
    e.add_argument("--tokenizer", metavar="JSON", help="a Hugging Face tokenizer.json: print each segment's text")
    e.add_argument("--max-chars", type=int, default=400, help="characters of text shown per segment (0: all)")
    e.add_argument("--columns", metavar="A,B", help="metadata columns to show for each segment's document: url,domain "
                                                    "(docs/views.md)")
    e.set_defaults(func=cmd_explain)
