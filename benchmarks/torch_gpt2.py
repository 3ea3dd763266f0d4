"""GPT-2 small in PyTorch on one GPU: the reference for configs/gpt_small.py's step.

Self-contained (torch only; not a requirement of this repository). The model is
configs/gpt_small.py's shape written from its description: 12 pre-LayerNorm blocks of
d_model 768, 12 heads, MLP 3072 with tanh GELU, learned positions, vocabulary 32768 with
the output tied to the embedding, dropout 0.1 on the embeddings and residuals, no
attention dropout. Attention is `F.scaled_dot_product_attention(is_causal=True)` held
to the flash backend; bfloat16 autocast, float32 weights, fused AdamW, float32
cross-entropy. Random tokens (speed only).

Eager mode is timed first (a figure even if compiling overruns), then `torch.compile`:
its first calls compile, bounded by --compile_budget seconds (SIGALRM; the eager figure
stands alone if it fires). Step time: the median of --rounds rounds of --steps steps,
after warm-up, with the GPU synchronised at each round's end. A CUDA out-of-memory
halves the batch once. Prints as it goes and one `RESULT {json}` line.

  python benchmarks/torch_gpt2.py --batch=32 --seq_len=1024
  python benchmarks/torch_gpt2.py --batch=2 --seq_len=64 --tiny --no_compile   # CPU
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import signal
import statistics
import time

import torch
from torch import nn
from torch.nn import functional as F


class Block(nn.Module):
  """Pre-LayerNorm: x + attn(ln(x)), then x + mlp(ln(x))."""

  def __init__(self, d: int, heads: int, mlp: int, dropout: float):
    super().__init__()
    self.heads = heads
    self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
    self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
    self.fc, self.out = nn.Linear(d, mlp), nn.Linear(mlp, d)
    self.drop = nn.Dropout(dropout)

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    B, L, d = x.shape
    q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
    q, k, v = (t.view(B, L, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    x = x + self.drop(self.proj(y.transpose(1, 2).reshape(B, L, d)))
    return x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh")))


class GPT(nn.Module):
  def __init__(self, vocab: int, length: int, d: int, layers: int, heads: int, mlp: int,
               dropout: float):
    super().__init__()
    self.embed, self.pos = nn.Embedding(vocab, d), nn.Embedding(length, d)
    self.drop = nn.Dropout(dropout)
    self.blocks = nn.ModuleList(Block(d, heads, mlp, dropout) for _ in range(layers))
    self.ln = nn.LayerNorm(d)
    for name, p in self.named_parameters():
      if p.dim() >= 2:
        std = 0.02 / math.sqrt(2 * layers) if name.endswith(("proj.weight", "out.weight")) else 0.02
        nn.init.normal_(p, 0.0, std)

  def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    positions = torch.arange(tokens.shape[1], device=tokens.device)
    x = self.drop(self.embed(tokens) + self.pos(positions))
    for block in self.blocks:
      x = block(x)
    logits = self.ln(x) @ self.embed.weight.T  # Tied output.
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def model_flops_per_step(args, batch: int) -> float:
  """flops.py's PaLM count for this shape: 6 x matmul weights per token (the tied output
  included, embeddings not) + 12 x layers x length x d_model per token (scores, values)."""
  d, L = args.d_model, args.seq_len
  matmul = args.layers * (4 * d * d + 2 * d * args.mlp) + d * args.vocab
  return batch * L * (6 * matmul + 12 * args.layers * L * d)


class CompileTimeout(BaseException):
  """Not an Exception: torch's compiler must not catch it and fall back quietly."""


def _alarm(signum, frame):  # pylint: disable=unused-argument
  raise CompileTimeout()


