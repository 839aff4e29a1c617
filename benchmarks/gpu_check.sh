#!/usr/bin/env bash
# `make gpu-check`: every GPU check in one script, for a fresh GPU machine that has torch (CUDA),
# nvcc and NCCL preinstalled and no network. It checks its prerequisites, builds against that torch
# (no virtual environment), runs the GPU tests (multi-process NCCL ones when two or more GPUs are
# visible), the kernel benchmark and the GPU rows of the all-reduce benchmark, and writes
# everything to $RESULTS (default gpu-check-results/). Budget: 10 minutes in all (the timeouts below
# add up to it; on one H200 the whole script took under 4).
set -u -o pipefail
cd "$(dirname "$0")/.."
RESULTS=${RESULTS:-gpu-check-results}
mkdir -p "$RESULTS"
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

step() { printf '\n== %s (%s)\n' "$1" "$(date -u +%H:%M:%S)"; }

# Prints what is missing, one line each; exit status 1 when the build cannot run at all.
prerequisites() {
  local missing=0
  command -v "$PY" >/dev/null || { echo "missing: $PY (set PYTHON to a Python with torch)"; return 1; }
  "$PY" -c "import torch; assert torch.version.cuda" 2>/dev/null ||
    { echo "missing: a CUDA build of torch for $PY"; missing=1; }
  "$PY" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null ||
    { echo "missing: a visible GPU (torch.cuda.is_available() is False)"; missing=1; }
  command -v nvcc >/dev/null || [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ] ||
    { echo "missing: nvcc (not on PATH, nor in \$CUDA_HOME/bin or /usr/local/cuda/bin)"; missing=1; }
  "$PY" - <<'PYEOF' || missing=1
import os
src = open("setup.py").read().replace("\nmain()\n", "\n")
namespace = {"__file__": os.path.abspath("setup.py")}
exec(src, namespace)
if namespace["find_nccl"]() is None:
    print("missing: NCCL (nccl.h and libnccl in $NCCL_HOME, the nvidia-nccl wheel or the system folders)")
    raise SystemExit(1)
PYEOF
  "$PY" -c "import ninja" 2>/dev/null || command -v ninja >/dev/null || echo "note: ninja is missing; the build falls back to a slower serial one"
  "$PY" -c "import pytest" 2>/dev/null || echo "missing: pytest (the test steps are skipped; pip install pytest)"
  return $missing
}

{
  step "machine"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true

  step "prerequisites"
  prerequisites || { echo "gpu-check stops here: install what is missing above"; exit 1; }
  "$PY" -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.device_count(), 'x', torch.cuda.get_device_name(0))"
  GPUS=$("$PY" -c "import torch; print(torch.cuda.device_count())")

  step "build against the installed torch"
  # The distribution's compiler, whatever CXX says, unless GPU_CHECK_CXX names another: a GPU machine
  # whose environment set CXX=/opt/gcc/bin/g++ (a wrapper pairing GCC 13's headers with a libstdc++ of
  # its own) built an engine that crashed in its first std::ostream use, at import (2026-12-04);
  # /usr/bin/g++ on the same machine built one that passed every GPU test.
  compiler=${GPU_CHECK_CXX:-/usr/bin/g++}
  if [ -x "$compiler" ]; then export CXX="$compiler" CC="${compiler%g++}gcc"; fi
  echo "compiler: ${CXX:-the default} ($("${CXX:-c++}" --version 2>/dev/null | head -1))"
  RINGREDUCE_FORCE_CUDA=1 MAX_JOBS="$(nproc)" timeout 240 "$PY" setup.py -q build_ext --inplace || exit 1
  "$PY" -c "import ringreduce; print(ringreduce.build_info())" || exit 1

  if "$PY" -c "import pytest" 2>/dev/null; then
    step "tests: the kernels on host and GPU, virtual GPU ranks, the watchdog, NCCL ($GPUS GPUs)"
    timeout 150 "$PY" -m pytest -q -p no:cacheprovider tests/test_host_kernels.py tests/test_cuda.py \
      tests/test_interop.py tests/test_watchdog.py tests/test_nccl_processes.py
  fi

  step "kernel benchmark"
  timeout 45 "$PY" benchmarks/kernel_bench.py --sizes 1M,16M,64M,256M --json "$RESULTS/kernel_bench.json"

  if [ "$GPUS" -ge 2 ]; then
    step "all-reduce benchmark: NCCL across $GPUS processes, ring in one and two lanes beside torch's NCCL"
    timeout 90 "$PY" -m ringreduce.bench --gpu only --world "$GPUS" --sizes 1M,64M --lanes 1,2 --progress 0 \
      --trials 3 --json "$RESULTS/bench_gpu.json"
  else
    step "all-reduce benchmark: 4 virtual ranks on one GPU, ring in one and two lanes beside the default"
    timeout 90 "$PY" -m ringreduce.bench --gpu only --world 4 --sizes 1M,64M --lanes 1,2 --progress 0 \
      --trials 3 --json "$RESULTS/bench_gpu.json"
  fi
  step "done"
} 2>&1 | tee "$RESULTS/gpu-check.txt"
