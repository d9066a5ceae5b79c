"""What a run prints and writes besides the migrated code: the text report on stderr (one line per
finding, with -v per change, or --statistics' table; the summary line), the JSON report (stdout or
--report) and GitHub annotations, diffs on stdout, the progress bar, and the warning when the torch_xla
installed here cannot run the output. stdout carries one thing: the code, the diff or the JSON report.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

from ..api import MigrationResult
from ..report import formats as report
from ..report.files import write_atomically
from .options import EXIT_INTERRUPTED, UsageError


# How this run reports: --format, --report, -q (0: all, 1: no summary line, 2: errors only) and
# --statistics (set once per command).
# "findings": how many the run reported (for --exit-non-zero-on-findings).
_OUTPUT: dict = {"format": "text", "report": None, "quiet": 0, "statistics": False, "project": None,
                 "config": None, "findings": 0}


def _colour(stream) -> bool:
    return stream.isatty() and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"


def _err(line: str, style: str | None = None) -> None:
    from ..report.guards import printable

    line = printable(line)  # a file name's newline or terminal escape is shown, not obeyed
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


def _list_rules(output_format: str) -> None:
    """Every code the tool can print, the engine's (XLA000-XLA004) first, then the rules'."""
    from ..report.ruledocs import every_code

    if output_format == "json":
        import json

        from ..report.ruledocs import rule_record

        print(json.dumps([rule_record(rule) for rule in every_code()], indent=2))
        return
    for rule in every_code():
        targets = ",".join(rule.targets)
        print(f"{rule.code}  {rule.name:<28} {rule.fix_safety:<6} [{targets}]  {rule.summary}")


def _installed_torch_xla() -> Optional[str]:
    if not _may_have_torch_xla():
        return None
    from importlib import metadata

    try:
        return metadata.version("torch_xla")
    except metadata.PackageNotFoundError:
        return None


def _may_have_torch_xla() -> bool:
    """False only where ``importlib.metadata`` cannot find torch_xla (importing it costs more than the
    search): no finder but the standard one, and no folder on sys.path holds a name that could be
    torch_xla's metadata (compared without case and separators, a superset of the names it matches)."""
    import importlib.machinery

    if any(hasattr(finder, "find_distributions") and finder is not importlib.machinery.PathFinder
           for finder in sys.meta_path):
        return True
    for entry in sys.path:
        folder = entry or "."
        if not os.path.isdir(folder):
            if os.path.exists(folder):  # a zip archive
                return True
            continue
        try:
            names = os.listdir(folder)
        except OSError:
            return True
        for name in [os.path.basename(entry), *names]:
            if name.lower().translate(_SEPARATORS).startswith("torchxla"):
                return True
    return False


_SEPARATORS = str.maketrans("", "", "-_.")


def _machine_report(results: list[MigrationResult]) -> bool:
    """Write --report and print the machine-readable formats (stdout, as ruff's: nothing else is there,
    checked up front); True when the text report is replaced."""
    import json

    _OUTPUT["findings"] = sum(len(result.findings) for result in results)
    output_format = _OUTPUT["format"]
    if _OUTPUT["report"] or output_format == "json-report":
        text = json.dumps(report.json_report(results, _OUTPUT["project"]), indent=2) + "\n"
        if _OUTPUT["report"]:
            _write(Path(_OUTPUT["report"]), text.encode("utf-8"))
        if output_format == "json-report":
            _stdout(text)
            return True
    if output_format in ("json", "sarif"):
        from ..report import diagnostics

        data = diagnostics.json_diagnostics(results) if output_format == "json" else diagnostics.sarif_log(results)
        _stdout(json.dumps(data, indent=2) + "\n")
        return True
    if output_format == "github":
        for result in results:
            for line in report.github_annotations(result):
                if _OUTPUT["quiet"] < 2 or line.startswith("::error"):
                    print(line)
        sys.stdout.flush()
    return False


def _stdout(text: str) -> None:
    sys.stdout.flush()
    sys.stdout.write(text)
    sys.stdout.flush()


def _records(results: list[MigrationResult], verbose: bool) -> None:
    """The text report's body: every finding (and with -v every change), or --statistics' table."""
    if _OUTPUT["statistics"]:
        for line in report.statistics_lines(results):
            _err(line)
        return
    for result in results:
        if verbose:
            for line in report.change_lines(result):
                _err(line)
        for line in report.finding_lines(result):
            _err(line, "yellow")


def _report(result: MigrationResult, label: str, verbose: bool) -> None:
    if _machine_report([result]):
        return
    quiet = _OUTPUT["quiet"]
    if _OUTPUT["format"] == "github":
        if not quiet:
            _err(report.summary(result, label))
        return
    if quiet >= 2:
        return
    _records([result], verbose)
    if not quiet:
        _err(report.summary(result, label), "bold")


