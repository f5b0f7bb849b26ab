"""``--plot``: one PNG with the charts a training team reads.

Panels, each drawn when the run has its figures: tokens/s per loader (log scale), the
fraction of wall time waiting for data against the step time, the larger-than-memory
rows beside fio's limit, and time to first batch against the shard count.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from .common import human
from .report import stall_rounds

COLORS = {"tokenfeed": "#1f77b4", "ceiling": "#7f7f7f", "baseline": "#ff7f0e", "peer": "#2ca02c"}
# line colours for the other loaders: matplotlib's tab10 without tokenfeed's blue
OTHERS = ["#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]


def _panels(report: Dict[str, Any]) -> List[str]:
    out = []
    if any(r.get("status") == "ok" and "tokens_per_s" in r for r in report.get("results", [])):
        out.append("throughput")
    if any(r.get("status") == "ok" and r.get("stalls") for r in report.get("results", [])):
        out.append("stalls")
    big = report.get("larger_than_memory") or {}
    if big.get("status") == "ok" and any(r.get("status") == "ok" for r in big.get("rows", [])):
        out.append("larger")
    if any(r.get("status") == "ok" and not r.get("layout") and not r.get("sparse") for r in report.get("startup") or []):
        out.append("startup")
    return out


def write_plot(report: Dict[str, Any], path: str) -> Optional[str]:
    """Write the PNG. Returns an error message (matplotlib missing, nothing to draw) instead of raising."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
        from matplotlib.ticker import FuncFormatter
    except ImportError:
        return "matplotlib is not installed: pip install 'matplotlib>=3.5'"
    panels = _panels(report)
    if not panels:
        return "nothing to plot: no configuration ran"
    rows = [r for r in report.get("results", []) if r.get("status") == "ok" and "tokens_per_s" in r]
    heights = {"throughput": 0.26 * len(rows) + 1.2, "stalls": 3.6, "larger": 0.4 * 6 + 1.2, "startup": 3.4}
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, sum(heights[p] for p in panels) + 0.6),
                             gridspec_kw={"height_ratios": [heights[p] for p in panels]}, squeeze=False)
    m, c = report.get("machine", {}), report.get("config", {})
    fig.suptitle(f"tokenfeed bench: {c.get('batch_size')} x {c.get('seq_len')} {c.get('data_dtype')} -> int64, "
                 f"shuffled - {m.get('cpu_model')}, {m.get('cores')} cores, {m.get('memory_gib')} GiB", fontsize=9)
    for ax, panel in zip(axes[:, 0], panels):
        if panel == "throughput":
            y = list(range(len(rows)))[::-1]
            vals = [r["tokens_per_s"] for r in rows]
            ax.barh(y, vals, color=[COLORS.get(r["group"], "#9467bd") for r in rows])
            ax.set_yticks(y)
            ax.set_yticklabels([r["name"] for r in rows], fontsize=7)
            ax.set_xscale("log")
            ax.set_xlabel("tokens/s, warm page cache (log scale)", fontsize=8)
            for yi, v in zip(y, vals):
                ax.text(v, yi, " " + human(v), va="center", fontsize=6)
            ax.set_xlim(right=max(vals) * 8)
            ax.legend(handles=[Patch(color=v, label=k) for k, v in COLORS.items()], fontsize=6, loc="lower right")
        elif panel == "stalls":
            others = iter(OTHERS * 3)
            for r in report["results"]:
                if r.get("status") == "ok" and r.get("stalls"):
                    xs = [s["step_ms"] for s in r["stalls"]]
                    ys = [s["stall_fraction"] * 100 for s in r["stalls"]]
                    mine = r["group"] == "tokenfeed"
                    line, = ax.plot(xs, ys, marker="o", label=r["name"],
                                    color=COLORS["tokenfeed"] if mine else next(others), linewidth=2.5 if mine else 1.2)
                    rounds = [stall_rounds(s) for s in r["stalls"]]
                    if all(len(x) > 1 for x in rounds):  # the range of the rounds around the median
                        ax.fill_between(xs, [min(x) * 100 for x in rounds], [max(x) * 100 for x in rounds],
                                        color=line.get_color(), alpha=0.15, linewidth=0)
            ax.set_xscale("log")
            steps = sorted({s["step_ms"] for r in report["results"] for s in (r.get("stalls") or [])})
            ax.set_xticks(steps)
            ax.set_xticklabels([f"{s:g}" for s in steps])
            ax.minorticks_off()
            ax.set_xlabel("training step time per batch, ms (log scale)", fontsize=8)
            ax.set_ylabel("% of wall time waiting for data", fontsize=8)
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=6, loc="upper right")
        elif panel == "larger":
            big = report["larger_than_memory"]
            names, vals, cols = [], [], []
            for x in (big.get("fio") or {}).get("runs", []):
                names.append(f"fio limit QD{x['iodepth']}")
                vals.append(x["tokens_per_s_limit"])
                cols.append("#7f7f7f")
            for r in big["rows"]:
                if r.get("status") == "ok":
                    names.append(r["name"].replace("larger than memory: ", ""))
                    vals.append(r["tokens_per_s"])
                    cols.append(COLORS["tokenfeed"] if "tokenfeed" in r["name"] else COLORS["baseline"])
            y = list(range(len(names)))[::-1]
            ax.barh(y, vals, color=cols)
            ax.set_yticks(y)
            ax.set_yticklabels(names, fontsize=7)
            for yi, v in zip(y, vals):
                ax.text(v, yi, " " + human(v), va="center", fontsize=6)
            ax.set_xlim(right=max(vals) * 1.3)
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: human(v)))
            ax.set_xlabel(f"tokens/s, shuffled over {big['bytes'] / 1e9:.3g} GB "
                          f"({'larger than' if big['exceeds_ram'] else 'fits in'} {big['ram_bytes'] / 2**30:.0f} "
                          f"GiB RAM)", fontsize=8)
        else:
            series: Dict[str, List[Any]] = {}
            for r in report.get("startup") or []:
                if r.get("status") == "ok" and not r.get("sparse") and not r.get("layout"):
                    series.setdefault(r["loader"], []).append((r["shards"], r["first_batch_s"] * 1e3))
            others = iter(OTHERS * 3)
            for name, pts in series.items():
                pts.sort()
                mine = name == "tokenfeed"
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name,
                        color=COLORS["tokenfeed"] if mine else next(others), linewidth=2.5 if mine else 1.2)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("shards / chunk files (log scale)", fontsize=8)
            ax.set_ylabel("ms to first batch", fontsize=8)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=6)
        ax.tick_params(labelsize=7)
    fig.tight_layout(rect=(0, 0, 1, 0.985))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
