"""order="olmo": OLMo-core's own NumpyFSLDataset instances in its NumpyFSLDataLoader's order.

Driven by the real OLMo-core components on CPU: for several seeds, with and without
shuffling, on one and on two data-parallel ranks, two epochs of TokenfeedDataLoader(order=
"olmo") give the batches OLMo's loader gives (input ids, OLMo's dataset index, the labels
OLMo's train module derives, document lengths); a stop mid-epoch resumes exactly, from
tokenfeed's state and from OLMo's own (and OLMo's loader continues from tokenfeed's)."""
import os

import numpy as np
import pytest
import torch
from olmo_core.data.collator import DataCollator
from olmo_core.data.data_loader import NumpyFSLDataLoader
from olmo_core.data.numpy_dataset import NumpyFSLDataset
from olmo_core.data.utils import get_labels

import tokenfeed
from tokenfeed.integrations.olmo_core import TokenfeedDataLoader

SEQ = 16
EOS = 0


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """OLMo token files (uint32, eos after each document) whose lengths are not multiples of
    SEQ, one shorter than an instance: each file's tail is dropped on its own."""
    d = tmp_path_factory.mktemp("olmo")
    rng = np.random.default_rng(5)
    out = []
    for f, ndocs in enumerate((40, 3, 0, 25, 60)):
        docs = [np.append(rng.integers(1, 250, size=int(rng.integers(2, 40))), EOS) for _ in range(ndocs)]
        toks = np.concatenate(docs) if docs else np.array([7, 8, EOS])  # 3 tokens: no instance
        p = d / f"part-{f:02d}.npy"
        toks.astype(np.uint32).tofile(p)
        out.append(str(p))
    return out


def olmo_dataset(files, tmp_path, doc_lens=True):
    ds = NumpyFSLDataset(*files, sequence_length=SEQ, pad_token_id=1, eos_token_id=EOS, vocab_size=256,
                         dtype=np.uint32, generate_doc_lengths=doc_lens)
    ds.work_dir = tmp_path / "olmo_work"
    return ds


def olmo_loader(ds, tmp_path, seed, shuffle=True, R=1, r=0, rows=6):
    return NumpyFSLDataLoader(ds, collator=DataCollator(pad_token_id=1), global_batch_size=rows * SEQ,
                              work_dir=tmp_path / "olmo_work", seed=seed, shuffle=shuffle, dp_world_size=R,
                              dp_rank=r, fs_local_rank=0, num_threads=0)


def ours(files_or_ds, tmp_path, seed, shuffle=True, R=1, r=0, rows=6):
    return TokenfeedDataLoader.from_olmo_dataset(files_or_ds, global_batch_size=rows * SEQ, work_dir=tmp_path,
                                                 seed=seed, shuffle=shuffle, dp_world_size=R, dp_rank=r,
                                                 fs_local_rank=0, document_masking=True)


def run(dl, epoch, n=None):
    """Batches of one epoch (from where the loader stands), as plain arrays."""
    dl.reshuffle(epoch)
    out = []
    for b in dl:
        out.append(b)
        if n is not None and len(out) == n:
            return out
    dl.reset()
    return out


def same(a, b):
    """Batch a (OLMo's) equals batch b (tokenfeed's), labels as OLMo's train module makes them."""
    assert torch.equal(a["input_ids"], b["input_ids"])
    assert torch.equal(a["index"].to(torch.int64), b["index"])
    assert torch.equal(get_labels(a), b["labels"])
    if "doc_lens" in a:
        assert torch.equal(a["doc_lens"].to(torch.int32), b["doc_lens"])
        assert list(a["max_doc_lens"]) == list(b["max_doc_lens"])


