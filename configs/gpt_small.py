"""GPT-2 small (124M) on the offline Python-stdlib corpus.

Architecture as GPT-2 small: 12 layers, d_model 768, 12 heads, MLP 3072, context
1024, learned positions, pre-LayerNorm, GELU (tanh form), tied embeddings,
dropout 0.1 on embeddings and residuals. Attention-probability dropout is 0 so that
the fused `jax.nn.dot_product_attention` kernel can be used (it has no dropout).

Full run:  python launch.py --config=configs/gpt_small.py
  Meant for a GPU/TPU. Measured on 2 CPU cores, 2026-11-22: SentencePiece (32768
  pieces) trains in about 2 minutes; "Model parameters: 111,008,256" (124,439,808 at
  GPT-2's vocab 50257); first step after 2m53s (compile), then about 82 s/step at
  16.1 GB peak memory; Ctrl-C saved step 4 and the rerun resumed from it. No quality
  result yet: a full run needs an accelerator.

Offline baseline:  python launch.py --config=configs/gpt_small.py:spm
  The `:local` shape (4 x 256, 5,322,240 parameters with the embedding) at context 256
  over an 8192-piece SentencePiece unigram vocabulary of the python_stdlib corpus, 800
  steps of 16 x 256 tokens, cosine schedule from 1e-3 to 1e-4.
  Measured 2026-11-22 on the 2-core CPU machine with nothing else running: 24m14s wall
  including the SentencePiece training and 5 evaluations (2.6-2.9k tokens/s, MFU 46-52%
  of the measured f32 matmul rate); validation loss 9.045 (step 0) -> 4.292 (200) ->
  3.878 (400) -> 3.596 (600) -> 3.454 (800) nats per piece, perplexity 31.64 (100
  validation batches, 380k pieces). An earlier run of the same command, before the
  token-axis matmul change and on a machine shared with other jobs, gave the same losses
  in 49m44s.
Quick run:  python launch.py --config=configs/gpt_small.py:local
  A 4-layer, d_model 256 byte-level model (3.3M parameters), 400 steps of 16 x 128 bytes.
  Run on 2 CPU cores shared with other jobs, 2026-11-22: 418 s wall including the
  dataset build; eval loss 5.83 nats/byte at step 0 -> 2.74 (step 100) -> 2.38 (step 400).
  With `train.steps_per_call=10` (set here since 2026-11-25; the same updates, ten steps
  per compiled call), on another 2-core machine with nothing else running: 1m12s of
  training (run.json) at 159-167 ms/step against 207-221 ms/step with one step per call
  (`--config.train.steps_per_call=1`); eval losses 5.827 / 2.739 / 2.573 / 2.562 / 2.379
  at steps 0-400 in both, equal to the last digit.

Real corpus:  configs/gpt_small.py:fineweb
  GPT-2 small on FineWeb-Edu's 10B-token sample, tokenized once into ids (docs/corpus.md),
  64 rows x 1024 tokens a step (65,536 tokens), 150,000 steps: about one pass (9.8B
  tokens). On a machine with network (about 28-30 GB of parquet; `pip install
  huggingface_hub`):
    huggingface-cli download HuggingFaceFW/fineweb-edu --repo-type dataset \
      --include "sample/10BT/*" --local-dir ~/data/fineweb-edu
  then, once (SentencePiece 32768 trained on a 2M-line sample, then every file tokenized
  by data.prepare_workers processes; rerun to resume):
    python launch.py --mode=prepare --config=configs/gpt_small.py:fineweb
    python launch.py --config=configs/gpt_small.py:fineweb --workdir=runs/gpt_small_fineweb
  Expected: about 10B tokens (the dataset card's "around 10B gpt2 tokens"; a 32k
  SentencePiece vocabulary splits English into somewhat more pieces than GPT-2's 50k BPE,
  so expect 10-11B), 0.5% of the documents in validation; ids as uint16 (2 bytes a token),
  so about 20-22 GB of prepared shards under data.data_dir, beside the parquet. Not run
  here (no network on the reference machine): the sizes are the card's and the
  arithmetic's, to be checked against the prepare summary. `--mode=compile
  --topology=h100:8` says whether one host's pipeline keeps up.
"""

import ml_collections

from configs import base


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  """GPT-2 small; `arg="local"` shrinks it to train in minutes on 2 CPU cores,
  `arg="fineweb"` trains it on FineWeb-Edu's 10B sample (see the module docstring)."""
  config = base.get_config()
  config.model.update(
      vocab_size=32768, d_model=768, num_layers=12, num_heads=12, mlp_dim=3072,
      max_len=1024, position="learned", norm="pre", activation="gelu_tanh",
      tie_embeddings=True, embed_dropout=0.1, residual_dropout=0.1)
  # 8 x 1024 tokens per step, as 2 accumulated micro-batches of 4 rows so that a 24 GiB
  # CPU host fits it; on accelerators raise batch_size and lower train.microbatches.
  config.data.update(tokenizer="sentencepiece", seq_len=1024, batch_size=8)
  config.optimizer.update(schedule="warmup_rsqrt", learning_rate=6e-4, warmup_steps=2000)
  # At step 0 the loss is just ln(vocab); skipping that eval gets to training sooner.
  config.train.update(num_steps=100_000, log_every=10, eval_every=2000, eval_batches=50,
                      eval_at_start=False, microbatches=2)
  config.checkpoint.update(every=1000)

  if arg == "local":
    config.model.update(vocab_size=384, d_model=256, num_layers=4, num_heads=4,
                        mlp_dim=1024, max_len=128, embed_dropout=0.0, residual_dropout=0.0)
    config.data.update(tokenizer="bytes", seq_len=128, batch_size=16)
    config.optimizer.update(learning_rate=2e-3, warmup_steps=50)
    # Ten steps per compiled call: the same updates, without XLA:CPU's per-call
    # allocation of the step's temporaries (docs/performance.md).
    config.train.update(num_steps=400, log_every=20, eval_every=100, eval_batches=10,
                        eval_at_start=True, microbatches=1, steps_per_call=10)
    config.checkpoint.update(every=100)
  elif arg == "spm":
    # The offline baseline: the :local shape at context 256 over an 8192-piece
    # SentencePiece vocabulary of the corpus, nanoGPT-style cosine schedule.
    config.model.update(vocab_size=0, d_model=256, num_layers=4, num_heads=4, mlp_dim=1024,
                        max_len=256, embed_dropout=0.0, residual_dropout=0.0)
    config.data.update(tokenizer="sentencepiece", spm_vocab_size=8192, seq_len=256,
                       batch_size=16, shuffle_rows=1024)
    config.optimizer.update(schedule="cosine", learning_rate=1e-3, min_learning_rate=1e-4,
                            warmup_steps=100, b2=0.99, weight_decay=0.1, grad_clip_norm=1.0)
    config.train.update(num_steps=800, log_every=50, eval_every=200, eval_batches=100,
                        eval_at_start=True, microbatches=1)
    config.checkpoint.update(every=400)
  elif arg == "fineweb":
    base.use_fineweb_edu(config)
    # An accelerator's batch: 64 x 1024 tokens, no micro-batches; one pass of ~10B tokens.
    config.data.update(batch_size=64, shuffle_rows=1024)
    config.train.update(num_steps=150_000, microbatches=1, eval_every=5000, eval_batches=100)
    config.checkpoint.update(every=5000)
  elif arg:
    raise ValueError(f"configs/gpt_small.py: unknown argument {arg!r}; valid: '', 'local', "
                     "'spm' or 'fineweb'")
  return config
