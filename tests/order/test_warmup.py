"""Sequence-length warmup: early batches cut every sample into shorter rows; the concatenated
inputs and labels of the warmed stream are the unwarmed stream's, the extras are each short
row's own, and the state (a position) resumes exactly, on any world size."""
from __future__ import annotations

import numpy as np
import pytest

import tokenfeed
from tokenfeed import _core

L = 64
KW = dict(seq_len=L, output="numpy", num_threads=1)
WARM = dict(warmup_steps=10, warmup_min_seq_len=8)


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    rng = np.random.default_rng(5)
    path = tmp_path_factory.mktemp("warm") / "ds"
    with tokenfeed.DatasetWriter(path, vocab_size=1000) as w:
        for n in rng.integers(1, 300, size=300):
            w.add_document(rng.integers(1, 1000, size=int(n)))
    return tokenfeed.open(path)


def test_schedule():
    got = [_core.seq_len_warmup(L, 8, 10, s) for s in range(12)]
    assert got == [8, 8, 16, 16, 16, 32, 32, 32, 32, 32, 64, 64]
    assert _core.seq_len_warmup(L, 8, 0, 0) == L  # no warmup
    assert all(_core.seq_len_warmup(4096, 256, 1000, s) in (256, 512, 1024, 2048, 4096) for s in range(0, 1100, 7))


@pytest.mark.parametrize("packing", ["concat", "best_fit", "document"])
def test_concatenated_tokens_equal_the_unwarmed_stream(ds, packing):
    extras = dict(cu_seqlens=True, position_ids=True, loss_mask=True)
    a = tokenfeed.Loader(ds, batch_size=3, packing=packing, **KW, **extras)
    b = tokenfeed.Loader(ds, batch_size=3, packing=packing, **KW, **extras, **WARM)
    seen = set()
    for step in range(12):
        cl = b.current_seq_len
        x, y = next(a), next(b)
        k = L // cl
        seen.add(cl)
        assert y["input_ids"].shape == (3 * k, cl) and y["tokens"].shape == (3 * k, cl + 1)
        for key in ("input_ids", "labels", "loss_mask"):
            assert np.array_equal(x[key].reshape(-1), y[key].reshape(-1)), (step, key)
        for r in range(3 * k):
            i, j = divmod(r, k)
            assert np.array_equal(y["tokens"][r], x["tokens"][i][j * cl: j * cl + cl + 1])
            whole = x["cu_seqlens"][i][: int(x["num_seqs"][i][0]) + 1].tolist()
            cu = y["cu_seqlens"][r][: int(y["num_seqs"][r][0]) + 1].tolist()
            assert cu == [0] + [v - j * cl for v in whole if j * cl < v < (j + 1) * cl] + [cl]
            assert (y["cu_seqlens"][r][len(cu):] == cl).all()
            pos = np.minimum(x["position_ids"][i][j * cl:(j + 1) * cl], np.arange(cl))
            assert np.array_equal(y["position_ids"][r], pos)
    assert seen == {8, 16, 32, 64}


def test_resume_and_elastic_resume_during_warmup(ds):
    G = 4
    def run(R, r, skip, n, state=None):
        l = tokenfeed.Loader(ds, batch_size=G // R, rank=r, world_size=R, packing="best_fit", balance="attention",
                             **KW, **WARM)
        if state is not None:
            l.load_state_dict(state)
        for _ in range(skip):
            next(l)
        return l, [next(l)["tokens"].copy() for _ in range(n)]

    _, whole = run(2, 1, 0, 12)
    for k in (1, 3, 7):
        l, _ = run(2, 1, k, 0)
        st = l.state_dict()
        _, rest = run(2, 1, 0, 12 - k, st)
        assert all(np.array_equal(a, b) for a, b in zip(rest, whole[k:]))
        # the same state on 1 and 4 ranks: the same rows, cut the same way
        one = run(1, 0, 0, 12 - k, st)[1]
        four = [run(4, r, 0, 12 - k, st)[1] for r in range(4)]
        for s in range(12 - k):
            assert sorted(map(bytes, one[s])) == sorted(bytes(x) for f in four for x in f[s])


def test_bad_settings_are_refused(ds):
    with pytest.raises(ValueError, match="warmup_min_seq_len"):
        tokenfeed.Loader(ds, batch_size=2, warmup_steps=5, warmup_min_seq_len=12, **KW)
    with pytest.raises(ValueError, match="warmup_min_seq_len"):
        tokenfeed.Loader(ds, batch_size=2, warmup_steps=5, **KW)
    with pytest.raises(ValueError, match="context parallelism"):
        tokenfeed.Loader(ds, batch_size=2, cp_rank=0, cp_size=2, **KW, **WARM)
    with pytest.raises(ValueError, match="one shape"):
        tokenfeed.Loader(ds, batch_size=2, device="cuda", **KW, **WARM)


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    rng = np.random.default_rng(6)
    out = []
    for name in ("a", "b"):
        path = tmp_path_factory.mktemp("warm") / name
        with tokenfeed.DatasetWriter(path, vocab_size=1000) as w:
            for n in rng.integers(1, 200, size=200):
                w.add_document(rng.integers(1, 1000, size=int(n)))
        out.append(tokenfeed.open(path))
    return out


def test_every_extra_has_the_rows_of_input_ids(two):
    """During and after the warmup every per-row and per-token array of a batch (a mixture with
    every extra asked for) has input_ids's rows, and its row length where it is per token; each is
    the unwarmed stream's, cut the same way."""
    extras = dict(cu_seqlens=True, position_ids=True, loss_mask=True, document_ids=True, source_ids=True)
    kw = dict(KW, weights=[0.3, 0.7], batch_size=4, **extras)
    a = tokenfeed.Loader(two, **kw)
    b = tokenfeed.Loader(two, **kw, **WARM)
    per_token = {"input_ids", "labels", "position_ids", "loss_mask", "document_ids"}
    keys = per_token | {"tokens", "cu_seqlens", "num_seqs", "source_ids"}
    seen = set()
    for step in range(13):
        cl = b.current_seq_len
        seen.add(cl)
        x, y = next(a), next(b)
        assert set(y) == set(x) == keys, step
        rows, k = 4 * (L // cl), L // cl
        for key in per_token:
            assert y[key].shape == (rows, cl), (step, key, y[key].shape)
        assert y["tokens"].shape == y["cu_seqlens"].shape == (rows, cl + 1), step
        assert y["num_seqs"].shape == (rows, 1) and y["source_ids"].shape == (rows,), step
        assert np.array_equal(y["source_ids"], np.repeat(x["source_ids"], k)), step
        # each short row's document ids are its own segments of cu_seqlens, from 0
        assert np.array_equal(y["document_ids"], tokenfeed.flex.document_ids(y["cu_seqlens"])), step
        whole = x["document_ids"].reshape(rows, cl)
        assert np.array_equal(y["document_ids"], whole - whole[:, :1]), step
    assert seen == {8, 16, 32, 64}
