"""Best-fit and one-document-per-sample packing (docs/packing.md): every token of every
document exactly once per epoch, documents that fit land whole in one sample, masks,
and the order contract (coverage, determinism across threads/backends, resume, elastic
resume) for every packing mode."""
from __future__ import annotations

import numpy as np
import pytest

import tokenfeed
from conftest import assert_resumes_exactly, numpy_loader, take_tokens
from tokenfeed import _core

VOCAB = 1 << 20
PAD = VOCAB - 1
SEP = VOCAB - 2
MODES = ["concat", "best_fit", "document"]


def unique_docs(n_docs, seed=0, mean=40.0, empty_frac=0.05):
    """Documents whose tokens are their global positions (so every token is identifiable)."""
    rng = np.random.default_rng(seed)
    lens = np.maximum(1, rng.lognormal(np.log(mean), 1.0, size=n_docs).astype(np.int64))
    lens[rng.random(n_docs) < empty_frac] = 0
    ends = np.cumsum(lens)
    return [np.arange(e - n, e, dtype=np.int64) for e, n in zip(ends, lens)]


@pytest.fixture
def uds(make_dataset):
    def make(n_docs=300, seed=0, mean=40.0, **kw):
        return make_dataset(docs=unique_docs(n_docs, seed, mean), vocab=VOCAB, **kw)
    return make


def epoch_samples(ds, L, packing, sep=None, **kw):
    order = _core.Order(ds._core, seq_len=L, packing={"best_fit": 1, "document": 2}[packing], pad_id=PAD,
                        separator_id=sep, global_batch=1, **kw)
    n = order.num_samples
    want = _core.WANT_POSITION_IDS | _core.WANT_CU_SEQLENS | _core.WANT_LOSS_MASK
    return [order.fill(int(s), want=want) for s in order.sample_at(np.arange(n, dtype=np.uint64))]


@pytest.mark.parametrize("L,window,sep", [(32, 1024, None), (64, 8, None), (16, 50, SEP), (7, 1, None)])
def test_best_fit_every_token_once_and_whole_documents(uds, L, window, sep):
    ds = uds(n_docs=400, mean=20.0)
    docs = ds._test_docs
    samples = epoch_samples(ds, L, "best_fit", sep=sep, pack_window=window, seed=3, shuffle=1)
    seen = np.concatenate([s["tokens"][(s["tokens"] != PAD) & (s["tokens"] != SEP)] for s in samples])
    assert np.array_equal(np.sort(seen), np.arange(sum(len(d) for d in docs)))  # every token exactly once
    where = {}
    for i, s in enumerate(samples):
        for t in s["tokens"][(s["tokens"] != PAD) & (s["tokens"] != SEP)]:
            where.setdefault(int(t), i)
    for d in docs:
        if len(d) and len(d) + (sep is not None) <= L + 1:
            homes = {where[int(t)] for t in d}
            assert len(homes) == 1, "a document that fits was split"
            row = samples[homes.pop()]["tokens"]
            start = int(np.flatnonzero(row == d[0])[0])
            assert np.array_equal(row[start:start + len(d)], d)  # whole and contiguous
            if sep is not None:
                assert row[start + len(d)] == SEP


@pytest.mark.parametrize("packing", ["best_fit", "document"])
@pytest.mark.parametrize("sep", [None, SEP])
def test_masks_inputs_labels(uds, packing, sep):
    ds = uds(n_docs=150, mean=25.0)
    L = 24
    lens = np.array([len(d) for d in ds._test_docs])
    ends = np.cumsum(lens)
    for s in epoch_samples(ds, L, packing, sep=sep, pack_window=40):
        tok, lm, pos, cu = s["tokens"], s["loss_mask"], s["position_ids"], s["cu_seqlens"]
        seg = np.full(L + 1, -1, dtype=np.int64)
        for i, t in enumerate(tok):
            if t == PAD:
                continue
            if t == SEP:  # belongs to the document its previous token ends, else its own segment
                prev = tok[i - 1] if i else PAD
                seg[i] = seg[i - 1] if i and prev not in (PAD, SEP) and (prev + 1) in set(ends.tolist()) else -(i + 2)
            else:
                seg[i] = np.searchsorted(ends, t, side="right")
        # labels[t] = tokens[t+1] is trained only inside one chunk, never on padding
        ref_lm = (seg[:-1] == seg[1:]) & (seg[:-1] != -1)
        assert np.array_equal(lm.astype(bool), ref_lm)
        starts = [0] + [t for t in range(1, L) if seg[t] != seg[t - 1]]
        ref_pos = np.concatenate([np.arange(b - a) for a, b in zip(starts, starts[1:] + [L])])
        assert np.array_equal(pos, ref_pos)
        nseg = int(s["num_seqs"][0])
        assert nseg == len(starts)
        assert list(cu[:nseg + 1]) == starts + [L] and (cu[nseg:] == L).all()


