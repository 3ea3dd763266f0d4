"""The one table of accelerator chips: memory, peak FLOP/s and bandwidths, with sources.

`flops.PEAK_BF16_FLOPS` (the MFU denominator of real runs) and the compile mode's memory
verdict and step-time estimate (`transformer/planning/`) both read this table, so a
chip's figures live in one place. Imports nothing of the project.

A JAX device is one chip from TPU v4 on (v4 and v5p chips have two TensorCores that
run as one "megacore" device); on TPU v2 and v3 it is one TensorCore, half a chip.

Units: bytes, FLOP/s and bytes/s. `hbm_bytes` is the published capacity; the runtime
keeps a little of it for itself, so a step that needs the last few hundred MiB can
still fail on the chip. `ici_bytes_per_second` is the chip's one-way interconnect
bandwidth summed over its links (ICI on TPUs, NVLink on GPUs): the most bytes a chip
can send per second to its neighbours.

Sources (checked 2026-11):
  [v4]   cloud.google.com/tpu/docs/v4: 275 TFLOP/s bf16, HBM2 32 GiB at 1200 GB/s.
         ICI is not in that table; How to Scale Your Model (jax-ml.github.io/
         scaling-book/tpus) gives 45 GB/s one-way per link, 6 links (3D torus).
  [v5e]  cloud.google.com/tpu/docs/v5e: 197 TFLOP/s bf16, 16 GB HBM2 at 819 GB/s,
         ICI 1600 Gbps (= 200 GB/s one-way; "400 GBps bidirectional").
  [v5p]  cloud.google.com/tpu/docs/v5p: 459 TFLOP/s bf16, 95 GB HBM2e at 2765 GB/s,
         ICI 4800 Gbps (= 600 GB/s one-way).
  [v6e]  cloud.google.com/tpu/docs/v6e: 918 TFLOP/s bf16, 32 GB HBM at 1638 GB/s,
         ICI 800 GB/s bidirectional (= 400 GB/s one-way).
  [h100] NVIDIA H100 Tensor Core GPU datasheet, SXM5: 989 TFLOP/s dense bf16 (1979
         with sparsity), 80 GB HBM3 at 3.35 TB/s, NVLink 900 GB/s (both directions);
         the other units' peaks from the same column: FP8 tensor 1979 TFLOP/s dense
         (3958 sparse), TF32 tensor 494.5 dense (989 sparse), FP32 (CUDA cores, no
         tensor cores) 67 TFLOP/s.
  [h200] NVIDIA H200 datasheet, SXM: 989 TFLOP/s dense bf16, 141 GB HBM3e at 4.8 TB/s,
         NVLink 900 GB/s; FP8, TF32 and FP32 as the H100 SXM (the same GH100 die).
  [a100] NVIDIA A100 datasheet, 80GB SXM: 312 TFLOP/s dense bf16, 80 GB HBM2e at
         2039 GB/s, NVLink 600 GB/s; TF32 tensor 156 TFLOP/s dense, FP32 19.5, no FP8.
  Peaks only (chips the compile mode does not target): v2, v3 (per TensorCore, Cloud
  TPU docs), L4, L40S, H100 PCIe / NVL, GH200, B200 (NVIDIA datasheets, dense bf16).
"""

from __future__ import annotations

import dataclasses
import re

GiB = 2 ** 30
GB = 10 ** 9


