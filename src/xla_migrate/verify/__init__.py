"""``xla-migrate verify``: run a migrated script on torch_xla and check it. ``core.py`` measures and judges,
``child.py`` is the loader put into the checked script's interpreter, ``cli.py`` the subcommand.

``from xla_migrate import verify; verify.verify(script)`` works as it did when this was one module: the names of
``core`` are looked up there on first use."""

import importlib

_SUBMODULES = ("core", "child", "cli")


def __getattr__(name: str):
    # Never for a submodule's name: the import system asks for those while it imports them.
    if not name.startswith("_") and name not in _SUBMODULES:
        core = importlib.import_module(f"{__name__}.core")
        if hasattr(core, name):
            return getattr(core, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
