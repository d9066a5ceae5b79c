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
    # the accesses at this node (libcst's scope.accesses[name.value] is every access of the name in the
    # scope: asked per read, that made a long module quadratic)
    for access in scope._accesses_by_node.get(name, ()):
        if access.node is not name:
            continue
        values.extend(_referent_values(ctx, access.referents))
    return values


def _referent_values(ctx, referents) -> list[cst.BaseExpression | None]:
    """The values of a set of referents, once per set: accesses share their sets (analysis/scopes.py), and
    a name bound many times was walked again at each read."""
    key = ("referent values", id(referents))
    kept = ctx.once(key, lambda: (referents, _values_of(ctx, referents)))
    if kept[0] is not referents:  # an id reused by another set: not kept
        return _values_of(ctx, referents)
    return kept[1]


def _values_of(ctx, referents) -> list[cst.BaseExpression | None]:
    values: list[cst.BaseExpression | None] = []
    for assignment in referents:
        binding = getattr(assignment, "node", None)
        parent = ctx.parent(binding) if binding is not None else None
        if isinstance(binding, cst.Param) or isinstance(parent, cst.Param):
            values.append(None)
        elif isinstance(parent, cst.AssignTarget):
            values.append(ctx.parent(parent).value)
        elif isinstance(parent, cst.AnnAssign) and parent.value is not None:
            values.append(parent.value)
    return values
