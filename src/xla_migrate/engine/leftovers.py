"""Dead leftovers of the rules' removals: a function whose whole body was removed goes with its calls.

``def cleanup(): dist.destroy_process_group()`` or a ``ddp_setup(rank, world_size)`` that only set up the
process group and the CUDA device is left doing nothing (``pass``) once XLA404 and XLA102 remove those
calls. When everything in the file that names the function calls it as a statement of its own
(``ddp_setup(rank, world_size)``), the ``def`` and those calls are removed too, each with a change record
under the code of the rule whose removal emptied it. A function used any other way stays as it is, with a
finding (a special method, ``__init__``, stays without one): passed or stored as a value
(``atexit.register(cleanup)``), its result used, listed in
``__all__``, a method, decorated, defined twice, a module-level function of a file another project module
imports (in a tree or ``--project`` run, from the project index), or one with no call in a file with no
``__main__`` block (another module may import it).

Not a rule: the applier finds the emptied functions (``Applied.emptied_functions``) and the engine asks this
module for the edits, then applies again (a removed call may empty another function). The removals are
derived edits (``Edits.requires``): the output gate keeps them only together with the removals that
emptied the function, so a withdrawn removal never leaves a function removed that still does something.
"""

from __future__ import annotations

import libcst as cst
from libcst.metadata.scope_provider import ClassScope, GlobalScope

from ..syntax import patterns
from .context import MigrationContext
from .records import Change


def remove_emptied_functions(ctx: MigrationContext, functions: list[cst.FunctionDef],
                             seen: set[cst.FunctionDef]) -> bool:
    """Record the removal of each function in ``functions`` not yet in ``seen`` and of its calls, or a
    finding where it must stay. True when any removal was recorded (apply again)."""
    recorded = False
    for function in functions:
        if function in seen:
            continue
        seen.add(function)
        sources = _removals_inside(ctx, function)
        if not sources:
            continue
        code = sources[0].code
        name = function.name.value
        calls, why_kept = _statement_calls(ctx, function)
        if why_kept is not None and isinstance(ctx.scopes.get(function), ClassScope) and name.startswith("__"):
            continue  # an emptied __init__ or other hook the language calls: harmless, and nothing to say
        if why_kept is not None:
            ctx.record_finding(code, function, f"def {name}(): its body is only `pass` after the migration, "
                               f"but it is kept: {why_kept}", f"remove {name} and its uses by hand if nothing "
                               "else needs it")
            continue
        for call in calls:
            _remove(ctx, call, f"removed {patterns.code_of(call.value).strip()}: {name}() does nothing on XLA "
                    "(its body was removed)", code, sources)
        _remove(ctx, function, f"removed def {name}(): the migration removed everything it did", code, sources)
        recorded = True
    return recorded


def _remove(ctx: MigrationContext, node: cst.CSTNode, message: str, code: str, sources: list[Change]) -> None:
    if node in ctx.edits.remove:
        return
    change = ctx.record_change(code, node, message)
    ctx.edits.remove[node] = change
    ctx.edits.requires[id(change)] = sources


def _removals_inside(ctx: MigrationContext, function: cst.FunctionDef) -> list[Change]:
    """The removal changes of statements inside ``function``, in source order."""
    found = []
    for node, change in ctx.edits.remove.items():
        current = ctx.parent(node)
        while current is not None and current is not function:
            current = ctx.parent(current)
        if current is function:
            found.append(change)
    return sorted(found, key=lambda c: (c.line, c.column))


def _statement_calls(ctx: MigrationContext, function: cst.FunctionDef) -> tuple[list[cst.Expr], str | None]:
    """The ``name(...)`` statements that call ``function``, or why the function must stay."""
    name = function.name.value
    scope = ctx.scopes.get(function)
    if isinstance(scope, ClassScope):
        return [], "it is a method (its class's interface)"
    if function.decorators:
        return [], "it is decorated (the decorator may register it)"
    if scope is None:
        return [], "its scope is unknown"
    assignments = list(scope.assignments[name])
    if len(assignments) != 1 or assignments[0].node is not function:
        return [], f"{name} is bound more than once"
    if isinstance(scope, GlobalScope) and _exported(ctx, scope, name):
        return [], "it is exported in __all__"
    importers = ctx.project.index.importers(ctx.project.rel) if (
        isinstance(scope, GlobalScope) and ctx.project is not None) else []
    if importers:
        return [], f"{', '.join(importers)} imports this module (and may call it)"
    if _inserted_code_names(ctx, function, name):
        return [], "the migration adds code next to it that uses it"
    calls: list[cst.Expr] = []
    for access in assignments[0].references:
        reference = access.node
        call = ctx.parent(reference)
        statement = ctx.parent(call) if isinstance(call, cst.Call) else None
        if not (isinstance(call, cst.Call) and call.func is reference and isinstance(statement, cst.Expr)
                and statement.value is call):
            return [], f"it is used as a value, not only called (line {ctx.position(reference)[0]})"
        if not all(patterns.is_pure(arg.value) for arg in call.args):
            return [], f"a call's arguments may have side effects (line {ctx.position(call)[0]})"
        if any(node in ctx.edits.replace for node in (call, statement, ctx.parent(statement))):
            return [], f"another rule rewrites a call of it (line {ctx.position(call)[0]})"
        calls.append(statement)
    if not calls and isinstance(scope, GlobalScope) and ctx.facts.main_guard is None:
        return [], "nothing in this file calls it, and another module may import it"
    return calls, None


def _inserted_code_names(ctx: MigrationContext, function: cst.FunctionDef, name: str) -> bool:
    """Code the migration inserts beside ``function`` names it (``_mp_fn`` calling ``main``); code that is only
    anchored there (a module-level setting placed before the first definition) does not keep it."""
    for table in (ctx.edits.before, ctx.edits.after):
        for _, statements in table.get(function, ()):
            if any(n.value == name for statement in statements
                   for n in patterns.find_all(statement, lambda n: isinstance(n, cst.Name))):
                return True
    return False


def _exported(ctx: MigrationContext, scope: GlobalScope, name: str) -> bool:
    """``name`` is listed in a module-level ``__all__`` (or ``__all__`` is built in a way not read here)."""
    for assignment in scope.assignments["__all__"]:
        statement = assignment.node if isinstance(assignment.node, cst.CSTNode) else None
        while statement is not None and not isinstance(statement, (cst.Assign, cst.AugAssign, cst.AnnAssign)):
            statement = ctx.parent(statement)
        value = statement.value if statement is not None else None
        if value is None or any(patterns.string_value(s) == name for s in patterns.find_all(
                value, lambda n: isinstance(n, cst.SimpleString))):
            return True
    return False
