"""Every configuration key, declared once with a one-line comment.

Presets (`gpt_small.py`, ...) are short diffs of `get_config()`. The returned
ConfigDict is locked, so a preset or a `--config.x=...` override that names a key
which does not exist fails instead of being silently ignored.
Values are checked by `transformer.configuration.validate` before anything compiles.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  """Returns the base configuration (a small decoder on the offline corpus)."""
  config = ml_collections.ConfigDict()
  config.seed = 0  # Seeds parameter init, dropout and the data shuffle.

  # ---- model.* : the architecture (see README for every value) ----
  model = config.model = ml_collections.ConfigDict()
  model.arch = "decoder"  # Topology: "decoder" (GPT) | "encoder" (BERT) | "encoder_decoder" (paper).
  model.head = "lm"  # "lm" (decoder, encoder_decoder) | "mlm" (encoder) | "classification".
  model.pooling = ""  # Classification pooling: "cls" (first token) | "mean" | "last" (decoder).
  model.num_classes = 2  # Classes of the classification head.
  model.num_decoder_layers = 0  # Decoder blocks of encoder_decoder; 0 means num_layers.
  model.share_embeddings = False  # encoder_decoder: one token embedding for source and target.
  model.scan_layers = False  # nn.scan over the blocks: compile time stays flat with depth.
  model.remat = "none"  # Rematerialise blocks: "none" | "full" | "dots" | "dots_no_batch".
  model.rope_max_wavelength = 10000.0  # RoPE base wavelength (position="rope").
  model.relative_buckets = 32  # T5 relative-position buckets (position="relative").
  model.relative_max_distance = 128  # T5 largest distinguished distance (position="relative").
  model.vocab_size = 384  # Rows of the token embedding; >= the tokenizer's vocabulary.
  model.d_model = 256  # Width of the residual stream.
  model.num_layers = 4  # Number of blocks (the encoder's, for encoder_decoder).
  model.num_heads = 4  # Query heads.
  model.num_kv_heads = 0  # Key/value heads (GQA/MQA); 0 means num_heads (MHA).
  model.head_dim = 0  # Per-head width; 0 means d_model // num_heads.
  model.mlp_dim = 1024  # Hidden width of the MLP.
  model.max_len = 256  # Longest sequence the position table covers.
  model.position = "learned"  # learned | sinusoidal | rope | relative (T5 bias) | alibi | none.
  model.norm = "pre"  # Norm placement: "pre" (GPT-2) | "post" (the paper's Add & Norm).
  model.norm_type = "layernorm"  # "layernorm" | "rmsnorm".
  model.norm_epsilon = 1e-5  # Epsilon inside every norm.
  model.activation = "gelu_tanh"  # relu | gelu | gelu_tanh | silu | swiglu | geglu.
  model.use_bias = True  # Biases in dense layers and norms.
  model.tie_embeddings = True  # Output projection shares the token embedding.
  model.scale_embeddings = False  # Multiply token embeddings by sqrt(d_model) (paper).
  model.embed_dropout = 0.0  # Dropout on the summed token + position embedding.
  model.residual_dropout = 0.0  # Dropout on each sublayer output before the residual add.
  model.attention_dropout = 0.0  # Dropout on attention probabilities (needs attention_impl="einsum").
  model.mlp_dropout = 0.0  # Dropout on the MLP hidden activations.
  model.dtype = "auto"  # Compute dtype: "auto" (bfloat16 on GPU/TPU, float32 on CPU) | float32 | bfloat16.
  model.param_dtype = "float32"  # Storage dtype of parameters and optimizer state.
  model.attention_impl = "xla"  # "xla" | "cudnn" (jax.nn.dot_product_attention) | "einsum" (reference).

  # ---- data.* : dataset, tokenizer and input pipeline ----
  data = config.data = ml_collections.ConfigDict()
  data.name = "python_stdlib"  # TFDS dataset name; "python_stdlib" is built offline from this interpreter.
  data.data_dir = ""  # TFDS data dir; "" means $TFDS_DATA_DIR or ~/tensorflow_datasets.
  data.train_split = "train"  # TFDS split to train on.
  data.eval_split = "validation"  # TFDS split to evaluate on.
  data.text_key = "text"  # Feature holding the raw text.
  data.label_key = ""  # Feature holding the class label (model.head="classification").
  data.mask_rate = 0.15  # Masked LM: fraction of tokens chosen (80% mask, 10% random, 10% kept).
  data.continuation_chars = 600  # Seq2seq on plain text: characters per source/target block.
  data.tokenizer = "sentencepiece"  # "sentencepiece" (trained on train split) | "bytes".
  data.spm_train_sentences = 2_000_000  # Lines sampled to train SentencePiece.
  data.seq_len = 256  # Tokens per packed row fed to the model (<= model.max_len).
  data.batch_size = 16  # Global batch size in rows (split over data-parallel devices).
  data.num_threads = 2  # Grain reader threads per process.
  data.download = False  # Allow TFDS to download a catalog dataset that is not prepared yet.

  # ---- optimizer.* : AdamW and the warmup + inverse-sqrt schedule ----
  opt = config.optimizer = ml_collections.ConfigDict()
  opt.schedule = "warmup_rsqrt"  # "warmup_rsqrt" (peak learning_rate) | "noam" (paper) | "constant".
  opt.learning_rate = 1e-3  # Peak learning rate (warmup_rsqrt, constant).
  opt.noam_scale = 1.0  # Paper's schedule: scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5).
  opt.warmup_steps = 100  # Linear warmup steps.
  opt.b1 = 0.9  # Adam beta1.
  opt.b2 = 0.95  # Adam beta2.
  opt.eps = 1e-8  # Adam epsilon.
  opt.weight_decay = 0.1  # Decoupled weight decay on kernels and embeddings (not biases/norms).
  opt.grad_clip_norm = 1.0  # Clip the global gradient norm; 0 disables.
  opt.label_smoothing = 0.0  # Label smoothing of the training cross-entropy.

  # ---- train.* : loop length, logging and evaluation ----
  train = config.train = ml_collections.ConfigDict()
  train.num_steps = 1000  # Optimizer steps in total (a resumed run continues to this).
  train.microbatches = 1  # Gradient accumulation: split each batch into this many slices.
  train.log_every = 10  # Steps between progress lines / metrics.jsonl rows.
  train.eval_every = 200  # Steps between evaluations (and after the last step).
  train.eval_batches = 20  # Batches per evaluation; -1 means the whole eval split.
  train.eval_at_start = True  # Evaluate the untrained model first (the baseline at step 0).

  # ---- checkpoint.* : Orbax checkpointing ----
  ckpt = config.checkpoint = ml_collections.ConfigDict()
  ckpt.every = 200  # Save every this many steps (and after the last step).
  ckpt.keep = 3  # Checkpoints kept on disk.
  ckpt.async_save = True  # Write checkpoints in a background thread.

  # ---- mesh.* : device mesh and logical-to-mesh sharding rules ----
  mesh = config.mesh = ml_collections.ConfigDict()
  # Mesh axes as (name, size); one size may be -1 to take the remaining devices.
  mesh.shape = (("data", -1), ("fsdp", 1), ("tensor", 1))
  # Logical axis name -> mesh axis (or axes, or None for replicated). Data, not code.
  mesh.rules = (
      ("batch", ("data", "fsdp")),
      ("length", None),
      ("embed", "fsdp"),
      ("heads", "tensor"),
      ("kv_heads", "tensor"),
      ("head_dim", None),
      ("mlp", "tensor"),
      ("vocab", "tensor"),
      ("layers", None),
  )

  config.lock()
  return config
