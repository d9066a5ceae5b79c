"""The tokens of plain Python source, as ``tokenize`` gives them, at about 60% of its cost (for nesting.py's
guard, which runs on every input before it is parsed).

Python before 3.12 tokenizes in Python: a ``TokenInfo`` per token, the line and the end position with it,
and one large pattern tried for every token (names, the commonest, come last in it). ``tokens`` gives the
same tokens, in the same order, with the same errors, as (type, string, (line, column)) tuples, leaving
out what the guard skips (NL, COMMENT, ENDMARKER, and the NEWLINE and DEDENTs tokenize adds at the end). It
finds names, brackets, commas and newlines with a shorter pattern first, where tokenize's would give the
same span (a name followed by a quote could be a string prefix: those go to tokenize's pattern), and
tokenize's own patterns do the rest.

Plain means no carriage return and no form feed (``is_plain``): tokenize splits lines at LF only and
treats a CR as a newline token within them, and a form feed resets its indentation count; such text
goes to ``tokenize`` itself. ``tests/test_plain_tokens.py`` compares the two on every file of the repository
and on edge cases.
"""

from __future__ import annotations

import re
import token
import tokenize
from collections.abc import Iterator

Token = tuple[int, str, tuple[int, int]]

_PSEUDO_TOKEN = re.compile(tokenize.PseudoToken).match
# The commonest tokens where tokenize's pattern gives the same span; group 1 is the token.
# (A name must not be followed by a word character either, or the match could end it early.)
_COMMON_TOKEN = re.compile(r"[ \t]*([^\W\d]\w*(?![\w'\"])|[()\[\]{},\n])").match
# The end of a string that continues on later lines, per opening quote (with its prefix).
_STRING_END = {opening: re.compile(pattern).match for opening, pattern in tokenize.endpats.items()}
_DIGITS = frozenset("0123456789")
_NAME, _NUMBER, _STRING, _OP = token.NAME, token.NUMBER, token.STRING, token.OP
_NEWLINE, _INDENT, _DEDENT, _ERRORTOKEN = token.NEWLINE, token.INDENT, token.DEDENT, token.ERRORTOKEN


def is_plain(text: str) -> bool:
    return "\r" not in text and "\f" not in text


def tokens(text: str) -> Iterator[Token]:
    """tokenize's tokens of ``text`` (plain: ``is_plain``), leaving out NL, COMMENT, ENDMARKER and the
    NEWLINE and DEDENTs added at the end; raises where tokenize raises (TokenError, IndentationError)."""
    lines = [line + "\n" for line in text.split("\n")]
    lines[-1] = lines[-1][:-1]  # the text after the last newline (tokenize's last readline)
    if not lines[-1]:
        lines.pop()
    parens = 0  # brackets open (below zero after stray closing ones: tokenize then continues the statement)
    continued = False  # the line ended in a backslash
    indents = [0]
    # A string that continues on later lines: where it starts, its text so far, the match of its end, and
    # whether each line must end in a backslash (a single-quoted string).
    string: tuple[tuple[int, int], str, object, bool] | None = None
    number = 0
    for number, line in enumerate(lines, 1):
        pos, end = 0, len(line)
        if string is not None:
            start, so_far, string_end, needs_backslash = string
            closed = string_end(line)
            if closed:
                pos = closed.end()
                yield _STRING, so_far + line[:pos], start
                string = None
            elif needs_backslash and not line.endswith("\\\n"):
                yield _ERRORTOKEN, so_far + line, start
                string = None
                continue
            else:
                string = (start, so_far + line, string_end, needs_backslash)
                continue
        elif parens == 0 and not continued:  # a new statement: its indentation
            column = 0
            while pos < end:
                character = line[pos]
                if character == " ":
                    column += 1
                elif character == "\t":
                    column = (column // tokenize.tabsize + 1) * tokenize.tabsize
                else:
                    break
                pos += 1
            if pos == end:  # blanks without a newline: the last line, where tokenize stops
                return
            if line[pos] in "#\n":
                continue
            if column > indents[-1]:
                indents.append(column)
                yield _INDENT, line[:pos], (number, 0)
            while column < indents[-1]:
                if column not in indents:
                    raise IndentationError("unindent does not match any outer indentation level",
                                           ("<tokenize>", number, pos, line))
                indents.pop()
                yield _DEDENT, "", (number, pos)
        else:
            continued = False
        while pos < end:
            match = _COMMON_TOKEN(line, pos) or _PSEUDO_TOKEN(line, pos)
            if match is None:
                yield _ERRORTOKEN, line[pos], (number, pos)
                pos += 1
                continue
            start, pos = match.span(1)
            if start == pos:
                continue
            initial = line[start]
            if initial in _DIGITS or (initial == "." and pos - start > 1 and line[start:pos] != "..."):
                yield _NUMBER, line[start:pos], (number, start)
            elif initial == "\n":
                if parens <= 0:
                    yield _NEWLINE, "\n", (number, start)
            elif initial != "#":
                value = line[start:pos]
                if value in tokenize.triple_quoted:
                    closed = _STRING_END[value](line, pos)
                    if not closed:
                        string = ((number, start), line[start:], _STRING_END[value], False)
                        break
                    pos = closed.end()
                    yield _STRING, line[start:pos], (number, start)
                elif (initial in tokenize.single_quoted or value[:2] in tokenize.single_quoted
                      or value[:3] in tokenize.single_quoted):
                    if value[-1] == "\n":  # ends in a backslash and a newline: continues
                        quote = next(_STRING_END[c] for c in value[:3] if c in _STRING_END)
                        string = ((number, start), line[start:], quote, True)
                        break
                    yield _STRING, value, (number, start)
                elif initial.isidentifier():
                    yield _NAME, value, (number, start)
                elif initial == "\\":
                    continued = True
                else:
                    if initial in "([{":
                        parens += 1
                    elif initial in ")]}":
                        parens -= 1
                    yield _OP, value, (number, start)
    if string is not None:
        raise tokenize.TokenError("EOF in multi-line string", string[0])
    if parens != 0 or continued:
        raise tokenize.TokenError("EOF in multi-line statement", (number + 1, 0))
