"""Node positions (and parents) from one render of the module, at about the cost of printing it.

libcst's PositionProvider splits every token with a regex to keep a running line and column, and enters a
generator context manager per syntactic node: about seven times a plain ``Module.code``. Here the render
keeps a running character offset (one addition per token) and records each node's (start, end) offsets,
packed in one int (a tuple of two ints took three objects per node: 0.3 GB more on a 5 MB script); an offset
becomes libcst's (line, column) only when a node's position is asked, by bisection over the
offsets where lines start. The positions are libcst's exactly (tests/test_positions.py checks every node),
and the same render gives the module's code, with where each top-level statement's text lies in it: an
output's render copies the text of the top-level statements the edits kept (``InputText``).
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import accumulate

import libcst as cst
from libcst._nodes.internal import CodegenState
from libcst.metadata import CodePosition, CodeRange

# What libcst counts as a line break (position_provider.NEWLINE_RE).
_LINE_BREAK = re.compile(r"\r\n?|\n")
# A node's offsets are kept as start << _SHIFT | end.
_SHIFT = 32
_END = (1 << _SHIFT) - 1


class _OffsetCodegenState(CodegenState):
    """libcst's code generation, keeping a running offset and each node's (start, end) offsets with the
    semantics of libcst's PositionProvidingCodegenState: a node's syntactic position (recorded by its own
    codegen, possibly hoisted from a child's) is not overwritten by the whitespace-inclusive one."""

    __slots__ = ("offset", "_indent_width", "ranges", "parents", "_starts", "_open", "_syntactic", "popped")

    def __init__(self, default_indent: str, default_newline: str) -> None:
        super().__init__(default_indent, default_newline)
        self.offset = 0
        self._indent_width = 0
        self.ranges: dict[cst.CSTNode, int] = {}  # start << _SHIFT | end
        self._starts: list[int] = []
        # Child -> parent, from the nodes being rendered (libcst's ParentNodeProvider), for no walk of its own.
        self.parents: dict[cst.CSTNode, cst.CSTNode] = {}
        self._open: list[cst.CSTNode] = []
        self._syntactic: list[tuple[cst.CSTNode, cst.CSTNode | None, cst.CSTNode | None, int]] = []
        # The module's final newline, which libcst drops when the file has none (positions still count it).
        self.popped = ""

    def increase_indent(self, value: str) -> None:
        self.indent_tokens.append(value)
        self._indent_width += len(value)

    def decrease_indent(self) -> None:
        self._indent_width -= len(self.indent_tokens.pop())

    def add_indent_tokens(self) -> None:
        self.tokens.extend(self.indent_tokens)
        self.offset += self._indent_width

    def add_token(self, value: str) -> None:
        self.tokens.append(value)
        self.offset += len(value)

    def before_codegen(self, node: cst.CSTNode) -> None:
        self._starts.append(self.offset)
        if self._open:
            self.parents[node] = self._open[-1]
        self._open.append(node)

    def after_codegen(self, node: cst.CSTNode) -> None:
        self._open.pop()
        start = self._starts.pop()
        if node not in self.ranges:
            self.ranges[node] = start << _SHIFT | self.offset

    def pop_trailing_newline(self) -> None:
        if self.tokens:
            self.popped = self.tokens.pop()

    # libcst's nodes use ``with state.record_syntactic_position(node, ...)``: the state itself is the context
    # manager (a generator-based one per node cost more than the rest of the bookkeeping).
    def record_syntactic_position(self, node: cst.CSTNode, *, start_node: cst.CSTNode | None = None,
                                  end_node: cst.CSTNode | None = None) -> _OffsetCodegenState:
        self._syntactic.append((node, start_node, end_node, self.offset))
        return self

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc_info: object) -> bool:
        node, start_node, end_node, start = self._syntactic.pop()
        ranges = self.ranges
        ranges[node] = ((ranges[start_node] >> _SHIFT if start_node is not None else start) << _SHIFT
                        | (ranges[end_node] & _END if end_node is not None else self.offset))
        return False


class _PlainCodegenState(CodegenState):
    """libcst's code generation as ``Module.code_for_node`` runs it, without the generator context manager
    libcst enters per syntactic node to record nothing: the same tokens, for about two thirds of the time."""

    __slots__ = ()

    def record_syntactic_position(self, node: cst.CSTNode, *, start_node: cst.CSTNode | None = None,
                                  end_node: cst.CSTNode | None = None) -> _PlainCodegenState:
        return self

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc_info: object) -> bool:
        return False


def render(node: cst.CSTNode, module: cst.Module | None = None) -> str:
    """``module.code_for_node(node)`` (``module.code`` for the module itself; without a module, the default
    indentation and newline), rendered with the cheaper state."""
    layout = module if module is not None else node if isinstance(node, cst.Module) else _DEFAULT_LAYOUT
    state = _PlainCodegenState(layout.default_indent, layout.default_newline)
    node._codegen(state)
    return "".join(state.tokens)


_DEFAULT_LAYOUT = cst.Module(body=[])


