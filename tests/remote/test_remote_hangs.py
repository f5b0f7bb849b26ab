"""Waits on a remote store that stops answering end, with the failure that ended them, and
answer Ctrl-C: next() raises instead of polling forever, an open against a server that
accepts and never answers says what it waits for and fails by its deadline, and SIGINT
during a remote open ends the process promptly. Loopback servers only; every wait bounded.
"""
from __future__ import annotations

import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import tokenfeed
from remote_util import (INTERRUPTIBLE, TEST_CREDENTIALS, FaultProxy, as_background_job, bucket, moto,  # noqa: F401  (fixtures)
                         proxy, s3env, write_dataset)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _write(tmp_path, n_docs=200, seed=0):
    return write_dataset(tmp_path / "src" / "ds", n_docs, seed)


@pytest.fixture
def uploaded(moto, bucket, tmp_path):
    path = _write(tmp_path)
    moto.upload_dir(bucket, "ds", str(path))
    return f"s3://{bucket}/ds/"


class _Silent:
    """A loopback server that accepts connections and never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.conns: list = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        self.sock.settimeout(0.1)
        while not self._stop.is_set():
            try:
                c, _ = self.sock.accept()
            except OSError:
                continue
            self.conns.append(c)

    def stop(self) -> None:
        self._stop.set()
        self._t.join(5)
        for c in self.conns:
            c.close()
        self.sock.close()


@pytest.fixture
def silent():
    s = _Silent()
    yield s
    s.stop()


class _Alarm(Exception):
    pass


def _bounded(seconds):
    """SIGALRM after `seconds`: a wait that never ends fails the test instead of hanging it."""
    def on_alarm(signum, frame):
        raise _Alarm(f"still waiting after {seconds} s")
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    return old


def _unbound(old):
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def test_next_raises_when_store_stops_answering(uploaded, moto, tmp_path):
    """A fetch that runs out of retries ends next() with TimeoutError naming the object; the
    binding no longer takes it for "no batch yet" and polls forever."""
    p = FaultProxy(moto.port, stall_seconds=30)
    try:
        ds = tokenfeed.open(uploaded, cache_dir=tmp_path / "cache", cache_limit="64MB", endpoint_url=p.endpoint,
                            chunk_size=64 << 10, request_timeout=1.0, max_attempts=2)
        p.plan(*["stall"] * 400, path_contains=".tfs")
        loader = tokenfeed.Loader(ds, seq_len=128, batch_size=4, seed=9, shuffle="full")
        old = _bounded(90)
        try:
            with pytest.raises(TimeoutError) as ei:
                next(iter(loader))
        finally:
            _unbound(old)
        msg = str(ei.value)
        assert ".tfs" in msg and "bytes [" in msg and "attempt" in msg
        loader.close()
    finally:
        p.stop()


def test_silent_server_reported_then_fails_by_deadline(silent, tmp_path, monkeypatch, caplog):
    """A server that accepts and never answers: a progress line through logging while the
    first request waits, then a TimeoutError naming the object within the deadline."""
    for k, v in TEST_CREDENTIALS.items():
        monkeypatch.setenv(k, v)
    caplog.set_level(logging.WARNING, logger="tokenfeed")
    old = _bounded(120)
    try:
        with pytest.raises(TimeoutError) as ei:
            tokenfeed.open("s3://bucket/ds/shard-00000.tfs", cache_dir=tmp_path / "cache", cache_limit="64MB",
                           endpoint_url=silent.endpoint)
    finally:
        _unbound(old)
    msg = str(ei.value)
    assert "s3://bucket/ds/shard-00000.tfs" in msg and "max_attempts" in msg and "deadline" in msg
    lines = [r.getMessage() for r in caplog.records if r.name == "tokenfeed"]
    assert any(m.startswith("waiting for s3://bucket/ds/shard-00000.tfs (1") and "attempt 1 of 8" in m
               for m in lines), lines


# request_timeout longer than any wait of the tests (unless given): the child cannot give up
# on a held request by itself, so "interrupted" arrives only if Ctrl-C ends the open without it
_HELD_CHILD = INTERRUPTIBLE + textwrap.dedent("""
    import gc, sys, tokenfeed
    from tokenfeed.remote import _remote
    url, cache, endpoint, timeout, attempts = sys.argv[1:6]
    opts = {} if timeout == "default" else {"request_timeout": float(timeout), "max_attempts": int(attempts),
                                            "deadline": 900}
    print("opening", flush=True)
    try:
        tokenfeed.open(url, cache_dir=cache, cache_limit="64MB", endpoint_url=endpoint, **opts)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    else:
        sys.exit(3)
    gc.collect()  # the interrupted open's store is freed here, with its request still held
    print(f"stores {len(_remote._stores)}", flush=True)
    sys.stdin.readline()
