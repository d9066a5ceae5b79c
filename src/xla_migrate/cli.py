"""The command line. Code or diff on stdout, nothing else; the report and errors on stderr.

Exit codes: 0 success, 1 changes found under --check, 2 usage or input error (nothing written).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

import typer

from . import __version__, report
from .api import MigrationResult, migrate
from .files import write_atomically
from .targets import DEFAULT_TARGET, TARGETS

EXIT_OK, EXIT_CHANGES, EXIT_ERROR = 0, 1, 2

app = typer.Typer(add_completion=False, rich_markup_mode=None, pretty_exceptions_enable=False,
                  context_settings={"help_option_names": ["-h", "--help"]})


class UsageError(Exception):
    """A one-line problem with the command line or the input: reported, exit 2, nothing written."""


def _colour(stream) -> bool:
    return stream.isatty() and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"


def _err(line: str, style: str | None = None) -> None:
    if style and _colour(sys.stderr):
        codes = {"red": "31", "yellow": "33", "bold": "1"}
        line = f"\033[{codes[style]}m{line}\033[0m"
    print(line, file=sys.stderr)


def _diff_bytes(result: MigrationResult) -> bytes:
    """The diff in the file's own encoding, so it applies byte for byte (a BOM is not repeated in it)."""
    return result.diff.encode("utf-8" if result.encoding == "utf-8-sig" else result.encoding)


def _print_diff(result: MigrationResult) -> None:
    diff = result.diff
    if not _colour(sys.stdout):
        sys.stdout.flush()
        sys.stdout.buffer.write(_diff_bytes(result))
        sys.stdout.flush()
        return
    for line in diff.splitlines(keepends=True):
        colour = "1" if line.startswith(("---", "+++")) else {"+": "32", "-": "31", "@": "36"}.get(line[:1])
        sys.stdout.write(f"\033[{colour}m{line.rstrip(chr(10))}\033[0m\n" if colour else line)


def _split_codes(values: Optional[list[str]]) -> list[str]:
    return [code.strip() for value in values or [] for code in value.split(",") if code.strip()]


def _list_rules() -> None:
    from .registry import all_rules

    for rule in all_rules():
        targets = ",".join(rule.targets)
        print(f"{rule.code}  {rule.name:<28} {rule.fix_safety:<6} [{targets}]  {rule.summary}")


def _read_input(path: str) -> bytes:
    if path == "-":
        return sys.stdin.buffer.read()
    source = Path(path)
    if source.is_dir():
        raise UsageError(f"{path}: is a directory, expected a Python file")
    try:
        return source.read_bytes()
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file") from None
    except OSError as error:
        raise UsageError(f"{path}: cannot read: {error.strerror or error}") from None


def _check_paths(in_path: str, out: Optional[str], in_place: bool, diff: bool, check: bool,
                 diff_file: Optional[str]) -> Optional[str]:
    """Validate the combination of paths and modes; return where the migrated code goes (None: nowhere)."""
    if in_place:
        if out is not None:
            raise UsageError("--in-place and --out cannot be used together")
        if in_path == "-":
            raise UsageError("--in-place needs a file, not stdin")
        out = in_path
    if out is None and not (diff or check or diff_file):
        raise UsageError("nothing to do: pass --out PATH (or --out - for stdout), --in-place, --diff or --check")
    if diff or check:
        out_target = None  # a dry run writes no code
    else:
        out_target = out
    if out_target not in (None, "-") and not in_place and in_path != "-" and _same_file(in_path, out_target):
        raise UsageError(f"--out {out_target} is the input file; pass --in-place to rewrite it")
    if out_target not in (None, "-") and Path(out_target).is_dir():
        raise UsageError(f"--out {out_target}: is a directory, expected a file path")
    return out_target


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)


def _installed_torch_xla() -> Optional[str]:
    from importlib import metadata

    try:
        return metadata.version("torch_xla")
    except metadata.PackageNotFoundError:
        return None


def _report(result: MigrationResult, label: str, quiet: bool, verbose: bool) -> None:
    if quiet:
        return
    if verbose:
        for line in report.change_lines(result):
            _err(line)
    for line in report.finding_lines(result):
        _err(line, "yellow")
    _err(report.summary(result, label), "bold")


