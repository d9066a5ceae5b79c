"""The per-diagnostic formats of ``--output-format``, as ruff writes them: ``json`` (a flat list, one object
per finding or change, with ``filename``, ``location``, ``end_location``, ``code``, ``message``, ``fix``,
``url``) and ``sarif`` (SARIF 2.1.0, for code-scanning uploads). The nested per-file report is
``json-report`` and the workflow commands ``github`` (formats.py).

A diagnostic is a finding (something a person must do; ``kind`` "finding", SARIF level ``warning``), a
change the run made or would make (``kind`` "change", ``note``) or a file's error (``error``). Notebook
records keep lines within their cell (``cell`` says which; SARIF and github name the file with the cell in
the message, since the .ipynb's own lines are JSON).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..engine.records import end_of

if TYPE_CHECKING:
    from ..api import MigrationResult

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
SARIF_VERSION = "2.1.0"


def rule_hint(code: str) -> str:
    """Where a code is documented (ruff's ``url``): the command that prints it, and the page in the
    repository."""
    return f"xla-migrate rule {code} (docs/rules/{code}.md)"


def _records(result: MigrationResult):
    """(kind, record) for each finding, then each change, of one file."""
    return [*(("finding", f) for f in result.findings), *(("change", c) for c in result.changes)]


def json_diagnostics(results: list[MigrationResult]) -> list[dict]:
    """ruff's ``--output-format json``: ``[d["filename"] for d in data]`` works on it."""
    out = []
    for result in results:
        if result.error is not None:
            error = result.error
            line, column = error.line or 1, error.column or 1
            out.append({"filename": result.path, "code": None, "kind": "error", "message": error.message,
                        "location": {"row": line, "column": column},
                        "end_location": {"row": line, "column": column}, "cell": error.cell,
                        "fix": None, "url": None, "noqa_row": None})
            continue
        for kind, record in _records(result):
            end_row, end_column = end_of(record)
            fix = getattr(record, "fix", "") if kind == "finding" else None
            out.append({
                "filename": result.path, "code": record.code, "kind": kind, "message": record.message,
                "location": {"row": record.line, "column": record.column},
                "end_location": {"row": end_row, "column": end_column},
                "cell": record.cell,
                # ruff's fix is an object of edits; here a finding's fix is what a person should do (text),
                # and a change is already in the output (``applied``).
                "fix": ({"message": fix, "applicability": "manual", "edits": []} if kind == "finding" and fix
                        else {"message": record.message, "applicability": "applied", "edits": []}
                        if kind == "change" else None),
                "url": rule_hint(record.code),
                "noqa_row": record.line,
            })
    return out


def sarif_log(results: list[MigrationResult]) -> dict:
    """One SARIF 2.1.0 log with one run: the codes reported as its rules, every record as a result."""
    from .. import __version__
    from ..engine.codes import engine_code
    from ..engine.registry import all_rules

    rules = {rule.code: rule for rule in all_rules()}
    used = sorted({record.code for r in results if r.error is None for _, record in _records(r)})
    descriptors = []
    for code in used:
        rule = rules.get(code) or engine_code(code)
        descriptors.append({
            "id": code,
            "name": rule.name if rule is not None else code,
            "shortDescription": {"text": rule.summary if rule is not None else code},
            "help": {"text": rule_hint(code)},
            "properties": {"fixSafety": rule.fix_safety if rule is not None else "none"},
        })
    index = {code: i for i, code in enumerate(used)}
    sarif_results = []
    for result in results:
        if result.error is not None:
            error = result.error
            sarif_results.append({
                "level": "error",
                "message": {"text": _in_cell(error, error.message)},
                "locations": [_location(result.path, error.line or 1, error.column or 1, None, None,
                                        error.cell is not None)],
            })
            continue
        for kind, record in _records(result):
            end_line, end_column = end_of(record)
            text = record.message + (f" (fix: {record.fix})" if kind == "finding" and record.fix else "")
            sarif_results.append({
                "ruleId": record.code,
                "ruleIndex": index[record.code],
                "level": "warning" if kind == "finding" else "note",
                "kind": "fail" if kind == "finding" else "informational",
                "message": {"text": _in_cell(record, text)},
                "locations": [_location(result.path, record.line, record.column, end_line, end_column,
                                        record.cell is not None)],
            })
    return {
        "$schema": SARIF_SCHEMA,
        "version": SARIF_VERSION,
        "runs": [{
            "tool": {"driver": {"name": "xla-migrate", "version": __version__, "rules": descriptors}},
            "results": sarif_results,
        }],
    }


def _in_cell(record, text: str) -> str:
    cell = getattr(record, "cell", None)
    return f"cell {cell}, line {record.line}: {text}" if cell is not None else text


def _location(path: str, line: int, column: int, end_line, end_column, in_cell: bool) -> dict:
    """A physical location: the file, and for a script the region (a notebook's lines are the cell's)."""
    location: dict = {"artifactLocation": {"uri": path.replace("\\", "/")}}
    if not in_cell and line:
        region = {"startLine": line, "startColumn": max(column, 1)}
        if end_line:
            region.update(endLine=end_line, endColumn=max(end_column, 1))
        location["region"] = region
    return {"physicalLocation": location}
