"""Configuration: validation of every config key, and the frozen ModelConfig.

configs/base.py declares every key once; this package checks them (before anything
touches data or compiles) and turns `config.model` into the object the modules read.
Cut by concern, from the ground up:

  errors.py      ConfigError, DataError and `fail`, the one message shape
  attention.py   the attention kernels' table (KERNELS): platforms, the layer kinds each
                 serves, limits and splash's block rule; validate_lengths
  checks.py      the typed field checks (is_int, is_number, check_int, check_bool, ...)
  modern.py      the Llama / Mistral / Qwen / Gemma axes: windows, softcaps, RoPE variants
  moe.py         the mixture-of-experts fields and their split over the mesh
  lora.py        the LoRA fields (model.lora_*): LORA_TARGETS, the projections adapted
  objective.py   the training objectives, one Objective each, resolved once from
                 (model.arch, model.head, model.objective): inputs, targets, sides,
                 pipeline, modes; text-to-text ones converted onto a topology
  denoisers.py   the text-to-text denoisers (MIXTURES), their window lengths, checks
  model.py       validate_model, the model choice registries (REMAT_POLICIES, ...),
                 objective_of, and ModelConfig generated from base.py's model block
  data.py        the data.* fields
  decode.py      the decode.* fields (run again after translate/generate flags)
  train.py       the optimizer.*, train.* and checkpoint.* fields
  mesh.py        the mesh.* fields: mesh axes and the logical-axis vocabulary
  validation.py  validate(config): every step above, in the order errors are reported

May import: nothing of transformer/ outside this package (it is the ground every
other part imports), and configs/base.py (ModelConfig's fields). Each choice key's
valid values are one table; where that table holds model/ or training/ code, the
name tuple here is held equal to it by tests/test_config_registries.py.
"""
