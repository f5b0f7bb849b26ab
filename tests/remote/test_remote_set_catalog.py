"""A remote shard set's catalog beside the data: ``tokenfeed index 's3://bucket/tokens/*.bin'``
reads every object's header once and stores the set's catalog as an object under its prefix; an
open that finds it in the set's listing reads it instead of every object's header, checks the
listing against it (name, size and version of every object) and opens each object on first
touch. Requests are counted at a proxy in front of moto's S3 server (counts, never time)."""
from __future__ import annotations

import itertools
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

import tokenfeed
from conftest import aged, write_llmc, write_megatron
from remote_util import TEST_CREDENTIALS, FaultProxy, bucket, moto, node_hashes, node_readers  # noqa: F401  (fixtures)

STEM = ".tokenfeed-catalog-"


def _shards(n, seed=0, lo=5, hi=40):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 50000, size=int(rng.integers(lo, hi)), dtype=np.uint16) for _ in range(n)]


def _object_gets(p, bucket):
    """GETs of the set's objects (not listings, not the catalog)."""
    return {k: v for k, v in p.gets.items() if k[0].count("/") > 1 and STEM not in k[0]}


def _listings(p):
    return sum(v for k, v in p.gets.items() if k[0].count("/") == 1)


def _catalog_gets(p):
    return sum(v for k, v in p.gets.items() if STEM in k[0])


