#!/usr/bin/env bash
# The first run on a real GPU (issue 43), as one call of about 8 minutes: each step in its
# own process under `timeout`, each writing its own file under $OUT as it goes, so a step
# that fails or overruns never stops the next. Each step's budget (seconds) is cut to what
# is left before the deadline (TOTAL, 505 s; the report keeps its last 20 s):
#
#   0_env.log        15  nvidia-smi; python, jax, jaxlib, flax, optax, torch versions; devices
#   1_attention.log 100  cuDNN (bf16, fp16) and XLA (bf16, f32) vs the einsum reference:
#                        outputs and dq/dk/dv, causal/padded/packed/windowed/GQA/MQA
#                        (benchmarks/attention_parity.py; a ROW json line per case)
#   2_train.log  100+80  the project's train step (benchmarks/gpu_train_step.py), bf16:
#            (+60+80)    gpt_small 1024 `auto` at 128 rows, `xla` at 64; after step 3, `auto`
#                        at 32 (torch's batch) and llama:1b 16 x 2048. Each halves its batch
#                        once on OOM. RESULT json lines: ms/step, tokens/s, MFU vs 989 TFLOP/s,
#                        the compiled step's memory analysis, memory_stats() peak, the
#                        custom-call kernels
#   3_torch.log     100  PyTorch GPT-2 small, 32 x 1024, bf16 autocast, SDPA flash, eager then
#                        torch.compile (bounded at 70 s) (benchmarks/torch_gpt2.py; RESULT lines)
#   4_report.log     15  the tables: JAX vs PyTorch tokens/s, MFU, the compile mode's deviceless
#                        estimate (benchmarks/gpu_estimates.json) vs the device's memory
#   5_decode.log  25+25  cached decoding tokens/s at batch 1 and 64 (benchmarks/decoding_speed.py)
#                        in what time is left
#
# On the device (the lead's checkout carries .gpu/ = this branch's files under src/ and the
# wheels the GPU host lacks under whl/):
#   bash .gpu/src/benchmarks/gpu_first_run.sh
# Here, the same steps at tiny shapes on the CPU (a dry run of the script and the helpers):
#   OUT=/tmp/dry WHEELS=/work/main/.gpu/whl bash benchmarks/gpu_first_run.sh --dry-run
set -u
DRY=0
[[ "${1:-}" == "--dry-run" ]] && DRY=1
OUT=${OUT:-/tmp/gpu_first_run}
TOTAL=${TOTAL:-505}  # Seconds for everything: the call's timeout_s (540) less a margin.
RESERVE=20  # Seconds kept for the report (step 4) at the end.
((DRY)) && SCALE=${SCALE_DRY:-5} && TOTAL=$((TOTAL * SCALE))
# shellcheck source=benchmarks/gpu_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu_common.sh"
install_wheels "$OUT/0_env.log"
export PYTHONPATH="$SITE:$SRC"
cd "$SRC" || exit 1

if ((DRY)); then
  PARITY=(--allow_cpu --length=128 --batch=1)
  TRAIN=(--tiny --seq_len=128 --warmup=1 --rounds=2 --steps=2)
  TORCH=(--tiny --batch=2 --seq_len=64 --warmup=1 --rounds=2 --steps=2 --compile_budget=30)
  DECODE=(--new_tokens=16 --repeats=1 --sentences=2)
  GS_AUTO=4 GS_XLA=4 GS_32=2 LLAMA=2 LLAMA_LEN=128
else
  PARITY=(--length=1024 --batch=2)
  TRAIN=(--seq_len=1024 --warmup=2 --rounds=5 --steps=3)
  TORCH=(--batch=32 --seq_len=1024 --compile_budget=70)
  DECODE=(--new_tokens=256 --repeats=3)
  # The largest power-of-two batches the compile mode's deviceless verdict fits in 0.9 of
  # an H100 (benchmarks/gpu_estimates.json); 32 = the PyTorch side's batch.
  GS_AUTO=128 GS_XLA=64 GS_32=32 LLAMA=16 LLAMA_LEN=2048
fi

# In order of what matters most if time runs short: parity, the two gpt_small steps, the
# PyTorch side, gpt_small at PyTorch's batch, llama, then the report and decoding.
step 0_env.log 15 bash -c "nvidia-smi || echo no nvidia-smi; \"$PY\" benchmarks/gpu_first_run_report.py --env"
step 1_attention.log 100 "$PY" benchmarks/attention_parity.py "${PARITY[@]}" --json=-
step 2_train.log 100 "$PY" benchmarks/gpu_train_step.py --config=configs/gpt_small.py \
    --batch=$GS_AUTO "${TRAIN[@]}" --set model.attention_impl=auto --label=gpt_small_auto
step 2_train.log 80 "$PY" benchmarks/gpu_train_step.py --config=configs/gpt_small.py \
    --batch=$GS_XLA "${TRAIN[@]}" --set model.attention_impl=xla --label=gpt_small_xla
step 3_torch.log 100 "${TORCH_PY:-$PY}" benchmarks/torch_gpt2.py "${TORCH[@]}"
step 2_train.log 60 "$PY" benchmarks/gpu_train_step.py --config=configs/gpt_small.py \
    --batch=$GS_32 "${TRAIN[@]}" --set model.attention_impl=auto --label=gpt_small_auto_32
step 2_train.log 80 "$PY" benchmarks/gpu_train_step.py --config=configs/llama.py:1b \
    --batch=$LLAMA "${TRAIN[@]}" --seq_len=$LLAMA_LEN --rounds=3 --steps=3 --label=llama_1b
step 4_report.log 15 "$PY" benchmarks/gpu_first_run_report.py --out="$OUT" \
    --estimates=benchmarks/gpu_estimates.json
step 5_decode.log 25 "$PY" benchmarks/decoding_speed.py --batch=1 "${DECODE[@]}"
step 5_decode.log 25 "$PY" benchmarks/decoding_speed.py --batch=64 "${DECODE[@]}"
cat "$OUT/4_report.log"  # The tables again, last: the end of the call's output holds them.
echo "=== done in $(($(now) - T0))s; files: $(ls "$OUT" | tr '\n' ' ')"
