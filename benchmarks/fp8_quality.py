"""fp8 against bfloat16: the eval loss of shakespeare_char:cpu after the same steps.

Two runs of configs/shakespeare_char.py:cpu from the same seed, identical but for
model.quantization: both compute in bfloat16 (model.dtype=bfloat16), one with the
matmuls in fp8 (model/fp8.py; on a CPU, where XLA has no fp8 GEMM, the fp8 values are
emulated, the same numbers a GPU's fp8 tensor cores take in). Prints each run's eval
loss over the whole validation split and fp8's relative difference, as RESULT lines.

  python benchmarks/fp8_quality.py --data=../shared/data/tiny_shakespeare/input.txt
  python benchmarks/fp8_quality.py --data=PATH --steps=300 --seeds=0,1
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--data", required=True, help="Tiny Shakespeare's input.txt")
  parser.add_argument("--steps", type=int, default=300, help="training steps per run")
  parser.add_argument("--seeds", default="0", help="comma-separated seeds, each a pair")
  args = parser.parse_args()
  if not os.path.isfile(args.data):
    sys.exit(f"--data={args.data}: no such file; expected Tiny Shakespeare's input.txt "
             "(e.g. ../shared/data/tiny_shakespeare/input.txt)")
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  from absl import logging  # pylint: disable=g-import-not-at-top
  from configs import shakespeare_char  # pylint: disable=g-import-not-at-top
  from transformer.training import loop  # pylint: disable=g-import-not-at-top

  logging.set_verbosity(logging.WARNING)
  losses: dict[tuple[int, str], float] = {}
  with tempfile.TemporaryDirectory() as root:
    for seed in (int(s) for s in args.seeds.split(",")):
      for quantization in ("", "fp8"):
        config = shakespeare_char.get_config("cpu")
        config.seed = seed
        config.data.path = os.path.abspath(args.data)
        config.model.update(dtype="bfloat16", quantization=quantization)
        config.train.update(num_steps=args.steps, eval_every=args.steps)
        config.checkpoint.every = args.steps
        name = quantization or "bf16"
        start = time.perf_counter()
        result = loop.train_and_evaluate(config, os.path.join(root, f"{name}_{seed}"))
        losses[seed, name] = float(result["eval_loss"])
        print(f"RESULT seed={seed} {name} eval_loss={losses[seed, name]:.4f} "
              f"({time.perf_counter() - start:.0f} s)", flush=True)
      relative = losses[seed, "fp8"] / losses[seed, "bf16"] - 1
      print(f"RESULT seed={seed} fp8/bf16 eval_loss {relative:+.2%}", flush=True)


if __name__ == "__main__":
  main()
