"""Imports: the ones the output needs are added once; the ones the rewrite made dead are removed once.

New imports go right after the script's last top-level import of its leading import block (after the
docstring and ``from __future__`` imports when it has none), in the ``import a.b as c`` form the seeds use,
sorted, one per line, without touching the blank lines around them.
"""

from __future__ import annotations

import functools

import libcst as cst
from libcst.helpers import get_full_name_for_node

from ..syntax import walk
from ..syntax.patterns import is_docstring, is_import_line, is_ipython_placeholder, merge_carried_lines


def insertion_index(body: list[cst.BaseStatement]) -> int:
    index = 0
    if body and is_docstring(body[0]):
        index = 1
    while index < len(body) and is_ipython_placeholder(body[index]):
        index += 1  # a notebook's leading `%pip install ...` / `!nvidia-smi` lines stay first
    last_import = None
    for position in range(index, len(body)):
        statement = body[position]
        if is_import_line(statement):
            last_import = position
        elif last_import is not None or not is_docstring(statement):
            break
    return index if last_import is None else last_import + 1


@functools.lru_cache(maxsize=256)  # parsed once per import: nodes never change (see patterns.parsed_expression)
def _import_line(module: str, alias: str | None) -> cst.SimpleStatementLine:
    code = f"import {module}" + (f" as {alias}" if alias else "")
    return cst.parse_statement(code)  # type: ignore[return-value]


def add_imports(module: cst.Module, imports: set[tuple[str, str | None]],
                late: dict[tuple[str, str | None], cst.BaseStatement] | None = None) -> cst.Module:
    """``late``: imports the script makes itself further down (the top-level statement that binds each,
    a ``try`` say). Such an import is added only when something may read the name before that statement
    runs: a module-level read of it above the statement, or anything above it other than imports,
    definitions and assignments without calls (a call could reach a function that reads it)."""
    imports = {item for item in imports if not (late and item in late and _bound_in_time(module, item, late[item]))}
    if not imports:
        return module
    imports = _without_rebinding(module, imports)
    body = list(module.body)
    index = insertion_index(body)
    new_lines = [_import_line(name, alias) for name, alias in sorted(imports, key=lambda i: (i[0], i[1] or ""))]
    body[index:index] = new_lines
    return module.with_changes(body=body)


def _without_rebinding(module: cst.Module, imports: set[tuple[str, str | None]]) -> set[tuple[str, str | None]]:
    """``import a.b.c`` binds ``a``: where the script binds ``a`` itself (``torch_xla = ...``, ``from lib
    import torch_xla``), the import goes under an alias of its own instead (``import
    torch_xla.distributed.xla_backend as xla_backend``), so it never rebinds the script's name. (Imports
    of a module under its own name come from ``MigrationContext.local_name``, which checks the name.)"""
    dotted = [item for item in imports if item[1] is None and "." in item[0]]
    if not dotted:
        return imports
    names = _Bindings()
    walk.walk(module, names)
    kept = set(imports)
    taken = names.seen | {alias or name.split(".")[0] for name, alias in imports}
    for name, alias in dotted:
        root = name.split(".")[0]
        if root not in names.bound and not names.star_import:
            continue
        last = name.rsplit(".", 1)[1]
        fresh = next(candidate for candidate in (last, *(f"{last}_{n}" for n in range(2, 10_000)))
                     if candidate not in taken and candidate not in _BUILTINS)
        taken.add(fresh)
        kept.discard((name, alias))
        kept.add((name, fresh))
    return kept


_BUILTINS = frozenset(dir(__import__("builtins")))


class _Bindings(cst.CSTVisitor):
    """Every name the script binds other than by importing the module of that name (``import a``, ``import
    a.b``), in any scope (erring on the side of an alias), and every name it mentions."""

    def __init__(self) -> None:
        super().__init__()
        self.bound: set[str] = set()
        self.seen: set[str] = set()
        self.star_import = False

    def _targets(self, node: cst.CSTNode | None) -> None:
        if isinstance(node, cst.Name):
            self.bound.add(node.value)
        elif isinstance(node, (cst.Tuple, cst.List)):
            for element in node.elements:
                self._targets(element.value)
        elif isinstance(node, cst.StarredElement):
            self._targets(node.value)

    def visit_Name(self, node: cst.Name) -> None:
        self.seen.add(node.value)

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self._targets(node.target)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._targets(node.target)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._targets(node.target)

    def visit_For(self, node: cst.For) -> None:
        self._targets(node.target)

    def visit_CompFor(self, node: cst.CompFor) -> None:
        self._targets(node.target)

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self._targets(node.target)

    def visit_AsName(self, node: cst.AsName) -> None:  # with ... as x, except E as x, import m as x
        self._targets(node.name)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.bound.add(node.name.value)

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.bound.add(node.name.value)

    def visit_MatchAs(self, node: cst.MatchAs) -> None:
        self._targets(node.name)

    def visit_MatchStar(self, node: cst.MatchStar) -> None:
        self._targets(node.name)

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if isinstance(node.names, cst.ImportStar):
            self.star_import = True
            return
        for alias in node.names:
            if alias.asname is None:
                self.bound.add(alias.evaluated_name)


