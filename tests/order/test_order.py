"""The global order contract (docs/order.md, docs/design.md): permutation, coverage, determinism,
exact resume, rank partition and elastic resume."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tokenfeed
from conftest import assert_resumes_exactly, numpy_loader, take_tokens
from tokenfeed import _core


# ---------------------------------------------------------------- permutation

@pytest.mark.parametrize("n", [1, 2, 3, 5, 7, 11, 13, 97, 101, 8191, 2, 4, 8, 16, 1024, 65536, 100_000])
def test_permutation_is_bijection(n):
    for key in (0, 1, 0xDEADBEEF):
        p = _core.Permutation(n, key)
        img = p.apply(np.arange(n, dtype=np.uint64))
        assert np.array_equal(np.sort(img), np.arange(n, dtype=np.uint64))
        assert np.array_equal(p.inverse(img), np.arange(n, dtype=np.uint64))


@pytest.mark.parametrize("n", [2**40 + 17, 2**62 - 57, 2**63])
def test_permutation_large_n_spot_checks(n):
    p = _core.Permutation(n, 12345)
    rng = np.random.default_rng(0)
    xs = rng.integers(0, n, size=2000, dtype=np.uint64)
    ys = p.apply(xs)
    assert (ys < n).all()
    assert np.array_equal(p.inverse(ys), xs)
    assert len(np.unique(ys)) == len(np.unique(xs))  # injective on the sample


def test_permutation_rejects_empty_and_out_of_range():
    with pytest.raises(ValueError):
        _core.Permutation(0, 1)
    p = _core.Permutation(10, 1)
    with pytest.raises(IndexError):
        p.apply(10)


def _quality_ok(perm: np.ndarray) -> bool:
    """Statistical checks a good shuffle passes and structured orders fail."""
    n = len(perm)
    x = np.arange(n, dtype=np.float64)
    y = perm.astype(np.float64)
    # 1. no linear relation between position and sample
    corr = abs(np.corrcoef(x, y)[0, 1])
    # 2. consecutive gaps look random: a rotation or an LCG has a single gap value
    gaps = (perm[1:].astype(np.int64) - perm[:-1].astype(np.int64)) % n
    distinct_gap_frac = len(np.unique(gaps)) / (n - 1)
    # 3. the first tenth of the epoch draws evenly from every tenth of the data
    first = perm[: n // 10]
    counts = np.bincount(first * 10 // n, minlength=10)
    expected = len(first) / 10
    chi2 = ((counts - expected) ** 2 / expected).sum()
    return corr < 0.05 and distinct_gap_frac > 0.5 and chi2 < 40


def test_shuffle_quality_statistical():
    n = 20011
    ours = _core.Permutation(n, 7).apply(np.arange(n, dtype=np.uint64))
    assert _quality_ok(ours)
    i = np.arange(n, dtype=np.uint64)
    assert not _quality_ok(i)                                 # identity
    assert not _quality_ok((i + 5003) % n)                    # rotation
    assert not _quality_ok((i * 7919 + 13) % n)               # LCG-style affine map
    assert not _quality_ok(((i * 1103515245 + 12345) % n))    # classic LCG constants


# ------------------------------------------------------------------ coverage

@pytest.mark.parametrize("shuffle", ["none", "full", "block"])
def test_every_sample_once_per_epoch(make_dataset, shuffle):
    ds = make_dataset(n_docs=400)
    order = _core.Order(ds._core, seq_len=32, shuffle={"none": 0, "full": 1, "block": 2}[shuffle],
                        block_size=7, window_blocks=3, seed=3, global_batch=1)
    n = order.num_samples
    assert n == (ds.num_tokens - 1) // 32
    for epoch in range(3):
        pos = np.arange(epoch * n, (epoch + 1) * n, dtype=np.uint64)
        s = order.sample_at(pos)
        assert np.array_equal(np.sort(s), np.arange(n, dtype=np.uint64))
    if shuffle != "none":
        e0 = order.sample_at(np.arange(0, n, dtype=np.uint64))
        e1 = order.sample_at(np.arange(n, 2 * n, dtype=np.uint64))
        assert not np.array_equal(e0, e1), "epochs must be shuffled differently"


def test_concat_packing_matches_token_stream(make_dataset):
    ds = make_dataset(n_docs=50, shard_tokens=2000)  # several shards: samples cross files
    assert ds.num_files > 1
    stream = np.concatenate(ds._test_docs)
    L = 64
    loader = numpy_loader(ds, seq_len=L, batch_size=4, shuffle=False, epochs=1)
    i = 0
    for batch in loader:
        for row in batch["tokens"]:
            assert np.array_equal(row, stream[i * L: i * L + L + 1])
            i += 1
        assert np.array_equal(batch["input_ids"], batch["tokens"][:, :-1])
        assert np.array_equal(batch["labels"], batch["tokens"][:, 1:])
    n = (len(stream) - 1) // L
    assert i == n // 4 * 4  # final partial global batch dropped


def test_identical_config_identical_stream(make_dataset):
    ds = make_dataset()
    a = take_tokens(numpy_loader(ds, seq_len=33, batch_size=3, seed=9, num_threads=1), 40)
    b = take_tokens(numpy_loader(ds, seq_len=33, batch_size=3, seed=9, num_threads=4, prefetch_batches=9), 40)
    c = take_tokens(numpy_loader(ds, seq_len=33, batch_size=3, seed=10), 40)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


# -------------------------------------------------------------------- resume

@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(k=st.integers(0, 60), shuffle=st.sampled_from(["none", "full", "block"]), bs=st.integers(1, 5))
def test_restore_after_k_batches_continues_exactly(make_dataset, k, shuffle, bs):
    ds = make_dataset(n_docs=120, seed=1)
    assert_resumes_exactly(ds, k, 10, seq_len=17, batch_size=bs, seed=5, shuffle=shuffle, block_size=4,
                           window_blocks=2)


def test_state_is_small_and_json(make_dataset):
    import json

    ds = make_dataset()
    loader = numpy_loader(ds, seq_len=16, batch_size=2)
    take_tokens(loader, 3)
    s = json.dumps(loader.state_dict())
    # a few hundred bytes, every key fixed (docs/design.md): under 1 KiB for one dataset
    assert len(s) < 1024
    assert json.loads(s)["position"] == 6


def test_state_refused_on_other_data_or_config(make_dataset):
    ds1, ds2 = make_dataset(seed=1), make_dataset(seed=2)
    state = numpy_loader(ds1, seq_len=16, batch_size=2, seed=1).state_dict()
    with pytest.raises(tokenfeed.StateError, match="dataset changed"):
        numpy_loader(ds2, seq_len=16, batch_size=2, seed=1).load_state_dict(state)
    with pytest.raises(tokenfeed.StateError, match="seed: saved 1, now 2"):
        numpy_loader(ds1, seq_len=16, batch_size=2, seed=2).load_state_dict(state)
    with pytest.raises(tokenfeed.StateError, match="seq_len"):
        numpy_loader(ds1, seq_len=32, batch_size=2, seed=1).load_state_dict(state)
    # deliberate change: a new seed from here on
    other = numpy_loader(ds1, seq_len=16, batch_size=2, seed=2)
    other.load_state_dict(state, strict=False)
    assert other.position == 0


# ---------------------------------------------------------- ranks, elasticity

def global_stream(ds, G, n_batches, **kw):
    return take_tokens(numpy_loader(ds, batch_size=G, rank=0, world_size=1, **kw), n_batches)


@pytest.mark.parametrize("R", [1, 2, 4, 8])
def test_rank_slices_concatenate_to_single_rank_stream(make_dataset, R):
    ds = make_dataset(n_docs=200)
    G = 8
    kw = dict(seq_len=21, seed=4)
    ref = global_stream(ds, G, 12, **kw)
    per_rank = [take_tokens(numpy_loader(ds, batch_size=G // R, rank=r, world_size=R, **kw), 12) for r in range(R)]
    for b in range(12):
        assert np.array_equal(np.concatenate([per_rank[r][b] for r in range(R)]), ref[b])


def test_elastic_resume_two_ranks_to_four(make_dataset):
    ds = make_dataset(n_docs=200)
    G, kw = 8, dict(seq_len=21, seed=4)
    ref = global_stream(ds, G, 20, **kw)
    states = []
    for r in range(2):
        l2 = numpy_loader(ds, batch_size=G // 2, rank=r, world_size=2, **kw)
        take_tokens(l2, 7)
        states.append(l2.state_dict())
    assert states[0]["position"] == states[1]["position"] == 7 * G
    resumed = []
    for r in range(4):
        l4 = numpy_loader(ds, batch_size=G // 4, rank=r, world_size=4, **kw)
        l4.load_state_dict(states[0])
        resumed.append(take_tokens(l4, 5))
    for b in range(5):
        assert np.array_equal(np.concatenate([resumed[r][b] for r in range(4)]), ref[7 + b])


def test_elastic_resume_refuses_world_size_not_dividing_position(make_dataset):
    ds = make_dataset()
    l = numpy_loader(ds, seq_len=16, batch_size=3, world_size=1, rank=0)
    take_tokens(l, 1)
    state = l.state_dict()
    other = numpy_loader(ds, seq_len=16, batch_size=2, world_size=2, rank=0)
    with pytest.raises(tokenfeed.StateError):
        other.load_state_dict(state)


@pytest.mark.parametrize("step", [40, 41])
def test_changed_global_batch_refused_at_every_step(make_dataset, step):
    """Two ranks keep their batch_size but the world doubles (global batch 8 -> 16): the state is
    refused whether its step is even or odd, strict or lenient, naming the sizes and what to keep;
    another world size with the same global batch resumes at both steps."""
    ds = make_dataset(n_docs=200)
    kw = dict(seq_len=21, seed=4)
    states = []
    for r in range(2):
        l2 = numpy_loader(ds, batch_size=4, rank=r, world_size=2, num_threads=1, **kw)
        take_tokens(l2, step)
        states.append(l2.state_dict())
    assert states[0]["position"] == step * 8
    for r in range(2):
        bigger = numpy_loader(ds, batch_size=4, rank=r, world_size=4, num_threads=1, **kw)
        for strict in (True, False):
            with pytest.raises(tokenfeed.StateError, match=r"global_batch changed: .* global batch of 8 samples .* "
                               r"has 16\. Its position \(step " + str(step) + r"\)"):
                bigger.load_state_dict(states[r], strict=strict)
        assert bigger.position == 0
    ref = take_tokens(numpy_loader(ds, batch_size=8, rank=0, world_size=1, **kw), step + 1)[step]
    same_g = [numpy_loader(ds, batch_size=2, rank=r, world_size=4, **kw) for r in range(4)]
    for ld in same_g:
        ld.load_state_dict(states[0])
        assert ld.position == step * 8
    assert np.array_equal(np.concatenate([next(ld)["tokens"] for ld in same_g]), ref)


def test_rank_defaults_from_environment(make_dataset, monkeypatch):
    ds = make_dataset()
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    l = numpy_loader(ds, seq_len=16, batch_size=2)
    assert (l.rank, l.world_size, l.global_batch) == (3, 4, 8)


def test_finite_epochs_stop(make_dataset):
    ds = make_dataset(n_docs=30)
    l = numpy_loader(ds, seq_len=50, batch_size=2, epochs=2)
    n = len(l)
    assert n == (2 * l.num_samples) // 2
    assert sum(1 for _ in l) == n
    with pytest.raises(StopIteration):
        next(l)
