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


def test_order_megatron_is_the_alias(tmp_path):
    """order="megatron" with megatron_cache= is Megatron's order; megatron_cache= alone means it:
    both give GPTDataset's samples, bit for bit, and a state of one resumes the other."""
    prefix, (train, valid, _) = build(tmp_path, 21)
    for split, ds in (("train", train), ("valid", valid)):
        named = loader(prefix, tmp_path, split, epochs=1, order="megatron")
        assert named._order.settings()["order"] == "megatron"
        assert_same_as_gptdataset(named, ds)
    a = loader(prefix, tmp_path, batch_size=4, order="megatron")
    b = loader(prefix, tmp_path, batch_size=4)
    for _ in range(3):
        assert np.array_equal(next(a)["input_ids"], next(b)["input_ids"])
    st = a.state_dict()
    assert st["config"]["order"] == "megatron" and st["config"]["megatron_split"] == "train"
    assert st["config"]["megatron_cache"] is None  # where the cache is: its fingerprint says what it is
    c = loader(prefix, tmp_path, batch_size=4)
    c.load_state_dict(st)
    assert np.array_equal(next(c)["input_ids"], next(a)["input_ids"])
    with pytest.raises(ValueError, match="pass megatron_cache"):
        tokenfeed.Loader(prefix + ".bin", seq_len=L, batch_size=1, order="megatron")
    with pytest.raises(ValueError, match="does not combine with order='olmo'"):
        tokenfeed.Loader(prefix + ".bin", seq_len=L, batch_size=1, order="olmo", megatron_cache=tmp_path / "cache")


def test_token_dataset_reads_megatrons_shuffle_as_the_loader_does(tmp_path):
    """TokenDataset(order="megatron") takes its default shuffle as the cache's own, as Loader
    does (one rule, in the order's configuration): its samples are the Loader's, in order; a
    block shuffle cannot apply to an order read from a cache, from either."""
    from tokenfeed.torch import TokenDataset

    small_cache(tmp_path)
    want = np.concatenate([b["input_ids"] for b in small_loader(tmp_path, epochs=1)])
    td = TokenDataset(str(tmp_path / "d"), seq_len=SL, order="megatron", megatron_cache=str(tmp_path / "cache"),
                      epochs=1)
    got = np.stack([np.asarray(td[i]["input_ids"]) for i in range(len(td))])
    assert len(want) > 0 and np.array_equal(got[:len(want)], want)  # the Loader drops a last partial batch
    for make in (lambda: small_loader(tmp_path, shuffle="block"),
                 lambda: TokenDataset(str(tmp_path / "d"), seq_len=SL, shuffle="block",
                                      megatron_cache=str(tmp_path / "cache"))):
        with pytest.raises(ValueError, match="shuffle='block' cannot apply"):
            make()


# A small GPTDataset-style cache over a tokenfeed dataset (no megatron-core): documents of
# SIZES tokens, one epoch in order, samples of SL tokens plus the extra token, unshuffled.
SIZES = [i % 7 + 3 for i in range(50)]
SL = 8


def small_cache(tmp_path, split="train", dtype=np.int32):
    if not (tmp_path / "d").exists():
        with tokenfeed.DatasetWriter(tmp_path / "d", vocab_size=100) as w:
            for n in SIZES:
                w.add_document(np.arange(n) % 90)
    starts = np.concatenate([[0], np.cumsum(SIZES)])
    n = (int(starts[-1]) - 1) // SL
    rows = [(d, t - int(starts[d])) for t in range(0, (n + 1) * SL, SL)
            for d in [min(int(np.searchsorted(starts, t, side="right")) - 1, len(SIZES) - 1)]]
    cache = tmp_path / "cache"
    cache.mkdir(exist_ok=True)
    base = str(cache / f"0123abcd-GPTDataset-{split}-")
    np.save(base + "document_index.npy", np.arange(len(SIZES), dtype=dtype))
    np.save(base + "sample_index.npy", np.array(rows, dtype=dtype))
    np.save(base + "shuffle_index.npy", np.arange(n, dtype=np.uint32 if dtype == np.int32 else dtype))
    with open(base + "description.txt", "w") as f:
        json.dump({"class": "GPTDataset", "sequence_length": SL, "split": split}, f)
    return base


def small_loader(tmp_path, cache=None, **kw):
    return tokenfeed.Loader(tmp_path / "d", seq_len=SL, batch_size=2, output="numpy",
                            megatron_cache=tmp_path / "cache" if cache is None else cache, **kw)


