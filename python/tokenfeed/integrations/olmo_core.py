"""A data loader for OLMo-core's ``Trainer``, over the token files OLMo writes.

::

    from olmo_core.data import TokenizerConfig
    from tokenfeed.integrations.olmo_core import TokenfeedDataLoader

    tokenizer = TokenizerConfig.dolma2()
    data_loader = TokenfeedDataLoader.from_paths(
        sorted(glob.glob("data/dolma/*.npy")), dtype="uint32", tokenizer=tokenizer,
        sequence_length=4096, global_batch_size=512 * 4096,       # tokens, as OLMo counts them
        work_dir="/tmp/work", dp_world_size=get_world_size(), dp_rank=get_rank())
    trainer = trainer_config.build(train_module, data_loader)
    trainer.fit()

OLMo's tokenizer (dolma) writes headerless token files with the end-of-document id after
every document, and optionally ``x.csv.gz`` document spans beside ``x.npy`` (which the C
library reads when it builds the document index, with zlib loaded at run time). They are
opened with ``eos_id=tokenizer.eos_token_id``, so position ids, intra-document masking
(``doc_lens`` / ``max_doc_lens``) and the loss mask see OLMo's documents, not one per
file (docs/format.md, "Document index of files split at an eos id").

The loader is an OLMo-core ``TextDataLoaderBase``: ``global_batch_size`` is in tokens,
``dp_rank`` / ``dp_world_size`` pick this rank's slice, ``reshuffle(epoch)`` starts an
epoch, and ``state_dict()`` (kept by the Trainer in its checkpoint) holds tokenfeed's
loader state next to OLMo's bookkeeping, so a resumed run continues the exact stream, on
another data-parallel size too. The stream is tokenfeed's: the files concatenated as one
token stream, cut every ``sequence_length`` tokens and shuffled by tokenfeed's seeded
order (epoch ``e`` is batches ``[(e - 1) * total_batches, e * total_batches)`` of it), not
OLMo's per-file instances.

``order="olmo"`` gives OLMo's own stream instead, batch for batch: the instances of
``NumpyFSLDataset`` (each file cut into ``sequence_length`` tokens on its own, its tail
dropped) in ``NumpyFSLDataLoader``'s order (its seeded shuffle per epoch, the end of every
epoch cut to whole global batches, rank ``r`` taking rows ``r, r + R, ...``), with OLMo's
``index`` and labels. Its state holds OLMo's data-loader keys too, so a checkpoint of
OLMo's loader continues here and back: build it with :meth:`from_olmo_dataset` from the
``NumpyFSLDataset`` the run used. Needs ``pip install ai2-olmo-core``; see
docs/guides/olmo-core.md.
"""
from __future__ import annotations

import os
from typing import Any, Dict, Iterable, Optional, Sequence, Union

import numpy as np

try:
    import torch
    from olmo_core.data.collator import DataCollator
    from olmo_core.data.data_loader import TextDataLoaderBase
except ImportError as e:  # pragma: no cover - exercised only without the package
    raise ImportError("tokenfeed.integrations.olmo_core needs OLMo-core: pip install ai2-olmo-core") from e

from ..sources import _dataset
from ..engine._loader import Loader

__all__ = ["TokenfeedDataLoader"]

PathLike = Union[str, "os.PathLike[str]"]


