"""Mutated realistic scripts for the property tests: pieces of ``fixtures/realistic/`` scripts changed the way
real scripts differ from the ones the rules were written against.

A case is a window of a realistic script (its leading imports and one or two of its other top-level
statements, so a case costs a fraction of a whole script) with up to three mutations, in any order:

* delete a line (skipped where the result would not compile);
* rename one name the piece binds (a variable, function, parameter or import alias) to a name the tool
  itself uses (``xm``, ``pl``, ``xr``, ``torch_xla``, ``device``...), everywhere it is read or bound;
* wrap the piece, imports included or not, in a function, a class or ``if True:``;
* insert a CUDA idiom (a top-level statement of a golden input) somewhere among the statements.

``python tests/mutated_scripts.py N`` runs N cases outside pytest and prints every failure grouped by kind
(``exception``, ``error``, ``not compiling``, ``gate``, ``not idempotent``, ``withdrawn``), each with the
smallest input of its kind, for finding defect classes.
"""

from __future__ import annotations

import random
import re
import sys
import tokenize
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import libcst as cst

from xla_migrate.syntax.layout import split_lines

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
# Names xla-migrate's own output uses: the module aliases of the target table and its device variables.
COLLIDING = ("xm", "pl", "xr", "xmp", "torch_xla", "device", "xla_device", "xla_model", "parallel_loader",
             "xla_amp", "syncfree", "runtime", "xm_2", "torch_xla_2", "contextlib", "torch")
MUTATIONS = ("delete", "rename", "wrap", "insert")
WRAPPERS = ("def", "class", "if")


@dataclass(frozen=True)
class Piece:
    """A realistic script cut into its leading lines (docstring, imports) and its other top-level statements."""

    name: str
    head: str
    units: tuple[str, ...]
    indent: str


@cache
def pieces() -> tuple[Piece, ...]:
    found = []
    for path in sorted((FIXTURES / "realistic").glob("*.py")):
        with tokenize.open(path) as handle:  # a str, decoded as its cookie says (one script is cp1252)
            text = handle.read()
        module = cst.parse_module(text)
        head, units = _header_text(module), []
        for statement in module.body:
            if not units and _is_leading(statement):
                head += module.code_for_node(statement)
            else:
                units.append(module.code_for_node(statement))
        if units:
            found.append(Piece(path.stem, head, tuple(units), module.default_indent))
    return tuple(found)


def _header_text(module: cst.Module) -> str:
    """The comments and blank lines before the first statement (a coding cookie, a shebang)."""
    return cst.Module(body=[], header=module.header, default_newline=module.default_newline).code


def _is_leading(statement: cst.CSTNode) -> bool:
    if isinstance(statement, cst.SimpleStatementLine):
        return all(isinstance(s, (cst.Import, cst.ImportFrom)) for s in statement.body) or (
            len(statement.body) == 1 and isinstance(statement.body[0], cst.Expr)
            and isinstance(statement.body[0].value, cst.SimpleString))
    return False


@cache
def idioms() -> tuple[str, ...]:
    """Top-level statements of every golden input: the CUDA idioms the rules know."""
    found: set[str] = set()
    for path in sorted(FIXTURES.glob("XLA*/*.in.py")) + sorted(FIXTURES.glob("scripts/*.in.py")):
        module = cst.parse_module(path.read_bytes())
        for statement in module.body:
            if not _is_leading(statement):
                found.add(module.code_for_node(statement).strip("\n") + "\n")
    return tuple(sorted(found))


