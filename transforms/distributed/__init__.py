"""Distributed training (XLA4xx): ranks, samplers, the process group, DDP, gradient reduction, the entry point."""
