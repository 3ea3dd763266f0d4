"""T5's Table 2 at CPU scale: architectures x objectives on one corpus (issue 53 item 5).

Raffel et al. 2020, section 3.2, Table 2 compares, at equal compute, an encoder-decoder
(L + L layers: 2P parameters, M FLOPs a token pair), a decoder-only language model and
a prefix LM (L layers: P parameters, and M FLOPs, since they read the inputs and the
targets as one sequence twice as long), each pretrained with a denoising objective and
with an LM objective, then fine-tuned on each downstream task. The paper's ranking
(GLUE average), denoising: encoder-decoder 83.28 > prefix LM 81.82 > language model
74.70; LM objective: prefix LM 79.68 ~ encoder-decoder 79.56 > language model 73.78 (the
shared-parameter and 6-layer encoder-decoder arms are not here: model.* has no field
tying the encoder's and decoder's blocks, docs/objectives.md says why).

Here P is one stack of this preset's shape (2 layers, d_model 64, 4 heads, MLP 256,
relative position buckets as T5, one tied embedding of 384 rows: UTF-8 bytes, which
hold Tiny Shakespeare, German and SST-2 alike, and T5's 100 sentinels); the arms are one
`--mode=sweep` spec, configs/t5_table2.json:

  arm                 model.arch       model.objective  prefix_attention  seq_len  params  FLOPs
  enc-dec, denoising  encoder_decoder  span_corruption  -                 64 + 64  2P      M
  enc-dec, LM         encoder_decoder  prefix_lm        -                 64 + 64  2P      M
  LM, denoising       decoder          span_corruption  causal            128      P       M
  LM, LM              decoder          causal_lm        -                 128      P       M
  prefix LM, denoise  decoder          span_corruption  bidirectional     128      P       M
  prefix LM, LM       decoder          prefix_lm        bidirectional     128      P       M

Same corpus, same tokens: every arm reads 128 token positions a row (an encoder-decoder
64 on each side, a decoder 128 holding both), 16 rows a step, for train.num_steps. The
exact parameter counts are what each run's run.json records.

Fine-tuning (`:multi30k`, `:sst2`): every pretrained arm, with config.init_from, as a
text-to-text pair task: English -> German on Multi30k (BLEU on test_2016_flickr at the
end, greedy as T5 decodes), SST-2 as "sentence -> label word" (the label's name, "0" or
"1": eval_label_accuracy on the dev split at the end). An encoder-decoder reads 128
positions a side, a decoder 256 (`[bos]` source target), so the fine-tunes keep the
paper's accounting; the LM arms fine-tune with causal attention throughout, as the
paper's language model does. configs/t5_table2_finetune.json lists the runs (each
pretrained workdir and its lengths); the same list serves both tasks.

Commands, results, hardware: docs/results.md, "T5's Table 2 at CPU scale".
"""

import ml_collections

from configs import shakespeare_char

# The fine-tuning tasks (`get_config(arg)`): the data.* keys of each, the eval split
# the decoded metric is read on.
TASKS = {
    "multi30k": dict(name="local_parallel", source_language="en", target_language="de",
                     eval_split="test_2016_flickr"),
    "sst2": dict(name="local_tsv", text_key="sentence", label_key="label",
                 eval_split="validation"),
}


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  """The arms' shared settings (an encoder-decoder span-corruption arm by default; the
  sweep file sets each arm's topology, objective and lengths); `arg` "multi30k" or
  "sst2": the fine-tuning of a pretrained arm (config.init_from) on that task."""
  if arg and arg not in TASKS:
    raise ValueError(f"configs/t5_table2.py: unknown argument {arg!r}; valid: '' "
                     f"(pretraining: the arms are configs/t5_table2.json) or "
                     f"{', '.join(repr(t) for t in TASKS)} (fine-tuning)")
  config = shakespeare_char.get_config("cpu")
  # max_len bounds the lengths only (relative positions have no table): the fine-tunes'
  # 256-token decoder rows need it.
  config.model.update(arch="encoder_decoder", objective="span_corruption", vocab_size=384,
                      d_model=64, num_layers=2, num_heads=4, mlp_dim=256, max_len=256,
                      position="relative", share_embeddings=True)
  # Text-to-text objectives read packed windows (random windows are a causal LM's).
  config.data.update(tokenizer="bytes", lm_windows="packed", seq_len=64, batch_size=16)
  config.optimizer.update(warmup_steps=30)
  config.train.update(num_steps=300, log_every=50, eval_every=150, eval_batches=-1,
                      eval_at_start=False, steps_per_call=10, sample_prompt="")
  config.checkpoint.update(every=300)
  if arg:
    fine_tune(config, arg)
  return config


def fine_tune(config: ml_collections.ConfigDict, task: str) -> None:
  """A pretrained arm (config.init_from: its model and tokenizer) on `task`, text-to-text."""
  config.model.update(objective="prefix_lm")
  config.data.update(packing="pack", overlong="truncate",
                     seq_len=256, batch_size=8, **TASKS[task])
  # Small pretrained models: the pretraining's own rate, not fine_tune's 5e-5 (made for
  # large ones), decayed to 0 over the fine-tuning.
  config.init_from_optimizer = "preset"
  config.optimizer.update(schedule="cosine", learning_rate=1e-3, min_learning_rate=0.0,
                          warmup_steps=20, decay_steps=0, weight_decay=0.0)
  config.train.update(num_steps=200, eval_every=200, eval_batches=-1, eval_at_start=False)
  config.checkpoint.update(every=200)
  config.decode.update(beam_size=1)  # Greedy, as T5 decodes.
  if task == "multi30k":
    # 100 sentences: BLEU stays near 0 at this budget (0.01 on the whole split for the
    # denoising encoder-decoder, 300 s of greedy decoding on the shared cores), and the
    # comparison is the test split's loss per target byte, the same tokens for every arm.
    config.train.bleu_examples = 100
  else:
    # The whole SST-2 dev split; its answer is one byte and [eos]. 200 steps left every
    # arm at chance (measured: 50.9% for the denoising encoder-decoder).
    config.train.update(label_examples=872, num_steps=500, eval_every=500)
    config.checkpoint.update(every=500)
    config.decode.update(max_length_offset=4)