""")


def _interrupt_held_open(url, endpoint, tmp_path, holding, timeout=900, attempts=1):
    """Run an open of url in a child, SIGINT it once holding() says the server holds one of its
    requests, and check that the open raises KeyboardInterrupt and its store is freed while the
    server still holds that request (it is released only after)."""
    # the package this test imports (a sanitizer build's, under .ci/sanitize.sh), else the tree's
    path = [p for p in (os.environ.get("PYTHONPATH"), os.path.join(ROOT, "python")) if p]
    env = dict(os.environ, **TEST_CREDENTIALS, PYTHONPATH=os.pathsep.join(path))
    proc = subprocess.Popen(as_background_job([sys.executable, "-c", _HELD_CHILD, url, str(tmp_path / "cache"), endpoint,
                                               str(timeout), str(attempts)]), env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lines: "queue.Queue[str]" = queue.Queue()
    threading.Thread(target=lambda: [lines.put(ln.strip()) for ln in proc.stdout], daemon=True).start()
    try:
        assert lines.get(timeout=60) == "opening"
        for _ in range(400):
            if holding():
                break
            threading.Event().wait(0.05)
        assert holding(), "the open never reached the server"
        proc.send_signal(signal.SIGINT)
        # bounded only against a hang: the held request would end much later (request_timeout)
        assert lines.get(timeout=120) == "interrupted"
        assert lines.get(timeout=120) == "stores 0"
        assert holding(), "the server no longer holds the request"
        proc.stdin.write("\n")
        proc.stdin.flush()
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err


def test_ctrl_c_during_remote_open_is_prompt(silent, tmp_path):
    """SIGINT while open waits on a silent store ends the wait at once, not after every retry
    (10 attempts of 3 s)."""
    _interrupt_held_open("s3://bucket/ds/", silent.endpoint, tmp_path, lambda: bool(silent.conns), 3, 10)


@pytest.mark.parametrize("url", ["s3://bucket/ds/", "s3://bucket/ds/*.bin", "s3://bucket/ds/shard-00000.tfs"],
                         ids=["prefix", "glob", "one-object"])
def test_ctrl_c_does_not_wait_for_the_request_in_flight(silent, tmp_path, url):
    """Ctrl-C during a remote open (the listing of a prefix or a glob, the sizes of an object)
    raises KeyboardInterrupt while the server still holds the request, and freeing the
    interrupted open's store does not wait for that request either."""
    _interrupt_held_open(url, silent.endpoint, tmp_path, lambda: bool(silent.conns))


def test_ctrl_c_during_the_listing_of_a_dataset_directory(moto, bucket, tmp_path):
    """The C core lists a dataset directory of many shards without a catalog (one request for
    their sizes): Ctrl-C while the store holds that listing raises KeyboardInterrupt without
    waiting for it."""
    import numpy as np
    rng = np.random.default_rng(3)
    src = tmp_path / "src"
    with tokenfeed.DatasetWriter(src, vocab_size=50000, shard_tokens=4096) as w:
        w.add_documents([rng.integers(0, 50000, size=1000, dtype=np.uint16) for _ in range(80)])
    assert tokenfeed.open(src).num_files >= 16
    os.remove(src / "tokenfeed.catalog")  # (with it, the open lists nothing)
    moto.upload_dir(bucket, "many", str(src))
    p = FaultProxy(moto.port, stall_seconds=600)
    try:
        p.plan("stall", path_contains="list-type")
        # no trailing slash: the package does not list it first, the core does
        _interrupt_held_open(f"s3://{bucket}/many", p.endpoint, tmp_path, lambda: p.injected.get("stall", 0) > 0)
    finally:
        p.stop()


