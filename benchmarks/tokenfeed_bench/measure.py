"""How a loader is measured, inside the child process that runs it.

* ``throughput``: warm-up batches excluded, then batches timed one by one for a set
  time: tokens/s, p50/p99 per ``next()``, CPU seconds of the process, its threads and
  its worker processes per 10^9 tokens, peak RSS.
* ``stalls``: a consumer that spends a fixed step time T per batch (``time.sleep``:
  the host thread is blocked, as it is while the GPU computes, and the cores are free
  for the loader). Per T, the fraction of wall time spent inside ``next()`` waiting
  for data: the share of a GPU's time that would be idle. Each T is measured in several
  rounds, interleaved (every T once per round, so that a burst of load from elsewhere on
  the machine lands in one round of several T rather than in every round of one); the
  figure is the median of the rounds, and the rounds are kept to show the spread.
"""
from __future__ import annotations

import math
import resource
import statistics
import time
from typing import Any, Callable, Dict, List, Sequence

from .common import descendants_cpu_hwm, percentiles, self_status


def _cpu_now() -> Dict[str, Any]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    rc = resource.getrusage(resource.RUSAGE_CHILDREN)
    kids, _ = descendants_cpu_hwm()
    return {"self": r.ru_utime + r.ru_stime, "reaped": rc.ru_utime + rc.ru_stime, "kids": kids}


def _cpu_since(c0: Dict[str, Any]) -> float:
    c1 = _cpu_now()
    cpu: float = (c1["self"] - c0["self"]) + (c1["reaped"] - c0["reaped"])
    cpu += sum(v - c0["kids"].get(pid, 0.0) for pid, v in c1["kids"].items())
    return cpu


def throughput(next_batch: Callable[[], Any], *, tokens_per_batch: int, warmup: int, seconds: float,
               max_batches: int = 10**9, min_batches: int = 5) -> Dict[str, Any]:
    for _ in range(max(0, warmup)):
        next_batch()
    c0 = _cpu_now()
    times: List[float] = []
    perf = time.perf_counter
    w0 = perf()
    deadline = w0 + seconds
    while True:
        t = perf()
        next_batch()
        e = perf()
        times.append(e - t)
        if len(times) >= max_batches or (e >= deadline and len(times) >= min_batches):
            break
    wall = perf() - w0
    cpu = _cpu_since(c0)
    _, kids_hwm = descendants_cpu_hwm()
    n = len(times)
    toks = n * tokens_per_batch
    p50, p99 = percentiles(times)
    return {"batches": n, "seconds": wall, "tokens_per_s": toks / wall, "batches_per_s": n / wall,
            "p50_ms": p50 * 1e3, "p99_ms": p99 * 1e3, "cpu_s": cpu, "cpu_s_per_btok": cpu / toks * 1e9,
            "cpu_cores_busy": cpu / wall,
            "peak_rss_mb": (self_status("VmHWM") + kids_hwm) / 1024.0, "workers_peak_rss_mb": kids_hwm / 1024.0}


def stalls(next_batch: Callable[[], Any], step_ms: Sequence[float], *, seconds: float, repeats: int = 1,
           min_steps: int = 10, max_steps: int = 100_000) -> List[Dict[str, Any]]:
    """For each step time T: `repeats` rounds of steps of (next batch, then T of 'compute'),
    `seconds` per round; the fraction of wall time waiting, per round and their median."""
    sleep, perf = time.sleep, time.perf_counter
    rounds: Dict[float, List[Dict[str, Any]]] = {T: [] for T in step_ms}
    for _ in range(max(1, int(repeats))):
        for T in step_ms:
            steps = int(min(max_steps, max(min_steps, math.ceil(seconds / (T / 1e3)))))
            waits: List[float] = []
            c0 = _cpu_now()
            w0 = perf()
            for _ in range(steps):
                t = perf()
                next_batch()
                waits.append(perf() - t)
                sleep(T / 1e3)
            wall = perf() - w0
            rounds[T].append({"steps": steps, "wall_s": wall, "waits": waits, "cpu_s": _cpu_since(c0)})
    out = []
    for T in step_ms:
        rs = rounds[T]
        fractions = [sum(r["waits"]) / r["wall_s"] for r in rs]
        waits = [w for r in rs for w in r["waits"]]
        wall = sum(r["wall_s"] for r in rs)
        p50, p99 = percentiles(waits)
        out.append({"step_ms": T, "steps": rs[0]["steps"], "rounds": len(rs), "wall_s": wall, "wait_s": sum(waits),
                    "stall_fraction": statistics.median(fractions), "stall_fraction_rounds": fractions,
                    "wait_p50_ms": p50 * 1e3, "wait_p99_ms": p99 * 1e3, "wait_max_ms": max(waits) * 1e3,
                    "cpu_cores_busy": sum(r["cpu_s"] for r in rs) / wall})
    return out
