"""tokenfeed.integrations.megatron with megatron-core's own pieces: its GPTDatasetConfig
(blend, blend_per_split, split as --data-path / --split set them), its IndexedDatasetBuilder
writing the .bin/.idx data, its NullTokenizer, and its mask function
(_get_ltor_masks_and_position_ids) as the reference for the batch keys.

Megatron-LM's pretrain and its MegatronPretrainingSampler are not in the megatron-core
package; the sampler's rule (rank r of the data-parallel group takes samples
[consumed + r*mbs, consumed + (r+1)*mbs) of each global batch; a resumed run starts at its
saved consumed_train_samples) is written out in `megatron_batches` below."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from megatron.core.datasets.gpt_dataset import GPTDatasetConfig, _get_ltor_masks_and_position_ids
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
from megatron.core.datasets.utils import get_blend_from_list
from megatron.core.tokenizers.text.libraries.null_tokenizer import NullTokenizer
from torch.utils.data import DataLoader

import tokenfeed
from tokenfeed.integrations.megatron import datasets_provider

L = 32
VOCAB = 1000  # NullTokenizer(VOCAB).eod == VOCAB


def write_megatron(path, seed, n_docs=120):
    """A Megatron .bin/.idx pair by megatron-core's builder; every document ends with EOD."""
    rng = np.random.default_rng(seed)
    b = IndexedDatasetBuilder(f"{path}.bin", dtype=np.uint16)
    for _ in range(n_docs):
        doc = np.append(rng.integers(0, VOCAB, int(rng.integers(3, 60))), VOCAB)
        b.add_document(torch.from_numpy(doc.astype(np.int64)), [len(doc)])
    b.finalize(f"{path}.idx")
    return str(path)


def config(**kw):
    kw.setdefault("reset_position_ids", True)
    kw.setdefault("reset_attention_mask", True)
    kw.setdefault("eod_mask_loss", True)
    kw.setdefault("tokenizer", NullTokenizer(VOCAB))
    return GPTDatasetConfig(random_seed=5, sequence_length=L, **kw)


def megatron_batches(ds, mbs, dp, rank, consumed, steps, workers=0):
    """Megatron's MegatronPretrainingSampler over ``ds`` (see the module docstring) in a DataLoader."""
    g = mbs * dp
    batches = [list(range(consumed + s * g + rank * mbs, consumed + s * g + (rank + 1) * mbs)) for s in range(steps)]
    return list(DataLoader(ds, batch_sampler=batches, num_workers=workers))


@pytest.mark.parametrize("create_attention_mask", [True, False])
def test_batch_keys_match_megatrons_masks(tmp_path, create_attention_mask):
    prefix = write_megatron(tmp_path / "a", 0)
    cfg = config(blend=get_blend_from_list([prefix]), split="100,0,0", create_attention_mask=create_attention_mask)
    train, valid, test = datasets_provider(cfg)([64, None, None])
    assert valid is None and test is None and len(train) == 64
    ref = tokenfeed.Loader(tokenfeed.open(prefix + ".bin"), seq_len=L, batch_size=1, seed=5, output="numpy")
    for i in range(12):
        item = train[i]
        want = next(ref)
        assert set(item) == {"tokens", "labels", "loss_mask", "position_ids"} | (
            {"attention_mask"} if create_attention_mask else set())
        assert np.array_equal(item["tokens"].numpy(), want["input_ids"][0])
        assert np.array_equal(item["labels"].numpy(), want["labels"][0])
        am, lm, pos = _get_ltor_masks_and_position_ids(item["tokens"], VOCAB, True, True, True, create_attention_mask)
        assert item["loss_mask"].dtype == torch.float32 and torch.equal(item["loss_mask"], lm)
        assert torch.equal(item["position_ids"], pos)
        if create_attention_mask:
            assert item["attention_mask"].dtype == torch.bool and torch.equal(item["attention_mask"], am)


