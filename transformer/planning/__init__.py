"""Before renting: compile a run's steps for an accelerator slice that is not attached.

What lives where (imports run downwards; nothing here imports transformer.cli):
  topology.py     --topology / --num_slices -> libtpu's abstract devices -> the run's mesh
                  (TPU grids no rentable slice has are refused, naming the nearest)
  gpu.py          --topology=h100:8 -> compile-only CUDA devices from gpu_targets/*.txtpb
                  (jax's CUDA plugin), the memory fraction a run can use
  gpu_targets/    one GpuTargetConfigProto text per GPU, the source of every figure
  hlo_text.py     an optimised HLO module's text, parsed (computations, instructions)
  attention_cost.py  the fused attention calls' FLOPs (cuDNN, splash) and cuDNN's
                  unsized backward workspace
  hlo.py          compiled HLO text -> every kernel a step launches (Launch: FLOPs, HBM
                  bytes, collectives) and their totals (Counts), every loop's trips
                  multiplied out (from its condition on TPU)
  collectives.py  bytes per collective kind (hlo.py's count)
  compiled.py     abstract state and batch -> compiled train / eval / decode steps and
                  XLA's memory and cost analyses, loops multiplied out (StepCost)
  depth.py        a scanned model's HBM bytes from the steps compiled unrolled at two
                  small depths, extrapolated per layer
  kernels.py      where the time goes: every kernel priced on the chip (efficiencies
                  <= 1 of its unit's datasheet peak) and summed by part (matmul,
                  attention, loss, elementwise, optimizer, collectives); the floor
  calibration.py  the GPU efficiencies fitted on measured steps (gpu_calibration.json):
                  the best fit, the range of every fit within tolerance, leave-one-out,
                  the kernel mix against the measured steps'
  estimate.py     step-time estimate (GPU: the kernels' sum, its range and floor; TPU:
                  the bounds), tokens/s, MFU and HFU from a StepCost and hardware.py
  budget.py       --tokens / --price_per_chip_hour: time and cost to train N tokens
  audit.py        parameter / optimizer leaves replicated on a weight-sharding mesh
  plan.py         one config on one slice: all of the above (Plan)
  search.py       levers tried when a step does not fit; the mesh search
  input_rate.py   this host's training input pipeline timed beside the step's demand
  report.py       console lines and the --output JSON

May import: config, distributed, hardware, sharding, model, data, inference,
training, workdir (tests/test_layout.py). jax is imported by these modules, so import the package
only once the mode runs (transformer/cli/compile.py does).
"""
