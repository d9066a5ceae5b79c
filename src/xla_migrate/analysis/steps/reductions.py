"""The update's gradient reduction (XLA406): the training steps whose gradients are all-reduced explicitly
(a distributed script in the xm form whose step reads or changes its gradients between the backward and the
optimizer step), decided once. A part of ``StepModel`` (a base class of it).

A step may run several updates (a GAN's discriminator and generator steps, a lazy regularisation step, the
AMP and the fp32 branch of one loop, two optimizers over one backward). Each update is paired with the last
backward before it: the gradients it steps. When something reads or changes those gradients between that
backward and the update, the update's optimizer gets an explicit all-reduce right after that backward (XLA406)
and the update steps without reducing again (XLA204/XLA202 leave it as ``opt.step()``); every other update
reduces in ``xm.optimizer_step``. Updates that share a backward share one reduction, one fetch per optimizer.
A function that runs a backward and an update while no loop of its module calls it (a loss scaler's
``__call__``, a ``train_step`` another module's loop calls) is a step of its own (helper_steps)."""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING

import libcst as cst

from ...syntax import patterns
from .collect import _is_scaler, _receiver, is_model_call
from .kinds import (_MODEL_NAME, _OPTIMIZER_NAME, BACKWARD, CLIP, CLIP_GRADS, FETCH, GRAD, STEP, UNSCALE, Batches, Event,
                    Reduction, StepLoop)

if TYPE_CHECKING:
    from ...engine.context import MigrationContext
    from .model import StepModel


class GradientReductions:
    """``StepModel``'s gradient reduction (see the module docstring)."""

    # The gradient reduction (XLA406) ---------------------------------------------------------------------------
    @cached_property
    def reductions(self) -> list[Reduction]:
        """The training steps whose gradients are (or will be) all-reduced explicitly: in a distributed
        script (the xm form: in the ddp form DDP reduces during the backward), an update whose gradients are
        read or changed between the backward that feeds it and the update (``scaler.unscale_``, clipping,
        ``p.grad``, a kept GradScaler's ``scaler.step``); decided once, per update (plan_reductions)."""
        return plan_reductions(self)  # type: ignore[arg-type]

    def _order(self, event: Event) -> tuple[tuple[int, int], ...]:
        """Execution order within a step: positions along the call path, then the node's."""
        return tuple(self.ctx.position(n) for n in (*event.path, event.node))

    def explicitly_reduced_step(self, node: cst.Call) -> bool:
        """This step follows an explicit all_reduce of the gradients, or Lightning Fabric's strategy reduces
        them (a step after ``fabric.backward(loss)``): it must not reduce them again (XLA204 and XLA202 step
        with ``opt.step()``, not ``xm.optimizer_step(opt)``)."""
        return any(node in decision.steps for decision in self.reductions) or self.fabric_update(node)  # type: ignore[attr-defined]


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


# Per update (issue 28) ----------------------------------------------------------------------------------------


def plan_reductions(model: StepModel) -> list[Reduction]:
    """The explicit reductions of a distributed script's training steps (the xm form with XLA406 running,
    or reductions the script already makes with ``xm._fetch_gradients``)."""
    ctx = model.ctx
    if not (ctx.distributed or ctx.facts.distributed):
        return []
    found: dict[tuple[cst.CSTNode, cst.CSTNode], Reduction] = {}
    for step in [*(s for s in model.loops.values() if s.kind == "train"), *helper_steps(model)]:
        for decision in step_reductions(model, step):
            if decision.already_reduced or (ctx.xm_form and ctx.runs("XLA406")):
                found.setdefault((decision.backward, decision.first_touch), decision)
    return list(found.values())


