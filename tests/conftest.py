"""Shared fixtures: generated token data (nothing is downloaded)."""
from __future__ import annotations

import os
import sys
from typing import Callable, List

import numpy as np
import pytest

import tokenfeed

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def random_docs(rng: np.random.Generator, n_docs: int, vocab: int, mean_len: float = 200.0,
                empty_frac: float = 0.0) -> List[np.ndarray]:
    """Documents with log-normal lengths (heavy-tailed, like real corpora)."""
    lens = np.maximum(1, rng.lognormal(np.log(mean_len), 1.0, size=n_docs).astype(np.int64))
    if empty_frac:
        lens[rng.random(n_docs) < empty_frac] = 0
    return [rng.integers(0, vocab, size=int(n), dtype=np.int64) for n in lens]


@pytest.fixture
def make_dataset(tmp_path) -> Callable[..., tokenfeed.Dataset]:
    """make_dataset(n_docs=..., vocab=..., shard_tokens=..., seed=..., **writer_kw) -> Dataset."""
    counter = [0]

    def make(n_docs: int = 300, vocab: int = 50257, shard_tokens: int = 1 << 28, seed: int = 0,
             mean_len: float = 200.0, docs=None, **kw) -> tokenfeed.Dataset:
        counter[0] += 1
        path = tmp_path / f"ds{counter[0]}"
        if docs is None:
            docs = random_docs(np.random.default_rng(seed), n_docs, vocab, mean_len)
        with tokenfeed.DatasetWriter(path, vocab_size=vocab, shard_tokens=shard_tokens, **kw) as w:
            for d in docs:
                w.add_document(d)
        ds = tokenfeed.open(path)
        ds._test_docs = docs  # type: ignore[attr-defined]
        return ds

    return make


def torch_or_skip():
    return pytest.importorskip("torch")
