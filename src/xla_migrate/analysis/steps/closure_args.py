"""A step closure's arguments for host values (issue 30, point 1; the expert review's class 17).

A print moved into a step closure runs at the barrier, after the rest of the step: the host values in it
(``optimizer.param_groups[0]["lr"]`` before ``scheduler.step()``, ``time.time() - start``, ``self.global_step``)
would be evaluated then, a step late. They are evaluated at the step instead and passed as the closure's
arguments (XLA310), each under a readable parameter name.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import libcst as cst

from ...syntax import patterns
from .reads import mentions, reads

if TYPE_CHECKING:
    from ...engine.context import MigrationContext

# Attribute roots that hold configuration, which does not change during a step: not worth an argument.
_CONFIG_ROOTS = ("args", "config", "cfg", "opt", "opts", "hparams", "hp", "FLAGS", "flags", "params")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def host_values(ctx: MigrationContext, node: cst.CSTNode, tensors: set[str]) -> list[cst.BaseExpression]:
    """The largest parts of a logging call's arguments that compute a host value which may change before the
    closure runs (an attribute, a subscript, a call, or arithmetic over them), and read no tensor; in
    the order they appear."""
    found: list[cst.BaseExpression] = []

    def take(expression: cst.BaseExpression) -> bool:
        if not isinstance(expression, (cst.Attribute, cst.Subscript, cst.Call, cst.BinaryOperation,
                                       cst.UnaryOperation)):
            return False
        if mentions(expression, tensors) or reads(ctx, expression, tensors):
            return False
        if any(n.value in tensors for n in patterns.find_all(expression, lambda n: isinstance(n, cst.Name))):
            return False  # ``loss.shape``: known without the step, and fixed
        if patterns.find_all(expression, lambda n: isinstance(n, (cst.Lambda, cst.BaseComp, cst.Await,
                                                                   cst.NamedExpr, cst.Yield))):
            return False
        if ctx.torch_names(expression) or any(ctx.torch_names(n) for n in patterns.find_all(
                expression, lambda n: isinstance(n, (cst.Name, cst.Attribute)))):
            return False
        return _may_change(ctx, expression)

    def walk(expression: cst.CSTNode) -> None:
        if isinstance(expression, cst.BaseExpression) and take(expression):
            found.append(expression)
            return
        if isinstance(expression, (cst.Lambda, cst.BaseComp)):
            return
        if isinstance(expression, cst.Call) and "builtins.len" in ctx.qualnames(expression.func):
            return  # a length: fixed
        for child in expression.children:
            walk(child)

    if isinstance(node, cst.Call):
        for arg in node.args:
            walk(arg.value)
        if isinstance(node.func, cst.Attribute) and isinstance(node.func.value, (cst.SimpleString,
                                                                              cst.ConcatenatedString)):
            pass  # "...".format(...): its arguments are walked above
    else:
        walk(node)
    return found


def _may_change(ctx: MigrationContext, expression: cst.BaseExpression) -> bool:
    """Not a length, not configuration (``args.lr``), not a constant's arithmetic."""
    if isinstance(expression, cst.Call):
        if "builtins.len" in ctx.qualnames(expression.func):
            return False  # a dataset's or loader's length: fixed
        if "builtins.str" in ctx.qualnames(expression.func):
            return _may_change_any(ctx, [a.value for a in expression.args])
        return True
    if isinstance(expression, (cst.Attribute, cst.Subscript)):
        root = expression
        while isinstance(root, (cst.Attribute, cst.Subscript)):
            root = root.value
        if isinstance(root, cst.Name) and root.value in _CONFIG_ROOTS:
            return False
        return not (isinstance(root, cst.Name) and _is_module_name(ctx, root))
    if isinstance(expression, cst.BinaryOperation):
        return _may_change_any(ctx, [expression.left, expression.right])
    if isinstance(expression, cst.UnaryOperation):
        return _may_change_any(ctx, [expression.expression])
    return False


def _may_change_any(ctx: MigrationContext, parts: list[cst.BaseExpression]) -> bool:
    return any(isinstance(p, (cst.Attribute, cst.Subscript, cst.Call, cst.BinaryOperation, cst.UnaryOperation))
               and _may_change(ctx, p) for p in parts)


def _is_module_name(ctx: MigrationContext, name: cst.Name) -> bool:
    """``math.pi``, ``os.sep``: a name bound by an import."""
    scope = ctx.scopes.get(name)
    if scope is None or name.value not in scope:
        return False
    return any(isinstance(getattr(a, "node", None), (cst.Import, cst.ImportFrom)) for a in scope[name.value])


def parameter_name(expression: cst.BaseExpression, taken: set[str]) -> str:
    """A readable parameter name for a host value: ``optimizer.param_groups[0]["lr"]`` -> ``lr``,
    ``self.global_step`` -> ``global_step``, ``time.time() - start`` -> ``elapsed``."""
    base = _describe(expression) or "value"
    name, index = base, 2
    while name in taken:
        name, index = f"{base}{index}", index + 1
    taken.add(name)
    return name


def _describe(expression: cst.BaseExpression) -> str | None:
    if isinstance(expression, cst.Subscript):
        if len(expression.slice) == 1 and isinstance(expression.slice[0].slice, cst.Index):
            key = patterns.string_value(expression.slice[0].slice.value)
            if key is not None and _IDENTIFIER.match(key):
                return key
        return _describe(expression.value)
    if isinstance(expression, cst.Attribute):
        return expression.attr.value
    if isinstance(expression, cst.Call):
        name = patterns.dotted_name(expression.func) or ""
        last = name.rsplit(".", 1)[-1]
        if last in ("time", "perf_counter", "monotonic"):
            return "now"
        if last.startswith("get_") and len(last) > 4:
            return last[4:]
        return last or None
    if isinstance(expression, cst.BinaryOperation):
        text = patterns.code_of(expression)
        if "time" in text or "perf_counter" in text or "monotonic" in text:
            return "elapsed"
        return _describe(expression.left) if isinstance(expression.left, (cst.Attribute, cst.Subscript,
                                                                           cst.Call)) else None
    return None
