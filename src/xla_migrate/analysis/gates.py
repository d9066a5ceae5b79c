"""CUDA gates: what a test whose CUDA parts are known evaluates to, and which code it then runs.

XLA104 decides each CUDA test (``torch.cuda.is_available()``, ``device.type == "cuda"``, a flag bound to one)
by the code its value turns on. ``evaluate(test, values)`` partially evaluates a test once its gates have
values (``not torch.cuda.is_available() or torch.cuda.is_bf16_supported()`` with the gate True leaves
``torch.cuda.is_bf16_supported()`` to run); ``executed(gate, ...)`` gives the code that then runs: that
residue and the branches the test can select (of an ``if``, a conditional expression or a ``while``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import libcst as cst

from ..syntax import patterns
from .facts import is_cuda_device_expr

Parent = Callable[[cst.CSTNode], cst.CSTNode | None]


def test_top(node: cst.BaseExpression, parent: Parent) -> cst.BaseExpression:
    """The whole boolean expression ``node`` is part of (through ``not``, ``and``, ``or``)."""
    current = node
    while True:
        above = parent(current)
        if isinstance(above, cst.UnaryOperation) and isinstance(above.operator, cst.Not):
            current = above
        elif isinstance(above, cst.BooleanOperation):
            current = above
        else:
            return current


def evaluate(test: cst.BaseExpression, values: Mapping[cst.CSTNode, bool]
             ) -> tuple[bool | None, list[cst.BaseExpression]]:
    """The value of ``test`` when the nodes of ``values`` have those values (None: it depends on the rest),
    and the other operands that are still evaluated on the way (Python's short circuit)."""
    if test in values:
        return values[test], []
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        known, residue = evaluate(test.expression, values)
        return (None if known is None else not known), residue
    if isinstance(test, cst.BooleanOperation):
        is_and = isinstance(test.operator, cst.And)
        left, left_residue = evaluate(test.left, values)
        if left is not None and left != is_and:  # `False and x`, `True or x`: x never runs
            return left, left_residue
        right, right_residue = evaluate(test.right, values)
        residue = left_residue + right_residue
        if left is not None:  # `True and x` is x
            return right, residue
        if right is not None and right != is_and:  # `x and False` is False, `x or True` is True
            return right, residue
        return None, residue
    return None, [test]


def branches(test: cst.BaseExpression, parent: Parent) -> tuple[list[cst.CSTNode], list[cst.CSTNode]]:
    """The code ``test`` selects: (what runs when it is true, what runs when it is false). Empty for a test
    that selects no code (a value assigned, returned or passed)."""
    owner = parent(test)
    if isinstance(owner, (cst.If, cst.IfExp)) and owner.test is test:
        orelse = owner.orelse
        if isinstance(owner, cst.If):
            orelse = orelse.body if isinstance(orelse, cst.Else) else orelse
        if isinstance(owner, cst.If) and fall_through(owner, parent):
            return [owner.body], fall_through(owner, parent)
        return [owner.body], ([orelse] if orelse is not None else [])
    if isinstance(owner, cst.While) and owner.test is test:
        return [owner.body], ([owner.orelse] if owner.orelse is not None else [])
    return [], []


def _silent_return(suite: cst.BaseSuite) -> bool:
    """The branch is only ``return`` (or ``return <value>``): an early exit that skips an optional path."""
    statements = suite.body if isinstance(suite, cst.IndentedBlock) else [suite]
    if len(statements) != 1 or not isinstance(statements[0], (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
        return False
    smalls = statements[0].body
    return len(smalls) == 1 and isinstance(smalls[0], cst.Return)


def fall_through(statement: cst.If, parent: Parent) -> list[cst.CSTNode]:
    """The statements after ``statement`` in its function's block: what runs when its early return is not
    taken (``if not torch.cuda.is_available() or not use_flash: return`` guards the CUDA query below it)."""
    if statement.orelse is not None or not _silent_return(statement.body):
        return []
    block = parent(statement)
    if not isinstance(block, cst.IndentedBlock) or not isinstance(parent(block), cst.FunctionDef):
        return []
    body = list(block.body)
    return body[body.index(statement) + 1:] if statement in body else []


def executed(test: cst.BaseExpression, values: Mapping[cst.CSTNode, bool], parent: Parent
             ) -> tuple[bool | None, list[cst.CSTNode]]:
    """The value ``test`` gets and the code that then runs: its residue and the branches it can select."""
    known, residue = evaluate(test, values)
    when_true, when_false = branches(test, parent)
    code: list[cst.CSTNode] = list(residue)
    if known is not False:
        code += when_true
    if known is not True:
        code += when_false
    return known, code


# What a branch binds and who reads it (a CUDA path kept without its CUDA-only statements; tests of one
# condition that must agree) ------------------------------------------------------------------------------------
def inside(parent: Parent, node: cst.CSTNode, outer: cst.CSTNode) -> bool:
    current: cst.CSTNode | None = node
    while current is not None:
        if current is outer:
            return True
        current = parent(current)
    return False


def chooses_cuda_device(statement: cst.BaseStatement, qualnames) -> bool:
    """``device = torch.device("cuda")``, ``name = "cuda:0"``: the statement assigns a CUDA device."""
    if not isinstance(statement, cst.SimpleStatementLine):
        return False
    return any(isinstance(small, (cst.Assign, cst.AnnAssign)) and small.value is not None
               and is_cuda_device_expr(small.value, qualnames) for small in statement.body)


def with_readers(statement: cst.BaseStatement, suite: cst.IndentedBlock, ctx) -> set[cst.BaseStatement] | None:
    """``statement`` and the statements of ``suite`` that read what it binds (``props = ...`` then
    ``print(props)``), transitively; None when a name it binds is read outside the suite."""
    group: set[cst.BaseStatement] = set()
    pending = [statement]
    while pending:
        current = pending.pop()
        if current in group:
            continue
        group.add(current)
        for access in _reads_outside(current, ctx):
            reader = next((s for s in suite.body if inside(ctx.parent, access, s)), None)
            if reader is None:
                return None
            pending.append(reader)
    return group


def _reads_outside(statement: cst.BaseStatement, ctx) -> list[cst.CSTNode]:
    """Where the names ``statement`` binds (``props = ...``, a loop variable) are read outside it. An
    augmented assignment (``banner += ...``) updates a name bound before: it may go without a trace."""
    within = set(patterns.find_all(statement, lambda n: True))
    scope = ctx.scopes.get(statement)
    if scope is None:
        return [ctx.module]  # unknown: never inside a branch
    reads = []
    for assignment in scope.assignments:
        target = getattr(assignment, "node", None)
        if target not in within or isinstance(ctx.parent(target), cst.AugAssign):
            continue
        reads += [access.node for access in assignment.references if access.node not in within]
    return reads


def shares_names(first: cst.BaseExpression, second: cst.BaseExpression, parent: Parent) -> bool:
    """A name bound in a branch of one test is read in a branch of the other (``log_msg``)."""
    def branch_names(test: cst.BaseExpression, stored: bool) -> set[str]:
        found = set()
        for branch in [b for side in branches(test, parent) for b in side]:
            for node in patterns.find_all(branch, lambda n: isinstance(n, (cst.Assign, cst.Name))):
                if stored and isinstance(node, cst.Assign):
                    found |= {t.target.value for t in node.targets if isinstance(t.target, cst.Name)}
                elif not stored and isinstance(node, cst.Name):
                    found.add(node.value)
        return found

    return bool(branch_names(first, True) & branch_names(second, False)
                or branch_names(second, True) & branch_names(first, False))
