"""Every fault class of remote reading, injected by the proxy in front of moto: server errors,
503 SlowDown, stalls (timeouts), connection resets and short bodies are retried and the stream
stays byte-identical; too many of them give a clear error naming the object and the range; an
object changed since open, a chunk corrupted in the cache and a full cache disk never give
wrong bytes. Counts and bytes are asserted, never time.
"""
from __future__ import annotations

import os
import time

import numpy as np
import pytest

import tokenfeed
from remote_util import write_dataset, FaultProxy, bucket, moto, proxy, s3env  # noqa: F401  (fixtures)


def _write(tmp_path, n_docs=400, seed=0):
    return write_dataset(tmp_path / "src" / "ds", n_docs, seed)


def _open(url, tmp_path, endpoint, **kw):
    opts = dict(cache_dir=tmp_path / "cache", cache_limit="64MB", endpoint_url=endpoint, chunk_size=64 << 10)
    opts.update(kw)
    return tokenfeed.open(url, **opts)


def _stream(ds, n=40):
    loader = tokenfeed.Loader(ds, seq_len=128, batch_size=4, seed=9, shuffle="full")
    it = iter(loader)
    return [np.asarray(next(it)["input_ids"]).copy() for _ in range(n)]


@pytest.fixture
def uploaded(moto, bucket, tmp_path):
    path = _write(tmp_path)
    moto.upload_dir(bucket, "ds", str(path))
    return tokenfeed.open(path), f"s3://{bucket}/ds/"


@pytest.mark.parametrize("fault", ["500", "503", "reset", "short", "stall"])
def test_transient_faults_are_retried(uploaded, moto, tmp_path, fault):
    local, url = uploaded
    p = FaultProxy(moto.port, stall_seconds=30)
    try:
        remote = _open(url, tmp_path, p.endpoint, request_timeout=1.0)
        # three failures in a row on the token chunks: each is retried with backoff
        p.plan(fault, fault, fault, path_contains=".tfs")
        got = _stream(remote)
        want = _stream(local)
        assert all(np.array_equal(a, b) for a, b in zip(got, want))
        assert p.injected == {fault: 3}
        # the third fault may hit a request fetched ahead, still waiting for its timeout
        # when the stream is done: its retry is counted once that ends (bounded wait)
        for _ in range(200):
            if remote.cache_stats()["retries"] >= 3:
                break
            time.sleep(0.05)
        assert remote.cache_stats()["retries"] >= 3
    finally:
        p.stop()


def test_error_rate_stream_identical(uploaded, moto, tmp_path):
    local, url = uploaded
    p = FaultProxy(moto.port, error_rate=0.25, faults=("500", "503", "reset", "short"), seed=4)
    try:
        remote = _open(url, tmp_path, p.endpoint)
        got = _stream(remote, 60)
        assert all(np.array_equal(a, b) for a, b in zip(got, _stream(local, 60)))
        assert sum(p.injected.values()) > 0
        remote.verify(progress=False)
    finally:
        p.stop()


def test_persistent_failure_names_object_and_range(uploaded, proxy, tmp_path):
    local, url = uploaded
    remote = _open(url, tmp_path, proxy.endpoint)
    proxy.plan(*["503"] * 200, path_contains=".tfs")
    with pytest.raises(OSError) as ei:
        remote.tokens(0, 100)
    msg = str(ei.value)
    assert url.rstrip("/") in msg and ".tfs" in msg and "bytes [" in msg
    assert "after 8 attempts" in msg and "SlowDown" in msg
    assert "testing-secret-key" not in msg
    assert proxy.injected["503"] == 8  # bounded: the default attempts, no more


def test_missing_after_open_not_retried(uploaded, moto, bucket, proxy, tmp_path):
    local, url = uploaded
    remote = _open(url, tmp_path, proxy.endpoint)
    name = remote.files()[0]["path"].rsplit("/", 1)[1]
    moto.delete(bucket, f"ds/{name}")
    before = proxy.requests.get("GET", 0)
    with pytest.raises(FileNotFoundError) as ei:
        remote.tokens(0, 10)
    assert name in str(ei.value) and "does not exist" in str(ei.value)
    assert proxy.requests["GET"] - before == 1


