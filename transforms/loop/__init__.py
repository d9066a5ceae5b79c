"""The training loop (XLA3xx): device loaders, step barriers, host reads and logging, dynamic shapes."""
