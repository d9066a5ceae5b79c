"""The command line, ``xla-migrate [OPTIONS] PATH...``. stdout carries one thing: the code, the diff or the
JSON report; the text report and errors go to stderr. Subcommands (``xla-migrate rule CODE``) are
dispatched in ``__main__.py`` before this command parses anything, so paths stay positional. The options
are declared for typer in ``typer_app.py``; ``run`` parses the common command lines itself (see the fast path
in ``options.py``), so a plain run imports no typer.

The modules: ``options`` (arguments, configuration, usage errors), ``main`` (the command: one script or a
tree), ``output`` (the report, diffs, progress), ``discovery`` (finding files, excludes), ``tree`` (one file
of a tree run), ``workers`` (running many), ``config`` (``[tool.xla-migrate]``), ``notebooks``.
"""

from __future__ import annotations

import errno
import os
import sys


class _QuietOnBrokenPipe:
    """A closed stdout or stderr after the run: flushing it says nothing at exit (as click's own wrapper)."""

    def __init__(self, stream):
        self._stream = stream

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as error:
            if error.errno != errno.EPIPE:
                raise

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _run_fast(arguments: dict) -> int:
    """``migrate_command`` as typer's standalone mode runs it: what escapes it ends the same way."""
    from .main import migrate_command
    from .options import EXIT_INTERRUPTED

    try:
        return migrate_command(**arguments)
    except EOFError:
        print(file=sys.stderr)
        print("Aborted!", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        from .output import _err

        _err("interrupted", "red")
        return EXIT_INTERRUPTED
    except OSError as error:
        if error.errno != errno.EPIPE:
            raise
        sys.stdout, sys.stderr = _QuietOnBrokenPipe(sys.stdout), _QuietOnBrokenPipe(sys.stderr)
        return 1


def run() -> None:
    from .options import fast_arguments

    args = sys.argv[1:]
    arguments = None
    # typer answers shell completion requests and keeps tracebacks' typer frames for XLA_MIGRATE_DEBUG.
    if not os.environ.get("_XLA_MIGRATE_COMPLETE") and not os.environ.get("XLA_MIGRATE_DEBUG"):
        arguments = fast_arguments(args)
    if arguments is None:
        from .typer_app import app

        _click_completion_order()

        app(prog_name="xla-migrate")
        return
    sys.exit(_run_fast(arguments))


def _click_completion_order() -> None:
    """Shell completion: click documents ``_XLA_MIGRATE_COMPLETE=bash_source`` (shell first), typer reads
    ``source_bash``; both are taken."""
    value = os.environ.get("_XLA_MIGRATE_COMPLETE", "")
    shell, _, instruction = value.partition("_")
    if shell in ("bash", "zsh", "fish", "powershell", "pwsh") and instruction in ("source", "complete"):
        os.environ["_XLA_MIGRATE_COMPLETE"] = f"{instruction}_{shell}"


def __getattr__(name: str):
    """``cli.app`` and ``cli.rule_app``, the typer applications, imported on first use."""
    if name in ("app", "rule_app"):
        from . import typer_app as cli_typer

        return getattr(cli_typer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
