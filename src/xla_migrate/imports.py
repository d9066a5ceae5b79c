"""Imports: the ones the output needs are added once; the ones the rewrite made dead are removed once.

New imports go right after the script's last top-level import of its leading import block (after the
docstring and ``from __future__`` imports when it has none), in the ``import a.b as c`` form the seeds use,
sorted, one per line, without touching the blank lines around them.
"""

from __future__ import annotations

import libcst as cst
from libcst.helpers import get_full_name_for_node
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import RemoveImportsVisitor

from .patterns import is_docstring, is_import_line


def _insertion_index(body: list[cst.BaseStatement]) -> int:
    index = 0
    if body and is_docstring(body[0]):
        index = 1
    last_import = None
    for position in range(index, len(body)):
        statement = body[position]
        if is_import_line(statement):
            last_import = position
        elif last_import is not None or not is_docstring(statement):
            break
    return index if last_import is None else last_import + 1


def _import_line(module: str, alias: str | None) -> cst.SimpleStatementLine:
    code = f"import {module}" + (f" as {alias}" if alias else "")
    return cst.parse_statement(code)  # type: ignore[return-value]


def add_imports(module: cst.Module, imports: set[tuple[str, str | None]]) -> cst.Module:
    if not imports:
        return module
    body = list(module.body)
    index = _insertion_index(body)
    new_lines = [_import_line(name, alias) for name, alias in sorted(imports, key=lambda i: (i[0], i[1] or ""))]
    body[index:index] = new_lines
    return module.with_changes(body=body)


def remove_dead_imports(module: cst.Module, candidates: set[tuple[str, str | None]]) -> cst.Module:
    """Remove each candidate import that nothing in ``module`` uses any more (one scope analysis)."""
    if not candidates:
        return module
    context = CodemodContext()
    aliases = _aliases(module)
    for name, obj in sorted(candidates, key=lambda c: (c[0], c[1] or "")):
        # RemoveImportsVisitor only removes an aliased import (``import a.b as c``, ``from a import b as c``)
        # when told its alias.
        for asname in sorted(aliases.get((name, obj)) or {None}, key=lambda a: a or ""):
            RemoveImportsVisitor.remove_unused_import(context, name, obj, asname)
    return RemoveImportsVisitor(context).transform_module(module)


def _aliases(module: cst.Module) -> dict[tuple[str, str | None], set[str | None]]:
    """(module, name or None) -> the aliases (None: none) the module's top-level imports bind it under."""
    found: dict[tuple[str, str | None], set[str | None]] = {}
    for statement in module.body:
        if not is_import_line(statement):
            continue
        for small in statement.body:
            if isinstance(small, cst.Import):
                for alias in small.names:
                    found.setdefault((get_full_name_for_node(alias.name) or "", None), set()).add(alias.evaluated_alias)
            elif isinstance(small, cst.ImportFrom) and small.module is not None and not small.relative \
                    and not isinstance(small.names, cst.ImportStar):
                base = get_full_name_for_node(small.module) or ""
                for alias in small.names:
                    found.setdefault((base, alias.evaluated_name), set()).add(alias.evaluated_alias)
    return found
