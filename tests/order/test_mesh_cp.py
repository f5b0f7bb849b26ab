"""Context parallelism in one process (explicit cp_rank/cp_size): each CP rank's batch is its
load-balanced share of the samples the one-process loader gives, in the layouts of
Megatron-Core's get_batch_on_this_cp_rank (plain) and TransformerEngine's THD partition (with
cu_seqlens), checked against the references in cp_reference.py; every backend and thread
count gives the same bytes; a rank reads only its ranges; the state does not depend on CP;
and per-source accounting of mixtures. The multi-process runs are in test_mesh_torchrun.py.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

import tokenfeed

import cp_reference as ref
from test_device import cuda_double, run_py  # noqa: F401  (the CUDA runtime test double)

MODES = ["concat", "best_fit", "document"]
PAD = 4999


@pytest.fixture
def ds(make_dataset):
    return make_dataset(n_docs=400, vocab=5000, mean_len=40, shard_tokens=3000, seed=4)


def whole(ds, n, **kw):
    """n batches of the one-process loader (no CP), every extra."""
    l = tokenfeed.Loader(ds, output="numpy", num_threads=1, position_ids=True, cu_seqlens=True, loss_mask=True, **kw)
    out = [{k: v.copy() for k, v in next(l).items()} for _ in range(n)]
    l.close()
    return out


def cp_batches(ds, n, cp, r, **kw):
    l = tokenfeed.Loader(ds, output="numpy", num_threads=kw.pop("num_threads", 1), cp_rank=r, cp_size=cp, **kw)
    out = [{k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in next(l).items()} for _ in range(n)]
    st = l.stats()
    l.close()
    return out, st


@pytest.mark.parametrize("packing", MODES)
@pytest.mark.parametrize("cp", [2, 4])
def test_plain_split_is_megatron_layout(ds, packing, cp):
    kw = dict(seq_len=32, batch_size=3, seed=7, packing=packing, pad_id=PAD, pack_window=32)
    full = whole(ds, 5, **kw)
    parts = []
    for r in range(cp):
        got, _ = cp_batches(ds, 5, cp, r, position_ids=True, loss_mask=True, **kw)
        parts.append(got)
        for b, g in zip(full, got):
            assert "tokens" not in g
            assert np.array_equal(g["input_ids"], ref.megatron_cp_split(b["tokens"][:, :-1], cp, r))
            assert np.array_equal(g["labels"], ref.megatron_cp_split(b["tokens"][:, 1:], cp, r))
            assert np.array_equal(g["position_ids"], ref.megatron_cp_split(b["position_ids"], cp, r))
            assert np.array_equal(g["loss_mask"], ref.megatron_cp_split(b["loss_mask"], cp, r))
            assert g["input_ids"].shape == (3, 32 // cp)
    # the CP group's pieces reassemble into the samples, with their position ids
    for i, b in enumerate(full):
        for k, key in (("input_ids", "tokens"), ("position_ids", "position_ids"), ("loss_mask", "loss_mask")):
            got = ref.megatron_cp_unsplit([parts[r][i][k] for r in range(cp)])
            assert np.array_equal(got, b[key][:, :32] if key == "tokens" else b[key])


@pytest.mark.parametrize("packing", MODES)
@pytest.mark.parametrize("cp", [2, 3])
def test_thd_layout_is_transformer_engine_layout(ds, packing, cp):
    kw = dict(seq_len=24, batch_size=4, seed=2, packing=packing, pad_id=PAD, pack_window=32)
    full = whole(ds, 4, **kw)
    pad = PAD  # THD padding is pad_id (also in concat mode, where nothing else pads)
    for r in range(cp):
        got, _ = cp_batches(ds, 4, cp, r, position_ids=True, cu_seqlens=True, loss_mask=True, **kw)
        for b, g in zip(full, got):
            want = ref.thd_layout(b, cp, r, pad_id=pad)
            for k in ("input_ids", "labels", "position_ids", "loss_mask", "cu_seqlens", "cu_seqlens_padded"):
                assert np.array_equal(g[k], want[k]), k
            assert g["max_seqlen"] == int(want["max_seqlen"][0]) and g["num_seqs"] == len(want["cu_seqlens"]) - 1
            assert g["input_ids"].ndim == 1 and len(g["input_ids"]) * cp == g["cu_seqlens_padded"][-1]
    # reassembled: every sequence's real tokens, in order, are the rows' input ids end to end
    parts = [cp_batches(ds, 1, cp, r, cu_seqlens=True, **kw)[0][0] for r in range(cp)]
    cu_pad, cu = parts[0]["cu_seqlens_padded"], parts[0]["cu_seqlens"]
    seq = ref.thd_unsplit([p["input_ids"] for p in parts], cu_pad)
    real = np.concatenate([seq[cu_pad[j]:cu_pad[j] + cu[j + 1] - cu[j]] for j in range(len(cu) - 1)])
    assert np.array_equal(real, full[0]["tokens"][:, :-1].reshape(-1))


@pytest.mark.parametrize("cu_seqlens", [False, True])
def test_same_bytes_on_every_backend_and_thread_count(make_dataset, cu_seqlens):
    plain = make_dataset(n_docs=300, vocab=5000, mean_len=50, shard_tokens=4000, seed=1)
    packed = make_dataset(n_docs=300, vocab=5000, mean_len=50, shard_tokens=4000, seed=1, compression="zstd",
                          block_tokens=512)
    kw = dict(seq_len=48, batch_size=5, seed=3, position_ids=True, loss_mask=True, cu_seqlens=cu_seqlens,
              separator_id=4000)
    first, _ = cp_batches(plain, 6, 2, 1, **kw)
    for data, over in ((plain, dict(backend="pread")), (plain, dict(backend="io_uring", num_threads=3)),
                       (plain, dict(num_threads=2, prefetch_batches=7)), (packed, {})):
        got, _ = cp_batches(data, 6, 2, 1, **{**kw, **over})
        for a, b in zip(first, got):
            assert a.keys() == b.keys()
            for k in a:
                assert np.array_equal(a[k], b[k]), (over, k)


def test_a_rank_reads_only_its_ranges(make_dataset):
    """bytes_read grows by whole batches (prefetched ones included), each the same amount: the
    tokens of the rank's two chunks plus the label after each, not the whole sample."""
    ds = make_dataset(n_docs=200, vocab=5000, mean_len=80, seed=5)
    L, B, n = 64, 4, 5

    def per_batch_read(cp, r):
        _, st = cp_batches(ds, n, cp, r, seq_len=L, batch_size=B, backend="mmap", prefetch_batches=1)
        return st["bytes_read"]

    whole_row = B * (L + 1) * 2                                    # uint16 tokens
    got = per_batch_read(1, 0)
    assert got % whole_row == 0 and got >= n * whole_row
    c = L // 8
    for r, span in ((0, 2 * (c + 1)), (3, 2 * c + 1)):            # rank 3: its chunks 3 and 4 touch
        got = per_batch_read(4, r)
        assert got % (B * span * 2) == 0 and n * B * span * 2 <= got <= (n + 2) * B * span * 2, r


