"""The metadata of a remote dataset is read once per node: the first open records what its
requests fetched in the cache directory, and a restart or the node's other processes open from
that record without a request. Requests are counted at the proxy in front of moto's S3 server;
an object replaced after its metadata was recorded is refused by name when read, and the record
is then dropped so that the next open reads the new version. Counts and bytes, never time.
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


@pytest.fixture
def uploaded(moto, bucket, tmp_path):
    path = write_dataset(tmp_path / "src" / "ds", 400, 0)
    moto.upload_dir(bucket, "ds", str(path))
    # the directory's URL without a trailing "/": no listing to expand it, every request is the core's
    return tokenfeed.open(str(path)), f"s3://{bucket}/ds"


def test_restart_makes_no_metadata_request(uploaded, moto, tmp_path):
    local, url = uploaded
    cache = tmp_path / "cache"
    p = FaultProxy(moto.port)
    try:
        first = _run(url, cache, p.endpoint, batches=6)
        assert first["open_requests"] > 0 and _total(p) >= first["open_requests"]
        assert first["fingerprint"] == local.fingerprint
        p.reset_counts()
        # a restart that only opens: nothing reaches the server
        again = _run(url, cache, p.endpoint)
        assert _total(p) == 0 and again["open_requests"] == 0
        assert (again["fingerprint"], again["files"]) == (first["fingerprint"], first["files"])
        # and one that reads: the same batches, with no metadata request either
        p.reset_counts()
        read = _run(url, cache, p.endpoint, batches=6)
        assert read["open_requests"] == 0 and read["hash"] == first["hash"]
        assert all(rng for (_path, rng) in p.gets), p.gets  # only ranged chunk reads, if any
        assert p.requests.get("HEAD", 0) == 0
    finally:
        p.stop()


def test_restart_of_a_directory_url_makes_no_request(uploaded, moto, tmp_path):
    """A dataset directory opened by its URL with the trailing '/', as users write it: the first
    open lists it (a tokenfeed dataset, or a set of files?); a restart finds the node's record of
    that very URL and neither lists nor reads metadata."""
    local, url = uploaded
    cache = tmp_path / "cache"
    p = FaultProxy(moto.port)
    try:
        first = _run(url + "/", cache, p.endpoint)
        assert first["fingerprint"] == local.fingerprint and _total(p) > first["open_requests"] > 0  # + the listing
        p.reset_counts()
        again = _run(url + "/", cache, p.endpoint)
        assert _total(p) == 0, p.requests
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
        assert _total(p) <= alone, p.requests
        assert sum(r["open_requests"] for r in res) <= alone
        assert {r["fingerprint"] for r in res} == {local.fingerprint}
    finally:
        p.stop()


def _records(cache):
    return [n for n in os.listdir(cache / "meta") if n.endswith(".tfmeta")]


def test_changed_object_is_named_and_its_record_dropped(moto, bucket, tmp_path):
    # a shard set of .npy files (listed, not stat'ed one by one: there are more than 16)
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
        # one object is replaced by another valid file after its metadata was recorded
        new = rng.integers(0, 50000, size=3070, dtype=np.uint16)
        np.save(src / "part-007.npy", new)
        moto.put(bucket, "npy/part-007.npy", (src / "part-007.npy").read_bytes())
        want = np.concatenate([np.load(src / f"part-{i:03d}.npy") for i in range(20)])
        # another process opens from the record, without a request: the change is not seen yet
        p.reset_counts()
        stale = subprocess.run([sys.executable, "-c", textwrap.dedent("""
            import sys, tokenfeed
            ds = tokenfeed.open(sys.argv[3:], cache_dir=sys.argv[1], cache_limit="256MB", endpoint_url=sys.argv[2],
                                chunk_size=64 << 10)
            print(ds.cache_stats()["requests"], flush=True)
            ds.tokens(0, ds.num_tokens)
        """), str(cache), p.endpoint, *urls], env=_env(), capture_output=True, text=True, timeout=600)
        assert stale.returncode != 0 and stale.stdout.split()[0] == "0"
        # its read of the changed object fails, naming it
        assert "npy/part-007.npy" in stale.stderr and "changed since the dataset was opened" in stale.stderr
        # and the record is gone: the next open reads the metadata again and gets the new version
        assert not _records(cache)
        p.reset_counts()
        fresh = _open_in_child(urls, cache, p.endpoint)
        assert fresh["open_requests"] > 0 and _total(p) > 0
        assert fresh["sha"] == _sha(want)
        assert len(_records(cache)) == 1  # recorded again, at the new version
        p.reset_counts()
        assert _open_in_child(urls, cache, p.endpoint)["sha"] == _sha(want)
        assert p.requests.get("HEAD", 0) == 0 and not [k for k in p.gets if not k[1]]  # chunks only
    finally:
        p.stop()


READ_ALL = textwrap.dedent("""
    import hashlib, json, sys, numpy as np, tokenfeed
    ds = tokenfeed.open(sys.argv[3:], cache_dir=sys.argv[1], cache_limit="256MB", endpoint_url=sys.argv[2],
                        chunk_size=64 << 10)
    opened = ds.cache_stats()["requests"]
    sha = hashlib.sha256(np.asarray(ds.tokens(0, ds.num_tokens), dtype=np.uint16).tobytes()).hexdigest()
    print(json.dumps({"open_requests": opened, "sha": sha}))
""")


def _open_in_child(urls, cache, endpoint):
    r = subprocess.run([sys.executable, "-c", READ_ALL, str(cache), endpoint, *urls], env=_env(), capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def _sha(a):
    import hashlib

    return hashlib.sha256(np.asarray(a, dtype=np.uint16).tobytes()).hexdigest()


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
    assert again["open_requests"] == 0 and again["fingerprint"] == local.fingerprint
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
