"""Test servers for remote datasets: moto's standalone S3 server and a fault-injecting proxy.

Everything listens on 127.0.0.1 only, on ports picked free at start, and is stopped by the
fixture that started it. Every wait loop is bounded.

* :class:`MotoServer` runs ``python -m moto.server`` in a subprocess: the client under test
  speaks real HTTP to a real S3 API.
* :class:`FaultProxy` is a small HTTP reverse proxy in front of it that counts requests and
  bytes, adds latency, caps bandwidth, and injects faults: 500, 503 SlowDown, connection
  resets and short bodies, either at a seeded random rate or as an explicit plan for the next
  requests.
"""
from __future__ import annotations

import http.client
import os
import random
import re
import socket
import struct
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Optional, Tuple

LOOPBACK = "127.0.0.1"
TEST_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing-key-id", "AWS_SECRET_ACCESS_KEY": "testing-secret-key-XYZ",
                    "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1"}


# The first line of a child script that a test interrupts: Ctrl-C raises KeyboardInterrupt
# even when the test run was started with SIGINT ignored (a background job of a
# non-interactive shell, many CI runners and job schedulers), which children inherit and
# which keeps Python from installing its handler.
INTERRUPTIBLE = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"


def as_background_job(argv: List[str]) -> List[str]:
    """argv started as a background job starts it: with SIGINT ignored (exec keeps an ignored
    signal ignored), so that a test that interrupts the child shows it does not depend on the
    disposition the test run happened to be started with."""
    return [sys.executable, "-c",
            "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); os.execv(sys.argv[1], sys.argv[1:])",
            *argv]


