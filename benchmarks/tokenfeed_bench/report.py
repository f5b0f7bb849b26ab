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


# Rows a training team compares: the loader they would use as it comes. The other rows
# (thread counts, backends, the C gather ceiling, output types) explain tokenfeed's own
# figures and are shown with --verbose. A suite adds a headline row by giving it one of
# these groups or "headline": True (Runner.run(..., headline=True)).
HEADLINE_GROUPS = ("baseline", "peer", "adapter")
HEADLINE_NAMES = ("tokenfeed", "tokenfeed zstd data", "tokenfeed device=cuda")


def is_headline(r: Dict[str, Any]) -> bool:
    return bool(r.get("headline")) or r.get("group") in HEADLINE_GROUPS or r.get("name") in HEADLINE_NAMES


def _wrap(text: str, indent: str = "  ", width: int = 100) -> List[str]:
    """Whole words on lines of at most `width` characters (a long reason is wrapped, never cut)."""
    import textwrap

    return textwrap.wrap(" ".join(str(text).split()), width=width, initial_indent=indent,
                         subsequent_indent=indent + "  ", break_long_words=False, break_on_hyphens=False) or [indent]


def _not_run(report: Dict[str, Any]) -> Dict[str, str]:
    """{loader or configuration: why it did not run}, once per loader, from every section."""
    out: Dict[str, str] = {}

    def add(name: str, r: Dict[str, Any]) -> None:
        why = f"{r.get('status')}: {r.get('reason') or ''}".rstrip(": ")
        out.setdefault(name, why)

    for r in report.get("results", []):
        if r.get("status") != "ok":
            add(r["name"], r)
    for r in report.get("startup") or []:
        if r.get("status") != "ok":
            add(r["loader"] if r.get("peer") else f"start-up: {r['loader']} at {r['shards']:,} shards", r)
    for r in report.get("restore") or []:
        if r.get("status") != "ok":
            add(r["loader"] if r.get("peer") else f"restore: {r['loader']}", r)
    return out


def throughput_table(report: Dict[str, Any], verbose: bool = False) -> str:
    ceil_cpu = (report.get("reference") or {}).get("ceiling_cpu_s_per_btok")
    hdr: Tuple[str, ...] = ("loader", "tokens/s", "p50 ms", "p99 ms", "CPU s/Gtok", "peak RSS MB")
    if verbose:
        hdr += ("x ceiling CPU", "first batch ms", "x tokenfeed", "x ceiling")
    rows = []
    for r in report.get("results", []):
        if r.get("status") == "ok" and "tokens_per_s" in r and (verbose or is_headline(r)):
            row = [r["name"], human(r["tokens_per_s"]), _f(r["p50_ms"]), _f(r["p99_ms"]),
                   _f(r["cpu_s_per_btok"], ".1f"), _f(r["peak_rss_mb"], ".0f")]
            if verbose:
                row += [_f(r["cpu_s_per_btok"] / ceil_cpu if ceil_cpu else None, ".1f"),
                        _f(r["first_batch_s"] * 1e3 if r.get("first_batch_s") is not None else None, ".0f"),
                        _f(r.get("ratio_to_tokenfeed")), _f(r.get("ratio_to_ceiling"))]
            rows.append(row)
    return "\n".join(_table(hdr, rows) if rows else ["(no throughput figures)"])


def stall_rounds(s: Dict[str, Any]) -> List[float]:
    """A waiting figure's fraction per round of the step-time loop (a report made without
    rounds has one: the figure itself)."""
    r = s.get("stall_fraction_rounds")
    return [float(x) for x in r] if r else [float(s["stall_fraction"])]


def _pct_range(s: Dict[str, Any]) -> Tuple[float, float]:
    """The range of the rounds in % as printed (0.1 points), so that what the words say of
    two ranges agrees with the figures beside them."""
    r = stall_rounds(s)
    return round(min(r) * 100, 1), round(max(r) * 100, 1)


def stall_figure(s: Dict[str, Any], unit: str = " %") -> str:
    """'3.2 % (1.7-5.5)': the median of the rounds, and their range in brackets; one round
    has no range."""
    med = f"{s['stall_fraction'] * 100:.1f}{unit}"
    if len(stall_rounds(s)) < 2:
        return med
    lo, hi = _pct_range(s)
    return f"{med} ({lo:.1f}-{hi:.1f})"


def within_noise(a: Dict[str, Any], b: Dict[str, Any]) -> bool:
    """Two waiting figures are within noise of each other when the ranges of their rounds
    overlap: the machine gave each of them a round at least as good as one of the other's.
    Figures of one round have no measured spread, and are never called within noise."""
    if len(stall_rounds(a)) < 2 or len(stall_rounds(b)) < 2:
        return False
    (alo, ahi), (blo, bhi) = _pct_range(a), _pct_range(b)
    return alo <= bhi and blo <= ahi