def _index_cli(url, endpoint, *extra):
    """``tokenfeed index`` as a user runs it; returns what it printed."""
    env = dict(os.environ, **TEST_CREDENTIALS)
    r = subprocess.run([sys.executable, "-m", "tokenfeed", "index", url, "--endpoint-url", endpoint, *extra],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.fixture
def llmc_set(moto, bucket, tmp_path):  # noqa: F811
    shards = _shards(30, seed=7)
    local = tmp_path / "tokens"
    local.mkdir()
    for i, s in enumerate(shards):
        write_llmc(local / f"shard_{i:04d}.bin", s, 1)
    (local / "README.md").write_text("not data")
    moto.upload_dir(bucket, "tokens", str(local))
    p = FaultProxy(moto.port)
    yield f"s3://{bucket}/tokens/*.bin", p, shards, local
    p.stop()


def _open(url, cache, endpoint, **kw):
    return tokenfeed.open(url, cache_dir=str(cache), cache_limit="256MB", endpoint_url=endpoint, **kw)


def test_index_then_a_fresh_node_reads_the_catalog_not_the_objects(llmc_set, moto, bucket, tmp_path):  # noqa: F811
    url, p, shards, local = llmc_set
    out = _index_cli(url, moto.endpoint)
    assert f"s3://{bucket}/tokens/{STEM}" in out
    p.reset_counts()
    ds = _open(url, tmp_path / "cache", p.endpoint)
    # one listing (the glob's, which also shows the catalog) and the catalog: nothing per object
    assert _object_gets(p, bucket) == {}, sorted(_object_gets(p, bucket))[:4]
    assert _listings(p) == 1 and _catalog_gets(p) == 1 and sum(p.requests.values()) == 2, p.requests
    ref = tokenfeed.open(str(local / "*.bin"))
    assert ds.fingerprint == ref.fingerprint and ds.num_files == 30 and ds.format == "llm.c"
    assert ds.num_tokens == ref.num_tokens and ds.num_documents == ref.num_documents
    # a document opens only its own object
    assert np.array_equal(ds[17], shards[17])
    assert {k[0].rsplit("/", 1)[1] for k in _object_gets(p, bucket)} == {"shard_0017.bin"}
    assert np.array_equal(np.asarray(ds.tokens(0, ds.num_tokens)), np.concatenate(shards))
    # batches as from the files on disk
    for a, b in itertools.islice(zip(tokenfeed.Loader(ds, seq_len=32, batch_size=4, seed=1),
                                     tokenfeed.Loader(ref, seq_len=32, batch_size=4, seed=1)), 12):
        assert np.array_equal(np.asarray(a["input_ids"]), np.asarray(b["input_ids"]))


@pytest.mark.parametrize("listing", ["trusted", "too old"])
def test_restart_lists_at_most_once_and_a_worker_reopens_from_the_record(llmc_set, moto, tmp_path, monkeypatch,
                                                                         listing):  # noqa: F811
    """A restart and a spawned DataLoader worker open from the node's records: no request while
    the node's listing is trusted, one listing each (which checks the record) once it is not."""
    import pickle

    url, p, shards, _ = llmc_set
    tokenfeed.build_catalog(url, endpoint_url=moto.endpoint)
    first = _open(url, tmp_path / "cache", p.endpoint)
    if listing == "too old":
        monkeypatch.setenv("TOKENFEED_LISTING_MAX_AGE", "0")
    k = int(listing == "too old")
    p.reset_counts()
    again = _open(url, tmp_path / "cache", p.endpoint)
    # the listing that checks the node's record against the store (when it is not trusted), nothing else
    assert _listings(p) == k and sum(p.requests.values()) == k, p.requests
    assert again.paths == first.paths and again.fingerprint == first.fingerprint
    assert again._set_catalog is not None  # (opened from the catalog's record)
    # a spawned DataLoader worker reopens it from the catalog's record: the same listing, no other request
    worker = pickle.loads(pickle.dumps(again))
    assert _listings(p) == 2 * k and sum(p.requests.values()) == 2 * k, p.requests
    assert np.array_equal(np.asarray(worker.tokens(0, worker.num_tokens)), np.concatenate(shards))


def test_directory_of_large_npy_objects_and_headerless_files(moto, bucket, tmp_path):  # noqa: F811
    """Objects larger than what a first touch fetches (head and tail): their tokens are read
    through the node's chunk cache; a directory URL and headerless files with a dtype."""
    rng = np.random.default_rng(3)
    arrays = [rng.integers(0, 100_000, size=int(n), dtype=np.uint32) for n in (90_000, 120_000, 70_000)]
    d = tmp_path / "npy"
    d.mkdir()
    for i, a in enumerate(arrays):
        np.save(d / f"part-{i}.npy", a)
    moto.upload_dir(bucket, "npy", str(d))
    url = f"s3://{bucket}/npy/"
    written = tokenfeed.build_catalog(url, endpoint_url=moto.endpoint)
    assert written.startswith(url + STEM)
    p = FaultProxy(moto.port)
    try:
        ds = _open(url, tmp_path / "cache", p.endpoint, chunk_size=64 << 10)
        assert _object_gets(p, bucket) == {} and sum(p.requests.values()) == 2, p.requests
        assert ds.format == "npy" and ds.num_files == 3
        assert ds.fingerprint == tokenfeed.open(str(d) + "/").fingerprint
        assert np.array_equal(np.asarray(ds.tokens(100_000, 120_000)), np.concatenate(arrays)[100_000:120_000])
        assert np.array_equal(np.asarray(ds.tokens(0, ds.num_tokens)), np.concatenate(arrays))
    finally:
        p.stop()
    # headerless files: the catalog is that of the dtype given
    raw = tmp_path / "raw"
    raw.mkdir()
    for i, a in enumerate(arrays):
        a.astype(np.uint32).tofile(raw / f"part-{i}.ds")
    moto.upload_dir(bucket, "raw", str(raw))
    rurl = f"s3://{bucket}/raw/*.ds"
    _index_cli(rurl, moto.endpoint, "--dtype", "uint32")
    p = FaultProxy(moto.port)
    try:
        ds = _open(rurl, tmp_path / "cache2", p.endpoint, dtype="uint32")
        assert _object_gets(p, bucket) == {} and _catalog_gets(p) == 1, p.requests
        assert np.array_equal(np.asarray(ds.tokens(0, ds.num_tokens)), np.concatenate(arrays))
        p.reset_counts()
        # another dtype is another set: no catalog for it, the objects are read
        other = _open(rurl, tmp_path / "cache3", p.endpoint, dtype="uint16")
        assert _catalog_gets(p) == 0 and _object_gets(p, bucket), p.requests
        assert other.num_tokens == 2 * ds.num_tokens
    finally:
        p.stop()


def test_out_of_date_catalog_is_ignored_and_says_why(llmc_set, moto, bucket, tmp_path):  # noqa: F811
    url, p, shards, local = llmc_set
    tokenfeed.build_catalog(url, endpoint_url=moto.endpoint)
    # an object rewritten (same size, other tokens: another version)
    new = shards[3][::-1].copy()
    write_llmc(tmp_path / "new.bin", new, 1)
    moto.put(bucket, "tokens/shard_0003.bin", (tmp_path / "new.bin").read_bytes())
    with pytest.warns(tokenfeed.PerformanceWarning, match=r"out of date \(.*shard_0003\.bin was rewritten since"):
        ds = _open(url, tmp_path / "c1", p.endpoint)
    assert np.array_equal(ds[3], new)
    assert np.array_equal(np.asarray(ds.tokens(0, ds.num_tokens)), np.concatenate(shards[:3] + [new] + shards[4:]))
    # an object added
    tokenfeed.build_catalog(url, endpoint_url=moto.endpoint)
    moto.put(bucket, "tokens/shard_0030.bin", (local / "shard_0000.bin").read_bytes())
    with pytest.warns(tokenfeed.PerformanceWarning, match="the set has 31 objects now, the catalog 30"):
        ds = _open(url, tmp_path / "c2", p.endpoint)
    assert ds.num_files == 31
    # a damaged catalog
    name = tokenfeed.build_catalog(url, endpoint_url=moto.endpoint).split("/tokens/", 1)[1]
    moto.put(bucket, f"tokens/{name}", b"TFCATLG1" + b"\0" * 100)
    with pytest.warns(tokenfeed.PerformanceWarning, match="not a catalog of this shard set"):
        ds = _open(url, tmp_path / "c3", p.endpoint)
    assert ds.num_files == 31
    # a datatrove index added beside a headerless file changes how it reads: the catalog is not used
    rng = np.random.default_rng(1)
    raw = tmp_path / "raw"
    raw.mkdir()
    for i in range(3):
        rng.integers(0, 1000, size=50, dtype=np.uint16).tofile(raw / f"p{i}.ds")
    moto.upload_dir(bucket, "raw", str(raw))
    rurl = f"s3://{bucket}/raw/*.ds"
    tokenfeed.build_catalog(rurl, dtype="uint16", endpoint_url=moto.endpoint)
    moto.put(bucket, "raw/p1.ds.index", np.array([20, 50], dtype=np.uint64).tobytes())
    with pytest.warns(tokenfeed.PerformanceWarning, match=r"p1\.ds is read with a companion object now"):
        ds = _open(rurl, tmp_path / "c4", p.endpoint, dtype="uint16")
    assert ds.num_documents == 4


def test_object_rewritten_after_open_is_an_error_naming_it(llmc_set, moto, bucket, tmp_path):  # noqa: F811
    """Every read of an object opened from the catalog is pinned to the version listed at open:
    one rewritten after open is refused by name, never read as other tokens."""
    url, p, shards, _ = llmc_set
    tokenfeed.build_catalog(url, endpoint_url=moto.endpoint)
    ds = _open(url, tmp_path / "cache", p.endpoint)
    write_llmc(tmp_path / "new.bin", shards[10][::-1].copy(), 1)
    moto.put(bucket, "tokens/shard_0010.bin", (tmp_path / "new.bin").read_bytes())
    with pytest.raises(OSError, match="shard_0010.bin"):
        ds.document(10)
    assert np.array_equal(ds[9], shards[9])  # the others read on


def _resealed(data, edit):
    """The catalog ``data`` with ``edit(i, fixed)`` applied to each entry's fixed record (a
    bytearray view: u32 format, dtype, document kind, flags, then u64 num_tokens, num_docs, ...),
    and sealed again with XXH64, as anyone who can write under the set's prefix can."""
    import struct

    import xxhash

    buf = bytearray(data[:-8])
    at, (n,) = 40, struct.unpack_from("<Q", buf, 24)
    for i in range(n):
        _shared, rest = struct.unpack_from("<II", buf, at)
        at += 8 + rest
        (aux,) = struct.unpack_from("<I", buf, at)
        at += 4 + max(aux - 1, 0)
        edit(i, memoryview(buf)[at:at + 144])
        at += 144
    return bytes(buf) + struct.pack("<Q", xxhash.xxh64_intdigest(bytes(buf), seed=0))


def test_a_catalog_naming_another_format_than_the_bytes_is_never_read_as_tokens(llmc_set, moto, bucket,
                                                                                tmp_path):  # noqa: F811
    """A catalog whose names, sizes and versions match the listing but whose entries call llm.c
    objects headerless uint16 files: the first touch checks the object's own header (its magic,
    as an open without the catalog detects it), so the llm.c header is never served as tokens."""
    url, p, shards, _ = llmc_set
    prefix = f"s3://{bucket}/tokens/"
    # entries from opening the objects as headerless uint16, under the name an open with dtype= looks for
    raw = _open(url, tmp_path / "forger", moto.endpoint, format="raw", dtype="uint16")
    assert raw.num_tokens == sum(512 + len(s) for s in shards)
    for dt in ("uint16", None):
        forged = raw._core.remote_set_catalog(prefix, "*.bin", dtype=dt, format=None)
        name = tokenfeed._core.Dataset.set_catalog_name("*.bin", dtype=dt, format=None)
        moto.put(bucket, f"tokens/{name}", forged)
    # opened with dtype= (for headerless objects mixed in): the entry is refused when the object is touched
    ds = _open(url, tmp_path / "victim", p.endpoint, dtype="uint16")
    said = r"shard_0003\.bin: format: the catalog reads the object as raw, but its bytes are llm\.c"
    with pytest.raises(tokenfeed.FormatError, match=said):
        ds.document(3)
    with pytest.raises(tokenfeed.FormatError, match=r"shard_0000\.bin: format"):
        ds.tokens(0, 8)
    # opened without dtype=: no open reads a headerless object, so the catalog is not used at all
    with pytest.warns(tokenfeed.PerformanceWarning, match="not a catalog of this shard set"):
        ds = _open(url, tmp_path / "victim2", p.endpoint)
    assert ds.format == "llm.c" and ds.num_tokens == sum(len(s) for s in shards)
    assert np.array_equal(np.asarray(ds.tokens(0, ds.num_tokens)), np.concatenate(shards))


def test_an_entry_of_no_tokens_is_checked_at_open(llmc_set, moto, bucket, tmp_path):  # noqa: F811
    """An object whose entry says it holds no tokens is never read, so no first touch would
    check it: the open touches such entries (one header each, through the node's cache). One
    that does not match makes the catalog out of date, and the objects are read instead."""
    import struct

    import obstore

    url, p, shards, _ = llmc_set
    key = tokenfeed.build_catalog(url, endpoint_url=moto.endpoint).split(f"s3://{bucket}/", 1)[1]
    data = bytes(obstore.get(moto.store(bucket), key).bytes())

    def empty_5(i, fixed):
        if i == 5:
            struct.pack_into("<QQ", fixed, 16, 0, 0)  # num_tokens, num_docs

    moto.put(bucket, key, _resealed(data, empty_5))
    p.reset_counts()
    with pytest.warns(tokenfeed.PerformanceWarning, match=r"shard_0005\.bin.*num_tokens"):
        ds = _open(url, tmp_path / "victim", p.endpoint)
    assert ds.num_tokens == sum(len(s) for s in shards)
    assert np.array_equal(np.asarray(ds.tokens(0, ds.num_tokens)), np.concatenate(shards))
    # an honest catalog without empty objects still opens with the listing and the catalog alone
    tokenfeed.build_catalog(url, endpoint_url=moto.endpoint)
    p.reset_counts()
    with warnings.catch_warnings():
        warnings.simplefilter("error", tokenfeed.PerformanceWarning)
        ds = _open(url, tmp_path / "honest", p.endpoint)
    assert _object_gets(p, bucket) == {} and sum(p.requests.values()) == 2, p.requests


def test_index_refuses_what_a_remote_catalog_cannot_describe(moto, bucket, tmp_path):  # noqa: F811
    meg = tmp_path / "meg"
    meg.mkdir()
    for i in range(3):
        write_megatron(meg / f"part{i}", [np.arange(5, dtype=np.uint16), np.arange(7, dtype=np.uint16)])
    moto.upload_dir(bucket, "meg", str(meg))
    with pytest.raises(ValueError, match="a Megatron pair"):
        tokenfeed.build_catalog(f"s3://{bucket}/meg/*.bin", endpoint_url=moto.endpoint)
    with pytest.raises(ValueError, match="without a document index"):
        tokenfeed.build_catalog(f"s3://{bucket}/meg/*.bin", dtype="uint16", eos_id=0, endpoint_url=moto.endpoint)
    with pytest.raises(ValueError, match="under one prefix"):
        tokenfeed.build_catalog(f"s3://{bucket}/*/x.bin", endpoint_url=moto.endpoint)
    with tokenfeed.DatasetWriter(tmp_path / "ds", vocab_size=100) as w:
        w.add_document(np.arange(10))
    moto.upload_dir(bucket, "ds", str(tmp_path / "ds"))
    with pytest.raises(ValueError, match="a tokenfeed dataset"):
        tokenfeed.build_catalog(f"s3://{bucket}/ds/", endpoint_url=moto.endpoint)
    with pytest.raises(ValueError, match="only for a shard set in object storage"):
        tokenfeed.build_catalog(str(meg), endpoint_url=moto.endpoint)


def test_a_copy_on_disk_of_a_bucket_with_its_catalog_opens_by_its_own(llmc_set, moto, bucket, tmp_path):  # noqa: F811
    """The catalog in object storage lives in a key space of its own: a copy of the bucket on
    disk (catalog object included) opens from its files, never from versions that mean
    nothing there."""
    url, p, shards, local = llmc_set
    name = tokenfeed.build_catalog(url, endpoint_url=moto.endpoint).rsplit("/", 1)[1]
    import obstore

    data = obstore.get(moto.store(bucket), f"tokens/{name}").bytes()
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in local.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    (copy / name).write_bytes(bytes(data))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = tokenfeed.open(str(copy / "*.bin"))
    assert np.array_equal(np.asarray(ds.tokens(0, ds.num_tokens)), np.concatenate(shards))
    aged(list(copy.iterdir()) + [copy])
    assert tokenfeed.build_catalog(str(copy / "*.bin")).rsplit("/", 1)[1] != name


def test_a_worker_reopening_a_set_rewritten_since_refuses(llmc_set, moto, bucket, tmp_path, monkeypatch):  # noqa: F811
    """A DataLoader worker reopens the set from its catalog; when the node's record is gone and
    the set changed meanwhile, it warns and reads the objects; as they are not the dataset its
    parent opened, it then refuses to go on, saying so (its parent would train on the old data,
    it on the new). (No listing trusted by its age here, so that the worker's open asks the store.)"""
    import pickle

    monkeypatch.setenv("TOKENFEED_LISTING_MAX_AGE", "0")
    url, p, shards, _ = llmc_set
    tokenfeed.build_catalog(url, endpoint_url=moto.endpoint)
    cache = tmp_path / "cache"
    ds = _open(url, cache, p.endpoint)
    blob = pickle.dumps(ds)
    new = shards[5][::-1].copy()
    write_llmc(tmp_path / "new.bin", new, 1)
    moto.put(bucket, "tokens/shard_0005.bin", (tmp_path / "new.bin").read_bytes())
    for name in os.listdir(cache / "meta"):
        if name.endswith(".tfmeta"):
            os.remove(cache / "meta" / name)
    with pytest.warns(tokenfeed.PerformanceWarning, match=r"shard_0005\.bin was rewritten since"):
        with pytest.raises(tokenfeed.StateError, match=rf"the dataset changed since it was opened.*{ds.fingerprint}"):
            pickle.loads(blob)
    again = _open(url, cache, p.endpoint)  # opened again, as the error says: the new version
    assert np.array_equal(again[5], new) and np.array_equal(again[4], shards[4])
    assert np.array_equal(pickle.loads(pickle.dumps(again))[5], new)


def test_index_says_when_the_catalog_cannot_be_stored(llmc_set, moto, monkeypatch):  # noqa: F811
    import errno

    from tokenfeed.remote import _remote

    def refused(self, url, data):
        raise _remote.TransportError(errno.EACCES, "AccessDenied: Access Denied")

    monkeypatch.setattr(_remote.ObjectStoreTransport, "put", refused)
    url = llmc_set[0]
    with pytest.raises(PermissionError, match=r"\.tokenfeed-catalog-.*cannot store the shard set's catalog there "
                                              r"\(AccessDenied.*permission to write objects"):
        tokenfeed.build_catalog(url, endpoint_url=moto.endpoint)


def test_a_catalog_of_other_options_is_said_unused(llmc_set, moto, bucket, tmp_path):  # noqa: F811
    """`tokenfeed index GLOB` without --format, then an open naming the format (another key):
    the catalog goes unused, and the open says so once, naming it and the option that differs;
    likewise the set's prefix opened after its glob's index."""
    from tokenfeed import PerformanceWarning

    url, p, shards, local = llmc_set
    _index_cli(url, moto.endpoint)
    with pytest.warns(PerformanceWarning, match=STEM.replace(".", r"\.") + ".*format: the catalog's None, this open's 'llm.c'"):
        ds = _open(url, tmp_path / "cache", p.endpoint, format="llm.c")
    assert ds.num_files == 30
    with pytest.warns(PerformanceWarning, match=STEM.replace(".", r"\.") + ".*another glob"):
        _open(f"s3://{bucket}/tokens/", tmp_path / "cache2", p.endpoint)


@pytest.mark.test_hooks
def test_a_node_fetches_each_range_once_and_a_restart_fetches_none(moto, bucket, tmp_path):  # noqa: F811
    """A node's processes (distinct ranks, one cache) share every fetch, first touches and chunks,
    for as long as they read: each byte range is fetched once per node. Every small range a first
    touch fetches takes a record of the cache's index, which grows with them (within the limit),
    so what the node read stays: a restart reading the epoch again sends no request for an
    object. (A first index of 16 records: the same as a set of thousands of objects against the
    index a cache starts with.)"""
    shards = _shards(60, seed=11, lo=150, hi=700)
    local = tmp_path / "tokens"
    local.mkdir()
    for i, s in enumerate(shards):
        write_llmc(local / f"shard_{i:04d}.bin", s, 1)
    moto.upload_dir(bucket, "node", str(local))
    url = f"s3://{bucket}/node/*.bin"
    tokenfeed.build_catalog(url, endpoint_url=moto.endpoint)
    p = FaultProxy(moto.port)
    try:
        env = {"TOKENFEED_TEST_CACHE_SLOTS": "16"}
        first = node_readers(url, tmp_path / "cache", p.endpoint, 3, **env)
        assert first == node_hashes(tokenfeed.open(str(local / "*.bin")), 3)
        gets = _object_gets(p, bucket)
        assert len({k[0] for k in gets}) == len(shards)
        assert max(gets.values()) == 1, sorted((v, k) for k, v in gets.items() if v > 1)[-4:]
        # a first touch and the data region's chunk per object (these are smaller than a chunk)
        assert sum(gets.values()) <= 2 * len(shards), sum(gets.values())
        p.reset_counts()
        again = node_readers(url, tmp_path / "cache", p.endpoint, 3, **env)
        assert again == first
        assert _object_gets(p, bucket) == {}, sorted(_object_gets(p, bucket))[:4]
    finally:
        p.stop()
