"""Mutations of every golden input: CRLF line endings, a BOM, a coding cookie, no final newline, tabs for
indentation, comments stripped, quotes swapped. Migrating the mutated input must give the mutated output:
the mutation carries through and nothing else moves."""

from __future__ import annotations

import io
import re
import tokenize

import pytest
from goldens import cases_on_disk

from xla_migrate import migrate

# One target per input keeps the run short; the goldens cover both targets.
CASES = [c for c in cases_on_disk() if c.target == "2.9"]


def crlf(text: str) -> str:
    return text.replace("\n", "\r\n")


def no_final_newline(text: str) -> str:
    return text.rstrip("\n")


def cookie(text: str) -> str:
    if text.startswith("#!"):
        first, _, rest = text.partition("\n")
        return f"{first}\n# -*- coding: utf-8 -*-\n{rest}"
    return "# -*- coding: utf-8 -*-\n" + text


def tabs(text: str) -> str:
    return re.sub(r"(?m)^((?:    )+)", lambda m: "\t" * (len(m.group(1)) // 4), text)


def _tokens(text: str):
    return list(tokenize.generate_tokens(io.StringIO(text).readline))


def strip_comments(text: str) -> str:
    """Remove every comment: a comment-only line goes, a trailing comment is cut off its line."""
    lines = text.split("\n")
    drop = set()
    for token in reversed(_tokens(text)):
        if token.type == tokenize.COMMENT and not token.string.startswith("#!"):
            row, col = token.start
            kept = lines[row - 1][:col].rstrip()
            if kept:
                lines[row - 1] = kept
            else:
                drop.add(row - 1)
    return "\n".join(line for index, line in enumerate(lines) if index not in drop)


def normalized_tokens(text: str) -> list[tuple[int, str]]:
    """Tokens with string literals by value, so a quote change compares equal."""
    out = []
    for token in _tokens(text):
        if token.type == tokenize.STRING and not token.string.lower().startswith(("f", "rf", "fr", "b", "rb", "br")):
            out.append((token.type, repr(eval(token.string))))  # noqa: S307 - a literal from our own fixtures
        elif token.type not in (tokenize.NL, tokenize.COMMENT):
            out.append((token.type, token.string))
    return out


def swap_quotes(text: str) -> str:
    """Double-quoted plain strings become single-quoted (where no quote inside makes that unsafe)."""
    lines = text.split("\n")
    for token in reversed(_tokens(text)):
        s = token.string
        if (token.type == tokenize.STRING and s.startswith('"') and not s.startswith('"""') and "'" not in s
                and token.start[0] == token.end[0]):
            row, col = token.start
            line = lines[row - 1]
            lines[row - 1] = line[:col] + "'" + s[1:-1] + "'" + line[token.end[1]:]
    return "\n".join(lines)


# Where a rule reads comments on purpose, stripping them changes the output by design.
COMMENT_SENSITIVE = {
    # XLA104 keeps `if True:` when the if line carries a comment, rather than lose the comment.
    "XLA104/if_statements[2.9]",
    "XLA104/elif_chain[2.9]",
}

EXACT = {"crlf": crlf, "no-final-newline": no_final_newline, "cookie": cookie, "tabs": tabs,
         "strip-comments": strip_comments}


def _migrate(text: str, case) -> str:
    result = migrate(text.encode("utf-8"), target=case.target, select=case.select,
                     data_parallel=case.data_parallel)
    assert result.error is None, result.error
    return result.code


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_mutations_carry_through(case):
    source = case.input.read_text()
    expected = case.expected.read_text()
    for name, mutate in EXACT.items():
        if name == "strip-comments" and case.id in COMMENT_SENSITIVE:
            continue
        got = _migrate(mutate(source), case)
        want = mutate(expected)
        if name == "strip-comments":  # comments the tool writes itself are stripped on both sides
            got = strip_comments(got)
        assert got == want, f"{name}: migrating the mutated input moved something else"
    swapped = _migrate(swap_quotes(source), case)
    assert normalized_tokens(swapped) == normalized_tokens(expected), "quotes: the output differs beyond quotes"


def test_bom_is_kept_and_nothing_else_moves():
    for case in CASES[:20]:
        data = case.input.read_bytes()
        result = migrate(b"\xef\xbb\xbf" + data, target=case.target, select=case.select,
                         data_parallel=case.data_parallel)
        assert result.output_bytes == b"\xef\xbb\xbf" + case.expected.read_bytes()
