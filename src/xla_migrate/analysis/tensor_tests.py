"""Tests on tensors that read them to the host (issue 30, point 1; the expert review's class 15).

``if loss.item() > 10:`` is an obvious read; these are not, and cost the same (the graph runs up to the value,
mid-step): ``if not (torch.isinf(p.grad) | torch.isnan(p.grad)).any():`` over every parameter,
``assert torch.isfinite(loss)``, ``assert yb.min() >= 0 and yb.max() < n_classes`` on every evaluation batch.
A test is tensor-valued when it computes with torch functions, reads a gradient, or uses the step's tensors
or the batch's; ``x is None`` / ``isinstance`` / ``len`` parts are host checks. A membership test (``i in ids``,
``"mask" in batch``) reads only with evidence that an operand is a tensor (a torch call, a step's tensor): a
batch may be a dict, and ``enumerate``'s index (also through ``tqdm(enumerate(loader))``) is a Python int.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from ..syntax import patterns
from .steps import mentions, reads
from .truth_tests import HOST_TORCH, HOST_TORCH_PREFIXES

if TYPE_CHECKING:
    from ..engine.context import MigrationContext
    from .steps import Region

_HOST_BUILTINS = ("builtins.isinstance", "builtins.len", "builtins.hasattr", "builtins.callable",
                  "builtins.type", "builtins.getattr", "builtins.id")


def tensor_valued(ctx: MigrationContext, test: cst.BaseExpression, tensors: set[str], batches: set[str]) -> bool:
    """The test computes its truth from a tensor (see the module docstring)."""
    finder = _TensorParts(ctx, tensors | batches)
    test.visit(finder)
    return finder.found or bool(mentions(_without_host_parts(ctx, test, tensors), tensors | batches))


class _TensorParts(cst.CSTVisitor):
    def __init__(self, ctx: MigrationContext, names: set[str]) -> None:
        super().__init__()
        self.ctx = ctx
        self.names = names
        self.found = False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False

    def visit_Comparison(self, node: cst.Comparison) -> bool:
        # ``p.grad is not None``: identity, on the host.
        return not all(isinstance(t.operator, (cst.Is, cst.IsNot)) for t in node.comparisons)

    def visit_Call(self, node: cst.Call) -> bool:
        names = self.ctx.qualnames(node.func)
        if names & set(_HOST_BUILTINS):
            return False
        torch_calls = {n for n in names if n.startswith("torch.")}
        if torch_calls and not torch_calls & set(HOST_TORCH) and not any(
                n.startswith(HOST_TORCH_PREFIXES) for n in torch_calls):
            self.found = True
            return False
        return True

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        if node.attr.value == "grad":  # a gradient used as a value
            self.found = True
            return False
        return True


class _HostComparisonsDropped(cst.CSTTransformer):
    def __init__(self, ctx: MigrationContext, tensors: set[str]) -> None:
        super().__init__()
        self.ctx = ctx
        self.tensors = tensors

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        # ``isinstance(x, int)``, ``exists(x)`` (``return v is not None``): answered on the host.
        if self.ctx.qualnames(original.func) & set(_HOST_BUILTINS) or _returns_host(self.ctx, original):
            return cst.Name("None")
        return updated

    def leave_Comparison(self, original: cst.Comparison, updated: cst.Comparison) -> cst.BaseExpression:
        if all(isinstance(t.operator, (cst.Is, cst.IsNot)) for t in updated.comparisons):
            return cst.Name("None")
        # ``i in ret_samples_ids``, ``"mask" in batch``: a tensor only when one of the step's tensors is in it
        # (torch calls are found apart); a batch name alone is no evidence (a dict, a list of file names).
        if all(isinstance(t.operator, (cst.In, cst.NotIn)) for t in updated.comparisons) and (
                not mentions(updated, self.tensors) or isinstance(updated.left, (cst.SimpleString, cst.FormattedString,
                                                                                 cst.ConcatenatedString))):
            return cst.Name("None")  # (``"bias" in out``: a tensor holds no strings, ``out`` is a dict)
        return updated


def _without_host_parts(ctx: MigrationContext, test: cst.BaseExpression, tensors: set[str]) -> cst.BaseExpression:
    """The test with its host parts dropped: identity (``x is None`` reads nothing), membership with no step
    tensor in it, host builtins and the module's functions that return host values (``exists(x)``)."""
    return test.visit(_HostComparisonsDropped(ctx, tensors))  # type: ignore[return-value]


