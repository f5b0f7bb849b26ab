#!/usr/bin/env bash
# The checks that need a CUDA GPU, which CI does not have. On a machine with one and
# a CUDA build of PyTorch (no network needed):
#
#   bash tests/gpu/run.sh [RESULTS_DIR]      # default RESULTS_DIR: build/gpu
#
# 1. builds tokenfeed into build/gpu-site (an install of its own, nothing else touched);
# 2. runs the tests marked `gpu` (tests/device/test_device.py): they must pass, not skip; the
#    data-wait meter's tests print its host and GPU figures beside CUDA events of their own;
# 3. links the C/CUDA trainer of the C API guide (docs/examples/device_train.c) against
#    the real libcudart and checks, through tests/c/test_device.c, that what the GPU saw
#    is the CPU loader's stream, with and without static buffers, and that resume gives
#    the same batch;
# 4. runs benchmarks/gpu_feed.py (host-to-device throughput; GPT-2 small training steps
#    fed by tokenfeed, the nanoGPT loop and a DataLoader) with GPU_FEED_ARGS, writing
#    RESULTS_DIR/gpu_feed.json.  GPU_CHECKS=tests skips it, GPU_CHECKS=bench runs only it;
# 5. where torchtitan is installed and imports under this PyTorch: torchtitan's whole Trainer
#    fed by tokenfeed, stopped after a checkpoint and resumed, with every resumed step's loss
#    compared to the uninterrupted run's (tests/gpu/titan_trainer.py, RESULTS_DIR/titan.json).
#    GPU_CHECKS=trainer runs only this.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
RES=${1:-$ROOT/build/gpu}
PY=${PYTHON:-python3}
WHAT=${GPU_CHECKS:-all}
mkdir -p "$RES"
cd "$ROOT"

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$RES/gpu.txt"
"$PY" -c "import torch; assert torch.cuda.is_available(), 'PyTorch sees no CUDA GPU'; \
print('torch', torch.__version__, 'CUDA', torch.version.cuda, torch.cuda.get_device_name(0))" | tee -a "$RES/gpu.txt"
lscpu | sed -n 's/^Model name: *//p' | tee -a "$RES/gpu.txt"

SITE=$ROOT/build/gpu-site
rm -rf "$SITE"
# a test build (TOKENFEED_TEST_HOOKS=1): the meter's data-bound test holds the engine back with
# a hook; the hooks cost nothing unless their environment variables are set
TOKENFEED_TEST_HOOKS=1 "$PY" -m pip install -q --no-build-isolation --no-deps --target "$SITE" .
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
"$PY" -c "import json, tokenfeed; print('tokenfeed', tokenfeed.__version__, json.dumps(tokenfeed.build_info()))" \
    | tee -a "$RES/gpu.txt"

if [ "$WHAT" != bench ] && [ "$WHAT" != trainer ]; then
    echo "== tests marked gpu"
    "$PY" -m pytest -q -s -p no:cacheprovider -m gpu -rs tests/device/test_device.py 2>&1 | tee "$RES/pytest-gpu.txt"
    if grep -qi "skipped" "$RES/pytest-gpu.txt" || ! grep -q "passed" "$RES/pytest-gpu.txt"; then
        echo "the GPU tests did not all run" >&2
        exit 1
    fi

    echo "== the C/CUDA trainer example against the real CUDA runtime"
    make -s -C csrc -j"$(nproc)" lib ../build/c/test_device ../build/c/libcudart_double.so \
        ../build/c/cuda_double/libcudart.so.12
    CUDART=$("$PY" - <<'PYEOF'
import glob, os, torch
torch.zeros(1, device="cuda")  # loads the runtime torch uses
for line in open("/proc/self/maps"):
    p = line.split()[-1]
    if "libcudart.so" in os.path.basename(p):
        print(p); break
else:
    cands = sorted(glob.glob("/usr/local/cuda*/lib64/libcudart.so.*"))
    print(cands[-1] if cands else "")
PYEOF
)
    [ -n "$CUDART" ] || { echo "no libcudart found" >&2; exit 1; }
    echo "CUDA runtime: $CUDART" | tee -a "$RES/gpu.txt"
    cc -O2 -std=c11 -Wall -Icsrc/include docs/examples/device_train.c -Lbuild/c -ltokenfeed \
        -Wl,-rpath,"$ROOT/build/c" "$CUDART" -Wl,-rpath,"$(dirname "$CUDART")" -o build/gpu-device-train
    TF_TEST_EXAMPLE_TRAINER=$ROOT/build/gpu-device-train build/c/test_device example_trainer 2>&1 \
        | tee "$RES/c-example.txt"
    "$PY" -c "
import numpy as np, tokenfeed
rng = np.random.default_rng(0)
with tokenfeed.DatasetWriter('build/gpu-example-ds', vocab_size=50257, overwrite=True) as w:
    for _ in range(20000):
        w.add_document(rng.integers(0, 50257, int(rng.integers(50, 2000)), dtype=np.uint16))"
    for mode in slots static; do
        build/gpu-device-train build/gpu-example-ds 2000 $mode 2>&1 | tee -a "$RES/c-example.txt"
    done
fi

if [ "$WHAT" = all ] || [ "$WHAT" = bench ]; then
    echo "== benchmarks/gpu_feed.py"
    # shellcheck disable=SC2086
    PYTHONUNBUFFERED=1 "$PY" benchmarks/gpu_feed.py --data-dir "$ROOT/build" --json "$RES/gpu_feed.json" \
        ${GPU_FEED_ARGS:-} 2>&1 | tee "$RES/gpu_feed.txt"
fi
if [ "$WHAT" = all ] || [ "$WHAT" = trainer ]; then
    echo "== torchtitan's Trainer fed by tokenfeed, stopped and resumed"
    # torchtitan releases follow PyTorch closely: a torchtitan newer than this PyTorch fails
    # at import, which is reported here rather than as a failure of tokenfeed.
    if why=$("$PY" -c "import torchtitan.train" 2>&1); then
        "$PY" tests/gpu/titan_trainer.py "$ROOT/build/gpu-titan" 2>&1 | tee "$RES/titan.txt"
        cp "$ROOT/build/gpu-titan/titan.json" "$RES/"
    else
        echo "not run: torchtitan does not import under this PyTorch: $(echo "$why" | tail -1)" \
            | tee "$RES/titan.txt"
    fi
fi
echo "GPU checks done: $RES"
