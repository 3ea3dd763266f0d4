"""Datasets (TFDS builders and catalog loading), tokenizers and the grain pipeline."""
