"""Faults: files truncated or replaced while mapped, read errors
and short reads from the pread and io_uring backends, and a writer killed with
SIGKILL. Each risky body runs in a subprocess, so a SIGBUS that escapes the guard
(or any crash) fails the test instead of killing pytest.

Pinned-memory failure (cudaHostRegister refused → pageable fallback) is covered
by tests/c/test_device.c (case_pageable_fallback, CUDA test double); a training
process killed and resumed by tests/engine/test_resume_kill.py. See docs/reliability.md,
"Faults"."""
from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import tokenfeed

from conftest import HERE

IO_URING = bool(tokenfeed.build_info().get("io_uring", {}).get("usable"))
BACKENDS = ["mmap", "pread"] + (["io_uring"] if IO_URING else [])

PRELUDE = """
import errno, os, sys
import numpy as np
import tokenfeed

def write(root, comp=None, n_docs=400, seed=0, overwrite=False):
    rng = np.random.default_rng(seed)
    with tokenfeed.DatasetWriter(root, vocab_size=50000, compression=comp, block_tokens=4096,
                                 shard_tokens=1 << 28, overwrite=overwrite) as w:
        for _ in range(n_docs):
            w.add_document(rng.integers(0, 50000, size=2000))

def batches(ds, n, **kw):
    kw.setdefault("num_threads", 2)
    with tokenfeed.Loader(ds, seq_len=1023, batch_size=4, seed=3, output="numpy", position_ids=True, **kw) as l:
        return [next(l)["tokens"].copy() for _ in range(n)]
"""


def run_py(body: str, *args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    e = dict(os.environ)
    e.pop("TOKENFEED_BACKEND", None)
    if env:
        e.update(env)
    code = PRELUDE + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout,
                          env=e, cwd=HERE)


