"""The device path (CUDA), tested without a GPU through the CUDA runtime test double.

The double (tests/cuda_double/cudart_double.c) implements the runtime entry points on
host memory and is loaded through the same dlopen path as the real libcudart, by
pointing $TOKENFEED_CUDART at it. The runtime is loaded once per process, so every
test that needs a particular runtime (the double, a failing double, none) runs its
body in a fresh Python subprocess. Tests at the end use a real GPU and are skipped
when torch with CUDA is not present.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from conftest import ROOT
from stalled_next import run_stalled

DOUBLE_SRC = os.path.join(ROOT, "tests", "cuda_double", "cudart_double.c")
DOUBLE_BUILT = os.path.join(ROOT, "build", "c", "libcudart_double.so")


@pytest.fixture(scope="session")
def cuda_double(tmp_path_factory) -> str:
    """Path of the double: the Makefile's build if it is current, else compiled here with cc."""
    if os.path.exists(DOUBLE_BUILT) and os.path.getmtime(DOUBLE_BUILT) >= os.path.getmtime(DOUBLE_SRC):
        return DOUBLE_BUILT
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        pytest.skip("no C compiler to build the CUDA runtime double")
    out = str(tmp_path_factory.mktemp("cuda_double") / "libcudart_double.so")
    subprocess.run([cc, "-std=c11", "-O1", "-shared", "-fPIC", "-fvisibility=hidden", "-pthread", "-o", out,
                    DOUBLE_SRC], check=True)
    return out


# Shared by the subprocess bodies: a small dataset, the double's counters, and reading
# device memory back (the double's device memory is host memory).
PRELUDE = textwrap.dedent("""
    import ctypes, os, sys, time
    import numpy as np
    import tokenfeed
    from tokenfeed.device._device import DeviceFeeder, cuda_available

    def make_dataset(path, n_docs=200, vocab=5000, seed=0):
        rng = np.random.default_rng(seed)
        with tokenfeed.DatasetWriter(path, vocab_size=vocab) as w:
            for _ in range(n_docs):
                w.add_document(rng.integers(0, vocab, size=int(rng.integers(1, 300))))
        return tokenfeed.open(path)

    double = None
    if os.environ.get("TOKENFEED_CUDART", "").endswith(".so"):
        double = ctypes.CDLL(os.environ["TOKENFEED_CUDART"])
        double.cuda_double_counter.restype = ctypes.c_longlong

    def counter(name):
        return double.cuda_double_counter(name.encode())

    def host_copy(t):
        t.synchronize()
        shape, strides, isz = np.array(t.shape), np.array(t.strides), t.dtype.itemsize
        extent = int(((shape - 1) * strides).sum() + 1) if shape.all() else 0
        flat = np.frombuffer(ctypes.string_at(t.data_ptr, extent * isz), dtype=t.dtype)
        return np.lib.stride_tricks.as_strided(flat, shape=tuple(shape), strides=tuple(strides * isz)).copy()

    def cpu_batches(ds, n=None, **kw):
        # the CPU loader's batches (copies), all of a finite stream or the first n
        out = []
        with tokenfeed.Loader(ds, **dict(kw, output="numpy")) as l:
            while n is None or len(out) < n:
                b = next(l, None)
                if b is None:
                    break
                out.append({k: v.copy() if isinstance(v, np.ndarray) else v for k, v in b.items()})
        return out

    def assert_same(dev, cpu, where=""):
        # a device batch equals a CPU batch: the same keys in the same order, each array's
        # dtype, shape and bytes on the device, the ints (THD counts) as they are
        assert list(dev) == list(cpu), (where, list(dev), list(cpu))
        for k, t in dev.items():
            if isinstance(cpu[k], np.ndarray):
                assert t.__dlpack_device__()[0] == 2, (where, k)
                got = host_copy(t)
                assert got.dtype == cpu[k].dtype and got.shape == cpu[k].shape, (where, k, got.shape)
                assert got.tobytes() == cpu[k].tobytes(), (where, k)
            else:
                assert t == cpu[k], (where, k, t, cpu[k])

    def raises(exc, fn, *needles):
        # fn() raises exc, with every needle in its message
        try:
            fn()
        except exc as e:
            assert all(n in str(e) for n in needles), e
            return
        raise AssertionError(f"{fn} raised no {exc.__name__}")

    def copied_ahead(loader, n=1):
        # wait (bounded, 10 s) until the loader reports n batches copied ahead of the consumer,
        # so that what the tests count does not depend on how a loaded machine schedules threads
        for _ in range(10000):
            if loader.stats()["device"]["queued"] >= n:
                return True
            time.sleep(0.001)
        return False
""")


def run_py(body: str, tmp_path, env: dict | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_DOUBLE") and k != "TOKENFEED_CUDART"}
    e.update(env or {})
    e["TF_TMP"] = str(tmp_path)
    r = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(body)], env=e, capture_output=True,
                       text=True, timeout=timeout, cwd=str(tmp_path))
    assert r.returncode == 0, f"subprocess failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    return r


def test_device_batches_equal_cpu_batches(cuda_double, tmp_path):
    run_py("""
        ds = make_dataset(os.path.join(os.environ["TF_TMP"], "ds"))
        kw = dict(seq_len=64, batch_size=4, seed=3, position_ids=True, cu_seqlens=True, loss_mask=True,
                  output="numpy", epochs=1)
        cpu = cpu_batches(ds, **kw)
        feeder = DeviceFeeder("cuda", output="dlpack", slots=3)
        assert feeder.output == "dlpack"
        n = 0
        held = []
        for i, b in enumerate(tokenfeed.Loader(ds, **kw)):
            dev = feeder(b)
            del b  # the host batch may go right away: upload copied it into pinned staging
            assert_same(dev, cpu[i], i)
            held = [dev]  # the consumer holds the latest batch, as a training step does
            n += 1
        assert n == len(cpu) > 5
        info = feeder.info()
        assert info["uploads"] == n and info["host_pinned"] and info["slots"] == 3
        assert counter("device_syncs") == 0 and counter("stream_syncs") == 0
        assert counter("registers") == 1 and counter("mallocs") == 3  # once, not per batch
        del held, dev
        feeder.close()
        assert counter("live_allocs") == 0
        print("ok", n)
    """, tmp_path, {"TOKENFEED_CUDART": cuda_double, "CUDA_DOUBLE_DELAY_US": "50"})


