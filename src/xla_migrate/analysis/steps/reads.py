"""Reads of tensor values at the expression level (the rules look at one statement): which uses of a
step's tensors copy them to the host, which statements only log, where a step closure may take them; and
the names a step closure over some nodes takes as arguments."""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from ...syntax import patterns
from . import closure_safety
from .kinds import CONVERSIONS, LOG_METHODS, READ_METHODS, STATIC_ATTRIBUTES, STEP_CLOSURES, Region

if TYPE_CHECKING:
    from ...engine.context import MigrationContext

APPENDS = ("append", "extend")


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


def plain_read(read: cst.CSTNode) -> bool:
    """``loss.item()``, ``float(out.loss)``, ``losses[k].item()``: a read of a value, not of a computation (after
    the step's barrier it copies a result, where ``x.mean().item()`` runs one more graph)."""
    if isinstance(read, cst.Call):
        if isinstance(read.func, cst.Attribute) and read.func.attr.value in READ_METHODS:
            value = read.func.value
        elif len(read.args) == 1:
            value = read.args[0].value
        else:
            return False
    else:
        value = read
    while isinstance(value, (cst.Attribute, cst.Subscript)):
        value = value.value
    return isinstance(value, cst.Name)


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
    if not isinstance(call, cst.Call) or not (is_logging_call(ctx, call) or appends_to_log(ctx, call)):
        return None
    region = ctx.steps.training_region(node)
    if region is None or in_step_closure(ctx, node) or ctx.steps.after_step_end(node, region):
        return None
    if closure_safety.guard(ctx, node, region) is not None or closure_safety.leaves_after(ctx, node, region):
        return None  # under a try/with of the step, or right before leaving the loop: see closure_safety.py
    if is_logging_call(ctx, call):
        found = reads(ctx, call, ctx.steps.tensor_names(region))
    else:  # ``losses.append(loss)`` keeps a tensor; ``losses.append(loss.item())`` reads one
        kept = {n for (loop, n) in ctx.steps.host_reads.device_values if loop is region.step.loop}
        found = reads(ctx, call, kept) if kept else reads(ctx, call, set())
    return (call, found, region) if found else None


def appends_to_log(ctx: MigrationContext, call: cst.Call) -> bool:
    """``losses.append(...)`` on a list that the step loop holding the call only appends to (a list bound to a
    plain name, never read, rebound or passed on inside that loop; the script reads it after the loop): logging,
    moved like a print. The closures run at the step barrier, the last one at the loop's last barrier (a
    device loader marks the step once more when it ends), so the list is complete after the loop."""
    method = patterns.method_call(call, *APPENDS)
    if method is None or not isinstance(method.value, cst.Name):
        return False
    name = method.value
    region = ctx.steps.training_region(call)
    if region is None or region.in_callee:
        return False
    loop = region.step.loop
    scope = ctx.scopes.get(name)
    if scope is None or name.value not in scope:
        return False
    for assignment in scope.assignments[name.value]:
        node = getattr(assignment, "node", None)
        if not isinstance(node, cst.CSTNode) or inside(ctx, node, loop):
            return False
    for access in scope.accesses[name.value]:
        node = access.node
        if not inside(ctx, node, loop):
            continue
        parent = ctx.parent(node)
        if not (isinstance(parent, cst.Attribute) and parent.value is node and parent.attr.value in APPENDS):
            return False
        owner = ctx.parent(parent)
        if not (isinstance(owner, cst.Call) and owner.func is parent and isinstance(ctx.parent(owner), cst.Expr)):
            return False
    return True


def inside(ctx: MigrationContext, node: cst.CSTNode, container: cst.CSTNode) -> bool:
    current: cst.CSTNode | None = node
    while current is not None:
        if current is container:
            return True
        current = ctx.parent(current)
    return False


def logging_compound(ctx: MigrationContext, node: cst.With | cst.Try) -> Region | None:
    """A ``with`` or ``try`` of a training step, mid-step, whose body only logs and reads tensors: it moves
    whole into a step closure (closure_safety.py). Where it runs, else None."""
    body = node.body
    if not isinstance(body, cst.IndentedBlock) or not body.body:
        return None
    first = body.body[0]
    if not isinstance(first, cst.SimpleStatementLine) or not isinstance(first.body[0], cst.Expr):
        return None
    region = ctx.steps.training_region(first.body[0])
    if region is None or in_step_closure(ctx, node) or ctx.steps.after_step_end(first.body[0], region):
        return None
    if closure_safety.guard(ctx, first.body[0], region) is not node or closure_safety.guard(ctx, node, region):
        return None
    if not only_logs(ctx, node) or closure_safety.leaves_after(ctx, node, region):
        return None
    return region if reads(ctx, body, ctx.steps.tensor_names(region)) else None


def in_logging_compound(ctx: MigrationContext, node: cst.CSTNode) -> bool:
    current = ctx.parent(node)
    while current is not None and not isinstance(current, (cst.FunctionDef, cst.For, cst.While)):
        if isinstance(current, (cst.With, cst.Try)):
            return logging_compound(ctx, current) is not None
        current = ctx.parent(current)
    return False




def only_logs(ctx: MigrationContext, compound: cst.With | cst.Try) -> bool:
    """Every statement of the compound's body is a logging call (``f.write(...)``, ``tracker.log(...)``,
    ``print(...)``) and the ``try`` has no ``else``/``finally`` that the step needs in place."""
    if isinstance(compound, cst.Try) and (compound.orelse is not None or compound.finalbody is not None):
        return False
    body = compound.body
    if not isinstance(body, cst.IndentedBlock):
        return False
    for line in body.body:
        if not isinstance(line, cst.SimpleStatementLine):
            return False
        for small in line.body:
            if not (isinstance(small, cst.Expr) and isinstance(small.value, cst.Call)):
                return False
            call = small.value
            if not (is_logging_call(ctx, call) or _logger_method(call)):
                return False
    return True


def _logger_method(call: cst.Call) -> bool:
    """``tracker.log(...)``, ``wandb.log(...)``, ``experiment.log(...)``, ``run.log(...)``."""
    return patterns.method_call(call, "log", "write", "flush", "add_scalar", "add_scalars", "log_metrics") is not None


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
        for name in loaded_names(node):
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


def loaded_names(node: cst.CSTNode) -> list[cst.Name]:
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
