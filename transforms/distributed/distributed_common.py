"""Helpers the distributed rules (XLA401-XLA409) share, and the gradient-reduction decision that XLA406,
XLA204 and XLA202 consult. Not a rule.

The reduction decision: in a distributed script, a training loop whose gradients are read or changed
between ``backward()`` and the optimizer step (AMP ``scaler.unscale_``, ``clip_grad_norm_``, ``p.grad``, or
the seeds' ``scaler.step`` that unscales and checks them) gets an explicit
``gradients = xm._fetch_gradients(opt)`` + ``xm.all_reduce('sum', gradients, scale=1.0/world)`` right after
the backward (XLA406); its steps then must not reduce again, so XLA204 leaves ``optimizer.step()`` as it is
and XLA202 (targets without a GradScaler) turns ``scaler.step(opt)`` into ``opt.step()``, not
``xm.optimizer_step(opt)``. Every other step reduces through ``xm.optimizer_step``. A loop that already
all-reduces its fetched gradients (a migrated script) counts as explicit too, so a second migration changes
nothing.
"""

from __future__ import annotations

import re
import weakref
from dataclasses import dataclass, field

import libcst as cst

from xla_migrate import patterns
from xla_migrate.context import MigrationContext

CLIP_GRADS = ("torch.nn.utils.clip_grad_norm_", "torch.nn.utils.clip_grad_value_", "torch.nn.utils.clip_grad_norm",
              "torch.nn.utils.clip_grad.clip_grad_norm_", "torch.nn.utils.clip_grad.clip_grad_value_")
FETCH_GRADIENTS = "torch_xla.core.xla_model._fetch_gradients"
XLA_ALL_REDUCE = "torch_xla.core.xla_model.all_reduce"
DIST = "torch.distributed."

# Rules that registered themselves on a context (constructed before the traversal starts), so a rule can
# tell whether another one runs: code -> contexts.
_ACTIVE: dict[str, weakref.WeakSet[MigrationContext]] = {}


def register(ctx: MigrationContext, code: str) -> None:
    _ACTIVE.setdefault(code, weakref.WeakSet()).add(ctx)


def active(ctx: MigrationContext, code: str) -> bool:
    return ctx in _ACTIVE.get(code, ())


def free_imports(rule, node: cst.Call) -> None:
    """The imports a rewritten ``torch.distributed`` call may leave unused (``import torch.distributed as
    dist``, ``from torch.distributed import init_process_group``): removed at the end if nothing uses them."""
    from xla_migrate.transforms.common import imported_from

    rule.import_may_be_dead("torch.distributed", None)
    rule.import_may_be_dead("torch", "distributed")
    for qualname in rule.ctx.qualnames(node.func):
        if qualname.startswith(DIST):
            for module, name in imported_from(rule.ctx, node.func, qualname):
                rule.import_may_be_dead(module, name)


def dist_call(ctx: MigrationContext, node: cst.CSTNode, *names: str) -> str | None:
    """The ``torch.distributed`` function ``node`` calls (``get_rank``), when it is one of ``names``."""
    if not isinstance(node, cst.Call):
        return None
    for qualname in ctx.qualnames(node.func):
        for prefix in (DIST, DIST + "distributed_c10d."):
            if qualname.startswith(prefix) and qualname[len(prefix):] in names:
                return qualname[len(prefix):]
    return None


# Rank reads ---------------------------------------------------------------------------------------------
ENV_CONCEPTS = {"LOCAL_RANK": "local_ordinal", "RANK": "ordinal", "WORLD_SIZE": "world_size"}
DIST_CONCEPTS = {"get_rank": "ordinal", "get_world_size": "world_size", "get_node_local_rank": "local_ordinal"}
# Names that hold a (local) rank used as a CUDA device index: `model.to(local_rank)`.
RANK_INDEX_NAME = re.compile(r"^(local_rank|rank|gpu|gpu_id|local_gpu|device_id)$")
# Names of a rank in a `rank == 0` guard: global and local.
GLOBAL_RANK_NAME = re.compile(r"^(rank|global_rank|world_rank)$")
LOCAL_RANK_NAME = re.compile(r"^(local_rank)$")


