"""``xla-migrate`` and ``python -m xla_migrate``.

``--version`` is answered before the CLI framework and libcst are imported, so it costs almost nothing.
Subcommands are dispatched here on the first argument, so that the main command keeps its paths positional
(``xla-migrate [OPTIONS] PATH...``, as black and ruff's formatter): a file literally named like a
subcommand is migrated as ``./rule``.
"""

from __future__ import annotations

import importlib
import os
import sys

if __name__ == "__main__" and sys.path and os.path.abspath(sys.path[0] or os.curdir) == os.getcwd():
    # ``python -m xla_migrate`` puts the current folder first on sys.path, where a csv.py or json.py of the
    # user's would be imported instead of the standard library's. The console script does not; nor does this.
    del sys.path[0]

# name -> "module:typer app"; each app gets the arguments after its name.
SUBCOMMANDS = {
    "rule": "xla_migrate.cli.typer_app:rule_app",
    "verify": "xla_migrate.verify.cli:app",
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


def console() -> None:
    """The console script and ``python -m xla_migrate``: ``main()``, then the process ends once its output
    is flushed, without the interpreter's teardown (as mypy's --fast-exit). The migrations' objects are
    still alive there (trees and their analyses, in reference cycles until a collection), and collecting
    and freeing them took 7% of a 5 MB script's run. Everything the command writes is written and closed
    by then. The subcommands, a run with XLA_MIGRATE_DEBUG (profilers and coverage tools save at exit) and
    an uncaught exception (its traceback) end the process the usual way."""
    args = sys.argv[1:]
    if os.environ.get("XLA_MIGRATE_DEBUG") or (args and args[0] in SUBCOMMANDS):
        main()
        return
    _interrupt_quietly_until_the_command_runs()
    try:
        main()
        code = 0
    except SystemExit as stop:
        code = stop.code
    if code is not None and not isinstance(code, int):  # sys.exit("message"): printed, status 1
        print(code, file=sys.stderr)
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing more can reach it
            code = code or 1
    os._exit(code or 0)


def _interrupt_quietly_until_the_command_runs() -> None:
    """Ctrl-C while the command starts (imports, parsing the arguments): one line, exit 130, no traceback.
    The command itself (cli.migrate_command) puts Python's handler back and reports an interruption its
    own way (what was written, what was not)."""
    import signal

    def interrupted(signum, frame) -> None:
        os.write(2, b"interrupted\n")
        os._exit(130)

    interrupted.xla_migrate_start_up = True  # what cli.migrate_command replaces
    try:
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not when the shell ignores it
            signal.signal(signal.SIGINT, interrupted)
    except ValueError:  # not the main thread
        pass


if __name__ == "__main__":
    console()
