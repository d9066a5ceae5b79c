"""The update's gradient reduction (XLA406): the training steps whose gradients are all-reduced explicitly
(a distributed script in the xm form whose step reads or changes its gradients between the backward and the
optimizer step), decided once. A part of ``StepModel`` (a base class of it)."""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING

import libcst as cst

from ...syntax import patterns
from .collect import _is_scaler, _receiver
from .kinds import BACKWARD, CLIP, FETCH, GRAD, STEP, UNSCALE, Event, Reduction, StepLoop

if TYPE_CHECKING:
    from ...engine.context import MigrationContext


class GradientReductions:
    """``StepModel``'s gradient reduction (see the module docstring)."""

    # The gradient reduction (XLA406) ---------------------------------------------------------------------------
    @cached_property
    def reductions(self) -> list[Reduction]:
        """The training steps whose gradients are (or will be) all-reduced explicitly: in a distributed
        script (the xm form: in the ddp form DDP reduces during the backward), a step that reads or changes
        its gradients between the backward and the optimizer step
        (``scaler.unscale_``, clipping, ``p.grad``, a kept GradScaler's ``scaler.step``); decided once."""
        ctx = self.ctx
        if not (ctx.distributed or ctx.facts.distributed):
            return []
        found: dict[tuple[cst.CSTNode, cst.CSTNode], Reduction] = {}
        for step in self.loops.values():
            if step.kind != "train":
                continue
            decision = self._reduction(step)
            if decision is not None and (decision.already_reduced or (ctx.xm_form and ctx.runs("XLA406"))):
                found.setdefault((decision.backward, decision.first_touch), decision)
        return list(found.values())

    def _reduction(self, step: StepLoop) -> Reduction | None:
        keeps_scaler = self.ctx.target.has_grad_scaler
        # A helper in another module does its own backward and step: its module handles the reduction.
        events = [e for e in step.events if not e.external]
        backwards = [e for e in events if e.kind == BACKWARD]
        steps = [e for e in events if e.kind == STEP]
        reduced = any(e.kind == FETCH for e in events)
        touches = [e for e in events if e.kind in (CLIP, GRAD) or (keeps_scaler and e.kind == UNSCALE)
                   or (keeps_scaler and e.kind == STEP and _is_scaler(self.ctx, _receiver(e.node)))]  # type: ignore[arg-type]
        if not backwards or not steps:
            return None
        first_backward = min(backwards, key=self._order)
        start = self._order(first_backward)
        last_step = max(self._order(s) for s in steps)
        between = [t for t in touches if start < self._order(t) <= last_step]
        if not between and not reduced:
            return None
        touch = min(between, key=self._order) if between else first_backward
        backward = max((b for b in backwards if self._order(b) < self._order(touch)), key=self._order,
                       default=first_backward)
        # Both lie in the function where their call paths part.
        full_b = (*backward.path, backward.node)
        full_t = (*touch.path, touch.node)
        common = 0
        while common < min(len(full_b), len(full_t)) - 1 and full_b[common] is full_t[common]:
            common += 1
        prefix = full_b[:common]
        within: cst.CSTNode = step.loop if not prefix else self.callee(prefix[-1])  # type: ignore[assignment]
        optimizers: list[str] = []
        local: list[cst.CSTNode] = []
        for event in sorted(steps, key=self._order):
            full = (*event.path, event.node)
            if full[:common] == prefix and len(full) > common:
                local.append(full[common])
            if event.path != prefix:
                continue
            name = step_optimizer(self.ctx, event.node)  # type: ignore[arg-type]
            if name is not None and name not in optimizers:
                optimizers.append(name)
        return Reduction(step.loop, within, full_b[common], full_t[common],
                         tuple(e.node for e in steps), tuple(optimizers), reduced, tuple(local))  # type: ignore[arg-type]

    def _order(self, event: Event) -> tuple[tuple[int, int], ...]:
        """Execution order within a step: positions along the call path, then the node's."""
        return tuple(self.ctx.position(n) for n in (*event.path, event.node))

    def explicitly_reduced_step(self, node: cst.Call) -> bool:
        """This step follows an explicit all_reduce of the gradients: it must not reduce them again (XLA204
        and XLA202 step with ``opt.step()``, not ``xm.optimizer_step(opt)``)."""
        return any(node in decision.steps for decision in self.reductions)


def step_optimizer(ctx: MigrationContext, node: cst.Call) -> str | None:
    """The optimizer a step call steps: ``opt.step()`` -> ``opt``, ``scaler.step(opt)`` -> ``opt``."""
    method = patterns.method_call(node, "step")
    if method is None:
        return None
    receiver = patterns.dotted_name(method.value)
    if _is_scaler(ctx, receiver):
        args = patterns.positional(node)
        return patterns.dotted_name(args[0].value) if len(args) == 1 else None
    return receiver
