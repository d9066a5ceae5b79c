"""The step model: what one training (or evaluation) step does, for every loop that runs device work per
iteration. Computed once per module, after the facts pass, from one read-only walk; the loop rules (XLA301,
XLA302, XLA310, XLA311, XLA313, XLA406, ...) ask it and never walk the tree themselves.

Per loop it knows the batches (a DataLoader, a device loader, ``next(it)``, a batch function), the forward
calls, the backward calls, the update (optimizer ``step``, ``scaler.step``/``update``, ``zero_grad``,
schedulers), the gradient reads between them (``unscale_``, clipping, ``p.grad``), existing barriers and step
closures, and the host reads, each with its call path: events in functions the loop calls are followed
(module-level and nested functions, methods through ``self``, objects of the module's own classes and their
``__call__``), so a loop whose backward and step happen in ``self.train_step(batch)`` or in a loss-scaler
object's ``__call__`` is a training loop like any other.

Kinds of loop:

- training loop: its step runs an optimizer update and a backward pass. The backward may sit in nested loops
  (micro-steps: gradient accumulation) or the update under ``if (i + 1) % k == 0:`` (accumulation by guard);
  a loop that calls backward with no update in sight is a training loop whose update is unknown.
- evaluation loop: no backward, a model forward per iteration (``model(x)``, ``self.net(x)``, in a callee too).
- micro-step loop: the nested loop of an accumulating training loop; it is part of that loop's step.

The barrier (XLA302) goes after the update, so one graph runs per optimizer step; an evaluation loop gets it
per batch. The device loader (XLA301) marks the step at every batch, so a loop that accumulates by a guard gets
the barrier instead (a device loader would run one graph per micro-step).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import libcst as cst

from ..syntax import patterns
from .facts import DATALOADERS, DEVICE_LOADERS

if TYPE_CHECKING:
    from ..engine.context import MigrationContext

Loop = cst.For | cst.While
Function = cst.FunctionDef | None  # None: the module's own code

STEP_BARRIERS = ("torch_xla.core.xla_model.mark_step", "torch_xla.sync")
OPTIMIZER_STEP = "torch_xla.core.xla_model.optimizer_step"
STEP_CLOSURES = ("torch_xla.core.xla_model.add_step_closure",)
FETCH_GRADIENTS = "torch_xla.core.xla_model._fetch_gradients"
XLA_ALL_REDUCE = "torch_xla.core.xla_model.all_reduce"
CLIP_GRADS = ("torch.nn.utils.clip_grad_norm_", "torch.nn.utils.clip_grad_value_", "torch.nn.utils.clip_grad_norm",
              "torch.nn.utils.clip_grad.clip_grad_norm_", "torch.nn.utils.clip_grad.clip_grad_value_")
# Calls that pass an iterable through (the loader is their first argument).
PASS_THROUGH = ("builtins.enumerate", "tqdm.tqdm", "tqdm.auto.tqdm", "tqdm.notebook.tqdm", "tqdm.std.tqdm")
# Methods that copy a tensor's value to the host, and conversions that do when given a tensor.
READ_METHODS = ("item", "tolist", "cpu", "numpy")
CONVERSIONS = ("builtins.float", "builtins.int", "builtins.bool")
# Attributes of a tensor known without running the graph.
STATIC_ATTRIBUTES = ("shape", "dtype", "device", "size", "ndim", "dim", "requires_grad", "numel", "grad_fn",
                     "is_leaf", "names", "layout")
LOG_METHODS = ("info", "debug", "warning", "warn", "error", "critical", "exception", "log", "add_scalar",
               "add_scalars", "log_metric", "log_metrics", "set_postfix", "set_postfix_str", "set_description",
               "write")
# A call's callee name that says it produces tensors: outputs = model(x), loss = criterion(out, y).
_TENSOR_CALLEES = ("model", "criterion", "loss", "net", "forward", "encoder", "decoder")
# A callee that is a model: model(x), self.net(x), ddp_model(x), backbone(x) (not model.parameters()).
_MODEL_NAME = re.compile(r"(model|^net$|^net_|_net$|^netg$|^netd$|^module$|backbone|encoder|decoder)", re.IGNORECASE)
_OPTIMIZER_NAME = re.compile(r"optim|^opt", re.IGNORECASE)
_SCHEDULER_NAME = re.compile(r"sched|^lr", re.IGNORECASE)
# A name that says it holds a loader: train_loader, self.val_loader, dataloader, train_dl.
_LOADER_NAME = re.compile(r"(loader|^dl$|_dl$|^dl_)", re.IGNORECASE)
# An ``if`` around the update that makes it an accumulation: ``(i + 1) % k == 0``, ``step % accum_steps``.
_ACCUMULATION_NAME = re.compile(r"accum|update_freq|grad_acc", re.IGNORECASE)

# Event kinds.
BACKWARD, STEP, SCALER_UPDATE, ZERO_GRAD, SCHEDULE = "backward", "step", "scaler_update", "zero_grad", "schedule"
UNSCALE, CLIP, GRAD = "unscale", "clip", "grad"
BARRIER, CLOSURE, FETCH, FORWARD, READ, CALL = "barrier", "closure", "fetch_gradients", "forward", "read", "call"
UPDATE_KINDS = (STEP, SCALER_UPDATE, ZERO_GRAD, SCHEDULE)


@dataclass(frozen=True)
class Event:
    """Something a step does. ``node`` lies in the function the path leads to: ``path`` is the calls from
    the loop's own code down to that function (empty when the loop body holds the node itself)."""

    kind: str
    node: cst.CSTNode
    path: tuple[cst.Call, ...] = ()
    # The innermost loop holding the node in its own function, when that loop lies below the step's loop
    # (a micro-step loop, a loop over the parameters); None when the node runs once per step.
    inner_loop: Loop | None = None
    # What a call into another module of the project does (the project index says so): ``node`` is that
    # call; nothing inside it is known here, so no rule edits it as a backward or a step.
    external: bool = False

    @property
    def site(self) -> cst.CSTNode:
        """What the loop's own code runs: the node itself, or the first call of its path."""
        return self.path[0] if self.path else self.node

    @property
    def nested(self) -> bool:
        return self.inner_loop is not None


@dataclass(frozen=True)
class Batches:
    """How a loop gets its batches. ``how``: "loader" (a DataLoader), "device_loader" (one that already
    delivers on the XLA device), "iterator" (``next(it)``), "function" (a batch function the loop calls),
    "iterable" (anything else it iterates), or "none"."""

    how: str
    node: cst.CSTNode | None = None


@dataclass(frozen=True)
class BarrierSite:
    """Where a loop's step ends: after ``statement`` (a statement of an indented block), or appended to a
    one-line body (``for x in data: step(x); xm.mark_step()``) when ``statement`` is that suite."""

    statement: cst.CSTNode
    block: cst.CSTNode
    after_update: bool  # after the update's statements (else: at the end of the body)


@dataclass
class StepLoop:
    loop: Loop
    kind: str  # "train" or "eval"
    function: Function
    batches: Batches
    events: list[Event] = field(default_factory=list)
    # Accumulation: "micro-steps" (backward in nested loops, one update per iteration), "guard" (the update
    # under ``if (i + 1) % k == 0:``), or None.
    accumulation: str | None = None
    micro_loops: list[Loop] = field(default_factory=list)
    barrier_site: BarrierSite | None = None
    # Already on torch_xla: iterates a device loader, or marks the step itself (mark_step / sync /
    # xm.optimizer_step(..., barrier=True)).
    iterates_device_loader: bool = False
    has_barrier: bool = False
    # The DataLoader expression the loop iterates (inside enumerate()/tqdm()), when it is one.
    loader: cst.BaseExpression | None = None

    def of_kind(self, *kinds: str, nested: bool | None = None) -> list[Event]:
        return [e for e in self.events if e.kind in kinds and (nested is None or e.nested == nested)]

    @property
    def backwards(self) -> list[Event]:
        return self.of_kind(BACKWARD)

    @property
    def steps(self) -> list[Event]:
        return self.of_kind(STEP, nested=False)

    @property
    def updates(self) -> list[Event]:
        return self.of_kind(*UPDATE_KINDS, nested=False)

    @property
    def forwards(self) -> list[Event]:
        return self.of_kind(FORWARD)

    @property
    def on_xla(self) -> bool:
        """The loop already runs on torch_xla: a device loader or its own step barrier."""
        return self.iterates_device_loader or self.has_barrier


