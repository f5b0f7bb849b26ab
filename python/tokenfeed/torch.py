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

import ctypes
import inspect
import mmap
import multiprocessing.util as mp_util
import os
import secrets
import tempfile
import threading
import time
import warnings
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch.utils.data import Dataset as _TorchDataset
from torch.utils.data import IterableDataset, Sampler, get_worker_info

from ._config import OrderConfig, split_settings, want_bits
from ._dataset import Dataset, PathLike, open as _open
from ._loader import Loader
from ._warnings import PerformanceWarning
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
        self._told_workers = False
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
# Handing batches from DataLoader workers to the consumer through shared memory.
#
# A DataLoader worker's result goes through a pipe to the process that iterates. Torch
# sends a tensor there by moving its storage into a new shared-memory file and passing
# the file descriptor over a socket, per batch: milliseconds at a few MiB per batch. A
# TokenBatches worker instead keeps a ring of slots in one shared-memory file that it
# creates once; it copies each batch from its engine into a free slot and sends a ticket
# (file, slot, array layouts: a few hundred bytes). Unpickling the ticket in the consumer
# maps the file (once per worker) and returns arrays over the slot. Each slot has a flag
# word in the file's first page: the worker sets it when it fills the slot, and the
# consumer clears it when the last array over the slot is gone (the owner object's
# __del__), so a batch the consumer still holds is never overwritten. If every slot is
# still held (a loop that keeps many batches), the worker waits a little, then sends that
# batch the ordinary way: nothing blocks for good, nothing is overwritten.
#
# The file lives in /dev/shm (else the temporary directory), made with O_EXCL and
# O_NOFOLLOW, mode 0600, under a random name; the consumer opens it with O_NOFOLLOW and
# checks its owner. The worker unlinks it when its process exits; the consumer's mapping
# outlives the name.

_SLOTS = 8  # per worker: the DataLoader keeps prefetch_factor (default 2) in flight
_HEADER = 4096  # flag words, one int32 per slot
_SLOT_WAIT_S = 0.05  # a worker waits this long for a free slot, then sends a copy


def _shm_dir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


