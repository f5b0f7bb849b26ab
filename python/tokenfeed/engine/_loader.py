"""The Loader: packed, shuffled, rank-partitioned batches with exact, elastic resume.

The order is computed in C (see docs/order.md): a configuration defines one infinite
stream of samples; global batch ``b`` is positions ``[b*G, (b+1)*G)`` and rank ``r`` of
``R`` takes the contiguous slice ``[b*G + r*B, b*G + (r+1)*B)`` with ``B = G/R``. The
state is that position plus fingerprints, so restoring is O(1) and works with any
``R'`` that divides ``G``.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import sys
import warnings
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Literal, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from .. import _core
from ..common._errors import StateError
from ..common._warnings import PerformanceWarning
from ..common._warnings import renamed
from ..order._config import SETTINGS, EngineConfig, OrderConfig, settings_given, split_settings
from ..order._mesh import DEFAULT_CP_DIM, DEFAULT_DP_DIMS, ParallelCoords, parallel_coords
from ..order._schedule import WeightSchedule, short_ramps
from ..sources._dataset import Dataset, PathLike, open as _open

if TYPE_CHECKING:
    from ..order._explain import Segment

# Rows of the settings table that Loader's signature writes by hand (they have Python-side
# meaning: the mesh, a shuffle given as a bool, ...); the rest are written out from the
# table between the marker lines of its signature (tests/gen_signatures.py).
SETTINGS_BY_HAND = ("seq_len", "shuffle", "order", "llmc_processes", "batch_size", "dp_rank", "dp_size", "cp_rank",
                    "cp_size", "global_batch", "megatron_cache", "megatron_split", "megatron_add_extra_token")
LOADER_SETTINGS = tuple(n for n, r in SETTINGS.items()
                        if r["scope"] in ("order", "engine", "device") and n not in SETTINGS_BY_HAND)

__all__ = ["Loader", "StateError", "STATE_FORMAT_VERSION"]

STATE_FORMAT_VERSION = _core.STATE_FORMAT_VERSION
_INFINITE = (1 << 64) - 1


#: A best_fit or document packing that pads more than this fraction of the token slots
#: gets a warning when the Loader is made (the figure is in ``packing_stats()``).
PADDING_WARN = 0.5


def _traps(order: Any, weights: Any, packing: str, seq_len: int, global_batch: int, mix_window: int) -> List[str]:
    """Configurations that work but do not deliver what they look like: a linear ramp
    flattened by the mixing window, a packing that is mostly padding."""
    out: List[str] = []
    if isinstance(weights, WeightSchedule):
        ramp = short_ramps(weights, global_batch, mix_window)
        if ramp:
            out.append(ramp)
    if packing in ("best_fit", "document"):  # their packing stats are free: gathered with the plan
        pad = order.packing_stats()
        frac = float(pad.get("padding_fraction") or 0.0)
        if frac > PADDING_WARN:
            real = int(pad["token_slots"]) - int(pad["pad_tokens"])
            mean = real / max(1, int(pad["documents"]) - int(pad.get("empty_documents", 0)))
            out.append(f"tokenfeed: packing={packing!r} at seq_len={seq_len} pads {frac:.0%} of every batch "
                       f"(packing_stats()['padding_fraction']): the documents average {mean:,.0f} tokens. "
                       f"Lower seq_len toward that, or use packing='concat' (no padding)"
                       + (" or 'best_fit'" if packing == "document" else ""))
    return out


def _json_value(v: Any) -> Any:
    """NumPy and torch scalars and arrays (as Orbax or a tensor-only checkpointer gives back
    a state's numbers) as the plain values they hold."""
    if isinstance(v, np.ndarray) or type(v).__name__ == "Tensor":
        return v.tolist()
    if isinstance(v, np.generic):
        return v.item()
    raise TypeError(f"{type(v).__name__} {v!r}")


def _nonfinite_key(v: Any, at: str = "") -> Optional[str]:
    """Where a state holds NaN or an infinity (``"config.weights[1]"``), or None: JSON has no such
    numbers, so such a state was edited or damaged."""
    if isinstance(v, float) and not math.isfinite(v):
        return at or "the state"
    if isinstance(v, Mapping):
        for k, x in v.items():
            found = _nonfinite_key(x, f"{at}.{k}" if at else str(k))
            if found:
                return found
    elif isinstance(v, (list, tuple)):
        for i, x in enumerate(v):
            found = _nonfinite_key(x, f"{at}[{i}]")
            if found:
                return found
    elif isinstance(v, np.ndarray) or isinstance(v, np.generic) or type(v).__name__ == "Tensor":
        return _nonfinite_key(_json_value(v), at)
    return None


def _state_from_json(text: Union[str, bytes], where: str = "the state") -> Any:
    """A loader state from its JSON text, read as the C library reads it: a key twice in one object
    is refused (json.loads would keep the last value, C would not agree), as are NaN and
    Infinity (not JSON)."""
    def pairs(items: List[Tuple[str, Any]]) -> Dict[str, Any]:
        d: Dict[str, Any] = {}
        for k, v in items:
            if k in d:
                raise StateError(f"{where}: the key {k!r} appears twice in one object; a loader state holds each "
                                 f"key once: pass the state Loader.state_dict() returned")
            d[k] = v
        return d

    def constant(name: str) -> Any:
        raise StateError(f"{where}: {name} is not a JSON number (a loader state holds finite numbers)")

    return json.loads(text, object_pairs_hook=pairs, parse_constant=constant)


def _torch_available() -> bool:
    return "torch" in sys.modules or importlib.util.find_spec("torch") is not None


class Loader:
    """Iterate batches of packed token sequences for this rank.

    Each batch is a dict: ``input_ids`` and ``labels`` (``batch_size x seq_len``, views of
    one ``batch_size x (seq_len + 1)`` buffer also given as ``tokens``), plus
    ``position_ids``, ``cu_seqlens``/``num_seqs`` and ``loss_mask`` when asked for. Arrays
    are torch tensors when torch is importable (``output="auto"``), else NumPy.

    ``batch_size`` is per data-parallel rank; the global batch is ``batch_size * dp_size``.
    ``device_mesh=`` (a torch ``DeviceMesh`` with named dims) gives the data-parallel rank
    and size (dims ``dp_dims``: ``dp``, ``dp_replicate``, ``dp_shard``) and the
    context-parallel ones (dim ``cp_dim``: ``cp``); every other dim replicates, so tensor-,
    pipeline- and expert-parallel peers get identical batches. Without torch, pass
    ``dp_rank``/``dp_size`` (older names ``rank``/``world_size``) and ``cp_rank``/``cp_size``.
    With neither, the global ``torch.distributed`` rank and world size are used (then
    ``RANK``/``WORLD_SIZE``, then 0/1): right only for pure data parallelism (see
    ``docs/guides/distributed.md``). With ``cp_size > 1`` each batch holds this rank's
    load-balanced share of every sample: ``input_ids``, ``labels`` and the extras are
    ``batch_size x seq_len / cp_size`` (no ``tokens``), or with ``cu_seqlens=True`` the THD
    layout (``docs/packing.md``). ``epochs=None`` streams forever; with ``epochs=k`` the
    stream stops after ``k`` epochs, dropping the final partial *global* batch so every
    rank gets the same number of batches.

    ``device="cuda"`` (or ``"cuda:N"``; the index defaults to ``LOCAL_RANK``) yields
    device tensors, ready on the consumer's current stream (see ``docs/gpu.md``): the
    engine assembles batches in page-locked memory and a C thread issues each batch's
    copy to the GPU as soon as it is assembled, ``device_prefetch_batches`` (default 2)
    batches ahead of ``next()``, into ``device_slots`` device buffers (default
    ``device_prefetch_batches + 2``: the consumer may hold two batches at once). ``position``
    and ``state_dict()`` count the batches you received, never those copied ahead.
    Context-parallel shares are copied ahead the same way. ``static_buffers=True``
    delivers every batch into the same device tensors (allocated once), for training
    steps captured in CUDA graphs: each batch is copied into them on the current stream
    at ``next()``, after the step before it. Without CUDA it raises a ``RuntimeError``
    that says why.

    ``num_threads`` (default: the engine's choice for the backend, at most 256) and
    ``prefetch_batches`` (batches assembled ahead, default ``2 * num_threads + 2``, at most
    4096) never change the stream. ``prefetch`` and ``device_prefetch`` are the older
    names of ``prefetch_batches`` and ``device_prefetch_batches`` (a
    ``DeprecationWarning``). Every setting is one row of the C library's settings table
    (``tokenfeed._core.settings()``: type, default, bounds, whether it changes the
    stream) and is checked when the Loader is made: an unknown keyword is a
    ``TypeError``, a bad value a ``ValueError`` or ``TypeError`` that names it.

    ``document_ids=True`` adds ``document_ids`` (int32 ``batch_size x seq_len``: the index of
    each position's segment of ``cu_seqlens`` in its row), what FlexAttention's document
    masks take; :func:`tokenfeed.flex.block_mask` builds the ``BlockMask`` from
    ``cu_seqlens`` directly (``docs/balance.md``).

    ``warmup_steps=T, warmup_min_seq_len=l0`` warms the sequence length up: for the first
    ``T`` steps every sample comes cut into rows of ``seq_len / 2^m`` tokens (from ``l0``,
    doubling on the way; ``current_seq_len``), so a batch is ``batch_size * k`` rows of
    ``seq_len / k``; the concatenated tokens are the unwarmed stream's and the state is
    unchanged.

    ``balance="attention"`` (or ``"tokens"``) gives the rows of each global batch to the
    data-parallel ranks so that every rank gets about the same attention work (or the
    same number of non-padding tokens), computed from the global order on every rank
    without communication; the global batch holds the same rows, and resume and elastic
    resume stay exact. ``balance_micro_batches=M`` (gradient accumulation: ``M`` batches
    per optimizer step) balances the ``M`` global batches of a step together, across
    ranks and across each rank's micro-batches (``docs/balance.md``).

    ``order="megatron", megatron_cache=DIR`` (or ``megatron_cache=DIR`` alone, which means
    ``order="megatron"``) continues a run begun on Megatron-core: the stream is
    ``GPTDataset``'s, read from the index cache it wrote into ``DIR`` (its ``path_to_cache``,
    ``--data-cache-path``) for ``megatron_split`` (default ``"train"``; or pass one of the
    cache's files), over ``dataset``, the ``.bin/.idx`` data it was built from: position ``i``
    is ``GPTDataset[i]`` (``input_ids`` its ``tokens``, ``labels`` its ``labels``), so rank
    ``r`` of ``dp_size`` with ``batch_size`` = Megatron's micro-batch size gets what
    Megatron's sampler gives that rank, and position = ``consumed_train_samples``. The
    arrays are read in place (memory-mapped; opening is O(1) in their size). ``seq_len`` is
    Megatron's ``--seq-length``; ``megatron_add_extra_token`` its
    ``add_extra_token_to_sequence`` (default True), which the cache does not record;
    ``megatron_pad_id`` the pad id GPTDataset took from its tokenizer (None or negative:
    none; :func:`tokenfeed.integrations.megatron.megatron_pad_id` finds it in the run's
    config): where the data holds it, GPTDataset delivers the token as 0 and does not
    train that label, and so does the loader. The shuffle is Megatron's (``shuffle`` must not be ``"block"``); ``epochs=1`` ends the stream
    where the cache ends (endless streams read it again). See ``docs/guides/megatron.md``.
    ``order="llmc"`` or ``order="olmo"`` reproduces another loader's samples and order, so
    a run begun on it continues here (``docs/order.md``, "Continuing another loader's
    run"): ``"llmc"`` is llm.c's ``DataLoader`` (each file cut on its own from its token 0,
    ``batch_size`` rows of ``seq_len + 1`` per process, shuffled per process as
    ``train_gpt2`` does, from ``seed`` (default 42, llm.c's); ``llmc_processes``, default
    ``dp_size``, is its number of processes); ``"olmo"`` is OLMo-core's ``NumpyFSLDataset`` instances
    (``seq_len`` tokens each, then a ``pad_id`` whose label the loss mask leaves out) in
    ``NumpyFSLDataLoader``'s seeded order, with ``balance="strided"`` for its split over
    ranks (:mod:`tokenfeed.integrations.olmo_core` sets it all up).

    ``where=`` and ``exclude=`` read a view of the data instead of all of it, as
    :meth:`Dataset.filter` makes one (a filter over the metadata columns or a boolean mask,
    and document ids or ``{column: values}`` to leave out; with ``weights=``, of each
    source). The selection enters the dataset fingerprint: ``docs/views.md``.
    ``loss_weights=`` adds a float32 ``loss_weights`` array beside ``labels`` (same shape):
    one weight per source of a mixture (every token of a row weighs its source's), or the
    name of a number column of the metadata (every label weighs its document's value; 1
    where the document has none, 0 for separators and padding; with context parallelism
    each rank's share of them, during a sequence-length warmup the shorter rows' own; not
    yet with context parallelism in the THD layout, ``cu_seqlens=True``).

    The C engine's threads and buffers start lazily in the process that iterates, so a
    Loader can be created before ``fork`` or pickled to a ``spawn`` worker.

    On zstd-compressed data the workers share a cache of decompressed blocks sized from
    the shuffle (a block-shuffle window: ~86 MiB at the defaults, at most 1 GiB);
    ``zstd_cache_bytes`` sets it instead. It changes how often a block is decoded, never
    the stream. ``stats()["zstd"]`` reports it, with the tokens decoded per token
    delivered; a configuration predicted to decode more than 8x what it delivers gets a
    :class:`PerformanceWarning` when the loader is created (see ``docs/performance.md``).
    """

    def __init__(self, dataset: Union[Dataset, PathLike, Sequence[Any]], *, seq_len: int, batch_size: int,
                 shuffle: Union[bool, str] = True,
                 weights: Optional[Union[Sequence[Any], WeightSchedule, Mapping[str, Any]]] = None,
                 dtype: Any = "int64", output: str = "auto", position_ids: bool = False, cu_seqlens: bool = False,
                 loss_mask: bool = False, document_ids: bool = False, device: Any = None,
                 static_buffers: bool = False,
                 device_mesh: Any = None, dp_rank: Optional[int] = None, dp_size: Optional[int] = None,
                 cp_rank: Optional[int] = None, cp_size: Optional[int] = None,
                 dp_dims: Sequence[str] = DEFAULT_DP_DIMS, cp_dim: Optional[str] = DEFAULT_CP_DIM,
                 rank: Optional[int] = None, world_size: Optional[int] = None, prefetch: Optional[int] = None,
                 device_prefetch: Optional[int] = None, source_ids: bool = False,
                 megatron_cache: Optional[PathLike] = None, megatron_split: str = "train",
                 megatron_add_extra_token: bool = True, megatron_pad_id: Optional[int] = None,
                 order: Literal["tokenfeed", "llmc", "olmo", "megatron"] = "tokenfeed",
                 llmc_processes: Optional[int] = None,
                 where: Any = None, exclude: Any = None, loss_weights: Any = None,
                 # BEGIN settings keywords of Loader (tests/gen_signatures.py writes this block)
                 packing: Literal["concat", "best_fit", "document"] = "concat", separator_id: Optional[int] = None,
                 seed: int = 0, block_size: int = 1024, window_blocks: int = 16, epochs: Optional[int] = None,
                 pad_id: int = 0, pack_window: int = 1024, mix_window: int = 1000, olmo_chunk: Optional[int] = None,
                 num_threads: Optional[int] = None, prefetch_batches: Optional[int] = None,
                 backend: Optional[Literal["auto", "mmap", "pread", "io_uring"]] = None, direct_io: bool = False,
                 zstd_cache_bytes: Optional[int] = None,
                 balance: Optional[Literal["none", "tokens", "attention", "strided"]] = None,
                 balance_micro_batches: int = 1, warmup_steps: int = 0, warmup_min_seq_len: Optional[int] = None,
                 device_prefetch_batches: Optional[int] = None, device_slots: Optional[int] = None,
                 # END settings keywords of Loader
                 ) -> None:
        # The keywords of the block above are the other rows of the C settings table
        # (_core.settings()), written out from it: those set are passed on by scope and
        # checked by their rows.
        order_kw, engine_kw, device_kw = split_settings(settings_given(locals(), LOADER_SETTINGS), "Loader")
        order_kw.update(order=order, llmc_processes=llmc_processes)
        # the older names of two settings, kept for a release
        engine_kw["prefetch_batches"] = renamed("prefetch_batches", engine_kw.get("prefetch_batches"), "prefetch",
                                                prefetch)
        device_kw["device_prefetch_batches"] = renamed("device_prefetch_batches",
                                                       device_kw.get("device_prefetch_batches"), "device_prefetch",
                                                       device_prefetch)
        # which part of the data this rank takes: its data-parallel slice of every global
        # batch and its context-parallel share of every sample (docs/guides/distributed.md)
        self.parallel: ParallelCoords = parallel_coords(device_mesh, dp_rank=dp_rank, dp_size=dp_size, cp_rank=cp_rank,
                                                        cp_size=cp_size, rank=rank, world_size=world_size,
                                                        dp_dims=dp_dims, cp_dim=cp_dim)
        pc = self.parallel
        if not isinstance(document_ids, bool):
            raise TypeError(f"document_ids must be True or False, got {document_ids!r}")
        if document_ids and pc.cp_size > 1:
            raise ValueError("document_ids=True is for whole rows; with context parallelism use the THD layout's "
                             "cu_seqlens (cu_seqlens=True)")
        # per-token document ids come from cu_seqlens (tokenfeed.flex.document_ids); the
        # batch keeps cu_seqlens / num_seqs only when they were asked for too
        self._document_ids = document_ids
        self._drop_cu = document_ids and not cu_seqlens
        # one configuration, checked once: the engine's (the global batch comes from
        # it) and the stream's; the C library checks ranges when it builds them
        self._engine_cfg = EngineConfig(
            batch_size=batch_size, rank=pc.dp_rank, world_size=pc.dp_size, dtype=dtype, position_ids=position_ids,
            cu_seqlens=cu_seqlens or document_ids, loss_mask=loss_mask, cp_rank=pc.cp_rank, cp_size=pc.cp_size,
            settings=engine_kw)  # every engine row given, whichever it is
        if megatron_cache is not None or order == "megatron":
            # megatron_cache= alone means order="megatron"; OrderConfig checks the pair and reads
            # the shuffle as the cache's own
            if megatron_cache is not None and megatron_split not in SETTINGS["megatron_split"]["names"]:
                raise FileNotFoundError(f"{os.fspath(megatron_cache)}: no GPTDataset index cache of split "
                                        f"{megatron_split!r}: Megatron's path_to_cache holds the splits test, train, "
                                        f"valid (megatron_split)")
            order_kw.update(megatron_cache=megatron_cache, megatron_split=megatron_split,
                            megatron_add_extra_token=megatron_add_extra_token)
        if order == "llmc":
            # llm.c's processes are the data-parallel ranks that continue its run, and it seeds
            # process r's shuffle with 42 + r
            if llmc_processes is None or llmc_processes == 0:  # 0 is None, as in C
                order_kw["llmc_processes"] = pc.dp_size
            order_kw.setdefault("seed", 42)
        self._order_cfg = OrderConfig(seq_len=seq_len, shuffle=shuffle, weights=weights,
                                      global_batch=self._engine_cfg.global_batch, **order_kw)
        if output not in ("auto", "torch", "numpy"):
            raise ValueError(f"output must be 'auto', 'torch' or 'numpy', got {output!r}")
        # weights= makes `dataset` a list of sources mixed by weight (docs/packing.md);
        # without it a list of paths is one dataset (files concatenated)
        if weights is not None:
            if isinstance(dataset, (Dataset, str, os.PathLike)):
                raise ValueError("weights= needs a list of datasets (one per weight)")
            srcs = list(dataset)
            nw = self._order_cfg.num_sources
            if len(srcs) != nw or not srcs:
                raise ValueError(f"weights= needs one weight per dataset: {len(srcs)} datasets, {nw} weights")
            self.dataset: Any = [d if isinstance(d, Dataset) else _open(d) for d in srcs]
        else:
            self.dataset = dataset if isinstance(dataset, Dataset) else _open(dataset)
        if where is not None or exclude is not None:
            # a view of each dataset (docs/views.md): Dataset.filter, for one source or each
            if isinstance(self.dataset, list):
                self.dataset = [d.filter(where, exclude=exclude) for d in self.dataset]
            else:
                self.dataset = self.dataset.filter(where, exclude=exclude)
        if megatron_pad_id is not None:
            if isinstance(megatron_pad_id, bool) or not isinstance(megatron_pad_id, (int, np.integer)):
                raise TypeError(f"megatron_pad_id must be an int or None, got {megatron_pad_id!r}")
            if self._order_cfg.order != "megatron":
                raise ValueError("megatron_pad_id= is what GPTDataset does with its tokenizer's pad id in the data: "
                                 "it goes with megatron_cache= (order='megatron': continuing a run begun on Megatron)")
        # GPTDataset's pad id (negative: none, Megatron's -1): tokens equal to it come as 0, untrained
        self._megatron_pad: Optional[int] = None if megatron_pad_id is None or megatron_pad_id < 0 \
            else int(megatron_pad_id)
        if not isinstance(source_ids, bool):
            raise TypeError(f"source_ids must be True or False, got {source_ids!r}")
        if source_ids and weights is None:
            raise ValueError("source_ids=True needs a mixture (weights=): one dataset has one source")
        self._source_ids = source_ids
        self._loss_weights = self._check_loss_weights(loss_weights, weights is not None, pc.cp_size,
                                                      bool(cu_seqlens or document_ids))
        # documents taken down while the run went on (exclude): [(position, source, sorted ids)]
        self._excluded: List[Tuple[int, int, "np.ndarray[Any, np.dtype[np.int64]]"]] = []
        self._excluded_sets: Optional[Tuple[Tuple[Tuple[int, ...], int], Dict[int, "set[int]"]]] = None
        requested_output = output
        if output == "auto":
            output = "torch" if _torch_available() else "numpy"
        self.output = output
        # the order, built once, and the engine that reads it (its threads start at
        # the first batch, in the process that iterates)
        self._order = self._order_cfg.build(self._core_source())
        self._position = 0
        self._warned = False
        oc = self._order_cfg
        for trap in _traps(self._order, oc.weights, oc.packing, seq_len, self.global_batch, oc.mix_window):
            warnings.warn(trap, UserWarning, stacklevel=2)
        self._engine: Optional[Any] = self._new_engine(stacklevel=3)
        # the global positions this engine has served, for the per-source accounting
        self._acct_ranges: List[Tuple[int, int]] = [(0, 0)]
        # The GPU hop (docs/gpu.md): None keeps batches on the CPU. The device stage
        # is made now, so a missing GPU fails here, not at the first batch; from then
        # on the engine works in page-locked memory.
        from ..device._device import parse_device

        self.device_index = parse_device(device)
        if self._engine_cfg.setting("warmup_steps") and self.device_index is not None:
            raise ValueError("warmup_steps with device=: the device stage copies batches of one shape, and a "
                             "sequence-length warmup changes the shape; take CPU batches and move them yourself")
        if document_ids and self.device_index is not None and output == "numpy":
            raise ValueError("document_ids=True on a device needs torch output (output='torch' or 'auto')")
        if not isinstance(static_buffers, bool):
            raise TypeError(f"static_buffers must be True or False, got {static_buffers!r}")
        if static_buffers and self.device_index is None:
            raise ValueError("static_buffers=True needs a device: the static buffers are device memory for steps "
                             "captured in CUDA graphs (Loader(..., device='cuda', static_buffers=True))")
        self._device_kw: Dict[str, Any] = dict(
            settings=device_kw,  # every device row given, whichever it is
            static_buffers=static_buffers,
            output="dlpack" if output == "numpy" else ("auto" if requested_output == "auto" else output))
        self._device: Optional[Any] = None
        self._closed = False
        if self.device_index is not None:
            self._get_device()
        if output == "torch":
            import torch  # noqa: F401  (fail now, not at the first batch)

    # ----------------------------------------------------------- configuration
    @property
    def seq_len(self) -> int:
        return self._order_cfg.seq_len

    @property
    def current_seq_len(self) -> int:
        """The row length of the next batch: ``seq_len``, or shorter during a sequence-length warmup
        (``warmup_steps``), when each sample comes cut into ``seq_len / current_seq_len`` rows."""
        e = self._engine_cfg
        return _core.seq_len_warmup(self.seq_len, e.setting("warmup_min_seq_len"), e.setting("warmup_steps"),
                                    self.position // self.global_batch)

    @property
    def batch_size(self) -> int:
        """Samples per rank per batch."""
        return self._engine_cfg.batch_size

    @property
    def rank(self) -> int:
        """The data-parallel rank (``dp_rank``)."""
        return self._engine_cfg.rank

    @property
    def world_size(self) -> int:
        """The data-parallel size (``dp_size``)."""
        return self._engine_cfg.world_size

    @property
    def dp_rank(self) -> int:
        return self._engine_cfg.rank

    @property
    def dp_size(self) -> int:
        return self._engine_cfg.world_size

    @property
    def cp_rank(self) -> int:
        return self._engine_cfg.cp_rank

    @property
    def cp_size(self) -> int:
        return self._engine_cfg.cp_size

    @property
    def global_batch(self) -> int:
        """Samples per step over all ranks: ``batch_size * world_size``."""
        return self._engine_cfg.global_batch

    @property
    def out_dtype(self) -> "np.dtype[Any]":
        dt: "np.dtype[Any]" = np.dtype(self._engine_cfg.dtype)
        return dt

    @property
    def weights(self) -> Optional[list[float]]:
        """Mixing weights (with a schedule: those of the point in force at the current position), or None
        for one dataset."""
        w = self._order_cfg.weights
        if isinstance(w, WeightSchedule):
            step = self.position // self.global_batch
            return list(w.weights[max(i for i, s in enumerate(w.steps) if s <= step)])
        return None if w is None else list(w)

    @property
    def weight_schedule(self) -> Optional[WeightSchedule]:
        """The mixture's weight schedule, or None (plain weights, or one dataset)."""
        w = self._order_cfg.weights
        return w if isinstance(w, WeightSchedule) else None

    @property
    def _mixture(self) -> bool:
        return self._order_cfg.weights is not None

    @property
    def num_samples(self) -> int:
        """Samples per epoch."""
        n: int = self._order.num_samples
        return n

    @property
    def epoch_positions(self) -> int:
        """Positions per epoch: ``num_samples``, or fewer with ``order="olmo"``, whose epochs leave
        out the instances past whole global batches as OLMo-core's data loader does."""
        n: int = self._order.epoch_positions
        return n

    @property
    def config_fingerprint(self) -> str:
        return f"{self._order.fingerprint:016x}"

    # ---------------------------------------------------------------- engine
    def _new_engine(self, stacklevel: int) -> Any:
        """The C engine; warns once per loader when it predicts a slow configuration.
        stacklevel: of the user's frame, counted from here."""
        eng = self._engine_cfg.build(self._order)
        z = eng.stats().get("zstd")
        if z and z["note"] and not self._warned:
            self._warned = True
            warnings.warn(PerformanceWarning(f"tokenfeed: {z['note']} (docs/performance.md, 'Compressed data')"),
                          stacklevel=stacklevel)
        return eng

    def _get_engine(self) -> Any:
        if self._closed:
            raise ValueError("the loader is closed")
        # After fork() the engine object is a copy: the C layer notices the new
        # process on the next call and starts fresh threads at the same position.
        if self._engine is None:
            eng = self._new_engine(stacklevel=4)
            if self._position:
                eng.seek(self._position)
            self._engine = eng
            self._acct_ranges = [(self._position, self._position)]
        return self._engine

    def _get_device(self) -> Any:
        # per process: made again after unpickling, over the engine at the position
        if self._device is None:
            from ..device._device import DeviceStage

            assert self.device_index is not None
            self._device = DeviceStage(self._get_engine(), self.device_index, **self._device_kw)
        return self._device

    @property
    def position(self) -> int:
        """Global stream position (in samples) of the next batch this rank will receive."""
        if self._device is not None:
            if not self._device.closed:  # the engine runs ahead by what was copied to the GPU
                self._position = self._device.position
        elif self._engine is not None and not self._engine.closed:
            self._position = self._engine.position
        return self._position

    @property
    def num_positions(self) -> Optional[int]:
        """Positions in the stream, or None when it is infinite."""
        n = self._order.num_positions
        return None if n == _INFINITE else n

    def __len__(self) -> int:
        """Batches left for this rank in a finite stream."""
        n = self.num_positions
        if n is None:
            raise TypeError("an infinite Loader (epochs=None) has no len()")
        pos = self.position
        # the steps skip_steps left out are not delivered: they do not count
        skipped: int = sum(min(stop, n) - max(start, pos)
                           for start, stop in self._order.skips() if stop > pos and start < n)
        return max(0, (n - pos - skipped) // self.global_batch)

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        n = self.num_positions
        if n is not None and not self._closed and self.position + self.global_batch > n:
            # `for epoch in range(E): for batch in loader` over epochs=1 would train on empty epochs
            warnings.warn(f"tokenfeed: this Loader's stream is exhausted (position {self.position:,} of {n:,}: "
                          f"its epochs ran out), so this loop yields no batches. To run E epochs, "
                          f"make the Loader with epochs=E and iterate it once; or with epochs=None take "
                          f"loader.num_samples // loader.global_batch batches per epoch "
                          f"(itertools.islice(loader, n)). A new Loader starts over.", UserWarning, stacklevel=2)
        if self.device_index is not None and not self._closed:
            self._get_device().start()  # copies to the GPU begin with the loop, before the first next()
        return self

    def __next__(self) -> Dict[str, Any]:
        pos = self._order.skip_to(self.position) if self._source_ids or self._loss_weights or self._excluded else 0
        if self.device_index is not None:
            dev = self._get_device()
            # from here to the hand-off mark the training stream has nothing to do but wait for
            # this batch: the GPU-clock meter counts all of it, this Python included
            stream = dev.mark_request()
            out: Dict[str, Any] = dev.next(stream)
            if self._megatron_pad is not None:
                self._rewrite_megatron_pad(out)
            if self._source_ids:
                import torch

                ids = self._source_ids_at(pos)
                out["source_ids"] = torch.from_numpy(ids) if self.output == "torch" else ids
            if self._loss_weights:
                import torch

                cu = out.get("cu_seqlens") if self.parallel.cp_size > 1 else None
                lw = self._loss_weights_at(pos, tuple(out["labels"].shape), None if cu is None else cu.cpu().numpy())
                out["loss_weights"] = torch.as_tensor(lw, device=out["labels"].device)
            out = self._with_document_ids(out)
            dev.mark_handoff(stream)
            return out
        batch: Dict[str, Any] = self._get_engine().next()
        if self._megatron_pad is not None:
            self._rewrite_megatron_pad(batch)
        if self._source_ids:
            ids = self._source_ids_at(pos)
            # a sequence-length warmup delivers each sample as k consecutive rows: each has its sample's source
            batch["source_ids"] = np.repeat(ids, batch["input_ids"].shape[0] // max(1, len(ids)))
        if self._loss_weights:
            batch["loss_weights"] = self._loss_weights_at(
                pos, tuple(batch["labels"].shape), batch.get("cu_seqlens") if self.parallel.cp_size > 1 else None)
        if self.output == "torch":
            import torch

            # THD batches also carry max_seqlen / num_seqs as ints
            batch = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in batch.items()}
        return self._with_document_ids(batch)

    def _rewrite_megatron_pad(self, batch: Dict[str, Any]) -> None:
        """What GPTDataset does with its tokenizer's pad id where the data holds it: a label equal
        to it is not trained (loss_mask 0), and the token is delivered as 0 in the inputs and the
        labels. In place, on the host or the device arrays alike."""
        p = self._megatron_pad
        dt = self.out_dtype
        if p is None or (dt.kind in "iu" and p > np.iinfo(dt).max):  # no token of this dtype can be it
            return
        hit = batch["labels"] == p
        if "loss_mask" in batch:
            batch["loss_mask"][hit] = 0
        for k in ("tokens", "input_ids", "labels"):  # input_ids and labels may be views of tokens
            a = batch.get(k)
            if a is not None:
                a[a == p] = 0

    def _with_document_ids(self, batch: Dict[str, Any]) -> Dict[str, Any]:
        if self._document_ids:
            from ..flex import document_ids

            # per row of the batch: seq_len, or a warmup's shorter rows
            batch["document_ids"] = document_ids(batch["cu_seqlens"], int(batch["input_ids"].shape[-1]))
            if self._drop_cu:
                del batch["cu_seqlens"], batch["num_seqs"]
        return batch

    def _check_loss_weights(self, lw: Any, mixture: bool, cp_size: int, thd: bool) -> Any:
        """loss_weights=: None; a weight per source of a mixture; or the name of a numeric
        metadata column holding a weight per document (docs/views.md)."""
        if lw is None:
            return None
        if isinstance(lw, str):
            return ("column", lw)
        w = np.asarray(lw, dtype=np.float64)
        if not mixture or w.ndim != 1 or not np.all(np.isfinite(w)) or np.any(w < 0):
            raise ValueError(f"loss_weights= is a column name, or one finite weight >= 0 per source of a mixture "
                             f"(weights=), got {lw!r}")
        return ("source", w.astype(np.float32))

    def _loss_weights_at(self, pos: int, shape: Tuple[int, ...],
                         cu: Any = None) -> "np.ndarray[Any, np.dtype[np.float32]]":
        """Per label of this rank's rows of the batch at ``pos``: the weight of its row's source,
        or of the document the label belongs to (1 where the column has no value; 0 for a
        separator or padding). ``cu``: the batch's cu_seqlens, in the THD layout with context
        parallelism (where a rank's labels are its share of every sequence)."""
        assert self._loss_weights is not None
        kind, arg = self._loss_weights
        pc = self.parallel
        thd = pc.cp_size > 1 and cu is not None
        # documents taken down (exclude): the engine serves their tokens as pad with loss_mask 0;
        # their labels weigh 0 here
        gone = self._excluded_at(pos) if self._excluded else {}
        if kind == "source" and not gone and not thd:
            ids = self._source_ids_at(pos)
            w = arg[np.repeat(ids, shape[0] // max(1, len(ids)))]
            return np.ascontiguousarray(np.broadcast_to(w.reshape((-1,) + (1,) * (len(shape) - 1)), shape),
                                        dtype=np.float32)
        rows = self._row_positions(pos // self.global_batch)
        segs = [self._order.segments_at(p) for p in rows]
        # the weights of whole samples (seq_len labels each), then the rows this batch cuts them into
        L = self.seq_len
        if kind == "source":
            src_w = arg[self._source_ids_at(pos)].astype(np.float32)
            out = np.repeat(src_w[:, None], L, axis=1)
        else:
            dss = self.dataset if isinstance(self.dataset, list) else [self.dataset]
            need: Dict[int, List[int]] = {}
            for row in segs:
                for src, doc, _, _, _ in row:
                    need.setdefault(src, []).append(doc)
            value: Dict[Tuple[int, int], float] = {}
            for src, docs in need.items():
                uniq = sorted(set(docs))
                cols = dss[src].columns()
                if cols.types.get(arg) not in ("int64", "float64"):
                    raise ValueError(f"loss_weights={arg!r}: {cols.path} has no number column {arg!r} "
                                     f"(columns: {', '.join(f'{k} ({v})' for k, v in cols.types.items())})")
                for d, v in zip(uniq, cols.values(arg, uniq)):
                    value[(src, d)] = 1.0 if v is None else float(v)
            out = np.zeros((len(segs), L), dtype=np.float32)
            for r, row in enumerate(segs):
                for src, doc, start, stop, offset in row:
                    # sample tokens [offset, offset + n) are the document's; label t is sample token t + 1
                    a, b = max(offset - 1, 0), min(offset + (stop - start) - 1, L)
                    if b > a:
                        out[r, a:b] = value[(src, doc)]
        for r, row in enumerate(segs):
            for src, doc, start, stop, offset in row:
                if doc in gone.get(src, ()):
                    a, b = max(offset - 1, 0), min(offset + (stop - start) - 1, L)
                    if b > a:
                        out[r, a:b] = 0
        if thd:
            out = self._thd_share(out, cu)
        elif pc.cp_size > 1:  # this context-parallel rank's share of every sample, as the engine cuts it
            a, b, c = _core.cp_chunks(L, pc.cp_size, pc.cp_rank)
            out = out[:, np.r_[a:a + c, b:b + c]]
        if out.shape != shape:  # a sequence-length warmup: each sample as consecutive rows of shape[-1]
            out = out.reshape(shape)
        return np.ascontiguousarray(out)

    def _thd_share(self, out: "np.ndarray[Any, np.dtype[np.float32]]",
                   cu: Any) -> "np.ndarray[Any, np.dtype[np.float32]]":
        """This context-parallel rank's THD entries of the whole samples' per-label values ``out``
        (rows x seq_len): each row's sequences (the batch's cu_seqlens, lengths summing to
        seq_len per row) split as the engine splits the tokens (tf_cp_thd_positions), 0 on the
        padding entries."""
        pc = self.parallel
        L = out.shape[1]
        lens = np.diff(np.asarray(cu, dtype=np.int64).reshape(-1))
        parts, k = [], 0
        for r in range(out.shape[0]):
            seg: List[int] = []
            tot = 0
            while tot < L:
                if k >= len(lens) or lens[k] <= 0 or tot + int(lens[k]) > L:
                    raise RuntimeError(f"internal: the batch's cu_seqlens do not cut row {r} into sequences of "
                                       f"{L} positions")
                seg.append(int(lens[k]))
                tot += int(lens[k])
                k += 1
            idx = np.frombuffer(_core.cp_thd_positions(seg, pc.cp_size, pc.cp_rank), dtype=np.int64)
            parts.append(np.where(idx >= 0, out[r, np.maximum(idx, 0)], np.float32(0)))
        return np.concatenate(parts).astype(np.float32) if parts else np.zeros(0, dtype=np.float32)

    # ----------------------------------------------------------- documents taken down mid-run

    def exclude(self, ids: Any, *, source: int = 0) -> None:
        """Take documents down from the next batch on: their tokens are never served again.

        ``ids`` are document ids of dataset ``source`` (as :meth:`explain` reports them; of
        the dataset a filtered view selects from). Every other document keeps its place in the
        order (as :meth:`skip_steps` keeps steps' places): a row that held an excluded
        document has that document's tokens replaced by ``pad_id`` (0 without one), with
        ``loss_mask`` and ``loss_weights`` 0 on their labels; a batch that held none is the
        batch of the run without the takedown. The exclusion is recorded in the state
        (``excluded``: ``[[position, source, [ids]], ...]``), so a resume (any world size
        dividing the global batch) serves the same stream, and :meth:`where` marks the rows
        from that step on ``excluded``. Call it on every rank with the same ids at the same
        step. The C engine blanks the rows as it assembles them (with context parallelism and
        ``device=`` too); the batches it had assembled ahead are dropped and made again."""
        dss = self.dataset if isinstance(self.dataset, list) else [self.dataset]
        if not isinstance(source, int) or isinstance(source, bool) or not 0 <= source < len(dss):
            raise ValueError(f"exclude: source must be an int in [0, {len(dss)}), got {source!r}")
        n = dss[source]._base().num_documents
        arr = np.unique(np.asarray(list(ids) if not isinstance(ids, np.ndarray) else ids))
        if arr.size and (arr.dtype.kind not in "iu" or arr.min() < 0 or arr.max() >= n):
            raise ValueError(f"exclude: ids are document ids of dataset {source} (0 to {n - 1})")
        if arr.size:
            # kept by the C order (tf_order_exclude), which writes it into the state; the loader
            # keeps a copy for rewriting rows
            pos = self.position
            self._order.exclude(pos, source, arr.astype(np.int64).tolist())
            self._sync_excluded()
            # the engine copies the order's takedowns at a seek: batches assembled ahead held them
            if self._device is not None and not self._device.closed:
                self._device.seek(pos)
            elif self._engine is not None and not self._engine.closed:
                self._engine.seek(pos)

    def _sync_excluded(self) -> None:
        """The loader's copy of the order's takedowns (after an exclude, a resume or a hand-over)."""
        self._excluded = [(int(at), int(src), np.asarray(ids, dtype=np.int64))
                          for at, src, ids in self._order.excluded()]
        self._excluded_sets = None

    def _excluded_at(self, pos: int) -> Dict[int, "set[int]"]:
        """The documents taken down at ``pos``, per source (built once per set of takedowns in
        force, not per batch: a takedown list may be long)."""
        active = tuple(k for k, (at, _, _) in enumerate(self._excluded) if pos >= at)
        cached = self._excluded_sets
        if cached is not None and cached[0] == (active, len(self._excluded)):
            return cached[1]
        out: Dict[int, set[int]] = {}
        for k in active:
            _, src, ids = self._excluded[k]
            out.setdefault(src, set()).update(ids.tolist())
        self._excluded_sets = ((active, len(self._excluded)), out)
        return out

    def _source_ids_at(self, pos: int) -> "np.ndarray[Any, np.dtype[np.int32]]":
        """The source of each of this rank's rows of the batch at global position ``pos`` (the
        rows :meth:`_row_positions` gives this rank: its slice, or the balancing rule's)."""
        rows = self._row_positions(pos // self.global_batch)
        return np.array([self._order.mix_source_at(p)[0] for p in rows], dtype=np.int32)

    def close(self) -> None:
        """Stop the worker threads (and the copies to the GPU, waiting for those in flight).
        Batches already handed out stay valid."""
        drove = self._device is not None
        if self._device is not None:
            self._position = self.position  # what the consumer received
            self._device.close()  # (in another thread's next(): closed when that wakes up)
            self._device = None
        if self._engine is not None:
            if not drove:  # else the engine may still be ahead by what was copied to the GPU
                self._position = self._engine.position
            self._engine.close()
            self._engine = None
        self._closed = True

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if self._device is not None:
                self._device.close()
            if self._engine is not None:
                self._engine.close()
        except Exception:
            pass

    def stats(self) -> Dict[str, Any]:
        """Batches, tokens, bytes read, backend in use, seconds the consumer waited, ring occupancy.

        ``zstd`` is ``None`` without compressed files, else a dict: ``cache_bytes``
        (capacity of the decompressed-block cache the workers share), ``cache_allocated``,
        ``blocks_decoded``, ``tokens_decoded``, ``tokens_used`` (copied into batches),
        ``decode_ratio`` (decoded / used so far), ``decode_model`` (predicted for this
        configuration), ``cache_hits``, ``cache_misses``, ``cache_waits`` and ``note``
        (why this configuration is slow on compressed data, or ``""``).

        With a device, ``stats()["device"]`` adds the GPU hop: ``copies_issued_ahead``
        (the fraction of batches received whose copy had been issued before ``next()``
        asked), ``wait_mean_seconds``/``wait_p99_seconds`` (the consumer's wait in
        ``next()``), ``h2d_bytes`` and ``h2d_gbps`` (copy time from CUDA events),
        ``direct_copies``/``staging_copies`` and ``engine_buffers_locked``; the engine's
        own counters then include the batches copied ahead.

        For a mixture also ``sources``: per source, what this rank's consumer received since
        the engine started (the Loader was created or restored): ``samples``, ``tokens``
        (input tokens that are not padding), ``documents`` (documents whose first token was
        among them), ``share`` (this rank's fraction of the samples), ``scheduled_share``
        (the schedule's fraction over the same global positions, all ranks together) and
        ``weight`` (the intended proportion at the current step). With a device, the counts
        include the batches copied ahead, like the engine's.
        """
        eng = self._get_engine()
        st: Dict[str, Any] = eng.stats()
        # the skipped data (skip_steps) the stream has passed, all ranks together
        pos, g = self.position, self.global_batch
        passed = sum(min(stop, pos) - start for start, stop in self._order.skips() if start < pos)
        st["skipped_steps"], st["skipped_samples"] = passed // g, passed
        if self.device_index is not None:
            st["device"] = self._get_device().stats()
        per = eng.source_stats()
        if per is not None:
            pos = self.position
            ranges = self._acct_ranges[:-1] + [(self._acct_ranges[-1][0], pos)]
            sched = [sum(self._order.mix_source_count(i, b) - self._order.mix_source_count(i, a) for a, b in ranges)
                     for i in range(len(per))]
            total, stotal = sum(p["samples"] for p in per), sum(sched)
            w = self._order_cfg.weights
            if isinstance(w, WeightSchedule):
                weight = w.proportions_at(pos / self.global_batch)
            else:
                weight = [x / sum(w or (1.0,)) for x in (w or ())]
            for i, p in enumerate(per):
                p["share"] = p["samples"] / total if total else 0.0
                p["scheduled_share"] = sched[i] / stotal if stotal else 0.0
                p["weight"] = weight[i]
            st["sources"] = per
        return st

    def _core_source(self) -> Any:
        if self._mixture:
            return [d._core for d in self.dataset]
        return self.dataset._core

    @property
    def dataset_fingerprint(self) -> str:
        """Fingerprint of the data (a mixture: of its sources' fingerprints, in order)."""
        if self._mixture:
            return f"{self._order.dataset_fingerprint:016x}"
        return str(self.dataset.fingerprint)

    def packing_stats(self) -> Dict[str, Any]:
        """Packing efficiency of one epoch of this configuration, computed in C.

        Keys: ``packing``, ``seq_len``, ``samples``, ``documents``, ``empty_documents``,
        ``token_slots`` (samples x (seq_len + 1)), ``pad_tokens``, ``padding_fraction``,
        ``documents_split`` (documents whose tokens land in more than one sample),
        ``documents_truncated`` (documents with tokens in no sample: ``document`` mode
        drops what is past ``seq_len + 1``; ``concat`` drops the tail of the stream),
        ``tokens_dropped``; for a mixture also ``weights`` (a schedule: its recorded
        dict), ``mix_window``/``mix_counts`` (the exact per-window counts in force at the
        current position) and ``sources`` (one dict per source, over its own epoch). Free
        for ``best_fit``/``document`` (gathered when the plan was built); one pass over
        the document index for ``concat``.
        """
        st: Dict[str, Any] = dict(self._order.packing_stats())
        st["packing"] = self._order_cfg.packing
        st["seq_len"] = self.seq_len
        if self._mixture:
            win, counts = self._order.mix_counts_at(self.position)
            w = self._order_cfg.weights
            st.update(weights=w.to_dict() if isinstance(w, WeightSchedule) else list(w or ()), mix_window=win,
                      mix_counts=list(counts))
        return st

    # --------------------------------------------------------------- pickling
    def __getstate__(self) -> Dict[str, Any]:
        d = self.__dict__.copy()
        d["_position"] = self.position
        d["_engine"] = None
        d["_order"] = None
        d["_live_state"] = None
        saved = json.loads(self._order.state_save(0, 1))
        if saved["weights_history"] or saved["skipped"] or saved["excluded"]:
            d["_live_state"] = self._order.state_save(d["_position"], self.world_size)
        d["_device"] = None  # device state is per process; made again where the loader is used
        return d

    def __setstate__(self, d: Dict[str, Any]) -> None:
        self.__dict__.update(d)
        self._order = self._order_cfg.build(self._core_source())
        if d.get("_live_state"):  # weights set, steps skipped, documents taken down: they come back with the state
            _, handover = self._order.state_load(d["_live_state"])
            if handover is not None:
                self._order = handover

    # ------------------------------------------------------------------ state
    def state_dict(self) -> Dict[str, Any]:
        """A small dict that resumes the exact stream (on any world size dividing the global batch).

        Written by the C library (``tf_order_state_save``; keys in ``docs/design.md``):
        always the same keys, whatever the loader went through (``mix_anchor`` is
        ``None`` unless a mixture was resumed under other weights), holding only ints,
        floats, strings, ``None`` and lists, so that ``torch.distributed.checkpoint``,
        ``torch.save``, JSON and Orbax all keep it. The loader is a ``Stateful``: pass it
        to ``dcp.save({"loader": loader})`` / ``dcp.load`` as it is.
        """
        state: Dict[str, Any] = json.loads(self._order.state_save(self.position, self.world_size))
        return state

    def load_state_dict(self, state: Mapping[str, Any], *, strict: bool = True) -> None:
        """Continue from ``state`` (from :meth:`state_dict`, possibly saved with another world size).

        A state from other data, or (with ``strict=True``) another configuration, raises
        :class:`StateError` naming what differs; a setting is compared only where it
        changes the stream. Every field is checked for its type. ``strict=False``
        deliberately accepts a changed configuration (a new seed from here on, say) and
        keeps the position; a mixture then continues each source from where it was. Another
        global batch (``batch_size x dp_size``) is refused at every position, with
        ``strict=False`` too: the position and every step number count global batches of the
        saved size (``dp_size`` may change, with ``batch_size`` keeping the product).
        """
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a dict from Loader.state_dict(), got {type(state).__name__}")
        bad = _nonfinite_key(state)
        if bad:
            raise StateError(f"the state's {bad} is NaN or an infinity, which no state holds (JSON has no such "
                             f"number): the state was edited or damaged; pass the dict Loader.state_dict() returned")
        if "config" not in state and "position" not in state:
            # a whole training checkpoint: name the entry that holds the loader's state, as
            # `tokenfeed explain --state` finds it ("loader" first), rather than guess for the caller
            inner = [k for k, v in state.items() if isinstance(v, Mapping) and "config" in v and "position" in v]
            if inner:
                key = "loader" if "loader" in inner else inner[0]
                raise StateError(f"this dict is not a loader state but holds one under {key!r} (a whole training "
                                 f"checkpoint?): pass checkpoint[{key!r}] to load_state_dict")
        try:
            text = json.dumps(state, default=_json_value, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise StateError(f"the state holds a value that is not a number, string, list or None ({e}): pass "
                             f"the dict Loader.state_dict() returned") from None
        try:
            pos, handover = self._order.state_load(text, not strict)
        except RuntimeError as e:
            raise StateError(str(e)) from None
        if handover is not None:
            self._hand_over(handover)
        self._sync_excluded()  # the state's takedowns, restored by the C library on the order that reads on
        if self._engine is not None:
            self._acct_ranges = self._acct_ranges[:-1] + [(self._acct_ranges[-1][0], self.position), (pos, pos)]
        self._position = pos
        if self._device is not None:
            self._device.seek(pos)  # drops what was copied ahead; moves the engine
        elif self._engine is not None:
            self._engine.seek(pos)

    def skip_steps(self, start: int, stop: int) -> None:
        """Leave the data of steps ``[start, stop)`` out: when the loader reaches step ``start`` it
        continues with the batch of step ``stop``.

        Steps count global batches from the start of the stream (``position // global_batch``,
        as :meth:`explain` counts them); ``start`` must not be before the step of the next batch.
        The skipped range is recorded in the state (``skipped``), so a resume, with any world
        size that divides the global batch and through ``torch.distributed.checkpoint``, skips
        the same data; ``stats()`` counts the steps skipped so far. The typical use: resume from
        the checkpoint before a loss spike and skip the steps that led to it
        (``docs/guides/loss-spikes.md``). Call it on every rank with the same steps.
        """
        for name, v in (("start", start), ("stop", stop)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"skip_steps: {name} must be an int >= 0, got {v!r}")
        pos, g = self.position, self.global_batch
        if start >= stop:
            raise ValueError(f"skip_steps: expected start < stop, got [{start}, {stop})")
        if start * g < pos:
            raise ValueError(f"skip_steps: step {start} was already delivered (the next batch is step {pos // g}); "
                             f"resume from a checkpoint taken before it, then skip")
        n = self.num_positions
        if n is not None and stop * g > n:
            raise ValueError(f"skip_steps: step {stop} is past the end of the stream ({n // g} steps)")
        if stop * g > _INFINITE:
            raise ValueError(f"skip_steps: step {stop} is past the last step a 64-bit position reaches "
                             f"({_INFINITE // g} steps of {g} samples): positions are below 2**64")
        self._order.skip(start * g, stop * g)
        if self._device is not None and not self._device.closed:
            self._device.seek(pos)  # what was copied ahead may lie in the skipped range

    def set_weights(self, weights: Sequence[float]) -> None:
        """Mix with ``weights`` (one per source, >= 0, not all 0) from the next batch on.

        Each source continues from where it was, so within a source no sample repeats and
        none is lost; a weight schedule is replaced by these constant weights. The change is
        recorded in the state (``weights_history``), so a resume, with any world size that
        divides the global batch and through ``torch.distributed.checkpoint``, continues with
        these weights whatever weights the new Loader was built with. Call it on every rank
        with the same weights at the same step (``docs/guides/online-mixing.md``).
        """
        if not self._mixture:
            raise ValueError("set_weights needs a mixture (a Loader made with weights=)")
        w = [float(x) for x in weights]
        pos = self.position
        old = self._order
        try:
            order = old.mix_set_weights(pos, w)
        except RuntimeError as e:
            raise ValueError(str(e)) from None
        # kept in the configuration too, so that a loader made again from it reads the same; the
        # anchor is where each source was at pos (as the C library found it), so that a call costs
        # the same however many changes the state lists (no state is written and read back)
        anchor = (pos, tuple(old.mix_source_count(k, pos) for k in range(len(w))))
        self._order_cfg = dataclasses.replace(self._order_cfg, weights=tuple(w))
        self._hand_over(order, anchor)
        self._position = pos

    def _hand_over(self, order: Any, anchor: Optional[Tuple[int, Tuple[int, ...]]] = None) -> None:
        """Read ``order`` from here on: this mixture with the hand-over anchor a resume needs (the
        C library found where each source was; ``anchor`` when the caller knows it, with the
        weights already in the configuration). The anchor is kept in the configuration, so a
        pickled loader rebuilds the same order."""
        if anchor is None:
            saved = json.loads(order.state_save(0, 1))
            a, history = saved["mix_anchor"], saved["weights_history"]
            anchor = None if a is None else (int(a[0]), tuple(a[1]))
            if history:  # weights set while the stream ran are the ones it reads now
                self._order_cfg = dataclasses.replace(self._order_cfg, weights=tuple(history[-1][1]))
        self._order_cfg = dataclasses.replace(self._order_cfg, mix_anchor=anchor)
        self._order = order
        # the engine (and the device stage over it) borrow the order: made again over the new one
        if self._device is not None:
            self._device.close()
            self._device = None
        if self._engine is not None:
            self._engine.close()
            self._engine = None

    def __repr__(self) -> str:
        cp = f", cp={self.cp_rank}/{self.cp_size}" if self.cp_size > 1 else ""
        return (f"tokenfeed.Loader(seq_len={self.seq_len}, batch_size={self.batch_size}, rank={self.rank}/"
                f"{self.world_size}{cp}, shuffle={self._order_cfg.shuffle!r}, seed={self._order_cfg.seed}, "
                f"position={self.position}, samples_per_epoch={self.num_samples})")

    # ------------------------------------------------------ provenance, meter
    def _row_positions(self, step: int) -> List[int]:
        """Global positions of this rank's rows of global batch ``step``, in row order.

        Its contiguous slice, or with ``balance=`` the rows the balancing rule gives it (the
        rule's step is ``balance_micro_batches`` global batches; ``docs/balance.md``): the C
        order's map (``tf_order_rank_rows``), the one the engine reads by. :meth:`explain` and
        :meth:`where` go through it and :meth:`_position_rank_row`.
        """
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ValueError(f"step: expected an int >= 0, got {step!r}")
        B = self.batch_size
        if step * self.global_batch >= self._order.num_positions:  # past the end of a finite stream
            base = step * self.global_batch + self.dp_rank * B
            return [base + r for r in range(B)]
        e = self._engine_cfg
        rows: List[int] = self._order.rank_rows(step, self.dp_size, e.setting("balance_micro_batches"),
                                                e.setting("balance"), self.dp_rank)
        return rows

    def _position_rank_row(self, pos: int) -> Tuple[int, int, int]:
        """The global batch (step), data-parallel rank and row that receive global position ``pos``
        (``tf_order_row_of``; see :meth:`_row_positions`)."""
        e = self._engine_cfg
        step, rank, row = self._order.row_of(pos, self.dp_size, e.setting("balance_micro_batches"),
                                             e.setting("balance"))
        return step, rank, row

    def explain(self, step: int, columns: Optional[Sequence[str]] = None) -> List[List["Segment"]]:
        """Which documents made ``step``'s batch on this rank: one list per row, of :class:`tokenfeed.Segment`.

        A segment is ``(source, document, start, stop)``: tokens ``[start, stop)`` of document
        ``document`` of dataset ``source`` (its index among the loader's datasets; 0 for one
        dataset), with ``offset``, where it begins in the row. Steps count global batches
        from the start of the stream (``position // global_batch``), whatever was resumed;
        a step before a :meth:`set_weights` change is explained with the weights in force
        then (the state records the first weights and every change), and one this loader
        cannot rebuild raises :class:`StateError` saying why. Computed from the order alone: no token is read and the loader is not run; the cost is
        that of one row's spans, the same at step 10 and at step 10**9. With context
        parallelism the segments are those of the whole row, which every rank of the group
        shares; each rank holds its share of it (``docs/guides/loss-spikes.md``).
        ``columns=["url", "domain"]`` sets each segment's ``meta`` to its document's values of
        those metadata columns (``docs/views.md``); document ids of a filtered dataset are
        those of the dataset it selects from.
        """
        from ..order._explain import explain

        return explain(self, step, columns)

    def where(self, document: int, *, source: int = 0,
              epochs: Union[None, int, Tuple[int, int], str] = None) -> List[Dict[str, int]]:
        """The steps of an epoch range whose batches hold tokens of ``document`` (of dataset ``source``).

        ``epochs``: ``None`` (the first), ``k``, ``(a, b)`` or ``"a:b"`` (epochs a to b-1).
        Returns one dict per row that holds the document: ``step``, ``rank`` and ``row`` (who
        receives it), ``position`` and ``epoch``, ascending. Computed by running the order
        backwards, without reading tokens or visiting the range: the samples that can hold the
        document (a few for ``concat``, its packing window's for ``best_fit``/``document``),
        then the inverse of the shuffle (and of a mixture's schedule) for each: microseconds
        to milliseconds, whatever the range.
        """
        from ..order._explain import where

        hits = where(self, document, source=source, epochs=epochs)
        for at, src, ids in self._excluded:  # taken down from step at / G on: never served there
            if src == source and document in ids:
                for h in hits:
                    if h["position"] >= at:
                        h["excluded"] = 1
        return hits

    def meter(self, window: Optional[int] = None, *, prefix: str = "") -> Dict[str, Union[int, float]]:
        """The data-wait meter over the last ``window`` batches (None: all kept, at most 4096): a flat dict
        of numbers for a logger, keys prefixed with ``prefix`` (``"data/"``, say).

        ``wait_fraction`` (and ``wait_percent``): the share of the consumer's wall time spent
        waiting in ``next()`` for data: the host loop's, or with ``device="cuda"`` its wait
        for a batch whose copy to the GPU has been issued. ``wait_p50_seconds``,
        ``wait_p99_seconds``, ``wait_max_seconds``: per-batch waits. ``ready_ahead_mean`` and
        ``ready_ahead_min``: batches already assembled (or copied) behind the one delivered.
        ``window_seconds``, ``wait_seconds``, ``batches`` (in the window), ``total_batches``,
        ``num_threads`` and ``prefetch``. With ``device="cuda"`` and torch, the same figures read on
        the GPU's clock, keys ``gpu_*`` (``gpu_wait_fraction``, ``gpu_wait_percent``,
        ``gpu_wait_p50_seconds``, ``gpu_wait_p99_seconds``, ``gpu_wait_max_seconds``,
        ``gpu_wait_seconds``, ``gpu_window_seconds``, ``gpu_batches``, ``gpu_total_batches``,
        ``gpu_startup_seconds``, ``gpu_pending``): how long torch's current stream stood still at
        each hand-off waiting for the batch's copy, and its share of the GPU's time, measured with
        CUDA events and read when they have completed, a step or so later (``gpu_pending``
        hand-offs not yet); the host's wait cannot see a GPU idling while the host loop runs
        ahead of it (docs/performance.md, "Which wait to trust"). The first batch waits for the engine to start: its
        wait is ``startup_seconds``, kept out of the window, which measures the steady state
        (the window holds the batches after the first). Timed in C where the wait happens; reading it costs
        a few microseconds. :func:`tokenfeed.meter_verdict` says it in one line, and
        :func:`tokenfeed.meter_all_ranks` gathers it over ranks.
        """
        from ..order._explain import meter

        return meter(self, window, prefix)
