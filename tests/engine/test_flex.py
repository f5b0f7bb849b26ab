"""FlexAttention document masks (tokenfeed.flex): per-token document ids from cu_seqlens, and a
BlockMask built from the document boundaries that equals the one create_block_mask evaluates
from the dense mask, checked on the CPU against a dense reference."""
from __future__ import annotations

import numpy as np
import pytest

import tokenfeed
from tokenfeed import flex

torch = pytest.importorskip("torch")
fa = pytest.importorskip("torch.nn.attention.flex_attention")


def random_cu(rng, rows, L, max_docs=8):
    cu = np.full((rows, L + 1), L, np.int32)
    for b in range(rows):
        cuts = np.sort(rng.choice(np.arange(1, L), size=int(rng.integers(0, max_docs)), replace=False))
        e = np.concatenate([[0], cuts, [L]])
        cu[b, : len(e)] = e
    return cu


def reference_ids(cu):
    L = cu.shape[1] - 1
    return np.stack([np.searchsorted(row[1:], np.arange(L), side="right") for row in cu]).astype(np.int32)


def test_document_ids_numpy_and_torch():
    cu = random_cu(np.random.default_rng(1), 5, 300)
    want = reference_ids(cu)
    assert np.array_equal(flex.document_ids(cu), want)
    assert np.array_equal(flex.document_ids(cu[2]), want[2])
    got = flex.document_ids(torch.from_numpy(cu))
    assert got.dtype == torch.int32 and np.array_equal(got.numpy(), want)


@pytest.mark.parametrize("causal", [True, False])
def test_block_mask_equals_create_block_mask(causal):
    rng = np.random.default_rng(2)
    L, bs = 512, 128
    cu = random_cu(rng, 4, L)
    cu[3, :5] = [0, 130, 131, 300, L]  # tiny documents and boundaries inside blocks
    cu[0, :] = L  # one document
    cu[0, 0] = 0
    ids = torch.from_numpy(flex.document_ids(cu))
    bm = flex.block_mask(cu, causal=causal, block_size=bs)
    ref = fa.create_block_mask(flex.mask_mod(ids, causal), 4, None, L, L, device="cpu", BLOCK_SIZE=bs)
    assert torch.equal(bm.to_dense(), ref.to_dense())
    assert torch.equal(bm.kv_num_blocks, ref.kv_num_blocks)
    assert torch.equal(bm.full_kv_num_blocks, ref.full_kv_num_blocks)
    # the element mask against a dense reference
    dense = ids[:, :, None] == ids[:, None, :]
    if causal:
        dense &= torch.ones(L, L, dtype=torch.bool).tril()
    mm = bm.mask_mod
    b, q, k = torch.meshgrid(torch.arange(4), torch.arange(L), torch.arange(L), indexing="ij")
    assert torch.equal(mm(b, None, q, k), dense)


def test_flex_attention_with_the_block_mask_matches_dense_attention():
    rng = np.random.default_rng(3)
    L = 256
    cu = random_cu(rng, 2, L)
    ids = torch.from_numpy(flex.document_ids(cu))
    q, k, v = (torch.randn(2, 2, L, 16) for _ in range(3))
    out = fa.flex_attention(q, k, v, block_mask=flex.block_mask(cu))
    dense = (ids[:, :, None] == ids[:, None, :]) & torch.ones(L, L, dtype=torch.bool).tril()
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=dense[:, None])
    assert torch.allclose(out, want, atol=1e-5)


def test_block_mask_refuses_a_seq_len_off_the_block_grid():
    with pytest.raises(ValueError, match="multiple of block_size"):
        flex.block_mask(random_cu(np.random.default_rng(0), 1, 200))


def test_loader_document_ids(make_dataset):
    ds = make_dataset(n_docs=200, vocab=1000, mean_len=40)
    kw = dict(seq_len=64, batch_size=4, packing="best_fit", output="numpy")
    a = tokenfeed.Loader(ds, document_ids=True, **kw)
    b = tokenfeed.Loader(ds, cu_seqlens=True, **kw)
    for _ in range(3):
        x, y = next(a), next(b)
        assert "cu_seqlens" not in x and "num_seqs" not in x
        assert np.array_equal(x["document_ids"], reference_ids(y["cu_seqlens"]))
        assert np.array_equal(x["tokens"], y["tokens"])
    t = next(tokenfeed.Loader(ds, document_ids=True, cu_seqlens=True, **{**kw, "output": "torch"}))
    assert t["document_ids"].dtype == torch.int32 and "cu_seqlens" in t
    with pytest.raises(ValueError, match="context parallelism"):
        tokenfeed.Loader(ds, document_ids=True, cp_rank=0, cp_size=2, **kw)
