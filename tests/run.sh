#!/usr/bin/env bash
# Install what the tests need and run them all: the C test programs, then pytest.
# Used by the README's test command and by CI (.ci/run). Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

bash .ci/install.sh test

echo "== C tests"
make -s -C csrc -j"$(nproc)" test

echo "== pytest"
$PY -m pytest -q "$@"
