"""The values a name can hold where it is read: the bindings of it that reach the read, through libcst's scopes.

``bound_values(ctx, name)`` gives, for a ``Name`` read, the value of each assignment that may bind it there
(``loc = f"cuda:{gpu}"`` for ``map_location=loc``), and None for a parameter (its value comes from a caller).
"""

from __future__ import annotations

import libcst as cst


def bound_values(ctx, name: cst.Name) -> list[cst.BaseExpression | None]:
    scope = ctx.scopes.get(name)
    if scope is None:
        return []
    values: list[cst.BaseExpression | None] = []
    for access in scope.accesses[name.value]:
        if access.node is not name:
            continue
        for assignment in access.referents:
            binding = getattr(assignment, "node", None)
            parent = ctx.parent(binding) if binding is not None else None
            if isinstance(binding, cst.Param) or isinstance(parent, cst.Param):
                values.append(None)
            elif isinstance(parent, cst.AssignTarget):
                values.append(ctx.parent(parent).value)
            elif isinstance(parent, cst.AnnAssign) and parent.value is not None:
                values.append(parent.value)
    return values
