"""Large files, parsed a piece at a time: one libcst tree, equal to the one the whole text parses to.

Measured on the generated 5 MB script (``benchmarks/large_file.py``): libcst's native parser peaks at
3.1 GB on the whole text, for its own tokens and tree beside the 0.4 GB of Python nodes it returns; parsed
in pieces of 100 kB, the peak is the nodes. So a text of ``LARGE_FILE_CHARS`` or more is cut before
top-level statements (``nesting.scan`` finds them while it checks the nesting), each piece is parsed
alone, and the pieces' statements are joined into one Module. The whole pipeline then runs on it as on
any other (one analysis, one step model: nothing is migrated piece by piece).

The joined tree is the one ``parse_module`` returns (``tests/test_large_files.py`` compares them node for
node on every fixture, cut at every top-level statement, and on layouts chosen to break it):

- the comments and blank lines that end a piece are its Module's footer, and are the next statement's
  leading lines in the whole text; so a cut is made only where every line between the previous statement
  and the cut is blank or a comment at column 0 (an indented one belongs to the block above it, and
  libcst drops a whitespace-only line at the end of a text: ``"x = 1\\n\\n\\n    \\n\\n"`` loses two lines);
- each piece detects its own default indentation and newline, which a block's ``indent`` and a newline's
  ``value`` are relative to: a piece whose defaults differ from the whole text's has them rewritten;
- a text with a lone CR is not cut (Python's tokenizer and libcst count its lines differently).

The gate's ``ast.parse`` of a 5 MB output holds 0.73 GB of ast nodes: the gate checks such an output a
piece at a time as well (``engine/gate.py``).
"""

from __future__ import annotations

import re
from bisect import bisect_left

import libcst as cst

from . import native_parse
from .nesting import TopLevel

LARGE_FILE_CHARS = 1_000_000
PIECE_CHARS = 100_000

_LINE_END = re.compile("\n")


def is_large(text: str) -> bool:
    return len(text) >= LARGE_FILE_CHARS


def parse_in_pieces(text: str, top_level: TopLevel, encoding: str,
                    piece_chars: int | None = None) -> cst.Module | None:
    """The Module of ``text`` (what ``cst.parse_module`` gives; ``encoding`` is the one it would detect),
    parsed in pieces of about ``piece_chars`` (default ``PIECE_CHARS``); None when a piece does not parse
    (the caller parses the whole text, for the error's position) or the text cannot be cut."""
    piece_chars = PIECE_CHARS if piece_chars is None else piece_chars
    if text.count("\r") != text.count("\r\n"):
        return None
    line_starts = [0, *(match.end() for match in _LINE_END.finditer(text))]
    cuts = [0]
    for line in top_level.statement_lines[1:]:
        offset = line_starts[line - 1]
        if offset - cuts[-1] >= piece_chars and _only_blank_or_comment_lines_before(text, line_starts, line):
            cuts.append(offset)
    if len(cuts) == 1:
        return None
    cuts.append(len(text))
    pieces = []
    for start, end in zip(cuts, cuts[1:]):
        try:
            pieces.append(native_parse.parse_module(text[start:end]))
        except (cst.ParserSyntaxError, RecursionError, MemoryError):
            return None
    indent = _default_indent(pieces, cuts, [line_starts[line - 1] for line in top_level.indent_lines])
    newline = pieces[0].default_newline
    first = pieces[0]
    body, footer = list(first.body), first.footer
    for piece, start, end in zip(pieces[1:], cuts[1:], cuts[2:]):
        has_newline = "\n" in text[start:end]  # a last piece of one line without a newline detects none
        if piece.default_indent != indent or (has_newline and piece.default_newline != newline):
            piece = piece.visit(_Relayout(piece, indent, newline if has_newline else piece.default_newline))
        statements = list(piece.body)
        statements[0] = statements[0].with_changes(
            leading_lines=[*footer, *piece.header, *statements[0].leading_lines])
        body += statements
        footer = piece.footer
    return first.with_changes(body=body, footer=footer, default_indent=indent, encoding=encoding,
                              has_trailing_newline=pieces[-1].has_trailing_newline)


def _only_blank_or_comment_lines_before(text: str, line_starts: list[int], line: int) -> bool:
    """Whether the lines between the statement that ends before ``line`` and ``line`` are all blank or
    comments at column 0 (lines scanned upwards until one with code; the first line has none above)."""
    index = line - 2  # the line above, from 0
    while index >= 0:
        content = text[line_starts[index]:line_starts[index + 1]].rstrip("\r\n")
        if content and not content.startswith("#"):
            return not content.isspace() and not content.lstrip().startswith("#")
        index -= 1
    return False


def _default_indent(pieces: list[cst.Module], cuts: list[int], indent_offsets: list[int]) -> str:
    """The whole text's default indentation: the first piece's with an indented block (libcst takes the
    first indentation of the text; a piece without one defaults to four spaces)."""
    for piece, start, end in zip(pieces, cuts, cuts[1:]):
        index = bisect_left(indent_offsets, start)
        if index < len(indent_offsets) and indent_offsets[index] < end:
            return piece.default_indent
    return pieces[0].default_indent


class _Relayout(cst.CSTTransformer):
    """A piece's blocks and newlines made relative to the whole text's defaults instead of its own."""

    def __init__(self, piece: cst.Module, indent: str, newline: str) -> None:
        super().__init__()
        self._piece_indent, self._indent = piece.default_indent, indent
        self._piece_newline, self._newline = piece.default_newline, newline

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock,
                            updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        actual = self._piece_indent if updated_node.indent is None else updated_node.indent
        return updated_node.with_changes(indent=None if actual == self._indent else actual)

    def leave_Newline(self, original_node: cst.Newline, updated_node: cst.Newline) -> cst.Newline:
        actual = self._piece_newline if updated_node.value is None else updated_node.value
        return updated_node.with_changes(value=None if actual == self._newline else actual)
