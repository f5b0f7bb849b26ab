"""The metadata of a remote dataset is read once per node: the first open records what its
requests fetched in the cache directory, and a restart or the node's other processes open from
that record, asking the store only whether its objects are still those recorded (a HEAD each, or
one listing of their prefix). Requests are counted at the proxy in front of moto's S3 server; an
object rewritten after its metadata was recorded is seen at the next open, which reads the new
version as a node without a record does. Counts and bytes, never time.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tokenfeed
from remote_util import INTERRUPTIBLE, FaultProxy, as_background_job, bucket, moto, write_dataset  # noqa: F401  (fixtures)

CHILD = INTERRUPTIBLE + textwrap.dedent("""
    import hashlib, json, sys, numpy as np, tokenfeed
    url, cache, endpoint, batches = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    ds = tokenfeed.open(url, cache_dir=cache, cache_limit="256MB", endpoint_url=endpoint, chunk_size=64 << 10)
    opened = ds.cache_stats()["requests"]
    h = hashlib.sha256()
    if batches:
        loader = tokenfeed.Loader(ds, seq_len=128, batch_size=8, seed=3, shuffle="block")
        it = iter(loader)
        for _ in range(batches):
            h.update(np.asarray(next(it)["input_ids"]).tobytes())
    print(json.dumps({"hash": h.hexdigest(), "open_requests": opened, "files": ds.num_files,
                      "fingerprint": ds.fingerprint}))
