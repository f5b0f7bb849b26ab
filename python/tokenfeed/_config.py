"""One configuration of the stream and the engine, checked once.

:class:`OrderConfig` is everything that decides the global stream of samples (see
``docs/order.md``): it yields the ``config`` recorded in a loader state and the
arguments of the C order, which it builds once (:meth:`OrderConfig.build`).
:class:`EngineConfig` is how this rank's batches are assembled: batch size, rank,
output dtype and extras, threads and read backend; it never changes which tokens a
rank receives (apart from the global batch it implies).

Both are shared by :class:`tokenfeed.Loader` and :mod:`tokenfeed.torch`. They check
what only Python knows (types, names such as ``packing="best_fit"``, ``epochs=None``
for an endless stream, the rank against the world size that the global batch comes
from); the C library checks ranges and consistency when the order and the engine are
built, with messages naming the setting. Nothing is checked twice.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence, Tuple, Union

import numpy as np

from . import _core
from ._mesh import parallel_coords
from ._schedule import WeightSchedule, as_schedule

__all__ = ["OrderConfig", "EngineConfig", "resolve_rank", "want_bits"]

SHUFFLE = {"none": _core.SHUFFLE_NONE, "full": _core.SHUFFLE_FULL, "block": _core.SHUFFLE_BLOCK}
PACKING = {"concat": _core.PACK_CONCAT, "best_fit": _core.PACK_BEST_FIT, "document": _core.PACK_DOCUMENT}
BALANCE = {None: _core.BALANCE_NONE, "tokens": _core.BALANCE_TOKENS, "attention": _core.BALANCE_ATTENTION}


def check_int(name: str, v: Any, optional: bool = False) -> None:
    """Refuse floats, strings and bools where an int is meant (int() would convert them silently)."""
    if v is None and optional:
        return
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{name} must be an int{' or None' if optional else ''}, not {type(v).__name__} ({v!r})")


def _int(v: Any) -> Any:
    return None if v is None else int(v)


@dataclass(frozen=True)
class OrderConfig:
    """The settings that define the global stream (the loader state's ``config``).

    ``shuffle`` takes ``True``/``False`` or ``"full"``/``"block"``/``"none"`` and is
    kept as the name. ``weights`` makes the order a mixture of as many datasets: plain
    weights, or a :class:`WeightSchedule` (also given as a list of ``(step, weights)``
    pairs or its recorded dict). ``global_batch`` is samples per step over all ranks;
    ``epochs=None`` is endless. ``mix_anchor`` (position, per-source counts) is the
    hand-over point of a resume under another schedule: the saved state carries it,
    it is not part of the state's ``config``.
    """

    seq_len: int
    seed: int = 0
    shuffle: Union[bool, str] = True
    block_size: int = 1024
    window_blocks: int = 16
    separator_id: Optional[int] = None
    packing: str = "concat"
    pad_id: Optional[int] = None
    pack_window: int = 1024
    weights: Optional[Any] = None
    mix_window: int = 1000
    global_batch: int = 1
    epochs: Optional[int] = None
    mix_anchor: Optional[Tuple[int, Tuple[int, ...]]] = None

    def __post_init__(self) -> None:
        for name in ("seq_len", "seed", "block_size", "window_blocks", "pack_window", "mix_window", "global_batch"):
            check_int(name, getattr(self, name))
        for name in ("separator_id", "pad_id", "epochs"):
            check_int(name, getattr(self, name), optional=True)
        if isinstance(self.shuffle, bool):
            shuffle = "full" if self.shuffle else "none"
        elif isinstance(self.shuffle, str) and self.shuffle in SHUFFLE:
            shuffle = self.shuffle
        else:
            raise ValueError(f"shuffle must be True, False, 'full', 'block' or 'none', got {self.shuffle!r}")
        if self.packing not in PACKING:
            raise ValueError(f"packing must be 'concat', 'best_fit' or 'document', got {self.packing!r}")
        if self.epochs is not None and self.epochs < 1:
            # C reads 0 as "endless"; here that is None, so 0 is a mistake
            raise ValueError(f"epochs must be None (endless) or a positive int, got {self.epochs!r}")
        weights: Any = None
        if self.weights is not None:
            plain, sched = as_schedule(self.weights)
            weights = tuple(plain) if plain is not None else sched
        anchor = None
        if self.mix_anchor is not None:
            apos, acounts = self.mix_anchor
            anchor = (int(apos), tuple(int(c) for c in acounts))
        # canonical values: plain ints and names, so that states compare and serialise
        canon = dict(shuffle=shuffle, weights=weights, mix_anchor=anchor, separator_id=_int(self.separator_id),
                     pad_id=_int(self.pad_id), epochs=_int(self.epochs))
        canon.update({k: int(getattr(self, k)) for k in ("seq_len", "seed", "block_size", "window_blocks",
                                                          "pack_window", "mix_window", "global_batch")})
        for k, v in canon.items():
            object.__setattr__(self, k, v)

    def state(self) -> Dict[str, Any]:
        """The ``config`` of a loader state: everything that changes the stream. Settings a
        mode does not use are left out (a concat state has no ``pad_id``), so states
        saved before a mode existed still match."""
        cfg: Dict[str, Any] = {
            "packing": self.packing, "seq_len": self.seq_len, "separator_id": self.separator_id,
            "seed": self.seed, "shuffle": self.shuffle, "block_size": self.block_size,
            "window_blocks": self.window_blocks, "global_batch": self.global_batch, "epochs": self.epochs,
        }
        if self.packing != "concat":
            cfg["pad_id"] = 0 if self.pad_id is None else self.pad_id
        if self.packing == "best_fit":
            cfg["pack_window"] = self.pack_window
        if isinstance(self.weights, WeightSchedule):
            cfg["weights"] = self.weights.to_dict()
            cfg["mix_window"] = self.mix_window
        elif self.weights is not None:
            cfg["weights"] = list(self.weights)
            cfg["mix_window"] = self.mix_window
        return cfg

    @property
    def num_sources(self) -> int:
        """Datasets mixed (1 without weights)."""
        if isinstance(self.weights, WeightSchedule):
            return self.weights.num_sources
        return 1 if self.weights is None else len(self.weights)

    @classmethod
    def from_state(cls, config: Dict[str, Any], mix_anchor: Any = None) -> "OrderConfig":
        """The configuration a loader state's ``config`` (and ``mix_anchor``) was saved with."""
        keys = ("seq_len", "seed", "shuffle", "block_size", "window_blocks", "separator_id", "packing", "pad_id",
                "pack_window", "weights", "mix_window", "global_batch", "epochs")
        kw = {k: config[k] for k in keys if k in config}
        anchor = None
        if mix_anchor is not None:
            anchor = (int(mix_anchor["position"]), tuple(int(c) for c in mix_anchor["counts"]))
        return cls(mix_anchor=anchor, **kw)

    def core_kwargs(self) -> Dict[str, Any]:
        """Keyword arguments of ``_core.Order``."""
        kw: Dict[str, Any] = dict(
            seq_len=self.seq_len, seed=self.seed, shuffle=SHUFFLE[str(self.shuffle)], block_size=self.block_size,
            window_blocks=self.window_blocks, global_batch=self.global_batch, epochs=self.epochs or 0,
            separator_id=self.separator_id, packing=PACKING[self.packing],
            pad_id=0 if self.pad_id is None else self.pad_id, pack_window=self.pack_window)
        if isinstance(self.weights, WeightSchedule):
            kw.update(weights=[list(w) for w in self.weights.weights], schedule_steps=list(self.weights.steps),
                      interpolation=1 if self.weights.interpolation == "linear" else 0, mix_window=self.mix_window)
            if self.mix_anchor is not None:
                kw.update(anchor_position=self.mix_anchor[0], anchor_counts=list(self.mix_anchor[1]))
        elif self.weights is not None:
            kw.update(weights=list(self.weights), mix_window=self.mix_window)
            if self.mix_anchor is not None:
                # plain weights handed over from other weights: a one-point schedule with the anchor
                kw.update(weights=[list(self.weights)], schedule_steps=[0], interpolation=0,
                          anchor_position=self.mix_anchor[0], anchor_counts=list(self.mix_anchor[1]))
        return kw

    def build(self, source: Any) -> Any:
        """The C order over ``source`` (a ``_core.Dataset``, or a list of them for a mixture)."""
        return _core.Order(source, **self.core_kwargs())


def want_bits(position_ids: bool = False, cu_seqlens: bool = False, loss_mask: bool = False) -> int:
    """The engine's WANT_* bits for the per-sample extras asked for."""
    return ((_core.WANT_POSITION_IDS if position_ids else 0) | (_core.WANT_CU_SEQLENS if cu_seqlens else 0)
            | (_core.WANT_LOSS_MASK if loss_mask else 0))


@dataclass(frozen=True)
class EngineConfig:
    """How this rank's batches are assembled: ``batch_size`` samples per rank, output
    ``dtype``, the extras asked for, worker threads, ring depth, read backend and the
    size of the zstd block cache (``None`` means the engine's default). ``rank``/``world_size``
    are the data-parallel rank and size; ``cp_rank``/``cp_size`` the context-parallel ones:
    the rank's load-balanced share of every sample (docs/packing.md), which never changes
    the stream."""

    batch_size: int
    rank: int = 0
    world_size: int = 1
    dtype: Any = "int64"
    position_ids: bool = False
    cu_seqlens: bool = False
    loss_mask: bool = False
    num_threads: Optional[int] = None
    prefetch: Optional[int] = None
    backend: Optional[str] = None
    direct_io: bool = False
    zstd_cache_bytes: Optional[int] = None  # decompressed zstd blocks; None: sized from the shuffle
    cp_rank: int = 0
    cp_size: int = 1
    balance: Optional[str] = None  # which rows of a step each rank takes (docs/balance.md)
    balance_micro_batches: int = 1
    warmup_steps: int = 0  # sequence-length warmup (docs/balance.md); 0: none
    warmup_min_seq_len: Optional[int] = None

    def __post_init__(self) -> None:
        for name in ("batch_size", "rank", "world_size", "cp_rank", "cp_size", "balance_micro_batches",
                     "warmup_steps"):
            check_int(name, getattr(self, name))
        check_int("warmup_min_seq_len", self.warmup_min_seq_len, optional=True)
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0 (0: no warmup), got {self.warmup_steps}")
        if self.warmup_steps and self.warmup_min_seq_len is None:
            raise ValueError("warmup_steps needs warmup_min_seq_len: the row length at step 0 (seq_len / 2^m)")
        if self.balance not in BALANCE:
            raise ValueError(f"balance must be None, 'tokens' or 'attention', got {self.balance!r}")
        if self.balance_micro_batches < 1:
            raise ValueError(f"balance_micro_batches must be >= 1 (batches per optimizer step), "
                             f"got {self.balance_micro_batches}")
        for name in ("num_threads", "prefetch", "zstd_cache_bytes"):
            check_int(name, getattr(self, name), optional=True)
        if self.zstd_cache_bytes is not None and self.zstd_cache_bytes < 0:
            raise ValueError(f"zstd_cache_bytes must be >= 0 (0 or None: sized from the shuffle), "
                             f"got {self.zstd_cache_bytes}")
        # the global batch and the rank's slice of it are computed here
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank={self.rank}, world_size={self.world_size}")
        if self.cp_size < 1 or not 0 <= self.cp_rank < self.cp_size:
            raise ValueError(f"need 0 <= cp_rank < cp_size, got cp_rank={self.cp_rank}, cp_size={self.cp_size}")
        object.__setattr__(self, "dtype", np.dtype(self.dtype).name)
        for k in ("batch_size", "rank", "world_size", "cp_rank", "cp_size", "balance_micro_batches"):
            object.__setattr__(self, k, int(getattr(self, k)))

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.world_size

    @property
    def want(self) -> int:
        return want_bits(self.position_ids, self.cu_seqlens, self.loss_mask)

    def core_kwargs(self) -> Dict[str, Any]:
        """Keyword arguments of ``_core.Loader``."""
        return dict(batch_size=self.batch_size, rank=self.rank, world_size=self.world_size, dtype=self.dtype,
                    want=self.want, num_threads=self.num_threads or 0, prefetch=self.prefetch or 0,
                    backend=self.backend, direct_io=bool(self.direct_io),
                    zstd_cache_bytes=int(self.zstd_cache_bytes or 0), cp_rank=self.cp_rank, cp_size=self.cp_size,
                    balance=BALANCE[self.balance], balance_micro_batches=self.balance_micro_batches,
                    warmup_steps=self.warmup_steps, warmup_min_seq_len=int(self.warmup_min_seq_len or 0))

    def build(self, order: Any) -> Any:
        """The C engine over ``order`` (a ``_core.Order`` whose global batch is this one's)."""
        return _core.Loader(order, **self.core_kwargs())


def resolve_rank(rank: Optional[int], world_size: Optional[int]) -> Tuple[int, int]:
    """The data-parallel ``rank``/``world_size`` as given, else from ``torch.distributed`` when
    initialised, else from the ``RANK``/``WORLD_SIZE`` environment variables, else 0/1 (see
    :func:`tokenfeed.parallel_coords` for meshes and context parallelism)."""
    pc = parallel_coords(rank=rank, world_size=world_size)
    return pc.dp_rank, pc.dp_size