@dataclasses.dataclass(frozen=True)
class Chip:
  """Published figures of one accelerator chip (one JAX device, see the module doc)."""

  name: str  # Short name used in reports: "v5e", "h100".
  bf16_flops: float  # Dense bfloat16 peak FLOP/s.
  hbm_bytes: int | None = None  # None: not in the table (peak-only rows).
  hbm_bytes_per_second: float | None = None
  ici_bytes_per_second: float | None = None  # One-way, summed over the chip's links.
  platform: str = "tpu"  # "tpu" | "gpu".
  # The other units' dense peaks, where the datasheet gives them (GPUs): the tensor
  # cores' fp8 and TF32 rates and the CUDA cores' float32 rate (no tensor cores).
  fp8_flops: float | None = None
  tf32_flops: float | None = None
  f32_flops: float | None = None

  @property
  def has_memory_figures(self) -> bool:
    """Whether the table knows enough of this chip for a memory verdict and an estimate."""
    return None not in (self.hbm_bytes, self.hbm_bytes_per_second, self.ici_bytes_per_second)

  def matmul_peak(self, dtype: str) -> float:
    """The fastest datasheet rate at which a matmul with `dtype` operands can run.

    "f32": TF32 tensor cores where the chip has them (XLA's DEFAULT precision allows
    TF32 on GPUs), else a third of bf16 (a TPU's DEFAULT f32 dot is 1-3 bf16 passes);
    fp8: the fp8 tensor peak where the chip has one, else bf16's; other types bf16's
    (f64 a sixteenth).
    """
    if dtype == "f32":
      return self.tf32_flops or self.bf16_flops / 3
    if dtype in ("f8e4m3fn", "f8e5m2", "s8"):
      return self.fp8_flops or self.bf16_flops
    if dtype == "f64":
      return self.bf16_flops / 16
    return self.bf16_flops


# Keyed by the words a lower-case `device_kind` contains ("NVIDIA A100-SXM4-80GB" has
# "a100"; the longest match wins, so "tpu v5 lite" is v5e, not v5p).
CHIPS: dict[str, Chip] = {
    "tpu v2": Chip("v2", 22.5e12),
    "tpu v3": Chip("v3", 61.5e12),
    "tpu v4": Chip("v4", 275e12, 32 * GiB, 1200 * GB, 6 * 45 * GB),  # [v4]
    "tpu v5 lite": Chip("v5e", 197e12, 16 * GiB, 819 * GB, 200 * GB),  # [v5e]
    "tpu v5": Chip("v5p", 459e12, 95 * GiB, 2765 * GB, 600 * GB),  # [v5p]
    "tpu v6 lite": Chip("v6e", 918e12, 32 * GiB, 1638 * GB, 400 * GB),  # [v6e]
    "a100": Chip("a100", 312e12, 80 * GB, 2039 * GB, 300 * GB, "gpu",  # [a100]
                 tf32_flops=156e12, f32_flops=19.5e12),
    "l4": Chip("l4", 121e12, platform="gpu"),
    "l40s": Chip("l40s", 362e12, platform="gpu"),
    "h100": Chip("h100", 989e12, 80 * GB, 3350 * GB, 450 * GB, "gpu",  # [h100]
                 fp8_flops=1979e12, tf32_flops=494.5e12, f32_flops=67e12),
    "h100 pcie": Chip("h100 pcie", 756e12, platform="gpu"),
    "h100 nvl": Chip("h100 nvl", 835e12, platform="gpu"),
    "h200": Chip("h200", 989e12, 141 * GB, 4800 * GB, 450 * GB, "gpu",  # [h200]
                 fp8_flops=1979e12, tf32_flops=494.5e12, f32_flops=67e12),
    "gh200": Chip("gh200", 989e12, platform="gpu"),
    "b200": Chip("b200", 2250e12, platform="gpu"),
}
# Other spellings of the same chips (the Cloud names of the `device_kind`s above).
ALIASES = {"tpu v5e": "tpu v5 lite", "tpu v5p": "tpu v5", "tpu v6e": "tpu v6 lite"}
# TPU capacities are taken as GiB (the v4 page writes "32 GiB"; the v5e/v5p/v6e pages
# write "GB" for the same binary-sized HBM stacks), NVIDIA's "80 GB" as decimal. Read
# either way the figure moves by 7%: a verdict within that margin is a close call.


def chip_of(device_kind: str) -> Chip | None:
  """The table's chip whose key the lower-case `device_kind` contains, or None."""
  kind = device_kind.lower()
  keys = list(CHIPS) + list(ALIASES)
  matches = [key for key in keys
             if re.search(rf"(^|[\s_-]){re.escape(key)}($|[\s_-])", kind)]
  if not matches:
    return None
  key = max(matches, key=len)
  return CHIPS[ALIASES.get(key, key)]
