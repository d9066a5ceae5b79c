"""Findings only (XLA9xx): what has no XLA form and needs a person (CUDA left, custom kernels, apex, torch.compile)."""
