"""Hugging Face folders <-> workdirs, one module per family behind a small shared part.

  common.py    reading a folder (safetensors only), the strict field and tensor
               accounting, the vocabulary renumbering, shared tensor helpers
  importer.py  --mode=import: the family registry, convert_folder, writing the workdir
  gpt2.py      GPT-2 in (GPT2LMHeadModel, GPT2Model) and out (export_gpt2)
  bert.py      BERT in (MLM head, pooler, token types)
  marian.py    Marian in (opus-mt)
  t5.py        T5 in (v1.0, v1.1 / Flan-T5 / mT5, gated-SiLU), and Switch Transformers
               (T5 with top-1 routed experts)
  llama.py     Llama 2 / 3, Mistral, Qwen2, Qwen3 in, and out (export_llama); the
               Llama-shaped decoder mapping gemma.py reuses
  gemma.py     Gemma 1, 2, 3 (text) in
  mixtral.py   Mixtral and Qwen2-MoE in: llama.py's decoder with routed experts
  phi3.py      Phi-3 / Phi-4-mini in: llama.py's decoder with fused projections, partial
               rotary and LongRoPE

A family module has PREFIXES and convert(fields, tensors, files) -> common.Converted.
May import: config, sharding, model, data, inference, workdir.
"""