@dataclass(frozen=True)
class Reduction:
    """The explicit gradient all-reduce of a training step (XLA406): after ``backward`` (the last backward
    before the first gradient read) and before ``first_touch``, both in the function ``within`` (the loop's
    own function, or a callee both lie in); ``optimizers`` are the names its steps step there."""

    loop: Loop
    within: cst.CSTNode  # the loop, or the callee's FunctionDef
    backward: cst.CSTNode
    first_touch: cst.CSTNode
    steps: tuple[cst.Call, ...]
    optimizers: tuple[str, ...]
    already_reduced: bool
    # What ``within`` itself runs of the steps: the step calls there, or the calls leading to them.
    local_steps: tuple[cst.CSTNode, ...] = ()


@dataclass(frozen=True)
class Region:
    """Where a node runs per step: the step loop, and the calls from its body into the function holding the
    node (empty when the node is in the loop itself)."""

    step: StepLoop
    path: tuple[cst.Call, ...] = ()
    function: Function = None  # the function holding the node (the callee at the end of the path)

    @property
    def in_callee(self) -> bool:
        return bool(self.path)


# The walk ------------------------------------------------------------------------------------------------


@dataclass
class _Raw:
    kind: str
    node: cst.CSTNode
    loop: Loop | None  # innermost loop in the node's own function


class _Collector(cst.CSTVisitor):
    """One walk: events, loops, functions, classes and instance bindings, recorded per function."""

    def __init__(self, ctx: MigrationContext) -> None:
        super().__init__()
        self.ctx = ctx
        self._function_stack: list[Function] = [None]
        self._loop_stacks: list[list[Loop]] = [[]]
        self._class_stack: list[cst.ClassDef] = []
        self.raw: dict[Function, list[_Raw]] = {None: []}
        self.loop_function: dict[Loop, Function] = {}
        self.loop_parent: dict[Loop, Loop | None] = {}
        self.loops: list[Loop] = []
        # node -> (function, innermost loop of that function) for the nodes the rules ask about.
        self.where: dict[cst.CSTNode, tuple[Function, Loop | None]] = {}
        # (function, assigned names, value, loop) for the tensor-name flow.
        self.assignments: dict[Function, list[tuple[list[str], cst.BaseExpression, Loop | None]]] = {None: []}
        self.function_parent: dict[cst.FunctionDef, Function] = {}
        self.function_class: dict[cst.FunctionDef, str] = {}
        self.defs: dict[tuple[Function, str], cst.FunctionDef] = {}
        self.classes: dict[str, cst.ClassDef] = {}
        self.methods: dict[str, dict[str, cst.FunctionDef]] = {}
        self.bases: dict[str, list[str]] = {}
        # (function, name) -> class name for ``x = LocalClass(...)``; (class, attr) for ``self.x = LocalClass(...)``.
        self.instances: dict[tuple[Function, str], str] = {}
        self.self_instances: dict[tuple[str, str], str] = {}

    @property
    def _function(self) -> Function:
        return self._function_stack[-1]

    @property
    def _loop(self) -> Loop | None:
        stack = self._loop_stacks[-1]
        return stack[-1] if stack else None

    def _record(self, kind: str, node: cst.CSTNode) -> None:
        self.raw[self._function].append(_Raw(kind, node, self._loop))

    def _mark(self, node: cst.CSTNode) -> None:
        self.where[node] = (self._function, self._loop)

    # Definitions -----------------------------------------------------------------------------------------
    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        name = node.name.value
        self.classes.setdefault(name, node)
        self.methods.setdefault(name, {})
        self.bases[name] = [b for b in (patterns.dotted_name(a.value) for a in node.bases) if b]
        self._class_stack.append(node)

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self._class_stack.pop()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        outer = self._function
        owner = self._class_stack[-1] if self._class_stack else None
        if owner is not None and self._owner_is_class(node, owner):
            self.methods[owner.name.value].setdefault(node.name.value, node)
            self.function_class[node] = owner.name.value
        else:
            self.defs.setdefault((outer, node.name.value), node)
        self.function_parent[node] = outer
        self._function_stack.append(node)
        self._loop_stacks.append([])
        self.raw[node] = []
        self.assignments[node] = []

    def _owner_is_class(self, node: cst.FunctionDef, owner: cst.ClassDef) -> bool:
        parent = self.ctx.parent(node)
        return parent is owner.body or (parent is not None and self.ctx.parent(parent) is owner)

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self._function_stack.pop()
        self._loop_stacks.pop()

    # Loops -----------------------------------------------------------------------------------------------
    def _enter_loop(self, node: Loop) -> None:
        self.loop_function[node] = self._function
        self.loop_parent[node] = self._loop
        self.loops.append(node)
        self._loop_stacks[-1].append(node)

    def visit_For(self, node: cst.For) -> bool:
        # The iterable and target run before the loop's step: they belong to the enclosing loop.
        node.target.visit(self)
        node.iter.visit(self)
        self._enter_loop(node)
        node.body.visit(self)
        self._loop_stacks[-1].pop()
        if node.orelse is not None:
            node.orelse.visit(self)
        return False

    def visit_While(self, node: cst.While) -> bool:
        self._mark(node)
        self._enter_loop(node)
        node.test.visit(self)
        node.body.visit(self)
        self._loop_stacks[-1].pop()
        if node.orelse is not None:
            node.orelse.visit(self)
        return False

    # Statements the rules ask about --------------------------------------------------------------------------
    def visit_If(self, node: cst.If) -> None:
        self._mark(node)

    def visit_Expr(self, node: cst.Expr) -> None:
        self._mark(node)

    def visit_Return(self, node: cst.Return) -> None:
        self._mark(node)

    def visit_Subscript(self, node: cst.Subscript) -> None:
        self._mark(node)

    def visit_Assign(self, node: cst.Assign) -> None:
        self._mark(node)
        names = [n for t in node.targets for n in _target_names(t.target)]
        self.assignments[self._function].append((names, node.value, self._loop))
        if isinstance(node.value, cst.Call) and len(node.targets) == 1:
            self._bind_instance(node.targets[0].target, node.value)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:
            self.assignments[self._function].append((_target_names(node.target), node.value, self._loop))
            if isinstance(node.value, cst.Call):
                self._bind_instance(node.target, node.value)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._mark(node)
        self.assignments[self._function].append((_target_names(node.target), node.value, self._loop))

    def _bind_instance(self, target: cst.BaseExpression, value: cst.Call) -> None:
        class_name = patterns.dotted_name(value.func)
        if class_name is None:
            return
        class_name = class_name.rsplit(".", 1)[-1]
        if isinstance(target, cst.Name):
            self.instances.setdefault((self._function, target.value), class_name)
        elif (isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name)
              and target.value.value == "self" and self._function in self.function_class):
            self.self_instances.setdefault((self.function_class[self._function], target.attr.value), class_name)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if node.attr.value == "grad":
            self._record(GRAD, node)

    def visit_Call(self, node: cst.Call) -> None:
        self._mark(node)
        kind = _call_kind(self.ctx, node)
        if kind is not None:
            self._record(kind, node)
            if kind == STEP and _barrier_keyword(node):
                self._record(BARRIER, node)


def _target_names(target: cst.BaseExpression) -> list[str]:
    if isinstance(target, (cst.Tuple, cst.List)):
        return [n for e in target.elements for n in _target_names(e.value)]
    if isinstance(target, cst.StarredElement):
        return _target_names(target.value)
    name = patterns.dotted_name(target)
    return [name] if name is not None else []