_EXIT_CHILD = INTERRUPTIBLE + textwrap.dedent("""
    import sys, tokenfeed
    ds = tokenfeed.open(sys.argv[1], cache_dir=sys.argv[2], cache_limit="64MB", endpoint_url=sys.argv[3],
                        chunk_size=64 << 10)
    loader = tokenfeed.Loader(ds, seq_len=128, batch_size=4, seed=9, shuffle="full")
    it = iter(loader)
    next(it)
    print("got", flush=True)
    if sys.argv[4] == "loop":
        for _ in it:
            pass
    # "exit": ends with requests in flight and without loader.close()
""")


@pytest.mark.parametrize("how", ["exit", "exit", "exit", "loop"])
def test_exit_and_ctrl_c_with_requests_in_flight_are_prompt(uploaded, moto, tmp_path, how):
    """A script that ends without close(), or is interrupted in its training loop, while fetch
    threads are inside requests: the process ends promptly (no join of a thread parked by the
    finalizing interpreter)."""
    p = FaultProxy(moto.port, latency=0.5)
    env = dict(os.environ, **TEST_CREDENTIALS, PYTHONPATH=os.path.join(ROOT, "python"))
    proc = subprocess.Popen(as_background_job([sys.executable, "-c", _EXIT_CHILD, uploaded, str(tmp_path / "cache"),
                                               p.endpoint, how]), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "got", proc.stderr.read() if proc.poll() is not None else ""
        if how == "loop":
            proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        p.stop()
    if how == "exit":
        assert proc.returncode == 0, err
    else:
        assert proc.returncode in (-signal.SIGINT, 130, 1) and "KeyboardInterrupt" in err, (proc.returncode, err)


# ---------------------------------------------------------------------------------------
# objects without a usable version: weak ETags, no ETag

from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer  # noqa: E402


class _VersionServer:
    """An http server of one directory whose ETag policy the test chooses: "weak" (W/"..."
    tags and a strict If-Match, as nginx and Apache compare it: any weak tag gets 412) or
    "none" (no ETag header at all). Counts 412 answers."""

    def __init__(self, root, mode):
        self.root, self.mode, self.refused, self.tag = str(root), mode, 0, "1"
        outer = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _serve(self, body):
                p = os.path.join(outer.root, self.path.lstrip("/"))
                if not os.path.isfile(p):
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                etag = f'W/"{outer.tag}"'
                im = self.headers.get("If-Match")
                if im is not None and (im.startswith("W/") or im != etag):
                    outer.refused += 1
                    self.send_response(412)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                with open(p, "rb") as f:
                    data = f.read()
                rng = self.headers.get("Range")
                status, total = 200, len(data)
                if rng:
                    a, b = rng.split("=")[1].split("-")
                    a, b = int(a), min(int(b) if b else total - 1, total - 1)
                    data, status = data[a:b + 1], 206
                self.send_response(status)
                if status == 206:
                    self.send_header("Content-Range", f"bytes {a}-{b}/{total}")
                if outer.mode == "weak":
                    self.send_header("ETag", etag)
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Last-Modified", "Mon, 01 Jan 2024 00:00:00 GMT")
                self.end_headers()
                if body:
                    self.wfile.write(data)

            def do_GET(self):
                self._serve(True)

            def do_HEAD(self):
                self._serve(False)

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.srv.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}"
        self.t = threading.Thread(target=self.srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.t.start()

    def stop(self):
        self.srv.shutdown()
        self.srv.server_close()
        self.t.join(10)


@pytest.mark.parametrize("mode", ["weak", "none"])
def test_objects_without_a_strong_version(tmp_path, mode):
    """Weak ETags are compared weakly (a strict server never sees them in If-Match, so an
    unchanged object stays readable, and a changed one is refused); without an ETag, open
    warns that changes cannot be detected."""
    src = _write(tmp_path)
    shard = sorted(f for f in os.listdir(src) if f.endswith(".tfs"))[0]
    local = tokenfeed.open(src / shard)
    srv = _VersionServer(src, mode)
    try:
        import warnings
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            ds = tokenfeed.open(f"{srv.url}/{shard}", cache_dir=tmp_path / "cache", cache_limit="64MB",
                                chunk_size=64 << 10, max_attempts=2)
        unversioned = [str(x.message) for x in w if "cannot be detected" in str(x.message)]
        assert bool(unversioned) == (mode == "none"), unversioned
        # an object whose changes cannot be seen is not recorded for the node's later opens
        records = [n for n in os.listdir(tmp_path / "cache" / "meta") if n.endswith(".tfmeta")]
        assert bool(records) == (mode == "weak"), records
        assert np.array_equal(ds.tokens(0, 5000), local.tokens(0, 5000))
        assert srv.refused == 0
        if mode == "weak":
            srv.tag = "2"  # rewritten: the weak comparison sees it
            with pytest.raises(OSError) as ei:
                ds.tokens(ds.num_tokens - 5000, ds.num_tokens)
            assert "changed" in str(ei.value)
    finally:
        srv.stop()


def test_stores_are_freed_with_their_datasets(uploaded, moto, tmp_path):
    """Each distinct set of options makes a store (fetch threads, descriptors, a cache process
    slot): freed with its last dataset, so many opens neither pile up threads nor run out of
    cache slots."""
    import gc
    threads0 = len(os.listdir("/proc/self/task"))
    for i in range(300):
        ds = tokenfeed.open(uploaded, cache_dir=tmp_path / "cache", cache_limit=64_000_000 + i,
                            endpoint_url=moto.endpoint, chunk_size=64 << 10, fetch_threads=2,
                            deadline=300.0)  # a loaded machine's moto server answers slowly: not the point here
        del ds
        gc.collect()
    assert len(os.listdir("/proc/self/task")) < threads0 + 8


_CYCLE_CHILD = textwrap.dedent("""
    import gc, sys, time
    import tokenfeed
    url, cache, endpoint = sys.argv[1:4]

    class Holder:
        pass

    for i in range(6):
        ds = tokenfeed.open(url, cache_dir=f"{cache}/{i}", endpoint_url=endpoint, chunk_size=64 << 10)
        it = iter(tokenfeed.Loader(ds, seq_len=64, batch_size=2, seed=1, shuffle="full", output="numpy"))
        next(it)  # the workers go on reading ahead, through the transport
        h = Holder()
        h.self, h.it, h.ds = h, it, ds  # only a cycle keeps the loader alive now
        del h, it, ds
        # every allocation collects: the collection comes in a worker's transport call,
        # while this thread sleeps
        gc.set_threshold(1, 1, 1)
        time.sleep(0.3)
        gc.set_threshold(700, 10, 10)
        gc.collect()
    print("done", flush=True)
""")


def test_loader_collected_on_its_own_worker_thread(uploaded, moto, tmp_path):
    """A loader left in a reference cycle is collected wherever a collection starts, also in
    one of its own worker threads while that thread is in a transport call: the engine and
    the dataset are destroyed on a thread of their own, not under the worker still reading
    them (which joined itself and read freed memory: a segfault)."""
    env = dict(os.environ, **TEST_CREDENTIALS, PYTHONPATH=os.path.join(ROOT, "python"))
    p = subprocess.run([sys.executable, "-c", _CYCLE_CHILD, uploaded, str(tmp_path / "cache"), moto.endpoint],
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.strip() == "done", (p.returncode, p.stderr[-2000:])


def test_block_table_entry_larger_than_a_frame_can_be_is_refused(tmp_path):
    """A block-table entry larger than the zstd bound of its block is corrupt: refused before a
    byte of it is read (a remote shard would otherwise fetch up to its whole token section)."""
    import struct
    if not tokenfeed.build_info()["zstd"]["usable"]:
        pytest.skip("this build has no zstd")  # the test extra cannot provide a C library
    rng = np.random.default_rng(3)
    with tokenfeed.DatasetWriter(tmp_path / "ds", vocab_size=5000, compression="zstd", block_tokens=256) as w:
        w.add_documents([rng.integers(0, 5000, size=3000) for _ in range(20)])
    shard = [f for f in os.listdir(tmp_path / "ds") if f.endswith(".tfs")][0]
    p = tmp_path / "ds" / shard
    data = bytearray(p.read_bytes())
    tokens_bytes, = struct.unpack_from("<Q", data, 56)
    blocks_offset, = struct.unpack_from("<Q", data, 80)
    struct.pack_into("<QQ", data, blocks_offset, 0, tokens_bytes)  # entry 0: the whole section
    p.write_bytes(bytes(data))
    ds = tokenfeed.open(p)
    with pytest.raises(tokenfeed.FormatError) as ei:
        ds.tokens(0, 5)
    assert "entry 0" in str(ei.value) and "at most" in str(ei.value)


_FD_CHILD = textwrap.dedent("""
    import os, resource, sys
    import numpy as np
    import tokenfeed
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    d = sys.argv[1]
    paths = [os.path.join(d, f) for f in sorted(os.listdir(d))]
    ds = tokenfeed.open(paths)
    base = len(os.listdir("/proc/self/fd"))
    for backend in ("pread", "io_uring"):
        loader = tokenfeed.Loader(ds, seq_len=16, batch_size=64, seed=1, shuffle="full", backend=backend,
                                  epochs=1, output="numpy")
        n = sum(1 for _ in loader)
        fds = len(os.listdir("/proc/self/fd"))
        # the process still has descriptors of its own (a checkpoint write, say)
        extra = [open(os.devnull) for _ in range(300)]
        for f in extra:
            f.close()
        loader.close()
        print(backend, n, fds - base, flush=True)
""")


def test_descriptors_bounded_with_thousands_of_shards(tmp_path):
    """5,000 files read by the pread and io_uring backends under `ulimit -n 1024`: at most a
    quarter of the limit stays open, and the process keeps descriptors for its own use."""
    d = tmp_path / "many"
    d.mkdir()
    rng = np.random.default_rng(0)
    for i in range(5000):
        np.save(d / f"part-{i:05d}.npy", rng.integers(0, 1000, size=40, dtype=np.uint16))
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    r = subprocess.run([sys.executable, "-c", _FD_CHILD, str(d)], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    for line in r.stdout.split("\n"):
        if line:
            backend, n, fds = line.split()
            # 1024 / 4 kept open, plus those the reads of a batch hold at once
            assert int(n) > 0 and int(fds) < 512, line


_MAP_CHILD = textwrap.dedent("""
    import os, sys
    import tokenfeed
    d = sys.argv[1]
    paths = [os.path.join(d, f) for f in sorted(os.listdir(d))]
    with open("/proc/self/maps") as f:
        now = sum(1 for _ in f)
    os.environ["TOKENFEED_FAULT_MAP_LIMIT"] = str(now + 40)  # test builds: the limit stands at this
    try:
        tokenfeed.open(paths)
    except OSError as e:
        print(type(e).__name__, e)
""")


def test_more_files_than_the_mapping_limit_is_named(tmp_path):
    """A dataset with more files than vm.max_map_count allows fails at open naming the limit
    and the remedies, not with "MemoryError: cannot map N bytes"."""
    if not tokenfeed.build_info().get("test_hooks", True):
        pytest.skip("needs a test build (TOKENFEED_TEST_HOOKS=1)")
    d = tmp_path / "files"
    d.mkdir()
    for i in range(200):
        np.save(d / f"part-{i:05d}.npy", np.arange(40, dtype=np.uint16))
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    r = subprocess.run([sys.executable, "-c", _MAP_CHILD, str(d)], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout
    assert "vm.max_map_count" in out and "larger shards" in out and "sysctl" in out, out
    assert "MemoryError" not in out
