"""The paper's big Transformer: d_model 1024, 16 heads, MLP 4096, dropout 0.3.

Everything else as configs/transformer_base.py, WMT 2014 English->German included. At vocabulary 37000 it has
214,245,376 parameters, 0.6% above the published 213M.

Full run:  python launch.py --config=configs/transformer_big.py
Quick run:  python launch.py --config=configs/transformer_big.py:local (same as base:local)
"""

import ml_collections

from configs import base
from configs import transformer_base


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  """The paper's big model; `arg="local"` is transformer_base's CPU variant."""
  config = base.get_config()
  transformer_base.paper_base(config)
  config.model.update(d_model=1024, num_heads=16, mlp_dim=4096, embed_dropout=0.3,
                      residual_dropout=0.3)
  if arg == "local":
    transformer_base.shrink_for_cpu(config)
  elif arg:
    raise ValueError(f"configs/transformer_big.py: unknown argument {arg!r}; "
                     "valid: '' or 'local'")
  return config