def _barrier_keyword(node: cst.Call) -> bool:
    barrier = patterns.keyword(node, "barrier")
    return barrier is not None and patterns.dotted_name(barrier.value) == "True"


def _receiver(node: cst.Call) -> str | None:
    return patterns.dotted_name(node.func.value) if isinstance(node.func, cst.Attribute) else None


def _is_scaler(ctx: MigrationContext, receiver: str | None) -> bool:
    return receiver is not None and (receiver in ctx.facts.scalers or "scaler" in receiver.rsplit(".", 1)[-1].lower())


def is_optimizer_step(ctx: MigrationContext, node: cst.CSTNode) -> bool:
    """``optimizer.step()``, ``self.opt.step()``, ``scaler.step(optimizer)``, ``xm.optimizer_step(opt)``
    (not ``scheduler.step()``)."""
    if ctx.is_call_to(node, OPTIMIZER_STEP):
        return True
    if not isinstance(node, cst.Call) or patterns.method_call(node, "step") is None:
        return False
    receiver = _receiver(node)
    if receiver is None:
        return False
    if receiver in ctx.facts.optimizers or receiver in ctx.facts.scalers:
        return True
    last = receiver.rsplit(".", 1)[-1]
    return bool(_OPTIMIZER_NAME.search(last)) or "scaler" in last.lower()


def is_model_call(node: cst.Call, ctx: MigrationContext) -> bool:
    """``model(x)``, ``self.net(x)``, ``ddp_model(x)``: a call of something that is (or says it is) a model."""
    name = patterns.dotted_name(node.func)
    if name is None:
        return False
    return name in ctx.facts.ddp_models or bool(_MODEL_NAME.search(name.rsplit(".", 1)[-1]))


def _call_kind(ctx: MigrationContext, node: cst.Call) -> str | None:
    func = node.func
    method = func.attr.value if isinstance(func, cst.Attribute) else None
    if method == "backward":
        return BACKWARD
    if method in ("item", "tolist", "numpy", "cpu"):
        return READ
    if method == "zero_grad":
        return ZERO_GRAD
    if method == "step":
        if is_optimizer_step(ctx, node):
            return STEP
        receiver = _receiver(node) or ""
        if _SCHEDULER_NAME.search(receiver.rsplit(".", 1)[-1]):
            return SCHEDULE
    if method == "update" and _is_scaler(ctx, _receiver(node)):
        return SCALER_UPDATE
    if method == "unscale_" and _is_scaler(ctx, _receiver(node)):
        return UNSCALE
    names = ctx.qualnames(func)
    if names:
        if names & set(STEP_BARRIERS):
            return BARRIER
        if OPTIMIZER_STEP in names:
            return STEP
        if names & set(STEP_CLOSURES):
            return CLOSURE
        if FETCH_GRADIENTS in names:
            return FETCH
        if names & set(CLIP_GRADS):
            return CLIP
        if names & set(CONVERSIONS) and len(node.args) == 1:
            return READ
    if is_model_call(node, ctx):
        return FORWARD
    if isinstance(func, cst.Name) or (isinstance(func, cst.Attribute) and patterns.dotted_name(func) is not None):
        return CALL
    return None


# The model -----------------------------------------------------------------------------------------------


