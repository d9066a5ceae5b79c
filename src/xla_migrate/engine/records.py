"""What a migration reports: changes it made and findings a human must act on."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True, order=True)
class Change:
    """An edit the tool made. Line and column are 1-based, in the input (in a notebook: within ``cell``, the
    cell's number counted from 1, markdown cells included; None for a script)."""

    line: int
    column: int
    code: str
    message: str
    cell: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True, order=True)
class Finding:
    """Something left for a human: what was seen (message) and what to do about it (fix)."""

    line: int
    column: int
    code: str
    message: str
    fix: str = ""
    cell: int | None = None  # as Change.cell

    def to_dict(self) -> dict:
        return asdict(self)


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
