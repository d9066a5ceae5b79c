"""What the lazy-tensor rules (XLA310 step closures, XLA311 host reads) share: which names hold tensors in a
training loop, which expressions read a tensor's value to the host, and which statements are pure logging.

Deciding here keeps the two rules from disagreeing: XLA310 moves a pure logging statement that reads a tensor
into ``xm.add_step_closure``; XLA311 reports every other read in a training loop, and never one inside a step
closure or a statement XLA310 moves.
"""

from __future__ import annotations

import weakref

import libcst as cst

from xla_migrate import loops, patterns
from xla_migrate.context import MigrationContext

STEP_CLOSURES = ("torch_xla.core.xla_model.add_step_closure",)
# Methods that copy a tensor's value to the host.
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

_STOP = (cst.FunctionDef, cst.Lambda, cst.ClassDef)
_tensor_names: weakref.WeakKeyDictionary[MigrationContext, dict[cst.CSTNode, set[str]]] = weakref.WeakKeyDictionary()


def training_loop_of(ctx: MigrationContext, node: cst.CSTNode) -> cst.For | cst.While | None:
    """The training loop whose step runs ``node``: the nearest enclosing loop, when it is a training loop
    (nested functions and lambdas run elsewhere; an epoch loop's code runs once per epoch, not per step)."""
    child, current = node, ctx.parent(node)
    while current is not None:
        if isinstance(current, _STOP):
            return None
        if isinstance(current, (cst.For, cst.While)):
            if child is not current.body:  # the loop's iterable, target, test or else: not the step
                return None
            return current if current in ctx.facts.training_loops else None
        child, current = current, ctx.parent(current)
    return None


def after_step_end(ctx: MigrationContext, node: cst.CSTNode, loop: cst.For | cst.While) -> bool:
    """``node`` runs after the step's graph ran: after a step barrier in the loop body, or, in a loop that
    iterates no device loader, after the optimizer step (where XLA302 puts the barrier). Its reads cost no
    extra graph execution. In a device-loader loop the step ends at the next batch: nothing is after it."""
    if not isinstance(loop.body, cst.IndentedBlock):
        return False
    body = list(loop.body.body)
    current: cst.CSTNode | None = node
    while current is not None and current not in body:
        current = ctx.parent(current)
    if current is None:
        return False
    earlier = body[:body.index(current)]
    if any(_contains(ctx, s, _is_barrier) for s in earlier):
        return True
    if loops.iterates_device_loader(ctx, loop) or loops.has_step_barrier(ctx, loop) or ctx.facts.uses_accelerate:
        # Accelerate's prepared loader marks the step at the next batch, like a device loader.
        return False
    return any(_contains(ctx, s, loops.is_optimizer_step) for s in earlier)


def _is_barrier(ctx: MigrationContext, node: cst.CSTNode) -> bool:
    if not isinstance(node, cst.Call):
        return False
    names = ctx.qualnames(node.func)
    barrier = patterns.keyword(node, "barrier")
    return bool(names & set(loops.STEP_BARRIERS)) or (
        loops.OPTIMIZER_STEP in names and barrier is not None and patterns.dotted_name(barrier.value) == "True")


