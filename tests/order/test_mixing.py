"""Weighted mixtures (docs/packing.md): exact proportions in every window, each source
on its own epochs and shuffle, and the order contract (determinism across threads and
backends, resume, elastic resume, state naming changes) for every packing mode."""
from __future__ import annotations

import numpy as np
import pytest

import tokenfeed
from conftest import assert_resumes_exactly, numpy_loader, take_tokens
from tokenfeed import _core

MODES = ["concat", "best_fit", "document"]
PAD = 1999


@pytest.fixture
def sources(make_dataset):
    """Source A has tokens in [0, 900), B in [1000, 1900): a token says its source."""
    def make(na=120, nb=400, seed=0):
        rng = np.random.default_rng(seed)
        la = np.maximum(1, rng.lognormal(np.log(30), 1.0, size=na).astype(int))
        lb = np.maximum(1, rng.lognormal(np.log(30), 1.0, size=nb).astype(int))
        a = make_dataset(docs=[rng.integers(0, 900, n) for n in la], vocab=2000)
        b = make_dataset(docs=[rng.integers(1000, 1900, n) for n in lb], vocab=2000, shard_tokens=4000)
        return a, b
    return make


def source_of_rows(tokens):
    real = np.where(tokens == PAD, -1, tokens)
    return (real.max(axis=1) >= 1000).astype(int)


@pytest.mark.parametrize("packing", MODES)
def test_70_30_exact_in_every_window(sources, packing):
    a, b = sources()
    l = numpy_loader([a, b], weights=[0.7, 0.3], seq_len=16, batch_size=10, packing=packing, pad_id=PAD, seed=1)
    st = l.packing_stats()
    assert (st["mix_window"], st["mix_counts"]) == (10, [7, 3])
    rows = np.concatenate(take_tokens(l, 60))
    src = source_of_rows(rows)
    assert (src.reshape(-1, 10).sum(axis=1) == 3).all()  # every window of 10 positions: exactly 3 from B
    # and any window aligned to the schedule, not only batch-aligned ones
    order = _core.Order([a._core, b._core], weights=[0.7, 0.3], seq_len=16, packing=MODES.index(packing),
                        pad_id=PAD, seed=1, global_batch=1)
    n0 = order.packing_stats()["sources"][0]["samples"]
    s = order.sample_at(np.arange(10_000, dtype=np.uint64))
    assert ((s >= n0).reshape(-1, 10).sum(axis=1) == 3).all()


def test_counts_at_any_position_and_other_weights(sources):
    a, b = sources()
    order = _core.Order([a._core, b._core, a._core], weights=[5, 3, 2], seq_len=8, global_batch=1, mix_window=1000)
    win, counts = order.mix_schedule()
    assert (win, counts) == (10, [5, 3, 2])
    st = order.packing_stats()
    n = [x["samples"] for x in st["sources"]]
    s = order.sample_at(np.arange(50_000, dtype=np.uint64))
    which = np.searchsorted(np.cumsum(n), s, side="right")
    for k in (0, 3, 7, 123):  # windows anywhere in the stream
        w = which[k * 10:(k + 1) * 10]
        assert [int((w == i).sum()) for i in range(3)] == [5, 3, 2]
    with pytest.raises(ValueError, match="rounds to 0"):
        _core.Order([a._core, b._core], weights=[1, 1e-9], seq_len=8, global_batch=1)


@pytest.mark.parametrize("packing", MODES)
def test_each_source_runs_its_own_epochs(sources, packing):
    a, b = sources(na=60, nb=500)  # A is small: it repeats; B is large: subsampled
    order = _core.Order([a._core, b._core], weights=[1, 1], seq_len=16, packing=MODES.index(packing), pad_id=PAD,
                        seed=7, global_batch=1)
    n0, n1 = (x["samples"] for x in order.packing_stats()["sources"])
    s = order.sample_at(np.arange(2 * 4 * n0, dtype=np.uint64))
    sa = s[s < n0]
    assert len(sa) == 4 * n0
    for e in range(4):  # each epoch of A is a permutation, reshuffled every epoch
        assert np.array_equal(np.sort(sa[e * n0:(e + 1) * n0]), np.arange(n0))
    assert not np.array_equal(sa[:n0], sa[n0:2 * n0])
    sb = s[s >= n0] - n0
    assert len(np.unique(sb)) == len(sb) < n1  # B: no repeats yet, subsampled
    # a source's own shuffle: a different seed for each source, derived from the main seed
    other = _core.Order([a._core, b._core], weights=[1, 1], seq_len=16, packing=MODES.index(packing), pad_id=PAD,
                        seed=8, global_batch=1)
    assert not np.array_equal(other.sample_at(np.arange(200, dtype=np.uint64)), s[:200])