# The state an older tokenfeed wrote for small_cache (Loader(megatron_cache=...) at position
# 4): Megatron's order was then built by a constructor of its own, its config saying
# tokenfeed's order and the cache's fingerprint under "order".
OLDER_STATE = (
    '{"format_version": 2, "dataset_fingerprint": "b21d10e2ead7d0bc", "config_fingerprint": "a9b0d140a2d65e62", '
    '"position": 4, "samples_per_epoch": 37, "world_size": 1, "config": {"seq_len": 8, "packing": "concat", '
    '"separator_id": null, "seed": 0, "shuffle": "none", "block_size": null, "window_blocks": null, "global_batch": 2, '
    '"epochs": null, "pad_id": null, "pack_window": null, "mix_window": null, "order": null, "llmc_processes": null, '
    '"olmo_chunk": null, "weights": null, "schedule_steps": null, "interpolation": null}, "mix_anchor": null, '
    '"skipped": null, "excluded": null, "weights_history": null, "weights_initial": null, '
    '"order": ["megatron", "03a60a1369b40c7a"]}')


def test_state_of_the_older_constructor_resumes(tmp_path):
    small_cache(tmp_path)
    ld, ref = small_loader(tmp_path), small_loader(tmp_path)
    next(ref), next(ref)
    ld.load_state_dict(json.loads(OLDER_STATE))
    assert ld.position == 4 and np.array_equal(next(ld)["input_ids"], next(ref)["input_ids"])
    # and it is still refused by another cache
    other = tmp_path / "other"
    other.mkdir()
    small_cache(other)
    np.save(str(other / "cache" / "0123abcd-GPTDataset-train-shuffle_index.npy"),
            np.arange(37, dtype=np.uint32)[::-1].copy())
    with pytest.raises(tokenfeed.StateError, match="the Megatron index cache: saved 03a60a1369b40c7a"):
        small_loader(tmp_path, other / "cache").load_state_dict(json.loads(OLDER_STATE))


def _npy(path, descr, shape, fortran=False, data=b""):
    """A .npy file with this header (numpy's layout) and these bytes after it."""
    d = f"{{'descr': '{descr}', 'fortran_order': {fortran}, 'shape': {shape}, }}"
    hl = (len(d) + 1 + 10 + 63) // 64 * 64 - 10
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + hl.to_bytes(2, "little") + d.ljust(hl - 1).encode() + b"\n" + data)


