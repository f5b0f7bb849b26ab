"""Soak, short form: benchmarks/soak.py at 10^5 batches and 10^3
loaders + datasets opened and closed. RSS must stay flat after warm-up (generous
16 MiB margin here; the full run in docs/reliability.md uses 4 MiB), and open file
descriptors and threads must come back to their baseline. Never asserts timing.
Runs in a subprocess so that what other tests left in this process is not counted."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import ROOT

# Under ASan (.ci/sanitize.sh sets TOKENFEED_SANITIZED) freed memory sits in the
# allocator's quarantine (256 MiB by default), so RSS grows without a leak: only
# descriptors and threads are checked there.
SANITIZED = bool(os.environ.get("TOKENFEED_SANITIZED"))


def test_soak_short(tmp_path):
    out = tmp_path / "soak.json"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "soak.py"), "--batches", "100000",
                        "--every", "10000", "--loaders", "1000", "--rss-slack-mb", "16", "--json", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert out.exists(), r.stdout + r.stderr
    res = json.loads(out.read_text())
    for phase in ("batches", "loaders"):
        p = res[phase]
        assert p["flat"]["fds"], f"{phase}: file descriptors {p['fds']}\n{r.stdout}"
        assert p["flat"]["threads"], f"{phase}: threads {p['threads']}\n{r.stdout}"
        if not SANITIZED:
            assert p["flat"]["rss"], f"{phase}: RSS grew {p['rss_growth_after_warmup'] / 2**20:.1f} MiB\n{r.stdout}"
        # nothing left behind at all: the end equals the start, not just the warm-up point
        assert p["fds"]["end"] == p["fds"]["start"] and p["threads"]["end"] == p["threads"]["start"], r.stdout
    assert r.returncode == 0 or SANITIZED, r.stdout + r.stderr
