"""The model: pure flax.linen modules, every architectural choice a ModelConfig field.

  initializers.py  the initialisation families (gpt2, bert, xavier): INITS
  attention.py     MultiHeadAttention: projections, RoPE, norms, the KV cache
  splash.py        Pallas splash attention (the TPU kernel), whole and per context shard
  attention_ops.py the kernels (einsum, xla, cuDNN, Pallas splash, auto) and the masks
                   each wants; make_attention_mask, the einsum reference
  cudnn_guard.py   what jax's cuDNN attention gets wrong (grouped-query k/v offsets on
                   jax < 0.11.1, unwritten padding) and the guards around it
  context.py       context parallelism: the sequence's shards over the "length" rule's
                   axes, the zig-zag order that balances causal work across them
  dropout.py       flax's Dropout with hardware random bits off the CPU
  positions.py     RoPE (scaled, partial), T5 relative bias, ALiBi, the sinusoidal table;
                   POSITIONS, what each model.position value does
  norms.py         LayerNorm / RMSNorm / Gemma's (1 + scale) RMSNorm, one make_norm;
                   NORM_PLACEMENTS, where a block puts them (pre, post, sandwich)
  fp8.py           model.quantization="fp8": flax's fp8 matmul, its scaling state in params
  mlp.py           the dense MLP and the activation table; model.mlp_impl's choice
  mlp_pallas.py    the MLP's Pallas GPU kernels: the activation inside the matmuls
  lora.py          LoRA: a low-rank adapter beside a projection (model.lora_*), its merge
  moe.py           mixture of experts: router, dropless / capacity dispatch, aux losses
  layers.py        StackInputs (what every block of a stack reads), the shared Block
                   (dense or MoE MLP), scan/remat stacks
  lm_head.py       LogitsHead: hidden states -> float32 logits, the one projection
  models.py        Decoder, Encoder, EncoderDecoder, heads, the ARCHITECTURES registry
  objectives.py    an Objective's batch fields into model.apply, logits and targets out

Shape letters, one legend for the whole package. An array's name ends in its axes
(`q_BLHD`, `logits_BLV`, `mask_B1LS`) and einsum equations use the same letters;
tests/test_shape_legend.py fails on a letter this table does not hold:

  B  batch
  L  the length a stack runs on: its queries, an encoder-decoder's target
  S  the length attended to: keys, an encoder-decoder's source, the decode cache's slots
  H  query heads
  K  key/value heads
  G  query heads per key/value head (H / K, grouped-query attention)
  J  a key/value head's slots in the joined q/k/v projection (G + 2: its G query heads,
     its key, its value; attention.py's _fused_qkv)
  D  head dim
  R  RoPE's rotated pairs (2R <= D features turn)
  U  T5 relative-position buckets
  E  embed (d_model)
  F  MLP hidden (dense, or one expert's)
  V  vocab
  N  tokens flattened (B * L)
  X  experts
  T  experts chosen per token (top-k)
  M  (token, expert) assignments (N * T)
  C  capacity slots of an expert
  1  an axis of size 1 (broadcasts)

May import: transformer.config and transformer.accelerator only (nothing of training,
inference, data or the workdir). Parameter paths are a checkpoint API: keep them stable.
"""
