"""A tokenfeed dataset carries its own catalog (tokenfeed.catalog, written with its manifest):
a remote open reads the manifest and the catalog, not every shard's header, and opens each shard
on first touch, checked against its catalog entry. Requests are counted at the proxy in front
of moto's S3 server (counts and bytes, never time)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import xxhash

import tokenfeed
from remote_util import (INTERRUPTIBLE, FaultProxy, as_background_job, bucket, moto, node_hashes,  # noqa: F401  (fixtures)
                         node_readers, proxy)

CATALOG = "tokenfeed.catalog"


def _write(path, n_docs=2000, seed=0, shard_tokens=20_000):
    rng = np.random.default_rng(seed)
    docs = [rng.integers(0, 50000, size=int(n), dtype=np.uint16) for n in rng.integers(100, 900, size=n_docs)]
    with tokenfeed.DatasetWriter(path, vocab_size=50000, shard_tokens=shard_tokens) as w:
        w.add_documents(docs)
    return path


def _open(url, cache, endpoint, **kw):
    return tokenfeed.open(url, cache_dir=str(cache), cache_limit="256MB", endpoint_url=endpoint,
                          chunk_size=64 << 10, **kw)


def _batches(ds, n=4):
    it = iter(tokenfeed.Loader(ds, seq_len=128, batch_size=8, seed=3, shuffle="block"))
    return [np.asarray(next(it)["input_ids"]).copy() for _ in range(n)]


def _shard_gets(p):
    """GETs of shard objects (not the manifest or the catalog)."""
    return {k: v for k, v in p.gets.items() if k[0].endswith(".tfs")}


def _listings(p):
    """GETs of a bucket itself: listings."""
    return {k: v for k, v in p.gets.items() if k[0].count("/") == 1}


@pytest.fixture
def dataset(tmp_path):
    path = _write(tmp_path / "src" / "ds")
    names = sorted(n for n in os.listdir(path) if n.endswith(".tfs"))
    assert len(names) >= 20 and os.path.isfile(path / CATALOG)
    return path, names


@pytest.fixture
def uploaded(dataset, moto, bucket):
    path, names = dataset
    moto.upload_dir(bucket, "ds", str(path))
    return names, tokenfeed.open(str(path)), f"s3://{bucket}/ds"


@pytest.mark.parametrize("slash", ["", "/"])
def test_first_open_reads_no_shard(uploaded, proxy, tmp_path, slash):
    names, local, url = uploaded
    ds = _open(url + slash, tmp_path / "cache", proxy.endpoint)
    # the manifest and the catalog: nothing per shard, and no listing (the catalog has the sizes)
    assert _shard_gets(proxy) == {}, sorted(_shard_gets(proxy))[:4]
    assert proxy.requests.get("HEAD", 0) <= 8 and sum(proxy.requests.values()) <= 12, proxy.requests
    if not slash:  # (a URL ending in "/" is expanded by one listing of the package's own)
        assert not _listings(proxy), _listings(proxy)
    assert ds.fingerprint == local.fingerprint and ds.num_files == local.num_files == len(names)
    assert ds.num_tokens == local.num_tokens
    # batches identical to the local dataset's; only the shards read are touched
    assert all(np.array_equal(a, b) for a, b in zip(_batches(ds), _batches(local)))
    touched = {k[0].rsplit("/", 1)[1] for k in _shard_gets(proxy)}
    assert touched and touched <= set(names)
    # documents and random access through the shards opened on first touch
    for j in (0, local.num_documents // 2, local.num_documents - 1):
        assert np.array_equal(ds.document(j), local.document(j))


def test_restart_reads_the_node_record(uploaded, proxy, tmp_path):
    _, local, url = uploaded
    want = _batches(_open(url, tmp_path / "cache", proxy.endpoint))
    proxy.reset_counts()
    again = _open(url, tmp_path / "cache", proxy.endpoint)
    # the record, checked against the store: whether its manifest is the version recorded
    assert proxy.requests == {"HEAD": 1}, proxy.requests
    assert again.fingerprint == local.fingerprint
    assert all(np.array_equal(a, b) for a, b in zip(_batches(again), want))
    assert proxy.requests.get("HEAD", 0) == 1


# ---- first touches shared by the node: through its chunk cache --------------------------

_READER = textwrap.dedent("""
    import hashlib, sys, numpy as np, tokenfeed
    url, cache, endpoint, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    ds = tokenfeed.open(url, cache_dir=cache, cache_limit="256MB", endpoint_url=endpoint, chunk_size=64 << 10)
    it = iter(tokenfeed.Loader(ds, seq_len=128, batch_size=8, seed=3, shuffle="block"))
    h = hashlib.sha256()
    for _ in range(n):
        h.update(np.asarray(next(it)["input_ids"]).tobytes())
    print(h.hexdigest())
