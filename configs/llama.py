"""Llama-shaped decoders of ~1B and ~7B parameters, for --mode=compile on TPU slices.

Built from the existing model fields: RMSNorm (pre), SwiGLU MLP, RoPE, no biases,
bfloat16 compute, blocks scanned (compile time flat with depth) and rematerialised
(only block inputs kept for the backward pass), and weights plus Adam state sharded
over every chip (fsdp=-1). No training run has used them: they exist to ask
"does it fit, and how fast could it go" before renting a slice.

  :1b  Llama 3.2 1B's shape: d_model 2048, 16 layers, 32 heads / 8 kv heads (GQA),
       MLP 8192, vocabulary 128256, tied embeddings, RoPE base 500000: 1,235,814,400
       parameters. 64 rows x 2048 tokens per step.
  :7b  Llama 2 7B's shape: d_model 4096, 32 layers, 32 heads (MHA), MLP 11008,
       vocabulary 32000, untied: 6,738,415,616 parameters. 64 rows x 2048 tokens.

  :local  the same recipe (RMSNorm, SwiGLU, RoPE, GQA, no biases, plus QK-norm) at
       gpt_small.py:local's size on the offline corpus with the byte tokenizer:
       d_model 256, 4 layers, 4 heads / 2 kv heads, MLP 683, context 128, 400 steps,
       float32, unscanned; 2,985,728 parameters; trains offline on a CPU.
       `python launch.py --config=configs/llama.py:local --workdir=/tmp/llama_local`
       on the reference machine (2 CPU cores, shared with the test suite, so the time
       is an upper bound), 2026-11-25: eval loss 5.601 at step 0, 2.544 at 100, 1.965
       nats/byte at 400 (accuracy 0.491), 18m36s. gpt_small.py:local (GPT-2 recipe,
       3.3M parameters) reaches 2.38 at step 400 on the same data.

  :1b_fineweb  the :1b model on FineWeb-Edu's 10B-token sample, prepared once into ids
       (docs/corpus.md); 64 rows x 2048 tokens a step (131,072 tokens), 75,000 steps:
       about one pass. On a machine with network (about 28-30 GB of parquet):
         huggingface-cli download HuggingFaceFW/fineweb-edu --repo-type dataset \
           --include "sample/10BT/*" --local-dir ~/data/fineweb-edu
         python launch.py --mode=prepare --config=configs/llama.py:1b_fineweb
         python launch.py --config=configs/llama.py:1b_fineweb --workdir=runs/llama_1b_fineweb
       The tokenizer is the :1b preset's: SentencePiece trained on a 2M-line sample with
       the model's 128256 pieces; `--config.init_from=<an --mode=import run of
       Llama-3.2-1B>` takes Llama 3's own tokenizer.json (and its weights) instead.
       Expected: about 8.5-10B tokens (the dataset card counts "around 10B gpt2
       tokens"; a 128k vocabulary makes fewer pieces than GPT-2's 50k), 0.5% of the
       documents in validation; ids as uint32 (the vocabulary is above 65,536), so about
       34-40 GB of prepared shards. Not run here (no network on the reference machine):
       the card's figure and the arithmetic, to check against the prepare summary.

  python launch.py --mode=compile --config=configs/llama.py:7b --topology=v5p:2x4x4
  python launch.py --config=configs/llama.py:local

docs/compile-results.md's table lists what these compiled to on which slices.
"""

import ml_collections

from configs import base


def get_config(arg: str = "1b") -> ml_collections.ConfigDict:
  """The `arg` ("1b", "1b_fineweb", "7b" or "local") decoder."""
  config = base.get_config()
  config.model.update(
      arch="decoder", head="lm", position="rope", norm="pre", norm_type="rmsnorm",
      norm_epsilon=1e-5, activation="swiglu", use_bias=False, scan_layers=True,
      remat="full", dtype="bfloat16", param_dtype="float32", embed_dropout=0.0,
      residual_dropout=0.0)
  config.data.update(tokenizer="sentencepiece", seq_len=2048, batch_size=64)
  config.optimizer.update(schedule="cosine", learning_rate=3e-4, min_learning_rate=3e-5,
                          warmup_steps=2000, b1=0.9, b2=0.95, weight_decay=0.1)
  config.train.update(num_steps=100_000, eval_every=2000, eval_at_start=False)
  config.mesh.shape = (("data", 1), ("fsdp", -1), ("tensor", 1))
  if arg in ("1b", "1b_fineweb"):
    config.model.update(vocab_size=128256, d_model=2048, num_layers=16, num_heads=32,
                        num_kv_heads=8, head_dim=64, mlp_dim=8192, max_len=2048,
                        tie_embeddings=True, rope_max_wavelength=500000.0)
    if arg == "1b_fineweb":
      base.use_fineweb_edu(config)
      config.train.update(num_steps=75_000, eval_every=5000, eval_batches=50)
      config.checkpoint.update(every=5000)
  elif arg == "7b":
    config.model.update(vocab_size=32000, d_model=4096, num_layers=32, num_heads=32,
                        num_kv_heads=0, head_dim=128, mlp_dim=11008, max_len=2048,
                        tie_embeddings=False, rope_max_wavelength=10000.0)
  elif arg == "local":
    config.model.update(vocab_size=384, d_model=256, num_layers=4, num_heads=4,
                        num_kv_heads=2, mlp_dim=683, max_len=128, tie_embeddings=True,
                        qk_norm=True, scan_layers=False, remat="none", dtype="float32")
    config.data.update(name="python_stdlib", tokenizer="bytes", seq_len=128, batch_size=16)
    config.optimizer.update(learning_rate=2e-3, min_learning_rate=2e-4, warmup_steps=50)
    config.train.update(num_steps=400, log_every=20, eval_every=100, eval_batches=10,
                        eval_at_start=True, steps_per_call=10)
    config.checkpoint.update(every=100)
    config.mesh.shape = (("data", -1), ("fsdp", 1), ("tensor", 1))
  else:
    raise ValueError(f"configs/llama.py: unknown argument {arg!r}; valid: '1b', "
                     "'1b_fineweb', '7b' or 'local'")
  return config
