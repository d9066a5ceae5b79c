"""The rules, one per file. Each module defines one ``Rule`` subclass; ``xla_migrate.engine.registry`` finds them.

Codes by family: XLA1xx device and torch.cuda APIs; XLA2xx AMP and optimizers; XLA3xx loaders, step
barriers, logging; XLA4xx distributed; XLA5xx checkpoints and I/O; XLA6xx Hugging Face; XLA9xx findings only.
"""
