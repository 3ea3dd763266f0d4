"""nanoGPT's Tiny Shakespeare CPU recipe in PyTorch: the reference for `shakespeare_char.py:cpu`.

nanoGPT's README reports "a loss of about 1.88" for its CPU command (4 layers, 4 heads,
128 wide, context 64, batch 12, 2000 steps, dropout 0). That number is one run, read
from an estimate over 20 random validation batches. This script trains the same recipe
as nanoGPT's `model.py` / `train.py` describe it (written here from that description,
not copied), so that the JAX run and the reference can be compared on the same
machine, with the same evaluation, over several seeds:

  - characters: the file's sorted character set (65 for Tiny Shakespeare); the first
    90% of the characters train, the rest validate;
  - GPT: learned positions, pre-LayerNorm blocks without biases, exact GELU, tied
    output; N(0, 0.02) init, residual projections N(0, 0.02 / sqrt(2 * layers));
  - AdamW(0.9, 0.99), weight decay 0.1 on >= 2-D weights, clip 1.0, 100 warmup steps
    ((it + 1) / 101 of the peak), cosine from 1e-3 to 1e-4 at step 2000;
  - rows at uniformly random offsets, with replacement.

`--vocab_size=128` pads the embedding table with rows no character uses, as
`launch.py` does with `model.vocab_size=0`, to compare like with like.

Each evaluation prints two numbers: nanoGPT's estimate (`--estimate_batches` random
batches of the validation split) and the whole validation split cut into consecutive
rows of 65 characters (64 predictions each), which is what `launch.py` reports.

Needs torch (not a requirement of this repository; any recent CPU wheel):

  python benchmarks/nanogpt_reference.py --data=../shared/data/tiny_shakespeare/input.txt \
      --seeds=0,1,2
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F


class Block(nn.Module):
  """Pre-norm block: x + attn(ln(x)), then x + mlp(ln(x)); no biases anywhere."""

  def __init__(self, width: int, heads: int):
    super().__init__()
    self.heads = heads
    self.ln_1 = nn.LayerNorm(width, bias=False)
    self.qkv = nn.Linear(width, 3 * width, bias=False)
    self.attn_out = nn.Linear(width, width, bias=False)
    self.ln_2 = nn.LayerNorm(width, bias=False)
    self.fc = nn.Linear(width, 4 * width, bias=False)
    self.mlp_out = nn.Linear(4 * width, width, bias=False)

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    batch, length, width = x.shape
    q, k, v = self.qkv(self.ln_1(x)).split(width, dim=2)
    q, k, v = (t.view(batch, length, self.heads, -1).transpose(1, 2) for t in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    x = x + self.attn_out(y.transpose(1, 2).reshape(batch, length, width))
    return x + self.mlp_out(F.gelu(self.fc(self.ln_2(x))))


class GPT(nn.Module):
  """Token + learned position embedding, blocks, final LayerNorm, tied output."""

  def __init__(self, vocab: int, context: int, width: int, layers: int, heads: int):
    super().__init__()
    self.token = nn.Embedding(vocab, width)
    self.position = nn.Embedding(context, width)
    self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
    self.ln_f = nn.LayerNorm(width, bias=False)
    for module in self.modules():
      if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, 0.0, 0.02)
    for block in self.blocks:  # GPT-2: scale the writes into the residual stream.
      for proj in (block.attn_out, block.mlp_out):
        nn.init.normal_(proj.weight, 0.0, 0.02 / math.sqrt(2 * layers))

  def forward(self, ids: torch.Tensor) -> torch.Tensor:
    x = self.token(ids) + self.position(torch.arange(ids.shape[1]))
    for block in self.blocks:
      x = block(x)
    return self.ln_f(x) @ self.token.weight.T


def learning_rate(it: int, peak: float, floor: float, warmup: int, decay: int) -> float:
  """nanoGPT's get_lr: linear warmup, cosine to `floor` at `decay`, then flat."""
  if it < warmup:
    return peak * (it + 1) / (warmup + 1)
  if it > decay:
    return floor
  ratio = (it - warmup) / (decay - warmup)
  return floor + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (peak - floor)


@torch.no_grad()
def evaluate(model: GPT, val: np.ndarray, context: int, batch: int, estimate_batches: int,
             generator: np.random.Generator) -> tuple[float, float]:
  """(nanoGPT's random-batch estimate, the mean over the whole split in consecutive rows)."""
  model.eval()
  estimates = []
  for _ in range(estimate_batches):
    x, y = random_batch(val, context, batch, generator)
    estimates.append(F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item())
  rows = len(val) // (context + 1)
  split = torch.from_numpy(val[:rows * (context + 1)].reshape(rows, context + 1))
  total = 0.0
  for start in range(0, rows, 256):
    chunk = split[start:start + 256]
    logits = model(chunk[:, :-1])
    total += F.cross_entropy(logits.flatten(0, 1), chunk[:, 1:].flatten(),
                             reduction="sum").item()
  model.train()
  return float(np.mean(estimates)), total / (rows * context)