def test_device_dlpack_stream_semantics(cuda_double, tmp_path):
    run_py("""
        from tokenfeed import _core
        ring = _core.DeviceRing(0, 4096, 2)
        a = np.arange(100, dtype=np.int32)
        (t,) = ring.upload([a])
        w0 = counter("stream_waits")
        cap = t.__dlpack__()                                 # None: legacy default stream waits
        assert counter("stream_waits") == w0 + 1
        t.__dlpack__(stream=-1)                              # -1: the consumer synchronises itself
        assert counter("stream_waits") == w0 + 1
        t.__dlpack__(stream=2)                               # per-thread default stream
        assert counter("stream_waits") == w0 + 2
        raises(ValueError, lambda: t.__dlpack__(stream=0), "ambiguous")
        v = t.__dlpack__(stream=None, max_version=(1, 0))
        assert "dltensor_versioned" in repr(v)
        assert "dltensor" in repr(cap)
        raises(BufferError, lambda: t.__dlpack__(dl_device=(1, 0)))
        # the slot stays in use while any capsule (or a framework tensor made from it) is alive
        del t
        assert ring.info()["in_use"] == 1
        del cap
        assert ring.info()["in_use"] == 1
        del v
        assert ring.info()["in_use"] == 0
        # consumer holding every slot: a clear error, not a hang
        held = [ring.upload([a]), ring.upload([a])]
        raises(RuntimeError, lambda: ring.upload([a]), "held by the consumer")
        del held
        ring.upload([a])
        # tensors outlive the ring (the loader closed while a batch is alive)
        (t,) = ring.upload([a + 1])
        ring.close()
        assert (host_copy(t) == a + 1).all()
        del t
        assert counter("live_allocs") == 0
        assert counter("device_syncs") == 0
    """, tmp_path, {"TOKENFEED_CUDART": cuda_double})


def test_device_cuda_unavailable_raises_clear_error(tmp_path):
    run_py("""
        ok, why = cuda_available()
        assert not ok and "TOKENFEED_CUDART" in why, why
        info = tokenfeed.build_info()["cuda"]
        assert info["compiled"] is True and info["usable"] is False and "TOKENFEED_CUDART" in info["detail"]
        raises(RuntimeError, lambda: DeviceFeeder("cuda"), "CUDA", "not available")
        # the CPU path is unaffected
        ds = make_dataset(os.path.join(os.environ["TF_TMP"], "ds"))
        b = next(iter(tokenfeed.Loader(ds, seq_len=32, batch_size=2, output="numpy")))
        assert b["input_ids"].shape == (2, 32)
    """, tmp_path, {"TOKENFEED_CUDART": "/nonexistent/libcudart.so.12"})


def test_device_missing_device_and_bad_index(cuda_double, tmp_path):
    run_py("""
        raises(RuntimeError, lambda: DeviceFeeder("cuda:0"), "CUDA", "no CUDA-capable device")
    """, tmp_path, {"TOKENFEED_CUDART": cuda_double, "CUDA_DOUBLE_DEVICES": "0"})
    run_py("""
        assert tokenfeed.build_info()["cuda"]["usable"] is True
        raises(ValueError, lambda: DeviceFeeder("cuda:5"), "out of range", "2 device(s)")
        from tokenfeed import _core
        raises(ValueError, lambda: _core.DeviceRing(7, 4096, 2), "device index 7 is out of range")
        assert DeviceFeeder("cuda").device == 1          # LOCAL_RANK
        assert DeviceFeeder("cuda:0").device == 0
    """, tmp_path, {"TOKENFEED_CUDART": cuda_double, "CUDA_DOUBLE_DEVICES": "2", "LOCAL_RANK": "1"})


def test_device_out_of_memory(cuda_double, tmp_path):
    run_py("""
        ds = make_dataset(os.path.join(os.environ["TF_TMP"], "ds"))
        feeder = DeviceFeeder("cuda", output="dlpack")
        loader = tokenfeed.Loader(ds, seq_len=128, batch_size=8, output="numpy")
        raises(MemoryError, lambda: feeder(next(loader)), "out of memory", "lower batch_size")
        feeder.close()
        loader.close()
        assert counter("live_allocs") == 0 and counter("live_registered") == 0
    """, tmp_path, {"TOKENFEED_CUDART": cuda_double, "CUDA_DOUBLE_MEM": "20000"})


def test_device_cuda_error_mid_run(cuda_double, tmp_path):
    run_py("""
        ds = make_dataset(os.path.join(os.environ["TF_TMP"], "ds"))
        feeder = DeviceFeeder("cuda", output="dlpack")
        loader = tokenfeed.Loader(ds, seq_len=32, batch_size=2, output="numpy")
        feeder(next(loader)); feeder(next(loader))
        raises(RuntimeError, lambda: feeder(next(loader)), "CUDA", "cudaMemcpyAsync")
        feeder.close()
        loader.close()
        # the process goes on, on the CPU
        b = next(iter(tokenfeed.Loader(ds, seq_len=32, batch_size=2, output="numpy")))
        assert b["tokens"].shape == (2, 33)
    """, tmp_path, {"TOKENFEED_CUDART": cuda_double, "CUDA_DOUBLE_FAIL": "memcpy_after=2"})


def test_device_string_parsing(monkeypatch):
    from tokenfeed.device._device import parse_device

    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert parse_device(None) is None and parse_device("cpu") is None
    assert parse_device("cuda") == 0 and parse_device("cuda:3") == 3 and parse_device(2) == 2
    monkeypatch.setenv("LOCAL_RANK", "5")
    assert parse_device("cuda") == 5 and parse_device("CUDA:1") == 1
    for bad in ("gpu", "cuda:x", -1, "cuda:-1"):
        with pytest.raises(ValueError):
            parse_device(bad)


# ------------------------------------------------------------------ real GPU

# skipped by tests/conftest.py when torch.cuda.is_available() is False: the only skip CI allows
needs_gpu = pytest.mark.gpu


@needs_gpu
def test_cuda_real_gpu_batches_equal_cpu(tmp_path):
    run_py("""
        import torch
        ds = make_dataset(os.path.join(os.environ["TF_TMP"], "ds"))
        kw = dict(seq_len=128, batch_size=8, seed=1, position_ids=True, loss_mask=True, output="numpy", epochs=1)
        cpu = [{k: v.copy() for k, v in b.items()} for b in tokenfeed.Loader(ds, **kw)]
        assert cuda_available()[0]
        feeder = DeviceFeeder("cuda:0", output="torch")
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):  # a non-default consumer stream
            for i, b in enumerate(tokenfeed.Loader(ds, **kw)):
                dev = feeder(b)
                for k, t in dev.items():
                    assert t.is_cuda
                    assert torch.equal(t.cpu(), torch.from_numpy(cpu[i][k])), (i, k)
        torch.cuda.synchronize()
        feeder.close()
    """, tmp_path)


def test_loader_device_cuda_yields_device_batches_equal_to_cpu(cuda_double, tmp_path):
    """Loader(device="cuda") end to end through the double: same bytes as the CPU
    path, the index from LOCAL_RANK, and no device-wide synchronisation."""
    run_py("""
        ds = make_dataset(os.path.join(os.environ["TF_TMP"], "ds"))
        cpu = tokenfeed.Loader(ds, seq_len=64, batch_size=4, seed=2, output="numpy", position_ids=True)
        dev = tokenfeed.Loader(ds, seq_len=64, batch_size=4, seed=2, output="numpy", position_ids=True,
                               device="cuda")
        assert dev.device_index == 1            # LOCAL_RANK
        for _ in range(30):
            a, b = next(cpu), next(dev)
            assert set(b) == set(a)
            assert b["input_ids"].__dlpack_device__() == (2, 1)   # kDLCUDA, device 1
            for k in a:
                assert np.array_equal(host_copy(b[k]), a[k]), k
        st = dev.state_dict()
        assert st["position"] == 30 * 4
        dev.close()
        assert counter("device_syncs") == 0
    """, tmp_path, env={"TOKENFEED_CUDART": cuda_double, "CUDA_DOUBLE_DEVICES": "2", "LOCAL_RANK": "1"})


