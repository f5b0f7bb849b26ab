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
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import ROOT

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
    import ctypes, os, sys
    import numpy as np
    import tokenfeed
    from tokenfeed._device import DeviceFeeder, cuda_available

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
        cpu = [{k: v.copy() for k, v in b.items()} for b in tokenfeed.Loader(ds, **kw)]
        feeder = DeviceFeeder("cuda", output="dlpack", slots=3)
        assert feeder.output == "dlpack"
        n = 0
        held = []
        for i, b in enumerate(tokenfeed.Loader(ds, **kw)):
            dev = feeder(b)
            del b  # the host batch may go right away: upload copied it into pinned staging
            assert list(dev) == list(cpu[i])
            for k, t in dev.items():
                assert t.__dlpack_device__() == (2, 0)
                got = host_copy(t)
                assert got.dtype == cpu[i][k].dtype and got.shape == cpu[i][k].shape, k
                assert got.tobytes() == cpu[i][k].tobytes(), (i, k)
            held = [dev]  # the consumer holds the latest batch, as a training step does
            n += 1
        assert n == len(cpu) > 5
        info = feeder.info()
        assert info["uploads"] == n and info["host_pinned"] and info["slots"] == 3
        assert counter("device_syncs") == 0 and counter("stream_syncs") == 0
        assert counter("registers") == 1 and counter("mallocs") == 3  # once, not per batch
        del held, dev, t
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
        try:
            t.__dlpack__(stream=0)
            raise AssertionError("stream=0 accepted")
        except ValueError as e:
            assert "ambiguous" in str(e)
        v = t.__dlpack__(stream=None, max_version=(1, 0))
        assert "dltensor_versioned" in repr(v)
        assert "dltensor" in repr(cap)
        try:
            t.__dlpack__(dl_device=(1, 0))
            raise AssertionError("exported to the CPU")
        except BufferError:
            pass
        # the slot stays in use while any capsule (or a framework tensor made from it) is alive
        del t
        assert ring.info()["in_use"] == 1
        del cap
        assert ring.info()["in_use"] == 1
        del v
        assert ring.info()["in_use"] == 0
        # consumer holding every slot: a clear error, not a hang
        held = [ring.upload([a]), ring.upload([a])]
        try:
            ring.upload([a])
            raise AssertionError("no error with every slot held")
        except RuntimeError as e:
            assert "held by the consumer" in str(e)
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
        try:
            DeviceFeeder("cuda")
            raise AssertionError("no error")
        except RuntimeError as e:
            assert "CUDA" in str(e) and "not available" in str(e), e
        # the CPU path is unaffected
        ds = make_dataset(os.path.join(os.environ["TF_TMP"], "ds"))
        b = next(iter(tokenfeed.Loader(ds, seq_len=32, batch_size=2, output="numpy")))
        assert b["input_ids"].shape == (2, 32)
    """, tmp_path, {"TOKENFEED_CUDART": "/nonexistent/libcudart.so.12"})


def test_device_missing_device_and_bad_index(cuda_double, tmp_path):
    run_py("""
        try:
            DeviceFeeder("cuda:0")
            raise AssertionError("no error")
        except RuntimeError as e:
            assert "CUDA" in str(e) and "no CUDA-capable device" in str(e), e
    """, tmp_path, {"TOKENFEED_CUDART": cuda_double, "CUDA_DOUBLE_DEVICES": "0"})
    run_py("""
        assert tokenfeed.build_info()["cuda"]["usable"] is True
        try:
            DeviceFeeder("cuda:5")
            raise AssertionError("no error")
        except ValueError as e:
            assert "out of range" in str(e) and "2 device(s)" in str(e), e
        from tokenfeed import _core
        try:
            _core.DeviceRing(7, 4096, 2)
            raise AssertionError("no error")
        except ValueError as e:
            assert "device index 7 is out of range" in str(e), e
        assert DeviceFeeder("cuda").device == 1          # LOCAL_RANK
        assert DeviceFeeder("cuda:0").device == 0
    """, tmp_path, {"TOKENFEED_CUDART": cuda_double, "CUDA_DOUBLE_DEVICES": "2", "LOCAL_RANK": "1"})


def test_device_out_of_memory(cuda_double, tmp_path):
    run_py("""
        ds = make_dataset(os.path.join(os.environ["TF_TMP"], "ds"))
        feeder = DeviceFeeder("cuda", output="dlpack")
        loader = tokenfeed.Loader(ds, seq_len=128, batch_size=8, output="numpy")
        try:
            feeder(next(loader))
            raise AssertionError("no error")
        except MemoryError as e:
            assert "out of memory" in str(e) and "lower batch_size" in str(e), e
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
        try:
            feeder(next(loader))
            raise AssertionError("no error")
        except RuntimeError as e:
            assert "CUDA" in str(e) and "cudaMemcpyAsync" in str(e), e
        feeder.close()
        loader.close()
        # the process goes on, on the CPU
        b = next(iter(tokenfeed.Loader(ds, seq_len=32, batch_size=2, output="numpy")))
        assert b["tokens"].shape == (2, 33)
    """, tmp_path, {"TOKENFEED_CUDART": cuda_double, "CUDA_DOUBLE_FAIL": "memcpy_after=2"})


def test_device_string_parsing(monkeypatch):
    from tokenfeed._device import parse_device

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
