"""Before renting: compile a run's steps for an accelerator slice that is not attached.

What lives where (imports run downwards; nothing here imports transformer.cli):
  topology.py     --topology / --num_slices -> libtpu's abstract devices -> the run's mesh
  collectives.py  bytes per collective kind, read from compiled HLO text
  compiled.py     abstract state and batch -> compiled train / eval / decode steps and
                  XLA's memory and cost analyses (StepCost)
  estimate.py     step-time bounds, tokens/s and MFU from a StepCost and hardware.py
  audit.py        parameter / optimizer leaves replicated on a weight-sharding mesh
  plan.py         one config on one slice: all of the above (Plan)
  search.py       levers tried when a step does not fit; the mesh search
  report.py       console lines and the --output JSON

May import: configuration, objective, distributed, hardware, sharding, model, data,
inference, training, workdir (tests/test_layout.py). jax is imported by these modules, so
import the package only once the mode runs (transformer/cli/compile.py does).
"""