""")


def _readers(url, cache, endpoint, k, n=4):
    """k processes reading the first n batches of url at once, on the cache dir cache: their
    hashes of the batches."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    procs = [subprocess.Popen([sys.executable, "-c", _READER, url, str(cache), endpoint, str(n)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(k)]
    outs = [pr.communicate(timeout=300) for pr in procs]
    for pr, (_, err) in zip(procs, outs):
        assert pr.returncode == 0, err
    return [o.strip().splitlines()[-1] for o, _ in outs]


def _header_gets(p):
    """GETs of a shard's first bytes: one for each shard a first touch fetches (whole, or its head
    with its tail)."""
    return {k: v for k, v in _shard_gets(p).items() if k[1] is None or k[1].startswith("bytes=0-")}


def _local_hash(local, n=4):
    import hashlib

    h = hashlib.sha256()
    for b in _batches(local, n):
        h.update(b.tobytes())
    return h.hexdigest()


@pytest.mark.parametrize("shard_tokens", [20_000, 400_000], ids=["fetched whole", "head and tail"])
def test_restart_fetches_no_shard_header_again(moto, bucket, proxy, tmp_path, shard_tokens):
    """A shard's header, fetched by a first touch, is kept in the node's chunk cache: a restart
    reading the same batches opens and touches its shards with no request (its open checks the
    node's record: a HEAD of the manifest)."""
    path = _write(tmp_path / "src", shard_tokens=shard_tokens)
    moto.upload_dir(bucket, "big" if shard_tokens > 20_000 else "small", str(path))
    url = f"s3://{bucket}/{'big' if shard_tokens > 20_000 else 'small'}"
    local = tokenfeed.open(str(path))
    cache = tmp_path / "cache"
    first = _readers(url, cache, proxy.endpoint, 1)
    touched = _header_gets(proxy)
    assert touched and max(touched.values()) == 1, sorted(touched.items())[:4]
    proxy.reset_counts()
    again = _readers(url, cache, proxy.endpoint, 1)
    assert again == first == [_local_hash(local)]
    # No header the first process fetched is fetched again. What else the restart reads are
    # token chunks, and shards further ahead, that the first process's scheduler had not
    # reached when it exited: how far it got depends on the machine's speed, so those are not
    # counted (a small shard's chunk is the whole object, as its header fetch is).
    again_headers = _header_gets(proxy)
    assert not set(again_headers) & set(touched), sorted(set(again_headers) & set(touched))[:4]
    assert proxy.requests.get("HEAD", 0) == 1 and proxy.requests.get("GET", 0) == sum(_shard_gets(proxy).values())


