"""Helpers the distributed rules (XLA401-XLA410) share: which rules run, rank reads and master guards, fresh
names. Not a rule. The gradient-reduction decision (which training steps all-reduce their gradients
explicitly, XLA406, and so must not reduce again in the step, XLA204/XLA202) is the step model's
(``xla_migrate.analysis.steps``: ``ctx.steps.reductions``).
"""

from __future__ import annotations

import re
import weakref

import libcst as cst

from xla_migrate.syntax import patterns
from xla_migrate.engine.context import MigrationContext
from xla_migrate.transforms.common import fresh_name  # noqa: F401 - the distributed rules' own name

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


def neutral_argument(ctx: MigrationContext, keyword: str, value: cst.BaseExpression) -> bool:
    """A collective's argument that asks for nothing an xm collective does not do: ``async_op=False``,
    ``group=None`` or the default group (``group=dist.group.WORLD``)."""
    if keyword == "async_op":
        return patterns.dotted_name(value) == "False"
    if keyword == "group":
        if patterns.dotted_name(value) == "None":
            return True
        return any(q in ("torch.distributed.group.WORLD", "torch.distributed.distributed_c10d.group.WORLD",
                         "torch.distributed.GroupMember.WORLD") for q in ctx.qualnames(value))
    return False


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
    from xla_migrate.analysis.facts import environment_variable

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
    if isinstance(node, cst.Name) and not is_process_rank(ctx, node):
        return None
    if GLOBAL_RANK_NAME.match(last):
        return "global"
    if LOCAL_RANK_NAME.match(last):
        return "local"
    return None


def is_process_rank(ctx: MigrationContext, name: cst.Name) -> bool:
    """A variable named like a rank holds a process rank, by where its value comes from: not inside a loop
    that binds it (``for rank, item in enumerate(ranking):``), nor when every binding of it in the scope that
    holds it is a loop or comprehension target, or an assignment from something that is no rank (``rank =
    order[i]``). A
    parameter, a constant, a rank read (``os.environ["RANK"]``, ``dist.get_rank()``), a rank-named value
    (``args.rank``, ``utils.get_rank()``) or any other binding keeps it a rank."""
    current = ctx.parent(name)
    while current is not None and not isinstance(current, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
        # Inside a loop that binds the name, the loop's value reaches the use (for rank, x in enumerate(...)).
        if isinstance(current, cst.For) and patterns.find_all(
                current.target, lambda n: isinstance(n, cst.Name) and n.value == name.value):
            return False
        current = ctx.parent(current)
    for scope in ctx.visible_scopes(name):
        bindings = [a.node for a in scope.assignments[name.value]]
        if not bindings:
            continue
        return not all(_binds_no_rank(ctx, binding) for binding in bindings)
    return True  # a global of another module, a builtin: taken as named


def _binds_no_rank(ctx: MigrationContext, binding: cst.CSTNode) -> bool:
    current, parent = binding, ctx.parent(binding)
    while isinstance(parent, (cst.Element, cst.StarredElement, cst.Tuple, cst.List)):
        current, parent = parent, ctx.parent(parent)
    if isinstance(parent, (cst.For, cst.CompFor)) and parent.target is current:
        return True
    if isinstance(parent, cst.AssignTarget):
        assign = ctx.parent(parent)
        return isinstance(assign, cst.Assign) and not _rank_source(ctx, assign.value)
    return False


def _rank_source(ctx: MigrationContext, value: cst.BaseExpression) -> bool:
    """``value`` may carry a process rank: a constant, a rank read, something named like a rank or ordinal."""
    if isinstance(value, (cst.Integer, cst.UnaryOperation)):
        return True
    for part in patterns.find_all(value, lambda n: isinstance(n, (cst.Name, cst.Attribute, cst.Subscript, cst.Call))):
        if rank_read(ctx, part) is not None:
            return True
        if isinstance(part, (cst.Name, cst.Attribute)):
            last = (patterns.dotted_name(part) or "").rsplit(".", 1)[-1].lower()
            if "rank" in last or "ordinal" in last or last in ("gpu", "local_gpu", "device_id", "index"):
                return True
    return False


def _int_value(node: cst.BaseExpression) -> int | None:
    if isinstance(node, cst.Integer):
        return int(node.value)
    text = patterns.string_value(node)  # os.getenv("RANK", "0") == "0"
    if text is not None and text.lstrip("-").isdigit():
        return int(text)
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


# Context -> the launcher calls of its module (mp.spawn, xmp.spawn, torch_xla.launch), by the function holding them.
_LAUNCHES: weakref.WeakKeyDictionary[MigrationContext, dict] = weakref.WeakKeyDictionary()


def before_launch(ctx: MigrationContext, node: cst.CSTNode) -> bool:
    """Code that runs in the launcher's process, before the spawn: at module level (an argparse default in the
    ``__main__`` block, a global) in a script whose ``__main__`` block launches the workers, or in the function
    that calls the launcher (``mp.spawn``, ``xmp.spawn``), before that call. Reading the XLA ordinal or world
    size there, or a rendezvous, starts the runtime before the spawn ("Runtime is already initialized")."""
    from libcst.metadata import GlobalScope

    launches = _launches(ctx).get(_function_of(ctx, node), [])
    if any(ctx.position(launch) > ctx.position(node) for launch in launches):
        return True
    if ctx.facts.main_guard is None:
        return False  # a module-level script: its top level is the worker (XLA407 wraps or reports it)
    return isinstance(ctx.function_scope(node), GlobalScope)


def _launches(ctx: MigrationContext) -> dict[cst.FunctionDef | None, list[cst.Call]]:
    if ctx not in _LAUNCHES:
        from xla_migrate.analysis.launcher_side import LAUNCH_CALLS

        found: dict[cst.FunctionDef | None, list[cst.Call]] = {}
        for call in patterns.find_all(ctx.module, lambda n: isinstance(n, cst.Call) and bool(
                ctx.qualnames(n.func) & LAUNCH_CALLS)):
            found.setdefault(_function_of(ctx, call), []).append(call)
        _LAUNCHES[ctx] = found
    return _LAUNCHES[ctx]


def _function_of(ctx: MigrationContext, node: cst.CSTNode) -> cst.FunctionDef | None:
    current = ctx.parent(node)
    while current is not None and not isinstance(current, cst.FunctionDef):
        current = ctx.parent(current)
    return current


def launcher_side_inits(ctx: MigrationContext) -> list[cst.Call]:
    """``init_process_group(...)`` statements that run in the launcher's process, before an XLA launch that the
    migration writes (the ddp form of a torchrun script under xmp.spawn): the group belongs in each worker."""
    if not (ctx.ddp_form and ctx.xla_launched):
        return []
    if ctx not in _LAUNCHER_INITS:
        _LAUNCHER_INITS[ctx] = [
            node for node in patterns.find_all(ctx.module, lambda n: dist_call(ctx, n, "init_process_group") is not None)
            if before_launch(ctx, node) and isinstance(ctx.parent(node), cst.Expr)]
    return _LAUNCHER_INITS[ctx]


_LAUNCHER_INITS: weakref.WeakKeyDictionary[MigrationContext, list[cst.Call]] = weakref.WeakKeyDictionary()
