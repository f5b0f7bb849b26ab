"""Helpers the loader modules share (numpy only at import time)."""
from __future__ import annotations

import os
from typing import Any, Iterator

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
