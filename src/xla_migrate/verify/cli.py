"""``xla-migrate verify``: the command line of :mod:`xla_migrate.verify.core` (a subcommand: ``__main__`` dispatches
to ``app``).

The report goes to stdout (text, or one JSON object with --format json); a check that cannot run is one
line on stderr (after the XLA run's figures, when it ran). Exit codes: 0 clean, 1 crash, not on XLA,
divergence or slowdown, 2 cannot run; stopped by SIGINT, SIGTERM or SIGHUP: 128 + the signal's number, after
one line on stderr naming the processes it ended.
"""

from __future__ import annotations

import json
import os
import shlex
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
    against: Optional[str] = typer.Option(None, "--against", metavar="ORIGINAL", help="Also run ORIGINAL on plain CPU torch (CUDA hidden) and compare the losses: fp32 within 1e-3 at every value; mixed precision or runs whose random numbers differ (dropout on the device, unseeded generators) by their smoothed curves (R² and relative L1)."),
    against_args: Optional[str] = typer.Option(None, "--against-args", metavar="ARGS", help="The original's own arguments, one string split like a shell (default: the script's)."),
    deterministic: bool = typer.Option(False, "--deterministic", help="Run both with dropout switched off (random modules in eval mode), for the strict comparison."),
    python: Optional[str] = typer.Option(None, "--python", metavar="PY", envvar="XLA_MIGRATE_PYTHON", help="Interpreter with torch_xla, when the current one has none."),
    steps: Optional[int] = typer.Option(None, "--steps", metavar="N", help="Stop the run after N step markers (default: the script's own end)."),
    device: str = typer.Option("cpu", "--device", metavar="cpu|auto", help="cpu: PJRT CPU, CUDA hidden (default); auto: the accelerator torch_xla finds (or PJRT_DEVICE)."),
    loss_regex: Optional[str] = typer.Option(None, "--loss-regex", metavar="RE", help="Where the loss is in the output: the regex's first group (default: the number after 'loss')."),
    timeout: Optional[float] = typer.Option(None, "--timeout", metavar="SECONDS", help="End each run after this long (a hang is reported as a crash)."),
    devices: Optional[int] = typer.Option(None, "--devices", metavar="N", help="Run SCRIPT as one SPMD program on N PJRT CPU devices (CPU_NUM_DEVICES=N; a script migrated with --data-parallel spmd) and ORIGINAL as a world of one process (torchrun's variables for rank 0 of 1): losses, compilations and graph executions per step compared as usual; a script that does not span the N devices is a problem."),
    output_format: str = typer.Option("text", "--format", metavar="FORMAT", help="text or json (one object on stdout, schema docs/verify.schema.json)."),
) -> None:
    """Run a migrated script on torch_xla (PJRT CPU by default) and check it: does it run, compile once,
    run one graph per step, avoid host reads and CPU fallbacks, and learn like the original.

    SCRIPT is the (migrated) script to run; the arguments after -- go to it (and to the original)."""
    if output_format not in FORMATS:
        _err(f"error: --format {output_format}: expected one of {', '.join(FORMATS)}")
        raise typer.Exit(verification.EXIT_CANNOT_RUN)
    try:
        original_args = None if against_args is None else shlex.split(against_args)
    except ValueError as error:
        _err(f"error: --against-args {against_args!r}: {error}")
        raise typer.Exit(verification.EXIT_CANNOT_RUN) from None
    try:
        with verification.stop_on_signals():
            report = verification.verify(script, script_args or [], against=against, against_args=original_args,
                                         python=python, steps=steps, device=device, loss_regex=loss_regex,
                                         timeout=timeout, deterministic=deterministic, devices=devices)
    except verification.Interrupted as stop:
        raise typer.Exit(interrupted(stop)) from None
    except Exception as error:  # a bug in xla-migrate: one line, and the traceback on request
        if os.environ.get("XLA_MIGRATE_DEBUG"):
            raise
        _err(f"error: internal error in xla-migrate verify ({type(error).__name__}: {error}); "
             "set XLA_MIGRATE_DEBUG=1 for the traceback and please report it")
        raise typer.Exit(verification.EXIT_CANNOT_RUN) from None
    emit(report, output_format)
    raise typer.Exit(report.exit_code)


def emit(report: verification.Report, output_format: str = "text", stream=None) -> None:
    """The report: JSON, or text (a check that cannot run is one `error:` line on stderr, after the XLA run's
    figures when it ran)."""
    stream = stream or sys.stdout
    if output_format == "json":
        stream.write(json.dumps(report.to_json(), indent=2) + "\n")
        stream.flush()
        return
    if report.cannot_run and not report.observed:
        _err(f"error: {report.cannot_run}")
        return
    for line in verification.render_text(report):
        print(line, file=stream)
    stream.flush()
    if report.status == "cannot-run":
        _err(f"error: {report.cannot_run}")


def interrupted(stop: verification.Interrupted) -> int:
    """One line on stderr saying what was stopped; the exit status for the signal (128 + its number)."""
    ended = f"ended the script's process group ({', '.join(stop.stopped[:4])})" if stop.stopped else \
        "no script was running"
    _err(f"interrupted ({stop.name}): {ended}; its temporary folder is removed")
    return 128 + stop.signum


def _err(line: str) -> None:
    print(line, file=sys.stderr)

