"""What the commands share: the program's name, the error a user can fix, the options several commands
take, and the library's keywords said as command-line flags."""
from __future__ import annotations

import argparse
import re
from typing import Any

from .. import _core

PROG = "tokenfeed"


class CLIError(Exception):
    """A problem the user can fix; printed as one line, exit status 1."""


def _human(n: float) -> str:
    from ..common._progress import _human as h

    return h(n)


def _progress_option(p: Any) -> None:
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar on stderr (default: when stderr is a terminal)")


def _source_options(p: Any) -> None:
    p.add_argument("--dtype", help="token dtype of headerless files (uint16, uint32, int32, ...); "
                                   "required for raw token files (nanoGPT .bin, OLMo .npy-less, datatrove .ds)")
    p.add_argument("--format", choices=list(_core.Dataset.formats()),  # the C library's format table
                   help="input format (default: detected)")


# Keyword arguments that the library's messages advise, and the command-line flag that
# does the same: a message shown by the CLI names what can be typed there.
_FLAGS = {"dtype": "--dtype", "format": "--format", "vocab_size": "--vocab-size", "block_tokens": "--block-tokens",
          "seq_len": "--seq-len", "packing": "--packing"}
_KW = re.compile(r"\b(" + "|".join(_FLAGS) + r")=(?:([\"'])([^\"']*)\2|(?=[\s).,;]|$))")


def cli_words(msg: str) -> str:
    """`msg` with library keywords (``dtype="uint16"``, ``pass dtype=``) as CLI flags (``--dtype uint16``)."""
    return _KW.sub(lambda m: _FLAGS[m.group(1)] + (f" {m.group(3)}" if m.group(2) else ""), msg)

