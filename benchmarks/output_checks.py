"""Checks of a migrated output against its input, shared by the tests and benchmarks/corpus.py.

- ``cuda_constructs(code)``: the CUDA constructs in ``code``: ``.cuda`` / ``.cudnn`` attributes and bare ``cuda``
  / ``cudnn`` names (``torch.cuda.x``, ``x.cuda()``, ``import torch.backends.cudnn``), ``.pin_memory()`` calls,
  names that resolve into ``torch.cuda`` (``autocast`` imported from ``torch.cuda.amp``), and device or backend
  strings (``"cuda"``, ``"cuda:0"``, ``f"cuda:{rank}"``, ``"nccl"``); not inside annotations (a type hint runs
  no CUDA work).
- ``input_lines_for(source, output)``: output lines mapped back to input lines with difflib: an unchanged line
  maps to itself; a changed line to the input lines of its changed block; an inserted line to nothing.
- ``uncovered_in(result)``: the CUDA constructs left in an output without a finding on the input line they
  came from (a construct on a line the migration inserted has no input line, so it is always uncovered).
- ``unbound_names(code)``: every name access that no binding reaches.

Only libcst and the standard library: the benchmarks import this without pytest.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

import libcst as cst
from libcst.helpers import get_full_name_for_node
from libcst.metadata import MetadataWrapper, PositionProvider, QualifiedNameProvider, ScopeProvider

CUDA_NAMES = {"cuda", "cudnn"}
_CUDA_STRING = re.compile(r"(cuda|nccl)(:.*)?", re.DOTALL)


@dataclass(frozen=True)
class Construct:
    line: int  # 1-based, in the output
    text: str  # what to look for on the input line


class _Scanner(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (PositionProvider, QualifiedNameProvider)

    def __init__(self) -> None:
        super().__init__()
        self.found: list[Construct] = []
        self._attribute_names: set[cst.Name] = set()

    def _add(self, node: cst.CSTNode, text: str) -> None:
        self.found.append(Construct(self.get_metadata(PositionProvider, node).start.line, text))

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._attribute_names.add(node.attr)
        if node.attr.value in CUDA_NAMES:
            self._add(node.attr, node.attr.value)

    def visit_Name(self, node: cst.Name) -> None:
        if node in self._attribute_names:
            return
        if node.value in CUDA_NAMES:
            self._add(node, node.value)
            return
        names = {q.name for q in self.get_metadata(QualifiedNameProvider, node, set())}
        if any(n.startswith("torch.cuda.") for n in names):
            self._add(node, node.value)

    def visit_Annotation(self, node: cst.Annotation) -> bool:
        # A type hint (`scaler: amp.GradScaler`) names a type: it runs no CUDA work, and needs no finding.
        return False

    def visit_Call(self, node: cst.Call) -> None:
        # x.pin_memory(): pinned host memory needs CUDA.
        if isinstance(node.func, cst.Attribute) and node.func.attr.value == "pin_memory":
            self._add(node.func.attr, "pin_memory")

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        value = node.evaluated_value
        if isinstance(value, str) and _CUDA_STRING.fullmatch(value):
            self._add(node, value)

    def visit_FormattedString(self, node: cst.FormattedString) -> None:
        first = node.parts[0] if node.parts else None
        if isinstance(first, cst.FormattedStringText) and _CUDA_STRING.fullmatch(first.value):
            self._add(node, first.value.split(":")[0])


def cuda_constructs(code: str) -> list[Construct]:
    scanner = _Scanner()
    MetadataWrapper(cst.parse_module(code)).visit(scanner)
    return scanner.found


_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


def source_lines(code: str, keepends: bool = False) -> list[str]:
    """Lines as Python numbers them: only \\n, \\r\\n and \\r end a line (``str.splitlines`` also splits
    at a form feed and other separators, which would shift every line number after them)."""
    lines = _LINE.findall(code)
    return lines if keepends else [line.rstrip("\r\n") for line in lines]


def input_lines_for(source: str, output: str) -> dict[int, list[int]]:
    """Output line (1-based) -> the input lines (1-based) it may have come from; [] for inserted lines."""
    old, new = source_lines(source), source_lines(output)
    mapping: dict[int, list[int]] = {}
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        for j in range(j1, j2):
            if tag == "equal":
                mapping[j + 1] = [i1 + (j - j1) + 1]
            elif tag == "replace":
                mapping[j + 1] = list(range(i1 + 1, i2 + 1))
            else:  # insert
                mapping[j + 1] = []
    return mapping


def uncovered_in(result, constructs: list[Construct] | None = None) -> list[str]:
    """The CUDA constructs left in ``result``'s output without a finding on their input line. ``result`` has
    ``source`` and ``code`` (the decoded input and output) and ``findings`` (objects with a ``line``), as a
    successful ``MigrationResult`` has; ``constructs`` are the output's, when the caller has them already."""
    source = result.source
    finding_lines = {f.line for f in result.findings}
    old_lines = source_lines(source)
    mapping = input_lines_for(source, result.code)
    problems = []
    for construct in cuda_constructs(result.code) if constructs is None else constructs:
        candidates = mapping.get(construct.line, [])
        # In a changed block, the input lines that hold the same construct (else the whole block).
        same = [i for i in candidates if construct.text in old_lines[i - 1]]
        candidates = same or candidates
        if not finding_lines & set(candidates):
            where = f"input lines {candidates}" if candidates else "a line the migration inserted"
            problems.append(f"output line {construct.line}: {construct.text!r} ({where}) has no finding:\n"
                            f"    {source_lines(result.code)[construct.line - 1].strip()}")
    return problems


def unbound_names(code: str) -> list[tuple[str, int]]:
    """(name, line) of every access that no binding reaches (libcst's scopes see a function's later
    assignments as not yet bound: ``device = device if ...`` in a function is unbound)."""
    wrapper = MetadataWrapper(cst.parse_module(code))
    positions = wrapper.resolve(PositionProvider)
    found = set()
    for scope in {s for s in wrapper.resolve(ScopeProvider).values() if s is not None}:
        for access in scope.accesses:
            if not access.referents:
                found.add((get_full_name_for_node(access.node) or "?", positions[access.node].start.line))
    return sorted(found, key=lambda item: (item[1], item[0]))
