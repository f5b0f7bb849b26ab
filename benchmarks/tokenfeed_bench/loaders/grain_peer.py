"""Grain: a random-access source over the flat token file (numpy, no torch), an
``IndexSampler`` with Grain's own global shuffle, ``Batch``, and a ``DataLoader`` with
worker processes. Its iterator's ``get_state``/``set_state`` is Grain's resumable state."""
from __future__ import annotations

from typing import Any, Dict

import numpy as np

from ..worker import Feed
from .common import num_samples

IMPORTS = ("grain",)


RESTORE_METHOD = "its own get_state()/set_state() at the position"


def version() -> str:
    import importlib.metadata as md

    return md.version("grain")


class TokenSource:
    """grain.RandomAccessDataSource protocol: __len__ and __getitem__ -> int64 sample."""

    def __init__(self, path: str, dtype: str, seq_len: int, n: int) -> None:
        self.path, self.dtype, self.L, self.n = path, dtype, seq_len, n
        self.data: Any = None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, k: int) -> Any:
        if self.data is None:  # opened lazily in each worker process
            self.data = np.memmap(self.path, dtype=self.dtype, mode="r")
        s = int(k) * self.L
        return self.data[s:s + self.L + 1].astype(np.int64)

    def __repr__(self) -> str:  # Grain's state names the source; the same data must give the same name
        return f"TokenSource({self.path!r}, {self.dtype}, {self.L}, {self.n})"

    def __getstate__(self) -> Dict[str, Any]:
        return dict(self.__dict__, data=None)


def _grain() -> Any:
    try:
        import grain.python as gp
    except ImportError:
        import grain as gp  # type: ignore[no-redef]
    return gp


def _loader(case: Dict[str, Any]) -> Any:
    gp = _grain()
    n = num_samples(case)
    src = TokenSource(case["raw"], case["raw_dtype"], case["seq_len"], n)
    sampler = gp.IndexSampler(num_records=n, shard_options=gp.NoSharding(), shuffle=True, num_epochs=None,
                              seed=case["seed"])
    return gp.DataLoader(data_source=src, sampler=sampler,
                         operations=[gp.Batch(batch_size=case["batch_size"], drop_remainder=True)],
                         worker_count=case["workers"])


def _feed(it: Any) -> Feed:
    def nb() -> None:
        next(it)

    return Feed(nb)


def open(case: Dict[str, Any]) -> Feed:  # noqa: A001
    return _feed(iter(_loader(case)))


def make_state(case: Dict[str, Any], position: int) -> Any:
    import json

    from . import state_tools

    if position == 0:
        return None
    it = iter(_loader(case))
    next(it)
    return state_tools.grain_state(json.loads(it.get_state()), position // case["batch_size"], case["batch_size"])


def restore(case: Dict[str, Any], state: Any) -> Feed:
    """A fresh iterator given Grain's own state (``set_state``)."""
    import json

    it = iter(_loader(case))
    if state is not None:
        it.set_state(json.dumps(state).encode())
    return _feed(it)
