"""The C library as a C program sees it: its exported symbols (the tf_ functions tokenfeed.h
declares, each with its symbol version), its soname, the header's split into a stable and an
experimental API, and `make install` with a pkg-config file that links it shared and static.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess

import numpy as np

import tokenfeed

from conftest import ROOT

HEADER = os.path.join(ROOT, "csrc", "include", "tokenfeed.h")
EXPERIMENTAL_BEGIN = "#ifdef TF_EXPERIMENTAL_API"
EXPERIMENTAL_END = "#endif /* TF_EXPERIMENTAL_API */"


def declared() -> tuple[set[str], set[str]]:
    """(stable, experimental): the functions tokenfeed.h declares with TF_API."""
    with open(HEADER) as f:
        text = f.read()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    assert text.count(EXPERIMENTAL_BEGIN) == 1 and text.count("#endif") > 1
    head, rest = text.split(EXPERIMENTAL_BEGIN)
    experimental, tail = rest.split("#endif", 1)
    names = re.compile(r"\bTF_API\b[^;{]*?\b(tf_\w+)\s*\(")
    stable = set(names.findall(head + tail))
    return stable, set(names.findall(experimental))


def dynamic_symbols(lib: str) -> dict[str, str]:
    """Defined dynamic symbols of lib (nm -D), but for the version nodes themselves: name -> version."""
    out = subprocess.run(["nm", "-D", "--defined-only", "--with-symbol-versions", lib], capture_output=True,
                         text=True, check=True).stdout
    syms = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 3 or parts[1] == "A":  # "A": a version node (TOKENFEED_0), not a symbol
            continue
        name, _, version = parts[2].partition("@")
        syms[name] = version.lstrip("@")
    return syms


def cc() -> str:
    path = shutil.which(os.environ.get("CC", "cc"))
    assert path, "no C compiler"
    return path


def test_header_split_is_parsed():
    stable, experimental = declared()
    assert {"tf_loader_create", "tf_dataset_open", "tf_device_loader_next", "tf_sigbus_handle"} <= stable
    assert {"tf_perm_init", "tf_mix64", "tf_device_ring_create", "tf_device_slot_release"} <= experimental
    assert not stable & experimental


def test_exports_only_the_declared_api_with_versions():
    """nm -D: every exported symbol is a tf_ function the header declares, and every declared one is
    exported; the experimental ones under their own symbol version."""
    lib = tokenfeed.get_library()
    syms = dynamic_symbols(lib)
    major = tokenfeed.__version__.split(".")[0]
    stable, experimental = declared()
    exported = set(syms)
    assert all(n.startswith("tf_") and not n.startswith("tf__") for n in exported), \
        sorted(n for n in exported if not n.startswith("tf_") or n.startswith("tf__"))
    assert exported - (stable | experimental) == set(), "exported but not declared in tokenfeed.h"
    assert (stable | experimental) - exported == set(), "declared in tokenfeed.h but not exported"
    wrong = {n: syms[n] for n in stable if syms[n] != f"TOKENFEED_{major}"}
    wrong.update({n: syms[n] for n in experimental if syms[n] != f"TOKENFEED_EXPERIMENTAL_{major}"})
    assert not wrong, wrong


def test_soname_is_versioned():
    lib = tokenfeed.get_library()
    major = tokenfeed.__version__.split(".")[0]
    assert os.path.basename(lib) == f"libtokenfeed.so.{major}"
    out = subprocess.run(["readelf", "-d", lib], capture_output=True, text=True, check=True).stdout
    assert f"Library soname: [libtokenfeed.so.{major}]" in out, out


def test_experimental_api_needs_the_macro(tmp_path):
    """The experimental declarations exist only under TF_EXPERIMENTAL_API; the stable header compiles
    on its own with every warning as an error, as C and as C++."""
    src = tmp_path / "perm.c"
    src.write_text('#include "tokenfeed.h"\n'
                   "int main(void) { tf_perm p; return tf_perm_init(&p, 10, 1) ? 1 : (int)tf_perm_apply(&p, 3); }\n")
    inc = os.path.dirname(HEADER)
    base = [cc(), "-std=c11", "-Wall", "-Wextra", "-Werror", "-I", inc, "-c", str(src), "-o", str(tmp_path / "o.o")]
    p = subprocess.run(base, capture_output=True, text=True)
    assert p.returncode != 0 and "tf_perm" in p.stderr
    p = subprocess.run(base + ["-DTF_EXPERIMENTAL_API"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    only = tmp_path / "only.c"
    only.write_text('#include "tokenfeed.h"\nint main(void) { return tf_version()[0] == 0; }\n')
    p = subprocess.run([cc(), "-std=c11", "-Wall", "-Wextra", "-Wpedantic", "-Werror", "-I", inc, "-c", str(only),
                        "-o", str(tmp_path / "only.o")], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    cxx = shutil.which("c++")
    if cxx:  # build-essential has one; the header is meant to be usable from C++ (CUDA trainers)
        p = subprocess.run([cxx, "-x", "c++", "-std=c++17", "-Wall", "-Wextra", "-Werror", "-DTF_EXPERIMENTAL_API",
                            "-I", inc, "-c", str(only), "-o", str(tmp_path / "cxx.o")], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr


def needed(exe: str) -> list[str]:
    out = subprocess.run(["readelf", "-d", exe], capture_output=True, text=True, check=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def test_make_install_and_pkg_config(tmp_path):
    """make install DESTDIR=... PREFIX=/usr/local; then a program built with pkg-config links the
    installed library shared, fully static (--static), and with libtokenfeed.a in a dynamic program.
    The program is docs/examples/embed.c, the C API guide's example."""
    assert shutil.which("pkg-config"), "pkg-config is missing (.ci/install.sh installs it)"
    dest = tmp_path / "root"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOKENFEED_", "PKG_CONFIG"))}
    env["CFLAGS"] = "-O0"  # a build of its own (no hooks): seconds at -O0
    p = subprocess.run(["make", "-s", "-C", os.path.join(ROOT, "csrc"), "-j2", "install", f"BUILD={tmp_path / 'build'}",
                        f"DESTDIR={dest}", "PREFIX=/usr/local"], env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    major = tokenfeed.__version__.split(".")[0]
    lib = dest / "usr" / "local" / "lib"
    assert (dest / "usr" / "local" / "include" / "tokenfeed.h").is_file()
    assert (lib / "libtokenfeed.a").is_file()
    assert (lib / f"libtokenfeed.so.{tokenfeed.__version__}").is_file()
    assert os.readlink(lib / f"libtokenfeed.so.{major}") == f"libtokenfeed.so.{tokenfeed.__version__}"
    assert os.readlink(lib / "libtokenfeed.so") == f"libtokenfeed.so.{major}"
    pc = (lib / "pkgconfig" / "tokenfeed.pc").read_text()
    assert "prefix=/usr/local\n" in pc and re.search(r"^Version: %s$" % re.escape(tokenfeed.__version__), pc, re.M)

    # pkg-config finds the staged tree the usual way for a DESTDIR: its sysroot
    env.update(PKG_CONFIG_SYSROOT_DIR=str(dest), PKG_CONFIG_LIBDIR=str(lib / "pkgconfig"))

    def pkg(*args: str) -> list[str]:
        return subprocess.run(["pkg-config", *args, "tokenfeed"], env=env, capture_output=True, text=True,
                              check=True).stdout.split()

    private = pkg("--variable=static_libs")
    assert {"-pthread", "-ldl", "-lm"} <= set(private)
    features = set(tokenfeed.build_info()[k]["compiled"] and k for k in ("zstd", "io_uring"))
    assert ("-lzstd" in private) == ("zstd" in features) and ("-luring" in private) == ("io_uring" in features)
    src = os.path.join(ROOT, "docs", "examples", "embed.c")
    data = tmp_path / "tokens.npy"
    np.save(data, (np.arange(20_000, dtype=np.uint32) * 7919) % 50_000)
    builds = {
        "shared": [*pkg("--cflags", "--libs")],
        "static": ["-static", *pkg("--static", "--cflags", "--libs")],
        "archive": [*pkg("--cflags"), os.path.join(pkg("--variable=libdir")[0], "libtokenfeed.a"), *private],
    }
    outputs = {}
    for name, flags in builds.items():
        exe = str(tmp_path / name)
        p = subprocess.run([cc(), "-std=c11", "-Wall", "-Werror", src, "-o", exe, *flags], env=env,
                           capture_output=True, text=True)
        # a fully static program that calls dlopen gets a warning from glibc's linker stub, not an error
        assert p.returncode == 0, (name, flags, p.stderr)
        deps = needed(exe)
        assert (f"libtokenfeed.so.{major}" in deps) == (name == "shared"), (name, deps)
        if name == "static":
            assert deps == [], deps
        run_env = dict(env, LD_LIBRARY_PATH=str(lib))
        r = subprocess.run([exe, str(data), "3"], env=run_env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, (name, r.stdout, r.stderr)
        outputs[name] = r.stdout
    assert re.search(r"batches 3\s+checksum [0-9a-f]{16}", outputs["shared"]), outputs["shared"]
    assert len(set(outputs.values())) == 1, outputs
