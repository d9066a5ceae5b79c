"""Small syntactic matchers the facts pass and the rules share (no state, no metadata)."""

from __future__ import annotations

import ast
import functools

import libcst as cst

from . import positions, walk


def string_value(node: cst.BaseExpression) -> str | None:
    """The value of a plain (non-f, non-bytes) string literal, else None."""
    if isinstance(node, cst.SimpleString):
        return _simple_string_value(node.value)
    if isinstance(node, cst.ConcatenatedString):
        left, right = string_value(node.left), string_value(node.right)
        if left is not None and right is not None:
            return left + right
    return None


def _simple_string_value(literal: str) -> str | None:
    """The value of a string literal's source (``'a'``, ``r"b"``, ``b"c"`` -> None). Read off the text when
    nothing in it needs evaluating (no escape, no line break to normalise); libcst's ``evaluated_value``
    compiles each literal, a tenth of the rules' time on a script with many strings."""
    start = 0
    while literal[start] not in "'\"":
        start += 1
    prefix = literal[:start].lower()
    if "b" in prefix:
        return None
    quote = 3 if literal.startswith(('"""', "'''"), start) else 1
    body = literal[start + quote:len(literal) - quote]
    if "\r" not in body and ("\\" not in body or "r" in prefix):
        return body
    value = ast.literal_eval(literal)
    return value if isinstance(value, str) else None


def is_cuda_string(node: cst.BaseExpression) -> bool:
    """``"cuda"``, ``"cuda:0"``, ``f"cuda:{rank}"``, ``"cuda:{}".format(gpu)``, ``"cuda:%d" % rank``."""
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Modulo):
        template = string_value(node.left)
        return template is not None and template.startswith("cuda:")
    if (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "format"
            and string_value(node.func.value) is not None):
        return string_value(node.func.value).startswith("cuda:")
    value = string_value(node)
    if value is not None:
        return value == "cuda" or value.startswith("cuda:")
    if isinstance(node, cst.FormattedString) and node.parts:
        first = node.parts[0]
        if isinstance(first, cst.FormattedStringText):
            text = first.value
            return text == "cuda" or text.startswith("cuda:")
    return False


def is_cuda_value(node: cst.BaseExpression) -> bool:
    """A CUDA device written as a string or a CPU-fallback conditional (``"cuda" if ok else "cpu"``), not a
    ``torch.device`` call."""
    if isinstance(node, cst.IfExp):
        return is_cuda_value(node.body)
    return is_cuda_string(node)


def call_name(node: cst.CSTNode) -> str | None:
    """The dotted spelling of a call's function as written (``torch.cuda.synchronize``), else None."""
    if isinstance(node, cst.Call):
        return dotted_name(node.func)
    return None


def dotted_name(node: cst.CSTNode) -> str | None:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = dotted_name(node.value)
        return None if base is None else f"{base}.{node.attr.value}"
    return None


def method_call(node: cst.CSTNode, *names: str) -> cst.Attribute | None:
    """The ``obj.method`` attribute when ``node`` is ``obj.method(...)`` for one of ``names``."""
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
        if node.func.attr.value in names:
            return node.func
    return None


def keyword(call: cst.Call, name: str) -> cst.Arg | None:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == name:
            return arg
    return None


def positional(call: cst.Call) -> list[cst.Arg]:
    return [a for a in call.args if a.keyword is None and not a.star]


def argument(call: cst.Call, index: int, name: str) -> cst.Arg | None:
    """The argument of parameter ``name`` (position ``index``), given by keyword or by position; None where it
    is not given, or not by keyword where a ``*args``/``**kwargs`` hides the positions."""
    given = keyword(call, name)
    if given is not None:
        return given
    if any(arg.star for arg in call.args):
        return None
    args = positional(call)
    return args[index] if index < len(args) else None


def without_trailing_comma(args: list[cst.Arg]) -> list[cst.Arg]:
    """Args with the last one's comma removed, so a shortened call does not end in ``, )``."""
    if not args:
        return args
    return [*args[:-1], args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)]


def find_all(tree: cst.CSTNode, predicate) -> list[cst.CSTNode]:
    """Every node in ``tree`` (itself included) for which ``predicate`` holds, in source order.
    (libcst.matchers.findall does this too, but importing libcst.matchers costs 0.2 s at start-up.)"""
    return [node for node in walk.subtree(tree) if predicate(node)]


