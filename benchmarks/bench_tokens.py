#!/usr/bin/env python3
"""Tokens/s of tokenfeed beside the C gather ceiling, nanoGPT, torch DataLoader and peer loaders.

The same as ``tokenfeed bench``; see ``python benchmarks/bench_tokens.py --help`` and
docs/performance.md. Example: ``python benchmarks/bench_tokens.py --quick --json out.json``.
"""
import sys

from tokenfeed.bench import main

if __name__ == "__main__":
    sys.exit(main())
