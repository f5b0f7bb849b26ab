#!/usr/bin/env bash
# Install what the tests need and run them all: the C test programs, then pytest.
# Used by the README's test command and by CI (.ci/run). Safe to re-run.
#
# PYTHON names the interpreter (default python3): in a virtual environment,
# activate it or run PYTHON=.venv/bin/python bash tests/run.sh. Arguments go to
# pytest. The build is a test build (TOKENFEED_TEST_HOOKS=1: the fault-injection
# hooks some tests use). Under CI=true, any skip but a missing GPU fails (see
# tests/conftest.py).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

bash .ci/install.sh test

echo "== C tests"
make -s -C csrc -j"$(nproc)" TEST_HOOKS=1 test

echo "== pytest"
rc=0
$PY -m pytest -q "$@" || rc=$?
if [ "$rc" -eq 5 ]; then
  # pytest's "no tests collected": a selection that matches nothing, or a suite
  # that lost its tests. Neither is a pass.
  echo "pytest collected no test (exit 5): check the arguments ($*) and that tests/ is intact" >&2
  exit 1
fi
exit "$rc"
