"""The ``tokenfeed`` command line: convert, merge, inspect, verify, cache, bench, build-info.

::

    tokenfeed convert corpus/*.jsonl data/train --tokenizer tokenizer.json
    tokenfeed convert megatron/my_text_document data/train --compression zstd
    tokenfeed convert corpus/ data/train --tokenizer tokenizer.json --tasks 64 --workers 8
    tokenfeed merge data/train
    tokenfeed inspect data/train --seq-len 2048
    tokenfeed verify data/train
    tokenfeed verify s3://bucket/train/
    tokenfeed cache show
    tokenfeed bench --quick
    tokenfeed build-info

Each subcommand has ``--help``. Errors (bad input, missing files, bad options) print
one line on stderr and exit with status 1; ``--debug`` shows the traceback instead.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, Optional, Sequence

from ..sources._text import ConvertError
from . import (_bench, _build_info, _cache, _convert, _exclude, _explain, _index, _inspect, _merge, _meta, _verify,
               _where)
from ._common import PROG, CLIError, cli_words

__all__ = ["main"]

# the commands, in the order of the list that --help shows: each module adds its parser
COMMANDS = (_convert, _merge, _inspect, _verify, _cache, _explain, _where, _index, _meta, _exclude, _bench,
            _build_info)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=PROG, description="Convert, merge, inspect and verify token datasets for tokenfeed; show or prune "
                               "the node-local cache of remote datasets; benchmark the loader; say what this build has.",
        epilog="Run 'tokenfeed COMMAND --help' for each command's options. Docs: docs/quickstart.md")
    ap.add_argument("--debug", action="store_true", help="show Python tracebacks on errors")
    ap.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")

    for command in COMMANDS:
        command.add_parser(sub)
    return ap


def _version() -> str:
    try:
        from .. import __version__

        return __version__
    except Exception:
        return "unknown"


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``tokenfeed`` console script and ``python -m tokenfeed``. Returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args  # accepted before or after the command, for every command
    args = [x for x in args if x != "--debug"]
    # bench forwards everything after its name to the benchmark package
    if "bench" in args:
        k = args.index("bench")
        if all(x.startswith("-") for x in args[:k]):
            return _run(lambda: _bench.cmd_bench(args[k + 1:]), debug)
    ap = build_parser()
    a = ap.parse_args(args)
    a.debug = debug
    if a.command is None:
        ap.print_help()
        return 2
    if a.command == "convert":
        if len(a.paths) < 2:
            ap.parse_args(["convert", "--help"]) if not a.paths else None
            print(f"{PROG} convert: error: give at least one INPUT and the OUT directory", file=sys.stderr)
            return 2
        a.inputs, a.out = a.paths[:-1], a.paths[-1]
    return _run(lambda: a.func(a), debug)


def _run(fn: Callable[[], int], debug: bool) -> int:
    from .._core import FormatError

    try:
        return fn()
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `tokenfeed inspect ... | head`: stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except (CLIError, ConvertError, FormatError, OSError, ValueError, NotImplementedError, ImportError) as e:
        if debug:
            raise
        msg = str(e)
        if isinstance(e, NotImplementedError):  # a feature this build lacks
            msg += f" ('{PROG} build-info' says what this build has and how to get the rest)"
        if isinstance(e, OSError) and e.strerror:  # drop the "[Errno N]" prefix
            msg = e.strerror
        if isinstance(e, OSError) and e.filename and str(e.filename) not in msg:
            msg = f"{e.filename}: {msg}"
        print(f"{PROG}: error: {cli_words(msg)}", file=sys.stderr)
        return 1
    except Exception as e:  # anything else (a missing optional module, a bug): one line, the traceback on --debug
        if debug:
            raise
        print(f"{PROG}: error: {type(e).__name__}: {cli_words(str(e))} (rerun with --debug for the traceback)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
