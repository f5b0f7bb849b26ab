"""Every entry point refuses keyword arguments it does not know (a misspelt setting
must fail loudly, never be ignored and change nothing), at construction: the
public API, the torch adapters and the _core types and methods."""
from __future__ import annotations

import numpy as np
import pytest

import tokenfeed
from tokenfeed import _core
from tokenfeed.order import _config


@pytest.fixture
def ds(make_dataset):
    return make_dataset(n_docs=40, vocab=1000, mean_len=30)


def refuses(fn, *args, **kw):
    with pytest.raises(TypeError, match="unexpected keyword|invalid keyword|takes at most"):
        fn(*args, **kw)


def test_public_api(ds, tmp_path):
    refuses(tokenfeed.open, ds.paths[0], bogus=1)
    refuses(tokenfeed.Loader, ds, seq_len=8, batch_size=2, seqlen=99)
    refuses(tokenfeed.Loader, ds, seq_len=8, batch_size=2, shufle=False)
    refuses(tokenfeed.DatasetWriter, tmp_path / "w", vocab_size=10, compresion="zstd")
    assert not (tmp_path / "w").exists()
    refuses(ds.verify, bogus=1)
    refuses(_config.OrderConfig, seq_len=8, sead=1)
    refuses(_config.EngineConfig, batch_size=2, threads=3)


def test_torch_adapters(ds):
    pytest.importorskip("torch")
    from tokenfeed import torch as tft

    refuses(tft.TokenDataset, ds, seq_len=8, sead=1)
    refuses(tft.ResumableSampler, 10, batch_size=2, epoch=1)
    # TokenBatches passes its extra keywords to the Loader in each worker: they are
    # checked when it is made, not when a worker starts
    refuses(tft.TokenBatches, ds, seq_len=8, batch_size=2, seqlen=3)
    tft.TokenBatches(ds, seq_len=8, batch_size=2, seed=3, packing="best_fit")  # known ones pass


def test_core_types(ds, tmp_path):
    src = ds._core
    # the case the C binding used to accept: every misspelling ignored, the defaults used
    refuses(_core.Order, src, seq_len=16, seqlen=99999, shufle=2, sead=5)
    for key in ("seqlen", "shufle", "sead", "global_batch_size", "packing_mode"):
        refuses(_core.Order, src, seq_len=8, **{key: 1})
    order = _core.Order(src, seq_len=8, global_batch=2)
    refuses(_core.Loader, order, batch_size=2, threads=4)
    refuses(_core.Loader, order, batch_size=2, seq_len=8)  # a stream setting belongs to the Order
    refuses(_core.Dataset, [ds.paths[0]], bogus=1)
    refuses(_core.Writer, str(tmp_path / "w"), vocab_size=10, bogus=1)
    refuses(_core.Permutation, 10, bogus=1)
    refuses(_core.DeviceRing, 0, 1024, 2, bogus=1)  # refused before CUDA is looked for
    refuses(src.read, 0, 4, bogus=1)
    refuses(src.verify, bogus=1)
    refuses(order.fill, 0, bogus=1)


def test_core_settings_are_used_not_defaulted(ds):
    """The keywords that are known reach the C order: a value differs from the default."""
    src = ds._core
    assert _core.Order(src, seq_len=9).num_samples != _core.Order(src, seq_len=8).num_samples
    cases = [({}, "seed", 5), ({}, "shuffle", _core.SHUFFLE_BLOCK), ({}, "epochs", 2), ({}, "global_batch", 4),
             ({}, "separator_id", 7), ({}, "packing", _core.PACK_BEST_FIT),
             ({"shuffle": _core.SHUFFLE_BLOCK}, "block_size", 3), ({"shuffle": _core.SHUFFLE_BLOCK}, "window_blocks", 2),
             ({"packing": _core.PACK_BEST_FIT}, "pad_id", 1), ({"packing": _core.PACK_BEST_FIT}, "pack_window", 10)]
    for base_kw, key, value in cases:
        base = _core.Order(src, seq_len=8, **base_kw)
        assert _core.Order(src, seq_len=8, **base_kw, **{key: value}).fingerprint != base.fingerprint, key


def test_core_argument_errors_name_the_setting(ds):
    src = ds._core
    with pytest.raises(TypeError, match="seq_len"):
        _core.Order(src, seq_len=2.5)
    with pytest.raises(TypeError, match="seed"):
        _core.Order(src, seq_len=8, seed=True)
    with pytest.raises(ValueError, match="separator_id"):
        _core.Order(src, seq_len=8, separator_id=-3)
    with pytest.raises(ValueError, match="seq_len"):  # the range is checked in C, once
        _core.Order(src, seq_len=0)
    with pytest.raises(ValueError, match="num_threads"):
        _core.Loader(_core.Order(src, seq_len=8, global_batch=2), batch_size=2, num_threads=_core.MAX_THREADS + 1)
    with pytest.raises(ValueError, match="global batch"):
        _core.Loader(_core.Order(src, seq_len=8, global_batch=3), batch_size=2)
    with pytest.raises(TypeError):
        _core.Loader(src, batch_size=2)  # the engine takes an Order


def test_packing_constants_are_the_c_values():
    assert (_core.PACK_CONCAT, _core.PACK_BEST_FIT, _core.PACK_DOCUMENT) == (0, 1, 2)
    assert _config.PACKING == {"concat": _core.PACK_CONCAT, "best_fit": _core.PACK_BEST_FIT,
                               "document": _core.PACK_DOCUMENT}
    assert np.unique(list(_config.SHUFFLE.values())).size == 3


@pytest.mark.parametrize("kw", [dict(num_threads=10**6), dict(prefetch_batches=10**6), dict(backend="floppy"),
                                dict(num_threads=-1), dict(dtype="float99"), dict(block_size=0)])
def test_loader_checks_every_setting_when_made(ds, kw):
    """Engine settings too fail at Loader(), not at the first batch."""
    with pytest.raises((ValueError, TypeError)):
        tokenfeed.Loader(ds, seq_len=8, batch_size=2, output="numpy", **kw)
