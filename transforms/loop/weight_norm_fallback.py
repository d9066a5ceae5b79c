"""XLA318 weight-norm-cpu-fallback: weight normalization computes its weight with ops that lower on XLA.

What it does:
    In a migrated script that calls ``torch.nn.utils.weight_norm`` (the hook API: parameters ``weight_g`` and
    ``weight_v``), adds once, right after the module's leading imports, an assignment that makes its hook
    compute the weight as ``v * (g / torch.norm_except_dim(v, 2, dim))``: the formula torch itself uses when
    it does not take the fused kernel. The parameters, the state dict, checkpoints and ``remove_weight_norm``
    stay as they are; the weight is the same. Calls with ``dim=None`` (a norm over the whole tensor) take the
    unfused path already and need nothing. ``torch.nn.utils.parametrizations.weight_norm`` is reported, not
    rewritten: its class is private to torch; the finding gives a parametrization of the user's own.

Why:
    ``torch._weight_norm`` calls the fused ``aten::_weight_norm_interface`` when it normalizes over the
    first or last dimension (the default ``dim=0``), and torch_xla has no lowering for it nor for its
    backward: both run on the CPU fallback, for every such layer, every step. Each backward fallback
    executes the pending graph to hand its gradient to the host, so the step is cut into more graphs and
    compiled more often. Measured on a model of two weight-normed ``Conv1d`` (torch_xla 2.9, PJRT_DEVICE=CPU,
    5 steps, the metrics report): 15 graph executions and 3 compilations with the fused kernel; with the
    unfused hook 5 and 1, the same losses to 5 decimals and the same state-dict keys. In the developers' real
    programs (TCN, HiFi-GAN) these fallbacks were the largest cost of a step (HiFi-GAN ran past the suite's
    time limit).

Example:
    from torch.nn.utils import weight_norm

    self.conv1 = weight_norm(nn.Conv1d(n_inputs, n_outputs, kernel_size, dilation=dilation))

Use instead:
    import importlib
    from torch.nn.utils import weight_norm

    # weight_norm's fused kernel has no XLA lowering (a CPU fallback every step): the same weight from ops that lower.
    importlib.import_module("torch.nn.utils.weight_norm").WeightNorm.compute_weight = lambda hook, module: (
        getattr(module, hook.name + "_v")
        * (getattr(module, hook.name + "_g") / torch.norm_except_dim(getattr(module, hook.name + "_v"), 2, hook.dim)))

    self.conv1 = weight_norm(nn.Conv1d(n_inputs, n_outputs, kernel_size, dilation=dilation))
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.engine.rule import Rule
from xla_migrate.syntax import patterns
from xla_migrate.transforms.common import statement_after_imports

HOOK_API = ("torch.nn.utils.weight_norm", "torch.nn.utils.weight_norm.weight_norm")
PARAMETRIZATION = "torch.nn.utils.parametrizations.weight_norm"
HOOK_CLASS = "torch.nn.utils.weight_norm.WeightNorm"
# ``torch.nn.utils.weight_norm`` is the function, so the module is reached through importlib.
HOOK_MODULE = "torch.nn.utils.weight_norm"
COST = ("weight norm has no XLA lowering (aten::_weight_norm_interface and its backward run on the CPU "
        "fallback for this layer every step): the step is cut into more graphs and compiled more often")
FIX = ("accept the cost, or compute the weight with ops that lower: a parametrization of your own returning "
       "v * (g / torch.norm_except_dim(v, 2, 0)) (registered with torch.nn.utils.parametrize; its state-dict "
       "entries differ from weight_g/weight_v, so convert checkpoints once)")
COMMENT = ("# weight_norm's fused kernel has no XLA lowering (a CPU fallback every step): the same weight from "
           "ops that lower.")


class WeightNormCpuFallback(Rule):
    code = "XLA318"
    name = "weight-norm-cpu-fallback"
    summary = ("weight_norm's hook computes the weight with ops that lower (its fused kernel runs on the CPU "
               "fallback every step); the parametrization form is reported")
    # Same formula and parameters; only the kernel differs (the unfused one torch uses for other dims).
    fix_safety = "safe"

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._hook_call: cst.Call | None = None  # the first call of the hook API that takes the fused kernel
        self._patched = False  # the module already points the hook at another compute_weight

    def visit_Call(self, node: cst.Call) -> None:
        names = self.ctx.qualnames(node.func)
        if not names & {*HOOK_API, PARAMETRIZATION}:
            return
        dim = patterns.argument(node, 2, "dim")
        if dim is not None and patterns.code_of(dim.value) == "None":
            return  # a norm over the whole tensor: the unfused path, which lowers
        if PARAMETRIZATION in names:
            self.finding(node, f"weight_norm(...): {COST}", FIX)
        elif self._hook_call is None:
            self._hook_call = node

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            value = target.target
            if (isinstance(value, cst.Attribute) and value.attr.value == "compute_weight"
                    and (HOOK_CLASS in self.ctx.qualnames(value.value)
                         or patterns.code_of(value.value).endswith(".WeightNorm"))):
                self._patched = True

    def leave_Module(self, original_node: cst.Module) -> None:
        if self._hook_call is None or self._patched:
            return
        first = statement_after_imports(original_node)
        if first is None:
            return
        torch = self.ctx.local_name("torch", "torch")
        importlib = self.ctx.local_name("importlib", "importlib")
        weight = 'getattr(module, hook.name + "_{}")'
        indent = self.ctx.module.default_indent  # the continuation lines follow the file's own indentation
        code = (f'{importlib}.import_module("{HOOK_MODULE}").WeightNorm.compute_weight = lambda hook, module: (\n'
                f"{indent}{weight.format('v')}\n"
                f"{indent}* ({weight.format('g')} / {torch}.norm_except_dim({weight.format('v')}, 2, hook.dim)))\n")
        statement = cst.parse_statement(code).with_changes(
            leading_lines=[cst.EmptyLine(comment=cst.Comment(COMMENT))])
        line = self.ctx.position(self._hook_call)[0]
        self.insert_before(first, [statement],
                           f"weight_norm's hook computes v * (g / ||v||) with ops that lower (line {line}): {COST}; "
                           "same parameters, state dict and weight")