def test_loader_device_takedown_drops_what_was_copied_ahead(cuda_double, tmp_path):
    """exclude() on a device= loader: the engine leaves the documents out, and the batches the
    device stage had copied ahead (which held them) are made again: every later device batch
    equals the CPU loader's with the same takedown, byte for byte."""
    run_py("""
        ds = make_dataset(os.path.join(os.environ["TF_TMP"], "ds"))
        kw = dict(seq_len=64, batch_size=4, seed=2, output="numpy", loss_mask=True)
        cpu = tokenfeed.Loader(ds, **kw)
        dev = tokenfeed.Loader(ds, device="cuda", **kw)
        for _ in range(3):
            a, b = next(cpu), next(dev)
        assert copied_ahead(dev)
        seen = {seg.document for row in cpu.explain(3) for seg in row}
        gone = sorted(seen)[::2]
        cpu.exclude(gone)
        dev.exclude(gone)
        hit = 0
        for k in range(12):
            a, b = next(cpu), next(dev)
            for key in a:
                assert np.array_equal(host_copy(b[key]), a[key]), (k, key)
            hit += int((a["loss_mask"] == 0).sum())
        assert hit
        assert dev.state_dict()["excluded"] == cpu.state_dict()["excluded"] == [[12, 0, gone]]
        dev.close()
    """, tmp_path, env={"TOKENFEED_CUDART": cuda_double, "CUDA_DOUBLE_DEVICES": "1"})


def test_loader_device_cuda_without_cuda_is_a_clear_error(tmp_path):
    run_py("""
        ds = make_dataset(os.path.join(os.environ["TF_TMP"], "ds"))
        try:
            tokenfeed.Loader(ds, seq_len=64, batch_size=4, device="cuda")
        except RuntimeError as e:
            assert "CUDA" in str(e), e
        else:
            raise AssertionError("device='cuda' without CUDA must raise")
        l = tokenfeed.Loader(ds, seq_len=64, batch_size=4, output="numpy")   # CPU path unaffected
        assert next(l)["input_ids"].shape == (4, 64)
    """, tmp_path, env={"TOKENFEED_CUDART": "/nonexistent/libcudart.so.12"})


