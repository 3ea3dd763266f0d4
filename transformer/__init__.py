"""transformer: one small JAX/Flax library for the Transformer family."""
