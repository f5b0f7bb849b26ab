#!/usr/bin/env bash
# Install what the tests need and run them all: the C test programs, then pytest.
# Used by the README's test command and by CI (.ci/run). Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."

# System packages: a C compiler, pkg-config and the optional libraries' headers.
need=()
for pkg in pkg-config libzstd-dev liburing-dev; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
# PyTorch 2.13.0 (CPU) is optional for the library but used by the torch tests.
$PY -m pip install -q --disable-pip-version-check "torch==2.13.0" || echo "torch not installable: its tests will be skipped"
$PY -m pip install -q --disable-pip-version-check -e ".[test]"

echo "== C tests"
make -s -C csrc -j"$(nproc)" test

echo "== pytest"
$PY -m pytest -q "$@"
