"""``tokenfeed bench`` / ``python benchmarks/bench_tokens.py``: arguments and the entry point."""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Callable, List, Optional, Sequence

from .common import default_cache, parse_count, parse_size
from .peers import PEERS

GROUPS = ("tokenfeed", "ceiling", "baselines", "peers", "stalls", "startup", "restore", "larger", "zstd")
# The groups whose loaders the stalls group measures (it adds a step-time loop to their main rows).
LOADER_GROUPS = ("tokenfeed", "baselines", "peers")


def _floats(s: str) -> List[float]:
    out = [float(x) for x in s.split(",") if x.strip()]
    if not out or any(x <= 0 for x in out):
        raise argparse.ArgumentTypeError(f"{s!r}: give positive numbers separated by commas")
    return out


def _ints(s: str) -> List[int]:
    out = [parse_count(x) for x in s.split(",") if x.strip()]
    if not out or any(x <= 0 for x in out):
        raise argparse.ArgumentTypeError(f"{s!r}: give positive counts separated by commas")
    return out


def _size(s: str) -> int:
    try:
        n = parse_size(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r}: give a size such as 40G, 2.5GiB or 512M") from None
    if n <= 0:
        raise argparse.ArgumentTypeError(f"{s!r}: the size must be positive")
    return n


def _count(s: str) -> int:
    try:
        return parse_count(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r}: give a count such as 5e8, 50M or 2**20") from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tokenfeed bench",
        description="Will the GPUs wait for data? tokenfeed beside the C gather ceiling, the nanoGPT loop, "
                    "torch DataLoader and peer loaders on the same data and batch shape: tokens/s, the fraction of "
                    "each training step spent waiting, a dataset larger than memory beside fio, start-up, "
                    "restore and CPU cost.",
        epilog="Groups: " + ", ".join(GROUPS) + ". Peers: " + ", ".join(p.key for p in PEERS) + ".")
    d = p.add_argument_group("data")
    d.add_argument("--data", metavar="PATH", nargs="+",
                   help="use an existing dataset (any format tokenfeed.open reads) instead of generating one")
    d.add_argument("--dtype", help="token dtype of a headerless --data file (uint8/uint16/uint32)")
    d.add_argument("--tokens", type=_count, default=None, help="tokens to generate (default 5e8; 5e7 with --quick)")
    d.add_argument("--vocab-size", type=int, default=50257, help="vocabulary of the generated data (default 50257)")
    d.add_argument("--doc-length", default="lognormal:6.0:1.0",
                   help="document lengths: lognormal:MU:SIGMA (default 6.0:1.0, median ~400 tokens), "
                        "fixed:N, or uniform:LO:HI")
    d.add_argument("--zipf", type=float, default=1.1,
                   help="Zipf exponent of token frequencies in generated data (default 1.1; 0 = uniform)")
    d.add_argument("--cache-dir", default=default_cache(),
                   help="where generated data, converted peer data, peer environments and the compiled ceiling "
                        "live (default $TOKENFEED_BENCH_CACHE or ~/.cache/tokenfeed/bench)")
    s = p.add_argument_group("shape")
    s.add_argument("--seq-len", type=int, default=2048)
    s.add_argument("--batch-size", type=int, default=8)
    s.add_argument("--seed", type=int, default=0)
    r = p.add_argument_group("run")
    r.add_argument("--quick", action="store_true",
                   help="small data, short runs, a 2 GB file for the larger-than-memory group")
    r.add_argument("--seconds", type=float, default=None,
                   help="timed seconds per throughput configuration (default 3; 0.6 with --quick)")
    r.add_argument("--warmup", type=int, default=20, help="warm-up batches excluded from timing (default 20)")
    r.add_argument("--only", default=None,
                   help="comma-separated groups to run (see below); stalls alone measures the step-time loop of "
                        "tokenfeed's and the baselines' main loaders and nothing else")
    r.add_argument("--skip", default=None, help="comma-separated groups to skip")
    r.add_argument("--timeout", type=float, default=600.0, help="seconds before one measurement is abandoned")
    pe = p.add_argument_group("peers")
    pe.add_argument("--install-peers", action="store_true",
                    help="pip install each peer into its own virtual environment under the cache dir (pinned "
                         "releases, torch pinned to this environment's; needs PyPI)")
    pe.add_argument("--install-timeout", type=float, default=600.0,
                    help="seconds one peer's install may take before it is stopped and reported (default 600)")
    pe.add_argument("--peers", default=None,
                    help="comma-separated peers to run (default all: " + ",".join(x.key for x in PEERS) + ")")
    pe.add_argument("--no-peers", action="store_true", help="do not run peer loaders")
    st = p.add_argument_group("stalls")
    st.add_argument("--step-ms", type=_floats, default=None,
                    help="training step times in ms for the stall measurement (default 1,5,20,100)")
    st.add_argument("--stall-seconds", type=float, default=None,
                    help="seconds per step time, loader and round (default 1; 0.3 with --quick)")
    st.add_argument("--stall-repeats", type=int, default=5,
                    help="rounds per step time and loader; the verdict gives their median and range, and says "
                         "which figures are within noise of each other (default 5)")
    su = p.add_argument_group("start-up")
    su.add_argument("--shards", type=_ints, default=None,
                    help="shard counts for time to first batch (default 1000,10000)")
    su.add_argument("--sparse-tokens", type=_count, default=10**12,
                    help="also time tokenfeed's first batch over this many tokens of sparse shards (default 1e12; "
                         "0 skips)")
    lg = p.add_argument_group("larger than memory")
    lg.add_argument("--big-size", type=_size, default=None,
                    help="bytes of real tokens to write and read shuffled (default 1.6 x RAM, e.g. 40G on 24 GiB; "
                         "2G with --quick, which then fits in memory and says so)")
    lg.add_argument("--big-dir", default=None,
                    help="directory for that file, on the device to measure (default <cache-dir>/big)")
    lg.add_argument("--big-seconds", type=float, default=None,
                    help="timed seconds per backend (default 20; 3 with --quick)")
    lg.add_argument("--fio-seconds", type=float, default=None, help="seconds per fio run (default 10; 3 with --quick)")
    lg.add_argument("--keep-big", action="store_true", help="keep the file for the next run instead of removing it")
    o = p.add_argument_group("output")
    o.add_argument("--json", metavar="PATH", help="write every raw figure as JSON")
    o.add_argument("--plot", metavar="PATH",
                   help="write charts to a PNG: throughput, stall fraction vs step time, start-up vs shards "
                        "(needs matplotlib: pip install 'matplotlib>=3.5')")
    o.add_argument("--compare", metavar="OLD.json", help="print what changed against an earlier --json file")
    o.add_argument("-v", "--verbose", action="store_true",
                   help="also print tokenfeed's own variants (threads, backends, output types), the C gather "
                        "ceiling and the ratio columns (x ceiling CPU, x tokenfeed, x ceiling)")
    o.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    return p


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = build_parser()
    a = p.parse_args(argv)
    q = a.quick
    if a.tokens is None:
        a.tokens = 50_000_000 if q else 500_000_000
    if a.seconds is None:
        a.seconds = 0.6 if q else 3.0
    if a.stall_seconds is None:
        a.stall_seconds = 0.3 if q else 1.0
    if a.big_seconds is None:
        a.big_seconds = 3.0 if q else 20.0
    if a.fio_seconds is None:
        a.fio_seconds = 3.0 if q else 10.0
    if a.big_size is None and q:
        a.big_size = 2 * 10**9
    a.step_ms = tuple(a.step_ms or (1.0, 5.0, 20.0, 100.0))
    a.shards = tuple(a.shards or (1000, 10000))
    for name in ("seq_len", "batch_size", "tokens", "vocab_size"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be positive")
    for name in ("seconds", "stall_seconds", "big_seconds", "fio_seconds", "timeout", "install_timeout"):
        if getattr(a, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive")
    if a.warmup < 0:
        p.error("--warmup must be >= 0")
    if a.stall_repeats < 1:
        p.error("--stall-repeats must be positive")
    if a.tokens < (a.seq_len + 1) * a.batch_size * 4:
        p.error(f"--tokens {a.tokens} is too small for batches of {a.batch_size} x {a.seq_len}")
    from .data import parse_doc_length

    try:
        parse_doc_length(a.doc_length)
    except ValueError as e:
        p.error(str(e))
    for opt in ("only", "skip"):
        v = getattr(a, opt)
        sel = set() if v is None else {x.strip() for x in v.split(",") if x.strip()}
        bad = sel - set(GROUPS)
        if bad:
            p.error(f"--{opt}: unknown group(s) {', '.join(sorted(bad))}; choose from {', '.join(GROUPS)}")
        setattr(a, opt, sel or None)
    a.groups = (a.only or set(GROUPS)) - (a.skip or set())
    keys = [x.key for x in PEERS]
    if a.peers is None:
        a.peers = list(keys)
    else:
        a.peers = [x.strip() for x in a.peers.split(",") if x.strip()]
        bad = [x for x in a.peers if x not in keys]
        if bad:
            p.error(f"--peers: unknown peer(s) {', '.join(bad)}; choose from {', '.join(keys)}")
    if a.no_peers:
        a.groups.discard("peers")
        a.peers = []
    # stalls is measured on the rows of the loader groups; asked for without any of them, it
    # measures the main loaders of tokenfeed and the baselines, and only those rows
    a.stalls_only = "stalls" in a.groups and not a.groups & set(LOADER_GROUPS)
    if a.stalls_only:
        implied = {g for g in ("tokenfeed", "baselines") if g not in (a.skip or set())}
        if not implied:
            p.error("the stalls group measures loaders, and --skip leaves it none: keep tokenfeed or baselines "
                    "(or add peers to --only), or skip stalls too")
        a.groups |= implied
    if a.compare and not os.path.exists(a.compare):
        p.error(f"--compare {a.compare}: no such file")
    return a


def _write_json(report: Any, path: str) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(report, f, indent=1, default=str)
    os.replace(path + ".tmp", path)


def main(argv: Optional[List[str]] = None, run: Optional[Callable[[argparse.Namespace], Any]] = None) -> int:
    """CLI entry of ``tokenfeed bench``. Returns the exit status."""
    raw_argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(raw_argv)
    args.argv = raw_argv
    old = None
    if args.compare:
        try:
            with open(args.compare) as f:
                old = json.load(f)
        except (OSError, ValueError) as e:
            sys.stderr.write(f"tokenfeed bench: --compare {args.compare}: {e}\n")
            return 2
    if run is None:
        from .suites import run as run_all

        run = run_all
    try:
        report = run(args)
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130
    from . import report as rep

    print(rep.format_summary(report, verbose=getattr(args, "verbose", False)))
    if args.json:
        _write_json(report, args.json)
        sys.stderr.write(f"wrote {args.json}\n")
    if old is not None:
        print()
        print(rep.format_compare(old, report))
    if args.plot:
        from .plot import write_plot

        err = write_plot(report, args.plot)
        if err:
            sys.stderr.write(f"--plot: {err}\n")
            return 1
        sys.stderr.write(f"wrote {args.plot}\n")
    return 0
