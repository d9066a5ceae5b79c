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
FORMATS = ("text", "json", "github")
# How this run reports: --format and --report (set once per command).
_OUTPUT: dict = {"format": "text", "report": None}

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


def _machine_report(results: list[MigrationResult], quiet: bool) -> bool:
    """Write --report and print the json/github report; True when the text report is replaced."""
    if _OUTPUT["report"] or _OUTPUT["format"] == "json":
        import json

        text = json.dumps(report.json_report(results), indent=2) + "\n"
        if _OUTPUT["report"]:
            _write(Path(_OUTPUT["report"]), text.encode("utf-8"))
        if _OUTPUT["format"] == "json":
            sys.stderr.write(text)
            return True
    if _OUTPUT["format"] == "github":
        for result in results:
            for line in report.github_annotations(result):
                if not quiet or line.startswith(("::error", "::warning")):
                    print(line, file=sys.stderr)
    return False


def _report(result: MigrationResult, label: str, quiet: bool, verbose: bool) -> None:
    if _machine_report([result], quiet):
        return
    if _OUTPUT["format"] == "github":
        if not quiet:
            _err(report.summary(result, label))
        return
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
    in_path: Optional[list[str]] = typer.Option(None, "--in", metavar="PATH", help="Script, notebook, folder or glob to migrate ('-' for stdin); repeat it, or list more paths after it."),
    more_paths: Optional[list[str]] = typer.Argument(None, metavar="PATH", help="More inputs, as for --in.", show_default=False),
    out: Optional[str] = typer.Option(None, "--out", metavar="PATH", help="Where to write the migrated script ('-' for stdout), or the folder that mirrors an input folder."),
    in_place: bool = typer.Option(False, "--in-place", help="Rewrite the input files themselves (only those that change)."),
    diff: bool = typer.Option(False, "--diff", help="Dry run: print the unified diff on stdout, write nothing."),
    diff_file: Optional[str] = typer.Option(None, "--diff-file", metavar="PATH", help="Also write the unified diff to PATH."),
    check: bool = typer.Option(False, "--check", help="Exit 1 if anything would change; write nothing."),
    target: Optional[str] = typer.Option(None, "--target", metavar="NAME", help=f"torch_xla API generation to emit: {', '.join(TARGETS)} (default {DEFAULT_TARGET})."),
    select: Optional[list[str]] = typer.Option(None, "--select", metavar="CODES", help="Only these rule codes or prefixes (comma-separated)."),
    ignore: Optional[list[str]] = typer.Option(None, "--ignore", metavar="CODES", help="Skip these rule codes or prefixes (comma-separated)."),
    distributed: Optional[bool] = typer.Option(None, "--distributed/--single", help="Migrate as a multi-replica (distributed) or a single-device script (default: detected per script)."),
    exclude: Optional[list[str]] = typer.Option(None, "--exclude", metavar="PATTERN", help="Skip paths matching this gitignore-style pattern (repeatable)."),
    no_gitignore: bool = typer.Option(False, "--no-gitignore", help="Also migrate files that .gitignore ignores."),
    only_changed: bool = typer.Option(False, "--only-changed", help="With --out DIR: write only the files that change."),
    jobs: Optional[int] = typer.Option(None, "-j", "--jobs", metavar="N", help="Worker processes for many files (default: the CPU count)."),
    config: Optional[str] = typer.Option(None, "--config", metavar="PATH", help="Read [tool.xla-migrate] from this pyproject.toml (default: the nearest one above the input)."),
    output_format: str = typer.Option("text", "--format", metavar="FORMAT", help="Report format on stderr: text, json or github (workflow annotations)."),
    report_path: Optional[str] = typer.Option(None, "--report", metavar="PATH", help="Also write the JSON report to PATH."),
    list_rules: bool = typer.Option(False, "--list-rules", help="List the rules and exit."),
    version: bool = typer.Option(False, "--version", help="Print the version and exit."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="Print errors and warnings only."),
    verbose: bool = typer.Option(False, "-v", "--verbose", help="Also list every change."),
) -> None:
    """Migrate CUDA PyTorch training scripts to PyTorch/XLA."""
    if version:
        print(f"xla-migrate {__version__}")
        return
    if list_rules:
        _list_rules()
        return
    try:
        if output_format not in FORMATS:
            raise UsageError(f"--format {output_format}: expected one of {', '.join(FORMATS)}")
        _OUTPUT.update(format=output_format, report=report_path)
        inputs = [*(in_path or []), *(more_paths or [])]
        settings = _settings(inputs, config, target, select, ignore, exclude)
        if distributed is not None:
            settings.distributed = distributed
        if _is_single_file(inputs):
            code = _migrate_one(inputs[0] if inputs else None, out, in_place, diff, diff_file, check,
                                settings.target, settings.select, settings.ignore, quiet, verbose,
                                settings.distributed)
        else:
            code = _migrate_tree(inputs, out, in_place, diff, diff_file, check, settings, not no_gitignore,
                                 only_changed, jobs, quiet, verbose)
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


