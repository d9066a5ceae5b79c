"""XLA902 apex-usage: NVIDIA apex (amp, fused optimizers, fused norms, apex DDP) is reported with its PyTorch replacement.

What it does:
    Reports every import of ``apex`` and every use of its parts, each with the PyTorch form to use instead:
    ``apex.amp`` (``amp.initialize``, ``amp.scale_loss``) -> ``torch.autocast`` (which the AMP rules then
    migrate), ``apex.optimizers.FusedAdam``/``FusedLAMB``/``FusedSGD`` -> ``torch.optim`` (syncfree under AMP),
    ``apex.normalization.FusedLayerNorm``/``FusedRMSNorm`` -> ``torch.nn.LayerNorm``/``RMSNorm``,
    ``apex.parallel.DistributedDataParallel`` -> no wrapper (``xm.optimizer_step`` reduces gradients).
    Nothing is rewritten.

Why:
    apex is a library of CUDA kernels: none of it runs on XLA. Its pieces map to PyTorch modules whose
    semantics differ in details (loss-scale handling, fused-update numerics), so a person makes the switch.

Example:
    from apex import amp
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")

Use instead:
    # drop amp.initialize; wrap the forward pass in torch.autocast and train as usual
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.syntax import patterns
from xla_migrate.engine.rule import Rule

REPLACEMENTS = {
    "apex.amp": "use torch.autocast for mixed precision (drop amp.initialize / amp.scale_loss); "
                "xla-migrate's AMP rules then move it to XLA",
    "apex.optimizers": "use the torch.optim optimizer with the same update (FusedAdam -> torch.optim.AdamW, "
                       "FusedSGD -> SGD, FusedLAMB -> a PyTorch LAMB)",
    "apex.normalization": "use torch.nn.LayerNorm (FusedLayerNorm) or torch.nn.RMSNorm (FusedRMSNorm)",
    "apex.parallel": "remove the wrapper: on XLA xm.optimizer_step (or an explicit all_reduce) reduces gradients",
    "apex.contrib": "apex.contrib kernels are CUDA-only: replace them with PyTorch operations",
}
DEFAULT = "apex is CUDA-only: replace it with the PyTorch equivalent"


def _advice(name: str) -> str:
    for prefix, advice in REPLACEMENTS.items():
        if name == prefix or name.startswith(prefix + "."):
            return advice
    return DEFAULT


class ApexUsage(Rule):
    code = "XLA902"
    name = "apex-usage"
    summary = "NVIDIA apex (amp, fused optimizers and norms, apex DDP) is reported with the PyTorch form to use"
    on_xla_code = True  # it only reports, on code already on XLA too (its CUDA paths included)
    reports_only = True

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            module = patterns.dotted_name(alias.name) or ""
            if module == "apex" or module.startswith("apex."):
                self.finding(node, f"import {module}: apex does not run on XLA", _advice(module))

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if node.module is None or node.relative:
            return
        module = patterns.dotted_name(node.module) or ""
        if module == "apex" or module.startswith("apex."):
            names = [] if isinstance(node.names, cst.ImportStar) else [a.evaluated_name for a in node.names]
            full = f"{module}.{names[0]}" if module == "apex" and names else module
            self.finding(node, f"from {module} import {', '.join(names) or '*'}: apex does not run on XLA",
                         _advice(full))

    def visit_Call(self, node: cst.Call) -> None:
        names = sorted(n for n in self.ctx.qualnames(node.func) if n.startswith("apex."))
        if names:
            self.finding(node, f"{names[0]}(...) is an apex (CUDA-only) API", _advice(names[0]))
