#!/usr/bin/env bash
# Everything the GPU machine has to say, in one call: GPU tests, benchmarks, the demo trace.
# Usage there (after installing the wheelhouse): bash benchmarks/run_on_gpu.sh "$OUT"
set -u
out=${1:-/tmp/gpu_out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 BENCH_OUT="$out/bench"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee "$out/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__)" | tee -a "$out/gpu.txt"
python3 -m pytest -m gpu tests/gpu -v -s -p no:cacheprovider 2>&1 | tee "$out/gpu_tests.log"
for b in bench_sources bench_hooks bench_who; do
  python3 "benchmarks/$b.py" 2>&1 | tee -a "$out/bench.log"
done
python3 benchmarks/record_h200_session.py "$out/h200_session.json" 2>&1 | tee -a "$out/bench.log"
