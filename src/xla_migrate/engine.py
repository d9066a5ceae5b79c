"""The pipeline: one parse, one metadata resolution, one facts pass, one batched traversal of all rules,
one apply, imports fixed once, then render. See DESIGN.md section 3.

    bytes -> parse -> MetadataWrapper -> facts -> rules (visit_batched) -> apply -> imports -> bytes
"""

from __future__ import annotations

import ast
import codecs
import functools
import io
import re
import tokenize
import warnings
from dataclasses import dataclass

import libcst as cst

from .apply import apply_edits
from .context import MigrationContext
from .imports import add_imports, remove_dead_imports
from .records import Change, Finding, InputError
from .rule import Rule
from .targets import Target


@dataclass
class PipelineOutput:
    code: str
    output_bytes: bytes
    encoding: str
    changes: list[Change]
    findings: list[Finding]
    concepts: set[str]


def check_input(data: bytes) -> InputError | None:
    """Reject what is not Python source text before parsing: binary files and undecodable bytes."""
    if b"\0" in data:
        return InputError("binary file (contains NUL bytes), not Python source")
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as error:
        # detect_encoding also fails when the first lines are not UTF-8: say so rather than blame a cookie.
        if not error.msg.startswith("invalid or missing encoding declaration"):
            return InputError(f"cannot read: {error.msg}")
        encoding = "utf-8"
    try:
        data.decode(encoding)
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        declared = codecs.lookup(encoding).name
        return InputError(f"not valid {declared}: byte 0x{data[error.start]:02x} cannot be decoded", line,
                          error.start - (data.rfind(b"\n", 0, error.start) + 1) + 1)
    return None


def parse(data: bytes) -> cst.Module | InputError:
    error = check_input(data)
    if error is not None:
        return error
    try:
        return cst.parse_module(data)
    except cst.ParserSyntaxError as error:
        return _syntax_error(data, error)
    except (RecursionError, MemoryError) as error:
        return InputError(f"cannot parse: {type(error).__name__}")


def _syntax_error(data: bytes, error: cst.ParserSyntaxError) -> InputError:
    """Python's own message and position where it has one (``Missing parentheses in call to 'print'``):
    libcst's are a list of expected tokens, and its reported column is not always the failing one."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ast.parse(data)
    except SyntaxError as python_error:
        return InputError(f"cannot parse: {python_error.msg}", python_error.lineno, python_error.offset)
    except (ValueError, RecursionError, MemoryError):
        pass
    match = re.search(r"error at (\d+):(\d+): (.*)", error.message)
    if match:
        return InputError(f"cannot parse: {match.group(3)}", int(match.group(1)), int(match.group(2)) + 1)
    return InputError(f"cannot parse: {error.message}", error.editor_line, error.editor_column)


class _BatchedRules(cst.CSTVisitor):
    """Runs every rule in one traversal: ``visit_<Node>`` on the way down, ``leave_<Node>`` on the way up.

    Like libcst's ``visit_batched``, but the rule methods per node type are looked up once per rule class
    (libcst inspects every visitor's members on every call: most of the time on a small file). Rules take
    their metadata from the context, which resolved it once, so none is resolved here."""

    def __init__(self, rules: list[Rule]) -> None:
        super().__init__()
        self._visits: dict[str, list] = {}
        self._leaves: dict[str, list] = {}
        for rule in rules:
            for prefix, table in (("visit_", self._visits), ("leave_", self._leaves)):
                for node_type in _handled_node_types(type(rule), prefix):
                    table.setdefault(node_type, []).append(getattr(rule, prefix + node_type))

    def on_visit(self, node: cst.CSTNode) -> bool:
        for method in self._visits.get(type(node).__name__, ()):
            method(node)
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        for method in self._leaves.get(type(original_node).__name__, ()):
            method(original_node)

    # No rule uses libcst's per-attribute hooks; the default ones cost two lookups per child of every node.
    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        pass

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        pass


@functools.lru_cache(maxsize=None)
def _handled_node_types(rule_class: type, prefix: str) -> tuple[str, ...]:
    """Node type names a rule class has ``visit_X``/``leave_X`` methods for (attribute hooks excluded)."""
    names = [name[len(prefix):] for name in dir(rule_class) if name.startswith(prefix)]
    return tuple(n for n in names if isinstance(getattr(cst, n, None), type))


def run_pipeline(module: cst.Module, target: Target, rules: list[type[Rule]],
                 distributed: bool | None = None) -> PipelineOutput:
    """``distributed``: True/False force the distributed or single-device migration; None detects it."""
    wrapper = cst.MetadataWrapper(module, unsafe_skip_copy=True)
    ctx = MigrationContext(wrapper, target, distributed=distributed)
    if rules:
        module.visit(_BatchedRules([rule(ctx) for rule in rules]))
    new_module = apply_edits(ctx)
    if new_module is not module:
        new_module = remove_dead_imports(new_module, ctx.maybe_dead_imports)
        new_module = add_imports(new_module, ctx.imports)
    return PipelineOutput(
        code=new_module.code,
        output_bytes=new_module.bytes,
        encoding=new_module.encoding,
        changes=sorted(ctx.changes),
        findings=sorted(ctx.findings),
        concepts=ctx.concepts,
    )