class StepModel:
    """The step analysis of one module (see the module docstring). Built by the context, once."""

    MAX_DEPTH = 6  # calls followed from a loop body

    def __init__(self, ctx: MigrationContext) -> None:
        self.ctx = ctx
        collector = _Collector(ctx)
        ctx.module.visit(collector)
        self._c = collector
        self._effects: dict[cst.FunctionDef, list[Event]] = {}
        self._callees: dict[cst.Call, cst.FunctionDef | None] = {}
        self._instances_by_name: dict[str, set[str]] | None = None
        self._backward_sites: dict[Function, list[cst.CSTNode]] = {}
        self.loops: dict[Loop, StepLoop] = {}
        # Micro-step loop -> the training loop whose step it is part of.
        self.micro_of: dict[Loop, StepLoop] = {}
        # Step function -> (step loop, path to it): functions a step loop calls, with the first path found.
        self.step_functions: dict[cst.FunctionDef, tuple[StepLoop, tuple[cst.Call, ...]]] = {}
        self._classify()
        self._tensor_names: dict[object, set[str]] = {}

    # Callees -----------------------------------------------------------------------------------------------
    def callee(self, call: cst.Call) -> cst.FunctionDef | None:
        """The function of this module a call runs: ``f(x)``, ``self.method(x)``, ``obj(x)`` (a local class's
        ``__call__``), ``obj.method(x)``, ``self.attr(x)`` / ``self.attr.method(x)``."""
        if call in self._callees:
            return self._callees[call]
        function = self._c.where.get(call, (None, None))[0]
        found = self._resolve(call.func, function)
        self._callees[call] = found
        return found

    def _resolve(self, func: cst.BaseExpression, function: Function) -> cst.FunctionDef | None:
        c = self._c
        if isinstance(func, cst.Name):
            scope: Function = function
            while True:
                if (scope, func.value) in c.defs:
                    return c.defs[(scope, func.value)]
                if (scope, func.value) in c.instances:
                    return self._method(c.instances[(scope, func.value)], "__call__")
                if scope is None:
                    held = self._instance_anywhere(func.value)
                    return self._method(held, "__call__") if held else None
                scope = c.function_parent.get(scope)
        if not isinstance(func, cst.Attribute):
            return None
        base, attr = func.value, func.attr.value
        own_class = c.function_class.get(function) if function is not None else None
        if isinstance(base, cst.Name) and base.value == "self" and own_class is not None:
            method = self._method(own_class, attr)
            if method is not None:
                return method
            held = c.self_instances.get((own_class, attr))
            return self._method(held, "__call__") if held else None
        if (isinstance(base, cst.Attribute) and isinstance(base.value, cst.Name) and base.value.value == "self"
                and own_class is not None):
            held = c.self_instances.get((own_class, base.attr.value))
            return self._method(held, attr) if held else None
        if isinstance(base, cst.Name):
            scope = function
            while True:
                if (scope, base.value) in c.instances:
                    return self._method(c.instances[(scope, base.value)], attr)
                if scope is None:
                    held = self._instance_anywhere(base.value)
                    return self._method(held, attr) if held else None
                scope = c.function_parent.get(scope)
        return None

    def external_effects(self, call: cst.Call) -> tuple[str, ...]:
        """What a call into another module of the project does to the gradients (BACKWARD, STEP), from the
        project index: an imported helper (``train_step(...)``, ``utils.train_step(...)``), or an object of
        a project class made elsewhere and passed in under the same name (``loss_scaler(loss)``,
        ``stepper.update(loss)``). Empty without a project."""
        project = self.ctx.project
        if project is None:
            return ()
        kinds: tuple[str, ...] = ()
        for name in sorted(self.ctx.qualnames(call.func)):
            kinds = project.helper_effects(name) or project.helper_effects(name + ".__call__")
            if kinds:
                break
        if not kinds:
            func = call.func
            if isinstance(func, cst.Name):
                kinds = project.instance_effects(func.value)
            elif isinstance(func, cst.Attribute) and isinstance(func.value, (cst.Name, cst.Attribute)):
                holder = patterns.dotted_name(func.value)
                if holder is not None:
                    kinds = project.instance_effects(holder.rsplit(".", 1)[-1], func.attr.value)
        from .project import BACKWARD as HELPER_BACKWARD

        return tuple(BACKWARD if kind == HELPER_BACKWARD else STEP for kind in kinds)

    def _instance_anywhere(self, name: str) -> str | None:
        """The local class an object of this name is made from anywhere in the module, when only one is: an
        object made in ``main`` and passed on as a parameter of the same name (``loss_scaler``)."""
        if self._instances_by_name is None:
            self._instances_by_name = {}
            for (_, bound), cls in self._c.instances.items():
                if cls in self._c.methods:
                    self._instances_by_name.setdefault(bound, set()).add(cls)
        classes = self._instances_by_name.get(name, set())
        return next(iter(classes)) if len(classes) == 1 else None

    def _method(self, class_name: str, name: str, seen: frozenset[str] = frozenset()) -> cst.FunctionDef | None:
        c = self._c
        if class_name not in c.methods or class_name in seen:
            return None
        if name in c.methods[class_name]:
            return c.methods[class_name][name]
        for base in c.bases.get(class_name, ()):
            found = self._method(base.rsplit(".", 1)[-1], name, seen | {class_name})
            if found is not None:
                return found
        return None

    def effects(self, function: cst.FunctionDef, depth: int = 0) -> list[Event]:
        """What one call of ``function`` does: its events, following its own calls (paths start below it)."""
        if function in self._effects:
            return self._effects[function]
        self._effects[function] = []  # recursion: a function that calls itself adds nothing more
        events = self._events_of(function, None, depth) if depth < self.MAX_DEPTH else []
        self._effects[function] = events
        return events

    def _events_of(self, function: Function, loop: Loop | None, depth: int) -> list[Event]:
        """The events of ``function``'s code below ``loop`` (its whole body when None), callees followed."""
        events: list[Event] = []
        for raw in self._c.raw.get(function, ()):
            inner = self._inner_loop(raw.loop, loop)
            if inner is False:
                continue
            if raw.kind == CALL:
                target = self.callee(raw.node)  # type: ignore[arg-type]
                if target is None:
                    events += [Event(kind, raw.node, (), inner, external=True)
                               for kind in self.external_effects(raw.node)]  # type: ignore[arg-type]
                    continue
                if target is function:
                    continue
                for event in self.effects(target, depth + 1):
                    events.append(Event(event.kind, event.node, (raw.node, *event.path),  # type: ignore[arg-type]
                                        event.inner_loop or inner))
                continue
            events.append(Event(raw.kind, raw.node, (), inner))
        return events

    def _inner_loop(self, raw_loop: Loop | None, loop: Loop | None) -> Loop | None | bool:
        """For a node whose innermost loop is ``raw_loop``: None when it runs once per iteration of ``loop``
        (once per call when ``loop`` is None), the loop below ``loop`` that repeats it, or False when it
        lies outside ``loop``."""
        if raw_loop is loop:
            return None
        current = raw_loop
        while current is not None:
            parent = self._c.loop_parent.get(current)
            if parent is loop:
                return raw_loop
            current = parent
        return raw_loop if loop is None else False

    # Classification ------------------------------------------------------------------------------------------
    def _classify(self) -> None:
        candidates: dict[Loop, list[Event]] = {}
        for loop in self._c.loops:
            candidates[loop] = self._events_of(self._c.loop_function[loop], loop, 0)
        micro: set[Loop] = set()
        trains: list[StepLoop] = []
        for loop in self._c.loops:  # outer loops first: they claim their micro-step loops
            if loop in micro:
                continue
            events = candidates[loop]
            direct_steps = [e for e in events if e.kind == STEP and not e.nested]
            direct_backward = [e for e in events if e.kind == BACKWARD and not e.nested]
            nested_backward = [e for e in events if e.kind == BACKWARD and e.nested]
            any_step = any(e.kind == STEP for e in events)
            if direct_steps and direct_backward:
                step = self._new(loop, "train", events)
            elif direct_steps and nested_backward:
                step = self._new(loop, "train", events)
                step.accumulation = "micro-steps"
                step.micro_loops = list(dict.fromkeys(e.inner_loop for e in nested_backward if e.inner_loop))
                micro.update(step.micro_loops)
            elif direct_backward and not any_step:
                step = self._new(loop, "train", events)
            else:
                continue
            trains.append(step)
        for step in trains:
            for inner in step.micro_loops:
                self.micro_of[inner] = step
                self.loops.pop(inner, None)
        for loop in self._c.loops:
            if loop in self.loops or loop in micro or self._feeds_backward(loop):
                continue
            events = candidates[loop]
            if any(e.kind == BACKWARD for e in events) or any(e.kind == STEP for e in events):
                continue
            if any(e.kind == FORWARD and not e.nested for e in events):
                self._new(loop, "eval", events)
        for step in self.loops.values():
            self._finish(step)
        with_loops = {self._c.loop_function[s.loop] for s in self.loops.values()}
        for step in self.loops.values():
            for event in step.events:
                for index, call in enumerate(event.path):
                    target = self.callee(call)
                    if target is not None and target not in self.step_functions and target not in with_loops:
                        self.step_functions[target] = (step, event.path[: index + 1])

    def _feeds_backward(self, loop: Loop) -> bool:
        """A backward pass follows the loop in its function (in the function's own code or in one it calls):
        the loop is the forward part of a training step (an RNN's time steps, an encoder over tokens), not
        an evaluation loop. A validation loop after the update, or in a function with no backward, is one."""
        function = self._c.loop_function[loop]
        if function not in self._backward_sites:
            sites = [e.site for e in self._events_of(function, None, 0) if e.kind == BACKWARD]
            self._backward_sites[function] = sites
        start = self.ctx.position(loop)
        return any(self.ctx.position(site) > start and not self._within(site, loop)
                   for site in self._backward_sites[function])

    def _within(self, node: cst.CSTNode, loop: Loop) -> bool:
        current = self._c.where.get(node, (None, None))[1]
        while current is not None:
            if current is loop:
                return True
            current = self._c.loop_parent.get(current)
        return False

    def _new(self, loop: Loop, kind: str, events: list[Event]) -> StepLoop:
        step = StepLoop(loop, kind, self._c.loop_function[loop], self._batches(loop, events), events)
        self.loops[loop] = step
        return step

    def _batches(self, loop: Loop, events: list[Event]) -> Batches:
        if isinstance(loop, cst.For) and not isinstance(loop.iter, cst.BaseComp):
            iterated = self.loop_iterable(loop)
            if self.is_device_loader(iterated):
                return Batches("device_loader", iterated)
            if self.is_data_loader(iterated):
                return Batches("loader", iterated)
        for raw in self._c.raw.get(self._c.loop_function[loop], ()):
            if raw.loop is loop and raw.kind == CALL and isinstance(raw.node, cst.Call):
                parent = self.ctx.parent(raw.node)
                if isinstance(parent, cst.Assign):
                    if self.ctx.is_call_to(raw.node, "builtins.next"):
                        return Batches("iterator", raw.node)
                    name = (patterns.dotted_name(raw.node.func) or "").rsplit(".", 1)[-1]
                    if self.callee(raw.node) is not None or "batch" in name.lower():
                        return Batches("function", raw.node)
        if isinstance(loop, cst.For):
            return Batches("iterable", loop.iter)
        return Batches("none")

    def _finish(self, step: StepLoop) -> None:
        step.iterates_device_loader = step.batches.how == "device_loader"
        step.has_barrier = any(e.kind == BARRIER and (not e.nested or e.inner_loop in step.micro_loops)
                               for e in step.events)
        if step.batches.how == "loader":
            step.loader = step.batches.node  # type: ignore[assignment]
        step.barrier_site = self._barrier_site(step)
        if step.kind == "train" and step.accumulation is None and step.barrier_site is not None and \
                step.barrier_site.block is not step.loop.body:
            step.accumulation = "guard"

    # Where the step ends ---------------------------------------------------------------------------------------
    def _chain(self, node: cst.CSTNode, loop: Loop) -> list[tuple[cst.CSTNode, cst.CSTNode]]:
        """(block, statement) pairs from the loop's body down to ``node``, outermost first: each block (an
        indented block or a one-line suite) and its child that holds ``node``. Empty outside the body."""
        pairs: list[tuple[cst.CSTNode, cst.CSTNode]] = []
        current: cst.CSTNode | None = node
        while current is not None and current is not loop.body:
            parent = self.ctx.parent(current)
            if isinstance(parent, (cst.IndentedBlock, cst.SimpleStatementSuite)):
                pairs.append((parent, current))
            current = parent
        if current is None:
            return []
        pairs.reverse()
        return pairs

    def _barrier_site(self, step: StepLoop) -> BarrierSite | None:
        """After the update: the last statement, in the block that holds every optimizer step, that holds
        a step or a later update (``scaler.update()``, ``zero_grad()``, a scheduler). The block is the loop's
        body, or the ``if`` of an accumulation (``if (i + 1) % k == 0:``), so the barrier runs once per
        optimizer step. Without a step in sight (or in an evaluation loop): the end of the body."""
        body = step.loop.body
        if isinstance(body, cst.SimpleStatementSuite):
            return BarrierSite(body, body, bool(step.steps))
        if not isinstance(body, cst.IndentedBlock) or not body.body:
            return None
        chains = [c for c in (self._chain(e.site, step.loop) for e in step.steps) if c]
        if step.kind == "eval" or not chains:
            return BarrierSite(body.body[-1], body, False)
        depth = 0
        while all(len(c) > depth + 1 and c[depth + 1][0] is chains[0][depth + 1][0] for c in chains):
            depth += 1
        while depth > 0 and not self._accumulation_guard(chains[0][depth][0]):
            depth -= 1
        block = chains[0][depth][0]
        if isinstance(block, cst.SimpleStatementSuite):
            return BarrierSite(block, block, True)
        statements = list(block.body)  # type: ignore[attr-defined]
        last = max(statements.index(c[depth][1]) for c in chains)
        # Later updates join the step unless a host read comes first (``scheduler.step(loss.item())``).
        reads = [self._index_in(e.site, block, depth, step, statements) for e in step.of_kind(READ, nested=False)]
        stop = min([i for i in reads if i is not None and i > last], default=len(statements))
        for event in step.updates:
            index = self._index_in(event.site, block, depth, step, statements)
            if index is not None and last < index < stop:
                last = index
        return BarrierSite(statements[last], block, True)

    def _index_in(self, node: cst.CSTNode, block: cst.CSTNode, depth: int, step: StepLoop,
                  statements: list[cst.CSTNode]) -> int | None:
        chain = self._chain(node, step.loop)
        if len(chain) > depth and chain[depth][0] is block:
            return statements.index(chain[depth][1])
        return None

    def _accumulation_guard(self, block: cst.CSTNode) -> bool:
        """The block is the body of an ``if`` that accumulates: ``if (i + 1) % k == 0:``, ``if step % accum:``."""
        owner = self.ctx.parent(block)
        if not isinstance(owner, cst.If) or owner.body is not block:
            return False
        return bool(patterns.find_all(owner.test, lambda n: isinstance(n, cst.Modulo) or (
            isinstance(n, cst.Name) and bool(_ACCUMULATION_NAME.search(n.value)))))

    # Queries ---------------------------------------------------------------------------------------------------
    def loop(self, node: cst.CSTNode) -> StepLoop | None:
        return self.loops.get(node)  # type: ignore[arg-type]

    @cached_property
    def training_loops(self) -> list[Loop]:
        return [s.loop for s in self.loops.values() if s.kind == "train"]

    def region(self, node: cst.CSTNode) -> Region | None:
        """Where ``node`` runs once per step: in a step loop's body, in a loop below a training loop (its
        micro-steps, a loop over the parameters), or in a function a step loop calls (the first call path
        found; functions with step loops of their own are not per-step helpers). Only nodes the walk marks
        (calls, expression statements, ifs, whiles, assignments, returns, subscripts)."""
        where = self._c.where.get(node)
        if where is None:
            return None
        function, loop = where
        current, innermost = loop, True
        while current is not None:
            step = self.loops.get(current) or self.micro_of.get(current)
            if step is not None and (innermost or step.kind == "train"):
                return self._region_in(step, function)
            innermost = False
            current = self._c.loop_parent.get(current)
        if function is not None and function in self.step_functions:
            step, path = self.step_functions[function]
            return Region(step, path, function)
        return None

    def _region_in(self, step: StepLoop, function: Function) -> Region:
        if function is step.function or function not in self.step_functions:
            return Region(step, (), function)
        _, path = self.step_functions[function]  # type: ignore[index]
        return Region(step, path, function)

    @cached_property
    def host_reads(self) -> _HostReadPlan:
        """The reads XLA313 (running sums, per-step helpers) and XLA314 (finite checks) move."""
        return _HostReadPlan(self)

    def class_of(self, function: cst.FunctionDef) -> str | None:
        """The name of the class a function is a method of, else None."""
        return self._c.function_class.get(function)

    def moves_read(self, node: cst.CSTNode) -> bool:
        """A read that a rule of this run moves off the step (XLA313, XLA314)."""
        return node in self.host_reads.moved

    def training_region(self, node: cst.CSTNode) -> Region | None:
        region = self.region(node)
        return region if region is not None and region.step.kind == "train" else None

    def gets_device_loader(self, step: StepLoop) -> bool:
        """XLA301 wraps the loop's DataLoader: a training or evaluation loop over a DataLoader, not one that
        accumulates by a guard (the device loader would mark every micro-step), not in an Accelerate script."""
        return (step.loader is not None and not self.ctx.facts.uses_accelerate and step.accumulation != "guard"
                and not step.has_barrier)

    def iterates_device_loader(self, step: StepLoop) -> bool:
        """After migration the loop iterates a device loader: it already does, or XLA301 runs and wraps it."""
        return step.iterates_device_loader or (self.ctx.runs("XLA301") and self.gets_device_loader(step))

    def needs_barrier(self, step: StepLoop) -> bool:
        return (not self.ctx.facts.uses_accelerate and not self.iterates_device_loader(step)
                and not step.has_barrier and step.barrier_site is not None)

    def after_step_end(self, node: cst.CSTNode, region: Region) -> bool:
        """``node`` runs after the step's graph ran: after a barrier in the same block of the loop body, or
        after the update where XLA302 puts the barrier (in a loop that gets no device loader). Its reads cost
        no extra graph run. In a device-loader loop the step ends at the next batch: nothing is after it."""
        if region.in_callee:
            return False
        step = region.step
        loop = step.loop
        for event in step.of_kind(BARRIER, nested=False):
            if not event.path and self._follows(node, event.node, loop):
                return True
        if self.ctx.facts.uses_accelerate or self.iterates_device_loader(step) or step.has_barrier:
            return False
        site = step.barrier_site
        if site is None or not site.after_update or isinstance(site.block, cst.SimpleStatementSuite):
            return False
        return self._follows(node, site.statement, loop)

    def _follows(self, node: cst.CSTNode, statement: cst.CSTNode, loop: Loop) -> bool:
        """``node`` lies in a statement after ``statement``'s own statement, in the same block."""
        anchor_chain = self._chain(statement, loop)
        node_chain = self._chain(node, loop)
        if not anchor_chain:
            return False
        block, anchor = anchor_chain[-1]
        for node_block, node_statement in node_chain:
            if node_block is block:
                statements = list(block.body)  # type: ignore[attr-defined]
                return statements.index(node_statement) > statements.index(anchor)
        return False

    # Tensors and host reads --------------------------------------------------------------------------------------
    def tensor_names(self, region: Region) -> set[str]:
        """Names that hold tensors where the region's code runs: what ``backward()`` is called on, what a
        model, criterion or loss call returns, and what is computed from those (to a fixed point). Values
        read with ``.item()`` are not."""
        names = set(self.base_tensor_names(region))
        if not region.in_callee:
            names |= {n for (loop, n) in self.host_reads.device_values if loop is region.step.loop}
        return names

    def base_tensor_names(self, region: Region) -> set[str]:
        """``tensor_names`` without the values XLA313 keeps on the device (what the source itself says)."""
        key: object = region.function if region.in_callee else region.step.loop
        if key in self._tensor_names:
            return self._tensor_names[key]
        names: set[str] = set()
        if region.in_callee:
            function = region.function
            assignments = [(n, v) for n, v, _ in self._c.assignments.get(function, ())]
            backwards = [r.node for r in self._c.raw.get(function, ()) if r.kind == BACKWARD]
        else:
            loop = region.step.loop
            function = self._c.loop_function[loop]
            within = self._loops_within(loop)
            assignments = [(n, v) for n, v, owner in self._c.assignments.get(function, ()) if owner in within]
            backwards = [r.node for r in self._c.raw.get(function, ()) if r.kind == BACKWARD and r.loop in within]
        for call in backwards:
            receiver = _receiver(call)  # type: ignore[arg-type]
            if receiver is not None and receiver.rsplit(".", 1)[-1].endswith("accelerator"):
                # accelerator.backward(loss): the tensor is the argument
                receiver = patterns.dotted_name(call.args[0].value) if call.args else None  # type: ignore[attr-defined]
            if receiver is not None:
                names.add(receiver)
        changed = True
        while changed:
            changed = False
            for targets, value in assignments:
                missing = [t for t in targets if t not in names]
                if missing and self._produces_tensor(value, names):
                    names.update(missing)
                    changed = True
        self._tensor_names[key] = names
        return names

    def _loops_within(self, loop: Loop) -> set[Loop]:
        within = {loop}
        for other in self._c.loops:
            current = self._c.loop_parent.get(other)
            while current is not None:
                if current is loop:
                    within.add(other)
                    break
                current = self._c.loop_parent.get(current)
        return within

    def _produces_tensor(self, value: cst.BaseExpression, names: set[str]) -> bool:
        if reads(self.ctx, value, set()) or is_read_call(self.ctx, value, names):
            return False  # `loss_value = loss.item()` holds a float
        if isinstance(value, cst.Call):
            callee = (patterns.dotted_name(value.func) or "").rsplit(".", 1)[-1].lower()
            if any(word in callee for word in _TENSOR_CALLEES):
                return True
        return bool(mentions(value, names))

    # Loaders --------------------------------------------------------------------------------------------------
    def loop_iterable(self, loop: cst.For) -> cst.BaseExpression:
        node = loop.iter
        while isinstance(node, cst.Call) and self.ctx.qualnames(node.func) & set(PASS_THROUGH):
            args = patterns.positional(node)
            if not args:
                break
            node = args[0].value
        return node

    def is_device_loader(self, node: cst.BaseExpression) -> bool:
        """Already delivers batches on the XLA device: ``pl.MpDeviceLoader(...)``, ``.per_device_loader(...)``,
        or a name bound to one."""
        if isinstance(node, cst.Call):
            return bool(self.ctx.qualnames(node.func) & set(DEVICE_LOADERS)) or bool(
                patterns.method_call(node, "per_device_loader"))
        name = patterns.dotted_name(node)
        return name is not None and name in self.ctx.facts.device_loaders

    def is_data_loader(self, node: cst.BaseExpression) -> bool:
        """A DataLoader: one the script builds, a name bound to one, or a name that says it is one (loaders
        are often parameters: ``def train(model, device, train_loader)``)."""
        if isinstance(node, cst.Call):
            return bool(self.ctx.qualnames(node.func) & set(DATALOADERS))
        name = patterns.dotted_name(node)
        if name is None or name in self.ctx.facts.device_loaders:
            return False
        return name in self.ctx.facts.loaders or bool(_LOADER_NAME.search(name.rsplit(".", 1)[-1]))

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


