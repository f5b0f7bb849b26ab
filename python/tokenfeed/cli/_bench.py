"""``tokenfeed bench``: the benchmark, a package of its own (tokenfeed_bench), handed every argument."""
from __future__ import annotations

import os
import sys
from typing import Any, List

from ._common import PROG

__all__ = ["add_parser", "cmd_bench"]


def cmd_bench(argv: List[str]) -> int:
    """Hand the arguments to the benchmark, a separate package (tokenfeed_bench) imported only here."""
    import importlib

    here = os.path.dirname(os.path.abspath(__file__))
    checkout = os.path.normpath(os.path.join(here, "..", "..", "..", "benchmarks"))  # a source tree, not installed
    for attempt in (0, 1):
        try:
            bench = importlib.import_module("tokenfeed_bench")
            break
        except ModuleNotFoundError as e:
            if e.name != "tokenfeed_bench":
                raise  # the benchmark exists but needs something missing: show that, not "not available"
            if attempt == 0 and os.path.isdir(os.path.join(checkout, "tokenfeed_bench")):
                sys.path.insert(0, checkout)
                continue
            print(f"{PROG} bench: the benchmark package (tokenfeed_bench) is not available in this installation; "
                  "reinstall tokenfeed, or run python benchmarks/bench_tokens.py from a source checkout",
                  file=sys.stderr)
            return 2
    rc = bench.main(argv)
    return int(rc or 0)


def add_parser(sub: Any) -> None:
    # a name in the list of commands only: main() hands everything after "bench" to cmd_bench
    sub.add_parser("bench", add_help=False, help="benchmark the loader (see 'tokenfeed bench --help')")
