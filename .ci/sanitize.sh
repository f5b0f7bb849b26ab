#!/usr/bin/env bash
# Sanitizer pass of CI, run by .ci/run after tests/run.sh:
#   1. C tests + fuzz corpus replay under ASan+UBSan
#      (make -C csrc SANITIZE=address,undefined test)
#   2. the whole pytest suite against an ASan+UBSan build of the extension
#      (TOKENFEED_SANITIZE=address,undefined into build/asan, libasan
#      preloaded, PYTHONMALLOC=malloc so ASan sees Python's allocations)
#   3. the engine stress test under TSan (make -C csrc SANITIZE=thread
#      test-stress), when that target exists, and several Python threads
#      calling into a TSan build of the extension (.ci/tsan_threads.sh)
#   4. a short libFuzzer smoke run of every fuzz target (clang), on top of
#      the corpus replay of step 1
# Every build here has the test hooks compiled in (TEST_HOOKS=1, the default
# under SANITIZE). Any sanitizer report fails the step (halt_on_error). Under
# CI=true a step that cannot run (no clang for libFuzzer) fails too.
# Budget: ~15 min on 2 cores. Reproduce locally with: bash .ci/sanitize.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
JOBS=$(nproc)
SECONDS=0
step() { echo; echo "== sanitize: $* (at ${SECONDS}s)"; }

export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
# Leak checking on for the C programs (they free everything they allocate).
export ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1

step "C tests and fuzz corpus replay, ASan+UBSan"
make -s -C csrc -j"$JOBS" SANITIZE=address,undefined TEST_HOOKS=1 test

step "pytest against an ASan+UBSan build of the extension"
# A separate build (build/asan) so the editable install stays a normal
# build; PYTHONPATH puts it ahead of the editable .pth entry.
# It mirrors the repository layout (build/asan/python/tokenfeed next to a
# copy of pyproject.toml) for tests that look at the package's files.
rm -rf build/asan
mkdir -p build/asan/python
cp pyproject.toml build/asan/
cp -r python/tokenfeed build/asan/python/
rm -rf build/asan/python/tokenfeed/lib build/asan/python/tokenfeed/include build/asan/python/tokenfeed/__pycache__ \
  build/asan/python/tokenfeed/*.so
TOKENFEED_SANITIZE=address,undefined TOKENFEED_TEST_HOOKS=1 $PY setup.py -q build_ext --force \
  --build-lib build/asan/python --build-temp build/asan-temp >build/asan-build.log 2>&1 ||
  { tail -40 build/asan-build.log; exit 1; }
# libstdc++ preloaded too: otherwise ASan's __cxa_throw interceptor finds no
# real symbol (python is not C++) and aborts on the first C++ exception in a
# third-party extension (torch, matplotlib).
LIBASAN="$(${CC:-cc} -print-file-name=libasan.so) $(${CC:-cc} -print-file-name=libstdc++.so)"
# Python itself leaks at exit: leak checking off. allocator_may_return_null:
# a huge request (tests ask for a 2^40-row batch) returns NULL as malloc
# does, instead of ASan aborting, so the MemoryError path is tested. Every other ASan/UBSan
# report aborts the test process, which fails pytest.
env LD_PRELOAD="$LIBASAN" PYTHONMALLOC=malloc PYTHONPATH="$PWD/build/asan/python" \
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:allocator_may_return_null=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  TOKENFEED_SANITIZED=1 $PY -c 'import tokenfeed, sys; f = tokenfeed._core.__file__; print("sanitized build:", f); sys.exit("build/asan/" not in f)'
# Reports go to files as well (log_path): pytest captures a test's stderr, and a report
# written there is lost when the process aborts. -v names the test that was running.
rm -f build/asan-report.*
env LD_PRELOAD="$LIBASAN" PYTHONMALLOC=malloc PYTHONPATH="$PWD/build/asan/python" \
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:allocator_may_return_null=1:log_path="$PWD/build/asan-report" \
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:log_path="$PWD/build/asan-report" \
  TOKENFEED_SANITIZED=1 $PY -X faulthandler -m pytest -v -p no:cacheprovider "$@" >build/asan-pytest.log 2>&1 || {
  rc=$?
  tail -60 build/asan-pytest.log
  [ "$rc" -eq 5 ] && echo "pytest collected no test (exit 5)" >&2
  for f in build/asan-report.*; do
    # allocator_may_return_null: the huge-allocation warnings are expected, not the failure
    [ -f "$f" ] && grep -v "failed to allocate" "$f" | grep -q . && { echo "== $f"; head -120 "$f"; }
  done
  exit 1
}
tail -3 build/asan-pytest.log

step "engine stress test, TSan"
TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 make -s -C csrc -j"$JOBS" SANITIZE=thread TEST_HOOKS=1 test-stress

step "several Python threads calling into tokenfeed at once, TSan"
bash .ci/tsan_threads.sh

step "libFuzzer smoke run of every target (clang)"
if ! command -v clang >/dev/null || ! ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi
  { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq clang libclang-rt-14-dev >/dev/null; } ||
    echo "clang/libFuzzer not installable"
fi
if command -v clang >/dev/null && make -s -C csrc fuzz >build/fuzz-build.log 2>&1; then
  RUNS=${FUZZ_SMOKE_RUNS:-20000} JOBS=$JOBS bash tests/fuzz/run_fuzz.sh | tee build/fuzz-smoke.txt
  if grep -v 'rc=0 ' build/fuzz-smoke.txt | grep -q .; then
    echo "FAIL: a fuzz target crashed; inputs in build/fuzz/art/, logs in build/fuzz/*.log"
    exit 1
  fi
else
  echo "SKIP: no libFuzzer build (see build/fuzz-build.log); the corpus replay above still ran"
  if [ "${CI:-}" = true ]; then echo "FAIL: CI=true needs the libFuzzer smoke run"; exit 1; fi
fi
echo
echo "== sanitize: all passed in ${SECONDS}s"
