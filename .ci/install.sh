#!/usr/bin/env bash
# Install tokenfeed and what it builds against, on a fresh Debian/Ubuntu machine.
#   bash .ci/install.sh          system packages + the package (editable) + PyTorch CPU
#   bash .ci/install.sh test     ... plus the test dependencies
# Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."

# System packages: pkg-config and the optional libraries' headers (zstd, io_uring).
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
PIP="$PY -m pip install -q --disable-pip-version-check"
# PyTorch is optional for the library; the benchmark's baselines and the torch
# tests use it. 2.13.0 is pinned so that a CPU build already present is reused.
$PIP "torch==2.13.0" || echo "warning: torch==2.13.0 not installable; torch baselines and tests will be skipped" >&2
if [ "${1:-}" = test ]; then
  $PIP -e ".[test]"
  # Optional: Megatron's own builder for the interop tests (skipped when absent).
  $PIP megatron-core || echo "warning: megatron-core not installable; its interop test will be skipped" >&2
else
  $PIP -e .
fi
