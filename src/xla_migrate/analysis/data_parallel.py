"""The data-parallel form of a distributed program (issue 28; DESIGN.md section 7) and the xm form's guarantee.

The xm form (the seeds' recipe: no DDP, ``xm.optimizer_step``) is right only when every optimizer update the
program can execute reduces its gradients exactly once, after the last backward that feeds it and before
anything reads them, and the replicas start from equal weights. ``--data-parallel auto`` (the default) takes
the xm form only where that is shown; the ddp form (DDP kept on the ``xla`` process group: it reduces in the
backward and broadcast the weights when it wrapped the model) everywhere else. Shown means, conservatively:

- the program (the file, or in a project the modules connected to it by imports; update_sites.py) makes one
  optimizer update and one backward, both in one module, builds one optimizer, wraps its model in DDP with a
  plain ``model = DDP(model, ...)`` statement (the xm form broadcasts ordinal 0's weights there), and reduces
  no gradients itself (no gradient hooks, no all-reduce over ``.grad``);
- in that module the step model sees the update in a training loop, with its backward in the same function
  (not a ``__call__``: a loss scaler object), in the same branch or one enclosing it, and no call between
  them that the step model cannot follow hands the model, its parameters or the optimizer to other code (a
  project ``clip_gradients(model)``, timm's ``dispatch_clip_grad``: it may read the gradients; the xm form
  asked for by name reduces before it, reductions.py);
- the update's reduction can be placed (``update_problems`` finds nothing).

Anything else gets the ddp form, and the report says why. ``update_problems`` is also what the xm form, when
asked for by name, reports per update it leaves unreduced or reduces only after a read (XLA413).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from ..syntax import patterns
from . import torchrun_script, update_sites
from .facts import is_optimizer_param_name
from .steps.collect import _is_scaler, _receiver, steps_itself
from .steps.kinds import BACKWARD, CLIP, GRAD, OPTIMIZER_STEP, STEP, UNSCALE
from .steps.reductions import helper_steps, hidden_gradient_readers, step_optimizer, step_reductions, touches

if TYPE_CHECKING:
    from ..engine.context import MigrationContext


@dataclass(frozen=True)
class Verdict:
    form: str  # "xm" or "ddp"
    reason: str


@dataclass(frozen=True)
class Problem:
    """An update the xm form would not reduce right: never reduced (``unreduced``), or reduced after its
    gradients were read, or twice."""

    node: cst.CSTNode
    message: str
    fix: str
    unreduced: bool = True


_FIX = "migrate with --data-parallel ddp (DDP reduces every update in the backward), or reduce it by hand"


def choose_form(ctx: MigrationContext, context_for: Callable[[str], MigrationContext | str] | None = None) -> Verdict:
    """The form ``--data-parallel auto`` gives this distributed file: the same for every module of its program.
    ``context_for(rel)``: the analysis of another file of the project (the engine's; or why it has none), for
    the module that holds the program's update."""
    rel, program = _program(ctx)
    if ctx.target.torchrun_rendezvous:
        script = torchrun_module_script(ctx)
        if script is not None:
            return Verdict("ddp", script)
    doubt, owner = program_doubt(program)
    if doubt is not None:
        return Verdict("ddp", doubt)
    if owner is None:
        return Verdict("xm", "no optimizer update to reduce")
    if owner == rel:
        return owner_verdict(ctx, rel)
    if context_for is None:
        return Verdict("ddp", f"the update is in {owner}, which is not analysed here")
    return _owner_verdict_elsewhere(ctx, owner, context_for)


def torchrun_module_script(ctx: MigrationContext) -> str | None:
    """Why the program is a torchrun script run at module level (torchrun_script.py), or None: the xm form has no
    function to launch on each worker there, so under torchrun each process would train alone. In a project, any
    module of the program that no other module imports (a script, not a helper) counts."""
    project = ctx.project
    if project is None:
        found = [("", torchrun_script.module_level_rendezvous(ctx.input_code))]
    else:
        index = project.index
        found = [(other, torchrun_script.module_level_rendezvous_of_file(os.path.join(index.root, other)))
                 for other in index.component(project.rel) if not index.importers(other)]
    for rel, rendezvous in found:
        if rendezvous is not None:
            at = f"{rel}:{rendezvous.line}" if rel else f"line {rendezvous.line}"
            return (f"a torchrun script whose training code runs at module level ({at}: {rendezvous.what}) with "
                    "no function to launch on each XLA worker: in the xm form each torchrun process would be a "
                    "world-size-1 job (all masters, nothing reduced across them); the ddp form keeps torchrun's "
                    "rendezvous (xla://)")
    return None


def _program(ctx: MigrationContext) -> tuple[str, update_sites.Program]:
    project = ctx.project
    if project is not None:
        return project.rel, update_sites.program_of(project.index, project.rel)
    return "", update_sites.Program({"": update_sites.summarize(ctx.input_code)})


def program_doubt(program: update_sites.Program) -> tuple[str | None, str | None]:
    """(why the xm form's guarantee cannot be shown for the program, or None; the module holding its one
    update, or None when it has none)."""
    updates, backwards = program.sites("updates"), program.sites("backwards")
    own = program.sites("own_reductions")
    if own:
        rel, site = own[0]
        return (f"the program reduces gradients itself ({_at(rel, site)} {site.what}): the xm form would "
                "reduce them a second time"), None
    modules = sorted({rel for rel, _ in updates + backwards})
    if len(modules) > 1:
        listed = ", ".join(_at(rel, site) for rel, site in (updates + backwards)[:4])
        return f"the backward passes and updates are spread over {len(modules)} modules ({listed})", None
    if len(updates) > 1:
        listed = ", ".join(f"{_at(rel, site)} {site.what}" for rel, site in updates[:4])
        return f"{len(updates)} optimizer updates ({listed})", None
    optimizers = program.sites("optimizers")
    if len(optimizers) > 1:
        listed = ", ".join(_at(rel, site) for rel, site in optimizers[:4])
        return f"{len(optimizers)} optimizers ({listed})", None
    wraps = program.sites("ddp_wraps")
    if not updates:
        if backwards:
            rel, site = backwards[0]
            return f"a backward pass ({_at(rel, site)}) whose update is not in sight", None
        if wraps:
            rel, (site, _) = wraps[0]
            return f"DDP wraps a model ({_at(rel, site)}) whose update is not in sight", None
        return None, None
    if len(backwards) != 1:
        return f"{len(backwards)} backward passes for one update", None
    if not wraps:
        return ("no DistributedDataParallel wrapper: the xm form would have no place to broadcast the initial "
                "weights from"), None
    inline = [(rel, site) for rel, (site, plain) in wraps if not plain]
    if inline:
        rel, site = inline[0]
        return f"DDP wraps the model inside an expression ({_at(rel, site)})", None
    return None, modules[0]


def _at(rel: str, site: update_sites.Site) -> str:
    return f"{rel}:{site.line}" if rel else f"line {site.line}"


_ELSEWHERE: dict[tuple, Verdict] = {}


def _owner_verdict_elsewhere(ctx: MigrationContext, owner: str,
                             context_for: Callable[[str], MigrationContext | str]) -> Verdict:
    """The owner module's verdict, for another module of its program (cached per process: every module of
    the program asks the same)."""
    path = os.path.join(ctx.project.index.root, owner)
    try:
        stat = os.stat(path)
    except OSError:
        return Verdict("ddp", f"cannot read {owner}, which holds the update")
    key = (path, stat.st_size, stat.st_mtime_ns, ctx.target.name)
    if key not in _ELSEWHERE:
        found = context_for(owner)
        _ELSEWHERE[key] = Verdict("ddp", found) if isinstance(found, str) else owner_verdict(found, owner)
    return _ELSEWHERE[key]


def owner_verdict(ctx: MigrationContext, rel: str = "") -> Verdict:
    """The verdict of the module holding the program's one update (checked with the step model); ``rel`` names
    it in a project (every module of the program then gives the same reason)."""
    model = ctx.steps

    def at(node: cst.CSTNode) -> str:
        line = ctx.position(node)[0]
        return f"{rel}:{line}" if rel else f"line {line}"

    problems = update_problems(ctx)
    if problems:
        first = problems[0]
        return Verdict("ddp", f"{at(first.node)}: {first.message}")
    updates = [node for _, node in model.sites(STEP)]
    backwards = [node for _, node in model.sites(BACKWARD)]
    if len(updates) != 1 or len(backwards) != 1:
        where = f" in {rel}" if rel else " in this module"
        return Verdict("ddp", f"{len(updates)} updates and {len(backwards)} backward passes{where}")
    update, backward = updates[0], backwards[0]
    found = _loop_event(ctx, update)
    if found is None:
        function = model.function_of(update)
        name = f"{model.class_of(function)}.{function.name.value}" if function is not None and model.class_of(
            function) else (function.name.value if function is not None else "the module's code")
        return Verdict("ddp", f"{at(update)}: the update runs in {name}, which no training loop of its module "
                              "calls (a helper another module's loop calls)")
    step, event = found
    if any(e.external for e in step.events):
        return Verdict("ddp", f"{at(update)}: the training step calls another module's backward or update")
    partner = next((e for e in step.events if e.kind == BACKWARD and e.node is backward), None)
    if partner is None or partner.path != event.path:
        return Verdict("ddp", f"{at(update)}: the backward and the update are in different functions")
    called = [model.callee(call) for call in event.path]
    holder = called[-1] if called else step.function
    if any(f is not None and f.name.value == "__call__" for f in called):
        return Verdict("ddp", f"{at(update)}: the update runs in an object's __call__ (a loss scaler)")
    if model._order(partner) >= model._order(event):
        return Verdict("ddp", f"{at(update)}: the update comes before its backward")
    if not _same_or_enclosing_branch(ctx, backward, update):
        return Verdict("ddp", f"{at(update)}: the backward and the update are in different branches")
    readers = hidden_gradient_readers(ctx, backward, update)
    if readers:
        return Verdict("ddp", f"{at(readers[0])}: {_code(readers[0])} is handed the model or the optimizer between "
                              "the backward and the update: it may read the gradients")
    where = f"{holder.name.value}()" if holder is not None else "the module's code"
    return Verdict("xm", f"one update ({at(update)}: {_code(update)}) after its backward in {where}: reduced "
                         "once; weights broadcast from ordinal 0")


def update_problems(ctx: MigrationContext) -> list[Problem]:
    """Per optimizer update of this module, what the xm form leaves wrong: an update nothing reduces, one
    reduced only after its gradients were read, one whose explicit reduction cannot be placed."""
    model = ctx.steps
    problems: list[Problem] = []
    for function, update in sorted(model.sites(STEP), key=lambda pair: ctx.position(pair[1])):
        assert isinstance(update, cst.Call)
        if ctx.is_call_to(update, OPTIMIZER_STEP) or steps_itself(ctx, update):
            continue  # already torch_xla's reducing step (or ignite's auto_optim optimizer, whose step is one)
        found = _loop_event(ctx, update) or _helper_event(ctx, update)
        if found is None:
            problems += _outside_loops(ctx, function, update)
            continue
        step, event = found
        reduction = next((r for r in step_reductions(model, step) if update in r.steps), None)
        if reduction is not None:
            name = step_optimizer(ctx, update)
            if name is None or name not in reduction.optimizers:
                problems.append(Problem(update, f"{_code(update)}: the all-reduce of its gradients cannot be placed "
                                        "right after the backward that feeds it", _FIX))
            continue
        if _is_scaler(ctx, _receiver(update)) and ctx.target.has_grad_scaler:
            problems.append(Problem(update, f"{_code(update)} steps the local gradients: no backward before it in "
                                    "its step, so nothing all-reduces them", _FIX))
            continue
        if not is_rewritten_step(ctx, update):
            problems.append(Problem(update, f"{_code(update)} is not taken for an optimizer step: it stays as it "
                                    "is and steps the local gradients", _FIX))
    return problems


def _outside_loops(ctx: MigrationContext, function, update: cst.Call) -> list[Problem]:
    """An update no training loop of this module reaches (a helper another module calls, a ``__call__``
    whose loop is elsewhere): only a rewritten step reduces it, and only if nothing read the gradients first."""
    if _is_scaler(ctx, _receiver(update)) and ctx.target.has_grad_scaler:
        return [Problem(update, f"{_code(update)} steps the local gradients: its loop is in another module, so "
                        "no all-reduce is placed before it", _FIX)]
    if not is_rewritten_step(ctx, update):
        return [Problem(update, f"{_code(update)} is not taken for an optimizer step: it stays as it is and steps "
                        "the local gradients", _FIX)]
    model = ctx.steps
    reads = [node for kind in (CLIP, GRAD, UNSCALE) for f, node in model.sites(kind)
             if f is function and (kind != UNSCALE or ctx.target.has_grad_scaler)]
    reads = [n for n in reads if ctx.position(n) < ctx.position(update)]
    backwards = [n for f, n in model.sites(BACKWARD) if f is function and ctx.position(n) < ctx.position(update)]
    problems = [Problem(read, f"{_code(read)} reads or changes the local gradients before {_code(update)} "
                        "all-reduces them (in xm.optimizer_step): each replica clips by its own norm", _FIX)
                for read in reads[:1]]
    if backwards and not problems:
        problems = [Problem(reader, f"{_code(reader)} may read or change the local gradients before "
                            f"{_code(update)} all-reduces them (in xm.optimizer_step)", _FIX)
                    for reader in hidden_gradient_readers(ctx, backwards[-1], update)]
    return problems


def is_rewritten_step(ctx: MigrationContext, update: cst.Call) -> bool:
    """XLA204 (or XLA202, a scaler's step on a target without one) makes this an ``xm.optimizer_step``."""
    method = patterns.method_call(update, "step")
    if method is None:
        return False
    receiver = patterns.dotted_name(method.value)
    if receiver is None:
        return False
    if _is_scaler(ctx, receiver):
        return not ctx.target.has_grad_scaler
    return optimizer_receiver(ctx, receiver, method.value, update)


def optimizer_receiver(ctx: MigrationContext, spelling: str, receiver: cst.BaseExpression,
                       call: cst.Call | None = None) -> bool:
    """``spelling.step()`` steps an optimizer (XLA204 rewrites it): a name or ``self`` attribute bound to an
    optimizer, one named like one (``optimizer``, ``g_optimizer``), a parameter named so whose function
    receives an optimizer; in a distributed script also any step the step model counts as a training loop's
    update (``self.opt.step()`` after its backward), since in the xm form an update left as it is steps the
    local gradients."""
    facts = ctx.facts
    if spelling in facts.scalers or spelling in facts.loaders:
        return False
    last = spelling.rsplit(".", 1)[-1]
    if spelling in facts.optimizers or last == "optimizer" or last.endswith("_optimizer"):
        return True
    if isinstance(receiver, cst.Name) and is_optimizer_param_name(spelling) and any(
            spelling in facts.optimizer_params.get(scope, ()) for scope in ctx.visible_scopes(receiver)):
        return True
    return call is not None and ctx.distributed and _loop_event(ctx, call) is not None


def _loop_event(ctx: MigrationContext, update: cst.CSTNode):
    for step in ctx.steps.loops.values():
        if step.kind != "train":
            continue
        for event in step.events:
            if event.kind == STEP and event.node is update and not event.external:
                return step, event
    return None


def _helper_event(ctx: MigrationContext, update: cst.CSTNode):
    for step in helper_steps(ctx.steps):
        for event in step.events:
            if event.kind == STEP and event.node is update and not event.external and not event.path:
                return step, event
    return None


def _same_or_enclosing_branch(ctx: MigrationContext, backward: cst.CSTNode, update: cst.CSTNode) -> bool:
    """The backward's block, or the block of the loops around it (micro-steps), is the update's or one around
    it (the update under an accumulation's ``if``): both run on one path, no ``if`` chooses between them."""
    block = _block_of(ctx, backward)
    while block is not None:
        current = ctx.parent(update)
        while current is not None:
            if current is block:
                return True
            current = ctx.parent(current)
        owner = ctx.parent(block)
        if not isinstance(owner, (cst.For, cst.While)) or owner.body is not block:
            return False
        block = _block_of(ctx, owner)
    return False


def _block_of(ctx: MigrationContext, node: cst.CSTNode) -> cst.CSTNode | None:
    current = ctx.parent(node)
    while current is not None and not isinstance(current, (cst.IndentedBlock, cst.SimpleStatementSuite, cst.Module)):
        current = ctx.parent(current)
    return current


def _code(node: cst.CSTNode) -> str:
    text = " ".join(patterns.code_of(node).split())
    return text if len(text) <= 60 else text[:57] + "..."


__all__ = ["Problem", "Verdict", "choose_form", "owner_verdict", "update_problems", "touches"]
