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
