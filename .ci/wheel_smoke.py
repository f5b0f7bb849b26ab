"""Smoke test of an installed tokenfeed wheel (run by .ci/wheel_smoke.sh in a
fresh virtual environment that has nothing but the wheel and numpy).

Checks that the wheel is self-contained: zstd and io_uring are compiled in and
usable from the copies bundled in tokenfeed.libs (not from system libraries),
no test hook is compiled in, a dataset round-trips through zstd, the Loader
gives the same batches from the mmap and io_uring backends and from compressed
data, and a C program builds and runs against the wheel's libtokenfeed.so and
header (docs/examples/embed.c) with the same stream as Python, the library being
libtokenfeed.so.MAJOR (its soname) with a linker script libtokenfeed.so for -ltokenfeed.

Usage: python wheel_smoke.py REPO_ROOT   (prints one line per check, then a
"N passed, N failed" line; exit status 1 if any check failed)
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import traceback
import warnings

warnings.simplefilter("error")  # a wheel must import without any warning (e.g. "built without zstd")

import numpy as np  # noqa: E402

import tokenfeed  # noqa: E402

REPO = os.path.abspath(sys.argv[1])
PKG = os.path.dirname(os.path.abspath(tokenfeed.__file__))
LIBS = os.path.realpath(os.path.join(PKG, "..", "tokenfeed.libs"))
TMP = tempfile.mkdtemp(prefix="tokenfeed-wheel-smoke-")
KW = dict(seq_len=128, batch_size=4, seed=7, output="numpy", position_ids=True)
checks = []


def check(fn):
    checks.append(fn)
    return fn


def write(path: str, compression=None) -> tokenfeed.Dataset:
    rng = np.random.default_rng(0)
    # compressed blocks sized for the short samples read here (64-128 tokens), so that a full
    # shuffle decodes little more than it delivers and no PerformanceWarning is due
    block = {"block_tokens": 128} if compression else {}
    with tokenfeed.DatasetWriter(path, vocab_size=50257, compression=compression, shard_tokens=40_000, **block) as w:
        for _ in range(400):
            w.add_document(rng.integers(0, 50257, size=int(rng.integers(1, 600))))
    return tokenfeed.open(path)


def batches(ds, n=20, **kw):
    with tokenfeed.Loader(ds, **KW, **kw) as loader:
        out = [{k: v.copy() for k, v in next(loader).items()} for _ in range(n)]
        return out, loader.stats()


def same(a, b) -> bool:
    return len(a) == len(b) and all(x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)
                                    for x, y in zip(a, b))


@check
def installed_from_the_wheel():
    assert PKG != os.path.join(REPO, "python", "tokenfeed") and "site-packages" in PKG, \
        f"tokenfeed imported from {PKG}, not from the installed wheel"
    assert os.path.isdir(LIBS), f"no {LIBS}: the wheel was not repaired by auditwheel"


@check
def build_info_reports_bundled_features():
    info = tokenfeed.build_info()
    for name in ("zstd", "io_uring"):
        assert info[name]["compiled"] and info[name]["usable"], (name, info[name])
    assert info["test_hooks"] is False, "a wheel must not carry the test hooks"
    assert info["version"] == tokenfeed.__version__


@check
def libraries_resolve_to_the_bundled_copies():
    for so in (tokenfeed._core.__file__, tokenfeed.get_library()):
        out = subprocess.run(["ldd", so], capture_output=True, text=True, check=True).stdout
        for lib in ("libzstd", "liburing"):
            line = next((ln for ln in out.splitlines() if lib in ln), None)
            assert line is not None, f"{so} does not link {lib}:\n{out}"
            path = os.path.realpath(line.split("=>")[1].split("(")[0].strip())
            assert path.startswith(LIBS + os.sep), f"{so}: {lib} resolves to {path}, not to the wheel's copy"


@check
def shared_library_under_its_soname():
    lib = tokenfeed.get_library()
    soname = f"libtokenfeed.so.{tokenfeed.__version__.split('.')[0]}"
    assert os.path.basename(lib) == soname and os.path.isfile(lib), lib
    out = subprocess.run(["readelf", "-d", lib], capture_output=True, text=True, check=True).stdout
    assert f"Library soname: [{soname}]" in out, out
    with open(os.path.join(os.path.dirname(lib), "libtokenfeed.so")) as f:  # the linker script -ltokenfeed finds
        assert f"INPUT({soname})" in f.read()


@check
def exports_only_the_api():
    """The wheel's library exports tf_ functions and nothing else: no copy of a function built for
    several CPUs (tf_convert.avx2.1, ...: what clang, the wheels' compiler, names them) and no
    internal tf__ name. On x86-64, tf_convert is an ifunc: the AVX2/AVX-512 copies are in the wheel
    and one is chosen when the library loads."""
    out = subprocess.run(["nm", "-D", "--defined-only", tokenfeed.get_library()], capture_output=True, text=True,
                         check=True).stdout
    syms = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] != "A":
            syms[parts[2].split("@")[0]] = parts[1]
    bad = sorted(n for n in syms if not re.fullmatch(r"tf_[a-z][a-z0-9_]*", n))
    assert not bad, f"exported beside the API: {bad}"
    if os.uname().machine == "x86_64":
        assert syms.get("tf_convert") == "i", f"tf_convert is {syms.get('tf_convert')!r}, not an ifunc ('i')"


@check
def open_and_loader():
    ds = write(os.path.join(TMP, "plain"))
    assert ds.num_documents == 400 and ds.num_tokens > 0
    got, st = batches(ds)
    assert got[0]["tokens"].shape == (4, 129) and st["backend"] == "mmap"


@check
def zstd_dataset_round_trip():
    plain = tokenfeed.open(os.path.join(TMP, "plain"))
    z = write(os.path.join(TMP, "zstd"), compression="zstd")
    assert all(f["compressed"] for f in z.files()), z.files()
    z.verify(progress=False)
    assert np.array_equal(z.tokens(0, z.num_tokens), plain.tokens(0, plain.num_tokens))
    assert same(batches(z)[0], batches(plain)[0])


@check
def io_uring_backend():
    ds = tokenfeed.open(os.path.join(TMP, "plain"))
    got, st = batches(ds, backend="io_uring")
    assert st["backend"] == "io_uring", st
    assert same(got, batches(ds, backend="mmap")[0])


@check
def c_program_links_the_wheel_library():
    cc = shutil.which(os.environ.get("CC", "cc"))
    assert cc, "no C compiler"
    lib = os.path.dirname(tokenfeed.get_library())
    exe = os.path.join(TMP, "embed")
    subprocess.run([cc, "-O1", "-Wall", "-Werror", "-std=c11", "-I", tokenfeed.get_include(),
                    os.path.join(REPO, "docs", "examples", "embed.c"), "-L", lib, "-ltokenfeed",
                    f"-Wl,-rpath,{lib}", "-o", exe], check=True)
    out = subprocess.run([exe, os.path.join(TMP, "zstd"), "5"], capture_output=True, text=True, check=True).stdout
    m = re.search(r"batches 5\s+checksum ([0-9a-f]{16})", out)
    assert m and re.search(r"resume at position \d+: same batch", out), out
    h = 0xCBF29CE484222325
    with tokenfeed.Loader(tokenfeed.open(os.path.join(TMP, "zstd")), seq_len=64, batch_size=4, seed=1234,
                          shuffle=True, rank=0, world_size=1, dtype="int32", output="numpy") as loader:
        for _ in range(5):
            for t in next(loader)["tokens"].astype(np.uint64).ravel().tolist():
                h = ((h ^ t) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    assert m.group(1) == f"{h:016x}", (out, f"{h:016x}")


failed = 0
for fn in checks:
    try:
        fn()
        print(f"ok    {fn.__name__}")
    except Exception:
        failed += 1
        print(f"FAIL  {fn.__name__}\n{traceback.format_exc()}")
shutil.rmtree(TMP, ignore_errors=True)
print(f"wheel smoke: {len(checks) - failed} passed, {failed} failed")
sys.exit(1 if failed else 0)
