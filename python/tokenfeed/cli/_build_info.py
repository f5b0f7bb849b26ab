"""``tokenfeed build-info``: what this build has, what is usable here, how to get the rest."""
from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_parser", "cmd_build_info"]


def cmd_build_info(a: argparse.Namespace) -> int:
    from ..common._build import report

    print(report())
    return 0


def add_parser(sub: Any) -> None:
    sub.add_parser("build-info", help="what this build has (zstd, io_uring, CUDA), what is usable here, how to get the rest",
                   description="Print what the C core was built with and what is usable on this machine; for a "
                               "library the build lacks, which package to install.").set_defaults(func=cmd_build_info)