def write_dataset(path: Any, n_docs: int = 400, seed: int = 0) -> Any:
    """A native dataset of n_docs random documents (100 to 900 tokens) in several shards."""
    import numpy as np

    import tokenfeed

    rng = np.random.default_rng(seed)
    docs = [rng.integers(0, 50000, size=int(n), dtype=np.uint16) for n in rng.integers(100, 900, size=n_docs)]
    with tokenfeed.DatasetWriter(path, vocab_size=50000, shard_tokens=60_000) as w:
        w.add_documents(docs)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def wait_listening(port: int, timeout: float = 30.0, proc: Optional[subprocess.Popen] = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before listening on {port}")
        try:
            socket.create_connection((LOOPBACK, port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {LOOPBACK}:{port} after {timeout} s")


class MotoServer:
    """moto's standalone server in a subprocess on a free loopback port."""

    def __init__(self) -> None:
        self.port = free_port()
        self.endpoint = f"http://{LOOPBACK}:{self.port}"
        self._stores: Dict[str, Any] = {}
        env = dict(os.environ, **TEST_CREDENTIALS)
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", LOOPBACK, "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        try:
            wait_listening(self.port, proc=self.proc)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def _request(self, method: str, path: str, body: bytes = b"") -> Tuple[int, bytes]:
        c = http.client.HTTPConnection(LOOPBACK, self.port, timeout=30)
        try:
            c.request(method, path, body=body)
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def create_bucket(self, bucket: str) -> None:
        status, body = self._request("PUT", f"/{bucket}")
        if status not in (200, 409):
            raise RuntimeError(f"create bucket {bucket}: HTTP {status}: {body[:200]!r}")

    def store(self, bucket: str) -> Any:
        """An obstore client for the bucket (signed with the test credentials)."""
        from obstore.store import S3Store

        st = self._stores.get(bucket)
        if st is None:
            st = S3Store(bucket, endpoint=self.endpoint, client_options={"allow_http": True}, region="us-east-1",
                         access_key_id=TEST_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                         secret_access_key=TEST_CREDENTIALS["AWS_SECRET_ACCESS_KEY"])
            self._stores[bucket] = st
        return st

    def put(self, bucket: str, key: str, data: bytes) -> None:
        import obstore

        obstore.put(self.store(bucket), key, data)

    def delete(self, bucket: str, key: str) -> None:
        import obstore

        obstore.delete(self.store(bucket), key)

    def upload_dir(self, bucket: str, prefix: str, local: str) -> List[str]:
        """Upload every file under ``local`` to ``bucket/prefix/...``; returns the keys."""
        keys = []
        for root, _dirs, files in os.walk(local):
            for name in sorted(files):
                path = os.path.join(root, name)
                rel = os.path.relpath(path, local).replace(os.sep, "/")
                key = f"{prefix.rstrip('/')}/{rel}" if prefix else rel
                with open(path, "rb") as f:
                    self.put(bucket, key, f.read())
                keys.append(key)
        return keys


_SLOWDOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
             b"<Message>Please reduce your request rate.</Message></Error>")
_INTERNAL = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InternalError</Code>'
             b"<Message>We encountered an internal error. Please try again.</Message></Error>")

FAULTS = ("500", "503", "reset", "short", "stall")


class _TokenBucket:
    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.lock = threading.Lock()
        self.next_free = time.monotonic()

    def take(self, n: int) -> None:
        """Block until n bytes may be sent (shared by every connection)."""
        with self.lock:
            now = time.monotonic()
            start = max(now, self.next_free)
            self.next_free = start + n / self.rate
            delay = self.next_free - now
        if delay > 0:
            time.sleep(delay)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "_ProxyServer"

    def log_message(self, fmt: str, *args: Any) -> None:  # quiet
        pass

    def _forward(self) -> None:
        proxy = self.server.owner
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        rng = self.headers.get("Range")
        is_get = self.command == "GET"
        fault = proxy._next_fault(self.command, self.path, rng)
        proxy._count(self.command, self.path, rng)
        if proxy.latency:
            time.sleep(proxy.latency)
        if fault == "reset":
            # RST instead of FIN: the client sees "connection reset by peer"
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
            self.connection.close()
            return
        if fault in ("500", "503"):
            payload = _SLOWDOWN if fault == "503" else _INTERNAL
            self.send_response(int(fault), "Slow Down" if fault == "503" else "Internal Server Error")
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        upstream = http.client.HTTPConnection(LOOPBACK, proxy.upstream_port, timeout=60)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection", "keep-alive")}
            upstream.request(self.command, self.path, body=body, headers=headers)
            resp = upstream.getresponse()
            data = resp.read()
        finally:
            upstream.close()
        self.send_response(resp.status, resp.reason)
        for k, v in resp.getheaders():
            if k.lower() in ("connection", "keep-alive", "transfer-encoding", "content-length", "server", "date"):
                continue
            self.send_header(k, v)
        if self.command == "HEAD":
            self.send_header("Content-Length", resp.getheader("Content-Length") or "0")
            self.end_headers()
            return
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if fault == "stall":
            # headers, then silence: the client's read timeout must fire
            self.wfile.flush()
            proxy._stall.wait(proxy.stall_seconds)
            self.close_connection = True
            return
        if fault == "short":
            data = data[: len(data) // 2]
        step = 16384
        for i in range(0, len(data), step):
            piece = data[i:i + step]
            if proxy._bucket is not None:
                proxy._bucket.take(len(piece))
            if is_get:  # counted before the write: the client may act on the bytes at once
                with proxy._lock:
                    proxy.bytes_sent += len(piece)
            try:
                self.wfile.write(piece)
            except OSError:
                return
        if fault == "short":
            self.wfile.flush()
            self.close_connection = True

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward


class _ProxyServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    owner: "FaultProxy"


class FaultProxy:
    """Reverse proxy on a free loopback port in front of ``upstream_port``.

    ``latency`` (seconds) is added before every response; ``bandwidth`` (bytes/s) caps the
    response bodies of all connections together; ``error_rate`` injects one of ``faults`` into
    that fraction of ranged GETs (seeded: the same requests fail in the same order);
    :meth:`plan` injects given faults into the next matching GETs. Counts every request.
    """

    def __init__(self, upstream_port: int, *, latency: float = 0.0, bandwidth: Optional[float] = None,
                 error_rate: float = 0.0, faults: Tuple[str, ...] = ("500", "503", "reset", "short"),
                 seed: int = 0, stall_seconds: float = 30.0) -> None:
        for f in faults:
            if f not in FAULTS:
                raise ValueError(f"unknown fault {f!r}; expected one of {FAULTS}")
        self.upstream_port = upstream_port
        self.latency = latency
        self.error_rate = error_rate
        self.faults = faults
        self.stall_seconds = stall_seconds
        self._stall = threading.Event()
        self._rng = random.Random(seed)
        self._bucket = _TokenBucket(bandwidth) if bandwidth else None
        self._lock = threading.Lock()
        self._plan: List[Tuple[str, Optional[str]]] = []
        self.requests: Dict[str, int] = {}
        self.gets: Dict[Tuple[str, Optional[str]], int] = {}
        self.injected: Dict[str, int] = {}
        self.bytes_sent = 0
        self.port = free_port()
        self.endpoint = f"http://{LOOPBACK}:{self.port}"
        self._server = _ProxyServer((LOOPBACK, self.port), _Handler)
        self._server.owner = self
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="fault-proxy", daemon=True)
        self._thread.start()

    def plan(self, *faults: str, path_contains: Optional[str] = None) -> None:
        """Inject these faults, in order, into the next GETs (whose path contains the string)."""
        with self._lock:
            for f in faults:
                if f not in FAULTS:
                    raise ValueError(f"unknown fault {f!r}")
                self._plan.append((f, path_contains))

    def _next_fault(self, method: str, path: str, rng: Optional[str]) -> Optional[str]:
        if method != "GET" or not self._plan_or_rate():
            return None
        with self._lock:
            for i, (f, match) in enumerate(self._plan):
                if match is None or match in path:
                    del self._plan[i]
                    self.injected[f] = self.injected.get(f, 0) + 1
                    return f
            if rng and self.error_rate and self._rng.random() < self.error_rate:
                f = self._rng.choice(self.faults)
                self.injected[f] = self.injected.get(f, 0) + 1
                return f
        return None

    def _plan_or_rate(self) -> bool:
        return bool(self._plan) or self.error_rate > 0

    def _count(self, method: str, path: str, rng: Optional[str]) -> None:
        with self._lock:
            self.requests[method] = self.requests.get(method, 0) + 1
            if method == "GET":
                key = (re.sub(r"\?.*$", "", path), rng)
                self.gets[key] = self.gets.get(key, 0) + 1

    def reset_counts(self) -> None:
        with self._lock:
            self.requests.clear()
            self.gets.clear()
            self.injected.clear()
            self.bytes_sent = 0

    def ranged_gets(self, path_contains: str = "") -> Dict[Tuple[str, Optional[str]], int]:
        with self._lock:
            return {k: v for k, v in self.gets.items() if k[1] and path_contains in k[0]}

    def stop(self) -> None:
        self._stall.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)


