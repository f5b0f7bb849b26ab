"""Tables for people: the run's summary, and what changed against an earlier run."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from .common import human, human_bytes


def _table(hdr: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1) -> List[str]:
    """Columns padded to width; the first `left` columns left-aligned, the rest right-aligned."""
    rows = [[" ".join(c.split()) for c in r] for r in rows]  # one line per row, whatever a reason holds
    w = [len(h) for h in hdr]
    for r in rows:
        for i, c in enumerate(r):
            w[i] = max(w[i], len(c))
    fmt = lambda r: "  ".join(c.ljust(w[i]) if i < left else c.rjust(w[i]) for i, c in enumerate(r))  # noqa: E731
    return [fmt(hdr)] + [fmt(r) for r in rows]


def _f(x: Optional[float], spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def _num(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.2f}" if abs(v) >= 1 else f"{v:.4f}"


def throughput_table(report: Dict[str, Any]) -> str:
    ceil_cpu = (report.get("reference") or {}).get("ceiling_cpu_s_per_btok")
    hdr = ("loader", "tokens/s", "p50 ms", "p99 ms", "CPU s/Gtok", "x ceiling CPU", "peak RSS MB", "first batch ms",
           "x tokenfeed", "x ceiling")
    rows, failed = [], []
    for r in report.get("results", []):
        if r.get("status") == "ok" and "tokens_per_s" in r:
            rows.append((r["name"], human(r["tokens_per_s"]), _f(r["p50_ms"]), _f(r["p99_ms"]),
                         _f(r["cpu_s_per_btok"], ".1f"),
                         _f(r["cpu_s_per_btok"] / ceil_cpu if ceil_cpu else None, ".1f"),
                         _f(r["peak_rss_mb"], ".0f"),
                         _f(r["first_batch_s"] * 1e3 if r.get("first_batch_s") is not None else None, ".0f"),
                         _f(r.get("ratio_to_tokenfeed")), _f(r.get("ratio_to_ceiling"))))
        else:
            failed.append(f"{r['name']}: {r.get('status')}: {r.get('reason', '')}")
    out = _table(hdr, rows) if rows else ["(no throughput figures)"]
    if failed:
        out += ["", "did not run:"] + [f"  {x[:300]}" for x in failed]
    return "\n".join(out)


def stall_table(report: Dict[str, Any]) -> Optional[str]:
    rows = [r for r in report.get("results", []) if r.get("status") == "ok" and r.get("stalls")]
    if not rows:
        return None
    steps = [s["step_ms"] for s in rows[0]["stalls"]]
    hdr = ["waiting for data, % of wall time"] + [f"T={s:g} ms" for s in steps]
    body = []
    for r in rows:
        by = {s["step_ms"]: s for s in r["stalls"]}
        body.append([r["name"]] + [f"{by[s]['stall_fraction'] * 100:.1f}" if s in by else "-" for s in steps])
    return "\n".join(_table(hdr, body))


def larger_lines(report: Dict[str, Any]) -> List[str]:
    big = report.get("larger_than_memory")
    if not big:
        return []
    if big.get("status") != "ok":
        return [f"larger than memory: {big.get('status')}: {big.get('reason')}"]
    fits = "larger than" if big["exceeds_ram"] else "NOT larger than (it fits in the page cache)"
    out = [f"shuffled reads of {human_bytes(big['bytes'])}, {fits} {human_bytes(big['ram_bytes'])} RAM:"]
    f = big.get("fio", {})
    hdr = ("reader", "tokens/s", "p99 ms", "CPU s/Gtok", "x fio limit")
    rows = []
    if f.get("status") == "ok":
        for x in f["runs"]:
            rows.append((f"fio randread {f['block_bytes'] // 1024} KiB QD{x['iodepth']} ({x['iops']:,.0f} IOPS)",
                         human(x["tokens_per_s_limit"]), _f(x["lat_p99_us"] / 1e3), "-", "1.000"))
    for r in big.get("rows", []):
        name = r["name"].replace("larger than memory: ", "")
        if r.get("status") == "ok":
            rows.append((name, human(r["tokens_per_s"]), _f(r["p99_ms"]), _f(r["cpu_s_per_btok"], ".1f"),
                         _f(r.get("ratio_to_fio"))))
        else:
            rows.append((name, f"{r.get('status')}: {r.get('reason')}"[:100], "", "", ""))
    out += _table(hdr, rows)
    if f.get("status") != "ok":
        out.append(f"fio: {f.get('status')}: {f.get('reason')}")
    return out


def startup_lines(report: Dict[str, Any]) -> List[str]:
    rows = report.get("startup") or []
    if not rows:
        return []
    hdr = ("time to first batch", "shards", "tokens", "ms")
    body = []
    for r in rows:
        what = r["loader"] + (" (sparse)" if r.get("sparse") else "") + (" (default layout)" if r.get("layout") else "")
        val = _f(r["first_batch_s"] * 1e3, ".0f") if r.get("status") == "ok" else \
            f"{r.get('status')}: {r.get('reason')}"[:100]
        body.append((what, f"{r['shards']:,}", human(r.get("tokens")), val))
    return _table(hdr, body, left=1)


def restore_lines(report: Dict[str, Any]) -> List[str]:
    rows = report.get("restore") or []
    if not rows:
        return []
    hdr = ("restore, then first batch", "position (samples)", "ms")
    body, how, failed = [], {}, []
    for r in rows:
        if r.get("status") == "ok":
            body.append((r["loader"], human(r["position"]), _f(r["restore_s"] * 1e3, ".1f")))
            how.setdefault(r["loader"], r.get("method", ""))
        else:
            failed.append(f"  {r['loader']}: {r.get('status')}: {' '.join(str(r.get('reason')).split())[:300]}")
    out = _table(hdr, body, left=1) if body else []
    out += [f"  {k}: {v}" for k, v in how.items() if v]
    return out + (["did not run:"] + failed if failed else [])


def format_summary(report: Dict[str, Any]) -> str:
    m = report.get("machine", {})
    c = report.get("config", {})
    out = [f"tokenfeed bench: {c.get('batch_size')} x {c.get('seq_len')} {c.get('data_dtype')} -> int64, shuffled; "
           f"{m.get('cpu_model')}, {m.get('cores')} cores, {m.get('memory_gib')} GiB", "", throughput_table(report)]
    st = stall_table(report)
    if st:
        out += ["", st]
    for part in (larger_lines(report), startup_lines(report), restore_lines(report)):
        if part:
            out += [""] + part
    z = report.get("zstd")
    if z and z.get("status") == "ok":
        out += ["", f"zstd level {z['level']}: ratio {z['ratio']:.3f}, decode {human(z['decode_tokens_per_s'])} "
                    f"tokens/s ({z['decode_mb_per_s']:.0f} MB/s)"]
    envs = report.get("peer_envs") or {}
    if envs:
        out += ["", "peer environments: " + "; ".join(
            f"{k} {v['status']}" + (f" ({v.get('seconds')}s)" if v.get("status") == "ok" and not v.get("reused")
                                    else " (reused)" if v.get("reused") else "")
            for k, v in envs.items())]
    if report.get("total_seconds") is not None:
        out += [f"wall time {report['total_seconds']:.0f}s"]
    return "\n".join(out)


# ----------------------------------------------------------------------------- compare


def _figures(report: Dict[str, Any]) -> Dict[Tuple[str, str], Tuple[float, str, bool]]:
    """{(section, what): (value, unit, higher_is_better)} for every comparable figure of a report."""
    f: Dict[Tuple[str, str], Tuple[float, str, bool]] = {}
    for r in report.get("results", []):
        if r.get("status") != "ok" or "tokens_per_s" not in r:
            continue
        f[("tokens/s", r["name"])] = (r["tokens_per_s"], "tokens/s", True)
        f[("CPU s/Gtok", r["name"])] = (r["cpu_s_per_btok"], "s", False)
        f[("p99 ms", r["name"])] = (r["p99_ms"], "ms", False)
        for s in r.get("stalls") or []:
            f[("waiting %", f"{r['name']} T={s['step_ms']:g} ms")] = (s["stall_fraction"] * 100, "%", False)
    big = report.get("larger_than_memory") or {}
    for r in big.get("rows", []):
        if r.get("status") == "ok":
            f[("larger than memory tokens/s", r["name"].replace("larger than memory: ", ""))] = \
                (r["tokens_per_s"], "tokens/s", True)
    for x in (big.get("fio") or {}).get("runs", []):
        f[("larger than memory tokens/s", f"fio QD{x['iodepth']}")] = (x["tokens_per_s_limit"], "tokens/s", True)
    for r in report.get("startup") or []:
        if r.get("status") == "ok":
            key = f"{r['loader']}{' (sparse)' if r.get('sparse') else ''} @ {r['shards']} shards"
            f[("first batch ms", key)] = (r["first_batch_s"] * 1e3, "ms", False)
    for r in report.get("restore") or []:
        if r.get("status") == "ok":
            f[("restore ms", f"{r['loader']} @ {r['position']}")] = (r["restore_s"] * 1e3, "ms", False)
    return f


def format_compare(old: Dict[str, Any], new: Dict[str, Any], threshold: float = 0.10) -> str:
    """What changed from `old` to `new`: the figures in both runs that moved beyond `threshold`
    (waiting fractions: half of it, in points), and the figures only one run has."""
    a, b = _figures(old), _figures(new)
    out = [f"compared with {old.get('created', '?')} ({'quick' if old.get('quick') else 'full'} run):"]
    mo, mn = old.get("machine", {}), new.get("machine", {})
    diffs = [k for k in ("cpu_model", "cores", "memory_gib", "kernel", "tokenfeed", "torch", "numpy")
             if mo.get(k) != mn.get(k)]
    if diffs:
        out.append("  machine or versions differ: " + ", ".join(f"{k} {mo.get(k)} -> {mn.get(k)}" for k in diffs))
    co, cn = old.get("config", {}), new.get("config", {})
    cdiff = [k for k in ("seq_len", "batch_size", "data_dtype", "seconds_per_case") if co.get(k) != cn.get(k)]
    if cdiff:
        out.append("  configuration differs: " + ", ".join(f"{k} {co.get(k)} -> {cn.get(k)}" for k in cdiff))
    rows = []
    better = worse = same = 0
    for key in [k for k in b if k in a]:
        va, _, up = a[key]
        vb = b[key][0]
        if key[0] == "waiting %":
            change = vb - va
            txt = f"{change:+.1f} pp"
            moved = abs(change) >= 100 * threshold / 2
            good = change < 0
        else:
            change = (vb / va - 1) if va else 0.0
            txt = f"{change * 100:+.1f}%"
            moved = abs(change) >= threshold
            good = (change > 0) == up
        if not moved:
            same += 1
            continue
        mark = "better" if good else "worse"
        better += mark == "better"
        worse += mark == "worse"
        unit = b[key][1]
        fmt = human if unit == "tokens/s" else _num
        rows.append((key[0], key[1], fmt(va), fmt(vb), txt, mark))
    if rows:
        out += ["  " + x for x in _table(("figure", "what", "old", "new", "change", ""), rows, left=2)]
    gone = sorted(f"{k[0]}: {k[1]}" for k in a if k not in b)
    added = sorted(f"{k[0]}: {k[1]}" for k in b if k not in a)
    if gone:
        out.append(f"  only in the old run ({len(gone)}): " + "; ".join(gone[:20]) + (" ..." if len(gone) > 20 else ""))
    if added:
        out.append(f"  only in this run ({len(added)}): " + "; ".join(added[:20]) + (" ..." if len(added) > 20 else ""))
    out.append(f"  {better} better and {worse} worse by more than {threshold * 100:.0f}% (waiting for data: "
               f"{threshold * 50:.0f} points); {same} of the {same + len(rows)} figures in both runs moved less")
    return "\n".join(out)
