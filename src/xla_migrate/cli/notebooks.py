"""Jupyter notebooks as one program: the code cells are joined in order (a marker statement between them),
migrated as one script, so that what one cell defines is known in the next, and the result is split back
into its cells; outputs, metadata and the other cells stay as they are. Imports the output needs go into
the first code cell. IPython lines (``%magic``, ``!shell``, ``x = !cmd``, ``obj?``) are masked with a
placeholder statement before parsing and put back after; the placeholder and the marker between cells are
spelled so that no line of the notebook can be taken for one (``_Markers``). A cell run by a cell magic (``%%bash``...) is left
out, except ``%%time``, ``%%timeit`` and ``%%capture``, whose body is Python. A code cell that still is not
Python (shell lines without ``!``, another language, a syntax error) is left out too, as it is, with a finding
(``XLA001``) that names it; the other cells migrate."""

from __future__ import annotations

import ast
import bisect
import re
import warnings
from dataclasses import replace

from ..report.diff import unified_diff
from ..engine.records import Finding
from ..syntax.patterns import IPYTHON_PLACEHOLDER_COMMENT
from ..engine.triggers import mentions_a_trigger
from .ipython_lines import cuda_in_ipython_lines

# `%magic`, `!cmd`, `x = !cmd`, `?obj`, `obj?` and wildcard help (`torch.*Tensor?`).
IPYTHON_LINE = re.compile(r"^(?P<indent>[ \t]*)(?:[%!]|[\w.]+(?:\s*,\s*[\w.]+)*\s*=\s*[%!]|\?+[\w.]|[\w.*]+\?+\s*$)")
CELL_LEFT_OUT = "XLA001"  # the code of the findings that report a code cell left out: it is not Python
CELL_MARKER_COMMENT = "# xla-migrate:cell"
PYTHON_CELL_MAGICS = ("%%time", "%%timeit", "%%capture")


class _Markers:
    """The placeholder of a masked IPython line and the marker statement between two cells of the joined
    program (a statement, not a comment, so that the imports the output needs, added after the leading
    import block, stay in the first cell). A tag goes into both until neither spelling occurs anywhere in
    the notebook's cells, so a line of the user's can never be taken for one."""

    def __init__(self, sources: list[str]) -> None:
        tag, number = "", 0
        while any(IPYTHON_PLACEHOLDER_COMMENT + tag in source or CELL_MARKER_COMMENT + tag in source
                  for source in sources):
            number += 1
            tag = f"{number}-"
        self.placeholder = "pass  " + IPYTHON_PLACEHOLDER_COMMENT + tag + "{}"
        self.placeholder_re = re.compile(r"^[ \t]*pass  " + re.escape(IPYTHON_PLACEHOLDER_COMMENT + tag) + r"(\d+)$")
        self.cell = "pass  " + CELL_MARKER_COMMENT + tag + " {}"
        self.cell_re = re.compile(r"^pass  " + re.escape(CELL_MARKER_COMMENT + tag) + r" (\d+)$")


_PLAIN = _Markers([])  # the spelling for a notebook without a line that looks like one


def mask(source: str, markers: _Markers = _PLAIN) -> tuple[str, list[str]]:
    saved: list[str] = []
    lines = source.split("\n")
    for index, line in enumerate(lines):
        match = IPYTHON_LINE.match(line)
        if match:
            lines[index] = match.group("indent") + markers.placeholder.format(len(saved))
            saved.append(line)
    return "\n".join(lines), saved


def unmask(code: str, saved: list[str], markers: _Markers = _PLAIN) -> str:
    if not saved:
        return code
    lines = code.split("\n")
    for index, line in enumerate(lines):
        match = markers.placeholder_re.match(line)
        if match and int(match.group(1)) < len(saved):
            # The line takes its placeholder's indentation: a rule that moved the block around it (a folded
            # `if` dedents its branch) moved the placeholder too.
            original = saved[int(match.group(1))]
            indent = line[:len(line) - len(line.lstrip(" \t"))]
            lines[index] = indent + original.lstrip(" \t")
    return "\n".join(lines)


