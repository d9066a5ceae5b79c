"""``xla-migrate verify``: the command line of :mod:`xla_migrate.verify.core` (a subcommand: ``__main__`` dispatches
to ``app``).

The report goes to stdout (text, or one JSON object with --format json); a check that cannot run is one
line on stderr. Exit codes: 0 clean, 1 slowdown or divergence, 2 cannot run.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Optional

import typer
from typer.core import TyperCommand

from . import core as verification

FORMATS = ("text", "json")

app = typer.Typer(add_completion=False, rich_markup_mode=None, pretty_exceptions_enable=False,
                  context_settings={"help_option_names": ["-h", "--help"]})


class _Command(TyperCommand):
    """The usage line as people write it: typer prints its arguments with type tags (``SCRIPT <str>``) and
    braces (``{SCRIPT}``); the help text describes them instead."""

    def format_usage(self, ctx, formatter) -> None:
        formatter.write_usage(ctx.command_path, "[OPTIONS] SCRIPT [-- SCRIPT ARGS...]")


@app.command(cls=_Command)
def verify(
    script: str = typer.Argument(..., metavar="SCRIPT", hidden=True, help="The (migrated) script to run on torch_xla."),
    script_args: Optional[list[str]] = typer.Argument(None, metavar="[-- SCRIPT ARGS]", show_default=False, hidden=True,
                                                      help="Arguments for the script (and the original), after --."),
    against: Optional[str] = typer.Option(None, "--against", metavar="ORIGINAL", help="Also run ORIGINAL on plain CPU torch (CUDA hidden) and compare the loss curves (fp32: within 1e-3; AMP: finite and decreasing)."),
    python: Optional[str] = typer.Option(None, "--python", metavar="PY", envvar="XLA_MIGRATE_PYTHON", help="Interpreter with torch_xla, when the current one has none."),
    steps: Optional[int] = typer.Option(None, "--steps", metavar="N", help="Stop the run after N step markers (default: the script's own end)."),
    device: str = typer.Option("cpu", "--device", metavar="cpu|auto", help="cpu: PJRT CPU, CUDA hidden (default); auto: the accelerator torch_xla finds (or PJRT_DEVICE)."),
    loss_regex: Optional[str] = typer.Option(None, "--loss-regex", metavar="RE", help="Where the loss is in the output: the regex's first group (default: the number after 'loss')."),
    timeout: Optional[float] = typer.Option(None, "--timeout", metavar="SECONDS", help="End each run after this long (a hang is reported as a crash)."),
    output_format: str = typer.Option("text", "--format", metavar="FORMAT", help="text or json (one object on stdout, schema docs/verify.schema.json)."),
) -> None:
    """Run a migrated script on torch_xla (PJRT CPU by default) and check it: does it run, compile once,
    run one graph per step, avoid host reads and CPU fallbacks, and learn like the original.

    SCRIPT is the (migrated) script to run; the arguments after -- go to it (and to the original)."""
    if output_format not in FORMATS:
        _err(f"error: --format {output_format}: expected one of {', '.join(FORMATS)}")
        raise typer.Exit(verification.EXIT_CANNOT_RUN)
    try:
        report = verification.verify(script, script_args or [], against=against, python=python, steps=steps,
                                     device=device, loss_regex=loss_regex, timeout=timeout)
    except Exception as error:  # a bug in xla-migrate: one line, and the traceback on request
        if os.environ.get("XLA_MIGRATE_DEBUG"):
            raise
        _err(f"error: internal error in xla-migrate verify ({type(error).__name__}: {error}); "
             "set XLA_MIGRATE_DEBUG=1 for the traceback and please report it")
        raise typer.Exit(verification.EXIT_CANNOT_RUN) from None
    emit(report, output_format)
    raise typer.Exit(report.exit_code)


def emit(report: verification.Report, output_format: str = "text", stream=None) -> None:
    """The report: JSON, or text (a check that cannot run is one `error:` line on stderr)."""
    stream = stream or sys.stdout
    if output_format == "json":
        stream.write(json.dumps(report.to_json(), indent=2) + "\n")
        stream.flush()
        return
    if report.cannot_run:
        _err(f"error: {report.cannot_run}")
        return
    for line in verification.render_text(report):
        print(line, file=stream)
    stream.flush()


def _err(line: str) -> None:
    print(line, file=sys.stderr)

