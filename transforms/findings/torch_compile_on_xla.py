"""XLA903 torch-compile-on-xla: torch.compile calls are reported: XLA needs the openxla backend, or no compile.

What it does:
    Reports every ``torch.compile(...)`` call (any spelling, decorator form included) whose backend is not
    already ``"openxla"``, with what to do. Nothing is rewritten.

Why:
    The default ``inductor`` backend generates Triton/CUDA or CPU code, not XLA programs. On torch_xla the
    lazy tensor graph is already compiled by XLA each step; ``torch.compile(model, backend="openxla")``
    (torch_xla's dynamo backend) is the XLA path when the dynamo front end is wanted, mostly for inference.

Example:
    model = torch.compile(model)

Use instead:
    model = torch.compile(model, backend="openxla")  # or drop torch.compile: XLA compiles the step
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.syntax import patterns
from xla_migrate.engine.rule import Rule

COMPILE = "torch.compile"


class TorchCompileOnXla(Rule):
    code = "XLA903"
    name = "torch-compile-on-xla"
    summary = "torch.compile with a non-XLA backend is reported (use backend='openxla' or drop it)"
    on_xla_code = True  # it only reports, on code already on XLA too (its CUDA paths included)
    reports_only = True

    def _check(self, node: cst.CSTNode, call: cst.Call | None) -> None:
        backend = patterns.keyword(call, "backend") if call is not None else None
        if backend is not None and patterns.string_value(backend.value) == "openxla":
            return
        named = patterns.string_value(backend.value) if backend is not None else None
        what = f'backend "{named}"' if named else ("a custom backend" if backend is not None else "the default inductor backend")
        self.finding(node, f"torch.compile with {what} does not produce XLA programs",
                     'pass backend="openxla" (torch_xla\'s dynamo backend) or drop torch.compile: '
                     "XLA already compiles each step's graph")

    def visit_Call(self, node: cst.Call) -> None:
        if COMPILE in self.ctx.qualnames(node.func):
            self._check(node, node)

    def visit_Decorator(self, node: cst.Decorator) -> None:
        # `@torch.compile` without arguments (with arguments it is a Call, handled above).
        if not isinstance(node.decorator, cst.Call) and COMPILE in self.ctx.qualnames(node.decorator):
            self._check(node, None)