def noise_groups(figures: Sequence[Tuple[str, Dict[str, Any]]]) -> List[List[str]]:
    """Names whose figures are all within noise of each other, in groups of two or more:
    by median, each figure joins the group before it if it is within noise of every member."""
    groups: List[List[Tuple[str, Dict[str, Any]]]] = []
    for name, s in sorted(figures, key=lambda x: x[1]["stall_fraction"]):
        if groups and all(within_noise(s, o) for _, o in groups[-1]):
            groups[-1].append((name, s))
        else:
            groups.append([(name, s)])
    return [[n for n, _ in g] for g in groups if len(g) > 1]


def _and(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def stall_table(report: Dict[str, Any], verbose: bool = False) -> Optional[str]:
    rows = [r for r in report.get("results", []) if r.get("status") == "ok" and r.get("stalls")
            and (verbose or is_headline(r))]
    if not rows:
        return None
    steps = [s["step_ms"] for s in rows[0]["stalls"]]
    n = max(len(stall_rounds(s)) for r in rows for s in r["stalls"])
    hdr = ["GPU waiting for data, % of time"] + [f"T={s:g} ms" for s in steps]
    body = []
    for r in rows:
        by = {s["step_ms"]: s for s in r["stalls"]}
        body.append([r["name"]] + [stall_figure(by[s], unit="") if s in by else "-" for s in steps])
    note = (f"  (the median of {n} rounds, their range in brackets)" if n > 1
            else "  (one round each: no spread measured)")
    return "\n".join(_table(hdr, body) + [note])


def verdict_lines(report: Dict[str, Any]) -> List[str]:
    """The answer in a training team's words: per step time, how much of the time the GPU
    would wait for data with each loader that was measured with a step, as the median of the
    rounds with their range, and which loaders are within noise of each other there."""
    rows = [r for r in report.get("results", []) if r.get("status") == "ok" and r.get("stalls") and is_headline(r)]
    if not rows:
        return []
    c = report.get("config", {})
    n = max(len(stall_rounds(s)) for r in rows for s in r["stalls"])
    how = (f"each figure is the median of {n} rounds of that loop, the range of the rounds in brackets; figures "
           f"whose ranges overlap are within noise of each other" if n > 1 else
           "one round of that loop per figure, so no spread was measured and a difference of a few points may be "
           "noise (--stall-repeats 5 measures it)")
    out = _wrap(f"Verdict (T = your training step time: the GPU's forward, backward and optimizer work on one batch "
                f"of {c.get('batch_size')} x {c.get('seq_len')} tokens; the loader was read by a loop that spends T "
                f"per batch; {how}):", indent="")
    steps = sorted({s["step_ms"] for r in rows for s in r["stalls"]})
    for t in steps:
        parts: List[str] = []
        figs: List[Tuple[str, Dict[str, Any]]] = []
        for r in rows:
            s = next((x for x in r["stalls"] if x["step_ms"] == t), None)
            if s is not None:
                parts.append(stall_figure(s) + (" of the time" if not parts else "") + f" with {r['name']}")
                figs.append((r["name"], s))
        if parts:
            noise = "".join(f"; {_and(g)} are within noise of each other" for g in noise_groups(figs))
            out += _wrap(f"at a {t:g} ms step your GPU waits for data " + ", ".join(parts) + noise)
    tf = next((r for r in report.get("results", []) if r.get("name") == "tokenfeed" and r.get("status") == "ok"
               and "tokens_per_s" in r), None)
    if tf and c.get("batch_size") and c.get("seq_len"):
        ms = c["batch_size"] * c["seq_len"] / tf["tokens_per_s"] * 1e3
        out += _wrap(f"tokenfeed assembles a batch in {ms:.3g} ms on average here ({human(tf['tokens_per_s'])} "
                     f"tokens/s, {_f(tf['cpu_s_per_btok'], '.1f')} CPU s per billion tokens), on CPU cores your "
                     f"training process shares with it")
    return out


def larger_lines(report: Dict[str, Any]) -> List[str]:
    big = report.get("larger_than_memory")
    if not big:
        return []
    if big.get("status") != "ok":
        return _wrap(f"larger than memory: {big.get('status')}: {big.get('reason')}", indent="")
    size, ram = human_bytes(big["bytes"]), human_bytes(big["ram_bytes"])
    if big["exceeds_ram"]:
        head = f"shuffled reads of a {size} file, larger than the {ram} of RAM (reads reach the disk):"
    else:
        head = (f"shuffled reads of a {size} file, smaller than the {ram} of RAM (it fits in the page cache, so "
                f"this measures memory more than the disk; pass --big-size above the RAM to measure the disk):")
    out = _wrap(head, indent="")
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
            rows.append((name, f"{r.get('status')} (below)", "", "", ""))
    out += _table(hdr, rows)
    if f.get("status") != "ok":
        out += _wrap(f"fio: {f.get('status')}: {f.get('reason')}", indent="")
    for r in big.get("rows", []):
        if r.get("status") != "ok":
            out += _wrap(f"{r['name']}: {r.get('status')}: {r.get('reason')}", indent="")
    return out


def startup_lines(report: Dict[str, Any]) -> List[str]:
    rows = report.get("startup") or []
    if not rows:
        return []
    hdr = ("time to first batch", "shards", "tokens", "ms")
    body = []
    for r in rows:
        what = r["loader"] + (" (sparse)" if r.get("sparse") else "") + (" (default layout)" if r.get("layout") else "")
        if r.get("status") != "ok":
            continue  # listed once, with the reason, under "did not run"
        body.append((what, f"{r['shards']:,}", human(r.get("tokens")), _f(r["first_batch_s"] * 1e3, ".0f")))
    return _table(hdr, body, left=1) if body else []


def restore_lines(report: Dict[str, Any]) -> List[str]:
    rows = report.get("restore") or []
    if not rows:
        return []
    hdr = ("restore, then first batch", "position (samples)", "ms")
    body, how = [], {}
    for r in rows:
        if r.get("status") == "ok":
            body.append((r["loader"], human(r["position"]), _f(r["restore_s"] * 1e3, ".1f")))
            how.setdefault(r["loader"], r.get("method", ""))
    out = _table(hdr, body, left=1) if body else []
    return out + [f"  {k}: {v}" for k, v in how.items() if v]


def not_run_lines(report: Dict[str, Any], verbose: bool = False) -> List[str]:
    items = _not_run(report)
    if not verbose:  # tokenfeed's own variants that do not apply here (no CUDA, no io_uring) stay in --verbose
        items = {k: v for k, v in items.items() if not (k.startswith("tokenfeed ") and v.startswith("skipped"))}
    if not items:
        return []
    out = ["did not run:"]
    for k, v in items.items():
        out += _wrap(f"{k}: {v}")
    return out


def disk_lines(report: Dict[str, Any]) -> List[str]:
    d = report.get("left_on_disk")
    if not d:
        return []
    return _wrap(f"left on disk: {human_bytes(d['bytes'])} in {d['path']} (generated data, converted peer data, "
                 f"peer environments; reused by the next run). Remove it with: rm -rf {d['path']}", indent="")


def format_summary(report: Dict[str, Any], verbose: bool = False) -> str:
    m = report.get("machine", {})
    c = report.get("config", {})
    out = [f"tokenfeed bench: {c.get('batch_size')} x {c.get('seq_len')} {c.get('data_dtype')} -> int64, shuffled; "
           f"{m.get('cpu_model')}, {m.get('cores')} cores, {m.get('memory_gib')} GiB", "",
           throughput_table(report, verbose)]
    st = stall_table(report, verbose)
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
    nr = not_run_lines(report, verbose)
    if nr:
        out += [""] + nr
    v = verdict_lines(report)
    if v:
        out += [""] + v
    if not verbose:
        out += _wrap("(--verbose adds tokenfeed's own variants, the C gather ceiling and the ratio columns; "
                     "--json PATH writes every figure)", indent="")
    tail = disk_lines(report)
    if tail or report.get("total_seconds") is not None:
        out.append("")
    out += tail
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


def _stall_entries(report: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    """{what, as _figures names a waiting figure: its stall entry, with the rounds}."""
    return {f"{r['name']} T={s['step_ms']:g} ms": s for r in report.get("results", [])
            if r.get("status") == "ok" and "tokens_per_s" in r for s in r.get("stalls") or []}


def format_compare(old: Dict[str, Any], new: Dict[str, Any], threshold: float = 0.10) -> str:
    """What changed from `old` to `new`: the figures in both runs that moved beyond `threshold`
    (waiting fractions: half of it, in points, and only where the ranges of the two runs'
    rounds do not overlap), and the figures only one run has."""
    a, b = _figures(old), _figures(new)
    sa, sb = _stall_entries(old), _stall_entries(new)
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
            if key[1] in sa and key[1] in sb and within_noise(sa[key[1]], sb[key[1]]):
                moved = False  # the two runs' rounds overlap: a move the noise can make
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
               f"{threshold * 50:.0f} points, with rounds whose ranges do not overlap); {same} of the "
               f"{same + len(rows)} figures in both runs moved less")
    return "\n".join(out)
