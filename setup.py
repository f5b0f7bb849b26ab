"""Build tokenfeed: one extension module (tokenfeed._core) and a shared library
(tokenfeed/lib/libtokenfeed.so.MAJOR) that C programs can link, with the public
header copied to tokenfeed/include/.

The C core is built once, by csrc/Makefile (``make -C csrc lib``) in the build
directory, and its objects are linked into both the extension and the shared
library. The extension does not load the shared library: it carries the core
itself. The shared library goes into the package under its soname,
libtokenfeed.so.MAJOR (what programs linked against it load at run time), with
libtokenfeed.so beside it as a one-line linker script naming it, so that
``-ltokenfeed`` works; a wheel cannot hold the symbolic link that ``make
install`` makes, and two copies of the library would double its size. The Makefile owns the probe of the optional libraries
(csrc/configure.sh) and records the whole configuration in a file that every
object depends on, so a changed probe result, flag or option rebuilds what it
affects, and nothing stale is reused. Building needs a C compiler and make.

Options, from the environment:

    TOKENFEED_NO_ZSTD=1       build without zstd (compressed shards unsupported)
    TOKENFEED_NO_IO_URING=1   build without io_uring (mmap/pread backends only)
    TOKENFEED_SANITIZE=address,undefined   instrumented build (see docs/reliability.md)
    TOKENFEED_TEST_HOOKS=1    compile in the fault-injection hooks the tests use

The version is read from csrc/include/tokenfeed.h (TF_VERSION_*), its only home.
"""
from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join(HERE, "csrc")
HEADER = os.path.join(CSRC, "include", "tokenfeed.h")


def read_version() -> str:
    with open(HEADER) as f:
        text = f.read()
    parts = [re.search(rf"^#define TF_VERSION_{k}\s+(\d+)\s*$", text, re.M) for k in ("MAJOR", "MINOR", "PATCH")]
    if not all(parts):
        raise RuntimeError(f"{HEADER}: TF_VERSION_MAJOR/MINOR/PATCH not found")
    return ".".join(m.group(1) for m in parts if m)


def build_core(build_dir: str) -> dict[str, str]:
    """Build the core with csrc/Makefile into build_dir; return its configuration record."""
    cmd = ["make", "-C", CSRC, f"-j{max(1, os.cpu_count() or 1)}", "lib", f"BUILD={build_dir}"]
    if os.environ.get("TOKENFEED_SANITIZE"):
        cmd.append(f"SANITIZE={os.environ['TOKENFEED_SANITIZE']}")
    os.makedirs(build_dir, exist_ok=True)
    log = os.path.join(build_dir, "make.log")
    try:
        with open(log, "w") as out:
            rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode
    except FileNotFoundError:
        raise SystemExit("building tokenfeed needs make and a C compiler "
                         "(Debian/Ubuntu: apt-get install build-essential)") from None
    if rc != 0:
        with open(log) as f:
            sys.stderr.write(f.read()[-8000:])
        raise SystemExit(f"building the C core failed ({' '.join(cmd)}); the log is {log}")
    config: dict[str, str] = {}
    with open(os.path.join(build_dir, "config")) as f:
        for line in f:
            key, _, value = line.rstrip("\n").partition("=")
            config[key] = value
    return config


def _from_csrc(flag: str) -> str:
    """The Makefile's include flags are relative to csrc/."""
    if flag.startswith("-I") and not os.path.isabs(flag[2:]):
        return "-I" + os.path.join(CSRC, flag[2:])
    return flag


class BuildExt(build_ext):
    """Build the core with make, then the extension on its objects, then ship the
    shared library and the header in the package."""

    def run(self) -> None:
        core_dir = os.path.join(os.path.abspath(self.build_temp), "core")
        config = build_core(core_dir)
        objects = config["objects"].split()
        summary = config["summary"]
        for ext in self.extensions:
            ext.extra_objects = objects
            ext.extra_compile_args = config["cflags"].split() + [_from_csrc(f) for f in config["cppflags"].split()]
            ext.extra_link_args = config["ldflags"].split() + config["ldlibs"].split()
            ext.define_macros = [("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION"),
                                 ("TF_BUILD_SUMMARY", '"' + summary.replace('"', "'") + '"')]
            # relink (and recompile the binding, which embeds the summary) whenever the core or its
            # configuration changed
            ext.depends = objects + [os.path.join(core_dir, "config"), HEADER,
                                     *glob.glob(os.path.join(CSRC, "python", "*.h"))]
        super().run()
        pkg_dir = os.path.join(HERE, "python", "tokenfeed") if self.inplace else os.path.join(self.build_lib,
                                                                                              "tokenfeed")
        os.makedirs(os.path.join(pkg_dir, "lib"), exist_ok=True)
        os.makedirs(os.path.join(pkg_dir, "include"), exist_ok=True)
        soname = f"libtokenfeed.so.{read_version().split('.')[0]}"
        lib_dir = os.path.join(pkg_dir, "lib")
        for old in glob.glob(os.path.join(lib_dir, "libtokenfeed.so*")):
            os.remove(old)  # also an earlier build's file of another name
        shutil.copy2(os.path.join(core_dir, soname), os.path.join(lib_dir, soname))  # follows the build's links
        with open(os.path.join(lib_dir, "libtokenfeed.so"), "w") as f:
            f.write(f"/* GNU ld script: -ltokenfeed links the library beside it */\nINPUT({soname})\n")
        shutil.copy2(HEADER, os.path.join(pkg_dir, "include", "tokenfeed.h"))
        print("tokenfeed build configuration: " + summary, file=sys.stderr)


def numpy_include() -> str:
    import numpy

    return numpy.get_include()


ext = Extension(
    "tokenfeed._core",
    sources=sorted(glob.glob(os.path.join("csrc", "python", "*.c"))),
    include_dirs=[numpy_include()],
)

setup(version=read_version(), ext_modules=[ext], cmdclass={"build_ext": BuildExt})
