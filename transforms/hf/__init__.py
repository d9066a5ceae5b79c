"""Hugging Face (XLA6xx): Trainer settings, entry points, padding, loader workers, Accelerate."""