# ---------------------------------------------------------------------------------------
# a node's processes

NODE_READER = r"""
import hashlib, sys, numpy as np, tokenfeed
url, cache, endpoint, rank, world = sys.argv[1:6]
ds = tokenfeed.open(url, cache_dir=cache, cache_limit="256MB", endpoint_url=endpoint, chunk_size=65536)
h = hashlib.sha256()
loader = tokenfeed.Loader(ds, seq_len=64, batch_size=4, seed=5, shuffle="block", block_size=4, epochs=1,
                          dp_rank=int(rank), dp_size=int(world))
for b in loader:
    h.update(np.ascontiguousarray(np.asarray(b["input_ids"])).tobytes())
loader.close()
print(h.hexdigest())
"""


def node_readers(url: str, cache: Any, endpoint: str, procs: int, **env: str) -> List[str]:
    """procs processes of one node (distinct dp ranks, one cache) each reading its whole epoch."""
    e = dict(os.environ, **TEST_CREDENTIALS, **env)
    ps = [subprocess.Popen([sys.executable, "-c", NODE_READER, url, str(cache), endpoint, str(r), str(procs)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e) for r in range(procs)]
    out = []
    for p in ps:
        o, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
        out.append(o.strip())
    return out


def node_hashes(ds: Any, procs: int) -> List[str]:
    """What NODE_READER prints for each rank, read in this process."""
    import hashlib

    import numpy as np
    import tokenfeed

    out = []
    for r in range(procs):
        h = hashlib.sha256()
        for b in tokenfeed.Loader(ds, seq_len=64, batch_size=4, seed=5, shuffle="block", block_size=4, epochs=1,
                                  dp_rank=r, dp_size=procs):
            h.update(np.ascontiguousarray(np.asarray(b["input_ids"])).tobytes())
        out.append(h.hexdigest())
    return out


# ---------------------------------------------------------------------------------------
# pytest fixtures (import them into a test module to use them)

import uuid  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(scope="module")
def moto():
    """moto's S3 server for the module, with the test credentials in the environment."""
    m = MotoServer()
    with pytest.MonkeyPatch.context() as mp:
        for k, v in TEST_CREDENTIALS.items():
            mp.setenv(k, v)
        for k in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE"):
            mp.delenv(k, raising=False)
        yield m
    m.stop()


@pytest.fixture
def s3env(moto):
    return moto


@pytest.fixture
def bucket(moto):
    name = f"tf-{uuid.uuid4().hex[:12]}"
    moto.create_bucket(name)
    return name


@pytest.fixture
def proxy(moto):
    p = FaultProxy(moto.port)
    yield p
    p.stop()