def test_cp_errors(ds):
    with pytest.raises(ValueError, match=r"not divisible by 2 x cp_size = 6"):
        tokenfeed.Loader(ds, seq_len=32, batch_size=2, cp_rank=0, cp_size=3)
    with pytest.raises(ValueError, match="0 <= cp_rank < cp_size"):
        tokenfeed.Loader(ds, seq_len=32, batch_size=2, cp_rank=2, cp_size=2)
    with pytest.raises(TypeError, match="together"):
        tokenfeed.Loader(ds, seq_len=32, batch_size=2, cp_size=2)
    with pytest.raises(TypeError, match="older names"):
        tokenfeed.Loader(ds, seq_len=32, batch_size=2, rank=0, dp_rank=0, dp_size=2)


def test_state_does_not_depend_on_cp_or_tp(ds):
    kw = dict(seq_len=32, batch_size=4, seed=9)
    a = tokenfeed.Loader(ds, output="numpy", **kw)
    b = tokenfeed.Loader(ds, output="numpy", cp_rank=1, cp_size=2, **kw)
    for _ in range(3):
        next(a), next(b)
    sa, sb = a.state_dict(), b.state_dict()
    assert sa == sb
    # a state saved without CP resumes with CP (and the other way round) on the same stream
    c = tokenfeed.Loader(ds, output="numpy", cp_rank=0, cp_size=2, **kw)
    c.load_state_dict(json.loads(json.dumps(sa)))
    nxt = next(a)
    assert np.array_equal(next(c)["input_ids"], ref.megatron_cp_split(nxt["input_ids"], 2, 0))
    d = tokenfeed.Loader(ds, output="numpy", **kw)
    d.load_state_dict(sb)
    assert np.array_equal(next(d)["tokens"], nxt["tokens"])
    assert "cp=1/2" in repr(b) and b.cp_size == 2 and b.dp_size == 1


def test_cp_with_a_mixture_schedule(make_dataset):
    a = make_dataset(docs=[np.arange(1, 40) for _ in range(100)], vocab=5000)
    b = make_dataset(docs=[np.arange(2000, 2050) for _ in range(100)], vocab=5000)
    kw = dict(seq_len=16, batch_size=10, weights=[(0, [0.7, 0.3]), (3, [0.2, 0.8])], mix_window=10, seed=1)
    full = tokenfeed.Loader([a, b], output="numpy", **kw)
    parts = [tokenfeed.Loader([a, b], output="numpy", cp_rank=r, cp_size=2, **kw) for r in range(2)]
    for _ in range(6):
        f = next(full)
        got = ref.megatron_cp_unsplit([next(p)["input_ids"] for p in parts])
        assert np.array_equal(got, f["input_ids"])
    # every rank of the CP group counts its DP rank's whole samples
    s0, s1 = parts[0].stats()["sources"], parts[1].stats()["sources"]
    assert [x["samples"] for x in s0] == [x["samples"] for x in s1] == [3 * 7 + 3 * 2, 3 * 3 + 3 * 8]