# Reads of tensor values (expression level: the rules look at one statement) ----------------------------------


class _Mentions(cst.CSTVisitor):
    """Collects uses of tensor names that need the tensor's value (``loss``, ``outputs.loss``), not
    ``loss.shape``; lambdas (step closures already) are not entered."""

    def __init__(self, names: set[str]) -> None:
        super().__init__()
        self.names = names
        self.found: list[cst.CSTNode] = []

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        if patterns.dotted_name(node) in self.names:
            self.found.append(node)
        elif node.attr.value not in STATIC_ATTRIBUTES:
            node.value.visit(self)  # not the attribute's own name
        return False

    def visit_Arg(self, node: cst.Arg) -> bool:
        node.value.visit(self)  # not the keyword
        return False

    def visit_Name(self, node: cst.Name) -> None:
        if node.value in self.names:
            self.found.append(node)

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False


def mentions(node: cst.CSTNode, names: set[str]) -> list[cst.CSTNode]:
    finder = _Mentions(names)
    node.visit(finder)
    return finder.found


def is_read_call(ctx: MigrationContext, node: cst.CSTNode, names: set[str]) -> bool:
    if not isinstance(node, cst.Call):
        return False
    if patterns.method_call(node, *READ_METHODS):
        return True
    return bool(ctx.qualnames(node.func) & set(CONVERSIONS)) and bool(node.args) and bool(
        mentions(node.args[0].value, names))