@pytest.mark.parametrize("seed", [0, 7, 1234])
@pytest.mark.parametrize("shuffle", [True, False])
def test_two_epochs_identical_to_olmo(files, tmp_path, seed, shuffle):
    ds = olmo_dataset(files, tmp_path)
    theirs, mine = olmo_loader(ds, tmp_path, seed, shuffle), ours(ds, tmp_path, seed, shuffle)
    assert mine.total_batches == theirs.total_batches == len(ds) // 6
    assert len(ds) % 6  # the end of every epoch is dropped
    for epoch in (1, 2):
        a, b = run(theirs, epoch), run(mine, epoch)
        assert len(a) == len(b) == theirs.total_batches
        for x, y in zip(a, b):
            same(x, y)
    # instance k is tokens [k*SEQ, (k+1)*SEQ) of its own file
    inst = mine._loader._order.fill(int(a[0]["index"][0]))["tokens"]
    assert np.array_equal(inst[:SEQ], a[0]["input_ids"][0].numpy()) and inst[SEQ] == 1  # then the pad


@pytest.mark.parametrize("seed", [0, 9])
def test_max_target_sequence_length(files, tmp_path, seed):
    """A dataset built for a sequence-length warm-up (max_target_sequence_length = 3 x SEQ):
    each file cut in runs of 3 instances, OLMo's loader shuffling the runs (its chunk_size)."""
    ds = NumpyFSLDataset(*files, sequence_length=SEQ, pad_token_id=1, eos_token_id=EOS, vocab_size=256,
                         dtype=np.uint32, max_target_sequence_length=3 * SEQ)
    ds.work_dir = tmp_path / "olmo_work"
    theirs = NumpyFSLDataLoader.wrap_numpy_dataset(ds, global_batch_size=4 * SEQ, collator=DataCollator(pad_token_id=1),
                                                   work_dir=tmp_path / "olmo_work", seed=seed, num_threads=0,
                                                   fs_local_rank=0)
    assert theirs.chunk_size == 3
    mine = TokenfeedDataLoader.from_olmo_dataset(ds, global_batch_size=4 * SEQ, work_dir=tmp_path, seed=seed)
    for epoch in (1, 2):
        a, b = run(theirs, epoch), run(mine, epoch)
        assert len(a) == len(b) == theirs.total_batches
        for x, y in zip(a, b):
            same(x, y)
    k = 2
    run(theirs, 1, k)
    cont = TokenfeedDataLoader.from_olmo_dataset(ds, global_batch_size=4 * SEQ, work_dir=tmp_path, seed=seed)
    cont.load_state_dict(theirs.state_dict())
    for x, y in zip(run(olmo_loader_like(theirs, ds, tmp_path, seed), 1)[k:], run(cont, 1)):
        same(x, y)
    with pytest.raises(ValueError, match="max_target_sequence_length"):
        ours(olmo_dataset(files, tmp_path), tmp_path, seed).load_state_dict(theirs.state_dict())


def olmo_loader_like(dl, ds, tmp_path, seed):
    return NumpyFSLDataLoader.wrap_numpy_dataset(ds, global_batch_size=dl.global_batch_size,
                                                 collator=DataCollator(pad_token_id=1), work_dir=tmp_path / "olmo_work",
                                                 seed=seed, num_threads=0, fs_local_rank=0)


@pytest.mark.parametrize("seed", [3, 11])
def test_ranks_identical_to_olmo(files, tmp_path, seed):
    ds = olmo_dataset(files, tmp_path)
    for r in range(2):
        theirs, mine = olmo_loader(ds, tmp_path, seed, R=2, r=r), ours(ds, tmp_path, seed, R=2, r=r)
        for epoch in (1, 2):
            a, b = run(theirs, epoch), run(mine, epoch)
            assert len(a) == len(b)
            for x, y in zip(a, b):
                assert x["input_ids"].shape == (3, SEQ)
                same(x, y)


