#!/usr/bin/env bash
# The GPU suite (every test marked `gpu`, tests/gpu and the torch-needing tests beside it) on
# the GPU machine, writing pytest's log with its summary line and per-test times to
# $OUT/gpu_tests_<commit>[_<shard>].log.
#
# Usage there, from the repository root, one device call per shard (each stays under 8 min:
# a device call is capped at 10):
#   GPUMEM_COMMIT=<commit> bash benchmarks/gpu_tests.sh a "$OUT"  # diagnosis + torch tests
#   GPUMEM_COMMIT=<commit> bash benchmarks/gpu_tests.sh b "$OUT"  # cleanup, notebook, sources, OOM
#   GPUMEM_COMMIT=<commit> bash benchmarks/gpu_tests.sh c "$OUT"  # processes, trace, what-if
#   GPUMEM_COMMIT=<commit> bash benchmarks/gpu_tests.sh all "$OUT"  # both, where time allows
# The shards split by time, not by subject: at 26e06a3 tests/gpu without the diagnosis took
# 324 s and the diagnosis's workloads 163 s; 8 minutes cannot hold both. At 7818ac3 the rest
# (then one shard b) had reached 81% at 360 s, too near 8 minutes, so it is split in two.
set -u
shard=${1:-all}
out=${2:-${OUT:-/tmp/gpu_out}}
commit=${GPUMEM_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 GPUMEM_NB_CONFIG=/tmp/gpumem_nb.json
# Shard a: the diagnosis's real workloads, and the tests that need torch but no GPU of their
# own. Shard c: the child processes, the traced cells and the what-if. Shard b is everything
# else marked gpu, so a test file added later runs in b without being named here.
A=(tests/gpu/test_diagnosis_gpu.py tests/test_graph_torch.py tests/test_launchers_real.py
   tests/test_gpu_diagnosis_script.py tests/test_oom_parse.py tests/test_whatif_settings.py)
C=(tests/gpu/test_processes_gpu.py tests/gpu/test_trace_gpu.py tests/gpu/test_whatif_gpu.py)
case "$shard" in
  a) sel=("${A[@]}"); log="$out/gpu_tests_${commit}_a.log" ;;
  b) sel=(tests); for f in "${A[@]}" "${C[@]}"; do sel+=("--ignore=$f"); done
     log="$out/gpu_tests_${commit}_b.log" ;;
  c) sel=("${C[@]}"); log="$out/gpu_tests_${commit}_c.log" ;;
  all) sel=(tests); log="$out/gpu_tests_${commit}.log" ;;
  *) echo "usage: $0 a|b|c|all [OUT]" >&2; exit 2 ;;
esac
# One hung test must not eat the device call: pytest-timeout, where installed (the H200's
# venv has it), fails it after 240 s and the run goes on to its summary line.
extra=()
python3 -c "import pytest_timeout" 2>/dev/null && extra+=(--timeout=240)
# -m gpu over tests/ (not tests/gpu alone): the torch-needing tests outside tests/gpu are
# marked gpu too, and ran nowhere while the command named tests/gpu only.
python3 -m pytest -m gpu "${sel[@]}" -v -p no:cacheprovider --durations=25 "${extra[@]}" \
  2>&1 | tee "$log"
exit "${PIPESTATUS[0]}"