def test_document_mode_one_document_per_sample(uds):
    ds = uds(n_docs=200, mean=30.0)
    L = 31
    order = _core.Order(ds._core, seq_len=L, packing=2, pad_id=PAD, shuffle=0, global_batch=1)
    docs = [d for d in ds._test_docs if len(d)]
    assert order.num_samples == len(docs)  # N = non-empty documents
    for i, d in enumerate(docs):
        row = order.fill(i)["tokens"]
        n = min(len(d), L + 1)
        assert np.array_equal(row[:n], d[:n]) and (row[n:] == PAD).all()
    st = tokenfeed.Loader(ds, seq_len=L, batch_size=2, packing="document", pad_id=PAD, output="numpy").packing_stats()
    assert st["documents_truncated"] == sum(len(d) > L + 1 for d in docs)
    assert st["tokens_dropped"] == sum(max(0, len(d) - L - 1) for d in docs)
    assert st["empty_documents"] == len(ds._test_docs) - len(docs)


# ------------------------------------------------------------ order contract

@pytest.mark.parametrize("packing", MODES)
def test_coverage_every_sample_once(uds, packing):
    ds = uds(n_docs=300)
    order = _core.Order(ds._core, seq_len=16, packing=MODES.index(packing), pad_id=PAD, seed=2, shuffle=2,
                        block_size=5, window_blocks=3, global_batch=1)
    n = order.num_samples
    for e in range(2):
        s = order.sample_at(np.arange(e * n, (e + 1) * n, dtype=np.uint64))
        assert np.array_equal(np.sort(s), np.arange(n, dtype=np.uint64))


@pytest.mark.parametrize("packing", ["best_fit", "document"])
def test_identical_across_threads_and_backends(uds, packing):
    ds = uds(n_docs=500, shard_tokens=3000)
    assert ds.num_files > 1
    kw = dict(seq_len=20, batch_size=3, seed=9, packing=packing, pad_id=PAD, pack_window=64,
              position_ids=True, cu_seqlens=True, loss_mask=True)
    keys = ["tokens", "position_ids", "cu_seqlens", "num_seqs", "loss_mask"]
    def run(**over):
        l = numpy_loader(ds, **{**kw, **over})
        out = [{k: v.copy() for k, v in next(l).items() if k in keys} for _ in range(30)]
        l.close()
        return out
    a = run(num_threads=1, backend="mmap")
    for over in (dict(num_threads=4, prefetch_batches=7), dict(backend="pread", num_threads=3),
                 dict(backend="io_uring", num_threads=2)):
        b = run(**over)
        assert all(np.array_equal(x[k], y[k]) for x, y in zip(a, b) for k in keys), over
    c = run(seed=10)
    assert not all(np.array_equal(x["tokens"], y["tokens"]) for x, y in zip(a, c))


@pytest.mark.parametrize("packing", MODES)
@pytest.mark.parametrize("k", [0, 3, 17])
def test_restore_after_k_batches(uds, packing, k):
    ds = uds(n_docs=200)
    assert_resumes_exactly(ds, k, 8, seq_len=17, batch_size=3, seed=5, packing=packing, pad_id=PAD, pack_window=32,
                           shuffle="block", block_size=4, window_blocks=2)