def test_masks_off_as_megatron(tmp_path):
    prefix = write_megatron(tmp_path / "a", 1)
    cfg = config(blend=get_blend_from_list([prefix]), split="100,0,0", reset_position_ids=False,
                 reset_attention_mask=False, eod_mask_loss=False)
    train = datasets_provider(cfg)([8, None, None])[0]
    for i in range(6):
        item = train[i]
        am, lm, pos = _get_ltor_masks_and_position_ids(item["tokens"], VOCAB, False, False, False, True)
        assert torch.equal(item["loss_mask"], lm) and torch.equal(item["position_ids"], pos)
        assert torch.equal(item["attention_mask"], am)


def test_tokenizers_pad_in_the_data_as_megatron(tmp_path):
    """A tokenizer whose pad id the data also holds: GPTDataset delivers those tokens as 0 and does
    not train a label that was the pad; so does the provider on tokenfeed's own order."""
    from test_megatron_order import PAD, PadTokenizer

    prefix = write_megatron(tmp_path / "a", 2)
    cfg = config(blend=get_blend_from_list([prefix]), split="100,0,0", tokenizer=PadTokenizer(VOCAB, PAD))
    train = datasets_provider(cfg)([64, None, None])[0]
    ref = tokenfeed.Loader(tokenfeed.open(prefix + ".bin"), seq_len=L, batch_size=1, seed=5, output="numpy")
    hits = 0
    for i in range(64):
        item, want = train[i], next(ref)
        tokens, labels = want["input_ids"][0].astype(np.int64), want["labels"][0].astype(np.int64)
        hits += int((labels == PAD).sum())
        # Megatron's masks are computed on the tokens as read, then the pad's labels are masked
        _, lm, pos = _get_ltor_masks_and_position_ids(torch.from_numpy(tokens), VOCAB, True, True, True, False)
        lm[torch.from_numpy(labels == PAD)] = 0.0
        assert np.array_equal(item["tokens"].numpy(), np.where(tokens == PAD, 0, tokens)), i
        assert np.array_equal(item["labels"].numpy(), np.where(labels == PAD, 0, labels)), i
        assert torch.equal(item["loss_mask"], lm) and torch.equal(item["position_ids"], pos), i
    assert hits > 0


def test_blend_and_blend_per_split(tmp_path):
    a, b, c = (write_megatron(tmp_path / n, i) for i, n in enumerate("abc"))
    # --data-path 30 a 70 b: the train split mixes a and b 0.3 / 0.7
    cfg = config(blend=get_blend_from_list(["30", a, "70", b]), split="100,0,0")
    train = datasets_provider(cfg)([40, None, None])[0]
    ref = tokenfeed.Loader([tokenfeed.open(a + ".bin"), tokenfeed.open(b + ".bin")], weights=[0.3, 0.7],
                           seq_len=L, batch_size=1, seed=5, output="numpy")
    for i in range(10):
        assert np.array_equal(train[i]["tokens"].numpy(), next(ref)["input_ids"][0])
    # --train-data-path a b --valid-data-path c: weights from the sizes, a dataset per split
    cfg = config(blend_per_split=[get_blend_from_list([a, b]), get_blend_from_list([c]), None])
    train, valid, test = datasets_provider(cfg)([40, 8, None])
    assert test is None and len(valid) == 8
    da, db = tokenfeed.open(a + ".bin"), tokenfeed.open(b + ".bin")
    w = [da.num_tokens / (da.num_tokens + db.num_tokens), db.num_tokens / (da.num_tokens + db.num_tokens)]
    ref = tokenfeed.Loader([da, db], weights=w, seq_len=L, batch_size=1, seed=5, output="numpy")
    assert np.array_equal(train[0]["tokens"].numpy(), next(ref)["input_ids"][0])
    ref = tokenfeed.Loader(tokenfeed.open(c + ".bin"), seq_len=L, batch_size=1, seed=5, output="numpy")
    assert np.array_equal(valid[0]["tokens"].numpy(), next(ref)["input_ids"][0])


