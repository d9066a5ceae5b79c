"""The invariant: after migration nothing CUDA-specific is left silently.

For every golden fixture input (every folder, so later fixtures are checked automatically) and every target,
the input is migrated with ALL rules; every CUDA construct that remains in the output must be covered by a
finding on the input line it came from. The output is scanned here independently of XLA900: ``.cuda`` /
``.cudnn`` attributes and bare ``cuda`` / ``cudnn`` names (``torch.cuda.x``, ``x.cuda()``, ``import
torch.backends.cudnn``), ``.pin_memory()`` calls, names that resolve into ``torch.cuda`` (``autocast`` imported from
``torch.cuda.amp``), and device or backend strings (``"cuda"``, ``"cuda:0"``, ``f"cuda:{rank}"``, ``"nccl"``).

Output lines are mapped back to input lines with difflib: an unchanged line maps to itself; a changed line to
the input lines of its changed block that hold the same construct text; a construct on a line the migration
inserted maps to nothing, so a rule that introduces CUDA code fails the test too.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

import libcst as cst
import pytest
from goldens import FIXTURES, NOT_GOLDEN
from libcst.metadata import MetadataWrapper, PositionProvider, QualifiedNameProvider

from xla_migrate import migrate
from xla_migrate.targets import TARGETS

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


def uncovered(source: str, target: str, ignore: list[str] | None = None) -> list[str]:
    """The CUDA constructs left in the migrated output without a finding on their input line."""
    result = migrate(source, target=target, ignore=ignore)
    assert result.error is None, result.error
    return uncovered_in(result)


def uncovered_in(result) -> list[str]:
    """The CUDA constructs left in ``result``'s output without a finding on their input line (``result``
    is a successful ``MigrationResult``; its decoded source and code are compared)."""
    source = result.source
    finding_lines = {f.line for f in result.findings}
    old_lines = source_lines(source)
    mapping = input_lines_for(source, result.code)
    problems = []
    for construct in cuda_constructs(result.code):
        candidates = mapping.get(construct.line, [])
        # In a changed block, the input lines that hold the same construct (else the whole block).
        same = [i for i in candidates if construct.text in old_lines[i - 1]]
        candidates = same or candidates
        if not finding_lines & set(candidates):
            where = f"input lines {candidates}" if candidates else "a line the migration inserted"
            problems.append(f"output line {construct.line}: {construct.text!r} ({where}) has no finding:\n"
                            f"    {source_lines(result.code)[construct.line - 1].strip()}")
    return problems


def fixture_inputs():
    return sorted(p for p in FIXTURES.glob("*/*.in.py") if p.parent.name not in NOT_GOLDEN)


INPUTS = fixture_inputs()


@pytest.mark.parametrize("target", list(TARGETS))
@pytest.mark.parametrize("path", INPUTS, ids=[f"{p.parent.name}/{p.name[:-6]}" for p in INPUTS])
def test_no_cuda_construct_is_left_silently(path, target):
    problems = uncovered(path.read_text(), target)
    assert not problems, "\n".join(problems)


LEFTOVERS = '''\
import torch
import torch.distributed as dist
from torch.cuda import nvtx

dist.init_process_group(backend="nccl")
nvtx.range_push("step")
print(torch.version.cuda)
model = (Net()
         .cuda())
'''


@pytest.mark.parametrize("target", list(TARGETS))
def test_the_check_fails_when_xla900_is_ignored(target):
    assert uncovered(LEFTOVERS, target) == []
    # The distributed rules (XLA4xx) would remove the init_process_group("nccl") call: ignored here too.
    problems = uncovered(LEFTOVERS, target, ignore=["XLA900", "XLA4"])
    # XLA103 reports the nvtx call and XLA101 rewrites the .cuda(); the import of nvtx, "nccl" and
    # torch.version.cuda are left silently without XLA900.
    assert [p.split(" has no finding")[0] for p in problems] == [
        "output line 3: 'cuda' (input lines [3])",
        "output line 7: 'nccl' (input lines [5])",
        "output line 9: 'cuda' (input lines [7])",
    ], problems


def test_scanner_and_line_mapping():
    source = 'import torch\nx = 1\nm = torch.cuda.foo()\n'
    output = 'import torch\nimport torch_xla\nx = 1\nm = torch.cuda.foo()\n'
    assert [c.line for c in cuda_constructs(output)] == [4]
    assert input_lines_for(source, output) == {1: [1], 2: [], 3: [2], 4: [3]}
    assert cuda_constructs('d = "cuda:0"\ne = f"cuda:{r}"\nf = "the cuda kernels"\ng = "nccl"\n') == [
        Construct(1, "cuda:0"), Construct(2, "cuda"), Construct(4, "nccl")]