def check(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 0, f"exit {r.returncode} (signal {-r.returncode if r.returncode < 0 else 0})\n" \
                              f"stdout:\n{r.stdout}\nstderr:\n{r.stderr[-3000:]}"
    assert "DONE" in r.stdout, r.stdout
    return r.stdout


# --------------------------------------------------------------------------- #
# a shard truncated while mapped and being read                               #
# --------------------------------------------------------------------------- #

TRUNCATE = """
root, backend, comp = sys.argv[1], sys.argv[2], sys.argv[3]
write(root, None if comp == "none" else comp)
ds = tokenfeed.open(root)
shard = ds.files()[0]["path"]
l = tokenfeed.Loader(ds, seq_len=1023, batch_size=4, seed=3, output="numpy", position_ids=True,
                     backend=backend, num_threads=2)
next(l)
os.truncate(shard, 8192)  # header + one page of tokens are left
try:
    for _ in range(200):
        next(l)
    print("NO ERROR from the loader")
    sys.exit(1)
except OSError as e:
    print("LOADER", e.errno, "|", e)
l.close()
for what, fn in (("READ", lambda: ds._core.read(ds.num_tokens - 10, 10)),
                 ("DOCUMENT", lambda: ds.find_document(ds.num_tokens - 1)),
                 ("VERIFY", lambda: ds.verify(progress=False))):
    try:
        fn()
        print("NO ERROR from", what)
    except OSError as e:
        print(what, e.errno, "|", e)
print("DONE")
"""


@pytest.mark.parametrize("comp", ["none", "zstd"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_shard_truncated_while_mapped(tmp_path, backend, comp):
    root = tmp_path / "ds"
    out = check(run_py(TRUNCATE, str(root), backend, comp))
    lines = {ln.split(" ", 1)[0]: ln for ln in out.splitlines()}
    for what in ("LOADER", "READ", "DOCUMENT", "VERIFY"):
        assert what in lines, out
        ln = lines[what]
        assert ln.split()[1] == "5", ln  # errno EIO
        assert str(root) in ln and ".tfs" in ln, ln  # names the shard
    # the mapped readers say what happened; pread/io_uring see the end of file
    for what in ("READ", "DOCUMENT", "VERIFY"):
        assert "changed while mapped" in lines[what], out
    # (pread/io_uring: whichever comes first, the document index walk of
    # position_ids through the mapping, or the read past the new end of file)
    if backend == "mmap" or comp == "zstd":
        assert "changed while mapped" in lines["LOADER"], out
    else:
        assert "changed while mapped" in lines["LOADER"] or "truncated while in use" in lines["LOADER"], out


# faulthandler over tokenfeed's SIGBUS handler: enabled after it (PyTorch's elastic @record
# does, which torchtitan's trainer runs under), it restores ours on a fault and raises the
# signal again; enabled before it (pytest does) then disabled and enabled again (as a framework
# may), it restores the default it found, taking ours away until the guard puts it back.
FAULTHANDLER = {
    "after": ("", "faulthandler.enable()"),
    "toggled": ("faulthandler.enable()", "faulthandler.disable(); faulthandler.enable()"),
}


@pytest.mark.parametrize("how", sorted(FAULTHANDLER))
def test_truncated_while_mapped_under_python_faulthandler(tmp_path, how):
    """Whichever way faulthandler sits over the guard, the read of a shard truncated while
    mapped is an error naming the shard, not the end of the process."""
    before, after = FAULTHANDLER[how]
    body = f"""
import faulthandler
{before}
root = sys.argv[1]
write(root, None)
ds = tokenfeed.open(root)
shard = ds.files()[0]["path"]
ds._core.read(0, 10)           # the guard is installed with the first mapping
{after}
os.truncate(shard, 8192)
try:
    ds._core.read(ds.num_tokens - 10, 10)
    print("NO ERROR")
except OSError as e:
    print("READ", e.errno, "|", e)
print("DONE")
"""
    out = check(run_py(body, str(tmp_path / "ds")))
    assert "READ 5 |" in out and "changed while mapped" in out, out


def test_truncated_file_of_a_foreign_format(tmp_path):
    """A headerless token file (nanoGPT style) truncated under a packing loader
    (document index = whole file) and under Dataset reads."""
    body = """
    p = sys.argv[1]
    np.arange(1 << 20, dtype=np.uint16).tofile(p)
    ds = tokenfeed.open(p, dtype="uint16")
    l = tokenfeed.Loader(ds, seq_len=255, batch_size=8, output="numpy", backend="mmap", loss_mask=True)
    first = next(l)["tokens"].copy()
    os.truncate(p, 4096)
    try:
        for _ in range(200):
            next(l)
        print("NO ERROR")
    except OSError as e:
        assert e.errno == errno.EIO and p in str(e), e
        print("LOADER OK")
    l.close()
    del l
    print("DONE")
    """
    out = check(run_py(body, str(tmp_path / "train.bin")))
    assert "LOADER OK" in out


# --------------------------------------------------------------------------- #
# a shard replaced (renamed over) while mapped                                #
# --------------------------------------------------------------------------- #

REPLACE = """
a, b, backend = sys.argv[1], sys.argv[2], sys.argv[3]
write(a, seed=0)
write(b, seed=1)
ref = batches(tokenfeed.open(a), 30, backend=backend)
ds = tokenfeed.open(a)
fp = ds.fingerprint
with tokenfeed.Loader(ds, seq_len=1023, batch_size=4, seed=3, output="numpy", position_ids=True,
                      backend=backend, num_threads=2) as l:
    got = [next(l)["tokens"].copy() for _ in range(5)]
    shard_a = ds.files()[0]["path"]
    shard_b = tokenfeed.open(b).files()[0]["path"]
    os.rename(shard_b, shard_a)  # a different file now has the old name
    got += [next(l)["tokens"].copy() for _ in range(25)]
assert all(np.array_equal(x, y) for x, y in zip(ref, got)), "the old mapping stopped serving the old bytes"
print("OLD BYTES")
try:
    ds2 = tokenfeed.open(a)
    print("REOPENED", ds2.fingerprint != fp)
except tokenfeed.FormatError as e:
    print("REFUSED", e)
print("DONE")
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_shard_replaced_while_mapped(tmp_path, backend):
    out = check(run_py(REPLACE, str(tmp_path / "a"), str(tmp_path / "b"), backend))
    assert "OLD BYTES" in out
    # the manifest still names the old shard's checksums: a re-open refuses the
    # new file, or (if the manifest was replaced too) sees a new fingerprint
    assert "REFUSED" in out or "REOPENED True" in out, out


# --------------------------------------------------------------------------- #
# a shard of several renamed over: descriptors are opened by path             #
# --------------------------------------------------------------------------- #

RENAMED = """
import resource
a, b, backend, when, other = sys.argv[1:6]
if when == "reopen":  # a quarter of the limit: 8 descriptors, so the reader closes and reopens shards
    resource.setrlimit(resource.RLIMIT_NOFILE, (32, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
os.makedirs(a)
os.makedirs(b)
n = 20 if when == "reopen" else 6
for i in range(n):  # shard i holds 1000 * i + [0, 1000); the other set 40000 and up
    np.save(os.path.join(a, f"s{i:02d}.npy"), np.arange(1000, dtype=np.uint16) + 1000 * i)
    size = 1000 if other == "same" else 1500
    np.save(os.path.join(b, f"s{i:02d}.npy"), np.arange(size, dtype=np.uint16) + 40000 + i)
ds = tokenfeed.open(os.path.join(a, "*.npy"))
victim = os.path.join(a, "s03.npy")
l = tokenfeed.Loader(ds, seq_len=99, batch_size=4, shuffle=False, output="numpy", backend=backend, num_threads=2)
got = [next(l)["tokens"].copy()]
if when == "reopen":
    for _ in range(30):  # through every shard: shard 3's descriptor is closed by now
        got.append(next(l)["tokens"].copy())
os.rename(os.path.join(b, "s03.npy"), victim)
try:
    for _ in range(60):
        got.append(next(l)["tokens"].copy())
    print("NO ERROR")
except tokenfeed.FormatError as e:
    print("FORMAT", e)
except OSError as e:
    print("OSERROR", e.errno, e)
wrong = np.concatenate(got)
print("OTHER", int((wrong >= 40000).sum()))
print("DONE")
"""


@pytest.mark.parametrize("other", ["same", "larger"])
@pytest.mark.parametrize("when", ["first", "reopen"])
@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "mmap"])
def test_shard_renamed_over_is_not_read_by_path(tmp_path, backend, when, other):
    """pread and io_uring open each file of a dataset of several by its path: a file of
    another set renamed over shard 3 after the open (same size or larger; before its first
    read, or after the reader closed its descriptor) is a FormatError naming the shard and
    saying to open the dataset again, never the other file's tokens."""
    out = check(run_py(RENAMED, str(tmp_path / "a"), str(tmp_path / "b"), backend, when, other))
    assert "OTHER 0" in out, out
    line = next(ln for ln in out.splitlines() if ln.startswith(("FORMAT", "OSERROR", "NO ERROR")))
    assert line.startswith("FORMAT"), out
    assert str(tmp_path / "a" / "s03.npy") in line and "open the dataset again" in line, line


# --------------------------------------------------------------------------- #
# a file cut inside the page a read ends in                                   #
# --------------------------------------------------------------------------- #

CUT = """
backend, kind, path = sys.argv[1], sys.argv[2], sys.argv[3]
if kind == "small":  # 260 tokens, all in one page: cut to its header
    np.save(path, np.arange(1, 261, dtype=np.uint16))
    ds, cut, L = tokenfeed.open(path), 128, 63
else:  # 256 KiB of uint32 (never 0): cut 100 bytes into a page, read in order
    (np.arange(1 << 16, dtype=np.uint32) % 50000 + 1).astype(np.uint32).tofile(path)
    ds, cut, L = tokenfeed.open(path, dtype="uint32"), (1 << 17) + 100, 63
l = tokenfeed.Loader(ds, seq_len=L, batch_size=1, shuffle=False, output="numpy", backend=backend,
                     num_threads=1, prefetch=1)
next(l)
os.truncate(path, cut)
zeros = 0
try:
    for _ in range(3000):
        zeros += int((next(l)["tokens"] == 0).sum())
    print("NO ERROR")
except OSError as e:
    print("ERROR", e.errno, "|", e)
print("ZEROS", zeros)
print("DONE")
"""


@pytest.mark.parametrize("kind", ["small", "large"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_file_cut_inside_a_page_gives_eio(tmp_path, backend, kind):
    """A mapping reads the part of a page past a file's new end as zeros, without the bus
    error that pages wholly past it raise: a small file cut to its header, or a large one cut
    inside a page, gives EIO naming the file, never a zero token (the data holds none)."""
    path = tmp_path / ("x.npy" if kind == "small" else "x.bin")
    out = check(run_py(CUT, backend, kind, str(path)))
    assert "ZEROS 0" in out, out
    line = next(ln for ln in out.splitlines() if ln.startswith(("ERROR", "NO ERROR")))
    assert line.startswith("ERROR 5") and str(path) in line, out


# --------------------------------------------------------------------------- #
# more files in a batch than descriptors                                      #
# --------------------------------------------------------------------------- #

MANY_FILES = """
import resource
d = sys.argv[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
ds = tokenfeed.open(os.path.join(d, "*.npy"))
base = len(os.listdir("/proc/self/fd"))
ref = None
for backend in sys.argv[2:]:
    with tokenfeed.Loader(ds, seq_len=2047, batch_size=8, num_threads=4, seed=1, backend=backend,
                          output="numpy") as l:
        got = [next(l)["tokens"].copy() for _ in range(6)]
        fds = len(os.listdir("/proc/self/fd")) - base
    ref = ref if ref is not None else got
    same = all(np.array_equal(x, y) for x, y in zip(ref, got))
    print(backend, "same" if same else "DIFFERENT", fds)
print("DONE")
"""


def test_more_files_in_a_batch_than_descriptors(tmp_path):
    """A batch of 4 threads x 8 rows x 2048 tokens over 2,000 per-document files (about 40
    tokens each) touches more files than `ulimit -n 256` leaves descriptors: pread and
    io_uring keep at most a quarter of the limit open over all their threads (besides a
    ring each), waiting for one another's reads rather than failing with EMFILE, and read
    what mmap reads."""
    d = tmp_path / "docs"
    d.mkdir()
    rng = np.random.default_rng(0)
    for i in range(2000):
        np.save(d / f"doc-{i:05d}.npy", rng.integers(1, 1000, size=int(rng.integers(20, 60)), dtype=np.uint16))
    out = check(run_py(MANY_FILES, str(d), *BACKENDS, timeout=300))
    for backend in BACKENDS:
        line = next(ln for ln in out.splitlines() if ln.startswith(backend + " "))
        _, same, fds = line.split()
        assert same == "same" and int(fds) <= 256 // 4 + 4, out


# --------------------------------------------------------------------------- #
# read errors and short reads: pread and io_uring                             #
# --------------------------------------------------------------------------- #

INJECT = """
root, backend, expect = sys.argv[1], sys.argv[2], sys.argv[3]
ds = tokenfeed.open(root)
ref = [np.load(os.path.join(root, "..", f"ref{i}.npy")) for i in range(12)]
got, errs = [], []
with tokenfeed.Loader(ds, seq_len=1023, batch_size=4, seed=3, output="numpy", position_ids=True,
                      backend=backend, num_threads=2) as l:
    while len(got) < 12:
        try:
            got.append(next(l)["tokens"].copy())
        except OSError as e:
            errs.append(e)
            if len(errs) > 3:
                raise
    st = l.stats()
assert all(np.array_equal(x, y) for x, y in zip(ref, got)), "wrong bytes delivered"
for e in errs:
    print("ERR", e.errno, "|", e)
print("BACKEND", st.get("backend"))
print("DONE")
"""


@pytest.fixture(scope="module")
def inject_data(tmp_path_factory):
    """One dataset and its reference stream (12 batches, mmap backend)."""
    root = tmp_path_factory.mktemp("inject")
    r = run_py("""
    write(sys.argv[1])
    for i, b in enumerate(batches(tokenfeed.open(sys.argv[1]), 12, backend="mmap")):
        np.save(os.path.join(sys.argv[1], "..", f"ref{i}.npy"), b)
    print("DONE")
    """, str(root / "ds"))
    check(r)
    return root / "ds"


@pytest.mark.test_hooks
@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "mmap"])
@pytest.mark.parametrize("mode", ["eio", "short", "eof"])
def test_injected_read_faults(inject_data, backend, mode):
    """$TOKENFEED_FAULT_READ fails / shortens / ends the 3rd read completion: EIO
    naming the file (the retry of the batch then delivers the right bytes), or for
    a short read the rest is read again; never a wrong byte."""
    out = check(run_py(INJECT, str(inject_data), backend, mode, env={"TOKENFEED_FAULT_READ": f"{mode}:3"}))
    errs = [ln for ln in out.splitlines() if ln.startswith("ERR")]
    if mode == "short":
        assert errs == [], out
    else:
        assert len(errs) == 1, out
        assert errs[0].split()[1] == "5" and ".tfs" in errs[0] and str(inject_data) in errs[0], errs[0]
    if backend == "io_uring":
        assert "BACKEND io_uring" in out, out  # the ring was used, not a fallback


@pytest.fixture(scope="module")
def eio_shim(tmp_path_factory):
    cc = shutil.which(os.environ.get("CC", "cc"))
    if not cc:
        pytest.skip("no C compiler to build the LD_PRELOAD shim")
    out = tmp_path_factory.mktemp("shim") / "eio_shim.so"
    r = subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(out), os.path.join(HERE, "faults", "eio_shim.c"),
                        "-ldl"], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot build the shim: {r.stderr[-500:]}")
    return str(out)


@pytest.mark.parametrize("mode,count", [("eio", 1), ("eio", 1000), ("short", 50)])
def test_pread_eio_from_the_kernel_side(inject_data, eio_shim, mode, count):
    """An LD_PRELOAD shim makes pread() on the shard return EIO (once, or every
    time) or short counts: OSError(EIO) naming the shard, a retry succeeds once the
    disk recovers, short reads are completed; never a wrong byte."""
    env = {"EIO_SHIM_MATCH": ".tfs", "EIO_SHIM_NTH": "2", "EIO_SHIM_COUNT": str(count), "EIO_SHIM_MODE": mode}
    preload = os.environ.get("LD_PRELOAD", "")
    env["LD_PRELOAD"] = f"{preload} {eio_shim}".strip()
    r = run_py(INJECT, str(inject_data), "pread", mode, env=env)
    if mode == "eio" and count == 1000:
        # a disk that never recovers: next() keeps raising, never returns bytes
        assert r.returncode != 0 and "OSError" in r.stderr and "Input/output error" in r.stderr, r.stderr[-2000:]
        assert ".tfs" in r.stderr
        return
    out = check(r)
    errs = [ln for ln in out.splitlines() if ln.startswith("ERR")]
    if mode == "short":
        assert errs == [], out
    else:
        assert len(errs) == 1 and errs[0].split()[1] == "5" and ".tfs" in errs[0], out


# --------------------------------------------------------------------------- #
# the writer killed with SIGKILL at random points                             #
# --------------------------------------------------------------------------- #

WRITER = """
root, seed, overwrite = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
rng = np.random.default_rng(seed)
docs = [rng.integers(0, 50000, size=int(n)) for n in rng.integers(1, 6000, size=1500)]
print("START", flush=True)
with tokenfeed.DatasetWriter(root, vocab_size=50000, shard_tokens=400_000, overwrite=overwrite) as w:
    for d in docs:
        w.add_document(d)
print("DONE", flush=True)
"""


def _writer(root, seed, overwrite):
    e = dict(os.environ)
    return subprocess.Popen([sys.executable, "-c", PRELUDE + textwrap.dedent(WRITER), str(root), str(seed),
                             "1" if overwrite else "0"], stdout=subprocess.PIPE, text=True, env=e, cwd=HERE)


def _write_full(root, seed, overwrite):
    """Write to completion: (fingerprint, seconds from START to exit)."""
    p = _writer(root, seed, overwrite)
    assert p.stdout.readline().startswith("START")
    t0 = time.monotonic()
    out, _ = p.communicate(timeout=120)
    took = time.monotonic() - t0
    assert p.returncode == 0 and "DONE" in out
    return tokenfeed.open(root).fingerprint, took


def _kill_at_random(root, seed, overwrite, delay):
    p = _writer(root, seed, overwrite)
    assert p.stdout.readline().startswith("START")
    time.sleep(delay)
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=60)
    p.stdout.close()
    return p.returncode


def _state(root):
    try:
        ds = tokenfeed.open(root)
    except tokenfeed.FormatError as e:
        return "refused", str(e)
    ds.verify(progress=False)  # whatever opens is complete: every checksum holds
    return "opens", ds.fingerprint


def test_writer_sigkill_keeps_previous_or_new_dataset(tmp_path):
    """overwrite=True over a complete dataset, SIGKILL after a random delay, 20
    times: what is on disk opens as the previous dataset or the new one (and
    verifies), never a partial one; with no previous dataset it opens complete
    or is refused."""
    new_fp, duration = _write_full(tmp_path / "new_alone", 2, False)
    rng = random.Random(1234)
    root = tmp_path / "ds"
    old_fp, _ = _write_full(root, 1, False)
    seen = {"old": 0, "new": 0, "refused": 0}
    for i in range(20):
        delay = rng.uniform(0, duration)
        rc = _kill_at_random(root, 2, True, delay)
        kind, v = _state(root)
        assert kind == "opens", f"run {i} (delay {delay:.3f}s, rc {rc}): refused a previously complete dataset: {v}"
        assert v in (old_fp, new_fp), f"run {i}: fingerprint {v} is neither the old nor the new dataset"
        seen["old" if v == old_fp else "new"] += 1
        if v == new_fp:  # put the old one back for the next round
            _write_full(root, 1, True)
    # no previous dataset
    for i in range(10):
        fresh = tmp_path / f"fresh{i}"
        delay = rng.uniform(0, duration)
        _kill_at_random(fresh, 2, False, delay)
        kind, v = _state(fresh) if fresh.exists() else ("refused", "no directory")
        if kind == "opens":
            assert v == new_fp, f"fresh run {i}: a partial dataset opened"
        seen[kind if kind == "refused" else "new"] += 1
    print("outcomes:", seen)
