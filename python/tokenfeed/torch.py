"""PyTorch adapters: use tokenfeed's order inside ``torch.utils.data.DataLoader``.

The :class:`tokenfeed.Loader` is the fast path (C threads, no per-sample Python).
These adapters exist for code that must go through a ``DataLoader``:

- :class:`TokenDataset` (map-style): global stream position -> sample.
- :class:`ResumableSampler`: yields this rank's global positions, batch by batch,
  exactly as the Loader partitions them; ``state_dict``/``load_state_dict`` make
  ``torchdata``'s ``StatefulDataLoader`` resume exactly.
- :class:`TokenBatches` (iterable, for ``batch_size=None``): whole batches assembled in
  C, split across DataLoader workers deterministically.

``DataLoader(TokenDataset(ds, seq_len=L, seed=s), sampler=ResumableSampler(ds_or_n,
batch_size=B, ...), batch_size=B, num_workers=K)`` yields the same ``input_ids`` and
``labels`` as ``Loader(ds, seq_len=L, batch_size=B, seed=s, ...)``.
"""
from __future__ import annotations

import inspect
import secrets
import threading
import warnings
import weakref
from typing import Any, Dict, Iterator, Literal, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch.utils.data import Dataset as _TorchDataset
from torch.utils.data import IterableDataset, Sampler, get_worker_info

from . import _core
from .order._config import SETTINGS, OrderConfig, settings_given, split_settings, want_bits
from .sources._dataset import Dataset, PathLike, open as _open
from .engine._loader import Loader
from .common._warnings import PerformanceWarning
from .order._mesh import DEFAULT_CP_DIM, DEFAULT_DP_DIMS, ParallelCoords, parallel_coords

# Rows of the order's settings that TokenDataset's signature writes by hand; the rest are
# written out from the settings table between the marker lines of its signature
# (tests/gen_signatures.py).
SETTINGS_BY_HAND = ("seq_len", "shuffle", "global_batch")
TOKEN_DATASET_SETTINGS = tuple(n for n, r in SETTINGS.items() if r["scope"] == "order" and n not in SETTINGS_BY_HAND)

__all__ = ["TokenDataset", "ResumableSampler", "TokenBatches"]


