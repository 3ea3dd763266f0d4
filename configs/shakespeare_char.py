"""Character-level Tiny Shakespeare with nanoGPT's recipes, on the local text builder.

Data: `data.name="local_text"` over one file, split by position as nanoGPT does (first
90% of the characters train, last 10% validation); the character tokenizer (65
characters + 5 special ids; `model.vocab_size=0` rounds that up to 128). Tiny
Shakespeare is `../shared/data/tiny_shakespeare/input.txt` beside this repository when
present, or char-rnn's `input.txt` anywhere:

  python launch.py --config=configs/shakespeare_char.py:cpu \
    --config.data.path=../shared/data/tiny_shakespeare/input.txt

Default ("baby GPT", nanoGPT's config/train_shakespeare_char.py): 6 layers, 6 heads,
384 wide, context 256, dropout 0.2, batch 64, no biases, AdamW(0.9, 0.99), weight decay
0.1, clip 1.0, learning rate 1e-3 with 100 warmup steps and cosine decay to 1e-4 at
step 5000. Meant for an accelerator.

`:cpu`: nanoGPT's CPU command (4 layers, 4 heads, 128 wide, context 64, batch 12, 2000
steps, decay to step 2000, dropout 0; 812,160 parameters); nanoGPT reports a validation
loss of about 1.88 for it. Evaluation here covers the whole validation split (111,540
characters; nanoGPT samples 20 batches of 12 x 64).
  Measured 2026-11-22 on the 2-core CPU machine, shared with other jobs (the wall time is
  inflated by them), with the command above: 11m24s wall including the dataset build;
  validation loss 4.86 (step 0) -> 2.45 (250) -> 2.06 (1000) -> 1.906 (2000), train loss
  1.78 at step 2000. Without `data.shuffle_rows` (rows of one block side by side in a
  batch) the same run reached 1.946.
"""

import ml_collections

from configs import base


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  """nanoGPT's baby GPT on characters; `arg="cpu"` is nanoGPT's CPU recipe."""
  config = base.get_config()
  config.model.update(
      arch="decoder", head="lm", vocab_size=0, d_model=384, num_layers=6, num_heads=6,
      mlp_dim=4 * 384, max_len=256, position="learned", norm="pre", activation="gelu",
      use_bias=False, tie_embeddings=True, embed_dropout=0.2, residual_dropout=0.2)
  # nanoGPT draws every row at a random offset; packed rows of shuffled 2048-character
  # blocks are consecutive, so rows are also shuffled in windows of 4096 (~260k chars).
  config.data.update(name="local_text", tokenizer="char", seq_len=256, batch_size=64,
                     val_fraction=0.1, shuffle_rows=4096)
  config.optimizer.update(schedule="cosine", learning_rate=1e-3, min_learning_rate=1e-4,
                          warmup_steps=100, decay_steps=0, b1=0.9, b2=0.99,
                          weight_decay=0.1, grad_clip_norm=1.0)
  config.train.update(num_steps=5000, log_every=50, eval_every=250, eval_batches=200,
                      eval_at_start=True)
  config.checkpoint.update(every=1000)

  if arg == "cpu":
    config.model.update(d_model=128, num_layers=4, num_heads=4, mlp_dim=4 * 128, max_len=64,
                        embed_dropout=0.0, residual_dropout=0.0)
    config.data.update(seq_len=64, batch_size=12)
    config.train.update(num_steps=2000, log_every=100, eval_every=250, eval_batches=-1)
    config.checkpoint.update(every=500)
  elif arg:
    raise ValueError(f"configs/shakespeare_char.py: unknown argument {arg!r}; "
                     "valid: '' or 'cpu'")
  return config