def test_processes_of_a_node_fetch_each_shard_header_once(moto, bucket, proxy, tmp_path):
    """Processes of one node opening a dataset at once fetch each shard's header once between
    them: one fetches it, the others wait for it in the cache and read it back."""
    path = _write(tmp_path / "src", shard_tokens=400_000)
    moto.upload_dir(bucket, "ds", str(path))
    url = f"s3://{bucket}/ds"
    alone = _readers(url, tmp_path / "alone", proxy.endpoint, 1)
    one = _header_gets(proxy)
    proxy.reset_counts()
    four = _readers(url, tmp_path / "shared", proxy.endpoint, 4)
    assert four == alone * 4 == [_local_hash(tokenfeed.open(str(path)))] * 4
    together = _header_gets(proxy)
    # every header fetched once on the node, as one process alone fetches them
    assert together and max(together.values()) == 1, sorted(together.items())[:4]
    metadata = {k: v for k, v in _shard_gets(proxy).items() if k[1] is None or k[1].startswith("bytes=0-")
                or k[1].endswith(f"-{os.path.getsize(path / k[0].rsplit('/', 1)[1]) - 1}")}
    assert max(metadata.values()) == 1, sorted(metadata.items())[:4]
    assert len(together) <= len(one) + 8  # (the scheduler may read a few shards further ahead)


def _same_size_other_header(data: bytes) -> bytes:
    """The shard with another tokens_checksum in a header that is valid (its own checksum redone):
    a replacement of the same size that parses."""
    buf = bytearray(data)
    buf[104:112] = (int.from_bytes(buf[104:112], "little") ^ 1).to_bytes(8, "little")
    buf[248:256] = xxhash.xxh64_intdigest(bytes(buf[:248]), seed=0).to_bytes(8, "little")
    return bytes(buf)


@pytest.mark.parametrize("replacement", ["another dataset's shard", "same size, another header"])
def test_shard_replaced_after_the_catalog_is_refused_on_first_touch(uploaded, moto, bucket, tmp_path, replacement):
    names, local, url = uploaded
    victim = names[0]
    if replacement == "same size, another header":
        with open(os.path.join(local.paths[0], victim), "rb") as f:
            data = _same_size_other_header(f.read())
    else:
        other = _write(tmp_path / "other", seed=7)
        with open(other / sorted(n for n in os.listdir(other) if n.endswith(".tfs"))[0], "rb") as f:
            data = f.read()
    moto.put(bucket, f"ds/{victim}", data)
    ds = _open(url, tmp_path / "cache", moto.endpoint)  # the open itself reads no shard
    assert ds.fingerprint == local.fingerprint  # from the catalog
    with pytest.raises(tokenfeed.FormatError, match=rf"{victim}: .*(catalog|size)") as ei:
        ds.document(0)  # the first document lies in the first shard
    assert "tokenfeed index" in str(ei.value)
    # the other shards still read, and the same error again, never other tokens
    assert np.array_equal(ds.document(ds.num_documents - 1), local.document(local.num_documents - 1))
    with pytest.raises(tokenfeed.FormatError, match=victim):
        ds.tokens(0, 10)


def test_catalog_of_another_manifest_is_ignored(dataset, moto, bucket, tmp_path):
    """A dataset rewritten without its catalog (or with an old one left beside it) opens by
    reading every shard's header, as before catalogs existed."""
    path, names = dataset
    newer = _write(tmp_path / "newer", n_docs=1500, seed=3)
    os.replace(path / CATALOG, tmp_path / "old.catalog")
    moto.upload_dir(bucket, "plain", str(path))  # no catalog at all
    os.replace(tmp_path / "old.catalog", newer / CATALOG)
    moto.upload_dir(bucket, "stale", str(newer))  # a catalog of another manifest
    p = FaultProxy(moto.port)
    try:
        for prefix, src in (("plain", path), ("stale", newer)):
            p.reset_counts()
            local = tokenfeed.open(str(src))
            ds = _open(f"s3://{bucket}/{prefix}", tmp_path / f"cache-{prefix}", p.endpoint)
            # every header read at open (the previous open's loader may still fetch its own shards)
            assert len({k[0] for k in _shard_gets(p) if f"/{prefix}/" in k[0]}) == local.num_files
            assert ds.fingerprint == local.fingerprint
            assert all(np.array_equal(a, b) for a, b in zip(_batches(ds, 2), _batches(local, 2)))
    finally:
        p.stop()


