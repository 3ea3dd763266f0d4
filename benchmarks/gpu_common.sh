# Sourced by the device scripts (gpu_first_run.sh, gpu_speed_run.sh): the clock, the wheels
# the GPU host lacks, and `step`, which runs one command under its budget. Expects OUT,
# TOTAL and RESERVE (seconds) set by the caller; sets SRC, PY, T0 and PYTHONPATH.
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WHEELS=${WHEELS:-$SRC/../whl}
SITE=${SITE:-/tmp/gpu_run_site}
PY=${PYTHON:-python3}
SCALE=${SCALE:-1}  # Budgets x this: a CPU dry run compiles slower than the GPU host.
mkdir -p "$OUT"
# Seconds since boot: a monotonic clock (`date` steps when the host's clock is set).
now() { local up; read -r up _ < /proc/uptime; echo "${up%.*}"; }
T0=$(now)
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=1
# The launcher's share of GPU memory (accelerator.GPU_MEMORY_FRACTION), which the compile
# mode's verdict assumes too.
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.9}

# The packages the GPU host lacks (grain, array_record, ml-collections, tensorboardX,
# portpicker, importlib_resources) and our pinned flax/optax/orbax-checkpoint (and the
# tensorstore it was tested with), so that only jax differs from CI; ahead of the host's
# own on PYTHONPATH. No wheels (a CPU dry run in this project's venv): nothing to install.
install_wheels() {
  local log=$1
  if ! ls "$WHEELS"/*.whl > /dev/null 2>&1; then
    echo "=== no wheels in $WHEELS: using the installed packages" >> "$log"
    return
  fi
  {
    echo "=== $(date -u +%FT%TZ) installing $(ls "$WHEELS" | wc -l) wheels from $WHEELS"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" "$WHEELS"/*.whl 2>&1 | grep -v "^WARNING: Target directory" || true
  } >> "$log" 2>&1
}

# detect_chip: h100 | h200 | other, from the first GPU's name as nvidia-smi prints it (an
# H200 is the H100's die with 141 GB of HBM3e at 4.8 TB/s: the report and the refit price
# its steps at its own bandwidth).
detect_chip() {
  local name
  name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  case "$name" in
    *H200*) echo h200 ;;
    *H100*) echo h100 ;;
    *) echo other ;;
  esac
}

# step FILE BUDGET COMMAND...: appends the command's output to $OUT/FILE as it comes, under
# `timeout` at BUDGET seconds or what is left before the deadline (TOTAL seconds after the
# start, less RESERVE for the report), whichever is less; skipped when under 10 s is left.
# A FILE named *report* may use the reserve.
step() {
  local file=$1 budget=$(($2 * SCALE))
  shift 2
  local start left
  start=$(now)
  left=$((T0 + TOTAL - RESERVE - start))
  [[ $file == *report* ]] && left=$((T0 + TOTAL - start))
  if ((left < 10)); then
    echo "=== $(date -u +%FT%TZ) skipped (+$((start - T0))s, ${left}s left): $*" \
        | tee -a "$OUT/$file"
    return
  fi
  ((budget > left)) && budget=$left
  echo "=== $(date -u +%FT%TZ) (+$((start - T0))s) budget ${budget}s: $*" | tee -a "$OUT/$file"
  set -o pipefail
  timeout -k 5 "$budget" "$@" 2>&1 | grep --line-buffered -v "cudart_stub\|^I0000\|^W0000" \
      | tee -a "$OUT/$file"
  local rc=$?
  echo "=== exit $rc after $(($(now) - start))s (124: stopped at its budget)" \
      | tee -a "$OUT/$file"
}
