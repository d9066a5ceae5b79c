"""Unified diffs that ``git apply`` and ``patch -p1`` accept: git-style ``a/``/``b/`` headers, no
timestamps, CRLF lines kept as they are, and the missing final newline marked the way diff marks it."""

from __future__ import annotations

from dataclasses import dataclass

NO_NEWLINE = "\\ No newline at end of file\n"


def split_lines(text: str) -> list[str]:
    """Lines with their endings, split on ``\\n`` only (``str.splitlines`` also splits on form feeds)."""
    parts = text.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def unified_diff(before: str, after: str, from_path: str, to_path: str, context: int = 3) -> str:
    """A git-style diff. When the output goes to another file (``--out``), the header says the new file is
    a copy of the input plus these hunks, so ``git apply`` and ``patch -p1`` create it and keep the input."""
    if before == after:
        return ""
    import difflib

    source, target = from_path.lstrip("/"), to_path.lstrip("/")
    out = [f"diff --git a/{source} b/{target}\n"]
    if source != target:
        out += [f"copy from {source}\n", f"copy to {target}\n"]
    for line in difflib.unified_diff(split_lines(before), split_lines(after), f"a/{source}", f"b/{target}",
                                     n=context):
        out.append(line if line.endswith("\n") else line + "\n" + NO_NEWLINE)
    return "".join(out)


@dataclass(frozen=True)
class DiffStats:
    files: int
    hunks: int
    added: int
    removed: int


def diff_stats(diff: str) -> DiffStats:
    if not diff:
        return DiffStats(0, 0, 0, 0)
    from unidiff import PatchSet

    patch = PatchSet(diff)
    return DiffStats(
        files=len(patch),
        hunks=sum(len(f) for f in patch),
        added=sum(f.added for f in patch),
        removed=sum(f.removed for f in patch),
    )
