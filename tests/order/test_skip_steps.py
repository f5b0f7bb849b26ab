"""Skipping the data of some steps (Loader.skip_steps): the stream continues after them, and
the state records them, so a resume (same or another world size) skips the same data."""
from __future__ import annotations

import json
from typing import Any, List

import numpy as np
import pytest

import tokenfeed
from conftest import numpy_loader, take_tokens

KW: Any = dict(seq_len=12, batch_size=8, seed=7, epochs=3)


@pytest.fixture
def data(make_dataset):
    return make_dataset(n_docs=200, vocab=3000, mean_len=40)


def same(x: List[np.ndarray], y: List[np.ndarray]) -> bool:
    return len(x) == len(y) and all(np.array_equal(a, b) for a, b in zip(x, y))


@pytest.mark.parametrize("extra", [{}, dict(packing="best_fit", pad_id=0, shuffle="block", block_size=16)])
def test_skipping_then_resuming_gives_the_stream_without_those_steps(data, extra):
    kw = {**KW, **extra}
    whole = take_tokens(numpy_loader(data, **kw), 40)
    # a run checkpointed at step 6; a loss spike around steps 10..14: resume at 6, skip 10..15
    run = numpy_loader(data, **kw)
    take_tokens(run, 6)
    ckpt = json.loads(json.dumps(run.state_dict()))
    resumed = numpy_loader(data, **kw)
    resumed.load_state_dict(ckpt)
    resumed.skip_steps(10, 15)
    assert resumed.position == 6 * 8
    got = take_tokens(resumed, 2)
    # saved before reaching the skipped steps: a resume from there skips them too
    mid = json.loads(json.dumps(resumed.state_dict()))
    assert mid["skipped"] == [[80, 120]]
    got += take_tokens(resumed, 10)
    assert resumed.stats()["skipped_steps"] == 5 and resumed.stats()["skipped_samples"] == 40
    want = whole[6:10] + whole[15:23]
    assert same(got, want)
    again = numpy_loader(data, **kw)
    again.load_state_dict(mid)
    assert again.stats()["skipped_steps"] == 0  # not reached yet
    assert same(take_tokens(again, 10), want[2:])
    # and from a state saved after the skip: the range stays recorded, the position is past it
    after = json.loads(json.dumps(resumed.state_dict()))
    assert after["skipped"] == [[80, 120]] and after["position"] == 23 * 8
    last = numpy_loader(data, **kw)
    last.load_state_dict(after)
    assert same(take_tokens(last, 5), whole[23:28])
    assert last.stats()["skipped_steps"] == 5


def test_skipped_steps_resume_on_another_world_size(data):
    def ranks(n: int) -> List[tokenfeed.Loader]:
        return [numpy_loader(data, **{**KW, "batch_size": 8 // n}, dp_rank=r, dp_size=n) for r in range(n)]

    def step(lds: List[tokenfeed.Loader]) -> np.ndarray:
        return np.concatenate([next(ld)["tokens"] for ld in lds])

    whole = take_tokens(numpy_loader(data, **KW), 30)
    four = ranks(4)
    for ld in four:
        ld.skip_steps(3, 6)
        ld.skip_steps(10, 12)
    got = [step(four) for _ in range(5)]
    state = json.loads(json.dumps(four[0].state_dict()))
    assert state["skipped"] == [[24, 48], [80, 96]]
    two = ranks(2)
    for ld in two:
        ld.load_state_dict(state)
    got += [step(two) for _ in range(10)]
    assert same(got, whole[:3] + whole[6:10] + whole[12:20])


def test_skip_ranges_merge_and_bad_ranges_are_refused(data):
    ld = numpy_loader(data, **KW)
    take_tokens(ld, 4)
    for a, b, match in ((2, 6, "already delivered"), (6, 6, "start < stop"), (10**9, 10**9 + 1, "past the end")):
        with pytest.raises(ValueError, match=match):
            ld.skip_steps(a, b)
    ld.skip_steps(8, 10)
    ld.skip_steps(10, 12)
    ld.skip_steps(5, 6)
    assert ld.state_dict()["skipped"] == [[40, 48], [64, 96]]
    bad = ld.state_dict() | {"skipped": [[64, 96], [40, 48]]}
    with pytest.raises(tokenfeed.StateError, match="ascending"):
        numpy_loader(data, **KW).load_state_dict(bad)


def test_skips_survive_pickling_and_apply_to_source_ids(data, make_dataset):
    import pickle

    other = make_dataset(n_docs=100, vocab=3000, seed=3)
    kw = dict(seq_len=12, batch_size=4, seed=1, weights=[0.5, 0.5], source_ids=True)
    whole = [next(ld) for ld in [numpy_loader([data, other], **kw)] for _ in range(12)]
    ld = numpy_loader([data, other], **kw)
    ld.skip_steps(2, 5)
    copy = pickle.loads(pickle.dumps(ld))
    got = [next(copy) for _ in range(4)]
    for g, w in zip(got, whole[:2] + whole[5:7]):
        assert np.array_equal(g["tokens"], w["tokens"]) and np.array_equal(g["source_ids"], w["source_ids"])


def test_len_and_where_leave_skipped_steps_out(data):
    loader = numpy_loader(data, **KW)
    total = len(loader)
    loader.skip_steps(3, 11)
    assert len(loader) == total - 8  # the batches that will come, not those left out
    got = sum(1 for _ in loader)
    assert got == total - 8 and len(loader) == 0
    # mid-way through, and from inside a skipped range
    part = numpy_loader(data, **KW)
    part.skip_steps(2, 5)
    part.skip_steps(8, 9)
    take_tokens(part, 2)
    assert len(part) == total - 2 - 4
    # where() answers with the steps that deliver the document, never a skipped one
    ld = numpy_loader(data, **KW)
    doc = ld.explain(0)[0][0].document
    before = ld.where(doc)
    assert 0 in [r["step"] for r in before]
    ld.skip_steps(0, 1)
    after = ld.where(doc)
    assert 0 not in [r["step"] for r in after]
    assert after == [r for r in before if r["step"] != 0]


@pytest.mark.parametrize("epochs", [None, 3])
def test_steps_past_64_bit_positions_are_refused_not_wrapped(data, epochs):
    loader = numpy_loader(data, **{**KW, "epochs": epochs})
    # 2**62 steps of 8 samples pass 2**64 positions: refused, never wrapped round to step 0
    with pytest.raises(ValueError, match="2\\*\\*64|past the end"):
        loader.skip_steps(2**62, 2**62 + 1)
    assert loader.state_dict()["skipped"] is None
    with pytest.raises(ValueError, match="2\\*\\*64|past the end"):
        loader.skip_steps(2**61, 2**64)
    assert loader.state_dict()["skipped"] is None
    with pytest.raises((ValueError, OverflowError), match="2\\*\\*64"):
        loader._order.skip(0, 2**64 + 8)
    assert loader._order.skips() == []