def _settings(inputs, config_path, target, select, ignore, exclude):
    """Command-line flags over ``[tool.xla-migrate]`` over the defaults."""
    from .config import ConfigError, Settings, find_config, load_config

    try:
        found = Path(config_path) if config_path else find_config(inputs)
        settings = load_config(found) if found is not None else Settings()
    except ConfigError as error:
        raise UsageError(str(error)) from None
    if target is not None:
        settings.target = target
    if select:
        settings.select = _split_codes(select)
    if ignore:
        settings.ignore = _split_codes(ignore)
    settings.cli_exclude = list(exclude or [])
    return settings


def _is_single_file(inputs: list[str]) -> bool:
    """One script (or stdin): the original single-file behaviour, messages and all."""
    from .tree import GLOB_CHARS, kind_of

    if len(inputs) != 1:
        return len(inputs) == 0
    path = inputs[0]
    if path == "-":
        return True
    if os.path.isdir(path) or kind_of(path) == "notebook":
        return False
    return os.path.lexists(path) or not GLOB_CHARS.search(path)


def _validate_rules(target: str, select: list[str], ignore: list[str]) -> None:
    from .registry import unknown_selectors
    from .targets import get_target

    try:
        get_target(target)
    except ValueError as error:
        raise UsageError(str(error)) from None
    unknown = unknown_selectors(select + ignore)
    if unknown:
        raise UsageError(f"unknown rule code or prefix: {', '.join(unknown)} (see --list-rules)")


def _migrate_one(in_path, out, in_place, diff, diff_file, check, target, select, ignore, quiet, verbose,
                 distributed=None) -> int:
    if in_path is None:
        raise UsageError("missing --in PATH (the script to migrate)")
    _validate_rules(target, select, ignore)
    destination = _check_paths(in_path, out, in_place, diff, check, diff_file)
    data = _read_input(in_path)
    label_in = "stdin" if in_path == "-" else in_path
    named_out = out if out not in (None, "-") else None
    label_out = named_out or label_in
    result = migrate(data, target=target, select=select or None, ignore=ignore or None,
                     path=label_in, out_path=label_out, distributed=distributed)
    if result.error is not None:
        if _machine_report([result], quiet) or _OUTPUT["format"] == "github":
            return EXIT_ERROR
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