def outer_int(ctx: MigrationContext, node: cst.BaseExpression) -> cst.BaseExpression:
    """``int(node)`` when ``node`` is the only argument of an ``int()`` call, else ``node``."""
    arg = ctx.parent(node)
    call = ctx.parent(arg) if isinstance(arg, cst.Arg) else None
    if isinstance(call, cst.Call) and ctx.is_call_to(call, "builtins.int") and len(call.args) == 1:
        return call
    return node


def rank_read(ctx: MigrationContext, node: cst.CSTNode) -> str | None:
    """The target concept a rank or world-size read stands for: ``os.environ["LOCAL_RANK"]``,
    ``os.environ.get("RANK")``, ``os.getenv("WORLD_SIZE")``, ``dist.get_rank()`` (no group)."""
    from xla_migrate.facts import environment_variable

    variable = environment_variable(node, ctx.qualnames)
    if variable in ENV_CONCEPTS:
        return ENV_CONCEPTS[variable]
    name = dist_call(ctx, node, *DIST_CONCEPTS)
    if name is not None and isinstance(node, cst.Call) and not node.args:
        return DIST_CONCEPTS[name]
    return None


def master_kind(ctx: MigrationContext, node: cst.BaseExpression) -> str | None:
    """``"global"`` or ``"local"`` when ``node`` is a rank whose zero means the master."""
    concept = rank_read(ctx, node.args[0].value if isinstance(node, cst.Call) and ctx.is_call_to(
        node, "builtins.int") and len(node.args) == 1 else node)
    if concept == "ordinal":
        return "global"
    if concept == "local_ordinal":
        return "local"
    name = patterns.dotted_name(node)
    if name is None:
        return None
    last = name.rsplit(".", 1)[-1]
    if GLOBAL_RANK_NAME.match(last):
        return "global"
    if LOCAL_RANK_NAME.match(last):
        return "local"
    return None


def _int_value(node: cst.BaseExpression) -> int | None:
    if isinstance(node, cst.Integer):
        return int(node.value)
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus) and isinstance(
            node.expression, cst.Integer):
        return -int(node.expression.value)
    return None


def master_guard(ctx: MigrationContext, node: cst.Comparison) -> tuple[str, bool] | None:
    """(kind, negated) for ``rank == 0``, ``0 == rank``, ``rank != 0``, ``local_rank in (-1, 0)``,
    ``local_rank <= 0``, ``rank > 0``; None for anything else."""
    if len(node.comparisons) != 1:
        return None
    target = node.comparisons[0]
    left, right, op = node.left, target.comparator, target.operator
    if _int_value(left) == 0 and isinstance(op, (cst.Equal, cst.NotEqual)):
        left, right = right, left
    kind = master_kind(ctx, left)
    if kind is None:
        return None
    value = _int_value(right)
    if isinstance(op, cst.Equal) and value == 0:
        return kind, False
    if isinstance(op, cst.NotEqual) and value == 0:
        return kind, True
    if isinstance(op, cst.LessThanEqual) and value == 0:
        return kind, False
    if isinstance(op, cst.GreaterThan) and value == 0:
        return kind, True
    if isinstance(op, (cst.In, cst.NotIn)) and isinstance(right, (cst.Tuple, cst.List, cst.Set)):
        values = {_int_value(e.value) for e in right.elements}
        if values in ({0}, {-1, 0}):
            return kind, isinstance(op, cst.NotIn)
    return None


# The gradient-reduction decision ----------------------------------------------------------------------------
@dataclass
class LoopReduction:
    loop: cst.For | cst.While
    backward: cst.Call
    first_touch: cst.CSTNode
    steps: list[cst.Call] = field(default_factory=list)
    optimizers: list[str] = field(default_factory=list)
    already_reduced: bool = False


_DECISIONS: weakref.WeakKeyDictionary[MigrationContext, list[LoopReduction]] = weakref.WeakKeyDictionary()


