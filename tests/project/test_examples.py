"""The examples in docs/examples run (briefly), so they cannot rot.

The tiny-GPT checkpoint/resume example is exercised by tests/engine/test_resume_kill.py.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tokenfeed

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(ROOT, "docs", "examples")


def fnv1a(h: int, tokens: np.ndarray) -> int:
    for t in tokens.astype(np.uint64).ravel().tolist():
        h = ((h ^ t) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


@pytest.fixture(scope="module")
def embed_exe(tmp_path_factory) -> str:
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler")
    lib = tokenfeed.get_library()
    if not os.path.exists(lib):
        pytest.skip(f"{lib} is not built")
    exe = str(tmp_path_factory.mktemp("embed") / "embed")
    libdir = os.path.dirname(lib)
    cmd = [cc, "-O1", "-Wall", "-Wextra", "-Werror", "-std=c11", "-I", tokenfeed.get_include(),
           os.path.join(EXAMPLES, "embed.c"), "-L", libdir, "-ltokenfeed", f"-Wl,-rpath,{libdir}", "-o", exe]
    p = subprocess.run(cmd, capture_output=True, text=True)
    assert p.returncode == 0, " ".join(cmd) + "\n" + p.stderr
    return exe


def test_embed_c_matches_python_loader(embed_exe, make_dataset):
    ds = make_dataset(n_docs=300, vocab=50257, shard_tokens=20_000)
    path = os.path.dirname(ds.files()[0]["path"])
    n = 10
    p = subprocess.run([embed_exe, path, str(n)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    m = re.search(r"batches (\d+)\s+checksum ([0-9a-f]{16})\s+position (\d+)", p.stdout)
    assert m, p.stdout
    assert ds.fingerprint in p.stdout
    assert "resume at position 20: same batch" in p.stdout

    # the same configuration from Python gives the same stream, token for token
    loader = tokenfeed.Loader(ds, seq_len=64, batch_size=4, seed=1234, shuffle=True, rank=0, world_size=1,
                              dtype="int32", output="numpy")
    h = 0xCBF29CE484222325
    for _ in range(n):
        h = fnv1a(h, next(loader)["tokens"])
    assert int(m.group(1)) == n
    assert m.group(2) == f"{h:016x}"
    assert int(m.group(3)) == loader.position == 4 * n
    loader.close()


def test_embed_c_reports_errors(embed_exe, tmp_path):
    p = subprocess.run([embed_exe, str(tmp_path / "missing"), "3"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1
    assert "missing" in p.stderr and "tf_dataset_open" in p.stderr
    p = subprocess.run([embed_exe], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "usage" in p.stderr


def test_embed_c_reads_raw_tokens(embed_exe, tmp_path):
    np.arange(5000, dtype=np.uint16).tofile(tmp_path / "tokens.bin")
    p = subprocess.run([embed_exe, str(tmp_path / "tokens.bin"), "2", "uint16"], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    assert "raw" in p.stdout and "5000 tokens" in p.stdout


def test_python_m_tokenfeed():
    p = subprocess.run([sys.executable, "-m", "tokenfeed", "--help"], capture_output=True, text=True)
    assert p.returncode == 0 and "convert" in p.stdout and "inspect" in p.stdout and "verify" in p.stdout


def test_library_loads_beside_the_extension(tmp_path):
    """libtokenfeed.so loads with ctypes in a process that already imported tokenfeed.

    Both copies of the core take their thread-locals from glibc's small static TLS
    surplus (the SIGBUS guard needs an initial-exec variable); the per-thread message
    buffers live on the heap so that two copies fit. The C library's error detail
    works from a thread of its own too.
    """
    code = textwrap.dedent("""
        import ctypes, sys, threading
        import tokenfeed
        lib = ctypes.CDLL(tokenfeed.get_library())
        lib.tf_version.restype = ctypes.c_char_p
        lib.tf_last_error.restype = ctypes.c_char_p
        lib.tf_strerror.restype = ctypes.c_char_p
        lib.tf_dataset_open.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
        out = {}
        def run():
            ds = ctypes.c_void_p()
            rc = lib.tf_dataset_open(sys.argv[1].encode(), None, ctypes.byref(ds))
            out["rc"], out["err"], out["str"] = rc, lib.tf_last_error(), lib.tf_strerror(2)
        t = threading.Thread(target=run); t.start(); t.join()
        print(lib.tf_version().decode(), out["rc"], out["str"].decode(), out["err"].decode(), sep="|")
    """)
    missing = str(tmp_path / "no-such-dataset")
    p = subprocess.run([sys.executable, "-c", code, missing], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    version, rc, strerr, detail = p.stdout.strip().split("|", 3)
    assert version == tokenfeed.__version__
    assert int(rc) < 0
    assert strerr == "No such file or directory"
    assert "no-such-dataset" in detail