class _Reads(_Mentions):
    def __init__(self, ctx: MigrationContext, names: set[str]) -> None:
        super().__init__(names)
        self.ctx = ctx

    def visit_Call(self, node: cst.Call) -> bool:
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value in READ_METHODS:
            self.found.append(node)
            return False
        if isinstance(func, (cst.Name, cst.Attribute)):
            qualnames = self.ctx.qualnames(func)
            if qualnames & set(STEP_CLOSURES) or "builtins.len" in qualnames:
                return False  # a closure reads later; a length is a shape
            if qualnames & set(CONVERSIONS) and node.args and mentions(node.args[0].value, self.names):
                self.found.append(node)
                return False
        return True


def reads(ctx: MigrationContext, node: cst.CSTNode, names: set[str]) -> list[cst.CSTNode]:
    """The outermost expressions in ``node`` that read a tensor's value to the host: ``x.item()``,
    ``x.tolist()``, ``x.cpu()``, ``x.numpy()``, ``float(loss)``; with ``names``, also a tensor used as a
    value (printed, formatted, compared)."""
    finder = _Reads(ctx, names)
    node.visit(finder)
    return finder.found


def may_read(node: cst.Call) -> bool:
    """A cheap test before ``reads``: a read method, or a call of something named float/int/bool."""
    func = node.func
    if isinstance(func, cst.Attribute):
        return func.attr.value in READ_METHODS or func.attr.value in ("float", "int", "bool")
    return isinstance(func, cst.Name) and func.value in ("float", "int", "bool")


def in_step_closure(ctx: MigrationContext, node: cst.CSTNode) -> bool:
    current = ctx.parent(node)
    while current is not None and not isinstance(current, cst.BaseStatement):
        if isinstance(current, cst.Call) and ctx.qualnames(current.func) & set(STEP_CLOSURES):
            return True
        current = ctx.parent(current)
    return False


def is_logging_call(ctx: MigrationContext, call: cst.Call) -> bool:
    if patterns.dotted_name(call.func) == "accelerator.print" or "builtins.print" in ctx.qualnames(call.func):
        return True
    return patterns.method_call(call, *LOG_METHODS) is not None


def logging_statement(ctx: MigrationContext, node: cst.Expr) -> tuple[cst.Call, list[cst.CSTNode], Region] | None:
    """For a statement that only logs (``print(...)``, ``logger.info(...)``, ``writer.add_scalar(...)``) once
    per training step (in the loop or a function it calls), mid-step, and reads tensors: the call, its reads
    and where it runs."""
    call = node.value
    if not isinstance(call, cst.Call) or not is_logging_call(ctx, call):
        return None
    region = ctx.steps.training_region(node)
    if region is None or in_step_closure(ctx, node) or ctx.steps.after_step_end(node, region):
        return None
    found = reads(ctx, call, ctx.steps.tensor_names(region))
    return (call, found, region) if found else None


