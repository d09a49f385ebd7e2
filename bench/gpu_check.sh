#!/usr/bin/env bash
# The one prepared GPU check, for a device machine with an NVIDIA GPU (Hopper, e.g. H200) and no
# network. Its image already holds torch, triton, pybind11, scikit-build-core, numba, sympy,
# safetensors, tqdm, matplotlib, pytest and hypothesis, so nothing is downloaded: wtc (its CPU
# module wtc._C; the GPU kernels are Triton, compiled at first use) is built in place against them.
# Then the tests that exercise native, backend-choice and GPU paths run without the Triton
# interpreter (CUDA tests skip themselves elsewhere, so these are the same files CI runs; the
# Triton kernel tests run compiled), then the GPU benchmarks: the Triton
# kernels vs eager and torch.compile, the DT training step with kernels on, the per-weight scan.
# Everything is logged to $OUT (or bench/results/gpu/). Budget: about 5 minutes on a warm image;
# each step has its own timeout so a slow one cannot eat the rest.
#
#   device run:  bash bench/gpu_check.sh          (timeout_s ~420 leaves room to rerun)
set -uo pipefail
OUT=${OUT:-bench/results/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
PY=python3
step() { echo; echo "=== $1 ($(date -u +%H:%M:%S))"; }
{
  step "machine"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
  nproc

  step "build wtc (wtc._C)"
  timeout 150 $PY -m pip install -q --no-build-isolation --no-deps --no-cache-dir -e . \
      || { echo "BUILD FAILED"; exit 1; }
  $PY -m wtc backends

  step "tests (GPU paths included, Triton kernels compiled, no interpreter)"
  timeout 150 $PY -m pytest -q -m "not slow" -p no:cacheprovider \
      tests/test_kernels.py tests/test_backend.py tests/test_native.py tests/test_dt_model.py tests/test_ablate.py

  step "bench: Triton kernels vs eager and torch.compile (compile only at B=4096, T=64)"
  timeout 170 $PY -m bench.kernels --compile-at 4096x64 | tee "$OUT/kernels.md"
  cp bench/results/kernels.csv "$OUT/" 2>/dev/null || true

  step "bench: DT training step, eager / compile / Triton kernels"
  timeout 80 $PY bench/train_step.py --device cuda --steps 20
  cp bench/results/train_step_gpu.csv "$OUT/" 2>/dev/null || true

  step "bench: per-weight scan on the GPU (torch path) vs the naive loop"
  timeout 90 $PY -m bench.ablation --device cuda --naive 16 --sample 2048
  cp bench/results/ablation_cuda.csv "$OUT/" 2>/dev/null || true

  step "done"
} 2>&1 | tee "$OUT/gpu_check.log"