@pytest.mark.parametrize("catalog", [False, True], ids=["listed", "from the catalog"])
def test_changed_object_refused(uploaded, moto, bucket, tmp_path, catalog):
    """A shard replaced after open: refused by the version its listing gave (If-Match), or, for
    a dataset opened from its own catalog (no listing, no version), by its chunk checksums."""
    local, url = uploaded
    if not catalog:
        moto.delete(bucket, "ds/tokenfeed.catalog")
    remote = _open(url, tmp_path, moto.endpoint)
    f0 = remote.files()[0]
    name = f0["path"].rsplit("/", 1)[1]
    # the shard opened (the dataset's catalog defers its header to the first touch) by reading its
    # last chunk, not its first
    end = f0["first_token"] + f0["num_tokens"]
    remote.tokens(end - 1, end)
    # the object is replaced by different bytes of the same size after open
    src = os.path.join(local.paths[0], name)
    data = bytearray(open(src, "rb").read())
    data[5000] ^= 0xFF
    moto.put(bucket, f"ds/{name}", bytes(data))
    with pytest.raises(tokenfeed.FormatError if catalog else OSError) as ei:
        remote.tokens(0, 10)
    assert name in str(ei.value)
    if catalog:
        assert "chunk checksum" in str(ei.value) and "catalog" in str(ei.value)
    else:
        assert "changed since the dataset was opened" in str(ei.value)
    assert remote.cache_stats()["refetches"] == 1  # fetched once more, then the error
    # reopening reads the new version (and, the checksums no longer matching, refuses it)
    with pytest.raises(tokenfeed.FormatError):
        _open(url, tmp_path, moto.endpoint).verify(progress=False)


def test_chunk_checksum_mismatch_is_refused(uploaded, moto, bucket, tmp_path):
    """An object whose bytes disagree with its own chunk table (corrupted in the store, or in
    transit) is fetched once more, then refused: never wrong bytes."""
    local, url = uploaded
    name = local.files()[1]["path"].rsplit("/", 1)[1]
    data = bytearray(open(os.path.join(local.paths[0], name), "rb").read())
    data[4096 + 100] ^= 0x01  # a token byte: the header and index stay valid
    moto.put(bucket, f"ds/{name}", bytes(data))
    remote = _open(url, tmp_path, moto.endpoint)
    first = remote.files()[1]["first_token"]
    with pytest.raises(tokenfeed.FormatError) as ei:
        remote.tokens(first, first + 10)
    assert "chunk checksum" in str(ei.value) and name in str(ei.value)
    assert "again after fetching it a second time" in str(ei.value)
    assert remote.cache_stats()["refetches"] == 1


def test_corrupted_cached_chunk_fetched_again(uploaded, moto, tmp_path):
    local, url = uploaded
    remote = _open(url, tmp_path, moto.endpoint)
    n = remote.num_tokens
    assert np.array_equal(remote.tokens(0, n), local.tokens(0, n))
    # as after a restart: no process has the chunks mapped (a chunk is verified when a
    # process maps it)
    del remote
    tokenfeed.remote._remote._stores.clear()
    # flip a byte in every cached chunk file
    flipped = 0
    for root, _d, files in os.walk(tmp_path / "cache" / "objects"):
        for f in files:
            if f.endswith(".c"):
                with open(os.path.join(root, f), "r+b") as fh:
                    fh.seek(10)
                    b = fh.read(1)
                    fh.seek(10)
                    fh.write(bytes([b[0] ^ 0x40]))
                flipped += 1
    assert flipped > 0
    again = _open(url, tmp_path, moto.endpoint)
    assert np.array_equal(again.tokens(0, n), local.tokens(0, n))
    st = again.cache_stats()
    assert st["refetches"] == flipped and st["chunks_fetched"] == flipped