@dataclass(frozen=True)
class InputText:
    """The input's render, for rendering outputs: the code, and the text of each top-level statement in it
    (leading comments and blank lines included) by the statement node. An output keeps most of the input's
    top-level statements as they are (the same objects): their text is the input's, rendered again by the
    same codegen with the same module layout."""

    code: str
    spans: dict[cst.CSTNode, tuple[int, int]]
    default_indent: str
    default_newline: str

    def reusable_in(self, module: cst.Module) -> bool:
        return module.default_indent == self.default_indent and module.default_newline == self.default_newline


def render_module(module: cst.Module, reused: InputText | None = None) -> str:
    """``module.code``; the top-level statements ``reused`` holds are copied from the input's code."""
    return render_in_pieces(module, None, reused)[0]


def render_in_pieces(module: cst.Module, piece_chars: int | None,
                     reused: InputText | None = None) -> tuple[str, list[int]]:
    """``module.code``, and the offsets where its pieces start: the first at 0, each later one where a
    top-level statement (its leading comments and blank lines included) starts at least ``piece_chars``
    after the last (no later piece when None). The render is Module's own (header, statements, footer, the
    final newline); the top-level statements ``reused`` holds are copied from the input's code."""
    state = _PlainCodegenState(module.default_indent, module.default_newline)
    tokens = state.tokens
    spans = reused.spans if reused is not None and reused.reusable_in(module) else {}
    # Without a final newline, Module's codegen pops the last token: the last statement is rendered.
    last = module.body[-1] if module.body and not module.has_trailing_newline else None
    starts, offset, counted = [0], 0, 0
    for index, statement in enumerate(_module_statements(module, state)):
        if piece_chars is not None:
            offset += sum(map(len, tokens[counted:]))
            counted = len(tokens)
            if index and offset - starts[-1] >= piece_chars:
                starts.append(offset)
        span = spans.get(statement)
        if span is not None and statement is not last:
            tokens.append(reused.code[span[0]:span[1]])
        else:
            statement._codegen(state)
    return "".join(tokens), starts


def _module_statements(module: cst.Module, state: CodegenState) -> Iterator[cst.BaseStatement]:
    """Module's own codegen (``Module._codegen_impl``) around its statements: renders the header, gives
    each statement for the caller to render, then renders the footer and the final newline (libcst pops
    the last token when the file has none)."""
    for line in module.header:
        line._codegen(state)
    yield from module.body
    for line in module.footer:
        line._codegen(state)
    if module.has_trailing_newline:
        if not state.tokens:
            state.add_token(state.default_newline)
    else:
        state.pop_trailing_newline()


class Positions:
    """Every node's CodeRange, as libcst's PositionProvider gives it, from one render of ``module``."""

    def __init__(self, module: cst.Module) -> None:
        state = _OffsetCodegenState(module.default_indent, module.default_newline)
        # The module's codegen (CSTNode._codegen around Module._codegen_impl), keeping where each top-level
        # statement's text starts and ends.
        spans: dict[cst.CSTNode, tuple[int, int]] = {}
        state.before_codegen(module)
        for statement in _module_statements(module, state):
            start = state.offset
            statement._codegen(state)
            spans[statement] = (start, state.offset)
        if not module.has_trailing_newline and module.body:
            del spans[module.body[-1]]  # its final newline was popped: its text is not all in the code
        state.after_codegen(module)
        self._ranges = state.ranges
        self.parents: dict[cst.CSTNode, cst.CSTNode] = state.parents  # child -> parent, every node but the module
        self.code: str = "".join(state.tokens)
        self._line_starts = _line_starts(state.tokens, state.popped, self.code)
        self.input_text = InputText(self.code, spans, module.default_indent, module.default_newline)

    def range(self, node: cst.CSTNode) -> CodeRange | None:
        offsets = self._ranges.get(node)
        if offsets is None:
            return None
        return CodeRange(self._position(offsets >> _SHIFT), self._position(offsets & _END))

    def start(self, node: cst.CSTNode) -> tuple[int, int] | None:
        """(line, column) where ``node`` starts: line from 1, column from 0 in characters."""
        offsets = self._ranges.get(node)
        return self._line_column(offsets >> _SHIFT) if offsets is not None else None

    def end(self, node: cst.CSTNode) -> tuple[int, int] | None:
        offsets = self._ranges.get(node)
        return self._line_column(offsets & _END) if offsets is not None else None

    def _line_column(self, offset: int) -> tuple[int, int]:
        index = bisect_right(self._line_starts, offset) - 1
        return index + 1, offset - self._line_starts[index]

    def _position(self, offset: int) -> CodePosition:
        return CodePosition(*self._line_column(offset))


def _line_starts(tokens: list[str], popped: str, code: str) -> list[int]:
    """The offsets where lines start (in ``code`` followed by the ``popped`` final newline). libcst counts
    breaks token by token, so a CR ending one token and an LF starting the next are two breaks there: text
    with a CR is scanned token by token."""
    text = code + popped
    if "\r" not in text:
        return list(accumulate((len(line) + 1 for line in text.split("\n")[:-1]), initial=0))
    starts = [0]
    offset = 0
    for token in (*tokens, popped):
        if "\r" in token or "\n" in token:
            starts.extend(offset + match.end() for match in _LINE_BREAK.finditer(token))
        offset += len(token)
    return starts
