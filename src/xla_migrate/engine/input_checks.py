"""What is refused before anything is parsed, the same way however the tool is called (``migrate``, one
file, a tree, a notebook): input too large to migrate in bounded memory, text that is not a string Python
can hold, and source that CPython itself rejects when it compiles it.

Memory, measured here on the CLI (libcst 1.9, Python 3.11): one 1 MB statement (a list or a call of
numbers) peaks at 0.73-0.99 GB in 7-8 s, a 5 MB script of ordinary statements at 1.35 GB in 46 s (the
large-file path parses it in pieces cut before top-level statements, ``large_files.py``). One statement
cannot be cut, so its size is bounded as well as the file's: ``MAX_INPUT_BYTES`` (about 2.7 GB at the
limit, extrapolated) and ``MAX_STATEMENT_CHARS`` (about 1 GB).

CPython's own ``compile()`` is the judge of what is Python (``except E, e:``, ``return`` outside a
function, ``nonlocal`` at module level...): libcst parses a superset. It costs about 12% of a migration on
real scripts (0.57 s of 4.84 s over 100 files of 3-100 kB).
"""

from __future__ import annotations

import ast
import os
import re
import stat
import warnings

from .records import InputError

MAX_INPUT_BYTES = 10_000_000
MAX_STATEMENT_CHARS = 1_000_000
_LINE_END = re.compile(r"\r\n?|\n")


class TooLarge(Exception):
    """An input over ``MAX_INPUT_BYTES``; ``str()`` is the one-line message (without the path)."""


def size_message(size: int | None) -> str:
    what = "more than" if size is None else f"{size:,} bytes, over"
    return (f"too large: {what} the {MAX_INPUT_BYTES:,} bytes xla-migrate migrates at most (its memory grows "
            "with the input; a generated or data file can be excluded)")


def read_bounded(path: str | os.PathLike, stream=None) -> bytes:
    """The bytes of ``path`` (or of the open binary ``stream``), refusing more than ``MAX_INPUT_BYTES``
    before reading them all (``/dev/zero`` included): raises ``TooLarge``, or ``OSError`` as reading does."""
    if stream is not None:
        data = stream.read(MAX_INPUT_BYTES + 1)
    else:
        with open(path, "rb") as handle:
            try:
                size = os.fstat(handle.fileno())
            except OSError:
                size = None
            if size is not None and stat.S_ISREG(size.st_mode) and size.st_size > MAX_INPUT_BYTES:
                raise TooLarge(size_message(size.st_size))
            data = handle.read(MAX_INPUT_BYTES + 1)
    if len(data) > MAX_INPUT_BYTES:
        raise TooLarge(size_message(None))
    return data


def text_error(text: str) -> InputError | None:
    """Why a str cannot be source at all: a lone surrogate (no encoding holds it; CPython refuses it)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        line = text.count("\n", 0, error.start) + 1
        column = error.start - (text.rfind("\n", 0, error.start) + 1) + 1
        return InputError(f"not valid text: a lone surrogate ({ascii(text[error.start])[1:-1]}) cannot be "
                          "encoded; Python source cannot hold one", line, column)
    return None


def size_error(text: str) -> InputError | None:
    if len(text) > MAX_INPUT_BYTES:
        return InputError(size_message(len(text.encode("utf-8", "surrogatepass"))))
    return None


def compile_error(text: str, filename: str, top_level_await: bool = False) -> InputError | None:
    """CPython's verdict on ``text``: None when it compiles, else its message at its position, as
    ``cannot parse: MESSAGE``. ``top_level_await``: as IPython runs a notebook cell."""
    flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT if top_level_await else 0
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SyntaxWarnings (invalid escapes...) are the input's own
            compile(text, filename, "exec", flags=flags, dont_inherit=True)
    except SyntaxError as error:  # IndentationError and TabError included
        line = error.lineno if error.lineno else None
        return InputError(f"cannot parse: {error.msg}", line, error.offset if line else None)
    except (RecursionError, MemoryError):  # nested too deeply for CPython's compiler: the nesting guard says so
        return None
    except ValueError as error:  # a NUL character (caught before) or another refusal of the text itself
        return InputError(f"cannot parse: {error}")
    return None


def largest_statement(text: str, statement_lines: list[int]) -> tuple[int, int]:
    """(size in characters, first line) of the largest top-level statement (with the comments and blank
    lines before the next one): what the large-file path cannot cut."""
    if not statement_lines:
        return len(text), 1
    starts = [0]
    wanted = iter(statement_lines[1:])
    following = next(wanted, None)
    for line, end_of_line in enumerate(_LINE_END.finditer(text), 2):  # lines as Python's tokenizer counts
        if following is None:
            break
        if line == following:
            starts.append(end_of_line.end())
            following = next(wanted, None)
    ends = [*starts[1:], len(text)]
    size, index = max((end - start, index) for index, (start, end) in enumerate(zip(starts, ends)))
    return size, statement_lines[index]


def statement_error(text: str, statement_lines: list[int]) -> InputError | None:
    """A top-level statement over ``MAX_STATEMENT_CHARS`` (only a text that long can hold one)."""
    if len(text) <= MAX_STATEMENT_CHARS:
        return None
    size, line = largest_statement(text, statement_lines)
    if size <= MAX_STATEMENT_CHARS:
        return None
    return InputError(f"too large: this statement is {size:,} characters; xla-migrate migrates statements up to "
                      f"{MAX_STATEMENT_CHARS:,} (one statement is parsed whole, in memory that grows with it): "
                      "move the data to a file, or exclude this one", line, 1)
