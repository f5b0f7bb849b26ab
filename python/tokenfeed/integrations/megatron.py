"""Megatron-LM: a train/valid/test datasets provider for ``pretrain`` that reads with tokenfeed.

    from megatron.training import get_args, pretrain
    from megatron.training.arguments import core_gpt_dataset_config_from_args  # pretrain_gpt.py's
    from tokenfeed.integrations.megatron import datasets_provider

    provider = datasets_provider(lambda: core_gpt_dataset_config_from_args(get_args()))
    pretrain(provider, model_provider, ModelType.encoder_or_decoder, forward_step, ...)

The provider takes megatron-core's ``GPTDatasetConfig`` (what ``--data-path``,
``--train-data-path``/``--valid-data-path``/``--test-data-path``, ``--split``,
``--seq-length``, ``--seed`` and the mask options set), or a function returning it, called
when Megatron asks for the datasets (after its arguments are parsed). Each dataset is
map-style: item ``i`` is sample ``i`` of that split's tokenfeed stream (its global
position), the dict ``GPTDataset`` gives: ``tokens`` and ``labels`` (``seq_length``
each, int64), ``loss_mask`` (float), ``position_ids`` and, when the config asks for it,
``attention_mask`` (``1 x L x L`` bool, True where attention is masked). Megatron's
sampler asks for positions from ``consumed_train_samples`` on, so a resumed run continues
the stream exactly; tokenfeed's order does not depend on the data-parallel layout.

Blend: the prefixes of ``blend`` (``--data-path 0.3 a 0.7 b``) are opened with
``tokenfeed.open`` (a Megatron ``.bin/.idx`` prefix read in place, or a tokenfeed dataset)
and mixed with the weights (normalized; without weights, in proportion to their tokens,
as Megatron infers them from the datasets' sizes). Split: ``blend_per_split`` gives each
split its own blend. A ``split`` that puts samples in more than one split would cut each
dataset into document ranges; tokenfeed does not cut a dataset by documents, so it is
refused with what to do instead (a split that is all train, ``--split 100,0,0``, works).

Masks, from tokenfeed's document boundaries (no EOD id needed): ``position_ids`` restart
at every document when ``reset_position_ids`` (else ``0..L-1``); ``attention_mask`` is
causal, block-diagonal per document when ``reset_attention_mask``; ``loss_mask`` is 0 where
a label would cross a document boundary (Megatron's ``eod_mask_loss`` on data whose
documents end with EOD) and on padding; with ``eod_mask_loss`` off, only padding is 0
(``packing="concat"`` has none). Where the data holds the tokenizer's pad id
(:func:`megatron_pad_id`), the token comes as 0 in ``tokens`` and ``labels`` and that label
is not trained, as ``GPTDataset`` gives it. See docs/guides/megatron.md.

A run begun on Megatron's own ``GPTDataset`` continues sample for sample from the index
cache GPTDataset wrote (``path_to_cache``): inside ``pretrain`` with
``datasets_provider(config, megatron_cache=True)`` (item ``i`` is ``GPTDataset[i]``), or with
:func:`continue_from_cache`, a ``tokenfeed.Loader`` at the run's ``consumed_train_samples``.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch.utils.data import Dataset as _TorchDataset

import tokenfeed
from .. import _core
from ..remote import _remote

__all__ = ["datasets_provider", "TokenfeedGPTDataset", "build_datasets", "continue_from_cache", "megatron_pad_id"]

Blend = Tuple[List[str], Optional[List[float]]]
_SPLITS = ("train", "valid", "test")


class TokenfeedGPTDataset(_TorchDataset):  # type: ignore[type-arg,unused-ignore]
    """Map-style: item ``i`` is the sample at global position ``i`` of a tokenfeed stream, in
    Megatron's ``GPTDataset`` keys. ``len()`` is ``num_samples`` (Megatron's request for the
    split), or one epoch. A sample is read by a Loader of one sample per step, moved only when
    an item is asked out of sequence (Megatron's sampler reads each rank's rows in order)."""

    def __init__(self, name: str, datasets: Sequence[Any], weights: Optional[Sequence[float]], *, seq_len: int,
                 seed: int, num_samples: Optional[int] = None, reset_position_ids: bool = True,
                 reset_attention_mask: bool = False, eod_mask_loss: bool = True, create_attention_mask: bool = False,
                 pad_token_id: Optional[int] = None, **loader_kw: Any) -> None:
        self.name = name
        self.pad_token_id = pad_token_id  # GPTDataset's (megatron_pad_id): delivered as 0, not trained
        self.seq_len = int(seq_len)
        self.reset_position_ids, self.reset_attention_mask = bool(reset_position_ids), bool(reset_attention_mask)
        self.eod_mask_loss, self.create_attention_mask = bool(eod_mask_loss), bool(create_attention_mask)
        data: Any = list(datasets) if weights is not None else datasets[0]
        self._kw = dict(loader_kw, seq_len=self.seq_len, batch_size=1, seed=int(seed), dp_rank=0, dp_size=1,
                        position_ids=True, loss_mask=True, output="numpy",
                        **({"weights": list(weights)} if weights is not None else {}))
        self._data = data
        self._cache = loader_kw.get("megatron_cache") is not None  # GPTDataset's own samples
        self._loader: Optional[tokenfeed.Loader] = tokenfeed.Loader(data, **self._kw)  # settings checked now
        self.samples_per_epoch = self._loader.num_samples
        self.num_samples = int(num_samples) if num_samples else self.samples_per_epoch

    def __len__(self) -> int:
        return self.num_samples

    def _get_loader(self) -> tokenfeed.Loader:
        if self._loader is None:  # after unpickling in a DataLoader worker
            self._loader = tokenfeed.Loader(self._data, **self._kw)
        return self._loader

    def __getitem__(self, idx: int) -> Dict[str, torch.Tensor]:
        idx = int(idx)
        if not 0 <= idx:
            raise IndexError(f"{self.name}: sample index must be >= 0, got {idx}")
        loader = self._get_loader()
        if loader.position != idx:  # O(1): the stream is a function of the position
            state = loader.state_dict()
            state["position"] = idx
            loader.load_state_dict(state)
        b = next(loader)
        padding = self._padding_labels(loader, idx) if self._cache and not self.eod_mask_loss else None
        return self._megatron(b["input_ids"][0], b["labels"][0], b["position_ids"][0], b["loss_mask"][0], padding)

    def _padding_labels(self, loader: tokenfeed.Loader, idx: int) -> np.ndarray[Any, Any]:
        """Which labels of sample ``idx`` are GPTDataset's padding: the sample's tokens (``seq_len + 1``)
        that no document piece covers, shifted to the labels. Read from the order (``explain``), no
        tokens: a label that is a data token equal to 0 is not padding."""
        covered = np.zeros(self.seq_len + 1, dtype=bool)
        for seg in loader.explain(idx)[0]:  # one sample per step: step idx is sample idx
            covered[seg.offset:seg.offset + seg.stop - seg.start] = True
        return ~covered[1:]

    def _megatron(self, inputs: np.ndarray[Any, Any], labels: np.ndarray[Any, Any], pos: np.ndarray[Any, Any],
                  mask: np.ndarray[Any, Any], padding: Optional[np.ndarray[Any, Any]] = None
                  ) -> Dict[str, torch.Tensor]:
        L = self.seq_len
        pos = pos.astype(np.int64)
        inputs, labels = inputs.astype(np.int64), labels.astype(np.int64)
        pad_label = None
        if self.pad_token_id is not None:  # as GPTDataset: Megatron's pad id in the data is token 0, untrained
            pad_label = labels == self.pad_token_id
            inputs[inputs == self.pad_token_id] = 0
            labels[pad_label] = 0
        out = {"tokens": torch.from_numpy(inputs), "labels": torch.from_numpy(labels)}
        if self.eod_mask_loss:
            loss = mask.astype(np.float32)  # a copy
        elif padding is not None:  # GPTDataset's samples: its padding (the last label without the extra token)
            loss = (~padding).astype(np.float32)
        else:  # only padding (a chunk of pad_id after the last document) is not trained
            pad = self._kw.get("pad_id")
            loss = np.ones(L, np.float32) if pad is None else (labels != pad).astype(np.float32)
        if pad_label is not None:
            loss[pad_label] = 0.0
        if self.create_attention_mask:
            causal = np.tril(np.ones((L, L), dtype=bool))
            if self.reset_attention_mask:  # a token sees only its own document
                seg = np.cumsum(pos == 0)
                causal &= seg[:, None] == seg[None, :]
            out["attention_mask"] = torch.from_numpy(~causal[None])
        out["loss_mask"] = torch.from_numpy(loss)
        out["position_ids"] = torch.from_numpy(pos if self.reset_position_ids else np.arange(L, dtype=np.int64))
        return out

    def __getstate__(self) -> Dict[str, Any]:
        st = self.__dict__.copy()
        st["_loader"] = None  # made again in the process that reads
        return st

    def __setstate__(self, st: Dict[str, Any]) -> None:
        self.__dict__.update(st)


def megatron_pad_id(config: Any) -> Optional[int]:
    """The pad id megatron-core's ``GPTDataset`` uses for ``config`` (its ``MegatronDataset``
    takes it from the tokenizer), or None where it has none (Megatron's -1, which no token is).

    ``tokenizer.pad``; none when the tokenizer has no pad, or when the pad id is one of its
    other special tokens (``special_tokens_dict``, else ``eos`` and ``eod``) unless
    ``allow_ambiguous_pad_tokens``. Where the data holds this id, GPTDataset delivers the
    token as 0 in ``tokens`` and ``labels`` and does not train that label (``loss_mask`` 0);
    the provider and :func:`continue_from_cache` do the same."""
    tok = getattr(config, "tokenizer", None)
    try:
        pad = tok.pad  # type: ignore[union-attr]
    except Exception:  # as MegatronDataset: no pad
        return None
    try:
        special = [v for k, v in tok.special_tokens_dict.items() if k != "pad_token"]  # type: ignore[union-attr]
    except (AttributeError, IndexError, ValueError):
        special = []
    if not special:  # at least eos and eod
        for name in ("eos", "eod"):
            try:
                special.append(getattr(tok, name))
            except (AttributeError, NotImplementedError):
                pass
    if pad in special and not getattr(config, "allow_ambiguous_pad_tokens", False):
        return None  # Megatron then pads with -1, which masks no token of the data
    if isinstance(pad, bool) or not isinstance(pad, (int, np.integer)) or pad < 0:
        return None
    return int(pad)


def _open_prefix(prefix: str) -> tokenfeed.Dataset:
    """A Megatron blend entry: the ``.bin/.idx`` pair it is the prefix of (as Megatron reads it, the
    C core deciding by the open's rules, ``.idx`` magic included), else whatever tokenfeed.open reads."""
    if not _remote.is_url(prefix):
        try:
            kind, where = _core.resolve_path(prefix, "megatron")
        except (OSError, ValueError, _core.FormatError):
            pass  # no pair there: tokenfeed.open says what it finds instead
        else:
            if kind == "pair":
                return tokenfeed.open(where, format="megatron")
    return tokenfeed.open(prefix)


def _blend_weights(blend: Blend, datasets: Sequence[tokenfeed.Dataset]) -> Optional[List[float]]:
    prefixes, weights = blend
    if len(prefixes) == 1:
        return None
    if weights is None:  # Megatron infers them from the datasets' sizes
        weights = [float(d.num_tokens) for d in datasets]
    total = float(sum(weights))
    if total <= 0 or any(w < 0 for w in weights):
        raise ValueError(f"blend weights must be >= 0 with a positive sum, got {list(weights)}")
    return [float(w) / total for w in weights]


def _split_blends(config: Any, cached: bool = False) -> List[Optional[Blend]]:
    """One blend per split (train, valid, test), from ``blend_per_split`` or a ``blend`` all in train
    (``cached``: in every split the split matrix gives samples, each read from Megatron's cache)."""
    per = getattr(config, "blend_per_split", None)
    if per is not None and any(per):
        return [None if b is None else (list(b[0]), None if b[1] is None else list(b[1])) for b in per]
    blend = getattr(config, "blend", None)
    if blend is None:
        raise ValueError("the Megatron dataset config has no data: set blend (--data-path) or blend_per_split "
                         "(--train-data-path, --valid-data-path, --test-data-path)")
    matrix = getattr(config, "split_matrix", None) or [(0.0, 1.0), (1.0, 1.0), (1.0, 1.0)]
    used = [name for name, ab in zip(_SPLITS, matrix) if ab is not None and ab[1] > ab[0]]  # None: empty
    if cached:  # the cache holds each split's documents
        return [(list(blend[0]), None if blend[1] is None else list(blend[1])) if name in used else None
                for name in _SPLITS]
    if used != ["train"]:
        raise ValueError(
            f"split {getattr(config, 'split', None)!r} puts samples in {' and '.join(used)}: Megatron would cut each "
            f"dataset into document ranges, and tokenfeed reads a dataset whole. Give each split its own data "
            f"(--train-data-path, --valid-data-path, --test-data-path: blend_per_split), or use --split 100,0,0")
    return [(list(blend[0]), None if blend[1] is None else list(blend[1])), None, None]


def build_datasets(config: Any, train_val_test_num_samples: Sequence[Optional[int]],
                   **loader_kw: Any) -> Tuple[Optional[TokenfeedGPTDataset], ...]:
    """The (train, valid, test) datasets of a megatron-core ``GPTDatasetConfig``; a split without data is None.
    ``loader_kw``: other ``tokenfeed.Loader`` keywords (packing, shuffle, pad_id, ...).

    ``megatron_cache=True`` (or the cache directory) gives GPTDataset's own samples, item
    ``i`` being ``GPTDataset[i]`` of the split, read from the index cache Megatron wrote
    (``path_to_cache``): a run begun on Megatron's datasets goes on with the same data, on
    Megatron's own sampler, with ``--split`` as it was."""
    cache = loader_kw.pop("megatron_cache", None)
    out: List[Optional[TokenfeedGPTDataset]] = []
    for name, blend, n in zip(_SPLITS, _split_blends(config, cache is not None), train_val_test_num_samples):
        if blend is None:
            out.append(None)
            continue
        kw = dict(loader_kw)
        if cache is not None:
            kw.update(megatron_cache=_cache_dir(config, blend, name, cache), megatron_split=name,
                      megatron_add_extra_token=bool(getattr(config, "add_extra_token_to_sequence", True)))
            n = None  # as long as GPTDataset: the samples its cache holds
        datasets = [_open_prefix(p) for p in blend[0]]
        out.append(TokenfeedGPTDataset(
            name, datasets, _blend_weights(blend, datasets), seq_len=config.sequence_length,
            seed=config.random_seed, num_samples=n,
            reset_position_ids=bool(getattr(config, "reset_position_ids", False)),
            reset_attention_mask=bool(getattr(config, "reset_attention_mask", False)),
            eod_mask_loss=bool(getattr(config, "eod_mask_loss", False)),
            create_attention_mask=bool(getattr(config, "create_attention_mask", True)),
            pad_token_id=megatron_pad_id(config), **kw))
    return tuple(out)


def datasets_provider(config: Union[Any, Callable[[], Any]], **loader_kw: Any) -> Callable[..., Any]:
    """A ``train_valid_test_datasets_provider`` for Megatron-LM's ``pretrain``.

    ``config``: a megatron-core ``GPTDatasetConfig`` (or any object with its fields), or a
    function that returns one when Megatron asks for the datasets. ``loader_kw``: other
    ``tokenfeed.Loader`` keywords. Every rank builds its own datasets (``is_distributed``):
    opening is O(1) and the stream does not depend on the rank."""

    def provider(train_val_test_num_samples: Sequence[Optional[int]], vp_stage: Optional[int] = None
                 ) -> Tuple[Optional[TokenfeedGPTDataset], ...]:
        cfg = config() if callable(config) else config
        return build_datasets(cfg, train_val_test_num_samples, **loader_kw)

    setattr(provider, "is_distributed", True)  # Megatron then calls it on every rank
    return provider


def continue_from_cache(config: Any, *, micro_batch_size: int, dp_rank: int = 0, dp_size: int = 1,
                        consumed_samples: int = 0, split: str = "train", cache: Any = None,
                        **loader_kw: Any) -> tokenfeed.Loader:
    """A ``tokenfeed.Loader`` that continues a run begun on megatron-core's ``GPTDataset``.

    ``config``: the run's ``GPTDatasetConfig`` (its one data prefix, for ``split``;
    ``sequence_length``; ``add_extra_token_to_sequence``; ``path_to_cache``, or ``cache``:
    the directory where GPTDataset wrote its indices, or one of their files). Rank
    ``dp_rank`` of ``dp_size`` gets, ``micro_batch_size`` samples per batch, what Megatron's
    sampler gives it, from ``consumed_samples`` (the checkpoint's
    ``consumed_train_samples``) on; ``state_dict()`` resumes it from then on. The
    tokenizer's pad id in the data comes as 0 and untrained, as GPTDataset gives it
    (``megatron_pad_id``, from the config's tokenizer: :func:`megatron_pad_id`). ``loader_kw``:
    other ``tokenfeed.Loader`` keywords (``position_ids``, ``loss_mask``, ``device``, ...)."""
    idx = _SPLITS.index(split) if split in _SPLITS else -1
    if idx < 0:
        raise ValueError(f"split must be one of {', '.join(_SPLITS)}, got {split!r}")
    blend = _split_blends(config, True)[idx]
    cache = _cache_dir(config, blend, split, cache)
    assert blend is not None  # _cache_dir refuses a split without data
    loader = tokenfeed.Loader(_prefix_data(blend[0][0]), seq_len=int(config.sequence_length),
                              batch_size=micro_batch_size, dp_rank=dp_rank, dp_size=dp_size, megatron_cache=cache,
                              megatron_split=split,
                              megatron_add_extra_token=bool(getattr(config, "add_extra_token_to_sequence", True)),
                              **{"megatron_pad_id": megatron_pad_id(config), **loader_kw})
    if consumed_samples:
        state = loader.state_dict()
        state["position"] = int(consumed_samples)
        loader.load_state_dict(state)
    return loader


def _cache_dir(config: Any, blend: Optional[Blend], split: str, cache: Any) -> Any:
    """Where GPTDataset wrote the split's indices: ``cache`` (True: the config's), else its
    ``path_to_cache``, else its default beside the data. The split must read one prefix."""
    if blend is None or len(blend[0]) != 1:
        raise ValueError(f"Megatron's cache order reads one GPTDataset: the config's {split} data must be one prefix, "
                         f"found {None if blend is None else list(blend[0])} (a blend of several is Megatron's "
                         f"BlendedDataset, whose order is not reproduced)")
    if cache is None or cache is True:
        cache = getattr(config, "path_to_cache", None)
    if cache is None:
        cache = os.path.join(os.fspath(blend[0][0]), "cache", "GPTDataset_indices")  # where GPTDataset writes then
    return cache


def _prefix_data(prefix: str) -> str:
    return prefix + ".bin" if os.path.exists(prefix + ".bin") else prefix