# Mutations --------------------------------------------------------------------------------------------------
def compiles(source: str) -> bool:
    try:
        compile(source, "<mutated>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


def delete_line(source: str, pick: random.Random) -> str:
    lines = split_lines(source)
    candidates = list(range(len(lines)))
    pick.shuffle(candidates)
    for index in candidates[:8]:
        if lines[index].strip():
            mutated = "".join(lines[:index] + lines[index + 1:])
            if compiles(mutated):
                return mutated
    return source


class _BoundNames(cst.CSTVisitor):
    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.names.add(node.name.value)

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.names.add(node.name.value)

    def visit_Param(self, node: cst.Param) -> None:
        self.names.add(node.name.value)

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self._targets(node.target)

    def visit_For(self, node: cst.For) -> None:
        self._targets(node.target)

    def visit_AsName(self, node: cst.AsName) -> None:
        self._targets(node.name)

    def _targets(self, node: cst.CSTNode) -> None:
        if isinstance(node, cst.Name):
            self.names.add(node.value)
        elif isinstance(node, (cst.Tuple, cst.List)):
            for element in node.elements:
                self._targets(element.value)


class _Rename(cst.CSTTransformer):
    """Every Name that is ``old`` becomes ``new``, except attribute names and keyword argument names."""

    def __init__(self, old: str, new: str) -> None:
        super().__init__()
        self.old, self.new = old, new
        self._skip: set[int] = set()

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._skip.add(id(node.attr))

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is not None:
            self._skip.add(id(node.keyword))

    def visit_ImportAlias(self, node: cst.ImportAlias) -> bool:
        if node.asname is not None:  # the alias is renamed, the module's own name is not
            node.asname.visit(self)
        return False

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.Name:
        if updated.value == self.old and id(original) not in self._skip:
            return updated.with_changes(value=self.new)
        return updated

    def leave_ImportAlias(self, original: cst.ImportAlias, updated: cst.ImportAlias) -> cst.ImportAlias:
        if original.asname is not None and isinstance(original.asname.name, cst.Name) \
                and original.asname.name.value == self.old:
            return updated.with_changes(asname=updated.asname.with_changes(name=cst.Name(self.new)))
        return updated


def rename(source: str, pick: random.Random) -> str:
    module = cst.parse_module(source)
    bound = _BoundNames()
    module.visit(bound)
    names = sorted(n for n in bound.names if n not in COLLIDING and not n.startswith("__"))
    if not names:
        return source
    old, new = pick.choice(names), pick.choice(COLLIDING)
    mutated = module.visit(_Rename(old, new)).code
    return mutated if compiles(mutated) else source


def wrap(source: str, pick: random.Random, indent: str) -> str:
    """The statements (after the leading ones, or all of them) indented under a def, class or if."""
    lines = split_lines(source)
    future = [i for i, line in enumerate(lines) if line.startswith("from __future__")]
    start = (future[-1] + 1) if future else 0
    if pick.random() < 0.5:
        module = cst.parse_module(source)
        leading = 0
        for statement in module.body:
            if not _is_leading(statement):
                break
            leading += 1
        start = max(start, len(split_lines(module.with_changes(body=module.body[:leading]).code)))
    opener = {"def": "def _wrapped():\n", "class": "class _Wrapped:\n", "if": "if True:\n"}[pick.choice(WRAPPERS)]
    body = [indent + line if line.strip() else line for line in lines[start:]]
    if not any(line.strip() for line in body):
        return source
    mutated = "".join(lines[:start]) + opener + "".join(body)
    if not mutated.endswith("\n"):
        mutated += "\n"
    return mutated if compiles(mutated) else source


def insert_idiom(source: str, pick: random.Random) -> str:
    module = cst.parse_module(source)
    idiom = cst.parse_module(pick.choice(idioms())).body
    at = pick.randint(0, len(module.body))
    mutated = module.with_changes(body=[*module.body[:at], *idiom, *module.body[at:]]).code
    return mutated if compiles(mutated) else source


@dataclass(frozen=True)
class Case:
    piece: str
    source: str
    mutations: tuple[str, ...]


def make_case(seed: int) -> Case:
    """A case from a seed: deterministic, so hypothesis can shrink the seed and a failure reproduces."""
    pick = random.Random(seed)
    piece = pick.choice(pieces())
    start = pick.randrange(len(piece.units))
    source = piece.head + "".join(piece.units[start:start + pick.randint(1, 2)])
    done = []
    for mutation in pick.sample(MUTATIONS, pick.randint(1, 3)):
        before = source
        if mutation == "delete":
            source = delete_line(source, pick)
        elif mutation == "rename":
            source = rename(source, pick)
        elif mutation == "wrap":
            source = wrap(source, pick, piece.indent)
        else:
            source = insert_idiom(source, pick)
        if source != before:
            done.append(mutation)
    return Case(piece.name, source, tuple(done))


# Checking one ------------------------------------------------------------------------------------------------
def problems(source: str, target: str) -> list[tuple[str, str]]:
    """(kind, detail) of everything wrong with migrating ``source``: [] for a clean migration."""
    from xla_migrate.engine import gate
    from xla_migrate import migrate

    try:
        result = migrate(source, target=target)
    except Exception as error:  # noqa: BLE001 - migrate must never raise
        return [("exception", f"{type(error).__name__}: {error}")]
    if result.error is not None:
        return [("error", result.error.message)]
    found = []
    if not compiles(result.code):
        found.append(("not compiling", result.code))
        return found
    problem = gate.OutputGate(source).problem(result.code)
    if problem is not None:
        found.append(("gate", problem))
    for finding in result.findings:
        if finding.code == gate.CODE:
            found.append(("withdrawn", re.sub(r"line \d+", "line N", finding.message)))
    if result.changed:
        again = migrate(result.output_bytes, target=target)
        if again.error is not None or again.code != result.code:
            found.append(("not idempotent", again.diff or str(again.error)))
    return found


def main(count: int, first_seed: int = 0) -> None:
    from xla_migrate.engine.targets import TARGETS

    kinds: dict[tuple[str, str], list[tuple[int, str, Case]]] = {}
    for seed in range(first_seed, first_seed + count):
        case = make_case(seed)
        target = sorted(TARGETS)[seed % len(TARGETS)]
        for kind, detail in problems(case.source, target):
            key = (kind, detail.splitlines()[0][:120] if kind in ("withdrawn", "error", "exception", "gate") else "")
            kinds.setdefault(key, []).append((seed, target, case))
    for (kind, detail), cases in sorted(kinds.items(), key=lambda item: -len(item[1])):
        seed, target, case = min(cases, key=lambda c: len(c[2].source))
        print(f"=== {kind}: {detail} ({len(cases)} cases; smallest: seed {seed}, target {target}, "
              f"{case.piece}, {'+'.join(case.mutations) or 'no mutation'})")
        print(case.source)
    print(f"{count} cases, {sum(len(c) for c in kinds.values())} problems")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 500, int(sys.argv[2]) if len(sys.argv) > 2 else 0)
