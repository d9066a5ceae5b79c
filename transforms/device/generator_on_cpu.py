"""XLA106 generator-on-cpu: a random generator on a device that becomes XLA is made on the CPU.

What it does:
    ``torch.Generator(device=<a CUDA device>)`` -> ``torch.Generator()``: the device argument goes where it
    is a CUDA device (``"cuda"``, ``f"cuda:{rank}"``, ``torch.device("cuda", i)``, the CPU-fallback
    conditional) or a name holding the script's device (``device``), which the migration turns into the XLA
    device. The generator's seeding and its uses (``generator=g`` in ``torch.randn``, ``randperm``, a
    DataLoader or sampler) stay as they are. A device the rule cannot read (``args.device``) is reported.

Why:
    torch_xla has no random generator object: ``torch.Generator(device=xla_device)`` raises "XLA device type
    not an accelerator" (torch_xla 2.9, measured here). A CPU generator works everywhere a generator is
    passed, including for tensors created on the XLA device (``torch.randn(n, generator=g,
    device=device)``), and gives the same numbers on every replica for the same seed.

Example:
    g = torch.Generator(device=device)
    g.manual_seed(0)

Use instead:
    g = torch.Generator()
    g.manual_seed(0)
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.syntax import patterns
from xla_migrate.analysis.facts import is_cuda_device_expr, is_xla_device_expr
from xla_migrate.engine.rule import Rule
from xla_migrate.transforms.common import joined, short

GENERATORS = ("torch.Generator", "torch._C.Generator")


class GeneratorOnCpu(Rule):
    code = "XLA106"
    name = "generator-on-cpu"
    summary = "torch.Generator(device=<CUDA device>) -> torch.Generator() (no generator objects on XLA)"
    on_xla_code = True  # a CUDA generator in code that already runs on XLA fails the same way

    def visit_Call(self, node: cst.Call) -> None:
        if not self.ctx.is_call_to(node, *GENERATORS):
            return
        device = patterns.keyword(node, "device") or (node.args[0] if node.args and node.args[0].keyword is None
                                                       and not node.args[0].star else None)
        if device is None:
            return
        value = device.value
        if not (is_cuda_device_expr(value, self.ctx.qualnames) or is_xla_device_expr(value, self.ctx.qualnames)
                or self._device_name(value)):
            if patterns.dotted_name(value) is not None:  # args.device, dev: maybe CUDA, maybe not
                self.finding(node, f"{short(node)}: a generator on a device this rule cannot read",
                             "make it on the CPU (torch.Generator()) if that device becomes XLA: XLA devices "
                             "have no generator objects")
            return
        index = node.args.index(device)

        def on_cpu(updated: cst.Call) -> cst.Call:
            return updated.with_changes(args=joined([a for i, a in enumerate(updated.args) if i != index]))

        self.replace(node, on_cpu, f"{short(node)} -> a CPU generator (XLA devices have none)")

    def _device_name(self, value: cst.BaseExpression) -> bool:
        """``value`` is a name holding the script's device (the migration makes it the XLA device)."""
        if not isinstance(value, cst.Name):
            return False
        return any(value.value in self.ctx.facts.device_names.get(scope, ())
                   for scope in self.ctx.visible_scopes(value))