def _contains(ctx: MigrationContext, statement: cst.CSTNode, predicate) -> bool:
    found = False

    class Finder(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            nonlocal found
            found = found or predicate(ctx, node)

        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return False

    statement.visit(Finder())
    return found


def in_step_closure(ctx: MigrationContext, node: cst.CSTNode) -> bool:
    current = ctx.parent(node)
    while current is not None:
        if isinstance(current, cst.Call) and ctx.qualnames(current.func) & set(STEP_CLOSURES):
            return True
        current = ctx.parent(current)
    return False


def tensor_names(ctx: MigrationContext, loop: cst.For | cst.While) -> set[str]:
    """Names that hold tensors in the loop: what ``backward()`` is called on, what a model, criterion or loss
    call returns, and what is computed from those (to a fixed point). Values read with ``.item()`` are not."""
    cache = _tensor_names.setdefault(ctx, {})
    if loop in cache:
        return cache[loop]
    names: set[str] = set()
    assignments: list[tuple[str, cst.BaseExpression]] = []

    class Collector(cst.CSTVisitor):
        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return False

        def visit_Call(self, node: cst.Call) -> None:
            attribute = patterns.method_call(node, "backward")
            if attribute is None:
                return
            receiver = patterns.dotted_name(attribute.value)
            if receiver is not None and receiver.rsplit(".", 1)[-1].endswith("accelerator"):
                # accelerator.backward(loss): the tensor is the argument
                receiver = patterns.dotted_name(node.args[0].value) if node.args else None
            if receiver is not None:
                names.add(receiver)

        def visit_Assign(self, node: cst.Assign) -> None:
            for target in node.targets:
                for element in _target_names(target.target):
                    assignments.append((element, node.value))

        def visit_AugAssign(self, node: cst.AugAssign) -> None:
            for element in _target_names(node.target):
                assignments.append((element, node.value))

    loop.body.visit(Collector())
    changed = True
    while changed:
        changed = False
        for name, value in assignments:
            if name not in names and _produces_tensor(ctx, value, names):
                names.add(name)
                changed = True
    cache[loop] = names
    return names


def _target_names(target: cst.BaseExpression) -> list[str]:
    if isinstance(target, (cst.Tuple, cst.List)):
        return [n for e in target.elements for n in _target_names(e.value)]
    name = patterns.dotted_name(target)
    return [name] if name is not None else []


def _produces_tensor(ctx: MigrationContext, value: cst.BaseExpression, names: set[str]) -> bool:
    if reads(ctx, value, set()) or _is_read_call(ctx, value, names):
        return False  # `loss_value = loss.item()` holds a float
    if isinstance(value, cst.Call):
        callee = (patterns.dotted_name(value.func) or "").rsplit(".", 1)[-1].lower()
        if any(word in callee for word in _TENSOR_CALLEES):
            return True
    return bool(_mentions(value, names))


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


def _mentions(node: cst.CSTNode, names: set[str]) -> list[cst.CSTNode]:
    finder = _Mentions(names)
    node.visit(finder)
    return finder.found


def _is_read_call(ctx: MigrationContext, node: cst.CSTNode, names: set[str]) -> bool:
    if not isinstance(node, cst.Call):
        return False
    if patterns.method_call(node, *READ_METHODS):
        return True
    return bool(ctx.qualnames(node.func) & set(CONVERSIONS)) and bool(node.args) and bool(
        _mentions(node.args[0].value, names))


def reads(ctx: MigrationContext, node: cst.CSTNode, names: set[str]) -> list[cst.CSTNode]:
    """The outermost expressions in ``node`` that read a tensor's value to the host: ``x.item()``,
    ``x.tolist()``, ``x.cpu()``, ``x.numpy()``, ``float(loss)``; with ``names``, also a tensor used as a
    value (printed, formatted, compared)."""

    class Finder(_Mentions):
        def visit_Call(self, node: cst.Call) -> bool:
            if ctx.qualnames(node.func) & set(STEP_CLOSURES):
                return False
            if _is_read_call(ctx, node, names):
                self.found.append(node)
                return False
            return True

    finder = Finder(names)
    node.visit(finder)
    return finder.found


def is_logging_call(ctx: MigrationContext, call: cst.Call) -> bool:
    if "builtins.print" in ctx.qualnames(call.func) or patterns.dotted_name(call.func) == "accelerator.print":
        return True
    return patterns.method_call(call, *LOG_METHODS) is not None


def logging_statement(ctx: MigrationContext, node: cst.Expr) -> tuple[cst.Call, list[cst.CSTNode]] | None:
    """For a statement that only logs (``print(...)``, ``logger.info(...)``, ``writer.add_scalar(...)``) in a
    training loop and reads tensors: the call and its reads. The tensors it reads are named in the loop."""
    call = node.value
    if not isinstance(call, cst.Call) or not is_logging_call(ctx, call):
        return None
    loop = training_loop_of(ctx, node)
    if loop is None or in_step_closure(ctx, node) or after_step_end(ctx, node, loop):
        return None
    found = reads(ctx, call, tensor_names(ctx, loop))
    return (call, found) if found else None


def is_logging_read(ctx: MigrationContext, node: cst.CSTNode) -> bool:
    """``node`` lies in a pure logging statement that XLA310 moves into a step closure."""
    current = ctx.parent(node)
    while current is not None and not isinstance(current, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
        if isinstance(current, cst.Expr):
            return logging_statement(ctx, current) is not None
        current = ctx.parent(current)
    return False
