"""The device path: batches on the GPU, through tokenfeed's C device layer.

The C device layer loads the CUDA runtime at run time (``dlopen``; no toolkit is
needed to build) and hands batches out through DLPack: the consumer's stream waits on
the copy's event (no host wait, no device-wide sync), and a slot is reused only after
an event recorded on the consumer's stream when the tensor is freed has completed. See
``docs/gpu.md``.

:class:`DeviceStage` is what ``Loader(device=...)`` uses: a copy thread in C takes each
batch from the engine as soon as it is assembled (in page-locked memory) and issues its
copy to the device at once, ``device_prefetch_batches`` batches ahead of ``next()``, whatever
arrays the batch has (a context-parallel share's included). With
``static_buffers=True`` every batch is delivered into the same device tensors, for
training steps captured in CUDA graphs.

``DeviceFeeder(device)(batch)`` moves host batch dicts you already have (from
DataLoader workers, say) onto the device: each call copies the batch into pinned
staging and issues its copy then. Values are torch tensors (``torch.from_dlpack``, on
torch's current stream) when torch with CUDA is importable, else
:class:`tokenfeed.DeviceTensor` objects that implement
``__dlpack__``/``__dlpack_device__`` for CuPy, JAX and others.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import numpy as np

from .. import _core
from ..order._config import SETTINGS, check_settings

__all__ = ["DeviceFeeder", "DeviceStage", "cuda_available", "parse_device"]

# Arrays of a batch that are views of "tokens" rather than buffers of their own.
_TOKEN_VIEWS = {"input_ids": 0, "labels": 1}


def cuda_available() -> Tuple[bool, str]:
    """``(usable, detail)``: whether the CUDA runtime loads and sees a device, and what was loaded or why not."""
    ok, why = _core.DeviceRing.cuda_available()
    return bool(ok), str(why)


def parse_device(device: Any) -> Optional[int]:
    """``None``/``"cpu"`` -> ``None`` (CPU batches); ``"cuda"`` -> ``$LOCAL_RANK`` (else 0);
    ``"cuda:N"``, ``N`` or ``torch.device("cuda", N)`` -> ``N``."""
    if device is None:
        return None
    if type(device).__name__ == "device" and hasattr(device, "type"):  # torch.device, without importing torch
        if device.type == "cpu":
            return None
        if device.type != "cuda":
            raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {device!r}")
        return device.index if device.index is not None else _local_rank()
    if isinstance(device, (int, np.integer)) and not isinstance(device, bool):
        if device < 0:
            raise ValueError(f"CUDA device index must be >= 0, got {device}")
        return int(device)
    if isinstance(device, str):
        s = device.strip().lower()
        if s == "cpu":
            return None
        if s == "cuda":
            return _local_rank()
        if s.startswith("cuda:") and s[5:].isdigit():
            return int(s[5:])
    raise ValueError(f"device must be None, 'cpu', 'cuda', 'cuda:N' or an int, got {device!r}")


def _local_rank() -> int:
    v = os.environ.get("LOCAL_RANK", "")
    try:
        return int(v) if v else 0
    except ValueError:
        raise ValueError(f"LOCAL_RANK={v!r} is not an int; pass device='cuda:N' explicitly") from None


def _torch_cuda() -> Any:
    """torch, if it is importable and has CUDA; else None."""
    torch: Any = sys.modules.get("torch")
    if torch is None:
        try:
            import torch as imported
        except ImportError:
            return None
        torch = imported
    try:
        return torch if torch.cuda.is_available() else None
    except Exception:
        return None


class DeviceFeeder:
    """Moves host batches onto one CUDA device through a ring of ``slots`` preallocated device buffers.

    ``output``: ``"torch"`` (torch tensors via ``torch.from_dlpack``), ``"dlpack"``
    (:class:`tokenfeed.DeviceTensor`) or ``"auto"`` (torch when torch with CUDA is
    importable). The ring is sized from the first batch and allocated once. A batch is
    held on the device until every tensor of it is freed; ``slots`` bounds how many
    batches the consumer can hold at once (a RuntimeError says so when exceeded).

    Raises RuntimeError (mentioning CUDA and why) when CUDA is unavailable, ValueError
    for a device index out of range, MemoryError when the GPU is out of memory.
    """

    def __init__(self, device: Union[int, str, Any] = "cuda", *, output: str = "auto", slots: int = 4) -> None:
        index = parse_device(device)
        if index is None:
            raise ValueError("DeviceFeeder needs a CUDA device, not the CPU")
        ok, why = cuda_available()
        if not ok:
            raise RuntimeError(f"device='cuda:{index}' was requested but CUDA is not available: {why}. "
                               f"Use device=None (CPU batches), or fix the CUDA installation.")
        if output not in ("auto", "torch", "dlpack"):
            raise ValueError(f"output must be 'auto', 'torch' or 'dlpack', got {output!r}")
        self._torch = _torch_cuda() if output in ("auto", "torch") else None
        if output == "torch" and self._torch is None:
            raise RuntimeError("output='torch' needs PyTorch built with CUDA (torch.cuda.is_available() is False)")
        self.output = "torch" if self._torch is not None else "dlpack"
        if not isinstance(slots, int) or slots < 2:
            raise ValueError(f"slots must be an int >= 2, got {slots!r}")
        self.device = index
        self.slots = slots
        count = _core.DeviceRing.device_count()
        if index >= count:
            raise ValueError(f"CUDA device index {index} is out of range: this process sees {count} device(s); "
                             f"check LOCAL_RANK / the device string and CUDA_VISIBLE_DEVICES")
        self._ring: Optional[Any] = None
        self._slot_bytes = 0

    @staticmethod
    def _packed_size(arrays: List["np.ndarray[Any, Any]"]) -> int:
        off = 0
        for a in arrays:
            off = (off + 255) // 256 * 256 + a.nbytes
        return off

    def _ensure_ring(self, need: int) -> Any:
        if self._ring is None or need > self._slot_bytes:
            if self._ring is not None:
                self._ring.close()  # tensors already handed out keep their slots alive
            self._ring = _core.DeviceRing(self.device, need, self.slots)
            self._slot_bytes = need
        return self._ring

    def __call__(self, batch: Dict[str, Any]) -> Dict[str, Any]:
        """Device tensors for one host batch dict (NumPy arrays, as the engine yields them)."""
        if self._ring is None and self._slot_bytes < 0:
            raise ValueError("the device feeder is closed")
        # arrays only: a THD batch (context parallelism) also carries ints (max_seqlen, num_seqs)
        names = [k for k in batch
                 if isinstance(batch[k], np.ndarray) and (k not in _TOKEN_VIEWS or "tokens" not in batch)]
        arrays = [np.ascontiguousarray(batch[k]) for k in names]
        ring = self._ensure_ring(self._packed_size(arrays))
        dev = dict(zip(names, ring.upload(arrays)))
        tok = dev.get("tokens")
        if tok is not None:
            rows, cols = tok.shape
            for k, off in _TOKEN_VIEWS.items():
                if k in batch:
                    dev[k] = tok._view(off, (rows, cols - 1), (cols, 1))
        out = {k: dev.get(k, batch[k]) for k in batch}  # the engine's key order
        if self._torch is not None:
            with self._torch.cuda.device(self.device):
                return {k: self._torch.from_dlpack(v) if k in dev else v for k, v in out.items()}
        return out

    def info(self) -> Dict[str, Any]:
        """The ring's slots, occupancy, whether staging is pinned, and counters (empty before the first batch)."""
        return self._ring.info() if self._ring is not None else {}

    def close(self) -> None:
        """Drop the ring; tensors already handed out stay valid."""
        if self._ring is not None:
            self._ring.close()
        self._ring = None
        self._slot_bytes = -1


