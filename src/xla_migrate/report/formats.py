"""The report: for people (one line per change or finding, ``path:line:col: CODE message``, and the summary
line), the JSON report (schema docs/report.schema.json) and GitHub workflow annotations."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the report formats results; the api, a layer above, makes them
    from ..api import MigrationResult


def summary(result: MigrationResult, label: str) -> str:
    if result.error is not None:
        return f"error: {result.error.format(result.path)}"
    what = f"{len(result.changes)} change{'s' if len(result.changes) != 1 else ''}"
    if not result.changed:
        what = "nothing to change"
    findings = len(result.findings)
    need = f"{findings} finding{'s' if findings != 1 else ''} need{'s' if findings == 1 else ''} a human"
    reason = f" ({result.data_parallel_reason})" if result.data_parallel_reason else ""
    form = f"; data parallel {result.data_parallel}{reason}" if result.data_parallel else ""
    return f"{label}: {what}, {need} (target {result.target}{form}; output runs on {result.runs_on})"


def where(path: str, record) -> str:
    """``path:line:col``, or ``path:cell N:line L`` for a notebook's record (lines within the cell)."""
    cell = getattr(record, "cell", None)
    return f"{path}:cell {cell}:line {record.line}" if cell is not None else f"{path}:{record.line}:{record.column}"


def change_lines(result: MigrationResult) -> list[str]:
    return [f"{where(result.path, c)}: {c.code} {c.message}" for c in result.changes]


def finding_text(location: str, finding) -> str:
    """One finding for people; it ends with the command that documents its rule."""
    fix = f" (fix: {finding.fix})" if finding.fix else ""
    return f"{location}: {finding.code} {finding.message}{fix} [xla-migrate rule {finding.code}]"


def finding_lines(result: MigrationResult) -> list[str]:
    return [finding_text(where(result.path, f), f) for f in result.findings]


def statistics_lines(results: list[MigrationResult]) -> list[str]:
    """--statistics: one line per rule code, the most frequent first: count, code, name, what it was."""
    from collections import Counter

    from ..engine.registry import all_rules

    names = {rule.code: rule.name for rule in all_rules()}
    changes = Counter(c.code for r in results for c in r.changes)
    findings = Counter(f.code for r in results for f in r.findings)
    totals = changes + findings
    if not totals:
        return []
    width = len(str(max(totals.values())))
    name_width = max(len(names.get(code, "")) for code in totals)
    lines = []
    for code, total in sorted(totals.items(), key=lambda item: (-item[1], item[0])):
        kinds = [f"{n} {word}{'' if n == 1 else 's'}"
                 for n, word in ((changes[code], "change"), (findings[code], "finding")) if n]
        lines.append(f"{total:>{width}}  {code}  {names.get(code, ''):<{name_width}}  {', '.join(kinds)}")
    return lines


# Machine-readable report ---------------------------------------------------------------------------------
REPORT_SCHEMA = "xla-migrate-report"
# Version 2 added ``cell`` (the notebook cell, counted from 1, markdown included; null for a script) to
# changes, findings and errors.
REPORT_VERSION = 2


def file_report(result: MigrationResult) -> dict:
    """One file's entry in the JSON report (schema: docs/report.schema.json, version REPORT_VERSION)."""
    from ..engine.targets import format_version

    low, high = result.releases
    stats = result.diff_stats
    return {
        "path": result.path,
        "out_path": result.out_path,
        "target": result.target,
        "data_parallel": result.data_parallel or None,
        "data_parallel_reason": result.data_parallel_reason or None,
        "runs_on": {"text": result.runs_on, "min": format_version(low),
                    "below": format_version(high) if high else None},
        "changed": result.changed,
        "error": None if result.error is None else {
            "message": result.error.message, "line": result.error.line, "column": result.error.column,
            "cell": getattr(result.error, "cell", None)},
        "changes": [c.to_dict() for c in result.changes],
        "findings": [f.to_dict() for f in result.findings],
        "diff_stats": {"files": stats.files, "hunks": stats.hunks, "added": stats.added,
                       "removed": stats.removed},
    }


def json_report(results: list[MigrationResult], project: dict | None = None) -> dict:
    """``project``: a tree run's project summary (summary.ProjectSummary.to_dict()), when it had a project."""
    from .. import __version__

    report = {
        "schema": REPORT_SCHEMA,
        "version": REPORT_VERSION,
        "tool": {"name": "xla-migrate", "version": __version__},
        "files": [file_report(r) for r in results],
    }
    if project is not None:
        report["project"] = project
    return report


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def _annotation_place(path: str, record) -> tuple[str, str]:
    """The ``file=,line=,col=`` properties and a message prefix. A notebook's lines are within a cell, not
    lines of the .ipynb file GitHub shows, so a notebook annotation names the file and says the cell."""
    cell = getattr(record, "cell", None)
    if cell is not None:
        return f"file={path}", f"cell {cell}, line {record.line}: "
    if not record.line:
        return f"file={path}", ""
    end = ""
    if getattr(record, "end_line", 0):  # as ruff's annotations: the range, not only its start
        end = f",endLine={record.end_line},endColumn={record.end_column or 1}"
    return f"file={path},line={record.line},col={record.column or 1}{end}", ""


def github_annotations(result: MigrationResult) -> list[str]:
    """GitHub Actions workflow commands: errors, findings as warnings, changes as notices."""
    path = _escape_property(result.path)
    if result.error is not None:
        place, prefix = _annotation_place(path, result.error)
        return [f"::error {place},title=xla-migrate::{_escape_data(prefix + result.error.message)}"]
    lines = []
    for finding in result.findings:
        place, prefix = _annotation_place(path, finding)
        message = prefix + finding.message + (f" (fix: {finding.fix})" if finding.fix else "")
        lines.append(f"::warning {place},title={finding.code}::{_escape_data(message)}")
    for change in result.changes:
        place, prefix = _annotation_place(path, change)
        lines.append(f"::notice {place},title={change.code}::{_escape_data(prefix + change.message)}")
    return lines
