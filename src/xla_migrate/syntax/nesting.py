"""A cheap guard against input nested too deeply for libcst, run on the tokens before libcst sees the text.

libcst's analysis (metadata resolution, visitors, code generation) recurses about three Python frames per
level of its tree, so under Python's default recursion limit (1,000) it fails with RecursionError, and its
native parser overflows its stack (a segfault, no message) on deeper input. Measured with libcst 1.9 on
Python 3.11 here: the analysis survived 319 chained operators, implicitly joined strings, attribute or call
trailers or ``elif`` branches, and 138 nested lists (two tree levels each); the native parser (8 MB stack)
segfaulted at 1,234 nested lists, 1,273 nested parentheses and an 8,000-term sum (after minutes).
``tests/test_bad_input.py`` checks that input at the limit migrates with 150 caller frames to spare.

The estimate here counts, along the path from the module to each token, what nests in libcst's tree:
every open bracket (3: a list and its element, a call and its argument, a subscript, its element and
index), every operator, ``.``, call or subscript trailer, joined string, conditional or lambda (1, reset at
a comma or ``=`` at the same bracket level, since those separate siblings), every indentation level (2: a
block and its statement) and every ``elif``/``else`` of a chain (1). Input over ``MAX_DEPTH`` is refused:
that is at most 66 nested brackets (CPython itself allows 200), 49 nested calls, 99 nested blocks or a
199-link chain (``LIMITS``, which the refusal's message names), well within what libcst survives, and far
beyond real code.
"""

from __future__ import annotations

import io
import re
import sys
import token
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass, field

from . import plain_tokens

MAX_DEPTH = 200
BRACKET_WEIGHT = 3
INDENT_WEIGHT = 2

_OPEN, _CLOSE = "([{", ")]}"
_CHAIN_OPERATORS = {
    "+", "-", "*", "/", "//", "%", "@", "**", "<<", ">>", "&", "|", "^", "~", ".", ":=",
}
# Separators between siblings: the depth counted at this bracket level starts again after them.
_SEPARATORS = {",", ";", "=", "+=", "-=", "*=", "/=", "//=", "%=", "@=", "**=", "<<=", ">>=", "&=", "|=",
               "^=", "->"}
_CHAIN_KEYWORDS = {"and", "or", "not", "lambda", "await", "yield", "if", "else"}
# A token after which an opening bracket is a call or subscript trailer (one more level), not a display.
_TRAILER_AFTER = {token.NAME, token.NUMBER, token.STRING}
_KEYWORDS_BEFORE_DISPLAYS = {"and", "or", "not", "in", "is", "if", "else", "lambda", "return", "yield",
                             "await", "for", "while", "assert", "del", "import", "from", "with", "as",
                             "elif", "except", "raise", "async"}
_FSTRING_START = getattr(token, "FSTRING_START", None)  # Python 3.12+ tokenizes f-strings in parts
_FSTRING_END = getattr(token, "FSTRING_END", None)
_STRING_PREFIX = re.compile(r"[A-Za-z]*")


_STATEMENT_DEPTH = 2  # a module-level statement's own depth: what its first bracket or operator adds to
LIMITS = {  # what the guard takes at most, each alone (tests/test_safety.py measures them)
    "nested brackets": (MAX_DEPTH - _STATEMENT_DEPTH) // BRACKET_WEIGHT,
    "nested calls": (MAX_DEPTH - _STATEMENT_DEPTH) // (BRACKET_WEIGHT + 1),
    "nested blocks": (MAX_DEPTH - _STATEMENT_DEPTH) // INDENT_WEIGHT,
    "chained operators, attributes or calls": MAX_DEPTH - 1,
}


def too_deep_message() -> str:
    """What the guard refuses, in the units a reader counts (its depth weighs each kind differently)."""
    limits = ", ".join(f"{count} {what}" for what, count in LIMITS.items())
    return (f"too deeply nested for xla-migrate: it takes at most {limits}, fewer where they combine "
            "(CPython itself takes 200 nested brackets and 100 nested blocks)")


class TooDeep(Exception):
    def __init__(self, line: int, column: int) -> None:
        super().__init__(line, column)
        self.line, self.column = line, column


@dataclass
class TopLevel:
    """Where the top-level statements lie, from the same tokens (large_files.py parses a large file in
    pieces cut there)."""

    # The line (from 1) of each top-level statement's first token: its first decorator, if any. The
    # ``elif``/``else``/``except``/``finally`` clauses of a top-level compound statement are not statements.
    statement_lines: list[int] = field(default_factory=list)
    # The line of each top-level block's first indented line (where the tokenizer indents from column 0).
    indent_lines: list[int] = field(default_factory=list)


def too_deep_at(text: str) -> tuple[int, int] | None:
    """(line, column) of the first token nested deeper than ``MAX_DEPTH``, or None."""
    return scan(text)[0]


def scan(text: str) -> tuple[tuple[int, int] | None, TopLevel | None]:
    """(line, column) of the first token nested deeper than ``MAX_DEPTH`` (or None), and the top-level
    statements (None when the text does not tokenize, or is refused).

    Tokenizing errors end the check quietly: the parser reports them, and everything before the error
    was within the limit."""
    top_level = TopLevel()
    try:
        _check(_tokens(text), top_level)
    except TooDeep as deep:
        return (deep.line, deep.column), None
    except (tokenize.TokenError, SyntaxError, ValueError):
        return None, None
    return None, top_level