def _migrate_tree(inputs, out, in_place, diff, diff_file, check, settings, use_gitignore, only_changed, jobs,
                  quiet, verbose) -> int:
    from . import tree

    _validate_rules(settings.target, settings.select, settings.ignore)
    if "-" in inputs:
        raise UsageError("stdin ('-') cannot be combined with other inputs")
    if in_place and out is not None:
        raise UsageError("--in-place and --out cannot be used together")
    if out == "-":
        raise UsageError("--out - takes one script; for several inputs use --out DIR, --in-place, --diff or --check")
    if out is None and not (in_place or diff or check or diff_file):
        raise UsageError("nothing to do: pass --out PATH (or --out - for stdout), --in-place, --diff or --check")
    if only_changed and out is None:
        raise UsageError("--only-changed needs --out DIR")
    if jobs is not None and jobs < 1:
        raise UsageError(f"-j {jobs}: needs at least 1 worker")
    single_notebook = (len(inputs) == 1 and os.path.isfile(inputs[0]) and tree.kind_of(inputs[0]) == "notebook")
    mirror = out is not None and not single_notebook
    if mirror:
        if len(inputs) != 1 or not os.path.isdir(inputs[0]):
            raise UsageError(f"--out {out}: mirrors one folder; pass exactly one --in DIR (or use --in-place)")
        if os.path.exists(out) and not os.path.isdir(out):
            raise UsageError(f"--out {out}: is a file, expected a folder to mirror {inputs[0]} into")
        if os.path.isdir(out) and _same_file(out, inputs[0]):
            raise UsageError(f"--out {out} is the input folder; pass --in-place to rewrite it")
    elif single_notebook and out is not None:
        if os.path.isdir(out):
            raise UsageError(f"--out {out}: is a directory, expected a file path")
        if _same_file(inputs[0], out):
            raise UsageError(f"--out {out} is the input file; pass --in-place to rewrite it")
    ignorer = tree.Ignorer(use_gitignore, [(None, settings.cli_exclude), (settings.config_dir, settings.exclude)])
    try:
        found = tree.discover(inputs, ignorer, {os.path.realpath(out)} if mirror else set())
    except tree.DiscoveryError as error:
        raise UsageError(str(error)) from None
    tasks = _tasks(found, out, mirror, in_place)
    dry = diff or check
    options = tree.Options(settings.target, settings.select or None, settings.ignore or None, settings.distributed,
                           write=not dry,
                           copy_others=not only_changed,
                           want_diff=diff or bool(diff_file) or bool(_OUTPUT["report"]) or _OUTPUT["format"] == "json")
    with _progress(len(tasks), quiet) as progress:
        outcomes = tree.run_all(tasks, options, jobs or os.cpu_count() or 1, progress)
    patch = b"".join(o.diff for o in outcomes)
    if diff_file:
        _write(Path(diff_file), patch)
    if diff:
        _print_patch(patch)
    _report_tree(outcomes, settings.target, dry, quiet, verbose)
    if any(o.error for o in outcomes):
        return EXIT_ERROR
    return EXIT_CHANGES if check and any(o.changed for o in outcomes) else EXIT_OK


def _tasks(found, out, mirror: bool, in_place: bool):
    from .tree import Task, kind_of

    tasks, seen = [], set()
    for item in sorted(found, key=lambda f: f.path):
        kind = kind_of(item.path)
        if item.explicit and kind == "other":
            kind = "python"  # a script named on the command line, whatever its name
        if mirror:
            tasks.append(Task(item.path, kind, os.path.join(out, item.rel)))
            continue
        if kind == "other":
            continue
        real = os.path.realpath(item.path)
        if real in seen:  # the same file twice (a symlink, or named twice): once is enough
            continue
        seen.add(real)
        tasks.append(Task(item.path, kind, out if out is not None else None, in_place=in_place))
    return tasks


