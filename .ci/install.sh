#!/usr/bin/env bash
# Install tokenfeed and what it builds against, on a fresh Debian/Ubuntu machine.
#   bash .ci/install.sh          system packages + the package (editable) + PyTorch CPU
#   bash .ci/install.sh test     ... a test build (TOKENFEED_TEST_HOOKS=1) with the
#                                `test` extra: everything the tests import
#   bash .ci/install.sh system   the system packages only
# PYTHON names the interpreter to install into (default python3); in a virtual
# environment, PYTHON=.venv/bin/python or activate it first. Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

# System packages: a C compiler and make, pkg-config, and the optional
# libraries' headers (libzstd-dev: compressed datasets; liburing-dev: the
# io_uring backend). Python's headers where the interpreter lacks them.
pkgs=(build-essential pkg-config libzstd-dev liburing-dev)
# the tests also decode compressed blocks with the stock zstd tool (standard frames);
# the benchmark reads its larger-than-memory file with fio too, for the device's limit
if [ "${1:-}" = test ]; then pkgs+=(zstd); else pkgs+=(fio); fi
need=()
for pkg in "${pkgs[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if ! $PY -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'; then
  need+=(python3-dev)
fi
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi
  echo "installing system packages: ${need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
[ "${1:-}" = system ] && exit 0

PIP="$PY -m pip install -q --disable-pip-version-check"
# PyTorch is optional for the library; the benchmark's baselines and the torch
# tests use it. 2.13.0 (CPU) is pinned so that a build already present is
# reused: an unpinned torch would be a multi-GB CUDA download.
if [ "${1:-}" = test ]; then
  # the tests need torch: without the pin, the `test` extra would pull the CUDA build
  $PIP "torch==2.13.0"
  TOKENFEED_TEST_HOOKS=1 $PIP -e ".[test]"
else
  $PIP "torch==2.13.0" || echo "warning: torch==2.13.0 not installable; the benchmark's torch baselines will be skipped" >&2
  $PIP -e .
fi
# One line that says what this build has (pip hides the build's own output).
$PY -c 'import tokenfeed; print("tokenfeed", tokenfeed.__version__, "built:", tokenfeed.build_info()["build"])'