# Python 3.12 tokenizes in C; before it, plain_tokens gives tokenize's tokens at about 60% of its cost.
_TOKENIZES_IN_PYTHON = sys.version_info < (3, 12)


def _tokens(text: str) -> Iterator[tuple]:
    """tokenize.TokenInfo tuples, or plain_tokens' (type, string, start): the check reads those three."""
    if _TOKENIZES_IN_PYTHON and plain_tokens.is_plain(text):
        return plain_tokens.tokens(text)
    return tokenize.generate_tokens(io.StringIO(text).readline)


_CLAUSES = {"elif", "else", "except", "finally"}


def _check(tokens, top_level: TopLevel) -> None:
    # One entry per open bracket (the outermost is the statement): [depth where it starts, chain count].
    levels: list[list[int]] = [[0, 0]]
    indent = 0
    # Per indentation level, the elif/else branches of the chain now open there.
    branches: list[int] = [0]
    at_statement_start = True
    after_decorator = False  # the last top-level logical line was a decorator
    previous: tuple | None = None
    for tok in tokens:
        kind, value = tok[0], tok[1]  # a TokenInfo, or plain_tokens' (type, string, start)
        if kind == token.INDENT:
            indent += 1
            branches.append(0)
            if indent == 1:
                top_level.indent_lines.append(tok[2][0])
            continue
        if kind == token.DEDENT:
            indent -= 1
            del branches[indent + 1:]
            continue
        if kind in (token.NL, token.COMMENT, token.ENDMARKER):
            continue
        if kind == token.NEWLINE:
            levels = [[0, 0]]
            at_statement_start = True
            previous = None
            continue
        if at_statement_start:
            at_statement_start = False
            if indent == 0:
                if not after_decorator and not (kind == token.NAME and value in _CLAUSES):
                    top_level.statement_lines.append(tok[2][0])
                after_decorator = kind == token.OP and value == "@"
            if kind == token.NAME and value in ("elif", "else"):
                branches[indent] += 1
            elif not (kind == token.NAME and value in ("except", "finally", "case")):
                branches[indent] = 0
            levels[0][0] = INDENT_WEIGHT * indent + sum(branches) + 2
            statement_keyword = kind == token.NAME
        else:
            statement_keyword = False
        level = levels[-1]
        if kind == token.OP and value in _OPEN:
            if _is_trailer(previous):
                level[1] += 1
            depth = level[0] + level[1] + BRACKET_WEIGHT
            if depth > MAX_DEPTH:
                raise _too_deep(tok)
            levels.append([depth, 0])
        elif kind == token.OP and value in _CLOSE:
            if len(levels) > 1:
                levels.pop()
        elif _FSTRING_START is not None and kind == _FSTRING_START:
            if previous is not None and previous[0] in (token.STRING, _FSTRING_END):
                level[1] += 1
            depth = level[0] + level[1] + BRACKET_WEIGHT
            if depth > MAX_DEPTH:
                raise _too_deep(tok)
            levels.append([depth, 0])
        elif _FSTRING_END is not None and kind == _FSTRING_END:
            if len(levels) > 1:
                levels.pop()
        else:
            if kind == token.OP and value in _SEPARATORS:
                level[1] = 0
            elif kind == token.OP and value in _CHAIN_OPERATORS:
                level[1] += 1
            elif kind == token.NAME and value in _CHAIN_KEYWORDS and not statement_keyword:
                level[1] += 1
            elif kind == token.STRING:
                if previous is not None and previous[0] in (token.STRING, _FSTRING_END):
                    level[1] += 1  # implicitly joined strings nest, one level per string
                level_depth = level[0] + level[1] + BRACKET_WEIGHT * _fstring_nesting(value)
                if level_depth > MAX_DEPTH:
                    raise _too_deep(tok)
            if level[0] + level[1] > MAX_DEPTH:  # compared here: a call per token cost 1% of a migration
                raise _too_deep(tok)
        if kind not in (token.NL, token.COMMENT):
            previous = tok


def _is_trailer(previous: tuple | None) -> bool:
    if previous is None:
        return False
    if previous[0] == token.OP:
        return previous[1] in _CLOSE
    if previous[0] == token.NAME:
        return previous[1] not in _KEYWORDS_BEFORE_DISPLAYS
    return previous[0] in _TRAILER_AFTER or (_FSTRING_END is not None and previous[0] == _FSTRING_END)


def _fstring_nesting(value: str) -> int:
    """Brackets nested inside an f-string token (Python before 3.12 gives one token for the whole
    f-string; its expressions nest in libcst's tree like any other)."""
    prefix = _STRING_PREFIX.match(value).group().lower()
    if "f" not in prefix:
        return 0
    depth = deepest = 0
    for character in value:
        if character in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif character in ")]}":
            depth = max(0, depth - 1)
    return deepest


def _too_deep(tok: tuple) -> TooDeep:
    return TooDeep(tok[2][0], tok[2][1] + 1)
