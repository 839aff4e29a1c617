#!/usr/bin/env bash
# `make gpu-check`: every GPU check in one script, for a fresh GPU machine that has torch (CUDA),
# nvcc and NCCL preinstalled and no network. It builds against that torch (no virtual environment),
# runs the GPU tests, the kernel benchmark and the GPU rows of the all-reduce benchmark, and writes
# everything to $RESULTS (default gpu-check-results/). Budget: under 8 minutes.
set -u -o pipefail
cd "$(dirname "$0")/.."
RESULTS=${RESULTS:-gpu-check-results}
mkdir -p "$RESULTS"
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

step() { printf '\n== %s (%s)\n' "$1" "$(date -u +%H:%M:%S)"; }

{
  step "machine"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
  "$PY" -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"

  step "build against the installed torch"
  RINGREDUCE_FORCE_CUDA=1 MAX_JOBS="$(nproc)" timeout 420 "$PY" setup.py -q build_ext --inplace || exit 1
  "$PY" -c "import ringreduce; print(ringreduce.build_info())" || exit 1

  step "GPU tests"
  timeout 240 "$PY" -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/test_interop.py

  step "kernel benchmark"
  timeout 150 "$PY" benchmarks/kernel_bench.py --json "$RESULTS/kernel_bench.json"

  step "all-reduce benchmark: 4 virtual ranks on one GPU, ring in one and two lanes beside the default"
  timeout 180 "$PY" -m ringreduce.bench --gpu only --world 4 --sizes 1M,16M,64M,256M --lanes 1,2 --progress 0 \
    --json "$RESULTS/bench_gpu.json"
  step "done"
} 2>&1 | tee "$RESULTS/gpu-check.txt"
