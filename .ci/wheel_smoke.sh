#!/usr/bin/env bash
# Install the wheel for this machine from dist/ (made by .ci/wheel.sh) into a fresh virtual
# environment (build/wheel-venv: no system site-packages, nothing but the wheel
# and numpy) and run .ci/wheel_smoke.py there, from outside the source tree.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# the wheel for this machine and this Python
whl=$(ls dist/tokenfeed-*-"$($PY -c 'import sys; print("cp%d%d" % sys.version_info[:2])')"-*"$(uname -m)".whl)
VENV=build/wheel-venv
$PY -m venv --clear "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "$whl"
echo "installed $whl ($(du -k "$whl" | cut -f1) KiB)"
repo=$PWD
(cd "$(mktemp -d)" && "$repo/$VENV/bin/python" "$repo/.ci/wheel_smoke.py" "$repo" &&
  "$repo/$VENV/bin/python" -m tokenfeed build-info)