def test_index_writes_the_catalog_of_an_older_dataset(dataset, moto, bucket, tmp_path):
    path, names = dataset
    os.remove(path / CATALOG)
    assert tokenfeed.build_catalog(str(path)) == f"{path}/{CATALOG}"
    moto.upload_dir(bucket, "ds", str(path))
    p = FaultProxy(moto.port)
    try:
        ds = _open(f"s3://{bucket}/ds", tmp_path / "cache", p.endpoint)
        assert _shard_gets(p) == {}
        assert ds.fingerprint == tokenfeed.open(str(path)).fingerprint
    finally:
        p.stop()


def test_compressed_dataset_reads_every_header_at_open(moto, bucket, proxy, tmp_path):
    """The scheduler places compressed blocks by each shard's block table: a compressed dataset
    opens as before, its catalog notwithstanding, with the same batches as locally."""
    rng = np.random.default_rng(5)
    docs = [rng.integers(0, 50000, size=int(n), dtype=np.uint16) for n in rng.integers(100, 900, size=600)]
    with tokenfeed.DatasetWriter(tmp_path / "z", vocab_size=50000, shard_tokens=20_000, compression="zstd",
                                 block_tokens=1024) as w:
        w.add_documents(docs)
    assert os.path.isfile(tmp_path / "z" / CATALOG)
    moto.upload_dir(bucket, "z", str(tmp_path / "z"))
    local = tokenfeed.open(str(tmp_path / "z"))
    ds = _open(f"s3://{bucket}/z", tmp_path / "cache", proxy.endpoint)
    assert len({k[0] for k in _shard_gets(proxy)}) == local.num_files
    assert ds.fingerprint == local.fingerprint
    assert all(np.array_equal(a, b) for a, b in zip(_batches(ds, 2), _batches(local, 2)))


def test_token_bytes_replaced_under_an_intact_header_are_refused(uploaded, moto, bucket, proxy, tmp_path):
    """No listing pins a shard known from the catalog to a version: what keeps its tokens right
    is its chunk checksums. A shard whose token bytes change while its header stays (the header
    matches the catalog) fails with the checksum error, never with other tokens."""
    names, local, url = uploaded
    victim = names[0]
    with open(os.path.join(local.paths[0], victim), "rb") as f:
        data = bytearray(f.read())
    data[4096 + 100] ^= 0xFF  # a token byte (the token section starts at 4096)
    moto.put(bucket, f"ds/{victim}", bytes(data))
    ds = _open(url, tmp_path / "cache", proxy.endpoint)
    with pytest.raises(OSError, match=rf"{victim}.*checksum"):
        ds.tokens(0, 200)
    # another shard opened on first touch by document(), which waits for the transport (Python)
    # without holding the GIL
    assert np.array_equal(ds.document(ds.num_documents - 1), local.document(local.num_documents - 1))


