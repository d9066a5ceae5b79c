"""xla-migrate: migrate CUDA PyTorch training scripts to PyTorch/XLA.

    >>> from xla_migrate import migrate
    >>> result = migrate(open("train.py").read(), target="2.9")
    >>> print(result.diff)
"""

__version__ = "0.1.0"

__all__ = ["MigrationResult", "__version__", "migrate", "migrate_file"]


def __getattr__(name: str):
    # Lazy, so `xla-migrate --version` and `import xla_migrate` stay fast (libcst loads only when used).
    if name in ("migrate", "migrate_file", "MigrationResult"):
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'xla_migrate' has no attribute {name!r}")
