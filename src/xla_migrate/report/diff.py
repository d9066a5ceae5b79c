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
    out = [f"diff --git {git_quoted('a/' + source)} {git_quoted('b/' + target)}\n"]
    if source != target:
        out += [f"copy from {git_quoted(source)}\n", f"copy to {git_quoted(target)}\n"]
    for line in difflib.unified_diff(split_lines(before), split_lines(after), git_quoted(f"a/{source}"),
                                     git_quoted(f"b/{target}"), n=context):
        out.append(line if line.endswith("\n") else line + "\n" + NO_NEWLINE)
    return "".join(out)


_C_ESCAPES = {7: "\\a", 8: "\\b", 9: "\\t", 10: "\\n", 11: "\\v", 12: "\\f", 13: "\\r", 34: '\\"', 92: "\\\\"}


def git_quoted(name: str) -> str:
    """A path as git writes it in a diff header: as it is when it is printable ASCII, else in double quotes
    with C escapes and every other byte in octal (git's default, core.quotePath), so a name holding a
    newline cannot forge a header line and the header is ASCII in any file's encoding. Names that are not
    valid UTF-8 (their bytes kept as surrogates, as Python keeps them) are written byte for byte."""
    try:
        raw = name.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raw = name.encode("utf-8", "surrogatepass")
    if all(0x20 <= byte < 0x7F and byte not in (34, 92) for byte in raw):
        return name
    return '"' + "".join(_C_ESCAPES.get(byte) or (chr(byte) if 0x20 <= byte < 0x7F else f"\\{byte:03o}")
                         for byte in raw) + '"'


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