class _progress:
    """A progress bar on stderr for a terminal and more than a few files; nothing when piped."""

    def __init__(self, total: int, quiet: bool):
        self.total, self.bar = total, None
        self.show = not quiet and total > 8 and sys.stderr.isatty() and os.environ.get("TERM") != "dumb"

    def __enter__(self):
        if not self.show:
            return None
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.bar = Progress(TextColumn("migrating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            console=Console(stderr=True), transient=True)
        self.task = self.bar.add_task("files", total=self.total)

        def advance(count: int, start: bool = False) -> None:
            if start or not self.bar.live.is_started:
                self.bar.start()
            self.bar.advance(self.task, count)

        return advance

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()
        return False


def _print_patch(patch: bytes) -> None:
    if not _colour(sys.stdout):
        sys.stdout.flush()
        sys.stdout.buffer.write(patch)
        sys.stdout.flush()
        return
    for line in patch.decode("utf-8", errors="replace").splitlines(keepends=True):
        colour = "1" if line.startswith(("---", "+++", "diff --git")) else {"+": "32", "-": "31", "@": "36"}.get(line[:1])
        sys.stdout.write(f"\033[{colour}m{line.rstrip(chr(10))}\033[0m\n" if colour else line)
    sys.stdout.flush()


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _as_results(outcomes, target: str) -> list[MigrationResult]:
    """The tree's outcomes as results for the JSON report and annotations (scripts and notebooks only)."""
    from .records import InputError

    results = []
    for outcome in outcomes:
        if outcome.kind == "other":
            continue
        changed = outcome.changed
        result = MigrationResult(source="", code="\n" if changed else "", target=outcome.target or target,
                                 path=outcome.path, out_path=outcome.out_path,
                                 changes=[c for _, c in outcome.changes], findings=[f for _, f in outcome.findings])
        if outcome.releases:
            result.releases = outcome.releases
        if outcome.error:
            result.error = outcome.input_error or InputError(
                outcome.error[len(outcome.path) + 2:] if outcome.error.startswith(outcome.path + ": ")
                else outcome.error)
        result.__dict__["diff"] = outcome.diff.decode("utf-8", errors="replace")  # the cached diff
        results.append(result)
    return results


def _report_tree(outcomes, target: str, dry: bool, quiet: bool, verbose: bool) -> None:
    from .targets import describe_releases, parse_version, release_fits

    if _machine_report(_as_results(outcomes, target), quiet):
        return
    if _OUTPUT["format"] == "github":
        quiet, verbose = True, False  # the annotations said it; errors and the summary line follow
    for outcome in outcomes:
        if outcome.error:
            _err(f"error: {outcome.error}", "red")
        if quiet:
            continue
        if verbose:
            for where, change in outcome.changes:
                _err(f"{where}: {change.code} {change.message}")
        for where, finding in outcome.findings:
            _err(f"{where}: {finding.code} {finding.message}" + (f" (fix: {finding.fix})" if finding.fix else ""),
                 "yellow")
        if outcome.changed and outcome.kind != "other":
            _err(f"{outcome.path}: {'would change' if dry else 'changed'} ({_plural(len(outcome.changes), 'change')})")
        elif verbose and outcome.kind != "other" and not outcome.error:
            _err(f"{outcome.path}: nothing to change")
    changed = [o for o in outcomes if o.changed and o.kind != "other"]
    ranges = [o.releases for o in changed if o.releases]
    runs_on = ""
    if ranges:
        low = max(r[0] for r in ranges)
        highs = [r[1] for r in ranges if r[1] is not None]
        high = min(highs) if highs else None
        runs_on = f"; output runs on {describe_releases(low, high)}"
        installed = _installed_torch_xla()
        if installed and not release_fits(parse_version(installed), low, high):
            _err(f"warning: torch_xla {installed} is installed here, but the {target} target's output needs "
                 f"{describe_releases(low, high)}", "yellow")
    if quiet and _OUTPUT["format"] != "github":
        return
    scripts = [o for o in outcomes if o.kind != "other"]
    errors = sum(1 for o in outcomes if o.error)
    changes = sum(len(o.changes) for o in scripts)
    findings = sum(len(o.findings) for o in scripts)
    need = "needs" if findings == 1 else "need"
    _err(f"{_plural(len(scripts), 'file')}: {len(changed)} {'would change' if dry else 'changed'} "
         f"({_plural(changes, 'change')}), {_plural(findings, 'finding')} {need} a human, "
         f"{_plural(errors, 'error')} (target {target}{runs_on})", "bold")


def _write(path: Path, data: bytes, mode_from: Optional[Path] = None) -> None:
    try:
        write_atomically(path, data, mode_from=mode_from)
    except OSError as error:
        raise UsageError(f"{path}: cannot write: {error.strerror or error}") from None


def run() -> None:
    app(prog_name="xla-migrate")