def _enumerated(ctx: MigrationContext, iterated: cst.BaseExpression) -> bool:
    """``enumerate(loader)``, also wrapped: ``tqdm(enumerate(loader))``, ``iter(enumerate(...))``."""
    while isinstance(iterated, cst.Call):
        if "builtins.enumerate" in ctx.qualnames(iterated.func):
            return True
        if not iterated.args:
            return False
        iterated = iterated.args[0].value
    return False


def torch_bound_names(ctx: MigrationContext, region: Region) -> set[str]:
    """Names the region's code binds to a torch computation (``t = torch.relu(x)``, then ``t = t / 2``), to a
    fixed point: evidence that ``while t.max() > 1:`` tests a tensor. Values read with ``.item()`` are not."""
    scope = region.function if region.in_callee else region.step.loop
    if scope is None:
        return set()
    assignments = [(node.targets[0].target if isinstance(node, cst.Assign) else node.target, node.value)
                   for node in patterns.find_all(scope.body, lambda n: isinstance(n, (cst.Assign, cst.AugAssign)))
                   if not isinstance(node, cst.Assign) or len(node.targets) == 1]
    found: set[str] = set()
    changed = True
    while changed:
        changed = False
        for target, value in assignments:
            names = {n.value for n in patterns.find_all(target, lambda n: isinstance(n, cst.Name))} - found
            if not names or not isinstance(target, (cst.Name, cst.Tuple)) or reads(ctx, value, set()):
                continue
            if _length_arithmetic(ctx, value):
                continue  # ``k -= len(done)``: a beam's width, a host number whatever it counts
            finder = _TensorParts(ctx, found)
            value.visit(finder)
            if finder.found or mentions(value, found):
                found |= names
                changed = True
    return found


def _length_arithmetic(ctx: MigrationContext, value: cst.BaseExpression) -> bool:
    """``len(x)``, ``2 * len(x) + 1``: a number on the host (a length is known without running the graph)."""
    if isinstance(value, cst.Integer):
        return True
    if isinstance(value, cst.BinaryOperation):
        return _length_arithmetic(ctx, value.left) and _length_arithmetic(ctx, value.right)
    return isinstance(value, cst.Call) and "builtins.len" in ctx.qualnames(value.func)


_HOST_RESULTS = ("builtins.float", "builtins.int", "builtins.len", "builtins.round", "builtins.min", "builtins.max",
                 "builtins.abs", "builtins.bool", "builtins.str")


def _host_result(ctx: MigrationContext, value: cst.BaseExpression | None) -> bool:
    """A returned value that is a number or a string whatever the arguments: a literal, ``math.sqrt(...)``,
    ``len(...)``, arithmetic of those."""
    if value is None or isinstance(value, (cst.Integer, cst.Float, cst.SimpleString, cst.FormattedString)):
        return True
    if isinstance(value, cst.Name):
        return value.value in ("None", "True", "False")
    if isinstance(value, cst.BinaryOperation):
        return _host_result(ctx, value.left) and _host_result(ctx, value.right)
    if isinstance(value, cst.UnaryOperation):
        return _host_result(ctx, value.expression)
    if isinstance(value, cst.Comparison):
        return all(isinstance(t.operator, (cst.Is, cst.IsNot)) for t in value.comparisons)
    if isinstance(value, cst.Call):
        names = ctx.qualnames(value.func)
        if names & set(_HOST_BUILTINS):
            return True
        return any(n.startswith("math.") for n in names) or bool(names & set(_HOST_RESULTS))
    return False


