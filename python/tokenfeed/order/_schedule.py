"""Mixture weight schedules: per-source weights that change at given global steps.

A schedule is a list of points ``(step, weights)``; ``step`` counts global batches of
the loader (step ``k`` starts at stream position ``k * global_batch``). Piecewise
constant: a point's weights hold until the next point. Linear: the counts move from one
point's to the next window by window. After the last point its weights hold forever.
The exact rules (counts per window, interleave, seeking) are in docs/packing.md; they
are computed in C, this module only validates and records the schedule.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

__all__ = ["WeightSchedule", "as_schedule"]

_INTERPOLATIONS = ("constant", "linear")


def _weights(w: Any, where: str) -> List[float]:
    if isinstance(w, (str, bytes)) or not hasattr(w, "__len__"):
        raise TypeError(f"{where}: weights must be a sequence of numbers, got {w!r}")
    out = []
    for i, x in enumerate(w):
        if isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating)):
            raise TypeError(f"{where}: weights[{i}] must be a number, got {x!r}")
        out.append(float(x))
    if not out:
        raise ValueError(f"{where}: no weights")
    return out


class WeightSchedule:
    """Per-source mixture weights that change at given global steps.

    ``WeightSchedule([(0, [0.7, 0.3]), (20_000, [0.4, 0.6])])`` switches at step 20,000
    (piecewise constant); ``interpolation="linear"`` moves the proportions steadily
    from one point to the next. Steps are global batches of the loader; the first
    point is at step 0 and steps increase. Weights are finite and ``>= 0`` with at
    least one ``> 0`` per point (a source may be off during a phase); any scale.
    """

    steps: List[int]
    weights: List[List[float]]
    interpolation: str

    def __init__(self, points: Sequence[Tuple[int, Sequence[float]]], interpolation: str = "constant") -> None:
        if interpolation not in _INTERPOLATIONS:
            raise ValueError(f"interpolation must be 'constant' or 'linear', got {interpolation!r}")
        if isinstance(points, (str, bytes)) or not hasattr(points, "__len__") or len(points) == 0:
            raise ValueError(f"a weight schedule needs at least one (step, weights) point, got {points!r}")
        steps: List[int] = []
        weights: List[List[float]] = []
        for m, pt in enumerate(points):
            try:
                step, w = pt
            except (TypeError, ValueError):
                raise TypeError(f"schedule point {m} must be a (step, weights) pair, got {pt!r}") from None
            if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
                raise ValueError(f"schedule point {m}: step must be an int >= 0, got {step!r}")
            ws = _weights(w, f"schedule point {m}")
            if not all(math.isfinite(x) and x >= 0 for x in ws):
                raise ValueError(f"schedule point {m}: weights must be finite and >= 0, got {ws!r}")
            if not any(x > 0 for x in ws):
                raise ValueError(f"schedule point {m}: at least one weight must be > 0, got {ws!r}")
            if weights and len(ws) != len(weights[0]):
                raise ValueError(f"schedule point {m} has {len(ws)} weights, point 0 has {len(weights[0])}: "
                                 f"one weight per source at every point")
            if steps and int(step) <= steps[-1]:
                raise ValueError(f"schedule steps must increase: point {m} is at step {int(step)}, after step "
                                 f"{steps[-1]}")
            steps.append(int(step))
            weights.append(ws)
        if steps[0] != 0:
            raise ValueError(f"the first schedule point must be at step 0, found step {steps[0]}")
        self.steps, self.weights, self.interpolation = steps, weights, interpolation

    @property
    def num_sources(self) -> int:
        return len(self.weights[0])

    def proportions_at(self, step: float) -> List[float]:
        """The intended proportions (summing to 1) at a global step, before rounding to counts."""
        m = max(i for i, s in enumerate(self.steps) if s <= step)
        p = [x / sum(self.weights[m]) for x in self.weights[m]]
        if self.interpolation == "linear" and m + 1 < len(self.steps):
            q = [x / sum(self.weights[m + 1]) for x in self.weights[m + 1]]
            a = (step - self.steps[m]) / (self.steps[m + 1] - self.steps[m])
            p = [(1 - a) * x + a * y for x, y in zip(p, q)]
        return p

    def to_dict(self) -> Dict[str, Any]:
        """The JSON form recorded in a loader state."""
        return {"steps": list(self.steps), "weights": [list(w) for w in self.weights],
                "interpolation": self.interpolation}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "WeightSchedule":
        try:
            return cls(list(zip(d["steps"], d["weights"])), interpolation=d.get("interpolation", "constant"))
        except KeyError as e:
            raise ValueError(f"a weight schedule dict needs 'steps' and 'weights', missing {e}") from None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, WeightSchedule) and self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash((tuple(self.steps), tuple(map(tuple, self.weights)), self.interpolation))

    def __repr__(self) -> str:
        pts = ", ".join(f"({s}, {w})" for s, w in zip(self.steps, self.weights))
        extra = "" if self.interpolation == "constant" else f", interpolation={self.interpolation!r}"
        return f"WeightSchedule([{pts}]{extra})"


def short_ramps(schedule: WeightSchedule, global_batch: int, mix_window: int) -> Optional[str]:
    """A warning for linear ramps that span fewer than two mixing windows, or None.

    Counts move window by window (docs/packing.md), so a ramp inside one window of
    ``mix_window`` positions is delivered at the middle weights, flat, and one across
    two windows in two steps."""
    if schedule.interpolation != "linear":
        return None
    short = [(a, b) for a, b in zip(schedule.steps, schedule.steps[1:]) if (b - a) * global_batch < 2 * mix_window]
    if not short:
        return None
    a, b = short[0]
    return (f"tokenfeed: the linear ramp from step {a} to {b} covers {(b - a) * global_batch:,} positions "
            f"({b - a} steps x global batch {global_batch}), less than two mixing windows of mix_window="
            f"{mix_window}: weights move once per window, so it is delivered flat or in one jump"
            + (f" ({len(short)} such ramps)" if len(short) > 1 else "")
            + f". Pass mix_window={max(1, (b - a) * global_batch // 8)} or less (or spread the ramp over more steps)")


def as_schedule(weights: Union[Sequence[Any], WeightSchedule, Mapping[str, Any]]) -> Tuple[Optional[List[float]],
                                                                                          Optional[WeightSchedule]]:
    """``(plain weights, None)`` or ``(None, schedule)`` for what ``weights=`` was given.

    A flat list of numbers is plain weights (as before schedules); a list of
    ``(step, weights)`` pairs is a piecewise-constant schedule; a dict is the recorded
    form of a schedule (``WeightSchedule.to_dict()``).
    """
    if isinstance(weights, WeightSchedule):
        return None, weights
    if isinstance(weights, Mapping):
        return None, WeightSchedule.from_dict(weights)
    if isinstance(weights, (str, bytes)) or not hasattr(weights, "__len__"):
        raise TypeError(f"weights must be a list of numbers, a list of (step, weights) pairs or a WeightSchedule, "
                        f"got {weights!r}")
    items = list(weights)
    if items and all(isinstance(x, (tuple, list)) for x in items):
        return None, WeightSchedule([tuple(x) for x in items])
    return _weights(items, "weights"), None
