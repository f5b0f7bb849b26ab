#!/usr/bin/env python3
"""open() of 10^4 sparse llm.c shards totalling 10^12 tokens: time and memory.

Target: under 1 s and under 100 MB (peak RSS delta of a fresh process). Each size runs in
its own process; the shards are sparse files (a real header, a hole for the tokens) kept
in the cache directory. Also prints time to first shuffled batch.

    python benchmarks/open_scaling.py                # 10^12 tokens in 10^4 shards
    python benchmarks/open_scaling.py --sizes 1e9 1e10 1e11 1e12 --json scaling.json
    python benchmarks/open_scaling.py --startup 10 1000 10000 100000   # open to first batch against shard count

--syscalls counts the metadata system calls (stat, fstat, newfstatat, statx, open, openat,
access, readlink, getdents64: on a shared file system each is a round trip to a metadata
server) of open() and the first batch in a fresh process, after `import tokenfeed`, with
`strace -f` (installed with apt-get when missing and possible; without it only times are
given), and times open to first batch, for llm.c shard sets of each count opened as a glob
and as a directory: first and second open, with the node's catalog and without it
(TOKENFEED_CATALOG_DIR=off, where every open is a first one).

    python benchmarks/open_scaling.py --syscalls 10 1000 10000 100000

--startup times open() to the first batch in a fresh process for a glob of llm.c shards and
a native dataset of that many shards (up to 10^4), without the node's catalog (cold: the
files' pages dropped from the page cache first; warm: again) and with it (the first open,
which writes it; then cold and warm opens that read it), and prints the ratio of each warm
figure to the smallest count's.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from typing import Any, Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tokenfeed_bench.common import default_cache as _default_cache  # noqa: E402
from tokenfeed_bench.scaling import open_scaling, startup_scaling  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", nargs="+", type=float, default=[1e12], help="total tokens per dataset")
    p.add_argument("--shards", type=int, default=10_000, help="shards for the largest size (default 10^4)")
    p.add_argument("--cache-dir", default=_default_cache())
    p.add_argument("--json", help="write the figures as JSON")
    p.add_argument("--clean", action="store_true", help="remove the sparse files afterwards")
    p.add_argument("--startup", nargs="+", type=int, metavar="SHARDS",
                   help="instead: open to first batch at these shard counts, cold and warm")
    p.add_argument("--syscalls", nargs="+", type=int, metavar="SHARDS",
                   help="instead: metadata system calls and time of open and first batch at these shard counts")
    p.add_argument("--repeats", type=int, default=5,
                   help="--startup: warm figures are the median of this many fresh processes (default 5)")
    a = p.parse_args()
    if a.syscalls:
        return syscalls(a)
    if a.startup:
        return startup(a)
    sizes = [int(s) for s in a.sizes]
    big = max(sizes)
    shards = lambda n: max(1, round(a.shards * n / big))  # noqa: E731
    rows = open_scaling(a.cache_dir, sizes, shards_for=shards, log=lambda m: print(m, file=sys.stderr))
    ok = True
    for r in rows:
        if r["status"] != "ok":
            print(f"{r['tokens']:.0e} tokens: failed: {r['reason']}")
            ok = False
            continue
        good = r["open_s"] < 1.0 and r["open_rss_delta_mb"] < 100
        ok &= good
        print(f"{r['tokens']:.0e} tokens in {r['shards']} shards ({r['format']}): open() {r['open_s'] * 1e3:.0f} ms, "
              f"peak RSS +{r['open_rss_delta_mb']:.1f} MB; first batch {r['first_batch_s'] * 1e3:.0f} ms "
              f"(+{r['first_batch_rss_delta_mb']:.1f} MB) -> {'OK' if good else 'OVER TARGET'} (< 1 s, < 100 MB)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    if a.clean:
        shutil.rmtree(os.path.join(a.cache_dir, "sparse"), ignore_errors=True)
    return 0 if ok else 1


def startup(a: argparse.Namespace) -> int:
    rows = startup_scaling(a.cache_dir, sorted(a.startup), log=lambda m: print(m, file=sys.stderr),
                           warm_repeats=max(1, a.repeats))
    ok = [r for r in rows if r["status"] == "ok"]
    base = {(r["set"], r["catalog"]): r for r in ok
            if r["start"] == "warm" and r["shards"] == min(a.startup)}
    print("| set | shards | no catalog: cold / warm (ms) | catalog: first open / cold / warm (ms) "
          "| warm / smallest, without / with catalog |")
    print("|---|--:|--:|--:|--:|")

    def ms(kind: str, k: int, cat: str, start: str) -> str:
        r = next((r for r in rows if (r["set"], r["shards"], r["catalog"], r["start"]) == (kind, k, cat, start)), None)
        return f"{r['first_batch_s'] * 1e3:.1f}" if r and r["status"] == "ok" else "failed" if r else "-"

    def ratio(kind: str, k: int, cat: str) -> str:
        w = next((r for r in ok if (r["set"], r["shards"], r["catalog"], r["start"]) == (kind, k, cat, "warm")), None)
        b = base.get((kind, cat))
        return f"{w['first_batch_s'] / b['first_batch_s']:.1f}x" if w and b else "-"

    for kind in dict.fromkeys(r["set"] for r in rows):
        for k in sorted(a.startup):
            if not any(r["set"] == kind and r["shards"] == k for r in rows):
                continue
            print(f"| {kind} | {k:,} | {ms(kind, k, 'none', 'cold')} / {ms(kind, k, 'none', 'warm')} "
                  f"| {ms(kind, k, 'first open', 'cold')} / {ms(kind, k, 'read', 'cold')} / {ms(kind, k, 'read', 'warm')} "
                  f"| {ratio(kind, k, 'none')} / {ratio(kind, k, 'read')} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if all(r["status"] == "ok" for r in rows) else 1


# ---- --syscalls: metadata calls of start-up against the shard count -----------------------------

_META = "stat,lstat,fstat,newfstatat,statx,open,openat,access,faccessat,faccessat2,readlink,readlinkat,getdents64"

_CHILD = """
import os, sys, time
import tokenfeed
os.path.exists("/tokenfeed-mark-start")
t0 = time.perf_counter()
ds = tokenfeed.open(sys.argv[1])
loader = tokenfeed.Loader(ds, seq_len=512, batch_size=8, seed=0, output="numpy")
next(iter(loader))
t1 = time.perf_counter()
os.path.exists("/tokenfeed-mark-end")
loader.close()
print("@@", ds.num_files, t1 - t0)
"""


def _find_strace() -> "str | None":
    exe = shutil.which("strace")
    if exe is None and shutil.which("apt-get") and os.geteuid() == 0:
        subprocess.run(["apt-get", "install", "-y", "-qq", "strace"], capture_output=True)
        exe = shutil.which("strace")
    if exe and subprocess.run([exe, "-f", "-o", os.devnull, "true"], capture_output=True).returncode != 0:
        return None  # no ptrace here
    return exe


def _shards(root: str, k: int) -> str:
    """k llm.c shards of 4096 tokens (sparse: a header and a hole) in root/llmc-k, aged past
    the catalog's 2 s settling time; the stamp that says they are complete lies beside it."""
    d = os.path.join(root, f"llmc-{k}")
    if not os.path.exists(d + ".done"):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        header = bytearray(1024)
        header[0:12] = (20240520).to_bytes(4, "little") + (1).to_bytes(4, "little") + (4096).to_bytes(4, "little")
        for i in range(k):
            with open(os.path.join(d, f"s_{i:06d}.bin"), "wb") as f:
                f.write(header)
                f.truncate(1024 + 2 * 4096)
        old = time.time() - 3600
        for n in os.listdir(d):
            os.utime(os.path.join(d, n), (old, old))
        os.utime(d, (old, old))
        open(d + ".done", "w").close()
    return d