def _syntax_error(masked: str) -> SyntaxError | None:
    """Why a masked cell is not Python on its own, by CPython's compile() as IPython compiles a cell
    (top-level ``await`` allowed); None if it is."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(masked, "<cell>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)
    except SyntaxError as error:
        return error
    except (ValueError, RecursionError, MemoryError):  # a null byte, absurd nesting: the engine says why
        return None
    return None


def _is_python(nb) -> bool:
    language = (nb.metadata.get("kernelspec", {}).get("language")
                or nb.metadata.get("language_info", {}).get("name") or "python")
    return str(language).lower() == "python"


def _has_python(masked: str, markers: _Markers = _PLAIN) -> bool:
    """Whether a masked cell has code beyond IPython lines and comments (a `!pip install` cell has none)."""
    return any(line.strip() and not line.lstrip().startswith("#") and not markers.placeholder_re.match(line)
               for line in masked.split("\n"))


class _Program:
    """The joined program and the way back: which program line is which cell's line."""

    def __init__(self, markers: _Markers = _PLAIN) -> None:
        self.markers = markers
        self.lines: list[str] = []
        self.cells: list[int] = []  # cell numbers, in order
        self.starts: list[int] = []  # program line (1-based) of each cell's first line
        self.saved: dict[int, list[str]] = {}  # masked IPython lines per cell
        self.trailing_newline: dict[int, bool] = {}

    def add(self, number: int, masked: str, saved: list[str], trailing_newline: bool) -> None:
        if self.cells:
            self.lines.append(self.markers.cell.format(number))
        self.cells.append(number)
        self.starts.append(len(self.lines) + 1)
        self.lines += masked.split("\n")
        self.saved[number], self.trailing_newline[number] = saved, trailing_newline

    @property
    def text(self) -> str:
        return "\n".join(self.lines) + "\n"

    def place(self, line: int | None) -> tuple[int | None, int | None]:
        """(cell number, line within the cell) of a program line."""
        if line is None:
            return None, None
        index = max(0, bisect.bisect_right(self.starts, line) - 1)
        return self.cells[index], line - self.starts[index] + 1

    def split(self, code: str) -> dict[int, str] | None:
        """The migrated program back into cell sources; None if the markers are not all there, in order."""
        lines = code.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        parts: dict[int, list[str]] = {self.cells[0]: []}
        expected = iter(self.cells[1:])
        current = self.cells[0]
        following = next(expected, None)
        for line in lines:
            match = self.markers.cell_re.match(line)
            if match:
                if following is None or int(match.group(1)) != following:
                    return None
                current, following = following, next(expected, None)
                parts[current] = []
                continue
            parts[current].append(line)
        if following is not None:
            return None
        return {number: unmask("\n".join(body), self.saved[number], self.markers)
                + ("\n" if self.trailing_newline[number] else "")
                for number, body in parts.items()}


