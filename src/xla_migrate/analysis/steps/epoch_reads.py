"""One value read several times outside the steps (issue 30, point 1: "repeated reads of one value become one").

After an evaluation, a script often reads the same device value several times:

    val_loss = evaluate(model, val_loader)      # returns total / n: a tensor still to compute
    scheduler.step(val_loss)                    # ReduceLROnPlateau: float(val_loss)
    history.append(val_loss.item())
    print(f"val {val_loss:.4f}")
    if stopper(val_loss.item()): ...

torch_xla keeps no result for a read of a pending tensor (the read copies it out of a graph run for it): each
read runs that graph again (measured on 2.9: four reads, four executions). A step barrier before the first
read runs the pending work once; the reads then copy a value already computed.

A value qualifies when it is bound, outside any step loop, to what a function of this module with a step
loop returns and that return is computed from the loop's tensors (``return total / len(loader)``), or to an
expression of such values; and it is read at least twice, in the statements that follow in the same block
(``.item()``, ``float()``, ``int()``, formatting, ``print``, a comparison, ``scheduler.step(value)``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from ...syntax import patterns
from .kinds import Region
from .reads import mentions

if TYPE_CHECKING:
    from .model import StepModel

CONVERSIONS = ("builtins.float", "builtins.int", "builtins.bool")


@dataclass(frozen=True)
class RepeatedRead:
    """``name``, bound by ``binding``, read ``count`` times from ``first`` on (statements of one block)."""

    name: str
    binding: cst.CSTNode
    first: cst.CSTNode  # the statement before which the barrier goes
    lines: tuple[int, ...]


def repeated_reads(model: StepModel) -> list[RepeatedRead]:
    ctx = model.ctx
    returning = _tensor_returning_functions(model)
    if not returning:
        return []
    found: list[RepeatedRead] = []
    for block in patterns.find_all(ctx.module, lambda n: isinstance(n, (cst.IndentedBlock, cst.Module))):
        statements = list(block.body)  # type: ignore[attr-defined]
        for index, line in enumerate(statements):
            if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
                continue
            assign = line.body[0]
            if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1
                    and isinstance(assign.targets[0].target, cst.Name) and isinstance(assign.value, cst.Call)):
                continue
            if model.region(assign) is not None:
                continue  # inside a step: the step's own rules
            if model.callee(assign.value) not in returning:
                continue
            name = assign.targets[0].target.value
            reading: list[cst.CSTNode] = []
            for later in statements[index + 1:]:
                if _rebinds(later, name):
                    break
                if _reads(ctx, later, name):
                    reading.append(later)
            if len(reading) >= 2:
                lines = tuple(ctx.position(s)[0] for s in reading)
                found.append(RepeatedRead(name, line, reading[0], lines))
    return found


def _tensor_returning_functions(model: StepModel) -> set[cst.FunctionDef]:
    """Functions with a step loop whose ``return`` is computed from that loop's tensors."""
    found: set[cst.FunctionDef] = set()
    by_function: dict[cst.FunctionDef, set[str]] = {}
    for step in model.loops.values():
        if isinstance(step.function, cst.FunctionDef):
            by_function.setdefault(step.function, set()).update(model.base_tensor_names(Region(step)))
    for function, names in by_function.items():
        if not names:
            continue
        returns = patterns.find_all(function.body, lambda n: isinstance(n, cst.Return) and n.value is not None)
        if returns and all(mentions(r.value, names) for r in returns):  # type: ignore[attr-defined]
            found.add(function)
    return found


def _rebinds(statement: cst.CSTNode, name: str) -> bool:
    for target in patterns.find_all(statement, lambda n: isinstance(n, (cst.AssignTarget, cst.AugAssign))):
        bound = target.target  # type: ignore[attr-defined]
        if isinstance(bound, cst.Name) and bound.value == name:
            return True
    return False


def _reads(ctx, statement: cst.CSTNode, name: str) -> bool:
    """The statement reads ``name``'s value to the host (see the module docstring)."""
    for node in patterns.find_all(statement, lambda n: isinstance(n, cst.Name) and n.value == name):
        child, current = node, ctx.parent(node)
        while current is not None and current is not statement:
            if isinstance(current, cst.Attribute) and current.value is child:
                if current.attr.value in ("item", "tolist", "numpy", "cpu"):
                    return True
                break
            if isinstance(current, (cst.FormattedStringExpression, cst.Comparison)):
                return True
            if isinstance(current, (cst.If, cst.While)) and child is current.test:
                return True
            if isinstance(current, cst.Call):
                names = ctx.qualnames(current.func)
                if names & set(CONVERSIONS) or "builtins.print" in names:
                    return True
                method = patterns.method_call(current, "step")
                if method is not None and "sched" in (patterns.dotted_name(method.value) or "").lower():
                    return True  # ReduceLROnPlateau.step(metric): float(metric)
                break
            if isinstance(current, cst.Arg):
                child, current = current, ctx.parent(current)
                continue
            if isinstance(current, (cst.BaseSmallStatement, cst.BaseCompoundStatement)):
                break
            child, current = current, ctx.parent(current)
    return False
