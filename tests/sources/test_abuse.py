"""Abuse tests: inputs at and past the edges of what the
library accepts. Each case must end in a clear Python exception or in the
right data: never a crash, never a hang, never silent garbage.

A hang would stall CI for its whole budget, so every test here runs under a
faulthandler watchdog that dumps the stacks and exits the process if one
test takes longer than WATCHDOG_S seconds.
"""
from __future__ import annotations

import faulthandler
import os
import sys
import time

import numpy as np
import pytest

import tokenfeed
from conftest import write_llmc

WATCHDOG_S = 300

# Exceptions that count as "clear" for bad arguments: the documented ones, and
# OverflowError, which CPython itself raises for ints that do not fit a C type.
CLEAR = (ValueError, TypeError, IndexError, OverflowError, tokenfeed.FormatError)


@pytest.fixture(autouse=True)
def watchdog():
    faulthandler.dump_traceback_later(WATCHDOG_S, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


def native(tmp_path, docs, name="ds", vocab=1000, **kw) -> tokenfeed.Dataset:
    p = tmp_path / name
    with tokenfeed.DatasetWriter(p, vocab_size=vocab, **kw) as w:
        for d in docs:
            w.add_document(np.asarray(d, dtype=np.int64))
    return tokenfeed.open(p)


def all_batches(loader) -> list:
    out = []
    for b in loader:
        out.append(np.array(b["tokens"]))
    return out


def expected_samples(stream: np.ndarray, seq_len: int) -> np.ndarray:
    """Unshuffled concat packing: sample i = stream[i*L : i*L + L + 1]."""
    n = (len(stream) - 1) // seq_len
    return np.stack([stream[i * seq_len: i * seq_len + seq_len + 1] for i in range(n)])


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


# ---------------------------------------------------------------- many shards

@pytest.mark.parametrize("fmt", ["llm.c", "raw"])
def test_ten_thousand_shards(tmp_path, fmt):
    n_files, per = 10_000, 7
    rng = np.random.default_rng(0)
    toks = rng.integers(0, 50000, size=n_files * per).astype(np.uint16)
    paths = []
    for i in range(n_files):
        p = str(tmp_path / f"s{i:05d}.bin")
        if fmt == "llm.c":
            write_llmc(p, toks[i * per:(i + 1) * per])
        else:
            toks[i * per:(i + 1) * per].tofile(p)
        paths.append(p)
    fds = fd_count()
    t0 = time.perf_counter()
    ds = tokenfeed.open(paths, dtype="uint16" if fmt == "raw" else None)
    dt = time.perf_counter() - t0
    assert dt < 20, f"opening 10^4 small files took {dt:.1f}s"
    # mappings, not open descriptors: 10^4 files must not use 10^4 fds
    assert fd_count() - fds < 16
    assert ds.num_files == n_files and ds.num_tokens == len(toks) and ds.num_documents == n_files
    assert np.array_equal(ds.tokens(0, ds.num_tokens), toks)
    assert np.array_equal(ds[n_files - 1], toks[-per:])
    assert ds.find_document(ds.num_tokens - 1) == n_files - 1
    # samples cross file boundaries; check a whole epoch against the stream
    L = 5
    with tokenfeed.Loader(ds, seq_len=L, batch_size=512, shuffle=False, epochs=1, output="numpy") as loader:
        got = np.concatenate(all_batches(loader))
    want = expected_samples(toks.astype(np.int64), L)
    assert np.array_equal(got, want[:len(got)])
    assert len(want) - len(got) < 512
    del ds


# ------------------------------------------------------- zero-token documents

def test_zero_token_documents(tmp_path):
    docs = [[], [1, 2, 3], [], [], [4], [], [5, 6, 7, 8, 9], []]
    ds = native(tmp_path, docs)
    assert ds.num_documents == len(docs)
    for i, d in enumerate(docs):
        assert list(ds[i]) == d
    stream = np.concatenate([np.asarray(d, dtype=np.int64) for d in docs])
    # a token position belongs to a non-empty document
    for pos in range(ds.num_tokens):
        j = ds.find_document(pos)
        assert len(docs[j]) > 0
    ds.verify(progress=False)
    with tokenfeed.Loader(ds, seq_len=2, batch_size=1, shuffle=False, epochs=1, output="numpy",
                          position_ids=True, cu_seqlens=True, loss_mask=True) as loader:
        batches = list(loader)
    got = np.concatenate([np.array(b["tokens"]) for b in batches])
    assert np.array_equal(got, expected_samples(stream, 2))
    for b in batches:
        assert (np.array(b["position_ids"]) >= 0).all()
    # with a separator, empty documents still contribute their separator
    with tokenfeed.Loader(ds, seq_len=3, batch_size=1, shuffle=False, epochs=1, output="numpy",
                          separator_id=999) as loader:
        got = np.concatenate(all_batches(loader))
    sep_stream = np.concatenate([np.append(np.asarray(d, dtype=np.int64), 999) for d in docs])
    assert np.array_equal(got, expected_samples(sep_stream, 3))


def test_only_zero_token_documents(tmp_path):
    p = tmp_path / "empty"
    with tokenfeed.DatasetWriter(p, vocab_size=10) as w:
        for _ in range(5):
            w.add_document(np.zeros(0, dtype=np.int64))
    with pytest.raises(tokenfeed.FormatError, match="empty dataset"):
        tokenfeed.open(p)


def test_empty_foreign_files(tmp_path):
    p = tmp_path / "e.bin"
    write_llmc(p, [])
    with pytest.raises(tokenfeed.FormatError, match="e.bin"):
        tokenfeed.open(p)
    q = tmp_path / "e.npy"
    np.save(q, np.zeros(0, dtype=np.uint16))
    with pytest.raises(tokenfeed.FormatError, match="e.npy"):
        tokenfeed.open(q)
    # an empty file inside a list is fine as long as the dataset has tokens
    r = tmp_path / "one.bin"
    write_llmc(r, [7, 8])
    ds = tokenfeed.open([p, r, q])
    assert ds.num_tokens == 2 and list(ds.tokens(0, 2)) == [7, 8]


# ------------------------------------------------ shorter than one sample etc.

def test_dataset_shorter_than_one_sample(tmp_path):
    ds = native(tmp_path, [[1, 2, 3, 4, 5]])
    with pytest.raises(ValueError, match="shorter than one sample"):
        tokenfeed.Loader(ds, seq_len=5, batch_size=1, output="numpy")
    with pytest.raises(ValueError, match="shorter than one sample"):
        tokenfeed.Loader(ds, seq_len=10**6, batch_size=1, output="numpy")
    # exactly one sample: seq_len + 1 == tokens
    with tokenfeed.Loader(ds, seq_len=4, batch_size=1, epochs=3, output="numpy") as loader:
        got = all_batches(loader)
    assert len(got) == 3 and all(list(b[0]) == [1, 2, 3, 4, 5] for b in got)


def test_one_token_dataset(tmp_path):
    ds = native(tmp_path, [[3]])
    with pytest.raises(ValueError, match="shorter than one sample"):
        tokenfeed.Loader(ds, seq_len=1, batch_size=1, output="numpy")


def test_seq_len_one(tmp_path):
    rng = np.random.default_rng(1)
    docs = [rng.integers(0, 1000, size=int(n)) for n in rng.integers(0, 20, size=50)]
    ds = native(tmp_path, docs)
    stream = np.concatenate(docs).astype(np.int64)
    with tokenfeed.Loader(ds, seq_len=1, batch_size=7, shuffle=False, epochs=1, output="numpy",
                          position_ids=True, cu_seqlens=True, loss_mask=True) as loader:
        batches = list(loader)
    got = np.concatenate([np.array(b["tokens"]) for b in batches])
    assert got.shape[1] == 2
    assert np.array_equal(got, expected_samples(stream, 1)[:len(got)])
    b = batches[0]
    assert np.array(b["input_ids"]).shape == (7, 1) and np.array(b["labels"]).shape == (7, 1)
    assert (np.array(b["position_ids"]) == 0).all()


def test_seq_len_million(tmp_path):
    L = 10**6
    toks = (np.arange(2 * L + 5) % 50000).astype(np.uint16)
    p = tmp_path / "big.npy"
    np.save(p, toks)
    ds = tokenfeed.open(p)
    with tokenfeed.Loader(ds, seq_len=L, batch_size=1, shuffle=False, epochs=1, output="numpy",
                          position_ids=True, cu_seqlens=True, loss_mask=True) as loader:
        batches = list(loader)
    assert len(batches) == 2
    for i, b in enumerate(batches):
        t = np.array(b["tokens"])
        assert t.shape == (1, L + 1)
        assert np.array_equal(t[0], toks[i * L: i * L + L + 1].astype(np.int64))
        assert np.array(b["position_ids"]).shape == (1, L)
    # shuffled and infinite too
    with tokenfeed.Loader(ds, seq_len=L, batch_size=2, seed=3, output="numpy") as loader:
        for _ in range(3):
            assert np.array(next(loader)["tokens"]).shape == (2, L + 1)


def test_seq_len_past_the_int32_outputs(tmp_path):
    # cu_seqlens/position_ids are int32: a seq_len they cannot hold must be refused
    ds = native(tmp_path, [[1, 2, 3]])
    with pytest.raises(ValueError):
        tokenfeed.Loader(ds, seq_len=2**31, batch_size=1, output="numpy")


# --------------------------------------------------------- world size > samples

def test_world_size_larger_than_samples(tmp_path):
    toks = np.arange(13) % 1000
    ds = native(tmp_path, [toks])
    L, W = 4, 8  # N = 3 samples, global batch 8
    ref = tokenfeed.Loader(ds, seq_len=L, batch_size=W, seed=5, output="numpy")
    want = np.array(next(ref)["tokens"])
    ref.close()
    got = []
    for r in range(W):
        with tokenfeed.Loader(ds, seq_len=L, batch_size=1, rank=r, world_size=W, seed=5,
                              output="numpy") as loader:
            assert loader.num_samples == 3
            got.append(np.array(next(loader)["tokens"]))
    assert np.array_equal(np.concatenate(got), want)
    # a finite stream that cannot fill one global batch is refused up front
    with pytest.raises(ValueError, match="global batch"):
        tokenfeed.Loader(ds, seq_len=L, batch_size=1, rank=0, world_size=W, epochs=1, output="numpy")
    # ... and a huge world size is just a large global batch
    with tokenfeed.Loader(ds, seq_len=L, batch_size=1, rank=999_999, world_size=1_000_000,
                          output="numpy") as loader:
        assert np.array(next(loader)["tokens"]).shape == (1, L + 1)


# ------------------------------------------------------------- bad arguments

@pytest.fixture
def small(tmp_path):
    return native(tmp_path, [np.arange(k * 3) % 1000 for k in range(10)])


BAD_OPEN = [
    (dict(path=123), TypeError),
    (dict(path=None), TypeError),
    (dict(path=[]), ValueError),
    (dict(path=["DS", None]), TypeError),
    (dict(path="DS", dtype="float99"), TypeError),
    (dict(path="DS", dtype="float32"), ValueError),
    (dict(path="DS", format="nope"), ValueError),
    (dict(path="DS", format=3), TypeError),
]


@pytest.mark.parametrize("kw,exc", BAD_OPEN, ids=[repr(k) for k, _ in BAD_OPEN])
def test_open_bad_arguments(small, kw, exc):
    kw = dict(kw)
    p = kw.pop("path")
    p = [small.paths[0] if x == "DS" else x for x in p] if isinstance(p, list) else (small.paths[0] if p == "DS" else p)
    with pytest.raises(exc):
        tokenfeed.open(p, **kw)


def test_open_missing_paths(tmp_path):
    for p in ["", str(tmp_path / "nope"), str(tmp_path / "nope" / "deeper")]:
        with pytest.raises(FileNotFoundError):
            tokenfeed.open(p)
    with pytest.raises(FileNotFoundError, match="nope"):
        tokenfeed.open([str(tmp_path / "nope")], dtype="uint16")
    # not a regular file
    with pytest.raises(CLEAR + (OSError,)):
        tokenfeed.open("/dev/null", dtype="uint16")


def test_open_path_with_nul(small):
    with pytest.raises(ValueError):
        tokenfeed.open(small.paths[0] + "\0suffix")


def test_dataset_accessors_bad_arguments(small):
    n, t = small.num_documents, small.num_tokens
    for bad in [n, 10**20, -n - 1, -10**20]:
        with pytest.raises(IndexError):
            small.document(bad)
    for bad in ["a", 1.0, None, [1]]:
        with pytest.raises(TypeError):
            small.document(bad)
    for a, b in [(-1, 5), (0, t + 1), (5, 1), (0, 10**30), (10**30, 10**30 + 1)]:
        with pytest.raises(IndexError):
            small.tokens(a, b)
    with pytest.raises(TypeError):
        small.tokens("a", 5)
    for bad in [t, 10**30, -1]:
        with pytest.raises((IndexError, OverflowError)):
            small.find_document(bad)
    with pytest.raises(TypeError):
        small.find_document("x")
    small.verify(threads=-5, progress=False)  # <= 0 means "all cores"
    with pytest.raises(CLEAR):
        small.verify(threads=10**30, progress=False)
    with pytest.raises(TypeError):
        small.verify(threads="x", progress=False)
    with pytest.raises(TypeError):
        small.verify(progress=3, threads=1)


BAD_LOADER = [
    ("seq_len", [0, -1, 1.5, "3", True, None, 2**63, 2**64]),
    ("batch_size", [0, -1, "2", None, 2**64]),
    ("seed", [-1, 2**64, 2**70, "x"]),
    ("rank", [-1, 4, 2**64]),
    ("world_size", [0, -1, 2**64]),
    ("epochs", [0, -1, "1", 1.5, 2**64]),
    ("separator_id", [-2, 10**6, 2**64, "x"]),
    ("dtype", ["float99", object]),
    ("num_threads", [-1, 10**6, 2**64, "x"]),
    ("prefetch", [-1, 2**64]),
    ("backend", ["nope", 3]),
    ("shuffle", ["x", 3, None]),
    ("block_size", [0, -3, 2**64]),
    ("window_blocks", [0, 2**64]),
    ("output", ["x", None]),
    ("packing", ["best"]),
]


@pytest.mark.parametrize("name,value", [(k, v) for k, vs in BAD_LOADER for v in vs],
                         ids=[f"{k}={v!r}" for k, vs in BAD_LOADER for v in vs])
def test_loader_bad_arguments(small, name, value):
    kw = dict(seq_len=4, batch_size=2, output="numpy")
    kw[name] = value
    if name == "rank":
        kw["world_size"] = 4
    if name == "world_size":
        kw["rank"] = 0
    # the error may come at construction or, for engine settings, at the first batch
    with pytest.raises(CLEAR + (NotImplementedError,)):
        loader = tokenfeed.Loader(small, **kw)
        try:
            next(loader)
        finally:
            loader.close()


def test_loader_huge_batch_is_memory_error(small):
    loader = tokenfeed.Loader(small, seq_len=4, batch_size=2**40, output="numpy")
    with pytest.raises((MemoryError, ValueError)):
        next(loader)
    loader.close()


def test_loader_after_close(small):
    loader = tokenfeed.Loader(small, seq_len=4, batch_size=2, output="numpy")
    next(loader)
    loader.close()
    loader.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        next(loader)


def test_loader_bad_states(small):
    loader = tokenfeed.Loader(small, seq_len=4, batch_size=2, output="numpy")
    good = loader.state_dict()
    bad_states = [
        {}, {"position": 0}, dict(good, format_version=99), dict(good, dataset_fingerprint="0" * 16),
        dict(good, position=-2), dict(good, position=3), dict(good, config={}),
    ]
    for st in bad_states:
        with pytest.raises(ValueError):  # StateError is a ValueError
            loader.load_state_dict(st)
    for st in ["x", None, 3, [good]]:
        with pytest.raises(TypeError):
            loader.load_state_dict(st)
    # a position far past the end of a finite stream is refused at the load, not at next()
    fin = tokenfeed.Loader(small, seq_len=4, batch_size=2, epochs=1, output="numpy")
    st = fin.state_dict()
    st["position"] = 2 * 10**15
    with pytest.raises(tokenfeed.StateError, match="past the end of this stream"):
        fin.load_state_dict(st)
    fin.close()
    loader.close()


BAD_WRITER = [
    dict(vocab_size=0), dict(vocab_size=-1), dict(vocab_size="x"), dict(vocab_size=None),
    dict(vocab_size=2**40), dict(vocab_size=300, dtype="uint8"), dict(vocab_size=10, dtype="int64"),
    dict(vocab_size=10, dtype="float32"), dict(vocab_size=10, shard_tokens=0),
    dict(vocab_size=10, shard_tokens=-5), dict(vocab_size=10, block_tokens=0),
    dict(vocab_size=10, compression="lz4"),
    dict(vocab_size=10, shard_tokens=2**64),
]


@pytest.mark.parametrize("kw", BAD_WRITER)
def test_writer_bad_arguments(tmp_path, kw):
    with pytest.raises(CLEAR):
        tokenfeed.DatasetWriter(tmp_path / "w", **kw)
    assert not (tmp_path / "w" / "tokenfeed.manifest").exists()


@pytest.mark.parametrize("doc", [
    np.array([0, 10]), np.array([-1]), np.array([2**40]), np.zeros((2, 2), dtype=np.int64),
    np.array([1.5]), "abc", None, [[1, 2], [3]], np.array([1], dtype=object),
], ids=["ge_vocab", "negative", "huge", "2d", "float", "str", "none", "ragged", "object"])
def test_writer_bad_documents(tmp_path, doc):
    w = tokenfeed.DatasetWriter(tmp_path / "w", vocab_size=10)
    w.add_document([1, 2, 3])
    with pytest.raises(CLEAR):
        w.add_document(doc)
    w.abort()
    assert not (tmp_path / "w" / "tokenfeed.manifest").exists()


def test_writer_after_close(tmp_path):
    w = tokenfeed.DatasetWriter(tmp_path / "w", vocab_size=10)
    w.add_document([1, 2])
    w.close()
    w.close()
    with pytest.raises(ValueError):
        w.add_document([1])


def test_writer_huge_block_tokens(tmp_path):
    # block_tokens that cannot be a compressed block must be refused, not allocated
    with pytest.raises(CLEAR + (MemoryError,)):
        with tokenfeed.DatasetWriter(tmp_path / "w", vocab_size=10, compression="zstd", block_tokens=2**62) as w:
            w.add_document([1, 2, 3])


def test_many_loaders_on_one_dataset(small):
    # loaders are independent; creating many and dropping them must not leak fds or threads
    import threading

    fds, threads = fd_count(), threading.active_count()
    for i in range(200):
        with tokenfeed.Loader(small, seq_len=3, batch_size=2, seed=i, output="numpy") as loader:
            next(loader)
    assert fd_count() - fds < 8
    assert threading.active_count() == threads


def test_dataset_survives_loader_and_vice_versa(tmp_path):
    ds = native(tmp_path, [np.arange(100) % 1000])
    loader = tokenfeed.Loader(ds, seq_len=9, batch_size=2, shuffle=False, output="numpy")
    b = next(loader)
    del ds
    b2 = next(loader)
    assert np.array(b["tokens"]).shape == (2, 10) and np.array(b2["tokens"]).shape == (2, 10)
    loader.close()
    del loader
    assert list(np.array(b["tokens"])[0]) == list(range(10))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