class _progress:
    """A progress bar on stderr for a terminal and more than a few files; nothing when piped."""

    def __init__(self, total: int, quiet: int):
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
    from ..engine.records import InputError

    results = []
    for outcome in outcomes:
        if outcome.kind == "other":
            continue
        changed = outcome.changed
        result = MigrationResult(source="", code="\n" if changed else "", target=outcome.target or target,
                                 path=outcome.path, out_path=outcome.out_path,
                                 changes=[c for _, c in outcome.changes], findings=[f for _, f in outcome.findings],
                                 data_parallel=outcome.data_parallel,
                                 data_parallel_reason=outcome.data_parallel_reason)
        if outcome.releases:
            result.releases = outcome.releases
        if outcome.error:
            result.error = outcome.input_error or InputError(
                outcome.error[len(outcome.path) + 2:] if outcome.error.startswith(outcome.path + ": ")
                else outcome.error)
        result.__dict__["diff"] = outcome.diff.decode("utf-8", errors="replace")  # the cached diff
        results.append(result)
    return results


def _runtime_of(target: str) -> str:
    from ..engine.targets import get_target

    try:
        return get_target(target).runtime
    except ValueError:
        return "torch_xla"


def _report_tree(outcomes, target: str, dry: bool, verbose: bool, data_parallel: str | None = None,
                 project_summary=None) -> None:
    from ..engine.targets import describe_releases, parse_version, release_fits

    results = _as_results(outcomes, target)
    if _machine_report(results):
        for outcome in outcomes:  # stdout has the report; errors still say so to a person on stderr
            if outcome.error:
                _err(f"error: {outcome.error}", "red")
        return
    quiet = _OUTPUT["quiet"]
    github = _OUTPUT["format"] == "github"
    _file_lines(outcomes, dry, verbose, records=not github and not _OUTPUT["statistics"])
    if _OUTPUT["statistics"] and quiet < 2:
        _records(results, verbose)
    changed = [o for o in outcomes if o.changed and o.kind != "other"]
    ranges = [o.releases for o in changed if o.releases]
    runs_on = ""
    if ranges:
        low = max(r[0] for r in ranges)
        highs = [r[1] for r in ranges if r[1] is not None]
        high = min(highs) if highs else None
        runtime = _runtime_of(target)
        runs_on = f"; output runs on {describe_releases(low, high, runtime)}"
        installed = _installed_torch_xla() if runtime == "torch_xla" else None
        if installed and not release_fits(parse_version(installed), low, high) and quiet < 2:
            _err(f"warning: torch_xla {installed} is installed here, but the {target} target's output needs "
                 f"{describe_releases(low, high)}", "yellow")
    if quiet:
        return
    if project_summary is not None and not github:
        for line in project_summary.lines(dry):
            _err(line)
    scripts = [o for o in outcomes if o.kind != "other"]
    errors = sum(1 for o in outcomes if o.error)
    changes = sum(len(o.changes) for o in scripts)
    findings = sum(len(o.findings) for o in scripts)
    need = "needs" if findings == 1 else "need"
    forms = sorted({o.data_parallel for o in scripts if o.data_parallel})
    form = f"; data parallel {', '.join(forms)}" if forms else ""
    _err(f"{_plural(len(scripts), 'file')}: {len(changed)} {'would change' if dry else 'changed'} "
         f"({_plural(changes, 'change')}), {_plural(findings, 'finding')} {need} a human, "
         f"{_plural(errors, 'error')} (target {target}{form}{runs_on})", "bold")


def _file_lines(outcomes, dry: bool, verbose: bool, records: bool = True) -> None:
    """Per file, in sorted order: its error, its findings (and changes with -v), whether it changed."""
    quiet = _OUTPUT["quiet"]
    for outcome in outcomes:
        if outcome.error:
            _err(f"error: {outcome.error}", "red")
        if quiet >= 2 or _OUTPUT["format"] == "github":
            continue  # the annotations said it; errors and the summary line follow
        if records:
            if verbose:
                for where, change in outcome.changes:
                    _err(f"{where}: {change.code} {change.message}")
            for where, finding in outcome.findings:
                _err(report.finding_text(where, finding), "yellow")
        if outcome.changed and outcome.kind != "other":
            _err(f"{outcome.path}: {'would change' if dry else 'changed'} ({_plural(len(outcome.changes), 'change')})")
        elif verbose and outcome.kind != "other" and not outcome.error:
            _err(f"{outcome.path}: nothing to change")


def _report_interrupted(stop, dry: bool, verbose: bool) -> int:
    """Ctrl-C in a tree run: what finished is reported (and kept on disk), then what was not reached."""
    done = sorted(stop.outcomes, key=lambda o: o.path)
    if _OUTPUT["format"] == "text":
        _file_lines(done, dry, verbose)
    written = sum(1 for o in done if o.written)
    missing = sorted(task.path for task in stop.not_reached)
    what = "nothing written" if dry else f"{_plural(written, 'file')} written"
    _err(f"interrupted: {what}, {_plural(len(missing), 'file')} not reached"
         + (" (run the same command again to finish)" if missing else ""), "red")
    shown = missing if verbose or len(missing) <= 10 else missing[:10]
    for path in shown:
        _err(f"  not reached: {path}")
    if len(shown) < len(missing):
        _err(f"  ... and {len(missing) - len(shown)} more (-v lists them all)")
    return EXIT_INTERRUPTED


def _write(path: Path, data: bytes, mode_from: Optional[Path] = None, original: Optional[bytes] = None) -> None:
    try:
        write_atomically(path, data, mode_from=mode_from, original=original)
    except OSError as error:
        raise UsageError(f"{path}: cannot write: {error.strerror or error}") from None
