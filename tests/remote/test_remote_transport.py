"""The pieces under remote datasets: URL and size parsing, the obstore transport against moto's
S3 server (real HTTP on loopback), its error classes through the fault-injecting proxy, and
the proxy itself. Nothing here depends on timing: requests, bytes and error codes are counted.
"""
from __future__ import annotations

import errno
import os
import uuid

import numpy as np
import pytest

from remote_util import TEST_CREDENTIALS, FaultProxy, bucket, moto, proxy, s3env  # noqa: F401  (fixtures)
from tokenfeed.remote import _remote
from tokenfeed.remote._remote import ObjectStoreTransport, TransportError, parse_size, parse_url


# ---- sizes and URLs ---------------------------------------------------------------------

@pytest.mark.parametrize("text,expect", [
    ("200GB", 200 * 10 ** 9), ("200 GB", 200 * 10 ** 9), ("1.5TiB", int(1.5 * 2 ** 40)), ("500M", 500 * 10 ** 6),
    ("64MiB", 64 << 20), ("1024", 1024), ("10kb", 10_000), ("2g", 2 * 10 ** 9), (12345, 12345), (".5GiB", 1 << 29),
])
def test_parse_size(text, expect):
    assert parse_size(text) == expect


@pytest.mark.parametrize("bad", ["", "GB", "-5GB", "1.2.3GB", "5 parsecs", "0", 0, -1])
def test_parse_size_refuses(bad):
    with pytest.raises(ValueError, match="cache_limit"):
        parse_size(bad)


def test_parse_size_types():
    assert parse_size(None) is None
    with pytest.raises(TypeError):
        parse_size(True)
    with pytest.raises(TypeError):
        parse_size(1.5e9)  # type: ignore[arg-type]


def test_parse_url():
    assert parse_url("s3://bkt/a/b/c.bin") == ("s3", "bkt", "a/b/c.bin")
    assert parse_url("s3://bkt/prefix/") == ("s3", "bkt", "prefix/")
    assert parse_url("S3://bkt") == ("s3", "bkt", "")
    assert parse_url("gs://b/k") == ("gs", "b", "k")
    assert parse_url("az://container/k") == ("az", "container", "k")
    assert parse_url("https://host:8443/p/q") == ("https", "host:8443", "p/q")
    assert parse_url("s3://bkt/prefix/").join("tokenfeed.manifest") == "s3://bkt/prefix/tokenfeed.manifest"
    assert parse_url("s3://bkt").join("x") == "s3://bkt/x"
    assert _remote.is_url("s3://b/k") and _remote.is_url("https://h/p")
    assert not _remote.is_url("/local/path") and not _remote.is_url("file:///x") and not _remote.is_url(3)


@pytest.mark.parametrize("bad,why", [
    ("ftp://host/x", "unsupported scheme"), ("s3://", "expected a bucket"), ("s3:/b/k", "expected a URL"),
    ("s3://AKIAXXX:secret@bkt/k", "credentials in URLs"), ("s3://b/k?versionId=3", "query strings"),
])
def test_parse_url_refuses(bad, why):
    with pytest.raises(ValueError, match=why):
        parse_url(bad)


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("TOKENFEED_CACHE_DIR", str(tmp_path / "c"))
    assert _remote.default_cache_dir() == str(tmp_path / "c")
    monkeypatch.delenv("TOKENFEED_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert _remote.default_cache_dir() == str(tmp_path / "x" / "tokenfeed" / "remote")


# ---- the transport against moto ---------------------------------------------------------

def test_transport_stat_and_read(s3env, bucket):
    data = os.urandom(300_000)
    s3env.put(bucket, "d/obj.bin", data)
    t = ObjectStoreTransport(endpoint_url=s3env.endpoint)
    size, version = t.stat(f"s3://{bucket}/d/obj.bin")
    assert size == len(data) and version
    buf = bytearray(1000)
    assert t.read_into(f"s3://{bucket}/d/obj.bin", version, size, 12345, buf) == 1000
    assert bytes(buf) == data[12345:13345]
    # into a numpy array too (any writable buffer)
    arr = np.zeros(4096, dtype=np.uint8)
    assert t.read_into(f"s3://{bucket}/d/obj.bin", "", size, 0, arr) == 4096
    assert arr.tobytes() == data[:4096]


def test_transport_list(s3env, bucket):
    for name in ("ds/a.tfs", "ds/b.tfs", "ds/sub/c.bin", "other/x"):
        s3env.put(bucket, name, name.encode())
    t = ObjectStoreTransport(endpoint_url=s3env.endpoint)
    got = sorted((u, n) for u, n, _v in t.list(f"s3://{bucket}/ds/"))
    assert got == [(f"s3://{bucket}/ds/a.tfs", 8), (f"s3://{bucket}/ds/b.tfs", 8), (f"s3://{bucket}/ds/sub/c.bin", 12)]
    assert all(v for _u, _n, v in t.list(f"s3://{bucket}/ds"))
    assert list(t.list(f"s3://{bucket}/nothing-here/")) == []


def test_transport_endpoint_from_environment(s3env, bucket, monkeypatch):
    s3env.put(bucket, "k", b"hello world")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3env.endpoint)
    t = ObjectStoreTransport()
    assert t.stat(f"s3://{bucket}/k")[0] == 11
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3env.endpoint)   # the S3-specific one wins
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    assert ObjectStoreTransport().stat(f"s3://{bucket}/k")[0] == 11


