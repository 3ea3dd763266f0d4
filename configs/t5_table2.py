"""T5's Table 2 at CPU scale: architectures x objectives on one corpus (issue 53 item 5).

Raffel et al. 2020, section 3.2, Table 2 compares, at equal compute, an encoder-decoder
(L + L layers: 2P parameters, M FLOPs a token pair), a decoder-only language model and
a prefix LM (L layers: P parameters, and M FLOPs, since they read the inputs and the
targets as one sequence twice as long), each pretrained with a denoising objective and
with an LM objective. The paper's ranking, denoising: encoder-decoder 83.28 (GLUE) >
prefix LM 81.82 > language model 74.70; LM objective: prefix LM 79.68 ~ encoder-decoder
79.56 > language model 73.78 (the shared-parameter and 6-layer encoder-decoder arms are
not here: model.* has no field tying the encoder's and decoder's blocks).

Here P is one stack of this preset's shape (4 layers, d_model 128, 4 heads, MLP 512,
relative position buckets as T5, characters of Tiny Shakespeare); the six arms are one
`--mode=sweep` spec, configs/t5_table2.json:

  arm                 model.arch       model.objective  prefix_attention  seq_len  params  FLOPs
  enc-dec, denoising  encoder_decoder  span_corruption  -                 64 + 64  2P      M
  enc-dec, LM         encoder_decoder  prefix_lm        -                 64 + 64  2P      M
  LM, denoising       decoder          span_corruption  causal            128      P       M
  LM, LM              decoder          causal_lm        -                 128      P       M
  prefix LM, denoise  decoder          span_corruption  bidirectional     128      P       M
  prefix LM, LM       decoder          prefix_lm        bidirectional     128      P       M

Same corpus, same tokens: every arm reads 128 token positions a row (an encoder-decoder
64 on each side, a decoder 128 holding both), 12 rows a step, 2000 steps. The exact
parameter counts are what each run's run.json records.

Command (not yet run: it did not fit the session that wrote it; docs/results.md says so
and will hold the numbers):

  python launch.py --mode=sweep --config=configs/t5_table2.py \
    --config.data.path=../shared/data/tiny_shakespeare/input.txt \
    --workdir=runs/t5_table2 --sweep=configs/t5_table2.json
  python launch.py --mode=compare --workdir=runs/t5_table2
"""

import ml_collections

from configs import shakespeare_char


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  """The arms' shared settings (an encoder-decoder span-corruption arm by default; the
  sweep file sets each arm's topology, objective and lengths)."""
  if arg:
    raise ValueError(f"configs/t5_table2.py: unknown argument {arg!r}; it has none (the "
                     "arms are configs/t5_table2.json)")
  config = shakespeare_char.get_config("cpu")
  config.model.update(arch="encoder_decoder", objective="span_corruption",
                      num_decoder_layers=4, position="relative", share_embeddings=True)
  # Text-to-text objectives read packed windows (random windows are a causal LM's).
  config.data.update(lm_windows="packed")
  config.train.update(sample_prompt="")
  return config
