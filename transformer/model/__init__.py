"""The model: pure flax.linen modules, every architectural choice a ModelConfig field.

  initializers.py  the initialisation families (gpt2, bert, xavier)
  attention.py     MultiHeadAttention: projections, RoPE, norms, the KV cache
  attention_ops.py the kernels (einsum, xla, cuDNN, Pallas splash, auto) and the masks
                   each wants; make_attention_mask, the einsum reference
  dropout.py       flax's Dropout with hardware random bits off the CPU
  positions.py     RoPE (scaled, partial), T5 relative bias, ALiBi
  norms.py         LayerNorm / RMSNorm / Gemma's (1 + scale) RMSNorm, one make_norm
  mlp.py           the dense MLP and the activation table
  moe.py           mixture of experts: router, dropless / capacity dispatch, aux losses
  layers.py        the shared Block (dense or MoE MLP), sinusoidal table, scan/remat stacks
  models.py        Decoder, Encoder, EncoderDecoder, heads, the ARCHITECTURES registry
  objectives.py    an Objective's batch fields into model.apply, logits and targets out

May import: transformer.config and transformer.accelerator only (nothing of training, inference, data or the
workdir). Parameter paths are a checkpoint API: keep them stable.
"""
