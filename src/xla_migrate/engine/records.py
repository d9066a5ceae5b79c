"""What a migration reports: changes it made and findings a human must act on."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True, order=True)
class Change:
    """An edit the tool made. Line and column are 1-based, in the input (in a notebook: within ``cell``, the
    cell's number counted from 1, markdown cells included; None for a script)."""

    line: int
    column: int
    code: str
    message: str
    cell: int | None = None
    # Where the node ends (line, 1-based column just past it; 0: not known, the start stands for it): for
    # the formats that take a range (github, json, sarif). Not compared, and not in the nested JSON report.
    end_line: int = field(default=0, compare=False, repr=False)
    end_column: int = field(default=0, compare=False, repr=False)

    def to_dict(self) -> dict:
        return _without_end(asdict(self))


@dataclass(frozen=True, order=True)
class Finding:
    """Something left for a human: what was seen (message) and what to do about it (fix)."""

    line: int
    column: int
    code: str
    message: str
    fix: str = ""
    cell: int | None = None  # as Change.cell
    end_line: int = field(default=0, compare=False, repr=False)  # as Change.end_line
    end_column: int = field(default=0, compare=False, repr=False)

    def to_dict(self) -> dict:
        return _without_end(asdict(self))


def _without_end(record: dict) -> dict:
    """The nested JSON report's record (schema version 2): no end position."""
    record.pop("end_line", None)
    record.pop("end_column", None)
    return record


def end_of(record) -> tuple[int, int]:
    """(end line, end column) of a record; its start where the end is not known."""
    if record.end_line:
        return record.end_line, record.end_column
    return record.line, record.column


@dataclass(frozen=True)
class InputError:
    """Why an input could not be migrated (never raised to the caller of ``migrate``)."""

    message: str
    line: int | None = None
    column: int | None = None
    cell: int | None = None  # as Change.cell

    def format(self, path: str) -> str:
        if self.cell is not None:
            where = f"{path}:cell {self.cell}" + (f":line {self.line}" if self.line is not None else "")
        else:
            where = path if self.line is None else f"{path}:{self.line}:{self.column or 0}"
        return f"{where}: {self.message}"
