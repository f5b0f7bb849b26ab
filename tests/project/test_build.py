"""The build: a configuration change is always picked up, the version lives in one
place, and a build that lacks an optional library says so and says how to get it.

The rebuild test builds a copy of the sources with ``setup.py build_ext`` into
one build directory several times, as ``pip install .`` does with the in-tree
``build/``: first on a "machine without libzstd-dev" (a zstd.h that does not
compile, found first through $CPATH), then with the real headers, then with the
test hooks. Each build must reflect its configuration, and a build with nothing
changed must rebuild nothing. -O0 keeps each build to seconds.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

import tokenfeed
from tokenfeed.common import _build

from conftest import ROOT

# Prints what a built copy reports: build_info() and the warnings at import.
REPORT = textwrap.dedent("""
    import json, warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import tokenfeed
    print(json.dumps({"info": tokenfeed.build_info(), "warnings": [str(w.message) for w in caught],
                      "file": tokenfeed._core.__file__}))
""")
# The features of the shipped libtokenfeed.so.MAJOR, through its C API (in a process of
# its own: the library and the extension each hold the core's thread-locals).
LIB_FEATURES = textwrap.dedent("""
    import ctypes, sys
    lib = ctypes.CDLL(sys.argv[1])
    lib.tf_features.restype = ctypes.c_uint
    print(lib.tf_features())
