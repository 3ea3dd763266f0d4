#!/usr/bin/env bash
# Issues 47 and 55's device check on an H100 or H200 (nvidia-smi says which), as one call of
# at most TOTAL (480) seconds. Each step in its own process under `timeout`, writing its own
# file under $OUT as it goes; a step that fails or overruns never stops the next
# (gpu_common.sh). Every figure is a `RESULT {json}` line. In priority order (budgets in s):
#
#   0_env.log      10  nvidia-smi; versions; devices; RESULT chip (h100 | h200 | other)
#   2_train.log   200  gpt_small 32 x 1024, bf16, cuDNN: ms/step, tokens/s, MFU, memory, the
#                      kernels; 2 steps profiled into the compile mode's parts (PROFILE);
#                      then, in the same process, XLA's MLP and loss head
#                      (model.mlp_impl=xla, loss_head_impl=xla) against the default's
#                      Pallas kernels (the A/B of their time: no device has timed them),
#                      then fp8 (--config.model.quantization=fp8, MaxText's name): a RESULT
#                      with `skipped` where this tree's config has no such key
#   3_torch.log    70  PyTorch GPT-2 small at the same shape on the same card: eager, then
#                      torch.compile (bounded at 45 s), bf16 autocast, SDPA flash, fused AdamW
#   2_train.log   140  llama:1b 16 x 2048 (scanned, packed rows declared by its pipeline), then
#                      with XLA's MLP and loss head: the Pallas kernels' A/B on llama
#   2_train.log    80  gpt_small 32 x 1024 with MaxText's H100 XLA flag set (MAXTEXT_FLAGS
#                      below) against the default run above (jax's own flags: the benchmark
#                      does not start through launch.py, so accelerator.GPU_XLA_FLAGS are not
#                      set; on one GPU the collective flags change nothing): an A/B, the
#                      flags kept as a default only if faster here
#   5_decode.log 40+40 cached decoding tokens/s at batch 1 and 64 (benchmarks/decoding_speed.py;
#                      the report turns its table into RESULT lines)
#   4_report.log   20  benchmarks/gpu_first_run_report.py --speed: the targets (gpt_small >=
#                      1.2x torch.compile's tokens/s, llama:1b >= 45% MFU), fp8 against bf16,
#                      the flag A/B, the measured parts, and the time model refitted on the
#                      measured steps (planning/calibration.py) with each step's error before
#                      and after; the refitted data is written to $OUT/gpu_calibration.json
#
# Budgets: the first H100 run needed ~100 s for a gpt_small step (40 s of XLA compile, ~50 s
# of start-up and initialisation on that host), so the fp8 variant shares the bf16 step's
# process. A budget is a cap: a step that runs out is stopped and the next one runs. The caps
# add up to 580 s against the 460 s before the report's reserve, so the decoding steps run
# only on what the earlier ones leave (the first H100 run's decoding needed more than 25 s
# each for start-up and compilation); a step with under 10 s left is skipped, and says so.
#
# torch: the device image (/work/.library/device/KINDS.md: torch 2.11.0, jax 0.11.2 with
# jax-cuda13, nvidia-cudnn-cu13) has it. Where `import torch` fails the step prints
#   RESULT {"label": "torch_gpt2", "skipped": "torch is not importable ..."}
# and the gpt_small target is left unjudged: torch with its CUDA wheels is gigabytes, over a
# call's 64 MiB of carried files, so it cannot be carried; TORCH_PY=<python with torch>
# points the step at another interpreter.
#
# On the device (the checkout carries .gpu/ = the files under src/ and the wheels the GPU
# host lacks under whl/; docs/performance.md says how to make them):
#   bash .gpu/src/benchmarks/gpu_speed_run.sh
# Here, the same steps at tiny shapes on the CPU (a dry run of the script and its helpers):
#   OUT=/tmp/dry JAX_PLATFORMS=cpu bash benchmarks/gpu_speed_run.sh --dry-run
set -u
DRY=0
[[ "${1:-}" == "--dry-run" ]] && DRY=1
OUT=${OUT:-/tmp/gpu_speed_run}
TOTAL=${TOTAL:-480}  # The call's timeout_s (540) less a margin.
RESERVE=20  # Seconds kept for the report at the end.
((DRY)) && SCALE=${SCALE_DRY:-4} && TOTAL=$((TOTAL * SCALE))
# shellcheck source=benchmarks/gpu_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu_common.sh"
install_wheels "$OUT/0_env.log"
export PYTHONPATH="$SITE:$SRC"
cd "$SRC" || exit 1

