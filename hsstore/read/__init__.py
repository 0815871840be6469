"""Datasets for training and eval over committed variants (no model, no transformers)."""