def test_split_into_document_ranges_is_refused(tmp_path):
    a = write_megatron(tmp_path / "a", 0)
    with pytest.raises(ValueError, match="--train-data-path, --valid-data-path"):
        datasets_provider(config(blend=get_blend_from_list([a]), split="969,30,1"))([10, 10, 10])


@pytest.mark.parametrize("workers", [0, 2])
def test_stop_and_resume_from_consumed_samples(tmp_path, workers):
    """Two data-parallel ranks read 6 steps; a run resumed from consumed_train_samples after step 3
    (new provider, new datasets) reads the same batches for steps 3..5."""
    prefix = write_megatron(tmp_path / "a", 2, n_docs=300)
    cfg = config(blend=get_blend_from_list([prefix]), split="100,0,0")
    mbs, dp = 2, 2
    first = [megatron_batches(datasets_provider(cfg)([100, None, None])[0], mbs, dp, r, 0, 6, workers)
             for r in range(dp)]
    for r in range(dp):
        again = megatron_batches(datasets_provider(cfg)([100, None, None])[0], mbs, dp, r, 3 * mbs * dp, 3, workers)
        for s, batch in zip(range(3, 6), again):
            for k in batch:
                assert torch.equal(batch[k], first[r][s][k]), (r, s, k)
    # and the ranks together are the one stream, in order
    ref = tokenfeed.Loader(tokenfeed.open(prefix + ".bin"), seq_len=L, batch_size=mbs * dp, seed=5, output="numpy")
    for s in range(6):
        want = next(ref)["input_ids"]
        assert np.array_equal(torch.cat([first[0][s]["tokens"], first[1][s]["tokens"]]).numpy(), want)


def test_a_blend_entry_is_the_pair_megatron_reads_by_the_opens_rules(tmp_path):
    """A blend entry names the pair P.bin + P.idx as Megatron reads it, decided by the C core's
    resolution (.idx magic checked): a file named P beside the pair does not hide it, a linked pair
    opens, and a P.idx that is not Megatron's (another magic, a directory, a FIFO) is refused
    rather than P.bin read as some other format; an entry without a pair is whatever open reads."""
    from tokenfeed.integrations.megatron import _open_prefix
    p = write_megatron(tmp_path / "p", 0, n_docs=5)
    pair = tokenfeed.open(p + ".bin")
    (tmp_path / "p").write_bytes(np.arange(1, 100, dtype=np.uint16).tobytes())  # a file named like the prefix
    ds = _open_prefix(p)
    assert ds.format == "megatron" and ds.num_tokens == pair.num_tokens and ds.fingerprint == pair.fingerprint
    os.symlink(p + ".bin", tmp_path / "link.bin")
    os.symlink(p + ".idx", tmp_path / "link.idx")
    assert _open_prefix(str(tmp_path / "link")).fingerprint == pair.fingerprint
    with tokenfeed.DatasetWriter(tmp_path / "native", vocab_size=VOCAB) as w:
        w.add_documents([np.arange(1, 9, dtype=np.uint16)])
    assert _open_prefix(str(tmp_path / "native")).format == "tokenfeed"
    q = str(tmp_path / "q")
    (tmp_path / "q.bin").write_bytes(np.arange(1, 9, dtype=np.uint16).tobytes())
    (tmp_path / "q.idx").write_bytes(b"not Megatron's index")
    with pytest.raises(tokenfeed.FormatError, match="q.idx: magic"):
        _open_prefix(q)
    os.unlink(q + ".idx")
    os.mkdir(q + ".idx")
    with pytest.raises(FileNotFoundError, match="nor a Megatron pair"):
        _open_prefix(q)
    os.rmdir(q + ".idx")
    os.mkfifo(q + ".idx")  # no writer: reading it would block; a child, so that a hang fails the test
    code = ("import tokenfeed\nfrom tokenfeed.integrations.megatron import _open_prefix\n"
            f"try:\n    _open_prefix({q!r})\nexcept FileNotFoundError as e:\n    print('refused', e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "TOKENFEED_CATALOG_DIR": "off"})
    assert r.returncode == 0 and r.stdout.startswith("refused"), r.stdout + r.stderr