def is_logging_read(ctx: MigrationContext, node: cst.CSTNode) -> bool:
    """``node`` lies in a pure logging statement that XLA310 moves into a step closure."""
    current = ctx.parent(node)
    while current is not None and not isinstance(current, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
        if isinstance(current, cst.Expr):
            return logging_statement(ctx, current) is not None
        current = ctx.parent(current)
    return False


def describe_path(ctx: MigrationContext, region: Region) -> str:
    """`` in Trainer._run_batch (called from the loop at line 40: self._run_batch(x, y))`` or ``""``."""
    if not region.in_callee:
        return ""
    function = region.function
    name = function.name.value if function is not None else "?"
    owner = ctx.steps.class_of(function) if function is not None else None
    calls = " -> ".join(patterns.code_of(c.func) + "(...)" for c in region.path)
    line = ctx.position(region.step.loop)[0]
    return f" in {owner + '.' if owner else ''}{name} (run every step by the loop at line {line}: {calls})"


# Host reads that can move off the step -------------------------------------------------------------------------
#
# XLA313 keeps running sums on the device (``total += loss.item()`` -> ``total += loss.detach()``, read once
# after the loop) and makes per-step helpers return the tensor (``return loss.item()`` -> ``return
# loss.detach()``) when every caller keeps it on the device or logs it; XLA314 moves a finite check that stops
# training into a step closure. Decided here, once, so that XLA311 reports exactly the reads that stay.

# Between a read and the value of ``total += ...``: only arithmetic.
_ARITHMETIC = (cst.BinaryOperation, cst.UnaryOperation)
FINITE_CHECKS = ("math.isfinite", "math.isnan", "math.isinf", "torch.isfinite", "torch.isnan", "torch.isinf")
STOPS = ("sys.exit", "builtins.exit", "builtins.quit", "os._exit")


@dataclass(frozen=True)
class DeviceSum:
    """``total += <value>`` in a step loop whose value reads a tensor (``loss.item()``, ``float(loss)``, a
    per-step helper's result): the reads become ``.detach()``, and ``total`` is read back once, right after
    ``loop``, the way it was read (``read_back``: "item", "float" or "int")."""

    statement: cst.AugAssign
    name: str
    reads: tuple[cst.Call, ...]
    loop: Loop
    read_back: str


@dataclass(frozen=True)
class DeviceReturn:
    """A function the step calls that returns ``loss.item()``: it returns ``loss.detach()`` instead; its
    callers keep the value on the device (a running sum) or log it in a step closure (``value.item()``)."""

    function: cst.FunctionDef
    reads: tuple[cst.Call, ...]
    # The names its callers bind the result to, and the logging statements that read them.
    names: tuple[tuple[Loop, str], ...]
    logging: tuple[cst.Expr, ...]
    mentions: tuple[cst.Name, ...]


@dataclass(frozen=True)
class FiniteCheck:
    """``value = loss.item()`` followed by ``if not math.isfinite(value): ... sys.exit(1)``: both move into a
    function run by a step closure, which takes the tensors the read names."""

    assign: cst.SimpleStatementLine
    check: cst.If
    read: cst.Call
    region: Region


def _read_kind(ctx: MigrationContext, node: cst.CSTNode) -> str | None:
    """"item" for ``x.item()``, "float"/"int" for ``float(x)``/``int(x)``, else None."""
    if not isinstance(node, cst.Call):
        return None
    if patterns.method_call(node, "item") and not node.args:
        return "item"
    names = ctx.qualnames(node.func)
    if len(node.args) == 1 and not node.args[0].star and node.args[0].keyword is None:
        if "builtins.float" in names:
            return "float"
        if "builtins.int" in names:
            return "int"
    return None


class _HostReadPlan:
    """The reads XLA313 and XLA314 move, decided once for the module (see above)."""

    def __init__(self, model: StepModel) -> None:
        self.model = model
        self.ctx = model.ctx
        self.sums: list[DeviceSum] = []
        self.returns: list[DeviceReturn] = []
        self.finite_checks: list[FiniteCheck] = []
        self.moved: set[cst.CSTNode] = set()
        # (loop, name) -> the callers' names bound to a per-step helper's tensor (device values).
        self.device_values: set[tuple[Loop, str]] = set()
        self.device_logging: set[cst.Expr] = set()
        self.device_mentions: set[cst.Name] = set()
        if self.ctx.runs("XLA313"):
            self._plan_returns()
            self._plan_sums()
        if self.ctx.runs("XLA314"):
            self._plan_finite_checks()

    # Running sums ---------------------------------------------------------------------------------------------
    def _plan_sums(self) -> None:
        by_accumulator: dict[tuple[Loop, str], list[DeviceSum | None]] = {}
        for node, (function, loop) in self.model._c.where.items():  # noqa: SLF001
            if not isinstance(node, cst.AugAssign) or loop is None:
                continue
            if not isinstance(node.operator, cst.AddAssign) or not isinstance(node.target, cst.Name):
                continue
            step = self.model.loops.get(loop)
            if step is None:
                continue
            key = (loop, node.target.value)
            by_accumulator.setdefault(key, []).append(self._sum(node, step))
        for (loop, name), found in by_accumulator.items():
            if any(s is None for s in found) or not self._kept_in_loop(loop, name, found):  # type: ignore[arg-type]
                continue
            for device_sum in found:
                assert device_sum is not None
                self.sums.append(device_sum)
                self.moved.update(device_sum.reads)

    def _sum(self, node: cst.AugAssign, step: StepLoop) -> DeviceSum | None:
        ctx = self.ctx
        device_names = {n for (loop, n) in self.device_values if loop is step.loop}
        found = reads(ctx, node.value, device_names | self.model.base_tensor_names(Region(step)))
        if not found:
            return None
        kinds: set[str] = set()
        read_calls: list[cst.Call] = []
        for read in found:
            if isinstance(read, (cst.Name, cst.Attribute)):
                if patterns.dotted_name(read) not in device_names:
                    return None  # a tensor summed as it is: already on the device
                kinds.add("item")
            else:
                kind = _read_kind(ctx, read)
                if kind is None:
                    return None
                kinds.add(kind)
                read_calls.append(read)  # type: ignore[arg-type]
            if not self._arithmetic_up_to(read, node.value):
                return None
        parent = ctx.parent(step.loop)
        if not isinstance(parent, (cst.IndentedBlock, cst.Module)):
            return None
        read_back = kinds.pop() if len(kinds) == 1 else "item"
        return DeviceSum(node, node.target.value, tuple(read_calls), step.loop, read_back)  # type: ignore[union-attr]

    def _arithmetic_up_to(self, node: cst.CSTNode, root: cst.CSTNode) -> bool:
        current = node
        while current is not root:
            current = self.ctx.parent(current)  # type: ignore[assignment]
            if current is None:
                return False
            if current is not root and not isinstance(current, _ARITHMETIC):
                return False
        return True

    def _kept_in_loop(self, loop: Loop, name: str, sums: list[DeviceSum]) -> bool:
        """Inside the loop the accumulator is only summed into (never read or rebound there), and it is
        bound before the loop in the same function."""
        scope = self.ctx.scopes.get(sums[0].statement.target)
        if scope is None:
            return False
        statements = {s.statement for s in sums}
        bound_before = False
        for assignment in scope.assignments[name]:
            node = getattr(assignment, "node", None)
            if not isinstance(node, cst.CSTNode):
                return False
            holder = self._statement_of(node)
            if holder in statements:
                continue
            if self._inside(node, loop):
                return False
            bound_before = bound_before or self.ctx.position(node) < self.ctx.position(loop)
        return bound_before and not any(self._inside(a.node, loop) for a in scope.accesses[name])

    def _statement_of(self, node: cst.CSTNode) -> cst.CSTNode | None:
        current: cst.CSTNode | None = node
        while current is not None and not isinstance(current, (cst.BaseSmallStatement, cst.BaseCompoundStatement)):
            current = self.ctx.parent(current)
        return current

    def _inside(self, node: cst.CSTNode, container: cst.CSTNode) -> bool:
        current: cst.CSTNode | None = node
        while current is not None:
            if current is container:
                return True
            current = self.ctx.parent(current)
        return False

    # Per-step helpers that return .item() ------------------------------------------------------------------------
    def _plan_returns(self) -> None:
        model, ctx = self.model, self.ctx
        returns: dict[cst.FunctionDef, list[cst.Return]] = {}
        for node, (function, _) in model._c.where.items():  # noqa: SLF001
            if isinstance(node, cst.Return) and function in model.step_functions:
                returns.setdefault(function, []).append(node)  # type: ignore[arg-type]
        if not returns:
            return
        callers: dict[cst.FunctionDef, list[cst.Call]] = {}
        for function, raws in model._c.raw.items():  # noqa: SLF001
            for raw in raws:
                if raw.kind == CALL:
                    target = model.callee(raw.node)  # type: ignore[arg-type]
                    if target in returns:
                        callers.setdefault(target, []).append(raw.node)  # type: ignore[arg-type]
        for function, found in returns.items():
            read_calls = []
            for node in found:
                value = node.value
                read = next(iter(reads(ctx, value, set())), None) if value is not None else None
                if read is None or _read_kind(ctx, read) != "item" or not self._arithmetic_up_to(read, value):
                    break
                read_calls.append(read)
            else:
                plan = self._callers_keep_it(function, callers.get(function, []))
                if plan is not None:
                    names, logging, mentions = plan
                    self.returns.append(DeviceReturn(function, tuple(read_calls), names, logging, mentions))  # type: ignore[arg-type]
                    self.moved.update(read_calls)
                    self.device_values.update(names)
                    self.device_logging.update(logging)
                    self.device_mentions.update(mentions)

    def _callers_keep_it(self, function: cst.FunctionDef, calls: list[cst.Call]):
        """Every call of the helper is in a step loop's own body, as a statement of its own, ``name =
        helper(...)`` with ``name`` only summed (``total += name``) or logged in that loop, or ``total +=
        helper(...)``."""
        model, ctx = self.model, self.ctx
        if not calls:
            return None
        names: list[tuple[Loop, str]] = []
        logging: list[cst.Expr] = []
        mentions: list[cst.Name] = []
        for call in calls:
            where = model._c.where.get(call)  # noqa: SLF001
            step = model.loops.get(where[1]) if where and where[1] is not None else None  # type: ignore[arg-type]
            if step is None or step.kind != "train":
                return None
            parent = ctx.parent(call)
            if isinstance(parent, cst.Expr):
                continue
            if isinstance(parent, cst.AugAssign) and parent.value is call:
                continue  # a running sum: DeviceSum reads it back
            if not (isinstance(parent, cst.Assign) and parent.value is call and len(parent.targets) == 1
                    and isinstance(parent.targets[0].target, cst.Name)):
                return None
            name = parent.targets[0].target.value
            scope = ctx.scopes.get(parent.targets[0].target)
            if scope is None or len(scope.assignments[name]) != 1:
                return None
            for access in scope.accesses[name]:
                node = access.node
                if not isinstance(node, cst.Name) or not self._inside(node, step.loop):
                    return None
                statement = self._statement_of(node)
                if isinstance(statement, cst.Expr) and isinstance(statement.value, cst.Call) and \
                        is_logging_call(ctx, statement.value):
                    # Mid-step, XLA310 moves it into a step closure; after the barrier it reads the value
                    # the step's graph already computed.
                    if not ctx.runs("XLA310") and not model.after_step_end(statement, Region(step)):
                        return None
                    logging.append(statement)
                    mentions.append(node)
                elif isinstance(statement, cst.AugAssign) and self._arithmetic_up_to(node, statement.value):
                    pass  # summed: the running sum decides (and must keep it on the device)
                else:
                    return None
            names.append((step.loop, name))
        return tuple(names), tuple(logging), tuple(mentions)

    # Finite checks ----------------------------------------------------------------------------------------------
    def _plan_finite_checks(self) -> None:
        ctx, model = self.ctx, self.model
        for node in model._c.where:  # noqa: SLF001
            if not isinstance(node, cst.Assign) or len(node.targets) != 1 or not isinstance(node.targets[0].target,
                                                                                           cst.Name):
                continue
            kind = _read_kind(ctx, node.value)
            if kind is None:
                continue
            region = model.training_region(node)
            if region is None or model.after_step_end(node, region):
                continue
            line = ctx.parent(node)
            block = ctx.parent(line) if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 else None
            if not isinstance(block, cst.IndentedBlock):
                continue
            body = list(block.body)
            index = body.index(line)  # type: ignore[arg-type]
            check = body[index + 1] if index + 1 < len(body) else None
            name = node.targets[0].target.value
            if isinstance(check, cst.If) and self._stops_unless_finite(check, name) and \
                    self._only_used_by(node.targets[0].target, name, check):
                self.finite_checks.append(FiniteCheck(line, check, node.value, region))  # type: ignore[arg-type]
                self.moved.add(node.value)

    def _stops_unless_finite(self, check: cst.If, name: str) -> bool:
        ctx = self.ctx
        if check.orelse is not None:
            return False
        tests = patterns.find_all(check.test, lambda n: isinstance(n, cst.Call) and bool(
            ctx.qualnames(n.func) & set(FINITE_CHECKS)) and bool(mentions(n, {name})))
        if not tests:
            return False
        body = patterns.find_all(check.body, lambda n: isinstance(n, (cst.Break, cst.Continue, cst.Return, cst.Yield,
                                                                      cst.Await, cst.Nonlocal, cst.Global)))
        stops = patterns.find_all(check.body, lambda n: isinstance(n, cst.Raise) or (
            isinstance(n, cst.Call) and bool(ctx.qualnames(n.func) & set(STOPS))))
        return not body and bool(stops)

    def _only_used_by(self, target: cst.Name, name: str, check: cst.If) -> bool:
        scope = self.ctx.scopes.get(target)
        if scope is None or len(scope.assignments[name]) != 1:
            return False
        return all(self._inside(a.node, check) for a in scope.accesses[name])


# What a step closure takes --------------------------------------------------------------------------------------


def captured_names(ctx: MigrationContext, nodes: list[cst.CSTNode], region: Region,
                   exclude: frozenset[str] = frozenset()) -> list[str]:
    """Names a step closure over ``nodes`` takes as arguments, in order of use: the step's tensors and every
    name the enclosing loops assign (in a function the step calls: every name of that function), since
    their values may change before the closure runs."""
    tensors = {name.split(".")[0] for name in ctx.steps.tensor_names(region) if "." not in name}
    within = region.function if region.in_callee else _outermost_loop(ctx, region.step.loop)
    names: list[str] = []
    for node in nodes:
        for name in _loaded_names(node):
            if name.value in names or name.value in exclude:
                continue
            if name.value in tensors or _assigned_in(ctx, name, within):
                names.append(name.value)
    return names


def _outermost_loop(ctx: MigrationContext, loop: cst.CSTNode) -> cst.CSTNode:
    outermost, current = loop, ctx.parent(loop)
    while current is not None and not isinstance(current, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
        if isinstance(current, (cst.For, cst.While)):
            outermost = current
        current = ctx.parent(current)
    return outermost


def _assigned_in(ctx: MigrationContext, name: cst.Name, region: cst.CSTNode | None) -> bool:
    scope = ctx.scopes.get(name)
    if scope is None or region is None:
        return False
    for assignment in scope[name.value]:
        current = getattr(assignment, "node", None)
        while current is not None:
            if current is region:
                return True
            current = ctx.parent(current)
    return False


def _loaded_names(node: cst.CSTNode) -> list[cst.Name]:
    """Names the expression reads (not attribute names, keywords, or a nested lambda's own parameters)."""
    finder = _LoadedNames()
    node.visit(finder)
    return finder.found


class _LoadedNames(cst.CSTVisitor):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[cst.Name] = []

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        node.value.visit(self)
        return False

    def visit_Arg(self, node: cst.Arg) -> bool:
        node.value.visit(self)
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False

    def visit_Name(self, node: cst.Name) -> None:
        self.found.append(node)