def _walk(node: cst.CSTNode, visit) -> None:
    """Pre-order walk below ``node``, not into nested functions or classes."""
    for child in node.children:
        if isinstance(child, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            continue
        visit(child)
        _walk(child, visit)


def step_optimizer(ctx: MigrationContext, node: cst.Call) -> str | None:
    """The optimizer a step call steps: ``opt.step()`` -> ``opt``, ``scaler.step(opt)`` -> ``opt``."""
    method = patterns.method_call(node, "step")
    if method is None:
        return None
    receiver = patterns.dotted_name(method.value)
    if receiver is not None and receiver in ctx.facts.scalers or (receiver and "scaler" in receiver.lower()):
        args = patterns.positional(node)
        return patterns.dotted_name(args[0].value) if len(args) == 1 else None
    return receiver


def is_scaler_call(ctx: MigrationContext, node: cst.CSTNode, *methods: str) -> bool:
    method = patterns.method_call(node, *methods)
    if method is None:
        return False
    receiver = patterns.dotted_name(method.value)
    return receiver is not None and (receiver in ctx.facts.scalers or "scaler" in receiver.rsplit(".", 1)[-1].lower())


def _decide(ctx: MigrationContext) -> list[LoopReduction]:
    from xla_migrate import loops

    decisions: list[LoopReduction] = []
    keeps_scaler = ctx.target.has_grad_scaler
    for loop in ctx.facts.training_loops:
        backwards: list[cst.Call] = []
        steps: list[cst.Call] = []
        touches: list[cst.CSTNode] = []
        reduced = False

        def visit(node: cst.CSTNode) -> None:
            nonlocal reduced
            if isinstance(node, cst.Call):
                names = ctx.qualnames(node.func)
                if FETCH_GRADIENTS in names or XLA_ALL_REDUCE in names:
                    reduced = reduced or FETCH_GRADIENTS in names
                if patterns.method_call(node, "backward"):
                    backwards.append(node)
                elif patterns.method_call(node, "step") and loops.is_optimizer_step(ctx, node):
                    steps.append(node)
                    if keeps_scaler and is_scaler_call(ctx, node, "step"):
                        touches.append(node)
                elif names & set(CLIP_GRADS) or (keeps_scaler and is_scaler_call(ctx, node, "unscale_")):
                    touches.append(node)
            elif isinstance(node, cst.Attribute) and node.attr.value == "grad":
                touches.append(node)

        _walk(loop.body, visit)
        if not backwards or not steps:
            continue
        first_backward = min(backwards, key=ctx.position)
        start = ctx.position(first_backward)
        after = [t for t in touches if ctx.position(t) > start]
        last_step = max(ctx.position(s) for s in steps)
        between = [t for t in after if ctx.position(t) <= last_step]
        if not between and not reduced:
            continue
        touch = min(between, key=ctx.position) if between else first_backward
        backward = max((b for b in backwards if ctx.position(b) < ctx.position(touch)), key=ctx.position,
                       default=first_backward)
        optimizers: list[str] = []
        for step in sorted(steps, key=ctx.position):
            name = step_optimizer(ctx, step)
            if name is not None and name not in optimizers:
                optimizers.append(name)
        decisions.append(LoopReduction(loop, backward, touch, steps, optimizers, reduced))
    return decisions


def reductions(ctx: MigrationContext) -> list[LoopReduction]:
    """The training loops whose gradients are (or will be) all-reduced explicitly; decided once per run."""
    if ctx not in _DECISIONS:
        decided = _decide(ctx) if ctx.distributed or ctx.facts.distributed else []
        # Without XLA406 in the run nothing is inserted: only loops that already reduce count.
        _DECISIONS[ctx] = [d for d in decided if d.already_reduced or (ctx.distributed and active(ctx, "XLA406"))]
    return _DECISIONS[ctx]


def explicitly_reduced_step(ctx: MigrationContext, node: cst.Call) -> bool:
    """This step follows an explicit all_reduce of the gradients: it must not reduce them again (XLA204 and
    XLA202 step with ``opt.step()``, not ``xm.optimizer_step(opt)``)."""
    return any(node in decision.steps for decision in reductions(ctx))


def fresh_name(ctx: MigrationContext, node: cst.CSTNode, name: str) -> str:
    """``name``, prefixed with ``xla_`` until no scope visible at ``node`` binds it."""
    while any(name in scope for scope in ctx.visible_scopes(node)):
        name = "xla_" + name
    return name