def time_steps(step, args, label: str, budget: float | None) -> dict | None:
  """Warm-up (bounded by `budget` seconds when given), then the timed rounds."""
  if budget:
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(int(budget))
  try:
    start = time.perf_counter()
    for _ in range(args.warmup):
      step()
    torch.cuda.synchronize() if torch.cuda.is_available() else None
    warmup_seconds = time.perf_counter() - start
  except CompileTimeout:
    print(f"{label}: warm-up (compile) passed {budget:.0f} s: not timed", flush=True)
    return None
  finally:
    if budget:
      signal.alarm(0)
  print(f"{label}: warm-up {args.warmup} steps in {warmup_seconds:.1f} s", flush=True)
  times = []
  for _ in range(args.rounds):
    start = time.perf_counter()
    for _ in range(args.steps):
      step()
    torch.cuda.synchronize() if torch.cuda.is_available() else None
    times.append((time.perf_counter() - start) / args.steps)
    print(f"  {label} round: {1e3 * times[-1]:.2f} ms/step", flush=True)
  return dict(warmup_seconds=warmup_seconds, step_ms_median=1e3 * statistics.median(times),
              step_ms_min=1e3 * min(times))


def run(args, batch: int) -> dict:
  device = "cuda" if torch.cuda.is_available() else "cpu"
  torch.manual_seed(0)
  model = GPT(args.vocab, args.seq_len, args.d_model, args.layers, args.heads, args.mlp,
              0.1).to(device)
  optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1,
                                fused=device == "cuda")
  tokens = torch.randint(0, args.vocab, (batch, args.seq_len + 1), device=device)
  x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

  def make_step(forward):
    def step():
      with torch.autocast(device, dtype=torch.bfloat16):
        loss = forward(x, y)
      loss.backward()
      torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
      optimizer.step()
      optimizer.zero_grad(set_to_none=True)
    return step

  result = dict(batch=batch, seq_len=args.seq_len, torch=torch.__version__,
                params=sum(p.numel() for p in model.parameters()),
                device=torch.cuda.get_device_name() if device == "cuda" else "cpu",
                model_flops_per_step=model_flops_per_step(args, batch))
  attention = contextlib_flash() if device == "cuda" else _null()
  with attention:
    result["eager"] = time_steps(make_step(model), args, "eager", None)
    _print_result(result, batch, args)  # A figure even if compiling overruns the step.
    if not args.no_compile:
      compiled = torch.compile(model)
      result["compiled"] = time_steps(make_step(compiled), args, "torch.compile",
                                      args.compile_budget)
  return result


def _print_result(result: dict, batch: int, args) -> None:
  """One RESULT line: the best timing so far (the report reads the last one)."""
  best = result.get("compiled") or result["eager"]
  result["tokens_per_second"] = batch * args.seq_len / (best["step_ms_median"] / 1e3)
  result["batch_asked"] = args.batch
  if torch.cuda.is_available():
    result["peak_bytes_allocated"] = torch.cuda.max_memory_allocated()
  print("RESULT " + json.dumps(result), flush=True)


class _null:
  def __enter__(self):
    return self

  def __exit__(self, *exc):
    return False


def contextlib_flash():
  """SDPA held to its flash backend (an error if flash cannot serve, not a fallback)."""
  from torch.nn.attention import SDPBackend, sdpa_kernel  # pylint: disable=g-import-not-at-top
  return sdpa_kernel(SDPBackend.FLASH_ATTENTION)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--seq_len", type=int, default=1024)
  parser.add_argument("--warmup", type=int, default=3)
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--steps", type=int, default=5)
  parser.add_argument("--compile_budget", type=float, default=90.0)
  parser.add_argument("--no_compile", action="store_true")
  parser.add_argument("--tiny", action="store_true", help="a small model (CPU dry run)")
  args = parser.parse_args()
  args.vocab, args.d_model, args.layers, args.heads, args.mlp = (
      (512, 128, 2, 4, 256) if args.tiny else (32768, 768, 12, 12, 3072))
  torch.backends.cuda.matmul.allow_tf32 = True
  batch, result = args.batch, None
  for attempt in range(2):
    try:
      result = run(args, batch)
      break
    except torch.cuda.OutOfMemoryError as e:
      if attempt:
        raise
      print(f"out of memory at batch {batch}: {str(e).splitlines()[0][:200]}; trying "
            f"{batch // 2}", flush=True)
    gc.collect()  # The failed attempt's tensors, freed once its traceback is gone.
    torch.cuda.empty_cache()
    batch //= 2
  _print_result(result, result["batch"], args)


if __name__ == "__main__":
  main()
