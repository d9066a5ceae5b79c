"""The project summary at the end of a tree run (text on stderr, ``project`` in the JSON report), the
decisions taken once for the project and where each came from, and ``--requirements``.

Counts come from the change and finding records of the run, nothing else: a CUDA construct is one record
of the device, AMP, distributed, checkpoint, Hugging Face or findings-only families (XLA1, 2, 4, 5, 6, 9)
or of the output gate (XLA000); a change record is one converted, a finding one left for a human. The loop
family (XLA3: device loaders, step barriers, host reads) adds what XLA needs and is counted apart.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

FAMILIES = {"XLA0": "gate", "XLA1": "device", "XLA2": "amp", "XLA3": "loop", "XLA4": "distributed",
            "XLA5": "checkpoint", "XLA6": "hf", "XLA9": "findings"}
CUDA_FAMILIES = ("gate", "device", "amp", "distributed", "checkpoint", "hf", "findings")
_SHOWN_LEFT = 10


def family(code: str) -> str:
    return FAMILIES.get(code[:4], "other")


@dataclass
class Decision:
    value: object
    source: str

    def to_dict(self) -> dict:
        return {"value": self.value, "from": self.source}


@dataclass
class ProjectSummary:
    files: int = 0
    changed: int = 0
    errors: int = 0
    changes_by_family: dict[str, int] = field(default_factory=dict)
    findings_by_family: dict[str, int] = field(default_factory=dict)
    converted: int = 0
    left: list[tuple[str, object]] = field(default_factory=list)  # (where, finding)
    install: tuple[str, ...] = ()
    decisions: dict[str, Decision] = field(default_factory=dict)
    index: dict | None = None
    index_seconds: float | None = None
    requirements: str | None = None  # what --requirements did, one sentence

    @property
    def constructs(self) -> int:
        return self.converted + len(self.left)

    def lines(self, dry: bool) -> list[str]:
        def counts(table: dict[str, int]) -> str:
            return ", ".join(f"{name} {n}" for name, n in sorted(table.items(), key=lambda i: (-i[1], i[0]))) or "none"

        out = [f"project: {self.files} files, {self.changed} {'would change' if dry else 'changed'}"
               + (f", {self.errors} with errors" if self.errors else "")]
        out.append(f"  changes by family: {counts(self.changes_by_family)}; findings by family: "
                   f"{counts(self.findings_by_family)}")
        out.append(f"  {self.converted} of {self.constructs} CUDA constructs converted, {len(self.left)} left for "
                   "a human" + (":" if self.left else ""))
        for where, finding in self.left[:_SHOWN_LEFT]:
            out.append(f"    {where}: {finding.code} {finding.message}")
        if len(self.left) > _SHOWN_LEFT:
            out.append(f"    ... and {len(self.left) - _SHOWN_LEFT} more (listed above)")
        if self.decisions:
            out.append("  decided once: " + "; ".join(f"{name.replace('_', ' ')} {_value(d.value)} ({d.source})"
                                                      for name, d in self.decisions.items()))
        if self.install:
            out.append(f"  install for the target: pip install {' '.join(self.install)}")
        if self.requirements:
            out.append(f"  {self.requirements}")
        return out

    def to_dict(self) -> dict:
        return {
            "files": self.files,
            "changed": self.changed,
            "errors": self.errors,
            "changes_by_family": dict(sorted(self.changes_by_family.items())),
            "findings_by_family": dict(sorted(self.findings_by_family.items())),
            "cuda_constructs": {"total": self.constructs, "converted": self.converted, "left": len(self.left),
                                "left_findings": [{"where": where, "code": f.code, "message": f.message}
                                                  for where, f in self.left]},
            "install": list(self.install),
            "decisions": {name: d.to_dict() for name, d in self.decisions.items()},
            "index": self.index,
            "requirements": self.requirements,
        }


def _value(value: object) -> str:
    if value is True:
        return "yes"
    if value is False:
        return "no"
    return str(value)


def summarize(outcomes, target, decisions: dict[str, Decision], index=None,
              index_seconds: float | None = None) -> ProjectSummary:
    """The summary of a tree run's outcomes (scripts and notebooks; copied files are not counted)."""
    scripts = [o for o in outcomes if o.kind != "other"]
    summary = ProjectSummary(files=len(scripts), changed=sum(1 for o in scripts if o.changed),
                             errors=sum(1 for o in scripts if o.error), install=target.pins,
                             decisions=decisions, index=index.describe() if index is not None else None,
                             index_seconds=index_seconds)
    for outcome in scripts:
        for _, change in outcome.changes:
            name = family(change.code)
            summary.changes_by_family[name] = summary.changes_by_family.get(name, 0) + 1
            if name in CUDA_FAMILIES:
                summary.converted += 1
        for where, finding in outcome.findings:
            name = family(finding.code)
            summary.findings_by_family[name] = summary.findings_by_family.get(name, 0) + 1
            if name in CUDA_FAMILIES:
                summary.left.append((where, finding))
    return summary


