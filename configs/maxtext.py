"""MaxText's published TPU runs, in this project's keys: the calibration of --mode=compile.

MaxText (github.com/AI-Hypercomputer/maxtext) publishes measured TFLOP/s per chip and
MFU for its synthetic-data training runs, in MaxText/configs/v5e/README.md and
MaxText/configs/v5p/README.md as of commit 76bd53b0f (2023-12-15; the tables are
unchanged at e591f30cb, now under src/maxtext/configs/tpu/), with the commands beside
them (16b.sh, 32b.sh). The model then (MaxText/configs/base.yml and layers/models.py at
76bd53b0f) is a parallel block (attention and MLP both read one pre-RMSNorm, no biases),
RoPE, multi-head attention with head_dim 256, a ReLU MLP, tied embeddings, vocabulary
32768, bfloat16 compute, float32 parameters, AdamW, blocks scanned; global_parameter_scale
scales its base (d_model 2560, 8 heads, MLP 8192, 16 layers) by doubling heads and MLP,
d_model and depth in turn (pyconfig.get_individual_scales). attention='flash' is
MaxText's Pallas flash attention; here the TPU's fused kernel, splash.

  :v5e_16b  global_parameter_scale=16: d_model 5120, 32 heads of 256, MLP 32768, 32
       layers (16.27e9 parameters); per_device_batch_size=6 x 2048 tokens on one
       v5e-256 (fsdp 256, 1536 rows), remat_policy=full. Table row "1x v5e-256": 120
       TFLOP/s/chip, MFU 61.10%.
  :v5p_32b  global_parameter_scale=32: d_model 10240, 32 heads of 256, MLP 32768, 32
       layers (32.55e9 parameters); per_device_batch_size=8 x 2048 on one v5p-128 (64
       chips, fsdp 16 x tensor 4, 512 rows), remat_policy=minimal (jax's
       checkpoint_dots_with_no_batch_dims: here "dots_no_batch"). Table row "1x
       v5p-128": 328 TFLOP/s/chip, MFU 71.47%.

The measured step time is MaxText's model TFLOPs per chip (its train.py formula of
then: 6 x parameters x tokens + half of 12 x heads x layers x head_dim x seq^2 x rows
for causal attention) over the TFLOP/s in the table: 1239.2 / 120 = 10.33 s (v5e) and
3252.5 / 328 = 9.92 s (v5p). The mode's estimates, compiled on this project's 2-core
AMD EPYC host on 2026-11-25: 7.72 s (0.75x, compute-bound) and 7.23 s (0.73x,
compute-bound), lower bounds within 1.5x; docs/compile-results.md "Calibration" has the rest:

  python launch.py --mode=compile --config=configs/maxtext.py:v5e_16b --topology=v5e:16x16 \
      --compile_steps=train --notry_levers
  python launch.py --mode=compile --config=configs/maxtext.py:v5p_32b --topology=v5p:4x4x4 \
      --compile_steps=train --notry_levers
"""

import ml_collections

from configs import base


def get_config(arg: str = "v5e_16b") -> ml_collections.ConfigDict:
  """The `arg` ("v5e_16b" or "v5p_32b") run."""
  config = base.get_config()
  config.model.update(
      arch="decoder", head="lm", position="rope", norm="pre", norm_type="rmsnorm",
      norm_epsilon=1e-5, parallel_block=True, activation="relu", use_bias=False,
      tie_embeddings=True, vocab_size=32768, head_dim=256, num_heads=32, num_kv_heads=0,
      mlp_dim=32768, num_layers=32, max_len=2048, scan_layers=True, dtype="bfloat16",
      param_dtype="float32", embed_dropout=0.0, residual_dropout=0.0,
      attention_impl="splash")
  config.data.update(tokenizer="sentencepiece", seq_len=2048)
  config.optimizer.update(b1=0.9, b2=0.95, weight_decay=0.1)
  if arg == "v5e_16b":
    config.model.update(d_model=5120, remat="full")
    config.data.batch_size = 6 * 256
    config.mesh.shape = (("data", 1), ("fsdp", -1), ("tensor", 1))
  elif arg == "v5p_32b":
    config.model.update(d_model=10240, remat="dots_no_batch")
    config.data.batch_size = 8 * 64
    config.mesh.shape = (("data", 1), ("fsdp", -1), ("tensor", 4))
  else:
    raise ValueError(f"configs/maxtext.py: unknown argument {arg!r}; valid: 'v5e_16b' "
                     "or 'v5p_32b'")
  return config
