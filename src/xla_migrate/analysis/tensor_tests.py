"""Tests on tensors that read them to the host (issue 30, point 1; the expert review's class 15).

``if loss.item() > 10:`` is an obvious read; these are not, and cost the same (the graph runs up to the value,
mid-step): ``if not (torch.isinf(p.grad) | torch.isnan(p.grad)).any():`` over every parameter,
``assert torch.isfinite(loss)``, ``assert yb.min() >= 0 and yb.max() < n_classes`` on every evaluation batch.
A test is tensor-valued when it computes with torch functions, reads a gradient, or uses the step's tensors
or the batch's; ``x is None`` / ``isinstance`` / ``len`` parts are host checks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from ..syntax import patterns
from .steps import mentions

if TYPE_CHECKING:
    from ..engine.context import MigrationContext
    from .steps import Region

# torch functions that answer on the host without reading a tensor's value.
HOST_TORCH = ("torch.is_tensor", "torch.is_floating_point", "torch.is_complex", "torch.is_grad_enabled",
              "torch.is_inference_mode_enabled", "torch.get_default_dtype", "torch.numel", "torch.is_storage",
              "torch.are_deterministic_algorithms_enabled", "torch.device", "torch.dtype", "torch.Size",
              "torch.finfo", "torch.iinfo")
HOST_TORCH_PREFIXES = ("torch.cuda.", "torch.distributed.", "torch.backends.", "torch.jit.", "torch.onnx.",
                       "torch.version.", "torch.utils.", "torch.multiprocessing.", "torch.compiler.",
                       "torch_xla.", "torch.nn.")
_HOST_BUILTINS = ("builtins.isinstance", "builtins.len", "builtins.hasattr", "builtins.callable",
                  "builtins.type", "builtins.getattr", "builtins.id")


def tensor_valued(ctx: MigrationContext, test: cst.BaseExpression, tensors: set[str], batches: set[str]) -> bool:
    """The test computes its truth from a tensor (see the module docstring)."""
    finder = _TensorParts(ctx, tensors | batches)
    test.visit(finder)
    return finder.found or bool(mentions(_without_host_parts(test), tensors | batches))


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


class _IdentityComparisonsDropped(cst.CSTTransformer):
    def leave_Comparison(self, original: cst.Comparison, updated: cst.Comparison) -> cst.BaseExpression:
        if all(isinstance(t.operator, (cst.Is, cst.IsNot)) for t in updated.comparisons):
            return cst.Name("None")
        return updated


def _without_host_parts(test: cst.BaseExpression) -> cst.BaseExpression:
    """The test with its identity comparisons dropped (``x is None`` reads nothing)."""
    return test.visit(_IdentityComparisonsDropped())  # type: ignore[return-value]


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
        if isinstance(loop.iter, cst.Call) and "builtins.enumerate" in ctx.qualnames(loop.iter.func) and \
                isinstance(target, cst.Tuple) and len(target.elements) == 2:
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
