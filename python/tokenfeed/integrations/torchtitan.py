"""A torchtitan data loader: tokenfeed's stream in torchtitan's ``Trainer``.

``TokenfeedDataLoader.Config`` goes where torchtitan's own data-loader configs go (the
``dataloader`` field of ``Trainer.Config``, in a config registry function); the Trainer
builds it with the data-parallel rank and degree, the tokenizer, ``training.seq_len``
and the local batch size, as it builds ``HuggingFaceTextDataLoader``. Each step yields
torchtitan's ``(input_dict, labels)``:

- ``input_dict["input"]``: ``local_batch_size x seq_len`` token ids (int64);
- ``input_dict["positions"]``: per-document positions, restarting at 0 at every
  document (chunk) start; torchtitan's Flex and varlen attention build their
  block-causal document masks from them, and RoPE reads them;
- ``labels``: the next tokens, ``-100`` (torchtitan's ignore index) where no label is
  trained: across a document boundary and on padding (tokenfeed's ``loss_mask``).

A mixture: ``weights`` (one per comma-separated entry of ``dataset_path``, each entry
then a source of its own) mixes the sources by weight; ``loader={"weights": ...}`` takes
a weight schedule instead. :meth:`TokenfeedDataLoader.set_weights` changes the weights
during the run (``Loader.set_weights``), and the checkpoint keeps the change.

The state is tokenfeed's (a global stream position, the configuration and their
fingerprints), the same on every data-parallel rank, kept under one key: torchtitan's
``CheckpointManager`` saves it through DCP once, every rank reads it back, and a run
saved with one data-parallel degree resumes with any degree that divides the global
batch.

``pip install torchtitan``; see docs/guides/torchtitan.md.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, cast

import torch
from torchtitan.components.dataloader import BaseDataLoader

import tokenfeed
from tokenfeed.order._schedule import as_schedule

__all__ = ["TokenfeedDataLoader", "IGNORE_INDEX", "STATE_KEY"]

IGNORE_INDEX = -100  # torchtitan.components.loss.IGNORE_INDEX
STATE_KEY = "tokenfeed"


class TokenfeedDataLoader(BaseDataLoader):
    """torchtitan's ``BaseDataLoader`` over a :class:`tokenfeed.Loader`."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseDataLoader.Config):
        # dataset_path (from BaseDataLoader.Config): what tokenfeed.open() reads (a dataset
        # directory, a manifest, a shard file or a glob); several, comma-separated: one
        # dataset, or with weights the sources of a mixture
        seed: int = 0
        """Shuffle seed of the stream."""

        packing: str = "concat"
        """tokenfeed packing: concat, best_fit or document (docs/packing.md)."""

        weights: Optional[List[float]] = None
        """Mixing weights, one per comma-separated entry of dataset_path: each entry is then a
        source of its own (a dataset directory, a manifest, a glob), mixed by these weights
        (normalized; docs/packing.md, "Mixtures"). None: the entries are one dataset. A weight
        schedule goes in loader={"weights": [(step, [w, ...]), ...]} instead."""

        loader: Dict[str, Any] = field(default_factory=dict)
        """Any other tokenfeed.Loader keyword (shuffle, separator_id, pad_id, epochs, num_threads,
        device, weights, ...): passed through unchanged, checked when the loader is built."""

    def __init__(self, config: "TokenfeedDataLoader.Config", *, dp_world_size: int, dp_rank: int,
                 seq_len: int, local_batch_size: int, tokenizer: Any = None, **_unused: Any) -> None:
        # the Trainer also passes snapshot_every_n_steps (a StatefulDataLoader setting):
        # tokenfeed's state is O(1) at every step, so there is nothing to snapshot
        if not config.dataset_path:
            raise ValueError("TokenfeedDataLoader.Config.dataset_path is empty: set it to the tokenfeed dataset "
                             "(dataloader.dataset_path)")
        self.config = config
        paths = [p.strip() for p in config.dataset_path.split(",") if p.strip()]
        opts = dict(config.loader)
        for k in ("position_ids", "loss_mask", "output", "dp_rank", "dp_size", "rank", "world_size",
                  "device_mesh", "seq_len", "batch_size", "seed", "packing"):
            if k in opts:
                raise ValueError(f"dataloader.loader[{k!r}]: set by the trainer or the Config itself, not here")
        if config.weights is not None:
            if "weights" in opts:
                raise ValueError("dataloader.weights and dataloader.loader['weights'] are both set: give the "
                                 "mixture's weights once (a schedule in loader['weights'])")
            opts["weights"] = [float(w) for w in config.weights]
        if "weights" in opts:  # a mixture: every entry of dataset_path is a source
            plain, schedule = as_schedule(opts["weights"])
            n = len(plain) if plain is not None else schedule.num_sources  # type: ignore[union-attr]
            if n != len(paths):
                raise ValueError(f"dataloader.dataset_path has {len(paths)} comma-separated entries ({paths}) and "
                                 f"the weights {n}: a mixture takes one entry (a dataset directory, a manifest, "
                                 f"a glob) per weight")
            sources = [tokenfeed.open(p) for p in paths]
            self.dataset: Any = sources
        else:
            self.dataset = tokenfeed.open(paths if len(paths) > 1 else paths[0])
            sources = [self.dataset]
        vocab = _vocab_size(tokenizer)
        for path, ds in zip(paths if len(sources) > 1 else [config.dataset_path], sources):
            if vocab is not None and ds.vocab_size and ds.vocab_size > vocab:
                raise ValueError(f"{path}: its token ids go up to vocab size {ds.vocab_size}, the tokenizer has "
                                 f"{vocab}: the data was tokenized with another tokenizer")
        self.dp_rank, self.dp_world_size = int(dp_rank), int(dp_world_size)
        self.loader = tokenfeed.Loader(self.dataset, seq_len=seq_len, batch_size=local_batch_size,
                                       seed=config.seed, packing=cast(Any, config.packing), dp_rank=self.dp_rank,
                                       dp_size=self.dp_world_size, position_ids=True, loss_mask=True,
                                       output="torch", **opts)

    def __iter__(self) -> Iterator[Tuple[Dict[str, torch.Tensor], torch.Tensor]]:
        # A finite stream (loader={"epochs": k}) ends here; the Trainer turns the end into
        # DataloaderExhaustedError and the Validator ends its pass, as with their own loaders.
        for batch in self.loader:
            yield _to_titan(batch)

    def set_weights(self, weights: Sequence[float]) -> None:
        """Mix the sources with ``weights`` from the next batch on (``tokenfeed.Loader.set_weights``):
        each source continues where it was, and the change is in the state, so the checkpoint's
        resume reads with these weights. Call it on every rank at the same step (a hook of the
        training loop, say); the loader must be a mixture (``weights``)."""
        self.loader.set_weights(weights)

    @property
    def weights(self) -> Optional[List[float]]:
        """The mixture's weights in force (None for one dataset)."""
        return self.loader.weights

    def state_dict(self) -> Dict[str, Any]:
        # One string under one key: identical on every rank, so DCP stores it once and
        # any data-parallel degree finds it; a string, so DCP keeps it whole.
        return {STATE_KEY: json.dumps(self.loader.state_dict(), sort_keys=True)}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        if not state_dict:  # nothing saved yet: start at the beginning, as torchtitan's loaders do
            return
        if STATE_KEY not in state_dict:
            raise tokenfeed.StateError(f"the checkpoint's data-loader state has no {STATE_KEY!r} entry (keys: "
                                       f"{sorted(state_dict)}): it was not saved by TokenfeedDataLoader")
        s = state_dict[STATE_KEY]
        self.loader.load_state_dict(json.loads(s.decode() if isinstance(s, bytes) else s))

    def close(self) -> None:
        self.loader.close()


def _to_titan(batch: Dict[str, Any]) -> Tuple[Dict[str, torch.Tensor], torch.Tensor]:
    """tokenfeed's batch as torchtitan's ``({"input", "positions"}, labels)``."""
    labels = batch["labels"].masked_fill(batch["loss_mask"] == 0, IGNORE_INDEX)  # a copy: labels views the row
    return {"input": batch["input_ids"], "positions": batch["position_ids"].long()}, labels


def _vocab_size(tokenizer: Any) -> Optional[int]:
    f = getattr(tokenizer, "get_vocab_size", None)
    try:
        return int(f()) if f is not None else None
    except Exception:  # a tokenizer without a fixed vocabulary: nothing to check
        return None
