"""Batch engine seen from Python: identical streams whatever the threads, backend
or compression; kept batches are never overwritten; stats; shutdown never hangs."""
from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tokenfeed

from conftest import random_docs
from stalled_next import run_stalled


@pytest.fixture(scope="module")
def twin(tmp_path_factory):
    """The same documents written plain and zstd-compressed, several shards each."""
    docs = random_docs(np.random.default_rng(7), 600, 50257)
    root = tmp_path_factory.mktemp("twin")
    out = []
    for name, comp in (("plain", None), ("zstd", "zstd")):
        with tokenfeed.DatasetWriter(root / name, vocab_size=50257, shard_tokens=30_000, compression=comp,
                                     block_tokens=4096) as w:
            w.add_documents(docs)
        out.append(tokenfeed.open(root / name))
    return out


def stream(ds, n=25, **kw):
    kw.setdefault("seq_len", 100)
    kw.setdefault("batch_size", 5)
    kw.setdefault("seed", 2)
    with tokenfeed.Loader(ds, output="numpy", position_ids=True, cu_seqlens=True, loss_mask=True, **kw) as l:
        out = []
        for _ in range(n):
            b = next(l)
            out.append({k: v.copy() for k, v in b.items()})
        return out


def same(a, b):
    return all(x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x) for x, y in zip(a, b))


@pytest.mark.parametrize("shuffle", ["full", "block"])
def test_identical_across_threads_backends_and_compression(twin, shuffle):
    plain, zstd = twin
    ref = stream(plain, shuffle=shuffle, num_threads=1, backend="mmap")
    for ds in (plain, zstd):
        for threads in (1, 2, 4):
            for backend in ("mmap", "pread", "io_uring"):
                got = stream(ds, shuffle=shuffle, num_threads=threads, backend=backend, prefetch_batches=threads + 1)
                assert same(ref, got), (ds.files()[0]["compressed"], threads, backend)


def test_backend_from_environment_and_stats(twin, monkeypatch):
    plain, _ = twin
    monkeypatch.setenv("TOKENFEED_BACKEND", "pread")
    l = tokenfeed.Loader(plain, seq_len=100, batch_size=5, output="numpy")
    for _ in range(7):
        next(l)
    st = l.stats()
    assert st["backend"] == "pread"
    assert st["batches"] >= 7 and st["tokens"] >= 7 * 5 * 101
    assert st["wait_seconds"] >= 0 and st["ring_slots"] >= 1
    assert set(st) >= {"batches", "tokens", "bytes_read", "wait_seconds", "ring_ready", "ring_slots", "backend",
                       "num_threads", "backend_note"}
    monkeypatch.setenv("TOKENFEED_BACKEND", "bogus")
    with pytest.raises(ValueError, match="TOKENFEED_BACKEND"):
        next(tokenfeed.Loader(plain, seq_len=100, batch_size=5, output="numpy"))


@pytest.mark.parametrize("dtype", ["int32", "int64", "uint16"])
def test_output_dtypes(twin, dtype):
    plain, _ = twin
    l = tokenfeed.Loader(plain, seq_len=64, batch_size=3, dtype=dtype, output="numpy", shuffle=False)
    b = next(l)
    assert b["input_ids"].dtype == np.dtype(dtype)
    assert np.array_equal(b["tokens"][0], plain.tokens(0, 65).astype(dtype))


def test_kept_batch_unchanged_after_1000_more(twin):
    plain, _ = twin
    l = tokenfeed.Loader(plain, seq_len=64, batch_size=4, output="numpy", num_threads=2, prefetch_batches=3)
    kept = next(l)
    snapshot = {k: v.copy() for k, v in kept.items()}
    held_views = kept["labels"]
    del kept
    for _ in range(1000):
        next(l)
    assert np.array_equal(held_views, snapshot["labels"])
    l.close()
    gc.collect()
    assert np.array_equal(held_views, snapshot["labels"])  # survives the loader too


