#!/usr/bin/env bash
# The one prepared GPU check, for a device machine with an NVIDIA GPU (Hopper, e.g. H200) and no
# network. Its image already holds torch, triton, pybind11, scikit-build-core, numba, sympy,
# safetensors, tqdm, matplotlib, pytest and hypothesis, so nothing is downloaded: wtc (its CPU
# module wtc._C; the GPU kernels are Triton, compiled at first use) is built in place against them.
# Then the tests that exercise native, backend-choice and GPU paths run without the Triton
# interpreter, one file at a time (a crash in one file does not hide the others), then the GPU
# benchmarks and an end-to-end discover on the GPU. Everything is logged to $OUT (or
# bench/results/gpu/). Each section has its own timeout so a slow one cannot eat the rest.
#
#   device run:  bash bench/gpu_check.sh                       (every section; ~5-6 min warm)
#                GPU_CHECK_ONLY="build native tests" bash bench/gpu_check.sh   (a rerun of some)
#                GPU_CHECK_TESTS="tests/test_graph_step.py" ...                 (some test files only)
# Sections: build native tests kernels train_step profile ablation discover screen (screen_exact: not
# run by default, ~5 min). Measured on an H200 (2026-12-04, bench/RESULTS.md "GPU"): build 22 s,
# kernels ~70 s, ablation ~90 s; screen not yet run on a GPU (its timeouts add up to 7.5 min; expected 2-4).
set -uo pipefail
OUT=${OUT:-bench/results/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
PY=python3
ONLY=${GPU_CHECK_ONLY:-build native tests kernels train_step profile ablation discover screen}
want() { [[ " $ONLY " == *" $1 "* ]]; }
step() { echo; echo "=== $1 ($(date -u +%H:%M:%S))"; }
{
  step "machine"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
  nproc; gcc --version | head -1

  if want build; then
    step "build wtc (wtc._C)"
    timeout 150 $PY -m pip install -q --no-build-isolation --no-deps --no-cache-dir -e . \
        || { echo "BUILD FAILED"; exit 1; }
    $PY -m wtc backends
  fi

  if want native; then
    # a C++ exception crossing into Python (a shape error) must be a ValueError, with and without
    # torch loaded first; if it crashes, say why (below)
    step "native: C++ errors reach Python as ValueError"
    diag() {
      for first in "" "import torch;"; do
        timeout 60 $PY -c "$first
import numpy as np, wtc._C as C
z = np.zeros
args = [z(s, np.float32) for s in ((1, 2, 3), (1, 2, 4), (1, 2, 5), (1, 3), (1, 3), (1, 2, 2), (1, 2), (1, 4), (1, 4))]
try:
    C.route_hard(*args, 1)
except ValueError as e:
    print('ok (${first:-no torch}):', e)" || { echo "CRASHED (${first:-no torch}), status $?"; return 1; }
      done
    }
    so=$($PY -c 'import wtc._C as C; print(C.__file__)')
    ldd "$so" | grep -E "gomp|stdc|gcc_s" || true
    if ! diag; then
      # say why: the build's compiler and flags, the module's dynamic section, a backtrace of the
      # crash (cuda-gdb debugs host code too), and whether a bare pybind11 module that throws
      # crashes the same way (then it is the toolchain, not wtc)
      step "native: why it crashes"
      env | grep -iE "^(CC|CXX|CFLAGS|CXXFLAGS|LDFLAGS|CMAKE[A-Z_]*)=" || echo "(no compiler variables set)"
      grep -hE "^(CMAKE_CXX_COMPILER|CMAKE_CXX_FLAGS|CMAKE_CXX_FLAGS_RELEASE|CMAKE_SHARED_LINKER_FLAGS|CMAKE_MODULE_LINKER_FLAGS|pybind11_DIR|CMAKE_INTERPROCEDURAL_OPTIMIZATION):" build/*/CMakeCache.txt
      $PY -c "import pybind11, numpy; print('pybind11', pybind11.__version__, 'numpy', numpy.__version__)"
      readelf -d "$so" | grep -E "NEEDED|FLAGS" || true
      cat > /tmp/native_diag.py <<'PYEOF'
import numpy as np, wtc._C as C
z = np.zeros
args = [z(s, np.float32) for s in ((1, 2, 3), (1, 2, 4), (1, 2, 5), (1, 3), (1, 3), (1, 2, 2), (1, 2), (1, 4), (1, 4))]
try:
    C.route_hard(*args, 1)
except ValueError as e:
    print("ok:", e)
PYEOF
      timeout 90 cuda-gdb -q -batch -ex run -ex bt --args $PY /tmp/native_diag.py 2>&1 | grep -vE "^\[(New|Thread|Detaching)" | tail -30
      printf '%s\n' '#include <pybind11/pybind11.h>' '#include <stdexcept>' \
        'int boom(int x) { if (x > 0) throw pybind11::value_error("boom"); return x; }' \
        'PYBIND11_MODULE(bare_throw, m) { m.def("boom", &boom); }' > /tmp/bare_throw.cpp
      for extra in "" "-static-libstdc++" "-fopenmp"; do
        g++ -O2 -shared -fPIC -std=c++17 $extra $($PY -m pybind11 --includes) /tmp/bare_throw.cpp \
            -o /tmp/bare_throw$($PY -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))') \
          && (cd /tmp && timeout 30 $PY -c "
import bare_throw
try:
    bare_throw.boom(1)
except ValueError as e:
    print('bare pybind11 module (${extra:-plain}): ValueError', e)") || echo "bare pybind11 module (${extra:-plain}): FAILED (build, or crashed: status $?)"
      done
    fi
  fi

  if want tests; then
    step "tests (GPU paths included, Triton kernels compiled, no interpreter), one file at a time"
    for f in ${GPU_CHECK_TESTS:-tests/test_kernels.py tests/test_graph_step.py tests/test_products.py tests/test_backend.py tests/test_dt_model.py tests/test_ablate.py tests/test_native.py}; do
      echo "--- $f"
      timeout 120 $PY -m pytest -q -m "not slow" -p no:cacheprovider -q "$f" 2>&1 | grep -vE "site-packages|<frozen" | tail -40
    done
  fi

  if want kernels; then
    step "bench: Triton kernels vs eager (routing: torch.compile of the reference fails in inductor, see RESULTS)"
    timeout 150 $PY -m bench.kernels --ops routing --impls reference,triton | tee "$OUT/kernels.md"
    cp bench/results/kernels.csv "$OUT/" 2>/dev/null || true
  fi

  if want train_step; then
    step "bench: DT training step, eager / Triton kernels"
    timeout 150 $PY bench/train_step.py --device cuda --steps 60 --no-compile
    cp bench/results/train_step_gpu.csv "$OUT/" 2>/dev/null || true
  fi

  if want profile; then
    step "profile: routing at B=4096 T=64 per kernel; a DT hard-phase step, device vs wall time"
    timeout 120 $PY bench/gpu_profile.py --out "$OUT"
  fi

  if want ablation; then
    step "bench: per-weight scan on the GPU (torch path) vs the naive loop"
    # the wtc section: its model and tokens go to the GPU (the generic section's models stay on the CPU)
    timeout 120 $PY -m bench.ablation --device cuda --naive 16 --sample 2048 --section wtc
    cp bench/results/ablation_cuda.csv "$OUT/" 2>/dev/null || true
  fi

  if want discover; then
    step "end to end: wtc.discover on the GPU (DTConfig(device='cuda'), one process)"
    timeout 150 $PY - <<'PYEOF'
import time, wtc
from wtc.dt.config import DTConfig
t = time.time()
d = wtc.discover("parity_last2", seed=0, config=DTConfig(device="cuda", workers=1), progress=False)
v = d.verification
print(f"parity_last2: cuda {time.time() - t:.1f} s, accuracy {v.accuracy}, max_rel_err {v.max_rel_err}, "
      f"attempts {len(d.attempts)}")
print(d.program.source.strip().splitlines()[-3:])
PYEOF
  fi

  if want screen; then
    # issue 39 on the GPU: screen every weight of a 10M-weight wtc Transformer (d 256, 10 layers, vocab
    # 8192, 16 x 128 tokens; the image has no transformers, so not the GPT-2 of the CPU numbers) and
    # time the exact scan of a sample; then scan(..., screen=200) as a user runs it: the screen, then
    # the exact confirmation of its top 200 + 200 drawn at random (Spearman / recall on the sample)
    step "screen: GPU tests (screen and confirmation equal the CPU's), then the bench"
    $PY -c "import scipy, transformers" 2>&1 | tail -1 || true
    timeout 120 $PY -m pytest -q -p no:cacheprovider tests/test_scan_screen.py -k cuda 2>&1 | tail -5
    timeout 300 $PY -m bench.screen --device cuda --threads 8 --family wtc --models "" --throughput \
        --exact-sample 64 --confirm 200 --confirm-random 200 2>&1 | grep -vE "it/s\]|w/s\]|seq/s\]"
    cp bench/results/screen_throughput_cuda.csv bench/results/screen_confirm_cuda.csv "$OUT/" 2>/dev/null || true
    # the command as a user runs it on the GPU: a small trained model, `wtc scan --screen --device cuda`
    lm=$(mktemp -d)
    timeout 90 $PY -m wtc lm-train --layers 2 --d-model 64 --heads 4 --vocab 64 --seq-len 64 --steps 200 \
        --scan-sequences 16 --out "$lm" --quiet | tail -1
    TIMEFORMAT="wtc scan --screen 200 --device cuda: %R s wall"
    time timeout 150 $PY -m wtc scan "$lm/model" --tokens "$lm/tokens.npy" --out "$lm/scan" --screen 200 \
        --device cuda --quiet
    cp "$lm/scan/summary.json" "$OUT/screen_cli_summary.json" 2>/dev/null || true
  fi

  if want screen_exact; then
    # the accuracy table of bench/RESULTS.md "Session 22" with everything on the GPU: the exact scan of
    # every matrix weight of the small wtc model (~30k weights), then screens k=1,4,16 against it
    step "screen_exact: every weight of the small wtc model scanned exactly on the GPU, screens compared"
    timeout 240 $PY -m bench.screen_models --device cuda --npz "$OUT/screen_exact" wtc 2>&1 | grep -vE "w/s\]" | tail -3
    timeout 120 $PY -m bench.screen --device cuda --threads 8 --models wtc --exact-dir "$OUT/screen_exact" \
        2>&1 | grep -vE "seq/s\]"
    rm -rf "$OUT/screen_exact/exact_wtc"          # the store (large); the totals stay in exact_wtc.npz
    cp bench/results/screen_cuda.csv "$OUT/" 2>/dev/null || true
  fi

  step "done"
} 2>&1 | tee "$OUT/gpu_check.log"