class _SlotRing:
    """The worker's side: a file of ``_SLOTS`` slots of ``slot_bytes`` and their flags."""

    def __init__(self, slot_bytes: int) -> None:
        self.slot_bytes = -(-int(slot_bytes) // 4096) * 4096
        size = _HEADER + _SLOTS * self.slot_bytes
        d = _shm_dir()
        for _ in range(16):
            path = os.path.join(d, f"tokenfeed-batches-{os.getpid()}-{secrets.token_hex(8)}")
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
                break
            except FileExistsError:
                continue
        else:
            raise FileExistsError(f"could not create a shared-memory file in {d}")
        try:
            # reserved now: a full /dev/shm fails here (ENOSPC), not as SIGBUS at a write
            if hasattr(os, "posix_fallocate"):
                os.posix_fallocate(fd, 0, size)
            else:
                os.ftruncate(fd, size)
            self.mm = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise
        os.close(fd)
        self.path = path
        self.flags = np.frombuffer(self.mm, dtype=np.int32, count=_SLOTS)
        self.next = 0
        # The name must outlive this iterator: batches it sent may not be unpickled yet. It
        # goes when the worker process exits (multiprocessing's exit path runs this; the
        # DataLoader ends a worker only after taking its last batch, or when abandoning it).
        mp_util.Finalize(None, _unlink_quietly, args=(path,), exitpriority=10)

    def take(self) -> Optional[int]:
        """A free slot (marked in use), or None when the consumer holds them all."""
        deadline = None
        while True:
            for k in range(_SLOTS):
                s = (self.next + k) % _SLOTS
                if self.flags[s] == 0:
                    self.flags[s] = 1
                    self.next = (s + 1) % _SLOTS
                    return s
            now = time.monotonic()
            if deadline is None:
                deadline = now + _SLOT_WAIT_S
            elif now > deadline:
                return None
            time.sleep(0.0002)



# the worker's ring, kept for the process's life and reused by its next iterator (the
# next epoch with persistent workers): (pid, ring)
_worker_ring: Optional[Tuple[int, _SlotRing]] = None


def _ring_for(nbytes: int) -> _SlotRing:
    global _worker_ring
    if _worker_ring is not None and _worker_ring[0] == os.getpid() and nbytes <= _worker_ring[1].slot_bytes:
        return _worker_ring[1]
    ring = _SlotRing(max(nbytes, 1))
    _worker_ring = (os.getpid(), ring)
    return ring


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


_Layout = Tuple[Tuple[str, str, Tuple[int, ...], Tuple[int, ...], int], ...]


def _layout(batch: Mapping[str, Any]) -> Tuple[_Layout, Tuple[Tuple[str, int], ...], int]:
    """Where each array of ``batch`` goes in a slot: arrays that are views of another (input_ids
    and labels of tokens) stay views of it. Returns (layout, (key, offset) of each array copied,
    bytes)."""
    arrays = sorted(((k, v) for k, v in batch.items() if isinstance(v, np.ndarray)), key=lambda kv: -kv[1].nbytes)
    placed: List[Tuple[int, int, int]] = []  # (address, end, offset in slot) of copied arrays
    copies: List[Tuple[str, int]] = []
    layout = []
    off = 0
    for k, a in arrays:
        lo = a.__array_interface__["data"][0]
        hi = lo + sum((n - 1) * st for n, st in zip(a.shape, a.strides) if st > 0) + a.itemsize
        where = next((o + lo - p for p, e, o in placed if p <= lo and hi <= e), None)
        strides = a.strides
        if where is None:  # an array of its own: copied, C-contiguous
            where = off
            copies.append((k, off))
            strides = tuple(int(np.prod(a.shape[i + 1:], dtype=np.int64)) * a.itemsize for i in range(a.ndim))
            if a.flags.c_contiguous:
                placed.append((lo, lo + a.nbytes, off))
            off += -(-a.nbytes // 64) * 64
        layout.append((k, a.dtype.str, tuple(a.shape), tuple(strides), where))
    return tuple(layout), tuple(copies), off


class _SlotOwner:
    """Owns one slot in the consumer: arrays over the slot keep it alive; when it goes, the slot is free."""

    __slots__ = ("__array_interface__", "_ring", "_slot", "__weakref__")

    def __init__(self, ring: "_MappedRing", slot: int) -> None:
        self._ring, self._slot = ring, slot
        self.__array_interface__ = {"data": (ring.address + _HEADER + slot * ring.slot_bytes, False),
                                    "shape": (ring.slot_bytes,), "typestr": "|u1", "version": 3}

    def __del__(self) -> None:
        self._ring.flags[self._slot] = 0


class _MappedRing:
    """The consumer's mapping of one worker's ring."""

    def __init__(self, path: str, slot_bytes: int) -> None:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            size = _HEADER + _SLOTS * slot_bytes
            if st.st_uid != os.getuid() or st.st_mode & 0o077 or st.st_size != size:
                raise PermissionError(f"{path}: not a batch ring made by this user's DataLoader worker")
            self.mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.path, self.slot_bytes = path, slot_bytes
        self.flags = np.frombuffer(self.mm, dtype=np.int32, count=_SLOTS)
        self._anchor = ctypes.c_char.from_buffer(self.mm)  # an export: the mapping stays while we live
        self.address = ctypes.addressof(self._anchor)


# the consumer's rings by file; a ring whose file is gone (its worker exited) is dropped
# when the next one is mapped, and unmapped when its last batch is gone
_rings: Dict[str, _MappedRing] = {}
_rings_lock = threading.Lock()
_warned_workers = False


def _ring(path: str, slot_bytes: int) -> _MappedRing:
    r = _rings.get(path)
    if r is None:
        with _rings_lock:
            r = _rings.get(path)
            if r is None:
                for p in [p for p in _rings if not os.path.exists(p)]:
                    del _rings[p]
                r = _rings[path] = _MappedRing(path, slot_bytes)
    return r


def _rebuild(path: str, slot_bytes: int, slot: int, layout: _Layout, scalars: Dict[str, Any], as_torch: bool,
             num_workers: int) -> Dict[str, Any]:
    global _warned_workers
    if not _warned_workers and num_workers > 0:
        _warned_workers = True
        warnings.warn(PerformanceWarning(
            f"tokenfeed.torch.TokenBatches with num_workers={num_workers}: each batch still crosses from a worker "
            f"process to this one (a few tens of microseconds of DataLoader overhead per batch), and the workers "
            f"add nothing: tokenfeed's C engine already assembles batches on its own threads. num_workers=0 is "
            f"as fast or faster (docs/guides/dataloader.md)"), stacklevel=2)
    out = _views(np.asarray(_SlotOwner(_ring(path, slot_bytes), slot)), layout, as_torch)
    out.update(scalars)
    return out


def _copy_in(batch: Mapping[str, Any], copies: Sequence[Tuple[str, int]], buf: Any, base: int) -> None:
    for k, off in copies:
        a = batch[k]
        np.copyto(np.ndarray(a.shape, a.dtype, buffer=buf, offset=base + off), a)


def _views(whole: np.ndarray[Any, Any], layout: _Layout, as_torch: bool, one_tensor: bool = False) -> Dict[str, Any]:
    """The batch's arrays over ``whole``. ``one_tensor``: tensors are views of one tensor, so
    that they stay one buffer when torch pickles them (slower to make)."""
    out: Dict[str, Any] = {}
    t = torch.from_numpy(whole) if as_torch and one_tensor else None
    for k, dt, shape, strides, off in layout:
        a = np.ndarray(shape, dt, buffer=whole, offset=off, strides=strides)
        if as_torch and t is None:
            out[k] = torch.from_numpy(a)
        elif t is not None:
            d = np.dtype(dt)
            span = sum((n - 1) * st for n, st in zip(shape, strides)) + d.itemsize
            if all(shape) and all(st % d.itemsize == 0 for st in strides):
                out[k] = t[off:off + span].view(_torch_dtype(d)).as_strided(
                    shape, tuple(st // d.itemsize for st in strides))
            else:
                out[k] = torch.from_numpy(a)
        else:
            out[k] = a
    return out


def _torch_dtype(d: np.dtype[Any]) -> torch.dtype:
    t: torch.dtype = torch.from_numpy(np.empty(0, d)).dtype
    return t


class _Ticket:
    """What a worker sends for one batch in its ring; unpickled, it is the batch."""

    __slots__ = ("args",)

    def __init__(self, *args: Any) -> None:
        self.args = args

    def __reduce__(self) -> Tuple[Any, Tuple[Any, ...]]:
        return _rebuild, self.args


class TokenBatches(IterableDataset):  # type: ignore[type-arg]
    """Whole batches from the C engine, for ``DataLoader(TokenBatches(...), batch_size=None)``.

    Yields the :class:`Loader`'s batches (this rank's slice of global batches ``b, b+1,
    ...`` from ``start``), whatever the ``DataLoader``'s ``num_workers``. With ``K``
    workers, worker ``w`` runs its own engine over global batches ``b + w, b + w + K, ...``
    and the DataLoader returns them round-robin; each batch reaches the iterating process
    through shared memory the worker allocated once, not a new tensor per batch. Workers
    still cost the DataLoader's own per-batch hand-off between processes, and add no
    speed: the engine already works on its own threads. ``num_workers=0`` is the fast
    path, and the first batch from a worker says so in a :class:`PerformanceWarning`.

    ``start`` is a global stream position (a multiple of the global batch, checked here);
    after ``steps`` batches keep :meth:`position_after` ``(steps)`` in your checkpoint and
    pass it as ``start=`` to resume, with any ``num_workers``. Every other keyword is the
    :class:`Loader`'s. A finite (``epochs=``) stream ends where the Loader's does. ``balance=``
    and ``warmup_steps=`` act on each step, so they take ``num_workers`` 0 or 1 (more is a
    ``ValueError``; ``docs/balance.md``).
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
        probe.close()

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
        if info.num_workers > 1 and self._per_step:
            names = " and ".join(f"{k}=" for k in self._per_step)
            raise ValueError(f"tokenfeed.torch.TokenBatches: {names} with num_workers={info.num_workers}: each "
                             f"DataLoader worker reads one step in {info.num_workers}, as one of "
                             f"{info.num_workers} x {self.world_size} ranks, so {names} would act on "
                             f"{info.num_workers} steps together instead of on each step. Use num_workers=0 (the "
                             f"engine already works on its own threads) or 1 (docs/balance.md)")
        as_torch = self.loader_kw["output"] != "numpy"
        loader = self._loader(info.id, info.num_workers, self.start, output="numpy")
        ring: Optional[_SlotRing] = None
        no_ring = False
        layout: _Layout = ()
        copies: Tuple[Tuple[str, int], ...] = ()
        nbytes = 0
        shapes: Tuple[Any, ...] = ()
        try:
            for batch in loader:
                # the same layout every batch, but for the THD outputs (their length varies) and
                # a sequence-length warmup (its rows lengthen)
                scalars = {k: v for k, v in batch.items() if not isinstance(v, np.ndarray)}
                now = tuple(v.shape for v in batch.values() if isinstance(v, np.ndarray))
                if ring is None or scalars or now != shapes:
                    layout, copies, nbytes = _layout(batch)
                    shapes = now
                if not no_ring and (ring is None or nbytes > ring.slot_bytes):
                    try:
                        ring = _ring_for(nbytes)
                    except OSError as e:  # no room in /dev/shm: every batch goes the ordinary way
                        no_ring = True
                        warnings.warn(PerformanceWarning(
                            f"tokenfeed.torch.TokenBatches: no shared-memory ring for this DataLoader worker ({e}); "
                            f"batches are sent the ordinary way (docs/troubleshooting.md, 'Shared memory')"))
                slot = ring.take() if ring is not None and not no_ring else None
                if slot is None:  # every slot held by the consumer: this one goes the ordinary way
                    whole = np.empty(nbytes, np.uint8)
                    _copy_in(batch, copies, whole, 0)
                    out = _views(whole, layout, as_torch, one_tensor=True)
                    out.update(scalars)
                    yield out
                    continue
                assert ring is not None
                _copy_in(batch, copies, ring.mm, _HEADER + slot * ring.slot_bytes)
                del batch
                yield _Ticket(ring.path, ring.slot_bytes, slot, layout, scalars, as_torch, info.num_workers)
        finally:
            loader.close()
