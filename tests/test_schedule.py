"""Mixture weight schedules (docs/packing.md, "Mixture schedules"): the schedule object, and
the reference model the loader's schedules are checked against."""
from __future__ import annotations

import json

import pytest

from tokenfeed._schedule import WeightSchedule, as_schedule

import schedule_reference as ref


def test_schedule_validation_and_json_round_trip():
    s = WeightSchedule([(0, [0.7, 0.3]), (100, [0.4, 0.6])], interpolation="linear")
    assert s.num_sources == 2
    assert WeightSchedule.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    assert s.proportions_at(50) == pytest.approx([0.55, 0.45])
    assert s.proportions_at(10**9) == pytest.approx([0.4, 0.6])
    assert WeightSchedule([(0, [1, 3])]).proportions_at(7) == [0.25, 0.75]
    cases = [
        ([(1, [1, 1])], "first schedule point must be at step 0"),
        ([(0, [1, 1]), (0, [1, 1])], "steps must increase"),
        ([(0, [0, 0])], "at least one weight must be > 0"),
        ([(0, [1, 2]), (3, [1])], "one weight per source"),
        ([(0, [-1, 1])], "finite and >= 0"),
        ([(0, [float("nan"), 1])], "finite and >= 0"),
        ([(-1, [1])], "step must be an int >= 0"),
        ([(0.5, [1])], "step must be an int >= 0"),
        ([], "at least one"),
    ]
    for points, msg in cases:
        with pytest.raises(ValueError, match=msg):
            WeightSchedule(points)
    with pytest.raises(ValueError, match="interpolation"):
        WeightSchedule([(0, [1])], interpolation="cubic")
    with pytest.raises(TypeError, match="must be a number"):
        WeightSchedule([(0, ["1", 2])])


def test_as_schedule_forms():
    assert as_schedule([0.5, 0.5]) == ([0.5, 0.5], None)
    plain, sched = as_schedule([(0, [1, 2]), (5, [2, 1])])
    assert plain is None and sched == WeightSchedule([(0, [1, 2]), (5, [2, 1])])
    assert as_schedule(sched.to_dict()) == (None, sched)
    with pytest.raises(TypeError):
        as_schedule("0.5,0.5")


def test_reference_model_properties():
    """The rules themselves: exact counts per window in constant phases, every source's running
    count is its j, and linear windows stay within 1.5 of the line and move monotonically."""
    G, M = 4, 20
    points = [(0, [0.7, 0.3]), (10, [0.2, 0.8]), (25, [0.5, 0.5])]
    seq = ref.simulate(points, G, M, 40 * G)
    counts = [ref.lr_counts(w, M) for _, w in points]
    assert counts == [[14, 6], [4, 16], [10, 10]]
    for k in range(10 * G // 10):                   # phase 0: windows of 10 (7 + 3)
        assert ref.window_counts(seq, 2, 10 * k, 10) == [7, 3]
    for k in range(15 * G // 5):                    # phase 1: windows of 5 (1 + 4)
        assert ref.window_counts(seq, 2, 40 + 5 * k, 5) == [1, 4]
    seen = [0, 0]
    for s, j in seq:
        assert j == seen[s]
        seen[s] += 1
    lin = ref.simulate([(0, [0.9, 0.1, 0.0]), (50, [0.5, 0.3, 0.2])], G, M, 50 * G, linear=True)
    prev = None
    for k in range(50 * G // M):
        c = ref.window_counts(lin, 3, k * M, M)
        alpha = (k * M + M / 2) / (50 * G)
        line = [M * (0.9 - 0.4 * alpha), M * (0.1 + 0.2 * alpha), M * 0.2 * alpha]
        assert all(abs(x - y) <= 1.5 for x, y in zip(c, line)), (k, c, line)
        if prev:
            assert c[0] <= prev[0] and c[1] >= prev[1] and c[2] >= prev[2]
        prev = c
