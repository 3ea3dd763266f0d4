"""T5 v1.1 (Raffel et al. 2020; the v1.1 checkpoints' shapes), pretrained with span corruption.

Encoder-decoder with T5 relative position buckets (32 buckets, distances up to 128, one
bias table per stack), pre-RMSNorm, gated GELU (tanh), no biases, an untied LM head, one
token embedding for both stacks, no dropout in pretraining; the objective is T5's span
corruption (`model.objective="span_corruption"`: noise density 0.15, mean span 3, 100
sentinel ids after the tokenizer's vocabulary; docs/objectives.md).

  small: 8 + 8 layers, d_model 512, 6 heads of 64, MLP 1024 (T5 v1.1 small): 76,961,152
         parameters at T5's vocabulary of 32128 (T5 v1.1 small's 77M)
  base:  12 + 12 layers, d_model 768, 12 heads of 64, MLP 2048 (T5 v1.1 base; the
         default): 247,577,856 at 32128 (248M)
  local: 2 + 2 layers, d_model 128, 4 heads of 32, MLP 256, rows of 128 bytes on the
         offline corpus (python_stdlib), sized for a CPU

Not T5's: AdamW with warmup and inverse square root decay (T5 trained with Adafactor),
and one data.seq_len for both sides (T5: 512 inputs, 114 targets). T5 v1.1 pretrained on
C4 with a 32,000-piece SentencePiece vocabulary; here the vocabulary is the data's.

  python launch.py --config=configs/t5.py:local

  2026-11-29, the objective code of commit 91d68a8, 2 AMD EPYC cores shared with other
  engineers' jobs (the wall time is an upper bound): 886,528 parameters (vocabulary 384:
  261 bytes + 100 sentinels, rounded up), 300 steps of 16 rows of 128 bytes a side in
  20m55s; span-corruption validation loss (10 batches, the targets' tokens) 5.978 (step
  0) -> 2.711 (100) -> 2.573 (200) -> 2.548 (300), accuracy 0.387. One run.
"""

from __future__ import annotations

import ml_collections

from configs import base

_SHAPES = {  # arg -> (layers per stack, d_model, heads, mlp_dim)
    "small": (8, 512, 6, 1024),
    "base": (12, 768, 12, 2048),
    "local": (2, 128, 4, 256),
}


def get_config(arg: str = "base") -> ml_collections.ConfigDict:
  """T5 v1.1 `small` or `base` (the default), or `local` for a CPU."""
  if arg not in _SHAPES:
    raise ValueError(f"configs/t5.py: unknown argument {arg!r}; valid: {sorted(_SHAPES)}")
  layers, d_model, heads, mlp_dim = _SHAPES[arg]
  config = base.get_config()
  config.model.update(
      arch="encoder_decoder", head="lm", objective="span_corruption",
      num_layers=layers, num_decoder_layers=layers, d_model=d_model, num_heads=heads,
      head_dim=d_model // heads if arg == "local" else 64, mlp_dim=mlp_dim,
      position="relative", relative_buckets=32, relative_max_distance=128,
      norm="pre", norm_type="rmsnorm", activation="geglu_tanh", use_bias=False,
      tie_embeddings=False, share_embeddings=True, scale_embeddings=False,
      embed_dropout=0.0, residual_dropout=0.0, vocab_size=0, max_len=512)
  config.train.update(noise_density=0.15, mean_noise_span_length=3.0, num_sentinels=100)
  config.data.update(tokenizer="sentencepiece", spm_vocab_size=32000, seq_len=512,
                     batch_size=128)
  config.optimizer.update(schedule="warmup_rsqrt", learning_rate=1e-3, warmup_steps=10_000)
  config.train.update(num_steps=524_288, log_every=100, eval_every=5000, eval_batches=50)
  config.checkpoint.update(every=5000)
  if arg == "local":
    config.model.max_len = 128
    config.data.update(tokenizer="bytes", seq_len=128, batch_size=16)
    config.optimizer.update(learning_rate=2e-3, warmup_steps=50)
    config.train.update(num_steps=300, log_every=20, eval_every=100, eval_batches=10,
                        eval_at_start=True, steps_per_call=10)
    config.checkpoint.update(every=100)
  return config
