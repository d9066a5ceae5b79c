"""XLA109 inference-mode-to-no-grad: ``torch.inference_mode()`` becomes ``torch.no_grad()``.

What it does:
    Rewrites ``torch.inference_mode`` in every spelling (``from torch import inference_mode``,
    ``torch.autograd.grad_mode.inference_mode``) as a context manager and as a decorator, called or bare:
    ``torch.inference_mode()`` and ``torch.inference_mode(True)`` (``mode=True``) -> ``torch.no_grad()``;
    ``torch.inference_mode(False)`` -> ``torch.enable_grad()`` (what inference mode off means: gradients
    on); a mode the rule cannot read, ``torch.inference_mode(flag)``, -> ``torch.no_grad() if flag else
    torch.enable_grad()``; ``@torch.inference_mode`` -> ``@torch.no_grad``. Any other use of the name
    (stored, passed along) is reported.

Why:
    torch_xla does not support inference tensors: the first op on an XLA tensor under inference mode raises
    "RuntimeError: Cannot set version_counter for inference tensor" (a forward through ``nn.Linear``,
    torch_xla 2.9.0 and 2.6.1, measured here), so every evaluation loop written with ``inference_mode``
    crashes once its tensors are on the XLA device. ``no_grad`` gives the same values (no graph is
    recorded either way); on the CPU it only gives up inference mode's small bookkeeping savings.

Example:
    @torch.inference_mode()
    def evaluate(model, loader):
        ...

    with torch.inference_mode():
        logits = model(x)

Use instead:
    @torch.no_grad()
    def evaluate(model, loader):
        ...

    with torch.no_grad():
        logits = model(x)
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.syntax import patterns
from xla_migrate.engine.rule import Rule, torch_names_only
from xla_migrate.transforms.common import imported_from, short

INFERENCE_MODE = ("torch.inference_mode", "torch.autograd.inference_mode", "torch.autograd.grad_mode.inference_mode")


class InferenceModeToNoGrad(Rule):
    code = "XLA109"
    name = "inference-mode-to-no-grad"
    summary = "torch.inference_mode() -> torch.no_grad() (inference tensors crash on XLA)"

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        # Names already handled as the function of a call or a bare decorator.
        self._handled: set[cst.CSTNode] = set()

    def visit_Decorator(self, node: cst.Decorator) -> None:
        if isinstance(node.decorator, (cst.Name, cst.Attribute)) and self._is_inference_mode(node.decorator):
            self._handled.add(node.decorator)
            torch = self.ctx.local_name("torch", "torch")
            new = patterns.parsed_expression(f"{torch}.no_grad")
            self.replace(node.decorator, new, f"@{short(node.decorator)} -> @{torch}.no_grad (no inference "
                                              "tensors on XLA)")
            self._maybe_dead(node.decorator)

    def visit_Call(self, node: cst.Call) -> None:
        if not self._is_inference_mode(node.func):
            return
        self._handled.add(node.func)
        mode = self._mode(node)
        if mode is _UNREADABLE:
            self.finding(node, f"{short(node)}: arguments this rule cannot read",
                         "use torch.no_grad() instead: XLA tensors cannot be inference tensors")
            return
        torch = self.ctx.local_name("torch", "torch")
        literal = mode.value if isinstance(mode, cst.Name) and mode.value in ("True", "False") else None
        if mode is None or literal == "True":
            template = patterns.parsed_expression(f"{torch}.no_grad()")
        elif literal == "False":
            template = patterns.parsed_expression(f"{torch}.enable_grad()")
        else:  # parenthesized: the call may stand before an attribute or in a decorator
            template = patterns.parsed_expression(f"({torch}.no_grad() if {patterns.HOLE} else {torch}.enable_grad())")

        def to_grad_mode(updated: cst.Call) -> cst.BaseExpression:
            return template if mode is None or literal else patterns.fill(template, updated.args[0].value)

        shown = patterns.code_of(template).replace(patterns.HOLE, short(mode) if mode is not None else "")
        self.replace(node, to_grad_mode, f"{short(node)} -> {shown} (no inference tensors on XLA)")
        self._maybe_dead(node.func)

    @torch_names_only
    def visit_Name(self, node: cst.Name) -> None:
        self._other_use(node)

    @torch_names_only
    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._other_use(node)

    def _other_use(self, node: cst.BaseExpression) -> None:
        if node in self._handled or self.ctx.torch_names(node).isdisjoint(INFERENCE_MODE):
            return
        parent = self.ctx.parent(node)
        if isinstance(parent, (cst.Attribute, cst.Decorator)) or (
                isinstance(parent, cst.Call) and parent.func is node):
            return  # a part of a longer name, or handled above
        if isinstance(parent, (cst.ImportAlias, cst.ImportFrom)) or self.ctx.is_write_target(node):
            return
        self.finding(node, f"{short(node)} used as a value: it makes inference tensors, which XLA cannot take",
                     "use torch.no_grad there")

    def _is_inference_mode(self, node: cst.BaseExpression) -> bool:
        return not self.ctx.qualnames(node).isdisjoint(INFERENCE_MODE)

    def _mode(self, node: cst.Call) -> cst.BaseExpression | None | object:
        """The mode argument (None: the default, on), or _UNREADABLE for ``*args``/``**kwargs``."""
        if any(a.star for a in node.args) or len(node.args) > 1:
            return _UNREADABLE
        if not node.args:
            return None
        arg = node.args[0]
        if arg.keyword is not None and arg.keyword.value != "mode":
            return _UNREADABLE
        return arg.value

    def _maybe_dead(self, func: cst.BaseExpression) -> None:
        for qualname in sorted(self.ctx.qualnames(func)):
            if qualname in INFERENCE_MODE:
                for dead in imported_from(self.ctx, func, qualname):
                    self.import_may_be_dead(*dead)


_UNREADABLE = object()