# Where a rule's template (code spelled by the target) takes an expression from the script: parse the template
# with HOLE in its place, then ``fill(template, expression)``, so the expression keeps other rules' edits.
HOLE = "__xla_migrate_hole__"


class _Fill(cst.CSTTransformer):
    def __init__(self, value: cst.BaseExpression) -> None:
        super().__init__()
        self.value = value

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        return self.value if original_node.value == HOLE else updated_node


def fill(template: cst.CSTNode, value: cst.BaseExpression) -> cst.CSTNode:
    return template.visit(_Fill(value))


@functools.lru_cache(maxsize=4096)
def parsed_expression(code: str) -> cst.BaseExpression:
    """``cst.parse_expression(code)``, parsed once per text. Nodes never change, so one tree serves every
    edit that puts the same code in (``device``, ``xm.xla_device()``, a template): a parse costs about 50 µs,
    and a script makes hundreds of such edits."""
    return cst.parse_expression(code)


@functools.lru_cache(maxsize=4096)
def parsed_statement(code: str) -> cst.SimpleStatementLine | cst.BaseCompoundStatement:
    """``cst.parse_statement(code)``, parsed once per text, like ``parsed_expression``. libcst's native
    parser reads no parser config for a str (only the encoding, for bytes), so none is passed: the module's
    ``config_for_parsing`` cost more to build than the parse."""
    return cst.parse_statement(code)


def is_pure(node: cst.BaseExpression) -> bool:
    """An expression that can be evaluated or dropped without side effects: names, attributes, constants,
    and comparisons, boolean operations and ``not`` of them (no calls, subscripts or walruses)."""
    if isinstance(node, (cst.Name, cst.Integer, cst.Float, cst.SimpleString)):
        return True
    if isinstance(node, cst.Attribute):
        return is_pure(node.value)
    if isinstance(node, cst.UnaryOperation):
        return is_pure(node.expression)
    if isinstance(node, cst.BooleanOperation):
        return is_pure(node.left) and is_pure(node.right)
    if isinstance(node, cst.Comparison):
        return is_pure(node.left) and all(is_pure(c.comparator) for c in node.comparisons)
    return False


def code_of(node: cst.CSTNode) -> str:
    return positions.render(node)


def is_docstring(statement: cst.CSTNode) -> bool:
    return (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
            and isinstance(statement.body[0], cst.Expr)
            and isinstance(statement.body[0].value, (cst.SimpleString, cst.ConcatenatedString)))


# The comment of the ``pass`` that stands for a masked IPython line in a notebook (notebooks.py).
IPYTHON_PLACEHOLDER_COMMENT = "# xla-migrate:ipython:"


def is_ipython_placeholder(statement: cst.CSTNode) -> bool:
    """A notebook's masked ``%pip install ...`` / ``!nvidia-smi`` line: code added at the top goes after it."""
    return (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
            and isinstance(statement.body[0], cst.Pass) and statement.trailing_whitespace.comment is not None
            and statement.trailing_whitespace.comment.value.startswith(IPYTHON_PLACEHOLDER_COMMENT))


def is_import_line(statement: cst.CSTNode) -> bool:
    return isinstance(statement, cst.SimpleStatementLine) and all(
        isinstance(s, (cst.Import, cst.ImportFrom)) for s in statement.body)


def merge_carried_lines(carried: list[cst.EmptyLine], statement: cst.BaseStatement) -> list[cst.EmptyLine]:
    """The carried lines of removed statements to put before ``statement``: when they are only blank
    lines and ``statement`` already starts with blank lines, just enough to keep the larger gap (removing
    the one statement between two gaps leaves one gap, not their sum)."""
    if any(line.comment is not None for line in carried):
        return carried
    own = len(leading_blank_lines(statement))
    return carried[: max(0, len(carried) - own)] if own else carried


def leading_blank_lines(statement: cst.BaseStatement) -> list[cst.EmptyLine]:
    blanks = []
    for line in statement.leading_lines:
        if line.comment is not None:
            break
        blanks.append(line)
    return blanks
