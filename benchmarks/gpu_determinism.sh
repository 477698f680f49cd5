#!/usr/bin/env bash
# A GPU run resumed mid-way against the whole run, on a GPU shared by 8 processes, without and with
# deterministic cuBLAS (CUBLAS_WORKSPACE_CONFIG=:4096:8): how many of 8 x REPS tries match bit for bit.
# Usage: bash benchmarks/gpu_determinism.sh [REPS=3] [OUT=gpu-determinism-logs]; needs a CUDA GPU.
# Results: benchmarks/results/gpu-determinism-nvidia-h200-20261204-5853393.md
set -u
REPS=${1:-3}
OUT=${2:-gpu-determinism-logs}
mkdir -p "$OUT"
T="tests/dqn/test_nstep.py::test_a_gpu_trajectory_run_resumed_mid_way_ends_where_the_whole_run_does"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
git rev-parse --short HEAD 2>/dev/null
for variant in unset set; do
  for p in 0 1 2 3 4 5 6 7; do
    ( for r in $(seq "$REPS"); do
        # tests/conftest.py sets the variable unless it is already set: "unset" passes an empty value
        if [ $variant = set ]; then export CUBLAS_WORKSPACE_CONFIG=:4096:8; else export CUBLAS_WORKSPACE_CONFIG=; fi
        timeout 120 python3 -m pytest -m gpu "$T" -q -p no:cacheprovider -x --no-header -p no:warnings \
          > "$OUT/$variant-$p-$r.log" 2>&1
        echo "$variant process $p run $r rc=$?"
      done ) &
  done
  wait
done | sort | tee "$OUT/summary.txt"
for variant in unset set; do
  echo "$variant: $(grep -c "^$variant .* rc=0" "$OUT/summary.txt") of $(grep -c "^$variant " "$OUT/summary.txt") equal"
done
