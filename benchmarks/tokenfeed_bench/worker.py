"""The child process: run one loader on one case and print its figures.

Reads a case (JSON) on stdin, imports ``tokenfeed_bench.loaders.<kind>``, and:

* mode ``prepare``: converts the shared tokens into the loader's own format (cached),
  so that the measuring process starts clean;
* mode ``run``: prepares the loader's own data format if needed, reads the files the
  loader will read once (so that "warm page cache" holds for every row, whatever ran
  before it; not for cold cases), opens the loader, times the first batch, then
  throughput and, when ``step_ms`` is given, stalls;
* mode ``startup``: open and first batch only (``shards`` picks the layout);
* mode ``restore``: for each position, the loader's own resumable state at that
  position (``make_state``, not timed), then a fresh loader restored from it
  (``restore``), timed to its first batch; its files are read once first, as for ``run``.

Prints ``@@RESULT@@{json}`` as its last line and leaves with ``os._exit`` (no slow
interpreter teardown of DataLoader workers).
"""
from __future__ import annotations

import importlib
import json
import os
import sys
import time
from typing import Any, Callable, Dict, List, Optional

from . import measure
from .common import RESULT, reset_peak_rss, self_status


class Feed:
    """What a loader module hands back: a callable for the next batch, and how to close."""

    def __init__(self, next_batch: Callable[[], Any], close: Optional[Callable[[], None]] = None,
                 info: Optional[Dict[str, Any]] = None) -> None:
        self.next_batch = next_batch
        self.close = close or (lambda: None)
        self.info = info or {}
        self.obj: Any = None  # the loader object, for a module's after()


def _module(kind: str) -> Any:
    return importlib.import_module(f"tokenfeed_bench.loaders.{kind}")


def warm_page_cache(paths: Any, chunk: int = 8 << 20) -> int:
    """Read every file under `paths` (files or directories) once, into one reused buffer, so
    that the loader then reads from the page cache. Returns the bytes read."""
    buf = bytearray(chunk)
    total = 0
    files: List[str] = []
    for p in [paths] if isinstance(paths, str) else list(paths):
        if os.path.isdir(p):
            for root, _, names in os.walk(p):
                files.extend(os.path.join(root, n) for n in sorted(names))
        elif os.path.isfile(p):
            files.append(p)
    for f in files:
        with open(f, "rb", buffering=0) as fh:
            while True:
                n = fh.readinto(buf)
                if not n:
                    break
                total += n
    return total


def data_paths(mod: Any, case: Dict[str, Any]) -> Any:
    """The files a case's loader reads: the module's own ``data_paths(case)``, else the
    shared flat token file."""
    f = getattr(mod, "data_paths", None)
    return f(case) if f is not None else [case["raw"]]


def run_case(case: Dict[str, Any]) -> Dict[str, Any]:
    mod = _module(case["kind"])
    mode = case.get("mode", "run")
    r: Dict[str, Any] = {}
    # imports are not start-up: a training script has them loaded before it builds its loader
    for name in ("torch",) + tuple(getattr(mod, "IMPORTS", ())):
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    if hasattr(mod, "preload"):
        mod.preload()
    if hasattr(mod, "prepare"):
        t = time.perf_counter()
        prep = mod.prepare(case)
        if prep:
            r["prepare"] = dict(prep, seconds=time.perf_counter() - t)
    if mode == "prepare":
        return r
    if mode in ("run", "restore") and not case.get("cold"):
        t = time.perf_counter()
        r["warm_bytes"] = warm_page_cache(data_paths(mod, case))
        r["warm_s"] = time.perf_counter() - t
    if mode == "restore":
        rows = []
        for pos in case["positions"]:
            state = mod.make_state(case, int(pos))  # not timed: what the checkpoint holds
            t = time.perf_counter()
            feed = mod.restore(case, state)
            feed.next_batch()
            dt = time.perf_counter() - t
            rows.append(dict(feed.info, position=int(pos), restore_s=dt))
            feed.close()
        r["restore"] = rows
        r["method"] = getattr(mod, "RESTORE_METHOD", "")
        r["version"] = getattr(mod, "version", lambda: None)()
        return r
    rss0 = self_status("VmRSS")
    reset_peak_rss()
    t = time.perf_counter()
    feed = mod.open(case)
    feed.next_batch()
    r["first_batch_s"] = time.perf_counter() - t
    r["version"] = getattr(mod, "version", lambda: None)()
    r.update(feed.info)
    if mode == "startup":
        r["first_batch_rss_delta_mb"] = (self_status("VmHWM") - rss0) / 1024
        feed.close()
        return r
    tpb = case["batch_size"] * case["seq_len"]
    r.update(measure.throughput(feed.next_batch, tokens_per_batch=tpb, warmup=case["warmup"],
                                seconds=case["seconds"], max_batches=int(case.get("max_batches", 10**9))))
    r["rss_delta_mb"] = r["peak_rss_mb"] - rss0 / 1024.0
    if case.get("step_ms"):
        r["stalls"] = measure.stalls(feed.next_batch, case["step_ms"], seconds=case.get("stall_seconds", 2.0),
                                     repeats=int(case.get("stall_repeats", 1)))
    after = getattr(mod, "after", None)
    if after is not None:
        r.update(after(feed))
    feed.close()
    return r


def main() -> int:
    case = json.loads(sys.stdin.read())
    try:
        r = run_case(case)
        r["status"] = "ok"
    except ImportError as e:
        r = {"status": "not installed", "reason": f"{type(e).__name__}: {e}"}
    except Exception as e:
        import traceback

        tb = traceback.format_exc().strip().splitlines()
        r = {"status": "failed", "reason": f"{type(e).__name__}: {e}"[:600], "traceback": tb[-8:]}
    sys.stdout.write("\n" + RESULT + json.dumps(r, default=str) + "\n")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