def _check_cuda(index: int) -> None:
    ok, why = cuda_available()
    if not ok:
        raise RuntimeError(f"device='cuda:{index}' was requested but CUDA is not available: {why}. "
                           f"Use device=None (CPU batches), or fix the CUDA installation.")


def _output_torch(output: str) -> Any:
    """torch for output "torch"/"auto" when it has CUDA; None for DeviceTensors."""
    if output not in ("auto", "torch", "dlpack"):
        raise ValueError(f"output must be 'auto', 'torch' or 'dlpack', got {output!r}")
    torch = _torch_cuda() if output in ("auto", "torch") else None
    if output == "torch" and torch is None:
        raise RuntimeError("output='torch' needs PyTorch built with CUDA (torch.cuda.is_available() is False)")
    return torch


class DeviceStage:
    """A Loader's batches on one CUDA device, copied ahead of the consumer (``Loader(device=...)``).

    Wraps :class:`tokenfeed._core.DeviceLoader` over the Loader's engine: from creation
    on, the engine assembles batches in page-locked buffers and a C thread issues each
    batch's host-to-device copy the moment it is assembled, ``device_prefetch_batches``
    batches ahead of :meth:`next`, into ``device_slots`` device slots (``None``:
    ``device_prefetch_batches + 2``). ``settings``: the device rows of the settings table
    by name (``None`` or absent: the row's default), all passed to the C device loader.
    :meth:`next` returns a dict of torch tensors (``torch.from_dlpack``: torch's current
    stream waits for the copy on the GPU) or of ``DeviceTensor`` objects.

    ``static_buffers=True``: device buffers allocated once (by the C device loader, at
    the first batch) into which every batch is delivered, and :meth:`next` returns the
    same tensors every step. The copy of batch k into them is queued on the consumer's
    stream at ``next()`` (torch's current stream; without torch, the legacy default
    stream), after the work already queued there, so a step still running on the GPU
    never sees its batch overwritten. Arrays whose length changes per batch (the THD
    layout) are views of the same buffers, re-made when their length changes.
    """

    def __init__(self, engine: Any, index: int, *, settings: Optional[Mapping[str, Any]] = None,
                 output: str = "auto", static_buffers: bool = False) -> None:
        # checked by the settings table's rows before CUDA is touched, so a bad value is
        # reported as such on a machine without a GPU too
        settings = dict(settings or {})
        for k in settings:
            if SETTINGS.get(k, {}).get("scope") != "device":
                raise TypeError(f"DeviceStage: {k!r} is not a device setting (the device rows of "
                                f"tokenfeed._core.settings())")
        check_settings(**settings)
        if not isinstance(static_buffers, bool):
            raise TypeError(f"static_buffers must be True or False, got {static_buffers!r}")
        _check_cuda(index)
        self._torch = _output_torch(output)
        self.output = "torch" if self._torch is not None else "dlpack"
        self.index = index
        self.static_buffers = static_buffers
        # static buffers: the tensors handed out, per key, handed out again while the shape holds
        self._static: Dict[str, Any] = {}
        self._core: Any = _core.DeviceLoader(engine, device=index, static=static_buffers, **settings)

    def _consumer_stream(self) -> Optional[int]:
        """Where the copies into static buffers are queued: torch's current stream (None without torch:
        the legacy default stream)."""
        if self._torch is None:
            return None
        s = int(self._torch.cuda.current_stream(self.index).cuda_stream)
        return s or 1  # torch gives the legacy default stream as 0; DLPack and tokenfeed call it 1

    def _to_output(self, v: Any) -> Any:
        if self._torch is None or not hasattr(v, "__dlpack__"):
            return v
        with self._torch.cuda.device(self.index):
            return self._torch.from_dlpack(v)

    def _torch_batch(self, batch: Dict[str, Any]) -> Dict[str, Any]:
        """A batch's DeviceTensors as torch tensors. ``input_ids`` and ``labels`` are views of ``tokens``
        in device memory; they become torch slices of the one ``tokens`` tensor instead of tensors of
        their own: ``torch.from_dlpack`` costs tens of microseconds of host time each, spent while the
        GPU may be waiting for the step, and the views keep the batch held exactly as long."""
        torch = self._torch
        out: Dict[str, Any] = {}
        with torch.cuda.device(self.index):
            tok = batch.get("tokens")
            t = torch.from_dlpack(tok) if hasattr(tok, "__dlpack__") else None
            for k, v in batch.items():
                if not hasattr(v, "__dlpack__"):  # THD counts (max_seqlen, num_seqs): ints
                    out[k] = v
                elif k == "tokens":
                    out[k] = t
                elif t is not None and k in _TOKEN_VIEWS and t.dim() == 2 and self._is_token_view(v, tok, k):
                    off = _TOKEN_VIEWS[k]
                    out[k] = t[:, off:off + t.shape[1] - 1]
                else:
                    out[k] = torch.from_dlpack(v)
        return out

    @staticmethod
    def _is_token_view(v: Any, tok: Any, key: str) -> bool:
        rows, cols = tok.shape
        return (tuple(v.shape) == (rows, cols - 1) and tuple(v.strides) == tuple(tok.strides)
                and v.dtype == tok.dtype and v.data_ptr == tok.data_ptr + _TOKEN_VIEWS[key] * tok.dtype.itemsize)

    def mark_request(self) -> Optional[int]:
        """The GPU-clock meter's request mark on torch's current stream, before anything else is
        done for the next batch; returns that stream (None without torch: nothing is marked)."""
        s = self._consumer_stream()
        if s is not None:
            self._core.gpu_request(s)
        return s

    def mark_handoff(self, stream: Optional[int]) -> None:
        """The GPU-clock meter's hand-off mark, once the batch is in the consumer's hands."""
        if stream is not None:
            self._core.gpu_handoff(stream)

    def next(self, stream: Optional[int] = None) -> Dict[str, Any]:
        """The next batch on the device (its copy was issued ahead). ``stream``: the consumer's
        stream as :meth:`mark_request` returned it (None: torch's current stream, if torch)."""
        if stream is None:
            stream = self._consumer_stream()
        if not self.static_buffers:
            if self._torch is None:
                batch: Dict[str, Any] = self._core.next()
                return batch
            # torch's current stream waits for the copy here; the tensors' own DLPack exports to
            # that stream then wait on nothing
            return self._torch_batch(self._core.next(stream=stream))
        raw: Dict[str, Any] = self._core.next(stream=stream)
        out: Dict[str, Any] = {}
        for k, v in raw.items():
            if not hasattr(v, "__dlpack__"):  # THD counts (max_seqlen, num_seqs): ints
                out[k] = v
                continue
            held = self._static.get(k)
            if held is None or tuple(held.shape) != tuple(v.shape):
                held = self._static[k] = self._to_output(v)
            out[k] = held
        return out

    @property
    def position(self) -> int:
        """Position of the next batch the consumer receives (never counts batches copied ahead)."""
        return int(self._core.position)

    @property
    def closed(self) -> bool:
        return bool(self._core.closed)

    def seek(self, position: int) -> None:
        """Move to ``position``: what was copied ahead is dropped and fetched again from there."""
        self._core.seek(position)

    def start(self) -> None:
        """Start copying ahead now instead of at the first :meth:`next`."""
        self._core.start()

    def stats(self) -> Dict[str, Any]:
        """copies_issued_ahead, consumer wait (mean, p99), host-to-device bytes and GB/s, staging copies, slots."""
        st: Dict[str, Any] = self._core.stats()
        return st

    def close(self) -> None:
        """Stop the copy thread and wait for copies in flight; batches handed out stay valid."""
        self._core.close()
