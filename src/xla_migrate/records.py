"""What a migration reports: changes it made and findings a human must act on."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True, order=True)
class Change:
    """An edit the tool made. Line and column are 1-based, in the input."""

    line: int
    column: int
    code: str
    message: str

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

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class InputError:
    """Why an input could not be migrated (never raised to the caller of ``migrate``)."""

    message: str
    line: int | None = None
    column: int | None = None

    def format(self, path: str) -> str:
        where = path if self.line is None else f"{path}:{self.line}:{self.column or 0}"
        return f"{where}: {self.message}"