def migrate_notebook(task, data: bytes, options, outcome) -> bytes:
    """Migrate ``data`` (a .ipynb file); fill ``outcome``; return the new bytes (``data`` when unchanged)."""
    import nbformat

    from ..api import _migrate

    outcome.parsed = True
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        outcome.error = f"{task.path}: not valid utf-8: byte 0x{data[error.start]:02x} cannot be decoded"
        return data
    try:
        nb = nbformat.reads(text, as_version=nbformat.NO_CONVERT)
    except (AttributeError, TypeError):  # nbformat on JSON that is not an object ([], null, "cells": "x")
        outcome.error = f"{task.path}: not a valid notebook: its JSON is not a notebook object with a list of cells"
        return data
    except Exception as error:  # JSON or schema errors: one line
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        if "has no attribute" in message:  # nbformat's wording for the same shape errors, wrapped
            message = "its JSON is not a notebook object with a list of cells"
        outcome.error = f"{task.path}: not a valid notebook: {message}"
        return data
    if nb.get("nbformat") != 4:
        outcome.error = f"{task.path}: notebook format {nb.get('nbformat')} is not supported (only 4)"
        return data
    if not _is_python(nb):
        return data
    code_cells = [cell.source if isinstance(cell.source, str) else "".join(cell.source)
                  for cell in nb.cells if cell.cell_type == "code"]
    markers = _Markers(code_cells)
    program = _Program(markers)
    sources: dict[int, str] = {}
    left_out: list[tuple[str, Finding]] = []
    left_out_sources: list[str] = []
    for number, cell in enumerate(nb.cells, 1):
        if cell.cell_type != "code":
            continue
        source = cell.source if isinstance(cell.source, str) else "".join(cell.source)
        left_out += cuda_in_ipython_lines(task.path, number, source, IPYTHON_LINE)  # XLA003: not rewritten
        first = source.lstrip().split("\n", 1)[0].split()
        if first and first[0].startswith("%%") and first[0] not in PYTHON_CELL_MAGICS:
            continue  # another language (%%bash, %%html...)
        body = source[:-1] if source.endswith("\n") else source
        masked, saved = mask(body, markers)
        if not _has_python(masked, markers):
            continue  # nothing to analyse; and the first code cell, where imports go, is one with code
        error = _syntax_error(masked)
        if error is not None:
            reason = f"{error.msg} at line {error.lineno}" if error.lineno else error.msg
            left_out.append((f"{task.path}:cell {number}:line {error.lineno or 1}", Finding(
                error.lineno or 1, error.offset or 1, CELL_LEFT_OUT,
                f"code cell left as it is: it is not Python ({reason}; shell lines need a leading !)",
                "migrate any CUDA code in it by hand", cell=number)))
            left_out_sources.append(source)
            continue
        program.add(number, masked, saved, source.endswith("\n"))
        sources[number] = source
    from ..engine.registry import ignored_engine_codes

    left_out = [item for item in left_out if item[1].code not in ignored_engine_codes(options.ignore_for(task.path))]
    if not any(mentions_a_trigger(s.encode("utf-8")) for s in [*sources.values(), *left_out_sources]):
        outcome.findings = [item for item in left_out if item[1].code == "XLA003"]
        return data
    outcome.findings = list(left_out)
    if not program.cells:
        return data
    # In a tree run the notebook sees the project's modules, as a script of the tree does
    project = getattr(options, "project", None)
    project = project.with_notebook(task.path, program.text) if project is not None else None
    result = _migrate(program.text, target=options.target, select=options.select, ignore=options.ignore_for(task.path),
                      path=task.path, distributed=options.distributed, project=project,
                      data_parallel=options.data_parallel, cells_compiled=True, fix_safety=options.fix_safety)
    if result.error is not None:
        cell, line = program.place(result.error.line)
        outcome.input_error = replace(result.error, cell=cell, line=line)
        outcome.error = outcome.input_error.format(task.path)
        return data
    outcome.target = result.target
    outcome.data_parallel = result.data_parallel
    outcome.data_parallel_reason = result.data_parallel_reason
    outcome.changes = [_in_cell(program, task.path, c) for c in result.changes]
    outcome.findings = sorted([*left_out, *(_in_cell(program, task.path, f) for f in result.findings)],
                              key=lambda item: (item[1].cell or 0, item[1].line, item[1].column))
    if not result.changed:
        return data
    new_sources = program.split(result.code)
    if new_sources is None:  # a rule moved code across a cell boundary: refuse rather than guess
        outcome.error = f"{task.path}: internal error in xla-migrate: the migrated code cannot be split back into its cells; please report it"
        return data
    changed = False
    for number, new_source in new_sources.items():
        if new_source != sources[number]:
            nb.cells[number - 1].source = new_source
            changed = True
    if not changed:
        return data
    nbformat.validate(nb)
    new_text = nbformat.writes(nb, version=nbformat.NO_CONVERT)
    if text.endswith("\n") and not new_text.endswith("\n"):
        new_text += "\n"
    outcome.releases = result.releases
    if options.want_diff:
        outcome.diff = unified_diff(text, new_text, task.path, task.out_path or task.path).encode("utf-8")
    return new_text.encode("utf-8")


def _in_cell(program: _Program, path: str, record):
    """A change or finding at its cell and line within the cell, with the label the text report prints."""
    cell, line = program.place(record.line)
    moved = replace(record, cell=cell, line=line,
                    end_line=record.end_line - record.line + line if record.end_line else 0)
    return f"{path}:cell {cell}:line {line}", moved
