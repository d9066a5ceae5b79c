"""What a step closure may take with it (issue 30, point 1; the expert review's classes 12 and 17).

``xm.add_step_closure(fn, args=...)`` only queues ``fn``: it runs at the step's barrier, after the rest of the
step. A logging statement moved there must behave as it did in place:

- not under a ``try`` of the step: the closure would run outside the handler (a tracker that fails once kills
  training where the original printed "logging failed" and went on). A ``try`` whose body only logs moves
  whole into the closure (XLA310 writes a function), handlers and all (``reads.logging_compound``);
- not under a ``with`` of the step: the resource (``with open(log, "a") as f:``) is closed when the closure
  runs (``ValueError: I/O operation on closed file``). A ``with`` whose body only logs moves whole;
- not right before leaving the loop (``sys.exit(1)``, ``raise``, ``return``, ``break`` after it in its
  block): a deferred line would be printed late or never; such a statement runs once, so it stays;
- host values in it (``optimizer.param_groups[0]["lr"]``, ``time.time() - start``, ``self.global_step``) are
  evaluated at the step, not when the closure runs: they become the closure's arguments (closure_args.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from ...syntax import patterns

if TYPE_CHECKING:
    from ...engine.context import MigrationContext
    from .kinds import Region

EXITS = ("sys.exit", "builtins.exit", "builtins.quit", "os._exit")


def step_code(region: Region) -> cst.CSTNode:
    """The code the step runs itself: the loop, or the function it calls."""
    return region.function if region.in_callee else region.step.loop  # type: ignore[return-value]


def guard(ctx: MigrationContext, statement: cst.CSTNode, region: Region) -> cst.With | cst.Try | None:
    """The innermost ``with`` or ``try`` (its body, not a handler) around ``statement`` inside the step's code."""
    top = step_code(region)
    child, current = statement, ctx.parent(statement)
    while current is not None and current is not top:
        if isinstance(current, cst.With) and child is current.body:
            return current
        if isinstance(current, cst.Try) and child is current.body:
            return current
        if isinstance(current, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
            return None
        child, current = current, ctx.parent(current)
    return None


def leaves_after(ctx: MigrationContext, statement: cst.CSTNode, region: Region) -> bool:
    """A later statement of a block holding ``statement`` (up to the step's code) leaves the loop:
    ``sys.exit``, ``raise``, ``return`` or ``break`` (not inside a nested loop or function)."""
    top = step_code(region)
    child, current = statement, ctx.parent(statement)
    while current is not None and current is not top:
        if isinstance(current, (cst.IndentedBlock, cst.SimpleStatementSuite, cst.SimpleStatementLine)):
            body = list(current.body)
            if child in body:
                for later in body[body.index(child) + 1:]:
                    if _leaves(ctx, later, region.in_callee):
                        return True
        if isinstance(current, (cst.FunctionDef, cst.Lambda, cst.For, cst.While)):
            return False
        child, current = current, ctx.parent(current)
    return False


def _leaves(ctx: MigrationContext, statement: cst.CSTNode, in_callee: bool) -> bool:
    """Leaves the step loop: in a function the step calls, ``return`` only ends the call."""
    if isinstance(statement, (cst.Break, cst.Return)):
        return not in_callee
    if isinstance(statement, cst.Raise):
        return True
    if isinstance(statement, cst.SimpleStatementLine):
        return any(_leaves(ctx, s, in_callee) for s in statement.body)
    if isinstance(statement, cst.Expr) and isinstance(statement.value, cst.Call):
        return bool(ctx.qualnames(statement.value.func) & set(EXITS))
    return False


def bound_inside(node: cst.CSTNode) -> set[str]:
    """Names the node binds itself: ``with ... as f``, ``except E as e``, assignments in it."""
    found: set[str] = set()
    for item in patterns.find_all(node, lambda n: isinstance(n, (cst.AsName, cst.AssignTarget))):
        target = item.name if isinstance(item, cst.AsName) else item.target  # type: ignore[attr-defined]
        if isinstance(target, cst.Name):
            found.add(target.value)
    return found
