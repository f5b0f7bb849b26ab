"""Install hints for optional features, runnable however tokenfeed was installed.

``pip install 'tokenfeed[remote]'`` only works where tokenfeed itself comes from a
package index; from a wheel file or a source tree pip answers "No matching
distribution". The hints name the packages each extra brings instead (the same
requirements as the extras in pyproject.toml; tests/cli/test_cli.py checks they agree).
"""
from __future__ import annotations

import shlex
from typing import Dict, Tuple

EXTRAS: Dict[str, Tuple[str, ...]] = {
    "torch": ("torch>=2.0",),
    "remote": ("obstore>=0.6",),
    "bench": ("matplotlib>=3.5",),
    "datatrove": ("datatrove>=0.5", "orjson", "tokenizers>=0.13"),
}


def pip_hint(extra: str) -> str:
    """``pip install ...`` for the packages of `extra`, quoted for a POSIX shell."""
    return "pip install " + " ".join(shlex.quote(r) for r in EXTRAS[extra])