# MaxText's GPU flag set (its H100 llama2 recipes; NVIDIA JAX-Toolbox's
# rosetta/docs/GPU_performance.md explains each): the latency-hiding scheduler, cuBLAS
# instead of Triton's gemms, loop double buffering, no rematerialization pass, pipelined
# collectives and combined ones up to 128 MiB / 1 GiB / 32 MiB.
MAXTEXT_FLAGS="--xla_gpu_enable_latency_hiding_scheduler=true \
--xla_gpu_enable_triton_gemm=false \
--xla_gpu_enable_while_loop_double_buffering=true \
--xla_disable_hlo_passes=rematerialization \
--xla_gpu_enable_pipelined_all_gather=true \
--xla_gpu_enable_pipelined_reduce_scatter=true \
--xla_gpu_enable_pipelined_all_reduce=true \
--xla_gpu_all_reduce_combine_threshold_bytes=134217728 \
--xla_gpu_all_gather_combine_threshold_bytes=1073741824 \
--xla_gpu_reduce_scatter_combine_threshold_bytes=33554432"

if ((DRY)); then
  TRAIN=(--tiny --seq_len=128 --warmup=1 --rounds=2 --steps=2)
  TORCH=(--tiny --batch=2 --seq_len=64 --warmup=1 --rounds=2 --steps=2 --compile_budget=30)
  DECODE=(--new_tokens=16 --repeats=1 --sentences=2)
  GS=2 LLAMA=2 LLAMA_LEN=128
else
  TRAIN=(--seq_len=1024 --warmup=2 --rounds=3 --steps=3)
  TORCH=(--batch=32 --seq_len=1024 --compile_budget=45)
  DECODE=(--new_tokens=256 --repeats=3)
  GS=32 LLAMA=16 LLAMA_LEN=2048
fi

# The card: H100 or H200 by nvidia-smi's name (a RESULT line; the report names it).
CHIP=$(detect_chip)
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
echo "RESULT {\"label\": \"device\", \"chip\": \"$CHIP\", \"nvidia_smi_name\": \"${GPU_NAME:-none}\"}" \
    | tee -a "$OUT/0_env.log"

step 0_env.log 10 bash -c "nvidia-smi || echo no nvidia-smi; \"$PY\" benchmarks/gpu_first_run_report.py --env"
step 2_train.log 200 "$PY" benchmarks/gpu_train_step.py --config=configs/gpt_small.py \
    --batch=$GS "${TRAIN[@]}" --profile=2 --set model.attention_impl=auto \
    --label=gpt_small_auto_32 \
    --variant=gpt_small_xla_kernels_32:model.mlp_impl=xla,model.loss_head_impl=xla \
    --variant=gpt_small_fp8_32:model.quantization=fp8
if "${TORCH_PY:-$PY}" -c "import torch" > /dev/null 2>&1; then
  step 3_torch.log 70 "${TORCH_PY:-$PY}" benchmarks/torch_gpt2.py "${TORCH[@]}"
else
  echo "RESULT {\"label\": \"torch_gpt2\", \"skipped\": \"torch is not importable by ${TORCH_PY:-$PY}: torch.compile is not measured (TORCH_PY=<a python with torch> to point elsewhere)\"}" \
      | tee -a "$OUT/3_torch.log"
fi
step 2_train.log 140 "$PY" benchmarks/gpu_train_step.py --config=configs/llama.py:1b \
    --batch=$LLAMA "${TRAIN[@]}" --seq_len=$LLAMA_LEN --rounds=2 --label=llama_1b \
    --variant=llama_1b_xla_kernels:model.mlp_impl=xla,model.loss_head_impl=xla
# The A/B's B arm; XLA refuses a flag it does not know, and the step then says so.
step 2_train.log 80 env XLA_FLAGS="${XLA_FLAGS:-} $MAXTEXT_FLAGS" \
    "$PY" benchmarks/gpu_train_step.py --config=configs/gpt_small.py --batch=$GS \
    "${TRAIN[@]}" --set model.attention_impl=auto --label=gpt_small_maxtext_flags_32
step 5_decode.log 40 "$PY" benchmarks/decoding_speed.py --batch=1 "${DECODE[@]}"
step 5_decode.log 40 "$PY" benchmarks/decoding_speed.py --batch=64 "${DECODE[@]}"
step 4_report.log 20 "$PY" benchmarks/gpu_first_run_report.py --out="$OUT" --speed \
    --estimates=benchmarks/gpu_estimates.json --refit="$OUT/gpu_calibration.json"
cat "$OUT/4_report.log"  # The tables again, last: the end of the call's output holds them.
echo "=== done in $(($(now) - T0))s; files: $(ls "$OUT" | tr '\n' ' ')"
