"""The step model's one read-only walk (``_Collector``): per function, its events in order with their
innermost loop; the module's functions, classes, methods and objects; and the call classifiers the rules
share (``is_optimizer_step``, ``is_model_call``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from ...syntax import patterns
from .. import update_sites
from .kinds import (_MODEL_NAME, _NOT_A_MODEL_NAME, _OPTIMIZER_NAME, _SCHEDULER_NAME, BACKWARD, BARRIER, CALL, CLIP, CLIP_GRADS, CLOSURE,
                    CONVERSIONS, FETCH, FETCH_GRADIENTS, FORWARD, GRAD, OPTIMIZER_STEP, READ, SCALER_UPDATE, SCHEDULE,
                    STEP, STEP_BARRIERS, STEP_CLOSURES, UNSCALE, ZERO_GRAD, Function, Loop)

if TYPE_CHECKING:
    from ...engine.context import MigrationContext


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
        # ``for optimizer in optimizers:`` loops: each optimizer is stepped once per step (issue 30).
        self.optimizer_loops: set[Loop] = set()
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
        if _over_optimizers(node):
            self.optimizer_loops.add(node)
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
        # ``Net().to(device)``, ``Net(cfg).cuda().train()``: the object is the innermost call's.
        while isinstance(value.func, cst.Attribute) and value.func.attr.value in _MOVES and isinstance(
                value.func.value, cst.Call):
            value = value.func.value
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
        parent = self.ctx.parent(node)
        # ``p.grad``, not a function named grad (``torch.autograd.grad(...)``).
        if node.attr.value == "grad" and not (isinstance(parent, cst.Call) and parent.func is node):
            self._record(GRAD, node)

    def visit_Call(self, node: cst.Call) -> None:
        self._mark(node)
        kind = _call_kind(self.ctx, node)
        if kind is not None:
            self._record(kind, node)
            # An idist.auto_optim optimizer's step marks the step only on ignite's xla-tpu backend; elsewhere
            # (backend None: ignite's examples' default) auto_optim returns the optimizer as it is, and without
            # a barrier the graph grows (measured, 2.9: one compile per step). After its barrier=True the step's
            # barrier finds nothing pending: 0 extra executions. So the barrier stays.
            if kind == STEP and _barrier_keyword(node):
                self._record(BARRIER, node)


_MOVES = ("to", "cuda", "cpu", "train", "eval", "float", "half", "bfloat16", "double", "requires_grad_")


def _target_names(target: cst.BaseExpression) -> list[str]:
    if isinstance(target, (cst.Tuple, cst.List)):
        return [n for e in target.elements for n in _target_names(e.value)]
    if isinstance(target, cst.StarredElement):
        return _target_names(target.value)
    name = patterns.dotted_name(target)
    return [name] if name is not None else []


def _over_optimizers(node: cst.For) -> bool:
    """``for optimizer in optimizers:``, ``for opt in (opt_g, opt_d):``, ``for name, opt in optims.items():``:
    a loop whose variable names an optimizer runs each optimizer's update once, so what it holds runs once
    per step (the step of semantic-segmentation-pytorch's encoder and decoder)."""
    if isinstance(node.iter, cst.Call) and patterns.dotted_name(node.iter.func) in ("range", "enumerate"):
        return False
    names = _target_names(node.target)
    if not names or not is_optimizer_name(names[-1]) or "." in names[-1]:
        return False
    # The variable is stepped or zeroed in the loop (not ``for option in options:``, a name that only looks so).
    return bool(patterns.find_all(node.body, lambda n: patterns.method_call(n, "step", "zero_grad") is not None
                                  and patterns.dotted_name(n.func.value) == names[-1]))  # type: ignore[attr-defined]


def _barrier_keyword(node: cst.Call) -> bool:
    barrier = patterns.keyword(node, "barrier")
    return barrier is not None and patterns.dotted_name(barrier.value) == "True"


def steps_itself(ctx: MigrationContext, node: cst.Call) -> bool:
    """``opt.step()`` or ``scaler.step(opt)`` of an optimizer ignite's ``idist.auto_optim`` returned: on XLA (its
    ``xla-tpu`` backend) that optimizer's ``step()`` is ``xm.optimizer_step(opt, barrier=True)``, so it reduces
    the gradients and marks the step itself; wrapping it again would reduce twice. (The loop's own barrier
    stays: see ``visit_Call``.)"""
    method = patterns.method_call(node, "step")
    if method is None:
        return False
    stepped = patterns.dotted_name(method.value)
    if _is_scaler(ctx, stepped):
        args = patterns.positional(node)
        stepped = patterns.dotted_name(args[0].value) if len(args) == 1 else None
    return stepped is not None and stepped.rsplit(".", 1)[-1] in auto_optimized(ctx)


def auto_optimized(ctx: MigrationContext) -> frozenset[str]:
    """The names the program (this file, or the project modules connected to it) binds to
    ``idist.auto_optim(...)``: the optimizer often travels through a helper's return (ignite's
    ``initialize(config)`` in utils.py), so the name, not the scope, decides."""
    def compute() -> frozenset[str]:
        project = ctx.project
        if project is None:
            if "auto_optim" not in ctx.input_code:
                return frozenset()
            program = update_sites.Program({"": update_sites.summarize(ctx.input_code)})
        else:
            program = update_sites.program_of(project.index, project.rel)
        return frozenset(site.what for _, site in program.sites("auto_optimized"))
    return ctx.once("auto_optimized", compute)  # type: ignore[return-value]


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
    return name in ctx.facts.ddp_models or is_model_name(name)


def runs_a_submodule(node: cst.Call, ctx: MigrationContext, submodules: set[str]) -> bool:
    """``decoder.cell(h)``, ``decoder.out(h)``: a submodule of a model called on its own, as a decode loop does
    (the model's ``forward`` never runs); ``submodules`` are the attributes the module's torch module classes
    set to objects (``self.cell = nn.GRUCell(...)``)."""
    func = node.func
    if not isinstance(func, cst.Attribute) or func.attr.value not in submodules:
        return False
    owner = patterns.dotted_name(func.value)
    return owner is not None and (owner in ctx.facts.ddp_models or is_model_name(owner))


def is_optimizer_name(name: str) -> bool:
    """A name that says it holds an optimizer (``optimizer``, ``optim_g``, ``opt``)."""
    return bool(_OPTIMIZER_NAME.search(name.rsplit(".", 1)[-1]))


def is_model_name(name: str) -> bool:
    """A dotted name whose last part says it holds a model (``model``, ``self.net``, ``g_ema``'s generator)."""
    last = name.rsplit(".", 1)[-1]
    return bool(_MODEL_NAME.search(last)) and not _NOT_A_MODEL_NAME.search(last)


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