def _bound_in_time(module: cst.Module, item: tuple[str, str | None], binding: cst.BaseStatement) -> bool:
    body = list(module.body)
    if not any(statement is binding for statement in body):
        return False  # the statement was rewritten: keep the import rather than guess
    name = item[1] or item[0]
    for statement in body[:[id(s) for s in body].index(id(binding))]:
        if not (is_import_line(statement) or is_docstring(statement)
                or isinstance(statement, (cst.FunctionDef, cst.ClassDef))
                or (isinstance(statement, cst.SimpleStatementLine) and _has_no_call(statement))):
            return False
        reads = _ModuleLevelReads()
        walk.walk(statement, reads)
        if name in reads.names or reads.calls:
            return False
    return True


def _has_no_call(statement: cst.CSTNode) -> bool:
    reads = _ModuleLevelReads()
    walk.walk(statement, reads)
    return not reads.calls


class _ModuleLevelReads(cst.CSTVisitor):
    """Names read, and calls made, when a top-level statement runs: function and lambda bodies are not
    entered (their decorators and defaults are), class bodies are."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()
        self.calls = False

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        for part in (*node.decorators, node.params, node.returns):
            if part is not None:
                walk.walk(part, self)
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        walk.walk(node.params, self)
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        self.calls = self.calls or bool(node.decorators) or bool(node.bases) or bool(node.keywords)
        return True

    def visit_Call(self, node: cst.Call) -> None:
        self.calls = True

    def visit_Name(self, node: cst.Name) -> None:
        self.names.add(node.value)


def remove_dead_imports(module: cst.Module, candidates: set[tuple[str, str | None]]) -> cst.Module:
    """Remove each candidate top-level import that nothing in ``module`` reads any more.

    One plain walk collects the names and dotted chains the module reads outside import statements; an
    import binding a candidate is dead when its local name (or, for ``import a.b``, the chain ``a.b``) is
    never read. No scope analysis: a name read anywhere keeps its import, which errs on the side of keeping.
    A removed import line's comments and blank lines move to the next statement.
    """
    if not candidates:
        return module
    uses = _Uses()
    walk.walk(module, uses)  # read-only: no rebuilt copy of the tree
    body: list[cst.BaseStatement] = []
    carried: list[cst.EmptyLine] = []
    changed = False
    for statement in module.body:
        if is_import_line(statement):
            kept = [s for s in (_without_dead(small, candidates, uses) for small in statement.body) if s is not None]
            if kept != list(statement.body):
                changed = True
                if not kept:
                    carried.extend(statement.leading_lines)
                    continue
                kept[-1] = kept[-1].with_changes(semicolon=cst.MaybeSentinel.DEFAULT)
                statement = statement.with_changes(body=kept)
        if carried:
            statement = statement.with_changes(
                leading_lines=[*merge_carried_lines(carried, statement), *statement.leading_lines])
            carried = []
        body.append(statement)
    if not changed:
        return module
    return module.with_changes(body=body, footer=[*carried, *module.footer])


class _Uses(cst.CSTVisitor):
    """Names and dotted chains a module reads outside its import statements."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()
        self.chains: set[str] = set()

    def visit_Import(self, node: cst.Import) -> bool:
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        return False

    def visit_Name(self, node: cst.Name) -> None:
        self.names.add(node.value)

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        chain = get_full_name_for_node(node)
        if chain:
            self.chains.add(chain)
        walk.walk(node.value, self)  # `a.cuda` reads `a`, not a name `cuda`
        return False

    def reads_chain(self, dotted: str) -> bool:
        return any(chain == dotted or chain.startswith(dotted + ".") for chain in self.chains)


def _without_dead(small: cst.BaseSmallStatement, candidates, uses: _Uses) -> cst.BaseSmallStatement | None:
    """The import statement without its dead candidate aliases (None when none is left)."""
    if isinstance(small, cst.Import):
        names = [a for a in small.names if not _dead_import(a, candidates, uses)]
    elif (isinstance(small, cst.ImportFrom) and small.module is not None and not small.relative
            and not isinstance(small.names, cst.ImportStar)):
        base = get_full_name_for_node(small.module) or ""
        names = [a for a in small.names
                 if not ((base, a.evaluated_name) in candidates and (a.evaluated_alias or a.evaluated_name) not in uses.names)]
    else:
        return small
    if len(names) == len(small.names):
        return small
    if not names:
        return None
    names[-1] = names[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return small.with_changes(names=names)


def _dead_import(alias: cst.ImportAlias, candidates, uses: _Uses) -> bool:
    full = get_full_name_for_node(alias.name) or ""
    if (full, None) not in candidates:
        return False
    if alias.asname is not None:
        return alias.evaluated_alias not in uses.names
    return not uses.reads_chain(full) if "." in full else full not in uses.names
