#!/usr/bin/env python3
"""The tokenfeed benchmark from a checkout: the same as ``tokenfeed bench``.

    python benchmarks/bench_tokens.py --quick --json out.json --plot chart.png

See ``--help`` and docs/performance.md.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from tokenfeed_bench import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