""")


def _env():
    return dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))


def _start(url, cache, endpoint, batches=0, background=False):
    argv = [sys.executable, "-c", CHILD, url, str(cache), endpoint, str(batches)]
    return subprocess.Popen(as_background_job(argv) if background else argv, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _result(proc):
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def _run(url, cache, endpoint, batches=0):
    return _result(_start(url, cache, endpoint, batches))


def _total(p):
    return sum(p.requests.values())


# what a reopen from the node's record asks of the store about the dataset of `uploaded`: whether
# its manifest is still the version recorded (a HEAD), nothing else
RECHECK = {"HEAD": 1}


def _total_of(counts):
    return sum(counts.values())


@pytest.fixture
def uploaded(moto, bucket, tmp_path):
    path = write_dataset(tmp_path / "src" / "ds", 400, 0)
    moto.upload_dir(bucket, "ds", str(path))
    # the directory's URL without a trailing "/": no listing to expand it, every request is the core's
    return tokenfeed.open(str(path)), f"s3://{bucket}/ds"


def test_restart_only_checks_the_record_against_the_store(uploaded, moto, tmp_path):
    local, url = uploaded
    cache = tmp_path / "cache"
    p = FaultProxy(moto.port)
    try:
        first = _run(url, cache, p.endpoint, batches=6)
        assert first["open_requests"] > 0 and _total(p) >= first["open_requests"]
        assert first["fingerprint"] == local.fingerprint
        p.reset_counts()
        # a restart that only opens: the record is checked against the store, nothing is read
        again = _run(url, cache, p.endpoint)
        assert p.requests == RECHECK and again["open_requests"] == _total(p), p.requests
        assert (again["fingerprint"], again["files"]) == (first["fingerprint"], first["files"])
        # and one that reads: the same batches, with no metadata request either
        p.reset_counts()
        read = _run(url, cache, p.endpoint, batches=6)
        assert read["open_requests"] == _total_of(RECHECK) and read["hash"] == first["hash"]
        assert all(rng for (_path, rng) in p.gets), p.gets  # only ranged chunk reads, if any
        assert p.requests.get("HEAD", 0) == RECHECK["HEAD"]
    finally:
        p.stop()


def test_restart_of_a_directory_url_does_not_list_it(uploaded, moto, tmp_path):
    """A dataset directory opened by its URL with the trailing '/', as users write it: the first
    open lists it (a tokenfeed dataset, or a set of files?); a restart finds the node's record of
    that very URL and neither lists nor reads metadata: it only checks the record."""
    local, url = uploaded
    cache = tmp_path / "cache"
    p = FaultProxy(moto.port)
    try:
        first = _run(url + "/", cache, p.endpoint)
        assert first["fingerprint"] == local.fingerprint and _total(p) == first["open_requests"] > 0  # (the core lists)
        p.reset_counts()
        again = _run(url + "/", cache, p.endpoint)
        assert p.requests == RECHECK, p.requests
        assert (again["fingerprint"], again["files"]) == (first["fingerprint"], first["files"])
    finally:
        p.stop()


def test_processes_of_a_node_share_one_read(uploaded, moto, tmp_path):
    local, url = uploaded
    p = FaultProxy(moto.port)
    try:
        one = _run(url, tmp_path / "alone", p.endpoint)
        alone = _total(p)
        assert alone == one["open_requests"] > 0
        p.reset_counts()
        procs = [_start(url, tmp_path / "shared", p.endpoint) for _ in range(8)]
        res = [_result(pr) for pr in procs]
        # eight processes started together: one reads the metadata, the others wait for its record
        # and check it against the store
        assert _total(p) <= alone + 8 * _total_of(RECHECK), p.requests
        assert sum(r["open_requests"] for r in res) <= alone + 8 * _total_of(RECHECK)
        assert {r["fingerprint"] for r in res} == {local.fingerprint}
    finally:
        p.stop()


def _records(cache):
    return [n for n in os.listdir(cache / "meta") if n.endswith(".tfmeta")]


def test_changed_object_is_seen_at_the_next_open(moto, bucket, tmp_path, monkeypatch):
    # a shard set of .npy files (listed, not stat'ed one by one: there are more than 16); no
    # listing trusted by its age, so that each open asks the store
    monkeypatch.setenv("TOKENFEED_LISTING_MAX_AGE", "0")
    rng = np.random.default_rng(5)
    src = tmp_path / "npy"
    src.mkdir()
    for i in range(20):
        np.save(src / f"part-{i:03d}.npy", rng.integers(0, 50000, size=3000 + 10 * i, dtype=np.uint16))
    moto.upload_dir(bucket, "npy", str(src))
    urls = [f"s3://{bucket}/npy/part-{i:03d}.npy" for i in range(20)]
    cache = tmp_path / "cache"
    opts = dict(cache_dir=cache, cache_limit="256MB", chunk_size=64 << 10)
    p = FaultProxy(moto.port)
    try:
        first = tokenfeed.open(urls, endpoint_url=p.endpoint, **opts)
        assert first.cache_stats()["requests"] > 0 and len(_records(cache)) == 1
        # a reopen checks the record with one listing of the objects' prefix, and reads nothing else
        p.reset_counts()
        assert _open_in_child(urls, cache, p.endpoint)["open_requests"] == 1
        assert _listings(p) == 1 and p.requests.get("HEAD", 0) == 0 and not _whole_gets(p)
        # one object is replaced by another valid file after its metadata was recorded
        new = rng.integers(0, 50000, size=3070, dtype=np.uint16)
        np.save(src / "part-007.npy", new)
        moto.put(bucket, "npy/part-007.npy", (src / "part-007.npy").read_bytes())
        want = np.concatenate([np.load(src / f"part-{i:03d}.npy") for i in range(20)])
        # another process opens: the listing shows the new version, so the record is not used: the
        # metadata is read again, the process says why, and reads the new version
        p.reset_counts()
        r = _child(urls, cache, p.endpoint)
        assert r.returncode == 0, r.stderr
        fresh = json.loads(r.stdout.strip().splitlines()[-1])
        assert "npy/part-007.npy was rewritten since this node recorded it" in r.stderr, r.stderr
        assert fresh["open_requests"] > 1 and fresh["sha"] == _sha(want)
        assert len(_records(cache)) == 1  # recorded again, at the new version
        p.reset_counts()
        assert _open_in_child(urls, cache, p.endpoint)["sha"] == _sha(want)
        assert _listings(p) == 1 and p.requests.get("HEAD", 0) == 0 and not _whole_gets(p)  # the check, chunks
        # an object deleted: the next open says so, and fails naming it
        moto.delete(bucket, "npy/part-003.npy")
        r = _child(urls, cache, p.endpoint)
        assert r.returncode != 0 and "npy/part-003.npy no longer exists" in r.stderr, r.stderr
    finally:
        p.stop()


def _listings(p):
    """GETs of a bucket itself: listings."""
    return sum(v for k, v in p.gets.items() if k[0].count("/") == 1)


def _whole_gets(p):
    """GETs of objects without a range (metadata reads of whole small objects)."""
    return [k for k in p.gets if not k[1] and k[0].count("/") > 1]


READ_ALL = textwrap.dedent("""
    import hashlib, json, sys, numpy as np, tokenfeed
    ds = tokenfeed.open(sys.argv[3:], cache_dir=sys.argv[1], cache_limit="256MB", endpoint_url=sys.argv[2],
                        chunk_size=64 << 10)
    opened = ds.cache_stats()["requests"]
    sha = hashlib.sha256(np.asarray(ds.tokens(0, ds.num_tokens), dtype=np.uint16).tobytes()).hexdigest()
    print(json.dumps({"open_requests": opened, "sha": sha}))