def host_bound_names(ctx: MigrationContext, region: Region) -> set[str]:
    """Names the region's code binds only to calls of this module's functions that return numbers whatever
    their arguments (``scale = loss_scale_for(n, ref)`` returning ``1.0`` or ``math.sqrt(n / ref)``): no
    tensor, whatever a name in the callee says."""
    scope = region.function if region.in_callee else region.step.loop
    if scope is None:
        return set()
    bound: dict[str, bool] = {}
    for node in patterns.find_all(scope.body, lambda n: isinstance(n, (cst.Assign, cst.AugAssign, cst.AnnAssign))):
        targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
        host = isinstance(node, cst.Assign) and isinstance(node.value, cst.Call) and _returns_host(ctx, node.value)
        for target in targets:
            for name in patterns.find_all(target, lambda n: isinstance(n, cst.Name)):
                bound[name.value] = bound.get(name.value, True) and host and isinstance(target, cst.Name)
    return {name for name, host in bound.items() if host}


def _returns_host(ctx: MigrationContext, call: cst.Call) -> bool:
    callee = ctx.steps.callee(call)
    if callee is None:
        return False
    returns = patterns.find_all(callee.body, lambda n: isinstance(n, cst.Return))
    nested = patterns.find_all(callee.body, lambda n: isinstance(n, (cst.FunctionDef, cst.Lambda, cst.Yield)))
    return bool(returns) and not nested and all(_host_result(ctx, r.value) for r in returns)


def batch_names(ctx: MigrationContext, region: Region) -> set[str]:
    """Names that hold the step's batch: the loop's targets when it iterates a loader (past ``enumerate``'s
    index), and names bound to ``x.to(device)`` / ``x.cuda()`` in the loop."""
    if region.in_callee:
        return set()
    step = region.step
    found: set[str] = set()
    loop = step.loop
    if isinstance(loop, cst.For) and step.batches.how in ("loader", "device_loader"):
        target = loop.target
        if _enumerated(ctx, loop.iter) and isinstance(target, cst.Tuple) and len(target.elements) == 2:
            target = target.elements[1].value
        found.update(n.value for n in patterns.find_all(target, lambda n: isinstance(n, cst.Name)))
    for moved in patterns.find_all(loop.body, lambda n: isinstance(n, cst.Assign)):
        values = moved.value.elements if isinstance(moved.value, cst.Tuple) else [moved.value]  # type: ignore[attr-defined]
        if all(isinstance(getattr(v, "value", v), cst.Call) and patterns.method_call(getattr(v, "value", v), "to", "cuda")
               for v in values):
            for target in moved.targets:  # type: ignore[attr-defined]
                found.update(n.value for n in patterns.find_all(target.target, lambda n: isinstance(n, cst.Name)))
    return found


def repeated(ctx: MigrationContext, node: cst.CSTNode, region: Region) -> str:
    """``, once per iteration of the loop at line 12 over the parameters`` when the read sits in a loop
    below the step (a loop over the parameters multiplies the syncs), else ``""``."""
    top = region.function if region.in_callee else region.step.loop
    current = ctx.parent(node)
    while current is not None and current is not top:
        if isinstance(current, (cst.For, cst.While)):
            line = ctx.position(current)[0]
            what = ""
            if isinstance(current, cst.For) and patterns.find_all(current.iter, lambda n: isinstance(n, cst.Call) and bool(
                    patterns.method_call(n, "parameters", "named_parameters"))):
                what = " over the parameters"
            return f", once per iteration of the loop at line {line}{what} (as many syncs per step)"
        if isinstance(current, (cst.FunctionDef, cst.Lambda)):
            break
        current = ctx.parent(current)
    return ""
