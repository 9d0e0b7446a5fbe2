#!/usr/bin/env bash
# The suite's version-dependent tests on the versions users run besides CI's own:
#   - Colab's stack: IPython 7.34.0 with ipykernel 5.5.6, and with ipykernel 6.17.1, and
#     ipywidgets 8.1 (each in a venv of its own, on the python3 that runs this);
#   - Python 3.12 and 3.13, where an interpreter exists (pyenv's, or on PATH); where none
#     does, the row says so and the matrix goes on.
# Run from the README's test command (CI reads it verbatim) and by hand:
#   tools/version_matrix.sh            every row
#   tools/version_matrix.sh colab5     rows whose name starts with an argument
# The tests are those whose code differs across IPython, ipykernel and Python versions: where
# a cell is found from a stack (cudastart, cleanup's saved exceptions, hostile exceptions,
# trace sites), the cell hooks and magics, the widget, load and unload, completion, a real
# kernel, and the no-NVML devices. Not the browser, Binder or GPU tests.
# Exits non-zero when a row that ran failed; prints one line per row at the end.
set -uo pipefail
cd "$(dirname "$0")/.."

TESTS=(tests/test_cellnames.py tests/test_cudastart.py tests/test_hostile_exceptions.py tests/test_magics.py
       tests/test_oom_observer_first_cell.py tests/test_widget.py tests/test_extension.py
       tests/test_completion.py tests/test_no_nvml.py tests/test_on_cell.py
       tests/test_cleanup_properties.py tests/test_referents.py
       tests/test_trace.py tests/test_kernel.py)
# What those tests import besides gpumem_nb's own dependencies.
TEST_DEPS=(pytest hypothesis numpy pandas nbclient nbformat jupyter_client)
VENVS=${GPUMEM_MATRIX_DIR:-${TMPDIR:-/tmp}/gpumem-matrix}
mkdir -p "$VENVS"

summary=()
failed=0

find_python() {  # the newest interpreter of version $1 (3.12): pyenv's, else on PATH
  local v=$1 root cand
  for root in "${PYENV_ROOT:-}" "$HOME/.pyenv" /root/.pyenv; do
    [ -n "$root" ] || continue
    for cand in $(ls -d "$root"/versions/"$v".*/bin/python"$v" 2>/dev/null | sort -V -r); do
      [ -x "$cand" ] && { echo "$cand"; return 0; }
    done
  done
  # (a pyenv shim exists for every version, and fails for one that is not installed)
  cand=$(command -v "python$v" 2>/dev/null) && "$cand" -c '' >/dev/null 2>&1 \
    && { echo "$cand"; return 0; }
  return 1
}

row() {  # row NAME PYTHON PIP-REQUIREMENTS...
  local name=$1 py=$2; shift 2
  local venv="$VENVS/$name" log="$VENVS/$name.log"
  echo "== version matrix: $name ($py)"
  rm -rf "$venv"
  if ! "$py" -m venv "$venv" >"$log" 2>&1 \
      || ! "$venv/bin/pip" install -q "$@" "${TEST_DEPS[@]}" -e . >>"$log" 2>&1; then
    summary+=("$name: FAILED to install (see $log)")
    failed=1
    return
  fi
  local versions
  versions=$("$venv/bin/python" -c 'import sys, IPython, ipykernel, ipywidgets
print(f"Python {sys.version.split()[0]}, IPython {IPython.__version__}, "
      f"ipykernel {ipykernel.__version__}, ipywidgets {ipywidgets.__version__}")')
  "$venv/bin/python" -m pytest -q -p no:cacheprovider -m "not browser and not binder and not gpu" \
    "${TESTS[@]}" >>"$log" 2>&1
  local rc=$? result
  result=$(grep -E "^(=+ )?[0-9]+ (passed|failed)" "$log" | tail -1 | tr -d '=' | xargs)
  if [ $rc -ne 0 ]; then
    failed=1
    tail -40 "$log"
    summary+=("$name: FAILED ($versions): $result (log: $log)")
  else
    summary+=("$name: ok ($versions): $result")
  fi
}

wanted() {  # whether row $1 was asked for (every row when no argument was given)
  [ $# -eq 1 ] && return 0
  local name=$1; shift
  for a in "$@"; do [[ $name == "$a"* ]] && return 0; done
  return 1
}

COLAB=("ipython==7.34.0" "ipywidgets>=8.1,<8.2")
if wanted colab5 "$@"; then row colab5 python3 "${COLAB[@]}" "ipykernel==5.5.6"; fi
if wanted colab6 "$@"; then row colab6 python3 "${COLAB[@]}" "ipykernel==6.17.1"; fi
for v in 3.12 3.13; do
  wanted "py$v" "$@" || continue
  if py=$(find_python "$v"); then
    row "py$v" "$py"
  else
    summary+=("py$v: not run: no Python $v interpreter here (pyenv's versions/$v.* or python$v on PATH)")
  fi
done

echo "== version matrix"
printf '%s\n' "${summary[@]}"
exit $failed