def test_transport_error_classes(s3env, bucket):
    s3env.put(bucket, "k", b"x" * 5000)
    t = ObjectStoreTransport(endpoint_url=s3env.endpoint)
    with pytest.raises(TransportError) as ei:
        t.stat(f"s3://{bucket}/missing")
    assert ei.value.errno == errno.ENOENT
    with pytest.raises(TransportError) as ei:
        t.read_into(f"s3://{bucket}/missing", "", 10, 0, bytearray(10))
    assert ei.value.errno == errno.ENOENT
    size, version = t.stat(f"s3://{bucket}/k")
    # the object is replaced: a read conditional on the old version is refused
    s3env.put(bucket, "k", b"y" * 5000)
    with pytest.raises(TransportError) as ei:
        t.read_into(f"s3://{bucket}/k", version, size, 0, bytearray(10))
    assert ei.value.errno == errno.ESTALE
    buf = bytearray(10)
    t.read_into(f"s3://{bucket}/k", t.stat(f"s3://{bucket}/k")[1], size, 0, buf)
    assert bytes(buf) == b"y" * 10


@pytest.mark.parametrize("fault,code", [
    ("500", errno.EIO), ("503", errno.EAGAIN), ("reset", errno.ECONNRESET), ("short", errno.EPROTO),
    ("stall", errno.ETIMEDOUT),
])
def test_transport_fault_classes(s3env, bucket, proxy, fault, code):
    data = os.urandom(200_000)
    s3env.put(bucket, "f.bin", data)
    t = ObjectStoreTransport(endpoint_url=proxy.endpoint, timeout=2.0, connect_timeout=2.0)
    url = f"s3://{bucket}/f.bin"
    size, version = t.stat(url)
    proxy.stall_seconds = 10
    proxy.plan(fault)
    buf = bytearray(100_000)
    with pytest.raises(TransportError) as ei:
        t.read_into(url, version, size, 0, buf)
    assert ei.value.errno == code, str(ei.value)
    assert proxy.injected == {fault: 1}
    # the message is a sentence, without the client's debug dump or any credential
    msg = str(ei.value)
    assert "Debug source" not in msg and len(msg) < 600
    for secret in TEST_CREDENTIALS.values():
        if "secret" in secret or "key" in secret:
            assert secret not in msg
    # the next request goes through
    assert t.read_into(url, version, size, 0, buf) == len(buf) and bytes(buf) == data[:100_000]


def test_transport_never_shows_credentials(s3env, bucket):
    t = ObjectStoreTransport(endpoint_url=s3env.endpoint,
                             storage_options={"access_key_id": "AKIASHOULDNOTSHOW", "secret_access_key": "sekrit-value"})
    for text in (repr(t), str(t)):
        assert "AKIASHOULDNOTSHOW" not in text and "sekrit-value" not in text
        assert "access_key_id" in text  # the option names are shown, not their values
    with pytest.raises(TransportError) as ei:
        t.stat(f"s3://{bucket}/missing")
    assert "sekrit-value" not in str(ei.value) and "AKIASHOULDNOTSHOW" not in str(ei.value)
    assert _remote._redact("GET https://h/b/k?X-Amz-Signature=abc&X-Amz-Credential=AKIA1/2 failed", ()) == \
        "GET https://h/b/k?<query redacted> failed"


def test_transport_refuses_bad_endpoint():
    with pytest.raises(ValueError, match="endpoint_url"):
        ObjectStoreTransport(endpoint_url="not a url")


def test_transport_pickles_without_stores(s3env, bucket):
    import pickle

    s3env.put(bucket, "k", b"abc")
    t = ObjectStoreTransport(endpoint_url=s3env.endpoint)
    t.stat(f"s3://{bucket}/k")
    t2 = pickle.loads(pickle.dumps(t))
    assert t2.stat(f"s3://{bucket}/k")[0] == 3


# ---- the proxy itself -------------------------------------------------------------------

def test_proxy_counts_caps_and_injects(s3env, bucket, moto):
    data = os.urandom(1 << 20)
    s3env.put(bucket, "p.bin", data)
    p = FaultProxy(moto.port, bandwidth=4 << 20, error_rate=0.5, faults=("503",), seed=7)
    try:
        t = ObjectStoreTransport(endpoint_url=p.endpoint)
        url = f"s3://{bucket}/p.bin"
        size, version = t.stat(url)
        ok = failed = 0
        for i in range(20):
            buf = bytearray(4096)
            try:
                t.read_into(url, version, size, i * 4096, buf)
                assert bytes(buf) == data[i * 4096:(i + 1) * 4096]
                ok += 1
            except TransportError as e:
                assert e.errno == errno.EAGAIN
                failed += 1
        assert failed == p.injected["503"] and ok + failed == 20
        assert 0 < failed < 20
        assert p.requests["GET"] == 20 and p.requests["HEAD"] == 1
        assert p.bytes_sent == ok * 4096
        assert len(p.ranged_gets("p.bin")) == 20
    finally:
        p.stop()
