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
# (strace: the start-up tests count the metadata system calls an open makes)
if [ "${1:-}" = test ]; then pkgs+=(zstd strace); else pkgs+=(fio); fi
need=()
for pkg in "${pkgs[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if ! $PY -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'; then
  need+=(python3-dev)
fi
# Debian's and Ubuntu's own Python refuses pip installs (PEP 668: "externally managed"):
# the package goes into a virtual environment, which needs python3-venv there.
externally_managed() {
  [ -z "${PIP_BREAK_SYSTEM_PACKAGES:-}" ] && $PY -c 'import os, sys, sysconfig
venv = sys.prefix != getattr(sys, "base_prefix", sys.prefix)
sys.exit(0 if not venv and os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")) else 1)'
}
if externally_managed && ! $PY -c 'import ensurepip, venv' >/dev/null 2>&1; then
  need+=(python3-venv)
fi
# Fresh cloud VMs often run unattended upgrades at boot, holding the dpkg lock for a
# few minutes: wait for it (up to 5 minutes, saying so) instead of failing at once.
# apt waits by itself where it knows DPkg::Lock::Timeout (apt >= 1.9.11); the loop
# covers older apt and the lists lock of `apt-get update`.
LOCK_WAIT_S=300
apt_wait() {
  local deadline=$((SECONDS + LOCK_WAIT_S)) out
  while :; do
    if out=$("$@" 2>&1); then return 0; fi
    if ! printf '%s' "$out" | grep -qiE 'could not get lock|unable to lock|unable to acquire|is another process using it'; then
      printf '%s\n' "$out" >&2
      return 1
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      printf '%s\n' "$out" >&2
      echo "another package manager still holds the dpkg lock after $((LOCK_WAIT_S / 60)) minutes (unattended upgrades?): wait for it to finish, then re-run" >&2
      return 1
    fi
    echo "waiting for another package manager to release the dpkg lock ($((deadline - SECONDS)) s left of $((LOCK_WAIT_S / 60)) minutes)..." >&2
    sleep 10
  done
}
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi
  echo "installing system packages: ${need[*]}"
  apt_wait $SUDO apt-get -o DPkg::Lock::Timeout=60 update -qq
  apt_wait $SUDO env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=60 install -y -qq "${need[@]}"
fi
[ "${1:-}" = system ] && exit 0

# Say so before pip does, and before any package is blamed for it: every pip install
# below would fail the same way.
if externally_managed; then
  echo "error: $PY ($($PY -c 'import sys; print(sys.executable)')) is the system's Python, which pip may not install into (PEP 668, \"externally-managed-environment\")." >&2
  echo "Make a virtual environment and install into it (the system packages are in place):" >&2
  echo "  python3 -m venv .venv && . .venv/bin/activate && bash .ci/install.sh${1:+ $1}" >&2
  echo "or, without activating it: PYTHON=.venv/bin/python bash .ci/install.sh${1:+ $1}" >&2
  exit 1
fi

PIP="$PY -m pip install -q --disable-pip-version-check"
# PyTorch is optional for the library; the benchmark's baselines and the torch
# tests use it. 2.13.0 (CPU) is pinned so that a build already present is
# reused: an unpinned torch would be a multi-GB CUDA download.
if [ "${1:-}" = test ]; then
  # the tests need torch: without the pin, the `test` extra would pull the CUDA build
  $PIP "torch==2.13.0"
  TOKENFEED_TEST_HOOKS=1 $PIP -e ".[test]"
else
  # tokenfeed first: a failure there is reported as its own, not as torch's
  $PIP -e .
  if ! out=$($PIP "torch==2.13.0" 2>&1); then
    printf '%s\n' "$out" | tail -n 3 >&2
    echo "warning: PyTorch 2.13.0 (CPU) did not install (pip's last lines above): tokenfeed is installed and works without it (NumPy batches); torch tensors, the DataLoader adapters and the benchmark's torch baselines need it" >&2
  fi
fi
# One line that says what this build has (pip hides the build's own output).
$PY -c 'import tokenfeed; print("tokenfeed", tokenfeed.__version__, "built:", tokenfeed.build_info()["build"])'