""")


def _child(urls, cache, endpoint):
    return subprocess.run([sys.executable, "-c", READ_ALL, str(cache), endpoint, *urls], env=_env(),
                          capture_output=True, text=True, timeout=600)


def _open_in_child(urls, cache, endpoint):
    r = _child(urls, cache, endpoint)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def _sha(a):
    import hashlib

    return hashlib.sha256(np.asarray(a, dtype=np.uint16).tobytes()).hexdigest()


@pytest.mark.parametrize("given", ["glob", "object"])
def test_object_rewritten_after_a_node_read_it_moves_that_node_to_the_new_version(moto, bucket, tmp_path, caplog,
                                                                                  given, monkeypatch):
    """Same size, new ETag. Node A read every byte of the set before the rewrite (its chunks are in
    its cache); its next open sees the new version in the store, says so, and reads what node B,
    with a cold cache, reads: the same tokens under the same fingerprint. A loader state saved on
    the old version is refused, saying that the dataset changed, and so is a DataLoader worker
    reopening the dataset its parent opened before the rewrite."""
    import logging
    import pickle

    from conftest import write_llmc

    monkeypatch.setenv("TOKENFEED_LISTING_MAX_AGE", "0")  # no listing trusted by its age: each open asks the store
    rng = np.random.default_rng(11)
    src = tmp_path / "llmc"
    src.mkdir()
    shards = [rng.integers(0, 50000, size=5000, dtype=np.uint16) for _ in range(4)]
    for i, s in enumerate(shards):
        write_llmc(src / f"s{i}.bin", s, 1)
    moto.upload_dir(bucket, "llmc", str(src))
    url = f"s3://{bucket}/llmc/*.bin" if given == "glob" else f"s3://{bucket}/llmc/s2.bin"
    before = np.concatenate(shards) if given == "glob" else shards[2]
    opts = dict(cache_limit="256MB", chunk_size=64 << 10, endpoint_url=moto.endpoint)
    a = tokenfeed.open(url, cache_dir=tmp_path / "nodeA", **opts)
    assert np.array_equal(np.asarray(a.tokens(0, a.num_tokens)), before)  # every chunk in node A's cache
    loader = tokenfeed.Loader(a, seq_len=64, batch_size=4, seed=0)
    next(iter(loader))
    state = loader.state_dict()
    blob = pickle.dumps(a)  # as a DataLoader worker receives it
    new = shards[2][::-1].copy()
    write_llmc(tmp_path / "new.bin", new, 1)
    moto.put(bucket, "llmc/s2.bin", (tmp_path / "new.bin").read_bytes())  # same size, another version
    want = np.concatenate(shards[:2] + [new] + shards[3:]) if given == "glob" else new
    with caplog.at_level(logging.WARNING, logger="tokenfeed"):
        a2 = tokenfeed.open(url, cache_dir=tmp_path / "nodeA", **opts)
    assert "llmc/s2.bin was rewritten since this node recorded it" in caplog.text
    b = tokenfeed.open(url, cache_dir=tmp_path / "nodeB", **opts)
    assert a2.fingerprint == b.fingerprint != a.fingerprint
    assert np.array_equal(np.asarray(a2.tokens(0, a2.num_tokens)), want)
    assert np.array_equal(np.asarray(b.tokens(0, b.num_tokens)), want)
    with pytest.raises(tokenfeed.StateError, match="the dataset changed"):
        tokenfeed.Loader(a2, seq_len=64, batch_size=4, seed=0).load_state_dict(state)
    # a worker of the loader made on the old version refuses to read the new one under it
    with pytest.raises(tokenfeed.StateError, match=f"changed since it was opened .*fingerprint {a.fingerprint}"):
        pickle.loads(blob)
    # and from then on node A opens from its record again, at the new version
    a3 = tokenfeed.open(url, cache_dir=tmp_path / "nodeA", **opts)
    assert a3.fingerprint == b.fingerprint and np.array_equal(np.asarray(a3.tokens(0, a3.num_tokens)), want)


def test_damaged_record_is_ignored_and_replaced(uploaded, moto, tmp_path):
    local, url = uploaded
    cache = tmp_path / "cache"
    _run(url, cache, moto.endpoint)
    (rec,) = [cache / "meta" / n for n in os.listdir(cache / "meta") if n.endswith(".tfmeta")]
    data = bytearray(rec.read_bytes())
    data[len(data) // 2] ^= 0x55
    rec.write_bytes(bytes(data))
    reopened = _run(url, cache, moto.endpoint)
    assert reopened["open_requests"] > 0 and reopened["fingerprint"] == local.fingerprint
    assert rec.read_bytes() != bytes(data)  # written again, whole
    again = _run(url, cache, moto.endpoint)
    assert again["open_requests"] == _total_of(RECHECK) and again["fingerprint"] == local.fingerprint
    # `tokenfeed cache prune --all` (nobody has the cache open) removes the records too
    subprocess.run([sys.executable, "-m", "tokenfeed", "cache", "prune", str(cache), "--all"], env=_env(), check=True,
                   capture_output=True)
    assert not _records(cache)
    assert _run(url, cache, moto.endpoint)["open_requests"] > 0


HOLDER = textwrap.dedent("""
    import fcntl, os, sys
    fd = os.open(sys.argv[1], os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    print("held", flush=True)
    sys.stdin.readline()
""")


def _has_open(pid, path):
    """Whether process pid has the file path open (it waits on its lock)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == str(path):
                return True
        except OSError:
            pass
    return False


@pytest.mark.parametrize("end", ["holder-killed", "ctrl-c"])
def test_waiting_for_the_process_that_reads(uploaded, moto, tmp_path, end):
    """A process that finds another one reading the metadata (it holds the record's lock) waits
    for it without a request; if that process dies, the kernel drops its lock and the waiter reads
    the metadata itself; Ctrl-C ends the wait at once."""
    import signal
    import threading

    local, url = uploaded
    cache = tmp_path / "cache"
    p = FaultProxy(moto.port)
    holder = waiter = None
    try:
        _run(url, cache, p.endpoint)
        (lock,) = [cache / "meta" / n for n in os.listdir(cache / "meta") if n.endswith(".lock")]
        for n in _records(cache):
            os.unlink(cache / "meta" / n)
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        assert holder.stdout.readline().strip() == "held"
        p.reset_counts()
        waiter = _start(url, cache, p.endpoint, background=end == "ctrl-c")
        for _ in range(1200):
            if _has_open(waiter.pid, lock) or waiter.poll() is not None:
                break
            threading.Event().wait(0.05)
        assert _has_open(waiter.pid, lock), "the second process never waited for the lock"
        assert _total(p) == 0  # waiting, not fetching
        if end == "ctrl-c":
            waiter.send_signal(signal.SIGINT)
            _, err = waiter.communicate(timeout=120)
            assert waiter.returncode != 0 and "KeyboardInterrupt" in err, err
            assert _total(p) == 0
        else:
            holder.kill()
            holder.wait(60)
            res = _result(waiter)
            assert res["open_requests"] > 0 and res["fingerprint"] == local.fingerprint
            assert len(_records(cache)) == 1
    finally:
        for pr in (holder, waiter):
            if pr is not None and pr.poll() is None:
                pr.kill()
                pr.wait()
        p.stop()


def test_records_stay_within_their_bound(moto, bucket, tmp_path):
    """The records of a cache hold at most an eighth of cache_limit together: the least recently
    written goes first, and metadata larger than that is not recorded (the open works)."""
    rng = np.random.default_rng(8)
    sets = {}
    for name, files, tokens in (("a", 4, 2000), ("b", 4, 2000), ("big", 4, 6000)):
        src = tmp_path / name
        src.mkdir()
        for i in range(files):
            np.save(src / f"{i}.npy", rng.integers(0, 50000, size=tokens, dtype=np.uint16))
        moto.upload_dir(bucket, name, str(src))
        sets[name] = [f"s3://{bucket}/{name}/{i}.npy" for i in range(files)]
    cache = tmp_path / "cache"
    # 256 KiB of cache: 32 KiB of records, room for one set of ~17 KB, not for two
    opts = dict(cache_dir=cache, cache_limit=256 << 10, chunk_size=64 << 10, endpoint_url=moto.endpoint)
    tokenfeed.open(sets["a"], **opts)
    (first,) = _records(cache)
    tokenfeed.open(sets["b"], **opts)
    (second,) = _records(cache)
    assert second != first
    # ~48 KB of metadata: not recorded, and the records there stay
    assert tokenfeed.open(sets["big"], **opts).num_tokens == 4 * 6000
    assert _records(cache) == [second]
