"""Device and torch.cuda APIs (XLA1xx): the target device, CUDA-only calls, CUDA gates."""