def random_batch(data: np.ndarray, context: int, batch: int,
                 generator: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
  """nanoGPT's get_batch: `batch` rows at uniformly random offsets."""
  starts = generator.integers(0, len(data) - context, size=batch)
  x = np.stack([data[s:s + context] for s in starts])
  y = np.stack([data[s + 1:s + 1 + context] for s in starts])
  return torch.from_numpy(x), torch.from_numpy(y)


def train(text: str, seed: int, args: argparse.Namespace) -> dict[str, float]:
  """One run; returns its whole-split validation loss after the last step and its speed.

  The speed is of the training loop alone (batch drawing, learning rate, forward,
  backward, clipping, the update), evaluations excluded, as launch.py's
  `tokens_per_second` is.
  """
  chars = sorted(set(text))
  index = {c: i for i, c in enumerate(chars)}
  ids = np.array([index[c] for c in text], np.int64)
  cut = int(len(ids) * 0.9)
  train_ids, val_ids = ids[:cut], ids[cut:]
  torch.manual_seed(seed)
  generator = np.random.default_rng(seed)
  if 0 < args.vocab_size < len(chars):
    raise SystemExit(f"--vocab_size={args.vocab_size} is below the {len(chars)} characters "
                     f"of {args.data}; give 0 (the character count) or at least that many")
  # Rows past the character count are never a target: the vocabulary padding that
  # launch.py's model.vocab_size=0 adds (rounding up to a multiple of 128).
  model = GPT(max(args.vocab_size, len(chars)), args.context, args.width, args.layers,
              args.heads)
  decayed = [p for p in model.parameters() if p.dim() >= 2]
  other = [p for p in model.parameters() if p.dim() < 2]
  optimizer = torch.optim.AdamW([{"params": decayed, "weight_decay": 0.1},
                                 {"params": other, "weight_decay": 0.0}],
                                lr=args.lr, betas=(0.9, 0.99))
  print(f"seed {seed}: {sum(p.numel() for p in model.parameters()):,} parameters, "
        f"{len(chars)} characters in a vocabulary of {model.token.num_embeddings}, "
        f"{len(train_ids):,} / {len(val_ids):,} characters",
        flush=True)
  started = time.monotonic()
  training_seconds = 0.0  # The loop without its evaluations.
  whole = float("nan")
  for it in range(args.steps + 1):
    if it % args.eval_every == 0 or it == args.steps:
      estimate, whole = evaluate(model, val_ids, args.context, args.batch,
                                 args.estimate_batches, generator)
      print(f"seed {seed} step {it}: val loss {whole:.4f} (whole split), "
            f"{estimate:.4f} ({args.estimate_batches}-batch estimate) "
            f"[{time.monotonic() - started:.0f} s]", flush=True)
    if it == args.steps:
      break
    step_start = time.perf_counter()
    for group in optimizer.param_groups:
      group["lr"] = learning_rate(it, args.lr, args.min_lr, args.warmup, args.steps)
    x, y = random_batch(train_ids, args.context, args.batch, generator)
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    training_seconds += time.perf_counter() - step_start
  result = {"seed": seed, "val_loss": whole, "steps": args.steps,
            "ms_per_step": 1e3 * training_seconds / max(args.steps, 1),
            "tokens_per_second": args.steps * args.batch * args.context
                                 / max(training_seconds, 1e-9)}
  print(f"seed {seed}: {result['ms_per_step']:.1f} ms per iteration, "
        f"{result['tokens_per_second']:,.0f} tokens/s (training loop, evaluations "
        f"excluded; {args.threads} threads)", flush=True)
  print("RESULT " + json.dumps(result), flush=True)
  return result


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--data", required=True, help="Tiny Shakespeare's input.txt")
  parser.add_argument("--seeds", default="0", help="comma-separated seeds, run in turn")
  parser.add_argument("--steps", type=int, default=2000)
  parser.add_argument("--eval_every", type=int, default=250)
  parser.add_argument("--estimate_batches", type=int, default=20)
  parser.add_argument("--context", type=int, default=64)
  parser.add_argument("--batch", type=int, default=12)
  parser.add_argument("--width", type=int, default=128)
  parser.add_argument("--layers", type=int, default=4)
  parser.add_argument("--heads", type=int, default=4)
  parser.add_argument("--lr", type=float, default=1e-3)
  parser.add_argument("--min_lr", type=float, default=1e-4)
  parser.add_argument("--warmup", type=int, default=100)
  parser.add_argument("--vocab_size", type=int, default=0,
                      help="embedding rows; 0 = the number of characters (nanoGPT's)")
  parser.add_argument("--threads", type=int, default=2)
  args = parser.parse_args()
  torch.set_num_threads(args.threads)
  with open(args.data, encoding="utf-8") as f:
    text = f.read()
  results = [train(text, int(s), args)["val_loss"] for s in args.seeds.split(",")]
  print(f"whole-split validation loss at step {args.steps}: "
        + ", ".join(f"{r:.4f}" for r in results)
        + f"; mean {np.mean(results):.4f}" + (f", sample std {np.std(results, ddof=1):.4f}"
                                              if len(results) > 1 else ""))


if __name__ == "__main__":
  main()