class TokenDataset(_TorchDataset):  # type: ignore[type-arg]
    """Map-style dataset: item ``p`` is the sample at global stream position ``p``.

    Positions run past the end of an epoch into the next (reshuffled) epoch, exactly
    like :class:`tokenfeed.Loader`. ``len()`` is the number of samples in one epoch.
    Items are dicts of 1-D tensors: ``input_ids``, ``labels`` (and ``position_ids``,
    ``cu_seqlens``, ``loss_mask`` when asked for), so the default collate stacks them
    into the Loader's batch shapes. With ``cp_size > 1`` an item is context-parallel rank
    ``cp_rank``'s share of the sample (chunks ``cp_rank`` and ``2*cp_size-1-cp_rank``,
    as the Loader splits it; ``cu_seqlens`` is not available there: use the Loader's THD
    layout).
    """

    def __init__(self, dataset: Union[Dataset, PathLike], *, seq_len: int, shuffle: Union[bool, str] = True,
                 position_ids: bool = False, cu_seqlens: bool = False, loss_mask: bool = False, dtype: Any = "int64",
                 cp_rank: int = 0, cp_size: int = 1,
                 # BEGIN settings keywords of TokenDataset (tests/gen_signatures.py writes this block)
                 packing: Literal["concat", "best_fit", "document"] = "concat", separator_id: Optional[int] = None,
                 seed: int = 0, block_size: int = 1024, window_blocks: int = 16, epochs: Optional[int] = None,
                 pad_id: int = 0, pack_window: int = 1024, mix_window: int = 1000,
                 order: Literal["tokenfeed", "llmc", "olmo", "megatron"] = "tokenfeed",
                 llmc_processes: Optional[int] = None, olmo_chunk: Optional[int] = None,
                 megatron_cache: Optional[str] = None, megatron_split: Literal["train", "valid", "test"] = "train",
                 megatron_add_extra_token: bool = True,
                 # END settings keywords of TokenDataset
                 ) -> None:
        # the Loader's configuration of the stream (the order's rows of the settings table:
        # seed, separator_id, packing, pad_id, ...), with a global batch of one sample
        (order_kw,) = split_settings(settings_given(locals(), TOKEN_DATASET_SETTINGS), "TokenDataset", ("order",))
        self._cfg = OrderConfig(seq_len=seq_len, shuffle=shuffle, **order_kw)
        self.dataset = dataset if isinstance(dataset, Dataset) else _open(dataset)
        self.seq_len = self._cfg.seq_len
        self._want = want_bits(position_ids, cu_seqlens, loss_mask)
        self._dtype = np.dtype(dtype).name
        self._order: Any = self._cfg.build(self.dataset._core)
        self.num_samples: int = self._order.num_samples
        self._told_workers = False
        pc = ParallelCoords(0, 1, cp_rank, cp_size)
        self._cp_index: Optional[np.ndarray[Any, Any]] = None
        if pc.cp_size > 1:
            if cu_seqlens:
                raise ValueError("cu_seqlens with cp_size > 1 is the THD layout of a whole batch: use "
                                 "tokenfeed.Loader or TokenBatches")
            # the engine's split of every sample (tf_cp_chunks), so both cut it alike
            a, b, c = _core.cp_chunks(self.seq_len, pc.cp_size, pc.cp_rank)
            self._cp_index = np.r_[a:a + c, b:b + c]

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, position: int) -> Dict[str, torch.Tensor]:
        if position < 0:
            raise IndexError(f"position must be >= 0, got {position}")
        if not self._told_workers and get_worker_info() is not None:
            self._told_workers = True  # once per worker process
            warnings.warn(PerformanceWarning(
                "tokenfeed.torch.TokenDataset in a DataLoader worker: samples are read one by one and every "
                "collated batch crosses to the training process as a new shared-memory tensor, which is slower "
                "than num_workers=0. For whole batches from tokenfeed's C engine use TokenBatches "
                "(DataLoader(TokenBatches(...), batch_size=None)) or tokenfeed.Loader (docs/guides/dataloader.md)"),
                stacklevel=2)
        sample = self._order.sample_at(int(position))
        d = self._order.fill(sample, dtype=self._dtype, want=self._want)
        tok = torch.from_numpy(d.pop("tokens"))
        if self._cp_index is not None:  # this CP rank's share: the Loader's split, per sample
            idx = torch.from_numpy(self._cp_index)
            out = {"input_ids": tok[idx], "labels": tok[idx + 1]}
            out.update({k: torch.from_numpy(np.asarray(v))[idx] for k, v in d.items()})
            return out
        out = {"input_ids": tok[:-1], "labels": tok[1:]}
        if "num_seqs" in d:
            d["num_seqs"] = d["num_seqs"][0]
        out.update({k: torch.from_numpy(np.asarray(v)) for k, v in d.items()})
        return out

    def __getstate__(self) -> Dict[str, Any]:
        st = self.__dict__.copy()
        st["_order"] = None
        return st

    def __setstate__(self, st: Dict[str, Any]) -> None:
        self.__dict__.update(st)
        self._order = self._cfg.build(self.dataset._core)


