"""Megatron's order (Loader(megatron_cache=...)) against megatron-core's own GPTDataset.

megatron-core's BlendedMegatronDatasetBuilder builds GPTDataset's train, valid and test
datasets from a .bin/.idx pair (written by its IndexedDatasetBuilder) and writes their
document, sample and shuffle indices into path_to_cache; tokenfeed then reads that cache
and must give GPTDataset[i] at position i: its tokens, labels, position ids and loss mask
(reset_position_ids and eod_mask_loss on data whose documents end with EOD: tokenfeed's
document boundaries are the EODs). Megatron's sampler is written out in
test_megatron.megatron_batches."""
from __future__ import annotations

import json
import os
import pickle

import numpy as np
import pytest
import torch
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
from megatron.core.datasets.utils import get_blend_from_list
from megatron.core.tokenizers.text.libraries.null_tokenizer import NullTokenizer

import tokenfeed
from test_megatron import VOCAB, megatron_batches, write_megatron
from tokenfeed.integrations.megatron import continue_from_cache, datasets_provider, megatron_pad_id

L = 32
SPLITS = ("train", "valid", "test")


def build(tmp_path, seed, samples=(700, 60, 30), data_seed=0, n_docs=240, **kw):
    """GPTDataset's (train, valid, test) over a fresh .bin/.idx, with their indices cached in tmp_path/cache."""
    prefix = str(tmp_path / "data")
    if not os.path.exists(prefix + ".bin"):
        write_megatron(prefix, data_seed, n_docs)
    for k, v in dict(tokenizer=NullTokenizer(VOCAB), reset_position_ids=True, reset_attention_mask=False,
                     eod_mask_loss=True, create_attention_mask=False).items():
        kw.setdefault(k, v)
    cfg = GPTDatasetConfig(random_seed=seed, sequence_length=L, blend=get_blend_from_list([prefix]), split="90,6,4",
                           path_to_cache=str(tmp_path / "cache"), **kw)
    datasets = BlendedMegatronDatasetBuilder(GPTDataset, list(samples), lambda: True, cfg).build()
    assert all(type(d) is GPTDataset for d in datasets)
    return prefix, datasets


def loader(prefix, tmp_path, split="train", **kw):
    kw.setdefault("batch_size", 1)
    return tokenfeed.Loader(prefix + ".bin", seq_len=L, megatron_cache=str(tmp_path / "cache"), megatron_split=split,
                            position_ids=True, loss_mask=True, output="numpy", **kw)


def assert_same_as_gptdataset(ld, ds):
    """Every sample of ld (epochs=1: as many as ds holds) is ds's, item by item."""
    assert ld.num_samples == len(ds) and len(ld) * ld.batch_size == len(ds)
    i = 0
    for b in ld:
        for r in range(ld.batch_size):
            want = ds[i]
            for ours, theirs in (("input_ids", "tokens"), ("labels", "labels"), ("position_ids", "position_ids"),
                                 ("loss_mask", "loss_mask")):
                got = b[ours][r].astype(np.int64)
                assert np.array_equal(got, want[theirs].numpy().astype(np.int64)), (i, ours)
            i += 1
    assert i == len(ds)


@pytest.mark.parametrize("seed", [1, 1234, 99991])
def test_every_sample_as_gptdataset(tmp_path, seed):
    # train asks for more than an epoch (GPTDataset then shuffles several epochs of
    # documents, its last one apart when short), valid and test less than one
    prefix, datasets = build(tmp_path, seed)
    assert len(datasets[0]) > 700
    for split, ds in zip(SPLITS, datasets):
        assert_same_as_gptdataset(loader(prefix, tmp_path, split, epochs=1), ds)


@pytest.mark.parametrize("kw", [{"add_extra_token_to_sequence": False},
                                {"drop_last_partial_validation_sequence": False}], ids=["no_extra_token", "partial"])
