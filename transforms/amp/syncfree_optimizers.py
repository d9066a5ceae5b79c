"""XLA203 syncfree-optimizers: in AMP scripts, torch.optim SGD/Adam/AdamW become torch_xla's syncfree ones.

What it does:
    In a script that uses AMP (autocast or a GradScaler), rewrites ``torch.optim.SGD``, ``torch.optim.Adam``
    and ``torch.optim.AdamW`` in every spelling (``optim.Adam`` after ``from torch import optim``,
    ``W`` after ``from torch.optim import AdamW as W``) to ``torch_xla.amp.syncfree.SGD/Adam/AdamW`` with the
    same arguments. ``foreach=`` and ``fused=`` (CUDA kernel choices the syncfree optimizers do not take) are
    dropped; an optimizer with an option syncfree lacks (``maximize=``, ``capturable=``, ``differentiable=``)
    is reported and left alone, and ``**kwargs`` passed through is reported for a check. Other optimizers
    have no syncfree version and are left alone; scripts without AMP are not touched.

Why:
    With a GradScaler, a plain optimizer's step must know on the host whether the gradients overflowed: one
    device-to-host sync every step. The syncfree optimizers take the found-inf flag as a tensor and skip the
    update on the device, so the step stays in the graph. pytorch/xla's own AMP examples use them with
    bfloat16 autocast too.

Example:
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)

Use instead:
    optimizer = syncfree.AdamW(model.parameters(), lr=3e-4)
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.syntax import patterns
from xla_migrate.engine.context import MigrationContext
from xla_migrate.engine.rule import Rule
from xla_migrate.transforms.common import imported_from, joined, short

# Each syncfree optimizer's keyword arguments (torch_xla.amp.syncfree, 1.13 to 2.9).
SYNCFREE = {
    "SGD": ("params", "lr", "momentum", "dampening", "weight_decay", "nesterov"),
    "Adam": ("params", "lr", "betas", "eps", "weight_decay", "amsgrad"),
    "AdamW": ("params", "lr", "betas", "eps", "weight_decay", "amsgrad"),
}
_QUALNAMES = {
    **{f"torch.optim.{name}": name for name in SYNCFREE},
    "torch.optim.sgd.SGD": "SGD", "torch.optim.adam.Adam": "Adam", "torch.optim.adamw.AdamW": "AdamW",
}
# CUDA implementation choices: dropping them changes no result.
_DROPPED = ("foreach", "fused")


class SyncfreeOptimizers(Rule):
    code = "XLA203"
    name = "syncfree-optimizers"
    summary = "in AMP scripts, torch.optim SGD/Adam/AdamW -> torch_xla.amp.syncfree SGD/Adam/AdamW"

    def visit_Call(self, node: cst.Call) -> None:
        if not self.ctx.facts.uses_amp:
            return
        matched = sorted(q for q in self.ctx.qualnames(node.func) if q in _QUALNAMES)
        if not matched:
            return
        optimizer = _QUALNAMES[matched[0]]
        accepted = SYNCFREE[optimizer]
        unknown = _unknown_arguments(node, accepted)
        if unknown:
            self.finding(node, f"{short(node)}: syncfree.{optimizer} has no {', '.join(u + '=' for u in unknown)}",
                         f"left as is; use torch_xla.amp.syncfree.{optimizer} without it if you can")
            return
        dropped = [i for i, a in enumerate(node.args) if a.keyword is not None and a.keyword.value in _DROPPED]
        func = patterns.parsed_expression(self.ctx.spell("syncfree", optimizer))

        def to_syncfree(updated: cst.Call) -> cst.Call:
            args = [a for i, a in enumerate(updated.args) if i not in dropped]
            return updated.with_changes(func=func, args=joined(args) if dropped else args)

        note = f" (dropped {', '.join(node.args[i].keyword.value + '=' for i in dropped)})" if dropped else ""
        self.replace(node, to_syncfree, f"{short(node.func)} -> {short(func)}{note}")
        if any(a.star == "**" for a in node.args):
            self.finding(node, f"{short(node)}: the ** arguments reach syncfree.{optimizer}",
                         f"check they hold only {', '.join(accepted[1:])} (not fused= or foreach=)")
        for dead in imported_from(self.ctx, node.func, matched[0]):
            self.import_may_be_dead(*dead)


def _unknown_arguments(node: cst.Call, accepted: tuple[str, ...]) -> list[str]:
    return [a.keyword.value for a in node.args
            if a.keyword is not None and a.keyword.value not in accepted and a.keyword.value not in _DROPPED]


def becomes_syncfree(ctx: MigrationContext, node: cst.Call) -> bool:
    """This rule rewrites ``node`` (and drops its ``fused=``/``foreach=``): XLA205 then leaves it alone, since
    two rewrites of one call do not compose."""
    if not (ctx.runs(SyncfreeOptimizers.code) and ctx.facts.uses_amp):
        return False
    matched = sorted(q for q in ctx.qualnames(node.func) if q in _QUALNAMES)
    return bool(matched) and not _unknown_arguments(node, SYNCFREE[_QUALNAMES[matched[0]]])
