"""Mixture weight schedules (docs/packing.md, "Mixture schedules"): the schedule object, and
the reference model the loader's schedules are checked against."""
from __future__ import annotations

import json

import pytest

from tokenfeed.order._schedule import WeightSchedule, as_schedule

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


# --------------------------------------------------------------------------- through the Loader

import numpy as np

import tokenfeed
from conftest import assert_resumes_exactly, numpy_loader, take_tokens

MODES = ["concat", "best_fit", "document"]
PAD = 1999


@pytest.fixture
def sources(make_dataset):
    """Three sources whose tokens say where they come from: [0, 600), [700, 1300), [1400, 1900)."""
    def make(n=(150, 300, 200), seed=0):
        rng = np.random.default_rng(seed)
        out = []
        for i, cnt in enumerate(n):
            lens = np.maximum(1, rng.lognormal(np.log(30), 1.0, size=cnt).astype(int))
            lo = 700 * i
            out.append(make_dataset(docs=[rng.integers(lo, lo + 500, n) for n in lens], vocab=2000,
                                    shard_tokens=5000))
        return out
    return make


def source_of_rows(tokens):
    real = np.where(tokens == PAD, -1, tokens)
    return (real.max(axis=1) // 700).astype(int)


def rows(batches):
    return np.concatenate(batches) if batches else np.zeros((0, 1), dtype=np.int64)


TWO_PHASE = [(0, [0.7, 0.3]), (25, [0.2, 0.8])]   # G = 8: phase 0 is positions [0, 200)


@pytest.mark.parametrize("packing", MODES)
def test_two_phase_schedule_exact_in_every_window(sources, packing):
    a, b, _ = sources()
    l = numpy_loader([a, b], weights=tokenfeed.WeightSchedule(TWO_PHASE), seq_len=16, batch_size=8, packing=packing,
               pad_id=PAD, seed=2, mix_window=100)
    src = source_of_rows(rows(take_tokens(l, 60)))          # 480 positions: both phases
    assert ((src[:200].reshape(-1, 10) == 1).sum(axis=1) == 3).all()     # 7 + 3 in every window of 10
    assert ((src[200:].reshape(-1, 5) == 1).sum(axis=1) == 4).all()      # 1 + 4 in every window of 5
    # every position takes the source the documented rules give
    want = [s for s, _ in ref.simulate(TWO_PHASE, 8, 100, 480)]
    assert src.tolist() == want
    assert l.weight_schedule == tokenfeed.WeightSchedule(TWO_PHASE)
    assert l.weights == [0.2, 0.8]   # the point in force at the current position
    st = l.packing_stats()
    assert (st["mix_window"], st["mix_counts"]) == (5, [1, 4])


@pytest.mark.parametrize("packing", MODES)
@pytest.mark.parametrize("k", [11, 37])          # one resume in the middle of each phase
def test_resume_in_the_middle_of_each_phase_is_exact(sources, packing, k):
    a, b, _ = sources()
    kw = dict(weights=TWO_PHASE, seq_len=12, batch_size=8, seed=5, packing=packing, pad_id=PAD, pack_window=16,
              mix_window=100)
    state, whole = assert_resumes_exactly([a, b], k, 10, **kw)
    cfg = state["config"]
    assert (cfg["weights"], cfg["schedule_steps"], cfg["interpolation"]) == ([[0.7, 0.3], [0.2, 0.8]], [0, 25],
                                                                             "constant")
    # and elastically: two ranks with half the batch each continue the same global stream
    halves = []
    for r in range(2):
        lr_ = numpy_loader([a, b], **{**kw, "batch_size": 4}, rank=r, world_size=2)
        lr_.load_state_dict(state)
        halves.append(take_tokens(lr_, 10))
    assert all(np.array_equal(np.concatenate([halves[0][i], halves[1][i]]), whole[k + i]) for i in range(10))


def test_linear_schedule_follows_the_rules_and_resumes(sources):
    a, b, c = sources()
    pts = [(0, [0.9, 0.1, 0.0]), (40, [0.5, 0.3, 0.2]), (60, [0.5, 0.3, 0.2])]
    sched = tokenfeed.WeightSchedule(pts, interpolation="linear")
    kw = dict(weights=sched, seq_len=10, batch_size=5, seed=3, mix_window=50)
    whole = take_tokens(numpy_loader([a, b, c], **kw), 70)
    src = source_of_rows(rows(whole))
    want = [s for s, _ in ref.simulate(pts, 5, 50, 350, linear=True)]
    assert src.tolist() == want
    for k in range(200 // 50):   # windows of the ramp move monotonically toward the second point
        w = np.bincount(src[k * 50:(k + 1) * 50], minlength=3)
        assert abs(w[2] - 50 * 0.2 * (k * 50 + 25) / 200) <= 1.5
    r = numpy_loader([a, b, c], **kw)
    take_tokens(r, 23)
    st = r.state_dict()
    r2 = numpy_loader([a, b, c], **kw)
    r2.load_state_dict(st)
    assert all(np.array_equal(x, y) for x, y in zip(whole[23:], take_tokens(r2, 20)))


def test_schedule_state_names_changes_and_old_states_load(sources):
    a, b, _ = sources()
    base = dict(seq_len=12, batch_size=4, seed=1, mix_window=100)
    st = numpy_loader([a, b], weights=TWO_PHASE, **base).state_dict()
    with pytest.raises(tokenfeed.StateError, match=r"weights: saved \[\(0, \[0.7, 0.3\]\), \(25, \[0.2, 0.8\]\)\]"):
        numpy_loader([a, b], weights=[(0, [0.7, 0.3]), (30, [0.2, 0.8])], **base).load_state_dict(st)
    # a state saved with plain weights (before schedules existed) loads as it always did
    plain = numpy_loader([a, b], weights=[0.7, 0.3], **base)
    take_tokens(plain, 3)
    old = json.loads(json.dumps(plain.state_dict()))
    assert old["config"]["weights"] == [0.7, 0.3] and old["mix_anchor"] is None
    expected = take_tokens(plain, 4)
    again = numpy_loader([a, b], weights=[0.7, 0.3], **base)
    again.load_state_dict(old)
    assert all(np.array_equal(x, y) for x, y in zip(expected, take_tokens(again, 4)))
    # and a schedule whose first phase is those weights continues it without a hand-over
    sched = numpy_loader([a, b], weights=[(0, [0.7, 0.3]), (100, [0.5, 0.5])], **base)
    sched.load_state_dict(old, strict=False)
    assert sched.state_dict()["mix_anchor"] is None
    assert all(np.array_equal(x, y) for x, y in zip(expected, take_tokens(sched, 4)))


def per_source(batches, k):
    src = source_of_rows(rows(batches))
    r = rows(batches)
    return [r[src == s] for s in range(k)]


def test_changed_future_with_strict_false_leaves_consumed_untouched(sources):
    """Saved under 70/30 at position 96; the new schedule differs from step 5 (in the past) on:
    every source continues from the sample it had reached, nothing repeated or skipped, and the
    new proportions apply from the hand-over on."""
    a, b, _ = sources()
    base = dict(seq_len=12, batch_size=8, seed=1, mix_window=100)
    old_sched = [(0, [0.7, 0.3]), (200, [0.5, 0.5])]
    new_sched = [(0, [0.7, 0.3]), (5, [0.2, 0.8])]
    k = 12
    old = numpy_loader([a, b], weights=old_sched, **base)
    before = take_tokens(old, k)
    state = json.loads(json.dumps(old.state_dict()))
    uninterrupted = before + take_tokens(old, 40)         # the old schedule, continued
    new = numpy_loader([a, b], weights=new_sched, **base)
    with pytest.raises(tokenfeed.StateError, match="weights"):
        new.load_state_dict(state)
    new.load_state_dict(state, strict=False)
    after = take_tokens(new, 12)
    had = np.bincount([src for src, _ in ref.simulate(old_sched, 8, 100, k * 8)], minlength=2).tolist()
    assert had == [67, 29]   # 9 windows of 7 + 3, then 4 + 2 of the next
    assert new.state_dict()["mix_anchor"] == [k * 8, had]
    # each source's samples, in delivery order, are one prefix of that source's own stream
    got, want = per_source(before + after, 2), per_source(uninterrupted, 2)
    for s in range(2):
        n = min(len(got[s]), len(want[s]))
        assert n >= 25 and np.array_equal(got[s][:n], want[s][:n]), s
    # the new proportions from the hand-over: 1 + 4 in every window of 5 (windows from step 5 = position 40)
    src_after = source_of_rows(rows(after))          # positions 96 .. 191; the first full window starts at 100
    assert ((src_after[4:94].reshape(-1, 5) == 1).sum(axis=1) == 4).all()
    # the anchored state resumes exactly with strict=True, on a fresh loader of the new schedule
    st2 = json.loads(json.dumps(new.state_dict()))
    more = take_tokens(new, 6)
    fresh = numpy_loader([a, b], weights=new_sched, **base)
    fresh.load_state_dict(st2)
    assert all(np.array_equal(x, y) for x, y in zip(more, take_tokens(fresh, 6)))


def test_schedule_seeks_far_without_walking(sources):
    """A schedule over 10^12 steps with a linear ramp: creating it and resuming near its end
    cost O(points x mix_window), not O(steps)."""
    a, b, _ = sources()
    pts = [(0, [0.9, 0.1]), (10**12, [0.1, 0.9]), (2 * 10**12, [0.5, 0.5])]
    kw = dict(weights=tokenfeed.WeightSchedule(pts, interpolation="linear"), seq_len=8, batch_size=4,
              mix_window=1000)
    l = numpy_loader([a, b], **kw)
    st = l.state_dict()
    st["position"] = (2 * 10**12 - 3) * 4
    l.load_state_dict(st)
    batches = take_tokens(l, 6)
    src = source_of_rows(rows(batches))
    assert len(src) == 24 and set(src.tolist()) <= {0, 1}
    # source 1's share: 0.1 -> 0.9 over the first half (0.5 on average), 0.9 -> 0.5 over the second (0.7)
    assert abs(l._order.mix_source_count(1, st["position"]) - 0.6 * st["position"]) < 1e-6 * st["position"]