ATTACKS = {
    # what is planted in place of one of the cache's files, and what the refusal says
    "truncated": ("sample_index", lambda p, a: open(p, "r+b").truncate(os.path.getsize(p) - 4), "file size"),
    "float": ("document_index", lambda p, a: np.save(p, a.astype(np.float32)), "descr"),
    "big_endian": ("shuffle_index", lambda p, a: np.save(p, a.astype(">u4")), "descr"),
    "three_columns": ("sample_index", lambda p, a: np.save(p, np.zeros((a.shape[0], 3), np.int32)), "shape"),
    "flat_sample_index": ("sample_index", lambda p, a: np.save(p, a.ravel()), "shape"),
    "2d_document_index": ("document_index", lambda p, a: np.save(p, a.reshape(-1, 2)), "shape"),
    "fortran": ("sample_index", lambda p, a: _npy(p, "<i4", a.shape, True, a.T.tobytes()), "fortran_order"),
    "huge_shape": ("shuffle_index", lambda p, a: _npy(p, "<u4", (2**62,), data=a.tobytes()), "file size"),
    "overflowing_shape": ("sample_index", lambda p, a: _npy(p, "<i4", (2**63, 2), data=a.tobytes()), "file size"),
    "empty": ("document_index", lambda p, a: open(p, "wb").close(), "truncated"),
    "not_npy": ("shuffle_index", lambda p, a: open(p, "wb").write(b"x" * 200), "magic"),
    "missing": ("shuffle_index", lambda p, a: os.unlink(p), "cannot open"),
    "directory": ("document_index", lambda p, a: (os.unlink(p), os.mkdir(p)), "regular file"),
    "fifo": ("sample_index", lambda p, a: (os.unlink(p), os.mkfifo(p)), "regular file"),
    "negative_document": ("document_index", lambda p, a: np.save(p, np.where(a == 3, -1, a)), "document_index[3]"),
    "document_past_the_data": ("document_index", lambda p, a: np.save(p, np.where(a == a.max(), 50, a)),
                               "the dataset has 50 documents"),
    "row_past_the_end": ("sample_index", lambda p, a: np.save(p, np.where(a == a.max(), 2**31 - 1, a)), "sample"),
    "shuffle_past_the_end": ("shuffle_index", lambda p, a: np.save(p, a[::-1] + 1), "shuffle_index[0]"),
    "shuffle_shorter": ("shuffle_index", lambda p, a: np.save(p, a[:-1]), "shuffle_index has"),
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_hostile_cache_file_is_refused_naming_it(tmp_path, attack):
    """Each of the cache's files is bytes from disk: a file replaced by a truncated, mistyped,
    misshapen, hostile-sized or out-of-range one, by a directory or a FIFO (which must not
    block), or removed, is refused when the loader is made, never read as other samples."""
    base = small_cache(tmp_path)
    small_loader(tmp_path).close()  # the cache as written is read
    name, plant, says = ATTACKS[attack]
    path = base + name + ".npy"
    arr = np.load(path)
    plant(path, arr)
    with pytest.raises((ValueError, OSError, tokenfeed.FormatError)) as e:
        small_loader(tmp_path)
    assert says in str(e.value)
    assert name in str(e.value) or "Megatron index cache" in str(e.value)


def test_hostile_description_and_lookup(tmp_path):
    base = small_cache(tmp_path)
    desc = base + "description.txt"
    with open(desc, "w") as f:  # not JSON
        f.write("{sequence_length: 8")
    with pytest.raises(tokenfeed.FormatError, match="description.txt: expected GPTDataset's description"):
        small_loader(tmp_path)
    with open(desc, "w") as f:  # another dataset class
        json.dump({"class": "MockGPTDataset", "sequence_length": SL}, f)
    with pytest.raises(ValueError, match="a MockGPTDataset cache"):
        small_loader(tmp_path)
    with open(desc, "w") as f:  # far too large to be a description: not read
        f.write(" " * (2 << 20))
    with pytest.raises(tokenfeed.FormatError, match="description.txt: size"):
        small_loader(tmp_path)
    with open(desc, "w") as f:  # a hostile sequence_length
        json.dump({"sequence_length": -1}, f)
    with pytest.raises(ValueError, match="sequence_length -1"):
        small_loader(tmp_path)
    os.unlink(desc)  # a cache without its description is read (its samples are checked)
    small_loader(tmp_path).close()
    # a directory without a cache, a file that is none, and a split that is not there
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no GPTDataset index cache of split 'train'.*path_to_cache"):
        small_loader(tmp_path, tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="not a GPTDataset index cache"):
        small_loader(tmp_path, sorted((tmp_path / "d").iterdir())[0])
    with pytest.raises(FileNotFoundError, match="it holds the splits train"):
        small_loader(tmp_path, megatron_split="test")
    # any file of the cache, or their common start, names it
    for p in (base + "sample_index.npy", base, base + "description.txt"):
        small_loader(tmp_path, p).close()


def test_cache_renamed_under_a_loader_and_moved(tmp_path):
    """The order maps the cache's files when it is made: renaming or rewriting them afterwards
    changes nothing it gives; a cache moved elsewhere resumes a state (the path is not in it)."""
    base = small_cache(tmp_path)
    ld = small_loader(tmp_path, epochs=1)
    want = [b["input_ids"] for b in small_loader(tmp_path, epochs=1)]
    for name in ("document_index", "sample_index", "shuffle_index"):
        os.rename(base + name + ".npy", base + name + ".old")
    small_cache(tmp_path / "sub")  # another cache written where the first was
    os.replace(str(tmp_path / "sub" / "cache" / "0123abcd-GPTDataset-train-shuffle_index.npy"),
               base + "shuffle_index.npy")
    got = [b["input_ids"] for b in ld]
    assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want))
    moved = tmp_path / "moved"
    os.rename(tmp_path / "cache", moved)
    for name in ("document_index", "sample_index", "shuffle_index"):
        os.replace(str(moved / f"0123abcd-GPTDataset-train-{name}.old"), str(moved / f"0123abcd-GPTDataset-train-{name}.npy"))
    a = small_loader(tmp_path, moved)
    next(a)
    st = a.state_dict()
    b = small_loader(tmp_path, moved / "0123abcd-GPTDataset-train-document_index.npy")
    b.load_state_dict(st)
    assert np.array_equal(next(b)["input_ids"], next(a)["input_ids"])