@app.command()
def command(
    in_path: Optional[str] = typer.Option(None, "--in", metavar="PATH", help="Script to migrate ('-' for stdin)."),
    out: Optional[str] = typer.Option(None, "--out", metavar="PATH", help="Where to write the migrated script ('-' for stdout)."),
    in_place: bool = typer.Option(False, "--in-place", help="Rewrite the input file itself."),
    diff: bool = typer.Option(False, "--diff", help="Dry run: print the unified diff on stdout, write nothing."),
    diff_file: Optional[str] = typer.Option(None, "--diff-file", metavar="PATH", help="Also write the unified diff to PATH."),
    check: bool = typer.Option(False, "--check", help="Exit 1 if anything would change; write nothing."),
    target: str = typer.Option(DEFAULT_TARGET, "--target", metavar="NAME", help=f"torch_xla API generation to emit: {', '.join(TARGETS)}."),
    select: Optional[list[str]] = typer.Option(None, "--select", metavar="CODES", help="Only these rule codes or prefixes (comma-separated)."),
    ignore: Optional[list[str]] = typer.Option(None, "--ignore", metavar="CODES", help="Skip these rule codes or prefixes (comma-separated)."),
    list_rules: bool = typer.Option(False, "--list-rules", help="List the rules and exit."),
    version: bool = typer.Option(False, "--version", help="Print the version and exit."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="Print errors and warnings only."),
    verbose: bool = typer.Option(False, "-v", "--verbose", help="Also list every change."),
) -> None:
    """Migrate a CUDA PyTorch training script to PyTorch/XLA."""
    if version:
        print(f"xla-migrate {__version__}")
        return
    if list_rules:
        _list_rules()
        return
    try:
        code = _migrate_one(in_path, out, in_place, diff, diff_file, check, target,
                            _split_codes(select), _split_codes(ignore), quiet, verbose)
    except UsageError as error:
        _err(f"error: {error}", "red")
        code = EXIT_ERROR
    except Exception as error:  # a bug in xla-migrate: one line, and the traceback on request
        if os.environ.get("XLA_MIGRATE_DEBUG"):
            raise
        _err(f"error: internal error in xla-migrate ({type(error).__name__}: {error}); "
             "set XLA_MIGRATE_DEBUG=1 for the traceback and please report it", "red")
        code = EXIT_ERROR
    raise typer.Exit(code)


def _migrate_one(in_path, out, in_place, diff, diff_file, check, target, select, ignore, quiet, verbose) -> int:
    if in_path is None:
        raise UsageError("missing --in PATH (the script to migrate)")
    from .registry import unknown_selectors
    from .targets import get_target

    try:
        get_target(target)
    except ValueError as error:
        raise UsageError(str(error)) from None
    unknown = unknown_selectors(select + ignore)
    if unknown:
        raise UsageError(f"unknown rule code or prefix: {', '.join(unknown)} (see --list-rules)")
    destination = _check_paths(in_path, out, in_place, diff, check, diff_file)
    data = _read_input(in_path)
    label_in = "stdin" if in_path == "-" else in_path
    named_out = out if out not in (None, "-") else None
    label_out = named_out or label_in
    result = migrate(data, target=target, select=select or None, ignore=ignore or None,
                     path=label_in, out_path=label_out)
    if result.error is not None:
        raise UsageError(result.error.format(label_in))
    warning = result.release_warning(_installed_torch_xla())
    if warning:
        _err(warning, "yellow")
    if diff_file:
        _write(Path(diff_file), _diff_bytes(result))
    if diff:
        _print_diff(result)
    if destination == "-":
        sys.stdout.buffer.write(result.output_bytes)
        sys.stdout.flush()
    elif destination is not None and (result.changed or not in_place):
        _write(Path(destination), result.output_bytes, mode_from=None if in_path == "-" else Path(in_path))
    _report(result, f"{label_in} -> {label_out}" if destination not in (None, "-", in_path) else label_in,
            quiet, verbose)
    return EXIT_CHANGES if check and result.changed else EXIT_OK


def _write(path: Path, data: bytes, mode_from: Optional[Path] = None) -> None:
    try:
        write_atomically(path, data, mode_from=mode_from)
    except OSError as error:
        raise UsageError(f"{path}: cannot write: {error.strerror or error}") from None


def run() -> None:
    app(prog_name="xla-migrate")

