"""Tensors that live on the host, and reads that run every N steps: what XLA311 must not call a per-step
device sync (issue 33).

A tensor built by a torch factory without ``device=`` (``losses = torch.zeros(eval_iters)  # keep on CPU``,
filled with ``.item()``), and what is computed from it without a move (``losses.mean()``), is a CPU tensor:
comparing it reads nothing from the device. A function returning only such values returns a CPU tensor, so
``val_loss = estimate_loss()`` holds one whatever its name suggests. Not where the program changes the
default device (``torch.set_default_device``): there the factory builds on that device.
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.analysis.steps import Region
from xla_migrate.syntax import patterns

FACTORIES = frozenset(f"torch.{name}" for name in (
    "zeros", "ones", "empty", "full", "tensor", "as_tensor", "arange", "linspace", "rand", "randn", "randint",
    "Tensor", "FloatTensor", "LongTensor", "IntTensor", "DoubleTensor"))
MOVES = ("to", "cuda", "xla", "to_device")
_DEFAULT_DEVICE = ("set_default_device", "set_default_tensor_type", "set_default_dtype_and_device")


def _factoryon_cpu(ctx, value: cst.BaseExpression) -> bool:
    if not (isinstance(value, cst.Call) and ctx.qualnames(value.func) & FACTORIES):
        return False
    for arg in value.args:
        if arg.keyword is not None and arg.keyword.value == "device":
            return isinstance(arg.value, cst.SimpleString) and arg.value.evaluated_value == "cpu"
    return True


def on_cpu(ctx, value: cst.BaseExpression, names: set[str]) -> bool:
    """A CPU tensor: a factory call without a device, or a chain of attributes, method calls and subscripts
    on a CPU tensor with no move among them (``losses.mean()``, ``losses[:k].sum()``)."""
    if _factoryon_cpu(ctx, value):
        return True
    if isinstance(value, cst.Name):
        return value.value in names
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
        if value.func.attr.value in MOVES:
            return False
        return on_cpu(ctx, value.func.value, names)
    if isinstance(value, cst.Subscript):
        return on_cpu(ctx, value.value, names)
    if isinstance(value, cst.BinaryOperation):
        sides = (value.left, value.right)
        numbers = [isinstance(s, (cst.Integer, cst.Float)) for s in sides]
        return all(n or on_cpu(ctx, s, names) for n, s in zip(numbers, sides)) and not all(numbers)
    return False


def _bindings(body: cst.CSTNode) -> list[tuple[str | None, cst.BaseExpression | None]]:
    """(name, value) for every binding of a name in ``body``; value None where the binding is not a plain
    ``name = value`` (a tuple target, an augmented assignment, a loop target)."""
    found: list[tuple[str | None, cst.BaseExpression | None]] = []
    for node in patterns.find_all(body, lambda n: isinstance(n, (cst.Assign, cst.AnnAssign, cst.AugAssign, cst.For))):
        if isinstance(node, cst.Assign):
            for target in node.targets:
                plain = isinstance(target.target, cst.Name)
                found.extend((name, node.value if plain else None) for name in _bound(target.target))
        elif isinstance(node, cst.For):
            found.extend((name, None) for name in _bound(node.target))
        elif isinstance(node.target, cst.Name):
            value = node.value if isinstance(node, cst.AnnAssign) else None
            found.append((node.target.value, value))
    return found


def _bound(target: cst.BaseExpression) -> list[str]:
    """The names an assignment target binds: not those inside a subscript or attribute (``losses[k] = v``
    fills ``losses``, it does not rebind it)."""
    if isinstance(target, cst.Name):
        return [target.value]
    if isinstance(target, (cst.Tuple, cst.List)):
        return [name for element in target.elements for name in _bound(element.value)]
    if isinstance(target, cst.StarredElement):
        return _bound(target.value)
    return []


def cpu_names(ctx, body: cst.CSTNode) -> set[str]:
    """Names every binding in ``body`` gives a CPU tensor (itself, or through a call of a function of this
    module that returns only CPU tensors), to a fixed point."""
    if any(word in ctx.input_code for word in _DEFAULT_DEVICE):
        return set()
    bindings = _bindings(body)
    names: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name in {n for n, _ in bindings} - names:
            values = [v for n, v in bindings if n == name]
            if all(v is not None and (on_cpu(ctx, v, names) or _returns_cpu(ctx, v)) for v in values):
                names.add(name)
                changed = True
    return names


def _returns_cpu(ctx, value: cst.BaseExpression) -> bool:
    if not isinstance(value, cst.Call):
        return False
    callee = ctx.steps.callee(value)
    if callee is None:
        return False
    returns = patterns.find_all(callee.body, lambda n: isinstance(n, cst.Return))
    nested = patterns.find_all(callee.body, lambda n: isinstance(n, (cst.FunctionDef, cst.Lambda, cst.Yield)))
    if not returns or nested:
        return False
    names = cpu_names(ctx, callee.body)
    return all(r.value is not None and on_cpu(ctx, r.value, names) for r in returns)


def region_cpu_names(ctx, region: Region) -> set[str]:
    """The CPU-tensor names where the region's code runs (its callee's body, or the step loop's)."""
    scope = region.function if region.in_callee else region.step.loop
    return set() if scope is None else cpu_names(ctx, scope.body)


def interval(ctx, node: cst.CSTNode, region: Region) -> str:
    """``every eval_interval steps`` when ``node`` (or a call on its path from the loop) sits in the body of an
    ``if`` testing a modulo (``if step % eval_interval == 0:``), else ``""``."""
    starts = [node, *region.path]
    for start in starts:
        current, child = ctx.parent(start), start
        while current is not None and current is not region.step.loop:
            if isinstance(current, (cst.FunctionDef, cst.Lambda)):
                break
            if isinstance(current, cst.If) and child is current.body:
                modulo = patterns.find_all(current.test, lambda n: isinstance(n, cst.BinaryOperation)
                                           and isinstance(n.operator, cst.Modulo))
                if modulo:
                    every = patterns.code_of(modulo[0].right).strip()
                    return f"every {every} steps (under the test at line {ctx.position(current)[0]})"
            child, current = current, ctx.parent(current)
    return ""
