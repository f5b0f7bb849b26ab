"""Small pieces every part of the benchmark uses: progress log, number formatting,
/proc sampling, machine description and the child-process protocol.

Nothing here imports tokenfeed, torch or a peer: this module is also imported inside
the peer virtual environments, which have neither tokenfeed nor the user's packages.
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

RESULT = "@@RESULT@@"


def default_cache() -> str:
    """``$TOKENFEED_BENCH_CACHE``, else ``$XDG_CACHE_HOME/tokenfeed/bench`` (``~/.cache/...``)."""
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.environ.get("TOKENFEED_BENCH_CACHE") or os.path.join(xdg, "tokenfeed", "bench")


def parse_count(s: str) -> int:
    """Parse 5e7, 50M, 1G, 2**20 style counts (decimal suffixes)."""
    t = s.strip().lower().replace("_", "")
    mult = {"k": 10**3, "m": 10**6, "g": 10**9, "b": 10**9, "t": 10**12}
    if t and t[-1] in mult:
        return int(float(t[:-1]) * mult[t[-1]])
    if "**" in t:
        a, b = t.split("**")
        return int(a) ** int(b)
    return int(float(t))


def parse_size(s: str) -> int:
    """Parse a byte size: 40G, 2.5GiB, 512M, 1e9 (G = 10^9, GiB = 2^30)."""
    t = s.strip().lower().replace("_", "")
    for suf, m in (("kib", 2**10), ("mib", 2**20), ("gib", 2**30), ("tib", 2**40)):
        if t.endswith(suf):
            return int(float(t[: -len(suf)]) * m)
    t = t[:-1] if t.endswith("b") and len(t) > 1 and not t[-2].isdigit() else t
    return parse_count(t)


def human(n: Optional[float], unit: str = "") -> str:
    if n is None:
        return "-"
    for suffix in ("", "K", "M", "G", "T", "P"):
        if abs(n) < 1000:
            return f"{n:.3g}{suffix}{unit}" if suffix or n != int(n) else f"{int(n)}{unit}"
        n /= 1000
    return f"{n:.3g}E{unit}"


def human_bytes(n: float) -> str:
    for suffix in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or suffix == "TiB":
            return f"{n:.3g} {suffix}" if suffix != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n} B"


class Log:
    """Progress lines on stderr, stamped with seconds since the run started."""

    def __init__(self, quiet: bool = False) -> None:
        self.quiet = quiet
        self.t0 = time.monotonic()

    def __call__(self, msg: str) -> None:
        if not self.quiet:
            sys.stderr.write(f"[{time.monotonic() - self.t0:6.1f}s] {msg}\n")
            sys.stderr.flush()


# ----------------------------------------------------------------------------- /proc


def self_status(key: str) -> int:
    """A kB figure (VmRSS, VmHWM) of this process from /proc/self/status."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS, so the peak that follows belongs to what is measured."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def descendants_cpu_hwm() -> Tuple[Dict[int, float], int]:
    """({pid: cpu seconds}, summed VmHWM kB) of this process's descendants (DataLoader workers and the like)."""
    me = os.getpid()
    parent: Dict[int, int] = {}
    cpu: Dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                s = f.read()
            fields = s[s.rindex(")") + 2:].split()
            parent[int(name)] = int(fields[1])
            cpu[int(name)] = (int(fields[11]) + int(fields[12])) / tick
        except (OSError, ValueError, IndexError):
            continue
    kids = {me}
    changed = True
    while changed:
        changed = False
        for pid, pp in parent.items():
            if pp in kids and pid not in kids:
                kids.add(pid)
                changed = True
    kids.discard(me)
    hwm = 0
    for pid in kids:
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        hwm += int(line.split()[1])
        except OSError:
            pass
    return {p: cpu.get(p, 0.0) for p in kids}, hwm


def meminfo_bytes(key: str = "MemTotal") -> Optional[int]:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def machine_info() -> Dict[str, Any]:
    """CPU, cores, memory, kernel, Python and package versions of the machine the run is on."""
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = meminfo_bytes()
    info: Dict[str, Any] = {"cpu_model": cpu, "cores": os.cpu_count(),
                            "memory_gib": round(mem / 2**30, 1) if mem else None,
                            "kernel": platform.release(), "python": platform.python_version()}
    import importlib.metadata as md

    for pkg in ("numpy", "torch", "tokenfeed"):
        try:
            info[pkg] = md.version(pkg)
        except Exception:
            info[pkg] = None
    try:
        import tokenfeed

        info["tokenfeed"] = tokenfeed.__version__
        info["build_info"] = tokenfeed.build_info()
    except Exception as e:  # pragma: no cover - a broken install is reported, not raised
        info["tokenfeed"] = f"unavailable: {e}"
    return info


# ----------------------------------------------------------------------------- children


def package_parent() -> str:
    """The directory that holds the tokenfeed_bench package (for a child's PYTHONPATH)."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def spawn(case: Dict[str, Any], python: str = sys.executable, timeout: float = 300.0,
          pythonpath: Optional[str] = None) -> Dict[str, Any]:
    """Run one measurement in a fresh interpreter; return its result dict (never raises).

    The child reads the case as JSON on stdin and prints RESULT + JSON as its last line,
    so peak RSS and CPU time belong to that loader alone.
    """
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONPATH"] = os.pathsep.join(x for x in (pythonpath or package_parent(), env.get("PYTHONPATH")) if x)
    env["PYTHONNOUSERSITE"] = "1"
    try:
        p = subprocess.run([python, "-c", "import sys; from tokenfeed_bench.worker import main; sys.exit(main())"],
                           input=json.dumps(case), capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"status": "failed", "reason": f"timed out after {timeout:.0f}s"}
    except OSError as e:
        return {"status": "failed", "reason": f"could not start {python}: {e}"}
    return parse_result(p.stdout, p.stderr, p.returncode)


def parse_result(stdout: str, stderr: str, returncode: int) -> Dict[str, Any]:
    k = stdout.rfind(RESULT)
    if k < 0:
        err = [x for x in (stderr or "").strip().splitlines() if x.strip()]
        return {"status": "failed", "reason": f"worker exited {returncode}: {' | '.join(err[-3:])[:600]}"}
    r: Dict[str, Any] = json.loads(stdout[k + len(RESULT):].strip().splitlines()[0])
    return r


def percentiles(times: Sequence[float], qs: Sequence[float] = (50, 99)) -> List[float]:
    if not times:
        return [0.0 for _ in qs]
    s = sorted(times)
    return [s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))] for q in qs]
