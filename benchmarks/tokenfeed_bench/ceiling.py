"""The C gather ceiling: ``ceiling.c`` compiled at run time and run on the shared samples.

It copies the same shuffled samples out of the memory-mapped flat file into an int64
batch, with no loader around it: the most a loader could deliver on this machine,
and the CPU that plain copying costs.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from typing import Any, Dict, Optional, Tuple

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ceiling.c")


def compile_ceiling(cache: str) -> Tuple[Optional[str], Optional[str]]:
    """(binary, None) or (None, reason). The binary is cached by the source's hash."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        return None, "no C compiler found (set CC or install gcc)"
    try:
        with open(SOURCE, "rb") as f:
            src = f.read()
    except OSError as e:
        return None, f"the ceiling source is missing from this installation: {e}"
    binary = os.path.join(cache, f"ceiling-{hashlib.sha1(src).hexdigest()[:12]}")
    if os.path.exists(binary):
        return binary, None
    os.makedirs(cache, exist_ok=True)
    errs = []
    for flags in (["-O3", "-march=native"], ["-O3"], ["-O2"]):
        p = subprocess.run([cc, *flags, "-pthread", "-o", binary + ".tmp", SOURCE], capture_output=True, text=True)
        if p.returncode == 0:
            os.replace(binary + ".tmp", binary)
            return binary, None
        errs.append(p.stderr.strip()[-300:])
    return None, f"the ceiling program did not compile with {cc}: {errs[-1]}"


def run_ceiling(case: Dict[str, Any]) -> Dict[str, Any]:
    """Run the compiled ceiling on a case; the same figures as a loader's throughput row."""
    try:
        out = subprocess.run([case["binary"], case["path"], "0", str(case["elem_size"]), str(case["seq_len"]),
                              str(case["batch_size"]), case["offsets_file"], str(case["warmup"]),
                              str(case["threads"]), str(case["seconds"]), str(case.get("max_batches", 50_000_000))],
                             capture_output=True, text=True, timeout=case.get("timeout", 300))
    except subprocess.TimeoutExpired:
        return {"status": "failed", "reason": "the ceiling program timed out"}
    if out.returncode != 0:
        return {"status": "failed", "reason": f"ceiling program failed ({out.returncode}): {out.stderr.strip()[-500:]}"}
    j = json.loads(out.stdout.strip().splitlines()[-1])
    toks = j["batches"] * case["batch_size"] * case["seq_len"]
    return {"status": "ok", "batches": j["batches"], "seconds": j["wall_s"], "tokens_per_s": toks / j["wall_s"],
            "batches_per_s": j["batches"] / j["wall_s"], "p50_ms": j["p50_ms"], "p99_ms": j["p99_ms"],
            "cpu_s": j["cpu_s"], "cpu_s_per_btok": j["cpu_s"] / toks * 1e9, "cpu_cores_busy": j["cpu_s"] / j["wall_s"],
            "peak_rss_mb": j["peak_rss_kb"] / 1024}
