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
from typing import Any, Dict, Iterator, Mapping, Optional, Sequence, Union

import numpy as np
import torch
from torch.utils.data import Dataset as _TorchDataset
from torch.utils.data import IterableDataset, Sampler, get_worker_info

from ._config import OrderConfig, split_settings, want_bits
from ._dataset import Dataset, PathLike, open as _open
from ._loader import Loader
from ._mesh import DEFAULT_CP_DIM, DEFAULT_DP_DIMS, ParallelCoords, parallel_coords

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
                 cp_rank: int = 0, cp_size: int = 1, **settings: Any) -> None:
        # the Loader's configuration of the stream (the order's rows of the settings table:
        # seed, separator_id, packing, pad_id, ...), with a global batch of one sample
        (order_kw,) = split_settings(settings, "TokenDataset", ("order",))
        self._cfg = OrderConfig(seq_len=seq_len, shuffle=shuffle, **order_kw)
        self.dataset = dataset if isinstance(dataset, Dataset) else _open(dataset)
        self.seq_len = self._cfg.seq_len
        self._want = want_bits(position_ids, cu_seqlens, loss_mask)
        self._dtype = np.dtype(dtype).name
        self._order: Any = self._cfg.build(self.dataset._core)
        self.num_samples: int = self._order.num_samples
        pc = ParallelCoords(0, 1, cp_rank, cp_size)
        self._cp_index: Optional[np.ndarray[Any, Any]] = None
        if pc.cp_size > 1:
            if cu_seqlens:
                raise ValueError("cu_seqlens with cp_size > 1 is the THD layout of a whole batch: use "
                                 "tokenfeed.Loader or TokenBatches")
            k = 2 * pc.cp_size
            if self.seq_len % k:
                raise ValueError(f"seq_len {self.seq_len} is not divisible by 2 x cp_size = {k}: context parallelism "
                                 f"cuts every sample into 2 x cp_size equal chunks")
            c = self.seq_len // k
            self._cp_index = np.r_[pc.cp_rank * c:(pc.cp_rank + 1) * c, (k - 1 - pc.cp_rank) * c:(k - pc.cp_rank) * c]

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, position: int) -> Dict[str, torch.Tensor]:
        if position < 0:
            raise IndexError(f"position must be >= 0, got {position}")
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


class TokenBatches(IterableDataset):  # type: ignore[type-arg]
    """Whole batches from the C engine, for ``DataLoader(TokenBatches(...), batch_size=None, num_workers=K)``.

    With ``K`` workers, worker ``w`` produces global batches ``w, w+K, w+2K, ...`` (this
    rank's slice of each), and the DataLoader returns them round-robin, so the stream is
    the :class:`Loader`'s, batch for batch. Each worker runs its own engine (created in
    the worker process). ``start`` is a global position (a multiple of the global batch)
    to begin from; keep it in your checkpoint as ``start + steps * global_batch``.
    Finite (``epochs=``) streams are cut at whole rounds of ``K`` global batches.
    """

    def __init__(self, dataset: Union[Dataset, PathLike], *, seq_len: int, batch_size: int,
                 rank: Optional[int] = None, world_size: Optional[int] = None, start: int = 0,
                 **loader_kw: Any) -> None:
        # the same keywords as Loader: an unknown one is refused now, not in a worker
        bound = inspect.signature(Loader).bind(dataset, seq_len=seq_len, batch_size=batch_size, **loader_kw)
        split_settings(bound.arguments.get("settings", {}), "Loader")
        self.dataset = dataset if isinstance(dataset, Dataset) else _open(dataset)
        self.seq_len, self.batch_size = int(seq_len), int(batch_size)
        # the mesh is resolved here, in the process that has it; workers get the numbers
        mesh_kw = {k: loader_kw.pop(k) for k in ("device_mesh", "dp_rank", "dp_size", "cp_rank", "cp_size",
                                                 "dp_dims", "cp_dim") if k in loader_kw}
        self.parallel = parallel_coords(mesh_kw.pop("device_mesh", None), rank=rank, world_size=world_size, **mesh_kw)
        self.rank, self.world_size = self.parallel.dp_rank, self.parallel.dp_size
        self.global_batch = self.batch_size * self.world_size
        if start % self.global_batch:
            raise ValueError(f"start {start} is not a multiple of the global batch {self.global_batch}")
        self.start = int(start)
        self.loader_kw = loader_kw
        self.loader_kw.setdefault("output", "torch")

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        info = get_worker_info()
        k, w = (info.num_workers, info.id) if info is not None else (1, 0)
        # Worker w of K serves batches b = w (mod K). Those are, for this rank, rank
        # w*R + r of a virtual run with K*R ranks and the same per-rank batch size: the
        # order is a function of positions only, so this is the same stream.
        loader = Loader(self.dataset, seq_len=self.seq_len, batch_size=self.batch_size,
                        dp_rank=w * self.world_size + self.rank, dp_size=k * self.world_size,
                        cp_rank=self.parallel.cp_rank, cp_size=self.parallel.cp_size, **self.loader_kw)
        if self.start:
            if self.start % (k * self.global_batch):
                raise ValueError(f"start must be a multiple of num_workers * global_batch = {k * self.global_batch}")
            state = loader.state_dict()
            state["position"] = self.start
            loader.load_state_dict(state)
        try:
            yield from loader
        finally:
            loader.close()
