#!/usr/bin/env bash
# Execute every tutorial on the GPU machine, in one call; what comes back is three files (the
# device returns at most 8): the GPU's description, the runner's log, and one tar with the
# executed notebooks and tutorial_timings.json, written even when the run fails or times out.
#
#   bash tools/tutorials/run_on_gpu.sh "$OUT" [report|strict] [NAME ...]   (from the repository root)
#
# NAME picks tutorials (00_quickstart, 08_which_allocator_setting ...); all by default.
# `report` sets TUTORIAL_CLAIMS=report: a failed claim prints "✗ CLAIM FAILED" and the notebook
# goes on, so a first run at new code lists every claim to revisit. Without it a failed claim
# stops its notebook (the others still run) and the exit status is 1. The Jupyter packages come
# from the wheelhouse in .whl (../shared/tools/gpu-wheelhouse .whl jupytext dask distributed,
# carried with the working tree), installed into /tmp/site here unless that is done already.
set -u
out=${1:?usage: run_on_gpu.sh OUT [report|strict] [NAME ...]}
mode=${2:-strict}
shift $(( $# < 2 ? $# : 2 ))
work=/tmp/gpumem_tutorials
rm -rf "$work" && mkdir -p "$work" "$out"
export PYTHONUNBUFFERED=1 GPUMEM_NB_CONFIG=/tmp/gpumem_nb_tutorials.json
if [ -d .whl ] && [ ! -d /tmp/site ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl > "$out/install.log" 2>&1 || { tail -20 "$out/install.log"; exit 2; }
  rm -f "$out/install.log"
fi
export PYTHONPATH="$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}" PATH="/tmp/site/bin:$PATH"
python3 -m ipykernel install --user --name python3 > /dev/null
if [ "$mode" = report ]; then export TUTORIAL_CLAIMS=report; fi
{ nvidia-smi --query-gpu=index,name,driver_version,memory.total,mig.mode.current --format=csv
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
} > "$out/gpu.txt" 2>&1
# 00-08 took about 200 s there at efadd2a; with the review's new cells about 300 s, and 09-12
# about 250 s (estimates): run them as two calls (CONTRIBUTING.md, "Executing the tutorials on the GPU machine"). Both bounds count from this script's
# start, the wheel install and the kernel registration included: no notebook starts after
# 400 s, and everything is stopped at 480 s (the device allows 600 s a command), leaving time
# for the tar.
# TUTORIAL_START_BY_S and TUTORIAL_STOP_AT_S move both bounds (all 13 in one call: 520 and 580).
start_by_s=${TUTORIAL_START_BY_S:-400}; stop_at_s=${TUTORIAL_STOP_AT_S:-480}
budget_s=$(( start_by_s - SECONDS )); limit_s=$(( stop_at_s - SECONDS ))
timeout -k 10 "$limit_s" python3 tools/tutorials/run_tutorials.py --budget-s "$budget_s" "$work" "$@" \
  > "$out/tutorials.log" 2>&1
status=$?
if [ "$status" = 124 ] || [ "$status" = 137 ]; then
  echo "run_on_gpu.sh: stopped at $stop_at_s s; the notebook running then was not saved" \
    >> "$out/tutorials.log"
fi
tar cf "$out/tutorials.tar" -C "$work" .
tail -25 "$out/tutorials.log"
exit $status