def _child_run(spec: str, env: Dict[str, str], strace: "str | None") -> Dict[str, Any]:
    import tempfile

    cmd = [sys.executable, "-c", _CHILD, spec]
    trace = None
    if strace:
        fd, trace = tempfile.mkstemp(prefix="tokenfeed-trace-")
        os.close(fd)
        cmd = [strace, "-f", "-qq", "-o", trace, "-e", "trace=" + _META] + cmd
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    out: Dict[str, Any] = {"ok": r.returncode == 0}
    for line in r.stdout.splitlines():
        if line.startswith("@@ "):
            _, files, secs = line.split()
            out.update(files=int(files), seconds=float(secs))
    if not out["ok"]:
        out["reason"] = (r.stderr.strip().splitlines() or ["?"])[-1]
    if trace:
        calls, on = 0, False
        with open(trace) as f:
            for line in f:
                if "tokenfeed-mark-start" in line:
                    on = True
                elif "tokenfeed-mark-end" in line:
                    on = False
                elif on and "resumed>" not in line and "+++" not in line and "---" not in line:
                    calls += 1
        os.unlink(trace)
        out["calls"] = calls
    return out


def syscalls(a: argparse.Namespace) -> int:
    import tempfile

    strace = _find_strace()
    if strace is None:
        print("strace is not available (apt-get install strace; ptrace allowed): times only", file=sys.stderr)
    root = os.path.join(a.cache_dir, "syscalls")
    os.makedirs(root, exist_ok=True)
    rows: List[Dict[str, Any]] = []
    env0 = dict(os.environ, PYTHONPATH=os.pathsep.join(
        x for x in (os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + "/python",
                    os.environ.get("PYTHONPATH")) if x))
    for k in sorted(a.syscalls):
        d = _shards(root, k)
        for form, spec in (("glob", os.path.join(d, "s_*.bin")), ("directory", d + "/")):
            for catalog in ("on", "off"):
                for start in ("first", "second"):
                    row: Dict[str, Any] = {"shards": k, "set": form, "catalog": catalog, "start": start}
                    times: List[float] = []
                    timed: Dict[str, Any] = {"ok": True}
                    counted: Dict[str, Any] = {}
                    # counted once under strace, timed without it: the median of fresh processes (a shared machine)
                    for rep in range(max(1, a.repeats) + (1 if strace else 0)):
                        with tempfile.TemporaryDirectory(prefix="tokenfeed-cat-") as cat:
                            env = dict(env0, TOKENFEED_CATALOG_DIR=cat if catalog == "on" else "off")
                            if start == "second":
                                _child_run(spec, env, None)  # the first open, which records the set
                            if strace and rep == 0:
                                counted = _child_run(spec, env, strace)
                                continue
                            timed = _child_run(spec, env, None)
                            if timed["ok"]:
                                times.append(timed["seconds"])
                    if times:
                        timed["seconds"] = sorted(times)[len(times) // 2]
                    row.update(ok=bool(times) and counted.get("ok", True), seconds=timed.get("seconds"),
                               calls=counted.get("calls"), reason=timed.get("reason") or counted.get("reason"))
                    print(f"{k} shards, {form}, catalog {catalog}, {start} open: "
                          f"{row['calls'] if row['calls'] is not None else '-'} calls, "
                          f"{(row['seconds'] or 0) * 1e3:.1f} ms" + ("" if row["ok"] else f" FAILED {row['reason']}"),
                          file=sys.stderr)
                    rows.append(row)
    small = min(a.syscalls)

    def cell(k: int, form: str, catalog: str, start: str) -> str:
        r = next(r for r in rows if (r["shards"], r["set"], r["catalog"], r["start"]) == (k, form, catalog, start))
        b = next(r for r in rows if (r["shards"], r["set"], r["catalog"], r["start"]) == (small, form, catalog, start))
        if not r["ok"]:
            return "failed"
        calls = "-" if r["calls"] is None else f"{r['calls']:,}"
        ratio = f" ({r['seconds'] / b['seconds']:.1f}x)" if b["ok"] and b["seconds"] else ""
        return f"{calls} / {r['seconds'] * 1e3:.1f} ms{ratio}"

    print("| set | shards | catalog on: first open | catalog on: second open | catalog off |")
    print("|---|--:|--:|--:|--:|")
    for form in ("glob", "directory"):
        for k in sorted(a.syscalls):
            print(f"| {form} | {k:,} | {cell(k, form, 'on', 'first')} | {cell(k, form, 'on', 'second')} "
                  f"| {cell(k, form, 'off', 'second')} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