@pytest.mark.parametrize("packing", MODES)
def test_per_source_accounting(make_dataset, packing):
    rng = np.random.default_rng(3)
    a = make_dataset(docs=[rng.integers(1, 900, int(n)) for n in rng.integers(5, 60, 200)], vocab=5000)
    b = make_dataset(docs=[rng.integers(1000, 1900, int(n)) for n in rng.integers(5, 60, 300)], vocab=5000)
    l = tokenfeed.Loader([a, b], weights=[0.7, 0.3], seq_len=32, batch_size=10, mix_window=10, packing=packing,
                         pad_id=PAD, output="numpy", position_ids=True, seed=4)
    rows, pos = [], []
    for _ in range(12):
        x = next(l)
        rows.append(x["input_ids"].copy())
        pos.append(x["position_ids"].copy())
    inp, posi = np.concatenate(rows), np.concatenate(pos)
    src = (np.where(inp == PAD, -1, inp).max(axis=1) >= 1000).astype(int)
    st = l.stats()["sources"]
    assert [s["samples"] for s in st] == [84, 36]
    assert [s["share"] for s in st] == [0.7, 0.3] and [s["scheduled_share"] for s in st] == [0.7, 0.3]
    assert [s["weight"] for s in st] == [0.7, 0.3]
    for k in range(2):
        assert st[k]["tokens"] == int((inp[src == k] != PAD).sum()), k
        starts_inside = int((posi[src == k][:, 1:] == 0).sum())  # documents starting after a row's first slot
        if packing == "document":                                   # one document per row, from its start
            assert st[k]["documents"] == st[k]["samples"]
        else:
            assert starts_inside <= st[k]["documents"] <= starts_inside + st[k]["samples"], k
    # one dataset: no per-source entry
    single = tokenfeed.Loader(a, seq_len=32, batch_size=2, output="numpy")
    next(single)
    assert "sources" not in single.stats()


def test_cp_batches_through_the_device_path(cuda_double, tmp_path):
    """Loader(device="cuda") with CP: the rank's input_ids/labels (their own buffers, no tokens)
    and the THD ints arrive as on the CPU path (CUDA runtime test double)."""
    run_py("""
        ds = make_dataset(os.path.join(os.environ["TF_TMP"], "ds"))
        for extra in (dict(position_ids=True), dict(cu_seqlens=True, loss_mask=True)):
            kw = dict(seq_len=64, batch_size=4, seed=2, output="numpy", cp_rank=1, cp_size=2, **extra)
            cpu = tokenfeed.Loader(ds, **kw)
            dev = tokenfeed.Loader(ds, device="cuda", **kw)
            for _ in range(5):
                a, b = next(cpu), next(dev)
                assert set(b) == set(a) and "tokens" not in a
                for k in a:
                    if isinstance(a[k], np.ndarray):
                        assert np.array_equal(host_copy(b[k]), a[k]), k
                    else:
                        assert b[k] == a[k], k
            dev.close()
        print("ok")
    """, tmp_path, env={"TOKENFEED_CUDART": cuda_double})


def test_torch_adapters_take_the_same_share(ds):
    torch = pytest.importorskip("torch")
    from tokenfeed.torch import ResumableSampler, TokenBatches, TokenDataset

    from test_mesh import FakeMesh

    full = TokenDataset(ds, seq_len=32, seed=3, position_ids=True)
    half = TokenDataset(ds, seq_len=32, seed=3, position_ids=True, cp_rank=1, cp_size=2)
    for p in (0, 5, 77):
        a, b = full[p], half[p]
        for k in ("input_ids", "labels", "position_ids"):
            assert torch.equal(b[k], torch.from_numpy(ref.megatron_cp_split(a[k].numpy()[None], 2, 1)[0])), k
    with pytest.raises(ValueError, match="THD layout"):
        TokenDataset(ds, seq_len=32, cu_seqlens=True, cp_rank=0, cp_size=2)
    # the sampler's positions come from the mesh's data-parallel dims; tp and cp replicate
    s = ResumableSampler(batch_size=2, device_mesh=FakeMesh((2, 2, 2), ("dp", "cp", "tp"), (1, 0, 1)))
    assert (s.rank, s.world_size) == (1, 2)
    it = iter(s)
    assert [next(it) for _ in range(4)] == [2, 3, 6, 7]
    # TokenBatches: the Loader's batches for this DP and CP rank
    tb = TokenBatches(ds, seq_len=32, batch_size=2, device_mesh=FakeMesh((2, 2), ("dp", "cp"), (1, 1)),
                      output="numpy", seed=3)
    want = tokenfeed.Loader(ds, seq_len=32, batch_size=2, dp_rank=1, dp_size=2, cp_rank=1, cp_size=2,
                            output="numpy", seed=3)
    got = iter(tb)
    for _ in range(3):
        a, b = next(got), next(want)
        assert np.array_equal(a["input_ids"], b["input_ids"]) and np.array_equal(a["labels"], b["labels"])
