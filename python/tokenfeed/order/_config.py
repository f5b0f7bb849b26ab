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

import os

from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from .. import _core
from ..common._warnings import renamed
from ._mesh import parallel_coords
from ._schedule import WeightSchedule, as_schedule

__all__ = ["OrderConfig", "EngineConfig", "SETTINGS", "check_settings", "keyword_default", "renamed", "resolve_rank",
           "settings_given", "split_settings", "want_bits"]

# The C library's settings table (tokenfeed.h, "Settings"): one row per setting of the
# order, the engine and the device stage, by name.
SETTINGS: Dict[str, Dict[str, Any]] = {row["name"]: dict(row) for row in _core.settings()}

SHUFFLE = {"none": _core.SHUFFLE_NONE, "full": _core.SHUFFLE_FULL, "block": _core.SHUFFLE_BLOCK}
PACKING = {"concat": _core.PACK_CONCAT, "best_fit": _core.PACK_BEST_FIT, "document": _core.PACK_DOCUMENT}


def check_int(name: str, v: Any, optional: bool = False) -> None:
    """Refuse floats, strings and bools where an int is meant (int() would convert them silently)."""
    if v is None and optional:
        return
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{name} must be an int{' or None' if optional else ''}, not {type(v).__name__} ({v!r})")


def check_settings(**values: Any) -> None:
    """Check values against their rows of the settings table (type, then bounds; ``None`` is
    the default), for the few settings Python must check before the C library sees them."""
    for name, v in values.items():
        row = SETTINGS[name]
        if v is None:
            continue
        if row["type"] == "bool":
            if not isinstance(v, bool):
                raise TypeError(f"{name} must be True or False, got {v!r}")
        elif row["type"] == "enum":
            if v not in row["names"]:
                raise ValueError(f"{name} must be one of {row['names']}, got {v!r}")
        else:
            check_int(name, v, optional=row["nullable"])
            if not row["min"] <= v <= row["max"]:
                raise ValueError(f"{name}: expected {row['min']} <= {name} <= {row['max']}, got {v}")


# Rows a caller does not pass as such: the global batch comes from batch_size and the
# data-parallel size; the ranks and sizes are the Loader's own keywords (or a mesh's).
_NOT_KEYWORDS = {"global_batch", "batch_size", "dp_rank", "dp_size", "cp_rank", "cp_size"}


def keyword_default(row: Mapping[str, Any]) -> Any:
    """The default a signature writes for a row of the settings table: None for a nullable
    row (None: the row's default), else the default itself (an enum by its name)."""
    if row["nullable"]:
        return None
    if row["type"] == "enum":
        return row["names"][row["default"]]
    return bool(row["default"]) if row["type"] == "bool" else int(row["default"])


def settings_given(values: Mapping[str, Any], names: Sequence[str]) -> Dict[str, Any]:
    """Of a signature's settings keywords (``names``, with their values as given), those that
    differ from the default the signature shows: what the caller set. A value of another
    type than the default (``seed=False``) counts as set, so its row refuses it."""
    out: Dict[str, Any] = {}
    for k in names:
        v, d = values[k], keyword_default(SETTINGS[k])
        if v is d or (type(v) is type(d) and v == d):
            continue
        out[k] = v
    return out


def split_settings(settings: Dict[str, Any], where: str,
                   scopes: Tuple[str, ...] = ("order", "engine", "device")) -> Tuple[Dict[str, Any], ...]:
    """Keywords that are rows of the settings table, by scope (one dict per scope of
    ``scopes``); any other is a TypeError, as Python reports an unknown keyword."""
    out: Tuple[Dict[str, Any], ...] = tuple({} for _ in scopes)
    for k, v in settings.items():
        row = SETTINGS.get(k)
        if row is None or k in _NOT_KEYWORDS or row["scope"] not in scopes:
            raise TypeError(f"{where}() got an unexpected keyword argument '{k}'")
        out[scopes.index(row["scope"])][k] = v
    return out


def _int(v: Any) -> Any:
    return None if v is None else int(v)


