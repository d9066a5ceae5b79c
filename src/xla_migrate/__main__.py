"""``xla-migrate`` and ``python -m xla_migrate``.

``--version`` is answered before the CLI framework and libcst are imported, so it costs almost nothing.
Subcommands are dispatched here on the first argument, so that the main command keeps its paths positional
(``xla-migrate [OPTIONS] PATH...``, as black and ruff's formatter): a file literally named like a
subcommand is migrated as ``./rule``.
"""

from __future__ import annotations

import importlib
import sys

# name -> "module:typer app"; each app gets the arguments after its name.
SUBCOMMANDS = {
    "rule": "xla_migrate.cli_typer:rule_app",
    "verify": "xla_migrate.verify_cli:app",
}


def main() -> None:
    args = sys.argv[1:]
    if args == ["--version"]:
        from . import __version__

        print(f"xla-migrate {__version__}")
        return
    if args and args[0] in SUBCOMMANDS:
        module, _, name = SUBCOMMANDS[args[0]].partition(":")
        getattr(importlib.import_module(module), name)(args=args[1:], prog_name=f"xla-migrate {args[0]}")
        return
    from .cli import run

    run()


if __name__ == "__main__":
    main()
