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
        return [owner.body], ([orelse] if orelse is not None else [])
    if isinstance(owner, cst.While) and owner.test is test:
        return [owner.body], ([owner.orelse] if owner.orelse is not None else [])
    return [], []


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