def test_gptdataset_options(tmp_path, kw):
    # without the extra token Megatron's last label is its pad (returned as 0, not
    # trained); a partial last validation sample (241 documents leave one) is padded
    # the same way
    prefix, datasets = build(tmp_path, 7, n_docs=241, **kw)
    extra = kw.get("add_extra_token_to_sequence", True)
    for split, ds in zip(SPLITS, datasets):
        assert_same_as_gptdataset(loader(prefix, tmp_path, split, epochs=1, megatron_add_extra_token=extra), ds)
    pads = [loader(prefix, tmp_path, s, megatron_add_extra_token=extra).packing_stats()["pad_tokens"] for s in SPLITS]
    if not extra:
        assert pads == [len(ds) for ds in datasets]
    else:
        assert pads[0] == pads[2] == 0 and 0 < pads[1] < L


def test_megatron_sampler_ranks_and_resume(tmp_path):
    """Rank r of 2 with Megatron's micro-batch gets what Megatron's sampler gives rank r,
    from any consumed_train_samples; a state resumes exactly, with another dp size too."""
    prefix, (train, _, _) = build(tmp_path, 3)
    mbs, dp, steps = 2, 2, 12
    lds = [loader(prefix, tmp_path, dp_rank=r, dp_size=dp, batch_size=mbs) for r in range(dp)]
    for r in range(dp):
        for k, mb in enumerate(megatron_batches(train, mbs, dp, r, 0, steps)):
            assert lds[r].position == k * mbs * dp
            assert np.array_equal(next(lds[r])["input_ids"], mb["tokens"].numpy())
    state = lds[0].state_dict()
    assert state["position"] == steps * mbs * dp and state["order"][0] == "megatron"
    state = json.loads(json.dumps(state))  # as a checkpoint keeps it
    consumed = state["position"]
    rest = [[next(ld)["input_ids"] for _ in range(5)] for ld in lds]
    for r in range(dp):  # a fresh loader from the state, and Megatron from consumed_train_samples
        again = loader(prefix, tmp_path, dp_rank=r, dp_size=dp, batch_size=mbs)
        again.load_state_dict(state)
        mb = megatron_batches(train, mbs, dp, r, consumed, 5)
        for k in range(5):
            b = next(again)["input_ids"]
            assert np.array_equal(b, rest[r][k]) and np.array_equal(b, mb[k]["tokens"].numpy())
    one = loader(prefix, tmp_path, batch_size=mbs * dp)  # elastic: one rank takes the global batch
    one.load_state_dict(state)
    for k in range(5):
        assert np.array_equal(next(one)["input_ids"], np.concatenate([rest[0][k], rest[1][k]]))
    moved = pickle.loads(pickle.dumps(lds[1]))  # a spawned worker rebuilds the order from the cache
    assert np.array_equal(next(moved)["input_ids"], next(lds[1])["input_ids"])


def test_cache_of_other_data_is_refused(tmp_path):
    prefix, (train, _, _) = build(tmp_path, 5)
    cache = str(tmp_path / "cache")
    # fewer documents than the cache names
    write_megatron(str(tmp_path / "few"), 0, 100)
    with pytest.raises(tokenfeed.FormatError, match="document_index.*the dataset has 100 documents"):
        tokenfeed.Loader(str(tmp_path / "few.bin"), seq_len=L, batch_size=1, megatron_cache=cache)
    # as many documents, other lengths: samples no longer hold seq_len + 1 tokens
    write_megatron(str(tmp_path / "other"), 1, 240)
    with pytest.raises(tokenfeed.FormatError, match="Megatron index cache's sample"):
        tokenfeed.Loader(str(tmp_path / "other.bin"), seq_len=L, batch_size=1, megatron_cache=cache)
    # seq_len other than the cache's: from its description, or (without it) from the samples
    with pytest.raises(ValueError, match="sequence_length 32.*seq_len=16"):
        tokenfeed.Loader(prefix + ".bin", seq_len=16, batch_size=1, megatron_cache=cache)
    for p in os.listdir(cache):
        if p.endswith("description.txt"):
            os.unlink(os.path.join(cache, p))
    with pytest.raises(tokenfeed.FormatError, match="holds more than 17 tokens"):
        tokenfeed.Loader(prefix + ".bin", seq_len=16, batch_size=1, megatron_cache=cache)
    # a state saved on another split's cache, or without the cache, is refused
    st = loader(prefix, tmp_path, "valid").state_dict()
    with pytest.raises(tokenfeed.StateError, match="the Megatron index cache: saved"):
        loader(prefix, tmp_path, "train").load_state_dict(st)
    plain = tokenfeed.Loader(prefix + ".bin", seq_len=L, batch_size=1, shuffle=False)
    with pytest.raises(tokenfeed.StateError, match="order: saved megatron, now tokenfeed's own"):
        plain.load_state_dict(st)