# --requirements -------------------------------------------------------------------------------------------
class RequirementsError(Exception):
    """One line: the file and why it was not changed."""


_NAMES_TORCH_XLA = re.compile(r"^\s*[\"']?torch[-_]xla\b", re.IGNORECASE | re.MULTILINE)


def requirement_for(target) -> str:
    return next(pin for pin in target.pins if pin.lower().startswith(("torch-xla", "torch_xla", "torch-tpu", "torch_tpu")))


def add_requirement(root: str, target, write: bool) -> str | None:
    """Add the target's torch_xla pin to ``requirements.txt`` (first) or to ``[project] dependencies`` of
    ``pyproject.toml`` under ``root``; nothing when neither exists or one already names torch_xla. Returns
    what was (or, with ``write`` False, would be) done; raises RequirementsError, writing nothing, when the
    file cannot be changed safely."""
    from .files import write_atomically

    requirement = requirement_for(target)
    requirements = Path(root) / "requirements.txt"
    pyproject = Path(root) / "pyproject.toml"
    verb = "added" if write else "would add"
    if requirements.is_file():
        text = _read(requirements)
        if _NAMES_TORCH_XLA.search(text):
            return f"{requirements}: already names torch_xla (left as it is)"
        new = text + ("" if text.endswith("\n") or not text else "\n") + requirement + "\n"
        if write:
            write_atomically(requirements, new.encode("utf-8"), mode_from=requirements)
        return f"{requirements}: {verb} {requirement}"
    if pyproject.is_file():
        text = _read(pyproject)
        new = _with_dependency(pyproject, text, requirement)
        if new is None:
            return f"{pyproject}: already names torch_xla in [project] dependencies (left as it is)"
        if write:
            write_atomically(pyproject, new.encode("utf-8"), mode_from=pyproject)
        return f"{pyproject}: {verb} {requirement} to [project] dependencies"
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise RequirementsError(f"{path}: cannot read: {getattr(error, 'strerror', None) or error}") from None


def _load(path: Path, text: str) -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise RequirementsError(f"{path}: not valid TOML ({error}): torch_xla not added") from None


def _with_dependency(path: Path, text: str, requirement: str) -> str | None:
    """``text`` with ``requirement`` appended to ``[project] dependencies`` (None: it names torch_xla
    already). The edit is textual, so comments and layout stay; the result must parse to the same table
    plus the one requirement, else nothing is written."""
    data = _load(path, text)
    project = data.get("project")
    if not isinstance(project, dict) or not isinstance(project.get("dependencies"), list):
        raise RequirementsError(f"{path}: no [project] dependencies list to add {requirement} to "
                                "(add it by hand)")
    dependencies = project["dependencies"]
    if any(isinstance(d, str) and _NAMES_TORCH_XLA.search(d) for d in dependencies):
        return None
    section = re.search(r"^\[project\]\s*$", text, re.MULTILINE)
    match = re.compile(r"^dependencies\s*=\s*\[", re.MULTILINE).search(text, section.end()) if section else None
    next_table = re.compile(r"^\[", re.MULTILINE).search(text, section.end()) if section else None
    if match is None or (next_table is not None and next_table.start() < match.start()):
        raise RequirementsError(f"{path}: cannot find the dependencies array of [project] (add {requirement} "
                                "by hand)")
    close = _closing_bracket(text, match.end())
    if close is None:
        raise RequirementsError(f"{path}: cannot read the dependencies array (add {requirement} by hand)")
    inside = text[match.end():close]
    stripped = inside.rstrip()
    if "\n" in inside:
        indent = re.search(r"\n([ \t]*)\S", inside)
        pad = indent.group(1) if indent else "    "
        comma = "" if not stripped.strip() or stripped.endswith(",") else ","
        new_inside = f"{stripped}{comma}\n{pad}\"{requirement}\",\n"
    else:
        comma = "" if not stripped.strip() or stripped.endswith(",") else ", "
        new_inside = f"{stripped}{comma}\"{requirement}\""
    new = text[:match.end()] + new_inside + text[close:]
    check = _load(path, new)
    if check.get("project", {}).get("dependencies") != [*dependencies, requirement]:
        raise RequirementsError(f"{path}: could not add {requirement} safely (add it by hand)")
    return new


def _closing_bracket(text: str, start: int) -> int | None:
    """The index of the ``]`` closing an array opened just before ``start`` (strings and comments skipped)."""
    depth, i = 1, start
    while i < len(text):
        char = text[i]
        if char in "\"'":
            end = text.find(char, i + 1)
            if end < 0:
                return None
            i = end
        elif char == "#":
            end = text.find("\n", i)
            i = len(text) if end < 0 else end
        elif char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None