def helper_steps(model: StepModel) -> list[StepLoop]:
    """Functions of this module that run a backward and an update themselves while no training loop of this
    module calls them: a loss scaler's ``__call__`` or a ``train_step`` that another module's loop calls.
    Each is a step of its own (its ``loop`` is the function), so its update is reduced there as in a loop."""
    reached = {call for step in model.loops.values() for event in step.events for call in event.path}
    reached_functions = {model.callee(call) for call in reached} | set(model.step_functions)
    found = []
    for function, node in model.sites(STEP):
        if function is None or function in reached_functions or any(s.function is function for s in found):
            continue
        if any(model.function_of(loop.loop) is function for loop in model.loops.values()):
            continue  # it has a training loop of its own
        events = model.effects(function)
        if any(e.kind == BACKWARD and not e.nested for e in events):
            found.append(StepLoop(function, "train", function, Batches("none"), list(events)))  # type: ignore[arg-type]
    return found


def touches(model: StepModel, step: StepLoop) -> list[Event]:
    """The step's events that read or change the gradients before an update; and the calls between an update
    and its backward (in their one function) that the step model cannot follow but that are handed the
    model, its parameters or the optimizer (``utils.clip_gradients(model, clip)``, timm's
    ``dispatch_clip_grad``): they may read the gradients, so the reduction goes before them."""
    keeps_scaler = model.ctx.target.has_grad_scaler
    found = [e for e in step.events if not e.external and (
        e.kind in (CLIP, GRAD) or (keeps_scaler and e.kind == UNSCALE)
        or (keeps_scaler and e.kind == STEP and _is_scaler(model.ctx, _receiver(e.node))))]  # type: ignore[arg-type]
    for update, backward in update_backwards(model, step):
        if backward is not None and backward.path == update.path:
            found += [Event(GRAD, call, update.path, update.inner_loop)
                      for call in hidden_gradient_readers(model.ctx, backward.node, update.node)]
    return found


def update_backwards(model: StepModel, step: StepLoop) -> list[tuple[Event, Event | None]]:
    """Each update of the step (in execution order) with the backward whose gradients it steps: the last
    backward before it (None: no backward before it in the step)."""
    events = [e for e in step.events if not e.external]
    backwards = sorted((e for e in events if e.kind == BACKWARD), key=model._order)
    pairs = []
    for update in sorted((e for e in events if e.kind == STEP), key=model._order):
        before = [b for b in backwards if model._order(b) < model._order(update)]
        pairs.append((update, before[-1] if before else None))
    return pairs


def step_reductions(model: StepModel, step: StepLoop) -> list[Reduction]:
    """The reductions one training step needs, one per backward whose updates read their gradients first."""
    order = model._order
    events = [e for e in step.events if not e.external]
    fetches = [e for e in events if e.kind == FETCH]
    reads = touches(model, step)
    # backward -> (its updates that need the reduction, the reads before them, already reduced)
    groups: dict[cst.CSTNode, tuple[Event, list[Event], list[Event], bool]] = {}
    for update, backward in update_backwards(model, step):
        if backward is None:
            continue
        low, high = order(backward), order(update)
        between = [t for t in reads if low < order(t) <= high]
        fetched = any(low < order(f) < high for f in fetches)
        if not between and not fetched:
            continue
        _, updates, seen, reduced = groups.get(backward.node, (backward, [], [], False))
        groups[backward.node] = (backward, [*updates, update], [*seen, *between], reduced or fetched)
    return [_reduction(model, step, backward, updates, between, reduced)
            for backward, updates, between, reduced in groups.values()]


def _reduction(model: StepModel, step: StepLoop, backward: Event, updates: list[Event], between: list[Event],
               reduced: bool) -> Reduction:
    order = model._order
    touch = min(between, key=order) if between else backward
    # Both lie in the function where their call paths part.
    full_b = (*backward.path, backward.node)
    full_t = (*touch.path, touch.node)
    common = 0
    while common < min(len(full_b), len(full_t)) - 1 and full_b[common] is full_t[common]:
        common += 1
    prefix = full_b[:common]
    within: cst.CSTNode = step.loop if not prefix else model.callee(prefix[-1])  # type: ignore[assignment]
    optimizers: list[str] = []
    local: list[cst.CSTNode] = []
    for event in sorted(updates, key=order):
        full = (*event.path, event.node)
        if full[:common] == prefix and len(full) > common:
            local.append(full[common])
        if event.path != prefix:
            continue
        name = step_optimizer(model.ctx, event.node)  # type: ignore[arg-type]
        if name is not None and name not in optimizers:
            optimizers.append(name)
    return Reduction(step.loop, within, full_b[common], full_t[common], tuple(e.node for e in updates),  # type: ignore[arg-type]
                     tuple(optimizers), reduced, tuple(local))