def test_cache_directory_lookup(tmp_path):
    prefix, _ = build(tmp_path, 5)
    cache = tmp_path / "cache"
    with pytest.raises(FileNotFoundError, match="holds the splits test, train, valid"):
        tokenfeed.Loader(prefix + ".bin", seq_len=L, batch_size=1, megatron_cache=cache, megatron_split="nope")
    with pytest.raises(FileNotFoundError, match="not a GPTDataset index cache"):
        tokenfeed.Loader(prefix + ".bin", seq_len=L, batch_size=1, megatron_cache=tmp_path / "data.bin")
    # a second run's cache (another seed) beside the first: the directory is ambiguous,
    # one of its files is not
    build(tmp_path, 6)
    with pytest.raises(ValueError, match="(?s)holds 2 GPTDataset caches of split 'train'.*random_seed=6"):
        loader(prefix, tmp_path)
    desc = [p for p in cache.iterdir() if p.name.endswith("train-description.txt") and
            json.loads(p.read_text())["random_seed"] == 6]
    ld = tokenfeed.Loader(prefix + ".bin", seq_len=L, batch_size=1, megatron_cache=desc[0], output="numpy")
    assert ld.num_samples >= 700


def test_dcp_keeps_the_state(tmp_path):
    """torch.distributed.checkpoint saves the state (its order key included) and loads it
    into a freshly built loader, which continues where the saved one was."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    prefix, _ = build(tmp_path, 8)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        ld = loader(prefix, tmp_path, batch_size=4)
        for _ in range(3):
            next(ld)
        dcp.save({"loader": ld}, checkpoint_id=str(tmp_path / "ckpt"))
        want = [next(ld)["input_ids"] for _ in range(4)]
        fresh = loader(prefix, tmp_path, batch_size=4)
        dcp.load({"loader": fresh}, checkpoint_id=str(tmp_path / "ckpt"))
        assert fresh.position == 12 and fresh.state_dict()["order"] == ld.state_dict()["order"]
        assert all(np.array_equal(next(fresh)["input_ids"], w) for w in want)
    finally:
        dist.destroy_process_group()


def test_datasets_provider_from_the_cache(tmp_path):
    """datasets_provider(config, megatron_cache=True): Megatron's pretrain keeps its sampler
    and its --split, and every item is GPTDataset's, key by key, from a DataLoader with workers."""
    prefix, datasets = build(tmp_path, 9)
    cfg = datasets[0].config
    ours = datasets_provider(cfg, megatron_cache=True)([700, 60, 30])
    for mine, theirs in zip(ours, datasets):
        assert mine is not None and len(mine) == len(theirs)
    for i in list(range(0, len(datasets[0]), 37)) + [len(datasets[0]) - 1]:
        a, b = ours[0][i], datasets[0][i]
        assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a), i
    for k, mb in enumerate(megatron_batches(ours[1], 4, 2, 1, 8, 3, workers=2)):  # rank 1, from sample 8 on
        want = [datasets[1][8 + k * 8 + 4 + j]["tokens"] for j in range(4)]
        assert torch.equal(mb["tokens"], torch.stack(want))


class PadTokenizer(NullTokenizer):
    """megatron-core's NullTokenizer with a pad id (as a real tokenizer's ``pad``): ``pad`` is a
    token id the data also holds, as a tokenizer whose pad is an ordinary vocabulary entry."""

    def __init__(self, vocab_size, pad):
        super().__init__(vocab_size)
        self._pad = pad

    @property
    def pad(self):
        return self._pad