def test_buffers_are_recycled_when_released(twin):
    plain, _ = twin
    l = tokenfeed.Loader(plain, seq_len=64, batch_size=4, output="numpy", num_threads=1, prefetch_batches=2)
    addrs = set()
    for _ in range(200):
        addrs.add(next(l)["tokens"].ctypes.data)  # released at once
    assert len(addrs) <= 8, "released buffers should return to the pool"


def test_close_and_context_manager(twin):
    plain, _ = twin
    with tokenfeed.Loader(plain, seq_len=64, batch_size=4, output="numpy") as l:
        next(l)
        pos = l.position
    assert l.position == pos == 4
    with pytest.raises(ValueError, match="closed"):
        next(l)
    l.close()  # idempotent


def test_interpreter_exit_with_running_loader_does_not_hang(twin, tmp_path):
    plain, _ = twin
    code = textwrap.dedent(f"""
        import tokenfeed
        ds = tokenfeed.open({plain.paths[0]!r})
        l = tokenfeed.Loader(ds, seq_len=64, batch_size=4, num_threads=4, prefetch_batches=8, output="numpy")
        keep = [next(l) for _ in range(5)]
        print("ok", flush=True)
        # exit with live threads, a full ring and batches still referenced
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_loader_from_path_and_repr(twin):
    plain, _ = twin
    l = tokenfeed.Loader(plain.paths[0], seq_len=64, batch_size=2, output="numpy")
    assert "seq_len=64" in repr(l)
    assert next(l)["input_ids"].shape == (2, 64)


def test_thread_sharing_is_refused_not_crashing(twin):
    import threading

    plain, _ = twin
    l = tokenfeed.Loader(plain, seq_len=64, batch_size=2, output="numpy")
    errors = []

    def work():
        try:
            for _ in range(200):
                next(l)
        except RuntimeError as e:
            errors.append(e)

    ts = [threading.Thread(target=work) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert all("another thread" in str(e) for e in errors)


@pytest.mark.test_hooks
@pytest.mark.parametrize("mode", ["sigint", "close"])
def test_blocked_next_is_interruptible(twin, tmp_path, mode):
    """Ctrl-C (SIGINT) or close() from another thread ends a next() that is
    waiting for workers, well before the 60 s the workers are held for."""
    plain, _ = twin
    run_stalled(tmp_path, plain.paths[0], mode, {})


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="Linux /proc/self/smaps")
def test_full_shuffle_over_mmap_advises_random_reads(tmp_path):
    """A full shuffle reads one sample here, one there: the mapped shards are advised
    MADV_RANDOM (the kernel's "rr" flag in /proc/self/smaps), so that a fault on data not
    in the page cache reads the pages it touches instead of a readahead window. Without
    a shuffle, or with another backend, the mapping keeps the default advice."""
    docs = random_docs(np.random.default_rng(3), 200, 50257)
    flags = {}
    for name, kw in (("full", dict(shuffle="full")), ("none", dict(shuffle=False)),
                     ("block", dict(shuffle="block")), ("pread", dict(shuffle="full", backend="pread"))):
        path = tmp_path / name
        with tokenfeed.DatasetWriter(path, vocab_size=50257) as w:
            w.add_documents(docs)
        ds = tokenfeed.open(path)
        with tokenfeed.Loader(ds, seq_len=64, batch_size=4, output="numpy", **kw) as l:
            next(l)
            flags[name] = _vm_flags_of(str(path))
        del ds
    assert flags["full"] and all("rr" in f for f in flags["full"]), flags
    for name in ("none", "block", "pread"):
        assert flags[name] and not any("rr" in f for f in flags[name]), (name, flags)


def _vm_flags_of(prefix: str) -> list:
    """VmFlags of every read-only mapping of a file under `prefix` (the shards' token
    data), from /proc/self/smaps."""
    out, current = [], None
    with open("/proc/self/smaps") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 6 and "-" in parts[0] and ":" in parts[3]:
                current = parts[5] if parts[5].startswith(prefix) else None
            elif current and line.startswith("VmFlags:"):
                flags = line.split()[1:]
                if "rd" in flags and "wr" not in flags:
                    out.append(flags)
    return out