@dataclass(frozen=True)
class OrderConfig:
    """The settings that define the global stream (the C library records them in a loader state).

    ``shuffle`` takes ``True``/``False`` or ``"full"``/``"block"``/``"none"`` and is
    kept as the name. ``weights`` makes the order a mixture of as many datasets: plain
    weights, or a :class:`WeightSchedule` (also given as a list of ``(step, weights)``
    pairs or its recorded dict). ``global_batch`` is samples per step over all ranks;
    ``epochs=None`` is endless. ``mix_anchor`` (position, per-source counts) is the
    hand-over point of a resume under another schedule (the C library finds it; the
    state carries it). ``order`` is ``"tokenfeed"`` or another loader's order to continue
    its run (``"llmc"``, with ``llmc_processes``; ``"olmo"``, with ``olmo_chunk``;
    ``"megatron"``, Megatron-core's GPTDataset read from its index cache: ``megatron_cache``,
    its ``path_to_cache`` or one of the cache's files, ``megatron_split`` the split whose
    cache a directory holds, ``megatron_add_extra_token`` the GPTDatasetConfig option
    ``add_extra_token_to_sequence`` it was built with: docs/order.md).
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
    order: str = "tokenfeed"
    llmc_processes: Optional[int] = None
    olmo_chunk: Optional[int] = None
    megatron_cache: Optional[str] = None
    megatron_split: str = "train"
    megatron_add_extra_token: bool = True

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
        if self.megatron_cache is not None:
            # a path (str or os.PathLike) is kept as str: the C order reads it
            object.__setattr__(self, "megatron_cache", os.fspath(self.megatron_cache))
            if not isinstance(self.megatron_cache, str):
                raise TypeError(f"megatron_cache must be a path (str or os.PathLike), got {self.megatron_cache!r}")
            if self.order == "tokenfeed":  # megatron_cache= alone means order="megatron"
                object.__setattr__(self, "order", "megatron")
            elif self.order != "megatron":
                raise ValueError(f"megatron_cache= is Megatron's order: it does not combine with order={self.order!r}")
        if self.order == "megatron":
            if self.megatron_cache is None:
                raise ValueError("order='megatron' reads Megatron-core's GPTDataset index cache: pass megatron_cache= "
                                 "(its path_to_cache, --data-cache-path, or one of the cache's files)")
            if self.weights is not None:
                raise ValueError("order='megatron' reads one dataset in the order Megatron's cache holds: no weights=")
            # the cache holds Megatron's own shuffle: shuffle=True (the default), "full" or False
            # read it as it is; a block shuffle cannot apply
            if shuffle == "block":
                raise ValueError("order='megatron' reads Megatron's own shuffle: shuffle='block' cannot apply")
            shuffle = "none"
            object.__setattr__(self, "shuffle", shuffle)
            if self.packing != "concat" or self.separator_id is not None or self.pad_id:
                raise ValueError("order='megatron' takes the samples and their order from Megatron's cache: leave "
                                 "packing, separator_id and pad_id unset (packing='concat')")
        check_settings(order=self.order, llmc_processes=self.llmc_processes, olmo_chunk=self.olmo_chunk,
                       megatron_split=self.megatron_split, megatron_add_extra_token=self.megatron_add_extra_token)
        if self.order != "tokenfeed" and self.weights is not None:
            raise ValueError(f"order={self.order!r} reads one dataset as that loader does, not a mixture (weights=)")
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
                     pad_id=_int(self.pad_id), epochs=_int(self.epochs), llmc_processes=_int(self.llmc_processes),
                     olmo_chunk=_int(self.olmo_chunk))
        canon.update({k: int(getattr(self, k)) for k in ("seq_len", "seed", "block_size", "window_blocks",
                                                          "pack_window", "mix_window", "global_batch")})
        for k, v in canon.items():
            object.__setattr__(self, k, v)

    @property
    def num_sources(self) -> int:
        """Datasets mixed (1 without weights)."""
        if isinstance(self.weights, WeightSchedule):
            return self.weights.num_sources
        return 1 if self.weights is None else len(self.weights)

    def core_kwargs(self) -> Dict[str, Any]:
        """Keyword arguments of ``_core.Order``."""
        kw: Dict[str, Any] = dict(
            seq_len=self.seq_len, seed=self.seed, shuffle=SHUFFLE[str(self.shuffle)], block_size=self.block_size,
            window_blocks=self.window_blocks, global_batch=self.global_batch, epochs=self.epochs or 0,
            separator_id=self.separator_id, packing=PACKING[self.packing], mix_window=self.mix_window,
            pad_id=0 if self.pad_id is None else self.pad_id, pack_window=self.pack_window, order=self.order,
            llmc_processes=self.llmc_processes, olmo_chunk=self.olmo_chunk)
        if self.order == "megatron":
            kw.update(megatron_cache=self.megatron_cache, megatron_split=self.megatron_split,
                      megatron_add_extra_token=self.megatron_add_extra_token)
        if isinstance(self.weights, WeightSchedule):
            kw.update(weights=[list(w) for w in self.weights.weights], schedule_steps=list(self.weights.steps),
                      interpolation=1 if self.weights.interpolation == "linear" else 0)
            if self.mix_anchor is not None:
                kw.update(anchor_position=self.mix_anchor[0], anchor_counts=list(self.mix_anchor[1]))
        elif self.weights is not None:
            kw.update(weights=list(self.weights))
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


# The engine rows EngineConfig holds as fields of its own: the batch size, and the
# data-parallel and context-parallel coordinates (the Loader's keywords, or a mesh's).
_ENGINE_FIELDS = {"batch_size": "batch_size", "dp_rank": "rank", "dp_size": "world_size", "cp_rank": "cp_rank",
                  "cp_size": "cp_size"}


@dataclass(frozen=True)
class EngineConfig:
    """How this rank's batches are assembled: ``batch_size`` samples per rank, output
    ``dtype`` and the extras asked for; ``rank``/``world_size`` are the data-parallel rank
    and size, ``cp_rank``/``cp_size`` the context-parallel ones: the rank's load-balanced
    share of every sample (docs/packing.md), which never changes the stream.
    ``settings`` holds every other engine row of the settings table given by name
    (threads, ring depth, read backend, zstd cache, balancing, sequence-length warmup,
    and any row added later; ``None`` or absent is the row's default): all of them go to
    the C engine as they are, so no row is picked out, and none can be left behind."""

    batch_size: int
    rank: int = 0
    world_size: int = 1
    dtype: Any = "int64"
    position_ids: bool = False
    cu_seqlens: bool = False
    loss_mask: bool = False
    cp_rank: int = 0
    cp_size: int = 1
    settings: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("batch_size", "rank", "world_size", "cp_rank", "cp_size"):
            check_int(name, getattr(self, name))
        settings = dict(self.settings)
        for k in settings:
            row = SETTINGS.get(k)
            if row is None or row["scope"] != "engine" or k in _ENGINE_FIELDS:
                raise TypeError(f"EngineConfig: {k!r} is not an engine setting of its own (the engine rows of "
                                f"tokenfeed._core.settings(), less {', '.join(_ENGINE_FIELDS)})")
        check_settings(**settings)  # the zstd cache's bytes >= 0, ... : the rows' bounds
        object.__setattr__(self, "settings", settings)  # a copy: the caller's dict may change
        # the global batch and the rank's slice of it are computed here
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank={self.rank}, world_size={self.world_size}")
        if self.cp_size < 1 or not 0 <= self.cp_rank < self.cp_size:
            raise ValueError(f"need 0 <= cp_rank < cp_size, got cp_rank={self.cp_rank}, cp_size={self.cp_size}")
        object.__setattr__(self, "dtype", np.dtype(self.dtype).name)
        for k in ("batch_size", "rank", "world_size", "cp_rank", "cp_size"):
            object.__setattr__(self, k, int(getattr(self, k)))

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.world_size

    def setting(self, name: str) -> int:
        """The value the C engine holds for the setting field ``name`` (a row of the settings
        table): ``None`` is the row's none value or default, an enum's name its index."""
        row = SETTINGS[name]
        v = getattr(self, _ENGINE_FIELDS[name]) if name in _ENGINE_FIELDS else self.settings.get(name)
        if v is None:
            return int(row["none_value"] if row["nullable"] else row["default"])
        return row["names"].index(v) if row["type"] == "enum" else int(v)

    @property
    def want(self) -> int:
        return want_bits(self.position_ids, self.cu_seqlens, self.loss_mask)

    def core_kwargs(self) -> Dict[str, Any]:
        """Keyword arguments of ``_core.Loader``."""
        return dict(self.settings, batch_size=self.batch_size, dp_rank=self.rank, dp_size=self.world_size,
                    cp_rank=self.cp_rank, cp_size=self.cp_size, dtype=self.dtype, want=self.want)

    def build(self, order: Any) -> Any:
        """The C engine over ``order`` (a ``_core.Order`` whose global batch is this one's)."""
        return _core.Loader(order, **self.core_kwargs())


def resolve_rank(rank: Optional[int], world_size: Optional[int]) -> Tuple[int, int]:
    """The data-parallel ``rank``/``world_size`` as given, else from ``torch.distributed`` when
    initialised, else from the ``RANK``/``WORLD_SIZE`` environment variables, else 0/1 (see
    :func:`tokenfeed.parallel_coords` for meshes and context parallelism)."""
    pc = parallel_coords(rank=rank, world_size=world_size)
    return pc.dp_rank, pc.dp_size
