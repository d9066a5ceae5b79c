"""Checkpoints and I/O (XLA5xx)."""