def test_shard_without_chunk_checksums_is_pinned_to_the_store_version(moto, bucket, proxy, tmp_path):
    """A shard without chunk checksums has nothing to check its token bytes against but the
    version: its first touch asks the store for it (one request per such shard), and its reads
    are pinned to it as a listed shard's are: changed afterwards, it is refused."""
    rng = np.random.default_rng(4)
    docs = [rng.integers(0, 50000, size=int(n), dtype=np.uint16) for n in rng.integers(100, 900, size=2000)]
    src = tmp_path / "nosums"
    with tokenfeed.DatasetWriter(src, vocab_size=50000, shard_tokens=400_000, chunk_checksum_bytes=0) as w:
        w.add_documents(docs)
    moto.upload_dir(bucket, "nosums", str(src))
    local = tokenfeed.open(str(src))
    ds = _open(f"s3://{bucket}/nosums", tmp_path / "cache", proxy.endpoint)
    assert not _listings(proxy) and _shard_gets(proxy) == {}
    heads = proxy.requests.get("HEAD", 0)
    assert np.array_equal(ds.document(0), local.document(0))
    assert proxy.requests.get("HEAD", 0) == heads + 1  # the first shard's version, asked once
    assert np.array_equal(ds.document(1), local.document(1))
    assert proxy.requests.get("HEAD", 0) == heads + 1
    first = sorted(n for n in os.listdir(src) if n.endswith(".tfs"))[0]
    with open(src / first, "rb") as f:
        data = bytearray(f.read())
    data[len(data) // 2] ^= 0xFF  # a token byte: the header, which the catalog checks, stays
    moto.put(bucket, f"nosums/{first}", bytes(data))
    with pytest.raises(OSError, match=first):
        ds.tokens(0, local.num_tokens // local.num_files)  # bytes not read yet: refused, never read unchecked


def test_shard_missing_from_the_store_is_named_on_first_touch(uploaded, moto, bucket, tmp_path):
    names, local, url = uploaded
    moto.delete(bucket, f"ds/{names[0]}")
    ds = _open(url, tmp_path / "cache", moto.endpoint)  # no shard is asked about at open
    with pytest.raises(OSError, match=rf"{names[0]}: does not exist, although the dataset's manifest names it"):
        ds.document(0)
    assert np.array_equal(ds.document(ds.num_documents - 1), local.document(local.num_documents - 1))


# ---- closing while the scheduler opens shards ahead --------------------------------------

class _Gate:
    """Holds every read of the shards from `hold_from` on (by their place in `names`) until
    opened; counts the reads held and those released."""

    def __init__(self, names, hold_from):
        import threading

        self.held_names = set(names[hold_from:])
        self.open = threading.Event()
        self.one_held = threading.Event()
        self.lock = threading.Lock()
        self.held = self.released = 0

    def wrap(self, read_into):
        def gated(transport, url, version, size, offset, buf):
            if url.rsplit("/", 1)[-1] in self.held_names and not self.open.is_set():
                with self.lock:
                    self.held += 1
                self.one_held.set()
                self.open.wait(120)
                with self.lock:
                    self.released += 1
            return read_into(transport, url, version, size, offset, buf)
        return gated


def test_close_is_prompt_while_the_scheduler_opens_shards(dataset, moto, bucket, tmp_path, monkeypatch):
    """The scheduler opens shards known from the catalog ahead of their reader; close() stops it
    whatever it waits for: it returns while the store still holds the shards' requests (none was
    answered), instead of after the look-ahead has opened every shard within prefetch_bytes."""
    from tokenfeed.remote._remote import ObjectStoreTransport

    path, names = dataset
    moto.upload_dir(bucket, "ds", str(path))
    # the first touch fetches the next 8 shards' headers with its own, and the reader of the first
    # batches needs shards 0 and 1 at most: the scheduler's touches further ahead are held
    gate = _Gate(names, 10)
    monkeypatch.setattr(ObjectStoreTransport, "read_into", gate.wrap(ObjectStoreTransport.read_into))
    import threading

    try:
        ds = _open(f"s3://{bucket}/ds", tmp_path / "cache", moto.endpoint)
        loader = tokenfeed.Loader(ds, seq_len=128, batch_size=8, seed=3, shuffle=False, prefetch_batches=2)
        next(iter(loader))
        assert gate.one_held.wait(60), "the scheduler never asked for a shard ahead"
        t = threading.Thread(target=loader.close, daemon=True)
        t.start()
        t.join(60)  # a hang guard only: close must return while the gate holds every request
        closed_while_held = not t.is_alive() and not gate.open.is_set()
        released = gate.released
    finally:
        gate.open.set()
    assert closed_while_held and released == 0, (gate.held, released)
    t.join(60)


def test_directory_url_without_its_catalog_is_listed_once(dataset, moto, bucket, proxy, tmp_path):
    """A native dataset opened by its `/` URL without its catalog: the listing that expanded the
    URL gives the shards' sizes and versions too, instead of a second listing of the prefix."""
    path, names = dataset
    moto.upload_dir(bucket, "ds", str(path))
    moto.delete(bucket, "ds/" + CATALOG)
    proxy.reset_counts()
    ds = _open(f"s3://{bucket}/ds/", tmp_path / "cache", proxy.endpoint)
    assert ds.num_files == len(names) and ds.num_tokens == tokenfeed.open(str(path)).num_tokens
    assert sum(_listings(proxy).values()) == 1, _listings(proxy)
    assert all(np.array_equal(a, b) for a, b in zip(_batches(ds, 2), _batches(tokenfeed.open(str(path)), 2)))


_CTRL_C_CHILD = INTERRUPTIBLE + textwrap.dedent("""
    import sys, threading
    import tokenfeed
    from tokenfeed.remote._remote import ObjectStoreTransport
    url, cache, endpoint, held_from = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split(",")
    gate, held, released = threading.Event(), threading.Event(), []
    read_into = ObjectStoreTransport.read_into

    def gated(self, u, version, size, offset, buf):
        if u.rsplit("/", 1)[-1] in held_from and not gate.is_set():
            held.set()
            gate.wait(120)
            released.append(u)
        return read_into(self, u, version, size, offset, buf)

    ObjectStoreTransport.read_into = gated
    ds = tokenfeed.open(url, cache_dir=cache, cache_limit="256MB", endpoint_url=endpoint, chunk_size=64 << 10)
    try:
        with tokenfeed.Loader(ds, seq_len=128, batch_size=8, seed=3, shuffle=False, prefetch_batches=2) as loader:
            next(iter(loader))
            held.wait(60)
            print("held", flush=True)
            threading.Event().wait(120)  # Ctrl-C comes here, while the look-ahead waits
    except KeyboardInterrupt:
        print("closed", len(released), flush=True)
    gate.set()
""")


def test_ctrl_c_is_prompt_while_the_scheduler_opens_shards(dataset, moto, bucket, tmp_path):
    """Ctrl-C while the scheduler waits for a shard it opens ahead: the loader's close on the way
    out returns while the store still holds the requests (none was answered)."""
    import signal

    from remote_util import TEST_CREDENTIALS

    path, names = dataset
    moto.upload_dir(bucket, "ds", str(path))
    env = dict(os.environ, **TEST_CREDENTIALS, PYTHONPATH=os.pathsep.join(sys.path))
    # started as a background job would be (SIGINT ignored): the child restores its handler itself
    pr = subprocess.Popen(as_background_job([sys.executable, "-c", _CTRL_C_CHILD, f"s3://{bucket}/ds",
                                             str(tmp_path / "cache"), moto.endpoint, ",".join(names[10:])]),
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert pr.stdout.readline().strip() == "held"
        pr.send_signal(signal.SIGINT)
        out, err = pr.communicate(timeout=100)  # a hang guard only
    finally:
        if pr.poll() is None:
            pr.kill()
            pr.communicate()
    assert out.strip() == "closed 0", (out, err[-2000:])


@pytest.mark.parametrize("catalog", ["with its catalog", "without"])
def test_a_node_reading_its_ranks_fetches_each_range_once(tmp_path, moto, bucket, proxy, catalog):  # noqa: F811
    """A node's processes (distinct ranks, one cache) reading their whole epoch of a dataset of
    small shards share every fetch: each range once per node, and per shard no more than its
    first touch (or the open's read of it) and its tokens' one chunk. A reader's small read
    that would take most of a small chunk fetches that chunk instead, and one that another
    process is fetching is waited for."""
    rng = np.random.default_rng(4)
    docs = [rng.integers(0, 50000, size=int(n), dtype=np.uint16) for n in rng.integers(100, 700, size=50)]
    path = tmp_path / "src"
    with tokenfeed.DatasetWriter(path, vocab_size=50000, shard_tokens=1) as w:  # one document per shard
        w.add_documents(docs)
    moto.upload_dir(bucket, "ds", str(path))
    if catalog == "without":
        moto.delete(bucket, f"ds/{CATALOG}")
    url = f"s3://{bucket}/ds"
    got = node_readers(url, tmp_path / "cache", proxy.endpoint, 3)
    assert got == node_hashes(tokenfeed.open(str(path)), 3)
    gets = _shard_gets(proxy)
    assert len({k[0] for k in gets}) == len(docs)
    assert max(gets.values()) == 1, sorted((v, k) for k, v in gets.items() if v > 1)[-4:]
    assert sum(gets.values()) <= 2 * len(docs)
