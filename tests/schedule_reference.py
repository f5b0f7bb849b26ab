"""Reference model of mixture weight schedules (docs/packing.md, "Mixture schedules").

A plain simulation, position after position, of the documented rules, so the C
implementation (which jumps to any position in O(log) from per-run offsets computed
when the Loader is created) is checked against the rules rather than against itself:

- weights become counts per ``mix_window`` (M) positions by largest remainder (ties:
  lower source; a zero weight gets no position);
- a piecewise-constant phase divides its counts by their gcd and interleaves them by
  smooth weighted round-robin, windows starting at the phase's first position;
- a linear segment moves the counts one unit at a time: window ``k`` of the segment has
  the first ``min(T, (T * (2k + 1) * M + len) // (2 * len))`` moves applied, move ``i`` taking
  one position from the ``i``-th decreasing unit and giving it to the ``i``-th
  increasing one, each unit list interleaved by the same round-robin;
- ``j`` (the sample of a source's own stream a position takes) counts the positions of
  that source before it.
"""
from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple


def lr_counts(weights: Sequence[float], M: int) -> List[int]:
    total = float(sum(weights))
    q = [M * (w / total) for w in weights]
    c = [min(M, math.floor(x)) for x in q]
    frac = [x - ci if w > 0 else -2.0 for x, ci, w in zip(q, c, weights)]
    while sum(c) < M:
        best = max(range(len(c)), key=lambda s: (frac[s], -s))
        c[best] += 1
        frac[best] = -1.0
    return c


def swrr(counts: Sequence[int]) -> List[int]:
    """Smooth weighted round-robin over counts: every source s appears counts[s] times, spread evenly."""
    W = sum(counts)
    credit = [0] * len(counts)
    out = []
    for _ in range(W):
        for s in range(len(counts)):
            credit[s] += counts[s]
        best = max(range(len(counts)), key=lambda s: (credit[s], -s))
        credit[best] -= W
        out.append(best)
    return out


def reduced(counts: Sequence[int]) -> Tuple[List[int], int]:
    g = 0
    for c in counts:
        g = math.gcd(g, c)
    return [c // g for c in counts], sum(counts) // g


def units(d: Sequence[int]) -> List[int]:
    """The order of the unit moves of sources with d[s] > 0 (each listed d[s] times, interleaved)."""
    return swrr([max(0, x) for x in d]) if any(x > 0 for x in d) else []


def ramp_counts(a: Sequence[int], b: Sequence[int], k: int, length: int, M: int) -> List[int]:
    d = [y - x for x, y in zip(a, b)]
    inc, dec = units(d), units([-x for x in d])
    T = len(inc)
    tau = min(T, (T * (2 * k + 1) * M + length) // (2 * length))
    c = list(a)
    for i in range(tau):
        c[dec[i]] -= 1
        c[inc[i]] += 1
    return c


def simulate(points: Sequence[Tuple[int, Sequence[float]]], G: int, M: int, npos: int,
             linear: bool = False) -> List[Tuple[int, int]]:
    """(source, j) of positions 0 .. npos - 1."""
    K = len(points[0][1])
    counts = [lr_counts(w, M) for _, w in points]
    starts = [step * G for step, _ in points]
    out: List[Tuple[int, int]] = []
    seen = [0] * K
    for pos in range(npos):
        m = max(i for i, p in enumerate(starts) if p <= pos)
        u = pos - starts[m]
        if linear and m + 1 < len(points):
            length = starts[m + 1] - starts[m]
            k, off = divmod(u, M)
            c = ramp_counts(counts[m], counts[m + 1], k, length, M)
        else:
            c, off = counts[m], u
        cr, W = reduced(c)
        s = swrr(cr)[off % W]
        out.append((s, seen[s]))
        seen[s] += 1
    return out


def window_counts(seq: Sequence[Tuple[int, int]], K: int, start: int, size: int) -> List[int]:
    c = [0] * K
    for s, _ in seq[start:start + size]:
        c[s] += 1
    return c


def anchored(base: Sequence[Tuple[int, int]], new: Sequence[Tuple[int, int]], pos: int,
             K: Optional[int] = None) -> List[Tuple[int, int]]:
    """Positions >= pos follow ``new``'s sources, each source continuing from its count in ``base`` at pos."""
    K = K or 1 + max(s for s, _ in list(base) + list(new))
    had = [0] * K
    for s, _ in base[:pos]:
        had[s] += 1
    new_at = [0] * K
    for s, _ in new[:pos]:
        new_at[s] += 1
    return list(base[:pos]) + [(s, had[s] + j - new_at[s]) for s, j in new[pos:]]
