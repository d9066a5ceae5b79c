"""Suppression comments, in ruff's spelling, applied once for every rule (not per rule):

- ``# noqa: XLA311`` (codes separated by commas or spaces) keeps its line as it is: the replacements and
  removals those rules would make there and their findings are dropped before the edits are applied (a
  statement inserted beside the line, such as the device binding, stays); a bare ``# noqa`` does so for
  every rule. Codes of other tools (``# noqa: E501``) are not ours and change nothing.
- ``# xla-migrate: skip-file`` anywhere in a file: the file is left as it is, with no finding.
- ``# xla-migrate: off`` ... ``# xla-migrate: on``: the lines between are kept as a bare ``# noqa`` keeps
  one (an ``off`` without its ``on`` runs to the end of the file).

A ``# noqa`` naming an XLA code that suppressed nothing (or that no rule has) is reported as XLA002, as
ruff's RUF100 does, so stale comments do not pile up.
"""

from __future__ import annotations

import io
import re
import tokenize
from dataclasses import dataclass, field

from .records import Finding

CODE = "XLA002"  # the code of the findings that report an unused suppression
_NOQA = re.compile(r"#\s*noqa(?::\s*(?P<codes>[A-Z]+[0-9]+(?:[,\s]+[A-Z]+[0-9]+)*))?", re.IGNORECASE)
_DIRECTIVE = re.compile(r"#\s*xla-migrate:\s*(?P<what>skip-file|off|on)\b", re.IGNORECASE)


@dataclass
class _Noqa:
    column: int  # 1-based, where the comment starts
    codes: frozenset[str] | None  # our codes (XLA...); None: a bare ``# noqa`` (every rule)
    text: str
    used: set[str] = field(default_factory=set)


@dataclass
class Suppressions:
    skip_file: bool = False
    noqa: dict[int, _Noqa] = field(default_factory=dict)  # line -> its noqa comment
    blocks: list[tuple[int, int]] = field(default_factory=list)  # [off line, on line] (inclusive)

    def __bool__(self) -> bool:
        return self.skip_file or bool(self.noqa) or bool(self.blocks)

    def suppresses(self, line: int, code: str) -> bool:
        """Whether a record of rule ``code`` on ``line`` is kept out (and notes the noqa as used)."""
        comment = self.noqa.get(line)
        if comment is not None and (comment.codes is None or code in comment.codes):
            comment.used.add(code)
            return True
        return any(start <= line <= end for start, end in self.blocks)

    def unused(self, known_code, ran) -> list[Finding]:
        """XLA002 findings: the codes a ``# noqa`` names that suppressed nothing (for a rule of this run, or
        no rule at all); a bare ``# noqa`` is other tools' too, and is never reported."""
        findings = []
        for line, noqa in sorted(self.noqa.items()):
            if noqa.codes is None:
                continue
            unknown = sorted(c for c in noqa.codes if not known_code(c))
            unused = sorted(c for c in noqa.codes if known_code(c) and ran(c) and c not in noqa.used)
            if unknown:
                findings.append(Finding(line, noqa.column, CODE,
                                        f"unknown code in suppression `{noqa.text}`: {', '.join(unknown)}",
                                        "remove it or correct the code (xla-migrate --list-rules)", None, line,
                                        noqa.column + len(noqa.text)))
            if unused:
                findings.append(Finding(line, noqa.column, CODE,
                                        f"unused suppression `{noqa.text}`: no {', '.join(unused)} change or "
                                        "finding on this line", "remove the code from the comment", None, line,
                                        noqa.column + len(noqa.text)))
        return findings


def scan(code: str) -> Suppressions:
    """The suppression comments of ``code`` (the input's text). Most files have none: a substring test
    answers them without tokenizing."""
    lowered = code.lower()
    if "noqa" not in lowered and "xla-migrate:" not in lowered:
        return Suppressions()
    found = Suppressions()
    off_since: int | None = None
    for line, column, comment in _comments(code):
        directive = _DIRECTIVE.match(comment)
        if directive is not None:
            what = directive.group("what").lower()
            if what == "skip-file":
                found.skip_file = True
            elif what == "off" and off_since is None:
                off_since = line
            elif what == "on" and off_since is not None:
                found.blocks.append((off_since, line))
                off_since = None
            continue
        match = _NOQA.search(comment)
        if match is None:
            continue
        codes = match.group("codes")
        if codes is None:
            ours = None
        else:
            ours = frozenset(c.upper() for c in re.split(r"[,\s]+", codes) if c.upper().startswith("XLA"))
            if not ours:
                continue  # another tool's codes only
        found.noqa[line] = _Noqa(column + match.start() + 1, ours, match.group(0))
    if off_since is not None:
        found.blocks.append((off_since, code.count("\n") + 1))
    return found


def _comments(code: str):
    """(line, 0-based column, text) of each comment; a line scan where the tokenizer gives up (the
    parser accepted the code, so that is rare: a continuation line tokenize refuses)."""
    try:
        return [(token.start[0], token.start[1], token.string)
                for token in tokenize.generate_tokens(io.StringIO(code).readline)
                if token.type == tokenize.COMMENT]
    except (tokenize.TokenError, SyntaxError):
        out = []
        for number, text in enumerate(code.splitlines(), 1):
            at = text.find("#")
            if at >= 0:
                out.append((number, at, text[at:]))
        return out
