"""The report for people: one line per change or finding, ``path:line:col: CODE message``."""

from __future__ import annotations

from .api import MigrationResult


def summary(result: MigrationResult, label: str) -> str:
    if result.error is not None:
        return f"error: {result.error.format(result.path)}"
    what = f"{len(result.changes)} change{'s' if len(result.changes) != 1 else ''}"
    if not result.changed:
        what = "nothing to change"
    findings = len(result.findings)
    need = f"{findings} finding{'s' if findings != 1 else ''} need{'s' if findings == 1 else ''} a human"
    return f"{label}: {what}, {need} (target {result.target}; output runs on {result.runs_on})"


def change_lines(result: MigrationResult) -> list[str]:
    return [f"{result.path}:{c.line}:{c.column}: {c.code} {c.message}" for c in result.changes]


def finding_lines(result: MigrationResult) -> list[str]:
    return [
        f"{result.path}:{f.line}:{f.column}: {f.code} {f.message}" + (f" (fix: {f.fix})" if f.fix else "")
        for f in result.findings
    ]


# Machine-readable report ---------------------------------------------------------------------------------
REPORT_SCHEMA = "xla-migrate-report"
REPORT_VERSION = 1


def file_report(result: MigrationResult) -> dict:
    """One file's entry in the JSON report (schema: docs/report.schema.json, version REPORT_VERSION)."""
    from .targets import format_version

    low, high = result.releases
    stats = result.diff_stats
    return {
        "path": result.path,
        "out_path": result.out_path,
        "target": result.target,
        "runs_on": {"text": result.runs_on, "min": format_version(low),
                    "below": format_version(high) if high else None},
        "changed": result.changed,
        "error": None if result.error is None else {
            "message": result.error.message, "line": result.error.line, "column": result.error.column},
        "changes": [c.to_dict() for c in result.changes],
        "findings": [f.to_dict() for f in result.findings],
        "diff_stats": {"files": stats.files, "hunks": stats.hunks, "added": stats.added,
                       "removed": stats.removed},
    }


def json_report(results: list[MigrationResult]) -> dict:
    from . import __version__

    return {
        "schema": REPORT_SCHEMA,
        "version": REPORT_VERSION,
        "tool": {"name": "xla-migrate", "version": __version__},
        "files": [file_report(r) for r in results],
    }


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def github_annotations(result: MigrationResult) -> list[str]:
    """GitHub Actions workflow commands: errors, findings as warnings, changes as notices."""
    path = _escape_property(result.path)
    if result.error is not None:
        where = f"file={path}" + (f",line={result.error.line},col={result.error.column or 1}"
                                  if result.error.line else "")
        return [f"::error {where},title=xla-migrate::{_escape_data(result.error.message)}"]
    lines = []
    for finding in result.findings:
        message = finding.message + (f" (fix: {finding.fix})" if finding.fix else "")
        lines.append(f"::warning file={path},line={finding.line},col={finding.column},"
                     f"title={finding.code}::{_escape_data(message)}")
    for change in result.changes:
        lines.append(f"::notice file={path},line={change.line},col={change.column},"
                     f"title={change.code}::{_escape_data(change.message)}")
    return lines