# Calls between a backward and its update that may read the gradients -------------------------------------------

# Methods of a model or optimizer that do not read the gradients.
_SAFE_METHODS = frozenset({"zero_grad", "train", "eval", "state_dict", "parameters", "named_parameters", "modules",
                           "children", "to", "cuda", "cpu", "requires_grad_", "forward", "step", "append", "item",
                           "detach", "float", "half", "buffers", "named_buffers", "add_param_group"})
_SAFE_CALLS = ("builtins.print", "builtins.len", "builtins.isinstance", "builtins.range", "builtins.enumerate",
               "builtins.float", "builtins.int", "builtins.str", "builtins.max", "builtins.min", *CLIP_GRADS)


def hidden_gradient_readers(ctx: MigrationContext, backward: cst.CSTNode, update: cst.CSTNode) -> list[cst.Call]:
    """Calls between ``backward`` and ``update`` (in the function holding both) that the step model cannot
    follow and that are handed the model, its parameters, their gradients or the optimizer."""
    function = ctx.steps.function_of(update)
    root: cst.CSTNode = function if function is not None else ctx.module
    low, high = ctx.position(backward), ctx.position(update)
    found = []
    for call in patterns.find_all(root, lambda n: isinstance(n, cst.Call)):
        if not (low < ctx.position(call) < high) or ctx.steps.function_of(call) is not function:
            continue
        if _is_inside(ctx, call, backward) or _is_inside(ctx, call, update):
            continue
        if ctx.steps.callee(call) is not None or ctx.is_call_to(call, *_SAFE_CALLS) or is_model_call(call, ctx):
            continue
        method = call.func.attr.value if isinstance(call.func, cst.Attribute) else None
        receiver = patterns.dotted_name(call.func.value) if isinstance(call.func, cst.Attribute) else None
        if method in ("unscale_", "scale", "update", "get_scale") and _is_scaler(ctx, receiver):
            continue
        if receiver is not None and _holds_gradients(ctx, receiver) and method not in _SAFE_METHODS:
            found.append(call)
        elif any(_mentions_gradients(ctx, a.value) for a in call.args):
            found.append(call)
    return found


def _is_inside(ctx: MigrationContext, node: cst.CSTNode, container: cst.CSTNode) -> bool:
    current = ctx.parent(node)
    while current is not None:
        if current is container:
            return True
        current = ctx.parent(current)
    return False


def _holds_gradients(ctx: MigrationContext, name: str) -> bool:
    """A model or an optimizer, by what the script binds or by its name."""
    last = name.rsplit(".", 1)[-1]
    return (name in ctx.facts.optimizers or name in ctx.facts.ddp_models or bool(_MODEL_NAME.search(last))
            or bool(_OPTIMIZER_NAME.search(last)))


def _mentions_gradients(ctx: MigrationContext, node: cst.BaseExpression) -> bool:
    for part in patterns.find_all(node, lambda n: isinstance(n, (cst.Name, cst.Attribute, cst.Call))):
        if isinstance(part, cst.Call):
            if patterns.method_call(part, "parameters") or patterns.method_call(part, "named_parameters"):
                return True
            continue
        if isinstance(part, cst.Attribute) and part.attr.value == "grad":
            return True
        name = patterns.dotted_name(part)
        if name is not None and _holds_gradients(ctx, name):
            return True
    return False