""")
TF_FEATURE_ZSTD = 1


@pytest.fixture(scope="module")
def source_copy(tmp_path_factory):
    """The files setup.py builds from, copied (the checkout is left alone)."""
    src = tmp_path_factory.mktemp("src")
    shutil.copytree(os.path.join(ROOT, "csrc"), src / "csrc")
    shutil.copytree(os.path.join(ROOT, "python", "tokenfeed"), src / "python" / "tokenfeed",
                    ignore=shutil.ignore_patterns("*.so", "lib", "include", "__pycache__"))
    for f in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(os.path.join(ROOT, f), src / f)
    fake = src / "no-zstd-headers"
    fake.mkdir()
    (fake / "zstd.h").write_text('#error "zstd headers are not installed on this machine"\n')
    return src


def build(src, **env_extra: str) -> dict:
    """setup.py build_ext --inplace with src/out as its build directory (the same every time, as pip's
    in-tree build/); return the REPORT of the result."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TOKENFEED_", "ASAN_", "UBSAN_", "TSAN_"))
           and k not in ("LD_PRELOAD", "PYTHONPATH", "PYTHONMALLOC", "CPATH", "CFLAGS")}
    env["CFLAGS"] = "-O0"
    env.update(env_extra)
    p = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace", "--build-temp", "out/temp"],
                       cwd=src, env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    env.pop("CPATH", None)
    env["PYTHONPATH"] = str(src / "python")
    r = subprocess.run([sys.executable, "-c", REPORT], cwd=src, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["file"].startswith(str(src / "python" / "tokenfeed")), out["file"]
    libs = list((src / "python" / "tokenfeed" / "lib").glob("libtokenfeed.so.*"))  # its soname
    assert len(libs) == 1, libs
    lib = libs[0]
    r = subprocess.run([sys.executable, "-c", LIB_FEATURES, str(lib)], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out["lib_features"] = int(r.stdout)
    return out


def mtimes(src) -> dict:
    objs = [os.path.join(d, f) for d, _, fs in os.walk(src / "out" / "temp" / "core" / "obj") for f in fs
            if f.endswith(".o")]
    ext = [str(p) for p in (src / "python" / "tokenfeed").glob("_core*.so")]
    assert objs and len(ext) == 1
    return {p: os.stat(p).st_mtime_ns for p in objs + ext}


def test_rebuild_picks_up_configuration_changes(source_copy):
    src = source_copy
    # 1. a machine without the zstd headers: built without zstd, and the import says so
    r = build(src, CPATH=str(src / "no-zstd-headers"))
    zstd = r["info"]["zstd"]
    assert not zstd["compiled"] and not r["lib_features"] & TF_FEATURE_ZSTD
    assert "libzstd-dev" in zstd["detail"] and "--no-cache-dir" in zstd["detail"]
    assert any("built without zstd" in w and "libzstd-dev" in w for w in r["warnings"]), r["warnings"]
    assert r["info"]["test_hooks"] is False
    # 2. the headers "installed", the same build directories: the probe's new result
    #    rebuilds the core, the extension and the shared library
    r = build(src)
    assert r["info"]["zstd"]["compiled"] and r["lib_features"] & TF_FEATURE_ZSTD
    assert r["warnings"] == []
    before = mtimes(src)
    # 3. nothing changed: nothing is rebuilt
    build(src)
    assert mtimes(src) == before
    # 4. a header changed: the objects that include it and the extension are rebuilt, the others not
    os.utime(src / "csrc" / "engine" / "engine.h")
    build(src)
    after = mtimes(src)
    changed = {os.path.relpath(p, src) for p in after if after[p] != before[p]}
    assert any(p.endswith("engine/loader.o") for p in changed) and any(p.endswith("engine/read.o") for p in changed)
    assert not any(p.endswith("common/hash.o") for p in changed), changed
    assert any("_core" in p for p in changed), changed
    # 5. an option changed (the test hooks): picked up too
    r = build(src, TOKENFEED_TEST_HOOKS="1")
    assert r["info"]["test_hooks"] is True and r["info"]["zstd"]["compiled"]


def test_left_out_on_purpose_is_not_warned_about():
    summary = "zstd: disabled by TOKENFEED_NO_ZSTD=1; io_uring: found (pkg-config); test hooks: off"
    assert _build.missing(summary, {"zstd": False, "io_uring": True}) == []
    detail = _build.feature_detail("zstd", _build.parse_summary(summary)["zstd"])
    assert "TOKENFEED_NO_ZSTD=1" in detail and "rebuild without TOKENFEED_NO_ZSTD" in detail


def test_missing_library_message_names_the_packages():
    summary = ("zstd: found (pkg-config); io_uring: not found: install liburing-dev (Debian/Ubuntu) or "
               "liburing-devel (Fedora/RHEL), then rebuild; test hooks: on; sanitizers: address")
    parsed = _build.parse_summary(summary)
    assert parsed["test hooks"] == "on" and parsed["sanitizers"] == "address"
    lines = _build.missing(summary, {"zstd": True, "io_uring": False})
    assert len(lines) == 1
    assert "built without io_uring" in lines[0] and "liburing-dev (Debian/Ubuntu)" in lines[0]
    assert "TOKENFEED_NO_IO_URING=1" in lines[0]  # how to silence it on purpose


def test_build_info_describes_this_build():
    info = tokenfeed.build_info()
    record = _build.parse_summary(info["build"])
    for name in ("zstd", "io_uring"):
        assert info[name]["detail"]
        assert info[name]["compiled"] == record[name].startswith("found"), (name, record)
    assert info["test_hooks"] == (record["test hooks"] == "on")


def test_cli_build_info():
    p = subprocess.run([sys.executable, "-m", "tokenfeed", "build-info"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(f"tokenfeed {tokenfeed.__version__}\n")
    for word in ("zstd", "io_uring", "cuda", "test hooks", "build"):
        assert re.search(rf"^  {word}\s", p.stdout, re.M), p.stdout


def test_version_is_written_once():
    with open(os.path.join(tokenfeed.get_include(), "tokenfeed.h")) as f:
        header = f.read()
    nums = [re.search(rf"#define TF_VERSION_{k} (\d+)", header).group(1) for k in ("MAJOR", "MINOR", "PATCH")]
    version = ".".join(nums)
    assert tokenfeed.__version__ == version == tokenfeed.build_info()["version"]
    assert importlib.metadata.version("tokenfeed") == version
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        project = f.read().split("[project]")[1].split("\n[")[0]
    assert re.search(r'^dynamic = \["version"\]', project, re.M) and not re.search(r"^version\s*=", project, re.M)
    # and no code or build file spells it out again
    literal = re.compile(r"""["']%s["']""" % re.escape(version))
    for top in ("csrc", "python", "setup.py", "pyproject.toml"):
        path = os.path.join(ROOT, top)
        files = [path] if os.path.isfile(path) else [
            os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs
            if not d.startswith(os.path.join(ROOT, "python", "tokenfeed", "include"))]  # the build's copy of the header
        for fn in files:
            if fn.endswith((".c", ".h", ".py", ".pyi", ".toml", "Makefile", ".sh")):
                with open(fn, errors="replace") as f:
                    assert not literal.search(f.read()), f"{fn} spells out the version {version}"