@pytest.mark.test_hooks
def test_full_cache_disk(uploaded, moto, tmp_path, monkeypatch):
    local, url = uploaded
    monkeypatch.setenv("TOKENFEED_FAULT_CACHE", "enospc:2")
    remote = _open(url, tmp_path, moto.endpoint, cache_dir=tmp_path / "full")
    with pytest.raises(OSError) as ei:
        remote.tokens(0, remote.num_tokens)
    assert ei.value.errno == 28 and "cache disk is full" in str(ei.value) and "cache_limit" in str(ei.value)
    info = tokenfeed._core.cache_info(str(tmp_path / "full"))
    assert info["temp_bytes"] == 0  # nothing half-written left behind
    # the chunks that did land are intact, and reading goes on once there is room
    assert np.array_equal(remote.tokens(0, remote.num_tokens), local.tokens(0, local.num_tokens))


def test_cache_dir_others_can_write_is_refused(uploaded, moto, tmp_path):
    local, url = uploaded
    d = tmp_path / "shared"
    d.mkdir()
    os.chmod(d, 0o777)
    with pytest.raises(PermissionError) as ei:
        _open(url, tmp_path, moto.endpoint, cache_dir=d)
    assert "writable by every user" in str(ei.value)
    os.chmod(d, 0o770)
    with pytest.raises(PermissionError, match="writable by its group"):
        _open(url, tmp_path, moto.endpoint, cache_dir=d)
    fresh = tmp_path / "fresh" / "cache"
    _open(url, tmp_path, moto.endpoint, cache_dir=fresh)
    assert (os.stat(fresh).st_mode & 0o777) == 0o700


def test_startup_benchmark_gives_each_process_its_rank(monkeypatch):
    """The start-up benchmark's processes stand for the ranks of a node: each reads its own
    batches (dp_rank of dp_size), not all of them the same one."""
    import json as _json

    monkeypatch.syspath_prepend(os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks"))
    import remote_bench

    launched = []

    class _Done:
        returncode = 0

        def __init__(self, argv, **kw):
            launched.append(argv)

        def communicate(self, timeout=None):
            return _json.dumps({"open_s": 0.0, "first_batch_s": 0.0, "metadata_requests": 0, "files": 1}), ""

    class _Proxy:
        endpoint = "http://127.0.0.1:1"
        requests: dict = {}
        gets: dict = {}

        def reset_counts(self):
            pass

    monkeypatch.setattr(remote_bench.subprocess, "Popen", _Done)
    remote_bench._startup_run("s3://b/ds", _Proxy(), "/nonexistent", 4, {})
    ranks = [tuple(int(a) for a in argv[-2:]) for argv in launched]
    assert sorted(ranks) == [(r, 4) for r in range(4)], launched
    assert "dp_rank=rank" in remote_bench.STARTUP_CHILD and "dp_size=world" in remote_bench.STARTUP_CHILD


def test_node_benchmark_counts_a_node_of_ranks_by_phase(moto, tmp_path, monkeypatch):  # noqa: F811
    """The node benchmark runs its processes (each its own rank) to the first batch, through
    the steady reading and to close(), and counts the node's requests in each phase; every
    range is sent once for the node."""
    import argparse

    monkeypatch.syspath_prepend(os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks"))
    import remote_bench

    args = argparse.Namespace(node_shards=[30], node_procs=2, node_seconds=0.5, startup_kinds="glob",
                              startup_pythonpath="", latency_ms=0.0)
    out = remote_bench.bench_node(moto, str(tmp_path), args)
    rows = out["30"]
    assert set(rows) == {"llm.c, catalog", "llm.c, none"}, rows
    for r in rows.values():
        assert "error" not in r, r
        assert r["first_batch"]["requests"] > 0 and r["close"]["s_max"] >= 0
        assert r["ranges"] >= 30 and r["most_fetches_of_a_range"] == 1, r