@pytest.mark.parametrize("packing", MODES)
def test_identical_across_threads_and_backends(sources, packing):
    a, b = sources()
    kw = dict(weights=[0.7, 0.3], seq_len=20, batch_size=5, seed=3, packing=packing, pad_id=PAD, pack_window=16)
    ref = take_tokens(numpy_loader([a, b], num_threads=1, backend="mmap", **kw), 25)
    for over in (dict(num_threads=4, prefetch_batches=9), dict(backend="pread"), dict(backend="io_uring", num_threads=3)):
        got = take_tokens(numpy_loader([a, b], **{**kw, **over}), 25)
        assert all(np.array_equal(x, y) for x, y in zip(ref, got)), over


@pytest.mark.parametrize("packing", MODES)
@pytest.mark.parametrize("k", [0, 5, 23])
def test_restore_after_k_batches(sources, packing, k):
    a, b = sources()
    assert_resumes_exactly([a, b], k, 8, weights=[0.7, 0.3], seq_len=12, batch_size=3, seed=5, packing=packing,
                           pad_id=PAD, pack_window=16)


@pytest.mark.parametrize("packing", MODES)
def test_elastic(sources, packing):
    a, b = sources()
    G, kw = 8, dict(weights=[0.7, 0.3], seq_len=14, seed=4, packing=packing, pad_id=PAD)
    ref = take_tokens(numpy_loader([a, b], batch_size=G, **kw), 14)
    for R in (1, 2, 4, 8):
        per = [take_tokens(numpy_loader([a, b], batch_size=G // R, rank=r, world_size=R, **kw), 6) for r in range(R)]
        for bi in range(6):
            assert np.array_equal(np.concatenate([per[r][bi] for r in range(R)]), ref[bi])
    states = []
    for r in range(2):
        l2 = numpy_loader([a, b], batch_size=G // 2, rank=r, world_size=2, **kw)
        take_tokens(l2, 7)
        states.append(l2.state_dict())
    out = []
    for r in range(4):
        l4 = numpy_loader([a, b], batch_size=G // 4, rank=r, world_size=4, **kw)
        l4.load_state_dict(states[0])
        out.append(take_tokens(l4, 5))
    for bi in range(5):
        assert np.array_equal(np.concatenate([out[r][bi] for r in range(4)]), ref[7 + bi])


def test_state_names_mixture_changes(sources, make_dataset):
    a, b = sources()
    base = dict(seq_len=12, batch_size=2, seed=1)
    st = numpy_loader([a, b], weights=[0.7, 0.3], **base).state_dict()
    assert st["config"]["weights"] == [0.7, 0.3] and st["config"]["mix_window"] == 1000
    with pytest.raises(tokenfeed.StateError, match=r"weights: saved \[0.7, 0.3\], now \[0.6, 0.4\]"):
        numpy_loader([a, b], weights=[0.6, 0.4], **base).load_state_dict(st)
    with pytest.raises(tokenfeed.StateError, match="dataset changed"):
        numpy_loader([b, a], weights=[0.7, 0.3], **base).load_state_dict(st)
    c = make_dataset(seed=9, vocab=2000, n_docs=50)
    with pytest.raises(tokenfeed.StateError, match="dataset changed"):
        numpy_loader([a, c], weights=[0.7, 0.3], **base).load_state_dict(st)
    with pytest.raises(ValueError, match="one weight per dataset"):
        numpy_loader([a, b], weights=[1.0], **base)
    with pytest.raises(ValueError, match="weights"):
        numpy_loader([a, b], weights=[1.0, -1.0], **base)
    # the same sources and weights resume
    l = numpy_loader([a, b], weights=[0.7, 0.3], **base)
    l.load_state_dict(st)


def test_mixture_of_paths_and_pickle(sources):
    import pickle

    a, b = sources()
    l = tokenfeed.Loader([a.path if hasattr(a, "path") else a, b], weights=[2, 1], seq_len=10, batch_size=3,
                         output="numpy")
    first = take_tokens(l, 3)
    l2 = pickle.loads(pickle.dumps(l))
    assert l2.position == l.position
    l3 = pickle.loads(pickle.dumps(tokenfeed.Loader([a, b], weights=[2, 1], seq_len=10, batch_size=3,
                                                    output="numpy")))
    assert all(np.array_equal(x, y) for x, y in zip(first, take_tokens(l3, 3)))