@pytest.mark.parametrize("packing", ["best_fit", "document"])
def test_elastic(uds, packing):
    ds = uds(n_docs=300)
    G, kw = 8, dict(seq_len=21, seed=4, packing=packing, pad_id=PAD, pack_window=50)
    ref = take_tokens(numpy_loader(ds, batch_size=G, **kw), 14)
    for R in (1, 2, 4, 8):
        per = [take_tokens(numpy_loader(ds, batch_size=G // R, rank=r, world_size=R, **kw), 6) for r in range(R)]
        for b in range(6):
            assert np.array_equal(np.concatenate([per[r][b] for r in range(R)]), ref[b])
    states = []
    for r in range(2):
        l2 = numpy_loader(ds, batch_size=G // 2, rank=r, world_size=2, **kw)
        take_tokens(l2, 7)
        states.append(l2.state_dict())
    out = []
    for r in range(4):
        l4 = numpy_loader(ds, batch_size=G // 4, rank=r, world_size=4, **kw)
        l4.load_state_dict(states[r % 2])
        out.append(take_tokens(l4, 5))
    for b in range(5):
        assert np.array_equal(np.concatenate([out[r][b] for r in range(4)]), ref[7 + b])


def test_state_names_packing_changes(uds):
    ds = uds()
    base = dict(seq_len=16, batch_size=2, seed=1)
    s_bf = numpy_loader(ds, packing="best_fit", pad_id=PAD, **base).state_dict()
    assert s_bf["config"]["packing"] == "best_fit" and s_bf["config"]["pad_id"] == PAD
    assert s_bf["config"]["pack_window"] == 1024
    with pytest.raises(tokenfeed.StateError, match="packing: saved 'best_fit', now 'concat'"):
        numpy_loader(ds, **base).load_state_dict(s_bf)
    with pytest.raises(tokenfeed.StateError, match="pack_window: saved 1024, now 64"):
        numpy_loader(ds, packing="best_fit", pad_id=PAD, pack_window=64, **base).load_state_dict(s_bf)
    with pytest.raises(tokenfeed.StateError, match="pad_id"):
        numpy_loader(ds, packing="best_fit", pad_id=5, **base).load_state_dict(s_bf)
    # every state has the same keys; a setting that does not change the stream is None
    assert numpy_loader(ds, **base).state_dict()["config"]["pad_id"] is None
    with pytest.raises(ValueError, match="packing"):
        numpy_loader(ds, packing="best", **base)
    with pytest.raises(ValueError, match="pad_id"):
        numpy_loader(ds, packing="best_fit", pad_id=VOCAB + 5, **base)


def test_packing_stats_lognormal_best_fit_vs_concat(make_dataset):
    rng = np.random.default_rng(0)
    lens = np.maximum(1, rng.lognormal(np.log(300), 1.2, size=3000).astype(np.int64))
    ds = make_dataset(docs=[rng.integers(0, 1000, size=n) for n in lens], vocab=1024)
    L = 1024
    cat = numpy_loader(ds, seq_len=L, batch_size=1).packing_stats()
    bf = numpy_loader(ds, seq_len=L, batch_size=1, packing="best_fit").packing_stats()
    assert cat["pad_tokens"] == 0 and cat["documents"] == bf["documents"] == 3000
    # concat: a document is split when no sample holds it whole
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
    end = cat["samples"] * L + 1
    inside = starts + lens <= end
    ref_split = ((starts + lens > starts // L * L + L + 1) & inside).sum()
    assert cat["documents_split"] == ref_split
    # best fit: only documents longer than L + 1 are split, nothing is dropped
    assert bf["documents_split"] == (lens > L + 1).sum() < cat["documents_split"]
    assert bf["tokens_dropped"] == 0 and bf["pad_tokens"] == bf["samples"] * (L + 1) - lens.sum()
    assert bf["padding_fraction"] < 0.1


def test_token_dataset_packing(uds):
    torch = pytest.importorskip("torch")
    from tokenfeed.torch import TokenDataset

    ds = uds(n_docs=200)
    td = TokenDataset(ds, seq_len=20, seed=3, packing="best_fit", pad_id=PAD, loss_mask=True)
    l = numpy_loader(ds, seq_len=20, batch_size=4, seed=3, packing="best_fit", pad_id=PAD, loss_mask=True)
    b = next(l)
    for i in range(4):
        item = td[i]
        assert torch.equal(item["input_ids"], torch.from_numpy(b["input_ids"][i]))
        assert torch.equal(item["loss_mask"], torch.from_numpy(b["loss_mask"][i]))