PAD = 7  # write_megatron's documents draw ids from 0..VOCAB-1: every few samples hold a 7


@pytest.mark.parametrize("pad", [None, PAD], ids=["no_pad", "pad_in_data"])
@pytest.mark.parametrize("extra", [True, False], ids=["extra_token", "no_extra_token"])
@pytest.mark.parametrize("eod_mask_loss", [True, False], ids=["eod_mask_loss", "no_eod_mask_loss"])
def test_datasets_provider_from_the_cache_every_key_and_option(tmp_path, extra, eod_mask_loss, pad):
    """Every item of every split is GPTDataset's, key by key, whatever the mask options: without the
    extra token the last label is Megatron's pad and its loss_mask 0 (eod_mask_loss or not), as is
    the padding of a last partial validation sample; a tokenizer's pad id in the data comes as 0,
    untrained."""
    tok = NullTokenizer(VOCAB) if pad is None else PadTokenizer(VOCAB, pad)
    prefix, datasets = build(tmp_path, 11, n_docs=241, add_extra_token_to_sequence=extra,
                             eod_mask_loss=eod_mask_loss, reset_position_ids=False,
                             drop_last_partial_validation_sequence=False, tokenizer=tok)
    if pad is not None:  # the data holds it, so the comparison below sees the rewrite
        assert datasets[0]._pad_token_id == pad
        assert sum(bool((datasets[0]._query_document_sample_shuffle_indices(i)[0] == pad).any())
                   for i in range(len(datasets[0]))) > 3
    ours = datasets_provider(datasets[0].config, megatron_cache=True)([700, 60, 30])
    for split, mine, theirs in zip(SPLITS, ours, datasets):
        assert mine is not None and len(mine) == len(theirs)
        for i in range(len(theirs)):
            a, b = mine[i], theirs[i]
            assert sorted(a) == sorted(b), (split, i)
            for k in b:
                assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), (split, i, k)


def test_continue_from_cache_with_the_tokenizers_pad_in_the_data(tmp_path):
    """continue_from_cache (and Loader(megatron_cache=, megatron_pad_id=)) gives GPTDataset's samples
    where the data holds the tokenizer's pad id: the token as 0 in the inputs and labels, loss_mask 0
    where the label was it; position ids and the rest as before."""
    prefix, datasets = build(tmp_path, 12, tokenizer=PadTokenizer(VOCAB, PAD))
    train = datasets[0]
    ld = continue_from_cache(train.config, micro_batch_size=4, position_ids=True, loss_mask=True, epochs=1,
                             output="numpy")
    assert_same_as_gptdataset(ld, train)
    for split, ds in zip(SPLITS, datasets):
        assert_same_as_gptdataset(loader(prefix, tmp_path, split, epochs=1, megatron_pad_id=PAD), ds)
    with pytest.raises(ValueError, match="goes with megatron_cache"):
        tokenfeed.Loader(prefix + ".bin", seq_len=L, batch_size=1, megatron_pad_id=PAD)


@pytest.mark.parametrize("pad,ambiguous,want", [(None, False, -1), (PAD, False, PAD), (VOCAB, False, -1),
                                                (VOCAB, True, VOCAB)],
                         ids=["no_pad", "pad", "pad_is_eod", "pad_is_eod_allowed"])
def test_megatron_pad_id_is_gptdatasets(tmp_path, pad, ambiguous, want):
    """megatron_pad_id(config) is the pad id GPTDataset itself settles on (None for its -1): the
    tokenizer's, unless it is another special token (here EOD) and ambiguous pads are not allowed."""
    tok = NullTokenizer(VOCAB) if pad is None else PadTokenizer(VOCAB, pad)
    _, (train, _, _) = build(tmp_path, 13, tokenizer=tok, allow_ambiguous_pad_tokens=ambiguous)
    assert train._pad_token_id == want
    assert megatron_pad_id(train.config) == (None if want < 0 else want)