def test_resume_mid_epoch(files, tmp_path):
    ds = olmo_dataset(files, tmp_path)
    full = run(olmo_loader(ds, tmp_path, 5), 2)
    k = 4
    # tokenfeed's own state, into a fresh loader
    first = ours(ds, tmp_path, 5)
    assert len(run(first, 2, k)) == k
    st = first.state_dict()
    assert st["batches_processed"] == k and st["epoch"] == 2 and st["dataset_type"] == "fsl"
    again = ours(ds, tmp_path, 5)
    again.load_state_dict(st)
    rest = run(again, 2)
    assert len(rest) == len(full) - k
    for x, y in zip(full[k:], rest):
        same(x, y)
    # a run begun on OLMo's loader continues on tokenfeed, under the state's seed
    theirs = olmo_loader(ds, tmp_path, 5)
    run(theirs, 2, k)
    cont = ours(ds, tmp_path, 999)
    cont.load_state_dict(theirs.state_dict())
    assert cont.seed == 5
    for x, y in zip(full[k:], run(cont, 2)):
        same(x, y)
    # and back: OLMo's loader continues from tokenfeed's state
    back = olmo_loader(ds, tmp_path, 5)
    back.load_state_dict(st)
    for x, y in zip(run(back, 2), rest):
        same(x, y)


def test_refusals(files, tmp_path):
    ds = olmo_dataset(files, tmp_path)
    other = NumpyFSLDataset(*files[:2], sequence_length=SEQ, pad_token_id=1, eos_token_id=EOS, vocab_size=256,
                            dtype=np.uint32)
    theirs = olmo_loader(other, tmp_path, 5, rows=2)
    run(theirs, 1, 1)
    with pytest.raises(ValueError, match="another dataset"):
        ours(ds, tmp_path, 5).load_state_dict(theirs.state_dict())
    plain = TokenfeedDataLoader(tokenfeed.open(files, dtype="uint32"), sequence_length=SEQ,
                                global_batch_size=6 * SEQ, work_dir=tmp_path)
    with pytest.raises(ValueError, match="order='olmo'"):
        plain.load_state_dict(theirs.state_dict())
    with pytest.raises(ValueError, match="packing"):
        TokenfeedDataLoader(tokenfeed.open(files, dtype="uint32"), sequence_length=SEQ, global_batch_size=6 * SEQ,
                            work_dir=tmp_path, order="olmo", packing="best_fit")


def test_loader_order_olmo(files):
    """The plain Loader: OLMo's instances with a pad, the loss mask off on its label, the epoch cut to
    whole global batches, and the state names the order."""
    ds = tokenfeed.open(files, dtype="uint32", eos_id=EOS)
    sizes = [os.path.getsize(f) // 4 for f in files]
    n = sum(s // SEQ for s in sizes)
    ld = tokenfeed.Loader(ds, seq_len=SEQ, batch_size=4, order="olmo", seed=2, shuffle=False, loss_mask=True,
                          output="numpy", epochs=1)
    assert ld.num_samples == n and ld.epoch_positions == n // 4 * 4 and len(ld) == n // 4
    b = next(ld)
    assert (b["loss_mask"][:, -1] == 0).all() and (b["tokens"][:, -1] == 0).all()
    st = ld._order.packing_stats()
    assert st["samples"] == n and st["pad_tokens"] == n and st["tokens_dropped"] == sum(sizes) - n * SEQ
    tokens = np.fromfile(files[0], dtype=np.uint32)
    assert np.array_equal(b["input_ids"], tokens[:4 * SEQ].reshape(4, SEQ))
    state = ld.state_dict()
    assert state["config"]["order"] == "olmo"
    with pytest.raises(tokenfeed.StateError, match="order"):
        tokenfeed.Loader(ds, seq_len=SEQ, batch_size=4, seed=2, shuffle=False, epochs=1).load_state_dict(state)
    with pytest.raises(ValueError, match="block"):
        tokenfeed.Loader(ds, seq_len=SEQ, batch_size=4, order="olmo", shuffle="block")
