"""XLA318 weight-norm-cpu-fallback: weight normalization (no XLA lowering of its fused kernel) is reported with
its cost.

What it does:
    Reports every call of ``torch.nn.utils.weight_norm`` and ``torch.nn.utils.parametrizations.weight_norm``
    in a migrated script (not one with ``dim=None``, which takes the unfused path), with the form that
    lowers. Nothing is rewritten: the layer still computes the same weight on XLA, only slower, and a
    rewrite would rename its state-dict entries (``weight_g``/``weight_v``) that checkpoints and
    ``remove_weight_norm`` rely on.

Why:
    ``torch._weight_norm`` calls the fused ``aten::_weight_norm_interface`` when it normalizes over the
    first or last dimension (the default ``dim=0``), and torch_xla has no lowering for it nor for its
    backward: both run on the CPU fallback, for every such layer, every step. Each backward fallback
    executes the pending graph to hand its gradient to the host, so the step is cut into more graphs and
    compiled more often. Measured on a model of two weight-normed ``Conv1d`` migrated for 2.9 (torch_xla
    2.9, PJRT_DEVICE=CPU, 5 steps, the metrics report): counters ``aten::_weight_norm_interface`` 10 and
    its backward 10, 14 graph executions and 3 compilations, where the same model without weight norm runs
    5 and 1. In the developers' real programs (TCN, HiFi-GAN) these fallbacks are the largest cost of a step.

Example:
    self.conv1 = weight_norm(nn.Conv1d(n_inputs, n_outputs, kernel_size, dilation=dilation))

Use instead:
    # The same weight from ops that lower (v * g / ||v|| over every dimension but the first): a
    # parametrization of your own (its state-dict entries are parametrizations.weight.original0/1, so
    # convert checkpoints once), or accept the cost.
    class WeightNorm(nn.Module):
        def forward(self, g, v):
            return v * (g / torch.norm_except_dim(v, 2, 0))

        def right_inverse(self, weight):
            return torch.norm_except_dim(weight, 2, 0), weight

    conv = nn.Conv1d(n_inputs, n_outputs, kernel_size, dilation=dilation)
    torch.nn.utils.parametrize.register_parametrization(conv, "weight", WeightNorm())
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.engine.rule import Rule
from xla_migrate.syntax import patterns

WEIGHT_NORM = ("torch.nn.utils.weight_norm", "torch.nn.utils.weight_norm.weight_norm",
               "torch.nn.utils.parametrizations.weight_norm")
COST = ("weight norm has no XLA lowering (aten::_weight_norm_interface and its backward run on the CPU "
        "fallback for this layer every step): the step is cut into more graphs and compiled more often")
FIX = ("accept the cost, or compute the weight with ops that lower: a parametrization of your own returning "
       "v * (g / torch.norm_except_dim(v, 2, 0)) (registered with torch.nn.utils.parametrize; its state-dict "
       "entries differ from weight_g/weight_v, so convert checkpoints once)")


class WeightNormCpuFallback(Rule):
    code = "XLA318"
    name = "weight-norm-cpu-fallback"
    summary = "weight_norm layers (no XLA lowering of the fused kernel, CPU fallback every step) are reported"

    def visit_Call(self, node: cst.Call) -> None:
        if not self.ctx.qualnames(node.func) & set(WEIGHT_NORM):
            return
        dim = patterns.argument(node, 2, "dim")
        if dim is not None and patterns.code_of(dim.value) == "None":
            return  # a norm over the whole tensor: the unfused path, which lowers
        self.finding(node, f"weight_norm(...): {COST}", FIX)