class ResumableSampler(Sampler[int]):
    """This rank's global positions, ``batch_size`` at a time, in the Loader's order.

    Global batch ``b`` is positions ``[b*G, (b+1)*G)`` with ``G = batch_size *
    world_size``; data-parallel rank ``r`` takes ``[b*G + r*B, b*G + (r+1)*B)``. The
    data-parallel rank and size come from ``device_mesh`` (as for :class:`tokenfeed.Loader`:
    every dim but the data-parallel ones replicates, the context-parallel ranks of a group
    get the same positions), or ``rank``/``world_size``, or ``torch.distributed``. Pass the
    same ``batch_size`` to the ``DataLoader``. ``data`` is a :class:`TokenDataset` (or the
    number of samples per epoch), needed for ``epochs=``. ``epochs=None`` is infinite.

    ``state_dict()`` is ``{"position": p}`` where ``p`` is the global position of the next
    batch the sampler's current iterator will yield; ``torchdata``'s
    ``StatefulDataLoader`` saves and restores it exactly. With a plain ``DataLoader``
    (which fetches indices ahead when it has workers), save ``position_after(steps)``
    instead, where ``steps`` counts the batches your loop has consumed since
    ``start``.
    """

    def __init__(self, data: Union[TokenDataset, int, None] = None, *, batch_size: int, rank: Optional[int] = None,
                 world_size: Optional[int] = None, epochs: Optional[int] = None, start: int = 0,
                 device_mesh: Any = None, dp_dims: Sequence[str] = DEFAULT_DP_DIMS,
                 cp_dim: Optional[str] = DEFAULT_CP_DIM) -> None:
        self.batch_size = int(batch_size)
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        pc = parallel_coords(device_mesh, rank=rank, world_size=world_size, dp_dims=dp_dims, cp_dim=cp_dim)
        self.rank, self.world_size = pc.dp_rank, pc.dp_size
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"need 0 <= rank < world_size, got {self.rank}, {self.world_size}")
        self.global_batch = self.batch_size * self.world_size
        n = data.num_samples if isinstance(data, TokenDataset) else data
        if epochs is not None and n is None:
            raise ValueError("epochs= needs the TokenDataset (or its number of samples)")
        self.end: Optional[int] = None if epochs is None else (int(epochs) * int(n) // self.global_batch) * self.global_batch  # type: ignore[arg-type]
        self._check(start)
        self.start = int(start)
        self._yielded = 0  # samples yielded by the current iterator

    def _check(self, pos: int) -> None:
        if pos < 0 or pos % self.global_batch:
            raise ValueError(f"position {pos} is not a multiple of the global batch {self.global_batch}")

    def __iter__(self) -> Iterator[int]:
        self._yielded = 0
        b0 = self.start // self.global_batch
        b = b0
        base = self.rank * self.batch_size
        while self.end is None or (b + 1) * self.global_batch <= self.end:
            first = b * self.global_batch + base
            for j in range(self.batch_size):
                self._yielded += 1
                yield first + j
            b += 1

    def __len__(self) -> int:
        if self.end is None:
            raise TypeError("an infinite ResumableSampler (epochs=None) has no len()")
        return max(0, (self.end - self.start) // self.global_batch) * self.batch_size

    def position_after(self, batches: int) -> int:
        """Global position after this rank consumed ``batches`` batches from ``start``."""
        return self.start + int(batches) * self.global_batch

    def state_dict(self) -> Dict[str, int]:
        return {"position": self.position_after(self._yielded // self.batch_size)}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        pos = int(state["position"])
        self._check(pos)
        self.start = pos
        self._yielded = 0


# ----------------------------------------------------------------------------------------
# TokenBatches with DataLoader workers: the batches are made in the consuming process.
#
# A DataLoader worker's result goes through a pipe to the process that iterates, and torch
# sends a tensor there by moving its storage into shared memory, per batch. tokenfeed's
# engine already assembles batches on its own C threads, so a worker has nothing to add
# but that hand-off. A TokenBatches worker therefore sends a ticket per batch (which
# TokenBatches, which global batch: a few dozen bytes), and unpickling the ticket in the
# consuming process takes that batch from an engine there: the engine num_workers=0 uses,
# running ahead on its threads. No batch is copied between processes, workers cost no
# CPU beyond the DataLoader's own per-batch hand-off, and settings that act on each step
# (balance=, warmup_steps=) work with any number of workers.
#
# Tickets are unpickled in the order they arrive, which with several workers is not quite
# the order the DataLoader yields them in: the consumer's engine takes batches in order and
# keeps those asked for early in a small reorder window. A ticket for a batch outside it
# (a new epoch, a pass abandoned) moves the engine to that batch: positions are all the
# order needs.

_WINDOW = 64  # batches the consumer's engine keeps for tickets that arrive ahead of their turn

# TokenBatches of this process by token: the unpickled ticket finds its engine here
_instances: "weakref.WeakValueDictionary[str, TokenBatches]" = weakref.WeakValueDictionary()
_warned_workers = False


def _rebuild(token: str, index: int, num_workers: int) -> Dict[str, Any]:
    global _warned_workers
    tb = _instances.get(token)
    if tb is None:
        raise RuntimeError("tokenfeed.torch.TokenBatches: a batch ticket from a DataLoader worker reached a process "
                           "that has no TokenBatches it belongs to. Tickets are made into batches by the process "
                           "iterating the DataLoader, which holds its dataset")
    if not _warned_workers and num_workers > 0:
        _warned_workers = True
        warnings.warn(PerformanceWarning(
            f"tokenfeed.torch.TokenBatches with num_workers={num_workers}: the batches are made by tokenfeed's C "
            f"engine in this process whatever the worker count (the workers only pace the DataLoader), so the "
            f"workers add the DataLoader's own hand-off per batch, a few tens of microseconds, and nothing else. "
            f"num_workers=0 is as fast or faster (docs/guides/dataloader.md)"), stacklevel=2)
    return tb._serve(index)


class _Ticket:
    """What a worker sends for one batch; unpickled in the consuming process, it is the batch."""

    __slots__ = ("args",)

    def __init__(self, *args: Any) -> None:
        self.args = args

    def __reduce__(self) -> Tuple[Any, Tuple[Any, ...]]:
        return _rebuild, self.args

    def _refuse(self, *_: Any, **__: Any) -> Any:
        raise TypeError("tokenfeed.torch.TokenBatches: inside a DataLoader worker a batch is a ticket that becomes "
                        "the batch in the process iterating the DataLoader (the C engine there makes it). Apply a "
                        "collate_fn or transform in your loop instead, or use num_workers=0")

    __getitem__ = __iter__ = __len__ = __contains__ = keys = items = values = _refuse


class TokenBatches(IterableDataset):  # type: ignore[type-arg]
    """Whole batches from the C engine, for ``DataLoader(TokenBatches(...), batch_size=None)``.

    Yields the :class:`Loader`'s batches (this rank's slice of global batches ``b, b+1,
    ...`` from ``start``), whatever the ``DataLoader``'s ``num_workers``. The batches are
    always made by the C engine in the process that iterates the ``DataLoader``, on the
    engine's own threads: with ``K`` workers, worker ``w`` sends a ticket for each of global
    batches ``b + w, b + w + K, ...`` (a few dozen bytes), and the ticket becomes that batch
    when the ``DataLoader`` hands it over. No batch is copied between processes; workers
    add only the ``DataLoader``'s own per-batch hand-off, so ``num_workers=0`` is as fast
    or faster, and the first batch from a worker says so in a :class:`PerformanceWarning`.
    Give the ``DataLoader`` no ``collate_fn`` (its default passes batches through); a
    transform belongs in your loop.

    ``start`` is a global stream position (a multiple of the global batch, checked here);
    after ``steps`` batches keep :meth:`position_after` ``(steps)`` in your checkpoint and
    pass it as ``start=`` to resume, with any ``num_workers``. Every other keyword is the
    :class:`Loader`'s. A finite (``epochs=``) stream ends where the Loader's does.
    """

    def __init__(self, dataset: Union[Dataset, PathLike], *, seq_len: int, batch_size: int,
                 rank: Optional[int] = None, world_size: Optional[int] = None, start: int = 0,
                 **loader_kw: Any) -> None:
        # the same keywords as Loader: an unknown one is refused now, not in a worker
        inspect.signature(Loader).bind(dataset, seq_len=seq_len, batch_size=batch_size, **loader_kw)
        self.dataset = dataset if isinstance(dataset, Dataset) else _open(dataset)
        self.seq_len, self.batch_size = int(seq_len), int(batch_size)
        # the mesh is resolved here, in the process that has it; workers get the numbers
        mesh_kw = {k: loader_kw.pop(k) for k in ("device_mesh", "dp_rank", "dp_size", "cp_rank", "cp_size",
                                                 "dp_dims", "cp_dim") if k in loader_kw}
        self.parallel = parallel_coords(mesh_kw.pop("device_mesh", None), rank=rank, world_size=world_size, **mesh_kw)
        self.rank, self.world_size = self.parallel.dp_rank, self.parallel.dp_size
        self.global_batch = self.batch_size * self.world_size
        if isinstance(start, bool) or not isinstance(start, (int, np.integer)) or start < 0 \
                or start % self.global_batch:
            raise ValueError(f"start must be a stream position: a multiple of the global batch "
                             f"{self.global_batch} (batch_size x data-parallel size), got {start!r}")
        self.start = int(start)
        self.loader_kw = loader_kw
        self.loader_kw.setdefault("output", "torch")
        # every setting checked now, in this process, before any worker starts
        probe = self._loader(0, 1, self.start)
        # settings that act on the steps of the stream (docs/balance.md): with K workers each
        # one reads every K-th step as one of K x R ranks, so they would act on K steps at once
        e = probe._engine_cfg
        self._per_step = [k for k, on in (("balance", e.setting("balance")),
                                          ("warmup_steps", e.setting("warmup_steps"))) if on]
        n = probe.num_positions
        self._end: Optional[int] = None if n is None else n // self.global_batch  # global batches in the stream
        probe.close()
        self._token = secrets.token_hex(16)
        self._init_server()

    def _init_server(self) -> None:
        self._server: Optional[Loader] = None  # the consumer's engine, made at the first ticket
        self._next = 0  # the global batch the server gives next
        self._early: Dict[int, Any] = {}  # batches taken for tickets not yet arrived
        self._lock = threading.Lock()
        _instances[self._token] = self

    def __getstate__(self) -> Dict[str, Any]:
        st = self.__dict__.copy()
        for k in ("_server", "_next", "_early", "_lock"):
            del st[k]
        return st

    def __setstate__(self, st: Dict[str, Any]) -> None:
        self.__dict__.update(st)
        self._init_server()

    def _serve(self, index: int) -> Dict[str, Any]:
        """Global batch ``index`` of this rank's stream, from this process's engine."""
        with self._lock:
            got = self._early.pop(index, None)
            if got is not None:
                return got  # type: ignore[no-any-return]
            if self._server is None or not self._next <= index < self._next + _WINDOW:
                if self._server is not None:
                    self._server.close()
                self._early.clear()
                self._server = self._loader(0, 1, index * self.global_batch)
                self._next = index
            try:
                while self._next < index:
                    self._early[self._next] = next(self._server)
                    self._next += 1
                self._next += 1
                return next(self._server)
            except StopIteration:  # a ticket is only made for a batch of the stream
                raise RuntimeError(f"tokenfeed.torch.TokenBatches: the stream ended before global batch {index}, "
                                   f"which a DataLoader worker asked for") from None

    def position_after(self, steps: int) -> int:
        """The global position after ``steps`` batches from ``start``: pass it as ``start=`` to resume."""
        return self.start + int(steps) * self.global_batch

    def _loader(self, w: int, k: int, start: int, **kw: Any) -> Loader:
        """The engine of worker ``w`` of ``k``: batches ``b0 + w, b0 + w + k, ...`` (``b0 = start /
        global_batch``) are, for this rank, rank ``v * R + r`` of a run with ``k * R`` ranks and the same
        per-rank batch size, ``v = (b0 + w) mod k``, from that run's global batch ``(b0 + w) // k``:
        the order is a function of positions only, so this is the same stream."""
        b = start // self.global_batch + w
        opts = dict(self.loader_kw, **kw)
        loader = Loader(self.dataset, seq_len=self.seq_len, batch_size=self.batch_size,
                        dp_rank=(b % k) * self.world_size + self.rank, dp_size=k * self.world_size,
                        cp_rank=self.parallel.cp_rank, cp_size=self.parallel.cp_size, **opts)
        first = (b // k) * k * self.global_batch
        if first:
            state = loader.state_dict()
            state["position"] = first
            loader.load_state_dict(state)
        return loader

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        if info is None:
            loader = self._loader(0, 1, self.start)
            try:
                yield from loader
            finally:
                loader.close()
            return
        b0 = self.start // self.global_batch
        if info.dataset is self:
            # the DataLoader's own dataset: tickets, made into batches where they arrive
            b = b0 + info.id
            while self._end is None or b < self._end:
                yield _Ticket(self._token, b, info.num_workers)
                b += info.num_workers
            return
        # inside another dataset, whose worker code uses the batches here: this worker
        # runs an engine of its own over its share of the global batches
        if info.num_workers > 1 and self._per_step:
            names = " and ".join(f"{k}=" for k in self._per_step)
            raise ValueError(f"tokenfeed.torch.TokenBatches inside another dataset: {names} with "
                             f"num_workers={info.num_workers}: each DataLoader worker reads one step in "
                             f"{info.num_workers}, as one of {info.num_workers} x {self.world_size} ranks, so "
                             f"{names} would act on {info.num_workers} steps together instead of on each step. "
                             f"Make TokenBatches the DataLoader's dataset, or use num_workers 0 or 1 "
                             f"(docs/balance.md)")
        loader = self._loader(info.id, info.num_workers, self.start)
        try:
            yield from loader
        finally:
            loader.close()
