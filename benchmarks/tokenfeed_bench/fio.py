"""The device's random-read limit, measured with fio on the same file the loaders read.

A shuffled sample of seq_len + 1 tokens (4098 bytes for 2049 uint16 tokens) costs one
random read of its pages: fio reads blocks of that size rounded up to 4 KiB, O_DIRECT,
at queue depth 1 (one synchronous reader: a page fault) and at a deep queue (what
io_uring can keep in flight). ``tokens/s limit = IOPS x seq_len``.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any, Dict, List, Optional, Sequence


def _engine(fio: str) -> str:
    try:
        p = subprocess.run([fio, "--enghelp"], capture_output=True, text=True, timeout=30)
        engines = p.stdout
    except (OSError, subprocess.TimeoutExpired):
        engines = ""
    for e in ("io_uring", "libaio"):
        if e in engines:
            return e
    return "psync"


def sample_block(sample_bytes: int) -> int:
    return max(4096, -(-sample_bytes // 4096) * 4096)


def randread(path: str, *, sample_bytes: int, seq_len: int, seconds: float, depths: Sequence[int] = (1, 32),
             fio: Optional[str] = None) -> Dict[str, Any]:
    """fio random reads over `path`; {"status", "engine", "block_bytes", "runs": [...]} or a reason."""
    fio = fio or shutil.which("fio")
    if not fio:
        return {"status": "skipped", "reason": "fio is not installed (apt-get install fio): no device limit to "
                                               "compare with"}
    bs = sample_block(sample_bytes)
    engine = _engine(fio)
    runs: List[Dict[str, Any]] = []
    for qd in depths:
        cmd = [fio, "--name=randread", f"--filename={path}", "--readonly", "--rw=randread", f"--bs={bs}",
               "--direct=1", f"--ioengine={engine}", f"--iodepth={qd if engine != 'psync' else 1}",
               f"--runtime={max(1, int(round(seconds)))}", "--time_based", "--norandommap",
               "--randrepeat=0", "--output-format=json"]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120)
        except subprocess.TimeoutExpired:
            return {"status": "failed", "reason": "fio did not finish", "command": " ".join(cmd)}
        if p.returncode != 0:
            return {"status": "failed", "reason": f"fio exited {p.returncode}: {p.stderr.strip()[-300:]}",
                    "command": " ".join(cmd)}
        try:
            j = json.loads(p.stdout[p.stdout.index("{"):])
            rd = j["jobs"][0]["read"]
        except (ValueError, KeyError, IndexError) as e:
            return {"status": "failed", "reason": f"could not read fio's JSON: {e}"}
        pct = rd.get("clat_ns", {}).get("percentile", {})
        iops = float(rd["iops"])
        runs.append({"iodepth": qd, "iops": iops, "mb_per_s": rd["bw_bytes"] / 1e6,
                     "lat_p50_us": pct.get("50.000000", 0) / 1e3, "lat_p99_us": pct.get("99.000000", 0) / 1e3,
                     "tokens_per_s_limit": iops * seq_len, "command": " ".join(cmd)})
    return {"status": "ok", "engine": engine, "block_bytes": bs, "runs": runs,
            "method": f"fio randread bs={bs} O_DIRECT {engine}: one read per shuffled sample of "
                      f"{sample_bytes} bytes; tokens/s limit = IOPS x seq_len"}