class TokenfeedDataLoader(TextDataLoaderBase):
    """OLMo-core data loader reading with tokenfeed.

    Args:
        dataset: a :class:`tokenfeed.Dataset` (for OLMo's files, opened with
            ``eos_id=``; :meth:`from_paths` does it).
        sequence_length: tokens per instance.
        global_batch_size: tokens per global batch (a multiple of ``sequence_length`` and,
            in instances, of ``dp_world_size``).
        work_dir: OLMo's working directory (nothing is written there: the order is computed).
        collator: OLMo's ``DataCollator``; its ``pad_token_id`` pads best-fit rows and its
            ``label_ignore_index`` marks labels not trained on. Default: pad 0, ignore -100.
        seed, shuffle, packing: tokenfeed's order (``packing="best_fit"`` needs the
            document index: ``tokenfeed index``).
        order: ``"tokenfeed"`` (the files as one stream), or ``"olmo"``: OLMo's own instances
            in OLMo's order (``NumpyFSLDataLoader`` with the same ``seed`` and ``shuffle``).
        olmo_fingerprint: OLMo's dataset fingerprint, which an OLMo state is checked against
            (:meth:`from_olmo_dataset` sets it).
        max_target_sequence_length: with ``order="olmo"``, the dataset's (a multiple of
            ``sequence_length``; OLMo's loader then shuffles runs of that many tokens).
        document_masking: add ``doc_lens`` and ``max_doc_lens`` to every batch, which turns
            on OLMo's intra-document attention masking.
        loader_kwargs: any other :class:`tokenfeed.Loader` keyword (``num_threads``, ...).

    Batches hold ``input_ids`` and ``labels`` (``rank_batch_size // sequence_length`` rows;
    labels are the next tokens, ``label_ignore_index`` where a new document starts),
    ``index`` (the tokenfeed position of each row) and with document masking ``doc_lens``
    and ``max_doc_lens``.
    """

    def __init__(self, dataset: _dataset.Dataset, *, sequence_length: int, global_batch_size: int,
                 work_dir: PathLike, collator: Optional[DataCollator] = None, dp_world_size: int = 1,
                 dp_rank: int = 0, fs_local_rank: Optional[int] = None, seed: int = 0, shuffle: bool = True,
                 packing: str = "concat", document_masking: bool = False, order: str = "tokenfeed",
                 loader_kwargs: Optional[Dict[str, Any]] = None, olmo_fingerprint: Optional[str] = None,
                 max_target_sequence_length: Optional[int] = None) -> None:
        if collator is None:
            collator = DataCollator(pad_token_id=0)
        super().__init__(collator=collator, work_dir=work_dir, global_batch_size=global_batch_size,
                         dp_world_size=dp_world_size, dp_rank=dp_rank, fs_local_rank=fs_local_rank)
        if sequence_length <= 0 or global_batch_size % sequence_length:
            raise ValueError(f"global_batch_size ({global_batch_size} tokens) must be a multiple of "
                             f"sequence_length ({sequence_length})")
        rows = global_batch_size // sequence_length
        if rows % dp_world_size:
            raise ValueError(f"the global batch of {rows} instances does not split over {dp_world_size} "
                             f"data-parallel ranks")
        if order not in ("tokenfeed", "olmo"):
            raise ValueError(f"order must be 'tokenfeed' or 'olmo', got {order!r}")
        if order == "olmo" and packing != "concat":
            raise ValueError("order='olmo' cuts OLMo's instances as NumpyFSLDataset does: packing must be 'concat'")
        mt = max_target_sequence_length
        if mt is not None and (order != "olmo" or mt < sequence_length or mt % sequence_length):
            raise ValueError(f"max_target_sequence_length ({mt}) is OLMo's, for order='olmo': a multiple of "
                             f"sequence_length ({sequence_length})")
        self.max_target_sequence_length = mt
        self.dataset = dataset
        self.sequence_length = sequence_length
        self.seed = seed
        self.shuffle = shuffle
        self.order = order
        self.document_masking = document_masking
        # OLMo's dataset fingerprint (from_olmo_dataset), checked against an OLMo state
        self.olmo_fingerprint = olmo_fingerprint
        kw: Dict[str, Any] = dict(
            seq_len=sequence_length, batch_size=rows // dp_world_size, shuffle=shuffle, packing=packing,
            pad_id=collator.pad_token_id if packing != "concat" or order == "olmo" else None, dp_rank=dp_rank,
            dp_size=dp_world_size, position_ids=False, cu_seqlens=document_masking, loss_mask=True,
            dtype="int64", output="torch", **(loader_kwargs or {}))
        if order == "olmo":
            kw.update(order="olmo", balance="strided")  # OLMo gives rank r rows r, r + R, ...
            if mt:
                kw.update(olmo_chunk=mt // sequence_length)
        self._loader_kw = kw
        self._loader = Loader(dataset, seed=seed, **kw)
        self._rows = rows
        self._iter_global_batch = global_batch_size

    @classmethod
    def from_paths(cls, paths: Sequence[PathLike], *, dtype: Any, tokenizer: Any = None,
                   eos_token_id: Optional[int] = None, **kwargs: Any) -> "TokenfeedDataLoader":
        """Open OLMo's token files (``dtype`` as in OLMo's ``NumpyDatasetConfig``, e.g. ``uint32``)
        split at the tokenizer's end-of-document id. ``tokenizer`` is OLMo's ``TokenizerConfig``
        (its ``eos_token_id`` and ``pad_token_id`` are used), or pass ``eos_token_id``."""
        eos = eos_token_id if eos_token_id is not None else getattr(tokenizer, "eos_token_id", None)
        if eos is None:
            raise ValueError("from_paths needs the end-of-document id: tokenizer= or eos_token_id=")
        if tokenizer is not None and "collator" not in kwargs:
            kwargs["collator"] = DataCollator(pad_token_id=tokenizer.pad_token_id)
        ds = _dataset.open([os.fspath(p) for p in paths], dtype=dtype, eos_id=int(eos))
        return cls(ds, **kwargs)

    @classmethod
    def from_olmo_dataset(cls, dataset: Any, **kwargs: Any) -> "TokenfeedDataLoader":
        """The loader that continues a run of OLMo's ``NumpyFSLDataLoader`` over ``dataset`` (OLMo's
        ``NumpyFSLDataset``, as the run's ``NumpyDatasetConfig`` builds it): its files, dtype,
        ``sequence_length`` and end-of-document id, ``order="olmo"``, and its fingerprint for the
        check of OLMo's state. Pass ``global_batch_size``, ``work_dir``, ``seed`` and the rank as
        for OLMo's loader."""
        from olmo_core.data.numpy_dataset import NumpyFSLDataset

        if type(dataset) is not NumpyFSLDataset:
            raise TypeError(f"from_olmo_dataset takes OLMo's NumpyFSLDataset, not {type(dataset).__name__} "
                            f"(its padded, packed and variable-length datasets cut other instances)")
        if "collator" not in kwargs:
            kwargs["collator"] = DataCollator(pad_token_id=dataset.pad_token_id)
        kwargs.setdefault("order", "olmo")
        kwargs.setdefault("sequence_length", dataset.sequence_length)
        kwargs.setdefault("max_target_sequence_length", dataset.max_target_sequence_length)
        ds = _dataset.open([os.fspath(p) for p in dataset.paths], dtype=np.dtype(dataset.dtype).name,
                           eos_id=int(dataset.eos_token_id))
        return cls(ds, olmo_fingerprint=dataset.fingerprint, **kwargs)

    # ------------------------------------------------------------- protocol
    @property
    def total_batches(self) -> int:
        """Global batches per epoch (an epoch is one pass over tokenfeed's samples; with
        ``order="olmo"``, OLMo's: its instances cut to whole global batches)."""
        return self._loader.epoch_positions // self._rows

    def _epoch_start(self, epoch: int) -> int:
        return (epoch - 1) * self.total_batches

    def state_dict(self) -> Dict[str, Any]:
        # the position counts the batches this rank has handed out, never the prefetched ones
        out: Dict[str, Any] = {
            "tokenfeed": self._loader.state_dict(),
            "batches_processed": self.batches_processed,
            "tokens_processed": self.tokens_processed,
            "epoch": self._epoch,
            "seed": self.seed,
            "sequence_length": self.sequence_length,
        }
        if self.order == "olmo":
            # the rest of NumpyFSLDataLoader's state: its own loader resumes from this one too
            out.update(dataset_type="fsl", max_target_sequence_length=self.max_target_sequence_length,
                       dataset_fingerprint_version="v2.0",
                       dataset_fingerprint=self.olmo_fingerprint)
        return out

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        if state_dict.get("sequence_length", self.sequence_length) != self.sequence_length:
            raise ValueError(f"the state was saved with sequence_length {state_dict['sequence_length']}, "
                             f"this loader has {self.sequence_length}")
        if "tokenfeed" not in state_dict:
            self._load_olmo_state(state_dict)
            return
        self._loader.load_state_dict(state_dict["tokenfeed"])
        self.batches_processed = int(state_dict["batches_processed"])
        self.tokens_processed = int(state_dict["tokens_processed"])
        self._epoch = state_dict.get("epoch")

    def _load_olmo_state(self, state_dict: Dict[str, Any]) -> None:
        """Continue from the state of OLMo's NumpyFSLDataLoader, as it resumes itself: the epoch,
        the tokens processed in it (in global batches of this loader's size) and its seed."""
        if self.order != "olmo" or state_dict.get("dataset_type") != "fsl":
            raise ValueError("not a TokenfeedDataLoader state: it lacks the 'tokenfeed' loader state. A run begun on "
                             "OLMo's NumpyFSLDataLoader continues on TokenfeedDataLoader(order='olmo') "
                             "(TokenfeedDataLoader.from_olmo_dataset)")
        mt = state_dict.get("max_target_sequence_length")
        if (mt or self.sequence_length) != (self.max_target_sequence_length or self.sequence_length):
            raise ValueError(f"the OLMo state comes from a dataset with max_target_sequence_length {mt}, this loader "
                             f"has {self.max_target_sequence_length}: the order differs")
        fp = state_dict.get("dataset_fingerprint")
        if self.olmo_fingerprint is not None and fp is not None and fp != self.olmo_fingerprint:
            raise ValueError("the OLMo state was saved on another dataset (its dataset_fingerprint differs from this "
                             "loader's NumpyFSLDataset): continuing would read other instances")
        seed = int(state_dict["seed"])
        if seed != self.seed:
            # OLMo's loader takes the seed of the state, so that the order goes on
            self.seed = seed
            self._loader.close()
            self._loader = Loader(self.dataset, seed=seed, **self._loader_kw)
        self.tokens_processed = int(state_dict["tokens_processed"])
        self.batches_processed = self.tokens_processed // self.global_batch_size
        self._epoch = state_dict.get("epoch") or self._epoch

    def reshuffle(self, epoch: Optional[int] = None, **kwargs: Any) -> None:
        """Start epoch ``epoch`` (1-based; default the next one). The order of every epoch is
        fixed by the seed: nothing is built or written."""
        del kwargs
        if epoch is None:
            epoch = 1 if self._epoch is None else self._epoch + 1
        if epoch <= 0:
            raise ValueError(f"'epoch' must be at least 1, got {epoch}")
        self._epoch = epoch

    def _check_batch_size(self) -> None:
        if self.global_batch_size != self._iter_global_batch:
            raise RuntimeError("TokenfeedDataLoader keeps its global batch size: changing it during a run "
                               "(a batch-size schedule) would change the stream; start a new loader instead")

    def _iter_batches(self) -> Iterable[Dict[str, Any]]:
        self._check_batch_size()
        epoch = self.epoch
        want = (self._epoch_start(epoch) + self.batches_processed) * self._rows
        if self._loader.position != want:
            # a fresh run at epoch > 1 or a state from the middle of another epoch: move there
            state = self._loader.state_dict()
            state["position"] = want
            self._loader.load_state_dict(state)
        ignore = self.collator.label_ignore_index
        for _ in range(self.batches_processed, self.total_batches):
            self._check_batch_size()
            b = next(self._loader)
            yield self._olmo_batch(b, ignore, self._loader.position - self._rows)

    def _olmo_batch(self, b: Dict[str, Any], ignore: int, start: int) -> Dict[str, Any]:
        rows = b["input_ids"].shape[0]
        # the batch's tensors are views of tokenfeed's buffer: copy what the step keeps
        labels = b["labels"].clone()
        if self.order == "olmo":
            # OLMo's labels: the inputs shifted, the last one not trained (its label is the pad)
            labels[:, -1] = ignore
            pos = start + self.dp_rank + self.dp_world_size * np.arange(rows, dtype=np.uint64)
            index = torch.from_numpy(np.asarray(self._loader._order.sample_at(pos), dtype=np.int64))
        else:
            labels[b["loss_mask"] == 0] = ignore
            first = start + self.dp_rank * rows
            index = torch.arange(first, first + rows, dtype=torch.int64)
        out: Dict[str, Any] = {"input_ids": b["input_ids"].clone(), "labels": labels, "index": index}
        if self.document_masking:
            cu = b["cu_seqlens"].to(torch.int64)
            n = int(b["num_seqs"].max())
            doc_lens = (cu[:, 1:] - cu[:, :-1])[:, :n]
            out["doc_lens"] = doc_lens.to(torch.int32)
            out["max_doc_lens"] = doc_lens.max(dim=1).values.tolist()
        return out

    def get_mock_batch(self) -> Dict[str, Any]:
        rows = self.rank_batch_size // self.sequence_length
        rng = np.random.default_rng(self.seed + self.dp_rank)
        ids = torch.from_numpy(rng.integers(0, 100, size=(rows, self.sequence_length), dtype=np.int64))
        out: Dict[str, Any] = {"input_ids": ids}
        if self.document_masking:
            half = self.sequence_length // 2
            out["doc_lens"] = torch.tensor([[half, self.sequence_length - half]] * rows, dtype=torch.int32)
            out["max_doc_lens"] = [max(half, self.sequence_length - half)] * rows
        return out
