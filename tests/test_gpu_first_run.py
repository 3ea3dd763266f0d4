"""benchmarks/gpu_first_run.sh's pieces that need no GPU: the script parses, the report
renders every table from the lines the steps print (and says what is missing), and the
kernels are read off a compiled program's text."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

# pylint: disable=g-import-not-at-top,wrong-import-position
import gpu_first_run_report as report
import gpu_train_step
# pylint: enable=g-import-not-at-top,wrong-import-position


def test_the_script_parses():
  subprocess.run(["bash", "-n", os.path.join(ROOT, "benchmarks", "gpu_first_run.sh")],
                 check=True)


def test_custom_calls_are_counted_by_target():
  text = ('%a = custom-call(x), custom_call_target="__cudnn$fmhaSoftmax", x\n'
          '%b = custom-call(y), custom_call_target="__cudnn$fmhaSoftmax"\n'
          '%c = custom-call(z), custom_call_target="__cudnn$fmhaSoftmaxBackward"')
  assert gpu_train_step.kernels_of(text) == {"__cudnn$fmhaSoftmax": 2,
                                             "__cudnn$fmhaSoftmaxBackward": 1}


def _write(path, lines):
  with open(path, "w", encoding="utf-8") as f:
    f.write("noise\n" + "\n".join(lines) + "\n")


def test_the_report_renders_each_table_from_the_steps_lines(tmp_path, capsys, monkeypatch):
  row = dict(kernel="cudnn", dtype="bfloat16", jax="0.11.2", errors=dict(
      out=1e-3, dq=2e-3, dk=3e-3, dv=4e-3))
  _write(tmp_path / "1_attention.log", [
      "ROW " + json.dumps(dict(row, case="causal", status="pass", expected="pass")),
      "ROW " + json.dumps(dict(row, case="gqa_packed_unguarded", status="FAIL",
                               expected="fail")),
      "ROW " + json.dumps(dict(kernel="cudnn", dtype="bfloat16", jax="0.11.2",
                               case="bidir_window", status="n/a", reason="causal only"))])
  train = dict(label="gpt_small_auto_32", batch=32, batch_asked=64, seq_len=1024,
               step_ms_median=100.0, step_ms_min=99.0, tokens_per_second=327680.0,
               model_tflops_per_second=300.0, mfu=0.303, compile_seconds=20.0,
               memory_analysis=dict(argument_size_in_bytes=2**30, temp_size_in_bytes=2**31),
               peak_bytes_in_use=3 * 2**30, kernels={"__cudnn$fmhaSoftmax": 12},
               jax="0.11.2", device="NVIDIA H100 80GB HBM3", peak_bf16_flops=989e12)
  _write(tmp_path / "2_train.log", ["RESULT " + json.dumps(train)])
  torch_result = dict(torch="2.11.0", device="H100", batch=32, seq_len=1024,
                      model_flops_per_step=3e13, tokens_per_second=163840.0,
                      eager=dict(step_ms_median=250.0, step_ms_min=240.0),
                      compiled=dict(step_ms_median=200.0, step_ms_min=190.0))
  _write(tmp_path / "3_torch.log", ["RESULT " + json.dumps(torch_result)])
  estimates = tmp_path / "estimates.json"
  estimates.write_text(json.dumps({"gpt_small_auto_32": dict(
      batch=32, total_bytes=int(2.5 * 2**30), arguments_bytes=2**30,
      temp_bytes=int(1.5 * 2**30))}))
  monkeypatch.setattr(sys, "argv", ["report", f"--out={tmp_path}", f"--estimates={estimates}"])
  report.main()
  text = capsys.readouterr().out
  assert "| cudnn | bfloat16 | 1 | 0 | 1 | 1 | 0 |" in text  # The expected fail not a FAIL.
  assert "| gpt_small_auto_32 | 32 x 1024 (asked 64: OOM) | 100.0 / 99.0 | 327,680 |" in text
  assert "| 30.3% | 20.0 | 1.00 + 2.00 | 3.00 | 2.50 (1.00 + 1.50) |" in text
  assert "| torch.compile | 200.0 / 190.0 | 163,840 | 15.2% |" in text
  assert "| gpt_small_auto_32 (batch 32) | 327,680 | 2.00x |" in text


def test_the_report_says_which_step_left_nothing(tmp_path, capsys, monkeypatch):
  monkeypatch.setattr(sys, "argv", ["report", f"--out={tmp_path}"])
  report.main()
  text = capsys.readouterr().out
  assert "no ROW line in 1_attention.log" in text
  assert "no RESULT line in 2_train.log" in text and "no RESULT line in 3_torch.log" in text


def test_an_out_of_memory_halves_the_batch_once(monkeypatch, capsys):
  asked = []

  def measure(config, args):
    asked.append(config.data.batch_size)
    if len(asked) == 1:
      raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 9 GiB")
    return dict(step_ms_median=1.0, tokens_per_second=2.0, mfu=None, peak_bytes_in_use=0)

  monkeypatch.setattr(gpu_train_step, "measure", measure)
  monkeypatch.setattr(sys, "argv", ["gpu_train_step", "--config=configs/gpt_small.py",
                                    "--batch=8", "--seq_len=64", "--tiny"])
  gpu_train_step.main()
  assert asked == [8, 4]
  result = json.loads(next(line for line in capsys.readouterr().out.splitlines()
                           if line.startswith("RESULT "))[len("RESULT "):])
  assert result["batch_asked"] == 8


def test_each_train_run_has_the_deviceless_estimate_of_its_batch():
  with open(os.path.join(ROOT, "benchmarks", "gpu_first_run.sh"), encoding="utf-8") as f:
    script = f.read()
  device_sizes = script.split("else\n")[-1]  # The GPU branch's sizes, not the dry run's.
  batches = dict(re.findall(r"(GS_AUTO|GS_XLA|GS_32|LLAMA)=(\d+)", device_sizes))
  with open(os.path.join(ROOT, "benchmarks", "gpu_estimates.json"), encoding="utf-8") as f:
    estimates = json.load(f)
  for label, var in (("gpt_small_auto", "GS_AUTO"), ("gpt_small_xla", "GS_XLA"),
                     ("gpt_small_auto_32", "GS_32"), ("llama_1b", "LLAMA")):
    assert f"--label={label}" in script
    assert estimates[label]["batch"] == int(batches[var]), label


def test_the_jax010_emulation_scales_the_kv_offsets_by_the_query_heads():
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from jax._src.cudnn import fused_attention_stablehlo as fused  # pylint: disable=g-import-not-at-top
  import attention_parity  # pylint: disable=g-import-not-at-top
  query, key = jnp.zeros((2, 8, 4, 2)), jnp.zeros((2, 8, 2, 2))  # 4 query, 2 k/v heads.
  seqlen = jnp.asarray([[3, 5, -1], [8, -1, -1]], jnp.int32)
  offsets = jnp.asarray([[0, 3, -1, -1], [0, -1, -1, -1]], jnp.int32)
  args = (seqlen, seqlen, offsets, offsets, query, key)
  fixed = fused._fix_seqlen_offsets(*args)  # pylint: disable=protected-access
  with attention_parity.emulate_jax010_offsets():
    emulated = fused._fix_seqlen_offsets(*args)  # pylint: disable=protected-access
  for got, want in zip(emulated[:3], fixed[:3]):
    assert (got == want).all()
  assert (emulated[3] == fixed[3] * 2).all()
  assert fused._fix_seqlen_offsets(*args)[3].tolist() == fixed[3].tolist()  # Restored.


def test_the_speed_script_parses_and_its_report_gives_each_target_a_verdict(capsys):
  """benchmarks/gpu_speed_run.sh (issue 47's device check): the targets against what the
  steps printed: gpt_small against torch.compile, llama:1b's MFU, the compile mode's
  estimate against the measured step of the same shape (and only that shape)."""
  subprocess.run(["bash", "-n", os.path.join(ROOT, "benchmarks", "gpu_speed_run.sh")],
                 check=True)
  gs = dict(label="gpt_small_auto_32", batch=32, seq_len=1024, tokens_per_second=640000.0,
            step_ms_median=51.2, mfu=0.5)
  llama = dict(label="llama_1b", batch=16, seq_len=2048, tokens_per_second=50000.0,
               step_ms_median=655.0, mfu=0.41)
  torch_run = dict(batch=32, seq_len=1024, compiled=dict(step_ms_median=64.9))
  estimates = {"gpt_small_auto_32": dict(batch=32, seq_len=1024, estimated_seconds=0.0545,
                                         estimated_seconds_range=[0.053, 0.064]),
               "llama_1b": dict(batch=8, seq_len=2048, estimated_seconds=0.53)}
  xla_kernels = [dict(label="gpt_small_xla_kernels_32", batch=32, seq_len=1024,
                     step_ms_median=56.32), dict(label="llama_1b_xla_kernels", batch=16,
                                                 seq_len=2048, step_ms_median=600.0)]
  report.targets([gs, llama] + xla_kernels, [torch_run], estimates)
  out = capsys.readouterr().out
  assert "640,000 vs 504,900 tokens/s = 1.27x (target >= 1.2x: met)" in out
  assert "MFU 41.0% (target >= 45%: NOT met)" in out
  # The Pallas kernels' A/B: XLA's arms against the defaults.
  assert ("instead of the Pallas kernels: 56.3 vs 51.2 ms/step bf16 default (0.91x the "
          "default's speed)") in out
  assert ("llama:1b with XLA's MLP and loss head instead of the Pallas kernels: 600.0 vs "
          "655.0 ms/step (1.09x the default's speed)") in out
  assert ("54.5 ms vs 51.2 ms measured = 1.06x (target within 1.25x: met); its range "
          "53.0-64.0 ms MISSES the measurement") in out
  assert "made for 8 x 2048, measured at 16 x 2048: not compared" in out
  report.profile_tables([dict(label="gpt_small_auto_32", ops_per_step=1846,
                              measured_ms={"matmul": 20.0, "loss": 8.0},
                              estimated_ms={"matmul": 21.39, "loss": 8.68})])
  out = capsys.readouterr().out
  assert "| matmul | 20.00 | 21.39 | 1.07 |" in out and "| total | 28.00 | 30.07 | 1.07 |" in out


def test_the_speed_script_names_the_card_from_nvidia_smi(tmp_path):
  """gpu_common.sh's detect_chip: H200 and H100 by nvidia-smi's name, anything else other."""
  for name, chip in (("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100"),
                     ("NVIDIA A100-SXM4-80GB", "other")):
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "nvidia-smi").write_text(f"#!/bin/sh\necho '{name}'\n")
    (fake / "nvidia-smi").chmod(0o755)
    out = subprocess.run(
        ["bash", "-c", f"source {ROOT}/benchmarks/gpu_common.sh; detect_chip"],
        env=dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}", OUT=str(tmp_path / "o"),
                 TOTAL="1", RESERVE="0"),
        capture_output=True, text=True, check=True).stdout.strip()
    assert out == chip, name
  with open(os.path.join(ROOT, "benchmarks", "gpu_speed_run.sh"), encoding="utf-8") as f:
    script = f.read()
  for flag in ("--xla_gpu_enable_latency_hiding_scheduler=true",
               "--xla_gpu_enable_triton_gemm=false",
               "--xla_gpu_enable_while_loop_double_buffering=true",
               "--xla_disable_hlo_passes=rematerialization",
               "--xla_gpu_enable_pipelined_all_gather=true"):
    assert flag in script, flag
  assert "--variant=gpt_small_fp8_32:model.quantization=fp8" in script
  for label in ("gpt_small_xla_kernels_32", "llama_1b_xla_kernels"):
    assert f"--variant={label}:model.mlp_impl=xla,model.loss_head_impl=xla" in script
  assert '"skipped": "torch is not importable' in script


def test_the_speed_report_refits_on_the_measured_steps(tmp_path, capsys, monkeypatch):
  """Each measured step carries its kernels: the report prints its error before the refit
  (a fit that never saw it) and after, as RESULT lines, and writes the refitted data; a
  skipped arm and the decoding tables are reported too."""
  from transformer.planning import calibration  # pylint: disable=g-import-not-at-top
  rows = calibration.load()["gpt_small_cudnn_32x1024"]["kernels"]
  gs = dict(label="gpt_small_auto_32", batch=32, batch_asked=32, seq_len=1024,
            step_ms_median=80.0, step_ms_min=79.0, tokens_per_second=409600.0,
            model_tflops_per_second=300.0, mfu=0.3, compile_seconds=20.0,
            memory_analysis={}, peak_bytes_in_use=0, kernels={}, jax="0.11.2",
            device="NVIDIA H200", chip="h200", case="gpt_small_32x1024", kernel_rows=rows)
  fp8 = dict(label="gpt_small_fp8_32", skipped="config key model.quantization does not exist")
  _write(tmp_path / "2_train.log", ["RESULT " + json.dumps(gs), "RESULT " + json.dumps(fp8)])
  _write(tmp_path / "0_env.log", ['RESULT {"label": "device", "chip": "h200", '
                                  '"nvidia_smi_name": "NVIDIA H200"}'])
  _write(tmp_path / "5_decode.log", [
      "Greedy, 256 new tokens after a 16-token prompt, batch 64: decoder 4 layers",
      "  recompute the prefix every step      9.000     1820.4      1.0x",
      "  key/value cache                      0.500    32768.0     18.0x"])
  refitted = tmp_path / "refit.json"
  monkeypatch.setattr(sys, "argv", ["report", f"--out={tmp_path}", "--speed",
                                    f"--refit={refitted}"])
  report.main()
  text = capsys.readouterr().out
  assert "Device: NVIDIA H200 (h200)" in text
  assert "gpt_small_fp8_32: skipped: config key model.quantization does not exist" in text
  decode = next(json.loads(line[7:]) for line in text.splitlines()
                if line.startswith('RESULT {"label": "decode_batch_64"'))
  assert decode["tokens_per_second"] == 32768.0
  refit = next(json.loads(line[7:]) for line in text.splitlines()
               if line.startswith('RESULT {"label": "refit"'))
  chip = hardware_chip("h200")
  before = calibration.step_seconds(calibration.launches_of(rows), chip,
                                    calibration.best_rates()) * 1e3
  assert refit["step"] == "gpt_small_auto_32_h200"
  assert refit["before_ms"] == before and refit["before_ratio"] == before / 80.0
  low, high = refit["before_range_ms"]
  assert low <= before <= high and refit["after_ratio"] > 0
  with open(refitted, encoding="utf-8") as f:
    merged = json.load(f)
  assert len(merged) == len(calibration.load()) + 1
  assert merged["gpt_small_auto_32_h200"]["chip"] == "h200"


def hardware_chip(name):
  from transformer import hardware  # pylint: disable=g-import-not-at-top
  return hardware.CHIPS[name]
