#!/usr/bin/env bash
# Everything the GPU machine has to say, in one call: GPU tests, benchmarks, the widget check,
# and the tutorials executed with their outputs. At most 8 files come back, so JSON results are
# bundled into one tar.
# Usage there (after installing the wheelhouse): bash benchmarks/run_on_gpu.sh "$OUT" [--trace]
set -u
out=${1:-/tmp/gpu_out}
mkdir -p "$out" /tmp/bench
export PYTHONUNBUFFERED=1 BENCH_OUT=/tmp/bench GPUMEM_NB_CONFIG=/tmp/gpumem_nb.json
{ nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv
  python3 -c "import torch; print('torch', torch.__version__)"; } 2>&1 | tee "$out/gpu.txt"
# Real workloads under the three allocators (issue 15), at most 295 s; tests/gpu's
# test_diagnosis_gpu.py then asserts on these rows instead of running them again.
timeout 320 python3 benchmarks/gpu_diagnosis.py --out /tmp/bench 2>&1 | tail -40 \
  | tee -a "$out/bench.log"
export GPUMEM_NB_DIAGNOSIS_JSON=/tmp/bench/diagnosis_h200.json
# empty_cache's estimate against its real drop, per backend (three fresh processes, <= 150 s).
OUT=/tmp/bench timeout 160 python3 benchmarks/gpu_emptycache.py 2>&1 | tail -6 \
  | tee -a "$out/bench.log"
# Every test marked gpu, tests/gpu and the torch-needing ones beside it (benchmarks/gpu_tests.sh).
bash benchmarks/gpu_tests.sh all "$out"
# bench_widget.py needs no GPU (it replays a trace); it runs on the development machine.
for b in bench_sources bench_hooks bench_who bench_graph gpu_widget_check; do
  timeout 300 python3 "benchmarks/$b.py" 2>&1 | tee -a "$out/bench.log"
done
# Per-cell cost in real kernels, cells 0.2 s apart (issue 9); about 3 minutes.
timeout 400 python3 benchmarks/bench_kernel.py --rounds 3 --cells 60 --tensors 1000 --train \
  2>&1 | tee -a "$out/bench.log"
if [ "${2:-}" = "--trace" ]; then
  python3 benchmarks/record_h200_session.py /tmp/bench/h200_session.json 2>&1 | tee -a "$out/bench.log"
fi
tar cf "$out/bench.tar" -C /tmp/bench .
# The executed tutorials come back as one tar (nine notebooks would pass the 8-file limit).
mkdir -p /tmp/nbout
timeout 540 python3 tools/tutorials/run_tutorials.py --budget-s 400 /tmp/nbout 2>&1 | tail -40 \
  | tee -a "$out/bench.log"
tar cf "$out/tutorials.tar" -C /tmp/nbout .
ls -la "$out"
