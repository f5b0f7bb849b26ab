#!/usr/bin/env bash
# Run every fuzz target (or the ones named) for RUNS executions, JOBS at a
# time, and print a summary line per target (executions, exec/s, coverage,
# crashes). New inputs go to build/fuzz/work/<target>/ (the checked-in
# corpus is only read); crashes go to build/fuzz/art/<target>/.
#
#   bash tests/fuzz/run_fuzz.sh                      # all targets, 10^6 runs each, 2 at a time
#   RUNS=100000 JOBS=4 bash tests/fuzz/run_fuzz.sh dataset megatron
#
# Needs clang and libclang-rt-*-dev (libFuzzer); builds with make -C csrc fuzz.
set -uo pipefail
cd "$(dirname "$0")/../.."
RUNS=${RUNS:-1000000}
JOBS=${JOBS:-2}
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then  # every target there is
  for f in tests/fuzz/fuzz_*.c; do t=${f#tests/fuzz/fuzz_}; targets+=("${t%.c}"); done
fi
make -s -C csrc fuzz >/dev/null || exit 1
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
one() {
  local t=$1
  mkdir -p "build/fuzz/work/$t" "build/fuzz/art/$t"
  build/fuzz/fuzz_$t "build/fuzz/work/$t" "tests/fuzz/corpus/$t" -runs="$RUNS" -max_len=65536 \
    -timeout=20 -rss_limit_mb=2560 -print_final_stats=1 -artifact_prefix="build/fuzz/art/$t/" \
    >"build/fuzz/$t.log" 2>&1
  local rc=$?
  local execs eps cov
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "build/fuzz/$t.log")
  eps=$(sed -n 's/^stat::average_exec_per_sec: *//p' "build/fuzz/$t.log")
  cov=$(grep -o 'cov: [0-9]* ft: [0-9]*' "build/fuzz/$t.log" | tail -1)
  echo "$t: rc=$rc execs=${execs:-?} exec/s=${eps:-?} $cov crashes=$(ls "build/fuzz/art/$t" | wc -l)"
}
running=0
for t in "${targets[@]}"; do
  one "$t" &
  running=$((running + 1))
  if [ "$running" -ge "$JOBS" ]; then wait -n; running=$((running - 1)); fi
done
wait
