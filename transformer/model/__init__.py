"""The model: pure flax.linen modules, every architectural choice a ModelConfig field.

  initializers.py  the initialisation families (gpt2, bert, xavier)
  attention.py     make_attention_mask, MultiHeadAttention, the einsum reference
  positions.py     RoPE (scaled, partial), T5 relative bias, ALiBi
  norms.py         LayerNorm / RMSNorm / Gemma's (1 + scale) RMSNorm, one make_norm
  mlp.py           the dense MLP and the activation table
  moe.py           mixture of experts: router, dropless / capacity dispatch, aux losses
  layers.py        the shared Block (dense or MoE MLP), sinusoidal table, scan/remat stacks
  models.py        Decoder, Encoder, EncoderDecoder, heads, the ARCHITECTURES registry
  objectives.py    an Objective's batch fields into model.apply, logits and targets out

May import: transformer.config only (nothing of training, inference, data or the
workdir). Parameter paths are a checkpoint API: keep them stable.
"""
