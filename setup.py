"""Build tokenfeed: one extension module (tokenfeed._core) and the same C
sources as a shared library (tokenfeed/lib/libtokenfeed.so) that C programs can
link, with the public header copied to tokenfeed/include/.

Optional libraries are probed at build time — pkg-config first, then a tiny
compile-and-link test — and a found/not-found summary is printed. Each probe can
be disabled from the environment:

    TOKENFEED_NO_ZSTD=1       build without zstd (compressed shards unsupported)
    TOKENFEED_NO_IO_URING=1   build without io_uring (mmap/pread backends only)
    TOKENFEED_SANITIZE=address,undefined   instrumented build (see docs/reliability.md)
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))


def _pkg_config(name: str) -> tuple[list[str], list[str]] | None:
    try:
        cflags = subprocess.run(["pkg-config", "--cflags", name], capture_output=True, text=True, check=True).stdout.split()
        libs = subprocess.run(["pkg-config", "--libs", name], capture_output=True, text=True, check=True).stdout.split()
        return cflags, libs
    except (OSError, subprocess.CalledProcessError):
        return None


def _compiles(code: str, libs: list[str]) -> bool:
    cc = os.environ.get("CC", "cc")
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "probe.c")
        with open(src, "w") as f:
            f.write(code)
        r = subprocess.run([cc, src, "-o", os.path.join(d, "probe"), *libs], capture_output=True)
        return r.returncode == 0


PROBES = {
    "zstd": ("TOKENFEED_NO_ZSTD", "libzstd", "TF_HAVE_ZSTD",
             "#include <zstd.h>\nint main(void){return (int)ZSTD_versionNumber()==0;}\n", ["-lzstd"]),
    "io_uring": ("TOKENFEED_NO_IO_URING", "liburing", "TF_HAVE_IO_URING",
                 "#include <liburing.h>\nint main(void){struct io_uring r; (void)r; return 0;}\n", ["-luring"]),
}


def probe() -> tuple[list[tuple[str, str]], list[str], list[str], dict[str, str]]:
    macros: list[tuple[str, str]] = []
    cflags: list[str] = []
    libs: list[str] = []
    summary: dict[str, str] = {}
    for name, (env, pc, macro, code, fallback_libs) in PROBES.items():
        if os.environ.get(env, "") not in ("", "0"):
            summary[name] = f"disabled by {env}"
            continue
        found = _pkg_config(pc)
        how = "pkg-config"
        if found is None or not _compiles(code, found[0] + found[1]):
            found = ([], fallback_libs) if _compiles(code, fallback_libs) else None
            how = "compile test"
        if found is None:
            summary[name] = "not found (install the -dev package to enable)"
            continue
        macros.append((macro, "1"))
        cflags += found[0]
        libs += found[1]
        summary[name] = f"found ({how})"
    print("tokenfeed build configuration:", file=sys.stderr)
    for k, v in summary.items():
        print(f"  {k:9s} {v}", file=sys.stderr)
    print("  cuda      runtime loaded with dlopen at run time (no toolkit needed)", file=sys.stderr)
    return macros, cflags, libs, summary


def core_sources() -> list[str]:
    srcs = []
    for layer in ("common", "sources", "order", "engine", "device"):
        srcs += sorted(glob.glob(os.path.join("csrc", layer, "*.c")))
    return srcs


MACROS, PROBE_CFLAGS, PROBE_LIBS, SUMMARY = probe()
MACROS.append(("TF_HAVE_CUDA_LAYER", "1"))
MACROS.append(("TF_BUILD_SUMMARY", '"' + "; ".join(f"{k}: {v}" for k, v in SUMMARY.items()) + '"'))

CFLAGS = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-fvisibility=hidden",
          "-D_GNU_SOURCE", "-pthread", *PROBE_CFLAGS]
LDFLAGS = ["-pthread", "-ldl", *PROBE_LIBS]
SANITIZE = os.environ.get("TOKENFEED_SANITIZE", "")
if SANITIZE:
    CFLAGS = [f for f in CFLAGS if f != "-O2"] + ["-O1", "-g", "-fno-omit-frame-pointer", f"-fsanitize={SANITIZE}"]
    LDFLAGS += [f"-fsanitize={SANITIZE}"]


class BuildExt(build_ext):
    """Build the extension, then the standalone shared library and header."""

    def run(self) -> None:
        super().run()
        pkg_dir = os.path.join(self.build_lib, "tokenfeed")
        if self.inplace:
            pkg_dir = os.path.join(HERE, "python", "tokenfeed")
        self._build_shared_lib(pkg_dir)

    def _build_shared_lib(self, pkg_dir: str) -> None:
        objects = self.compiler.compile(core_sources(), output_dir=self.build_temp,
                                        macros=MACROS, include_dirs=["csrc/include", "csrc"],
                                        extra_postargs=CFLAGS + ["-fPIC"])
        lib_dir = os.path.join(pkg_dir, "lib")
        os.makedirs(lib_dir, exist_ok=True)
        self.compiler.link_shared_object(objects, os.path.join(lib_dir, "libtokenfeed.so"),
                                         extra_postargs=LDFLAGS + ["-Wl,-soname,libtokenfeed.so"])
        inc_dir = os.path.join(pkg_dir, "include")
        os.makedirs(inc_dir, exist_ok=True)
        shutil.copy(os.path.join("csrc", "include", "tokenfeed.h"), inc_dir)


def numpy_include() -> str:
    import numpy

    return numpy.get_include()


ext = Extension(
    "tokenfeed._core",
    sources=core_sources() + sorted(glob.glob(os.path.join("csrc", "python", "*.c"))),
    include_dirs=["csrc/include", "csrc", numpy_include()],
    define_macros=MACROS + [("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    extra_compile_args=CFLAGS,
    extra_link_args=LDFLAGS,
)

setup(ext_modules=[ext], cmdclass={"build_ext": BuildExt})
