"""Helpers the loader modules share (numpy only at import time)."""
from __future__ import annotations

import os
import shutil
from typing import Any, Callable, Dict, Iterator, Optional

import numpy as np


class SampleList:
    """Sampler over the shared shuffled sample list, cycled, starting at `start`."""

    def __init__(self, samples: np.ndarray, n: int, start: int = 0) -> None:
        self.samples, self.n, self.start = samples, n, start

    def __iter__(self) -> Iterator[int]:
        m = len(self.samples)
        for i in range(self.start, self.n):
            yield int(self.samples[i % m])

    def __len__(self) -> int:
        return self.n - self.start


class MemmapSamples:
    """Map-style dataset: sample k = tokens [k*L, k*L + L + 1) of the flat file as int64."""

    def __init__(self, path: str, dtype: str, seq_len: int) -> None:
        self.path, self.dtype, self.L = path, dtype, seq_len
        self.data: Any = None

    def __len__(self) -> int:
        return (os.path.getsize(self.path) // np.dtype(self.dtype).itemsize - 1) // self.L

    def __getitem__(self, k: int) -> Any:
        import torch

        if self.data is None:  # opened lazily in each worker
            self.data = np.memmap(self.path, dtype=self.dtype, mode="r")
        s = int(k) * self.L
        return torch.from_numpy(self.data[s:s + self.L + 1].astype(np.int64))


def cycling(make_iter: Any) -> Any:
    """next() over an iterable that restarts at the end of each epoch."""
    state = {"it": iter(make_iter())}

    def nb() -> Any:
        try:
            return next(state["it"])
        except StopIteration:
            state["it"] = iter(make_iter())
            return next(state["it"])

    return nb


def num_samples(case: dict) -> int:
    return int((os.path.getsize(case["raw"]) // np.dtype(case["raw_dtype"]).itemsize - 1) // case["seq_len"])


def done(path: str) -> bool:
    return os.path.exists(path)


def mark(path: str) -> None:
    with open(path, "w"):
        pass


def peer_path(case: Dict[str, Any], name: str) -> str:
    """Where a peer keeps its converted copy of the data: ``peer_dir/name``, with
    ``-N-shards`` after it when the case asks for N shards."""
    n = case.get("shards")
    return os.path.join(case["peer_dir"], name + (f"-{n}-shards" if n else ""))


def convert_once(path: str, convert: Callable[[Dict[str, Any], str], Dict[str, Any]],
                 case: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """A peer's ``prepare``: ``convert(case, path)`` writes its copy of the data into the
    directory ``path`` and says what it wrote, and a done mark then records the copy as
    finished. None when a finished copy is there already; what a conversion that did not
    finish left is removed first."""
    if done(os.path.join(path, "done")):
        return None
    shutil.rmtree(path, ignore_errors=True)
    info = convert(case, path)
    mark(os.path.join(path, "done"))
    return info


def count_files(path: str, suffix: str) -> int:
    """Files in the directory ``path`` whose names end in ``suffix``."""
    return len([f for f in os.listdir(path) if f.endswith(suffix)])


def loader_state(state_of: Callable[[Any, int, int], Any], dl: Callable[[Dict[str, Any]], Any],
                 case: Dict[str, Any], position: int) -> Any:
    """A peer loader's own state at ``position`` (None at 0): ``state_of`` (from
    ``state_tools``) run over a fresh loader ``dl(case)``."""
    if position == 0:
        return None
    return state_of(dl(case), position // case["batch_size"], case["batch_size"])


def restored(dl: Any, state: Optional[Any]) -> Any:
    """The loader ``dl`` continued from its own ``state`` (None: from the start)."""
    if state is not None:
        dl.load_state_dict(state)
    return dl