def test_gpu_feed_benchmark_dry_run(tmp_path):
    """benchmarks/gpu_feed.py without a GPU: arguments, the synthetic data, the three
    loaders' host batches and the GPT-2 model code all run; on a machine without CUDA
    the real run says so instead of failing obscurely."""
    pytest.importorskip("torch")
    script = os.path.join(ROOT, "benchmarks", "gpu_feed.py")
    out = tmp_path / "dry.json"
    r = subprocess.run([sys.executable, script, "--dry-run", "--dry-tokens", "200000", "--seq-lens", "1024,2048",
                        "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    import json

    rep = json.loads(out.read_text())
    assert rep["loaders"] == ["dataloader", "nanogpt", "tokenfeed"]
    assert 120e6 < rep["gpt2_params"] < 130e6  # GPT-2 small
    assert rep["seq_lens"] == [1024, 2048] and rep["batch"] == 8
    r = subprocess.run([sys.executable, script, "--loaders", "tokenfeed,bogus", "--dry-run"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "bogus" in r.stderr
    import torch

    if not torch.cuda.is_available():
        r = subprocess.run([sys.executable, script, "--skip-h2d"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "--dry-run" in r.stderr


# ------------------------------------------------ Loader(device=...): copies issued ahead

def test_loader_device_copies_issued_ahead_of_a_2ms_step(cuda_double, tmp_path):
    """With a consumer that spends 2 ms per step, every batch's copy to the device was
    issued before next() asked for it (copy-at-next gave 0). The copy thread does it on
    its own: before each step the consumer waits, bounded, until the loader reports the
    next copy issued, so the count does not depend on how a loaded machine schedules
    threads; a loader that copied at next() would never report one and fail here."""
    run_py("""
        ds = make_dataset(os.path.join(os.environ["TF_TMP"], "ds"))
        loader = tokenfeed.Loader(ds, seq_len=64, batch_size=4, seed=5, output="numpy", device="cuda",
                                  device_prefetch_batches=2)
        held = None
        it = iter(loader)                                 # a for loop's start: copying begins
        for step in range(100):
            assert copied_ahead(loader), f"no copy issued ahead of step {step}"
            batch = next(it)
            held = batch                                  # the step holds its batch ...
            time.sleep(0.002)                             # ... for 2 ms
        st = loader.stats()["device"]
        assert st["batches"] == 100
        assert st["copies_issued_ahead"] >= 0.95, st
        assert st["issued_ahead"] == 100, st
        assert 100 <= st["copies"] <= 102                # never more than device_prefetch ahead
        assert loader.position == 100 * 4                # what the consumer received, not what was copied
        assert loader.stats()["batches"] > 100           # (the engine handed the copy thread more)
        assert st["wait_p99_seconds"] > 0 and st["wait_mean_seconds"] > 0
        del held, batch
        loader.close()
        assert counter("device_syncs") == 0 and counter("stream_syncs") == 0
    """, tmp_path, {"TOKENFEED_CUDART": cuda_double, "CUDA_DOUBLE_COPY_US": "300"})


def test_loader_device_no_host_copy_no_sync_bytes_equal(cuda_double, tmp_path):
    """Every array of every batch on the device equals the CPU loader's, to the end of
    a finite stream; the engine's workers assembled each batch in page-locked memory
    and the copy read it there: no host memcpy into staging (counted by the loader), no
    pageable source (counted by the double: the real runtime would stage it itself),
    each engine buffer page-locked once, not per batch; and nothing synchronised the
    device or a stream."""
    run_py("""
        ds = make_dataset(os.path.join(os.environ["TF_TMP"], "ds"))
        kw = dict(seq_len=64, batch_size=4, seed=3, position_ids=True, cu_seqlens=True, loss_mask=True,
                  output="numpy", epochs=1)
        cpu = cpu_batches(ds, **kw)
        loader = tokenfeed.Loader(ds, device="cuda", **kw)
        n = 0
        for i, b in enumerate(loader):
            assert_same(b, cpu[i], i)
            n += 1
        assert n == len(cpu) > 20
        st = loader.stats()["device"]
        assert st["batches"] == n and st["copies"] == n
        assert st["staging_copies"] == 0 and st["staging_bytes"] == 0
        assert st["direct_copies"] == n and st["host_pinned"] is True
        assert counter("h2d_pageable") == 0
        assert counter("h2d_pinned") == 5 * n           # one copy per array, each from the engine's buffer
        assert counter("registers") == st["engine_buffers_locked"] <= 16, (counter("registers"), n)
        assert st["h2d_bytes"] > 0 and st["h2d_gbps"] > 0
        assert counter("device_syncs") == 0 and counter("stream_syncs") == 0
        del b
        loader.close()
        assert counter("live_allocs") == 0 and counter("live_registered") == 0
        print("ok", n)
    """, tmp_path, {"TOKENFEED_CUDART": cuda_double, "CUDA_DOUBLE_COPY_US": "100"})


def test_loader_device_state_counts_received_batches_and_resumes_exactly(cuda_double, tmp_path):
    """With copies in flight beyond the consumer, position and state_dict() count the
    batches received; a new device loader restored from that state, the same loader
    restored on the fly, and a CPU loader restored from it all continue the exact
    uninterrupted stream."""
    run_py("""
        import json
        ds = make_dataset(os.path.join(os.environ["TF_TMP"], "ds"))
        kw = dict(seq_len=64, batch_size=4, seed=9, position_ids=True, output="numpy")
        ref = tokenfeed.Loader(ds, **kw)
        expect = [{k: v.copy() for k, v in next(ref).items()} for _ in range(40)]
        def same(b, i):
            return all(np.array_equal(host_copy(t), expect[i][k]) for k, t in b.items())

        a = tokenfeed.Loader(ds, device="cuda", device_prefetch_batches=4, **kw)
        for i in range(13):
            assert same(next(a), i)
        assert copied_ahead(a, 3)                        # copies run ahead of the consumer
        state = json.loads(json.dumps(a.state_dict()))
        assert state["position"] == 13 * 4 == a.position
        assert a.stats()["batches"] > 13                 # the engine did go ahead

        b = tokenfeed.Loader(ds, device="cuda", **kw)     # resume in a fresh device loader
        b.load_state_dict(state)
        assert b.position == 13 * 4
        for i in range(13, 30):
            assert same(next(b), i), i

        for i in range(13, 20):                           # the first loader goes on ...
            assert same(next(a), i)
        a.load_state_dict(state)                          # ... and is sent back with copies in flight
        for i in range(13, 40):
            assert same(next(a), i), i

        c = tokenfeed.Loader(ds, **kw)                    # the state is the same state on the CPU
        c.load_state_dict(state)
        assert np.array_equal(next(c)["tokens"], expect[13]["tokens"])
        for l in (a, b, c):
            l.close()
        assert counter("device_syncs") == 0 and counter("stream_syncs") == 0
    """, tmp_path,
       {"TOKENFEED_CUDART": cuda_double, "CUDA_DOUBLE_COPY_US": "2000"})


def test_loader_device_close_with_copies_in_flight(cuda_double, tmp_path):
    """close() while copies are still running on the copy stream (slow DMA) returns
    once they are done, never frees memory a copy or a held batch still uses, and
    everything is given back when the last batch goes."""
    run_py("""
        ds = make_dataset(os.path.join(os.environ["TF_TMP"], "ds"))
        kw = dict(seq_len=64, batch_size=4, seed=2, output="numpy")
        first = next(tokenfeed.Loader(ds, **kw))["tokens"].copy()
        loader = tokenfeed.Loader(ds, device="cuda", device_prefetch_batches=4, **kw)
        held = next(loader)
        assert copied_ahead(loader, 3)
        raises(RuntimeError, lambda: loader._engine.next(), "DeviceLoader")  # the engine belongs to the copy thread now
        loader.close()                                     # copies of 3+ batches still queued on the DMA
        assert loader.position == 4
        assert counter("bad_frees") == 0
        assert np.array_equal(host_copy(held["tokens"]), first)   # the held batch outlives the loader
        del held
        assert counter("live_allocs") == 0 and counter("live_registered") == 0
        assert counter("device_syncs") == 0 and counter("stream_syncs") == 0
        raises(ValueError, lambda: next(loader))
    """, tmp_path, {"TOKENFEED_CUDART": cuda_double, "CUDA_DOUBLE_COPY_US": "20000"})


INTERRUPTED = textwrap.dedent('''
    import json, os, signal, sys, threading, time
    import numpy as np
    import tokenfeed
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if the run started with SIGINT ignored
    ds = tokenfeed.open(sys.argv[1])
    kw = dict(seq_len=64, batch_size=4, seed=4, output="numpy")
    loader = tokenfeed.Loader(ds, device="cuda", device_prefetch_batches=2, **kw)
    got = 0
    print("running", flush=True)
    try:
        while True:
            b = next(loader)          # the engine is slow, the copies slower: next() waits, copies are in flight
            got += 1
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    state = loader.state_dict()
    t0 = time.monotonic()
    loader.close()                    # stops the copy thread, waits for the copies in flight
    print(json.dumps({"got": got, "position": state["position"], "close_s": time.monotonic() - t0}), flush=True)
    ref = tokenfeed.Loader(ds, **kw)
    ref.load_state_dict(state)
    want = tokenfeed.Loader(ds, **kw)
    for _ in range(state["position"] // 4):
        next(want)
    assert np.array_equal(next(ref)["tokens"], next(want)["tokens"])
    print("resumed", flush=True)
''')


@pytest.mark.test_hooks
def test_loader_device_ctrl_c_with_copies_in_flight(cuda_double, tmp_path):
    """Ctrl-C while next() waits and copies are in flight: KeyboardInterrupt, a state
    that counts exactly the batches received, a close() that does not hang, and a
    resume from that state that continues the stream."""
    ds_dir = tmp_path / "ds"
    run_py(f"make_dataset({str(ds_dir)!r})", tmp_path)
    script = tmp_path / "interrupted.py"
    script.write_text(INTERRUPTED)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_DOUBLE")}
    env.update(TOKENFEED_CUDART=cuda_double, CUDA_DOUBLE_COPY_US="100000", TOKENFEED_FAULT_DELAY_MS="150")
    p = subprocess.Popen([sys.executable, str(script), str(ds_dir)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env)
    assert p.stdout.readline().strip() == "running"
    time.sleep(1.0)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, out + err
    lines = out.split("\n")
    assert lines[0] == "interrupted", out + err
    import json

    res = json.loads(lines[1])
    # the state counts what next() handed out. Python raises a pending KeyboardInterrupt
    # as a call returns, so a SIGINT that lands just as next() returns drops that batch
    # before the script's counter sees it: counted by the state, never duplicated
    assert res["position"] in (4 * res["got"], 4 * (res["got"] + 1)), res
    assert res["close_s"] < 30
    assert lines[2] == "resumed"


@needs_gpu
def test_cuda_real_gpu_loader_device_prefetch(tmp_path):
    """On a real GPU: Loader(device=...) batches equal the CPU batches on a non-default
    torch stream, every copy read page-locked engine memory, and a resume is exact."""
    run_py("""
        import torch
        ds = make_dataset(os.path.join(os.environ["TF_TMP"], "ds"))
        kw = dict(seq_len=128, batch_size=8, seed=1, position_ids=True, loss_mask=True, epochs=1)
        cpu = [{k: v.copy() for k, v in b.items()} for b in tokenfeed.Loader(ds, output="numpy", **kw)]
        loader = tokenfeed.Loader(ds, device="cuda:0", output="torch", **kw)
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            for i, b in enumerate(loader):
                for k, t in b.items():
                    assert t.is_cuda
                    assert torch.equal(t.cpu(), torch.from_numpy(cpu[i][k])), (i, k)
                if i == 5:
                    state = loader.state_dict()
        torch.cuda.synchronize()
        st = loader.stats()["device"]
        assert st["staging_copies"] == 0 and st["direct_copies"] == st["copies"] and st["host_pinned"] is True
        assert state["position"] == 6 * 8
        # input_ids and labels are torch views of tokens; a view alone keeps its batch's slot
        # from being reused, however far the loader runs on
        view_loader = tokenfeed.Loader(ds, device="cuda:0", output="torch", **kw)
        with torch.cuda.stream(s):
            b = next(view_loader)
            t = b["tokens"]
            assert b["input_ids"].data_ptr() == t.data_ptr()
            assert b["labels"].data_ptr() == t.data_ptr() + t.element_size()
            kept = b["labels"]
            del b, t
            for _ in range(12):
                next(view_loader)
        torch.cuda.synchronize()
        assert torch.equal(kept.cpu(), torch.from_numpy(cpu[0]["labels"]))
        del kept
        view_loader.close()
        again = tokenfeed.Loader(ds, device="cuda:0", output="torch", **kw)
        again.load_state_dict(state)
        assert torch.equal(next(again)["tokens"].cpu(), torch.from_numpy(cpu[6]["tokens"]))
        loader.close(); again.close()
    """, tmp_path)


def test_loader_device_errors_keep_the_position(cuda_double, tmp_path):
    """A full GPU is a MemoryError from the first next(); a CUDA failure mid-run is a
    RuntimeError naming the call, after the batches before it, with the position where
    it was; either way close() is clean and the process goes on."""
    run_py("""
        ds = make_dataset(os.path.join(os.environ["TF_TMP"], "ds"))
        loader = tokenfeed.Loader(ds, seq_len=128, batch_size=8, output="numpy", device="cuda")
        raises(MemoryError, lambda: next(loader), "out of memory", "lower batch_size")
        assert loader.position == 0
        loader.close()
        assert counter("live_allocs") == 0 and counter("live_registered") == 0
    """, tmp_path, {"TOKENFEED_CUDART": cuda_double, "CUDA_DOUBLE_MEM": "20000"})
    run_py("""
        ds = make_dataset(os.path.join(os.environ["TF_TMP"], "ds2"))
        loader = tokenfeed.Loader(ds, seq_len=32, batch_size=2, output="numpy", device="cuda")
        got = 0
        try:
            while True:
                next(loader)
                got += 1
        except RuntimeError as e:
            assert "CUDA" in str(e) and "cudaMemcpyAsync" in str(e), e
        assert got == 3 and loader.position == 3 * 2   # memcpy_after=3: batches 0-2 (one array each)
        try:
            next(loader)
            raise AssertionError("no error on retry")
        except RuntimeError:
            assert loader.position == 3 * 2
        loader.close()
        b = next(iter(tokenfeed.Loader(ds, seq_len=32, batch_size=2, output="numpy")))
        assert b["tokens"].shape == (2, 33)
    """, tmp_path, {"TOKENFEED_CUDART": cuda_double, "CUDA_DOUBLE_FAIL": "memcpy_after=3"})


@pytest.mark.test_hooks
@pytest.mark.parametrize("mode", ["sigint", "close"])
def test_loader_device_blocked_next_is_interruptible(cuda_double, tmp_path, mode):
    """Ctrl-C, or close() from another thread, ends a device loader's next() that waits
    on stalled workers, well before the 60 s they are held for; the copy thread and the
    engine stop, and the position has not moved."""
    ds_dir = tmp_path / "ds"
    run_py(f"make_dataset({str(ds_dir)!r})", tmp_path)
    run_stalled(tmp_path, str(ds_dir), mode, {"TOKENFEED_CUDART": cuda_double}, device="cuda")


# ------------------------------------------------ context parallelism on the copy-ahead path

@pytest.mark.parametrize("layout", ["plain", "thd"])
def test_loader_device_cp_batches_copied_ahead(cuda_double, tmp_path, layout):
    """A context-parallel rank's batches (no tokens buffer: input_ids, labels and the
    extras of their own; with cu_seqlens the THD layout, whose counts stay ints) go
    through the copy-ahead stage like any other: byte-identical to the CPU batches to the
    end of the stream; with a consumer that spends 2 ms per step every copy was issued
    before next() asked (the copy thread's progress is waited for, bounded, before each
    step, so the count does not depend on scheduling); read in place from page-locked
    engine buffers, one copy per array; nothing synchronised; and a state saved with
    copies in flight resumes exactly, on the device and on the CPU."""
    extra = "position_ids=True, loss_mask=True" + (", cu_seqlens=True" if layout == "thd" else "")
    run_py(f"""
        import json
        ds = make_dataset(os.path.join(os.environ["TF_TMP"], "ds"))
        kw = dict(seq_len=64, batch_size=4, seed=8, cp_rank=1, cp_size=2, epochs=1, output="numpy", {extra})
        cpu = cpu_batches(ds, **kw)
        loader = tokenfeed.Loader(ds, device="cuda", device_prefetch_batches=2, **kw)
        it = iter(loader)
        n, state = 0, None
        for i in range(len(cpu)):
            assert copied_ahead(loader), f"no copy issued ahead of step {{i}}"
            b = next(it)
            assert "tokens" not in b
            assert_same(b, cpu[i], i)
            time.sleep(0.002)                                  # the step
            n += 1
            if i == 9:
                assert copied_ahead(loader, 2)
                state = json.loads(json.dumps(loader.state_dict()))
        assert next(it, None) is None and n == len(cpu) > 20
        st = loader.stats()["device"]
        assert st["batches"] == st["copies"] == n
        assert st["copies_issued_ahead"] >= 0.95 and st["issued_ahead"] == n, st
        assert st["staging_copies"] == 0 and st["direct_copies"] == n and st["host_pinned"] is True
        arrays = sum(isinstance(v, np.ndarray) for v in cpu[0].values())
        assert arrays == (6 if {layout!r} == "thd" else 4)
        assert counter("h2d_pageable") == 0 and counter("h2d_pinned") == arrays * n
        assert st["h2d_bytes"] == sum(v.nbytes for c in cpu for v in c.values() if isinstance(v, np.ndarray))
        loader.close()

        assert state["position"] == 10 * 4
        again = tokenfeed.Loader(ds, device="cuda", **kw)     # resume on the device ...
        again.load_state_dict(state)
        for i in range(10, 20):
            assert_same(next(again), cpu[i], i)
        again.close()
        host = tokenfeed.Loader(ds, **kw)                     # ... and on the CPU
        host.load_state_dict(state)
        b = next(host)
        assert all(np.array_equal(b[k], cpu[10][k]) for k in b)
        assert counter("device_syncs") == 0 and counter("stream_syncs") == 0
        assert counter("live_allocs") == 0 and counter("live_registered") == 0
    """, tmp_path, {"TOKENFEED_CUDART": cuda_double, "CUDA_DOUBLE_COPY_US": "300"})


# ------------------------------------------------ static buffers (CUDA graphs)

def test_loader_static_buffers_same_tensors_every_step(cuda_double, tmp_path):
    """static_buffers=True: every step yields the same tensor objects at the same device
    addresses, holding that step's batch (equal to the CPU stream); each batch is copied
    into them on the consumer's stream (here the legacy default stream), after making it
    wait on the batch's copy to the device: a step still queued there keeps reading its
    own batch; nothing synchronises the device or a stream; resume is exact."""
    run_py("""
        import json
        ds = make_dataset(os.path.join(os.environ["TF_TMP"], "ds"))
        kw = dict(seq_len=64, batch_size=4, seed=6, position_ids=True, loss_mask=True, output="numpy")
        cpu = cpu_batches(ds, 40, **kw)
        loader = tokenfeed.Loader(ds, device="cuda", static_buffers=True, **kw)
        it = iter(loader)
        first = next(it)
        assert_same(first, cpu[0], 0)
        ptrs = {k: t.data_ptr for k, t in first.items()}
        d2d, waits = counter("d2d"), counter("stream_waits")
        for i in range(1, 20):
            b = next(it)
            assert all(b[k] is first[k] for k in b), i             # the same tensors ...
            assert {k: t.data_ptr for k, t in b.items()} == ptrs   # ... at the same addresses
            assert_same(b, cpu[i], i)
        assert counter("d2d") - d2d == 3 * 19                      # tokens, position_ids, loss_mask
        assert counter("stream_waits") - waits >= 19               # each on its batch's copy

        # A step queued on the consumer's stream that has not run yet (the stream is held)
        # still reads its own batch: the next batch's copy into the buffers waits behind it.
        L = ctypes.c_void_p(1)                                     # the legacy default stream
        tok = first["tokens"]
        seen = ctypes.create_string_buffer(cpu[19]["tokens"].nbytes)
        double.cuda_double_pause(L, 1)
        double.cuda_double_enqueue_read(L, ctypes.c_void_p(tok.data_ptr), ctypes.c_size_t(len(seen)), seen)
        b = next(it)                                               # batch 20, queued behind the read
        double.cuda_double_pause(L, 0)
        double.cuda_double_stream_drain(L)
        assert seen.raw == cpu[19]["tokens"].tobytes()
        assert_same(b, cpu[20], 20)

        state = json.loads(json.dumps(loader.state_dict()))
        assert state["position"] == 21 * 4
        st = loader.stats()["device"]
        assert st["static_buffers"] is True and st["batches"] == 21
        loader.close()
        again = tokenfeed.Loader(ds, device="cuda", static_buffers=True, **kw)
        again.load_state_dict(state)
        for i in range(21, 30):
            assert_same(next(again), cpu[i], i)
        again.close()
        assert counter("device_syncs") == 0 and counter("stream_syncs") == 0
        del first, b, tok
        assert counter("live_allocs") == 0 and counter("bad_frees") == 0
    """, tmp_path, {"TOKENFEED_CUDART": cuda_double, "CUDA_DOUBLE_COPY_US": "100"})


def test_loader_static_buffers_cp_thd(cuda_double, tmp_path):
    """Static buffers for a context-parallel rank in the THD layout: the arrays' lengths
    change from batch to batch, so they are views of the same buffers (same addresses),
    re-made when the length changes; the counts are ints; the bytes are the CPU's."""
    run_py("""
        ds = make_dataset(os.path.join(os.environ["TF_TMP"], "ds"))
        kw = dict(seq_len=64, batch_size=4, seed=2, cp_rank=0, cp_size=2, cu_seqlens=True, position_ids=True,
                  output="numpy")
        cpu = cpu_batches(ds, 25, **kw)
        assert len({c["input_ids"].shape for c in cpu}) > 1        # lengths do change
        loader = tokenfeed.Loader(ds, device="cuda", static_buffers=True, **kw)
        ptrs = None
        for i, b in zip(range(25), loader):
            assert_same(b, cpu[i], i)
            p = {k: t.data_ptr for k, t in b.items() if not isinstance(t, int)}
            assert ptrs is None or p == ptrs, i
            ptrs = p
        loader.close()
        assert counter("device_syncs") == 0 and counter("stream_syncs") == 0
    """, tmp_path, {"TOKENFEED_CUDART": cuda_double})


def test_loader_static_buffers_needs_a_device(tmp_path):
    run_py("""
        ds = make_dataset(os.path.join(os.environ["TF_TMP"], "ds"))
        kw = dict(seq_len=64, batch_size=4)
        raises(ValueError, lambda: tokenfeed.Loader(ds, static_buffers=True, **kw), "needs a device")
        raises(TypeError, lambda: tokenfeed.Loader(ds, static_buffers="yes", **kw), "static_buffers")
    """, tmp_path)


@needs_gpu
def test_cuda_real_gpu_static_buffers_in_a_cuda_graph(tmp_path):
    """On a real GPU: a step captured once in a CUDA graph over the static tensors, then
    replayed after each next(), computes on every batch of the stream."""
    run_py("""
        import torch
        ds = make_dataset(os.path.join(os.environ["TF_TMP"], "ds"))
        kw = dict(seq_len=128, batch_size=8, seed=1, epochs=1)
        cpu = cpu_batches(ds, **kw)
        loader = tokenfeed.Loader(ds, device="cuda:0", output="torch", static_buffers=True, **kw)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            it = iter(loader)
            batch = next(it)
            for _ in range(3):                                     # warm-up, as torch asks
                out = batch["input_ids"].sum(dim=1) + batch["labels"].sum(dim=1)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=s):
                out = batch["input_ids"].sum(dim=1) + batch["labels"].sum(dim=1)
            g.replay()
            sums = [out.clone()]
            for b in it:
                assert b["input_ids"].data_ptr() == batch["input_ids"].data_ptr()
                g.replay()
                sums.append(out.clone())
        torch.cuda.synchronize()
        assert len(sums) == len(cpu)
        for i, c in enumerate(cpu):
            want = torch.from_numpy(c["input_ids"].sum(axis=1) + c["labels"].sum(axis=1))
            assert torch.equal(sums[i].cpu(), want), i
        loader.close()
    """, tmp_path)


@needs_gpu
@pytest.mark.parametrize("layout", ["plain", "thd"])
def test_cuda_real_gpu_context_parallel_batches(layout, tmp_path):
    """On a real GPU: a context-parallel rank's shares (plain and THD), copied ahead into
    slots and into static buffers, equal the CPU shares on a non-default torch stream, and
    a resume on the device is exact."""
    extra = "position_ids=True, loss_mask=True" + (", cu_seqlens=True" if layout == "thd" else "")
    run_py(f"""
        import json, torch
        ds = make_dataset(os.path.join(os.environ["TF_TMP"], "ds"))
        kw = dict(seq_len=64, batch_size=4, seed=8, cp_rank=1, cp_size=2, epochs=1, {extra})
        cpu = cpu_batches(ds, output="numpy", **kw)

        def same(b, c, i):
            assert set(b) == set(c), (i, set(b), set(c))
            for k, v in c.items():
                if isinstance(v, np.ndarray):
                    assert b[k].is_cuda and np.array_equal(b[k].cpu().numpy(), v), (i, k)
                else:
                    assert b[k] == v, (i, k)

        s = torch.cuda.Stream()
        for static in (False, True):
            loader = tokenfeed.Loader(ds, device="cuda:0", output="torch", static_buffers=static, **kw)
            state = None
            with torch.cuda.stream(s):
                for i, b in enumerate(loader):
                    same(b, cpu[i], i)
                    if i == 9:
                        state = json.loads(json.dumps(loader.state_dict()))
            torch.cuda.synchronize()
            assert i + 1 == len(cpu) > 20
            assert loader.stats()["device"]["staging_copies"] == 0
            loader.close()
            again = tokenfeed.Loader(ds, device="cuda:0", output="torch", static_buffers=static, **kw)
            again.load_state_dict(state)
            with torch.cuda.stream(s):
                for i in range(10, 15):
                    same(next(again), cpu[i], i)
            again.close()
    """, tmp_path)


# ------------------------------------------------------------ the meter on the GPU's clock
GPU_METER_PRELUDE = """
    ds = make_dataset(os.path.join(os.environ["TF_TMP"], "ds"))
    double.cudaStreamCreateWithFlags.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
    double.cuda_double_enqueue_kernel.argtypes = [ctypes.c_void_p, ctypes.c_uint]
    handle = ctypes.c_void_p()
    assert double.cudaStreamCreateWithFlags(ctypes.byref(handle), 1) == 0
    S = int(handle.value)                    # the training step's stream

    def step_loop(loader, steps, kernel_us=0, host_sleep=0.0):
        # a training loop: the batch handed over on S, then a "kernel" of kernel_us on S
        dev = loader._get_device()
        for _ in range(steps):
            b = dev._core.next(stream=S)
            if kernel_us:
                double.cuda_double_enqueue_kernel(ctypes.c_void_p(S), kernel_us)
            if host_sleep:
                time.sleep(host_sleep)
            del b
"""


def test_gpu_meter_consumer_stream_ahead_of_the_copies(cuda_double, tmp_path):
    """The stream that trains gets to each hand-off before the batch's copy has run (a
    40 ms copy per batch, no compute on the GPU, a host loop of 5 ms a step): the GPU stands
    still for the copy at every hand-off, which the host's wait in next() cannot see (the
    copy is issued ahead, so next() returns at once). The GPU figure says ~all of the
    GPU's time; the host figure stays below it; the verdict goes by the GPU."""
    run_py(textwrap.dedent(GPU_METER_PRELUDE) + textwrap.dedent("""
        l = tokenfeed.Loader(ds, seq_len=32, batch_size=2, seed=1, device="cuda", output="numpy")
        step_loop(l, 12, host_sleep=0.005)
        double.cuda_double_stream_drain(ctypes.c_void_p(S))
        m = l.meter()
        assert m["gpu_pending"] == 0 and m["gpu_total_batches"] == 12, m
        assert m["gpu_batches"] == 11, m                      # the first batch is start-up
        assert m["gpu_startup_seconds"] > 0.0, m
        # every cycle is at least one 40 ms copy (the copies run one after another)
        assert m["gpu_window_seconds"] >= 11 * 0.040 * 0.99, m
        assert m["gpu_wait_fraction"] > 0.6, m
        assert m["gpu_wait_p50_seconds"] >= 0.020, m
        assert m["wait_fraction"] < m["gpu_wait_fraction"], m
        v = tokenfeed.meter_verdict(m, rank=3)
        assert v.startswith("rank 3's GPU waits") and "GPU's clock" in v, v
        l.close()
    """), tmp_path, {"TOKENFEED_CUDART": cuda_double, "CUDA_DOUBLE_COPY_US": "40000"})


def test_gpu_meter_consumer_stream_behind_the_copies(cuda_double, tmp_path):
    """The stream that trains is busy with each step's compute (50 ms on the GPU) while the
    copies (1 ms) run ahead: at every hand-off the batch is already there and the GPU waits
    ~0, whatever the host loop, which runs ahead of the GPU, waits in next()."""
    run_py(textwrap.dedent(GPU_METER_PRELUDE) + textwrap.dedent("""
        l = tokenfeed.Loader(ds, seq_len=32, batch_size=2, seed=1, device="cuda", output="numpy")
        step_loop(l, 10, kernel_us=50000)
        double.cuda_double_stream_drain(ctypes.c_void_p(S))
        m = l.meter()
        assert m["gpu_pending"] == 0 and m["gpu_batches"] == 9, m
        assert m["gpu_window_seconds"] >= 9 * 0.050 * 0.99, m   # each cycle holds a 50 ms step
        assert m["gpu_wait_fraction"] < 0.2, m
        assert m["gpu_wait_p50_seconds"] < 0.025, m
        assert tokenfeed.meter_verdict(m).startswith("data is not the bottleneck: the GPU waits"), m
        l.close()
    """), tmp_path, {"TOKENFEED_CUDART": cuda_double, "CUDA_DOUBLE_COPY_US": "1000"})


def test_gpu_meter_a_host_slow_elsewhere_is_not_a_wait_for_data(cuda_double, tmp_path):
    """A host loop that spends 30 ms a step outside next() (its own Python, say) leaves the
    GPU idle, but not for data: the batch was there each time the consumer asked. The GPU
    figure counts from the request, so it stays ~0 while the cycles hold the idle time."""
    run_py(textwrap.dedent(GPU_METER_PRELUDE) + textwrap.dedent("""
        l = tokenfeed.Loader(ds, seq_len=32, batch_size=2, seed=1, device="cuda", output="numpy")
        step_loop(l, 8, host_sleep=0.030)
        double.cuda_double_stream_drain(ctypes.c_void_p(S))
        m = l.meter()
        assert m["gpu_batches"] == 7 and m["gpu_window_seconds"] >= 7 * 0.030 * 0.99, m
        assert m["gpu_wait_fraction"] < 0.2, m
        l.close()
    """), tmp_path, {"TOKENFEED_CUDART": cuda_double, "CUDA_DOUBLE_COPY_US": "100"})


def test_gpu_meter_reads_completed_events_only_and_never_waits(cuda_double, tmp_path):
    """The meter reads a hand-off's events once the GPU has run them: while the stream that
    trains is held, its hand-offs are pending and no figure moves; reading the meter waits
    for nothing (no event or stream synchronisation); once the stream runs, every hand-off
    is read. Hand-offs without a stream (TF_DEVICE_STREAM_NONE) are not measured, nor is the
    batch after one (its cycle spans two batches)."""
    run_py(textwrap.dedent(GPU_METER_PRELUDE) + textwrap.dedent("""
        l = tokenfeed.Loader(ds, seq_len=32, batch_size=2, seed=1, device="cuda", output="numpy")
        dev = l._get_device()
        step_loop(l, 3)
        double.cuda_double_stream_drain(ctypes.c_void_p(S))
        before = dev._core.gpu_meter()
        assert before["pending"] == 0 and before["total_batches"] == 3 and before["stopped"] == "", before
        double.cuda_double_pause(ctypes.c_void_p(S), 1)
        step_loop(l, 4)
        syncs = counter("event_syncs") + counter("stream_syncs") + counter("device_syncs")
        held = dev._core.gpu_meter()
        assert held["pending"] == 4 and held["total_batches"] == 3 and held["batches"] == 2, held
        assert counter("event_syncs") + counter("stream_syncs") + counter("device_syncs") == syncs
        double.cuda_double_pause(ctypes.c_void_p(S), 0)
        double.cuda_double_stream_drain(ctypes.c_void_p(S))
        after = dev._core.gpu_meter()
        assert after["pending"] == 0 and after["total_batches"] == 7 and after["batches"] == 6, after
        # a batch taken without a stream: not measured, and the next cycle spans two batches
        b = dev._core.next(); del b
        step_loop(l, 2)
        double.cuda_double_stream_drain(ctypes.c_void_p(S))
        last = dev._core.gpu_meter()
        # the batch after the unmeasured one has its wait but not its cycle: left out too
        assert last["total_batches"] == 8 and last["batches"] == 7, last
        assert dev._core.gpu_meter(3)["batches"] == 3
        l.close()
    """), tmp_path, {"TOKENFEED_CUDART": cuda_double, "CUDA_DOUBLE_COPY_US": "100"})


def test_gpu_meter_counts_the_callers_own_work_for_a_batch(cuda_double, tmp_path):
    """A caller that marks the request and the hand-off itself (as Loader does around its
    Python for a batch) has that work counted as the stream's wait: 30 ms of host work
    between next() and the hand-off mark, with the stream idle, is >= 30 ms of GPU wait per
    batch. A request whose hand-off is never marked leaves that batch unmeasured, and the
    Loader's own iteration marks both on torch's stream when torch drives the GPU."""
    run_py(textwrap.dedent(GPU_METER_PRELUDE) + textwrap.dedent("""
        l = tokenfeed.Loader(ds, seq_len=32, batch_size=2, seed=1, device="cuda", output="numpy")
        core = l._get_device()._core
        for _ in range(6):
            core.gpu_request(S)
            b = core.next(stream=S)
            time.sleep(0.030)                                # the caller's own work for the batch
            core.gpu_handoff(S)
            del b
        double.cuda_double_stream_drain(ctypes.c_void_p(S))
        g = core.gpu_meter()
        assert g["total_batches"] == 6 and g["batches"] == 5 and g["pending"] == 0, g
        assert g["wait_p50_seconds"] >= 0.030 * 0.99 and g["wait_fraction"] > 0.6, g
        core.gpu_request(S); b = core.next(stream=S); del b  # no hand-off mark: not measured
        for _ in range(2):
            b = core.next(stream=S); del b
        double.cuda_double_stream_drain(ctypes.c_void_p(S))
        g2 = core.gpu_meter()
        assert g2["total_batches"] == 7 and g2["batches"] == 6, g2   # that one, and the next one's cycle
        raises(ValueError, lambda: core.gpu_request(0), "ambiguous")
        l.close()
        raises(ValueError, lambda: core.gpu_handoff(S), "closed")
    """), tmp_path, {"TOKENFEED_CUDART": cuda_double, "CUDA_DOUBLE_COPY_US": "100"})


def test_meter_all_ranks_names_the_slowest_rank_by_the_gpu_figure():
    """With every rank's GPU measured, the slowest rank is the one whose GPU waited the
    largest share of its time, even where another rank's host loop waited more; a rank
    without a GPU figure puts the whole comparison back on the host's figure."""
    from tokenfeed.order._explain import _summarize_ranks

    def rank(host, gpu=None):
        m = {"batches": 10, "total_batches": 11, "wait_fraction": host, "wait_p99_seconds": 0.001,
             "startup_seconds": 0.5, "ready_ahead_mean": 1.0, "num_threads": 4, "prefetch": 2}
        if gpu is not None:
            m.update(gpu_batches=10, gpu_wait_fraction=gpu, gpu_wait_p99_seconds=0.01)
        return m

    out = _summarize_ranks([rank(0.50, 0.01), rank(0.05, 0.30), rank(0.10, 0.02)], lambda k: 10 + k)
    assert out["slowest_rank"] == 11 and out["slowest_by"] == "gpu"
    assert out["gpu_wait_fraction_max"] == 0.30 and out["wait_fraction_max"] == 0.50
    assert out["verdict"].startswith("rank 11's GPU waits 30 %")
    mixed = _summarize_ranks([rank(0.50, 0.01), rank(0.05)], lambda k: k)
    assert mixed["slowest_rank"] == 0 and mixed["slowest_by"] == "host" and "gpu_wait_fraction_max" not in mixed


REAL_GPU_METER = """
    import torch
    ds = make_dataset(os.path.join(os.environ["TF_TMP"], "ds"), n_docs=4000)
    s = torch.cuda.current_stream()
    props = torch.cuda.get_device_properties(0)
    clock_khz = getattr(props, "clock_rate", 0) or 1_500_000

    def run(spin_ms, steps=40, **kw):
        # steps of one spin kernel of ~spin_ms, with the test's own events recorded on torch's
        # stream before next() and after it returns; the meter's figures beside the events'
        l = tokenfeed.Loader(ds, seq_len=1024, batch_size=64, seed=1, device="cuda", output="torch", **kw)
        ev = lambda: torch.cuda.Event(enable_timing=True)
        marks = []
        for k in range(steps):
            a = ev(); a.record(s)
            b = next(l)
            z = ev(); z.record(s)
            marks.append((a, z))
            torch.cuda._sleep(int(spin_ms * 1e-3 * clock_khz * 1e3))
            b["tokens"].sum()                       # the step reads its batch
            del b
        torch.cuda.synchronize()
        m = l.meter(steps - 1)
        l.close()
        wait = [a.elapsed_time(z) for a, z in marks[1:]]
        cyc = [marks[i - 1][1].elapsed_time(marks[i][1]) for i in range(1, steps)]
        ref = sum(wait) / sum(cyc)
        print("meter", spin_ms, "ms compute", kw, "host", round(m["wait_fraction"], 4),
              "gpu", round(m["gpu_wait_fraction"], 4), "events", round(ref, 4),
              "gpu_p50_ms", round(1e3 * m["gpu_wait_p50_seconds"], 3),
              "gpu_p99_ms", round(1e3 * m["gpu_wait_p99_seconds"], 3),
              "cycle_ms", round(1e3 * m["gpu_window_seconds"] / max(1, m["gpu_batches"]), 3), flush=True)
        assert m["gpu_batches"] == steps - 1 and m["gpu_pending"] == 0, m
        return m, ref
"""


@needs_gpu
def test_cuda_real_gpu_meter_compute_bound(tmp_path):
    """On a real GPU: a step whose compute (a ~20 ms spin kernel) hides the data. The GPU
    waits ~0, by the meter and by the test's own CUDA events around next(), while the host
    loop, running ahead of the GPU, waits in next() for free device slots."""
    out = run_py(textwrap.dedent(REAL_GPU_METER) + textwrap.dedent("""
        m, ref = run(20)
        assert m["gpu_wait_fraction"] < 0.05 and ref < 0.05, (m, ref)
        assert m["wait_fraction"] > 0.5, m                 # the host's figure says otherwise
    """), tmp_path)
    print(out.stdout)


@needs_gpu
@pytest.mark.test_hooks
def test_cuda_real_gpu_meter_data_bound(tmp_path):
    """On a real GPU: an engine held to one batch per 10 ms (one worker, a test build's
    delay) feeding a step of ~4 ms compute: the GPU stands still ~60 % of its time, and the
    meter's figure agrees with the test's own CUDA events around next()."""
    out = run_py(textwrap.dedent(REAL_GPU_METER) + textwrap.dedent("""
        m, ref = run(4, num_threads=1)
        assert 0.3 < ref < 0.9, (m, ref)
        assert abs(m["gpu_wait_fraction"] - ref) < 0.1, (m, ref)
    """), tmp_path, {"TOKENFEED_FAULT_DELAY_MS": "10"})
    print(out.stdout)
