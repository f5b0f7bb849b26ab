"""The Loader: packed, shuffled, rank-partitioned batches with exact, elastic resume.

The order is computed in C (see docs/order.md): a configuration defines one infinite
stream of samples; global batch ``b`` is positions ``[b*G, (b+1)*G)`` and rank ``r`` of
``R`` takes the contiguous slice ``[b*G + r*B, b*G + (r+1)*B)`` with ``B = G/R``. The
state is that position plus fingerprints, so restoring is O(1) and works with any
``R'`` that divides ``G``.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any, Dict, Iterator, Mapping, Optional, Sequence, Union

import numpy as np

from . import _core
from ._dataset import Dataset, PathLike, open as _open

__all__ = ["Loader", "StateError", "STATE_FORMAT_VERSION"]

STATE_FORMAT_VERSION = 1
_INFINITE = (1 << 64) - 1
_SHUFFLE = {"none": _core.SHUFFLE_NONE, "full": _core.SHUFFLE_FULL, "block": _core.SHUFFLE_BLOCK}


class StateError(ValueError):
    """A saved loader state does not match this loader (other data or configuration)."""


def _resolve_rank(rank: Optional[int], world_size: Optional[int]) -> tuple[int, int]:
    if rank is not None and world_size is not None:
        return int(rank), int(world_size)
    r: Optional[int] = None
    w: Optional[int] = None
    dist = sys.modules.get("torch.distributed")  # initialised only if torch was imported
    if dist is not None and dist.is_available() and dist.is_initialized():
        r, w = dist.get_rank(), dist.get_world_size()
    elif "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        r, w = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    else:
        r, w = 0, 1
    return (int(rank) if rank is not None else r, int(world_size) if world_size is not None else w)


def _torch_available() -> bool:
    return "torch" in sys.modules or importlib.util.find_spec("torch") is not None


class Loader:
    """Iterate batches of packed token sequences for this rank.

    Each batch is a dict: ``input_ids`` and ``labels`` (``batch_size x seq_len``, views of
    one ``batch_size x (seq_len + 1)`` buffer also given as ``tokens``), plus
    ``position_ids``, ``cu_seqlens``/``num_seqs`` and ``loss_mask`` when asked for. Arrays
    are torch tensors when torch is importable (``output="auto"``), else NumPy.

    ``batch_size`` is per rank; the global batch is ``batch_size * world_size``. ``rank``
    and ``world_size`` default to ``torch.distributed`` when initialised, then to the
    ``RANK``/``WORLD_SIZE`` environment variables, then to 0/1. ``epochs=None`` streams
    forever; with ``epochs=k`` the stream stops after ``k`` epochs, dropping the final
    partial *global* batch so every rank gets the same number of batches.

    The C engine (threads, buffers) starts lazily in the process that iterates, so a
    Loader can be created before ``fork`` or pickled to a ``spawn`` worker.
    """

    def __init__(self, dataset: Union[Dataset, PathLike, Sequence[PathLike]], *, seq_len: int, batch_size: int,
                 seed: int = 0, shuffle: Union[bool, str] = True, rank: Optional[int] = None,
                 world_size: Optional[int] = None, epochs: Optional[int] = None, separator_id: Optional[int] = None,
                 position_ids: bool = False, cu_seqlens: bool = False, loss_mask: bool = False,
                 dtype: Any = "int64", output: str = "auto", num_threads: Optional[int] = None,
                 prefetch: Optional[int] = None, backend: Optional[str] = None, direct_io: bool = False,
                 block_size: int = 1024, window_blocks: int = 16, packing: str = "concat") -> None:
        self.dataset = dataset if isinstance(dataset, Dataset) else _open(dataset)
        for name, v in (("seq_len", seq_len), ("batch_size", batch_size), ("block_size", block_size),
                        ("window_blocks", window_blocks)):
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if isinstance(shuffle, bool):
            shuffle_mode = "full" if shuffle else "none"
        elif shuffle in _SHUFFLE:
            shuffle_mode = shuffle
        else:
            raise ValueError(f"shuffle must be True, False, 'full', 'block' or 'none', got {shuffle!r}")
        if packing != "concat":
            raise NotImplementedError(f"packing={packing!r} is not available yet; use 'concat'")
        if epochs is not None and (not isinstance(epochs, (int, np.integer)) or epochs < 1):
            raise ValueError(f"epochs must be None or a positive int, got {epochs!r}")
        r, w = _resolve_rank(rank, world_size)
        if w < 1 or not 0 <= r < w:
            raise ValueError(f"need 0 <= rank < world_size, got rank={r}, world_size={w}")
        if output not in ("auto", "torch", "numpy"):
            raise ValueError(f"output must be 'auto', 'torch' or 'numpy', got {output!r}")
        if output == "auto":
            output = "torch" if _torch_available() else "numpy"
        self.output = output
        self.seq_len = int(seq_len)
        self.batch_size = int(batch_size)
        self.rank, self.world_size = r, w
        self.global_batch = self.batch_size * w
        self.out_dtype = np.dtype(dtype)
        want = ((_core.WANT_POSITION_IDS if position_ids else 0) | (_core.WANT_CU_SEQLENS if cu_seqlens else 0)
                | (_core.WANT_LOSS_MASK if loss_mask else 0))
        # everything that changes the global stream (recorded in the state)
        self._config: Dict[str, Any] = {
            "packing": packing, "seq_len": self.seq_len, "separator_id": separator_id, "seed": int(seed),
            "shuffle": shuffle_mode, "block_size": int(block_size), "window_blocks": int(window_blocks),
            "global_batch": self.global_batch, "epochs": epochs,
        }
        self._order_kw: Dict[str, Any] = dict(
            seq_len=self.seq_len, seed=int(seed), shuffle=_SHUFFLE[shuffle_mode], block_size=int(block_size),
            window_blocks=int(window_blocks), global_batch=self.global_batch, epochs=epochs or 0,
            separator_id=separator_id)
        self._engine_kw: Dict[str, Any] = dict(
            batch_size=self.batch_size, rank=r, world_size=w, dtype=self.out_dtype.name, want=want,
            num_threads=num_threads or 0, prefetch=prefetch or 0, backend=backend,
            direct_io=1 if direct_io else 0)
        # validates the configuration now, not at the first batch
        self._order = _core.Order(self.dataset._core, **self._order_kw)
        self.num_samples: int = self._order.num_samples
        self.config_fingerprint = f"{self._order.fingerprint:016x}"
        self._position = 0
        self._engine: Optional[Any] = None
        self._closed = False
        if output == "torch":
            import torch  # noqa: F401  (fail now, not at the first batch)

    # ---------------------------------------------------------------- engine
    def _get_engine(self) -> Any:
        if self._closed:
            raise ValueError("the loader is closed")
        # After fork() the engine object is a copy: the C layer notices the new
        # process on the next call and starts fresh threads at the same position.
        if self._engine is None:
            eng = _core.Loader(self.dataset._core, **self._order_kw, **self._engine_kw)
            if self._position:
                eng.seek(self._position)
            self._engine = eng
        return self._engine

    @property
    def position(self) -> int:
        """Global stream position (in samples) of the next batch this rank will receive."""
        if self._engine is not None and not self._engine.closed:
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
        return max(0, (n - self.position) // self.global_batch)

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        return self

    def __next__(self) -> Dict[str, Any]:
        batch = self._get_engine().next()
        if self.output == "torch":
            import torch

            return {k: torch.from_numpy(v) for k, v in batch.items()}
        return batch

    def close(self) -> None:
        """Stop the worker threads. Batches already handed out stay valid."""
        if self._engine is not None:
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
            if self._engine is not None:
                self._engine.close()
        except Exception:
            pass

    def stats(self) -> Dict[str, Any]:
        """Batches, tokens, bytes read, backend in use, seconds the consumer waited, ring occupancy."""
        return self._get_engine().stats()

    # --------------------------------------------------------------- pickling
    def __getstate__(self) -> Dict[str, Any]:
        d = self.__dict__.copy()
        d["_position"] = self.position
        d["_engine"] = None
        d["_order"] = None
        return d

    def __setstate__(self, d: Dict[str, Any]) -> None:
        self.__dict__.update(d)
        self._order = _core.Order(self.dataset._core, **self._order_kw)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> Dict[str, Any]:
        """A small JSON-able dict that resumes the exact stream (on any world size dividing the global batch)."""
        return {
            "format_version": STATE_FORMAT_VERSION,
            "dataset_fingerprint": self.dataset.fingerprint,
            "config_fingerprint": self.config_fingerprint,
            "position": self.position,
            "config": dict(self._config),
            "samples_per_epoch": self.num_samples,
            "world_size": self.world_size,
        }

    def load_state_dict(self, state: Mapping[str, Any], *, strict: bool = True) -> None:
        """Continue from ``state`` (from :meth:`state_dict`, possibly saved with another world size).

        A state from other data, or (with ``strict=True``) another configuration, raises
        :class:`StateError` naming what differs. ``strict=False`` deliberately accepts a
        changed configuration (a new seed from here on, say) and keeps the position.
        """
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a dict from Loader.state_dict(), got {type(state).__name__}")
        missing = [k for k in ("format_version", "dataset_fingerprint", "config_fingerprint", "position", "config")
                   if k not in state]
        if missing:
            raise StateError(f"not a tokenfeed loader state: missing {', '.join(missing)}")
        if state["format_version"] != STATE_FORMAT_VERSION:
            raise StateError(f"state format version {state['format_version']} is not supported "
                             f"(this tokenfeed reads version {STATE_FORMAT_VERSION})")
        if state["dataset_fingerprint"] != self.dataset.fingerprint:
            raise StateError(
                f"the dataset changed: the state was saved on data with fingerprint {state['dataset_fingerprint']}"
                f" ({state.get('samples_per_epoch', '?')} samples per epoch), this loader reads "
                f"{self.dataset.fingerprint} ({self.num_samples} samples per epoch). Point the loader at the "
                f"same files (in the same order) to resume.")
        saved = dict(state["config"])
        if state["config_fingerprint"] != self.config_fingerprint or saved != self._config:
            diffs = [f"{k}: saved {saved.get(k)!r}, now {self._config.get(k)!r}"
                     for k in sorted(set(saved) | set(self._config)) if saved.get(k) != self._config.get(k)]
            if strict:
                detail = "; ".join(diffs) if diffs else "config fingerprint differs"
                raise StateError(f"the loader configuration changed ({detail}). Restore with the saved settings, "
                                 f"or pass strict=False to continue from the saved position with the new ones.")
        pos = int(state["position"])
        if pos < 0 or pos % self.global_batch:
            raise StateError(f"position {pos} is not a multiple of the global batch {self.global_batch}: "
                             f"keep batch_size * world_size the same as when the state was saved")
        self._position = pos
        if self._engine is not None:
            self._engine.seek(pos)

    def __repr__(self) -> str:
        return (f"tokenfeed.Loader(seq_len={self.seq_len}, batch_size={self.batch_size}, rank={self.rank}/"
                f"{self.world_size}, shuffle={self._config['shuffle']!r}, seed={self._config['seed']}, "
                f"position={self.position}, samples_per_epoch={self.num_samples})")
