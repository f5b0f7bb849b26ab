#!/usr/bin/env bash
# What ThreadSanitizer says about several Python threads calling into tokenfeed at once:
# the extension built with TOKENFEED_SANITIZE=thread (into build/tsan, so the normal
# build stays), libtsan preloaded into the Python that runs .ci/tsan_threads.py. Any
# report fails (halt_on_error). CPython itself is not instrumented, so TSan sees the
# accesses of tokenfeed's C code (and the locks and threads of both). docs/install.md
# says what it found.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
rm -rf build/tsan
mkdir -p build/tsan/python
cp -r python/tokenfeed build/tsan/python/
rm -rf build/tsan/python/tokenfeed/lib build/tsan/python/tokenfeed/include build/tsan/python/tokenfeed/__pycache__ \
  build/tsan/python/tokenfeed/*.so
TOKENFEED_SANITIZE=thread $PY setup.py -q build_ext --force --build-lib build/tsan/python --build-temp build/tsan-temp \
  >build/tsan-build.log 2>&1 || { tail -40 build/tsan-build.log; exit 1; }
LIBTSAN=$(${CC:-cc} -print-file-name=libtsan.so)
# setarch -R: TSan maps its shadow memory at fixed addresses, which a randomised layout can hit
run=(env LD_PRELOAD="$LIBTSAN" PYTHONPATH="$PWD/build/tsan/python"
  TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:log_path=$PWD/build/tsan-report"
  $PY .ci/tsan_threads.py)
rm -f build/tsan-report.*
if command -v setarch >/dev/null; then run=(setarch "$(uname -m)" -R "${run[@]}"); fi
"${run[@]}" || { for f in build/tsan-report.*; do [ -f "$f" ] && head -80 "$f"; done; exit 1; }
if ls build/tsan-report.* >/dev/null 2>&1; then head -80 build/tsan-report.*; exit 1; fi
echo "tsan: no report"
