"""Jupyter notebooks, cell by cell: each code cell migrates as its own script; outputs, metadata and other
cells stay as they are. IPython lines (``%magic``, ``!shell``, ``x = !cmd``, ``obj?``) are masked with a
placeholder statement before parsing and put back after; a cell magic (``%%bash``...) skips its cell."""

from __future__ import annotations

import re

from .diff import unified_diff
from .tree import mentions_a_trigger

IPYTHON_LINE = re.compile(r"^(?P<indent>[ \t]*)(?:[%!]|[\w.]+(?:\s*,\s*[\w.]+)*\s*=\s*[%!]|\?+[\w.]|[\w.]+\?+\s*$)")
PLACEHOLDER = "pass  # xla-migrate:ipython:{}"
PLACEHOLDER_RE = re.compile(r"^[ \t]*pass  # xla-migrate:ipython:(\d+)$")


def mask(source: str) -> tuple[str, list[str]]:
    saved: list[str] = []
    lines = source.split("\n")
    for index, line in enumerate(lines):
        match = IPYTHON_LINE.match(line)
        if match:
            lines[index] = match.group("indent") + PLACEHOLDER.format(len(saved))
            saved.append(line)
    return "\n".join(lines), saved


def unmask(code: str, saved: list[str]) -> str:
    if not saved:
        return code
    lines = code.split("\n")
    for index, line in enumerate(lines):
        match = PLACEHOLDER_RE.match(line)
        if match and int(match.group(1)) < len(saved):
            lines[index] = saved[int(match.group(1))]
    return "\n".join(lines)


def _is_python(nb) -> bool:
    language = (nb.metadata.get("kernelspec", {}).get("language")
                or nb.metadata.get("language_info", {}).get("name") or "python")
    return str(language).lower() == "python"


def migrate_notebook(task, data: bytes, options, outcome) -> bytes:
    """Migrate ``data`` (a .ipynb file); fill ``outcome``; return the new bytes (``data`` when unchanged)."""
    import nbformat

    from .api import migrate

    outcome.parsed = True
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        outcome.error = f"{task.path}: not valid utf-8: byte 0x{data[error.start]:02x} cannot be decoded"
        return data
    try:
        nb = nbformat.reads(text, as_version=nbformat.NO_CONVERT)
    except Exception as error:  # JSON or schema errors: one line
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        outcome.error = f"{task.path}: not a valid notebook: {message}"
        return data
    if nb.get("nbformat") != 4:
        outcome.error = f"{task.path}: notebook format {nb.get('nbformat')} is not supported (only 4)"
        return data
    if not _is_python(nb):
        return data
    changed = False
    releases = []
    for number, cell in enumerate(nb.cells, 1):
        if cell.cell_type != "code":
            continue
        source = cell.source if isinstance(cell.source, str) else "".join(cell.source)
        if not mentions_a_trigger(source.encode("utf-8")) or source.lstrip().startswith("%%"):
            continue
        masked, saved = mask(source)
        result = migrate(masked, target=options.target, select=options.select, ignore=options.ignore,
                         path=f"{task.path}:cell {number}", distributed=options.distributed)
        where = f"{task.path}:cell {number}"
        if result.error is not None:
            at = f":line {result.error.line}" if result.error.line is not None else ""
            outcome.error = f"{where}{at}: {result.error.message}"
            outcome.input_error = result.error
            return data
        outcome.target = result.target
        outcome.changes += [(f"{where}:line {c.line}", c) for c in result.changes]
        outcome.findings += [(f"{where}:line {f.line}", f) for f in result.findings]
        new_source = unmask(result.code, saved)
        if new_source != source:
            cell.source = new_source
            changed = True
            releases.append(result.releases)
    if not changed:
        return data
    nbformat.validate(nb)
    new_text = nbformat.writes(nb, version=nbformat.NO_CONVERT)
    if text.endswith("\n") and not new_text.endswith("\n"):
        new_text += "\n"
    low = max(r[0] for r in releases)
    highs = [r[1] for r in releases if r[1] is not None]
    outcome.releases = (low, min(highs) if highs else None)
    if options.want_diff:
        outcome.diff = unified_diff(text, new_text, task.path, task.out_path or task.path).encode("utf-8")
    return new_text.encode("utf-8")
