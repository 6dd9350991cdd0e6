#!/bin/bash
# The GPU checks in one run, for a machine with CUDA, PyTorch, Lightning and transformers already installed (the
# workplace's device machine): the CUDA-only tests (zero host-device syncs under set_sync_debug_mode("error"): Monitor,
# the CUDA-event timing, the Lightning callback, the HF Trainer's fp16 scaler) and the GPU step overhead
# (bench/collector_overhead.py --device cuda, Monitor against TensorBoard). Writes its logs under $OUT (default ./out).
#
# Prepare, on a machine with the package registry (the device machine has none), the wheels it lacks:
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 -d .whl duckdb
# then run this from the repository root with .whl beside it:  bash bench/device_check.sh
# First run (2026-12-04, one H200): ~30 s of tests, then the overhead bench (whose data pool takes ~15 s per variant).
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/rw-site .whl/*.whl || exit 3
fi
# runwatch's stage folders as the runwatch namespace (what `pip install -e .` maps), without installing anything.
mkdir -p /tmp/rw-ns/runwatch
for d in app collectors data detectors economics; do ln -sfn "$PWD/$d" /tmp/rw-ns/runwatch/$d; done
export PYTHONPATH=/tmp/rw-site:/tmp/rw-ns:$PWD
{ nvidia-smi -L; python3 -c "import torch, lightning, transformers, duckdb; print('torch', torch.__version__,
  torch.cuda.get_device_name(), 'lightning', lightning.__version__, 'transformers', transformers.__version__)"; } \
  2>&1 | tee "$OUT/env.txt"
timeout 300 python3 -m pytest -p no:cacheprovider -rA -q -k cuda tests/collectors/test_monitor_cuda.py \
  tests/collectors/test_rank_signals.py tests/collectors/test_hf.py tests/collectors/test_lightning.py \
  2>&1 | tee "$OUT/pytest.txt" | tail -15
timeout 400 python3 bench/collector_overhead.py --device cuda --variants bare,monitor,tensorboard \
  2>&1 | tee "$OUT/overhead.txt" | tail -25
cp bench/results/collector_overhead-cuda-*.json "$OUT/" 2>/dev/null
true
